//! JWT-SVID benchmark: prints figures, asserts nothing about time.
//!
//! Starts the real `signet-server` (embedded SQLite, or `--database-url`), then in one run:
//! 1. `signetctl bench --jwt`: durable X.509 issuance and durable JWT-SVID minting through the
//!    server's native API, the same clients at the same concurrency, each certificate and each
//!    token committed to the ledger before it is returned (its figures are printed as they are);
//! 2. the real `signet-agent` (join token, an entry for this process's uid), and its Workload API
//!    `FetchJWTSVID` from this process: cached (the same audience every time: the agent answers
//!    from its cache), then uncached (a new audience every call: each one minted by the server
//!    through the node API and committed before it is returned);
//! 3. the cached rate over the X.509 rate of step 1.
//!
//! ```sh
//! cargo build --release --bins
//! target/release/bench-jwt --concurrency 16 --duration 10
//! ```
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A benchmark measures real time (clippy.toml bans wall-clock reads in the products' logic).
#![allow(clippy::disallowed_methods)]

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use signet_proto::admin::CreateEntryRequest;
use signet_proto::workload::JwtsvidRequest;
use signet_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use signet_tests::bench::{bench_node, spawn_agent};
use signet_tests::{Server, ServerOpts, bin};
use tokio::process::Command;
use tonic::transport::Channel;

struct Args {
    concurrency: usize,
    connections: usize,
    duration: u64,
    database_url: Option<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        concurrency: 16,
        connections: 4,
        duration: 10,
        database_url: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--concurrency" | "-c" => {
                a.concurrency = val().parse().unwrap_or_else(|_| usage("bad --concurrency"))
            }
            "--connections" => {
                a.connections = val().parse().unwrap_or_else(|_| usage("bad --connections"))
            }
            "--duration" => a.duration = val().parse().unwrap_or_else(|_| usage("bad --duration")),
            "--database-url" => a.database_url = Some(val()),
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if a.concurrency == 0 || a.connections == 0 || a.duration == 0 {
        usage("--concurrency, --connections and --duration must be at least 1");
    }
    a
}

fn usage(msg: &str) -> ! {
    if !msg.is_empty() {
        eprintln!("bench-jwt: {msg}");
    }
    eprintln!(
        "usage: bench-jwt [--concurrency N (16)] [--connections N (4)] [--duration SECONDS (10)] \
         [--database-url URL (embedded SQLite)]"
    );
    std::process::exit(2)
}

fn request(audience: String) -> tonic::Request<JwtsvidRequest> {
    let mut req = tonic::Request::new(JwtsvidRequest {
        audience: vec![audience],
        spiffe_id: String::new(),
    });
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    req
}

/// Closed loop: `concurrency` clients over `channels` call FetchJWTSVID for `secs` seconds, with
/// the audience `audience(n)` for the n-th call; prints the rate and latency percentiles.
async fn closed_loop(
    what: &str,
    channels: &[Channel],
    concurrency: usize,
    secs: u64,
    audience: fn(u64) -> String,
) -> f64 {
    let counter = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let mut client = SpiffeWorkloadApiClient::new(channels[i % channels.len()].clone());
        let counter = counter.clone();
        let errors = errors.clone();
        let what = what.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < end {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                match client.fetch_jwtsvid(request(audience(n))).await {
                    Ok(r) if !r.get_ref().svids.is_empty() => lat.push(t.elapsed()),
                    Ok(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(s) => {
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("bench-jwt: {what}: {:?}: {}", s.code(), s.message());
                        }
                    }
                }
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let rate = lat.len() as f64 / elapsed;
    println!(
        "{what:<36} {rate:>9.0}/s  p50 {:.2} ms  p99 {:.2} ms  ({} answered, {} errors, {concurrency} clients over {} connections, {secs}s)",
        pct(0.5),
        pct(0.99),
        lat.len(),
        errors.load(Ordering::Relaxed),
        channels.len()
    );
    rate
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let server = Server::start(ServerOpts {
        database_url: args.database_url.clone(),
        // The per-caller and per-source issuance rates are off: the bench measures what the
        // server can do, not what `[limits]` lets one client do (10/s by default).
        extra_toml: "[limits]\nissuance_per_caller = { burst = 1, per_second = 0.0 }\n\
                     issuance_per_source = { burst = 1, per_second = 0.0 }\n"
            .into(),
        env: vec![],
        data_dir: None,
        tokens: None,
    })
    .await;

    // 1. The server: durable X.509 and durable JWT-SVIDs, side by side.
    println!("== the server: signetctl bench --jwt");
    let out = Command::new(bin("signetctl"))
        .arg("--socket")
        .arg(server.admin_socket())
        .args([
            "bench",
            "--jwt",
            "--addr",
            &format!("https://127.0.0.1:{}", server.grpc.port()),
            "--concurrency",
            &args.concurrency.to_string(),
            "--duration",
            &format!("{}s", args.duration),
        ])
        .output()
        .await
        .expect("signetctl bench");
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    // "side by side:  certificates 1234/s, JWT-SVIDs 2345/s: …"
    let x509_rate: f64 = text
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("side by side:  certificates ")?;
            rest.split("/s").next()?.trim().parse().ok()
        })
        .unwrap_or(0.0);

    // 2. The agent.
    let (mut admin, token) = bench_node(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let uid = std::fs::metadata(dir.path()).unwrap().uid();
    let socket = dir.path().join("agent.sock");
    let config = dir.path().join("agent.toml");
    // The agent's per-identity mint budget is off too, for the same reason: the uncached
    // figure is the server's minting, not `workload_api.jwt_mint_rate` (5/s after a burst).
    std::fs::write(
        &config,
        format!(
            "server_address = \"https://127.0.0.1:{port}\"\n\
             trust_bundle_file = \"{bundle}\"\n\
             join_token = \"{token}\"\n\
             data_dir = \"{data}\"\n\
             workload_api_socket = \"{socket}\"\n\
             http_listen = \"127.0.0.1:{http}\"\n\
             [workload_api]\n\
             jwt_mint_rate = {{ burst = 1000000, per_second = 1000000.0 }}\n",
            port = server.grpc.port(),
            http = signet_tests::bench::free_port(),
            bundle = server.bundle_path().display(),
            data = dir.path().join("data").display(),
            socket = socket.display(),
        ),
    )
    .unwrap();
    let _agent = spawn_agent(&config, &dir.path().join("agent.log"), &[]);
    admin
        .create_entry(CreateEntryRequest {
            spiffe_id: "spiffe://example.org/bench/jwt".into(),
            parent: "bench".into(),
            selectors: vec![format!("unix:uid:{uid}")],
            ttl_seconds: 3600,
            dns_names: vec![],
            jwt_ttl_seconds: 0,
            federates_with: vec![],
        })
        .await
        .expect("create entry");

    let mut channels = Vec::new();
    let start = Instant::now();
    while channels.is_empty() {
        if let Ok(ch) = signet_client::connect_admin(&socket).await {
            let mut c = SpiffeWorkloadApiClient::new(ch.clone());
            if matches!(c.fetch_jwtsvid(request("bench".into())).await, Ok(r) if !r.get_ref().svids.is_empty())
            {
                channels.push(ch);
                break;
            }
        }
        if start.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "bench-jwt: no JWT-SVID from the agent within 60 s; its log: {}",
                dir.path().join("agent.log").display()
            );
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 1..args.connections {
        channels.push(signet_client::connect_admin(&socket).await.unwrap());
    }
    println!("== the agent: FetchJWTSVID on its Workload API socket");
    let cached = closed_loop(
        "cached (one audience)",
        &channels,
        args.concurrency,
        args.duration,
        |_| "bench".to_owned(),
    )
    .await;
    closed_loop(
        "uncached (a new audience per call)",
        &channels,
        args.concurrency,
        args.duration,
        |n| format!("bench-{n}"),
    )
    .await;
    if x509_rate > 0.0 {
        println!(
            "cached FetchJWTSVID at {:.1}x durable X.509 issuance ({x509_rate:.0}/s)",
            cached / x509_rate
        );
    }
}
