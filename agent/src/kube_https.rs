//! The one HTTPS client the agent uses to speak to Kubernetes (the API server for the
//! `kubernetes-secret` sink and for the pod list of workload attestation, or the kubelet): hyper
//! HTTP/1.1 over rustls with ring, one connection per request, the service-account token re-read
//! from its file on every request (projected tokens rotate), answers read up to a size limit.
//! Callers put their own deadline around [`KubeHttps::send`].

use std::path::PathBuf;
use std::sync::Arc;
use std::{error::Error as StdError, io};

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

/// Why one request got no answer. Each reason names the request or the endpoint, never the
/// token.
#[derive(Debug, thiserror::Error)]
pub enum KubeHttpsError {
    /// The service-account token file could not be read.
    #[error("service-account token {}: {source}", path.display())]
    Token { path: PathBuf, source: io::Error },
    #[error("connect {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("TLS to {addr}: {source}")]
    Tls { addr: String, source: io::Error },
    #[error("HTTP to {addr}: {source}")]
    Handshake { addr: String, source: hyper::Error },
    /// The request could not be built (what: `METHOD path`).
    #[error("{what}: {source}")]
    Request { what: String, source: http::Error },
    #[error("{what}: {source}")]
    Send { what: String, source: hyper::Error },
    /// The answer broke off or is larger than the limit.
    #[error("{what}: reading the answer: {source}")]
    Answer {
        what: String,
        source: Box<dyn StdError + Send + Sync>,
    },
}

/// Why a TLS client configuration for Kubernetes cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeTlsError {
    /// The CA bundle is not PEM certificates (what: the file, as the caller names it).
    #[error("{what}: {source}")]
    Pem {
        what: String,
        source: signet_types::pem::PemError,
    },
    /// A certificate of the bundle is not a usable root.
    #[error("{what}: {source}")]
    Root { what: String, source: rustls::Error },
    /// The crypto provider offers no safe protocol version.
    #[error("{0}")]
    Versions(rustls::Error),
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
    ) -> Result<KubeAnswer, KubeHttpsError> {
        let what = format!("{method} {path_and_query}");
        let token = tokio::fs::read_to_string(&self.token_file)
            .await
            .map_err(|source| KubeHttpsError::Token {
                path: self.token_file.clone(),
                source,
            })?;
        let tcp = tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|source| KubeHttpsError::Connect {
                addr: self.addr.clone(),
                source,
            })?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|source| KubeHttpsError::Tls {
                addr: self.addr.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|source| KubeHttpsError::Handshake {
                addr: self.addr.clone(),
                source,
            })?;
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
                .map_err(|source| KubeHttpsError::Request {
                    what: what.clone(),
                    source,
                })?;
            let resp =
                sender
                    .send_request(request)
                    .await
                    .map_err(|source| KubeHttpsError::Send {
                        what: what.clone(),
                        source,
                    })?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), self.max_body)
                .collect()
                .await
                .map_err(|source| KubeHttpsError::Answer {
                    what: what.clone(),
                    source,
                })?
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
pub fn roots_from_pem(pem: &[u8], what: &str) -> Result<rustls::RootCertStore, KubeTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    let ders = signet_types::pem::parse_certs(pem).map_err(|source| KubeTlsError::Pem {
        what: what.to_owned(),
        source,
    })?;
    for der in ders {
        roots
            .add(CertificateDer::from(der))
            .map_err(|source| KubeTlsError::Root {
                what: what.to_owned(),
                source,
            })?;
    }
    Ok(roots)
}

/// A TLS client configuration (ring) trusting `roots`.
pub fn client_config(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, KubeTlsError> {
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(KubeTlsError::Versions)?
    .with_root_certificates(roots)
    .with_no_client_auth())
}
