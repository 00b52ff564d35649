//! What the rotator holds: per registration entry, its certificate and key and when it is due
//! ([`Held`]); and the views of them a pass publishes (the Workload API's identities, the
//! sinks' certificate per SPIFFE ID).
//!
//! Invariant: only certificates valid at `now` and not revoked by a CRL the agent holds
//! ([`Held::revoked`]) are ever in a view; an entry that went away or changed is dropped at
//! once ([`Holdings::keep_only`]). A revoked certificate stays held (its entry is due at once,
//! and backs off like any sign failure) but its entry goes without a certificate until it is
//! re-signed; a sink keeps what it has on disk meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use signet_pki::X509Svid;
use signet_types::SpiffeId;

use crate::ca::EntrySpec;
use crate::revocation::{CertRef, Compromise, Revocations};
use crate::rotation::renewal_due;
use crate::state::Identity;

pub(super) struct Held {
    pub(super) spec: EntrySpec,
    pub(super) svid: Arc<X509Svid>,
    /// The usual renewal time, drawn when the certificate was obtained.
    pub(super) renew_at: SystemTime,
    /// When the agent installed it.
    pub(super) obtained: SystemTime,
    /// Drawn once per certificate, for the compromised-replacement backoff.
    pub(super) jitter: f64,
    /// Replacements in a row that came back compromised (see [`renewal_due`]).
    pub(super) reissues: u32,
    /// The leaf's issuing key and serial (`None` if the leaf does not parse: then no taint or
    /// CRL can name it).
    pub(super) cert: Option<CertRef>,
    /// Its replacement as compromised was logged (once per certificate, not per attempt).
    pub(super) replacing: bool,
}

impl Held {
    fn serves(&self, now: SystemTime) -> bool {
        crate::rotation::serves(self.svid.certificate(), now)
    }

    pub(super) fn compromise(&self, rev: &Revocations) -> Option<Compromise> {
        self.cert.as_ref().and_then(|c| rev.check(c))
    }

    /// Whether a verified CRL the agent holds lists it, or a CA certificate of its chain: then
    /// it is never served nor delivered (a tainted issuing key alone still serves until the
    /// replacement arrives).
    pub(super) fn revoked(&self, rev: &Revocations) -> bool {
        matches!(
            self.compromise(rev),
            Some(Compromise::Revoked { .. } | Compromise::CaRevoked { .. })
        )
    }

    /// When this certificate is due, given the revocations in force.
    pub(super) fn due_at(&self, rev: &Revocations) -> SystemTime {
        renewal_due(
            self.renew_at,
            self.obtained,
            self.compromise(rev).is_some(),
            self.reissues,
            self.jitter,
        )
    }
}

/// The held certificates, by entry ID. Boxed: a map sized for 1,000 entries has room for up to
/// twice as many, and an empty place costs a pointer, not a whole `Held`.
#[derive(Default)]
pub struct Holdings(HashMap<String, Box<Held>>);

impl Holdings {
    pub(super) fn get(&self, entry_id: &str) -> Option<&Held> {
        self.0.get(entry_id).map(Box::as_ref)
    }

    pub(super) fn get_mut(&mut self, entry_id: &str) -> Option<&mut Held> {
        self.0.get_mut(entry_id).map(Box::as_mut)
    }

    pub(super) fn insert(&mut self, entry_id: String, held: Held) {
        self.0.insert(entry_id, Box::new(held));
    }

    /// Drops what is held for an entry not in `entries`, or held under another spec
    /// (selectors, SPIFFE ID…): it stops being served at once, even if its replacement cannot
    /// be signed yet.
    pub(super) fn keep_only(&mut self, entries: &[EntrySpec]) {
        self.0
            .retain(|id, h| entries.iter().any(|e| &e.id == id && *e == h.spec));
    }

    /// Entries needing a certificate at `now`: none held, or held and due for renewal (at its
    /// usual time, or at once when it is compromised).
    pub(super) fn due<'a>(
        &self,
        entries: &'a [EntrySpec],
        rev: &Revocations,
        now: SystemTime,
    ) -> Vec<&'a EntrySpec> {
        entries
            .iter()
            .filter(|e| match self.0.get(&e.id) {
                None => true,
                Some(h) => now >= h.due_at(rev),
            })
            .collect()
    }

    /// The earliest renewal after `now`, if any.
    pub(super) fn next_due_after(&self, rev: &Revocations, now: SystemTime) -> Option<SystemTime> {
        self.0
            .values()
            .map(|h| h.due_at(rev))
            .filter(|t| *t > now)
            .min()
    }

    /// The earliest expiry after `now` of what is held: a pass then withdraws it, so an
    /// expired certificate stops being served at its expiry even while the server is down.
    pub(super) fn next_expiry_after(&self, now: SystemTime) -> Option<SystemTime> {
        self.0
            .values()
            .map(|h| h.svid.certificate().not_after())
            .filter(|t| *t > now)
            .min()
    }

    /// Whether a renewal is overdue at `now` (its signing failed).
    pub(super) fn any_overdue(&self, rev: &Revocations, now: SystemTime) -> bool {
        self.0.values().any(|h| h.due_at(rev) <= now)
    }

    /// The identities served at `now`, by entry ID (none revoked per `rev`).
    pub fn identities(&self, rev: &Revocations, now: SystemTime) -> Vec<Identity> {
        let mut identities: Vec<Identity> = self
            .0
            .iter()
            .filter(|(_, h)| h.serves(now) && !h.revoked(rev))
            .map(|(id, h)| Identity {
                entry_id: id.clone(),
                selectors: h.spec.selectors.clone(),
                svid: h.svid.clone(),
                federates_with: h.spec.federates_with.clone(),
            })
            .collect();
        identities.sort_by(|a, b| a.entry_id.cmp(&b.entry_id));
        identities
    }

    /// Per SPIFFE ID, the certificate served at `now` that lasts longest (what a sink holds;
    /// none revoked per `rev`).
    pub fn current(
        &self,
        rev: &Revocations,
        now: SystemTime,
    ) -> HashMap<&SpiffeId, &Arc<X509Svid>> {
        let mut current: HashMap<&SpiffeId, &Arc<X509Svid>> = HashMap::new();
        for h in self.0.values().filter(|h| h.serves(now) && !h.revoked(rev)) {
            let id = h.svid.spiffe_id();
            if current
                .get(id)
                .is_none_or(|c| h.svid.certificate().not_after() > c.certificate().not_after())
            {
                current.insert(id, &h.svid);
            }
        }
        current
    }
}
