//! `signetctl ledger verify`: the hash chain recomputed here, in the CLI, from the raw rows (the
//! server is not trusted to say its own chain is intact), and checked against signed
//! checkpoints and expected heads.
//!
//! The rows stream in (pages of the server's keyset query), each checked and dropped: memory is
//! the event cross-check's rows named by events ([`revoke::EventRefs`], read first), whatever the
//! ledger's size. With
//! `--from-checkpoint` the verification starts at a signed checkpoint: its signature is verified
//! with the key kept apart from the server, then only the rows after it, the first chaining
//! from the checkpoint's hash; a revocation event naming an older row has that row fetched and
//! its own hash recomputed.
//!
//! This is the one part of signetctl on the generated calls (`signet_client::proto`) rather
//! than typed ones: the chain is recomputed from exactly the bytes stored, so a tampered row
//! must reach [`Verifier`] as it is and break the chain at its row number. Its certificate rows
//! convert through the client's one conversion ([`ledger_record`]), which judges only the
//! hashes' lengths.
//!
//! Each check answers `anyhow::Result<Verdict<T>>`: the outer error is a failure to ask (the
//! socket, the server), the inner [`Broken`] is the ledger failing verification, which
//! `ledger verify` prints and exits 1 for.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::anyhow;
use clap::Subcommand;
use signet_client::admin::{jwt_svid_record, ledger_record};
use signet_client::proto::admin::{GetLedgerHeadRequest, StreamLedgerRequest};
use signet_runtime::clock::{Clock, SystemClock};
use signet_types::ledger::{GENESIS, Hash, Verifier};

use crate::verdict::Broken;
use crate::{admin, checkpoint, revoke, status_err};

#[derive(Debug, Subcommand)]
pub(crate) enum LedgerCmd {
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
        /// Verify only the rows after a signed checkpoint, chaining from its hash: `latest`,
        /// a checkpoint's seq (`ledger checkpoint list`), or a checkpoint file. Needs
        /// --checkpoint-key. Also checks the chain of the checkpoints the server keeps
        /// (see --chain-depth).
        #[arg(long, value_name = "latest|SEQ|FILE")]
        from_checkpoint: Option<String>,
        /// With --from-checkpoint: how many of the server's newest checkpoints must form one
        /// chain (seqs never going back, each extending the one before) whose rows the ledger
        /// still holds with their hashes; 0 skips that check.
        #[arg(long, value_name = "N", default_value_t = 100)]
        chain_depth: u32,
    },
    /// Signed checkpoints of the ledger's head.
    Checkpoint {
        #[command(subcommand)]
        cmd: checkpoint::CheckpointCmd,
    },
}

/// A verification's outcome: what it found intact (`T`), or where the ledger is [`Broken`]
/// (`crate::verdict`).
pub(crate) type Verdict<T> = Result<T, Broken>;

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
    start: Option<&checkpoint::Start>,
    chain: Option<&[checkpoint::Link]>,
) -> anyhow::Result<ExitCode> {
    // The time printed is wall time: the real clock, named.
    let started = SystemClock.monotonic();
    let mut expect = expect.clone();
    let mut jwt_svids = 0u64;
    let report = match chain_checked(socket, &mut expect, start, chain).await? {
        Ok(()) => verify_ledger_counting(socket, &expect, start, &mut jwt_svids).await?,
        Err(why) => Err(why),
    };
    let chained = chain.map_or(0, <[_]>::len);
    if let Ok(n) = &report {
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "verified {n} rows in {secs:.2}s ({:.0} rows/s)",
            *n as f64 / secs.max(1e-9)
        );
    }
    match (&report, start) {
        (Ok(n), Some(s)) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "rows": n, "jwt_svids": jwt_svids, "from_checkpoint": s.what, "from_seq": s.seq, "checkpoint_chain": chained, "consistent_with": expect.checked()})
                );
            } else {
                println!(
                    "ledger OK: {n} rows after {} verified, hash chain intact up to the head",
                    s.what
                );
                if chained > 0 {
                    println!(
                        "  checkpoint chain: the newest {chained} checkpoints extend one another \
                         and the ledger still holds each one's row"
                    );
                }
                for what in expect.checked() {
                    println!("  consistent with {what}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        (Ok(n), None) => {
            if json && expect.is_empty() {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "rows": n, "jwt_svids": jwt_svids})
                );
            } else if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "rows": n, "jwt_svids": jwt_svids, "consistent_with": expect.checked()})
                );
            } else {
                println!(
                    "ledger OK: {n} rows verified ({jwt_svids} of them JWT-SVIDs), hash chain \
                     intact up to the head"
                );
                for what in expect.checked() {
                    println!("  consistent with {what}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        (Err(msg), _) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": false, "error": msg.to_string()})
                );
            } else {
                println!("ledger BROKEN: {msg}");
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// The chain of checkpoints (`chain`, verified) checked: linked ([`checkpoint::check_chain`]),
/// and the ledger still holds every point of it: those after `start` are added to `expect`
/// (checked as the rows stream), those up to it are read and their hashes recomputed here.
/// Ok(Err(what is wrong)) when not.
async fn chain_checked(
    socket: &Path,
    expect: &mut checkpoint::Expectations,
    start: Option<&checkpoint::Start>,
    chain: Option<&[checkpoint::Link]>,
) -> anyhow::Result<Verdict<()>> {
    let Some(links) = chain else {
        return Ok(Ok(()));
    };
    let marks = match checkpoint::check_chain(links) {
        Ok(m) => m,
        Err(why) => return Ok(Err(why)),
    };
    let (from, from_hash) = start.map_or((0, GENESIS), |s| (s.seq, s.hash));
    let mut client = admin(socket).await?;
    for (what, mark) in marks {
        if mark.seq > from {
            expect.push(what, mark);
            continue;
        }
        let held = if mark.seq == from {
            Ok(from_hash)
        } else {
            held_hash(&mut client, socket, mark.seq).await?
        };
        match held {
            Ok(h) if h == mark.hash => {}
            Ok(h) => {
                return Ok(Err(Broken::CheckpointRowRewritten {
                    seq: mark.seq,
                    held: h,
                    what,
                    says: mark.hash,
                }));
            }
            Err(why) => {
                return Ok(Err(Broken::AtCheckpointRow {
                    finding: Box::new(why),
                    what,
                }));
            }
        }
    }
    Ok(Ok(()))
}

/// The hash of row `seq` as recomputed from what it stores (a certificate or an event;
/// [`GENESIS`] at 0); Ok(Err(why)) when the row is gone or does not hash to what it stores.
async fn held_hash(
    client: &mut signet_client::proto::admin::admin_client::AdminClient<tonic::transport::Channel>,
    socket: &Path,
    seq: u64,
) -> anyhow::Result<Verdict<Hash>> {
    let Some(before) = seq.checked_sub(1) else {
        return Ok(Ok(GENESIS));
    };
    let row = client
        .stream_ledger(StreamLedgerRequest {
            after_seq: before,
            up_to_seq: seq,
        })
        .await
        .map_err(|s| status_err("ledger", s))?
        .into_inner()
        .message()
        .await
        .map_err(|s| status_err("ledger stream", s))?;
    if let Some(r) = row.filter(|r| r.seq == seq) {
        let row = ledger_record(r)?;
        if !row.hashes_to_itself() {
            return Ok(Err(Broken::RowAltered { seq }));
        }
        return Ok(Ok(row.hash));
    }
    let mut events = revoke::Events::open_after(socket, before, seq).await?;
    if let Some(e) = events.next_before(u64::MAX).await?
        && e.seq == seq
    {
        let (event, prev, hash) = revoke::event_of(&e)?;
        if signet_types::ledger::event_hash(&prev, &event) != hash {
            return Ok(Err(Broken::EventAltered { seq }));
        }
        return Ok(Ok(hash));
    }
    let mut jwts = Jwts::open_after(client, before, seq).await?;
    if jwts.peek_seq().await? == Some(seq)
        && let Some(j) = jwts.next()
    {
        let j = jwt_svid_record(j)?;
        if !j.hashes_to_itself() {
            return Ok(Err(Broken::RowAltered { seq }));
        }
        return Ok(Ok(j.hash));
    }
    Ok(Err(Broken::RowGone { seq }))
}

/// Ok(Ok(rows)) when intact, Ok(Err(where it breaks)) when not.
pub(crate) async fn verify_ledger(socket: &Path) -> anyhow::Result<Verdict<u64>> {
    verify_ledger_with(socket, &checkpoint::Expectations::default()).await
}

/// [`verify_ledger`], and the chain must also contain every head of `expect` (checkpoints).
pub(crate) async fn verify_ledger_with(
    socket: &Path,
    expect: &checkpoint::Expectations,
) -> anyhow::Result<Verdict<u64>> {
    verify_ledger_from(socket, expect, None).await
}

/// [`verify_ledger_with`], from row 1 or (`start`) only the rows after a verified checkpoint;
/// Ok(Ok(rows verified)).
pub(crate) async fn verify_ledger_from(
    socket: &Path,
    expect: &checkpoint::Expectations,
    start: Option<&checkpoint::Start>,
) -> anyhow::Result<Verdict<u64>> {
    verify_ledger_counting(socket, expect, start, &mut 0).await
}

/// [`verify_ledger_from`], counting the JWT-SVID rows verified in `jwt_svids`.
async fn verify_ledger_counting(
    socket: &Path,
    expect: &checkpoint::Expectations,
    start: Option<&checkpoint::Start>,
    jwt_svids: &mut u64,
) -> anyhow::Result<Verdict<u64>> {
    let mut client = admin(socket).await?;
    let head = client
        .get_ledger_head(GetLedgerHeadRequest {})
        .await
        .map_err(|s| status_err("ledger head", s))?
        .into_inner();
    let head_hash = hash32(&head.hash, "head hash", head.seq)?;
    let from = start.map_or(0, |s| s.seq);
    if head.seq < from {
        return Ok(Err(Broken::Truncated {
            last: head.seq,
            seq: from,
            what: format!("the checkpoint {}", start.map_or("", |s| s.what.as_str())),
        }));
    }
    let mut stream = client
        .stream_ledger(StreamLedgerRequest {
            after_seq: from,
            up_to_seq: head.seq,
        })
        .await
        .map_err(|s| status_err("ledger", s))?
        .into_inner();
    // The rows events name, read first: the cross-check keeps only those (memory follows the
    // events, not the ledger). Then the events again, merged in seq order with the rows.
    let named = revoke::Events::open_after(socket, from, head.seq)
        .await?
        .named_rows()
        .await?;
    // Rows a revocation event names must still show as revoked: the column is what CRLs and
    // renewal read, and a database writer who clears it would un-revoke the certificate with
    // the hash chain intact. (Only this direction: a revocation committed during the run sets
    // the column of a row whose event was read before it, never the other way round.)
    let revoked_by_event = named.clone();
    let mut refs = revoke::EventRefs::named_by(named);
    let mut events = revoke::Events::open_after(socket, from, head.seq).await?;
    let mut jwts = Jwts::open_after(&mut client, from, head.seq).await?;
    let mut v = match start {
        Some(s) => Verifier::resume(s.seq, s.hash),
        None => Verifier::default(),
    };
    // One loop for a full verification and one from a checkpoint: each certificate row after
    // the events before it, then the events after the last row (u64::MAX).
    loop {
        let row = stream
            .message()
            .await
            .map_err(|s| status_err("ledger stream", s))?;
        let before = row.as_ref().map_or(u64::MAX, |r| r.seq);
        // The events and JWT-SVID rows before this certificate row, merged by seq.
        loop {
            let next_event = events.peek_seq().await?.filter(|s| *s < before);
            let next_jwt = jwts.peek_seq().await?.filter(|s| *s < before);
            match (next_event, next_jwt) {
                (Some(e), Some(j)) if j < e => {}
                (Some(_), _) => {
                    let Some(e) = events.next_before(before).await? else {
                        break;
                    };
                    if let Err(why) = older_row(&mut client, &mut refs, from, &e).await? {
                        return Ok(Err(why));
                    }
                    if let Err(why) = verify_event_row(&mut v, &refs, &e, expect)? {
                        return Ok(Err(why));
                    }
                    continue;
                }
                (None, Some(_)) => {}
                (None, None) => break,
            }
            let Some(j) = jwts.next() else { break };
            let j = jwt_svid_record(j)?;
            if let Err(b) = v.push_jwt(&j.entry, &j.prev_hash, &j.hash) {
                return Ok(Err(b.into()));
            }
            *jwt_svids += 1;
            if let Err(why) = expect.observe(j.entry.seq, &j.hash) {
                return Ok(Err(why));
            }
        }
        let Some(r) = row else { break };
        let row = ledger_record(r)?;
        let entry = &row.entry;
        if !row.holds_its_certificate() {
            return Ok(Err(Broken::CertificateAltered { seq: entry.seq }));
        }
        if let Err(b) = v.push(entry, &row.prev_hash, &row.hash) {
            return Ok(Err(b.into()));
        }
        if revoked_by_event.contains(&entry.seq) && row.revocation.is_none() {
            return Ok(Err(Broken::RevocationCleared {
                row: entry.seq,
                serial: entry.serial.clone(),
            }));
        }
        refs.row(entry.seq, &entry.serial, &row.hash);
        if let Err(why) = expect.observe(entry.seq, &row.hash) {
            return Ok(Err(why));
        }
    }
    match v.finish(head.seq, &head_hash) {
        Ok(n) => Ok(expect.finish(n).map(|()| n - from)),
        Err(b) => Ok(Err(b.into())),
    }
}

/// The JWT-SVID rows of `(after_seq, up_to_seq]`, in seq order, read ahead one row (a server
/// without them, answering Unimplemented, has none).
struct Jwts {
    stream: Option<tonic::Streaming<signet_client::proto::admin::JwtSvidRecord>>,
    peeked: Option<signet_client::proto::admin::JwtSvidRecord>,
}

impl Jwts {
    async fn open_after(
        client: &mut signet_client::proto::admin::admin_client::AdminClient<
            tonic::transport::Channel,
        >,
        after_seq: u64,
        up_to_seq: u64,
    ) -> anyhow::Result<Self> {
        let stream = match client
            .stream_jwt_svids(StreamLedgerRequest {
                after_seq,
                up_to_seq,
            })
            .await
        {
            Ok(s) => Some(s.into_inner()),
            Err(s) if s.code() == tonic::Code::Unimplemented => None,
            Err(s) => return Err(status_err("JWT-SVID rows", s)),
        };
        Ok(Self {
            stream,
            peeked: None,
        })
    }

    /// The seq of the next row, without taking it.
    async fn peek_seq(&mut self) -> anyhow::Result<Option<u64>> {
        if self.peeked.is_none()
            && let Some(s) = &mut self.stream
        {
            self.peeked = s
                .message()
                .await
                .map_err(|s| status_err("JWT-SVID rows stream", s))?;
            if self.peeked.is_none() {
                self.stream = None;
            }
        }
        Ok(self.peeked.as_ref().map(|r| r.seq))
    }

    /// The row [`Jwts::peek_seq`] saw.
    fn next(&mut self) -> Option<signet_client::proto::admin::JwtSvidRecord> {
        self.peeked.take()
    }
}

/// A revocation event after the checkpoint `from` that names a row at or before it: that row
/// was not streamed, so it is fetched by serial and its own hash recomputed before the event is
/// checked against it (as [`revoke::EventRefs`] does for the streamed rows).
async fn older_row(
    client: &mut signet_client::proto::admin::admin_client::AdminClient<tonic::transport::Channel>,
    refs: &mut revoke::EventRefs,
    from: u64,
    e: &signet_client::proto::admin::LedgerEventRecord,
) -> anyhow::Result<Verdict<()>> {
    if e.cert_seq == 0 || e.cert_seq > from || refs.knows(e.cert_seq) {
        return Ok(Ok(()));
    }
    let r = match client
        .get_certificate(signet_client::proto::admin::GetCertificateRequest {
            serial: e.serial.clone(),
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::NotFound => {
            return Ok(Err(Broken::EventNamesNoRow {
                event: e.seq,
                serial: e.serial.clone(),
                row: e.cert_seq,
            }));
        }
        Err(s) => return Err(status_err("certificate of an event", s)),
    };
    let row = ledger_record(r)?;
    let entry = &row.entry;
    if entry.seq != e.cert_seq || !row.hashes_to_itself() {
        return Ok(Err(Broken::NamedRowAltered {
            event: e.seq,
            row: e.cert_seq,
            serial: e.serial.clone(),
        }));
    }
    refs.row(entry.seq, &entry.serial, &row.hash);
    Ok(Ok(()))
}

/// One revocation event: recomputed in the chain, checked against the row it names, and (a
/// checkpoint's head may be an event) observed by the checkpoint expectations.
fn verify_event_row(
    v: &mut Verifier,
    refs: &revoke::EventRefs,
    e: &signet_client::proto::admin::LedgerEventRecord,
    expect: &checkpoint::Expectations,
) -> anyhow::Result<Verdict<()>> {
    Ok(match revoke::verify_event(v, refs, e)? {
        Ok((seq, hash)) => expect.observe(seq, &hash),
        Err(why) => Err(why),
    })
}
