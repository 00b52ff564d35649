//! The server's background tasks: the CA rotator's tick, the server's own TLS certificate
//! (issued like any other, renewed before expiry or at once when revoked), and publishing
//! internal counters to metrics. Each is a future that runs until it is dropped; `serve.rs`
//! spawns them under the server's one shutdown. Also `/readyz`'s check of the CA key slots.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::anyhow;

use crate::audit::AuditLog;
use crate::authn::AuthenticatedCaller;
use crate::ca::RequestedNames;
use crate::ca::manager::CaManager;
use crate::clock::Clock;
use crate::config::Config;
use crate::issuer::{IssueInput, Issuer};
use crate::limits::conn::ConnRegistry;
use crate::metrics::Metrics;
use crate::tls::{self, ServerCertResolver};

/// The rotator's loop: a manager tick every `interval` (±10%, so replicas spread out).
pub(super) async fn rotate(manager: Arc<CaManager>, clock: Arc<dyn Clock>, interval: Duration) {
    use signet_runtime::random::{Random, SystemRandom};
    let rng = SystemRandom::default();
    loop {
        tokio::time::sleep(signet_runtime::backoff::spread(interval, 0.1, rng.unit())).await;
        if let Err(e) = manager.tick(clock.now()).await {
            tracing::warn!(error = %e, "CA rotation tick failed; retrying on the next one");
        }
    }
}

/// The server's own DNS names and addresses: in its certificate, and in no other.
pub(super) fn server_names(cfg: &Config) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns_names = vec!["localhost".to_owned()];
    dns_names.extend(cfg.server_names.iter().cloned());
    let mut ips: Vec<IpAddr> = vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()];
    if !cfg.listen.ip().is_unspecified() && !ips.contains(&cfg.listen.ip()) {
        ips.push(cfg.listen.ip());
    }
    (dns_names, ips)
}

pub(super) struct ServerCert {
    pub(super) chain: Vec<Vec<u8>>,
    pub(super) not_before: SystemTime,
    pub(super) not_after: SystemTime,
}

pub(super) async fn issue_server_cert(
    issuer: &Issuer,
    cfg: &Config,
) -> anyhow::Result<(ServerCert, Vec<u8>)> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| anyhow!("server key: {e}"))?;
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .map_err(|e| anyhow!("server CSR: {e}"))?;
    let td = issuer.trust_domain();
    let id = td
        .id(crate::authn::SERVER_PATH)
        .map_err(|e| anyhow!("server SPIFFE ID: {e}"))?;
    let (dns_names, ips) = server_names(cfg);
    let caller = AuthenticatedCaller::server(td);
    let cert = issuer
        .issue(
            &caller,
            IssueInput {
                source: crate::policy::GrantSource::Caller,
                csr: csr.der().as_ref(),
                ttl_seconds: i64::try_from(cfg.ca.max_ttl.as_secs()).unwrap_or(86400),
                impersonate: None,
                request_id: "server-tls".into(),
                api: "self",
                extra_names: Some(RequestedNames {
                    uris: vec![id.to_string()],
                    dns_names,
                    ip_addresses: ips,
                    ..RequestedNames::default()
                }),
            },
        )
        .await
        .map_err(|e| anyhow!("issuing the server's TLS certificate: {e}"))?;
    Ok((
        ServerCert {
            chain: cert.chain,
            not_before: cert.not_before,
            not_after: cert.not_after,
        },
        key.serialize_der(),
    ))
}

/// Re-issues the server's TLS certificate at half its lifetime, or at once when `revoked` is
/// notified (the served certificate was revoked), retrying every 30 s on failure.
pub(super) async fn renew_server_cert(
    issuer: Arc<Issuer>,
    cfg: Config,
    resolver: Arc<ServerCertResolver>,
    not_before: SystemTime,
    mut not_after: SystemTime,
    revoked: Arc<tokio::sync::Notify>,
) {
    // Half of the remaining life from when it was issued (not from its backdated notBefore:
    // a certificate cut short by its issuer's notAfter would otherwise be renewed at once,
    // over and over), and never more often than once a second.
    let mut issued = issuer.now().max(not_before);
    loop {
        let left = not_after.duration_since(issued).unwrap_or_default();
        let wait = (issued + left / 2)
            .duration_since(issuer.now())
            .unwrap_or(Duration::ZERO)
            .max(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = revoked.notified() => {
                tracing::info!("the server's TLS certificate was revoked; replacing it now");
            }
        }
        match issue_server_cert(&issuer, &cfg).await {
            Ok((cert, key)) => match tls::certified_key(&cert.chain, &key) {
                Ok(ck) => {
                    resolver.replace(ck);
                    issued = issuer.now();
                    not_after = cert.not_after;
                    tracing::info!("renewed the server's TLS certificate");
                }
                Err(e) => {
                    tracing::error!(error = %e, "renewed server certificate unusable");
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "renewing the server's TLS certificate failed; retrying in 30s");
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
        }
    }
}

/// Publishes audit-drop counts, ledger progress and open connections to metrics, every second.
pub(super) async fn publish_metrics(
    audit: AuditLog,
    metrics: Arc<Metrics>,
    progress: Arc<crate::ledger::LedgerProgress>,
    conns: Arc<ConnRegistry>,
) {
    // The counters' totals so far (the audit log and the ledger count on their own).
    let (mut failures, mut dropped, mut aggregated) = (0, 0, 0);
    loop {
        let now = audit.dropped();
        metrics.audit_dropped.inc_by(now.saturating_sub(dropped));
        dropped = now;
        let now = audit.aggregated();
        metrics
            .audit_aggregated
            .inc_by(now.saturating_sub(aggregated));
        aggregated = now;
        metrics
            .ledger_pending
            .set(i64::try_from(progress.pending()).unwrap_or(i64::MAX));
        metrics
            .connections_open
            .set(i64::try_from(conns.len()).unwrap_or(i64::MAX));
        let now = progress.failures();
        metrics.ledger_failures.inc_by(now.saturating_sub(failures));
        failures = now;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `/readyz`'s check of the CA key slots ([`crate::ca::manager::CaView::readiness`]).
pub(super) struct CaReadiness(pub(super) Arc<CaManager>);

impl crate::http::ReadinessCheck for CaReadiness {
    fn name(&self) -> &'static str {
        "ca_slots"
    }

    fn check(&self) -> Result<(), crate::http::NotReady> {
        self.0
            .view()
            .readiness()
            .map_err(crate::http::NotReady::new)
    }
}
