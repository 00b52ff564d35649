//! Renewal over mTLS: what a certificate presented by its holder may be renewed into.
//!
//! The TLS layer proved that the caller holds a certificate that chains to this CA. That alone
//! is not enough to renew it: the authority it was issued under may be gone (the entry
//! deleted, its node banned, the service-account token long expired). So every mTLS request is
//! decided together with a [`RenewalBasis`], which only [`assess`] builds, from
//!
//! 1. the presented certificate's ledger row (by serial): it must be there, be this very
//!    certificate (same SHA-256), name the caller's identity, and not be revoked;
//! 2. the row's provenance, re-checked by source ([`crate::provenance`] has the table): an
//!    `entry` still exists with that identity under a node that is not banned; a
//!    `service_account` or `admin` authorization is younger than `policy.mtls_renewal_max_age`
//!    (carried forward through renewals, so the chain ends); any other source (the bridge, an
//!    impersonator, a node's own SVID, the server) and any row without provenance cannot renew
//!    over mTLS.
//!
//! The basis then bounds the new certificate: the same identity, only the presented DNS names
//! that the source still allows, and a lifetime no longer than the source allows.
//!
//! Pure: the issuer looks the rows up (see [`entry_to_check`]) and passes them in.

use std::time::Duration;

use signet_types::SpiffeId;

use super::{Denial, Policy};
use crate::authn::{AuthenticatedCaller, CallerKind};
use crate::ca::BACKDATE;
use crate::provenance::{Provenance, ProvenanceError, Source};
use crate::store::{CertificateRow, EntryRow, NodeRow};

/// What a presented certificate may be renewed into. Only [`assess`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewalBasis {
    serial: String,
    spiffe_id: SpiffeId,
    source: Source,
    authorized_at: i64,
    dns_names: Vec<String>,
    max_ttl: Duration,
}

impl RenewalBasis {
    /// The presented certificate's serial.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }

    /// The DNS names a renewal may carry.
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// The longest lifetime a renewal may have.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// The provenance of the renewed certificate: the same source, the same moment of
    /// authorization, and the serial it renews.
    pub fn carried_forward(&self) -> Provenance {
        Provenance {
            source: self.source.clone(),
            authorized_at: self.authorized_at,
            renewed_from: Some(self.serial.clone()),
        }
    }
}

#[cfg(test)]
impl RenewalBasis {
    /// A basis as [`assess`] would make it for `caller` (an mTLS caller) from an admin-sourced
    /// row, for policy tests.
    pub(crate) fn for_tests(
        caller: &AuthenticatedCaller,
        dns_names: Vec<String>,
        max_ttl: Duration,
    ) -> Self {
        let serial = match caller.kind() {
            CallerKind::Mtls { serial, .. } => serial.clone(),
            _ => String::new(),
        };
        Self {
            serial,
            spiffe_id: caller.spiffe_id().clone(),
            source: Source::Admin,
            authorized_at: 0,
            dns_names,
            max_ttl,
        }
    }
}

/// For a row whose source is a registration entry: the entry ID and node ID to look up.
pub fn entry_to_check(row: &CertificateRow) -> Option<(String, String)> {
    match Provenance::from_ledger_text(&row.entry.provenance) {
        Ok(Provenance {
            source: Source::Entry { entry_id, node_id },
            ..
        }) => Some((entry_id, node_id)),
        _ => None,
    }
}

/// The registration entry of an entry-sourced row and its parent node's row, as found now
/// (`None` when gone).
#[derive(Debug, Clone, Copy, Default)]
pub struct EntryFacts<'a> {
    pub entry: Option<&'a EntryRow>,
    pub node: Option<&'a NodeRow>,
}

fn refused(message: String) -> Denial {
    Denial::denied("policy.renewal", message)
}

/// The presented certificate's ledger row checks: present, this very certificate, the caller's
/// identity, not revoked. Shared by workload renewal and the node API.
pub fn check_presented(
    caller: &AuthenticatedCaller,
    serial: &str,
    leaf_sha256: &[u8; 32],
    row: Option<&CertificateRow>,
) -> Result<(), Denial> {
    let Some(row) = row else {
        return Err(refused(format!(
            "the presented certificate (serial {serial}) is not in this CA's ledger, so it \
             cannot be renewed; authenticate with the credential it was issued for"
        )));
    };
    if &row.entry.cert_sha256 != leaf_sha256 {
        return Err(refused(format!(
            "the presented certificate is not the one this CA recorded under serial {serial}"
        )));
    }
    if row.entry.spiffe_id != caller.spiffe_id().to_string() {
        return Err(refused(format!(
            "the ledger records serial {serial} for {}, not {}",
            row.entry.spiffe_id,
            caller.spiffe_id()
        )));
    }
    if let Some(at) = row.revoked_at {
        return Err(refused(format!(
            "the presented certificate (serial {serial}) was revoked at {at}"
        )));
    }
    Ok(())
}

/// Decides what the mTLS `caller` may renew its presented certificate into, from its ledger
/// `row` and, for an entry-sourced row, the entry and node as they are now. `now` is unix
/// seconds.
pub fn assess(
    policy: &Policy,
    caller: &AuthenticatedCaller,
    row: Option<&CertificateRow>,
    facts: EntryFacts<'_>,
    now: i64,
) -> Result<RenewalBasis, Denial> {
    let CallerKind::Mtls {
        serial,
        leaf_sha256,
        ..
    } = caller.kind()
    else {
        return Err(Denial::invalid(
            "policy.renewal",
            "only a caller presenting a certificate over mTLS renews it",
        ));
    };
    check_presented(caller, serial, leaf_sha256, row)?;
    let Some(row) = row else {
        return Err(refused(format!("serial {serial} is not in the ledger")));
    };
    let provenance = Provenance::from_ledger_text(&row.entry.provenance).map_err(|e| match e {
        ProvenanceError::Missing => refused(format!(
            "the presented certificate (serial {serial}) was issued before this CA recorded \
             where a certificate's authority comes from, so its source cannot be re-checked; \
             obtain a new one with the credential it was issued for"
        )),
        ProvenanceError::Malformed(m) => {
            tracing::error!(serial = %serial, error = %m, "ledger row has unreadable provenance");
            refused(format!(
                "the ledger row of serial {serial} cannot be read, so the certificate cannot be \
                 renewed"
            ))
        }
    })?;
    let presented_lifetime = Duration::from_secs(
        u64::try_from(row.entry.not_after.saturating_sub(row.entry.not_before))
            .unwrap_or(0)
            .saturating_sub(BACKDATE.as_secs()),
    );
    let within_age = |what: &str| -> Result<(), Denial> {
        let age = now.saturating_sub(provenance.authorized_at);
        let max = policy.mtls_renewal_max_age();
        if u64::try_from(age).unwrap_or(0) > max.as_secs() {
            return Err(refused(format!(
                "{what} that authorized this certificate was checked {} ago, longer than \
                 policy.mtls_renewal_max_age ({}); authenticate with it again instead of renewing \
                 over mTLS",
                humantime::format_duration(Duration::from_secs(u64::try_from(age).unwrap_or(0))),
                humantime::format_duration(max)
            )));
        }
        Ok(())
    };
    let presented_dns = &row.entry.dns_names;
    let (dns_names, max_ttl, authorized_at) = match &provenance.source {
        Source::ServiceAccount {
            namespace,
            service_account,
            ..
        } => {
            within_age("the service-account token")?;
            let own = format!("/ns/{namespace}/sa/{service_account}");
            if caller.spiffe_id().path() != own {
                return Err(refused(format!(
                    "the ledger records serial {serial} for service account \
                     {namespace}/{service_account}, which is not {}",
                    caller.spiffe_id()
                )));
            }
            let names = presented_dns
                .iter()
                .filter(|n| policy.service_account_may_have(n, namespace, service_account))
                .cloned()
                .collect();
            (names, presented_lifetime, provenance.authorized_at)
        }
        Source::Admin => {
            within_age("the operator's mint")?;
            (
                presented_dns.clone(),
                presented_lifetime,
                provenance.authorized_at,
            )
        }
        Source::Entry { entry_id, node_id } => {
            let gone = || {
                refused(format!(
                    "registration entry {entry_id} that authorized this certificate no longer \
                     exists for {}",
                    caller.spiffe_id()
                ))
            };
            let entry = facts.entry.ok_or_else(gone)?;
            if entry.id != *entry_id || entry.spiffe_id != caller.spiffe_id().to_string() {
                return Err(gone());
            }
            let node_spiffe_id = signet_types::node::node_spiffe_id(policy.trust_domain(), node_id)
                .map_err(|e| refused(format!("entry {entry_id}: {e}")))?;
            if entry.parent_id != node_spiffe_id.to_string() {
                return Err(refused(format!(
                    "registration entry {entry_id} is no longer parented to node {node_id}"
                )));
            }
            match facts.node {
                None => {
                    return Err(refused(format!(
                        "node {node_id}, the parent of entry {entry_id}, is not attested"
                    )));
                }
                Some(n) if n.banned_at.is_some() => {
                    return Err(refused(format!(
                        "node {node_id}, the parent of entry {entry_id}, is banned; its \
                         workloads' certificates cannot be renewed"
                    )));
                }
                Some(_) => {}
            }
            let names = presented_dns
                .iter()
                .filter(|n| entry.dns_names.iter().any(|d| d.eq_ignore_ascii_case(n)))
                .cloned()
                .collect();
            let ttl = match u64::try_from(entry.ttl_seconds) {
                Ok(0) | Err(_) => policy.default_ttl,
                Ok(s) => Duration::from_secs(s),
            };
            // The entry is the live authority, re-checked just now.
            (names, ttl, now)
        }
        other => {
            let why = match other {
                Source::Bridge { namespace, .. } => format!(
                    "it was issued to the Kubernetes bridge for an object in namespace \
                     {namespace}; the bridge renews it"
                ),
                Source::Impersonated { impersonator } => {
                    format!(
                        "it was obtained by {impersonator} on this workload's behalf; ask it again"
                    )
                }
                Source::Node { .. } => {
                    "it is a node identity; nodes renew with signet.agent.v1.Node/RenewNode".into()
                }
                _ => "it is the CA server's own certificate".into(),
            };
            return Err(refused(format!(
                "the presented certificate (serial {serial}) cannot be renewed over mTLS: {why}"
            )));
        }
    };
    Ok(RenewalBasis {
        serial: serial.clone(),
        spiffe_id: caller.spiffe_id().clone(),
        source: provenance.source,
        authorized_at,
        dns_names,
        max_ttl,
    })
}

/// For a node calling the node API with its node SVID: the presented certificate must be this
/// CA's record of that node's identity (rows written before provenance was recorded are
/// accepted on their identity alone, so agents keep working across the upgrade).
pub fn assess_node(
    caller: &AuthenticatedCaller,
    row: Option<&CertificateRow>,
) -> Result<(), Denial> {
    let CallerKind::Node {
        node_id,
        serial: Some(serial),
        leaf_sha256: Some(sha),
    } = caller.kind()
    else {
        return Err(Denial::invalid(
            "policy.renewal",
            "the node API takes the node SVID over mTLS",
        ));
    };
    check_presented(caller, serial, sha, row)?;
    let provenance = row.map(|r| Provenance::from_ledger_text(&r.entry.provenance));
    match provenance {
        Some(Err(ProvenanceError::Missing)) => Ok(()),
        Some(Ok(Provenance {
            source: Source::Node { node_id: n, .. },
            ..
        })) if &n == node_id => Ok(()),
        _ => Err(refused(format!(
            "the presented certificate (serial {serial}) was not issued as node {node_id}'s identity"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PolicyConfig;
    use signet_types::TrustDomain;
    use signet_types::ledger::LedgerEntry;

    const HOUR: Duration = Duration::from_secs(3600);
    const NOW: i64 = 1_700_100_000;
    const SHA: [u8; 32] = [9; 32];

    fn td() -> TrustDomain {
        TrustDomain::new("example.org").expect("td")
    }

    fn policy() -> Policy {
        Policy::new(
            td(),
            HOUR,
            24 * HOUR,
            &PolicyConfig {
                kubernetes_dns_templates: vec!["{serviceaccount}.{namespace}.svc".into()],
                ..PolicyConfig::default()
            },
        )
        .expect("policy")
    }

    fn caller(path: &str) -> AuthenticatedCaller {
        AuthenticatedCaller::for_tests(
            td().id(path).expect("id"),
            CallerKind::Mtls {
                dns_names: vec![],
                serial: "8f01".into(),
                leaf_sha256: SHA,
            },
        )
    }

    fn row(path: &str, dns: &[&str], lifetime: i64, provenance: &str) -> CertificateRow {
        CertificateRow {
            entry: LedgerEntry {
                seq: 7,
                serial: "8f01".into(),
                spiffe_id: format!("spiffe://example.org{path}"),
                dns_names: dns.iter().map(|s| s.to_string()).collect(),
                ip_addresses: vec![],
                not_before: NOW - 100,
                not_after: NOW - 100 + 10 + lifetime,
                cert_sha256: SHA,
                ca_key_id: "root".into(),
                caller: "test".into(),
                issued_at: NOW - 100,
                request_id: "r".into(),
                provenance: provenance.into(),
            },
            revoked_at: None,
            revocation_reason: None,
            prev_hash: [0; 32],
            hash: [0; 32],
            cert_der: vec![],
        }
    }

    fn sa_provenance(authorized_at: i64) -> String {
        Provenance::new(
            Source::ServiceAccount {
                namespace: "web".into(),
                service_account: "frontend".into(),
                pod: None,
                node: None,
            },
            authorized_at,
        )
        .to_ledger_text()
    }

    fn entry_provenance() -> String {
        Provenance::new(
            Source::Entry {
                entry_id: "e1".into(),
                node_id: "vm1".into(),
            },
            NOW - 100,
        )
        .to_ledger_text()
    }

    fn entry_row(ttl: i64, dns: &[&str]) -> EntryRow {
        EntryRow {
            id: "e1".into(),
            spiffe_id: "spiffe://example.org/app".into(),
            parent_id: "spiffe://example.org/signet/node/vm1".into(),
            selectors: vec!["unix:uid:1000".into()],
            ttl_seconds: ttl,
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            revision: 1,
            created_at: NOW - 1000,
        }
    }

    fn node_row(banned: bool) -> NodeRow {
        NodeRow {
            node_id: "vm1".into(),
            spiffe_id: "spiffe://example.org/signet/node/vm1".into(),
            attested_at: NOW - 1000,
            banned_at: banned.then_some(NOW - 10),
            last_serial: "aa".into(),
            not_after: NOW + 1000,
            attestation: "join_token".into(),
        }
    }

    fn refused(r: Result<RenewalBasis, Denial>) -> String {
        let d = r.expect_err("refused");
        assert_eq!(d.reason, "policy.renewal", "{d:?}");
        assert_eq!(d.kind, super::super::DenialKind::PermissionDenied, "{d:?}");
        d.message
    }

    #[test]
    fn the_presented_certificate_must_be_the_ledgers_unrevoked_record() {
        let c = caller("/ns/web/sa/frontend");
        let p = policy();
        let none = EntryFacts::default();
        let m = refused(assess(&p, &c, None, none, NOW));
        assert!(m.contains("not in this CA's ledger"), "{m}");
        let mut r = row("/ns/web/sa/frontend", &[], 3600, &sa_provenance(NOW - 100));
        r.entry.cert_sha256 = [1; 32];
        let m = refused(assess(&p, &c, Some(&r), none, NOW));
        assert!(m.contains("not the one this CA recorded"), "{m}");
        let r = row("/ns/web/sa/other", &[], 3600, &sa_provenance(NOW - 100));
        let m = refused(assess(&p, &c, Some(&r), none, NOW));
        assert!(
            m.contains("not spiffe://example.org/ns/web/sa/frontend"),
            "{m}"
        );
        let mut r = row("/ns/web/sa/frontend", &[], 3600, &sa_provenance(NOW - 100));
        r.revoked_at = Some(NOW - 5);
        let m = refused(assess(&p, &c, Some(&r), none, NOW));
        assert!(m.contains("revoked"), "{m}");
        let r = row("/ns/web/sa/frontend", &[], 3600, "");
        let m = refused(assess(&p, &c, Some(&r), none, NOW));
        assert!(m.contains("cannot be re-checked"), "{m}");
        let r = row("/ns/web/sa/frontend", &[], 3600, "{garbage");
        let m = refused(assess(&p, &c, Some(&r), none, NOW));
        assert!(m.contains("cannot be read"), "{m}");
    }

    #[test]
    fn a_service_account_certificate_renews_within_its_age_and_templates() {
        let c = caller("/ns/web/sa/frontend");
        let p = policy();
        let authorized = NOW - 3 * 3600;
        let r = row(
            "/ns/web/sa/frontend",
            &["frontend.web.svc", "old.example.org"],
            1800,
            &sa_provenance(authorized),
        );
        let b = assess(&p, &c, Some(&r), EntryFacts::default(), NOW).expect("renewable");
        // Only the names the templates still allow; no longer than the presented certificate.
        assert_eq!(b.dns_names(), ["frontend.web.svc"]);
        assert_eq!(b.max_ttl(), Duration::from_secs(1800));
        // The chain stays anchored at the token check.
        let carried = b.carried_forward();
        assert_eq!(carried.authorized_at, authorized);
        assert_eq!(carried.renewed_from.as_deref(), Some("8f01"));
        // Past policy.mtls_renewal_max_age (24 h) the chain ends.
        let r = row(
            "/ns/web/sa/frontend",
            &[],
            1800,
            &sa_provenance(NOW - 25 * 3600),
        );
        let m = refused(assess(&p, &c, Some(&r), EntryFacts::default(), NOW));
        assert!(m.contains("policy.mtls_renewal_max_age"), "{m}");
    }

    #[test]
    fn an_entry_certificate_renews_only_while_its_entry_and_node_stand() {
        let c = caller("/app");
        let p = policy();
        let r = row(
            "/app",
            &["app.example.org", "gone.example.org"],
            86400,
            &entry_provenance(),
        );
        assert_eq!(entry_to_check(&r), Some(("e1".into(), "vm1".into())));
        let e = entry_row(600, &["app.example.org"]);
        let n = node_row(false);
        let facts = EntryFacts {
            entry: Some(&e),
            node: Some(&n),
        };
        let b = assess(&p, &c, Some(&r), facts, NOW).expect("renewable");
        // The entry as it is now bounds the result, not the presented certificate.
        assert_eq!(b.dns_names(), ["app.example.org"]);
        assert_eq!(b.max_ttl(), Duration::from_secs(600));
        assert_eq!(b.carried_forward().authorized_at, NOW);
        // Entry TTL 0 is the default.
        let e0 = entry_row(0, &[]);
        let b = assess(
            &p,
            &c,
            Some(&r),
            EntryFacts {
                entry: Some(&e0),
                node: Some(&n),
            },
            NOW,
        )
        .expect("renewable");
        assert_eq!(b.max_ttl(), HOUR);

        // Deleted entry.
        let m = refused(assess(
            &p,
            &c,
            Some(&r),
            EntryFacts {
                entry: None,
                node: Some(&n),
            },
            NOW,
        ));
        assert!(m.contains("no longer exists"), "{m}");
        // Banned or unknown node.
        let banned = node_row(true);
        let m = refused(assess(
            &p,
            &c,
            Some(&r),
            EntryFacts {
                entry: Some(&e),
                node: Some(&banned),
            },
            NOW,
        ));
        assert!(m.contains("is banned"), "{m}");
        let m = refused(assess(
            &p,
            &c,
            Some(&r),
            EntryFacts {
                entry: Some(&e),
                node: None,
            },
            NOW,
        ));
        assert!(m.contains("not attested"), "{m}");
        // The entry now names another identity, or another parent.
        let mut moved = entry_row(600, &[]);
        moved.spiffe_id = "spiffe://example.org/other".into();
        refused(assess(
            &p,
            &c,
            Some(&r),
            EntryFacts {
                entry: Some(&moved),
                node: Some(&n),
            },
            NOW,
        ));
        let mut reparented = entry_row(600, &[]);
        reparented.parent_id = "spiffe://example.org/signet/node/vm2".into();
        let m = refused(assess(
            &p,
            &c,
            Some(&r),
            EntryFacts {
                entry: Some(&reparented),
                node: Some(&n),
            },
            NOW,
        ));
        assert!(m.contains("no longer parented"), "{m}");
    }

    #[test]
    fn sources_that_cannot_be_rechecked_never_renew() {
        let p = policy();
        for (source, want) in [
            (
                Source::Bridge {
                    bridge: "spiffe://example.org/ns/signet-system/sa/signet-k8s".into(),
                    namespace: "demo".into(),
                },
                "Kubernetes bridge",
            ),
            (
                Source::Impersonated {
                    impersonator: "spiffe://example.org/ns/istio-system/sa/ztunnel".into(),
                },
                "on this workload's behalf",
            ),
            (
                Source::Node {
                    node_id: "vm1".into(),
                    attestation: "join_token".into(),
                },
                "RenewNode",
            ),
            (Source::Server, "server's own"),
        ] {
            let text = Provenance::new(source, NOW - 10).to_ledger_text();
            let r = row("/ns/demo/sa/web", &[], 3600, &text);
            let m = refused(assess(
                &p,
                &caller("/ns/demo/sa/web"),
                Some(&r),
                EntryFacts::default(),
                NOW,
            ));
            assert!(m.contains(want), "{want}: {m}");
        }
        // Admin-minted: like a token, within the age limit.
        let text = Provenance::new(Source::Admin, NOW - 10).to_ledger_text();
        let r = row("/web", &["web.example.org"], 600, &text);
        let b = assess(&p, &caller("/web"), Some(&r), EntryFacts::default(), NOW)
            .expect("admin mint renews");
        assert_eq!(b.dns_names(), ["web.example.org"]);
        assert_eq!(b.max_ttl(), Duration::from_secs(600));
    }

    #[test]
    fn a_node_presents_its_own_recorded_node_certificate() {
        let node = AuthenticatedCaller::for_tests(
            td().id("/signet/node/vm1").expect("id"),
            CallerKind::Node {
                node_id: "vm1".into(),
                serial: Some("8f01".into()),
                leaf_sha256: Some(SHA),
            },
        );
        let own = Provenance::new(
            Source::Node {
                node_id: "vm1".into(),
                attestation: "renewal".into(),
            },
            NOW,
        )
        .to_ledger_text();
        assess_node(&node, Some(&row("/signet/node/vm1", &[], 3600, &own))).expect("own");
        // Written before provenance was recorded: accepted on identity alone.
        assess_node(&node, Some(&row("/signet/node/vm1", &[], 3600, ""))).expect("legacy");
        refused_node(assess_node(&node, None));
        let other = Provenance::new(
            Source::Node {
                node_id: "vm2".into(),
                attestation: "renewal".into(),
            },
            NOW,
        )
        .to_ledger_text();
        refused_node(assess_node(
            &node,
            Some(&row("/signet/node/vm1", &[], 3600, &other)),
        ));
        refused_node(assess_node(
            &node,
            Some(&row("/signet/node/vm1", &[], 3600, &entry_provenance())),
        ));
        let mut revoked = row("/signet/node/vm1", &[], 3600, &own);
        revoked.revoked_at = Some(NOW);
        refused_node(assess_node(&node, Some(&revoked)));
    }

    fn refused_node(r: Result<(), Denial>) {
        let d = r.expect_err("refused");
        assert_eq!(d.reason, "policy.renewal", "{d:?}");
    }
}
