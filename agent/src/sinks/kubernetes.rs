//! The `kubernetes-secret` sink: the SVID as a Secret of type `istio.io/key-and-cert`
//! (`cert-chain.pem`, `key.pem`, `root-cert.pem`) or `kubernetes.io/tls` (`tls.crt`,
//! `tls.key`, `ca.crt`), labelled `app.kubernetes.io/managed-by: signet`.
//!
//! # CRLs
//!
//! When the agent holds verified CRLs of its issuing CAs, both types also carry [`CRL_KEY`]
//! (`ca.crl`: one PEM `X509 CRL` block per issuing CA key, as the files sink's `crl.pem`).
//! Neither Secret type defines a CRL key; `ca.crl` is the one the ecosystem reads (Istio's
//! gateways take it from a `credentialName` Secret beside `tls.crt`, `tls.key`, `ca.crt`), and
//! a Secret mounted as a volume gives the workload a file of that name. Without CRLs the key
//! is left out, and server-side apply removes the one the agent wrote before. A Secret holds
//! at most 1 MiB: CRLs over [`MAX_SECRET_CRL_BYTES`] are left out with a warning (on
//! `/readyz` and in the sink metrics) rather than fail every delivery, certificates included.
//!
//! # Only the agent's own Secret
//!
//! A Secret of that name may already exist and belong to someone else. So every delivery and
//! removal first reads the Secret and decides by [`ownership`]: the agent's own Secret carries
//! the label **and** has a `managedFields` entry of the field manager `signet-agent` (set by
//! the agent's own create or apply). Then:
//!
//! - absent: created with a `POST` (field manager `signet-agent`), which fails if someone
//!   created it meanwhile, so the agent never merges into a Secret it did not make;
//! - the agent's own: updated with server-side apply (field manager `signet-agent`, forced),
//!   carrying the `resourceVersion` just read, so a change made in between makes the apply fail
//!   (409) instead of being overwritten; removal is a `DELETE` with `uid` and `resourceVersion`
//!   preconditions;
//! - anyone else's: refused with an error naming what is missing; nothing is written, nothing
//!   deleted.
//!
//! The request bodies are built by hand with serde_json and sent through [`KubeTransport`], a
//! one-method seam for "an authenticated HTTP client to the API server";
//! [`super::apiserver::ApiServer`] is the in-cluster implementation. kube-rs/k8s-openapi were
//! left out: adding them took over 5½ minutes of build on these machines without finishing.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::config::{KubernetesSecretSinkConfig, SecretType};
use crate::sinks::{Applied, Delivered, Sink, SinkError};

pub const FIELD_MANAGER: &str = "signet-agent";
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";
pub const JSON: &str = "application/json";
/// The label every Secret the agent writes carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "signet");
/// The Secret key of the CRLs (PEM), in both Secret types.
pub const CRL_KEY: &str = "ca.crl";
/// The most PEM CRL bytes a Secret carries (a Secret holds at most 1 MiB in all).
pub const MAX_SECRET_CRL_BYTES: usize = 512 * 1024;

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

/// The API server's answer. `body` may hold someone's Secret: never log it.
#[derive(Clone, PartialEq, Eq)]
pub struct KubeResponse {
    pub status: http::StatusCode,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for KubeResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeResponse")
            .field("status", &self.status)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeError {
    /// The API server did not answer before the deadline.
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Failed(String),
}

impl From<String> for KubeError {
    fn from(s: String) -> Self {
        KubeError::Failed(s)
    }
}

/// An authenticated client to the API server: sends one request, returns the answer.
#[async_trait::async_trait]
pub trait KubeTransport: Send + Sync {
    async fn send(&self, req: KubeRequest) -> Result<KubeResponse, KubeError>;
}

/// What is at the Secret's name now.
#[derive(Debug, PartialEq, Eq)]
enum Existing {
    Absent,
    /// The agent's own, at this version.
    Owned {
        uid: String,
        resource_version: String,
    },
    /// Someone else's: why it is not the agent's.
    Foreign(NotOwned),
}

/// Why a Secret is not the agent's (so it is neither overwritten nor deleted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotOwned {
    #[error("it lacks the label {}={}", MANAGED_BY.0, MANAGED_BY.1)]
    NoLabel,
    #[error("its fields are managed by {0:?}, not by the field manager {FIELD_MANAGER}")]
    OtherManagers(Vec<String>),
    /// The answer lacks the field (`uid`, `resourceVersion`) the agent needs to act on it.
    #[error("the API server's answer has no metadata.{0}")]
    NoMetadata(&'static str),
}

/// The identity of a Secret the agent owns (uid, resourceVersion), or why `secret` is not
/// the agent's: it must carry the [`MANAGED_BY`] label and have a `managedFields` entry of
/// [`FIELD_MANAGER`].
pub fn ownership(secret: &Value) -> Result<(String, String), NotOwned> {
    let meta = &secret["metadata"];
    let label = meta["labels"][MANAGED_BY.0].as_str();
    if label != Some(MANAGED_BY.1) {
        return Err(NotOwned::NoLabel);
    }
    let managers: Vec<&str> = meta["managedFields"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["manager"].as_str()).collect())
        .unwrap_or_default();
    if !managers.contains(&FIELD_MANAGER) {
        return Err(NotOwned::OtherManagers(
            managers.into_iter().map(str::to_owned).collect(),
        ));
    }
    let field = |k: &'static str| {
        meta[k]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or(NotOwned::NoMetadata(k))
    };
    Ok((field("uid")?, field("resourceVersion")?))
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

    fn collection(&self) -> String {
        format!("/api/v1/namespaces/{}/secrets", self.cfg.namespace)
    }

    fn path(&self) -> String {
        format!("{}/{}", self.collection(), self.cfg.secret_name)
    }

    /// The Secret manifest for `svid` (the server-side-apply body; with a resourceVersion,
    /// a conditional one), and what was left out of it.
    pub fn apply_body(&self, svid: &Delivered) -> (Value, Applied) {
        let (type_name, [chain, key, ca]) = match self.cfg.secret_type {
            SecretType::IstioKeyAndCert => (
                "istio.io/key-and-cert",
                ["cert-chain.pem", "key.pem", "root-cert.pem"],
            ),
            SecretType::KubernetesTls => ("kubernetes.io/tls", ["tls.crt", "tls.key", "ca.crt"]),
        };
        let mut body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.cfg.secret_name,
                "namespace": self.cfg.namespace,
                "labels": { MANAGED_BY.0: MANAGED_BY.1 },
                "annotations": { "signet.dev/spiffe-id": svid.spiffe_id().to_string() },
            },
            "type": type_name,
            "data": {
                chain: B64.encode(svid.chain_pem()),
                key: B64.encode(svid.key_pem()),
                ca: B64.encode(svid.bundle_pem()),
            },
        });
        let mut applied = Applied::default();
        if !svid.crls_der.is_empty() {
            let crls = svid.crls_pem();
            if crls.len() <= MAX_SECRET_CRL_BYTES {
                body["data"][CRL_KEY] = Value::String(B64.encode(crls));
            } else {
                applied.warnings.push(format!(
                    "{}: the CRLs ({} bytes of PEM) exceed the {MAX_SECRET_CRL_BYTES} bytes a \
                     Secret is given, so {CRL_KEY} was left out; consumers of this Secret \
                     cannot see revocations (fetch the CRLs from the server's /crl/ instead)",
                    self.what(),
                    crls.len()
                ));
            }
        }
        (body, applied)
    }

    fn what(&self) -> String {
        format!("Secret {}/{}", self.cfg.namespace, self.cfg.secret_name)
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> SinkError {
        SinkError::new(&self.name, format!("{what} {}: {e}", self.what()))
    }

    async fn send(&self, what: &str, req: KubeRequest) -> Result<KubeResponse, SinkError> {
        self.api.send(req).await.map_err(|e| match e {
            KubeError::Timeout(m) => {
                SinkError::timeout(&self.name, format!("{what} {}: {m}", self.what()))
            }
            KubeError::Failed(m) => self.fail(what, m),
        })
    }

    async fn inspect(&self) -> Result<Existing, SinkError> {
        let resp = self
            .send(
                "cannot read",
                KubeRequest {
                    method: http::Method::GET,
                    path: self.path(),
                    query: Vec::new(),
                    content_type: None,
                    body: Vec::new(),
                },
            )
            .await?;
        if resp.status == http::StatusCode::NOT_FOUND {
            return Ok(Existing::Absent);
        }
        if !resp.status.is_success() {
            return Err(self.fail(
                "cannot read",
                format!("API server answered {}", resp.status),
            ));
        }
        let obj: Value = serde_json::from_slice(&resp.body)
            .map_err(|e| self.fail("cannot read", format!("the answer is not JSON: {e}")))?;
        Ok(match ownership(&obj) {
            Ok((uid, resource_version)) => Existing::Owned {
                uid,
                resource_version,
            },
            Err(why) => Existing::Foreign(why),
        })
    }

    fn refuse(&self, action: &str, why: &str) -> SinkError {
        SinkError::refused(
            &self.name,
            format!(
                "{} exists and is not managed by this agent ({why}); refusing to {action} it. \
                 Delete it or point the sink at another secret_name",
                self.what()
            ),
        )
    }

    fn conflict_or(&self, what: &str, status: http::StatusCode) -> SinkError {
        if status == http::StatusCode::CONFLICT {
            self.fail(
                what,
                "it changed while the agent was writing it (409 Conflict); will check again",
            )
        } else {
            self.fail(what, format!("API server answered {status}"))
        }
    }
}

#[async_trait::async_trait]
impl Sink for SecretSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn deliver(&self, svid: &Delivered) -> Result<Applied, SinkError> {
        let (mut body, applied) = self.apply_body(svid);
        let req = match self.inspect().await? {
            Existing::Foreign(why) => return Err(self.refuse("overwrite", &why.to_string())),
            Existing::Absent => KubeRequest {
                method: http::Method::POST,
                path: self.collection(),
                query: vec![("fieldManager".into(), FIELD_MANAGER.into())],
                content_type: Some(JSON),
                body: serde_json::to_vec(&body).map_err(|e| self.fail("cannot encode", e))?,
            },
            Existing::Owned {
                resource_version, ..
            } => {
                body["metadata"]["resourceVersion"] = Value::String(resource_version);
                KubeRequest {
                    method: http::Method::PATCH,
                    path: self.path(),
                    query: vec![
                        ("fieldManager".into(), FIELD_MANAGER.into()),
                        ("force".into(), "true".into()),
                    ],
                    // JSON is YAML: the apply-patch content type takes it as is.
                    content_type: Some(APPLY_PATCH),
                    body: serde_json::to_vec(&body).map_err(|e| self.fail("cannot encode", e))?,
                }
            }
        };
        let resp = self.send("cannot write", req).await?;
        if !resp.status.is_success() {
            return Err(self.conflict_or("cannot write", resp.status));
        }
        tracing::info!(sink = %self.name, spiffe_id = %svid.spiffe_id(), crls = svid.crls_der.len(), "Secret written");
        Ok(applied)
    }

    async fn remove(&self) -> Result<Applied, SinkError> {
        let (uid, resource_version) = match self.inspect().await? {
            Existing::Absent => return Ok(Applied::default()),
            Existing::Foreign(why) => return Err(self.refuse("delete", &why.to_string())),
            Existing::Owned {
                uid,
                resource_version,
            } => (uid, resource_version),
        };
        let body = json!({
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": { "uid": uid, "resourceVersion": resource_version },
        });
        let req = KubeRequest {
            method: http::Method::DELETE,
            path: self.path(),
            query: Vec::new(),
            content_type: Some(JSON),
            body: serde_json::to_vec(&body).map_err(|e| self.fail("cannot encode", e))?,
        };
        let resp = self.send("cannot delete", req).await?;
        if resp.status.is_success() || resp.status == http::StatusCode::NOT_FOUND {
            tracing::info!(sink = %self.name, "Secret deleted");
            Ok(Applied::default())
        } else {
            Err(self.conflict_or("cannot delete", resp.status))
        }
    }
}

#[cfg(test)]
#[path = "kubernetes_tests.rs"]
mod tests;
