//! Node sets: named sets of nodes that a registration entry can name as its parent (issue 29).
//! The [`NodeSetStore`] part of the store; the rules (names, selectors, membership) are
//! `signet_types::node_set`, and who is a member is decided by the server at each use
//! (`crate::node_sets`), never stored.
//!
//! A set is immutable: created, listed, deleted (delete and create again to change one). An
//! entry names a set by the set's SPIFFE ID in `parent_id`, so its revision row in
//! `node_revisions` and its change notifications are keyed by that ID like a node's.
//!
//! Deleting a set and creating an entry under it cannot race: both take the entry revision
//! counter's row lock first (PostgreSQL; SQLite's write transaction holds the whole database),
//! the entry create checks that the set exists, the delete counts the set's entries, each
//! inside its transaction.

use async_trait::async_trait;

use super::error::StoreError;

/// A node set as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSetRow {
    pub name: String,
    /// The node selectors every member's attestation proved: sorted, at least one.
    pub selectors: Vec<String>,
    pub created_at: i64,
}

/// How [`NodeSetStore::delete_node_set`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSetDelete {
    Deleted,
    NotFound,
    /// `entries` entries still name the set as their parent; nothing was deleted.
    InUse {
        entries: u64,
    },
}

#[async_trait]
pub trait NodeSetStore: Send + Sync + 'static {
    /// Creates the set; false (nothing written) if the name is taken.
    async fn create_node_set(&self, set: &NodeSetRow) -> Result<bool, StoreError>;

    /// Every set, by name: one query (the node API reads it once per request).
    async fn list_node_sets(&self) -> Result<Vec<NodeSetRow>, StoreError>;

    async fn node_set(&self, name: &str) -> Result<Option<NodeSetRow>, StoreError>;

    /// Deletes the set `name` unless an entry names `parent_id` (its SPIFFE ID) as parent.
    async fn delete_node_set(
        &self,
        name: &str,
        parent_id: &str,
    ) -> Result<NodeSetDelete, StoreError>;

    /// How many entries each of `parent_ids` has (a parent without entries is left out).
    async fn entry_counts(
        &self,
        parent_ids: &[&str],
    ) -> Result<std::collections::HashMap<String, u64>, StoreError>;
}

/// The node set name an entry's `parent_id` names, if it names one
/// (`spiffe://<any td>/signet/nodeset/<name>`; entries are checked against the server's trust
/// domain before they are stored).
pub(crate) fn node_set_name_of_parent(parent_id: &str) -> Option<&str> {
    let rest = parent_id.strip_prefix("spiffe://")?;
    let path = &rest[rest.find('/')?..];
    let name = path.strip_prefix(signet_types::node_set::NODE_SET_PATH_PREFIX)?;
    signet_types::node_set::NodeSetName::new(name)
        .is_ok()
        .then_some(name)
}

/// Whether node set `$1` exists (a row, or none).
pub(crate) const NODE_SET_EXISTS: &str = "SELECT name FROM node_sets WHERE name = $1";

super::db_row! {
    /// A `node_sets` row as both drivers decode it.
    pub(super) struct DbNodeSet {
        name: String,
        selectors: String,
        created_at: i64,
    }
}

impl TryFrom<DbNodeSet> for NodeSetRow {
    type Error = StoreError;

    fn try_from(r: DbNodeSet) -> Result<Self, StoreError> {
        let selectors = serde_json::from_str(&r.selectors).map_err(|e| {
            StoreError::Corrupt(format!(
                "node set {}: selectors is not a JSON list: {e}",
                r.name
            ))
        })?;
        Ok(NodeSetRow {
            name: r.name,
            selectors,
            created_at: r.created_at,
        })
    }
}

/// Implements [`NodeSetStore`] for a store type with a `pool` field and a `begin_write` (see
/// `store::write_tx`); `$map` turns a `sqlx::Error` into a [`StoreError`]; `$lock` is what a
/// `SELECT` that must lock its rows appends (the backends' `LOCK_READ`).
macro_rules! impl_node_set_store {
    ($store:ty, $map:path, $lock:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::node_sets::NodeSetStore for $store {
            async fn create_node_set(
                &self,
                set: &$crate::store::node_sets::NodeSetRow,
            ) -> Result<bool, StoreError> {
                let selectors = $crate::store::nodes::json(&set.selectors)?;
                let mut tx = self.begin_write().await?;
                let done = sqlx::query(
                    "INSERT INTO node_sets (name, selectors, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (name) DO NOTHING",
                )
                .bind(&set.name)
                .bind(&selectors)
                .bind(set.created_at)
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(done.rows_affected() == 1)
            }

            async fn list_node_sets(
                &self,
            ) -> Result<Vec<$crate::store::node_sets::NodeSetRow>, StoreError> {
                let rows: Vec<$crate::store::node_sets::DbNodeSet> = sqlx::query_as(
                    "SELECT name, selectors, created_at FROM node_sets ORDER BY name",
                )
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                rows.into_iter().map(TryInto::try_into).collect()
            }

            async fn node_set(
                &self,
                name: &str,
            ) -> Result<Option<$crate::store::node_sets::NodeSetRow>, StoreError> {
                let row: Option<$crate::store::node_sets::DbNodeSet> = sqlx::query_as(
                    "SELECT name, selectors, created_at FROM node_sets WHERE name = $1",
                )
                .bind(name)
                .fetch_optional(&self.pool)
                .await
                .map_err($map)?;
                row.map(TryInto::try_into).transpose()
            }

            async fn delete_node_set(
                &self,
                name: &str,
                parent_id: &str,
            ) -> Result<$crate::store::node_sets::NodeSetDelete, StoreError> {
                use $crate::store::node_sets::NodeSetDelete;
                let mut tx = self.begin_write().await?;
                // The counter's lock orders this delete with every entry write (module doc).
                sqlx::query(&format!(
                    "SELECT value FROM entry_revision_seq WHERE id = 1{}",
                    $lock
                ))
                .execute(&mut *tx)
                .await
                .map_err($map)?;
                let (n,): (i64,) =
                    sqlx::query_as("SELECT COUNT(*) FROM entries WHERE parent_id = $1")
                        .bind(parent_id)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err($map)?;
                if n > 0 {
                    tx.rollback().await.map_err($map)?;
                    return Ok(NodeSetDelete::InUse {
                        entries: u64::try_from(n).unwrap_or(0),
                    });
                }
                let done = sqlx::query("DELETE FROM node_sets WHERE name = $1")
                    .bind(name)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                tx.commit().await.map_err($map)?;
                Ok(if done.rows_affected() == 1 {
                    NodeSetDelete::Deleted
                } else {
                    NodeSetDelete::NotFound
                })
            }

            async fn entry_counts(
                &self,
                parent_ids: &[&str],
            ) -> Result<std::collections::HashMap<String, u64>, StoreError> {
                let mut out = std::collections::HashMap::new();
                for chunk in parent_ids.chunks($crate::store::nodes::PARENTS_PER_QUERY) {
                    let sql = format!(
                        "SELECT parent_id, COUNT(*) FROM entries WHERE parent_id IN ({}) \
                         GROUP BY parent_id",
                        $crate::store::ca_slots::placeholders(1, chunk.len())
                    );
                    let mut q = sqlx::query_as::<_, (String, i64)>(&sql);
                    for p in chunk {
                        q = q.bind(*p);
                    }
                    for (p, n) in q.fetch_all(&self.pool).await.map_err($map)? {
                        out.insert(p, u64::try_from(n).unwrap_or(0));
                    }
                }
                Ok(out)
            }
        }
    };
}

pub(super) use impl_node_set_store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_names_a_node_set_only_under_the_node_set_path() {
        assert_eq!(
            node_set_name_of_parent("spiffe://example.org/signet/nodeset/k8s"),
            Some("k8s")
        );
        for p in [
            "spiffe://example.org/signet/node/k8s",
            "spiffe://example.org/signet/nodeset/",
            "spiffe://example.org/signet/nodeset/K8s",
            "spiffe://example.org/signet/nodeset/a/b",
            "spiffe://example.org",
            "k8s",
        ] {
            assert_eq!(node_set_name_of_parent(p), None, "{p}");
        }
    }
}
