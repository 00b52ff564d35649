//! `signetctl`: the operator CLI. Talks to `signet-server`'s admin API on its Unix socket
//! (`--socket`, default `./signet-data/admin.sock`); `bench` also drives the CA listener.
//!
//! Output, the same for every command:
//! - **Times** are RFC 3339 in UTC to the second (`2026-01-31T12:00:00Z`), in tables and in
//!   JSON alike ([`rfc3339`], the one formatter); a time that is not set is `null` in JSON.
//! - **`--json`** prints JSON lines: a listing (`certs list`, `jwt list`, `audit list`,
//!   `node list`, `nodeset list`, `entry list`, `token list`, `crl list`, `federation list`,
//!   `ledger checkpoint list`) one object per line, one line per item, so `| jq` and
//!   `| grep` see each item whole; any other command one object on one line. Keys are
//!   snake_case; hashes and fingerprints lowercase hex. Tables and messages go to stdout,
//!   continuation hints (`more: … --page-token …`) and warnings to stderr. The one exception:
//!   `ledger checkpoint list --json` prints each signed checkpoint document verbatim (one per
//!   line), whose fields and their encoding the signature covers.
#![forbid(unsafe_code)]

mod audit;
mod bench;
mod ca;
mod certs;
mod checkpoint;
mod entry_file;
mod federation;
mod jwt;
mod ledger;
mod mint;
mod nodes;
mod revoke;
mod verdict;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use clap::{Parser, Subcommand};
use signet_client::CallError;
use signet_client::proto::admin::admin_client::AdminClient;
use tonic::transport::Channel;

pub(crate) use certs::rfc3339;
use certs::{CertsCmd, fingerprint};
pub(crate) use ledger::verify_ledger;
use ledger::{LedgerCmd, ledger_verify};
pub(crate) use mint::{mint_identity, write_replacing};

#[derive(Debug, Parser)]
#[command(version, about = "Operate a Signet CA")]
struct Cli {
    /// The server's admin socket.
    #[arg(
        long,
        global = true,
        default_value = "signet-data/admin.sock",
        env = "SIGNET_ADMIN_SOCKET"
    )]
    socket: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Issued certificates (the ledger).
    Certs {
        #[command(subcommand)]
        cmd: CertsCmd,
    },
    /// JWT-SVIDs on the ledger (hashes of the tokens, never the tokens).
    Jwt {
        #[command(subcommand)]
        cmd: jwt::JwtCmd,
    },
    /// The trust bundle.
    Bundle {
        #[command(subcommand)]
        cmd: BundleCmd,
    },
    /// The tamper-evident ledger.
    Ledger {
        #[command(subcommand)]
        cmd: LedgerCmd,
    },
    /// Audit events (denials, admin actions).
    Audit {
        #[command(subcommand)]
        cmd: AuditCmd,
    },
    /// Issue an X509-SVID for any identity of the trust domain, as the operator. The key is
    /// generated here and written beside the certificate (svid.pem, svid_key.pem, bundle.pem).
    Mint {
        #[arg(long)]
        spiffe_id: String,
        #[arg(long = "dns")]
        dns_names: Vec<String>,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
        ttl: Duration,
        /// Directory to write the files to.
        #[arg(long)]
        out: PathBuf,
    },
    /// One-time join tokens for node agents.
    Token {
        #[command(subcommand)]
        cmd: nodes::TokenCmd,
    },
    /// Attested nodes.
    Node {
        #[command(subcommand)]
        cmd: nodes::NodeCmd,
    },
    /// Node sets: named sets of nodes (by attested node selectors) an entry can name as parent.
    Nodeset {
        #[command(subcommand)]
        cmd: nodes::NodeSetCmd,
    },
    /// Registration entries: the workload identities a node may obtain.
    Entry {
        #[command(subcommand)]
        cmd: nodes::EntryCmd,
    },
    /// The CA's keys: status, rotation, taint and removal.
    Ca {
        #[command(subcommand)]
        cmd: ca::CaCmd,
    },
    /// Load generator: issues through the Istio API over TLS and reports throughput and latency.
    Bench(bench::BenchArgs),
    /// Certificate revocation lists (one per issuing CA key).
    Crl {
        #[command(subcommand)]
        cmd: revoke::CrlCmd,
    },
    /// Federation relationships: the foreign trust domains whose bundles the server keeps.
    Federation {
        #[command(subcommand)]
        cmd: federation::FederationCmd,
    },
}

#[derive(Debug, Subcommand)]
enum BundleCmd {
    /// Print the current trust bundle.
    Show {
        /// Print only the PEM roots.
        #[arg(long)]
        pem: bool,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCmd {
    /// List audit events, newest first, filtered and paged by the server.
    List(audit::AuditListArgs),
}

/// Why the admin socket could not be reached, with what to check.
fn unreachable(e: signet_client::ClientError) -> anyhow::Error {
    anyhow!("{e}\n(is signet-server running? point --socket at <data_dir>/admin.sock)")
}

/// The generated admin client, for the subcommands without a typed call yet (certs, ledger).
async fn admin(socket: &Path) -> anyhow::Result<AdminClient<Channel>> {
    let ch = signet_client::connect_admin(socket)
        .await
        .map_err(unreachable)?;
    Ok(AdminClient::new(ch))
}

/// The typed admin client ([`signet_client::admin::AdminClient`]).
async fn typed_admin(socket: &Path) -> anyhow::Result<signet_client::admin::AdminClient> {
    signet_client::admin::AdminClient::connect(socket)
        .await
        .map_err(unreachable)
}

/// A failed call, said with what to do about it (the classification every client shares).
fn status_err(what: &str, s: tonic::Status) -> anyhow::Error {
    call_err(what, &CallError::from(s))
}

/// [`status_err`] for a typed call: `<what>: <message> (<code>[; hint])`.
fn call_err(what: &str, e: &CallError) -> anyhow::Error {
    let hint = match e.class() {
        signet_client::ErrorClass::Retryable => match e.pushback() {
            Some(wait) => format!("; try again in {} ms", wait.as_millis()),
            None => "; try again".to_owned(),
        },
        signet_client::ErrorClass::Invalid => "; the request is malformed".to_owned(),
        signet_client::ErrorClass::Permanent => String::new(),
    };
    anyhow!("{what}: {} ({:?}{hint})", e.message(), e.code())
}

/// A reader that went away (`signetctl … | head`) ends the output; it is not an error. Rust
/// ignores SIGPIPE, so `println!` panics on a closed stdout, with a backtrace; exit quietly
/// instead, with the status a shell gives a process killed by SIGPIPE (128 + 13).
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    // The load generator runs on one thread: its tasks never wake each other across threads,
    // so it spends as little of the machine it shares with the server as it can (one core
    // drives far more requests than one server can answer).
    let runtime = match &cli.cmd {
        Cmd::Bench(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("signetctl: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("signetctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Certs { cmd } => certs::certs(&cli.socket, cmd).await,
        Cmd::Jwt { cmd } => jwt::jwt(&cli.socket, cmd).await,
        Cmd::Bundle {
            cmd: BundleCmd::Show { pem },
        } => {
            let b = typed_admin(&cli.socket)
                .await?
                .bundle()
                .await
                .map_err(|e| call_err("bundle", &e))?;
            let pem_text = b.roots_pem();
            if !pem {
                println!("trust domain: {}", b.trust_domain);
                println!("revision:     {}", b.revision);
                println!("file:         {}", b.path);
                for r in &b.roots_der {
                    println!("root SHA-256: {}", fingerprint(r));
                }
            }
            print!("{pem_text}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Ledger {
            cmd:
                LedgerCmd::Verify {
                    json,
                    checkpoints,
                    checkpoint_key,
                    expect_heads,
                    from_checkpoint,
                    chain_depth,
                },
        } => {
            let (start, chain) = match &from_checkpoint {
                None => (None, None),
                Some(which) => {
                    let key = checkpoint_key.as_deref().ok_or_else(|| {
                        anyhow::anyhow!("--from-checkpoint needs --checkpoint-key PUBKEY.pem")
                    })?;
                    let td = typed_admin(&cli.socket)
                        .await?
                        .bundle()
                        .await
                        .map_err(|e| call_err("bundle", &e))?
                        .trust_domain
                        .to_string();
                    let start = checkpoint::load_start(&cli.socket, which, key, &td).await?;
                    let chain = if chain_depth == 0 {
                        None
                    } else {
                        Some(checkpoint::load_chain(&cli.socket, key, &td, chain_depth).await?)
                    };
                    (Some(start), chain)
                }
            };
            // The key was for the start point: --checkpoint files are optional with it.
            let checkpoint_key = if from_checkpoint.is_some() && checkpoints.is_empty() {
                None
            } else {
                checkpoint_key
            };
            let expect = if checkpoints.is_empty() && expect_heads.is_empty() {
                checkpoint::Expectations::default()
            } else {
                let td = typed_admin(&cli.socket)
                    .await?
                    .bundle()
                    .await
                    .map_err(|e| call_err("bundle", &e))?
                    .trust_domain
                    .to_string();
                checkpoint::Expectations::load(
                    &checkpoints,
                    checkpoint_key.as_deref(),
                    &expect_heads,
                    &td,
                )?
            };
            ledger_verify(&cli.socket, json, &expect, start.as_ref(), chain.as_deref()).await
        }
        Cmd::Ledger {
            cmd: LedgerCmd::Checkpoint { cmd },
        } => checkpoint::run(&cli.socket, cmd).await,
        Cmd::Audit {
            cmd: AuditCmd::List(args),
        } => audit::list(&cli.socket, args).await,
        Cmd::Mint {
            spiffe_id,
            dns_names,
            ttl,
            out,
        } => {
            let files = mint::mint(&cli.socket, &spiffe_id, dns_names, ttl, &out).await?;
            println!("minted {spiffe_id} (serial {})", files.serial);
            println!("  {}", out.join("svid.pem").display());
            println!("  {}", out.join("svid_key.pem").display());
            println!("  {}", out.join("bundle.pem").display());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Ca { cmd } => ca::ca(&cli.socket, cmd).await,
        Cmd::Token { cmd } => nodes::token(&cli.socket, cmd).await,
        Cmd::Node { cmd } => nodes::node(&cli.socket, cmd).await,
        Cmd::Nodeset { cmd } => nodes::node_set(&cli.socket, cmd).await,
        Cmd::Entry { cmd } => nodes::entry(&cli.socket, cmd).await,
        Cmd::Bench(args) => bench::run(&cli.socket, args).await,
        Cmd::Crl { cmd } => revoke::crl(&cli.socket, cmd).await,
        Cmd::Federation { cmd } => federation::federation(&cli.socket, cmd).await,
    }
}
