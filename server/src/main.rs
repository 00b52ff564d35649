//! `signet-server`: with no arguments, a CA for `example.org` on embedded SQLite under
//! `./signet-data/`, with a root generated on first start and reused afterwards.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use serde::Serialize;
use signet_server::config::Config;

/// Signet certificate authority: SPIFFE X.509 identities over gRPC, every one recorded.
#[derive(Debug, Parser, Serialize)]
#[command(version, about)]
struct Args {
    /// TOML configuration file. Every key can also be set as SIGNET_<KEY> (nested keys with
    /// '__', e.g. SIGNET_CA__MAX_TTL=12h); flags win over both.
    #[arg(long, short)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    #[serde(skip)]
    log_json: bool,
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

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,h2=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    init_tracing(args.log_json);
    let cfg = match Config::load(args.config.as_deref(), &args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("signet-server: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("signet-server: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let db = signet_server::server::redact_url(&cfg.database_url());
    let td = cfg.trust_domain.clone();
    let result = rt.block_on(signet_server::server::run(cfg, shutdown_signal(), |s| {
        println!("signet-server: CA for trust domain {td}");
        println!("  gRPC (TLS):    {}", s.grpc);
        println!("  HTTP:          {}", s.http);
        println!("  root SHA-256:  {}", s.root_sha256);
        println!("  trust bundle:  {}", s.bundle_path.display());
        println!("  admin socket:  {}", s.admin_socket.display());
        if let Some(a) = s.bundle_endpoint {
            println!("  SPIFFE bundle endpoint: https://{a}/");
        }
        println!("  database:      {db}");
        println!("ready");
    }));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("signet-server: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
