use super::*;
use crate::ca::{AttestCredential, Attested, CaError, Crl, EntriesUpdate, WorkloadCsr};
use crate::config::DeletionPolicy;
use crate::sinks::{Applied, Sink};
use crate::state::{Selector, channel};
use signet_runtime::clock::FakeClock;
use std::sync::Mutex;

use crate::revocation::{CertRef, Revocations};
use crate::sinks::Delivered;
use crate::sinks::worker::Telemetry;
use crate::state::{AgentState, StateSender};
use crate::testing::TestCa;
use signet_pki::SvidCertificate;

/// The rotator with what the driver lends each pass: its trust state and its outlets (the
/// state and the sinks, started on the first pass as the driver starts them when it runs).
struct Rig {
    rotator: Rotator,
    trust: Trust,
    outlets: Outlets,
    clock: Arc<dyn Clock>,
    random: Random,
    metrics: Option<Arc<Metrics>>,
}

impl Rig {
    fn new(
        ca: Arc<dyn Ca>,
        clock: Arc<dyn Clock>,
        random: Random,
        fraction: f64,
        state: StateSender,
    ) -> Self {
        Self {
            rotator: Rotator::new(ca, clock.clone(), random.clone(), fraction),
            trust: Trust::default(),
            outlets: Outlets::new(state),
            clock,
            random,
            metrics: None,
        }
    }

    fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.rotator = self.rotator.with_metrics(metrics.clone());
        self.trust = self.trust.with_metrics(metrics.clone());
        self.metrics = Some(metrics);
        self
    }

    fn with_sinks(mut self, sinks: Vec<SinkBinding>) -> Self {
        self.outlets = self.outlets.with_sinks(sinks);
        self
    }

    async fn tick(&mut self, entries: &[EntrySpec]) -> SystemTime {
        self.outlets.start_sinks(
            Telemetry::new(self.metrics.as_ref().map(|m| m.sinks.clone())),
            self.clock.clone(),
            self.random.clone(),
        );
        self.rotator
            .tick(entries, &mut self.trust, &mut self.outlets)
            .await
    }

    fn set_bundle(&mut self, trust_domain_id: String, bundle_der: Vec<Vec<u8>>) {
        self.trust.set_bundle(trust_domain_id, bundle_der);
    }

    fn set_revocations(&mut self, tainted: &[String], crls: &[Crl]) -> bool {
        self.trust.set_revocations(tainted, crls)
    }

    fn revocations(&self) -> &Revocations {
        self.trust.revocations()
    }
}

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
                .map_err(|e| bad(e.to_string()))?;
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
        federates_with: vec![],
    }
}

fn setup() -> (
    Rig,
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
    let mut r = Rig::new(ca.clone(), clock.clone(), Arc::new(|| 0.5), 0.5, tx);
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
    let text = metrics.encode(signet_runtime::metrics::Format::OpenMetrics);
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
    let text = metrics.encode(signet_runtime::metrics::Format::OpenMetrics);
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
fn the_next_pass_is_the_earliest_renewal_within_max_sleep_or_the_retry() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let soon = now + Duration::from_secs(5);
    let later = now + Duration::from_secs(600);
    let done = Ended::Done { overdue: false };
    assert_eq!(next_pass(now, Some(soon), done), soon);
    assert_eq!(next_pass(now, Some(later), done), now + MAX_SLEEP);
    assert_eq!(next_pass(now, None, done), now + MAX_SLEEP);
    // A failure waits its backoff, even past an earlier renewal.
    let wait = Duration::from_secs(7);
    assert_eq!(
        next_pass(now, Some(soon), Ended::Failed { wait }),
        now + wait
    );
    // A pushback caps the wait; something still due is looked at after BACKOFF_BASE.
    let until = now + Duration::from_secs(2);
    assert_eq!(next_pass(now, Some(soon), Ended::Held { until }), until);
    assert_eq!(
        next_pass(now, Some(soon), Ended::Done { overdue: true }),
        now + BACKOFF_BASE
    );
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
    assert_eq!(r.rotator.failures, 0);
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
    /// The server is down: every call fails as unavailable.
    down: Mutex<bool>,
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
        if *self.down.lock().map_err(|e| bad(e.to_string()))? {
            return Err(CaError::Unavailable("down".into()));
        }
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
                .map_err(|e| bad(e.to_string()))?;
            out.push((c.entry_id, Ok(svid)));
        }
        Ok(out)
    }
}

fn pki_setup(
    ca: &Arc<TestCa>,
) -> (
    Rig,
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
    Rig,
    Arc<FakeClock>,
    Arc<PkiCa>,
    crate::state::StateReceiver,
    Arc<Metrics>,
) {
    // Real time: the test CA's certificates are valid from the wall clock's now.
    let t0 = signet_runtime::clock::SystemClock.now();
    let clock = Arc::new(FakeClock::at(t0));
    let pki = Arc::new(PkiCa {
        clock: clock.clone(),
        ca: Mutex::new(ca.clone()),
        serial: Mutex::new(0),
        down: Mutex::new(false),
    });
    let (tx, rx) = channel();
    let (_mtx, mrx) = channel();
    let metrics = Arc::new(Metrics::new(mrx, clock.clone()));
    let mut r = Rig::new(pki.clone(), clock.clone(), Arc::new(|| 0.5), 0.5, tx)
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
    let text = metrics.encode(signet_runtime::metrics::Format::OpenMetrics);
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
    let text = metrics.encode(signet_runtime::metrics::Format::OpenMetrics);
    // Every reason is listed from start-up; this rejection counted under one of them.
    assert!(
        text.lines().any(
            |l| l.starts_with("signet_agent_crl_rejections_total{reason=") && !l.ends_with(" 0")
        ),
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
            .encode(signet_runtime::metrics::Format::OpenMetrics)
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

/// A restart during an outage with a cache holding a certificate a verified CRL the agent
/// holds lists (a replayed cache): never served, never delivered, and the failing
/// replacement backs off without counting or logging each attempt.
#[tokio::test(start_paused = true)]
async fn a_restored_revoked_certificate_is_never_served_nor_delivered() {
    let a = Arc::new(TestCa::new("a"));
    let (mut r, _clock, _pki, rx, _m) = pki_setup(&a);
    let entries = [entry("web")];
    r.tick(&entries).await;
    let old = rx.borrow().identities[0].svid.clone();
    let serial = u64::from_str_radix(
        &CertRef::parse(old.certificate().leaf_der())
            .expect("leaf")
            .serial_hex,
        16,
    )
    .expect("hex");

    // The restarted agent: the server is down, the CRL listing the old serial is known.
    let (r, clock, pki, rx, metrics) = pki_setup(&a);
    *pki.down.lock().expect("lock") = true;
    *pki.serial.lock().expect("lock") = 100;
    let sink = Arc::new(LogSink::default());
    let mut r = r.with_sinks(vec![SinkBinding {
        spiffe_id: "spiffe://example.org/web".parse().expect("id"),
        deletion_policy: DeletionPolicy::Delete,
        timeout: Duration::from_secs(30),
        sink: sink.clone(),
    }]);
    assert!(r.set_revocations(&[], &[a.crl_msg(3, &[serial])]));
    r.outlets.start_sinks(
        Telemetry::new(Some(metrics.sinks.clone())),
        r.clock.clone(),
        r.random.clone(),
    );
    let restored = r.rotator.restore(
        &entries,
        vec![("web".into(), (*old).clone())],
        &mut r.trust,
        &mut r.outlets,
    );
    assert_eq!(restored, 0);
    assert!(rx.borrow().identities.is_empty(), "not served");
    let mut waits = Vec::new();
    for _ in 0..5 {
        let next = r.tick(&entries).await;
        waits.push(next.duration_since(clock.now()).unwrap_or_default());
        advance(&clock, next);
        assert!(rx.borrow().identities.is_empty(), "not served");
    }
    settle(Duration::from_millis(10)).await;
    assert!(sink.0.lock().expect("lock").is_empty(), "never delivered");
    // The failing sign backs off like any other (full jitter at 0.5: 0.5, 1, 2, 4, 8 s).
    assert!(waits.windows(2).all(|w| w[1] > w[0]), "{waits:?}");
    let text = metrics.encode(signet_runtime::metrics::Format::OpenMetrics);
    assert!(
        text.contains("signet_agent_compromised_replacements_total 0"),
        "{text}"
    );

    // The server is back: a new certificate is served and delivered.
    *pki.down.lock().expect("lock") = false;
    r.tick(&entries).await;
    settle(Duration::from_millis(10)).await;
    let served = rx.borrow().identities[0].svid.clone();
    assert_ne!(served, old);
    let d = sink.0.lock().expect("lock").clone();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].svid, served);
}

/// A held certificate a new CRL lists, while the server is down: withdrawn at once (the sink
/// keeps what it has: Retain is not asked for, nothing is delivered), the replacement retried
/// with backoff, and counted once, when it is installed.
#[tokio::test(start_paused = true)]
async fn a_revoked_held_certificate_is_withdrawn_and_its_replacement_counted_once() {
    let a = Arc::new(TestCa::new("a"));
    let (r, clock, pki, rx, metrics) = pki_setup(&a);
    let sink = Arc::new(LogSink::default());
    let mut r = r.with_sinks(vec![SinkBinding {
        spiffe_id: "spiffe://example.org/web".parse().expect("id"),
        deletion_policy: DeletionPolicy::Retain,
        timeout: Duration::from_secs(30),
        sink: sink.clone(),
    }]);
    let entries = [entry("web")];
    r.tick(&entries).await;
    settle(Duration::from_millis(10)).await;
    assert_eq!(sink.0.lock().expect("lock").len(), 1);
    *pki.down.lock().expect("lock") = true;
    assert!(r.set_revocations(&[], &[a.crl_msg(2, &[1])]));
    let mut waits = Vec::new();
    for _ in 0..4 {
        let next = r.tick(&entries).await;
        assert!(rx.borrow().identities.is_empty(), "withdrawn");
        waits.push(next.duration_since(clock.now()).unwrap_or_default());
        advance(&clock, next);
    }
    assert!(waits.windows(2).all(|w| w[1] > w[0]), "{waits:?}");
    let count = || {
        metrics
            .encode(signet_runtime::metrics::Format::OpenMetrics)
            .lines()
            .find(|l| l.starts_with("signet_agent_compromised_replacements_total "))
            .map(str::to_owned)
    };
    assert_eq!(
        count().as_deref(),
        Some("signet_agent_compromised_replacements_total 0")
    );
    *pki.down.lock().expect("lock") = false;
    r.tick(&entries).await;
    settle(Duration::from_millis(10)).await;
    assert_eq!(rx.borrow().identities.len(), 1);
    assert_eq!(
        count().as_deref(),
        Some("signet_agent_compromised_replacements_total 1")
    );
    assert_eq!(
        sink.0.lock().expect("lock").len(),
        2,
        "only the replacement delivered"
    );
}
