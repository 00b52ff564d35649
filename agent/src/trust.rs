//! The agent's trust state: the roots it serves (with their trust domain), the tainted CA
//! keys and the verified CRLs in force, and the CA certificates CRLs are verified with.
//!
//! One [`Trust`] is owned by the main loop ([`crate::driver`]), which feeds it what the server
//! sends (bundles, taints, CRLs) and what it persisted, and lends it to each pass of the
//! [`crate::rotator::Rotator`]: the rotator reads the roots and the revocations, and teaches it
//! the CA certificates of the chains it is given (a CRL whose issuer was unknown is offered
//! again then). What a pass publishes shares its roots and CRLs ([`Ders`]), so the Workload API
//! state and every sink hold one copy.
//!
//! It holds the JWT-SVID keys of the own trust domain too ([`Trust::set_jwt_keys`], from each
//! bundle the server streams): the Workload API serves them (`FetchJWTBundles`), validates
//! tokens with them (`ValidateJWTSVID`), and drops every cached token a tainted one signed.
//!
//! And the federated bundles, foreign trust domains' roots and JWT keys
//! ([`Trust::set_federated`], from each changed `SyncEntries` answer): held here, published with
//! the rest, served only to the identities whose entries federate with them. They are never CRL
//! issuers (only the own trust domain's CAs sign the CRLs the agent enforces), and never the
//! own trust domain's (one for it is dropped and logged: the own roots come from the bundle
//! stream only).
//!
//! Invariant: a CRL is in force only once verified against the CA certificate it names (or
//! restored from the agent's own `data_dir`), and only if newer than the one kept
//! ([`crate::revocation`]); one that fails is logged, counted and ignored.

use std::sync::Arc;
use std::time::SystemTime;

use crate::ca::Crl;
use crate::metrics::Metrics;
use crate::revocation::{CrlRejected, Issuers, Revocations};
use crate::state::{Ders, Federated, FederatedBundle, JwtKeys};
use signet_types::TrustDomain;

#[derive(Default)]
pub struct Trust {
    /// The trust domain's SPIFFE ID string (`spiffe://example.org`), as the state publishes it.
    trust_domain_id: String,
    /// The roots served (DER).
    bundle_der: Ders,
    /// The CRLs in force as served (DER), kept in step with `revocations`.
    crls_der: Ders,
    /// Taints and verified CRLs in force.
    revocations: Revocations,
    /// CA certificates CRLs are verified with.
    issuers: Issuers,
    /// The CRLs of the last bundle that could not be verified yet for want of their issuer:
    /// offered again when a new chain teaches the agent more CA certificates.
    unverified: Vec<Crl>,
    /// The JWT-SVID keys of the trust domain, as the server's last bundle listed them.
    jwt_keys: JwtKeys,
    /// The IDs of those keys the operator tainted or revoked (sorted).
    jwt_tainted: Arc<[String]>,
    /// The foreign trust domains' bundles (sorted, never the own trust domain).
    federated: Federated,
    metrics: Option<Arc<Metrics>>,
}

impl Trust {
    /// Counts refused CRLs in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The trust bundle served alongside the SVIDs (its roots are CRL issuers too). A change
    /// reaches the Workload API and every sink on the rotator's next pass.
    pub fn set_bundle(&mut self, trust_domain_id: String, bundle_der: Vec<Vec<u8>>) {
        self.issuers.learn(&bundle_der);
        self.trust_domain_id = trust_domain_id;
        if *self.bundle_der != *bundle_der {
            self.bundle_der = bundle_der.into();
        }
    }

    pub fn trust_domain_id(&self) -> &str {
        &self.trust_domain_id
    }

    /// The roots served.
    pub fn bundle_der(&self) -> &Ders {
        &self.bundle_der
    }

    /// The CRLs in force, as served.
    pub fn crls_der(&self) -> &Ders {
        &self.crls_der
    }

    /// The JWT-SVID keys served and validated with.
    pub fn jwt_keys(&self) -> &JwtKeys {
        &self.jwt_keys
    }

    /// The IDs of tainted JWT keys: tokens they signed are not served.
    pub fn jwt_tainted(&self) -> &Arc<[String]> {
        &self.jwt_tainted
    }

    /// Takes the bundle's JWT keys and the taints that name them (the complete current sets).
    /// Returns whether either changed (then the caller runs a pass, which publishes them).
    pub fn set_jwt_keys(
        &mut self,
        keys: &[signet_pki::jwt::JwtPublicKey],
        tainted: &[String],
    ) -> bool {
        let mut changed = false;
        if *self.jwt_keys != *keys {
            tracing::info!(
                key_ids = ?keys.iter().map(|k| k.key_id()).collect::<Vec<_>>(),
                "JWT-SVID keys changed"
            );
            self.jwt_keys = keys.to_vec().into();
            changed = true;
        }
        if *self.jwt_tainted != *tainted {
            tracing::info!(tainted = ?tainted, "tainted JWT-SVID keys changed");
            self.jwt_tainted = tainted.to_vec().into();
            changed = true;
        }
        changed
    }

    /// The federated bundles served.
    pub fn federated(&self) -> &Federated {
        &self.federated
    }

    /// Takes the federated bundles of a `SyncEntries` answer (the complete current set) for a
    /// node of trust domain `own`: one for `own` is dropped (logged), as is a second one for
    /// the same trust domain. Returns whether what is served changed (then the caller runs a
    /// pass, which publishes them); the same set keeps its copy, so nothing is pushed.
    pub fn set_federated(
        &mut self,
        own: &TrustDomain,
        bundles: Vec<crate::ca::FederatedBundle>,
    ) -> bool {
        let mut next: Vec<FederatedBundle> = Vec::with_capacity(bundles.len());
        for b in bundles {
            if &b.trust_domain == own {
                tracing::warn!(trust_domain = %b.trust_domain, "ignoring a federated bundle for the agent's own trust domain");
                continue;
            }
            if next.iter().any(|n| n.trust_domain == b.trust_domain) {
                tracing::warn!(trust_domain = %b.trust_domain, "ignoring a second federated bundle for one trust domain");
                continue;
            }
            next.push(FederatedBundle {
                trust_domain: b.trust_domain,
                roots_der: b.x509_authorities.into(),
                jwt_keys: b.jwt_authorities.into(),
            });
        }
        next.sort_by(|a, b| a.trust_domain.as_str().cmp(b.trust_domain.as_str()));
        if *self.federated == *next {
            return false;
        }
        tracing::info!(
            trust_domains = ?next.iter().map(|b| b.trust_domain.as_str()).collect::<Vec<_>>(),
            "federated bundles changed"
        );
        self.federated = next.into();
        true
    }

    /// The taints and CRLs in force.
    pub fn revocations(&self) -> &Revocations {
        &self.revocations
    }

    /// Learns the CA certificates in `chain` (the node's, for instance) as CRL issuers.
    pub fn learn_issuers(&mut self, chain: &[Vec<u8>]) {
        self.issuers.learn(chain);
    }

    /// Learns the CA certificates in `chain` (a signed workload's); returns whether one was
    /// new (then [`Self::retry_unverified`] may verify a waiting CRL).
    pub fn learn_new_issuers(&mut self, chain: &[Vec<u8>]) -> bool {
        let before = self.issuers.clone();
        self.issuers.learn(chain);
        before != self.issuers
    }

    /// Forgets the CA certificates expired at `now`.
    pub fn prune(&mut self, now: SystemTime) {
        self.issuers.prune(now);
    }

    /// Restores CRLs the agent persisted (see [`Revocations::restore`]); served at once.
    pub fn restore_crls(&mut self, ders: &[Vec<u8>]) {
        for der in ders {
            if let Err(e) = self.revocations.restore(der) {
                tracing::warn!(error = %e, "ignoring a persisted CRL");
            }
        }
        self.refresh_crls();
    }

    /// Applies the bundle's taints (the complete current set) and CRLs: each CRL is verified
    /// against the CA certificate it names and kept only if newer than the one kept (see
    /// [`crate::revocation`]); one that fails is logged, counted and ignored. Returns whether
    /// anything in force changed (then the caller persists the CRLs and runs a pass now).
    pub fn set_revocations(&mut self, tainted: &[String], crls: &[Crl]) -> bool {
        let mut changed = self.revocations.set_tainted(tainted);
        if changed {
            tracing::info!(tainted = ?tainted, "tainted CA keys changed");
        }
        self.unverified.clear();
        for crl in crls {
            changed |= self.offer_crl(crl, true);
        }
        self.refresh_crls();
        changed
    }

    /// Offers again the CRLs whose issuer was unknown, after new chains were installed.
    /// Returns whether one was accepted.
    pub fn retry_unverified(&mut self) -> bool {
        let pending = std::mem::take(&mut self.unverified);
        let mut changed = false;
        for crl in &pending {
            changed |= self.offer_crl(crl, false);
        }
        self.refresh_crls();
        changed
    }

    /// Offers one CRL; `report`: log and count a refusal (not on a silent retry).
    fn offer_crl(&mut self, crl: &Crl, report: bool) -> bool {
        match self.revocations.offer(crl, &self.issuers) {
            Ok(true) => {
                let kept = self.revocations.crls().find(|c| c.key_id == crl.key_id);
                tracing::info!(
                    key_id = %crl.key_id,
                    number = kept.map(|c| c.number),
                    revoked = kept.map(|c| c.revoked_count()),
                    "new CRL"
                );
                true
            }
            Ok(false) => false,
            Err(e) => {
                if matches!(e, CrlRejected::UnknownIssuer(_)) {
                    self.unverified.push(crl.clone());
                }
                if report {
                    if let Some(m) = &self.metrics {
                        m.crl_rejections
                            .get_or_create(&vec![("reason", e.label().to_owned())])
                            .inc();
                    }
                    match e {
                        CrlRejected::NotNewer { .. } => tracing::debug!(error = %e, "CRL ignored"),
                        _ => tracing::warn!(error = %e, "CRL ignored"),
                    }
                }
                false
            }
        }
    }

    /// Keeps the served CRLs in step with those in force; the same set keeps its copy.
    fn refresh_crls(&mut self) {
        let crls = self.revocations.crls_der();
        if *self.crls_der != *crls {
            self.crls_der = crls.into();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use signet_pki::jwt::JwtSigner;

    fn key() -> signet_pki::jwt::JwtPublicKey {
        let k = signet_pki::generate(signet_pki::KeyAlgorithm::EcdsaP256).expect("key");
        JwtSigner::new(&k).expect("signer").public_key().clone()
    }

    fn federated(td: &str, root: &[u8]) -> crate::ca::FederatedBundle {
        crate::ca::FederatedBundle {
            trust_domain: td.parse().expect("td"),
            x509_authorities: vec![root.to_vec()],
            jwt_authorities: vec![key()],
            sequence: 1,
        }
    }

    #[test]
    fn a_federated_bundle_for_the_own_trust_domain_is_dropped() {
        let mut t = Trust::default();
        let own: TrustDomain = "example.org".parse().expect("td");
        let changed = t.set_federated(
            &own,
            vec![
                federated("example.org", b"evil"),
                federated("partner.example", b"p1"),
            ],
        );
        assert!(changed);
        let held: Vec<&str> = t
            .federated()
            .iter()
            .map(|b| b.trust_domain.as_str())
            .collect();
        assert_eq!(held, ["partner.example"]);
        // Only the own one: nothing federated at all.
        assert!(t.set_federated(&own, vec![federated("example.org", b"evil")]));
        assert!(t.federated().is_empty());
    }

    #[test]
    fn federated_bundles_change_only_when_they_differ_and_are_sorted() {
        let mut t = Trust::default();
        let own: TrustDomain = "example.org".parse().expect("td");
        let (z, a) = (federated("z.example", b"z"), federated("a.example", b"a"));
        assert!(t.set_federated(&own, vec![z.clone(), a.clone()]));
        let names: Vec<&str> = t
            .federated()
            .iter()
            .map(|b| b.trust_domain.as_str())
            .collect();
        assert_eq!(names, ["a.example", "z.example"]);
        let before = t.federated().clone();
        assert!(!t.set_federated(&own, vec![a.clone(), z.clone()]));
        assert!(
            Arc::ptr_eq(&before, t.federated()),
            "the same set keeps its copy"
        );
        let mut a2 = a.clone();
        a2.x509_authorities.push(b"a2".to_vec());
        assert!(t.set_federated(&own, vec![a2, z]));
        assert!(t.set_federated(&own, vec![]));
        assert!(t.federated().is_empty());
    }

    #[test]
    fn jwt_keys_and_their_taints_change_only_when_they_differ() {
        let mut t = Trust::default();
        let (a, b) = (key(), key());
        assert!(t.set_jwt_keys(std::slice::from_ref(&a), &[]));
        assert!(
            !t.set_jwt_keys(std::slice::from_ref(&a), &[]),
            "the same set: no pass"
        );
        let before = t.jwt_keys().clone();
        assert!(!t.set_jwt_keys(std::slice::from_ref(&a), &[]));
        assert!(
            Arc::ptr_eq(&before, t.jwt_keys()),
            "the same set keeps its copy"
        );
        assert!(t.set_jwt_keys(&[a.clone(), b.clone()], &[]));
        let tainted = [a.key_id().to_owned()];
        assert!(t.set_jwt_keys(&[a.clone(), b.clone()], &tainted));
        assert_eq!(&**t.jwt_tainted(), &tainted);
        assert!(t.set_jwt_keys(&[b], &[]));
        assert!(t.jwt_tainted().is_empty());
    }
}
