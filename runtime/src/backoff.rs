//! Capped exponential backoff, the one definition every Signet binary retries with: the
//! ceiling doubles from `base` per attempt up to `cap`, then a [`Jitter`] choice spreads the
//! wait below it; an optional floor keeps a failing call from being retried at once. [`spread`]
//! is the same ± spread for a fixed period (a loop that ticks every `interval` ±10%). [`Retry`]
//! is the reusable state beside it (failures in a row and when the next attempt is due), so a
//! loop keeps one value per retried thing instead of a hand-kept counter and deadline.
//!
//! Invariant: pure arithmetic on the attempt number and a drawn number `rnd` in `[0, 1)`
//! (see [`crate::random`]); no overflow, never above the cap, never below the floor; a
//! non-finite `rnd` counts as 0.

use std::time::{Duration, SystemTime};

/// How the wait is drawn below the ceiling `c = min(cap, base·2^attempt)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Jitter {
    /// Uniform in `[0, c)` (AWS's "full jitter").
    Full,
    /// Uniform in `[c/2, c)`: never zero.
    Equal,
    /// Uniform in `[c·(1-f), c·(1+f))`, never above the cap (`Spread(0.1)`: ±10%).
    Spread(f64),
    /// Exactly the ceiling (one client of one server, where spreading retries buys nothing).
    None,
}

/// A backoff policy: first ceiling `base`, doubling per attempt, never above `cap`, never
/// below `floor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    pub jitter: Jitter,
    pub floor: Duration,
}

impl Backoff {
    /// Full jitter, no floor.
    pub const fn full(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: Jitter::Full,
            floor: Duration::ZERO,
        }
    }

    /// Equal jitter (never under half the ceiling).
    pub const fn equal(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: Jitter::Equal,
            floor: Duration::ZERO,
        }
    }

    /// No jitter: exactly `min(cap, base·2^attempt)`.
    pub const fn exact(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: Jitter::None,
            floor: Duration::ZERO,
        }
    }

    /// The same, never shorter than `floor`.
    pub const fn with_floor(self, floor: Duration) -> Self {
        Self { floor, ..self }
    }

    /// The same, never shorter than half the base (a full jitter that cannot retry at once).
    pub const fn with_half_base_floor(self) -> Self {
        let floor = match self.base.checked_div(2) {
            Some(h) => h,
            None => Duration::ZERO,
        };
        self.with_floor(floor)
    }

    /// The wait before attempt `attempt + 1` (`attempt` counts failures from 0).
    pub fn delay(&self, attempt: u32, rnd: f64) -> Duration {
        backoff(attempt, self.base, self.cap, self.jitter, rnd).max(self.floor)
    }
}

/// `min(cap, base·2^attempt)`, without overflow.
pub fn ceiling(attempt: u32, base: Duration, cap: Duration) -> Duration {
    base.checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(cap)
        .min(cap)
}

/// The wait after `attempt` failures (from 0): the [`ceiling`] spread by `jitter`, `rnd` in
/// `[0, 1)`.
pub fn backoff(attempt: u32, base: Duration, cap: Duration, jitter: Jitter, rnd: f64) -> Duration {
    let c = ceiling(attempt, base, cap);
    let rnd = unit(rnd);
    match jitter {
        Jitter::Full => c.mul_f64(rnd),
        Jitter::Equal => c / 2 + (c / 2).mul_f64(rnd),
        Jitter::Spread(f) => spread(c, f, rnd).min(cap),
        Jitter::None => c,
    }
}

/// `period` spread by ±`fraction` (clamped to `[0, 1]`): uniform in
/// `[period·(1-f), period·(1+f))` for `rnd` in `[0, 1)`.
pub fn spread(period: Duration, fraction: f64, rnd: f64) -> Duration {
    let f = unit(fraction);
    period.mul_f64(1.0 - f + 2.0 * f * unit(rnd))
}

/// `x` clamped to `[0, 1]`; a non-finite `x` counts as 0.
fn unit(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// The state of one retried thing: failures in a row and when the next attempt is due.
#[derive(Clone, Debug, PartialEq)]
pub struct Retry {
    policy: Backoff,
    failures: u32,
    due: SystemTime,
}

impl Retry {
    /// No failure yet; the first attempt due at `due`.
    pub fn new(policy: Backoff, due: SystemTime) -> Self {
        Self {
            policy,
            failures: 0,
            due,
        }
    }

    pub fn due(&self) -> SystemTime {
        self.due
    }

    pub fn is_due(&self, now: SystemTime) -> bool {
        now >= self.due
    }

    /// Failures in a row since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// One more failure at `now`: the next attempt after the policy's backoff. Returns the
    /// wait.
    pub fn failed(&mut self, now: SystemTime, rnd: f64) -> Duration {
        let wait = self.policy.delay(self.failures, rnd);
        self.failed_after(now, wait);
        wait
    }

    /// One more failure at `now`, the next attempt after `wait` (a caller with its own
    /// growth rule, given [`Self::failures`]).
    pub fn failed_after(&mut self, now: SystemTime, wait: Duration) {
        self.failures = self.failures.saturating_add(1);
        self.due = now.checked_add(wait).unwrap_or(now);
    }

    /// A success: failures forgotten, the next attempt at `next`.
    pub fn succeeded(&mut self, next: SystemTime) {
        self.failures = 0;
        self.due = next;
    }

    /// Moves the next attempt to `at`, keeping the failure count (the thing is wanted again
    /// for another reason, e.g. a new connection).
    pub fn reschedule(&mut self, at: SystemTime) {
        self.due = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const ALMOST: f64 = 0.999_999;

    #[test]
    fn full_jitter_grows_caps_and_reaches_zero() {
        let cap = Duration::from_secs(60);
        let b = |a, r| backoff(a, S, cap, Jitter::Full, r);
        assert!(b(0, ALMOST) < S);
        assert!(b(3, ALMOST) > Duration::from_millis(7_999) && b(3, ALMOST) < 8 * S);
        assert!(b(6, ALMOST) < cap && b(6, ALMOST) > Duration::from_millis(59_999));
        assert!(b(u32::MAX, ALMOST) < cap);
        assert!(
            backoff(
                40,
                Duration::from_secs(u64::MAX / 2),
                cap,
                Jitter::Full,
                ALMOST
            ) < cap
        );
        assert_eq!(b(5, 0.0), Duration::ZERO);
        assert_eq!(b(5, -3.0), Duration::ZERO);
        assert_eq!(b(5, f64::NAN), Duration::ZERO);
    }

    #[test]
    fn equal_jitter_is_never_under_half_the_ceiling() {
        let cap = Duration::from_secs(60);
        let b = |a, r| backoff(a, S, cap, Jitter::Equal, r);
        assert_eq!(b(0, 0.0), Duration::from_millis(500));
        assert!(b(0, ALMOST) < S);
        assert_eq!(b(3, 0.0), 4 * S);
        assert_eq!(b(10, 0.0), 30 * S);
        assert!(b(10, ALMOST) < cap);
        assert!(b(u32::MAX, ALMOST) < cap);
        assert!(
            backoff(
                40,
                Duration::from_secs(u64::MAX / 2),
                cap,
                Jitter::Equal,
                0.5
            ) <= cap
        );
        assert_eq!(b(3, f64::NAN), 4 * S);
    }

    #[test]
    fn spread_is_plus_or_minus_the_fraction_and_capped() {
        let cap = Duration::from_secs(100);
        let b = |a, r| backoff(a, 10 * S, cap, Jitter::Spread(0.1), r);
        assert_eq!(b(0, 0.0), 9 * S);
        assert_eq!(b(0, 0.5), 10 * S);
        assert!(b(0, ALMOST) > Duration::from_millis(10_999) && b(0, ALMOST) < 11 * S);
        assert_eq!(b(10, ALMOST), cap, "never above the cap");
        assert_eq!(b(10, 0.0), 90 * S);
    }

    #[test]
    fn exact_doubles_to_the_cap_whatever_is_drawn() {
        let p = Backoff::exact(S / 4, 10 * S);
        let waits: Vec<Duration> = (0..8).map(|a| p.delay(a, ALMOST)).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(
            waits,
            [ms(250), ms(500), S, 2 * S, 4 * S, 8 * S, 10 * S, 10 * S]
        );
        assert_eq!(p.delay(u32::MAX, 0.0), 10 * S);
    }

    #[test]
    fn a_period_spreads_both_ways() {
        let d = 10 * S;
        assert_eq!(spread(d, 0.1, 0.0), 9 * S);
        assert_eq!(spread(d, 0.1, 0.5), d);
        assert!(spread(d, 0.1, ALMOST) > Duration::from_millis(10_999));
        assert!(
            spread(d, 0.1, ALMOST) < 11 * S,
            "above the period, unlike a backoff cap"
        );
        assert_eq!(spread(d, 0.0, ALMOST), d);
        assert_eq!(spread(d, f64::NAN, ALMOST), d);
        assert_eq!(spread(d, 0.1, f64::NAN), 9 * S);
        assert_eq!(
            spread(d, 5.0, 0.0),
            Duration::ZERO,
            "the fraction is clamped to 1"
        );
    }

    #[test]
    fn floor_holds_under_full_jitter() {
        let p = Backoff::full(S, 30 * S).with_half_base_floor();
        assert_eq!(p, Backoff::full(S, 30 * S).with_floor(S / 2));
        assert_eq!(p.delay(0, 0.0), S / 2);
        assert_eq!(p.delay(4, 0.0), S / 2);
        assert_eq!(p.delay(4, 0.5), 8 * S);
        assert_eq!(p.delay(30, ALMOST), (30 * S).mul_f64(ALMOST));
    }

    #[test]
    fn retry_counts_failures_grows_and_resets_on_success() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut r = Retry::new(Backoff::equal(2 * S, 8 * S), t0);
        assert!(r.is_due(t0) && r.failures() == 0);
        let waits: Vec<Duration> = (0..4).map(|_| r.failed(t0, 0.0)).collect();
        assert_eq!(waits, [S, 2 * S, 4 * S, 4 * S]);
        assert_eq!(r.failures(), 4);
        assert_eq!(r.due(), t0 + 4 * S);
        assert!(!r.is_due(t0 + 3 * S));
        r.reschedule(t0);
        assert_eq!(
            (r.due(), r.failures()),
            (t0, 4),
            "rescheduling keeps the count"
        );
        r.succeeded(t0 + 60 * S);
        assert_eq!((r.due(), r.failures()), (t0 + 60 * S, 0));
        assert_eq!(r.failed(t0, 0.0), S, "back to the first wait");
        r.failed_after(t0, 7 * S);
        assert_eq!((r.due(), r.failures()), (t0 + 7 * S, 2));
    }
}
