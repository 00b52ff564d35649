//! The `Issuer` / `ClusterIssuer` reconciler: resolves the trust bundle and credentials,
//! calls `GetBundle` on the server, and reports the result in the Ready condition. Ready
//! issuers are checked again every `issuer_recheck`; failing ones back off.

use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::conditions::{self, Condition, ConditionStatus};
use crate::context::{Context, Error};
use crate::crd::{ClusterIssuer, Issuer, IssuerStatus};
use crate::events::Note;
use crate::issuers::{self, IssuerKind, IssuerObj};
use crate::signer::{BundleInfo, REASON_WRONG_SERVER, SignError};

pub const REASON_CONNECTED: &str = "Connected";

/// Where to look when the server cannot be reached: the operator's flags for a namespaced
/// Issuer, the spec for a ClusterIssuer.
fn hint(obj: &IssuerObj) -> &'static str {
    match obj.key.kind {
        IssuerKind::Issuer => {
            "Check the bridge's --server, --server-name and --bundle (set by its operator), \
             and that signet-server is running"
        }
        IssuerKind::ClusterIssuer => {
            "Check spec.server, spec.serverName and spec.trustBundle, and that signet-server \
             is running"
        }
    }
}

/// The Ready condition for an issuer whose check ended with `res`.
pub fn ready_condition(obj: &IssuerObj, res: Result<Checked, CheckError>) -> Condition {
    let c = match res {
        Ok(Checked { server, bundle: b }) => Condition::new(
            "Ready",
            ConditionStatus::True,
            REASON_CONNECTED,
            format!(
                "Connected to {server}: trust domain {} (bundle revision {})",
                b.trust_domain, b.revision
            ),
        ),
        Err(CheckError::Resolve(reason, msg)) => {
            Condition::new("Ready", ConditionStatus::False, reason, msg)
        }
        Err(CheckError::Server(server, SignError::Retryable { reason, message }))
            if reason == "Unreachable" =>
        {
            Condition::new(
                "Ready",
                ConditionStatus::False,
                "Unreachable",
                format!("Cannot reach {server}: {message}. {}", hint(obj)),
            )
        }
        Err(CheckError::Server(server, SignError::Retryable { reason, message }))
            if reason == REASON_WRONG_SERVER =>
        {
            Condition::new(
                "Ready",
                ConditionStatus::False,
                REASON_WRONG_SERVER,
                format!("Refusing {server}: {message}. {}", hint(obj)),
            )
        }
        Err(CheckError::Server(server, e)) => Condition::new(
            "Ready",
            ConditionStatus::False,
            "ServerError",
            format!(
                "{server} answered GetBundle with {}: {}",
                e.reason(),
                e.message()
            ),
        ),
    };
    c.with_generation(obj.generation)
}

/// A successful check: the server (as resolved) and its bundle.
#[derive(Debug)]
pub struct Checked {
    pub server: String,
    pub bundle: BundleInfo,
}

/// Why a check failed: the issuer could not be resolved (nothing was dialled), or the server
/// (named first) said no or could not be reached.
#[derive(Debug)]
pub enum CheckError {
    Resolve(&'static str, String),
    Server(String, SignError),
}

/// The status after a check, or `None` when unchanged.
pub fn next_status(
    old: Option<&IssuerStatus>,
    ready: Condition,
    generation: Option<i64>,
    now: std::time::SystemTime,
) -> Option<IssuerStatus> {
    let mut st = old.cloned().unwrap_or_default();
    let mut changed = conditions::set(&mut st.conditions, ready, &conditions::time(now));
    if st.observed_generation != generation {
        st.observed_generation = generation;
        changed = true;
    }
    changed.then_some(st)
}

pub fn status_patch(st: &IssuerStatus) -> Value {
    json!({ "status": st })
}

async fn check(obj: &IssuerObj, ctx: &Context) -> Result<Checked, CheckError> {
    let cfg = issuers::resolve(&ctx.client, obj, &ctx.bridge, &ctx.bridge_namespace)
        .await
        .map_err(|e| CheckError::Resolve(e.reason(), e.to_string()))?;
    let server = cfg.server().to_owned();
    match ctx.backend.bundle(&obj.key.to_string(), &cfg).await {
        Ok(bundle) => Ok(Checked { server, bundle }),
        Err(e) => Err(CheckError::Server(server, e)),
    }
}

/// What the check decided: when to look again, the status patch (None: unchanged), and the
/// Ready condition.
async fn reconcile_obj(
    obj: IssuerObj,
    ctx: &Context,
) -> Result<(Action, Option<Value>, Condition), Error> {
    let okey = obj.key.to_string();
    let res = check(&obj, ctx).await;
    let ok = res.is_ok();
    let cond = ready_condition(&obj, res);
    tracing::info!(issuer = %okey, reason = ?cond.reason, message = ?cond.message, "issuer checked");
    let patch = next_status(
        obj.status.as_ref(),
        cond.clone(),
        obj.generation,
        ctx.clock.now(),
    )
    .map(|st| status_patch(&st));
    let action = if ok {
        ctx.backoffs.reset(&okey);
        Action::requeue(ctx.issuer_recheck)
    } else {
        Action::requeue(ctx.backoffs.next(&okey))
    };
    Ok((action, patch, cond))
}

/// The event for a Ready condition that changed.
fn ready_event(cond: &Condition) -> Note {
    Note::new(
        cond.status != ConditionStatus::True,
        cond.reason.as_deref().unwrap_or("Unknown"),
        cond.message.clone().unwrap_or_default(),
        "CheckIssuer",
    )
}

#[tracing::instrument(
    target = "signet_trace",
    name = "reconcile.issuer",
    skip_all,
    fields(
        k8s.namespace = %i.namespace().unwrap_or_default(),
        k8s.name = %i.name_any(),
    ),
    err(Display)
)]
pub async fn reconcile_issuer(i: Arc<Issuer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let (name, ns) = (i.name_any(), i.namespace().unwrap_or_default());
    let (action, patch, cond) = reconcile_obj(IssuerObj::from((*i).clone()), &ctx).await?;
    if let Some(p) = patch {
        Api::<Issuer>::namespaced(ctx.client.clone(), &ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&p))
            .await?;
        ctx.events
            .publish(i.object_ref(&()), ready_event(&cond))
            .await;
    }
    Ok(action)
}

#[tracing::instrument(
    target = "signet_trace",
    name = "reconcile.cluster_issuer",
    skip_all,
    fields(k8s.name = %i.name_any()),
    err(Display)
)]
pub async fn reconcile_cluster_issuer(
    i: Arc<ClusterIssuer>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let name = i.name_any();
    let (action, patch, cond) = reconcile_obj(IssuerObj::from((*i).clone()), &ctx).await?;
    if let Some(p) = patch {
        Api::<ClusterIssuer>::all(ctx.client.clone())
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&p))
            .await?;
        ctx.events
            .publish(i.object_ref(&()), ready_event(&cond))
            .await;
    }
    Ok(action)
}

pub fn error_policy_issuer(i: Arc<Issuer>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = IssuerObj::from((*i).clone()).key.to_string();
    tracing::warn!(issuer = %key, error = %err, "Issuer reconcile failed");
    Action::requeue(ctx.backoffs.next(&key))
}

pub fn error_policy_cluster_issuer(
    i: Arc<ClusterIssuer>,
    err: &Error,
    ctx: Arc<Context>,
) -> Action {
    let key = IssuerObj::from((*i).clone()).key.to_string();
    tracing::warn!(issuer = %key, error = %err, "ClusterIssuer reconcile failed");
    Action::requeue(ctx.backoffs.next(&key))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use base64::Engine;
    use serde_json::json;

    use super::*;
    use crate::backoff::{Backoffs, Policy};
    use crate::signer::SignBackend;
    use crate::testing::{Expect, FakeBackend, TestBridge, mock_client, object};
    use signet_runtime::clock::FakeClock;
    use signet_runtime::random::FixedRandom;

    const NOW_STR: &str = "2027-01-15T08:00:00Z";
    const ISSUER_STATUS: &str = "/apis/signet.dev/v1/namespaces/a/issuers/signet/status";
    const CLUSTER_STATUS: &str = "/apis/signet.dev/v1/clusterissuers/signet/status";

    fn root_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.self_signed(&key).unwrap().pem()
    }

    fn ctx(backend: Arc<dyn SignBackend>) -> (Arc<Context>, crate::testing::MockApi, TestBridge) {
        let (client, api) = mock_client();
        let bridge = TestBridge::new(
            "https://signet:8443",
            root_pem().as_bytes(),
            "example.org",
            "t",
        );
        let ctx = Arc::new(Context {
            client,
            bridge_namespace: "signet-system".into(),
            bridge: bridge.config.clone(),
            backend,
            clock: Arc::new(FakeClock::at_unix(1_800_000_000)),
            backoffs: Backoffs::with_random(
                Policy {
                    base: Duration::from_secs(2),
                    cap: Duration::from_secs(60),
                },
                Box::new(FixedRandom(0.0)),
            ),
            issuer_recheck: Duration::from_secs(300),
            events: Arc::new(crate::events::NoEvents),
        });
        (ctx, api, bridge)
    }

    /// What the API server answers a status patch with: the object.
    fn echo(kind: &str, ns: Option<&str>) -> serde_json::Value {
        object(
            "signet.dev/v1",
            kind,
            ns,
            "signet",
            "10",
            json!({"spec": {"server": "https://signet:8443", "trustBundle": {"pem": "x"}}}),
        )
    }

    fn ready(status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": reason,
            "message": message, "lastTransitionTime": NOW_STR, "observedGeneration": 1}],
            "observedGeneration": 1}})
    }

    fn issuer(spec: serde_json::Value) -> Issuer {
        serde_json::from_value(object(
            "signet.dev/v1",
            "Issuer",
            Some("a"),
            "signet",
            "9",
            json!({ "spec": spec }),
        ))
        .unwrap()
    }

    fn connected() -> Arc<FakeBackend> {
        FakeBackend::with_bundle(Ok(BundleInfo {
            trust_domain: "example.org".into(),
            roots_pem: root_pem(),
            revision: 3,
            ..Default::default()
        }))
    }

    #[tokio::test]
    async fn namespaced_issuer_uses_the_operators_server_and_the_bridges_token() {
        let backend = connected();
        let (ctx, api, bridge) = ctx(backend.clone());
        let server = api.run(vec![
            Expect::patch(ISSUER_STATUS)
                .content_type("application/merge-patch+json")
                .body(ready("True", "Connected",
                    "Connected to https://signet:8443: trust domain example.org (bundle revision 3)"))
                .respond(echo("Issuer", Some("a"))),
        ]);
        let action = reconcile_issuer(Arc::new(issuer(json!({}))), ctx.clone())
            .await
            .unwrap();
        drop(ctx);
        server.finish().await;
        assert_eq!(action, Action::requeue(Duration::from_secs(300)));
        assert_eq!(
            backend.bundle_calls(),
            [(
                "Issuer/a/signet".to_owned(),
                "https://signet:8443".to_owned(),
                format!("token:{}", bridge.token.0.display())
            )]
        );
    }

    #[tokio::test]
    async fn namespaced_issuer_choosing_server_bundle_or_token_is_invalid_and_never_dialled() {
        let backend = connected();
        let (ctx, api, _bridge) = ctx(backend.clone());
        let msg = "spec.server, spec.serverName, spec.trustBundle, spec.auth.serviceAccountToken \
                   are not allowed on a namespaced Issuer: the Signet server, its trust bundle \
                   and the bridge's own token are chosen by the bridge's operator (signet-k8s run \
                   --server, --bundle, --token), never by an Issuer. Remove them (the Issuer then \
                   uses the operator's server), or ask the operator for a ClusterIssuer";
        // This test's events go to the (mock) API: a Warning about the Issuer, after the status.
        let ctx = Arc::new(Context {
            events: Arc::new(crate::events::KubeEvents::new(ctx.client.clone(), None)),
            client: ctx.client.clone(),
            bridge_namespace: ctx.bridge_namespace.clone(),
            bridge: ctx.bridge.clone(),
            backend: ctx.backend.clone(),
            clock: ctx.clock.clone(),
            backoffs: Backoffs::with_random(
                Policy {
                    base: Duration::from_secs(2),
                    cap: Duration::from_secs(60),
                },
                Box::new(FixedRandom(0.0)),
            ),
            issuer_recheck: ctx.issuer_recheck,
        });
        let server = api.run(vec![
            Expect::patch(ISSUER_STATUS)
                .body(ready("False", "InvalidSpec", msg))
                .respond(echo("Issuer", Some("a"))),
            Expect::post("/apis/events.k8s.io/v1/namespaces/a/events")
                .body_with(move |b| {
                    assert_eq!(
                        (
                            b["type"].as_str(),
                            b["reason"].as_str(),
                            b["action"].as_str()
                        ),
                        (Some("Warning"), Some("InvalidSpec"), Some("CheckIssuer"))
                    );
                    assert_eq!(b["note"], msg);
                    assert_eq!(b["regarding"]["kind"], "Issuer");
                    assert_eq!(b["regarding"]["name"], "signet");
                    assert_eq!(b["reportingController"], "signet-k8s");
                })
                .respond(object(
                    "events.k8s.io/v1",
                    "Event",
                    Some("a"),
                    "signet.1",
                    "1",
                    json!({"eventTime": "2027-01-15T08:00:00.000000Z", "type": "Warning",
                        "reason": "InvalidSpec", "action": "CheckIssuer",
                        "reportingController": "signet-k8s", "reportingInstance": "signet-k8s",
                        "regarding": {"kind": "Issuer", "name": "signet", "namespace": "a"}}),
                )),
        ]);
        let old = issuer(json!({
            "server": "https://attacker.example:443", "serverName": "localhost",
            "trustBundle": {"pem": root_pem()},
            "auth": {"serviceAccountToken": {"path": "/var/run/secrets/kubernetes.io/serviceaccount/token"}}
        }));
        reconcile_issuer(Arc::new(old), ctx.clone()).await.unwrap();
        drop(ctx);
        server.finish().await;
        assert!(backend.bundle_calls().is_empty(), "the server was called");
    }

    #[tokio::test]
    async fn namespaced_issuer_tls_secret_comes_from_its_own_namespace_only() {
        let backend = connected();
        let (ctx, api, _bridge) = ctx(backend.clone());
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let server = api.run(vec![
            Expect::get("/api/v1/namespaces/a/secrets/issuer-svid").respond(object("v1", "Secret",
                Some("a"), "issuer-svid", "1",
                json!({"type": "kubernetes.io/tls", "data": {"tls.crt": b64("-----BEGIN CERT"), "tls.key": b64("k")}}))),
            Expect::patch(ISSUER_STATUS)
                .body_with(|b| assert_eq!(b["status"]["conditions"][0]["reason"], "Connected"))
                .respond(echo("Issuer", Some("a"))),
            // Another namespace's Secret: refused without reading it.
            Expect::patch(ISSUER_STATUS)
                .body(ready("False", "InvalidSpec",
                    "spec.auth.tlsSecretRef.namespace \"signet-system\": an issuer may use only \
                     Secrets of this Issuer's namespace (a); remove the namespace"))
                .respond(echo("Issuer", Some("a"))),
        ]);
        reconcile_issuer(
            Arc::new(issuer(
                json!({"auth": {"tlsSecretRef": {"name": "issuer-svid"}}}),
            )),
            ctx.clone(),
        )
        .await
        .unwrap();
        reconcile_issuer(
            Arc::new(issuer(
                json!({"auth": {"tlsSecretRef": {"name": "bridge-svid", "namespace": "signet-system"}}}),
            )),
            ctx.clone(),
        )
        .await
        .unwrap();
        drop(ctx);
        server.finish().await;
        let calls = backend.bundle_calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].2, "mtls:-----BEGIN CERT");
    }

    #[tokio::test]
    async fn namespaced_issuer_without_an_operator_server_is_not_usable() {
        let backend = connected();
        let (client, api) = mock_client();
        let ctx = Arc::new(Context {
            client,
            bridge_namespace: "signet-system".into(),
            bridge: Arc::new(crate::operator::BridgeConfig::cluster_issuers_only()),
            backend: backend.clone(),
            clock: Arc::new(FakeClock::at_unix(1_800_000_000)),
            backoffs: Backoffs::with_random(
                Policy {
                    base: Duration::from_secs(2),
                    cap: Duration::from_secs(60),
                },
                Box::new(FixedRandom(0.0)),
            ),
            issuer_recheck: Duration::from_secs(300),
            events: Arc::new(crate::events::NoEvents),
        });
        let server = api.run(vec![
            Expect::patch(ISSUER_STATUS)
                .body_with(|b| {
                    let c = &b["status"]["conditions"][0];
                    assert_eq!(c["reason"], "BridgeNotConfigured");
                    assert!(c["message"].as_str().unwrap().contains("--server"), "{c}");
                })
                .respond(echo("Issuer", Some("a"))),
        ]);
        reconcile_issuer(Arc::new(issuer(json!({}))), ctx.clone())
            .await
            .unwrap();
        drop(ctx);
        server.finish().await;
        assert!(backend.bundle_calls().is_empty());
    }

    #[tokio::test]
    async fn missing_bundle_config_map_is_reported() {
        let (ctx, api, _bridge) = ctx(FakeBackend::with_bundle(Err(SignError::retryable(
            "Unreachable",
            "x",
        ))));
        let ci: ClusterIssuer = serde_json::from_value(object("signet.dev/v1", "ClusterIssuer", None, "signet", "9", json!({
            "spec": {"server": "https://signet:8443", "trustBundle": {"configMapRef": {"name": "signet-bundle"}}}
        })))
        .unwrap();
        let server = api.run(vec![
            Expect::get("/api/v1/namespaces/signet-system/configmaps/signet-bundle")
                .not_found("configmaps", "signet-bundle"),
            Expect::patch(CLUSTER_STATUS)
                .body(ready(
                    "False",
                    "BundleNotFound",
                    "ConfigMap signet-system/signet-bundle key \"ca.crt\": ConfigMap not found",
                ))
                .respond(echo("ClusterIssuer", None)),
        ]);
        let action = reconcile_cluster_issuer(Arc::new(ci), ctx.clone())
            .await
            .unwrap();
        drop(ctx);
        server.finish().await;
        assert_eq!(action, Action::requeue(Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn cluster_issuer_reads_refs_from_bridge_namespace_and_reports_unreachable() {
        let root = root_pem();
        let (ctx, api, _bridge) = ctx(FakeBackend::with_bundle(Err(SignError::retryable(
            "Unreachable",
            "connection refused",
        ))));
        let ci: ClusterIssuer = serde_json::from_value(object("signet.dev/v1", "ClusterIssuer", None, "signet", "9", json!({
            "spec": {"server": "https://signet:8443", "trustBundle": {"secretRef": {"name": "signet-ca", "key": "root.pem"}},
                "auth": {"tlsSecretRef": {"name": "bridge-svid"}}}
        })))
        .unwrap();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let server = api.run(vec![
            Expect::get("/api/v1/namespaces/signet-system/secrets/signet-ca").respond(object("v1", "Secret",
                Some("signet-system"), "signet-ca", "1", json!({"type": "Opaque", "data": {"root.pem": b64(&root)}}))),
            Expect::get("/api/v1/namespaces/signet-system/secrets/bridge-svid").respond(object("v1", "Secret",
                Some("signet-system"), "bridge-svid", "1",
                json!({"type": "kubernetes.io/tls", "data": {"tls.crt": b64(&root), "tls.key": b64("k")}}))),
            Expect::patch(CLUSTER_STATUS)
                .body_with(|b| {
                    let c = &b["status"]["conditions"][0];
                    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("Unreachable")));
                    assert!(c["message"].as_str().unwrap().starts_with(
                        "Cannot reach https://signet:8443: connection refused. Check spec.server"));
                })
                .respond(echo("ClusterIssuer", None)),
        ]);
        let action = reconcile_cluster_issuer(Arc::new(ci), ctx.clone())
            .await
            .unwrap();
        drop(ctx);
        server.finish().await;
        assert_eq!(action, Action::requeue(Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn wrong_server_identity_is_reported_as_such() {
        let (ctx, api, _bridge) = ctx(FakeBackend::with_bundle(Err(SignError::retryable(
            REASON_WRONG_SERVER,
            "the server's certificate carries the SPIFFE ID spiffe://example.org/x, not \
             spiffe://example.org/signet/server",
        ))));
        let server = api.run(vec![
            Expect::patch(ISSUER_STATUS)
                .body_with(|b| {
                    let c = &b["status"]["conditions"][0];
                    assert_eq!(c["reason"], REASON_WRONG_SERVER);
                    let m = c["message"].as_str().unwrap();
                    assert!(
                        m.starts_with(
                            "Refusing https://signet:8443: the server's certificate carries"
                        ),
                        "{m}"
                    );
                    assert!(m.contains("the bridge's --server"), "{m}");
                })
                .respond(echo("Issuer", Some("a"))),
        ]);
        reconcile_issuer(Arc::new(issuer(json!({}))), ctx.clone())
            .await
            .unwrap();
        drop(ctx);
        server.finish().await;
    }

    #[tokio::test]
    async fn missing_token_file_and_unchanged_status_is_not_rewritten() {
        let (ctx, api, _bridge) = ctx(FakeBackend::with_bundle(Err(SignError::retryable(
            "Unreachable",
            "x",
        ))));
        let mut v = object(
            "signet.dev/v1",
            "ClusterIssuer",
            None,
            "signet",
            "9",
            json!({
                "spec": {"server": "https://signet:8443", "trustBundle": {"pem": root_pem()},
                    "auth": {"serviceAccountToken": {"path": "/nonexistent/token"}}}
            }),
        );
        let msg = "the service-account token file /nonexistent/token does not exist in the bridge's pod: \
                   project a token with the server's audience there";
        v["status"] = ready("False", "CredentialsNotFound", msg)["status"].clone();
        let ci: ClusterIssuer = serde_json::from_value(v).unwrap();
        let recorded = Arc::new(crate::testing::RecordedEvents::default());
        let ctx = Arc::new(Context {
            events: recorded.clone(),
            client: ctx.client.clone(),
            bridge_namespace: ctx.bridge_namespace.clone(),
            bridge: ctx.bridge.clone(),
            backend: ctx.backend.clone(),
            clock: ctx.clock.clone(),
            backoffs: Backoffs::with_random(
                Policy {
                    base: Duration::from_secs(2),
                    cap: Duration::from_secs(60),
                },
                Box::new(FixedRandom(0.0)),
            ),
            issuer_recheck: ctx.issuer_recheck,
        });
        let server = api.run(vec![]);
        let a1 = reconcile_cluster_issuer(Arc::new(ci.clone()), ctx.clone())
            .await
            .unwrap();
        let a2 = reconcile_cluster_issuer(Arc::new(ci), ctx.clone())
            .await
            .unwrap();
        drop(ctx);
        server.finish().await;
        assert_eq!(
            [a1, a2],
            [
                Action::requeue(Duration::from_secs(1)),
                Action::requeue(Duration::from_secs(2))
            ]
        );
        // Nothing changed, so no event either.
        assert!(recorded.all().is_empty());
    }
}
