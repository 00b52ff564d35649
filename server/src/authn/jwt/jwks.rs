//! The issuer's key set (JWKS, RFC 7517) and the choice of key for one token.
//!
//! The document is what the cluster serves at its OIDC `jwks_uri`; the server reads it once, at
//! start-up, from `auth.kubernetes.jwks_file` (`server.rs`): nothing here fetches, refreshes or
//! caches, so a rotated issuer key needs a new file and a restart (README, "Operations").
//!
//! Rules for the set, all refused by name ([`JwksError`]) when the authenticator is built, never
//! at the first token: only RSA (2048 bits or more) and EC P-256/P-384 public keys; a symmetric
//! (`oct`) key, a private key (`d`) or another key type refuses the whole document; keys marked
//! `use: enc` are skipped; a key's own `alg`, when present, must fit the key and is then the only
//! algorithm it verifies; at least one signing key.
//!
//! Each entry is read as a `jsonwebtoken` [`Jwk`], its key built by [`DecodingKey::from_jwk`],
//! after the checks on the raw JSON: not as a `JwkSet`, which refuses a whole document without
//! naming the entry, and not before, since a [`Jwk`] silently drops the private `d` member.
//!
//! Rules for choosing ([`KeySet::candidates`]): a token with a `kid` is checked against exactly
//! that key, which must accept the header's `alg`; a token without one against every key that
//! accepts its `alg`. The algorithms accepted at all are [`SUPPORTED`]: what some key kind here
//! can verify, so the header check and the key check cannot disagree.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

use super::refuse::{bad, quoted};
use crate::authn::AuthnError;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Every signature algorithm a token may use, in the order messages list them: the
/// asymmetric ones a [`KeyKind`] verifies (no `none`, no HMAC, no EdDSA).
pub(super) const SUPPORTED: [Algorithm; 8] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
];

/// The smallest RSA modulus accepted, in bits.
const MIN_RSA_BITS: usize = 2048;

/// Why a JWKS document was refused. `key` names the entry: `key #<index> (kid "<kid>")`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwksError {
    #[error("not valid JSON: {0}")]
    NotJson(String),
    #[error(
        "not a JWKS: expected an object with a \"keys\" array (the document served at the \
         issuer's jwks_uri)"
    )]
    NotAJwks,
    #[error("{key} is a symmetric (oct) key; only RSA and EC public keys are accepted")]
    Symmetric { key: String },
    #[error("{key} has no kty")]
    NoKeyType { key: String },
    #[error("{key} has kty {kty:?}; only RSA and EC (P-256, P-384) keys are supported")]
    UnsupportedKeyType { key: String, kty: String },
    #[error("{key} contains a private key (\"d\"); the JWKS must hold public keys only")]
    PrivateKey { key: String },
    #[error("{key} is not a valid JWK: {reason}")]
    InvalidJwk { key: String, reason: String },
    #[error("{key}: n is not base64url")]
    ModulusNotBase64 { key: String },
    #[error("{key}: RSA key of about {bits} bits; at least 2048 are required")]
    WeakRsa { key: String, bits: usize },
    #[error("{key}: curve {curve} is not supported (P-256 or P-384)")]
    UnsupportedCurve { key: String, curve: String },
    #[error("{key}: only RSA and EC keys are supported")]
    UnsupportedParameters { key: String },
    #[error("{key}: alg {alg} is not a supported signature algorithm")]
    UnsupportedAlg { key: String, alg: String },
    #[error("{key}: alg {alg} does not fit a {kind:?} key")]
    AlgDoesNotFit {
        key: String,
        alg: String,
        kind: KeyKind,
    },
    #[error("{key}: {reason}")]
    Unusable { key: String, reason: String },
    #[error("holds no signing keys")]
    NoSigningKeys,
}

/// The kind of public key a JWKS entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Rsa,
    EcP256,
    EcP384,
}

impl KeyKind {
    /// Whether a key of this kind verifies `alg`.
    pub(super) fn supports(self, alg: Algorithm) -> bool {
        match self {
            KeyKind::Rsa => matches!(
                alg,
                Algorithm::RS256
                    | Algorithm::RS384
                    | Algorithm::RS512
                    | Algorithm::PS256
                    | Algorithm::PS384
                    | Algorithm::PS512
            ),
            KeyKind::EcP256 => alg == Algorithm::ES256,
            KeyKind::EcP384 => alg == Algorithm::ES384,
        }
    }
}

/// One signing key of the set.
pub(super) struct VerifyKey {
    kid: Option<String>,
    kind: KeyKind,
    /// The JWK's own `alg`, when it names one: then only that algorithm is accepted.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

impl VerifyKey {
    fn accepts(&self, alg: Algorithm) -> bool {
        self.kind.supports(alg) && self.alg.is_none_or(|a| a == alg)
    }

    /// The public key, for [`jsonwebtoken::crypto::verify`].
    pub(super) fn decoding_key(&self) -> &DecodingKey {
        &self.key
    }
}

/// The signing keys of a JWKS document, checked (see the module doc). Holds public keys only.
pub(super) struct KeySet {
    keys: Vec<VerifyKey>,
}

impl KeySet {
    /// Parses and checks a JWKS document.
    pub(super) fn parse(jwks_json: &str) -> Result<Self, JwksError> {
        let doc: serde_json::Value =
            serde_json::from_str(jwks_json).map_err(|e| JwksError::NotJson(e.to_string()))?;
        let Some(items) = doc.get("keys").and_then(|k| k.as_array()) else {
            return Err(JwksError::NotAJwks);
        };
        let mut keys = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(key) = parse_key(i, item)? {
                keys.push(key);
            }
        }
        if keys.is_empty() {
            return Err(JwksError::NoSigningKeys);
        }
        Ok(Self { keys })
    }

    /// The `kid` of every key, in document order (for `Debug`: no key material).
    pub(super) fn kids(&self) -> Vec<Option<&str>> {
        self.keys.iter().map(|k| k.kid.as_deref()).collect()
    }

    /// The keys a token signed with `alg` (and naming `kid`, if it does) may verify with:
    /// exactly the `kid`'s key, or every key accepting `alg`. Never empty when `Ok`.
    pub(super) fn candidates(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Vec<&VerifyKey>, AuthnError> {
        let alg_name = self::alg_name(alg);
        match kid {
            Some(kid) => {
                let Some(key) = self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)) else {
                    return Err(bad(format!(
                        "signed by a key that is not in the configured JWKS (kid {}); refresh \
                         auth.kubernetes.jwks_file from the issuer's jwks_uri",
                        quoted(kid)
                    )));
                };
                if !key.accepts(alg) {
                    return Err(bad(format!(
                        "header alg {alg_name} does not match JWKS key {} ({:?} key{})",
                        quoted(kid),
                        key.kind,
                        key.alg
                            .map(|a| format!(" for {}", self::alg_name(a)))
                            .unwrap_or_default()
                    )));
                }
                Ok(vec![key])
            }
            None => {
                let c: Vec<&VerifyKey> = self.keys.iter().filter(|k| k.accepts(alg)).collect();
                if c.is_empty() {
                    return Err(bad(format!(
                        "signed by a key that is not in the configured JWKS (no kid, and no \
                         configured key supports {alg_name})"
                    )));
                }
                Ok(c)
            }
        }
    }
}

/// Entry `i` of the `keys` array: a signing key, `None` for an encryption key, or the reason
/// the whole document is refused.
fn parse_key(i: usize, item: &serde_json::Value) -> Result<Option<VerifyKey>, JwksError> {
    let kid_label = item
        .get("kid")
        .and_then(|k| k.as_str())
        .map(|k| format!(" (kid {k:?})"))
        .unwrap_or_default();
    let key = format!("key #{i}{kid_label}");
    let kty = item.get("kty").and_then(|k| k.as_str()).unwrap_or("");
    match kty {
        "RSA" | "EC" => {}
        "oct" => return Err(JwksError::Symmetric { key }),
        "" => return Err(JwksError::NoKeyType { key }),
        other => {
            return Err(JwksError::UnsupportedKeyType {
                key,
                kty: other.to_owned(),
            });
        }
    }
    if item.get("d").is_some() {
        return Err(JwksError::PrivateKey { key });
    }
    let jwk: Jwk = match serde_json::from_value(item.clone()) {
        Ok(jwk) => jwk,
        Err(e) => {
            return Err(JwksError::InvalidJwk {
                key,
                reason: e.to_string(),
            });
        }
    };
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return Ok(None); // not a signing key
    }
    let kind = match &jwk.algorithm {
        AlgorithmParameters::RSA(p) => {
            let Ok(n) = URL_SAFE_NO_PAD.decode(&p.n) else {
                return Err(JwksError::ModulusNotBase64 { key });
            };
            let bits = n.iter().skip_while(|b| **b == 0).count() * 8;
            if bits < MIN_RSA_BITS {
                return Err(JwksError::WeakRsa { key, bits });
            }
            KeyKind::Rsa
        }
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => KeyKind::EcP256,
            EllipticCurve::P384 => KeyKind::EcP384,
            ref c => {
                return Err(JwksError::UnsupportedCurve {
                    key,
                    curve: format!("{c:?}"),
                });
            }
        },
        _ => return Err(JwksError::UnsupportedParameters { key }),
    };
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(ka) => {
            let Some(alg) = key_alg(ka) else {
                return Err(JwksError::UnsupportedAlg {
                    key,
                    alg: ka.to_string(),
                });
            };
            if !kind.supports(alg) {
                return Err(JwksError::AlgDoesNotFit {
                    key,
                    alg: ka.to_string(),
                    kind,
                });
            }
            Some(alg)
        }
    };
    let decoding = match DecodingKey::from_jwk(&jwk) {
        Ok(d) => d,
        Err(e) => {
            return Err(JwksError::Unusable {
                key,
                reason: e.to_string(),
            });
        }
    };
    Ok(Some(VerifyKey {
        kid: jwk.common.key_id.clone(),
        kind,
        alg,
        key: decoding,
    }))
}

/// A JWK `alg` as a signature algorithm we support; `None` for any other (HMAC, EdDSA,
/// encryption algorithms).
fn key_alg(ka: KeyAlgorithm) -> Option<Algorithm> {
    Some(match ka {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        _ => return None,
    })
}

/// The JOSE name of `alg` (RFC 7518 §3.1), for messages.
pub(super) fn alg_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::HS256 => "HS256",
        Algorithm::HS384 => "HS384",
        Algorithm::HS512 => "HS512",
        Algorithm::ES256 => "ES256",
        Algorithm::ES384 => "ES384",
        Algorithm::RS256 => "RS256",
        Algorithm::RS384 => "RS384",
        Algorithm::RS512 => "RS512",
        Algorithm::PS256 => "PS256",
        Algorithm::PS384 => "PS384",
        Algorithm::PS512 => "PS512",
        Algorithm::EdDSA => "EdDSA",
    }
}

#[cfg(test)]
mod tests {
    use super::super::JwtAuthenticator;
    use super::super::test_support::*;
    use super::*;
    use serde_json::json;
    use std::str::FromStr;

    #[test]
    fn token_without_kid_tries_compatible_keys() {
        let other = ec_key("ec-0");
        let key = ec_key("ec-1");
        let auth =
            JwtAuthenticator::new(&cfg(), &jwks(&[&rsa_key().jwk, &other.jwk, &key.jwk]), td())
                .expect("authn");
        let caller = auth
            .authenticate(&sign_es(&key, None, &claims()), now())
            .expect("accepted");
        assert_eq!(caller.spiffe_id().path(), "/ns/default/sa/web");
        // And without the kubernetes.io object (sub alone names the account).
        let c = without(claims(), "kubernetes.io");
        let caller = auth
            .authenticate(&sign_es(&key, None, &c), now())
            .expect("accepted");
        assert!(matches!(
            caller.kind(),
            crate::authn::CallerKind::KubernetesServiceAccount { pod: None, .. }
        ));
    }

    /// The JWKS half of `bad_configuration_is_named` (the `[auth.kubernetes]` half is in
    /// `super::super::tests`).
    #[test]
    fn bad_configuration_is_named() {
        let key = ec_key("ec-1");
        let cases: [(&str, &str); 7] = [
            ("not json", "not valid JSON"),
            (r#"{"kids": []}"#, "\"keys\" array"),
            (r#"{"keys": []}"#, "no signing keys"),
            (
                r#"{"keys": [{"kty":"oct","k":"c2VjcmV0","kid":"h"}]}"#,
                "symmetric",
            ),
            (
                r#"{"keys": [{"kty":"OKP","crv":"Ed25519","x":"AA"}]}"#,
                "OKP",
            ),
            (r#"{"keys": [{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#, "2048"),
            (
                r#"{"keys": [{"kty":"EC","crv":"P-256","x":"AA"}]}"#,
                "not a valid JWK",
            ),
        ];
        for (doc, want) in cases {
            let err = JwtAuthenticator::new(&cfg(), doc, td()).expect_err(doc);
            assert!(err.to_string().contains(want), "{doc}: {err}");
        }
        let mut private = key.jwk.clone();
        private["d"] = json!("AAAA");
        let err = JwtAuthenticator::new(&cfg(), &jwks(&[&private]), td()).expect_err("private");
        assert!(err.to_string().contains("private key"), "{err}");
        let mut mismatched = key.jwk.clone();
        mismatched["alg"] = json!("RS256");
        let err = JwtAuthenticator::new(&cfg(), &jwks(&[&mismatched]), td()).expect_err("alg");
        assert!(err.to_string().contains("does not fit"), "{err}");
    }

    fn refusal(doc: &str) -> JwksError {
        match KeySet::parse(doc) {
            Ok(_) => panic!("accepted: {doc}"),
            Err(e) => e,
        }
    }

    #[test]
    fn each_refusal_is_its_own_variant_naming_the_key() {
        let key = |extra: serde_json::Value| {
            let mut k = ec_key("ec-1").jwk;
            for (name, v) in extra.as_object().expect("object") {
                k[name] = v.clone();
            }
            jwks(&[&k])
        };
        let at = || "key #0 (kid \"ec-1\")".to_owned();
        assert!(matches!(refusal("[]"), JwksError::NotAJwks));
        assert!(matches!(refusal("{"), JwksError::NotJson(_)));
        assert_eq!(
            refusal(&key(json!({ "kty": "oct" }))),
            JwksError::Symmetric { key: at() }
        );
        assert_eq!(
            refusal(&key(json!({ "kty": 7 }))),
            JwksError::NoKeyType { key: at() }
        );
        assert_eq!(
            refusal(&key(json!({ "d": "AAAA" }))),
            JwksError::PrivateKey { key: at() }
        );
        assert_eq!(
            refusal(&key(json!({ "alg": "HS256" }))),
            JwksError::UnsupportedAlg {
                key: at(),
                alg: "HS256".into()
            }
        );
        assert_eq!(
            refusal(&key(json!({ "alg": "ES384" }))),
            JwksError::AlgDoesNotFit {
                key: at(),
                alg: "ES384".into(),
                kind: KeyKind::EcP256
            }
        );
        let e = refusal(&key(json!({ "crv": "P-521" })));
        assert!(
            matches!(&e, JwksError::UnsupportedCurve { key, .. } if *key == at()),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "key #0 (kid \"ec-1\"): curve P521 is not supported (P-256 or P-384)"
        );
        let rsa = |n: &str| format!(r#"{{"keys": [{{"kty":"RSA","n":"{n}","e":"AQAB"}}]}}"#);
        assert_eq!(
            refusal(&rsa("AQAB")),
            JwksError::WeakRsa {
                key: "key #0".into(),
                bits: 24
            }
        );
        assert_eq!(
            refusal(&rsa("!!")),
            JwksError::ModulusNotBase64 {
                key: "key #0".into()
            }
        );
    }

    #[test]
    fn encryption_keys_are_skipped_and_a_key_alg_restricts_the_key() {
        let enc = with(ec_key("enc").jwk, "use", json!("enc"));
        assert_eq!(refusal(&jwks(&[&enc])), JwksError::NoSigningKeys);
        let sig = ec_key("sig");
        let set = KeySet::parse(&jwks(&[&enc, &sig.jwk])).expect("one signing key");
        assert_eq!(set.kids(), vec![Some("sig")]);
        // The RSA key says RS256: only RS256 tokens may name it.
        let rsa = KeySet::parse(&jwks(&[&rsa_key().jwk])).expect("rsa");
        assert_eq!(
            rsa.candidates(Some("rsa-1"), Algorithm::RS256)
                .expect("fits")
                .len(),
            1
        );
        let e = rsa
            .candidates(Some("rsa-1"), Algorithm::PS256)
            .err()
            .expect("refused");
        assert!(
            e.to_string()
                .contains("header alg PS256 does not match JWKS key \"rsa-1\" (Rsa key for RS256)"),
            "{e}"
        );
        // Without its alg, an RSA key takes every RSA algorithm, and no EC one.
        let mut open = rsa_key().jwk.clone();
        open.as_object_mut().expect("object").remove("alg");
        let open = KeySet::parse(&jwks(&[&open])).expect("rsa");
        assert!(open.candidates(None, Algorithm::PS512).is_ok());
        assert!(open.candidates(None, Algorithm::ES256).is_err());
    }

    #[test]
    fn the_supported_algorithms_are_exactly_what_some_key_kind_verifies() {
        let all = [
            "HS256", "HS384", "HS512", "ES256", "ES384", "RS256", "RS384", "RS512", "PS256",
            "PS384", "PS512", "EdDSA",
        ];
        for name in all {
            let alg = Algorithm::from_str(name).expect("a jsonwebtoken algorithm");
            assert_eq!(alg_name(alg), name);
            let verifiable = [KeyKind::Rsa, KeyKind::EcP256, KeyKind::EcP384]
                .iter()
                .any(|k| k.supports(alg));
            assert_eq!(verifiable, SUPPORTED.contains(&alg), "{name}");
        }
    }
}
