//! Taints and CRLs from the server's bundle, as the bridge acts on them.
//!
//! The bundle's `tainted_key_ids` name CA keys (lowercase hex subject key identifiers) whose
//! certificates are replaced now; its `crls` are each issuing CA key's DER CRL. The bridge
//! receives them over its authenticated connection to the server (the server's SPIFFE ID is
//! verified), takes the set the server publishes as current, and parses each CRL: one that does
//! not parse is logged and skipped. The parsed CRLs are written, as PEM, into the
//! `istio-ca-root-cert` ConfigMaps (`ca-crl.pem`); a Citadel Secret whose certificate was issued
//! under a tainted key or whose serial is listed is re-issued ([`crate::citadel::plan::decide`]).
//! Unlike the agent, the bridge does not verify CRL signatures itself: it holds only the roots,
//! not the intermediates that sign most CRLs, and its consumers (Istio) verify them.

use std::collections::{BTreeMap, BTreeSet};

use signet_pki::cert::{hex, serial_bytes};
use signet_pki::{ParsedCert, ParsedCrl};

/// Most tainted keys and CRLs taken from one bundle.
pub const MAX_ITEMS: usize = 256;

/// The taints and CRLs in force, from the server's current bundle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revocations {
    tainted: BTreeSet<String>,
    /// Per issuing key ID: the CRL number and the revoked serials.
    revoked: BTreeMap<String, (u64, BTreeSet<Vec<u8>>)>,
    /// Every CRL that parsed, as PEM `X509 CRL` blocks ordered by key ID (empty: none).
    pub crls_pem: String,
}

impl Revocations {
    /// From a bundle's `tainted_key_ids` and `crls` (key ID, DER).
    pub fn new<'a>(
        tainted: impl IntoIterator<Item = &'a str>,
        crls: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Self {
        let tainted: BTreeSet<String> = tainted
            .into_iter()
            .map(|k| k.trim().to_ascii_lowercase())
            .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_hexdigit()))
            .take(MAX_ITEMS)
            .collect();
        let mut revoked = BTreeMap::new();
        let mut pems = BTreeMap::new();
        for (key_id, der) in crls.into_iter().take(MAX_ITEMS) {
            let crl = match ParsedCrl::from_der(der) {
                Ok(crl) => crl,
                Err(e) => {
                    tracing::warn!(key_id, error = %e, "ignoring a CRL that does not parse");
                    continue;
                }
            };
            // The signed authority key identifier wins over the label beside it.
            let key_id = crl
                .authority_key_id()
                .map(str::to_owned)
                .unwrap_or_else(|| key_id.trim().to_ascii_lowercase());
            let number = crl.number().unwrap_or(0);
            let serials = crl.entries().keys().cloned().collect();
            revoked.insert(key_id.clone(), (number, serials));
            pems.insert(key_id, crl.to_pem());
        }
        Self {
            tainted,
            revoked,
            crls_pem: pems.into_values().collect(),
        }
    }

    /// From the server's bundle (as `signet_client` checked it).
    pub fn of_bundle(b: &signet_client::ca::TrustBundle) -> Self {
        Self::new(
            b.tainted_key_ids.iter().map(String::as_str),
            b.crls.iter().map(|c| (c.key_id.as_str(), c.der.as_slice())),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.tainted.is_empty() && self.revoked.is_empty()
    }

    /// Why the leaf of `chain_pem` must be replaced now, if it must: issued under a tainted
    /// key, or listed in its issuer's CRL. While anything is tainted or revoked, a leaf that
    /// cannot be read (or names no issuing key) must be replaced too: it cannot be shown not to
    /// be listed.
    pub fn check_pem(&self, chain_pem: &[u8]) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        match signet_types::pem::parse_certs(chain_pem) {
            Ok(ders) => match ders.first() {
                Some(leaf) => self.check_der(leaf),
                None => Some("holds no certificate, so its revocation cannot be checked".into()),
            },
            Err(e) => Some(format!(
                "is not a PEM certificate chain ({e}), so its revocation cannot be checked"
            )),
        }
    }

    /// As [`Self::check_pem`], for a DER leaf.
    pub fn check_der(&self, leaf: &[u8]) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        match ParsedCert::from_der(leaf) {
            Ok(cert) if cert.authority_key_id().is_none() => Some(
                "names no issuing CA key (no authority key identifier), so its revocation \
                 cannot be checked"
                    .into(),
            ),
            Ok(cert) => self.check_parts(cert.authority_key_id(), cert.serial()),
            Err(e) => Some(format!(
                "cannot be read ({e}), so its revocation cannot be checked"
            )),
        }
    }

    /// As [`Self::check_der`], for a certificate's issuing key ID (its authority key
    /// identifier) and serial (without leading zero bytes).
    pub fn check_parts(&self, issuer_key_id: Option<&str>, serial: &[u8]) -> Option<String> {
        let aki = issuer_key_id?;
        if self.tainted.contains(aki) {
            return Some(format!("was issued under the tainted CA key {aki}"));
        }
        let (number, serials) = self.revoked.get(aki)?;
        let serial = serial_bytes(serial);
        serials.contains(serial).then(|| {
            format!(
                "is revoked (serial {} in CRL {number} of CA key {aki})",
                hex(serial)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While a key is tainted, a stored leaf the bridge cannot read is replaced rather than
    /// taken as not revoked.
    #[test]
    fn a_leaf_that_cannot_be_read_is_replaced_while_anything_is_revoked() {
        let none = Revocations::new([], []);
        assert_eq!(none.check_pem(b"junk"), None);
        assert_eq!(none.check_der(b"junk"), None);

        let tainted = Revocations::new(["ab01"], []);
        let why = tainted.check_der(b"junk").expect("replaced");
        assert!(why.starts_with("cannot be read ("), "{why}");
        let why = tainted.check_pem(b"junk").expect("replaced");
        assert!(why.contains("revocation cannot be checked"), "{why}");
        assert!(tainted.check_pem(b"").is_some());
    }
}
