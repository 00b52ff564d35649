//! Leader election against the stateful fake Lease API (`testing::leases`), on a paused tokio
//! runtime: every wait is virtual, `TokioClock` gives the wall time, `Clock::monotonic` the
//! elapsed time the elector measures.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use signet_runtime::clock::{Clock, SystemClock, TokioClock, from_unix};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use crate::testing::leases::{Fault, LeaseServer, Link};

const NS: &str = "signet-system";
const NAME: &str = "signet-k8s-leader";

fn cfg(identity: &str) -> LeaseConfig {
    LeaseConfig {
        namespace: NS.into(),
        name: NAME.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    }
}

fn now() -> Instant {
    SystemClock.monotonic()
}

async fn wait(d: Duration) {
    signet_runtime::clock::sleep(d).await
}

/// (when, which replica, "started" or "stopped")
type Event = (Instant, String, &'static str);

/// What the gated work of every replica did, shared by a test's replicas.
#[derive(Clone, Default)]
struct Journal {
    /// Replicas whose work is running now.
    active: Arc<AtomicUsize>,
    events: Arc<Mutex<Vec<Event>>>,
    /// Moments a work ran while its replica did not hold the Lease, or two ran at once.
    violations: Arc<Mutex<Vec<String>>>,
}

impl Journal {
    fn note(&self, who: &str, what: &'static str) {
        self.events
            .lock()
            .unwrap()
            .push((now(), who.to_owned(), what));
    }
    fn first(&self, who: &str, what: &str) -> Option<Instant> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .find(|(_, w, e)| w == who && *e == what)
            .map(|(t, _, _)| *t)
    }
    fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }
}

struct Running {
    who: String,
    journal: Journal,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.journal.active.fetch_sub(1, Ordering::SeqCst);
        self.journal.note(&self.who, "stopped");
    }
}

/// The gated work: a controller that, every 500 ms it runs, checks that its replica holds
/// the Lease and that no other replica's work runs.
async fn controllers(who: String, journal: Journal, server: LeaseServer) {
    if journal.active.fetch_add(1, Ordering::SeqCst) != 0 {
        journal
            .violations
            .lock()
            .unwrap()
            .push(format!("{who} started while another replica's work ran"));
    }
    journal.note(&who, "started");
    let _running = Running {
        who: who.clone(),
        journal: journal.clone(),
    };
    loop {
        let holder = server.holder(NS, NAME);
        if holder.as_deref() != Some(who.as_str()) {
            journal.violations.lock().unwrap().push(format!(
                "{who} acted while the Lease was held by {holder:?}"
            ));
        }
        wait(Duration::from_millis(500)).await;
    }
}

struct Replica {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<Outcome<()>, LeaderError>>,
    link: Link,
    metrics: LeaderMetrics,
}

fn replica(server: &LeaseServer, who: &str, journal: &Journal) -> Replica {
    let (client, link) = server.client();
    let metrics = LeaderMetrics::default();
    let clock = Arc::new(TokioClock::starting_at(from_unix(1_800_000_000)));
    let elector = Elector::new(client, cfg(who), clock, metrics.clone()).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let work = controllers(who.to_owned(), journal.clone(), server.clone());
    let task = tokio::spawn(elector.run_while_leading(
        async move {
            let _ = stopped.await;
        },
        work,
    ));
    Replica {
        stop: Some(stop),
        task,
        link,
        metrics,
    }
}

impl Replica {
    async fn shutdown(mut self) -> Result<Outcome<()>, LeaderError> {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap()
    }
}

fn spec(v: &Value) -> (Option<String>, i64, i64) {
    (
        v.pointer("/spec/holderIdentity")
            .and_then(Value::as_str)
            .map(str::to_owned),
        v.pointer("/spec/leaseDurationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(-1),
        v.pointer("/spec/leaseTransitions")
            .and_then(Value::as_i64)
            .unwrap_or(-1),
    )
}

/// The first write that made `who` the holder.
fn acquired_at(server: &LeaseServer, who: &str) -> Option<Instant> {
    server
        .writes()
        .iter()
        .find(|w| spec(&w.lease).0.as_deref() == Some(who))
        .map(|w| w.at)
}

/// The last write that `who` made as holder.
fn last_write_by(server: &LeaseServer, who: &str) -> Option<Instant> {
    server
        .writes()
        .iter()
        .rev()
        .find(|w| spec(&w.lease).0.as_deref() == Some(who))
        .map(|w| w.at)
}

// --- the pure rule ---------------------------------------------------------------------------

fn held_by(holder: &str, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        lease_transitions: Some(transitions),
        // The holder's clock is an hour behind: its timestamps say "expired long ago".
        renew_time: Some(micro_time(from_unix(1_800_000_000 - 3_600))),
        acquire_time: Some(micro_time(from_unix(1_800_000_000 - 3_600))),
        ..LeaseSpec::default()
    }
}

#[tokio::test(start_paused = true)]
async fn decide_follows_client_go_and_trusts_only_the_local_observation() {
    let c = cfg("b");
    let t0 = now();
    let wall = from_unix(1_800_000_000);
    let s = |secs| t0 + Duration::from_secs(secs);

    let Step::Create(new) = decide(None, t0, t0, wall, &c) else {
        panic!("an absent Lease is created");
    };
    assert_eq!(
        (
            holder(&new),
            new.lease_duration_seconds,
            new.lease_transitions
        ),
        (Some("b"), Some(15), Some(0))
    );

    // Held by "a", observed just now: its stale renewTime does not make it expired.
    let other = held_by("a", 3);
    assert_eq!(
        decide(Some(&other), t0, s(0), wall, &c),
        Step::Held { holder: "a".into() }
    );
    assert_eq!(
        decide(Some(&other), t0, s(14), wall, &c),
        Step::Held { holder: "a".into() }
    );
    // A lease duration after the record last changed (as seen here): taken, one transition more.
    let Step::Update(taken) = decide(Some(&other), t0, s(15), wall, &c) else {
        panic!("expired by local observation");
    };
    assert_eq!(
        (holder(&taken), taken.lease_transitions),
        (Some("b"), Some(4))
    );
    assert_eq!(taken.renew_time, Some(micro_time(wall)));

    // Released (no holder): taken at once.
    let free = released(&other, wall);
    assert_eq!(free.lease_duration_seconds, Some(1));
    let Step::Update(taken) = decide(Some(&free), s(0), s(0), wall, &c) else {
        panic!("a released Lease is taken at once");
    };
    assert_eq!(taken.lease_transitions, Some(4));

    // Our own: renewed, acquireTime and transitions kept.
    let mine = held_by("b", 7);
    let Step::Update(renewed) = decide(Some(&mine), t0, s(0), from_unix(1_800_000_100), &c) else {
        panic!("renew");
    };
    assert_eq!(renewed.lease_transitions, Some(7));
    assert_eq!(renewed.acquire_time, mine.acquire_time);
    assert_eq!(
        renewed.renew_time,
        Some(micro_time(from_unix(1_800_000_100)))
    );
}

#[test]
fn configurations_that_cannot_give_one_leader_are_refused() {
    assert_eq!(cfg("a").validate(), Ok(()));
    assert_eq!(cfg("").validate(), Err(ConfigError::NoIdentity));
    let mut c = cfg("a");
    c.renew_deadline = Duration::from_secs(15);
    assert!(matches!(
        c.validate(),
        Err(ConfigError::DeadlineNotBeforeExpiry { .. })
    ));
    let mut c = cfg("a");
    c.retry_period = Duration::from_secs(10);
    assert!(matches!(
        c.validate(),
        Err(ConfigError::RetryNotBeforeDeadline { .. })
    ));
    let mut c = cfg("a");
    c.lease_duration = Duration::from_millis(15_500);
    assert!(matches!(c.validate(), Err(ConfigError::LeaseDuration(_))));
}

// --- two replicas on one API server ------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn two_electors_exactly_one_leads() {
    let server = LeaseServer::new();
    let journal = Journal::default();
    let a = replica(&server, "a", &journal);
    let b = replica(&server, "b", &journal);
    wait(Duration::from_secs(60)).await;

    let leader = server.holder(NS, NAME).expect("a leader");
    let follower = if leader == "a" { "b" } else { "a" };
    assert!(journal.first(&leader, "started").is_some());
    assert_eq!(journal.first(follower, "started"), None, "the follower ran");
    assert_eq!(journal.active.load(Ordering::SeqCst), 1);
    // Renewed all along, never handed over.
    let lease = server.lease(NS, NAME).unwrap();
    assert_eq!(spec(&lease), (Some(leader.clone()), 15, 0));
    assert!(server.writes().len() >= 25, "renewed every 2 s");
    let (lm, fm) = if leader == "a" {
        (&a.metrics, &b.metrics)
    } else {
        (&b.metrics, &a.metrics)
    };
    assert_eq!(lm.transitions.get(), 1);
    assert_eq!(fm.transitions.get(), 0);
    assert_eq!(lm.renew_failures.get(), 0);
    let gauge = |m: &LeaderMetrics, who: &str| {
        m.leader
            .get_or_create(&vec![("identity", who.to_owned())])
            .get()
    };
    assert_eq!(gauge(lm, &leader), 1);
    assert_eq!(gauge(fm, follower), 0);

    assert!(matches!(
        a.shutdown().await,
        Ok(Outcome::ShutdownWhileLeading | Outcome::ShutdownWhileFollowing)
    ));
    assert!(b.shutdown().await.is_ok());
    assert_eq!(journal.violations(), Vec::<String>::new());
    assert_eq!(server.unexpected(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_dead_leader_is_replaced_only_after_the_lease_expires() {
    let server = LeaseServer::new();
    let journal = Journal::default();
    let a = replica(&server, "a", &journal);
    wait(Duration::from_secs(5)).await;
    assert_eq!(server.holder(NS, NAME).as_deref(), Some("a"));
    let b = replica(&server, "b", &journal);
    wait(Duration::from_secs(10)).await;
    assert_eq!(journal.first("b", "started"), None);

    // "a" dies without releasing (its process is gone: no renewal, no release).
    a.task.abort();
    let _ = a.task.await;
    let a_last = last_write_by(&server, "a").unwrap();
    wait(Duration::from_secs(30)).await;

    let b_acquired = acquired_at(&server, "b").expect("b took over");
    let gap = b_acquired - a_last;
    assert!(
        gap >= Duration::from_secs(15),
        "taken {gap:?} after the last renewal, before the lease duration"
    );
    assert!(
        gap <= Duration::from_secs(15 + 2 + 2),
        "taken {gap:?} after: later than a retry period past expiry"
    );
    let lease = server.lease(NS, NAME).unwrap();
    assert_eq!(spec(&lease), (Some("b".into()), 15, 1), "one handover");
    assert!(journal.first("b", "started").unwrap() >= b_acquired);
    assert!(b.shutdown().await.is_ok());
    assert_eq!(journal.violations(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_over_at_once() {
    let server = LeaseServer::new();
    let journal = Journal::default();
    let a = replica(&server, "a", &journal);
    wait(Duration::from_secs(3)).await;
    let b = replica(&server, "b", &journal);
    wait(Duration::from_secs(20)).await;
    assert_eq!(server.holder(NS, NAME).as_deref(), Some("a"));

    let released_at = now();
    assert!(matches!(
        a.shutdown().await,
        Ok(Outcome::ShutdownWhileLeading)
    ));
    let a_stopped = journal.first("a", "stopped").unwrap();
    let release = server
        .writes()
        .into_iter()
        .find(|w| spec(&w.lease) == (None, 1, 0))
        .expect("a released the Lease: no holder, leaseDurationSeconds 1");
    assert!(a_stopped <= release.at, "stopped acting before releasing");
    wait(Duration::from_secs(5)).await;

    let b_acquired = acquired_at(&server, "b").expect("b took over");
    assert!(
        b_acquired - released_at <= Duration::from_secs(2),
        "taken over within a retry period, not a lease duration: {:?}",
        b_acquired - released_at
    );
    assert_eq!(
        spec(&server.lease(NS, NAME).unwrap()),
        (Some("b".into()), 15, 1)
    );
    assert!(b.shutdown().await.is_ok());
    assert_eq!(journal.violations(), Vec::<String>::new());
}

/// A leader cut off from the API server (its calls hang, or fail) stops its work within the
/// renew deadline, before the Lease can expire for the other replica: no overlap.
async fn cut_off_leader_stops_before_the_other_acquires(fault: Fault) {
    let server = LeaseServer::new();
    let journal = Journal::default();
    let a = replica(&server, "a", &journal);
    wait(Duration::from_secs(3)).await;
    let b = replica(&server, "b", &journal);
    wait(Duration::from_secs(7)).await;
    assert_eq!(server.holder(NS, NAME).as_deref(), Some("a"));

    a.link.set(fault);
    let a_last = last_write_by(&server, "a").unwrap();
    let metrics = a.metrics.clone();
    let outcome = a.task.await.unwrap();
    assert!(
        matches!(outcome, Err(LeaderError::Lost { .. })),
        "{fault:?}: {outcome:?}"
    );
    let a_stopped = journal.first("a", "stopped").expect("a's work was dropped");
    assert!(
        a_stopped - a_last <= Duration::from_secs(10),
        "{fault:?}: acted {:?} past its last renewal",
        a_stopped - a_last
    );
    assert!(metrics.renew_failures.get() >= 1);
    assert_eq!(
        metrics
            .leader
            .get_or_create(&vec![("identity", "a".to_owned())])
            .get(),
        0
    );
    wait(Duration::from_secs(30)).await;
    let b_acquired = acquired_at(&server, "b").expect("b took over");
    let b_started = journal.first("b", "started").unwrap();
    assert!(
        a_stopped < b_acquired && b_acquired <= b_started,
        "{fault:?}: a stopped at +{:?}, b acquired at +{:?}",
        a_stopped - a_last,
        b_acquired - a_last
    );
    assert!(b_acquired - a_last >= Duration::from_secs(15));
    assert!(b.shutdown().await.is_ok());
    assert_eq!(journal.violations(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_hang_stops_before_the_lease_expires_for_the_other() {
    cut_off_leader_stops_before_the_other_acquires(Fault::Hang).await;
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_fail_stops_before_the_lease_expires_for_the_other() {
    cut_off_leader_stops_before_the_other_acquires(Fault::Fail).await;
}

#[tokio::test(start_paused = true)]
async fn a_conflict_on_acquire_is_a_loss_not_an_error() {
    let server = LeaseServer::new();
    let (client, _link) = server.client();
    let clock = Arc::new(TokioClock::starting_at(from_unix(1_800_000_000)));
    let mut b = Elector::new(client, cfg("b"), clock, LeaderMetrics::default()).unwrap();

    // Absent when read, created by "a" before b's create lands: 409 AlreadyExists.
    let s = server.clone();
    server.interpose(move |_| {
        s.store(
            NS,
            NAME,
            json!({"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0}),
        )
    });
    assert_eq!(b.try_acquire_or_renew().await.unwrap(), Try::Follower(None));
    assert_eq!(server.holder(NS, NAME).as_deref(), Some("a"));

    // Released when read, re-taken by "a" before b's update lands: 409 Conflict.
    server.store(
        NS,
        NAME,
        json!({"leaseDurationSeconds": 1, "leaseTransitions": 0}),
    );
    let s = server.clone();
    server.interpose(move |_| {
        s.store(
            NS,
            NAME,
            json!({"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 1}),
        )
    });
    assert_eq!(b.try_acquire_or_renew().await.unwrap(), Try::Follower(None));
    assert_eq!(server.holder(NS, NAME).as_deref(), Some("a"));

    // And "a"'s fresh record is then respected for a whole lease duration.
    assert_eq!(
        b.try_acquire_or_renew().await.unwrap(),
        Try::Follower(Some("a".into()))
    );
    assert_eq!(server.unexpected(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_lease_another_identity_keeps_renewing_is_never_taken() {
    let server = LeaseServer::new();
    let journal = Journal::default();
    // "a" renews every 2 s with timestamps an hour in the past (its clock is behind).
    let renewer = {
        let server = server.clone();
        tokio::spawn(async move {
            for i in 0.. {
                let stale = micro_time(from_unix(1_800_000_000 - 3_600 + i));
                server.store(
                    NS,
                    NAME,
                    json!({"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0,
                           "renewTime": stale, "acquireTime": micro_time(from_unix(1_800_000_000 - 3_600))}),
                );
                wait(Duration::from_secs(2)).await;
            }
        })
    };
    wait(Duration::from_millis(100)).await;
    let b = replica(&server, "b", &journal);
    wait(Duration::from_secs(300)).await;
    assert_eq!(journal.first("b", "started"), None, "b acted on a's Lease");
    assert_eq!(acquired_at(&server, "b"), None);
    assert_eq!(server.holder(NS, NAME).as_deref(), Some("a"));

    // Once "a" stops renewing, b takes over a lease duration later.
    renewer.abort();
    let _ = renewer.await;
    let a_last = last_write_by(&server, "a").unwrap();
    wait(Duration::from_secs(30)).await;
    let b_acquired = acquired_at(&server, "b").expect("b took over");
    assert!(b_acquired - a_last >= Duration::from_secs(15));
    assert!(b.shutdown().await.is_ok());
    assert_eq!(journal.violations(), Vec::<String>::new());
}

/// Issue 29's attack, "a second bridge replica acting without the lease": a replica that
/// cannot get the Lease (held by another, or the API server refusing it) never polls its work;
/// a replica shut down as a follower returns without having run anything.
#[tokio::test(start_paused = true)]
async fn the_gated_work_never_runs_without_the_lease() {
    let server = LeaseServer::new();
    let journal = Journal::default();
    let a = replica(&server, "a", &journal);
    wait(Duration::from_secs(1)).await;
    let b = replica(&server, "b", &journal);
    let c = replica(&server, "c", &journal);
    c.link.set(Fault::Fail);
    wait(Duration::from_secs(120)).await;
    assert_eq!(server.holder(NS, NAME).as_deref(), Some("a"));
    for who in ["b", "c"] {
        assert_eq!(journal.first(who, "started"), None, "{who} acted");
    }
    assert!(matches!(
        b.shutdown().await,
        Ok(Outcome::ShutdownWhileFollowing)
    ));
    assert!(matches!(
        c.shutdown().await,
        Ok(Outcome::ShutdownWhileFollowing)
    ));
    assert!(a.shutdown().await.is_ok());
    assert_eq!(journal.violations(), Vec::<String>::new());
    assert_eq!(server.unexpected(), Vec::<String>::new());
}
