use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use super::*;
use crate::backoff::{Backoffs, Policy};
use crate::signer::SignBackend;
use crate::testing::{Expect, FakeBackend, mock_client, object};
use signet_runtime::clock::FakeClock;
use signet_runtime::random::FixedRandom;

const NOW: u64 = 1_800_000_000;
const NOW_STR: &str = "2027-01-15T08:00:00Z";
const CR_PATH: &str = "/apis/cert-manager.io/v1/namespaces/a/certificaterequests/web-1";
const ISSUER_PATH: &str = "/apis/signet.dev/v1/namespaces/a/issuers/signet";

struct Fixture {
    ctx: Arc<Context>,
    api: crate::testing::MockApi,
    _bridge: crate::testing::TestBridge,
    events: Arc<crate::testing::RecordedEvents>,
}

fn fixture(backend: Arc<dyn SignBackend>) -> Fixture {
    let (client, api) = mock_client();
    let bridge = crate::testing::TestBridge::new(
        "https://signet.signet-system.svc:8443",
        root_pem().as_bytes(),
        "example.org",
        "token",
    );
    let events = Arc::new(crate::testing::RecordedEvents::default());
    let ctx = Arc::new(Context {
        client,
        bridge_namespace: "signet-system".into(),
        bridge: bridge.config.clone(),
        backend,
        clock: Arc::new(FakeClock::at_unix(NOW)),
        backoffs: Backoffs::with_random(
            Policy {
                base: Duration::from_secs(2),
                cap: Duration::from_secs(60),
            },
            Box::new(FixedRandom(0.0)),
        ),
        issuer_recheck: Duration::from_secs(300),
        events: events.clone(),
    });
    Fixture {
        ctx,
        api,
        _bridge: bridge,
        events,
    }
}

fn root_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.self_signed(&key).unwrap().pem()
}

fn issuer(ready: Option<(&str, &str)>) -> Value {
    let mut v = object(
        "signet.dev/v1",
        "Issuer",
        Some("a"),
        "signet",
        "11",
        json!({"spec": {}}),
    );
    if let Some((status, reason)) = ready {
        v["status"] = json!({"observedGeneration": 1, "conditions": [{
            "type": "Ready", "status": status, "reason": reason, "message": "m",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]});
    }
    v
}

fn csr_pem(f: impl FnOnce(&mut rcgen::CertificateParams)) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
    p.subject_alt_names = vec![rcgen::SanType::URI(
        "spiffe://example.org/ns/a/sa/web".try_into().unwrap(),
    )];
    f(&mut p);
    p.serialize_request(&key).unwrap().pem().unwrap()
}

const APPROVED: &str = r#"{"type":"Approved","status":"True","reason":"cert-manager.io","message":"Certificate request has been approved by cert-manager.io","lastTransitionTime":"2026-01-01T00:00:00Z"}"#;

fn approved() -> Value {
    serde_json::from_str(APPROVED).unwrap()
}

/// A CertificateRequest as cert-manager creates it, with these status conditions.
fn cr_json(spec_extra: Value, conditions: Vec<Value>) -> Value {
    let mut spec = json!({
        "duration": "24h",
        "issuerRef": {"name": "signet", "kind": "Issuer", "group": "signet.dev"},
        "request": STANDARD.encode(csr_pem(|_| {})),
        "usages": ["digital signature", "key encipherment"],
        "username": "system:serviceaccount:cert-manager:cert-manager",
        "uid": "7d7a1f8a-1111-2222-3333-444455556666",
        "groups": ["system:serviceaccounts", "system:authenticated"]
    });
    if let (Value::Object(s), Value::Object(extra)) = (&mut spec, spec_extra) {
        s.extend(extra);
    }
    let mut v = object(
        "cert-manager.io/v1",
        "CertificateRequest",
        Some("a"),
        "web-1",
        "42",
        json!({
            "metadata": {"annotations": {
                "cert-manager.io/certificate-name": "web",
                "cert-manager.io/certificate-revision": "1",
                "cert-manager.io/private-key-secret-name": "web-abcde"
            }},
            "spec": spec
        }),
    );
    if !conditions.is_empty() {
        v["status"] = json!({ "conditions": conditions });
    }
    v
}

fn cr(spec_extra: Value, conditions: Vec<Value>) -> Arc<CertificateRequest> {
    Arc::new(serde_json::from_value(cr_json(spec_extra, conditions)).unwrap())
}

fn ready(status: &str, reason: &str, message: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": NOW_STR})
}

/// The exact merge patch the bridge must send for this status.
fn patch_with(status: Value) -> Value {
    json!({"metadata": {"resourceVersion": "42"}, "status": status})
}

/// One certificate for every test (the same value each call): an X509-SVID for
/// `spiffe://example.org/ns/a/sa/web`, valid 24 hours from `NOW`.
fn signed() -> Signed {
    static SIGNED: std::sync::OnceLock<Signed> = std::sync::OnceLock::new();
    SIGNED
        .get_or_init(|| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
            p.subject_alt_names = vec![rcgen::SanType::URI(
                "spiffe://example.org/ns/a/sa/web".try_into().unwrap(),
            )];
            p.not_before = time::OffsetDateTime::from_unix_timestamp(NOW as i64).unwrap();
            p.not_after =
                time::OffsetDateTime::from_unix_timestamp((NOW + 24 * 3600) as i64).unwrap();
            let der = p.self_signed(&key).unwrap().der().to_vec();
            Signed {
                certificate: signet_pki::SvidCertificate::from_chain_der(vec![der]).unwrap(),
                ca_pem: "-----BEGIN CERTIFICATE-----\nUk9PVA==\n-----END CERTIFICATE-----\n".into(),
            }
        })
        .clone()
}

// ---- pure decisions ----

#[test]
fn triage_follows_the_contract() {
    let other = cr(
        json!({"issuerRef": {"name": "x", "kind": "Issuer", "group": "cert-manager.io"}}),
        vec![approved()],
    );
    assert_eq!(triage(&other), Triage::NotOurs);
    let default_group = cr(json!({"issuerRef": {"name": "signet"}}), vec![approved()]);
    assert_eq!(triage(&default_group), Triage::NotOurs);
    assert_eq!(triage(&cr(json!({}), vec![])), Triage::NotApproved);
    assert_eq!(
        triage(&cr(
            json!({}),
            vec![json!({"type": "Approved", "status": "False"})]
        )),
        Triage::NotApproved
    );
    assert_eq!(
        triage(&cr(
            json!({}),
            vec![json!({"type": "Denied", "status": "True", "reason": "policy"})]
        )),
        Triage::Denied
    );
    assert_eq!(
        triage(&cr(
            json!({}),
            vec![
                json!({"type": "Denied", "status": "True"}),
                ready("False", "Denied", "d")
            ]
        )),
        Triage::AlreadyDenied
    );
    assert_eq!(
        triage(&cr(
            json!({}),
            vec![approved(), ready("False", "Failed", "x")]
        )),
        Triage::AlreadyFailed
    );
    assert_eq!(
        triage(&cr(
            json!({}),
            vec![approved(), ready("True", "Issued", "x")]
        )),
        Triage::AlreadyIssued
    );
    let mut with_cert = cr_json(json!({}), vec![approved()]);
    with_cert["status"]["certificate"] = json!(STANDARD.encode("PEM"));
    assert_eq!(
        triage(&serde_json::from_value(with_cert).unwrap()),
        Triage::AlreadyIssued
    );
    // Pending is not final: it is retried.
    let RefMatch::Ours(key) = IssuerKey::from_ref(&cr(json!({}), vec![]).spec.issuer_ref, "a")
    else {
        panic!()
    };
    assert_eq!(
        triage(&cr(
            json!({}),
            vec![approved(), ready("False", "Pending", "x")]
        )),
        Triage::Proceed(key.clone())
    );
    assert_eq!(
        triage(&cr(json!({}), vec![approved()])),
        Triage::Proceed(key)
    );
    let cluster = cr(
        json!({"issuerRef": {"name": "s", "kind": "ClusterIssuer", "group": "signet.dev"}}),
        vec![approved()],
    );
    assert!(matches!(triage(&cluster), Triage::Proceed(k) if k.to_string() == "ClusterIssuer/s"));
    let unknown = cr(
        json!({"issuerRef": {"name": "s", "kind": "Foo", "group": "signet.dev"}}),
        vec![approved()],
    );
    assert_eq!(triage(&unknown), Triage::UnknownKind("Foo".into()));
}

#[test]
fn prepare_checks_request() {
    assert_eq!(
        prepare(&cr(json!({}), vec![])).unwrap().ttl,
        Some(Duration::from_secs(86400))
    );
    assert_eq!(
        prepare(&cr(json!({"duration": null}), vec![])).unwrap().ttl,
        None
    );
    assert!(
        prepare(&cr(json!({"duration": "3d"}), vec![]))
            .unwrap_err()
            .to_string()
            .contains("spec.duration")
    );
    assert!(
        prepare(&cr(json!({"isCA": true}), vec![]))
            .unwrap_err()
            .to_string()
            .contains("isCA")
    );
    assert!(
        prepare(&cr(json!({"request": STANDARD.encode("nope")}), vec![]))
            .unwrap_err()
            .to_string()
            .contains("PEM")
    );
}

#[test]
fn outcomes() {
    let key = IssuerKey {
        kind: issuers::IssuerKind::Issuer,
        namespace: Some("a".into()),
        name: "s".into(),
    };
    let ok = outcome_of(&key, Some(Duration::from_secs(3600)), Ok(signed()));
    assert_eq!(
        (ok.ready, ok.reason, ok.retry),
        (ConditionStatus::True, "Issued", false)
    );
    assert!(!ok.message.contains("shortened"));
    let clamped = outcome_of(&key, Some(Duration::from_secs(1000 * 3600)), Ok(signed()));
    assert!(
        clamped
            .message
            .contains("shortened the requested duration 1000h to 24h"),
        "{}",
        clamped.message
    );
    let f = outcome_of(
        &key,
        None,
        Err(SignError::permanent("PermissionDenied", "not in ns a")),
    );
    assert_eq!((f.reason, f.failed, f.retry), ("Failed", true, false));
    assert!(f.message.contains("not in ns a"));
    let p = outcome_of(&key, None, Err(SignError::retryable("Unavailable", "down")));
    assert_eq!((p.reason, p.failed, p.retry), ("Pending", false, true));
}

#[test]
fn next_status_only_when_changed() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(NOW);
    let st = next_status(None, &Outcome::pending("wait"), now).unwrap();
    assert!(
        next_status(
            Some(&st),
            &Outcome::pending("wait"),
            now + Duration::from_secs(5)
        )
        .is_none()
    );
    let failed = next_status(
        Some(&st),
        &Outcome::failed("bad"),
        now + Duration::from_secs(9),
    )
    .unwrap();
    assert_eq!(
        failed.failure_time,
        Some(conditions::time(now + Duration::from_secs(9)))
    );
}

#[test]
fn issuer_gate_messages() {
    let key = IssuerKey {
        kind: issuers::IssuerKind::Issuer,
        namespace: Some("a".into()),
        name: "signet".into(),
    };
    assert!(
        issuer_gate(&key, None)
            .unwrap_err()
            .to_string()
            .contains("Issuer/a/signet not found")
    );
    let not_ready: crate::crd::Issuer =
        serde_json::from_value(issuer(Some(("False", "Unreachable")))).unwrap();
    let e = issuer_gate(&key, Some(&IssuerObj::from(not_ready)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not Ready (Unreachable: m)"), "{e}");
    let ready: crate::crd::Issuer =
        serde_json::from_value(issuer(Some(("True", "Connected")))).unwrap();
    assert!(issuer_gate(&key, Some(&IssuerObj::from(ready))).is_ok());
}

// ---- against the mock API server ----

async fn run(
    f: Fixture,
    cr: Arc<CertificateRequest>,
    scenario: Vec<Expect>,
) -> (Action, Vec<crate::testing::Received>) {
    let Fixture {
        ctx, api, _bridge, ..
    } = f;
    let server = api.run(scenario);
    let action = reconcile(cr, ctx.clone()).await.unwrap();
    drop(ctx);
    (action, server.finish().await)
}

#[tokio::test]
async fn not_approved_makes_no_call() {
    let backend = FakeBackend::answering(Ok(signed()));
    let (action, got) = run(fixture(backend.clone()), cr(json!({}), vec![]), vec![]).await;
    assert_eq!(action, Action::await_change());
    assert!(got.is_empty());
    assert!(backend.calls().is_empty());
}

#[tokio::test]
async fn other_issuers_requests_are_ignored() {
    let backend = FakeBackend::answering(Ok(signed()));
    let other = cr(
        json!({"issuerRef": {"name": "ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}),
        vec![approved()],
    );
    let (_, got) = run(fixture(backend.clone()), other, vec![]).await;
    assert!(got.is_empty());
    assert!(backend.calls().is_empty());
}

#[tokio::test]
async fn denied_becomes_ready_false_denied_with_failure_time() {
    let denied = json!({"type": "Denied", "status": "True", "reason": "policy.cert-manager.io",
        "message": "no policy allows it", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let backend = FakeBackend::answering(Ok(signed()));
    let f = fixture(backend.clone());
    let body = patch_with(json!({
        "conditions": [denied.clone(), ready("False", "Denied", "The CertificateRequest was denied by an approval controller")],
        "failureTime": NOW_STR
    }));
    let (action, _) = run(
        f,
        cr(json!({}), vec![denied]),
        vec![
            Expect::patch(&format!("{CR_PATH}/status"))
                .content_type("application/merge-patch+json")
                .body(body)
                .respond(cr_json(json!({}), vec![])),
        ],
    )
    .await;
    assert_eq!(action, Action::await_change());
    assert!(backend.calls().is_empty());
}

#[tokio::test]
async fn already_signed_is_left_alone() {
    let mut v = cr_json(json!({}), vec![approved()]);
    v["status"]["certificate"] = json!(STANDARD.encode("-----BEGIN CERTIFICATE-----"));
    let backend = FakeBackend::answering(Ok(signed()));
    let (action, got) = run(
        fixture(backend.clone()),
        Arc::new(serde_json::from_value(v).unwrap()),
        vec![],
    )
    .await;
    assert_eq!(action, Action::await_change());
    assert!(got.is_empty() && backend.calls().is_empty());
    let failed = cr(json!({}), vec![approved(), ready("False", "Failed", "x")]);
    let (_, got) = run(fixture(backend.clone()), failed, vec![]).await;
    assert!(got.is_empty() && backend.calls().is_empty());
}

#[tokio::test]
async fn issuer_not_ready_is_pending_with_backoff() {
    let backend = FakeBackend::answering(Ok(signed()));
    let f = fixture(backend.clone());
    let msg = "Issuer/a/signet is not Ready (Unreachable: m)";
    let (action, _) = run(
        f,
        cr(json!({}), vec![approved()]),
        vec![
            Expect::get(ISSUER_PATH).respond(issuer(Some(("False", "Unreachable")))),
            Expect::patch(&format!("{CR_PATH}/status"))
                .content_type("application/merge-patch+json")
                .body(patch_with(
                    json!({"conditions": [approved(), ready("False", "Pending", msg)]}),
                ))
                .respond(cr_json(json!({}), vec![])),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(Duration::from_secs(1)));
    assert!(backend.calls().is_empty());
}

#[tokio::test]
async fn missing_issuer_is_pending() {
    let backend = FakeBackend::answering(Ok(signed()));
    let f = fixture(backend.clone());
    let (action, got) = run(
        f,
        cr(json!({}), vec![approved()]),
        vec![
            Expect::get(ISSUER_PATH).not_found("issuers.signet.dev", "signet"),
            Expect::patch(&format!("{CR_PATH}/status")).respond(cr_json(json!({}), vec![])),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(Duration::from_secs(1)));
    let c = &got[1].body["status"]["conditions"][1];
    assert_eq!(c["reason"], "Pending");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .starts_with("Issuer/a/signet not found: create it")
    );
}

/// Approved, issuer Ready, but the request itself is bad: Failed before any server call.
async fn fails_before_signing(spec_extra: Value, want_in_message: &str) {
    let backend = FakeBackend::answering(Ok(signed()));
    let f = fixture(backend.clone());
    let want = want_in_message.to_owned();
    let (action, _) = run(
        f,
        cr(spec_extra, vec![approved()]),
        vec![
            Expect::get(ISSUER_PATH).respond(issuer(Some(("True", "Connected")))),
            Expect::patch(&format!("{CR_PATH}/status"))
                .content_type("application/merge-patch+json")
                .body_with(move |b| {
                    assert_eq!(b["metadata"], json!({"resourceVersion": "42"}));
                    assert_eq!(b["status"]["conditions"][0], approved());
                    let r = &b["status"]["conditions"][1];
                    assert_eq!(
                        (
                            r["type"].as_str(),
                            r["status"].as_str(),
                            r["reason"].as_str()
                        ),
                        (Some("Ready"), Some("False"), Some("Failed"))
                    );
                    assert_eq!(r["lastTransitionTime"], NOW_STR);
                    assert!(
                        r["message"].as_str().unwrap().contains(&want),
                        "{}",
                        r["message"]
                    );
                    assert_eq!(b["status"]["failureTime"], NOW_STR);
                    assert!(b["status"].get("certificate").is_none());
                    assert_eq!(b.as_object().unwrap().len(), 2);
                })
                .respond(cr_json(json!({}), vec![])),
        ],
    )
    .await;
    assert_eq!(action, Action::await_change());
    assert!(backend.calls().is_empty(), "the server must not be called");
}

#[tokio::test]
async fn bad_csr_fails() {
    fails_before_signing(
        json!({"request": STANDARD.encode("not a csr")}),
        "spec.request is not a PEM certificate request",
    )
    .await;
}

#[tokio::test]
async fn is_ca_fails() {
    fails_before_signing(json!({"isCA": true}), "spec.isCA is true").await;
}

#[tokio::test]
async fn usages_mismatch_fails() {
    let pem = csr_pem(|p| {
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    });
    fails_before_signing(
        json!({"request": STANDARD.encode(pem), "usages": ["digital signature", "server auth"]}),
        "the CSR's key usages [client auth, digital signature] disagree with spec.usages [digital signature, server auth]",
    )
    .await;
}

#[tokio::test]
async fn success_writes_certificate_ca_and_issued() {
    let backend = FakeBackend::answering(Ok(signed()));
    let f = fixture(backend.clone());
    let s = signed();
    let body = patch_with(json!({
        "conditions": [approved(), ready("True", "Issued",
            "Certificate issued by Issuer/a/signet for spiffe://example.org/ns/a/sa/web")],
        "certificate": STANDARD.encode(s.chain_pem()),
        "ca": STANDARD.encode(&s.ca_pem),
    }));
    let events = f.events.clone();
    let (action, _) = run(
        f,
        cr(json!({}), vec![approved()]),
        vec![
            Expect::get(ISSUER_PATH).respond(issuer(Some(("True", "Connected")))),
            Expect::patch(&format!("{CR_PATH}/status"))
                .content_type("application/merge-patch+json")
                .body(body)
                .respond(cr_json(json!({}), vec![])),
        ],
    )
    .await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        backend.calls(),
        vec![(
            "Issuer/a/signet".to_owned(),
            "a".to_owned(),
            Some(Duration::from_secs(86400))
        )]
    );
    assert_eq!(
        events.all(),
        [(
            "CertificateRequest/a/web-1".to_owned(),
            crate::events::Note::new(
                false,
                "Issued",
                "Certificate issued by Issuer/a/signet for spiffe://example.org/ns/a/sa/web",
                "SignRequest"
            )
        )]
    );
}

#[tokio::test]
async fn permanent_server_error_fails_with_its_message() {
    let msg = "bridge may only obtain identities under spiffe://example.org/ns/a/, not spiffe://example.org/ns/b/sa/x";
    let backend = FakeBackend::answering(Err(SignError::permanent("PermissionDenied", msg)));
    let f = fixture(backend.clone());
    let events = f.events.clone();
    let (action, got) = run(
        f,
        cr(json!({}), vec![approved()]),
        vec![
            Expect::get(ISSUER_PATH).respond(issuer(Some(("True", "Connected")))),
            Expect::patch(&format!("{CR_PATH}/status")).respond(cr_json(json!({}), vec![])),
        ],
    )
    .await;
    assert_eq!(action, Action::await_change());
    let ev = events.all();
    assert_eq!(ev.len(), 1);
    assert!(ev[0].1.warning && ev[0].1.reason == "Failed", "{ev:?}");
    let st = &got[1].body["status"];
    assert_eq!(st["conditions"][1]["reason"], "Failed");
    assert_eq!(
        st["conditions"][1]["message"],
        format!("Signet refused to sign (PermissionDenied): {msg}")
    );
    assert_eq!(st["failureTime"], NOW_STR);
}

#[tokio::test]
async fn retryable_error_is_pending_then_backs_off_without_rewriting() {
    let backend = FakeBackend::answering(Err(SignError::retryable(
        "Unavailable",
        "connection refused",
    )));
    let f = fixture(backend.clone());
    let ctx = f.ctx.clone();
    let msg = "Signing failed, will retry with backoff (Unavailable): connection refused";
    let server = f.api.run(vec![
        Expect::get(ISSUER_PATH).respond(issuer(Some(("True", "Connected")))),
        Expect::patch(&format!("{CR_PATH}/status"))
            .body(patch_with(
                json!({"conditions": [approved(), ready("False", "Pending", msg)]}),
            ))
            .respond(cr_json(json!({}), vec![])),
        // Second pass: the watch delivered the Pending status; nothing new to write.
        Expect::get(ISSUER_PATH).respond(issuer(Some(("True", "Connected")))),
        Expect::get(ISSUER_PATH).respond(issuer(Some(("True", "Connected")))),
    ]);
    let a1 = reconcile(cr(json!({}), vec![approved()]), ctx.clone())
        .await
        .unwrap();
    let pending = cr(json!({}), vec![approved(), ready("False", "Pending", msg)]);
    let a2 = reconcile(pending.clone(), ctx.clone()).await.unwrap();
    let a3 = reconcile(pending, ctx.clone()).await.unwrap();
    drop((ctx, f.ctx));
    server.finish().await;
    assert_eq!(
        [a1, a2, a3],
        [1, 2, 4].map(|s| Action::requeue(Duration::from_secs(s)))
    );
    assert_eq!(backend.calls().len(), 3);
}

#[tokio::test]
async fn conflicting_status_write_is_an_error_retried_with_backoff() {
    // An approver changed the request after we read it: the resourceVersion precondition
    // fails, nothing is overwritten, and the controller retries after a backoff.
    let backend = FakeBackend::answering(Ok(signed()));
    let Fixture {
        ctx, api, _bridge, ..
    } = fixture(backend.clone());
    let server = api.run(vec![
        Expect::get(ISSUER_PATH).respond(issuer(Some(("True", "Connected")))),
        Expect::patch(&format!("{CR_PATH}/status"))
            .body_with(|b| assert_eq!(b["metadata"]["resourceVersion"], "42"))
            .conflict("Operation cannot be fulfilled on certificaterequests.cert-manager.io \"web-1\": the object has been modified; please apply your changes to the latest version and try again"),
    ]);
    let cr = cr(json!({}), vec![approved()]);
    let err = reconcile(cr.clone(), ctx.clone()).await.unwrap_err();
    assert!(
        err.to_string().contains("the object has been modified"),
        "{err}"
    );
    assert_eq!(
        error_policy(cr, &err, ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    drop(ctx);
    server.finish().await;
}

#[test]
fn issuer_changes_wake_only_waiting_requests_naming_it() {
    let key = IssuerKey {
        kind: issuers::IssuerKind::Issuer,
        namespace: Some("a".into()),
        name: "signet".into(),
    };
    let waiting = cr(
        json!({}),
        vec![approved(), ready("False", "Pending", "issuer not ready")],
    );
    let fresh = cr(json!({}), vec![approved()]);
    let done = cr(json!({}), vec![approved(), ready("True", "Issued", "ok")]);
    let unapproved = cr(json!({}), vec![]);
    let other = cr(
        json!({"issuerRef": {"name": "other", "kind": "Issuer", "group": "signet.dev"}}),
        vec![approved()],
    );
    let all = [&waiting, &fresh, &done, &unapproved, &other];
    let woken = waiting_on(all.iter().map(|a| a.as_ref()), &key);
    assert_eq!(woken.len(), 2);
    assert!(
        woken
            .iter()
            .all(|r| r.name == "web-1" && r.namespace.as_deref() == Some("a"))
    );
}
