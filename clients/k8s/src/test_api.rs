//! A scripted Kubernetes API server for the Certificate and Citadel reconciler tests, in the
//! way kube-rs documents (a `tower-test` mock service): each expected request is matched by
//! method and exact URI (path and query), answered by a closure over its JSON body, and
//! recorded so the test can assert on what the bridge sent.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

pub type Responder = Box<dyn FnOnce(&Value) -> (u16, Value) + Send>;

pub struct Exchange {
    pub method: &'static str,
    pub uri: String,
    pub respond: Responder,
}

impl Exchange {
    pub fn new(
        method: &'static str,
        uri: impl Into<String>,
        respond: impl FnOnce(&Value) -> (u16, Value) + Send + 'static,
    ) -> Self {
        Self {
            method,
            uri: uri.into(),
            respond: Box::new(respond),
        }
    }

    /// A fixed answer.
    pub fn reply(method: &'static str, uri: impl Into<String>, code: u16, body: Value) -> Self {
        Self::new(method, uri, move |_| (code, body))
    }
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub uri: String,
    pub body: Value,
}

/// A client whose API server answers `script` in order. The handle yields what was sent;
/// a request out of script fails the test.
pub fn scripted(script: Vec<Exchange>) -> (Client, tokio::task::JoinHandle<Vec<Recorded>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        for ex in script {
            let Some((req, send)) = handle.next_request().await else {
                panic!(
                    "the client went away; still expected {} {}",
                    ex.method, ex.uri
                );
            };
            let method = req.method().to_string();
            let uri = req.uri().to_string();
            let bytes = req.into_body().collect_bytes().await.expect("request body");
            let body = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).expect("JSON request body")
            };
            assert_eq!(
                (method.as_str(), uri.as_str()),
                (ex.method, ex.uri.as_str()),
                "unexpected request; body: {body}"
            );
            let (code, out) = (ex.respond)(&body);
            send.send_response(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&out).expect("JSON")))
                    .expect("response"),
            );
            seen.push(Recorded { method, uri, body });
        }
        seen
    });
    (Client::new(svc, "default"), task)
}

/// The API server's 404 for `kind` (plural) `name`.
pub fn not_found(plural: &str, name: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{plural} \"{name}\" not found"), "reason": "NotFound",
        "details": {"name": name, "kind": plural}, "code": 404
    })
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// An object kept by the fake server: status patches are merged into it and it is returned
/// with a new resourceVersion, as the API server does.
#[derive(Clone)]
pub struct Stored(pub Arc<Mutex<Value>>);

impl Stored {
    pub fn new(v: Value) -> Self {
        Self(Arc::new(Mutex::new(v)))
    }

    pub fn get(&self) -> Value {
        self.0.lock().expect("lock").clone()
    }

    /// A responder that merges the request body and answers with the result.
    pub fn merge_patch(&self) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
        let me = self.clone();
        move |body| {
            let mut v = me.0.lock().expect("lock");
            merge(&mut v, body);
            let rv = v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(1);
            v["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
            (200, v.clone())
        }
    }
}

/// Answers a server-side apply of a new object as the API server would: the body plus the
/// server's metadata.
pub fn applied(uid: &str) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
    let uid = uid.to_owned();
    move |body| {
        let mut v = body.clone();
        merge(
            &mut v,
            &json!({"metadata": {"uid": uid, "resourceVersion": "500",
                "creationTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        (200, v)
    }
}
