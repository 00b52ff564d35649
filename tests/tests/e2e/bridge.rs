//! The Kubernetes bridge (`[policy.kubernetes_bridge]`): a listed caller asks, with
//! `SignCsrRequest.kubernetes_namespace`, for certificates of objects in any namespace, but
//! each certificate stays inside its object's namespace. Against PostgreSQL and the real binary.

use signet_proto::ca::SignCsrRequest;
use signet_tests::*;
use tonic::Code;

use crate::pg_server;

const BRIDGE_TOML: &str = r#"
[policy.kubernetes_bridge]
callers = ["spiffe://example.org/ns/signet-system/sa/signet-k8s"]
"#;

async fn sign(
    server: &Server,
    token: &str,
    namespace: &str,
    uris: &[&str],
    dns: &[&str],
) -> Result<Vec<String>, tonic::Status> {
    let (csr, _key) = csr_with(uris, dns);
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: csr.into_bytes(),
            ttl_seconds: 600,
            kubernetes_namespace: namespace.into(),
        },
        token,
    )
    .unwrap();
    let r = server.native().await.sign_csr(req).await?.into_inner();
    Ok(r.cert_chain
        .iter()
        .map(|d| signet_types::pem::cert_to_pem(d))
        .collect())
}

#[tokio::test]
async fn bridge_gets_certificates_only_inside_the_objects_namespace() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, BRIDGE_TOML).await else {
        return;
    };
    let bridge = tokens.token("signet-system", "signet-k8s");

    // Allowed: an ID and DNS names of the object's namespace.
    let web = "spiffe://example.org/ns/team-a/sa/web";
    let chain = sign(
        &server,
        &bridge,
        "team-a",
        &[web],
        &["web.team-a.svc", "web.team-a.svc.cluster.local"],
    )
    .await
    .unwrap();
    openssl_verify(&chain, &server.bundle_pem).unwrap();
    assert_eq!(uri_sans(&chain[0]), [web]);
    let out = server.signetctl(&["certs", "show", &serial_of(&chain[0]), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let row: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(row["spiffe_id"], web);
    assert_eq!(
        row["caller"],
        "jwt:spiffe://example.org/ns/signet-system/sa/signet-k8s"
    );
    let before = server.cert_count().await;

    // Another namespace's ID: refused, nothing written.
    let err = sign(
        &server,
        &bridge,
        "team-a",
        &["spiffe://example.org/ns/team-b/sa/db"],
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert_eq!(
        err.message(),
        "a certificate for an object in namespace team-a may only carry a SPIFFE ID under \
         spiffe://example.org/ns/team-a/; the CSR asks for spiffe://example.org/ns/team-b/sa/db"
    );
    // Another namespace's DNS name.
    let err = sign(&server, &bridge, "team-a", &[web], &["db.team-b.svc"])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("db.team-b.svc"), "{err:?}");
    // Not a namespace name.
    let err = sign(&server, &bridge, "Team_A", &[web], &[])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // An ordinary workload may not act as the bridge, not even for its own namespace.
    let err = sign(
        &server,
        &tokens.token("team-a", "web"),
        "team-a",
        &[web],
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message()
            .starts_with("caller spiffe://example.org/ns/team-a/sa/web is not a Kubernetes bridge"),
        "{err:?}"
    );
    assert_eq!(server.cert_count().await, before);

    // Without a namespace the bridge is an ordinary caller: its own identity only.
    let chain = sign(&server, &bridge, "", &[], &[]).await.unwrap();
    assert_eq!(
        uri_sans(&chain[0]),
        ["spiffe://example.org/ns/signet-system/sa/signet-k8s"]
    );

    // The refusals are in the audit log, as signetctl shows it.
    let mut text = String::new();
    for _ in 0..50 {
        let out = server.signetctl(&["audit", "list", "--json", "--limit", "1000"]);
        assert!(out.status.success(), "{out:?}");
        text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("policy.bridge_namespace") && text.contains("policy.bridge:") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(text.contains("policy.bridge_namespace"), "{text}");
    assert!(
        text.contains("spiffe://example.org/ns/team-b/sa/db"),
        "{text}"
    );
    assert!(text.contains("policy.bridge:"), "{text}");
    assert!(!text.contains(&bridge), "audit log holds a token");
}
