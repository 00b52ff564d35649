//! The certificate templates: what Signet puts in the certificates it signs, before signing.
//!
//! - [`leaf`]: the X509-SVID leaf profile. Names come from the [`Grant`] only; the CSR contributes
//!   its public key. A CSR asking for a name outside the grant is refused (Istio's contract),
//!   never silently narrowed. notBefore is backdated by [`BACKDATE`] and notAfter capped, both
//!   within the issuing CA's own validity.
//! - [`ca_params`]: the CA certificates Signet generates (root and intermediate).
//!
//! First step of the pipeline in [`super::issue`] (template -> sign -> validate): this module
//! knows nothing of keys or of the signing CA beyond its [`CaWindow`].

use std::time::SystemTime;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose,
    SanType, SerialNumber,
};
use signet_types::{SpiffeId, TrustDomain};

use super::csr::VerifiedCsr;
use super::serial::SerialSource;
use super::time::{floor_secs, to_offset, unix_text as unix};
use super::{BACKDATE, Grant, IssueError};

/// What a leaf template needs of the CA that will sign it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CaWindow<'a> {
    pub key_id: &'a str,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// A leaf ready to sign, and the validity it must come out with (whole seconds).
pub(crate) struct LeafTemplate {
    pub params: CertificateParams,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// Refuses a CSR that asks for anything the grant does not contain.
fn check_request(csr: &VerifiedCsr, grant: &Grant) -> Result<(), IssueError> {
    let req = csr.requested();
    match req.uris.as_slice() {
        [] => {}
        [one] if one.parse::<SpiffeId>().ok().as_ref() == Some(grant.spiffe_id()) => {}
        uris => {
            return Err(IssueError::NotGranted(format!(
                "the CSR asks for URI SAN(s) {uris:?}, but the caller may only have {}",
                grant.spiffe_id()
            )));
        }
    }
    for dns in &req.dns_names {
        if !grant
            .dns_names()
            .iter()
            .any(|g| g.eq_ignore_ascii_case(dns))
        {
            return Err(IssueError::NotGranted(format!(
                "the CSR asks for DNS name {dns:?}, which {} may not have",
                grant.spiffe_id()
            )));
        }
    }
    for ip in &req.ip_addresses {
        if !grant.ip_addresses().contains(ip) {
            return Err(IssueError::NotGranted(format!(
                "the CSR asks for IP address {ip}, which {} may not have",
                grant.spiffe_id()
            )));
        }
    }
    if !req.emails.is_empty() {
        return Err(IssueError::NotGranted(format!(
            "the CSR asks for e-mail SAN(s) {:?}; Signet never issues e-mail names",
            req.emails
        )));
    }
    if !req.other.is_empty() {
        return Err(IssueError::NotGranted(format!(
            "the CSR asks for SAN types Signet never issues: {}",
            req.other.join(", ")
        )));
    }
    if grant.spiffe_id().path().is_empty() {
        return Err(IssueError::NotGranted(format!(
            "{} has no path; an X509-SVID leaf needs a workload path",
            grant.spiffe_id()
        )));
    }
    Ok(())
}

/// The X509-SVID leaf for `grant` with `csr`'s public key, to be signed by the CA `ca` at `now`;
/// refuses a CSR asking for more than the grant, and a CA not valid at `now`.
pub(crate) fn leaf(
    ca: CaWindow<'_>,
    csr: &VerifiedCsr,
    grant: &Grant,
    now: SystemTime,
    serials: &dyn SerialSource,
) -> Result<LeafTemplate, IssueError> {
    check_request(csr, grant)?;

    let ca_nb = ca.not_before;
    let ca_na = ca.not_after;
    if now < ca_nb || now >= ca_na {
        return Err(IssueError::CaNotValid(format!(
            "CA {} is valid from {} to {} (unix seconds), now is {}",
            ca.key_id,
            unix(ca_nb),
            unix(ca_na),
            unix(now)
        )));
    }
    let out_of_range = || IssueError::Signing("the validity period is out of range".into());
    let not_before = now.checked_sub(BACKDATE).map_or(ca_nb, |t| t.max(ca_nb));
    let not_after = now.checked_add(grant.ttl()).map_or(ca_na, |t| t.min(ca_na));
    let not_before = floor_secs(not_before).ok_or_else(out_of_range)?;
    let not_after = floor_secs(not_after).ok_or_else(out_of_range)?;
    if not_after <= now {
        return Err(
            if not_after >= floor_secs(ca_na).ok_or_else(out_of_range)? {
                IssueError::CaNotValid(format!("CA {} expires within the second", ca.key_id))
            } else {
                IssueError::Signing(format!(
                    "the granted lifetime {:?} is shorter than one second",
                    grant.ttl()
                ))
            },
        );
    }

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Signet");
    params.distinguished_name = dn;
    let ia5 = |s: &str, what: &str| {
        s.try_into()
            .map_err(|e| IssueError::Signing(format!("{what} {s:?} cannot be encoded: {e}")))
    };
    let mut sans = vec![SanType::URI(ia5(
        &grant.spiffe_id().to_string(),
        "SPIFFE ID",
    )?)];
    for dns in grant.dns_names() {
        sans.push(SanType::DnsName(ia5(dns, "DNS name")?));
    }
    sans.extend(grant.ip_addresses().iter().copied().map(SanType::IpAddress));
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // An RSA key may also encipher (TLS 1.2 RSA key exchange).
    if matches!(csr.key_algorithm(), super::csr::KeyAlgorithm::Rsa(_)) {
        params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
    }
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(SerialNumber::from_slice(&serials.next_serial(now)));
    params.not_before = to_offset(not_before).ok_or_else(out_of_range)?;
    params.not_after = to_offset(not_after).ok_or_else(out_of_range)?;

    Ok(LeafTemplate {
        params,
        not_before,
        not_after,
    })
}

/// The organizationalUnit that tells a generated CA's generations apart: its creation time.
fn generation_label(now: SystemTime) -> String {
    to_offset(now)
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .map_or_else(|| "generation".to_owned(), |t| format!("generation {t}"))
}

/// The trust domain's SPIFFE ID cannot be encoded as a URI SAN (rcgen's words).
#[derive(Debug, thiserror::Error)]
#[error("trust domain URI: {0}")]
pub struct TrustDomainUri(#[source] rcgen::Error);

/// What every CA certificate Signet generates has: the name `O=Signet, OU=<generation>,
/// CN=Signet <kind> CA for <td>` (CAs of one trust domain differ by name too: a rotation has two
/// at once; X.520 caps commonName at 64 characters), the trust domain's SPIFFE ID, and
/// keyCertSign + cRLSign only: the X509-SVID standard (appendix A) sets digitalSignature if and
/// only if the SVID is a leaf, and SPIRE's CA certificates carry exactly these two. (A CA key
/// signs certificates and CRLs, nothing else; CA certificates made before this rule carried
/// digitalSignature too, which no verifier refuses.) The error says what could not be encoded.
pub(crate) fn ca_params(
    td: &TrustDomain,
    kind: &str,
    now: SystemTime,
) -> Result<CertificateParams, TrustDomainUri> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Signet");
    dn.push(DnType::OrganizationalUnitName, generation_label(now));
    let cn = format!("Signet {kind} CA for {td}");
    dn.push(
        DnType::CommonName,
        if cn.len() <= 64 {
            cn
        } else {
            format!("Signet {kind} CA")
        },
    );
    params.distinguished_name = dn;
    let uri = td.id_string().try_into().map_err(TrustDomainUri)?;
    params.subject_alt_names = vec![SanType::URI(uri)];
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

/// The self-signed certificate that carries a JWT-SVID signing key in its slot, so every slot
/// has a notBefore, a notAfter and a SubjectPublicKeyInfo the same way: `CN=Signet JWT-SVID key
/// <kid>`, not a CA, digitalSignature only, valid `not_before..not_after`. It is never put in
/// an X.509 bundle, a CRL signer list or an mTLS anchor list.
pub(crate) fn jwt_key_params(
    kid: &str,
    not_before: SystemTime,
    not_after: SystemTime,
    serial: &[u8],
) -> Option<CertificateParams> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Signet");
    dn.push(DnType::CommonName, format!("Signet JWT-SVID key {kid}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(SerialNumber::from_slice(serial));
    params.not_before = to_offset(floor_secs(not_before)?)?;
    params.not_after = to_offset(floor_secs(not_after)?)?;
    Some(params)
}
