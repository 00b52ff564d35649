//! `signet-agent --config FILE`: the node agent. It serves the SPIFFE Workload API on a Unix
//! socket and `/healthz`, `/readyz`, `/metrics` over HTTP.
//!
//! The node attests with its join token (or reuses the identity kept in `data_dir`), then
//! syncs its registration entries and has their certificates signed through
//! `signet.agent.v1.Node` over mTLS (see [`signet_agent::driver`]).
//!
//! SIGHUP never stops the agent: it loads the configuration again and applies the log level
//! (`log_level`, `--log-level`), logging one line per thing; other keys that changed are named
//! as taking effect at the next restart. The files the agent reads while running
//! (`trust_bundle_file`, `join_token_file`, `kubernetes_token_file`) are read at each use and
//! need no signal. (The `reload_signal` of a files sink is a signal the agent *sends* to a
//! workload, see `signal.rs`.)
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use signet_agent::attest::{Attestor, K8sAttestor, K8sError};
use signet_agent::config::{Config, ConfigError, SinkKind};
use signet_agent::driver::{Driver, GrpcConnector, Settings};
use signet_agent::http::{Readiness, router};
use signet_agent::jwt_cache::{CaMinter, JwtCache};
use signet_agent::metrics::Metrics;
use signet_agent::rotator::SinkBinding;
use signet_agent::sinks::apiserver::ApiServer;
use signet_agent::sinks::{Deps, Registry, SinkError};
use signet_agent::state;
use signet_agent::workload::{self, ListenError, ServeOptions, WorkloadApi};
use signet_runtime::clock::SystemClock;
use signet_runtime::random::SystemRandom;
use signet_runtime::reload::{KeyDigests, Outcome, changed_keys};
use signet_runtime::shutdown::{self, Hangups};
use signet_runtime::telemetry::{self, LogChange, LogControl, LogOptions, log_early_error};
use signet_types::SpiffeIdError;

/// Signet node agent: SPIFFE Workload API, certificate rotation, file and Secret sinks.
#[derive(Debug, Clone, Parser, serde::Serialize)]
#[command(version, about)]
struct Args {
    /// TOML configuration file. Every top-level key can also be set as SIGNET_AGENT_<KEY>
    /// (nested keys with '__'); the environment wins over the file, flags over both.
    #[arg(long, short)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Log as JSON lines instead of text; then every line on standard output and error is
    /// JSON.
    #[arg(long)]
    #[serde(skip)]
    log_json: bool,
    /// The log filter: error, warn, info, debug, trace, off, or RUST_LOG's directives
    /// (info,signet_agent=debug). Wins over the log_level key and over RUST_LOG.
    #[arg(long, value_name = "LEVEL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    log_level: Option<String>,
}

/// Why the agent cannot start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
enum Fatal {
    #[error("configuration: server_address is required")]
    NoServerAddress,
    #[error("configuration: trust_domain {value:?}: {source}")]
    TrustDomain {
        value: String,
        source: SpiffeIdError,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("kubernetes-secret sinks need the Kubernetes API: {0}")]
    KubernetesApi(signet_agent::sinks::apiserver::ApiServerError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("sink {name:?}: {source}")]
    SinkSpiffeId { name: String, source: SpiffeIdError },
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(transparent)]
    Kubernetes(#[from] K8sError),
    /// `http_listen` or `probe_listen` cannot be bound.
    #[error("{what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("http listener: {0}")]
    Http(std::io::Error),
    #[error("task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Threads for blocking work: the sinks' file writes (write, fsync, rename). tokio's default
/// is 512, and a burst of deliveries (1,000 entries arriving in one sync) then starts hundreds of
/// threads, each with its own stack and malloc arena: the agent's memory doubled. Eight keep a
/// burst's writes quick (they are queued, not refused) and memory flat. They exit after 10 s
/// idle.
const MAX_BLOCKING_THREADS: usize = 8;

/// The runtime: everything async on the main thread (tokio's current-thread scheduler), file
/// I/O on the blocking threads.
///
/// Why one thread: the agent's async work is small (a burst of 1,000 entries is well under a
/// second of CPU, in calls that yield between them), and every thread that allocates gets its
/// own malloc arena. With the multi-thread scheduler the heap was spread over three arenas
/// (the main thread's, which kept the hole the configuration's parse left, and one per
/// worker), each keeping its own free space after a burst: 13.7 MB taken from the system for
/// 7.7 MB in use at 1,000 entries. On one thread the space a burst frees is reused by the
/// next allocations instead (see README, "The agent's footprint").
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .build()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let json = args.log_json;
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            log_early_error(
                "signet-agent",
                json,
                &format!("cannot start the runtime: {e}"),
            );
            return ExitCode::FAILURE;
        }
    };
    // First of all: from here on a SIGHUP is a reload, never the end of the process.
    let hangups = {
        let _in_runtime = rt.enter();
        Hangups::watch()
    };
    let cfg = match Config::load_with_flags(args.config.as_deref(), &args) {
        Ok(c) => c,
        Err(e) => {
            log_early_error("signet-agent", json, &e.to_string());
            return ExitCode::from(2);
        }
    };
    // Inside the runtime: the trace exporter's connection lives on it.
    let logs = LogOptions {
        json,
        default_filter: "info,h2=warn",
        level: cfg.log_level.clone(),
    };
    let telemetry =
        match rt.block_on(async { telemetry::init("signet-agent", logs, &cfg.telemetry) }) {
            Ok(t) => t,
            Err(e) => {
                log_early_error("signet-agent", json, &e.to_string());
                return ExitCode::from(2);
            }
        };
    let reloads = rt.spawn(reload_on_hangup(
        hangups,
        args,
        KeyDigests::of(&cfg),
        telemetry.log_control(),
    ));
    let result = rt.block_on(run(cfg));
    reloads.abort();
    // The exporter's final flush needs its connection, which runs on the runtime: the
    // runtime's thread drives it while a blocking thread waits for the flush.
    rt.block_on(async {
        if let Err(e) = tokio::task::spawn_blocking(move || telemetry.shutdown()).await {
            tracing::warn!("telemetry shutdown: {e}");
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            if !json {
                eprintln!("signet-agent: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

/// At each SIGHUP: the configuration loaded again as at start-up, its log level applied, and
/// the other keys that changed named (they need a restart); one log line each.
async fn reload_on_hangup(mut hangups: Hangups, args: Args, running: KeyDigests, logs: LogControl) {
    loop {
        hangups.recv().await;
        tracing::info!("SIGHUP: reloading");
        for (what, outcome) in reload_once(&args, &running, &logs) {
            signet_runtime::reload::log(what, &outcome);
        }
    }
}

fn reload_once(
    args: &Args,
    running: &KeyDigests,
    logs: &LogControl,
) -> Vec<(&'static str, Outcome)> {
    match Config::load_with_flags(args.config.as_deref(), args) {
        Ok(new) => {
            let level = match logs.set(new.log_level.as_ref()) {
                Ok(LogChange::Changed { from, to }) => {
                    Outcome::Reloaded(format!("{to}, was {from}"))
                }
                Ok(LogChange::Unchanged(now)) => Outcome::Unchanged(now),
                Err(e) => Outcome::Failed(e.to_string()),
            };
            vec![
                ("configuration", changed_keys(running, &new, &["log_level"])),
                ("log level", level),
            ]
        }
        Err(e) => vec![
            (
                "configuration",
                Outcome::Failed(format!("{e}; the running configuration is kept")),
            ),
            (
                "log level",
                Outcome::Unchanged(format!(
                    "{} (the configuration did not load)",
                    logs.current()
                )),
            ),
        ],
    }
}

async fn run(mut cfg: Config) -> Result<(), Fatal> {
    if cfg.server_address.is_empty() {
        return Err(Fatal::NoServerAddress);
    }
    // Validated by Config::validate; None: named by the bundle's roots at each connection.
    let trust_domain =
        match &cfg.trust_domain {
            Some(td) => Some(td.parse::<signet_types::TrustDomain>().map_err(|source| {
                Fatal::TrustDomain {
                    value: td.clone(),
                    source,
                }
            })?),
            None => None,
        };
    // Sinks are built now so a bad sink fails the start, not the first rotation. Their
    // configuration is then dropped (each sink keeps what it needs): with a thousand sinks it
    // is half a megabyte, and the rest of `cfg` is kept (and cloned) until the agent stops.
    let sink_cfgs = std::mem::take(&mut cfg.sinks);
    let registry = Registry::default();
    // The one clock every part reads (sinks, metrics, the main loop).
    let clock = Arc::new(SystemClock);
    let mut deps = Deps {
        clock: clock.clone(),
        ..Deps::default()
    };
    if sink_cfgs
        .iter()
        .any(|s| matches!(s.kind, SinkKind::KubernetesSecret(_)))
    {
        let api = ApiServer::from_config(&cfg.kubernetes_api).map_err(Fatal::KubernetesApi)?;
        deps.kube = Some(Arc::new(api));
    }
    let sinks = sink_cfgs
        .iter()
        .map(|s| {
            let sink = registry.build(s, &deps)?;
            let spiffe_id = s.spiffe_id.parse().map_err(|source| Fatal::SinkSpiffeId {
                name: s.name.clone(),
                source,
            })?;
            Ok(SinkBinding {
                spiffe_id,
                deletion_policy: s.deletion_policy,
                timeout: s.timeout,
                sink,
            })
        })
        .collect::<Result<Vec<_>, Fatal>>()?;
    drop(sink_cfgs);

    let (state_tx, state_rx) = state::channel();
    let metrics = Arc::new(Metrics::new(state_rx.clone(), clock.clone()));
    let ready = Readiness::default();

    let wl = &cfg.workload_api;
    let mode = wl.socket_mode()?;
    let gid = wl
        .socket_group
        .as_deref()
        .map(|g| workload::listen::resolve_group(g, std::path::Path::new("/etc/group")))
        .transpose()?;
    workload::listen::ensure_fd_headroom(wl.max_connections);
    let listener = workload::bind_with(&cfg.workload_api_socket, mode, gid)?;
    let mut attestor = Attestor::default()
        .with_proc_root(&wl.proc_root)
        .with_unix_only_entries_for_containers(wl.unix_only_entries_for_containers);
    if wl.kubernetes.enabled {
        let k8s = K8sAttestor::from_config(&wl.kubernetes)?;
        attestor = attestor.with_kubernetes(Arc::new(k8s));
    }
    let http = tokio::net::TcpListener::bind(cfg.http_listen)
        .await
        .map_err(|source| Fatal::Bind {
            what: "http_listen",
            addr: cfg.http_listen,
            source,
        })?;
    let http_addr = http.local_addr()?;
    let probes = match cfg.probe_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| Fatal::Bind {
                    what: "probe_listen",
                    addr,
                    source,
                })?,
        ),
        None => None,
    };
    let probe_addr = match &probes {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };

    tracing::info!(
        socket = %cfg.workload_api_socket.display(),
        http = %http_addr,
        probes = ?probe_addr,
        sinks = sinks.len(),
        "signet-agent started"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let token_cfg = cfg.clone();
    let settings = Settings {
        data_dir: cfg.data_dir.clone(),
        trust_bundle_file: cfg.trust_bundle_file.clone(),
        renew_fraction: cfg.renew_fraction,
        sync_interval: cfg.sync_interval,
        credential: Arc::new(move || token_cfg.attest_credential()),
    };
    let connector = Arc::new(GrpcConnector::new(cfg.server_address.clone(), trust_domain));
    let driver = Driver::new(
        settings,
        connector,
        clock.clone(),
        Arc::new(SystemRandom::default()),
        state_tx,
    )
    .with_sinks(sinks)
    .with_metrics(metrics.clone())
    .with_readiness(ready.clone());
    // JWT-SVIDs are minted through the loop's connection to the server.
    let jwt_cache = Arc::new(
        JwtCache::new(
            Arc::new(CaMinter(driver.ca())),
            clock.clone(),
            cfg.workload_api.jwt_cache_size,
        )
        .with_mint_rate(cfg.workload_api.jwt_mint_rate),
    );
    let mut driver_task = tokio::spawn(driver.run(stop_rx.clone()));

    let api = WorkloadApi::new(state_rx, attestor).with_jwt(jwt_cache, clock);
    let workload_task = tokio::spawn(workload::serve_with(
        listener,
        api,
        ServeOptions::from(&cfg.workload_api),
        metrics.workload.clone(),
        wait_stop(stop_rx.clone()),
    ));
    let router = router(metrics, ready);
    let probe_task = probes.map(|l| {
        tokio::spawn(signet_runtime::http::serve_probes(
            "probe_listen",
            l,
            router.clone(),
            |_| {},
            wait_stop(stop_rx.clone()),
        ))
    });
    let http_task = tokio::spawn(signet_runtime::http::serve(
        signet_runtime::http::HttpListener {
            name: "http_listen",
            listener: http,
            limits: cfg.http.limits(),
        },
        router,
        |_| {},
        wait_stop(stop_rx),
    ));

    shutdown::signal().await;
    // Stops the main loop, which drops the state sender and so ends the open Workload API
    // streams; then the listeners stop.
    let _ = stop_tx.send(true);
    if tokio::time::timeout(std::time::Duration::from_secs(5), &mut driver_task)
        .await
        .is_err()
    {
        driver_task.abort();
        let _ = driver_task.await;
    }
    let w = workload_task.await;
    let h = http_task.await;
    if let Some(p) = probe_task {
        match p.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "probe listener"),
            Err(e) => tracing::warn!(error = %e, "probe listener task failed"),
        }
    }
    let _ = std::fs::remove_file(&cfg.workload_api_socket);
    match (w, h) {
        (Ok(Ok(())), Ok(Ok(()))) => Ok(()),
        (Ok(Err(e)), _) => Err(e.into()),
        (_, Ok(Err(e))) => Err(Fatal::Http(e)),
        (Err(e), _) | (_, Err(e)) => Err(e.into()),
    }
}
