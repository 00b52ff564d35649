//! Tenancy: Capsule's ownership (name AND uid, or its status), never the label; explicit
//! lists; conflicts; invalid tenants failing closed; the bounds' matching rules.

use serde_json::{Value, json};

use super::*;

/// A Capsule `v1beta2` Tenant as the API server returns it.
pub(crate) fn capsule_tenant(name: &str, uid: &str, namespaces: &[&str]) -> Value {
    json!({
        "apiVersion": "capsule.clastix.io/v1beta2", "kind": "Tenant",
        "metadata": {"name": name, "uid": uid, "resourceVersion": "811", "generation": 1,
            "creationTimestamp": "2026-01-05T10:00:00Z"},
        "spec": {"owners": [{"kind": "User", "name": "alice",
            "clusterRoles": ["admin", "capsule-namespace-deleter"]}]},
        "status": {"state": "Active", "size": namespaces.len(), "namespaces": namespaces}
    })
}

/// A Namespace; `owner`: Capsule's controller ownerReference `(tenant name, uid)`; `label`:
/// the `capsule.clastix.io/tenant` label's value.
pub(crate) fn namespace(name: &str, owner: Option<(&str, &str)>, label: Option<&str>) -> Value {
    let mut ns = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "uid": format!("ns-{name}"), "resourceVersion": "5",
            "creationTimestamp": "2026-01-05T10:00:00Z",
            "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}
    });
    if let Some((t, uid)) = owner {
        ns["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "capsule.clastix.io/v1beta2", "kind": "Tenant", "name": t, "uid": uid,
            "controller": true, "blockOwnerDeletion": true
        }]);
    }
    if let Some(l) = label {
        ns["metadata"]["labels"]["capsule.clastix.io/tenant"] = json!(l);
    }
    ns
}

pub(crate) fn signet_tenant(name: &str, spec: Value) -> Tenant {
    serde_json::from_value(json!({
        "apiVersion": "signet.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": name, "uid": format!("t-{name}"), "generation": 1},
        "spec": spec
    }))
    .unwrap()
}

fn ns_info(v: Value) -> NamespaceInfo {
    NamespaceInfo::from(&serde_json::from_value::<Namespace>(v).unwrap())
}

fn capsule(v: Value) -> CapsuleTenant {
    CapsuleTenant::from(&serde_json::from_value::<DynamicObject>(v).unwrap())
}

fn tenant_of(t: &Tenancy, ns: &str) -> Option<String> {
    match t.membership(ns) {
        Membership::Tenant(b) => Some(b.tenant.clone()),
        _ => None,
    }
}

#[test]
fn an_explicit_list_assigns_its_namespaces() {
    let t = Tenancy::resolve(
        &[signet_tenant("team-a", json!({"namespaces": ["a1", "a2"]}))],
        None,
        &[],
    );
    assert_eq!(tenant_of(&t, "a1").as_deref(), Some("team-a"));
    assert_eq!(tenant_of(&t, "a2").as_deref(), Some("team-a"));
    assert_eq!(t.membership("b"), Membership::None);
    assert_eq!(t.namespaces_of("team-a"), ["a1", "a2"]);
}

#[test]
fn capsule_ownership_is_the_owner_reference_with_name_and_uid() {
    let caps = [capsule(capsule_tenant("solar", "uid-solar", &[]))];
    let nss = [
        ns_info(namespace(
            "solar-prod",
            Some(("solar", "uid-solar")),
            Some("solar"),
        )),
        // A stale reference: same name, another (deleted and re-created) tenant's uid.
        ns_info(namespace(
            "solar-old",
            Some(("solar", "uid-older")),
            Some("solar"),
        )),
    ];
    let t = Tenancy::resolve(
        &[signet_tenant("solar", json!({"capsuleTenant": "solar"}))],
        Some(&caps),
        &nss,
    );
    assert_eq!(tenant_of(&t, "solar-prod").as_deref(), Some("solar"));
    assert_eq!(t.membership("solar-old"), Membership::None);
}

#[test]
fn capsule_status_namespaces_count_too() {
    let caps = [capsule(capsule_tenant(
        "solar",
        "uid-solar",
        &["solar-dev"],
    ))];
    let t = Tenancy::resolve(
        &[signet_tenant("s", json!({"capsuleTenant": "solar"}))],
        Some(&caps),
        &[ns_info(namespace("solar-dev", None, None))],
    );
    assert_eq!(tenant_of(&t, "solar-dev").as_deref(), Some("s"));
}

#[test]
fn the_capsule_label_alone_never_moves_a_namespace() {
    // A namespace admin of wind's namespace relabels it capsule.clastix.io/tenant=solar: no
    // ownerReference to solar, not in solar's status: it stays wind's.
    let caps = [
        capsule(capsule_tenant("solar", "uid-solar", &["solar-prod"])),
        capsule(capsule_tenant("wind", "uid-wind", &["wind-prod"])),
    ];
    let nss = [
        ns_info(namespace(
            "solar-prod",
            Some(("solar", "uid-solar")),
            Some("solar"),
        )),
        ns_info(namespace(
            "wind-prod",
            Some(("wind", "uid-wind")),
            Some("solar"),
        )),
        // And one in no tenant at all, labelled: still in none.
        ns_info(namespace("stray", None, Some("solar"))),
    ];
    let t = Tenancy::resolve(
        &[
            signet_tenant("solar", json!({"capsuleTenant": "solar"})),
            signet_tenant("wind", json!({"capsuleTenant": "wind"})),
        ],
        Some(&caps),
        &nss,
    );
    assert_eq!(tenant_of(&t, "wind-prod").as_deref(), Some("wind"));
    assert_eq!(tenant_of(&t, "solar-prod").as_deref(), Some("solar"));
    assert_eq!(t.membership("stray"), Membership::None);
    assert_eq!(t.namespaces_of("solar"), ["solar-prod"]);
}

#[test]
fn an_owner_reference_of_another_group_or_kind_is_not_capsules() {
    let c = capsule(capsule_tenant("solar", "uid-solar", &[]));
    let mut ns = ns_info(namespace("x", Some(("solar", "uid-solar")), None));
    assert!(capsule_owns(&ns, &c));
    ns.owners[0].api_version = "capsule.clastix.io.evil.example/v1".into();
    assert!(!capsule_owns(&ns, &c));
    ns.owners[0].api_version = "capsule.clastix.io/v1beta2".into();
    ns.owners[0].kind = "TenantResource".into();
    assert!(!capsule_owns(&ns, &c));
    // A Capsule Tenant without a uid (a malformed answer) owns nothing.
    let no_uid = CapsuleTenant {
        name: "solar".into(),
        uid: String::new(),
        namespaces: vec![],
    };
    let mut ns = ns_info(namespace("y", Some(("solar", "")), None));
    ns.owners[0].uid.clear();
    assert!(!capsule_owns(&ns, &no_uid));
}

#[test]
fn without_capsule_a_capsule_tenant_holds_nothing_and_says_why() {
    let t = Tenancy::resolve(
        &[signet_tenant("solar", json!({"capsuleTenant": "solar"}))],
        None,
        &[ns_info(namespace(
            "solar-prod",
            Some(("solar", "uid-solar")),
            Some("solar"),
        ))],
    );
    assert_eq!(t.membership("solar-prod"), Membership::None);
    assert!(t.notes["solar"].contains("not installed"), "{:?}", t.notes);
    // Installed, but no such Capsule Tenant.
    let t = Tenancy::resolve(
        &[signet_tenant("solar", json!({"capsuleTenant": "solar"}))],
        Some(&[]),
        &[],
    );
    assert!(t.notes["solar"].contains("no such Capsule Tenant"));
}

#[test]
fn a_namespace_claimed_twice_belongs_to_neither() {
    let t = Tenancy::resolve(
        &[
            signet_tenant("a", json!({"namespaces": ["shared", "a1"]})),
            signet_tenant("b", json!({"namespaces": ["shared"]})),
        ],
        None,
        &[],
    );
    assert_eq!(
        t.membership("shared"),
        Membership::Conflict(vec!["a".into(), "b".into()])
    );
    assert_eq!(t.conflicts_of("a"), [("shared".into(), vec!["b".into()])]);
    assert_eq!(t.conflicts_of("b"), [("shared".into(), vec!["a".into()])]);
    assert_eq!(t.namespaces_of("a"), ["a1"]);
    assert!(t.namespaces_of("b").is_empty());
}

#[test]
fn an_invalid_tenant_still_holds_its_namespaces() {
    for (spec, want) in [
        (
            json!({"namespaces": ["x"], "capsuleTenant": "c"}),
            "exactly one",
        ),
        (
            json!({"namespaces": ["x"], "spiffeIdPathPrefixes": ["/ns/{namespace}"]}),
            "start and end with '/'",
        ),
        (
            json!({"namespaces": ["x"], "spiffeIdPathPrefixes": ["/signet/"]}),
            "Signet's own",
        ),
        (
            json!({"namespaces": ["x"], "spiffeIdPathPrefixes": ["/ns/../"]}),
            "'.' or '..'",
        ),
        (
            json!({"namespaces": ["x"], "spiffeIdPathPrefixes": []}),
            "empty",
        ),
        (
            json!({"namespaces": ["x"], "dnsNamePatterns": ["*.*.svc"]}),
            "dnsNamePatterns",
        ),
        (json!({"namespaces": ["x"], "maxTtl": "forever"}), "maxTtl"),
    ] {
        let t = Tenancy::resolve(&[signet_tenant("t", spec.clone())], None, &[]);
        match t.membership("x") {
            Membership::InvalidTenant { tenant, why } => {
                assert_eq!(tenant, "t");
                assert!(why.contains(want), "{spec}: {why}");
            }
            other => panic!("{spec}: {other:?}"),
        }
    }
}

#[test]
fn defaults_and_matching() {
    let b = Bounds::of(&signet_tenant(
        "t",
        json!({"namespaces": ["a"], "maxTtl": "24h", "maxIdentities": 5}),
    ))
    .unwrap();
    assert_eq!(b.prefixes_for("a"), ["/ns/a/"]);
    assert!(b.path_allowed("a", "/ns/a/web"));
    // A prefix is a whole segment: /ns/a/ never admits /ns/ab/.
    assert!(!b.path_allowed("a", "/ns/ab/web"));
    assert_eq!(b.max_ttl, Some(Duration::from_secs(86400)));
    assert_eq!(b.max_identities, Some(5));
    for (name, ok) in [
        ("web.a.svc", true),
        ("WEB.A.SVC", true),
        ("x.y.a.svc", true),
        ("web.a.svc.cluster.local", true),
        ("a.svc", false),
        (".a.svc", false),
        ("web.b.svc", false),
        ("web.a.svc.evil.example", false),
        ("weba.svc", false),
        ("*.a.svc", true),
        ("*.svc", false),
        ("*.b.svc", false),
    ] {
        assert_eq!(b.dns_allowed("a", name), ok, "{name}");
    }
    let exact = Bounds::of(&signet_tenant(
        "t",
        json!({"namespaces": ["a"], "dnsNamePatterns": ["api.{namespace}.example.com", "*.{namespace}.svc"]}),
    ))
    .unwrap();
    assert!(exact.dns_allowed("a", "api.a.example.com"));
    assert!(!exact.dns_allowed("a", "x.api.a.example.com"));
    // The no-tenant defaults leave DNS names to the server.
    assert!(Bounds::no_tenant().dns_allowed("a", "anything.example.com"));
    assert_eq!(Bounds::no_tenant().prefixes_for("a"), ["/ns/a/"]);
}
