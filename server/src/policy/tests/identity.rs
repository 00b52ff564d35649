//! Which identity each caller gets: its own, on behalf of another, the operator's choice;
//! and Signet's reserved identities and names.

use super::*;

// ---- identity ----

#[test]
fn caller_gets_its_own_id_with_empty_or_matching_uri() {
    let web = sa("default", "web");
    let g = decide(&web, &names(&[], &[]), 0, None).expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/default/sa/web"));
    assert!(g.dns_names.is_empty() && g.ip_addresses.is_empty());
    // Same ID; scheme and trust domain compare case-insensitively.
    for uri in [
        "spiffe://example.org/ns/default/sa/web",
        "SPIFFE://EXAMPLE.org/ns/default/sa/web",
    ] {
        let g = decide(&web, &names(&[uri], &[]), 0, None).expect(uri);
        assert_eq!(g.spiffe_id, id("/ns/default/sa/web"));
    }
    let m = mtls("/agent/node-1", &[]);
    let g = decide(
        &m,
        &names(&["spiffe://example.org/agent/node-1"], &[]),
        0,
        None,
    )
    .expect("ok");
    assert_eq!(g.spiffe_id, id("/agent/node-1"));
}

#[test]
fn caller_may_not_obtain_another_id() {
    let web = sa("a", "b");
    let msg = denied(
        decide(
            &web,
            &names(&["spiffe://example.org/ns/x/sa/y"], &[]),
            0,
            None,
        ),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    assert_eq!(
        msg,
        "caller spiffe://example.org/ns/a/sa/b may not obtain spiffe://example.org/ns/x/sa/y"
    );
    // The path compares case-sensitively.
    denied(
        decide(
            &web,
            &names(&["spiffe://example.org/ns/A/sa/b"], &[]),
            0,
            None,
        ),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    // Not a SPIFFE ID at all.
    let msg = denied(
        decide(&web, &names(&["https://example.org/"], &[]), 0, None),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    assert!(msg.contains("https://example.org/"), "{msg}");
    // mTLS callers too.
    denied(
        decide(
            &mtls("/agent/node-1", &[]),
            &names(&["spiffe://example.org/agent/node-2"], &[]),
            0,
            None,
        ),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
}

#[test]
fn more_than_one_uri_is_refused() {
    let web = sa("default", "web");
    let own = "spiffe://example.org/ns/default/sa/web";
    let m = denied(
        decide(&web, &names(&[own, own], &[]), 0, None),
        DenialKind::InvalidArgument,
        "policy.uri_count",
    );
    assert!(m.contains("exactly one"), "{m}");
    denied(
        decide(
            &admin(),
            &names(&[own, "spiffe://example.org/x"], &[]),
            0,
            None,
        ),
        DenialKind::InvalidArgument,
        "policy.uri_count",
    );
}

#[test]
fn foreign_trust_domain_is_refused() {
    // A caller whose own ID is outside the trust domain (cannot come from our
    // authenticators, but policy does not rely on that).
    let foreign = AuthenticatedCaller::for_tests(
        "spiffe://other.org/ns/a/sa/b".parse().expect("id"),
        CallerKind::Mtls {
            dns_names: vec![],
            serial: "01".into(),
            leaf_sha256: [7; 32],
        },
    );
    let m = denied(
        decide(&foreign, &names(&[], &[]), 0, None),
        DenialKind::PermissionDenied,
        "policy.trust_domain",
    );
    assert!(m.contains("outside trust domain example.org"), "{m}");
    denied(
        decide(&admin(), &names(&["spiffe://other.org/web"], &[]), 0, None),
        DenialKind::PermissionDenied,
        "policy.trust_domain",
    );
}

// ---- impersonation ----

#[test]
fn impersonator_may_ask_on_behalf_of_an_id() {
    let ztunnel = sa("istio-system", "ztunnel");
    let target = "spiffe://example.org/ns/default/sa/web";
    let g = decide(&ztunnel, &names(&[], &[]), 0, Some(target)).expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/default/sa/web"));
    let g = decide(&ztunnel, &names(&[target], &[]), 0, Some(target)).expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/default/sa/web"));
    // An empty ImpersonatedIdentity is no impersonation.
    let g = decide(&ztunnel, &names(&[], &[]), 0, Some("")).expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/istio-system/sa/ztunnel"));
}

#[test]
fn impersonation_is_refused_unless_allowed() {
    let target = "spiffe://example.org/ns/default/sa/web";
    let m = denied(
        decide(&sa("default", "other"), &names(&[], &[]), 0, Some(target)),
        DenialKind::PermissionDenied,
        "policy.impersonation",
    );
    assert!(m.contains("not in policy.impersonators"), "{m}");
    let ztunnel = sa("istio-system", "ztunnel");
    denied(
        decide(
            &ztunnel,
            &names(&[], &[]),
            0,
            Some("spiffe://other.org/ns/a/sa/b"),
        ),
        DenialKind::PermissionDenied,
        "policy.trust_domain",
    );
    denied(
        decide(&ztunnel, &names(&[], &[]), 0, Some("not an id")),
        DenialKind::InvalidArgument,
        "policy.impersonation",
    );
    denied(
        decide(&ztunnel, &names(&[], &[]), 0, Some("spiffe://example.org")),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    // The CSR's URI must be the impersonated ID.
    let m = denied(
        decide(
            &ztunnel,
            &names(&["spiffe://example.org/ns/default/sa/db"], &[]),
            0,
            Some(target),
        ),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    assert!(
        m.contains("on behalf of spiffe://example.org/ns/default/sa/web"),
        "{m}"
    );
    // No DNS names on behalf of someone else.
    denied(
        decide(&ztunnel, &names(&[], &["web.default.svc"]), 0, Some(target)),
        DenialKind::PermissionDenied,
        "policy.dns_name",
    );
}

// ---- admin ----

#[test]
fn admin_may_obtain_any_id_in_the_trust_domain() {
    let n = RequestedNames {
        uris: vec!["spiffe://example.org/ns/web/sa/frontend".into()],
        dns_names: vec!["web.example.org".into(), "*.internal.example.org".into()],
        ip_addresses: vec![
            Ipv4Addr::new(10, 1, 2, 3).into(),
            "fd00::1".parse().expect("ip"),
        ],
        ..RequestedNames::default()
    };
    let g = decide(&admin(), &n, 0, None).expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/web/sa/frontend"));
    assert_eq!(g.dns_names, n.dns_names);
    assert_eq!(g.ip_addresses, n.ip_addresses);
    assert_eq!(g.provenance, Provenance::new(Source::Admin, NOW));
}

#[test]
fn no_one_but_signet_gets_signets_identities_and_names() {
    // The operator may not mint Signet's own identities...
    for path in [
        "/signet/server",
        "/signet/node/n1",
        "/signet/admin",
        "/signet",
    ] {
        let m = denied(
            decide(
                &admin(),
                &names(&[&format!("spiffe://example.org{path}")], &[]),
                0,
                None,
            ),
            DenialKind::PermissionDenied,
            "policy.reserved",
        );
        assert!(m.contains("reserved"), "{m}");
    }
    // ... nor the server's names or addresses, nor a wildcard that covers one.
    for dns in [
        "localhost",
        "SIGNET.example.com",
        "*.example.com",
        "*.signet-system.svc",
    ] {
        let m = denied(
            decide(
                &admin(),
                &names(&["spiffe://example.org/web"], &[dns]),
                0,
                None,
            ),
            DenialKind::PermissionDenied,
            "policy.reserved",
        );
        assert!(m.contains("the CA server's own name"), "{dns}: {m}");
    }
    for ip in [Ipv4Addr::LOCALHOST.into(), "::1".parse().expect("ip")] {
        let mut n = names(&["spiffe://example.org/web"], &[]);
        n.ip_addresses = vec![ip];
        denied(
            decide(&admin(), &n, 0, None),
            DenialKind::PermissionDenied,
            "policy.reserved",
        );
    }
    // A name next to a reserved one is fine.
    decide(
        &admin(),
        &names(
            &["spiffe://example.org/web"],
            &["other.example.com", "*.x.example.com"],
        ),
        0,
        None,
    )
    .expect("not reserved");
    // The server itself gets exactly its own identity, with its names and addresses.
    let mut n = names(
        &["spiffe://example.org/signet/server"],
        &["localhost", "signet.example.com"],
    );
    n.ip_addresses = vec![Ipv4Addr::LOCALHOST.into()];
    let g = decide(&server(), &n, 0, None).expect("own");
    assert_eq!(g.spiffe_id, id("/signet/server"));
    assert_eq!(g.provenance.source, Source::Server);
    denied(
        decide(
            &server(),
            &names(&["spiffe://example.org/web"], &[]),
            0,
            None,
        ),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    // A node's entry may not carry the server's name either.
    let mut e = entry("n1", 0);
    e.dns_names = vec!["signet.example.com".into()];
    let m = denied(
        decide_src(
            &node("n1"),
            &names(&[], &["signet.example.com"]),
            GrantSource::Entry(&e),
            None,
        ),
        DenialKind::PermissionDenied,
        "policy.reserved",
    );
    assert!(m.contains("signet.example.com"), "{m}");
    // Nor a bridge's template for the server's own namespace.
    let ask = |dns: &str| {
        let n = names(&["spiffe://example.org/ns/signet-system/sa/x"], &[dns]);
        policy().decide(
            &sa("signet-system", "signet-k8s"),
            &IssueRequest {
                source: GrantSource::Bridge {
                    namespace: "signet-system",
                },
                names: &n,
                ttl_seconds: 0,
                impersonate: None,
                renewal: None,
            },
            NOW,
        )
    };
    assert_eq!(
        ask("signet.signet-system.svc")
            .expect_err("the server's")
            .reason,
        "policy.reserved"
    );
    ask("web.signet-system.svc").expect("another name in that namespace");
}

#[test]
fn admin_must_name_one_valid_id() {
    denied(
        decide(&admin(), &names(&[], &[]), 0, None),
        DenialKind::InvalidArgument,
        "policy.identity",
    );
    denied(
        decide(
            &admin(),
            &names(&["spiffe://example.org/a//b"], &[]),
            0,
            None,
        ),
        DenialKind::InvalidArgument,
        "policy.identity",
    );
    denied(
        decide(&admin(), &names(&["spiffe://example.org"], &[]), 0, None),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    denied(
        decide(
            &admin(),
            &names(&["spiffe://example.org/x"], &["bad_name.example"]),
            0,
            None,
        ),
        DenialKind::InvalidArgument,
        "policy.dns_name",
    );
}

// ---- impersonation yields only ordinary workloads ----

#[test]
fn impersonation_never_reaches_privileged_identities() {
    let ztunnel = sa("istio-system", "ztunnel");
    for target in [
        "spiffe://example.org/signet/node/n1",
        "spiffe://example.org/signet/server",
        "spiffe://example.org/signet/admin",
        // a configured bridge, and the impersonator itself
        "spiffe://example.org/ns/signet-system/sa/signet-k8s",
        "spiffe://example.org/ns/istio-system/sa/ztunnel",
        // not a workload's service-account identity
        "spiffe://example.org/bridge",
        "spiffe://example.org/web",
        "spiffe://example.org/ns/a/sa/b/extra",
        "spiffe://example.org/ns/A/sa/b",
        "spiffe://example.org/ns/a",
    ] {
        let r = decide(&ztunnel, &names(&[], &[]), 0, Some(target));
        let d = r.expect_err(target);
        assert!(
            matches!(d.reason, "policy.impersonation" | "policy.identity"),
            "{target}: {d:?}"
        );
        assert_eq!(d.kind, DenialKind::PermissionDenied, "{target}: {d:?}");
    }
    // An ordinary workload still works, without names, recorded as impersonated.
    let g = decide(
        &ztunnel,
        &names(&[], &[]),
        0,
        Some("spiffe://example.org/ns/default/sa/web.v2"),
    )
    .expect("ordinary workload");
    assert_eq!(g.spiffe_id, id("/ns/default/sa/web.v2"));
    assert!(g.dns_names.is_empty());
    assert_eq!(
        g.provenance.source,
        Source::Impersonated {
            impersonator: "spiffe://example.org/ns/istio-system/sa/ztunnel".into()
        }
    );
}

#[test]
fn impersonators_must_be_workloads_and_not_bridges() {
    let cfg = PolicyConfig {
        impersonators: vec!["spiffe://example.org/signet/node/n1".into()],
        ..PolicyConfig::default()
    };
    let e = Policy::new(td(), HOUR, HOUR, &cfg)
        .expect_err("signet")
        .to_string();
    assert!(e.contains("one of Signet's own identities"), "{e}");
    let both = "spiffe://example.org/ns/istio-system/sa/ztunnel";
    let cfg = PolicyConfig {
        impersonators: vec![both.into()],
        kubernetes_bridge: KubernetesBridgeConfig {
            callers: vec![both.into()],
            ..KubernetesBridgeConfig::default()
        },
        ..PolicyConfig::default()
    };
    let e = Policy::new(td(), HOUR, HOUR, &cfg)
        .expect_err("both")
        .to_string();
    assert!(e.contains("in both policy.impersonators"), "{e}");
}
