//! Federation relationships, the bundles fetched for them, and the own bundle endpoint's
//! sequence: the [`FederationStore`] part of the store (what the rows mean and when they are
//! written is `crate::federation`'s; this module keeps them).
//!
//! Replicas share everything here, and every write is a compare-and-set on what the writer
//! read, so replicas converge on one stored result whatever order their fetches end in:
//!
//! - **Claims.** A replica fetches a relationship's bundle only after
//!   [`FederationStore::claim_refresh`] moved its `next_refresh_at` from "due" to "a lease from
//!   now" (one `UPDATE … WHERE next_refresh_at <= now`): exactly one replica wins each due
//!   fetch. A replica that dies mid-fetch leaves the lease, which simply expires.
//! - **Bundles.** [`FederationStore::replace_bundle`] writes a new document only if the stored
//!   one is still the one the writer compared against (`bundle_sha256`); otherwise nothing is
//!   written and the caller re-reads and decides again. In the same transaction it takes the next
//!   entry revision and stamps it on every parent with an entry federating with the trust domain,
//!   so the agents that need the bundle fetch their entries again (the entry-change path: pushed
//!   on every replica's node streams, `pg_notify` on PostgreSQL).
//! - **The own sequence.** [`FederationStore::bundle_endpoint_sequence`] keeps one row: the
//!   sequence, the hash of the keys it was given to, their CA slot generation and the document.
//!   A replica whose generation is behind serves that stored document (it has not caught up
//!   with a rotation yet); one with newer keys moves the sequence to `max(stored + 1, now)`. So
//!   the sequence never goes down and never comes back with older keys, whichever replica a
//!   relying party reaches.
//!
//! A relationship is deleted only when no entry federates with it, checked in the deleting
//! transaction after the entry revision counter is taken (the lock entry writers take first), so
//! an entry cannot be created naming a relationship being deleted.

use async_trait::async_trait;

use super::error::StoreError;

super::db_row! {
    /// A `federation_relationships` row.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct RelationshipRow {
        pub trust_domain: String,
        /// '' for a static relationship.
        pub endpoint_url: String,
        /// `https_spiffe`, `https_web` or `static`.
        pub profile: String,
        pub endpoint_spiffe_id: String,
        pub created_at: i64,
        /// The SPIFFE bundle document held ('' none yet).
        pub bundle_document: String,
        /// Lowercase hex SHA-256 of `bundle_document` ('' none).
        pub bundle_sha256: String,
        pub bundle_sequence: Option<i64>,
        pub bundle_updated_at: i64,
        pub last_success_at: i64,
        pub last_attempt_at: i64,
        pub next_refresh_at: i64,
        pub last_error: String,
        pub consecutive_failures: i64,
    }
}

/// A relationship with how many entries federate with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relationship {
    pub row: RelationshipRow,
    pub federating_entries: u64,
}

/// A new bundle for a relationship.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleWrite<'a> {
    pub document: &'a str,
    pub sha256: &'a str,
    pub sequence: Option<i64>,
}

/// How [`FederationStore::replace_bundle`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleReplace {
    /// Written; the entry revision it took (parents stamped with it), if any parent had an
    /// entry federating with the trust domain.
    Replaced { revision: Option<u64> },
    /// The stored document is no longer the one compared against (another replica wrote
    /// first), or the relationship is gone: nothing written.
    Conflict,
}

/// What [`FederationStore::bundle_endpoint_sequence`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSequence {
    pub sequence: u64,
    /// A newer document than the caller's, to serve instead of its own.
    pub newer_document: Option<String>,
}

/// Whether a replica at `mine` is behind the stored `stored` generation.
pub(super) fn behind(mine: Option<i64>, stored: Option<i64>) -> bool {
    matches!((mine, stored), (Some(m), Some(s)) if m < s)
}

/// How [`FederationStore::delete_relationship`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelationshipDelete {
    Deleted,
    NotFound,
    /// Entries federate with it: up to 10 of their IDs, and how many there are.
    InUse {
        entry_ids: Vec<String>,
        count: u64,
    },
}

#[async_trait]
pub trait FederationStore: Send + Sync + 'static {
    /// Inserts a relationship; false (nothing written) if the trust domain has one.
    async fn create_relationship(&self, row: &RelationshipRow) -> Result<bool, StoreError>;

    async fn relationship(&self, trust_domain: &str) -> Result<Option<Relationship>, StoreError>;

    /// Every relationship, by trust domain.
    async fn list_relationships(&self) -> Result<Vec<Relationship>, StoreError>;

    /// Deletes a relationship no entry federates with.
    async fn delete_relationship(
        &self,
        trust_domain: &str,
    ) -> Result<RelationshipDelete, StoreError>;

    /// The trust domains with an endpoint whose fetch is due at `now`, and the earliest
    /// `next_refresh_at` of the others (None: nothing else scheduled).
    async fn due_relationships(&self, now: i64) -> Result<(Vec<String>, Option<i64>), StoreError>;

    /// Claims a due fetch: moves `next_refresh_at` to `lease_until` if it is at most `now`
    /// (or unconditionally with `force`, an operator's refresh). True: this caller fetches.
    async fn claim_refresh(
        &self,
        trust_domain: &str,
        now: i64,
        lease_until: i64,
        force: bool,
    ) -> Result<bool, StoreError>;

    /// Writes `new` if the stored document's hash is still `expected_sha256` ('' for none),
    /// with `updated_at` as its change time, and, when the hash changes, moves the revision of
    /// every parent with an entry federating with the trust domain (see the module doc).
    async fn replace_bundle(
        &self,
        trust_domain: &str,
        expected_sha256: &str,
        new: &BundleWrite<'_>,
        updated_at: i64,
    ) -> Result<BundleReplace, StoreError>;

    /// Records a fetch's outcome: success (`error` None: the error cleared, failures reset,
    /// `last_success_at` set) or failure (the error kept, failures counted); both set
    /// `last_attempt_at` and the next due time. Returns the row's previous `last_error`.
    async fn record_fetch(
        &self,
        trust_domain: &str,
        now: i64,
        next_refresh_at: i64,
        error: Option<&str>,
    ) -> Result<Option<String>, StoreError>;

    /// The held documents of those of `trust_domains` that have one: `(trust domain,
    /// document)`, by trust domain.
    async fn federated_bundles(
        &self,
        trust_domains: &[&str],
    ) -> Result<Vec<(String, String)>, StoreError>;

    /// The own bundle endpoint's `spiffe_sequence` for `document`, whose keys hash to
    /// `content_sha256` and come from CA slot generation `generation` (None: unordered, a
    /// plugged-in CA): the stored sequence if the stored hash is the same; the stored sequence
    /// *and document* if the stored generation is newer than this one (this replica has not
    /// caught up: it serves what the deployment published, never older keys under a newer
    /// number); else `max(stored + 1, now)`, stored with this hash, generation and document.
    async fn bundle_endpoint_sequence(
        &self,
        content_sha256: &str,
        generation: Option<i64>,
        document: &str,
        now: i64,
    ) -> Result<EndpointSequence, StoreError>;
}

/// The `federation_relationships` columns of a [`RelationshipRow`], in its fields' order.
pub(super) const RELATIONSHIP_COLUMNS: &str = "trust_domain, endpoint_url, profile, \
     endpoint_spiffe_id, created_at, bundle_document, bundle_sha256, bundle_sequence, \
     bundle_updated_at, last_success_at, last_attempt_at, next_refresh_at, last_error, \
     consecutive_failures";

/// Counts a trust domain's federating entries (`$1`).
pub(super) const COUNT_FEDERATING: &str =
    "SELECT COUNT(*) FROM entry_federates_with WHERE trust_domain = $1";

pub(super) fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Implements [`FederationStore`] for a store type with a `pool`, an `events` hub, `begin_write`
/// and `notify_entries_in_tx` (as `impl_node_store!` needs); `$map` turns a `sqlx::Error` into
/// a [`StoreError`].
macro_rules! impl_federation_store {
    ($store:ty, $map:path) => {
        #[async_trait::async_trait]
        impl $crate::store::federation::FederationStore for $store {
            async fn create_relationship(
                &self,
                r: &$crate::store::federation::RelationshipRow,
            ) -> Result<bool, StoreError> {
                let mut tx = self.begin_write().await?;
                let done = sqlx::query(&format!(
                    "INSERT INTO federation_relationships ({}) VALUES ($1, $2, $3, $4, $5, $6, \
                     $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT (trust_domain) DO NOTHING",
                    $crate::store::federation::RELATIONSHIP_COLUMNS
                ))
                .bind(&r.trust_domain)
                .bind(&r.endpoint_url)
                .bind(&r.profile)
                .bind(&r.endpoint_spiffe_id)
                .bind(r.created_at)
                .bind(&r.bundle_document)
                .bind(&r.bundle_sha256)
                .bind(r.bundle_sequence)
                .bind(r.bundle_updated_at)
                .bind(r.last_success_at)
                .bind(r.last_attempt_at)
                .bind(r.next_refresh_at)
                .bind(&r.last_error)
                .bind(r.consecutive_failures)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(done.rows_affected() == 1)
            }

            async fn relationship(
                &self,
                trust_domain: &str,
            ) -> Result<Option<$crate::store::federation::Relationship>, StoreError> {
                use $crate::store::federation::{
                    COUNT_FEDERATING, RELATIONSHIP_COLUMNS, Relationship, RelationshipRow, count,
                };
                let row: Option<RelationshipRow> = sqlx::query_as(&format!(
                    "SELECT {RELATIONSHIP_COLUMNS} FROM federation_relationships \
                     WHERE trust_domain = $1"
                ))
                .bind(trust_domain)
                .fetch_optional(&self.pool)
                .await
                .map_err($map)?;
                let Some(row) = row else { return Ok(None) };
                let (n,): (i64,) = sqlx::query_as(COUNT_FEDERATING)
                    .bind(trust_domain)
                    .fetch_one(&self.pool)
                    .await
                    .map_err($map)?;
                Ok(Some(Relationship {
                    row,
                    federating_entries: count(n),
                }))
            }

            async fn list_relationships(
                &self,
            ) -> Result<Vec<$crate::store::federation::Relationship>, StoreError> {
                use $crate::store::federation::{
                    RELATIONSHIP_COLUMNS, Relationship, RelationshipRow, count,
                };
                let rows: Vec<RelationshipRow> = sqlx::query_as(&format!(
                    "SELECT {RELATIONSHIP_COLUMNS} FROM federation_relationships \
                     ORDER BY trust_domain"
                ))
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                let counts: Vec<(String, i64)> = sqlx::query_as(
                    "SELECT trust_domain, COUNT(*) FROM entry_federates_with \
                     GROUP BY trust_domain",
                )
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                let counts: std::collections::HashMap<String, i64> =
                    counts.into_iter().collect();
                Ok(rows
                    .into_iter()
                    .map(|row| Relationship {
                        federating_entries: count(
                            counts.get(&row.trust_domain).copied().unwrap_or(0),
                        ),
                        row,
                    })
                    .collect())
            }

            async fn delete_relationship(
                &self,
                trust_domain: &str,
            ) -> Result<$crate::store::federation::RelationshipDelete, StoreError> {
                use $crate::store::federation::{COUNT_FEDERATING, RelationshipDelete, count};
                let mut tx = self.begin_write().await?;
                // The entry writers' lock first (see the module doc).
                let _: (i64,) = sqlx::query_as($crate::store::nodes::NEXT_REVISION)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err($map)?;
                let (n,): (i64,) = sqlx::query_as(COUNT_FEDERATING)
                    .bind(trust_domain)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err($map)?;
                if n > 0 {
                    let ids: Vec<(String,)> = sqlx::query_as(
                        "SELECT entry_id FROM entry_federates_with WHERE trust_domain = $1 \
                         ORDER BY entry_id LIMIT 10",
                    )
                    .bind(trust_domain)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err($map)?;
                    tx.rollback().await.map_err($map)?;
                    return Ok(RelationshipDelete::InUse {
                        entry_ids: ids.into_iter().map(|(i,)| i).collect(),
                        count: count(n),
                    });
                }
                let done =
                    sqlx::query("DELETE FROM federation_relationships WHERE trust_domain = $1")
                        .bind(trust_domain)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                if done.rows_affected() == 0 {
                    tx.rollback().await.map_err($map)?;
                    return Ok(RelationshipDelete::NotFound);
                }
                tx.commit().await.map_err($map)?;
                Ok(RelationshipDelete::Deleted)
            }

            async fn due_relationships(
                &self,
                now: i64,
            ) -> Result<(Vec<String>, Option<i64>), StoreError> {
                let due: Vec<(String,)> = sqlx::query_as(
                    "SELECT trust_domain FROM federation_relationships \
                     WHERE endpoint_url <> '' AND next_refresh_at <= $1 ORDER BY next_refresh_at",
                )
                .bind(now)
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                let (next,): (Option<i64>,) = sqlx::query_as(
                    "SELECT MIN(next_refresh_at) FROM federation_relationships \
                     WHERE endpoint_url <> '' AND next_refresh_at > $1",
                )
                .bind(now)
                .fetch_one(&self.pool)
                .await
                .map_err($map)?;
                Ok((due.into_iter().map(|(t,)| t).collect(), next))
            }

            async fn claim_refresh(
                &self,
                trust_domain: &str,
                now: i64,
                lease_until: i64,
                force: bool,
            ) -> Result<bool, StoreError> {
                let mut tx = self.begin_write().await?;
                let done = sqlx::query(
                    "UPDATE federation_relationships SET next_refresh_at = $2 \
                     WHERE trust_domain = $1 AND endpoint_url <> '' \
                     AND (next_refresh_at <= $3 OR $4)",
                )
                .bind(trust_domain)
                .bind(lease_until)
                .bind(now)
                .bind(force)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(done.rows_affected() == 1)
            }

            async fn replace_bundle(
                &self,
                trust_domain: &str,
                expected_sha256: &str,
                new: &$crate::store::federation::BundleWrite<'_>,
                updated_at: i64,
            ) -> Result<$crate::store::federation::BundleReplace, StoreError> {
                use $crate::store::federation::BundleReplace;
                let mut tx = self.begin_write().await?;
                // The entry writers' lock first: the parents stamped below are those of the
                // entries federating now, and none is created in between.
                let (rev,): (i64,) = sqlx::query_as($crate::store::nodes::NEXT_REVISION)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err($map)?;
                let done = sqlx::query(
                    "UPDATE federation_relationships SET bundle_document = $2, \
                     bundle_sha256 = $3, bundle_sequence = $4, bundle_updated_at = $5 \
                     WHERE trust_domain = $1 AND bundle_sha256 = $6",
                )
                .bind(trust_domain)
                .bind(new.document)
                .bind(new.sha256)
                .bind(new.sequence)
                .bind(updated_at)
                .bind(expected_sha256)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                if done.rows_affected() == 0 {
                    tx.rollback().await.map_err($map)?;
                    return Ok(BundleReplace::Conflict);
                }
                if new.sha256 == expected_sha256 {
                    // The same keys (a newer sequence only): nothing for agents to fetch.
                    tx.commit().await.map_err($map)?;
                    return Ok(BundleReplace::Replaced { revision: None });
                }
                let parents: Vec<(String,)> = sqlx::query_as(
                    "SELECT DISTINCT e.parent_id FROM entries e \
                     JOIN entry_federates_with f ON f.entry_id = e.id \
                     WHERE f.trust_domain = $1 ORDER BY e.parent_id",
                )
                .bind(trust_domain)
                .fetch_all(&mut *tx)
                .await
                .map_err($map)?;
                for (parent,) in &parents {
                    sqlx::query($crate::store::nodes::TOUCH_PARENT)
                        .bind(parent)
                        .bind(rev)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                    Self::notify_entries_in_tx(&mut tx, parent).await?;
                }
                tx.commit().await.map_err($map)?;
                for (parent,) in &parents {
                    self.events.notify(parent);
                }
                let revision = if parents.is_empty() {
                    None
                } else {
                    Some($crate::store::nodes::revision(rev)?)
                };
                Ok(BundleReplace::Replaced { revision })
            }

            async fn record_fetch(
                &self,
                trust_domain: &str,
                now: i64,
                next_refresh_at: i64,
                error: Option<&str>,
            ) -> Result<Option<String>, StoreError> {
                let mut tx = self.begin_write().await?;
                let before: Option<(String,)> = sqlx::query_as(
                    "SELECT last_error FROM federation_relationships WHERE trust_domain = $1",
                )
                .bind(trust_domain)
                .fetch_optional(&mut *tx)
                .await
                .map_err($map)?;
                match error {
                    None => sqlx::query(
                        "UPDATE federation_relationships SET last_attempt_at = $2, \
                         last_success_at = $2, next_refresh_at = $3, last_error = '', \
                         consecutive_failures = 0 WHERE trust_domain = $1",
                    )
                    .bind(trust_domain)
                    .bind(now)
                    .bind(next_refresh_at),
                    Some(e) => sqlx::query(
                        "UPDATE federation_relationships SET last_attempt_at = $2, \
                         next_refresh_at = $3, last_error = $4, \
                         consecutive_failures = consecutive_failures + 1 \
                         WHERE trust_domain = $1",
                    )
                    .bind(trust_domain)
                    .bind(now)
                    .bind(next_refresh_at)
                    .bind(e),
                }
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(before.map(|(e,)| e))
            }

            async fn federated_bundles(
                &self,
                trust_domains: &[&str],
            ) -> Result<Vec<(String, String)>, StoreError> {
                if trust_domains.is_empty() {
                    return Ok(Vec::new());
                }
                let mut out = Vec::with_capacity(trust_domains.len());
                // Bounded statements: an entry names at most 32, a node's entries more.
                for chunk in trust_domains.chunks(64) {
                    let sql = format!(
                        "SELECT trust_domain, bundle_document FROM federation_relationships \
                         WHERE bundle_document <> '' AND trust_domain IN ({}) \
                         ORDER BY trust_domain",
                        $crate::store::ca_slots::placeholders(1, chunk.len())
                    );
                    let mut q = sqlx::query_as::<_, (String, String)>(&sql);
                    for td in chunk {
                        q = q.bind(*td);
                    }
                    out.extend(q.fetch_all(&self.pool).await.map_err($map)?);
                }
                out.sort();
                Ok(out)
            }

            async fn bundle_endpoint_sequence(
                &self,
                content_sha256: &str,
                generation: Option<i64>,
                document: &str,
                now: i64,
            ) -> Result<$crate::store::federation::EndpointSequence, StoreError> {
                use $crate::store::federation::{EndpointSequence, behind};
                const READ: &str = "SELECT sequence, content_sha256, generation, document \
                                    FROM bundle_endpoint_sequence WHERE id = 1";
                let decide = |seq: i64, sha: &str, gen_: Option<i64>, doc: String| {
                    let sequence = u64::try_from(seq).unwrap_or(0);
                    if sha == content_sha256 {
                        Some(EndpointSequence { sequence, newer_document: None })
                    } else if behind(generation, gen_) && !doc.is_empty() {
                        Some(EndpointSequence { sequence, newer_document: Some(doc) })
                    } else {
                        None
                    }
                };
                // The common cases, one read: the keys served are the ones stored, or this
                // replica is behind and serves the stored document.
                let (seq, sha, gen_, doc): (i64, String, Option<i64>, String) =
                    sqlx::query_as(READ).fetch_one(&self.pool).await.map_err($map)?;
                if let Some(d) = decide(seq, &sha, gen_, doc) {
                    return Ok(d);
                }
                let mut tx = self.begin_write().await?;
                // Lock the one row first (PostgreSQL: a row lock; SQLite's write transaction
                // holds the database), so two replicas serving new keys take two sequences.
                sqlx::query("UPDATE bundle_endpoint_sequence SET sequence = sequence WHERE id = 1")
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                let (seq, sha, gen_, doc): (i64, String, Option<i64>, String) =
                    sqlx::query_as(READ).fetch_one(&mut *tx).await.map_err($map)?;
                if let Some(d) = decide(seq, &sha, gen_, doc) {
                    tx.rollback().await.map_err($map)?;
                    return Ok(d);
                }
                let next = seq.saturating_add(1).max(now);
                sqlx::query(
                    "UPDATE bundle_endpoint_sequence SET sequence = $1, content_sha256 = $2, \
                     generation = $3, document = $4 WHERE id = 1",
                )
                .bind(next)
                .bind(content_sha256)
                .bind(generation)
                .bind(document)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(EndpointSequence {
                    sequence: u64::try_from(next).unwrap_or(0),
                    newer_document: None,
                })
            }
        }
    };
}

pub(super) use impl_federation_store;
