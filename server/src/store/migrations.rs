//! The schema migrations, embedded in the binary (`server/build.rs` lists
//! `migrations/{postgres,sqlite}/*.sql`), handed to sqlx's [`Migrator`] through its public
//! [`MigrationSource`] trait.
//!
//! A file becomes a migration exactly as sqlx reads a directory (its `resolve_blocking`,
//! which `sqlx::migrate!` runs at compile time): `<VERSION>_<DESCRIPTION>.sql`, the version an
//! `i64`, underscores in the description read as spaces, a `.up.sql`/`.down.sql` suffix making
//! it reversible, `-- no-transaction` as the first line opting out of a transaction, and the
//! checksum SHA-384 of the text. Databases migrated by earlier builds (which used the macro)
//! record those checksums, so they must not change: the tests below compare every field with
//! what sqlx itself reads from the same directory.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use sqlx::error::BoxDynError;
use sqlx::migrate::{MigrateError, Migration, MigrationSource, MigrationType, Migrator};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}

/// PostgreSQL's migrations.
pub(super) async fn postgres() -> Result<Migrator, MigrateError> {
    Migrator::new(Embedded(embedded::POSTGRES)).await
}

/// SQLite's migrations.
pub(super) async fn sqlite() -> Result<Migrator, MigrateError> {
    Migrator::new(Embedded(embedded::SQLITE)).await
}

/// Migration files compiled in: `(file name, SQL)`.
#[derive(Debug, Clone, Copy)]
struct Embedded(&'static [(&'static str, &'static str)]);

impl MigrationSource<'static> for Embedded {
    fn resolve(
        self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send + 'static>> {
        Box::pin(async move { self.migrations().map_err(BoxDynError::from) })
    }
}

/// A compiled-in migration file whose name has no integer version before its first `_`.
#[derive(Debug, thiserror::Error)]
#[error("migration {0:?}: the name must start with an integer version")]
struct UnversionedMigration(&'static str);

impl Embedded {
    fn migrations(self) -> Result<Vec<Migration>, UnversionedMigration> {
        let mut out = Vec::with_capacity(self.0.len());
        for &(file, sql) in self.0 {
            let Some((version, rest)) = file.split_once('_') else {
                continue;
            };
            if !rest.ends_with(".sql") {
                continue;
            }
            let version: i64 = version.parse().map_err(|_| UnversionedMigration(file))?;
            let migration_type = MigrationType::from_filename(rest);
            let description = rest
                .trim_end_matches(migration_type.suffix())
                .replace('_', " ");
            out.push(Migration::new(
                version,
                Cow::Owned(description),
                migration_type,
                Cow::Borrowed(sql),
                sql.starts_with("-- no-transaction"),
            ));
        }
        out.sort_by_key(|m| m.version);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Every field sqlx records or checks, ours against sqlx's own reading of the directory.
    async fn same_as_sqlx_reads(ours: Migrator, dir: &str) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../migrations")
            .join(dir);
        let theirs = Migrator::new(dir.as_path())
            .await
            .expect("sqlx reads the directory");
        let key = |m: &Migration| {
            (
                m.version,
                m.description.to_string(),
                m.migration_type,
                m.sql.to_string(),
                m.checksum.to_vec(),
                m.no_tx,
            )
        };
        let ours: Vec<_> = ours.iter().map(key).collect();
        let theirs: Vec<_> = theirs.iter().map(key).collect();
        assert!(!theirs.is_empty(), "{} holds no migration", dir.display());
        assert_eq!(ours, theirs);
    }

    #[tokio::test]
    async fn postgres_migrations_are_what_sqlx_reads_from_the_directory() {
        same_as_sqlx_reads(postgres().await.expect("embedded"), "postgres").await;
    }

    #[tokio::test]
    async fn sqlite_migrations_are_what_sqlx_reads_from_the_directory() {
        same_as_sqlx_reads(sqlite().await.expect("embedded"), "sqlite").await;
    }

    #[test]
    fn names_are_read_as_sqlx_reads_them() {
        let m = Embedded(&[
            ("0002_second_step.up.sql", "-- no-transaction\nSELECT 2;"),
            ("README.md", "not a migration"),
            ("0001_first.sql", "SELECT 1;"),
            ("nounderscore.sql", "ignored"),
        ])
        .migrations()
        .expect("valid");
        let got: Vec<_> = m
            .iter()
            .map(|m| {
                (
                    m.version,
                    m.description.to_string(),
                    m.migration_type,
                    m.no_tx,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (1, "first".to_owned(), MigrationType::Simple, false),
                (
                    2,
                    "second step".to_owned(),
                    MigrationType::ReversibleUp,
                    true
                ),
            ]
        );
        let bad = Embedded(&[("first_step.sql", "SELECT 1;")]).migrations();
        assert!(
            bad.expect_err("not a version")
                .to_string()
                .contains("first_step.sql")
        );
    }
}
