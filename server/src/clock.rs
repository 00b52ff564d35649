//! Injected time: the server reads the wall clock only through `signet_runtime::clock`'s
//! [`Clock`] (decisions take `now` as an argument; only the async shell calls `now()`), and
//! converts with its saturating [`unix`] / [`from_unix`].
//!
//! A thin re-export, kept so the server's many `crate::clock` imports need no edit; change the
//! clock or the conversions in `runtime/src/clock.rs`.

pub use signet_runtime::clock::{Clock, SystemClock, from_unix, unix};

/// The system clock's monotonic reading (tokio's, so a paused test runtime moves it; see
/// [`Clock::monotonic`]), for code that does not take an injected [`Clock`]: grep for this to
/// find them. Logic reads the injected clock (the ledger writer, the audit log, the JWKS
/// re-reads, `/readyz`, the gRPC rate limits, the entry streams' start); what is left is the
/// tests' own stopwatches and [`crate::limits::conn`]'s idle timer, whose reading must be the
/// clock its tokio `Sleep` runs on (a paused runtime moves both). `.into_std()` where a
/// `std::time::Instant` is wanted.
pub fn monotonic() -> tokio::time::Instant {
    SystemClock.monotonic()
}

/// The system clock's wall time, for tests.
#[cfg(test)]
pub fn system_now() -> std::time::SystemTime {
    SystemClock.now()
}

#[cfg(test)]
pub mod fake {
    pub use signet_runtime::clock::FakeClock;
}
