//! One server stream over the node's mTLS connection, reopened with capped, jittered backoff
//! ([`REOPEN`]) when it fails or ends. The trust bundle stream ([`crate::bundle::BundleWatch`])
//! and the entry-change stream ([`crate::driver::entries::EntryWatch`]) are both a [`Watch`];
//! each adds only how it opens (which call, what an old server answers).

use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use signet_runtime::backoff::{Backoff, Retry};

use crate::ca::CaError;

pub const REOPEN_BASE: Duration = Duration::from_secs(1);
pub const REOPEN_CAP: Duration = Duration::from_secs(30);
/// How a stream is reopened: capped exponential, full jitter, at least half the base.
pub const REOPEN: Backoff = Backoff::full(REOPEN_BASE, REOPEN_CAP).with_half_base_floor();

/// A server stream's items; it ends or fails when the connection does.
pub type ItemStream<T> = Pin<Box<dyn Stream<Item = Result<T, CaError>> + Send>>;

/// A stream over the current connection and when to (re)open it.
pub struct Watch<T> {
    /// For the logs: "trust bundle", "entry".
    what: &'static str,
    stream: Option<ItemStream<T>>,
    /// When to (re)open it, and the failures in a row.
    open: Retry,
}

impl<T> Watch<T> {
    pub fn new(what: &'static str, now: SystemTime) -> Self {
        Self {
            what,
            stream: None,
            open: Retry::new(REOPEN, now),
        }
    }

    /// The connection was replaced or lost: drop the stream; open again at `now`.
    pub fn reset(&mut self, now: SystemTime) {
        self.stream = None;
        self.open.reschedule(now);
    }

    pub fn is_open(&self) -> bool {
        self.stream.is_some()
    }

    /// When the stream should be (re)opened; `None` while it is open.
    pub fn reopen_at(&self) -> Option<SystemTime> {
        (self.stream.is_none()).then_some(self.open.due())
    }

    /// Whether it is closed and due to be opened at `now`.
    pub fn is_due(&self, now: SystemTime) -> bool {
        self.stream.is_none() && self.open.is_due(now)
    }

    /// Opened.
    pub fn opened(&mut self, stream: ItemStream<T>) {
        tracing::info!(stream = self.what, "watching the server's stream");
        self.stream = Some(stream);
    }

    /// The server has no such stream (an older server): look again at the backoff's cap.
    pub fn unsupported(&mut self, now: SystemTime) {
        self.stream = None;
        self.open.failed_after(now, REOPEN.cap);
        tracing::debug!(stream = self.what, "the server has no such stream");
    }

    /// The stream failed or ended: drop it and reopen after a capped, jittered backoff.
    pub fn failed(&mut self, now: SystemTime, rnd: f64, why: &dyn std::fmt::Display) {
        self.stream = None;
        let wait = self.open.failed(now, rnd);
        tracing::warn!(stream = self.what, error = %why, retry_in = ?wait, "server stream interrupted");
    }

    /// Opening or reading the stream failed with `e`: as [`Self::failed`], but never reopened
    /// sooner than the server's pushback (a banned node's [`crate::ca::BANNED_RETRY`]); a ban
    /// is logged at debug (the driver reports it once).
    pub fn failed_with(&mut self, now: SystemTime, rnd: f64, e: &CaError) {
        let Some(pushback) = e.retry_after() else {
            return self.failed(now, rnd, e);
        };
        self.stream = None;
        let wait = REOPEN.delay(self.open.failures(), rnd).max(pushback);
        self.open.failed_after(now, wait);
        if e.is_banned() {
            tracing::debug!(stream = self.what, error = %e, retry_in = ?wait, "server stream refused");
        } else {
            tracing::warn!(stream = self.what, error = %e, retry_in = ?wait, "server stream interrupted");
        }
    }

    /// An item arrived: the stream works.
    pub fn succeeded(&mut self) {
        let due = self.open.due();
        self.open.succeeded(due);
    }

    /// The next item of the open stream; `None` when it ended. Pending forever while no
    /// stream is open, so it can sit in a `select!`.
    pub async fn next(&mut self) -> Option<Result<T, CaError>> {
        match &mut self.stream {
            Some(s) => s.next().await,
            None => std::future::pending().await,
        }
    }
}
