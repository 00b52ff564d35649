//! Injected randomness for jitter: the one [`Random`] trait (uniform numbers in `[0, 1)`),
//! the production [`SystemRandom`] (ring's `SystemRandom`, as the rest of Signet draws from),
//! the deterministic ones tests use ([`FixedRandom`], [`SeededRandom`]), and [`keyed_unit`]: a
//! number fixed by a key, for jitter that every replica must agree on (the server's CA
//! rotation thresholds, keyed by the CA key's ID).
//!
//! Invariant: a decision that depends on chance takes the drawn number as an argument (see
//! [`crate::backoff`]); only the shell holds a [`Random`]. Every source here returns a finite
//! number in `[0, 1)`, never panics, and is not meant for keys or serials (those use ring
//! directly).

use std::sync::Mutex;

/// A source of uniform numbers in `[0, 1)`.
///
/// Any `Fn() -> f64` closure is one, so a test can pass `Arc::new(|| 0.0)`.
pub trait Random: Send + Sync {
    fn unit(&self) -> f64;
}

impl<F: Fn() -> f64 + Send + Sync> Random for F {
    fn unit(&self) -> f64 {
        self()
    }
}

/// ring's `SystemRandom` (the operating system's generator).
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
            // Jitter only spreads load: the middle of the range is a safe fallback.
            return 0.5;
        }
        unit_of(u64::from_le_bytes(b))
    }
}

/// Always the same number (clamped into `[0, 1)` when read), for tests.
#[derive(Debug, Clone, Copy)]
pub struct FixedRandom(pub f64);

impl Random for FixedRandom {
    fn unit(&self) -> f64 {
        self.0
    }
}

/// A deterministic sequence from a seed (SplitMix64), for tests that want spread without
/// chance: the same seed gives the same numbers on every run and platform.
#[derive(Debug)]
pub struct SeededRandom(Mutex<u64>);

impl SeededRandom {
    pub fn new(seed: u64) -> Self {
        Self(Mutex::new(seed))
    }
}

impl Random for SeededRandom {
    fn unit(&self) -> f64 {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        unit_of(z ^ (z >> 31))
    }
}

/// A number in `[0, 1)` fixed by `key`: the top 53 bits of the first eight bytes of its
/// SHA-256, big-endian. The same key gives the same number on every run, platform and replica;
/// it is as unpredictable as the key (a key ID, the hash of a fresh public key, is random).
pub fn keyed_unit(key: &[u8]) -> f64 {
    let digest = ring::digest::digest(&ring::digest::SHA256, key);
    let mut eight = [0u8; 8];
    eight.copy_from_slice(&digest.as_ref()[..8]);
    unit_of(u64::from_be_bytes(eight))
}

/// The top 53 bits of `x` as a number in `[0, 1)`.
fn unit_of(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_random_in_range() {
        let r = SystemRandom::default();
        for _ in 0..100 {
            let x = r.unit();
            assert!((0.0..1.0).contains(&x));
        }
    }

    #[test]
    fn seeded_is_deterministic_in_range_and_spread() {
        let (a, b) = (SeededRandom::new(7), SeededRandom::new(7));
        let xs: Vec<f64> = (0..1000).map(|_| a.unit()).collect();
        let ys: Vec<f64> = (0..1000).map(|_| b.unit()).collect();
        assert_eq!(xs, ys, "same seed, same numbers");
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let low = xs.iter().filter(|x| **x < 0.5).count();
        assert!((400..600).contains(&low), "{low} of 1000 below 0.5");
        assert_ne!(
            SeededRandom::new(8).unit(),
            xs[0],
            "another seed, another sequence"
        );
    }

    #[test]
    fn keyed_is_the_top_53_bits_of_the_sha256_and_spread() {
        // SHA-256("abc") starts ba7816bf8f01cfea.
        assert_eq!(
            keyed_unit(b"abc"),
            (0xba78_16bf_8f01_cfea_u64 >> 11) as f64 / 2f64.powi(53)
        );
        assert_eq!(
            keyed_unit(b"abc"),
            keyed_unit(b"abc"),
            "same key, same number"
        );
        let xs: Vec<f64> = (0..1000u32).map(|i| keyed_unit(&i.to_be_bytes())).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let low = xs.iter().filter(|x| **x < 0.5).count();
        assert!((400..600).contains(&low), "{low} of 1000 below 0.5");
    }

    #[test]
    fn closures_and_fixed_are_sources() {
        let f: std::sync::Arc<dyn Random> = std::sync::Arc::new(|| 0.25);
        assert_eq!(f.unit(), 0.25);
        assert_eq!(FixedRandom(0.75).unit(), 0.75);
    }
}
