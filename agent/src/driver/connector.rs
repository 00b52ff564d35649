//! The agent's connection to the server: [`Connector`] opens one (without an identity for
//! attestation, or with the node SVID), [`GrpcConnector`] is the real one, and [`SwapCa`] is the
//! [`Ca`] the rotator holds while the loop replaces the connection under it (after the node
//! SVID is renewed).
//!
//! The roots the server's certificate is verified against are the driver's current server
//! roots (the bundle received over the authenticated bundle stream, persisted in `data_dir`, and
//! `trust_bundle_file`): given at each [`Connector::connect`] and on each change
//! ([`Connector::roots_changed`]), and read by every TLS handshake, so a channel that
//! reconnects after the server restarted under a new root (or renewed its certificate under
//! it) trusts that root without the agent reconnecting or restarting.
//!
//! Invariant: no call to the server waits longer than its bound ([`CONNECT_TIMEOUT`],
//! [`RPC_TIMEOUT`]): a server that hangs cannot stall the loop; it shows as `Unavailable`.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::ca::{
    AttestCredential, Attested, BundleStream, Ca, CaError, EntriesUpdate, EntryRevisionStream,
    GrpcCa, JwtRequest, MintedJwt, WorkloadCsr,
};
use crate::node::NodeIdentity;
use signet_client::ServerRoots;
use signet_pki::SvidCertificate;

/// Longest wait for one call to the server.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a connection (TCP and TLS) to the server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a connection to the server: without an identity (attestation) or with the node SVID.
#[async_trait::async_trait]
pub trait Connector: Send + Sync {
    async fn connect(
        &self,
        roots_pem: &[u8],
        identity: Option<&NodeIdentity>,
    ) -> Result<Arc<dyn Ca>, CaError>;

    /// The server roots changed (PEM): the connections already open verify against them at
    /// their next handshake.
    fn roots_changed(&self, _roots_pem: &[u8]) {}
}

/// [`Connector`] over gRPC/TLS to `address`, which must present the SPIFFE ID
/// `spiffe://<trust_domain>/signet/server` (None: the trust domain the roots name).
pub struct GrpcConnector {
    address: String,
    trust_domain: Option<signet_types::TrustDomain>,
    /// The current server roots every connection shares, with their PEM (None before the
    /// first connection).
    roots: Mutex<Option<(Vec<u8>, Arc<ServerRoots>)>>,
}

impl GrpcConnector {
    pub fn new(address: String, trust_domain: Option<signet_types::TrustDomain>) -> Self {
        Self {
            address,
            trust_domain,
            roots: Mutex::new(None),
        }
    }

    /// The shared roots, replaced by `roots_pem`; on a bad bundle, the current ones stay.
    fn update_roots(&self, roots_pem: &[u8]) -> Result<Arc<ServerRoots>, CaError> {
        let mut g = match self.roots.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let bad =
            |e: signet_client::ClientError| CaError::Invalid(format!("the server roots: {e}"));
        match g.as_mut() {
            Some((pem, r)) if pem.as_slice() == roots_pem => Ok(r.clone()),
            Some((pem, r)) => {
                r.set(roots_pem).map_err(bad)?;
                *pem = roots_pem.to_vec();
                tracing::info!("the roots trusted for the server changed");
                Ok(r.clone())
            }
            None => {
                let r = Arc::new(ServerRoots::new(roots_pem).map_err(bad)?);
                *g = Some((roots_pem.to_vec(), r.clone()));
                Ok(r)
            }
        }
    }
}

#[async_trait::async_trait]
impl Connector for GrpcConnector {
    async fn connect(
        &self,
        roots_pem: &[u8],
        identity: Option<&NodeIdentity>,
    ) -> Result<Arc<dyn Ca>, CaError> {
        let id = identity
            .map(crate::node::client_identity)
            .transpose()
            .map_err(|e| CaError::Invalid(e.to_string()))?;
        let roots = self.update_roots(roots_pem)?;
        let connect = GrpcCa::connect(
            &self.address,
            self.trust_domain.as_ref(),
            roots_pem,
            Some(roots),
            id.as_ref(),
        );
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(ca)) => Ok(Arc::new(ca)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(CaError::Unavailable(format!(
                "{}: connection timed out",
                self.address
            ))),
        }
    }

    fn roots_changed(&self, roots_pem: &[u8]) {
        let open = match self.roots.lock() {
            Ok(g) => g.is_some(),
            Err(p) => p.into_inner().is_some(),
        };
        if !open {
            return;
        }
        if let Err(e) = self.update_roots(roots_pem) {
            tracing::warn!(error = %e, "keeping the previous server roots");
        }
    }
}

/// A [`Ca`] whose connection can be replaced (after the node SVID is renewed) while the
/// rotator holds it.
pub struct SwapCa(RwLock<Option<Arc<dyn Ca>>>);

impl Default for SwapCa {
    fn default() -> Self {
        Self(RwLock::new(None))
    }
}

impl SwapCa {
    pub fn set(&self, ca: Option<Arc<dyn Ca>>) {
        match self.0.write() {
            Ok(mut g) => *g = ca,
            Err(p) => *p.into_inner() = ca,
        }
    }

    /// Runs `call` on the current connection, bounded by [`RPC_TIMEOUT`] so a server that
    /// hangs cannot stall the loop.
    async fn with_current<T, F, Fut>(&self, call: F) -> Result<T, CaError>
    where
        F: FnOnce(Arc<dyn Ca>) -> Fut,
        Fut: std::future::Future<Output = Result<T, CaError>>,
    {
        let ca = self.current()?;
        tokio::time::timeout(RPC_TIMEOUT, call(ca))
            .await
            .unwrap_or_else(|_| {
                Err(CaError::Unavailable(
                    "the server did not answer in time".into(),
                ))
            })
    }

    fn current(&self) -> Result<Arc<dyn Ca>, CaError> {
        let g = match self.0.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        g.ok_or_else(|| CaError::Unavailable("not connected to the server".into()))
    }
}

#[async_trait::async_trait]
impl Ca for SwapCa {
    async fn attest(&self, cred: &AttestCredential, csr_der: &[u8]) -> Result<Attested, CaError> {
        self.with_current(|ca| async move { ca.attest(cred, csr_der).await })
            .await
    }
    async fn renew_node(&self, csr_der: &[u8]) -> Result<SvidCertificate, CaError> {
        self.with_current(|ca| async move { ca.renew_node(csr_der).await })
            .await
    }
    async fn sync_entries(&self, known_revision: u64) -> Result<EntriesUpdate, CaError> {
        self.with_current(|ca| async move { ca.sync_entries(known_revision).await })
            .await
    }
    async fn sign_workloads(
        &self,
        csrs: Vec<WorkloadCsr>,
    ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError> {
        self.with_current(|ca| async move { ca.sign_workloads(csrs).await })
            .await
    }
    async fn mint_workload_jwts(
        &self,
        reqs: Vec<JwtRequest>,
    ) -> Result<Vec<(String, Result<MintedJwt, CaError>)>, CaError> {
        self.with_current(|ca| async move { ca.mint_workload_jwts(reqs).await })
            .await
    }
    async fn watch_bundle(&self) -> Result<BundleStream, CaError> {
        self.with_current(|ca| async move { ca.watch_bundle().await })
            .await
    }
    async fn watch_entries(&self) -> Result<EntryRevisionStream, CaError> {
        self.with_current(|ca| async move { ca.watch_entries().await })
            .await
    }
}
