//! TLS for the gRPC listener: rustls with the ring provider, a server certificate that
//! Signet issued itself (swapped in place on renewal), and optional client certificates
//! verified against Signet's own bundle (mTLS renewal).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

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

/// The server's rustls config: our certificate, h2 only, client certificates optional and,
/// when sent, verified against `roots`.
pub fn server_config(
    resolver: Arc<ServerCertResolver>,
    roots: &[Vec<u8>],
) -> Result<rustls::ServerConfig, String> {
    let mut store = RootCertStore::empty();
    for r in roots {
        store
            .add(CertificateDer::from(r.clone()))
            .map_err(|e| format!("trust bundle root refused by rustls: {e}"))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| format!("client verifier: {e}"))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// Accepts TCP connections and completes TLS handshakes off the accept loop, handing
/// finished streams to tonic. A slow or failed handshake never blocks others.
pub fn accept_loop(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    handshake_timeout: Duration,
) -> mpsc::Receiver<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(256);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
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
            let _ = tcp.set_nodelay(true);
            if tx.is_closed() {
                break;
            }
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}
