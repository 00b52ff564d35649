//! CRL state: the [`CrlStore`] part of the store.
//!
//! The last CRL each CA key signed is kept in `crl_state` (number, DER, thisUpdate,
//! nextUpdate, and the revocation mark it covers). Invariant: [`CrlStore::refresh_crl`] reads
//! and replaces it under a row lock (PostgreSQL `SELECT … FOR UPDATE`; SQLite `BEGIN
//! IMMEDIATE`), so replicas sharing one database never reuse a CRL number and publish the same
//! bytes. What a CRL lists is read from the ledger's revocation index (`certificates.revoked_at`,
//! set by `store::revocations`).
//!
//! The SQL is the same on both databases except for how the transaction takes its lock, so
//! it is written once ([`impl_crl_store`]).

use async_trait::async_trait;

use super::error::StoreError;

/// A revoked certificate as a CRL lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedRow {
    pub serial: String,
    pub revoked_at: i64,
    pub reason: String,
    pub not_after: i64,
}

/// The last CRL a CA key signed.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredCrl {
    pub ca_key_id: String,
    /// The CRL number; 1 for the first.
    pub number: u64,
    pub der: Vec<u8>,
    /// Unix seconds.
    pub this_update: i64,
    pub next_update: i64,
    /// The revocation mark ([`CrlStore::revocation_mark`]) it covers.
    pub mark: u64,
}

impl std::fmt::Debug for StoredCrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCrl")
            .field("ca_key_id", &self.ca_key_id)
            .field("number", &self.number)
            .field("der_len", &self.der.len())
            .field("this_update", &self.this_update)
            .field("next_update", &self.next_update)
            .field("mark", &self.mark)
            .finish()
    }
}

/// Called by [`CrlStore::refresh_crl`] under the lock with the key's current CRL: `None`
/// keeps it; `Some` replaces it (its number must be the current one plus one, or 1). It cannot
/// fail: a signer that cannot sign keeps the current CRL and reports why itself.
pub type CrlSigner<'a> = &'a (dyn Fn(Option<&StoredCrl>) -> Option<StoredCrl> + Send + Sync);

#[async_trait]
pub trait CrlStore: Send + Sync + 'static {
    /// The revoked certificates issued by `ca_key_id` that expire after `not_after_after`, by
    /// seq.
    async fn revoked_certificates(
        &self,
        ca_key_id: &str,
        not_after_after: i64,
    ) -> Result<Vec<RevokedRow>, StoreError>;

    /// Moves on with every revocation: the seq of the last ledger event (0: none yet). Cheap
    /// (the primary key's maximum); replicas poll it to notice each other's revocations.
    async fn revocation_mark(&self) -> Result<u64, StoreError>;

    /// The CRL `ca_key_id` last signed, if any.
    async fn stored_crl(&self, ca_key_id: &str) -> Result<Option<StoredCrl>, StoreError>;

    /// Locks `ca_key_id`'s CRL row, lets `sign` decide from the current one whether to sign a
    /// new one, stores that, and returns whichever is current afterwards.
    async fn refresh_crl(
        &self,
        ca_key_id: &str,
        sign: CrlSigner<'_>,
    ) -> Result<Option<StoredCrl>, StoreError>;
}

super::db_row! {
    /// A `crl_state` row as both drivers decode it.
    pub(super) struct DbCrl {
        ca_key_id: String,
        number: i64,
        der: Vec<u8>,
        this_update: i64,
        next_update: i64,
        mark: i64,
    }
}

pub(super) const CRL_COLUMNS: &str = "ca_key_id, number, der, this_update, next_update, mark";

impl TryFrom<DbCrl> for StoredCrl {
    type Error = StoreError;

    fn try_from(r: DbCrl) -> Result<Self, StoreError> {
        let num = |v: i64, what: &str| {
            u64::try_from(v).map_err(|_| {
                StoreError::Corrupt(format!("CRL of {}: negative {what}", r.ca_key_id))
            })
        };
        Ok(StoredCrl {
            number: num(r.number, "number")?,
            mark: num(r.mark, "mark")?,
            ca_key_id: r.ca_key_id,
            der: r.der,
            this_update: r.this_update,
            next_update: r.next_update,
        })
    }
}

/// Implements [`CrlStore`] for a backend with a `pool` field and an
/// `async fn begin_write(&self) -> Result<WriteTx, StoreError>` (see `store::write_tx`); `$lock`
/// is appended to the `SELECT` that must lock the row it reads (see the backend's module doc).
macro_rules! impl_crl_store {
    ($store:ty, $map:path, $lock:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::crls::CrlStore for $store {
            async fn revoked_certificates(
                &self,
                ca_key_id: &str,
                not_after_after: i64,
            ) -> Result<Vec<$crate::store::crls::RevokedRow>, StoreError> {
                let found: Vec<(String, i64, Option<String>, i64)> = sqlx::query_as(
                    "SELECT serial, revoked_at, revocation_reason, not_after FROM certificates \
                     WHERE ca_key_id = $1 AND revoked_at IS NOT NULL AND not_after > $2 \
                     ORDER BY seq",
                )
                .bind(ca_key_id)
                .bind(not_after_after)
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                Ok(found
                    .into_iter()
                    .map(
                        |(serial, revoked_at, reason, not_after)| {
                            $crate::store::crls::RevokedRow {
                                serial,
                                revoked_at,
                                reason: reason.unwrap_or_default(),
                                not_after,
                            }
                        },
                    )
                    .collect())
            }

            async fn revocation_mark(&self) -> Result<u64, StoreError> {
                let (m,): (Option<i64>,) = sqlx::query_as("SELECT MAX(seq) FROM ledger_events")
                    .fetch_one(&self.pool)
                    .await
                    .map_err($map)?;
                let m = m.unwrap_or(0);
                u64::try_from(m)
                    .map_err(|_| StoreError::Corrupt(format!("negative ledger event seq {m}")))
            }

            async fn stored_crl(
                &self,
                ca_key_id: &str,
            ) -> Result<Option<$crate::store::crls::StoredCrl>, StoreError> {
                let found: Option<$crate::store::crls::DbCrl> = sqlx::query_as(&format!(
                    "SELECT {} FROM crl_state WHERE ca_key_id = $1",
                    $crate::store::crls::CRL_COLUMNS
                ))
                .bind(ca_key_id)
                .fetch_optional(&self.pool)
                .await
                .map_err($map)?;
                found
                    .map($crate::store::crls::StoredCrl::try_from)
                    .transpose()
            }

            async fn refresh_crl(
                &self,
                ca_key_id: &str,
                sign: $crate::store::crls::CrlSigner<'_>,
            ) -> Result<Option<$crate::store::crls::StoredCrl>, StoreError> {
                use $crate::store::crls::{DbCrl, StoredCrl};
                use $crate::store::rows::i64_of;
                let mut tx = self.begin_write().await?;
                // The row may not exist yet: create it (number 0: no CRL yet) so that there is
                // a row to lock. Concurrent creators wait for each other on the key.
                sqlx::query(
                    "INSERT INTO crl_state (ca_key_id, number, der, this_update, next_update, mark) \
                     VALUES ($1, 0, $2, 0, 0, 0) ON CONFLICT (ca_key_id) DO NOTHING",
                )
                .bind(ca_key_id)
                .bind(Vec::<u8>::new())
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                let current: DbCrl = sqlx::query_as(&format!(
                    "SELECT {} FROM crl_state WHERE ca_key_id = $1{}",
                    $crate::store::crls::CRL_COLUMNS,
                    $lock
                ))
                .bind(ca_key_id)
                .fetch_one(&mut *tx)
                .await
                .map_err($map)?;
                let current = StoredCrl::try_from(current)?;
                let current = (current.number > 0).then_some(current);
                let Some(next) = sign(current.as_ref()) else {
                    tx.commit().await.map_err($map)?;
                    return Ok(current);
                };
                // Numbers only increase; they may skip (a server signs above the highest number
                // it served when the stored one was set back).
                let last = current.as_ref().map_or(0, |c| c.number);
                if next.number <= last || next.ca_key_id != ca_key_id {
                    return Err(StoreError::Database(format!(
                        "CRL of {ca_key_id}: number {} signed where the stored one is {last}",
                        next.number
                    )));
                }
                sqlx::query(
                    "UPDATE crl_state SET number = $1, der = $2, this_update = $3, \
                     next_update = $4, mark = $5 WHERE ca_key_id = $6",
                )
                .bind(i64_of(next.number, "CRL number")?)
                .bind(&next.der)
                .bind(next.this_update)
                .bind(next.next_update)
                .bind(i64_of(next.mark, "mark")?)
                .bind(ca_key_id)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(Some(next))
            }
        }
    };
}

pub(super) use impl_crl_store;
