//! Keyed token buckets: a pure function of (key, now), so tests move time by hand.
//!
//! The table holds at most `max_keys` buckets. Full buckets (keys idle long enough to have
//! refilled) are dropped first; when every tracked key is busy, keys that do not fit share one
//! overflow bucket, so a flood of distinct sources degrades to one shared limit instead of
//! growing memory or going unlimited.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::config::RateConfig;

/// How often a full table may be swept for refilled buckets (a sweep is O(keys)).
const PRUNE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Self {
        Self {
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, rate: &RateConfig, now: Instant) {
        if now > self.at {
            let add = now.duration_since(self.at).as_secs_f64() * rate.per_second;
            self.tokens = (self.tokens + add).min(f64::from(rate.burst));
            self.at = now;
        }
    }

    /// Takes a token, or says how long until one is there.
    fn take(&mut self, rate: &RateConfig) -> Result<(), Duration> {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        let missing = 1.0 - self.tokens;
        Err(Duration::from_secs_f64(missing / rate.per_second).max(Duration::from_millis(1)))
    }
}

struct Table<K> {
    buckets: HashMap<K, Bucket>,
    overflow: Option<Bucket>,
    last_prune: Option<Instant>,
}

/// Token buckets per key (caller label, source address).
pub struct RateLimiter<K> {
    rate: RateConfig,
    max_keys: usize,
    table: Mutex<Table<K>>,
}

impl<K> std::fmt::Debug for RateLimiter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("rate", &self.rate)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    pub fn new(rate: RateConfig, max_keys: usize) -> Self {
        Self {
            rate,
            max_keys: max_keys.max(1),
            table: Mutex::new(Table {
                buckets: HashMap::new(),
                overflow: None,
                last_prune: None,
            }),
        }
    }

    /// Takes one token for `key` at `now`: `Ok`, or `Err(how long until the next token)`.
    pub fn check(&self, key: &K, now: Instant) -> Result<(), Duration> {
        if self.rate.is_off() {
            return Ok(());
        }
        let rate = self.rate;
        let burst = f64::from(rate.burst);
        // A panic elsewhere cannot leave a bucket half-updated in a way that matters.
        let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if !t.buckets.contains_key(key) && t.buckets.len() >= self.max_keys {
            let due = t
                .last_prune
                .is_none_or(|p| now.saturating_duration_since(p) >= PRUNE_EVERY);
            if due {
                t.last_prune = Some(now);
                t.buckets.retain(|_, b| {
                    b.refill(&rate, now);
                    b.tokens < burst
                });
            }
            if t.buckets.len() >= self.max_keys {
                let b = t.overflow.get_or_insert_with(|| Bucket::full(burst, now));
                b.refill(&rate, now);
                return b.take(&rate);
            }
        }
        let b = t
            .buckets
            .entry(key.clone())
            .or_insert_with(|| Bucket::full(burst, now));
        b.refill(&rate, now);
        b.take(&rate)
    }

    /// Keys tracked now.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .buckets
            .len()
    }
}

pub use super::context::source_key;

/// "1.2s", "250ms": how long, for a person.
pub fn human(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.as_millis().max(1))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn burst_then_refill_with_a_retry_hint() {
        let l = RateLimiter::new(RateConfig::new(3, 2.0), 10);
        let t0 = crate::clock::monotonic().into_std();
        for _ in 0..3 {
            assert_eq!(l.check(&"a", t0), Ok(()));
        }
        let wait = l.check(&"a", t0).unwrap_err();
        assert_eq!(wait, secs(0.5));
        // Another key is unaffected.
        assert_eq!(l.check(&"b", t0), Ok(()));
        // Half a second later one token is back, and only one.
        assert_eq!(l.check(&"a", t0 + secs(0.5)), Ok(()));
        assert!(l.check(&"a", t0 + secs(0.5)).is_err());
        // Refill never exceeds the burst.
        let later = t0 + secs(3600.0);
        for _ in 0..3 {
            assert_eq!(l.check(&"a", later), Ok(()));
        }
        assert!(l.check(&"a", later).is_err());
    }

    #[test]
    fn off_means_unlimited() {
        let l = RateLimiter::new(RateConfig::new(0, 0.0), 1);
        let t0 = crate::clock::monotonic().into_std();
        for i in 0..1000 {
            assert_eq!(l.check(&i, t0), Ok(()));
        }
        assert_eq!(l.tracked(), 0);
    }

    #[test]
    fn the_table_is_bounded_and_extra_keys_share_one_bucket() {
        let l = RateLimiter::new(RateConfig::new(2, 1.0), 3);
        let t0 = crate::clock::monotonic().into_std();
        for k in 0..3 {
            l.check(&k, t0).unwrap();
        }
        // Keys 0..3 are busy (not refilled): key 3 and 4 share the overflow bucket.
        assert_eq!(l.check(&3, t0), Ok(()));
        assert_eq!(l.check(&4, t0), Ok(()));
        assert!(l.check(&5, t0).is_err(), "overflow bucket is shared");
        assert_eq!(l.tracked(), 3);
        // Once the tracked keys have refilled they are dropped and new keys get their own.
        let later = t0 + secs(10.0);
        assert_eq!(l.check(&6, later), Ok(()));
        assert_eq!(l.tracked(), 1);
    }

    #[test]
    fn time_going_backwards_adds_nothing() {
        let l = RateLimiter::new(RateConfig::new(1, 1.0), 3);
        let t0 = crate::clock::monotonic().into_std() + secs(10.0);
        l.check(&"a", t0).unwrap();
        assert!(l.check(&"a", t0 - secs(5.0)).is_err());
        assert!(l.check(&"a", t0 + secs(0.5)).is_err());
        assert_eq!(l.check(&"a", t0 + secs(1.0)), Ok(()));
    }

    #[test]
    fn sources_are_keyed_by_address_and_ipv6_by_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        assert_ne!(source_key(a), source_key(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(source_key(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn hints_read_well() {
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
        assert_eq!(human(Duration::ZERO), "1ms");
    }
}
