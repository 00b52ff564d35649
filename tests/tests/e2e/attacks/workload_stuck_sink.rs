//! A sink that never finishes (a workload's reload command that hangs, a Kubernetes API
//! server that never answers) must not freeze the node. Against the real agent and server:
//! while one identity's sinks hang, another identity's certificate keeps rotating into its
//! sink, the node certificate is renewed, a new entry is synced and signed, the Workload API
//! answers, the hanging command is
//! killed at its deadline, and the stuck sinks show in `/readyz`, the metrics and the logs.

use signet_tests::TokenIssuer;

use crate::agent::{create_entry, create_token, eventually, fetch_svid};
use crate::fake_kube::FakeKube;
use crate::pg_server;
use crate::sink_harness::{RunningAgent, agent_files, leaf_serial, next_delivery};

/// Whether `pid` is still a running `sleep 1000` (gone, or a zombie, counts as killed).
fn sleeping(pid: &str) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat
        .rsplit(')')
        .next()
        .is_some_and(|s| s.trim_start().starts_with('Z'));
    String::from_utf8_lossy(&cmdline).contains("1000") && !zombie
}

#[tokio::test]
async fn a_hanging_reload_command_or_api_server_delays_no_other_renewal() {
    let tokens = TokenIssuer::new("k1");
    // Node certificates live six seconds: renewed about every three.
    let Some(server) = pg_server(&tokens, "[ca]\ndefault_ttl = \"6s\"\n").await else {
        return;
    };
    let token = create_token(&server, "stuck");
    create_entry(&server, "spiffe://example.org/stuck", "stuck", &[]);
    create_entry(
        &server,
        "spiffe://example.org/fine",
        "stuck",
        &["--ttl", "4s"],
    );
    let kube = FakeKube::start(true).await;

    let tmp = tempfile::tempdir().unwrap();
    let (hang_dir, fine_dir) = (tmp.path().join("hang"), tmp.path().join("fine"));
    std::fs::create_dir(&hang_dir).unwrap();
    std::fs::create_dir(&fine_dir).unwrap();
    let pids = tmp.path().join("pids");
    let sinks = format!(
        r#"[[sinks]]
name = "hang-cmd"
kind = "files"
spiffe_id = "spiffe://example.org/stuck"
directory = "{hang}"
reload_command = ["sh", "-c", "echo $$ >> {pids}; exec sleep 1000"]
reload_timeout = "1s"
timeout = "5s"

[[sinks]]
name = "hang-secret"
kind = "kubernetes-secret"
spiffe_id = "spiffe://example.org/stuck"
namespace = "prod"
secret_name = "stuck-tls"
timeout = "5s"

[[sinks]]
name = "fine"
kind = "files"
spiffe_id = "spiffe://example.org/fine"
directory = "{fine}"
layout = "tls"
"#,
        hang = hang_dir.display(),
        fine = fine_dir.display(),
        pids = pids.display(),
    );
    let files = agent_files(&server, &token, &kube.agent_toml("1s"), &sinks);
    let agent = RunningAgent::start(&files.config).await;

    // The other identity's sink receives its certificate and then two rotations.
    let crt = fine_dir.join("tls.crt");
    let first = next_delivery(30, "the fine sink's first certificate", &crt, None).await;
    let second = next_delivery(15, "a rotation in the fine sink", &crt, Some(&first)).await;
    next_delivery(15, "another rotation in the fine sink", &crt, Some(&second)).await;

    // The node certificate is renewed meanwhile.
    let node_serial = || leaf_serial(&files.data_dir.join("node.pem"));
    let node_first = node_serial().unwrap();
    eventually(20, "a renewed node certificate", || async {
        node_serial().filter(|s| *s != node_first)
    })
    .await;

    // Entries are still synced and signed: a new one gets its certificate.
    let late = "spiffe://example.org/late";
    create_entry(&server, late, "stuck", &[]);
    eventually(
        20,
        "a certificate for an entry created meanwhile",
        || async {
            let rows = server
                .admin()
                .await
                .list_certificates(signet_proto::admin::ListCertificatesRequest {
                    spiffe_id: late.into(),
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            rows.certificates.into_iter().next()
        },
    )
    .await;

    // The Workload API answers.
    eventually(10, "an SVID from the Workload API", || {
        fetch_svid(&files.socket)
    })
    .await;

    // Every reload command started was killed at its deadline.
    let started = eventually(10, "a reload command started", || async {
        std::fs::read_to_string(&pids)
            .ok()
            .filter(|s| !s.trim().is_empty())
    })
    .await;
    for pid in started.split_whitespace() {
        eventually(5, "the hanging reload command killed", || async {
            (!sleeping(pid)).then_some(())
        })
        .await;
    }

    // The stuck sinks are reported; the healthy one is not.
    let (code, body) = eventually(15, "both stuck sinks on /readyz", || async {
        let (code, body) = agent.readyz().await;
        (body.contains("sink \"hang-cmd\"") && body.contains("sink \"hang-secret\""))
            .then_some((code, body))
    })
    .await;
    assert_eq!(
        code, 200,
        "a stuck sink does not make the agent unready: {body}"
    );
    assert!(body.contains("did not finish within"), "{body}");
    assert!(body.contains("did not answer within"), "{body}");
    assert!(!body.contains("sink \"fine\""), "{body}");
    for sink in ["hang-cmd", "hang-secret"] {
        let t = agent
            .metric(
                "signet_agent_sink_failures_total",
                &[&format!("sink=\"{sink}\""), "reason=\"timeout\""],
            )
            .await;
        assert!(t.unwrap_or(0.0) >= 1.0, "{sink}: {}", agent.metrics().await);
        let healthy = agent
            .metric("signet_agent_sink_healthy", &[&format!("sink=\"{sink}\"")])
            .await;
        assert_eq!(healthy, Some(0.0), "{sink}");
    }
    let healthy = agent
        .metric("signet_agent_sink_healthy", &["sink=\"fine\""])
        .await;
    assert_eq!(healthy, Some(1.0));
    assert!(agent.logged("sink failed; will retry"));
    agent.stop().await;
}
