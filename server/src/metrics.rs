//! Prometheus metrics, served as text on `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssuanceLabels {
    /// `native`, `istio`, `admin`, `self`.
    pub api: &'static str,
    /// `issued`, `invalid_argument`, `unauthenticated`, `permission_denied`, `unavailable`, `internal`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// `per_caller`, `per_source`, `requests`, `streams`, `connections`, `http_connections`.
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FederationFetchLabels {
    /// A federation relationship's trust domain (operators create them: bounded).
    pub trust_domain: String,
    /// `changed`, `unchanged`, `refused` (a document the rules refuse), or the fetch's failure
    /// (`connect`, `tls`, `spiffe_id`, `http`, `too_large`, `timeout`, `document`, `empty`, …).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegistrationLabels {
    /// `changed`, `unchanged`, or the refusal (`invalid_argument`, `permission_denied`,
    /// `failed_precondition`, `unauthenticated`, `unavailable`, `internal`, …).
    pub outcome: &'static str,
}

/// The outcomes of `signet_registration_syncs_total` shown at zero before the first sync.
const REGISTRATION_OUTCOMES: [&str; 6] = [
    "changed",
    "unchanged",
    "invalid_argument",
    "permission_denied",
    "failed_precondition",
    "unauthenticated",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrustDomainLabels {
    pub trust_domain: String,
}

pub struct Metrics {
    registry: Registry,
    /// Bundle fetches of federation relationships, by trust domain and outcome.
    pub federation_fetches: Family<FederationFetchLabels, Counter>,
    /// Unix time the bundle held for a trust domain last changed.
    pub federation_bundle_updated: Family<TrustDomainLabels, Gauge>,
    /// Unix time of the last accepted fetch (changed or not) per trust domain.
    pub federation_last_success: Family<TrustDomainLabels, Gauge>,
    pub issuances: Family<IssuanceLabels, Counter>,
    pub issuance_seconds: Histogram,
    pub ledger_batch_size: Histogram,
    pub ledger_commit_seconds: Histogram,
    pub ledger_rows: Counter,
    pub audit_dropped: Gauge,
    /// Requests and connections refused by a limit.
    pub limited: Family<LimitLabels, Counter>,
    /// Issuances waiting for a ledger commit.
    pub ledger_pending: Gauge,
    /// Failed ledger commits.
    pub ledger_failures: Counter,
    /// Audit events folded into an aggregate event instead of being recorded one by one.
    pub audit_aggregated: Gauge,
    /// Open connections on the gRPC listener (TLS handshakes done).
    pub connections_open: Gauge,
    /// Live CA key slots the database holds that failed vetting (trusted nowhere).
    pub ca_slots_rejected: Gauge,
    /// 1 while the ledger's head does not extend the last signed checkpoint (a rollback:
    /// `checkpoint.rs`), else 0.
    pub ledger_rollback: Gauge,
    /// Registration syncs (`signet.ca.v1.Registration/SyncOwnedEntries`) by outcome.
    pub registration_syncs: Family<RegistrationLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("signet");
        let issuances = Family::<IssuanceLabels, Counter>::default();
        registry.register(
            "issuances",
            "Certificate requests by API and outcome",
            issuances.clone(),
        );
        let issuance_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "issuance_duration_seconds",
            "Time from request to committed certificate",
            issuance_seconds.clone(),
        );
        let ledger_batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register(
            "ledger_batch_size",
            "Certificates committed per ledger transaction (group commit)",
            ledger_batch_size.clone(),
        );
        let ledger_commit_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "ledger_commit_duration_seconds",
            "Duration of one ledger transaction",
            ledger_commit_seconds.clone(),
        );
        let ledger_rows = Counter::default();
        registry.register(
            "ledger_rows",
            "Certificates committed to the ledger by this process",
            ledger_rows.clone(),
        );
        let audit_dropped = Gauge::default();
        registry.register(
            "audit_events_dropped",
            "Audit events that could not be recorded (queue full or database error)",
            audit_dropped.clone(),
        );
        let limited = Family::<LimitLabels, Counter>::default();
        registry.register(
            "limited",
            "Requests and connections refused by a limit ([limits])",
            limited.clone(),
        );
        let ledger_pending = Gauge::default();
        registry.register(
            "ledger_pending",
            "Issuances waiting for a ledger commit",
            ledger_pending.clone(),
        );
        let ledger_failures = Counter::default();
        registry.register(
            "ledger_commit_failures",
            "Ledger transactions that failed (their certificates were not issued)",
            ledger_failures.clone(),
        );
        let audit_aggregated = Gauge::default();
        registry.register(
            "audit_events_aggregated",
            "Audit events folded into aggregate events (floods of similar refusals)",
            audit_aggregated.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "grpc_connections_open",
            "Open connections on the gRPC listener (limits.max_connections caps them)",
            connections_open.clone(),
        );
        let ca_slots_rejected = Gauge::default();
        registry.register(
            "ca_slots_rejected",
            "Live CA key slots in the database that fail vetting and are trusted nowhere (see signetctl ca status)",
            ca_slots_rejected.clone(),
        );
        let ledger_rollback = Gauge::default();
        registry.register(
            "ledger_rollback",
            "1 while the ledger head does not extend the last signed checkpoint (rows deleted or \
             rewritten, the head moved back): no checkpoint is signed",
            ledger_rollback.clone(),
        );
        let federation_fetches = Family::<FederationFetchLabels, Counter>::default();
        registry.register(
            "federation_fetches",
            "Bundle fetches of federation relationships, by trust domain and outcome",
            federation_fetches.clone(),
        );
        let federation_bundle_updated = Family::<TrustDomainLabels, Gauge>::default();
        registry.register(
            "federation_bundle_updated_timestamp_seconds",
            "When the bundle held for a federated trust domain last changed (unix seconds)",
            federation_bundle_updated.clone(),
        );
        let federation_last_success = Family::<TrustDomainLabels, Gauge>::default();
        registry.register(
            "federation_last_success_timestamp_seconds",
            "When a federated trust domain's bundle endpoint last answered a document that was \
             accepted, changed or not (unix seconds); alert when it falls behind",
            federation_last_success.clone(),
        );
        let registration_syncs = Family::<RegistrationLabels, Counter>::default();
        registry.register(
            "registration_syncs",
            "Syncs of registrar-owned entries (the Kubernetes bridge's), by outcome: changed, \
             unchanged, or why it was refused",
            registration_syncs.clone(),
        );
        for outcome in REGISTRATION_OUTCOMES {
            let _ = registration_syncs.get_or_create(&RegistrationLabels { outcome });
        }
        Arc::new(Self {
            registry,
            registration_syncs,
            federation_fetches,
            federation_bundle_updated,
            federation_last_success,
            issuances,
            issuance_seconds,
            ledger_batch_size,
            ledger_commit_seconds,
            ledger_rows,
            audit_dropped,
            limited,
            ledger_pending,
            ledger_failures,
            audit_aggregated,
            connections_open,
            ca_slots_rejected,
            ledger_rollback,
        })
    }

    /// Sets `signet_ca_slots_rejected` from a CA view's rejected slots (the live ones).
    pub fn ca_slots_rejected(&self, rejected: &[crate::ca::manager::RejectedSlot]) {
        let live = rejected.iter().filter(|r| r.state != "removed").count();
        self.ca_slots_rejected
            .set(i64::try_from(live).unwrap_or(i64::MAX));
    }

    pub fn observe_issuance(&self, api: &'static str, outcome: &'static str, took: Duration) {
        self.issuances
            .get_or_create(&IssuanceLabels { api, outcome })
            .inc();
        if outcome == "issued" {
            self.issuance_seconds.observe(took.as_secs_f64());
        }
    }

    /// Counts one registration sync by its outcome.
    pub fn registration_sync(&self, outcome: &'static str) {
        self.registration_syncs
            .get_or_create(&RegistrationLabels { outcome })
            .inc();
    }

    /// Counts one refusal by `limit`.
    pub fn limited(&self, limit: &'static str) {
        self.limited.get_or_create(&LimitLabels { limit }).inc();
    }

    pub fn observe_batch(&self, size: usize, took: Duration) {
        self.ledger_batch_size.observe(size as f64);
        self.ledger_commit_seconds.observe(took.as_secs_f64());
        self.ledger_rows.inc_by(size as u64);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
