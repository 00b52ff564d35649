//! What `/readyz` reports: the agent's own account of whether its Workload API serves what it
//! should, and why not. The main loop ([`crate::driver`]) records what happens ([`Readiness`]'s
//! setters: node identity obtained, refused as banned, server reached or not, entries synced,
//! a cache restored); [`verdict`] decides, at the request's `now`, from that record and the
//! certificates the Workload API serves; [`Report::body`] words it.
//!
//! The rule, in one place ([`verdict`]), first match wins:
//! 1. the server refuses the node as banned: not ready;
//! 2. no node identity: not ready;
//! 3. entries neither synced since the start nor restored from the cache: not ready;
//! 4. the server unreachable (since the start, or since it last answered), the node has
//!    entries and no certificate left that is valid now: not ready;
//! 5. otherwise ready (the server may be unreachable: the cached or last certificates are
//!    served until they expire, and the body says since when).
//!
//! Sinks never make the agent unready (the Workload API does not depend on them); each one in
//! trouble is one line of the body.
//!
//! The body (stable; one `key: value` line each after the first, times RFC 3339 UTC):
//! ```text
//! ready                                     | not ready: <reason>
//! node: <SPIFFE ID> | none yet (<why>) | <SPIFFE ID or ID>, banned by the server since <time>
//! server: connected | not reached yet | unreachable since <time>: <error>
//! entries: <n>, synced | <n>, restored from the cache written at <time>, not synced since the start | not synced yet
//! certificates: <n> served[, the earliest expires at <time>]
//! sink "<name>": <problem>                  (one line per problem, none when all is well)
//! ```

use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use signet_runtime::clock::Clock;

use crate::state::StateReceiver;

/// The loop's record of what it knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// The node's SPIFFE ID once it has an identity.
    pub node: Option<String>,
    /// Why there is none yet (the last failure).
    pub node_missing: Option<String>,
    pub banned: Option<Banned>,
    pub server: Server,
    /// Entries synced (and a rotation pass run) since the start.
    pub synced: bool,
    /// Entries restored from the cache at the start.
    pub restored: Option<Restored>,
    /// How many entries the agent holds.
    pub entries: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banned {
    pub node_id: String,
    pub since: SystemTime,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Server {
    #[default]
    NotReached,
    Connected,
    Unreachable {
        since: SystemTime,
        error: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub written_at: SystemTime,
}

/// The certificates the Workload API serves at the request's `now`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Serving {
    /// Valid now.
    pub valid: usize,
    pub earliest_expiry: Option<SystemTime>,
}

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub ready: bool,
    /// The first line after "not ready: ", when not ready.
    pub reason: Option<String>,
    /// The `key: value` lines.
    pub lines: Vec<String>,
}

/// The operator's fix for a ban, in one place (the log and `/readyz` say the same).
pub fn ban_message(node_id: &str) -> String {
    format!(
        "node {node_id} is banned by the server; ask an operator to run `signetctl node unban {node_id}`"
    )
}

/// RFC 3339, UTC, seconds.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The rule of the module docs.
pub fn verdict(s: &Status, serving: Serving) -> Report {
    let reason = if let Some(b) = &s.banned {
        Some(ban_message(&b.node_id))
    } else if s.node.is_none() {
        Some(match &s.node_missing {
            Some(why) => format!("no node identity yet: {why}"),
            None => "no node identity yet".to_owned(),
        })
    } else if !s.synced && s.restored.is_none() {
        Some(match &s.server {
            Server::Unreachable { since, .. } => format!(
                "entries not synced yet: the server is unreachable since {} and no cache was restored",
                rfc3339(*since)
            ),
            _ => "entries not synced yet".to_owned(),
        })
    } else if let Server::Unreachable { since, .. } = &s.server
        && s.entries > 0
        && serving.valid == 0
    {
        Some(format!(
            "the server is unreachable since {} and no valid certificate is left to serve",
            rfc3339(*since)
        ))
    } else {
        None
    };
    let mut lines = Vec::with_capacity(4);
    lines.push(match (&s.node, &s.banned) {
        (_, Some(b)) => format!(
            "node: {}, banned by the server since {}",
            s.node.as_deref().unwrap_or(&b.node_id),
            rfc3339(b.since)
        ),
        (Some(n), None) => format!("node: {n}"),
        (None, None) => match &s.node_missing {
            Some(why) => format!("node: none yet ({why})"),
            None => "node: none yet".to_owned(),
        },
    });
    lines.push(match &s.server {
        Server::NotReached => "server: not reached yet".to_owned(),
        Server::Connected => "server: connected".to_owned(),
        Server::Unreachable { since, error } => {
            format!("server: unreachable since {}: {error}", rfc3339(*since))
        }
    });
    lines.push(match (&s.restored, s.synced) {
        (_, true) => format!("entries: {}, synced", s.entries),
        (Some(r), false) => format!(
            "entries: {}, restored from the cache written at {}, not synced since the start",
            s.entries,
            rfc3339(r.written_at)
        ),
        (None, false) => "entries: not synced yet".to_owned(),
    });
    lines.push(match serving.earliest_expiry {
        Some(t) => format!(
            "certificates: {} served, the earliest expires at {}",
            serving.valid,
            rfc3339(t)
        ),
        None => format!("certificates: {} served", serving.valid),
    });
    Report {
        ready: reason.is_none(),
        reason,
        lines,
    }
}

impl Report {
    /// The `/readyz` body, with one line per sink problem.
    pub fn body(&self, sink_problems: &[String]) -> String {
        let mut out = match &self.reason {
            None => "ready\n".to_owned(),
            Some(r) => format!("not ready: {r}\n"),
        };
        for l in self.lines.iter().chain(sink_problems) {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}

/// The shared record (cheap to clone): written by the loop, read by `/readyz`.
#[derive(Clone, Default)]
pub struct Readiness(Arc<Inner>);

#[derive(Default)]
struct Inner {
    status: Mutex<Status>,
    /// What the Workload API serves and the clock, attached by the loop.
    view: OnceLock<(StateReceiver, Arc<dyn Clock>)>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Readiness").field(&self.status()).finish()
    }
}

impl Readiness {
    fn with<T>(&self, f: impl FnOnce(&mut Status) -> T) -> T {
        match self.0.status.lock() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// A copy of the record.
    pub fn status(&self) -> Status {
        self.with(|s| s.clone())
    }

    /// Judges with the served certificates of `state` at `clock`'s now (the loop attaches
    /// them; once).
    pub fn attach(&self, state: StateReceiver, clock: Arc<dyn Clock>) {
        let _ = self.0.view.set((state, clock));
    }

    /// The report at the clock's now (without an attached state: none served).
    pub fn report(&self) -> Report {
        let serving = match self.0.view.get() {
            Some((state, clock)) => {
                let now = clock.now();
                let st = state.borrow().clone();
                let valid: Vec<SystemTime> = st
                    .identities
                    .iter()
                    .filter(|i| crate::rotation::serves(i.svid.certificate(), now))
                    .map(|i| i.svid.certificate().not_after())
                    .collect();
                Serving {
                    valid: valid.len(),
                    earliest_expiry: valid.into_iter().min(),
                }
            }
            None => Serving::default(),
        };
        verdict(&self.status(), serving)
    }

    /// Entries synced and signed since the start (the first pass after a sync).
    pub fn set_ready(&self) {
        self.with(|s| s.synced = true);
    }

    pub fn is_ready(&self) -> bool {
        self.report().ready
    }

    pub fn node_obtained(&self, spiffe_id: &str) {
        self.with(|s| {
            s.node = Some(spiffe_id.to_owned());
            s.node_missing = None;
        });
    }

    /// No node identity yet, and why (the last failure).
    pub fn node_missing(&self, why: &str) {
        self.with(|s| s.node_missing = Some(why.to_owned()));
    }

    /// The server refused `node_id` as banned at `now`. Returns true when this is news (the
    /// caller logs it then, once).
    pub fn banned(&self, node_id: &str, now: SystemTime) -> bool {
        self.with(|s| match &s.banned {
            Some(b) if b.node_id == node_id => false,
            _ => {
                s.banned = Some(Banned {
                    node_id: node_id.to_owned(),
                    since: now,
                });
                true
            }
        })
    }

    /// The server answered the node (not as banned). Returns the ban it lifts, if any.
    pub fn not_banned(&self) -> Option<Banned> {
        self.with(|s| s.banned.take())
    }

    pub fn server_reached(&self) {
        self.with(|s| s.server = Server::Connected);
    }

    /// The server could not be reached at `now` (keeps the first time of an outage).
    pub fn server_unreachable(&self, now: SystemTime, error: &str) {
        self.with(|s| match &mut s.server {
            Server::Unreachable { error: e, .. } => *e = error.to_owned(),
            other => {
                *other = Server::Unreachable {
                    since: now,
                    error: error.to_owned(),
                }
            }
        });
    }

    pub fn restored(&self, written_at: SystemTime) {
        self.with(|s| s.restored = Some(Restored { written_at }));
    }

    pub fn entries(&self, n: usize) {
        self.with(|s| s.entries = n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    fn t(secs: u64) -> SystemTime {
        T0 + Duration::from_secs(1_800_000_000 + secs)
    }

    fn serving(n: usize) -> Serving {
        Serving {
            valid: n,
            earliest_expiry: (n > 0).then(|| t(3600)),
        }
    }

    fn node() -> Status {
        Status {
            node: Some("spiffe://example.org/signet/node/n1".into()),
            entries: 2,
            ..Status::default()
        }
    }

    /// The rule as a whole: each case and its verdict, first line and key lines.
    #[test]
    fn the_rule_in_order() {
        let unreachable = Server::Unreachable {
            since: t(0),
            error: "CA unavailable: connection refused".into(),
        };
        let cases: Vec<(&str, Status, Serving, Option<&str>)> = vec![
            (
                "fresh start",
                Status::default(),
                serving(0),
                Some("no node identity yet"),
            ),
            (
                "no credential",
                Status {
                    node_missing: Some("no join token configured".into()),
                    ..Status::default()
                },
                serving(0),
                Some("no node identity yet: no join token configured"),
            ),
            (
                "connecting",
                node(),
                serving(0),
                Some("entries not synced yet"),
            ),
            (
                "synced",
                Status {
                    synced: true,
                    server: Server::Connected,
                    ..node()
                },
                serving(2),
                None,
            ),
            (
                "synced, server gone, certificates left",
                Status {
                    synced: true,
                    server: unreachable.clone(),
                    ..node()
                },
                serving(2),
                None,
            ),
            (
                "synced, server gone, nothing left",
                Status {
                    synced: true,
                    server: unreachable.clone(),
                    ..node()
                },
                serving(0),
                Some(
                    "the server is unreachable since 2027-01-15T08:00:00Z and no valid certificate is left to serve",
                ),
            ),
            (
                "synced, no entries at all",
                Status {
                    synced: true,
                    entries: 0,
                    server: unreachable.clone(),
                    ..node()
                },
                serving(0),
                None,
            ),
            (
                "restarted during an outage, cache restored",
                Status {
                    restored: Some(Restored { written_at: t(5) }),
                    server: unreachable.clone(),
                    ..node()
                },
                serving(2),
                None,
            ),
            (
                "restarted during an outage, no cache",
                Status {
                    server: unreachable.clone(),
                    ..node()
                },
                serving(0),
                Some(
                    "entries not synced yet: the server is unreachable since 2027-01-15T08:00:00Z and no cache was restored",
                ),
            ),
            (
                "banned",
                Status {
                    synced: true,
                    banned: Some(Banned {
                        node_id: "n1".into(),
                        since: t(9),
                    }),
                    ..node()
                },
                serving(2),
                Some(
                    "node n1 is banned by the server; ask an operator to run `signetctl node unban n1`",
                ),
            ),
            (
                "banned before any identity",
                Status {
                    banned: Some(Banned {
                        node_id: "web-1".into(),
                        since: t(9),
                    }),
                    ..Status::default()
                },
                serving(0),
                Some(
                    "node web-1 is banned by the server; ask an operator to run `signetctl node unban web-1`",
                ),
            ),
        ];
        for (name, status, serving, want) in cases {
            let r = verdict(&status, serving);
            assert_eq!(r.reason.as_deref(), want, "{name}");
            assert_eq!(r.ready, want.is_none(), "{name}");
            assert_eq!(r.lines.len(), 4, "{name}");
        }
    }

    #[test]
    fn the_body_has_a_stable_shape() {
        let s = Status {
            restored: Some(Restored { written_at: t(5) }),
            server: Server::Unreachable {
                since: t(0),
                error: "CA unavailable: connection refused".into(),
            },
            ..node()
        };
        let body = verdict(&s, serving(2)).body(&["sink \"web\": failing".into()]);
        assert_eq!(
            body,
            "ready\n\
             node: spiffe://example.org/signet/node/n1\n\
             server: unreachable since 2027-01-15T08:00:00Z: CA unavailable: connection refused\n\
             entries: 2, restored from the cache written at 2027-01-15T08:00:05Z, not synced since the start\n\
             certificates: 2 served, the earliest expires at 2027-01-15T09:00:00Z\n\
             sink \"web\": failing\n"
        );
        let banned = Status {
            banned: Some(Banned {
                node_id: "n1".into(),
                since: t(9),
            }),
            synced: true,
            server: Server::Connected,
            ..node()
        };
        let body = verdict(&banned, serving(0)).body(&[]);
        assert_eq!(
            body,
            "not ready: node n1 is banned by the server; ask an operator to run `signetctl node unban n1`\n\
             node: spiffe://example.org/signet/node/n1, banned by the server since 2027-01-15T08:00:09Z\n\
             server: connected\n\
             entries: 2, synced\n\
             certificates: 0 served\n"
        );
    }

    #[test]
    fn a_ban_is_news_once_and_an_outage_keeps_its_start() {
        let r = Readiness::default();
        assert!(r.banned("n1", t(1)));
        assert!(!r.banned("n1", t(2)), "the same ban again is not news");
        assert_eq!(r.status().banned.map(|b| b.since), Some(t(1)));
        assert!(r.banned("n2", t(3)), "another node ID is");
        assert_eq!(r.not_banned().map(|b| b.node_id), Some("n2".into()));
        assert_eq!(r.not_banned(), None);
        r.server_unreachable(t(10), "a");
        r.server_unreachable(t(20), "b");
        assert_eq!(
            r.status().server,
            Server::Unreachable {
                since: t(10),
                error: "b".into()
            }
        );
        r.server_reached();
        r.server_unreachable(t(30), "c");
        assert!(matches!(r.status().server, Server::Unreachable { since, .. } if since == t(30)));
    }
}
