//! The agent's state as the Workload API and the sinks see it: the identities it holds (entry,
//! selectors, current SVID: a [`signet_pki::X509Svid`], checked when it was made) and the
//! trust bundle, and the federated bundles (foreign trust domains' roots and JWT keys) that
//! the identities whose entries federate with them receive. Published through a
//! `tokio::sync::watch`. This module does no I/O: the node identity's files are
//! [`crate::node`]'s, and what this state holds (identities with their keys, bundle, CRLs, JWT
//! keys, federated bundles) is saved with the entries of the last `SyncEntries` answer by the
//! driver in the sealed cache ([`crate::cache`]), and restored from it at the start, so a
//! restarted agent serves its unexpired identities (and their federated bundles) before the
//! server answers.
//!
//! Invariant: [`AgentState::federated`] never holds the agent's own trust domain
//! ([`crate::trust::Trust::set_federated`] drops one), and holds at most one bundle per trust
//! domain, sorted by name.
//!
//! Memory: each SVID, the bundle and the CRLs are held once, behind an `Arc`, and shared by
//! the rotator, this state and the sinks ([`crate::sinks::Delivered`]); a new state clones
//! pointers, never certificates.

use std::sync::Arc;

use signet_pki::X509Svid;
use signet_types::TrustDomain;

/// A workload selector: the one grammar of `signet_types::selector`, which the server also
/// validates entries with (so every selector the server accepts is one the agent can match).
pub use signet_types::selector::{Selector, SelectorError};

/// One registration entry the agent serves, with its current SVID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub entry_id: String,
    pub selectors: Vec<Selector>,
    /// The chain (leaf first, the roots left out: they are the bundle) and its key; shared with
    /// the rotator and the sinks.
    pub svid: Arc<X509Svid>,
    /// The foreign trust domains whose bundles this identity's workloads receive (its entry's
    /// `federates_with`).
    pub federates_with: Vec<TrustDomain>,
}

/// Everything the Workload API serves. Cheap to clone (shared behind `Arc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentState {
    pub identities: Vec<Identity>,
    /// The trust domain's roots, DER.
    pub bundle_der: Ders,
    /// The trust domain, `spiffe://example.org`, for `X509BundlesResponse` keys. Empty when
    /// no bundle is known yet.
    pub trust_domain_id: String,
    /// The issuing CAs' verified CRLs (DER, one per CA key; see [`crate::revocation`]),
    /// served in the Workload API's `crl` fields and written as `crl.pem` by the files sink.
    pub crls_der: Ders,
    /// The trust domain's JWT-SVID keys (from the server's bundle): served as the JWKS of
    /// `FetchJWTBundles` and validated with by `ValidateJWTSVID`.
    pub jwt_keys: JwtKeys,
    /// IDs of JWT keys the operator tainted: a cached token one of them signed is dropped.
    pub jwt_tainted: Arc<[String]>,
    /// The foreign trust domains' bundles the server sent for this node's entries (sorted by
    /// trust domain, never the own one): each served only to the callers whose identities
    /// federate with it ([`AgentState::federated_for`]).
    pub federated: Federated,
}

/// A foreign trust domain's bundle, as the Workload API, SDS and the sinks serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FederatedBundle {
    pub trust_domain: TrustDomain,
    /// Its roots, DER.
    pub roots_der: Ders,
    /// Its JWT-SVID keys.
    pub jwt_keys: JwtKeys,
}

/// The federated bundles, held once and shared; sorted by trust domain, one per trust domain.
pub type Federated = Arc<[FederatedBundle]>;

impl AgentState {
    /// The federated bundles a caller entitled to `mine` receives: those of the union of its
    /// identities' `federates_with` (SPIRE's rule), sorted by trust domain; none for a caller
    /// whose identities do not federate. The own trust domain is never among them.
    pub fn federated_for(&self, mine: &[&Identity]) -> Vec<&FederatedBundle> {
        self.federated
            .iter()
            .filter(|b| b.trust_domain.id_string() != self.trust_domain_id)
            .filter(|b| {
                mine.iter()
                    .any(|id| id.federates_with.contains(&b.trust_domain))
            })
            .collect()
    }
}

/// The JWT-SVID public keys, held once and shared.
pub type JwtKeys = Arc<[signet_pki::jwt::JwtPublicKey]>;

/// DER blobs held once and shared (the bundle's roots, the CRLs): cloning copies a pointer.
pub type Ders = Arc<[Vec<u8>]>;

pub type SharedState = Arc<AgentState>;
pub type StateSender = tokio::sync::watch::Sender<SharedState>;
pub type StateReceiver = tokio::sync::watch::Receiver<SharedState>;

/// A fresh, empty state channel.
pub fn channel() -> (StateSender, StateReceiver) {
    tokio::sync::watch::channel(Arc::new(AgentState::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grammar's tests (round trip, refusals, Kubernetes kinds) live with it in
    /// `signet_types::selector`; this is the agent's use of it.
    #[test]
    fn the_agent_parses_with_the_shared_grammar() {
        let sel: Selector = "unix:uid:1000".parse().expect("selector");
        assert_eq!(sel, Selector::Uid(1000));
        assert!("k8s:ns:Default".parse::<Selector>().is_err());
    }

    #[test]
    fn svid_debug_hides_key() {
        let svid = crate::testing::self_signed_svid(
            "spiffe://example.org/a",
            signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock),
            std::time::Duration::from_secs(60),
        );
        let key = svid.key().pkcs8_der();
        let shown = format!("{svid:?}");
        assert!(!shown.contains(&format!("{key:?}")), "{shown}");
        assert!(!shown.contains(&format!("{:?}", &key[..8])), "{shown}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
    }
}
