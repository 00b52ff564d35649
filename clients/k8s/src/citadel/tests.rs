//! Citadel mode against a scripted API server: the Secret and ConfigMap apply bodies and
//! queries, and the delete when a ServiceAccount goes away.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::*;
use crate::certificate::tests::FakeSigner;
use crate::testing::{Expect, applied, not_found, scripted};
use signet_runtime::clock::FakeClock;
use signet_runtime::random::FixedRandom;

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
        ..Default::default()
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
        Expect::reply("GET", NS_URI, 200, namespace(true)),
        Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "istio.web")),
        Expect::exchange(
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
        Expect::reply("GET", NS_URI, 200, namespace(true)),
        Expect::reply("GET", SECRET_URI, 200, secret.clone()),
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
        Expect::reply("GET", NS_URI, 200, namespace(true)),
        Expect::reply("GET", SECRET_URI, 200, secret.clone()),
        Expect::exchange(
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
        Expect::reply("GET", NS_URI, 200, namespace(true)),
        Expect::reply("GET", SECRET_URI, 200, secret),
        Expect::exchange(
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
    let (client, server) = scripted(vec![Expect::reply("GET", NS_URI, 200, namespace(false))]);
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
        Expect::reply("GET", NS_URI, 200, namespace(true)),
        Expect::reply("GET", SECRET_URI, 200, foreign),
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
        ..Default::default()
    };
    let (client, server) = scripted(vec![
        Expect::reply(
            "GET",
            CM_URI,
            404,
            not_found("configmaps", "istio-ca-root-cert"),
        ),
        Expect::exchange(
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
    let (client, server) = scripted(vec![Expect::reply("GET", CM_URI, 200, current.clone())]);
    reconcile_root_configmap(&client, "mesh", &b(ROOT, 1))
        .await
        .unwrap();
    assert_eq!(server.await.unwrap().len(), 1);

    // A new root: applied again.
    let both = format!("{ROOT}-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n");
    let (client, server) = scripted(vec![
        Expect::reply("GET", CM_URI, 200, current),
        Expect::exchange(
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

// --- taints and CRLs -------------------------------------------------------------------------

fn context_with(
    client: Client,
    signer: Arc<FakeSigner>,
    clock: FakeClock,
    bundle: BundleInfo,
) -> Arc<Context> {
    let (tx, rx) = watch::channel(Some(bundle));
    std::mem::forget(tx);
    Arc::new(Context {
        client,
        signer,
        clock: Arc::new(clock),
        random: Arc::new(FixedRandom(0.0)),
        bundle: rx,
    })
}

fn bundle_with(tainted: &[String], crls: &[(String, Vec<u8>)]) -> BundleInfo {
    BundleInfo {
        trust_domain: "example.org".into(),
        roots_pem: ROOT.into(),
        revision: 2,
        revocations: crate::revocation::Revocations::new(
            tainted.iter().map(String::as_str),
            crls.iter().map(|(k, d)| (k.as_str(), d.as_slice())),
        ),
    }
}

fn leaf_serial(chain_pem: &str) -> Vec<u8> {
    signet_pki::ParsedCert::from_pem_first(chain_pem.as_bytes())
        .unwrap()
        .serial()
        .to_vec()
}

/// One reconcile at `now` of the ServiceAccount whose Secret is `secret`, expecting a new
/// certificate: the applied body.
async fn reissued(
    signer: &Arc<FakeSigner>,
    secret: &Value,
    now: u64,
    bundle: BundleInfo,
) -> (Value, Action) {
    let (client, server) = scripted(vec![
        Expect::reply("GET", NS_URI, 200, namespace(true)),
        Expect::reply("GET", SECRET_URI, 200, secret.clone()),
        Expect::exchange(
            "PATCH",
            format!("{SECRET_URI}?&force=true&fieldManager=signet-k8s"),
            applied("s1"),
        ),
    ]);
    let ctx = context_with(client, signer.clone(), FakeClock::at_unix(now), bundle);
    let action = reconcile_service_account(Arc::new(service_account()), ctx)
        .await
        .unwrap();
    let seen = server.await.unwrap();
    (applied("s1")(&seen[2].body).1, action)
}

/// One reconcile at `now` expecting nothing written.
async fn left_alone(
    signer: &Arc<FakeSigner>,
    secret: &Value,
    now: u64,
    bundle: BundleInfo,
) -> Action {
    let (client, server) = scripted(vec![
        Expect::reply("GET", NS_URI, 200, namespace(true)),
        Expect::reply("GET", SECRET_URI, 200, secret.clone()),
    ]);
    let ctx = context_with(client, signer.clone(), FakeClock::at_unix(now), bundle);
    let action = reconcile_service_account(Arc::new(service_account()), ctx)
        .await
        .unwrap();
    assert_eq!(server.await.unwrap().len(), 2, "read only");
    action
}

#[tokio::test]
async fn a_secret_under_a_tainted_key_is_reissued_now_with_backoff_then_a_revoked_one() {
    let clock = FakeClock::at_unix(T0);
    let signer = Arc::new(FakeSigner::new(
        clock.clone(),
        Duration::from_secs(24 * 3600),
    ));
    // A current Secret, issued at T0.
    let (client, server) = scripted(vec![
        Expect::reply("GET", NS_URI, 200, namespace(true)),
        Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "istio.web")),
        Expect::exchange(
            "PATCH",
            format!("{SECRET_URI}?&fieldManager=signet-k8s"),
            applied("s1"),
        ),
    ]);
    reconcile_service_account(
        Arc::new(service_account()),
        context(client, signer.clone(), clock, ROOT),
    )
    .await
    .unwrap();
    let secret = applied("s1")(&server.await.unwrap()[2].body).1;
    let chain0 = decode(&secret, "cert-chain.pem");
    assert_eq!(signer.calls.lock().unwrap().len(), 1);
    left_alone(&signer, &secret, T0 + 60, bundle_with(&[], &[])).await;

    // The server's bundle taints the key that signed it (and the server still signs with it):
    // re-issued at once, not at 16 h; the Secret says it came back compromised and when to
    // try again (5 s × [½, 1] with jitter 0: 2.5 s, rounded up to whole seconds).
    let tainted = bundle_with(&[signer.key_id()], &[]);
    let (s1, action) = reissued(&signer, &secret, T0 + 60, tainted.clone()).await;
    assert_ne!(decode(&s1, "cert-chain.pem"), chain0);
    let ann = &s1["metadata"]["annotations"];
    assert_eq!(ann["signet.dev/compromised-reissues"], json!("1"));
    assert_eq!(
        ann["signet.dev/reissue-after"],
        json!("2026-01-01T00:01:03Z")
    );
    assert_eq!(action, Action::requeue(Duration::from_secs(3)));
    // Not again before then: no loop.
    let action = left_alone(&signer, &s1, T0 + 61, tainted.clone()).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(2)));
    // Then again, waiting longer (10 s × ½).
    let (s2, _) = reissued(&signer, &s1, T0 + 63, tainted.clone()).await;
    let ann = &s2["metadata"]["annotations"];
    assert_eq!(ann["signet.dev/compromised-reissues"], json!("2"));
    assert_eq!(
        ann["signet.dev/reissue-after"],
        json!("2026-01-01T00:01:08Z")
    );
    assert_eq!(signer.calls.lock().unwrap().len(), 3);

    // The taint is lifted: the certificate stands (until its usual renewal).
    left_alone(&signer, &s2, T0 + 70, bundle_with(&[], &[])).await;

    // A CRL lists its serial: re-issued at once; the new one is clean, so no retry annotations.
    let crl = signer.crl(1, &[leaf_serial(&decode(&s2, "cert-chain.pem"))]);
    let revoked = bundle_with(&[], &[(signer.key_id(), crl)]);
    assert!(
        revoked
            .revocations
            .check_pem(decode(&s2, "cert-chain.pem").as_bytes())
            .is_some_and(|w| w.contains("revoked")),
    );
    let (s3, action) = reissued(&signer, &s2, T0 + 80, revoked.clone()).await;
    assert_ne!(decode(&s3, "cert-chain.pem"), decode(&s2, "cert-chain.pem"));
    let ann = s3["metadata"]["annotations"].as_object().unwrap();
    assert!(
        !ann.contains_key("signet.dev/compromised-reissues"),
        "{ann:?}"
    );
    assert!(!ann.contains_key("signet.dev/reissue-after"), "{ann:?}");
    assert_eq!(action, Action::requeue(Duration::from_secs(3600)));
    left_alone(&signer, &s3, T0 + 81, revoked).await;
    assert_eq!(signer.calls.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn ca_crl_pem_is_written_to_the_root_configmap_and_follows_the_crls() {
    let signer = FakeSigner::new(FakeClock::at_unix(T0), Duration::from_secs(3600));
    let (crl1, crl2) = (
        signer.crl(1, &[vec![7]]),
        signer.crl(2, &[vec![7], vec![8]]),
    );
    let pem_of = |der: &[u8]| {
        pem::encode_config(
            &pem::Pem::new("X509 CRL", der.to_vec()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        )
    };
    let patch = || {
        Expect::exchange(
            "PATCH",
            format!("{CM_URI}?&fieldManager=signet-k8s"),
            applied("cm1"),
        )
    };
    // With a CRL: both keys.
    let b1 = bundle_with(&[], &[(signer.key_id(), crl1.clone())]);
    let (client, server) = scripted(vec![
        Expect::reply(
            "GET",
            CM_URI,
            404,
            not_found("configmaps", "istio-ca-root-cert"),
        ),
        patch(),
    ]);
    reconcile_root_configmap(&client, "mesh", &b1)
        .await
        .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        seen[1].body["data"],
        json!({"root-cert.pem": ROOT, "ca-crl.pem": pem_of(&crl1)})
    );
    let current = applied("cm1")(&seen[1].body).1;
    let parsed = pem::parse_many(current["data"]["ca-crl.pem"].as_str().unwrap()).unwrap();
    assert_eq!(parsed.len(), 1);
    assert!(signet_pki::ParsedCrl::from_der(parsed[0].contents()).is_ok());

    // Same CRL: read only.
    let (client, server) = scripted(vec![Expect::reply("GET", CM_URI, 200, current.clone())]);
    reconcile_root_configmap(&client, "mesh", &b1)
        .await
        .unwrap();
    assert_eq!(server.await.unwrap().len(), 1);

    // A newer CRL: rewritten.
    let b2 = bundle_with(&[], &[(signer.key_id(), crl2.clone())]);
    let (client, server) = scripted(vec![
        Expect::reply("GET", CM_URI, 200, current.clone()),
        patch(),
    ]);
    reconcile_root_configmap(&client, "mesh", &b2)
        .await
        .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(seen[1].body["data"]["ca-crl.pem"], json!(pem_of(&crl2)));
    let current = applied("cm1")(&seen[1].body).1;

    // A CRL that does not parse is left out; none left: the key is dropped.
    let junk = bundle_with(&[], &[(signer.key_id(), b"junk".to_vec())]);
    assert!(junk.revocations.crls_pem.is_empty());
    let (client, server) = scripted(vec![Expect::reply("GET", CM_URI, 200, current), patch()]);
    reconcile_root_configmap(&client, "mesh", &junk)
        .await
        .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(seen[1].body["data"], json!({"root-cert.pem": ROOT}));
}

#[test]
fn compromised_retry_doubles_with_jitter_and_is_capped() {
    assert_eq!(plan::compromised_retry(1, 0.0), Duration::from_millis(2500));
    assert_eq!(plan::compromised_retry(1, 0.999_999).as_secs(), 4);
    assert_eq!(plan::compromised_retry(2, 0.0), Duration::from_secs(5));
    assert_eq!(plan::compromised_retry(3, 0.0), Duration::from_secs(10));
    assert_eq!(
        plan::compromised_retry(30, 0.0),
        plan::COMPROMISED_RETRY_CAP / 2
    );
    assert!(plan::compromised_retry(30, 0.999) <= plan::COMPROMISED_RETRY_CAP);
}
