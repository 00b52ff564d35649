//! The X509-SVID the clients hold: one type for a certificate the server issued
//! ([`SvidCertificate`]) and one for such a certificate together with its private key
//! ([`X509Svid`]). Their fields are private and their constructors check what the SPIFFE
//! X509-SVID standard and Signet require, so a value of either type is always one that may be
//! delivered:
//!
//! - the chain is not empty and every element parses as an X.509 certificate;
//! - the leaf carries exactly one URI SAN and it is a SPIFFE ID (`spiffe://<td>/<path>`);
//! - the leaf is not a CA certificate, and its validity is not inverted;
//! - for an [`X509Svid`], the private key is the leaf's (same SubjectPublicKeyInfo).
//!
//! Whether the chain verifies against a trust bundle is the TLS stack's and the caller's to
//! check (the agent verifies against its bundle before it serves); these types check the
//! certificate's own shape. `Debug` never prints the key.

use std::fmt;
use std::time::SystemTime;

use signet_types::SpiffeId;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::cert::{CertError, ParsedCert};
use crate::fingerprint;
use crate::key::PrivateKey;

/// Why a chain or a key is not an X509-SVID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SvidError {
    #[error("the certificate chain is empty")]
    Empty,
    #[error("certificate {index} of the chain does not parse: {reason}")]
    Malformed { index: usize, reason: String },
    #[error("the leaf certificate is not an X509-SVID: {0}")]
    NotAnSvid(String),
    #[error("the private key does not match the leaf certificate")]
    KeyMismatch,
    #[error("the private key is not valid: {0}")]
    Key(String),
    /// The chain does not lead to the given roots ([`SvidCertificate::verify_to`]).
    #[error("the chain does not verify against the trust bundle: {0}")]
    Untrusted(String),
}

/// An issued X509-SVID certificate chain (leaf first; intermediates may follow), with the
/// leaf's facts read once.
#[derive(Clone, PartialEq, Eq)]
pub struct SvidCertificate {
    spiffe_id: SpiffeId,
    chain_der: Vec<Vec<u8>>,
    serial_hex: String,
    not_before: SystemTime,
    not_after: SystemTime,
    spki_der: Vec<u8>,
}

impl fmt::Debug for SvidCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SvidCertificate")
            .field("spiffe_id", &self.spiffe_id)
            .field("serial", &self.serial_hex)
            .field("chain_len", &self.chain_der.len())
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish()
    }
}

impl SvidCertificate {
    /// Checks `chain_der` (leaf first) as described in the module documentation.
    pub fn from_chain_der(chain_der: Vec<Vec<u8>>) -> Result<Self, SvidError> {
        let leaf_der = chain_der.first().ok_or(SvidError::Empty)?;
        for (index, der) in chain_der.iter().enumerate().skip(1) {
            X509Certificate::from_der(der).map_err(|e| SvidError::Malformed {
                index,
                reason: e.to_string(),
            })?;
        }
        let leaf = ParsedCert::from_der(leaf_der).map_err(|e| match e {
            CertError::Malformed(reason) => SvidError::Malformed { index: 0, reason },
            CertError::TrailingBytes(_) => SvidError::Malformed {
                index: 0,
                reason: "trailing bytes after the certificate".into(),
            },
            other => SvidError::NotAnSvid(other.to_string()),
        })?;
        let not_an_svid = |s: &str| SvidError::NotAnSvid(s.to_owned());
        if leaf.is_ca() {
            return Err(not_an_svid("it is a CA certificate"));
        }
        let spiffe_id = leaf
            .spiffe_id()
            .map_err(|e| SvidError::NotAnSvid(e.to_string()))?;
        if leaf.validity_inverted() {
            return Err(not_an_svid("its validity ends before it starts"));
        }
        Ok(Self {
            spiffe_id,
            serial_hex: leaf.serial_hex().to_owned(),
            not_before: leaf.not_before(),
            not_after: leaf.not_after(),
            spki_der: leaf.spki_der().to_vec(),
            chain_der,
        })
    }

    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }
    /// DER certificates, leaf first.
    pub fn chain_der(&self) -> &[Vec<u8>] {
        &self.chain_der
    }
    pub fn leaf_der(&self) -> &[u8] {
        &self.chain_der[0]
    }
    /// The leaf's serial number, lowercase hex without the DER integer's leading zero byte
    /// ([`signet_types::serial_hex`]: as the server, the ledger and the CLI spell it).
    pub fn serial_hex(&self) -> &str {
        &self.serial_hex
    }
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }
    /// SHA-256 of the leaf's DER, lowercase hex ([`fingerprint::sha256_hex`]).
    pub fn fingerprint(&self) -> String {
        fingerprint::sha256_hex(self.leaf_der())
    }
    /// The chain as PEM, leaf first, LF line endings.
    pub fn chain_pem(&self) -> String {
        signet_types::pem::certs_to_pem(self.chain_der.iter().map(Vec::as_slice))
    }
    pub fn into_chain_der(self) -> Vec<Vec<u8>> {
        self.chain_der
    }

    /// Checks that the chain leads to one of `roots_der` (DER): each certificate's issuer is
    /// the next one's subject and its signature verifies with that one's key, every issuer is
    /// a CA certificate, and the last one is a root of `roots_der` or is signed by one.
    /// Names, CA flags and signatures only: validity periods, name constraints and revocation
    /// are the caller's to check (the agent checks the expiry of what it serves itself).
    pub fn verify_to(&self, roots_der: &[Vec<u8>]) -> Result<(), SvidError> {
        let untrusted = |s: String| SvidError::Untrusted(s);
        let parse = |der: &'_ [u8]| -> Result<(), SvidError> {
            X509Certificate::from_der(der)
                .map(|_| ())
                .map_err(|e| untrusted(format!("a certificate does not parse: {e}")))
        };
        let signed_by = |child: &X509Certificate<'_>, parent: &X509Certificate<'_>| {
            parent.is_ca()
                && child.issuer().as_raw() == parent.subject().as_raw()
                && child.verify_signature(Some(parent.public_key())).is_ok()
        };
        for der in roots_der {
            parse(der)?;
        }
        let mut certs = Vec::with_capacity(self.chain_der.len());
        for der in &self.chain_der {
            let (_, c) = X509Certificate::from_der(der)
                .map_err(|e| untrusted(format!("a certificate does not parse: {e}")))?;
            certs.push(c);
        }
        for (index, pair) in certs.windows(2).enumerate() {
            if !signed_by(&pair[0], &pair[1]) {
                return Err(untrusted(format!(
                    "certificate {index} of the chain is not signed by certificate {}",
                    index + 1
                )));
            }
        }
        let (last_index, last) = match certs.len() {
            0 => return Err(SvidError::Empty),
            n => (n - 1, &certs[n - 1]),
        };
        if last_index > 0 && roots_der.contains(&self.chain_der[last_index]) {
            return Ok(());
        }
        let anchored = roots_der.iter().any(|der| {
            X509Certificate::from_der(der).is_ok_and(|(_, root)| signed_by(last, &root))
        });
        if anchored {
            Ok(())
        } else {
            Err(untrusted(format!(
                "certificate {last_index} of the chain is signed by none of the {} roots",
                roots_der.len()
            )))
        }
    }

    /// The same certificate with every certificate after the leaf that `certs` holds removed
    /// (the agent serves the chain without the roots: they are the bundle). The leaf stays,
    /// so the checks of [`Self::from_chain_der`] still hold.
    pub fn without(mut self, certs: &[Vec<u8>]) -> Self {
        let mut index = 0;
        self.chain_der.retain(|der| {
            index += 1;
            index == 1 || !certs.contains(der)
        });
        self
    }
}

/// An X509-SVID and its private key: a [`SvidCertificate`] whose leaf the key matches.
#[derive(Clone, PartialEq, Eq)]
pub struct X509Svid {
    certificate: SvidCertificate,
    key: PrivateKey,
}

impl fmt::Debug for X509Svid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("X509Svid")
            .field("certificate", &self.certificate)
            .field("key", &"…")
            .finish()
    }
}

impl X509Svid {
    /// Pairs `certificate` with `key`, refusing a key that is not the leaf's.
    pub fn new(certificate: SvidCertificate, key: PrivateKey) -> Result<Self, SvidError> {
        let spki = key
            .public_key_der()
            .map_err(|e| SvidError::Key(e.to_string()))?;
        if spki != certificate.spki_der {
            return Err(SvidError::KeyMismatch);
        }
        Ok(Self { certificate, key })
    }

    /// [`SvidCertificate::from_chain_der`] and [`PrivateKey::from_pkcs8_der`] then [`Self::new`].
    pub fn from_der(chain_der: Vec<Vec<u8>>, key_pkcs8_der: &[u8]) -> Result<Self, SvidError> {
        let certificate = SvidCertificate::from_chain_der(chain_der)?;
        let key =
            PrivateKey::from_pkcs8_der(key_pkcs8_der).map_err(|e| SvidError::Key(e.to_string()))?;
        Self::new(certificate, key)
    }

    pub fn certificate(&self) -> &SvidCertificate {
        &self.certificate
    }
    pub fn key(&self) -> &PrivateKey {
        &self.key
    }
    pub fn spiffe_id(&self) -> &SpiffeId {
        self.certificate.spiffe_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{KeyAlgorithm, generate};

    /// A certificate for `key` with `uris` as URI SANs, self-signed (its shape is what counts).
    fn cert(key: &PrivateKey, uris: &[&str], ca: bool) -> Vec<u8> {
        let mut p = rcgen::CertificateParams::default();
        p.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI((*u).try_into().unwrap()))
            .collect();
        if ca {
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        p.self_signed(&key.key_pair().unwrap())
            .unwrap()
            .der()
            .to_vec()
    }

    #[test]
    fn a_workload_certificate_and_its_key_make_an_svid() {
        let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
        let der = cert(&key, &["spiffe://example.org/ns/a/sa/web"], false);
        let svid = X509Svid::from_der(vec![der.clone()], key.pkcs8_der()).unwrap();
        assert_eq!(
            svid.spiffe_id().to_string(),
            "spiffe://example.org/ns/a/sa/web"
        );
        assert_eq!(svid.certificate().leaf_der(), der.as_slice());
        assert_eq!(svid.certificate().fingerprint().len(), 64);
        assert!(svid.certificate().not_before() <= svid.certificate().not_after());
        assert!(!svid.certificate().serial_hex().contains(':'));
        assert!(
            svid.certificate()
                .chain_pem()
                .starts_with("-----BEGIN CERTIFICATE-----\n")
        );
        // Debug never shows the key.
        let shown = format!("{svid:?}");
        assert!(
            !shown.contains(&format!("{:?}", key.pkcs8_der())),
            "{shown}"
        );
    }

    #[test]
    fn without_removes_the_given_certificates_after_the_leaf_only() {
        let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
        let leaf = cert(&key, &["spiffe://example.org/w"], false);
        let ca = cert(&key, &[], true);
        let other = cert(&generate(KeyAlgorithm::EcdsaP256).unwrap(), &[], true);
        let c =
            SvidCertificate::from_chain_der(vec![leaf.clone(), other.clone(), ca.clone()]).unwrap();
        let stripped = c.clone().without(std::slice::from_ref(&ca));
        assert_eq!(stripped.chain_der(), [leaf.clone(), other.clone()]);
        assert_eq!(stripped.spiffe_id(), c.spiffe_id());
        // The leaf is never removed, even when `certs` holds it.
        let kept = c.without(&[leaf.clone(), other, ca]);
        assert_eq!(kept.chain_der(), [leaf]);
    }

    #[test]
    fn the_serial_is_spelled_as_the_server_spells_it() {
        let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
        let mut p = rcgen::CertificateParams::default();
        p.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://example.org/w".try_into().unwrap(),
        )];
        // A high first bit: DER adds a leading zero byte, which the spelling drops.
        p.serial_number = Some(rcgen::SerialNumber::from_slice(&[0x8f, 0x01]));
        let der = p
            .self_signed(&key.key_pair().unwrap())
            .unwrap()
            .der()
            .to_vec();
        let svid = SvidCertificate::from_chain_der(vec![der]).unwrap();
        assert_eq!(svid.serial_hex(), "8f01");
    }

    /// A CA (self-signed, or signed by `parent`) and its key.
    fn ca(
        name: &str,
        parent: Option<&(rcgen::Issuer<'static, rcgen::KeyPair>, Vec<u8>)>,
    ) -> (rcgen::Issuer<'static, rcgen::KeyPair>, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let der = match parent {
            None => p.self_signed(&key).unwrap(),
            Some((issuer, _)) => p.signed_by(&key, issuer).unwrap(),
        }
        .der()
        .to_vec();
        (rcgen::Issuer::new(p, key), der)
    }

    fn leaf_of(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::default();
        p.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://example.org/w".try_into().unwrap(),
        )];
        p.signed_by(&key, issuer).unwrap().der().to_vec()
    }

    #[test]
    fn a_chain_verifies_to_its_roots_only() {
        let root = ca("root", None);
        let mid = ca("mid", Some(&root));
        let other = ca("other", None);
        let direct = SvidCertificate::from_chain_der(vec![leaf_of(&root.0)]).unwrap();
        assert_eq!(direct.verify_to(std::slice::from_ref(&root.1)), Ok(()));
        let via = SvidCertificate::from_chain_der(vec![leaf_of(&mid.0), mid.1.clone()]).unwrap();
        assert_eq!(via.verify_to(&[other.1.clone(), root.1.clone()]), Ok(()));
        // The root itself at the end of the chain.
        let full =
            SvidCertificate::from_chain_der(vec![leaf_of(&mid.0), mid.1.clone(), root.1.clone()])
                .unwrap();
        assert_eq!(full.verify_to(std::slice::from_ref(&root.1)), Ok(()));
        // Another trust bundle, none, or a chain whose links do not hold.
        for (c, roots) in [
            (&direct, vec![other.1.clone()]),
            (&via, vec![]),
            (&full, vec![other.1.clone()]),
        ] {
            assert!(
                matches!(c.verify_to(&roots), Err(SvidError::Untrusted(_))),
                "{c:?}"
            );
        }
        let broken =
            SvidCertificate::from_chain_der(vec![leaf_of(&other.0), mid.1.clone()]).unwrap();
        match broken.verify_to(std::slice::from_ref(&root.1)) {
            Err(SvidError::Untrusted(why)) => assert!(why.contains("certificate 0"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn another_key_is_refused() {
        let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
        let other = generate(KeyAlgorithm::EcdsaP256).unwrap();
        let der = cert(&key, &["spiffe://example.org/w"], false);
        assert_eq!(
            X509Svid::from_der(vec![der], other.pkcs8_der()),
            Err(SvidError::KeyMismatch)
        );
    }

    #[test]
    fn what_is_not_an_x509_svid_is_refused() {
        let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
        let refused = |chain: Vec<Vec<u8>>| SvidCertificate::from_chain_der(chain).unwrap_err();
        assert_eq!(refused(vec![]), SvidError::Empty);
        assert!(matches!(
            refused(vec![b"garbage".to_vec()]),
            SvidError::Malformed { index: 0, .. }
        ));
        let good = cert(&key, &["spiffe://example.org/w"], false);
        assert!(matches!(
            refused(vec![good.clone(), b"garbage".to_vec()]),
            SvidError::Malformed { index: 1, .. }
        ));
        let mut trailing = good;
        trailing.push(0);
        assert!(matches!(
            refused(vec![trailing]),
            SvidError::Malformed { .. }
        ));
        for (uris, ca) in [
            (&[][..], false),
            (
                &["spiffe://example.org/a", "spiffe://example.org/b"][..],
                false,
            ),
            (&["https://example.org/a"][..], false),
            (&["spiffe://example.org/a"][..], true),
        ] {
            let e = refused(vec![cert(&key, uris, ca)]);
            assert!(
                matches!(e, SvidError::NotAnSvid(_)),
                "{uris:?} ca={ca}: {e:?}"
            );
        }
    }
}
