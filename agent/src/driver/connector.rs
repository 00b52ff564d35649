//! The agent's connection to the server: [`Connector`] opens one (without an identity for
//! attestation, or with the node SVID), [`GrpcConnector`] is the real one, and [`SwapCa`] is the
//! [`Ca`] the rotator holds while the loop replaces the connection under it (after the node
//! SVID is renewed).
//!
//! Invariant: no call to the server waits longer than its bound ([`CONNECT_TIMEOUT`],
//! [`RPC_TIMEOUT`]): a server that hangs cannot stall the loop; it shows as `Unavailable`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::ca::{
    AttestCredential, Attested, BundleStream, Ca, CaError, EntriesUpdate, EntryRevisionStream,
    GrpcCa, JwtRequest, MintedJwt, WorkloadCsr,
};
use crate::node::NodeIdentity;
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
}

/// [`Connector`] over gRPC/TLS to `address`, which must present the SPIFFE ID
/// `spiffe://<trust_domain>/signet/server` (None: the trust domain the roots name).
pub struct GrpcConnector {
    pub address: String,
    pub trust_domain: Option<signet_types::TrustDomain>,
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
        let connect = GrpcCa::connect(
            &self.address,
            self.trust_domain.as_ref(),
            roots_pem,
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
