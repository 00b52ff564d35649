//! The embedded store: one SQLite file (WAL, `synchronous=FULL`), owner-only (0600).
//!
//! Only what differs from PostgreSQL lives here; every query is shared (see `store`):
//! - connecting: creating the file and its directory with private modes, WAL, retries while
//!   processes open or migrate a new file together (SQLite does not wait for those locks);
//! - error classification: `SQLITE_BUSY`/`SQLITE_LOCKED` (the busy timeout ran out) is
//!   retryable;
//! - locking: a writing transaction is `BEGIN IMMEDIATE` (the database's one write lock), so
//!   `SELECT`s need no `FOR UPDATE`; this process's writers take turns for it in arrival order
//!   first (`store::write_tx`);
//! - entry notifications: in-process only (`store::entry_events`);
//! - batch inserts: one statement per row, as SQLite has no array parameters.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::DatabaseConfig;

use super::audit::AuditEvent;
use super::error::StoreError;
use super::rows::{Chained, ChainedJwt};
use super::write_tx::{WriteGate, WriteTx};

/// Most connections to one SQLite file (one writer at a time anyway).
const MAX_CONNECTIONS: u32 = 8;

/// A [`super::Store`] on a local SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    events: super::entry_events::EntryEvents,
    /// This process's writers, in line for the write lock.
    writers: WriteGate,
}

/// Classifies a SQLite error: "database is busy/locked" (the busy timeout ran out) is
/// retryable, Unavailable; the rest as every driver's (see [`StoreError`]).
fn map_err(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &e
        && db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(busy_or_locked)
    {
        return StoreError::Unavailable(e.to_string());
    }
    StoreError::from_driver(e)
}

/// Whether a SQLite result code is `SQLITE_BUSY` (5) or `SQLITE_LOCKED` (6), with any
/// extended code (`SQLITE_BUSY_SNAPSHOT` is 5 | 2 << 8): another writer holds the lock.
fn busy_or_locked(code: i32) -> bool {
    matches!(code & 0xff, 5 | 6)
}

impl SqliteStore {
    /// Opens the database at `url` with the default `[database]` settings and the given
    /// acquire timeout; see [`SqliteStore::connect_with`].
    #[cfg(test)]
    pub async fn connect(url: &str, acquire_timeout: Duration) -> Result<Self, StoreError> {
        let cfg = DatabaseConfig {
            acquire_timeout,
            ..DatabaseConfig::default()
        };
        Self::connect_with(url, &cfg).await
    }

    /// Opens (creating it and its directory if missing) the database at `url`
    /// (`sqlite://PATH`, `sqlite:PATH` or `sqlite::memory:`) and applies migrations. A writer
    /// waits at most `cfg.sqlite_busy_timeout` for another's lock. The database file and its
    /// `-wal`/`-shm` companions are readable by their owner only (0600): they hold every
    /// certificate issued and, by default, the encrypted CA key.
    pub async fn connect_with(url: &str, cfg: &DatabaseConfig) -> Result<Self, StoreError> {
        let acquire_timeout = cfg.acquire_timeout;
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Database(format!("invalid SQLite URL: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // Commit-before-return: a committed batch must survive power loss.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(cfg.sqlite_busy_timeout)
            .foreign_keys(true);
        // An in-memory database is shared-cache, where writers do not wait for each other's
        // locks: one connection serializes them.
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        if !in_memory {
            let file = options.get_filename();
            if let Some(dir) = file.parent()
                && !dir.as_os_str().is_empty()
                && !dir.exists()
            {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StoreError::Unavailable(format!("creating {}: {e}", dir.display()))
                })?;
            }
            private_files(file)?;
        }
        // Opening a new file switches it to WAL, which needs an exclusive lock that SQLite
        // does not wait for: processes opening a new file together retry.
        let mut attempt = 0;
        let pool = loop {
            match SqlitePoolOptions::new()
                .max_connections(if in_memory { 1 } else { MAX_CONNECTIONS })
                .acquire_timeout(acquire_timeout)
                .connect_with(options.clone())
                .await
                .map_err(map_err)
            {
                Ok(pool) => break pool,
                Err(StoreError::Unavailable(e)) if attempt < 10 => {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, "retrying SQLite open");
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                Err(e) => return Err(e),
            }
        };
        // sqlx takes no lock around SQLite migrations: a process racing us to migrate a new
        // file makes our run fail ("table exists", or "database is locked" when two runs'
        // transactions deadlock on the upgrade to a write lock); a later run finds the work
        // done. Several migrations mean several windows, hence several attempts.
        let migrator = super::migrations::sqlite()
            .await
            .map_err(|e| StoreError::from_migration(e, map_err))?;
        let mut attempt = 0;
        loop {
            match migrator.run(&pool).await {
                Ok(()) => break,
                Err(e) if attempt < 10 => {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, "retrying SQLite migrations");
                    tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
                }
                Err(e) => return Err(StoreError::from_migration(e, map_err)),
            }
        }
        Ok(Self {
            pool,
            events: super::entry_events::EntryEvents::local(),
            writers: WriteGate::new(cfg.sqlite_busy_timeout),
        })
    }

    /// Opens a writing transaction: this writer's turn in the process's line first, then
    /// `BEGIN IMMEDIATE`, which takes the database's write lock up front (waiting at most the
    /// busy timeout for another process's), so writers serialize on it instead of failing to
    /// upgrade a read snapshot.
    async fn begin_write(&self) -> Result<WriteTx<'static, sqlx::Sqlite>, StoreError> {
        let turn = self.writers.turn().await?;
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)?;
        Ok(WriteTx::new(tx, Some(turn)))
    }

    /// One process holds the file: the in-process notification after the commit is the
    /// whole story (see `store::entry_events`).
    async fn notify_entries_in_tx(
        _tx: &mut sqlx::SqliteConnection,
        _parent: &str,
    ) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The ledger's fast path is PostgreSQL's (a round trip saved per batch); SQLite runs in
/// this process, so every append takes the locking path.
impl SqliteStore {
    #[allow(clippy::unused_async)]
    async fn append_at_known_head(
        &self,
        _batch: &[super::ledger::NewLedgerRow],
    ) -> Result<Option<Vec<u64>>, StoreError> {
        Ok(None)
    }

    fn remember_head(&self, _head: Option<super::ledger::LedgerHead>) {}
}

/// Creates the database file with mode 0600 if it is missing (SQLite gives its `-wal` and
/// `-shm` files the database file's mode), and tightens an existing file and its companions
/// to 0600.
fn private_files(db: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |what: &str, p: &Path, e: std::io::Error| {
        StoreError::Unavailable(format!("{what} {}: {e}", p.display()))
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(db)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail("creating", db, e)),
    }
    let mut paths = vec![db.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        paths.push(p.into());
    }
    for p in paths {
        match std::fs::metadata(&p) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| fail("chmod 0600", &p, e))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail("reading", &p, e)),
        }
    }
    Ok(())
}

/// Appended to a `SELECT` that must lock what it reads: nothing, since a writing transaction
/// (`SqliteStore::begin_write`) already holds the whole database's write lock (SQLite has no
/// row locks).
const LOCK_READ: &str = "";

super::ledger::impl_ledger_store!(SqliteStore, map_err, LOCK_READ);
super::audit::impl_audit_store!(SqliteStore, map_err);
super::revocations::impl_revocation_store!(SqliteStore, map_err, LOCK_READ);
super::crls::impl_crl_store!(SqliteStore, map_err, LOCK_READ);
super::ca_slots::impl_ca_slot_store!(SqliteStore, map_err);
super::nodes::impl_node_store!(SqliteStore, map_err);
super::node_admin::impl_node_admin_store!(SqliteStore, map_err);
super::node_sets::impl_node_set_store!(SqliteStore, map_err, LOCK_READ);
super::pins::impl_pin_store!(SqliteStore, map_err);
super::federation::impl_federation_store!(SqliteStore, map_err);
super::registration::impl_registration_store!(SqliteStore, map_err);

/// The batch inserts: one statement per row (SQLite has no array parameters; inside one
/// transaction the rows cost no extra fsync).
impl SqliteStore {
    async fn insert_chained(
        tx: &mut sqlx::SqliteConnection,
        chained: Vec<Chained<'_>>,
    ) -> Result<(), StoreError> {
        for r in &chained {
            sqlx::query(
                "INSERT INTO certificates (seq, serial, spiffe_id, dns_names, ip_addresses, \
                 not_before, not_after, issued_at, cert_sha256, prev_hash, hash, cert_der, \
                 ca_key_id, caller, request_id, provenance, renewed_from) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                 $17)",
            )
            .bind(r.seq)
            .bind(&r.cert.serial)
            .bind(&r.cert.spiffe_id)
            .bind(&r.dns_json)
            .bind(&r.ip_json)
            .bind(r.cert.not_before)
            .bind(r.cert.not_after)
            .bind(r.cert.issued_at)
            .bind(&r.cert.cert_sha256[..])
            .bind(&r.prev_hash[..])
            .bind(&r.hash[..])
            .bind(&r.cert.cert_der)
            .bind(&r.cert.ca_key_id)
            .bind(&r.cert.caller)
            .bind(&r.cert.request_id)
            .bind(&r.cert.provenance)
            .bind(&r.renewed_from)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        Ok(())
    }

    async fn insert_chained_jwts(
        tx: &mut sqlx::SqliteConnection,
        chained: Vec<ChainedJwt<'_>>,
    ) -> Result<(), StoreError> {
        for r in &chained {
            sqlx::query(
                "INSERT INTO jwt_svids (seq, spiffe_id, audience, issued_at, expires_at, key_id, \
                 token_sha256, caller, request_id, provenance, prev_hash, hash) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(r.seq)
            .bind(&r.jwt.spiffe_id)
            .bind(&r.audience_json)
            .bind(r.jwt.issued_at)
            .bind(r.jwt.expires_at)
            .bind(&r.jwt.key_id)
            .bind(&r.jwt.token_sha256[..])
            .bind(&r.jwt.caller)
            .bind(&r.jwt.request_id)
            .bind(&r.jwt.provenance)
            .bind(&r.prev_hash[..])
            .bind(&r.hash[..])
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        Ok(())
    }

    async fn insert_audit_events(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        for e in events {
            sqlx::query(super::audit::INSERT_ONE)
                .bind(e.at)
                .bind(&e.kind)
                .bind(&e.caller)
                .bind(&e.detail)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_busy_and_locked_codes_are_retryable() {
        // SQLITE_BUSY, SQLITE_LOCKED, and their extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT,
        // BUSY_TIMEOUT, LOCKED_SHAREDCACHE, LOCKED_VTAB).
        for code in [5, 6, 261, 517, 773, 262, 518] {
            assert!(super::busy_or_locked(code), "{code}");
        }
        // SQLITE_ERROR, SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CONSTRAINT,
        // SQLITE_CONSTRAINT_UNIQUE, SQLITE_CONSTRAINT_PRIMARYKEY.
        for code in [1, 8, 11, 13, 19, 2067, 1555] {
            assert!(!super::busy_or_locked(code), "{code}");
        }
    }

    /// A writer behind a long one waits for its turn and commits; one whose wait runs out
    /// answers Unavailable (retryable) and leaves nothing behind.
    #[tokio::test]
    async fn a_writer_waits_its_turn_and_one_past_the_wait_changes_nothing() {
        use crate::store::nodes::{BatchCreate, NewEntry, NodeStore};
        use crate::store::{DatabaseConfig, StoreError};
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("signet.db").display());
        let cfg = DatabaseConfig {
            sqlite_busy_timeout: Duration::from_millis(400),
            ..DatabaseConfig::default()
        };
        let store = super::SqliteStore::connect_with(&url, &cfg).await.unwrap();
        let batch = |from: usize| -> Vec<NewEntry> {
            (from..from + 100)
                .map(|i| NewEntry {
                    id: format!("e{i}"),
                    spiffe_id: format!("spiffe://example.org/app/{i}"),
                    parent_id: "spiffe://example.org/node/n1".into(),
                    selectors: vec![format!("unix:uid:{i}")],
                    ttl_seconds: 600,
                    dns_names: vec![],
                    created_at: 42,
                    jwt_ttl_seconds: 0,
                    federates_with: Vec::new(),
                })
                .collect()
        };

        let long_writer = store.begin_write().await.unwrap();
        let behind = tokio::spawn({
            let store = store.clone();
            let batch = batch(0);
            async move { store.create_entries(&batch).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !behind.is_finished(),
            "the second writer must wait for the first"
        );
        long_writer.commit().await.unwrap();
        let created = behind.await.unwrap().unwrap();
        assert!(
            matches!(created, BatchCreate::Created { ref entries, .. } if entries.len() == 100)
        );

        let long_writer = store.begin_write().await.unwrap();
        let err = store.create_entries(&batch(100)).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m.contains("sqlite_busy_timeout")),
            "{err:?}"
        );
        long_writer.rollback().await.unwrap();
        assert_eq!(store.list_entries(None).await.unwrap().len(), 100);
        // The line moved on: the refused batch goes through when sent again.
        assert!(matches!(
            store.create_entries(&batch(100)).await.unwrap(),
            BatchCreate::Created { .. }
        ));

        // A single-statement write (a join token) stands in the same line: refused by the
        // line's wait, not by SQLite's busy handler, and absent afterwards.
        let long_writer = store.begin_write().await.unwrap();
        let err = store
            .create_join_token("h1", "n1", 1, i64::MAX)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m.contains("sqlite_busy_timeout")),
            "{err:?}"
        );
        long_writer.rollback().await.unwrap();
        assert!(matches!(
            store.consume_join_token("h1", 2).await.unwrap(),
            crate::store::nodes::TokenUse::Unknown
        ));
    }

    #[tokio::test]
    async fn a_missing_table_is_a_database_error_not_retryable() {
        use crate::store::{LedgerStore, StoreError};
        let store =
            super::SqliteStore::connect("sqlite::memory:", std::time::Duration::from_secs(5))
                .await
                .unwrap();
        let err = sqlx::query("INSERT INTO no_such_table VALUES (1)")
            .execute(&store.pool)
            .await
            .map_err(super::map_err)
            .unwrap_err();
        assert!(matches!(err, StoreError::Database(_)), "{err:?}");
        store.ping().await.unwrap();
    }
}
