//! DNS names, IP addresses and other SAN types, and the chain's order as a whole.

use super::*;

// ---- DNS names ----

#[test]
fn service_account_gets_its_template_names() {
    let web = sa("default", "web");
    let n = names(
        &[],
        &[
            "web.default.svc",
            "WEB.Default.SVC",
            "api.default.svc.cluster.local",
        ],
    );
    let g = decide(&web, &n, 0, None).expect("ok");
    assert_eq!(g.dns_names, n.dns_names);
}

#[test]
fn service_account_is_refused_other_names() {
    let web = sa("default", "web");
    for name in [
        "db.default.svc",                // another account's name
        "web.kube-system.svc",           // another namespace
        "a.b.default.svc.cluster.local", // '*.' matches exactly one label
        "default.svc.cluster.local",     // and not zero
        "*.default.svc.cluster.local",   // a wildcard is not a label
        "example.com",
    ] {
        let m = denied(
            decide(&web, &names(&[], &[name]), 0, None),
            DenialKind::PermissionDenied,
            "policy.dns_name",
        );
        assert!(m.contains(name), "{m}");
        assert!(
            m.contains("allowed: web.default.svc, *.default.svc.cluster.local"),
            "{m}"
        );
    }
    for name in [
        "",
        "web..default.svc",
        "web.default.svc.",
        "-a.default.svc",
        "10.0.0.1",
    ] {
        denied(
            decide(&web, &names(&[], &[name]), 0, None),
            DenialKind::InvalidArgument,
            "policy.dns_name",
        );
    }
    // Without templates, no names at all.
    let bare = Policy::new(td(), HOUR, 24 * HOUR, &PolicyConfig::default()).expect("policy");
    let n = names(&[], &["web.default.svc"]);
    let d = bare
        .decide(
            &web,
            &IssueRequest {
                source: GrantSource::Caller,
                names: &n,
                ttl_seconds: 0,
                impersonate: None,
                renewal: test_basis(&web).as_ref(),
            },
            NOW,
        )
        .expect_err("denied");
    assert!(
        d.message.contains("kubernetes_dns_templates is empty"),
        "{d}"
    );
}

#[test]
fn mtls_caller_renews_only_its_presented_names() {
    let m = mtls("/agent/node-1", &["node-1.example.org", "node-1.internal"]);
    let g = decide(&m, &names(&[], &["NODE-1.example.org"]), 0, None).expect("ok");
    assert_eq!(g.dns_names, ["NODE-1.example.org"]);
    let msg = denied(
        decide(&m, &names(&[], &["node-2.example.org"]), 0, None),
        DenialKind::PermissionDenied,
        "policy.dns_name",
    );
    assert!(msg.contains("node-2.example.org"), "{msg}");
    assert!(msg.contains("node-1.example.org, node-1.internal"), "{msg}");
}

// ---- IPs, e-mails, other SAN types ----

#[test]
fn ip_addresses_only_for_admin() {
    let mut n = names(&[], &[]);
    n.ip_addresses = vec![Ipv4Addr::new(10, 0, 0, 1).into()];
    for caller in [sa("default", "web"), mtls("/agent/node-1", &[])] {
        let m = denied(
            decide(&caller, &n, 0, None),
            DenialKind::PermissionDenied,
            "policy.ip_address",
        );
        assert!(m.contains("10.0.0.1"), "{m}");
    }
    n.uris = vec!["spiffe://example.org/x".into()];
    decide(&admin(), &n, 0, None).expect("admin");
}

#[test]
fn emails_and_other_san_types_are_never_issued() {
    let mut n = names(&["spiffe://example.org/x"], &[]);
    n.emails = vec!["ops@example.org".into()];
    let m = denied(
        decide(&admin(), &n, 0, None),
        DenialKind::PermissionDenied,
        "policy.san_type",
    );
    assert!(m.contains("ops@example.org"), "{m}");
    let mut n = names(&[], &[]);
    n.other = vec!["otherName".into()];
    let m = denied(
        decide(&sa("default", "web"), &n, 0, None),
        DenialKind::PermissionDenied,
        "policy.san_type",
    );
    assert!(m.contains("otherName"), "{m}");
}

// ---- the chain as a whole ----

#[test]
fn chain_reports_the_first_failing_check() {
    let web = sa("a", "b");
    let mut n = names(&["spiffe://example.org/ns/x/sa/y"], &["evil.example.com"]);
    n.ip_addresses = vec![Ipv4Addr::new(10, 0, 0, 1).into()];
    n.emails = vec!["x@example.org".into()];
    // Bad TTL comes first.
    denied(
        decide(&web, &n, -5, None),
        DenialKind::InvalidArgument,
        "policy.ttl",
    );
    // Then the e-mail (SAN types).
    denied(
        decide(&web, &n, 0, None),
        DenialKind::PermissionDenied,
        "policy.san_type",
    );
    n.emails.clear();
    // Then the foreign URI.
    denied(
        decide(&web, &n, 0, None),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    n.uris.clear();
    // Then DNS, then IP.
    denied(
        decide(&web, &n, 0, None),
        DenialKind::PermissionDenied,
        "policy.dns_name",
    );
    n.dns_names.clear();
    denied(
        decide(&web, &n, 0, None),
        DenialKind::PermissionDenied,
        "policy.ip_address",
    );
    n.ip_addresses.clear();
    decide(&web, &n, 0, None).expect("all clear");
    // Two URIs is reported before the identity check would look at either.
    let n = names(
        &["spiffe://example.org/ns/a/sa/b", "spiffe://other.org/z"],
        &[],
    );
    denied(
        decide(&web, &n, 0, None),
        DenialKind::InvalidArgument,
        "policy.uri_count",
    );
    assert_eq!(
        CHAIN.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        [
            "source",
            "renewal",
            "ttl",
            "single_uri",
            "san_types",
            "identity",
            "dns_names",
            "ip_addresses",
            "reserved"
        ]
    );
}
