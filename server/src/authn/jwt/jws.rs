//! Compact JWS (RFC 7515 §7.1): the token's shape, its header, and its signature.
//!
//! Rules, checked in this order by [`Jws::parse`] and [`Jws::verify`]:
//! 1. at most [`MAX_TOKEN_BYTES`] bytes, not empty;
//! 2. three dot-separated parts (five is a JWE, refused by name);
//! 3. the header is base64url JSON with an `alg` that is one of [`SUPPORTED`]: `none` (any case)
//!    and HMAC (`HS*`) are refused by name, so a public key can never serve as an HMAC secret;
//!    EdDSA and anything else are unsupported;
//! 4. no `crit` header (we support no extension);
//! 5. a non-empty signature that verifies with a key [`KeySet::candidates`] chooses by `kid`.
//!
//! Only [`Jws::verify`] yields a [`Verified`] token, and only a verified token hands out its
//! payload: the claims are never read from a token whose signature did not verify.
//!
//! `jsonwebtoken` serves here for algorithm names ([`Algorithm`]'s `FromStr`), keys
//! ([`jsonwebtoken::DecodingKey`], in [`super::jwks`]) and the signature primitive
//! ([`jsonwebtoken::crypto::verify`], over ring). Its `decode_header` does not serve, and the
//! header is decoded here, because it would weaken or blur three checks (the test
//! `jsonwebtokens_decode_header_would_weaken_these_checks` pins the first two): it
//! deserializes `alg` straight into [`Algorithm`], so `none`, a lowercase `hs256` and typos all
//! become one anonymous "invalid algorithm name" (we say which and why); its `Header` has no
//! `crit`, so a critical extension would pass unseen; and it also parses an embedded `jwk` or
//! `x5c`, hostile input we never use. Nor are claims checked by `jsonwebtoken::decode`:
//! [`super::claims`] checks them against the injected clock.

use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use serde::Deserialize;

use super::jwks::{KeySet, SUPPORTED, alg_name};
use super::refuse::{bad, quoted, shown};
use crate::authn::AuthnError;

/// Longest token accepted, in bytes. Real projected tokens are 1–2 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// [`SUPPORTED`], as messages name it.
const SUPPORTED_ALGS: &str = "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384";

/// A compact JWS whose shape and header passed; its signature is not checked yet.
pub(super) struct Jws<'a> {
    header_b64: &'a str,
    payload_b64: &'a str,
    sig_b64: &'a str,
    alg: Algorithm,
    kid: Option<String>,
}

/// A JWS whose signature verified with a key of the set: the only way to its payload.
pub(super) struct Verified<'a> {
    payload_b64: &'a str,
}

/// The header fields we read; the others are ignored.
#[derive(Deserialize)]
struct RawHeader {
    alg: Option<String>,
    kid: Option<String>,
    crit: Option<Vec<serde_json::Value>>,
}

impl<'a> Jws<'a> {
    /// Rules 1 to 4 of the module doc.
    pub(super) fn parse(token: &'a str) -> Result<Self, AuthnError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(bad(format!(
                "token is {} bytes, more than the {MAX_TOKEN_BYTES}-byte limit",
                token.len()
            )));
        }
        if token.is_empty() {
            return Err(bad("token is empty"));
        }
        let parts: Vec<&str> = token.split('.').collect();
        let (header_b64, payload_b64, sig_b64) = match parts.as_slice() {
            [h, p, s] => (*h, *p, *s),
            [_, _, _, _, _] => {
                return Err(bad(
                    "encrypted tokens (JWE) are not accepted; send the service-account token (a signed JWT)",
                ));
            }
            _ => {
                return Err(bad(format!(
                    "not a JWT: expected 3 dot-separated parts, found {}",
                    parts.len()
                )));
            }
        };
        let header: RawHeader = decode_part(header_b64, "header")?;
        let alg = check_alg(header.alg.as_deref())?;
        if let Some(crit) = &header.crit {
            return Err(bad(format!(
                "token header marks {} extension(s) critical (\"crit\"); none are supported",
                crit.len()
            )));
        }
        Ok(Self {
            header_b64,
            payload_b64,
            sig_b64,
            alg,
            kid: header.kid,
        })
    }

    /// Rule 5: the signature verifies with a key `keys` chooses for this token.
    pub(super) fn verify(self, keys: &KeySet) -> Result<Verified<'a>, AuthnError> {
        if self.sig_b64.is_empty() {
            return Err(bad("token has no signature"));
        }
        let kid = self.kid.as_deref();
        let candidates = keys.candidates(kid, self.alg)?;
        let message = self.signing_input();
        for key in &candidates {
            // `alg` is asymmetric (checked at parse) and `key` accepts it, so this is a
            // public-key verification; the library's HMAC path is never reached.
            if let Ok(true) =
                jsonwebtoken::crypto::verify(self.sig_b64, &message, key.decoding_key(), self.alg)
            {
                return Ok(Verified {
                    payload_b64: self.payload_b64,
                });
            }
        }
        let alg_name = alg_name(self.alg);
        Err(bad(match kid {
            Some(kid) => format!(
                "signature does not verify with JWKS key {} ({alg_name}); the token was altered \
                 or signed by another key",
                quoted(kid)
            ),
            None => format!(
                "signed by a key that is not in the configured JWKS (no kid; the signature \
                 verifies with none of the {} {alg_name} key(s))",
                candidates.len()
            ),
        }))
    }

    /// What the signature covers: `<header>.<payload>`, as sent.
    fn signing_input(&self) -> Vec<u8> {
        let mut message = Vec::with_capacity(self.header_b64.len() + 1 + self.payload_b64.len());
        message.extend_from_slice(self.header_b64.as_bytes());
        message.push(b'.');
        message.extend_from_slice(self.payload_b64.as_bytes());
        message
    }
}

impl Verified<'_> {
    /// The payload, decoded as `T`.
    pub(super) fn payload<T: serde::de::DeserializeOwned>(&self) -> Result<T, AuthnError> {
        decode_part(self.payload_b64, "payload")
    }
}

/// One base64url part of the token, as JSON.
fn decode_part<T: serde::de::DeserializeOwned>(part: &str, what: &str) -> Result<T, AuthnError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| bad(format!("token {what} is not base64url")))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        // serde_json's message names the expected type and position; cut it short, since it
        // may quote a (claim) value.
        bad(format!(
            "token {what} is not the expected JSON object: {}",
            shown(&e.to_string())
        ))
    })
}

/// The header's `alg`, if it is one of [`SUPPORTED`]; otherwise why not, by name.
fn check_alg(alg: Option<&str>) -> Result<Algorithm, AuthnError> {
    let Some(alg) = alg else {
        return Err(bad("token header has no alg"));
    };
    if let Ok(a) = Algorithm::from_str(alg)
        && SUPPORTED.contains(&a)
    {
        return Ok(a);
    }
    if alg.eq_ignore_ascii_case("none") {
        return Err(bad(format!(
            "alg \"none\" (an unsigned token) is refused; service-account tokens are signed \
             ({SUPPORTED_ALGS})"
        )));
    }
    if alg.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("HS")) {
        return Err(bad(format!(
            "alg {} is a shared-secret (HMAC) algorithm and is refused; service-account tokens \
             are signed with the issuer's private key ({SUPPORTED_ALGS})",
            quoted(alg)
        )));
    }
    Err(bad(format!(
        "alg {} is not supported; expected one of {SUPPORTED_ALGS}",
        quoted(alg)
    )))
}

#[cfg(test)]
mod tests {
    use super::super::JwtAuthenticator;
    use super::super::test_support::*;
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    #[test]
    fn valid_rs256_token_is_accepted() {
        let rsa = rsa_key();
        let ec = ec_key("ec-1");
        let auth = JwtAuthenticator::new(&cfg(), &jwks(&[&ec.jwk, &rsa.jwk]), td()).expect("authn");
        let c = with(claims(), "aud", json!("signet"));
        let caller = auth.authenticate(&sign_rs(&c), now()).expect("accepted");
        assert_eq!(
            caller.spiffe_id().to_string(),
            "spiffe://cluster.local/ns/default/sa/web"
        );
    }

    #[test]
    fn alg_none_is_refused() {
        let f = fixture();
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        let payload = URL_SAFE_NO_PAD.encode(claims().to_string());
        let token = format!("{header}.{payload}.");
        let msg = refused(&f.auth, &token);
        assert!(msg.contains("alg \"none\""), "{msg}");
        // Same with "None" and a kid naming a real key.
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"None","kid":"ec-1"}"#);
        let msg = refused(&f.auth, &format!("{header}.{payload}."));
        assert!(msg.contains("unsigned"), "{msg}");
    }

    #[test]
    fn hs256_with_the_public_key_as_secret_is_refused() {
        // Key confusion: an attacker HMACs the token with the (public) key bytes.
        let rsa = rsa_key();
        let auth = JwtAuthenticator::new(&cfg(), &jwks(&[&rsa.jwk]), td()).expect("authn");
        for secret in [
            rsa.jwk.to_string().into_bytes(),
            URL_SAFE_NO_PAD
                .decode(rsa.jwk["n"].as_str().expect("n"))
                .expect("n"),
        ] {
            let mut h = Header::new(Algorithm::HS256);
            h.kid = Some("rsa-1".into());
            let token = jsonwebtoken::encode(&h, &claims(), &EncodingKey::from_secret(&secret))
                .expect("sign");
            let msg = refused(&auth, &token);
            assert!(msg.contains("HMAC"), "{msg}");
        }
    }

    #[test]
    fn token_signed_by_another_key_is_refused() {
        let f = fixture();
        let stranger = ec_key("ec-1");
        // Same kid, different key.
        let msg = refused(&f.auth, &sign_es(&stranger, Some("ec-1"), &claims()));
        assert!(msg.contains("signature does not verify"), "{msg}");
        // Unknown kid.
        let msg = refused(&f.auth, &sign_es(&stranger, Some("ec-9"), &claims()));
        assert!(
            msg.contains("signed by a key that is not in the configured JWKS"),
            "{msg}"
        );
        // No kid.
        let msg = refused(&f.auth, &sign_es(&stranger, None, &claims()));
        assert!(
            msg.contains("signed by a key that is not in the configured JWKS"),
            "{msg}"
        );
        // RS256 token against an EC-only JWKS.
        let msg = refused(&f.auth, &sign_rs(&claims()));
        assert!(msg.contains("not in the configured JWKS"), "{msg}");
    }

    #[test]
    fn tampered_payload_is_refused() {
        let f = fixture();
        let token = sign_es(&f.key, Some("ec-1"), &claims());
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let evil = with(
            claims(),
            "sub",
            json!("system:serviceaccount:kube-system:admin"),
        );
        parts[1] = URL_SAFE_NO_PAD.encode(evil.to_string());
        let msg = refused(&f.auth, &parts.join("."));
        assert!(msg.contains("signature does not verify"), "{msg}");
    }

    #[test]
    fn garbage_and_oversize_are_refused() {
        let f = fixture();
        for token in [
            "",
            "garbage",
            "a.b",
            "a.b.c.d",
            "!!!.???.###",
            "eyJhbGciOiJFUzI1NiJ9.bm90IGpzb24.c2ln",
        ] {
            let err = f.auth.authenticate(token, now()).expect_err("refused");
            assert!(matches!(err, AuthnError::BadToken(_)), "{token}: {err:?}");
        }
        refused(&f.auth, "eyJhbGciOiJFUzI1NiJ9.bm90IGpzb24.c2lnbmF0dXJl");
        // Odd algorithm names (non-ASCII, unknown) are refused, not panicked on.
        for alg in ["H\u{e9}", "\u{e9}", "EdDSA", "RSA-OAEP", ""] {
            let header = URL_SAFE_NO_PAD.encode(json!({ "alg": alg }).to_string());
            let payload = URL_SAFE_NO_PAD.encode(claims().to_string());
            let msg = refused(&f.auth, &format!("{header}.{payload}.c2lnbmF0dXJl"));
            assert!(msg.contains("alg"), "{alg}: {msg}");
        }
        let huge = format!(
            "{}.{}.{}",
            "a".repeat(8000),
            "b".repeat(9000),
            "c".repeat(100)
        );
        let msg = refused(&f.auth, &huge);
        assert!(msg.contains("16384-byte limit"), "{msg}");
    }

    /// Unit checks of the header rules, each refusal by its reason.
    #[test]
    fn header_rules_name_each_refusal() {
        let reason = |r: Result<Algorithm, AuthnError>| match r {
            Ok(a) => panic!("accepted {a:?}"),
            Err(e) => e.to_string(),
        };
        for (name, alg) in [("RS256", Algorithm::RS256), ("ES384", Algorithm::ES384)] {
            assert_eq!(check_alg(Some(name)).expect(name), alg);
        }
        assert!(reason(check_alg(None)).contains("no alg"));
        for none in ["none", "NONE", "nOnE"] {
            assert!(reason(check_alg(Some(none))).contains("unsigned"), "{none}");
        }
        for hmac in ["HS256", "hs512", "Hs999"] {
            assert!(reason(check_alg(Some(hmac))).contains("HMAC"), "{hmac}");
        }
        for other in ["EdDSA", "rs256", "ES512", "RSA-OAEP"] {
            assert!(
                reason(check_alg(Some(other))).contains("is not supported"),
                "{other}"
            );
        }
        let names: Vec<&str> = SUPPORTED.iter().map(|a| alg_name(*a)).collect();
        assert_eq!(SUPPORTED_ALGS, names.join(", "));

        let header = |h: serde_json::Value| URL_SAFE_NO_PAD.encode(h.to_string());
        let jwe = format!("{}.a.b.c.d", header(json!({ "alg": "RSA-OAEP" })));
        let e = Jws::parse(&jwe).err().expect("refused");
        assert!(e.to_string().contains("(JWE) are not accepted"), "{e}");
        let crit = format!(
            "{}.e30.c2ln",
            header(json!({ "alg": "ES256", "crit": ["exp"] }))
        );
        let e = Jws::parse(&crit).err().expect("refused");
        assert!(
            e.to_string()
                .contains("marks 1 extension(s) critical (\"crit\")"),
            "{e}"
        );
        let unsigned = format!("{}.e30.", header(json!({ "alg": "ES256" })));
        let jws = Jws::parse(&unsigned).expect("shape and header are fine");
        let keys = KeySet::parse(&jwks(&[&ec_key("ec-1").jwk])).expect("keys");
        let e = jws.verify(&keys).err().expect("refused");
        assert_eq!(
            e.to_string(),
            "service-account token refused: token has no signature"
        );
    }

    /// Why `jsonwebtoken::decode_header` is not used (module doc): if a new version of the
    /// crate changes these, the choice can be made again.
    #[test]
    fn jsonwebtokens_decode_header_would_weaken_these_checks() {
        let token =
            |h: serde_json::Value| format!("{}.e30.c2ln", URL_SAFE_NO_PAD.encode(h.to_string()));
        // A critical extension passes unseen.
        let crit = token(json!({ "alg": "ES256", "crit": ["exp"] }));
        assert!(jsonwebtoken::decode_header(&crit).is_ok());
        assert!(Jws::parse(&crit).is_err());
        // `none` and HMAC are one anonymous error there; named refusals here.
        for alg in ["none", "hs256"] {
            let e = jsonwebtoken::decode_header(&token(json!({ "alg": alg })))
                .expect_err(alg)
                .to_string();
            assert!(!e.contains("HMAC") && !e.contains("unsigned"), "{e}");
        }
    }
}
