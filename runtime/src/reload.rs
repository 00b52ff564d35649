//! What a reload (SIGHUP) reports: one log line per thing, reloaded, unchanged, failed, or
//! waiting for a restart; and which configuration keys changed (by name, never by value).
//! Each binary decides what it reloads (`signet_server::reload`, the agent's `main.rs`).

use serde::Serialize;

/// What one reload of one thing did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Now in force: what changed.
    Reloaded(String),
    /// Nothing changed: what is in force (may be empty).
    Unchanged(String),
    /// Refused or unreadable: why; the old value is kept.
    Failed(String),
    /// Changed, but read only at start: takes effect at the next restart.
    NeedsRestart(String),
}

/// The log line of `what`'s outcome: `SIGHUP: <what> reloaded: …` (info), `… unchanged: …`
/// (info), `… not reloaded: …` (error), `SIGHUP: <what>: … next restart` (warn).
pub fn log(what: &str, outcome: &Outcome) {
    match outcome {
        Outcome::Reloaded(d) => tracing::info!(reload = what, "SIGHUP: {what} reloaded: {d}"),
        Outcome::Unchanged(d) if d.is_empty() => {
            tracing::info!(reload = what, "SIGHUP: {what} unchanged")
        }
        Outcome::Unchanged(d) => tracing::info!(reload = what, "SIGHUP: {what} unchanged: {d}"),
        Outcome::Failed(d) => tracing::error!(reload = what, "SIGHUP: {what} not reloaded: {d}"),
        Outcome::NeedsRestart(d) => tracing::warn!(reload = what, "SIGHUP: {what}: {d}"),
    }
}

/// A configuration as [`changed_keys`] compares it: each top-level key's serialized value,
/// kept as a SHA-256 digest (small whatever the configuration holds, and no secret kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDigests(std::collections::BTreeMap<String, [u8; 32]>);

impl KeyDigests {
    /// The digests of `config`'s top-level keys (none when it does not serialize as a map).
    pub fn of<C: Serialize>(config: &C) -> Self {
        let mut out = std::collections::BTreeMap::new();
        if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(config) {
            for (k, v) in map {
                let d = ring::digest::digest(&ring::digest::SHA256, v.to_string().as_bytes());
                let mut bytes = [0u8; 32];
                bytes.copy_from_slice(d.as_ref());
                out.insert(k, bytes);
            }
        }
        Self(out)
    }
}

/// The top-level keys whose values differ between the running configuration and `new`
/// (only their names are shown, so secrets stay out of the logs), `applied` aside.
pub fn changed_keys<C: Serialize>(running: &KeyDigests, new: &C, applied: &[&str]) -> Outcome {
    let new = KeyDigests::of(new);
    let mut keys: Vec<&str> = running
        .0
        .keys()
        .chain(new.0.keys())
        .map(String::as_str)
        .filter(|k| !applied.contains(k) && running.0.get(*k) != new.0.get(*k))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() {
        Outcome::Unchanged("no other key changed".into())
    } else {
        Outcome::NeedsRestart(format!(
            "{} changed; read only at start, they take effect at the next restart",
            keys.join(", ")
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Cfg {
        url: String,
        ttl: u32,
        level: Option<String>,
    }

    #[test]
    fn changed_keys_are_named_without_their_values() {
        let running = Cfg {
            url: "postgres://u:s3cret@db/x".into(),
            ttl: 1,
            level: None,
        };
        let digests = KeyDigests::of(&running);
        assert_eq!(
            changed_keys(&digests, &running, &[]),
            Outcome::Unchanged("no other key changed".into())
        );
        let new = Cfg {
            url: "postgres://u:0ther@db/x".into(),
            ttl: 2,
            level: Some("debug".into()),
        };
        match changed_keys(&digests, &new, &["level"]) {
            Outcome::NeedsRestart(m) => {
                assert!(m.starts_with("ttl, url changed;"), "{m}");
                assert!(!m.contains("s3cret") && !m.contains("0ther"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }
}
