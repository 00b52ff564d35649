//! Test helpers shared by Signet's test suites.
//!
//! PostgreSQL tests get a fresh database each from [`fresh_postgres_database`], on the server
//! named by `SIGNET_TEST_DATABASE_URL` (`scripts/pg start DIR` starts a throwaway one and prints
//! its URL). Without that variable they skip, except in CI (`CI=true`), where PostgreSQL is
//! required and its absence is a failure.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ring::rand::{SecureRandom, SystemRandom};
use sqlx::Connection;

/// The variable naming the PostgreSQL server tests may create databases on.
pub const DATABASE_URL_VAR: &str = "SIGNET_TEST_DATABASE_URL";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Creates a uniquely named database on the server at `$SIGNET_TEST_DATABASE_URL` (a URL to
/// its `postgres` database, as a user allowed to `CREATE DATABASE`) and returns its URL.
///
/// Returns `None` (after printing `SKIPPED: …`) when the variable is unset, unless `CI=true`,
/// where it panics: CI must run the PostgreSQL tests. Panics if the server cannot be reached.
pub async fn fresh_postgres_database() -> Option<String> {
    let admin_url = match std::env::var(DATABASE_URL_VAR) {
        Ok(u) if !u.trim().is_empty() => u,
        _ => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "{DATABASE_URL_VAR} is not set: PostgreSQL is required in CI \
                     (start one with `scripts/pg start DIR` and export its URL)"
                );
            }
            eprintln!(
                "SKIPPED: PostgreSQL test needs a server; set {DATABASE_URL_VAR} or run scripts/test"
            );
            return None;
        }
    };
    let name = unique_name();
    let mut conn = sqlx::PgConnection::connect(&admin_url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {DATABASE_URL_VAR}: {e}"));
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    let _ = conn.close().await;
    Some(with_database(&admin_url, &name))
}

/// A `sqlite://` URL for a database file inside `dir`.
pub fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("signet.db").display())
}

fn unique_name() -> String {
    let mut random = [0u8; 4];
    // SystemRandom only fails if the OS has no randomness; the pid and counter stay unique.
    let _ = SystemRandom::new().fill(&mut random);
    format!(
        "t_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        u32::from_be_bytes(random)
    )
}

/// `url` with its database path replaced by `name` (query parameters kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(i) => &base[..authority_start + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database() {
        assert_eq!(
            with_database("postgres://signet@127.0.0.1:5432/postgres", "t_1"),
            "postgres://signet@127.0.0.1:5432/t_1"
        );
        assert_eq!(
            with_database("postgres://u:p@h/postgres?sslmode=disable", "t_2"),
            "postgres://u:p@h/t_2?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h:1", "t_3"), "postgres://h:1/t_3");
    }

    #[test]
    fn names_are_unique() {
        assert_ne!(unique_name(), unique_name());
    }
}
