//! Start-up and wiring, top-down in [`run`]: data directory, store, the deployment's pinned
//! values (`pins.rs`: a server configured for another deployment stops here), CA key manager, bundle,
//! ledger, issuer, background tasks, then the listeners (gRPC over TLS, the admin socket,
//! HTTP, the SPIFFE bundle endpoint) until shutdown. Host-facing steps are in `setup.rs`,
//! background tasks in `tasks.rs`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, anyhow, bail};
use signet_proto::admin::admin_server::AdminServer;
use signet_proto::admin::ledger_admin_server::LedgerAdminServer;
use signet_proto::admin::node_admin_server::NodeAdminServer;
use signet_proto::admin::revocation_admin_server::RevocationAdminServer;
use signet_proto::agent::node_server::NodeServer;
use signet_proto::ca::certificate_authority_server::CertificateAuthorityServer;
use signet_proto::istio_ca::istio_certificate_service_server::IstioCertificateServiceServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};

use crate::api::admin::AdminApi;
use crate::api::ca_admin::CaAdminApi;
use crate::api::istio::IstioApi;
use crate::api::ledger_admin::LedgerAdminApi;
use crate::api::native::NativeApi;
use crate::api::node::NodeApi;
use crate::api::node_admin::NodeAdminApi;
use crate::api::revocation_admin::RevocationAdminApi;
use crate::audit::AuditLog;
use crate::authn::AuthenticatedCaller;
use crate::authn::jwt::JwtAuthenticator;
use crate::authn::psat::PsatAttestor;
use crate::bundle::{Bundle, BundleHandle};
use crate::ca::manager::CaManager;
use crate::ca::{RandomSerials, RequestedNames, SerialSource};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::issuer::{IssueInput, Issuer, IssuerParts};
use crate::ledger::LedgerWriter;
use crate::limits::CallerLimits;
use crate::limits::conn::ConnRegistry;
use crate::limits::layer::{GrpcLimitLayer, GrpcLimits};
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::store::{Store, StoreError};
use crate::tls::{self, ServerCertResolver};

pub(crate) mod pins;
mod setup;
mod tasks;

pub use setup::redact_url;
use setup::{bind_admin_socket, connect_store, create_private_dir};
use signet_proto::admin::ca_admin_server::CaAdminServer;
use tasks::{issue_server_cert, renew_server_cert, rotate, server_names};

/// What a started server tells the operator (and tests).
#[derive(Debug, Clone)]
pub struct Started {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The probe listener (`probe_listen`), when on.
    pub probes: Option<SocketAddr>,
    pub root_sha256: String,
    pub bundle_path: std::path::PathBuf,
    pub admin_socket: std::path::PathBuf,
    /// The SPIFFE bundle endpoint (`[federation] bundle_endpoint_listen`), when on.
    pub bundle_endpoint: Option<SocketAddr>,
}

/// Runs the server until `shutdown` resolves. `on_started` is called once every listener is
/// bound.
pub async fn run(
    cfg: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_started: impl FnOnce(&Started),
) -> anyhow::Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let serials: Arc<dyn SerialSource> = Arc::new(RandomSerials::default());
    let td = cfg.trust_domain();

    create_private_dir(&cfg.data_dir)?;
    let db_url = cfg.database_url();
    let store = connect_store(&db_url, &cfg.database).await?;
    // Before anything is created, signed, recorded or served: this server's configuration must
    // be the deployment's the database belongs to.
    pins::pin_and_check(&store, &cfg, &redact_url(&db_url), clock.now()).await?;

    let manager = crate::ca::manager::start(
        td.clone(),
        &cfg.ca,
        &cfg.data_dir,
        store.clone(),
        serials.clone(),
        clock.now(),
    )
    .await
    .map_err(|e| anyhow!("{e}"))?;
    let view = manager.view();
    let authority = view.active.clone();
    let root_sha256 = fingerprint(&view.active_root);
    let bundle = BundleHandle::new(
        Bundle {
            trust_domain: td.clone(),
            roots: view.roots.clone(),
            tainted_key_ids: view.tainted.iter().cloned().collect(),
            revision: 1,
            crls: Vec::new(),
        },
        cfg.bundle_path(),
    )
    .with_context(|| format!("writing {}", cfg.bundle_path().display()))?;

    let metrics = Metrics::new();
    let batch_metrics = metrics.clone();
    let (writer_url, writer_db, shared) = (db_url.clone(), cfg.database.clone(), store.clone());
    let ledger = LedgerWriter::spawn_on_own_thread(
        move || async move {
            crate::store::connect_ledger_writer(&writer_url, &writer_db, shared).await
        },
        &cfg.ledger,
        Arc::new(move |size, took| batch_metrics.observe_batch(size, took)),
    )
    .await
    .map_err(|e| anyhow!("ledger writer: {e}"))?;
    let ledger_progress = ledger.progress();
    let audit = AuditLog::spawn_with(
        store.clone(),
        crate::audit::AuditLimits {
            capacity: 4096,
            burst: cfg.limits.audit_burst,
            window: cfg.limits.audit_window,
        },
    );

    let jwt = match &cfg.auth.kubernetes {
        None => None,
        // Re-read while running (`jwks_refresh`): the cluster rotates its signing keys.
        Some(k) => Some(
            JwtAuthenticator::from_file(k, td.clone())
                .map_err(|e| anyhow!("auth.kubernetes: {e}"))?,
        ),
    };
    let (server_dns_names, server_ips) = server_names(&cfg);
    let policy = Policy::new(td.clone(), cfg.ca.default_ttl, cfg.ca.max_ttl, &cfg.policy)
        .map_err(|e| anyhow!("policy: {e}"))?
        .with_server_names(server_dns_names, server_ips);

    // Entry creation applies the signing policy's reserved-name rules (`NodeAdminApi`).
    let entry_policy = Arc::new(policy.clone());
    let issuer = Arc::new(
        Issuer::new(IssuerParts {
            td: td.clone(),
            clock: clock.clone(),
            serials,
            authority: authority.clone(),
            policy,
            jwt,
            ledger,
            store: store.clone(),
            audit: audit.clone(),
            metrics: metrics.clone(),
        })
        .with_caller_limits(Arc::new(CallerLimits::new(&cfg.limits))),
    );

    // The server's own TLS certificate, issued (and recorded) like any other.
    let (chain, key) = issue_server_cert(&issuer, &cfg).await?;
    let resolver = ServerCertResolver::new(
        tls::certified_key(&chain.chain, &key).map_err(|e| anyhow!("server certificate: {e}"))?,
    );
    // Told when the served certificate is revoked: it is then replaced at once.
    let server_cert_revoked = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(renew_server_cert(
        issuer.clone(),
        cfg.clone(),
        resolver.clone(),
        chain.not_before,
        chain.not_after,
        server_cert_revoked.clone(),
    ));
    // Signed ledger checkpoints: the first one now (it covers the server certificate's row).
    let checkpoints = Arc::new(
        crate::checkpoint::Checkpointer::new(
            store.clone(),
            crate::checkpoint::CheckpointKey::load_or_generate(
                &cfg.checkpoint_key_path(),
                cfg.checkpoint.key_file.is_none(),
            )?,
            td.clone(),
            cfg.checkpoints_dir(),
            cfg.checkpoint.keep,
            audit.clone(),
            metrics.clone(),
        )
        .with_context(|| format!("checkpoint directory {}", cfg.checkpoints_dir().display()))?,
    );
    let checkpoint_task = tokio::spawn(crate::checkpoint::run_periodic(
        checkpoints.clone(),
        clock.clone(),
        cfg.checkpoint.interval,
    ));
    // Client certificates are trusted only when Signet itself signed them: the anchors are the
    // signing CA certificates (every non-removed key), not the roots, so with a plugged-in CA
    // a sibling intermediate under the same root authenticates nobody.
    let client_anchors =
        tls::ClientAnchors::new(&view.client_anchors).map_err(|e| anyhow!("TLS: {e}"))?;
    metrics.ca_slots_rejected(&view.rejected);
    let tls_config = Arc::new(
        tls::server_config_with(resolver.clone(), client_anchors.clone())
            .map_err(|e| anyhow!("TLS: {e}"))?,
    );
    // Every new CA view (a rotation here or on another replica, an operator's action, changed
    // plugged-in files): the issuer signs with the new active key, the bundle and the mTLS
    // anchors follow.
    {
        let issuer = issuer.clone();
        let bundle = bundle.clone();
        let anchors = client_anchors.clone();
        let m = metrics.clone();
        manager.on_change(move |v| {
            m.ca_slots_rejected(&v.rejected);
            issuer.set_ca(v.active.clone(), v.tainted.clone());
            if let Err(e) = bundle.update_with(v.roots.clone(), v.tainted.iter().cloned().collect())
            {
                tracing::error!(error = %e, "could not write the trust bundle");
            }
            if let Err(e) = anchors.replace(&v.client_anchors) {
                tracing::error!(error = %e, "could not replace the mTLS client anchors");
            }
        });
    }
    tokio::spawn(rotate(
        manager.clone(),
        clock.clone(),
        cfg.ca.rotation_interval,
    ));

    let grpc_listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding listen address {}", cfg.listen))?;
    let http_listener = TcpListener::bind(cfg.http_listen)
        .await
        .with_context(|| format!("binding http_listen address {}", cfg.http_listen))?;
    let probe_listener = match cfg.probe_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding probe_listen address {addr}"))?,
        ),
        None => None,
    };
    let admin_path = cfg.admin_socket_path();
    let admin_listener = bind_admin_socket(&admin_path)?;
    let bundle_endpoint = match cfg.federation.bundle_endpoint_listen {
        Some(addr) => Some((
            TcpListener::bind(addr).await.with_context(|| {
                format!("binding federation.bundle_endpoint_listen address {addr}")
            })?,
            crate::federation::tls_config(&cfg, resolver.clone())?,
        )),
        None => None,
    };

    let started = Started {
        grpc: grpc_listener.local_addr()?,
        http: http_listener.local_addr()?,
        probes: match &probe_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        },
        root_sha256,
        bundle_path: cfg.bundle_path(),
        admin_socket: admin_path.clone(),
        bundle_endpoint: match &bundle_endpoint {
            Some((l, _)) => Some(l.local_addr()?),
            None => None,
        },
    };

    let transport_limit = cfg.max_message_bytes.saturating_mul(4).max(4 * 1024 * 1024);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<CertificateAuthorityServer<NativeApi>>()
        .await;
    health_reporter
        .set_serving::<IstioCertificateServiceServer<IstioApi>>()
        .await;
    health_reporter.set_serving::<NodeServer<NodeApi>>().await;
    health_reporter
        .set_serving::<NodeAdminServer<NodeAdminApi>>()
        .await;
    health_reporter
        .set_serving::<RevocationAdminServer<RevocationAdminApi>>()
        .await;
    // Both reflection versions: grpcurl and many tools still speak only v1alpha.
    let reflection_builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(signet_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = reflection_builder()
        .build_v1()
        .map_err(|e| anyhow!("reflection: {e}"))?;
    let reflection_alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| anyhow!("reflection: {e}"))?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let native = CertificateAuthorityServer::new(
        NativeApi::new(issuer.clone(), bundle.clone(), cfg.max_message_bytes)
            .with_shutdown(stop_rx.clone()),
    )
    .max_decoding_message_size(transport_limit);
    let istio =
        IstioCertificateServiceServer::new(IstioApi::new(issuer.clone(), cfg.max_message_bytes))
            .max_decoding_message_size(transport_limit);
    let mut node_api = NodeApi::new(
        issuer.clone(),
        store.clone(),
        bundle.clone(),
        cfg.max_message_bytes,
    );
    if let Some(k) = &cfg.nodes.kubernetes {
        node_api = node_api.with_kubernetes_attestation(PsatAttestor::new(k));
    }
    let node_api = node_api
        .with_entry_watch(&cfg.nodes.watch)
        .with_shutdown(stop_rx.clone());
    let node = NodeServer::new(node_api).max_decoding_message_size(transport_limit);
    let node_admin = NodeAdminServer::new(NodeAdminApi::new(
        issuer.clone(),
        store.clone(),
        entry_policy,
    ))
    .max_decoding_message_size(transport_limit);
    let admin = AdminServer::new(AdminApi::new(
        issuer.clone(),
        store.clone(),
        bundle.clone(),
        crate::authn::AdminSocket::listening_on(&admin_listener),
    ))
    .max_decoding_message_size(transport_limit);
    let ledger_admin =
        LedgerAdminServer::new(LedgerAdminApi::new(checkpoints.clone(), clock.clone()))
            .max_decoding_message_size(transport_limit);
    // Revocation and CRLs. The CA keys that publish CRLs come from one place (`CrlSigners`:
    // the key manager's keys that are not removed).
    let crl_publisher = Arc::new(
        crate::crl::CrlPublisher::new(
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
    // A taint or a revoked intermediate changes a root's CRL: refresh at once.
    {
        let p = crl_publisher.clone();
        manager.on_change(move |_| p.wake());
    }
    tokio::spawn(crl_publisher.clone().run(stop_rx.clone()));
    let revoker = {
        let issuer = issuer.clone();
        let resolver = resolver.clone();
        Arc::new(
            crate::revocation::Revoker::new(store.clone(), clock.clone(), audit.clone())
                .with_crls(crl_publisher.clone())
                .on_revoked(move |sha| {
                    issuer.forget_presented(sha);
                    if resolver.leaf_sha256().as_ref() == Some(sha) {
                        server_cert_revoked.notify_one();
                    }
                }),
        )
    };
    let revocation_admin = RevocationAdminServer::new(RevocationAdminApi::new(
        revoker,
        store.clone(),
        bundle.clone(),
        td.clone(),
    ))
    .max_decoding_message_size(transport_limit);
    let ca_admin = CaAdminServer::new(CaAdminApi::new(issuer.clone(), manager.clone()))
        .max_decoding_message_size(transport_limit);

    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };

    let limits = &cfg.limits;
    let conns = ConnRegistry::new();
    let incoming = ReceiverStream::new(tls::accept_loop(
        grpc_listener,
        tls_config,
        tls::AcceptLimits {
            max_connections: limits.max_connections,
            max_connections_per_source: limits.max_connections_per_source,
            handshake_timeout: limits.tls_handshake_timeout,
            idle_timeout: limits.connection_idle_timeout,
        },
        conns.clone(),
        metrics.clone(),
    ));
    let grpc = tonic::transport::Server::builder()
        .timeout(limits.request_timeout)
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        // tonic's default (None) would turn h2's own bounds off: HTTP/2 rapid reset.
        .http2_max_pending_accept_reset_streams(Some(limits.http2_max_pending_accept_reset_streams))
        .http2_max_local_error_reset_streams(Some(limits.http2_max_local_error_reset_streams))
        // One span per call, continuing the caller's trace (outermost: refusals are traced).
        .layer(signet_runtime::telemetry::GrpcTraceLayer)
        .layer(GrpcLimitLayer(GrpcLimits::new(
            limits,
            conns.clone(),
            metrics.clone(),
        )))
        .add_service(health_service.clone())
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(native)
        .add_service(istio)
        .add_service(node)
        .serve_with_incoming_shutdown(incoming, wait(stop_rx.clone()));
    let admin_srv = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(admin)
        .add_service(node_admin)
        .add_service(ledger_admin)
        .add_service(revocation_admin)
        .add_service(ca_admin)
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(admin_listener),
            wait(stop_rx.clone()),
        );
    // What /readyz checks besides the database and the ledger writer (both listeners).
    let ready_checks: Vec<Arc<dyn crate::http::ReadinessCheck>> = vec![
        Arc::new(crate::ca::manager::CaReadiness(manager.clone())),
        checkpoints.clone(),
    ];
    let http = crate::http::serve(
        http_listener,
        crate::http::router_with(
            store.clone(),
            metrics.clone(),
            Some(ledger_progress.clone()),
            ready_checks.clone(),
        )
        .merge(crate::checkpoint::routes(checkpoints.clone()))
        .merge(crate::http::crl_router(bundle.clone())),
        limits,
        metrics.clone(),
        wait(stop_rx.clone()),
    );

    let probes = async {
        let Some(listener) = probe_listener else {
            return Ok(());
        };
        crate::http::serve_probes(
            listener,
            crate::http::router_with(
                store.clone(),
                metrics.clone(),
                Some(ledger_progress.clone()),
                ready_checks.clone(),
            ),
            metrics.clone(),
            wait(stop_rx.clone()),
        )
        .await
    };

    let federation = async {
        let Some((listener, tls)) = bundle_endpoint else {
            return Ok(());
        };
        let endpoint = Arc::new(crate::federation::BundleEndpoint::new(
            bundle.clone(),
            clock.clone(),
            cfg.federation.refresh_hint,
        ));
        crate::federation::serve(
            listener,
            tls,
            crate::federation::routes(endpoint),
            crate::federation::EndpointLimits::from_config(&cfg),
            metrics.clone(),
            wait(stop_rx.clone()),
        )
        .await
    };

    tasks::spawn_metrics_publisher(
        audit.clone(),
        metrics.clone(),
        ledger_progress.clone(),
        conns.clone(),
    );

    on_started(&started);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (g, a, h, p, f) = tokio::join!(grpc, admin_srv, http, probes, federation);
    checkpoint_task.abort();
    let _ = std::fs::remove_file(&admin_path);
    g.context("gRPC server")?;
    a.context("admin server")?;
    h.context("HTTP server")?;
    p.context("probe listener")?;
    f.context("SPIFFE bundle endpoint")?;
    Ok(())
}

/// SHA-256 fingerprint in the usual `AB:CD:…` spelling.
fn fingerprint(der: &[u8]) -> String {
    signet_types::ledger::sha256(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}
