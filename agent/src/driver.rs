//! The agent's main loop: obtain the node identity (reuse the one in `data_dir`, or attest
//! with the join token), connect to the server over mTLS with it, renew it at the configured
//! fraction of its lifetime, poll `SyncEntries`, and drive the [`Rotator`] that signs the
//! workloads' certificates and publishes them to the Workload API state and the sinks.
//!
//! Nothing here exits on a server error: every failure is logged and retried with backoff
//! until the stop signal.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::ca::{
    AttestCredential, Attested, Ca, CaError, EntriesUpdate, EntrySpec, GrpcCa, IssuedSvid,
    WorkloadCsr,
};
use crate::clock::Clock;
use crate::node::{self, NodeIdentity, Stored};
use crate::rotation::{backoff, renew_at};
use crate::rotator::{Random, Rotator};

pub const RETRY_BASE: Duration = Duration::from_secs(1);
pub const RETRY_CAP: Duration = Duration::from_secs(30);

/// Opens a connection to the server: without an identity (attestation) or with the node SVID.
#[async_trait::async_trait]
pub trait Connector: Send + Sync {
    async fn connect(
        &self,
        roots_pem: &[u8],
        identity: Option<&NodeIdentity>,
    ) -> Result<Arc<dyn Ca>, CaError>;
}

/// [`Connector`] over gRPC/TLS to `address`.
pub struct GrpcConnector {
    pub address: String,
}

#[async_trait::async_trait]
impl Connector for GrpcConnector {
    async fn connect(
        &self,
        roots_pem: &[u8],
        identity: Option<&NodeIdentity>,
    ) -> Result<Arc<dyn Ca>, CaError> {
        let id = identity.map(NodeIdentity::client_identity);
        let connect = GrpcCa::connect(&self.address, roots_pem, id.as_ref());
        match tokio::time::timeout(Duration::from_secs(10), connect).await {
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
        self.current()?.attest(cred, csr_der).await
    }
    async fn renew_node(&self, csr_der: &[u8]) -> Result<IssuedSvid, CaError> {
        self.current()?.renew_node(csr_der).await
    }
    async fn sync_entries(&self, known_revision: u64) -> Result<EntriesUpdate, CaError> {
        self.current()?.sync_entries(known_revision).await
    }
    async fn sign_workloads(
        &self,
        csrs: Vec<WorkloadCsr>,
    ) -> Result<Vec<(String, Result<IssuedSvid, CaError>)>, CaError> {
        self.current()?.sign_workloads(csrs).await
    }
}

/// What the loop needs from the configuration.
#[derive(Clone)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub trust_bundle_file: Option<PathBuf>,
    pub renew_fraction: f64,
    pub sync_interval: Duration,
    /// Reads the join token (called at each attestation attempt, so a token file written
    /// later is picked up). Never logged.
    pub join_token: Arc<dyn Fn() -> Result<Option<String>, String> + Send + Sync>,
}

pub struct Driver {
    settings: Settings,
    connector: Arc<dyn Connector>,
    clock: Arc<dyn Clock>,
    random: Random,
    ca: Arc<SwapCa>,
    rotator: Rotator,
}

/// Why the loop returned.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Stopped,
    /// The node SVID expired: obtain a new one.
    NodeExpired,
}

impl Driver {
    /// `rotator` must have been built over `ca`.
    pub fn new(
        settings: Settings,
        connector: Arc<dyn Connector>,
        clock: Arc<dyn Clock>,
        random: Random,
        ca: Arc<SwapCa>,
        rotator: Rotator,
    ) -> Self {
        Self {
            settings,
            connector,
            clock,
            random,
            ca,
            rotator,
        }
    }

    /// Runs until `stop` turns true.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut entries: Vec<EntrySpec> = Vec::new();
        let mut revision = 0u64;
        loop {
            let Some(node) = self.obtain_node(&mut stop).await else {
                return;
            };
            match self
                .serve(node, &mut entries, &mut revision, &mut stop)
                .await
            {
                Outcome::Stopped => return,
                Outcome::NodeExpired => {
                    self.ca.set(None);
                    tracing::error!(
                        "the node certificate expired before it could be renewed; \
                         attesting again (this needs a new join token)"
                    );
                }
            }
        }
    }

    /// Sleeps for `d` or until stopped; returns false when stopped.
    async fn sleep(d: Duration, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        if *stop.borrow() {
            return false;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = stop.wait_for(|s| *s) => false,
        }
    }

    /// The PEM roots trusted for the server's TLS certificate: the configured file and the
    /// bundle received at attestation.
    fn server_roots(&self) -> Result<(Vec<Vec<u8>>, String), String> {
        let mut roots = node::load_bundle(&self.settings.data_dir);
        if let Some(f) = &self.settings.trust_bundle_file {
            let pem =
                std::fs::read(f).map_err(|e| format!("trust_bundle_file {}: {e}", f.display()))?;
            let certs = signet_types::pem::parse_certs(&pem)
                .map_err(|e| format!("trust_bundle_file {}: {e}", f.display()))?;
            for c in certs {
                if !roots.contains(&c) {
                    roots.push(c);
                }
            }
        }
        if roots.is_empty() {
            return Err("no trust bundle for the server: set trust_bundle_file (PEM roots)".into());
        }
        let pem = signet_types::pem::certs_to_pem(roots.iter().map(Vec::as_slice));
        Ok((roots, pem))
    }

    /// Retries [`Self::try_obtain_node`] with backoff until it succeeds or the agent stops.
    async fn obtain_node(
        &self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<NodeIdentity> {
        let mut attempt = 0u32;
        loop {
            match self.try_obtain_node().await {
                Ok(n) => return Some(n),
                Err(e) => {
                    let wait = backoff(attempt, RETRY_BASE, RETRY_CAP, (self.random)())
                        .max(RETRY_BASE / 2);
                    attempt = attempt.saturating_add(1);
                    tracing::warn!(error = %e, retry_in = ?wait, "no node identity yet");
                    if !Self::sleep(wait, stop).await {
                        return None;
                    }
                }
            }
        }
    }

    async fn try_obtain_node(&self) -> Result<NodeIdentity, String> {
        let dir = &self.settings.data_dir;
        let now = self.clock.now();
        match node::load(dir) {
            Stored::Found(n) if n.is_valid_at(now) => {
                tracing::info!(node = %n.spiffe_id, "reusing the node identity in data_dir");
                return Ok(n);
            }
            Stored::Found(n) => {
                tracing::warn!(node = %n.spiffe_id, "the stored node certificate is no longer valid")
            }
            Stored::Corrupt(why) => {
                tracing::warn!(reason = %why, "ignoring a corrupt node identity in data_dir")
            }
            Stored::Absent => {}
        }
        let token = (self.settings.join_token)()?.ok_or_else(|| {
            format!(
                "no valid node identity in {} and no join token configured (join_token or \
                 join_token_file)",
                dir.display()
            )
        })?;
        let (_, roots_pem) = self.server_roots()?;
        let ca = self
            .connector
            .connect(roots_pem.as_bytes(), None)
            .await
            .map_err(|e| format!("attestation: {e}"))?;
        let kc = signet_client::new_key_and_csr().map_err(|e| e.to_string())?;
        let attested = ca
            .attest(&AttestCredential::JoinToken(token), &kc.csr_der)
            .await
            .map_err(|e| format!("attestation: {e}"))?;
        let n = NodeIdentity::from_parts(attested.svid.chain_der, kc.key_pkcs8_der)
            .map_err(|e| format!("attestation answer: {e}"))?;
        // The token is spent: keep the identity in memory even if it cannot be persisted.
        if let Err(e) = node::save_bundle(dir, &attested.bundle_der) {
            tracing::error!(error = %e, dir = %dir.display(), "cannot persist the trust bundle");
        }
        if let Err(e) = node::save(dir, &n) {
            tracing::error!(error = %e, dir = %dir.display(), "cannot persist the node identity; a restart will need a new join token");
        }
        tracing::info!(node = %n.spiffe_id, node_id = %attested.node_id, "node attested");
        Ok(n)
    }

    /// Connects with `node`, installing the connection in the shared [`SwapCa`].
    async fn connect(&self, node: &NodeIdentity) -> Result<(), String> {
        let (_, roots_pem) = self.server_roots()?;
        let ca = self
            .connector
            .connect(roots_pem.as_bytes(), Some(node))
            .await
            .map_err(|e| e.to_string())?;
        self.ca.set(Some(ca));
        Ok(())
    }

    /// Renews the node SVID over the current connection and persists it.
    async fn renew_node(&self) -> Result<NodeIdentity, String> {
        let kc = signet_client::new_key_and_csr().map_err(|e| e.to_string())?;
        let svid = self
            .ca
            .renew_node(&kc.csr_der)
            .await
            .map_err(|e| e.to_string())?;
        let n = NodeIdentity::from_parts(svid.chain_der, kc.key_pkcs8_der)?;
        if let Err(e) = node::save(&self.settings.data_dir, &n) {
            tracing::error!(error = %e, "cannot persist the renewed node identity");
        }
        Ok(n)
    }

    /// The loop for one node identity.
    async fn serve(
        &mut self,
        mut node: NodeIdentity,
        entries: &mut Vec<EntrySpec>,
        revision: &mut u64,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Outcome {
        let fraction = self.settings.renew_fraction;
        let mut bundle = self.server_roots().map(|(r, _)| r).unwrap_or_default();
        let td = node.spiffe_id.trust_domain().id_string();
        self.rotator.set_bundle(td.clone(), bundle.clone());

        let now = self.clock.now();
        let mut connected = false;
        let mut connect_failures = 0u32;
        let mut next_connect = now;
        let mut node_renew_at =
            renew_at(node.not_before, node.not_after, fraction, (self.random)());
        let mut node_failures = 0u32;
        let mut next_sync = now;
        let mut next_tick = now;
        loop {
            let now = self.clock.now();
            if !node.is_valid_at(now) {
                return Outcome::NodeExpired;
            }
            if !connected && now >= next_connect {
                match self.connect(&node).await {
                    Ok(()) => {
                        connected = true;
                        connect_failures = 0;
                        tracing::info!(node = %node.spiffe_id, "connected to the server");
                    }
                    Err(e) => {
                        let wait =
                            backoff(connect_failures, RETRY_BASE, RETRY_CAP, (self.random)())
                                .max(RETRY_BASE / 2);
                        connect_failures = connect_failures.saturating_add(1);
                        tracing::warn!(error = %e, retry_in = ?wait, "cannot reach the server");
                        next_connect = now + wait;
                    }
                }
            }
            if connected && now >= node_renew_at {
                match self.renew_node().await {
                    Ok(n) => {
                        tracing::info!(node = %n.spiffe_id, not_after = ?n.not_after, "node certificate renewed");
                        node = n;
                        node_failures = 0;
                        node_renew_at = renew_at(
                            node.not_before.max(now),
                            node.not_after,
                            fraction,
                            (self.random)(),
                        );
                        // New connections present the new certificate.
                        connected = false;
                        next_connect = now;
                        continue;
                    }
                    Err(e) => {
                        let wait = backoff(node_failures, RETRY_BASE, RETRY_CAP, (self.random)())
                            .max(RETRY_BASE / 2);
                        node_failures = node_failures.saturating_add(1);
                        tracing::warn!(error = %e, retry_in = ?wait, "node renewal failed");
                        node_renew_at = now + wait;
                    }
                }
            }
            if connected && now >= next_sync {
                match self.ca.sync_entries(*revision).await {
                    Ok(EntriesUpdate::Unchanged) => {}
                    Ok(EntriesUpdate::Changed {
                        revision: r,
                        entries: e,
                    }) => {
                        tracing::info!(
                            revision = r,
                            entries = e.len(),
                            "registration entries changed"
                        );
                        *revision = r;
                        *entries = e;
                        next_tick = now;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "entry sync failed; keeping the known entries")
                    }
                }
                next_sync = now + self.settings.sync_interval;
                // The trust bundle file may have been updated.
                if let Ok((b, _)) = self.server_roots()
                    && b != bundle
                {
                    bundle = b;
                    self.rotator.set_bundle(td.clone(), bundle.clone());
                    next_tick = now;
                }
            }
            if now >= next_tick {
                next_tick = self.rotator.tick(entries).await;
            }
            let mut wake = next_tick.min(node.not_after);
            if connected {
                wake = wake.min(next_sync).min(node_renew_at);
            } else {
                wake = wake.min(next_connect);
            }
            let wait = wake
                .duration_since(self.clock.now())
                .unwrap_or(Duration::ZERO)
                .min(self.settings.sync_interval)
                .max(Duration::from_millis(10));
            if !Self::sleep(wait, stop).await {
                return Outcome::Stopped;
            }
        }
    }
}

/// Uniform in `[0, 1)`, from the standard library's randomly keyed hasher: enough for jitter.
pub fn std_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}
