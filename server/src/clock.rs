//! Injected time. Decisions take `now` as an argument; only the async shell reads a [`Clock`].

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

/// Unix seconds of `t` (negative before 1970).
pub fn unix(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// The `SystemTime` of unix seconds `s`.
pub fn from_unix(s: i64) -> SystemTime {
    if s >= 0 {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(s.unsigned_abs())
    }
}

#[cfg(test)]
pub mod fake {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A clock tests move by hand.
    #[derive(Debug)]
    pub struct FakeClock(Mutex<SystemTime>);

    impl FakeClock {
        pub fn at_unix(secs: i64) -> Self {
            Self(Mutex::new(from_unix(secs)))
        }
        pub fn advance(&self, d: Duration) {
            let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
            *t += d;
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> SystemTime {
            *self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}
