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
