//! The loop's schedule, driven by hand: given results and `now`, which step is due and how
//! long the loop sleeps. No I/O, no sleeping; randomness fixed or seeded.

use super::*;
use signet_runtime::random::{FixedRandom, SeededRandom};

const S: Duration = Duration::from_secs(1);
const ALMOST: f64 = 0.999_999;

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// A node certificate valid from `from` for `life` seconds, not naming any CA key.
fn cert(from: u64, life: u64) -> NodeCert {
    NodeCert {
        not_before: t(from),
        not_after: t(from + life),
        leaf: None,
    }
}

/// A leaf issued by a CA whose key ID it names (AKI), as a schedule input; and that key ID.
fn leaf_under_a_key() -> (CertRef, String) {
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut p = rcgen::CertificateParams::default();
    p.use_authority_key_identifier_extension = true;
    let leaf = p.signed_by(&key, &issuer).expect("leaf");
    let r = CertRef::parse(leaf.der()).expect("parses");
    let id = r.issuer_key_id.clone().expect("AKI");
    (r, id)
}

fn none() -> Revocations {
    Revocations::default()
}

/// A schedule for an hour-long node certificate obtained at t(1000), jitter 0.5 (no shift).
fn fresh() -> Schedule {
    Schedule::new(
        &cert(1000, 3600),
        t(1000),
        0.5,
        Duration::from_secs(10),
        &FixedRandom(0.5),
    )
}

/// The steps of one pass at `now`, in order (each reported as done without a result).
fn pass(s: &Schedule, now: SystemTime, stream_due: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut after = None;
    while let Some(step) = s.plan(now, after, &none(), stream_due) {
        steps.push(step);
        after = Some(step);
    }
    steps
}

#[test]
fn a_pass_runs_the_due_steps_in_order_once_each() {
    let mut s = fresh();
    // Not connected: only the connection and the rotator (serving what is held).
    assert_eq!(pass(&s, t(1000), true), [Step::Connect, Step::Rotate]);
    s.connect_succeeded();
    assert_eq!(
        pass(&s, t(1000), true),
        [Step::SyncEntries, Step::OpenBundleStream, Step::Rotate]
    );
    assert_eq!(
        pass(&s, t(1000), false),
        [Step::SyncEntries, Step::Rotate],
        "an open stream is not reopened"
    );
    s.sync_succeeded(t(1000), false);
    assert!(s.rotated(t(1060)), "ready: synced once");
    assert_eq!(pass(&s, t(1000), false), [] as [Step; 0]);
    assert_eq!(pass(&s, t(1010), false), [Step::SyncEntries]);
    assert_eq!(pass(&s, t(1060), false), [Step::SyncEntries, Step::Rotate]);
}

#[test]
fn readiness_needs_a_successful_sync() {
    let mut s = fresh();
    s.connect_succeeded();
    assert!(!s.rotated(t(1001)));
    s.sync_failed(t(1001), 0.5, None);
    assert!(!s.rotated(t(1002)));
    s.sync_succeeded(t(1002), true);
    assert!(s.rotated(t(1003)));
}

#[test]
fn changed_entries_bundles_and_revocations_rotate_at_once() {
    let mut s = fresh();
    s.connect_succeeded();
    s.rotated(t(2000));
    s.sync_succeeded(t(1000), false);
    assert!(!pass(&s, t(1005), false).contains(&Step::Rotate));
    s.sync_succeeded(t(1005), true);
    assert!(pass(&s, t(1005), false).contains(&Step::Rotate));
    s.rotated(t(2000));
    s.rotate_now(t(1006));
    assert!(pass(&s, t(1006), false).contains(&Step::Rotate));
}

#[test]
fn the_node_renews_at_its_jittered_fraction_clamped() {
    // Jitter 0.5: at half the lifetime exactly.
    let mut s = fresh();
    s.connect_succeeded();
    s.sync_succeeded(t(1000), false);
    s.rotated(t(9000));
    assert!(!pass(&s, t(2799), false).contains(&Step::RenewNode));
    assert!(pass(&s, t(2800), false).contains(&Step::RenewNode));
    // Jitter bounds: ±10% of the lifetime.
    for (rnd, due) in [(0.0, 1000 + 1440), (ALMOST, 1000 + 2160)] {
        let mut s = Schedule::new(&cert(1000, 3600), t(1000), 0.5, S, &FixedRandom(rnd));
        s.connect_succeeded();
        assert!(!pass(&s, t(due - 1), false).contains(&Step::RenewNode));
        assert!(pass(&s, t(due), false).contains(&Step::RenewNode), "{rnd}");
    }
    // Seeded draws all land within the bounds.
    let r = SeededRandom::new(42);
    for _ in 0..200 {
        let mut s = Schedule::new(&cert(1000, 3600), t(1000), 0.5, S, &r);
        s.connect_succeeded();
        assert!(!pass(&s, t(1000 + 1439), false).contains(&Step::RenewNode));
        assert!(pass(&s, t(1000 + 2160), false).contains(&Step::RenewNode));
    }
}

#[test]
fn a_stored_identity_past_its_renewal_time_renews_once_connected() {
    // Obtained at t(1000) from a certificate issued at t(0) for an hour: half-life passed.
    let mut s = Schedule::new(&cert(0, 3600), t(2000), 0.5, S, &FixedRandom(0.5));
    assert_eq!(pass(&s, t(2000), false), [Step::Connect, Step::Rotate]);
    s.connect_succeeded();
    assert_eq!(pass(&s, t(2000), false)[0], Step::RenewNode);
}

#[test]
fn connection_failures_back_off_exponentially_capped_floored_then_reset() {
    let mut s = fresh();
    let mut now = t(1000);
    let mut waits = Vec::new();
    for _ in 0..8 {
        let w = s.connect_failed(now, ALMOST);
        waits.push(w);
        assert!(!pass(&s, now + w - Duration::from_millis(1), false).contains(&Step::Connect));
        now += w;
        assert_eq!(pass(&s, now, false)[0], Step::Connect);
    }
    assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
    assert!(waits[0] < RETRY_BASE && waits[4] > 15 * S, "{waits:?}");
    assert!(waits.iter().all(|w| *w < RETRY_CAP), "{waits:?}");
    assert!(waits[7] > RETRY_CAP - S, "capped: {waits:?}");
    // Full jitter, floored at half the base.
    assert_eq!(s.connect_failed(now, 0.0), RETRY_BASE / 2);
    // A success forgets the failures: after the next renewal, the first wait again.
    s.connect_succeeded();
    s.node_renewed(&cert(2800, 3600), t(2800), &none(), &FixedRandom(0.5));
    assert!(!s.is_connected(), "a renewed node reconnects");
    assert_eq!(pass(&s, t(2800), false)[0], Step::Connect);
    assert!(s.connect_failed(t(2800), ALMOST) < RETRY_BASE);
}

#[test]
fn a_failed_node_renewal_is_retried_after_its_backoff_whatever_else_says() {
    let mut s = fresh();
    s.connect_succeeded();
    s.sync_succeeded(t(2800), false);
    s.rotated(t(9000));
    let w1 = s.node_renewal_failed(t(2800), 0.0, None);
    assert_eq!(w1, RETRY_BASE / 2);
    assert!(!pass(&s, t(2800), false).contains(&Step::RenewNode));
    assert_eq!(s.wait(t(2800), &none(), None), RETRY_BASE / 2);
    let w2 = s.node_renewal_failed(t(2801), ALMOST, None);
    assert!(w2 > RETRY_BASE && w2 < 2 * RETRY_BASE, "{w2:?}");
    // Renewed: back to the usual schedule of the new certificate, failures forgotten.
    s.node_renewed(&cert(2803, 3600), t(2803), &none(), &FixedRandom(0.5));
    s.connect_succeeded();
    assert!(!pass(&s, t(2803 + 1799), false).contains(&Step::RenewNode));
    assert!(pass(&s, t(2803 + 1800), false).contains(&Step::RenewNode));
    assert_eq!(
        s.node_renewal_failed(t(4603), ALMOST, None),
        RETRY_BASE.mul_f64(ALMOST)
    );
}

#[test]
fn a_node_renewal_the_server_shed_waits_at_least_its_pushback() {
    let mut s = fresh();
    s.connect_succeeded();
    s.sync_succeeded(t(2800), false);
    s.rotated(t(9000));
    // The server shed the renewal and said 20 s: not retried before, whatever the jitter.
    let w = s.node_renewal_failed(t(2800), 0.0, Some(Duration::from_secs(20)));
    assert_eq!(w, Duration::from_secs(20));
    assert!(!pass(&s, t(2819), false).contains(&Step::RenewNode));
    assert!(pass(&s, t(2820), false).contains(&Step::RenewNode));
    // A pushback shorter than the backoff changes nothing: the backoff still grows.
    let w = s.node_renewal_failed(t(2820), ALMOST, Some(Duration::from_millis(1)));
    assert!(w > RETRY_BASE && w < 2 * RETRY_BASE, "{w:?}");
}

#[test]
fn the_renewed_lifetime_counts_from_now_not_the_backdated_start() {
    let mut s = fresh();
    s.connect_succeeded();
    // Issued "at" t(2790) (backdated), installed at t(2800): half of 3600 s from t(2800).
    s.node_renewed(&cert(2790, 3610), t(2800), &none(), &FixedRandom(0.5));
    s.connect_succeeded();
    assert!(!pass(&s, t(2800 + 1799), false).contains(&Step::RenewNode));
    assert!(pass(&s, t(2800 + 1800), false).contains(&Step::RenewNode));
}

#[test]
fn a_compromised_node_renews_at_once_then_only_after_a_growing_backoff() {
    let (leaf, key_id) = leaf_under_a_key();
    let node = NodeCert {
        leaf: Some(leaf.clone()),
        ..cert(1000, 3600)
    };
    let mut s = Schedule::new(&node, t(1000), 0.5, S, &FixedRandom(0.5));
    s.connect_succeeded();
    let mut rev = none();
    assert!(s.plan(t(1001), None, &rev, false) != Some(Step::RenewNode));
    assert!(rev.set_tainted(std::slice::from_ref(&key_id)));
    assert!(s.node_compromise(&rev).is_some());
    assert_eq!(s.plan(t(1001), None, &rev, false), Some(Step::RenewNode));
    // The server still signs with the tainted key: each replacement is compromised too.
    let mut now = t(1001);
    let mut waits = Vec::new();
    for _ in 0..8 {
        assert!(
            s.node_renewed(&node, now, &rev, &FixedRandom(ALMOST))
                .is_some()
        );
        s.connect_succeeded();
        let due = (0..=120)
            .map(|i| now + Duration::from_millis(500 * i))
            .find(|at| s.plan(*at, None, &rev, false) == Some(Step::RenewNode))
            .expect("due within a minute");
        waits.push(due.duration_since(now).expect("later"));
        now = due;
    }
    assert!(waits[0] >= S / 2, "{waits:?}");
    assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
    assert!(waits[7] > Duration::from_secs(30), "{waits:?}");
    // The taint is lifted: the next one is renewed at its usual time.
    s.node_renewed(&node, now, &none(), &FixedRandom(0.5));
    s.connect_succeeded();
    assert_eq!(
        s.plan(now + S, None, &none(), false),
        Some(Step::SyncEntries)
    );
}

#[test]
fn a_failing_sync_backs_off_exponentially_with_full_jitter_up_to_the_cap_then_resets() {
    // The ceiling doubles from the base per failure; full jitter below it, never under half
    // the base; never above the cap.
    assert_eq!(sync_retry_wait(0, 0.0, None), RETRY_BASE / 2);
    assert!(sync_retry_wait(0, ALMOST, None) < RETRY_BASE);
    assert_eq!(sync_retry_wait(3, 0.5, None), 4 * S);
    assert!(sync_retry_wait(3, ALMOST, None) > Duration::from_millis(7_999));
    assert!(sync_retry_wait(3, ALMOST, None) < 8 * S);
    assert_eq!(sync_retry_wait(9, 0.0, None), RETRY_BASE / 2);
    assert!(sync_retry_wait(9, ALMOST, None) < RETRY_CAP);
    assert!(sync_retry_wait(9, ALMOST, None) > RETRY_CAP - S);
    assert!(sync_retry_wait(u32::MAX, ALMOST, None) < RETRY_CAP);
    // The schedule draws it per failure: at jitter 0.5, the first retry after 0.5 s, the
    // second after 1 s, the third after 2 s.
    let mut s = fresh();
    s.connect_succeeded();
    let t0 = t(1000);
    assert_eq!(s.sync_failed(t0, 0.5, None), S / 2);
    assert_eq!(s.sync_failures(), 1);
    assert!(!pass(&s, t0 + S / 4, false).contains(&Step::SyncEntries));
    assert!(pass(&s, t0 + S / 2, false).contains(&Step::SyncEntries));
    assert_eq!(s.sync_failed(t0 + S / 2, 0.5, None), S);
    assert_eq!(s.sync_failed(t0 + 2 * S, 0.5, None), 2 * S);
    assert_eq!(s.sync_failures(), 3);
    assert!(!pass(&s, t0 + 3 * S, false).contains(&Step::SyncEntries));
    assert!(pass(&s, t0 + 4 * S, false).contains(&Step::SyncEntries));
    // A success forgets the failures: the next sync at the interval, the next failure's
    // retry from the base again.
    s.sync_succeeded(t0 + 4 * S, false);
    assert_eq!(s.sync_failures(), 0);
    assert!(!pass(&s, t0 + 13 * S, false).contains(&Step::SyncEntries));
    assert!(pass(&s, t0 + 14 * S, false).contains(&Step::SyncEntries));
    assert_eq!(
        s.sync_failed(t0 + 14 * S, 0.5, None),
        S / 2,
        "reset on success"
    );
}

#[test]
fn agents_failing_together_retry_their_syncs_spread_over_the_cap() {
    // A thousand agents at their sixth failure in a row (ceiling 32 s, capped at 30 s), drawing
    // seeded jitter: spread over the whole window, none sooner than the floor.
    let r = SeededRandom::new(7);
    let waits: Vec<Duration> = (0..1000)
        .map(|_| sync_retry_wait(5, r.unit(), None))
        .collect();
    assert!(waits.iter().all(|w| *w >= RETRY_BASE / 2 && *w < RETRY_CAP));
    let buckets = waits.iter().fold([0u32; 6], |mut b, w| {
        b[((w.as_secs_f64() / 5.0) as usize).min(5)] += 1;
        b
    });
    assert!(
        buckets.iter().all(|n| (100..250).contains(n)),
        "{buckets:?}"
    );
}

#[test]
fn a_sync_pushback_holds_every_sync_even_a_pushed_change() {
    let mut s = fresh();
    s.connect_succeeded();
    let t0 = t(1000);
    // Shed with a 40 s pushback: above the backoff and the interval, so it rules.
    assert_eq!(s.sync_failed(t0, 0.5, Some(40 * S)), 40 * S);
    assert!(!pass(&s, t0 + 39 * S, false).contains(&Step::SyncEntries));
    // The server pushes an entry change meanwhile: not before the pushback runs out.
    s.sync_now(t0 + 5 * S);
    assert!(!pass(&s, t0 + 5 * S, false).contains(&Step::SyncEntries));
    assert!(!pass(&s, t0 + 39 * S, false).contains(&Step::SyncEntries));
    assert!(pass(&s, t0 + 40 * S, false).contains(&Step::SyncEntries));
    // A pushback shorter than the backoff: the backoff.
    assert_eq!(s.sync_failed(t0 + 40 * S, 0.5, Some(S / 10)), S);
    // Without a pushback, a pushed change brings a sync in backoff forward at once.
    s.sync_succeeded(t0 + 41 * S, false);
    assert_eq!(
        s.sync_failed(t0 + 42 * S, ALMOST, None),
        sync_retry_wait(0, ALMOST, None)
    );
    s.sync_now(t0 + 42 * S);
    assert!(pass(&s, t0 + 42 * S, false).contains(&Step::SyncEntries));
    // After a success the hold is gone: a pushed change syncs at once.
    s.sync_failed(t0 + 43 * S, 0.5, Some(60 * S));
    s.sync_succeeded(t0 + 103 * S, false);
    s.sync_now(t0 + 104 * S);
    assert!(pass(&s, t0 + 104 * S, false).contains(&Step::SyncEntries));
}

#[test]
fn the_sleep_is_bounded_by_the_interval_and_the_minimum_pause() {
    let mut s = fresh();
    // Not connected: until the connection retry (the sync is not waited for).
    s.rotated(t(5000));
    let w = s.connect_failed(t(1000), 0.0);
    assert_eq!(s.wait(t(1000), &none(), None), w);
    // Never longer than the sync interval.
    s.connect_succeeded();
    s.sync_succeeded(t(1000), false);
    assert_eq!(s.wait(t(1000), &none(), None), 10 * S);
    // The stream's reopening wakes it.
    assert_eq!(s.wait(t(1000), &none(), Some(t(1003))), 3 * S);
    // Something overdue: the minimum pause, never a spin.
    s.rotate_now(t(900));
    assert_eq!(s.wait(t(1000), &none(), None), MIN_PAUSE);
    // The node's expiry wakes it even when nothing else would.
    let mut s = Schedule::new(&cert(1000, 4), t(1000), 0.9, 60 * S, &FixedRandom(0.5));
    s.rotated(t(9000));
    s.connect_failed(t(1000), ALMOST);
    s.connect_failed(t(1000), ALMOST);
    s.connect_failed(t(1000), ALMOST);
    s.connect_failed(t(1000), ALMOST);
    assert_eq!(s.wait(t(1000), &none(), None), 4 * S);
}
