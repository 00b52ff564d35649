//! The operator's node lifecycle: join tokens listed and revoked, nodes unbanned and deleted,
//! operator entries changed in place. The [`NodeAdminStore`] part of the store (under
//! [`super::NodeStore`]).
//!
//! Invariants, each kept inside one writing transaction:
//! - A join token is only ever shown by its id ([`token_id`], a prefix of its SHA-256, which is
//!   all the store keeps); a used token cannot be revoked (it already attested a node: ban or
//!   delete that node instead).
//! - Deleting a node takes the entry revision counter first (the lock every entry writer takes,
//!   `store::nodes`), so an entry created under the node concurrently is either counted (and
//!   the delete refused, or cascaded) or sees the node gone. The node's unused join tokens go
//!   with it, so a token made for it earlier cannot bring it back unnoticed; the node's parent
//!   revision moves and its watchers are woken, so its open streams re-check it and end.
//! - Updating an entry takes the counter first too, then refuses (writing nothing) an entry a
//!   registrar owns, one changed since the caller read it, or one that would become the same
//!   registration as another entry (the duplicate rule of `store::nodes`). Its old and new
//!   parents both take the new revision.

use async_trait::async_trait;

use super::error::StoreError;
use super::nodes::{EntryRow, NewEntry, NodeRow};

/// Hex characters of a join token's SHA-256 that name it ([`token_id`]).
pub const TOKEN_ID_LEN: usize = 16;
/// The shortest prefix of a token id [`NodeAdminStore::revoke_join_token`] accepts.
pub const MIN_TOKEN_ID_PREFIX: usize = 8;

/// A join token's id: the first [`TOKEN_ID_LEN`] hex characters of its hash.
pub fn token_id(token_hash: &str) -> &str {
    token_hash.get(..TOKEN_ID_LEN).unwrap_or(token_hash)
}

/// A stored join token (its hash only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTokenRow {
    /// Hex SHA-256 of the token.
    pub token_hash: String,
    pub node_id: String,
    pub created_at: i64,
    pub expires_at: i64,
    /// When it attested; None while unused.
    pub used_at: Option<i64>,
}

super::db_row! {
    /// A `join_tokens` row as both drivers decode it.
    pub(super) struct DbJoinToken {
        token_hash: String,
        node_id: String,
        created_at: i64,
        expires_at: i64,
        used_at: Option<i64>,
    }
}

impl From<DbJoinToken> for JoinTokenRow {
    fn from(r: DbJoinToken) -> Self {
        Self {
            token_hash: r.token_hash,
            node_id: r.node_id,
            created_at: r.created_at,
            expires_at: r.expires_at,
            used_at: r.used_at,
        }
    }
}

/// How [`NodeAdminStore::revoke_join_token`] went; only `Revoked` deleted anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRevoke {
    Revoked(JoinTokenRow),
    NotFound,
    /// The prefix names `matches` tokens.
    Ambiguous {
        matches: u64,
    },
    /// The token already attested its node.
    Used(JoinTokenRow),
}

/// How [`NodeAdminStore::delete_node`] went; only `Deleted` deleted anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeDelete {
    Deleted {
        /// The node as it was.
        node: NodeRow,
        /// Its entries deleted with it (cascade).
        entries: u64,
        /// Its unused join tokens deleted with it.
        tokens: u64,
    },
    NotFound,
    /// Entries name the node as parent, and the delete was not a cascade.
    HasEntries {
        entries: u64,
    },
}

/// How [`NodeAdminStore::update_entry`] went; only `Updated` wrote anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryUpdate {
    /// The entry as it is now, with its new revision.
    Updated(EntryRow),
    NotFound,
    /// A registrar keeps it.
    Owned {
        owner: String,
        owner_scope: String,
    },
    /// Its revision is no longer the one the update was made from.
    Changed {
        revision: u64,
    },
    /// The result is the same registration as the stored entry `existing_id`.
    Duplicate {
        existing_id: String,
    },
    /// It would federate with `trust_domain`, which has no federation relationship.
    NoRelationship {
        trust_domain: String,
    },
    /// Its parent would be node set `name`, which does not exist.
    NoNodeSet {
        name: String,
    },
}

#[async_trait]
pub trait NodeAdminStore: Send + Sync + 'static {
    /// Join tokens, newest first (all, or those of one node ID).
    async fn join_tokens(&self, node_id: Option<&str>) -> Result<Vec<JoinTokenRow>, StoreError>;

    /// Deletes the unused token whose hash starts with `id_prefix` (lowercase hex, at least
    /// [`MIN_TOKEN_ID_PREFIX`] characters: the caller checks), if exactly one does.
    async fn revoke_join_token(&self, id_prefix: &str) -> Result<TokenRevoke, StoreError>;

    /// Lifts the node's ban; None if no such node. A node that is not banned is unchanged.
    async fn unban_node(&self, node_id: &str) -> Result<Option<NodeRow>, StoreError>;

    /// Deletes the node and its unused join tokens; with `cascade` its entries too (one
    /// revision), else refused while it has any.
    async fn delete_node(&self, node_id: &str, cascade: bool) -> Result<NodeDelete, StoreError>;

    /// Replaces the operator's entry `entry.id` with `entry` (its `created_at` is kept) if
    /// its revision is still `expected_revision`, with a new revision on it and on its old and
    /// new parents.
    async fn update_entry(
        &self,
        entry: &NewEntry,
        expected_revision: u64,
    ) -> Result<EntryUpdate, StoreError>;
}

/// `join_tokens` columns, in [`DbJoinToken`]'s order.
pub(super) const TOKEN_COLUMNS: &str = "token_hash, node_id, created_at, expires_at, used_at";

/// Implements [`NodeAdminStore`] for a store with what `impl_node_store!` needs (`pool`,
/// `events`, `begin_write`, `notify_entries_in_tx`).
macro_rules! impl_node_admin_store {
    ($store:ty, $map:path) => {
        #[async_trait::async_trait]
        impl $crate::store::node_admin::NodeAdminStore for $store {
            async fn join_tokens(
                &self,
                node_id: Option<&str>,
            ) -> Result<Vec<$crate::store::node_admin::JoinTokenRow>, StoreError> {
                let cols = $crate::store::node_admin::TOKEN_COLUMNS;
                let rows: Vec<$crate::store::node_admin::DbJoinToken> = match node_id {
                    Some(n) => sqlx::query_as(&format!(
                        "SELECT {cols} FROM join_tokens WHERE node_id = $1 \
                         ORDER BY created_at DESC, token_hash"
                    ))
                    .bind(n)
                    .fetch_all(&self.pool)
                    .await
                    .map_err($map)?,
                    None => sqlx::query_as(&format!(
                        "SELECT {cols} FROM join_tokens ORDER BY created_at DESC, token_hash"
                    ))
                    .fetch_all(&self.pool)
                    .await
                    .map_err($map)?,
                };
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn revoke_join_token(
                &self,
                id_prefix: &str,
            ) -> Result<$crate::store::node_admin::TokenRevoke, StoreError> {
                use $crate::store::node_admin::{DbJoinToken, JoinTokenRow, TokenRevoke};
                let len = i64::try_from(id_prefix.len()).unwrap_or(i64::MAX);
                let mut tx = self.begin_write().await?;
                // At most two: enough to tell one from many.
                let found: Vec<DbJoinToken> = sqlx::query_as(&format!(
                    "SELECT {} FROM join_tokens \
                     WHERE substr(token_hash, 1, CAST($1 AS INTEGER)) = $2 LIMIT 2",
                    $crate::store::node_admin::TOKEN_COLUMNS
                ))
                .bind(len)
                .bind(id_prefix)
                .fetch_all(&mut *tx)
                .await
                .map_err($map)?;
                let row: JoinTokenRow =
                    match found.len() {
                        0 => {
                            tx.rollback().await.map_err($map)?;
                            return Ok(TokenRevoke::NotFound);
                        }
                        1 => found.into_iter().next().map(Into::into).ok_or_else(|| {
                            StoreError::Database("a join token row vanished".into())
                        })?,
                        _ => {
                            let (n,): (i64,) = sqlx::query_as(
                                "SELECT COUNT(*) FROM join_tokens \
                             WHERE substr(token_hash, 1, CAST($1 AS INTEGER)) = $2",
                            )
                            .bind(len)
                            .bind(id_prefix)
                            .fetch_one(&mut *tx)
                            .await
                            .map_err($map)?;
                            tx.rollback().await.map_err($map)?;
                            return Ok(TokenRevoke::Ambiguous {
                                matches: u64::try_from(n).unwrap_or(0),
                            });
                        }
                    };
                if row.used_at.is_some() {
                    tx.rollback().await.map_err($map)?;
                    return Ok(TokenRevoke::Used(row));
                }
                // `used_at IS NULL` again: an attestation that won the token meanwhile keeps it.
                let gone = sqlx::query(
                    "DELETE FROM join_tokens WHERE token_hash = $1 AND used_at IS NULL",
                )
                .bind(&row.token_hash)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                if gone.rows_affected() == 0 {
                    return Ok(TokenRevoke::Used(row));
                }
                Ok(TokenRevoke::Revoked(row))
            }

            async fn unban_node(
                &self,
                node_id: &str,
            ) -> Result<Option<$crate::store::nodes::NodeRow>, StoreError> {
                let mut tx = self.begin_write().await?;
                let row: Option<$crate::store::nodes::DbNode> = sqlx::query_as(&format!(
                    "UPDATE nodes SET banned_at = NULL WHERE node_id = $1 RETURNING {}",
                    $crate::store::nodes::NODE_COLUMNS
                ))
                .bind(node_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                row.map(TryInto::try_into).transpose()
            }

            async fn delete_node(
                &self,
                node_id: &str,
                cascade: bool,
            ) -> Result<$crate::store::node_admin::NodeDelete, StoreError> {
                use $crate::store::node_admin::NodeDelete;
                let mut tx = self.begin_write().await?;
                // The counter first, as every entry writer: no entry appears under the node
                // between the count below and the delete.
                let (rev,): (i64,) = sqlx::query_as($crate::store::nodes::NEXT_REVISION)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err($map)?;
                let node: Option<$crate::store::nodes::DbNode> = sqlx::query_as(&format!(
                    "SELECT {} FROM nodes WHERE node_id = $1",
                    $crate::store::nodes::NODE_COLUMNS
                ))
                .bind(node_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err($map)?;
                let Some(node) = node else {
                    tx.rollback().await.map_err($map)?;
                    return Ok(NodeDelete::NotFound);
                };
                let node: $crate::store::nodes::NodeRow = node.try_into()?;
                let (entries,): (i64,) =
                    sqlx::query_as("SELECT COUNT(*) FROM entries WHERE parent_id = $1")
                        .bind(&node.spiffe_id)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err($map)?;
                let entries = u64::try_from(entries).unwrap_or(0);
                if entries > 0 && !cascade {
                    tx.rollback().await.map_err($map)?;
                    return Ok(NodeDelete::HasEntries { entries });
                }
                if entries > 0 {
                    sqlx::query(
                        "DELETE FROM entry_federates_with WHERE entry_id IN \
                         (SELECT id FROM entries WHERE parent_id = $1)",
                    )
                    .bind(&node.spiffe_id)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                    sqlx::query("DELETE FROM entries WHERE parent_id = $1")
                        .bind(&node.spiffe_id)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                }
                let tokens =
                    sqlx::query("DELETE FROM join_tokens WHERE node_id = $1 AND used_at IS NULL")
                        .bind(node_id)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?
                        .rows_affected();
                sqlx::query("DELETE FROM nodes WHERE node_id = $1")
                    .bind(node_id)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                // The node's revision moves and its watchers wake: an open stream re-checks
                // the node, finds it gone and ends.
                sqlx::query($crate::store::nodes::TOUCH_PARENT)
                    .bind(&node.spiffe_id)
                    .bind(rev)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                Self::notify_entries_in_tx(&mut tx, &node.spiffe_id).await?;
                tx.commit().await.map_err($map)?;
                self.events.notify(&node.spiffe_id);
                Ok(NodeDelete::Deleted {
                    node,
                    entries,
                    tokens,
                })
            }

            async fn update_entry(
                &self,
                e: &$crate::store::nodes::NewEntry,
                expected_revision: u64,
            ) -> Result<$crate::store::node_admin::EntryUpdate, StoreError> {
                use $crate::store::node_admin::EntryUpdate;
                use $crate::store::nodes::{
                    json, registration_selectors, revision, stored_registration_selectors,
                };
                let mut tx = self.begin_write().await?;
                // The counter first: it orders this write after every other entry writer, so
                // the checks below see every committed entry.
                let (rev,): (i64,) = sqlx::query_as($crate::store::nodes::NEXT_REVISION)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err($map)?;
                let stored: Option<(String, i64, i64, String, String)> = sqlx::query_as(
                    "SELECT parent_id, revision, created_at, owner, owner_scope \
                     FROM entries WHERE id = $1",
                )
                .bind(&e.id)
                .fetch_optional(&mut *tx)
                .await
                .map_err($map)?;
                let Some((old_parent, old_rev, created_at, owner, owner_scope)) = stored else {
                    tx.rollback().await.map_err($map)?;
                    return Ok(EntryUpdate::NotFound);
                };
                if !owner.is_empty() {
                    tx.rollback().await.map_err($map)?;
                    return Ok(EntryUpdate::Owned { owner, owner_scope });
                }
                let old_rev = revision(old_rev)?;
                if old_rev != expected_revision {
                    tx.rollback().await.map_err($map)?;
                    return Ok(EntryUpdate::Changed { revision: old_rev });
                }
                let same_id: Vec<(String, String)> = sqlx::query_as(
                    "SELECT id, selectors FROM entries WHERE parent_id = $1 AND spiffe_id = $2 \
                     AND id <> $3 ORDER BY id",
                )
                .bind(&e.parent_id)
                .bind(&e.spiffe_id)
                .bind(&e.id)
                .fetch_all(&mut *tx)
                .await
                .map_err($map)?;
                let wanted = registration_selectors(&e.selectors);
                for (id, sel) in same_id {
                    if stored_registration_selectors(&id, &sel)? == wanted {
                        tx.rollback().await.map_err($map)?;
                        return Ok(EntryUpdate::Duplicate { existing_id: id });
                    }
                }
                for td in &e.federates_with {
                    if !exists_in_tx!(tx, $crate::store::nodes::RELATIONSHIP_EXISTS, td, $map) {
                        tx.rollback().await.map_err($map)?;
                        return Ok(EntryUpdate::NoRelationship {
                            trust_domain: td.clone(),
                        });
                    }
                }
                if let Some(name) = $crate::store::node_sets::node_set_name_of_parent(&e.parent_id)
                {
                    if !exists_in_tx!(tx, $crate::store::node_sets::NODE_SET_EXISTS, name, $map) {
                        tx.rollback().await.map_err($map)?;
                        return Ok(EntryUpdate::NoNodeSet {
                            name: name.to_owned(),
                        });
                    }
                }
                sqlx::query(
                    "UPDATE entries SET spiffe_id = $1, parent_id = $2, selectors = $3, \
                     ttl_seconds = $4, dns_names = $5, jwt_ttl_seconds = $6, \
                     federates_with = $7, revision = $8 WHERE id = $9",
                )
                .bind(&e.spiffe_id)
                .bind(&e.parent_id)
                .bind(json(&e.selectors)?)
                .bind(e.ttl_seconds)
                .bind(json(&e.dns_names)?)
                .bind(e.jwt_ttl_seconds)
                .bind(json(&e.federates_with)?)
                .bind(rev)
                .bind(&e.id)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                sqlx::query("DELETE FROM entry_federates_with WHERE entry_id = $1")
                    .bind(&e.id)
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
                let mut parents = vec![old_parent.as_str()];
                if e.parent_id != old_parent {
                    parents.push(e.parent_id.as_str());
                }
                for parent in &parents {
                    sqlx::query($crate::store::nodes::TOUCH_PARENT)
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
                Ok(EntryUpdate::Updated($crate::store::nodes::EntryRow {
                    id: e.id.clone(),
                    spiffe_id: e.spiffe_id.clone(),
                    parent_id: e.parent_id.clone(),
                    selectors: e.selectors.clone(),
                    ttl_seconds: e.ttl_seconds,
                    dns_names: e.dns_names.clone(),
                    revision: revision(rev)?,
                    created_at,
                    jwt_ttl_seconds: e.jwt_ttl_seconds,
                    federates_with: e.federates_with.clone(),
                    owner: String::new(),
                    owner_scope: String::new(),
                }))
            }
        }
    };
}

pub(super) use impl_node_admin_store;
