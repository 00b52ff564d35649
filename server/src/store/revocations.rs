//! Revocations: the [`RevocationStore`] part of the store.
//!
//! A revocation is a ledger *event* ([`signet_types::ledger::LedgerEvent`]): appended to the
//! one hash chain certificates and events share, under the same `ledger_head` lock as a batch
//! of certificates, in the same transaction that sets the certificate row's `revoked_at` and
//! `revocation_reason` (a lookup index; the event is the record). Invariant: the head lock
//! serialises every revocation with every other ledger write, across replicas, so the check
//! "not revoked yet" and the event that revokes cannot race: a certificate is revoked once.
//! The CRLs built from the index are `store::crls`.
//!
//! The SQL is the same on both databases except for how the transaction takes its lock, so
//! it is written once ([`impl_revocation_store`]).

use async_trait::async_trait;
use signet_types::ledger::{Hash, LedgerEvent};

use super::error::StoreError;
use super::ledger::LedgerRecord;

/// Which certificates [`RevocationStore::revocable_certificates`] narrows to (by an indexed
/// column); the caller filters further (e.g. by provenance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertFilter {
    SpiffeId(String),
    CaKey(String),
    /// Every unexpired, unrevoked certificate.
    Any,
}

/// A revocation to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRevocation {
    pub serial: String,
    /// RFC 5280 reason name.
    pub reason: String,
    /// Unix seconds.
    pub at: i64,
    pub caller: String,
    pub request_id: String,
    /// How the certificate was selected (canonical JSON).
    pub detail: String,
}

/// What became of one [`NewRevocation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevocationOutcome {
    /// Revoked now: the event's seq and the certificate's row, and every certificate renewed
    /// from it (transitively, by `renewed_from`) that was not revoked yet, each revoked by an
    /// event of its own in the same transaction.
    Revoked {
        event_seq: u64,
        row: Box<LedgerRecord>,
        cascaded: Vec<(u64, LedgerRecord)>,
    },
    /// It was revoked before; nothing changed.
    AlreadyRevoked { at: i64, reason: String },
    /// No certificate with that serial; nothing changed.
    Unknown,
}

/// A ledger event as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub event: LedgerEvent,
    pub prev_hash: Hash,
    pub hash: Hash,
}

#[async_trait]
pub trait RevocationStore: Send + Sync + 'static {
    /// Unrevoked certificates with `not_after > now` and `seq > after_seq`, by seq, at most
    /// `limit`, narrowed by `filter`.
    async fn revocable_certificates(
        &self,
        filter: &CertFilter,
        now: i64,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<LedgerRecord>, StoreError>;

    /// Whether any certificate (revoked, expired or not) matches `filter`.
    async fn any_certificate(&self, filter: &CertFilter) -> Result<bool, StoreError>;

    /// Appends one revocation event per item, in order, in one transaction under the ledger
    /// head lock, setting each revoked row's `revoked_at` and `revocation_reason`. Items already
    /// revoked or unknown change nothing. All or nothing.
    ///
    /// A revocation takes every certificate renewed from the revoked one with it (following
    /// `renewed_from` forward, by its index): a thief who renewed a leaked certificate before
    /// it was revoked keeps nothing. The ledger append refuses a renewal whose parent is
    /// revoked under the same lock, so a renewal racing this transaction is either revoked
    /// here or refused there.
    async fn append_revocations(
        &self,
        batch: &[NewRevocation],
    ) -> Result<Vec<RevocationOutcome>, StoreError>;

    /// Ledger events with `seq > after_seq`, ascending, at most `limit`.
    async fn ledger_events(&self, after_seq: u64, limit: u32) -> Result<Vec<EventRow>, StoreError>;

    /// The events about the certificate with `serial`, ascending.
    #[cfg(test)]
    async fn events_for_serial(&self, serial: &str) -> Result<Vec<EventRow>, StoreError>;
}

super::db_row! {
    /// A `ledger_events` row as both drivers decode it.
    pub(super) struct DbEvent {
        seq: i64,
        kind: String,
        serial: String,
        cert_seq: i64,
        cert_hash: Vec<u8>,
        reason: String,
        at: i64,
        caller: String,
        request_id: String,
        detail: String,
        prev_hash: Vec<u8>,
        hash: Vec<u8>,
    }
}

pub(super) const EVENT_COLUMNS: &str = "seq, kind, serial, cert_seq, cert_hash, reason, at, caller, request_id, detail, prev_hash, hash";

impl TryFrom<DbEvent> for EventRow {
    type Error = StoreError;

    fn try_from(r: DbEvent) -> Result<Self, StoreError> {
        let seq = u64::try_from(r.seq)
            .map_err(|_| StoreError::Corrupt(format!("negative ledger event seq {}", r.seq)))?;
        let cert_seq = u64::try_from(r.cert_seq)
            .map_err(|_| StoreError::Corrupt(format!("ledger event {seq}: negative cert_seq")))?;
        Ok(EventRow {
            event: LedgerEvent {
                seq,
                kind: r.kind,
                serial: r.serial,
                cert_seq,
                cert_hash: super::rows::hash(seq, "cert_hash", &r.cert_hash)?,
                reason: r.reason,
                at: r.at,
                caller: r.caller,
                request_id: r.request_id,
                detail: r.detail,
            },
            prev_hash: super::rows::hash(seq, "prev_hash", &r.prev_hash)?,
            hash: super::rows::hash(seq, "hash", &r.hash)?,
        })
    }
}

/// The `WHERE` clause and bound value of a filter (`$3` in the caller's query).
pub(super) fn filter_sql(filter: &CertFilter) -> (&'static str, Option<&str>) {
    match filter {
        CertFilter::SpiffeId(id) => (" AND spiffe_id = $3", Some(id.as_str())),
        CertFilter::CaKey(k) => (" AND ca_key_id = $3", Some(k.as_str())),
        CertFilter::Any => ("", None),
    }
}

/// Implements [`RevocationStore`] for a store with a `pool` field and an
/// `async fn begin_write(&self) -> Result<WriteTx, StoreError>` (see `store::write_tx`); `$lock`
/// is appended to the `SELECT`s that must lock the rows they read (`FOR UPDATE` on PostgreSQL; empty on SQLite, whose `BEGIN IMMEDIATE` already
/// holds the database's write lock).
macro_rules! impl_revocation_store {
    ($store:ty, $map:path, $lock:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::revocations::RevocationStore for $store {
            async fn revocable_certificates(
                &self,
                filter: &$crate::store::revocations::CertFilter,
                now: i64,
                after_seq: u64,
                limit: u32,
            ) -> Result<Vec<$crate::store::ledger::LedgerRecord>, StoreError> {
                let (clause, value) = $crate::store::revocations::filter_sql(filter);
                let sql = format!(
                    "SELECT {} FROM certificates WHERE revoked_at IS NULL AND not_after > $1 \
                     AND seq > $2{clause} ORDER BY seq LIMIT {}",
                    super::rows::CERT_COLUMNS,
                    limit.max(1)
                );
                let mut q = sqlx::query_as::<_, super::rows::DbCertificate>(&sql)
                    .bind(now)
                    .bind(super::rows::after(after_seq));
                if let Some(v) = value {
                    q = q.bind(v);
                }
                let found = q.fetch_all(&self.pool).await.map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::ledger::LedgerRecord::try_from)
                    .collect()
            }

            async fn any_certificate(
                &self,
                filter: &$crate::store::revocations::CertFilter,
            ) -> Result<bool, StoreError> {
                use $crate::store::revocations::CertFilter;
                let (sql, value) = match filter {
                    CertFilter::SpiffeId(v) => {
                        ("SELECT seq FROM certificates WHERE spiffe_id = $1 LIMIT 1", v)
                    }
                    CertFilter::CaKey(v) => {
                        ("SELECT seq FROM certificates WHERE ca_key_id = $1 LIMIT 1", v)
                    }
                    CertFilter::Any => {
                        let found: Option<(i64,)> =
                            sqlx::query_as("SELECT seq FROM certificates LIMIT 1")
                                .fetch_optional(&self.pool)
                                .await
                                .map_err($map)?;
                        return Ok(found.is_some());
                    }
                };
                let found: Option<(i64,)> = sqlx::query_as(sql)
                    .bind(value)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err($map)?;
                Ok(found.is_some())
            }

            async fn append_revocations(
                &self,
                batch: &[$crate::store::revocations::NewRevocation],
            ) -> Result<Vec<$crate::store::revocations::RevocationOutcome>, StoreError> {
                use $crate::store::revocations::RevocationOutcome;
                use $crate::store::rows::i64_of;
                use signet_types::ledger::{EVENT_REVOKE, LedgerEvent, event_hash};
                if batch.is_empty() {
                    return Ok(Vec::new());
                }
                let mut tx = self.begin_write().await?;
                // The ledger's one lock: events and certificates extend a single chain.
                let (head_seq, head_hash): (i64, Vec<u8>) = sqlx::query_as(&format!(
                    "SELECT seq, hash FROM ledger_head WHERE id = 1{}",
                    $lock
                ))
                .fetch_one(&mut *tx)
                .await
                .map_err($map)?;
                let head = super::rows::head(head_seq, &head_hash)?;
                let (mut seq, mut prev) = (head.seq, head.hash);
                let mut out = Vec::with_capacity(batch.len());
                for r in batch {
                    let found: Option<super::rows::DbCertificate> = sqlx::query_as(&format!(
                        "SELECT {} FROM certificates WHERE serial = $1",
                        super::rows::CERT_COLUMNS
                    ))
                    .bind(&r.serial)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err($map)?;
                    let Some(found) = found else {
                        out.push(RevocationOutcome::Unknown);
                        continue;
                    };
                    let row = $crate::store::ledger::LedgerRecord::try_from(found)?;
                    if let Some(v) = &row.revocation {
                        out.push(RevocationOutcome::AlreadyRevoked {
                            at: v.at,
                            reason: v.reason.clone(),
                        });
                        continue;
                    }
                    // Twice in one batch: the first one revokes.
                    if out.iter().any(|o| {
                        matches!(o, RevocationOutcome::Revoked { row: done, .. }
                            if done.entry.serial == r.serial)
                    }) {
                        out.push(RevocationOutcome::AlreadyRevoked {
                            at: r.at,
                            reason: r.reason.clone(),
                        });
                        continue;
                    }
                    // The certificate, then its renewals (depth first); each its own event.
                    let mut queue = vec![(row, r.detail.clone())];
                    let mut done: Vec<(u64, $crate::store::ledger::LedgerRecord)> = Vec::new();
                    while let Some((row, detail)) = queue.pop() {
                        seq += 1;
                        let event = LedgerEvent {
                            seq,
                            kind: EVENT_REVOKE.into(),
                            serial: row.entry.serial.clone(),
                            cert_seq: row.entry.seq,
                            cert_hash: row.hash,
                            reason: r.reason.clone(),
                            at: r.at,
                            caller: r.caller.clone(),
                            request_id: r.request_id.clone(),
                            detail,
                        };
                        let hash = event_hash(&prev, &event);
                        sqlx::query(
                            "INSERT INTO ledger_events (seq, kind, serial, cert_seq, cert_hash, \
                             reason, at, caller, request_id, detail, prev_hash, hash) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                        )
                        .bind(i64_of(seq, "seq")?)
                        .bind(&event.kind)
                        .bind(&event.serial)
                        .bind(i64_of(event.cert_seq, "cert_seq")?)
                        .bind(&event.cert_hash[..])
                        .bind(&event.reason)
                        .bind(event.at)
                        .bind(&event.caller)
                        .bind(&event.request_id)
                        .bind(&event.detail)
                        .bind(&prev[..])
                        .bind(&hash[..])
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                        sqlx::query(
                            "UPDATE certificates SET revoked_at = $1, revocation_reason = $2 \
                             WHERE seq = $3",
                        )
                        .bind(r.at)
                        .bind(&r.reason)
                        .bind(i64_of(row.entry.seq, "seq")?)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                        prev = hash;
                        let children: Vec<super::rows::DbCertificate> = sqlx::query_as(&format!(
                            "SELECT {} FROM certificates \
                             WHERE renewed_from = $1 AND revoked_at IS NULL ORDER BY seq DESC",
                            super::rows::CERT_COLUMNS
                        ))
                        .bind(&row.entry.serial)
                        .fetch_all(&mut *tx)
                        .await
                        .map_err($map)?;
                        for c in children {
                            let c = $crate::store::ledger::LedgerRecord::try_from(c)?;
                            let why = serde_json::json!({
                                "renewed_from": row.entry.serial,
                                "revoked_with": r.serial,
                            })
                            .to_string();
                            queue.push((c, why));
                        }
                        let mut row = row;
                        row.revocation = Some(signet_types::ledger::Revocation {
                            at: r.at,
                            reason: r.reason.clone(),
                        });
                        done.push((seq, row));
                    }
                    let mut done = done.into_iter();
                    if let Some((event_seq, row)) = done.next() {
                        out.push(RevocationOutcome::Revoked {
                            event_seq,
                            row: Box::new(row),
                            cascaded: done.collect(),
                        });
                    }
                }
                if seq != head.seq {
                    sqlx::query("UPDATE ledger_head SET seq = $1, hash = $2 WHERE id = 1")
                        .bind(i64_of(seq, "seq")?)
                        .bind(&prev[..])
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                }
                tx.commit().await.map_err($map)?;
                Ok(out)
            }

            async fn ledger_events(
                &self,
                after_seq: u64,
                limit: u32,
            ) -> Result<Vec<$crate::store::revocations::EventRow>, StoreError> {
                let found: Vec<$crate::store::revocations::DbEvent> =
                    sqlx::query_as(&format!(
                        "SELECT {} FROM ledger_events WHERE seq > $1 ORDER BY seq LIMIT $2",
                        $crate::store::revocations::EVENT_COLUMNS
                    ))
                    .bind(super::rows::after(after_seq))
                    .bind(super::rows::limit(limit))
                    .fetch_all(&self.pool)
                    .await
                    .map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::revocations::EventRow::try_from)
                    .collect()
            }

            #[cfg(test)]
            async fn events_for_serial(
                &self,
                serial: &str,
            ) -> Result<Vec<$crate::store::revocations::EventRow>, StoreError> {
                let found: Vec<$crate::store::revocations::DbEvent> =
                    sqlx::query_as(&format!(
                        "SELECT {} FROM ledger_events WHERE serial = $1 ORDER BY seq",
                        $crate::store::revocations::EVENT_COLUMNS
                    ))
                    .bind(serial)
                    .fetch_all(&self.pool)
                    .await
                    .map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::revocations::EventRow::try_from)
                    .collect()
            }
        }
    };
}

pub(super) use impl_revocation_store;
