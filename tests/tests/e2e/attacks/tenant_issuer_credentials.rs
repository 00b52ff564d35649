//! A tenant who administers namespace `a` creates `signet.dev` Issuers there, trying to make
//! the bridge send its own credentials (its Signet token, or any other file of its pod such
//! as its Kubernetes API token) to a server the tenant runs, or to use another namespace's
//! Secret. The bridge's real reconcilers run against a mocked Kubernetes API (every request
//! asserted: nothing is read that should not be) and the real signet-server on PostgreSQL;
//! the tenant's server is a real TLS gRPC server that records every connection and token.
//!
//! Refused: an Issuer naming `server`, `serverName`, `trustBundle` or
//! `auth.serviceAccountToken` (Ready=False InvalidSpec naming each; never dialled, not even
//! when the tenant forges `Ready=True` and a CertificateRequest or Certificate names it); a
//! `tlsSecretRef` into another namespace. Still working: an Issuer naming nothing (the
//! operator's server, the bridge's token), an Issuer authenticating with an SVID Secret of its
//! own namespace, and a ClusterIssuer with today's fields.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use signet_k8s::backoff::{Backoffs, Policy};
use signet_k8s::certificate::{CertSigner, IssuerSigners};
use signet_k8s::certmanager::CertificateRequest;
use signet_k8s::context::Context;
use signet_k8s::crd::{ClusterIssuer, Issuer};
use signet_k8s::issuers::{IssuerKey, IssuerKind};
use signet_k8s::signer::SignerCache;
use signet_k8s::testing::{Expect, MockApi, Received, TempFile, TestBridge, mock_client, object};
use signet_k8s::{issuer_status, request};
use signet_runtime::clock::SystemClock;
use signet_runtime::random::FixedRandom;
use signet_tests::rogue::Rogue;
use signet_tests::{TokenIssuer, csr_with};

use crate::pg_server;

const BRIDGE_ID: &str = "spiffe://example.org/ns/signet-system/sa/signet-k8s";

fn ns_issuer(name: &str, spec: Value) -> Value {
    object(
        "signet.dev/v1",
        "Issuer",
        Some("a"),
        name,
        "7",
        json!({ "spec": spec }),
    )
}

/// The same object with `Ready=True`, as a tenant who may write their Issuer's status sets it.
fn forged_ready(mut issuer: Value) -> Value {
    issuer["status"] = json!({"observedGeneration": 1, "conditions": [{"type": "Ready",
        "status": "True", "reason": "Connected", "message": "trust me", "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    issuer
}

fn request_for(name: &str, issuer: &str, kind: &str) -> Value {
    let (csr, _key) = csr_with(&["spiffe://example.org/ns/a/sa/web"], &[]);
    object(
        "cert-manager.io/v1",
        "CertificateRequest",
        Some("a"),
        name,
        "100",
        json!({
            "spec": {
                "duration": "1h",
                "issuerRef": {"name": issuer, "kind": kind, "group": "signet.dev"},
                "request": STANDARD.encode(csr),
                "usages": ["digital signature", "key encipherment"],
            },
            "status": {"conditions": [{"type": "Approved", "status": "True",
                "reason": "cert-manager.io", "message": "approved",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }),
    )
}

fn ready_of(body: &Value) -> &Value {
    body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
}

struct Harness {
    ctx: Arc<Context>,
    api: Option<MockApi>,
}

impl Harness {
    async fn with_api<F, Fut, T>(&mut self, scenario: Vec<Expect>, f: F) -> (T, Vec<Received>)
    where
        F: FnOnce(Arc<Context>) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let server = self.api.take().unwrap().run(scenario);
        let out = tokio::time::timeout(Duration::from_secs(60), f(self.ctx.clone()))
            .await
            .expect("the reconciler hung (an unexpected API request?)");
        let (api, received) = server.finish_keep().await;
        self.api = Some(api);
        (out, received)
    }

    /// Reconciles the Issuer `obj`; returns the Ready condition written.
    async fn issuer(&mut self, obj: Value, before: Vec<Expect>) -> Value {
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        let mut scenario = before;
        scenario.push(
            Expect::patch(&format!(
                "/apis/signet.dev/v1/namespaces/a/issuers/{name}/status"
            ))
            .respond(obj.clone()),
        );
        let issuer: Issuer = serde_json::from_value(obj).unwrap();
        let (_, got) = self
            .with_api(scenario, |ctx| async move {
                issuer_status::reconcile_issuer(Arc::new(issuer), ctx)
                    .await
                    .unwrap()
            })
            .await;
        ready_of(&got.last().unwrap().body).clone()
    }

    /// Reconciles the CertificateRequest `cr` whose issuer the API answers as `issuer`;
    /// returns the Ready condition written.
    async fn request(
        &mut self,
        cr: Value,
        issuer_path: &str,
        issuer: Value,
        more: Vec<Expect>,
    ) -> Value {
        let name = cr["metadata"]["name"].as_str().unwrap().to_owned();
        let mut scenario = vec![Expect::get(issuer_path).respond(issuer)];
        scenario.extend(more);
        scenario.push(
            Expect::patch(&format!(
                "/apis/cert-manager.io/v1/namespaces/a/certificaterequests/{name}/status"
            ))
            .respond(cr.clone()),
        );
        let cr: CertificateRequest = serde_json::from_value(cr).unwrap();
        let (_, got) = self
            .with_api(scenario, |ctx| async move {
                request::reconcile(Arc::new(cr), ctx).await.unwrap()
            })
            .await;
        ready_of(&got.last().unwrap().body).clone()
    }
}

/// The tenant's server: its own CA, a certificate for 127.0.0.1 that even carries the Signet
/// server's SPIFFE ID (the tenant's CA can say anything), and that CA as the Issuer's
/// `trustBundle`. Before the fix, the bridge connected and sent its token here.
async fn tenant_server() -> (Rogue, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(vec![]).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "tenant CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    p.subject_alt_names
        .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    p.subject_alt_names.push(rcgen::SanType::URI(
        "spiffe://example.org/signet/server".try_into().unwrap(),
    ));
    let leaf = p.signed_by(&key, &issuer).unwrap();
    let rogue = Rogue::start(
        vec![leaf.der().to_vec()],
        key.serialize_der(),
        "example.org",
        vec![ca_cert.der().to_vec()],
    )
    .await;
    (rogue, ca_cert.pem())
}

#[tokio::test]
async fn tenant_issuer_never_gets_the_bridges_credentials() {
    let tokens = TokenIssuer::new("tenant-issuer");
    let toml = format!("[policy.kubernetes_bridge]\ncallers = [\"{BRIDGE_ID}\"]\n");
    let Some(server) = pg_server(&tokens, &toml).await else {
        return;
    };
    let (rogue, tenant_ca) = tenant_server().await;
    let evil = format!("https://{}", rogue.addr);

    // The operator's configuration: the real server, and the bridge's own token.
    let bridge_token = tokens.token("signet-system", "signet-k8s");
    let operator = TestBridge::new(
        &format!("https://{}", server.grpc),
        &server.bundle_pem,
        &server.trust_domain,
        &bridge_token,
    )
    .with_server_name("localhost");
    // Another secret file in the bridge's pod: its Kubernetes API token.
    let kube_token = TempFile::with("kube-api-token", b"kube-api-token-of-the-bridge");
    let (client, api) = mock_client();
    let ctx = Arc::new(Context {
        client: client.clone(),
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
    let mut h = Harness {
        ctx: ctx.clone(),
        api: Some(api),
    };

    // --- The attacks -------------------------------------------------------------------
    // The original attack: the tenant's server and roots, and the bridge's token file.
    let steal = ns_issuer(
        "steal",
        json!({
            "server": evil, "serverName": "localhost",
            "trustBundle": {"pem": tenant_ca},
            "auth": {"serviceAccountToken": {"path": operator.token.0}}
        }),
    );
    let c = h.issuer(steal.clone(), vec![]).await;
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("InvalidSpec")),
        "{c}"
    );
    let m = c["message"].as_str().unwrap();
    assert!(
        m.starts_with(
            "spec.server, spec.serverName, spec.trustBundle, spec.auth.serviceAccountToken are \
             not allowed on a namespaced Issuer"
        ),
        "{m}"
    );
    assert!(!m.contains(&bridge_token), "the condition holds the token");

    // Any other file of the bridge's pod, towards the operator's own server.
    let c = h
        .issuer(
            ns_issuer(
                "read-file",
                json!({"auth": {"serviceAccountToken": {"path": kube_token.0}}}),
            ),
            vec![],
        )
        .await;
    assert_eq!(c["reason"], "InvalidSpec", "{c}");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .starts_with("spec.auth.serviceAccountToken is not allowed on a namespaced Issuer"),
        "{c}"
    );
    // Only the server, hoping for the bridge's default token.
    let c = h
        .issuer(ns_issuer("server-only", json!({"server": evil})), vec![])
        .await;
    assert_eq!(c["reason"], "InvalidSpec", "{c}");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .starts_with("spec.server is not allowed"),
        "{c}"
    );

    // The tenant forges Ready=True on the Issuer: a CertificateRequest naming it is still
    // refused by the same check, before anything is dialled.
    let issuer_path = "/apis/signet.dev/v1/namespaces/a/issuers/steal";
    let r = h
        .request(
            request_for("via-steal", "steal", "Issuer"),
            issuer_path,
            forged_ready(steal.clone()),
            vec![],
        )
        .await;
    assert_eq!(r["reason"], "Pending", "{r}");
    let m = r["message"].as_str().unwrap();
    assert!(
        m.contains("cannot be used (InvalidSpec): spec.server"),
        "{m}"
    );
    // And a standalone Certificate naming it (the Certificate signer resolves it too).
    let signers = IssuerSigners {
        client: client.clone(),
        backend: ctx.backend.clone(),
        bridge_namespace: "signet-system".into(),
        bridge: operator.config.clone(),
    };
    let key = IssuerKey {
        kind: IssuerKind::Issuer,
        namespace: Some("a".into()),
        name: "steal".into(),
    };
    let (csr, _k) = csr_with(&["spiffe://example.org/ns/a/sa/web"], &[]);
    let (res, _) = h
        .with_api(
            vec![Expect::get(issuer_path).respond(forged_ready(steal.clone()))],
            |_| async { signers.sign(&key, csr.as_bytes(), "a", None).await },
        )
        .await;
    let err = res.unwrap_err();
    assert_eq!(err.reason(), "InvalidSpec", "{err:?}");

    // Another namespace's Secret (the bridge's own SVID): refused without reading it (the
    // mock API would fail on any GET).
    let c = h
        .issuer(
            ns_issuer(
                "other-ns-secret",
                json!({"auth": {"tlsSecretRef": {"name": "bridge-svid", "namespace": "signet-system"}}}),
            ),
            vec![],
        )
        .await;
    assert_eq!(c["reason"], "InvalidSpec", "{c}");
    assert!(
        c["message"].as_str().unwrap().starts_with(
            "spec.auth.tlsSecretRef.namespace \"signet-system\": an issuer may use only Secrets \
             of this Issuer's namespace (a)"
        ),
        "{c}"
    );

    // The tenant's server saw nothing: not a connection, let alone a token.
    assert_eq!(
        rogue.log.tcp_accepts(),
        0,
        "the bridge dialled the tenant's server"
    );
    assert!(rogue.log.calls().is_empty());

    // --- What still works --------------------------------------------------------------
    // An Issuer naming nothing: the operator's server, the bridge's token.
    let plain = ns_issuer("signet", json!({}));
    let c = h.issuer(plain.clone(), vec![]).await;
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("Connected")),
        "{c}"
    );
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains(&format!("https://{}", server.grpc)),
        "{c}"
    );
    let r = h
        .request(
            request_for("web-1", "signet", "Issuer"),
            "/apis/signet.dev/v1/namespaces/a/issuers/signet",
            forged_ready(plain),
            vec![],
        )
        .await;
    assert_eq!(r["reason"], "Issued", "{r}");

    // An Issuer authenticating with an SVID Secret of its own namespace: connected, and it
    // speaks as that identity (which is not a bridge, so the server refuses to sign for the
    // namespace with it; with the bridge's token the same request was Issued above).
    let kc = signet_client::new_key_and_csr().unwrap();
    let minted = server
        .admin()
        .await
        .mint_x509_svid(signet_proto::admin::MintX509SvidRequest {
            spiffe_id: "spiffe://example.org/ns/a/sa/issuer".into(),
            csr: kc.csr_der.clone(),
            ttl_seconds: 3600,
            dns_names: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let chain_pem = signet_types::pem::certs_to_pem(minted.cert_chain.iter().map(Vec::as_slice));
    let secret = object(
        "v1",
        "Secret",
        Some("a"),
        "issuer-svid",
        "5",
        json!({"type": "kubernetes.io/tls", "data": {
            "tls.crt": STANDARD.encode(&chain_pem), "tls.key": STANDARD.encode(&kc.key_pem)}}),
    );
    let own = ns_issuer(
        "own-svid",
        json!({"auth": {"tlsSecretRef": {"name": "issuer-svid"}}}),
    );
    let c = h
        .issuer(
            own.clone(),
            vec![Expect::get("/api/v1/namespaces/a/secrets/issuer-svid").respond(secret.clone())],
        )
        .await;
    assert_eq!(c["reason"], "Connected", "{c}");
    let r = h
        .request(
            request_for("web-2", "own-svid", "Issuer"),
            "/apis/signet.dev/v1/namespaces/a/issuers/own-svid",
            forged_ready(own),
            vec![Expect::get("/api/v1/namespaces/a/secrets/issuer-svid").respond(secret)],
        )
        .await;
    // (Today: Failed, PermissionDenied "… is not a Kubernetes bridge"; whatever the server's
    // policy says about that identity, it is not the bridge's.)
    assert_ne!(r["reason"], "Issued", "{r}");
    assert_eq!(r["status"], "False", "{r}");

    // A ClusterIssuer (the operator's) keeps its fields: server, roots, token path.
    let ci = object(
        "signet.dev/v1",
        "ClusterIssuer",
        None,
        "signet",
        "3",
        json!({"spec": {
            "server": format!("https://{}", server.grpc), "serverName": "localhost",
            "trustBundle": {"pem": String::from_utf8(server.bundle_pem.clone()).unwrap()},
            "auth": {"serviceAccountToken": {"path": operator.token.0}}
        }}),
    );
    let cluster: ClusterIssuer = serde_json::from_value(ci.clone()).unwrap();
    let (_, got) = h
        .with_api(
            vec![
                Expect::patch("/apis/signet.dev/v1/clusterissuers/signet/status")
                    .respond(ci.clone()),
            ],
            |ctx| async move {
                issuer_status::reconcile_cluster_issuer(Arc::new(cluster), ctx)
                    .await
                    .unwrap()
            },
        )
        .await;
    let c = ready_of(&got[0].body);
    assert_eq!(c["reason"], "Connected", "{c}");
    let r = h
        .request(
            request_for("web-3", "signet", "ClusterIssuer"),
            "/apis/signet.dev/v1/clusterissuers/signet",
            forged_ready(ci),
            vec![],
        )
        .await;
    assert_eq!(r["reason"], "Issued", "{r}");

    assert_eq!(rogue.log.tcp_accepts(), 0);
}

/// The operator's server is all or nothing at start-up: a URL without roots, or a plain-http
/// URL, stops the real binary before it talks to anything.
#[test]
fn the_bridge_refuses_an_incomplete_operator_server_at_start_up() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(signet_tests::bin("signet-k8s"))
            .arg("run")
            .args(args)
            .env_remove("SIGNET_K8S_SERVER")
            .env_remove("SIGNET_K8S_BUNDLE")
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--server", "https://signet:8443"]);
    assert!(err.contains("--server and --bundle go together"), "{err}");
    let err = run(&["--server", "http://signet:8080", "--bundle", "/dev/null"]);
    assert!(err.contains("--server must be an https:// URL"), "{err}");
    let err = run(&["--trust-domain", "Not A Domain"]);
    assert!(err.contains("--trust-domain"), "{err}");
}
