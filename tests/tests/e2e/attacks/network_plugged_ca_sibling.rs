//! With a plugged-in CA, a certificate from a sibling intermediate under the same operator
//! root (another team's CA, say) must not authenticate to Signet over mTLS (issue 8,
//! finding 11): the server trusts only certificates its own signing CA issued.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use signet_proto::ca::SignCsrRequest;
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_tests::{Server, ServerOpts, TokenIssuer};

use super::support::*;

fn ca_params(cn: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.use_authority_key_identifier_extension = true;
    p
}

#[tokio::test]
async fn a_sibling_intermediates_certificate_authenticates_nobody() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let root_key = KeyPair::generate().unwrap();
    let root = ca_params("Operator Root").self_signed(&root_key).unwrap();
    let root_issuer = Issuer::new(ca_params("Operator Root"), &root_key);
    let ours_key = KeyPair::generate().unwrap();
    let ours = ca_params("Signet Intermediate")
        .signed_by(&ours_key, &root_issuer)
        .unwrap();
    let sibling_key = KeyPair::generate().unwrap();
    let sibling_params = ca_params("Other Team Intermediate");
    let _sibling = sibling_params
        .clone()
        .signed_by(&sibling_key, &root_issuer)
        .unwrap();
    let sibling_issuer = Issuer::new(sibling_params, &sibling_key);

    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    std::fs::write(p("ca-cert.pem"), ours.pem()).unwrap();
    std::fs::write(p("ca-key.pem"), ours_key.serialize_pem()).unwrap();
    std::fs::write(p("cert-chain.pem"), format!("{}{}", ours.pem(), root.pem())).unwrap();
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

    // A perfectly formed X509-SVID of our trust domain from the sibling intermediate.
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::default();
    leaf.subject_alt_names = vec![SanType::URI(
        "spiffe://example.org/ns/web/sa/frontend"
            .try_into()
            .unwrap(),
    )];
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.use_authority_key_identifier_extension = true;
    let leaf = leaf.signed_by(&leaf_key, &sibling_issuer).unwrap();
    let forged = signet_client::ClientIdentity {
        cert_chain_pem: format!("{}{}", leaf.pem(), _sibling.pem()).into_bytes(),
        key_pem: leaf_key.serialize_pem().into_bytes(),
    };
    let kc = signet_client::new_key_and_csr().unwrap();
    let attempt = async {
        let ch = signet_client::connect(&server.target(), Some(&forged))
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        CertificateAuthorityClient::new(ch)
            .sign_csr(SignCsrRequest {
                csr: kc.csr_der.clone(),
                ttl_seconds: 0,
                kubernetes_namespace: String::new(),
            })
            .await
    };
    let e = attempt.await.expect_err("the sibling's certificate");
    // The TLS layer refuses the client certificate (the handshake or the first request fails);
    // in no case is anything issued.
    assert_ne!(e.code(), tonic::Code::Ok);
    let o = server.signetctl(&[
        "certs",
        "list",
        "--spiffe-id",
        "spiffe://example.org/ns/web/sa/frontend",
    ]);
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("ns/web/sa/frontend"),
        "issued to the sibling's certificate"
    );

    // A certificate Signet issued (under its own intermediate) still renews.
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: kc.csr_der.clone(),
            ttl_seconds: 600,
            kubernetes_namespace: String::new(),
        },
        &tokens.token("web", "frontend"),
    )
    .unwrap();
    let r = server
        .native()
        .await
        .sign_csr(req)
        .await
        .unwrap()
        .into_inner();
    let ours_id = identity(&r.cert_chain, &kc.key_pem);
    renew_over_mtls(&server, &ours_id, 0, &[])
        .await
        .expect("Signet's own certificate renews");
}
