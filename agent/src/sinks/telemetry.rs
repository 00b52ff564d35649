//! Where the sinks' workers report: the health table `/readyz` reads ([`SinkHealth`]) and the
//! `signet_agent_sink_*` metrics ([`SinkMetrics`]), behind one [`Telemetry`] handle.
//!
//! The sink metrics are defined here, beside the sinks, and registered into the agent's
//! registry by [`crate::metrics::Metrics`], which holds them as it holds the Workload API's: the
//! sinks never depend on the agent-wide metrics.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::sinks::health::{SinkHealth, SinkReport, SinkState};
use crate::sinks::{Applied, SinkError, SinkErrorKind};

/// Labels of the per-sink metrics: `sink`, and for failures `reason`.
pub type SinkLabels = Vec<(&'static str, String)>;

/// The sinks' metrics and health table.
#[derive(Default)]
pub struct SinkMetrics {
    /// Completed sink deliveries and removals, by sink.
    pub deliveries: Family<SinkLabels, Counter>,
    /// Failed sink attempts, by sink and reason (`error`, `refused`, `timeout`).
    pub failures: Family<SinkLabels, Counter>,
    /// Things a sink refused to touch and left alone (a planted link), by sink.
    pub warnings: Family<SinkLabels, Counter>,
    /// 1 while a sink holds what it should, 0 while it is failing or stuck.
    pub healthy: Family<SinkLabels, Gauge>,
    /// What each sink is doing, for `/readyz` and the logs.
    pub health: SinkHealth,
}

impl SinkMetrics {
    /// Registers the `sink_*` metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "sink_deliveries",
            "Completed sink deliveries and removals",
            m.deliveries.clone(),
        );
        registry.register(
            "sink_failures",
            "Failed sink attempts (reason: error, refused, timeout)",
            m.failures.clone(),
        );
        registry.register(
            "sink_warnings",
            "Entries a sink found planted (links it did not create) and left alone",
            m.warnings.clone(),
        );
        registry.register(
            "sink_healthy",
            "1 while the sink holds what it should, 0 while it fails or is stuck",
            m.healthy.clone(),
        );
        m
    }
}

/// Where workers report: the health table and, when present, the metrics.
#[derive(Clone)]
pub struct Telemetry {
    health: SinkHealth,
    metrics: Option<Arc<SinkMetrics>>,
}

impl Telemetry {
    /// Reporting to `metrics` and its health table (None: to a table of its own).
    pub fn new(metrics: Option<Arc<SinkMetrics>>) -> Self {
        Self {
            health: metrics
                .as_ref()
                .map(|m| m.health.clone())
                .unwrap_or_default(),
            metrics,
        }
    }

    pub fn health(&self) -> &SinkHealth {
        &self.health
    }

    fn labels(name: &str) -> SinkLabels {
        vec![("sink", name.to_owned())]
    }

    fn set_healthy(&self, name: &str, ok: bool) {
        if let Some(m) = &self.metrics {
            m.healthy
                .get_or_create(&Self::labels(name))
                .set(i64::from(ok));
        }
    }

    pub(super) fn register(&self, name: &str, now: SystemTime) {
        self.health.with(|h| {
            h.insert(
                name.to_owned(),
                SinkReport {
                    state: SinkState::Idle,
                    since: now,
                    busy_since: None,
                    last_error: None,
                    last_error_kind: None,
                    warnings: Vec::new(),
                    failures: 0,
                },
            );
        });
        self.set_healthy(name, true);
        // The sink's counters, at zero until they move.
        if let Some(m) = &self.metrics {
            let _ = m.deliveries.get_or_create(&Self::labels(name));
            let _ = m.warnings.get_or_create(&Self::labels(name));
            for kind in SinkErrorKind::ALL {
                let mut l = Self::labels(name);
                l.push(("reason", kind.label().to_owned()));
                let _ = m.failures.get_or_create(&l);
            }
        }
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut SinkReport)) {
        self.health.with(|h| {
            if let Some(r) = h.get_mut(name) {
                f(r);
            }
        });
    }

    pub(super) fn busy(&self, name: &str, now: SystemTime) {
        self.update(name, |r| r.busy_since = Some(now));
    }

    pub(super) fn idle(&self, name: &str, now: SystemTime) {
        self.update(name, |r| {
            if r.state != SinkState::Idle {
                r.since = now;
            }
            r.state = SinkState::Idle;
            r.failures = 0;
            r.busy_since = None;
        });
        self.set_healthy(name, true);
    }

    pub(super) fn succeeded(&self, name: &str, what: &str, applied: &Applied, now: SystemTime) {
        for w in &applied.warnings {
            tracing::warn!(sink = %name, warning = %w, "sink: found entries the agent did not create; nothing they point at was touched");
        }
        if let Some(m) = &self.metrics {
            m.deliveries.get_or_create(&Self::labels(name)).inc();
            if !applied.warnings.is_empty() {
                m.warnings
                    .get_or_create(&Self::labels(name))
                    .inc_by(applied.warnings.len() as u64);
            }
        }
        self.update(name, |r| {
            if r.state == SinkState::Failing {
                tracing::info!(sink = %name, after = r.failures, "sink recovered");
            }
            if r.state != SinkState::Healthy {
                r.since = now;
            }
            r.state = SinkState::Healthy;
            r.busy_since = None;
            r.failures = 0;
            r.warnings = applied.warnings.clone();
        });
        self.set_healthy(name, true);
        tracing::debug!(sink = %name, what, "sink up to date");
    }

    pub(super) fn failed(
        &self,
        name: &str,
        what: &str,
        e: &SinkError,
        failures: u32,
        retry_in: Duration,
        now: SystemTime,
    ) {
        let reason = e.kind.label();
        match e.kind {
            SinkErrorKind::Failed => {
                tracing::warn!(sink = %name, what, reason, error = %e, failures, ?retry_in, "sink failed; will retry")
            }
            SinkErrorKind::Refused | SinkErrorKind::Timeout => {
                tracing::error!(sink = %name, what, reason, error = %e, failures, ?retry_in, "sink failed; will retry")
            }
        }
        if let Some(m) = &self.metrics {
            let mut l = Self::labels(name);
            l.push(("reason", reason.to_owned()));
            m.failures.get_or_create(&l).inc();
        }
        self.update(name, |r| {
            if r.state != SinkState::Failing {
                r.since = now;
            }
            r.state = SinkState::Failing;
            r.busy_since = None;
            r.failures = failures;
            r.last_error = Some(e.reason.clone());
            r.last_error_kind = Some(e.kind);
        });
        self.set_healthy(name, false);
    }
}
