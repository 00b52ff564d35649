//! Injected time: the one [`Clock`] trait every Signet binary reads the wall clock through,
//! the real [`SystemClock`], the [`FakeClock`] tests move by hand, and the time conversions
//! (`SystemTime` <-> Unix seconds, `Duration` -> whole seconds).
//!
//! Invariant: decisions take `now` as an argument; only an async shell calls
//! [`Clock::now`], and nothing in this module panics or wraps around: every conversion
//! saturates at the ends of its range.
//!
//! This is the one module that reads the clocks directly: `clippy.toml` bans
//! `SystemTime::now`, `std::time::Instant::now` and `tokio::time::Instant::now` everywhere
//! else, hence the `allow` below.
#![allow(clippy::disallowed_methods)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Where "now" comes from: the wall clock for what is written down (certificates, the ledger,
/// expiry), and a monotonic reading for what is measured (durations, deadlines, rates).
pub trait Clock: Send + Sync + 'static {
    /// The wall clock.
    fn now(&self) -> SystemTime;

    /// A monotonic reading, for measuring durations and setting deadlines. A
    /// `tokio::time::Instant`, not `std`'s: a paused tokio test runtime moves it
    /// (`tokio::time::advance`, auto-advance while every task sleeps), and it is what
    /// `tokio::time::sleep_until` and `timeout_at` take, so a measured duration and the timers
    /// that act on it read the same clock. Outside a paused runtime it is the real monotonic
    /// clock (`into_std()` converts).
    fn monotonic(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
}

/// The real wall clock (and the real monotonic clock, or tokio's paused one in a paused test
/// runtime).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Waits `d` on tokio's clock (so a paused test runtime moves it at once): the one sleep of
/// code that keeps time behind this module (the bridge's `clippy.toml` refuses
/// `tokio::time::sleep` elsewhere).
pub async fn sleep(d: Duration) {
    tokio::time::sleep(d).await
}

/// A clock that moves only when told, for tests: [`FakeClock::advance`] moves the wall clock
/// and the monotonic reading together ([`FakeClock::set`] only the wall clock, as a clock step
/// does). Clones share one time.
#[derive(Debug, Clone)]
pub struct FakeClock(Arc<Mutex<FakeTime>>);

#[derive(Debug)]
struct FakeTime {
    wall: SystemTime,
    /// The monotonic reading at creation, and how far it has been advanced since.
    base: tokio::time::Instant,
    elapsed: Duration,
}

impl FakeClock {
    pub fn at(t: SystemTime) -> Self {
        Self(Arc::new(Mutex::new(FakeTime {
            wall: t,
            base: tokio::time::Instant::now(),
            elapsed: Duration::ZERO,
        })))
    }

    fn time(&self) -> std::sync::MutexGuard<'_, FakeTime> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// At `secs` Unix seconds (negative: before 1970).
    pub fn at_unix(secs: impl Into<i128>) -> Self {
        let secs = secs.into();
        let secs = i64::try_from(secs).unwrap_or(if secs < 0 { i64::MIN } else { i64::MAX });
        Self::at(from_unix(secs))
    }

    /// Moves both readings forward by `d` (saturating).
    pub fn advance(&self, d: Duration) {
        let mut t = self.time();
        t.wall = t.wall.checked_add(d).unwrap_or(t.wall);
        t.elapsed = t.elapsed.saturating_add(d);
    }

    /// Sets the wall clock (forwards or back); the monotonic reading does not move.
    pub fn set(&self, to: SystemTime) {
        self.time().wall = to;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        self.time().wall
    }

    fn monotonic(&self) -> tokio::time::Instant {
        let t = self.time();
        t.base.checked_add(t.elapsed).unwrap_or(t.base)
    }
}

/// Wall time that moves with tokio's clock, from `start`: under
/// `#[tokio::test(start_paused = true)]` it advances only as the runtime's timers do, so a
/// loop that sleeps and reads the clock runs in virtual time, without waiting. Make it inside
/// the runtime.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: SystemTime,
    at: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_at(start: SystemTime) -> Self {
        Self {
            start,
            at: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        let d = tokio::time::Instant::now().saturating_duration_since(self.at);
        self.start.checked_add(d).unwrap_or(self.start)
    }
}

/// Unix seconds of `t`, rounded towards the epoch (negative before 1970; saturating).
pub fn unix(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// The `SystemTime` of Unix seconds `s`; never panics (out of `SystemTime`'s range: the epoch
/// for a past instant, the end of year 9999 for a future one).
pub fn from_unix(s: i64) -> SystemTime {
    let d = Duration::from_secs(s.unsigned_abs());
    if s >= 0 {
        SystemTime::UNIX_EPOCH
            .checked_add(d)
            .unwrap_or_else(far_future)
    } else {
        SystemTime::UNIX_EPOCH
            .checked_sub(d)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// The `SystemTime` of Unix seconds `s` read from the wire or a certificate, where a time
/// before 1970 is malformed: `None` for it and for one `SystemTime` cannot hold.
pub fn from_unix_checked(s: i64) -> Option<SystemTime> {
    u64::try_from(s)
        .ok()
        .and_then(|s| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s)))
}

/// The same, clamped: a time before 1970 (or out of range) counts as the epoch.
pub fn from_unix_clamped(s: i64) -> SystemTime {
    from_unix_checked(s).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Whole seconds of `d` as an `i64` (for a proto `int64 *_seconds` field; saturating).
pub fn whole_seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// The `Duration` of a proto seconds field; negative counts as zero.
pub fn from_seconds(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// `t`, truncated to whole Unix seconds (as X.509 validity, the wire and Kubernetes status
/// carry it); a time before 1970 counts as the epoch.
pub fn truncate_to_seconds(t: SystemTime) -> SystemTime {
    from_unix_clamped(unix(t))
}

/// Where `from_unix` saturates on a platform whose `SystemTime` cannot hold the instant: the
/// end of year 9999, beyond any certificate, which every platform holds.
fn far_future() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_round_trips_and_saturates() {
        for s in [0i64, 1, 1_800_000_000, -1, -86_400] {
            assert_eq!(unix(from_unix(s)), s);
        }
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_500);
        assert_eq!(unix(t), 1, "rounded towards the epoch");
        assert_eq!(truncate_to_seconds(t), from_unix(1));
        // Neither end panics.
        assert!(from_unix(i64::MAX) >= far_future());
        assert!(from_unix(i64::MIN) <= SystemTime::UNIX_EPOCH);
    }

    #[test]
    fn checked_and_clamped_refuse_or_floor_times_before_1970() {
        assert_eq!(from_unix_checked(5), Some(from_unix(5)));
        assert_eq!(from_unix_checked(-1), None);
        assert_eq!(from_unix_clamped(-1), SystemTime::UNIX_EPOCH);
        assert_eq!(from_unix_clamped(7), from_unix(7));
        assert_eq!(
            truncate_to_seconds(SystemTime::UNIX_EPOCH - Duration::from_secs(9)),
            SystemTime::UNIX_EPOCH
        );
    }

    #[test]
    fn seconds_fields_saturate() {
        assert_eq!(whole_seconds(Duration::from_millis(2_999)), 2);
        assert_eq!(whole_seconds(Duration::MAX), i64::MAX);
        assert_eq!(from_seconds(90), Duration::from_secs(90));
        assert_eq!(from_seconds(-5), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_the_runtime_s_virtual_time() {
        let c = TokioClock::starting_at(from_unix(1_000));
        assert_eq!(c.now(), from_unix(1_000));
        tokio::time::sleep(Duration::from_secs(3_600)).await;
        assert_eq!(c.now(), from_unix(4_600));
    }

    #[test]
    fn fake_clock_moves_only_when_told_and_clones_share_it() {
        let c = FakeClock::at_unix(1_000u64);
        let shared = c.clone();
        assert_eq!(c.now(), from_unix(1_000));
        c.advance(Duration::from_secs(5));
        assert_eq!(shared.now(), from_unix(1_005));
        shared.set(from_unix(-3));
        assert_eq!(unix(c.now()), -3);
        assert_eq!(unix(FakeClock::at_unix(7i64).now()), 7);
    }

    #[test]
    fn fake_clock_advance_moves_the_monotonic_reading_and_set_does_not() {
        let c = FakeClock::at_unix(1_000u64);
        let t0 = c.monotonic();
        c.advance(Duration::from_secs(5));
        assert_eq!(c.clone().monotonic() - t0, Duration::from_secs(5));
        c.set(from_unix(0));
        assert_eq!(
            c.monotonic() - t0,
            Duration::from_secs(5),
            "a clock step is not elapsed time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_system_clock_s_monotonic_reading_follows_a_paused_runtime() {
        let t0 = SystemClock.monotonic();
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(SystemClock.monotonic() - t0, Duration::from_secs(600));
    }
}
