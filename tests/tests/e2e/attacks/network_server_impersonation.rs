//! A network attacker who holds a certificate that chains to the Signet bundle and is valid for
//! the DNS name the clients dial (`localhost`), but carries another SPIFFE ID, sits where the
//! server should be: a real TLS gRPC server (tests/src/rogue.rs) that takes join tokens and
//! bearer tokens and pushes its own roots over `WatchBundle`. The certificate comes from the
//! real server's admin mint while it still grants DNS names there, else from a test CA the
//! victims are told to trust as well (the same position for their verifier).
//!
//! Refused: the agent's attestation (the join token is never sent), the agent's bundle stream
//! over mTLS (its `bundle.pem` is not touched), the bridge (Issuer, ClusterIssuer, the
//! connection Citadel mode uses) and `signetctl bench`. Each client tells why, naming the
//! SPIFFE ID it got. Still accepted: the real server, by all of them, with the same bundle.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use signet_k8s::backoff::{Backoffs, Policy};
use signet_k8s::context::Context;
use signet_k8s::crd::{ClusterIssuer, Issuer};
use signet_k8s::issuer_status;
use signet_k8s::signer::{Credentials, Signer, SignerCache, SignerConfig};
use signet_k8s::testing::{Expect, TestBridge, mock_client, object};
use signet_runtime::clock::SystemClock;
use signet_runtime::random::FixedRandom;
use signet_tests::rogue::{Rogue, identity_with_server_name};
use signet_tests::{Server, TokenIssuer, bin};
use tokio::io::AsyncBufReadExt;

use crate::agent::{create_entry, create_token, eventually};
use crate::pg_server;

const MITM_ID: &str = "spiffe://example.org/ns/default/sa/mitm";
const WANT: &str = "not spiffe://example.org/signet/server";

/// A `signet-agent` process whose log lines are kept.
struct LoggedAgent {
    child: tokio::process::Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl LoggedAgent {
    fn start(config: &Path) -> Self {
        let mut child = tokio::process::Command::new(bin("signet-agent"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info,h2=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                sink.lock().unwrap().push(l);
            }
        });
        Self { child, log }
    }

    fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

struct AgentFiles {
    _dir: tempfile::TempDir,
    data_dir: PathBuf,
    sink_dir: PathBuf,
    bundle: PathBuf,
}

impl AgentFiles {
    fn new(trusted_pem: &[u8]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let sink_dir = dir.path().join("sink");
        std::fs::create_dir(&sink_dir).unwrap();
        let bundle = dir.path().join("bundle.pem");
        std::fs::write(&bundle, trusted_pem).unwrap();
        Self {
            _dir: dir,
            data_dir,
            sink_dir,
            bundle,
        }
    }

    /// A config dialling `https://localhost:<port>` (the name in both certificates).
    fn config(&self, port: u16, join_token: &str, name: &str) -> PathBuf {
        let dir = self.data_dir.parent().unwrap();
        let path = dir.join(format!("{name}.toml"));
        let toml = format!(
            r#"server_address = "https://localhost:{port}"
trust_bundle_file = "{bundle}"
join_token = "{join_token}"
data_dir = "{data}"
workload_api_socket = "{socket}"
http_listen = "127.0.0.1:0"
sync_interval = "300ms"

[[sinks]]
name = "app"
kind = "files"
spiffe_id = "spiffe://example.org/mitm-app"
directory = "{sink}"
layout = "spiffe-helper"
"#,
            bundle = self.bundle.display(),
            data = self.data_dir.display(),
            socket = dir.join(format!("{name}.sock")).display(),
            sink = self.sink_dir.display(),
        );
        std::fs::write(&path, toml).unwrap();
        path
    }
}

/// Waits until `agent` has dialled the rogue and refused it (a failed handshake and the
/// reason in its log).
async fn refused_by(agent: &LoggedAgent, rogue: &Rogue, failures_before: usize) {
    eventually(
        30,
        "the agent to dial the rogue server and refuse it",
        || async {
            (rogue.log.tls_failures() > failures_before && agent.logged(WANT)).then_some(())
        },
    )
    .await;
}

// Multi-threaded: the rogue server runs in this runtime while other calls block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_talks_to_a_server_with_another_spiffe_id() {
    let tokens = TokenIssuer::new("mitm");
    // signetctl bench issues as fast as it can from one caller: the issuance rate limits
    // (tested in network_limits) are off here, as for any benchmark.
    let toml = "[policy.kubernetes_bridge]\ncallers = \
                [\"spiffe://example.org/ns/signet-system/sa/signet-k8s\"]\n\
                [limits]\nissuance_per_caller = { burst = 1, per_second = 0 }\n\
                issuance_per_source = { burst = 1, per_second = 0 }\n";
    let Some(server) = pg_server(&tokens, toml).await else {
        return;
    };
    let stolen = identity_with_server_name(&server, MITM_ID).await;
    // The roots the rogue pushes: its own.
    let evil_key = rcgen::KeyPair::generate().unwrap();
    let mut evil = rcgen::CertificateParams::new(vec![]).unwrap();
    evil.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    evil.subject_alt_names = vec![rcgen::SanType::URI(
        "spiffe://example.org".try_into().unwrap(),
    )];
    let evil_root = evil.self_signed(&evil_key).unwrap();
    let rogue = Rogue::start(
        stolen.chain_der.clone(),
        stolen.key_der.clone(),
        "example.org",
        vec![evil_root.der().to_vec()],
    )
    .await;
    // What every victim trusts: the Signet bundle (and the test CA, if one was needed).
    let trusted = [
        server.bundle_pem.clone(),
        stolen.extra_root_pem.clone().into_bytes(),
    ]
    .concat();

    agent_refuses_the_rogue_and_accepts_the_server(&server, &rogue, &trusted).await;
    bridge_refuses_the_rogue_and_accepts_the_server(&server, &tokens, &rogue, &trusted).await;
    signetctl_refuses_the_rogue_and_accepts_the_server(&server, &rogue, &trusted).await;

    // Nothing ever reached the rogue: every handshake was refused.
    assert_eq!(rogue.log.tls_handshakes(), 0);
    assert_eq!(rogue.log.calls(), []);
}

async fn agent_refuses_the_rogue_and_accepts_the_server(
    server: &Server,
    rogue: &Rogue,
    trusted: &[u8],
) {
    let files = AgentFiles::new(trusted);
    let join_token = create_token(server, "mitm-node");
    create_entry(server, "spiffe://example.org/mitm-app", "mitm-node", &[]);

    // First contact through the rogue: the join token is never sent.
    let agent = LoggedAgent::start(&files.config(rogue.addr.port(), &join_token, "via-rogue"));
    refused_by(&agent, rogue, 0).await;
    agent.stop().await;
    assert!(
        rogue.log.calls().iter().all(|c| c.join_token.is_none()),
        "the join token reached the rogue"
    );
    assert!(!files.data_dir.join("node.pem").exists());

    // The real server, same bundle, same (unspent) token: attested, entry delivered.
    let agent = LoggedAgent::start(&files.config(server.grpc.port(), &join_token, "via-server"));
    eventually(30, "the sink written through the real server", || async {
        files.sink_dir.join("svid.pem").exists().then_some(())
    })
    .await;
    agent.stop().await;
    let kept_bundle = std::fs::read(files.data_dir.join("bundle.pem")).unwrap();

    // Restarted with its node identity towards the rogue: no mTLS connection, so no
    // WatchBundle, and the bundle it keeps is untouched.
    let failures = rogue.log.tls_failures();
    let agent = LoggedAgent::start(&files.config(rogue.addr.port(), "", "renew-via-rogue"));
    refused_by(&agent, rogue, failures).await;
    agent.stop().await;
    assert_eq!(
        std::fs::read(files.data_dir.join("bundle.pem")).unwrap(),
        kept_bundle,
        "the rogue's roots were persisted"
    );
    assert!(
        !String::from_utf8_lossy(&kept_bundle).is_empty()
            && rogue.log.calls().iter().all(|c| c.rpc != "WatchBundle")
    );

    // And back to the real server: its bundle stream and renewals work again.
    std::fs::remove_file(files.sink_dir.join("svid.pem")).unwrap();
    let agent = LoggedAgent::start(&files.config(server.grpc.port(), "", "renew-via-server"));
    eventually(30, "the sink rewritten through the real server", || async {
        files.sink_dir.join("svid.pem").exists().then_some(())
    })
    .await;
    agent.stop().await;
}

async fn bridge_refuses_the_rogue_and_accepts_the_server(
    server: &Server,
    tokens: &TokenIssuer,
    rogue: &Rogue,
    trusted: &[u8],
) {
    let bridge_token = tokens.token("signet-system", "signet-k8s");
    for (addr, ok) in [
        (format!("https://localhost:{}", rogue.addr.port()), false),
        (format!("https://localhost:{}", server.grpc.port()), true),
    ] {
        let operator = TestBridge::new(&addr, trusted, "example.org", &bridge_token);
        let (client, api) = mock_client();
        let ctx = Arc::new(Context {
            client,
            bridge_namespace: "signet-system".into(),
            bridge: operator.config.clone(),
            backend: Arc::new(SignerCache::new()),
            clock: Arc::new(SystemClock),
            backoffs: Backoffs::with_random(
                Policy {
                    base: Duration::from_secs(5),
                    cap: Duration::from_secs(300),
                },
                Box::new(FixedRandom(0.0)),
            ),
            issuer_recheck: Duration::from_secs(300),
            events: Arc::new(signet_k8s::events::NoEvents),
        });
        let issuer = object(
            "signet.dev/v1",
            "Issuer",
            Some("a"),
            "signet",
            "1",
            json!({"spec": {}}),
        );
        let cluster = object(
            "signet.dev/v1",
            "ClusterIssuer",
            None,
            "signet",
            "1",
            json!({"spec": {"server": addr,
                "trustBundle": {"pem": String::from_utf8(trusted.to_vec()).unwrap()},
                "auth": {"serviceAccountToken": {"path": operator.token.0}}}}),
        );
        let scenario = api.run(vec![
            Expect::patch("/apis/signet.dev/v1/namespaces/a/issuers/signet/status")
                .respond(issuer.clone()),
            Expect::patch("/apis/signet.dev/v1/clusterissuers/signet/status")
                .respond(cluster.clone()),
        ]);
        let i: Issuer = serde_json::from_value(issuer).unwrap();
        issuer_status::reconcile_issuer(Arc::new(i), ctx.clone())
            .await
            .unwrap();
        let c: ClusterIssuer = serde_json::from_value(cluster).unwrap();
        issuer_status::reconcile_cluster_issuer(Arc::new(c), ctx.clone())
            .await
            .unwrap();
        drop(ctx);
        let got = scenario.finish().await;
        for r in &got {
            let c = &r.body["status"]["conditions"][0];
            if ok {
                assert_eq!(c["reason"], "Connected", "{c}");
            } else {
                assert_eq!(c["reason"], "WrongServerIdentity", "{c}");
                let m = c["message"].as_str().unwrap();
                assert!(m.contains(MITM_ID) && m.contains(WANT), "{m}");
            }
        }

        // The connection Citadel mode makes (the operator's target, the bridge's token) and
        // the one its bundle watcher makes.
        let target = operator.config.operator_target().unwrap();
        let signer = Signer::connect(&SignerConfig {
            target: target.clone(),
            credentials: Credentials::TokenFile(operator.token.0.clone()),
        })
        .await;
        let watch = signet_client::connect(&target, None).await;
        if ok {
            signer.unwrap().bundle().await.unwrap();
            watch.unwrap();
        } else {
            let e = signer.unwrap_err();
            assert_eq!(e.reason(), "WrongServerIdentity", "{e:?}");
            let e = watch.unwrap_err();
            assert!(
                matches!(e, signet_client::ClientError::WrongServer(..)),
                "{e:?}"
            );
        }
    }
}

async fn signetctl_refuses_the_rogue_and_accepts_the_server(
    server: &Server,
    rogue: &Rogue,
    trusted: &[u8],
) {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("trusted.pem");
    std::fs::write(&bundle, trusted).unwrap();
    // tokio's Command: the rogue answers from this process while signetctl runs.
    let bench = |port: u16| {
        tokio::process::Command::new(bin("signetctl"))
            .arg("--socket")
            .arg(server.admin_socket())
            .args([
                "bench",
                "--addr",
                &format!("https://localhost:{port}"),
                "--bundle",
                bundle.to_str().unwrap(),
                "-c",
                "1",
                "--connections",
                "1",
                "--duration",
                "200ms",
                "--warmup",
                "0s",
                "--no-verify",
            ])
            .output()
    };
    let out = tokio::time::timeout(Duration::from_secs(60), bench(rogue.addr.port()))
        .await
        .expect("signetctl bench hung")
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(MITM_ID) && err.contains(WANT), "{err}");
    let out = bench(server.grpc.port()).await.unwrap();
    assert!(out.status.success(), "{out:?}");
}
