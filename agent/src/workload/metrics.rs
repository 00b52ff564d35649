//! Counters of the Workload API's defences, registered with the agent's metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Default, Clone)]
pub struct WorkloadMetrics {
    /// Failed `accept` calls (EMFILE, ENFILE, …).
    pub accept_errors: Counter,
    /// Connections closed at once because `max_connections` were open.
    pub refused_total_cap: Counter,
    /// Connections closed at once because their uid held `max_connections_per_uid`.
    pub refused_uid_cap: Counter,
    /// Connections closed for sending no request in time.
    pub timed_out: Counter,
    /// Connections closed because another process than the peer wrote on them.
    pub foreign_writers: Counter,
    /// Requests refused because the calling process could not be attested (gone, pid
    /// reused, pod lookup failed).
    pub attestation_failures: Counter,
    /// Open connections.
    pub connections: Gauge,
    /// JWT-SVIDs handed out by `FetchJWTSVID`, by `source`: `cache`, `minted`, `stale` (served
    /// from the cache while the server could not mint).
    pub jwt_svids: Family<Labels, Counter>,
    /// `ValidateJWTSVID` calls by `result`: `valid`, or the reason a token was refused.
    pub jwt_validations: Family<Labels, Counter>,
    /// Open SDS streams.
    pub sds_streams: Gauge,
    /// SDS responses sent.
    pub sds_responses: Counter,
    /// SDS requests by `kind`: `subscribe` (first request or new names), `ack`, `nack`,
    /// `stale` (a nonce other than the last one sent: ignored).
    pub sds_requests: Family<Labels, Counter>,
    /// SDS streams and fetches refused or ended with an error, by `reason`.
    pub sds_refused: Family<Labels, Counter>,
    /// SDS validation contexts sent without CRLs although the agent holds some, because they
    /// did not cover every CA or one was past (or near) its nextUpdate.
    pub sds_crls_withheld: Counter,
}

/// Metric labels.
pub type Labels = Vec<(&'static str, String)>;

impl WorkloadMetrics {
    /// New counters, registered under `workload_api_*`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("workload_api");
        r.register(
            "accept_errors",
            "Failed accept calls on the Workload API socket",
            m.accept_errors.clone(),
        );
        r.register(
            "refused_connection_cap",
            "Connections closed at once: max_connections reached",
            m.refused_total_cap.clone(),
        );
        r.register(
            "refused_uid_cap",
            "Connections closed at once: the uid holds max_connections_per_uid",
            m.refused_uid_cap.clone(),
        );
        r.register(
            "timed_out",
            "Connections closed for sending no request within the first-request or idle timeout",
            m.timed_out.clone(),
        );
        r.register(
            "foreign_writers",
            "Connections closed because a process other than the connected peer wrote on them",
            m.foreign_writers.clone(),
        );
        r.register(
            "attestation_failures",
            "Requests refused because the caller could not be attested",
            m.attestation_failures.clone(),
        );
        r.register(
            "connections",
            "Open Workload API connections",
            m.connections.clone(),
        );
        r.register(
            "jwt_svids",
            "JWT-SVIDs handed out by FetchJWTSVID, by source (cache, minted, stale)",
            m.jwt_svids.clone(),
        );
        r.register(
            "jwt_validations",
            "ValidateJWTSVID calls by result (valid, or why the token was refused)",
            m.jwt_validations.clone(),
        );
        r.register("sds_streams", "Open SDS streams", m.sds_streams.clone());
        r.register(
            "sds_responses",
            "SDS responses sent",
            m.sds_responses.clone(),
        );
        r.register(
            "sds_requests",
            "SDS requests by kind (subscribe, ack, nack, stale)",
            m.sds_requests.clone(),
        );
        r.register(
            "sds_refused",
            "SDS streams and fetches refused or ended with an error, by reason",
            m.sds_refused.clone(),
        );
        r.register(
            "sds_crls_withheld",
            "SDS validation contexts sent without the CRLs the agent holds (incomplete or stale)",
            m.sds_crls_withheld.clone(),
        );
        m.preregister();
        m
    }

    /// Every label of the bounded families at zero, so they are present from start-up.
    fn preregister(&self) {
        let families: [(&Family<Labels, Counter>, &'static str, &[&str]); 4] = [
            (&self.jwt_svids, "source", &["cache", "minted", "stale"]),
            (
                &self.jwt_validations,
                "result",
                &[
                    "valid",
                    "expired",
                    "audience",
                    "unknown_key",
                    "signature",
                    "alg",
                    "claims",
                    "malformed",
                    "trust_domain",
                    "refused",
                ],
            ),
            (
                &self.sds_requests,
                "kind",
                &["subscribe", "ack", "nack", "stale"],
            ),
            (
                &self.sds_refused,
                "reason",
                &[
                    "no_identity",
                    "not_served",
                    "no_node",
                    "type_url",
                    "too_many_names",
                    "all_needs_spiffe_validator",
                    "no_first_request",
                    "stream_cap",
                    "not_attested",
                    "unreadable",
                    "other",
                ],
            ),
        ];
        for (family, key, values) in families {
            for v in values {
                let _ = family.get_or_create(&vec![(key, (*v).to_owned())]);
            }
        }
    }
}
