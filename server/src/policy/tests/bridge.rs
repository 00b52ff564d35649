//! The Kubernetes bridge: identities and names of the object's namespace only.

use super::*;

#[test]
fn bridge_gets_ids_and_names_of_the_objects_namespace() {
    let g = decide_bridge(
        &bridge(),
        "a",
        &["spiffe://example.org/ns/a/sa/web"],
        &[
            "web.a.svc",
            "x.y.a.svc",
            "web.a.svc.cluster.local",
            "WEB.A.SVC.Cluster.Local",
        ],
    )
    .expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/a/sa/web"));
    assert_eq!(g.dns_names.len(), 4);
    // Any path below the namespace, not only service accounts.
    let g = decide_bridge(&bridge(), "a", &["spiffe://example.org/ns/a/x/y/z"], &[]).expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/a/x/y/z"));
    // A bridge presenting a Signet certificate over mTLS works the same way.
    let g = decide_bridge(
        &mtls("/bridge", &[]),
        "kube-system",
        &["spiffe://example.org/ns/kube-system/sa/dns"],
        &["dns.kube-system.svc"],
    )
    .expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/kube-system/sa/dns"));
    // TTL is clamped as for anyone.
    let n = names(&["spiffe://example.org/ns/a/sa/web"], &[]);
    let g = policy()
        .decide(
            &bridge(),
            &IssueRequest {
                source: GrantSource::Bridge { namespace: "a" },
                names: &n,
                ttl_seconds: 7 * 86400,
                impersonate: None,
                renewal: test_basis(&bridge()).as_ref(),
            },
            NOW,
        )
        .expect("ok");
    assert_eq!(g.ttl, 24 * HOUR);
}

#[test]
fn bridge_is_refused_other_namespaces_ids() {
    let m = denied(
        decide_bridge(&bridge(), "a", &["spiffe://example.org/ns/b/sa/x"], &[]),
        DenialKind::PermissionDenied,
        "policy.bridge_namespace",
    );
    assert_eq!(
        m,
        "a certificate for an object in namespace a may only carry a SPIFFE ID under \
         spiffe://example.org/ns/a/; the CSR asks for spiffe://example.org/ns/b/sa/x"
    );
    for uri in [
        "spiffe://example.org/ns/a",       // the namespace itself, nothing below
        "spiffe://example.org/ns/ab/sa/x", // a namespace that merely starts with "a"
        "spiffe://example.org/ns/A/sa/x",  // paths compare case-sensitively
        "spiffe://example.org/a/sa/x",     // not under /ns/
        "spiffe://example.org/signet/node/n", // Signet's own IDs
        "spiffe://example.org/ns/signet-system/sa/signet-k8s", // the bridge's own ID
    ] {
        let m = denied(
            decide_bridge(&bridge(), "a", &[uri], &[]),
            DenialKind::PermissionDenied,
            "policy.bridge_namespace",
        );
        assert!(m.contains(uri), "{m}");
    }
    let m = denied(
        decide_bridge(&bridge(), "a", &["spiffe://other.org/ns/a/sa/x"], &[]),
        DenialKind::PermissionDenied,
        "policy.trust_domain",
    );
    assert!(m.contains("outside trust domain example.org"), "{m}");
    // The CSR must name exactly one ID.
    denied(
        decide_bridge(&bridge(), "a", &[], &["web.a.svc"]),
        DenialKind::InvalidArgument,
        "policy.identity",
    );
    denied(
        decide_bridge(
            &bridge(),
            "a",
            &[
                "spiffe://example.org/ns/a/sa/x",
                "spiffe://example.org/ns/a/sa/y",
            ],
            &[],
        ),
        DenialKind::InvalidArgument,
        "policy.uri_count",
    );
    denied(
        decide_bridge(&bridge(), "a", &["https://example.org/ns/a/sa/x"], &[]),
        DenialKind::InvalidArgument,
        "policy.identity",
    );
}

#[test]
fn bridge_is_refused_other_namespaces_names() {
    let own = "spiffe://example.org/ns/b/sa/x";
    for name in [
        "web.a.svc",              // another namespace
        "x.ab.svc",               // "ab.svc" is not under "b.svc"
        "x.ab.svc.cluster.local", // nor here
        "b.svc",                  // the wildcard needs at least one label
        "b.svc.cluster.local",
        "*.b.svc", // a wildcard is not a concrete label
        "web.b.svc.example.com",
        "example.com",
    ] {
        let m = denied(
            decide_bridge(&bridge(), "b", &[own], &[name]),
            DenialKind::PermissionDenied,
            "policy.dns_name",
        );
        assert!(m.contains(name), "{m}");
        assert!(
            m.contains("allowed patterns: *.b.svc, *.b.svc.cluster.local"),
            "{m}"
        );
    }
    denied(
        decide_bridge(&bridge(), "b", &[own], &["bad_name.b.svc"]),
        DenialKind::InvalidArgument,
        "policy.dns_name",
    );
    // IPs and e-mails as for anyone but the operator.
    let mut n = names(&[own], &[]);
    n.ip_addresses = vec![Ipv4Addr::new(10, 0, 0, 1).into()];
    let r = decide_src(&bridge(), &n, GrantSource::Bridge { namespace: "b" }, None);
    denied(r, DenialKind::PermissionDenied, "policy.ip_address");
    let mut n = names(&[own], &[]);
    n.emails = vec!["x@example.org".into()];
    let r = decide_src(&bridge(), &n, GrantSource::Bridge { namespace: "b" }, None);
    denied(r, DenialKind::PermissionDenied, "policy.san_type");
}

#[test]
fn only_listed_callers_act_as_the_bridge() {
    let uri = "spiffe://example.org/ns/a/sa/web";
    for caller in [
        sa("a", "web"),
        sa("signet-system", "other"),
        mtls("/bridge/x", &[]),
        node("n1"),
        admin(),
    ] {
        let m = denied(
            decide_bridge(&caller, "a", &[uri], &[]),
            DenialKind::PermissionDenied,
            "policy.bridge",
        );
        assert!(
            m.starts_with(&format!(
                "caller {} is not a Kubernetes bridge;",
                caller.spiffe_id()
            )),
            "{m}"
        );
    }
    // Even with a malformed namespace, a stranger learns only that it is no bridge.
    denied(
        decide_bridge(&sa("a", "web"), "Not_A_Namespace", &[uri], &[]),
        DenialKind::PermissionDenied,
        "policy.bridge",
    );
    // A bridge asking without a namespace is an ordinary caller: its own identity.
    let g = decide(&bridge(), &names(&[], &[]), 0, None).expect("ok");
    assert_eq!(g.spiffe_id, id("/ns/signet-system/sa/signet-k8s"));
    denied(
        decide(&bridge(), &names(&[uri], &[]), 0, None),
        DenialKind::PermissionDenied,
        "policy.identity",
    );
    // No impersonation through the bridge.
    let r = decide_src(
        &bridge(),
        &names(&[uri], &[]),
        GrantSource::Bridge { namespace: "a" },
        Some(uri),
    );
    denied(r, DenialKind::PermissionDenied, "policy.impersonation");
}

#[test]
fn bridge_namespace_must_be_a_dns_label() {
    for ns in [
        "A",
        "a_b",
        "-a",
        "a-",
        "a.b",
        "a/b",
        &"a".repeat(64),
        "a\nb",
        " a",
    ] {
        let m = denied(
            decide_bridge(&bridge(), ns, &["spiffe://example.org/ns/a/sa/x"], &[]),
            DenialKind::InvalidArgument,
            "policy.bridge_namespace",
        );
        assert!(m.contains("DNS-1123 label"), "{m}");
    }
    decide_bridge(
        &bridge(),
        &"a".repeat(63),
        &[&format!("spiffe://example.org/ns/{}/sa/x", "a".repeat(63))],
        &[],
    )
    .expect("63 characters is fine");
}

#[test]
fn bridge_feature_is_off_by_default_and_templates_are_checked() {
    let bare = Policy::new(td(), HOUR, 24 * HOUR, &PolicyConfig::default()).expect("policy");
    let n = names(&["spiffe://example.org/ns/a/sa/x"], &[]);
    let d = bare
        .decide(
            &bridge(),
            &IssueRequest {
                source: GrantSource::Bridge { namespace: "a" },
                names: &n,
                ttl_seconds: 0,
                impersonate: None,
                renewal: test_basis(&bridge()).as_ref(),
            },
            NOW,
        )
        .expect_err("off");
    assert_eq!(d.reason, "policy.bridge");
    // An exact template is an exact name.
    let cfg = PolicyConfig {
        kubernetes_bridge: KubernetesBridgeConfig {
            callers: vec!["spiffe://example.org/ns/signet-system/sa/signet-k8s".into()],
            dns_templates: vec!["gw.{namespace}.example.com".into()],
            ..KubernetesBridgeConfig::default()
        },
        ..PolicyConfig::default()
    };
    let p = Policy::new(td(), HOUR, 24 * HOUR, &cfg).expect("policy");
    let ask = |dns: &str| {
        let n = names(&["spiffe://example.org/ns/a/sa/x"], &[dns]);
        p.decide(
            &bridge(),
            &IssueRequest {
                source: GrantSource::Bridge { namespace: "a" },
                names: &n,
                ttl_seconds: 0,
                impersonate: None,
                renewal: test_basis(&bridge()).as_ref(),
            },
            NOW,
        )
    };
    ask("gw.a.example.com").expect("exact");
    assert_eq!(
        ask("x.gw.a.example.com").expect_err("exact only").reason,
        "policy.dns_name"
    );
    for (t, want) in [
        ("*.{serviceaccount}.svc", "unknown placeholder"),
        ("web.*.svc", "'*'"),
        ("*.svc", "{namespace}"),
        ("bad_name.{namespace}", "valid DNS name"),
    ] {
        let cfg = PolicyConfig {
            kubernetes_bridge: KubernetesBridgeConfig {
                callers: vec![],
                dns_templates: vec![t.into()],
                ..KubernetesBridgeConfig::default()
            },
            ..PolicyConfig::default()
        };
        let e = Policy::new(td(), HOUR, HOUR, &cfg)
            .expect_err(t)
            .to_string();
        assert!(
            e.contains("policy.kubernetes_bridge.dns_templates") && e.contains(want),
            "{t}: {e}"
        );
    }
    for (c, want) in [
        ("signet-k8s", "not a SPIFFE ID"),
        ("spiffe://other.org/ns/a/sa/b", "not in trust domain"),
        ("spiffe://example.org", "not a workload ID"),
        ("spiffe://example.org/signet/node/n1", "not a workload ID"),
    ] {
        let cfg = PolicyConfig {
            kubernetes_bridge: KubernetesBridgeConfig {
                callers: vec![c.into()],
                ..KubernetesBridgeConfig::default()
            },
            ..PolicyConfig::default()
        };
        let e = Policy::new(td(), HOUR, HOUR, &cfg)
            .expect_err(c)
            .to_string();
        assert!(
            e.contains("policy.kubernetes_bridge.callers") && e.contains(want),
            "{c}: {e}"
        );
    }
}
