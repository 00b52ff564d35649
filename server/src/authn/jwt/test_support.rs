//! Test fixtures shared by the JWT modules' tests: keys (EC made with ring, RSA with openssl
//! once per run), a JWKS, service-account claims at a fixed `NOW`, signing, and [`refused`],
//! which also checks that a refusal never repeats the token.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use signet_types::TrustDomain;

use super::JwtAuthenticator;
use crate::authn::AuthnError;
use crate::config::KubernetesAuthConfig;

pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// 2026-01-01T00:00:00Z
pub const NOW: u64 = 1_767_225_600;

pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

pub fn td() -> TrustDomain {
    TrustDomain::new("cluster.local").expect("td")
}

pub fn cfg() -> KubernetesAuthConfig {
    KubernetesAuthConfig {
        issuer: ISSUER.into(),
        jwks_file: PathBuf::from("/unused"),
        audiences: vec!["istio-ca".into(), "signet".into()],
        leeway: Duration::from_secs(30),
        jwks_refresh: Duration::from_secs(10),
    }
}

pub struct EcKey {
    pub pkcs8: Vec<u8>,
    pub jwk: Value,
}

pub fn ec_key(kid: &str) -> EcKey {
    let rng = SystemRandom::new();
    let pkcs8 =
        EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("generate");
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .expect("parse");
    let point = pair.public_key().as_ref();
    assert_eq!(point.len(), 65);
    let jwk = json!({
        "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
        "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
        "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
    });
    EcKey {
        pkcs8: pkcs8.as_ref().to_vec(),
        jwk,
    }
}

pub struct RsaKey {
    pub pem: Vec<u8>,
    pub jwk: Value,
}

/// A 2048-bit RSA key made by openssl once per test run (real clusters sign RS256).
pub fn rsa_key() -> &'static RsaKey {
    static KEY: OnceLock<RsaKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let key_path = dir.path().join("key.pem");
        let status = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&key_path)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run openssl");
        assert!(status.success());
        let out = std::process::Command::new("openssl")
            .args(["pkey", "-pubout", "-outform", "DER", "-in"])
            .arg(&key_path)
            .output()
            .expect("run openssl");
        assert!(out.status.success());
        let public = signet_pki::bundle::spki_jwk(&out.stdout).expect("a JWK");
        assert_eq!(public["kty"], "RSA");
        let jwk = json!({
            "kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256",
            "n": public["n"], "e": public["e"],
        });
        RsaKey {
            pem: std::fs::read(&key_path).expect("read key"),
            jwk,
        }
    })
}

pub fn jwks(keys: &[&Value]) -> String {
    json!({ "keys": keys }).to_string()
}

pub fn claims() -> Value {
    json!({
        "iss": ISSUER,
        "sub": "system:serviceaccount:default:web",
        "aud": ["istio-ca"],
        "exp": NOW + 3600,
        "iat": NOW - 60,
        "nbf": NOW - 60,
        "kubernetes.io": {
            "namespace": "default",
            "serviceaccount": { "name": "web", "uid": "8c1f" },
            "pod": { "name": "web-7d9f", "uid": "a1b2" },
        },
    })
}

pub fn sign_es(key: &EcKey, kid: Option<&str>, claims: &Value) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&h, claims, &EncodingKey::from_ec_der(&key.pkcs8)).expect("sign")
}

pub fn sign_rs(claims: &Value) -> String {
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some("rsa-1".into());
    let key = EncodingKey::from_rsa_pem(&rsa_key().pem).expect("rsa key");
    jsonwebtoken::encode(&h, claims, &key).expect("sign")
}

pub struct Fixture {
    pub key: EcKey,
    pub auth: JwtAuthenticator,
}

pub fn fixture() -> Fixture {
    let key = ec_key("ec-1");
    let auth = JwtAuthenticator::new(&cfg(), &jwks(&[&key.jwk]), td()).expect("authn");
    Fixture { key, auth }
}

/// Runs `authenticate` expecting a refusal; checks the message never contains the token.
pub fn refused(auth: &JwtAuthenticator, token: &str) -> String {
    let err = auth.authenticate(token, now()).expect_err("refused");
    let msg = err.to_string();
    assert!(matches!(err, AuthnError::BadToken(_)), "{err:?}");
    assert!(!msg.contains(token), "message contains the token: {msg}");
    for part in token.split('.').filter(|p| p.len() > 8) {
        assert!(!msg.contains(part), "message contains a token part: {msg}");
    }
    msg
}

pub fn with(mut c: Value, key: &str, v: Value) -> Value {
    c[key] = v;
    c
}

pub fn without(mut c: Value, key: &str) -> Value {
    c.as_object_mut().expect("object").remove(key);
    c
}
