//! `signet-client`: a typed client for Signet's gRPC APIs.
//!
//! - [`connect`]: the CA listener over TLS, the server recognised by its chain to the trust
//!   bundle, its host name and its SPIFFE ID `spiffe://<td>/signet/server` ([`tls`]);
//!   optionally with a client certificate (mTLS). [`connect_tls`] is the same with the trust
//!   domain read from the bundle's roots.
//! - [`connect_admin`]: the operator API on the server's admin Unix socket.
//! - [`new_key_and_csr`]: a fresh private key (it never leaves this process) and a CSR for it.
//! - [`with_bearer`]: attach a service-account token to a request.
//! - [`status`]: what a failed call means to a client ([`ErrorClass`]: retryable, permanent,
//!   invalid) and the server's retry pushback; the agent, the bridge and `signetctl` all use it.
//! - [`node`]: [`node::NodeClient`], the typed node API (attest, renew, sync entries, sign
//!   workloads); [`ca`]: [`ca::CaClient`], the typed CA API (sign a CSR, Istio-style or
//!   Signet's own, get and watch the trust bundle with its taints and CRLs). Both answer in
//!   domain types (`signet_pki::SvidCertificate`, `signet_types` IDs, plain structs) and fail
//!   with a [`CallError`] (its [`ErrorClass`], the server's code and message). Protos are
//!   converted there and nowhere else; every call carries the caller's W3C trace context.
//! - [`admin`]: the typed operator API on the admin socket, one client per service:
//!   [`admin::AdminClient`] (the bundle as the server holds it, audit events, minting,
//!   certificate pages and lookups), [`admin::NodeAdminClient`] (join tokens, nodes,
//!   registration entries one or a batch at a time), [`admin::CaAdminClient`] (CA key slots),
//!   [`admin::LedgerAdminClient`] (signed checkpoints and their key) and
//!   [`admin::RevocationAdminClient`] (revocations, CRLs).
//! - [`proto`]: the generated messages. One user by design: `signetctl ledger verify` reads the
//!   ledger's raw rows and events, because an auditor recomputes the hash chain from exactly
//!   the bytes stored; a checked conversion would turn a tampered row into a refused answer
//!   instead of a chain break at its row number.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

pub use signet_proto::istio_ca;

/// The generated gRPC messages and clients.
pub mod proto {
    pub use signet_proto::{admin, agent, ca, istio_ca};
}

pub mod admin;
pub mod ca;
mod convert;
mod error;
pub mod node;
pub mod status;
pub mod tls;
pub use error::CallError;
pub use status::{ErrorClass, retry_pushback};
pub use tls::{
    ServerRoots, ServerTarget, connect, expected_trust_domain, server_id, trust_domain_of_bundle,
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid address {0:?}: {1}")]
    Address(String, String),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    /// The server's certificate chains to the bundle but is not the Signet server's identity.
    #[error("refusing {0}: {1}")]
    WrongServer(String, String),
    #[error("trust bundle: {0}")]
    Bundle(String),
    #[error("client certificate: {0}")]
    Identity(String),
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("key generation failed: {0}")]
    Key(String),
    #[error("invalid token: it contains characters not allowed in a header")]
    Token,
}

/// A client certificate chain and its key, both PEM. `Debug` hides the key.
#[derive(Clone)]
pub struct ClientIdentity {
    pub cert_chain_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("cert_chain_pem", &self.cert_chain_pem.len())
            .field("key_pem", &"…")
            .finish()
    }
}

/// Connects to a Signet CA at `addr` (`https://host:port` or `host:port`) over TLS, trusting
/// only the roots in `bundle_pem`, and requiring the server's SPIFFE ID in the trust domain the
/// bundle's roots name ([`trust_domain_of_bundle`]), or, when they name none (a plugged-in CA),
/// the trust domain of the client certificate `identity` (a client talks to its own trust
/// domain's CA). `server_name` overrides the name checked in the server's certificate
/// (default: the host in `addr`). Callers that know the trust domain from their configuration
/// use [`connect`].
pub async fn connect_tls(
    addr: &str,
    bundle_pem: &[u8],
    server_name: Option<&str>,
    identity: Option<&ClientIdentity>,
) -> Result<Channel, ClientError> {
    let trust_domain = match trust_domain_of_bundle(bundle_pem) {
        Ok(td) => td,
        Err(e) => identity
            .and_then(|id| tls::trust_domain_of_identity(&id.cert_chain_pem))
            .ok_or(e)?,
    };
    let target = ServerTarget::new(addr, bundle_pem.to_vec(), trust_domain)
        .with_server_name(server_name.map(str::to_owned));
    connect(&target, identity).await
}

/// Connects to the admin API on the server's Unix socket.
pub async fn connect_admin(socket: &Path) -> Result<Channel, ClientError> {
    let path: PathBuf = socket.to_owned();
    let shown = socket.display().to_string();
    // The URI is required by the API but unused: the connector always dials the socket.
    Endpoint::from_static("http://signet-admin.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| ClientError::Connect(shown, error_chain(&e)))
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        // io::Error shows its inner error and then yields it again as the source.
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

pub use signet_pki::KeyAndCsr;

/// Generates an ECDSA P-256 key and a CSR carrying no names: the server fills in the caller's
/// identity.
pub fn new_key_and_csr() -> Result<KeyAndCsr, ClientError> {
    signet_pki::new_key_and_csr().map_err(|e| ClientError::Key(e.to_string()))
}

/// Attaches `authorization: Bearer <token>` to a request.
pub fn with_bearer<T>(msg: T, token: &str) -> Result<tonic::Request<T>, ClientError> {
    let mut req = tonic::Request::new(msg);
    let value = format!("Bearer {token}")
        .parse()
        .map_err(|_| ClientError::Token)?;
    req.metadata_mut().insert("authorization", value);
    Ok(req)
}
