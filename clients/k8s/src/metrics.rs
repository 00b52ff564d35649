//! The bridge's Prometheus metrics (`/metrics` on `--metrics-addr`), served in the format the
//! scraper asks for ([`signet_runtime::metrics`]), with the process metrics and
//! `signet_k8s_build_info`. Each family is defined beside the code that moves it
//! ([`crate::leader::LeaderMetrics`]) and registered here, so this module depends on them,
//! never the other way round; the controllers' outcomes ([`reconciled`]) are counted in
//! process-wide families (the controllers run deep in modules that take no metrics handle).

use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use signet_runtime::clock::Clock;
use signet_runtime::metrics::Format;

use crate::leader::LeaderMetrics;

/// The controllers of `signet_k8s_reconciles_total{controller}`.
pub const CONTROLLERS: [&str; 7] = [
    "issuer",
    "cluster_issuer",
    "certificate_request",
    "certificate",
    "cluster_identity",
    "identity",
    "tenant",
];

type Labels = Vec<(&'static str, String)>;

/// Reconciles by controller and result, and when each controller last reconciled an object
/// without an error.
struct Reconciles {
    total: Family<Labels, Counter>,
    last_success: Family<Labels, Gauge>,
}

static RECONCILES: LazyLock<Reconciles> = LazyLock::new(|| {
    let r = Reconciles {
        total: Family::default(),
        last_success: Family::default(),
    };
    for controller in CONTROLLERS {
        for result in ["success", "error"] {
            let _ = r.total.get_or_create(&vec![
                ("controller", controller.to_owned()),
                ("result", result.to_owned()),
            ]);
        }
    }
    r
});

/// Counts one reconcile of `controller` (one of [`CONTROLLERS`]) by its result.
pub fn reconciled<T, E>(controller: &'static str, result: &Result<T, E>) {
    let outcome = if result.is_ok() { "success" } else { "error" };
    RECONCILES
        .total
        .get_or_create(&vec![
            ("controller", controller.to_owned()),
            ("result", outcome.to_owned()),
        ])
        .inc();
    if result.is_ok() {
        let now = signet_runtime::clock::unix(signet_runtime::clock::SystemClock.now());
        RECONCILES
            .last_success
            .get_or_create(&vec![("controller", controller.to_owned())])
            .set(now);
    }
}

pub struct Metrics {
    registry: Registry,
    /// Leader election: `signet_k8s_leader{identity}`, `signet_k8s_leader_transitions_total`,
    /// `signet_k8s_lease_renew_failures_total`.
    pub leader: LeaderMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = signet_runtime::metrics::standard_registry("k8s", env!("CARGO_PKG_VERSION"));
        let registry = root.sub_registry_with_prefix("signet_k8s");
        registry.register(
            "reconciles",
            "Reconciles by controller and result (success, error: an error retried with backoff)",
            RECONCILES.total.clone(),
        );
        registry.register(
            "last_reconcile_success_timestamp_seconds",
            "When each controller last reconciled an object without an error (unix seconds; \
             absent until the first)",
            RECONCILES.last_success.clone(),
        );
        let leader = LeaderMetrics::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader election Lease and runs the controllers, else 0",
            leader.leader.clone(),
        );
        registry.register(
            "leader_transitions",
            "Times this replica became the leader",
            leader.transitions.clone(),
        );
        registry.register(
            "lease_renew_failures",
            "Renewals of the leader election Lease that failed (error, timeout or conflict)",
            leader.renew_failures.clone(),
        );
        Self {
            registry: root,
            leader,
        }
    }

    /// The exposition in `format`.
    pub fn encode(&self, format: Format) -> String {
        signet_runtime::metrics::encode(&self.registry, format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_present_at_zero_and_the_gauge_names_the_identity() {
        let m = Metrics::new();
        m.leader
            .leader
            .get_or_create(&vec![("identity", "signet-k8s-0".to_owned())])
            .set(1);
        reconciled::<(), ()>("tenant", &Ok(()));
        let text = m.encode(Format::Text);
        assert!(
            text.contains(
                "signet_k8s_reconciles_total{controller=\"certificate\",result=\"error\"} 0"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "signet_k8s_last_reconcile_success_timestamp_seconds{controller=\"tenant\"} "
            ),
            "{text}"
        );
        assert!(text.contains("signet_k8s_build_info{"), "{text}");
        assert!(
            text.contains("signet_k8s_leader_transitions_total 0"),
            "{text}"
        );
        assert!(
            text.contains("signet_k8s_lease_renew_failures_total 0"),
            "{text}"
        );
        assert!(
            text.contains("signet_k8s_leader{identity=\"signet-k8s-0\"} 1"),
            "{text}"
        );
    }
}
