//! What every reconciler gets: the kube client, the bridge's namespace, the signing backend,
//! the clock, and per-object backoff counters.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::backoff::{Backoffs, Policy};
use crate::events::Events;
use crate::operator::BridgeConfig;
use crate::signer::{SignBackend, SignerCache};
use signet_runtime::clock::{Clock, SystemClock};

pub struct Context {
    pub client: Client,
    /// Where `ClusterIssuer` refs are read from (the bridge's own namespace).
    pub bridge_namespace: String,
    /// The operator's server and the bridge's own token (flags).
    pub bridge: Arc<BridgeConfig>,
    pub backend: Arc<dyn SignBackend>,
    pub clock: Arc<dyn Clock>,
    /// Consecutive failures per object key (`Kind/ns/name`).
    pub backoffs: Backoffs<String>,
    /// How often a Ready issuer is checked again.
    pub issuer_recheck: Duration,
    /// Events for outcomes (issuer Ready changes, request outcomes).
    pub events: Arc<dyn Events>,
}

impl Context {
    /// The production context: a real [`SignerCache`], the system clock, default backoff.
    pub fn new(
        client: Client,
        bridge_namespace: &str,
        bridge: Arc<BridgeConfig>,
        events: Arc<dyn Events>,
    ) -> Self {
        Self {
            events,
            client,
            bridge_namespace: bridge_namespace.to_owned(),
            bridge,
            backend: Arc::new(SignerCache::new()),
            clock: Arc::new(SystemClock),
            backoffs: Backoffs::new(Policy::default()),
            issuer_recheck: Duration::from_secs(300),
        }
    }
}

/// A reconciler failure that the controller retries with backoff (API errors; everything
/// about the object itself is reported in its status instead).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}
