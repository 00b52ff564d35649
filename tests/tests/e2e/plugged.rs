//! A plugged-in CA in the layout of Istio's `cacerts` (ca-cert.pem, ca-key.pem,
//! cert-chain.pem, root-cert.pem): the server signs with the intermediate, answers
//! leaf + intermediate + root, and its bundle is the operator's root.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::*;

pub(crate) fn ca_params(cn: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Example Corp");
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.use_authority_key_identifier_extension = true;
    p
}

#[tokio::test]
async fn istio_cacerts_intermediate_signs_and_chains_to_the_operator_root() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let root = ca_params("Example Root CA").self_signed(&root_key).unwrap();
    let inter_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let root_issuer = Issuer::new(ca_params("Example Root CA"), &root_key);
    let inter = ca_params("Example Mesh Intermediate")
        .signed_by(&inter_key, &root_issuer)
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    std::fs::write(p("ca-cert.pem"), inter.pem()).unwrap();
    std::fs::write(p("ca-key.pem"), inter_key.serialize_pem()).unwrap();
    std::fs::write(
        p("cert-chain.pem"),
        format!("{}{}", inter.pem(), root.pem()),
    )
    .unwrap();
    std::fs::write(p("root-cert.pem"), root.pem()).unwrap();
    let extra = format!(
        "[ca]\ncert_file = \"{}\"\nkey_file = \"{}\"\nchain_file = \"{}\"\nroot_file = \"{}\"\n",
        p("ca-cert.pem").display(),
        p("ca-key.pem").display(),
        p("cert-chain.pem").display(),
        p("root-cert.pem").display()
    );
    let server = Server::start(ServerOpts {
        database_url: Some(url),
        tokens: Some(tokens.jwks_json()),
        extra_toml: extra,
        ..ServerOpts::default()
    })
    .await;
    // The bundle is the operator's root, nothing else.
    assert_eq!(
        signet_types::pem::parse_certs(&server.bundle_pem).unwrap(),
        vec![root.der().to_vec()]
    );

    let (csr, _k) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: None,
        },
        &tokens.token("mesh", "gateway"),
    )
    .unwrap();
    let chain = server
        .istio()
        .await
        .create_certificate(req)
        .await
        .unwrap()
        .into_inner()
        .cert_chain;
    assert_eq!(chain.len(), 3, "leaf, intermediate, root");
    assert_eq!(chain[1].trim(), inter.pem().trim());
    assert_eq!(chain[2].trim(), root.pem().trim());
    openssl_verify(&chain, root.pem().as_bytes()).unwrap();
    // Without the intermediate the leaf does not verify: the chain really goes through it.
    assert!(openssl_verify(&[chain[0].clone(), chain[2].clone()], root.pem().as_bytes()).is_err());
}

#[tokio::test]
async fn a_plugged_in_key_that_does_not_match_is_a_clear_start_up_error() {
    let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let root = ca_params("Root").self_signed(&root_key).unwrap();
    let other_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    std::fs::write(p("ca-cert.pem"), root.pem()).unwrap();
    std::fs::write(p("ca-key.pem"), other_key.serialize_pem()).unwrap();
    std::fs::write(p("cert-chain.pem"), root.pem()).unwrap();
    std::fs::write(p("root-cert.pem"), root.pem()).unwrap();
    let cfg = p("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = \"{}\"\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n[ca]\ncert_file = \"{}\"\nkey_file = \"{}\"\nchain_file = \"{}\"\nroot_file = \"{}\"\n",
            p("data").display(),
            p("ca-cert.pem").display(),
            p("ca-key.pem").display(),
            p("cert-chain.pem").display(),
            p("root-cert.pem").display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(bin("signet-server"))
        .args(["--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("plugged-in CA"), "{err}");
    assert!(
        err.contains("does not belong to the CA certificate"),
        "{err}"
    );
}
