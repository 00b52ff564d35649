//! [`JwtPublicKey::from_jwk`]: JWKs written by [`spki_jwk`] read back to the same key, and the
//! refusals.

use super::*;
use crate::key::generate;
use serde_json::json;

const NOW: i64 = 1_800_000_000;

fn spki_of(alg: KeyAlgorithm) -> Vec<u8> {
    generate(alg).unwrap().public_key_der().unwrap()
}

fn jwk_of(spki: &[u8]) -> Map<String, Value> {
    spki_jwk(spki).unwrap()
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

#[test]
fn ec_and_rsa_keys_round_trip_through_their_jwk() {
    for alg in [
        KeyAlgorithm::EcdsaP256,
        KeyAlgorithm::EcdsaP384,
        KeyAlgorithm::Rsa(2048),
    ] {
        let spki = spki_of(alg);
        let key = JwtPublicKey::from_jwk("k1", &jwk_of(&spki)).unwrap();
        assert_eq!(key.spki_der(), spki, "{alg}: the same SubjectPublicKeyInfo");
        assert_eq!(key.key_id(), "k1");
        assert_eq!(key.alg(), None, "{alg}: no alg stated");
        assert_eq!(key, JwtPublicKey::from_spki("k1", None, &spki).unwrap());
    }
}

#[test]
fn a_stated_alg_is_kept_and_must_fit_the_key() {
    let spki = spki_of(KeyAlgorithm::EcdsaP384);
    let mut jwk = jwk_of(&spki);
    jwk.insert("alg".into(), "ES384".into());
    let key = JwtPublicKey::from_jwk("k", &jwk).unwrap();
    assert_eq!(key.alg(), Some(JwtAlg::Es384));

    jwk.insert("alg".into(), "ES256".into());
    assert!(
        matches!(JwtPublicKey::from_jwk("k", &jwk), Err(JwtKeyError::UnsupportedKey(m)) if m.contains("ES256")),
        "a P-384 key stated as ES256"
    );
    jwk.insert("alg".into(), "RS256".into());
    assert!(matches!(
        JwtPublicKey::from_jwk("k", &jwk),
        Err(JwtKeyError::UnsupportedKey(_))
    ));
    jwk.insert("alg".into(), "EdDSA".into());
    let err = JwtPublicKey::from_jwk("k", &jwk).unwrap_err();
    assert!(err.to_string().contains("EdDSA"), "{err}");
    jwk.insert("alg".into(), json!(7));
    assert!(matches!(
        JwtPublicKey::from_jwk("k", &jwk),
        Err(JwtKeyError::Jwk(_))
    ));
}

#[test]
fn tokens_minted_by_a_signer_validate_with_the_key_read_from_its_jwk() {
    for alg in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Rsa(2048)] {
        let signer = JwtSigner::new(&generate(alg).unwrap()).unwrap();
        let mut jwk = signer.public_key().jwk("jwt-svid").unwrap();
        // As `SpiffeBundle::parse` hands it over.
        jwk.remove("use");
        jwk.remove("kid");
        let key = JwtPublicKey::from_jwk(signer.key_id(), &jwk).unwrap();
        assert_eq!(key.alg(), Some(signer.alg()));
        assert_eq!(&key, signer.public_key());
        let token = signer
            .mint(&JwtSvidClaims {
                subject: "spiffe://other.org/web".parse().unwrap(),
                audience: vec!["db".into()],
                issued_at: NOW,
                expires_at: NOW + 60,
                issuer: None,
            })
            .unwrap();
        let v = validate(&token, "db", &JwtKeySet::new([key]), NOW).unwrap();
        assert_eq!(v.spiffe_id.to_string(), "spiffe://other.org/web");
        assert_eq!(v.key_id, signer.key_id());
    }
}

#[test]
fn rsa_moduli_with_a_leading_zero_octet_read_the_same() {
    let spki = spki_of(KeyAlgorithm::Rsa(2048));
    let mut jwk = jwk_of(&spki);
    let n = URL_SAFE_NO_PAD.decode(jwk["n"].as_str().unwrap()).unwrap();
    assert!(n[0] & 0x80 != 0, "a 2048-bit modulus has its top bit set");
    let padded = [&[0u8][..], &n].concat();
    jwk.insert("n".into(), URL_SAFE_NO_PAD.encode(padded).into());
    let key = JwtPublicKey::from_jwk("k", &jwk).unwrap();
    assert_eq!(key.spki_der(), spki);
}

#[test]
fn malformed_and_unsupported_jwks_are_refused() {
    let ec = jwk_of(&spki_of(KeyAlgorithm::EcdsaP256));
    let x = ec["x"].as_str().unwrap().to_owned();
    let refused = |jwk: &Map<String, Value>| JwtPublicKey::from_jwk("k", jwk).unwrap_err();

    let mut short = ec.clone();
    let mut x31 = URL_SAFE_NO_PAD.decode(&x).unwrap();
    x31.remove(0);
    short.insert("x".into(), URL_SAFE_NO_PAD.encode(&x31).into());
    let e = refused(&short);
    assert!(
        matches!(&e, JwtKeyError::Jwk(m) if m.contains("32 bytes")),
        "short x: {e}"
    );

    // A P-256 point given as P-384: the lengths do not fit.
    let mut wrong_curve = ec.clone();
    wrong_curve.insert("crv".into(), "P-384".into());
    assert!(matches!(refused(&wrong_curve), JwtKeyError::Jwk(_)));

    for bad in [
        format!("{x}="),
        format!("{x}!"),
        x.replace('_', "/").replace('-', "+") + "+/",
    ] {
        let mut b = ec.clone();
        b.insert("x".into(), bad.clone().into());
        let e = refused(&b);
        assert!(
            matches!(&e, JwtKeyError::Jwk(m) if m.contains("base64url")),
            "x {bad:?}: {e}"
        );
    }

    let mut no_kty = ec.clone();
    no_kty.remove("kty");
    assert_eq!(refused(&no_kty), JwtKeyError::Jwk("no kty".into()));
    let mut no_y = ec.clone();
    no_y.remove("y");
    assert_eq!(refused(&no_y), JwtKeyError::Jwk("no y".into()));

    // ring will not make an RSA-1024 key; any odd 1024-bit number stands for its modulus.
    let mut n1024 = vec![0xc5u8; 128];
    n1024[127] = 0x01;
    let rsa1024 = obj(json!({"kty": "RSA", "n": URL_SAFE_NO_PAD.encode(&n1024), "e": "AQAB"}));
    let e = refused(&rsa1024);
    assert!(
        matches!(&e, JwtKeyError::UnsupportedKey(m) if m.contains("RSA-1024")),
        "{e}"
    );

    let okp = jwk_of(&spki_of(KeyAlgorithm::Ed25519));
    let e = refused(&okp);
    assert!(
        matches!(&e, JwtKeyError::UnsupportedKey(m) if m.contains("OKP") && m.contains("Ed25519")),
        "{e}"
    );
    let p521 = obj(json!({"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"}));
    assert!(matches!(&refused(&p521), JwtKeyError::UnsupportedKey(m) if m.contains("P-521")));
    let oct = obj(json!({"kty": "oct", "k": "c2VjcmV0"}));
    assert!(matches!(&refused(&oct), JwtKeyError::UnsupportedKey(m) if m.contains("oct")));
    let zero_e = obj(json!({"kty": "RSA", "n": rsa_n_2048(), "e": "AA"}));
    assert!(matches!(refused(&zero_e), JwtKeyError::Jwk(_)));
    let kty_number = obj(json!({"kty": 1}));
    assert!(matches!(refused(&kty_number), JwtKeyError::Jwk(_)));
    assert_eq!(
        JwtPublicKey::from_jwk("", &ec).unwrap_err(),
        JwtKeyError::EmptyKeyId
    );
}

/// Some 2048-bit modulus, base64url.
fn rsa_n_2048() -> String {
    let spki = spki_of(KeyAlgorithm::Rsa(2048));
    jwk_of(&spki)["n"].as_str().unwrap().to_owned()
}
