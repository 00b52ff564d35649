//! `/metrics` of the three real binaries as Prometheus reads it, in both formats:
//! - the text format 0.0.4 (what `Accept: text/plain;version=0.0.4`, or no `Accept`, gets)
//!   passes `promtool check metrics` with nothing to say (no parse error, no lint problem);
//! - OpenMetrics (what Prometheus's default `Accept` gets) ends with `# EOF` and parses with
//!   promtool's OpenMetrics parser (`promtool tsdb create-blocks-from openmetrics`, which needs
//!   a timestamp on every sample: one is appended), and holds the same series as the text;
//! - the families operators alert on are there from start-up (expiry timestamps, build info,
//!   process metrics, counters at zero).
//!
//! promtool comes from `SIGNET_PROMTOOL` (scripts/test installs it); without it the tests skip,
//! except with CI=true.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::*;

use crate::agent::{create_entry, create_token, eventually};
use crate::sink_harness::{RunningAgent, agent_files};

/// Prometheus 2.x's default scrape `Accept`.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/\
                                 openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;\
                                 q=0.5,*/*;q=0.1";
/// Prometheus with `scrape_protocols: [PrometheusText0.0.4]`.
const TEXT_ACCEPT: &str = "text/plain;version=0.0.4;q=1,*/*;q=0.1";

fn promtool() -> Option<PathBuf> {
    match std::env::var_os("SIGNET_PROMTOOL") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("SIGNET_PROMTOOL is not set: CI requires promtool (scripts/test installs it)")
        }
        None => {
            eprintln!("SKIPPED: set SIGNET_PROMTOOL or run scripts/test");
            None
        }
    }
}

/// `/metrics` at `addr` with `accept` (None: no header): (Content-Type, body).
async fn scrape(addr: SocketAddr, accept: Option<&str>) -> (String, String) {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
    let (code, head, body) = http_get_with(addr, "/metrics", &headers).await;
    assert_eq!(code, 200, "{head}\n{body}");
    let content_type = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        })
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    (content_type, body)
}

/// Runs promtool with `args`, `stdin` piped in: (success, stdout + stderr).
fn run_promtool(promtool: &PathBuf, args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(promtool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The series (name and labels, not values: CPU time moves between two scrapes) of an
/// exposition.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_owned())
        .collect()
}

/// Scrapes `addr` in both formats and checks each as the module docs say; returns the text.
async fn check_both_formats(what: &str, addr: SocketAddr) -> String {
    let (ct, text) = scrape(addr, Some(TEXT_ACCEPT)).await;
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8", "{what}");
    let (ct, bare) = scrape(addr, None).await;
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8", "{what}");
    assert!(!bare.contains("# EOF"), "{what}");
    let (ct, om) = scrape(addr, Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!(
        ct, "application/openmetrics-text; version=1.0.0; charset=utf-8",
        "{what}"
    );
    assert!(om.ends_with("# EOF\n"), "{what}: {om}");
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{what}"
    );
    assert_eq!(
        series(&text),
        series(&om),
        "{what}: the two formats hold different series"
    );
    for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        if l.ends_with(" counter") {
            assert!(l.contains("_total counter"), "{what}: {l}");
        }
    }
    let Some(promtool) = promtool() else {
        return text;
    };
    let (ok, out) = run_promtool(&promtool, &["check", "metrics"], &text);
    assert!(
        ok && out.trim().is_empty(),
        "{what}: promtool check metrics:\n{out}\n---\n{text}"
    );
    // OpenMetrics: every sample stamped, then promtool's OpenMetrics parser.
    let stamped: String = om
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                format!("{l}\n")
            } else {
                format!("{l} 1700000000\n")
            }
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.om");
    std::fs::write(&file, &stamped).unwrap();
    let out = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&file)
        .arg(dir.path().join("blocks"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: promtool's OpenMetrics parser refused the exposition:\n{}{}\n---\n{om}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn has_process_metrics(what: &str, text: &str) {
    for family in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
    ] {
        assert!(text.contains(&format!("\n{family}")), "{what}: {family}");
    }
}

#[tokio::test]
async fn the_servers_metrics_pass_promtool_in_both_formats() {
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        tokens: Some(tokens.jwks_json()),
        ..ServerOpts::default()
    })
    .await;
    // One certificate issued, one request refused (a token of an unknown issuer).
    let (csr, _k) = csr_with(&[], &[]);
    let request = |token: &str| {
        signet_client::with_bearer(
            IstioCertificateRequest {
                csr: csr.clone(),
                validity_duration: 60,
                metadata: None,
            },
            token,
        )
        .unwrap()
    };
    server
        .istio()
        .await
        .create_certificate(request(&tokens.token("a", "b")))
        .await
        .unwrap();
    let stranger = TokenIssuer::new("other");
    let refused = server
        .istio()
        .await
        .create_certificate(request(&stranger.token("a", "b")))
        .await;
    assert!(refused.is_err());
    // The CRLs and the first checkpoint are published by loops that start with the server.
    let text = eventually(30, "the CRL and checkpoint gauges", || async {
        let (_, text) = scrape(server.http, None).await;
        (text.contains("signet_crl_next_update_timestamp_seconds{")
            && text.contains("\nsignet_checkpoint_timestamp_seconds "))
        .then_some(text)
    })
    .await;
    for needle in [
        "signet_server_build_info{version=\"",
        "signet_ca_key_expiry_timestamp_seconds{key_id=\"",
        "kind=\"root\",state=\"active\"}",
        "kind=\"intermediate\",state=\"active\"}",
        "\nsignet_server_certificate_expiry_timestamp_seconds ",
        "\nsignet_ledger_head_sequence ",
        "\nsignet_checkpoint_sequence ",
        "signet_issuances_total{api=\"istio\",outcome=\"issued\"} 1",
        "signet_issuance_refusals_total{api=\"istio\",reason=\"authn_failed\"} 1",
        "signet_issuance_refusals_total{api=\"native\",reason=\"store_unavailable\"} 0",
        "signet_node_attestations_total{outcome=\"attested\"} 0",
        "signet_limited_total{limit=\"per_caller\"} 0",
        "\nsignet_audit_events_dropped_total 0",
        "# TYPE signet_audit_events_aggregated_total counter",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
    // The last commit's time is set (the certificates above committed).
    let commit = text
        .lines()
        .find_map(|l| l.strip_prefix("signet_ledger_last_commit_timestamp_seconds "))
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap();
    assert!(commit > 1_700_000_000, "{commit}");
    has_process_metrics("server", &text);
    check_both_formats("signet-server", server.http).await;
}

#[tokio::test]
async fn the_agents_metrics_pass_promtool_in_both_formats() {
    let server = Server::start(ServerOpts::default()).await;
    let token = create_token(&server, "metrics-node");
    let files = agent_files(&server, &token, "", "");
    let agent = RunningAgent::start(&files.config).await;
    let text = eventually(30, "the node certificate's expiry", || async {
        let (_, text) = scrape(agent.http, None).await;
        let expiry = text
            .lines()
            .find_map(|l| l.strip_prefix("signet_agent_node_certificate_expiry_timestamp_seconds "))
            .and_then(|v| v.parse::<i64>().ok())?;
        (expiry > 0).then_some(text)
    })
    .await;
    for needle in [
        "signet_agent_build_info{version=\"",
        "\nsignet_agent_workload_certificate_earliest_expiry_timestamp_seconds 0",
        "signet_agent_server_errors_total{operation=\"sign\",reason=\"unavailable\"} 0",
        "signet_agent_crl_rejections_total{reason=\"not_newer\"} 0",
        "signet_agent_workload_api_sds_requests_total{kind=\"nack\"} 0",
        "\nsignet_agent_renewal_failures_total 0",
        "\nsignet_agent_entries 0",
        "\nsignet_agent_identities_without_certificate 0",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
    has_process_metrics("agent", &text);
    check_both_formats("signet-agent", agent.http).await;
    // An entry for this node: counted by the rotator, signed, none left without a certificate.
    create_entry(&server, "spiffe://example.org/metrics", "metrics-node", &[]);
    eventually(30, "the entry's certificate in the metrics", || async {
        let (_, text) = scrape(agent.http, None).await;
        (text.contains("\nsignet_agent_entries 1\n")
            && text.contains("\nsignet_agent_certificates 1\n"))
        .then_some(text)
    })
    .await;
    let (_, text) = scrape(agent.http, None).await;
    assert!(
        text.contains("\nsignet_agent_identities_without_certificate 0\n"),
        "{text}"
    );
    agent.stop().await;
}

#[tokio::test]
async fn the_bridges_metrics_pass_promtool_in_both_formats() {
    // A kubeconfig naming an API server that is not there: the client is built without
    // contacting it, the controllers' watches fail and retry, /metrics answers.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
         https://127.0.0.1:9\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
         current-context: c\nusers:\n- name: u\n  user:\n    token: t\n",
    )
    .unwrap();
    let port = signet_tests::workload::free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = tokio::process::Command::new(bin("signet-k8s"))
        .args(["run", "--metrics-addr", &addr.to_string()])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("SIGNET_K8S_SERVER")
        .env_remove("SIGNET_K8S_BUNDLE")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let text = eventually(30, "the bridge's /metrics", || async {
        tokio::net::TcpStream::connect(addr).await.ok()?;
        Some(scrape(addr, None).await.1)
    })
    .await;
    for needle in [
        "signet_k8s_build_info{version=\"",
        "signet_k8s_reconciles_total{controller=\"certificate_request\",result=\"success\"} 0",
        "\nsignet_k8s_leader_transitions_total 0",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
    has_process_metrics("bridge", &text);
    check_both_formats("signet-k8s", addr).await;
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}
