//! Rotation policy as pure functions: when to renew, when to replace a compromised
//! certificate, and whether a certificate may still be served. Time and randomness come in as
//! arguments; the backoff arithmetic is `signet_runtime::backoff`'s.

use std::time::{Duration, SystemTime};

use signet_runtime::backoff::Backoff;

/// Jitter spreads renewals over ±this fraction of the lifetime around the target.
pub const JITTER_SPAN: f64 = 0.10;
/// Never renew later than this fraction of the lifetime.
pub const LATEST_FRACTION: f64 = 0.90;

/// When to renew a certificate valid from `not_before` to `not_after`: at `fraction` of its
/// lifetime, moved by up to ±[`JITTER_SPAN`] of the lifetime (`jitter` in `[0, 1)`; 0.5 means
/// no shift), clamped to `[not_before, not_before + 90% of the lifetime]`. A certificate with
/// no lifetime (`not_after <= not_before`) is due at once (`not_before`).
pub fn renew_at(
    not_before: SystemTime,
    not_after: SystemTime,
    fraction: f64,
    jitter: f64,
) -> SystemTime {
    let Ok(lifetime) = not_after.duration_since(not_before) else {
        return not_before;
    };
    if lifetime.is_zero() {
        return not_before;
    }
    let fraction = if fraction.is_finite() { fraction } else { 0.5 };
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let shifted = fraction + (jitter * 2.0 - 1.0) * JITTER_SPAN;
    let at = shifted.clamp(0.0, LATEST_FRACTION);
    not_before + lifetime.mul_f64(at)
}

/// First wait before replacing again a certificate that came back compromised (the server still
/// signs with the tainted key, or lists the new serial too).
pub const COMPROMISED_RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest such wait.
pub const COMPROMISED_RETRY_CAP: Duration = Duration::from_secs(60);
/// How such replacements back off: capped exponential, full jitter, at least half the base.
pub const COMPROMISED_RETRY: Backoff =
    Backoff::full(COMPROMISED_RETRY_BASE, COMPROMISED_RETRY_CAP).with_half_base_floor();

/// When a held certificate is to be renewed.
///
/// - Not compromised: at `scheduled` (drawn with [`renew_at`] when it was obtained).
/// - Compromised (issued under a tainted CA key, or listed in its issuer's CRL: see
///   [`crate::revocation::Revocations::check`]): now, not at its usual time — `obtained` (the
///   instant the agent installed it) when it is the first compromised certificate in a row;
///   after a capped, jittered backoff from `obtained` when `reissues` replacements in a row came
///   back compromised too, so a server still signing with the tainted key causes no loop.
///
/// `jitter` in `[0, 1)`, drawn once per certificate. Never later than `scheduled`.
pub fn renewal_due(
    scheduled: SystemTime,
    obtained: SystemTime,
    compromised: bool,
    reissues: u32,
    jitter: f64,
) -> SystemTime {
    if !compromised {
        return scheduled;
    }
    let wait = match reissues {
        0 => Duration::ZERO,
        n => COMPROMISED_RETRY.delay(n - 1, jitter),
    };
    (obtained + wait).min(scheduled)
}

/// Whether a certificate may be served at `now`: the last good certificate is served until it
/// expires, even while renewal fails. Not before its `not_before` either.
pub fn should_serve(not_before: SystemTime, not_after: SystemTime, now: SystemTime) -> bool {
    now >= not_before && now < not_after
}

/// [`should_serve`] for a certificate the agent holds.
pub fn serves(cert: &signet_pki::SvidCertificate, now: SystemTime) -> bool {
    should_serve(cert.not_before(), cert.not_after(), now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full-jitter backoff the agent retries with.
    fn backoff(attempt: u32, base: Duration, cap: Duration, rnd: f64) -> Duration {
        signet_runtime::backoff::backoff(
            attempt,
            base,
            cap,
            signet_runtime::backoff::Jitter::Full,
            rnd,
        )
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn renews_at_fraction_without_jitter() {
        assert_eq!(renew_at(t(1000), t(2000), 0.5, 0.5), t(1500));
        assert_eq!(renew_at(t(0), t(3600), 0.75, 0.5), t(2700));
    }

    #[test]
    fn jitter_spans_ten_percent_each_way() {
        assert_eq!(renew_at(t(0), t(1000), 0.5, 0.0), t(400));
        let late = renew_at(t(0), t(1000), 0.5, 0.999_999);
        assert!(late > t(599) && late <= t(600), "{late:?}");
    }

    #[test]
    fn never_after_ninety_percent_nor_before_start() {
        assert_eq!(renew_at(t(0), t(1000), 0.85, 0.99), t(900));
        assert_eq!(renew_at(t(0), t(1000), 2.0, 0.5), t(900));
        assert_eq!(renew_at(t(100), t(1100), 0.05, 0.0), t(100));
        assert_eq!(renew_at(t(0), t(1000), f64::NAN, f64::NAN), t(500));
    }

    #[test]
    fn degenerate_lifetimes_renew_now() {
        assert_eq!(renew_at(t(10), t(10), 0.5, 0.5), t(10));
        assert_eq!(renew_at(t(10), t(5), 0.5, 0.5), t(10));
    }

    #[test]
    fn backoff_grows_then_caps() {
        let base = Duration::from_secs(1);
        let cap = Duration::from_secs(60);
        let almost = 0.999_999;
        assert!(backoff(0, base, cap, almost) < Duration::from_secs(1));
        assert!(backoff(3, base, cap, almost) > Duration::from_millis(7_999));
        assert!(backoff(3, base, cap, almost) < Duration::from_secs(8));
        assert!(backoff(6, base, cap, almost) < cap);
        assert!(backoff(6, base, cap, almost) > Duration::from_millis(59_999));
        // Huge attempts neither overflow nor exceed the cap.
        assert!(backoff(u32::MAX, base, cap, almost) < cap);
        assert!(backoff(40, Duration::from_secs(u64::MAX / 2), cap, almost) < cap);
    }

    #[test]
    fn backoff_full_jitter_reaches_zero() {
        let d = backoff(5, Duration::from_secs(1), Duration::from_secs(60), 0.0);
        assert_eq!(d, Duration::ZERO);
        let d = backoff(5, Duration::from_secs(1), Duration::from_secs(60), -3.0);
        assert_eq!(d, Duration::ZERO);
    }

    #[test]
    fn a_compromised_certificate_is_due_at_once_then_with_backoff() {
        let (obtained, scheduled) = (t(1000), t(5000));
        assert_eq!(renewal_due(scheduled, obtained, false, 0, 0.5), scheduled);
        assert_eq!(renewal_due(scheduled, obtained, false, 7, 0.5), scheduled);
        // The first compromised certificate: now (obtained is in the past).
        assert_eq!(renewal_due(scheduled, obtained, true, 0, 0.9), obtained);
        // Replacements that came back compromised: growing, jittered, capped, never zero.
        let waits: Vec<Duration> = (1..=12)
            .map(|n| {
                renewal_due(scheduled, obtained, true, n, 0.999_999)
                    .duration_since(obtained)
                    .expect("after")
            })
            .collect();
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert!(waits[0] >= COMPROMISED_RETRY_BASE / 2, "{waits:?}");
        assert!(waits[11] < COMPROMISED_RETRY_CAP, "{waits:?}");
        assert!(waits[11] > COMPROMISED_RETRY_CAP / 2, "{waits:?}");
        assert_eq!(
            renewal_due(scheduled, obtained, true, 3, 0.0),
            obtained + COMPROMISED_RETRY_BASE / 2,
            "full jitter floored at half the base"
        );
        // Never later than the usual time.
        assert_eq!(renewal_due(t(1001), obtained, true, 30, 0.99), t(1001));
    }

    #[test]
    fn serves_until_expiry() {
        assert!(should_serve(t(0), t(100), t(0)));
        assert!(should_serve(t(0), t(100), t(99)));
        assert!(!should_serve(t(0), t(100), t(100)));
        assert!(!should_serve(t(10), t(100), t(9)));
    }
}
