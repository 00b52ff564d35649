//! Every sink's health as `/readyz` and the metrics show it: a [`SinkReport`] per sink, kept in
//! the shared [`SinkHealth`] table the sink workers write and the HTTP handlers read.
//!
//! Invariant: plain data and its wording ([`SinkHealth::problems`]); no I/O, and nothing here
//! depends on the workers or the metrics, which both depend on it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::sinks::SinkErrorKind;

/// A sink's state as `/readyz` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkState {
    /// Nothing delivered yet, or nothing to hold.
    Idle,
    /// Holds what it should.
    Healthy,
    /// The last attempt failed, was refused or timed out; being retried.
    Failing,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkReport {
    pub state: SinkState,
    /// Since when `state` holds.
    pub since: SystemTime,
    /// An attempt running since then.
    pub busy_since: Option<SystemTime>,
    pub last_error: Option<String>,
    pub last_error_kind: Option<SinkErrorKind>,
    /// What the last completed attempt refused to touch.
    pub warnings: Vec<String>,
    /// Consecutive failed attempts.
    pub failures: u32,
}

/// Every sink's [`SinkReport`], by name.
#[derive(Clone, Default)]
pub struct SinkHealth(Arc<Mutex<BTreeMap<String, SinkReport>>>);

impl SinkHealth {
    /// Runs `f` on the table (the workers' writes).
    pub(crate) fn with(&self, f: impl FnOnce(&mut BTreeMap<String, SinkReport>)) {
        match self.0.lock() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    pub fn reports(&self) -> Vec<(String, SinkReport)> {
        let mut out = Vec::new();
        self.with(|m| out = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
        out
    }

    /// One line per sink that fails, is busy for long, or refused something; empty when all
    /// is well.
    pub fn problems(&self, now: SystemTime) -> Vec<String> {
        let ago = |t: SystemTime| now.duration_since(t).unwrap_or_default().as_secs();
        let mut out = Vec::new();
        for (name, r) in self.reports() {
            if r.state == SinkState::Failing {
                out.push(format!(
                    "sink {name:?}: failing for {}s ({} attempts, {}): {}",
                    ago(r.since),
                    r.failures,
                    r.last_error_kind
                        .map(SinkErrorKind::label)
                        .unwrap_or("error"),
                    r.last_error.as_deref().unwrap_or("")
                ));
            }
            if let Some(b) = r.busy_since
                && ago(b) >= 5
            {
                out.push(format!(
                    "sink {name:?}: an attempt has been running for {}s",
                    ago(b)
                ));
            }
            for w in &r.warnings {
                out.push(format!("sink {name:?}: {w}"));
            }
        }
        out
    }
}
