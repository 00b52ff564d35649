//! Talks to a Signet server on behalf of one issuer, through the typed
//! [`signet_client::ca::CaClient`]: TLS verified against the issuer's trust bundle and the
//! server's SPIFFE ID, authenticated by a bearer token re-read from its file at each call
//! (kubelet rotates projected tokens) or by an mTLS SVID. Every call carries the W3C trace
//! context of the reconcile span it is made in. What the server answers is checked by
//! `signet_client` (a signed certificate is an X509-SVID for the SPIFFE ID the answer names, a
//! bundle has valid roots); a [`Signed`] is that [`SvidCertificate`] and the CA PEM. Errors are
//! classified for the reconcilers ([`classify`]): [`SignError::Permanent`] (a retry cannot fix
//! it: Failed) or [`SignError::Retryable`] (Pending, back off and try again).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use signet_client::ca::{CaClient, CsrRequest, TrustBundle};
use signet_client::{CallError, ClientError, ClientIdentity, ServerTarget};
use signet_pki::SvidCertificate;

/// How long one gRPC call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The reason of a connection refused because the server is not `spiffe://<td>/signet/server`.
pub const REASON_WRONG_SERVER: &str = "WrongServerIdentity";

/// How the bridge proves who it is to the server.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// A projected service-account token file, read at every call, sent as `Bearer`.
    TokenFile(PathBuf),
    /// An mTLS client certificate (an SVID) and its key. `Debug` hides the key.
    Identity(ClientIdentity),
}

/// Everything needed to reach one server: where it is, its roots and SPIFFE ID (the
/// target), and the credentials. Built by `issuers::resolve` (from the operator's config or a
/// ClusterIssuer) or from the operator's flags (Citadel mode).
#[derive(Clone, Debug)]
pub struct SignerConfig {
    pub target: ServerTarget,
    pub credentials: Credentials,
}

impl SignerConfig {
    /// The server's address, for messages.
    pub fn server(&self) -> &str {
        &self.target.addr
    }

    /// A digest of the whole config: a cached channel is reused only while this is unchanged.
    fn fingerprint(&self) -> Vec<u8> {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let t = &self.target;
        for part in [
            t.addr.as_bytes(),
            t.server_name.as_deref().unwrap_or("").as_bytes(),
            &t.bundle_pem,
            t.trust_domain.as_str().as_bytes(),
        ] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part);
        }
        match &self.credentials {
            Credentials::TokenFile(p) => {
                ctx.update(b"token");
                ctx.update(p.as_os_str().as_encoded_bytes());
            }
            Credentials::Identity(id) => {
                ctx.update(b"mtls");
                ctx.update(&(id.cert_chain_pem.len() as u64).to_be_bytes());
                ctx.update(&id.cert_chain_pem);
                ctx.update(&id.key_pem);
            }
        }
        ctx.finish().as_ref().to_vec()
    }
}

/// What a signing error means for the object that asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    /// A retry will not help: fix the request or the policy. `reason` is a CamelCase word for
    /// a condition, `message` the server's explanation.
    #[error("{reason}: {message}")]
    Permanent { reason: String, message: String },
    /// The server or the network may recover: back off and retry.
    #[error("{reason}: {message}")]
    Retryable { reason: String, message: String },
}

impl SignError {
    pub fn permanent(reason: &str, message: impl Into<String>) -> Self {
        Self::Permanent {
            reason: reason.into(),
            message: message.into(),
        }
    }
    pub fn retryable(reason: &str, message: impl Into<String>) -> Self {
        Self::Retryable {
            reason: reason.into(),
            message: message.into(),
        }
    }
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Permanent { .. })
    }
    pub fn reason(&self) -> &str {
        match self {
            Self::Permanent { reason, .. } | Self::Retryable { reason, .. } => reason,
        }
    }
    pub fn message(&self) -> &str {
        match self {
            Self::Permanent { message, .. } | Self::Retryable { message, .. } => message,
        }
    }
}

/// The one place a failed call becomes a [`SignError`]. A status keeps its code as the
/// reason and the server's message (the code's description when it sent none); a malformed
/// answer is retryable `Internal` ("the server's answer: ..."). A request that could not be
/// built (a token a header cannot carry) is mapped by the caller, which knows the token file.
pub fn classify(e: &CallError) -> SignError {
    let message = match e {
        CallError::InvalidAnswer(why) => format!("the server's answer: {why}"),
        _ if e.message().is_empty() => e.code().description().to_owned(),
        _ => e.message().to_owned(),
    };
    let reason = format!("{:?}", e.code());
    // One classification for every client (signet_client::ErrorClass): an Unauthenticated
    // answer is retried, since the projected token may be renewed and the server's JWKS
    // refreshed.
    match e.class() {
        signet_client::ErrorClass::Permanent | signet_client::ErrorClass::Invalid => {
            SignError::Permanent { reason, message }
        }
        signet_client::ErrorClass::Retryable => SignError::Retryable { reason, message },
    }
}

/// A certificate signed by the server: the X509-SVID it issued (checked by `signet_client`:
/// it is one, for the SPIFFE ID the server's answer names) and the root that signs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signed {
    /// The leaf, then intermediates (no root).
    pub certificate: SvidCertificate,
    /// PEM: the root that signs the chain.
    pub ca_pem: String,
}

impl Signed {
    /// PEM (LF): the leaf, then intermediates, as written to Secrets and status.
    pub fn chain_pem(&self) -> String {
        self.certificate.chain_pem()
    }
}

/// The server's trust bundle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BundleInfo {
    pub trust_domain: String,
    /// PEM roots.
    pub roots_pem: String,
    pub revision: u64,
    /// Its tainted CA keys and CRLs.
    pub revocations: crate::revocation::Revocations,
}

impl From<TrustBundle> for BundleInfo {
    fn from(b: TrustBundle) -> Self {
        Self {
            revocations: crate::revocation::Revocations::of_bundle(&b),
            trust_domain: b.trust_domain.to_string(),
            roots_pem: b.roots_pem(),
            revision: b.revision,
        }
    }
}

/// A connected client for one issuer.
#[derive(Clone)]
pub struct Signer {
    client: CaClient,
    credentials: Credentials,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// PEM with `\n` line endings, as Kubernetes users expect in Secrets and status.
fn pem_of(der: &[u8]) -> String {
    signet_types::pem::cert_to_pem(der)
}

impl Signer {
    /// Connects (TLS handshake included, the server recognised by its SPIFFE ID). Failure is
    /// [`SignError::Retryable`]: `WrongServerIdentity` when a server answered with another
    /// identity (nothing was sent to it), else `Unreachable`.
    pub async fn connect(cfg: &SignerConfig) -> Result<Self, SignError> {
        let identity = match &cfg.credentials {
            Credentials::Identity(id) => Some(id),
            Credentials::TokenFile(_) => None,
        };
        let connect = signet_client::connect(&cfg.target, identity);
        let channel = match tokio::time::timeout(CALL_TIMEOUT, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(ClientError::WrongServer(_, why))) => {
                return Err(SignError::retryable(REASON_WRONG_SERVER, why));
            }
            Ok(Err(e)) => return Err(SignError::retryable("Unreachable", e.to_string())),
            Err(_) => {
                return Err(SignError::retryable(
                    "Unreachable",
                    format!("no connection to {} within {CALL_TIMEOUT:?}", cfg.server()),
                ));
            }
        };
        Ok(Self::over(
            CaClient::from_channel(channel),
            cfg.credentials.clone(),
        ))
    }

    /// A signer over an open client (tests use a plain in-process server).
    pub(crate) fn over(client: CaClient, credentials: Credentials) -> Self {
        Self {
            client,
            credentials,
        }
    }

    /// The bearer token to send: the token file is read now, so a rotated token is used as
    /// soon as kubelet writes it; none with an mTLS identity.
    async fn bearer(&self) -> Result<Option<String>, SignError> {
        match &self.credentials {
            Credentials::Identity(_) => Ok(None),
            Credentials::TokenFile(path) => {
                let token = tokio::fs::read_to_string(path).await.map_err(|e| {
                    SignError::retryable(
                        "CredentialsNotFound",
                        format!(
                            "cannot read the service-account token {}: {e}",
                            path.display()
                        ),
                    )
                })?;
                Ok(Some(token.trim().to_owned()))
            }
        }
    }

    /// [`classify`], with a request the client could not build (only the token can make
    /// one) reported against the token file, as `CredentialsNotFound`.
    fn failed(&self, e: &CallError) -> SignError {
        match (e, &self.credentials) {
            (CallError::InvalidRequest(why), Credentials::TokenFile(path)) => {
                SignError::retryable("CredentialsNotFound", format!("{}: {why}", path.display()))
            }
            _ => classify(e),
        }
    }

    /// Signs `csr` (PEM or DER) for an object in `namespace`; `ttl` None means the server's
    /// default (the server clamps it to its maximum).
    pub async fn sign(
        &self,
        csr: &[u8],
        namespace: &str,
        ttl: Option<Duration>,
    ) -> Result<Signed, SignError> {
        let bearer = self.bearer().await?;
        let req = CsrRequest {
            csr: csr.to_vec(),
            ttl,
            kubernetes_namespace: Some(namespace.to_owned()),
        };
        let call = self.client.sign_csr(&req, bearer.as_deref());
        let issued = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(self.failed(&e)),
            Err(_) => {
                return Err(SignError::retryable(
                    "DeadlineExceeded",
                    "SignCsr timed out",
                ));
            }
        };
        let ca_pem = match &issued.root_der {
            Some(root) => pem_of(root),
            None => self.bundle().await?.roots_pem,
        };
        Ok(Signed {
            certificate: issued.certificate,
            ca_pem,
        })
    }

    /// The server's current trust bundle.
    pub async fn bundle(&self) -> Result<BundleInfo, SignError> {
        let bearer = self.bearer().await?;
        let call = self.client.bundle(bearer.as_deref());
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(b)) => Ok(BundleInfo::from(b)),
            Ok(Err(e)) => Err(self.failed(&e)),
            Err(_) => Err(SignError::retryable(
                "DeadlineExceeded",
                "GetBundle timed out",
            )),
        }
    }
}

/// A signer and the fingerprint of the config it was built from.
type CachedSigner = (Vec<u8>, Signer);

/// Connected [`Signer`]s by issuer key (e.g. `Issuer/ns/name`, `ClusterIssuer/name`); a
/// signer is rebuilt when its issuer's resolved config changes.
#[derive(Default, Clone)]
pub struct SignerCache {
    inner: Arc<Mutex<HashMap<String, CachedSigner>>>,
}

impl SignerCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached signer for `key` if `cfg` is unchanged, else a new connection.
    pub async fn get(&self, key: &str, cfg: &SignerConfig) -> Result<Signer, SignError> {
        let fp = cfg.fingerprint();
        {
            let m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((f, s)) = m.get(key)
                && *f == fp
            {
                return Ok(s.clone());
            }
        }
        let signer = Signer::connect(cfg).await?;
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(key.to_owned(), (fp, signer.clone()));
        Ok(signer)
    }

    /// Drops `key`'s signer (its issuer was deleted).
    pub fn forget(&self, key: &str) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(key);
    }
}

/// What the reconcilers need from a server, behind a trait so controller tests can fake it:
/// [`SignerCache`] is the real one.
pub trait SignBackend: Send + Sync {
    /// Signs `csr` for an object in `namespace` with the issuer `key` configured as `cfg`.
    fn sign<'a>(
        &'a self,
        key: &'a str,
        cfg: &'a SignerConfig,
        csr: &'a [u8],
        namespace: &'a str,
        ttl: Option<Duration>,
    ) -> futures::future::BoxFuture<'a, Result<Signed, SignError>>;

    /// The trust bundle of the issuer `key`'s server.
    fn bundle<'a>(
        &'a self,
        key: &'a str,
        cfg: &'a SignerConfig,
    ) -> futures::future::BoxFuture<'a, Result<BundleInfo, SignError>>;
}

impl SignBackend for SignerCache {
    fn sign<'a>(
        &'a self,
        key: &'a str,
        cfg: &'a SignerConfig,
        csr: &'a [u8],
        namespace: &'a str,
        ttl: Option<Duration>,
    ) -> futures::future::BoxFuture<'a, Result<Signed, SignError>> {
        Box::pin(async move { self.get(key, cfg).await?.sign(csr, namespace, ttl).await })
    }

    fn bundle<'a>(
        &'a self,
        key: &'a str,
        cfg: &'a SignerConfig,
    ) -> futures::future::BoxFuture<'a, Result<BundleInfo, SignError>> {
        Box::pin(async move { self.get(key, cfg).await?.bundle().await })
    }
}

/// One item each time the bundle's taints or CRLs change: the Certificate and Citadel
/// controllers reconcile every object again on it, so a certificate issued under a newly
/// tainted key, or newly revoked, is re-issued now.
pub fn revocation_changes(
    rx: tokio::sync::watch::Receiver<Option<BundleInfo>>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    let last = rx.borrow().as_ref().map(|b| b.revocations.clone());
    futures::stream::unfold((rx, last), |(mut rx, last)| async move {
        loop {
            rx.changed().await.ok()?;
            let cur = rx
                .borrow_and_update()
                .as_ref()
                .map(|b| b.revocations.clone());
            if cur != last {
                return Some(((), (rx, cur)));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use signet_client::proto::ca as pb;
    use signet_client::proto::ca::certificate_authority_server::{
        CertificateAuthority, CertificateAuthorityServer,
    };
    use tonic::{Code, Status};

    #[test]
    fn classifies_codes() {
        for c in [
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::FailedPrecondition,
        ] {
            let e = classify(&Status::new(c, "no").into());
            assert!(e.is_permanent(), "{c:?}");
            assert_eq!(e.message(), "no");
        }
        assert_eq!(
            classify(
                &Status::permission_denied("namespace a may not have spiffe://td/ns/b/x").into()
            ),
            SignError::permanent(
                "PermissionDenied",
                "namespace a may not have spiffe://td/ns/b/x"
            )
        );
        for c in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Unauthenticated,
            Code::Internal,
        ] {
            assert!(
                !classify(&Status::new(c, "later").into()).is_permanent(),
                "{c:?}"
            );
        }
        assert_eq!(
            classify(&Status::unavailable("").into()).message(),
            "The service is currently unavailable"
        );
    }

    #[test]
    fn pem_uses_lf() {
        let p = pem_of(b"abc");
        assert_eq!(
            p,
            "-----BEGIN CERTIFICATE-----\nYWJj\n-----END CERTIFICATE-----\n"
        );
    }

    #[test]
    fn fingerprint_tracks_config() {
        let a = SignerConfig {
            target: ServerTarget::new("https://a:1", b"x".to_vec(), td("example.org")),
            credentials: Credentials::TokenFile("/t".into()),
        };
        let mut b = a.clone();
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.target.bundle_pem = b"y".to_vec();
        assert_ne!(a.fingerprint(), b.fingerprint());
        let mut c = a.clone();
        c.target.trust_domain = td("other.org");
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[tokio::test]
    async fn unreachable_is_retryable() {
        let cfg = SignerConfig {
            target: ServerTarget::new("https://127.0.0.1:1", rcgen_root(), td("example.org")),
            credentials: Credentials::TokenFile("/nonexistent".into()),
        };
        let e = SignerCache::new()
            .get("Issuer/a/x", &cfg)
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "Unreachable");
        assert!(!e.is_permanent());
    }

    /// A `signet.ca.v1` server that records each call's method and `traceparent`, and
    /// answers every call `Unavailable` (only what the bridge sends matters here).
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Call>>>);

    /// A method and the `traceparent` it carried.
    type Call = (&'static str, Option<String>);

    impl Recorder {
        fn record<T>(&self, method: &'static str, req: &tonic::Request<T>) -> Status {
            let tp = req
                .metadata()
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            self.0.lock().unwrap().push((method, tp));
            Status::unavailable("recorded")
        }
    }

    #[tonic::async_trait]
    impl CertificateAuthority for Recorder {
        async fn mint_jwt_svid(
            &self,
            req: tonic::Request<pb::MintJwtSvidRequest>,
        ) -> Result<tonic::Response<pb::JwtSvid>, Status> {
            Err(self.record("MintJwtSvid", &req))
        }
        async fn sign_csr(
            &self,
            req: tonic::Request<pb::SignCsrRequest>,
        ) -> Result<tonic::Response<pb::SignCsrResponse>, Status> {
            Err(self.record("SignCsr", &req))
        }
        async fn get_bundle(
            &self,
            req: tonic::Request<pb::GetBundleRequest>,
        ) -> Result<tonic::Response<pb::Bundle>, Status> {
            Err(self.record("GetBundle", &req))
        }
        type WatchBundleStream = futures::stream::Empty<Result<pb::Bundle, Status>>;
        async fn watch_bundle(
            &self,
            req: tonic::Request<pb::WatchBundleRequest>,
        ) -> Result<tonic::Response<Self::WatchBundleStream>, Status> {
            Err(self.record("WatchBundle", &req))
        }
    }

    /// A plain-text in-process server (the TLS path is `signet_client`'s, tested there).
    async fn serve(recorder: Recorder) -> tonic::transport::Channel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(CertificateAuthorityServer::new(recorder))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn calls_made_in_a_reconcile_span_carry_its_trace_context() {
        use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
        use tracing::Instrument as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        use tracing_subscriber::layer::SubscriberExt as _;

        let recorder = Recorder::default();
        let signer = Signer::over(
            CaClient::from_channel(serve(recorder.clone()).await),
            Credentials::Identity(ClientIdentity {
                cert_chain_pem: vec![],
                key_pem: vec![],
            }),
        );
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("signet-k8s")));
        let _guard = tracing::subscriber::set_default(subscriber);

        // Outside any span: nothing to propagate.
        assert!(signer.bundle().await.is_err());
        // Inside the reconcile span, as the reconcilers make them.
        let span = tracing::info_span!(target: "signet_trace", "reconcile.certificate");
        let trace_id = span.context().span().span_context().trace_id().to_string();
        async {
            let e = signer.sign(b"csr", "a", None).await.unwrap_err();
            assert_eq!(e.reason(), "Unavailable", "{e:?}");
            assert!(signer.bundle().await.is_err());
        }
        .instrument(span)
        .await;

        let calls = recorder.0.lock().unwrap().clone();
        let methods: Vec<&str> = calls.iter().map(|(m, _)| *m).collect();
        assert_eq!(methods, ["GetBundle", "SignCsr", "GetBundle"]);
        assert_eq!(calls[0].1, None, "no span, no traceparent");
        for (method, tp) in &calls[1..] {
            let tp = tp
                .as_deref()
                .unwrap_or_else(|| panic!("{method}: no traceparent"));
            // 00-<trace id>-<span id>-<flags>: the reconcile span's trace.
            assert!(tp.starts_with(&format!("00-{trace_id}-")), "{method}: {tp}");
        }
    }

    fn td(s: &str) -> signet_types::TrustDomain {
        s.parse().unwrap()
    }

    fn rcgen_root() -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.self_signed(&key).unwrap().pem().into_bytes()
    }
}
