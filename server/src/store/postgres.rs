//! The production store: PostgreSQL, shared by any number of replicas.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::config::DatabaseConfig;

use super::rows::{self, CA_KEY_COLUMNS, CERT_COLUMNS, DbAuditEvent, DbCaKey, DbCertificate};
use super::sqlite::map_migrate_err;
use super::{
    AuditEvent, CertificateRow, LedgerHead, NewCertificate, Store, StoreError, StoredCaKey,
};

/// Bounds the first connection at startup, so an unreachable database answers quickly.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// A [`Store`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Connects to `url` (`postgres://…`) with the default `[database]` settings and the
    /// given acquire timeout; see [`PgStore::connect_with`].
    pub async fn connect(url: &str, acquire_timeout: Duration) -> Result<Self, StoreError> {
        let cfg = DatabaseConfig {
            acquire_timeout,
            ..DatabaseConfig::default()
        };
        Self::connect_with(url, &cfg).await
    }

    /// Connects to `url` (`postgres://…`) and applies migrations (under sqlx's advisory lock,
    /// so replicas starting together migrate once). Every session of the pool starts with
    /// `lock_timeout`, `statement_timeout` and `idle_in_transaction_session_timeout` from
    /// `cfg`, so no session (ours, or one stuck holding the ledger head) can stop issuance
    /// for longer than those bounds.
    pub async fn connect_with(url: &str, cfg: &DatabaseConfig) -> Result<Self, StoreError> {
        let acquire_timeout = cfg.acquire_timeout;
        // The URL may carry a password: never echo it.
        let options = PgConnectOptions::from_str(url)
            .map_err(|_| StoreError::Database("invalid PostgreSQL URL".into()))?
            .application_name("signet-server")
            .options(session_settings(cfg));
        let pool_options = PgPoolOptions::new()
            .max_connections(cfg.max_connections.max(1))
            .acquire_timeout(acquire_timeout);
        let pool = tokio::time::timeout(
            CONNECT_TIMEOUT.max(acquire_timeout),
            pool_options.connect_with(options),
        )
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!(
                "no connection to PostgreSQL within {CONNECT_TIMEOUT:?}"
            ))
        })??;
        MIGRATOR.run(&pool).await.map_err(map_migrate_err)?;
        Ok(Self { pool })
    }
}

/// The settings every session starts with (PostgreSQL's startup `options`), in milliseconds.
fn session_settings(cfg: &DatabaseConfig) -> [(&'static str, String); 3] {
    let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128).to_string();
    [
        ("lock_timeout", ms(cfg.lock_timeout)),
        ("statement_timeout", ms(cfg.statement_timeout)),
        (
            "idle_in_transaction_session_timeout",
            ms(cfg.idle_in_transaction_timeout),
        ),
    ]
}

super::nodes::impl_node_store!(PgStore, StoreError::from);
super::revocations::impl_revocation_store!(PgStore, StoreError::from, "BEGIN", " FOR UPDATE");
super::ca_slots::impl_ca_slot_store!(PgStore, StoreError::from);

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn ca_key(&self, slot: &str) -> Result<Option<StoredCaKey>, StoreError> {
        let row: Option<DbCaKey> = sqlx::query_as(&format!(
            "SELECT {CA_KEY_COLUMNS} FROM ca_keys WHERE slot = $1"
        ))
        .bind(slot)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(StoredCaKey::from))
    }

    async fn insert_ca_key_if_absent(&self, key: &StoredCaKey) -> Result<StoredCaKey, StoreError> {
        // ON CONFLICT waits for a concurrent inserter of the same slot to commit, so the
        // read below (a fresh snapshot under READ COMMITTED) sees the winner.
        sqlx::query(
            "INSERT INTO ca_keys (id, slot, algorithm, cert_pem, encrypted_key, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (slot) DO NOTHING",
        )
        .bind(&key.id)
        .bind(&key.slot)
        .bind(&key.algorithm)
        .bind(&key.cert_pem)
        .bind(&key.encrypted_key)
        .bind(key.created_at)
        .execute(&self.pool)
        .await?;
        self.ca_key(&key.slot).await?.ok_or_else(|| {
            StoreError::Database(format!("CA key slot {:?} empty after insert", key.slot))
        })
    }

    async fn append_certificates(&self, batch: &[NewCertificate]) -> Result<Vec<u64>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        // The one lock per batch: replicas extend a single chain in a total order.
        let (head_seq, head_hash): (i64, Vec<u8>) =
            sqlx::query_as("SELECT seq, hash FROM ledger_head WHERE id = 1 FOR UPDATE")
                .fetch_one(&mut *tx)
                .await?;
        let head = rows::head(head_seq, &head_hash)?;
        let (chained, new_seq, new_hash) = rows::chain(head.seq, head.hash, batch)?;

        let n = chained.len();
        let mut seq = Vec::with_capacity(n);
        let mut serial = Vec::with_capacity(n);
        let mut spiffe_id = Vec::with_capacity(n);
        let mut dns_names = Vec::with_capacity(n);
        let mut ip_addresses = Vec::with_capacity(n);
        let mut not_before = Vec::with_capacity(n);
        let mut not_after = Vec::with_capacity(n);
        let mut issued_at = Vec::with_capacity(n);
        let mut cert_sha256 = Vec::with_capacity(n);
        let mut prev_hash = Vec::with_capacity(n);
        let mut hash = Vec::with_capacity(n);
        let mut cert_der = Vec::with_capacity(n);
        let mut ca_key_id = Vec::with_capacity(n);
        let mut caller = Vec::with_capacity(n);
        let mut request_id = Vec::with_capacity(n);
        let mut provenance = Vec::with_capacity(n);
        for r in chained {
            seq.push(r.seq);
            serial.push(r.cert.serial.as_str());
            spiffe_id.push(r.cert.spiffe_id.as_str());
            dns_names.push(r.dns_json);
            ip_addresses.push(r.ip_json);
            not_before.push(r.cert.not_before);
            not_after.push(r.cert.not_after);
            issued_at.push(r.cert.issued_at);
            cert_sha256.push(r.cert.cert_sha256.as_slice());
            prev_hash.push(r.prev_hash.to_vec());
            hash.push(r.hash.to_vec());
            cert_der.push(r.cert.cert_der.as_slice());
            ca_key_id.push(r.cert.ca_key_id.as_str());
            caller.push(r.cert.caller.as_str());
            request_id.push(r.cert.request_id.as_str());
            provenance.push(r.cert.provenance.as_str());
        }
        // The whole batch in one statement: one round trip however large the batch.
        sqlx::query(
            "INSERT INTO certificates (seq, serial, spiffe_id, dns_names, ip_addresses, \
             not_before, not_after, issued_at, cert_sha256, prev_hash, hash, cert_der, \
             ca_key_id, caller, request_id, provenance) \
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], \
             $6::bigint[], $7::bigint[], $8::bigint[], $9::bytea[], $10::bytea[], $11::bytea[], \
             $12::bytea[], $13::text[], $14::text[], $15::text[], $16::text[])",
        )
        .bind(&seq)
        .bind(&serial)
        .bind(&spiffe_id)
        .bind(&dns_names)
        .bind(&ip_addresses)
        .bind(&not_before)
        .bind(&not_after)
        .bind(&issued_at)
        .bind(&cert_sha256)
        .bind(&prev_hash)
        .bind(&hash)
        .bind(&cert_der)
        .bind(&ca_key_id)
        .bind(&caller)
        .bind(&request_id)
        .bind(&provenance)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE ledger_head SET seq = $1, hash = $2 WHERE id = 1")
            .bind(rows::db_seq(new_seq)?)
            .bind(&new_hash[..])
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok((head.seq + 1..=new_seq).collect())
    }

    async fn ledger_head(&self) -> Result<LedgerHead, StoreError> {
        let (seq, hash): (i64, Vec<u8>) =
            sqlx::query_as("SELECT seq, hash FROM ledger_head WHERE id = 1")
                .fetch_one(&self.pool)
                .await?;
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
                     WHERE spiffe_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
                    ))
                    .bind(id)
                    .bind(rows::after(after_seq))
                    .bind(rows::limit(limit))
                    .fetch_all(&self.pool)
                    .await?
                }
                None => sqlx::query_as(&format!(
                    "SELECT {CERT_COLUMNS} FROM certificates WHERE seq > $1 ORDER BY seq LIMIT $2"
                ))
                .bind(rows::after(after_seq))
                .bind(rows::limit(limit))
                .fetch_all(&self.pool)
                .await?,
            };
        found.into_iter().map(CertificateRow::try_from).collect()
    }

    async fn certificate_by_serial(
        &self,
        serial: &str,
    ) -> Result<Option<CertificateRow>, StoreError> {
        let found: Option<DbCertificate> = sqlx::query_as(&format!(
            "SELECT {CERT_COLUMNS} FROM certificates WHERE serial = $1"
        ))
        .bind(serial)
        .fetch_optional(&self.pool)
        .await?;
        found.map(CertificateRow::try_from).transpose()
    }

    async fn count_certificates(&self) -> Result<u64, StoreError> {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM certificates")
            .fetch_one(&self.pool)
            .await?;
        u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("negative count {n}")))
    }

    async fn record_audit_events(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let at: Vec<i64> = events.iter().map(|e| e.at).collect();
        let kind: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        let caller: Vec<&str> = events.iter().map(|e| e.caller.as_str()).collect();
        let detail: Vec<&str> = events.iter().map(|e| e.detail.as_str()).collect();
        // WITH ORDINALITY keeps the ids in the events' order.
        sqlx::query(
            "INSERT INTO audit_events (at, kind, caller, detail) \
             SELECT at, kind, caller, detail \
             FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[]) \
             WITH ORDINALITY AS e(at, kind, caller, detail, n) ORDER BY n",
        )
        .bind(&at)
        .bind(&kind)
        .bind(&caller)
        .bind(&detail)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn audit_events(&self, after_id: u64, limit: u32) -> Result<Vec<AuditEvent>, StoreError> {
        let found: Vec<DbAuditEvent> = sqlx::query_as(
            "SELECT id, at, kind, caller, detail FROM audit_events \
             WHERE id > $1 ORDER BY id LIMIT $2",
        )
        .bind(rows::after(after_id))
        .bind(rows::limit(limit))
        .fetch_all(&self.pool)
        .await?;
        found.into_iter().map(AuditEvent::try_from).collect()
    }
}
