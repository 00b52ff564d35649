use super::*;
use crate::csr::{CsrNames, build_csr};
use rsa::pkcs8::der::Decode;

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
    let curve = sec1::EcPrivateKey::from_der(&der)
        .unwrap()
        .parameters
        .and_then(|p| p.named_curve());
    assert_eq!(curve, Some(OID_P256));
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

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Moved from the server's `ca::authority` (`sec1_keys_name_their_curve`) when its own SEC1
/// reader was replaced by this importer: OpenSSL's SEC1 keys name their curve and read as that
/// curve; what is not an `ECPrivateKey` is refused.
#[test]
fn sec1_keys_name_their_curve() {
    for (name, alg) in [
        ("prime256v1", KeyAlgorithm::EcdsaP256),
        ("secp384r1", KeyAlgorithm::EcdsaP384),
    ] {
        let key_pem = openssl(&["ecparam", "-name", name, "-genkey", "-noout"]);
        let block = ::pem::parse(&key_pem).expect("pem");
        assert_eq!(block.tag(), "EC PRIVATE KEY");
        let key = PrivateKey::from_pem(&key_pem).expect(name);
        assert_eq!(key.algorithm(), alg, "{name}");
        // Without -noout openssl writes EC PARAMETERS first: skipped.
        let with_params = openssl(&["ecparam", "-name", name, "-genkey"]);
        assert!(String::from_utf8_lossy(&with_params).starts_with("-----BEGIN EC PARAMETERS"));
        assert_eq!(
            PrivateKey::from_pem(&with_params).expect(name).algorithm(),
            alg
        );
    }
    let sec1 = |der: Vec<u8>| ::pem::encode(&::pem::Pem::new("EC PRIVATE KEY", der));
    assert!(PrivateKey::from_pem(sec1(b"not der".to_vec()).as_bytes()).is_err());
    // A PKCS#8 document is not an ECPrivateKey.
    let pkcs8 = generate(KeyAlgorithm::EcdsaP256)
        .unwrap()
        .pkcs8_der()
        .to_vec();
    assert!(PrivateKey::from_pem(sec1(pkcs8).as_bytes()).is_err());
}

#[test]
fn a_sec1_key_must_name_a_supported_curve() {
    // The curve left out: refused, not guessed.
    let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
    let pem = key.to_pem(KeyEncoding::Pkcs1).unwrap();
    let der = ::pem::parse(pem.as_bytes()).unwrap().into_contents();
    let mut ec = sec1::EcPrivateKey::from_der(&der).unwrap();
    ec.parameters = None;
    let bare = ::pem::encode(&::pem::Pem::new(
        "EC PRIVATE KEY",
        rsa::pkcs8::der::Encode::to_der(&ec).unwrap(),
    ));
    assert!(matches!(
        PrivateKey::from_pem(bare.as_bytes()),
        Err(KeyError::Sec1WithoutCurve)
    ));
    // P-521 (named, but not one Signet signs with).
    let p521 = openssl(&["ecparam", "-name", "secp521r1", "-genkey", "-noout"]);
    let err = PrivateKey::from_pem(&p521).unwrap_err();
    assert!(
        matches!(&err, KeyError::UnsupportedCurve(oid) if oid == "1.3.132.0.35"),
        "{err}"
    );
    let p521_pkcs8 = {
        let dir = std::env::temp_dir().join(format!("pki-p521-{}", std::process::id()));
        std::fs::write(&dir, &p521).unwrap();
        let out = openssl(&["pkcs8", "-topk8", "-nocrypt", "-in", dir.to_str().unwrap()]);
        let _ = std::fs::remove_file(&dir);
        out
    };
    assert!(matches!(
        PrivateKey::from_pem(&p521_pkcs8),
        Err(KeyError::UnsupportedCurve(_))
    ));
}

#[test]
fn no_key_block_and_encrypted_keys_are_named() {
    let cert_only = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
    assert!(matches!(
        PrivateKey::from_pem(cert_only.as_bytes()),
        Err(KeyError::NoPrivateKey)
    ));
    let enc = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMAA=\n-----END ENCRYPTED PRIVATE KEY-----\n";
    assert!(matches!(
        PrivateKey::from_pem(enc.as_bytes()),
        Err(KeyError::Encrypted)
    ));
    // PKCS#1 RSA from openssl.
    let rsa = openssl(&["genrsa", "-traditional", "2048"]);
    assert!(String::from_utf8_lossy(&rsa).contains("BEGIN RSA PRIVATE KEY"));
    assert_eq!(
        PrivateKey::from_pem(&rsa).unwrap().algorithm(),
        KeyAlgorithm::Rsa(2048)
    );
}
