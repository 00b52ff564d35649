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
