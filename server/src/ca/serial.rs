//! Serial number sources.
//!
//! Every certificate gets a 128-bit serial: the issuance time in milliseconds since the Unix
//! epoch (48 bits, big-endian) followed by 80 bits from the operating system's CSPRNG. The random
//! part is what the serial is for: nobody can predict a to-be-signed certificate's bytes before
//! it is issued (the CA/Browser Forum asks for at least 64 bits of CSPRNG output; SPIRE uses 128
//! random bits). The time prefix is what the ledger is for: serials are stored in a unique index,
//! and serials that grow with time land at that index's right edge, as the sequence number does,
//! instead of on a random page of an index that at ten million rows is most of a gigabyte (a
//! random page is a cache miss, a page split in the middle, and, after every checkpoint, a
//! whole page written to the write-ahead log). It discloses little a certificate does not
//! already say: notBefore is the same instant less its fixed backdating, to the second.
//!
//! The raw 16 bytes are handed to rcgen's `SerialNumber`, whose DER encoder strips leading zero
//! bytes and prepends `0x00` when the high bit is set, so the encoded INTEGER is always positive.
//! The first byte is the top of the millisecond count: `0x01` from 2004 to 2039, and it stays
//! below `0x80` until the year 6429, so today's serials are 16 bytes, spelled as 32 hex digits,
//! and the hex order is the numeric order. A source never returns all zeroes, so the serial is
//! never zero either.

#[cfg(any(test, feature = "fuzzing"))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ring::rand::{SecureRandom, SystemRandom};

/// Where certificate serials come from (injected, so tests are deterministic).
pub trait SerialSource: Send + Sync {
    /// The serial of a certificate issued at `now` (the issuance's own clock reading, the one
    /// its notBefore comes from): 16 bytes, big-endian; never all zeroes.
    fn next_serial(&self, now: SystemTime) -> [u8; 16];
}

/// Bytes of the serial taken by the millisecond timestamp; the rest are random.
const TIME_BYTES: usize = 6;

/// Serials from the clock and the operating system's CSPRNG (see the module docs).
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
    fn next_serial(&self, now: SystemTime) -> [u8; 16] {
        // A clock before the epoch gives a zero prefix: the serial is still 80 random bits.
        let millis = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut out = [0u8; 16];
        out[..TIME_BYTES].copy_from_slice(&millis.to_be_bytes()[8 - TIME_BYTES..]);
        loop {
            self.rng
                .fill(&mut out[TIME_BYTES..])
                .expect("the operating system's random number generator failed");
            // Zero only with the clock at the epoch and all 80 random bits zero.
            if out.iter().any(|b| *b != 0) {
                return out;
            }
        }
    }
}

/// A deterministic source for tests: 1, 2, 3, … (zero is skipped), optionally with a fixed
/// high half so tests can exercise serials whose top bit is set.
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Debug)]
pub struct SequentialSerials {
    high: u64,
    next: AtomicU64,
}

#[cfg(any(test, feature = "fuzzing"))]
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

#[cfg(any(test, feature = "fuzzing"))]
impl SerialSource for SequentialSerials {
    fn next_serial(&self, _now: SystemTime) -> [u8; 16] {
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
    use std::time::Duration;

    use super::*;

    /// 2026-12-02T00:00:00Z plus `ms` milliseconds.
    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_796_169_600_000 + ms)
    }

    #[test]
    fn random_serials_differ_and_are_not_zero() {
        let s = RandomSerials::new();
        let a = s.next_serial(crate::clock::system_now());
        let b = s.next_serial(crate::clock::system_now());
        assert_ne!(a, b);
        assert_ne!(a, [0u8; 16]);
        // Issued today: the first byte is the millisecond count's top (0x01 until 2039), so the
        // DER INTEGER keeps all 16 bytes and needs no sign byte.
        assert!((0x01..0x80).contains(&a[0]), "{a:02x?}");
        // A clock at (or before) the epoch: no time, still random, never zero.
        let early = s.next_serial(UNIX_EPOCH - Duration::from_secs(1));
        assert_eq!(early[..TIME_BYTES], [0; TIME_BYTES]);
        assert_ne!(early, [0u8; 16]);
    }

    #[test]
    fn random_serials_grow_with_time_and_keep_eighty_random_bits() {
        let s = RandomSerials::new();
        let (a, b, c) = (
            s.next_serial(at(0)),
            s.next_serial(at(0)),
            s.next_serial(at(1)),
        );
        assert_eq!(a[..TIME_BYTES], 1_796_169_600_000u64.to_be_bytes()[2..]);
        assert_eq!(a[..TIME_BYTES], b[..TIME_BYTES]);
        assert_ne!(a[TIME_BYTES..], b[TIME_BYTES..], "the random part differs");
        // The spelling the ledger indexes sorts as the time does.
        let hex = |v: &[u8; 16]| signet_types::serial_hex(v);
        assert_eq!(hex(&a).len(), 32);
        assert!(hex(&a).max(hex(&b)) < hex(&c));
        assert!(hex(&s.next_serial(at(0) - Duration::from_millis(1))) < hex(&a).min(hex(&b)));
        // Over many serials each random bit is sometimes set and sometimes clear.
        let (mut ones, mut zeros) = ([0u8; 10], [0u8; 10]);
        for _ in 0..64 {
            let v = s.next_serial(at(0));
            for i in 0..10 {
                ones[i] |= v[TIME_BYTES + i];
                zeros[i] |= !v[TIME_BYTES + i];
            }
        }
        assert_eq!(ones, [0xff; 10]);
        assert_eq!(zeros, [0xff; 10]);
    }

    #[test]
    fn sequential_skips_zero() {
        let s = SequentialSerials::new(0);
        assert_eq!(s.next_serial(at(0))[15], 1);
        assert_eq!(s.next_serial(at(0))[15], 2);
        let h = SequentialSerials::with_high(0x8000_0000_0000_0000, 0);
        assert_eq!(h.next_serial(at(0))[0], 0x80);
    }
}
