//! Serving the built parts on the bound listeners: the public gRPC services over TLS, the admin
//! socket, HTTP (metrics, health, checkpoints, CRLs), the probe listener, the SPIFFE bundle
//! endpoint, and the background tasks (`tasks.rs`), every one of them in one
//! [`Supervisor`] so that stopping the server awaits them all.

use std::sync::Arc;

use anyhow::anyhow;
use signet_proto::admin::admin_server::AdminServer;
use signet_proto::admin::ca_admin_server::CaAdminServer;
use signet_proto::admin::federation_admin_server::FederationAdminServer;
use signet_proto::admin::ledger_admin_server::LedgerAdminServer;
use signet_proto::admin::node_admin_server::NodeAdminServer;
use signet_proto::admin::revocation_admin_server::RevocationAdminServer;
use signet_proto::agent::node_server::NodeServer;
use signet_proto::ca::certificate_authority_server::CertificateAuthorityServer;
use signet_proto::ca::registration_server::RegistrationServer;
use signet_proto::istio_ca::istio_certificate_service_server::IstioCertificateServiceServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic_health::pb::health_server::{Health, HealthServer};

use super::Started;
use super::listeners::Listeners;
use super::parts::Parts;
use super::supervisor::Supervisor;
use super::tasks::{CaReadiness, publish_metrics, renew_server_cert, rotate};
use crate::api::admin::AdminApi;
use crate::api::ca_admin::CaAdminApi;
use crate::api::federation_admin::FederationAdminApi;
use crate::api::istio::IstioApi;
use crate::api::ledger_admin::LedgerAdminApi;
use crate::api::native::NativeApi;
use crate::api::node::NodeApi;
use crate::api::node_admin::NodeAdminApi;
use crate::api::registration::RegistrationApi;
use crate::api::revocation_admin::RevocationAdminApi;
use crate::authn::psat::PsatAttestor;
use crate::config::Config;
use crate::limits::conn::ConnRegistry;
use crate::limits::layer::{GrpcLimitLayer, GrpcLimits};
use crate::tls;

/// Serves until `shutdown` resolves or a task fails, then stops and awaits every task.
pub(super) async fn serve(
    cfg: Config,
    parts: Parts,
    listeners: Listeners,
    reload: Option<crate::reload::Reload>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_started: impl FnOnce(&Started),
) -> anyhow::Result<()> {
    let started = listeners.started(&cfg, parts.root_sha256.clone())?;
    let Listeners {
        grpc,
        http,
        probes,
        admin,
        admin_path,
        bundle_endpoint,
        oidc,
    } = listeners;
    let mut tasks = Supervisor::new();
    let conns = ConnRegistry::new();
    spawn_background(&mut tasks, &cfg, &parts, &conns);
    if let Some(reload) = reload {
        let reachable = crate::reload::Reloadable {
            issuer: parts.issuer.clone(),
            manager: parts.manager.clone(),
            clock: parts.clock.clone(),
        };
        tasks.spawn_loop(
            "SIGHUP reload",
            crate::reload::run(reload, crate::reload::KeyDigests::of(&cfg), reachable),
        );
    }
    // Health, like reflection, per listener: each answers SERVING only for its own services
    // (and NotFound for another listener's).
    let (grpc_health_reporter, grpc_health) = health_service(&grpc_services()).await;
    let (admin_health_reporter, admin_health) = health_service(&admin_services()).await;
    spawn_grpc(&mut tasks, &cfg, &parts, grpc, &conns, grpc_health)?;
    spawn_admin(&mut tasks, &cfg, &parts, admin, admin_health)?;
    spawn_http(&mut tasks, &cfg, &parts, http, probes);
    if let Some((listener, tls)) = bundle_endpoint {
        let endpoint = Arc::new(
            crate::federation::BundleEndpoint::new(
                parts.bundle.clone(),
                parts.clock.clone(),
                cfg.published_refresh(),
                parts.store.clone(),
            )
            .following(parts.manager.clone()),
        );
        tasks.spawn_listener(
            "SPIFFE bundle endpoint",
            crate::federation::serve(
                listener,
                tls,
                crate::federation::routes(endpoint),
                crate::federation::EndpointLimits::from_config(&cfg),
                parts.metrics.clone(),
                tasks.stopped(),
            ),
        );
    }

    let discovery = crate::oidc::Discovery::from_config(
        &cfg.jwt_svid,
        parts.bundle.clone(),
        cfg.published_refresh(),
    );
    if let (Some((listener, tls)), Some(discovery)) = (oidc, discovery) {
        tasks.spawn_listener(
            "OIDC discovery listener",
            crate::federation::serve_tls(
                crate::oidc::TLS_LISTENER,
                listener,
                tls,
                crate::oidc::routes(discovery),
                crate::federation::EndpointLimits::from_config(&cfg),
                parts.metrics.clone(),
                tasks.stopped(),
            ),
        );
    }

    on_started(&started);
    let result = tasks.run(shutdown).await;
    drop((grpc_health_reporter, admin_health_reporter));
    let _ = std::fs::remove_file(&admin_path);
    result
}

/// The loops that run beside the listeners: the server certificate's renewal, checkpoints,
/// the CA rotator's tick, the CRL publisher, metrics.
fn spawn_background(
    tasks: &mut Supervisor,
    cfg: &Config,
    parts: &Parts,
    conns: &Arc<ConnRegistry>,
) {
    let cert = &parts.server_cert;
    tasks.spawn_loop(
        "server certificate renewal",
        renew_server_cert(
            parts.issuer.clone(),
            cfg.clone(),
            cert.resolver.clone(),
            cert.not_before,
            cert.not_after,
            cert.revoked.clone(),
        ),
    );
    tasks.spawn_loop(
        "ledger checkpoints",
        crate::checkpoint::run_periodic(
            parts.checkpoints.clone(),
            parts.clock.clone(),
            cfg.checkpoint.interval,
        ),
    );
    tasks.spawn_loop(
        "CA rotator",
        rotate(
            parts.manager.clone(),
            parts.clock.clone(),
            cfg.ca.rotation_interval,
        ),
    );
    let federation = parts.federation.clone();
    let stopped = tasks.stopped();
    tasks.spawn_listener("federation refresh", async move {
        federation.run(stopped).await;
        anyhow::Ok(())
    });
    // It watches the stop signal itself (it ends between two publications).
    let crls = parts.crl_publisher.clone().run(tasks.stop_signal());
    tasks.spawn_listener("CRL publisher", async move {
        crls.await;
        anyhow::Ok(())
    });
    tasks.spawn_loop(
        "metrics publisher",
        publish_metrics(
            parts.audit.clone(),
            parts.metrics.clone(),
            parts.ledger_progress.clone(),
            conns.clone(),
        ),
    );
}

/// The services of the public gRPC listener (TLS).
fn grpc_services() -> [&'static str; 4] {
    [
        service_name::<CertificateAuthorityServer<NativeApi>>(),
        service_name::<RegistrationServer<RegistrationApi>>(),
        service_name::<IstioCertificateServiceServer<IstioApi>>(),
        service_name::<NodeServer<NodeApi>>(),
    ]
}

/// The services of the admin socket.
fn admin_services() -> [&'static str; 6] {
    [
        service_name::<AdminServer<AdminApi>>(),
        service_name::<NodeAdminServer<NodeAdminApi>>(),
        service_name::<LedgerAdminServer<LedgerAdminApi>>(),
        service_name::<RevocationAdminServer<RevocationAdminApi>>(),
        service_name::<CaAdminServer<CaAdminApi>>(),
        service_name::<FederationAdminServer<FederationAdminApi>>(),
    ]
}

/// gRPC health for one listener: `services` SERVING, and the server as a whole (`""`); any
/// other name, another listener's services included, is NotFound.
async fn health_service(
    services: &[&'static str],
) -> (
    tonic_health::server::HealthReporter,
    HealthServer<impl Health>,
) {
    let (reporter, service) = tonic_health::server::health_reporter();
    for s in services {
        reporter
            .set_service_status(*s, tonic_health::ServingStatus::Serving)
            .await;
    }
    (reporter, service)
}

/// The largest gRPC message a listener decodes: the API's own limit (checked per call) with
/// room for framing, at least 4 MiB.
fn transport_limit(cfg: &Config) -> usize {
    cfg.max_message_bytes.saturating_mul(4).max(4 * 1024 * 1024)
}

/// The public gRPC listener (TLS, connection and call limits): the native CA API, the
/// Registration service, Istio's CSR API, the node API, health and reflection.
fn spawn_grpc(
    tasks: &mut Supervisor,
    cfg: &Config,
    parts: &Parts,
    listener: TcpListener,
    conns: &Arc<ConnRegistry>,
    health: HealthServer<impl Health>,
) -> anyhow::Result<()> {
    let limit = transport_limit(cfg);
    let (reflection, reflection_alpha) = reflection(&grpc_services())?;
    let native = CertificateAuthorityServer::new(
        NativeApi::new(
            parts.issuer.clone(),
            parts.bundle.clone(),
            cfg.max_message_bytes,
        )
        .with_shutdown(tasks.stop_signal()),
    )
    .max_decoding_message_size(limit);
    let registration = RegistrationServer::new(RegistrationApi::new(
        parts.issuer.clone(),
        parts.store.clone(),
        parts.entry_policy.clone(),
        crate::registration::Registrar::from_config(&cfg.policy.kubernetes_bridge),
        parts.metrics.clone(),
        cfg.max_message_bytes,
    ))
    .max_decoding_message_size(limit);
    let istio = IstioCertificateServiceServer::new(IstioApi::new(
        parts.issuer.clone(),
        cfg.max_message_bytes,
    ))
    .max_decoding_message_size(limit);
    let mut node_api = NodeApi::new(
        parts.issuer.clone(),
        parts.store.clone(),
        parts.bundle.clone(),
        cfg.max_message_bytes,
    );
    if let Some(k) = &cfg.nodes.kubernetes {
        node_api = node_api.with_kubernetes_attestation(PsatAttestor::new(k));
    }
    let node_api = node_api
        .with_entry_watch(&cfg.nodes.watch)
        .with_federation(parts.store.clone())
        .with_shutdown(tasks.stop_signal());
    let node = NodeServer::new(node_api).max_decoding_message_size(limit);

    let limits = &cfg.limits;
    let incoming = ReceiverStream::new(tls::accept_loop(
        listener,
        parts.tls_config.clone(),
        tls::AcceptLimits {
            max_connections: limits.max_connections,
            max_connections_per_source: limits.max_connections_per_source,
            handshake_timeout: limits.tls_handshake_timeout,
            idle_timeout: limits.connection_idle_timeout,
        },
        conns.clone(),
        parts.metrics.clone(),
    ));
    let server = tonic::transport::Server::builder()
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
            parts.metrics.clone(),
            parts.clock.clone(),
        )))
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(native)
        .add_service(registration)
        .add_service(istio)
        .add_service(node)
        .serve_with_incoming_shutdown(incoming, tasks.stopped());
    tasks.spawn_listener("gRPC server", server);
    Ok(())
}

/// The admin socket: entries, tokens, nodes, the ledger, revocation, the CA's keys; health
/// and reflection.
fn spawn_admin(
    tasks: &mut Supervisor,
    cfg: &Config,
    parts: &Parts,
    listener: UnixListener,
    health: HealthServer<impl Health>,
) -> anyhow::Result<()> {
    let limit = transport_limit(cfg);
    let (reflection, reflection_alpha) = reflection(&admin_services())?;
    let admin = AdminServer::new(AdminApi::new(
        parts.issuer.clone(),
        parts.store.clone(),
        parts.bundle.clone(),
        crate::authn::AdminSocket::listening_on(&listener),
    ))
    .max_decoding_message_size(limit);
    let node_admin = NodeAdminServer::new(NodeAdminApi::new(
        parts.issuer.clone(),
        parts.store.clone(),
        parts.entry_policy.clone(),
    ))
    .max_decoding_message_size(limit);
    let ledger_admin = LedgerAdminServer::new(LedgerAdminApi::new(
        parts.checkpoints.clone(),
        parts.clock.clone(),
    ))
    .max_decoding_message_size(limit);
    let revocation_admin = RevocationAdminServer::new(RevocationAdminApi::new(
        parts.revoker.clone(),
        parts.store.clone(),
        parts.bundle.clone(),
        cfg.trust_domain(),
    ))
    .max_decoding_message_size(limit);
    let ca_admin = CaAdminServer::new(CaAdminApi::new(parts.issuer.clone(), parts.manager.clone()))
        .max_decoding_message_size(limit);
    let federation_admin =
        FederationAdminServer::new(FederationAdminApi::new(parts.federation.clone()))
            .max_decoding_message_size(limit);
    let server = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(admin)
        .add_service(node_admin)
        .add_service(ledger_admin)
        .add_service(revocation_admin)
        .add_service(ca_admin)
        .add_service(federation_admin)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), tasks.stopped());
    tasks.spawn_listener("admin server", server);
    Ok(())
}

/// The gRPC name of a generated server type (`signet.ca.v1.CertificateAuthority`).
fn service_name<S: tonic::server::NamedService>() -> &'static str {
    S::NAME
}

/// gRPC reflection for one listener, both versions (grpcurl and many tools still speak only
/// v1alpha): it lists and describes exactly `services`, gRPC health and itself, never a
/// service of another listener (the TLS port says nothing of the admin API).
fn reflection(
    services: &[&'static str],
) -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let descriptors = signet_proto::descriptors_for(services)?;
    let builder = || {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_file_descriptor_set(descriptors.clone())
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(service_name::<
                HealthServer<tonic_health::server::HealthService>,
            >())
            .with_service_name("grpc.reflection.v1.ServerReflection")
            .with_service_name("grpc.reflection.v1alpha.ServerReflection");
        for s in services {
            b = b.with_service_name(*s);
        }
        b
    };
    let v1 = builder()
        .build_v1()
        .map_err(|e| anyhow!("reflection: {e}"))?;
    let v1alpha = builder()
        .build_v1alpha()
        .map_err(|e| anyhow!("reflection: {e}"))?;
    Ok((v1, v1alpha))
}

/// HTTP (`http_listen`: metrics, health and readiness, checkpoints, CRLs) and the probe
/// listener (`probe_listen`: health and readiness only), when on.
fn spawn_http(
    tasks: &mut Supervisor,
    cfg: &Config,
    parts: &Parts,
    listener: TcpListener,
    probes: Option<TcpListener>,
) {
    // What /readyz checks besides the database and the ledger writer (both listeners).
    let ready_checks: Vec<Arc<dyn crate::http::ReadinessCheck>> = vec![
        Arc::new(CaReadiness(parts.manager.clone())),
        parts.checkpoints.clone(),
    ];
    let health_router = || {
        crate::http::router_with(
            parts.store.clone(),
            parts.metrics.clone(),
            Some(parts.ledger_progress.clone()),
            ready_checks.clone(),
            parts.clock.clone(),
        )
    };
    let mut router = health_router()
        .merge(crate::checkpoint::routes(parts.checkpoints.clone()))
        .merge(crate::http::crl_router(parts.bundle.clone()));
    // OIDC discovery in plain HTTP, for an ingress that terminates TLS (see `crate::oidc`).
    if let Some(discovery) = crate::oidc::Discovery::from_config(
        &cfg.jwt_svid,
        parts.bundle.clone(),
        cfg.published_refresh(),
    ) {
        router = router.merge(crate::oidc::routes(discovery));
    }
    let (limits, metrics, stopped) = (cfg.limits.clone(), parts.metrics.clone(), tasks.stopped());
    tasks.spawn_listener("HTTP server", async move {
        crate::http::serve(listener, router, &limits, metrics, stopped).await
    });
    if let Some(listener) = probes {
        tasks.spawn_listener(
            "probe listener",
            crate::http::serve_probes(
                listener,
                health_router(),
                parts.metrics.clone(),
                tasks.stopped(),
            ),
        );
    }
}
