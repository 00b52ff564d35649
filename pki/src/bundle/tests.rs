use serde_json::json;

use super::*;

fn root(alg: &'static rcgen::SignatureAlgorithm) -> (ParsedCert, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate_for(alg).unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let der = p.self_signed(&key).unwrap().der().to_vec();
    (ParsedCert::from_der(&der).unwrap(), key)
}

fn jwt() -> JwtAuthority {
    let jwk = json!({"kty": "EC", "crv": "P-256", "x": "AAAA", "y": "BBBB"});
    JwtAuthority {
        key_id: "k1".into(),
        jwk: jwk.as_object().unwrap().clone(),
    }
}

#[test]
fn a_bundle_round_trips_through_its_document() {
    let (p256, k256) = root(&rcgen::PKCS_ECDSA_P256_SHA256);
    let (p384, _) = root(&rcgen::PKCS_ECDSA_P384_SHA384);
    let (ed, ked) = root(&rcgen::PKCS_ED25519);
    let bundle = SpiffeBundle {
        x509_authorities: vec![p256.clone(), p384, ed],
        jwt_authorities: vec![jwt()],
        sequence: Some(1_800_000_000),
        refresh_hint: Some(Duration::from_secs(300)),
    };
    let doc = bundle.to_json().unwrap();
    let mut members: Vec<&str> = doc
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    members.sort_unstable();
    assert_eq!(members, ["keys", "spiffe_refresh_hint", "spiffe_sequence"]);
    let k = &doc["keys"][0];
    assert_eq!(k["use"], "x509-svid");
    assert_eq!(k["kty"], "EC");
    assert_eq!(k["crv"], "P-256");
    assert_eq!(
        STANDARD.decode(k["x5c"][0].as_str().unwrap()).unwrap(),
        p256.der()
    );
    let x = URL_SAFE_NO_PAD.decode(k["x"].as_str().unwrap()).unwrap();
    let y = URL_SAFE_NO_PAD.decode(k["y"].as_str().unwrap()).unwrap();
    assert_eq!([&[4u8][..], &x, &y].concat(), k256.public_key_raw());
    assert_eq!(doc["keys"][1]["crv"], "P-384");
    assert_eq!(doc["keys"][2]["kty"], "OKP");
    assert_eq!(
        URL_SAFE_NO_PAD
            .decode(doc["keys"][2]["x"].as_str().unwrap())
            .unwrap(),
        ked.public_key_raw()
    );
    assert_eq!(doc["keys"][3]["use"], "jwt-svid");
    assert_eq!(doc["keys"][3]["kid"], "k1");
    let back = SpiffeBundle::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(back, bundle);
    // Neither SPIFFE member set: neither written; an empty bundle is a document.
    let empty = SpiffeBundle::default().to_json().unwrap();
    assert_eq!(empty, json!({"keys": []}));
    assert_eq!(
        SpiffeBundle::parse(empty.to_string().as_bytes()).unwrap(),
        SpiffeBundle::default()
    );
}

#[test]
fn what_is_not_a_spiffe_bundle_is_refused() {
    let (r, _) = root(&rcgen::PKCS_ECDSA_P256_SHA256);
    let (other, _) = root(&rcgen::PKCS_ECDSA_P256_SHA256);
    let good = x509_svid_jwk(&r).unwrap();
    let parse = |doc: Value| SpiffeBundle::parse(doc.to_string().as_bytes());
    assert!(matches!(
        SpiffeBundle::parse(b"{"),
        Err(BundleError::Json(_))
    ));
    assert!(matches!(parse(json!([])), Err(BundleError::Shape(_))));
    assert!(matches!(parse(json!({})), Err(BundleError::Shape(_))));
    assert!(matches!(
        parse(json!({"keys": [], "spiffe_sequence": -1})),
        Err(BundleError::Shape(_))
    ));
    assert!(matches!(
        parse(json!({"keys": [], "spiffe_refresh_hint": "300"})),
        Err(BundleError::Shape(_))
    ));
    assert_eq!(
        SpiffeBundle::parse(&vec![b' '; MAX_DOCUMENT_BYTES + 1]),
        Err(BundleError::TooLarge)
    );
    let many: Vec<Value> = (0..=MAX_KEYS).map(|_| json!({"use": "other"})).collect();
    assert_eq!(
        parse(json!({ "keys": many })),
        Err(BundleError::TooManyKeys)
    );
    let refused = |key: Value| {
        let e = parse(json!({ "keys": [key] })).unwrap_err();
        assert!(matches!(e, BundleError::Key { index: 0, .. }), "{e}");
        e.to_string()
    };
    // x5c: exactly one certificate, base64, a certificate, whose key the JWK states.
    let mut two = good.clone();
    two["x5c"] = json!([good["x5c"][0], good["x5c"][0]]);
    assert!(refused(two).contains("exactly one"));
    let mut none = good.clone();
    none.as_object_mut().unwrap().remove("x5c");
    refused(none);
    let mut bad64 = good.clone();
    bad64["x5c"] = json!(["%%%"]);
    refused(bad64);
    let mut junk = good.clone();
    junk["x5c"] = json!([STANDARD.encode(b"junk")]);
    refused(junk);
    let mut swapped = good.clone();
    swapped["x5c"] = x509_svid_jwk(&other).unwrap()["x5c"].clone();
    assert!(refused(swapped).contains("\"x\""));
    let mut no_kty = good.clone();
    no_kty.as_object_mut().unwrap().remove("kty");
    refused(no_kty);
    // jwt-svid: a kid, unique, and a kty.
    refused(json!({"use": "jwt-svid", "kty": "EC"}));
    refused(json!({"use": "jwt-svid", "kid": "", "kty": "EC"}));
    refused(json!({"use": "jwt-svid", "kid": "a"}));
    let e = parse(json!({"keys": [
        {"use": "jwt-svid", "kid": "a", "kty": "EC"},
        {"use": "jwt-svid", "kid": "a", "kty": "EC"},
    ]}))
    .unwrap_err();
    assert!(matches!(e, BundleError::Key { index: 1, .. }), "{e}");
    refused(json!("not an object"));
    // Unknown or missing use: ignored.
    let b = parse(json!({"keys": [{"use": "enc", "kty": "EC"}, {"kty": "EC"}, good]})).unwrap();
    assert_eq!(b.x509_authorities, [r]);
}

#[test]
fn rsa_roots_are_rsa_keys() {
    let key = crate::key::generate(crate::key::KeyAlgorithm::Rsa(2048)).unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let der = p
        .self_signed(&key.key_pair().unwrap())
        .unwrap()
        .der()
        .to_vec();
    let cert = ParsedCert::from_der(&der).unwrap();
    let jwk = x509_svid_jwk(&cert).unwrap();
    assert_eq!(jwk["kty"], "RSA");
    assert_eq!(jwk["e"], "AQAB");
    let n = URL_SAFE_NO_PAD.decode(jwk["n"].as_str().unwrap()).unwrap();
    assert_eq!(n.len(), 256, "no leading zero byte");
    let doc = json!({"keys": [jwk]});
    let b = SpiffeBundle::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(b.x509_authorities, [cert]);
}

#[test]
fn a_bare_public_key_has_the_same_jwk_and_must_be_exactly_one() {
    for alg in [
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_ED25519,
    ] {
        let (cert, _) = root(alg);
        assert_eq!(
            spki_jwk(cert.spki_der()).unwrap(),
            public_jwk(&cert).unwrap()
        );
        let mut trailing = cert.spki_der().to_vec();
        trailing.push(0);
        assert!(matches!(
            spki_jwk(&trailing),
            Err(BundleError::NoJwkForm(_))
        ));
    }
    assert!(spki_jwk(b"not DER").is_err());
}
