//! Serial number sources.
//!
//! Every certificate gets a random 128-bit serial (as SPIRE does). The raw 16 bytes are handed
//! to rcgen's `SerialNumber`, whose DER encoder strips leading zero bytes and prepends `0x00`
//! when the high bit is set, so the encoded INTEGER is always positive; a source never returns
//! all zeroes, so the serial is never zero either.

use std::sync::atomic::{AtomicU64, Ordering};

use ring::rand::{SecureRandom, SystemRandom};

/// Where certificate serials come from (injected, so tests are deterministic).
pub trait SerialSource: Send + Sync {
    /// 16 bytes, big-endian; never all zeroes.
    fn next_serial(&self) -> [u8; 16];
}

/// Serials from the operating system's CSPRNG.
#[derive(Debug)]
pub struct RandomSerials {
    rng: SystemRandom,
}

impl RandomSerials {
    pub fn new() -> Self {
        Self {
            rng: SystemRandom::new(),
        }
    }
}

impl Default for RandomSerials {
    fn default() -> Self {
        Self::new()
    }
}

impl SerialSource for RandomSerials {
    fn next_serial(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        loop {
            self.rng
                .fill(&mut out)
                .expect("the operating system's random number generator failed");
            if out.iter().any(|b| *b != 0) {
                return out;
            }
        }
    }
}

/// A deterministic source for tests: 1, 2, 3, … (zero is skipped), optionally with a fixed
/// high half so tests can exercise serials whose top bit is set.
#[derive(Debug)]
pub struct SequentialSerials {
    high: u64,
    next: AtomicU64,
}

impl SequentialSerials {
    /// Counts up from `start` (as the low 64 bits; the high 64 bits are zero).
    pub fn new(start: u64) -> Self {
        Self::with_high(0, start)
    }

    /// Counts up from `start` in the low 64 bits with `high` as the high 64 bits.
    pub fn with_high(high: u64, start: u64) -> Self {
        Self {
            high,
            next: AtomicU64::new(start),
        }
    }
}

impl SerialSource for SequentialSerials {
    fn next_serial(&self) -> [u8; 16] {
        loop {
            let low = self.next.fetch_add(1, Ordering::Relaxed);
            if self.high == 0 && low == 0 {
                continue;
            }
            let mut out = [0u8; 16];
            out[..8].copy_from_slice(&self.high.to_be_bytes());
            out[8..].copy_from_slice(&low.to_be_bytes());
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_serials_differ_and_are_not_zero() {
        let s = RandomSerials::new();
        let a = s.next_serial();
        let b = s.next_serial();
        assert_ne!(a, b);
        assert_ne!(a, [0u8; 16]);
    }

    #[test]
    fn sequential_skips_zero() {
        let s = SequentialSerials::new(0);
        assert_eq!(s.next_serial()[15], 1);
        assert_eq!(s.next_serial()[15], 2);
        let h = SequentialSerials::with_high(0x8000_0000_0000_0000, 0);
        assert_eq!(h.next_serial()[0], 0x80);
    }
}
