//! Citadel mode against a scripted API server: the Secret and ConfigMap apply bodies and
//! queries, and the delete when a ServiceAccount goes away.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::*;
use crate::backoff::FixedRandom;
use crate::certificate::tests::FakeSigner;
use crate::clock::FakeClock;
use crate::test_api::{Exchange, applied, not_found, scripted};

const T0: u64 = 1_767_225_600;
const NS_URI: &str = "/api/v1/namespaces/mesh";
const SECRET_URI: &str = "/api/v1/namespaces/mesh/secrets/istio.web";
const CM_URI: &str = "/api/v1/namespaces/mesh/configmaps/istio-ca-root-cert";
const ROOT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

fn namespace(labelled: bool) -> Value {
    let mut ns = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "mesh", "uid": "ns-1", "resourceVersion": "3",
            "creationTimestamp": "2025-12-01T00:00:00Z",
            "labels": {"kubernetes.io/metadata.name": "mesh"}},
        "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}
    });
    if labelled {
        ns["metadata"]["labels"]["signet.dev/citadel"] = json!("enabled");
    }
    ns
}

fn service_account() -> ServiceAccount {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "web", "namespace": "mesh", "uid": "sa-uid-1",
            "resourceVersion": "42", "creationTimestamp": "2025-12-01T00:00:00Z"}
    }))
    .unwrap()
}

fn bundle(roots: &str) -> watch::Receiver<Option<BundleInfo>> {
    let (tx, rx) = watch::channel(Some(BundleInfo {
        trust_domain: "example.org".into(),
        roots_pem: roots.into(),
        revision: 1,
    }));
    std::mem::forget(tx);
    rx
}

fn context(client: Client, signer: Arc<FakeSigner>, clock: FakeClock, roots: &str) -> Arc<Context> {
    Arc::new(Context {
        client,
        signer,
        clock: Arc::new(clock),
        random: Arc::new(FixedRandom(0.0)),
        bundle: bundle(roots),
    })
}

fn decode(body: &Value, key: &str) -> String {
    String::from_utf8(
        STANDARD
            .decode(body["data"][key].as_str().unwrap())
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn service_account_gets_an_istio_secret() {
    let clock = FakeClock::at_unix(T0);
    let signer = Arc::new(FakeSigner::new(
        clock.clone(),
        Duration::from_secs(24 * 3600),
    ));
    let (client, server) = scripted(vec![
        Exchange::reply("GET", NS_URI, 200, namespace(true)),
        Exchange::reply("GET", SECRET_URI, 404, not_found("secrets", "istio.web")),
        Exchange::new(
            "PATCH",
            format!("{SECRET_URI}?&fieldManager=signet-k8s"),
            applied("s1"),
        ),
    ]);
    let ctx = context(client, signer.clone(), clock, ROOT);
    let action = reconcile_service_account(Arc::new(service_account()), ctx)
        .await
        .unwrap();
    let seen = server.await.unwrap();
    let body = &seen[2].body;
    let chain = decode(body, "cert-chain.pem");
    let key = decode(body, "key.pem");
    assert_eq!(
        *body,
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "istio.io/key-and-cert",
            "metadata": {
                "name": "istio.web", "namespace": "mesh",
                "labels": {"signet.dev/managed-by": "signet-k8s"},
                "annotations": {"istio.io/service-account.name": "web",
                    "signet.dev/renewal-time": "2026-01-01T16:00:00Z"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "ServiceAccount", "name": "web",
                    "uid": "sa-uid-1", "controller": true}]
            },
            "data": {
                "cert-chain.pem": STANDARD.encode(&chain),
                "key.pem": STANDARD.encode(&key),
                "root-cert.pem": STANDARD.encode(ROOT),
            }
        })
    );
    let c = crate::certificate::policy::IssuedCert::parse(chain.as_bytes()).unwrap();
    assert_eq!(c.uris, ["spiffe://example.org/ns/mesh/sa/web"]);
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    assert_eq!(*signer.calls.lock().unwrap(), [("mesh".to_owned(), None)]);
    assert_eq!(action, Action::requeue(Duration::from_secs(3600)));

    // Current: nothing written; renewal is scheduled.
    let secret = applied("s1")(body).1;
    let clock = FakeClock::at_unix(T0 + 60);
    let (client, server) = scripted(vec![
        Exchange::reply("GET", NS_URI, 200, namespace(true)),
        Exchange::reply("GET", SECRET_URI, 200, secret.clone()),
    ]);
    let ctx = context(client, signer.clone(), clock, ROOT);
    reconcile_service_account(Arc::new(service_account()), ctx)
        .await
        .unwrap();
    assert_eq!(server.await.unwrap().len(), 2);

    // The root changed: the same certificate and key, the new root, forced over our own Secret.
    let clock = FakeClock::at_unix(T0 + 60);
    let new_root = "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n";
    let (client, server) = scripted(vec![
        Exchange::reply("GET", NS_URI, 200, namespace(true)),
        Exchange::reply("GET", SECRET_URI, 200, secret.clone()),
        Exchange::new(
            "PATCH",
            format!("{SECRET_URI}?&force=true&fieldManager=signet-k8s"),
            applied("s1"),
        ),
    ]);
    let ctx = context(client, signer.clone(), clock, new_root);
    reconcile_service_account(Arc::new(service_account()), ctx)
        .await
        .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(decode(&seen[2].body, "root-cert.pem"), new_root);
    assert_eq!(decode(&seen[2].body, "cert-chain.pem"), chain);

    // At the renewal time: a new certificate.
    let clock = FakeClock::at_unix(T0 + 16 * 3600);
    let (client, server) = scripted(vec![
        Exchange::reply("GET", NS_URI, 200, namespace(true)),
        Exchange::reply("GET", SECRET_URI, 200, secret),
        Exchange::new(
            "PATCH",
            format!("{SECRET_URI}?&force=true&fieldManager=signet-k8s"),
            applied("s1"),
        ),
    ]);
    let ctx = context(client, signer.clone(), clock, ROOT);
    reconcile_service_account(Arc::new(service_account()), ctx)
        .await
        .unwrap();
    let seen = server.await.unwrap();
    assert_ne!(decode(&seen[2].body, "cert-chain.pem"), chain);
    assert_eq!(signer.calls.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn namespaces_without_the_label_are_left_alone() {
    let clock = FakeClock::at_unix(T0);
    let signer = Arc::new(FakeSigner::new(clock.clone(), Duration::from_secs(3600)));
    let (client, server) = scripted(vec![Exchange::reply("GET", NS_URI, 200, namespace(false))]);
    let action = reconcile_service_account(
        Arc::new(service_account()),
        context(client, signer.clone(), clock, ROOT),
    )
    .await
    .unwrap();
    assert_eq!(server.await.unwrap().len(), 1);
    assert_eq!(action, Action::requeue(NAMESPACE_RECHECK));
    assert!(signer.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_foreign_secret_with_the_name_is_not_touched() {
    let clock = FakeClock::at_unix(T0);
    let signer = Arc::new(FakeSigner::new(clock.clone(), Duration::from_secs(3600)));
    let foreign = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "istio.web", "namespace": "mesh", "uid": "f1"}, "data": {"x": "eA=="}});
    let (client, server) = scripted(vec![
        Exchange::reply("GET", NS_URI, 200, namespace(true)),
        Exchange::reply("GET", SECRET_URI, 200, foreign),
    ]);
    reconcile_service_account(
        Arc::new(service_account()),
        context(client, signer.clone(), clock, ROOT),
    )
    .await
    .unwrap();
    assert_eq!(server.await.unwrap().len(), 2);
    assert!(signer.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn root_configmap_is_written_and_updated_on_bundle_change() {
    let b = |roots: &str, revision| BundleInfo {
        trust_domain: "example.org".into(),
        roots_pem: roots.into(),
        revision,
    };
    let (client, server) = scripted(vec![
        Exchange::reply(
            "GET",
            CM_URI,
            404,
            not_found("configmaps", "istio-ca-root-cert"),
        ),
        Exchange::new(
            "PATCH",
            format!("{CM_URI}?&fieldManager=signet-k8s"),
            applied("cm1"),
        ),
    ]);
    reconcile_root_configmap(&client, "mesh", &b(ROOT, 1))
        .await
        .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        seen[1].body,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "istio-ca-root-cert", "namespace": "mesh",
                "labels": {"signet.dev/managed-by": "signet-k8s", "istio.io/config": "true"}},
            "data": {"root-cert.pem": ROOT}
        })
    );
    let current = applied("cm1")(&seen[1].body).1;

    // Same bundle: read only.
    let (client, server) = scripted(vec![Exchange::reply("GET", CM_URI, 200, current.clone())]);
    reconcile_root_configmap(&client, "mesh", &b(ROOT, 1))
        .await
        .unwrap();
    assert_eq!(server.await.unwrap().len(), 1);

    // A new root: applied again.
    let both = format!("{ROOT}-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n");
    let (client, server) = scripted(vec![
        Exchange::reply("GET", CM_URI, 200, current),
        Exchange::new(
            "PATCH",
            format!("{CM_URI}?&fieldManager=signet-k8s"),
            applied("cm1"),
        ),
    ]);
    reconcile_root_configmap(&client, "mesh", &b(&both, 2))
        .await
        .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(seen[1].body["data"]["root-cert.pem"], json!(both));
}

#[test]
fn plan_reads_the_namespace_label_and_names() {
    let ns: Namespace = serde_json::from_value(namespace(true)).unwrap();
    assert!(plan::citadel_enabled(&ns));
    let ns: Namespace = serde_json::from_value(namespace(false)).unwrap();
    assert!(!plan::citadel_enabled(&ns));
    assert_eq!(plan::secret_name("web"), "istio.web");
    assert_eq!(
        plan::spiffe_id("td", "mesh", "web"),
        "spiffe://td/ns/mesh/sa/web"
    );
}
