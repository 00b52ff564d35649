//! Traces, for real: the server and the agent export to a small OTLP/gRPC receiver
//! ([`signet_tests::otlp`]). An Istio CreateCertificate carrying a W3C `traceparent` is one
//! trace continuing the caller's (handler span, then authn, policy, sign and the ledger commit
//! as its children), with the SPIFFE ID, serial and outcome as attributes and never the token,
//! the CSR or a key, and the spans still queued at shutdown are flushed; an agent's renewal is
//! one trace across the agent and the server; a dead collector neither blocks issuance
//! nor the shutdown; and a collector over mutual TLS gets the spans, while one whose
//! certificate the configured CA did not sign gets none and issuance goes on.

use std::time::{Duration, Instant};

use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::otlp::{OtlpReceiver, ReceivedSpan, TestPki};
use signet_tests::*;

use crate::agent::{Agent, create_entry, create_token, eventually, fetch_svid, write_config};
use crate::pg_server;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const ISTIO: &str = "istio.v1.auth.IstioCertificateService/CreateCertificate";

/// `[telemetry]` sending to `endpoint`, batches sent after `delay`.
fn telemetry_toml(endpoint: &str, delay: &str) -> String {
    format!("\n[telemetry]\notlp_endpoint = \"{endpoint}\"\nbatch_delay = \"{delay}\"\n")
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Option<&'a ReceivedSpan> {
    spans.iter().find(|s| s.name == name)
}

#[tokio::test]
async fn an_istio_issuance_is_one_trace_that_continues_the_callers() {
    let receiver = OtlpReceiver::start().await;
    let tokens = TokenIssuer::new("k1");
    // No batch is due before the server stops: the spans arrive through the flush at shutdown.
    let toml = telemetry_toml(&receiver.endpoint(), "1h");
    let Some(server) = pg_server(&tokens, &toml).await else {
        return;
    };
    let token = tokens.token("payments", "api");
    let (csr, _key) = csr_with(&[], &[]);
    let mut req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr: csr.clone(),
            validity_duration: 600,
            metadata: None,
        },
        &token,
    )
    .unwrap();
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    let chain = server
        .istio()
        .await
        .create_certificate(req)
        .await
        .unwrap()
        .into_inner()
        .cert_chain;
    let serial = serial_of(&chain[0]);
    server.stop().await;

    let steps = ["authn", "policy", "sign", "ledger.commit"];
    let spans = receiver
        .wait_for(Duration::from_secs(20), "the issuance's spans", |spans| {
            let ours: Vec<_> = spans.iter().filter(|s| s.trace_id == TRACE_ID).collect();
            std::iter::once(ISTIO)
                .chain(steps)
                .all(|n| ours.iter().any(|s| s.name == n))
        })
        .await;
    let ours: Vec<ReceivedSpan> = spans
        .into_iter()
        .filter(|s| s.trace_id == TRACE_ID)
        .collect();

    // The handler span is the caller's span's child, and says how the call ended.
    let handler = named(&ours, ISTIO).unwrap();
    assert_eq!(handler.service, "signet-server");
    assert_eq!(handler.parent_span_id, CALLER_SPAN, "{handler:#?}");
    assert_eq!(handler.attr("rpc.grpc.status_code"), Some("0"));
    assert_eq!(handler.attr("outcome"), Some("ok"));

    // Each step is a child of the handler span.
    for step in steps {
        let s = named(&ours, step).unwrap();
        assert_eq!(s.parent_span_id, handler.span_id, "{step}: {s:#?}");
        assert_eq!(s.attr("outcome"), Some("ok"), "{step}: {s:#?}");
    }
    let spiffe_id = "spiffe://example.org/ns/payments/sa/api";
    let authn = named(&ours, "authn").unwrap();
    assert_eq!(authn.attr("caller"), Some(&*format!("jwt:{spiffe_id}")));
    let sign = named(&ours, "sign").unwrap();
    assert_eq!(sign.attr("spiffe_id"), Some(spiffe_id));
    assert_eq!(sign.attr("serial"), Some(serial.as_str()));
    let ledger = named(&ours, "ledger.commit").unwrap();
    assert_eq!(ledger.attr("serial"), Some(serial.as_str()));
    let seq: u64 = ledger.attr("seq").unwrap().parse().unwrap();
    let first: u64 = ledger.attr("batch_first_seq").unwrap().parse().unwrap();
    let size: u64 = ledger.attr("batch_size").unwrap().parse().unwrap();
    assert!(
        size >= 1 && first <= seq && seq < first + size,
        "{ledger:#?}"
    );

    // Never a secret: not the token, not the CSR, no key, no certificate body.
    let csr_body: String = csr.lines().filter(|l| !l.starts_with("-----")).collect();
    let leaf_body: String = chain[0]
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    for s in &ours {
        let values = s
            .attributes
            .values()
            .cloned()
            .chain(s.events.iter().cloned());
        for v in values {
            for bad in [
                token.as_str(),
                "PRIVATE KEY",
                "BEGIN",
                &csr_body[..40],
                &leaf_body[..40],
            ] {
                assert!(!v.contains(bad), "span {} carries {bad:?}: {v}", s.name);
            }
        }
    }
}

#[tokio::test]
async fn an_agent_renewal_is_one_trace_across_agent_and_server() {
    let receiver = OtlpReceiver::start().await;
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, &telemetry_toml(&receiver.endpoint(), "50ms")).await
    else {
        return;
    };
    let app = "spiffe://example.org/traced-app";
    let token = create_token(&server, "vm-traced");
    create_entry(&server, app, "vm-traced", &[]);
    let l = write_config(&server, &token, app);
    let mut toml = std::fs::read_to_string(&l.config).unwrap();
    toml.push_str(&telemetry_toml(&receiver.endpoint(), "50ms"));
    std::fs::write(&l.config, toml).unwrap();
    let agent = Agent::start(&l.config);
    eventually(30, "an SVID from the Workload API", || {
        fetch_svid(&l.socket)
    })
    .await;

    let is_renewal = |s: &ReceivedSpan| {
        s.service == "signet-agent"
            && s.name == "agent.renew_workloads"
            && s.attr("spiffe_ids").is_some_and(|v| v.contains(app))
    };
    let spans = receiver
        .wait_for(
            Duration::from_secs(20),
            "the agent's renewal and the server's spans",
            |spans| {
                spans.iter().filter(|s| is_renewal(s)).any(|r| {
                    spans.iter().any(|s| {
                        s.trace_id == r.trace_id
                            && s.name == "sign"
                            && s.attr("spiffe_id") == Some(app)
                    })
                })
            },
        )
        .await;
    let renewal = spans
        .iter()
        .filter(|s| is_renewal(s))
        .find(|r| {
            spans
                .iter()
                .any(|s| s.trace_id == r.trace_id && s.attr("spiffe_id") == Some(app))
        })
        .unwrap();
    assert_eq!(renewal.attr("signed"), Some("1"), "{renewal:#?}");
    // The server's handler continues the agent's span.
    let handler = spans
        .iter()
        .find(|s| s.trace_id == renewal.trace_id && s.name == "signet.agent.v1.Node/SignWorkloads")
        .unwrap_or_else(|| panic!("no SignWorkloads span in the renewal's trace: {spans:#?}"));
    assert_eq!(handler.service, "signet-server");
    assert_eq!(handler.parent_span_id, renewal.span_id);
    assert_eq!(handler.attr("outcome"), Some("ok"));
    let sign = spans
        .iter()
        .find(|s| s.trace_id == renewal.trace_id && s.name == "sign")
        .unwrap();
    assert_eq!(sign.parent_span_id, handler.span_id);
    agent.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_dead_collector_blocks_neither_issuance_nor_shutdown() {
    // A port nobody listens on: bound, then closed.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let tokens = TokenIssuer::new("k1");
    let extra = format!(
        "{}export_timeout = \"1s\"\nmax_queue_size = 16\n",
        telemetry_toml(&format!("http://{dead}"), "50ms")
    );
    let Some(server) = pg_server(&tokens, &extra).await else {
        return;
    };
    let mut istio = server.istio().await;
    // More spans than the queue holds: the excess is dropped, issuance goes on.
    for _ in 0..5 {
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
        let started = Instant::now();
        istio.create_certificate(req).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    let pid = server.pid().unwrap();
    let started = Instant::now();
    server.stop().await;
    // Stopped by SIGTERM within the bounded flush, not by the 20 s kill fallback.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

/// One Istio issuance with a fresh token and CSR, which must answer within 5 s.
async fn issue_once(server: &Server, tokens: &TokenIssuer) {
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
    let started = Instant::now();
    server.istio().await.create_certificate(req).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn traces_reach_a_collector_over_mutual_tls() {
    let pki = TestPki::new("collector");
    let collector_cert = pki.issue("collector");
    let client = pki.issue("signet-server");
    // Only clients with a certificate of this CA are served.
    let receiver = OtlpReceiver::start_tls(&collector_cert, Some(&pki)).await;
    assert!(receiver.endpoint().starts_with("https://127.0.0.1:"));
    let tokens = TokenIssuer::new("k1");
    let extra = format!(
        "{}otlp_ca_file = \"{}\"\notlp_client_cert_file = \"{}\"\notlp_client_key_file = \"{}\"\n",
        telemetry_toml(&receiver.endpoint(), "50ms"),
        pki.ca_file.display(),
        client.cert_file.display(),
        client.key_file.display(),
    );
    let Some(server) = pg_server(&tokens, &extra).await else {
        return;
    };
    issue_once(&server, &tokens).await;
    let spans = receiver
        .wait_for(
            Duration::from_secs(20),
            "the issuance's spans over TLS",
            |spans| {
                spans
                    .iter()
                    .any(|s| s.service == "signet-server" && s.name == ISTIO)
            },
        )
        .await;
    let handler = named(&spans, ISTIO).unwrap();
    assert_eq!(handler.attr("outcome"), Some("ok"), "{handler:#?}");
    server.stop().await;
}

#[tokio::test]
async fn a_collector_the_configured_ca_did_not_sign_gets_nothing_and_issuance_goes_on() {
    let trusted = TestPki::new("trusted");
    let other = TestPki::new("other");
    // The collector's certificate is from another CA than the one the server is told to trust.
    let receiver = OtlpReceiver::start_tls(&other.issue("collector"), None).await;
    let tokens = TokenIssuer::new("k1");
    let extra = format!(
        "{}export_timeout = \"1s\"\notlp_ca_file = \"{}\"\n",
        telemetry_toml(&receiver.endpoint(), "50ms"),
        trusted.ca_file.display(),
    );
    let Some(server) = pg_server(&tokens, &extra).await else {
        return;
    };
    for _ in 0..5 {
        issue_once(&server, &tokens).await;
    }
    assert_eq!(server.http_get("/readyz").await.0, 200);
    let started = Instant::now();
    // The stop flushes what is queued (bounded by export_timeout): every export has been tried
    // once it returns.
    server.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(
        receiver.spans().is_empty(),
        "spans crossed an unverified TLS connection: {:#?}",
        receiver.spans()
    );
}
