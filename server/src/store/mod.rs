//! Storage: one [`Store`] trait, two implementations over sqlx (PostgreSQL for production,
//! SQLite for the embedded default). Migrations live in `migrations/{postgres,sqlite}` and are
//! applied by [`connect`].
//!
//! The ledger's hash chain is extended inside [`Store::append_certificates`]: one transaction
//! locks the chain head, appends the whole batch in order, and moves the head, so replicas
//! sharing one PostgreSQL extend a single chain in a total order.

pub mod ca_slots;
#[cfg(test)]
mod ca_slots_tests;
#[cfg(test)]
mod conformance;
#[cfg(test)]
mod conformance_revocations;
pub mod nodes;
mod postgres;
pub mod revocations;
mod rows;
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use signet_types::ledger::{Hash, LedgerEntry};

pub use ca_slots::{CaChange, CaKeyUsage, CaSlotRow, CaSlotStore, SlotUpdate};
pub use nodes::{EntryRow, EntrySync, NewEntry, NodeRow, NodeStore, TokenUse};
pub use postgres::PgStore;
pub use revocations::{
    CertFilter, EventRow, NewRevocation, RevocationOutcome, RevocationStore, RevokedRow, StoredCrl,
};
pub use sqlite::SqliteStore;

/// A certificate to append to the ledger (seq and hashes are assigned by the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCertificate {
    pub serial: String,
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    pub not_before: i64,
    pub not_after: i64,
    pub cert_sha256: Hash,
    pub ca_key_id: String,
    pub caller: String,
    pub issued_at: i64,
    pub request_id: String,
    pub cert_der: Vec<u8>,
    /// Where the authority came from ([`crate::provenance::Provenance`], canonical JSON).
    pub provenance: String,
}

/// A ledger row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateRow {
    pub entry: LedgerEntry,
    /// When the certificate was revoked (unix seconds), if it was. Not part of the row's hash:
    /// a revocation is a later event in the chain ([`EventRow`]); this column and
    /// `revocation_reason` are the lookup index the same transaction sets.
    pub revoked_at: Option<i64>,
    /// The RFC 5280 reason name of the revocation, when revoked.
    pub revocation_reason: Option<String>,
    pub prev_hash: Hash,
    pub hash: Hash,
    pub cert_der: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerHead {
    /// 0 when the ledger is empty.
    pub seq: u64,
    /// `GENESIS` when the ledger is empty.
    pub hash: Hash,
}

/// A CA key as kept in the database. The private key is encrypted (see `ca::kek`).
#[derive(Clone, PartialEq, Eq)]
pub struct StoredCaKey {
    pub id: String,
    /// At most one key per slot (`root` for the generated root): the insert race's referee.
    pub slot: String,
    pub algorithm: String,
    pub cert_pem: String,
    pub encrypted_key: Vec<u8>,
    pub created_at: i64,
}

impl std::fmt::Debug for StoredCaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCaKey")
            .field("id", &self.id)
            .field("slot", &self.slot)
            .field("algorithm", &self.algorithm)
            .field("encrypted_key", &"…")
            .finish_non_exhaustive()
    }
}

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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or timed out: retryable.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Anything else the database said.
    #[error("database error: {0}")]
    Database(String),
    /// Stored data that does not decode (corruption or tampering).
    #[error("corrupt row: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_) => StoreError::Unavailable(e.to_string()),
            sqlx::Error::Database(ref db) => {
                // PostgreSQL: class 08 (connection), 57P0x (shutdown), 53 (resources),
                // 55P03 (lock_timeout), 57014 (statement_timeout), 25P03 (idle in
                // transaction timeout): all retryable.
                match db.code().as_deref() {
                    Some(c)
                        if c.starts_with("08")
                            || c.starts_with("57P")
                            || c.starts_with("53")
                            || matches!(c, "55P03" | "57014" | "25P03") =>
                    {
                        StoreError::Unavailable(e.to_string())
                    }
                    _ => StoreError::Database(e.to_string()),
                }
            }
            other => StoreError::Database(other.to_string()),
        }
    }
}

#[async_trait]
pub trait Store: NodeStore + RevocationStore + CaSlotStore + Send + Sync + 'static {
    /// Cheap reachability check for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The CA key in `slot`, if any.
    async fn ca_key(&self, slot: &str) -> Result<Option<StoredCaKey>, StoreError>;

    /// Inserts `key` unless its slot is taken; returns whichever key holds the slot afterwards
    /// (ours, or the one a concurrent replica inserted first).
    async fn insert_ca_key_if_absent(&self, key: &StoredCaKey) -> Result<StoredCaKey, StoreError>;

    /// Appends `batch` in order in one transaction, extending the hash chain; returns the rows'
    /// sequence numbers. All or nothing.
    async fn append_certificates(&self, batch: &[NewCertificate]) -> Result<Vec<u64>, StoreError>;

    async fn ledger_head(&self) -> Result<LedgerHead, StoreError>;

    /// Rows with `seq > after_seq`, ascending, at most `limit`; only `spiffe_id` if given.
    async fn list_certificates(
        &self,
        after_seq: u64,
        limit: u32,
        spiffe_id: Option<&str>,
    ) -> Result<Vec<CertificateRow>, StoreError>;

    async fn certificate_by_serial(
        &self,
        serial: &str,
    ) -> Result<Option<CertificateRow>, StoreError>;

    async fn count_certificates(&self) -> Result<u64, StoreError>;

    async fn record_audit_events(&self, events: &[AuditEvent]) -> Result<(), StoreError>;

    /// Events with `id > after_id`, ascending, at most `limit`.
    async fn audit_events(&self, after_id: u64, limit: u32) -> Result<Vec<AuditEvent>, StoreError>;
}

/// Connects to `url` (`sqlite://PATH` or `postgres://…`), applies migrations, and returns the
/// store. `acquire_timeout` bounds how long a request waits for a connection before the store
/// answers Unavailable; the other `[database]` settings keep their defaults.
pub async fn connect(url: &str, acquire_timeout: Duration) -> Result<Arc<dyn Store>, StoreError> {
    let cfg = crate::config::DatabaseConfig {
        acquire_timeout,
        ..crate::config::DatabaseConfig::default()
    };
    connect_with(url, &cfg).await
}

/// [`connect`] with every `[database]` setting (session timeouts, pool size, busy timeout).
pub async fn connect_with(
    url: &str,
    cfg: &crate::config::DatabaseConfig,
) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect_with(url, cfg).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(PgStore::connect_with(url, cfg).await?))
    } else {
        // Never echo the URL: it may carry a password.
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        Err(StoreError::Database(format!(
            "unsupported database URL scheme {scheme:?} (expected sqlite: or postgres:)"
        )))
    }
}
