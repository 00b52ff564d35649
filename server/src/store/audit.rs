//! Audit events (denials, admin actions, CA transitions): the [`AuditStore`] part of the store.
//!
//! Invariant: events keep the order they were recorded in; the store assigns increasing ids, and
//! readers page by id. A CA transition writes its events in its own transaction instead
//! (`store::ca_slots`), so a transition and its event commit together.
//!
//! The read is written once here ([`impl_audit_store`]); each backend supplies the batch insert
//! (one multi-row statement on PostgreSQL, one statement per row in a transaction on SQLite).

use async_trait::async_trait;

use super::error::StoreError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// Assigned by the store; ignored on insert.
    pub id: u64,
    /// Unix seconds.
    pub at: i64,
    /// e.g. `issue.denied`, `issue.unauthenticated`, `admin.mint`.
    pub kind: String,
    pub caller: String,
    pub detail: String,
}

#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// Appends `events` in order, all or nothing.
    async fn record_audit_events(&self, events: &[AuditEvent]) -> Result<(), StoreError>;

    /// Events with `id > after_id`, ascending, at most `limit`.
    async fn audit_events(&self, after_id: u64, limit: u32) -> Result<Vec<AuditEvent>, StoreError>;

    /// The newest `limit` events of one of `kinds` among the newest `window` events (by id),
    /// newest first: a backward walk of the primary key, bounded whatever the table holds.
    async fn newest_audit_events(
        &self,
        kinds: &[&str],
        window: u32,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, StoreError>;
}

/// Inserts one event (`$1`..`$4`: at, kind, caller, detail), for the row-by-row inserts: SQLite's
/// batch and a CA transition's own events (`store::ca_slots`).
pub(super) const INSERT_ONE: &str =
    "INSERT INTO audit_events (at, kind, caller, detail) VALUES ($1, $2, $3, $4)";

super::db_row! {
    /// An `audit_events` row as both drivers decode it.
    pub(super) struct DbAuditEvent {
        id: i64,
        at: i64,
        kind: String,
        caller: String,
        detail: String,
    }
}

impl TryFrom<DbAuditEvent> for AuditEvent {
    type Error = StoreError;

    fn try_from(r: DbAuditEvent) -> Result<Self, StoreError> {
        Ok(AuditEvent {
            id: u64::try_from(r.id)
                .map_err(|_| StoreError::Corrupt(format!("negative audit event id {}", r.id)))?,
            at: r.at,
            kind: r.kind,
            caller: r.caller,
            detail: r.detail,
        })
    }
}

/// Implements [`AuditStore`] for a backend with a `pool` field and an inherent
/// `async fn insert_audit_events(&self, &[AuditEvent]) -> Result<(), StoreError>` (the batch
/// insert, the one part that differs; never called with an empty batch).
macro_rules! impl_audit_store {
    ($store:ty, $map:path) => {
        #[async_trait::async_trait]
        impl $crate::store::audit::AuditStore for $store {
            async fn record_audit_events(
                &self,
                events: &[$crate::store::audit::AuditEvent],
            ) -> Result<(), StoreError> {
                if events.is_empty() {
                    return Ok(());
                }
                self.insert_audit_events(events).await
            }

            async fn audit_events(
                &self,
                after_id: u64,
                limit: u32,
            ) -> Result<Vec<$crate::store::audit::AuditEvent>, StoreError> {
                use $crate::store::rows;
                let found: Vec<$crate::store::audit::DbAuditEvent> = sqlx::query_as(
                    "SELECT id, at, kind, caller, detail FROM audit_events \
                     WHERE id > $1 ORDER BY id LIMIT $2",
                )
                .bind(rows::after(after_id))
                .bind(rows::limit(limit))
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::audit::AuditEvent::try_from)
                    .collect()
            }

            async fn newest_audit_events(
                &self,
                kinds: &[&str],
                window: u32,
                limit: u32,
            ) -> Result<Vec<$crate::store::audit::AuditEvent>, StoreError> {
                use $crate::store::rows;
                if kinds.is_empty() || limit == 0 {
                    return Ok(Vec::new());
                }
                // `kind IN ($3, $4, …)`; `$1` is the window, `$2` the limit.
                let placeholders: Vec<String> =
                    (0..kinds.len()).map(|i| format!("${}", i + 3)).collect();
                let sql = format!(
                    "SELECT id, at, kind, caller, detail FROM audit_events \
                     WHERE id > (SELECT COALESCE(MAX(id), 0) FROM audit_events) - $1 \
                     AND kind IN ({}) ORDER BY id DESC LIMIT $2",
                    placeholders.join(", ")
                );
                let mut q = sqlx::query_as::<_, $crate::store::audit::DbAuditEvent>(&sql)
                    .bind(rows::limit(window))
                    .bind(rows::limit(limit));
                for k in kinds {
                    q = q.bind(*k);
                }
                let found = q.fetch_all(&self.pool).await.map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::audit::AuditEvent::try_from)
                    .collect()
            }
        }
    };
}

pub(super) use impl_audit_store;
