//! The node identity, as the loop obtains and renews it: reuse the one stored in `data_dir`
//! while it is valid, else attest with the configured credential (join token or Kubernetes
//! service-account token); renew it over the node's mTLS connection; persist each new one
//! ([`crate::node`] owns the files).
//!
//! Invariant: an attested identity is kept in memory even when it cannot be persisted (the
//! join token is spent); every failure is a [`NodeError`] (or [`RenewFailed`]) for the loop to
//! log and retry, never a panic or an exit.

use std::path::PathBuf;

use signet_pki::KeyError;
use signet_runtime::backoff::Retry;

use super::connector::RPC_TIMEOUT;
use super::schedule::RETRY;
use super::{Driver, sleep};
use crate::ca::{Ca, CaError};
use crate::config::ConfigError;
use crate::node::{self, IdentityError, NodeIdentity, Stored};

/// Why the loop has no node identity, or no connection with it, yet (logged and retried).
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configured `trust_bundle_file` cannot be read.
    #[error("trust_bundle_file {}: {source}", path.display())]
    BundleFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The configured `trust_bundle_file` is not PEM certificates.
    #[error("trust_bundle_file {}: {source}", path.display())]
    BundlePem {
        path: PathBuf,
        source: signet_types::pem::PemError,
    },
    #[error("no trust bundle for the server: set trust_bundle_file (PEM roots)")]
    NoServerRoots,
    /// The attestation credential cannot be read (a token file, say).
    #[error(transparent)]
    Credential(#[from] ConfigError),
    #[error(
        "no valid node identity in {} and no join token configured (join_token or \
         join_token_file, or attestation = \"kubernetes\")",
        dir.display()
    )]
    NoCredential { dir: PathBuf },
    /// The node's key and CSR cannot be made (a local fault).
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("attestation: {0}")]
    Attestation(CaError),
    #[error("attestation: the server did not answer in time")]
    AttestationTimeout,
    #[error("attestation answer: {0}")]
    Answer(IdentityError),
    /// The mTLS connection with the node identity failed.
    #[error(transparent)]
    Connect(CaError),
}

impl Driver {
    /// Retries [`Self::try_obtain_node`] with backoff until it succeeds or the agent stops.
    /// A refusal of the node as banned is reported once ([`Driver::server_failed`]) and
    /// retried only after [`crate::ca::BANNED_RETRY`].
    pub(super) async fn obtain_node(
        &mut self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<NodeIdentity> {
        let mut retry = Retry::new(RETRY, self.clock.now());
        loop {
            match self.try_obtain_node().await {
                Ok(n) => return Some(n),
                Err(e) => {
                    let now = self.clock.now();
                    let server = match &e {
                        NodeError::Attestation(ca) | NodeError::Connect(ca) => Some(ca),
                        _ => None,
                    };
                    let banned = server.is_some_and(|ca| self.server_failed(ca, None));
                    let pushback = server.and_then(CaError::retry_after);
                    let wait = RETRY
                        .delay(retry.failures(), self.random.unit())
                        .max(pushback.unwrap_or_default());
                    retry.failed_after(now, wait);
                    if banned {
                        tracing::debug!(error = %e, retry_in = ?wait, "no node identity yet");
                    } else {
                        if let Some(r) = &self.ready {
                            r.node_missing(&e.to_string());
                        }
                        tracing::warn!(error = %e, retry_in = ?wait, "no node identity yet");
                    }
                    if !sleep(wait, stop).await {
                        return None;
                    }
                }
            }
        }
    }

    async fn try_obtain_node(&mut self) -> Result<NodeIdentity, NodeError> {
        let dir = self.settings.data_dir.clone();
        let dir = &dir;
        let now = self.clock.now();
        match node::load(dir) {
            Stored::Found(n) if node::is_valid_at(&n, now) => {
                tracing::info!(node = %n.spiffe_id(), "reusing the node identity in data_dir");
                return Ok(n);
            }
            Stored::Found(n) => {
                tracing::warn!(node = %n.spiffe_id(), "the stored node certificate is no longer valid")
            }
            Stored::Corrupt(why) => {
                tracing::warn!(reason = %why, "ignoring a corrupt node identity in data_dir")
            }
            Stored::Absent => {}
        }
        let cred = (self.settings.credential)()?
            .ok_or_else(|| NodeError::NoCredential { dir: dir.clone() })?;
        let (_, roots_pem) = self.server_roots()?;
        let ca = self
            .connector
            .connect(roots_pem.as_bytes(), None)
            .await
            .map_err(NodeError::Attestation)?;
        let kc = signet_pki::new_key_and_csr()?;
        let attested = tokio::time::timeout(RPC_TIMEOUT, ca.attest(&cred, &kc.csr_der))
            .await
            .map_err(|_| NodeError::AttestationTimeout)?
            .map_err(NodeError::Attestation)?;
        self.server_answered();
        let n = node::from_issued(attested.svid, &kc.key_pkcs8_der).map_err(NodeError::Answer)?;
        // The token is spent: keep the identity in memory even if it cannot be persisted.
        if let Err(e) = node::save_bundle(dir, &attested.bundle_der) {
            tracing::error!(error = %e, dir = %dir.display(), "cannot persist the trust bundle");
        }
        if let Err(e) = node::save(dir, &n) {
            tracing::error!(error = %e, dir = %dir.display(), "cannot persist the node identity; a restart will need a new join token");
        }
        tracing::info!(node = %n.spiffe_id(), node_id = %attested.node_id, "node attested");
        Ok(n)
    }

    /// Connects with `node`, installing the connection in the shared [`super::SwapCa`].
    pub(super) async fn connect(&self, node: &NodeIdentity) -> Result<(), NodeError> {
        let (_, roots_pem) = self.server_roots()?;
        let ca = self
            .connector
            .connect(roots_pem.as_bytes(), Some(node))
            .await
            .map_err(NodeError::Connect)?;
        self.ca.set(Some(ca));
        Ok(())
    }

    /// Renews the node SVID over the current connection and persists it.
    #[tracing::instrument(
        target = "signet_trace",
        name = "agent.renew_node",
        skip_all,
        err(Display)
    )]
    pub(super) async fn renew_node(&self) -> Result<NodeIdentity, RenewFailed> {
        let kc = signet_pki::new_key_and_csr()?;
        let svid = self.ca.renew_node(&kc.csr_der).await?;
        let n = node::from_issued(svid, &kc.key_pkcs8_der)?;
        if let Err(e) = node::save(&self.settings.data_dir, &n) {
            tracing::error!(error = %e, "cannot persist the renewed node identity");
        }
        Ok(n)
    }
}

/// Why a node renewal failed.
#[derive(Debug, thiserror::Error)]
pub enum RenewFailed {
    /// The server failed or refused (it may have said when to come back).
    #[error(transparent)]
    Server(#[from] CaError),
    /// The new key and CSR cannot be made (a local fault).
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The answer is not an X509-SVID for the new key.
    #[error(transparent)]
    Answer(#[from] IdentityError),
}

impl NodeError {
    /// The server's answer, when the server failed or refused.
    pub(super) fn ca_error(&self) -> Option<&CaError> {
        match self {
            NodeError::Connect(e) | NodeError::Attestation(e) => Some(e),
            _ => None,
        }
    }
}

impl RenewFailed {
    /// The server's answer, when the server failed or refused.
    pub(super) fn ca_error(&self) -> Option<&CaError> {
        match self {
            RenewFailed::Server(e) => Some(e),
            _ => None,
        }
    }

    /// The wait the server asked for (its pushback), if it did.
    pub(super) fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            RenewFailed::Server(e) => e.retry_after(),
            RenewFailed::Key(_) | RenewFailed::Answer(_) => None,
        }
    }
}
