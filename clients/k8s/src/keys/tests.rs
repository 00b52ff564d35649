use super::*;

fn parse(alg: Option<&str>, size: Option<i64>) -> Result<KeySpec, UnsupportedKey> {
    KeySpec::parse(alg, size, None, None)
}

#[test]
fn spec_defaults_to_ecdsa_p256_pkcs1_always() {
    assert_eq!(parse(None, None).unwrap(), KeySpec::default());
    assert_eq!(
        KeySpec::parse(Some("RSA"), None, Some("PKCS8"), Some("Never")).unwrap(),
        KeySpec {
            algorithm: KeyAlgorithm::Rsa(2048),
            encoding: KeyEncoding::Pkcs8,
            rotation: RotationPolicy::Never
        }
    );
}

#[test]
fn spec_accepts_what_signet_can_issue() {
    assert_eq!(
        parse(Some("ECDSA"), Some(384)).unwrap().algorithm,
        KeyAlgorithm::EcdsaP384
    );
    assert_eq!(
        parse(Some("Ed25519"), Some(999)).unwrap().algorithm,
        KeyAlgorithm::Ed25519
    );
    for n in [2048, 3072, 4096] {
        assert_eq!(
            parse(Some("RSA"), Some(n)).unwrap().algorithm,
            KeyAlgorithm::Rsa(n as u32)
        );
    }
}

#[test]
fn spec_refuses_with_a_message_naming_the_fix() {
    let e = parse(Some("ECDSA"), Some(521)).unwrap_err();
    assert!(e.0.contains("P-521") && e.0.contains("256 or 384"), "{e}");
    let e = parse(Some("RSA"), Some(1024)).unwrap_err();
    assert!(e.0.contains("1024") && e.0.contains("2048"), "{e}");
    let e = parse(Some("RSA"), Some(8192)).unwrap_err();
    assert!(e.0.contains("8192"), "{e}");
    let e = parse(Some("DSA"), None).unwrap_err();
    assert!(e.0.contains("\"DSA\""), "{e}");
    assert!(KeySpec::parse(None, None, Some("PEM"), None).is_err());
    assert!(KeySpec::parse(None, None, None, Some("Sometimes")).is_err());
}

#[test]
fn ecdsa_keys_round_trip_through_both_encodings() {
    for alg in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP384] {
        let key = generate(alg).unwrap();
        let sec1 = key.to_pem(KeyEncoding::Pkcs1).unwrap();
        assert!(
            sec1.starts_with("-----BEGIN EC PRIVATE KEY-----\n"),
            "{sec1}"
        );
        assert!(!sec1.contains('\r'));
        let pkcs8 = key.to_pem(KeyEncoding::Pkcs8).unwrap();
        assert!(pkcs8.starts_with("-----BEGIN PRIVATE KEY-----"));
        let back = PrivateKey::from_pem(sec1.as_bytes()).unwrap();
        assert_eq!(back.algorithm(), alg);
        assert_eq!(
            back.public_key_der().unwrap(),
            key.public_key_der().unwrap()
        );
        let back = PrivateKey::from_pem(pkcs8.as_bytes()).unwrap();
        assert_eq!(back, key);
    }
}

#[test]
fn sec1_output_carries_the_curve_for_openssl() {
    let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
    let pem = key.to_pem(KeyEncoding::Pkcs1).unwrap();
    let der = ::pem::parse(pem).unwrap().into_contents();
    assert_eq!(sec1_curve(&der).unwrap(), OID_P256);
}

#[test]
fn ed25519_is_always_pkcs8() {
    let key = generate(KeyAlgorithm::Ed25519).unwrap();
    let pem = key.to_pem(KeyEncoding::Pkcs1).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    assert_eq!(
        PrivateKey::from_pem(pem.as_bytes()).unwrap().algorithm(),
        KeyAlgorithm::Ed25519
    );
}

#[test]
fn rsa_keys_are_generated_and_read_back_with_their_size() {
    let key = generate(KeyAlgorithm::Rsa(2048)).unwrap();
    let pkcs1 = key.to_pem(KeyEncoding::Pkcs1).unwrap();
    assert!(pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    let back = PrivateKey::from_pem(pkcs1.as_bytes()).unwrap();
    assert_eq!(back.algorithm(), KeyAlgorithm::Rsa(2048));
    assert_eq!(back, key);
    let csr = build_csr(&key, &names()).unwrap();
    assert!(csr.contains("CERTIFICATE REQUEST"));
}

#[test]
fn garbage_is_not_a_key() {
    assert!(PrivateKey::from_pem(b"nope").is_err());
    let bad = ::pem::encode(&::pem::Pem::new(
        "EC PRIVATE KEY",
        vec![0x30, 0x03, 0x02, 0x01],
    ));
    assert!(PrivateKey::from_pem(bad.as_bytes()).is_err());
}

fn names() -> CsrNames {
    CsrNames {
        spiffe_id: "spiffe://example.org/ns/a/sa/web".into(),
        dns_names: vec!["web.a.svc".into()],
        common_name: Some("web".into()),
    }
}

#[test]
fn csr_carries_the_spiffe_id_dns_names_and_common_name() {
    let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
    let pem = build_csr(&key, &names()).unwrap();
    let der = ::pem::parse(pem).unwrap().into_contents();
    use x509_parser::prelude::*;
    let (_, csr) = X509CertificationRequest::from_der(&der).unwrap();
    csr.verify_signature().unwrap();
    let mut uris = Vec::new();
    let mut dns = Vec::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for n in &san.general_names {
                match n {
                    GeneralName::URI(u) => uris.push(u.to_string()),
                    GeneralName::DNSName(d) => dns.push(d.to_string()),
                    _ => {}
                }
            }
        }
    }
    assert_eq!(uris, ["spiffe://example.org/ns/a/sa/web"]);
    assert_eq!(dns, ["web.a.svc"]);
    let cn: Vec<_> = csr
        .certification_request_info
        .subject
        .iter_common_name()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(cn, ["web"]);
    assert_eq!(
        format!("{key:?}"),
        "PrivateKey { algorithm: EcdsaP256, der: \"…\" }"
    );
}
