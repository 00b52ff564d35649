//! The bridge's Prometheus metrics (`/metrics` on `--health-addr`). Each family is defined
//! beside the code that moves it ([`crate::leader::LeaderMetrics`]) and registered here, so
//! this module depends on them, never the other way round.

use prometheus_client::registry::Registry;

use crate::leader::LeaderMetrics;

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
        let mut registry = Registry::with_prefix("signet_k8s");
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
        Self { registry, leader }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
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

    #[test]
    fn counters_are_present_at_zero_and_the_gauge_names_the_identity() {
        let m = Metrics::new();
        m.leader
            .leader
            .get_or_create(&vec![("identity", "signet-k8s-0".to_owned())])
            .set(1);
        let text = m.encode();
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
