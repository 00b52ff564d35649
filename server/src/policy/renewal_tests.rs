//! Tests of [`super`]: what a presented certificate may be renewed into, by source.

use super::*;
use crate::config::PolicyConfig;
use signet_types::TrustDomain;
use signet_types::ledger::{LedgerEntry, Revocation};

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

fn row(path: &str, dns: &[&str], lifetime: i64, provenance: &str) -> LedgerRecord {
    LedgerRecord {
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
        revocation: None,
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
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
        owner: String::new(),
        owner_scope: String::new(),
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
        selectors: vec![
            "join_token:node_id:vm1".into(),
            "signet:attestation:join_token".into(),
        ],
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
    r.revocation = Some(Revocation {
        at: NOW - 5,
        reason: "keyCompromise".into(),
    });
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
        node_set: None,
    };
    let b = assess(&p, &c, Some(&r), facts, NOW).expect("renewable");
    // The entry as it is now bounds the result, not the presented certificate.
    assert_eq!(b.dns_names(), ["app.example.org"]);
    assert_eq!(b.max_ttl(), Duration::from_secs(600));
    // The delivery's moment is carried forward, so the chain ages out like a token's.
    assert_eq!(b.carried_forward().authorized_at, NOW - 100);
    let stale = row(
        "/app",
        &["app.example.org"],
        86400,
        &Provenance::new(
            Source::Entry {
                entry_id: "e1".into(),
                node_id: "vm1".into(),
            },
            NOW - 86400 - 1,
        )
        .to_ledger_text(),
    );
    let stale_refusal = assess(
        &p,
        &c,
        Some(&stale),
        EntryFacts {
            entry: Some(&e),
            node: Some(&n),
            node_set: None,
        },
        NOW,
    )
    .expect_err("a delivery older than policy.mtls_renewal_max_age");
    assert!(
        stale_refusal.to_string().contains("mtls_renewal_max_age"),
        "{stale_refusal}"
    );
    // Entry TTL 0 is the default.
    let e0 = entry_row(0, &[]);
    let b = assess(
        &p,
        &c,
        Some(&r),
        EntryFacts {
            entry: Some(&e0),
            node: Some(&n),
            node_set: None,
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
            node_set: None,
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
            node_set: None,
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
            node_set: None,
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
            node_set: None,
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
            node_set: None,
        },
        NOW,
    ));
    assert!(m.contains("no longer parented"), "{m}");
}

#[test]
fn a_node_set_entry_certificate_renews_only_while_its_node_is_a_member() {
    use crate::store::NodeSetRow;
    let c = caller("/app");
    let p = policy();
    let r = row("/app", &[], 86400, &entry_provenance());
    let mut e = entry_row(600, &[]);
    e.parent_id = "spiffe://example.org/signet/nodeset/vms".into();
    let set = NodeSetRow {
        name: "vms".into(),
        selectors: vec!["signet:attestation:join_token".into()],
        created_at: 0,
    };
    let n = node_row(false);
    let facts = |node, node_set| EntryFacts {
        entry: Some(&e),
        node,
        node_set,
    };
    assess(&p, &c, Some(&r), facts(Some(&n), Some(&set)), NOW).expect("a member renews");
    // The set is gone, the node no longer proves the set's selectors, or it is banned.
    let m = refused(assess(&p, &c, Some(&r), facts(Some(&n), None), NOW));
    assert!(m.contains("no longer a member of node set vms"), "{m}");
    let mut moved = node_row(false);
    moved.selectors = vec!["signet:attestation:k8s_psat".into()];
    let m = refused(assess(
        &p,
        &c,
        Some(&r),
        facts(Some(&moved), Some(&set)),
        NOW,
    ));
    assert!(m.contains("no longer a member of node set vms"), "{m}");
    let banned = node_row(true);
    let m = refused(assess(
        &p,
        &c,
        Some(&r),
        facts(Some(&banned), Some(&set)),
        NOW,
    ));
    assert!(m.contains("is banned"), "{m}");
    // Another set's row does not count.
    let other = NodeSetRow {
        name: "other".into(),
        ..set.clone()
    };
    refused(assess(&p, &c, Some(&r), facts(Some(&n), Some(&other)), NOW));
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
    revoked.revocation = Some(Revocation {
        at: NOW,
        reason: "superseded".into(),
    });
    refused_node(assess_node(&node, Some(&revoked)));
}

fn refused_node(r: Result<(), Denial>) {
    let d = r.expect_err("refused");
    assert_eq!(d.reason, "policy.renewal", "{d:?}");
}
