//! The reconcilers' per-object attempt counter: capped exponential backoff with equal jitter
//! (`signet_runtime::backoff`, never zero, so a failing object is not retried at once).
//! Randomness is injected (`signet_runtime::random::Random`); the default draws from ring's
//! `SystemRandom`, as the rest of Signet does.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use signet_runtime::backoff::Backoff;
use signet_runtime::random::{Random, SystemRandom};

/// Backoff settings: first wait around `base`, never more than `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for Policy {
    /// 5 s doubling up to 5 min.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(5),
            cap: Duration::from_secs(300),
        }
    }
}

/// Counts consecutive failures per object and hands out the next wait; a success resets it.
pub struct Backoffs<K> {
    policy: Policy,
    rng: Box<dyn Random>,
    attempts: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash + Clone> Backoffs<K> {
    pub fn new(policy: Policy) -> Self {
        Self::with_random(policy, Box::new(SystemRandom::default()))
    }

    pub fn with_random(policy: Policy, rng: Box<dyn Random>) -> Self {
        Self {
            policy,
            rng,
            attempts: Mutex::new(HashMap::new()),
        }
    }

    /// Records one more failure of `key` and returns how long to wait before retrying.
    pub fn next(&self, key: &K) -> Duration {
        let attempt = {
            let mut m = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
            let n = m.entry(key.clone()).or_insert(0);
            let a = *n;
            *n = n.saturating_add(1);
            a
        };
        Backoff::equal(self.policy.base, self.policy.cap).delay(attempt, self.rng.unit())
    }

    /// How many failures in a row `key` has had.
    pub fn attempts(&self, key: &K) -> u32 {
        let m = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        m.get(key).copied().unwrap_or(0)
    }

    /// Forgets `key`'s failures (after a success, or when the object is gone).
    pub fn reset(&self, key: &K) {
        let mut m = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use signet_runtime::random::FixedRandom;

    /// The equal-jitter backoff the reconcilers retry with.
    fn backoff(attempt: u32, base: Duration, cap: Duration, rnd: f64) -> Duration {
        signet_runtime::backoff::backoff(
            attempt,
            base,
            cap,
            signet_runtime::backoff::Jitter::Equal,
            rnd,
        )
    }

    #[test]
    fn grows_then_caps_never_zero() {
        let (base, cap) = (Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(backoff(0, base, cap, 0.0), Duration::from_millis(500));
        assert!(backoff(0, base, cap, 0.999) < base);
        assert_eq!(backoff(3, base, cap, 0.0), Duration::from_secs(4));
        assert_eq!(backoff(10, base, cap, 0.0), Duration::from_secs(30));
        assert!(backoff(10, base, cap, 0.999) < cap);
        assert!(backoff(u32::MAX, base, cap, 0.999) < cap);
        assert!(backoff(40, Duration::from_secs(u64::MAX / 2), cap, 0.5) <= cap);
        assert_eq!(backoff(3, base, cap, f64::NAN), Duration::from_secs(4));
    }

    #[test]
    fn per_key_counter_resets() {
        let b = Backoffs::with_random(
            Policy {
                base: Duration::from_secs(2),
                cap: Duration::from_secs(8),
            },
            Box::new(FixedRandom(0.0)),
        );
        assert_eq!(b.next(&"a"), Duration::from_secs(1));
        assert_eq!(b.next(&"a"), Duration::from_secs(2));
        assert_eq!(b.next(&"a"), Duration::from_secs(4));
        assert_eq!(b.next(&"a"), Duration::from_secs(4));
        assert_eq!(b.next(&"b"), Duration::from_secs(1));
        assert_eq!(b.attempts(&"a"), 4);
        b.reset(&"a");
        assert_eq!(b.next(&"a"), Duration::from_secs(1));
    }

    #[test]
    fn system_random_in_range() {
        let r = SystemRandom::default();
        for _ in 0..100 {
            let x = r.unit();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
