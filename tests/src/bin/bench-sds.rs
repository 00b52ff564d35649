//! Envoy SDS push benchmark (issue 27): prints figures, asserts nothing about time.
//!
//! Starts the real `signet-server` (embedded SQLite, or `--database-url`) and the real
//! `signet-agent`, then creates one entry for this process's uid (`unix:uid:<uid>`) and N-1
//! for other uids (`BatchCreateEntries` on the admin socket, one call per 1,000), so the
//! agent holds N certificates. Then, for each stream count S of `--streams`:
//! - opens S `StreamSecrets` streams on the agent's Workload API socket, 10 per connection
//!   (`--per-connection`; the socket allows 16 streams per connection and 128 connections
//!   per uid), each asking for `default` as Envoy does (the node in the first request;
//!   every response ACKed);
//! - revokes the certificate they all hold (`RevocationAdmin.Revoke` by serial, reason
//!   keyCompromise: the call `signetctl certs revoke <serial> --reason keyCompromise` makes).
//!   The agent replaces a revoked certificate at once and pushes the new one on every stream;
//! - prints the time from just before the revoke call to each stream's first response whose
//!   leaf serial differs (min / p50 / p99 / max), the revoke call's own duration, and the
//!   load average; a stream that never gets the new certificate is listed with what it saw.
//!
//! And the agent's resident memory (VmRSS, VmHWM from `/proc/<pid>/status`): holding N
//! entries with no stream, with S streams open, after the push, and after they closed. The
//! agent does not give freed memory back, so a later round starts from the earlier rounds'
//! peak: for a stream's own cost, run one round (`--streams 1000`), and compare
//! `--per-connection` 10 with 1 to tell a connection's cost from a stream's.
//! `--agent-wrapper 'valgrind --tool=massif --massif-out-file=FILE'` runs the agent under a
//! tool that runs it in its own process (the agent is stopped with SIGTERM, so the tool writes
//! its report; the memory figures are then the tool's).
//! Issue 27's targets: every stream updated within 1 s of the renewal; the agent within
//! 20 MB RSS at 1,000 entries with 1,000 SDS streams.
//!
//! The entries' ttl is 1 h, so nothing else renews during a run. The streams live in this
//! process, which shares the machine's cores with the agent and the server: the times include
//! its own scheduling.
//!
//! ```sh
//! cargo build --release --bins && target/release/bench-sds
//! ```
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use prost::Message;
use signet_client::admin::{RevocationAdminClient, RevokeSelector};
use signet_proto::admin::{BatchCreateEntriesRequest, CreateEntryRequest};
use signet_proto::envoy::config::core::v3 as core;
use signet_proto::envoy::extensions::transport_sockets::tls::v3 as tls;
use signet_proto::envoy::service::discovery::v3 as xds;
use signet_proto::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use signet_proto::envoy::r#type::v3::SemanticVersion;
use signet_runtime::clock::{Clock, SystemClock};
use signet_tests::bench::{
    Memory, bench_node, free_port, load_average, metric_sum, scrape, spawn_agent, wait_until,
};
use signet_tests::{Server, ServerOpts};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::transport::Channel;

const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// How long opening a round's streams (each answered once) may take.
const OPEN_LIMIT: Duration = Duration::from_secs(120);
/// How long after the revoke call every stream may take to get the new certificate before
/// the round gives up on the rest (and lists them).
const PUSH_LIMIT: Duration = Duration::from_secs(30);
/// The real monotonic clock (benchmarks read it through the runtime's clock, as clippy.toml
/// says).
fn now() -> Instant {
    SystemClock.monotonic()
}

const MY_ID: &str = "spiffe://example.org/bench/sds";

struct Args {
    entries: usize,
    streams: Vec<usize>,
    /// Streams per HTTP/2 connection (the agent allows 16).
    per_connection: usize,
    database_url: Option<String>,
    agent_wrapper: Vec<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        entries: 1000,
        streams: vec![1, 100, 1000],
        per_connection: 10,
        database_url: None,
        agent_wrapper: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--entries" => a.entries = val().parse().unwrap_or_else(|_| usage("bad --entries")),
            "--streams" => {
                a.streams = val()
                    .split(',')
                    .map(|s| s.trim().parse().unwrap_or_else(|_| usage("bad --streams")))
                    .collect()
            }
            "--per-connection" => {
                a.per_connection = val()
                    .parse()
                    .unwrap_or_else(|_| usage("bad --per-connection"))
            }
            "--database-url" => a.database_url = Some(val()),
            "--agent-wrapper" => {
                a.agent_wrapper = val().split_whitespace().map(str::to_owned).collect()
            }
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if a.entries == 0 {
        usage("--entries must be at least 1");
    }
    if a.per_connection == 0 {
        usage("--per-connection must be at least 1");
    }
    if a.streams.is_empty() || a.streams.contains(&0) {
        usage("--streams: a list of counts, each at least 1");
    }
    a
}

fn usage(msg: &str) -> ! {
    if !msg.is_empty() {
        eprintln!("bench-sds: {msg}");
    }
    eprintln!(
        "usage: bench-sds [--entries N (1000)] [--streams S,S,… (1,100,1000)] \
         [--per-connection K (10)] \
         [--database-url URL (embedded SQLite)] [--agent-wrapper 'CMD ARGS' (none)]"
    );
    std::process::exit(2)
}

fn fail(msg: &str) -> ! {
    eprintln!("bench-sds: {msg}");
    std::process::exit(1)
}

fn envoy_node() -> core::Node {
    core::Node {
        id: "sidecar~10.0.0.1~bench".into(),
        cluster: "bench".into(),
        user_agent_name: "envoy".into(),
        user_agent_version_type: Some(core::node::UserAgentVersionType::UserAgentBuildVersion(
            core::BuildVersion {
                version: Some(SemanticVersion {
                    major_number: 1,
                    minor_number: 30,
                    patch: 0,
                }),
                metadata: None,
            },
        )),
        ..Default::default()
    }
}

/// The first request (with the node) when `ack` is `None`, else the ACK of `ack`.
fn request(ack: Option<&xds::DiscoveryResponse>) -> xds::DiscoveryRequest {
    xds::DiscoveryRequest {
        version_info: ack.map(|r| r.version_info.clone()).unwrap_or_default(),
        node: ack.is_none().then(envoy_node),
        resource_names: vec!["default".into()],
        type_url: SECRET_TYPE_URL.into(),
        response_nonce: ack.map(|r| r.nonce.clone()).unwrap_or_default(),
        error_detail: None,
    }
}

/// The serial of the leaf in the response's `default` TlsCertificate.
fn leaf_serial(r: &xds::DiscoveryResponse) -> Result<String, String> {
    let [any] = r.resources.as_slice() else {
        return Err(format!("{} resources, not 1", r.resources.len()));
    };
    let secret = tls::Secret::decode(any.value.as_slice()).map_err(|e| e.to_string())?;
    let Some(tls::secret::Type::TlsCertificate(c)) = &secret.r#type else {
        return Err(format!("{:?} is not a TlsCertificate", secret.name));
    };
    let Some(core::data_source::Specifier::InlineBytes(pem)) = c
        .certificate_chain
        .as_ref()
        .and_then(|d| d.specifier.as_ref())
    else {
        return Err("no inline certificate chain".into());
    };
    let der = signet_types::pem::parse_certs(pem)
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("an empty chain")?;
    let leaf = signet_pki::ParsedCert::from_der(&der).map_err(|e| e.to_string())?;
    Ok(leaf.serial_hex().to_owned())
}

/// What one stream saw after the revoke.
struct Outcome {
    stream: usize,
    connection: usize,
    /// When the first response with another leaf serial arrived, and that serial.
    new: Option<(Instant, String)>,
    /// Responses after the first that still carried the old serial.
    old_pushes: u64,
    /// Responses that could not be read as one TlsCertificate (the last reason).
    unreadable: Option<String>,
    /// How the stream ended without the new certificate.
    end: Option<String>,
}

/// One SDS stream as Envoy runs it: subscribe to `default`, ACK every response. Reports its
/// first leaf serial on `ready`, then its [`Outcome`] on `done` once it has the new one (or
/// ended, or `close` came first), and keeps the stream open until `close`.
async fn one_stream(
    stream: usize,
    connection: usize,
    channel: Channel,
    ready: mpsc::UnboundedSender<Result<String, String>>,
    done: mpsc::UnboundedSender<Outcome>,
    mut close: watch::Receiver<bool>,
) {
    // Kept until the end: the agent ends a stream whose requests side closes.
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(request(None)).unwrap();
    let mut client = SecretDiscoveryServiceClient::new(channel);
    let opened = tokio::time::timeout(OPEN_LIMIT, async {
        let mut responses = client
            .stream_secrets(rx)
            .await
            .map_err(|s| format!("StreamSecrets refused: {s}"))?
            .into_inner();
        let first = responses
            .message()
            .await
            .map_err(|s| format!("first response: {s}"))?
            .ok_or("the stream ended before its first response")?;
        let serial = leaf_serial(&first)?;
        Ok::<_, String>((responses, first, serial))
    })
    .await
    .unwrap_or_else(|_| Err(format!("no first response within {OPEN_LIMIT:?}")));
    let (mut responses, first, first_serial) = match opened {
        Ok(x) => x,
        Err(why) => {
            let _ = ready.send(Err(why));
            return;
        }
    };
    tx.unbounded_send(request(Some(&first))).unwrap();
    let _ = ready.send(Ok(first_serial.clone()));

    let mut out = Some(Outcome {
        stream,
        connection,
        new: None,
        old_pushes: 0,
        unreadable: None,
        end: None,
    });
    loop {
        tokio::select! {
            m = responses.message() => match m {
                Ok(Some(r)) => {
                    let at = now();
                    let _ = tx.unbounded_send(request(Some(&r)));
                    let Some(o) = out.as_mut() else { continue };
                    match leaf_serial(&r) {
                        Ok(serial) if serial != first_serial => {
                            o.new = Some((at, serial));
                            let _ = done.send(out.take().unwrap());
                        }
                        Ok(_) => o.old_pushes += 1,
                        Err(why) => o.unreadable = Some(why),
                    }
                }
                Ok(None) => {
                    if let Some(o) = out.as_mut() {
                        o.end = Some("the agent ended the stream".into());
                    }
                    break;
                }
                Err(s) => {
                    if let Some(o) = out.as_mut() {
                        o.end = Some(format!("the stream failed: {s}"));
                    }
                    break;
                }
            },
            _ = close.changed() => {
                if let Some(o) = out.as_mut() {
                    o.end = Some(format!("still open, no new certificate {PUSH_LIMIT:?} after the revoke"));
                }
                break;
            }
        }
    }
    if let Some(o) = out {
        let _ = done.send(o);
    }
    // Stay open until the round closes every stream at once.
    let _ = close.wait_for(|c| *c).await;
    drop(tx);
}

/// The figures of one round.
struct Round {
    streams: usize,
    connections: usize,
    /// From the first connect to every stream answered once.
    open: Duration,
    revoke_call: Duration,
    /// The serials the streams held before the revoke (serial -> streams).
    before: BTreeMap<String, usize>,
    /// Revoke -> new certificate, per stream that got it, sorted.
    latencies: Vec<Duration>,
    /// The serials the streams got (serial -> streams).
    after: BTreeMap<String, usize>,
    missed: Vec<Outcome>,
    old_pushes: u64,
    unreadable: usize,
    mem_open: Memory,
    mem_pushed: Memory,
    mem_closed: Memory,
    load: String,
}

async fn round(
    socket: &Path,
    s: usize,
    per_connection: usize,
    revocation: &RevocationAdminClient,
    pid: u32,
) -> Round {
    let connections = s.div_ceil(per_connection);
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let (close_tx, close_rx) = watch::channel(false);
    let mut tasks = Vec::with_capacity(s);
    let t_open = now();
    for c in 0..connections {
        // One HTTP/2 connection per channel (the connector dials the socket once).
        let channel = signet_client::connect_admin(socket)
            .await
            .unwrap_or_else(|e| fail(&format!("connection {c} to the Workload API: {e}")));
        for k in c * per_connection..s.min((c + 1) * per_connection) {
            tasks.push(tokio::spawn(one_stream(
                k,
                c,
                channel.clone(),
                ready_tx.clone(),
                done_tx.clone(),
                close_rx.clone(),
            )));
        }
    }
    drop((ready_tx, done_tx));
    let mut before = BTreeMap::new();
    let mut refused = BTreeMap::<String, usize>::new();
    for _ in 0..s {
        match ready_rx.recv().await {
            Some(Ok(serial)) => *before.entry(serial).or_insert(0) += 1,
            Some(Err(why)) => *refused.entry(why).or_insert(0) += 1,
            None => fail("a stream task ended without a word"),
        }
    }
    if !refused.is_empty() {
        for (why, k) in &refused {
            eprintln!("bench-sds: {k} of {s} streams did not open: {why}");
        }
        fail("streams did not open (a bug, or a cap of the agent's socket)");
    }
    let open = now() - t_open;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mem_open = Memory::of(pid);

    // The serial most streams hold (all of them, unless a renewal ran while they opened).
    let serial = before
        .iter()
        .max_by_key(|(_, k)| **k)
        .map(|(serial, _)| serial.clone())
        .unwrap();
    let t0 = now();
    let report = revocation
        .revoke(
            RevokeSelector::Serial(serial.clone()),
            "keyCompromise",
            false,
        )
        .await
        .unwrap_or_else(|e| fail(&format!("revoke {serial}: {e}")));
    let revoke_call = now() - t0;
    if report.revoked_count != 1 {
        eprintln!(
            "bench-sds: revoking {serial} revoked {} certificates ({} already revoked)",
            report.revoked_count, report.already_revoked_count
        );
    }

    let mut outcomes = Vec::with_capacity(s);
    let deadline = t0 + PUSH_LIMIT;
    while outcomes.len() < s {
        match tokio::time::timeout_at(deadline, done_rx.recv()).await {
            Ok(Some(o)) => outcomes.push(o),
            Ok(None) => fail("a stream task ended without a word"),
            // Time is up: the streams still waiting report what they saw.
            Err(_) => break,
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mem_pushed = Memory::of(pid);
    let load = load_average();
    close_tx.send(true).unwrap();
    while let Some(o) = done_rx.recv().await {
        outcomes.push(o);
    }
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mem_closed = Memory::of(pid);

    let mut latencies = Vec::with_capacity(s);
    let mut after = BTreeMap::new();
    let mut missed = Vec::new();
    let mut old_pushes = 0;
    let mut unreadable = 0;
    for o in outcomes {
        old_pushes += o.old_pushes;
        unreadable += usize::from(o.unreadable.is_some());
        match &o.new {
            Some((at, serial)) => {
                latencies.push(at.saturating_duration_since(t0));
                *after.entry(serial.clone()).or_insert(0) += 1;
            }
            None => missed.push(o),
        }
    }
    latencies.sort();
    missed.sort_by_key(|o| o.stream);
    Round {
        streams: s,
        connections,
        open,
        revoke_call,
        before,
        latencies,
        after,
        missed,
        old_pushes,
        unreadable,
        mem_open,
        mem_pushed,
        mem_closed,
        load,
    }
}

/// The nearest-rank percentile of sorted `v`.
fn percentile(v: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

impl Round {
    fn print(&self) {
        let s = self.streams;
        println!(
            "  {s} stream(s) on {} connection(s): all open and answered in {}",
            self.connections,
            ms(self.open)
        );
        if self.before.len() > 1 {
            println!(
                "    the streams held {} different serials before the revoke: {:?}",
                self.before.len(),
                self.before
            );
        }
        println!(
            "    revoke call (Revoke by serial, keyCompromise)  {}",
            ms(self.revoke_call)
        );
        if let (Some(min), Some(max)) = (self.latencies.first(), self.latencies.last()) {
            println!(
                "    revoke -> new secret on the stream   min {}  p50 {}  p99 {}  max {}",
                ms(*min),
                ms(percentile(&self.latencies, 50.0)),
                ms(percentile(&self.latencies, 99.0)),
                ms(*max)
            );
        }
        let within_1s = self
            .latencies
            .iter()
            .filter(|d| **d <= Duration::from_secs(1))
            .count();
        println!(
            "    streams with the new secret          {} of {s} ({within_1s} within 1 s); new serials {:?}",
            self.latencies.len(),
            self.after.keys().collect::<Vec<_>>()
        );
        println!(
            "    responses with the old serial after the first: {}; unreadable responses: {}",
            self.old_pushes, self.unreadable
        );
        for o in &self.missed {
            println!(
                "    BUG: stream {} (connection {}) never got the new certificate: {}; \
                 {} responses with the old serial{}",
                o.stream,
                o.connection,
                o.end.as_deref().unwrap_or("?"),
                o.old_pushes,
                o.unreadable
                    .as_ref()
                    .map(|w| format!(", unreadable: {w}"))
                    .unwrap_or_default()
            );
        }
        self.mem_open.print(&format!("  RSS, {s} stream(s) open"));
        self.mem_pushed
            .print(&format!("  RSS, {s} stream(s) open, after the push"));
        self.mem_closed
            .print(&format!("  RSS, {s} stream(s) closed"));
        println!(
            "    peak RSS (VmHWM) so far                      {}",
            mb(self.mem_closed.hwm_kb)
        );
        println!(
            "    load average after the push                  {}",
            self.load
        );
    }
}

/// `signet_agent_certificates`, the certificates the agent holds (0 when it does not answer).
async fn agent_certificates(http: SocketAddr) -> f64 {
    metric_sum(&scrape(http).await, "signet_agent_certificates", &[])
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let n = args.entries;

    let server = Server::start(ServerOpts {
        database_url: args.database_url.clone(),
        extra_toml: String::new(),
        env: vec![],
        data_dir: None,
        tokens: None,
    })
    .await;
    let (mut admin, token) = bench_node(&server).await;
    let revocation = RevocationAdminClient::connect(&server.admin_socket())
        .await
        .expect("admin socket");

    let dir = tempfile::tempdir().unwrap();
    let uid = std::fs::metadata(dir.path()).unwrap().uid();
    let socket = dir.path().join("agent.sock");
    let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "server_address = \"https://127.0.0.1:{port}\"\n\
             trust_bundle_file = \"{bundle}\"\n\
             join_token = \"{token}\"\n\
             data_dir = \"{data}\"\n\
             workload_api_socket = \"{socket}\"\n\
             http_listen = \"{http}\"\n",
            port = server.grpc.port(),
            bundle = server.bundle_path().display(),
            data = dir.path().join("data").display(),
            socket = socket.display(),
        ),
    )
    .unwrap();
    let log_path = dir.path().join("agent.log");
    eprintln!("bench-sds: agent log at {}", log_path.display());
    let mut agent = spawn_agent(&config, &log_path, &args.agent_wrapper);
    let pid = agent.id().unwrap();

    // This process's entry, then N-1 for other uids (never this one).
    let entry = |spiffe_id: String, uid: u32| CreateEntryRequest {
        spiffe_id,
        parent: "bench".into(),
        selectors: vec![format!("unix:uid:{uid}")],
        ttl_seconds: 3600,
        dns_names: vec![],
        jwt_ttl_seconds: 0,
        federates_with: vec![],
    };
    admin
        .create_entry(entry(MY_ID.into(), uid))
        .await
        .expect("create entry");
    let other_uid = |i: usize| {
        let u = 60000 + u32::try_from(i).unwrap();
        if u >= uid { u + 1 } else { u }
    };
    let t0 = now();
    let rest: Vec<CreateEntryRequest> = (1..n)
        .map(|i| entry(format!("spiffe://example.org/bench/app-{i}"), other_uid(i)))
        .collect();
    for chunk in rest.chunks(1000) {
        admin
            .batch_create_entries(BatchCreateEntriesRequest {
                entries: chunk.to_vec(),
            })
            .await
            .expect("batch create entries");
    }
    let created = now() - t0;
    let mut held = 0.0;
    let limit = Duration::from_secs(600);
    let start = now();
    while held < n as f64 {
        if now() - start > limit {
            fail(&format!(
                "the agent holds {held} of {n} certificates after {limit:?}; its log: {}",
                log_path.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        held = agent_certificates(http).await;
    }
    let all_held = now() - t0;
    // Settle, then the memory with no stream.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mem_idle = Memory::of(pid);
    // The socket answers SDS (the agent may still be starting its listener).
    wait_until(Duration::from_secs(60), Duration::from_millis(100), || {
        socket.exists()
    })
    .await
    .unwrap_or_else(|| fail("no Workload API socket within 60 s"));

    let mut rounds = Vec::new();
    for &s in &args.streams {
        eprintln!("bench-sds: {s} stream(s)");
        rounds.push(round(&socket, s, args.per_connection, &revocation, pid).await);
    }
    let metrics = scrape(http).await;
    let end = Memory::of(pid);

    let store = if args.database_url.is_some() {
        "PostgreSQL"
    } else {
        "embedded SQLite"
    };
    println!(
        "signet-agent SDS pushes ({store} server, agent and streams on the same machine, {} cores)",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!(
        "  {n} entries (1 for this uid {uid}, {} for other uids), ttl 1 h: created in {}, all {n} certificates held {} after",
        n - 1,
        ms(created),
        ms(all_held)
    );
    mem_idle.print(&format!("RSS holding {n} entries, no SDS stream"));
    println!(
        "  peak RSS (VmHWM) so far                        {}",
        mb(mem_idle.hwm_kb)
    );
    for r in &rounds {
        r.print();
    }
    println!(
        "  agent's SDS counters: responses {}, requests: subscribe {}, ack {}, stale {}, nack {}; refused {}",
        metric_sum(
            &metrics,
            "signet_agent_workload_api_sds_responses_total",
            &[]
        ),
        metric_sum(
            &metrics,
            "signet_agent_workload_api_sds_requests_total",
            &["kind=\"subscribe\""]
        ),
        metric_sum(
            &metrics,
            "signet_agent_workload_api_sds_requests_total",
            &["kind=\"ack\""]
        ),
        metric_sum(
            &metrics,
            "signet_agent_workload_api_sds_requests_total",
            &["kind=\"stale\""]
        ),
        metric_sum(
            &metrics,
            "signet_agent_workload_api_sds_requests_total",
            &["kind=\"nack\""]
        ),
        metric_sum(&metrics, "signet_agent_workload_api_sds_refused_total", &[]),
    );
    println!(
        "  agent's revoked-certificate replacements {}, renewals {}",
        metric_sum(&metrics, "signet_agent_compromised_replacements_total", &[]),
        metric_sum(&metrics, "signet_agent_renewals_total", &[]),
    );
    end.print("RSS at the end");
    println!(
        "  peak RSS (VmHWM) over the run                  {}",
        mb(end.hwm_kb)
    );
    println!(
        "  issue 27 targets: every stream updated within 1 s of the renewal; \
         agent within 20 MB RSS at 1,000 entries with 1,000 SDS streams"
    );

    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
    if tokio::time::timeout(Duration::from_secs(30), agent.wait())
        .await
        .is_err()
    {
        agent.kill().await.ok();
    }
    drop(server);
}
