//! The Kubernetes bridge's standalone Certificate reconcilers against the real server: the
//! Kubernetes API is scripted (no API server runs here), the gRPC side is `signet-server` on
//! PostgreSQL with the bridge listed in `[policy.kubernetes_bridge]`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use signet_k8s::certificate::{self, Context, FixedSigner};
use signet_k8s::certmanager::Certificate;
use signet_k8s::signer::{Credentials, Signer, SignerConfig};
use signet_k8s::testing::{Expect, Stored, applied, not_found, scripted};
use signet_runtime::clock::SystemClock;
use signet_runtime::random::SystemRandom;
use signet_tests::*;

use crate::pg_server;

const BRIDGE: &str = "[policy.kubernetes_bridge]\ncallers = [\"spiffe://example.org/ns/signet-system/sa/signet-k8s\"]\n";

fn certificate(name: &str, uri: &str) -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": name, "namespace": "a", "uid": format!("uid-{name}"),
            "resourceVersion": "1", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "secretName": format!("{name}-tls"),
            "duration": "1h",
            "issuerRef": {"name": "signet", "kind": "ClusterIssuer", "group": "signet.dev"},
            "uris": [uri],
            "dnsNames": [format!("{name}.a.svc")],
        }
    })
}

async fn bridge_signer(
    server: &Server,
    tokens: &TokenIssuer,
    dir: &std::path::Path,
) -> Arc<FixedSigner> {
    let token = dir.join("token");
    std::fs::write(&token, tokens.token("signet-system", "signet-k8s")).unwrap();
    let signer = Signer::connect(&SignerConfig {
        target: server.target(),
        credentials: Credentials::TokenFile(token),
    })
    .await
    .unwrap();
    Arc::new(FixedSigner(signer))
}

/// One reconcile of `obj` with a scripted API: Secret GET (404), then `patches` requests.
async fn reconcile(
    obj: &Value,
    signer: Arc<FixedSigner>,
    with_apply: bool,
) -> Vec<signet_k8s::testing::Received> {
    let name = obj["metadata"]["name"].as_str().unwrap();
    let secret = format!("/api/v1/namespaces/a/secrets/{name}-tls");
    let status = format!("/apis/cert-manager.io/v1/namespaces/a/certificates/{name}/status?");
    let stored = Stored::new(obj.clone());
    let mut script = vec![
        Expect::reply(
            "GET",
            secret.clone(),
            404,
            not_found("secrets", &format!("{name}-tls")),
        ),
        Expect::exchange("PATCH", status.clone(), stored.merge_patch()),
    ];
    if with_apply {
        script.push(Expect::exchange(
            "PATCH",
            format!("{secret}?&fieldManager=signet-k8s"),
            applied("s1"),
        ));
    }
    script.push(Expect::exchange(
        "PATCH",
        status.clone(),
        stored.merge_patch(),
    ));
    script.push(Expect::exchange("PATCH", status, stored.merge_patch()));
    let (client, server) = scripted(script);
    let cert: Certificate = serde_json::from_value(obj.clone()).unwrap();
    let ctx = Arc::new(Context {
        client,
        signer,
        clock: Arc::new(SystemClock),
        random: Arc::new(SystemRandom::default()),
        peers: certificate::store_of([cert.clone()]),
        owner_ref: false,
        events: Arc::new(signet_k8s::events::NoEvents),
        bundle: tokio::sync::watch::channel(None).1,
    });
    certificate::reconcile(Arc::new(cert), ctx).await.unwrap();
    server.await.unwrap()
}

#[tokio::test]
async fn k8s_certificate_in_namespace_a_gets_a_verifiable_secret() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, BRIDGE).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let signer = bridge_signer(&server, &tokens, dir.path()).await;

    let seen = reconcile(
        &certificate("web", "spiffe://example.org/ns/a/sa/web"),
        signer.clone(),
        true,
    )
    .await;
    let body = &seen[2].body;
    let data = |k: &str| {
        String::from_utf8(STANDARD.decode(body["data"][k].as_str().unwrap()).unwrap()).unwrap()
    };
    assert_eq!(body["type"], "kubernetes.io/tls");
    let chain: Vec<String> = signet_types::pem::parse_certs(data("tls.crt").as_bytes())
        .unwrap()
        .iter()
        .map(|d| signet_types::pem::cert_to_pem(d))
        .chain([data("ca.crt")])
        .collect();
    assert_eq!(uri_sans(&chain[0]), ["spiffe://example.org/ns/a/sa/web"]);
    openssl_verify(&chain, &server.bundle_pem).unwrap();
    assert_eq!(
        signet_types::pem::parse_certs(data("ca.crt").as_bytes()).unwrap(),
        signet_types::pem::parse_certs(&server.bundle_pem).unwrap()
    );
    assert!(data("tls.key").starts_with("-----BEGIN EC PRIVATE KEY-----"));

    let ready = &seen[4].body["status"];
    assert_eq!(ready["conditions"][0]["type"], "Ready");
    assert_eq!(ready["conditions"][0]["status"], "True", "{ready}");
    let not_after = humantime::parse_rfc3339(ready["notAfter"].as_str().unwrap()).unwrap();
    let left = not_after.duration_since(SystemTime::now()).unwrap();
    assert!(left <= Duration::from_secs(3600 + 60), "{left:?}");
    assert_eq!(seen[3].body["status"]["revision"], 1);
}

#[tokio::test]
async fn k8s_certificate_for_another_namespace_fails_with_the_reason() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, BRIDGE).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let signer = bridge_signer(&server, &tokens, dir.path()).await;

    let seen = reconcile(
        &certificate("evil", "spiffe://example.org/ns/b/sa/web"),
        signer,
        false,
    )
    .await;
    let issuing = &seen[2].body["status"];
    assert_eq!(issuing["failedIssuanceAttempts"], 1);
    assert_eq!(issuing["conditions"][0]["type"], "Issuing");
    assert_eq!(issuing["conditions"][0]["status"], "False");
    let ready = &seen[3].body["status"]["conditions"][1];
    assert_eq!(ready["type"], "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "Failed");
    let msg = ready["message"].as_str().unwrap();
    assert!(msg.contains("PermissionDenied"), "{msg}");
    assert!(
        msg.contains("spiffe://example.org/ns/b/sa/web") || msg.contains("namespace"),
        "{msg}"
    );
}

#[tokio::test]
async fn k8s_citadel_secret_and_root_configmap_from_the_real_server() {
    use signet_k8s::citadel;
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, BRIDGE).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let signer = bridge_signer(&server, &tokens, dir.path()).await;

    // The bundle, from the server's WatchBundle stream.
    let (tx, mut rx) = tokio::sync::watch::channel(None);
    let channel = server.channel().await;
    let watcher = tokio::spawn(citadel::watch_bundle(
        channel,
        Some(dir.path().join("token")),
        tx,
    ));
    tokio::time::timeout(Duration::from_secs(30), rx.wait_for(Option::is_some))
        .await
        .unwrap()
        .unwrap();
    let bundle = rx.borrow().clone().unwrap();
    assert_eq!(bundle.trust_domain, "example.org");

    // istio-ca-root-cert in a labelled namespace.
    let cm = "/api/v1/namespaces/mesh/configmaps/istio-ca-root-cert";
    let (client, api) = scripted(vec![
        Expect::reply(
            "GET",
            cm,
            404,
            not_found("configmaps", "istio-ca-root-cert"),
        ),
        Expect::exchange(
            "PATCH",
            format!("{cm}?&fieldManager=signet-k8s"),
            applied("cm1"),
        ),
    ]);
    citadel::reconcile_root_configmap(&client, "mesh", &bundle)
        .await
        .unwrap();
    let seen = api.await.unwrap();
    let root = seen[1].body["data"]["root-cert.pem"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        signet_types::pem::parse_certs(root.as_bytes()).unwrap(),
        signet_types::pem::parse_certs(&server.bundle_pem).unwrap()
    );

    // istio.<sa> for a ServiceAccount.
    let sa: k8s_openapi::api::core::v1::ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "web", "namespace": "mesh", "uid": "sa-1", "resourceVersion": "5"}
    }))
    .unwrap();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "mesh", "labels": {"signet.dev/citadel": "enabled"}}});
    let secret = "/api/v1/namespaces/mesh/secrets/istio.web";
    let (client, api) = scripted(vec![
        Expect::reply("GET", "/api/v1/namespaces/mesh", 200, ns),
        Expect::reply("GET", secret, 404, not_found("secrets", "istio.web")),
        Expect::exchange(
            "PATCH",
            format!("{secret}?&fieldManager=signet-k8s"),
            applied("s1"),
        ),
    ]);
    let ctx = Arc::new(citadel::Context {
        client,
        signer,
        clock: Arc::new(SystemClock),
        random: Arc::new(SystemRandom::default()),
        bundle: rx.clone(),
    });
    citadel::reconcile_service_account(Arc::new(sa), ctx)
        .await
        .unwrap();
    let seen = api.await.unwrap();
    let body = &seen[2].body;
    assert_eq!(body["type"], "istio.io/key-and-cert");
    let data = |k: &str| {
        String::from_utf8(STANDARD.decode(body["data"][k].as_str().unwrap()).unwrap()).unwrap()
    };
    let chain: Vec<String> = signet_types::pem::parse_certs(data("cert-chain.pem").as_bytes())
        .unwrap()
        .iter()
        .map(|d| signet_types::pem::cert_to_pem(d))
        .chain([data("root-cert.pem")])
        .collect();
    assert_eq!(uri_sans(&chain[0]), ["spiffe://example.org/ns/mesh/sa/web"]);
    openssl_verify(&chain, &server.bundle_pem).unwrap();
    watcher.abort();
}

/// The trust bundle ConfigMap (`--bundle-configmap`) follows the real server's roots: left
/// alone while they are the ones installed, rewritten with both roots once a new root is
/// prepared (published before it signs), byte for byte the server's bundle.
#[tokio::test]
async fn k8s_bundle_configmap_follows_a_root_rotation_of_the_real_server() {
    use signet_k8s::{bundle_configmap, citadel};
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, BRIDGE).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("token"),
        tokens.token("signet-system", "signet-k8s"),
    )
    .unwrap();
    let (tx, rx) = tokio::sync::watch::channel(None);
    let watcher = tokio::spawn(citadel::watch_bundle(
        server.channel().await,
        Some(dir.path().join("token")),
        tx,
    ));
    let installed = |roots: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "signet-bundle", "namespace": "signet-system", "uid": "cm-1",
                "resourceVersion": "3"},
            "data": {"ca.crt": roots}})
    };
    let first = String::from_utf8(server.bundle_pem.clone()).unwrap();
    let cm = "/api/v1/namespaces/signet-system/configmaps/signet-bundle";
    let (client, api) = scripted(vec![
        // The first bundle: the installed roots, nothing written.
        Expect::reply("GET", cm, 200, installed(&first)),
        // After the rotation: rewritten.
        Expect::reply("GET", cm, 200, installed(&first)),
        Expect::exchange(
            "PATCH",
            format!("{cm}?&force=true&fieldManager=signet-k8s"),
            applied("cm-1"),
        ),
    ]);
    let mut first_seen = rx.clone();
    let run = tokio::spawn(bundle_configmap::run(
        client,
        "signet-system".into(),
        "signet-bundle".into(),
        rx,
    ));
    tokio::time::timeout(
        Duration::from_secs(30),
        first_seen.wait_for(Option::is_some),
    )
    .await
    .unwrap()
    .unwrap();
    let out = server.signetctl(&["ca", "prepare", "--root"]);
    assert!(out.status.success(), "{out:?}");
    let seen = tokio::time::timeout(Duration::from_secs(30), api)
        .await
        .expect("the ConfigMap is rewritten after the rotation")
        .unwrap();
    let written = seen[2].body["data"]["ca.crt"].as_str().unwrap().to_owned();
    let now_served = std::fs::read(server.bundle_path()).unwrap();
    assert_eq!(
        signet_types::pem::parse_certs(written.as_bytes())
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        signet_types::pem::parse_certs(written.as_bytes()).unwrap(),
        signet_types::pem::parse_certs(&now_served).unwrap()
    );
    run.abort();
    watcher.abort();
}
