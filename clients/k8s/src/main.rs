//! `signet-k8s`: the Kubernetes bridge binary.
//!
//! - `signet-k8s run`: the controllers (Issuer/ClusterIssuer status, CertificateRequest
//!   external issuer; with `--standalone-certificates` the Certificate reconcilers, with
//!   `--citadel` the Citadel-compatible Secrets and root ConfigMaps). With
//!   `--leader-election` they all run behind one gate, `Elector::run_while_leading`: only
//!   while this replica holds the Lease.
//!   With `--identities`, the identity objects (ClusterIdentity, Identity, Tenant) as the
//!   server's owned registration entries (behind the same gate).
//! - `signet-k8s crds [--out-dir DIR]`: the CRDs of `signet.dev`, as YAML.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use futures::StreamExt;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};

use signet_k8s::context::Context;
use signet_k8s::crd::{ClusterIssuer, Issuer};
use signet_k8s::operator::{BridgeConfig, OperatorServer};
use signet_k8s::{issuer_status, request};

#[derive(Parser)]
#[command(
    name = "signet-k8s",
    version,
    about = "Kubernetes bridge: cert-manager objects signed by Signet"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start
enum Cmd {
    /// Run the controllers.
    Run(RunArgs),
    /// Print the CRDs of signet.dev (Issuer, ClusterIssuer, ClusterIdentity, Identity, Tenant)
    /// as YAML, or write one file each.
    Crds {
        /// Write one `signet.dev_<plural>.yaml` per kind here.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The bridge's own namespace: ClusterIssuer refs are read from it.
    #[arg(long, env = "SIGNET_K8S_NAMESPACE", default_value = "signet-system")]
    namespace: String,
    /// The signet-server URL (`https://host:port`) that namespaced Issuers and Citadel mode
    /// use: an Issuer never chooses its server. Without it only ClusterIssuers work.
    #[arg(long, env = "SIGNET_K8S_SERVER")]
    server: Option<String>,
    /// The name checked in `--server`'s certificate, when it is not the URL's host.
    #[arg(long, env = "SIGNET_K8S_SERVER_NAME")]
    server_name: Option<String>,
    /// PEM roots that sign `--server`'s certificate (re-read at every check).
    #[arg(long, env = "SIGNET_K8S_BUNDLE")]
    bundle: Option<PathBuf>,
    /// The servers' trust domain: `--server` (and a ClusterIssuer without spec.trustDomain)
    /// must present `spiffe://<trust domain>/signet/server`. Default: the trust domain the
    /// bundle's roots name.
    #[arg(long, env = "SIGNET_K8S_TRUST_DOMAIN")]
    trust_domain: Option<String>,
    /// The bridge's own projected service-account token, sent only to `--server` and to the
    /// servers of ClusterIssuers.
    #[arg(long, env = "SIGNET_K8S_TOKEN", default_value = signet_k8s::crd::DEFAULT_TOKEN_PATH)]
    token: PathBuf,
    /// Standalone mode: reconcile `cert-manager.io/v1` Certificates whose issuerRef names a
    /// signet.dev issuer (only where cert-manager itself is not installed).
    #[arg(long, env = "SIGNET_K8S_STANDALONE_CERTIFICATES")]
    standalone_certificates: bool,
    /// Standalone mode: put an ownerReference to the Certificate on its Secret (as
    /// cert-manager's --enable-certificate-owner-ref).
    #[arg(long, env = "SIGNET_K8S_CERTIFICATE_OWNER_REF")]
    certificate_owner_ref: bool,
    /// Keeps this ConfigMap of the bridge's namespace (key `ca.crt`: what agents bootstrap
    /// from, e.g. `signet-bundle`) at the server's current roots, rewritten on every change
    /// (needs --server; the ConfigMap is created at install, deploy/README.md).
    #[arg(long, env = "SIGNET_K8S_BUNDLE_CONFIGMAP")]
    bundle_configmap: Option<String>,
    /// Citadel compatibility in namespaces labelled signet.dev/citadel=enabled (needs
    /// --server and --bundle).
    #[arg(long, env = "SIGNET_K8S_CITADEL")]
    citadel: bool,
    /// Reconcile Signet's identity objects (ClusterIdentity, Identity, Tenant) into the
    /// server's registration entries (needs --server, --bundle and --node-set).
    #[arg(long, env = "SIGNET_K8S_IDENTITIES")]
    identities: bool,
    /// The node set the identities' entries are served to (e.g. `k8s`): one listed in the
    /// server's `[policy.kubernetes_bridge] node_sets`.
    #[arg(long, env = "SIGNET_K8S_NODE_SET")]
    node_set: Option<String>,
    /// Identities of a namespace in no Tenant get the namespace defaults (`/ns/<ns>/`, the
    /// server's DNS templates) instead of being refused (NoTenant).
    #[arg(long, env = "SIGNET_K8S_IDENTITIES_WITHOUT_TENANT")]
    identities_without_tenant: bool,
    /// The bridge's pod name, reported as the instance of its Kubernetes Events.
    #[arg(long, env = "SIGNET_K8S_POD_NAME")]
    pod_name: Option<String>,
    /// Run the controllers only while this replica holds the Lease `--lease-name` of
    /// `--namespace` (coordination.k8s.io/v1), so several replicas run with one acting. A
    /// leader that cannot renew within `--renew-deadline` stops every controller and exits
    /// non-zero; on SIGTERM it releases the Lease.
    #[arg(long, env = "SIGNET_K8S_LEADER_ELECTION")]
    leader_election: bool,
    /// The leader election Lease's name.
    #[arg(long, env = "SIGNET_K8S_LEASE_NAME", default_value = signet_k8s::leader::DEFAULT_LEASE_NAME)]
    lease_name: String,
    /// How long a follower waits, after it last saw the Lease change, before taking over.
    #[arg(long, env = "SIGNET_K8S_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: std::time::Duration,
    /// How long the leader keeps acting without a successful renewal (less than
    /// --lease-duration).
    #[arg(long, env = "SIGNET_K8S_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    renew_deadline: std::time::Duration,
    /// How often a follower tries to acquire and the leader renews.
    #[arg(long, env = "SIGNET_K8S_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    retry_period: std::time::Duration,
    /// Serve `/healthz` and `/readyz` here (e.g. `0.0.0.0:8081`).
    #[arg(long, env = "SIGNET_K8S_HEALTH_ADDR")]
    health_addr: Option<SocketAddr>,
    /// Serve `/metrics` (Prometheus) here (e.g. `0.0.0.0:8080`).
    #[arg(long, env = "SIGNET_K8S_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Log as JSON lines instead of text; then every line on standard error is JSON (an error
    /// that stops the bridge included).
    #[arg(long, env = "SIGNET_K8S_LOG_JSON")]
    log_json: bool,
    /// The log filter: error, warn, info, debug, trace, off, or RUST_LOG's directives
    /// (info,signet_k8s=debug). Wins over RUST_LOG.
    #[arg(long, env = "SIGNET_K8S_LOG_LEVEL", value_name = "LEVEL")]
    log_level: Option<String>,
    /// Export traces (a span per reconcile) over OTLP/gRPC to this collector,
    /// `http://host:port`; no traces when unset.
    #[arg(long, env = "SIGNET_K8S_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// The traces' `service.name`. Default: `signet-k8s`.
    #[arg(long, env = "SIGNET_K8S_OTEL_SERVICE_NAME")]
    otel_service_name: Option<String>,
    /// The share of new traces kept, from 0 to 1.
    #[arg(long, env = "SIGNET_K8S_OTEL_SAMPLING", default_value_t = 1.0)]
    otel_sampling: f64,
}

impl RunArgs {
    /// `[telemetry]` as the server and agent read it, from the flags.
    fn telemetry(&self) -> signet_runtime::telemetry::TelemetryConfig {
        signet_runtime::telemetry::TelemetryConfig {
            otlp_endpoint: self.otlp_endpoint.clone(),
            service_name: self.otel_service_name.clone(),
            sampling: self.otel_sampling,
            ..Default::default()
        }
    }
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Crds { out_dir } => {
            let files = signet_k8s::crd::crd_files();
            match out_dir {
                Some(dir) => {
                    for (name, yaml) in files {
                        let p = dir.join(name);
                        std::fs::write(&p, yaml)
                            .with_context(|| format!("writing {}", p.display()))?;
                    }
                }
                None => {
                    let docs: Vec<String> = files.into_iter().map(|(_, y)| y).collect();
                    print!("---\n{}", docs.join("---\n"));
                }
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
        Cmd::Run(args) => Ok(run_logged(args)),
    }
}

/// `signet-k8s run` with its logs: a SIGHUP is logged (nothing to reload: the bridge is
/// configured by flags and the environment) and never stops it, and in JSON mode the error
/// that stops it is a JSON line too.
fn run_logged(args: RunArgs) -> std::process::ExitCode {
    use signet_runtime::telemetry::log_early_error;
    let json = args.log_json;
    let fail = |message: String| {
        log_early_error("signet-k8s", json, &message);
        std::process::ExitCode::from(2)
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    let mut hangups = {
        let _in_runtime = rt.enter();
        signet_runtime::shutdown::Hangups::watch()
    };
    let level = match args.log_level.as_deref().map(str::parse).transpose() {
        Ok(l) => l,
        Err(e) => return fail(format!("--log-level: {e}")),
    };
    // Inside the runtime: the trace exporter's connection lives on it.
    let logs = signet_runtime::telemetry::LogOptions {
        json,
        default_filter: "info,kube=warn",
        level,
    };
    let cfg = args.telemetry();
    let telemetry =
        match rt.block_on(async { signet_runtime::telemetry::init("signet-k8s", logs, &cfg) }) {
            Ok(t) => t,
            Err(e) => return fail(e.to_string()),
        };
    let hups = rt.spawn(async move {
        loop {
            hangups.recv().await;
            tracing::info!(
                "SIGHUP: nothing to reload (signet-k8s is configured by its flags and \
                 environment; restart it to change them)"
            );
        }
    });
    let result = rt.block_on(run(args));
    hups.abort();
    telemetry.shutdown();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if json => {
            tracing::error!("signet-k8s: {e:#}");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("Error: {e:?}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `/healthz` and `/readyz` (the process is up: a follower is as ready as the leader), on a
/// probe listener ([`signet_runtime::http::serve_probes`]: connection and per-source caps,
/// header-read, idle and lifetime timeouts sized for the kubelet).
async fn health(addr: SocketAddr) -> anyhow::Result<()> {
    let l = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "health endpoint");
    let router = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route("/readyz", axum::routing::get(|| async { "ok\n" }));
    signet_runtime::http::serve_probes("--health-addr", l, router, |_| {}, std::future::pending())
        .await?;
    Ok(())
}

/// `/metrics` (OpenMetrics or the Prometheus text format, as the scraper asks) on a listener of its own, within the default HTTP limits (as
/// the server's and agent's: a scraper never holds the kubelet's probe slots).
async fn metrics(
    addr: SocketAddr,
    metrics: Arc<signet_k8s::metrics::Metrics>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "metrics endpoint");
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| async move {
            let format = signet_runtime::metrics::negotiate(&headers);
            signet_runtime::metrics::response(format, metrics.encode(format))
        }),
    );
    let l = signet_runtime::http::HttpListener {
        name: "--metrics-addr",
        listener,
        limits: signet_runtime::http::HttpLimits::default(),
    };
    signet_runtime::http::serve(l, router, |_| {}, std::future::pending()).await?;
    Ok(())
}

/// The operator's part of the configuration, from the flags.
fn bridge_config(args: &RunArgs) -> anyhow::Result<BridgeConfig> {
    let server = match (&args.server, &args.bundle) {
        (Some(address), Some(bundle_file)) => Some(OperatorServer {
            address: address.clone(),
            server_name: args.server_name.clone(),
            bundle_file: bundle_file.clone(),
        }),
        (None, None) => None,
        _ => anyhow::bail!("--server and --bundle go together"),
    };
    let trust_domain = match &args.trust_domain {
        Some(td) => Some(
            td.parse()
                .map_err(|e| anyhow::anyhow!("--trust-domain {td:?}: {e}"))?,
        ),
        None => None,
    };
    let cfg = BridgeConfig {
        server,
        token_path: args.token.clone(),
        trust_domain,
    };
    cfg.validate().map_err(anyhow::Error::msg)?;
    Ok(cfg)
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let bridge = Arc::new(bridge_config(&args)?);
    let lease = lease_config(&args)?;
    if args.bundle_configmap.is_some() && bridge.server.is_none() {
        anyhow::bail!("--bundle-configmap needs --server (the bundle comes from its WatchBundle)");
    }
    match &bridge.server {
        Some(s) => tracing::info!(
            server = %s.address,
            bundle = %s.bundle_file.display(),
            token = %bridge.token_path.display(),
            "the server of namespaced Issuers and Citadel mode"
        ),
        None => {
            tracing::info!("no --server: namespaced Issuers cannot be used, ClusterIssuers only")
        }
    }
    let client = Client::try_default()
        .await
        .context("no Kubernetes client configuration (in-cluster or kubeconfig)")?;
    let events: Arc<dyn signet_k8s::events::Events> = Arc::new(
        signet_k8s::events::KubeEvents::new(client.clone(), args.pod_name.clone()),
    );
    let ctx = Arc::new(Context::new(
        client.clone(),
        &args.namespace,
        bridge.clone(),
        events.clone(),
    ));
    let metrics = Arc::new(signet_k8s::metrics::Metrics::new());
    let elector = match lease {
        None => None,
        Some(cfg) => Some(
            signet_k8s::leader::Elector::new(
                client.clone(),
                cfg,
                Arc::new(signet_runtime::clock::SystemClock),
                metrics.leader.clone(),
            )
            .map_err(|e| anyhow::anyhow!("--leader-election: {e}"))?,
        ),
    };
    if let Some(addr) = args.health_addr {
        tokio::spawn(async move {
            if let Err(e) = health(addr).await {
                tracing::error!(error = %e, "health endpoint stopped");
            }
        });
    }
    if let Some(addr) = args.metrics_addr {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = self::metrics(addr, m).await {
                tracing::error!(error = %e, "metrics endpoint stopped");
            }
        });
    }

    // Woken by its requests and by issuer changes (a request waiting for its issuer goes on
    // as soon as the issuer is Ready).
    let requests = request::run_controller(client.clone(), ctx.clone());
    let issuers = Controller::new(
        Api::<Issuer>::all(client.clone()),
        watcher::Config::default(),
    )
    .shutdown_on_signal()
    .run(
        issuer_status::reconcile_issuer,
        issuer_status::error_policy_issuer,
        ctx.clone(),
    )
    .for_each(|r| async move {
        signet_k8s::metrics::reconciled("issuer", &r);
        if let Err(e) = r {
            tracing::debug!(error = %e, "Issuer controller");
        }
    });
    let cluster_issuers = Controller::new(
        Api::<ClusterIssuer>::all(client.clone()),
        watcher::Config::default(),
    )
    .shutdown_on_signal()
    .run(
        issuer_status::reconcile_cluster_issuer,
        issuer_status::error_policy_cluster_issuer,
        ctx.clone(),
    )
    .for_each(|r| async move {
        signet_k8s::metrics::reconciled("cluster_issuer", &r);
        if let Err(e) = r {
            tracing::debug!(error = %e, "ClusterIssuer controller");
        }
    });
    let standalone = {
        let enabled = args.standalone_certificates;
        let client = client.clone();
        let backend = ctx.backend.clone();
        let namespace = args.namespace.clone();
        let owner_ref = args.certificate_owner_ref;
        let bridge = bridge.clone();
        let events = events.clone();
        async move {
            if !enabled {
                return;
            }
            // Taints and CRLs come from the operator's server (`--server`), when configured.
            let bundle = operator_bundle(&bridge);
            let signer = Arc::new(signet_k8s::certificate::IssuerSigners {
                client: client.clone(),
                backend,
                bridge_namespace: namespace,
                bridge,
            });
            signet_k8s::certificate::run(
                client,
                signer,
                Arc::new(signet_runtime::clock::SystemClock),
                Arc::new(signet_runtime::random::SystemRandom::default()),
                owner_ref,
                events,
                bundle,
            )
            .await;
        }
    };
    let bundle_configmap = {
        let client = client.clone();
        let namespace = args.namespace.clone();
        let name = args.bundle_configmap.clone();
        let bridge = bridge.clone();
        async move {
            if let Some(name) = name {
                tracing::info!(%namespace, configmap = %name, "keeping the trust bundle ConfigMap current");
                // Opened here, not before: nothing of this task starts on a follower.
                let bundle = operator_bundle(&bridge);
                signet_k8s::bundle_configmap::run(client, namespace, name, bundle).await;
            }
        }
    };
    let citadel = citadel(args.citadel, &bridge, client.clone());
    let identities = {
        let options = identity_options(&args, &bridge)?;
        let (client, bridge, events) = (client.clone(), bridge.clone(), events.clone());
        async move {
            if let Some(options) = options {
                signet_k8s::identity::run_identities(client, bridge, options, events).await;
            }
        }
    };
    tracing::info!(namespace = %args.namespace, "signet-k8s running");
    // Every controller and writer of the bridge: nothing above has started yet (futures are
    // lazy), and nothing of it starts except through the leader gate below.
    let controllers = async move {
        let (_, _, _, _, _, citadel, _) = tokio::join!(
            requests,
            issuers,
            cluster_issuers,
            standalone,
            bundle_configmap,
            citadel,
            identities
        );
        citadel
    };
    // THE gate: with --leader-election the controllers run only while this replica holds
    // the Lease (a lost Lease is an error: exit non-zero, restart as a follower).
    match elector {
        None => controllers.await,
        Some(elector) => {
            use signet_k8s::leader::Outcome;
            match elector
                .run_while_leading(signet_runtime::shutdown::signal(), controllers)
                .await?
            {
                Outcome::Finished(r) => r,
                Outcome::ShutdownWhileLeading | Outcome::ShutdownWhileFollowing => Ok(()),
            }
        }
    }
}

/// The leader election of `--leader-election` (checked), its identity the pod's name
/// (`POD_NAME` from the downward API, else `--pod-name`, else the host name).
fn lease_config(args: &RunArgs) -> anyhow::Result<Option<signet_k8s::leader::LeaseConfig>> {
    if !args.leader_election {
        return Ok(None);
    }
    let identity = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| args.pod_name.clone())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_default();
    let cfg = signet_k8s::leader::LeaseConfig {
        namespace: args.namespace.clone(),
        name: args.lease_name.clone(),
        identity,
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
    };
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("--leader-election: {e}"))?;
    tracing::info!(identity = %cfg.identity, lease = %cfg.name, "leader election on");
    Ok(Some(cfg))
}

/// `--identities` and its flags; None when off.
fn identity_options(
    args: &RunArgs,
    bridge: &BridgeConfig,
) -> anyhow::Result<Option<signet_k8s::identity::IdentityOptions>> {
    if !args.identities {
        return Ok(None);
    }
    if bridge.server.is_none() {
        anyhow::bail!("--identities needs --server and --bundle (the entries go to that server)");
    }
    let Some(name) = &args.node_set else {
        anyhow::bail!(
            "--identities needs --node-set (SIGNET_K8S_NODE_SET): the node set the entries are served to, one listed in the server's [policy.kubernetes_bridge] node_sets"
        );
    };
    let node_set = signet_types::node_set::NodeSetName::new(name)
        .map_err(|e| anyhow::anyhow!("--node-set {name:?}: {e}"))?;
    Ok(Some(signet_k8s::identity::IdentityOptions {
        node_set,
        without_tenant: args.identities_without_tenant,
    }))
}

/// The operator's server's bundle stream (`--server`, `--bundle`, `--token`), kept current in
/// the background (connecting with retries); always `None` without `--server`.
fn operator_bundle(
    bridge: &BridgeConfig,
) -> tokio::sync::watch::Receiver<Option<signet_k8s::signer::BundleInfo>> {
    let (tx, rx) = tokio::sync::watch::channel(None);
    if bridge.server.is_none() {
        // Keep the sender alive: the receiver then simply never changes.
        std::mem::forget(tx);
        return rx;
    }
    let bridge = bridge.clone();
    tokio::spawn(async move {
        let channel = loop {
            let attempt = async {
                let target = bridge.operator_target().map_err(|e| e.to_string())?;
                signet_client::connect(&target, None)
                    .await
                    .map_err(|e| e.to_string())
            };
            match attempt.await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(error = %e, "standalone certificates: cannot reach the server for WatchBundle yet");
                    signet_runtime::clock::sleep(std::time::Duration::from_secs(5)).await;
                }
            }
        };
        signet_k8s::citadel::watch_bundle(channel, Some(bridge.token_path.clone()), tx).await;
    });
    rx
}

/// Citadel mode on the operator's server (`--server`, `--bundle`, `--token`).
async fn citadel(enabled: bool, bridge: &BridgeConfig, client: Client) -> anyhow::Result<()> {
    use signet_k8s::signer::{Credentials, Signer, SignerConfig};
    if !enabled {
        return Ok(());
    }
    if bridge.server.is_none() {
        anyhow::bail!("--citadel needs --server and --bundle");
    }
    // Keep trying: the server may start after the bridge, the bundle may not be mounted yet.
    let (target, signer) = loop {
        let attempt = async {
            let target = bridge.operator_target().map_err(|e| e.to_string())?;
            let cfg = SignerConfig {
                target: target.clone(),
                credentials: Credentials::TokenFile(bridge.token_path.clone()),
            };
            let signer = Signer::connect(&cfg).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((target, signer))
        };
        match attempt.await {
            Ok(ok) => break ok,
            Err(e) => {
                tracing::warn!(error = %e, "citadel: cannot reach the server yet");
                signet_runtime::clock::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    };
    let channel = signet_client::connect(&target, None)
        .await
        .context("citadel: connecting for WatchBundle")?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    let token = Some(bridge.token_path.clone());
    tokio::spawn(signet_k8s::citadel::watch_bundle(channel, token, tx));
    let ctx = Arc::new(signet_k8s::citadel::Context {
        client,
        signer: Arc::new(signet_k8s::certificate::FixedSigner(signer)),
        clock: Arc::new(signet_runtime::clock::SystemClock),
        random: Arc::new(signet_runtime::random::SystemRandom::default()),
        bundle: rx,
    });
    signet_k8s::citadel::run(ctx).await;
    Ok(())
}
