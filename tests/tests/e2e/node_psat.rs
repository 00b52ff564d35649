//! Node attestation with a Kubernetes projected service-account token (`[nodes.kubernetes]`):
//! the real agent, as a DaemonSet pod would, attests with the token file and serves its
//! entries; tokens of other service accounts, of the workload audience, or not bound to a node
//! are refused, audited, and record no node; a banned node stays banned.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use signet_proto::agent::AttestRequest;
use signet_proto::agent::node_client::NodeClient;
use signet_tests::*;
use tokio::process::Command;
use tonic::Code;

use crate::pg_server;

const NODES_TOML: &str = r#"
[nodes.kubernetes]
allowed_service_accounts = ["signet-system:signet-agent"]
"#;

/// A projected token as the kubelet mounts it for a pod of `ns`/`sa` on `node`, with the
/// node audience.
fn node_token(tokens: &TokenIssuer, ns: &str, sa: &str, node: Option<&str>) -> String {
    let mut c = tokens.claims(ns, sa);
    c["aud"] = serde_json::json!(["signet-node"]);
    if let Some(node) = node {
        c["kubernetes.io"]["node"] =
            serde_json::json!({"name": node, "uid": "6b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e"});
    }
    tokens.sign(&c)
}

async fn attest_with(server: &Server, token: &str) -> Result<String, tonic::Status> {
    let kc = signet_client::new_key_and_csr().unwrap();
    let req = signet_client::with_bearer(
        AttestRequest {
            join_token: String::new(),
            csr: kc.csr_der,
        },
        token,
    )
    .unwrap();
    let r = NodeClient::new(server.channel().await)
        .attest(req)
        .await?
        .into_inner();
    Ok(r.node_id)
}

fn node_ids(server: &Server) -> Vec<String> {
    let out = server.signetctl(&["node", "list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    // One JSON object per line.
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let n: serde_json::Value = serde_json::from_str(l).unwrap();
            n["node_id"].as_str().unwrap().to_owned()
        })
        .collect()
}

async fn fetch_svid(socket: &Path) -> Option<(String, Vec<String>)> {
    let client = spiffe::WorkloadApiClient::connect_to(format!("unix:{}", socket.display()))
        .await
        .ok()?;
    let svid = client.fetch_x509_svid().await.ok()?;
    let chain = svid
        .cert_chain()
        .iter()
        .map(|c| signet_types::pem::cert_to_pem(c.as_ref()))
        .collect();
    Some((svid.spiffe_id().to_string(), chain))
}

#[tokio::test]
async fn agent_attests_with_its_projected_token_and_serves_its_node_entries() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, NODES_TOML).await else {
        return;
    };
    let app = "spiffe://example.org/app";
    let uid = format!(
        "unix:uid:{}",
        std::fs::metadata("/proc/self").unwrap().uid()
    );
    let out = server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        app,
        "--parent",
        "k8s-worker-1",
        "--selector",
        &uid,
    ]);
    assert!(out.status.success(), "{out:?}");

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let socket = dir.path().join("agent.sock");
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &token_file,
        node_token(&tokens, "signet-system", "signet-agent", Some("worker-1")),
    )
    .unwrap();
    std::fs::write(
        &config,
        format!(
            r#"server_address = "https://127.0.0.1:{port}"
trust_bundle_file = "{bundle}"
attestation = "kubernetes"
kubernetes_token_file = "{token}"
data_dir = "{data}"
workload_api_socket = "{socket}"
http_listen = "127.0.0.1:0"
sync_interval = "300ms"
"#,
            port = server.grpc.port(),
            bundle = server.bundle_path().display(),
            token = token_file.display(),
            data = dir.path().join("data").display(),
            socket = socket.display(),
        ),
    )
    .unwrap();
    let mut agent = Command::new(bin("signet-agent"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info,h2=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let (id, chain) = loop {
        if let Some(v) = fetch_svid(&socket).await {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "no SVID from the Workload API of the PSAT-attested agent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(id, app);
    let mut full = chain.clone();
    full.push(String::from_utf8(server.bundle_pem.clone()).unwrap());
    openssl_verify(&full, &server.bundle_pem).unwrap();
    assert!(node_ids(&server).contains(&"k8s-worker-1".to_owned()));
    // signetctl shows how it attested.
    let out = server.signetctl(&["node", "list", "--json"]);
    let n: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(n["attestation"], "k8s_psat", "{n}");
    let out = server.signetctl(&["node", "list"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("k8s-worker-1") && l.contains("k8s_psat")),
        "{table}"
    );
    let node_pem = std::fs::read_to_string(dir.path().join("data").join("node.pem")).unwrap();
    assert_eq!(
        uri_sans(&node_pem),
        ["spiffe://example.org/signet/node/k8s-worker-1"]
    );
    agent.kill().await.unwrap();

    // The same pod's token attests the same node again (the kubelet rotates the token; the
    // agent re-reads it), and only that node.
    let again = node_token(&tokens, "signet-system", "signet-agent", Some("worker-1"));
    assert_eq!(attest_with(&server, &again).await.unwrap(), "k8s-worker-1");

    // Refusals: each audited, none records a node.
    let before = server.cert_count().await;
    let other_sa = node_token(&tokens, "default", "web", Some("worker-2"));
    let err = attest_with(&server, &other_sa).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message()
            .contains("service account default:web may not attest a node"),
        "{err:?}"
    );
    let unbound = node_token(&tokens, "signet-system", "signet-agent", None);
    let err = attest_with(&server, &unbound).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("not bound to a node"), "{err:?}");
    // A workload-audience token of the right service account is no node token.
    let workload = tokens.token("signet-system", "signet-agent");
    let err = attest_with(&server, &workload).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("signet-node"), "{err:?}");
    // Expired.
    let mut c = tokens.claims("signet-system", "signet-agent");
    c["aud"] = serde_json::json!(["signet-node"]);
    c["kubernetes.io"]["node"] = serde_json::json!({"name": "worker-3"});
    c["exp"] = serde_json::json!(now_unix() - 3600);
    let err = attest_with(&server, &tokens.sign(&c)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("expired"), "{err:?}");
    assert_eq!(node_ids(&server), ["k8s-worker-1"]);
    assert_eq!(server.cert_count().await, before);

    // A banned node cannot come back through its token.
    let out = server.signetctl(&["node", "ban", "k8s-worker-1"]);
    assert!(out.status.success(), "{out:?}");
    let err = attest_with(&server, &again).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("banned"), "{err:?}");

    let mut text = String::new();
    for _ in 0..50 {
        let out = server.signetctl(&["audit", "list", "--json", "--limit", "1000"]);
        text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("banned") && text.contains("expired") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for want in [
        "node.attested",
        "Kubernetes service-account token of signet-system:signet-agent",
        "default:web may not attest",
        "not bound to a node",
        "expired",
        "banned",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    assert!(!text.contains(&again), "audit log holds a token");
}

#[tokio::test]
async fn without_nodes_kubernetes_a_token_does_not_attest() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let t = node_token(&tokens, "signet-system", "signet-agent", Some("worker-1"));
    let err = attest_with(&server, &t).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("[nodes.kubernetes]"), "{err:?}");
    assert!(node_ids(&server).is_empty());
}
