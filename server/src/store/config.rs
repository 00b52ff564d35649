//! `[database]` in the server configuration: the bounds every database session is opened
//! with. It lives with the store that applies it (config.rs assembles it), so the store
//! imports nothing from the layers above it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[database]`: bounds on every database session, so one stalled session cannot stop
/// issuance (PostgreSQL: set on each session at connect; SQLite: the busy timeout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// Connections in the pool.
    pub max_connections: u32,
    /// How long a request waits for a pool connection before answering Unavailable.
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// PostgreSQL `lock_timeout`: longest wait for a row or table lock (the ledger head).
    #[serde(with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// PostgreSQL `statement_timeout`: longest a statement may run.
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
    /// PostgreSQL `idle_in_transaction_session_timeout`: a session idle inside a transaction
    /// this long is ended by the server (its locks released).
    #[serde(with = "humantime_serde")]
    pub idle_in_transaction_timeout: Duration,
    /// SQLite: how long a writer waits for its turn behind this process's other writers, and
    /// then for another process's write lock.
    #[serde(with = "humantime_serde")]
    pub sqlite_busy_timeout: Duration,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(3),
            lock_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(30),
            sqlite_busy_timeout: Duration::from_secs(2),
        }
    }
}
