//! Start-up and wiring: data directory, store, CA key, bundle, ledger, listeners.

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
use crate::bundle::{Bundle, BundleHandle, write_atomic};
use crate::ca::kek::Kek;
use crate::ca::manager::{CaManager, ManagerConfig, PluggedFiles};
use crate::ca::rotator::KeyIdJitter;
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
use signet_proto::admin::ca_admin_server::CaAdminServer;

/// What a started server tells the operator (and tests).
#[derive(Debug, Clone)]
pub struct Started {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
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

    let manager = start_ca(&cfg, store.clone(), serials.clone(), clock.now()).await?;
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
    let ledger = LedgerWriter::spawn(
        store.clone(),
        &cfg.ledger,
        Arc::new(move |size, took| batch_metrics.observe_batch(size, took)),
    );
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
        Some(k) => {
            let jwks = std::fs::read_to_string(&k.jwks_file).with_context(|| {
                format!(
                    "reading auth.kubernetes.jwks_file {}",
                    k.jwks_file.display()
                )
            })?;
            Some(
                JwtAuthenticator::new(k, &jwks, td.clone())
                    .map_err(|e| anyhow!("auth.kubernetes: {e}"))?,
            )
        }
    };
    let (server_dns_names, server_ips) = server_names(&cfg);
    let policy = Policy::new(td.clone(), cfg.ca.default_ttl, cfg.ca.max_ttl, &cfg.policy)
        .map_err(|e| anyhow!("policy: {e}"))?
        .with_server_names(server_dns_names, server_ips);

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
        manager.on_change(move |v| {
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
    let node = NodeServer::new(node_api).max_decoding_message_size(transport_limit);
    let node_admin = NodeAdminServer::new(NodeAdminApi::new(issuer.clone(), store.clone()))
        .max_decoding_message_size(transport_limit);
    let admin = AdminServer::new(AdminApi::new(issuer.clone(), store.clone(), bundle.clone()))
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
    let http = crate::http::serve(
        http_listener,
        crate::http::router_with(
            store.clone(),
            metrics.clone(),
            Some(ledger_progress.clone()),
        )
        .merge(crate::checkpoint::routes(checkpoints.clone()))
        .merge(crate::http::crl_router(bundle.clone())),
        limits,
        metrics.clone(),
        wait(stop_rx.clone()),
    );

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

    // Publish audit-drop counts and ledger progress to metrics.
    {
        let audit = audit.clone();
        let metrics = metrics.clone();
        let progress = ledger_progress.clone();
        let conns = conns.clone();
        tokio::spawn(async move {
            let mut failures = 0;
            loop {
                metrics
                    .audit_dropped
                    .set(i64::try_from(audit.dropped()).unwrap_or(i64::MAX));
                metrics
                    .audit_aggregated
                    .set(i64::try_from(audit.aggregated()).unwrap_or(i64::MAX));
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
        });
    }

    on_started(&started);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (g, a, h, f) = tokio::join!(grpc, admin_srv, http, federation);
    checkpoint_task.abort();
    let _ = std::fs::remove_file(&admin_path);
    g.context("gRPC server")?;
    a.context("admin server")?;
    h.context("HTTP server")?;
    f.context("SPIFFE bundle endpoint")?;
    Ok(())
}

/// Creates `data_dir` with mode 0700, or forces an existing one to 0700. Refuses a directory
/// owned by another user (whoever owns it can read the CA's key-encryption key and replace
/// the admin socket), or something that is not a directory.
fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating data_dir {}", dir.display()))?;
    }
    // Not following a symlink: the directory itself must be ours.
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("reading data_dir {}", dir.display()))?;
    if !meta.is_dir() {
        bail!(
            "data_dir {} is not a directory{}",
            dir.display(),
            if meta.file_type().is_symlink() {
                " (it is a symlink: point data_dir at the real directory)"
            } else {
                ""
            }
        );
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        bail!(
            "data_dir {} is owned by uid {}, but signet-server runs as uid {me}: it holds the \
             CA's keys and admin socket, so it must belong to the server's own user \
             (chown it, or choose another data_dir)",
            dir.display(),
            meta.uid()
        );
    }
    if meta.permissions().mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod 0700 data_dir {}", dir.display()))?;
        tracing::info!(data_dir = %dir.display(), "data_dir mode set to 0700");
    }
    Ok(())
}

async fn connect_store(
    url: &str,
    db: &crate::config::DatabaseConfig,
) -> anyhow::Result<Arc<dyn Store>> {
    let mut delay = Duration::from_millis(250);
    loop {
        match crate::store::connect_with(url, db).await {
            Ok(s) => return Ok(s),
            Err(StoreError::Unavailable(e)) => {
                tracing::warn!(database = %redact_url(url), error = %e, retry_in = ?delay, "database unavailable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(e) => bail!("database {}: {e}", redact_url(url)),
        }
    }
}

/// The URL with its secrets replaced by `…`: the password in the userinfo
/// (`postgres://user:secret@host/db` -> `postgres://user:…@host/db`, a password containing `@`
/// included) and `password` / `sslpassword` query parameters. The URL is read the way sqlx
/// reads it (the `url` crate, WHATWG rules); one that does not parse is hidden entirely.
pub fn redact_url(raw: &str) -> String {
    // SQLite URLs carry no credentials, but may carry parameters.
    if raw.starts_with("sqlite:") {
        return redact_query(raw);
    }
    let Ok(u) = url::Url::parse(raw) else {
        let scheme = raw.split_once(':').map_or("", |(s, _)| s);
        return format!("{scheme}://… (unparsable URL hidden)");
    };
    let mut out = format!("{}://", u.scheme());
    if !u.username().is_empty() || u.password().is_some() {
        out.push_str(u.username());
        if u.password().is_some() {
            out.push_str(":…");
        }
        out.push('@');
    }
    out.push_str(u.host_str().unwrap_or_default());
    if let Some(port) = u.port() {
        out.push_str(&format!(":{port}"));
    }
    out.push_str(u.path());
    if let Some(q) = u.query() {
        out.push_str(&redact_query(&format!("?{q}")));
    }
    out
}

/// Hides the values of secret query parameters.
fn redact_query(s: &str) -> String {
    let Some((base, query)) = s.split_once('?') else {
        return s.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|kv| {
            let key = kv.split_once('=').map_or(kv, |(k, _)| k);
            let secret = ["password", "sslpassword"]
                .iter()
                .any(|k| key.eq_ignore_ascii_case(k));
            if secret && kv.contains('=') {
                format!("{key}=…")
            } else {
                kv.to_owned()
            }
        })
        .collect();
    format!("{base}?{}", params.join("&"))
}

fn load_kek(cfg: &Config) -> anyhow::Result<Kek> {
    let path = cfg
        .ca
        .kek_file
        .clone()
        .unwrap_or_else(|| cfg.data_dir.join("kek"));
    match std::fs::read_to_string(&path) {
        Ok(s) => Kek::from_base64(s.trim())
            .map_err(|e| anyhow!("key-encryption key {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && cfg.ca.kek_file.is_none() => {
            let kek = Kek::generate();
            write_atomic(&path, format!("{}\n", kek.to_base64()).as_bytes(), 0o600)
                .with_context(|| format!("writing {}", path.display()))?;
            tracing::info!(path = %path.display(), "generated key-encryption key");
            Ok(kek)
        }
        Err(e) => Err(anyhow!(
            "reading key-encryption key {}: {e}",
            path.display()
        )),
    }
}

/// The CA key manager: a plugged-in CA's files, or the generated keys in the database
/// (creating the first root and intermediate on a fresh database).
async fn start_ca(
    cfg: &Config,
    store: Arc<dyn Store>,
    serials: Arc<dyn SerialSource>,
    now: SystemTime,
) -> anyhow::Result<Arc<CaManager>> {
    let mcfg = ManagerConfig::from_config(cfg.trust_domain(), &cfg.ca);
    if let Some(files) = cfg.ca.plugged()? {
        let files = PluggedFiles {
            cert: files.cert.to_path_buf(),
            key: files.key.to_path_buf(),
            chain: files.chain.to_path_buf(),
            root: files.root.to_path_buf(),
        };
        return CaManager::plugged(store, files, mcfg, serials).map_err(|e| anyhow!("{e}"));
    }
    let kek = load_kek(cfg)?;
    let manager = CaManager::generated(store, kek, mcfg, serials, Arc::new(KeyIdJitter), now)
        .await
        .map_err(|e| anyhow!("CA keys: {e}"))?;
    tracing::info!(key_id = manager.view().active.key_id(), "CA keys loaded");
    Ok(manager)
}

/// The rotator's loop: a manager tick every `interval` (±10%, so replicas spread out).
async fn rotate(manager: Arc<CaManager>, clock: Arc<dyn Clock>, interval: Duration) {
    use ring::rand::SecureRandom;
    let rng = ring::rand::SystemRandom::new();
    loop {
        let mut b = [0u8; 2];
        let unit = match rng.fill(&mut b) {
            Ok(()) => f64::from(u16::from_be_bytes(b)) / f64::from(u16::MAX),
            Err(_) => 0.5,
        };
        tokio::time::sleep(interval.mul_f64(0.9 + 0.2 * unit)).await;
        if let Err(e) = manager.tick(clock.now()).await {
            tracing::warn!(error = %e, "CA rotation tick failed; retrying on the next one");
        }
    }
}

/// SHA-256 fingerprint in the usual `AB:CD:…` spelling.
pub fn fingerprint(der: &[u8]) -> String {
    signet_types::ledger::sha256(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The server's own DNS names and addresses: in its certificate, and in no other.
fn server_names(cfg: &Config) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns_names = vec!["localhost".to_owned()];
    dns_names.extend(cfg.server_names.iter().cloned());
    let mut ips: Vec<IpAddr> = vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()];
    if !cfg.listen.ip().is_unspecified() && !ips.contains(&cfg.listen.ip()) {
        ips.push(cfg.listen.ip());
    }
    (dns_names, ips)
}

struct ServerCert {
    chain: Vec<Vec<u8>>,
    not_before: SystemTime,
    not_after: SystemTime,
}

async fn issue_server_cert(issuer: &Issuer, cfg: &Config) -> anyhow::Result<(ServerCert, Vec<u8>)> {
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
async fn renew_server_cert(
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

/// Binds the admin socket so that no other user can ever connect to it: it is created inside
/// a fresh private directory (mode 0700, ours), set to 0600 there, and only then renamed into
/// place. There is no moment at which the socket is reachable with a wider mode (chmod after
/// bind leaves such a window, and a connection made in it keeps working).
fn bind_admin_socket(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if path.exists() {
        // A socket left by a previous run that did not shut down cleanly.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "admin socket {} is in use: is another signet-server running with this data_dir?",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale admin socket {}", path.display()))?;
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut random = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random)
        .map_err(|_| anyhow!("no randomness for the admin socket's staging directory"))?;
    let staging = parent.join(format!(".admin-sock-{}", hex::encode(random)));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .with_context(|| format!("creating {}", staging.display()))?;
    let result = (|| {
        let staged = staging.join("admin.sock");
        let listener = UnixListener::bind(&staged)
            .with_context(|| format!("binding admin socket {}", staged.display()))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 0600 {}", staged.display()))?;
        std::fs::rename(&staged, path)
            .with_context(|| format!("moving the admin socket into place at {}", path.display()))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("postgres://signet:hunter2@db:5432/signet"),
            "postgres://signet:…@db:5432/signet"
        );
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
        assert_eq!(
            redact_url("postgres://signet@db/signet"),
            "postgres://signet@db/signet"
        );
    }

    #[test]
    fn passwords_in_query_parameters_are_redacted() {
        let r = redact_url("postgres://db/signet?user=signet&password=hunter2&sslmode=require");
        assert_eq!(
            r,
            "postgres://db/signet?user=signet&password=…&sslmode=require"
        );
        let r = redact_url("postgresql://u@db/x?PassWord=hunter2&sslpassword=k3y");
        assert_eq!(r, "postgresql://u@db/x?PassWord=…&sslpassword=…");
        assert!(!redact_url("sqlite:x.db?password=hunter2").contains("hunter2"));
    }

    #[test]
    fn passwords_containing_at_signs_are_redacted() {
        let r = redact_url("postgres://signet:p@ss@w0rd@db:5432/signet");
        assert_eq!(r, "postgres://signet:…@db:5432/signet");
        assert!(!r.contains("ss"), "{r}");
        let r = redact_url("postgres://signet:a:b@c@db/signet?password=x@y");
        assert_eq!(r, "postgres://signet:…@db/signet?password=…");
        // An @ in another query parameter keeps the host readable.
        let r = redact_url("postgres://u@127.0.0.1:1/x?password=s3cr@t&sslmode=disable");
        assert_eq!(r, "postgres://u@127.0.0.1:1/x?password=…&sslmode=disable");
        // Unparsable (a password with '/', '?' or '#' unescaped): hidden entirely.
        for bad in [
            "postgres://u:p/ss@db/x",
            "postgres://u:p?ss@db/x",
            "postgres://u:p#ss@db/x",
        ] {
            let r = redact_url(bad);
            assert!(!r.contains("ss"), "{bad}: {r}");
        }
        assert_eq!(
            redact_url("postgres://[::1]:5432/x"),
            "postgres://[::1]:5432/x"
        );
    }

    #[test]
    fn the_admin_socket_is_0600_from_the_start_and_nothing_is_left_behind() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let _l = bind_admin_socket(&path).unwrap();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert!(meta.file_type().is_socket());
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
            // Connectable at its final path.
            std::os::unix::net::UnixStream::connect(&path).unwrap();
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(names, ["admin.sock"]);
            // A second server on the same data_dir is refused, naming the socket.
            let err = bind_admin_socket(&path).unwrap_err().to_string();
            assert!(err.contains("in use"), "{err}");
        });
    }

    #[test]
    fn data_dir_is_forced_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&data).unwrap();
        let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        let fresh = dir.path().join("a/b");
        create_private_dir(&fresh).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        // A symlink is refused rather than followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        let err = create_private_dir(&link).unwrap_err().to_string();
        assert!(err.contains("symlink"), "{err}");
    }
}
