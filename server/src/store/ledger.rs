//! The ledger of issued certificates: the [`LedgerStore`] part of the store.
//!
//! Invariant: the hash chain is extended only inside [`LedgerStore::append_rows`] (certificates
//! and JWT-SVIDs, [`NewLedgerRow`]), in one transaction that locks the chain head
//! (`ledger_head`), appends the whole batch in order and moves the head, so replicas sharing one PostgreSQL extend a single chain in a total
//! order at the cost of one lock per batch. Revocation events extend the same chain under the
//! same lock (`store::revocations`).
//!
//! The SQL is written once here ([`impl_ledger_store`]) for both databases; a backend supplies
//! only how a writing transaction begins and locks the head, how it inserts the chained
//! batch (one multi-row statement on PostgreSQL, one statement per row on SQLite), and
//! optionally a faster append at a head it already knows. PostgreSQL's is one statement that
//! moves the head only if it is still the one this replica last committed and inserts the
//! batch only if it did: the same row lock, the same total order, one round trip instead of
//! five (`BEGIN`, lock, insert, move, `COMMIT`).

use async_trait::async_trait;
use signet_types::ledger::{Hash, JwtSvidRecord};

use super::error::StoreError;

/// Which end a listing starts from (a keyset page, [`LedgerStore::certificates_page`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Ascending seq, from the first row (or after the token's).
    #[default]
    OldestFirst,
    /// Descending seq, from the head (or before the token's).
    NewestFirst,
}

/// A certificate to append to the ledger (seq and hashes are assigned by the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCertificate {
    pub serial: String,
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    pub not_before: i64,
    pub not_after: i64,
    pub cert_sha256: Hash,
    pub ca_key_id: String,
    pub caller: String,
    pub issued_at: i64,
    pub request_id: String,
    pub cert_der: Vec<u8>,
    /// Where the authority came from ([`crate::provenance::Provenance`], canonical JSON).
    pub provenance: String,
}

impl NewCertificate {
    /// The serial this certificate renews (its provenance's `renewed_from`), if it is a
    /// renewal over mTLS.
    pub fn renewed_from(&self) -> Option<String> {
        crate::provenance::Provenance::from_ledger_text(&self.provenance)
            .ok()
            .and_then(|p| p.renewed_from)
    }
}

/// A JWT-SVID to append to the ledger (seq and hashes are assigned by the store). The token
/// itself is never stored: only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJwtSvid {
    pub spiffe_id: String,
    /// The token's `aud`, in its order.
    pub audience: Vec<String>,
    pub issued_at: i64,
    pub expires_at: i64,
    pub key_id: String,
    pub token_sha256: Hash,
    pub caller: String,
    pub request_id: String,
    /// Where the authority came from (canonical JSON, as a certificate's).
    pub provenance: String,
}

/// One row the ledger writer appends: a certificate or a JWT-SVID. Both kinds share one batch,
/// one transaction and one chain, in the order queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewLedgerRow {
    Certificate(NewCertificate),
    JwtSvid(NewJwtSvid),
}

impl NewLedgerRow {
    /// The serial a certificate row renews (see [`NewCertificate::renewed_from`]); never for a
    /// JWT-SVID.
    pub fn renewed_from(&self) -> Option<String> {
        match self {
            NewLedgerRow::Certificate(c) => c.renewed_from(),
            NewLedgerRow::JwtSvid(_) => None,
        }
    }
}

/// A ledger row as stored: the one row shape ([`LedgerRecord`]) the admin API sends and the
/// client reads back. Its `revocation` is the lookup index the revoking transaction sets beside
/// the row (the revocation itself is a later event in the chain,
/// [`super::revocations::EventRow`]).
pub use signet_types::ledger::LedgerRecord;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerHead {
    /// 0 when the ledger is empty.
    pub seq: u64,
    /// `GENESIS` when the ledger is empty.
    pub hash: Hash,
}

#[async_trait]
pub trait LedgerStore: Send + Sync + 'static {
    /// Cheap reachability check of the ledger's database, for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Appends `batch` (certificates and JWT-SVIDs) in order in one transaction, extending the
    /// hash chain; returns the rows' sequence numbers. All or nothing.
    async fn append_rows(&self, batch: &[NewLedgerRow]) -> Result<Vec<u64>, StoreError>;

    /// [`LedgerStore::append_rows`] of certificates only (tests and the benchmark fill).
    #[cfg(any(test, feature = "bench"))]
    async fn append_certificates(&self, batch: &[NewCertificate]) -> Result<Vec<u64>, StoreError> {
        let rows: Vec<NewLedgerRow> = batch
            .iter()
            .cloned()
            .map(NewLedgerRow::Certificate)
            .collect();
        self.append_rows(&rows).await
    }

    /// One keyset page of JWT-SVID rows, as [`LedgerStore::certificates_page`].
    async fn jwt_svids_page(
        &self,
        order: Order,
        from: Option<u64>,
        limit: u32,
        spiffe_id: Option<&str>,
    ) -> Result<Vec<JwtSvidRecord>, StoreError>;

    /// JWT-SVID rows with `seq > after_seq`, ascending, at most `limit`.
    async fn list_jwt_svids(
        &self,
        after_seq: u64,
        limit: u32,
        spiffe_id: Option<&str>,
    ) -> Result<Vec<JwtSvidRecord>, StoreError> {
        self.jwt_svids_page(Order::OldestFirst, Some(after_seq), limit, spiffe_id)
            .await
    }

    async fn ledger_head(&self) -> Result<LedgerHead, StoreError>;

    /// One keyset page: at most `limit` rows beyond `from` in `order` (seq above it, ascending;
    /// or below it, newest first; `None`: from that end of the ledger), only `spiffe_id` if
    /// given. The primary key, or the `(spiffe_id, seq)` index, read in either direction from
    /// `from`: the same cost at any depth.
    async fn certificates_page(
        &self,
        order: Order,
        from: Option<u64>,
        limit: u32,
        spiffe_id: Option<&str>,
    ) -> Result<Vec<LedgerRecord>, StoreError>;

    /// Rows with `seq > after_seq`, ascending, at most `limit`; only `spiffe_id` if given
    /// ([`LedgerStore::certificates_page`] oldest first).
    async fn list_certificates(
        &self,
        after_seq: u64,
        limit: u32,
        spiffe_id: Option<&str>,
    ) -> Result<Vec<LedgerRecord>, StoreError> {
        self.certificates_page(Order::OldestFirst, Some(after_seq), limit, spiffe_id)
            .await
    }

    async fn certificate_by_serial(&self, serial: &str)
    -> Result<Option<LedgerRecord>, StoreError>;

    #[cfg(test)]
    async fn count_certificates(&self) -> Result<u64, StoreError>;
}

/// Implements [`LedgerStore`] for a backend with a `pool` field, an associated
/// `async fn insert_chained(tx, Vec<rows::Chained>) -> Result<(), StoreError>` (the batch
/// insert), and a fast path: `async fn append_at_known_head(&self, batch) ->
/// Result<Option<Vec<u64>>, StoreError>` (`None`: take the locking path) with
/// `fn remember_head(&self, Option<LedgerHead>)`, told the head each locking append leaves;
/// `async fn begin_write(&self) -> Result<WriteTx, StoreError>` opens a writing transaction
/// (see `store::write_tx`). `$lock` is appended to the `SELECT` of the chain head to lock it
/// (see the backend's module doc).
macro_rules! impl_ledger_store {
    ($store:ty, $map:path, $lock:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::ledger::LedgerStore for $store {
            async fn ping(&self) -> Result<(), StoreError> {
                sqlx::query("SELECT 1")
                    .execute(&self.pool)
                    .await
                    .map_err($map)?;
                Ok(())
            }

            async fn append_rows(
                &self,
                batch: &[$crate::store::ledger::NewLedgerRow],
            ) -> Result<Vec<u64>, StoreError> {
                use $crate::store::rows;
                if batch.is_empty() {
                    return Ok(Vec::new());
                }
                // One round trip when this replica still knows the head (see the backend).
                if let Some(seqs) = self.append_at_known_head(batch).await? {
                    return Ok(seqs);
                }
                let mut tx = self.begin_write().await?;
                // The one lock per batch: replicas extend a single chain in a total order.
                let (head_seq, head_hash): (i64, Vec<u8>) = sqlx::query_as(&format!(
                    "SELECT seq, hash FROM ledger_head WHERE id = 1{}",
                    $lock
                ))
                .fetch_one(&mut *tx)
                .await
                .map_err($map)?;
                let head = rows::head(head_seq, &head_hash)?;
                let (chained, jwts, new_seq, new_hash) = rows::chain(head.seq, head.hash, batch)?;
                // A renewal of a certificate revoked meanwhile (here or on another replica:
                // revocations take the same lock) is refused; a revocation committed after this
                // one follows `renewed_from` to the new row instead.
                let parents: Vec<&str> = chained
                    .iter()
                    .filter_map(|c| c.renewed_from.as_deref())
                    .collect();
                if !parents.is_empty() {
                    let sql = format!(
                        "SELECT serial FROM certificates WHERE revoked_at IS NOT NULL \
                         AND serial IN ({})",
                        $crate::store::ca_slots::placeholders(1, parents.len())
                    );
                    let mut q = sqlx::query_as::<_, (String,)>(&sql);
                    for p in &parents {
                        q = q.bind(*p);
                    }
                    let revoked: Vec<(String,)> = q.fetch_all(&mut *tx).await.map_err($map)?;
                    if !revoked.is_empty() {
                        return Err(StoreError::RevokedParent(
                            revoked.into_iter().map(|(s,)| s).collect(),
                        ));
                    }
                }
                if !chained.is_empty() {
                    Self::insert_chained(&mut tx, chained).await?;
                }
                if !jwts.is_empty() {
                    Self::insert_chained_jwts(&mut tx, jwts).await?;
                }
                sqlx::query("UPDATE ledger_head SET seq = $1, hash = $2 WHERE id = 1")
                    .bind(rows::db_seq(new_seq)?)
                    .bind(&new_hash[..])
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                tx.commit().await.map_err($map)?;
                self.remember_head(Some($crate::store::ledger::LedgerHead {
                    seq: new_seq,
                    hash: new_hash,
                }));
                Ok((head.seq + 1..=new_seq).collect())
            }

            async fn ledger_head(&self) -> Result<$crate::store::ledger::LedgerHead, StoreError> {
                let (seq, hash): (i64, Vec<u8>) =
                    sqlx::query_as("SELECT seq, hash FROM ledger_head WHERE id = 1")
                        .fetch_one(&self.pool)
                        .await
                        .map_err($map)?;
                $crate::store::rows::head(seq, &hash)
            }

            async fn certificates_page(
                &self,
                order: $crate::store::ledger::Order,
                from: Option<u64>,
                limit: u32,
                spiffe_id: Option<&str>,
            ) -> Result<Vec<$crate::store::ledger::LedgerRecord>, StoreError> {
                use $crate::store::rows::{self, CERT_COLUMNS, DbCertificate};
                let (sql, key) = rows::page_query(
                    CERT_COLUMNS,
                    "certificates",
                    order,
                    from,
                    spiffe_id.is_some(),
                );
                let mut q = sqlx::query_as::<_, DbCertificate>(&sql)
                    .bind(key)
                    .bind(rows::limit(limit));
                if let Some(id) = spiffe_id {
                    q = q.bind(id);
                }
                let found = q.fetch_all(&self.pool).await.map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::ledger::LedgerRecord::try_from)
                    .collect()
            }

            async fn jwt_svids_page(
                &self,
                order: $crate::store::ledger::Order,
                from: Option<u64>,
                limit: u32,
                spiffe_id: Option<&str>,
            ) -> Result<Vec<signet_types::ledger::JwtSvidRecord>, StoreError> {
                use $crate::store::rows::{self, DbJwtSvid, JWT_COLUMNS};
                let (sql, key) =
                    rows::page_query(JWT_COLUMNS, "jwt_svids", order, from, spiffe_id.is_some());
                let mut q = sqlx::query_as::<_, DbJwtSvid>(&sql)
                    .bind(key)
                    .bind(rows::limit(limit));
                if let Some(id) = spiffe_id {
                    q = q.bind(id);
                }
                let found = q.fetch_all(&self.pool).await.map_err($map)?;
                found
                    .into_iter()
                    .map(signet_types::ledger::JwtSvidRecord::try_from)
                    .collect()
            }

            async fn certificate_by_serial(
                &self,
                serial: &str,
            ) -> Result<Option<$crate::store::ledger::LedgerRecord>, StoreError> {
                use $crate::store::rows::{CERT_COLUMNS, DbCertificate};
                let found: Option<DbCertificate> = sqlx::query_as(&format!(
                    "SELECT {CERT_COLUMNS} FROM certificates WHERE serial = $1"
                ))
                .bind(serial)
                .fetch_optional(&self.pool)
                .await
                .map_err($map)?;
                found
                    .map($crate::store::ledger::LedgerRecord::try_from)
                    .transpose()
            }

            #[cfg(test)]
            async fn count_certificates(&self) -> Result<u64, StoreError> {
                let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM certificates")
                    .fetch_one(&self.pool)
                    .await
                    .map_err($map)?;
                $crate::store::rows::count(n)
            }
        }
    };
}

pub(super) use impl_ledger_store;
