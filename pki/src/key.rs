//! Private keys: generating one ([`generate`]), reading one from PEM in any of the encodings
//! OpenSSL and cert-manager write ([`PrivateKey::from_pem`]: PKCS#8 `PRIVATE KEY`, SEC1
//! `EC PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY`) and writing it back ([`PrivateKey::to_pem`]).
//!
//! A key is held as PKCS#8 DER and is only accepted once ring can sign with it. ring generates
//! ECDSA and Ed25519 keys; RSA keys come from the `rsa` crate. DER structures are read and
//! written with the RustCrypto `pkcs8`, `pkcs1` and `sec1` crates (no hand-written DER).
//! `Debug` never prints key material.

use std::fmt;

use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P384_SHA384_ASN1_SIGNING};
use rsa::pkcs8::der::asn1::{AnyRef, ObjectIdentifier, OctetStringRef};
use rsa::pkcs8::der::{Decode, Encode};
use rsa::pkcs8::{AlgorithmIdentifierRef, PrivateKeyInfo};
use rustls::pki_types::PrivatePkcs8KeyDer;

/// The key algorithms Signet's clients generate and read (those cert-manager names, but
/// P-521).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlgorithm {
    EcdsaP256,
    EcdsaP384,
    Ed25519,
    /// RSA with the modulus size in bits.
    Rsa(u32),
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyAlgorithm::EcdsaP256 => f.write_str("ECDSA P-256"),
            KeyAlgorithm::EcdsaP384 => f.write_str("ECDSA P-384"),
            KeyAlgorithm::Ed25519 => f.write_str("Ed25519"),
            KeyAlgorithm::Rsa(bits) => write!(f, "RSA-{bits}"),
        }
    }
}

/// How a private key is written as PEM (cert-manager's `spec.privateKey.encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyEncoding {
    /// cert-manager's default: PKCS#1 for RSA, SEC1 for ECDSA (PKCS#8 for Ed25519).
    #[default]
    Pkcs1,
    Pkcs8,
}

/// A private key, held as PKCS#8 DER. `Debug` shows the algorithm only.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey {
    algorithm: KeyAlgorithm,
    pkcs8: Vec<u8>,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("algorithm", &self.algorithm)
            .field("der", &"…")
            .finish()
    }
}

/// Why a key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key generation failed: {0}")]
    Generate(String),
    #[error("the private key is not valid: {0}")]
    Invalid(String),
    #[error("CSR: {0}")]
    Csr(String),
    /// The input is not PEM.
    #[error("not valid PEM ({0})")]
    Pem(String),
    /// No block labelled `… PRIVATE KEY`.
    #[error("no PRIVATE KEY block found")]
    NoPrivateKey,
    /// An `ENCRYPTED PRIVATE KEY`: Signet reads unencrypted keys only.
    #[error("the key is encrypted")]
    Encrypted,
    /// A SEC1 `EC PRIVATE KEY` that does not name its curve (Signet does not guess it).
    #[error("the EC PRIVATE KEY does not name its curve (P-256 or P-384)")]
    Sec1WithoutCurve,
    /// An elliptic curve other than P-256 and P-384 (its OID).
    #[error("unsupported elliptic curve {0}; Signet reads P-256 and P-384 keys")]
    UnsupportedCurve(String),
}

const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const OID_P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
const OID_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

fn invalid(e: impl fmt::Display) -> KeyError {
    KeyError::Invalid(format!("malformed DER: {e}"))
}

/// Generates a key for `alg`. RSA generation takes a while: call it off the async runtime.
pub fn generate(alg: KeyAlgorithm) -> Result<PrivateKey, KeyError> {
    let rng = SystemRandom::new();
    let pkcs8 = match alg {
        KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => {
            let a = if alg == KeyAlgorithm::EcdsaP256 {
                &ECDSA_P256_SHA256_ASN1_SIGNING
            } else {
                &ECDSA_P384_SHA384_ASN1_SIGNING
            };
            ring::signature::EcdsaKeyPair::generate_pkcs8(a, &rng)
                .map_err(|_| KeyError::Generate("ECDSA".into()))?
                .as_ref()
                .to_vec()
        }
        KeyAlgorithm::Ed25519 => ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| KeyError::Generate("Ed25519".into()))?
            .as_ref()
            .to_vec(),
        KeyAlgorithm::Rsa(bits) => {
            use rsa::pkcs8::EncodePrivateKey;
            let key = rsa::RsaPrivateKey::new(&mut RingRng(rng), bits as usize)
                .map_err(|e| KeyError::Generate(format!("RSA-{bits}: {e}")))?;
            key.to_pkcs8_der()
                .map_err(|e| KeyError::Generate(format!("RSA-{bits}: {e}")))?
                .as_bytes()
                .to_vec()
        }
    };
    Ok(PrivateKey {
        algorithm: alg,
        pkcs8,
    })
}

/// ring's system randomness behind the `rand_core` traits the `rsa` crate takes.
struct RingRng(SystemRandom);

impl rsa::rand_core::RngCore for RingRng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        // The system RNG failing is not something to recover from.
        #[allow(clippy::expect_used)]
        self.0
            .fill(dest)
            .expect("system random number generator failed");
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rsa::rand_core::Error> {
        self.0
            .fill(dest)
            .map_err(|_| rsa::rand_core::Error::from(std::num::NonZeroU32::MIN))
    }
}

impl rsa::rand_core::CryptoRng for RingRng {}

impl PrivateKey {
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// PEM in the requested encoding.
    pub fn to_pem(&self, encoding: KeyEncoding) -> Result<String, KeyError> {
        let (label, der) = match (encoding, self.algorithm) {
            (KeyEncoding::Pkcs8, _) | (_, KeyAlgorithm::Ed25519) => {
                ("PRIVATE KEY", self.pkcs8.clone())
            }
            (KeyEncoding::Pkcs1, KeyAlgorithm::Rsa(_)) => (
                "RSA PRIVATE KEY",
                pkcs8_info(&self.pkcs8)?.private_key.to_vec(),
            ),
            (KeyEncoding::Pkcs1, KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384) => {
                ("EC PRIVATE KEY", self.sec1()?)
            }
        };
        // LF line endings, as OpenSSL and Kubernetes tooling write PEM.
        Ok(pem::encode_config(
            &pem::Pem::new(label, der),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        ))
    }

    /// Reads a PEM private key and checks that ring can sign with it. This is Signet's one key
    /// importer (the clients' keys, the CA key an operator plugs in):
    ///
    /// - the first block whose label ends in `PRIVATE KEY` is read; blocks before it that are
    ///   not keys (`EC PARAMETERS`, as `openssl ecparam -genkey` writes first) are skipped;
    /// - `PRIVATE KEY` (PKCS#8), `RSA PRIVATE KEY` (PKCS#1) and `EC PRIVATE KEY` (SEC1) are
    ///   read; a SEC1 key must name its curve (P-256 or P-384): one without a named curve, or
    ///   with another curve, is refused ([`KeyError::Sec1WithoutCurve`],
    ///   [`KeyError::UnsupportedCurve`]), never guessed;
    /// - `ENCRYPTED PRIVATE KEY` is refused as such ([`KeyError::Encrypted`]).
    pub fn from_pem(input: &[u8]) -> Result<Self, KeyError> {
        let blocks = pem::parse_many(input).map_err(|e| KeyError::Pem(e.to_string()))?;
        let p = blocks
            .iter()
            .find(|b| b.tag().ends_with("PRIVATE KEY"))
            .ok_or(KeyError::NoPrivateKey)?;
        let pkcs8 = match p.tag() {
            "PRIVATE KEY" => p.contents().to_vec(),
            "RSA PRIVATE KEY" => wrap_pkcs8(OID_RSA, Some(AnyRef::NULL), p.contents())?,
            "EC PRIVATE KEY" => {
                let curve = sec1::EcPrivateKey::from_der(p.contents())
                    .map_err(invalid)?
                    .parameters
                    .and_then(|p| p.named_curve())
                    .ok_or(KeyError::Sec1WithoutCurve)?;
                if curve != OID_P256 && curve != OID_P384 {
                    return Err(KeyError::UnsupportedCurve(curve.to_string()));
                }
                wrap_pkcs8(OID_EC_PUBLIC_KEY, Some(AnyRef::from(&curve)), p.contents())?
            }
            "ENCRYPTED PRIVATE KEY" => return Err(KeyError::Encrypted),
            other => return Err(KeyError::Invalid(format!("unexpected PEM block {other:?}"))),
        };
        let algorithm = algorithm_of_pkcs8(&pkcs8)?;
        let key = Self { algorithm, pkcs8 };
        key.key_pair()?;
        Ok(key)
    }

    /// A PKCS#8 `PrivateKeyInfo` (DER), checked like [`Self::from_pem`].
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, KeyError> {
        let algorithm = algorithm_of_pkcs8(der)?;
        let key = Self {
            algorithm,
            pkcs8: der.to_vec(),
        };
        key.key_pair()?;
        Ok(key)
    }

    /// The key as PKCS#8 DER (key material: never log it).
    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8
    }

    /// The rcgen key pair that signs CSRs.
    pub(crate) fn key_pair(&self) -> Result<rcgen::KeyPair, KeyError> {
        let alg = match self.algorithm {
            KeyAlgorithm::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            KeyAlgorithm::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            KeyAlgorithm::Ed25519 => &rcgen::PKCS_ED25519,
            KeyAlgorithm::Rsa(_) => &rcgen::PKCS_RSA_SHA256,
        };
        rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(self.pkcs8.clone()),
            alg,
        )
        .map_err(|e| KeyError::Invalid(e.to_string()))
    }

    /// The SubjectPublicKeyInfo DER, to compare with a certificate's.
    pub fn public_key_der(&self) -> Result<Vec<u8>, KeyError> {
        use rcgen::PublicKeyData;
        Ok(self.key_pair()?.subject_public_key_info())
    }

    /// SEC1 `ECPrivateKey` with the curve in `parameters`, as OpenSSL writes it (ring leaves
    /// them out of the key inside its PKCS#8).
    fn sec1(&self) -> Result<Vec<u8>, KeyError> {
        let info = pkcs8_info(&self.pkcs8)?;
        let curve = info.algorithm.parameters_oid().map_err(invalid)?;
        let mut key = sec1::EcPrivateKey::from_der(info.private_key).map_err(invalid)?;
        if key.parameters.is_none() {
            key.parameters = Some(sec1::EcParameters::NamedCurve(curve));
        }
        key.to_der().map_err(invalid)
    }
}

fn pkcs8_info(pkcs8: &[u8]) -> Result<PrivateKeyInfo<'_>, KeyError> {
    PrivateKeyInfo::from_der(pkcs8).map_err(invalid)
}

/// The key algorithm of a PKCS#8 `PrivateKeyInfo`.
fn algorithm_of_pkcs8(pkcs8: &[u8]) -> Result<KeyAlgorithm, KeyError> {
    let info = pkcs8_info(pkcs8)?;
    let oid = info.algorithm.oid;
    if oid == OID_ED25519 {
        return Ok(KeyAlgorithm::Ed25519);
    }
    if oid == OID_EC_PUBLIC_KEY {
        let curve = info.algorithm.parameters_oid().map_err(invalid)?;
        return if curve == OID_P256 {
            Ok(KeyAlgorithm::EcdsaP256)
        } else if curve == OID_P384 {
            Ok(KeyAlgorithm::EcdsaP384)
        } else {
            Err(KeyError::UnsupportedCurve(curve.to_string()))
        };
    }
    if oid == OID_RSA {
        let key = rsa::pkcs1::RsaPrivateKey::from_der(info.private_key).map_err(invalid)?;
        let modulus = key.modulus.as_bytes();
        let significant = modulus
            .iter()
            .position(|b| *b != 0)
            .map_or(&[][..], |i| &modulus[i..]);
        let bits = match significant.first() {
            Some(first) => (significant.len() * 8) as u32 - first.leading_zeros(),
            None => 0,
        };
        return Ok(KeyAlgorithm::Rsa(bits));
    }
    Err(KeyError::Invalid("unsupported key algorithm".into()))
}

/// A PKCS#8 `PrivateKeyInfo` around a PKCS#1 or SEC1 key.
fn wrap_pkcs8(
    oid: ObjectIdentifier,
    parameters: Option<AnyRef<'_>>,
    key: &[u8],
) -> Result<Vec<u8>, KeyError> {
    // Checks the inner key is one DER value before it is wrapped.
    OctetStringRef::new(key).map_err(invalid)?;
    PrivateKeyInfo {
        algorithm: AlgorithmIdentifierRef { oid, parameters },
        private_key: key,
        public_key: None,
    }
    .to_der()
    .map_err(invalid)
}

#[cfg(test)]
mod tests;
