//! Someone with write access to the database (not the key-encryption key, not the host) inserts
//! a CA slot of their own: a self-signed root, kind root, state prepared, with a "sealed key"
//! that does not open, and moves the CA generation. Issue 24, finding 1: before, that root was
//! in `bundle.pem`, `GetBundle`, Istio's chains and the mTLS anchors within seconds. Now every
//! slot is opened and checked before anything trusts it: the root is trusted nowhere, and the
//! server says so (`/readyz`, `signet_ca_slots_rejected`, `ca status`, an audit event) until the
//! operator removes it with `signetctl ca revoke`.

use signet_proto::ca::GetBundleRequest;
use signet_tests::*;

use super::support::*;
use crate::agent::eventually;

#[tokio::test]
async fn a_root_inserted_into_the_database_is_trusted_nowhere_and_flagged() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: "[ca]\nrotation_interval = \"200ms\"\n".into(),
        ..ServerOpts::default()
    })
    .await;

    // The attacker's root, its ID its own key ID (as Signet names slots), and a client
    // certificate it signs, for the mTLS anchors.
    let root_key = rcgen::KeyPair::generate().unwrap();
    let mut rp = rcgen::CertificateParams::new(vec![]).unwrap();
    rp.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    rp.distinguished_name
        .push(rcgen::DnType::CommonName, "example.org root (attacker)");
    rp.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let root = rp.self_signed(&root_key).unwrap();
    let id = signet_pki::ParsedCert::from_der(root.der())
        .unwrap()
        .subject_key_id()
        .expect("a subject key identifier")
        .to_owned();
    let issuer = rcgen::Issuer::new(rp, root_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut lp = rcgen::CertificateParams::new(vec![]).unwrap();
    lp.subject_alt_names.push(rcgen::SanType::URI(
        "spiffe://example.org/ns/payments/sa/api"
            .try_into()
            .unwrap(),
    ));
    lp.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf = lp.signed_by(&leaf_key, &issuer).unwrap();

    psql(
        &url,
        &format!(
            "INSERT INTO ca_keys (id, slot, kind, state, algorithm, cert_pem, encrypted_key, \
             created_at) VALUES ('{id}', '{id}', 'root', 'prepared', 'EcdsaP256', '{}', \
             '\\x{}'::bytea, {}); UPDATE ca_generation SET gen = gen + 1",
            root.pem(),
            hex::encode([7u8; 60]),
            now_unix()
        ),
    );

    // Flagged: /readyz names the slot, the gauge counts it, ca status shows why.
    let body = eventually(10, "/readyz red", || async {
        let (code, body) = server.http_get("/readyz").await;
        (code == 503).then_some(body)
    })
    .await;
    assert!(
        body.contains(&id) && body.contains("signetctl ca revoke"),
        "{body}"
    );
    let (_, metrics) = server.http_get("/metrics").await;
    assert!(metrics.contains("signet_ca_slots_rejected 1"), "{metrics}");
    let status = server.signetctl(&["ca", "status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("REJECTED") && text.contains(&id), "{text}");

    // Trusted nowhere: the bundle file, GetBundle, Istio's chain, the mTLS anchors.
    let pem_text = root.pem();
    let bundle = std::fs::read_to_string(server.bundle_path()).unwrap();
    assert!(!bundle.contains(pem_text.trim()), "in bundle.pem");
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        !b.roots.iter().any(|r| r.as_slice() == root.der().as_ref()),
        "in GetBundle"
    );
    let chain = istio_chain(&server, &tokens).await;
    assert!(
        !chain.last().unwrap().contains(pem_text.trim()),
        "in Istio's cert_chain"
    );
    let holder = identity(&[leaf.der().to_vec()], &leaf_key.serialize_pem());
    assert!(
        renew_over_mtls(&server, &holder, 0, &[]).await.is_err(),
        "a client certificate under the injected root authenticated"
    );
    let audit = server.signetctl(&["audit", "list", "--json"]);
    let audit = String::from_utf8_lossy(&audit.stdout);
    assert!(
        audit.matches("ca.slot_rejected").count() == 1,
        "audited once: {audit}"
    );

    // The operator removes it; the server is ready again and still issues.
    let out = server.signetctl(&["ca", "revoke", &id]);
    assert!(out.status.success(), "{out:?}");
    let _ = eventually(10, "/readyz green", || async {
        let (code, _) = server.http_get("/readyz").await;
        (code == 200).then_some(())
    })
    .await;
}
