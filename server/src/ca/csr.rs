//! PKCS#10 certificate signing requests: parse, check the key, verify the self-signature.
//!
//! A [`VerifiedCsr`] exists only if its signature verified and its key is one Signet signs.
//! What the CSR *asks for* ([`RequestedNames`]) is kept for comparison with the grant; it never
//! decides what goes into a certificate.

use std::fmt;
use std::net::IpAddr;

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::error::X509Error;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_DSA, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_NIST_EC_P521,
    OID_PKCS1_RSAENCRYPTION, OID_PKCS1_RSASSAPSS, OID_SIG_ED448, OID_SIG_ED25519,
};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use signet_types::untrusted::shown;

use super::RequestedNames;

/// Largest CSR accepted, PEM or DER.
pub const MAX_CSR_BYTES: usize = 64 * 1024;

/// Smallest and largest RSA modulus Signet certifies.
const RSA_MIN_BITS: usize = 2048;
const RSA_MAX_BITS: usize = 8192;

/// The kind of public key a CSR carries: signet-pki's (the same four kinds, and the one
/// spelling, `ECDSA P-256` … `RSA-2048`, that clients print).
pub use signet_pki::KeyAlgorithm;

/// Why a CSR was refused. Every message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
/// Every text a CSR put in these messages is cut and escaped ([`shown`]): a hostile request's
/// OIDs and PEM labels can be tens of kilobytes.
pub enum CsrError {
    #[error("CSR is {size} bytes; the limit is {max} bytes ({} KiB): send a single PKCS#10 request", max / 1024)]
    TooLarge { size: usize, max: usize },
    #[error("not a PKCS#10 certificate signing request: {}", shown(.0))]
    Malformed(String),
    #[error(
        "CSR signature does not verify: the CSR was altered or signed with another key than the one it carries"
    )]
    BadSignature,
    #[error(
        "CSR is signed with an unsupported signature algorithm ({}); sign it with ECDSA (SHA-256/384), Ed25519 or RSA PKCS#1 v1.5 / PSS with SHA-256 or stronger",
        shown(.0)
    )]
    UnsupportedSignature(String),
    #[error("CSR key is too weak ({}); use an RSA key of at least 2048 bits, or ECDSA P-256", shown(.0))]
    WeakKey(String),
    #[error(
        "CSR key type is not supported ({}); use ECDSA P-256 or P-384, Ed25519, or RSA 2048..8192 bits",
        shown(.0)
    )]
    UnsupportedKey(String),
    #[error(
        "CSR asks for a CA certificate (basicConstraints cA=true); Signet issues only leaf certificates, remove that extension"
    )]
    RequestsCa,
}

/// A CSR whose self-signature verified and whose key Signet accepts.
#[derive(Clone)]
pub struct VerifiedCsr {
    spki_der: Vec<u8>,
    rcgen_spki: rcgen::SubjectPublicKeyInfo,
    key_algorithm: KeyAlgorithm,
    requested: RequestedNames,
}

impl fmt::Debug for VerifiedCsr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedCsr")
            .field("key_algorithm", &self.key_algorithm)
            .field("requested", &self.requested)
            .finish_non_exhaustive()
    }
}

impl VerifiedCsr {
    /// Parses and verifies a CSR given as PEM (`CERTIFICATE REQUEST` or
    /// `NEW CERTIFICATE REQUEST`) or raw DER.
    pub fn parse(input: &[u8]) -> Result<VerifiedCsr, CsrError> {
        if input.len() > MAX_CSR_BYTES {
            return Err(CsrError::TooLarge {
                size: input.len(),
                max: MAX_CSR_BYTES,
            });
        }
        let der = to_der(input)?;
        let (rest, csr) = X509CertificationRequest::from_der(&der)
            .map_err(|e| CsrError::Malformed(format!("cannot parse the DER structure ({e})")))?;
        if !rest.is_empty() {
            return Err(CsrError::Malformed(format!(
                "{} unexpected bytes after the request",
                rest.len()
            )));
        }
        let info = &csr.certification_request_info;
        if info.version.0 != 0 {
            return Err(CsrError::Malformed(format!(
                "unknown PKCS#10 version {}",
                info.version.0
            )));
        }
        // The key first: a weak RSA key would also fail ring's signature check, and the
        // caller should hear the real reason.
        let key_algorithm = classify_key(&info.subject_pki)?;
        match csr.verify_signature() {
            Ok(()) => {}
            Err(X509Error::SignatureUnsupportedAlgorithm) => {
                return Err(CsrError::UnsupportedSignature(
                    csr.signature_algorithm.algorithm.to_id_string(),
                ));
            }
            Err(_) => return Err(CsrError::BadSignature),
        }
        let rcgen_spki = rcgen::SubjectPublicKeyInfo::from_der(info.subject_pki.raw)
            .map_err(|e| CsrError::UnsupportedKey(format!("{key_algorithm} key encoding: {e}")))?;

        let mut requested = RequestedNames::default();
        if let Some(exts) = csr.requested_extensions() {
            for ext in exts {
                match ext {
                    ParsedExtension::BasicConstraints(bc) if bc.ca => {
                        return Err(CsrError::RequestsCa);
                    }
                    ParsedExtension::SubjectAlternativeName(san) => {
                        for name in &san.general_names {
                            add_name(&mut requested, name);
                        }
                    }
                    ParsedExtension::ParseError { error } => {
                        return Err(CsrError::Malformed(format!(
                            "a requested extension cannot be parsed ({error})"
                        )));
                    }
                    _ => {}
                }
            }
        }
        Ok(VerifiedCsr {
            spki_der: info.subject_pki.raw.to_vec(),
            rcgen_spki,
            key_algorithm,
            requested,
        })
    }

    /// The CSR's SubjectPublicKeyInfo, DER.
    pub fn public_key_der(&self) -> &[u8] {
        &self.spki_der
    }

    /// The CSR's key type.
    pub fn key_algorithm(&self) -> KeyAlgorithm {
        self.key_algorithm
    }

    /// What the CSR's subjectAltName extension request asks for.
    pub fn requested(&self) -> &RequestedNames {
        &self.requested
    }

    /// The public key in the form rcgen signs.
    pub(crate) fn rcgen_public_key(&self) -> &rcgen::SubjectPublicKeyInfo {
        &self.rcgen_spki
    }
}

fn to_der(input: &[u8]) -> Result<Vec<u8>, CsrError> {
    let trimmed = trim_ascii_start(input);
    // PEM, possibly after explanatory text (as `openssl req -text` writes it); DER starts
    // with a SEQUENCE tag and never contains this marker in practice.
    let is_pem = trimmed.starts_with(b"-----BEGIN")
        || (input.first() != Some(&0x30) && input.windows(10).any(|w| w == b"-----BEGIN"));
    if !is_pem {
        if input.is_empty() {
            return Err(CsrError::Malformed("the input is empty".into()));
        }
        return Ok(input.to_vec());
    }
    let block =
        pem::parse(trimmed).map_err(|e| CsrError::Malformed(format!("invalid PEM ({e})")))?;
    match block.tag() {
        "CERTIFICATE REQUEST" | "NEW CERTIFICATE REQUEST" => Ok(block.into_contents()),
        other => Err(CsrError::Malformed(format!(
            "expected a PEM block labelled CERTIFICATE REQUEST, found {other:?}"
        ))),
    }
}

fn trim_ascii_start(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// Number of significant bits in a big-endian unsigned integer.
pub(crate) fn bit_len(bytes: &[u8]) -> usize {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    match bytes.get(start) {
        Some(first) => (bytes.len() - start) * 8 - first.leading_zeros() as usize,
        None => 0,
    }
}

fn classify_key(spki: &SubjectPublicKeyInfo<'_>) -> Result<KeyAlgorithm, CsrError> {
    let alg = &spki.algorithm.algorithm;
    let key = &spki.subject_public_key.data;
    if *alg == OID_PKCS1_RSAENCRYPTION {
        let Ok(x509_parser::public_key::PublicKey::RSA(rsa)) = spki.parsed() else {
            return Err(CsrError::Malformed(
                "the RSA public key cannot be parsed".into(),
            ));
        };
        let bits = bit_len(rsa.modulus);
        if bits < RSA_MIN_BITS {
            return Err(CsrError::WeakKey(format!("RSA-{bits}")));
        }
        if bits > RSA_MAX_BITS {
            return Err(CsrError::UnsupportedKey(format!(
                "RSA-{bits}, larger than {RSA_MAX_BITS} bits"
            )));
        }
        // At most RSA_MAX_BITS, so it fits.
        let bits =
            u32::try_from(bits).map_err(|_| CsrError::UnsupportedKey(format!("RSA-{bits}")))?;
        return Ok(KeyAlgorithm::Rsa(bits));
    }
    if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        let (kind, point_len) = match curve {
            Some(c) if c == OID_EC_P256 => (KeyAlgorithm::EcdsaP256, 65),
            Some(c) if c == OID_NIST_EC_P384 => (KeyAlgorithm::EcdsaP384, 97),
            Some(c) if c == OID_NIST_EC_P521 => {
                return Err(CsrError::UnsupportedKey("ECDSA P-521".into()));
            }
            Some(c) => {
                return Err(CsrError::UnsupportedKey(format!(
                    "ECDSA on curve {}",
                    c.to_id_string()
                )));
            }
            None => {
                return Err(CsrError::UnsupportedKey(
                    "ECDSA without a named curve".into(),
                ));
            }
        };
        if key.len() != point_len || key.first() != Some(&0x04) {
            return Err(CsrError::UnsupportedKey(format!(
                "{kind} public key that is not an uncompressed point"
            )));
        }
        return Ok(kind);
    }
    if *alg == OID_SIG_ED25519 {
        if key.len() != 32 {
            return Err(CsrError::Malformed(format!(
                "an Ed25519 public key is 32 bytes, this one is {}",
                key.len()
            )));
        }
        return Ok(KeyAlgorithm::Ed25519);
    }
    let name = if *alg == OID_KEY_TYPE_DSA {
        "DSA".to_owned()
    } else if *alg == OID_PKCS1_RSASSAPSS {
        "RSASSA-PSS-only RSA key (id-RSASSA-PSS)".to_owned()
    } else if *alg == OID_SIG_ED448 {
        "Ed448".to_owned()
    } else {
        format!("public key algorithm {}", alg.to_id_string())
    };
    Err(CsrError::UnsupportedKey(name))
}

fn add_name(requested: &mut RequestedNames, name: &GeneralName<'_>) {
    match name {
        GeneralName::URI(u) => requested.uris.push((*u).to_owned()),
        GeneralName::DNSName(d) => requested.dns_names.push((*d).to_owned()),
        GeneralName::RFC822Name(e) => requested.emails.push((*e).to_owned()),
        GeneralName::IPAddress(bytes) => match ip_from_bytes(bytes) {
            Some(ip) => requested.ip_addresses.push(ip),
            None => requested
                .other
                .push(format!("iPAddress of {} bytes", bytes.len())),
        },
        GeneralName::OtherName(oid, _) => requested
            .other
            .push(format!("otherName {}", oid.to_id_string())),
        GeneralName::X400Address(_) => requested.other.push("x400Address".into()),
        GeneralName::DirectoryName(_) => requested.other.push("directoryName".into()),
        GeneralName::EDIPartyName(_) => requested.other.push("ediPartyName".into()),
        GeneralName::RegisteredID(oid) => requested
            .other
            .push(format!("registeredID {}", oid.to_id_string())),
        GeneralName::Invalid(tag, _) => requested
            .other
            .push(format!("unparseable name (tag {})", tag.0)),
    }
}

pub(crate) fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {

    /// A hostile CSR's OIDs and labels reach the caller cut to a few hundred bytes.
    #[test]
    fn refusals_carry_a_bounded_echo() {
        let huge = "1.2.840.".repeat(3000);
        for e in [
            CsrError::UnsupportedKey(format!("public key algorithm {huge}")),
            CsrError::UnsupportedSignature(huge.clone()),
            CsrError::WeakKey(huge.clone()),
            CsrError::Malformed(format!("found {huge:?}")),
        ] {
            let msg = e.to_string();
            assert!(msg.len() < 600, "{} bytes: {}", msg.len(), &msg[..80]);
            assert!(msg.contains('…'), "{msg}");
        }
    }

    use super::*;
    use rcgen::{CertificateParams, IsCa, KeyPair, SanType};
    use std::process::Command;

    pub(crate) fn csr_with(key: &impl rcgen::SigningKey, sans: Vec<SanType>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.subject_alt_names = sans;
        params
            .serialize_request(key)
            .expect("serialize CSR")
            .der()
            .to_vec()
    }

    fn uri(s: &str) -> SanType {
        SanType::URI(s.try_into().expect("ia5"))
    }

    fn openssl_csr(args: &[&str]) -> Vec<u8> {
        let out = Command::new("openssl")
            .args([
                "req",
                "-new",
                "-nodes",
                "-keyout",
                "/dev/null",
                "-subj",
                "/CN=x",
            ])
            .args(args)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    #[test]
    fn parses_der_and_pem_with_names() {
        let key = KeyPair::generate().expect("key");
        let der = csr_with(
            &key,
            vec![
                uri("spiffe://example.org/a"),
                SanType::DnsName("a.example.org".try_into().expect("ia5")),
                SanType::IpAddress("10.0.0.1".parse().expect("ip")),
                SanType::Rfc822Name("a@example.org".try_into().expect("ia5")),
            ],
        );
        let csr = VerifiedCsr::parse(&der).expect("DER parses");
        assert_eq!(csr.key_algorithm(), KeyAlgorithm::EcdsaP256);
        assert_eq!(csr.key_algorithm().to_string(), "ECDSA P-256");
        assert_eq!(
            csr.public_key_der(),
            rcgen::PublicKeyData::subject_public_key_info(&key)
        );
        let r = csr.requested();
        assert_eq!(r.uris, vec!["spiffe://example.org/a".to_owned()]);
        assert_eq!(r.dns_names, vec!["a.example.org".to_owned()]);
        assert_eq!(
            r.ip_addresses,
            vec!["10.0.0.1".parse::<IpAddr>().expect("ip")]
        );
        assert_eq!(r.emails, vec!["a@example.org".to_owned()]);
        assert!(r.other.is_empty());

        let pem = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der.clone()));
        assert_eq!(
            VerifiedCsr::parse(pem.as_bytes()).expect("PEM").requested(),
            r
        );
        let pem = pem::encode(&pem::Pem::new("NEW CERTIFICATE REQUEST", der.clone()));
        assert!(VerifiedCsr::parse(format!("\n  {pem}").as_bytes()).is_ok());
        let pem = pem::encode(&pem::Pem::new("CERTIFICATE", der));
        assert!(matches!(
            VerifiedCsr::parse(pem.as_bytes()),
            Err(CsrError::Malformed(_))
        ));
    }

    #[test]
    fn other_key_types() {
        let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("key");
        let csr = VerifiedCsr::parse(&csr_with(&p384, vec![])).expect("P-384");
        assert_eq!(csr.key_algorithm(), KeyAlgorithm::EcdsaP384);
        let ed = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        let csr = VerifiedCsr::parse(&csr_with(&ed, vec![])).expect("Ed25519");
        assert_eq!(csr.key_algorithm(), KeyAlgorithm::Ed25519);
        let rsa = VerifiedCsr::parse(&openssl_csr(&["-newkey", "rsa:2048"])).expect("RSA-2048");
        assert_eq!(rsa.key_algorithm(), KeyAlgorithm::Rsa(2048));
        assert_eq!(rsa.key_algorithm().to_string(), "RSA-2048");
    }

    #[test]
    fn weak_and_unsupported_keys() {
        let err = VerifiedCsr::parse(&openssl_csr(&["-newkey", "rsa:1024"])).expect_err("weak");
        assert_eq!(err, CsrError::WeakKey("RSA-1024".into()));
        assert!(err.to_string().contains("at least 2048"));
        let err = VerifiedCsr::parse(&openssl_csr(&[
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:secp521r1",
        ]))
        .expect_err("P-521");
        assert_eq!(err, CsrError::UnsupportedKey("ECDSA P-521".into()));
        let err = VerifiedCsr::parse(&openssl_csr(&["-newkey", "ed448"])).expect_err("Ed448");
        assert_eq!(err, CsrError::UnsupportedKey("Ed448".into()));
    }

    #[test]
    fn requests_ca() {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let der = params.serialize_request(&key).expect("csr").der().to_vec();
        assert_eq!(
            VerifiedCsr::parse(&der).expect_err("CA"),
            CsrError::RequestsCa
        );
        let der = openssl_csr(&[
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ]);
        assert_eq!(
            VerifiedCsr::parse(&der).expect_err("CA"),
            CsrError::RequestsCa
        );
    }

    #[test]
    fn flipped_signature_and_body() {
        let key = KeyPair::generate().expect("key");
        let der = csr_with(&key, vec![uri("spiffe://example.org/a")]);
        // The last bytes are the signature's s value.
        let mut bad = der.clone();
        let n = bad.len();
        bad[n - 3] ^= 0x55;
        assert_eq!(
            VerifiedCsr::parse(&bad).expect_err("sig"),
            CsrError::BadSignature
        );
        // Altering the URI inside the signed body is also caught.
        let pos = der
            .windows(7)
            .position(|w| w == b"example")
            .expect("name present");
        let mut bad = der;
        bad[pos] = b'E';
        assert_eq!(
            VerifiedCsr::parse(&bad).expect_err("body"),
            CsrError::BadSignature
        );
    }

    #[test]
    fn too_large_empty_and_garbage() {
        let big = vec![b'A'; 65 * 1024];
        assert_eq!(
            VerifiedCsr::parse(&big).expect_err("big"),
            CsrError::TooLarge {
                size: 65 * 1024,
                max: MAX_CSR_BYTES
            }
        );
        assert!(matches!(
            VerifiedCsr::parse(b""),
            Err(CsrError::Malformed(_))
        ));
        assert!(matches!(
            VerifiedCsr::parse(b"hello world"),
            Err(CsrError::Malformed(_))
        ));
        assert!(matches!(
            VerifiedCsr::parse(b"-----BEGIN CERTIFICATE REQUEST-----\n!!!\n"),
            Err(CsrError::Malformed(_))
        ));
    }

    #[test]
    fn fuzzish_truncated_and_garbled_inputs_never_panic() {
        let key = KeyPair::generate().expect("key");
        let der = csr_with(
            &key,
            vec![
                uri("spiffe://example.org/a"),
                SanType::DnsName("a.example.org".try_into().expect("ia5")),
            ],
        );
        let pem = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der.clone()));
        for len in 0..der.len() {
            assert!(
                VerifiedCsr::parse(&der[..len]).is_err(),
                "truncated at {len}"
            );
        }
        for len in 0..pem.len() {
            let _ = VerifiedCsr::parse(&pem.as_bytes()[..len]);
        }
        // Deterministic pseudo-random byte flips (xorshift), every position at least once.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for i in 0..der.len() {
            for _ in 0..4 {
                let mut bad = der.clone();
                bad[i] ^= (next() as u8) | 1;
                if let Ok(csr) = VerifiedCsr::parse(&bad) {
                    // Only a change that keeps the signed bytes intact may still verify.
                    assert_eq!(
                        csr.public_key_der(),
                        VerifiedCsr::parse(&der).expect("ok").public_key_der()
                    );
                }
            }
        }
        for _ in 0..2000 {
            let len = (next() % 300) as usize;
            let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = VerifiedCsr::parse(&junk);
            let mut seq = vec![0x30, 0x82, (len >> 8) as u8, len as u8];
            seq.extend_from_slice(&junk);
            let _ = VerifiedCsr::parse(&seq);
        }
        let mut pem_bad = pem.into_bytes();
        for i in (30..pem_bad.len() - 30).step_by(7) {
            pem_bad[i] = b'A' + (next() % 26) as u8;
            let _ = VerifiedCsr::parse(&pem_bad);
        }
    }

    #[test]
    fn bit_len_counts_significant_bits() {
        assert_eq!(bit_len(&[0x00, 0x80, 0x00]), 16);
        assert_eq!(bit_len(&[0x01]), 1);
        assert_eq!(bit_len(&[0x00]), 0);
        assert_eq!(bit_len(&[]), 0);
    }
}
