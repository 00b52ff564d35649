//! What the agent's loop does next, and when: a pure state machine over the results so far and
//! `now`. The loop ([`super::Driver`]) asks [`Schedule::plan`] for the next due [`Step`],
//! executes it, reports the result back (`*_succeeded` / `*_failed`), and when nothing is due
//! sleeps for [`Schedule::wait`].
//!
//! Invariants (today's behaviour, one place each):
//! - A pass runs the due steps in the fixed order of [`Step`]: connect, renew the node SVID,
//!   sync the entries, open the bundle stream, rotate the workloads. Each runs at most once per
//!   pass; a renewed node SVID starts a new pass (its connection is replaced).
//! - Every failure is retried, whatever the server's status (Unavailable, Unauthenticated,
//!   ResourceExhausted…): connection and node renewal with [`RETRY`] (capped exponential, full
//!   jitter, at least half the base), the entry sync with [`SYNC_RETRY`] (the same curve, the
//!   workload renewals' shape: [`crate::rotator::retry_wait`]). A node renewal or an entry sync
//!   is never retried sooner than the server's pushback (`CaError::Busy`), and an entry change
//!   the server pushes does not cut a sync's pushback short. A success forgets the failures.
//!   Each keeps one [`Retry`].
//! - The node SVID is renewed at its jittered time ([`renew_at`]), at once when it is
//!   compromised, after a backoff when its replacement came back compromised too
//!   ([`renewal_due`]), and after a failure's backoff, whatever else says.
//! - The loop never sleeps longer than the sync interval nor shorter than [`MIN_PAUSE`].

use std::time::{Duration, SystemTime};

use signet_runtime::backoff::{Backoff, Retry};
use signet_runtime::random::Random;

use crate::node::NodeIdentity;
use crate::revocation::{CertRef, Compromise, Revocations};
use crate::rotation::{renew_at, renewal_due};

pub const RETRY_BASE: Duration = Duration::from_secs(1);
pub const RETRY_CAP: Duration = Duration::from_secs(30);
/// How attestation, connection and node renewal are retried.
pub const RETRY: Backoff = Backoff::full(RETRY_BASE, RETRY_CAP).with_half_base_floor();
/// The shortest sleep between two passes, so a step that is due again at once cannot spin.
pub const MIN_PAUSE: Duration = Duration::from_millis(10);

/// One thing the loop does, in the order a pass runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// Open the mTLS connection with the node SVID.
    Connect,
    /// Renew the node SVID over the connection.
    RenewNode,
    /// Poll `SyncEntries`.
    SyncEntries,
    /// (Re)open the `WatchBundle` stream.
    OpenBundleStream,
    /// One pass of the workload rotator.
    Rotate,
}

impl Step {
    const ORDER: [Step; 5] = [
        Step::Connect,
        Step::RenewNode,
        Step::SyncEntries,
        Step::OpenBundleStream,
        Step::Rotate,
    ];
}

/// What the schedule needs of a node certificate.
#[derive(Debug, Clone)]
pub struct NodeCert {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// The leaf's issuing key and serial, and its chain's CA certificates, for taints and
    /// CRLs (`None`: it does not parse).
    pub leaf: Option<CertRef>,
}

impl NodeCert {
    pub fn of(n: &NodeIdentity) -> Self {
        Self {
            not_before: n.certificate().not_before(),
            not_after: n.certificate().not_after(),
            leaf: CertRef::parse_chain(n.certificate().chain_der()),
        }
    }
}

/// When the node SVID is renewed: at its usual time, at once when it is compromised (tainted
/// issuing key, or revoked: [`renewal_due`]), or after a failure's backoff.
#[derive(Debug, Clone)]
struct NodeRenewal {
    scheduled: SystemTime,
    obtained: SystemTime,
    not_after: SystemTime,
    jitter: f64,
    /// Renewals in a row that came back compromised.
    reissues: u32,
    /// Failed renewals: while there is one, the next attempt is its retry, whatever else says.
    retry: Retry,
    cert: Option<CertRef>,
}

impl NodeRenewal {
    /// For `node`, installed at `now`, its lifetime counted from `from`.
    fn new(
        node: &NodeCert,
        now: SystemTime,
        from: SystemTime,
        fraction: f64,
        random: &dyn Random,
    ) -> Self {
        Self {
            scheduled: renew_at(from, node.not_after, fraction, random.unit()),
            obtained: now,
            not_after: node.not_after,
            jitter: random.unit(),
            reissues: 0,
            retry: Retry::new(RETRY, now),
            cert: node.leaf.clone(),
        }
    }

    fn compromise(&self, rev: &Revocations) -> Option<Compromise> {
        self.cert.as_ref().and_then(|c| rev.check(c))
    }

    fn due(&self, rev: &Revocations) -> SystemTime {
        if self.retry.failures() > 0 {
            return self.retry.due();
        }
        renewal_due(
            self.scheduled,
            self.obtained,
            self.compromise(rev).is_some(),
            self.reissues,
            self.jitter,
        )
    }
}

/// How a failed entry sync is retried: capped exponential, full jitter, at least half the base
/// (as the workload renewals and the node renewal), so agents that failed together during an
/// outage come back spread over at most [`RETRY_CAP`].
pub const SYNC_RETRY: Backoff = Backoff::full(RETRY_BASE, RETRY_CAP).with_half_base_floor();

/// The wait before the next entry sync after `failures` failed syncs in a row (from 0), `rnd`
/// in `[0, 1)`: the [`SYNC_RETRY`] backoff, never less than the server's `pushback` (the rule,
/// in one place).
pub fn sync_retry_wait(failures: u32, rnd: f64, pushback: Option<Duration>) -> Duration {
    let wait = SYNC_RETRY.delay(failures, rnd);
    pushback.map_or(wait, |p| wait.max(p))
}

/// The loop's state for one node identity.
#[derive(Debug, Clone)]
pub struct Schedule {
    fraction: f64,
    sync_interval: Duration,
    connected: bool,
    connect: Retry,
    node: NodeRenewal,
    sync: Retry,
    /// The server shed the last sync and said to come back then: no sync before, even when
    /// it pushes an entry change.
    sync_hold: Option<SystemTime>,
    /// Entries were synced at least once (readiness).
    synced: bool,
    rotate_at: SystemTime,
}

impl Schedule {
    /// For `node` at `now`: connect, sync and rotate at once. A stored identity keeps its place
    /// in its lifetime: one past its renewal time renews as soon as it is connected.
    pub fn new(
        node: &NodeCert,
        now: SystemTime,
        fraction: f64,
        sync_interval: Duration,
        random: &dyn Random,
    ) -> Self {
        Self {
            fraction,
            sync_interval,
            connected: false,
            connect: Retry::new(RETRY, now),
            node: NodeRenewal::new(node, now, node.not_before, fraction, random),
            sync: Retry::new(SYNC_RETRY, now),
            sync_hold: None,
            synced: false,
            rotate_at: now,
        }
    }

    /// The first step after `after` (None: from the start of a pass) that is due at `now`.
    /// `stream_due`: the bundle stream is closed and its reopening is due.
    pub fn plan(
        &self,
        now: SystemTime,
        after: Option<Step>,
        rev: &Revocations,
        stream_due: bool,
    ) -> Option<Step> {
        Step::ORDER
            .into_iter()
            .filter(|s| after.is_none_or(|a| *s > a))
            .find(|s| self.is_due(*s, now, rev, stream_due))
    }

    fn is_due(&self, step: Step, now: SystemTime, rev: &Revocations, stream_due: bool) -> bool {
        match step {
            Step::Connect => !self.connected && self.connect.is_due(now),
            Step::RenewNode => self.connected && now >= self.node.due(rev),
            Step::SyncEntries => self.connected && self.sync.is_due(now),
            Step::OpenBundleStream => self.connected && stream_due,
            Step::Rotate => now >= self.rotate_at,
        }
    }

    /// How long to sleep at `now` when nothing is due (`stream_reopen_at`: when the closed
    /// bundle stream is to be reopened).
    pub fn wait(
        &self,
        now: SystemTime,
        rev: &Revocations,
        stream_reopen_at: Option<SystemTime>,
    ) -> Duration {
        let mut wake = self.rotate_at.min(self.node.not_after);
        if self.connected {
            wake = wake.min(self.sync.due()).min(self.node.due(rev));
            if let Some(at) = stream_reopen_at {
                wake = wake.min(at);
            }
        } else {
            wake = wake.min(self.connect.due());
        }
        wake.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(self.sync_interval)
            .max(MIN_PAUSE)
    }

    /// Whether the loop holds a connection (the entry stream opens only on one).
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    pub fn connect_succeeded(&mut self) {
        self.connected = true;
        let due = self.connect.due();
        self.connect.succeeded(due);
    }

    /// Returns the wait before the next attempt.
    pub fn connect_failed(&mut self, now: SystemTime, rnd: f64) -> Duration {
        self.connect.failed(now, rnd)
    }

    /// Why the node SVID is being replaced before its time, if it is compromised.
    pub fn node_compromise(&self, rev: &Revocations) -> Option<Compromise> {
        self.node.compromise(rev)
    }

    /// The node SVID was renewed at `now`: schedule the new one (its lifetime counted from
    /// `now`, as the server backdates `not_before`) and reconnect at once with it. Returns the
    /// compromise of the new certificate if it is compromised too (then it is replaced after a
    /// growing backoff, not in a loop).
    pub fn node_renewed(
        &mut self,
        new: &NodeCert,
        now: SystemTime,
        rev: &Revocations,
        random: &dyn Random,
    ) -> Option<Compromise> {
        let reissues = self.node.reissues;
        self.node = NodeRenewal::new(new, now, new.not_before.max(now), self.fraction, random);
        let again = self.node.compromise(rev);
        if again.is_some() {
            self.node.reissues = reissues.saturating_add(1);
        }
        // New connections present the new certificate.
        self.connected = false;
        self.connect.reschedule(now);
        again
    }

    /// Returns the wait before the next attempt: the [`RETRY`] backoff, never less than the
    /// server's `pushback` (`grpc-retry-pushback-ms`) when it sent one.
    pub fn node_renewal_failed(
        &mut self,
        now: SystemTime,
        rnd: f64,
        pushback: Option<Duration>,
    ) -> Duration {
        let wait = RETRY.delay(self.node.retry.failures(), rnd);
        let wait = pushback.map_or(wait, |p| wait.max(p));
        self.node.retry.failed_after(now, wait);
        wait
    }

    /// The entries were synced at `now`; `changed`: they differ from the known ones.
    pub fn sync_succeeded(&mut self, now: SystemTime, changed: bool) {
        self.synced = true;
        self.sync_hold = None;
        self.sync.succeeded(now + self.sync_interval);
        if changed {
            self.rotate_at = now;
        }
    }

    /// The entry sync failed at `now` (`pushback`: the server's, when it shed the call).
    /// Returns the wait before the next attempt ([`sync_retry_wait`]).
    pub fn sync_failed(
        &mut self,
        now: SystemTime,
        rnd: f64,
        pushback: Option<Duration>,
    ) -> Duration {
        let wait = sync_retry_wait(self.sync.failures(), rnd, pushback);
        self.sync.failed_after(now, wait);
        self.sync_hold = pushback.and_then(|_| now.checked_add(wait));
        wait
    }

    /// Failed entry syncs in a row.
    pub fn sync_failures(&self) -> u32 {
        self.sync.failures()
    }

    /// The server pushed a change of the entries (`WatchEntries`): sync at `now`, ahead of the
    /// poll. A sync in a failure backoff is brought forward too (the server just answered),
    /// but never before the end of the server's pushback.
    pub fn sync_now(&mut self, now: SystemTime) {
        let at = self.sync_hold.map_or(now, |hold| hold.max(now));
        if self.sync.due() > at {
            self.sync.reschedule(at);
        }
    }

    /// Something the rotator works from changed (bundle, revocations): rotate at `now`.
    pub fn rotate_now(&mut self, now: SystemTime) {
        self.rotate_at = now;
    }

    /// The rotator ran and wants to run again at `next`. Returns whether the agent is ready
    /// (entries synced at least once and signed).
    pub fn rotated(&mut self, next: SystemTime) -> bool {
        self.rotate_at = next;
        self.synced
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
