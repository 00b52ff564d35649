//! Injected time: decisions take `now` as an argument; only the async shell reads a [`Clock`].

use std::time::SystemTime;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The real wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that says what it is told, for tests.
#[derive(Debug)]
pub struct FixedClock(pub std::sync::Mutex<SystemTime>);

impl Clock for FixedClock {
    fn now(&self) -> SystemTime {
        self.0.lock().map(|t| *t).unwrap_or(SystemTime::UNIX_EPOCH)
    }
}
