//! A fake Signet CA that really signs: a TLS gRPC server on loopback (like [`crate::rogue`])
//! speaking `CertificateAuthority` and `Node`, with its own root, a server certificate for
//! `localhost` carrying `spiffe://example.org/signet/server`, one registration entry for the
//! calling user (`unix:uid:<uid>`, `spiffe://example.org/app`), and a `WatchBundle` stream the
//! test drives: [`FakeCa::push`] sends a bundle with taints and CRLs, as the real server does
//! once the CA lifecycle fills them. For testing the real agent binary's reaction to taints and
//! revocations before (and independently of) the server that publishes them.
//!
//! It mints real JWT-SVIDs too (`Node/MintWorkloadJwts`, for its one entry, signed with
//! `signet_pki::jwt::JwtSigner`) and publishes its JWT keys in `Bundle.jwt_keys`;
//! [`FakeCa::rotate_jwt_key`] makes a new key the signing one (and can taint the old),
//! [`FakeCa::set_jwt_down`] makes minting answer Unavailable as a server that is down would.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::Stream;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use signet_pki::jwt::{JwtSigner, JwtSvidClaims};
use signet_proto::agent as pb;
use signet_proto::agent::node_server::{Node, NodeServer};
use signet_proto::ca as pb_ca;
use signet_proto::ca::certificate_authority_server::{
    CertificateAuthority, CertificateAuthorityServer,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tonic::{Request, Response, Status};

pub const TRUST_DOMAIN: &str = "example.org";
pub const NODE_ID: &str = "spiffe://example.org/signet/node/n1";
pub const APP_ID: &str = "spiffe://example.org/app";

/// One certificate the fake signed.
#[derive(Clone, Debug)]
pub struct Signed {
    pub spiffe_id: String,
    pub serial: u64,
    pub der: Vec<u8>,
}

struct Inner {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    root_der: Vec<u8>,
    key_id: String,
    serial: Mutex<u64>,
    signed: Mutex<Vec<Signed>>,
    bundle: tokio::sync::watch::Sender<pb_ca::Bundle>,
    uid: u32,
    /// JWT signing keys, the signing one last.
    jwt_keys: Mutex<Vec<Arc<JwtSigner>>>,
    /// JWT-SVIDs minted so far.
    jwt_minted: AtomicUsize,
    /// MintWorkloadJwts answers Unavailable.
    jwt_down: AtomicBool,
}

/// Lifetime of the JWT-SVIDs the fake mints.
pub const JWT_TTL_SECS: i64 = 300;

fn new_jwt_signer() -> Arc<JwtSigner> {
    let key = signet_pki::generate(signet_pki::KeyAlgorithm::EcdsaP256).unwrap();
    Arc::new(JwtSigner::new(&key).unwrap())
}

fn jwt_key_pb(s: &JwtSigner) -> pb_ca::JwtKey {
    pb_ca::JwtKey {
        key_id: s.key_id().to_owned(),
        alg: s.alg().as_str().to_owned(),
        public_key: s.public_key().spki_der().to_vec(),
        not_after: 0,
    }
}

impl Inner {
    fn mint_jwt(&self, req: pb::WorkloadJwtRequest) -> pb::WorkloadJwtResult {
        let fail = |code: tonic::Code, message: &str| pb::WorkloadJwtResult {
            entry_id: req.entry_id.clone(),
            svid: None,
            code: code as i32,
            message: message.to_owned(),
            retry_after_ms: 0,
        };
        if req.entry_id != "e1" {
            return fail(tonic::Code::PermissionDenied, "not an entry of this node");
        }
        if req.audience.is_empty() {
            return fail(tonic::Code::InvalidArgument, "audience required");
        }
        let signer = self.jwt_keys.lock().unwrap().last().unwrap().clone();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let claims = JwtSvidClaims {
            subject: APP_ID.parse().unwrap(),
            audience: req.audience.clone(),
            issued_at: now,
            expires_at: now + JWT_TTL_SECS,
            issuer: None,
        };
        let token = signer.mint(&claims).unwrap();
        self.jwt_minted.fetch_add(1, Ordering::SeqCst);
        pb::WorkloadJwtResult {
            entry_id: req.entry_id,
            svid: Some(pb_ca::JwtSvid {
                token,
                spiffe_id: APP_ID.into(),
                issued_at: now,
                expires_at: now + JWT_TTL_SECS,
                key_id: signer.key_id().to_owned(),
                audience: req.audience,
            }),
            code: 0,
            message: String::new(),
            retry_after_ms: 0,
        }
    }

    fn sign(&self, csr_der: &[u8], spiffe_id: &str) -> Result<pb::Svid, Status> {
        let bad = |e: String| Status::invalid_argument(e);
        let csr_pem = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", csr_der.to_vec()));
        let csr = rcgen::CertificateSigningRequestParams::from_pem(&csr_pem)
            .map_err(|e| bad(e.to_string()))?;
        let serial = {
            let mut n = self.serial.lock().unwrap();
            *n += 1;
            *n
        };
        let now = SystemTime::now();
        let (nb, na) = (
            now - Duration::from_secs(5),
            now + Duration::from_secs(3600),
        );
        let mut p = rcgen::CertificateParams::default();
        p.subject_alt_names = vec![rcgen::SanType::URI(spiffe_id.try_into().unwrap())];
        p.serial_number = Some(rcgen::SerialNumber::from(serial.to_be_bytes().to_vec()));
        p.not_before = nb.into();
        p.not_after = na.into();
        p.use_authority_key_identifier_extension = true;
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::KeyAgreement,
        ];
        p.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|e| bad(e.to_string()))?;
        let der = cert.der().to_vec();
        self.signed.lock().unwrap().push(Signed {
            spiffe_id: spiffe_id.to_owned(),
            serial,
            der: der.clone(),
        });
        let unix = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0)
        };
        Ok(pb::Svid {
            spiffe_id: spiffe_id.to_owned(),
            cert_chain: vec![der, self.root_der.clone()],
            serial: format!("{serial:x}"),
            not_before: unix(nb),
            not_after: unix(na),
        })
    }
}

/// A running fake CA.
pub struct FakeCa {
    pub addr: SocketAddr,
    /// Its root, DER (also the only root of its bundle).
    pub root_der: Vec<u8>,
    /// Its root's key ID (lowercase hex subject key identifier).
    pub key_id: String,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeCa {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Svc(Arc<Inner>);

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
        _: Request<pb_ca::SignCsrRequest>,
    ) -> Result<Response<pb_ca::SignCsrResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_bundle(
        &self,
        _: Request<pb_ca::GetBundleRequest>,
    ) -> Result<Response<pb_ca::Bundle>, Status> {
        Ok(Response::new(self.0.bundle.borrow().clone()))
    }
    type WatchBundleStream = BundleStream;
    async fn watch_bundle(
        &self,
        _: Request<pb_ca::WatchBundleRequest>,
    ) -> Result<Response<BundleStream>, Status> {
        let rx = self.0.bundle.subscribe();
        let s = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first {
                rx.changed().await.ok()?;
            }
            let b = rx.borrow_and_update().clone();
            Some((Ok(b), (rx, false)))
        });
        Ok(Response::new(Box::pin(s)))
    }
}

#[tonic::async_trait]
impl Node for Svc {
    async fn mint_workload_jwts(
        &self,
        request: Request<signet_proto::agent::MintWorkloadJwtsRequest>,
    ) -> Result<Response<signet_proto::agent::MintWorkloadJwtsResponse>, Status> {
        if self.0.jwt_down.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the fake CA is down"));
        }
        if request.peer_certs().is_none_or(|c| c.is_empty()) {
            return Err(Status::unauthenticated("mTLS required"));
        }
        let results = request
            .into_inner()
            .requests
            .into_iter()
            .map(|r| self.0.mint_jwt(r))
            .collect();
        Ok(Response::new(pb::MintWorkloadJwtsResponse { results }))
    }

    async fn attest(
        &self,
        req: Request<pb::AttestRequest>,
    ) -> Result<Response<pb::AttestResponse>, Status> {
        let req = req.into_inner();
        if req.join_token.is_empty() {
            return Err(Status::unauthenticated("join token required"));
        }
        Ok(Response::new(pb::AttestResponse {
            node_id: "n1".into(),
            svid: Some(self.0.sign(&req.csr, NODE_ID)?),
            bundle: vec![self.0.root_der.clone()],
        }))
    }
    async fn renew_node(
        &self,
        req: Request<pb::RenewNodeRequest>,
    ) -> Result<Response<pb::Svid>, Status> {
        if req.peer_certs().is_none_or(|c| c.is_empty()) {
            return Err(Status::unauthenticated("mTLS required"));
        }
        Ok(Response::new(self.0.sign(&req.into_inner().csr, NODE_ID)?))
    }
    type WatchEntriesStream =
        Pin<Box<dyn Stream<Item = Result<pb::EntriesChanged, Status>> + Send>>;
    async fn watch_entries(
        &self,
        _: Request<pb::WatchEntriesRequest>,
    ) -> Result<Response<Self::WatchEntriesStream>, Status> {
        // As a server without the push stream: the agent keeps polling.
        Err(Status::unimplemented("no entry stream here"))
    }
    async fn sync_entries(
        &self,
        req: Request<pb::SyncEntriesRequest>,
    ) -> Result<Response<pb::SyncEntriesResponse>, Status> {
        if req.get_ref().known_revision == 1 {
            return Ok(Response::new(pb::SyncEntriesResponse {
                revision: 1,
                unchanged: true,
                entries: vec![],
                federated_bundles: vec![],
            }));
        }
        Ok(Response::new(pb::SyncEntriesResponse {
            revision: 1,
            unchanged: false,
            entries: vec![pb::Entry {
                id: "e1".into(),
                spiffe_id: APP_ID.into(),
                parent_id: NODE_ID.into(),
                selectors: vec![format!("unix:uid:{}", self.0.uid)],
                ttl_seconds: 3600,
                dns_names: vec![],
                revision: 1,
                jwt_ttl_seconds: 0,
                federates_with: vec![],
            }],
            federated_bundles: vec![],
        }))
    }
    async fn sign_workloads(
        &self,
        req: Request<pb::SignWorkloadsRequest>,
    ) -> Result<Response<pb::SignWorkloadsResponse>, Status> {
        let results = req
            .into_inner()
            .csrs
            .into_iter()
            .map(|c| match self.0.sign(&c.csr, APP_ID) {
                Ok(svid) => pb::WorkloadResult {
                    entry_id: c.entry_id,
                    svid: Some(svid),
                    code: 0,
                    message: String::new(),
                    retry_after_ms: 0,
                },
                Err(s) => pb::WorkloadResult {
                    entry_id: c.entry_id,
                    svid: None,
                    code: s.code() as i32,
                    message: s.message().to_owned(),
                    retry_after_ms: 0,
                },
            })
            .collect();
        Ok(Response::new(pb::SignWorkloadsResponse { results }))
    }
}

fn ski_hex(der: &[u8]) -> String {
    signet_pki::ParsedCert::from_der(der)
        .unwrap()
        .subject_key_id()
        .expect("the root has a subject key identifier")
        .to_owned()
}

impl FakeCa {
    /// Serves on 127.0.0.1:0; its one entry selects the user `uid`.
    pub async fn start(uid: u32) -> Self {
        let root_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut rp = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        rp.distinguished_name
            .push(rcgen::DnType::CommonName, "fake signet CA");
        rp.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        rp.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        rp.subject_alt_names = vec![rcgen::SanType::URI(
            format!("spiffe://{TRUST_DOMAIN}")
                .as_str()
                .try_into()
                .unwrap(),
        )];
        let root = rp.self_signed(&root_key).unwrap();
        let root_der = root.der().to_vec();
        let key_id = ski_hex(&root_der);
        let issuer = rcgen::Issuer::new(rp, root_key);

        let server_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut sp = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        sp.subject_alt_names
            .push(rcgen::SanType::IpAddress(std::net::IpAddr::from([
                127, 0, 0, 1,
            ])));
        sp.subject_alt_names.push(rcgen::SanType::URI(
            format!("spiffe://{TRUST_DOMAIN}/signet/server")
                .as_str()
                .try_into()
                .unwrap(),
        ));
        sp.use_authority_key_identifier_extension = true;
        let server_cert = sp.signed_by(&server_key, &issuer).unwrap();

        let jwt = new_jwt_signer();
        let (bundle, _) = tokio::sync::watch::channel(pb_ca::Bundle {
            trust_domain: TRUST_DOMAIN.into(),
            roots: vec![root_der.clone()],
            revision: 1,
            jwt_keys: vec![jwt_key_pb(&jwt)],
            ..Default::default()
        });
        let inner = Arc::new(Inner {
            issuer,
            root_der: root_der.clone(),
            key_id: key_id.clone(),
            serial: Mutex::new(0),
            signed: Mutex::new(Vec::new()),
            bundle,
            uid,
            jwt_keys: Mutex::new(vec![jwt]),
            jwt_minted: AtomicUsize::new(0),
            jwt_down: AtomicBool::new(false),
        });

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(Arc::new(crate::rogue::AnyClientCert::new(provider)))
            .with_single_cert(
                vec![
                    CertificateDer::from(server_cert.der().to_vec()),
                    CertificateDer::from(root_der.clone()),
                ],
                PrivateKeyDer::try_from(server_key.serialize_der()).unwrap(),
            )
            .unwrap();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        let _ = tx.send(Ok::<_, std::io::Error>(tls)).await;
                    }
                });
            }
        });
        let incoming =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        let svc = Svc(inner.clone());
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
        Self {
            addr,
            root_der,
            key_id,
            inner,
            task,
        }
    }

    /// Its root as PEM, for the agent's `trust_bundle_file`.
    pub fn root_pem(&self) -> String {
        pem::encode(&pem::Pem::new("CERTIFICATE", self.root_der.clone()))
    }

    /// Every certificate signed so far, in order.
    pub fn signed(&self) -> Vec<Signed> {
        self.inner.signed.lock().unwrap().clone()
    }

    /// Sends a new bundle (revision + 1) on every `WatchBundle` stream.
    pub fn push(&self, tainted_key_ids: Vec<String>, crls: Vec<pb_ca::Crl>) {
        self.inner.bundle.send_modify(|b| {
            b.revision += 1;
            b.tainted_key_ids = tainted_key_ids;
            b.crls = crls;
        });
    }

    /// The key ID of the JWT key that signs now.
    pub fn jwt_key_id(&self) -> String {
        self.inner
            .jwt_keys
            .lock()
            .unwrap()
            .last()
            .unwrap()
            .key_id()
            .to_owned()
    }

    /// JWT-SVIDs minted so far.
    pub fn jwt_minted(&self) -> usize {
        self.inner.jwt_minted.load(Ordering::SeqCst)
    }

    /// Makes `MintWorkloadJwts` answer Unavailable (`true`) or mint again.
    pub fn set_jwt_down(&self, down: bool) {
        self.inner.jwt_down.store(down, Ordering::SeqCst);
    }

    /// A new JWT key signs from now on; both are published (revision + 1), and with `taint`
    /// the old one's ID goes into `tainted_key_ids`. Returns the new key's ID.
    pub fn rotate_jwt_key(&self, taint: bool) -> String {
        let new = new_jwt_signer();
        let kid = new.key_id().to_owned();
        let (old, keys) = {
            let mut k = self.inner.jwt_keys.lock().unwrap();
            let old = k.last().unwrap().key_id().to_owned();
            k.push(new);
            (old, k.iter().map(|s| jwt_key_pb(s)).collect::<Vec<_>>())
        };
        self.inner.bundle.send_modify(|b| {
            b.revision += 1;
            b.jwt_keys = keys;
            if taint {
                b.tainted_key_ids.push(old);
            }
        });
        kid
    }

    /// A token for `APP_ID` and `audience` signed by a key the bundle does not hold.
    pub fn foreign_jwt(audience: &str) -> String {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        new_jwt_signer()
            .mint(&JwtSvidClaims {
                subject: APP_ID.parse().unwrap(),
                audience: vec![audience.to_owned()],
                issued_at: now,
                expires_at: now + JWT_TTL_SECS,
                issuer: None,
            })
            .unwrap()
    }

    /// A CRL of the root numbered `number` listing `serials`, as the server publishes it.
    pub fn crl(&self, number: u64, serials: &[u64]) -> pb_ca::Crl {
        let now = SystemTime::now();
        let next = now + Duration::from_secs(3600);
        let der = rcgen::CertificateRevocationListParams {
            this_update: now.into(),
            next_update: next.into(),
            crl_number: rcgen::SerialNumber::from(number.to_be_bytes().to_vec()),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from(s.to_be_bytes().to_vec()),
                    revocation_time: now.into(),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.inner.issuer)
        .unwrap()
        .der()
        .to_vec();
        let unix = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0)
        };
        pb_ca::Crl {
            key_id: self.inner.key_id.clone(),
            der,
            number,
            this_update: unix(now),
            next_update: unix(next),
        }
    }
}
