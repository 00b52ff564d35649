//! What every server sharing one database must agree on: the [`PinStore`] part of the store
//! (which values, and why, is `server::pins`; this module only keeps them).
//!
//! A pin is one `deployment_pins` row (name, value, when, how it was decided), written once and
//! never updated. [`PinStore::pin_deployment`] inserts a whole proposal in one transaction,
//! each row `ON CONFLICT (name) DO NOTHING`, in name order: a server racing another to pin an
//! empty database waits for the other's transaction (PostgreSQL: on the first name's unique
//! index entry; SQLite: on the write lock), then inserts nothing and reads the winner's values,
//! the rule CA key creation follows. A later version that pins one more value inserts only that
//! row; the rows already pinned stay as the first writer left them.
//!
//! [`PinStore::pin_evidence`] reads what an older database (migrated before pins existed)
//! already holds, so the first pin of such a database is derived from its rows rather than from
//! whichever configuration starts first: the root certificates, the CA key IDs, and the first
//! and last certificates of the ledger. A handful of rows, read by index at start-up.
//!
//! The SQL is the same on both databases, so it is written once ([`impl_pin_store`]).

use async_trait::async_trait;

use super::error::StoreError;

super::db_row! {
    /// One pinned value (a `deployment_pins` row).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Pin {
        /// What is pinned (`trust_domain`, `ca_mode`).
        pub name: String,
        pub value: String,
        /// When it was pinned, unix seconds.
        pub pinned_at: i64,
        /// [`PIN_FROM_CONFIGURATION`] or [`PIN_DERIVED`].
        pub source: String,
    }
}

/// [`Pin::source`] of a value the first server to start on an empty database configured.
pub const PIN_FROM_CONFIGURATION: &str = "configuration";
/// [`Pin::source`] of a value derived from the rows of a database created before pins.
pub const PIN_DERIVED: &str = "derived";

/// A ledger certificate as [`PinEvidence`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerMark {
    pub seq: i64,
    pub spiffe_id: String,
    pub ca_key_id: String,
}

/// What a database holds that says which deployment it belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinEvidence {
    /// `(key id, certificate PEM)` of every root in `ca_keys`, oldest first.
    pub roots: Vec<(String, String)>,
    /// The ID of every `ca_keys` row (roots and intermediates, any state).
    pub ca_key_ids: Vec<String>,
    /// The ledger's first certificate (lowest seq), if any.
    pub first_certificate: Option<LedgerMark>,
    /// The ledger's last certificate (highest seq), if any.
    pub last_certificate: Option<LedgerMark>,
}

impl PinEvidence {
    /// Whether the database holds neither CA keys nor certificates: a new deployment's.
    pub fn is_empty(&self) -> bool {
        self.ca_key_ids.is_empty() && self.first_certificate.is_none()
    }
}

/// What [`PinStore::pin_deployment`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinOutcome {
    /// The names this call pinned (empty: every one was pinned already, by us or another).
    pub inserted: Vec<String>,
    /// Every pinned value after the call, by name.
    pub pins: Vec<Pin>,
}

#[async_trait]
pub trait PinStore: Send + Sync + 'static {
    /// Every pinned value, by name.
    async fn deployment_pins(&self) -> Result<Vec<Pin>, StoreError>;

    /// What the database holds that says which deployment it belongs to (see the module doc).
    async fn pin_evidence(&self) -> Result<PinEvidence, StoreError>;

    /// Pins each of `pins` whose name is not pinned yet, all in one transaction (first writer
    /// wins, per name); returns what it pinned and every pinned value after it.
    async fn pin_deployment(&self, pins: &[Pin]) -> Result<PinOutcome, StoreError>;
}

/// The columns of a [`Pin`], in its fields' order.
pub(super) const PIN_COLUMNS: &str = "name, value, pinned_at, source";

super::db_row! {
    /// A certificate's place in the ledger, for [`PinEvidence`].
    pub(super) struct DbLedgerMark {
        seq: i64,
        spiffe_id: String,
        ca_key_id: String,
    }
}

impl From<DbLedgerMark> for LedgerMark {
    fn from(r: DbLedgerMark) -> Self {
        Self {
            seq: r.seq,
            spiffe_id: r.spiffe_id,
            ca_key_id: r.ca_key_id,
        }
    }
}

/// Implements [`PinStore`] for a backend with a `pool` field and an
/// `async fn begin_write(&self) -> Result<WriteTx, StoreError>` (see `store::write_tx`).
macro_rules! impl_pin_store {
    ($store:ty, $map:path) => {
        #[async_trait::async_trait]
        impl $crate::store::pins::PinStore for $store {
            async fn deployment_pins(&self) -> Result<Vec<$crate::store::pins::Pin>, StoreError> {
                use $crate::store::pins::{PIN_COLUMNS, Pin};
                sqlx::query_as::<_, Pin>(&format!(
                    "SELECT {PIN_COLUMNS} FROM deployment_pins ORDER BY name"
                ))
                .fetch_all(&self.pool)
                .await
                .map_err($map)
            }

            async fn pin_evidence(&self) -> Result<$crate::store::pins::PinEvidence, StoreError> {
                use $crate::store::pins::{DbLedgerMark, PinEvidence};
                let roots: Vec<(String, String)> = sqlx::query_as(
                    "SELECT id, cert_pem FROM ca_keys WHERE kind = 'root' \
                     ORDER BY created_at, id",
                )
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                let ca_key_ids: Vec<(String,)> =
                    sqlx::query_as("SELECT id FROM ca_keys ORDER BY created_at, id")
                        .fetch_all(&self.pool)
                        .await
                        .map_err($map)?;
                let first: Option<DbLedgerMark> = sqlx::query_as(
                    "SELECT seq, spiffe_id, ca_key_id FROM certificates ORDER BY seq ASC LIMIT 1",
                )
                .fetch_optional(&self.pool)
                .await
                .map_err($map)?;
                let last: Option<DbLedgerMark> = sqlx::query_as(
                    "SELECT seq, spiffe_id, ca_key_id FROM certificates ORDER BY seq DESC \
                     LIMIT 1",
                )
                .fetch_optional(&self.pool)
                .await
                .map_err($map)?;
                Ok(PinEvidence {
                    roots,
                    ca_key_ids: ca_key_ids.into_iter().map(|(id,)| id).collect(),
                    first_certificate: first.map(Into::into),
                    last_certificate: last.map(Into::into),
                })
            }

            async fn pin_deployment(
                &self,
                pins: &[$crate::store::pins::Pin],
            ) -> Result<$crate::store::pins::PinOutcome, StoreError> {
                use $crate::store::pins::{PIN_COLUMNS, Pin, PinOutcome};
                let mut sorted: Vec<&Pin> = pins.iter().collect();
                sorted.sort_by(|a, b| a.name.cmp(&b.name));
                let mut inserted = Vec::new();
                let mut tx = self.begin_write().await?;
                for p in sorted {
                    let done = sqlx::query(
                        "INSERT INTO deployment_pins (name, value, pinned_at, source) \
                         VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING",
                    )
                    .bind(&p.name)
                    .bind(&p.value)
                    .bind(p.pinned_at)
                    .bind(&p.source)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                    if done.rows_affected() == 1 {
                        inserted.push(p.name.clone());
                    }
                }
                tx.commit().await.map_err($map)?;
                // A fresh snapshot (READ COMMITTED): the winner's rows, committed before our
                // inserts found them.
                let pins = sqlx::query_as::<_, Pin>(&format!(
                    "SELECT {PIN_COLUMNS} FROM deployment_pins ORDER BY name"
                ))
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                Ok(PinOutcome { inserted, pins })
            }
        }
    };
}

pub(crate) use impl_pin_store;
