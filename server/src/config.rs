//! Server configuration: defaults, then a TOML file, then `SIGNET_*` environment variables,
//! then command-line flags (layered by [`signet_runtime::config`]). Unknown keys are refused,
//! by name.
//!
//! About 800 lines, on purpose: this is the operator's whole `signet.toml` surface and every
//! rule that spans sections, so a setting and its check are found in one file. Sections owned by
//! one subsystem live with it and are re-exported here (`ca::config`, `store::DatabaseConfig`,
//! `revoked::CrlConfig`, `signet_runtime::telemetry::TelemetryConfig`).
//!
//! Nested keys use a double underscore in the environment: `SIGNET_CA__DEFAULT_TTL=30m`,
//! `SIGNET_AUTH__KUBERNETES__ISSUER=…`; top-level ones a single prefix: `SIGNET_TRUST_DOMAIN`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use signet_runtime::config::Layers;
use signet_types::TrustDomain;
use signet_types::dns::{Dns1123Label, Dns1123Subdomain};

pub use crate::store::DatabaseConfig;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The SPIFFE trust domain this CA issues for.
    pub trust_domain: String,
    /// gRPC listener (TLS): native, Istio and health/reflection services.
    pub listen: SocketAddr,
    /// HTTP listener: /healthz, /readyz, /metrics, /crl, /checkpoint.
    pub http_listen: SocketAddr,
    /// The probe listener: only /healthz and /readyz, with bounds of its own, so that no client
    /// of `http_listen` can crowd the kubelet's probes out (see [`signet_runtime::http`]). Off
    /// when absent; deploy/ sets it and points the probes at it.
    pub probe_listen: Option<SocketAddr>,
    /// `sqlite://PATH` or `postgres://…`. Empty means `sqlite://<data_dir>/signet.db`, except
    /// where a database is expected: with `require_database_url`, or in Kubernetes (see
    /// [`check_database_choice`]).
    pub database_url: String,
    /// Refuse to start without an explicit `database_url` (no embedded SQLite default): set it
    /// where the database URL comes from elsewhere (a Secret, `SIGNET_DATABASE_URL`), so that a
    /// missing or misspelt variable stops the server instead of starting a private CA.
    pub require_database_url: bool,
    /// The log filter: a level (`error`, `warn`, `info`, `debug`, `trace`, `off`) or
    /// `RUST_LOG`'s directives (`info,signet_server=debug`). Set (here, as
    /// `SIGNET_LOG_LEVEL` or `--log-level`) it wins over `RUST_LOG`; unset, `RUST_LOG` is
    /// used, else `info`. Reloaded on SIGHUP.
    pub log_level: Option<signet_runtime::telemetry::LogLevel>,
    /// Where the bundle, admin socket, key-encryption key and (by default) the database live.
    pub data_dir: PathBuf,
    /// Extra DNS names for the server's own TLS certificate (besides `localhost`).
    pub server_names: Vec<String>,
    /// Largest gRPC message accepted, in bytes.
    pub max_message_bytes: usize,
    pub ca: CaConfig,
    pub auth: AuthConfig,
    pub policy: PolicyConfig,
    pub ledger: LedgerConfig,
    pub nodes: NodesConfig,
    pub limits: LimitsConfig,
    pub database: DatabaseConfig,
    pub checkpoint: CheckpointConfig,
    pub federation: FederationConfig,
    /// JWT-SVIDs: signing keys, token lifetimes, the OpenID Connect issuer (`[jwt_svid]`, see
    /// [`crate::ca::jwt_config`]).
    pub jwt_svid: JwtSvidConfig,
    /// Certificate revocation lists (`[crl]`, see [`crate::crl`]).
    pub crl: crate::revoked::CrlConfig,
    /// Traces over OTLP (`[telemetry]`, see [`signet_runtime::telemetry`]); off by default.
    pub telemetry: signet_runtime::telemetry::TelemetryConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            trust_domain: "example.org".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8443)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            probe_listen: None,
            database_url: String::new(),
            require_database_url: false,
            log_level: None,
            data_dir: PathBuf::from("signet-data"),
            server_names: Vec::new(),
            max_message_bytes: 256 * 1024,
            ca: CaConfig::default(),
            auth: AuthConfig::default(),
            policy: PolicyConfig::default(),
            ledger: LedgerConfig::default(),
            nodes: NodesConfig::default(),
            limits: LimitsConfig::default(),
            database: DatabaseConfig::default(),
            checkpoint: CheckpointConfig::default(),
            federation: FederationConfig::default(),
            jwt_svid: JwtSvidConfig::default(),
            crl: crate::revoked::CrlConfig::default(),
            telemetry: Default::default(),
        }
    }
}

pub use crate::ca::KeyType;

pub use crate::ca::config::{CaConfig, PluggedCaFiles};
pub use crate::ca::jwt_config::{JwtKeyType, JwtSvidConfig};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub kubernetes: Option<KubernetesAuthConfig>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesAuthConfig {
    /// Expected `iss` claim, e.g. `https://kubernetes.default.svc.cluster.local`.
    pub issuer: String,
    /// The issuer's JWKS (JSON), as served at its OIDC discovery `jwks_uri`.
    pub jwks_file: PathBuf,
    /// Accepted `aud` values; a token must carry at least one.
    #[serde(default = "default_audiences")]
    pub audiences: Vec<String>,
    /// Clock skew tolerated on `exp`/`nbf`/`iat`.
    #[serde(default = "default_leeway", with = "humantime_serde")]
    pub leeway: Duration,
    /// How often `jwks_file` is re-read while tokens arrive (Kubernetes rotates its
    /// service-account signing keys; kubelet updates a mounted ConfigMap in place): a key
    /// removed from the file stops verifying tokens within this long, without a restart. A
    /// token signed by a key the server does not know re-reads the file at once (at most once a
    /// second). 1 second to 1 hour.
    #[serde(default = "default_jwks_refresh", with = "humantime_serde")]
    pub jwks_refresh: Duration,
}

fn default_jwks_refresh() -> Duration {
    Duration::from_secs(10)
}

fn default_audiences() -> Vec<String> {
    vec!["istio-ca".into(), "signet".into()]
}

fn default_leeway() -> Duration {
    Duration::from_secs(30)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// DNS names a Kubernetes service account may put in its certificate, as templates with
    /// `{namespace}` and `{serviceaccount}`; a leading `*.` matches exactly one label.
    /// Example: `["{serviceaccount}.{namespace}.svc", "*.{namespace}.svc.cluster.local"]`.
    pub kubernetes_dns_templates: Vec<String>,
    /// SPIFFE IDs allowed to ask on behalf of another identity (Istio's `ImpersonatedIdentity`).
    pub impersonators: Vec<String>,
    /// Callers allowed to act as the Kubernetes bridge (`SignCsrRequest.kubernetes_namespace`).
    pub kubernetes_bridge: KubernetesBridgeConfig,
    /// How long after its original credential was checked (a service-account token, the
    /// operator's mint) a certificate may still be renewed over mTLS. Renewals carry that
    /// moment forward, so a stolen certificate cannot renew itself forever; the workload then
    /// authenticates with its credential again. Entry certificates are re-checked against their
    /// entry and node at every renewal instead.
    #[serde(with = "humantime_serde")]
    pub mtls_renewal_max_age: Duration,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            kubernetes_dns_templates: Vec::new(),
            impersonators: Vec::new(),
            kubernetes_bridge: KubernetesBridgeConfig::default(),
            mtls_renewal_max_age: Duration::from_secs(24 * 3600),
        }
    }
}

/// `[policy.kubernetes_bridge]`: who may ask for certificates on behalf of Kubernetes objects,
/// namespace by namespace (the `signet-k8s` bridge).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesBridgeConfig {
    /// SPIFFE IDs allowed to act as the bridge (its service account's ID, or the ID of the
    /// Signet certificate it presents over mTLS). Empty: the feature is off.
    pub callers: Vec<String>,
    /// DNS names a bridge may put in a certificate for an object in a namespace, as templates
    /// with `{namespace}`; a leading `*.` matches one or more labels in front of the rest, a
    /// template without `*` is one exact name.
    pub dns_templates: Vec<String>,
    /// The node sets the bridge may name as the parent of the entries it keeps through the
    /// Registration service (`signet.ca.v1.Registration`). Empty: that service is off.
    pub node_sets: Vec<String>,
    /// SPIFFE ID path prefixes the bridge's entries may use besides `/ns/<namespace>/`, e.g.
    /// `"/platform/"`: each starts and ends with '/', never under `/signet/`.
    pub entry_path_prefixes: Vec<String>,
    /// Most entries one registrar may keep (all its scopes together).
    pub max_owned_entries: u32,
}

impl Default for KubernetesBridgeConfig {
    fn default() -> Self {
        Self {
            callers: Vec::new(),
            dns_templates: vec![
                "*.{namespace}.svc".into(),
                "*.{namespace}.svc.cluster.local".into(),
            ],
            node_sets: Vec::new(),
            entry_path_prefixes: Vec::new(),
            max_owned_entries: 10_000,
        }
    }
}

impl KubernetesBridgeConfig {
    /// The Registration service's keys: node set names, path prefixes, the cap.
    fn validate(&self) -> Result<(), ConfigError> {
        const KEY: &str = "policy.kubernetes_bridge";
        for n in &self.node_sets {
            signet_types::node_set::NodeSetName::new(n)
                .map_err(|e| ConfigError::Invalid(format!("{KEY}.node_sets: {n:?}: {e}")))?;
        }
        for p in &self.entry_path_prefixes {
            if let Err(why) = check_entry_path_prefix(p) {
                return Err(ConfigError::Invalid(format!(
                    "{KEY}.entry_path_prefixes: {p:?} {why}"
                )));
            }
        }
        if self.max_owned_entries == 0 {
            return Err(ConfigError::Invalid(format!(
                "{KEY}.max_owned_entries must be positive (the default is 10000)"
            )));
        }
        Ok(())
    }
}

/// Why an `entry_path_prefixes` value is refused: it must be a SPIFFE ID path that starts and
/// ends with '/', with at least one segment, outside `/signet/`.
fn check_entry_path_prefix(p: &str) -> Result<(), &'static str> {
    if !(p.len() > 1 && p.starts_with('/') && p.ends_with('/')) {
        return Err(
            "must start and end with '/' and name at least one segment, e.g. \"/platform/\"",
        );
    }
    let segments = p[1..p.len() - 1].split('/');
    for seg in segments {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err("has an empty, '.' or '..' segment");
        }
        if !seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err("may hold only letters, digits, '.', '_', '-' and '/'");
        }
    }
    if p == "/signet/" || p.starts_with("/signet/") {
        return Err("is under /signet/, which is reserved for Signet's own identities");
    }
    Ok(())
}

/// `[nodes]`: how node agents may attest besides one-time join tokens.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodesConfig {
    /// Kubernetes projected service-account token (PSAT) attestation; off when absent.
    pub kubernetes: Option<NodesKubernetesConfig>,
    /// `[nodes.watch]`: the limits of the `WatchEntries` push streams.
    pub watch: NodesWatchConfig,
}

/// `[nodes.watch]`: the limits of the `WatchEntries` push streams (`api::node_watch`). Each
/// must be positive; the keep-alive (which also re-checks the node's ban) must come before
/// the end of the stream's lifetime, or a banned node's open stream would only end then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodesWatchConfig {
    /// Most open streams of one node on one replica; more answer ResourceExhausted (an agent
    /// holds one; a restart overlaps the old one for a moment).
    pub streams_per_node: usize,
    /// How often the revision is sent again when nothing changed; the node's ban is looked
    /// up again each time (a banned node's stream ends with PermissionDenied).
    #[serde(with = "humantime_serde")]
    pub keepalive: Duration,
    /// How long one stream lives; then it ends with OK and the node reconnects (and is
    /// authenticated again).
    #[serde(with = "humantime_serde")]
    pub max_lifetime: Duration,
}

impl Default for NodesWatchConfig {
    fn default() -> Self {
        Self {
            streams_per_node: 4,
            keepalive: Duration::from_secs(15),
            max_lifetime: Duration::from_secs(600),
        }
    }
}

impl NodesWatchConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.streams_per_node == 0 {
            return Err(ConfigError::Invalid(
                "nodes.watch.streams_per_node must be positive (0 would refuse every node's \
                 entry stream; the agent then only polls)"
                    .into(),
            ));
        }
        for (name, v) in [
            ("nodes.watch.keepalive", self.keepalive),
            ("nodes.watch.max_lifetime", self.max_lifetime),
        ] {
            if v.is_zero() {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be positive (e.g. \"15s\" and \"10m\")"
                )));
            }
        }
        if self.keepalive >= self.max_lifetime {
            return Err(ConfigError::Invalid(format!(
                "nodes.watch.keepalive ({}) must be shorter than nodes.watch.max_lifetime ({}): \
                 the keep-alive is when an open stream notices that its node was banned",
                humantime::format_duration(self.keepalive),
                humantime::format_duration(self.max_lifetime)
            )));
        }
        Ok(())
    }
}

/// `[nodes.kubernetes]`: an agent running as a DaemonSet attests with its projected
/// service-account token, validated with `[auth.kubernetes]`'s issuer and JWKS. The node ID is
/// `k8s-<node name>` from the token's `kubernetes.io.node.name` claim.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodesKubernetesConfig {
    /// `<namespace>:<serviceaccount>` pairs whose tokens may attest a node.
    pub allowed_service_accounts: Vec<String>,
    /// Accepted `aud` values for node tokens; must not overlap `auth.kubernetes.audiences`,
    /// so that a workload's token can never attest a node.
    #[serde(default = "default_node_audiences")]
    pub audiences: Vec<String>,
    /// The cluster's name (a DNS-1123 subdomain): every node attested here proves
    /// `k8s_psat:cluster:<name>`, which node sets select on. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

fn default_node_audiences() -> Vec<String> {
    vec!["signet-node".into()]
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// Most certificates committed in one transaction.
    pub max_batch: usize,
    /// Pending issuances waiting for a commit before new ones are refused (Unavailable).
    pub queue_depth: usize,
    /// How long an issuance waits for its ledger commit (queueing included) before it answers
    /// Unavailable; the certificate is then discarded, never returned.
    #[serde(with = "humantime_serde")]
    pub commit_deadline: Duration,
    /// `/readyz` answers 503 while issuances have waited this long without a commit, and for
    /// this long after a failed commit (until one succeeds).
    #[serde(with = "humantime_serde")]
    pub ready_max_wait: Duration,
    /// `/readyz` answers 503 while more issuances than this wait for a commit.
    pub ready_max_queue: usize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            max_batch: 512,
            queue_depth: 16384,
            commit_deadline: Duration::from_secs(5),
            ready_max_wait: Duration::from_secs(5),
            ready_max_queue: 8192,
        }
    }
}

/// A token bucket: up to `burst` at once, refilled at `per_second`. `per_second = 0` turns
/// the limit off.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    pub burst: u32,
    pub per_second: f64,
}

impl RateConfig {
    pub const fn new(burst: u32, per_second: f64) -> Self {
        Self { burst, per_second }
    }

    pub fn is_off(&self) -> bool {
        self.per_second <= 0.0
    }
}

/// `[limits]`: what one client, one connection or the whole server may hold at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Open connections on the gRPC (TLS) listener, handshakes included; more are closed at once.
    pub max_connections: usize,
    /// Connections from one source address (IPv6: one /64) at once; more are closed at once.
    pub max_connections_per_source: usize,
    /// A TLS handshake not finished within this is dropped.
    #[serde(with = "humantime_serde")]
    pub tls_handshake_timeout: Duration,
    /// HTTP/2 streams one connection may have open; more are refused (REFUSED_STREAM).
    pub max_concurrent_streams: u32,
    /// Streams a client may open and reset before the server has accepted them (HTTP/2
    /// rapid reset); more close the connection (GOAWAY ENHANCE_YOUR_CALM).
    pub http2_max_pending_accept_reset_streams: usize,
    /// Streams the server may reset or refuse on one connection because of the client's
    /// errors (refused streams over `max_concurrent_streams` count); more close the connection
    /// (GOAWAY ENHANCE_YOUR_CALM).
    pub http2_max_local_error_reset_streams: usize,
    /// A connection with no open stream for this long is closed.
    #[serde(with = "humantime_serde")]
    pub connection_idle_timeout: Duration,
    /// HTTP/2 PING interval on every connection (dead peers are found and dropped).
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// A PING not answered within this closes the connection.
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// Longest a unary request may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Unary gRPC requests served at once, server wide; more answer ResourceExhausted.
    pub max_concurrent_requests: usize,
    /// `WatchBundle` streams open at once, server wide (one per agent); more answer
    /// ResourceExhausted.
    pub max_watch_streams: usize,
    /// Requests and streams one source address holds at once; more answer ResourceExhausted.
    pub max_requests_per_source: usize,
    /// Open connections on `http_listen` (and on the bundle endpoint); more are closed at once.
    pub http_max_connections: usize,
    /// Of those, from one source address (IPv6: one /64); more are closed at once.
    pub http_max_connections_per_source: usize,
    /// An HTTP connection with no request in flight that has received nothing for this long
    /// (before its first request, between keep-alive requests) is closed.
    #[serde(with = "humantime_serde")]
    pub http_idle_timeout: Duration,
    /// An HTTP request whose headers have not all arrived within this is dropped.
    #[serde(with = "humantime_serde")]
    pub http_header_read_timeout: Duration,
    /// Longest an HTTP connection may stay open (keep-alive included).
    #[serde(with = "humantime_serde")]
    pub http_connection_timeout: Duration,
    /// Certificates one authenticated caller may ask for.
    pub issuance_per_caller: RateConfig,
    /// Certificate requests (SignCsr, CreateCertificate, SignWorkloads, RenewNode) from one
    /// source address (IPv6: one /64).
    pub issuance_per_source: RateConfig,
    /// Node attestations (`Attest`: join tokens, node tokens) from one source address.
    pub attestation_per_source: RateConfig,
    /// Attestations of one node with its Kubernetes node token.
    pub attestation_per_caller: RateConfig,
    /// Callers and sources tracked by the rate limiters at once.
    pub rate_limit_max_keys: usize,
    /// Audit events of one kind from one caller and source recorded one by one per
    /// `audit_window`; the rest are recorded as one aggregate event. Admin actions are
    /// never aggregated.
    pub audit_burst: u32,
    #[serde(with = "humantime_serde")]
    pub audit_window: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_source: 512,
            tls_handshake_timeout: Duration::from_secs(10),
            max_concurrent_streams: 100,
            http2_max_pending_accept_reset_streams: 20,
            http2_max_local_error_reset_streams: 1024,
            connection_idle_timeout: Duration::from_secs(300),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            request_timeout: Duration::from_secs(30),
            max_concurrent_requests: 1024,
            max_watch_streams: 4096,
            max_requests_per_source: 512,
            http_max_connections: 64,
            http_max_connections_per_source: 8,
            http_idle_timeout: Duration::from_secs(3),
            http_header_read_timeout: Duration::from_secs(5),
            http_connection_timeout: Duration::from_secs(60),
            issuance_per_caller: RateConfig::new(100, 10.0),
            issuance_per_source: RateConfig::new(500, 100.0),
            attestation_per_source: RateConfig::new(20, 0.5),
            attestation_per_caller: RateConfig::new(5, 0.05),
            rate_limit_max_keys: 100_000,
            audit_burst: 5,
            audit_window: Duration::from_secs(10),
        }
    }
}

impl LimitsConfig {
    /// The bounds of `http_listen` and of the bundle endpoint, as the listener takes them.
    pub fn http_limits(&self) -> signet_runtime::http::HttpLimits {
        signet_runtime::http::HttpLimits {
            max_connections: self.http_max_connections,
            max_connections_per_source: self.http_max_connections_per_source,
            header_read_timeout: self.http_header_read_timeout,
            idle_timeout: self.http_idle_timeout,
            connection_timeout: self.http_connection_timeout,
        }
    }
}

/// `[checkpoint]`: signed ledger checkpoints (see `checkpoint.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// How often the ledger's head is signed, when it moved since the last checkpoint.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// The Ed25519 checkpoint key (PEM PKCS#8). When absent, `<data_dir>/checkpoint.key` is
    /// created (mode 0600) on first start. Never in the database; replicas sharing one
    /// PostgreSQL should share it, like `ca.kek_file`.
    pub key_file: Option<PathBuf>,
    /// Checkpoint files kept under `<data_dir>/checkpoints/` (the oldest are removed).
    pub keep: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            key_file: None,
            keep: 10_000,
        }
    }
}

/// How the SPIFFE bundle endpoint authenticates itself (SPIFFE Federation, section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BundleEndpointProfile {
    /// TLS with Signet's own X509-SVID for `spiffe://<trust domain>/signet/server`.
    #[default]
    HttpsSpiffe,
    /// TLS with a configured (Web PKI) certificate: `web_cert_file` and `web_key_file`.
    HttpsWeb,
}

/// `[federation]`: the SPIFFE bundle endpoint other trust domains federate with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FederationConfig {
    /// Address of the HTTPS bundle endpoint (`GET /`); off when absent. Bounded like
    /// `http_listen` (`limits.http_*`).
    pub bundle_endpoint_listen: Option<SocketAddr>,
    /// `https_spiffe` (default: Signet's own SVID) or `https_web` (the files below).
    pub bundle_endpoint_profile: BundleEndpointProfile,
    /// `https_web`: the certificate chain (PEM, leaf first) and its private key (PEM PKCS#8).
    pub web_cert_file: Option<PathBuf>,
    pub web_key_file: Option<PathBuf>,
    /// `spiffe_refresh_hint`: how often relying parties should fetch the bundle again.
    #[serde(with = "humantime_serde")]
    pub refresh_hint: Duration,
    /// Federated bundles: a foreign document's `spiffe_refresh_hint` is obeyed within
    /// `[fetch_refresh_min, fetch_refresh_max]`; `fetch_refresh_default` without one.
    #[serde(with = "humantime_serde")]
    pub fetch_refresh_min: Duration,
    #[serde(with = "humantime_serde")]
    pub fetch_refresh_max: Duration,
    #[serde(with = "humantime_serde")]
    pub fetch_refresh_default: Duration,
    /// The first retry after a failed fetch (doubling up to the refresh interval).
    #[serde(with = "humantime_serde")]
    pub fetch_retry: Duration,
    /// One fetch, connection to last byte.
    #[serde(with = "humantime_serde")]
    pub fetch_timeout: Duration,
    /// `https_web` relationships: a PEM CA file to authenticate endpoints with instead of the
    /// compiled-in Web PKI roots (webpki-roots, Mozilla's set).
    pub fetch_web_ca_file: Option<PathBuf>,
    /// `[[federation.relationships]]`: relationships declared here are created at start-up when
    /// the database has none for their trust domain (the database, shared by the replicas,
    /// stays the truth: one that differs is reported, not changed).
    pub relationships: Vec<RelationshipConfig>,
}

/// One `[[federation.relationships]]`, with the fields of `signetctl federation create`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelationshipConfig {
    pub trust_domain: String,
    /// Empty: a static relationship (`bundle_file` only).
    pub bundle_endpoint_url: String,
    /// `https_spiffe` or `https_web` with a URL.
    pub profile: String,
    pub endpoint_spiffe_id: String,
    /// PEM certificates or a SPIFFE bundle document: the starting bundle.
    pub bundle_file: Option<PathBuf>,
}

impl Default for FederationConfig {
    fn default() -> Self {
        Self {
            bundle_endpoint_listen: None,
            bundle_endpoint_profile: BundleEndpointProfile::default(),
            web_cert_file: None,
            web_key_file: None,
            refresh_hint: Duration::from_secs(300),
            fetch_refresh_min: Duration::from_secs(30),
            fetch_refresh_max: Duration::from_secs(3600),
            fetch_refresh_default: Duration::from_secs(300),
            fetch_retry: Duration::from_secs(5),
            fetch_timeout: Duration::from_secs(30),
            fetch_web_ca_file: None,
            relationships: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(String),
    #[error("configuration: {0}")]
    Invalid(String),
}

impl From<signet_runtime::config::LoadError> for ConfigError {
    fn from(e: signet_runtime::config::LoadError) -> Self {
        // figment's messages name the offending key and where it came from; keep all of them.
        ConfigError::Load(e.to_string())
    }
}

/// The top-level keys of [`Config`], for the environment filter.
const TOP_LEVEL_KEYS: &[&str] = &[
    "trust_domain",
    "listen",
    "http_listen",
    "probe_listen",
    "database_url",
    "require_database_url",
    "log_level",
    "data_dir",
    "server_names",
    "max_message_bytes",
    "ca",
    "auth",
    "policy",
    "ledger",
    "nodes",
    "limits",
    "database",
    "checkpoint",
    "federation",
    "jwt_svid",
    "crl",
    "telemetry",
];

/// How the server's configuration is named in the environment: `SIGNET_<KEY>`, and the
/// `SIGNET_` variables that are not its configuration (an unknown one stops start-up, see
/// [`signet_runtime::config::check_env`]).
pub const ENV: signet_runtime::config::EnvSpec = signet_runtime::config::EnvSpec {
    binary: "signet-server",
    prefix: "SIGNET_",
    keys: TOP_LEVEL_KEYS,
    others: NOT_CONFIGURATION,
};

/// `SIGNET_` variables that other programs read. The other binaries' own namespaces, and the
/// development tools' variables: a developer's shell and the test suite carry them, and every
/// server the tests and scripts start inherits them. README "Configuration" lists them.
const NOT_CONFIGURATION: &[(&str, &str)] = &[
    // Set in deploy/server.yaml so that `kubectl exec … -- signetctl` finds the socket.
    ("SIGNET_ADMIN_SOCKET", "signetctl"),
    ("SIGNET_AGENT_*", "signet-agent"),
    ("SIGNET_K8S_*", "signet-k8s"),
    ("SIGNET_TEST_*", "the test suite"),
    ("SIGNET_PYTHON", "the test suite"),
    ("SIGNET_XDS_PYTHON", "the test suite"),
    ("SIGNET_GRPCURL", "the test suite"),
    (
        "SIGNET_GRPC_DEFAULT_AUTHORITY",
        "the test suite's Python clients",
    ),
    ("SIGNET_KUBECTL", "the test suite"),
    ("SIGNET_KUBERNETES_VALIDATE", "the test suite"),
    ("SIGNET_PROMTOOL", "the test suite"),
    ("SIGNET_BUILD_COMMIT", "the build (runtime/build.rs)"),
    (
        "SIGNET_BIN_DIR",
        "the test suite, scripts/bench and scripts/profile",
    ),
    ("SIGNET_PG_*", "scripts/pg"),
    ("SIGNET_BENCH_*", "scripts/bench"),
    ("SIGNET_CFSSL", "scripts/bench"),
    ("SIGNET_PROFILE_DIR", "scripts/profile"),
    ("SIGNET_STORM_AGENT_LOG", "bench-storm"),
];

/// Where the database may be the embedded default: an empty `database_url` is refused when
/// the configuration requires one (`require_database_url`) and in Kubernetes (`in_kubernetes`:
/// `KUBERNETES_SERVICE_HOST` is set), where each replica would otherwise be a CA of its own on
/// a file of its own. An explicit `sqlite:` URL is a choice, and accepted everywhere (one
/// replica).
pub fn check_database_choice(cfg: &Config, in_kubernetes: bool) -> Result<(), ConfigError> {
    if !cfg.database_url.is_empty() {
        return Ok(());
    }
    let embedded = format!("sqlite://{}", cfg.data_dir.join("signet.db").display());
    if cfg.require_database_url {
        return Err(ConfigError::Invalid(format!(
            "database_url is not set and require_database_url = true: set SIGNET_DATABASE_URL \
             (or database_url, or --database-url) to postgres://…; is the variable misspelt or \
             its Secret missing? To run on the embedded database, set database_url = \
             \"{embedded}\" (one replica only)"
        )));
    }
    if in_kubernetes {
        return Err(ConfigError::Invalid(format!(
            "database_url is not set and this server runs in Kubernetes \
             (KUBERNETES_SERVICE_HOST is set): every replica would be a CA of its own on its own \
             SQLite file. Set SIGNET_DATABASE_URL to postgres://… (from a Secret, as \
             deploy/server.yaml does), or choose the embedded database explicitly for a single \
             replica: database_url = \"{embedded}\" on a persistent volume"
        )));
    }
    Ok(())
}

impl Config {
    /// The refresh interval published to relying parties: the SPIFFE bundle endpoint's
    /// `spiffe_refresh_hint` and the OIDC documents' `max-age`. It is `federation.refresh_hint`,
    /// but never more than half of `ca.root_propagation` or of `jwt_svid.key_propagation`
    /// (nor less than a second): a new root or JWT key is published that long before it
    /// signs, so a relying party that refreshes at the hint meets it before its first use.
    pub fn published_refresh(&self) -> Duration {
        self.federation
            .refresh_hint
            .min(self.ca.root_propagation / 2)
            .min(self.jwt_svid.key_propagation / 2)
            .max(Duration::from_secs(1))
    }

    /// Layers defaults, the optional TOML file, the environment (`SIGNET_*`) and `overrides`
    /// (already-serialized flag values, highest priority), then validates.
    ///
    /// An unknown `SIGNET_*` variable is refused by name, with the closest key ([`ENV`]); so
    /// is a missing `database_url` where one is expected ([`check_database_choice`]).
    pub fn load(file: Option<&Path>, overrides: impl Serialize) -> Result<Self, ConfigError> {
        let cfg: Config = Layers::new(Config::default())
            .file(file)?
            .env(&ENV)?
            .flags(overrides)
            .extract()?;
        cfg.validate()?;
        check_database_choice(
            &cfg,
            std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty()),
        )?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        TrustDomain::new(&self.trust_domain).map_err(|e| {
            ConfigError::Invalid(format!("trust_domain {:?}: {e}", self.trust_domain))
        })?;
        if self.ca.default_ttl.is_zero() || self.ca.max_ttl.is_zero() {
            return Err(ConfigError::Invalid(
                "ca.default_ttl and ca.max_ttl must be positive".into(),
            ));
        }
        if self.ca.default_ttl > self.ca.max_ttl {
            return Err(ConfigError::Invalid(format!(
                "ca.default_ttl ({}) is longer than ca.max_ttl ({})",
                humantime::format_duration(self.ca.default_ttl),
                humantime::format_duration(self.ca.max_ttl)
            )));
        }
        self.ca
            .plugged()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.ca
            .validate_rotation()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.jwt_svid
            .validate(self.ca.rotation_jitter)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.validate_nodes()?;
        self.policy.kubernetes_bridge.validate()?;
        self.nodes.watch.validate()?;
        if self.ledger.max_batch == 0 || self.ledger.queue_depth == 0 {
            return Err(ConfigError::Invalid(
                "ledger.max_batch and ledger.queue_depth must be positive".into(),
            ));
        }
        self.validate_limits()?;
        self.validate_checkpoint_and_federation()?;
        self.crl
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.telemetry
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        // sqlx cannot use it, and logs unknown URL parameters with their values.
        if let Some((_, query)) = self.database_url.split_once('?')
            && query.split('&').any(|kv| {
                kv.split_once('=')
                    .map_or(kv, |(k, _)| k)
                    .eq_ignore_ascii_case("sslpassword")
            })
        {
            return Err(ConfigError::Invalid(
                "database_url: sslpassword is not supported (use an unencrypted sslkey file \
                 readable only by the server)"
                    .into(),
            ));
        }
        if !(self.database_url.is_empty()
            || self.database_url.starts_with("sqlite:")
            || self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://"))
        {
            return Err(ConfigError::Invalid(
                "database_url must start with sqlite:, postgres:// or postgresql://".into(),
            ));
        }
        Ok(())
    }

    /// Every limit and timeout of `[limits]`, `[database]` and `[ledger]` must be positive: a
    /// zero would mean "refuse everything" or "wait forever", never what an operator wants.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        let d = &self.database;
        let counts = [
            ("limits.max_connections", l.max_connections),
            (
                "limits.max_connections_per_source",
                l.max_connections_per_source,
            ),
            ("limits.max_requests_per_source", l.max_requests_per_source),
            (
                "limits.max_concurrent_streams",
                l.max_concurrent_streams as usize,
            ),
            ("limits.max_concurrent_requests", l.max_concurrent_requests),
            ("limits.max_watch_streams", l.max_watch_streams),
            ("limits.http_max_connections", l.http_max_connections),
            (
                "limits.http_max_connections_per_source",
                l.http_max_connections_per_source,
            ),
            ("limits.rate_limit_max_keys", l.rate_limit_max_keys),
            ("database.max_connections", d.max_connections as usize),
            ("ledger.ready_max_queue", self.ledger.ready_max_queue),
        ];
        for (name, v) in counts {
            if v == 0 {
                return Err(ConfigError::Invalid(format!("{name} must be positive")));
            }
        }
        let durations = [
            ("limits.tls_handshake_timeout", l.tls_handshake_timeout),
            ("limits.connection_idle_timeout", l.connection_idle_timeout),
            ("limits.keepalive_interval", l.keepalive_interval),
            ("limits.keepalive_timeout", l.keepalive_timeout),
            ("limits.request_timeout", l.request_timeout),
            (
                "limits.http_header_read_timeout",
                l.http_header_read_timeout,
            ),
            ("limits.http_connection_timeout", l.http_connection_timeout),
            ("limits.http_idle_timeout", l.http_idle_timeout),
            ("limits.audit_window", l.audit_window),
            ("database.acquire_timeout", d.acquire_timeout),
            ("database.lock_timeout", d.lock_timeout),
            ("database.statement_timeout", d.statement_timeout),
            (
                "database.idle_in_transaction_timeout",
                d.idle_in_transaction_timeout,
            ),
            ("database.sqlite_busy_timeout", d.sqlite_busy_timeout),
            ("ledger.commit_deadline", self.ledger.commit_deadline),
            ("ledger.ready_max_wait", self.ledger.ready_max_wait),
        ];
        for (name, v) in durations {
            if v.is_zero() {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be positive (a zero timeout would wait forever or refuse everything)"
                )));
            }
        }
        for (name, r) in [
            ("limits.issuance_per_caller", l.issuance_per_caller),
            ("limits.issuance_per_source", l.issuance_per_source),
            ("limits.attestation_per_source", l.attestation_per_source),
            ("limits.attestation_per_caller", l.attestation_per_caller),
        ] {
            if !r.per_second.is_finite() || r.per_second < 0.0 {
                return Err(ConfigError::Invalid(format!(
                    "{name}.per_second must be a non-negative number (0 turns the limit off)"
                )));
            }
            if !r.is_off() && r.burst == 0 {
                return Err(ConfigError::Invalid(format!(
                    "{name}.burst must be at least 1 (or set per_second = 0 to turn the limit off)"
                )));
            }
        }
        l.http_limits()
            .validate(|field| format!("limits.http_{field}"))
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.ledger.commit_deadline <= d.lock_timeout {
            return Err(ConfigError::Invalid(format!(
                "ledger.commit_deadline ({}) must be longer than database.lock_timeout ({}), \
                 so that a commit blocked on the ledger head lock fails before its waiter gives up",
                humantime::format_duration(self.ledger.commit_deadline),
                humantime::format_duration(d.lock_timeout)
            )));
        }
        Ok(())
    }

    fn validate_checkpoint_and_federation(&self) -> Result<(), ConfigError> {
        if self.checkpoint.interval.is_zero() {
            return Err(ConfigError::Invalid(
                "checkpoint.interval must be positive".into(),
            ));
        }
        if self.checkpoint.keep == 0 {
            return Err(ConfigError::Invalid(
                "checkpoint.keep must be positive".into(),
            ));
        }
        let f = &self.federation;
        if f.refresh_hint.is_zero() {
            return Err(ConfigError::Invalid(
                "federation.refresh_hint must be positive".into(),
            ));
        }
        if f.fetch_refresh_min.is_zero()
            || f.fetch_refresh_min > f.fetch_refresh_max
            || f.fetch_retry.is_zero()
            || f.fetch_timeout.is_zero()
        {
            return Err(ConfigError::Invalid(
                "federation: fetch_refresh_min must be positive and at most fetch_refresh_max; \
                 fetch_retry and fetch_timeout positive"
                    .into(),
            ));
        }
        for r in &f.relationships {
            crate::federation::relationships::federated_trust_domain(
                &r.trust_domain,
                &self.trust_domain(),
            )
            .map_err(|e| ConfigError::Invalid(format!("federation.relationships: {e}")))?;
        }
        let web = f.web_cert_file.is_some() || f.web_key_file.is_some();
        match f.bundle_endpoint_profile {
            BundleEndpointProfile::HttpsWeb
                if f.web_cert_file.is_none() || f.web_key_file.is_none() =>
            {
                Err(ConfigError::Invalid(
                    "federation.bundle_endpoint_profile = \"https_web\" needs \
                     federation.web_cert_file and federation.web_key_file"
                        .into(),
                ))
            }
            BundleEndpointProfile::HttpsSpiffe if web => Err(ConfigError::Invalid(
                "federation.web_cert_file and web_key_file are for bundle_endpoint_profile = \
                 \"https_web\"; the https_spiffe profile serves Signet's own certificate"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// `[nodes.kubernetes]` needs `[auth.kubernetes]` (the issuer and its keys), names
    /// service accounts as `<namespace>:<name>`, and keeps its audiences apart from the
    /// workload audiences.
    fn validate_nodes(&self) -> Result<(), ConfigError> {
        let Some(n) = &self.nodes.kubernetes else {
            return Ok(());
        };
        let Some(auth) = &self.auth.kubernetes else {
            return Err(ConfigError::Invalid(
                "nodes.kubernetes needs [auth.kubernetes] (issuer and jwks_file) to validate \
                 node tokens"
                    .into(),
            ));
        };
        if n.allowed_service_accounts.is_empty() {
            return Err(ConfigError::Invalid(
                "nodes.kubernetes.allowed_service_accounts is empty; list the agent's \
                 service account, e.g. [\"signet-system:signet-agent\"]"
                    .into(),
            ));
        }
        for sa in &n.allowed_service_accounts {
            // A namespace is an RFC 1123 label, a service account a subdomain.
            let ok = sa.split_once(':').is_some_and(|(ns, name)| {
                Dns1123Label::is_valid(ns) && Dns1123Subdomain::is_valid(name)
            });
            if !ok {
                return Err(ConfigError::Invalid(format!(
                    "nodes.kubernetes.allowed_service_accounts: {sa:?} is not \
                     <namespace>:<serviceaccount>"
                )));
            }
        }
        if n.audiences.is_empty() || n.audiences.iter().any(String::is_empty) {
            return Err(ConfigError::Invalid(
                "nodes.kubernetes.audiences must list at least one non-empty audience".into(),
            ));
        }
        if let Some(c) = &n.cluster
            && !Dns1123Subdomain::is_valid(c)
        {
            return Err(ConfigError::Invalid(format!(
                "nodes.kubernetes.cluster {c:?} is not a cluster name: lowercase letters, \
                 digits, '-' and '.', at most 253 characters (a DNS-1123 subdomain), e.g. \
                 \"prod-eu\""
            )));
        }
        if let Some(a) = n.audiences.iter().find(|a| auth.audiences.contains(a)) {
            return Err(ConfigError::Invalid(format!(
                "nodes.kubernetes.audiences and auth.kubernetes.audiences share {a:?}: a \
                 workload's token must not be able to attest a node; use a distinct audience \
                 such as \"signet-node\""
            )));
        }
        Ok(())
    }

    pub fn trust_domain(&self) -> TrustDomain {
        // validate() has checked it; fall back to the default rather than panic.
        TrustDomain::new(&self.trust_domain)
            .unwrap_or_else(|_| TrustDomain::new("example.org").expect("static trust domain"))
    }

    /// The database URL, with the embedded default filled in.
    pub fn database_url(&self) -> String {
        if self.database_url.is_empty() {
            format!("sqlite://{}", self.data_dir.join("signet.db").display())
        } else {
            self.database_url.clone()
        }
    }

    pub fn bundle_path(&self) -> PathBuf {
        self.data_dir.join("bundle.pem")
    }

    pub fn admin_socket_path(&self) -> PathBuf {
        self.data_dir.join("admin.sock")
    }

    /// `checkpoint.key_file`, or `<data_dir>/checkpoint.key`.
    pub fn checkpoint_key_path(&self) -> PathBuf {
        self.checkpoint
            .key_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join("checkpoint.key"))
    }

    pub fn checkpoints_dir(&self) -> PathBuf {
        self.data_dir.join("checkpoints")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn load_toml(s: &str) -> Result<Config, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(s.as_bytes()).expect("write");
        Config::load(Some(f.path()), serde_json::json!({}))
    }

    #[test]
    fn defaults_are_valid() {
        let c = Config::default();
        c.validate().expect("defaults validate");
        assert_eq!(c.ca.default_ttl, Duration::from_secs(3600));
        assert_eq!(c.ca.max_ttl, Duration::from_secs(86400));
        assert!(c.database_url().starts_with("sqlite://signet-data/"));
    }

    #[test]
    fn rotation_keys_parse_and_are_checked_together() {
        let c = load_toml(
            r#"
            [ca]
            intermediate_ttl = "20s"
            root_ttl = "1h"
            intermediate_prepare_at = 0.4
            intermediate_activate_at = 0.7
            root_propagation = "2s"
            rotation_jitter = 0.0
            rotation_interval = "200ms"
            "#,
        )
        .expect("loads");
        assert_eq!(c.ca.intermediate_ttl, Duration::from_secs(20));
        assert_eq!(c.ca.intermediate_prepare_at, 0.4);
        assert_eq!(c.ca.rotation_interval, Duration::from_millis(200));
        let d = CaConfig::default();
        assert_eq!(d.intermediate_ttl, Duration::from_secs(48 * 3600));
        assert_eq!((d.intermediate_prepare_at, d.root_prepare_at), (0.5, 0.5));
        assert!((d.intermediate_activate_at - 5.0 / 6.0).abs() < 1e-9);
        for (toml, names) in [
            (r#"intermediate_ttl = "20d""#, "longer than ca.root_ttl"),
            ("intermediate_prepare_at = 0.9", "intermediate_prepare_at"),
            ("root_activate_at = 1.0", "root_prepare_at"),
            ("rotation_jitter = 0.3", "rotation_jitter"),
            (r#"rotation_interval = "10ms""#, "rotation_interval"),
            (r#"intermediate_ttl = "0s""#, "positive"),
        ] {
            let err = load_toml(&format!("[ca]\nroot_ttl = \"10d\"\n{toml}\n"))
                .expect_err(toml)
                .to_string();
            assert!(err.contains(names), "{toml}: {err}");
        }
    }

    #[test]
    fn toml_file_sets_nested_keys() {
        let c = load_toml(
            r#"
            trust_domain = "corp.example"
            [ca]
            default_ttl = "30m"
            max_ttl = "2h"
            [auth.kubernetes]
            issuer = "https://kubernetes.default.svc.cluster.local"
            jwks_file = "/etc/jwks.json"
            "#,
        )
        .expect("loads");
        assert_eq!(c.trust_domain, "corp.example");
        assert_eq!(c.ca.default_ttl, Duration::from_secs(1800));
        let k = c.auth.kubernetes.expect("kubernetes auth");
        assert_eq!(k.audiences, ["istio-ca", "signet"]);
    }

    #[test]
    fn unknown_key_is_named() {
        let err = load_toml("trust_domian = \"x\"\n").expect_err("refused");
        assert!(err.to_string().contains("trust_domian"), "{err}");
        let err = load_toml("[ca]\nmax_tll = \"1h\"\n").expect_err("refused");
        assert!(err.to_string().contains("max_tll"), "{err}");
    }

    #[test]
    fn bad_values_are_explained() {
        let err = load_toml("trust_domain = \"Not A Domain\"\n").expect_err("refused");
        assert!(err.to_string().contains("trust_domain"), "{err}");
        let err = load_toml("[ca]\ndefault_ttl = \"48h\"\n").expect_err("refused");
        assert!(err.to_string().contains("longer than ca.max_ttl"), "{err}");
        let err = load_toml("[ca]\ncert_file = \"/x\"\n").expect_err("refused");
        assert!(err.to_string().contains("all four"), "{err}");
        let err = load_toml("[ca]\ndefault_ttl = \"soon\"\n").expect_err("refused");
        assert!(err.to_string().contains("default_ttl"), "{err}");
    }

    #[test]
    fn kubernetes_bridge_keys() {
        let c = load_toml("").expect("defaults");
        assert!(c.policy.kubernetes_bridge.callers.is_empty());
        assert_eq!(
            c.policy.kubernetes_bridge.dns_templates,
            ["*.{namespace}.svc", "*.{namespace}.svc.cluster.local"]
        );
        let c = load_toml(
            r#"
            [policy.kubernetes_bridge]
            callers = ["spiffe://example.org/ns/signet-system/sa/signet-k8s"]
            "#,
        )
        .expect("loads");
        assert_eq!(c.policy.kubernetes_bridge.callers.len(), 1);
        assert_eq!(c.policy.kubernetes_bridge.dns_templates.len(), 2);
        let err = load_toml("[policy.kubernetes_bridge]\ncaller = []\n").expect_err("refused");
        assert!(err.to_string().contains("caller"), "{err}");
    }

    #[test]
    fn registration_keys_are_validated_at_load() {
        let d = load_toml("").expect("defaults").policy.kubernetes_bridge;
        assert!(d.node_sets.is_empty() && d.entry_path_prefixes.is_empty());
        assert_eq!(d.max_owned_entries, 10_000);
        let c = load_toml(
            r#"
            [policy.kubernetes_bridge]
            node_sets = ["k8s", "prod-nodes"]
            entry_path_prefixes = ["/platform/", "/a/b/"]
            max_owned_entries = 50
            "#,
        )
        .expect("loads")
        .policy
        .kubernetes_bridge;
        assert_eq!(c.node_sets, ["k8s", "prod-nodes"]);
        assert_eq!(c.max_owned_entries, 50);
        for (toml, want) in [
            (
                r#"node_sets = ["a b"]"#,
                "policy.kubernetes_bridge.node_sets: \"a b\"",
            ),
            (
                r#"entry_path_prefixes = ["platform/"]"#,
                "must start and end with '/'",
            ),
            (
                r#"entry_path_prefixes = ["/platform"]"#,
                "must start and end with '/'",
            ),
            (
                r#"entry_path_prefixes = ["/"]"#,
                "must start and end with '/'",
            ),
            (r#"entry_path_prefixes = ["/a//b/"]"#, "empty"),
            (r#"entry_path_prefixes = ["/a/../"]"#, "'..'"),
            (r#"entry_path_prefixes = ["/signet/"]"#, "reserved"),
            (r#"entry_path_prefixes = ["/signet/x/"]"#, "reserved"),
            (
                "max_owned_entries = 0",
                "max_owned_entries must be positive",
            ),
        ] {
            let err = load_toml(&format!("[policy.kubernetes_bridge]\n{toml}\n"))
                .expect_err(toml)
                .to_string();
            assert!(err.contains(want), "{toml}: {err}");
        }
        // /signetx/ is not /signet/.
        load_toml("[policy.kubernetes_bridge]\nentry_path_prefixes = [\"/signetx/\"]\n")
            .expect("loads");
    }

    const AUTH: &str = r#"
        [auth.kubernetes]
        issuer = "https://kubernetes.default.svc.cluster.local"
        jwks_file = "/etc/jwks.json"
    "#;

    #[test]
    fn kubernetes_node_attestation_keys() {
        let c = load_toml(&format!(
            "{AUTH}\n[nodes.kubernetes]\nallowed_service_accounts = [\"signet-system:signet-agent\"]\n"
        ))
        .expect("loads");
        let n = c.nodes.kubernetes.expect("nodes.kubernetes");
        assert_eq!(n.audiences, ["signet-node"]);
        assert_eq!(n.allowed_service_accounts, ["signet-system:signet-agent"]);
        assert_eq!(n.cluster, None);
        let c = load_toml(&format!(
            "{AUTH}\n[nodes.kubernetes]\nallowed_service_accounts = [\"a:b\"]\ncluster = \"prod.eu\"\n"
        ))
        .expect("loads");
        assert_eq!(
            c.nodes
                .kubernetes
                .expect("nodes.kubernetes")
                .cluster
                .as_deref(),
            Some("prod.eu")
        );
        assert!(load_toml("").expect("defaults").nodes.kubernetes.is_none());
        for (toml, want) in [
            (
                "[nodes.kubernetes]\nallowed_service_accounts = [\"a:b\"]\n".to_owned(),
                "needs [auth.kubernetes]",
            ),
            (
                format!("{AUTH}\n[nodes.kubernetes]\nallowed_service_accounts = []\n"),
                "is empty",
            ),
            (
                format!(
                    "{AUTH}\n[nodes.kubernetes]\nallowed_service_accounts = [\"signet-agent\"]\n"
                ),
                "<namespace>:<serviceaccount>",
            ),
            (
                // A namespace is an RFC 1123 label, not a subdomain (accepted before issue 25).
                format!("{AUTH}\n[nodes.kubernetes]\nallowed_service_accounts = [\"a.b:c\"]\n"),
                "<namespace>:<serviceaccount>",
            ),
            (
                format!(
                    "{AUTH}\n[nodes.kubernetes]\nallowed_service_accounts = [\"a:b\"]\naudiences = [\"istio-ca\"]\n"
                ),
                "share \"istio-ca\"",
            ),
            (
                format!("{AUTH}\n[nodes.kubernetes]\nallowed_service_account = [\"a:b\"]\n"),
                "allowed_service_account",
            ),
            (
                format!(
                    "{AUTH}\n[nodes.kubernetes]\nallowed_service_accounts = [\"a:b\"]\ncluster = \"Prod EU\"\n"
                ),
                "nodes.kubernetes.cluster \"Prod EU\" is not a cluster name",
            ),
        ] {
            let err = load_toml(&toml).expect_err(&toml);
            assert!(err.to_string().contains(want), "{toml}: {err}");
        }
    }

    #[test]
    fn top_level_keys_list_is_complete() {
        let v = serde_json::to_value(Config::default()).expect("serializes");
        let mut keys: Vec<_> = v.as_object().expect("object").keys().cloned().collect();
        keys.sort();
        let mut listed: Vec<_> = TOP_LEVEL_KEYS.iter().map(|k| (*k).to_owned()).collect();
        listed.sort();
        assert_eq!(keys, listed);
    }

    #[test]
    fn crl_keys_have_defaults_and_are_checked() {
        let c = load_toml("").expect("defaults");
        assert_eq!(c.crl.next_update, Duration::from_secs(24 * 3600));
        assert_eq!(c.crl.poll_interval, Duration::from_secs(10));
        let c = load_toml("[crl]\nnext_update = \"1h\"\npoll_interval = \"2s\"\n").expect("crl");
        assert_eq!(c.crl.next_update, Duration::from_secs(3600));
        assert_eq!(c.crl.poll_interval, Duration::from_secs(2));
        assert!(load_toml("[crl]\nnext_update = \"1s\"\n").is_err());
        assert!(load_toml("[crl]\npoll_interval = \"0s\"\n").is_err());
        assert!(load_toml("[crl]\nnumber = 3\n").is_err());
    }

    #[test]
    fn limits_and_database_keys() {
        let c = load_toml("").expect("defaults");
        assert_eq!(c.limits, LimitsConfig::default());
        assert_eq!(c.database, DatabaseConfig::default());
        let c = load_toml(
            r#"
            [limits]
            max_connections = 10
            connection_idle_timeout = "1s"
            issuance_per_caller = { burst = 3, per_second = 0.5 }
            [database]
            lock_timeout = "500ms"
            [ledger]
            commit_deadline = "2s"
            "#,
        )
        .expect("loads");
        assert_eq!(c.limits.max_connections, 10);
        let p = load_toml(
            "probe_listen = \"127.0.0.1:0\"\n[limits]\nhttp_max_connections_per_source = 2\n\
             http_idle_timeout = \"1s\"\n",
        )
        .expect("loads");
        assert_eq!(p.probe_listen, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(p.limits.http_limits().max_connections_per_source, 2);
        assert_eq!(p.limits.http_limits().idle_timeout, Duration::from_secs(1));
        assert_eq!(c.limits.connection_idle_timeout, Duration::from_secs(1));
        assert_eq!(c.limits.issuance_per_caller, RateConfig::new(3, 0.5));
        assert_eq!(c.database.lock_timeout, Duration::from_millis(500));
        assert_eq!(c.ledger.commit_deadline, Duration::from_secs(2));
        for (toml, want) in [
            (
                "[limits]\nmax_connections = 0\n",
                "limits.max_connections must be positive",
            ),
            (
                "[limits]\nconnection_idle_timeout = \"0s\"\n",
                "limits.connection_idle_timeout",
            ),
            (
                "[database]\nlock_timeout = \"0s\"\n",
                "database.lock_timeout",
            ),
            (
                "[limits]\nhttp_idle_timeout = \"0s\"\n",
                "limits.http_idle_timeout",
            ),
            (
                "[limits]\nhttp_max_connections = 4\n",
                "limits.http_max_connections_per_source (8) is larger than \
                 limits.http_max_connections (4)",
            ),
            (
                "[limits]\nissuance_per_caller = { burst = 0, per_second = 1.0 }\n",
                "issuance_per_caller.burst",
            ),
            (
                "[limits]\nattestation_per_source = { burst = 1, per_second = -1.0 }\n",
                "non-negative",
            ),
            (
                "[ledger]\ncommit_deadline = \"1s\"\n",
                "longer than database.lock_timeout",
            ),
            ("[limits]\nmax_conections = 1\n", "max_conections"),
            ("[database]\nlock_timout = \"1s\"\n", "lock_timout"),
            (
                "database_url = \"postgres://db/x?sslpassword=hunter2\"\n",
                "sslpassword is not supported",
            ),
        ] {
            let err = load_toml(toml).expect_err(toml);
            assert!(err.to_string().contains(want), "{toml}: {err}");
        }
        // A rate of zero turns a limit off.
        let c = load_toml("[limits]\nissuance_per_source = { burst = 0, per_second = 0 }\n")
            .expect("off");
        assert!(c.limits.issuance_per_source.is_off());
    }

    #[test]
    fn entry_watch_keys_default_load_and_refuse_zero() {
        let c = load_toml("").expect("defaults");
        assert_eq!(
            c.nodes.watch,
            NodesWatchConfig {
                streams_per_node: 4,
                keepalive: Duration::from_secs(15),
                max_lifetime: Duration::from_secs(600),
            }
        );
        let c = load_toml(
            "[nodes.watch]\nstreams_per_node = 2\nkeepalive = \"5s\"\nmax_lifetime = \"1m\"\n",
        )
        .expect("loads");
        assert_eq!(c.nodes.watch.streams_per_node, 2);
        assert_eq!(c.nodes.watch.keepalive, Duration::from_secs(5));
        assert_eq!(c.nodes.watch.max_lifetime, Duration::from_secs(60));
        for (toml, want) in [
            (
                "[nodes.watch]\nstreams_per_node = 0\n",
                "nodes.watch.streams_per_node must be positive",
            ),
            (
                "[nodes.watch]\nkeepalive = \"0s\"\n",
                "nodes.watch.keepalive must be positive",
            ),
            (
                "[nodes.watch]\nmax_lifetime = \"0s\"\n",
                "nodes.watch.max_lifetime must be positive",
            ),
            (
                "[nodes.watch]\nkeepalive = \"10m\"\n",
                "must be shorter than nodes.watch.max_lifetime",
            ),
            ("[nodes.watch]\nkeep_alive = \"1s\"\n", "keep_alive"),
        ] {
            let err = load_toml(toml).expect_err(toml);
            assert!(err.to_string().contains(want), "{toml}: {err}");
        }
    }

    #[test]
    fn jwt_svid_section() {
        let c = load_toml("").expect("defaults");
        assert_eq!(c.jwt_svid.key_type, JwtKeyType::Es256);
        assert_eq!(c.jwt_svid.ttl, Duration::from_secs(300));
        let c = load_toml(
            r#"
            [jwt_svid]
            key_type = "rs256"
            issuer = "https://oidc.example.org/signet"
            ttl = "2m"
            "#,
        )
        .expect("loads");
        assert_eq!(c.jwt_svid.key_type, JwtKeyType::Rs256);
        assert_eq!(c.jwt_svid.issuer_path().as_deref(), Some("/signet"));
        for (toml, want) in [
            (
                "[jwt_svid]\nissuer = \"http://x.example\"\n",
                "jwt_svid.issuer",
            ),
            ("[jwt_svid]\nkey_type = \"hs256\"\n", "hs256"),
            ("[jwt_svid]\nttl = \"2h\"\n", "jwt_svid.ttl"),
            ("[jwt_svid]\nissuers = \"https://x\"\n", "issuers"),
        ] {
            let err = load_toml(toml).expect_err(toml);
            assert!(err.to_string().contains(want), "{toml}: {err}");
        }
    }

    #[test]
    fn the_published_refresh_never_outlasts_half_a_propagation_window() {
        let c = load_toml("").expect("loads");
        assert_eq!(c.published_refresh(), Duration::from_secs(300));
        // A long hint: capped at half of jwt_svid.key_propagation (10m by default), so an OIDC
        // relying party or a federated peer refreshing at it meets a new JWT key before it signs.
        let c = load_toml("[federation]\nrefresh_hint = \"2h\"\n").expect("loads");
        assert_eq!(c.published_refresh(), Duration::from_secs(300));
        let c = load_toml(
            "[federation]\nrefresh_hint = \"2h\"\n[jwt_svid]\nkey_propagation = \"2h\"\n\
             key_ttl = \"48h\"\n",
        )
        .expect("loads");
        assert_eq!(c.published_refresh(), Duration::from_secs(3600));
        // … and at half of ca.root_propagation.
        let c =
            load_toml("[federation]\nrefresh_hint = \"2h\"\n[ca]\nroot_propagation = \"20m\"\n")
                .expect("loads");
        assert_eq!(c.published_refresh(), Duration::from_secs(300));
        // Never below a second.
        let c = load_toml("[jwt_svid]\nkey_propagation = \"1s\"\n").expect("loads");
        assert_eq!(c.published_refresh(), Duration::from_secs(1));
    }

    #[test]
    fn federation_relationships_are_declared_with_the_create_fields() {
        let c = load_toml(
            "[[federation.relationships]]\ntrust_domain = \"partner.example\"\n\
             bundle_endpoint_url = \"https://b.partner.example/\"\nprofile = \"https_web\"\n",
        )
        .expect("loads");
        assert_eq!(c.federation.relationships.len(), 1);
        assert_eq!(c.federation.relationships[0].profile, "https_web");
        for (toml, want) in [
            (
                "[[federation.relationships]]\ntrust_domain = \"example.org\"\n",
                "own trust domain",
            ),
            (
                "[[federation.relationships]]\ntrust_domain = \"Not A Domain\"\n",
                "Not A Domain",
            ),
            (
                "[[federation.relationships]]\ntrust_domain = \"p.example\"\nurl = \"x\"\n",
                "url",
            ),
            (
                "[federation]\nfetch_refresh_min = \"2h\"\n",
                "fetch_refresh_min",
            ),
            (
                "[[federation.relationships]]\ntrust_domain = \"example.org.\"\n",
                "a label is empty",
            ),
        ] {
            let err = load_toml(toml).unwrap_err().to_string();
            assert!(err.contains(want), "{toml}: {err}");
        }
    }

    #[test]
    fn checkpoint_and_federation_keys() {
        let c = load_toml("").expect("defaults");
        assert_eq!(c.checkpoint.interval, Duration::from_secs(60));
        assert_eq!(c.checkpoint_key_path(), c.data_dir.join("checkpoint.key"));
        assert!(c.federation.bundle_endpoint_listen.is_none());
        assert_eq!(
            c.federation.bundle_endpoint_profile,
            BundleEndpointProfile::HttpsSpiffe
        );
        let c = load_toml(
            r#"
            [checkpoint]
            interval = "5s"
            key_file = "/etc/signet/checkpoint.key"
            [federation]
            bundle_endpoint_listen = "127.0.0.1:8444"
            refresh_hint = "1m"
            "#,
        )
        .expect("loads");
        assert_eq!(c.checkpoint.interval, Duration::from_secs(5));
        assert_eq!(
            c.checkpoint_key_path(),
            PathBuf::from("/etc/signet/checkpoint.key")
        );
        assert_eq!(
            c.federation.bundle_endpoint_listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 8444)))
        );
        for (toml, want) in [
            ("[checkpoint]\ninterval = \"0s\"\n", "checkpoint.interval"),
            ("[checkpoint]\nkeep = 0\n", "checkpoint.keep"),
            ("[checkpoint]\nintervall = \"1m\"\n", "intervall"),
            (
                "[federation]\nbundle_endpoint_profile = \"https_web\"\n",
                "needs federation.web_cert_file",
            ),
            (
                "[federation]\nweb_cert_file = \"/x\"\n",
                "are for bundle_endpoint_profile",
            ),
            ("[federation]\nbundle_endpoint_profile = \"http\"\n", "http"),
        ] {
            let err = load_toml(toml).expect_err(toml);
            assert!(err.to_string().contains(want), "{toml}: {err}");
        }
    }

    #[test]
    fn flags_override_file() {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(b"trust_domain = \"a.example\"\n")
            .expect("write");
        let c = Config::load(
            Some(f.path()),
            serde_json::json!({"trust_domain": "b.example"}),
        )
        .expect("loads");
        assert_eq!(c.trust_domain, "b.example");
    }

    #[test]
    fn the_embedded_database_is_refused_where_one_is_expected() {
        let c = Config::default();
        check_database_choice(&c, false).expect("the README's no-setup server");
        let e = check_database_choice(&c, true).unwrap_err().to_string();
        assert!(
            e.contains("runs in Kubernetes (KUBERNETES_SERVICE_HOST is set)")
                && e.contains("Set SIGNET_DATABASE_URL to postgres://")
                && e.contains("database_url = \"sqlite://signet-data/signet.db\""),
            "{e}"
        );
        let required = Config {
            require_database_url: true,
            ..Config::default()
        };
        let e = check_database_choice(&required, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("require_database_url = true: set SIGNET_DATABASE_URL"),
            "{e}"
        );
        // An explicit URL, SQLite included, is a choice.
        for url in ["sqlite:///var/lib/signet/signet.db", "postgres://db/signet"] {
            let c = Config {
                database_url: url.into(),
                require_database_url: true,
                ..Config::default()
            };
            check_database_choice(&c, true).expect(url);
        }
        let c = load_toml("require_database_url = true\n").expect_err("refused");
        assert!(c.to_string().contains("require_database_url"), "{c}");
    }

    #[test]
    fn log_level_is_a_key_and_is_checked() {
        let c = load_toml("log_level = \"debug\"\n").expect("loads");
        assert_eq!(c.log_level.expect("set").as_str(), "debug");
        let e = load_toml("log_level = \"verbose\"\n").expect_err("refused");
        assert!(e.to_string().contains("verbose"), "{e}");
        let c = Config::load(
            None,
            serde_json::json!({"log_level": "warn,signet_server=debug"}),
        )
        .expect("a flag");
        assert_eq!(
            c.log_level.expect("set").as_str(),
            "warn,signet_server=debug"
        );
    }

    #[test]
    fn the_environment_check_knows_the_repository_s_variables() {
        // Every SIGNET_ variable this repository names (scripts, tests, deploy/, the docs)
        // passes the server's check, or is a configuration key: a new test tool's variable,
        // exported by scripts/test, would otherwise stop every server the tests start. The
        // docs' deliberate misspelling is the one exception.
        // The misspellings the docs and the tests make on purpose, to show the refusal.
        const MISSPELT: [&str; 2] = ["SIGNET_DATABASE_UR", "SIGNET_CA_MAX_TTL"];
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        let mut dirs: Vec<std::path::PathBuf> = ["scripts", "tests", "deploy", "docs", ".ci"]
            .iter()
            .map(|d| repo.join(d))
            .collect();
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).expect("a directory of the repository") {
                let p = e.expect("an entry").path();
                if p.is_dir() {
                    dirs.push(p);
                } else {
                    files.push(p);
                }
            }
        }
        files.extend(["README.md", "Dockerfile"].map(|f| repo.join(f)));
        let mut names = std::collections::BTreeSet::new();
        for f in files {
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            for (at, _) in text.match_indices("SIGNET_") {
                if text[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    continue;
                }
                let name: String = text[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                // `SIGNET_AGENT_<KEY>`, `SIGNET_PG_*`: a pattern the docs name, not a variable.
                let pattern = text[at + name.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| matches!(c, '<' | '*' | '{' | '$'));
                let name = name.trim_end_matches('_');
                if !pattern && name.len() > "SIGNET".len() && !MISSPELT.contains(&name) {
                    names.insert(name.to_owned());
                }
            }
        }
        assert!(names.len() > 20, "{names:?}");
        let unknown: Vec<String> = names
            .iter()
            .filter_map(|n| {
                signet_runtime::config::check_env([std::ffi::OsString::from(n)], &ENV)
                    .err()
                    .map(|e| e.to_string())
            })
            .collect();
        assert!(unknown.is_empty(), "{unknown:#?}");
        let e = signet_runtime::config::check_env(
            [std::ffi::OsString::from("SIGNET_DATABASE_UR")],
            &ENV,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("did you mean SIGNET_DATABASE_URL?"), "{e}");
    }
}
