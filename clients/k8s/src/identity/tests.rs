//! The identity reconcilers against a scripted API server and a fake registrar: the requests
//! made, the exact entries synced, the status patched, deletion and garbage collection.

use std::sync::Arc;

use serde_json::{Value, json};

use super::crd::{ClusterIdentity, Identity, Tenant};
use super::plan::{Env, OwnedEntry};
use super::reconcile::*;
use super::registrar::FakeRegistrar;
use super::tenant::tests::{capsule_tenant, namespace};
use crate::Action;
use crate::signer::SignError;
use crate::testing::{Expect, RecordedEvents, Stored, object, scripted};
use signet_runtime::clock::FakeClock;
use signet_types::TrustDomain;
use signet_types::node_set::NodeSetName;

const T0: u64 = 1_767_225_600;
const CAPSULE_TENANTS: &str = "/apis/capsule.clastix.io/v1beta2/tenants";
const TENANTS: &str = "/apis/signet.dev/v1alpha1/tenants";

fn env(without_tenant: bool) -> Env {
    Env {
        trust_domain: TrustDomain::new("example.org").unwrap(),
        node_set: NodeSetName::new("k8s").unwrap(),
        without_tenant,
    }
}

fn context(
    client: kube::Client,
    registrar: Arc<FakeRegistrar>,
    without_tenant: bool,
) -> (Arc<IdentityContext>, Arc<RecordedEvents>) {
    let events = Arc::new(RecordedEvents::default());
    (
        Arc::new(IdentityContext::new(
            client,
            registrar,
            env(without_tenant),
            Arc::new(FakeClock::at_unix(T0)),
            events.clone(),
        )),
        events,
    )
}

fn list(api_version: &str, kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": format!("{kind}List"),
        "metadata": {"resourceVersion": "100"}, "items": items})
}

fn pod(ns: &str, name: &str, sa: &str, labels: Value) -> Value {
    object(
        "v1",
        "Pod",
        Some(ns),
        name,
        "7",
        json!({
            "metadata": {"labels": labels},
            "spec": {"serviceAccountName": sa, "containers": [{"name": "app", "image": "app:1"}]},
            "status": {"phase": "Running"}
        }),
    )
}

fn cluster_identity() -> (ClusterIdentity, Value) {
    let v = object(
        "signet.dev/v1alpha1",
        "ClusterIdentity",
        None,
        "web",
        "11",
        json!({"spec": {
            "namespaceSelector": {"matchLabels": {"mesh": "on"}},
            "podSelector": {"matchLabels": {"app": "web"}},
            "dnsNameTemplates": ["{serviceAccount}.{namespace}.svc"],
            "ttl": "1h"
        }}),
    );
    (serde_json::from_value(v.clone()).unwrap(), v)
}

fn identity_obj(ns: &str, name: &str, spec: Value, created: &str) -> (Identity, Value) {
    let v = object(
        "signet.dev/v1alpha1",
        "Identity",
        Some(ns),
        name,
        "21",
        json!({"metadata": {"creationTimestamp": created}, "spec": spec}),
    );
    (serde_json::from_value(v.clone()).unwrap(), v)
}

fn tenant(name: &str, spec: Value) -> Value {
    object(
        "signet.dev/v1alpha1",
        "Tenant",
        None,
        name,
        "31",
        json!({"spec": spec}),
    )
}

fn entry(id: &str, selectors: &[&str], dns: &[&str], ttl: i64) -> OwnedEntry {
    OwnedEntry {
        spiffe_id: id.into(),
        node_set: "k8s".into(),
        selectors: selectors.iter().map(|s| (*s).to_owned()).collect(),
        ttl_seconds: ttl,
        dns_names: dns.iter().map(|s| (*s).to_owned()).collect(),
        jwt_ttl_seconds: 0,
        federates_with: vec![],
    }
}

fn labelled(mut ns: Value, k: &str, v: &str) -> Value {
    ns["metadata"]["labels"][k] = json!(v);
    ns
}

#[tokio::test]
async fn a_cluster_identity_syncs_its_entries_and_reports() {
    let (ci, ci_json) = cluster_identity();
    let stored = Stored::new(ci_json);
    let (client, server) = scripted(vec![
        Expect::reply(
            "GET",
            "/api/v1/namespaces",
            200,
            list(
                "v1",
                "Namespace",
                vec![
                    labelled(namespace("a", None, None), "mesh", "on"),
                    labelled(namespace("b", None, None), "mesh", "on"),
                    namespace("c", None, None),
                ],
            ),
        ),
        Expect::get("/api/v1/pods")
            .query("labelSelector=app%3Dweb")
            .respond(list(
                "v1",
                "Pod",
                vec![
                    pod("a", "web-1", "web", json!({"app": "web"})),
                    pod("a", "web-2", "web", json!({"app": "web"})),
                    pod("b", "web-1", "frontend", json!({"app": "web"})),
                    pod("c", "web-1", "web", json!({"app": "web"})),
                ],
            )),
        Expect::patch("/apis/signet.dev/v1alpha1/clusteridentities/web/status")
            .content_type("application/merge-patch+json")
            .respond_with(stored.merge_patch()),
    ]);
    let registrar = Arc::new(FakeRegistrar::default());
    let (ctx, events) = context(client, registrar.clone(), false);
    let action = reconcile_cluster_identity(Arc::new(ci), ctx).await.unwrap();
    let seen = server.await.unwrap();
    assert_eq!(action, Action::requeue(RECHECK));
    assert_eq!(
        registrar.syncs(),
        [(
            "ClusterIdentity/web".to_owned(),
            vec![
                entry(
                    "spiffe://example.org/ns/a/sa/web",
                    &["k8s:ns:a", "k8s:pod-label:app:web", "k8s:sa:web"],
                    &["web.a.svc"],
                    3600
                ),
                entry(
                    "spiffe://example.org/ns/b/sa/frontend",
                    &["k8s:ns:b", "k8s:pod-label:app:web", "k8s:sa:frontend"],
                    &["frontend.b.svc"],
                    3600
                ),
            ]
        )]
    );
    assert_eq!(
        seen[2].body,
        json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "Synced",
                "message": "2 registration entries on signet-server",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
            "entries": 2, "observedGeneration": 1
        }})
    );
    let ev = events.all();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].0, "ClusterIdentity/web");
    assert_eq!(ev[0].1.reason, "Synced");

    // Again with nothing changed: the same sync (no-op on the server), no status patch, no
    // event.
    let ci: ClusterIdentity = serde_json::from_value(stored.get()).unwrap();
    let (client, server) = scripted(vec![
        Expect::reply(
            "GET",
            "/api/v1/namespaces",
            200,
            list(
                "v1",
                "Namespace",
                vec![labelled(namespace("a", None, None), "mesh", "on")],
            ),
        ),
        Expect::get("/api/v1/pods").respond(list(
            "v1",
            "Pod",
            vec![pod("a", "web-1", "web", json!({"app": "web"}))],
        )),
        Expect::patch("/apis/signet.dev/v1alpha1/clusteridentities/web/status")
            .body_with(|b| {
                assert_eq!(b["status"]["entries"], 1);
            })
            .respond_with(stored.merge_patch()),
    ]);
    let (ctx, events) = context(client, registrar.clone(), false);
    reconcile_cluster_identity(Arc::new(ci), ctx).await.unwrap();
    server.await.unwrap();
    assert_eq!(registrar.syncs()[1].1.len(), 1);
    // Still Ready: no new event.
    assert!(events.all().is_empty());
}

#[tokio::test]
async fn a_cluster_identity_without_namespace_over_several_namespaces_is_refused() {
    let v = object(
        "signet.dev/v1alpha1",
        "ClusterIdentity",
        None,
        "shared",
        "1",
        json!({"spec": {"spiffeIdTemplate": "spiffe://{trustDomain}/sa/{serviceAccount}"}}),
    );
    let ci: ClusterIdentity = serde_json::from_value(v.clone()).unwrap();
    let (client, server) = scripted(vec![
        Expect::get("/api/v1/namespaces").respond(list(
            "v1",
            "Namespace",
            vec![namespace("a", None, None), namespace("b", None, None)],
        )),
        // Refused as a whole: no pods listed.
        Expect::patch("/apis/signet.dev/v1alpha1/clusteridentities/shared/status")
            .respond_with(Stored::new(v).merge_patch()),
    ]);
    let registrar = Arc::new(FakeRegistrar::default().with_scope(
        "ClusterIdentity/shared",
        vec![entry(
            "spiffe://example.org/sa/web",
            &["k8s:ns:a", "k8s:sa:web"],
            &[],
            0,
        )],
    ));
    let (ctx, events) = context(client, registrar.clone(), false);
    reconcile_cluster_identity(Arc::new(ci), ctx).await.unwrap();
    let seen = server.await.unwrap();
    // The scope is emptied: what it held before is removed.
    assert_eq!(
        registrar.syncs(),
        [("ClusterIdentity/shared".to_owned(), vec![])]
    );
    let st = &seen[1].body["status"];
    assert_eq!(st["conditions"][0]["status"], "False");
    assert_eq!(st["conditions"][0]["reason"], "NamespaceCollision");
    assert_eq!(st["entries"], 0);
    assert!(
        st["refusals"][0]
            .as_str()
            .unwrap()
            .starts_with("NamespaceCollision: ")
    );
    assert!(events.all()[0].1.warning);
}

fn identity_script(
    tenants: Vec<Value>,
    capsule: Option<Vec<Value>>,
    namespaces: Vec<Value>,
) -> Vec<Expect> {
    vec![
        Expect::get(TENANTS).respond(list("signet.dev/v1alpha1", "Tenant", tenants)),
        match capsule {
            Some(items) => Expect::get(CAPSULE_TENANTS).respond(list(
                "capsule.clastix.io/v1beta2",
                "Tenant",
                items,
            )),
            None => Expect::get(CAPSULE_TENANTS).not_found("tenants.capsule.clastix.io", ""),
        },
        Expect::get("/api/v1/namespaces").respond(list("v1", "Namespace", namespaces)),
    ]
}

#[tokio::test]
async fn an_identity_syncs_under_its_capsule_tenant() {
    let (id, id_json) = identity_obj(
        "solar-prod",
        "web",
        json!({"path": "sa/{serviceAccount}", "dnsNames": ["{serviceAccount}.solar-prod.svc"], "ttl": "1h"}),
        "2026-01-01T00:00:00Z",
    );
    let mut script = identity_script(
        vec![tenant(
            "solar",
            json!({"capsuleTenant": "solar", "maxTtl": "24h"}),
        )],
        Some(vec![capsule_tenant("solar", "uid-solar", &[])]),
        vec![namespace(
            "solar-prod",
            Some(("solar", "uid-solar")),
            Some("solar"),
        )],
    );
    script.extend([
        Expect::get("/api/v1/namespaces/solar-prod/pods").respond(list(
            "v1",
            "Pod",
            vec![pod("solar-prod", "web-1", "web", json!({}))],
        )),
        Expect::patch("/apis/signet.dev/v1alpha1/namespaces/solar-prod/identities/web/status")
            .respond_with(Stored::new(id_json).merge_patch()),
    ]);
    let (client, server) = scripted(script);
    let registrar = Arc::new(FakeRegistrar::default());
    let (ctx, _) = context(client, registrar.clone(), false);
    reconcile_identity(Arc::new(id), ctx).await.unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        registrar.syncs(),
        [(
            "Identity/solar-prod/web".to_owned(),
            vec![entry(
                "spiffe://example.org/ns/solar-prod/sa/web",
                &["k8s:ns:solar-prod", "k8s:sa:web"],
                &["web.solar-prod.svc"],
                3600
            )]
        )]
    );
    assert_eq!(seen[4].body["status"]["conditions"][0]["reason"], "Synced");
    assert_eq!(seen[4].body["status"]["entries"], 1);
}

#[tokio::test]
async fn a_relabelled_namespace_without_capsules_owner_reference_has_no_tenant() {
    // wind-prod's admin set capsule.clastix.io/tenant=solar; Capsule owns it as wind, which
    // has no Signet Tenant: the Identity gets nothing (NoTenant), never solar's bounds.
    let (id, id_json) = identity_obj(
        "wind-prod",
        "web",
        json!({"path": "web"}),
        "2026-01-01T00:00:00Z",
    );
    let mut script = identity_script(
        vec![tenant("solar", json!({"capsuleTenant": "solar"}))],
        Some(vec![
            capsule_tenant("solar", "uid-solar", &["solar-prod"]),
            capsule_tenant("wind", "uid-wind", &["wind-prod"]),
        ]),
        vec![
            namespace("solar-prod", Some(("solar", "uid-solar")), Some("solar")),
            namespace("wind-prod", Some(("wind", "uid-wind")), Some("solar")),
        ],
    );
    script.push(
        Expect::patch("/apis/signet.dev/v1alpha1/namespaces/wind-prod/identities/web/status")
            .respond_with(Stored::new(id_json).merge_patch()),
    );
    let (client, server) = scripted(script);
    let registrar = Arc::new(FakeRegistrar::default());
    let (ctx, events) = context(client, registrar.clone(), false);
    reconcile_identity(Arc::new(id), ctx).await.unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        registrar.syncs(),
        [("Identity/wind-prod/web".to_owned(), vec![])]
    );
    assert_eq!(
        seen[3].body["status"]["conditions"][0]["reason"],
        "NoTenant"
    );
    assert_eq!(events.all()[0].1.reason, "NoTenant");
}

#[tokio::test]
async fn without_a_tenant_the_flag_gives_namespace_defaults() {
    let (id, id_json) = identity_obj(
        "dev",
        "web",
        json!({"path": "web", "dnsNames": ["web.example.com"]}),
        "2026-01-01T00:00:00Z",
    );
    let mut script = identity_script(vec![], None, vec![namespace("dev", None, None)]);
    script.extend([
        Expect::get("/api/v1/namespaces/dev/pods").respond(list(
            "v1",
            "Pod",
            vec![pod("dev", "web-1", "web", json!({}))],
        )),
        Expect::patch("/apis/signet.dev/v1alpha1/namespaces/dev/identities/web/status")
            .respond_with(Stored::new(id_json).merge_patch()),
    ]);
    let (client, server) = scripted(script);
    let registrar = Arc::new(FakeRegistrar::default());
    let (ctx, _) = context(client, registrar.clone(), true);
    reconcile_identity(Arc::new(id), ctx).await.unwrap();
    server.await.unwrap();
    // DNS names are left to the server's dns_templates.
    assert_eq!(
        registrar.syncs()[0].1,
        [entry(
            "spiffe://example.org/ns/dev/web",
            &["k8s:ns:dev", "k8s:sa:web"],
            &["web.example.com"],
            0
        )]
    );
}

#[tokio::test]
async fn the_quota_counts_every_identity_of_the_tenant() {
    // Two Identities in two namespaces of one tenant, quota 2: the older one (a/first, two
    // entries) keeps its entries, the newer one (b/second) is refused.
    let (first, first_json) = identity_obj(
        "a",
        "first",
        json!({"path": "{serviceAccount}"}),
        "2026-01-01T00:00:00Z",
    );
    let (second, second_json) = identity_obj(
        "b",
        "second",
        json!({"path": "one"}),
        "2026-01-02T00:00:00Z",
    );
    let pods_a = list(
        "v1",
        "Pod",
        vec![
            pod("a", "p1", "web", json!({})),
            pod("a", "p2", "api", json!({})),
        ],
    );
    let pods_b = list("v1", "Pod", vec![pod("b", "p1", "web", json!({}))]);
    let tenants = vec![tenant(
        "team",
        json!({"namespaces": ["a", "b"], "maxIdentities": 2}),
    )];
    let nss = vec![namespace("a", None, None), namespace("b", None, None)];
    let all = list(
        "signet.dev/v1alpha1",
        "Identity",
        vec![second_json.clone(), first_json.clone()],
    );

    let mut script = identity_script(tenants.clone(), None, nss.clone());
    script.extend([
        Expect::get("/apis/signet.dev/v1alpha1/identities").respond(all.clone()),
        Expect::get("/api/v1/namespaces/a/pods").respond(pods_a.clone()),
        Expect::get("/api/v1/namespaces/b/pods").respond(pods_b.clone()),
        Expect::patch("/apis/signet.dev/v1alpha1/namespaces/b/identities/second/status")
            .respond_with(Stored::new(second_json).merge_patch()),
    ]);
    let (client, server) = scripted(script);
    let registrar = Arc::new(FakeRegistrar::default());
    let (ctx, _) = context(client, registrar.clone(), false);
    reconcile_identity(Arc::new(second), ctx).await.unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        registrar.syncs(),
        [("Identity/b/second".to_owned(), vec![])]
    );
    assert_eq!(
        seen[6].body["status"]["conditions"][0]["reason"],
        "QuotaExceeded"
    );

    let mut script = identity_script(tenants, None, nss);
    script.extend([
        Expect::get("/apis/signet.dev/v1alpha1/identities").respond(all),
        Expect::get("/api/v1/namespaces/a/pods").respond(pods_a),
        Expect::get("/api/v1/namespaces/b/pods").respond(pods_b),
        Expect::patch("/apis/signet.dev/v1alpha1/namespaces/a/identities/first/status")
            .respond_with(Stored::new(first_json).merge_patch()),
    ]);
    let (client, server) = scripted(script);
    let (ctx, _) = context(client, registrar.clone(), false);
    reconcile_identity(Arc::new(first), ctx).await.unwrap();
    server.await.unwrap();
    assert_eq!(registrar.syncs()[1].0, "Identity/a/first");
    assert_eq!(registrar.syncs()[1].1.len(), 2);
}

#[tokio::test]
async fn a_server_refusal_is_reported_and_retried_with_backoff() {
    let (id, id_json) = identity_obj("dev", "web", json!({"path": "web"}), "2026-01-01T00:00:00Z");
    let mut script = identity_script(
        vec![tenant("t", json!({"namespaces": ["dev"]}))],
        None,
        vec![namespace("dev", None, None)],
    );
    script.extend([
        Expect::get("/api/v1/namespaces/dev/pods").respond(list(
            "v1",
            "Pod",
            vec![pod("dev", "p", "web", json!({}))],
        )),
        Expect::patch("/apis/signet.dev/v1alpha1/namespaces/dev/identities/web/status")
            .respond_with(Stored::new(id_json).merge_patch()),
    ]);
    let (client, server) = scripted(script);
    let registrar = Arc::new(FakeRegistrar::default());
    *registrar.fail_next.lock().unwrap() = Some(SignError::permanent(
        "PermissionDenied",
        "entries[0]: node set k8s is not in [policy.kubernetes_bridge] node_sets",
    ));
    let (ctx, _) = context(client, registrar.clone(), false);
    let action = reconcile_identity(Arc::new(id), ctx.clone()).await.unwrap();
    let seen = server.await.unwrap();
    let c = &seen[4].body["status"]["conditions"][0];
    assert_eq!(c["reason"], "ServerRefused");
    assert!(c["message"].as_str().unwrap().contains("node_sets"));
    assert_ne!(action, Action::requeue(RECHECK));
    assert_eq!(ctx.backoffs.attempts(&"Identity/dev/web".to_owned()), 1);
}

#[tokio::test]
async fn deletion_syncs_the_scope_empty() {
    let (mut id, _) = identity_obj("dev", "web", json!({"path": "web"}), "2026-01-01T00:00:00Z");
    id.metadata.deletion_timestamp = Some(crate::conditions::time(std::time::UNIX_EPOCH));
    let (client, server) = scripted(vec![]);
    let registrar = Arc::new(FakeRegistrar::default().with_scope(
        "Identity/dev/web",
        vec![entry(
            "spiffe://example.org/ns/dev/web",
            &["k8s:ns:dev", "k8s:sa:web"],
            &[],
            0,
        )],
    ));
    let (ctx, _) = context(client, registrar.clone(), false);
    assert_eq!(
        reconcile_identity(Arc::new(id), ctx).await.unwrap(),
        Action::await_change()
    );
    server.await.unwrap();
    assert_eq!(registrar.syncs(), [("Identity/dev/web".to_owned(), vec![])]);
    assert!(registrar.scopes.lock().unwrap().is_empty());
}

#[tokio::test]
async fn garbage_collection_empties_only_its_own_scopes_of_gone_objects() {
    let e = entry(
        "spiffe://example.org/ns/a/x",
        &["k8s:ns:a", "k8s:sa:x"],
        &[],
        0,
    );
    let registrar = Arc::new(
        FakeRegistrar::default()
            .with_scope("ClusterIdentity/gone", vec![e.clone()])
            .with_scope("ClusterIdentity/here", vec![e.clone()])
            .with_scope("Identity/a/gone", vec![e.clone()])
            .with_scope("Identity/a/here", vec![e.clone()])
            .with_scope("Something/else", vec![e.clone()]),
    );
    let (_, here_json) = identity_obj("a", "here", json!({"path": "x"}), "2026-01-01T00:00:00Z");
    let (client, server) = scripted(vec![
        Expect::get("/apis/signet.dev/v1alpha1/clusteridentities/gone")
            .not_found("clusteridentities", "gone"),
        Expect::get("/apis/signet.dev/v1alpha1/clusteridentities/here")
            .respond(cluster_identity().1),
        Expect::get("/apis/signet.dev/v1alpha1/namespaces/a/identities/gone")
            .not_found("identities", "gone"),
        Expect::get("/apis/signet.dev/v1alpha1/namespaces/a/identities/here").respond(here_json),
    ]);
    let (ctx, _) = context(client, registrar.clone(), false);
    let emptied = collect_garbage(&ctx).await.unwrap();
    drop(ctx);
    server.await.unwrap();
    assert_eq!(emptied, ["ClusterIdentity/gone", "Identity/a/gone"]);
    let left: Vec<String> = registrar.scopes.lock().unwrap().keys().cloned().collect();
    assert_eq!(
        left,
        ["ClusterIdentity/here", "Identity/a/here", "Something/else"]
    );
}

#[test]
fn scopes_parse_back() {
    assert_eq!(
        parse_scope("ClusterIdentity/web"),
        Some(Scope::Cluster("web".into()))
    );
    assert_eq!(
        parse_scope("Identity/a/web"),
        Some(Scope::Namespaced("a".into(), "web".into()))
    );
    for other in [
        "ClusterIdentity/",
        "Identity/a",
        "Identity/a/b/c",
        "Issuer/a/b",
        "x",
    ] {
        assert_eq!(parse_scope(other), None, "{other}");
    }
}

#[tokio::test]
async fn a_tenant_reports_its_namespaces_conflicts_and_entries() {
    let t_json = tenant("t1", json!({"namespaces": ["a", "shared"]}));
    let t: Tenant = serde_json::from_value(t_json.clone()).unwrap();
    let (client, server) = scripted(vec![
        Expect::get(TENANTS).respond(list(
            "signet.dev/v1alpha1",
            "Tenant",
            vec![
                t_json.clone(),
                tenant("t2", json!({"namespaces": ["shared"]})),
            ],
        )),
        Expect::get(CAPSULE_TENANTS).not_found("tenants.capsule.clastix.io", ""),
        Expect::get("/api/v1/namespaces").respond(list("v1", "Namespace", vec![])),
        Expect::patch("/apis/signet.dev/v1alpha1/tenants/t1/status")
            .respond_with(Stored::new(t_json).merge_patch()),
    ]);
    let e = entry(
        "spiffe://example.org/ns/a/x",
        &["k8s:ns:a", "k8s:sa:x"],
        &[],
        0,
    );
    let registrar = Arc::new(
        FakeRegistrar::default()
            .with_scope("Identity/a/x", vec![e.clone(), e.clone()])
            .with_scope("Identity/shared/y", vec![e.clone()])
            .with_scope("ClusterIdentity/z", vec![e]),
    );
    let (ctx, events) = context(client, registrar, false);
    reconcile_tenant(Arc::new(t), ctx).await.unwrap();
    let seen = server.await.unwrap();
    let st = &seen[3].body["status"];
    assert_eq!(st["namespaceCount"], 1);
    assert_eq!(st["entries"], 2);
    assert_eq!(st["conditions"][0]["reason"], "TenantConflict");
    assert_eq!(
        st["refusals"],
        json!([
            "TenantConflict: namespace shared is also claimed by Tenant t2: it belongs to neither"
        ])
    );
    assert!(events.all()[0].1.warning);
}

#[test]
fn status_refusals_are_bounded() {
    let plan = super::plan::Plan {
        entries: vec![],
        refusals: (0..25)
            .map(|i| super::plan::Refusal::new("WorkloadRefused", format!("r{i}")))
            .collect(),
    };
    let (st, ready) = next_status(None, &plan, Ok(0), Some(3), std::time::UNIX_EPOCH);
    let st = st.unwrap();
    assert_eq!(st.refusals.len(), super::crd::MAX_REFUSALS);
    assert!(ready.message.unwrap().contains("24 more"));
    assert_eq!(st.observed_generation, Some(3));
}

#[test]
fn crds_are_served_with_their_rules() {
    use kube::CustomResourceExt;
    let t = serde_json::to_value(Tenant::crd()).unwrap();
    assert_eq!(t["spec"]["scope"], "Cluster");
    let spec = &t["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        spec["x-kubernetes-validations"][0]["rule"],
        "has(self.capsuleTenant) != has(self.namespaces)"
    );
    let i = serde_json::to_value(Identity::crd()).unwrap();
    assert_eq!(i["spec"]["scope"], "Namespaced");
    let props =
        &i["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    // No trust domain, node set or federation on a namespaced Identity.
    for f in [
        "trustDomain",
        "nodeSet",
        "federatesWith",
        "spiffeIdTemplate",
    ] {
        assert!(props.get(f).is_none(), "{f}");
    }
    assert_eq!(
        props["path"]["x-kubernetes-validations"][0]["rule"],
        "!self.startsWith('/')"
    );
    assert_eq!(
        props["podSelector"]["x-kubernetes-validations"][0]["rule"],
        "!has(self.matchExpressions)"
    );
    let c = serde_json::to_value(ClusterIdentity::crd()).unwrap();
    assert_eq!(c["spec"]["scope"], "Cluster");
    assert_eq!(c["spec"]["group"], "signet.dev");
    assert_eq!(c["spec"]["versions"][0]["name"], "v1alpha1");
}

#[tokio::test]
async fn an_object_the_controller_no_longer_finds_is_emptied_once_confirmed_gone() {
    use kube::runtime::controller;
    use kube::runtime::reflector::ObjectRef;
    let e = entry(
        "spiffe://example.org/ns/dev/web",
        &["k8s:ns:dev", "k8s:sa:web"],
        &[],
        0,
    );
    let registrar = Arc::new(
        FakeRegistrar::default()
            .with_scope("Identity/dev/web", vec![e.clone()])
            .with_scope("ClusterIdentity/mesh", vec![e]),
    );
    let gone = |r: ObjectRef<kube::api::DynamicObject>| {
        Err::<(ObjectRef<Identity>, Action), _>(controller::Error::<
            Error,
            kube::runtime::watcher::Error,
        >::ObjectNotFound(Box::new(r)))
    };
    // Really gone: emptied. Still there (a store that lags): left alone.
    let (client, server) = scripted(vec![
        Expect::get("/apis/signet.dev/v1alpha1/namespaces/dev/identities/web")
            .not_found("identities", "web"),
        Expect::get("/apis/signet.dev/v1alpha1/clusteridentities/mesh")
            .respond(cluster_identity().1),
    ]);
    let (ctx, _) = context(client, registrar.clone(), false);
    super::after(
        gone(ObjectRef::<Identity>::new("web").within("dev").erase()),
        &ctx,
    )
    .await;
    super::after(
        gone(ObjectRef::<ClusterIdentity>::new("mesh").erase()),
        &ctx,
    )
    .await;
    drop(ctx);
    server.await.unwrap();
    assert_eq!(registrar.syncs(), [("Identity/dev/web".to_owned(), vec![])]);
    let left: Vec<String> = registrar.scopes.lock().unwrap().keys().cloned().collect();
    assert_eq!(left, ["ClusterIdentity/mesh"]);
}
