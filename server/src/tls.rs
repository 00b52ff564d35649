//! TLS for the gRPC listener: rustls with the ring provider, a server certificate that
//! Signet issued itself (swapped in place on renewal), and optional client certificates
//! verified against Signet's own bundle (mTLS renewal).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::DigitallySignedStruct;
use rustls::DistinguishedName;
use rustls::RootCertStore;
use rustls::SignatureScheme;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::UnixTime;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::limits::conn::{ConnRegistry, LimitedIo};
use crate::limits::source::PerSource;
use crate::metrics::Metrics;

/// The crypto provider used everywhere in Signet: ring (no aws-lc-rs, no C build).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Serves whichever certificate was stored last; renewal swaps it without a restart.
#[derive(Debug)]
pub struct ServerCertResolver {
    current: ArcSwap<CertifiedKey>,
}

impl ServerCertResolver {
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(key),
        })
    }

    pub fn replace(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }

    /// The validity (notBefore, notAfter) of the leaf certificate served now.
    pub fn leaf_validity(&self) -> Option<(std::time::SystemTime, std::time::SystemTime)> {
        let key = self.current.load();
        let leaf = signet_pki::cert::ParsedCert::from_der(key.cert.first()?.as_ref()).ok()?;
        Some((leaf.not_before(), leaf.not_after()))
    }

    /// The SHA-256 of the leaf certificate served now.
    pub fn leaf_sha256(&self) -> Option<[u8; 32]> {
        self.current
            .load()
            .cert
            .first()
            .map(|c| signet_types::ledger::sha256(c.as_ref()))
    }
}

impl ResolvesServerCert for ServerCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A certificate chain (DER, leaf first) and its PKCS#8 key as a rustls `CertifiedKey`.
pub fn certified_key(chain: &[Vec<u8>], key_pkcs8: &[u8]) -> Result<CertifiedKey, rustls::Error> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_pkcs8.to_vec()));
    let signer = provider().key_provider.load_private_key(key)?;
    let certs = chain
        .iter()
        .map(|c| CertificateDer::from(c.clone()))
        .collect();
    Ok(CertifiedKey::new(certs, signer))
}

/// The certificates that authenticate mTLS clients, replaceable while the listener runs (CA
/// rotation adds a new intermediate and removes old ones). Handshakes use the set current when
/// they start. It sends no CA names in the CertificateRequest (they change with rotation);
/// clients send the one certificate they have.
pub struct ClientAnchors {
    current: ArcSwap<Arc<dyn ClientCertVerifier>>,
    /// The anchors themselves: a client certificate must be signed directly by one of them
    /// (a root is an anchor too, and webpki would otherwise accept a chain through any
    /// intermediate it signed, a removed one included).
    issuers: ArcSwap<Vec<Vec<u8>>>,
}

impl std::fmt::Debug for ClientAnchors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAnchors").finish_non_exhaustive()
    }
}

/// Why rustls refused the TLS setup: its error, with what it refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("client CA certificate refused by rustls: {0}")]
    ClientCa(#[source] rustls::Error),
    #[error("client verifier: {0}")]
    ClientVerifier(#[source] rustls::server::VerifierBuilderError),
    #[error("TLS versions: {0}")]
    Versions(#[source] rustls::Error),
}

fn client_verifier(anchors: &[Vec<u8>]) -> Result<Arc<dyn ClientCertVerifier>, TlsSetupError> {
    let mut store = RootCertStore::empty();
    for r in anchors {
        store
            .add(CertificateDer::from(r.clone()))
            .map_err(TlsSetupError::ClientCa)?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
        .allow_unauthenticated()
        .build()
        .map_err(TlsSetupError::ClientVerifier)
}

impl ClientAnchors {
    pub fn new(anchors: &[Vec<u8>]) -> Result<Arc<Self>, TlsSetupError> {
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(client_verifier(anchors)?),
            issuers: ArcSwap::from_pointee(anchors.to_vec()),
        }))
    }

    /// Replaces the anchors for the handshakes that start from now on.
    pub fn replace(&self, anchors: &[Vec<u8>]) -> Result<(), TlsSetupError> {
        self.current.store(Arc::new(client_verifier(anchors)?));
        self.issuers.store(Arc::new(anchors.to_vec()));
        Ok(())
    }

    /// Whether `leaf` is signed directly by one of the anchors.
    fn issued_by_an_anchor(&self, leaf: &[u8]) -> bool {
        self.issuers
            .load()
            .iter()
            .any(|a| crate::ca::authority::verify_issued_by(leaf, a).is_ok())
    }
}

impl ClientCertVerifier for ClientAnchors {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .current
            .load()
            .verify_client_cert(end_entity, intermediates, now)?;
        if !self.issued_by_an_anchor(end_entity.as_ref()) {
            // A chain through an intermediate that is no longer trusted (removed).
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current.load().supported_verify_schemes()
    }
}

/// The server's rustls config: our certificate, h2 only, client certificates optional and,
/// when sent, verified against `anchors` (which the caller can replace).
pub fn server_config_with(
    resolver: Arc<ServerCertResolver>,
    anchors: Arc<ClientAnchors>,
) -> Result<rustls::ServerConfig, TlsSetupError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsSetupError::Versions)?
        .with_client_cert_verifier(anchors)
        .with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The connection limits of the gRPC listener.
#[derive(Debug, Clone)]
pub struct AcceptLimits {
    /// Connections open at once, handshakes included.
    pub max_connections: usize,
    /// Of those, from one source address (IPv6: one /64).
    pub max_connections_per_source: usize,
    pub handshake_timeout: Duration,
    /// A connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
}

/// A connection handed to tonic: TLS over TCP, holding a slot of the connection cap.
pub type Conn = LimitedIo<TlsStream<TcpStream>>;

/// Accepts TCP connections and completes TLS handshakes off the accept loop, handing
/// finished streams to tonic. A slow or failed handshake never blocks others and is dropped
/// after `handshake_timeout`. At most `max_connections` are open at once: a connection beyond
/// that is closed as soon as it is accepted (never queued), so the listener's memory and file
/// descriptors stay bounded and the client sees the refusal at once.
pub fn accept_loop(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    limits: AcceptLimits,
    registry: Arc<ConnRegistry>,
    metrics: Arc<Metrics>,
) -> mpsc::Receiver<Result<Conn, std::io::Error>> {
    let (tx, rx) = mpsc::channel(256);
    let acceptor = TlsAcceptor::from(config);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_source = PerSource::new(limits.max_connections_per_source);
    tokio::spawn(async move {
        let mut refused: u64 = 0;
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and similar: back off briefly, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                break;
            }
            let taken = per_source
                .try_take(peer.ip())
                .ok_or("limits.max_connections_per_source")
                .and_then(|s| {
                    let p = slots.clone().try_acquire_owned();
                    p.map(|p| (s, p)).map_err(|_| "limits.max_connections")
                });
            let (source_slot, permit) = match taken {
                Ok(t) => t,
                Err(limit) => {
                    refused += 1;
                    metrics.limited("connections");
                    // Throttled: a flood of refused connections should not also flood the log.
                    if refused.is_power_of_two() || refused.is_multiple_of(1024) {
                        tracing::warn!(%peer, limit, refused_total = refused,
                            "connection refused: limit reached");
                    }
                    drop(tcp);
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let registry = registry.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let conn = LimitedIo::new(
                            stream,
                            Some(peer),
                            registry,
                            limits.idle_timeout,
                            (permit, source_slot),
                        );
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}
