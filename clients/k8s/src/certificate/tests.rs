//! The Certificate reconcilers against a scripted API server: the exact requests (Secret GET,
//! server-side apply with its query, status merge patches) for each case.

use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::*;
use crate::testing::{Expect, Stored, applied, not_found, scripted};
use signet_runtime::clock::FakeClock;
use signet_runtime::random::FixedRandom;

const T0: u64 = 1_767_225_600; // 2026-01-01T00:00:00Z
const T0_S: &str = "2026-01-01T00:00:00Z";
const SECRET_URI: &str = "/api/v1/namespaces/a/secrets/web-tls";
const STATUS_URI: &str = "/apis/cert-manager.io/v1/namespaces/a/certificates/web/status?";
const APPLY_QUERY: &str = "?&fieldManager=signet-k8s";

/// Signs CSRs with a throwaway CA, or fails as told; records what it was asked.
pub struct FakeSigner {
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca_pem: String,
    clock: FakeClock,
    /// The longest lifetime it issues (the server's clamp).
    max: Duration,
    pub fail: Option<SignError>,
    pub calls: Mutex<Vec<(String, Option<Duration>)>>,
}

impl FakeSigner {
    pub fn new(clock: FakeClock, max: Duration) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = p.self_signed(&key).unwrap().pem();
        Self {
            ca: rcgen::Issuer::new(p, key),
            ca_pem,
            clock,
            max,
            fail: None,
            calls: Mutex::new(Vec::new()),
        }
    }
}

impl FakeSigner {
    /// Its CA's key ID (lowercase hex subject key identifier), as a taint names it.
    pub fn key_id(&self) -> String {
        signet_pki::ParsedCert::from_pem_first(self.ca_pem.as_bytes())
            .unwrap()
            .subject_key_id()
            .unwrap()
            .to_owned()
    }

    /// A DER CRL of its CA numbered `number` listing the serials (raw DER integer bytes).
    pub fn crl(&self, number: u64, serials: &[Vec<u8>]) -> Vec<u8> {
        let now = self.clock.now();
        rcgen::CertificateRevocationListParams {
            this_update: now.into(),
            next_update: (now + Duration::from_secs(3600)).into(),
            crl_number: rcgen::SerialNumber::from(number.to_be_bytes().to_vec()),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from(s.clone()),
                    revocation_time: now.into(),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.ca)
        .unwrap()
        .der()
        .to_vec()
    }
}

impl CertSigner for FakeSigner {
    fn sign<'a>(
        &'a self,
        _issuer: &'a IssuerKey,
        csr: &'a [u8],
        namespace: &'a str,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Signed, SignError>> {
        Box::pin(async move {
            self.calls.lock().unwrap().push((namespace.to_owned(), ttl));
            if let Some(e) = &self.fail {
                return Err(e.clone());
            }
            let mut req =
                rcgen::CertificateSigningRequestParams::from_pem(std::str::from_utf8(csr).unwrap())
                    .unwrap();
            let now = self.clock.now();
            let life = ttl.unwrap_or(self.max).min(self.max);
            let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
            req.params.not_before = time::OffsetDateTime::from_unix_timestamp(secs).unwrap();
            req.params.not_after =
                time::OffsetDateTime::from_unix_timestamp(secs + life.as_secs() as i64).unwrap();
            req.params.use_authority_key_identifier_extension = true;
            let leaf = req.signed_by(&self.ca).unwrap();
            Ok(Signed {
                certificate: signet_pki::SvidCertificate::from_chain_der(vec![leaf.der().to_vec()])
                    .unwrap(),
                ca_pem: self.ca_pem.clone(),
            })
        })
    }
}

/// A Certificate as the API server returns it (cert-manager's CRD shape).
fn certificate(name: &str, spec: Value) -> Value {
    let mut c = json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {
            "name": name, "namespace": "a", "uid": format!("uid-{name}"),
            "resourceVersion": "100", "generation": 1,
            "creationTimestamp": "2025-12-31T23:59:00Z",
            "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update",
                "apiVersion": "cert-manager.io/v1", "time": "2025-12-31T23:59:00Z",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
        },
        "spec": {
            "secretName": "web-tls",
            "duration": "24h",
            "issuerRef": {"name": "signet", "kind": "Issuer", "group": "signet.dev"},
            "uris": ["spiffe://example.org/ns/a/sa/web"],
            "dnsNames": ["web.a.svc"],
            "secretTemplate": {"labels": {"app": "web"}, "annotations": {"team": "payments"}}
        }
    });
    crate::testing::merge(&mut c, &json!({ "spec": spec }));
    c
}

fn context(
    client: Client,
    signer: Arc<FakeSigner>,
    clock: FakeClock,
    peers: &[Value],
) -> Arc<Context> {
    context_with(
        client,
        signer,
        clock,
        peers,
        Arc::new(crate::events::NoEvents),
    )
}

fn context_with(
    client: Client,
    signer: Arc<FakeSigner>,
    clock: FakeClock,
    peers: &[Value],
    events: Arc<dyn crate::events::Events>,
) -> Arc<Context> {
    let mut w: Writer<Certificate> = Writer::default();
    for p in peers {
        let c: Certificate = serde_json::from_value(p.clone()).unwrap();
        w.apply_watcher_event(&watcher::Event::Apply(c));
    }
    Arc::new(Context {
        client,
        signer,
        clock: Arc::new(clock),
        random: Arc::new(FixedRandom(0.5)),
        peers: w.as_reader(),
        owner_ref: false,
        events,
        bundle: tokio::sync::watch::channel(None).1,
    })
}

fn parse(v: &Value) -> Arc<Certificate> {
    Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": T0_S, "observedGeneration": 1})
}

#[tokio::test]
async fn success_applies_the_secret_and_walks_the_status() {
    let clock = FakeClock::at_unix(T0);
    let signer_clock = clock.clone();
    let signer = Arc::new(FakeSigner::new(
        clock.clone(),
        Duration::from_secs(24 * 3600),
    ));
    let obj = certificate("web", json!({}));
    let stored = Stored::new(obj.clone());
    let (client, server) = scripted(vec![
        Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "web-tls")),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", format!("{SECRET_URI}{APPLY_QUERY}"), applied("s1")),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
    ]);
    let events = Arc::new(crate::testing::RecordedEvents::default());
    let ctx = context_with(
        client,
        signer.clone(),
        clock,
        std::slice::from_ref(&obj),
        events.clone(),
    );
    let action = reconcile(parse(&obj), ctx).await.unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        events.all(),
        [(
            "Certificate/a/web".to_owned(),
            crate::events::Note::new(
                false,
                "Issued",
                "The certificate has been issued into Secret \"web-tls\" (revision 1)",
                "IssueCertificate"
            )
        )]
    );

    // trigger
    assert_eq!(
        seen[1].body,
        json!({"status": {"conditions": [cond("Issuing", "True", "DoesNotExist",
            "Issuing certificate as Secret \"web-tls\" does not exist")]}})
    );
    // issuing: the Secret, by server-side apply (no force: it did not exist)
    let body = &seen[2].body;
    let data = |k: &str| {
        String::from_utf8(STANDARD.decode(body["data"][k].as_str().unwrap()).unwrap()).unwrap()
    };
    let (tls_crt, tls_key, ca_crt) = (data("tls.crt"), data("tls.key"), data("ca.crt"));
    assert!(tls_crt.starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(tls_key.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    assert_eq!(ca_crt, signer.ca_pem);
    assert_eq!(
        *body,
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {
                "name": "web-tls", "namespace": "a",
                "labels": {"app": "web", "signet.dev/managed-by": "signet-k8s"},
                "annotations": {
                    "team": "payments",
                    "cert-manager.io/certificate-name": "web",
                    "cert-manager.io/issuer-name": "signet",
                    "cert-manager.io/issuer-kind": "Issuer",
                    "cert-manager.io/issuer-group": "signet.dev",
                    "cert-manager.io/uri-sans": "spiffe://example.org/ns/a/sa/web",
                    "cert-manager.io/alt-names": "web.a.svc",
                    "cert-manager.io/common-name": "",
                    "signet.dev/requested-duration": "24h"
                }
            },
            "data": body["data"].clone(),
        })
    );
    let c = policy::IssuedCert::parse(tls_crt.as_bytes()).unwrap();
    assert_eq!(c.uris, ["spiffe://example.org/ns/a/sa/web"]);
    assert_eq!(c.dns_names, ["web.a.svc"]);
    assert_eq!(
        *signer.calls.lock().unwrap(),
        [("a".to_owned(), Some(Duration::from_secs(24 * 3600)))]
    );
    // issuing: done
    assert_eq!(
        seen[3].body,
        json!({"status": {"conditions": null, "revision": 1}})
    );
    // readiness: 24h lifetime, renewal at 16h minus 5% of 24h (jitter 0.5) = 14:48
    assert_eq!(
        seen[4].body,
        json!({"status": {
            "conditions": [cond("Ready", "True", "Ready", "Certificate is up to date and has not expired")],
            "notBefore": T0_S, "notAfter": "2026-01-02T00:00:00Z", "renewalTime": "2026-01-01T14:48:00Z"
        }})
    );
    assert_eq!(action, Action::requeue(Duration::from_secs(3600)));

    // Settled: the next pass reads the Secret and writes nothing.
    let secret = applied("s1")(&seen[2].body).1;
    let (client, server) = scripted(vec![Expect::reply("GET", SECRET_URI, 200, secret.clone())]);
    let clock = FakeClock::at_unix(T0 + 60);
    let obj = stored.get();
    let ctx = context(client, signer.clone(), clock, std::slice::from_ref(&obj));
    reconcile(parse(&obj), ctx).await.unwrap();
    assert_eq!(server.await.unwrap().len(), 1);

    // At the renewal time the trigger fires with reason Renewing, and the Secret is re-applied
    // with force (it is ours now), revision 2.
    let clock = signer_clock;
    clock.set(UNIX_EPOCH + Duration::from_secs(T0 + 14 * 3600 + 48 * 60));
    let stored2 = Stored::new(obj.clone());
    let (client, server) = scripted(vec![
        Expect::reply("GET", SECRET_URI, 200, secret),
        Expect::exchange("PATCH", STATUS_URI, stored2.merge_patch()),
        Expect::exchange(
            "PATCH",
            format!("{SECRET_URI}?&force=true&fieldManager=signet-k8s"),
            applied("s1"),
        ),
        Expect::exchange("PATCH", STATUS_URI, stored2.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored2.merge_patch()),
    ]);
    let ctx = context(client, signer, clock, std::slice::from_ref(&obj));
    reconcile(parse(&obj), ctx).await.unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        seen[1].body["status"]["conditions"][1]["reason"],
        "Renewing"
    );
    assert_eq!(seen[3].body["status"]["revision"], 2);
    assert_eq!(seen[4].body["status"]["notAfter"], "2026-01-02T14:48:00Z");
}

#[tokio::test]
async fn clamped_lifetime_is_reported_in_ready() {
    let clock = FakeClock::at_unix(T0);
    let signer = Arc::new(FakeSigner::new(clock.clone(), Duration::from_secs(3600)));
    let obj = certificate("web", json!({}));
    let stored = Stored::new(obj.clone());
    let (client, server) = scripted(vec![
        Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "web-tls")),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", format!("{SECRET_URI}{APPLY_QUERY}"), applied("s1")),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
    ]);
    reconcile(
        parse(&obj),
        context(client, signer, clock, std::slice::from_ref(&obj)),
    )
    .await
    .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        seen[4].body["status"]["conditions"][0]["message"],
        "Certificate is up to date and has not expired; the server limited its lifetime to 1h (spec.duration asks for 1day)"
    );
}

/// A case that must end in one Ready=False status patch and nothing else.
async fn refused(obj: Value, secret: Option<Value>, peers: &[Value]) -> Value {
    let clock = FakeClock::at_unix(T0);
    let signer = Arc::new(FakeSigner::new(clock.clone(), Duration::from_secs(3600)));
    let stored = Stored::new(obj.clone());
    let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
    let mut script = Vec::new();
    if obj["spec"]["secretName"] != "" {
        script.push(match secret {
            Some(s) => Expect::reply("GET", SECRET_URI, 200, s),
            None => Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "web-tls")),
        });
    }
    script.push(Expect::exchange(
        "PATCH",
        format!("/apis/cert-manager.io/v1/namespaces/a/certificates/{name}/status?"),
        stored.merge_patch(),
    ));
    let (client, server) = scripted(script);
    let ctx = context(client, signer.clone(), clock, peers);
    let action = reconcile(parse(&obj), ctx).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(3600)));
    assert!(signer.calls.lock().unwrap().is_empty());
    let seen = server.await.unwrap();
    seen.last().unwrap().body.clone()
}

#[tokio::test]
async fn no_secret_name_is_a_condition() {
    let body = refused(certificate("web", json!({"secretName": ""})), None, &[]).await;
    assert_eq!(
        body,
        json!({"status": {"conditions": [cond("Ready", "False", "MissingSecretName",
            "spec.secretName is empty: name the Secret the certificate and key are written to")]}})
    );
}

#[tokio::test]
async fn unsupported_key_is_a_condition() {
    let body = refused(
        certificate(
            "web",
            json!({"privateKey": {"algorithm": "RSA", "size": 1024}}),
        ),
        None,
        &[],
    )
    .await;
    assert_eq!(
        body,
        json!({"status": {"conditions": [cond("Ready", "False", "UnsupportedPrivateKey",
            "privateKey: RSA size 1024 is not valid; use 2048, 3072 or 4096")]}})
    );
}

#[tokio::test]
async fn missing_spiffe_id_is_a_condition() {
    let body = refused(certificate("web", json!({"uris": null})), None, &[]).await;
    assert_eq!(body["status"]["conditions"][0]["reason"], "MissingSPIFFEID");
    let body = refused(
        certificate("web", json!({"ipAddresses": ["10.0.0.1"]})),
        None,
        &[],
    )
    .await;
    assert_eq!(body["status"]["conditions"][0]["reason"], "UnsupportedSANs");
    let body = refused(certificate("web", json!({"isCA": true})), None, &[]).await;
    assert_eq!(body["status"]["conditions"][0]["reason"], "CANotSupported");
}

#[tokio::test]
async fn a_secret_owned_by_someone_else_is_never_written() {
    // As `kubectl create secret tls web-tls` leaves it.
    let foreign = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "web-tls", "namespace": "a", "uid": "x1", "resourceVersion": "9",
            "creationTimestamp": "2025-12-01T00:00:00Z"},
        "data": {"tls.crt": "LS0tLQ==", "tls.key": "LS0tLQ=="}
    });
    let obj = certificate("web", json!({}));
    let body = refused(obj.clone(), Some(foreign), std::slice::from_ref(&obj)).await;
    assert_eq!(
        body,
        json!({"status": {"conditions": [cond("Ready", "False", "SecretOwnedByOther",
            "Secret \"web-tls\" exists and is not managed by a Certificate (no cert-manager.io/certificate-name annotation); it is left untouched: delete it or choose another spec.secretName")]}})
    );
}

#[tokio::test]
async fn two_certificates_on_one_secret_both_stop() {
    let web = certificate("web", json!({}));
    let api = certificate("api", json!({}));
    let peers = [web.clone(), api.clone()];
    let body = refused(web, None, &peers).await;
    assert_eq!(
        body,
        json!({"status": {"conditions": [cond("Ready", "False", "SecretConflict",
            "Secret \"web-tls\" is also named by Certificate api: neither is issued until only one names it")]}})
    );
    let body = refused(api, None, &peers).await;
    assert_eq!(
        body["status"]["conditions"][0]["message"],
        "Secret \"web-tls\" is also named by Certificate web: neither is issued until only one names it"
    );
}

#[tokio::test]
async fn server_unreachable_backs_off_without_a_hot_loop() {
    let clock = FakeClock::at_unix(T0);
    let mut signer = FakeSigner::new(clock.clone(), Duration::from_secs(3600));
    signer.fail = Some(SignError::retryable("Unreachable", "connection refused"));
    let signer = Arc::new(signer);
    let obj = certificate("web", json!({}));
    let stored = Stored::new(obj.clone());
    let (client, server) = scripted(vec![
        Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "web-tls")),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
    ]);
    let action = reconcile(
        parse(&obj),
        context(
            client,
            signer.clone(),
            clock.clone(),
            std::slice::from_ref(&obj),
        ),
    )
    .await
    .unwrap();
    let seen = server.await.unwrap();
    let waiting = "Waiting to retry: connection refused; attempt 1, retrying in 1m";
    assert_eq!(
        seen[2].body,
        json!({"status": {
            "conditions": [cond("Issuing", "True", "Unreachable", waiting)],
            "lastFailureTime": T0_S, "failedIssuanceAttempts": 1
        }})
    );
    assert_eq!(
        seen[3].body,
        json!({"status": {"conditions": [
            cond("Issuing", "True", "Unreachable", waiting),
            cond("Ready", "False", "Unreachable", waiting)
        ]}})
    );
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));

    // Within the backoff: no call to the server, no write.
    clock.advance(Duration::from_secs(30));
    let obj = stored.get();
    let (client, server) = scripted(vec![Expect::reply(
        "GET",
        SECRET_URI,
        404,
        not_found("secrets", "web-tls"),
    )]);
    let action = reconcile(
        parse(&obj),
        context(
            client,
            signer.clone(),
            clock.clone(),
            std::slice::from_ref(&obj),
        ),
    )
    .await
    .unwrap();
    assert_eq!(server.await.unwrap().len(), 1);
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    assert_eq!(signer.calls.lock().unwrap().len(), 1);

    // After it: a second attempt, counted, with a doubled wait.
    clock.advance(Duration::from_secs(30));
    let (client, server) = scripted(vec![
        Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "web-tls")),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
    ]);
    let action = reconcile(
        parse(&obj),
        context(client, signer.clone(), clock, std::slice::from_ref(&obj)),
    )
    .await
    .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(seen[1].body["status"]["failedIssuanceAttempts"], 2);
    assert_eq!(action, Action::requeue(Duration::from_secs(120)));
}

#[tokio::test]
async fn permanent_refusal_fails_the_attempt_with_the_servers_reason() {
    let clock = FakeClock::at_unix(T0);
    let mut signer = FakeSigner::new(clock.clone(), Duration::from_secs(3600));
    signer.fail = Some(SignError::permanent(
        "PermissionDenied",
        "namespace a may not have spiffe://example.org/ns/b/sa/web",
    ));
    let obj = certificate("web", json!({"uris": ["spiffe://example.org/ns/b/sa/web"]}));
    let stored = Stored::new(obj.clone());
    let (client, server) = scripted(vec![
        Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "web-tls")),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
    ]);
    let events = Arc::new(crate::testing::RecordedEvents::default());
    reconcile(
        parse(&obj),
        context_with(
            client,
            Arc::new(signer),
            clock,
            std::slice::from_ref(&obj),
            events.clone(),
        ),
    )
    .await
    .unwrap();
    let seen = server.await.unwrap();
    let msg = "The certificate request failed (PermissionDenied): namespace a may not have spiffe://example.org/ns/b/sa/web; attempt 1, retrying in 1m";
    assert_eq!(
        events.all(),
        [(
            "Certificate/a/web".to_owned(),
            crate::events::Note::new(true, "Failed", msg, "IssueCertificate")
        )]
    );
    assert_eq!(
        seen[2].body,
        json!({"status": {"conditions": [cond("Issuing", "False", "Failed", msg)],
            "lastFailureTime": T0_S, "failedIssuanceAttempts": 1}})
    );
    assert_eq!(
        seen[3].body["status"]["conditions"][1],
        cond("Ready", "False", "Failed", msg)
    );
}

#[test]
fn status_patch_sends_only_changes() {
    let old = CertificateStatus {
        revision: Some(1),
        failed_issuance_attempts: Some(2),
        ..Default::default()
    };
    let mut new = old.clone();
    assert_eq!(status_patch(&old, &new), None);
    new.failed_issuance_attempts = None;
    new.revision = Some(2);
    assert_eq!(
        status_patch(&old, &new),
        Some(json!({"status": {"failedIssuanceAttempts": null, "revision": 2}}))
    );
}

#[test]
fn secret_body_has_an_owner_reference_only_when_asked() {
    let cert: Certificate = serde_json::from_value(certificate("web", json!({}))).unwrap();
    let d = policy::validate(&cert).unwrap().unwrap();
    let data = secret::SecretData {
        chain_pem: "chain".into(),
        key_pem: "key".into(),
        ca_pem: "ca".into(),
    };
    assert!(format!("{data:?}").contains("key_pem: \"…\""));
    let without = secret::apply_body(&cert, &d, &data, false);
    assert!(without["metadata"].get("ownerReferences").is_none());
    let with = secret::apply_body(&cert, &d, &data, true);
    assert_eq!(
        with["metadata"]["ownerReferences"],
        json!([{"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "name": "web",
            "uid": "uid-web", "controller": true, "blockOwnerDeletion": true}])
    );
    assert_eq!(with["data"]["tls.key"], STANDARD.encode("key"));
    // secretTemplate cannot take over our annotations.
    let cert: Certificate = serde_json::from_value(certificate(
        "web",
        json!({"secretTemplate": {"annotations": {"cert-manager.io/certificate-name": "other"}}}),
    ))
    .unwrap();
    let body = secret::apply_body(&cert, &d, &data, false);
    assert_eq!(
        body["metadata"]["annotations"]["cert-manager.io/certificate-name"],
        "web"
    );
}

#[tokio::test]
async fn a_refused_secret_write_backs_off_like_a_failure() {
    let clock = FakeClock::at_unix(T0);
    let signer = Arc::new(FakeSigner::new(clock.clone(), Duration::from_secs(3600)));
    let obj = certificate("web", json!({}));
    let stored = Stored::new(obj.clone());
    let conflict = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Apply failed with 1 conflict: conflict with \"helm\": .data.tls.crt",
        "reason": "Conflict", "code": 409});
    let (client, server) = scripted(vec![
        Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "web-tls")),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::reply("PATCH", format!("{SECRET_URI}{APPLY_QUERY}"), 409, conflict),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
    ]);
    let action = reconcile(
        parse(&obj),
        context(client, signer, clock, std::slice::from_ref(&obj)),
    )
    .await
    .unwrap();
    let seen = server.await.unwrap();
    let st = &seen[3].body["status"];
    assert_eq!(st["failedIssuanceAttempts"], 1);
    assert_eq!(st["conditions"][0]["reason"], "SecretWriteFailed");
    assert!(
        st["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("conflict with \\\"helm\\\"")
            || st["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .contains("conflict with \"helm\""),
        "{st}"
    );
    assert_eq!(
        seen[4].body["status"]["conditions"][1]["reason"],
        "SecretWriteFailed"
    );
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
}

// --- taints and CRLs -------------------------------------------------------------------------

fn bundle_with(
    tainted: &[String],
    crls: &[(String, Vec<u8>)],
) -> tokio::sync::watch::Receiver<Option<crate::signer::BundleInfo>> {
    let info = crate::signer::BundleInfo {
        trust_domain: "example.org".into(),
        roots_pem: String::new(),
        revision: 2,
        revocations: crate::revocation::Revocations::new(
            tainted.iter().map(String::as_str),
            crls.iter().map(|(k, d)| (k.as_str(), d.as_slice())),
        ),
    };
    let (tx, rx) = tokio::sync::watch::channel(Some(info));
    std::mem::forget(tx);
    rx
}

/// One reconcile of `obj` (its Secret `secret`, or none) at `now` under `bundle`: with
/// `issues`, the five requests of an issuance, else the Secret read only. Returns the
/// Certificate as stored after it, its Secret, and the action.
async fn pass(
    signer: &Arc<FakeSigner>,
    obj: &Value,
    secret: Option<&Value>,
    now: u64,
    bundle: tokio::sync::watch::Receiver<Option<crate::signer::BundleInfo>>,
    issues: bool,
) -> (Value, Value, Action) {
    let stored = Stored::new(obj.clone());
    let get = match secret {
        Some(s) => Expect::reply("GET", SECRET_URI, 200, s.clone()),
        None => Expect::reply("GET", SECRET_URI, 404, not_found("secrets", "web-tls")),
    };
    let query = if secret.is_some() {
        "?&force=true&fieldManager=signet-k8s"
    } else {
        APPLY_QUERY
    };
    let mut script = vec![get];
    if issues {
        script.extend([
            Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
            Expect::exchange("PATCH", format!("{SECRET_URI}{query}"), applied("s1")),
            Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
            Expect::exchange("PATCH", STATUS_URI, stored.merge_patch()),
        ]);
    }
    let (client, server) = scripted(script);
    signer.clock.set(UNIX_EPOCH + Duration::from_secs(now));
    let ctx = Arc::new(Context {
        client,
        signer: signer.clone(),
        clock: Arc::new(signer.clock.clone()),
        random: Arc::new(FixedRandom(0.5)),
        peers: store_of([serde_json::from_value::<Certificate>(obj.clone()).unwrap()]),
        owner_ref: false,
        events: Arc::new(crate::events::NoEvents),
        bundle,
    });
    let action = reconcile(parse(obj), ctx).await.unwrap();
    let seen = server.await.unwrap();
    let secret = if issues {
        applied("s1")(&seen[2].body).1
    } else {
        secret.cloned().unwrap_or_default()
    };
    (stored.get(), secret, action)
}

fn issuing_reason(seen_obj: &Value) -> Option<String> {
    seen_obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Issuing")
        .map(|c| c["reason"].as_str().unwrap_or_default().to_owned())
}

fn tls_crt(secret: &Value) -> String {
    String::from_utf8(
        STANDARD
            .decode(secret["data"]["tls.crt"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_certificate_under_a_tainted_key_is_reissued_now_with_the_failure_backoff_then_a_revoked_one()
 {
    let clock = FakeClock::at_unix(T0);
    let signer = Arc::new(FakeSigner::new(clock, Duration::from_secs(24 * 3600)));
    let none = || bundle_with(&[], &[]);
    let (obj, secret, _) = pass(
        &signer,
        &certificate("web", json!({})),
        None,
        T0,
        none(),
        true,
    )
    .await;
    let crt0 = tls_crt(&secret);
    let (obj, _, _) = pass(&signer, &obj, Some(&secret), T0 + 60, none(), false).await;

    // The issuing key is tainted (the server keeps signing with it): re-issued at once, with
    // reason IssuerKeyTainted; the new certificate is compromised too, so the issuance counts
    // as a failure and the next waits the failure backoff (1 min).
    let tainted = || bundle_with(&[signer.key_id()], &[]);
    let (obj1, secret1, action) =
        pass(&signer, &obj, Some(&secret), T0 + 60, tainted(), true).await;
    assert_ne!(tls_crt(&secret1), crt0, "re-issued at once, not at 14:48");
    assert_eq!(obj1["status"]["revision"], json!(2));
    assert_eq!(obj1["status"]["failedIssuanceAttempts"], json!(1));
    assert_eq!(
        obj1["status"]["lastFailureTime"],
        json!("2026-01-01T00:01:00Z")
    );
    assert_eq!(issuing_reason(&obj1), None, "the issuance completed");
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
    assert_eq!(signer.calls.lock().unwrap().len(), 2);
    // Within the backoff: nothing (no loop).
    let (obj1, _, action) = pass(&signer, &obj1, Some(&secret1), T0 + 61, tainted(), false).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(59)));
    // After it: again, and the next wait doubles.
    let (obj2, secret2, action) =
        pass(&signer, &obj1, Some(&secret1), T0 + 120, tainted(), true).await;
    assert_eq!(obj2["status"]["failedIssuanceAttempts"], json!(2));
    assert_eq!(action, Action::requeue(Duration::from_secs(120)));
    assert_eq!(signer.calls.lock().unwrap().len(), 3);

    // The taint is lifted: the certificate stands.
    let (obj2, _, _) = pass(&signer, &obj2, Some(&secret2), T0 + 300, none(), false).await;

    // A CRL lists its serial: re-issued (reason Revoked); the new one is clean, the failure
    // counters are cleared.
    let serial = policy::IssuedCert::parse(tls_crt(&secret2).as_bytes())
        .unwrap()
        .serial;
    let crl = signer.crl(1, &[serial]);
    let revoked = || bundle_with(&[], &[(signer.key_id(), crl.clone())]);
    let trig = steps::compromised(
        Some(&policy::SecretView::of(
            &serde_json::from_value(secret2.clone()).unwrap(),
        )),
        &revoked().borrow().as_ref().unwrap().revocations,
    )
    .unwrap();
    assert_eq!(trig.reason, "Revoked");
    assert!(
        trig.message
            .starts_with("Issuing certificate as the certificate is revoked"),
        "{}",
        trig.message
    );
    let (obj3, secret3, action) =
        pass(&signer, &obj2, Some(&secret2), T0 + 301, revoked(), true).await;
    assert_ne!(tls_crt(&secret3), tls_crt(&secret2));
    assert_eq!(obj3["status"]["failedIssuanceAttempts"], Value::Null);
    assert_eq!(obj3["status"]["lastFailureTime"], Value::Null);
    assert_eq!(obj3["status"]["revision"], json!(4));
    assert_eq!(action, Action::requeue(Duration::from_secs(3600)));
    pass(&signer, &obj3, Some(&secret3), T0 + 302, revoked(), false).await;
    assert_eq!(signer.calls.lock().unwrap().len(), 4);
}
