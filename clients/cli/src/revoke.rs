//! `signetctl certs revoke` and `signetctl crl`: revocation of certificates and the CRLs (the
//! `signet.admin.v1.RevocationAdmin` service on the admin socket), and the ledger's revocation
//! events for `signetctl ledger verify`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::{Args, Subcommand};
use signet_client::admin::{
    RevocationAdminClient, RevokeReport, RevokeSelector as Selector, RevokedCertificate,
};
use signet_client::proto::admin::revocation_admin_client::RevocationAdminClient as PbRevocationAdminClient;
use signet_client::proto::admin::{LedgerEventRecord, StreamLedgerEventsRequest};
use signet_types::ledger::{Hash, LedgerEvent};
use tonic::transport::Channel;

use crate::verdict::Broken;
use crate::{call_err, rfc3339, status_err};

/// `signetctl certs revoke`.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("what")
        .required(true)
        .args(["serial", "spiffe_id", "node", "entry", "ca_key"]),
))]
pub struct RevokeArgs {
    /// The certificate's serial (hex, colons allowed).
    pub serial: Option<String>,
    /// Every unexpired certificate of this SPIFFE ID.
    #[arg(long)]
    pub spiffe_id: Option<String>,
    /// Everything a node holds: its node SVIDs and the certificates issued for its entries.
    #[arg(long)]
    pub node: Option<String>,
    /// Every unexpired certificate issued for this registration entry.
    #[arg(long)]
    pub entry: Option<String>,
    /// Every unexpired certificate issued under this CA key (key ID, hex).
    #[arg(long)]
    pub ca_key: Option<String>,
    /// RFC 5280 reason: unspecified, keyCompromise, cACompromise, affiliationChanged,
    /// superseded, cessationOfOperation, privilegeWithdrawn, aACompromise.
    #[arg(long)]
    pub reason: String,
    /// Only show what would be revoked.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
}

impl RevokeArgs {
    fn selector(&self) -> anyhow::Result<Selector> {
        let chosen = [
            self.serial.clone().map(Selector::Serial),
            self.spiffe_id.clone().map(Selector::SpiffeId),
            self.node.clone().map(Selector::Node),
            self.entry.clone().map(Selector::Entry),
            self.ca_key.clone().map(Selector::CaKeyId),
        ];
        let mut it = chosen.into_iter().flatten();
        match (it.next(), it.next()) {
            (Some(s), None) => Ok(s),
            _ => Err(anyhow!(
                "say exactly one of: SERIAL, --spiffe-id, --node, --entry, --ca-key"
            )),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum CrlCmd {
    /// The current CRL of every issuing CA key.
    List {
        #[arg(long)]
        json: bool,
        /// Print the CRLs themselves, PEM (for `openssl verify -crl_check -CRLfile`).
        #[arg(long, conflicts_with = "json")]
        pem: bool,
    },
}

async fn channel(socket: &Path) -> anyhow::Result<Channel> {
    signet_client::connect_admin(socket).await.map_err(|e| {
        anyhow!("{e}\n(is signet-server running? point --socket at <data_dir>/admin.sock)")
    })
}

async fn client(socket: &Path) -> anyhow::Result<RevocationAdminClient> {
    Ok(RevocationAdminClient::from_channel(channel(socket).await?))
}

/// Revokes through the server; the answer, unprinted.
pub async fn revoke_request(
    socket: &Path,
    selector: Selector,
    reason: &str,
    dry_run: bool,
) -> anyhow::Result<RevokeReport> {
    client(socket)
        .await?
        .revoke(selector, reason, dry_run)
        .await
        .map_err(|e| call_err("revoke", &e))
}

fn cert_json(c: &RevokedCertificate) -> serde_json::Value {
    serde_json::json!({
        "serial": c.serial,
        "spiffe_id": c.spiffe_id,
        "ca_key_id": c.ca_key_id,
        "not_after": rfc3339(c.not_after),
        "revoked_at": (c.revoked_at != 0).then(|| rfc3339(c.revoked_at)),
        "reason": c.reason,
        "event_seq": c.event_seq,
    })
}

/// Prints a [`RevokeReport`].
pub fn print_report(r: &RevokeReport, json: bool) {
    if json {
        let v = serde_json::json!({
            "dry_run": r.dry_run,
            "revoked_count": r.revoked_count,
            "revoked": r.revoked.iter().map(cert_json).collect::<Vec<_>>(),
            "already_revoked_count": r.already_revoked_count,
            "already_revoked": r.already_revoked.iter().map(cert_json).collect::<Vec<_>>(),
            "expired_count": r.expired_count,
            "crls": r.crls.iter().map(|c| serde_json::json!({
                "ca_key_id": c.ca_key_id, "number": c.number, "entries": c.entries,
                "this_update": rfc3339(c.this_update), "next_update": rfc3339(c.next_update),
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
        return;
    }
    let verb = if r.dry_run { "would revoke" } else { "revoked" };
    for c in &r.revoked {
        println!(
            "{verb} {} ({}, CA key {}){}",
            c.serial,
            c.spiffe_id,
            c.ca_key_id,
            if c.event_seq != 0 {
                format!(", ledger event {}", c.event_seq)
            } else {
                String::new()
            }
        );
    }
    for c in &r.already_revoked {
        println!(
            "already revoked {} ({}) at {} ({}): unchanged",
            c.serial,
            c.spiffe_id,
            rfc3339(c.revoked_at),
            c.reason
        );
    }
    println!(
        "{verb}: {}, already revoked: {}, expired (left alone): {}",
        r.revoked_count, r.already_revoked_count, r.expired_count
    );
    for c in &r.crls {
        println!(
            "CRL of CA key {}: number {}, {} revoked serials, next update {}",
            c.ca_key_id,
            c.number,
            c.entries,
            rfc3339(c.next_update)
        );
    }
}

/// `signetctl certs revoke`.
pub async fn revoke(socket: &Path, args: RevokeArgs) -> anyhow::Result<ExitCode> {
    let selector = args.selector()?;
    let r = revoke_request(socket, selector, &args.reason, args.dry_run).await?;
    print_report(&r, args.json);
    Ok(ExitCode::SUCCESS)
}

/// `signetctl crl`.
pub async fn crl(socket: &Path, cmd: CrlCmd) -> anyhow::Result<ExitCode> {
    let CrlCmd::List { json, pem } = cmd;
    let crls = client(socket)
        .await?
        .crls()
        .await
        .map_err(|e| call_err("crl", &e))?;
    for c in &crls {
        if pem {
            print!(
                "{}",
                pem::encode_config(
                    &pem::Pem::new("X509 CRL", c.der.clone()),
                    pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
                )
            );
        } else if json {
            println!(
                "{}",
                serde_json::json!({
                    "ca_key_id": c.ca_key_id, "number": c.number, "entries": c.entries,
                    "this_update": rfc3339(c.this_update), "next_update": rfc3339(c.next_update),
                    "der_sha256": hex::encode(signet_types::ledger::sha256(&c.der)),
                })
            );
        } else {
            println!(
                "CA key {}: CRL number {}, {} revoked serials, this update {}, next update {}",
                c.ca_key_id,
                c.number,
                c.entries,
                rfc3339(c.this_update),
                rfc3339(c.next_update)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn hash32(v: &[u8], what: &str, seq: u64) -> anyhow::Result<Hash> {
    v.try_into()
        .map_err(|_| anyhow!("event {seq}: {what} is {} bytes, not 32", v.len()))
}

/// One event row as the verifier recomputes it: (event, prev_hash, hash).
pub fn event_of(r: &LedgerEventRecord) -> anyhow::Result<(LedgerEvent, Hash, Hash)> {
    Ok((
        LedgerEvent {
            seq: r.seq,
            kind: r.kind.clone(),
            serial: r.serial.clone(),
            cert_seq: r.cert_seq,
            cert_hash: hash32(&r.cert_hash, "certificate row hash", r.seq)?,
            reason: r.reason.clone(),
            at: r.at,
            caller: r.caller.clone(),
            request_id: r.request_id.clone(),
            detail: r.detail.clone(),
        },
        hash32(&r.prev_hash, "previous hash", r.seq)?,
        hash32(&r.hash, "hash", r.seq)?,
    ))
}

/// Verifies one event row in the chain (`v`) and against the rows it names (`refs`): Ok(Ok((seq,
/// hash))) when it fits, Ok(Err(where it breaks)) when not.
pub fn verify_event(
    v: &mut signet_types::ledger::Verifier,
    refs: &EventRefs,
    e: &LedgerEventRecord,
) -> anyhow::Result<Result<(u64, Hash), Broken>> {
    let (event, prev, hash) = event_of(e)?;
    if let Err(b) = v.push_event(&event, &prev, &hash) {
        return Ok(Err(b.into()));
    }
    if let Err(why) = refs.check(&event) {
        return Ok(Err(why));
    }
    Ok(Ok((event.seq, hash)))
}

/// The ledger's events in a seq range, in order, as a stream. A server without
/// revocation (no `RevocationAdmin`) has none.
pub struct Events {
    stream: Option<tonic::Streaming<LedgerEventRecord>>,
    peeked: Option<LedgerEventRecord>,
}

impl Events {
    /// The events with seq in `(after_seq, up_to_seq]`.
    pub async fn open_after(socket: &Path, after_seq: u64, up_to_seq: u64) -> anyhow::Result<Self> {
        let stream = match PbRevocationAdminClient::new(channel(socket).await?)
            .stream_ledger_events(StreamLedgerEventsRequest {
                after_seq,
                up_to_seq,
            })
            .await
        {
            Ok(s) => Some(s.into_inner()),
            Err(s) if s.code() == tonic::Code::Unimplemented => None,
            Err(s) => return Err(status_err("ledger events", s)),
        };
        Ok(Self {
            stream,
            peeked: None,
        })
    }

    /// Reads every event to its end: the certificate rows they name (what [`EventRefs`] keeps).
    pub async fn named_rows(mut self) -> anyhow::Result<std::collections::BTreeSet<u64>> {
        let mut named = std::collections::BTreeSet::new();
        while let Some(e) = self.next_before(u64::MAX).await? {
            named.insert(e.cert_seq);
        }
        Ok(named)
    }

    /// The seq of the next event, without taking it (None: no more).
    pub async fn peek_seq(&mut self) -> anyhow::Result<Option<u64>> {
        if self.peeked.is_none()
            && let Some(s) = &mut self.stream
        {
            self.peeked = s
                .message()
                .await
                .map_err(|s| status_err("ledger events stream", s))?;
            if self.peeked.is_none() {
                self.stream = None;
            }
        }
        Ok(self.peeked.as_ref().map(|e| e.seq))
    }

    /// The next event if its seq is below `before` (None: take the certificate row first).
    pub async fn next_before(&mut self, before: u64) -> anyhow::Result<Option<LedgerEventRecord>> {
        if self.peeked.is_none()
            && let Some(s) = &mut self.stream
        {
            self.peeked = s
                .message()
                .await
                .map_err(|s| status_err("ledger events stream", s))?;
            if self.peeked.is_none() {
                self.stream = None;
            }
        }
        match &self.peeked {
            Some(e) if e.seq < before => Ok(self.peeked.take()),
            _ => Ok(None),
        }
    }
}

/// Checks that every event names a real certificate row: the row at its `cert_seq` has the
/// event's serial and chain hash. The chain hash alone does not tie them (an event's fields
/// are its own); this does. Keeps 8 bytes (a truncated digest of the row's hash and serial) for
/// each row an event names, and nothing for the others: the rows to keep are read from the
/// events before the rows stream ([`Events::named_rows`]), so memory follows the number of
/// revocations, not the ledger's size. An event that names a row the first read did not (the
/// events changed between the two reads) fails the check: never a pass on a row not seen.
#[derive(Debug, Default)]
pub struct EventRefs {
    /// The rows events name; only these are kept.
    named: std::collections::BTreeSet<u64>,
    /// Of those, the rows verified (streamed, or fetched and checked on their own).
    rows: std::collections::BTreeMap<u64, u64>,
}

fn row_ref(hash: &Hash, serial: &str) -> u64 {
    let mut data = hash.to_vec();
    data.extend_from_slice(serial.as_bytes());
    let d = signet_types::ledger::sha256(&data);
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) | 1
}

impl EventRefs {
    /// For the rows at `named` (the `cert_seq`s of the events to check).
    pub fn named_by(named: impl IntoIterator<Item = u64>) -> Self {
        Self {
            named: named.into_iter().collect(),
            rows: std::collections::BTreeMap::new(),
        }
    }

    /// Whether row `seq` is known (verified, or checked on its own).
    pub fn knows(&self, seq: u64) -> bool {
        self.rows.contains_key(&seq)
    }

    /// A verified certificate row; kept only if an event names it.
    pub fn row(&mut self, seq: u64, serial: &str, hash: &Hash) {
        if seq > 0 && self.named.contains(&seq) {
            self.rows.insert(seq, row_ref(hash, serial));
        }
    }

    /// How many rows are kept (each 8 bytes and a map entry).
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.rows.len()
    }

    /// Err(why) when `event` does not name the certificate row it says.
    pub fn check(&self, event: &LedgerEvent) -> Result<(), Broken> {
        let (seq, row) = (event.seq, event.cert_seq);
        if !self.named.contains(&row) {
            return Err(Broken::RowNotNamed { event: seq, row });
        }
        let found = self.rows.get(&row).copied().unwrap_or(0);
        if found == 0 {
            return Err(Broken::NotACertificateRow { event: seq, row });
        }
        if found != row_ref(&event.cert_hash, &event.serial) {
            return Err(Broken::NotTheNamedCertificate {
                event: seq,
                row,
                serial: event.serial.clone(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn event(cert_seq: u64, serial: &str, cert_hash: Hash) -> LedgerEvent {
        LedgerEvent {
            seq: 9,
            kind: "revoke".into(),
            serial: serial.into(),
            cert_seq,
            cert_hash,
            reason: "keyCompromise".into(),
            at: 1,
            caller: "admin".into(),
            request_id: "r".into(),
            detail: "{}".into(),
        }
    }

    #[test]
    fn an_event_must_name_its_row_by_seq_serial_and_hash() {
        let mut refs = EventRefs::named_by([0, 1, 2, 3, 7]);
        refs.row(1, "0a", &[1; 32]);
        refs.row(3, "0c", &[3; 32]);
        assert_eq!(refs.check(&event(1, "0a", [1; 32])), Ok(()));
        assert_eq!(refs.check(&event(3, "0c", [3; 32])), Ok(()));
        // Another row's serial or hash, a row that is an event, beyond the end, zero.
        assert!(refs.check(&event(1, "0c", [1; 32])).is_err());
        assert!(refs.check(&event(1, "0a", [3; 32])).is_err());
        assert!(refs.check(&event(2, "0a", [1; 32])).is_err());
        assert!(refs.check(&event(7, "0a", [1; 32])).is_err());
        assert!(refs.check(&event(0, "0a", [1; 32])).is_err());
    }

    #[test]
    fn only_the_rows_events_name_are_kept_and_an_unnamed_row_fails_the_check() {
        let mut refs = EventRefs::named_by([5]);
        for seq in 1..=10_000u64 {
            refs.row(seq, &format!("{seq:x}"), &[(seq % 251) as u8; 32]);
        }
        assert_eq!(refs.kept(), 1, "memory follows the events, not the rows");
        assert!(refs.knows(5) && !refs.knows(6));
        assert_eq!(refs.check(&event(5, "5", [5; 32])), Ok(()));
        // Row 6 is a real row, but no event named it when the events were first read.
        let err = refs.check(&event(6, "6", [6; 32])).unwrap_err();
        assert_eq!(err, Broken::RowNotNamed { event: 9, row: 6 });
        assert!(err.to_string().contains("first read"), "{err}");
    }
}
