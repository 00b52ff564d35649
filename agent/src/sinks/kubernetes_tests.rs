use super::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The shape of a Secret as the API server returns it, managed by `managers`.
pub(crate) fn secret_object(
    ns: &str,
    name: &str,
    rv: u64,
    labels: Value,
    managers: &[(&str, &str)],
) -> Value {
    let managed: Vec<Value> = managers
        .iter()
        .map(|(m, op)| {
            json!({
                "manager": m, "operation": op, "apiVersion": "v1",
                "time": "2026-12-01T09:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:data": {".": {}, "f:tls.crt": {}, "f:tls.key": {}}, "f:type": {}}
            })
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": name, "namespace": ns,
            "uid": format!("6a1f-{name}"), "resourceVersion": rv.to_string(),
            "creationTimestamp": "2026-12-01T09:00:00Z",
            "labels": labels, "managedFields": managed,
        },
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "dGhlaXJz", "tls.key": "dGhlaXJz"},
    })
}

/// An in-memory API server for Secrets: GET, POST (create, 409 if present), PATCH
/// (server-side apply; 409 when a resourceVersion in the body is stale), DELETE
/// (preconditions). Records every request. `race` bumps the stored version right after
/// a GET, as a concurrent writer would.
#[derive(Default)]
struct FakeApi {
    secrets: Mutex<BTreeMap<String, Value>>,
    seen: Mutex<Vec<KubeRequest>>,
    race: Mutex<bool>,
    rv: Mutex<u64>,
    fail_with: Mutex<Option<u16>>,
}

fn answer(status: u16, body: &Value) -> Result<KubeResponse, KubeError> {
    Ok(KubeResponse {
        status: http::StatusCode::from_u16(status).map_err(|e| e.to_string())?,
        body: serde_json::to_vec(body).map_err(|e| e.to_string())?,
    })
}

impl FakeApi {
    fn next_rv(&self) -> u64 {
        let mut rv = self.rv.lock().expect("lock");
        *rv += 1;
        *rv + 100
    }
    fn get(&self, path: &str) -> Option<Value> {
        self.secrets.lock().expect("lock").get(path).cloned()
    }
    fn put(&self, path: &str, v: Value) {
        self.secrets
            .lock()
            .expect("lock")
            .insert(path.to_owned(), v);
    }
    fn methods(&self) -> Vec<String> {
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .map(|r| r.method.to_string())
            .collect()
    }
}

#[async_trait::async_trait]
impl KubeTransport for FakeApi {
    async fn send(&self, req: KubeRequest) -> Result<KubeResponse, KubeError> {
        self.seen
            .lock()
            .map_err(|e| e.to_string())?
            .push(req.clone());
        if let Some(code) = *self.fail_with.lock().map_err(|e| e.to_string())? {
            return answer(code, &json!({"kind": "Status", "code": code}));
        }
        let not_found =
            json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404});
        let conflict =
            json!({"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409});
        let body: Value = if req.body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&req.body).map_err(|e| e.to_string())?
        };
        let manager = req
            .query
            .iter()
            .find(|(k, _)| k == "fieldManager")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        match req.method {
            http::Method::GET => {
                let Some(obj) = self.get(&req.path) else {
                    return answer(404, &not_found);
                };
                if *self.race.lock().map_err(|e| e.to_string())? {
                    let mut changed = obj.clone();
                    changed["metadata"]["resourceVersion"] = json!(self.next_rv().to_string());
                    self.put(&req.path, changed);
                }
                answer(200, &obj)
            }
            http::Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                let path = format!("{}/{name}", req.path);
                if self.get(&path).is_some() {
                    return answer(
                        409,
                        &json!({"kind": "Status", "reason": "AlreadyExists", "code": 409}),
                    );
                }
                let mut obj = body.clone();
                obj["metadata"]["uid"] = json!(format!("uid-{name}"));
                obj["metadata"]["resourceVersion"] = json!(self.next_rv().to_string());
                obj["metadata"]["managedFields"] = json!([{"manager": manager, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {}}]);
                self.put(&path, obj.clone());
                answer(201, &obj)
            }
            http::Method::PATCH => {
                let Some(mut obj) = self.get(&req.path) else {
                    return answer(404, &not_found);
                };
                if let Some(rv) = body["metadata"]["resourceVersion"].as_str()
                    && Some(rv) != obj["metadata"]["resourceVersion"].as_str()
                {
                    return answer(409, &conflict);
                }
                obj["data"] = body["data"].clone();
                obj["type"] = body["type"].clone();
                for k in ["labels", "annotations"] {
                    if let Some(m) = body["metadata"][k].as_object() {
                        for (key, v) in m {
                            obj["metadata"][k][key] = v.clone();
                        }
                    }
                }
                let mut managed = obj["metadata"]["managedFields"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                managed.retain(|m| !(m["manager"] == json!(manager) && m["operation"] == "Apply"));
                managed.push(json!({"manager": manager, "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {}}));
                obj["metadata"]["managedFields"] = Value::Array(managed);
                obj["metadata"]["resourceVersion"] = json!(self.next_rv().to_string());
                self.put(&req.path, obj.clone());
                answer(200, &obj)
            }
            http::Method::DELETE => {
                let Some(obj) = self.get(&req.path) else {
                    return answer(404, &not_found);
                };
                let pre = &body["preconditions"];
                for (k, field) in [("uid", "uid"), ("resourceVersion", "resourceVersion")] {
                    if !pre[k].is_null() && pre[k] != obj["metadata"][field] {
                        return answer(409, &conflict);
                    }
                }
                self.secrets
                    .lock()
                    .map_err(|e| e.to_string())?
                    .remove(&req.path);
                answer(200, &json!({"kind": "Status", "status": "Success"}))
            }
            _ => answer(405, &json!({})),
        }
    }
}

const PATH: &str = "/api/v1/namespaces/prod/secrets/web-tls";

fn sink(secret_type: SecretType) -> (SecretSink, Arc<FakeApi>) {
    let api = Arc::new(FakeApi::default());
    let s = SecretSink::new(
        "k8s",
        KubernetesSecretSinkConfig {
            namespace: "prod".into(),
            secret_name: "web-tls".into(),
            secret_type,
        },
        api.clone(),
    );
    (s, api)
}

/// The same delivery each time.
fn svid() -> Delivered {
    crate::testing::delivered("spiffe://example.org/ns/prod/sa/web", 1)
}

fn decoded(body: &Value, key: &str) -> String {
    let b64 = body["data"][key].as_str().expect("data key");
    String::from_utf8(B64.decode(b64).expect("base64")).expect("utf8")
}

/// Creates with POST, then updates with a conditional, forced server-side apply: method,
/// path, query, content type and the whole body, for each Secret type.
#[tokio::test]
async fn creates_then_applies_exact_requests_for_both_secret_types() {
    let d = svid();
    for (secret_type, type_name, [chain, key, ca]) in [
        (
            SecretType::KubernetesTls,
            "kubernetes.io/tls",
            ["tls.crt", "tls.key", "ca.crt"],
        ),
        (
            SecretType::IstioKeyAndCert,
            "istio.io/key-and-cert",
            ["cert-chain.pem", "key.pem", "root-cert.pem"],
        ),
    ] {
        let (s, api) = sink(secret_type);
        s.deliver(&d).await.expect("create");
        s.deliver(&d).await.expect("update");
        let seen = api.seen.lock().expect("lock").clone();
        assert_eq!(
            api.methods(),
            ["GET", "POST", "GET", "PATCH"],
            "{type_name}"
        );
        let expected = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "web-tls",
                "namespace": "prod",
                "labels": {"app.kubernetes.io/managed-by": "signet"},
                "annotations": {"signet.dev/spiffe-id": "spiffe://example.org/ns/prod/sa/web"},
            },
            "type": type_name,
            "data": {
                chain: B64.encode(d.chain_pem()),
                key: B64.encode(d.key_pem()),
                ca: B64.encode(d.bundle_pem()),
            },
        });
        let post = &seen[1];
        assert_eq!(post.path, "/api/v1/namespaces/prod/secrets");
        assert_eq!(
            post.query,
            [("fieldManager".to_owned(), "signet-agent".to_owned())]
        );
        assert_eq!(post.content_type, Some("application/json"));
        let body: Value = serde_json::from_slice(&post.body).expect("json");
        assert_eq!(body, expected, "{type_name}");
        assert!(decoded(&body, chain).starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(decoded(&body, key).starts_with("-----BEGIN PRIVATE KEY-----"));

        let patch = &seen[3];
        assert_eq!(patch.path, PATH);
        assert_eq!(
            patch.path_and_query(),
            format!("{PATH}?fieldManager=signet-agent&force=true")
        );
        assert_eq!(patch.content_type, Some("application/apply-patch+yaml"));
        let body: Value = serde_json::from_slice(&patch.body).expect("json");
        let mut with_rv = expected.clone();
        with_rv["metadata"]["resourceVersion"] = json!("101");
        assert_eq!(body, with_rv, "conditional on the version read");
        assert!(!format!("{patch:?}").contains(&B64.encode(d.key_pem())));
    }
}

/// Both Secret types carry the CRLs in `ca.crl`: added when they arrive after the
/// certificate, replaced when they alone change, removed when there are none; CRLs too
/// large for a Secret are left out with a warning, the certificate still written.
#[tokio::test]
async fn crls_are_carried_in_ca_crl_in_both_secret_types() {
    for secret_type in [SecretType::KubernetesTls, SecretType::IstioKeyAndCert] {
        let (s, api) = sink(secret_type);
        let crl = |crls: Vec<Vec<u8>>| Delivered {
            crls_der: crls.into(),
            ..svid()
        };
        s.deliver(&svid()).await.expect("without CRLs");
        assert!(api.get(PATH).expect("stored")["data"][CRL_KEY].is_null());
        let with = crl(vec![vec![1, 9], vec![2, 9]]);
        let applied = s.deliver(&with).await.expect("with CRLs");
        assert!(applied.warnings.is_empty(), "{applied:?}");
        let stored = api.get(PATH).expect("stored");
        let pem_text = decoded(&stored, CRL_KEY);
        assert_eq!(pem_text, with.crls_pem(), "{secret_type:?}");
        let blocks = pem::parse_many(&pem_text).expect("pem");
        assert_eq!(blocks.len(), 2);
        assert!(blocks.iter().all(|b| b.tag() == "X509 CRL"));
        s.deliver(&crl(vec![vec![3, 9]]))
            .await
            .expect("a newer CRL");
        let stored = api.get(PATH).expect("stored");
        assert_eq!(decoded(&stored, CRL_KEY), crl(vec![vec![3, 9]]).crls_pem());
        s.deliver(&svid()).await.expect("none any more");
        assert!(api.get(PATH).expect("stored")["data"][CRL_KEY].is_null());

        // Too large for a Secret: the rest is written, the CRLs left out, and said so.
        let huge = crl(vec![vec![7; MAX_SECRET_CRL_BYTES]]);
        let applied = s.deliver(&huge).await.expect("written without the CRLs");
        assert_eq!(applied.warnings.len(), 1, "{applied:?}");
        assert!(
            applied.warnings[0].contains("ca.crl was left out"),
            "{applied:?}"
        );
        let stored = api.get(PATH).expect("stored");
        assert!(stored["data"][CRL_KEY].is_null());
        assert_eq!(stored["data"].as_object().map(|m| m.len()), Some(3));
    }
}

#[tokio::test]
async fn a_secret_the_agent_does_not_own_is_neither_overwritten_nor_deleted() {
    let label = json!({"app.kubernetes.io/managed-by": "signet"});
    for (labels, managers) in [
        // Someone's own Secret of that name.
        (json!({"app": "web"}), vec![("kubectl-create", "Update")]),
        // The label alone (anyone can set it) is not enough.
        (label.clone(), vec![("kubectl-client-side-apply", "Update")]),
        // Signet's Kubernetes bridge is another field manager.
        (label.clone(), vec![("signet-k8s", "Apply")]),
        // Written by signet-agent once, but relabelled by someone else since.
        (
            json!({}),
            vec![("signet-agent", "Apply"), ("kubectl-edit", "Update")],
        ),
    ] {
        let (s, api) = sink(SecretType::KubernetesTls);
        let theirs = secret_object("prod", "web-tls", 7, labels, &managers);
        api.put(PATH, theirs.clone());
        let err = s.deliver(&svid()).await.expect_err("refused");
        assert_eq!(err.kind, crate::sinks::SinkErrorKind::Refused, "{err}");
        assert!(err.reason.contains("not managed by this agent"), "{err}");
        let err = s.remove().await.expect_err("refused");
        assert_eq!(err.kind, crate::sinks::SinkErrorKind::Refused, "{err}");
        assert_eq!(api.get(PATH), Some(theirs), "untouched");
        assert_eq!(api.methods(), ["GET", "GET"], "nothing but reads");
    }
}

#[tokio::test]
async fn the_agents_own_secret_is_updated_and_deleted_with_preconditions() {
    let (s, api) = sink(SecretType::KubernetesTls);
    let ours = secret_object(
        "prod",
        "web-tls",
        7,
        json!({"app.kubernetes.io/managed-by": "signet"}),
        &[("signet-agent", "Apply")],
    );
    api.put(PATH, ours);
    s.deliver(&svid()).await.expect("update");
    let stored = api.get(PATH).expect("stored");
    assert_eq!(decoded(&stored, "tls.key"), svid().key_pem());
    s.remove().await.expect("delete");
    assert_eq!(api.get(PATH), None);
    let del = api
        .seen
        .lock()
        .expect("lock")
        .last()
        .cloned()
        .expect("delete");
    assert_eq!(del.method, http::Method::DELETE);
    let body: Value = serde_json::from_slice(&del.body).expect("json");
    assert_eq!(body["preconditions"]["uid"], "6a1f-web-tls");
    assert_eq!(
        body["preconditions"]["resourceVersion"],
        stored["metadata"]["resourceVersion"]
    );
    // Absent: nothing to delete.
    s.remove().await.expect("absent is fine");
}

#[tokio::test]
async fn a_change_between_read_and_write_is_not_overwritten() {
    let (s, api) = sink(SecretType::KubernetesTls);
    s.deliver(&svid()).await.expect("create");
    *api.race.lock().expect("lock") = true;
    let before = api.get(PATH);
    let err = s.deliver(&svid()).await.expect_err("conflict");
    assert!(err.reason.contains("409"), "{err}");
    let err = s.remove().await.expect_err("conflict");
    assert!(err.reason.contains("409"), "{err}");
    let after = api.get(PATH).expect("still there");
    assert_eq!(after["data"], before.expect("before")["data"]);
}

#[tokio::test]
async fn api_errors_name_the_sink_not_the_key() {
    let (s, api) = sink(SecretType::KubernetesTls);
    *api.fail_with.lock().expect("lock") = Some(403);
    let err = s.deliver(&svid()).await.expect_err("forbidden");
    let msg = err.to_string();
    assert!(msg.contains("\"k8s\"") && msg.contains("403"), "{msg}");
    assert!(!msg.contains("PRIVATE"), "{msg}");
    *api.fail_with.lock().expect("lock") = Some(500);
    assert!(s.remove().await.is_err());
}

#[test]
fn responses_and_requests_hide_their_bodies() {
    let r = KubeResponse {
        status: http::StatusCode::OK,
        body: b"secret-data".to_vec(),
    };
    assert!(!format!("{r:?}").contains("secret-data"));
}
