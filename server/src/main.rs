//! `signet-server`: with no arguments, a CA for `example.org` on embedded SQLite under
//! `./signet-data/`, with a root generated on first start and reused afterwards.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use serde::Serialize;
use signet_runtime::shutdown::{self, Hangups};
use signet_runtime::telemetry::{self, LogOptions, log_early_error};
use signet_server::config::Config;

/// jemalloc instead of glibc's malloc, as linkerd2-proxy does. A request's memory is allocated
/// and freed across threads (work-stealing workers, the ledger writer's own thread); under load
/// glibc's malloc, free and chunk consolidation took about an eighth of the server's CPU
/// (`perf record` during `scripts/bench`), and jemalloc cut the server's CPU per issuance by
/// about 6% (262 against 280 µs, six runs each in rotated order) for 35 MB peak RSS against 26 MB.
/// mimalloc saved as much CPU but peaked at 80 MB. README "Speed", round 4.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Signet certificate authority: SPIFFE X.509 identities over gRPC, every one recorded.
#[derive(Debug, Parser, Serialize)]
#[command(version, about)]
struct Args {
    /// TOML configuration file. Every key can also be set as SIGNET_<KEY> (nested keys with
    /// '__', e.g. SIGNET_CA__MAX_TTL=12h); flags win over both.
    #[arg(long, short)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Log as JSON lines instead of text; then every line on standard output and error is
    /// JSON (the start-up summary is one "ready" line).
    #[arg(long)]
    #[serde(skip)]
    log_json: bool,
    /// The log filter: error, warn, info, debug, trace, off, or RUST_LOG's directives
    /// (info,signet_server=debug). Wins over the log_level key and over RUST_LOG.
    #[arg(long, value_name = "LEVEL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    log_level: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    trust_domain: Option<String>,
    /// gRPC (TLS) listen address.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// HTTP listen address (health, metrics).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    http_listen: Option<SocketAddr>,
    /// sqlite://PATH or postgres://…
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let json = args.log_json;
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log_early_error(
                "signet-server",
                json,
                &format!("cannot start the runtime: {e}"),
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    // First of all: from here on a SIGHUP is a reload, never the end of the process.
    let hangups = {
        let _in_runtime = rt.enter();
        Hangups::watch()
    };
    let cfg = match Config::load(args.config.as_deref(), &args) {
        Ok(c) => c,
        Err(e) => {
            log_early_error("signet-server", json, &e.to_string());
            return std::process::ExitCode::from(2);
        }
    };
    // Inside the runtime: the trace exporter's connection lives on it.
    let logs = LogOptions {
        json,
        default_filter: "info,sqlx=warn,h2=warn",
        level: cfg.log_level.clone(),
    };
    let telemetry =
        match rt.block_on(async { telemetry::init("signet-server", logs, &cfg.telemetry) }) {
            Ok(t) => t,
            Err(e) => {
                log_early_error("signet-server", json, &e.to_string());
                return std::process::ExitCode::from(2);
            }
        };
    let reload = signet_server::reload::Reload {
        hangups,
        load: Box::new(move || Config::load(args.config.as_deref(), &args)),
        logs: Some(telemetry.log_control()),
    };
    let db = signet_server::server::redact_url(&cfg.database_url());
    let td = cfg.trust_domain.clone();
    let result = rt.block_on(signet_server::server::run(
        cfg,
        Some(reload),
        shutdown::signal(),
        |s| {
            if json {
                tracing::info!(
                    trust_domain = %td,
                    grpc = %s.grpc,
                    http = %s.http,
                    probes = s.probes.map(|a| a.to_string()),
                    root_sha256 = %s.root_sha256,
                    trust_bundle = %s.bundle_path.display(),
                    admin_socket = %s.admin_socket.display(),
                    bundle_endpoint = s.bundle_endpoint.map(|a| format!("https://{a}/")),
                    oidc = s.oidc.map(|a| format!("https://{a}/")),
                    database = %db,
                    "ready"
                );
                return;
            }
            println!("signet-server: CA for trust domain {td}");
            println!("  gRPC (TLS):    {}", s.grpc);
            println!("  HTTP:          {}", s.http);
            if let Some(a) = s.probes {
                println!("  probes:        {a}");
            }
            println!("  root SHA-256:  {}", s.root_sha256);
            println!("  trust bundle:  {}", s.bundle_path.display());
            println!("  admin socket:  {}", s.admin_socket.display());
            if let Some(a) = s.bundle_endpoint {
                println!("  SPIFFE bundle endpoint: https://{a}/");
            }
            if let Some(a) = s.oidc {
                println!("  OIDC discovery (TLS): https://{a}/");
            }
            println!("  database:      {db}");
            println!("ready");
        },
    ));
    telemetry.shutdown();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if json => {
            tracing::error!("signet-server: {e:#}");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("signet-server: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
