//! Capped exponential backoff with full jitter, and a per-object attempt counter for
//! reconcilers. Randomness is injected ([`Random`]); the default draws from ring's
//! `SystemRandom`, as the rest of Signet does.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

/// A source of uniform numbers in `[0, 1)`.
pub trait Random: Send + Sync {
    fn unit(&self) -> f64;
}

/// ring's `SystemRandom`.
pub struct SystemRandom(ring::rand::SystemRandom);

impl Default for SystemRandom {
    fn default() -> Self {
        Self(ring::rand::SystemRandom::new())
    }
}

impl Random for SystemRandom {
    fn unit(&self) -> f64 {
        use ring::rand::SecureRandom;
        let mut b = [0u8; 8];
        if self.0.fill(&mut b).is_err() {
            return 0.5;
        }
        // 53 random bits -> [0, 1).
        (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A fixed number, for tests.
pub struct FixedRandom(pub f64);

impl Random for FixedRandom {
    fn unit(&self) -> f64 {
        self.0
    }
}

/// A uniform wait in `[min(cap, base·2^attempt)/2, min(cap, base·2^attempt))` ("equal
/// jitter": never zero, so a failing object is not retried at once; `rnd` in `[0, 1)`).
/// `attempt` counts from 0.
pub fn backoff(attempt: u32, base: Duration, cap: Duration, rnd: f64) -> Duration {
    let ceiling = base
        .checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(cap)
        .min(cap);
    let rnd = if rnd.is_finite() {
        rnd.clamp(0.0, 1.0)
    } else {
        0.0
    };
    ceiling / 2 + (ceiling / 2).mul_f64(rnd)
}

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
        backoff(attempt, self.policy.base, self.policy.cap, self.rng.unit())
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
