//! Entries a registrar owns: the [`RegistrationStore`] part of the store.
//!
//! An owned entry is an ordinary `entries` row whose `owner` is the registrar's SPIFFE ID and
//! whose `owner_scope` is the registrar's name for the object it came from (migration 0012).
//! These queries only ever read or write rows of one non-empty owner: the operator's entries
//! (owner '') and other registrars' are never read nor changed here.
//!
//! A sync ([`RegistrationStore::sync_owned_entries`]) makes one (owner, scope) exactly a list
//! of entries, in one writing transaction: the entry revision counter is taken first (its row
//! lock on PostgreSQL, the write lock on SQLite, orders it after every other entry writer, so
//! two syncs of one scope apply one after the other and the last one wins), the scope's rows
//! are diffed against the list by registration (SPIFFE ID, parent, sorted selectors: the
//! duplicate rule of `store::nodes`), and new rows are inserted, changed ones updated in place
//! (same id) and the rest deleted, with their `entry_federates_with` rows. The whole change
//! takes that one revision, stamped on every written row and on every parent it touched
//! (`node_revisions`, with the same notification as `create_entry`); a sync that changes
//! nothing rolls back, so the counter does not move.

use async_trait::async_trait;

use super::error::StoreError;
use super::nodes::{EntryRow, NewEntry};

/// What a sync did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncOutcome {
    /// The entries' ids, in the order of the desired list (an unchanged or updated entry keeps
    /// its id; a created one has the id it was given).
    pub entry_ids: Vec<String>,
    pub created: u32,
    pub updated: u32,
    pub deleted: u32,
    pub unchanged: u32,
    /// The revision the change took; 0 when nothing changed (and nothing was written).
    pub revision: u64,
}

impl SyncOutcome {
    /// Whether anything was written.
    pub fn changed(&self) -> bool {
        self.revision != 0
    }
}

/// How [`RegistrationStore::sync_owned_entries`] went; only `Synced` wrote anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncResult {
    Synced(SyncOutcome),
    /// The owner would keep `would_own` entries after the sync, more than `max`.
    TooMany {
        would_own: u64,
        max: u32,
    },
    /// Desired entry `index` federates with `trust_domain`, which has no federation
    /// relationship.
    NoRelationship {
        index: usize,
        trust_domain: String,
    },
    /// Desired entry `index` (the first such written) names node set `name`, which does not
    /// exist (checked inside the sync's transaction, under the lock `delete_node_set` takes:
    /// `store::node_sets`).
    NoNodeSet {
        index: usize,
        name: String,
    },
}

#[async_trait]
pub trait RegistrationStore: Send + Sync + 'static {
    /// Makes `owner`'s entries in `scope` exactly `desired` (see the module docs), keeping at
    /// most `max_owned` entries for `owner` over all its scopes. `desired` holds no two
    /// entries of one registration (the caller checked); each new entry's `id` and
    /// `created_at` are used only if it is created. `owner` must not be empty.
    async fn sync_owned_entries(
        &self,
        owner: &str,
        scope: &str,
        desired: &[NewEntry],
        max_owned: u32,
    ) -> Result<SyncResult, StoreError>;

    /// `owner`'s entries, of one scope or all, by scope then id.
    /// Every one of the owner's entries (in `scope`, if given): for tests.
    #[cfg(test)]
    async fn list_owned_entries(
        &self,
        owner: &str,
        scope: Option<&str>,
    ) -> Result<Vec<EntryRow>, StoreError> {
        self.list_owned_entries_page(owner, scope, None, i64::MAX)
            .await
    }

    /// At most `limit` of the owner's entries (in `scope`, if given) after `after` (a
    /// `(scope, id)` already seen), sorted by scope then id.
    async fn list_owned_entries_page(
        &self,
        owner: &str,
        scope: Option<&str>,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<EntryRow>, StoreError>;

    /// Those of `names` that are node sets in the database (a row of `node_sets`).
    async fn existing_node_sets(&self, names: &[&str]) -> Result<Vec<String>, StoreError>;
}

/// The registration key of an entry: SPIFFE ID, parent, sorted selectors.
pub(super) fn key_of(spiffe_id: &str, parent_id: &str, selectors: &[String]) -> RegKey {
    (
        spiffe_id.to_owned(),
        parent_id.to_owned(),
        super::nodes::registration_selectors(selectors),
    )
}

pub(super) type RegKey = (String, String, Vec<String>);

/// Whether a stored row already says what `want` says (the fields a sync may change).
pub(super) fn same_content(row: &EntryRow, want: &NewEntry) -> bool {
    let mut dns = want.dns_names.clone();
    dns.sort();
    let mut have = row.dns_names.clone();
    have.sort();
    row.ttl_seconds == want.ttl_seconds
        && have == dns
        && row.jwt_ttl_seconds == want.jwt_ttl_seconds
        && row.federates_with == want.federates_with
}

pub(super) fn empty_owner() -> StoreError {
    StoreError::Database(
        "an owned entry needs a non-empty owner (the operator's entries are not a registrar's)"
            .into(),
    )
}

/// Implements [`RegistrationStore`] for a store type with what `impl_node_store!` needs (a
/// `pool`, an `events` field, `begin_write` and `notify_entries_in_tx`); `$map` turns a
/// `sqlx::Error` into a [`StoreError`].
macro_rules! impl_registration_store {
    ($store:ty, $map:path) => {
        #[async_trait::async_trait]
        impl $crate::store::registration::RegistrationStore for $store {
            async fn sync_owned_entries(
                &self,
                owner: &str,
                scope: &str,
                desired: &[$crate::store::nodes::NewEntry],
                max_owned: u32,
            ) -> Result<$crate::store::registration::SyncResult, StoreError> {
                use $crate::store::nodes::{DbEntry, ENTRY_COLUMNS, EntryRow, json};
                use $crate::store::registration::{SyncOutcome, SyncResult, key_of, same_content};
                if owner.is_empty() {
                    return Err($crate::store::registration::empty_owner());
                }
                let mut tx = self.begin_write().await?;
                // The counter first: it orders this sync after every other entry writer
                // (PostgreSQL's row lock; SQLite's IMMEDIATE transaction holds the write lock
                // already), so the scope read below is what the last writer left.
                let (rev,): (i64,) = sqlx::query_as($crate::store::nodes::NEXT_REVISION)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err($map)?;
                let rows: Vec<DbEntry> = sqlx::query_as(&format!(
                    "SELECT {ENTRY_COLUMNS} FROM entries WHERE owner = $1 AND owner_scope = $2 \
                     ORDER BY id"
                ))
                .bind(owner)
                .bind(scope)
                .fetch_all(&mut *tx)
                .await
                .map_err($map)?;
                let stored_count = rows.len() as u64;
                let mut stored = std::collections::HashMap::with_capacity(rows.len());
                for r in rows {
                    let row = EntryRow::try_from(r)?;
                    stored.insert(key_of(&row.spiffe_id, &row.parent_id, &row.selectors), row);
                }
                let mut out = SyncOutcome::default();
                let mut creates: Vec<usize> = Vec::new();
                let mut updates: Vec<(usize, String)> = Vec::new();
                for (i, want) in desired.iter().enumerate() {
                    match stored.remove(&key_of(&want.spiffe_id, &want.parent_id, &want.selectors))
                    {
                        Some(row) if same_content(&row, want) => {
                            out.unchanged += 1;
                            out.entry_ids.push(row.id);
                        }
                        Some(row) => {
                            out.updated += 1;
                            out.entry_ids.push(row.id.clone());
                            updates.push((i, row.id));
                        }
                        None => {
                            out.created += 1;
                            out.entry_ids.push(want.id.clone());
                            creates.push(i);
                        }
                    }
                }
                // What is left of the scope is no longer wanted.
                let mut deletes: Vec<EntryRow> = stored.into_values().collect();
                deletes.sort_by(|a, b| a.id.cmp(&b.id));
                out.deleted = u32::try_from(deletes.len()).unwrap_or(u32::MAX);
                if creates.is_empty() && updates.is_empty() && deletes.is_empty() {
                    // Nothing to write: roll back, so the counter does not move either.
                    tx.rollback().await.map_err($map)?;
                    return Ok(SyncResult::Synced(out));
                }
                let (owned,): (i64,) =
                    sqlx::query_as("SELECT COUNT(*) FROM entries WHERE owner = $1")
                        .bind(owner)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err($map)?;
                let would_own = u64::try_from(owned)
                    .unwrap_or(0)
                    .saturating_sub(stored_count)
                    .saturating_add(desired.len() as u64);
                if would_own > u64::from(max_owned) {
                    tx.rollback().await.map_err($map)?;
                    return Ok(SyncResult::TooMany {
                        would_own,
                        max: max_owned,
                    });
                }
                let written: Vec<usize> = creates
                    .iter()
                    .copied()
                    .chain(updates.iter().map(|(i, _)| *i))
                    .collect();
                // A node set deleted since the caller looked must not get entries (a set
                // created again under its name would serve them to other nodes).
                for i in &written {
                    let Some(name) =
                        $crate::store::node_sets::node_set_name_of_parent(&desired[*i].parent_id)
                    else {
                        continue;
                    };
                    if !exists_in_tx!(tx, $crate::store::node_sets::NODE_SET_EXISTS, name, $map) {
                        tx.rollback().await.map_err($map)?;
                        return Ok(SyncResult::NoNodeSet {
                            index: *i,
                            name: name.to_owned(),
                        });
                    }
                }
                let mut named: Vec<&str> = written
                    .iter()
                    .flat_map(|i| desired[*i].federates_with.iter().map(String::as_str))
                    .collect();
                named.sort_unstable();
                named.dedup();
                for td in named {
                    if !exists_in_tx!(tx, $crate::store::nodes::RELATIONSHIP_EXISTS, td, $map) {
                        tx.rollback().await.map_err($map)?;
                        let index = written
                            .iter()
                            .copied()
                            .filter(|i| desired[*i].federates_with.iter().any(|f| f == td))
                            .min()
                            .unwrap_or(0);
                        return Ok(SyncResult::NoRelationship {
                            index,
                            trust_domain: td.to_owned(),
                        });
                    }
                }
                let mut parents: Vec<String> = Vec::new();
                for row in &deletes {
                    sqlx::query("DELETE FROM entry_federates_with WHERE entry_id = $1")
                        .bind(&row.id)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                    sqlx::query("DELETE FROM entries WHERE id = $1 AND owner = $2")
                        .bind(&row.id)
                        .bind(owner)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                    parents.push(row.parent_id.clone());
                }
                for (i, id) in &updates {
                    let e = &desired[*i];
                    sqlx::query(
                        "UPDATE entries SET ttl_seconds = $1, dns_names = $2, \
                         jwt_ttl_seconds = $3, federates_with = $4, revision = $5 \
                         WHERE id = $6 AND owner = $7",
                    )
                    .bind(e.ttl_seconds)
                    .bind(json(&e.dns_names)?)
                    .bind(e.jwt_ttl_seconds)
                    .bind(json(&e.federates_with)?)
                    .bind(rev)
                    .bind(id)
                    .bind(owner)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                    sqlx::query("DELETE FROM entry_federates_with WHERE entry_id = $1")
                        .bind(id)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?;
                    for td in &e.federates_with {
                        sqlx::query($crate::store::nodes::INSERT_FEDERATES_WITH)
                            .bind(td)
                            .bind(id)
                            .execute(&mut *tx)
                            .await
                            .map_err($map)?;
                    }
                    parents.push(e.parent_id.clone());
                }
                for i in &creates {
                    let e = &desired[*i];
                    sqlx::query(
                        "INSERT INTO entries (id, spiffe_id, parent_id, selectors, ttl_seconds, \
                         dns_names, revision, created_at, jwt_ttl_seconds, federates_with, \
                         owner, owner_scope) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
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
                    .bind(owner)
                    .bind(scope)
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
                    parents.push(e.parent_id.clone());
                }
                parents.sort_unstable();
                parents.dedup();
                for parent in &parents {
                    sqlx::query($crate::store::nodes::TOUCH_PARENT)
                        .bind(parent)
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
                out.revision = $crate::store::nodes::revision(rev)?;
                Ok(SyncResult::Synced(out))
            }

            async fn list_owned_entries_page(
                &self,
                owner: &str,
                scope: Option<&str>,
                after: Option<(&str, &str)>,
                limit: i64,
            ) -> Result<Vec<$crate::store::nodes::EntryRow>, StoreError> {
                use $crate::store::nodes::{DbEntry, ENTRY_COLUMNS};
                if owner.is_empty() {
                    return Err($crate::store::registration::empty_owner());
                }
                // A scope is never empty, so '' means "no filter" and "from the start".
                let (after_scope, after_id) = after.unwrap_or(("", ""));
                let rows: Vec<DbEntry> = sqlx::query_as(&format!(
                    "SELECT {ENTRY_COLUMNS} FROM entries WHERE owner = $1 \
                     AND ($2 = '' OR owner_scope = $3) \
                     AND (owner_scope > $4 OR (owner_scope = $5 AND id > $6)) \
                     ORDER BY owner_scope, id LIMIT $7"
                ))
                .bind(owner)
                .bind(scope.unwrap_or(""))
                .bind(scope.unwrap_or(""))
                .bind(after_scope)
                .bind(after_scope)
                .bind(after_id)
                .bind(limit)
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                rows.into_iter().map(TryInto::try_into).collect()
            }

            async fn existing_node_sets(&self, names: &[&str]) -> Result<Vec<String>, StoreError> {
                if names.is_empty() {
                    return Ok(Vec::new());
                }
                let sql = format!(
                    "SELECT name FROM node_sets WHERE name IN ({}) ORDER BY name",
                    $crate::store::ca_slots::placeholders(1, names.len())
                );
                let mut q = sqlx::query_as::<_, (String,)>(&sql);
                for n in names {
                    q = q.bind(*n);
                }
                let rows = q.fetch_all(&self.pool).await.map_err($map)?;
                Ok(rows.into_iter().map(|(n,)| n).collect())
            }
        }
    };
}

pub(super) use impl_registration_store;
