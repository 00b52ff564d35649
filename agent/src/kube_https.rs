//! The one HTTPS client the agent uses to speak to Kubernetes (the API server for the
//! `kubernetes-secret` sink and for the pod list of workload attestation, or the kubelet): hyper
//! HTTP/1.1 over rustls with ring, one connection per request, the service-account token re-read
//! from its file on every request (projected tokens rotate), answers read up to a size limit.
//! Callers put their own deadline around [`KubeHttps::send`].

use std::path::PathBuf;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};

/// One Kubernetes HTTPS endpoint and the credentials the agent presents to it.
pub struct KubeHttps {
    /// `host:port` to dial, also sent as `Host`.
    addr: String,
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    token_file: PathBuf,
    max_body: usize,
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeAnswer {
    pub status: http::StatusCode,
    pub body: Vec<u8>,
}

impl KubeHttps {
    pub fn new(
        addr: String,
        server_name: ServerName<'static>,
        tls: Arc<rustls::ClientConfig>,
        token_file: PathBuf,
        max_body: usize,
    ) -> Self {
        Self {
            addr,
            server_name,
            tls,
            token_file,
            max_body,
        }
    }

    /// `host:port` this client dials.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends one request with `authorization: Bearer <token>`. Errors name the request and the
    /// endpoint, never the token.
    pub async fn send(
        &self,
        method: http::Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<KubeAnswer, String> {
        let what = format!("{method} {path_and_query}");
        let token = tokio::fs::read_to_string(&self.token_file)
            .await
            .map_err(|e| format!("service-account token {}: {e}", self.token_file.display()))?;
        let tcp = tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|e| format!("connect {}: {e}", self.addr))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS to {}: {e}", self.addr))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP to {}: {e}", self.addr))?;
        let conn = tokio::spawn(conn);
        let mut builder = http::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(http::header::HOST, self.addr.as_str())
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            );
        if let Some(ct) = content_type {
            builder = builder.header(http::header::CONTENT_TYPE, ct);
        }
        let result = async {
            let request = builder
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| format!("{what}: {e}"))?;
            let resp = sender
                .send_request(request)
                .await
                .map_err(|e| format!("{what}: {e}"))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), self.max_body)
                .collect()
                .await
                .map_err(|e| format!("{what}: reading the answer: {e}"))?
                .to_bytes()
                .to_vec();
            Ok(KubeAnswer { status, body })
        }
        .await;
        drop(sender);
        conn.abort();
        result
    }
}

/// The roots of a PEM CA bundle; `what` names the file in errors.
pub fn roots_from_pem(pem: &[u8], what: &str) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for der in signet_types::pem::parse_certs(pem).map_err(|e| format!("{what}: {e}"))? {
        roots
            .add(CertificateDer::from(der))
            .map_err(|e| format!("{what}: {e}"))?;
    }
    Ok(roots)
}

/// A TLS client configuration (ring) trusting `roots`.
pub fn client_config(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, String> {
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth())
}
