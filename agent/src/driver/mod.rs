//! The agent's main loop: obtain the node identity ([`node`]: reuse the one in `data_dir`, or
//! attest), connect to the server over mTLS with it ([`connector`]), renew it at the configured
//! fraction of its lifetime, sync the entries when the server's entry stream says they changed
//! ([`entries`]) and on a slow `SyncEntries` poll (the safety net), hold the server's trust
//! bundle stream ([`roots`], [`crate::bundle`]), and drive the [`Rotator`] that signs the workloads'
//! certificates and publishes them and the bundle to the Workload API state and the sinks.
//!
//! The loop owns what the rotator works with and lends it to each pass: the trust state
//! ([`Trust`]: the roots served, the taints and CRLs in force, fed from the server's bundle
//! stream and `data_dir`), and the [`Outlets`] (the Workload API state, and the sinks, whose
//! workers it starts when it runs).
//!
//! What to do next and when is decided by the pure [`schedule`]; this module only executes
//! its steps and sleeps (waking early for a bundle or an entry change from the server, or the
//! stop signal).
//!
//! Nothing here exits on a server error: every failure is logged and retried with backoff
//! until the stop signal. A node the server refuses as banned is reported once (an error
//! naming `signetctl node unban`, `/readyz`, the `signet_agent_node_banned` gauge) and retried
//! only every [`crate::ca::BANNED_RETRY`] ([`status`]).
//!
//! Outages ([`cached`]): what the loop serves is saved, sealed under the node key, in
//! `data_dir` ([`crate::cache`]) after it changes (at most every [`CACHE_MIN_INTERVAL`], at
//! once when the node key changes), and restored at the start, before the server is asked
//! anything: a restart while the server is down serves the unexpired certificates at once,
//! and renews them when the server is back. Every pass withdraws what expired, at its expiry.

mod cached;
mod connector;
mod entries;
mod node;
mod roots;
mod schedule;
mod status;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use signet_types::TrustDomain;

use crate::bundle::BundleWatch;
use crate::ca::{AttestCredential, Ca, EntriesUpdate, EntrySpec};
use crate::config::ConfigError;
use crate::metrics::Metrics;
use crate::node::NodeIdentity;
use crate::rotator::{Outlets, Random, Rotator, SinkBinding};
use crate::sinks::worker::Telemetry;
use crate::state::StateSender;
use crate::trust::Trust;
use schedule::{NodeCert, Schedule, Step};
use signet_runtime::clock::Clock;

pub use cached::CACHE_MIN_INTERVAL;
pub use connector::{CONNECT_TIMEOUT, Connector, GrpcConnector, RPC_TIMEOUT, SwapCa};
pub use node::{NodeError, RenewFailed};
pub use schedule::{RETRY_BASE, RETRY_CAP};

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
    pub credential: Arc<dyn Fn() -> Result<Option<AttestCredential>, ConfigError> + Send + Sync>,
}

pub struct Driver {
    settings: Settings,
    connector: Arc<dyn Connector>,
    clock: Arc<dyn Clock>,
    random: Random,
    ca: Arc<SwapCa>,
    rotator: Rotator,
    /// The roots served, the taints and CRLs in force: lent to each rotator pass.
    trust: Trust,
    /// Where the rotator's passes publish: the Workload API state and the sinks.
    outlets: Outlets,
    metrics: Option<Arc<Metrics>>,
    ready: Option<crate::http::Readiness>,
    entries: Vec<EntrySpec>,
    revision: u64,
    /// The cache: restored once, saved after changes ([`cached`]).
    cache: cached::CacheState,
    /// The node ID the server refuses as banned, while it does ([`status`]).
    banned: Option<String>,
}

/// The loop's state for one node identity.
struct Serving {
    node: NodeIdentity,
    trust_domain: TrustDomain,
    /// `trust_domain` as a SPIFFE ID string (what the state publishes).
    td: String,
    /// The roots served now.
    bundle: Vec<Vec<u8>>,
    watch: BundleWatch,
    entry_watch: entries::EntryWatch,
    schedule: Schedule,
}

/// What woke the loop's sleep.
enum Woke {
    Bundle(Option<Result<crate::ca::TrustBundle, crate::ca::CaError>>),
    Entries(Option<Result<u64, crate::ca::CaError>>),
}

/// Why the loop for one node identity returned.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Stopped,
    /// The node SVID expired: obtain a new one.
    NodeExpired,
}

/// What the pass does after a step.
enum Flow {
    /// On to the next due step of this pass.
    Next,
    /// Start a new pass (the connection was replaced).
    Restart,
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

impl Driver {
    /// The loop, publishing the workloads' certificates and the bundle to `state`.
    pub fn new(
        settings: Settings,
        connector: Arc<dyn Connector>,
        clock: Arc<dyn Clock>,
        random: Random,
        state: StateSender,
    ) -> Self {
        let ca = Arc::new(SwapCa::default());
        let rotator = Rotator::new(
            ca.clone(),
            clock.clone(),
            random.clone(),
            settings.renew_fraction,
        );
        Self {
            settings,
            connector,
            clock,
            random,
            ca,
            rotator,
            trust: Trust::default(),
            outlets: Outlets::new(state),
            metrics: None,
            ready: None,
            entries: Vec::new(),
            revision: 0,
            cache: cached::CacheState::default(),
            banned: None,
        }
    }

    /// The sinks, started when the loop runs.
    pub fn with_sinks(mut self, sinks: Vec<SinkBinding>) -> Self {
        self.outlets = self.outlets.with_sinks(sinks);
        self
    }

    /// Counts renewals, compromised replacements, refused CRLs and the sinks' work in
    /// `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.rotator = self.rotator.with_metrics(metrics.clone());
        self.trust = self.trust.with_metrics(metrics.clone());
        self.metrics = Some(metrics);
        self
    }

    /// Records in `ready` what `/readyz` reports ([`crate::readiness`]): the node identity,
    /// the server's answers (unreachable, banned), entries synced and signed for the first
    /// time, or restored from the cache; `ready` judges with what the loop publishes.
    pub fn with_readiness(mut self, ready: crate::http::Readiness) -> Self {
        ready.attach(self.outlets.subscribe(), self.clock.clone());
        self.ready = Some(ready);
        self
    }

    /// The connection to the server as the loop keeps it (replaced under the holder when the
    /// node SVID is renewed): what the Workload API mints JWT-SVIDs through.
    pub fn ca(&self) -> Arc<SwapCa> {
        self.ca.clone()
    }

    /// Runs until `stop` turns true.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        self.outlets.start_sinks(
            Telemetry::new(self.metrics.as_ref().map(|m| m.sinks.clone())),
            self.clock.clone(),
            self.random.clone(),
        );
        loop {
            let Some(node) = self.obtain_node(&mut stop).await else {
                return;
            };
            if let Some(r) = &self.ready {
                r.node_obtained(&node.spiffe_id().to_string());
            }
            match self.serve(node, &mut stop).await {
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

    /// The loop for one node identity: passes of the steps [`Schedule::plan`] says are due,
    /// and sleeps between them that a bundle from the server or the stop signal cut short.
    async fn serve(
        &mut self,
        node: NodeIdentity,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Outcome {
        let now = self.clock.now();
        let mut s = self.start_serving(node, now);
        self.restore_cache(&mut s);
        loop {
            let now = self.clock.now();
            if !crate::node::is_valid_at(&s.node, now) {
                return Outcome::NodeExpired;
            }
            let mut done = None;
            let restarted = loop {
                let stream_due = s.watch.reopen_at().is_some_and(|at| now >= at);
                let Some(step) = s
                    .schedule
                    .plan(now, done, self.trust.revocations(), stream_due)
                else {
                    break false;
                };
                if let Flow::Restart = self.execute(step, &mut s, now).await {
                    break true;
                }
                done = Some(step);
            };
            if restarted {
                continue;
            }
            self.save_cache_if_due(&s);
            let now = self.clock.now();
            let connected = s.schedule.is_connected();
            if connected {
                s.entry_watch
                    .open_if_due(self.ca.as_ref(), now, self.random.unit())
                    .await;
            }
            let mut wait = s.schedule.wait(
                self.clock.now(),
                self.trust.revocations(),
                s.watch.reopen_at(),
            );
            if let Some(at) = s.entry_watch.reopen_at().filter(|_| connected) {
                wait = wait.min(at.duration_since(now).unwrap_or(Duration::ZERO));
            }
            if let Some(at) = self.cache.save_pending_at() {
                wait = wait.min(at.duration_since(now).unwrap_or(Duration::ZERO));
            }
            if *stop.borrow() {
                self.save_cache_at_stop(&s);
                return Outcome::Stopped;
            }
            // Sleep, but wake for a bundle or an entry change from the server.
            let woke = tokio::select! {
                _ = tokio::time::sleep(wait) => continue,
                _ = stop.wait_for(|s| *s) => {
                    self.save_cache_at_stop(&s);
                    return Outcome::Stopped;
                }
                item = s.watch.next() => Woke::Bundle(item),
                item = s.entry_watch.next() => Woke::Entries(item),
            };
            let now = self.clock.now();
            match woke {
                Woke::Bundle(Some(Ok(b))) => self.bundle_received(&mut s, b, now),
                Woke::Bundle(Some(Err(e))) => s.watch.failed_with(now, self.random.unit(), &e),
                Woke::Bundle(None) => {
                    s.watch
                        .failed(now, self.random.unit(), &"the server ended the stream")
                }
                Woke::Entries(Some(Ok(revision))) => {
                    s.entry_watch.succeeded();
                    if entries::sync_wanted(self.revision, revision) {
                        tracing::debug!(revision, "the server says the entries changed");
                        s.schedule.sync_now(now);
                    }
                }
                Woke::Entries(Some(Err(e))) => {
                    s.entry_watch.failed_with(now, self.random.unit(), &e)
                }
                // The server ends a stream after its lifetime, or at shutdown: reopen.
                Woke::Entries(None) => {
                    s.entry_watch
                        .failed(now, self.random.unit(), &"the server ended the stream")
                }
            }
        }
    }

    /// Counts a failed call to the server: `e` the server's answer, `None` a local fault.
    fn count_error(&self, operation: &'static str, e: Option<&crate::ca::CaError>) {
        if let Some(m) = &self.metrics {
            match e {
                Some(e) => m.server_error(operation, e),
                None => m.local_error(operation),
            }
        }
    }

    /// Installs `node` at `now`: its chain is learnt as CRL issuers, and the known bundle and
    /// the CRLs kept from before a restart are served before the server answers.
    fn start_serving(&mut self, node: NodeIdentity, now: SystemTime) -> Serving {
        if let Some(m) = &self.metrics {
            m.node_certificate(
                node.certificate().not_before(),
                node.certificate().not_after(),
            );
        }
        let bundle = self.served_bundle();
        let trust_domain = node.spiffe_id().trust_domain().clone();
        let td = trust_domain.id_string();
        self.trust.set_bundle(td.clone(), bundle.clone());
        self.trust.learn_issuers(node.certificate().chain_der());
        self.trust
            .restore_crls(&crate::node::load_crls(&self.settings.data_dir));
        let schedule = Schedule::new(
            &NodeCert::of(&node),
            now,
            self.settings.renew_fraction,
            self.settings.sync_interval,
            self.random.as_ref(),
        );
        Serving {
            node,
            trust_domain,
            td,
            bundle,
            watch: BundleWatch::bundle(now),
            entry_watch: entries::EntryWatch::entries(now),
            schedule,
        }
    }

    /// Executes one step at `now` and reports its result to the schedule.
    async fn execute(&mut self, step: Step, s: &mut Serving, now: SystemTime) -> Flow {
        match step {
            Step::Connect => match self.connect(&s.node).await {
                Ok(()) => {
                    s.schedule.connect_succeeded();
                    s.watch.reset(now);
                    s.entry_watch.reset(now);
                    tracing::info!(node = %s.node.spiffe_id(), "connected to the server");
                }
                Err(e) => {
                    self.count_error("connect", e.ca_error());
                    let wait = s.schedule.connect_failed(now, self.random.unit());
                    if let NodeError::Connect(ca) = &e {
                        self.server_failed(ca, Some(&s.node));
                    }
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot reach the server");
                }
            },
            Step::RenewNode => {
                let was = s.schedule.node_compromise(self.trust.revocations());
                if let Some(why) = &was {
                    tracing::info!(node = %s.node.spiffe_id(), reason = %why, "replacing the compromised node certificate now");
                }
                match self.renew_node().await {
                    Ok(n) => {
                        self.server_answered();
                        tracing::info!(node = %n.spiffe_id(), not_after = ?n.certificate().not_after(), "node certificate renewed");
                        self.trust.learn_issuers(n.certificate().chain_der());
                        if let Some(m) = &self.metrics
                            && was.is_some()
                        {
                            m.compromised_replacements.inc();
                        }
                        let again = s.schedule.node_renewed(
                            &NodeCert::of(&n),
                            now,
                            self.trust.revocations(),
                            self.random.as_ref(),
                        );
                        if let Some(why) = again {
                            tracing::warn!(reason = %why, "the new node certificate is compromised too; retrying after a backoff");
                        }
                        if let Some(m) = &self.metrics {
                            m.node_certificate(
                                n.certificate().not_before(),
                                n.certificate().not_after(),
                            );
                        }
                        s.node = n;
                        // The cache is sealed under the node key: seal it under the new one.
                        self.save_cache_now(s);
                        s.watch.reset(now);
                        s.entry_watch.reset(now);
                        return Flow::Restart;
                    }
                    Err(e) => {
                        self.count_error("renew_node", e.ca_error());
                        let wait = s.schedule.node_renewal_failed(
                            now,
                            self.random.unit(),
                            e.retry_after(),
                        );
                        let banned = match &e {
                            RenewFailed::Server(ca) => self.server_failed(ca, Some(&s.node)),
                            _ => false,
                        };
                        if banned {
                            tracing::debug!(error = %e, retry_in = ?wait, "node renewal refused");
                        } else {
                            tracing::warn!(error = %e, retry_in = ?wait, "node renewal failed");
                        }
                    }
                }
            }
            Step::SyncEntries => {
                let result = self.ca.sync_entries(self.revision).await;
                if result.is_ok() {
                    self.server_answered();
                }
                match result {
                    Ok(EntriesUpdate::Unchanged) => s.schedule.sync_succeeded(now, false),
                    Ok(EntriesUpdate::Changed {
                        revision,
                        entries,
                        federated_bundles,
                    }) => {
                        tracing::info!(
                            revision,
                            entries = entries.len(),
                            federated_bundles = federated_bundles.len(),
                            "registration entries changed"
                        );
                        self.revision = revision;
                        self.entries = entries;
                        if let Some(r) = &self.ready {
                            r.entries(self.entries.len());
                        }
                        // Published by the pass a changed sync runs.
                        self.trust.set_federated(&s.trust_domain, federated_bundles);
                        s.schedule.sync_succeeded(now, true);
                    }
                    Err(e) => {
                        self.count_error("sync", Some(&e));
                        let wait = s
                            .schedule
                            .sync_failed(now, self.random.unit(), e.retry_after());
                        let failures = s.schedule.sync_failures();
                        if self.server_failed(&e, Some(&s.node)) {
                            tracing::debug!(error = %e, failures, retry_in = ?wait, "entry sync refused; keeping the known entries");
                        } else {
                            tracing::warn!(error = %e, failures, retry_in = ?wait, "entry sync failed; keeping the known entries");
                        }
                    }
                }
                if self.refresh_served_bundle(s) {
                    s.schedule.rotate_now(now);
                }
                self.refresh_server_roots();
            }
            Step::OpenBundleStream => {
                s.watch
                    .open_if_due(self.ca.as_ref(), now, self.random.unit())
                    .await;
            }
            Step::Rotate => {
                let next = self
                    .rotator
                    .tick(&self.entries, &mut self.trust, &mut self.outlets)
                    .await;
                if s.schedule.rotated(next)
                    && let Some(r) = &self.ready
                {
                    r.set_ready();
                }
            }
        }
        Flow::Next
    }
}

#[cfg(test)]
mod tests;
