//! `signetctl certs`: list, show and revoke issued certificates, as text or JSON (one object per
//! line). Listing pages by key: each page's `next_page_token` asks for the next, so a page costs
//! the same at any depth of the ledger; `show` finds one serial, or the newest rows of one
//! SPIFFE ID.

use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;
use serde::Serialize;
use signet_client::admin::{CertificateQuery, LedgerRecord};

use crate::{call_err, revoke, typed_admin};

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

pub(crate) fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// `v` with every integer under a key ending in `_at` (unix seconds, as the ledger's
/// provenance records them) shown as RFC 3339, as every time signetctl prints.
pub(crate) fn times_as_rfc3339(mut v: serde_json::Value) -> serde_json::Value {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    match x.as_i64() {
                        Some(t) if k.ends_with("_at") => *x = rfc3339(t).into(),
                        _ => walk(x),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

fn to_json(r: &LedgerRecord) -> CertJson {
    let e = &r.entry;
    CertJson {
        seq: e.seq,
        serial: e.serial.clone(),
        spiffe_id: e.spiffe_id.clone(),
        dns_names: e.dns_names.clone(),
        ip_addresses: e.ip_addresses.clone(),
        not_before: rfc3339(e.not_before),
        not_after: rfc3339(e.not_after),
        issued_at: rfc3339(e.issued_at),
        caller: e.caller.clone(),
        ca_key_id: e.ca_key_id.clone(),
        request_id: e.request_id.clone(),
        sha256: hex::encode(e.cert_sha256),
        hash: hex::encode(r.hash),
        provenance: e
            .recorded_provenance()
            .and_then(|p| serde_json::from_str(p).ok())
            .map(times_as_rfc3339),
        revoked_at: r.revocation.as_ref().map(|v| rfc3339(v.at)),
        revocation_reason: r.revocation.as_ref().map(|v| v.reason.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provenance_times_are_shown_as_rfc3339() {
        let v = times_as_rfc3339(serde_json::json!({
            "source": {"kind": "node", "attested_at": 0},
            "authorized_at": 1_769_860_800,
            "renewed_from": "ab",
            "count": 3,
        }));
        assert_eq!(v["authorized_at"], "2026-01-31T12:00:00Z");
        assert_eq!(v["source"]["attested_at"], "1970-01-01T00:00:00Z");
        assert_eq!(
            (v["count"].as_i64(), v["renewed_from"].as_str()),
            (Some(3), Some("ab"))
        );
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCmd {
    /// List issued certificates, oldest first (or newest first).
    List {
        #[arg(long)]
        json: bool,
        /// Only this SPIFFE ID.
        #[arg(long)]
        spiffe_id: Option<String>,
        /// Start after this ledger sequence number.
        #[arg(long, default_value_t = 0, conflicts_with_all = ["page_token", "newest"])]
        after: u64,
        /// Continue a listing: the token a previous `certs list` printed (on stderr) when it
        /// stopped at --limit.
        #[arg(long, value_name = "TOKEN")]
        page_token: Option<String>,
        /// Newest first.
        #[arg(long)]
        newest: bool,
        /// At most this many (0: all).
        #[arg(long, default_value_t = 100)]
        limit: u64,
    },
    /// Show one certificate by serial (hex, colons allowed), or the newest certificates of a
    /// SPIFFE ID (`spiffe://…`; at most --limit).
    Show {
        /// A serial, or a SPIFFE ID.
        serial: String,
        /// For a SPIFFE ID: how many of its newest certificates.
        #[arg(long, default_value_t = 10)]
        limit: u32,
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

/// One listed row: a JSON line, or a table line.
fn print_row(r: &LedgerRecord, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(&to_json(r))?);
        return Ok(());
    }
    let revoked = match &r.revocation {
        Some(v) => format!("  REVOKED {} ({})", rfc3339(v.at), v.reason),
        None => String::new(),
    };
    println!(
        "{:>6}  {:<34}  {:<20}  {:<50}  {}{revoked}",
        r.entry.seq,
        r.entry.serial,
        rfc3339(r.entry.not_after),
        r.entry.spiffe_id,
        r.entry.caller
    );
    Ok(())
}

/// TLS-style display (`AB:CD:…`), as `openssl x509 -fingerprint -sha256` prints it.
pub(crate) fn fingerprint(der: &[u8]) -> String {
    signet_pki::fingerprint::sha256_colon(der)
}

/// Pages through a listing (`certs list`, `jwt list`) until `limit` rows (0: all) were shown
/// or the pages end. `page(want, token)` fetches and prints up to `want` rows (at most 1000 a
/// page) and answers how many it printed and the next page's token; a token left over is
/// printed as the command that carries on.
pub(crate) async fn pages<F, Fut>(
    command: &str,
    limit: u64,
    page_token: Option<String>,
    mut page: F,
) -> anyhow::Result<()>
where
    F: FnMut(u32, Option<String>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(u64, Option<String>)>>,
{
    let mut token = page_token.filter(|t| !t.is_empty());
    let mut shown = 0u64;
    loop {
        let want = if limit == 0 {
            1000
        } else {
            (limit - shown).min(1000)
        };
        if want == 0 {
            break;
        }
        let (printed, next) = page(u32::try_from(want).unwrap_or(1000), token.take()).await?;
        shown += printed;
        token = next;
        if token.is_none() {
            break;
        }
    }
    if let Some(token) = token {
        eprintln!("more: signetctl {command} --page-token {token} (with the same filter)");
    }
    Ok(())
}

pub(crate) async fn certs(socket: &Path, cmd: CertsCmd) -> anyhow::Result<ExitCode> {
    let client = typed_admin(socket).await?;
    match cmd {
        CertsCmd::List {
            json,
            spiffe_id,
            after,
            page_token,
            newest,
            limit,
        } => {
            if !json {
                println!(
                    "{:>6}  {:<34}  {:<20}  {:<50}  CALLER",
                    "SEQ", "SERIAL", "NOT AFTER", "SPIFFE ID"
                );
            }
            let client = &client;
            pages("certs list", limit, page_token, |want, token| {
                let query = CertificateQuery {
                    // Only the first request starts after a seq; the tokens carry on.
                    after_seq: if token.is_none() { after } else { 0 },
                    limit: want,
                    spiffe_id: spiffe_id.clone(),
                    page_token: token,
                    newest_first: newest,
                };
                async move {
                    let page = client
                        .certificates(&query)
                        .await
                        .map_err(|e| call_err("list", &e))?;
                    for r in &page.certificates {
                        print_row(r, json)?;
                    }
                    Ok((page.certificates.len() as u64, page.next_page_token))
                }
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        CertsCmd::Show {
            serial,
            json,
            pem,
            limit,
        } if serial.starts_with("spiffe://") => {
            let page = client
                .certificates(&CertificateQuery {
                    spiffe_id: Some(serial.clone()),
                    newest_first: true,
                    limit: limit.max(1),
                    ..CertificateQuery::default()
                })
                .await
                .map_err(|e| call_err("show", &e))?;
            if page.certificates.is_empty() {
                eprintln!("no certificate for {serial}");
                return Ok(ExitCode::from(1));
            }
            for r in &page.certificates {
                if pem {
                    print!("{}", signet_types::pem::cert_to_pem(&r.cert_der));
                } else {
                    print_row(r, json)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        CertsCmd::Show {
            serial, json, pem, ..
        } => {
            let r = client
                .certificate(&serial)
                .await
                .map_err(|e| call_err("show", &e))?;
            if pem {
                print!("{}", signet_types::pem::cert_to_pem(&r.cert_der));
            } else if json {
                println!("{}", serde_json::to_string(&to_json(&r))?);
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
                    r.entry.recorded_provenance().unwrap_or("(not recorded)")
                );
                print!("{}", signet_types::pem::cert_to_pem(&r.cert_der));
            }
            Ok(ExitCode::SUCCESS)
        }
        CertsCmd::Revoke(args) => revoke::revoke(socket, args).await,
    }
}
