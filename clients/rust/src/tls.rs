//! The one place a Signet client opens a TLS connection to a Signet CA server.
//!
//! The server is recognised by three checks, all in [`SignetServerVerifier`], which every
//! handshake passes through:
//! 1. its chain verifies against the caller's trust bundle (webpki, with ring);
//! 2. its leaf is valid for the host name the caller dials (or `server_name`);
//! 3. its leaf carries exactly one URI SAN, and it is `spiffe://<trust domain>/signet/server`.
//!
//! The third check is what a DNS name alone cannot give: a Signet certificate for the same DNS
//! name held by anyone else (a workload, a bridge-issued certificate in the server's namespace,
//! an admin-minted one) is refused before the client sends a single byte of a request, so
//! neither a join token, nor a bearer token, nor a CSR reaches it, and it cannot push roots.

use std::fmt;
use std::sync::{Arc, RwLock};

use hyper_util::rt::TokioIo;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use signet_types::{SpiffeId, TrustDomain};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{ClientError, ClientIdentity, error_chain};

/// How long one connection attempt (TCP and the TLS handshake) may take by default; it also
/// bounds every reconnection of a channel.
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The path of the server's own SPIFFE ID in every trust domain.
pub const SERVER_ID_PATH: &str = "/signet/server";

/// The SPIFFE ID a Signet server of `td` presents: `spiffe://<td>/signet/server`.
pub fn server_id(td: &TrustDomain) -> SpiffeId {
    // A fixed, valid path: building it cannot fail.
    td.id(SERVER_ID_PATH)
        .unwrap_or_else(|_| unreachable!("{SERVER_ID_PATH} is a valid SPIFFE ID path"))
}

/// Where a Signet CA server is and how to recognise it.
#[derive(Clone)]
pub struct ServerTarget {
    /// `https://host:port` or `host:port`.
    pub addr: String,
    /// The DNS name (or IP) checked in the server's certificate; default: the host of `addr`.
    pub server_name: Option<String>,
    /// PEM roots that sign the server's certificate.
    pub bundle_pem: Vec<u8>,
    /// The server must present `spiffe://<trust_domain>/signet/server`.
    pub trust_domain: TrustDomain,
    /// Bound on each connection attempt, TCP and TLS handshake (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]).
    pub connect_timeout: std::time::Duration,
    /// When set, the roots the server is verified against instead of `bundle_pem`: read at
    /// each handshake, so a long-lived channel follows a root rotation ([`ServerRoots`]).
    pub shared_roots: Option<Arc<ServerRoots>>,
}

impl fmt::Debug for ServerTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTarget")
            .field("addr", &self.addr)
            .field("server_name", &self.server_name)
            .field("bundle_pem_bytes", &self.bundle_pem.len())
            .field("trust_domain", &self.trust_domain)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl ServerTarget {
    pub fn new(addr: impl Into<String>, bundle_pem: Vec<u8>, trust_domain: TrustDomain) -> Self {
        Self {
            addr: addr.into(),
            server_name: None,
            bundle_pem,
            trust_domain,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            shared_roots: None,
        }
    }

    /// Verifies the server against `roots` as they are at each handshake (the first and every
    /// reconnection of the channel), instead of `bundle_pem`.
    pub fn with_shared_roots(mut self, roots: Arc<ServerRoots>) -> Self {
        self.shared_roots = Some(roots);
        self
    }

    pub fn with_connect_timeout(mut self, t: std::time::Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    pub fn with_server_name(mut self, name: Option<String>) -> Self {
        self.server_name = name;
        self
    }

    /// The SPIFFE ID the server must present.
    pub fn server_id(&self) -> SpiffeId {
        server_id(&self.trust_domain)
    }
}

/// The server presented a certificate that chains to the bundle and fits the host name, but
/// is not the Signet server's identity.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WrongServerIdentity(String);

impl fmt::Debug for WrongServerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The URI SANs of a DER certificate ([`signet_pki::ParsedCert`]).
fn uri_sans(der: &[u8]) -> Result<Vec<String>, signet_pki::CertError> {
    signet_pki::ParsedCert::from_der(der).map(|c| c.uris().to_vec())
}

/// Why a certificate the server presented or a root could not be read.
fn unreadable(e: signet_pki::CertError) -> String {
    format!("the server's certificate cannot be read: {e}")
}

/// Checks that the leaf `der` carries exactly one URI SAN and that it is `expected`.
pub fn check_server_id(der: &[u8], expected: &SpiffeId) -> Result<(), WrongServerIdentity> {
    let uris = uri_sans(der).map_err(|e| WrongServerIdentity(unreadable(e)))?;
    match uris.as_slice() {
        [one] if one.parse::<SpiffeId>().as_ref() == Ok(expected) => Ok(()),
        [] => Err(WrongServerIdentity(format!(
            "the server's certificate carries no SPIFFE ID; a Signet server presents {expected}"
        ))),
        [one] => Err(WrongServerIdentity(format!(
            "the server's certificate carries the SPIFFE ID {one}, not {expected}: it is not \
             the Signet server of this trust domain (refused before any request was sent)"
        ))),
        many => Err(WrongServerIdentity(format!(
            "the server's certificate carries {} URI SANs ({}); a Signet server presents exactly \
             one, {expected}",
            many.len(),
            many.join(", ")
        ))),
    }
}

/// The current trust anchors for the server, shared by every connection opened with them:
/// [`SignetServerVerifier`] reads them at each handshake, so replacing them ([`Self::set`])
/// reaches the next connection and every reconnection of a channel already open (an agent's
/// channel outlives a root rotation and the server's restart under the new root).
pub struct ServerRoots(RwLock<Arc<WebPkiServerVerifier>>);

impl fmt::Debug for ServerRoots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerRoots").finish_non_exhaustive()
    }
}

impl ServerRoots {
    /// The roots in `bundle_pem` (at least one PEM certificate).
    pub fn new(bundle_pem: &[u8]) -> Result<Self, ClientError> {
        Ok(Self(RwLock::new(webpki_verifier(bundle_pem)?)))
    }

    /// Replaces the roots with those in `bundle_pem`; on error the current ones stay.
    pub fn set(&self, bundle_pem: &[u8]) -> Result<(), ClientError> {
        let next = webpki_verifier(bundle_pem)?;
        match self.0.write() {
            Ok(mut g) => *g = next,
            Err(p) => *p.into_inner() = next,
        }
        Ok(())
    }

    fn current(&self) -> Arc<WebPkiServerVerifier> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// webpki's verifier (chain, validity, host name) for the roots in `bundle_pem`.
fn webpki_verifier(bundle_pem: &[u8]) -> Result<Arc<WebPkiServerVerifier>, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0usize;
    for c in CertificateDer::pem_slice_iter(bundle_pem) {
        let c = c.map_err(|e| ClientError::Bundle(e.to_string()))?;
        roots
            .add(c)
            .map_err(|e| ClientError::Bundle(e.to_string()))?;
        n += 1;
    }
    if n == 0 {
        return Err(ClientError::Bundle("no PEM CERTIFICATE in it".into()));
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| ClientError::Bundle(e.to_string()))
}

/// webpki's verifier (chain to the current roots, validity, host name), then the SPIFFE ID
/// check.
#[derive(Debug)]
pub struct SignetServerVerifier {
    roots: Arc<ServerRoots>,
    expected: SpiffeId,
}

impl SignetServerVerifier {
    pub fn new(bundle_pem: &[u8], expected: SpiffeId) -> Result<Self, ClientError> {
        Ok(Self::with_roots(
            Arc::new(ServerRoots::new(bundle_pem)?),
            expected,
        ))
    }

    /// Verifies against `roots` as they are at each handshake.
    pub fn with_roots(roots: Arc<ServerRoots>, expected: SpiffeId) -> Self {
        Self { roots, expected }
    }
}

impl ServerCertVerifier for SignetServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.roots.current().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        check_server_id(end_entity, &self.expected).map_err(|e| {
            rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
                Arc::new(e),
            )))
        })?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.roots
            .current()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.roots
            .current()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.roots.current().supported_verify_schemes()
    }

    // No hints: the roots change under the verifier (webpki's gives none either).
    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        None
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client configuration for `target`: [`SignetServerVerifier`], ALPN h2, and the
/// client certificate when given.
pub fn client_config(
    target: &ServerTarget,
    identity: Option<&ClientIdentity>,
) -> Result<rustls::ClientConfig, ClientError> {
    let verifier = match &target.shared_roots {
        Some(roots) => SignetServerVerifier::with_roots(roots.clone(), target.server_id()),
        None => SignetServerVerifier::new(&target.bundle_pem, target.server_id())?,
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut cfg = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let chain = CertificateDer::pem_slice_iter(&id.cert_chain_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ClientError::Identity(format!("certificate chain: {e}")))?;
            if chain.is_empty() {
                return Err(ClientError::Identity(
                    "no PEM CERTIFICATE in the client certificate chain".into(),
                ));
            }
            // The key's error never includes the key.
            let key = PrivateKeyDer::from_pem_slice(&id.key_pem).map_err(|_| {
                ClientError::Identity("the private key is not PEM PKCS#8, SEC1 or PKCS#1".into())
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| ClientError::Identity(e.to_string()))?
        }
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// Host, port and the TLS server name of `target`.
fn dial_parts(target: &ServerTarget) -> Result<(String, u16, ServerName<'static>), ClientError> {
    let bad = |why: &str| ClientError::Address(target.addr.clone(), why.to_owned());
    let url = if target.addr.contains("://") {
        target.addr.clone()
    } else {
        format!("https://{}", target.addr)
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: http_err::InvalidUri| bad(&e.to_string()))?;
    if uri.scheme_str() != Some("https") {
        return Err(bad(
            "the Signet server speaks TLS only: use https://host:port",
        ));
    }
    let host = uri
        .host()
        .ok_or_else(|| bad("no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let name = target.server_name.clone().unwrap_or_else(|| host.clone());
    let server_name = ServerName::try_from(name.clone())
        .map_err(|e| bad(&format!("server name {name:?}: {e}")))?;
    Ok((host, port, server_name))
}

// `Uri`'s parse error type, by the path tonic re-exports it from.
mod http_err {
    pub use tonic::codegen::http::uri::InvalidUri;
}

/// Turns a refused handshake into [`ClientError::WrongServer`] when the reason is the SPIFFE
/// ID check, so callers can say precisely why.
fn classify_connect_error(target: &ServerTarget, e: &tonic::transport::Error) -> ClientError {
    if let Some(w) = find_wrong_identity(e) {
        return ClientError::WrongServer(target.addr.clone(), w.0.clone());
    }
    ClientError::Connect(target.addr.clone(), error_chain(e))
}

fn find_wrong_identity<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a WrongServerIdentity> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(w) = err.downcast_ref::<WrongServerIdentity>() {
            return Some(w);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(w) = find_wrong_identity(inner)
        {
            return Some(w);
        }
        if let Some(rustls::Error::InvalidCertificate(CertificateError::Other(o))) =
            err.downcast_ref::<rustls::Error>()
            && let Some(w) = o.0.downcast_ref::<WrongServerIdentity>()
        {
            return Some(w);
        }
        cur = err.source();
    }
    None
}

/// Connects to the Signet CA `target` over TLS, recognising it by its chain, its host name and
/// its SPIFFE ID (see the module documentation); with `identity`, mutual TLS.
pub async fn connect(
    target: &ServerTarget,
    identity: Option<&ClientIdentity>,
) -> Result<Channel, ClientError> {
    let cfg = Arc::new(client_config(target, identity)?);
    let (host, port, server_name) = dial_parts(target)?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    // tonic adds TLS itself only for an `https` endpoint URI; the connector below does the
    // TLS, so the endpoint is `http` while requests carry the `https` origin.
    let endpoint =
        Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| ClientError::Address(target.addr.clone(), e.to_string()))?
            .connect_timeout(target.connect_timeout)
            .origin(format!("https://{authority}").parse().map_err(
                |e: http_err::InvalidUri| ClientError::Address(target.addr.clone(), e.to_string()),
            )?);
    let connector = tower::service_fn(move |_: Uri| {
        let cfg = cfg.clone();
        let host = host.clone();
        let server_name = server_name.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(server_name, tcp)
                .await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|e| classify_connect_error(target, &e))
}

/// The trust domain of the SPIFFE ID (the first URI SAN) of the first certificate in
/// `chain_pem`, if it has one.
pub fn trust_domain_of_identity(chain_pem: &[u8]) -> Option<TrustDomain> {
    let leaf = CertificateDer::pem_slice_iter(chain_pem).next()?.ok()?;
    let uri = uri_sans(leaf.as_ref()).ok()?.into_iter().next()?;
    uri.parse::<SpiffeId>()
        .ok()
        .map(|id| id.trust_domain().clone())
}

/// The trust domain whose Signet server (`spiffe://<td>/signet/server`) a client expects:
/// `configured`, else the one the roots it trusts for the server name ([`trust_domain_of_bundle`]).
pub fn expected_trust_domain(
    configured: Option<&TrustDomain>,
    roots_pem: &[u8],
) -> Result<TrustDomain, ClientError> {
    match configured {
        Some(td) => Ok(td.clone()),
        None => trust_domain_of_bundle(roots_pem),
    }
}

/// The trust domain of a Signet bundle, read from its roots' SPIFFE IDs (a root Signet
/// generates carries `spiffe://<td>`). Every root that names one must name the same; a bundle
/// whose roots name none (a plugged-in CA) cannot tell, and the caller must be configured.
pub fn trust_domain_of_bundle(bundle_pem: &[u8]) -> Result<TrustDomain, ClientError> {
    let mut found: Option<TrustDomain> = None;
    for c in CertificateDer::pem_slice_iter(bundle_pem) {
        let c = c.map_err(|e| ClientError::Bundle(e.to_string()))?;
        for uri in uri_sans(c.as_ref()).map_err(|e| ClientError::Bundle(unreadable(e)))? {
            let Ok(id) = uri.parse::<SpiffeId>() else {
                continue;
            };
            if !id.path().is_empty() {
                continue;
            }
            match &found {
                None => found = Some(id.trust_domain().clone()),
                Some(td) if td == id.trust_domain() => {}
                Some(td) => {
                    return Err(ClientError::Bundle(format!(
                        "its roots name two trust domains ({td} and {}): configure the \
                         server's trust domain explicitly",
                        id.trust_domain()
                    )));
                }
            }
        }
    }
    found.ok_or_else(|| {
        ClientError::Bundle(
            "no root names a trust domain (spiffe://<td> URI SAN): configure the server's \
             trust domain explicitly"
                .into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    struct Ca {
        issuer: Issuer<'static, KeyPair>,
        pem: String,
    }

    fn new_ca(uri: Option<&str>) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![]).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        if let Some(u) = uri {
            p.subject_alt_names = vec![SanType::URI(u.try_into().unwrap())];
        }
        let cert = p.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(p, key),
        }
    }

    /// A leaf for DNS `localhost` with these URI SANs: (chain DER, key DER).
    fn leaf(ca: &Ca, uris: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        for u in uris {
            p.subject_alt_names
                .push(SanType::URI((*u).try_into().unwrap()));
        }
        let cert = p.signed_by(&key, &ca.issuer).unwrap();
        (
            cert.der().clone(),
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
    }

    /// A gRPC health server on 127.0.0.1:0 over TLS with this certificate.
    async fn serve(cert: (CertificateDer<'static>, PrivateKeyDer<'static>)) -> String {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.0], cert.1)
            .unwrap();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = tx.send(Ok::<_, std::io::Error>(tls)).await;
                }
            }
        });
        let (_, health) = tonic_health::server::health_reporter();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(rx)),
        );
        format!("https://localhost:{}", addr.port())
    }

    fn td() -> TrustDomain {
        "example.org".parse().unwrap()
    }

    async fn check(addr: &str, bundle: &str) -> Result<(), ClientError> {
        let ch = connect(
            &ServerTarget::new(addr, bundle.as_bytes().to_vec(), td()),
            None,
        )
        .await?;
        HealthClient::new(ch)
            .check(HealthCheckRequest::default())
            .await
            .map_err(|s| ClientError::Connect(addr.into(), s.to_string()))?;
        Ok(())
    }

    #[tokio::test]
    async fn the_signet_server_id_is_accepted_and_any_other_refused() {
        let ca = new_ca(Some("spiffe://example.org"));
        let good = serve(leaf(&ca, &["spiffe://example.org/signet/server"])).await;
        check(&good, &ca.pem).await.unwrap();

        for (uris, says) in [
            (
                &["spiffe://example.org/ns/default/sa/web"][..],
                "carries the SPIFFE ID spiffe://example.org/ns/default/sa/web, not \
                 spiffe://example.org/signet/server",
            ),
            (&[][..], "carries no SPIFFE ID"),
            (
                &[
                    "spiffe://example.org/signet/server",
                    "spiffe://example.org/x",
                ][..],
                "carries 2 URI SANs",
            ),
            (
                &["spiffe://other.org/signet/server"][..],
                "not spiffe://example.org/signet/server",
            ),
        ] {
            let addr = serve(leaf(&ca, uris)).await;
            match check(&addr, &ca.pem).await {
                Err(ClientError::WrongServer(a, why)) => {
                    assert_eq!(a, addr);
                    assert!(why.contains(says), "{uris:?}: {why}");
                }
                other => panic!("{uris:?}: {other:?}"),
            }
        }

        // Not chained to the bundle: refused by the chain check (not a SPIFFE ID message).
        let stranger = new_ca(None);
        let addr = serve(leaf(&stranger, &["spiffe://example.org/signet/server"])).await;
        let err = check(&addr, &ca.pem).await.unwrap_err();
        assert!(matches!(err, ClientError::Connect(..)), "{err:?}");
        assert!(
            err.to_string().contains("invalid peer certificate"),
            "{err}"
        );
        // The host name is still checked.
        let target = ServerTarget::new(good.clone(), ca.pem.clone().into_bytes(), td())
            .with_server_name(Some("signet.example".into()));
        let err = connect(&target, None).await.unwrap_err();
        assert!(err.to_string().contains("not valid for name"), "{err}");
        // Plain http is refused before dialling.
        let err = check("http://localhost:1", &ca.pem).await.unwrap_err();
        assert!(matches!(err, ClientError::Address(..)), "{err:?}");
    }

    #[tokio::test]
    async fn a_server_that_never_answers_the_handshake_is_given_up_on() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts and holds the connection, never sends a byte.
        let _hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let ca = new_ca(Some("spiffe://example.org"));
        let target = ServerTarget::new(
            format!("https://localhost:{port}"),
            ca.pem.clone().into_bytes(),
            td(),
        )
        .with_connect_timeout(std::time::Duration::from_millis(200));
        let err = tokio::time::timeout(std::time::Duration::from_secs(10), connect(&target, None))
            .await
            .expect("connect is bounded by its timeout")
            .unwrap_err();
        assert!(matches!(err, ClientError::Connect(..)), "{err:?}");
    }

    #[tokio::test]
    async fn connect_tls_reads_the_trust_domain_from_the_bundle() {
        let ca = new_ca(Some("spiffe://example.org"));
        let addr = serve(leaf(&ca, &["spiffe://example.org/signet/server"])).await;
        crate::connect_tls(&addr, ca.pem.as_bytes(), None, None)
            .await
            .unwrap();
        // A bundle whose roots name no trust domain cannot tell which ID to expect...
        let plain = new_ca(None);
        let plugged = serve(leaf(&plain, &["spiffe://example.org/signet/server"])).await;
        let err = crate::connect_tls(&plugged, plain.pem.as_bytes(), None, None)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("configure the server's trust domain"),
            "{err}"
        );
        // ...but a client certificate of the trust domain does (its own CA).
        let client_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![]).unwrap();
        p.subject_alt_names = vec![SanType::URI(
            "spiffe://example.org/ns/a/sa/b".try_into().unwrap(),
        )];
        let client = p.signed_by(&client_key, &plain.issuer).unwrap();
        let id = ClientIdentity {
            cert_chain_pem: client.pem().into_bytes(),
            key_pem: client_key.serialize_pem().into_bytes(),
        };
        assert_eq!(trust_domain_of_identity(&id.cert_chain_pem), Some(td()));
        crate::connect_tls(&plugged, plain.pem.as_bytes(), None, Some(&id))
            .await
            .unwrap();
        // And the ID check still holds on that path.
        let wrong = serve(leaf(&plain, &["spiffe://example.org/ns/x/sa/mitm"])).await;
        let err = crate::connect_tls(&wrong, plain.pem.as_bytes(), None, Some(&id))
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::WrongServer(..)), "{err:?}");
    }

    #[test]
    fn trust_domain_of_bundle_needs_one_domain() {
        let a = new_ca(Some("spiffe://example.org"));
        let b = new_ca(Some("spiffe://other.org"));
        let none = new_ca(None);
        assert_eq!(trust_domain_of_bundle(a.pem.as_bytes()).unwrap(), td());
        let both = format!("{}{}", a.pem, none.pem);
        assert_eq!(trust_domain_of_bundle(both.as_bytes()).unwrap(), td());
        let two = format!("{}{}", a.pem, b.pem);
        assert!(trust_domain_of_bundle(two.as_bytes()).is_err());
        assert!(trust_domain_of_bundle(none.pem.as_bytes()).is_err());
        assert!(trust_domain_of_bundle(b"").is_err());
    }

    #[test]
    fn the_expected_trust_domain_is_configured_or_named_by_the_bundle() {
        let signet = new_ca(Some("spiffe://example.org"));
        let plugged = new_ca(None);
        let corp: TrustDomain = "corp.example".parse().unwrap();
        let td = |c: Option<&TrustDomain>, pem: &str| {
            expected_trust_domain(c, pem.as_bytes()).map(|t| t.to_string())
        };
        assert_eq!(td(Some(&corp), &signet.pem).unwrap(), "corp.example");
        assert_eq!(td(Some(&corp), &plugged.pem).unwrap(), "corp.example");
        assert_eq!(td(None, &signet.pem).unwrap(), "example.org");
        let err = td(None, &plugged.pem).unwrap_err();
        assert!(
            err.to_string()
                .contains("configure the server's trust domain"),
            "{err}"
        );
    }

    #[test]
    fn server_id_and_debug() {
        assert_eq!(
            server_id(&td()).to_string(),
            "spiffe://example.org/signet/server"
        );
        let t = ServerTarget::new("h:1", b"PEM".to_vec(), td());
        assert!(!format!("{t:?}").contains("PEM"));
    }
}
