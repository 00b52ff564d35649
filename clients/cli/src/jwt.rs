//! `signetctl jwt list` and `jwt show SEQ`: the JWT-SVIDs on the ledger. A row records the
//! token's claims that matter (subject, audiences, issued/expires, key ID), the token's SHA-256
//! (never the token), who asked and where the authority came from. `ledger verify` checks these
//! rows in the chain with the certificate rows and events.

use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;
use signet_client::admin::{CertificateQuery, JwtSvidRecord};

use crate::certs::pages;
use crate::{call_err, rfc3339, typed_admin};

#[derive(Debug, Subcommand)]
pub(crate) enum JwtCmd {
    /// List the JWT-SVIDs on the ledger, oldest first (or newest first).
    List {
        #[arg(long)]
        json: bool,
        /// Only this SPIFFE ID.
        #[arg(long)]
        spiffe_id: Option<String>,
        /// Continue a listing: the token a previous `jwt list` printed (on stderr) when it
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
    /// Show one JWT-SVID row by its ledger sequence number.
    Show {
        seq: u64,
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn jwt(socket: &Path, cmd: JwtCmd) -> anyhow::Result<ExitCode> {
    let client = typed_admin(socket).await?;
    match cmd {
        JwtCmd::List {
            json,
            spiffe_id,
            page_token,
            newest,
            limit,
        } => {
            if !json {
                println!(
                    "{:>6}  {:<20}  {:<20}  {:<44}  AUDIENCE",
                    "SEQ", "ISSUED", "EXPIRES", "SPIFFE ID"
                );
            }
            let client = &client;
            pages("jwt list", limit, page_token, |want, token| {
                let query = CertificateQuery {
                    after_seq: 0,
                    limit: want,
                    spiffe_id: spiffe_id.clone(),
                    page_token: token,
                    newest_first: newest,
                };
                async move {
                    let page = client
                        .jwt_svids(&query)
                        .await
                        .map_err(|e| call_err("list JWT-SVIDs", &e))?;
                    for r in &page.jwt_svids {
                        if json {
                            println!("{}", row_json(r));
                        } else {
                            // Audiences quoted and escaped: ["ab", "cd"] is not ["ab,cd"],
                            // and a row stored before audiences refused invisible characters
                            // shows them (review finding F7).
                            println!(
                                "{:>6}  {:<20}  {:<20}  {:<44}  {:?}",
                                r.entry.seq,
                                rfc3339(r.entry.issued_at),
                                rfc3339(r.entry.expires_at),
                                r.entry.spiffe_id,
                                r.entry.audience
                            );
                        }
                    }
                    Ok((page.jwt_svids.len() as u64, page.next_page_token))
                }
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        JwtCmd::Show { seq, json } => {
            let page = client
                .jwt_svids(&CertificateQuery {
                    after_seq: seq.saturating_sub(1),
                    limit: 1,
                    ..CertificateQuery::default()
                })
                .await
                .map_err(|e| call_err("JWT-SVID", &e))?;
            let Some(r) = page.jwt_svids.into_iter().find(|r| r.entry.seq == seq) else {
                eprintln!(
                    "signetctl: ledger row {seq} is not a JWT-SVID (see `signetctl jwt list`, or \
                     `certs list` for certificate rows)"
                );
                return Ok(ExitCode::FAILURE);
            };
            if json {
                println!("{}", row_json(&r));
            } else {
                let e = &r.entry;
                println!("seq:          {}", e.seq);
                println!("spiffe id:    {}", e.spiffe_id);
                println!("audience:     {:?}", e.audience);
                println!("issued at:    {}", rfc3339(e.issued_at));
                println!("expires at:   {}", rfc3339(e.expires_at));
                println!("key id:       {}", e.key_id);
                println!("token sha256: {}", hex::encode(e.token_sha256));
                println!("caller:       {}", e.caller);
                println!("request id:   {}", e.request_id);
                println!("provenance:   {}", e.provenance);
                println!("chain hash:   {}", hex::encode(r.hash));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn row_json(r: &JwtSvidRecord) -> serde_json::Value {
    let e = &r.entry;
    serde_json::json!({
        "seq": e.seq,
        "spiffe_id": e.spiffe_id,
        "audience": e.audience,
        "issued_at": rfc3339(e.issued_at),
        "expires_at": rfc3339(e.expires_at),
        "key_id": e.key_id,
        "token_sha256": hex::encode(e.token_sha256),
        "caller": e.caller,
        "request_id": e.request_id,
        // As `certs list` shows it: the recorded object (null if none), times as RFC 3339.
        "provenance": serde_json::from_str::<serde_json::Value>(&e.provenance)
            .ok()
            .map(crate::certs::times_as_rfc3339),
        "prev_hash": hex::encode(r.prev_hash),
        "hash": hex::encode(r.hash),
    })
}
