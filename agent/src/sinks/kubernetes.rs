//! The `kubernetes-secret` sink: the SVID as a Secret of type `istio.io/key-and-cert`
//! (`cert-chain.pem`, `key.pem`, `root-cert.pem`) or `kubernetes.io/tls` (`tls.crt`,
//! `tls.key`, `ca.crt`), written with server-side apply (field manager `signet-agent`,
//! forced) and labelled `app.kubernetes.io/managed-by: signet`.
//!
//! The request bodies are built by hand with serde_json and sent through [`KubeTransport`], a
//! one-method seam for "an authenticated HTTP client to the API server";
//! [`super::apiserver::ApiServer`] is the in-cluster implementation. kube-rs/k8s-openapi were
//! left out: adding them took over 5½ minutes of build on these machines without finishing.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::json;

use crate::config::{KubernetesSecretSinkConfig, SecretType};
use crate::sinks::{Delivered, Sink, SinkError};

pub const FIELD_MANAGER: &str = "signet-agent";
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// One request to the Kubernetes API. `body` may hold key material: never log it.
#[derive(Clone, PartialEq, Eq)]
pub struct KubeRequest {
    pub method: http::Method,
    /// e.g. `/api/v1/namespaces/default/secrets/web-tls`.
    pub path: String,
    /// Query parameters, in order.
    pub query: Vec<(String, String)>,
    pub content_type: Option<&'static str>,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for KubeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeRequest")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl KubeRequest {
    /// `path?k=v&…`, for transports that want a URI.
    pub fn path_and_query(&self) -> String {
        if self.query.is_empty() {
            return self.path.clone();
        }
        let q: Vec<String> = self.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}?{}", self.path, q.join("&"))
    }
}

/// An authenticated client to the API server: sends one request, returns the status code.
#[async_trait::async_trait]
pub trait KubeTransport: Send + Sync {
    async fn send(&self, req: KubeRequest) -> Result<http::StatusCode, String>;
}

pub struct SecretSink {
    name: String,
    cfg: KubernetesSecretSinkConfig,
    api: Arc<dyn KubeTransport>,
}

impl SecretSink {
    pub fn new(name: &str, cfg: KubernetesSecretSinkConfig, api: Arc<dyn KubeTransport>) -> Self {
        Self {
            name: name.to_owned(),
            cfg,
            api,
        }
    }

    fn path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/secrets/{}",
            self.cfg.namespace, self.cfg.secret_name
        )
    }

    /// The server-side-apply body for `svid`.
    pub fn apply_body(&self, svid: &Delivered) -> serde_json::Value {
        let (type_name, [chain, key, ca]) = match self.cfg.secret_type {
            SecretType::IstioKeyAndCert => (
                "istio.io/key-and-cert",
                ["cert-chain.pem", "key.pem", "root-cert.pem"],
            ),
            SecretType::KubernetesTls => ("kubernetes.io/tls", ["tls.crt", "tls.key", "ca.crt"]),
        };
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.cfg.secret_name,
                "namespace": self.cfg.namespace,
                "labels": { "app.kubernetes.io/managed-by": "signet" },
                "annotations": { "signet.dev/spiffe-id": svid.spiffe_id },
            },
            "type": type_name,
            "data": {
                chain: B64.encode(svid.chain_pem()),
                key: B64.encode(svid.key_pem()),
                ca: B64.encode(svid.bundle_pem()),
            },
        })
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> SinkError {
        SinkError::new(
            &self.name,
            format!(
                "{what} Secret {}/{}: {e}",
                self.cfg.namespace, self.cfg.secret_name
            ),
        )
    }
}

#[async_trait::async_trait]
impl Sink for SecretSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn deliver(&self, svid: &Delivered) -> Result<(), SinkError> {
        let body = serde_json::to_vec(&self.apply_body(svid))
            .map_err(|e| self.fail("cannot encode", e))?;
        let req = KubeRequest {
            method: http::Method::PATCH,
            path: self.path(),
            query: vec![
                ("fieldManager".into(), FIELD_MANAGER.into()),
                ("force".into(), "true".into()),
            ],
            // JSON is YAML: the apply-patch content type takes it as is.
            content_type: Some(APPLY_PATCH),
            body,
        };
        let status = self
            .api
            .send(req)
            .await
            .map_err(|e| self.fail("cannot apply", e))?;
        if !status.is_success() {
            return Err(self.fail("cannot apply", format!("API server answered {status}")));
        }
        tracing::info!(sink = %self.name, spiffe_id = %svid.spiffe_id, "Secret applied");
        Ok(())
    }

    async fn remove(&self) -> Result<(), SinkError> {
        let req = KubeRequest {
            method: http::Method::DELETE,
            path: self.path(),
            query: Vec::new(),
            content_type: None,
            body: Vec::new(),
        };
        let status = self
            .api
            .send(req)
            .await
            .map_err(|e| self.fail("cannot delete", e))?;
        if status.is_success() || status == http::StatusCode::NOT_FOUND {
            Ok(())
        } else {
            Err(self.fail("cannot delete", format!("API server answered {status}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A fake API server: records requests, answers a fixed status.
    struct Recorder {
        seen: Mutex<Vec<KubeRequest>>,
        status: http::StatusCode,
    }

    #[async_trait::async_trait]
    impl KubeTransport for Recorder {
        async fn send(&self, req: KubeRequest) -> Result<http::StatusCode, String> {
            self.seen.lock().map_err(|e| e.to_string())?.push(req);
            Ok(self.status)
        }
    }

    fn sink(secret_type: SecretType, status: u16) -> (SecretSink, Arc<Recorder>) {
        let rec = Arc::new(Recorder {
            seen: Mutex::new(Vec::new()),
            status: http::StatusCode::from_u16(status).expect("status"),
        });
        let s = SecretSink::new(
            "k8s",
            KubernetesSecretSinkConfig {
                namespace: "prod".into(),
                secret_name: "web-tls".into(),
                secret_type,
            },
            rec.clone(),
        );
        (s, rec)
    }

    fn svid() -> Delivered {
        Delivered {
            spiffe_id: "spiffe://example.org/ns/prod/sa/web".into(),
            chain_der: vec![vec![1, 2, 3]],
            key_pkcs8_der: vec![4, 5, 6],
            bundle_der: vec![vec![7, 8]],
        }
    }

    fn decoded(body: &serde_json::Value, key: &str) -> String {
        let b64 = body["data"][key].as_str().expect("data key");
        String::from_utf8(B64.decode(b64).expect("base64")).expect("utf8")
    }

    #[tokio::test]
    async fn applies_tls_secret_with_server_side_apply() {
        let (s, rec) = sink(SecretType::KubernetesTls, 200);
        s.deliver(&svid()).await.expect("apply");
        let seen = rec.seen.lock().expect("lock");
        assert_eq!(seen.len(), 1);
        let req = &seen[0];
        assert_eq!(req.method, http::Method::PATCH);
        assert_eq!(req.path, "/api/v1/namespaces/prod/secrets/web-tls");
        assert_eq!(
            req.path_and_query(),
            "/api/v1/namespaces/prod/secrets/web-tls?fieldManager=signet-agent&force=true"
        );
        assert_eq!(req.content_type, Some("application/apply-patch+yaml"));
        let body: serde_json::Value = serde_json::from_slice(&req.body).expect("json");
        assert_eq!(body["apiVersion"], "v1");
        assert_eq!(body["kind"], "Secret");
        assert_eq!(body["type"], "kubernetes.io/tls");
        assert_eq!(body["metadata"]["name"], "web-tls");
        assert_eq!(body["metadata"]["namespace"], "prod");
        assert_eq!(
            body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "signet"
        );
        let d = svid();
        assert_eq!(decoded(&body, "tls.crt"), d.chain_pem());
        assert_eq!(decoded(&body, "tls.key"), d.key_pem());
        assert_eq!(decoded(&body, "ca.crt"), d.bundle_pem());
        assert_eq!(body["data"].as_object().expect("data").len(), 3);
        assert!(!format!("{req:?}").contains(&body["data"]["tls.key"].to_string()));
    }

    /// The exact server-side-apply request for each Secret type: method, path, query,
    /// content type, and the whole body (a `v1` Secret manifest, data base64 of the PEMs).
    #[tokio::test]
    async fn apply_requests_are_exact_for_both_secret_types() {
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
            let (s, rec) = sink(secret_type, 200);
            s.deliver(&d).await.expect("apply");
            let seen = rec.seen.lock().expect("lock");
            assert_eq!(seen.len(), 1);
            let req = &seen[0];
            assert_eq!(req.method, http::Method::PATCH);
            assert_eq!(req.path, "/api/v1/namespaces/prod/secrets/web-tls");
            assert_eq!(
                req.query,
                [
                    ("fieldManager".to_owned(), "signet-agent".to_owned()),
                    ("force".to_owned(), "true".to_owned())
                ]
            );
            assert_eq!(req.content_type, Some("application/apply-patch+yaml"));
            let body: serde_json::Value = serde_json::from_slice(&req.body).expect("json");
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
            assert_eq!(body, expected, "{type_name}");
            // Only standard base64 of PEM text, as the API server stores `data`.
            assert!(decoded(&body, chain).starts_with("-----BEGIN CERTIFICATE-----"));
            assert!(decoded(&body, key).starts_with("-----BEGIN PRIVATE KEY-----"));
        }
    }

    #[tokio::test]
    async fn applies_istio_secret_keys() {
        let (s, rec) = sink(SecretType::IstioKeyAndCert, 201);
        s.deliver(&svid()).await.expect("apply");
        let seen = rec.seen.lock().expect("lock");
        let body: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("json");
        assert_eq!(body["type"], "istio.io/key-and-cert");
        let mut keys: Vec<_> = body["data"]
            .as_object()
            .expect("data")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        assert_eq!(keys, ["cert-chain.pem", "key.pem", "root-cert.pem"]);
    }

    #[tokio::test]
    async fn api_errors_name_the_sink_not_the_key() {
        let (s, _) = sink(SecretType::KubernetesTls, 403);
        let err = s.deliver(&svid()).await.expect_err("forbidden");
        let msg = err.to_string();
        assert!(msg.contains("\"k8s\"") && msg.contains("403"), "{msg}");
        assert!(!msg.contains("PRIVATE"), "{msg}");
    }

    #[tokio::test]
    async fn remove_deletes_and_tolerates_absence() {
        let (s, rec) = sink(SecretType::KubernetesTls, 404);
        s.remove().await.expect("absent is fine");
        let first = rec.seen.lock().expect("lock")[0].clone();
        assert_eq!(first.method, http::Method::DELETE);
        assert_eq!(first.path, "/api/v1/namespaces/prod/secrets/web-tls");
        let (s, _) = sink(SecretType::KubernetesTls, 500);
        assert!(s.remove().await.is_err());
    }
}
