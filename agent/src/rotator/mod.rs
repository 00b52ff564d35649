//! Workload certificate rotation against a [`Ca`]: for each registration entry, hold a key
//! (generated here; it never leaves the host) and a certificate, renew it at the configured
//! fraction of its lifetime (jittered), back off on failure ([`retry_wait`]: capped
//! exponential with full jitter, so agents failing together during an outage return spread
//! over at most [`BACKOFF_CAP`], and never sooner than the server's pushback), keep serving the
//! last good certificate until it expires, and publish what it holds.
//!
//! The rotator signs ([`sign`]) and holds ([`hold`]); nothing else. The main loop
//! ([`crate::driver`]) owns the trust state ([`Trust`]: roots, taints, CRLs) and the outlets
//! ([`Outlets`]: the Workload API state, the sinks it starts) and lends both to each pass.
//! A certificate issued under a CA key the server's bundle names as tainted, or listed in its
//! issuer's verified CRL, is replaced at once, not at its usual time
//! ([`crate::rotation::renewal_due`]); the accepted CRLs ([`crate::revocation`]) are served
//! with the bundle.
//!
//! [`Rotator::tick`] is one pass at a given `now`; the caller sleeps until the instant it
//! returns. Time and randomness are injected.
//!
//! Memory: each certificate is held once (`Arc<X509Svid>`), as are the bundle and the CRLs
//! ([`crate::state::Ders`]); what a pass publishes to the Workload API state and hands to
//! the sinks shares them, so a pass over 1,000 entries copies pointers, not certificates. A
//! pass signs in calls of at most [`SIGN_BATCH`] CSRs, each call's keys and answers checked and
//! installed before the next call's keys are made, so a burst of 1,000 new entries never has
//! more than one call's worth of keys, CSRs and answers in memory at once.

mod hold;
mod publish;
mod sign;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::ca::{Ca, EntrySpec};
use crate::metrics::Metrics;
use crate::trust::Trust;
use signet_runtime::backoff::Backoff;
use signet_runtime::clock::Clock;

pub use crate::sinks::worker::SinkBinding;
pub use hold::Holdings;
pub use publish::Outlets;

/// A source of uniform numbers in `[0, 1)` for jitter (injected; seeded in tests).
pub type Random = Arc<dyn signet_runtime::random::Random>;

pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest wait between two attempts while the server fails (as the connection's and the
/// node renewal's, [`crate::driver::RETRY_CAP`]): agents that failed together during an outage
/// come back within this of the server's return, spread over it by the jitter.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// How a failed pass is retried: capped exponential, full jitter.
pub const BACKOFF: Backoff = Backoff::full(BACKOFF_BASE, BACKOFF_CAP);

/// The wait after `failures` failed passes in a row (from 0), `rnd` in `[0, 1)`: the
/// [`BACKOFF`], and never less than the server's `pushback` (the rule, in one place).
pub fn retry_wait(failures: u32, rnd: f64, pushback: Option<Duration>) -> Duration {
    let wait = BACKOFF.delay(failures, rnd);
    pushback.map_or(wait, |p| wait.max(p))
}
/// Longest sleep between passes, so new entries are picked up.
pub const MAX_SLEEP: Duration = Duration::from_secs(60);

/// CSRs per `SignWorkloads` call (the server takes up to [`crate::ca::MAX_CSRS_PER_CALL`]).
/// A call's keys, CSRs and answers (chains with their roots) are in memory together; the
/// next call's are made only once they are installed.
pub const SIGN_BATCH: usize = 64;

pub struct Rotator {
    ca: Arc<dyn Ca>,
    clock: Arc<dyn Clock>,
    random: Random,
    fraction: f64,
    held: Holdings,
    failures: u32,
    /// The server shed the last attempt and said to come back then: no signing before.
    hold_until: Option<SystemTime>,
    metrics: Option<Arc<Metrics>>,
}

impl Rotator {
    pub fn new(ca: Arc<dyn Ca>, clock: Arc<dyn Clock>, random: Random, fraction: f64) -> Self {
        Self {
            ca,
            clock,
            random,
            fraction,
            held: Holdings::default(),
            failures: 0,
            hold_until: None,
            metrics: None,
        }
    }

    /// Counts renewals, failures and compromised replacements in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// One pass over `entries` (the node's complete current set), with the roots and the
    /// revocations of `trust` (which learns the CA certificates of the chains signed), what it
    /// holds then published through `out`. Returns when to run again.
    pub async fn tick(
        &mut self,
        entries: &[EntrySpec],
        trust: &mut Trust,
        out: &mut Outlets,
    ) -> SystemTime {
        let now = self.clock.now();
        self.held.keep_only(entries);
        trust.prune(now);
        // While the server's pushback runs, nothing is asked of it (the pass still publishes).
        let hold = self.hold_until.filter(|t| now < *t);
        let want: Vec<EntrySpec> = match hold {
            Some(_) => Vec::new(),
            None => self
                .held
                .due(entries, trust.revocations(), now)
                .into_iter()
                .cloned()
                .collect(),
        };
        for e in &want {
            // Logged once per certificate; counted when its replacement is installed
            // ([`Self::sign`]), not per attempt.
            if let Some(h) = self.held.get_mut(&e.id)
                && !h.replacing
                && let Some(why) = h.compromise(trust.revocations())
            {
                h.replacing = true;
                tracing::info!(entry = %e.id, spiffe_id = %e.spiffe_id, serial = ?h.cert.as_ref().map(|c| &c.serial_hex), reason = %why, "replacing a compromised certificate now");
            }
        }
        let mut failed = false;
        let mut pushback = None;
        if !want.is_empty() {
            let result = self.sign(&want, trust, out).await;
            if let Some(m) = &self.metrics {
                let ok = result.as_ref().map_or(0, |r| r.0);
                m.renewals.inc_by(ok as u64);
                m.renewal_failures
                    .inc_by(want.len().saturating_sub(ok) as u64);
            }
            match result {
                Ok((n, _)) if n == want.len() => self.failures = 0,
                Ok((_, shed)) => {
                    pushback = shed;
                    failed = true;
                }
                Err(e) if e.is_banned() => {
                    // The loop reports the ban once; retried after the ban's wait.
                    tracing::debug!(error = %e, "workload signing refused; serving the last good certificates");
                    pushback = e.retry_after();
                    failed = true;
                }
                Err(e) => {
                    if let Some(m) = &self.metrics {
                        m.server_error("sign", &e);
                    }
                    tracing::warn!(error = %e, "workload signing failed; serving the last good certificates");
                    pushback = e.retry_after();
                    failed = true;
                }
            }
        }
        // The pass may have taken a while (1,000 new entries against a busy server: many
        // seconds): what it signed is valid from the server's "now", later than the pass's
        // start, so what to serve, and when to wake, are decided at the clock's reading now.
        // With the start's reading, every certificate issued more than the server's backdating
        // after it would not be valid yet: withdrawn from the Workload API and the sinks until
        // the next pass, a minute later.
        let now = if want.is_empty() {
            now
        } else {
            self.clock.now()
        };
        out.publish(&self.held, trust, now);
        if let Some(m) = &self.metrics {
            m.entries(entries.len());
        }
        let rev = trust.revocations();
        let ended = if failed {
            let wait = retry_wait(self.failures, self.random.unit(), pushback);
            self.failures = self.failures.saturating_add(1);
            self.hold_until = pushback.map(|_| now + wait);
            Ended::Failed { wait }
        } else if let Some(until) = hold {
            Ended::Held { until }
        } else {
            Ended::Done {
                overdue: self.held.any_overdue(rev, now),
            }
        };
        let next = next_pass(now, self.held.next_due_after(rev, now), ended);
        match self.held.next_expiry_after(now) {
            Some(expiry) => next.min(expiry),
            None => next,
        }
    }

    /// Installs SVIDs restored from the cache ([`crate::cache`], checked there) for
    /// `entries`, at `now`, and publishes them through `out` at once (before the server
    /// answers). Each keeps its place in its lifetime: renewed at its usual time counted from
    /// its `not_before`, so one past it is due at the first pass. An SVID whose entry is not
    /// in `entries`, or whose SPIFFE ID is not its entry's, is skipped, as is one a verified
    /// CRL in `trust` lists (itself or a CA certificate of its chain: a replayed cache, say;
    /// its entry is signed anew when the server answers). Returns how many were installed.
    pub fn restore(
        &mut self,
        entries: &[EntrySpec],
        svids: Vec<(String, signet_pki::X509Svid)>,
        trust: &mut Trust,
        out: &mut Outlets,
    ) -> usize {
        let now = self.clock.now();
        let mut n = 0;
        for (entry_id, svid) in svids {
            let Some(spec) = entries.iter().find(|e| e.id == entry_id) else {
                continue;
            };
            if *svid.spiffe_id() != spec.spiffe_id {
                continue;
            }
            let c = svid.certificate();
            trust.learn_issuers(c.chain_der());
            let cert = crate::revocation::CertRef::parse_chain(c.chain_der());
            if let Some(why) = cert.as_ref().and_then(|c| trust.revocations().check(c))
                && !matches!(why, crate::revocation::Compromise::Tainted { .. })
            {
                // A verified CRL the agent holds lists it (a replayed cache, say): never
                // served; the entry waits for the server to sign it again.
                tracing::warn!(entry = %entry_id, reason = %why, "not serving a cached certificate");
                continue;
            }
            let held = hold::Held {
                spec: spec.clone(),
                renew_at: crate::rotation::renew_at(
                    c.not_before(),
                    c.not_after(),
                    self.fraction,
                    self.random.unit(),
                ),
                obtained: now,
                jitter: self.random.unit(),
                reissues: 0,
                cert,
                replacing: false,
                svid: Arc::new(svid),
            };
            self.held.insert(entry_id, held);
            n += 1;
        }
        out.publish(&self.held, trust, now);
        if let Some(m) = &self.metrics {
            m.entries(entries.len());
        }
        n
    }
}

/// How a pass ended, for [`next_pass`].
#[derive(Debug, Clone, Copy)]
enum Ended {
    /// Signing failed (all or part): retry after `wait` ([`retry_wait`]).
    Failed { wait: Duration },
    /// Nothing was asked: the server's pushback runs `until` then.
    Held { until: SystemTime },
    /// Everything due was signed; `overdue`: something is still due (a compromised
    /// replacement came back compromised, say).
    Done { overdue: bool },
}

/// When the next pass runs after one that ended at `now` (`next_due`: the earliest renewal
/// after `now`). The rule, in one place: upcoming renewals set it, never more than
/// [`MAX_SLEEP`] away; overdue ones (signing failed) are retried with backoff, never in a tight
/// loop: while the server fails, the retry pass is the next one (it takes whatever came due
/// meanwhile), so entries coming due one after another during an outage do not each cut the
/// backoff short.
fn next_pass(now: SystemTime, next_due: Option<SystemTime>, ended: Ended) -> SystemTime {
    let usual = next_due.unwrap_or(now + MAX_SLEEP).min(now + MAX_SLEEP);
    match ended {
        Ended::Failed { wait } => now + wait,
        Ended::Held { until } => usual.min(until),
        Ended::Done { overdue: true } => usual.min(now + BACKOFF_BASE),
        Ended::Done { overdue: false } => usual,
    }
}

#[cfg(test)]
mod tests;
