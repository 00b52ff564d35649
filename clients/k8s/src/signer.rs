//! Talks to a Signet server on behalf of one issuer: TLS verified against the issuer's trust
//! bundle and the server's SPIFFE ID (`signet_client::connect`), authenticated by a bearer token re-read from its file at each
//! call (kubelet rotates projected tokens) or by an mTLS SVID. Errors are classified for the
//! reconcilers: [`SignError::Permanent`] (a retry cannot fix it: Failed) or
//! [`SignError::Retryable`] (Pending, back off and try again).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use signet_client::proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_client::proto::ca::{GetBundleRequest, SignCsrRequest};
use signet_client::{ClientError, ClientIdentity, ServerTarget};
use tonic::transport::Channel;

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

/// The one place gRPC statuses become [`SignError`]s.
pub fn classify(status: &tonic::Status) -> SignError {
    let message = if status.message().is_empty() {
        status.code().description().to_owned()
    } else {
        status.message().to_owned()
    };
    let reason = format!("{:?}", status.code());
    // One classification for every client (signet_client::status): an Unauthenticated answer
    // is retried, since the projected token may be renewed and the server's JWKS refreshed.
    match signet_client::ErrorClass::of(status.code()) {
        signet_client::ErrorClass::Permanent | signet_client::ErrorClass::Invalid => {
            SignError::Permanent { reason, message }
        }
        signet_client::ErrorClass::Retryable => SignError::Retryable { reason, message },
    }
}

/// A certificate signed by the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signed {
    /// PEM: the leaf, then intermediates (no root).
    pub chain_pem: String,
    /// PEM: the root that signs the chain.
    pub ca_pem: String,
    pub spiffe_id: String,
    pub serial: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
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

/// A connected client for one issuer.
#[derive(Clone)]
pub struct Signer {
    channel: Channel,
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
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

fn unix(secs: i64) -> SystemTime {
    signet_runtime::clock::from_unix_clamped(secs)
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
        Ok(Self {
            channel,
            credentials: cfg.credentials.clone(),
        })
    }

    /// A request carrying the credentials: the token file is read now, so a rotated token is
    /// used as soon as kubelet writes it.
    async fn request<T>(&self, msg: T) -> Result<tonic::Request<T>, SignError> {
        match &self.credentials {
            Credentials::Identity(_) => Ok(tonic::Request::new(msg)),
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
                signet_client::with_bearer(msg, token.trim()).map_err(|e| {
                    SignError::retryable("CredentialsNotFound", format!("{}: {e}", path.display()))
                })
            }
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
        let req = self
            .request(SignCsrRequest {
                csr: csr.to_vec(),
                ttl_seconds: ttl
                    .map(|d| signet_runtime::clock::whole_seconds(d).max(1))
                    .unwrap_or(0),
                kubernetes_namespace: namespace.to_owned(),
            })
            .await?;
        let mut client = CertificateAuthorityClient::new(self.channel.clone());
        let resp = match tokio::time::timeout(CALL_TIMEOUT, client.sign_csr(req)).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => return Err(classify(&status)),
            Err(_) => {
                return Err(SignError::retryable(
                    "DeadlineExceeded",
                    "SignCsr timed out",
                ));
            }
        };
        let mut certs = resp.cert_chain;
        if certs.is_empty() {
            return Err(SignError::retryable(
                "Internal",
                "the server returned no certificate",
            ));
        }
        let ca_pem = if certs.len() > 1 {
            certs.pop().map(|d| pem_of(&d)).unwrap_or_default()
        } else {
            self.bundle().await?.roots_pem
        };
        // What the server answered must be an X509-SVID for the identity it says it issued.
        let svid = signet_pki::SvidCertificate::from_chain_der(certs.clone())
            .map_err(|e| SignError::retryable("Internal", format!("the server's answer: {e}")))?;
        if svid.spiffe_id().to_string() != resp.spiffe_id {
            return Err(SignError::retryable(
                "Internal",
                "the server's certificate names another SPIFFE ID than its answer",
            ));
        }
        Ok(Signed {
            chain_pem: certs.iter().map(|d| pem_of(d)).collect(),
            ca_pem,
            spiffe_id: resp.spiffe_id,
            serial: resp.serial,
            not_before: unix(resp.not_before),
            not_after: unix(resp.not_after),
        })
    }

    /// The server's current trust bundle.
    pub async fn bundle(&self) -> Result<BundleInfo, SignError> {
        let req = self.request(GetBundleRequest {}).await?;
        let mut client = CertificateAuthorityClient::new(self.channel.clone());
        let b = match tokio::time::timeout(CALL_TIMEOUT, client.get_bundle(req)).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => return Err(classify(&status)),
            Err(_) => {
                return Err(SignError::retryable(
                    "DeadlineExceeded",
                    "GetBundle timed out",
                ));
            }
        };
        Ok(BundleInfo {
            revocations: crate::revocation::Revocations::of_bundle(&b),
            trust_domain: b.trust_domain,
            roots_pem: b.roots.iter().map(|d| pem_of(d)).collect(),
            revision: b.revision,
        })
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
    use tonic::{Code, Status};

    #[test]
    fn classifies_codes() {
        for c in [
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::FailedPrecondition,
        ] {
            let e = classify(&Status::new(c, "no"));
            assert!(e.is_permanent(), "{c:?}");
            assert_eq!(e.message(), "no");
        }
        assert_eq!(
            classify(&Status::permission_denied(
                "namespace a may not have spiffe://td/ns/b/x"
            )),
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
            assert!(!classify(&Status::new(c, "later")).is_permanent(), "{c:?}");
        }
        assert_eq!(
            classify(&Status::unavailable("")).message(),
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
