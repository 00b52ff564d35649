//! Audit events (denials, admin actions, CA transitions): the [`AuditStore`] part of the store.
//!
//! Invariant: events keep the order they were recorded in; the store assigns increasing ids, and
//! readers page by id. A CA transition writes its events in its own transaction instead
//! (`store::ca_slots`), so a transition and its event commit together.
//!
//! The read is written once here ([`impl_audit_store`]); each backend supplies the batch insert
//! (one multi-row statement on PostgreSQL, one statement per row in a transaction on SQLite).

use async_trait::async_trait;

use super::error::StoreError;
use super::paging::{Order, PageToken};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// Assigned by the store; ignored on insert.
    pub id: u64,
    /// Unix seconds.
    pub at: i64,
    /// e.g. `issue.denied`, `issue.unauthenticated`, `admin.mint`.
    pub kind: String,
    pub caller: String,
    pub detail: String,
}

/// Which events a filtered listing keeps ([`AuditStore::audit_events_page`]); every field is
/// optional and they all must hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditFilter<'a> {
    /// A kind ([`KindFilter`]).
    pub kind: Option<KindFilter<'a>>,
    /// Events at or after this time (unix seconds).
    pub since: Option<i64>,
    /// Events of exactly this caller.
    pub caller: Option<&'a str>,
}

/// An audit kind to match: exactly, or every kind that starts with a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindFilter<'a> {
    Exact(&'a str),
    Prefix(&'a str),
}

impl<'a> KindFilter<'a> {
    /// The operator's spelling: a kind ending in `.` (`ca.`) or `*` (`ca.*`, `admin.node_*`)
    /// is a prefix (without the `*`); anything else an exact kind. None for an empty text.
    pub fn parse(text: &'a str) -> Option<Self> {
        match text {
            "" | "*" => None,
            t if t.ends_with('*') => Some(Self::Prefix(t.trim_end_matches('*'))),
            t if t.ends_with('.') => Some(Self::Prefix(t)),
            t => Some(Self::Exact(t)),
        }
    }
}

impl AuditFilter<'_> {
    /// The filters' canonical text, which a page token's fingerprint covers.
    fn canonical(&self) -> String {
        let kind = match self.kind {
            None => String::new(),
            Some(KindFilter::Exact(k)) => format!("={k}"),
            Some(KindFilter::Prefix(p)) => format!("^{p}"),
        };
        format!(
            "audit\0{kind}\0{}\0{}",
            self.since.map(|s| s.to_string()).unwrap_or_default(),
            self.caller.unwrap_or("")
        )
    }
}

/// One page of audit events to list.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuditQuery<'a> {
    pub filter: AuditFilter<'a>,
    pub order: Order,
    /// At most this many events (0: an empty page).
    pub limit: u32,
    /// Where the previous page ended ([`AuditPage::next`]); None: the first page.
    pub page_token: Option<&'a str>,
}

/// A page of events and, when more follow, the token for the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPage {
    pub events: Vec<AuditEvent>,
    /// None on the last page.
    pub next: Option<String>,
}

/// The token that continues an oldest-first listing of `filter` after event `id` (for the
/// older `after_id` requests).
pub fn page_after(filter: &AuditFilter<'_>, id: u64) -> String {
    PageToken::keyed(Order::OldestFirst, &filter.canonical(), id).encode()
}

/// One page of `q` from `store`: one keyset query on the event id for `limit + 1` events (the
/// extra one only tells whether a next page exists), the filters applied by the database
/// before the limit, so a filtered listing pages through every match. The token is good only
/// for the same filters and order ([`PageToken`]).
pub async fn audit_page<S: AuditStore + ?Sized>(
    store: &S,
    q: &AuditQuery<'_>,
) -> Result<AuditPage, StoreError> {
    let canonical = q.filter.canonical();
    let from = match q.page_token {
        Some(t) if !t.is_empty() => Some(PageToken::decode_keyed(
            t,
            "ListAuditEvents",
            q.order,
            &canonical,
            "different filters or order",
        )?),
        _ => None,
    };
    if q.limit == 0 {
        return Ok(AuditPage {
            events: Vec::new(),
            next: None,
        });
    }
    let mut events = store
        .audit_events_page(q.order, from, q.limit.saturating_add(1), &q.filter)
        .await?;
    let limit = usize::try_from(q.limit).unwrap_or(usize::MAX);
    let next = if events.len() > limit {
        events.truncate(limit);
        events
            .last()
            .map(|e| PageToken::keyed(q.order, &canonical, e.id).encode())
    } else {
        None
    };
    Ok(AuditPage { events, next })
}

#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// Appends `events` in order, all or nothing.
    async fn record_audit_events(&self, events: &[AuditEvent]) -> Result<(), StoreError>;

    /// Events with `id > after_id`, ascending, at most `limit` (tests; the admin API pages
    /// with [`audit_page`]).
    #[cfg(test)]
    async fn audit_events(&self, after_id: u64, limit: u32) -> Result<Vec<AuditEvent>, StoreError>;

    /// At most `limit` events that pass `filter`, by id: ascending after `from` (oldest
    /// first) or descending below it (newest first); `from` None starts at the first or the
    /// latest event. One keyset query; [`audit_page`] makes pages of it.
    async fn audit_events_page(
        &self,
        order: Order,
        from: Option<u64>,
        limit: u32,
        filter: &AuditFilter<'_>,
    ) -> Result<Vec<AuditEvent>, StoreError>;

    /// The newest `limit` events of one of `kinds` among the newest `window` events (by id),
    /// newest first: a backward walk of the primary key, bounded whatever the table holds.
    async fn newest_audit_events(
        &self,
        kinds: &[&str],
        window: u32,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, StoreError>;
}

/// Inserts one event (`$1`..`$4`: at, kind, caller, detail), for the row-by-row inserts: SQLite's
/// batch and a CA transition's own events (`store::ca_slots`).
pub(super) const INSERT_ONE: &str =
    "INSERT INTO audit_events (at, kind, caller, detail) VALUES ($1, $2, $3, $4)";

super::db_row! {
    /// An `audit_events` row as both drivers decode it.
    pub(super) struct DbAuditEvent {
        id: i64,
        at: i64,
        kind: String,
        caller: String,
        detail: String,
    }
}

impl TryFrom<DbAuditEvent> for AuditEvent {
    type Error = StoreError;

    fn try_from(r: DbAuditEvent) -> Result<Self, StoreError> {
        Ok(AuditEvent {
            id: u64::try_from(r.id)
                .map_err(|_| StoreError::Corrupt(format!("negative audit event id {}", r.id)))?,
            at: r.at,
            kind: r.kind,
            caller: r.caller,
            detail: r.detail,
        })
    }
}

/// Implements [`AuditStore`] for a backend with a `pool` field and an inherent
/// `async fn insert_audit_events(&self, &[AuditEvent]) -> Result<(), StoreError>` (the batch
/// insert, the one part that differs; never called with an empty batch).
macro_rules! impl_audit_store {
    ($store:ty, $map:path) => {
        #[async_trait::async_trait]
        impl $crate::store::audit::AuditStore for $store {
            async fn record_audit_events(
                &self,
                events: &[$crate::store::audit::AuditEvent],
            ) -> Result<(), StoreError> {
                if events.is_empty() {
                    return Ok(());
                }
                self.insert_audit_events(events).await
            }

            #[cfg(test)]
            async fn audit_events(
                &self,
                after_id: u64,
                limit: u32,
            ) -> Result<Vec<$crate::store::audit::AuditEvent>, StoreError> {
                use $crate::store::rows;
                let found: Vec<$crate::store::audit::DbAuditEvent> = sqlx::query_as(
                    "SELECT id, at, kind, caller, detail FROM audit_events \
                     WHERE id > $1 ORDER BY id LIMIT $2",
                )
                .bind(rows::after(after_id))
                .bind(rows::limit(limit))
                .fetch_all(&self.pool)
                .await
                .map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::audit::AuditEvent::try_from)
                    .collect()
            }

            async fn audit_events_page(
                &self,
                order: $crate::store::paging::Order,
                from: Option<u64>,
                limit: u32,
                filter: &$crate::store::audit::AuditFilter<'_>,
            ) -> Result<Vec<$crate::store::audit::AuditEvent>, StoreError> {
                use $crate::store::audit::KindFilter;
                use $crate::store::rows;
                enum Arg<'a> {
                    Int(i64),
                    Text(&'a str),
                }
                let newest = matches!(order, $crate::store::paging::Order::NewestFirst);
                let mut conds: Vec<String> = Vec::new();
                let mut args: Vec<Arg<'_>> = Vec::new();
                if let Some(id) = from {
                    args.push(Arg::Int(rows::after(id)));
                    conds.push(format!("id {} ${}", if newest { "<" } else { ">" }, args.len()));
                }
                match filter.kind {
                    None => {}
                    Some(KindFilter::Exact(k)) => {
                        args.push(Arg::Text(k));
                        conds.push(format!("kind = ${}", args.len()));
                    }
                    Some(KindFilter::Prefix(p)) => {
                        // substr, not LIKE: the same byte comparison on both databases,
                        // whatever the collation, and no wildcard characters to escape.
                        args.push(Arg::Int(i64::try_from(p.len()).unwrap_or(i64::MAX)));
                        args.push(Arg::Text(p));
                        conds.push(format!(
                            "substr(kind, 1, CAST(${} AS INTEGER)) = ${}",
                            args.len() - 1,
                            args.len()
                        ));
                    }
                }
                if let Some(since) = filter.since {
                    args.push(Arg::Int(since));
                    conds.push(format!("at >= ${}", args.len()));
                }
                if let Some(caller) = filter.caller {
                    args.push(Arg::Text(caller));
                    conds.push(format!("caller = ${}", args.len()));
                }
                args.push(Arg::Int(rows::limit(limit)));
                let sql = format!(
                    "SELECT id, at, kind, caller, detail FROM audit_events {}{}                      ORDER BY id {} LIMIT ${}",
                    if conds.is_empty() { "" } else { "WHERE " },
                    conds.join(" AND "),
                    if newest { "DESC" } else { "ASC" },
                    args.len()
                );
                let mut q = sqlx::query_as::<_, $crate::store::audit::DbAuditEvent>(&sql);
                for a in args {
                    q = match a {
                        Arg::Int(v) => q.bind(v),
                        Arg::Text(t) => q.bind(t),
                    };
                }
                let found = q.fetch_all(&self.pool).await.map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::audit::AuditEvent::try_from)
                    .collect()
            }

            async fn newest_audit_events(
                &self,
                kinds: &[&str],
                window: u32,
                limit: u32,
            ) -> Result<Vec<$crate::store::audit::AuditEvent>, StoreError> {
                use $crate::store::rows;
                if kinds.is_empty() || limit == 0 {
                    return Ok(Vec::new());
                }
                // `kind IN ($3, $4, …)`; `$1` is the window, `$2` the limit.
                let placeholders: Vec<String> =
                    (0..kinds.len()).map(|i| format!("${}", i + 3)).collect();
                let sql = format!(
                    "SELECT id, at, kind, caller, detail FROM audit_events \
                     WHERE id > (SELECT COALESCE(MAX(id), 0) FROM audit_events) - $1 \
                     AND kind IN ({}) ORDER BY id DESC LIMIT $2",
                    placeholders.join(", ")
                );
                let mut q = sqlx::query_as::<_, $crate::store::audit::DbAuditEvent>(&sql)
                    .bind(rows::limit(window))
                    .bind(rows::limit(limit));
                for k in kinds {
                    q = q.bind(*k);
                }
                let found = q.fetch_all(&self.pool).await.map_err($map)?;
                found
                    .into_iter()
                    .map($crate::store::audit::AuditEvent::try_from)
                    .collect()
            }
        }
    };
}

pub(super) use impl_audit_store;
