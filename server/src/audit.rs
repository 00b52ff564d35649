//! The audit log: denials and admin actions, written in the background.
//!
//! [`AuditLog::record`] never blocks or fails the request path: it queues the event on a
//! bounded channel, and a background task writes queued events to the store in batches.
//!
//! Floods cannot push real events out:
//! - events travel in three lanes by who caused them: admin actions (`admin.*`, or an
//!   `admin:` caller), authenticated callers, and unauthenticated ones (`anonymous`). Each lane
//!   has its own queue and the writer drains them in that order, so a flood of
//!   unauthenticated failures can only ever fill (and drop from) its own lane;
//! - events other than admin actions are aggregated: per (kind, caller, source address) only
//!   the first `burst` events of each `window` are recorded one by one; the rest are counted
//!   and recorded as one event "N more like this" when the window ends.
//!
//! An event that does not fit in its lane's queue, or whose batch the store refuses, is
//! dropped and counted ([`AuditLog::dropped`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::store::{AuditEvent, AuditStore};

/// Most events written in one store call.
const MAX_BATCH: usize = 256;
/// Most (kind, caller, source) keys aggregated at once; beyond, keys share one per lane.
const MAX_KEYS: usize = 10_000;

/// How floods are folded (`limits.audit_burst`, `limits.audit_window`).
#[derive(Debug, Clone, Copy)]
pub struct AuditLimits {
    /// Queue length of the admin and authenticated lanes (the unauthenticated lane has a
    /// quarter of it).
    pub capacity: usize,
    /// Events per key recorded one by one in each window.
    pub burst: u32,
    pub window: Duration,
}

impl AuditLimits {
    #[cfg(test)]
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            burst: 5,
            window: Duration::from_secs(10),
        }
    }
}

/// Who caused an event: decides its lane, and whether it may be aggregated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Lane {
    Admin,
    Authenticated,
    Anonymous,
}

impl Lane {
    fn of(kind: &str, caller: &str) -> Lane {
        if kind.starts_with("admin.") || caller.starts_with("admin:") {
            Lane::Admin
        } else if caller.is_empty() || caller == "anonymous" {
            Lane::Anonymous
        } else {
            Lane::Authenticated
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    lane: Lane,
    kind: String,
    caller: String,
    source: Option<IpAddr>,
}

#[derive(Debug)]
struct Slot {
    started: Instant,
    recorded: u32,
    suppressed: u64,
    last_at: i64,
    last_detail: String,
}

/// Per-key windows: which events are recorded one by one, and the summaries of the rest.
#[derive(Debug)]
struct Aggregator {
    burst: u32,
    window: Duration,
    slots: HashMap<Key, Slot>,
}

impl Aggregator {
    /// True when the event is to be recorded on its own; otherwise it is counted.
    fn admit(&mut self, mut key: Key, detail: &str, at: i64, now: Instant) -> bool {
        if !self.slots.contains_key(&key) && self.slots.len() >= MAX_KEYS {
            key.caller = "(many callers)".into();
            key.source = None;
        }
        let slot = self.slots.entry(key).or_insert_with(|| Slot {
            started: now,
            recorded: 0,
            suppressed: 0,
            last_at: at,
            last_detail: String::new(),
        });
        if slot.recorded < self.burst {
            slot.recorded += 1;
            return true;
        }
        slot.suppressed += 1;
        slot.last_at = at;
        detail.clone_into(&mut slot.last_detail);
        false
    }

    /// Ends the windows that are over (all of them when `all`): one summary event for each
    /// window that suppressed something.
    fn flush(&mut self, now: Instant, all: bool) -> Vec<AuditEvent> {
        let mut out = Vec::new();
        let window = self.window;
        self.slots.retain(|key, slot| {
            if !all && now.saturating_duration_since(slot.started) < window {
                return true;
            }
            if slot.suppressed > 0 {
                let from = match key.source {
                    Some(ip) => format!(" from {ip}"),
                    None => String::new(),
                };
                out.push(AuditEvent {
                    id: 0,
                    at: slot.last_at,
                    kind: key.kind.clone(),
                    caller: key.caller.clone(),
                    detail: format!(
                        "aggregate: {} more {} events by {}{from} within {} (only the first {} of \
                         each window are recorded one by one); the last: {}",
                        slot.suppressed,
                        key.kind,
                        key.caller,
                        humantime::format_duration(window),
                        slot.recorded,
                        slot.last_detail
                    ),
                });
            }
            false
        });
        out
    }
}

struct Lanes {
    admin: mpsc::Sender<AuditEvent>,
    authenticated: mpsc::Sender<AuditEvent>,
    anonymous: mpsc::Sender<AuditEvent>,
}

/// A handle to the audit writer; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    lanes: Arc<Lanes>,
    aggregator: Arc<Mutex<Aggregator>>,
    dropped: Arc<AtomicU64>,
    aggregated: Arc<AtomicU64>,
    /// Times the aggregation windows (the writer task reads the same clock to close them).
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dropped", &self.dropped())
            .field("aggregated", &self.aggregated())
            .finish_non_exhaustive()
    }
}

impl AuditLog {
    /// Starts the writer task on the current tokio runtime, with queues of `capacity` events
    /// and the default aggregation. It stops when every handle is dropped (after writing what
    /// is queued).
    #[cfg(test)]
    pub fn spawn(store: Arc<dyn AuditStore>, capacity: usize) -> AuditLog {
        Self::spawn_with(
            store,
            AuditLimits::new(capacity),
            Arc::new(crate::clock::SystemClock),
        )
    }

    /// Starts the writer task; `clock` times the aggregation windows.
    pub fn spawn_with(
        store: Arc<dyn AuditStore>,
        limits: AuditLimits,
        clock: Arc<dyn Clock>,
    ) -> AuditLog {
        let capacity = limits.capacity.max(1);
        let (admin, admin_rx) = mpsc::channel(capacity);
        let (authenticated, authenticated_rx) = mpsc::channel(capacity);
        let (anonymous, anonymous_rx) = mpsc::channel((capacity / 4).max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let aggregator = Arc::new(Mutex::new(Aggregator {
            burst: limits.burst,
            window: limits.window.max(Duration::from_millis(1)),
            slots: HashMap::new(),
        }));
        tokio::spawn(run(
            store,
            [admin_rx, authenticated_rx, anonymous_rx],
            aggregator.clone(),
            dropped.clone(),
            clock.clone(),
        ));
        AuditLog {
            lanes: Arc::new(Lanes {
                admin,
                authenticated,
                anonymous,
            }),
            aggregator,
            dropped,
            aggregated: Arc::new(AtomicU64::new(0)),
            clock,
        }
    }

    /// Records an event. `detail` is built by the caller and must not contain secrets
    /// (tokens, keys): it is logged and stored as is.
    pub fn record(&self, kind: &str, caller: &str, detail: String, at_unix: i64) {
        let lane = Lane::of(kind, caller);
        if lane != Lane::Admin {
            let source = crate::limits::context::current()
                .peer
                .map(|p| crate::limits::context::source_key(p.ip()));
            let key = Key {
                lane,
                kind: kind.to_owned(),
                caller: caller.to_owned(),
                source,
            };
            let admitted = self
                .aggregator
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .admit(key, &detail, at_unix, self.clock.monotonic().into_std());
            if !admitted {
                self.aggregated.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        tracing::info!(target: "signet::audit", kind, caller, detail = %detail, at = at_unix, "audit event");
        let event = AuditEvent {
            id: 0,
            at: at_unix,
            kind: kind.to_owned(),
            caller: caller.to_owned(),
            detail,
        };
        let tx = match lane {
            Lane::Admin => &self.lanes.admin,
            Lane::Authenticated => &self.lanes.authenticated,
            Lane::Anonymous => &self.lanes.anonymous,
        };
        if let Err(e) = tx.try_send(event) {
            let reason = match e {
                mpsc::error::TrySendError::Full(_) => "queue full",
                mpsc::error::TrySendError::Closed(_) => "writer stopped",
            };
            let total = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // Throttled: an overloaded server should not also flood its log.
            if total.is_power_of_two() || total.is_multiple_of(1024) {
                tracing::warn!(reason, ?lane, dropped_total = total, "audit event dropped");
            }
        }
    }

    /// Events dropped so far (queue full, writer stopped, or the store refused them).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events folded into aggregate events so far.
    pub fn aggregated(&self) -> u64 {
        self.aggregated.load(Ordering::Relaxed)
    }
}

async fn run(
    store: Arc<dyn AuditStore>,
    lanes: [mpsc::Receiver<AuditEvent>; 3],
    aggregator: Arc<Mutex<Aggregator>>,
    dropped: Arc<AtomicU64>,
    clock: Arc<dyn Clock>,
) {
    let [mut admin, mut authenticated, mut anonymous] = lanes;
    let window = aggregator
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .window;
    let mut tick = tokio::time::interval((window / 4).max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = [true; 3];
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    while open.iter().any(|o| *o) {
        // Admin actions first, then authenticated callers, then the unauthenticated.
        tokio::select! {
            biased;
            n = admin.recv_many(&mut a, MAX_BATCH), if open[0] => open[0] = n > 0,
            n = authenticated.recv_many(&mut b, MAX_BATCH), if open[1] => open[1] = n > 0,
            n = anonymous.recv_many(&mut c, MAX_BATCH), if open[2] => open[2] = n > 0,
            _ = tick.tick() => {}
        }
        batch.append(&mut a);
        batch.append(&mut b);
        batch.append(&mut c);
        let all = !open.iter().any(|o| *o);
        let summaries = aggregator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush(clock.monotonic().into_std(), all);
        for e in &summaries {
            tracing::info!(target: "signet::audit", kind = %e.kind, caller = %e.caller, detail = %e.detail, at = e.at, "audit event");
        }
        batch.extend(summaries);
        if batch.is_empty() {
            continue;
        }
        if let Err(e) = store.record_audit_events(&batch).await {
            let n = batch.len() as u64;
            let total = dropped.fetch_add(n, Ordering::Relaxed) + n;
            tracing::warn!(error = %e, events = n, dropped_total = total, "audit events dropped: store failed");
        }
        batch.clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{SqliteStore, Store};

    async fn sqlite() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("audit.db").display());
        let store = SqliteStore::connect(&url, Duration::from_secs(5))
            .await
            .unwrap();
        (dir, Arc::new(store))
    }

    async fn until_stored(store: &Arc<dyn Store>, n: usize) -> Vec<AuditEvent> {
        for _ in 0..500 {
            let got = store.audit_events(0, 10_000).await.unwrap();
            if got.len() >= n {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("audit events never reached the store");
    }

    #[tokio::test]
    async fn events_reach_the_store_in_order() {
        let (_dir, store) = sqlite().await;
        let log = AuditLog::spawn(store.clone(), 1000);
        for i in 0..300 {
            log.record(
                "admin.entry_create",
                "admin:spiffe://example.org/signet/admin",
                format!("n={i}"),
                1_700_000_000 + i,
            );
        }
        let got = until_stored(&store, 300).await;
        assert_eq!(got.len(), 300);
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e.detail, format!("n={i}"));
            assert_eq!(e.at, 1_700_000_000 + i as i64);
            assert_eq!(e.kind, "admin.entry_create");
        }
        assert_eq!(log.dropped(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_blocking() {
        let (_dir, store) = sqlite().await;
        // current_thread runtime: the writer cannot run until this test awaits.
        let log = AuditLog::spawn(store.clone(), 4);
        for i in 0..10 {
            log.record("admin.mint", "admin", format!("n={i}"), 0);
        }
        assert_eq!(log.dropped(), 6);
        let got = until_stored(&store, 4).await;
        let details: Vec<_> = got.iter().map(|e| e.detail.as_str()).collect();
        assert_eq!(details, ["n=0", "n=1", "n=2", "n=3"]);
    }

    #[tokio::test]
    async fn a_failing_store_counts_drops() {
        // A store whose audit table has gone: every write fails.
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("broken.db").display());
        let broken = SqliteStore::connect(&url, Duration::from_secs(5))
            .await
            .unwrap();
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query("DROP TABLE audit_events")
            .execute(&pool)
            .await
            .unwrap();

        let log = AuditLog::spawn(Arc::new(broken), 100);
        log.record("issue.denied", "jwt:x", "y".into(), 0);
        log.record("issue.denied", "jwt:x", "z".into(), 0);
        for _ in 0..500 {
            if log.dropped() == 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("drops not counted: {}", log.dropped());
    }

    #[tokio::test]
    async fn a_flood_of_unauthenticated_failures_is_aggregated_and_pushes_nothing_out() {
        let (_dir, store) = sqlite().await;
        // current_thread runtime: nothing is written until this test awaits, so every
        // queue is as full as it will ever be when the flood ends.
        let log = AuditLog::spawn_with(
            store.clone(),
            AuditLimits {
                capacity: 16,
                burst: 3,
                window: Duration::from_millis(200),
            },
            Arc::new(crate::clock::SystemClock),
        );
        let peer: std::net::SocketAddr = "192.0.2.7:5000".parse().unwrap();
        crate::limits::context::CONTEXT
            .scope(
                crate::limits::context::RequestContext { peer: Some(peer) },
                async {
                    for i in 0..5000 {
                        log.record("authn.refused", "anonymous", format!("bad token {i}"), 100);
                    }
                },
            )
            .await;
        log.record(
            "admin.token_create",
            "admin:spiffe://example.org/signet/admin",
            "made a token".into(),
            101,
        );
        log.record(
            "issue.denied",
            "jwt:spiffe://example.org/ns/a/sa/b",
            "policy.identity: no".into(),
            102,
        );
        assert_eq!(log.dropped(), 0, "nothing dropped");
        assert_eq!(log.aggregated(), 4997);

        // The window ends: one aggregate event for the 4997 others.
        let got = until_stored(&store, 6).await;
        let kinds: Vec<_> = got.iter().map(|e| e.kind.as_str()).collect();
        assert!(kinds.contains(&"admin.token_create"), "{kinds:?}");
        assert!(kinds.contains(&"issue.denied"), "{kinds:?}");
        let anonymous: Vec<_> = got.iter().filter(|e| e.caller == "anonymous").collect();
        assert_eq!(anonymous.len(), 4, "{anonymous:?}");
        let summary = anonymous.last().unwrap();
        assert!(
            summary.detail.starts_with(
                "aggregate: 4997 more authn.refused events by anonymous from 192.0.2.7"
            ),
            "{}",
            summary.detail
        );
        assert!(
            summary.detail.ends_with("bad token 4999"),
            "{}",
            summary.detail
        );
    }

    #[tokio::test]
    async fn admin_actions_are_never_aggregated_and_callers_are_aggregated_apart() {
        let mut agg = Aggregator {
            burst: 2,
            window: Duration::from_secs(10),
            slots: HashMap::new(),
        };
        let t0 = crate::clock::monotonic().into_std();
        let key = |caller: &str| Key {
            lane: Lane::of("issue.denied", caller),
            kind: "issue.denied".into(),
            caller: caller.into(),
            source: None,
        };
        assert!(agg.admit(key("jwt:a"), "x", 1, t0));
        assert!(agg.admit(key("jwt:a"), "x", 1, t0));
        assert!(!agg.admit(key("jwt:a"), "x", 1, t0));
        assert!(
            agg.admit(key("jwt:b"), "x", 1, t0),
            "another caller has its own window"
        );
        assert!(agg.flush(t0 + Duration::from_secs(1), false).is_empty());
        let out = agg.flush(t0 + Duration::from_secs(10), false);
        assert_eq!(out.len(), 1);
        assert!(
            out[0].detail.starts_with("aggregate: 1 more"),
            "{}",
            out[0].detail
        );
        // A new window records one by one again.
        assert!(agg.admit(key("jwt:a"), "x", 1, t0 + Duration::from_secs(11)));
        assert_eq!(
            Lane::of("admin.mint", "admin:spiffe://td/signet/admin"),
            Lane::Admin
        );
        assert_eq!(
            Lane::of("node.attested", "node:spiffe://td/signet/node/n"),
            Lane::Authenticated
        );
        assert_eq!(Lane::of("authn.refused", "anonymous"), Lane::Anonymous);
    }
}
