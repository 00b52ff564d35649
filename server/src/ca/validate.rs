//! Re-checks of certificates against the X509-SVID profile (spiffe/spiffe `X509-SVID.md`).
//!
//! The core runs [`check_leaf`]'s checks on every certificate it signs before it leaves (as
//! [`check_parsed_leaf`], against the [`IssuerFacts`] it keeps for its key: the same checks
//! without re-parsing its own certificate); tests elsewhere use both public functions to check
//! what the server returns.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use signet_types::{SpiffeId, SpiffeIdError};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER, OID_X509_EXT_BASIC_CONSTRAINTS,
    OID_X509_EXT_EXTENDED_KEY_USAGE, OID_X509_EXT_KEY_USAGE, OID_X509_EXT_NAME_CONSTRAINTS,
    OID_X509_EXT_SUBJECT_ALT_NAME, OID_X509_EXT_SUBJECT_KEY_IDENTIFIER,
};
use x509_parser::prelude::FromDer;
use x509_parser::time::ASN1Time;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::csr::ip_from_bytes;

/// What a checked leaf says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafInfo {
    pub spiffe_id: SpiffeId,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// [`signet_types::serial_hex`] of the serial.
    pub serial: String,
}

/// Why a certificate fails a check of this module (or [`super::authority`]'s issued-by check),
/// each with the message an operator or a log reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// The parser's words.
    #[error("not an X.509 certificate: {0}")]
    NotX509(String),
    #[error("{0} unexpected bytes after the certificate")]
    TrailingBytes(usize),
    /// An extension the checks read (named) is malformed: the parser's words.
    #[error("{0}: {1}")]
    Malformed(&'static str, String),
    /// A rule of the profile the certificate breaks, stated whole.
    #[error("{0}")]
    Profile(&'static str),
    /// A critical extension the checks do not understand (its OID).
    #[error("unknown critical extension {0}")]
    UnknownCritical(String),
    #[error("extension {oid} cannot be parsed: {error}")]
    UnparsableExtension { oid: String, error: String },
    /// A SAN of a kind an X509-SVID never has (its `Debug`).
    #[error("unexpected subjectAltName entry {0}")]
    UnexpectedSan(String),
    #[error("an X509-SVID has exactly one URI SAN, this one has {0}")]
    UriSans(usize),
    #[error("the URI SAN {uri:?} is not a SPIFFE ID: {source}")]
    NotSpiffeId { uri: String, source: SpiffeIdError },
    #[error("the SPIFFE ID {0} of a leaf must have a path")]
    LeafIdWithoutPath(SpiffeId),
    /// Only the test-side profile check ([`check_ca`]) makes it.
    #[cfg_attr(not(test), allow(dead_code))]
    #[error("a CA certificate's SPIFFE ID must not have a path: {0}")]
    CaIdWithPath(SpiffeId),
    #[error("the issuer's public key does not parse: {0}")]
    IssuerKey(String),
    #[error("the signature does not verify with the issuer's key: {0}")]
    Signature(String),
    /// The child names another issuer (subjects as text).
    #[error("\"{child}\" names issuer \"{named}\", not \"{parent}\"")]
    OtherIssuer {
        child: String,
        named: String,
        parent: String,
    },
    /// What `which` certificate (`leaf`, `issuer`, ...) of several failed.
    #[error("{which}: {error}")]
    Of {
        which: &'static str,
        error: Box<CertError>,
    },
    /// The child's signature does not verify with the parent's key (subjects as text).
    #[error("the signature on \"{child}\" does not verify with the key of \"{parent}\" ({error})")]
    NotSignedBy {
        child: String,
        parent: String,
        error: String,
    },
}

impl CertError {
    /// This error, as that of the `which` certificate.
    pub(crate) fn of(self, which: &'static str) -> Self {
        CertError::Of {
            which,
            error: Box::new(self),
        }
    }
}

/// Parses one DER certificate, refusing trailing bytes.
pub(crate) fn parse_cert(der: &[u8]) -> Result<X509Certificate<'_>, CertError> {
    let (rest, cert) =
        X509Certificate::from_der(der).map_err(|e| CertError::NotX509(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CertError::TrailingBytes(rest.len()));
    }
    Ok(cert)
}

/// An ASN.1 time as a `SystemTime`.
pub(crate) fn to_system_time(t: &ASN1Time) -> SystemTime {
    let secs = t.timestamp();
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// The certificate's subject key identifier, if it has one.
pub(crate) fn subject_key_id<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    cert.iter_extensions()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(ki) => Some(ki.0),
            _ => None,
        })
}

fn authority_key_id<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    cert.iter_extensions()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|k| k.0)
            }
            _ => None,
        })
}

fn positive_serial(raw: &[u8]) -> Result<(), CertError> {
    let broken = match raw.first() {
        None => "the serial number is empty",
        Some(b) if b & 0x80 != 0 => "the serial number is negative",
        Some(_) if raw.iter().all(|b| *b == 0) => "the serial number is zero",
        Some(_) if raw.len() > 20 => "the serial number is longer than 20 octets",
        Some(_) => return Ok(()),
    };
    Err(CertError::Profile(broken))
}

/// Rejects certificates with a critical extension the checks below do not understand.
fn no_unknown_critical(cert: &X509Certificate<'_>) -> Result<(), CertError> {
    let known = [
        OID_X509_EXT_BASIC_CONSTRAINTS,
        OID_X509_EXT_KEY_USAGE,
        OID_X509_EXT_EXTENDED_KEY_USAGE,
        OID_X509_EXT_SUBJECT_ALT_NAME,
        OID_X509_EXT_SUBJECT_KEY_IDENTIFIER,
        OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER,
        OID_X509_EXT_NAME_CONSTRAINTS,
    ];
    for ext in cert.extensions() {
        if ext.critical && !known.contains(&ext.oid) {
            return Err(CertError::UnknownCritical(ext.oid.to_id_string()));
        }
        if let ParsedExtension::ParseError { error } = ext.parsed_extension() {
            return Err(CertError::UnparsableExtension {
                oid: ext.oid.to_id_string(),
                error: error.to_string(),
            });
        }
    }
    Ok(())
}

/// Checks `der` against the X509-SVID leaf profile, issued by `issuer_der`, valid at `now`.
/// The issuance path runs the same checks through [`check_parsed_leaf`] with the issuer's facts
/// taken once; this from-DER form is what the profile's tests drive.
#[cfg(test)]
pub fn check_leaf(der: &[u8], issuer_der: &[u8], now: SystemTime) -> Result<LeafInfo, CertError> {
    let leaf = parse_cert(der).map_err(|e| e.of("leaf"))?;
    let issuer = parse_cert(issuer_der).map_err(|e| e.of("issuer"))?;
    check_parsed_leaf(&leaf, &IssuerFacts::of(&issuer), now)
}

/// What [`check_parsed_leaf`] needs of the issuer, taken from its parsed certificate once: the
/// CA core keeps one per signing key ([`super::Authority`]), so it parses neither its own
/// certificate nor (in `super::issue`'s self-check) the leaf twice per issuance.
#[derive(Debug, Clone)]
pub(crate) struct IssuerFacts {
    subject_raw: Vec<u8>,
    subject_key_id: Option<Vec<u8>>,
    not_before: SystemTime,
    not_after: SystemTime,
    /// The issuer's SubjectPublicKeyInfo, DER.
    spki_der: Vec<u8>,
}

impl IssuerFacts {
    pub(crate) fn of(issuer: &X509Certificate<'_>) -> Self {
        Self {
            subject_raw: issuer.subject().as_raw().to_vec(),
            subject_key_id: subject_key_id(issuer).map(<[u8]>::to_vec),
            not_before: to_system_time(&issuer.validity().not_before),
            not_after: to_system_time(&issuer.validity().not_after),
            spki_der: issuer.public_key().raw.to_vec(),
        }
    }
}

/// [`check_leaf`] on a parsed leaf, against its issuer's [`IssuerFacts`]: the same checks.
pub(crate) fn check_parsed_leaf(
    leaf: &X509Certificate<'_>,
    issuer: &IssuerFacts,
    now: SystemTime,
) -> Result<LeafInfo, CertError> {
    if leaf.version().0 != 2 {
        return Err(CertError::Profile("not an X.509 v3 certificate"));
    }
    positive_serial(leaf.raw_serial())?;
    no_unknown_critical(leaf)?;

    // Names.
    let san = leaf
        .subject_alternative_name()
        .map_err(|e| CertError::Malformed("subjectAltName", e.to_string()))?
        .ok_or(CertError::Profile("no subjectAltName extension"))?;
    if leaf.subject().iter().next().is_none() && !san.critical {
        return Err(CertError::Profile(
            "the subject is empty but the subjectAltName extension is not critical",
        ));
    }
    let mut uris = Vec::new();
    let mut dns_names = Vec::new();
    let mut ip_addresses = Vec::new();
    for name in &san.value.general_names {
        match name {
            GeneralName::URI(u) => uris.push(*u),
            GeneralName::DNSName(d) => dns_names.push((*d).to_owned()),
            GeneralName::IPAddress(b) => ip_addresses
                .push(ip_from_bytes(b).ok_or(CertError::Profile("an iPAddress SAN is malformed"))?),
            other => return Err(CertError::UnexpectedSan(format!("{other:?}"))),
        }
    }
    let [uri] = uris.as_slice() else {
        return Err(CertError::UriSans(uris.len()));
    };
    let spiffe_id: SpiffeId = uri.parse().map_err(|source| CertError::NotSpiffeId {
        uri: (*uri).to_owned(),
        source,
    })?;
    if spiffe_id.path().is_empty() {
        return Err(CertError::LeafIdWithoutPath(spiffe_id));
    }

    // Constraints and usages.
    let bc = leaf
        .basic_constraints()
        .map_err(|e| CertError::Malformed("basicConstraints", e.to_string()))?
        .ok_or(CertError::Profile("no basicConstraints extension"))?;
    if bc.value.ca {
        return Err(CertError::Profile(
            "basicConstraints says cA=true on a leaf",
        ));
    }
    let ku = leaf
        .key_usage()
        .map_err(|e| CertError::Malformed("keyUsage", e.to_string()))?
        .ok_or(CertError::Profile("no keyUsage extension"))?;
    if !ku.critical {
        return Err(CertError::Profile("the keyUsage extension is not critical"));
    }
    if !ku.value.digital_signature() {
        return Err(CertError::Profile("keyUsage lacks digitalSignature"));
    }
    if ku.value.key_cert_sign() || ku.value.crl_sign() {
        return Err(CertError::Profile(
            "keyUsage of a leaf has keyCertSign or cRLSign",
        ));
    }
    let eku = leaf
        .extended_key_usage()
        .map_err(|e| CertError::Malformed("extendedKeyUsage", e.to_string()))?
        .ok_or(CertError::Profile("no extendedKeyUsage extension"))?;
    if !(eku.value.server_auth && eku.value.client_auth) {
        return Err(CertError::Profile(
            "extendedKeyUsage lacks serverAuth or clientAuth",
        ));
    }

    // Key identifiers and issuer.
    subject_key_id(leaf).ok_or(CertError::Profile("no subjectKeyIdentifier"))?;
    let aki =
        authority_key_id(leaf).ok_or(CertError::Profile("no authorityKeyIdentifier key id"))?;
    if let Some(issuer_ski) = &issuer.subject_key_id
        && aki != issuer_ski.as_slice()
    {
        return Err(CertError::Profile(
            "authorityKeyIdentifier does not match the issuer's subjectKeyIdentifier",
        ));
    }
    if leaf.issuer().as_raw() != issuer.subject_raw.as_slice() {
        return Err(CertError::Profile(
            "the issuer name is not byte-identical to the issuer's subject",
        ));
    }
    let (_, issuer_key) = SubjectPublicKeyInfo::from_der(&issuer.spki_der)
        .map_err(|e| CertError::IssuerKey(e.to_string()))?;
    leaf.verify_signature(Some(&issuer_key))
        .map_err(|e| CertError::Signature(e.to_string()))?;

    // Validity.
    let not_before = to_system_time(&leaf.validity().not_before);
    let not_after = to_system_time(&leaf.validity().not_after);
    if not_before < issuer.not_before || not_after > issuer.not_after {
        return Err(CertError::Profile(
            "the validity is not inside the issuer's validity",
        ));
    }
    if now < not_before || now >= not_after {
        return Err(CertError::Profile("not valid at the given time"));
    }

    Ok(LeafInfo {
        spiffe_id,
        dns_names,
        ip_addresses,
        not_before,
        not_after,
        serial: signet_types::serial_hex(leaf.raw_serial()),
    })
}

/// Checks that `der` is a signing (CA) certificate: cA=true, keyCertSign, a subject key
/// identifier, and if it carries a SPIFFE ID, one without a path.
#[cfg(test)]
pub fn check_ca(der: &[u8]) -> Result<(), CertError> {
    let cert = parse_cert(der)?;
    ca_profile(&cert)
}

#[cfg(test)]
fn ca_profile(cert: &X509Certificate<'_>) -> Result<(), CertError> {
    ca_basics(cert)?;
    subject_key_id(cert).ok_or(CertError::Profile(
        "no subjectKeyIdentifier on the CA certificate",
    ))?;
    if let Some(san) = cert
        .subject_alternative_name()
        .map_err(|e| CertError::Malformed("subjectAltName", e.to_string()))?
    {
        for name in &san.value.general_names {
            if let GeneralName::URI(u) = name
                && let Ok(id) = u.parse::<SpiffeId>()
                && !id.path().is_empty()
            {
                return Err(CertError::CaIdWithPath(id));
            }
        }
    }
    Ok(())
}

/// The trust domains named by a CA certificate's SPIFFE ID URI SANs (`spiffe://<td>`, as every
/// CA certificate Signet generates carries; a path is ignored), in SAN order: what a relying
/// party trusts the certificate for. Empty when it names none.
pub(crate) fn ca_trust_domains(der: &[u8]) -> Result<Vec<signet_types::TrustDomain>, CertError> {
    let cert = parse_cert(der)?;
    let mut out = Vec::new();
    if let Some(san) = cert
        .subject_alternative_name()
        .map_err(|e| CertError::Malformed("subjectAltName", e.to_string()))?
    {
        for name in &san.value.general_names {
            if let GeneralName::URI(u) = name
                && let Ok(id) = u.parse::<SpiffeId>()
            {
                out.push(id.trust_domain().clone());
            }
        }
    }
    Ok(out)
}

/// cA=true and keyCertSign: the least a certificate needs to sign others.
pub(crate) fn ca_basics(cert: &X509Certificate<'_>) -> Result<(), CertError> {
    let bc = cert
        .basic_constraints()
        .map_err(|e| CertError::Malformed("basicConstraints", e.to_string()))?
        .ok_or(CertError::Profile(
            "no basicConstraints extension: not a CA certificate",
        ))?;
    if !bc.value.ca {
        return Err(CertError::Profile(
            "basicConstraints cA=false: not a CA certificate",
        ));
    }
    let ku = cert
        .key_usage()
        .map_err(|e| CertError::Malformed("keyUsage", e.to_string()))?
        .ok_or(CertError::Profile(
            "no keyUsage extension: a CA certificate needs keyCertSign",
        ))?;
    if !ku.value.key_cert_sign() {
        return Err(CertError::Profile(
            "keyUsage lacks keyCertSign: the certificate may not sign certificates",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rcgen::{
        CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose, SanType, SerialNumber,
    };

    use super::*;
    use crate::ca::KeyType;
    use crate::ca::serial::SequentialSerials;
    use crate::ca::testutil::{self, grant, now, p256_csr};
    use crate::ca::time::to_offset;

    const HOUR: Duration = Duration::from_secs(3600);

    /// Leaf params as the template makes them, for tests to break one field at a time.
    fn good_params() -> CertificateParams {
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Signet");
        p.distinguished_name = dn;
        p.subject_alt_names = vec![SanType::URI(
            "spiffe://example.org/w".try_into().expect("ia5"),
        )];
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.use_authority_key_identifier_extension = true;
        p.serial_number = Some(SerialNumber::from(42u64));
        p.not_before = to_offset(now() - Duration::from_secs(5)).expect("time");
        p.not_after = to_offset(now() + HOUR).expect("time");
        p
    }

    #[test]
    fn accepts_good_and_rejects_each_broken_field() {
        let (ca, _) = testutil::root(KeyType::EcdsaP256, 24 * HOUR);
        let key = KeyPair::generate().expect("key");
        let sign =
            |p: &CertificateParams| p.signed_by(&key, ca.issuer()).expect("sign").der().to_vec();
        let good = sign(&good_params());
        let info = check_leaf(&good, ca.cert_der(), now()).expect("good leaf");
        assert_eq!(info.spiffe_id.to_string(), "spiffe://example.org/w");
        assert_eq!(info.serial, "2a");

        type Breaker = Box<dyn Fn(&mut CertificateParams)>;
        let broken: Vec<(&str, Breaker)> = vec![
            (
                "two URIs",
                Box::new(|p| {
                    p.subject_alt_names.push(SanType::URI(
                        "spiffe://example.org/x".try_into().expect("ia5"),
                    ))
                }),
            ),
            (
                "no URI",
                Box::new(|p| {
                    p.subject_alt_names = vec![SanType::DnsName("a.b".try_into().expect("ia5"))]
                }),
            ),
            (
                "root id",
                Box::new(|p| {
                    p.subject_alt_names = vec![SanType::URI(
                        "spiffe://example.org".try_into().expect("ia5"),
                    )]
                }),
            ),
            (
                "not spiffe",
                Box::new(|p| {
                    p.subject_alt_names = vec![SanType::URI(
                        "https://example.org/w".try_into().expect("ia5"),
                    )]
                }),
            ),
            (
                "CA",
                Box::new(|p| p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained)),
            ),
            ("no BC", Box::new(|p| p.is_ca = IsCa::NoCa)),
            ("no KU", Box::new(|p| p.key_usages.clear())),
            (
                "certsign",
                Box::new(|p| p.key_usages.push(KeyUsagePurpose::KeyCertSign)),
            ),
            (
                "crlsign",
                Box::new(|p| p.key_usages.push(KeyUsagePurpose::CrlSign)),
            ),
            (
                "no digitalSignature",
                Box::new(|p| p.key_usages = vec![KeyUsagePurpose::KeyEncipherment]),
            ),
            (
                "server only",
                Box::new(|p| p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth]),
            ),
            ("no EKU", Box::new(|p| p.extended_key_usages.clear())),
            (
                "no AKI",
                Box::new(|p| p.use_authority_key_identifier_extension = false),
            ),
            (
                "zero serial",
                Box::new(|p| p.serial_number = Some(SerialNumber::from(0u64))),
            ),
            (
                "before CA",
                Box::new(|p| p.not_before = to_offset(now() - HOUR).expect("t")),
            ),
            (
                "after CA",
                Box::new(|p| p.not_after = to_offset(now() + 48 * HOUR).expect("t")),
            ),
            (
                "expired",
                Box::new(|p| p.not_after = to_offset(now()).expect("t")),
            ),
            (
                "future",
                Box::new(|p| p.not_before = to_offset(now() + Duration::from_secs(1)).expect("t")),
            ),
            (
                "empty subject, non-critical SAN is fine for rcgen (it marks it critical)",
                Box::new(|_| {}),
            ),
        ];
        for (what, f) in broken.iter().take(broken.len() - 1) {
            let mut p = good_params();
            f(&mut p);
            let der = sign(&p);
            assert!(
                check_leaf(&der, ca.cert_der(), now()).is_err(),
                "{what} accepted"
            );
        }
        // Empty subject: rcgen marks the SAN critical, which the profile requires.
        let mut p = good_params();
        p.distinguished_name = DistinguishedName::new();
        check_leaf(&sign(&p), ca.cert_der(), now()).expect("empty subject + critical SAN");

        // Another issuer.
        let (other, _) = testutil::root(KeyType::EcdsaP256, 24 * HOUR);
        assert!(check_leaf(&good, other.cert_der(), now()).is_err());
        // Garbage and trailing bytes.
        assert!(check_leaf(b"junk", ca.cert_der(), now()).is_err());
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(check_leaf(&trailing, ca.cert_der(), now()).is_err());
        // A flipped signature byte.
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 2] ^= 1;
        assert!(check_leaf(&bad, ca.cert_der(), now()).is_err());
    }

    #[test]
    fn check_ca_accepts_roots_and_rejects_leaves() {
        let (ca, _) = testutil::root(KeyType::EcdsaP384, HOUR);
        check_ca(ca.cert_der()).expect("root is a CA");
        let (_, csr) = p256_csr();
        let issued = ca
            .issue(&csr, &grant("/w", HOUR), now(), &SequentialSerials::new(1))
            .expect("issues");
        assert!(check_ca(&issued.der).is_err());
        assert!(check_ca(b"").is_err());
    }
}
