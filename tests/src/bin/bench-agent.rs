//! Agent footprint benchmark: prints figures, asserts nothing about time.
//!
//! Starts the real `signet-server` (embedded SQLite, or `--database-url`) and the real
//! `signet-agent` with one `files` sink per entry, then measures
//! - the agent's resident memory (VmRSS, and the peak VmHWM) holding 1 entry, then N entries;
//! - the time from creating entries 2..=N in one `BatchCreateEntries` call on the admin socket
//!   (as `signetctl entry create --file` does) to every entry's certificate, key and bundle
//!   being on disk in its sink directory (issue 11's target: ≤ 3 s after the last creation);
//! - one new entry's time to disk while the agent holds N (target ≤ 2 s): the server pushes the
//!   change (`WatchEntries`), the agent syncs at once instead of at its next poll;
//! - the agent's CPU while idle (user + system time over a quiet window);
//! - where its memory is: anonymous (heap, stacks) and file-backed (the binary and libraries
//!   as far as they were touched) resident pages, and its thread count.
//!
//! Timing figures depend on what else runs on the machine: the load average is printed with
//! them. For profiling, `--agent-wrapper 'valgrind --tool=massif …'` runs the agent under a
//! tool (the agent is stopped with SIGTERM, so the tool writes its report), and
//! `--hold-secs S` keeps the agent running S seconds after the figures, its pid printed, for
//! a tool to attach to.
//!
//! The agent runs with its own default `sync_interval` (the slow safety-net poll) unless
//! `--sync-interval` says otherwise.
//!
//! ```sh
//! cargo build --release --bins
//! target/release/bench-agent --entries 1000
//! ```
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A benchmark measures real time (clippy.toml bans wall-clock reads in the products' logic).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use signet_proto::admin::{BatchCreateEntriesRequest, CreateEntryRequest};
use signet_tests::bench::{
    Memory, bench_node, clock_ticks_per_sec, cpu_ticks, load_average, spawn_agent, status_kb,
};
use signet_tests::{Server, ServerOpts};

struct Args {
    entries: usize,
    database_url: Option<String>,
    idle_secs: u64,
    sync_interval: Option<String>,
    agent_wrapper: Vec<String>,
    hold_secs: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        entries: 1000,
        database_url: None,
        idle_secs: 30,
        sync_interval: None,
        agent_wrapper: Vec::new(),
        hold_secs: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--entries" => a.entries = val().parse().unwrap_or_else(|_| usage("bad --entries")),
            "--database-url" => a.database_url = Some(val()),
            "--idle-secs" => {
                a.idle_secs = val().parse().unwrap_or_else(|_| usage("bad --idle-secs"))
            }
            "--sync-interval" => a.sync_interval = Some(val()),
            "--agent-wrapper" => {
                a.agent_wrapper = val().split_whitespace().map(str::to_owned).collect()
            }
            "--hold-secs" => {
                a.hold_secs = val().parse().unwrap_or_else(|_| usage("bad --hold-secs"))
            }
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if a.entries == 0 {
        usage("--entries must be at least 1");
    }
    a
}

fn usage(msg: &str) -> ! {
    if !msg.is_empty() {
        eprintln!("bench-agent: {msg}");
    }
    eprintln!(
        "usage: bench-agent [--entries N (1000)] [--database-url URL (embedded SQLite)] \
         [--idle-secs S (30)] [--sync-interval D (the agent's default)] \
         [--agent-wrapper 'CMD ARGS' (none)] [--hold-secs S (0)]"
    );
    std::process::exit(2)
}

fn spiffe_id(i: usize) -> String {
    format!("spiffe://example.org/bench/app-{i}")
}

fn sink_complete(dir: &Path) -> bool {
    ["svid.pem", "svid_key.pem", "svid_bundle.pem"]
        .iter()
        .all(|f| dir.join(f).exists())
}

async fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > Duration::from_secs(secs) {
            eprintln!("bench-agent: timed out after {secs}s waiting for {what}");
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
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

    let dir = tempfile::tempdir().unwrap();
    // One sink more than entries: the last is for the single new entry timed at the end.
    let sinks: Vec<PathBuf> = (0..=n)
        .map(|i| dir.path().join(format!("sink-{i}")))
        .collect();
    let mut toml = format!(
        "server_address = \"https://127.0.0.1:{port}\"\n\
         trust_bundle_file = \"{bundle}\"\n\
         join_token = \"{token}\"\n\
         data_dir = \"{data}\"\n\
         workload_api_socket = \"{socket}\"\n\
         http_listen = \"127.0.0.1:{http}\"\n",
        port = server.grpc.port(),
        // Not the default 8081, so a run beside another agent (a test, a second run) starts.
        http = signet_tests::bench::free_port(),
        bundle = server.bundle_path().display(),
        data = dir.path().join("data").display(),
        socket = dir.path().join("agent.sock").display(),
    );
    if let Some(sync) = &args.sync_interval {
        toml.push_str(&format!("sync_interval = \"{sync}\"\n"));
    }
    for (i, sink) in sinks.iter().enumerate() {
        std::fs::create_dir(sink).unwrap();
        toml.push_str(&format!(
            "\n[[sinks]]\nname = \"app-{i}\"\nkind = \"files\"\nspiffe_id = \"{}\"\n\
             directory = \"{}\"\nlayout = \"spiffe-helper\"\n",
            spiffe_id(i),
            sink.display()
        ));
    }
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, toml).unwrap();

    let log_path = dir.path().join("agent.log");
    eprintln!("bench-agent: agent log at {}", log_path.display());
    let mut agent = spawn_agent(&config, &log_path, &args.agent_wrapper);
    let pid = agent.id().unwrap();

    let create = |i: usize| CreateEntryRequest {
        spiffe_id: spiffe_id(i),
        parent: "bench".into(),
        selectors: vec![format!("unix:uid:{}", 60000 + i)],
        ttl_seconds: 3600,
        dns_names: vec![],
        jwt_ttl_seconds: 0,
        federates_with: vec![],
    };

    // One entry.
    admin.create_entry(create(0)).await.expect("create entry");
    let first = wait_for("the first certificate on disk", 120, || {
        sink_complete(&sinks[0])
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mem_1 = Memory::of(pid);

    // The other n-1 in batches of at most 1,000 (one call for the default N).
    let t0 = Instant::now();
    let rest: Vec<CreateEntryRequest> = (1..n).map(create).collect();
    for chunk in rest.chunks(1000) {
        admin
            .batch_create_entries(BatchCreateEntriesRequest {
                entries: chunk.to_vec(),
            })
            .await
            .expect("batch create entries");
    }
    let created = t0.elapsed();
    wait_for("every certificate on disk", 600, || {
        sinks[..n].iter().all(|s| sink_complete(s))
    })
    .await;
    let on_disk = t0.elapsed();

    // Settle, then measure memory.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mem_n = Memory::of(pid);
    let hwm = status_kb(pid, "VmHWM:");
    let load_burst = load_average();

    // One new entry while the agent holds n.
    let t1 = Instant::now();
    admin.create_entry(create(n)).await.expect("create entry");
    wait_for("the new entry's certificate on disk", 120, || {
        sink_complete(&sinks[n])
    })
    .await;
    let one_new = t1.elapsed();

    // Settle, then idle CPU.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ticks0 = cpu_ticks(pid);
    let w0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let ticks = cpu_ticks(pid) - ticks0;
    let wall = w0.elapsed().as_secs_f64();
    let idle_cpu_pct = ticks as f64 / clock_ticks_per_sec() as f64 / wall * 100.0;
    let mem_idle = Memory::of(pid);
    let load_end = load_average();

    let store = if args.database_url.is_some() {
        "PostgreSQL"
    } else {
        "embedded SQLite"
    };
    println!(
        "signet-agent footprint ({store} server on the same machine, sync_interval {})",
        args.sync_interval.as_deref().unwrap_or("(agent default)")
    );
    println!(
        "  first entry: certificate on disk after      {:>8.2} s",
        first.as_secs_f64()
    );
    mem_1.print("RSS holding 1 entry");
    println!(
        "  creating entries 2..={n} (batch admin API)  {:>8.2} s",
        created.as_secs_f64()
    );
    println!(
        "  creation of 2..={n} -> all {n} on disk      {:>8.2} s",
        on_disk.as_secs_f64()
    );
    println!(
        "  last creation -> all {n} on disk            {:>8.2} s",
        (on_disk - created).as_secs_f64()
    );
    println!(
        "  one new entry (holding {n}) -> on disk      {:>8.2} s",
        one_new.as_secs_f64()
    );
    mem_n.print(&format!("RSS holding {n} entries"));
    println!(
        "  peak RSS (VmHWM)                             {:>8.1} MB",
        hwm as f64 / 1024.0
    );
    println!(
        "  idle CPU over {wall:.0} s                          {idle_cpu_pct:>8.3} % of one core"
    );
    mem_idle.print("RSS after the idle window");
    println!("  load average after the burst / at the end    {load_burst} / {load_end}");

    if args.hold_secs > 0 {
        eprintln!(
            "bench-agent: holding the agent (pid {pid}) for {} s",
            args.hold_secs
        );
        tokio::time::sleep(Duration::from_secs(args.hold_secs)).await;
    }
    // SIGTERM first: the agent shuts down cleanly, and a wrapping tool writes its report.
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
    if tokio::time::timeout(Duration::from_secs(60), agent.wait())
        .await
        .is_err()
    {
        agent.kill().await.ok();
    }
    drop(server);
}
