//! The Kubernetes bridge against the real server: the reconcilers run with a mocked
//! Kubernetes API (kube-rs's tower-test pattern: every request asserted) and call the real
//! `signet-server` on PostgreSQL over TLS with the bridge's service-account token. The server
//! lists the bridge in `[policy.kubernetes_bridge]`, so it signs for an object in namespace N
//! only identities under `spiffe://example.org/ns/N/`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use signet_k8s::Action;
use signet_k8s::backoff::{Backoffs, Policy};
use signet_k8s::certmanager::CertificateRequest;
use signet_k8s::context::Context;
use signet_k8s::crd::Issuer;
use signet_k8s::signer::SignerCache;
use signet_k8s::testing::{Expect, MockApi, Received, TestBridge, mock_client, object};
use signet_k8s::{issuer_status, request};
use signet_runtime::clock::SystemClock;
use signet_runtime::random::FixedRandom;
use signet_tests::{Server, TokenIssuer, csr_with, openssl_verify};

use crate::pg_server;

const BRIDGE_ID: &str = "spiffe://example.org/ns/signet-system/sa/signet-k8s";
const ISSUER_PATH: &str = "/apis/signet.dev/v1/namespaces/a/issuers/signet";

fn bridge_toml() -> String {
    format!("[policy.kubernetes_bridge]\ncallers = [\"{BRIDGE_ID}\"]\n")
}

struct Bridge {
    ctx: Arc<Context>,
    api: Option<MockApi>,
    _operator: TestBridge,
    issuer: Value,
}

/// A bridge with a mocked API server, configured by its operator with `server` and the
/// bridge's projected token in a file, and an Issuer in namespace `a` (which names nothing:
/// it uses the operator's server).
fn bridge(server: &Server, tokens: &TokenIssuer) -> Bridge {
    let operator = TestBridge::new(
        &format!("https://{}", server.grpc),
        &server.bundle_pem,
        &server.trust_domain,
        &tokens.token("signet-system", "signet-k8s"),
    )
    .with_server_name("localhost");
    let (client, api) = mock_client();
    let ctx = Arc::new(Context {
        client,
        bridge_namespace: "signet-system".into(),
        bridge: operator.config.clone(),
        backend: Arc::new(SignerCache::new()),
        clock: Arc::new(SystemClock),
        backoffs: Backoffs::with_random(
            Policy {
                base: Duration::from_secs(5),
                cap: Duration::from_secs(300),
            },
            Box::new(FixedRandom(0.0)),
        ),
        issuer_recheck: Duration::from_secs(300),
        events: Arc::new(signet_k8s::events::NoEvents),
    });
    let issuer = object(
        "signet.dev/v1",
        "Issuer",
        Some("a"),
        "signet",
        "3",
        json!({"spec": {}}),
    );
    Bridge {
        ctx,
        api: Some(api),
        _operator: operator,
        issuer,
    }
}

fn ready_issuer(mut issuer: Value) -> Value {
    issuer["status"] = json!({"observedGeneration": 1, "conditions": [{"type": "Ready",
        "status": "True", "reason": "Connected", "message": "ok", "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    issuer
}

fn approved_request(name: &str, csr_pem: &str, extra_conditions: Vec<Value>) -> Value {
    let mut conditions = vec![json!({"type": "Approved", "status": "True",
        "reason": "cert-manager.io", "message": "Certificate request has been approved by cert-manager.io",
        "lastTransitionTime": "2026-01-01T00:00:00Z"})];
    conditions.extend(extra_conditions);
    object(
        "cert-manager.io/v1",
        "CertificateRequest",
        Some("a"),
        name,
        "100",
        json!({
            "spec": {
                "duration": "1h",
                "issuerRef": {"name": "signet", "kind": "Issuer", "group": "signet.dev"},
                "request": STANDARD.encode(csr_pem),
                "usages": ["digital signature", "key encipherment"],
                "username": "system:serviceaccount:cert-manager:cert-manager"
            },
            "status": {"conditions": conditions}
        }),
    )
}

impl Bridge {
    /// Runs `f` against the mock API serving `scenario`; returns the requests received.
    async fn with_api<F, Fut>(&mut self, scenario: Vec<Expect>, f: F) -> (Action, Vec<Received>)
    where
        F: FnOnce(Arc<Context>) -> Fut,
        Fut: std::future::Future<Output = Action>,
    {
        let server = self.api.take().unwrap().run(scenario);
        let action = tokio::time::timeout(Duration::from_secs(60), f(self.ctx.clone()))
            .await
            .expect("the reconciler hung (an unexpected API request?)");
        // The scenario ends when every expected request came; the mock handle comes back.
        let received = server.finish_keep().await;
        self.api = Some(received.0);
        (action, received.1)
    }

    /// A new signing backend, as after a restart of the bridge: no cached connection.
    fn restart_backend(&mut self) {
        let old = &self.ctx;
        self.ctx = Arc::new(Context {
            client: old.client.clone(),
            bridge_namespace: old.bridge_namespace.clone(),
            bridge: old.bridge.clone(),
            backend: Arc::new(SignerCache::new()),
            clock: Arc::new(SystemClock),
            backoffs: Backoffs::with_random(
                Policy {
                    base: Duration::from_secs(5),
                    cap: Duration::from_secs(300),
                },
                Box::new(FixedRandom(0.0)),
            ),
            issuer_recheck: old.issuer_recheck,
            events: Arc::new(signet_k8s::events::NoEvents),
        });
    }

    async fn reconcile_request(
        &mut self,
        cr: Value,
        scenario: Vec<Expect>,
    ) -> (Action, Vec<Received>) {
        let cr: CertificateRequest = serde_json::from_value(cr).unwrap();
        self.with_api(scenario, |ctx| async move {
            request::reconcile(Arc::new(cr), ctx).await.unwrap()
        })
        .await
    }
}

fn status_path(name: &str) -> String {
    format!("/apis/cert-manager.io/v1/namespaces/a/certificaterequests/{name}/status")
}

fn ready_of(r: &Received) -> &Value {
    r.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
}

#[tokio::test]
async fn k8s_bridge_signs_approved_request_and_enforces_namespace() {
    let tokens = TokenIssuer::new("k8s-bridge");
    let Some(server) = pg_server(&tokens, &bridge_toml()).await else {
        return;
    };
    let mut b = bridge(&server, &tokens);

    // The Issuer reconciler reaches the server and reports the trust domain.
    let issuer: Issuer = serde_json::from_value(b.issuer.clone()).unwrap();
    let echo = b.issuer.clone();
    let (action, got) = b
        .with_api(
            vec![
                Expect::patch(&format!("{ISSUER_PATH}/status"))
                    .content_type("application/merge-patch+json")
                    .respond(echo),
            ],
            |ctx| async move {
                issuer_status::reconcile_issuer(Arc::new(issuer), ctx)
                    .await
                    .unwrap()
            },
        )
        .await;
    let c = &got[0].body["status"]["conditions"][0];
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("Connected")),
        "{c}"
    );
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("trust domain example.org"),
        "{c}"
    );
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));

    // An approved request in namespace a for an identity in a: signed, chain verifies.
    let (csr, _key) = csr_with(&["spiffe://example.org/ns/a/sa/web"], &["web.a.svc"]);
    let ready = ready_issuer(b.issuer.clone());
    let cr = approved_request("web-1", &csr, vec![]);
    let (action, got) = b
        .reconcile_request(
            cr.clone(),
            vec![
                Expect::get(ISSUER_PATH).respond(ready.clone()),
                Expect::patch(&status_path("web-1"))
                    .content_type("application/merge-patch+json")
                    .respond(cr),
            ],
        )
        .await;
    assert_eq!(action, Action::await_change());
    let patch = &got[1].body;
    assert_eq!(patch["metadata"], json!({"resourceVersion": "100"}));
    let r = ready_of(&got[1]);
    assert_eq!(
        (r["status"].as_str(), r["reason"].as_str()),
        (Some("True"), Some("Issued")),
        "{r}"
    );
    let chain_pem = String::from_utf8(
        STANDARD
            .decode(patch["status"]["certificate"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let ca_pem = STANDARD
        .decode(patch["status"]["ca"].as_str().unwrap())
        .unwrap();
    let mut chain: Vec<String> = pem::parse_many(&chain_pem)
        .unwrap()
        .iter()
        .map(pem::encode)
        .collect();
    assert_eq!(
        signet_tests::uri_sans(&chain[0]),
        vec!["spiffe://example.org/ns/a/sa/web".to_owned()]
    );
    chain.push(String::from_utf8(ca_pem.clone()).unwrap());
    openssl_verify(&chain, &ca_pem).unwrap();
    assert_eq!(ca_pem, server.bundle_pem, "status.ca is the server's root");

    // Namespace a asking for namespace b's identity: Failed, with the server's reason.
    let (csr_b, _key) = csr_with(&["spiffe://example.org/ns/b/sa/web"], &[]);
    let cr = approved_request("steal-b", &csr_b, vec![]);
    let (action, got) = b
        .reconcile_request(
            cr.clone(),
            vec![
                Expect::get(ISSUER_PATH).respond(ready.clone()),
                Expect::patch(&status_path("steal-b")).respond(cr),
            ],
        )
        .await;
    assert_eq!(action, Action::await_change());
    let r = ready_of(&got[1]);
    assert_eq!(
        (r["status"].as_str(), r["reason"].as_str()),
        (Some("False"), Some("Failed")),
        "{r}"
    );
    let msg = r["message"].as_str().unwrap();
    assert!(
        msg.starts_with("Signet refused to sign (PermissionDenied): "),
        "{msg}"
    );
    assert!(msg.contains("namespace a"), "{msg}");
    assert!(got[1].body["status"]["failureTime"].is_string());
    assert!(got[1].body["status"].get("certificate").is_none());

    // A duration beyond the server's maximum: issued, and the message says it was shortened.
    let (csr, _key) = csr_with(&["spiffe://example.org/ns/a/sa/web"], &[]);
    let mut cr = approved_request("long-1", &csr, vec![]);
    cr["spec"]["duration"] = json!("1000h");
    let (_, got) = b
        .reconcile_request(
            cr.clone(),
            vec![
                Expect::get(ISSUER_PATH).respond(ready.clone()),
                Expect::patch(&status_path("long-1")).respond(cr),
            ],
        )
        .await;
    let r = ready_of(&got[1]);
    assert_eq!(r["reason"], "Issued", "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("the server shortened the requested duration 1000h to 24h"),
        "{r}"
    );

    // A DNS name outside the namespace's allowed patterns: Failed, naming the patterns.
    let (csr, _key) = csr_with(&["spiffe://example.org/ns/a/sa/web"], &["web.b.svc"]);
    let cr = approved_request("dns-b", &csr, vec![]);
    let (_, got) = b
        .reconcile_request(
            cr.clone(),
            vec![
                Expect::get(ISSUER_PATH).respond(ready.clone()),
                Expect::patch(&status_path("dns-b")).respond(cr),
            ],
        )
        .await;
    let r = ready_of(&got[1]);
    assert_eq!(r["reason"], "Failed", "{r}");
    assert!(r["message"].as_str().unwrap().contains("web.b.svc"), "{r}");

    // The server goes away (and the bridge restarts, so no connection is cached): Pending
    // with growing backoff, the status written once, no crash.
    server.stop().await;
    b.restart_backend();
    let (csr, _key) = csr_with(&["spiffe://example.org/ns/a/sa/web"], &[]);
    let cr = approved_request("web-2", &csr, vec![]);
    let (a1, got) = b
        .reconcile_request(
            cr.clone(),
            vec![
                Expect::get(ISSUER_PATH).respond(ready.clone()),
                Expect::patch(&status_path("web-2")).respond(cr.clone()),
            ],
        )
        .await;
    let r = ready_of(&got[1]).clone();
    assert_eq!(
        (r["status"].as_str(), r["reason"].as_str()),
        (Some("False"), Some("Pending")),
        "{r}"
    );
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .starts_with("Signing failed, will retry with backoff (Unreachable)"),
        "{r}"
    );
    assert!(got[1].body["status"].get("failureTime").is_none());
    let pending = approved_request("web-2", &csr, vec![r]);
    let (a2, _) = b
        .reconcile_request(
            pending.clone(),
            vec![Expect::get(ISSUER_PATH).respond(ready.clone())],
        )
        .await;
    let (a3, _) = b
        .reconcile_request(pending, vec![Expect::get(ISSUER_PATH).respond(ready)])
        .await;
    assert_eq!(
        [a1, a2, a3],
        [2500, 5000, 10000].map(|ms| Action::requeue(Duration::from_millis(ms)))
    );
}
