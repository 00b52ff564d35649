//! Entry-change notifications: which parents' registration entries changed, for the node
//! streams (`WatchEntries`, in `api::node_watch`). This module owns how a change reaches every
//! replica's streams.
//!
//! - Every entry write (create, batch create, delete) calls [`EntryEvents::notify`] for each
//!   parent it touched, after its commit: this replica's streams wake at once.
//! - On PostgreSQL the same transaction also sends `pg_notify('signet_entries', parent)`, which
//!   PostgreSQL delivers to every listener when (and only if) it commits. A listener task,
//!   started on the first subscription, feeds those into the hub, so every replica learns of a
//!   change made through any other. It reconnects with jittered capped backoff, and after any
//!   gap (a lost connection, a failed reconnect) it wakes every subscriber, since PostgreSQL
//!   does not keep notifications for an absent listener.
//! - SQLite is one process: the in-process call is the whole story.
//!
//! - A node set's parent (`spiffe://<td>/signet/nodeset/<name>`, see `store::node_sets`) is
//!   watched by nobody directly: its entries reach every member node, and membership is the
//!   store's rows as they are when a stream reads them. So a notification for a node set wakes
//!   every subscription of this replica (one shared counter), and each woken stream re-reads
//!   its node's effective revision; a non-member finds it unchanged and sends nothing. Node
//!   set entries change seldom (an operator, the bridge), so this costs one read per open
//!   stream per coalesced burst of such changes, and never a per-set table of subscribers
//!   that a membership change could leave stale.
//!
//! Invariant: a notification only wakes; it never carries a revision. The woken stream re-reads
//! the parent's revision from the store, so a duplicate, late, spurious or lost notification
//! costs at most one indexed read or one safety-net interval, and can never put a wrong
//! revision on the wire. Memory is bounded by the number of open subscriptions: one
//! `watch` slot (a counter) per watched parent, removed when its last subscriber goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

use signet_runtime::backoff::Backoff;
use signet_runtime::random::{Random, SystemRandom};
use tokio::sync::watch;

/// The PostgreSQL channel entry writes notify on; the payload is the parent's SPIFFE ID.
pub(super) const PG_CHANNEL: &str = "signet_entries";

/// How the listener retries a lost PostgreSQL connection.
const RECONNECT: Backoff = Backoff::full(Duration::from_millis(200), Duration::from_secs(30))
    .with_floor(Duration::from_millis(100));

/// Starts the cross-replica feed for a hub (PostgreSQL's listener), once.
type Starter = Box<dyn Fn(Weak<Hub>) + Send + Sync>;

/// The per-replica hub of entry-change notifications. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct EntryEvents {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for EntryEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryEvents")
            .field("watched_parents", &self.hub.watched())
            .finish()
    }
}

pub struct Hub {
    /// Parent SPIFFE ID -> a wake counter, only while someone watches that parent.
    parents: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// The wake counter of every node set's parent: each subscription holds a receiver.
    node_sets: watch::Sender<u64>,
    start: Option<Starter>,
    started: Once,
}

impl Hub {
    fn watched(&self) -> usize {
        self.parents.lock().map_or(0, |p| p.len())
    }

    fn wake(&self, parent: &str) {
        if is_node_set_parent(parent) {
            self.node_sets.send_modify(|n| *n = n.wrapping_add(1));
            return;
        }
        if let Ok(p) = self.parents.lock()
            && let Some(tx) = p.get(parent)
        {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn wake_all(&self) {
        self.node_sets.send_modify(|n| *n = n.wrapping_add(1));
        if let Ok(p) = self.parents.lock() {
            for tx in p.values() {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }
}

/// Whether `parent` is a node set's SPIFFE ID (`…/signet/nodeset/<name>`, any trust domain:
/// only the own one is ever stored).
fn is_node_set_parent(parent: &str) -> bool {
    super::node_sets::node_set_name_of_parent(parent).is_some()
}

/// Refused: the parent already has as many subscriptions as allowed here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyWatchers {
    pub limit: usize,
}

impl EntryEvents {
    /// In-process only (SQLite, tests).
    pub fn local() -> Self {
        Self::with_starter(None)
    }

    fn with_starter(start: Option<Starter>) -> Self {
        Self {
            hub: Arc::new(Hub {
                parents: Mutex::new(HashMap::new()),
                node_sets: watch::channel(0).0,
                start,
                started: Once::new(),
            }),
        }
    }

    /// In-process, plus every replica's `pg_notify` through a `LISTEN` connection of `pool`
    /// (opened on the first subscription, so a store nobody watches holds no extra session).
    pub fn postgres(pool: sqlx::PgPool) -> Self {
        Self::with_starter(Some(Box::new(move |hub| {
            tokio::spawn(listen(pool.clone(), hub));
        })))
    }

    /// Wakes the subscribers of `parent` (after the write that changed it committed).
    pub fn notify(&self, parent: &str) {
        self.hub.wake(parent);
    }

    /// Subscribes to `parent`'s changes, unless it already has `limit` subscriptions.
    pub fn subscribe(
        &self,
        parent: &str,
        limit: usize,
    ) -> Result<EntrySubscription, TooManyWatchers> {
        if let Some(start) = &self.hub.start {
            self.hub
                .started
                .call_once(|| start(Arc::downgrade(&self.hub)));
        }
        let mut parents = self
            .hub
            .parents
            .lock()
            .map_err(|_| TooManyWatchers { limit: 0 })?;
        let tx = parents
            .entry(parent.to_owned())
            .or_insert_with(|| watch::channel(0).0);
        if tx.receiver_count() >= limit {
            return Err(TooManyWatchers { limit });
        }
        let rx = tx.subscribe();
        Ok(EntrySubscription {
            rx: Some(rx),
            node_sets: self.hub.node_sets.subscribe(),
            hub: self.hub.clone(),
            parent: parent.to_owned(),
        })
    }
}

/// One stream's view of its parent's changes. Dropping it unsubscribes.
pub struct EntrySubscription {
    rx: Option<watch::Receiver<u64>>,
    /// Any node set's changes (see the module doc).
    node_sets: watch::Receiver<u64>,
    hub: Arc<Hub>,
    parent: String,
}

impl EntrySubscription {
    /// Resolves once a change of the parent (or a gap in the feed) was notified since the last
    /// call (or since subscribing); notifications meanwhile collapse into one.
    /// A node set's change wakes every subscription (module doc).
    pub async fn changed(&mut self) {
        let own = async {
            match self.rx.as_mut() {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        // The hub dropped the slot (cannot happen while we hold a receiver):
                        // never wake again rather than spin.
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        let sets = async {
            if self.node_sets.changed().await.is_err() {
                // The hub holds the sender as long as we hold it: cannot happen.
                std::future::pending::<()>().await;
            }
        };
        // Both are cancel-safe (`watch::Receiver::changed`).
        tokio::select! {
            () = own => {}
            () = sets => {}
        }
    }

    /// Forgets notifications so far (after the caller re-read the state anyway).
    pub fn mark_seen(&mut self) {
        if let Some(rx) = self.rx.as_mut() {
            rx.mark_unchanged();
        }
        self.node_sets.mark_unchanged();
    }
}

impl Drop for EntrySubscription {
    fn drop(&mut self) {
        if let Ok(mut parents) = self.hub.parents.lock() {
            drop(self.rx.take());
            if parents
                .get(&self.parent)
                .is_some_and(|tx| tx.receiver_count() == 0)
            {
                parents.remove(&self.parent);
            }
        }
    }
}

/// The cross-replica feed: `LISTEN signet_entries` on a dedicated connection, each payload a
/// parent to wake. Any gap wakes everyone (see the module doc). `try_recv` is never raced
/// against a timer (it is not documented as cancel-safe), so the task notices that the hub is
/// gone at its next notification or error, not at once; it holds one idle session until then.
async fn listen(pool: sqlx::PgPool, hub: Weak<Hub>) {
    let random = SystemRandom::default();
    // Failures since the last notification received: the backoff's attempt number.
    let mut failures: u32 = 0;
    loop {
        if failures > 0 {
            let wait = RECONNECT.delay(failures - 1, random.unit());
            tokio::time::sleep(wait).await;
        }
        if hub.strong_count() == 0 {
            return;
        }
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(error = %e, failures, "entry notifications: cannot connect; retrying");
                continue;
            }
        };
        if let Err(e) = listener.listen(PG_CHANNEL).await {
            failures = failures.saturating_add(1);
            tracing::warn!(error = %e, failures, "entry notifications: LISTEN failed; retrying");
            continue;
        }
        // Listening (again): whatever changed while we were not is unknown, so every stream
        // re-reads; the first time too, for a change made before the LISTEN took effect.
        match hub.upgrade() {
            Some(h) => h.wake_all(),
            None => return,
        }
        loop {
            // `try_recv` reports a lost connection as Ok(None) (after reconnecting and
            // listening again) instead of hiding the gap.
            let next = listener.try_recv().await;
            let Some(h) = hub.upgrade() else { return };
            match next {
                Ok(Some(n)) => {
                    failures = 0;
                    h.wake(n.payload());
                }
                Ok(None) => {
                    tracing::warn!("entry notifications: connection lost and re-established");
                    h.wake_all();
                }
                Err(e) => {
                    // A fresh listener, after a backoff: this one's connection may be dead.
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %e, failures, "entry notifications: receive failed; reconnecting");
                    h.wake_all();
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn woken(s: &mut EntrySubscription) -> bool {
        use futures::FutureExt;
        s.changed().now_or_never().is_some()
    }

    #[tokio::test]
    async fn notifications_wake_only_their_parent_and_collapse() {
        let ev = EntryEvents::local();
        let mut a = ev.subscribe("p1", 4).unwrap();
        let mut b = ev.subscribe("p2", 4).unwrap();
        assert!(!woken(&mut a));
        ev.notify("p1");
        ev.notify("p1");
        ev.notify("nobody");
        assert!(woken(&mut a));
        // Two notifications, one wake.
        assert!(!woken(&mut a));
        assert!(!woken(&mut b));
        ev.notify("p1");
        a.mark_seen();
        assert!(!woken(&mut a));
        ev.hub.wake_all();
        assert!(woken(&mut a) && woken(&mut b));
    }

    #[tokio::test]
    async fn a_node_sets_notification_wakes_every_subscription() {
        let ev = EntryEvents::local();
        let node = |n: &str| format!("spiffe://example.org/signet/node/{n}");
        let mut a = ev.subscribe(&node("a"), 4).unwrap();
        let mut b = ev.subscribe(&node("b"), 4).unwrap();
        ev.notify("spiffe://example.org/signet/nodeset/k8s");
        assert!(woken(&mut a) && woken(&mut b));
        assert!(!woken(&mut a) && !woken(&mut b));
        // A node's own notification stays its own.
        ev.notify(&node("a"));
        assert!(woken(&mut a) && !woken(&mut b));
        // Seen: a set's earlier notification does not wake again.
        ev.notify("spiffe://example.org/signet/nodeset/k8s");
        a.mark_seen();
        assert!(!woken(&mut a) && woken(&mut b));
        // No table entry is kept for a node set.
        assert_eq!(ev.hub.watched(), 2);
    }

    #[tokio::test]
    async fn subscriptions_are_capped_per_parent_and_cleaned_up() {
        let ev = EntryEvents::local();
        let s1 = ev.subscribe("p", 2).unwrap();
        let s2 = ev.subscribe("p", 2).unwrap();
        assert_eq!(
            ev.subscribe("p", 2).err(),
            Some(TooManyWatchers { limit: 2 })
        );
        assert!(ev.subscribe("q", 2).is_ok());
        // "q"'s subscription was dropped at once: only "p" is held.
        assert_eq!(ev.hub.watched(), 1);
        drop(s1);
        let s3 = ev.subscribe("p", 2).unwrap();
        drop((s2, s3));
        assert_eq!(ev.hub.watched(), 0);
        // Notifying an unwatched parent holds nothing.
        ev.notify("p");
        assert_eq!(ev.hub.watched(), 0);
    }
}
