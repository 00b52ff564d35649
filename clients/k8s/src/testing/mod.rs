//! A mock Kubernetes API server for controller tests, in the way kube-rs documents: a
//! `tower-test` mock service behind a real [`kube::Client`]. A test lists the exact requests
//! it expects (method, path, query, content type, JSON body) and the real-shaped objects the
//! "API server" answers with; any other request fails the test.
//!
//! ```ignore
//! let (client, api) = mock_client();
//! let server = api.run(vec![
//!     Expect::get("/apis/signet.dev/v1/namespaces/a/issuers/signet").respond(issuer_json),
//!     Expect::patch("/apis/cert-manager.io/v1/namespaces/a/certificaterequests/r/status")
//!         .content_type("application/merge-patch+json")
//!         .body(json!({...}))
//!         .respond(updated_json),
//! ]);
//! reconcile(obj, ctx).await;   // drop every clone of `client` afterwards
//! server.finish().await;       // panics if a request was missing or unexpected
//! ```

use std::fmt;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

pub mod leases;
mod objects;
pub use objects::{Stored, applied, merge, not_found, object, status_failure};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A `kube::Client` whose requests go to the returned [`MockApi`].
pub fn mock_client() -> (Client, MockApi) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), MockApi { handle })
}

/// A client whose API server answers `script` in order, on a task; awaiting the handle
/// yields what was received (a request out of script, or one more than the script holds,
/// fails the test there).
pub fn scripted(script: Vec<Expect>) -> (Client, tokio::task::JoinHandle<Vec<Received>>) {
    let (client, mut api) = mock_client();
    let task = tokio::spawn(async move {
        let mut received = Vec::with_capacity(script.len());
        for e in script {
            received.push(api.expect(e).await);
        }
        api.assert_idle();
        received
    });
    (client, task)
}

/// The API server's side of [`mock_client`].
pub struct MockApi {
    handle: Handle,
}

type BodyCheck = Box<dyn Fn(&Value) + Send>;

/// One expected request and its answer.
pub struct Expect {
    method: Method,
    path: String,
    query: Option<String>,
    content_type: Option<String>,
    body: Option<BodyCheck>,
    respond: Responder,
}

/// How an expected request is answered: a status code and a JSON body, computed from the
/// request's body (a fixed answer ignores it; [`objects::Stored::merge_patch`] merges it).
pub type Responder = Box<dyn FnOnce(&Value) -> (u16, Value) + Send>;

impl fmt::Debug for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if let Some(q) = &self.query {
            write!(f, "?{q}")?;
        }
        Ok(())
    }
}

/// A request as received, for assertions after the fact.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub content_type: Option<String>,
    /// `Value::Null` when the body was empty.
    pub body: Value,
}

impl Expect {
    pub fn new(method: Method, path: &str) -> Self {
        Self {
            method,
            path: path.to_owned(),
            query: None,
            content_type: None,
            body: None,
            respond: Box::new(|_| (200, json!({}))),
        }
    }
    /// A request named by its whole URI, `path?query` (the query, or its absence, is then
    /// checked too), answered by `respond` over the request body — the form a scripted
    /// reconcile (a list of exchanges against merged state) reads best in.
    pub fn exchange(
        method: &str,
        uri: impl Into<String>,
        respond: impl FnOnce(&Value) -> (u16, Value) + Send + 'static,
    ) -> Self {
        let uri = uri.into();
        let (path, query) = uri.split_once('?').unwrap_or((uri.as_str(), ""));
        let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
        Self::new(method, path).query(query).respond_with(respond)
    }
    /// [`Expect::exchange`] with a fixed answer.
    pub fn reply(method: &str, uri: impl Into<String>, code: u16, body: Value) -> Self {
        Self::exchange(method, uri, move |_| (code, body))
    }
    pub fn get(path: &str) -> Self {
        Self::new(Method::GET, path)
    }
    pub fn patch(path: &str) -> Self {
        Self::new(Method::PATCH, path)
    }
    pub fn post(path: &str) -> Self {
        Self::new(Method::POST, path)
    }
    pub fn put(path: &str) -> Self {
        Self::new(Method::PUT, path)
    }
    pub fn delete(path: &str) -> Self {
        Self::new(Method::DELETE, path)
    }
    /// The exact query string (compared as a set of `k=v` pairs; order does not matter).
    /// Without this call the query is not checked.
    pub fn query(mut self, q: &str) -> Self {
        self.query = Some(q.to_owned());
        self
    }
    /// The request's `content-type`, e.g. `application/merge-patch+json` or
    /// `application/apply-patch+yaml`.
    pub fn content_type(mut self, ct: &str) -> Self {
        self.content_type = Some(ct.to_owned());
        self
    }
    /// The request body must equal this JSON exactly.
    pub fn body(mut self, expected: Value) -> Self {
        self.body = Some(Box::new(move |got: &Value| {
            assert_eq!(
                got,
                &expected,
                "request body differs:\n got: {}\nwant: {}",
                serde_json::to_string_pretty(got).unwrap_or_default(),
                serde_json::to_string_pretty(&expected).unwrap_or_default()
            );
        }));
        self
    }
    /// Any check of the request body (assert inside).
    pub fn body_with(mut self, check: impl Fn(&Value) + Send + 'static) -> Self {
        self.body = Some(Box::new(check));
        self
    }
    /// Answer 200 with this object.
    pub fn respond(self, obj: Value) -> Self {
        self.respond_with(move |_| (200, obj))
    }
    /// Answer with what `respond` makes of the request body.
    pub fn respond_with(
        mut self,
        respond: impl FnOnce(&Value) -> (u16, Value) + Send + 'static,
    ) -> Self {
        self.respond = Box::new(respond);
        self
    }
    /// Answer with this status code and body.
    pub fn respond_status(self, code: u16, obj: Value) -> Self {
        self.respond_with(move |_| (code, obj))
    }
    /// Answer 404 with a real `Status` object.
    pub fn not_found(self, resource: &str, name: &str) -> Self {
        self.respond_status(404, not_found(resource, name))
    }
    /// Answer 409 Conflict (e.g. a stale `resourceVersion`).
    pub fn conflict(self, message: &str) -> Self {
        self.respond_status(409, status_failure(409, "Conflict", message))
    }
}

fn pairs(q: &str) -> Vec<&str> {
    let mut v: Vec<&str> = q.split('&').filter(|s| !s.is_empty()).collect();
    v.sort_unstable();
    v
}

impl MockApi {
    /// Waits for the next request, asserts it matches `e`, answers it; returns what came.
    pub async fn expect(&mut self, e: Expect) -> Received {
        let Some((req, send)) = self.handle.next_request().await else {
            panic!("expected {e:?}, but the client was dropped without sending it");
        };
        let (parts, body) = req.into_parts();
        let got = Received {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().map(str::to_owned),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body: {
                let bytes = body.collect_bytes().await.unwrap_or_default();
                if bytes.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                        Value::String(String::from_utf8_lossy(&bytes).into_owned())
                    })
                }
            },
        };
        assert_eq!(
            (&got.method, got.path.as_str()),
            (&e.method, e.path.as_str()),
            "unexpected request {} {}?{} (body {}); expected {e:?}",
            got.method,
            got.path,
            got.query.as_deref().unwrap_or(""),
            got.body
        );
        if let Some(q) = &e.query {
            assert_eq!(
                pairs(got.query.as_deref().unwrap_or("")),
                pairs(q),
                "query of {e:?}"
            );
        }
        if let Some(ct) = &e.content_type {
            assert_eq!(
                got.content_type.as_deref(),
                Some(ct.as_str()),
                "content-type of {e:?}"
            );
        }
        if let Some(check) = &e.body {
            check(&got.body);
        }
        let (code, response) = (e.respond)(&got.body);
        let bytes = serde_json::to_vec(&response).unwrap_or_default();
        send.send_response(
            Response::builder()
                .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(bytes))
                .unwrap_or_else(|_| Response::new(Body::empty())),
        );
        got
    }

    /// Serves `scenario` in order on a task; [`Scenario::finish`] then checks that it ran to
    /// the end and nothing more was asked.
    pub fn run(mut self, scenario: Vec<Expect>) -> Scenario {
        let task = tokio::spawn(async move {
            let mut received = Vec::new();
            for e in scenario {
                received.push(self.expect(e).await);
            }
            (self, received)
        });
        Scenario { task }
    }

    /// Panics if a request is waiting (call once the code under test has returned).
    pub fn assert_idle(&mut self) {
        use futures::FutureExt;
        if let Some(Some((req, _))) = self.handle.next_request().now_or_never() {
            panic!("unexpected request {} {}", req.method(), req.uri());
        }
    }
}

impl Scenario {
    /// Like [`Scenario::finish`], but hands the mock API back for the next scenario.
    pub async fn finish_keep(self) -> (MockApi, Vec<Received>) {
        match tokio::time::timeout(std::time::Duration::from_secs(60), self.task).await {
            Ok(Ok((mut api, received))) => {
                api.assert_idle();
                (api, received)
            }
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => panic!("mock API server task failed: {e}"),
            Err(_) => panic!("the code under test did not send every expected request"),
        }
    }
}

/// A running scenario.
pub struct Scenario {
    task: tokio::task::JoinHandle<(MockApi, Vec<Received>)>,
}

impl Scenario {
    /// Waits (at most 10 s) for every expected request, checks none more is pending, and
    /// returns the requests received. Panics of the scenario are re-raised here.
    pub async fn finish(self) -> Vec<Received> {
        match tokio::time::timeout(std::time::Duration::from_secs(10), self.task).await {
            Ok(Ok((mut api, received))) => {
                api.assert_idle();
                received
            }
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => panic!("mock API server task failed: {e}"),
            Err(_) => panic!("the code under test did not send every expected request"),
        }
    }
}

/// A [`SignBackend`](crate::signer::SignBackend) with canned answers that records each
/// call, for controller tests that need no gRPC server.
#[derive(Default)]
pub struct FakeBackend {
    sign: std::sync::Mutex<Option<Result<crate::signer::Signed, crate::signer::SignError>>>,
    bundle: std::sync::Mutex<Option<Result<crate::signer::BundleInfo, crate::signer::SignError>>>,
    calls: std::sync::Mutex<Vec<(String, String, Option<std::time::Duration>)>>,
    bundle_calls: std::sync::Mutex<Vec<(String, String, String)>>,
}

impl FakeBackend {
    /// `sign` answers `r` (every time); `bundle` is not expected.
    pub fn answering(
        r: Result<crate::signer::Signed, crate::signer::SignError>,
    ) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            sign: std::sync::Mutex::new(Some(r)),
            ..Default::default()
        })
    }
    /// `bundle` answers `r`; `sign` is not expected.
    pub fn with_bundle(
        r: Result<crate::signer::BundleInfo, crate::signer::SignError>,
    ) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            bundle: std::sync::Mutex::new(Some(r)),
            ..Default::default()
        })
    }
    /// `(issuer key, server address, credentials)` of each `bundle` call; credentials are
    /// `token:<path>` or `mtls:<first bytes of the chain>`.
    pub fn bundle_calls(&self) -> Vec<(String, String, String)> {
        self.bundle_calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    /// `(issuer key, namespace, ttl)` of each `sign` call.
    pub fn calls(&self) -> Vec<(String, String, Option<std::time::Duration>)> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl crate::signer::SignBackend for FakeBackend {
    fn sign<'a>(
        &'a self,
        key: &'a str,
        _cfg: &'a crate::signer::SignerConfig,
        _csr: &'a [u8],
        namespace: &'a str,
        ttl: Option<std::time::Duration>,
    ) -> futures::future::BoxFuture<'a, Result<crate::signer::Signed, crate::signer::SignError>>
    {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push((
            key.into(),
            namespace.into(),
            ttl,
        ));
        let r = self.sign.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Box::pin(async move {
            r.unwrap_or_else(|| {
                Err(crate::signer::SignError::permanent(
                    "Unexpected",
                    "FakeBackend: sign was not expected",
                ))
            })
        })
    }
    fn bundle<'a>(
        &'a self,
        key: &'a str,
        cfg: &'a crate::signer::SignerConfig,
    ) -> futures::future::BoxFuture<'a, Result<crate::signer::BundleInfo, crate::signer::SignError>>
    {
        let creds = match &cfg.credentials {
            crate::signer::Credentials::TokenFile(p) => format!("token:{}", p.display()),
            crate::signer::Credentials::Identity(id) => format!(
                "mtls:{}",
                String::from_utf8_lossy(&id.cert_chain_pem[..id.cert_chain_pem.len().min(16)])
            ),
        };
        self.bundle_calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((key.into(), cfg.server().to_owned(), creds));
        let r = self
            .bundle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Box::pin(async move {
            r.unwrap_or_else(|| {
                Err(crate::signer::SignError::permanent(
                    "Unexpected",
                    "FakeBackend: bundle was not expected",
                ))
            })
        })
    }
}

/// [`Events`](crate::events::Events) kept in a list: `("Kind/ns/name", note)`.
#[derive(Default)]
pub struct RecordedEvents(std::sync::Mutex<Vec<(String, crate::events::Note)>>);

impl RecordedEvents {
    pub fn all(&self) -> Vec<(String, crate::events::Note)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl crate::events::Events for RecordedEvents {
    fn publish<'a>(
        &'a self,
        regarding: k8s_openapi::api::core::v1::ObjectReference,
        note: crate::events::Note,
    ) -> futures::future::BoxFuture<'a, ()> {
        let key = format!(
            "{}/{}{}",
            regarding.kind.unwrap_or_default(),
            regarding
                .namespace
                .map(|n| format!("{n}/"))
                .unwrap_or_default(),
            regarding.name.unwrap_or_default()
        );
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((key, note));
        Box::pin(async {})
    }
}

/// A file removed on drop (this crate has no tempfile dependency).
pub struct TempFile(pub std::path::PathBuf);

impl TempFile {
    pub fn with(tag: &str, contents: &[u8]) -> Self {
        use ring::rand::SecureRandom;
        let mut b = [0u8; 8];
        let _ = ring::rand::SystemRandom::new().fill(&mut b);
        let p = std::env::temp_dir().join(format!(
            "signet-k8s-{tag}-{}-{}",
            std::process::id(),
            u64::from_le_bytes(b)
        ));
        if let Err(e) = std::fs::write(&p, contents) {
            panic!("writing {}: {e}", p.display());
        }
        Self(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What the operator gives a bridge under test: its server `address` (trust domain
/// `trust_domain`) with roots `bundle_pem`, and a token file holding `token`. Keep it alive
/// while the bridge runs (the files go with it).
pub struct TestBridge {
    pub config: std::sync::Arc<crate::operator::BridgeConfig>,
    pub bundle: TempFile,
    pub token: TempFile,
}

impl TestBridge {
    pub fn new(address: &str, bundle_pem: &[u8], trust_domain: &str, token: &str) -> Self {
        let bundle = TempFile::with("bundle", bundle_pem);
        let token = TempFile::with("token", token.as_bytes());
        let config = crate::operator::BridgeConfig {
            server: Some(crate::operator::OperatorServer {
                address: address.to_owned(),
                server_name: None,
                bundle_file: bundle.0.clone(),
            }),
            token_path: token.0.clone(),
            trust_domain: Some(
                trust_domain
                    .parse()
                    .unwrap_or_else(|e| panic!("trust domain {trust_domain:?}: {e}")),
            ),
        };
        Self {
            config: std::sync::Arc::new(config),
            bundle,
            token,
        }
    }

    /// The same, with `server_name` checked in the server's certificate.
    pub fn with_server_name(mut self, name: &str) -> Self {
        let mut c = (*self.config).clone();
        if let Some(s) = c.server.as_mut() {
            s.server_name = Some(name.to_owned());
        }
        self.config = std::sync::Arc::new(c);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::{Patch, PatchParams};

    #[tokio::test]
    async fn serves_a_scenario_and_checks_bodies() {
        let (client, api) = mock_client();
        let cm = object(
            "v1",
            "ConfigMap",
            Some("a"),
            "b",
            "5",
            json!({"data": {"k": "v"}}),
        );
        let server = api.run(vec![
            Expect::get("/api/v1/namespaces/a/configmaps/b").respond(cm.clone()),
            Expect::patch("/api/v1/namespaces/a/configmaps/b")
                .query("fieldManager=t")
                .content_type("application/merge-patch+json")
                .body(json!({"data": {"k": "w"}}))
                .respond(cm),
            Expect::get("/api/v1/namespaces/a/configmaps/c").not_found("configmaps", "c"),
        ]);
        let cms: Api<ConfigMap> = Api::namespaced(client, "a");
        let got = cms.get("b").await.unwrap();
        assert_eq!(got.data.unwrap()["k"], "v");
        cms.patch(
            "b",
            &PatchParams {
                field_manager: Some("t".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap();
        assert!(cms.get_opt("c").await.unwrap().is_none());
        drop(cms);
        let received = server.finish().await;
        assert_eq!(received.len(), 3);
    }

    #[tokio::test]
    #[should_panic(expected = "request body differs")]
    async fn wrong_body_fails() {
        let (client, api) = mock_client();
        let server = api.run(vec![
            Expect::patch("/api/v1/namespaces/a/configmaps/b")
                .body(json!({"x": 1}))
                .respond(json!({})),
        ]);
        let cms: Api<ConfigMap> = Api::namespaced(client, "a");
        let _ = cms
            .patch("b", &PatchParams::default(), &Patch::Merge(json!({"x": 2})))
            .await;
        drop(cms);
        server.finish().await;
    }
}
