//! Fetching a foreign trust domain's SPIFFE bundle from its bundle endpoint (SPIFFE Trust
//! Domain and Bundle, section 5: bundle endpoint profiles).
//!
//! [`fetch`] GETs the URL's path over HTTPS (HTTP/1.1, ALPN `http/1.1`) and reads the body as a
//! SPIFFE bundle document with [`SpiffeBundle::parse`], the one reader of the format. The server
//! is authenticated per [`Profile`]:
//! - `https_web`: its chain verifies against Web PKI roots (the system's — [`web_roots`] — or an
//!   operator's CA file) and its certificate is valid for the URL's host name;
//! - `https_spiffe`: its X509-SVID chains to the trust anchors held for that trust domain (the
//!   last bundle fetched, or one given out of band) with EKU serverAuth, and carries exactly one
//!   URI SAN, the configured endpoint SPIFFE ID; the host name is not checked (the SPIFFE ID
//!   replaces it).
//!
//! Certificate validity is judged at the injected clock's time (rustls's time provider is that
//! clock). Refused, each with a [`FetchError`] an operator can act on: a URL that is not
//! `https`; any status but 200 (a redirect is not followed: the error names its `Location`); a
//! body over [`FetchLimits::max_bytes`] (reading stops there, nothing more is buffered); a fetch
//! slower than [`FetchLimits::total_timeout`] (connecting and the TLS handshake within
//! [`FetchLimits::connect_timeout`]); a document the reader refuses; a document with neither
//! X.509 nor JWT authorities. Nothing the endpoint sends can make this code panic.

use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use http::{Request, StatusCode, header};
use hyper::body::Body as _;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::time_provider::TimeProvider;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, OtherError, RootCertStore,
    SignatureScheme,
};
use signet_pki::SpiffeBundle;
use signet_pki::bundle::{BundleError, MAX_DOCUMENT_BYTES};
use signet_types::SpiffeId;
use signet_types::untrusted::shown;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::clock::Clock;

/// How the bundle endpoint is authenticated (SPIFFE Trust Domain and Bundle, 5.2).
#[derive(Debug, Clone)]
pub enum Profile {
    /// Web PKI: the server's chain is checked against `roots` ([`web_roots`]: the system's, or
    /// an operator's CA file) and its certificate must be valid for the URL's host name.
    HttpsWeb { roots: Arc<RootCertStore> },
    /// SPIFFE authentication: the server's X509-SVID must chain to `trust_anchors` (DER roots:
    /// the last bundle held for the trust domain) and carry exactly `endpoint_id` as its URI
    /// SAN. The host name is not checked.
    HttpsSpiffe {
        endpoint_id: SpiffeId,
        trust_anchors: Vec<Vec<u8>>,
    },
}

/// Bounds on one fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchLimits {
    /// TCP connect (name resolution included) and the TLS handshake.
    pub connect_timeout: Duration,
    /// The whole fetch, from connecting to the last byte of the body.
    pub total_timeout: Duration,
    /// The largest body read; more is refused without being read.
    pub max_bytes: usize,
}

impl Default for FetchLimits {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            total_timeout: Duration::from_secs(30),
            max_bytes: MAX_DOCUMENT_BYTES,
        }
    }
}

/// A fetched bundle: the document as received and what [`SpiffeBundle::parse`] read from it.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub document: Vec<u8>,
    pub bundle: SpiffeBundle,
}

/// Why a bundle could not be fetched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The URL is not one a bundle endpoint can have (caller's configuration).
    #[error("bundle endpoint URL {url}: {reason}")]
    Url { url: String, reason: String },
    /// No TCP connection, or the connection failed before a response was read.
    #[error("bundle endpoint {url}: {reason}")]
    Connect { url: String, reason: String },
    /// The TLS handshake failed: the server's certificate was refused, or TLS itself failed.
    #[error("bundle endpoint {url}: TLS: {reason}")]
    Tls { url: String, reason: String },
    /// The server's X509-SVID chains to the trust anchors but is for another SPIFFE ID.
    #[error(
        "bundle endpoint {url}: the bundle endpoint presented {presented}, expected {expected}"
    )]
    SpiffeId {
        url: String,
        presented: String,
        expected: SpiffeId,
    },
    /// A redirect (3xx): not followed.
    #[error(
        "bundle endpoint {url}: answered {status} redirecting to {}; redirects are not \
         followed: configure the final URL", location.as_deref().unwrap_or("(no Location)")
    )]
    Redirect {
        url: String,
        status: StatusCode,
        location: Option<String>,
    },
    /// Any other status than 200.
    #[error("bundle endpoint {url}: answered {status}, 200 expected")]
    Http { url: String, status: StatusCode },
    #[error("bundle endpoint {url}: the document is larger than {max_bytes} bytes")]
    TooLarge { url: String, max_bytes: usize },
    #[error("bundle endpoint {url}: {during} took longer than {after:?}")]
    Timeout {
        url: String,
        during: &'static str,
        after: Duration,
    },
    #[error("bundle endpoint {url}: {source}")]
    Document {
        url: String,
        #[source]
        source: BundleError,
    },
    #[error(
        "bundle endpoint {url}: the bundle holds no x509-svid and no jwt-svid key (an empty \
         bundle would distrust the whole trust domain)"
    )]
    Empty { url: String },
}

impl FetchError {
    /// The metrics label of the failure.
    pub fn label(&self) -> &'static str {
        match self {
            FetchError::Url { .. } => "url",
            FetchError::Connect { .. } => "connect",
            FetchError::Tls { .. } => "tls",
            FetchError::SpiffeId { .. } => "spiffe_id",
            FetchError::Redirect { .. } | FetchError::Http { .. } => "http",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::Timeout { .. } => "timeout",
            FetchError::Document { .. } => "document",
            FetchError::Empty { .. } => "empty",
        }
    }
}

/// Why Web PKI roots could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RootsError {
    #[error("reading the CA file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA file {path} is not PEM certificates: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("the CA file {path} holds no certificate usable as a root")]
    Empty { path: PathBuf },
}

/// Web PKI roots for [`Profile::HttpsWeb`]: every certificate of the PEM file `ca_file` when
/// given (an operator's CA), else the Mozilla roots compiled in (`webpki-roots`).
pub fn web_roots(ca_file: Option<&Path>) -> Result<RootCertStore, RootsError> {
    let Some(path) = ca_file else {
        return Ok(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        });
    };
    let pem = std::fs::read(path).map_err(|source| RootsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RootsError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(RootsError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

/// Fetches and reads the bundle at `url` (see the module docs), judging certificate validity at
/// `clock`'s time.
pub async fn fetch(
    url: &url::Url,
    profile: &Profile,
    limits: &FetchLimits,
    clock: &Arc<dyn Clock>,
) -> Result<Fetched, FetchError> {
    let target = Target::of(url)?;
    let config = client_config(profile, clock, &target.url)?;
    let document = match tokio::time::timeout(
        limits.total_timeout,
        get(&target, Arc::new(config), profile, limits),
    )
    .await
    {
        Ok(r) => r?,
        Err(_) => {
            return Err(FetchError::Timeout {
                url: target.url,
                during: "the fetch",
                after: limits.total_timeout,
            });
        }
    };
    let bundle = SpiffeBundle::parse(&document).map_err(|source| FetchError::Document {
        url: target.url.clone(),
        source,
    })?;
    if bundle.x509_authorities.is_empty() && bundle.jwt_authorities.is_empty() {
        return Err(FetchError::Empty { url: target.url });
    }
    Ok(Fetched { document, bundle })
}

/// Where to connect and what to ask for, from a checked URL.
struct Target {
    /// The URL as given, for messages.
    url: String,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    /// `Host` header: host and, when not 443, port.
    authority: String,
    path_and_query: String,
}

impl Target {
    fn of(url: &url::Url) -> Result<Self, FetchError> {
        let refuse = |reason: &str| FetchError::Url {
            url: url.to_string(),
            reason: reason.to_owned(),
        };
        match url.scheme() {
            "https" => {}
            "http" => {
                return Err(refuse(
                    "is http: a bundle endpoint is served over HTTPS only (https_web or \
                     https_spiffe); use an https:// URL",
                ));
            }
            other => {
                return Err(refuse(&format!(
                    "has scheme {other:?}: a bundle endpoint URL is https://"
                )));
            }
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(refuse(
                "carries a user name or password: a bundle endpoint needs none",
            ));
        }
        let (host, server_name) = match url.host() {
            Some(url::Host::Domain(d)) => (
                d.to_owned(),
                ServerName::try_from(d.to_owned())
                    .map_err(|_| refuse("its host is not a valid DNS name"))?,
            ),
            Some(url::Host::Ipv4(ip)) => {
                (ip.to_string(), ServerName::from(std::net::IpAddr::V4(ip)))
            }
            Some(url::Host::Ipv6(ip)) => {
                (ip.to_string(), ServerName::from(std::net::IpAddr::V6(ip)))
            }
            None => return Err(refuse("has no host")),
        };
        let port = url.port_or_known_default().unwrap_or(443);
        let host_str = url.host_str().unwrap_or(&host);
        let authority = match url.port() {
            Some(p) => format!("{host_str}:{p}"),
            None => host_str.to_owned(),
        };
        let path_and_query = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        Ok(Self {
            url: url.to_string(),
            host,
            port,
            server_name,
            authority,
            path_and_query,
        })
    }
}

fn provider() -> Arc<CryptoProvider> {
    crate::tls::provider()
}

/// The injected clock as rustls's time source, so certificate validity is judged at its time.
struct ClockTime(Arc<dyn Clock>);

impl fmt::Debug for ClockTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClockTime")
    }
}

impl TimeProvider for ClockTime {
    fn current_time(&self) -> Option<UnixTime> {
        self.0
            .now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(UnixTime::since_unix_epoch)
    }
}

fn client_config(
    profile: &Profile,
    clock: &Arc<dyn Clock>,
    url: &str,
) -> Result<ClientConfig, FetchError> {
    let tls = |reason: String| FetchError::Tls {
        url: url.to_owned(),
        reason,
    };
    let builder =
        ClientConfig::builder_with_details(provider(), Arc::new(ClockTime(Arc::clone(clock))))
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match profile {
        Profile::HttpsWeb { roots } => {
            WebPkiServerVerifier::builder_with_provider(Arc::clone(roots), provider())
                .build()
                .map_err(|e| tls(format!("the Web PKI roots cannot be used: {e}")))?
        }
        Profile::HttpsSpiffe {
            endpoint_id,
            trust_anchors,
        } => {
            Arc::new(SpiffeEndpointVerifier::new(endpoint_id.clone(), trust_anchors).map_err(tls)?)
        }
    };
    let mut config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The endpoint's certificate names another SPIFFE ID than the one configured.
#[derive(Debug, thiserror::Error)]
#[error("the bundle endpoint presented {presented}, expected {expected}")]
struct WrongEndpointId {
    presented: String,
    expected: SpiffeId,
}

/// `https_spiffe`: the chain to the trust anchors (rustls-webpki, EKU serverAuth, no revocation
/// check, the time rustls passes in: the injected clock's), then exactly one URI SAN, the
/// expected SPIFFE ID. The host name is not checked.
#[derive(Debug)]
struct SpiffeEndpointVerifier {
    roots: RootCertStore,
    expected: SpiffeId,
    provider: Arc<CryptoProvider>,
}

impl SpiffeEndpointVerifier {
    fn new(expected: SpiffeId, trust_anchors: &[Vec<u8>]) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        for (i, der) in trust_anchors.iter().enumerate() {
            roots
                .add(CertificateDer::from(der.as_slice()).into_owned())
                .map_err(|e| format!("trust anchor {i} for {expected} cannot be used: {e}"))?;
        }
        if roots.is_empty() {
            return Err(format!(
                "no trust anchors are held for {expected}: an https_spiffe endpoint needs its \
                 trust domain's bundle first"
            ));
        }
        Ok(Self {
            roots,
            expected,
            provider: provider(),
        })
    }

    fn check_id(&self, end_entity: &CertificateDer<'_>) -> Result<(), String> {
        let cert = signet_pki::ParsedCert::from_der(end_entity)
            .map_err(|e| format!("the endpoint's certificate cannot be read: {e}"))?;
        match cert.uris() {
            [one] if one.parse::<SpiffeId>().as_ref() == Ok(&self.expected) => Ok(()),
            [one] => Err(shown(one)),
            [] => Err("a certificate with no URI SAN".to_owned()),
            many => Err(format!(
                "a certificate with {} URI SANs ({})",
                many.len(),
                many.iter().map(|u| shown(u)).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

impl ServerCertVerifier for SpiffeEndpointVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        self.check_id(end_entity).map_err(|presented| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                WrongEndpointId {
                    presented,
                    expected: self.expected.clone(),
                },
            ))))
        })?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The TLS handshake's failure as a [`FetchError`]: a wrong SPIFFE ID as such, a refused
/// certificate or a TLS alert as `Tls`, anything else (the connection dropped) as `Connect`.
fn handshake_error(url: &str, e: std::io::Error, profile: &Profile) -> FetchError {
    let rustls_error = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(CertificateError::Other(other))) => {
            if let Some(w) = other.0.downcast_ref::<WrongEndpointId>() {
                return FetchError::SpiffeId {
                    url: url.to_owned(),
                    presented: w.presented.clone(),
                    expected: w.expected.clone(),
                };
            }
            FetchError::Tls {
                url: url.to_owned(),
                reason: format!("the endpoint's certificate is refused: {other}"),
            }
        }
        Some(r @ rustls::Error::InvalidCertificate(_)) => FetchError::Tls {
            url: url.to_owned(),
            reason: format!(
                "the endpoint's certificate is refused ({}): {r}",
                match profile {
                    Profile::HttpsWeb { .. } => "https_web: Web PKI roots and the URL's host name",
                    Profile::HttpsSpiffe { .. } =>
                        "https_spiffe: the trust domain's bundle and the endpoint SPIFFE ID",
                }
            ),
        },
        Some(r) => FetchError::Tls {
            url: url.to_owned(),
            reason: r.to_string(),
        },
        None => FetchError::Connect {
            url: url.to_owned(),
            reason: format!("the TLS handshake failed: {e}"),
        },
    }
}

/// Aborts the HTTP connection's task when the fetch ends, however it ends (a timeout drops the
/// fetch future).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connect, handshake, GET, and read at most `max_bytes` of a 200 response's body.
async fn get(
    target: &Target,
    config: Arc<ClientConfig>,
    profile: &Profile,
    limits: &FetchLimits,
) -> Result<Vec<u8>, FetchError> {
    let url = target.url.as_str();
    let connect_err = |reason: String| FetchError::Connect {
        url: url.to_owned(),
        reason,
    };
    let connecting = async {
        let tcp = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| {
                connect_err(format!(
                    "cannot connect to {}:{}: {e}",
                    target.host, target.port
                ))
            })?;
        // Small requests and responses: no Nagle delay.
        let _ = tcp.set_nodelay(true);
        TlsConnector::from(config)
            .connect(target.server_name.clone(), tcp)
            .await
            .map_err(|e| handshake_error(url, e, profile))
    };
    let tls = tokio::time::timeout(limits.connect_timeout, connecting)
        .await
        .map_err(|_| FetchError::Timeout {
            url: url.to_owned(),
            during: "connecting and the TLS handshake",
            after: limits.connect_timeout,
        })??;

    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, String>(TokioIo::new(tls))
        .await
        .map_err(|e| connect_err(format!("HTTP/1.1: {e}")))?;
    let _conn = AbortOnDrop(tokio::spawn(async move {
        // Its error shows in `send_request` or in the body.
        let _ = conn.await;
    }));
    let request = Request::get(target.path_and_query.as_str())
        .header(header::HOST, target.authority.as_str())
        .header(header::ACCEPT, "application/json")
        .header(header::USER_AGENT, "signet-server")
        .body(String::new())
        .map_err(|e| FetchError::Url {
            url: url.to_owned(),
            reason: format!("cannot be requested: {e}"),
        })?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| connect_err(format!("no HTTP response: {e}")))?;

    let status = response.status();
    if status.is_redirection() {
        return Err(FetchError::Redirect {
            url: url.to_owned(),
            status,
            location: response
                .headers()
                .get(header::LOCATION)
                .map(|l| shown(&String::from_utf8_lossy(l.as_bytes()))),
        });
    }
    if status != StatusCode::OK {
        return Err(FetchError::Http {
            url: url.to_owned(),
            status,
        });
    }
    let too_large = || FetchError::TooLarge {
        url: url.to_owned(),
        max_bytes: limits.max_bytes,
    };
    let declared = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        return Err(too_large());
    }
    let mut body = response.into_body();
    let mut document = Vec::with_capacity(
        declared
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0)
            .min(limits.max_bytes),
    );
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| connect_err(format!("reading the body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if data.len() > limits.max_bytes.saturating_sub(document.len()) {
                return Err(too_large());
            }
            document.extend_from_slice(&data);
        }
    }
    Ok(document)
}

/// The network [`super::relationships::BundleSource`]: [`fetch`] with the profile a
/// relationship names.
pub struct NetworkSource {
    pub web_roots: Arc<RootCertStore>,
    pub limits: FetchLimits,
    pub clock: Arc<dyn Clock>,
}

#[async_trait::async_trait]
impl super::relationships::BundleSource for NetworkSource {
    async fn fetch(
        &self,
        ep: &super::relationships::Endpoint,
    ) -> Result<SpiffeBundle, super::relationships::FetchFailure> {
        use super::relationships::{FetchFailure, PROFILE_HTTPS_SPIFFE, PROFILE_HTTPS_WEB};
        let url = url::Url::parse(&ep.url).map_err(|e| FetchFailure {
            label: "url",
            message: format!("bundle endpoint URL {}: {e}", shown(&ep.url)),
        })?;
        let profile = match ep.profile.as_str() {
            PROFILE_HTTPS_WEB => Profile::HttpsWeb {
                roots: self.web_roots.clone(),
            },
            PROFILE_HTTPS_SPIFFE => Profile::HttpsSpiffe {
                endpoint_id: ep.endpoint_spiffe_id.parse().map_err(|e| FetchFailure {
                    label: "url",
                    message: format!("endpoint SPIFFE ID {}: {e}", shown(&ep.endpoint_spiffe_id)),
                })?,
                trust_anchors: ep.trust_anchors.clone(),
            },
            other => {
                return Err(FetchFailure {
                    label: "url",
                    message: format!("profile {} has no bundle endpoint", shown(other)),
                });
            }
        };
        fetch(&url, &profile, &self.limits, &self.clock)
            .await
            .map(|f| {
                tracing::debug!(
                    trust_domain = %ep.trust_domain,
                    bytes = f.document.len(),
                    "federated bundle document fetched"
                );
                f.bundle
            })
            .map_err(|e| FetchFailure {
                label: e.label(),
                message: e.to_string(),
            })
    }
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
