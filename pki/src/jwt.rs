//! JWT-SVIDs (the SPIFFE JWT-SVID standard): minting one with a signing key
//! ([`JwtSigner::mint`]) and validating one against a set of public keys ([`validate`]). The
//! server mints, and re-validates what it minted before anyone sees it; the agent validates for
//! the Workload API's `ValidateJWTSVID`; tests validate with independent libraries besides.
//!
//! The token is a compact JWS (RFC 7515) over a JWT (RFC 7519):
//! - header `{"alg":"ES256"|"RS256","kid":…,"typ":"JWT"}`: `kid` always, since every real
//!   validator picks the key by it;
//! - claims `sub` (the SPIFFE ID), `aud` (a string for one audience, an array for several: what
//!   go-jose writes and every validator reads), `exp`, `iat`, and `iss` when the server has an
//!   issuer URL.
//!
//! Validation, in order (each refusal is a [`JwtSvidError`] naming the rule):
//! 1. at most [`MAX_TOKEN_BYTES`], three base64url parts without padding;
//! 2. the header is a JSON object whose `alg` is an asymmetric algorithm this module verifies
//!    (`none` and HMAC are refused by name, so a public key can never be used as an HMAC
//!    secret); `typ`, when present, is `JWT` or `JOSE`; no `crit`; a non-empty `kid`;
//! 3. a key with that `kid` is in the set, its type fits the algorithm, and a key that states
//!    its algorithm (every Signet key does) is used with that algorithm only;
//! 4. the signature verifies; only then are the claims read;
//! 5. `sub` is a SPIFFE ID, `aud` is present and contains the audience asked for, `exp` is a
//!    number after now, `nbf` (if present) is not after now + [`LEEWAY_SECS`].
//!
//! No I/O and no clock: `now` is an argument.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, RsaKeyPair, UnparsedPublicKey};
use serde_json::{Map, Value};
use signet_types::SpiffeId;
use signet_types::untrusted::shown;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::bundle::{BundleError, spki_jwk};
use crate::key::{KeyAlgorithm, PrivateKey};

/// Longest token [`validate`] reads, in bytes.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// How far in the future a `nbf` may be (clock skew between minting and validating hosts).
pub const LEEWAY_SECS: i64 = 30;

/// A JWS algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JwtAlg {
    Es256,
    Es384,
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
}

impl JwtAlg {
    const ALL: [JwtAlg; 8] = [
        JwtAlg::Es256,
        JwtAlg::Es384,
        JwtAlg::Rs256,
        JwtAlg::Rs384,
        JwtAlg::Rs512,
        JwtAlg::Ps256,
        JwtAlg::Ps384,
        JwtAlg::Ps512,
    ];

    /// The JWS name.
    pub fn as_str(self) -> &'static str {
        match self {
            JwtAlg::Es256 => "ES256",
            JwtAlg::Es384 => "ES384",
            JwtAlg::Rs256 => "RS256",
            JwtAlg::Rs384 => "RS384",
            JwtAlg::Rs512 => "RS512",
            JwtAlg::Ps256 => "PS256",
            JwtAlg::Ps384 => "PS384",
            JwtAlg::Ps512 => "PS512",
        }
    }

    /// Exactly the JWS name.
    pub fn parse(s: &str) -> Option<JwtAlg> {
        JwtAlg::ALL.into_iter().find(|a| a.as_str() == s)
    }

    fn is_rsa(self) -> bool {
        !matches!(self, JwtAlg::Es256 | JwtAlg::Es384)
    }

    fn verifier(self) -> &'static dyn signature::VerificationAlgorithm {
        match self {
            JwtAlg::Es256 => &signature::ECDSA_P256_SHA256_FIXED,
            JwtAlg::Es384 => &signature::ECDSA_P384_SHA384_FIXED,
            JwtAlg::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
            JwtAlg::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
            JwtAlg::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
            JwtAlg::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
            JwtAlg::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
            JwtAlg::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
        }
    }
}

impl fmt::Display for JwtAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a key cannot sign or verify JWT-SVIDs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtKeyError {
    /// Signet signs with ES256 (P-256) and RS256 (RSA, 2048 bits or more) keys only.
    #[error(
        "a {0} key cannot sign JWT-SVIDs (ES256 needs ECDSA P-256, RS256 RSA of 2048 bits or more)"
    )]
    UnsupportedKey(String),
    #[error("the JWT signing key is not valid: {0}")]
    Invalid(String),
    #[error("the public key is not a DER SubjectPublicKeyInfo: {0}")]
    Spki(String),
    #[error("an empty key ID")]
    EmptyKeyId,
    /// A JWK whose members do not state a public key ([`JwtPublicKey::from_jwk`]).
    #[error("the JWK is not a valid public key: {0}")]
    Jwk(String),
    #[error("signing failed")]
    Signing,
}

/// Key type of a public key, as far as algorithm choice goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    P256,
    P384,
    Rsa,
}

/// A JWT signing key's public half: what a validator needs, and what bundles publish.
#[derive(Clone, PartialEq, Eq)]
pub struct JwtPublicKey {
    kid: String,
    /// The algorithm it is used with; `None` for a foreign key that did not say (its type then
    /// decides which algorithms are tried).
    alg: Option<JwtAlg>,
    spki_der: Vec<u8>,
    kind: KeyKind,
    /// The raw key `ring` verifies with: the EC point, or the RSAPublicKey DER.
    raw: Vec<u8>,
}

impl fmt::Debug for JwtPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtPublicKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl JwtPublicKey {
    /// A public key from its DER SubjectPublicKeyInfo, with its key ID and, when known, the one
    /// algorithm it signs with.
    pub fn from_spki(
        kid: impl Into<String>,
        alg: Option<JwtAlg>,
        spki_der: &[u8],
    ) -> Result<Self, JwtKeyError> {
        let kid = kid.into();
        if kid.is_empty() {
            return Err(JwtKeyError::EmptyKeyId);
        }
        let (rest, spki) = SubjectPublicKeyInfo::from_der(spki_der)
            .map_err(|e| JwtKeyError::Spki(e.to_string()))?;
        if !rest.is_empty() {
            return Err(JwtKeyError::Spki("bytes follow it".into()));
        }
        let kind = match spki
            .parsed()
            .map_err(|e| JwtKeyError::Spki(e.to_string()))?
        {
            PublicKey::EC(point) => match point.key_size() {
                256 => KeyKind::P256,
                384 => KeyKind::P384,
                n => return Err(JwtKeyError::UnsupportedKey(format!("EC {n}-bit"))),
            },
            PublicKey::RSA(rsa) if rsa.key_size() >= 2048 => KeyKind::Rsa,
            PublicKey::RSA(rsa) => {
                return Err(JwtKeyError::UnsupportedKey(format!(
                    "RSA-{}",
                    rsa.key_size()
                )));
            }
            _ => return Err(JwtKeyError::UnsupportedKey("non-EC, non-RSA".into())),
        };
        let key = Self {
            kid,
            alg,
            spki_der: spki_der.to_vec(),
            kind,
            raw: spki.subject_public_key.data.to_vec(),
        };
        if let Some(alg) = alg
            && !key.fits(alg)
        {
            return Err(JwtKeyError::UnsupportedKey(format!(
                "{:?} key stated as {alg}",
                key.kind
            )));
        }
        Ok(key)
    }

    /// A public key from its JWK members (RFC 7518 section 6), as a foreign trust domain's
    /// `jwt-svid` key arrives in its bundle ([`crate::bundle::JwtAuthority::jwk`]): `kty` `EC`
    /// with `crv` `P-256` or `P-384` and `x`/`y` of exactly the curve's coordinate length, or
    /// `kty` `RSA` with `n` (2048 bits or more) and `e`; each base64url without padding. `alg`,
    /// when present, must be an algorithm [`JwtAlg::parse`] knows and fit the key; the key is
    /// then used with it only. Other key types (`OKP`, `oct`, P-521) are
    /// [`JwtKeyError::UnsupportedKey`]. `use`, `kid` and members this reader does not know are
    /// ignored. The DER SubjectPublicKeyInfo is built with the `der` types (no hand-written
    /// DER) and read back by [`Self::from_spki`], so both constructors apply the same rules.
    pub fn from_jwk(kid: impl Into<String>, jwk: &Map<String, Value>) -> Result<Self, JwtKeyError> {
        let bad = |why: String| JwtKeyError::Jwk(why);
        let text = |member: &str| -> Result<Option<&str>, JwtKeyError> {
            match jwk.get(member) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.as_str())),
                Some(_) => Err(bad(format!("{member} is not a string"))),
            }
        };
        let bytes = |member: &str| -> Result<Vec<u8>, JwtKeyError> {
            let s = text(member)?.ok_or_else(|| bad(format!("no {member}")))?;
            URL_SAFE_NO_PAD
                .decode(s)
                .map_err(|_| bad(format!("{member} is not base64url without padding")))
        };
        let alg = match text("alg")? {
            None => None,
            Some(a) => Some(JwtAlg::parse(a).ok_or_else(|| {
                JwtKeyError::UnsupportedKey(format!("JWK with alg {}", shown(a)))
            })?),
        };
        let kty = text("kty")?.ok_or_else(|| bad("no kty".into()))?;
        let spki = match kty {
            "EC" => {
                let crv = text("crv")?.ok_or_else(|| bad("an EC key has no crv".into()))?;
                let (curve, len) = match crv {
                    "P-256" => (jwk_der::OID_P256, 32),
                    "P-384" => (jwk_der::OID_P384, 48),
                    other => {
                        return Err(JwtKeyError::UnsupportedKey(format!(
                            "JWK EC {} (P-256 and P-384 are read)",
                            shown(other)
                        )));
                    }
                };
                let (x, y) = (bytes("x")?, bytes("y")?);
                if x.len() != len || y.len() != len {
                    return Err(bad(format!(
                        "{crv} coordinates are {len} bytes each, x has {} and y {}",
                        x.len(),
                        y.len()
                    )));
                }
                jwk_der::ec_spki(curve, &x, &y)
            }
            "RSA" => {
                let (n, e) = (bytes("n")?, bytes("e")?);
                let bits = jwk_der::bit_len(&n);
                if bits < 2048 {
                    return Err(JwtKeyError::UnsupportedKey(format!(
                        "RSA-{bits} (JWK; RSA keys of 2048 bits or more are read)"
                    )));
                }
                if jwk_der::bit_len(&e) == 0 {
                    return Err(bad("the RSA exponent e is zero".into()));
                }
                jwk_der::rsa_spki(&n, &e)
            }
            other => {
                let crv = text("crv").ok().flatten().map(shown);
                return Err(JwtKeyError::UnsupportedKey(match crv {
                    Some(c) => format!("JWK kty {} crv {c} (EC and RSA are read)", shown(other)),
                    None => format!("JWK kty {} (EC and RSA are read)", shown(other)),
                }));
            }
        }
        .map_err(|e| bad(format!("its SubjectPublicKeyInfo cannot be written: {e}")))?;
        Self::from_spki(kid, alg, &spki)
    }

    pub fn key_id(&self) -> &str {
        &self.kid
    }

    pub fn alg(&self) -> Option<JwtAlg> {
        self.alg
    }

    /// DER SubjectPublicKeyInfo.
    pub fn spki_der(&self) -> &[u8] {
        &self.spki_der
    }

    fn fits(&self, alg: JwtAlg) -> bool {
        match self.kind {
            KeyKind::P256 => alg == JwtAlg::Es256,
            KeyKind::P384 => alg == JwtAlg::Es384,
            KeyKind::Rsa => alg.is_rsa(),
        }
    }

    /// The key as a JWK (RFC 7517) with `kid`, `alg` (when known) and `use` as given:
    /// `jwt-svid` in a SPIFFE bundle, `sig` in an OpenID Connect JWKS.
    pub fn jwk(&self, key_use: &str) -> Result<Map<String, Value>, BundleError> {
        let mut jwk = spki_jwk(&self.spki_der)?;
        jwk.insert("use".into(), key_use.into());
        jwk.insert("kid".into(), self.kid.clone().into());
        if let Some(alg) = self.alg {
            jwk.insert("alg".into(), alg.as_str().into());
        }
        Ok(jwk)
    }

    fn verify(&self, alg: JwtAlg, message: &[u8], sig: &[u8]) -> bool {
        UnparsedPublicKey::new(alg.verifier(), &self.raw)
            .verify(message, sig)
            .is_ok()
    }
}

/// The key ID Signet gives a JWT signing key: the base64url SHA-256 of its SubjectPublicKeyInfo,
/// cut to 32 characters (192 bits): the same on every replica, and new with every key.
pub fn key_id_for(spki_der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, spki_der);
    let mut id = URL_SAFE_NO_PAD.encode(digest.as_ref());
    id.truncate(32);
    id
}

enum SigningKey {
    Ec(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// A key that mints JWT-SVIDs. `Debug` shows its key ID and algorithm only.
pub struct JwtSigner {
    public: JwtPublicKey,
    alg: JwtAlg,
    key: SigningKey,
}

impl fmt::Debug for JwtSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtSigner")
            .field("kid", &self.public.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

/// The claims Signet puts in a JWT-SVID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSvidClaims {
    pub subject: SpiffeId,
    /// At least one.
    pub audience: Vec<String>,
    /// Unix seconds.
    pub issued_at: i64,
    /// Unix seconds.
    pub expires_at: i64,
    /// The OpenID Connect issuer URL, when the server has one.
    pub issuer: Option<String>,
}

impl JwtSigner {
    /// A signer from a private key: ECDSA P-256 signs ES256, RSA (2048 bits or more) RS256. The
    /// key ID is [`key_id_for`] its public key.
    pub fn new(key: &PrivateKey) -> Result<Self, JwtKeyError> {
        let rng = SystemRandom::new();
        let invalid = |e: ring::error::KeyRejected| JwtKeyError::Invalid(e.to_string());
        let (alg, signing) = match key.algorithm() {
            KeyAlgorithm::EcdsaP256 => (
                JwtAlg::Es256,
                SigningKey::Ec(
                    EcdsaKeyPair::from_pkcs8(
                        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                        key.pkcs8_der(),
                        &rng,
                    )
                    .map_err(invalid)?,
                ),
            ),
            KeyAlgorithm::Rsa(bits) if bits >= 2048 => (
                JwtAlg::Rs256,
                SigningKey::Rsa(RsaKeyPair::from_pkcs8(key.pkcs8_der()).map_err(invalid)?),
            ),
            other => return Err(JwtKeyError::UnsupportedKey(other.to_string())),
        };
        let spki = key
            .public_key_der()
            .map_err(|e| JwtKeyError::Invalid(e.to_string()))?;
        let public = JwtPublicKey::from_spki(key_id_for(&spki), Some(alg), &spki)?;
        Ok(Self {
            public,
            alg,
            key: signing,
        })
    }

    pub fn key_id(&self) -> &str {
        &self.public.kid
    }

    pub fn alg(&self) -> JwtAlg {
        self.alg
    }

    pub fn public_key(&self) -> &JwtPublicKey {
        &self.public
    }

    /// Signs `claims` into a compact JWS. It does not check them: the caller re-validates the
    /// token ([`validate`]) before it leaves, as the server does.
    pub fn mint(&self, claims: &JwtSvidClaims) -> Result<String, JwtKeyError> {
        let header = serde_json::json!({
            "alg": self.alg.as_str(),
            "kid": self.public.kid,
            "typ": "JWT",
        });
        let mut body = Map::new();
        body.insert("sub".into(), claims.subject.to_string().into());
        let aud: Value = match claims.audience.as_slice() {
            [one] => one.clone().into(),
            many => many.to_vec().into(),
        };
        body.insert("aud".into(), aud);
        body.insert("exp".into(), claims.expires_at.into());
        body.insert("iat".into(), claims.issued_at.into());
        if let Some(iss) = &claims.issuer {
            body.insert("iss".into(), iss.clone().into());
        }
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(Value::Object(body).to_string())
        );
        let rng = SystemRandom::new();
        let sig = match &self.key {
            SigningKey::Ec(k) => {
                let mut sig = k
                    .sign(&rng, signing_input.as_bytes())
                    .map_err(|_| JwtKeyError::Signing)?
                    .as_ref()
                    .to_vec();
                p256_low_s(&mut sig);
                sig
            }
            SigningKey::Rsa(k) => {
                let mut sig = vec![0u8; k.public().modulus_len()];
                k.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signing_input.as_bytes(),
                    &mut sig,
                )
                .map_err(|_| JwtKeyError::Signing)?;
                sig
            }
        };
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }
}

/// The order n of the P-256 group, big-endian.
const P256_N: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
];

/// n / 2 (rounded down) for P-256: an `s` above it is "high".
const P256_HALF_N: [u8; 32] = [
    0x7f, 0xff, 0xff, 0xff, 0x80, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xde, 0x73, 0x7d, 0x56, 0xd3, 0x8b, 0xcf, 0x42, 0x79, 0xdc, 0xe5, 0x61, 0x7e, 0x31, 0x92, 0xa8,
];

/// Whether a fixed-width ES256 signature (r ‖ s, 64 bytes) has `s > n/2`. ECDSA signatures are
/// malleable: (r, n − s) verifies as well as (r, s), so one token would have two encodings and
/// two hashes; Signet issues only the low form and its validator refuses the other.
fn p256_is_high_s(sig: &[u8]) -> bool {
    sig.len() == 64 && sig[32..] > P256_HALF_N[..]
}

/// Puts a fixed-width ES256 signature in its low-S form (s ← n − s when s > n/2).
fn p256_low_s(sig: &mut [u8]) {
    if !p256_is_high_s(sig) {
        return;
    }
    let s = &mut sig[32..];
    let mut borrow = 0u16;
    for i in (0..32).rev() {
        let d = u16::from(P256_N[i])
            .wrapping_sub(u16::from(s[i]))
            .wrapping_sub(borrow);
        borrow = u16::from(u16::from(P256_N[i]) < u16::from(s[i]) + borrow);
        s[i] = (d & 0xff) as u8;
    }
}

/// The public keys a validator trusts, by key ID.
#[derive(Debug, Clone, Default)]
pub struct JwtKeySet {
    keys: BTreeMap<String, JwtPublicKey>,
}

impl JwtKeySet {
    /// A set of keys; a later key with the same ID replaces an earlier one.
    pub fn new(keys: impl IntoIterator<Item = JwtPublicKey>) -> Self {
        Self {
            keys: keys.into_iter().map(|k| (k.kid.clone(), k)).collect(),
        }
    }

    pub fn get(&self, kid: &str) -> Option<&JwtPublicKey> {
        self.keys.get(kid)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &JwtPublicKey> {
        self.keys.values()
    }
}

/// Why a token is not a valid JWT-SVID. The messages are for the caller (the Workload API
/// returns them) and quote what the token said only cut and escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtSvidError {
    #[error("the token is empty")]
    Empty,
    #[error("the token is longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error("the token is not a compact JWS: {0}")]
    Malformed(&'static str),
    #[error("the token header is not valid: {0}")]
    Header(String),
    #[error("the token's alg {0} is refused: JWT-SVIDs are signed with a public-key algorithm")]
    AlgRefused(String),
    #[error("the token's alg {0} is not supported (ES256, ES384, RS256-512, PS256-512)")]
    AlgUnsupported(String),
    #[error("the token has no kid: a JWT-SVID names the key that signed it")]
    NoKeyId,
    #[error("the token's key {0} is not in the trust bundle")]
    UnknownKey(String),
    #[error("the token's alg {alg} does not fit key {kid}")]
    AlgMismatch { alg: JwtAlg, kid: String },
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error(
        "the token's ES256 signature is not in its low-S form: a mirror of a signature, which \
         Signet never issues (and whose hash is not on the ledger)"
    )]
    HighS,
    #[error("the token's claims are not valid: {0}")]
    Claims(String),
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token is not for audience {0}")]
    WrongAudience(String),
}

/// A token that passed [`validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedJwtSvid {
    pub spiffe_id: SpiffeId,
    /// Every claim, as the token carries it.
    pub claims: Map<String, Value>,
    pub audience: Vec<String>,
    pub expires_at: i64,
    pub issued_at: Option<i64>,
    pub key_id: String,
}

fn decode_part(part: &str, what: &'static str) -> Result<Vec<u8>, JwtSvidError> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| JwtSvidError::Malformed(what))
}

/// Validates `token` as a JWT-SVID for `audience` against `keys` at `now` (unix seconds); see
/// the module doc for the rules.
pub fn validate(
    token: &str,
    audience: &str,
    keys: &JwtKeySet,
    now: i64,
) -> Result<ValidatedJwtSvid, JwtSvidError> {
    if token.is_empty() {
        return Err(JwtSvidError::Empty);
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(JwtSvidError::TooLong);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtSvidError::Malformed("it does not have three parts"));
    };
    let header: Map<String, Value> =
        serde_json::from_slice(&decode_part(h, "the header is not base64url")?)
            .map_err(|_| JwtSvidError::Header("not a JSON object".into()))?;
    let alg_name = match header.get("alg") {
        Some(Value::String(a)) => a.as_str(),
        Some(_) => return Err(JwtSvidError::Header("alg is not a string".into())),
        None => return Err(JwtSvidError::Header("no alg".into())),
    };
    if alg_name.eq_ignore_ascii_case("none") || alg_name.to_ascii_uppercase().starts_with("HS") {
        return Err(JwtSvidError::AlgRefused(shown(alg_name)));
    }
    let alg =
        JwtAlg::parse(alg_name).ok_or_else(|| JwtSvidError::AlgUnsupported(shown(alg_name)))?;
    match header.get("typ") {
        None => {}
        Some(Value::String(t)) if t == "JWT" || t == "JOSE" => {}
        Some(other) => {
            return Err(JwtSvidError::Header(format!(
                "typ {} is neither JWT nor JOSE",
                shown(&other.to_string())
            )));
        }
    }
    if header.contains_key("crit") {
        return Err(JwtSvidError::Header(
            "crit names an extension this validator does not understand".into(),
        ));
    }
    let kid = match header.get("kid") {
        Some(Value::String(k)) if !k.is_empty() => k.as_str(),
        Some(Value::String(_)) | None => return Err(JwtSvidError::NoKeyId),
        Some(_) => return Err(JwtSvidError::Header("kid is not a string".into())),
    };
    let key = keys
        .get(kid)
        .ok_or_else(|| JwtSvidError::UnknownKey(shown(kid)))?;
    if !key.fits(alg) || key.alg.is_some_and(|a| a != alg) {
        return Err(JwtSvidError::AlgMismatch {
            alg,
            kid: shown(kid),
        });
    }
    let sig = decode_part(s, "the signature is not base64url")?;
    if sig.is_empty() {
        return Err(JwtSvidError::BadSignature);
    }
    let signing_input = &token[..h.len() + 1 + p.len()];
    if !key.verify(alg, signing_input.as_bytes(), &sig) {
        return Err(JwtSvidError::BadSignature);
    }
    if alg == JwtAlg::Es256 && p256_is_high_s(&sig) {
        return Err(JwtSvidError::HighS);
    }
    // Verified: only now are the claims read.
    let claims: Map<String, Value> =
        serde_json::from_slice(&decode_part(p, "the payload is not base64url")?)
            .map_err(|_| JwtSvidError::Claims("not a JSON object".into()))?;
    let sub = match claims.get("sub") {
        Some(Value::String(s)) => s,
        _ => return Err(JwtSvidError::Claims("no sub".into())),
    };
    let spiffe_id: SpiffeId = sub
        .parse()
        .map_err(|e| JwtSvidError::Claims(format!("sub {} is not a SPIFFE ID: {e}", shown(sub))))?;
    if spiffe_id.to_string() != *sub {
        return Err(JwtSvidError::Claims(format!(
            "sub {} is not written in its canonical (lowercase) form",
            shown(sub)
        )));
    }
    let audiences: Vec<String> = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| JwtSvidError::Claims("aud holds a non-string".into()))?,
        _ => return Err(JwtSvidError::Claims("no aud".into())),
    };
    let seconds = |name: &str| -> Result<Option<i64>, JwtSvidError> {
        match claims.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
                .map(Some)
                .ok_or_else(|| JwtSvidError::Claims(format!("{name} is not a time"))),
            Some(_) => Err(JwtSvidError::Claims(format!("{name} is not a number"))),
        }
    };
    let expires_at = seconds("exp")?.ok_or_else(|| JwtSvidError::Claims("no exp".into()))?;
    if expires_at <= now {
        return Err(JwtSvidError::Expired);
    }
    if seconds("nbf")?.is_some_and(|nbf| nbf > now.saturating_add(LEEWAY_SECS)) {
        return Err(JwtSvidError::NotYetValid);
    }
    let issued_at = seconds("iat")?;
    if !audiences.iter().any(|a| a == audience) {
        return Err(JwtSvidError::WrongAudience(shown(audience)));
    }
    Ok(ValidatedJwtSvid {
        spiffe_id,
        claims,
        audience: audiences,
        expires_at,
        issued_at,
        key_id: kid.to_owned(),
    })
}

/// The DER SubjectPublicKeyInfo of a JWK's key (RFC 5480 for EC, RFC 8017 for RSA), written with
/// the `der`, `spki` and `pkcs1` types.
mod jwk_der {
    use rsa::pkcs1::RsaPublicKey;
    use rsa::pkcs8::der::asn1::{AnyRef, BitStringRef, ObjectIdentifier, UintRef};
    use rsa::pkcs8::der::{Encode, Result};
    use rsa::pkcs8::spki::{AlgorithmIdentifierRef, SubjectPublicKeyInfoRef};

    pub(super) const OID_EC_PUBLIC_KEY: ObjectIdentifier =
        ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
    pub(super) const OID_P256: ObjectIdentifier =
        ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
    pub(super) const OID_P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
    const OID_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

    fn spki(algorithm: AlgorithmIdentifierRef<'_>, key: &[u8]) -> Result<Vec<u8>> {
        SubjectPublicKeyInfoRef {
            algorithm,
            subject_public_key: BitStringRef::from_bytes(key)?,
        }
        .to_der()
    }

    /// `id-ecPublicKey` with the named curve, and the uncompressed point 04 ‖ x ‖ y.
    pub(super) fn ec_spki(curve: ObjectIdentifier, x: &[u8], y: &[u8]) -> Result<Vec<u8>> {
        let point = [&[4u8][..], x, y].concat();
        let algorithm = AlgorithmIdentifierRef {
            oid: OID_EC_PUBLIC_KEY,
            parameters: Some(AnyRef::from(&curve)),
        };
        spki(algorithm, &point)
    }

    /// `rsaEncryption` (NULL parameters) and the PKCS#1 `RSAPublicKey` (n, e as unsigned
    /// integers: `UintRef` drops leading zeros and adds the one a high bit needs).
    pub(super) fn rsa_spki(n: &[u8], e: &[u8]) -> Result<Vec<u8>> {
        let key = RsaPublicKey {
            modulus: UintRef::new(n)?,
            public_exponent: UintRef::new(e)?,
        }
        .to_der()?;
        let algorithm = AlgorithmIdentifierRef {
            oid: OID_RSA,
            parameters: Some(AnyRef::NULL),
        };
        spki(algorithm, &key)
    }

    /// The bit length of an unsigned big-endian integer (leading zero bytes ignored).
    pub(super) fn bit_len(be: &[u8]) -> usize {
        match be.iter().position(|&b| b != 0) {
            None => 0,
            Some(i) => (be.len() - i - 1) * 8 + (8 - be[i].leading_zeros() as usize),
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod from_jwk_tests;
