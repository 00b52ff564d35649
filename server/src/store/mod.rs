//! Storage: what the server keeps in its database, over sqlx, on PostgreSQL (production, shared
//! by any number of replicas) and SQLite (the embedded default). Migrations live in
//! `migrations/{postgres,sqlite}` and are applied by [`connect_with`].
//!
//! One trait per concern, each in its own module with its row types and its SQL:
//!
//! | module | trait | what |
//! |---|---|---|
//! | `ledger` | [`LedgerStore`] | the hash-chained ledger of issued certificates and JWT-SVIDs (group-commit batches) |
//! | `revocations` | [`RevocationStore`] | revocation events in the same chain, revocable selections |
//! | `crls` | [`CrlStore`] | the last CRL per CA key, numbered under a lock |
//! | `ca_slots` | [`CaSlotStore`] | CA keys and their slot transitions (one per generation) |
//! | `audit` | [`AuditStore`] | denials and admin actions |
//! | `pins` | [`PinStore`] | what every server sharing the database must agree on (trust domain, CA mode) |
//! | `nodes` | [`NodeStore`] | join tokens, attested nodes, registration entries |
//! | `node_admin` | [`NodeAdminStore`](node_admin::NodeAdminStore) (under [`NodeStore`]) | join tokens listed and revoked, nodes unbanned and deleted, entries updated |
//! | `node_sets` | [`NodeSetStore`](node_sets::NodeSetStore) (under [`NodeStore`]) | node sets, an entry's parent for many nodes |
//! | `registration` | [`RegistrationStore`] | entries a registrar (the Kubernetes bridge) owns, synced per scope |
//! | `entry_events` | (part of [`NodeStore`]) | entry-change notifications to every replica (LISTEN/NOTIFY) |
//! | `paging` | (over [`LedgerStore`]) | keyset pages of the ledger and their opaque tokens |
//!
//! [`Store`] is all of them, for the wiring; a component takes the narrowest trait it uses.
//!
//! Invariant: a query whose text is the same on both databases is written once, in its
//! concern's module, as a macro that implements the trait for each backend (sqlx's SQLite
//! driver accepts `$N` placeholders, and both speak `RETURNING` and `ON CONFLICT`). A backend
//! (`sqlite`, `postgres`) keeps only connecting, classifying its errors, the batch inserts, and
//! how a writing transaction takes its lock; its module doc says why each differs.
//! `rows` holds the row shapes and integer conversions the concerns share; `error` the one
//! error type. Nothing in the store imports this module: it only assembles and re-exports
//! (and defines [`db_row!`], the row decoding both drivers share).

/// Whether `$query` (a `SELECT <one text column> … WHERE … = $1`) finds a row for `$key`
/// inside the write transaction `$tx`: the existence checks entry writers make under the
/// revision counter's lock (a node set, a federation relationship). `$map` maps the driver's
/// error, as in the `impl_*_store!` macros.
macro_rules! exists_in_tx {
    ($tx:expr, $query:expr, $key:expr, $map:expr) => {{
        let found: Option<(String,)> = sqlx::query_as($query)
            .bind($key)
            .fetch_optional(&mut *$tx)
            .await
            .map_err($map)?;
        found.is_some()
    }};
}

/// A row struct and its [`sqlx::FromRow`] for any driver whose columns decode to the field
/// types, each field read from the column of its name: what `#[derive(sqlx::FromRow)]` writes,
/// without sqlx's `macros` feature (server/build.rs says why it stays off).
macro_rules! db_row {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$fmeta])* $fvis $field: $ty,)*
        }

        impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for $name
        where
            &'static str: sqlx::ColumnIndex<R>,
            $($ty: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,)*
        {
            fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
                Ok(Self {
                    $($field: row.try_get(stringify!($field))?,)*
                })
            }
        }
    };
}
use db_row;

pub mod audit;
pub mod ca_slots;
mod config;
#[cfg(test)]
mod conformance;
pub mod crls;
pub mod entry_events;
mod error;
pub mod federation;
pub mod ledger;
mod migrations;
pub mod node_admin;
pub mod node_sets;
pub mod nodes;
pub mod paging;
pub mod pins;
mod postgres;
pub mod registration;
pub mod revocations;
mod rows;
mod sqlite;
mod write_tx;

use std::sync::Arc;

pub use audit::{AuditEvent, AuditStore};
#[cfg(test)]
pub use ca_slots::StoredCaKey;
pub use ca_slots::{CaChange, CaSlotRow, CaSlotStore, SlotUpdate};
pub use config::DatabaseConfig;
pub use crls::{CrlStore, RevokedRow, StoredCrl};
pub use entry_events::EntrySubscription;
pub use error::StoreError;
pub use federation::{
    BundleReplace, BundleWrite, FederationStore, Relationship, RelationshipDelete, RelationshipRow,
};
pub use ledger::{LedgerHead, LedgerRecord, LedgerStore, NewCertificate, NewJwtSvid, NewLedgerRow};
pub use node_admin::{EntryUpdate, JoinTokenRow, NodeDelete, TokenRevoke};
#[cfg(test)]
pub use node_sets::NodeSetStore;
pub use node_sets::{NodeSetDelete, NodeSetRow};
pub use nodes::{BatchCreate, EntryCreate, EntryRow, NewEntry, NodeRow, NodeStore, TokenUse};
pub use paging::{CertQuery, Order, certificates_page, jwt_svids_page};
pub use pins::{Pin, PinEvidence, PinStore};
pub use postgres::PgStore;
pub use registration::{RegistrationStore, SyncResult};
pub use revocations::{CertFilter, EventRow, NewRevocation, RevocationOutcome, RevocationStore};
pub use sqlite::SqliteStore;

/// Everything the server stores, for the wiring that needs all of it. Components take the
/// narrowest part they use (an `Arc<dyn Store>` coerces to any of them), so a test double
/// implements only that part.
pub trait Store:
    LedgerStore
    + AuditStore
    + CaSlotStore
    + CrlStore
    + NodeStore
    + RevocationStore
    + PinStore
    + FederationStore
    + RegistrationStore
{
}

impl<T> Store for T where
    T: LedgerStore
        + AuditStore
        + CaSlotStore
        + CrlStore
        + NodeStore
        + RevocationStore
        + PinStore
        + FederationStore
        + RegistrationStore
        + ?Sized
{
}

/// Connects to `url` (`sqlite://PATH` or `postgres://…`), applies migrations, and returns the
/// store. `acquire_timeout` bounds how long a request waits for a connection before the store
/// answers Unavailable; the other `[database]` settings keep their defaults.
#[cfg(test)]
pub async fn connect(
    url: &str,
    acquire_timeout: std::time::Duration,
) -> Result<Arc<dyn Store>, StoreError> {
    let cfg = DatabaseConfig {
        acquire_timeout,
        ..DatabaseConfig::default()
    };
    connect_with(url, &cfg).await
}

/// The store the ledger writer appends through, made on the writer's own thread (see
/// `crate::ledger`): on PostgreSQL a connection of its own, so that the writer's runtime is
/// the one that hears the database's answers; on SQLite, whose connections answer through
/// their own threads whatever runtime waits, the server's `shared` store.
pub async fn connect_ledger_writer(
    url: &str,
    cfg: &DatabaseConfig,
    shared: Arc<dyn Store>,
) -> Result<Arc<dyn LedgerStore>, StoreError> {
    if is_postgres(url) {
        Ok(Arc::new(PgStore::connect_ledger_writer(url, cfg).await?))
    } else {
        Ok(shared)
    }
}

/// Whether `url` names a PostgreSQL database (either scheme libpq accepts).
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres:") || url.starts_with("postgresql:")
}

/// Connects to `url` with every `[database]` setting (session timeouts, pool size, busy timeout).
pub async fn connect_with(url: &str, cfg: &DatabaseConfig) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect_with(url, cfg).await?))
    } else if is_postgres(url) {
        Ok(Arc::new(PgStore::connect_with(url, cfg).await?))
    } else {
        // Never echo the URL: it may carry a password.
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        Err(StoreError::Database(format!(
            "unsupported database URL scheme {scheme:?} (expected sqlite: or postgres:)"
        )))
    }
}
