//! `signetctl`: the operator CLI. Talks to `signet-server`'s admin API on its Unix socket
//! (`--socket`, default `./signet-data/admin.sock`); `bench` also drives the CA listener.
#![forbid(unsafe_code)]

mod bench;
mod ca;
mod checkpoint;
mod nodes;
mod revoke;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::{Parser, Subcommand};
use serde::Serialize;
use signet_client::admin::admin_client::AdminClient;
use signet_client::admin::{
    CertificateRecord, GetBundleRequest, GetCertificateRequest, GetLedgerHeadRequest,
    ListAuditEventsRequest, ListCertificatesRequest, MintX509SvidRequest, StreamLedgerRequest,
};
use signet_types::ledger::{Hash, LedgerEntry, Verifier};
use tonic::transport::Channel;

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
}

#[derive(Debug, Subcommand)]
enum CertsCmd {
    /// List issued certificates, oldest first.
    List {
        #[arg(long)]
        json: bool,
        /// Only this SPIFFE ID.
        #[arg(long)]
        spiffe_id: Option<String>,
        /// Start after this ledger sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// At most this many (0: all).
        #[arg(long, default_value_t = 100)]
        limit: u64,
    },
    /// Show one certificate by serial (hex, colons allowed).
    Show {
        serial: String,
        #[arg(long)]
        json: bool,
        /// Print only the certificate as PEM.
        #[arg(long)]
        pem: bool,
    },
    /// Revoke certificates: one by serial, or every unexpired one of a SPIFFE ID, a node, a
    /// registration entry or a CA key. Each is a hash-chained ledger event; the CRLs are
    /// re-issued before the answer.
    Revoke(revoke::RevokeArgs),
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
enum LedgerCmd {
    /// Recompute the hash chain from the first row to the head; say where it breaks.
    Verify {
        #[arg(long)]
        json: bool,
        /// A signed checkpoint (JSON file) the chain must still contain: catches a deleted
        /// tail and a rewritten history, which the chain alone cannot. Repeatable.
        #[arg(long = "checkpoint", value_name = "FILE")]
        checkpoints: Vec<PathBuf>,
        /// The checkpoint public key (PEM), e.g. from `ledger checkpoint key` or
        /// `/checkpoint.pub`, kept apart from the server.
        #[arg(long, value_name = "PUBKEY.pem")]
        checkpoint_key: Option<PathBuf>,
        /// A head written down earlier (SEQ:HASH, HASH in hex) the chain must still contain.
        /// Repeatable.
        #[arg(long = "expect-head", value_name = "SEQ:HASH")]
        expect_heads: Vec<String>,
    },
    /// Signed checkpoints of the ledger's head.
    Checkpoint {
        #[command(subcommand)]
        cmd: checkpoint::CheckpointCmd,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCmd {
    List {
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Serialize)]
struct CertJson {
    seq: u64,
    serial: String,
    spiffe_id: String,
    dns_names: Vec<String>,
    ip_addresses: Vec<String>,
    not_before: String,
    not_after: String,
    issued_at: String,
    caller: String,
    ca_key_id: String,
    request_id: String,
    sha256: String,
    hash: String,
    /// Where the certificate's authority came from; null for rows written before it was
    /// recorded.
    provenance: Option<serde_json::Value>,
    /// When it was revoked; null if it was not.
    revoked_at: Option<String>,
    /// The RFC 5280 reason name; null if not revoked.
    revocation_reason: Option<String>,
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

fn to_json(r: &CertificateRecord) -> CertJson {
    CertJson {
        seq: r.seq,
        serial: r.serial.clone(),
        spiffe_id: r.spiffe_id.clone(),
        dns_names: r.dns_names.clone(),
        ip_addresses: r.ip_addresses.clone(),
        not_before: rfc3339(r.not_before),
        not_after: rfc3339(r.not_after),
        issued_at: rfc3339(r.issued_at),
        caller: r.caller.clone(),
        ca_key_id: r.ca_key_id.clone(),
        request_id: r.request_id.clone(),
        sha256: hex::encode(&r.cert_sha256),
        hash: hex::encode(&r.hash),
        provenance: serde_json::from_str(&r.provenance).ok(),
        revoked_at: (r.revoked_at != 0).then(|| rfc3339(r.revoked_at)),
        revocation_reason: (r.revoked_at != 0).then(|| r.revocation_reason.clone()),
    }
}

async fn admin(socket: &Path) -> anyhow::Result<AdminClient<Channel>> {
    let ch = signet_client::connect_admin(socket).await.map_err(|e| {
        anyhow!("{e}\n(is signet-server running? point --socket at <data_dir>/admin.sock)")
    })?;
    Ok(AdminClient::new(ch))
}

/// A failed call, said with what to do about it (the classification every client shares).
fn status_err(what: &str, s: tonic::Status) -> anyhow::Error {
    let hint = match signet_client::ErrorClass::of_status(&s) {
        signet_client::ErrorClass::Retryable => match signet_client::retry_pushback(&s) {
            Some(wait) => format!("; try again in {} ms", wait.as_millis()),
            None => "; try again".to_owned(),
        },
        signet_client::ErrorClass::Invalid => "; the request is malformed".to_owned(),
        signet_client::ErrorClass::Permanent => String::new(),
    };
    anyhow!("{what}: {} ({:?}{hint})", s.message(), s.code())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("signetctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Certs { cmd } => certs(&cli.socket, cmd).await,
        Cmd::Bundle {
            cmd: BundleCmd::Show { pem },
        } => {
            let b = admin(&cli.socket)
                .await?
                .get_bundle(GetBundleRequest {})
                .await
                .map_err(|s| status_err("bundle", s))?
                .into_inner();
            let pem_text = signet_types::pem::certs_to_pem(b.roots.iter().map(Vec::as_slice));
            if !pem {
                println!("trust domain: {}", b.trust_domain);
                println!("revision:     {}", b.revision);
                println!("file:         {}", b.path);
                for r in &b.roots {
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
                },
        } => {
            let expect = if checkpoints.is_empty() && expect_heads.is_empty() {
                checkpoint::Expectations::default()
            } else {
                let td = admin(&cli.socket)
                    .await?
                    .get_bundle(GetBundleRequest {})
                    .await
                    .map_err(|s| status_err("bundle", s))?
                    .into_inner()
                    .trust_domain;
                checkpoint::Expectations::load(
                    &checkpoints,
                    checkpoint_key.as_deref(),
                    &expect_heads,
                    &td,
                )?
            };
            ledger_verify(&cli.socket, json, &expect).await
        }
        Cmd::Ledger {
            cmd: LedgerCmd::Checkpoint { cmd },
        } => checkpoint::run(&cli.socket, cmd).await,
        Cmd::Audit {
            cmd: AuditCmd::List { after, limit, json },
        } => {
            let events = admin(&cli.socket)
                .await?
                .list_audit_events(ListAuditEventsRequest {
                    after_id: after,
                    limit,
                })
                .await
                .map_err(|s| status_err("audit", s))?
                .into_inner()
                .events;
            for e in events {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"id": e.id, "at": rfc3339(e.at), "kind": e.kind, "caller": e.caller, "detail": e.detail})
                    );
                } else {
                    println!(
                        "{:>6}  {}  {:<18} {:<40} {}",
                        e.id,
                        rfc3339(e.at),
                        e.kind,
                        e.caller,
                        e.detail
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Mint {
            spiffe_id,
            dns_names,
            ttl,
            out,
        } => {
            let files = mint(&cli.socket, &spiffe_id, dns_names, ttl, &out).await?;
            println!("minted {spiffe_id} (serial {})", files.serial);
            println!("  {}", out.join("svid.pem").display());
            println!("  {}", out.join("svid_key.pem").display());
            println!("  {}", out.join("bundle.pem").display());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Ca { cmd } => ca::ca(&cli.socket, cmd).await,
        Cmd::Token { cmd } => nodes::token(&cli.socket, cmd).await,
        Cmd::Node { cmd } => nodes::node(&cli.socket, cmd).await,
        Cmd::Entry { cmd } => nodes::entry(&cli.socket, cmd).await,
        Cmd::Bench(args) => bench::run(&cli.socket, args).await,
        Cmd::Crl { cmd } => revoke::crl(&cli.socket, cmd).await,
    }
}

fn fingerprint(der: &[u8]) -> String {
    signet_types::ledger::sha256(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

async fn certs(socket: &Path, cmd: CertsCmd) -> anyhow::Result<ExitCode> {
    let mut client = admin(socket).await?;
    match cmd {
        CertsCmd::List {
            json,
            spiffe_id,
            after,
            limit,
        } => {
            let mut after = after;
            let mut shown = 0u64;
            if !json {
                println!(
                    "{:>6}  {:<34}  {:<20}  {:<50}  CALLER",
                    "SEQ", "SERIAL", "NOT AFTER", "SPIFFE ID"
                );
            }
            loop {
                let want = if limit == 0 {
                    1000
                } else {
                    (limit - shown).min(1000)
                };
                if want == 0 {
                    break;
                }
                let page = client
                    .list_certificates(ListCertificatesRequest {
                        after_seq: after,
                        limit: u32::try_from(want).unwrap_or(1000),
                        spiffe_id: spiffe_id.clone().unwrap_or_default(),
                    })
                    .await
                    .map_err(|s| status_err("list", s))?
                    .into_inner()
                    .certificates;
                let Some(last) = page.last().map(|r| r.seq) else {
                    break;
                };
                for r in &page {
                    if json {
                        println!("{}", serde_json::to_string(&to_json(r))?);
                    } else {
                        let revoked = if r.revoked_at != 0 {
                            format!(
                                "  REVOKED {} ({})",
                                rfc3339(r.revoked_at),
                                r.revocation_reason
                            )
                        } else {
                            String::new()
                        };
                        println!(
                            "{:>6}  {:<34}  {:<20}  {:<50}  {}{revoked}",
                            r.seq,
                            r.serial,
                            rfc3339(r.not_after),
                            r.spiffe_id,
                            r.caller
                        );
                    }
                }
                shown += page.len() as u64;
                after = last;
            }
            Ok(ExitCode::SUCCESS)
        }
        CertsCmd::Show { serial, json, pem } => {
            let r = client
                .get_certificate(GetCertificateRequest { serial })
                .await
                .map_err(|s| status_err("show", s))?
                .into_inner();
            if pem {
                print!("{}", signet_types::pem::cert_to_pem(&r.cert_der));
            } else if json {
                println!("{}", serde_json::to_string_pretty(&to_json(&r))?);
            } else {
                let j = to_json(&r);
                println!("seq:         {}", j.seq);
                println!("serial:      {}", j.serial);
                println!("spiffe id:   {}", j.spiffe_id);
                println!("dns names:   {}", j.dns_names.join(", "));
                println!("ip addrs:    {}", j.ip_addresses.join(", "));
                println!("not before:  {}", j.not_before);
                println!("not after:   {}", j.not_after);
                println!("issued at:   {}", j.issued_at);
                println!("caller:      {}", j.caller);
                println!("ca key:      {}", j.ca_key_id);
                println!("request id:  {}", j.request_id);
                println!("sha256:      {}", j.sha256);
                println!("chain hash:  {}", j.hash);
                match (&j.revoked_at, &j.revocation_reason) {
                    (Some(at), Some(reason)) => println!("revoked:     {at} ({reason})"),
                    _ => println!("revoked:     no"),
                }
                println!(
                    "provenance:  {}",
                    if r.provenance.is_empty() {
                        "(not recorded)"
                    } else {
                        r.provenance.as_str()
                    }
                );
                print!("{}", signet_types::pem::cert_to_pem(&r.cert_der));
            }
            Ok(ExitCode::SUCCESS)
        }
        CertsCmd::Revoke(args) => revoke::revoke(socket, args).await,
    }
}

fn hash32(v: &[u8], what: &str, seq: u64) -> anyhow::Result<Hash> {
    v.try_into()
        .map_err(|_| anyhow!("row {seq}: {what} is {} bytes, not 32", v.len()))
}

/// Verifies the ledger here, in the CLI, from the raw rows: the server is not trusted to
/// say its own chain is intact.
pub(crate) async fn ledger_verify(
    socket: &Path,
    json: bool,
    expect: &checkpoint::Expectations,
) -> anyhow::Result<ExitCode> {
    let report = verify_ledger_with(socket, expect).await?;
    match &report {
        Ok(n) => {
            if json && expect.is_empty() {
                println!("{}", serde_json::json!({"ok": true, "rows": n}));
            } else if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "rows": n, "consistent_with": expect.checked()})
                );
            } else {
                println!("ledger OK: {n} rows verified, hash chain intact up to the head");
                for what in expect.checked() {
                    println!("  consistent with {what}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(msg) => {
            if json {
                println!("{}", serde_json::json!({"ok": false, "error": msg}));
            } else {
                println!("ledger BROKEN: {msg}");
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// Ok(Ok(rows)) when intact, Ok(Err(where it breaks)) when not.
pub(crate) async fn verify_ledger(socket: &Path) -> anyhow::Result<Result<u64, String>> {
    verify_ledger_with(socket, &checkpoint::Expectations::default()).await
}

/// [`verify_ledger`], and the chain must also contain every head of `expect` (checkpoints).
pub(crate) async fn verify_ledger_with(
    socket: &Path,
    expect: &checkpoint::Expectations,
) -> anyhow::Result<Result<u64, String>> {
    let mut client = admin(socket).await?;
    let head = client
        .get_ledger_head(GetLedgerHeadRequest {})
        .await
        .map_err(|s| status_err("ledger head", s))?
        .into_inner();
    let head_hash = hash32(&head.hash, "head hash", head.seq)?;
    let mut stream = client
        .stream_ledger(StreamLedgerRequest {
            after_seq: 0,
            up_to_seq: head.seq,
        })
        .await
        .map_err(|s| status_err("ledger", s))?
        .into_inner();
    // Revocation events share the chain's seq: merged in order with the certificate rows.
    let mut events = revoke::Events::open(socket, head.seq).await?;
    let mut refs = revoke::EventRefs::default();
    let mut v = Verifier::default();
    while let Some(r) = stream
        .message()
        .await
        .map_err(|s| status_err("ledger stream", s))?
    {
        while let Some(e) = events.next_before(r.seq).await? {
            if let Err(why) = verify_event_row(&mut v, &refs, &e, expect)? {
                return Ok(Err(why));
            }
        }
        let entry = LedgerEntry {
            seq: r.seq,
            serial: r.serial.clone(),
            spiffe_id: r.spiffe_id.clone(),
            dns_names: r.dns_names.clone(),
            ip_addresses: r.ip_addresses.clone(),
            not_before: r.not_before,
            not_after: r.not_after,
            cert_sha256: hash32(&r.cert_sha256, "certificate hash", r.seq)?,
            ca_key_id: r.ca_key_id.clone(),
            caller: r.caller.clone(),
            issued_at: r.issued_at,
            request_id: r.request_id.clone(),
            provenance: r.provenance.clone(),
        };
        if signet_types::ledger::sha256(&r.cert_der) != entry.cert_sha256 {
            return Ok(Err(format!(
                "row {}: the stored certificate does not match its recorded SHA-256 (altered)",
                r.seq
            )));
        }
        let row_hash = hash32(&r.hash, "hash", r.seq)?;
        if let Err(b) = v.push(
            &entry,
            &hash32(&r.prev_hash, "previous hash", r.seq)?,
            &row_hash,
        ) {
            return Ok(Err(b.to_string()));
        }
        refs.row(r.seq, &r.serial, &row_hash);
        if let Err(why) = expect.observe(r.seq, &row_hash) {
            return Ok(Err(why));
        }
    }
    while let Some(e) = events.next_before(u64::MAX).await? {
        if let Err(why) = verify_event_row(&mut v, &refs, &e, expect)? {
            return Ok(Err(why));
        }
    }
    match v.finish(head.seq, &head_hash) {
        Ok(n) => Ok(expect.finish(n).map(|()| n)),
        Err(b) => Ok(Err(b.to_string())),
    }
}

/// One revocation event: recomputed in the chain, checked against the row it names, and (a
/// checkpoint's head may be an event) observed by the checkpoint expectations.
fn verify_event_row(
    v: &mut Verifier,
    refs: &revoke::EventRefs,
    e: &signet_client::admin::LedgerEventRecord,
    expect: &checkpoint::Expectations,
) -> anyhow::Result<Result<(), String>> {
    Ok(match revoke::verify_event(v, refs, e)? {
        Ok((seq, hash)) => expect.observe(seq, &hash),
        Err(why) => Err(why),
    })
}

pub(crate) struct Minted {
    pub serial: String,
    pub chain_pem: String,
    pub key_pem: String,
}

pub(crate) async fn mint_identity(
    socket: &Path,
    spiffe_id: &str,
    dns_names: Vec<String>,
    ttl: Duration,
) -> anyhow::Result<Minted> {
    let kc = signet_client::new_key_and_csr()?;
    let resp = admin(socket)
        .await?
        .mint_x509_svid(MintX509SvidRequest {
            spiffe_id: spiffe_id.to_owned(),
            csr: kc.csr_der.clone(),
            ttl_seconds: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            dns_names,
        })
        .await
        .map_err(|s| status_err("mint", s))?
        .into_inner();
    // Without the root: a presented chain ends below the trust anchor.
    let n = resp.cert_chain.len().saturating_sub(1).max(1);
    let chain_pem =
        signet_types::pem::certs_to_pem(resp.cert_chain.iter().take(n).map(Vec::as_slice));
    Ok(Minted {
        serial: resp.serial,
        chain_pem,
        key_pem: kc.key_pem,
    })
}

/// Writes `data` to `path` with exactly `mode`: a new file beside it (created exclusively, so
/// never through a planted link), fsync, then renamed over `path`, which it replaces whatever
/// it was (a file with a wider mode, a symlink). A failure leaves `path` as it was.
fn write_replacing(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have narrowed it; never widen beyond `mode`, never leave it narrower.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow!("writing {}: {e}", path.display())
    })
}

async fn mint(
    socket: &Path,
    spiffe_id: &str,
    dns_names: Vec<String>,
    ttl: Duration,
    out: &Path,
) -> anyhow::Result<Minted> {
    let minted = mint_identity(socket, spiffe_id, dns_names, ttl).await?;
    let bundle = admin(socket)
        .await?
        .get_bundle(GetBundleRequest {})
        .await
        .map_err(|s| status_err("bundle", s))?
        .into_inner();
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    write_replacing(&out.join("svid.pem"), minted.chain_pem.as_bytes(), 0o644)?;
    // The key is 0600 whatever was there before (a 0644 file, a symlink): a new file is
    // written and renamed over the old name, never opened through it.
    write_replacing(&out.join("svid_key.pem"), minted.key_pem.as_bytes(), 0o600)?;
    write_replacing(
        &out.join("bundle.pem"),
        signet_types::pem::certs_to_pem(bundle.roots.iter().map(Vec::as_slice)).as_bytes(),
        0o644,
    )?;
    Ok(minted)
}
