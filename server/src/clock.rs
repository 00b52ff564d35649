//! Injected time: the server reads the wall clock only through `signet_runtime::clock`'s
//! [`Clock`] (decisions take `now` as an argument; only the async shell calls `now()`), and
//! converts with its saturating [`unix`] / [`from_unix`].
//!
//! A thin re-export, kept so the server's many `crate::clock` imports need no edit; change the
//! clock or the conversions in `runtime/src/clock.rs`.

pub use signet_runtime::clock::{Clock, SystemClock, from_unix, unix};

#[cfg(test)]
pub mod fake {
    pub use signet_runtime::clock::FakeClock;
}
