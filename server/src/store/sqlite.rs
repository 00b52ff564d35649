//! The embedded store: one SQLite file (WAL, `synchronous=FULL`).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::config::DatabaseConfig;

use super::rows::{self, CA_KEY_COLUMNS, CERT_COLUMNS, DbAuditEvent, DbCaKey, DbCertificate};
use super::{
    AuditEvent, CertificateRow, LedgerHead, NewCertificate, Store, StoreError, StoredCaKey,
};

/// Most connections to one SQLite file (one writer at a time anyway).
const MAX_CONNECTIONS: u32 = 8;

pub(super) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// A [`Store`] on a local SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

/// SQLite's "database is busy/locked" (the busy timeout ran out) is retryable: Unavailable.
fn map_err(e: sqlx::Error) -> StoreError {
    // Primary result codes SQLITE_BUSY (5) and SQLITE_LOCKED (6), with any extension.
    if let sqlx::Error::Database(db) = &e
        && let Some(code) = db.code().and_then(|c| c.parse::<i32>().ok())
        && matches!(code & 0xff, 5 | 6)
    {
        return StoreError::Unavailable(e.to_string());
    }
    StoreError::from(e)
}

pub(super) fn map_migrate_err(e: sqlx::migrate::MigrateError) -> StoreError {
    match e {
        sqlx::migrate::MigrateError::Execute(e) => StoreError::from(e),
        sqlx::migrate::MigrateError::ExecuteMigration(e, _) => StoreError::from(e),
        other => StoreError::Database(format!("migrations: {other}")),
    }
}

impl SqliteStore {
    /// Opens the database at `url` with the default `[database]` settings and the given
    /// acquire timeout; see [`SqliteStore::connect_with`].
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
        let mut attempt = 0;
        loop {
            match MIGRATOR.run(&pool).await {
                Ok(()) => break,
                Err(e) if attempt < 10 => {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, "retrying SQLite migrations");
                    tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
                }
                Err(e) => return Err(map_migrate_err(e)),
            }
        }
        Ok(Self { pool })
    }
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

super::nodes::impl_node_store!(SqliteStore, map_err);
super::revocations::impl_revocation_store!(SqliteStore, map_err, "BEGIN IMMEDIATE", "");
super::ca_slots::impl_ca_slot_store!(SqliteStore, map_err);

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn ca_key(&self, slot: &str) -> Result<Option<StoredCaKey>, StoreError> {
        let row: Option<DbCaKey> = sqlx::query_as(&format!(
            "SELECT {CA_KEY_COLUMNS} FROM ca_keys WHERE slot = ?1"
        ))
        .bind(slot)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(row.map(StoredCaKey::from))
    }

    async fn insert_ca_key_if_absent(&self, key: &StoredCaKey) -> Result<StoredCaKey, StoreError> {
        sqlx::query(
            "INSERT INTO ca_keys (id, slot, algorithm, cert_pem, encrypted_key, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (slot) DO NOTHING",
        )
        .bind(&key.id)
        .bind(&key.slot)
        .bind(&key.algorithm)
        .bind(&key.cert_pem)
        .bind(&key.encrypted_key)
        .bind(key.created_at)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        self.ca_key(&key.slot).await?.ok_or_else(|| {
            StoreError::Database(format!("CA key slot {:?} empty after insert", key.slot))
        })
    }

    async fn append_certificates(&self, batch: &[NewCertificate]) -> Result<Vec<u64>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // IMMEDIATE takes the write lock up front, so writers (in this or another process)
        // serialize on it instead of failing to upgrade a read snapshot.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)?;
        let (head_seq, head_hash): (i64, Vec<u8>) =
            sqlx::query_as("SELECT seq, hash FROM ledger_head WHERE id = 1")
                .fetch_one(&mut *tx)
                .await
                .map_err(map_err)?;
        let head = rows::head(head_seq, &head_hash)?;
        let (chained, new_seq, new_hash) = rows::chain(head.seq, head.hash, batch)?;
        for r in &chained {
            sqlx::query(
                "INSERT INTO certificates (seq, serial, spiffe_id, dns_names, ip_addresses, \
                 not_before, not_after, issued_at, cert_sha256, prev_hash, hash, cert_der, \
                 ca_key_id, caller, request_id, provenance) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
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
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        sqlx::query("UPDATE ledger_head SET seq = ?1, hash = ?2 WHERE id = 1")
            .bind(rows::db_seq(new_seq)?)
            .bind(&new_hash[..])
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok((head.seq + 1..=new_seq).collect())
    }

    async fn ledger_head(&self) -> Result<LedgerHead, StoreError> {
        let (seq, hash): (i64, Vec<u8>) =
            sqlx::query_as("SELECT seq, hash FROM ledger_head WHERE id = 1")
                .fetch_one(&self.pool)
                .await
                .map_err(map_err)?;
        rows::head(seq, &hash)
    }

    async fn list_certificates(
        &self,
        after_seq: u64,
        limit: u32,
        spiffe_id: Option<&str>,
    ) -> Result<Vec<CertificateRow>, StoreError> {
        let found: Vec<DbCertificate> =
            match spiffe_id {
                Some(id) => {
                    sqlx::query_as(&format!(
                        "SELECT {CERT_COLUMNS} FROM certificates \
                     WHERE spiffe_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
                    ))
                    .bind(id)
                    .bind(rows::after(after_seq))
                    .bind(rows::limit(limit))
                    .fetch_all(&self.pool)
                    .await
                }
                None => sqlx::query_as(&format!(
                    "SELECT {CERT_COLUMNS} FROM certificates WHERE seq > ?1 ORDER BY seq LIMIT ?2"
                ))
                .bind(rows::after(after_seq))
                .bind(rows::limit(limit))
                .fetch_all(&self.pool)
                .await,
            }
            .map_err(map_err)?;
        found.into_iter().map(CertificateRow::try_from).collect()
    }

    async fn certificate_by_serial(
        &self,
        serial: &str,
    ) -> Result<Option<CertificateRow>, StoreError> {
        let found: Option<DbCertificate> = sqlx::query_as(&format!(
            "SELECT {CERT_COLUMNS} FROM certificates WHERE serial = ?1"
        ))
        .bind(serial)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        found.map(CertificateRow::try_from).transpose()
    }

    async fn count_certificates(&self) -> Result<u64, StoreError> {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM certificates")
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
        u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("negative count {n}")))
    }

    async fn record_audit_events(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)?;
        for e in events {
            sqlx::query(
                "INSERT INTO audit_events (at, kind, caller, detail) VALUES (?1, ?2, ?3, ?4)",
            )
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

    async fn audit_events(&self, after_id: u64, limit: u32) -> Result<Vec<AuditEvent>, StoreError> {
        let found: Vec<DbAuditEvent> = sqlx::query_as(
            "SELECT id, at, kind, caller, detail FROM audit_events \
             WHERE id > ?1 ORDER BY id LIMIT ?2",
        )
        .bind(rows::after(after_id))
        .bind(rows::limit(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        found.into_iter().map(AuditEvent::try_from).collect()
    }
}
