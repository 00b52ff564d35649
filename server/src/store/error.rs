//! The store's one error type, [`StoreError`]: whether a failure is retryable (the database
//! cannot be reached: Unavailable), corrupt data, or anything else the database said. The API
//! edge maps it to a gRPC status (`api::mod`). Classifying a driver error starts in the backend
//! (`sqlite`, `postgres`: its own retryable codes) and ends here (connection faults).

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
    /// The caller's input cannot be used (a page token from elsewhere); the message says why.
    #[error("{0}")]
    InvalidArgument(String),
    /// Renewals of these serials were not appended: each has been revoked (nothing in the
    /// batch was written).
    #[error("renewal of revoked certificate(s): {}", .0.join(", "))]
    RevokedParent(Vec<String>),
}

impl StoreError {
    /// What both drivers classify the same way: a connection that cannot be made, is lost or
    /// timed out is retryable; anything else is a database error. Each backend's `map_err`
    /// first recognises its own retryable database codes, then falls back to this; there is
    /// deliberately no `From<sqlx::Error>`, so a query cannot skip its backend's
    /// classification with `?`.
    pub(super) fn from_driver(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_) => StoreError::Unavailable(e.to_string()),
            other => StoreError::Database(other.to_string()),
        }
    }

    /// A failed migration run, its database errors classified by `map` (the backend's).
    pub(super) fn from_migration(
        e: sqlx::migrate::MigrateError,
        map: fn(sqlx::Error) -> Self,
    ) -> Self {
        match e {
            sqlx::migrate::MigrateError::Execute(e) => map(e),
            sqlx::migrate::MigrateError::ExecuteMigration(e, _) => map(e),
            other => StoreError::Database(format!("migrations: {other}")),
        }
    }
}
