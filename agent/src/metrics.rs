//! The agent's Prometheus metrics. Gauges about held certificates are computed from the
//! state at scrape time, so they can never drift from what the Workload API serves.
//!
//! The sinks' and the Workload API's metrics are defined beside them
//! ([`crate::sinks::telemetry::SinkMetrics`], [`crate::workload::WorkloadMetrics`]) and
//! registered here: this module depends on them, never the other way round.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::sinks::telemetry::SinkMetrics;
use crate::state::{AgentState, StateReceiver};
use signet_runtime::clock::Clock;

/// Labels of a metric family (`reason`…).
pub type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    certificates: Gauge,
    earliest_expiry_seconds: Gauge<f64, AtomicU64>,
    /// Foreign trust domains' bundles held (`federated_bundles`).
    federated_bundles: Gauge,
    /// Successful certificate renewals (node and workloads).
    pub renewals: Counter,
    /// Failed renewal attempts.
    pub renewal_failures: Counter,
    /// Certificates (workload or node) replaced before their time because they were issued
    /// under a tainted CA key or revoked.
    pub compromised_replacements: Counter,
    /// CRLs from the server that were not accepted, by reason (`bad_signature`,
    /// `unknown_issuer`, `mismatch`, `malformed`, `not_newer`).
    pub crl_rejections: Family<Labels, Counter>,
    /// 1 while the server refuses this node as banned (set by the driver).
    pub node_banned: Gauge,
    /// The sinks' deliveries, failures, warnings and health (`signet_agent_sink_*`), and what
    /// each sink is doing, for `/readyz` and the logs.
    pub sinks: Arc<SinkMetrics>,
    /// The Workload API's defences (connection caps, timeouts, refused writers).
    pub workload: Arc<crate::workload::WorkloadMetrics>,
    state: StateReceiver,
    clock: Arc<dyn Clock>,
}

impl Metrics {
    pub fn new(state: StateReceiver, clock: Arc<dyn Clock>) -> Self {
        let mut registry = Registry::with_prefix("signet_agent");
        let certificates = Gauge::default();
        registry.register(
            "certificates",
            "Workload certificates the agent holds",
            certificates.clone(),
        );
        let earliest_expiry_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "earliest_expiry_seconds",
            "Seconds until the earliest held certificate expires (0 when none or expired)",
            earliest_expiry_seconds.clone(),
        );
        let federated_bundles = Gauge::default();
        registry.register(
            "federated_bundles",
            "Bundles of foreign trust domains the agent holds for its entries' federation",
            federated_bundles.clone(),
        );
        let renewals = Counter::default();
        registry.register(
            "renewals",
            "Successful certificate renewals",
            renewals.clone(),
        );
        let renewal_failures = Counter::default();
        registry.register(
            "renewal_failures",
            "Failed renewal attempts",
            renewal_failures.clone(),
        );
        let compromised_replacements = Counter::default();
        registry.register(
            "compromised_replacements",
            "Certificates replaced early: issued under a tainted CA key, or revoked",
            compromised_replacements.clone(),
        );
        let crl_rejections = Family::<Labels, Counter>::default();
        registry.register(
            "crl_rejections",
            "CRLs from the server not accepted (reason: bad_signature, unknown_issuer, mismatch, malformed, not_newer)",
            crl_rejections.clone(),
        );
        let node_banned = Gauge::default();
        registry.register(
            "node_banned",
            "1 while the server refuses this node as banned (`signetctl node unban` lifts it)",
            node_banned.clone(),
        );
        let sinks = Arc::new(SinkMetrics::register(&mut registry));
        let workload = Arc::new(crate::workload::WorkloadMetrics::register(&mut registry));
        Self {
            registry,
            workload,
            certificates,
            earliest_expiry_seconds,
            federated_bundles,
            renewals,
            renewal_failures,
            compromised_replacements,
            crl_rejections,
            node_banned,
            sinks,
            state,
            clock,
        }
    }

    fn refresh(&self) {
        let state: Arc<AgentState> = self.state.borrow().clone();
        let now = self.clock.now();
        self.certificates
            .set(i64::try_from(state.identities.len()).unwrap_or(i64::MAX));
        let earliest = state
            .identities
            .iter()
            .map(|i| i.svid.certificate().not_after())
            .min()
            .and_then(|t| t.duration_since(now).ok())
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.earliest_expiry_seconds.set(earliest);
        self.federated_bundles
            .set(i64::try_from(state.federated.len()).unwrap_or(i64::MAX));
    }

    /// One line per sink that fails, is stuck or refused something (see
    /// [`crate::sinks::health::SinkHealth`]).
    pub fn sink_problems(&self) -> Vec<String> {
        self.sinks.health.problems(self.clock.now())
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        self.refresh();
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Identity, Selector, channel};
    use signet_runtime::clock::FakeClock;
    use std::time::{Duration, SystemTime};

    #[test]
    fn reports_held_certificates_and_earliest_expiry() {
        let (tx, rx) = channel();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let m = Metrics::new(rx, Arc::new(FakeClock::at(t0)));
        assert!(m.encode().contains("signet_agent_certificates 0"));
        let id = |secs| Identity {
            entry_id: "e".into(),
            selectors: vec![Selector::Uid(1)],
            svid: Arc::new(crate::testing::self_signed_svid(
                "spiffe://example.org/a",
                t0,
                Duration::from_secs(secs),
            )),
            federates_with: vec![],
        };
        tx.send_replace(Arc::new(AgentState {
            identities: vec![id(300), id(120)],
            ..AgentState::default()
        }));
        m.renewals.inc();
        let text = m.encode();
        assert!(text.contains("signet_agent_certificates 2"), "{text}");
        assert!(
            text.contains("signet_agent_earliest_expiry_seconds 120.0"),
            "{text}"
        );
        assert!(text.contains("signet_agent_renewals_total 1"), "{text}");
        assert!(text.contains("signet_agent_federated_bundles 0"), "{text}");
        assert!(
            text.contains("signet_agent_renewal_failures_total 0"),
            "{text}"
        );
    }
}
