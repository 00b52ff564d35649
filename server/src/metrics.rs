//! Prometheus metrics, served on `/metrics` in the format the scraper asks for
//! ([`signet_runtime::metrics`]: OpenMetrics or the text format 0.0.4), with the process
//! metrics and `signet_server_build_info`.
//!
//! Counters are present at zero from start-up for every label set of their bounded label sets
//! (so `rate()` works and no alert needs `absent()`). The expiry and progress gauges
//! (`*_timestamp_seconds`: CA keys, the server's certificate, CRLs, the last checkpoint) are
//! computed at scrape time from what the server holds ([`Watched`]), so they are never stale.

use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, SystemTime};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use signet_runtime::metrics::Format;

use crate::bundle::BundleHandle;
use crate::ca::manager::CaManager;
use crate::checkpoint::Checkpointer;
use crate::tls::ServerCertResolver;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssuanceLabels {
    /// `native`, `istio`, `admin`, `self`.
    pub api: &'static str,
    /// `issued`, `invalid_argument`, `unauthenticated`, `permission_denied`, `unavailable`, `internal`.
    pub outcome: &'static str,
}

/// The APIs of `signet_issuances_total` and `signet_issuance_refusals_total`.
pub const ISSUANCE_APIS: [&str; 7] = [
    "native",
    "istio",
    "admin",
    "self",
    "node",
    "native_jwt",
    "node_jwt",
];

/// The outcomes of `signet_issuances_total` ([`crate::issuer::IssuerError::outcome`]).
const ISSUANCE_OUTCOMES: [&str; 7] = [
    "issued",
    "invalid_argument",
    "unauthenticated",
    "permission_denied",
    "resource_exhausted",
    "unavailable",
    "internal",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// As [`IssuanceLabels::api`].
    pub api: &'static str,
    /// [`crate::issuer::IssuerError::reason`].
    pub reason: &'static str,
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

/// An `outcome` label (registration syncs, node attestations).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegistrationLabels {
    /// `changed`, `unchanged`, `attested`, or the refusal (`invalid_argument`, `permission_denied`,
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

/// The limits of `signet_limited_total` (every value [`Metrics::limited`] is called with).
const LIMITS: [&str; 7] = [
    "per_caller",
    "per_source",
    "per_source_in_flight",
    "requests",
    "streams",
    "connections",
    "http_connections",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrustDomainLabels {
    pub trust_domain: String,
}

pub struct Metrics {
    /// The process metrics and `signet_server_build_info`, with the `signet_` families in a
    /// sub-registry.
    registry: Registry,
    /// Bundle fetches of federation relationships, by trust domain and outcome.
    pub federation_fetches: Family<FederationFetchLabels, Counter>,
    /// Unix time the bundle held for a trust domain last changed.
    pub federation_bundle_updated: Family<TrustDomainLabels, Gauge>,
    /// Unix time of the last accepted fetch (changed or not) per trust domain.
    pub federation_last_success: Family<TrustDomainLabels, Gauge>,
    pub issuances: Family<IssuanceLabels, Counter>,
    /// Refused or failed issuances, by API and bounded reason.
    pub refusals: Family<RefusalLabels, Counter>,
    /// Node attestations (`Attest`), by outcome: `attested` or the refusal's reason.
    pub attestations: Family<RegistrationLabels, Counter>,
    pub issuance_seconds: Histogram,
    pub ledger_batch_size: Histogram,
    pub ledger_commit_seconds: Histogram,
    pub ledger_rows: Counter,
    pub audit_dropped: Counter,
    /// Requests and connections refused by a limit.
    pub limited: Family<LimitLabels, Counter>,
    /// Issuances waiting for a ledger commit.
    pub ledger_pending: Gauge,
    /// Failed ledger commits.
    pub ledger_failures: Counter,
    /// Audit events folded into an aggregate event instead of being recorded one by one.
    pub audit_aggregated: Counter,
    /// Open connections on the gRPC listener (TLS handshakes done).
    pub connections_open: Gauge,
    /// Live CA key slots the database holds that failed vetting (trusted nowhere).
    pub ca_slots_rejected: Gauge,
    /// 1 while the ledger's head does not extend the last signed checkpoint (a rollback:
    /// `checkpoint.rs`), else 0.
    pub ledger_rollback: Gauge,
    /// Registration syncs (`signet.ca.v1.Registration/SyncOwnedEntries`) by outcome.
    pub registration_syncs: Family<RegistrationLabels, Counter>,
    /// Unix time of this process's last successful ledger commit (0 before the first).
    pub ledger_last_commit: Gauge,
    /// The ledger head's sequence number, as the checkpointer last read it.
    pub ledger_head_sequence: Gauge,
    /// The CA keys, the server certificate, the CRLs and the checkpoints, read at scrape.
    watched: Arc<Watched>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut root =
            signet_runtime::metrics::standard_registry("server", env!("CARGO_PKG_VERSION"));
        let registry = root.sub_registry_with_prefix("signet");
        let issuances = Family::<IssuanceLabels, Counter>::default();
        registry.register(
            "issuances",
            "Certificate requests by API and outcome",
            issuances.clone(),
        );
        for api in ISSUANCE_APIS {
            for outcome in ISSUANCE_OUTCOMES {
                let _ = issuances.get_or_create(&IssuanceLabels { api, outcome });
            }
        }
        let refusals = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "issuance_refusals",
            "Issuances refused or failed, by API and reason: \
             authn_failed, invalid_request, not_authorized, rate_limited, ca_unavailable, \
             ledger_overloaded, ledger_not_recorded, store_unavailable, store_error, internal",
            refusals.clone(),
        );
        for api in ISSUANCE_APIS {
            for reason in crate::issuer::IssuerError::REASONS {
                let _ = refusals.get_or_create(&RefusalLabels { api, reason });
            }
        }
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
        let audit_dropped = Counter::default();
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
        for limit in LIMITS {
            let _ = limited.get_or_create(&LimitLabels { limit });
        }
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
        let audit_aggregated = Counter::default();
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
        let attestations = Family::<RegistrationLabels, Counter>::default();
        registry.register(
            "node_attestations",
            "Node attestations (join token or Kubernetes service-account token), by outcome: \
             attested, or the reason it was refused (as signet_issuance_refusals_total's)",
            attestations.clone(),
        );
        for outcome in ["attested"]
            .into_iter()
            .chain(crate::issuer::IssuerError::REASONS)
        {
            let _ = attestations.get_or_create(&RegistrationLabels { outcome });
        }
        let ledger_last_commit = Gauge::default();
        registry.register(
            "ledger_last_commit_timestamp_seconds",
            "When this process last committed a ledger transaction (unix seconds; 0 before the \
             first): with signet_ledger_pending above 0, its age says the ledger is stuck",
            ledger_last_commit.clone(),
        );
        let ledger_head_sequence = Gauge::default();
        registry.register(
            "ledger_head_sequence",
            "The ledger head's sequence number (rows of every replica), as last read by this \
             server's checkpointer",
            ledger_head_sequence.clone(),
        );
        let watched = Arc::new(Watched::default());
        registry.register_collector(Box::new(watched.clone()));
        Arc::new(Self {
            registry: root,
            refusals,
            attestations,
            ledger_last_commit,
            ledger_head_sequence,
            watched,
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

    /// Counts one refusal of an issuance or attestation.
    pub fn refusal(&self, api: &'static str, reason: &'static str) {
        self.refusals
            .get_or_create(&RefusalLabels { api, reason })
            .inc();
    }

    /// Counts one node attestation by its outcome (`attested`, or the refusal's reason).
    pub fn attestation(&self, outcome: &'static str) {
        self.attestations
            .get_or_create(&RegistrationLabels { outcome })
            .inc();
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

    /// One committed ledger transaction of `size` rows that took `took`, at `now`.
    pub fn observe_batch(&self, size: usize, took: Duration, now: SystemTime) {
        self.ledger_batch_size.observe(size as f64);
        self.ledger_commit_seconds.observe(took.as_secs_f64());
        self.ledger_rows.inc_by(size as u64);
        self.ledger_last_commit.set(unix(now));
    }

    /// From now on, scrapes report the expiry of `sources`' CA keys, server certificate and
    /// CRLs, and its last checkpoint (held weakly: they hold these metrics).
    pub fn watch(&self, sources: Sources) {
        *self
            .watched
            .sources
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(WeakSources {
            ca: Arc::downgrade(&sources.ca),
            bundle: sources.bundle,
            server_cert: Arc::downgrade(&sources.server_cert),
            checkpoints: Arc::downgrade(&sources.checkpoints),
        });
    }

    /// The exposition in `format`.
    pub fn encode(&self, format: Format) -> String {
        signet_runtime::metrics::encode(&self.registry, format)
    }
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// What the scrape-time gauges are read from ([`Metrics::watch`]).
pub struct Sources {
    pub ca: Arc<CaManager>,
    pub bundle: BundleHandle,
    pub server_cert: Arc<ServerCertResolver>,
    pub checkpoints: Arc<Checkpointer>,
}

struct WeakSources {
    ca: Weak<CaManager>,
    bundle: BundleHandle,
    server_cert: Weak<ServerCertResolver>,
    checkpoints: Weak<Checkpointer>,
}

/// The collector of the scrape-time gauges; reports nothing until [`Metrics::watch`].
#[derive(Default)]
struct Watched {
    sources: RwLock<Option<WeakSources>>,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watched")
    }
}

/// One gauge sample: labels and value.
type Sample = (Vec<(&'static str, String)>, i64);

impl Watched {
    /// The families: (name, help, samples).
    fn families(&self) -> Vec<(&'static str, &'static str, Vec<Sample>)> {
        let guard = self
            .sources
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(s) = guard.as_ref() else {
            return Vec::new();
        };
        let mut key_expiry = Vec::new();
        let mut key_start = Vec::new();
        if let Some(ca) = s.ca.upgrade() {
            for slot in ca.view().slots.iter().map(|i| &i.slot) {
                if slot.state == crate::ca::rotator::State::Removed {
                    continue;
                }
                let labels = vec![
                    ("key_id", slot.id.clone()),
                    ("kind", slot.kind.as_str().to_owned()),
                    ("state", slot.state.as_str().to_owned()),
                ];
                key_start.push((labels.clone(), unix(slot.not_before)));
                key_expiry.push((labels, unix(slot.not_after)));
            }
        }
        let mut crl_next = Vec::new();
        let mut crl_this = Vec::new();
        for crl in &s.bundle.current().crls {
            let labels = vec![("key_id", crl.key_id.clone())];
            crl_next.push((labels.clone(), crl.next_update));
            crl_this.push((labels, crl.this_update));
        }
        let mut server_expiry = Vec::new();
        let mut server_start = Vec::new();
        if let Some((not_before, not_after)) =
            s.server_cert.upgrade().and_then(|r| r.leaf_validity())
        {
            server_start.push((Vec::new(), unix(not_before)));
            server_expiry.push((Vec::new(), unix(not_after)));
        }
        let mut checkpoint_time = Vec::new();
        let mut checkpoint_seq = Vec::new();
        if let Some(latest) = s.checkpoints.upgrade().and_then(|c| c.latest()) {
            let head = &latest.checkpoint.head;
            checkpoint_time.push((Vec::new(), head.time));
            checkpoint_seq.push((Vec::new(), i64::try_from(head.seq).unwrap_or(i64::MAX)));
        }
        vec![
            (
                "ca_key_expiry_timestamp_seconds",
                "notAfter of each CA key's certificate that is not removed (unix seconds), by \
                 key id, kind (root, intermediate, jwt) and state (prepared, active, retired).",
                key_expiry,
            ),
            (
                "ca_key_not_before_timestamp_seconds",
                "notBefore of each CA key's certificate that is not removed (unix seconds): with \
                 the expiry, the fraction of its lifetime left.",
                key_start,
            ),
            (
                "server_certificate_expiry_timestamp_seconds",
                "notAfter of the server's own TLS certificate served now (unix seconds; renewed \
                 at half its lifetime).",
                server_expiry,
            ),
            (
                "server_certificate_not_before_timestamp_seconds",
                "notBefore of the server's own TLS certificate served now (unix seconds).",
                server_start,
            ),
            (
                "crl_next_update_timestamp_seconds",
                "nextUpdate of the CRL published for each issuing CA key (unix seconds; a new \
                 one is signed at half its validity).",
                crl_next,
            ),
            (
                "crl_this_update_timestamp_seconds",
                "thisUpdate of the CRL published for each issuing CA key (unix seconds).",
                crl_this,
            ),
            (
                "checkpoint_timestamp_seconds",
                "When this server signed its latest ledger checkpoint (unix seconds; a \
                 checkpoint is signed only when the ledger head moved).",
                checkpoint_time,
            ),
            (
                "checkpoint_sequence",
                "The ledger sequence number the latest checkpoint covers: below \
                 signet_ledger_head_sequence while rows wait for the next checkpoint.",
                checkpoint_seq,
            ),
        ]
    }
}

impl Collector for Watched {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, samples) in self.families() {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            match samples.as_slice() {
                // One sample without labels: `name value`, not `name{} value`.
                [(labels, value)] if labels.is_empty() => {
                    ConstGauge::new(*value).encode(family)?;
                }
                _ => {
                    for (labels, value) in samples {
                        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authn::AuthnError;
    use crate::issuer::IssuerError;
    use crate::store::StoreError;

    #[test]
    fn bounded_families_are_present_at_zero_and_every_reason_is_listed() {
        let m = Metrics::new();
        let text = m.encode(Format::Text);
        for api in ISSUANCE_APIS {
            for reason in IssuerError::REASONS {
                let line = format!(
                    "signet_issuance_refusals_total{{api=\"{api}\",reason=\"{reason}\"}} 0"
                );
                assert!(text.contains(&line), "{line}");
            }
            let line = format!("signet_issuances_total{{api=\"{api}\",outcome=\"issued\"}} 0");
            assert!(text.contains(&line), "{line}");
        }
        for line in [
            "signet_audit_events_dropped_total 0",
            "signet_audit_events_aggregated_total 0",
            "signet_node_attestations_total{outcome=\"attested\"} 0",
            "signet_limited_total{limit=\"http_connections\"} 0",
            "signet_ledger_last_commit_timestamp_seconds 0",
            "signet_server_build_info{version=\"",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        // Nothing watched yet (the server calls `watch` before it serves): no expiry to report.
        assert!(
            !text.contains("signet_ca_key_expiry_timestamp_seconds"),
            "{text}"
        );
        let errors = [
            IssuerError::Unauthenticated(AuthnError::Missing),
            IssuerError::Invalid("csr".into()),
            IssuerError::Denied("no".into()),
            IssuerError::RateLimited {
                message: "slow down".into(),
                retry_after: Duration::from_secs(1),
            },
            IssuerError::CaNotValid("expired".into()),
            IssuerError::JwtKeyUnavailable("none".into()),
            IssuerError::LedgerOverloaded,
            IssuerError::Store(StoreError::Unavailable("down".into())),
            IssuerError::Store(StoreError::Database("x".into())),
            IssuerError::Internal {
                request_id: "r".into(),
            },
        ];
        for e in &errors {
            assert!(IssuerError::REASONS.contains(&e.reason()), "{e:?}");
        }
        m.refusal("istio", errors[0].reason());
        m.observe_batch(
            2,
            Duration::from_millis(1),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        );
        let text = m.encode(Format::OpenMetrics);
        assert!(
            text.contains(
                "signet_issuance_refusals_total{api=\"istio\",reason=\"authn_failed\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("signet_ledger_last_commit_timestamp_seconds 1800000000"),
            "{text}"
        );
        assert!(text.contains("signet_ledger_rows_total 2"), "{text}");
    }
}
