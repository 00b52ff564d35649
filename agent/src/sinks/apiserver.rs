//! A minimal [`KubeTransport`]: HTTPS to the API server with the pod's service-account
//! credentials, over the agent's one Kubernetes client ([`crate::kube_https`]). One connection
//! per request: the sink writes once per rotation. Every request has a deadline
//! (`kubernetes_api.timeout`, connect to last byte) and an answer is read up to [`MAX_BODY`]
//! bytes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

use crate::config::KubernetesApiConfig;
use crate::kube_https::{KubeHttps, KubeHttpsError, KubeTlsError, client_config, roots_from_pem};
use crate::sinks::kubernetes::{KubeError, KubeRequest, KubeResponse, KubeTransport};

/// Largest answer read (a Secret is at most 1 MiB, plus its metadata).
pub const MAX_BODY: usize = 4 << 20;

/// Why the Kubernetes API client cannot be built from the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error(transparent)]
    ServerUrl(#[from] BadServerUrl),
    #[error(
        "KUBERNETES_SERVICE_HOST is not set (not running in a pod) and kubernetes_api.server is \
         not configured"
    )]
    NotInCluster,
    #[error("kubernetes_api.ca_file {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The CA bundle or the TLS configuration.
    #[error(transparent)]
    Tls(#[from] KubeTlsError),
    #[error("server name {name:?}: {reason}")]
    ServerName { name: String, reason: String },
}

/// A `kubernetes_api.server` that is not `https://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kubernetes_api.server {0:?} must be https://host[:port]")]
pub struct BadServerUrl(String);

pub struct ApiServer {
    http: KubeHttps,
    timeout: Duration,
}

impl ApiServer {
    /// From the configuration: `server`, or the in-cluster `KUBERNETES_SERVICE_HOST`/`_PORT`,
    /// with the CA bundle and token files it names.
    pub fn from_config(cfg: &KubernetesApiConfig) -> Result<Self, ApiServerError> {
        let addr = match &cfg.server {
            Some(url) => host_port(url)?,
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST")
                    .map_err(|_| ApiServerError::NotInCluster)?;
                let port =
                    std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                }
            }
        };
        let ca = std::fs::read(&cfg.ca_file).map_err(|source| ApiServerError::CaFile {
            path: cfg.ca_file.clone(),
            source,
        })?;
        Ok(
            Self::new(addr, &cfg.server_name, &ca, cfg.token_file.clone())?
                .with_timeout(cfg.timeout),
        )
    }

    pub fn new(
        addr: String,
        server_name: &str,
        ca_pem: &[u8],
        token_file: PathBuf,
    ) -> Result<Self, ApiServerError> {
        let tls = roots_from_pem(ca_pem, "CA bundle").and_then(client_config)?;
        let server_name = ServerName::try_from(server_name.to_owned()).map_err(|e| {
            ApiServerError::ServerName {
                name: server_name.to_owned(),
                reason: e.to_string(),
            }
        })?;
        Ok(Self {
            http: KubeHttps::new(addr, server_name, Arc::new(tls), token_file, MAX_BODY),
            timeout: crate::config::DEFAULT_KUBERNETES_API_TIMEOUT,
        })
    }

    /// The deadline of one request.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn send_inner(&self, req: KubeRequest) -> Result<KubeResponse, KubeHttpsError> {
        let answer = self
            .http
            .send(
                req.method.clone(),
                &req.path_and_query(),
                req.content_type,
                req.body,
            )
            .await?;
        Ok(KubeResponse {
            status: answer.status,
            body: answer.body,
        })
    }
}

/// `host:port` of `https://host[:port][/]` (port 443 when absent).
fn host_port(url: &str) -> Result<String, BadServerUrl> {
    let bad = || BadServerUrl(url.to_owned());
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(bad)?
        .trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return Err(bad());
    }
    let has_port = rest
        .rsplit_once(':')
        .is_some_and(|(h, p)| p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']')));
    Ok(if has_port {
        rest.to_owned()
    } else {
        format!("{rest}:443")
    })
}

#[async_trait::async_trait]
impl KubeTransport for ApiServer {
    async fn send(&self, req: KubeRequest) -> Result<KubeResponse, KubeError> {
        let what = format!("{} {}", req.method, req.path);
        match tokio::time::timeout(self.timeout, self.send_inner(req)).await {
            Ok(r) => r.map_err(|e| KubeError::Failed(e.to_string())),
            Err(_) => Err(KubeError::Timeout(format!(
                "{what}: the API server at {} did not answer within {:?}",
                self.http.addr(),
                self.timeout
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper_util::rt::TokioIo;
    use rcgen::{CertificateParams, KeyPair};
    use tokio::sync::mpsc;

    struct Seen {
        method: http::Method,
        uri: String,
        auth: Option<String>,
        content_type: Option<String>,
        body: Vec<u8>,
    }

    /// A TLS API server on 127.0.0.1:0 that records one request per connection and answers
    /// `status`.
    async fn fake_apiserver(status: u16) -> (String, Vec<u8>, mpsc::Receiver<Seen>) {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["kubernetes.default.svc".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let ca_pem = cert.pem().into_bytes();
        let server_cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der"),
        )
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                let tx = tx.clone();
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes().to_vec())
                                .unwrap_or_default();
                            let header = |h| {
                                parts
                                    .headers
                                    .get(h)
                                    .and_then(|v: &http::HeaderValue| v.to_str().ok())
                                    .map(str::to_owned)
                            };
                            let _ = tx
                                .send(Seen {
                                    method: parts.method.clone(),
                                    uri: parts.uri.to_string(),
                                    auth: header(http::header::AUTHORIZATION),
                                    content_type: header(http::header::CONTENT_TYPE),
                                    body,
                                })
                                .await;
                            http::Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::from_static(b"{}")))
                        }
                    });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        (addr, ca_pem, rx)
    }

    #[tokio::test]
    async fn sends_the_real_request_with_bearer_token() {
        let (addr, ca, mut seen) = fake_apiserver(200).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "sa-token-1\n").expect("token");
        let api =
            ApiServer::new(addr, "kubernetes.default.svc", &ca, token.clone()).expect("client");
        let status = api
            .send(KubeRequest {
                method: http::Method::PATCH,
                path: "/api/v1/namespaces/prod/secrets/web-tls".into(),
                query: vec![
                    ("fieldManager".into(), "signet-agent".into()),
                    ("force".into(), "true".into()),
                ],
                content_type: Some("application/apply-patch+yaml"),
                body: b"{\"kind\":\"Secret\"}".to_vec(),
            })
            .await
            .expect("send");
        assert_eq!(status.status, http::StatusCode::OK);
        assert_eq!(status.body, b"{}");
        let s = seen.recv().await.expect("request seen");
        assert_eq!(s.method, http::Method::PATCH);
        assert_eq!(
            s.uri,
            "/api/v1/namespaces/prod/secrets/web-tls?fieldManager=signet-agent&force=true"
        );
        assert_eq!(s.auth.as_deref(), Some("Bearer sa-token-1"));
        assert_eq!(
            s.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        assert_eq!(s.body, b"{\"kind\":\"Secret\"}");

        // A rotated token is picked up on the next request.
        std::fs::write(&token, "sa-token-2").expect("token");
        api.send(KubeRequest {
            method: http::Method::DELETE,
            path: "/api/v1/namespaces/prod/secrets/web-tls".into(),
            query: vec![],
            content_type: None,
            body: vec![],
        })
        .await
        .expect("send");
        let s = seen.recv().await.expect("request seen");
        assert_eq!(s.method, http::Method::DELETE);
        assert_eq!(s.auth.as_deref(), Some("Bearer sa-token-2"));
    }

    #[tokio::test]
    async fn untrusted_server_is_refused() {
        let (addr, _ca, _seen) = fake_apiserver(200).await;
        let (_, other_ca, _) = fake_apiserver(200).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "t").expect("token");
        let api = ApiServer::new(addr, "kubernetes.default.svc", &other_ca, token).expect("client");
        let err = api
            .send(KubeRequest {
                method: http::Method::DELETE,
                path: "/x".into(),
                query: vec![],
                content_type: None,
                body: vec![],
            })
            .await
            .expect_err("untrusted");
        assert!(err.to_string().contains("TLS"), "{err}");
    }

    // Paused time: the deadline passes as soon as nothing else can happen.
    #[tokio::test(start_paused = true)]
    async fn a_server_that_never_answers_times_out() {
        // Accepts connections and holds them without a word.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let (_, ca, _) = fake_apiserver(200).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "t").expect("token");
        let api = ApiServer::new(addr, "kubernetes.default.svc", &ca, token)
            .expect("client")
            .with_timeout(Duration::from_millis(200));
        let err = api
            .send(KubeRequest {
                method: http::Method::GET,
                path: "/api/v1/namespaces/a/secrets/b".into(),
                query: vec![],
                content_type: None,
                body: vec![],
            })
            .await
            .expect_err("timed out");
        assert!(
            matches!(&err, KubeError::Timeout(m) if m.contains("did not answer")),
            "{err}"
        );
        hold.abort();
    }

    #[test]
    fn server_urls() {
        assert_eq!(
            host_port("https://10.0.0.1:6443").as_deref(),
            Ok("10.0.0.1:6443")
        );
        assert_eq!(
            host_port("https://k8s.example/").as_deref(),
            Ok("k8s.example:443")
        );
        assert_eq!(host_port("https://[::1]:6443").as_deref(), Ok("[::1]:6443"));
        assert_eq!(host_port("https://[::1]").as_deref(), Ok("[::1]:443"));
        for bad in ["http://x:1", "https://", "https://x/api", "https://u@x:1"] {
            assert!(host_port(bad).is_err(), "{bad}");
        }
    }
}
