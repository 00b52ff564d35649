use super::*;
use crate::key::generate;

const NOW: i64 = 1_800_000_000;

fn claims(aud: &[&str]) -> JwtSvidClaims {
    JwtSvidClaims {
        subject: "spiffe://example.org/web".parse().unwrap(),
        audience: aud.iter().map(|a| a.to_string()).collect(),
        issued_at: NOW,
        expires_at: NOW + 300,
        issuer: None,
    }
}

fn ec_signer() -> JwtSigner {
    JwtSigner::new(&generate(KeyAlgorithm::EcdsaP256).unwrap()).unwrap()
}

fn set(signer: &JwtSigner) -> JwtKeySet {
    JwtKeySet::new([signer.public_key().clone()])
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

/// A token with this header and claims, signed by `signer` as its own algorithm would.
fn forged(signer: &JwtSigner, header: Value, body: Value) -> String {
    let input = format!("{}.{}", b64(&header), b64(&body));
    let rng = SystemRandom::new();
    let SigningKey::Ec(k) = &signer.key else {
        panic!("EC only")
    };
    let mut sig = k.sign(&rng, input.as_bytes()).unwrap().as_ref().to_vec();
    p256_low_s(&mut sig);
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
}

fn parts(token: &str) -> (Map<String, Value>, Map<String, Value>) {
    let mut it = token.split('.');
    let h = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(it.next().unwrap()).unwrap()).unwrap();
    let c = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(it.next().unwrap()).unwrap()).unwrap();
    (h, c)
}

#[test]
fn es256_tokens_carry_the_standard_header_and_claims_and_validate() {
    let s = ec_signer();
    let token = s.mint(&claims(&["vault"])).unwrap();
    let (h, c) = parts(&token);
    assert_eq!(h["alg"], "ES256");
    assert_eq!(h["typ"], "JWT");
    assert_eq!(h["kid"], s.key_id());
    assert_eq!(c["sub"], "spiffe://example.org/web");
    assert_eq!(c["aud"], "vault", "one audience is written as a string");
    assert_eq!(c["exp"], NOW + 300);
    assert_eq!(c["iat"], NOW);
    assert!(!c.contains_key("iss"));
    let v = validate(&token, "vault", &set(&s), NOW).unwrap();
    assert_eq!(v.spiffe_id.to_string(), "spiffe://example.org/web");
    assert_eq!(v.audience, ["vault"]);
    assert_eq!((v.expires_at, v.issued_at), (NOW + 300, Some(NOW)));
    assert_eq!(v.key_id, s.key_id());
    assert_eq!(s.key_id().len(), 32);
}

#[test]
fn several_audiences_are_an_array_and_each_validates() {
    let s = ec_signer();
    let mut c = claims(&["a", "b"]);
    c.issuer = Some("https://oidc.example.org".into());
    let token = s.mint(&c).unwrap();
    let (_, body) = parts(&token);
    assert_eq!(body["aud"], serde_json::json!(["a", "b"]));
    assert_eq!(body["iss"], "https://oidc.example.org");
    for aud in ["a", "b"] {
        validate(&token, aud, &set(&s), NOW).unwrap();
    }
    assert_eq!(
        validate(&token, "c", &set(&s), NOW),
        Err(JwtSvidError::WrongAudience("c".into()))
    );
}

#[test]
fn rs256_keys_sign_and_validate() {
    let key = generate(KeyAlgorithm::Rsa(2048)).unwrap();
    let s = JwtSigner::new(&key).unwrap();
    assert_eq!(s.alg(), JwtAlg::Rs256);
    let token = s.mint(&claims(&["aws"])).unwrap();
    assert_eq!(parts(&token).0["alg"], "RS256");
    validate(&token, "aws", &set(&s), NOW).unwrap();
    let jwk = s.public_key().jwk("sig").unwrap();
    assert_eq!(jwk["kty"], "RSA");
    assert_eq!(jwk["alg"], "RS256");
    assert_eq!(jwk["use"], "sig");
    assert_eq!(jwk["kid"], s.key_id());
}

#[test]
fn other_key_types_do_not_sign() {
    for alg in [KeyAlgorithm::EcdsaP384, KeyAlgorithm::Ed25519] {
        let err = JwtSigner::new(&generate(alg).unwrap()).unwrap_err();
        assert!(
            matches!(err, JwtKeyError::UnsupportedKey(_)),
            "{alg}: {err}"
        );
    }
}

#[test]
fn expiry_and_not_before_are_checked_against_now() {
    let s = ec_signer();
    let token = s.mint(&claims(&["x"])).unwrap();
    assert_eq!(
        validate(&token, "x", &set(&s), NOW + 300),
        Err(JwtSvidError::Expired)
    );
    validate(&token, "x", &set(&s), NOW + 299).unwrap();
    let hdr = serde_json::json!({"alg":"ES256","kid":s.key_id()});
    let early = forged(
        &s,
        hdr.clone(),
        serde_json::json!({"sub":"spiffe://example.org/w","aud":"x","exp":NOW+600,"nbf":NOW+LEEWAY_SECS+1}),
    );
    assert_eq!(
        validate(&early, "x", &set(&s), NOW),
        Err(JwtSvidError::NotYetValid)
    );
    let no_exp = forged(
        &s,
        hdr,
        serde_json::json!({"sub":"spiffe://example.org/w","aud":"x"}),
    );
    assert!(matches!(
        validate(&no_exp, "x", &set(&s), NOW),
        Err(JwtSvidError::Claims(_))
    ));
}

#[test]
fn alg_none_and_hmac_with_the_public_key_are_refused_by_name() {
    let s = ec_signer();
    let body = serde_json::json!({"sub":"spiffe://example.org/admin","aud":"x","exp":NOW+60});
    let none = format!(
        "{}.{}.",
        b64(&serde_json::json!({"alg":"none","kid":s.key_id()})),
        b64(&body)
    );
    assert_eq!(
        validate(&none, "x", &set(&s), NOW),
        Err(JwtSvidError::AlgRefused("none".into()))
    );
    // HS256 keyed with the published public key (the classic confusion).
    let input = format!(
        "{}.{}",
        b64(&serde_json::json!({"alg":"HS256","kid":s.key_id()})),
        b64(&body)
    );
    let mac = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, s.public_key().spki_der()),
        input.as_bytes(),
    );
    let hs = format!("{input}.{}", URL_SAFE_NO_PAD.encode(mac.as_ref()));
    assert_eq!(
        validate(&hs, "x", &set(&s), NOW),
        Err(JwtSvidError::AlgRefused("HS256".into()))
    );
    for alg in ["NONE", "hs512"] {
        let t = format!(
            "{}.{}.AA",
            b64(&serde_json::json!({"alg":alg,"kid":"k"})),
            b64(&body)
        );
        assert!(matches!(
            validate(&t, "x", &set(&s), NOW),
            Err(JwtSvidError::AlgRefused(_))
        ));
    }
    let t = format!(
        "{}.{}.AA",
        b64(&serde_json::json!({"alg":"EdDSA","kid":"k"})),
        b64(&body)
    );
    assert!(matches!(
        validate(&t, "x", &set(&s), NOW),
        Err(JwtSvidError::AlgUnsupported(_))
    ));
}

#[test]
fn the_key_is_chosen_by_kid_and_must_fit_the_alg() {
    let s = ec_signer();
    let other = ec_signer();
    let token = other.mint(&claims(&["x"])).unwrap();
    assert!(matches!(
        validate(&token, "x", &set(&s), NOW),
        Err(JwtSvidError::UnknownKey(_))
    ));
    // Another key's signature under this key's kid.
    let hdr = serde_json::json!({"alg":"ES256","kid":s.key_id()});
    let body = serde_json::json!({"sub":"spiffe://example.org/w","aud":"x","exp":NOW+60});
    let stolen_kid = forged(&other, hdr, body.clone());
    assert_eq!(
        validate(&stolen_kid, "x", &set(&s), NOW),
        Err(JwtSvidError::BadSignature)
    );
    // RS256 named on an EC key.
    let rs = forged(
        &s,
        serde_json::json!({"alg":"RS256","kid":s.key_id()}),
        body.clone(),
    );
    assert!(matches!(
        validate(&rs, "x", &set(&s), NOW),
        Err(JwtSvidError::AlgMismatch { .. })
    ));
    // No kid.
    let anon = forged(&s, serde_json::json!({"alg":"ES256"}), body);
    assert_eq!(
        validate(&anon, "x", &set(&s), NOW),
        Err(JwtSvidError::NoKeyId)
    );
}

#[test]
fn claims_are_not_read_before_the_signature_verifies() {
    let s = ec_signer();
    let token = s.mint(&claims(&["x"])).unwrap();
    let (h, _, sig) = {
        let mut it = token.split('.');
        (it.next().unwrap(), it.next().unwrap(), it.next().unwrap())
    };
    let garbage = format!("{h}.{}.{sig}", URL_SAFE_NO_PAD.encode("not json"));
    assert_eq!(
        validate(&garbage, "x", &set(&s), NOW),
        Err(JwtSvidError::BadSignature)
    );
}

#[test]
fn malformed_tokens_are_refused_with_the_rule_they_break() {
    let s = ec_signer();
    let token = s.mint(&claims(&["x"])).unwrap();
    let k = set(&s);
    assert_eq!(validate("", "x", &k, NOW), Err(JwtSvidError::Empty));
    assert_eq!(
        validate(&"a".repeat(MAX_TOKEN_BYTES + 1), "x", &k, NOW),
        Err(JwtSvidError::TooLong)
    );
    assert!(matches!(
        validate(&format!("{token}.x.y"), "x", &k, NOW),
        Err(JwtSvidError::Malformed(_))
    ));
    assert!(matches!(
        validate("a.b", "x", &k, NOW),
        Err(JwtSvidError::Malformed(_))
    ));
    assert!(matches!(
        validate(&format!("{token}="), "x", &k, NOW),
        Err(JwtSvidError::Malformed(_))
    ));
    let body = serde_json::json!({"sub":"spiffe://example.org/w","aud":"x","exp":NOW+60});
    for (hdr, why) in [
        (
            serde_json::json!({"alg":"ES256","kid":s.key_id(),"typ":"at+jwt"}),
            "typ",
        ),
        (
            serde_json::json!({"alg":"ES256","kid":s.key_id(),"crit":["b64"]}),
            "crit",
        ),
    ] {
        let t = forged(&s, hdr, body.clone());
        assert!(
            matches!(validate(&t, "x", &k, NOW), Err(JwtSvidError::Header(_))),
            "{why}"
        );
    }
    let not_spiffe = forged(
        &s,
        serde_json::json!({"alg":"ES256","kid":s.key_id()}),
        serde_json::json!({"sub":"https://example.org/w","aud":"x","exp":NOW+60}),
    );
    assert!(matches!(
        validate(&not_spiffe, "x", &k, NOW),
        Err(JwtSvidError::Claims(_))
    ));
}

#[test]
fn refusals_quote_hostile_text_cut_and_escaped() {
    let s = ec_signer();
    let hostile = format!("\u{1b}[31m{}", "k".repeat(5000));
    let t = forged(
        &s,
        serde_json::json!({"alg":"ES256","kid":hostile}),
        serde_json::json!({"sub":"spiffe://example.org/w","aud":"x","exp":NOW+60}),
    );
    let msg = validate(&t, "x", &set(&s), NOW).unwrap_err().to_string();
    assert!(msg.len() < 600 && !msg.contains('\u{1b}'), "{msg}");
}

#[test]
fn debug_never_prints_key_material() {
    let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
    let s = JwtSigner::new(&key).unwrap();
    let shown = format!("{s:?} {:?}", s.public_key());
    assert!(shown.contains(s.key_id()));
    assert!(!shown.contains(&URL_SAFE_NO_PAD.encode(key.pkcs8_der())[..16]));
    let jwk = s.public_key().jwk("jwt-svid").unwrap();
    assert_eq!(
        (jwk["use"].as_str(), jwk["alg"].as_str()),
        (Some("jwt-svid"), Some("ES256"))
    );
    assert!(!jwk.contains_key("d"));
}

/// Review finding F4: ECDSA is malleable, so (r, n − s) is a second valid signature of a
/// genuine token, with another hash than the ledger's. Signet signs only low-S and refuses the
/// mirrored form.
#[test]
fn es256_signatures_are_low_s_and_their_mirror_is_refused() {
    let s = ec_signer();
    for _ in 0..64 {
        let token = s.mint(&claims(&["vault"])).unwrap();
        let (input, sig) = token.rsplit_once('.').unwrap();
        let sig = URL_SAFE_NO_PAD.decode(sig).unwrap();
        assert!(!p256_is_high_s(&sig), "a high-S signature was issued");
        // Its mirror: s ← n − s (high, as the low one's mirror always is).
        let mut mirror = sig.clone();
        let mut borrow = 0i16;
        for i in (32..64).rev() {
            let d = i16::from(P256_N[i - 32]) - i16::from(sig[i]) - borrow;
            borrow = i16::from(d < 0);
            mirror[i] = d.rem_euclid(256) as u8;
        }
        assert!(p256_is_high_s(&mirror));
        let mut back = mirror.clone();
        p256_low_s(&mut back);
        assert_eq!(back, sig, "n − (n − s) = s");
        let mirrored = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&mirror));
        // The mirror verifies as a signature (that is the malleability) ...
        assert!(
            s.public_key()
                .verify(JwtAlg::Es256, input.as_bytes(), &mirror)
        );
        // ... and is refused by name.
        assert_eq!(
            validate(&mirrored, "vault", &set(&s), NOW).unwrap_err(),
            JwtSvidError::HighS
        );
        validate(&token, "vault", &set(&s), NOW).unwrap();
    }
}
