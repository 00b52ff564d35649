//! The agent's main loop: obtain the node identity (reuse the one in `data_dir`, or attest
//! with the join token), connect to the server over mTLS with it, renew it at the configured
//! fraction of its lifetime, poll `SyncEntries`, hold the server's trust bundle stream
//! (`WatchBundle`, see [`crate::bundle`]), and drive the [`Rotator`] that signs the
//! workloads' certificates and publishes them and the bundle to the Workload API state and
//! the sinks.
//!
//! Nothing here exits on a server error: every failure is logged and retried with backoff
//! until the stop signal.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::bundle::{BundleWatch, Decision};
use crate::ca::{
    AttestCredential, Attested, BundleStream, Ca, CaError, EntriesUpdate, EntrySpec, GrpcCa,
    IssuedSvid, WorkloadCsr,
};
use crate::clock::Clock;
use crate::node::{self, NodeIdentity, Stored};
use crate::revocation::{CertRef, Revocations};
use crate::rotation::{backoff, renew_at, renewal_due};
use crate::rotator::{Random, Rotator};

pub const RETRY_BASE: Duration = Duration::from_secs(1);
pub const RETRY_CAP: Duration = Duration::from_secs(30);
/// Longest wait for one call to the server.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);

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
        let id = identity.map(NodeIdentity::client_identity);
        let connect = GrpcCa::connect(
            &self.address,
            self.trust_domain.as_ref(),
            roots_pem,
            id.as_ref(),
        );
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
    async fn renew_node(&self, csr_der: &[u8]) -> Result<IssuedSvid, CaError> {
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
    ) -> Result<Vec<(String, Result<IssuedSvid, CaError>)>, CaError> {
        self.with_current(|ca| async move { ca.sign_workloads(csrs).await })
            .await
    }
    async fn watch_bundle(&self) -> Result<BundleStream, CaError> {
        self.with_current(|ca| async move { ca.watch_bundle().await })
            .await
    }
}

/// When the node SVID is renewed: at its usual time, at once when it is compromised (tainted
/// issuing key, or revoked: [`renewal_due`]), or after a failure's backoff.
struct NodeRenewal {
    scheduled: SystemTime,
    obtained: SystemTime,
    jitter: f64,
    /// Renewals in a row that came back compromised.
    reissues: u32,
    /// Set after a failed renewal: the next attempt, whatever else says.
    retry_at: Option<SystemTime>,
    cert: Option<CertRef>,
}

impl NodeRenewal {
    /// For `node`, installed at `now`, its lifetime counted from `from`.
    fn new(
        node: &NodeIdentity,
        now: SystemTime,
        from: SystemTime,
        fraction: f64,
        random: &Random,
    ) -> Self {
        Self {
            scheduled: renew_at(from, node.not_after, fraction, random()),
            obtained: now,
            jitter: random(),
            reissues: 0,
            retry_at: None,
            cert: node.chain_der.first().and_then(|l| CertRef::parse(l)),
        }
    }

    fn compromise(&self, rev: &Revocations) -> Option<crate::revocation::Compromise> {
        self.cert.as_ref().and_then(|c| rev.check(c))
    }

    fn due(&self, rev: &Revocations) -> SystemTime {
        self.retry_at.unwrap_or_else(|| {
            renewal_due(
                self.scheduled,
                self.obtained,
                self.compromise(rev).is_some(),
                self.reissues,
                self.jitter,
            )
        })
    }
}

/// What the loop needs from the configuration.
#[derive(Clone)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub trust_bundle_file: Option<PathBuf>,
    pub renew_fraction: f64,
    pub sync_interval: Duration,
    /// Reads the attestation credential: the join token, or the Kubernetes service-account
    /// token (called at each attestation attempt, so a token file written or rotated later is
    /// picked up). Never logged.
    pub credential: Arc<dyn Fn() -> Result<Option<AttestCredential>, String> + Send + Sync>,
}

pub struct Driver {
    settings: Settings,
    connector: Arc<dyn Connector>,
    clock: Arc<dyn Clock>,
    random: Random,
    ca: Arc<SwapCa>,
    rotator: Rotator,
    ready: Option<crate::http::Readiness>,
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
            ready: None,
        }
    }

    /// Marks `ready` once the node is connected and its entries have been synced and signed
    /// for the first time.
    pub fn with_readiness(mut self, ready: crate::http::Readiness) -> Self {
        self.ready = Some(ready);
        self
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
                         attesting again (with a join token, this needs a new one)"
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

    /// The roots served to workloads: the newest bundle from the server (kept in `data_dir`
    /// since attestation and updated from its bundle stream), or, before there is one, the
    /// bootstrap `trust_bundle_file`.
    fn served_bundle(&self) -> Vec<Vec<u8>> {
        let from_server = node::load_bundle(&self.settings.data_dir);
        if !from_server.is_empty() {
            return from_server;
        }
        self.server_roots().map(|(r, _)| r).unwrap_or_default()
    }

    /// Applies the taints and CRLs of a bundle from the server; persists the CRLs when what is
    /// in force changed. Returns whether it changed.
    fn apply_revocations(&mut self, b: &crate::ca::TrustBundle) -> bool {
        if !self.rotator.set_revocations(&b.tainted_key_ids, &b.crls) {
            return false;
        }
        let crls = self.rotator.revocations().crls_der();
        if let Err(e) = node::save_crls(&self.settings.data_dir, &crls) {
            tracing::error!(error = %e, "cannot persist the CRLs; serving them anyway");
        }
        true
    }

    /// Serves and persists `roots`, a new bundle from the server.
    fn replace_bundle(&mut self, td: &str, roots: Vec<Vec<u8>>) {
        if let Err(e) = node::save_bundle(&self.settings.data_dir, &roots) {
            tracing::error!(error = %e, "cannot persist the new trust bundle; serving it anyway");
        }
        self.rotator.set_bundle(td.to_owned(), roots);
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
        let cred = (self.settings.credential)()?.ok_or_else(|| {
            format!(
                "no valid node identity in {} and no join token configured (join_token or \
                 join_token_file, or attestation = \"kubernetes\")",
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
        let attested = tokio::time::timeout(RPC_TIMEOUT, ca.attest(&cred, &kc.csr_der))
            .await
            .map_err(|_| "attestation: the server did not answer in time".to_owned())?
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
    #[tracing::instrument(
        target = "signet_trace",
        name = "agent.renew_node",
        skip_all,
        err(Display)
    )]
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
        let mut bundle = self.served_bundle();
        let trust_domain = node.spiffe_id.trust_domain().clone();
        let td = trust_domain.id_string();
        self.rotator.set_bundle(td.clone(), bundle.clone());
        self.rotator.learn_issuers(&node.chain_der);
        // The CRLs kept from before the restart are served before the server answers.
        self.rotator
            .restore_crls(&node::load_crls(&self.settings.data_dir));

        let now = self.clock.now();
        let mut connected = false;
        let mut connect_failures = 0u32;
        let mut next_connect = now;
        // A stored identity keeps its place in its lifetime: one past its renewal time renews
        // at once.
        let mut node_renewal =
            NodeRenewal::new(&node, now, node.not_before, fraction, &self.random);
        let mut node_failures = 0u32;
        let mut next_sync = now;
        let mut next_tick = now;
        let mut synced = false;
        let mut sync_failures = 0u32;
        let mut watch = BundleWatch::new(now);
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
                        watch.reset(now);
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
            if connected && now >= node_renewal.due(self.rotator.revocations()) {
                let was = node_renewal.compromise(self.rotator.revocations());
                if let Some(why) = &was {
                    tracing::info!(node = %node.spiffe_id, reason = %why, "replacing the compromised node certificate now");
                }
                match self.renew_node().await {
                    Ok(n) => {
                        tracing::info!(node = %n.spiffe_id, not_after = ?n.not_after, "node certificate renewed");
                        node = n;
                        node_failures = 0;
                        self.rotator.learn_issuers(&node.chain_der);
                        let reissues = node_renewal.reissues;
                        // The server backdates not_before: count the lifetime from now.
                        node_renewal = NodeRenewal::new(
                            &node,
                            now,
                            node.not_before.max(now),
                            fraction,
                            &self.random,
                        );
                        if let Some(m) = self.rotator.metrics()
                            && was.is_some()
                        {
                            m.compromised_replacements.inc();
                        }
                        if let Some(why) = node_renewal.compromise(self.rotator.revocations()) {
                            node_renewal.reissues = reissues.saturating_add(1);
                            tracing::warn!(reason = %why, "the new node certificate is compromised too; retrying after a backoff");
                        }
                        // New connections present the new certificate.
                        connected = false;
                        next_connect = now;
                        watch.reset(now);
                        continue;
                    }
                    Err(e) => {
                        let wait = backoff(node_failures, RETRY_BASE, RETRY_CAP, (self.random)())
                            .max(RETRY_BASE / 2);
                        node_failures = node_failures.saturating_add(1);
                        tracing::warn!(error = %e, retry_in = ?wait, "node renewal failed");
                        node_renewal.retry_at = Some(now + wait);
                    }
                }
            }
            if connected && now >= next_sync {
                let mut synced_now = false;
                match self.ca.sync_entries(*revision).await {
                    Ok(EntriesUpdate::Unchanged) => synced_now = true,
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
                        synced_now = true;
                    }
                    Err(e) => {
                        sync_failures = sync_failures.saturating_add(1);
                        tracing::warn!(error = %e, failures = sync_failures, "entry sync failed; keeping the known entries");
                    }
                }
                if synced_now {
                    sync_failures = 0;
                    synced = true;
                }
                // While the server fails, poll less often (up to RETRY_CAP) and log less.
                let pause = if sync_failures == 0 {
                    self.settings.sync_interval
                } else {
                    self.settings
                        .sync_interval
                        .max(RETRY_CAP.min(self.settings.sync_interval * sync_failures.min(64)))
                };
                next_sync = now + pause;
                // Before the server sent a bundle, the bootstrap file may have been updated.
                let b = self.served_bundle();
                if !b.is_empty() && b != bundle {
                    bundle = b;
                    self.rotator.set_bundle(td.clone(), bundle.clone());
                    next_tick = now;
                }
            }
            if connected {
                watch
                    .open_if_due(self.ca.as_ref(), now, (self.random)())
                    .await;
            }
            if now >= next_tick {
                next_tick = self.rotator.tick(entries).await;
                if synced && let Some(r) = &self.ready {
                    r.set_ready();
                }
            }
            let mut wake = next_tick.min(node.not_after);
            if connected {
                wake = wake
                    .min(next_sync)
                    .min(node_renewal.due(self.rotator.revocations()));
                if let Some(at) = watch.reopen_at() {
                    wake = wake.min(at);
                }
            } else {
                wake = wake.min(next_connect);
            }
            let wait = wake
                .duration_since(self.clock.now())
                .unwrap_or(Duration::ZERO)
                .min(self.settings.sync_interval)
                .max(Duration::from_millis(10));
            if *stop.borrow() {
                return Outcome::Stopped;
            }
            // Sleep, but wake for a bundle from the server.
            let received = tokio::select! {
                _ = tokio::time::sleep(wait) => continue,
                _ = stop.wait_for(|s| *s) => return Outcome::Stopped,
                item = watch.next() => item,
            };
            let now = self.clock.now();
            match received {
                Some(Ok(b)) => {
                    tracing::debug!(revision = b.revision, "trust bundle from the server");
                    watch.succeeded();
                    let decision = crate::bundle::decide(&trust_domain, &bundle, &b);
                    let accepted = !matches!(decision, Decision::Reject(_));
                    match decision {
                        Decision::Unchanged => {}
                        Decision::Replace(roots) => {
                            tracing::info!(
                                revision = b.revision,
                                roots = roots.len(),
                                "new trust bundle from the server"
                            );
                            bundle = roots.clone();
                            self.replace_bundle(&td, roots);
                            next_tick = now;
                        }
                        Decision::Reject(why) => {
                            tracing::warn!(reason = %why, "ignoring a trust bundle")
                        }
                    }
                    // After the roots: a CRL of a root new in this bundle verifies with it.
                    if accepted && self.apply_revocations(&b) {
                        // Compromised certificates are replaced on this pass; the node's is
                        // due at once through `node_renewal.due`.
                        next_tick = now;
                    }
                }
                Some(Err(e)) => watch.failed(now, (self.random)(), &e),
                None => watch.failed(now, (self.random)(), &"the server ended the stream"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{Crl, TrustBundle};
    use crate::clock::SystemClock;
    use crate::state::{Selector, StateReceiver, channel};
    use futures::StreamExt;
    use std::sync::Mutex;

    /// A CA that really signs (so node identities pass their key check), counts calls and
    /// can refuse connections.
    struct Fake {
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
        root_der: Vec<u8>,
        node_ttl: Duration,
        failing_connects: Mutex<u32>,
        /// The leaf presented on each mTLS connection.
        connects: Mutex<Vec<Vec<u8>>>,
        /// The PEM roots trusted on each connection attempt.
        roots_seen: Mutex<Vec<String>>,
        attests: Mutex<u32>,
        /// What `WatchBundle` streams: the current value, then each change.
        bundle: tokio::sync::watch::Sender<TrustBundle>,
        watches: Mutex<u32>,
    }

    impl Fake {
        fn new(node_ttl: Duration, failing_connects: u32) -> Arc<Self> {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
            let mut p = rcgen::CertificateParams::default();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let root = p.self_signed(&key).expect("root");
            let (bundle, _) = tokio::sync::watch::channel(TrustBundle {
                trust_domain: "example.org".parse().expect("td"),
                roots_der: vec![root.der().to_vec()],
                revision: 1,
                tainted_key_ids: Vec::new(),
                crls: Vec::new(),
            });
            Arc::new(Self {
                issuer: rcgen::Issuer::new(p, key),
                root_der: root.der().to_vec(),
                node_ttl,
                failing_connects: Mutex::new(failing_connects),
                connects: Mutex::new(Vec::new()),
                roots_seen: Mutex::new(Vec::new()),
                attests: Mutex::new(0),
                bundle,
                watches: Mutex::new(0),
            })
        }

        fn issue(&self, csr: &[u8], path: &str, ttl: Duration) -> Result<IssuedSvid, CaError> {
            let bad = |e: rcgen::Error| CaError::Invalid(e.to_string());
            let csr_pem = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", csr.to_vec()));
            let csr = rcgen::CertificateSigningRequestParams::from_pem(&csr_pem).map_err(bad)?;
            let id = format!("spiffe://example.org{path}");
            let mut p = rcgen::CertificateParams::default();
            p.subject_alt_names = vec![rcgen::SanType::URI(id.as_str().try_into().map_err(bad)?)];
            let now = SystemTime::now();
            let nb = now - Duration::from_secs(1);
            let na = now + ttl;
            p.not_before = nb.into();
            p.not_after = na.into();
            p.use_authority_key_identifier_extension = true;
            let cert = p.signed_by(&csr.public_key, &self.issuer).map_err(bad)?;
            Ok(IssuedSvid {
                spiffe_id: id.parse().map_err(|_| CaError::Invalid("id".into()))?,
                chain_der: vec![cert.der().to_vec(), self.root_der.clone()],
                serial: String::new(),
                // Whole seconds, as in the certificate.
                not_before: SystemTime::UNIX_EPOCH
                    + Duration::from_secs(
                        nb.duration_since(SystemTime::UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0),
                    ),
                not_after: SystemTime::UNIX_EPOCH
                    + Duration::from_secs(
                        na.duration_since(SystemTime::UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0),
                    ),
            })
        }

        fn count(m: &Mutex<u32>) -> u32 {
            m.lock().map(|g| *g).unwrap_or(0)
        }
    }

    #[async_trait::async_trait]
    impl Ca for Fake {
        async fn attest(&self, _: &AttestCredential, csr: &[u8]) -> Result<Attested, CaError> {
            if let Ok(mut n) = self.attests.lock() {
                *n += 1;
            }
            Ok(Attested {
                node_id: "n1".into(),
                svid: self.issue(csr, "/signet/node/n1", self.node_ttl)?,
                bundle_der: vec![self.root_der.clone()],
            })
        }
        async fn renew_node(&self, csr: &[u8]) -> Result<IssuedSvid, CaError> {
            self.issue(csr, "/signet/node/n1", self.node_ttl)
        }
        async fn sync_entries(&self, known: u64) -> Result<EntriesUpdate, CaError> {
            Ok(if known == 0 {
                EntriesUpdate::Changed {
                    revision: 1,
                    entries: vec![EntrySpec {
                        id: "e1".into(),
                        spiffe_id: "spiffe://example.org/app"
                            .parse()
                            .map_err(|_| CaError::Invalid("id".into()))?,
                        parent_id: "spiffe://example.org/signet/node/n1".into(),
                        selectors: vec![Selector::Uid(1000)],
                        ttl: Duration::from_secs(3600),
                        dns_names: vec![],
                        revision: 1,
                    }],
                }
            } else {
                EntriesUpdate::Unchanged
            })
        }
        async fn sign_workloads(
            &self,
            csrs: Vec<WorkloadCsr>,
        ) -> Result<Vec<(String, Result<IssuedSvid, CaError>)>, CaError> {
            Ok(csrs
                .into_iter()
                .map(|c| {
                    let r = self.issue(&c.csr_der, "/app", Duration::from_secs(3600));
                    (c.entry_id, r)
                })
                .collect())
        }
        async fn watch_bundle(&self) -> Result<BundleStream, CaError> {
            if let Ok(mut n) = self.watches.lock() {
                *n += 1;
            }
            let rx = self.bundle.subscribe();
            let s = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
                if !first {
                    rx.changed().await.ok()?;
                }
                let b = rx.borrow_and_update().clone();
                Some((Ok(b), (rx, false)))
            });
            Ok(Box::pin(s))
        }
    }

    struct FakeConnector(Arc<Fake>);

    #[async_trait::async_trait]
    impl Connector for FakeConnector {
        async fn connect(
            &self,
            roots_pem: &[u8],
            identity: Option<&NodeIdentity>,
        ) -> Result<Arc<dyn Ca>, CaError> {
            if let Ok(mut r) = self.0.roots_seen.lock() {
                r.push(String::from_utf8_lossy(roots_pem).into_owned());
            }
            if let Ok(mut n) = self.0.failing_connects.lock()
                && *n > 0
            {
                *n -= 1;
                return Err(CaError::Unavailable("connection refused".into()));
            }
            if let (Some(id), Ok(mut c)) = (identity, self.0.connects.lock()) {
                c.push(id.chain_der[0].clone());
            }
            Ok(self.0.clone())
        }
    }

    struct Running {
        ready: crate::http::Readiness,
        stop: tokio::sync::watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
        state: StateReceiver,
        _bundle: tempfile::NamedTempFile,
    }

    fn start(fake: &Arc<Fake>, data_dir: &std::path::Path, token: Option<&str>) -> Running {
        start_with_sinks(fake, data_dir, token, Vec::new())
    }

    fn start_with_sinks(
        fake: &Arc<Fake>,
        data_dir: &std::path::Path,
        token: Option<&str>,
        sinks: Vec<crate::rotator::SinkBinding>,
    ) -> Running {
        let bundle = tempfile::NamedTempFile::new().expect("tmp");
        std::fs::write(
            bundle.path(),
            signet_types::pem::cert_to_pem(&fake.root_der),
        )
        .expect("write");
        let token = token.map(str::to_owned);
        let settings = Settings {
            data_dir: data_dir.to_owned(),
            trust_bundle_file: Some(bundle.path().to_owned()),
            renew_fraction: 0.5,
            sync_interval: Duration::from_millis(100),
            credential: Arc::new(move || Ok(token.clone().map(AttestCredential::JoinToken))),
        };
        let (tx, state) = channel();
        let ca = Arc::new(SwapCa::default());
        let random: Random = Arc::new(|| 0.0);
        let rotator = Rotator::new(ca.clone(), Arc::new(SystemClock), random.clone(), 0.5, tx)
            .with_sinks(sinks);
        let ready = crate::http::Readiness::default();
        let driver = Driver::new(
            settings,
            Arc::new(FakeConnector(fake.clone())),
            Arc::new(SystemClock),
            random,
            ca,
            rotator,
        )
        .with_readiness(ready.clone());
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(driver.run(stop_rx));
        Running {
            ready,
            stop,
            task,
            state,
            _bundle: bundle,
        }
    }

    async fn wait_for(secs: u64, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(r: Running) {
        let _ = r.stop.send(true);
        tokio::time::timeout(Duration::from_secs(5), r.task)
            .await
            .expect("stops promptly")
            .expect("no panic");
    }

    #[tokio::test]
    async fn unreachable_server_is_retried_then_attests_persists_and_serves() {
        let fake = Fake::new(Duration::from_secs(3600), 2);
        let dir = tempfile::tempdir().expect("tmp");
        let r = start(&fake, dir.path(), Some("tok"));
        let state = r.state.clone();
        wait_for(10, || state.borrow().identities.len() == 1).await;
        wait_for(10, || r.ready.is_ready()).await;
        let s = state.borrow().clone();
        assert_eq!(s.trust_domain_id, "spiffe://example.org");
        assert_eq!(s.bundle_der, std::slice::from_ref(&fake.root_der));
        assert_eq!(s.identities[0].svid.chain_der.len(), 1, "root not in chain");
        assert!(matches!(node::load(dir.path()), Stored::Found(_)));
        assert_eq!(Fake::count(&fake.attests), 1);
        stop(r).await;

        // A restart reuses the stored identity: no second attestation.
        let r = start(&fake, dir.path(), None);
        let state = r.state.clone();
        wait_for(10, || state.borrow().identities.len() == 1).await;
        assert_eq!(Fake::count(&fake.attests), 1);
        stop(r).await;
    }

    #[tokio::test]
    async fn corrupt_identity_without_a_token_is_retried_not_fatal() {
        let fake = Fake::new(Duration::from_secs(3600), 0);
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join(node::KEY_FILE), "garbage").expect("w");
        std::fs::write(dir.path().join(node::CERT_FILE), "garbage").expect("w");
        let r = start(&fake, dir.path(), None);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(!r.task.is_finished(), "keeps trying");
        assert!(!r.ready.is_ready());
        assert_eq!(Fake::count(&fake.attests), 0);
        assert!(r.state.borrow().identities.is_empty());
        stop(r).await;

        // With a token, the corrupt files are replaced by a fresh attestation.
        let r = start(&fake, dir.path(), Some("tok"));
        let state = r.state.clone();
        wait_for(10, || state.borrow().identities.len() == 1).await;
        assert!(matches!(node::load(dir.path()), Stored::Found(_)));
        stop(r).await;
    }

    #[tokio::test]
    async fn node_renewal_is_persisted_and_used_for_new_connections() {
        // Four seconds of life (backdated by one): renewed within about a second.
        let fake = Fake::new(Duration::from_secs(3), 0);
        let dir = tempfile::tempdir().expect("tmp");
        let r = start(&fake, dir.path(), Some("tok"));
        let connects = || fake.connects.lock().map(|c| c.clone()).unwrap_or_default();
        wait_for(10, || connects().len() >= 2).await;
        let c = connects();
        assert_ne!(c[0], c[1], "reconnected with the renewed certificate");
        match node::load(dir.path()) {
            Stored::Found(n) => assert!(c.contains(&n.chain_der[0])),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(Fake::count(&fake.attests), 1);
        stop(r).await;
    }

    /// A request from a workload of uid 1000, the Fake's entry's selector.
    fn workload_request<T>(msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut().insert(
            crate::workload::SECURITY_HEADER,
            "true".parse().expect("value"),
        );
        r.extensions_mut().insert(crate::workload::PeerInfo::fixed(
            crate::attest::Caller::host(1000, 1000, None, None),
        ));
        r
    }

    fn new_root() -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let mut p = rcgen::CertificateParams::default();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.self_signed(&key).expect("root").der().to_vec()
    }

    async fn next_item<T>(
        s: &mut (impl futures::Stream<Item = Result<T, tonic::Status>> + Unpin),
    ) -> T {
        tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("an update in time")
            .expect("an item")
            .expect("ok")
    }

    #[tokio::test]
    async fn bundle_stream_reaches_workload_api_sinks_and_survives_restart() {
        use crate::config::{DeletionPolicy, FileLayout, FilesSinkConfig};
        use signet_proto::workload as wpb;
        use signet_proto::workload::spiffe_workload_api_server::SpiffeWorkloadApi;

        let fake = Fake::new(Duration::from_secs(3600), 0);
        let dir = tempfile::tempdir().expect("tmp");
        let sink_dir = tempfile::tempdir().expect("tmp");
        let files = crate::sinks::files::FilesSink::new(
            "app",
            FilesSinkConfig {
                layout: FileLayout::Istio,
                ..FilesSinkConfig::new(sink_dir.path())
            },
        );
        let sinks = vec![crate::rotator::SinkBinding {
            spiffe_id: "spiffe://example.org/app".parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(30),
            sink: Arc::new(files),
        }];
        let r = start_with_sinks(&fake, dir.path(), Some("tok"), sinks);
        let state = r.state.clone();
        wait_for(10, || state.borrow().identities.len() == 1).await;
        let sink_roots = || {
            std::fs::read(sink_dir.path().join("root-cert.pem"))
                .ok()
                .and_then(|p| signet_types::pem::parse_certs(&p).ok())
                .unwrap_or_default()
        };
        let root1 = fake.root_der.clone();
        wait_for(10, || sink_roots() == [root1.clone()]).await;
        wait_for(10, || Fake::count(&fake.watches) >= 1).await;

        // A workload holds both Workload API streams open.
        let api =
            crate::workload::WorkloadApi::new(r.state.clone(), crate::attest::Attestor::default());
        let mut svids = api
            .fetch_x509svid(workload_request(wpb::X509svidRequest {}))
            .await
            .expect("stream")
            .into_inner();
        let mut bundles = api
            .fetch_x509_bundles(workload_request(wpb::X509BundlesRequest {}))
            .await
            .expect("stream")
            .into_inner();
        assert_eq!(next_item(&mut svids).await.svids[0].bundle, root1);
        assert_eq!(
            next_item(&mut bundles).await.bundles["spiffe://example.org"],
            root1
        );

        // The server publishes revision 2: a second root, as in a CA rotation.
        let root2 = new_root();
        let both = vec![root1.clone(), root2.clone()];
        fake.bundle.send_replace(TrustBundle {
            trust_domain: "example.org".parse().expect("td"),
            roots_der: both.clone(),
            revision: 2,
            tainted_key_ids: Vec::new(),
            crls: Vec::new(),
        });
        let svid = next_item(&mut svids).await;
        assert_eq!(svid.svids[0].bundle, both.concat(), "FetchX509SVID pushed");
        assert_eq!(svid.svids[0].spiffe_id, "spiffe://example.org/app");
        let b = next_item(&mut bundles).await;
        assert_eq!(
            b.bundles["spiffe://example.org"],
            both.concat(),
            "FetchX509Bundles pushed"
        );
        wait_for(10, || sink_roots() == both).await;
        assert_eq!(node::load_bundle(dir.path()), both, "persisted");

        // A bundle for another trust domain is ignored.
        fake.bundle.send_replace(TrustBundle {
            trust_domain: "other.org".parse().expect("td"),
            roots_der: vec![new_root()],
            revision: 3,
            tainted_key_ids: Vec::new(),
            crls: Vec::new(),
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(state.borrow().bundle_der, both);
        assert_eq!(node::load_bundle(dir.path()), both);
        drop((svids, bundles));
        stop(r).await;

        // Restarted with the server unreachable, the agent serves and trusts the newest
        // bundle, not only the bootstrap file's root.
        if let Ok(mut n) = fake.failing_connects.lock() {
            *n = u32::MAX;
        }
        let seen_before = fake.roots_seen.lock().map(|r| r.len()).unwrap_or(0);
        let r = start(&fake, dir.path(), None);
        let state = r.state.clone();
        wait_for(10, || state.borrow().bundle_der == both).await;
        wait_for(10, || {
            fake.roots_seen.lock().map(|r| r.len()).unwrap_or(0) > seen_before
        })
        .await;
        let trusted = fake
            .roots_seen
            .lock()
            .expect("lock")
            .last()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            signet_types::pem::parse_certs(trusted.as_bytes()).expect("pem"),
            both
        );
        stop(r).await;
    }

    /// A CRL of the Fake's root numbered `number` listing the serials (raw DER integer bytes).
    fn fake_crl(fake: &Fake, number: u64, serials: &[Vec<u8>]) -> Vec<u8> {
        let now = SystemTime::now();
        rcgen::CertificateRevocationListParams {
            this_update: now.into(),
            next_update: (now + Duration::from_secs(3600)).into(),
            crl_number: rcgen::SerialNumber::from(number.to_be_bytes().to_vec()),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from(s.clone()),
                    revocation_time: now.into(),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&fake.issuer)
        .expect("crl")
        .der()
        .to_vec()
    }

    fn serial_bytes(der: &[u8]) -> Vec<u8> {
        let (_, c) = x509_parser::parse_x509_certificate(der).expect("leaf");
        c.raw_serial().to_vec()
    }

    #[tokio::test]
    async fn a_taint_then_a_crl_from_the_bundle_stream_replace_the_certificates_now() {
        // Hour-long certificates: nothing would be renewed during this test on its own.
        let fake = Fake::new(Duration::from_secs(3600), 0);
        let dir = tempfile::tempdir().expect("tmp");
        let r = start(&fake, dir.path(), Some("tok"));
        let state = r.state.clone();
        wait_for(10, || state.borrow().identities.len() == 1).await;
        wait_for(10, || Fake::count(&fake.watches) >= 1).await;
        let leaf = || state.borrow().identities[0].svid.chain_der[0].clone();
        let connects = || fake.connects.lock().map(|c| c.len()).unwrap_or(0);
        let first = leaf();
        let key_id = CertRef::parse(&first)
            .and_then(|c| c.issuer_key_id)
            .expect("AKI");
        let node_before = connects();
        let bundle = |tainted: Vec<String>, crls: Vec<Crl>| TrustBundle {
            trust_domain: "example.org".parse().expect("td"),
            roots_der: vec![fake.root_der.clone()],
            revision: 2,
            tainted_key_ids: tainted,
            crls,
        };

        // The root's key is tainted (the fake keeps signing with it): the workload and the
        // node certificates are replaced at once, then again only after a backoff.
        fake.bundle
            .send_replace(bundle(vec![key_id.clone()], vec![]));
        wait_for(5, || leaf() != first).await;
        wait_for(5, || connects() > node_before).await;
        // Over two seconds, with jitter 0 (every retry at the 0.5 s floor): a handful of
        // replacements, not a loop.
        let (mut seen, node_soon) = (vec![leaf()], connects());
        let until = tokio::time::Instant::now() + Duration::from_secs(2);
        while tokio::time::Instant::now() < until {
            let l = leaf();
            if seen.last() != Some(&l) {
                seen.push(l);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            seen.len() <= 6,
            "{} workload replacements in 2 s",
            seen.len()
        );
        assert!(seen.len() >= 2, "retried while the key stays tainted");
        assert!(
            connects() - node_soon <= 6,
            "node: {}",
            connects() - node_soon
        );

        // The taint is lifted and a CRL lists the workload's current serial: replaced again.
        fake.bundle.send_replace(bundle(vec![], vec![]));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let held = leaf();
        let crl = fake_crl(&fake, 7, &[serial_bytes(&held)]);
        fake.bundle.send_replace(bundle(
            vec![],
            vec![Crl {
                key_id: key_id.clone(),
                der: crl.clone(),
                number: 7,
            }],
        ));
        wait_for(5, || leaf() != held).await;
        wait_for(5, || state.borrow().crls_der == [crl.clone()]).await;
        assert_eq!(
            node::load_crls(dir.path()),
            std::slice::from_ref(&crl),
            "persisted"
        );
        // A forged or older CRL changes nothing.
        fake.bundle.send_replace(bundle(
            vec![],
            vec![Crl {
                key_id: key_id.clone(),
                der: fake_crl(&fake, 6, &[]),
                number: 6,
            }],
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(state.borrow().crls_der, std::slice::from_ref(&crl));
        stop(r).await;

        // Restarted with the server unreachable, the agent serves the CRL it kept.
        if let Ok(mut n) = fake.failing_connects.lock() {
            *n = u32::MAX;
        }
        let r = start(&fake, dir.path(), None);
        let state = r.state.clone();
        wait_for(10, || state.borrow().crls_der == [crl.clone()]).await;
        stop(r).await;
    }

    #[tokio::test]
    async fn bundle_stream_is_reopened_after_the_connection_is_replaced() {
        // Renewed within about a second: the new connection opens a new stream.
        let fake = Fake::new(Duration::from_secs(3), 0);
        let dir = tempfile::tempdir().expect("tmp");
        let r = start(&fake, dir.path(), Some("tok"));
        wait_for(10, || {
            fake.connects.lock().map(|c| c.len()).unwrap_or(0) >= 2
        })
        .await;
        wait_for(10, || Fake::count(&fake.watches) >= 2).await;
        stop(r).await;
    }
}
