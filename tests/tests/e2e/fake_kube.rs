//! A fake Kubernetes API server over real TLS (certificate for `kubernetes.default.svc`) that
//! keeps Secrets the way the API server shapes them (uid, resourceVersion, managedFields,
//! server-side apply, preconditions), or that never answers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request the fake API server received.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) body: Value,
}

#[derive(Default)]
struct KubeState {
    secrets: BTreeMap<String, Value>,
    seen: Vec<Seen>,
    rv: u64,
}

/// A fake Kubernetes API server on 127.0.0.1 over TLS (certificate for
/// `kubernetes.default.svc`), for Secrets only.
pub(crate) struct FakeKube {
    pub(crate) addr: SocketAddr,
    pub(crate) ca_file: PathBuf,
    pub(crate) token_file: PathBuf,
    state: Arc<Mutex<KubeState>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The shape of an existing Secret the API server returns.
pub(crate) fn secret_object(ns: &str, name: &str, labels: Value, managers: &[&str]) -> Value {
    let managed: Vec<Value> = managers
        .iter()
        .map(|m| {
            json!({"manager": m, "operation": "Update", "apiVersion": "v1",
                   "time": "2026-12-01T09:00:00Z", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:data": {".": {}, "f:password": {}}, "f:type": {}}})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                     "resourceVersion": "1", "creationTimestamp": "2026-12-01T09:00:00Z",
                     "labels": labels, "managedFields": managed},
        "type": "Opaque",
        "data": {"password": "aHVudGVyMg=="},
    })
}

impl FakeKube {
    /// `hang`: accept connections, complete TLS, never answer.
    pub(crate) async fn start(hang: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["kubernetes.default.svc".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, cert.pem()).unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "fake-sa-token").unwrap();
        let server_cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(KubeState::default()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let st = st.clone();
                let conn = tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    if let Some((status, body)) = serve_one(&mut tls, &st).await {
                        let text = body.to_string();
                        let resp = format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                             Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                            text.len()
                        );
                        let _ = tls.write_all(resp.as_bytes()).await;
                        let _ = tls.shutdown().await;
                    }
                });
                held.push(conn);
            }
        });
        Self {
            addr,
            ca_file,
            token_file,
            state,
            task,
            _dir: dir,
        }
    }

    /// The agent's `[kubernetes_api]` table for this server.
    pub(crate) fn agent_toml(&self, timeout: &str) -> String {
        format!(
            "[kubernetes_api]\nserver = \"https://{}\"\nca_file = \"{}\"\ntoken_file = \"{}\"\ntimeout = \"{timeout}\"\n",
            self.addr,
            self.ca_file.display(),
            self.token_file.display()
        )
    }

    pub(crate) fn put(&self, ns: &str, name: &str, obj: Value) {
        self.state
            .lock()
            .unwrap()
            .secrets
            .insert(format!("/api/v1/namespaces/{ns}/secrets/{name}"), obj);
    }

    pub(crate) fn get(&self, ns: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .unwrap()
            .secrets
            .get(&format!("/api/v1/namespaces/{ns}/secrets/{name}"))
            .cloned()
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }
}

/// Reads one HTTP/1.1 request and answers it from `st`.
async fn serve_one<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    st: &Mutex<KubeState>,
) -> Option<(u16, Value)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let target = first.next()?.to_owned();
    let len: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut st = st.lock().ok()?;
    st.seen.push(Seen {
        method: method.clone(),
        path: path.to_owned(),
        query: query.to_owned(),
        body: body.clone(),
    });
    let manager = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("fieldManager="))
        .unwrap_or("")
        .to_owned();
    let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
    let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409});
    st.rv += 1;
    let rv = (st.rv + 100).to_string();
    Some(match method.as_str() {
        "GET" => match st.secrets.get(path) {
            Some(o) => (200, o.clone()),
            None => (404, not_found),
        },
        "POST" => {
            let name = body["metadata"]["name"].as_str().unwrap_or_default();
            let full = format!("{path}/{name}");
            match st.secrets.entry(full) {
                std::collections::btree_map::Entry::Occupied(_) => (
                    409,
                    json!({"kind": "Status", "reason": "AlreadyExists", "code": 409}),
                ),
                std::collections::btree_map::Entry::Vacant(slot) => {
                    let mut o = body.clone();
                    o["metadata"]["uid"] = json!(format!("uid-{name}"));
                    o["metadata"]["resourceVersion"] = json!(rv);
                    o["metadata"]["managedFields"] = json!([{"manager": manager, "operation": "Update",
                        "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {}}]);
                    slot.insert(o.clone());
                    (201, o)
                }
            }
        }
        "PATCH" => match st.secrets.get(path).cloned() {
            None => (404, not_found),
            Some(mut o) => {
                let stale = body["metadata"]["resourceVersion"]
                    .as_str()
                    .is_some_and(|v| Some(v) != o["metadata"]["resourceVersion"].as_str());
                if stale {
                    (409, conflict)
                } else {
                    o["data"] = body["data"].clone();
                    o["type"] = body["type"].clone();
                    for k in ["labels", "annotations"] {
                        if let Some(m) = body["metadata"][k].as_object() {
                            for (key, v) in m {
                                o["metadata"][k][key] = v.clone();
                            }
                        }
                    }
                    let mut managed = o["metadata"]["managedFields"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    managed
                        .retain(|m| !(m["manager"] == json!(manager) && m["operation"] == "Apply"));
                    managed.push(
                        json!({"manager": manager, "operation": "Apply", "apiVersion": "v1",
                        "fieldsType": "FieldsV1", "fieldsV1": {}}),
                    );
                    o["metadata"]["managedFields"] = Value::Array(managed);
                    o["metadata"]["resourceVersion"] = json!(rv);
                    st.secrets.insert(path.to_owned(), o.clone());
                    (200, o)
                }
            }
        },
        "DELETE" => match st.secrets.get(path).cloned() {
            None => (404, not_found),
            Some(o) => {
                let pre = &body["preconditions"];
                let mismatch = ["uid", "resourceVersion"]
                    .iter()
                    .any(|k| !pre[k].is_null() && pre[k] != o["metadata"][k]);
                if mismatch {
                    (409, conflict)
                } else {
                    st.secrets.remove(path);
                    (200, json!({"kind": "Status", "status": "Success"}))
                }
            }
        },
        _ => (405, json!({})),
    })
}
