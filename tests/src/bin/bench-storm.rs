//! Renewal-storm benchmark: prints figures, asserts nothing about time.
//!
//! Starts the real `signet-server` (embedded SQLite, or `--database-url`) on fixed loopback
//! ports and `--agents` real `signet-agent` processes (each its own data directory, join token
//! and node), each with `--entries` registration entries delivered by `files` sinks, waits
//! until every certificate is on disk, then makes every certificate due at once, twice:
//! 1. **taint**: `ca prepare` + `ca activate` a new intermediate, `ca taint` the old one (the
//!    agents learn it from their bundle stream and replace everything issued under it);
//! 2. **outage**: stop the server for `--outage`, the entries' TTL (`--ttl`, default the
//!    outage) short enough that every certificate comes due while it is down, then start it
//!    again on the same ports and data.
//!
//! For each it prints the time from the trigger (the taint; the restart) until every sink
//! holds a new certificate (read from the files: a new serial, and after the taint an issuer
//! other than the tainted key), the requests the server refused or failed (its metrics) and
//! the renewal attempts that failed on the agents (theirs), how many certificates were never
//! renewed (0 = no failed request was left unretried), the server's peak RSS (VmHWM) and the
//! agents' RSS, and after the restart the server's issuances per 1-second bucket (the arrival
//! profile: a thundering herd shows as everything in the first second or two).
//!
//! ```sh
//! cargo build --release --workspace --bins
//! target/release/bench-storm --agents 20 --entries 1000 [--database-url URL] [--outage 300s]
//! ```
//!
//! With PostgreSQL, give it a fresh database (the nodes `storm-0`… and their entries are
//! created anew). `--outage 30s` (the TTL follows) makes a short run for checking.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A benchmark measures real time (clippy.toml bans wall-clock reads in the products' logic).
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use signet_proto::admin::ca_admin_client::CaAdminClient;
use signet_proto::admin::node_admin_client::NodeAdminClient;
use signet_proto::admin::{
    BatchCreateEntriesRequest, CaKeyRequest, CaPrepareRequest, CaStatusRequest, CreateEntryRequest,
    CreateJoinTokenRequest,
};
use signet_tests::bench::{FixedServer, LeafInfo, free_port, leaf_info, metric_sum, scrape};
use signet_tests::bench::{status_kb, wait_until};
use signet_tests::bin;
use tokio::process::{Child, Command};

struct Args {
    agents: usize,
    entries: usize,
    database_url: Option<String>,
    outage: Duration,
    ttl: Option<Duration>,
    sync_interval: String,
    concurrency: usize,
    timeout: Duration,
    taint: bool,
    outage_phase: bool,
    keep: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        agents: 20,
        entries: 1000,
        database_url: None,
        outage: Duration::from_secs(300),
        ttl: None,
        sync_interval: "5s".into(),
        concurrency: 64,
        timeout: Duration::from_secs(900),
        taint: true,
        outage_phase: true,
        keep: false,
    };
    let mut it = std::env::args().skip(1);
    let dur = |v: String, what: &str| {
        humantime::parse_duration(&v).unwrap_or_else(|_| usage(&format!("bad {what} {v}")))
    };
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--agents" => a.agents = val().parse().unwrap_or_else(|_| usage("bad --agents")),
            "--entries" => a.entries = val().parse().unwrap_or_else(|_| usage("bad --entries")),
            "--database-url" => a.database_url = Some(val()),
            "--outage" => a.outage = dur(val(), "--outage"),
            "--ttl" => a.ttl = Some(dur(val(), "--ttl")),
            "--sync-interval" => a.sync_interval = val(),
            "--concurrency" => {
                a.concurrency = val().parse().unwrap_or_else(|_| usage("bad --concurrency"))
            }
            "--timeout" => a.timeout = dur(val(), "--timeout"),
            "--no-taint" => a.taint = false,
            "--no-outage" => a.outage_phase = false,
            "--keep" => a.keep = true,
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if a.agents == 0 || a.entries == 0 || a.concurrency == 0 {
        usage("--agents, --entries and --concurrency must be at least 1");
    }
    a
}

fn usage(msg: &str) -> ! {
    if !msg.is_empty() {
        eprintln!("bench-storm: {msg}");
    }
    eprintln!(
        "usage: bench-storm [--agents N (20)] [--entries M per agent (1000)] \
         [--database-url URL (embedded SQLite)] [--outage D (300s)] [--ttl D (the outage)] \
         [--sync-interval D (5s)] [--concurrency C (64 batch entry creations at once, 1,000 entries each)] \
         [--timeout D (900s per wait)] [--no-taint] [--no-outage] [--keep (the logs and data)]"
    );
    std::process::exit(2)
}

/// One `signet-agent` process and the sinks it writes.
struct Agent {
    child: Child,
    pid: u32,
    http: SocketAddr,
    node_id: String,
    log: PathBuf,
}

/// One entry's sink: where its certificate lands.
struct Sink {
    agent: usize,
    spiffe_id: String,
    dir: PathBuf,
}

impl Sink {
    fn leaf(&self) -> Option<LeafInfo> {
        leaf_info(&self.dir.join("svid.pem"))
    }
}

/// What the server's and the agents' metrics say, summed.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    issued: f64,
    /// Issuances answered ResourceExhausted or Unavailable, and requests refused by a limit.
    refused: f64,
    /// Every other failed issuance (denied, invalid, internal…).
    failed: f64,
    agent_renewals: f64,
    agent_failures: f64,
}

fn server_counts(text: &str) -> Counts {
    let total = metric_sum(text, "signet_issuances_total", &[]);
    let issued = metric_sum(text, "signet_issuances_total", &["outcome=\"issued\""]);
    let exhausted = metric_sum(
        text,
        "signet_issuances_total",
        &["outcome=\"resource_exhausted\""],
    );
    let unavailable = metric_sum(text, "signet_issuances_total", &["outcome=\"unavailable\""]);
    let limited = metric_sum(text, "signet_limited_total", &[]);
    Counts {
        issued,
        refused: exhausted + unavailable + limited,
        failed: (total - issued - exhausted - unavailable).max(0.0),
        ..Counts::default()
    }
}

async fn agent_counts(agents: &[Agent]) -> Counts {
    let mut c = Counts::default();
    for a in agents {
        let text = scrape(a.http).await;
        c.agent_renewals += metric_sum(&text, "signet_agent_renewals_total", &[]);
        c.agent_failures += metric_sum(&text, "signet_agent_renewal_failures_total", &[]);
    }
    c
}

/// The server's counters sampled every second while a phase runs: the arrival profile.
#[derive(Default)]
struct Samples {
    /// (seconds since the phase's start, issued, refused) as the server counts them.
    points: Vec<(f64, f64, f64)>,
    peak_rss_kb: u64,
}

impl Samples {
    /// Starting from the counts at the trigger.
    fn baseline(c: Counts) -> Self {
        Self {
            points: vec![(0.0, c.issued, c.refused)],
            peak_rss_kb: 0,
        }
    }
}

fn start_sampler(
    http: SocketAddr,
    pid: Option<u32>,
    start: Instant,
    out: Arc<Mutex<Samples>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let text = scrape(http).await;
            let c = server_counts(&text);
            let rss = pid.map_or(0, |p| status_kb(p, "VmRSS:"));
            let mut s = out.lock().unwrap();
            s.points
                .push((start.elapsed().as_secs_f64(), c.issued, c.refused));
            s.peak_rss_kb = s.peak_rss_kb.max(rss);
        }
    })
}

/// Waits until `renewed` holds for every sink's current certificate; rescans only the sinks
/// still waiting. Returns the time taken (None at the limit) and how many never got there.
async fn wait_all(
    sinks: &[Sink],
    limit: Duration,
    renewed: impl Fn(usize, &LeafInfo) -> bool,
) -> (Option<Duration>, usize) {
    let start = Instant::now();
    let mut pending: Vec<usize> = (0..sinks.len()).collect();
    loop {
        pending.retain(|&i| !sinks[i].leaf().is_some_and(|l| renewed(i, &l)));
        if pending.is_empty() {
            return (Some(start.elapsed()), 0);
        }
        if start.elapsed() > limit {
            for &i in pending.iter().take(5) {
                eprintln!(
                    "bench-storm: still waiting for {} (agent {})",
                    sinks[i].spiffe_id, sinks[i].agent
                );
            }
            return (None, pending.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("timed out".into(), |d| format!("{:.2} s", d.as_secs_f64()))
}

/// Per-second (issued, refused) from cumulative samples: the differences between successive
/// samples (the first is the baseline, taken at the trigger), trailing empty seconds dropped.
fn buckets(points: &[(f64, f64, f64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let Some(&(_, i0, r0)) = points.first() else {
        return out;
    };
    let mut prev = (i0, r0);
    for &(_, issued, refused) in &points[1..] {
        out.push((
            (issued - prev.0).max(0.0) as u64,
            (refused - prev.1).max(0.0) as u64,
        ));
        prev = (issued, refused);
    }
    while out.last().is_some_and(|b| *b == (0, 0)) {
        out.pop();
    }
    out
}

fn agents_rss(agents: &[Agent]) -> (f64, f64, f64) {
    let rss: Vec<u64> = agents.iter().map(|a| status_kb(a.pid, "VmRSS:")).collect();
    let hwm = agents
        .iter()
        .map(|a| status_kb(a.pid, "VmHWM:"))
        .max()
        .unwrap_or(0);
    let max = rss.iter().copied().max().unwrap_or(0);
    let mean = rss.iter().sum::<u64>() as f64 / rss.len().max(1) as f64;
    (mb(max), mean / 1024.0, mb(hwm))
}

/// One phase's figures.
struct Phase {
    name: &'static str,
    took: Option<Duration>,
    not_renewed: usize,
    server: Counts,
    agents: Counts,
    server_hwm_kb: u64,
    samples: Samples,
}

fn print_phase(p: &Phase, total: usize, agents: (f64, f64, f64)) {
    println!("{}:", p.name);
    println!(
        "  all {total} certificates on disk renewed after   {:>12}",
        secs(p.took)
    );
    println!(
        "  certificates never renewed (failed requests left unretried) {}",
        p.not_renewed
    );
    println!(
        "  server: issued {:.0}, refused (ResourceExhausted/Unavailable/limits) {:.0}, other failures {:.0}",
        p.server.issued, p.server.refused, p.server.failed
    );
    println!(
        "  agents: renewals {:.0}, failed renewal attempts (per entry) {:.0}",
        p.agents.agent_renewals, p.agents.agent_failures
    );
    println!(
        "  server peak RSS (VmHWM) {:.1} MB (highest sampled VmRSS {:.1} MB)",
        mb(p.server_hwm_kb),
        mb(p.samples.peak_rss_kb)
    );
    println!(
        "  agents RSS: max {:.1} MB, mean {:.1} MB, highest peak (VmHWM) {:.1} MB",
        agents.0, agents.1, agents.2
    );
    let b = buckets(&p.samples.points);
    let issued: Vec<String> = b.iter().map(|x| x.0.to_string()).collect();
    let refused: Vec<String> = b.iter().map(|x| x.1.to_string()).collect();
    let peak = b.iter().map(|x| x.0).max().unwrap_or(0);
    let first = b.iter().position(|x| x.0 > 0);
    println!(
        "  server issuances per 1 s bucket from the trigger (peak {peak}/s, first at {}):",
        first.map_or("-".into(), |s| format!("{s} s"))
    );
    println!("    issued  [{}]", issued.join(" "));
    println!("    refused [{}]", refused.join(" "));
}

async fn taint_phase(
    server: &FixedServer,
    sinks: &[Sink],
    agents: &[Agent],
    limit: Duration,
) -> Phase {
    let mut ca = CaAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .expect("admin socket"),
    );
    let status = ca
        .status(CaStatusRequest {})
        .await
        .expect("ca status")
        .into_inner();
    let old = status
        .slots
        .iter()
        .find(|s| s.kind == "intermediate" && s.state == "active")
        .expect("an active intermediate")
        .key_id
        .clone();
    let new = ca
        .prepare(CaPrepareRequest {
            root: false,
            kind: String::new(),
        })
        .await
        .expect("ca prepare")
        .into_inner()
        .key_id;
    ca.activate(signet_proto::admin::CaActivateRequest {
        key_id: new.clone(),
        force: false,
    })
    .await
    .expect("ca activate");
    let server0 = server_counts(&server.metrics().await);
    let agents0 = agent_counts(agents).await;
    let samples = Arc::new(Mutex::new(Samples::baseline(server0)));
    let start = Instant::now();
    let sampler = start_sampler(server.http, server.pid(), start, samples.clone());
    ca.taint(CaKeyRequest {
        key_id: old.clone(),
    })
    .await
    .expect("ca taint");
    eprintln!("bench-storm: tainted {old}; {new} signs");
    let (took, not_renewed) = wait_all(sinks, limit, |_, l| l.issuer_key_id != old).await;
    // One more sample so the last bucket is complete.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    sampler.abort();
    let server1 = server_counts(&server.metrics().await);
    let agents1 = agent_counts(agents).await;
    Phase {
        name: "storm 1: CA taint (prepare + activate a new intermediate, taint the old one)",
        took,
        not_renewed,
        server: diff(server1, server0),
        agents: diff(agents1, agents0),
        server_hwm_kb: server.pid().map_or(0, |p| status_kb(p, "VmHWM:")),
        samples: std::mem::take(&mut *samples.lock().unwrap()),
    }
}

fn diff(a: Counts, b: Counts) -> Counts {
    let d = |x: f64, y: f64| (x - y).max(0.0);
    Counts {
        issued: d(a.issued, b.issued),
        refused: d(a.refused, b.refused),
        failed: d(a.failed, b.failed),
        agent_renewals: d(a.agent_renewals, b.agent_renewals),
        agent_failures: d(a.agent_failures, b.agent_failures),
    }
}

async fn outage_phase(
    server: &mut FixedServer,
    sinks: &[Sink],
    agents: &[Agent],
    outage: Duration,
    limit: Duration,
) -> Phase {
    let agents0 = agent_counts(agents).await;
    server.stop().await;
    // Nothing can be renewed while the server is down: what is on disk now is what must be
    // replaced.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<Option<String>> = sinks.iter().map(|s| s.leaf().map(|l| l.serial)).collect();
    eprintln!("bench-storm: server stopped for {outage:?}");
    tokio::time::sleep(outage).await;
    eprintln!("bench-storm: starting the server again");
    // A new process: its counters start at zero.
    let samples = Arc::new(Mutex::new(Samples::baseline(Counts::default())));
    server.restart().await;
    let start = Instant::now();
    let sampler = start_sampler(server.http, server.pid(), start, samples.clone());
    let (took, not_renewed) = wait_all(sinks, limit, |i, l| {
        before[i].as_deref() != Some(l.serial.as_str())
    })
    .await;
    // One more sample so the last bucket is complete.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    sampler.abort();
    let server1 = server_counts(&server.metrics().await);
    let agents1 = agent_counts(agents).await;
    Phase {
        name: "storm 2: outage (server stopped, every certificate due while it is down; from the restart)",
        took,
        not_renewed,
        server: server1,
        agents: diff(agents1, agents0),
        server_hwm_kb: server.pid().map_or(0, |p| status_kb(p, "VmHWM:")),
        samples: std::mem::take(&mut *samples.lock().unwrap()),
    }
}

/// Ends the run as failed. The agents and the server are dropped first: their `kill_on_drop`
/// stops them, which `process::exit` alone would skip (it runs no destructor), leaving 20
/// agents and a server loading the machine after the bench gave up.
fn give_up(agents: Vec<Agent>, server: FixedServer) -> ! {
    drop(agents);
    drop(server);
    std::process::exit(1)
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let (n_agents, per_agent) = (args.agents, args.entries);
    let total = n_agents * per_agent;
    let ttl = args.ttl.unwrap_or(args.outage).max(Duration::from_secs(1));
    // The agents renew at 0.5 ± 0.1 of the lifetime (their default renew_fraction).
    if args.outage_phase && ttl.mul_f64(0.6) > args.outage {
        eprintln!(
            "bench-storm: warning: with --ttl {} some certificates are not due within a {} \
             outage (renewal at up to 60% of the TTL): the outage figure then includes waiting \
             for their usual renewal",
            humantime::format_duration(ttl),
            humantime::format_duration(args.outage)
        );
    }

    let dir = tempfile::Builder::new()
        .prefix("bench-storm-")
        .tempdir()
        .unwrap();
    let root = dir.path().to_owned();
    eprintln!("bench-storm: logs under {}", root.display());
    let mut server = FixedServer::start(
        &root.join("server"),
        args.database_url.as_deref(),
        "",
        &root.join("server.log"),
    )
    .await;
    let mut admin = NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .expect("admin socket"),
    );

    // The agents: one node each, `per_agent` file sinks each.
    let mut agents = Vec::with_capacity(n_agents);
    let mut sinks = Vec::with_capacity(total);
    for a in 0..n_agents {
        let node_id = format!("storm-{a}");
        let token = admin
            .create_join_token(CreateJoinTokenRequest {
                ttl_seconds: 3600,
                node_id: node_id.clone(),
            })
            .await
            .expect("join token")
            .into_inner()
            .token;
        let adir = root.join(format!("agent-{a}"));
        std::fs::create_dir_all(&adir).unwrap();
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut toml = format!(
            "server_address = \"https://{grpc}\"\n\
             trust_bundle_file = \"{bundle}\"\n\
             join_token = \"{token}\"\n\
             data_dir = \"{data}\"\n\
             workload_api_socket = \"{socket}\"\n\
             http_listen = \"{http}\"\n\
             sync_interval = \"{sync}\"\n",
            grpc = server.grpc,
            bundle = server.bundle_path().display(),
            data = adir.join("data").display(),
            socket = adir.join("agent.sock").display(),
            sync = args.sync_interval,
        );
        for i in 0..per_agent {
            let sink = Sink {
                agent: a,
                spiffe_id: format!("spiffe://example.org/storm/a{a}/e{i}"),
                dir: adir.join(format!("sink-{i}")),
            };
            std::fs::create_dir(&sink.dir).unwrap();
            toml.push_str(&format!(
                "\n[[sinks]]\nname = \"e{i}\"\nkind = \"files\"\nspiffe_id = \"{}\"\n\
                 directory = \"{}\"\nlayout = \"spiffe-helper\"\n",
                sink.spiffe_id,
                sink.dir.display()
            ));
            sinks.push(sink);
        }
        let config = adir.join("agent.toml");
        std::fs::write(&config, toml).unwrap();
        let log_path = adir.join("agent.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(bin("signet-agent"))
            .arg("--config")
            .arg(&config)
            // SIGNET_STORM_AGENT_LOG overrides the agents' log filter (a diagnosis; the
            // default keeps 20 agents' logs small).
            .env(
                "RUST_LOG",
                std::env::var("SIGNET_STORM_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("start signet-agent");
        let pid = child.id().unwrap();
        agents.push(Agent {
            child,
            pid,
            http,
            node_id,
            log: log_path,
        });
    }

    // The entries: one BatchCreateEntries call per agent (at most 1,000 each), `--concurrency`
    // calls at once. One write transaction per batch, so the store's write lock is not the
    // bottleneck (one CreateEntry each took it 20,000 times). A batch answered with a
    // retryable status (the store busy past its wait: Unavailable) is sent again after a
    // backoff, as every client of the API is meant to; the count is printed.
    let ttl_seconds = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
    let t0 = Instant::now();
    let requests: Vec<CreateEntryRequest> = sinks
        .iter()
        .enumerate()
        .map(|(k, s)| CreateEntryRequest {
            spiffe_id: s.spiffe_id.clone(),
            parent: agents[s.agent].node_id.clone(),
            selectors: vec![format!("unix:uid:{}", 100_000 + k)],
            ttl_seconds,
            dns_names: vec![],
            jwt_ttl_seconds: 0,
            federates_with: vec![],
        })
        .collect();
    let batches: Vec<Vec<CreateEntryRequest>> = requests.chunks(1000).map(<[_]>::to_vec).collect();
    let retried = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failures = futures::stream::iter(batches)
        .map(|entries| {
            let mut admin = admin.clone();
            let retried = retried.clone();
            async move {
                let mut backoff = Duration::from_millis(100);
                let mut last = None;
                for _ in 0..8 {
                    let request = BatchCreateEntriesRequest {
                        entries: entries.clone(),
                    };
                    match admin.batch_create_entries(request).await {
                        Ok(_) => return None,
                        Err(s) if signet_client::ErrorClass::of_status(&s).is_retryable() => {
                            retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let wait = signet_client::retry_pushback(&s).unwrap_or(backoff);
                            tokio::time::sleep(wait).await;
                            backoff = (backoff * 2).min(Duration::from_secs(2));
                            last = Some(s);
                        }
                        Err(s) => return Some(s),
                    }
                }
                last
            }
        })
        .buffer_unordered(args.concurrency)
        .filter_map(|e| async move { e })
        .collect::<Vec<_>>()
        .await;
    if let Some(e) = failures.first() {
        eprintln!(
            "bench-storm: {} entry batches not created, first: {e}",
            failures.len()
        );
        give_up(agents, server);
    }
    let created = t0.elapsed();
    let on_disk = wait_until(args.timeout, Duration::from_millis(100), || {
        sinks.iter().all(|s| s.leaf().is_some())
    })
    .await;
    let Some(_) = on_disk else {
        eprintln!(
            "bench-storm: not every certificate reached disk within {:?} (agent logs: {})",
            args.timeout,
            agents[0].log.display()
        );
        give_up(agents, server);
    };
    let on_disk = t0.elapsed();
    // Let the first deliveries settle (sinks finish, the agents' first renewal round ends).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let store = if args.database_url.is_some() {
        "PostgreSQL"
    } else {
        "embedded SQLite"
    };
    println!(
        "renewal storm: {n_agents} agents x {per_agent} entries = {total} certificates, \
         {store}, entry TTL {}, sync_interval {}",
        humantime::format_duration(ttl),
        args.sync_interval
    );
    println!(
        "  creating {total} entries (batches of 1,000, {} at once) {:>8.2} s ({} batches retried)",
        args.concurrency,
        created.as_secs_f64(),
        retried.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!(
        "  first certificates: all {total} on disk after      {:>8.2} s",
        on_disk.as_secs_f64()
    );
    println!(
        "  server RSS (VmHWM) so far                     {:>8.1} MB",
        mb(server.pid().map_or(0, |p| status_kb(p, "VmHWM:")))
    );
    let rss = agents_rss(&agents);
    println!(
        "  agents RSS holding {per_agent} entries: max {:.1} MB, mean {:.1} MB, peak {:.1} MB",
        rss.0, rss.1, rss.2
    );

    if args.taint {
        let p = taint_phase(&server, &sinks, &agents, args.timeout).await;
        print_phase(&p, total, agents_rss(&agents));
    }
    if args.outage_phase {
        let p = outage_phase(&mut server, &sinks, &agents, args.outage, args.timeout).await;
        print_phase(&p, total, agents_rss(&agents));
    }

    for a in &mut agents {
        a.child.kill().await.ok();
    }
    server.stop().await;
    if args.keep {
        eprintln!("bench-storm: kept {}", dir.keep().display());
    }
}
