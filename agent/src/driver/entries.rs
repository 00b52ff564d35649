//! The server's entry-change stream (`WatchEntries`) over the node's mTLS connection: it tells
//! the loop when to sync the registration entries, so a new entry's certificate is on disk in
//! about a second instead of at the next poll.
//!
//! The stream carries revisions only; `SyncEntries` stays the one source of the entry set, so
//! a lost, late or repeated revision can only cause one more sync, never a wrong set
//! ([`sync_wanted`]). The `sync_interval` poll stays as a slow safety net (default 30 s) for a
//! stream that is down or a notification that never came. [`EntryWatch`] reopens the stream
//! with capped, jittered backoff (`signet_runtime::backoff`, the bundle stream's policy); a
//! server without the stream (Unimplemented) is retried at the cap, so an upgraded server is
//! picked up without a restart.

use std::time::SystemTime;

use futures::StreamExt;
use signet_runtime::backoff::Retry;

use crate::bundle::REOPEN;
use crate::ca::{Ca, CaError, EntryRevisionStream};

/// Whether a revision from the stream means the loop must sync now: any revision other than
/// the one it holds (lower too: replicas share one counter, but a restored database or a
/// deleted parent row may go back, and syncing is always safe).
pub fn sync_wanted(held: u64, received: u64) -> bool {
    held != received
}

/// The entry stream over the current connection, reopened with backoff when it fails.
pub struct EntryWatch {
    stream: Option<EntryRevisionStream>,
    /// When to (re)open it, and the failures in a row.
    open: Retry,
}

impl EntryWatch {
    pub fn new(now: SystemTime) -> Self {
        Self {
            stream: None,
            open: Retry::new(REOPEN, now),
        }
    }

    /// The connection was replaced or lost: drop the stream; open again at `now`.
    pub fn reset(&mut self, now: SystemTime) {
        self.stream = None;
        self.open.reschedule(now);
    }

    /// When the stream should be (re)opened; `None` while it is open.
    pub fn reopen_at(&self) -> Option<SystemTime> {
        (self.stream.is_none()).then_some(self.open.due())
    }

    /// Opens the stream on `ca` if it is closed and due; on failure, schedules the next try.
    pub async fn open_if_due(&mut self, ca: &dyn Ca, now: SystemTime, rnd: f64) {
        if self.stream.is_some() || !self.open.is_due(now) {
            return;
        }
        match ca.watch_entries().await {
            Ok(s) => {
                tracing::debug!("watching the server's entry changes");
                self.stream = Some(s);
            }
            Err(CaError::Refused {
                code: tonic::Code::Unimplemented,
                ..
            }) => {
                // An older server: poll only, and look again at the backoff's cap.
                self.stream = None;
                self.open.failed_after(now, REOPEN.cap);
                tracing::debug!("the server has no entry stream; polling only");
            }
            Err(e) => self.failed(now, rnd, &e),
        }
    }

    /// The stream failed or ended: drop it and reopen after a capped, jittered backoff.
    pub fn failed(&mut self, now: SystemTime, rnd: f64, why: &dyn std::fmt::Display) {
        self.stream = None;
        let wait = self.open.failed(now, rnd);
        tracing::info!(reason = %why, retry_in = ?wait, "entry stream interrupted; polling until it is back");
    }

    /// A revision arrived: the stream works.
    pub fn succeeded(&mut self) {
        let due = self.open.due();
        self.open.succeeded(due);
    }

    /// The next revision of the open stream; `None` when it ended. Pending forever while no
    /// stream is open, so it can sit in a `select!`.
    pub async fn next(&mut self) -> Option<Result<u64, CaError>> {
        match &mut self.stream {
            Some(s) => s.next().await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn any_other_revision_means_sync() {
        assert!(!sync_wanted(7, 7));
        assert!(sync_wanted(7, 8));
        assert!(sync_wanted(7, 3));
        assert!(sync_wanted(0, 1));
    }

    #[test]
    fn reopens_with_backoff_and_at_the_cap_without_a_stream() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut w = EntryWatch::new(t0);
        assert_eq!(w.reopen_at(), Some(t0));
        // Failures back off (full jitter at rnd 0.99: just under the ceiling), capped.
        w.failed(t0, 0.99, &"down");
        let first = w.reopen_at().expect("closed");
        assert!(first > t0 && first <= t0 + REOPEN.base);
        for _ in 0..10 {
            w.failed(t0, 0.99, &"down");
        }
        let capped = w.reopen_at().expect("closed");
        assert!(capped <= t0 + REOPEN.cap && capped > t0 + REOPEN.cap / 2);
        // A new connection reopens at once.
        w.reset(t0);
        assert_eq!(w.reopen_at(), Some(t0));
    }
}
