//! Start-up and wiring, top-down in [`run`]: bind the HTTP listeners and answer health
//! probes on them while starting (`starting.rs`), build the parts (`parts.rs`: data directory,
//! store, the deployment's pinned values (`pins.rs`: a server configured for another
//! deployment stops here), CA key manager, bundle, ledger, issuer, checkpoints, CRLs), bind
//! every listener (`listeners.rs`), then serve them (`serve.rs`: gRPC over TLS, the admin
//! socket, HTTP, probes, the SPIFFE bundle endpoint, and the background tasks of `tasks.rs`)
//! with every task under one shutdown (`supervisor.rs`) until shutdown. Host-facing steps are
//! in `setup.rs`.

use std::net::SocketAddr;

use crate::config::Config;

mod listeners;
mod parts;
pub(crate) mod pins;
mod serve;
mod setup;
mod starting;
mod supervisor;
mod tasks;

pub use setup::redact_url;

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
    /// OIDC discovery over TLS (`[jwt_svid] oidc_listen`), when on.
    pub oidc: Option<SocketAddr>,
}

/// Runs the server until `shutdown` resolves (or one of its tasks fails). `on_started` is
/// called once every listener is bound. Every task the server spawned has ended when this
/// returns.
///
/// With `reload`, each SIGHUP reloads what can be reloaded (see [`crate::reload`]).
pub async fn run(
    cfg: Config,
    reload: Option<crate::reload::Reload>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_started: impl FnOnce(&Started),
) -> anyhow::Result<()> {
    crate::federation::check_web_tls_files(&cfg)?;
    // Health answers from the start: the database may keep the server waiting.
    let status = std::sync::Arc::new(starting::StartupStatus::default());
    status.set("opening the data directory");
    let http = listeners::HttpListeners::bind(&cfg).await?;
    let starting = starting::serve(&cfg, http, status.clone())?;
    let parts = parts::build(&cfg, &status).await?;
    let http = starting.finish().await;
    let listeners = listeners::Listeners::bind(&cfg, &parts.server_cert.resolver, http).await?;
    serve::serve(cfg, parts, listeners, reload, shutdown, on_started).await
}

/// SHA-256 fingerprint in the usual `AB:CD:…` spelling.
fn fingerprint(der: &[u8]) -> String {
    signet_pki::fingerprint::sha256_colon(der)
}
