//! Planning, including the attacks: another namespace's ID, another tenant's DNS name, a path
//! escaping with `..` or `%2e`, a TTL above the cap, a quota overflow, a ClusterIdentity
//! template without `{namespace}` over several namespaces.

use serde_json::json;

use super::*;
use crate::identity::crd::{ClusterIdentitySpec, IdentitySpec};
use crate::identity::tenant::Tenancy;
use crate::identity::tenant::tests::signet_tenant;

fn env() -> Env {
    Env {
        trust_domain: TrustDomain::new("example.org").unwrap(),
        node_set: NodeSetName::new("k8s").unwrap(),
        without_tenant: false,
    }
}

fn ns(name: &str, labels: &[(&str, &str)]) -> NamespaceInfo {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    l.insert(NAMESPACE_NAME_LABEL.into(), name.into());
    NamespaceInfo {
        name: name.into(),
        labels: l,
        owners: vec![],
    }
}

fn pod(ns: &str, sa: &str, labels: &[(&str, &str)]) -> Workload {
    Workload {
        namespace: ns.into(),
        service_account: sa.into(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn cluster(spec: serde_json::Value) -> ClusterIdentitySpec {
    serde_json::from_value(spec).unwrap()
}

fn identity(spec: serde_json::Value) -> IdentitySpec {
    serde_json::from_value(spec).unwrap()
}

fn reasons(p: &Plan) -> Vec<&'static str> {
    p.refusals.iter().map(|r| r.reason).collect()
}

fn ids(p: &Plan) -> Vec<&str> {
    p.entries.iter().map(|e| e.spiffe_id.as_str()).collect()
}

fn bounds(spec: serde_json::Value) -> Bounds {
    Bounds::of(&signet_tenant("team-a", spec)).unwrap()
}

#[test]
fn render_knows_three_variables() {
    assert_eq!(
        render(
            "spiffe://{trustDomain}/ns/{namespace}/sa/{serviceAccount}",
            "td",
            "n",
            "s"
        )
        .unwrap(),
        "spiffe://td/ns/n/sa/s"
    );
    assert!(
        render("{nope}", "", "", "")
            .unwrap_err()
            .contains("unknown variable")
    );
    assert!(render("{namespace", "", "", "").is_err());
    assert!(render("x}", "", "", "").is_err());
}

#[test]
fn a_cluster_identity_makes_one_entry_per_namespace_and_service_account() {
    let spec = cluster(json!({
        "namespaceSelector": {"matchLabels": {"mesh": "on"}},
        "podSelector": {"matchLabels": {"app": "web"}},
        "dnsNameTemplates": ["{serviceAccount}.{namespace}.svc"],
        "ttl": "1h", "jwtTtl": "5m", "federatesWith": ["Partner.example", "partner.example"]
    }));
    let nss = [
        ns("a", &[("mesh", "on")]),
        ns("b", &[("mesh", "on")]),
        ns("c", &[]),
    ];
    let pods = [
        pod("a", "web", &[("app", "web"), ("pod-template-hash", "1")]),
        pod("a", "web", &[("app", "web"), ("pod-template-hash", "2")]),
        pod("b", "web", &[("app", "web")]),
        pod("b", "api", &[("app", "api")]),
        pod("c", "web", &[("app", "web")]),
    ];
    let p = plan_cluster_identity(&spec, &env(), &nss, &pods);
    assert_eq!(p.refusals, []);
    assert_eq!(
        p.entries,
        [
            OwnedEntry {
                spiffe_id: "spiffe://example.org/ns/a/sa/web".into(),
                node_set: "k8s".into(),
                selectors: vec![
                    "k8s:ns:a".into(),
                    "k8s:pod-label:app:web".into(),
                    "k8s:sa:web".into()
                ],
                ttl_seconds: 3600,
                dns_names: vec!["web.a.svc".into()],
                jwt_ttl_seconds: 300,
                federates_with: vec!["partner.example".into()],
            },
            OwnedEntry {
                spiffe_id: "spiffe://example.org/ns/b/sa/web".into(),
                node_set: "k8s".into(),
                selectors: vec![
                    "k8s:ns:b".into(),
                    "k8s:pod-label:app:web".into(),
                    "k8s:sa:web".into()
                ],
                ttl_seconds: 3600,
                dns_names: vec!["web.b.svc".into()],
                jwt_ttl_seconds: 300,
                federates_with: vec!["partner.example".into()],
            },
        ]
    );
}

#[test]
fn a_cluster_identity_defaults() {
    let p = plan_cluster_identity(
        &ClusterIdentitySpec::default(),
        &env(),
        &[ns("a", &[])],
        &[pod("a", "default", &[])],
    );
    assert_eq!(ids(&p), ["spiffe://example.org/ns/a/sa/default"]);
    assert_eq!(p.entries[0].selectors, ["k8s:ns:a", "k8s:sa:default"]);
    assert_eq!(
        (p.entries[0].ttl_seconds, p.entries[0].jwt_ttl_seconds),
        (0, 0)
    );
    // Another node set by name.
    let p = plan_cluster_identity(
        &cluster(json!({"nodeSet": "gpu"})),
        &env(),
        &[ns("a", &[])],
        &[pod("a", "default", &[])],
    );
    assert_eq!(p.entries[0].node_set, "gpu");
    let p = plan_cluster_identity(&cluster(json!({"nodeSet": "GPU nodes"})), &env(), &[], &[]);
    assert_eq!(reasons(&p), [REASON_INVALID_SPEC]);
}

/// Review finding F3: `/platform/{namespace}-{serviceAccount}` gave namespace x (account
/// y-z) and namespace x-y (account z) the same ID. Variables fill whole segments and labels.
#[test]
fn variables_fill_whole_segments_so_two_namespaces_never_share_a_name() {
    let nss = [ns("x", &[("mesh", "on")]), ns("x-y", &[("mesh", "on")])];
    let pods = [pod("x", "y-z", &[]), pod("x-y", "z", &[])];
    for fields in [
        json!({"spiffeIdTemplate": "spiffe://{trustDomain}/platform/{namespace}-{serviceAccount}"}),
        json!({"spiffeIdTemplate": "spiffe://{trustDomain}/ns/{namespace}/sa-{serviceAccount}"}),
        json!({"dnsNameTemplates": ["{namespace}-{serviceAccount}.svc"]}),
    ] {
        let mut spec = fields.clone();
        spec["namespaceSelector"] = json!({"matchLabels": {"mesh": "on"}});
        let p = plan_cluster_identity(&cluster(spec), &env(), &nss, &pods);
        assert_eq!(reasons(&p), [REASON_INVALID_SPEC], "{fields}");
        assert!(p.entries.is_empty(), "{fields}");
        assert!(
            p.refusals[0].message.contains("must each be a whole"),
            "{}",
            p.refusals[0].message
        );
    }
    // The control: whole segments give two distinct IDs.
    let spec = cluster(json!({
        "spiffeIdTemplate": "spiffe://{trustDomain}/platform/{namespace}/{serviceAccount}",
        "namespaceSelector": {"matchLabels": {"mesh": "on"}}
    }));
    let p = plan_cluster_identity(&spec, &env(), &nss, &pods);
    assert_eq!(
        ids(&p),
        [
            "spiffe://example.org/platform/x-y/z",
            "spiffe://example.org/platform/x/y-z"
        ]
    );
}

#[test]
fn a_template_without_namespace_over_several_namespaces_is_refused() {
    let spec = cluster(json!({
        "spiffeIdTemplate": "spiffe://{trustDomain}/sa/{serviceAccount}",
        "namespaceSelector": {"matchLabels": {"mesh": "on"}}
    }));
    let nss = [ns("a", &[("mesh", "on")]), ns("b", &[("mesh", "on")])];
    let pods = [pod("a", "web", &[]), pod("b", "web", &[])];
    let p = plan_cluster_identity(&spec, &env(), &nss, &pods);
    assert_eq!(reasons(&p), [REASON_NAMESPACE_COLLISION]);
    assert!(p.entries.is_empty());
    // Even when only one namespace matches today: the selector could match more tomorrow.
    let p = plan_cluster_identity(&spec, &env(), &nss[..1], &pods[..1]);
    assert_eq!(reasons(&p), [REASON_NAMESPACE_COLLISION]);
    // A DNS template without {namespace} too.
    let p = plan_cluster_identity(
        &cluster(json!({"dnsNameTemplates": ["{serviceAccount}.example.com"]})),
        &env(),
        &nss,
        &pods,
    );
    assert_eq!(reasons(&p), [REASON_NAMESPACE_COLLISION]);
    // One namespace by its name label: allowed (matchLabels or In with one value).
    for sel in [
        json!({"matchLabels": {"kubernetes.io/metadata.name": "a"}}),
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a"]}]}),
    ] {
        let spec = cluster(json!({
            "spiffeIdTemplate": "spiffe://{trustDomain}/sa/{serviceAccount}",
            "namespaceSelector": sel
        }));
        let p = plan_cluster_identity(&spec, &env(), &nss, &pods);
        assert_eq!(ids(&p), ["spiffe://example.org/sa/web"], "{sel}");
    }
    // In with two values is two namespaces.
    let spec = cluster(json!({
        "spiffeIdTemplate": "spiffe://{trustDomain}/sa/{serviceAccount}",
        "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}]}
    }));
    assert_eq!(
        reasons(&plan_cluster_identity(&spec, &env(), &nss, &pods)),
        [REASON_NAMESPACE_COLLISION]
    );
}

#[test]
fn cluster_identity_templates_are_checked() {
    for (spec, want) in [
        (
            json!({"spiffeIdTemplate": "spiffe://other.org/ns/{namespace}/sa/{serviceAccount}"}),
            "trust domain",
        ),
        (
            json!({"spiffeIdTemplate": "spiffe://{trustDomain}/signet/{namespace}/{serviceAccount}"}),
            "Signet's own",
        ),
        (
            json!({"spiffeIdTemplate": "spiffe://{trustDomain}/ns/{namespace}/../{serviceAccount}"}),
            "'.' or '..'",
        ),
        (
            json!({"spiffeIdTemplate": "spiffe://{trustDomain}/{ns}"}),
            "unknown variable",
        ),
        (
            json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}),
            "matchExpressions",
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}),
            "unknown operator",
        ),
        (json!({"ttl": "-1h"}), "spec.ttl"),
        (json!({"jwtTtl": "0s"}), "spec.jwtTtl"),
        (json!({"federatesWith": ["not a td"]}), "federatesWith"),
    ] {
        let p = plan_cluster_identity(
            &cluster(spec.clone()),
            &env(),
            &[ns("a", &[])],
            &[pod("a", "web", &[])],
        );
        assert!(p.entries.is_empty(), "{spec}");
        assert_eq!(p.refusals.len(), 1, "{spec}");
        assert!(
            p.refusals[0].message.contains(want),
            "{spec}: {}",
            p.refusals[0].message
        );
    }
}

#[test]
fn a_workload_the_agent_cannot_select_is_refused_alone() {
    // Service account names may contain dots; k8s:sa selectors may not.
    let p = plan_cluster_identity(
        &ClusterIdentitySpec::default(),
        &env(),
        &[ns("a", &[])],
        &[pod("a", "web", &[]), pod("a", "odd.name", &[])],
    );
    assert_eq!(ids(&p), ["spiffe://example.org/ns/a/sa/web"]);
    assert_eq!(reasons(&p), [REASON_WORKLOAD]);
    assert!(p.refusals[0].message.contains("a/odd.name"));
}

#[test]
fn an_identity_is_confined_to_its_namespace() {
    let b = bounds(json!({"namespaces": ["a"]}));
    let spec =
        identity(json!({"path": "sa/{serviceAccount}", "dnsNames": ["{serviceAccount}.a.svc"]}));
    // Pods of other namespaces are never its workloads.
    let pods = [pod("a", "web", &[]), pod("b", "web", &[])];
    let p = plan_identity(&spec, "a", &env(), &b, &pods);
    assert_eq!(p.refusals, []);
    assert_eq!(ids(&p), ["spiffe://example.org/ns/a/sa/web"]);
    assert_eq!(p.entries[0].selectors, ["k8s:ns:a", "k8s:sa:web"]);
    assert_eq!(p.entries[0].dns_names, ["web.a.svc"]);
    assert_eq!(p.entries[0].node_set, "k8s");
    assert!(p.entries[0].federates_with.is_empty());
}

#[test]
fn an_identity_cannot_name_another_namespaces_id() {
    // Every way of writing another namespace's ID: the prefix /ns/a/ is forced, so each is
    // either refused or stays under /ns/a/.
    let b = Bounds::no_tenant();
    let env = Env {
        without_tenant: true,
        ..env()
    };
    let pods = [pod("a", "web", &[])];
    for path in [
        "../b/sa/web",
        "../../ns/b/sa/web",
        "./x",
        "x/../../b",
        "%2e%2e/b/sa/web",
        "%2E%2E/b",
        "x/%2f/b",
        "/ns/b/sa/web",
        "spiffe://example.org/ns/b/sa/web",
        "x//y",
        "x/",
        "",
        "a\\..\\b",
        "{namespace}/x",
    ] {
        let p = plan_identity(&identity(json!({"path": path})), "a", &env, &b, &pods);
        assert!(p.entries.is_empty(), "{path:?}: {:?}", p.entries);
        assert_eq!(reasons(&p), [REASON_INVALID_SPEC], "{path:?}");
    }
    // What is accepted always starts with /ns/a/.
    for path in ["ns/b/sa/web", "b", "x.y/z-_1", "...x"] {
        let p = plan_identity(&identity(json!({"path": path})), "a", &env, &b, &pods);
        assert_eq!(p.refusals, [], "{path:?}");
        assert_eq!(ids(&p), [format!("spiffe://example.org/ns/a/{path}")]);
    }
}

#[test]
fn an_identity_path_must_be_under_its_tenants_prefixes() {
    let b = bounds(json!({"namespaces": ["a"], "spiffeIdPathPrefixes": ["/ns/{namespace}/apps/"]}));
    let pods = [pod("a", "web", &[])];
    let p = plan_identity(
        &identity(json!({"path": "apps/web"})),
        "a",
        &env(),
        &b,
        &pods,
    );
    assert_eq!(ids(&p), ["spiffe://example.org/ns/a/apps/web"]);
    let p = plan_identity(&identity(json!({"path": "sa/web"})), "a", &env(), &b, &pods);
    assert_eq!(reasons(&p), [REASON_PATH_NOT_ALLOWED]);
    assert!(p.refusals[0].message.contains("/ns/a/apps/"));
    // A prefix naming another namespace admits nothing: the ID is still /ns/a/...
    let b = bounds(json!({"namespaces": ["a"], "spiffeIdPathPrefixes": ["/ns/b/"]}));
    let p = plan_identity(&identity(json!({"path": "sa/web"})), "a", &env(), &b, &pods);
    assert_eq!(reasons(&p), [REASON_PATH_NOT_ALLOWED]);
}

#[test]
fn an_identity_cannot_take_another_tenants_dns_name() {
    let b = bounds(json!({"namespaces": ["a"]}));
    let pods = [pod("a", "web", &[])];
    for name in [
        "web.b.svc",
        "web.b.svc.cluster.local",
        "api.example.com",
        "a.svc",
        "*.svc",
    ] {
        let p = plan_identity(
            &identity(json!({"path": "web", "dnsNames": ["web.a.svc", name]})),
            "a",
            &env(),
            &b,
            &pods,
        );
        assert!(p.entries.is_empty(), "{name}");
        assert_eq!(reasons(&p), [REASON_DNS_NOT_ALLOWED], "{name}");
    }
    let p = plan_identity(
        &identity(
            json!({"path": "web", "dnsNames": ["web.a.svc.cluster.local", "{serviceAccount}.a.svc"]}),
        ),
        "a",
        &env(),
        &b,
        &pods,
    );
    assert_eq!(
        p.entries[0].dns_names,
        ["web.a.svc", "web.a.svc.cluster.local"]
    );
    // A DNS name that is not one.
    let p = plan_identity(
        &identity(json!({"path": "web", "dnsNames": ["bad name.a.svc"]})),
        "a",
        &env(),
        &b,
        &pods,
    );
    assert_eq!(reasons(&p), [REASON_INVALID_SPEC]);
}

#[test]
fn ttls_above_the_tenants_cap_are_refused_not_clamped() {
    let b = bounds(json!({"namespaces": ["a"], "maxTtl": "24h"}));
    let pods = [pod("a", "web", &[])];
    let p = plan_identity(
        &identity(json!({"path": "web", "ttl": "24h", "jwtTtl": "1h"})),
        "a",
        &env(),
        &b,
        &pods,
    );
    assert_eq!(
        (p.entries[0].ttl_seconds, p.entries[0].jwt_ttl_seconds),
        (86400, 3600)
    );
    for spec in [
        json!({"path": "web", "ttl": "24h1s"}),
        json!({"path": "web", "jwtTtl": "48h"}),
    ] {
        let p = plan_identity(&identity(spec.clone()), "a", &env(), &b, &pods);
        assert!(p.entries.is_empty(), "{spec}");
        assert_eq!(reasons(&p), [REASON_TTL_ABOVE_MAX], "{spec}");
    }
    // Refused even with no pod yet: the spec itself is out of bounds.
    let p = plan_identity(
        &identity(json!({"path": "web", "ttl": "100h"})),
        "a",
        &env(),
        &b,
        &[],
    );
    assert_eq!(reasons(&p), [REASON_TTL_ABOVE_MAX]);
}

#[test]
fn identity_filters_by_labels_and_service_account() {
    let b = bounds(json!({"namespaces": ["a"]}));
    let pods = [
        pod("a", "web", &[("app", "web"), ("tier", "front")]),
        pod("a", "web", &[("app", "other")]),
        pod("a", "api", &[("app", "web")]),
    ];
    let p = plan_identity(
        &identity(
            json!({"path": "{serviceAccount}", "podSelector": {"matchLabels": {"app": "web"}}}),
        ),
        "a",
        &env(),
        &b,
        &pods,
    );
    assert_eq!(
        ids(&p),
        [
            "spiffe://example.org/ns/a/api",
            "spiffe://example.org/ns/a/web"
        ]
    );
    assert_eq!(
        p.entries[1].selectors,
        ["k8s:ns:a", "k8s:pod-label:app:web", "k8s:sa:web"]
    );
    let p = plan_identity(
        &identity(
            json!({"path": "{serviceAccount}", "podSelector": {"matchLabels": {"app": "web"}}, "serviceAccountName": "web"}),
        ),
        "a",
        &env(),
        &b,
        &pods,
    );
    assert_eq!(ids(&p), ["spiffe://example.org/ns/a/web"]);
    let p = plan_identity(
        &identity(
            json!({"path": "x", "podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}),
        ),
        "a",
        &env(),
        &b,
        &pods,
    );
    assert_eq!(reasons(&p), [REASON_INVALID_SPEC]);
}

#[test]
fn the_quota_refuses_the_object_that_would_overflow_it() {
    let b = bounds(json!({"namespaces": ["a", "b"], "maxIdentities": 3}));
    let two = identity(json!({"path": "{serviceAccount}"}));
    let pods = [
        pod("a", "web", &[]),
        pod("a", "api", &[]),
        pod("b", "web", &[]),
        pod("b", "api", &[]),
    ];
    let mut plans = vec![
        ("a/first", plan_identity(&two, "a", &env(), &b, &pods)),
        ("b/second", plan_identity(&two, "b", &env(), &b, &pods)),
        (
            "b/third",
            plan_identity(
                &identity(json!({"path": "one", "serviceAccountName": "web"})),
                "b",
                &env(),
                &b,
                &pods,
            ),
        ),
    ];
    apply_quota(&mut plans, b.max_identities, "team-a");
    assert_eq!(plans[0].1.entries.len(), 2);
    assert_eq!(reasons(&plans[1].1), [REASON_QUOTA]);
    assert!(plans[1].1.entries.is_empty());
    assert!(
        plans[1].1.refusals[0]
            .message
            .contains("maxIdentities 3 (2 in use")
    );
    // A later, smaller one still fits.
    assert_eq!(plans[2].1.entries.len(), 1);
    // No quota: nothing changes.
    let mut free = vec![("x", plan_identity(&two, "a", &env(), &b, &pods))];
    apply_quota(&mut free, None, "t");
    assert_eq!(free[0].1.entries.len(), 2);
}

#[test]
fn bounds_follow_membership() {
    let tenancy = Tenancy::resolve(
        &[
            signet_tenant("t1", json!({"namespaces": ["a", "shared"]})),
            signet_tenant("t2", json!({"namespaces": ["shared"]})),
            signet_tenant("bad", json!({"namespaces": ["c"], "capsuleTenant": "x"})),
        ],
        None,
        &[],
    );
    let nt = Bounds::no_tenant();
    assert_eq!(
        bounds_for(&tenancy.membership("a"), "a", &env(), &nt)
            .unwrap()
            .tenant,
        "t1"
    );
    let r = bounds_for(&tenancy.membership("shared"), "shared", &env(), &nt).unwrap_err();
    assert_eq!(r.reason, REASON_TENANT_CONFLICT);
    assert!(r.message.contains("t1, t2"));
    let r = bounds_for(&tenancy.membership("c"), "c", &env(), &nt).unwrap_err();
    assert_eq!(r.reason, REASON_TENANT_INVALID);
    let r = bounds_for(&tenancy.membership("d"), "d", &env(), &nt).unwrap_err();
    assert_eq!(r.reason, REASON_NO_TENANT);
    let with = Env {
        without_tenant: true,
        ..env()
    };
    assert_eq!(
        bounds_for(&tenancy.membership("d"), "d", &with, &nt).unwrap(),
        &nt
    );
    // A conflict is never rescued by --identities-without-tenant.
    assert!(bounds_for(&tenancy.membership("shared"), "shared", &with, &nt).is_err());
}

#[test]
fn a_namespace_moved_to_another_tenant_plans_under_the_new_one() {
    let spec = identity(json!({"path": "web", "dnsNames": ["api.old.example.com"]}));
    let pods = [pod("a", "web", &[])];
    let old = bounds(json!({"namespaces": ["a"], "dnsNamePatterns": ["*.old.example.com"]}));
    assert_eq!(
        plan_identity(&spec, "a", &env(), &old, &pods).entries.len(),
        1
    );
    let new = bounds(json!({"namespaces": ["a"]}));
    let p = plan_identity(&spec, "a", &env(), &new, &pods);
    // The plan is empty: the sync removes the entry the old tenant allowed.
    assert!(p.entries.is_empty());
    assert_eq!(reasons(&p), [REASON_DNS_NOT_ALLOWED]);
}
