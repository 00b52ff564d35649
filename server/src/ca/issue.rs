//! Issuing one X509-SVID: the one-way pipeline template -> sign -> validate.
//!
//! 1. [`super::template::leaf`] builds the leaf from the grant (names), the CSR (public key
//!    only), `now` and the CA's validity window, or refuses.
//! 2. The [`Authority`]'s key signs it.
//! 3. [`self_check`] re-validates what was signed ([`super::validate::check_leaf`]'s checks: the
//!    X509-SVID profile and the signature under the CA, parsing the leaf once) and that it certifies exactly the CSR's
//!    key, the granted names and the validity the template chose. A certificate failing it never
//!    leaves ([`IssueError::SelfCheck`]).
//!
//! Lower modules never call back up here: templates and validation know nothing of signing,
//! and [`Authority`] only holds the key.

use std::time::SystemTime;

use super::authority::Authority;
use super::csr::VerifiedCsr;
use super::serial::SerialSource;
use super::template::{self, CaWindow, LeafTemplate};
use super::validate::{CertError, IssuerFacts, LeafInfo, check_parsed_leaf, parse_cert};
use super::{Grant, IssueError, IssuedCert};

impl Authority {
    /// Signs an X509-SVID leaf for `grant` with `csr`'s public key, then re-validates it.
    pub fn issue(
        &self,
        csr: &VerifiedCsr,
        grant: &Grant,
        now: SystemTime,
        serials: &dyn SerialSource,
    ) -> Result<IssuedCert, IssueError> {
        let window = CaWindow {
            key_id: self.key_id(),
            not_before: self.not_before(),
            not_after: self.not_after(),
        };
        let leaf = template::leaf(window, csr, grant, now, serials)?;
        let der = self.sign(&leaf, csr)?;
        let info = self_check(&der, self.issuer_facts(), csr, grant, &leaf, now)?;

        let mut chain = Vec::with_capacity(1 + self.chain().len());
        chain.push(der.clone());
        chain.extend(self.chain());
        Ok(IssuedCert {
            sha256: signet_types::ledger::sha256(&der),
            der,
            chain,
            serial: info.serial,
            spiffe_id: info.spiffe_id,
            dns_names: info.dns_names,
            ip_addresses: info.ip_addresses,
            not_before: leaf.not_before,
            not_after: leaf.not_after,
            ca_key_id: self.key_id().to_owned(),
        })
    }

    /// Signs the template for the CSR's public key; DER.
    fn sign(&self, leaf: &LeafTemplate, csr: &VerifiedCsr) -> Result<Vec<u8>, IssueError> {
        let cert = leaf
            .params
            .signed_by(csr.rcgen_public_key(), self.issuer())
            .map_err(|e| IssueError::Signing(e.to_string()))?;
        Ok(cert.der().to_vec())
    }
}

/// Re-validates a freshly signed leaf: the profile and signature under `ca_der`, the CSR's key,
/// and exactly the granted names and the template's validity.
fn self_check(
    der: &[u8],
    issuer: &IssuerFacts,
    csr: &VerifiedCsr,
    grant: &Grant,
    leaf: &LeafTemplate,
    now: SystemTime,
) -> Result<LeafInfo, IssueError> {
    // One parse of the leaf serves every check; the issuer's side was taken from our own
    // certificate when the authority was built. The checks are `check_leaf`'s, signature
    // verification under the CA's public key included.
    let parsed = parse_cert(der).map_err(|e| IssueError::SelfCheck(e.of("leaf")))?;
    let info = check_parsed_leaf(&parsed, issuer, now).map_err(IssueError::SelfCheck)?;
    if parsed.public_key().raw != csr.public_key_der() {
        return Err(IssueError::SelfCheck(CertError::Profile(
            "the certified public key differs from the CSR's",
        )));
    }
    if info.spiffe_id != *grant.spiffe_id()
        || info.dns_names != grant.dns_names()
        || info.ip_addresses != grant.ip_addresses()
        || info.not_before != leaf.not_before
        || info.not_after != leaf.not_after
    {
        return Err(IssueError::SelfCheck(CertError::Profile(
            "the certificate's names or validity differ from what was granted",
        )));
    }
    Ok(info)
}

#[cfg(test)]
mod tests;
