//! Revocation of certificates: what the operator selects, why (an RFC 5280 reason), and the
//! events that record it.
//!
//! A revocation is appended to the ledger as one hash-chained event per certificate
//! ([`signet_types::ledger::LedgerEvent`], never an edit of the certificate's row); the same
//! transaction sets the row's `revoked_at` / `revocation_reason`, which renewal over mTLS
//! (`policy::renewal::check_presented`) and the CRLs read. See `store::revocations`.
//!
//! Selectors ([`Selector`]): one serial, every unexpired certificate of a SPIFFE ID, of a
//! registration entry, issued under a CA key, or everything a node holds (its node SVIDs and
//! the certificates issued for its entries, as each row's provenance records). Selection and
//! revocation go page by page ([`PAGE`] certificates per transaction), so revoking a whole CA
//! key never holds the ledger lock for long; an interrupted revocation is finished by running
//! it again (already revoked certificates are reported, not revoked twice).
//!
//! Every revocation is audited: one `cert.revoke` event per transaction, naming every serial it
//! revoked (so revoking a whole CA key cannot overrun the audit queue), and one `admin.revoke`
//! for the operator's action. After revoking, the CRLs are re-issued before the answer.

use std::sync::Arc;

use signet_types::{SpiffeId, TrustDomain};

use crate::audit::AuditLog;
use crate::clock::{Clock, unix};
use crate::crl::{CrlPublisher, PublishedCrl};
use crate::provenance::{Provenance, Source};
use crate::store::{CertFilter, LedgerRecord, NewRevocation, RevocationOutcome, Store, StoreError};

/// Certificates selected and revoked per transaction.
pub const PAGE: u32 = 500;
/// Most certificates listed by name in a [`Report`] (the counts are complete).
pub const MAX_LISTED: usize = 1000;

pub use crate::revoked::Reason;

/// Which certificates to revoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Normalised lowercase hex.
    Serial(String),
    SpiffeId(SpiffeId),
    /// A node ID.
    Node(String),
    Entry(String),
    CaKey(String),
}

impl Selector {
    /// Canonical JSON for the ledger event's `detail`.
    pub fn detail(&self) -> String {
        let (by, value) = match self {
            Selector::Serial(s) => ("serial", s.clone()),
            Selector::SpiffeId(s) => ("spiffe_id", s.to_string()),
            Selector::Node(s) => ("node", s.clone()),
            Selector::Entry(s) => ("entry", s.clone()),
            Selector::CaKey(s) => ("ca_key", s.clone()),
        };
        serde_json::json!({ "by": by, "value": value }).to_string()
    }

    /// Whether a candidate row found by [`Selector::filter`] really is selected.
    pub fn matches(&self, row: &LedgerRecord) -> bool {
        let source = || {
            Provenance::from_ledger_text(&row.entry.provenance)
                .ok()
                .map(|p| p.source)
        };
        match self {
            Selector::Serial(s) => &row.entry.serial == s,
            Selector::SpiffeId(id) => row.entry.spiffe_id == id.to_string(),
            Selector::CaKey(k) => &row.entry.ca_key_id == k,
            Selector::Node(n) => matches!(
                source(),
                Some(Source::Node { node_id, .. } | Source::Entry { node_id, .. }) if &node_id == n
            ),
            Selector::Entry(e) => matches!(
                source(),
                Some(Source::Entry { entry_id, .. }) if &entry_id == e
            ),
        }
    }

    fn filter(&self) -> CertFilter {
        match self {
            Selector::SpiffeId(id) => CertFilter::SpiffeId(id.to_string()),
            Selector::CaKey(k) => CertFilter::CaKey(k.clone()),
            // Serial goes by lookup; node and entry by provenance, over every candidate.
            Selector::Serial(_) | Selector::Node(_) | Selector::Entry(_) => CertFilter::Any,
        }
    }
}

/// Why a revocation selector is refused; `value` is the operator's, shown with `{:?}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSelector {
    #[error("{by} is empty")]
    Empty { by: String },
    #[error("{by} is longer than 2048 bytes")]
    TooLong { by: String },
    #[error("serial {value:?} is not hexadecimal (e.g. 5f3a… or 5F:3A:…)")]
    Serial { value: String },
    #[error("spiffe_id {value:?}: {source}")]
    SpiffeId {
        value: String,
        source: signet_types::SpiffeIdError,
    },
    #[error("spiffe_id {value:?} is not in this CA's trust domain {td}")]
    ForeignTrustDomain { value: String, td: TrustDomain },
    #[error(transparent)]
    Node(#[from] crate::nodes::ParentError),
    #[error("{value:?} is not a node ID or node SPIFFE ID")]
    NotANode { value: String },
    #[error("entry ID {value:?} has characters an entry ID never has")]
    Entry { value: String },
    #[error("CA key ID {value:?} is not hexadecimal")]
    CaKey { value: String },
    #[error("unknown selector {by:?}")]
    Unknown { by: String },
}

/// A selector as the operator wrote it, checked: a serial in hex (colons allowed), a SPIFFE ID
/// of this trust domain, a node ID or node SPIFFE ID, an entry ID, a CA key ID in hex.
pub fn parse_selector(td: &TrustDomain, by: &str, value: &str) -> Result<Selector, BadSelector> {
    if value.is_empty() {
        return Err(BadSelector::Empty { by: by.to_owned() });
    }
    if value.len() > 2048 {
        return Err(BadSelector::TooLong { by: by.to_owned() });
    }
    let value_owned = || value.to_owned();
    match by {
        "serial" => signet_types::normalize_serial(value)
            .map(Selector::Serial)
            .ok_or_else(|| BadSelector::Serial {
                value: value_owned(),
            }),
        "spiffe_id" => {
            let id: SpiffeId = value.parse().map_err(|source| BadSelector::SpiffeId {
                value: value_owned(),
                source,
            })?;
            if !id.is_member_of(td) {
                return Err(BadSelector::ForeignTrustDomain {
                    value: value_owned(),
                    td: td.clone(),
                });
            }
            Ok(Selector::SpiffeId(id))
        }
        "node" => {
            let parent = crate::nodes::parse_node(td, value)?;
            crate::nodes::node_id_of(&parent, td)
                .map(|n| Selector::Node(n.to_owned()))
                .ok_or_else(|| BadSelector::NotANode {
                    value: value_owned(),
                })
        }
        "entry" => {
            if value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                Ok(Selector::Entry(value.to_owned()))
            } else {
                Err(BadSelector::Entry {
                    value: value_owned(),
                })
            }
        }
        "ca_key" => {
            let k = value.to_ascii_lowercase().replace(':', "");
            if crate::crl::valid_key_id(&k) {
                Ok(Selector::CaKey(k))
            } else {
                Err(BadSelector::CaKey {
                    value: value_owned(),
                })
            }
        }
        other => Err(BadSelector::Unknown {
            by: other.to_owned(),
        }),
    }
}

/// One certificate in a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    pub serial: String,
    pub spiffe_id: String,
    pub ca_key_id: String,
    pub not_after: i64,
    /// 0 / empty in a dry run.
    pub revoked_at: i64,
    pub reason: String,
    /// 0 in a dry run.
    pub event_seq: u64,
}

/// What a revocation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// At most [`MAX_LISTED`].
    pub revoked: Vec<Revoked>,
    pub revoked_count: u64,
    pub already_revoked: Vec<Revoked>,
    pub already_revoked_count: u64,
    pub expired_count: u64,
    pub dry_run: bool,
    /// The CRLs published afterwards.
    pub crls: Vec<PublishedCrl>,
}

impl Report {
    fn add_revoked(&mut self, r: Revoked) {
        self.revoked_count += 1;
        if self.revoked.len() < MAX_LISTED {
            self.revoked.push(r);
        }
    }
    fn add_already(&mut self, r: Revoked) {
        self.already_revoked_count += 1;
        if self.already_revoked.len() < MAX_LISTED {
            self.already_revoked.push(r);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RevokeError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn listed(row: &LedgerRecord) -> Revoked {
    Revoked {
        serial: row.entry.serial.clone(),
        spiffe_id: row.entry.spiffe_id.clone(),
        ca_key_id: row.entry.ca_key_id.clone(),
        not_after: row.entry.not_after,
        revoked_at: row.revocation.as_ref().map_or(0, |v| v.at),
        reason: row
            .revocation
            .as_ref()
            .map(|v| v.reason.clone())
            .unwrap_or_default(),
        event_seq: 0,
    }
}

/// Told the SHA-256 of each certificate revoked.
type OnRevoked = Box<dyn Fn(&[u8; 32]) + Send + Sync>;

/// Revokes certificates (see the module docs).
pub struct Revoker {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    audit: AuditLog,
    crls: Option<Arc<CrlPublisher>>,
    /// Called with each revoked certificate's SHA-256 (the issuer forgets its cached row).
    on_revoked: Option<OnRevoked>,
}

impl std::fmt::Debug for Revoker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revoker").finish_non_exhaustive()
    }
}

impl Revoker {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, audit: AuditLog) -> Self {
        Self {
            store,
            clock,
            audit,
            crls: None,
            on_revoked: None,
        }
    }

    /// Re-issues the CRLs after every revocation.
    pub fn with_crls(mut self, crls: Arc<CrlPublisher>) -> Self {
        self.crls = Some(crls);
        self
    }

    pub fn on_revoked(mut self, f: impl Fn(&[u8; 32]) + Send + Sync + 'static) -> Self {
        self.on_revoked = Some(Box::new(f));
        self
    }

    /// Revokes what `selector` selects for `reason`, as `caller`. Unknown targets answer
    /// NotFound and change nothing; already revoked or expired certificates are counted, not
    /// touched.
    pub async fn revoke(
        &self,
        selector: &Selector,
        reason: Reason,
        caller: &str,
        request_id: &str,
        dry_run: bool,
    ) -> Result<Report, RevokeError> {
        let now = unix(self.clock.now());
        let mut report = Report {
            dry_run,
            ..Report::default()
        };
        let detail = selector.detail();
        if let Selector::Serial(serial) = selector {
            let row = self
                .store
                .certificate_by_serial(serial)
                .await?
                .ok_or_else(|| {
                    RevokeError::NotFound(format!("no certificate with serial {serial}"))
                })?;
            if row.revocation.is_some() {
                report.add_already(listed(&row));
            } else if row.entry.not_after <= now {
                report.expired_count += 1;
            } else {
                self.revoke_page(
                    vec![row],
                    reason,
                    caller,
                    request_id,
                    &detail,
                    now,
                    &mut report,
                )
                .await?;
            }
        } else {
            self.check_target_exists(selector).await?;
            let filter = selector.filter();
            let mut after = 0u64;
            loop {
                let page = self
                    .store
                    .revocable_certificates(&filter, now, after, PAGE)
                    .await?;
                let Some(last) = page.last().map(|r| r.entry.seq) else {
                    break;
                };
                after = last;
                let chosen: Vec<LedgerRecord> =
                    page.into_iter().filter(|r| selector.matches(r)).collect();
                self.revoke_page(
                    chosen,
                    reason,
                    caller,
                    request_id,
                    &detail,
                    now,
                    &mut report,
                )
                .await?;
            }
        }
        if !dry_run {
            self.audit.record(
                "admin.revoke",
                caller,
                format!(
                    "revoke {detail} reason {reason}: {} revoked, {} already revoked, {} expired",
                    report.revoked_count, report.already_revoked_count, report.expired_count
                ),
                now,
            );
            if let Some(crls) = &self.crls {
                match crls.refresh().await {
                    Ok(published) => report.crls = published,
                    // The revocation is committed; the CRLs follow at the next tick.
                    Err(e) => tracing::warn!(error = %e, "re-issuing the CRLs after a revocation"),
                }
            }
        }
        Ok(report)
    }

    /// NotFound for a target that never had a certificate (nor exists as a node / entry).
    async fn check_target_exists(&self, selector: &Selector) -> Result<(), RevokeError> {
        let exists = match selector {
            Selector::Serial(_) => true,
            Selector::SpiffeId(id) => {
                self.store
                    .any_certificate(&CertFilter::SpiffeId(id.to_string()))
                    .await?
            }
            Selector::CaKey(k) => {
                self.store
                    .any_certificate(&CertFilter::CaKey(k.clone()))
                    .await?
            }
            Selector::Node(n) => self.store.node(n).await?.is_some(),
            // A deleted entry's certificates may still be valid: NotFound only when there is
            // no such entry now; its certificates are then found by provenance.
            Selector::Entry(e) => {
                self.store.entry(e).await?.is_some() || {
                    // No such entry now: an unexpired certificate issued for it still counts.
                    let now = unix(self.clock.now());
                    let mut after = 0;
                    let mut found = false;
                    loop {
                        let page = self
                            .store
                            .revocable_certificates(&CertFilter::Any, now, after, PAGE)
                            .await?;
                        let Some(last) = page.last().map(|r| r.entry.seq) else {
                            break;
                        };
                        if page.iter().any(|r| selector.matches(r)) {
                            found = true;
                            break;
                        }
                        after = last;
                    }
                    found
                }
            }
        };
        if exists {
            return Ok(());
        }
        Err(RevokeError::NotFound(match selector {
            Selector::Serial(s) => format!("no certificate with serial {s}"),
            Selector::SpiffeId(id) => format!("no certificate was ever issued for {id}"),
            Selector::CaKey(k) => format!("no certificate was ever issued under CA key {k}"),
            Selector::Node(n) => format!("no attested node {n}"),
            Selector::Entry(e) => {
                format!("no registration entry {e}, and no unexpired certificate issued for it")
            }
        }))
    }

    #[allow(clippy::too_many_arguments)]
    async fn revoke_page(
        &self,
        rows: Vec<LedgerRecord>,
        reason: Reason,
        caller: &str,
        request_id: &str,
        detail: &str,
        now: i64,
        report: &mut Report,
    ) -> Result<(), RevokeError> {
        if rows.is_empty() {
            return Ok(());
        }
        if report.dry_run {
            for r in &rows {
                report.add_revoked(listed(r));
            }
            return Ok(());
        }
        let batch: Vec<NewRevocation> = rows
            .iter()
            .map(|r| NewRevocation {
                serial: r.entry.serial.clone(),
                reason: reason.name().to_owned(),
                at: now,
                caller: caller.to_owned(),
                request_id: request_id.to_owned(),
                detail: detail.to_owned(),
            })
            .collect();
        let outcomes = self.store.append_revocations(&batch).await?;
        // One audit event per transaction (naming every serial it revoked), so that revoking a
        // whole CA key cannot overrun the audit queue.
        let mut revoked_here: Vec<(u64, Box<LedgerRecord>)> = Vec::new();
        for (row, outcome) in rows.iter().zip(outcomes) {
            match outcome {
                RevocationOutcome::Revoked {
                    event_seq,
                    row: done,
                    cascaded,
                } => {
                    // The certificate, then the renewals revoked with it.
                    let all = std::iter::once((event_seq, done))
                        .chain(cascaded.into_iter().map(|(s, r)| (s, Box::new(r))));
                    for (event_seq, done) in all {
                        if let Some(f) = &self.on_revoked {
                            f(&done.entry.cert_sha256);
                        }
                        let mut l = listed(&done);
                        l.event_seq = event_seq;
                        report.add_revoked(l);
                        revoked_here.push((event_seq, done));
                    }
                }
                RevocationOutcome::AlreadyRevoked { at, reason } => {
                    // Revoked by someone else since it was selected.
                    let mut l = listed(row);
                    l.revoked_at = at;
                    l.reason = reason;
                    report.add_already(l);
                }
                // Selected a moment ago, so it exists; count nothing.
                RevocationOutcome::Unknown => {}
            }
        }
        if let Some(message) = audit_detail(&revoked_here, reason, detail) {
            self.audit.record("cert.revoke", caller, message, now);
        }
        Ok(())
    }
}

/// The `cert.revoke` audit detail of one transaction's revocations (None: it revoked none).
fn audit_detail(
    revoked: &[(u64, Box<LedgerRecord>)],
    reason: Reason,
    detail: &str,
) -> Option<String> {
    match revoked {
        [] => None,
        [(event_seq, row)] => Some(format!(
            "revoked serial {} ({}, CA key {}) reason {reason}, ledger event {event_seq}, by {detail}",
            row.entry.serial, row.entry.spiffe_id, row.entry.ca_key_id
        )),
        [(first, _), .., (last, _)] => {
            let serials: Vec<&str> = revoked
                .iter()
                .map(|(_, r)| r.entry.serial.as_str())
                .collect();
            Some(format!(
                "revoked {} certificates reason {reason}, ledger events {first}..={last}, by {detail}: serials {}",
                revoked.len(),
                serials.join(" ")
            ))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reasons_parse_by_rfc_name_in_any_spelling() {
        for r in Reason::all() {
            assert_eq!(r.name().parse::<Reason>(), Ok(r));
            assert_eq!(r.name().to_uppercase().parse::<Reason>(), Ok(r));
        }
        assert_eq!("key-compromise".parse(), Ok(Reason::KEY_COMPROMISE));
        assert_eq!("CA_COMPROMISE".parse(), Ok(Reason::CA_COMPROMISE));
        assert_eq!(
            Reason::try_from(signet_pki::CrlReason::PrivilegeWithdrawn)
                .unwrap()
                .code(),
            9
        );
        for bad in ["", "certificateHold", "removeFromCRL", "compromised"] {
            let e = bad.parse::<Reason>().unwrap_err().to_string();
            assert!(e.contains("keyCompromise"), "{e}");
        }
        assert_eq!(
            "hold".parse::<Reason>().unwrap_err().to_string(),
            "unknown revocation reason \"hold\" (one of: unspecified, keyCompromise, \
             cACompromise, affiliationChanged, superseded, cessationOfOperation, \
             privilegeWithdrawn, aACompromise)"
        );
    }

    #[test]
    fn a_reason_is_a_final_crl_reason_and_converts_both_ways() {
        use signet_pki::CrlReason;
        assert_eq!(Reason::all().count(), 8);
        for r in Reason::all() {
            let crl = CrlReason::from(r);
            assert!(crl.is_final());
            assert_eq!(Reason::try_from(crl), Ok(r));
            assert_eq!(Some(r.name()), crl.name());
            assert_eq!(r.to_rcgen() as u8, crl.code());
        }
        for hold in [
            CrlReason::CertificateHold,
            CrlReason::RemoveFromCrl,
            CrlReason::Other(7),
        ] {
            assert_eq!(Reason::try_from(hold), Err(crate::revoked::NotFinal(hold)));
        }
    }

    #[test]
    fn selectors_are_checked() {
        let td = TrustDomain::new("example.org").unwrap();
        assert_eq!(
            parse_selector(&td, "serial", "8F:01").unwrap(),
            Selector::Serial("8f01".into())
        );
        assert!(parse_selector(&td, "serial", "xyz").is_err());
        assert!(parse_selector(&td, "serial", "").is_err());
        assert!(parse_selector(&td, "spiffe_id", "spiffe://other.org/a").is_err());
        assert!(parse_selector(&td, "spiffe_id", "not a uri").is_err());
        assert!(matches!(
            parse_selector(&td, "spiffe_id", "spiffe://example.org/a").unwrap(),
            Selector::SpiffeId(_)
        ));
        assert_eq!(
            parse_selector(&td, "ca_key", "AB:cd").unwrap(),
            Selector::CaKey("abcd".into())
        );
        assert!(parse_selector(&td, "ca_key", "../etc").is_err());
        assert!(parse_selector(&td, "entry", "a/b").is_err());
        assert!(parse_selector(&td, "colour", "x").is_err());
    }

    fn row(provenance: &str) -> LedgerRecord {
        LedgerRecord {
            entry: signet_types::ledger::LedgerEntry {
                seq: 1,
                serial: "01".into(),
                spiffe_id: "spiffe://example.org/w".into(),
                dns_names: vec![],
                ip_addresses: vec![],
                not_before: 0,
                not_after: 10,
                cert_sha256: [0; 32],
                ca_key_id: "ab".into(),
                caller: "c".into(),
                issued_at: 0,
                request_id: "r".into(),
                provenance: provenance.into(),
            },
            revocation: None,
            prev_hash: [0; 32],
            hash: [0; 32],
            cert_der: vec![],
        }
    }

    /// The revoker against a real SQLite store with an injected clock: a selection larger than
    /// a page is revoked completely (listed up to MAX_LISTED, counted in full); a dry run,
    /// an unknown target and a second run change nothing; an expired certificate is counted,
    /// not revoked; every revocation is audited.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn revokes_page_by_page_and_a_second_run_changes_nothing() {
        use crate::clock::fake::FakeClock;
        use crate::store::{NewCertificate, SqliteStore};
        const T0: i64 = 1_800_000_000;
        let dir = tempfile::tempdir().unwrap();
        let url = signet_testutil::sqlite_url(dir.path());
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::connect(&url, std::time::Duration::from_secs(5))
                .await
                .unwrap(),
        );
        let cert = |i: usize, id: &str, not_after: i64| NewCertificate {
            serial: format!("{:032x}", i + 1),
            spiffe_id: id.into(),
            dns_names: vec![],
            ip_addresses: vec![],
            not_before: T0 - 10,
            not_after,
            cert_sha256: [(i % 251) as u8; 32],
            ca_key_id: "ab".into(),
            caller: "test".into(),
            issued_at: T0 - 10,
            request_id: "r".into(),
            cert_der: vec![1],
            provenance: String::new(),
        };
        let many = PAGE as usize * 2 + 100;
        let mut batch: Vec<NewCertificate> = (0..many)
            .map(|i| cert(i, "spiffe://example.org/many", T0 + 3600))
            .collect();
        batch.push(cert(many, "spiffe://example.org/other", T0 + 3600));
        batch.push(cert(many + 1, "spiffe://example.org/many", T0 - 1));
        for chunk in batch.chunks(400) {
            store.append_certificates(chunk).await.unwrap();
        }
        let clock = Arc::new(FakeClock::at_unix(T0));
        let audit = AuditLog::spawn(store.clone(), 10_000);
        let forgotten = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let f = forgotten.clone();
        let revoker = Revoker::new(store.clone(), clock, audit.clone()).on_revoked(move |_| {
            f.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        const ADMIN: &str = "admin:spiffe://example.org/signet/admin";
        let td = TrustDomain::new("example.org").unwrap();
        let many_id = parse_selector(&td, "spiffe_id", "spiffe://example.org/many").unwrap();
        let head = store.ledger_head().await.unwrap();

        let dry = revoker
            .revoke(&many_id, Reason::SUPERSEDED, ADMIN, "r1", true)
            .await
            .unwrap();
        assert_eq!(dry.revoked_count, many as u64);
        assert_eq!(
            store.ledger_head().await.unwrap(),
            head,
            "a dry run changes nothing"
        );
        let unknown = parse_selector(&td, "spiffe_id", "spiffe://example.org/none").unwrap();
        assert!(matches!(
            revoker
                .revoke(&unknown, Reason::SUPERSEDED, ADMIN, "r2", false)
                .await,
            Err(RevokeError::NotFound(_))
        ));
        let missing = Selector::Serial("0fff".into());
        assert!(matches!(
            revoker
                .revoke(&missing, Reason::SUPERSEDED, ADMIN, "r2", false)
                .await,
            Err(RevokeError::NotFound(_))
        ));
        assert_eq!(store.ledger_head().await.unwrap(), head);

        let done = revoker
            .revoke(&many_id, Reason::SUPERSEDED, ADMIN, "r3", false)
            .await
            .unwrap();
        assert_eq!(done.revoked_count, many as u64);
        assert_eq!(done.revoked.len(), MAX_LISTED);
        assert_eq!(done.already_revoked_count, 0);
        assert_eq!(
            forgotten.load(std::sync::atomic::Ordering::Relaxed),
            many as u64
        );
        let after = store.ledger_head().await.unwrap();
        assert_eq!(after.seq, head.seq + many as u64);
        let other = store
            .certificate_by_serial(&format!("{:032x}", many + 1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(other.revocation, None, "another SPIFFE ID is untouched");

        // Again: nothing left to revoke under the selector; by serial, already revoked.
        let again = revoker
            .revoke(&many_id, Reason::KEY_COMPROMISE, ADMIN, "r4", false)
            .await
            .unwrap();
        assert_eq!(again.revoked_count, 0);
        let one = Selector::Serial(format!("{:032x}", 1));
        let again = revoker
            .revoke(&one, Reason::KEY_COMPROMISE, ADMIN, "r5", false)
            .await
            .unwrap();
        assert_eq!((again.revoked_count, again.already_revoked_count), (0, 1));
        assert_eq!(again.already_revoked[0].reason, "superseded");
        // Expired: counted, not revoked.
        let expired = Selector::Serial(format!("{:032x}", many + 2));
        let r = revoker
            .revoke(&expired, Reason::KEY_COMPROMISE, ADMIN, "r6", false)
            .await
            .unwrap();
        assert_eq!((r.revoked_count, r.expired_count), (0, 1));
        assert_eq!(store.ledger_head().await.unwrap(), after);

        // Audited: one cert.revoke per certificate, one admin.revoke per action.
        let mut kinds = std::collections::HashMap::<String, u64>::new();
        for _ in 0..100 {
            kinds.clear();
            let mut from = 0;
            loop {
                let page = store.audit_events(from, 1000).await.unwrap();
                let Some(last) = page.last().map(|e| e.id) else {
                    break;
                };
                for e in page {
                    *kinds.entry(e.kind).or_default() += 1;
                }
                from = last;
            }
            if kinds.get("admin.revoke") == Some(&4) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(kinds.get("admin.revoke"), Some(&4), "{kinds:?}");
        // One per transaction: three pages.
        assert_eq!(kinds.get("cert.revoke"), Some(&3), "{kinds:?}");
        assert_eq!(audit.dropped(), 0);
        let all = store.audit_events(0, 10_000).await.unwrap();
        let listed: usize = all
            .iter()
            .filter(|e| e.kind == "cert.revoke")
            .map(|e| {
                e.detail
                    .split_once(": serials ")
                    .unwrap()
                    .1
                    .split(' ')
                    .count()
            })
            .sum();
        assert_eq!(
            listed, many,
            "every revoked serial is named in the audit log"
        );
    }

    #[test]
    fn node_and_entry_selection_follows_the_provenance() {
        let node = Provenance::new(
            Source::Node {
                node_id: "vm1".into(),
                attestation: "join_token".into(),
            },
            0,
        )
        .to_ledger_text();
        let entry = Provenance::new(
            Source::Entry {
                entry_id: "e1".into(),
                node_id: "vm1".into(),
            },
            0,
        )
        .to_ledger_text();
        let other = Provenance::new(
            Source::Entry {
                entry_id: "e2".into(),
                node_id: "vm2".into(),
            },
            0,
        )
        .to_ledger_text();
        let sa = Provenance::new(
            Source::ServiceAccount {
                namespace: "n".into(),
                service_account: "s".into(),
                pod: None,
                node: Some("vm1".into()),
            },
            0,
        )
        .to_ledger_text();
        let vm1 = Selector::Node("vm1".into());
        assert!(vm1.matches(&row(&node)));
        assert!(vm1.matches(&row(&entry)));
        assert!(!vm1.matches(&row(&other)));
        assert!(!vm1.matches(&row(&sa)));
        assert!(!vm1.matches(&row("")));
        let e1 = Selector::Entry("e1".into());
        assert!(e1.matches(&row(&entry)));
        assert!(!e1.matches(&row(&node)));
        assert!(!e1.matches(&row(&other)));
        assert_eq!(
            Selector::Node("vm1".into()).detail(),
            r#"{"by":"node","value":"vm1"}"#
        );
    }
}
