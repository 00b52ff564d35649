//! Node sets end to end (issue 29, item 1): one entry whose parent is a node set serves its
//! workload on every member node, and only there. Real processes: the server on PostgreSQL,
//! two real agents attested with their Kubernetes projected service-account tokens (nodes
//! worker-1 and worker-2 of cluster `prod`, agent namespace `signet-system`), and a third node
//! of the same cluster whose agent runs in another namespace, outside the set. Membership is
//! re-checked at every signing and every renewal: after `signetctl node ban` of one member, that
//! node can neither sign nor renew for the entry while the other still can.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use signet_client::ClientIdentity;
use signet_proto::agent::node_client::NodeClient;
use signet_proto::agent::{AttestRequest, SignWorkloadsRequest, SyncEntriesRequest, WorkloadCsr};
use signet_proto::ca::SignCsrRequest;
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_tests::*;
use tokio::process::{Child, Command};
use tonic::Code;

use crate::pg_server;

const NODES_TOML: &str = r#"
[nodes.kubernetes]
allowed_service_accounts = ["signet-system:signet-agent", "other:signet-agent"]
cluster = "prod"
"#;

const APP: &str = "spiffe://example.org/app";

/// A projected token as the kubelet mounts it for a pod of `ns`/signet-agent on `node`.
fn node_token(tokens: &TokenIssuer, ns: &str, node: &str) -> String {
    let mut c = tokens.claims(ns, "signet-agent");
    c["aud"] = serde_json::json!(["signet-node"]);
    c["kubernetes.io"]["node"] = serde_json::json!({"name": node});
    tokens.sign(&c)
}

/// A real agent, attested with the token of `ns`/signet-agent on `node`.
struct Agent {
    _child: Child,
    dir: tempfile::TempDir,
}

impl Agent {
    fn start(server: &Server, tokens: &TokenIssuer, ns: &str, node: &str) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, node_token(tokens, ns, node)).unwrap();
        let config = dir.path().join("agent.toml");
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
                socket = dir.path().join("agent.sock").display(),
            ),
        )
        .unwrap();
        let child = Command::new(bin("signet-agent"))
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info,h2=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Agent { _child: child, dir }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    /// The agent's node identity as it keeps it (`node.pem`, `node.key`).
    fn node_identity(&self) -> ClientIdentity {
        let data = self.dir.path().join("data");
        ClientIdentity {
            cert_chain_pem: std::fs::read(data.join("node.pem")).unwrap(),
            key_pem: std::fs::read(data.join("node.key")).unwrap(),
        }
    }
}

/// The workload's X509-SVID from the Workload API at `socket`: its SPIFFE ID and its mTLS
/// identity (leaf and key).
async fn fetch_svid(socket: &Path) -> Option<(String, ClientIdentity)> {
    let client = spiffe::WorkloadApiClient::connect_to(format!("unix:{}", socket.display()))
        .await
        .ok()?;
    let svid = client.fetch_x509_svid().await.ok()?;
    let leaf = svid.cert_chain().first()?;
    let id = ClientIdentity {
        cert_chain_pem: signet_types::pem::cert_to_pem(leaf.as_ref()).into_bytes(),
        key_pem: pem::encode(&pem::Pem::new(
            "PRIVATE KEY",
            svid.private_key().as_ref().to_vec(),
        ))
        .into_bytes(),
    };
    Some((svid.spiffe_id().to_string(), id))
}

async fn wait_for_svid(agent: &Agent, node: &str) -> ClientIdentity {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((id, identity)) = fetch_svid(&agent.socket()).await {
            assert_eq!(id, APP, "{node}");
            return identity;
        }
        assert!(
            Instant::now() < deadline,
            "no SVID from the Workload API of the agent on {node}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Attests node `node` of the cluster as an agent in namespace `ns` would, straight over gRPC:
/// its node ID and mTLS identity.
async fn attest(server: &Server, tokens: &TokenIssuer, ns: &str, node: &str) -> ClientIdentity {
    let kc = signet_client::new_key_and_csr().unwrap();
    let req = signet_client::with_bearer(
        AttestRequest {
            join_token: String::new(),
            csr: kc.csr_der,
        },
        &node_token(tokens, ns, node),
    )
    .unwrap();
    let r = NodeClient::new(server.channel().await)
        .attest(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.node_id, format!("k8s-{node}"));
    let svid = r.svid.unwrap();
    ClientIdentity {
        cert_chain_pem: signet_types::pem::certs_to_pem(svid.cert_chain.iter().map(Vec::as_slice))
            .into_bytes(),
        key_pem: kc.key_pem.into_bytes(),
    }
}

/// SignWorkloads for `entry_id` with the node identity `node`: the per-entry code and message.
async fn sign_for(server: &Server, node: &ClientIdentity, entry_id: &str) -> (i32, String) {
    let w = signet_client::new_key_and_csr().unwrap();
    let r = NodeClient::new(server.channel_with(node).await)
        .sign_workloads(SignWorkloadsRequest {
            csrs: vec![WorkloadCsr {
                entry_id: entry_id.into(),
                csr: w.csr_der,
            }],
        })
        .await;
    match r {
        Ok(r) => {
            let one = &r.get_ref().results[0];
            (one.code, one.message.clone())
        }
        // A banned node is refused the whole call.
        Err(s) => (s.code() as i32, s.message().to_owned()),
    }
}

/// Renews the workload certificate `workload` over mTLS (SignCsr with no credential but it).
async fn renew(server: &Server, workload: &ClientIdentity) -> Result<(), tonic::Status> {
    let kc = signet_client::new_key_and_csr().unwrap();
    CertificateAuthorityClient::new(server.channel_with(workload).await)
        .sign_csr(SignCsrRequest {
            csr: kc.csr_der,
            ttl_seconds: 60,
            kubernetes_namespace: String::new(),
        })
        .await
        .map(|_| ())
}

fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn one_node_set_entry_serves_every_member_node_and_no_other() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, NODES_TOML).await else {
        return;
    };
    let uid = format!(
        "unix:uid:{}",
        std::fs::metadata("/proc/self").unwrap().uid()
    );
    let entry = |parent: &str| {
        server.signetctl(&[
            "entry",
            "create",
            "--spiffe-id",
            APP,
            "--parent",
            parent,
            "--selector",
            &uid,
        ])
    };

    // An entry under a set that does not exist is refused, naming how to make one.
    let out = entry("nodeset:k8s");
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("signetctl nodeset create k8s"), "{err}");

    // The set: the agents of namespace signet-system on the nodes of cluster prod.
    let out = server.signetctl(&[
        "nodeset",
        "create",
        "k8s",
        "--node-selector",
        "k8s_psat:cluster:prod",
        "--node-selector",
        "k8s_psat:agent_ns:signet-system",
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = entry("nodeset:k8s");
    assert!(out.status.success(), "{out:?}");
    let entry_id = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    // Both member agents serve the workload its SVID from the one entry.
    let a1 = Agent::start(&server, &tokens, "signet-system", "worker-1");
    let a2 = Agent::start(&server, &tokens, "signet-system", "worker-2");
    let (w1, w2) = tokio::join!(
        wait_for_svid(&a1, "worker-1"),
        wait_for_svid(&a2, "worker-2")
    );

    // A node of the same cluster whose agent runs in another namespace is no member: it never
    // receives the entry and may not sign for it.
    let outsider = attest(&server, &tokens, "other", "worker-3").await;
    let sync = NodeClient::new(server.channel_with(&outsider).await)
        .sync_entries(SyncEntriesRequest { known_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(sync.entries.is_empty(), "{sync:?}");
    let (code, message) = sign_for(&server, &outsider, &entry_id).await;
    assert_eq!(code, Code::PermissionDenied as i32, "{message}");
    assert!(
        message.contains("not a member of node set k8s"),
        "{message}"
    );

    // What signetctl shows: the nodes' selectors, the set's members and entries.
    let nodes = json_lines(&server.signetctl(&["node", "list", "--json"]));
    let w1_node = nodes
        .iter()
        .find(|n| n["node_id"] == "k8s-worker-1")
        .unwrap();
    assert_eq!(
        w1_node["selectors"],
        serde_json::json!([
            "k8s_psat:agent_ns:signet-system",
            "k8s_psat:agent_sa:signet-system:signet-agent",
            "k8s_psat:cluster:prod",
            "k8s_psat:node_name:worker-1",
            "signet:attestation:k8s_psat"
        ])
    );
    let sets = json_lines(&server.signetctl(&["nodeset", "list", "--json"]));
    assert_eq!(sets.len(), 1);
    assert_eq!(
        sets[0]["members"],
        serde_json::json!(["k8s-worker-1", "k8s-worker-2"])
    );
    assert_eq!(sets[0]["entries"], 1);
    assert_eq!(
        sets[0]["spiffe_id"],
        "spiffe://example.org/signet/nodeset/k8s"
    );
    let listed =
        json_lines(&server.signetctl(&["entry", "list", "--parent", "nodeset:k8s", "--json"]));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], entry_id.as_str());

    // The set is not deleted while the entry names it.
    let out = server.signetctl(&["nodeset", "delete", "k8s"]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 entry") && err.contains("signetctl entry list --parent nodeset:k8s"),
        "{err}"
    );

    // Both members sign and renew for the entry ...
    for (node, agent, workload) in [("worker-1", &a1, &w1), ("worker-2", &a2, &w2)] {
        let (code, message) = sign_for(&server, &agent.node_identity(), &entry_id).await;
        assert_eq!(code, 0, "{node}: {message}");
        renew(&server, workload).await.unwrap();
    }
    // ... until one is banned: it can no longer sign or renew for it, the other still can.
    let out = server.signetctl(&["node", "ban", "k8s-worker-1"]);
    assert!(out.status.success(), "{out:?}");
    let (code, message) = sign_for(&server, &a1.node_identity(), &entry_id).await;
    assert_eq!(code, Code::PermissionDenied as i32, "{message}");
    assert!(message.contains("banned"), "{message}");
    let err = renew(&server, &w1).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("banned"), "{err:?}");
    let (code, message) = sign_for(&server, &a2.node_identity(), &entry_id).await;
    assert_eq!(code, 0, "{message}");
    renew(&server, &w2).await.unwrap();
    let sets = json_lines(&server.signetctl(&["nodeset", "list", "--json"]));
    assert_eq!(sets[0]["members"], serde_json::json!(["k8s-worker-2"]));

    // Without its entry the set goes.
    let out = server.signetctl(&["entry", "delete", &entry_id]);
    assert!(out.status.success(), "{out:?}");
    let out = server.signetctl(&["nodeset", "delete", "k8s"]);
    assert!(out.status.success(), "{out:?}");
    assert!(json_lines(&server.signetctl(&["nodeset", "list", "--json"])).is_empty());
}
