//! The production store: PostgreSQL, shared by any number of replicas.
//!
//! Only what differs from SQLite lives here; every query is shared (see `store`):
//! - connecting: a bounded first connection made directly, so that a failure says its real
//!   cause (refused, no such host, TLS, authentication) and where (host, port, database, user;
//!   never the password) instead of the pool's "pool timed out"; sqlx's advisory-locked
//!   migrations (replicas starting together migrate once); per-session `lock_timeout`,
//!   `statement_timeout` and `idle_in_transaction_session_timeout`;
//! - broken connections (a database restart ends every session): replaced before use, so the
//!   first call after a restart does not fail ([`Ping`]);
//! - error classification: connection, shutdown, resource and timeout SQLSTATEs are retryable;
//! - locking: row locks (`SELECT … FOR UPDATE`) on the ledger head and CRL rows, since
//!   replicas write concurrently;
//! - entry notifications: `pg_notify` in the writing transaction, and a `LISTEN` session per
//!   replica (`store::entry_events`), so every replica's node streams learn of a change;
//! - batch inserts: one `UNNEST` statement per batch (one round trip), where SQLite inserts row
//!   by row.

use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::DatabaseConfig;

use super::audit::AuditEvent;
use super::error::StoreError;
use super::ledger::{LedgerHead, NewLedgerRow};
use super::rows::{self, Chained, ChainedJwt};
use super::write_tx::WriteTx;

/// Bounds the first connection at startup, so an unreachable database answers quickly.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`super::Store`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    events: super::entry_events::EntryEvents,
    /// The ledger head this replica's last append left, for [`PgStore::append_at_known_head`]:
    /// a hint, never trusted (the append checks it in the database).
    head: Arc<Mutex<Option<LedgerHead>>>,
}

impl PgStore {
    /// Connects to `url` (`postgres://…`) with the default `[database]` settings and the
    /// given acquire timeout; see [`PgStore::connect_with`].
    #[cfg(test)]
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
        let pool = pool(
            url,
            cfg,
            cfg.max_connections.max(1),
            "signet-server",
            Ping::Always,
        )
        .await?;
        super::migrations::postgres()
            .await
            .map_err(|e| StoreError::from_migration(e, map_err))?
            .run(&pool)
            .await
            .map_err(|e| StoreError::from_migration(e, map_err))?;
        let events = super::entry_events::EntryEvents::postgres(pool.clone());
        Ok(Self {
            pool,
            events,
            head: Arc::default(),
        })
    }

    /// The ledger writer's own store (see `crate::ledger`): connections with the same session
    /// settings, made on the writer's thread so that its runtime is the one that hears the
    /// database's answers. No migrations (the server's main store ran them) and no entry
    /// listener (the writer appends certificates only). Round trips are what an append
    /// costs, so: a connection is pinged before use only when it has been idle for
    /// [`IDLE_PING_AFTER`] ([`Ping::WhenIdle`]: never under load, and always after a database
    /// restart, which takes longer than that, so the first batch after it does not fail on a
    /// dead session); and there are two, because sqlx pings each connection when it comes
    /// back to the pool, so with one the next batch would wait for that ping.
    pub async fn connect_ledger_writer(
        url: &str,
        cfg: &DatabaseConfig,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            pool: pool(url, cfg, 2, "signet-server-ledger", Ping::WhenIdle).await?,
            events: super::entry_events::EntryEvents::local(),
            head: Arc::default(),
        })
    }

    /// Tells every replica's listener that `parent`'s entries changed, when (and only if) `tx`
    /// commits (see `store::entry_events`).
    async fn notify_entries_in_tx(
        tx: &mut sqlx::PgConnection,
        parent: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(super::entry_events::PG_CHANNEL)
            .bind(parent)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        Ok(())
    }
}

/// When a pooled connection is checked with a round trip before it is lent. A database
/// restart ends every session; a pool that lends a dead one fails that call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ping {
    /// Before every use (sqlx's `test_before_acquire`).
    Always,
    /// Only when it has been idle for [`IDLE_PING_AFTER`] (the ledger writer's pool).
    WhenIdle,
}

/// A connection idle this long is pinged before a ledger append ([`Ping::WhenIdle`]). A
/// PostgreSQL restart (a shutdown checkpoint, then recovery) takes longer than this, so every
/// session it ended has been idle at least this long when next lent; under load a connection
/// is never idle this long, so appends pay no extra round trip.
const IDLE_PING_AFTER: Duration = Duration::from_millis(100);

/// A pool of at most `connections` sessions to `url`, each started with `cfg`'s timeouts; the
/// first connection is made within [`CONNECT_TIMEOUT`] (or the acquire timeout, if longer),
/// directly ([`first_connection`]) so that a failure says why.
async fn pool(
    url: &str,
    cfg: &DatabaseConfig,
    connections: u32,
    application: &str,
    ping: Ping,
) -> Result<PgPool, StoreError> {
    // The URL may carry a password: never echo it.
    let options = PgConnectOptions::from_str(url)
        .map_err(|_| StoreError::Database("invalid PostgreSQL URL".into()))?
        .application_name(application)
        .options(session_settings(cfg));
    let within = CONNECT_TIMEOUT.max(cfg.acquire_timeout);
    first_connection(&options, within).await?;
    let mut pool_options = PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(cfg.acquire_timeout)
        .test_before_acquire(ping == Ping::Always);
    if ping == Ping::WhenIdle {
        pool_options = pool_options.before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= IDLE_PING_AFTER {
                    // An error closes this connection; the pool lends another or opens one.
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        });
    }
    tokio::time::timeout(within, pool_options.connect_with(options.clone()))
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!(
                "{}: no connection within {within:?}",
                target(&options)
            ))
        })?
        .map_err(|e| in_context(map_err(e), &options))
}

/// Connects once, directly, and closes the connection: sqlx's pool retries a failed connect
/// until its acquire timeout and then says only "pool timed out", where this says the cause
/// (connection refused, no such host, a TLS failure, authentication failed, no such
/// database) and where ([`target`]).
async fn first_connection(options: &PgConnectOptions, within: Duration) -> Result<(), StoreError> {
    match tokio::time::timeout(within, sqlx::ConnectOptions::connect(options)).await {
        Err(_) => Err(StoreError::Unavailable(format!(
            "{}: no answer within {within:?}",
            target(options)
        ))),
        Ok(Err(e)) => Err(in_context(map_err(e), options)),
        Ok(Ok(conn)) => {
            let _ = sqlx::Connection::close(conn).await;
            Ok(())
        }
    }
}

/// Where a connection goes, for messages: `PostgreSQL at host:port (database d, user u)`, or
/// the socket directory. Never the password.
fn target(options: &PgConnectOptions) -> String {
    let at = match options.get_socket() {
        Some(dir) => format!("socket {}", dir.display()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    format!(
        "PostgreSQL at {at} (database {}, user {})",
        options.get_database().unwrap_or("<the user's>"),
        options.get_username()
    )
}

/// `e` with [`target`] in front of its message.
fn in_context(e: StoreError, options: &PgConnectOptions) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(format!("{}: {m}", target(options))),
        StoreError::Database(m) => StoreError::Database(format!("{}: {m}", target(options))),
        other => other,
    }
}

/// Classifies a PostgreSQL error: the retryable SQLSTATEs ([`retryable_sqlstate`]) are
/// Unavailable; the rest as every driver's (see [`StoreError`]).
fn map_err(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &e
        && db.code().is_some_and(|c| retryable_sqlstate(&c))
    {
        return StoreError::Unavailable(e.to_string());
    }
    StoreError::from_driver(e)
}

/// Class 08 (connection exception), 57P0x (the server is shutting down or cannot connect
/// now), class 53 (insufficient resources), 55P03 (`lock_timeout`), 57014
/// (`statement_timeout`, or a cancel), 25P03 (`idle_in_transaction_session_timeout`): the
/// database is unreachable or busy for now, so a retry can succeed.
fn retryable_sqlstate(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("57P")
        || code.starts_with("53")
        || matches!(code, "55P03" | "57014" | "25P03")
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

impl PgStore {
    /// Opens a writing transaction (READ COMMITTED); the rows it must serialize on are locked
    /// explicitly with [`LOCK_READ`], and writers wait for those locks in the order they asked.
    async fn begin_write(&self) -> Result<WriteTx<'static, sqlx::Postgres>, StoreError> {
        let tx = self.pool.begin().await.map_err(map_err)?;
        Ok(WriteTx::new(tx, None))
    }
}

/// Appended to a `SELECT` that must lock the rows it reads (the ledger head, a CRL row), so
/// concurrent replicas wait for each other's commit instead of reading a stale row.
const LOCK_READ: &str = " FOR UPDATE";

super::ledger::impl_ledger_store!(PgStore, map_err, LOCK_READ);
super::audit::impl_audit_store!(PgStore, map_err);
super::revocations::impl_revocation_store!(PgStore, map_err, LOCK_READ);
super::crls::impl_crl_store!(PgStore, map_err, LOCK_READ);
super::ca_slots::impl_ca_slot_store!(PgStore, map_err);
super::nodes::impl_node_store!(PgStore, map_err);
super::node_admin::impl_node_admin_store!(PgStore, map_err);
super::node_sets::impl_node_set_store!(PgStore, map_err, LOCK_READ);
super::pins::impl_pin_store!(PgStore, map_err);
super::federation::impl_federation_store!(PgStore, map_err);
super::registration::impl_registration_store!(PgStore, map_err);

/// The ledger's columns an append writes, in the order of [`Columns`]' arrays.
const INSERT_COLUMNS: &str = "seq, serial, spiffe_id, dns_names, ip_addresses, not_before, \
     not_after, issued_at, cert_sha256, prev_hash, hash, cert_der, ca_key_id, caller, \
     request_id, provenance, renewed_from";
/// The batch as rows: one array parameter per column ($1 to $17).
const UNNEST_COLUMNS: &str = "UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], \
     $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bytea[], $10::bytea[], \
     $11::bytea[], $12::bytea[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[])";

/// A chained batch as one array per column, for `UNNEST`: the whole batch in one statement,
/// one round trip however large the batch.
struct Columns<'a> {
    seq: Vec<i64>,
    serial: Vec<&'a str>,
    spiffe_id: Vec<&'a str>,
    dns_names: Vec<String>,
    ip_addresses: Vec<String>,
    not_before: Vec<i64>,
    not_after: Vec<i64>,
    issued_at: Vec<i64>,
    cert_sha256: Vec<&'a [u8]>,
    prev_hash: Vec<Vec<u8>>,
    hash: Vec<Vec<u8>>,
    cert_der: Vec<&'a [u8]>,
    ca_key_id: Vec<&'a str>,
    caller: Vec<&'a str>,
    request_id: Vec<&'a str>,
    provenance: Vec<&'a str>,
    renewed_from: Vec<Option<String>>,
}

impl<'a> Columns<'a> {
    fn of(chained: Vec<Chained<'a>>) -> Self {
        let n = chained.len();
        let mut c = Columns {
            seq: Vec::with_capacity(n),
            serial: Vec::with_capacity(n),
            spiffe_id: Vec::with_capacity(n),
            dns_names: Vec::with_capacity(n),
            ip_addresses: Vec::with_capacity(n),
            not_before: Vec::with_capacity(n),
            not_after: Vec::with_capacity(n),
            issued_at: Vec::with_capacity(n),
            cert_sha256: Vec::with_capacity(n),
            prev_hash: Vec::with_capacity(n),
            hash: Vec::with_capacity(n),
            cert_der: Vec::with_capacity(n),
            ca_key_id: Vec::with_capacity(n),
            caller: Vec::with_capacity(n),
            request_id: Vec::with_capacity(n),
            provenance: Vec::with_capacity(n),
            renewed_from: Vec::with_capacity(n),
        };
        for r in chained {
            c.seq.push(r.seq);
            c.serial.push(r.cert.serial.as_str());
            c.spiffe_id.push(r.cert.spiffe_id.as_str());
            c.dns_names.push(r.dns_json);
            c.ip_addresses.push(r.ip_json);
            c.not_before.push(r.cert.not_before);
            c.not_after.push(r.cert.not_after);
            c.issued_at.push(r.cert.issued_at);
            c.cert_sha256.push(r.cert.cert_sha256.as_slice());
            c.prev_hash.push(r.prev_hash.to_vec());
            c.hash.push(r.hash.to_vec());
            c.cert_der.push(r.cert.cert_der.as_slice());
            c.ca_key_id.push(r.cert.ca_key_id.as_str());
            c.caller.push(r.cert.caller.as_str());
            c.request_id.push(r.cert.request_id.as_str());
            c.provenance.push(r.cert.provenance.as_str());
            c.renewed_from.push(r.renewed_from);
        }
        c
    }

    /// Binds the seventeen arrays as `$1` to `$17` of `sql`.
    fn bind<'q>(&'q self, sql: &'q str) -> PgQuery<'q> {
        sqlx::query(sql)
            .bind(&self.seq)
            .bind(&self.serial)
            .bind(&self.spiffe_id)
            .bind(&self.dns_names)
            .bind(&self.ip_addresses)
            .bind(&self.not_before)
            .bind(&self.not_after)
            .bind(&self.issued_at)
            .bind(&self.cert_sha256)
            .bind(&self.prev_hash)
            .bind(&self.hash)
            .bind(&self.cert_der)
            .bind(&self.ca_key_id)
            .bind(&self.caller)
            .bind(&self.request_id)
            .bind(&self.provenance)
            .bind(&self.renewed_from)
    }
}

/// The `jwt_svids` columns an append writes, in the order of [`JwtColumns`]' arrays.
const JWT_INSERT_COLUMNS: &str = "seq, spiffe_id, audience, issued_at, expires_at, key_id, \
     token_sha256, caller, request_id, provenance, prev_hash, hash";

/// The `UNNEST` of [`JwtColumns`] from parameter `$first` on.
fn jwt_unnest(first: usize) -> String {
    let types = [
        "bigint", "text", "text", "bigint", "bigint", "text", "bytea", "text", "text", "text",
        "bytea", "bytea",
    ];
    let args: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(i, t)| format!("${}::{t}[]", first + i))
        .collect();
    format!("UNNEST({})", args.join(", "))
}

/// The JWT-SVID rows of a batch as one array per column, for `UNNEST`.
struct JwtColumns<'a> {
    seq: Vec<i64>,
    spiffe_id: Vec<&'a str>,
    audience: Vec<String>,
    issued_at: Vec<i64>,
    expires_at: Vec<i64>,
    key_id: Vec<&'a str>,
    token_sha256: Vec<&'a [u8]>,
    caller: Vec<&'a str>,
    request_id: Vec<&'a str>,
    provenance: Vec<&'a str>,
    prev_hash: Vec<Vec<u8>>,
    hash: Vec<Vec<u8>>,
}

impl<'a> JwtColumns<'a> {
    fn of(chained: Vec<ChainedJwt<'a>>) -> Self {
        let mut c = JwtColumns {
            seq: Vec::new(),
            spiffe_id: Vec::new(),
            audience: Vec::new(),
            issued_at: Vec::new(),
            expires_at: Vec::new(),
            key_id: Vec::new(),
            token_sha256: Vec::new(),
            caller: Vec::new(),
            request_id: Vec::new(),
            provenance: Vec::new(),
            prev_hash: Vec::new(),
            hash: Vec::new(),
        };
        for r in chained {
            c.seq.push(r.seq);
            c.spiffe_id.push(r.jwt.spiffe_id.as_str());
            c.audience.push(r.audience_json);
            c.issued_at.push(r.jwt.issued_at);
            c.expires_at.push(r.jwt.expires_at);
            c.key_id.push(r.jwt.key_id.as_str());
            c.token_sha256.push(r.jwt.token_sha256.as_slice());
            c.caller.push(r.jwt.caller.as_str());
            c.request_id.push(r.jwt.request_id.as_str());
            c.provenance.push(r.jwt.provenance.as_str());
            c.prev_hash.push(r.prev_hash.to_vec());
            c.hash.push(r.hash.to_vec());
        }
        c
    }

    /// Binds the twelve arrays as the next twelve parameters of `q`.
    fn bind_to<'q>(&'q self, q: PgQuery<'q>) -> PgQuery<'q> {
        q.bind(&self.seq)
            .bind(&self.spiffe_id)
            .bind(&self.audience)
            .bind(&self.issued_at)
            .bind(&self.expires_at)
            .bind(&self.key_id)
            .bind(&self.token_sha256)
            .bind(&self.caller)
            .bind(&self.request_id)
            .bind(&self.provenance)
            .bind(&self.prev_hash)
            .bind(&self.hash)
    }
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The batch inserts, and the one-round-trip append at a known head.
impl PgStore {
    async fn insert_chained(
        tx: &mut sqlx::PgConnection,
        chained: Vec<Chained<'_>>,
    ) -> Result<(), StoreError> {
        let columns = Columns::of(chained);
        let sql =
            format!("INSERT INTO certificates ({INSERT_COLUMNS}) SELECT * FROM {UNNEST_COLUMNS}");
        columns
            .bind(&sql)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn insert_chained_jwts(
        tx: &mut sqlx::PgConnection,
        chained: Vec<ChainedJwt<'_>>,
    ) -> Result<(), StoreError> {
        let columns = JwtColumns::of(chained);
        let sql = format!(
            "INSERT INTO jwt_svids ({JWT_INSERT_COLUMNS}) SELECT * FROM {}",
            jwt_unnest(1)
        );
        columns
            .bind_to(sqlx::query(&sql))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    /// The head this replica last committed, if it still knows it.
    fn known_head(&self) -> Option<LedgerHead> {
        *self.head.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers the head a commit left (`None`: forget it, after a failure).
    fn remember_head(&self, head: Option<LedgerHead>) {
        *self.head.lock().unwrap_or_else(PoisonError::into_inner) = head;
    }

    /// Appends `batch` in one statement, and so in one round trip with its commit, when the
    /// chain head is still the one this replica last committed: the statement moves the head
    /// only `WHERE` it is still that `(seq, hash)`, and inserts the rows only if it did
    /// (`CROSS JOIN` on the `UPDATE`'s `RETURNING`). The row lock the `UPDATE` takes is the
    /// same one the locking path's `SELECT … FOR UPDATE` takes, so replicas still extend one
    /// chain in a total order: a statement that waited for another replica's commit re-reads
    /// the head (READ COMMITTED), finds it moved, and writes nothing.
    ///
    /// `Ok(None)`: the head is unknown or moved (another replica, or a revocation event),
    /// nothing was written; the caller takes the locking path, which learns the new head.
    ///
    /// A batch with JWT-SVID rows inserts them in the same statement (a second data-modifying
    /// `WITH` on the same `moved`), and counts both inserts.
    async fn append_at_known_head(
        &self,
        batch: &[NewLedgerRow],
    ) -> Result<Option<Vec<u64>>, StoreError> {
        let Some(head) = self.known_head() else {
            return Ok(None);
        };
        let (chained, jwts, new_seq, new_hash) = rows::chain(head.seq, head.hash, batch)?;
        // A renewal takes the locking path, which refuses one whose parent was revoked.
        if chained.iter().any(|c| c.renewed_from.is_some()) {
            return Ok(None);
        }
        let columns = Columns::of(chained);
        let done = if jwts.is_empty() {
            let sql = format!(
                "WITH moved AS (UPDATE ledger_head SET seq = $18, hash = $19 \
                 WHERE id = 1 AND seq = $20 AND hash = $21 RETURNING 1) \
                 INSERT INTO certificates ({INSERT_COLUMNS}) SELECT u.* FROM moved, {UNNEST_COLUMNS} AS u"
            );
            columns
                .bind(&sql)
                .bind(rows::db_seq(new_seq)?)
                .bind(&new_hash[..])
                .bind(rows::db_seq(head.seq)?)
                .bind(&head.hash[..])
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
        } else {
            let jwt_columns = JwtColumns::of(jwts);
            let sql = format!(
                "WITH moved AS (UPDATE ledger_head SET seq = $18, hash = $19 \
                 WHERE id = 1 AND seq = $20 AND hash = $21 RETURNING 1), \
                 c AS (INSERT INTO certificates ({INSERT_COLUMNS}) \
                 SELECT u.* FROM moved, {UNNEST_COLUMNS} AS u RETURNING 1), \
                 j AS (INSERT INTO jwt_svids ({JWT_INSERT_COLUMNS}) \
                 SELECT v.* FROM moved, {} AS v RETURNING 1) \
                 SELECT (SELECT COUNT(*) FROM c) + (SELECT COUNT(*) FROM j)",
                jwt_unnest(22)
            );
            let q = columns
                .bind(&sql)
                .bind(rows::db_seq(new_seq)?)
                .bind(&new_hash[..])
                .bind(rows::db_seq(head.seq)?)
                .bind(&head.hash[..]);
            match jwt_columns.bind_to(q).fetch_one(&self.pool).await {
                Ok(row) => {
                    sqlx::Row::try_get::<i64, _>(&row, 0).map(|n| u64::try_from(n).unwrap_or(0))
                }
                Err(e) => Err(e),
            }
        };
        let inserted = match done {
            Ok(n) => n,
            Err(e) => {
                // Committed or not, the head is no longer known for sure.
                self.remember_head(None);
                return Err(map_err(e));
            }
        };
        if inserted == 0 {
            self.remember_head(None);
            return Ok(None);
        }
        if usize::try_from(inserted).ok() != Some(batch.len()) {
            self.remember_head(None);
            return Err(StoreError::Database(format!(
                "the ledger append wrote {inserted} rows for a batch of {}",
                batch.len()
            )));
        }
        self.remember_head(Some(LedgerHead {
            seq: new_seq,
            hash: new_hash,
        }));
        Ok(Some((head.seq + 1..=new_seq).collect()))
    }

    async fn insert_audit_events(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
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
        .await
        .map_err(map_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port nothing listens on: bound, then closed.
    fn closed_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn an_unreachable_database_says_why_and_where_never_the_password() {
        let port = closed_port();
        let url = format!("postgres://signet:hunter2@127.0.0.1:{port}/ca");
        let cfg = DatabaseConfig {
            acquire_timeout: Duration::from_secs(1),
            ..DatabaseConfig::default()
        };
        let e = PgStore::connect_with(&url, &cfg).await.unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, StoreError::Unavailable(_)), "{m}");
        assert!(
            m.contains(&format!(
                "PostgreSQL at 127.0.0.1:{port} (database ca, user signet)"
            )),
            "{m}"
        );
        assert!(m.to_lowercase().contains("refused"), "{m}");
        assert!(
            !m.contains("pool timed out") && !m.contains("hunter2"),
            "{m}"
        );

        // A name that does not resolve: the lookup failure, not a timeout.
        let e = PgStore::connect_with("postgres://u:pw@no-such-host.invalid/ca", &cfg)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no-such-host.invalid:5432") && !e.contains("pool timed out"),
            "{e}"
        );
        assert!(!e.contains(":pw"), "{e}");
    }

    #[tokio::test]
    async fn a_refused_login_says_so() {
        let Some(url) = signet_testutil::fresh_postgres_database().await else {
            return;
        };
        // The test cluster trusts every local login, so ask for a database that is not there.
        let mut u = url::Url::parse(&url).unwrap();
        u.set_path("/no_such_database_here");
        let e = PgStore::connect_with(u.as_str(), &DatabaseConfig::default())
            .await
            .unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, StoreError::Database(_)), "{m}");
        assert!(
            m.contains("database no_such_database_here") && m.contains("does not exist"),
            "{m}"
        );
    }

    #[test]
    fn connection_shutdown_resource_and_timeout_states_are_retryable() {
        for code in [
            "08000", "08003", "08006", "08001", "57P01", "57P02", "57P03", "53000", "53100",
            "53200", "53300", "55P03", "57014", "25P03",
        ] {
            assert!(super::retryable_sqlstate(code), "{code}");
        }
        // unique_violation, foreign_key_violation, serialization_failure, deadlock_detected,
        // undefined_table, syntax_error, operator_intervention, invalid_text_representation:
        // not retryable today (a retry of the same request fails the same way, or the caller
        // decides).
        for code in [
            "23505", "23503", "40001", "40P01", "42P01", "42601", "57000", "22P02",
        ] {
            assert!(!super::retryable_sqlstate(code), "{code}");
        }
    }
}
