//! The audit log: denials and admin actions, written in the background.
//!
//! [`AuditLog::record`] never blocks or fails the request path: it logs the event, queues it
//! on a bounded channel, and a background task writes queued events to the store in batches.
//! An event that does not fit in the queue, or whose batch the store refuses, is dropped and
//! counted ([`AuditLog::dropped`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use crate::store::{AuditEvent, Store};

/// Most events written in one store call.
const MAX_BATCH: usize = 256;

/// A handle to the audit writer; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<AuditEvent>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

impl AuditLog {
    /// Starts the writer task on the current tokio runtime, with a queue of `capacity`
    /// events. It stops when every handle is dropped (after writing what is queued).
    pub fn spawn(store: Arc<dyn Store>, capacity: usize) -> AuditLog {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(store, rx, dropped.clone()));
        AuditLog { tx, dropped }
    }

    /// Records an event. `detail` is built by the caller and must not contain secrets
    /// (tokens, keys): it is logged and stored as is.
    pub fn record(&self, kind: &str, caller: &str, detail: String, at_unix: i64) {
        tracing::info!(target: "signet::audit", kind, caller, detail = %detail, at = at_unix, "audit event");
        let event = AuditEvent {
            id: 0,
            at: at_unix,
            kind: kind.to_owned(),
            caller: caller.to_owned(),
            detail,
        };
        if let Err(e) = self.tx.try_send(event) {
            let reason = match e {
                mpsc::error::TrySendError::Full(_) => "queue full",
                mpsc::error::TrySendError::Closed(_) => "writer stopped",
            };
            let total = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // Throttled: an overloaded server should not also flood its log.
            if total.is_power_of_two() || total.is_multiple_of(1024) {
                tracing::warn!(reason, dropped_total = total, "audit event dropped");
            }
        }
    }

    /// Events dropped so far (queue full, writer stopped, or the store refused them).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

async fn run(store: Arc<dyn Store>, mut rx: mpsc::Receiver<AuditEvent>, dropped: Arc<AtomicU64>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
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
    use crate::store::SqliteStore;

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
                "issue.denied",
                "jwt:spiffe://example.org/a",
                format!("n={i}"),
                1_700_000_000 + i,
            );
        }
        let got = until_stored(&store, 300).await;
        assert_eq!(got.len(), 300);
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e.detail, format!("n={i}"));
            assert_eq!(e.at, 1_700_000_000 + i as i64);
            assert_eq!(e.kind, "issue.denied");
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
        log.record("issue.denied", "x", "y".into(), 0);
        log.record("issue.denied", "x", "z".into(), 0);
        for _ in 0..500 {
            if log.dropped() == 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("drops not counted: {}", log.dropped());
    }
}
