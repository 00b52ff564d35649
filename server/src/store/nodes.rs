//! Join tokens, attested nodes and registration entries: the [`NodeStore`] part of the store.
//!
//! The SQL is the same on both databases (sqlx's SQLite driver accepts `$N` placeholders, and
//! both speak `RETURNING` and `ON CONFLICT`), so one macro implements the trait for both.
//!
//! Entry revisions: one global counter (`entry_revision_seq`). Creating or deleting an entry
//! takes the next value in the same transaction, stamps it on the entry (create) and on the
//! parent's row in `node_revisions` (both), so a parent's revision moves on every change to its
//! entries, deletions included, and a poll that knows the current revision costs one indexed
//! read.
//!
//! Duplicates: an entry is refused (nothing written, no revision taken) when it is the same
//! registration as a stored one: same SPIFFE ID, same parent, same set of selectors
//! ([`registration_selectors`], the one definition, for `create_entry` and `create_entries`).
//! The check runs after the revision counter is taken, inside the writing transaction, so two
//! racing creates of one registration cannot both pass it.
//!
//! About 830 lines, on purpose: the trait, its row types and the one macro body both backends
//! share; split, each query would sit apart from the contract it implements.

use async_trait::async_trait;

use super::error::StoreError;

/// How [`NodeStore::consume_join_token`] went. Only `Consumed` attests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenUse {
    /// The token was valid and is now used; it attests this node ID.
    Consumed {
        node_id: String,
    },
    /// Valid, but it names a banned node: refused, and left unused (it may attest once the
    /// node is unbanned).
    NodeBanned {
        node_id: String,
    },
    /// Already used (by another agent, or an earlier attempt).
    AlreadyUsed,
    Expired,
    Unknown,
}

/// An attested node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub node_id: String,
    pub spiffe_id: String,
    pub attested_at: i64,
    pub banned_at: Option<i64>,
    /// The latest node certificate's serial and expiry.
    pub last_serial: String,
    pub not_after: i64,
    /// How it (last) attested: [`ATTESTATION_JOIN_TOKEN`] or [`ATTESTATION_K8S_PSAT`].
    pub attestation: String,
    /// The node selectors its (last) attestation proved, sorted
    /// ([`signet_types::node_set::NodeSelector`]): what node sets select on.
    pub selectors: Vec<String>,
}

super::db_row! {
    /// A `nodes` row as both drivers decode it.
    pub(super) struct DbNode {
        node_id: String,
        spiffe_id: String,
        attested_at: i64,
        banned_at: Option<i64>,
        last_serial: String,
        not_after: i64,
        attestation: String,
        selectors: String,
    }
}

impl TryFrom<DbNode> for NodeRow {
    type Error = StoreError;

    fn try_from(r: DbNode) -> Result<Self, StoreError> {
        let selectors = serde_json::from_str(&r.selectors).map_err(|e| {
            StoreError::Corrupt(format!(
                "node {}: selectors is not a JSON list: {e}",
                r.node_id
            ))
        })?;
        Ok(NodeRow {
            node_id: r.node_id,
            spiffe_id: r.spiffe_id,
            attested_at: r.attested_at,
            banned_at: r.banned_at,
            last_serial: r.last_serial,
            not_after: r.not_after,
            attestation: r.attestation,
            selectors,
        })
    }
}

/// `nodes.attestation`: a one-time join token.
pub const ATTESTATION_JOIN_TOKEN: &str = "join_token";
/// `nodes.attestation`: a Kubernetes projected service-account token.
pub const ATTESTATION_K8S_PSAT: &str = "k8s_psat";

/// A registration entry to create (the store assigns the revision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub id: String,
    pub spiffe_id: String,
    /// The parent node's SPIFFE ID.
    pub parent_id: String,
    pub selectors: Vec<String>,
    pub ttl_seconds: i64,
    pub dns_names: Vec<String>,
    pub created_at: i64,
    /// The lifetime of the entry's JWT-SVIDs, seconds; 0: the server's default.
    pub jwt_ttl_seconds: i64,
    /// Foreign trust domain names (sorted, without duplicates) whose bundles the entry's
    /// workloads receive; each must have a federation relationship.
    pub federates_with: Vec<String>,
}

/// A registration entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRow {
    pub id: String,
    pub spiffe_id: String,
    pub parent_id: String,
    pub selectors: Vec<String>,
    pub ttl_seconds: i64,
    pub dns_names: Vec<String>,
    pub revision: u64,
    pub created_at: i64,
    /// The lifetime of the entry's JWT-SVIDs, seconds; 0: the server's default.
    pub jwt_ttl_seconds: i64,
    /// Foreign trust domain names (sorted, without duplicates) whose bundles the entry's
    /// workloads receive; each must have a federation relationship.
    pub federates_with: Vec<String>,
    /// Who keeps the entry: '' (the operator, on the admin socket) or the SPIFFE ID of the
    /// registrar that owns it (`store::registration`).
    pub owner: String,
    /// The registrar's name for the object the entry comes from; '' for the operator's.
    pub owner_scope: String,
}

/// How [`NodeStore::create_entry`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryCreate {
    /// The entry was created, with a new revision.
    Created(EntryRow),
    /// It is the same registration (SPIFFE ID, parent, set of selectors: see
    /// [`registration_selectors`]) as the stored entry `existing_id`; nothing was written.
    Duplicate { existing_id: String },
    /// It federates with `trust_domain`, which has no federation relationship; nothing was
    /// written.
    NoRelationship { trust_domain: String },
    /// Its parent is node set `name`, which does not exist; nothing was written.
    NoNodeSet { name: String },
}

/// The selectors as a registration is compared: a set (sorted, without repeats), so two
/// entries that differ only in the order or repetition of their selectors are the same
/// registration. The one definition of a duplicate entry, for single and batch creates.
pub(crate) fn registration_selectors(selectors: &[String]) -> Vec<String> {
    let mut sel = selectors.to_vec();
    sel.sort();
    sel.dedup();
    sel
}

/// A stored entry's selectors column, decoded and compared as [`registration_selectors`].
pub(super) fn stored_registration_selectors(
    id: &str,
    selectors: &str,
) -> Result<Vec<String>, StoreError> {
    let sel: Vec<String> = serde_json::from_str(selectors).map_err(|e| {
        StoreError::Corrupt(format!("entry {id}: selectors is not a JSON list: {e}"))
    })?;
    Ok(registration_selectors(&sel))
}

/// How [`NodeStore::create_entries`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchCreate {
    /// Every entry was created, all with this one revision (in the batch's order).
    Created {
        revision: u64,
        entries: Vec<EntryRow>,
    },
    /// Entry `index` of the batch (the first such) is the same registration (SPIFFE ID,
    /// parent, selectors) as the stored entry `existing_id`; nothing was written.
    Duplicate { index: usize, existing_id: String },
    /// Entry `index` (the first such) federates with `trust_domain`, which has no federation
    /// relationship; nothing was written.
    NoRelationship { index: usize, trust_domain: String },
    /// Entry `index` (the first such) names node set `name` as parent, which does not exist;
    /// nothing was written.
    NoNodeSet { index: usize, name: String },
}

/// The answer to a node's poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySync {
    /// The parent's current revision (0: no entry was ever created for it).
    pub revision: u64,
    /// The caller already holds `revision`; `entries` is empty.
    pub unchanged: bool,
    pub entries: Vec<EntryRow>,
}

/// A node's registration entries are those of its own SPIFFE ID and of every node set it is
/// a member of: the node's parents, as [`NodeStore::entries_for_parents_since`] takes them.
/// Node sets are the [`super::node_sets::NodeSetStore`] part of the store.
#[async_trait]
pub trait NodeStore:
    super::node_sets::NodeSetStore + super::node_admin::NodeAdminStore + Send + Sync + 'static
{
    /// Stores a join token by its hash. Never sees the token itself.
    async fn create_join_token(
        &self,
        token_hash: &str,
        node_id: &str,
        created_at: i64,
        expires_at: i64,
    ) -> Result<(), StoreError>;

    /// Atomically marks the token used if it is unused and unexpired at `now` and its node is
    /// not banned: of any number of concurrent callers with the same token, at most one gets
    /// `Consumed`. A banned node's token is refused in the same transaction and stays unused
    /// (`NodeBanned`).
    async fn consume_join_token(&self, token_hash: &str, now: i64) -> Result<TokenUse, StoreError>;

    /// Undoes [`Self::consume_join_token`] at `used_at` after a retryable failure (the CA could
    /// not issue or record), so the agent can retry with the same token. Only the consumption
    /// that happened at exactly `used_at` is undone; returns whether one was.
    async fn release_join_token(&self, token_hash: &str, used_at: i64) -> Result<bool, StoreError>;

    /// Records a node's attestation (insert, or re-attestation of a known node ID).
    async fn upsert_attested_node(&self, node: &NodeRow) -> Result<(), StoreError>;

    /// Records a renewed node certificate.
    async fn update_node_certificate(
        &self,
        node_id: &str,
        serial: &str,
        not_after: i64,
    ) -> Result<(), StoreError>;

    async fn node(&self, node_id: &str) -> Result<Option<NodeRow>, StoreError>;

    async fn list_nodes(&self) -> Result<Vec<NodeRow>, StoreError>;

    /// Bans the node (keeping the first ban time); None if no such node.
    async fn ban_node(&self, node_id: &str, now: i64) -> Result<Option<NodeRow>, StoreError>;

    /// Creates an entry with the next revision, bumping its parent's revision, unless it is
    /// the same registration as a stored entry (then nothing is written). Like
    /// [`Self::create_entries`], the revision counter is taken first, so the duplicate check
    /// cannot race another writer.
    async fn create_entry(&self, entry: &NewEntry) -> Result<EntryCreate, StoreError>;

    /// Creates every entry of a non-empty batch in one transaction with one new revision,
    /// bumping each parent's revision, unless one is the same registration as a stored entry
    /// (then nothing is written). The revision counter's row lock (PostgreSQL) or the write
    /// lock (SQLite) is taken first, so the duplicate check cannot race another writer.
    async fn create_entries(&self, batch: &[NewEntry]) -> Result<BatchCreate, StoreError>;

    async fn entry(&self, id: &str) -> Result<Option<EntryRow>, StoreError>;

    /// Those of `ids` that exist, in no given order (an unknown id is left out, a repeated one
    /// is answered once): a SignWorkloads call's entries in one query instead of one each.
    async fn entries_by_id(&self, ids: &[&str]) -> Result<Vec<EntryRow>, StoreError>;

    /// All entries, or those of one parent (a node SPIFFE ID), by id.
    async fn list_entries(&self, parent_id: Option<&str>) -> Result<Vec<EntryRow>, StoreError>;

    /// Deletes an entry, bumping its parent's revision; false if there was none.
    async fn delete_entry(&self, id: &str) -> Result<bool, StoreError>;

    /// Replaces an entry's selectors with `new` if they are still `old`, with a new revision on
    /// the entry and its parent (so agents fetch it); false if the entry is gone or changed.
    /// Only for the start-up rewrite of legacy spellings (`crate::entry_upgrade`): entries are
    /// otherwise immutable.
    async fn replace_entry_selectors(
        &self,
        id: &str,
        old: &[String],
        new: &[String],
    ) -> Result<bool, StoreError>;

    /// This replica's feed of entry changes (every replica's, on PostgreSQL): see
    /// [`super::entry_events`].
    fn entry_events(&self) -> super::entry_events::EntryEvents;

    /// A node's effective entry revision: the highest of its `parents`' (its own SPIFFE ID and
    /// the node sets it is a member of; 0 if none has one). One query per 256 parents.
    async fn entry_revision_of(&self, parents: &[&str]) -> Result<u64, StoreError>;

    /// The entries of all of `parents` (by id), unless the caller already holds their
    /// effective revision ([`Self::entry_revision_of`]).
    async fn entries_for_parents_since(
        &self,
        parents: &[&str],
        known_revision: u64,
    ) -> Result<EntrySync, StoreError>;

    /// One parent's revision (tests; the node API reads a node's parents together).
    #[cfg(test)]
    async fn entry_revision(&self, parent_id: &str) -> Result<u64, StoreError> {
        self.entry_revision_of(&[parent_id]).await
    }

    /// One parent's entries, unless it already holds the current revision (tests).
    #[cfg(test)]
    async fn entries_for_parent_since(
        &self,
        parent_id: &str,
        known_revision: u64,
    ) -> Result<EntrySync, StoreError> {
        self.entries_for_parents_since(&[parent_id], known_revision)
            .await
    }
}

/// Parents per statement in the multi-parent reads (bounded statement shapes).
pub(crate) const PARENTS_PER_QUERY: usize = 256;

/// The first entry of `batch` whose parent is a node set, with the set's name, for the
/// existence check inside the writing transaction.
pub(crate) fn node_set_parents(batch: &[NewEntry]) -> Vec<(usize, &str)> {
    let mut out: Vec<(usize, &str)> = Vec::new();
    for (i, e) in batch.iter().enumerate() {
        if let Some(name) = super::node_sets::node_set_name_of_parent(&e.parent_id)
            && !out.iter().any(|(_, n)| *n == name)
        {
            out.push((i, name));
        }
    }
    out
}

super::db_row! {
    /// An `entries` row as both drivers decode it.
    pub(super) struct DbEntry {
        id: String,
        spiffe_id: String,
        parent_id: String,
        selectors: String,
        ttl_seconds: i64,
        dns_names: String,
        revision: i64,
        created_at: i64,
        jwt_ttl_seconds: i64,
        federates_with: String,
        owner: String,
        owner_scope: String,
    }
}

pub(super) const ENTRY_COLUMNS: &str = "id, spiffe_id, parent_id, selectors, ttl_seconds, \
     dns_names, revision, created_at, jwt_ttl_seconds, federates_with, owner, owner_scope";

impl TryFrom<DbEntry> for EntryRow {
    type Error = StoreError;

    fn try_from(r: DbEntry) -> Result<Self, StoreError> {
        let list = |column: &str, text: &str| -> Result<Vec<String>, StoreError> {
            serde_json::from_str(text).map_err(|e| {
                StoreError::Corrupt(format!("entry {}: {column} is not a JSON list: {e}", r.id))
            })
        };
        Ok(EntryRow {
            selectors: list("selectors", &r.selectors)?,
            dns_names: list("dns_names", &r.dns_names)?,
            federates_with: list("federates_with", &r.federates_with)?,
            revision: revision(r.revision)?,
            id: r.id,
            spiffe_id: r.spiffe_id,
            parent_id: r.parent_id,
            ttl_seconds: r.ttl_seconds,
            created_at: r.created_at,
            jwt_ttl_seconds: r.jwt_ttl_seconds,
            owner: r.owner,
            owner_scope: r.owner_scope,
        })
    }
}

/// The `nodes` columns of a [`DbNode`], in its fields' order.
pub(super) const NODE_COLUMNS: &str =
    "node_id, spiffe_id, attested_at, banned_at, last_serial, not_after, attestation, selectors";

pub(super) fn revision(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative revision {v}")))
}

/// Takes the next entry revision (one global counter; its row lock orders entry writers).
pub(crate) const NEXT_REVISION: &str =
    "UPDATE entry_revision_seq SET value = value + 1 WHERE id = 1 RETURNING value";

/// Stamps a parent's entry revision (`$1` parent, `$2` revision): its agents fetch again.
pub(crate) const TOUCH_PARENT: &str = "INSERT INTO node_revisions (parent_id, revision) \
     VALUES ($1, $2) ON CONFLICT (parent_id) DO UPDATE SET revision = excluded.revision";

pub(crate) fn json(list: &[String]) -> Result<String, StoreError> {
    serde_json::to_string(list).map_err(|e| StoreError::Database(format!("encoding a list: {e}")))
}

/// Records that entry `$2` federates with trust domain `$1`.
pub(crate) const INSERT_FEDERATES_WITH: &str =
    "INSERT INTO entry_federates_with (trust_domain, entry_id) VALUES ($1, $2)";

/// Whether trust domain `$1` has a federation relationship (a row, or none).
pub(crate) const RELATIONSHIP_EXISTS: &str =
    "SELECT trust_domain FROM federation_relationships WHERE trust_domain = $1";

/// Implements [`NodeStore`] for a store type with a `pool` and an `events`
/// ([`super::entry_events::EntryEvents`]) field and an associated
/// `async fn notify_entries_in_tx(&mut Connection, parent: &str) -> Result<(), StoreError>`
/// (PostgreSQL: `pg_notify`, delivered on commit; SQLite: nothing) and an
/// `async fn begin_write(&self) -> Result<WriteTx, StoreError>` (see `store::write_tx`); `$map` turns a
/// `sqlx::Error` into a [`StoreError`]. Every entry write notifies each parent it touched, in
/// its transaction and again in-process after the commit.
macro_rules! impl_node_store {
    ($store:ty, $map:path) => {
        #[async_trait::async_trait]
        impl $crate::store::nodes::NodeStore for $store {
            async fn create_join_token(
                &self,
                token_hash: &str,
                node_id: &str,
                created_at: i64,
                expires_at: i64,
            ) -> Result<(), StoreError> {
                let mut tx = self.begin_write().await?;
                sqlx::query(
                    "INSERT INTO join_tokens (token_hash, node_id, created_at, expires_at) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(token_hash)
                .bind(node_id)
                .bind(created_at)
                .bind(expires_at)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)
            }

            async fn consume_join_token(
                &self,
                token_hash: &str,
                now: i64,
            ) -> Result<$crate::store::nodes::TokenUse, StoreError> {
                use $crate::store::nodes::TokenUse;
                let mut tx = self.begin_write().await?;
                // One statement: the row lock (PostgreSQL) or the write lock (SQLite) makes
                // a concurrent second UPDATE see used_at set and match nothing.
                let won: Option<(String,)> = sqlx::query_as(
                    "UPDATE join_tokens SET used_at = $2 \
                     WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2 \
                     RETURNING node_id",
                )
                .bind(token_hash)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .map_err($map)?;
                if let Some((node_id,)) = won {
                    // A banned node is refused before the token is spent: rolled back, the
                    // token stays good for after an unban.
                    let banned: Option<(Option<i64>,)> =
                        sqlx::query_as("SELECT banned_at FROM nodes WHERE node_id = $1")
                            .bind(&node_id)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err($map)?;
                    if banned.is_some_and(|(at,)| at.is_some()) {
                        tx.rollback().await.map_err($map)?;
                        return Ok(TokenUse::NodeBanned { node_id });
                    }
                    tx.commit().await.map_err($map)?;
                    return Ok(TokenUse::Consumed { node_id });
                }
                let found: Option<(Option<i64>, i64)> = sqlx::query_as(
                    "SELECT used_at, expires_at FROM join_tokens WHERE token_hash = $1",
                )
                .bind(token_hash)
                .fetch_optional(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(match found {
                    None => TokenUse::Unknown,
                    Some((Some(_), _)) => TokenUse::AlreadyUsed,
                    Some((None, _)) => TokenUse::Expired,
                })
            }

            async fn release_join_token(
                &self,
                token_hash: &str,
                used_at: i64,
            ) -> Result<bool, StoreError> {
                let mut tx = self.begin_write().await?;
                let done = sqlx::query(
                    "UPDATE join_tokens SET used_at = NULL \
                     WHERE token_hash = $1 AND used_at = $2",
                )
                .bind(token_hash)
                .bind(used_at)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(done.rows_affected() > 0)
            }

            async fn upsert_attested_node(
                &self,
                node: &$crate::store::nodes::NodeRow,
            ) -> Result<(), StoreError> {
                let selectors = $crate::store::nodes::json(&node.selectors)?;
                let mut tx = self.begin_write().await?;
                let before: Option<(String,)> =
                    sqlx::query_as("SELECT selectors FROM nodes WHERE node_id = $1")
                        .bind(&node.node_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($map)?;
                sqlx::query(
                    "INSERT INTO nodes (node_id, spiffe_id, attested_at, banned_at, last_serial, \
                     not_after, attestation, selectors) VALUES ($1, $2, $3, NULL, $4, $5, $6, $7) \
                     ON CONFLICT (node_id) DO UPDATE SET attested_at = excluded.attested_at, \
                     last_serial = excluded.last_serial, not_after = excluded.not_after, \
                     attestation = excluded.attestation, selectors = excluded.selectors",
                )
                .bind(&node.node_id)
                .bind(&node.spiffe_id)
                .bind(node.attested_at)
                .bind(&node.last_serial)
                .bind(node.not_after)
                .bind(&node.attestation)
                .bind(&selectors)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                // A re-attestation that proved other selectors may change the node's node-set
                // memberships: move its own entry revision past every set's, so its agent
                // syncs (a new node syncs from revision 0 anyway).
                let moved = before.is_some_and(|(b,)| b != selectors);
                if moved {
                    let (rev,): (i64,) = sqlx::query_as($crate::store::nodes::NEXT_REVISION)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err($map)?;
                    sqlx::query($crate::store::nodes::TOUCH_PARENT)
                        .bind(&node.spiffe_id)
                        .bind(rev)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                    Self::notify_entries_in_tx(&mut tx, &node.spiffe_id).await?;
                }
                tx.commit().await.map_err($map)?;
                if moved {
                    self.events.notify(&node.spiffe_id);
                }
                Ok(())
            }

            async fn update_node_certificate(
                &self,
                node_id: &str,
                serial: &str,
                not_after: i64,
            ) -> Result<(), StoreError> {
                let mut tx = self.begin_write().await?;
                sqlx::query("UPDATE nodes SET last_serial = $2, not_after = $3 WHERE node_id = $1")
                    .bind(node_id)
                    .bind(serial)
                    .bind(not_after)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                tx.commit().await.map_err($map)
            }

            async fn node(
                &self,
                node_id: &str,
            ) -> Result<Option<$crate::store::nodes::NodeRow>, StoreError> {
                let row: Option<$crate::store::nodes::DbNode> = sqlx::query_as(&format!(
                    "SELECT {} FROM nodes WHERE node_id = $1",
                    $crate::store::nodes::NODE_COLUMNS
                ))
                .bind(node_id)
                .fetch_optional(&self.pool)
                .await
                .map_err($map)?;
                row.map(TryInto::try_into).transpose()
            }

            async fn list_nodes(
                &self,
            ) -> Result<Vec<$crate::store::nodes::NodeRow>, StoreError> {
                let rows: Vec<$crate::store::nodes::DbNode> = sqlx::query_as(&format!(
                    "SELECT {} FROM nodes ORDER BY node_id",
                    $crate::store::nodes::NODE_COLUMNS
                ))
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                rows.into_iter().map(TryInto::try_into).collect()
            }

            async fn ban_node(
                &self,
                node_id: &str,
                now: i64,
            ) -> Result<Option<$crate::store::nodes::NodeRow>, StoreError> {
                let mut tx = self.begin_write().await?;
                let row: Option<$crate::store::nodes::DbNode> = sqlx::query_as(&format!(
                    "UPDATE nodes SET banned_at = COALESCE(banned_at, $2) WHERE node_id = $1 \
                     RETURNING {}",
                    $crate::store::nodes::NODE_COLUMNS
                ))
                .bind(node_id)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                row.map(TryInto::try_into).transpose()
            }

            async fn create_entry(
                &self,
                e: &$crate::store::nodes::NewEntry,
            ) -> Result<$crate::store::nodes::EntryCreate, StoreError> {
                use $crate::store::nodes::{
                    EntryCreate, json, registration_selectors, revision,
                    stored_registration_selectors,
                };
                let selectors = json(&e.selectors)?;
                let dns_names = json(&e.dns_names)?;
                let mut tx = self.begin_write().await?;
                // The counter first: it serializes entry writers on PostgreSQL (SQLite's
                // IMMEDIATE transaction already holds the write lock), so the duplicate check
                // below sees every committed entry.
                let (rev,): (i64,) = sqlx::query_as(
                    $crate::store::nodes::NEXT_REVISION,
                )
                .fetch_one(&mut *tx)
                .await
                .map_err($map)?;
                // Only this SPIFFE ID's entries under this parent (the parent index), not all
                // of the parent's: one create stays cheap on a node with many entries.
                let same_id: Vec<(String, String)> = sqlx::query_as(
                    "SELECT id, selectors FROM entries WHERE parent_id = $1 AND spiffe_id = $2 \
                     ORDER BY id",
                )
                .bind(&e.parent_id)
                .bind(&e.spiffe_id)
                .fetch_all(&mut *tx)
                .await
                .map_err($map)?;
                let wanted = registration_selectors(&e.selectors);
                for (id, stored) in same_id {
                    if stored_registration_selectors(&id, &stored)? == wanted {
                        tx.rollback().await.map_err($map)?;
                        return Ok(EntryCreate::Duplicate { existing_id: id });
                    }
                }
                for td in &e.federates_with {
                    if !exists_in_tx!(tx, $crate::store::nodes::RELATIONSHIP_EXISTS, td, $map) {
                        tx.rollback().await.map_err($map)?;
                        return Ok(EntryCreate::NoRelationship {
                            trust_domain: td.clone(),
                        });
                    }
                }
                // Under the counter's lock, as `delete_node_set` counts a set's entries: a
                // set cannot go away between this check and the insert.
                if let Some(name) =
                    $crate::store::node_sets::node_set_name_of_parent(&e.parent_id)
                {
                    if !exists_in_tx!(tx, $crate::store::node_sets::NODE_SET_EXISTS, name, $map) {
                        tx.rollback().await.map_err($map)?;
                        return Ok(EntryCreate::NoNodeSet {
                            name: name.to_owned(),
                        });
                    }
                }
                sqlx::query(
                    "INSERT INTO entries (id, spiffe_id, parent_id, selectors, ttl_seconds, \
                     dns_names, revision, created_at, jwt_ttl_seconds, federates_with) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&e.id)
                .bind(&e.spiffe_id)
                .bind(&e.parent_id)
                .bind(&selectors)
                .bind(e.ttl_seconds)
                .bind(&dns_names)
                .bind(rev)
                .bind(e.created_at)
                .bind(e.jwt_ttl_seconds)
                .bind(json(&e.federates_with)?)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                for td in &e.federates_with {
                    sqlx::query($crate::store::nodes::INSERT_FEDERATES_WITH)
                        .bind(td)
                        .bind(&e.id)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                }
                sqlx::query(
                    $crate::store::nodes::TOUCH_PARENT,
                )
                .bind(&e.parent_id)
                .bind(rev)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                Self::notify_entries_in_tx(&mut tx, &e.parent_id).await?;
                tx.commit().await.map_err($map)?;
                self.events.notify(&e.parent_id);
                Ok(EntryCreate::Created($crate::store::nodes::EntryRow {
                    id: e.id.clone(),
                    spiffe_id: e.spiffe_id.clone(),
                    parent_id: e.parent_id.clone(),
                    selectors: e.selectors.clone(),
                    ttl_seconds: e.ttl_seconds,
                    dns_names: e.dns_names.clone(),
                    revision: revision(rev)?,
                    created_at: e.created_at,
                    jwt_ttl_seconds: e.jwt_ttl_seconds,
                    federates_with: e.federates_with.clone(),
                    owner: String::new(),
                    owner_scope: String::new(),
                }))
            }

            async fn create_entries(
                &self,
                batch: &[$crate::store::nodes::NewEntry],
            ) -> Result<$crate::store::nodes::BatchCreate, StoreError> {
                use $crate::store::nodes::{
                    BatchCreate, EntryRow, json, registration_selectors, revision,
                    stored_registration_selectors,
                };
                if batch.is_empty() {
                    return Err(StoreError::Database("an empty batch of entries".into()));
                }
                let mut tx = self.begin_write().await?;
                // The counter first: it serializes entry writers on PostgreSQL (SQLite's
                // IMMEDIATE transaction already holds the write lock), so the duplicate check
                // below sees every committed entry.
                let (rev,): (i64,) = sqlx::query_as(
                    $crate::store::nodes::NEXT_REVISION,
                )
                .fetch_one(&mut *tx)
                .await
                .map_err($map)?;
                let mut parents: Vec<&str> = batch.iter().map(|e| e.parent_id.as_str()).collect();
                parents.sort_unstable();
                parents.dedup();
                let mut first_duplicate: Option<(usize, String)> = None;
                for parent in &parents {
                    let stored: Vec<(String, String, String)> = sqlx::query_as(
                        "SELECT id, spiffe_id, selectors FROM entries WHERE parent_id = $1",
                    )
                    .bind(*parent)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err($map)?;
                    let mut known = std::collections::HashMap::with_capacity(stored.len());
                    for (id, spiffe_id, selectors) in stored {
                        let sel = stored_registration_selectors(&id, &selectors)?;
                        known.insert((spiffe_id, sel), id);
                    }
                    for (i, e) in batch.iter().enumerate() {
                        if e.parent_id != *parent
                            || first_duplicate.as_ref().is_some_and(|(f, _)| *f < i)
                        {
                            continue;
                        }
                        let key = (e.spiffe_id.clone(), registration_selectors(&e.selectors));
                        if let Some(id) = known.get(&key) {
                            first_duplicate = Some((i, id.clone()));
                        }
                    }
                }
                if let Some((index, existing_id)) = first_duplicate {
                    tx.rollback().await.map_err($map)?;
                    return Ok(BatchCreate::Duplicate { index, existing_id });
                }
                let mut named: Vec<&str> = batch
                    .iter()
                    .flat_map(|e| e.federates_with.iter().map(String::as_str))
                    .collect();
                named.sort_unstable();
                named.dedup();
                for td in named {
                    if !exists_in_tx!(tx, $crate::store::nodes::RELATIONSHIP_EXISTS, td, $map) {
                        tx.rollback().await.map_err($map)?;
                        let index = batch
                            .iter()
                            .position(|e| e.federates_with.iter().any(|f| f == td))
                            .unwrap_or(0);
                        return Ok(BatchCreate::NoRelationship {
                            index,
                            trust_domain: td.to_owned(),
                        });
                    }
                }
                for (index, name) in $crate::store::nodes::node_set_parents(batch) {
                    if !exists_in_tx!(tx, $crate::store::node_sets::NODE_SET_EXISTS, name, $map) {
                        tx.rollback().await.map_err($map)?;
                        return Ok(BatchCreate::NoNodeSet {
                            index,
                            name: name.to_owned(),
                        });
                    }
                }
                for e in batch {
                    for td in &e.federates_with {
                        sqlx::query($crate::store::nodes::INSERT_FEDERATES_WITH)
                            .bind(td)
                            .bind(&e.id)
                            .execute(&mut *tx)
                            .await
                            .map_err($map)?;
                    }
                    sqlx::query(
                        "INSERT INTO entries (id, spiffe_id, parent_id, selectors, ttl_seconds, \
                         dns_names, revision, created_at, jwt_ttl_seconds, federates_with) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                    )
                    .bind(&e.id)
                    .bind(&e.spiffe_id)
                    .bind(&e.parent_id)
                    .bind(json(&e.selectors)?)
                    .bind(e.ttl_seconds)
                    .bind(json(&e.dns_names)?)
                    .bind(rev)
                    .bind(e.created_at)
                    .bind(e.jwt_ttl_seconds)
                    .bind(json(&e.federates_with)?)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                }
                for parent in &parents {
                    sqlx::query(
                        $crate::store::nodes::TOUCH_PARENT,
                    )
                    .bind(*parent)
                    .bind(rev)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                    Self::notify_entries_in_tx(&mut tx, parent).await?;
                }
                tx.commit().await.map_err($map)?;
                for parent in &parents {
                    self.events.notify(parent);
                }
                let revision = revision(rev)?;
                Ok(BatchCreate::Created {
                    revision,
                    entries: batch
                        .iter()
                        .map(|e| EntryRow {
                            id: e.id.clone(),
                            spiffe_id: e.spiffe_id.clone(),
                            parent_id: e.parent_id.clone(),
                            selectors: e.selectors.clone(),
                            ttl_seconds: e.ttl_seconds,
                            dns_names: e.dns_names.clone(),
                            revision,
                            created_at: e.created_at,
                            jwt_ttl_seconds: e.jwt_ttl_seconds,
                            federates_with: e.federates_with.clone(),
                            owner: String::new(),
                            owner_scope: String::new(),
                        })
                        .collect(),
                })
            }

            async fn entry(
                &self,
                id: &str,
            ) -> Result<Option<$crate::store::nodes::EntryRow>, StoreError> {
                let row: Option<$crate::store::nodes::DbEntry> = sqlx::query_as(&format!(
                    "SELECT {} FROM entries WHERE id = $1",
                    $crate::store::nodes::ENTRY_COLUMNS
                ))
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .map_err($map)?;
                row.map(TryInto::try_into).transpose()
            }

            async fn entries_by_id(
                &self,
                ids: &[&str],
            ) -> Result<Vec<$crate::store::nodes::EntryRow>, StoreError> {
                // Bounded statements (and as many shapes for the statement cache) whatever
                // the caller sends: SignWorkloads allows 256 per call.
                const PER_QUERY: usize = 256;
                let mut out = Vec::with_capacity(ids.len());
                for chunk in ids.chunks(PER_QUERY) {
                    let sql = format!(
                        "SELECT {} FROM entries WHERE id IN ({})",
                        $crate::store::nodes::ENTRY_COLUMNS,
                        $crate::store::ca_slots::placeholders(1, chunk.len())
                    );
                    let mut q = sqlx::query_as::<_, $crate::store::nodes::DbEntry>(&sql);
                    for id in chunk {
                        q = q.bind(*id);
                    }
                    for row in q.fetch_all(&self.pool).await.map_err($map)? {
                        out.push(row.try_into()?);
                    }
                }
                Ok(out)
            }

            async fn list_entries(
                &self,
                parent_id: Option<&str>,
            ) -> Result<Vec<$crate::store::nodes::EntryRow>, StoreError> {
                let cols = $crate::store::nodes::ENTRY_COLUMNS;
                let rows: Vec<$crate::store::nodes::DbEntry> = match parent_id {
                    Some(p) => sqlx::query_as(&format!(
                        "SELECT {cols} FROM entries WHERE parent_id = $1 ORDER BY id"
                    ))
                    .bind(p)
                    .fetch_all(&self.pool)
                    .await
                    .map_err($map)?,
                    None => sqlx::query_as(&format!("SELECT {cols} FROM entries ORDER BY id"))
                        .fetch_all(&self.pool)
                        .await
                        .map_err($map)?,
                };
                rows.into_iter().map(TryInto::try_into).collect()
            }

            async fn delete_entry(&self, id: &str) -> Result<bool, StoreError> {
                let mut tx = self.begin_write().await?;
                let (rev,): (i64,) = sqlx::query_as(
                    $crate::store::nodes::NEXT_REVISION,
                )
                .fetch_one(&mut *tx)
                .await
                .map_err($map)?;
                let gone: Option<(String,)> =
                    sqlx::query_as("DELETE FROM entries WHERE id = $1 RETURNING parent_id")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($map)?;
                let Some((parent_id,)) = gone else {
                    // Nothing deleted: roll back, so the counter does not move either.
                    tx.rollback().await.map_err($map)?;
                    return Ok(false);
                };
                sqlx::query("DELETE FROM entry_federates_with WHERE entry_id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                sqlx::query(
                    $crate::store::nodes::TOUCH_PARENT,
                )
                .bind(&parent_id)
                .bind(rev)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                Self::notify_entries_in_tx(&mut tx, &parent_id).await?;
                tx.commit().await.map_err($map)?;
                self.events.notify(&parent_id);
                Ok(true)
            }

            async fn replace_entry_selectors(
                &self,
                id: &str,
                old: &[String],
                new: &[String],
            ) -> Result<bool, StoreError> {
                let (old, new) = (
                    $crate::store::nodes::json(old)?,
                    $crate::store::nodes::json(new)?,
                );
                let mut tx = self.begin_write().await?;
                let (rev,): (i64,) = sqlx::query_as(
                    $crate::store::nodes::NEXT_REVISION,
                )
                .fetch_one(&mut *tx)
                .await
                .map_err($map)?;
                let changed: Option<(String,)> = sqlx::query_as(
                    "UPDATE entries SET selectors = $1, revision = $2 \
                     WHERE id = $3 AND selectors = $4 RETURNING parent_id",
                )
                .bind(&new)
                .bind(rev)
                .bind(id)
                .bind(&old)
                .fetch_optional(&mut *tx)
                .await
                .map_err($map)?;
                let Some((parent_id,)) = changed else {
                    tx.rollback().await.map_err($map)?;
                    return Ok(false);
                };
                sqlx::query(
                    $crate::store::nodes::TOUCH_PARENT,
                )
                .bind(&parent_id)
                .bind(rev)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                Self::notify_entries_in_tx(&mut tx, &parent_id).await?;
                tx.commit().await.map_err($map)?;
                self.events.notify(&parent_id);
                Ok(true)
            }

            fn entry_events(&self) -> $crate::store::entry_events::EntryEvents {
                self.events.clone()
            }

            async fn entry_revision_of(&self, parents: &[&str]) -> Result<u64, StoreError> {
                let mut max = 0;
                for chunk in parents.chunks($crate::store::nodes::PARENTS_PER_QUERY) {
                    let sql = format!(
                        "SELECT MAX(revision) FROM node_revisions WHERE parent_id IN ({})",
                        $crate::store::ca_slots::placeholders(1, chunk.len())
                    );
                    let mut q = sqlx::query_as::<_, (Option<i64>,)>(&sql);
                    for p in chunk {
                        q = q.bind(*p);
                    }
                    let (found,) = q.fetch_one(&self.pool).await.map_err($map)?;
                    if let Some(r) = found {
                        max = max.max($crate::store::nodes::revision(r)?);
                    }
                }
                Ok(max)
            }

            async fn entries_for_parents_since(
                &self,
                parents: &[&str],
                known_revision: u64,
            ) -> Result<$crate::store::nodes::EntrySync, StoreError> {
                // The revision first, then the entries: entries newer than the revision only
                // make the next poll fetch again; the reverse order could hide a change.
                let rev = self.entry_revision_of(parents).await?;
                if rev == known_revision {
                    return Ok($crate::store::nodes::EntrySync {
                        revision: rev,
                        unchanged: true,
                        entries: Vec::new(),
                    });
                }
                let mut entries: Vec<$crate::store::nodes::EntryRow> = Vec::new();
                for chunk in parents.chunks($crate::store::nodes::PARENTS_PER_QUERY) {
                    let sql = format!(
                        "SELECT {} FROM entries WHERE parent_id IN ({})",
                        $crate::store::nodes::ENTRY_COLUMNS,
                        $crate::store::ca_slots::placeholders(1, chunk.len())
                    );
                    let mut q = sqlx::query_as::<_, $crate::store::nodes::DbEntry>(&sql);
                    for p in chunk {
                        q = q.bind(*p);
                    }
                    for row in q.fetch_all(&self.pool).await.map_err($map)? {
                        entries.push(row.try_into()?);
                    }
                }
                entries.sort_by(|a, b| a.id.cmp(&b.id));
                Ok($crate::store::nodes::EntrySync {
                    revision: rev,
                    unchanged: false,
                    entries,
                })
            }
        }
    };
}

pub(super) use impl_node_store;
