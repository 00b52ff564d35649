//! Binding every listener before anything is served, so that a taken address stops the start
//! and the operator (and tests) learn every bound address at once ([`super::Started`]). The
//! HTTP listeners ([`HttpListeners`]) are bound first of all, before the database is reached:
//! they answer health probes while the server starts (`starting.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::{TcpListener, UnixListener};

use super::Started;
use super::setup::bind_admin_socket;
use crate::config::Config;
use crate::tls::ServerCertResolver;

/// Every bound listener.
pub(super) struct Listeners {
    /// gRPC over TLS (`listen`).
    pub(super) grpc: TcpListener,
    /// Metrics, health, checkpoints, CRLs (`http_listen`).
    pub(super) http: TcpListener,
    /// Health and readiness only (`probe_listen`), when on.
    pub(super) probes: Option<TcpListener>,
    /// The admin API (mode 0600, under `data_dir`).
    pub(super) admin: UnixListener,
    pub(super) admin_path: PathBuf,
    /// The SPIFFE bundle endpoint and its TLS (`[federation] bundle_endpoint_listen`), when on.
    pub(super) bundle_endpoint: Option<(TcpListener, Arc<rustls::ServerConfig>)>,
    /// OIDC discovery over TLS (`[jwt_svid] oidc_listen`), when on.
    pub(super) oidc: Option<(TcpListener, Arc<rustls::ServerConfig>)>,
}

/// The HTTP listeners, bound before anything else (see the module doc).
pub(super) struct HttpListeners {
    /// `http_listen`.
    pub(super) http: TcpListener,
    /// `probe_listen`, when on.
    pub(super) probes: Option<TcpListener>,
}

impl HttpListeners {
    pub(super) async fn bind(cfg: &Config) -> anyhow::Result<Self> {
        let http = TcpListener::bind(cfg.http_listen)
            .await
            .with_context(|| format!("binding http_listen address {}", cfg.http_listen))?;
        let probes = match cfg.probe_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding probe_listen address {addr}"))?,
            ),
            None => None,
        };
        Ok(Self { http, probes })
    }
}

impl Listeners {
    /// Binds the rest, beside the HTTP listeners bound at the start.
    pub(super) async fn bind(
        cfg: &Config,
        resolver: &Arc<ServerCertResolver>,
        HttpListeners { http, probes }: HttpListeners,
    ) -> anyhow::Result<Self> {
        let grpc = TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("binding listen address {}", cfg.listen))?;
        let admin_path = cfg.admin_socket_path();
        let admin = bind_admin_socket(&admin_path)?;
        let bundle_endpoint = match cfg.federation.bundle_endpoint_listen {
            Some(addr) => Some((
                TcpListener::bind(addr).await.with_context(|| {
                    format!("binding federation.bundle_endpoint_listen address {addr}")
                })?,
                crate::federation::tls_config(cfg, resolver.clone())?,
            )),
            None => None,
        };
        let j = &cfg.jwt_svid;
        let oidc = match (j.oidc_listen, &j.oidc_tls_cert_file, &j.oidc_tls_key_file) {
            (Some(addr), Some(cert), Some(key)) => Some((
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding jwt_svid.oidc_listen address {addr}"))?,
                crate::federation::web_tls_config(
                    cert,
                    key,
                    "jwt_svid.oidc_tls_cert_file",
                    "jwt_svid.oidc_tls_key_file",
                )?,
            )),
            _ => None,
        };
        Ok(Self {
            grpc,
            http,
            probes,
            admin,
            admin_path,
            bundle_endpoint,
            oidc,
        })
    }

    /// What the operator is told once everything is bound.
    pub(super) fn started(&self, cfg: &Config, root_sha256: String) -> anyhow::Result<Started> {
        Ok(Started {
            grpc: self.grpc.local_addr()?,
            http: self.http.local_addr()?,
            probes: match &self.probes {
                Some(l) => Some(l.local_addr()?),
                None => None,
            },
            root_sha256,
            bundle_path: cfg.bundle_path(),
            admin_socket: self.admin_path.clone(),
            bundle_endpoint: match &self.bundle_endpoint {
                Some((l, _)) => Some(l.local_addr()?),
                None => None,
            },
            oidc: match &self.oidc {
                Some((l, _)) => Some(l.local_addr()?),
                None => None,
            },
        })
    }
}
