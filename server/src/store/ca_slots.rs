//! CA keys and their slots: the [`CaSlotStore`] part of the store (see `ca::manager`).
//!
//! Every change to the slots (a key prepared, activated, retired, removed, tainted) is one
//! [`CaChange`] applied in one transaction that first moves the single `ca_generation` row
//! from the generation the caller read to the next one (`UPDATE … WHERE gen = $expected`).
//! That UPDATE takes the row's lock (PostgreSQL) or the database's write lock (SQLite); a
//! concurrent replica's UPDATE waits for it, then re-evaluates its `WHERE` on the committed row
//! and matches nothing, so its (now stale) change is rolled back. Each transition therefore
//! happens exactly once across replicas sharing one database, and its audit events are written
//! in the same transaction: one transition, one event.
//!
//! The first root is created like any other key: as a [`CaChange`] under the generation rule,
//! so replicas starting together create it once. The older path, a bare insert into the `root`
//! slot (`StoredCaKey`, `insert_ca_key_if_absent`, losing to a concurrent one on the `slot`
//! unique constraint), is compiled for tests only: they use it to build a database as servers
//! from before slots wrote it, whose root the manager upgrades.
//!
//! The SQL is the same on both databases, so it is written once ([`impl_ca_slot_store`]).

use async_trait::async_trait;
use signet_types::ca_slot::SlotState;

use super::audit::AuditEvent;
use super::error::StoreError;

#[cfg(test)]
super::db_row! {
    /// A CA key as kept in the database. The private key is encrypted (see `ca::kek`).
    #[derive(Clone, PartialEq, Eq)]
    pub struct StoredCaKey {
        pub id: String,
        /// At most one key per slot (`root` for the generated root): the insert race's referee.
        pub slot: String,
        pub algorithm: String,
        pub cert_pem: String,
        pub encrypted_key: Vec<u8>,
        pub created_at: i64,
    }
}

#[cfg(test)]
impl std::fmt::Debug for StoredCaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCaKey")
            .field("id", &self.id)
            .field("slot", &self.slot)
            .field("algorithm", &self.algorithm)
            .field("encrypted_key", &"…")
            .finish_non_exhaustive()
    }
}

super::db_row! {
    /// A `ca_keys` row. The private key is sealed under the KEK (see `ca::kek`).
    #[derive(Clone, PartialEq, Eq)]
    pub struct CaSlotRow {
        pub id: String,
        /// Unique per row: `root` for the root generated before slots existed, the key ID since.
        pub slot: String,
        /// `root` or `intermediate`.
        pub kind: String,
        /// A [`SlotState`] as stored (`SlotState::as_str`). Read back as the text the database
        /// holds: the key manager vets it with the rest of the row, so one bad row is one
        /// rejected slot, not an unreadable table.
        pub state: String,
        /// The key that signed this one's certificate (intermediates).
        pub parent_id: Option<String>,
        pub algorithm: String,
        pub cert_pem: String,
        pub encrypted_key: Vec<u8>,
        /// When the key was created (prepared), unix seconds.
        pub created_at: i64,
        pub activated_at: Option<i64>,
        pub retired_at: Option<i64>,
        pub removed_at: Option<i64>,
        pub tainted_at: Option<i64>,
    }
}

impl std::fmt::Debug for CaSlotRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaSlotRow")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("state", &self.state)
            .field("parent_id", &self.parent_id)
            .field("tainted_at", &self.tainted_at)
            .field("encrypted_key", &"…")
            .finish_non_exhaustive()
    }
}

/// One change to a slot.
#[derive(Clone, PartialEq, Eq)]
pub enum SlotUpdate {
    /// Moves `id` to `state` (stamping `activated_at`, `retired_at` or `removed_at`; a slot is
    /// never moved back to prepared).
    State {
        id: String,
        state: SlotState,
        at: i64,
    },
    /// Marks `id` tainted (keeps an earlier taint's time).
    Taint { id: String, at: i64 },
    /// Replaces `id`'s sealed key (sealed again with its binding; empty: erased at removal).
    SealedKey { id: String, encrypted_key: Vec<u8> },
}

impl SlotUpdate {
    /// Erases `id`'s sealed key: a removed key is never opened again.
    pub fn erase_key(id: String) -> Self {
        SlotUpdate::SealedKey {
            id,
            encrypted_key: Vec::new(),
        }
    }
}

impl std::fmt::Debug for SlotUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotUpdate::State { id, state, at } => f
                .debug_struct("State")
                .field("id", id)
                .field("state", state)
                .field("at", at)
                .finish(),
            SlotUpdate::Taint { id, at } => f
                .debug_struct("Taint")
                .field("id", id)
                .field("at", at)
                .finish(),
            SlotUpdate::SealedKey { id, encrypted_key } => f
                .debug_struct("SealedKey")
                .field("id", id)
                .field("bytes", &encrypted_key.len())
                .finish(),
        }
    }
}

/// Everything one transition writes, applied all or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaChange {
    pub inserts: Vec<CaSlotRow>,
    pub updates: Vec<SlotUpdate>,
    /// Written in the same transaction (ids are assigned by the store).
    pub audit: Vec<AuditEvent>,
}

/// How many unexpired, unrevoked certificates a CA key issued, and when the last expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaKeyUsage {
    pub ca_key_id: String,
    pub unexpired: u64,
    /// Unix seconds.
    pub last_not_after: i64,
}

#[async_trait]
pub trait CaSlotStore: Send + Sync + 'static {
    /// The CA key in `slot`, if any.
    #[cfg(test)]
    async fn ca_key(&self, slot: &str) -> Result<Option<StoredCaKey>, StoreError>;

    /// Inserts `key` unless its slot is taken; returns whichever key holds the slot afterwards
    /// (ours, or the one a concurrent replica inserted first).
    #[cfg(test)]
    async fn insert_ca_key_if_absent(&self, key: &StoredCaKey) -> Result<StoredCaKey, StoreError>;

    /// The slot generation and every slot, oldest first. The generation is read first, so a
    /// change committed between the two reads makes a change based on them stale (never the
    /// reverse).
    async fn ca_slots(&self) -> Result<(u64, Vec<CaSlotRow>), StoreError>;

    /// Applies `change` if the generation is still `expected_generation`; returns whether it
    /// was applied (false: another replica changed the slots first; re-read and re-decide).
    async fn apply_ca_change(
        &self,
        expected_generation: u64,
        change: &CaChange,
    ) -> Result<bool, StoreError>;

    /// Per CA key: the unexpired (`not_after > now`), unrevoked certificates it issued. Reads
    /// every such row: for operator commands
    /// (`ca status`, `ca remove`), not for a periodic task; the rotator asks
    /// [`CaSlotStore::ca_keys_in_use`].
    async fn ca_key_usage(&self, now: i64) -> Result<Vec<CaKeyUsage>, StoreError>;

    /// The keys among `key_ids` that issued at least one unexpired (`not_after > now`),
    /// unrevoked certificate: [`CaSlotStore::ca_key_usage`]'s `unexpired > 0`, at one probe of
    /// `certificates_ca_key_not_after` per key, entered at `(key, now)` and stopping at the
    /// first unrevoked row, whatever the ledger's size (the rotator's tick asks this every
    /// `ca.rotation_interval`). It reads past the key's revoked unexpired rows first, so a key
    /// with many revoked certificates costs more (a partial index would not; not added, as
    /// building one in a migration exceeds the server's statement timeout on a large ledger).
    async fn ca_keys_in_use(&self, key_ids: &[String], now: i64)
    -> Result<Vec<String>, StoreError>;

    /// Who holds the unexpired, unrevoked certificates issued under `key_ids`: SPIFFE IDs with
    /// their counts, most first, at most `limit`.
    async fn ca_key_holders(
        &self,
        key_ids: &[String],
        now: i64,
        limit: u32,
    ) -> Result<Vec<(String, u64)>, StoreError>;

    /// After a taint: how many holders of unexpired, unrevoked certificates issued under
    /// `key_ids` have not replaced them yet. A holder is an identity as one caller obtained
    /// it (an agent for one of its entries, a workload for itself); it has replaced its
    /// certificate once a later unexpired, unrevoked certificate for the same SPIFFE ID, from
    /// the same caller or renewed from it, was issued by a key outside `tainted`. For
    /// `ca status`: it reads every unexpired certificate of those keys.
    async fn ca_key_holders_not_replaced(
        &self,
        key_ids: &[String],
        tainted: &[String],
        now: i64,
    ) -> Result<u64, StoreError>;
}

/// The `ca_keys` columns of a [`CaSlotRow`], in its fields' order.
pub(super) const CA_SLOT_COLUMNS: &str = "id, slot, kind, state, parent_id, algorithm, cert_pem, \
     encrypted_key, created_at, activated_at, retired_at, removed_at, tainted_at";

/// The `ca_keys` columns of a [`StoredCaKey`], in its fields' order.
#[cfg(test)]
pub(super) const CA_KEY_COLUMNS: &str = "id, slot, algorithm, cert_pem, encrypted_key, created_at";

/// `$first, $first+1, …` for `n` values.
pub(super) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Implements [`CaSlotStore`] for a backend with a `pool` field and an
/// `async fn begin_write(&self) -> Result<WriteTx, StoreError>` (see `store::write_tx`).
macro_rules! impl_ca_slot_store {
    ($store:ty, $map:path) => {
        #[async_trait::async_trait]
        impl $crate::store::ca_slots::CaSlotStore for $store {
            #[cfg(test)]
            async fn ca_key(
                &self,
                slot: &str,
            ) -> Result<Option<$crate::store::ca_slots::StoredCaKey>, StoreError> {
                use $crate::store::ca_slots::{CA_KEY_COLUMNS, StoredCaKey};
                sqlx::query_as::<_, StoredCaKey>(&format!(
                    "SELECT {CA_KEY_COLUMNS} FROM ca_keys WHERE slot = $1"
                ))
                .bind(slot)
                .fetch_optional(&self.pool)
                .await
                .map_err($map)
            }

            #[cfg(test)]
            async fn insert_ca_key_if_absent(
                &self,
                key: &$crate::store::ca_slots::StoredCaKey,
            ) -> Result<$crate::store::ca_slots::StoredCaKey, StoreError> {
                // ON CONFLICT waits for a concurrent inserter of the same slot to commit
                // (PostgreSQL; SQLite has one writer at a time), so the read below (a fresh
                // snapshot under READ COMMITTED) sees the winner.
                sqlx::query(
                    "INSERT INTO ca_keys (id, slot, algorithm, cert_pem, encrypted_key, \
                     created_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (slot) DO NOTHING",
                )
                .bind(&key.id)
                .bind(&key.slot)
                .bind(&key.algorithm)
                .bind(&key.cert_pem)
                .bind(&key.encrypted_key)
                .bind(key.created_at)
                .execute(&self.pool)
                .await
                .map_err($map)?;
                self.ca_key(&key.slot).await?.ok_or_else(|| {
                    StoreError::Database(format!("CA key slot {:?} empty after insert", key.slot))
                })
            }

            async fn ca_slots(
                &self,
            ) -> Result<(u64, Vec<$crate::store::ca_slots::CaSlotRow>), StoreError> {
                use $crate::store::ca_slots::{CA_SLOT_COLUMNS, CaSlotRow};
                use $crate::store::rows::count;
                let (generation,): (i64,) =
                    sqlx::query_as("SELECT gen FROM ca_generation WHERE id = 1")
                        .fetch_one(&self.pool)
                        .await
                        .map_err($map)?;
                let rows: Vec<CaSlotRow> = sqlx::query_as(&format!(
                    "SELECT {CA_SLOT_COLUMNS} FROM ca_keys ORDER BY created_at, id"
                ))
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                Ok((count(generation)?, rows))
            }

            async fn apply_ca_change(
                &self,
                expected_generation: u64,
                change: &$crate::store::ca_slots::CaChange,
            ) -> Result<bool, StoreError> {
                use $crate::store::ca_slots::SlotUpdate;
                let expected = i64::try_from(expected_generation)
                    .map_err(|_| StoreError::Database("CA slot generation out of range".into()))?;
                let mut tx = self.begin_write().await?;
                let moved =
                    sqlx::query("UPDATE ca_generation SET gen = gen + 1 WHERE id = 1 AND gen = $1")
                        .bind(expected)
                        .execute(&mut *tx)
                        .await
                        .map_err($map)?
                        .rows_affected();
                if moved != 1 {
                    tx.rollback().await.map_err($map)?;
                    return Ok(false);
                }
                for k in &change.inserts {
                    sqlx::query(
                        "INSERT INTO ca_keys (id, slot, kind, state, parent_id, algorithm, \
                         cert_pem, encrypted_key, created_at, activated_at, retired_at, \
                         removed_at, tainted_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                    )
                    .bind(&k.id)
                    .bind(&k.slot)
                    .bind(&k.kind)
                    .bind(&k.state)
                    .bind(&k.parent_id)
                    .bind(&k.algorithm)
                    .bind(&k.cert_pem)
                    .bind(&k.encrypted_key)
                    .bind(k.created_at)
                    .bind(k.activated_at)
                    .bind(k.retired_at)
                    .bind(k.removed_at)
                    .bind(k.tainted_at)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                }
                for u in &change.updates {
                    let done = match u {
                        SlotUpdate::State { id, state, at } => {
                            let column = match state {
                                ::signet_types::ca_slot::SlotState::Active => "activated_at",
                                ::signet_types::ca_slot::SlotState::Retired => "retired_at",
                                ::signet_types::ca_slot::SlotState::Removed => "removed_at",
                                other @ ::signet_types::ca_slot::SlotState::Prepared => {
                                    return Err(StoreError::Database(format!(
                                        "no CA slot transition to state {:?}",
                                        other.as_str()
                                    )));
                                }
                            };
                            sqlx::query(&format!(
                                "UPDATE ca_keys SET state = $1, {column} = $2 WHERE id = $3"
                            ))
                            .bind(state.as_str())
                            .bind(*at)
                            .bind(id)
                            .execute(&mut *tx)
                            .await
                        }
                        SlotUpdate::Taint { id, at } => {
                            sqlx::query(
                                "UPDATE ca_keys SET tainted_at = COALESCE(tainted_at, $1) \
                                 WHERE id = $2",
                            )
                            .bind(*at)
                            .bind(id)
                            .execute(&mut *tx)
                            .await
                        }
                        SlotUpdate::SealedKey { id, encrypted_key } => {
                            sqlx::query("UPDATE ca_keys SET encrypted_key = $1 WHERE id = $2")
                                .bind(encrypted_key)
                                .bind(id)
                                .execute(&mut *tx)
                                .await
                        }
                    }
                    .map_err($map)?;
                    if done.rows_affected() != 1 {
                        return Err(StoreError::Database(format!(
                            "CA slot change {u:?} matched no key"
                        )));
                    }
                }
                for e in &change.audit {
                    sqlx::query($crate::store::audit::INSERT_ONE)
                    .bind(e.at)
                    .bind(&e.kind)
                    .bind(&e.caller)
                    .bind(&e.detail)
                    .execute(&mut *tx)
                    .await
                    .map_err($map)?;
                }
                tx.commit().await.map_err($map)?;
                Ok(true)
            }

            async fn ca_key_usage(
                &self,
                now: i64,
            ) -> Result<Vec<$crate::store::ca_slots::CaKeyUsage>, StoreError> {
                use $crate::store::ca_slots::CaKeyUsage;
                use $crate::store::rows::count;
                let rows: Vec<(String, i64, i64)> = sqlx::query_as(
                    "SELECT ca_key_id, COUNT(*), MAX(not_after) FROM certificates \
                     WHERE not_after > $1 AND revoked_at IS NULL GROUP BY ca_key_id",
                )
                .bind(now)
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                rows.into_iter()
                    .map(|(ca_key_id, n, last)| {
                        Ok(CaKeyUsage {
                            ca_key_id,
                            unexpired: count(n)?,
                            last_not_after: last,
                        })
                    })
                    .collect()
            }

            async fn ca_keys_in_use(
                &self,
                key_ids: &[String],
                now: i64,
            ) -> Result<Vec<String>, StoreError> {
                let mut out = Vec::new();
                for id in key_ids {
                    // The first unrevoked row after `(id, now)` in the order of
                    // `certificates_ca_key_not_after`: the key is in use if that row is one of
                    // its own. Written as a row comparison with that `ORDER BY`, only that
                    // index can answer it, at any size and whatever the plan's parameters.
                    // (`ca_key_id = $1 AND not_after > $2` lets PostgreSQL's generic plan walk
                    // `certificates_not_after` or the table hoping for an early match: for a key
                    // with no unexpired certificate that read every unexpired row, 0.3-0.6 s at
                    // a million rows.) Past the key's own revoked rows it stops at the next
                    // key's first unrevoked row.
                    let next: Option<(String,)> = sqlx::query_as(
                        "SELECT ca_key_id FROM certificates \
                         WHERE (ca_key_id, not_after) > ($1, $2) AND revoked_at IS NULL \
                         ORDER BY ca_key_id, not_after LIMIT 1",
                    )
                    .bind(id)
                    .bind(now)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err($map)?;
                    if next.is_some_and(|(key,)| key == *id) {
                        out.push(id.clone());
                    }
                }
                Ok(out)
            }

            async fn ca_key_holders(
                &self,
                key_ids: &[String],
                now: i64,
                limit: u32,
            ) -> Result<Vec<(String, u64)>, StoreError> {
                use $crate::store::ca_slots::placeholders;
                use $crate::store::rows::count;
                if key_ids.is_empty() {
                    return Ok(Vec::new());
                }
                let sql = format!(
                    "SELECT spiffe_id, COUNT(*) FROM certificates \
                     WHERE not_after > $1 AND revoked_at IS NULL AND ca_key_id IN ({}) \
                     GROUP BY spiffe_id ORDER BY COUNT(*) DESC, spiffe_id LIMIT $2",
                    placeholders(3, key_ids.len())
                );
                let mut q = sqlx::query_as::<_, (String, i64)>(&sql)
                    .bind(now)
                    .bind(i64::from(limit));
                for id in key_ids {
                    q = q.bind(id);
                }
                let rows = q.fetch_all(&self.pool).await.map_err($map)?;
                rows.into_iter()
                    .map(|(id, n)| Ok((id, count(n)?)))
                    .collect()
            }

            async fn ca_key_holders_not_replaced(
                &self,
                key_ids: &[String],
                tainted: &[String],
                now: i64,
            ) -> Result<u64, StoreError> {
                use $crate::store::ca_slots::placeholders;
                use $crate::store::rows::count;
                if key_ids.is_empty() {
                    return Ok(0);
                }
                // `tainted` always holds `key_ids` (a key is counted only while tainted).
                let mut outside: Vec<&String> = key_ids.iter().collect();
                outside.extend(tainted.iter().filter(|t| !key_ids.contains(t)));
                let sql = format!(
                    "SELECT COUNT(*) FROM (SELECT DISTINCT c.spiffe_id, c.caller \
                     FROM certificates c \
                     WHERE c.not_after > $1 AND c.revoked_at IS NULL AND c.ca_key_id IN ({}) \
                     AND NOT EXISTS (SELECT 1 FROM certificates n \
                       WHERE n.spiffe_id = c.spiffe_id AND n.seq > c.seq \
                       AND (n.caller = c.caller OR n.renewed_from = c.serial) \
                       AND n.not_after > $1 AND n.revoked_at IS NULL \
                       AND n.ca_key_id NOT IN ({}))) AS holders",
                    placeholders(2, key_ids.len()),
                    placeholders(2 + key_ids.len(), outside.len())
                );
                let mut q = sqlx::query_as::<_, (i64,)>(&sql).bind(now);
                for id in key_ids {
                    q = q.bind(id);
                }
                for id in outside {
                    q = q.bind(id);
                }
                let (n,) = q.fetch_one(&self.pool).await.map_err($map)?;
                count(n)
            }
        }
    };
}

pub(crate) use impl_ca_slot_store;

#[cfg(test)]
mod tests {
    #[test]
    fn debug_never_prints_the_sealed_key() {
        let row = super::CaSlotRow {
            id: "k".into(),
            slot: "k".into(),
            kind: "root".into(),
            state: "active".into(),
            parent_id: None,
            algorithm: "EcdsaP256".into(),
            cert_pem: String::new(),
            encrypted_key: vec![0xAB; 8],
            created_at: 0,
            activated_at: None,
            retired_at: None,
            removed_at: None,
            tainted_at: None,
        };
        let text = format!("{row:?}");
        assert!(
            !text.contains("171") && !text.to_lowercase().contains("abab"),
            "{text}"
        );
    }

    #[test]
    fn placeholders_count_from_first() {
        assert_eq!(super::placeholders(3, 2), "$3, $4");
        assert_eq!(super::placeholders(1, 1), "$1");
    }
}
