//! The wall clock, injected: decisions take `now` as an argument; tests move a [`FakeClock`].
//! The only wall-clock read and the only sleep of the bridge are here (`clippy.toml`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

pub trait Clock: Send + Sync {
    fn now(&self) -> SystemTime;
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    // The one wall-clock read of the bridge (clippy.toml refuses it elsewhere).
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told.
#[derive(Clone, Debug)]
pub struct FakeClock(Arc<Mutex<SystemTime>>);

impl FakeClock {
    pub fn at(t: SystemTime) -> Self {
        Self(Arc::new(Mutex::new(t)))
    }
    /// At `secs` after the Unix epoch.
    pub fn at_unix(secs: u64) -> Self {
        Self::at(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    }
    pub fn advance(&self, d: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t += d;
    }
    pub fn set(&self, to: SystemTime) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Waits `d`: the one place the bridge sleeps (`clippy.toml` refuses `tokio::time::sleep`
/// elsewhere), on tokio's clock so a paused test runtime moves it instantly.
#[allow(clippy::disallowed_methods)]
pub async fn sleep(d: Duration) {
    tokio::time::sleep(d).await
}
