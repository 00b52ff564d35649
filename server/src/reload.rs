//! SIGHUP: what the server takes up again without a restart, and the one log line per thing
//! that says what happened (reloaded, unchanged, failed, or waiting for a restart). A SIGHUP
//! never stops the server, and a reload that fails keeps what is in force.
//!
//! Reloaded: the log level (`log_level` / `--log-level`, with the configuration loaded again
//! exactly as at start-up), the service-account JWKS (`[auth.kubernetes] jwks_file`, also
//! re-read every `jwks_refresh`), a plugged-in CA's files (`[ca] cert_file` …, also re-read
//! every rotator tick). Every other key is read once at start: one that differs from the
//! running configuration is named (never its value) as taking effect at the next restart. A
//! configuration that no longer loads is reported with its error, and nothing changes.

use std::sync::Arc;

pub use signet_runtime::reload::KeyDigests;
pub use signet_runtime::reload::Outcome;
use signet_runtime::reload::log;
use signet_runtime::shutdown::Hangups;
use signet_runtime::telemetry::{LogChange, LogControl};

use crate::ca::manager::CaManager;
use crate::clock::Clock;
use crate::config::{Config, ConfigError};
use crate::issuer::Issuer;

/// What the binary gives the server to reload on SIGHUP.
pub struct Reload {
    /// Watched since the process started, so that no SIGHUP terminates it.
    pub hangups: Hangups,
    /// Loads the configuration again, exactly as at start-up (file, environment, flags).
    pub load: Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>,
    /// The log filter, when logs are on.
    pub logs: Option<LogControl>,
}

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reload").finish_non_exhaustive()
    }
}

/// The running parts a reload reaches.
pub(crate) struct Reloadable {
    pub(crate) issuer: Arc<Issuer>,
    pub(crate) manager: Arc<CaManager>,
    pub(crate) clock: Arc<dyn Clock>,
}

/// Reloads at every SIGHUP, until the server stops (the caller drops it).
pub(crate) async fn run(mut reload: Reload, running: KeyDigests, parts: Reloadable) {
    loop {
        reload.hangups.recv().await;
        tracing::info!("SIGHUP: reloading");
        let report = reload_once(&reload, &running, &parts).await;
        for (what, outcome) in &report {
            log(what, outcome);
        }
    }
}

/// One reload, each thing with its outcome, in a fixed order.
async fn reload_once(
    reload: &Reload,
    running: &KeyDigests,
    parts: &Reloadable,
) -> Vec<(&'static str, Outcome)> {
    let mut report = Vec::new();
    let loaded = (reload.load)();
    match &loaded {
        Ok(new) => report.push(("configuration", compare(running, new))),
        Err(e) => report.push((
            "configuration",
            Outcome::Failed(format!("{e}; the running configuration is kept")),
        )),
    }
    if let Some(logs) = &reload.logs {
        let outcome = match &loaded {
            Ok(new) => match logs.set(new.log_level.as_ref()) {
                Ok(LogChange::Changed { from, to }) => {
                    Outcome::Reloaded(format!("{to}, was {from}"))
                }
                Ok(LogChange::Unchanged(now)) => Outcome::Unchanged(now),
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Err(_) => Outcome::Unchanged(format!(
                "{} (the configuration did not load)",
                logs.current()
            )),
        };
        report.push(("log level", outcome));
    }
    if let Some(jwt) = parts.issuer.jwt() {
        report.push(("auth.kubernetes.jwks_file", jwt.reload_now()));
    }
    if let Some(outcome) = parts.manager.reload_plugged_now(parts.clock.now()).await {
        report.push(("plugged-in CA files", outcome));
    }
    report
}

/// The top-level keys that differ between `running` and `new`, other than the ones a reload
/// applies.
fn compare(running: &KeyDigests, new: &Config) -> Outcome {
    signet_runtime::reload::changed_keys(running, new, &["log_level"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_keys_are_named_and_the_log_level_is_applied_not_named() {
        let running = KeyDigests::of(&Config::default());
        assert_eq!(
            compare(&running, &Config::default()),
            Outcome::Unchanged("no other key changed".into())
        );
        let mut new = Config {
            database_url: "postgres://user:s3cret@db/signet".into(),
            log_level: Some("debug".parse().expect("level")),
            ..Config::default()
        };
        new.ca.max_ttl = std::time::Duration::from_secs(7200);
        match compare(&running, &new) {
            Outcome::NeedsRestart(m) => {
                assert!(m.starts_with("ca, database_url changed;"), "{m}");
                assert!(!m.contains("s3cret"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }
}
