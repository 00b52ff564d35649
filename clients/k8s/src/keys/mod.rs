//! Private keys for `Certificate`s: what `spec.privateKey` asks for ([`KeySpec`]), generating
//! one ([`generate`]), reading the one already in a Secret ([`PrivateKey::from_pem`]), and a CSR
//! for it ([`build_csr`]).
//!
//! ring signs with every key cert-manager knows except P-521 but generates only ECDSA and
//! Ed25519 keys; RSA keys are generated with the `rsa` crate. Encodings follow cert-manager:
//! `PKCS1` (the default) is `RSA PRIVATE KEY` for RSA and SEC1 `EC PRIVATE KEY` for ECDSA,
//! `PKCS8` is `PRIVATE KEY`; Ed25519 keys are always PKCS#8.
//!
//! No I/O, no clock. `Debug` never prints key material.

use std::fmt;

use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P384_SHA384_ASN1_SIGNING};
use rustls::pki_types::PrivatePkcs8KeyDer;

/// The key algorithms cert-manager names.
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

/// `spec.privateKey.encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyEncoding {
    /// cert-manager's default: PKCS#1 for RSA, SEC1 for ECDSA (PKCS#8 for Ed25519).
    #[default]
    Pkcs1,
    Pkcs8,
}

/// `spec.privateKey.rotationPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RotationPolicy {
    /// A new key on every issuance (cert-manager's default since v1.18).
    #[default]
    Always,
    /// Keep the key already in the Secret while it matches the spec.
    Never,
}

/// What `spec.privateKey` asks for, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpec {
    pub algorithm: KeyAlgorithm,
    pub encoding: KeyEncoding,
    pub rotation: RotationPolicy,
}

impl Default for KeySpec {
    fn default() -> Self {
        Self {
            algorithm: KeyAlgorithm::EcdsaP256,
            encoding: KeyEncoding::Pkcs1,
            rotation: RotationPolicy::Always,
        }
    }
}

/// A `spec.privateKey` we cannot honour. The message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnsupportedKey(pub String);

impl KeySpec {
    /// Validates `spec.privateKey`'s fields (each optional, as in the CRD).
    pub fn parse(
        algorithm: Option<&str>,
        size: Option<i64>,
        encoding: Option<&str>,
        rotation: Option<&str>,
    ) -> Result<Self, UnsupportedKey> {
        let algorithm = match (algorithm.unwrap_or("ECDSA"), size) {
            ("ECDSA", None | Some(0 | 256)) => KeyAlgorithm::EcdsaP256,
            ("ECDSA", Some(384)) => KeyAlgorithm::EcdsaP384,
            ("ECDSA", Some(521)) => {
                return Err(UnsupportedKey(
                    "privateKey: ECDSA size 521 (P-521) is not supported by Signet; use size 256 or 384"
                        .into(),
                ));
            }
            ("ECDSA", Some(n)) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: ECDSA size {n} is not valid; use 256 or 384"
                )));
            }
            ("Ed25519", _) => KeyAlgorithm::Ed25519,
            ("RSA", None | Some(0)) => KeyAlgorithm::Rsa(2048),
            ("RSA", Some(n @ (2048 | 3072 | 4096))) => KeyAlgorithm::Rsa(n as u32),
            ("RSA", Some(8192)) => {
                return Err(UnsupportedKey(
                    "privateKey: RSA size 8192 is not supported by signet-k8s (generating it would stall the controller); use 2048, 3072 or 4096, or ECDSA"
                        .into(),
                ));
            }
            ("RSA", Some(n)) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: RSA size {n} is not valid; use 2048, 3072 or 4096"
                )));
            }
            (other, _) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: algorithm {other:?} is not supported; use ECDSA, Ed25519 or RSA"
                )));
            }
        };
        let encoding = match encoding {
            None | Some("") | Some("PKCS1") => KeyEncoding::Pkcs1,
            Some("PKCS8") => KeyEncoding::Pkcs8,
            Some(other) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: encoding {other:?} is not valid; use PKCS1 or PKCS8"
                )));
            }
        };
        let rotation = match rotation {
            None | Some("") | Some("Always") => RotationPolicy::Always,
            Some("Never") => RotationPolicy::Never,
            Some(other) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: rotationPolicy {other:?} is not valid; use Always or Never"
                )));
            }
        };
        Ok(Self {
            algorithm,
            encoding,
            rotation,
        })
    }
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
}

const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];
const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

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
            (KeyEncoding::Pkcs1, KeyAlgorithm::Rsa(_)) => {
                let (_, inner) = pkcs8_parts(&self.pkcs8)?;
                ("RSA PRIVATE KEY", inner.to_vec())
            }
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

    /// Reads a PEM private key (`PRIVATE KEY`, `EC PRIVATE KEY` or `RSA PRIVATE KEY`) and
    /// checks that ring can sign with it.
    pub fn from_pem(input: &[u8]) -> Result<Self, KeyError> {
        let p = pem::parse(input).map_err(|e| KeyError::Invalid(e.to_string()))?;
        let pkcs8 = match p.tag() {
            "PRIVATE KEY" => p.contents().to_vec(),
            "RSA PRIVATE KEY" => {
                wrap_pkcs8(&[tlv(0x06, OID_RSA), tlv(0x05, &[])].concat(), p.contents())
            }
            "EC PRIVATE KEY" => {
                let curve = sec1_curve(p.contents())?;
                wrap_pkcs8(
                    &[tlv(0x06, OID_EC_PUBLIC_KEY), tlv(0x06, &curve)].concat(),
                    p.contents(),
                )
            }
            other => return Err(KeyError::Invalid(format!("unexpected PEM block {other:?}"))),
        };
        let algorithm = algorithm_of_pkcs8(&pkcs8)?;
        let key = Self { algorithm, pkcs8 };
        key.key_pair()?;
        Ok(key)
    }

    /// The rcgen key pair that signs CSRs.
    fn key_pair(&self) -> Result<rcgen::KeyPair, KeyError> {
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

    /// SEC1 `ECPrivateKey` with the curve in `parameters`, as OpenSSL writes it.
    fn sec1(&self) -> Result<Vec<u8>, KeyError> {
        let (alg_id, inner) = pkcs8_parts(&self.pkcs8)?;
        let curve = {
            let mut r = Reader(alg_id);
            r.expect(0x06)?;
            r.expect(0x06)?.to_vec()
        };
        let mut r = Reader(inner);
        let seq = r.expect(0x30)?;
        let mut r = Reader(seq);
        let version = r.next()?;
        let private = r.next()?;
        let mut out = [encode_tlv(version), encode_tlv(private)].concat();
        // ring omits [0] parameters; OpenSSL needs them in a standalone SEC1 key.
        let mut has_params = false;
        let mut rest = Vec::new();
        while !r.0.is_empty() {
            let t = r.next()?;
            has_params |= t.0 == 0xa0;
            rest.extend(encode_tlv(t));
        }
        if !has_params {
            out.extend(tlv(0xa0, &tlv(0x06, &curve)));
        }
        out.extend(rest);
        Ok(tlv(0x30, &out))
    }
}

/// The key algorithm of a PKCS#8 `PrivateKeyInfo`.
fn algorithm_of_pkcs8(pkcs8: &[u8]) -> Result<KeyAlgorithm, KeyError> {
    let (alg_id, inner) = pkcs8_parts(pkcs8)?;
    let mut r = Reader(alg_id);
    let oid = r.expect(0x06)?;
    if oid == OID_ED25519 {
        return Ok(KeyAlgorithm::Ed25519);
    }
    if oid == OID_EC_PUBLIC_KEY {
        let curve = r.expect(0x06)?;
        return if curve == OID_P256 {
            Ok(KeyAlgorithm::EcdsaP256)
        } else if curve == OID_P384 {
            Ok(KeyAlgorithm::EcdsaP384)
        } else {
            Err(KeyError::Invalid("unsupported elliptic curve".into()))
        };
    }
    if oid == OID_RSA {
        // RSAPrivateKey ::= SEQUENCE { version, modulus, ... }
        let mut r = Reader(inner);
        let mut r = Reader(r.expect(0x30)?);
        r.expect(0x02)?;
        let modulus = r.expect(0x02)?;
        let significant: Vec<u8> = modulus.iter().copied().skip_while(|b| *b == 0).collect();
        let bits = match significant.first() {
            Some(first) => (significant.len() * 8) as u32 - first.leading_zeros(),
            None => 0,
        };
        return Ok(KeyAlgorithm::Rsa(bits));
    }
    Err(KeyError::Invalid("unsupported key algorithm".into()))
}

/// (AlgorithmIdentifier contents, privateKey contents) of a PKCS#8 `PrivateKeyInfo`.
fn pkcs8_parts(pkcs8: &[u8]) -> Result<(&[u8], &[u8]), KeyError> {
    let mut r = Reader(pkcs8);
    let mut r = Reader(r.expect(0x30)?);
    r.expect(0x02)?;
    let alg = r.expect(0x30)?;
    let key = r.expect(0x04)?;
    Ok((alg, key))
}

/// The curve OID in a SEC1 key's `parameters`.
fn sec1_curve(sec1: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut r = Reader(sec1);
    let mut r = Reader(r.expect(0x30)?);
    r.expect(0x02)?;
    r.expect(0x04)?;
    while !r.0.is_empty() {
        let (tag, value) = r.next()?;
        if tag == 0xa0 {
            return Ok(Reader(value).expect(0x06)?.to_vec());
        }
    }
    Err(KeyError::Invalid(
        "EC PRIVATE KEY without curve parameters".into(),
    ))
}

fn wrap_pkcs8(alg_id_contents: &[u8], key: &[u8]) -> Vec<u8> {
    tlv(
        0x30,
        &[tlv(0x02, &[0]), tlv(0x30, alg_id_contents), tlv(0x04, key)].concat(),
    )
}

/// A DER reader over definite-length TLVs with one-byte tags: enough for key structures.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn next(&mut self) -> Result<(u8, &'a [u8]), KeyError> {
        let bad = || KeyError::Invalid("malformed DER".into());
        let (&tag, rest) = self.0.split_first().ok_or_else(bad)?;
        let (&first, mut rest) = rest.split_first().ok_or_else(bad)?;
        let len = if first < 0x80 {
            first as usize
        } else {
            let n = (first & 0x7f) as usize;
            if n == 0 || n > 4 || rest.len() < n {
                return Err(bad());
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | *b as usize);
            rest = &rest[n..];
            len
        };
        if rest.len() < len {
            return Err(bad());
        }
        let (value, rest) = rest.split_at(len);
        self.0 = rest;
        Ok((tag, value))
    }

    fn expect(&mut self, tag: u8) -> Result<&'a [u8], KeyError> {
        match self.next()? {
            (t, v) if t == tag => Ok(v),
            (t, _) => Err(KeyError::Invalid(format!(
                "malformed DER: tag {t:#04x} where {tag:#04x} was expected"
            ))),
        }
    }
}

fn encode_tlv((tag, value): (u8, &[u8])) -> Vec<u8> {
    tlv(tag, value)
}

fn tlv(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .iter()
            .copied()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(value);
    out
}

/// The names a CSR carries. The server grants them only under its own policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsrNames {
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub common_name: Option<String>,
}

/// A PEM CSR for `key` naming `names`.
pub fn build_csr(key: &PrivateKey, names: &CsrNames) -> Result<String, KeyError> {
    let kp = key.key_pair()?;
    let mut params = rcgen::CertificateParams::default();
    let mut sans = vec![rcgen::SanType::URI(
        names
            .spiffe_id
            .as_str()
            .try_into()
            .map_err(|e: rcgen::Error| KeyError::Csr(format!("URI {}: {e}", names.spiffe_id)))?,
    )];
    for d in &names.dns_names {
        sans.push(rcgen::SanType::DnsName(d.as_str().try_into().map_err(
            |e: rcgen::Error| KeyError::Csr(format!("DNS name {d:?}: {e}")),
        )?));
    }
    params.subject_alt_names = sans;
    let mut dn = rcgen::DistinguishedName::new();
    if let Some(cn) = &names.common_name {
        dn.push(rcgen::DnType::CommonName, cn.as_str());
    }
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(&kp)
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    csr.pem().map_err(|e| KeyError::Csr(e.to_string()))
}

#[cfg(test)]
mod tests;
