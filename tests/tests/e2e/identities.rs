//! The bridge's identity objects against the real server (PostgreSQL, the real binary): an
//! Identity reconciled against a scripted API server becomes the bridge's owned entries under
//! the node set, over its authenticated connection; an entry the server refuses is reported
//! `ServerRefused` and nothing is written; the garbage collection empties the scope of a
//! deleted Identity.

use std::sync::Arc;

use serde_json::{Value, json};
use signet_k8s::identity::crd::{ClusterIdentity, Identity};
use signet_k8s::identity::plan::Env;
use signet_k8s::identity::reconcile::{
    IdentityContext, collect_garbage, reconcile_cluster_identity, reconcile_identity,
};
use signet_k8s::identity::registrar::{GrpcRegistrar, Registrar};
use signet_k8s::testing::{Expect, RecordedEvents, Stored, TestBridge, object, scripted};
use signet_runtime::clock::SystemClock;
use signet_tests::*;
use sqlx::Connection;

const BRIDGE_ID: &str = "spiffe://example.org/ns/signet-system/sa/signet-k8s";

fn toml() -> String {
    format!(
        "[policy.kubernetes_bridge]\ncallers = [\"{BRIDGE_ID}\"]\nnode_sets = [\"k8s\"]\n\
         dns_templates = [\"*.{{namespace}}.svc\"]\n"
    )
}

fn list(api_version: &str, kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": format!("{kind}List"),
        "metadata": {"resourceVersion": "1"}, "items": items})
}

fn namespace(name: &str) -> Value {
    object(
        "v1",
        "Namespace",
        None,
        name,
        "1",
        json!({"metadata": {"labels": {"kubernetes.io/metadata.name": name}}}),
    )
}

fn pod(ns: &str, name: &str, sa: &str) -> Value {
    object(
        "v1",
        "Pod",
        Some(ns),
        name,
        "1",
        json!({"spec": {"serviceAccountName": sa, "containers": [{"name": "app", "image": "app"}]},
               "status": {"phase": "Running"}}),
    )
}

fn env() -> Env {
    Env {
        trust_domain: "example.org".parse().unwrap(),
        node_set: signet_types::node_set::NodeSetName::new("k8s").unwrap(),
        without_tenant: false,
    }
}

/// The reconcilers' context over a scripted API server's client (a macro: this crate does
/// not name kube's types).
macro_rules! context {
    ($client:expr, $registrar:expr) => {
        Arc::new(IdentityContext::new(
            $client,
            $registrar,
            env(),
            Arc::new(SystemClock),
            Arc::new(RecordedEvents::default()),
        ))
    };
}

#[tokio::test]
async fn identities_become_the_bridges_entries_on_the_server() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: toml(),
        ..ServerOpts::default()
    })
    .await;
    let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO node_sets (name, selectors, created_at) \
         VALUES ('k8s', '[\"signet:attestation:k8s_psat\"]', 1)",
    )
    .execute(&mut db)
    .await
    .unwrap();
    let operator = TestBridge::new(
        &format!("https://{}", server.grpc),
        &server.bundle_pem,
        &server.trust_domain,
        &tokens.token("signet-system", "signet-k8s"),
    )
    .with_server_name("localhost");
    let registrar: Arc<dyn Registrar> = Arc::new(GrpcRegistrar::new(operator.config.clone()));

    // An Identity of team-a, in Tenant team-a.
    let id_json = object(
        "signet.dev/v1alpha1",
        "Identity",
        Some("team-a"),
        "web",
        "1",
        json!({"spec": {"path": "sa/{serviceAccount}", "dnsNames": ["web.team-a.svc"], "ttl": "1h"}}),
    );
    let tenant = object(
        "signet.dev/v1alpha1",
        "Tenant",
        None,
        "team-a",
        "1",
        json!({"spec": {"namespaces": ["team-a"]}}),
    );
    let (client, api) = scripted(vec![
        Expect::get("/apis/signet.dev/v1alpha1/tenants").respond(list(
            "signet.dev/v1alpha1",
            "Tenant",
            vec![tenant],
        )),
        Expect::get("/apis/capsule.clastix.io/v1beta2/tenants")
            .not_found("tenants.capsule.clastix.io", ""),
        Expect::get("/api/v1/namespaces").respond(list(
            "v1",
            "Namespace",
            vec![namespace("team-a")],
        )),
        Expect::get("/api/v1/namespaces/team-a/pods").respond(list(
            "v1",
            "Pod",
            vec![pod("team-a", "web-1", "web")],
        )),
        Expect::patch("/apis/signet.dev/v1alpha1/namespaces/team-a/identities/web/status")
            .respond_with(Stored::new(id_json.clone()).merge_patch()),
    ]);
    let identity: Identity = serde_json::from_value(id_json).unwrap();
    reconcile_identity(Arc::new(identity), context!(client, registrar.clone()))
        .await
        .unwrap();
    let seen = api.await.unwrap();
    let status = &seen[4].body["status"];
    assert_eq!(status["conditions"][0]["reason"], "Synced", "{status}");
    assert_eq!(status["entries"], 1);

    let records = registrar.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].scope, "Identity/team-a/web");
    let e = &records[0].entry;
    assert_eq!(e.spiffe_id, "spiffe://example.org/ns/team-a/sa/web");
    assert_eq!(e.node_set, "k8s");
    assert_eq!(e.selectors, ["k8s:ns:team-a", "k8s:sa:web"]);
    assert_eq!(e.dns_names, ["web.team-a.svc"]);
    assert_eq!(e.ttl_seconds, 3600);
    let out = server.signetctl(&["entry", "list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("spiffe://example.org/signet/nodeset/k8s"),
        "{listed}"
    );
    assert!(listed.contains(BRIDGE_ID), "{listed}");

    // A ClusterIdentity whose IDs leave /ns/<namespace>/: the bridge lets it through (it is
    // the platform team's), the server refuses it, the status says so, nothing is written.
    let ci_json = object(
        "signet.dev/v1alpha1",
        "ClusterIdentity",
        None,
        "apps",
        "1",
        json!({"spec": {"spiffeIdTemplate": "spiffe://{trustDomain}/apps/{namespace}/{serviceAccount}"}}),
    );
    let (client, api) = scripted(vec![
        Expect::get("/api/v1/namespaces").respond(list(
            "v1",
            "Namespace",
            vec![namespace("team-a")],
        )),
        Expect::get("/api/v1/pods").respond(list("v1", "Pod", vec![pod("team-a", "web-1", "web")])),
        Expect::patch("/apis/signet.dev/v1alpha1/clusteridentities/apps/status")
            .respond_with(Stored::new(ci_json.clone()).merge_patch()),
    ]);
    let ci: ClusterIdentity = serde_json::from_value(ci_json).unwrap();
    reconcile_cluster_identity(Arc::new(ci), context!(client, registrar.clone()))
        .await
        .unwrap();
    let seen = api.await.unwrap();
    let cond = &seen[2].body["status"]["conditions"][0];
    assert_eq!(cond["reason"], "ServerRefused", "{cond}");
    assert!(
        cond["message"]
            .as_str()
            .unwrap()
            .contains("PermissionDenied"),
        "{cond}"
    );
    assert_eq!(registrar.list().await.unwrap().len(), 1);

    // The Identity is deleted: the garbage collection empties its scope.
    let (client, api) = scripted(vec![
        Expect::get("/apis/signet.dev/v1alpha1/namespaces/team-a/identities/web")
            .not_found("identities", "web"),
    ]);
    let ctx = context!(client, registrar.clone());
    let emptied = collect_garbage(&ctx).await.unwrap();
    drop(ctx);
    api.await.unwrap();
    assert_eq!(emptied, ["Identity/team-a/web"]);
    assert!(registrar.list().await.unwrap().is_empty());
}
