//! Nodes (their own identity and their entries' identities) and lifetimes.

use super::*;

#[test]
fn a_node_renews_only_its_own_id_without_names() {
    let n1 = node("n1");
    let g = decide_src(&n1, &names(&[], &[]), GrantSource::NodeRenewal, None).expect("ok");
    assert_eq!(g.spiffe_id, id("/signet/node/n1"));
    assert!(g.dns_names.is_empty());
    let r = decide_src(
        &n1,
        &names(&["spiffe://example.org/signet/node/n2"], &[]),
        GrantSource::NodeRenewal,
        None,
    );
    denied(r, DenialKind::PermissionDenied, "policy.identity");
    let r = decide_src(
        &n1,
        &names(&[], &["x.example.org"]),
        GrantSource::NodeRenewal,
        None,
    );
    denied(r, DenialKind::PermissionDenied, "policy.dns_name");
    let r = decide_src(
        &n1,
        &names(&[], &[]),
        GrantSource::NodeRenewal,
        Some("spiffe://example.org/app"),
    );
    denied(r, DenialKind::PermissionDenied, "policy.impersonation");
}

#[test]
fn a_node_may_not_use_the_other_apis() {
    let r = decide_src(&node("n1"), &names(&[], &[]), GrantSource::Caller, None);
    let msg = denied(r, DenialKind::PermissionDenied, "policy.node");
    assert!(msg.contains("RenewNode"), "{msg}");
}

#[test]
fn only_nodes_use_node_sources() {
    let e = entry("n1", 0);
    for caller in [sa("default", "web"), mtls("/app", &[]), admin()] {
        let r = decide_src(&caller, &names(&[], &[]), GrantSource::NodeRenewal, None);
        denied(r, DenialKind::PermissionDenied, "policy.node");
        let r = decide_src(&caller, &names(&[], &[]), GrantSource::Entry(&e), None);
        denied(r, DenialKind::PermissionDenied, "policy.node");
    }
}

#[test]
fn a_node_gets_its_entries_with_their_names_and_ttl() {
    let e = entry("n1", 600);
    let g = decide_src(
        &node("n1"),
        &names(&[], &["app.example.org"]),
        GrantSource::Entry(&e),
        None,
    )
    .expect("ok");
    assert_eq!(g.spiffe_id, id("/app"));
    assert_eq!(g.dns_names, ["app.example.org"]);
    assert_eq!(g.ttl, Duration::from_secs(600));
    // The entry's TTL is clamped like any other.
    let long = entry("n1", 7 * 86400);
    let g = decide_src(
        &node("n1"),
        &names(&[], &[]),
        GrantSource::Entry(&long),
        None,
    )
    .expect("ok");
    assert_eq!(g.ttl, 24 * HOUR);
    // Another node's entry.
    let r = decide_src(&node("n2"), &names(&[], &[]), GrantSource::Entry(&e), None);
    denied(r, DenialKind::PermissionDenied, "policy.entry");
    // Names beyond the entry's, or another ID in the CSR.
    let r = decide_src(
        &node("n1"),
        &names(&[], &["evil.example.org"]),
        GrantSource::Entry(&e),
        None,
    );
    denied(r, DenialKind::PermissionDenied, "policy.dns_name");
    let r = decide_src(
        &node("n1"),
        &names(&["spiffe://example.org/other"], &[]),
        GrantSource::Entry(&e),
        None,
    );
    denied(r, DenialKind::PermissionDenied, "policy.identity");
    // Never an ID under /signet/, even if such an entry existed.
    let reserved = EntryGrant {
        spiffe_id: id("/signet/server"),
        ..entry("n1", 0)
    };
    let r = decide_src(
        &node("n1"),
        &names(&[], &[]),
        GrantSource::Entry(&reserved),
        None,
    );
    denied(r, DenialKind::PermissionDenied, "policy.entry");
}

/// An entry of node set `k8s` (`k8s_psat:cluster:prod`), and its grant as the node API builds
/// it for a caller whose attestation proved `selectors`.
fn set_entry(selectors: &[&str], banned: bool) -> EntryGrant {
    use crate::node_sets::NodeSetMembership;
    use crate::store::{NodeRow, NodeSetRow};
    let td = signet_types::TrustDomain::new("example.org").expect("td");
    let parent = id("/signet/nodeset/k8s");
    let set = NodeSetRow {
        name: "k8s".into(),
        selectors: vec!["k8s_psat:cluster:prod".into()],
        created_at: 0,
    };
    let caller = NodeRow {
        node_id: "n1".into(),
        spiffe_id: "spiffe://example.org/signet/node/n1".into(),
        attested_at: 0,
        banned_at: banned.then_some(1),
        last_serial: "01".into(),
        not_after: 1,
        attestation: "k8s_psat".into(),
        selectors: selectors.iter().map(|s| (*s).to_owned()).collect(),
    };
    EntryGrant {
        parent_id: parent.clone(),
        node_set: NodeSetMembership::decide(&td, &parent, Some(&set), &caller),
        ..entry("n1", 0)
    }
}

#[test]
fn a_member_node_gets_its_node_sets_entries_and_no_other_node_does() {
    let member = set_entry(
        &["k8s_psat:cluster:prod", "signet:attestation:k8s_psat"],
        false,
    );
    let g = decide_src(
        &node("n1"),
        &names(&[], &[]),
        GrantSource::Entry(&member),
        None,
    )
    .expect("a member signs");
    assert_eq!(g.spiffe_id, id("/app"));
    for outsider in [
        set_entry(
            &["k8s_psat:cluster:dev", "signet:attestation:k8s_psat"],
            false,
        ),
        set_entry(
            &["k8s_psat:cluster:prod", "signet:attestation:k8s_psat"],
            true,
        ),
    ] {
        let r = decide_src(
            &node("n1"),
            &names(&[], &[]),
            GrantSource::Entry(&outsider),
            None,
        );
        let msg = denied(r, DenialKind::PermissionDenied, "policy.entry");
        assert!(msg.contains("not a member of node set k8s"), "{msg}");
    }
    // A set's entry without the membership proof is another parent's entry.
    let unproved = EntryGrant {
        node_set: None,
        ..member.clone()
    };
    let r = decide_src(
        &node("n1"),
        &names(&[], &[]),
        GrantSource::Entry(&unproved),
        None,
    );
    denied(r, DenialKind::PermissionDenied, "policy.entry");
    // A proof for another set does not admit this one.
    let other = EntryGrant {
        parent_id: id("/signet/nodeset/other"),
        ..member
    };
    let r = decide_src(
        &node("n1"),
        &names(&[], &[]),
        GrantSource::Entry(&other),
        None,
    );
    denied(r, DenialKind::PermissionDenied, "policy.entry");
}

// ---- TTL ----

#[test]
fn ttl_zero_is_default_and_long_is_clamped() {
    let web = sa("default", "web");
    let n = names(&[], &[]);
    assert_eq!(decide(&web, &n, 0, None).expect("ok").ttl, HOUR);
    assert_eq!(
        decide(&web, &n, 600, None).expect("ok").ttl,
        Duration::from_secs(600)
    );
    assert_eq!(
        decide(&web, &n, 7 * 86400, None).expect("ok").ttl,
        24 * HOUR
    );
    assert_eq!(
        decide(&web, &n, ABSURD_TTL_SECONDS, None).expect("ok").ttl,
        24 * HOUR
    );
}

#[test]
fn ttl_negative_or_absurd_is_invalid() {
    let web = sa("default", "web");
    let n = names(&[], &[]);
    let m = denied(
        decide(&web, &n, -1, None),
        DenialKind::InvalidArgument,
        "policy.ttl",
    );
    assert!(m.contains("negative"), "{m}");
    let m = denied(
        decide(&web, &n, ABSURD_TTL_SECONDS + 1, None),
        DenialKind::InvalidArgument,
        "policy.ttl",
    );
    assert!(m.contains("absurd"), "{m}");
    denied(
        decide(&web, &n, i64::MAX, None),
        DenialKind::InvalidArgument,
        "policy.ttl",
    );
    denied(
        decide(&web, &n, i64::MIN, None),
        DenialKind::InvalidArgument,
        "policy.ttl",
    );
}
