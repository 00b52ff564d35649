//! The happy paths: both APIs over TLS, with a real JWT and with mTLS renewal; the chain
//! verifies with openssl against bundle.pem; the ledger has the row.

use signet_proto::ca::{GetBundleRequest, SignCsrRequest, WatchBundleRequest};
use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::*;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::pg_server;

#[tokio::test]
async fn istio_api_issues_a_verifiable_recorded_svid() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let (csr, _key) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr,
            validity_duration: 600,
            metadata: None,
        },
        &tokens.token("payments", "api"),
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
    assert_eq!(chain.len(), 3, "leaf, intermediate, roots");
    assert_eq!(
        uri_sans(&chain[0]),
        ["spiffe://example.org/ns/payments/sa/api"]
    );
    // The last element holds every trusted root: bundle.pem.
    assert_eq!(chain[2].as_bytes(), server.bundle_pem.as_slice());
    assert_ne!(chain[1].as_bytes(), server.bundle_pem.as_slice());
    openssl_verify(&chain, &server.bundle_pem).unwrap();

    // The ledger row exists, with the caller and identity, found by serial via signetctl.
    let serial = serial_of(&chain[0]);
    let out = server.signetctl(&["certs", "show", &serial, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(row["spiffe_id"], "spiffe://example.org/ns/payments/sa/api");
    assert_eq!(row["caller"], "jwt:spiffe://example.org/ns/payments/sa/api");
    assert_eq!(row["serial"], serial);

    let out = server.signetctl(&["ledger", "verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ledger OK"));
}

#[tokio::test]
async fn native_api_signs_and_mtls_renews_the_same_identity() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let kc = signet_client::new_key_and_csr().unwrap();
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: kc.csr_der.clone(),
            ttl_seconds: 0,
            kubernetes_namespace: String::new(),
        },
        &tokens.token("web", "frontend"),
    )
    .unwrap();
    let resp = server
        .native()
        .await
        .sign_csr(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.spiffe_id, "spiffe://example.org/ns/web/sa/frontend");
    // Default TTL is 1h.
    assert_eq!(resp.not_after - resp.not_before, 3600 + 10);
    let pems: Vec<String> = resp
        .cert_chain
        .iter()
        .map(|d| signet_types::pem::cert_to_pem(d))
        .collect();
    openssl_verify(&pems, &server.bundle_pem).unwrap();

    // Renew over mTLS with the certificate just issued: same identity, no token.
    let id = signet_client::ClientIdentity {
        cert_chain_pem: pems[0].clone().into_bytes(),
        key_pem: kc.key_pem.clone().into_bytes(),
    };
    let mut client =
        signet_proto::ca::certificate_authority_client::CertificateAuthorityClient::new(
            server.channel_with(&id).await,
        );
    let kc2 = signet_client::new_key_and_csr().unwrap();
    let renewed = client
        .sign_csr(SignCsrRequest {
            csr: kc2.csr_pem.clone().into_bytes(),
            ttl_seconds: 120,
            kubernetes_namespace: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.spiffe_id, resp.spiffe_id);
    assert_eq!(renewed.not_after - renewed.not_before, 120 + 10);

    // mTLS cannot be used to obtain another identity.
    let (other, _k) = csr_with(&["spiffe://example.org/ns/web/sa/admin"], &[]);
    let err = client
        .sign_csr(SignCsrRequest {
            csr: other.into_bytes(),
            ttl_seconds: 0,
            kubernetes_namespace: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("ns/web/sa/admin"),
        "{}",
        err.message()
    );

    // The bundle over the API is bundle.pem, and the watch stream sends it at once.
    let mut native = server.native().await;
    let b = native
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.trust_domain, "example.org");
    assert_eq!(
        signet_types::pem::certs_to_pem(b.roots.iter().map(Vec::as_slice)).as_bytes(),
        server.bundle_pem.as_slice()
    );
    let mut watch = native
        .watch_bundle(WatchBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.roots, b.roots);
    assert_eq!(server.cert_count().await, 3, "server TLS cert + 2 issued");
}

#[tokio::test]
async fn health_metrics_and_admin_views() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    assert_eq!(server.http_get("/healthz").await.0, 200);
    let (code, body) = server.http_get("/readyz").await;
    assert_eq!(code, 200, "{body}");

    let (csr, _k) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr,
            validity_duration: 60,
            metadata: None,
        },
        &tokens.token("a", "b"),
    )
    .unwrap();
    server.istio().await.create_certificate(req).await.unwrap();

    let (code, metrics) = server.http_get("/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("signet_issuances_total{api=\"istio\",outcome=\"issued\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("signet_ledger_batch_size_bucket"),
        "{metrics}"
    );
    assert!(metrics.contains("signet_issuance_duration_seconds_bucket"));

    // gRPC health on the TLS listener.
    let mut health = HealthClient::new(server.channel().await);
    let st = health
        .check(HealthCheckRequest {
            service: "istio.v1.auth.IstioCertificateService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.status, 1, "SERVING");

    let out = server.signetctl(&["certs", "list", "--json"]);
    assert!(out.status.success());
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["spiffe_id"], "spiffe://example.org/signet/server");
    assert_eq!(rows[1]["spiffe_id"], "spiffe://example.org/ns/a/sa/b");

    let out = server.signetctl(&["bundle", "show"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&server.root_sha256), "{text}");
    assert!(text.contains("BEGIN CERTIFICATE"));

    // The admin socket is private to the server's user.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(server.admin_socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}
