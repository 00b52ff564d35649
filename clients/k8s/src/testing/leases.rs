//! A **stateful** fake of the `coordination.k8s.io/v1` Lease API, for leader election tests:
//! where [`super::MockApi`] answers a script in order, this one keeps the Leases as the API
//! server does and answers whatever comes, in any order, from any number of clients.
//!
//! - `GET .../namespaces/N/leases/NAME`: the stored object, or a real 404 `Status`.
//! - `POST .../namespaces/N/leases`: creates it (resourceVersion set by the server); 409
//!   `AlreadyExists` if it exists.
//! - `PUT .../namespaces/N/leases/NAME`: replaces it only if the body's
//!   `metadata.resourceVersion` is the stored one, else 409 `Conflict` (stricter than the real
//!   server for a body without one, so an unconditional write is caught too).
//! - Anything else is answered 400 and recorded as unexpected ([`LeaseServer::unexpected`]).
//!
//! Each [`LeaseServer::client`] has its own [`Link`], whose fault ([`Fault::Fail`]: 500 on
//! every request; [`Fault::Hang`]: never answers) cuts that one client off, as a network
//! partition or a stuck API server connection would. [`LeaseServer::interpose`] runs a change
//! just before the next write is applied: another replica winning the race.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

use super::{not_found, status_failure};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Interpose = Box<dyn FnOnce(&LeaseServer) + Send>;

const PREFIX: &str = "/apis/coordination.k8s.io/v1/namespaces/";

/// What a client's link to the server does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Requests are answered.
    None,
    /// Every request gets a 500.
    Fail,
    /// No request is ever answered.
    Hang,
}

/// One client's link ([`LeaseServer::client`]).
#[derive(Clone)]
pub struct Link(Arc<Mutex<Fault>>);

impl Link {
    pub fn set(&self, f: Fault) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = f;
    }
    fn get(&self) -> Fault {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A successful write, as the server applied it.
#[derive(Clone, Debug)]
pub struct Write {
    pub method: Method,
    /// The stored object after the write.
    pub lease: Value,
    /// When (tokio's clock: virtual under a paused runtime).
    pub at: tokio::time::Instant,
}

#[derive(Default)]
struct State {
    leases: BTreeMap<(String, String), Value>,
    next_rv: u64,
    writes: Vec<Write>,
    unexpected: Vec<String>,
    interpose: Option<Interpose>,
}

/// The fake API server; clones share its state.
#[derive(Clone, Default)]
pub struct LeaseServer(Arc<Mutex<State>>);

impl LeaseServer {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client of this server with its own link, answered on a task.
    pub fn client(&self) -> (Client, Link) {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let link = Link(Arc::new(Mutex::new(Fault::None)));
        tokio::spawn(serve(self.clone(), link.clone(), handle));
        (Client::new(svc, "default"), link)
    }

    /// The stored Lease.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state()
            .leases
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The stored Lease's holder (`None`: no Lease, or no holder).
    pub fn holder(&self, namespace: &str, name: &str) -> Option<String> {
        self.lease(namespace, name)
            .and_then(|l| l.pointer("/spec/holderIdentity").cloned())
            .and_then(|h| h.as_str().map(str::to_owned))
            .filter(|h| !h.is_empty())
    }

    /// Every successful write so far.
    pub fn writes(&self) -> Vec<Write> {
        self.state().writes.clone()
    }

    /// Requests this server does not serve.
    pub fn unexpected(&self) -> Vec<String> {
        self.state().unexpected.clone()
    }

    /// Stores `spec` as Lease `namespace/name` (created or replaced, a new resourceVersion),
    /// as another replica's successful write would; recorded as a write.
    pub fn store(&self, namespace: &str, name: &str, spec: Value) {
        let mut st = self.state();
        st.next_rv += 1;
        let rv = st.next_rv.to_string();
        let mut obj = super::object(
            "coordination.k8s.io/v1",
            "Lease",
            Some(namespace),
            name,
            &rv,
            json!({ "spec": spec }),
        );
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("generation");
        }
        st.leases
            .insert((namespace.to_owned(), name.to_owned()), obj.clone());
        st.writes.push(Write {
            method: Method::PUT,
            lease: obj,
            at: signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock),
        });
    }

    /// Runs `f` just before the next write (POST or PUT) is applied.
    pub fn interpose(&self, f: impl FnOnce(&LeaseServer) + Send + 'static) {
        self.state().interpose = Some(Box::new(f));
    }

    fn answer(&self, method: &Method, path: &str, body: Value) -> (u16, Value) {
        let Some(rest) = path.strip_prefix(PREFIX) else {
            return self.refuse(method, path);
        };
        let parts: Vec<&str> = rest.split('/').collect();
        match (method, parts.as_slice()) {
            (&Method::GET, [ns, "leases", name]) => match self.lease(ns, name) {
                Some(l) => (200, l),
                None => (404, not_found("leases", name)),
            },
            (&Method::POST, [ns, "leases"]) => {
                let name = body
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                self.before_write();
                if self.lease(ns, &name).is_some() {
                    return (
                        409,
                        status_failure(
                            409,
                            "AlreadyExists",
                            &format!("leases.coordination.k8s.io \"{name}\" already exists"),
                        ),
                    );
                }
                (201, self.apply(Method::POST, ns, &name, body))
            }
            (&Method::PUT, [ns, "leases", name]) => {
                self.before_write();
                let Some(stored) = self.lease(ns, name) else {
                    return (404, not_found("leases", name));
                };
                let sent = body.pointer("/metadata/resourceVersion");
                if sent.is_none() || sent != stored.pointer("/metadata/resourceVersion") {
                    return (
                        409,
                        status_failure(
                            409,
                            "Conflict",
                            &format!(
                                "Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                            ),
                        ),
                    );
                }
                (200, self.apply(Method::PUT, ns, name, body))
            }
            _ => self.refuse(method, path),
        }
    }

    fn before_write(&self) {
        let f = self.state().interpose.take();
        if let Some(f) = f {
            f(self);
        }
    }

    fn apply(&self, method: Method, ns: &str, name: &str, body: Value) -> Value {
        let spec = body.get("spec").cloned().unwrap_or(json!({}));
        self.store(ns, name, spec);
        let mut st = self.state();
        if let Some(w) = st.writes.last_mut() {
            w.method = method;
        }
        st.leases
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn refuse(&self, method: &Method, path: &str) -> (u16, Value) {
        self.state().unexpected.push(format!("{method} {path}"));
        (
            400,
            status_failure(400, "BadRequest", "not served by the fake Lease API"),
        )
    }
}

async fn serve(server: LeaseServer, link: Link, mut handle: Handle) {
    // Requests left unanswered by a hanging link: kept, so the client waits (forever).
    let mut held = Vec::new();
    while let Some((req, send)) = handle.next_request().await {
        let (parts, body) = req.into_parts();
        let fault = link.get();
        if fault == Fault::Hang {
            held.push(send);
            continue;
        }
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let (code, answer) = if fault == Fault::Fail {
            (
                500,
                status_failure(500, "InternalError", "the fake API server fails this link"),
            )
        } else {
            server.answer(&parts.method, parts.uri.path(), body)
        };
        send.send_response(
            Response::builder()
                .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&answer).unwrap_or_default()))
                .unwrap_or_else(|_| Response::new(Body::empty())),
        );
    }
}
