//! A signing CA: its key, its certificate and the chain up to a root.
//!
//! Either a root Signet generated itself ([`Authority::generate_root`]) or a CA plugged in by
//! the operator in Istio's `cacerts` layout ([`Authority::from_cacerts_pem`]). Construction
//! checks that the key belongs to the certificate, that the certificate may sign certificates
//! and that it chains (by signature) to one of the roots.

use std::fmt;
use std::time::{Duration, SystemTime};

use rcgen::{BasicConstraints, IsCa, Issuer, KeyPair, PublicKeyData, SerialNumber};
use rustls::pki_types::CertificateDer;
use signet_types::TrustDomain;
use x509_parser::certificate::X509Certificate;

use super::serial::SerialSource;
use super::template::ca_params;
use super::time::{floor_secs, to_offset};
use super::validate::{
    CertError, IssuerFacts, ca_basics, parse_cert, subject_key_id, to_system_time,
};
use super::{BACKDATE, KeyType};

const CONVERT_HINT: &str = "convert it to unencrypted PKCS#8 with `openssl pkcs8 -topk8 -nocrypt -in ca-key.pem -out ca-key.pkcs8.pem`";

/// Why a CA could not be generated or loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorityError {
    #[error("cannot generate the CA: {0}")]
    Generate(String),
    #[error("the CA certificate is not usable: {0}")]
    Certificate(String),
    #[error("the CA certificate cannot sign certificates: {0}")]
    NotACa(String),
    #[error("the CA private key cannot be used: {0}")]
    Key(String),
    #[error("the CA private key does not belong to the CA certificate (their public keys differ)")]
    KeyMismatch,
    #[error("the CA chain does not verify: {0}")]
    Chain(String),
    #[error("{file}: {reason}")]
    Pem { file: &'static str, reason: String },
}

/// A CA that signs X509-SVIDs. `Debug` never prints key material.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_der: Vec<u8>,
    intermediates: Vec<Vec<u8>>,
    roots: Vec<Vec<u8>>,
    /// The full chain: signing cert, intermediates, the anchoring root last.
    chain: Vec<Vec<u8>>,
    key_id: String,
    not_before: SystemTime,
    not_after: SystemTime,
    /// What the self-check of every leaf needs of `cert_der`, parsed once.
    issuer_facts: IssuerFacts,
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authority")
            .field("key_id", &self.key_id)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("intermediates", &self.intermediates.len())
            .field("roots", &self.roots.len())
            .field("key", &"[redacted]")
            .finish()
    }
}

/// A CA certificate's key ID: lowercase hex of its subject key identifier, or of the SHA-256
/// of its SubjectPublicKeyInfo if it has none (the value leaves carry as their AKI).
pub(crate) fn key_id_of(cert: &X509Certificate<'_>) -> String {
    match subject_key_id(cert) {
        Some(ski) => hex::encode(ski),
        None => hex::encode(signet_types::ledger::sha256(cert.public_key().raw)),
    }
}

/// [`key_id_of`] for DER.
pub fn key_id_of_der(der: &[u8]) -> Option<String> {
    parse_cert(der).ok().map(|c| key_id_of(&c))
}

fn algorithm(key_type: KeyType) -> &'static rcgen::SignatureAlgorithm {
    match key_type {
        KeyType::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
        KeyType::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
    }
}

/// Whether the certificate `child_der` names `parent_der`'s subject as its issuer and its
/// signature verifies with `parent_der`'s key (a root: both the same certificate).
pub(crate) fn verify_issued_by(child_der: &[u8], parent_der: &[u8]) -> Result<(), CertError> {
    let child = parse_cert(child_der)?;
    let parent = parse_cert(parent_der)?;
    ca_basics(&parent)?;
    child_of(&child, &parent)
}

/// Whether `der` (any certificate, CA or not) is signed by its own key and names itself as
/// its issuer.
pub(crate) fn verify_self_signed(der: &[u8]) -> Result<(), CertError> {
    let cert = parse_cert(der)?;
    child_of(&cert, &cert)
}

fn child_of(child: &X509Certificate<'_>, parent: &X509Certificate<'_>) -> Result<(), CertError> {
    if child.issuer().as_raw() != parent.subject().as_raw() {
        return Err(CertError::OtherIssuer {
            child: child.subject().to_string(),
            named: child.issuer().to_string(),
            parent: parent.subject().to_string(),
        });
    }
    child
        .verify_signature(Some(parent.public_key()))
        .map_err(|e| CertError::NotSignedBy {
            child: child.subject().to_string(),
            parent: parent.subject().to_string(),
            error: e.to_string(),
        })
}

impl Authority {
    /// Generates a self-signed root for `td`.
    ///
    /// Returns the authority and its private key as PKCS#8 DER, for the caller to persist
    /// (encrypted with the KEK, or in a 0600 file).
    pub fn generate_root(
        td: &TrustDomain,
        key_type: KeyType,
        now: SystemTime,
        ttl: Duration,
        serials: &dyn SerialSource,
    ) -> Result<(Authority, Vec<u8>), AuthorityError> {
        let key = KeyPair::generate_for(algorithm(key_type))
            .map_err(|e| AuthorityError::Generate(e.to_string()))?;

        let mut params =
            ca_params(td, "root", now).map_err(|e| AuthorityError::Generate(e.to_string()))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let not_before = now
            .checked_sub(BACKDATE)
            .and_then(to_offset)
            .ok_or_else(|| AuthorityError::Generate("the start time is out of range".into()))?;
        let not_after = now
            .checked_add(ttl)
            .and_then(to_offset)
            .ok_or_else(|| AuthorityError::Generate("the root lifetime is out of range".into()))?;
        if not_after <= not_before {
            return Err(AuthorityError::Generate("the root lifetime is zero".into()));
        }
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(SerialNumber::from_slice(&serials.next_serial(now)));
        let cert = params
            .self_signed(&key)
            .map_err(|e| AuthorityError::Generate(e.to_string()))?;
        let der = cert.der().to_vec();
        let pkcs8 = key.serialize_der();
        let authority = Authority::from_parts(der.clone(), &pkcs8, Vec::new(), vec![der])?;
        Ok((authority, pkcs8))
    }

    /// Generates a key and an intermediate CA certificate for it, signed by this authority (a
    /// root): `pathlen:0`, keyCertSign + cRLSign, the trust domain's SPIFFE ID, valid from
    /// `now` (backdated) for `ttl`, but never beyond this authority's own validity.
    ///
    /// Returns the intermediate (its chain: itself, then this authority's chain) and its
    /// private key as PKCS#8 DER, for the caller to seal.
    pub fn sign_intermediate(
        &self,
        td: &TrustDomain,
        key_type: KeyType,
        now: SystemTime,
        ttl: Duration,
        serials: &dyn SerialSource,
    ) -> Result<(Authority, Vec<u8>), AuthorityError> {
        let key = KeyPair::generate_for(algorithm(key_type))
            .map_err(|e| AuthorityError::Generate(e.to_string()))?;
        let mut params = ca_params(td, "intermediate", now)
            .map_err(|e| AuthorityError::Generate(e.to_string()))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.use_authority_key_identifier_extension = true;
        let out_of_range =
            || AuthorityError::Generate("the intermediate's validity is out of range".into());
        let not_before = now
            .checked_sub(BACKDATE)
            .map_or(self.not_before, |t| t.max(self.not_before));
        let not_after = now
            .checked_add(ttl)
            .map_or(self.not_after, |t| t.min(self.not_after));
        let not_before = floor_secs(not_before).ok_or_else(out_of_range)?;
        let not_after = floor_secs(not_after).ok_or_else(out_of_range)?;
        if not_after <= now {
            return Err(AuthorityError::Generate(format!(
                "the signing root {} expires before the intermediate could be used",
                self.key_id
            )));
        }
        params.not_before = to_offset(not_before).ok_or_else(out_of_range)?;
        params.not_after = to_offset(not_after).ok_or_else(out_of_range)?;
        params.serial_number = Some(SerialNumber::from_slice(&serials.next_serial(now)));
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| AuthorityError::Generate(e.to_string()))?;
        let pkcs8 = key.serialize_der();
        let mut intermediates = self.chain.clone();
        // The chain ends with the anchoring root, which goes in `roots`.
        intermediates.pop();
        let authority = Authority::from_parts(
            cert.der().to_vec(),
            &pkcs8,
            intermediates,
            self.roots.clone(),
        )?;
        Ok((authority, pkcs8))
    }

    /// Builds an authority from DER parts: the signing certificate, its PKCS#8 private key,
    /// the intermediates between it and a root (nearest first), and the trusted roots.
    pub fn from_parts(
        cert_der: Vec<u8>,
        key_pkcs8_der: &[u8],
        intermediates: Vec<Vec<u8>>,
        roots: Vec<Vec<u8>>,
    ) -> Result<Authority, AuthorityError> {
        let cert = parse_cert(&cert_der).map_err(|e| AuthorityError::Certificate(e.to_string()))?;
        ca_basics(&cert).map_err(|e| AuthorityError::NotACa(e.to_string()))?;
        for rdn in cert.subject().iter() {
            if rdn.iter().count() != 1 {
                return Err(AuthorityError::Certificate(
                    "the subject has a multi-valued or empty RDN, which Signet cannot copy as an issuer name".into(),
                ));
            }
        }

        let key = KeyPair::try_from(key_pkcs8_der).map_err(|e| {
            AuthorityError::Key(format!(
                "not an unencrypted PKCS#8 ECDSA P-256/P-384, Ed25519 or RSA key ({e}); {CONVERT_HINT}"
            ))
        })?;
        if key.der_bytes() != cert.public_key().subject_public_key.data.as_ref() {
            return Err(AuthorityError::KeyMismatch);
        }

        // The chain: cert <- intermediates[0] <- ... <- a root.
        if roots.is_empty() {
            return Err(AuthorityError::Chain("no root certificate given".into()));
        }
        let parsed_roots = roots
            .iter()
            .map(|r| parse_cert(r).map_err(|e| AuthorityError::Chain(format!("root: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let parsed_intermediates = intermediates
            .iter()
            .map(|c| parse_cert(c).map_err(|e| AuthorityError::Chain(format!("intermediate: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut path: Vec<&X509Certificate<'_>> = vec![&cert];
        path.extend(parsed_intermediates.iter());
        for pair in path.windows(2) {
            ca_basics(pair[1]).map_err(|e| {
                AuthorityError::Chain(format!("intermediate \"{}\": {e}", pair[1].subject()))
            })?;
            child_of(pair[0], pair[1]).map_err(|e| AuthorityError::Chain(e.to_string()))?;
        }
        let mut chain: Vec<Vec<u8>> = Vec::with_capacity(path.len() + 1);
        chain.push(cert_der.clone());
        chain.extend(intermediates.iter().cloned());
        let last = chain
            .last()
            .expect("the chain starts with the signing cert");
        if !roots.contains(last) {
            let last_parsed = path.last().expect("the path starts with the signing cert");
            let mut reasons = Vec::new();
            let anchor = parsed_roots
                .iter()
                .position(|root| match child_of(last_parsed, root) {
                    Ok(()) => true,
                    Err(e) => {
                        reasons.push(e.to_string());
                        false
                    }
                });
            match anchor {
                Some(i) => chain.push(roots[i].clone()),
                None => {
                    return Err(AuthorityError::Chain(format!(
                        "no root signed \"{}\": {}",
                        last_parsed.subject(),
                        reasons.join("; ")
                    )));
                }
            }
        }
        // Never repeat a certificate.
        let mut seen: Vec<&Vec<u8>> = Vec::new();
        if chain.iter().any(|c| {
            let dup = seen.contains(&c);
            seen.push(c);
            dup
        }) {
            return Err(AuthorityError::Chain(
                "the same certificate appears twice in the chain".into(),
            ));
        }

        let key_id = key_id_of(&cert);
        let issuer_facts = IssuerFacts::of(&cert);
        let not_before = to_system_time(&cert.validity().not_before);
        let not_after = to_system_time(&cert.validity().not_after);
        let issuer = Issuer::from_ca_cert_der(&CertificateDer::from(cert_der.as_slice()), key)
            .map_err(|e| AuthorityError::Certificate(format!("cannot use it as an issuer: {e}")))?;
        Ok(Authority {
            issuer,
            cert_der,
            intermediates,
            roots,
            chain,
            key_id,
            not_before,
            not_after,
            issuer_facts,
        })
    }

    /// Loads Istio's plugged-in `cacerts` files: `ca-cert.pem` (the signing cert), `ca-key.pem`
    /// (PKCS#8, SEC1 or PKCS#1), `cert-chain.pem` (signing cert, intermediates, usually the
    /// root; may be empty) and `root-cert.pem` (one or more roots).
    pub fn from_cacerts_pem(
        cert_pem: &[u8],
        key_pem: &[u8],
        chain_pem: &[u8],
        root_pem: &[u8],
    ) -> Result<Authority, AuthorityError> {
        let pem_err = |file: &'static str| {
            move |e: signet_types::pem::PemError| AuthorityError::Pem {
                file,
                reason: e.to_string(),
            }
        };
        let certs = signet_types::pem::parse_certs(cert_pem).map_err(pem_err("ca-cert.pem"))?;
        let [cert] = <[Vec<u8>; 1]>::try_from(certs).map_err(|v| AuthorityError::Pem {
            file: "ca-cert.pem",
            reason: format!(
                "holds {} certificates; it must hold only the signing certificate (put the others in cert-chain.pem)",
                v.len()
            ),
        })?;
        let roots = signet_types::pem::parse_certs(root_pem).map_err(pem_err("root-cert.pem"))?;
        let chain = if chain_pem.iter().all(u8::is_ascii_whitespace) {
            Vec::new()
        } else {
            signet_types::pem::parse_certs(chain_pem).map_err(pem_err("cert-chain.pem"))?
        };
        let mut intermediates: Vec<Vec<u8>> = Vec::new();
        for c in chain {
            if c != cert && !roots.contains(&c) && !intermediates.contains(&c) {
                intermediates.push(c);
            }
        }
        let pkcs8 = key_to_pkcs8(key_pem)?;
        Authority::from_parts(cert, &pkcs8, intermediates, roots)
    }

    /// Lowercase hex of the signing certificate's subject key identifier (or of the SHA-256 of
    /// its SubjectPublicKeyInfo if it has none).
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The signing certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The trusted roots (the trust bundle), DER.
    pub fn roots(&self) -> &[Vec<u8>] {
        &self.roots
    }

    /// The intermediates between the signing certificate and its root, DER, nearest first.
    #[cfg(test)]
    pub fn intermediates(&self) -> &[Vec<u8>] {
        &self.intermediates
    }

    /// Signing certificate, intermediates, the root last; no duplicates. For a self-signed
    /// root just `[root]`.
    pub fn chain(&self) -> Vec<Vec<u8>> {
        self.chain.clone()
    }

    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// The private key, PKCS#8 DER, for persisting. Handle as a secret.
    #[allow(dead_code)] // used by the code that persists CA keys
    pub(crate) fn key_pkcs8_der(&self) -> &[u8] {
        self.issuer.key().serialized_der()
    }

    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    /// The signing certificate's side of a leaf's checks.
    pub(crate) fn issuer_facts(&self) -> &IssuerFacts {
        &self.issuer_facts
    }
}

// --- private key formats ---------------------------------------------------------------

/// Converts a PEM private key to PKCS#8 DER through Signet's one key importer
/// ([`signet_pki::PrivateKey::from_pem`]: PKCS#8, SEC1 naming P-256 or P-384, PKCS#1), adding
/// the conversion hint an operator needs.
fn key_to_pkcs8(key_pem: &[u8]) -> Result<Vec<u8>, AuthorityError> {
    use signet_pki::KeyError;
    match signet_pki::PrivateKey::from_pem(key_pem) {
        Ok(key) => Ok(key.pkcs8_der().to_vec()),
        Err(e @ (KeyError::Pem(_) | KeyError::NoPrivateKey)) => Err(AuthorityError::Pem {
            file: "ca-key.pem",
            reason: e.to_string(),
        }),
        Err(KeyError::Encrypted) => Err(AuthorityError::Key(format!(
            "the key is encrypted; decrypt it and {CONVERT_HINT}"
        ))),
        Err(e) => Err(AuthorityError::Key(format!("{e}; {CONVERT_HINT}"))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ca::testutil::{self, now, openssl, td};
    use rcgen::{CertificateParams, DistinguishedName, DnType, Issuer, KeyUsagePurpose};
    use x509_parser::extensions::GeneralName;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn generated_root_profile() {
        for key_type in [KeyType::EcdsaP256, KeyType::EcdsaP384] {
            let (ca, pkcs8) = testutil::root(key_type, 24 * HOUR);
            crate::ca::validate::check_ca(ca.cert_der()).expect("CA profile");
            let cert = parse_cert(ca.cert_der()).expect("parses");
            assert_eq!(
                cert.subject().to_string(),
                "O=Signet, OU=generation 2023-11-14T22:13:20Z, CN=Signet root CA for example.org"
            );
            assert_eq!(cert.issuer().as_raw(), cert.subject().as_raw());
            let san = cert.subject_alternative_name().expect("ok").expect("SAN");
            assert_eq!(
                san.value.general_names,
                vec![GeneralName::URI("spiffe://example.org")]
            );
            let bc = cert.basic_constraints().expect("ok").expect("BC");
            assert!(bc.critical && bc.value.ca);
            let ku = cert.key_usage().expect("ok").expect("KU");
            assert!(ku.critical);
            // keyCertSign and cRLSign only, as X509-SVID appendix A and SPIRE have it.
            assert!(ku.value.key_cert_sign() && ku.value.crl_sign());
            assert!(!ku.value.digital_signature(), "{:?}", ku.value);
            assert_eq!(ku.value.flags, 0b110_0000, "{:?}", ku.value);
            let ski = subject_key_id(&cert).expect("SKI");
            assert_eq!(ca.key_id(), hex::encode(ski));
            assert_eq!(ca.not_before(), now() - BACKDATE);
            assert_eq!(ca.not_after(), now() + 24 * HOUR);
            assert_eq!(ca.chain(), vec![ca.cert_der().to_vec()]);
            assert_eq!(ca.roots(), &[ca.cert_der().to_vec()]);
            assert_eq!(ca.key_pkcs8_der(), pkcs8.as_slice());
            assert!(cert.raw_serial()[0] & 0x80 == 0);
            cert.verify_signature(None).expect("self-signed");
            // Reloads from its parts.
            let again =
                Authority::from_parts(ca.cert_der().to_vec(), &pkcs8, vec![], ca.roots().to_vec())
                    .expect("reload");
            assert_eq!(again.key_id(), ca.key_id());
            // Debug shows no key material.
            let dbg = format!("{ca:?}");
            assert!(dbg.contains("redacted") && dbg.contains(ca.key_id()));
            assert!(!dbg.contains(&format!("{:?}", &pkcs8[..8])));
        }
    }

    /// Every CA certificate Signet makes, root and intermediate, has keyCertSign and cRLSign
    /// and nothing else (X509-SVID appendix A: digitalSignature only on a leaf; SPIRE alike).
    #[test]
    fn ca_certificates_carry_key_cert_sign_and_crl_sign_only() {
        let (root, _) = testutil::root(KeyType::EcdsaP256, 24 * HOUR);
        let (int, _) = root
            .sign_intermediate(
                &testutil::td(),
                KeyType::EcdsaP256,
                now(),
                HOUR,
                &crate::ca::RandomSerials::default(),
            )
            .expect("intermediate");
        for (what, der) in [("root", root.cert_der()), ("intermediate", int.cert_der())] {
            let cert = parse_cert(der).expect("parses");
            let ku = cert.key_usage().expect("ok").expect("KU");
            assert!(ku.critical, "{what}");
            assert_eq!(ku.value.flags, 0b110_0000, "{what}: {:?}", ku.value);
            crate::ca::validate::check_ca(der).expect("CA profile");
        }
    }

    #[test]
    fn from_parts_refuses_mismatched_key_and_non_ca() {
        let (ca, _) = testutil::root(KeyType::EcdsaP256, HOUR);
        let other = KeyPair::generate().expect("key").serialize_der();
        assert_eq!(
            Authority::from_parts(ca.cert_der().to_vec(), &other, vec![], ca.roots().to_vec())
                .expect_err("mismatch"),
            AuthorityError::KeyMismatch
        );
        assert!(matches!(
            Authority::from_parts(ca.cert_der().to_vec(), b"junk", vec![], ca.roots().to_vec()),
            Err(AuthorityError::Key(_))
        ));
        // A leaf is not a CA.
        let leaf_key = KeyPair::generate().expect("key");
        let leaf = CertificateParams::new(vec!["a.example".to_owned()])
            .expect("params")
            .self_signed(&leaf_key)
            .expect("leaf");
        let err = Authority::from_parts(
            leaf.der().to_vec(),
            &leaf_key.serialize_der(),
            vec![],
            vec![leaf.der().to_vec()],
        )
        .expect_err("not a CA");
        assert!(matches!(err, AuthorityError::NotACa(_)), "{err}");
        // Roots that did not sign it.
        let (other_root, _) = testutil::root(KeyType::EcdsaP256, HOUR);
        let (_, key) = testutil::root(KeyType::EcdsaP256, HOUR);
        let _ = key;
        let (ca2, key2) = testutil::root(KeyType::EcdsaP256, HOUR);
        let err = Authority::from_parts(
            ca2.cert_der().to_vec(),
            &key2,
            vec![],
            vec![other_root.cert_der().to_vec()],
        )
        .expect_err("unrelated root");
        assert!(matches!(err, AuthorityError::Chain(_)), "{err}");
    }

    /// An operator's PKI: an RSA-2048 root made by openssl, and a CA below it.
    pub(crate) struct PluggedPki {
        pub root_pem: String,
        pub root_der: Vec<u8>,
        pub root_issuer: Issuer<'static, KeyPair>,
    }

    pub(crate) fn rsa_root() -> PluggedPki {
        let key_pem = openssl(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ]);
        let key = KeyPair::from_pem(std::str::from_utf8(&key_pem).expect("utf8")).expect("RSA key");
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Operator");
        dn.push(DnType::CommonName, "Operator root");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = to_offset(now() - 24 * HOUR).expect("time");
        params.not_after = to_offset(now() + 365 * 24 * HOUR).expect("time");
        params.serial_number = Some(SerialNumber::from(7u64));
        let cert = params.self_signed(&key).expect("root");
        PluggedPki {
            root_pem: cert.pem(),
            root_der: cert.der().to_vec(),
            root_issuer: Issuer::new(params, key),
        }
    }

    /// A CA certificate for `key` signed by `issuer`.
    pub(crate) fn ca_cert(
        cn: &str,
        key: &impl PublicKeyData,
        issuer: &Issuer<'_, impl rcgen::SigningKey>,
    ) -> (CertificateParams, rcgen::Certificate) {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Operator");
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.use_authority_key_identifier_extension = true;
        params.not_before = to_offset(now() - 12 * HOUR).expect("time");
        params.not_after = to_offset(now() + 30 * 24 * HOUR).expect("time");
        params.serial_number = Some(SerialNumber::from(8u64));
        let cert = params.signed_by(key, issuer).expect("sign CA");
        (params, cert)
    }

    fn key_pem_of(args: &[&str]) -> (String, KeyPair) {
        let pem = String::from_utf8(openssl(args)).expect("utf8");
        // Convert to PKCS#8 with openssl to get a KeyPair for the public key.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k.pem");
        std::fs::write(&path, &pem).expect("write");
        let p8 = openssl(&[
            "pkcs8",
            "-topk8",
            "-nocrypt",
            "-in",
            path.to_str().expect("path"),
        ]);
        let key = KeyPair::from_pem(std::str::from_utf8(&p8).expect("utf8")).expect("pkcs8 key");
        (pem, key)
    }

    #[test]
    fn cacerts_with_sec1_pkcs1_and_pkcs8_keys() {
        let pki = rsa_root();
        let cases: Vec<(String, KeyPair, &str)> = vec![
            {
                let (pem, key) = key_pem_of(&["ecparam", "-name", "prime256v1", "-genkey"]);
                (pem, key, "EC PRIVATE KEY")
            },
            {
                let (pem, key) =
                    key_pem_of(&["ecparam", "-name", "secp384r1", "-genkey", "-noout"]);
                (pem, key, "EC PRIVATE KEY")
            },
            {
                let (pem, key) = key_pem_of(&["genrsa", "-traditional", "2048"]);
                (pem, key, "RSA PRIVATE KEY")
            },
            {
                let key = KeyPair::generate().expect("key");
                (key.serialize_pem(), key, "PRIVATE KEY")
            },
        ];
        for (key_pem, key, label) in cases {
            assert!(key_pem.contains(&format!("BEGIN {label}")), "{key_pem}");
            let (_, cert) = ca_cert("Operator issuing CA", &key, &pki.root_issuer);
            // cert-chain.pem: signing cert, root (and a repeated root).
            let chain_pem = format!("{}{}{}", cert.pem(), pki.root_pem, pki.root_pem);
            let ca = Authority::from_cacerts_pem(
                cert.pem().as_bytes(),
                key_pem.as_bytes(),
                chain_pem.as_bytes(),
                pki.root_pem.as_bytes(),
            )
            .unwrap_or_else(|e| panic!("{label}: {e}"));
            assert_eq!(ca.chain(), vec![cert.der().to_vec(), pki.root_der.clone()]);
            assert_eq!(ca.roots(), std::slice::from_ref(&pki.root_der));
            assert!(ca.intermediates().is_empty());
            // What it persists is PKCS#8 that loads again.
            assert!(KeyPair::try_from(ca.key_pkcs8_der()).is_ok());
            // An empty cert-chain.pem works too.
            Authority::from_cacerts_pem(
                cert.pem().as_bytes(),
                key_pem.as_bytes(),
                b"",
                pki.root_pem.as_bytes(),
            )
            .expect("empty chain file");
        }
    }

    #[test]
    fn cacerts_two_intermediates_dedup_and_errors() {
        let pki = rsa_root();
        let mid_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("key");
        let (mid_params, mid) = ca_cert("Operator intermediate", &mid_key, &pki.root_issuer);
        let mid_issuer = Issuer::new(mid_params, mid_key);
        let key = KeyPair::generate().expect("key");
        let (_, ca_c) = ca_cert("Operator issuing CA", &key, &mid_issuer);
        let chain_pem = format!("{}{}{}{}", ca_c.pem(), mid.pem(), mid.pem(), pki.root_pem);
        let ca = Authority::from_cacerts_pem(
            ca_c.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            chain_pem.as_bytes(),
            pki.root_pem.as_bytes(),
        )
        .expect("loads");
        assert_eq!(
            ca.chain(),
            vec![
                ca_c.der().to_vec(),
                mid.der().to_vec(),
                pki.root_der.clone()
            ]
        );
        // Without the intermediate the chain does not verify.
        let err = Authority::from_cacerts_pem(
            ca_c.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            b"",
            pki.root_pem.as_bytes(),
        )
        .expect_err("missing intermediate");
        assert!(matches!(err, AuthorityError::Chain(_)), "{err}");
        // Another operator's root.
        let other = rsa_root();
        let err = Authority::from_cacerts_pem(
            ca_c.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            chain_pem.as_bytes(),
            other.root_pem.as_bytes(),
        )
        .expect_err("wrong root");
        assert!(matches!(err, AuthorityError::Chain(_)), "{err}");
        // An encrypted key gets the conversion hint.
        let enc =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMAA=\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let err = Authority::from_cacerts_pem(
            ca_c.pem().as_bytes(),
            enc.as_bytes(),
            chain_pem.as_bytes(),
            pki.root_pem.as_bytes(),
        )
        .expect_err("encrypted");
        assert!(
            err.to_string().contains("openssl pkcs8 -topk8 -nocrypt"),
            "{err}"
        );
        // Garbage files.
        assert!(matches!(
            Authority::from_cacerts_pem(b"junk", b"junk", b"", b"junk"),
            Err(AuthorityError::Pem {
                file: "ca-cert.pem",
                ..
            })
        ));
        let two = format!("{}{}", ca_c.pem(), mid.pem());
        assert!(matches!(
            Authority::from_cacerts_pem(
                two.as_bytes(),
                key.serialize_pem().as_bytes(),
                b"",
                pki.root_pem.as_bytes()
            ),
            Err(AuthorityError::Pem {
                file: "ca-cert.pem",
                ..
            })
        ));
        let _ = td();
    }
}
