//! `signetctl audit list`: audit events (denials, admin actions, CA transitions), newest first
//! unless `--oldest-first`, filtered by the server (`--kind`, `--since`, `--caller`) and paged
//! by key as `certs list` pages: `--limit` events (0 or `--all`: every match), and a
//! `--page-token` printed on stderr when more follow.

use std::path::Path;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::Args;
use signet_client::admin::{AuditEvent, AuditQuery};
use signet_runtime::clock::{Clock, SystemClock};

use crate::certs::pages;
use crate::{call_err, rfc3339, typed_admin};

#[derive(Debug, Args)]
pub struct AuditListArgs {
    /// Oldest first (the default is newest first).
    #[arg(long)]
    oldest_first: bool,
    /// Only this kind (e.g. admin.node_ban); one ending in `.` or `*` is a prefix: `--kind ca.`
    /// lists every CA transition.
    #[arg(long)]
    kind: Option<String>,
    /// Only events at or after this time: RFC 3339 (2026-01-31T12:00:00Z) or a duration back
    /// from now (90s, 15m, 1h, 7d).
    #[arg(long, value_name = "TIME|DURATION")]
    since: Option<String>,
    /// Only events of this caller, exactly as listed (e.g. spiffe://example.org/signet/admin).
    #[arg(long)]
    caller: Option<String>,
    /// At most this many events (0: all).
    #[arg(long, default_value_t = 100)]
    limit: u64,
    /// Every matching event (as --limit 0).
    #[arg(long, conflicts_with = "limit")]
    all: bool,
    /// Continue a listing: the token a previous `audit list` printed (on stderr) when it
    /// stopped at --limit; give the same filters and order.
    #[arg(long, value_name = "TOKEN")]
    page_token: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

/// `--since` as unix seconds: an RFC 3339 time, or `now` minus a duration.
fn since(text: &str, now: i64) -> anyhow::Result<i64> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Ok(signet_runtime::clock::unix(t));
    }
    match humantime::parse_duration(text) {
        Ok(d) => Ok(now.saturating_sub(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))),
        Err(_) => Err(anyhow!(
            "--since {text:?} is neither an RFC 3339 time (2026-01-31T12:00:00Z) nor a \
             duration (1h, 30m, 7d)"
        )),
    }
}

pub(crate) fn event_json(e: &AuditEvent) -> serde_json::Value {
    serde_json::json!({
        "id": e.id,
        "at": rfc3339(e.at),
        "kind": e.kind,
        "caller": e.caller,
        "detail": e.detail,
    })
}

pub async fn list(socket: &Path, args: AuditListArgs) -> anyhow::Result<ExitCode> {
    let now = signet_runtime::clock::unix(SystemClock.now());
    let since = args.since.as_deref().map(|t| since(t, now)).transpose()?;
    let client = typed_admin(socket).await?;
    let client = &client;
    if !args.json {
        println!(
            "{:>6}  {:<20}  {:<26}  {:<40}  DETAIL",
            "ID", "AT", "KIND", "CALLER"
        );
    }
    let limit = if args.all { 0 } else { args.limit };
    let json = args.json;
    pages("audit list", limit, args.page_token, |want, token| {
        let q = AuditQuery {
            newest_first: !args.oldest_first,
            kind: args.kind.clone(),
            since,
            caller: args.caller.clone(),
            limit: want,
            page_token: token,
        };
        async move {
            let page = client
                .audit_page(&q)
                .await
                .map_err(|e| call_err("audit list", &e))?;
            for e in &page.events {
                if json {
                    println!("{}", event_json(e));
                } else {
                    println!(
                        "{:>6}  {:<20}  {:<26}  {:<40}  {}",
                        e.id,
                        rfc3339(e.at),
                        e.kind,
                        e.caller,
                        e.detail
                    );
                }
            }
            Ok((page.events.len() as u64, page.next_page_token))
        }
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_time_or_a_duration_back_from_now() {
        assert_eq!(since("2026-01-31T12:00:00Z", 0).unwrap(), 1_769_860_800);
        assert_eq!(since("1h", 10_000).unwrap(), 6_400);
        assert_eq!(since("7d", 1_000_000).unwrap(), 1_000_000 - 7 * 86_400);
        let err = since("yesterday", 0).unwrap_err().to_string();
        assert!(
            err.contains("RFC 3339") && err.contains("duration"),
            "{err}"
        );
    }
}
