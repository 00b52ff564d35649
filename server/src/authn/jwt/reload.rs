//! The JWKS file, re-read while the server runs: the parent module decides when (every
//! `jwks_refresh` before a token is checked, and at once, at most every [`UNKNOWN_KEY_GAP`],
//! when a token's signature finds no key) and installs the keys; this module reads the file,
//! rate-limits the reads, and says whether the contents changed.
//!
//! The whole contents are compared (by SHA-256), not the modification time: kubelet updates a
//! mounted ConfigMap by swapping a symlink, and a copy can keep its mtime. The file is a few
//! kilobytes, read at most once per interval by one thread (the others go on with the keys they
//! have), so the read on the request path costs nothing measurable.
//!
//! A file that cannot be read or parsed is reported once per distinct problem (an error log
//! line), not on every interval, and the keys last read stay in force.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::Clock;

/// Least time between two reads caused by tokens whose key is unknown: whoever sends forged
/// tokens makes the server read a small local file at most once a second.
pub(super) const UNKNOWN_KEY_GAP: Duration = Duration::from_secs(1);

/// Most bytes of a JWKS document (a cluster's has a handful of keys, a few kilobytes).
const MAX_JWKS_BYTES: u64 = 1 << 20;

struct State {
    /// When the file was last read (or its read attempted).
    last_read: Instant,
    /// SHA-256 of the contents last read, installed or refused: the same contents are not
    /// parsed (or reported) twice.
    last_seen: [u8; 32],
    /// The last problem reported, so each is logged once.
    last_problem: Option<String>,
    /// SHA-256 of the contents whose keys are in force.
    installed: [u8; 32],
}

/// `[auth.kubernetes] jwks_file` and when it was last read (on `clock`'s monotonic reading).
pub(super) struct JwksFile {
    path: PathBuf,
    interval: Duration,
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Why the file's contents could not be read as text.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("larger than {MAX_JWKS_BYTES} bytes; is it the cluster's JWKS?")]
    TooLarge,
    #[error("is not UTF-8 text")]
    NotUtf8,
}

fn read(path: &Path) -> Result<String, ReadError> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_JWKS_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_JWKS_BYTES {
        return Err(ReadError::TooLarge);
    }
    String::from_utf8(bytes).map_err(|_| ReadError::NotUtf8)
}

impl JwksFile {
    /// Reads `path` for the first time: the source, and its contents.
    pub(super) fn open(
        path: &Path,
        interval: Duration,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, String), ReadError> {
        let text = read(path)?;
        let source = Self {
            path: path.to_owned(),
            interval,
            state: Mutex::new(State {
                last_read: clock.monotonic().into_std(),
                last_seen: digest(text.as_bytes()),
                last_problem: None,
                installed: digest(text.as_bytes()),
            }),
            clock,
        };
        Ok((source, text))
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// `jwks_refresh`.
    pub(super) fn interval(&self) -> Duration {
        self.interval
    }

    /// The file's contents if it was last read at least `min_gap` ago and they differ from
    /// the contents last read; `None` otherwise (also while another thread is reading it).
    pub(super) fn changed_text(&self, min_gap: Duration) -> Option<String> {
        let mut state = match self.state.try_lock() {
            Ok(s) => s,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let now = self.clock.monotonic().into_std();
        if now.saturating_duration_since(state.last_read) < min_gap {
            return None;
        }
        state.last_read = now;
        match read(&self.path) {
            Ok(text) => {
                let d = digest(text.as_bytes());
                if d == state.last_seen {
                    state.last_problem = None;
                    return None;
                }
                state.last_seen = d;
                state.last_problem = None;
                Some(text)
            }
            Err(e) => {
                drop(state);
                self.report_problem(format!(
                    "cannot be read ({e}); still verifying tokens with the keys last read"
                ));
                None
            }
        }
    }

    /// Reads the file now, whatever the interval (SIGHUP): its contents, or `None` when they
    /// are the ones whose keys are in force.
    pub(super) fn read_now(&self) -> Result<Option<String>, ReadError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.last_read = self.clock.monotonic().into_std();
        let text = read(&self.path)?;
        let d = digest(text.as_bytes());
        state.last_seen = d;
        if d == state.installed {
            state.last_problem = None;
            return Ok(None);
        }
        Ok(Some(text))
    }

    /// Records that the keys of `text` are now in force.
    pub(super) fn installed(&self, text: &str) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .installed = digest(text.as_bytes());
    }

    /// Logs `problem` with the file unless it is the one reported last.
    pub(super) fn report_problem(&self, problem: String) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.last_problem.as_deref() == Some(problem.as_str()) {
            return;
        }
        tracing::error!(
            jwks_file = %self.path.display(),
            "auth.kubernetes.jwks_file {problem}"
        );
        state.last_problem = Some(problem);
    }
}
