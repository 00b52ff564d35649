//! The agent's Prometheus metrics, served in the format the scraper asks for
//! ([`signet_runtime::metrics`]), with the process metrics and `signet_agent_build_info`.
//! Gauges about held certificates are computed from the state at scrape time, so they can
//! never drift from what the Workload API serves. Counters with a bounded label set are
//! present at zero from start-up.
//!
//! `signet_agent_identities_without_certificate` is what the expiry gauges cannot say: when a
//! certificate expires and is withdrawn, the earliest expiry jumps to the next one, so a
//! workload that lost its identity shows only there. It is the entries the rotator was last
//! given ([`Metrics::entries`]) less the identities the state serves with a certificate valid
//! at the scrape.
//!
//! The sinks' and the Workload API's metrics are defined beside them
//! ([`crate::sinks::telemetry::SinkMetrics`], [`crate::workload::WorkloadMetrics`]) and
//! registered here: this module depends on them, never the other way round.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use signet_runtime::metrics::Format;

use crate::sinks::telemetry::SinkMetrics;
use crate::state::{AgentState, StateReceiver};
use signet_runtime::clock::Clock;

/// Labels of a metric family (`reason`…).
pub type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    certificates: Gauge,
    /// Registration entries the agent should serve (set by the rotator at each pass).
    entries: Gauge,
    /// Of those, how many have no certificate valid now (computed at scrape time).
    identities_without_certificate: Gauge,
    earliest_expiry_seconds: Gauge<f64, AtomicU64>,
    /// notAfter and notBefore of the held workload certificate that expires first (unix
    /// seconds; 0 while none is held).
    earliest_expiry_timestamp: Gauge,
    earliest_not_before_timestamp: Gauge,
    /// notAfter and notBefore of the node certificate (unix seconds; 0 before the first).
    node_expiry_timestamp: Gauge,
    node_not_before_timestamp: Gauge,
    /// Failed calls to the server, by `operation` and `reason` ([`ServerErrorLabels`]).
    pub server_errors: Family<Labels, Counter>,
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
        let mut root =
            signet_runtime::metrics::standard_registry("agent", env!("CARGO_PKG_VERSION"));
        let registry = root.sub_registry_with_prefix("signet_agent");
        let certificates = Gauge::default();
        registry.register(
            "certificates",
            "Workload certificates the agent holds",
            certificates.clone(),
        );
        let entries = Gauge::default();
        registry.register(
            "entries",
            "Registration entries the agent should serve: the server's last answer, or the \
             cache's until it answers",
            entries.clone(),
        );
        let identities_without_certificate = Gauge::default();
        registry.register(
            "identities_without_certificate",
            "Entries the agent should serve that have no certificate valid now (never signed, \
             or expired without renewal): their workloads get no identity",
            identities_without_certificate.clone(),
        );
        let earliest_expiry_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "earliest_expiry_seconds",
            "Seconds until the earliest held certificate expires (0 when none or expired)",
            earliest_expiry_seconds.clone(),
        );
        let earliest_expiry_timestamp = Gauge::default();
        registry.register(
            "workload_certificate_earliest_expiry_timestamp_seconds",
            "notAfter of the held workload certificate that expires first: the oldest \
             unrenewed one (unix seconds; 0 while none is held)",
            earliest_expiry_timestamp.clone(),
        );
        let earliest_not_before_timestamp = Gauge::default();
        registry.register(
            "workload_certificate_earliest_not_before_timestamp_seconds",
            "notBefore of that same certificate (unix seconds; 0 while none is held): with \
             its expiry, the fraction of its lifetime left",
            earliest_not_before_timestamp.clone(),
        );
        let node_expiry_timestamp = Gauge::default();
        registry.register(
            "node_certificate_expiry_timestamp_seconds",
            "notAfter of the agent's node certificate (unix seconds; 0 before it has one)",
            node_expiry_timestamp.clone(),
        );
        let node_not_before_timestamp = Gauge::default();
        registry.register(
            "node_certificate_not_before_timestamp_seconds",
            "notBefore of the agent's node certificate (unix seconds; 0 before it has one)",
            node_not_before_timestamp.clone(),
        );
        let server_errors = Family::<Labels, Counter>::default();
        registry.register(
            "server_errors",
            "Failed calls to the server by operation (connect, renew_node, sync, sign) and \
             reason (unavailable: unreachable or a transient error; busy: shed with a retry \
             pushback; refused: the server said no, e.g. a banned node; invalid_answer; local: \
             a fault on this node)",
            server_errors.clone(),
        );
        for operation in SERVER_OPERATIONS {
            for reason in SERVER_ERROR_REASONS {
                let _ = server_errors.get_or_create(&server_error_labels(operation, reason));
            }
        }
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
        for reason in CRL_REJECTIONS {
            let _ = crl_rejections.get_or_create(&vec![("reason", reason.to_owned())]);
        }
        let node_banned = Gauge::default();
        registry.register(
            "node_banned",
            "1 while the server refuses this node as banned (`signetctl node unban` lifts it)",
            node_banned.clone(),
        );
        let sinks = Arc::new(SinkMetrics::register(registry));
        let workload = Arc::new(crate::workload::WorkloadMetrics::register(registry));
        Self {
            registry: root,
            earliest_expiry_timestamp,
            earliest_not_before_timestamp,
            node_expiry_timestamp,
            node_not_before_timestamp,
            server_errors,
            workload,
            certificates,
            entries,
            identities_without_certificate,
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
        let valid = state
            .identities
            .iter()
            .filter(|i| crate::rotation::serves(i.svid.certificate(), now))
            .count();
        self.identities_without_certificate.set(
            self.entries
                .get()
                .saturating_sub(i64::try_from(valid).unwrap_or(i64::MAX))
                .max(0),
        );
        let first = state
            .identities
            .iter()
            .map(|i| i.svid.certificate())
            .min_by_key(|c| c.not_after());
        self.earliest_expiry_timestamp
            .set(first.map_or(0, |c| unix(c.not_after())));
        self.earliest_not_before_timestamp
            .set(first.map_or(0, |c| unix(c.not_before())));
        let earliest = first
            .map(|c| c.not_after())
            .and_then(|t| t.duration_since(now).ok())
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.earliest_expiry_seconds.set(earliest);
        self.federated_bundles
            .set(i64::try_from(state.federated.len()).unwrap_or(i64::MAX));
    }

    /// The registration entries the agent should serve now (`n`: the rotator's current set;
    /// each pass reports it, so `signet_agent_identities_without_certificate` counts the
    /// entries missing from what is served).
    pub fn entries(&self, n: usize) {
        self.entries.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The node certificate served now (its validity, for the expiry gauges).
    pub fn node_certificate(&self, not_before: SystemTime, not_after: SystemTime) {
        self.node_not_before_timestamp.set(unix(not_before));
        self.node_expiry_timestamp.set(unix(not_after));
    }

    /// Counts one failed call to the server (`operation`: one of [`SERVER_OPERATIONS`]).
    pub fn server_error(&self, operation: &'static str, e: &crate::ca::CaError) {
        self.server_errors
            .get_or_create(&server_error_labels(operation, e.reason()))
            .inc();
    }

    /// Counts one failed call to the server that failed on this node (a key, a bad answer).
    pub fn local_error(&self, operation: &'static str) {
        self.server_errors
            .get_or_create(&server_error_labels(operation, "local"))
            .inc();
    }

    /// One line per sink that fails, is stuck or refused something (see
    /// [`crate::sinks::health::SinkHealth`]).
    pub fn sink_problems(&self) -> Vec<String> {
        self.sinks.health.problems(self.clock.now())
    }

    /// The exposition in `format`, the scrape-time gauges refreshed first.
    pub fn encode(&self, format: Format) -> String {
        self.refresh();
        signet_runtime::metrics::encode(&self.registry, format)
    }
}

/// The operations of `signet_agent_server_errors_total`.
pub const SERVER_OPERATIONS: [&str; 4] = ["connect", "renew_node", "sync", "sign"];
/// Its reasons ([`crate::ca::CaError::reason`], and `local`).
pub const SERVER_ERROR_REASONS: [&str; 6] = [
    "unavailable",
    "busy",
    "refused",
    "banned",
    "invalid_answer",
    "local",
];
/// The reasons of `signet_agent_crl_rejections_total`.
const CRL_REJECTIONS: [&str; 5] = [
    "bad_signature",
    "unknown_issuer",
    "mismatch",
    "malformed",
    "not_newer",
];

fn server_error_labels(operation: &'static str, reason: &'static str) -> Labels {
    vec![
        ("operation", operation.to_owned()),
        ("reason", reason.to_owned()),
    ]
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
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
        assert!(
            m.encode(Format::Text)
                .contains("signet_agent_certificates 0")
        );
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
        let text = m.encode(Format::OpenMetrics);
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
        let expires = t0 + Duration::from_secs(120);
        assert!(
            text.contains(&format!(
                "signet_agent_workload_certificate_earliest_expiry_timestamp_seconds {}",
                unix(expires)
            )),
            "{text}"
        );
        assert!(
            text.contains("signet_agent_node_certificate_expiry_timestamp_seconds 0"),
            "{text}"
        );
        m.node_certificate(t0, expires);
        m.server_error(
            "sync",
            &crate::ca::CaError::Unavailable("connection refused".into()),
        );
        let text = m.encode(Format::Text);
        assert!(
            text.contains(&format!(
                "signet_agent_node_certificate_expiry_timestamp_seconds {}",
                unix(expires)
            )),
            "{text}"
        );
        assert!(
            text.contains(
                "signet_agent_server_errors_total{operation=\"sync\",reason=\"unavailable\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "signet_agent_server_errors_total{operation=\"sign\",reason=\"refused\"} 0"
            ),
            "{text}"
        );
        assert!(text.contains("signet_agent_build_info{"), "{text}");
    }

    /// The expiry gauges follow the next certificate when the earliest one expires; this one
    /// counts the entries left without any: expired, and never signed.
    #[test]
    fn counts_entries_left_without_a_valid_certificate() {
        let (tx, rx) = channel();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = Arc::new(FakeClock::at(t0));
        let m = Metrics::new(rx, clock.clone());
        let value = |m: &Metrics| {
            let text = m.encode(Format::Text);
            text.lines()
                .find_map(|l| l.strip_prefix("signet_agent_identities_without_certificate "))
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("no gauge in:\n{text}"))
        };
        assert_eq!(value(&m), "0", "no entries known yet");
        let id = |entry: &str, secs| Identity {
            entry_id: entry.into(),
            selectors: vec![Selector::Uid(1)],
            svid: Arc::new(crate::testing::self_signed_svid(
                "spiffe://example.org/a",
                t0,
                Duration::from_secs(secs),
            )),
            federates_with: vec![],
        };
        tx.send_replace(Arc::new(AgentState {
            identities: vec![id("a", 180), id("b", 600)],
            ..AgentState::default()
        }));
        m.entries(2);
        assert_eq!(value(&m), "0");
        assert!(
            m.encode(Format::Text)
                .contains("\nsignet_agent_entries 2\n")
        );
        // A third entry, not signed yet.
        m.entries(3);
        assert_eq!(value(&m), "1");
        // The 3-minute certificate expires before the rotator withdraws it: counted at once.
        clock.advance(Duration::from_secs(180));
        assert_eq!(value(&m), "2");
        // Withdrawn: the earliest expiry moves on to the next certificate, the count stays.
        tx.send_replace(Arc::new(AgentState {
            identities: vec![id("b", 600)],
            ..AgentState::default()
        }));
        let text = m.encode(Format::Text);
        assert!(
            text.contains(&format!(
                "signet_agent_workload_certificate_earliest_expiry_timestamp_seconds {}",
                unix(t0 + Duration::from_secs(600))
            )),
            "{text}"
        );
        assert_eq!(value(&m), "2");
        // Entries removed: never below zero while the state catches up.
        m.entries(0);
        assert_eq!(value(&m), "0");
    }
}
