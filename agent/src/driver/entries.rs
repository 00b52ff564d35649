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

use crate::ca::{Ca, CaError};
use crate::watch::Watch;

/// Whether a revision from the stream means the loop must sync now: any revision other than
/// the one it holds (lower too: replicas share one counter, but a restored database or a
/// deleted parent row may go back, and syncing is always safe).
pub fn sync_wanted(held: u64, received: u64) -> bool {
    held != received
}

/// The entry stream over the current connection, reopened with backoff when it fails.
pub type EntryWatch = Watch<u64>;

impl Watch<u64> {
    pub fn entries(now: SystemTime) -> Self {
        Watch::new("entry", now)
    }

    /// Opens the stream on `ca` if it is closed and due; on failure, schedules the next try.
    /// An older server without the stream (Unimplemented): poll only, and look again at the
    /// backoff's cap.
    pub async fn open_if_due(&mut self, ca: &dyn Ca, now: SystemTime, rnd: f64) {
        if !self.is_due(now) {
            return;
        }
        match ca.watch_entries().await {
            Ok(s) => self.opened(s),
            Err(CaError::Refused {
                code: tonic::Code::Unimplemented,
                ..
            }) => self.unsupported(now),
            Err(e) => self.failed_with(now, rnd, &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::REOPEN;
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
        let mut w = EntryWatch::entries(t0);
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
