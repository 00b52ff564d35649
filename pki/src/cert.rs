//! [`ParsedCert`]: an X.509 certificate read once from DER, with the facts Signet's crates ask
//! of it — the SPIFFE ID, the DNS names, the key identifiers, the validity, the serial, the
//! fingerprint, whether it is a CA. Every crate that reads a certificate asks this type, so a
//! certificate is read one way everywhere.
//!
//! Reading is strict about the extensions these facts come from: a subjectAltName, basic
//! constraints, key usage or key identifier extension that does not parse, or that appears
//! twice, refuses the certificate rather than being skipped. What the facts *mean* for a caller
//! (an X509-SVID leaf must not be a CA; a CRL issuer must be one) is the caller's rule.

use std::fmt;
use std::time::{Duration, SystemTime};

use signet_types::SpiffeId;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER, OID_X509_EXT_BASIC_CONSTRAINTS, OID_X509_EXT_KEY_USAGE,
    OID_X509_EXT_SUBJECT_ALT_NAME, OID_X509_EXT_SUBJECT_KEY_IDENTIFIER,
};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::fingerprint;

/// Why bytes are not a certificate Signet can read, or a certificate has no SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// Not a DER X.509 certificate.
    #[error("not a DER X.509 certificate: {0}")]
    Malformed(String),
    /// A certificate followed by more bytes.
    #[error("{0} unexpected bytes after the certificate")]
    TrailingBytes(usize),
    /// An extension Signet reads does not parse or appears twice.
    #[error("unreadable {extension}: {reason}")]
    Extension {
        extension: &'static str,
        reason: String,
    },
    /// Not PEM, or no `CERTIFICATE` block in it.
    #[error("not a PEM certificate: {0}")]
    Pem(String),
    /// No URI SAN, so no SPIFFE ID.
    #[error("it has no URI SAN, so no SPIFFE ID")]
    NoUriSan,
    /// More than one URI SAN: an X509-SVID carries exactly one.
    /// `first` holds the first few, each cut and quoted as untrusted text.
    #[error("it has {count} URI SANs ({}{}); an X509-SVID carries exactly one", first.join(", "), if *count > first.len() { ", …" } else { "" })]
    ManyUriSans { count: usize, first: Vec<String> },
    /// The one URI SAN is not a SPIFFE ID.
    #[error("its URI SAN is not a SPIFFE ID: {0}")]
    NotSpiffeId(String),
}

pub use crate::fingerprint::hex;

/// How many of a certificate's URI SANs [`CertError::ManyUriSans`] names.
const MANY_URIS_SHOWN: usize = 3;

/// `bytes` without leading zero bytes: a DER INTEGER serial as the unsigned big-endian number it
/// is (DER puts a 0x00 before a positive serial whose top bit is set; both spellings compare
/// equal this way).
pub fn serial_bytes(raw: &[u8]) -> &[u8] {
    let start = raw.iter().position(|b| *b != 0).unwrap_or(raw.len());
    &raw[start..]
}

/// A time as `SystemTime`, clamped at the Unix epoch (a certificate time before 1970, or one
/// out of `SystemTime`'s range, reads as 1970).
pub(crate) fn unix(secs: i64) -> SystemTime {
    u64::try_from(secs)
        .ok()
        .and_then(|s| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s)))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// An X.509 certificate and the facts Signet reads from it, read once.
#[derive(Clone, PartialEq, Eq)]
pub struct ParsedCert {
    der: Vec<u8>,
    uris: Vec<String>,
    dns_names: Vec<String>,
    common_name: Option<String>,
    subject_key_id: Option<String>,
    authority_key_id: Option<String>,
    not_before_unix: i64,
    not_after_unix: i64,
    serial: Vec<u8>,
    serial_hex: String,
    is_ca: bool,
    key_cert_sign: bool,
    subject_der: Vec<u8>,
    issuer_der: Vec<u8>,
    spki_der: Vec<u8>,
}

impl fmt::Debug for ParsedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParsedCert")
            .field("serial", &self.serial_hex)
            .field("uris", &self.uris)
            .field("dns_names", &self.dns_names)
            .field("is_ca", &self.is_ca)
            .field("subject_key_id", &self.subject_key_id)
            .field("authority_key_id", &self.authority_key_id)
            .finish()
    }
}

/// The one extension `oid` of `cert`, parsed: `None` when absent; an error when it appears twice
/// or does not parse. (x509-parser's own accessors — `basic_constraints()` and its siblings —
/// read an extension that fails to parse as absent, which would make an unreadable
/// basicConstraints a leaf's.)
fn unique_ext<'a>(
    cert: &'a X509Certificate<'_>,
    oid: &x509_parser::der_parser::Oid<'_>,
    extension: &'static str,
) -> Result<Option<&'a ParsedExtension<'a>>, CertError> {
    let ext = cert
        .get_extension_unique(oid)
        .map_err(|e| CertError::Extension {
            extension,
            reason: e.to_string(),
        })?;
    match ext.map(|e| e.parsed_extension()) {
        Some(ParsedExtension::ParseError { error }) => Err(CertError::Extension {
            extension,
            reason: error.to_string(),
        }),
        other => Ok(other),
    }
}

impl ParsedCert {
    /// Reads one DER certificate (nothing may follow it).
    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        let (rest, cert) =
            X509Certificate::from_der(der).map_err(|e| CertError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(CertError::TrailingBytes(rest.len()));
        }
        let is_ca = match unique_ext(&cert, &OID_X509_EXT_BASIC_CONSTRAINTS, "basic constraints")? {
            Some(ParsedExtension::BasicConstraints(bc)) => bc.ca,
            _ => false,
        };
        let key_cert_sign = match unique_ext(&cert, &OID_X509_EXT_KEY_USAGE, "key usage")? {
            Some(ParsedExtension::KeyUsage(ku)) => ku.key_cert_sign(),
            _ => false,
        };
        let mut uris = Vec::new();
        let mut dns_names = Vec::new();
        if let Some(ParsedExtension::SubjectAlternativeName(san)) =
            unique_ext(&cert, &OID_X509_EXT_SUBJECT_ALT_NAME, "subjectAltName")?
        {
            for name in &san.general_names {
                match name {
                    GeneralName::URI(u) => uris.push((*u).to_owned()),
                    GeneralName::DNSName(d) => dns_names.push((*d).to_owned()),
                    _ => {}
                }
            }
        }
        let subject_key_id = match unique_ext(
            &cert,
            &OID_X509_EXT_SUBJECT_KEY_IDENTIFIER,
            "subject key identifier",
        )? {
            Some(ParsedExtension::SubjectKeyIdentifier(k)) => Some(hex(k.0)),
            _ => None,
        };
        let authority_key_id = match unique_ext(
            &cert,
            &OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER,
            "authority key identifier",
        )? {
            Some(ParsedExtension::AuthorityKeyIdentifier(a)) => {
                a.key_identifier.as_ref().map(|k| hex(k.0))
            }
            _ => None,
        };
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .map(str::to_owned);
        let validity = cert.validity();
        Ok(Self {
            uris,
            dns_names,
            common_name,
            subject_key_id,
            authority_key_id,
            not_before_unix: validity.not_before.timestamp(),
            not_after_unix: validity.not_after.timestamp(),
            serial: serial_bytes(cert.raw_serial()).to_vec(),
            serial_hex: signet_types::serial_hex(cert.raw_serial()),
            is_ca,
            key_cert_sign,
            subject_der: cert.subject().as_raw().to_vec(),
            issuer_der: cert.issuer().as_raw().to_vec(),
            spki_der: cert.public_key().raw.to_vec(),
            der: der.to_vec(),
        })
    }

    /// Reads the first certificate of a PEM chain.
    pub fn from_pem_first(pem: &[u8]) -> Result<Self, CertError> {
        let ders =
            signet_types::pem::parse_certs(pem).map_err(|e| CertError::Pem(e.to_string()))?;
        let der = ders
            .first()
            .ok_or_else(|| CertError::Pem("no certificate".into()))?;
        Self::from_der(der)
    }

    /// The SPIFFE ID of an X509-SVID: the certificate's one URI SAN, parsed.
    pub fn spiffe_id(&self) -> Result<SpiffeId, CertError> {
        match self.uris.as_slice() {
            [] => Err(CertError::NoUriSan),
            [one] => one.parse().map_err(|e| {
                CertError::NotSpiffeId(format!("{}: {e}", signet_types::untrusted::quoted(one)))
            }),
            many => Err(CertError::ManyUriSans {
                count: many.len(),
                first: many
                    .iter()
                    .take(MANY_URIS_SHOWN)
                    .map(|u| signet_types::untrusted::quoted(u))
                    .collect(),
            }),
        }
    }

    /// Every URI SAN, in the certificate's order.
    pub fn uris(&self) -> &[String] {
        &self.uris
    }
    /// Every DNS SAN, in the certificate's order.
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }
    /// The subject's first common name, when it is a string.
    pub fn common_name(&self) -> Option<&str> {
        self.common_name.as_deref()
    }
    /// The subject key identifier, lowercase hex: the key ID Signet names a CA key by.
    pub fn subject_key_id(&self) -> Option<&str> {
        self.subject_key_id.as_deref()
    }
    /// The authority key identifier's key ID, lowercase hex: the key that issued this one.
    pub fn authority_key_id(&self) -> Option<&str> {
        self.authority_key_id.as_deref()
    }
    pub fn not_before(&self) -> SystemTime {
        unix(self.not_before_unix)
    }
    pub fn not_after(&self) -> SystemTime {
        unix(self.not_after_unix)
    }
    /// Whether notAfter is before notBefore (compared as written, before any clamping).
    pub fn validity_inverted(&self) -> bool {
        self.not_after_unix < self.not_before_unix
    }
    /// The serial as an unsigned big-endian number without leading zero bytes
    /// ([`serial_bytes`]), to compare with a CRL's entries.
    pub fn serial(&self) -> &[u8] {
        &self.serial
    }
    /// The serial as the server, the ledger and the CLI spell it ([`signet_types::serial_hex`]).
    pub fn serial_hex(&self) -> &str {
        &self.serial_hex
    }
    /// SHA-256 of the DER, lowercase hex ([`fingerprint::sha256_hex`]).
    pub fn fingerprint(&self) -> String {
        fingerprint::sha256_hex(&self.der)
    }
    /// Basic constraints say cA=true.
    pub fn is_ca(&self) -> bool {
        self.is_ca
    }
    /// Key usage says keyCertSign.
    pub fn key_cert_sign(&self) -> bool {
        self.key_cert_sign
    }
    /// The subject name, raw DER.
    pub fn subject_der(&self) -> &[u8] {
        &self.subject_der
    }
    /// The issuer name, raw DER.
    pub fn issuer_der(&self) -> &[u8] {
        &self.issuer_der
    }
    /// The SubjectPublicKeyInfo, DER.
    pub fn spki_der(&self) -> &[u8] {
        &self.spki_der
    }
    /// The certificate, DER.
    pub fn der(&self) -> &[u8] {
        &self.der
    }
    pub fn into_der(self) -> Vec<u8> {
        self.der
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{KeyAlgorithm, generate};

    fn params(uris: &[&str], dns: &[&str]) -> rcgen::CertificateParams {
        let mut p = rcgen::CertificateParams::default();
        p.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI((*u).try_into().unwrap()))
            .chain(
                dns.iter()
                    .map(|d| rcgen::SanType::DnsName((*d).try_into().unwrap())),
            )
            .collect();
        p
    }

    #[test]
    fn reads_the_facts_of_a_leaf_under_a_ca() {
        let ca_key = generate(KeyAlgorithm::EcdsaP256)
            .unwrap()
            .key_pair()
            .unwrap();
        let mut ca_p = params(&[], &[]);
        ca_p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        let ca_der = ca_p.self_signed(&ca_key).unwrap().der().to_vec();
        let issuer = rcgen::Issuer::new(ca_p, ca_key);
        let leaf_key = generate(KeyAlgorithm::EcdsaP256)
            .unwrap()
            .key_pair()
            .unwrap();
        let mut p = params(&["spiffe://example.org/w"], &["w.example.org", "w"]);
        p.use_authority_key_identifier_extension = true;
        p.serial_number = Some(rcgen::SerialNumber::from_slice(&[0x00, 0x8f, 0x01]));
        let leaf = p.signed_by(&leaf_key, &issuer).unwrap().der().to_vec();

        let ca = ParsedCert::from_der(&ca_der).unwrap();
        let c = ParsedCert::from_der(&leaf).unwrap();
        assert!(ca.is_ca() && ca.key_cert_sign());
        assert!(!c.is_ca() && !c.key_cert_sign());
        let ski = ca.subject_key_id().expect("rcgen writes an SKI");
        assert_eq!(ski.len() % 2, 0);
        assert!(
            ski.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(c.authority_key_id(), Some(ski));
        assert_eq!(c.spiffe_id().unwrap().to_string(), "spiffe://example.org/w");
        assert_eq!(c.dns_names(), ["w.example.org", "w"]);
        assert_eq!(c.serial(), [0x8f, 0x01]);
        assert_eq!(c.serial_hex(), "8f01");
        assert_eq!(c.fingerprint(), fingerprint::sha256_hex(&leaf));
        assert_eq!(c.issuer_der(), ca.subject_der());
        assert!(c.not_before() <= c.not_after() && !c.validity_inverted());
        assert_eq!(c.der(), leaf.as_slice());
        let pem = signet_types::pem::certs_to_pem([leaf.as_slice(), ca_der.as_slice()]);
        assert_eq!(ParsedCert::from_pem_first(pem.as_bytes()).unwrap(), c);
    }

    #[test]
    fn the_spiffe_id_is_the_one_uri_san() {
        let key = generate(KeyAlgorithm::EcdsaP256)
            .unwrap()
            .key_pair()
            .unwrap();
        let id = |uris: &[&str]| {
            let der = params(uris, &[]).self_signed(&key).unwrap().der().to_vec();
            ParsedCert::from_der(&der).unwrap().spiffe_id()
        };
        assert_eq!(id(&[]), Err(CertError::NoUriSan));
        assert!(matches!(
            id(&["spiffe://a.org/x", "spiffe://a.org/y"]),
            Err(CertError::ManyUriSans { count: 2, .. })
        ));
        assert!(matches!(
            id(&["https://a.org/x"]),
            Err(CertError::NotSpiffeId(_))
        ));
    }

    /// A basicConstraints saying `cA TRUE` with a pathLen past u32 fails x509-parser's parse;
    /// its own accessor reads that as "no basicConstraints", which would pass a CA certificate
    /// as a leaf. Signet refuses the certificate instead.
    #[test]
    fn an_unparsable_basic_constraints_refuses_the_certificate() {
        let key = generate(KeyAlgorithm::EcdsaP256)
            .unwrap()
            .key_pair()
            .unwrap();
        let mut p = params(&["spiffe://example.org/w"], &[]);
        // SEQUENCE { BOOLEAN TRUE, INTEGER 2^32 }
        let bc = vec![
            0x30, 0x0a, 0x01, 0x01, 0xff, 0x02, 0x05, 0x01, 0x00, 0x00, 0x00, 0x00,
        ];
        let mut ext = rcgen::CustomExtension::from_oid_content(&[2, 5, 29, 19], bc);
        ext.set_criticality(true);
        p.custom_extensions.push(ext);
        let der = p.self_signed(&key).unwrap().der().to_vec();
        match ParsedCert::from_der(&der) {
            Err(CertError::Extension { extension, .. }) => {
                assert_eq!(extension, "basic constraints")
            }
            other => panic!("read as {other:?}"),
        }
    }

    /// A hostile certificate's URI SANs reach error messages cut, quoted and counted, never
    /// whole.
    #[test]
    fn many_uri_sans_are_named_briefly() {
        let key = generate(KeyAlgorithm::EcdsaP256)
            .unwrap()
            .key_pair()
            .unwrap();
        let long: Vec<String> = (0..20)
            .map(|i| format!("spiffe://a.org/{i}/{}\u{1b}[2J", "x".repeat(2000)))
            .collect();
        let uris: Vec<&str> = long.iter().map(String::as_str).collect();
        let der = params(&uris, &[]).self_signed(&key).unwrap().der().to_vec();
        let err = ParsedCert::from_der(&der).unwrap().spiffe_id().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("it has 20 URI SANs (\"spiffe://a.org/0/"),
            "{msg}"
        );
        assert!(
            msg.contains(", …); an X509-SVID carries exactly one"),
            "{msg}"
        );
        assert!(msg.len() < 4 * 300, "{} bytes", msg.len());
        assert!(!msg.contains('\u{1b}'));
    }

    #[test]
    fn garbage_and_trailing_bytes_are_refused() {
        assert!(matches!(
            ParsedCert::from_der(b"junk"),
            Err(CertError::Malformed(_))
        ));
        assert!(matches!(
            ParsedCert::from_der(&[]),
            Err(CertError::Malformed(_))
        ));
        let key = generate(KeyAlgorithm::EcdsaP256)
            .unwrap()
            .key_pair()
            .unwrap();
        let mut der = params(&[], &[]).self_signed(&key).unwrap().der().to_vec();
        der.push(0);
        assert_eq!(ParsedCert::from_der(&der), Err(CertError::TrailingBytes(1)));
        assert!(matches!(
            ParsedCert::from_pem_first(b""),
            Err(CertError::Pem(_))
        ));
    }

    #[test]
    fn serial_bytes_drop_leading_zeros() {
        assert_eq!(serial_bytes(&[0, 0x8f]), [0x8f]);
        assert_eq!(serial_bytes(&[0x01, 0]), [0x01, 0]);
        assert!(serial_bytes(&[0]).is_empty());
        assert_eq!(hex(&[0xab, 0x01]), "ab01");
    }
}
