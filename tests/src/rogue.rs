//! A rogue Signet CA for the attack suite: a real TLS server on loopback speaking Signet's
//! `CertificateAuthority` and `Node` gRPC services, which records everything a client gives
//! it (TCP connections, completed TLS handshakes, each call with its bearer token and join
//! token) and answers like a server that wants to be believed: `GetBundle`/`WatchBundle` push
//! its own roots, `Attest` takes the join token.
//!
//! The attacks point clients at it; a client that refuses the attack leaves `calls()` empty.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::Stream;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use signet_proto::agent as pb;
use signet_proto::agent::node_server::{Node, NodeServer};
use signet_proto::ca as pb_ca;
use signet_proto::ca::certificate_authority_server::{
    CertificateAuthority, CertificateAuthorityServer,
};
use tonic::{Request, Response, Status};

/// One call the rogue received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RogueCall {
    /// The RPC name (`Attest`, `GetBundle`, …).
    pub rpc: &'static str,
    /// The `authorization` header, if any.
    pub authorization: Option<String>,
    /// `AttestRequest.join_token`, if any.
    pub join_token: Option<String>,
    /// Whether the client presented a certificate (mTLS).
    pub client_cert: bool,
}

#[derive(Default)]
pub struct RogueLog {
    tcp_accepts: AtomicUsize,
    tls_handshakes: AtomicUsize,
    tls_failures: AtomicUsize,
    calls: Mutex<Vec<RogueCall>>,
}

impl RogueLog {
    /// TCP connections accepted (a client that dials and then refuses the certificate counts).
    pub fn tcp_accepts(&self) -> usize {
        self.tcp_accepts.load(Ordering::SeqCst)
    }
    /// TLS handshakes the client completed (it accepted the certificate).
    pub fn tls_handshakes(&self) -> usize {
        self.tls_handshakes.load(Ordering::SeqCst)
    }
    /// TLS handshakes that failed (the client refused the certificate).
    pub fn tls_failures(&self) -> usize {
        self.tls_failures.load(Ordering::SeqCst)
    }
    /// Every call received.
    pub fn calls(&self) -> Vec<RogueCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn record<T>(&self, rpc: &'static str, req: &Request<T>, join_token: Option<String>) {
        let authorization = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let client_cert = req.peer_certs().is_some_and(|c| !c.is_empty());
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(RogueCall {
                rpc,
                authorization,
                join_token,
                client_cert,
            });
    }
}

/// A running rogue CA.
pub struct Rogue {
    pub addr: SocketAddr,
    pub log: Arc<RogueLog>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Rogue {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Svc {
    log: Arc<RogueLog>,
    bundle: pb_ca::Bundle,
}

type BundleStream = Pin<Box<dyn Stream<Item = Result<pb_ca::Bundle, Status>> + Send>>;

#[tonic::async_trait]
impl CertificateAuthority for Svc {
    async fn mint_jwt_svid(
        &self,
        _request: Request<signet_proto::ca::MintJwtSvidRequest>,
    ) -> Result<Response<signet_proto::ca::JwtSvid>, Status> {
        Err(Status::unimplemented("MintJwtSvid: not served yet"))
    }

    async fn sign_csr(
        &self,
        req: Request<pb_ca::SignCsrRequest>,
    ) -> Result<Response<pb_ca::SignCsrResponse>, Status> {
        self.log.record("SignCsr", &req, None);
        Err(Status::unavailable("rogue"))
    }
    async fn get_bundle(
        &self,
        req: Request<pb_ca::GetBundleRequest>,
    ) -> Result<Response<pb_ca::Bundle>, Status> {
        self.log.record("GetBundle", &req, None);
        Ok(Response::new(self.bundle.clone()))
    }
    type WatchBundleStream = BundleStream;
    async fn watch_bundle(
        &self,
        req: Request<pb_ca::WatchBundleRequest>,
    ) -> Result<Response<BundleStream>, Status> {
        use futures::StreamExt;
        self.log.record("WatchBundle", &req, None);
        let first = futures::stream::iter([Ok(self.bundle.clone())]);
        Ok(Response::new(Box::pin(
            first.chain(futures::stream::pending()),
        )))
    }
}

#[tonic::async_trait]
impl Node for Svc {
    async fn mint_workload_jwts(
        &self,
        _request: Request<signet_proto::agent::MintWorkloadJwtsRequest>,
    ) -> Result<Response<signet_proto::agent::MintWorkloadJwtsResponse>, Status> {
        Err(Status::unimplemented("MintWorkloadJwts: not served yet"))
    }

    async fn attest(
        &self,
        req: Request<pb::AttestRequest>,
    ) -> Result<Response<pb::AttestResponse>, Status> {
        let token = Some(req.get_ref().join_token.clone()).filter(|t| !t.is_empty());
        self.log.record("Attest", &req, token);
        Err(Status::unavailable("rogue"))
    }
    async fn renew_node(
        &self,
        req: Request<pb::RenewNodeRequest>,
    ) -> Result<Response<pb::Svid>, Status> {
        self.log.record("RenewNode", &req, None);
        Err(Status::unavailable("rogue"))
    }
    type WatchEntriesStream =
        Pin<Box<dyn Stream<Item = Result<pb::EntriesChanged, Status>> + Send>>;
    async fn watch_entries(
        &self,
        req: Request<pb::WatchEntriesRequest>,
    ) -> Result<Response<Self::WatchEntriesStream>, Status> {
        self.log.record("WatchEntries", &req, None);
        // As a server without the push stream: the agent keeps polling.
        Err(Status::unimplemented("no entry stream here"))
    }
    async fn sync_entries(
        &self,
        req: Request<pb::SyncEntriesRequest>,
    ) -> Result<Response<pb::SyncEntriesResponse>, Status> {
        self.log.record("SyncEntries", &req, None);
        Ok(Response::new(pb::SyncEntriesResponse {
            revision: 1,
            unchanged: false,
            entries: vec![],
            federated_bundles: vec![],
        }))
    }
    async fn sign_workloads(
        &self,
        req: Request<pb::SignWorkloadsRequest>,
    ) -> Result<Response<pb::SignWorkloadsResponse>, Status> {
        self.log.record("SignWorkloads", &req, None);
        Err(Status::unavailable("rogue"))
    }
}

/// Accepts any client certificate (so an mTLS client gets as far as it would with the real
/// server) without trusting it for anything. Also the fake CA's ([`crate::fake_ca`]).
///
/// Test code only, and built its own way: the handshake signatures are checked by rustls' own
/// client verifier (over a throwaway root, so it is never asked to trust a chain), not by a copy
/// of the agent's kubelet verifier (`agent/src/attest/k8s.rs`, which production keeps private).
#[derive(Debug)]
pub(crate) struct AnyClientCert(Arc<dyn rustls::server::danger::ClientCertVerifier>);

impl AnyClientCert {
    pub(crate) fn new(provider: Arc<rustls::crypto::CryptoProvider>) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(p.self_signed(&key).unwrap().into()).unwrap();
        let signatures =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        Self(signatures)
    }
}

impl rustls::server::danger::ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

impl Rogue {
    /// Serves on 127.0.0.1:0 with `chain_der` (leaf first) and its PKCS#8 `key_der`; its
    /// bundle for `trust_domain` is `roots_der`.
    pub async fn start(
        chain_der: Vec<Vec<u8>>,
        key_der: Vec<u8>,
        trust_domain: &str,
        roots_der: Vec<Vec<u8>>,
    ) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(Arc::new(AnyClientCert::new(provider)))
            .with_single_cert(
                chain_der.into_iter().map(CertificateDer::from).collect(),
                PrivateKeyDer::try_from(key_der).unwrap(),
            )
            .unwrap();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(RogueLog::default());
        let svc = Svc {
            log: log.clone(),
            bundle: pb_ca::Bundle {
                trust_domain: trust_domain.to_owned(),
                roots: roots_der,
                revision: 99,
                ..Default::default()
            },
        };
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let accept_log = log.clone();
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                accept_log.tcp_accepts.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                let log = accept_log.clone();
                tokio::spawn(async move {
                    match acceptor.accept(tcp).await {
                        Ok(tls) => {
                            log.tls_handshakes.fetch_add(1, Ordering::SeqCst);
                            let _ = tx.send(Ok::<_, std::io::Error>(tls)).await;
                        }
                        Err(_) => {
                            log.tls_failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        let incoming =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        let serve = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(CertificateAuthorityServer::new(svc.clone()))
                .add_service(NodeServer::new(svc))
                .serve_with_incoming(incoming)
                .await;
        });
        let task = tokio::spawn(async move {
            let _ = tokio::join!(accept, serve);
        });
        Self { addr, log, task }
    }
}

/// A certificate and key an attacker holds: `chain_der` leaf first, `key_der` PKCS#8, and
/// `extra_root_pem`: a root the victim must trust for the attack to be a fair test (empty
/// when the chain already leads to the Signet bundle).
pub struct StolenIdentity {
    pub chain_der: Vec<Vec<u8>>,
    pub key_der: Vec<u8>,
    pub extra_root_pem: String,
}

/// A certificate for DNS `localhost` (and IP 127.0.0.1 where it can) carrying `spiffe_id`,
/// valid in the eyes of a client that trusts the Signet bundle: minted by the real `server`
/// through its admin API when the server still grants DNS names there; otherwise (once the
/// server refuses to hand out its own names) from a test CA that the victim is then told to
/// trust as well (`extra_root_pem`), which is the same position for the client's verifier.
pub async fn identity_with_server_name(server: &crate::Server, spiffe_id: &str) -> StolenIdentity {
    let kc = signet_client::new_key_and_csr().unwrap();
    let minted = server
        .admin()
        .await
        .mint_x509_svid(signet_proto::admin::MintX509SvidRequest {
            spiffe_id: spiffe_id.to_owned(),
            csr: kc.csr_der.clone(),
            ttl_seconds: 3600,
            dns_names: vec!["localhost".to_owned()],
        })
        .await;
    if let Ok(m) = minted {
        let m = m.into_inner();
        return StolenIdentity {
            chain_der: m.cert_chain,
            key_der: kc.key_pkcs8_der,
            extra_root_pem: String::new(),
        };
    }
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(vec![]).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "attack-suite test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    p.subject_alt_names
        .push(rcgen::SanType::IpAddress(std::net::IpAddr::from([
            127, 0, 0, 1,
        ])));
    p.subject_alt_names
        .push(rcgen::SanType::URI(spiffe_id.try_into().unwrap()));
    let leaf = p.signed_by(&key, &issuer).unwrap();
    StolenIdentity {
        chain_der: vec![leaf.der().to_vec(), ca_cert.der().to_vec()],
        key_der: key.serialize_der(),
        extra_root_pem: ca_cert.pem(),
    }
}
