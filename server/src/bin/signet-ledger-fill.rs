//! `signet-ledger-fill`: appends N real, hash-chained ledger rows to a Signet database with its
//! active CA key (see `signet_server::ledger_fill`), printing rows per second. Run it with the
//! server's own configuration (the same `--config`, `SIGNET_*` variables and flags):
//!
//! `signet-ledger-fill --database-url postgres://… --data-dir DIR --rows 1000000`

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;
use signet_server::config::Config;
use signet_server::ledger_fill::{FillOptions, fill};

#[derive(Debug, Parser, Serialize)]
#[command(version, about = "Append N real ledger rows (a benchmark fill)")]
struct Args {
    /// The server's TOML configuration file.
    #[arg(long, short)]
    #[serde(skip)]
    config: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    trust_domain: Option<String>,
    /// sqlite://PATH or postgres://…
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// Rows to append.
    #[arg(long, short = 'n')]
    #[serde(skip)]
    rows: u64,
    /// Rows per append transaction.
    #[arg(long, default_value_t = 2000)]
    #[serde(skip)]
    batch: usize,
    /// Distinct SPIFFE IDs (`ns/<namespace>/sa/fill-<k>`) the rows cycle through.
    #[arg(long, default_value_t = 10_000)]
    #[serde(skip)]
    identities: u32,
    #[arg(long, default_value = "bench")]
    #[serde(skip)]
    namespace: String,
    /// Requested certificate lifetime.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    #[serde(skip)]
    ttl: Duration,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let cfg = match Config::load(args.config.as_deref(), &args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("signet-ledger-fill: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let opts = FillOptions {
        rows: args.rows,
        batch: args.batch,
        identities: args.identities,
        ttl: args.ttl,
        namespace: args.namespace.clone(),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("signet-ledger-fill: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let step = (args.rows / 20).max(1);
    let result = rt.block_on(fill(&cfg, opts, |done, took| {
        if done % step < args.batch as u64 || done == args.rows {
            eprintln!(
                "  {done} rows in {:.1}s ({:.0} rows/s)",
                took.as_secs_f64(),
                done as f64 / took.as_secs_f64().max(1e-9)
            );
        }
    }));
    match result {
        Ok(r) => {
            println!(
                "filled {} rows (seq {}..={}) in {:.2}s = {:.0} rows/s",
                r.rows,
                r.first_seq,
                r.last_seq,
                r.elapsed.as_secs_f64(),
                r.rows_per_second()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("signet-ledger-fill: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
