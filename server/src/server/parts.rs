//! Building the server's parts from its configuration, in dependency order: data directory,
//! store, the deployment's pinned values (`pins.rs`: a server configured for another
//! deployment stops here), CA key manager and bundle, ledger writer and audit log, policy and
//! issuer, the server's own TLS certificate, checkpoints, the mTLS configuration that follows
//! the CA, CRLs and the revoker. Nothing here serves or spawns a task of its own: `serve.rs`
//! does, under one shutdown.

use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{Context, anyhow};

use super::pins;
use super::setup::{connect_store, create_private_dir, redact_url};
use super::starting::StartupStatus;
use super::tasks::{issue_server_cert, server_names};
use crate::audit::AuditLog;
use crate::authn::jwt::JwtAuthenticator;
use crate::bundle::{Bundle, BundleHandle};
use crate::ca::manager::{CaManager, CaView};
use crate::ca::{RandomSerials, SerialSource};
use crate::checkpoint::{CheckpointKey, Checkpointer};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::crl::CrlPublisher;
use crate::issuer::{Issuer, IssuerParts};
use crate::ledger::{LedgerProgress, LedgerWriter};
use crate::limits::CallerLimits;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::revocation::Revoker;
use crate::store::Store;
use crate::tls::{self, ServerCertResolver};

/// Everything the listeners serve, built and wired.
pub(super) struct Parts {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) store: Arc<dyn Store>,
    pub(super) manager: Arc<CaManager>,
    pub(super) bundle: BundleHandle,
    pub(super) metrics: Arc<Metrics>,
    pub(super) ledger_progress: Arc<LedgerProgress>,
    pub(super) audit: AuditLog,
    pub(super) issuer: Arc<Issuer>,
    /// Entry creation applies the signing policy's reserved-name rules (`NodeAdminApi`).
    pub(super) entry_policy: Arc<Policy>,
    pub(super) server_cert: ServerCert,
    pub(super) checkpoints: Arc<Checkpointer>,
    /// The gRPC listener's TLS: the server certificate, client certificates of live CA keys.
    pub(super) tls_config: Arc<rustls::ServerConfig>,
    pub(super) crl_publisher: Arc<CrlPublisher>,
    pub(super) revoker: Arc<Revoker>,
    /// The active root's SHA-256 fingerprint, for the operator.
    pub(super) root_sha256: String,
    /// Federation relationships: their refresh loop and the admin API.
    pub(super) federation: Arc<crate::federation::relationships::Federation>,
}

/// The server's own TLS certificate as served, and what its renewal needs.
pub(super) struct ServerCert {
    pub(super) resolver: Arc<ServerCertResolver>,
    pub(super) not_before: SystemTime,
    pub(super) not_after: SystemTime,
    /// Told when the served certificate is revoked: it is then replaced at once.
    pub(super) revoked: Arc<tokio::sync::Notify>,
}

/// Builds every part, top-down, telling `status` (what `/readyz` says meanwhile) where it is.
pub(super) async fn build(cfg: &Config, status: &StartupStatus) -> anyhow::Result<Parts> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let serials: Arc<dyn SerialSource> = Arc::new(RandomSerials::default());
    let store = open_store(cfg, clock.as_ref(), status).await?;
    status.set("loading the CA keys, the ledger and the server certificate");
    let manager = crate::ca::manager::start(
        cfg.trust_domain(),
        &cfg.ca,
        &cfg.data_dir,
        store.clone(),
        serials.clone(),
        &cfg.jwt_svid,
        clock.now(),
    )
    .await
    .map_err(|e| anyhow!("{e}"))?;
    let view = manager.view();
    let bundle = first_bundle(cfg, &view)?;
    let metrics = Metrics::new();
    let ledger = start_ledger(cfg, &store, &metrics, &clock).await?;
    let ledger_progress = ledger.progress();
    let audit = AuditLog::spawn_with(
        store.clone(),
        crate::audit::AuditLimits {
            capacity: 4096,
            burst: cfg.limits.audit_burst,
            window: cfg.limits.audit_window,
        },
        clock.clone(),
    );
    // Entries stored before selectors had one spelling: rewritten or reported, before any
    // agent is served (see `entry_upgrade`).
    // A failure to read them (a corrupt row) is reported by every read of the entries; it is no
    // reason to stop the CA.
    if let Err(e) = crate::entry_upgrade::upgrade_selectors(
        store.as_ref(),
        &audit,
        crate::clock::unix(clock.now()),
    )
    .await
    {
        tracing::warn!(
            error = %e,
            "could not check the stored registration entries' selectors; serving without the check"
        );
    }
    let jwt_keys: Arc<dyn crate::ca::jwt_key::JwtKeySource> = manager.clone();
    let (issuer, entry_policy) = build_issuer(
        cfg, &clock, serials, &view, jwt_keys, ledger, &store, &audit, &metrics,
    )?;
    let server_cert = first_server_cert(cfg, &issuer).await?;
    let checkpoints = build_checkpoints(cfg, &store, &audit, &metrics)?;
    let tls_config = follow_the_ca(&manager, &view, &issuer, &bundle, &metrics, &server_cert)?;
    let crl_publisher = start_crls(cfg, &store, &manager, &bundle, &clock, &audit).await;
    metrics.watch(crate::metrics::Sources {
        ca: manager.clone(),
        bundle: bundle.clone(),
        server_cert: server_cert.resolver.clone(),
        checkpoints: checkpoints.clone(),
    });
    let revoker = build_revoker(
        &store,
        &clock,
        &audit,
        &crl_publisher,
        &issuer,
        &server_cert,
    );
    let federation = build_federation(cfg, &store, &clock, &audit, &metrics)?;
    federation
        .declare(&cfg.federation.relationships)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    Ok(Parts {
        federation,
        clock,
        store,
        manager,
        bundle,
        metrics,
        ledger_progress,
        audit,
        issuer,
        entry_policy,
        server_cert,
        checkpoints,
        tls_config,
        crl_publisher,
        revoker,
        root_sha256: super::fingerprint(&view.active_root),
    })
}

/// Federation relationships (`crate::federation::relationships`): fetched over the network
/// with `[federation]`'s bounds, the Web PKI roots compiled in or `fetch_web_ca_file`.
fn build_federation(
    cfg: &Config,
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    audit: &AuditLog,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<crate::federation::relationships::Federation>> {
    use crate::federation::fetch::{FetchLimits, NetworkSource, web_roots};
    use crate::federation::relationships::{Federation, Settings};
    let f = &cfg.federation;
    let roots = web_roots(f.fetch_web_ca_file.as_deref())
        .map_err(|e| anyhow!("federation.fetch_web_ca_file: {e}"))?;
    let source = NetworkSource {
        web_roots: Arc::new(roots),
        limits: FetchLimits {
            connect_timeout: f.fetch_timeout.min(std::time::Duration::from_secs(10)),
            total_timeout: f.fetch_timeout,
            ..FetchLimits::default()
        },
        clock: clock.clone(),
    };
    Ok(Arc::new(Federation::new(
        store.clone(),
        Arc::new(source),
        clock.clone(),
        audit.clone(),
        metrics.clone(),
        Settings {
            refresh_min: f.fetch_refresh_min,
            refresh_max: f.fetch_refresh_max,
            default_refresh: f.fetch_refresh_default,
            retry_base: f.fetch_retry,
            lease: f.fetch_timeout + std::time::Duration::from_secs(30),
        },
        cfg.trust_domain(),
    )))
}

/// The data directory and the store, checked against the deployment's pins before anything
/// is created, signed, recorded or served: this server's configuration must be the
/// deployment's the database belongs to.
async fn open_store(
    cfg: &Config,
    clock: &dyn Clock,
    status: &StartupStatus,
) -> anyhow::Result<Arc<dyn Store>> {
    create_private_dir(&cfg.data_dir)?;
    let db_url = cfg.database_url();
    let store = connect_store(&db_url, &cfg.database, status).await?;
    pins::pin_and_check(&store, cfg, &redact_url(&db_url), clock.now()).await?;
    Ok(store)
}

/// The trust bundle as the CA key manager first sees it, written to `bundle_path`.
fn first_bundle(cfg: &Config, view: &CaView) -> anyhow::Result<BundleHandle> {
    BundleHandle::new(
        Bundle {
            trust_domain: cfg.trust_domain(),
            roots: view.roots.clone(),
            tainted_key_ids: view.tainted.iter().cloned().collect(),
            jwt_keys: view.jwt_keys.clone(),
            revision: 1,
            crls: Vec::new(),
        },
        cfg.bundle_path(),
    )
    .with_context(|| format!("writing {}", cfg.bundle_path().display()))
}

/// The group-commit ledger writer, on its own thread and (on PostgreSQL) its own connection.
async fn start_ledger(
    cfg: &Config,
    store: &Arc<dyn Store>,
    metrics: &Arc<Metrics>,
    clock: &Arc<dyn Clock>,
) -> anyhow::Result<LedgerWriter> {
    let (batch_metrics, batch_clock) = (metrics.clone(), clock.clone());
    let (writer_url, writer_db, shared) = (cfg.database_url(), cfg.database.clone(), store.clone());
    LedgerWriter::spawn_on_own_thread(
        move || async move {
            crate::store::connect_ledger_writer(&writer_url, &writer_db, shared).await
        },
        &cfg.ledger,
        Arc::new(move |size, took| batch_metrics.observe_batch(size, took, batch_clock.now())),
        clock.clone(),
    )
    .await
    .map_err(|e| anyhow!("ledger writer: {e}"))
}

/// Policy and the issuer (authn of Kubernetes tokens, policy, the active CA key, the ledger).
#[allow(clippy::too_many_arguments)]
fn build_issuer(
    cfg: &Config,
    clock: &Arc<dyn Clock>,
    serials: Arc<dyn SerialSource>,
    view: &CaView,
    jwt_keys: Arc<dyn crate::ca::jwt_key::JwtKeySource>,
    ledger: LedgerWriter,
    store: &Arc<dyn Store>,
    audit: &AuditLog,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<(Arc<Issuer>, Arc<Policy>)> {
    let td = cfg.trust_domain();
    let jwt = match &cfg.auth.kubernetes {
        None => None,
        // Re-read while running (`jwks_refresh`): the cluster rotates its signing keys.
        Some(k) => Some(
            JwtAuthenticator::from_file(k, td.clone(), clock.clone())
                .map_err(|e| anyhow!("auth.kubernetes: {e}"))?,
        ),
    };
    let (server_dns_names, server_ips) = server_names(cfg);
    let policy = Policy::new(td.clone(), cfg.ca.default_ttl, cfg.ca.max_ttl, &cfg.policy)
        .map_err(|e| anyhow!("policy: {e}"))?
        .with_server_names(server_dns_names, server_ips);
    let entry_policy = Arc::new(policy.clone());
    let issuer = Issuer::new(IssuerParts {
        td,
        clock: clock.clone(),
        serials,
        authority: view.active.clone(),
        policy,
        jwt,
        ledger,
        store: store.clone(),
        audit: audit.clone(),
        metrics: metrics.clone(),
    })
    .with_caller_limits(Arc::new(CallerLimits::new(&cfg.limits)));
    // JWT-SVIDs: signed with the CA key manager's active JWT key (asked at every token, so a
    // rotation or a taint takes effect at the next one), under `[jwt_svid]`'s lifetimes and issuer.
    let issuer = issuer.with_jwt_svids(
        jwt_keys,
        crate::jwt_svid::JwtIssuePolicy {
            ttl: cfg.jwt_svid.ttl,
            max_ttl: cfg.jwt_svid.max_ttl,
            issuer: cfg.jwt_svid.issuer.clone(),
        },
    );
    Ok((Arc::new(issuer), entry_policy))
}

/// The server's own TLS certificate, issued (and recorded) like any other.
async fn first_server_cert(cfg: &Config, issuer: &Issuer) -> anyhow::Result<ServerCert> {
    let (chain, key) = issue_server_cert(issuer, cfg).await?;
    let resolver = ServerCertResolver::new(
        tls::certified_key(&chain.chain, &key).map_err(|e| anyhow!("server certificate: {e}"))?,
    );
    Ok(ServerCert {
        resolver,
        not_before: chain.not_before,
        not_after: chain.not_after,
        revoked: Arc::new(tokio::sync::Notify::new()),
    })
}

/// Signed ledger checkpoints (the first is signed when their loop starts: it covers the server
/// certificate's row).
fn build_checkpoints(
    cfg: &Config,
    store: &Arc<dyn Store>,
    audit: &AuditLog,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<Checkpointer>> {
    let checkpoints = Checkpointer::new(
        store.clone(),
        CheckpointKey::load_or_generate(
            &cfg.checkpoint_key_path(),
            cfg.checkpoint.key_file.is_none(),
        )?,
        cfg.trust_domain(),
        cfg.checkpoints_dir(),
        cfg.checkpoint.keep,
        audit.clone(),
        metrics.clone(),
    )
    .with_context(|| format!("checkpoint directory {}", cfg.checkpoints_dir().display()))?;
    Ok(Arc::new(checkpoints))
}

/// The gRPC listener's TLS configuration, and everything that follows each new CA view (a
/// rotation here or on another replica, an operator's action, changed plugged-in files): the
/// issuer signs with the new active key, the bundle and the mTLS anchors follow.
///
/// Client certificates are trusted only when Signet itself signed them: the anchors are the
/// signing CA certificates (every non-removed key), not the roots, so with a plugged-in CA a
/// sibling intermediate under the same root authenticates nobody.
fn follow_the_ca(
    manager: &CaManager,
    view: &CaView,
    issuer: &Arc<Issuer>,
    bundle: &BundleHandle,
    metrics: &Arc<Metrics>,
    server_cert: &ServerCert,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let client_anchors =
        tls::ClientAnchors::new(&view.client_anchors).map_err(|e| anyhow!("TLS: {e}"))?;
    metrics.ca_slots_rejected(&view.rejected);
    let tls_config = Arc::new(
        tls::server_config_with(server_cert.resolver.clone(), client_anchors.clone())
            .map_err(|e| anyhow!("TLS: {e}"))?,
    );
    let issuer = issuer.clone();
    let bundle = bundle.clone();
    let m = metrics.clone();
    manager.on_change(move |v| {
        m.ca_slots_rejected(&v.rejected);
        issuer.set_ca(v.active.clone(), v.tainted.clone());
        if let Err(e) = bundle.update_with(
            v.roots.clone(),
            v.tainted.iter().cloned().collect(),
            v.jwt_keys.clone(),
        ) {
            tracing::error!(error = %e, "could not write the trust bundle");
        }
        if let Err(e) = client_anchors.replace(&v.client_anchors) {
            tracing::error!(error = %e, "could not replace the mTLS client anchors");
        }
    });
    Ok(tls_config)
}

/// The CRL publisher, its first CRLs published. The CA keys that publish CRLs come from one
/// place (`CrlSigners`: the key manager's keys that are not removed); a taint or a revoked
/// intermediate changes a root's CRL, so every CA change wakes it.
async fn start_crls(
    cfg: &Config,
    store: &Arc<dyn Store>,
    manager: &Arc<CaManager>,
    bundle: &BundleHandle,
    clock: &Arc<dyn Clock>,
    audit: &AuditLog,
) -> Arc<CrlPublisher> {
    let crl_publisher = Arc::new(
        CrlPublisher::new(
            store.clone(),
            manager.clone(),
            bundle.clone(),
            cfg.data_dir.join("crl"),
            cfg.crl.clone(),
            clock.clone(),
        )
        .with_audit(audit.clone()),
    );
    if let Err(e) = crl_publisher.refresh().await {
        tracing::warn!(error = %e, "publishing the CRLs at start-up; retrying in the background");
    }
    let p = crl_publisher.clone();
    manager.on_change(move |_| p.wake());
    crl_publisher
}

/// The revoker: it re-issues the CRLs, and a revoked certificate is forgotten by the issuer's
/// memo of presented ones; the served TLS certificate, revoked, is replaced at once.
fn build_revoker(
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    audit: &AuditLog,
    crl_publisher: &Arc<CrlPublisher>,
    issuer: &Arc<Issuer>,
    server_cert: &ServerCert,
) -> Arc<Revoker> {
    let issuer = issuer.clone();
    let resolver = server_cert.resolver.clone();
    let revoked = server_cert.revoked.clone();
    Arc::new(
        Revoker::new(store.clone(), clock.clone(), audit.clone())
            .with_crls(crl_publisher.clone())
            .on_revoked(move |sha| {
                issuer.forget_presented(sha);
                if resolver.leaf_sha256().as_ref() == Some(sha) {
                    revoked.notify_one();
                }
            }),
    )
}
