//! The loop's use of the cache ([`crate::cache`]): restored once, at the start of the first
//! node identity's loop, before the server is asked anything; saved after what is served
//! changes (the published state, or the entries' revision), at most every
//! [`CACHE_MIN_INTERVAL`] (a burst of renewals is one write), at once when the bundle, the
//! node key (the cache is sealed under the key) or the ban state changes, and at stop. A ban
//! restored from the cache is reported (`/readyz`, `signet_agent_node_banned`) until the
//! server answers otherwise.
//!
//! Invariant: a cache that cannot be read is logged (why, and that nothing in it is served) and
//! ignored; one that cannot be written is logged once per distinct error; neither stops the
//! loop.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Driver, Serving};
use crate::cache::{self, Loaded, Snapshot};
use crate::state::SharedState;

/// The shortest time between two writes of the cache (a change meanwhile is written then).
pub const CACHE_MIN_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct CacheState {
    /// Restoring was tried (once per process).
    tried: bool,
    /// What the last write (or the restore) held: the state and the revision.
    saved: Option<(SharedState, u64)>,
    /// When it was last written.
    saved_at: Option<SystemTime>,
    /// A change not written yet, waiting for the interval.
    pending: bool,
    /// The last write error logged.
    last_error: Option<String>,
    /// Since when the server refuses the node as banned (with the driver's `banned`).
    pub(super) banned_since: Option<SystemTime>,
    /// The ban state the last write (or the restore) held.
    saved_ban: Option<String>,
}

impl CacheState {
    /// When a pending write is due, if one is.
    pub(super) fn save_pending_at(&self) -> Option<SystemTime> {
        self.pending
            .then(|| self.saved_at.map(|t| t + CACHE_MIN_INTERVAL))
            .flatten()
    }
}

impl Driver {
    /// Restores the cache for `s`'s node (once per process): its entries, bundles, CRLs and
    /// JWT keys, and its SVIDs, served at once.
    pub(super) fn restore_cache(&mut self, s: &mut Serving) {
        if std::mem::replace(&mut self.cache.tried, true) {
            // A new node identity (re-attested): the cache is sealed under the old key, so
            // it is written again under the new one at the first chance.
            self.cache.saved = None;
            self.cache.saved_at = None;
            return;
        }
        let dir = self.settings.data_dir.clone();
        let now = self.clock.now();
        let r = match cache::load(&dir, &s.node, now) {
            Loaded::Absent => {
                tracing::debug!(dir = %dir.display(), "no cache to restore");
                return;
            }
            Loaded::Refused(e) => {
                tracing::error!(error = %e, "not using the agent's cache; serving nothing until the server answers");
                return;
            }
            Loaded::Found(r) => *r,
        };
        for (entry, why) in &r.dropped {
            tracing::warn!(entry = %entry, reason = %why, "not serving a cached certificate");
        }
        if r.expired > 0 {
            tracing::info!(
                expired = r.expired,
                "cached certificates that expired meanwhile are not served"
            );
        }
        self.entries = r.entries;
        self.revision = r.revision;
        if !r.bundle.is_empty() && r.bundle != s.bundle {
            s.bundle = r.bundle.clone();
            self.trust.set_bundle(s.td.clone(), r.bundle);
        }
        self.trust.restore_crls(&r.crls);
        if let Some((id, since)) = r.banned {
            tracing::error!(node_id = %id, "{} (as when the cache was written; until the server answers)", crate::readiness::ban_message(&id));
            if let Some(ready) = &self.ready {
                ready.banned(&id, since);
            }
            if let Some(m) = &self.metrics {
                m.node_banned.set(1);
            }
            self.cache.banned_since = Some(since);
            self.cache.saved_ban = Some(id.clone());
            self.banned = Some(id);
        }
        self.trust.set_jwt_keys(&r.jwt_keys, &r.jwt_tainted);
        self.trust.set_federated(&s.trust_domain, r.federated);
        let served =
            self.rotator
                .restore(&self.entries, r.svids, &mut self.trust, &mut self.outlets);
        tracing::info!(
            certificates = served,
            entries = self.entries.len(),
            revision = self.revision,
            written_at = %crate::readiness::rfc3339(r.written_at),
            "serving the cached certificates until the server answers"
        );
        if let Some(ready) = &self.ready {
            ready.restored(r.written_at);
            ready.entries(self.entries.len());
        }
        self.cache.saved = Some((self.outlets.current(), self.revision));
    }

    /// Saves the cache if what is served changed since the last write and the interval has
    /// passed (else marks the write pending).
    pub(super) fn save_cache_if_due(&mut self, s: &Serving) {
        let now = self.clock.now();
        let state = self.outlets.current();
        if self.unchanged(&state) {
            self.cache.pending = false;
            return;
        }
        // A new bundle is written at once (rare, and what the cached SVIDs are checked
        // against), as is a ban starting or ending; certificate churn waits for the interval.
        let bundle_changed = self
            .cache
            .saved
            .as_ref()
            .is_some_and(|(st, _)| !Arc::ptr_eq(&st.bundle_der, &state.bundle_der))
            || self.cache.saved_ban != self.banned;
        if !bundle_changed
            && self
                .cache
                .saved_at
                .is_some_and(|t| now < t + CACHE_MIN_INTERVAL)
        {
            self.cache.pending = true;
            return;
        }
        self.write_cache(s, state, now);
    }

    /// At stop: writes what changed since the last write, interval or not.
    pub(super) fn save_cache_at_stop(&mut self, s: &Serving) {
        let state = self.outlets.current();
        if !self.unchanged(&state) {
            let now = self.clock.now();
            self.write_cache(s, state, now);
        }
    }

    /// Saves the cache now (the node key changed), unless nothing was synced or restored yet.
    pub(super) fn save_cache_now(&mut self, s: &Serving) {
        let now = self.clock.now();
        let state = self.outlets.current();
        self.write_cache(s, state, now);
    }

    fn unchanged(&self, state: &SharedState) -> bool {
        self.cache
            .saved
            .as_ref()
            .is_some_and(|(st, rev)| Arc::ptr_eq(st, state) && *rev == self.revision)
            && self.cache.saved_ban == self.banned
    }

    fn write_cache(&mut self, s: &Serving, state: SharedState, now: SystemTime) {
        // Nothing synced or restored yet: nothing worth keeping (and a cache that failed to
        // load is left for the operator to look at until there is).
        if self.cache.saved.is_none()
            && self.revision == 0
            && state.identities.is_empty()
            && self.banned.is_none()
        {
            return;
        }
        let snapshot = Snapshot {
            revision: self.revision,
            entries: &self.entries,
            trust_domain: &s.trust_domain,
            state: &state,
            banned: self
                .banned
                .as_deref()
                .map(|id| (id, self.cache.banned_since.unwrap_or(now))),
        };
        self.cache.pending = false;
        self.cache.saved_at = Some(now);
        match cache::save(&self.settings.data_dir, &s.node, &snapshot, now) {
            Ok(()) => {
                if self.cache.last_error.take().is_some() {
                    tracing::info!("the agent's cache is written again");
                }
                tracing::debug!(
                    certificates = state.identities.len(),
                    revision = self.revision,
                    "cache written"
                );
                self.cache.saved = Some((state, self.revision));
                self.cache.saved_ban = self.banned.clone();
            }
            Err(e) => {
                let shown = e.to_string();
                if self.cache.last_error.as_deref() != Some(shown.as_str()) {
                    tracing::error!(error = %shown, "cannot write the agent's cache; a restart while the server is down would serve nothing");
                    self.cache.last_error = Some(shown);
                }
            }
        }
    }
}
