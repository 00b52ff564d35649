//! Workload certificate rotation against a [`Ca`]: for each registration entry, hold a key
//! (generated here; it never leaves the host) and a certificate, renew it at the configured
//! fraction of its lifetime (jittered), back off on failure ([`retry_wait`]: capped
//! exponential with full jitter, so agents failing together during an outage return spread
//! over at most [`BACKOFF_CAP`], and never sooner than the server's pushback), keep serving the
//! last good certificate until it expires, and publish the result to the Workload API state.
//!
//! A certificate issued under a CA key the server's bundle names as tainted, or listed in its
//! issuer's verified CRL, is replaced at once, not at its usual time
//! ([`crate::rotation::renewal_due`]); the accepted CRLs ([`crate::revocation`]) are served
//! with the bundle.
//!
//! [`Rotator::tick`] is one pass at a given `now`; the caller sleeps until the instant it
//! returns. Time and randomness are injected.
//!
//! Memory: each certificate is held once (`Arc<X509Svid>`), as are the bundle and the CRLs
//! ([`crate::state::Ders`]); what the rotator publishes to the Workload API state and hands to
//! the sinks shares them, so a pass over 1,000 entries copies pointers, not certificates. A
//! pass signs in calls of at most [`SIGN_BATCH`] CSRs, each call's keys and answers checked and
//! installed before the next call's keys are made, so a burst of 1,000 new entries never has
//! more than one call's worth of keys, CSRs and answers in memory at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::ca::{Ca, CaError, Crl, EntrySpec, WorkloadCsr};
use crate::metrics::Metrics;
use crate::revocation::{CertRef, Compromise, CrlRejected, Issuers, Revocations};
use crate::rotation::{renew_at, renewal_due};
use crate::sinks::Delivered;
use crate::sinks::worker::{SinkSet, Telemetry};
use crate::state::{AgentState, Ders, Identity, StateSender};
use signet_pki::{PrivateKey, SvidCertificate, X509Svid};
use signet_runtime::backoff::Backoff;
use signet_runtime::clock::Clock;

pub use crate::sinks::worker::SinkBinding;

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

struct Held {
    spec: EntrySpec,
    svid: Arc<X509Svid>,
    /// The usual renewal time, drawn when the certificate was obtained.
    renew_at: SystemTime,
    /// When the agent installed it.
    obtained: SystemTime,
    /// Drawn once per certificate, for the compromised-replacement backoff.
    jitter: f64,
    /// Replacements in a row that came back compromised (see [`renewal_due`]).
    reissues: u32,
    /// The leaf's issuing key and serial (`None` if the leaf does not parse: then no taint or
    /// CRL can name it).
    cert: Option<CertRef>,
}

impl Held {
    fn serves(&self, now: SystemTime) -> bool {
        crate::rotation::serves(self.svid.certificate(), now)
    }

    fn compromise(&self, rev: &Revocations) -> Option<Compromise> {
        self.cert.as_ref().and_then(|c| rev.check(c))
    }

    /// When this certificate is due, given the revocations in force.
    fn due_at(&self, rev: &Revocations) -> SystemTime {
        renewal_due(
            self.renew_at,
            self.obtained,
            self.compromise(rev).is_some(),
            self.reissues,
            self.jitter,
        )
    }
}

pub struct Rotator {
    ca: Arc<dyn Ca>,
    clock: Arc<dyn Clock>,
    random: Random,
    fraction: f64,
    state: StateSender,
    /// Boxed: a map sized for 1,000 entries has room for up to twice as many, and an empty
    /// place costs a pointer, not a whole `Held`.
    held: HashMap<String, Box<Held>>,
    bundle_der: Ders,
    /// The CRLs in force as served (DER), kept in step with `revocations` by [`Self::tick`].
    crls_der: Ders,
    trust_domain_id: String,
    failures: u32,
    /// The server shed the last attempt and said to come back then: no signing before.
    hold_until: Option<SystemTime>,
    /// Sinks not started yet (their workers start on the first pass).
    sinks: Vec<SinkBinding>,
    /// The sinks' workers: handed the current SVIDs, never waited for.
    sink_set: Option<SinkSet>,
    metrics: Option<Arc<Metrics>>,
    /// Taints and verified CRLs in force.
    revocations: Revocations,
    /// CA certificates CRLs are verified with.
    issuers: Issuers,
    /// The CRLs of the last bundle that could not be verified yet for want of their issuer:
    /// offered again when a new chain teaches the agent more CA certificates.
    unverified: Vec<Crl>,
}

/// Entries needing a certificate at `now`: none held, or held and due for renewal (at its
/// usual time, or at once when it is compromised).
/// The SPIFFE IDs of a renewal round, for its trace span.
fn spiffe_ids(entries: &[EntrySpec]) -> String {
    let ids: Vec<String> = entries.iter().map(|e| e.spiffe_id.to_string()).collect();
    ids.join(",")
}

fn due<'a>(
    entries: &'a [EntrySpec],
    held: &HashMap<String, Box<Held>>,
    rev: &Revocations,
    now: SystemTime,
) -> Vec<&'a EntrySpec> {
    entries
        .iter()
        .filter(|e| match held.get(&e.id) {
            None => true,
            Some(h) => now >= h.due_at(rev),
        })
        .collect()
}

impl Rotator {
    pub fn new(
        ca: Arc<dyn Ca>,
        clock: Arc<dyn Clock>,
        random: Random,
        fraction: f64,
        state: StateSender,
    ) -> Self {
        Self {
            ca,
            clock,
            random,
            fraction,
            state,
            held: HashMap::new(),
            bundle_der: Ders::default(),
            crls_der: Ders::default(),
            trust_domain_id: String::new(),
            failures: 0,
            hold_until: None,
            sinks: Vec::new(),
            sink_set: None,
            metrics: None,
            revocations: Revocations::default(),
            issuers: Issuers::default(),
            unverified: Vec::new(),
        }
    }

    pub fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn with_sinks(mut self, sinks: Vec<SinkBinding>) -> Self {
        self.sinks = sinks;
        self
    }

    /// The trust bundle served alongside the SVIDs. A change reaches the Workload API and
    /// every sink on the next [`Self::tick`].
    pub fn set_bundle(&mut self, trust_domain_id: String, bundle_der: Vec<Vec<u8>>) {
        self.issuers.learn(&bundle_der);
        self.trust_domain_id = trust_domain_id;
        if *self.bundle_der != *bundle_der {
            self.bundle_der = bundle_der.into();
        }
    }

    /// The taints and CRLs in force.
    pub fn revocations(&self) -> &Revocations {
        &self.revocations
    }

    /// Learns the CA certificates in `chain` (the node's, for instance) as CRL issuers.
    pub fn learn_issuers(&mut self, chain: &[Vec<u8>]) {
        self.issuers.learn(chain);
    }

    /// Restores CRLs the agent persisted (see [`Revocations::restore`]); served at once.
    pub fn restore_crls(&mut self, ders: &[Vec<u8>]) {
        for der in ders {
            if let Err(e) = self.revocations.restore(der) {
                tracing::warn!(error = %e, "ignoring a persisted CRL");
            }
        }
    }

    /// Applies the bundle's taints (the complete current set) and CRLs: each CRL is verified
    /// against the CA certificate it names and kept only if newer than the one kept (see
    /// [`crate::revocation`]); one that fails is logged, counted and ignored. Returns whether
    /// anything in force changed (then the caller persists the CRLs and runs a pass now).
    pub fn set_revocations(&mut self, tainted: &[String], crls: &[Crl]) -> bool {
        let mut changed = self.revocations.set_tainted(tainted);
        if changed {
            tracing::info!(tainted = ?tainted, "tainted CA keys changed");
        }
        self.unverified.clear();
        for crl in crls {
            changed |= self.offer_crl(crl, true);
        }
        changed
    }

    /// Offers one CRL; `report`: log and count a refusal (not on a silent retry).
    fn offer_crl(&mut self, crl: &Crl, report: bool) -> bool {
        match self.revocations.offer(crl, &self.issuers) {
            Ok(true) => {
                let kept = self.revocations.crls().find(|c| c.key_id == crl.key_id);
                tracing::info!(
                    key_id = %crl.key_id,
                    number = kept.map(|c| c.number),
                    revoked = kept.map(|c| c.revoked_count()),
                    "new CRL"
                );
                true
            }
            Ok(false) => false,
            Err(e) => {
                if matches!(e, CrlRejected::UnknownIssuer(_)) {
                    self.unverified.push(crl.clone());
                }
                if report {
                    if let Some(m) = &self.metrics {
                        m.crl_rejections
                            .get_or_create(&vec![("reason", e.label().to_owned())])
                            .inc();
                    }
                    match e {
                        CrlRejected::NotNewer { .. } => tracing::debug!(error = %e, "CRL ignored"),
                        _ => tracing::warn!(error = %e, "CRL ignored"),
                    }
                }
                false
            }
        }
    }

    /// Offers again the CRLs whose issuer was unknown, after new chains were installed.
    fn retry_unverified(&mut self) -> bool {
        let pending = std::mem::take(&mut self.unverified);
        let mut changed = false;
        for crl in &pending {
            changed |= self.offer_crl(crl, false);
        }
        changed
    }

    /// One pass over `entries` (the node's complete current set). Returns when to run again.
    pub async fn tick(&mut self, entries: &[EntrySpec]) -> SystemTime {
        let now = self.clock.now();
        // An entry that went away or changed (selectors, SPIFFE ID…) stops being served at
        // once, even if its replacement cannot be signed yet.
        self.held
            .retain(|id, h| entries.iter().any(|e| &e.id == id && *e == h.spec));
        self.issuers.prune(now);
        // While the server's pushback runs, nothing is asked of it (the pass still publishes).
        let hold = self.hold_until.filter(|t| now < *t);
        let want: Vec<EntrySpec> = match hold {
            Some(_) => Vec::new(),
            None => due(entries, &self.held, &self.revocations, now)
                .into_iter()
                .cloned()
                .collect(),
        };
        for e in &want {
            if let Some(h) = self.held.get(&e.id)
                && let Some(why) = h.compromise(&self.revocations)
            {
                tracing::info!(entry = %e.id, spiffe_id = %e.spiffe_id, serial = ?h.cert.as_ref().map(|c| &c.serial_hex), reason = %why, "replacing a compromised certificate now");
                if let Some(m) = &self.metrics {
                    m.compromised_replacements.inc();
                }
            }
        }
        let mut failed = false;
        let mut pushback = None;
        if !want.is_empty() {
            let result = self.sign(&want).await;
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
                Err(e) => {
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
        let crls = self.revocations.crls_der();
        if *self.crls_der != *crls {
            self.crls_der = crls.into();
        }
        self.publish(now);
        self.sync_sinks(now);
        // Upcoming renewals set the next pass; overdue ones (signing failed) are retried
        // with backoff, never in a tight loop: while the server fails, the retry pass is the
        // next one (it takes whatever came due meanwhile), so entries coming due one after
        // another during an outage do not each cut the backoff short.
        let rev = &self.revocations;
        let mut next = self
            .held
            .values()
            .map(|h| h.due_at(rev))
            .filter(|t| *t > now)
            .min()
            .unwrap_or(now + MAX_SLEEP)
            .min(now + MAX_SLEEP);
        if failed {
            let wait = retry_wait(self.failures, self.random.unit(), pushback);
            self.failures = self.failures.saturating_add(1);
            self.hold_until = pushback.map(|_| now + wait);
            next = now + wait;
        } else if let Some(until) = hold {
            next = next.min(until);
        } else if self.held.values().any(|h| h.due_at(rev) <= now) {
            next = next.min(now + BACKOFF_BASE);
        }
        next
    }

    /// Signs `want`; returns how many succeeded. One span per renewal round.
    #[tracing::instrument(
        target = "signet_trace",
        name = "agent.renew_workloads",
        skip_all,
        fields(
            entries = want.len(),
            spiffe_ids = %spiffe_ids(want),
            signed = tracing::field::Empty,
        ),
        err(Display)
    )]
    /// Signs `want` in calls of at most [`SIGN_BATCH`]: how many were signed, and the longest
    /// retry pushback the server gave (for an entry it shed, or with a call it refused: the
    /// pass's pushback, as a whole call's would be). What a call signed is published to the
    /// Workload API and handed to the sinks before the next call, so a burst's files are
    /// written while the rest is signed. A call that fails stops the pass: when it is the
    /// first, the pass fails as a whole; after others succeeded, what they signed is kept and
    /// the pass counts as partly failed.
    async fn sign(&mut self, want: &[EntrySpec]) -> Result<(usize, Option<Duration>), CaError> {
        let mut ok = 0;
        let mut pushback: Option<Duration> = None;
        let mut learnt = false;
        let batches = want.chunks(SIGN_BATCH).count();
        for (i, batch) in want.chunks(SIGN_BATCH).enumerate() {
            match self.sign_batch(batch, &mut learnt).await {
                Ok((n, shed)) => {
                    ok += n;
                    pushback = pushback.max(shed);
                    if n > 0 && i + 1 < batches {
                        // Served and handed to the sinks now, while the next batch is signed
                        // (the pass publishes again at its end).
                        let now = self.clock.now();
                        self.publish(now);
                        self.sync_sinks(now);
                    }
                }
                Err(e) if ok == 0 => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, signed = ok, of = want.len(), "workload signing failed part-way; serving the last good certificates of the others");
                    pushback = pushback.max(e.retry_after());
                    break;
                }
            }
        }
        if learnt && self.retry_unverified() {
            // A CRL verified now that its issuer is known: apply it on the next pass.
            tracing::debug!("a CRL verified with a newly learnt CA certificate");
        }
        tracing::Span::current().record("signed", ok);
        Ok((ok, pushback))
    }

    /// Signs `batch` in one call and installs what comes back: how many were signed, and the
    /// longest pushback the server gave an entry it shed. Sets `learnt` when a chain taught
    /// the agent a new CA certificate.
    async fn sign_batch(
        &mut self,
        batch: &[EntrySpec],
        learnt: &mut bool,
    ) -> Result<(usize, Option<Duration>), CaError> {
        let mut keys = HashMap::with_capacity(batch.len());
        let mut csrs = Vec::with_capacity(batch.len());
        for e in batch {
            let k = signet_pki::new_key_and_csr().map_err(|e| CaError::Invalid(e.to_string()))?;
            csrs.push(WorkloadCsr {
                entry_id: e.id.clone(),
                csr_der: k.csr_der.clone(),
            });
            keys.insert(e.id.clone(), k);
        }
        let results = self.ca.sign_workloads(csrs).await?;
        let mut ok = 0;
        let mut pushback: Option<Duration> = None;
        for (entry_id, result) in results {
            let (Some(spec), Some(key)) = (
                batch.iter().find(|e| e.id == entry_id),
                keys.remove(&entry_id),
            ) else {
                continue;
            };
            let svid = result.and_then(|issued| self.to_svid(spec, issued, &key.key_pkcs8_der));
            match svid {
                Ok((svid, issuers)) => {
                    // The server backdates not_before; the lifetime that counts is the one
                    // left from now, or a short-lived certificate would be due at once.
                    let now = self.clock.now();
                    let c = svid.certificate();
                    let renew = renew_at(
                        c.not_before().max(now),
                        c.not_after(),
                        self.fraction,
                        self.random.unit(),
                    );
                    let cert = CertRef::parse_chain(c.chain_der());
                    let before = self.issuers.clone();
                    self.issuers.learn(issuers.iter());
                    *learnt |= before != self.issuers;
                    let mut held = Held {
                        spec: spec.clone(),
                        svid: Arc::new(svid),
                        renew_at: renew,
                        obtained: now,
                        jitter: self.random.unit(),
                        reissues: 0,
                        cert,
                    };
                    if let Some(why) = held.compromise(&self.revocations) {
                        // The server signed under the tainted key again (or listed this
                        // serial): serve it, and try again after a backoff.
                        held.reissues = self
                            .held
                            .get(&entry_id)
                            .map_or(0, |h| h.reissues)
                            .saturating_add(1);
                        tracing::warn!(entry = %entry_id, reason = %why, retry_in = ?held.due_at(&self.revocations).duration_since(now).unwrap_or_default(), "the new certificate is compromised too");
                    }
                    self.held.insert(entry_id, Box::new(held));
                    ok += 1;
                }
                Err(e) => {
                    pushback = pushback.max(e.retry_after());
                    tracing::warn!(entry = %entry_id, error = %e, "entry not signed");
                }
            }
        }
        Ok((ok, pushback))
    }

    /// What the agent serves for `spec` from what the CA issued and the key it generated: the
    /// entry's SPIFFE ID (another one is refused), the key the certificate's (checked by
    /// [`X509Svid::new`]), the chain without the roots (they are the bundle). Also returns the
    /// chain's CA certificates, roots included, to learn CRL issuers from.
    fn to_svid(
        &self,
        spec: &EntrySpec,
        issued: SvidCertificate,
        key_pkcs8_der: &[u8],
    ) -> Result<(X509Svid, Vec<Vec<u8>>), CaError> {
        if *issued.spiffe_id() != spec.spiffe_id {
            return Err(CaError::Invalid(format!(
                "a certificate for {}, not the entry's {}",
                issued.spiffe_id(),
                spec.spiffe_id
            )));
        }
        let issuers = issued.chain_der().get(1..).unwrap_or_default().to_vec();
        let key = PrivateKey::from_pkcs8_der(key_pkcs8_der)
            .map_err(|e| CaError::Invalid(e.to_string()))?;
        let svid = X509Svid::new(issued.without(&self.bundle_der), key)
            .map_err(|e| CaError::Invalid(e.to_string()))?;
        Ok((svid, issuers))
    }

    /// Hands every sink the current certificate of its SPIFFE ID and the current bundle, or
    /// its removal (per the deletion policy) when there is none. The sinks' own workers apply
    /// it (see [`crate::sinks::worker`]); nothing here waits for a sink.
    fn sync_sinks(&mut self, now: SystemTime) {
        if self.sink_set.is_none() {
            if self.sinks.is_empty() {
                return;
            }
            self.sink_set = Some(SinkSet::start(
                std::mem::take(&mut self.sinks),
                Telemetry::new(self.metrics.clone()),
                self.clock.clone(),
                self.random.clone(),
            ));
        }
        // Per SPIFFE ID, the served certificate that lasts longest (one pass over the held).
        let mut current: HashMap<&signet_types::SpiffeId, &Arc<X509Svid>> = HashMap::new();
        for h in self.held.values().filter(|h| h.serves(now)) {
            let id = h.svid.spiffe_id();
            if current
                .get(id)
                .is_none_or(|c| h.svid.certificate().not_after() > c.certificate().not_after())
            {
                current.insert(id, &h.svid);
            }
        }
        let (bundle, crls) = (&self.bundle_der, &self.crls_der);
        if let Some(set) = &mut self.sink_set {
            set.update(|spiffe_id| {
                current.get(spiffe_id).map(|svid| Delivered {
                    svid: Arc::clone(svid),
                    bundle_der: bundle.clone(),
                    crls_der: crls.clone(),
                })
            });
        }
    }

    fn publish(&self, now: SystemTime) {
        let mut identities: Vec<Identity> = self
            .held
            .iter()
            .filter(|(_, h)| h.serves(now))
            .map(|(id, h)| Identity {
                entry_id: id.clone(),
                selectors: h.spec.selectors.clone(),
                svid: h.svid.clone(),
            })
            .collect();
        identities.sort_by(|a, b| a.entry_id.cmp(&b.entry_id));
        let next = AgentState {
            identities,
            bundle_der: self.bundle_der.clone(),
            trust_domain_id: self.trust_domain_id.clone(),
            crls_der: self.crls_der.clone(),
        };
        self.state.send_if_modified(|cur| {
            if **cur == next {
                false
            } else {
                *cur = Arc::new(next);
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{AttestCredential, Attested, EntriesUpdate};
    use crate::config::DeletionPolicy;
    use crate::sinks::{Applied, Sink};
    use crate::state::{Selector, channel};
    use signet_runtime::clock::FakeClock;
    use std::sync::Mutex;

    use crate::testing::TestCa;

    /// What [`FakeCa`] gets wrong on purpose.
    #[derive(Clone, Copy, PartialEq)]
    enum Wrong {
        /// A certificate for another SPIFFE ID than the entry's.
        SpiffeId,
        /// A certificate for another key than the CSR's.
        Key,
    }

    /// Really signs (under `ca`) with a 1000 s lifetime from the fake clock's now, serials
    /// 1, 2, 3…; can be switched off, or made to answer wrong certificates.
    struct FakeCa {
        clock: Arc<FakeClock>,
        ca: TestCa,
        down: Mutex<bool>,
        wrong: Mutex<Option<Wrong>>,
        /// Shed every call with this pushback (the server's `grpc-retry-pushback-ms`).
        busy: Mutex<Option<Duration>>,
        /// Answer the call but shed each entry in it with this pushback (a per-entry
        /// `retry_after_ms`).
        shed_each: Mutex<Option<Duration>>,
        /// Each call takes this long on the fake clock before it signs (a busy server).
        slow: Mutex<Option<Duration>>,
        /// Calls made.
        calls: Mutex<u32>,
        /// The number of CSRs in each call, in order.
        call_sizes: Mutex<Vec<usize>>,
        /// Fail this call (1 for the first) and every later one as unavailable.
        down_from_call: Mutex<Option<u32>>,
        /// When set: the identities the agent served at each call.
        watch_served: Mutex<Option<(crate::state::StateReceiver, Vec<usize>)>>,
        signed: Mutex<u32>,
        /// The leaves issued, in order.
        issued: Mutex<Vec<Vec<u8>>>,
    }

    impl FakeCa {
        fn leaf(&self, n: usize) -> Vec<u8> {
            self.issued.lock().expect("lock")[n].clone()
        }
    }

    #[async_trait::async_trait]
    impl Ca for FakeCa {
        async fn attest(&self, _: &AttestCredential, _: &[u8]) -> Result<Attested, CaError> {
            Err(CaError::Unavailable("not in this test".into()))
        }
        async fn renew_node(&self, _: &[u8]) -> Result<SvidCertificate, CaError> {
            Err(CaError::Unavailable("not in this test".into()))
        }
        async fn sync_entries(&self, _: u64) -> Result<EntriesUpdate, CaError> {
            Ok(EntriesUpdate::Unchanged)
        }
        async fn sign_workloads(
            &self,
            csrs: Vec<WorkloadCsr>,
        ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError> {
            let bad = |e: String| CaError::Invalid(e);
            let call = {
                let mut calls = self.calls.lock().map_err(|e| bad(e.to_string()))?;
                *calls += 1;
                *calls
            };
            self.call_sizes
                .lock()
                .map_err(|e| bad(e.to_string()))?
                .push(csrs.len());
            if let Some((rx, served)) =
                &mut *self.watch_served.lock().map_err(|e| bad(e.to_string()))?
            {
                served.push(rx.borrow().identities.len());
            }
            let down_from = *self.down_from_call.lock().map_err(|e| bad(e.to_string()))?;
            if down_from.is_some_and(|n| call >= n) {
                return Err(CaError::Unavailable("down from this call on".into()));
            }
            let busy = *self.busy.lock().map_err(|e| bad(e.to_string()))?;
            if let Some(retry_after) = busy {
                return Err(CaError::Busy {
                    message: "shed".into(),
                    retry_after,
                });
            }
            if *self.down.lock().map_err(|e| bad(e.to_string()))? {
                return Err(CaError::Unavailable("down".into()));
            }
            if let Some(retry_after) = *self.shed_each.lock().map_err(|e| bad(e.to_string()))? {
                let shed = |c: WorkloadCsr| {
                    let e = CaError::Busy {
                        message: "shed".into(),
                        retry_after,
                    };
                    (c.entry_id, Err(e))
                };
                return Ok(csrs.into_iter().map(shed).collect());
            }
            if let Some(d) = *self.slow.lock().map_err(|e| bad(e.to_string()))? {
                self.clock.advance(d);
            }
            let wrong = *self.wrong.lock().map_err(|e| bad(e.to_string()))?;
            let now = self.clock.now();
            let mut n = self.signed.lock().map_err(|e| bad(e.to_string()))?;
            let mut out = Vec::new();
            for c in csrs {
                *n += 1;
                let (id, csr) = match wrong {
                    None => (format!("spiffe://example.org/{}", c.entry_id), c.csr_der),
                    Some(Wrong::SpiffeId) => ("spiffe://example.org/other".into(), c.csr_der),
                    Some(Wrong::Key) => (
                        format!("spiffe://example.org/{}", c.entry_id),
                        signet_pki::new_key_and_csr()
                            .map_err(|e| bad(e.to_string()))?
                            .csr_der,
                    ),
                };
                let svid = self
                    .ca
                    .issue(&csr, &id, u64::from(*n), now, Duration::from_secs(1000))
                    .map_err(bad)?;
                self.issued
                    .lock()
                    .map_err(|e| bad(e.to_string()))?
                    .push(svid.leaf_der().to_vec());
                out.push((c.entry_id, Ok(svid)));
            }
            Ok(out)
        }
    }

    fn entry(id: &str) -> EntrySpec {
        EntrySpec {
            id: id.into(),
            spiffe_id: format!("spiffe://example.org/{id}").parse().expect("id"),
            parent_id: "spiffe://example.org/signet/node/n1".into(),
            selectors: vec![Selector::Uid(1000)],
            ttl: Duration::from_secs(1000),
            dns_names: vec![],
            revision: 1,
        }
    }

    fn setup() -> (
        Rotator,
        Arc<FakeClock>,
        Arc<FakeCa>,
        crate::state::StateReceiver,
    ) {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = Arc::new(FakeClock::at(t0));
        let ca = Arc::new(FakeCa {
            clock: clock.clone(),
            ca: TestCa::new("root"),
            down: Mutex::new(false),
            wrong: Mutex::new(None),
            busy: Mutex::new(None),
            shed_each: Mutex::new(None),
            slow: Mutex::new(None),
            calls: Mutex::new(0),
            call_sizes: Mutex::new(Vec::new()),
            down_from_call: Mutex::new(None),
            watch_served: Mutex::new(None),
            signed: Mutex::new(0),
            issued: Mutex::new(Vec::new()),
        });
        let (tx, rx) = channel();
        let mut r = Rotator::new(ca.clone(), clock.clone(), Arc::new(|| 0.5), 0.5, tx);
        r.set_bundle("spiffe://example.org".into(), vec![ca.ca.der.clone()]);
        (r, clock, ca, rx)
    }

    fn advance(clock: &FakeClock, to: SystemTime) {
        clock.set(to);
    }

    #[tokio::test]
    async fn issues_then_renews_at_half_life() {
        let (mut r, clock, ca, rx) = setup();
        let t0 = clock.now();
        let entries = [entry("web")];
        let next = r.tick(&entries).await;
        assert_eq!(next, t0 + Duration::from_secs(60), "capped by MAX_SLEEP");
        let s = rx.borrow().clone();
        assert_eq!(s.identities.len(), 1);
        let chain = |s: &AgentState| s.identities[0].svid.certificate().chain_der().to_vec();
        assert_eq!(chain(&s), [ca.leaf(0)], "root stripped");
        assert!(!s.identities[0].svid.key().pkcs8_der().is_empty());

        advance(&clock, t0 + Duration::from_secs(499));
        r.tick(&entries).await;
        assert_eq!(chain(&rx.borrow()), [ca.leaf(0)]);
        advance(&clock, t0 + Duration::from_secs(500));
        r.tick(&entries).await;
        assert_eq!(chain(&rx.borrow()), [ca.leaf(1)]);
    }

    /// A long pass (a burst of new entries against a busy server) ends serving everything it
    /// signed, the last calls' certificates too, which are valid only from after the pass
    /// began; and the next pass is scheduled from the pass's end.
    #[tokio::test]
    async fn a_long_pass_serves_all_it_signed_and_schedules_from_its_end() {
        let (mut r, clock, ca, rx) = setup();
        let t0 = clock.now();
        *ca.slow.lock().expect("lock") = Some(Duration::from_secs(15));
        let entries: Vec<EntrySpec> = (0..2 * SIGN_BATCH)
            .map(|i| entry(&format!("e{i}")))
            .collect();
        let next = r.tick(&entries).await;
        let end = t0 + Duration::from_secs(30);
        assert_eq!(clock.now(), end, "two calls of 15 s");
        assert_eq!(rx.borrow().identities.len(), 2 * SIGN_BATCH, "all served");
        assert_eq!(next, end + MAX_SLEEP);
    }

    #[tokio::test]
    async fn a_certificate_for_another_id_or_key_is_not_served() {
        for wrong in [Wrong::SpiffeId, Wrong::Key] {
            let (mut r, clock, ca, rx) = setup();
            let t0 = clock.now();
            let entries = [entry("web")];
            *ca.wrong.lock().expect("lock") = Some(wrong);
            let next = r.tick(&entries).await;
            assert_eq!(*ca.signed.lock().expect("lock"), 1);
            assert!(rx.borrow().identities.is_empty(), "nothing served");
            assert_eq!(
                next,
                t0 + Duration::from_millis(500),
                "retried with backoff like a failure"
            );
            // The CA answers right again: served.
            *ca.wrong.lock().expect("lock") = None;
            advance(&clock, next);
            r.tick(&entries).await;
            let s = rx.borrow().clone();
            assert_eq!(s.identities.len(), 1);
            assert_eq!(
                s.identities[0].svid.spiffe_id().to_string(),
                "spiffe://example.org/web"
            );
        }
    }

    #[tokio::test]
    async fn failure_backs_off_and_keeps_serving_until_expiry() {
        let (r, clock, ca, rx) = setup();
        let t0 = clock.now();
        let (_tx, mrx) = channel();
        let metrics = Arc::new(Metrics::new(mrx, clock.clone()));
        let mut r = r.with_metrics(metrics.clone());
        let entries = [entry("web")];
        r.tick(&entries).await;
        if let Ok(mut d) = ca.down.lock() {
            *d = true;
        }
        advance(&clock, t0 + Duration::from_secs(600));
        let next = r.tick(&entries).await;
        // attempt 0, rnd 0.5: half of 1 s.
        assert_eq!(next, t0 + Duration::from_millis(600_500));
        assert_eq!(rx.borrow().identities.len(), 1, "still served");
        let next = r.tick(&entries).await;
        assert_eq!(
            next,
            t0 + Duration::from_secs(601),
            "attempt 1: half of 2 s"
        );
        advance(&clock, t0 + Duration::from_secs(1000));
        r.tick(&entries).await;
        assert!(
            rx.borrow().identities.is_empty(),
            "expired: no longer served"
        );
        if let Ok(mut d) = ca.down.lock() {
            *d = false;
        }
        r.tick(&entries).await;
        assert_eq!(rx.borrow().identities.len(), 1, "recovered");
        let text = metrics.encode();
        assert!(text.contains("signet_agent_renewals_total 2"), "{text}");
        assert!(
            text.contains("signet_agent_renewal_failures_total 3"),
            "{text}"
        );
    }

    fn entries(n: usize) -> Vec<EntrySpec> {
        (0..n).map(|i| entry(&format!("app-{i}"))).collect()
    }

    #[tokio::test]
    async fn a_burst_is_signed_in_calls_of_at_most_the_batch_size() {
        let (mut r, _clock, ca, rx) = setup();
        *ca.watch_served.lock().expect("lock") = Some((rx.clone(), Vec::new()));
        let n = 2 * SIGN_BATCH + 3;
        r.tick(&entries(n)).await;
        assert_eq!(
            *ca.call_sizes.lock().expect("lock"),
            [SIGN_BATCH, SIGN_BATCH, 3],
            "one call per batch, in order"
        );
        assert_eq!(rx.borrow().identities.len(), n, "every entry served");
        // What a call signed is served before the next call is made.
        let served = ca.watch_served.lock().expect("lock").take().map(|w| w.1);
        assert_eq!(served, Some(vec![0, SIGN_BATCH, 2 * SIGN_BATCH]));
        // Nothing is due: no call on the next pass.
        r.tick(&entries(n)).await;
        assert_eq!(ca.call_sizes.lock().expect("lock").len(), 3);
    }

    #[tokio::test]
    async fn a_call_failing_part_way_keeps_what_was_signed_and_retries_the_rest() {
        let (r, clock, ca, rx) = setup();
        let t0 = clock.now();
        let (_tx, mrx) = channel();
        let metrics = Arc::new(Metrics::new(mrx, clock.clone()));
        let mut r = r.with_metrics(metrics.clone());
        let n = 2 * SIGN_BATCH + 3;
        *ca.down_from_call.lock().expect("lock") = Some(2);
        let next = r.tick(&entries(n)).await;
        // The pass failed: retried with backoff (attempt 0, rnd 0.5: half of 1 s), and the
        // calls after the failed one were not made.
        assert_eq!(next, t0 + Duration::from_millis(500));
        assert_eq!(
            *ca.call_sizes.lock().expect("lock"),
            [SIGN_BATCH, SIGN_BATCH]
        );
        assert_eq!(
            rx.borrow().identities.len(),
            SIGN_BATCH,
            "the first call's are served"
        );
        let text = metrics.encode();
        assert!(
            text.contains(&format!("signet_agent_renewals_total {SIGN_BATCH}")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "signet_agent_renewal_failures_total {}",
                n - SIGN_BATCH
            )),
            "{text}"
        );
        // The server is back: only the entries still without a certificate are asked for.
        *ca.down_from_call.lock().expect("lock") = None;
        advance(&clock, next);
        r.tick(&entries(n)).await;
        assert_eq!(
            ca.call_sizes.lock().expect("lock")[2..],
            [SIGN_BATCH, 3],
            "the rest, in batches"
        );
        assert_eq!(rx.borrow().identities.len(), n, "every entry served");
    }

    #[test]
    fn the_retry_wait_is_capped_jittered_and_never_under_the_pushback() {
        // Early failures grow: attempt 0 waits up to 1 s, attempt 3 up to 8 s.
        assert_eq!(retry_wait(0, 0.5, None), Duration::from_millis(500));
        assert_eq!(retry_wait(3, 0.5, None), Duration::from_secs(4));
        // However long the outage, the next attempt is at most BACKOFF_CAP away, spread over
        // all of it by the jitter (agents that failed together do not return together).
        for failures in [5, 10, 300, u32::MAX] {
            assert_eq!(retry_wait(failures, 0.0, None), Duration::ZERO);
            assert_eq!(
                retry_wait(failures, 0.25, None),
                Duration::from_millis(7_500)
            );
            assert_eq!(retry_wait(failures, 0.5, None), Duration::from_secs(15));
            assert!(retry_wait(failures, 0.999_999, None) < BACKOFF_CAP);
        }
        // The server's pushback is a floor, whatever the jitter drew.
        let p = Some(Duration::from_secs(2));
        assert_eq!(retry_wait(0, 0.5, p), Duration::from_secs(2));
        assert_eq!(retry_wait(10, 0.5, p), Duration::from_secs(15));
        assert_eq!(
            retry_wait(10, 0.5, Some(Duration::from_secs(90))),
            Duration::from_secs(90)
        );
    }

    #[tokio::test]
    async fn after_a_long_outage_the_next_attempt_is_within_the_cap() {
        let (mut r, clock, ca, rx) = setup();
        let t0 = clock.now();
        let entries = [entry("web")];
        r.tick(&entries).await;
        *ca.down.lock().expect("lock") = true;
        // Due at 500 s; the server is down from then for 600 s: each pass runs when the
        // previous one said, and no wait is longer than the cap.
        let mut now = t0 + Duration::from_secs(500);
        advance(&clock, now);
        let end = t0 + Duration::from_secs(1100);
        while now < end {
            let next = r.tick(&entries).await;
            let wait = next.duration_since(now).expect("forward");
            assert!(wait <= BACKOFF_CAP, "waited {wait:?} at {now:?}");
            now = next;
            advance(&clock, now);
        }
        // rnd 0.5: the last waits are half the cap.
        let next = r.tick(&entries).await;
        assert_eq!(next.duration_since(now).expect("forward"), BACKOFF_CAP / 2);
        // The server is back: the next pass renews.
        *ca.down.lock().expect("lock") = false;
        advance(&clock, next);
        r.tick(&entries).await;
        assert_eq!(rx.borrow().identities.len(), 1, "renewed");
        assert_eq!(r.failures, 0);
    }

    #[tokio::test]
    async fn while_the_server_fails_entries_coming_due_wait_for_the_retry() {
        let (mut r, clock, ca, _rx) = setup();
        let t0 = clock.now();
        let (a, b) = (entry("a"), entry("b"));
        r.tick(std::slice::from_ref(&a)).await;
        advance(&clock, t0 + Duration::from_secs(100));
        r.tick(&[a.clone(), b.clone()]).await;
        let calls = || *ca.calls.lock().expect("lock");
        assert_eq!(calls(), 2);
        // "a" is due at 500 s, "b" at 600 s; the server is down from 500 s.
        *ca.down.lock().expect("lock") = true;
        let mut now = t0 + Duration::from_secs(500);
        advance(&clock, now);
        for _ in 0..8 {
            now = r.tick(&[a.clone(), b.clone()]).await;
            advance(&clock, now);
        }
        // Eight failures with rnd 0.5: 0.5 + 1 + 2 + 4 + 8 + 15 + 15 + 15 s, "b" coming due
        // at 600 s in the middle of a wait did not add an attempt.
        assert_eq!(now, t0 + Duration::from_millis(560_500));
        assert_eq!(calls(), 10);
    }

    #[tokio::test]
    async fn a_pushback_holds_every_attempt_until_it_runs_out() {
        let (mut r, clock, ca, rx) = setup();
        let t0 = clock.now();
        let entries = [entry("web")];
        r.tick(&entries).await;
        let calls = || *ca.calls.lock().expect("lock");
        assert_eq!(calls(), 1);
        // Due at 500 s; the server sheds the call and says 90 s.
        *ca.busy.lock().expect("lock") = Some(Duration::from_secs(90));
        let shed = t0 + Duration::from_secs(500);
        advance(&clock, shed);
        let next = r.tick(&entries).await;
        assert_eq!(calls(), 2);
        assert_eq!(
            next,
            shed + Duration::from_secs(90),
            "retried when it runs out"
        );
        // Woken early (a new bundle, new entries, the loop's own wake-up): nothing is asked
        // of the server before its 90 s are over.
        for at in [1, 30, 60, 89] {
            advance(&clock, shed + Duration::from_secs(at));
            let next = r.tick(&entries).await;
            assert_eq!(calls(), 2, "asked again {at} s after a 90 s pushback");
            let now = shed + Duration::from_secs(at);
            assert_eq!(next, (now + MAX_SLEEP).min(shed + Duration::from_secs(90)));
        }
        assert_eq!(rx.borrow().identities.len(), 1, "still served meanwhile");
        // At 90 s it asks again and is served.
        *ca.busy.lock().expect("lock") = None;
        advance(&clock, shed + Duration::from_secs(90));
        r.tick(&entries).await;
        assert_eq!(calls(), 3);
        assert_eq!(
            rx.borrow().identities[0].svid.certificate().leaf_der(),
            ca.leaf(1)
        );
        // A plain failure after that imposes no hold: the next wake-up may try at once.
        *ca.down.lock().expect("lock") = true;
        let later = shed + Duration::from_secs(600);
        advance(&clock, later);
        let next = r.tick(&entries).await;
        assert_eq!(next, later + Duration::from_millis(500));
        r.tick(&entries).await;
        assert_eq!(calls(), 5, "no pushback: tried again when woken");
    }

    #[tokio::test]
    async fn entries_shed_inside_an_answered_call_hold_the_retry_like_a_shed_call() {
        let (mut r, clock, ca, _rx) = setup();
        let t0 = clock.now();
        let entries = [entry("web"), entry("api")];
        r.tick(&entries).await;
        let calls = || *ca.calls.lock().expect("lock");
        assert_eq!(calls(), 1);
        // Due at 500 s; the call is answered, but every entry in it is shed with 45 s.
        *ca.shed_each.lock().expect("lock") = Some(Duration::from_secs(45));
        let shed = t0 + Duration::from_secs(500);
        advance(&clock, shed);
        let next = r.tick(&entries).await;
        assert_eq!(calls(), 2);
        assert_eq!(next, shed + Duration::from_secs(45), "not before the hint");
        advance(&clock, shed + Duration::from_secs(20));
        r.tick(&entries).await;
        assert_eq!(calls(), 2, "woken early: nothing asked inside the 45 s");
        *ca.shed_each.lock().expect("lock") = None;
        advance(&clock, shed + Duration::from_secs(45));
        r.tick(&entries).await;
        assert_eq!(calls(), 3, "asked again when the hint ran out");
    }

    /// Records deliveries and removals; can be made to fail or to hang.
    #[derive(Default)]
    struct RecordingSink {
        log: Mutex<Vec<String>>,
        fail: Mutex<bool>,
        hang: Mutex<bool>,
    }

    #[async_trait::async_trait]
    impl Sink for RecordingSink {
        fn name(&self) -> &str {
            "rec"
        }
        async fn deliver(&self, svid: &Delivered) -> Result<Applied, crate::sinks::SinkError> {
            if self.hang.lock().map(|h| *h).unwrap_or(false) {
                std::future::pending::<()>().await;
            }
            if self.fail.lock().map(|f| *f).unwrap_or(true) {
                return Err(crate::sinks::SinkError::new("rec", "disk full"));
            }
            if let Ok(mut l) = self.log.lock() {
                l.push(format!(
                    "deliver {:?} {:?}",
                    svid.svid.certificate().chain_der(),
                    svid.bundle_der
                ));
            }
            Ok(Applied::default())
        }
        async fn remove(&self) -> Result<Applied, crate::sinks::SinkError> {
            if let Ok(mut l) = self.log.lock() {
                l.push("remove".into());
            }
            Ok(Applied::default())
        }
    }

    fn binding(sink: Arc<RecordingSink>) -> SinkBinding {
        SinkBinding {
            spiffe_id: "spiffe://example.org/web".parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(30),
            sink,
        }
    }

    /// Lets the sink workers run (the tests run on paused Tokio time, so this is instant).
    async fn settle(d: Duration) {
        tokio::time::sleep(d).await;
    }

    #[tokio::test(start_paused = true)]
    async fn sinks_follow_rotation_retry_and_removal() {
        let (r, clock, _ca, _rx) = setup();
        let t0 = clock.now();
        let sink = Arc::new(RecordingSink::default());
        let mut r = r.with_sinks(vec![binding(sink.clone())]);
        let entries = [entry("web"), entry("other")];
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        r.tick(&entries).await; // unchanged: not delivered again
        settle(Duration::from_millis(10)).await;
        if let Ok(mut f) = sink.fail.lock() {
            *f = true;
        }
        advance(&clock, t0 + Duration::from_secs(500));
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        assert_eq!(
            sink.log.lock().expect("lock").len(),
            1,
            "failed, not logged"
        );
        if let Ok(mut f) = sink.fail.lock() {
            *f = false;
        }
        // The worker retries by itself after its backoff.
        settle(Duration::from_secs(2)).await;
        r.tick(&[entry("other")]).await;
        settle(Duration::from_millis(10)).await;
        let log = sink.log.lock().expect("lock").clone();
        assert_eq!(log.len(), 3, "{log:?}");
        assert!(log[0].starts_with("deliver"), "{log:?}");
        assert!(log[1].starts_with("deliver") && log[1] != log[0], "{log:?}");
        assert_eq!(log[2], "remove");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_sink_delays_no_renewal() {
        let (r, clock, ca, rx) = setup();
        let t0 = clock.now();
        let sink = Arc::new(RecordingSink::default());
        if let Ok(mut h) = sink.hang.lock() {
            *h = true;
        }
        let mut r = r.with_sinks(vec![binding(sink.clone())]);
        let entries = [entry("web"), entry("other")];
        for i in 1..=3u64 {
            // Each pass returns although the sink never finishes.
            tokio::time::timeout(Duration::from_millis(50), r.tick(&entries))
                .await
                .expect("the pass does not wait for the sink");
            advance(&clock, t0 + Duration::from_secs(500 * i));
        }
        assert_eq!(
            *ca.signed.lock().expect("lock"),
            6,
            "both entries renewed each time"
        );
        assert_eq!(rx.borrow().identities.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_bundle_is_published_and_redelivered_to_sinks() {
        let (r, _clock, ca, rx) = setup();
        let sink = Arc::new(RecordingSink::default());
        let mut r = r.with_sinks(vec![binding(sink.clone())]);
        let entries = [entry("web")];
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        let both = vec![ca.ca.der.clone(), b"root2".to_vec()];
        r.set_bundle("spiffe://example.org".into(), both.clone());
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        r.tick(&entries).await; // unchanged: not delivered again
        settle(Duration::from_millis(10)).await;
        assert_eq!(*rx.borrow().bundle_der, both);
        assert_eq!(
            *ca.signed.lock().expect("lock"),
            1,
            "no new certificate needed"
        );
        let log = sink.log.lock().expect("lock").clone();
        assert_eq!(log.len(), 2, "{log:?}");
        assert!(log[1].ends_with(&format!("{both:?}")), "{log:?}");
    }

    /// Keeps what it was last handed.
    #[derive(Default)]
    struct KeepingSink(Mutex<Option<Delivered>>);

    #[async_trait::async_trait]
    impl Sink for KeepingSink {
        fn name(&self) -> &str {
            "keep"
        }
        async fn deliver(&self, d: &Delivered) -> Result<Applied, crate::sinks::SinkError> {
            if let Ok(mut k) = self.0.lock() {
                *k = Some(d.clone());
            }
            Ok(Applied::default())
        }
        async fn remove(&self) -> Result<Applied, crate::sinks::SinkError> {
            Ok(Applied::default())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_certificate_the_bundle_and_the_crls_are_held_once_and_shared() {
        let (r, _clock, ca, rx) = setup();
        let sink = Arc::new(KeepingSink::default());
        let mut r = r.with_sinks(vec![SinkBinding {
            spiffe_id: "spiffe://example.org/web".parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(30),
            sink: sink.clone(),
        }]);
        r.set_bundle("spiffe://example.org".into(), vec![ca.ca.der.clone()]);
        r.tick(&[entry("web")]).await;
        settle(Duration::from_millis(10)).await;
        let state = rx.borrow().clone();
        let handed = sink.0.lock().expect("lock").clone().expect("delivered");
        let web = state.identities[0].svid.clone();
        // The sink's SVID, bundle and CRLs are the state's, not copies.
        assert!(Arc::ptr_eq(&web, &handed.svid));
        assert!(Arc::ptr_eq(&state.bundle_der, &handed.bundle_der));
        assert!(Arc::ptr_eq(&state.crls_der, &handed.crls_der));
        // The same bundle again, and a new entry: the next state shares what it already held.
        r.set_bundle("spiffe://example.org".into(), vec![ca.ca.der.clone()]);
        r.tick(&[entry("web"), entry("api")]).await;
        let next = rx.borrow().clone();
        assert_eq!(next.identities.len(), 2);
        let again = next
            .identities
            .iter()
            .find(|i| i.entry_id == "web")
            .expect("web");
        assert!(Arc::ptr_eq(&web, &again.svid));
        assert!(Arc::ptr_eq(&state.bundle_der, &next.bundle_der));
        assert!(Arc::ptr_eq(&state.crls_der, &next.crls_der));
    }

    #[tokio::test]
    async fn removed_entries_are_dropped_and_changed_ones_reissued() {
        let (mut r, _clock, ca, rx) = setup();
        r.tick(&[entry("a"), entry("b")]).await;
        assert_eq!(rx.borrow().identities.len(), 2);
        r.tick(&[entry("a")]).await;
        let ids: Vec<_> = rx
            .borrow()
            .identities
            .iter()
            .map(|i| i.entry_id.clone())
            .collect();
        assert_eq!(ids, ["a"]);
        let mut changed = entry("a");
        changed.selectors = vec![Selector::Uid(2000)];
        r.tick(&[changed]).await;
        assert_eq!(rx.borrow().identities[0].selectors, [Selector::Uid(2000)]);
        assert_eq!(*ca.signed.lock().expect("lock"), 3);

        // A change the CA cannot sign right now: the old selectors stop matching anyway.
        if let Ok(mut d) = ca.down.lock() {
            *d = true;
        }
        let mut again = entry("a");
        again.selectors = vec![Selector::Uid(3000)];
        r.tick(&[again]).await;
        assert!(rx.borrow().identities.is_empty());
    }

    // --- taints and CRLs -----------------------------------------------------------------

    /// Really signs each CSR under its current CA (switchable), serials 1, 2, 3…
    struct PkiCa {
        clock: Arc<FakeClock>,
        ca: Mutex<Arc<TestCa>>,
        serial: Mutex<u64>,
    }

    impl PkiCa {
        fn signed(&self) -> u64 {
            self.serial.lock().map(|s| *s).unwrap_or(0)
        }
    }

    #[async_trait::async_trait]
    impl Ca for PkiCa {
        async fn attest(&self, _: &AttestCredential, _: &[u8]) -> Result<Attested, CaError> {
            Err(CaError::Unavailable("not in this test".into()))
        }
        async fn renew_node(&self, _: &[u8]) -> Result<SvidCertificate, CaError> {
            Err(CaError::Unavailable("not in this test".into()))
        }
        async fn sync_entries(&self, _: u64) -> Result<EntriesUpdate, CaError> {
            Ok(EntriesUpdate::Unchanged)
        }
        async fn sign_workloads(
            &self,
            csrs: Vec<WorkloadCsr>,
        ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError> {
            let bad = |e: String| CaError::Invalid(e);
            let ca = self.ca.lock().map_err(|e| bad(e.to_string()))?.clone();
            let now = self.clock.now();
            let mut out = Vec::new();
            for c in csrs {
                let serial = {
                    let mut n = self.serial.lock().map_err(|e| bad(e.to_string()))?;
                    *n += 1;
                    *n
                };
                let id = format!("spiffe://example.org/{}", c.entry_id);
                let svid = ca
                    .issue(&c.csr_der, &id, serial, now, Duration::from_secs(1000))
                    .map_err(bad)?;
                out.push((c.entry_id, Ok(svid)));
            }
            Ok(out)
        }
    }

    fn pki_setup(
        ca: &Arc<TestCa>,
    ) -> (
        Rotator,
        Arc<FakeClock>,
        Arc<PkiCa>,
        crate::state::StateReceiver,
        Arc<Metrics>,
    ) {
        pki_setup_with(ca, vec![ca.der.clone()])
    }

    /// Signing under `ca`, serving (and knowing as CRL issuers) `roots`.
    fn pki_setup_with(
        ca: &Arc<TestCa>,
        roots: Vec<Vec<u8>>,
    ) -> (
        Rotator,
        Arc<FakeClock>,
        Arc<PkiCa>,
        crate::state::StateReceiver,
        Arc<Metrics>,
    ) {
        let t0 = SystemTime::now();
        let clock = Arc::new(FakeClock::at(t0));
        let pki = Arc::new(PkiCa {
            clock: clock.clone(),
            ca: Mutex::new(ca.clone()),
            serial: Mutex::new(0),
        });
        let (tx, rx) = channel();
        let (_mtx, mrx) = channel();
        let metrics = Arc::new(Metrics::new(mrx, clock.clone()));
        let mut r = Rotator::new(pki.clone(), clock.clone(), Arc::new(|| 0.5), 0.5, tx)
            .with_metrics(metrics.clone());
        r.set_bundle("spiffe://example.org".into(), roots);
        (r, clock, pki, rx, metrics)
    }

    /// The issuing key (AKI) and serial of the certificate served for the first identity.
    fn served(rx: &crate::state::StateReceiver) -> (String, String) {
        let s = rx.borrow().clone();
        let leaf = s.identities[0].svid.certificate().leaf_der();
        let c = CertRef::parse(leaf).expect("leaf");
        (c.issuer_key_id.unwrap_or_default(), c.serial_hex)
    }

    #[tokio::test]
    async fn a_taint_replaces_now_backs_off_while_the_key_stays_tainted_then_settles() {
        let a = Arc::new(TestCa::new("a"));
        let b = Arc::new(TestCa::new("b"));
        let (mut r, clock, pki, rx, metrics) = pki_setup(&a);
        let t0 = clock.now();
        let entries = [entry("web")];
        r.tick(&entries).await;
        assert_eq!(served(&rx), (a.key_id.clone(), "01".into()));

        // The operator taints A; the server still signs with A for a while.
        assert!(r.set_revocations(std::slice::from_ref(&a.key_id), &[]));
        assert!(
            !r.set_revocations(std::slice::from_ref(&a.key_id), &[]),
            "unchanged"
        );
        let next = r.tick(&entries).await;
        assert_eq!(pki.signed(), 2, "replaced at once, not at half-life");
        assert_eq!(served(&rx).1, "02");
        // Compromised again: retried after the backoff (attempt 0, jitter 0.5: 0.5 s), no loop.
        assert_eq!(next, t0 + Duration::from_millis(500));
        r.tick(&entries).await;
        r.tick(&entries).await;
        assert_eq!(pki.signed(), 2, "not before the backoff");
        advance(&clock, t0 + Duration::from_millis(500));
        let next = r.tick(&entries).await;
        assert_eq!(pki.signed(), 3);
        assert_eq!(
            next,
            t0 + Duration::from_millis(1500),
            "attempt 1: half of 2 s"
        );

        // The server now signs with B (a new root in the bundle): the next one is clean.
        *pki.ca.lock().expect("lock") = b.clone();
        r.set_bundle(
            "spiffe://example.org".into(),
            vec![a.der.clone(), b.der.clone()],
        );
        advance(&clock, t0 + Duration::from_millis(1500));
        let next = r.tick(&entries).await;
        assert_eq!(pki.signed(), 4);
        assert_eq!(served(&rx), (b.key_id.clone(), "04".into()));
        assert_eq!(
            next,
            t0 + Duration::from_millis(1500) + MAX_SLEEP,
            "back to the usual schedule"
        );
        advance(&clock, t0 + Duration::from_secs(100));
        r.tick(&entries).await;
        assert_eq!(pki.signed(), 4, "settled");
        let text = metrics.encode();
        assert!(
            text.contains("signet_agent_compromised_replacements_total 3"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_listed_serial_is_replaced_now_and_bad_or_older_crls_change_nothing() {
        let a = Arc::new(TestCa::new("a"));
        let evil = TestCa::new("a");
        let (mut r, clock, pki, rx, metrics) = pki_setup(&a);
        let entries = [entry("web"), entry("api")];
        r.tick(&entries).await;
        assert_eq!(pki.signed(), 2);
        let serial_of = |id: &str| {
            let s = rx.borrow().clone();
            let i = s.identities.iter().find(|i| i.entry_id == id).expect("id");
            CertRef::parse(i.svid.certificate().leaf_der())
                .expect("leaf")
                .serial_hex
        };
        let web = serial_of("web");
        let web_n = u64::from_str_radix(&web, 16).expect("hex");

        // A CRL listing web's serial, claiming to be A's but signed by another key: refused.
        let forged = Crl {
            key_id: a.key_id.clone(),
            ..evil.crl_msg(9, &[web_n])
        };
        assert!(!r.set_revocations(&[], std::slice::from_ref(&forged)));
        r.tick(&entries).await;
        assert_eq!(pki.signed(), 2, "nothing replaced");
        assert!(rx.borrow().crls_der.is_empty(), "nothing served");
        let text = metrics.encode();
        assert!(
            text.contains("signet_agent_crl_rejections_total{reason="),
            "{text}"
        );

        // A's real CRL 5 lists it: web (only) is replaced at once; the CRL is served.
        let crl5 = a.crl_msg(5, &[web_n]);
        assert!(r.set_revocations(&[], std::slice::from_ref(&crl5)));
        r.tick(&entries).await;
        assert_eq!(pki.signed(), 3);
        assert_ne!(serial_of("web"), web);
        assert_eq!(*rx.borrow().crls_der, *std::slice::from_ref(&crl5.der));
        let api = serial_of("api");
        let api_n = u64::from_str_radix(&api, 16).expect("hex");

        // An older CRL (4) listing api is ignored: api is not replaced, CRL 5 stays served.
        assert!(!r.set_revocations(&[], &[a.crl_msg(4, &[api_n])]));
        advance(&clock, clock.now() + Duration::from_secs(1));
        r.tick(&entries).await;
        assert_eq!(pki.signed(), 3);
        assert_eq!(serial_of("api"), api);
        assert_eq!(*rx.borrow().crls_der, *std::slice::from_ref(&crl5.der));
        assert!(
            metrics
                .encode()
                .contains("signet_agent_crl_rejections_total{reason=\"not_newer\"} 1")
        );
    }

    /// Keeps every delivery it was handed.
    #[derive(Default)]
    struct LogSink(Mutex<Vec<Delivered>>);

    #[async_trait::async_trait]
    impl Sink for LogSink {
        fn name(&self) -> &str {
            "log"
        }
        async fn deliver(&self, d: &Delivered) -> Result<Applied, crate::sinks::SinkError> {
            if let Ok(mut l) = self.0.lock() {
                l.push(d.clone());
            }
            Ok(Applied::default())
        }
        async fn remove(&self) -> Result<Applied, crate::sinks::SinkError> {
            Ok(Applied::default())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_crl_arriving_after_the_certificate_or_changing_alone_reaches_the_sinks() {
        let a = Arc::new(TestCa::new("a"));
        let (r, _clock, pki, rx, _m) = pki_setup(&a);
        let sink = Arc::new(LogSink::default());
        let mut r = r.with_sinks(vec![SinkBinding {
            spiffe_id: "spiffe://example.org/web".parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(30),
            sink: sink.clone(),
        }]);
        let entries = [entry("web")];
        let deliveries = || sink.0.lock().expect("lock").clone();
        // The certificate comes first, before any CRL.
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        assert_eq!(deliveries().len(), 1);
        assert!(deliveries()[0].crls_der.is_empty());
        // A's CRL arrives, listing a peer's serial (not the sink's): the same certificate is
        // delivered again, now with the CRL.
        let crl1 = a.crl_msg(1, &[77]);
        assert!(r.set_revocations(&[], std::slice::from_ref(&crl1)));
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        let d = deliveries();
        assert_eq!(d.len(), 2, "the CRL is a delivery");
        assert_eq!(d[1].svid, d[0].svid, "the certificate did not change");
        assert_eq!(*d[1].crls_der, *std::slice::from_ref(&crl1.der));
        // Nothing new: nothing delivered.
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        assert_eq!(deliveries().len(), 2);
        // A newer CRL alone (another peer revoked): delivered.
        let crl2 = a.crl_msg(2, &[77, 78]);
        assert!(r.set_revocations(&[], std::slice::from_ref(&crl2)));
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        let d = deliveries();
        assert_eq!(d.len(), 3);
        assert_eq!(d[2].svid, d[0].svid);
        assert_eq!(*d[2].crls_der, *std::slice::from_ref(&crl2.der));
        assert_eq!(pki.signed(), 1, "no certificate was replaced for any of it");
        assert_eq!(*rx.borrow().crls_der, *std::slice::from_ref(&crl2.der));
    }

    /// The server publishes one CRL per CA key, roots included: the root's CRL listing the
    /// intermediate the held certificate was signed by replaces it now (under the new
    /// intermediate), and every CRL, the root's too, is served and handed to the sinks.
    #[tokio::test(start_paused = true)]
    async fn a_roots_crl_revoking_the_intermediate_replaces_now_and_every_crl_reaches_the_sinks() {
        let root = TestCa::new("root");
        let old = Arc::new(root.intermediate("old", 0x51));
        let new = Arc::new(root.intermediate("new", 0x52));
        let (r, _clock, pki, rx, _m) = pki_setup_with(&old, vec![root.der.clone()]);
        let sink = Arc::new(LogSink::default());
        let mut r = r.with_sinks(vec![SinkBinding {
            spiffe_id: "spiffe://example.org/web".parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(30),
            sink: sink.clone(),
        }]);
        let entries = [entry("web")];
        r.tick(&entries).await;
        assert_eq!(served(&rx).0, old.key_id);
        // The operator rotated to a new intermediate and revoked the old one with the root.
        *pki.ca.lock().expect("lock") = new.clone();
        let crls = [old.crl_msg(1, &[]), root.crl_msg(1, &[0x51])];
        assert!(r.set_revocations(&[], &crls));
        r.tick(&entries).await;
        settle(Duration::from_millis(10)).await;
        assert_eq!(pki.signed(), 2, "replaced now, not at half-life");
        assert_eq!(served(&rx).0, new.key_id);
        let mut want: Vec<Vec<u8>> = crls.iter().map(|c| c.der.clone()).collect();
        want.sort();
        let mut got = rx.borrow().crls_der.to_vec();
        got.sort();
        assert_eq!(got, want, "both CRLs served, the root's included");
        let last = sink
            .0
            .lock()
            .expect("lock")
            .last()
            .cloned()
            .expect("delivered");
        assert_eq!(
            served(&rx).1,
            CertRef::parse(last.svid.certificate().leaf_der())
                .expect("leaf")
                .serial_hex
        );
        let mut handed = last.crls_der.to_vec();
        handed.sort();
        assert_eq!(handed, want);
        // The replacement, under the new intermediate, is not compromised: nothing more.
        r.tick(&entries).await;
        assert_eq!(pki.signed(), 2);
    }

    #[tokio::test]
    async fn a_crl_of_an_issuer_learnt_from_a_chain_verifies_once_the_chain_arrives() {
        // The CRL's issuer is an intermediate the agent only sees in the chains it is given.
        let root = Arc::new(TestCa::new("root"));
        let other = TestCa::new("other");
        let (mut r, _clock, pki, rx, _m) = pki_setup_with(&root, vec![other.der.clone()]);
        // It lists serial 1, the first certificate the agent will be given.
        let crl = root.crl_msg(1, &[1]);
        assert!(
            !r.set_revocations(&[], std::slice::from_ref(&crl)),
            "unknown issuer yet"
        );
        assert_eq!(r.revocations().crls().count(), 0);
        r.tick(&[entry("web")]).await;
        assert_eq!(pki.signed(), 1);
        assert_eq!(
            *rx.borrow().crls_der,
            *std::slice::from_ref(&crl.der),
            "verified with the chain's CA as soon as the chain arrived, and served"
        );
        // The certificate it came with is listed: replaced on the next pass.
        r.tick(&[entry("web")]).await;
        assert_eq!(pki.signed(), 2);
        assert_eq!(served(&rx), (root.key_id.clone(), "02".into()));
    }
}
