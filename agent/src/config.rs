//! Agent configuration: defaults, then a TOML file (`--config FILE`), then `SIGNET_AGENT_*`
//! environment variables (layered by [`signet_runtime::config`]). Unknown keys are refused,
//! by name.
//!
//! About 740 lines, on purpose: the agent's whole configuration surface (entries, sinks,
//! the Workload API, Kubernetes attestation) and its validation, so a setting and its check
//! are found in one file.
//!
//! Nested keys use a double underscore in the environment: `SIGNET_AGENT_RENEW_FRACTION=0.6`,
//! `SIGNET_AGENT_HTTP_LISTEN=127.0.0.1:9090`. Any other `SIGNET_AGENT_*` variable stops
//! start-up, naming the closest key (`SIGNET_AGENT_SERVER_ADRESS`: did you mean
//! `SIGNET_AGENT_SERVER_ADDRESS`?), except Kubernetes' service links for a Service named
//! `signet-agent…` (see [`signet_runtime::config::check_env`]). Other `SIGNET_*` variables are
//! the server's, the bridge's or tools': the agent does not read them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use signet_runtime::config::Layers;
use signet_types::SpiffeId;
use signet_types::dns::{Dns1123Label, Dns1123Subdomain};

use crate::ca::AttestCredential;

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The Signet server's node API, `host:port` or `https://host:port`.
    pub server_address: String,
    /// PEM roots the agent trusts for the server (bootstrap bundle).
    pub trust_bundle_file: Option<PathBuf>,
    /// The server's trust domain: the agent talks only to a server presenting
    /// `spiffe://<trust_domain>/signet/server`. Default: the trust domain the bootstrap
    /// bundle's roots name (a root Signet generates carries `spiffe://<td>`); required with a
    /// plugged-in CA whose roots name none.
    pub trust_domain: Option<String>,
    /// How the node attests: `join-token` (default) or `kubernetes` (the projected
    /// service-account token in `kubernetes_token_file`, for an agent running as a DaemonSet).
    pub attestation: Attestation,
    /// One-time join token for node attestation. Prefer `join_token_file`.
    pub join_token: Option<String>,
    pub join_token_file: Option<PathBuf>,
    /// With `attestation = "kubernetes"`: the projected service-account token (audience as the
    /// server's `nodes.kubernetes.audiences`, default `signet-node`). Read again at every
    /// attestation attempt, since the kubelet rotates it.
    pub kubernetes_token_file: PathBuf,
    /// Where the agent keeps its node identity and state.
    pub data_dir: PathBuf,
    /// The SPIFFE Workload API socket. Its directory must be controlled by the operator.
    pub workload_api_socket: PathBuf,
    /// Renew at this fraction of a certificate's lifetime (0 < f < 0.9).
    pub renew_fraction: f64,
    /// `/healthz`, `/readyz`, `/metrics`.
    pub http_listen: SocketAddr,
    /// Bounds of the `http_listen` listener.
    pub http: HttpConfig,
    /// The probe listener: only `/healthz` and `/readyz`, with bounds of its own, so that no
    /// client of `http_listen` can crowd the kubelet's probes out. Off when absent; deploy/
    /// sets it and points the probes at it.
    pub probe_listen: Option<SocketAddr>,
    /// How often the agent asks the server for changes to its registration entries even when
    /// the server's entry stream (`WatchEntries`) says nothing: the slow safety net (default
    /// 30 s; the stream brings a change in about a second).
    #[serde(with = "humantime_serde")]
    pub sync_interval: Duration,
    pub sinks: Vec<SinkConfig>,
    /// The Kubernetes API, for `kubernetes-secret` sinks.
    pub kubernetes_api: KubernetesApiConfig,
    /// Limits, socket permissions and workload attestation of the Workload API.
    pub workload_api: WorkloadApiConfig,
    /// Traces over OTLP (`[telemetry]`, see [`signet_runtime::telemetry`]); off by default.
    pub telemetry: signet_runtime::telemetry::TelemetryConfig,
    /// The log filter: a level (`error`, `warn`, `info`, `debug`, `trace`, `off`) or
    /// `RUST_LOG`'s directives (`info,signet_agent=debug`). Set (here, as
    /// `SIGNET_AGENT_LOG_LEVEL` or `--log-level`) it wins over `RUST_LOG`; unset, `RUST_LOG`
    /// is used, else `info`. Reloaded on SIGHUP.
    pub log_level: Option<signet_runtime::telemetry::LogLevel>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("server_address", &self.server_address)
            .field("trust_bundle_file", &self.trust_bundle_file)
            .field("trust_domain", &self.trust_domain)
            .field("join_token", &self.join_token.as_ref().map(|_| "…"))
            .field("join_token_file", &self.join_token_file)
            .field("attestation", &self.attestation)
            .field("kubernetes_token_file", &self.kubernetes_token_file)
            .field("data_dir", &self.data_dir)
            .field("workload_api_socket", &self.workload_api_socket)
            .field("renew_fraction", &self.renew_fraction)
            .field("http_listen", &self.http_listen)
            .field("sync_interval", &self.sync_interval)
            .field("sinks", &self.sinks)
            .field("kubernetes_api", &self.kubernetes_api)
            .field("workload_api", &self.workload_api)
            .field("telemetry", &self.telemetry)
            .field("log_level", &self.log_level)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server_address: String::new(),
            trust_bundle_file: None,
            trust_domain: None,
            attestation: Attestation::default(),
            join_token: None,
            join_token_file: None,
            kubernetes_token_file: PathBuf::from(DEFAULT_KUBERNETES_TOKEN_FILE),
            data_dir: PathBuf::from("signet-agent-data"),
            workload_api_socket: PathBuf::from("/run/signet/agent.sock"),
            renew_fraction: 0.5,
            http_listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            http: HttpConfig::default(),
            probe_listen: None,
            sync_interval: Duration::from_secs(30),
            sinks: Vec::new(),
            kubernetes_api: KubernetesApiConfig::default(),
            workload_api: WorkloadApiConfig::default(),
            telemetry: Default::default(),
            log_level: None,
        }
    }
}

/// `[workload_api]`: how many callers, for how long, who may reach the socket, and how
/// callers are attested.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadApiConfig {
    /// Open connections at most, all callers together. Over it a new connection is closed at
    /// once.
    pub max_connections: usize,
    /// Open connections at most per caller uid, so one uid cannot take every slot.
    pub max_connections_per_uid: usize,
    /// A connection must send its first request within this time.
    #[serde(with = "humantime_serde")]
    pub first_request_timeout: Duration,
    /// A connection without an open request or stream is closed after this time.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// HTTP/2 concurrent streams per connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 header list size per request, bytes.
    pub max_header_list_size: u32,
    /// The largest request message, bytes (every Workload API and SDS request; a longer one,
    /// or one whose prefix declares more, ends its stream with OutOfRange at once, before it
    /// is buffered).
    pub max_request_bytes: usize,
    /// The longest pause between accept attempts while accept fails (EMFILE, ENFILE…); the
    /// pause starts at 10 ms and doubles.
    #[serde(with = "humantime_serde")]
    pub accept_backoff_max: Duration,
    /// The socket file's mode, octal. Default `0777`: workloads of any uid must be able to
    /// connect; attestation, not the mode, decides what each gets.
    pub socket_mode: String,
    /// Optional group (name or number) for the socket file, e.g. with `socket_mode = "0770"`
    /// to let only that group's members connect.
    pub socket_group: Option<String>,
    /// Where the agent reads callers' processes (`/proc`; `/host/proc` when the host's is
    /// mounted elsewhere).
    pub proc_root: PathBuf,
    /// Serve entries whose selectors are all `unix:*` to callers that run in a container
    /// (other than the agent's own). Off by default: a container picks its uid and ships any
    /// binary at any path, so `unix:` selectors prove nothing about it.
    pub unix_only_entries_for_containers: bool,
    /// `[workload_api.kubernetes]`: `k8s:` selectors.
    pub kubernetes: KubernetesAttestorConfig,
    /// JWT-SVIDs kept at most (one per SPIFFE ID and audience set); beyond it the least
    /// recently used is dropped.
    pub jwt_cache_size: usize,
    /// New JWT-SVIDs (server calls) one SPIFFE ID may cause: a burst, then a rate.
    pub jwt_mint_rate: crate::jwt_cache::MintRate,
    /// `[workload_api.sds]`: Envoy's Secret Discovery Service on the same socket.
    pub sds: SdsConfig,
}

/// `[workload_api.sds]`: the names Envoy asks for, the validator form, and the stream bounds.
/// The names are SPIRE's defaults, so an Envoy or Istio configuration written for SPIRE works
/// unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SdsConfig {
    /// Serve SDS at all (on by default).
    pub enabled: bool,
    /// The name of the caller's first identity (by entry ID) as a `TlsCertificate`.
    pub default_svid_name: String,
    /// The name of the own trust domain's validation context.
    pub default_bundle_name: String,
    /// The name of the validation context with every trust domain the caller trusts.
    pub default_all_bundles_name: String,
    /// Always send validation contexts as `trusted_ca` (Envoy's default validator) instead of
    /// Envoy's SPIFFE validator, whatever the Envoy version.
    pub disable_spiffe_cert_validation: bool,
    /// Open SDS streams at most, all callers together.
    pub max_streams: usize,
    /// Open SDS streams at most per caller uid.
    pub max_streams_per_uid: usize,
    /// A stream must send its first DiscoveryRequest within this time.
    #[serde(with = "humantime_serde")]
    pub first_request_timeout: Duration,
}

impl Default for SdsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            default_svid_name: "default".into(),
            default_bundle_name: "ROOTCA".into(),
            default_all_bundles_name: "ALL".into(),
            disable_spiffe_cert_validation: false,
            max_streams: 8192,
            max_streams_per_uid: 2048,
            first_request_timeout: Duration::from_secs(10),
        }
    }
}

impl SdsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("workload_api.sds.{m}")));
        let names = [
            ("default_svid_name", &self.default_svid_name),
            ("default_bundle_name", &self.default_bundle_name),
            ("default_all_bundles_name", &self.default_all_bundles_name),
        ];
        for (key, name) in names {
            if name.is_empty() || name.starts_with("spiffe://") || name.len() > 256 {
                return bad(format!(
                    "{key} {name:?}: a name must be 1 to 256 bytes and not start with \
                     spiffe:// (SPIFFE IDs and trust domains are names of their own)"
                ));
            }
        }
        if names[0].1 == names[1].1 || names[0].1 == names[2].1 || names[1].1 == names[2].1 {
            return bad(
                "default_svid_name, default_bundle_name and default_all_bundles_name must \
                 differ"
                    .into(),
            );
        }
        if self.max_streams == 0 || self.max_streams_per_uid == 0 {
            return bad("max_streams and max_streams_per_uid must be at least 1".into());
        }
        if self.max_streams_per_uid > self.max_streams {
            return bad("max_streams_per_uid must not exceed max_streams".into());
        }
        if self.first_request_timeout.is_zero() {
            return bad("first_request_timeout must be more than zero".into());
        }
        Ok(())
    }
}

impl Default for WorkloadApiConfig {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_connections_per_uid: 128,
            first_request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_concurrent_streams: 16,
            max_header_list_size: 16 * 1024,
            max_request_bytes: 64 * 1024,
            accept_backoff_max: Duration::from_secs(1),
            socket_mode: "0777".into(),
            socket_group: None,
            proc_root: PathBuf::from("/proc"),
            unix_only_entries_for_containers: false,
            kubernetes: KubernetesAttestorConfig::default(),
            jwt_cache_size: crate::jwt_cache::DEFAULT_CAPACITY,
            jwt_mint_rate: crate::jwt_cache::MintRate::default(),
            sds: SdsConfig::default(),
        }
    }
}

impl WorkloadApiConfig {
    /// The socket mode as a number (validated by [`Config::validate`]).
    pub fn socket_mode(&self) -> Result<u32, ConfigError> {
        u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "workload_api.socket_mode {:?} is not an octal mode such as \"0777\"",
                    self.socket_mode
                ))
            })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(format!("workload_api.{m}")));
        if self.max_connections == 0 || self.max_connections_per_uid == 0 {
            return bad("max_connections and max_connections_per_uid must be at least 1");
        }
        if self.max_connections_per_uid > self.max_connections {
            return bad("max_connections_per_uid must not exceed max_connections");
        }
        if self.first_request_timeout.is_zero() || self.idle_timeout.is_zero() {
            return bad("first_request_timeout and idle_timeout must be more than zero");
        }
        if self.accept_backoff_max < Duration::from_millis(10) {
            return bad("accept_backoff_max must be at least 10ms");
        }
        if self.max_concurrent_streams == 0 || self.max_header_list_size < 1024 {
            return bad("max_concurrent_streams must be at least 1, max_header_list_size 1024");
        }
        if !(1024..=4 * 1024 * 1024).contains(&self.max_request_bytes) {
            return bad("max_request_bytes must be between 1024 and 4194304");
        }
        if self.jwt_cache_size == 0 {
            return bad("jwt_cache_size must be at least 1");
        }
        let r = self.jwt_mint_rate;
        if r.burst == 0 || r.per_second.is_nan() || r.per_second <= 0.0 {
            return bad("jwt_mint_rate needs burst >= 1 and per_second > 0");
        }
        self.sds.validate()?;
        self.socket_mode()?;
        if matches!(&self.socket_group, Some(g) if g.is_empty()) {
            return bad("socket_group is empty");
        }
        let k = &self.kubernetes;
        if k.enabled {
            if k.skip_kubelet_verification && k.source != PodSource::Kubelet {
                return bad(
                    "kubernetes.skip_kubelet_verification is for source = \"kubelet\" only",
                );
            }
            if k.pod_cache_ttl.is_zero() || k.request_timeout.is_zero() {
                return bad("kubernetes.pod_cache_ttl and request_timeout must be more than zero");
            }
            if k.refresh_min_interval > k.pod_cache_ttl {
                return bad("kubernetes.refresh_min_interval must not exceed pod_cache_ttl");
            }
            if k.max_response_bytes < 1024 {
                return bad("kubernetes.max_response_bytes must be at least 1024");
            }
            if k.source == PodSource::ApiServer && k.node_name().is_none() {
                return Err(ConfigError::Invalid(format!(
                    "workload_api.kubernetes: source = \"api-server\" needs node_name or the \
                     environment variable {}",
                    k.node_name_env
                )));
            }
        }
        Ok(())
    }
}

/// Where the Kubernetes workload attestor reads pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PodSource {
    /// The node's kubelet, `GET /pods` (SPIRE's default).
    #[default]
    Kubelet,
    /// The API server, pods with `spec.nodeName` = this node.
    ApiServer,
}

/// `[workload_api.kubernetes]`: the Kubernetes workload attestor (`k8s:ns`, `k8s:sa`,
/// `k8s:pod-label` selectors). Off by default: `k8s:` selectors then match nobody.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesAttestorConfig {
    pub enabled: bool,
    pub source: PodSource,
    /// Default `https://127.0.0.1:10250` (kubelet) or `https://kubernetes.default.svc`.
    pub url: Option<String>,
    /// The name to verify in the server's certificate; default the URL's host.
    pub server_name: Option<String>,
    /// CA bundle (PEM) for the kubelet's or API server's certificate.
    pub ca_file: Option<PathBuf>,
    /// Accept any kubelet certificate (as SPIRE's `skip_kubelet_verification`). Explicit only.
    pub skip_kubelet_verification: bool,
    /// The agent's service-account token, sent as a Bearer token; re-read on every request.
    pub token_file: PathBuf,
    /// This node's name (API server source).
    pub node_name: Option<String>,
    /// Read the node name from this environment variable when `node_name` is not set.
    pub node_name_env: String,
    /// How long a fetched pod list answers lookups.
    #[serde(with = "humantime_serde")]
    pub pod_cache_ttl: Duration,
    /// A lookup that misses fetches again, but not more often than this.
    #[serde(with = "humantime_serde")]
    pub refresh_min_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// The largest pod list accepted, bytes.
    pub max_response_bytes: usize,
}

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl Default for KubernetesAttestorConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            source: PodSource::Kubelet,
            url: None,
            server_name: None,
            ca_file: Some(PathBuf::from(format!("{SA_DIR}/ca.crt"))),
            skip_kubelet_verification: false,
            token_file: PathBuf::from(format!("{SA_DIR}/token")),
            node_name: None,
            node_name_env: "NODE_NAME".into(),
            pod_cache_ttl: Duration::from_secs(5),
            refresh_min_interval: Duration::from_millis(500),
            request_timeout: Duration::from_secs(5),
            max_response_bytes: 64 * 1024 * 1024,
        }
    }
}

impl KubernetesAttestorConfig {
    pub fn url(&self) -> String {
        self.url.clone().unwrap_or_else(|| match self.source {
            PodSource::Kubelet => "https://127.0.0.1:10250".into(),
            PodSource::ApiServer => "https://kubernetes.default.svc".into(),
        })
    }

    pub fn node_name(&self) -> Option<String> {
        self.node_name
            .clone()
            .or_else(|| std::env::var(&self.node_name_env).ok())
            .filter(|n| !n.is_empty())
    }
}

/// Where the projected service-account token is mounted by default.
pub const DEFAULT_KUBERNETES_TOKEN_FILE: &str = "/var/run/secrets/signet/token";

/// How the node proves itself on first contact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Attestation {
    /// A one-time join token (`join_token` or `join_token_file`).
    #[default]
    JoinToken,
    /// The pod's projected Kubernetes service-account token (`kubernetes_token_file`).
    Kubernetes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeletionPolicy {
    /// Remove the files / Secret when the identity goes away.
    #[default]
    Delete,
    /// Leave them in place.
    Retain,
}

/// One sink: where an identity's certificate is also delivered.
// No `deny_unknown_fields` here: serde does not support it with `flatten`. Unknown keys are
// refused by the kind-specific structs, which see every key but these three.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkConfig {
    pub name: String,
    pub spiffe_id: String,
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Deadline of one delivery or removal, everything included; a sink that takes longer
    /// is reported as stuck and retried with backoff. Sinks never hold up renewals.
    #[serde(default = "default_sink_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(flatten)]
    pub kind: SinkKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SinkKind {
    Files(FilesSinkConfig),
    KubernetesSecret(KubernetesSecretSinkConfig),
}

impl SinkKind {
    pub fn name(&self) -> &'static str {
        match self {
            SinkKind::Files(_) => "files",
            SinkKind::KubernetesSecret(_) => "kubernetes-secret",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FileLayout {
    /// `cert-chain.pem`, `key.pem`, `root-cert.pem`.
    #[default]
    Istio,
    /// `svid.pem`, `svid_key.pem`, `svid_bundle.pem`.
    SpiffeHelper,
    /// `tls.crt`, `tls.key`, `ca.crt`.
    Tls,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesSinkConfig {
    pub directory: PathBuf,
    #[serde(default)]
    pub layout: FileLayout,
    pub owner_uid: Option<u32>,
    pub owner_gid: Option<u32>,
    /// e.g. `HUP`: sent to the pid in `pid_file` after each rotation.
    pub reload_signal: Option<String>,
    pub pid_file: Option<PathBuf>,
    /// Program and arguments run after each rotation (no shell).
    pub reload_command: Option<Vec<String>>,
    /// How long the reload command may run; then it and its process group are killed and the
    /// delivery counts as failed.
    #[serde(default = "default_reload_timeout", with = "humantime_serde")]
    pub reload_timeout: Duration,
    /// Deliver into a directory that its group or other users can write, or whose path (or
    /// the pid file's) goes through a directory a user other than root or the agent can
    /// change. Off by default: those users could plant links, so such a directory is refused.
    #[serde(default)]
    pub allow_shared_directory: bool,
    /// Append the roots of the trust domains the identity federates with to the layout's
    /// bundle file (spiffe-helper's option). Off by default: a consumer that reads that file
    /// as "our CA" does not start trusting a partner's CA unasked. The per-domain
    /// `federated-<td>.pem` files are written either way.
    #[serde(default)]
    pub include_federated_domains: bool,
}

impl FilesSinkConfig {
    /// A sink writing `directory` with the defaults (istio layout, no owner, no reload).
    pub fn new(directory: impl Into<PathBuf>) -> Self {
        Self {
            directory: directory.into(),
            layout: FileLayout::default(),
            owner_uid: None,
            owner_gid: None,
            reload_signal: None,
            pid_file: None,
            reload_command: None,
            reload_timeout: default_reload_timeout(),
            allow_shared_directory: false,
            include_federated_domains: false,
        }
    }
}

/// Default deadline of a reload command.
pub const DEFAULT_RELOAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Default deadline of one sink delivery or removal (files, reload and API calls included).
pub const DEFAULT_SINK_TIMEOUT: Duration = Duration::from_secs(30);
/// Default deadline of one request to the Kubernetes API.
pub const DEFAULT_KUBERNETES_API_TIMEOUT: Duration = Duration::from_secs(10);

fn default_reload_timeout() -> Duration {
    DEFAULT_RELOAD_TIMEOUT
}

fn default_sink_timeout() -> Duration {
    DEFAULT_SINK_TIMEOUT
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SecretType {
    #[serde(rename = "istio.io/key-and-cert")]
    IstioKeyAndCert,
    #[default]
    #[serde(rename = "kubernetes.io/tls")]
    KubernetesTls,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSecretSinkConfig {
    pub namespace: String,
    pub secret_name: String,
    #[serde(default)]
    pub secret_type: SecretType,
}

/// How the agent reaches the Kubernetes API (for `kubernetes-secret` sinks). By default the
/// in-cluster service (`KUBERNETES_SERVICE_HOST`/`_PORT`) with the pod's service account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesApiConfig {
    /// `https://host:port`; unset: the in-cluster service.
    pub server: Option<String>,
    /// The name the API server's certificate is checked against.
    pub server_name: String,
    /// PEM roots trusted for the API server.
    pub ca_file: PathBuf,
    /// Bearer token, read again for every request (projected tokens rotate).
    pub token_file: PathBuf,
    /// Deadline of one request (connect, TLS, answer).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for KubernetesApiConfig {
    fn default() -> Self {
        const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
        Self {
            server: None,
            server_name: "kubernetes.default.svc".into(),
            ca_file: Path::new(SA_DIR).join("ca.crt"),
            token_file: Path::new(SA_DIR).join("token"),
            timeout: DEFAULT_KUBERNETES_API_TIMEOUT,
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
        ConfigError::Load(e.to_string())
    }
}

const TOP_LEVEL_KEYS: &[&str] = &[
    "server_address",
    "trust_bundle_file",
    "trust_domain",
    "attestation",
    "join_token",
    "join_token_file",
    "kubernetes_token_file",
    "data_dir",
    "workload_api_socket",
    "renew_fraction",
    "http_listen",
    "http",
    "probe_listen",
    "sync_interval",
    "sinks",
    "kubernetes_api",
    "workload_api",
    "telemetry",
    "log_level",
];

/// How the agent's configuration is named in the environment: `SIGNET_AGENT_<KEY>`; any
/// other variable under that prefix is refused.
pub const ENV: signet_runtime::config::EnvSpec = signet_runtime::config::EnvSpec {
    binary: "signet-agent",
    prefix: "SIGNET_AGENT_",
    keys: TOP_LEVEL_KEYS,
    others: &[],
};

/// `[http]`: the bounds of the `http_listen` listener (`/healthz`, `/readyz`, `/metrics`), so
/// a port scanner, a half-sent request or one source's idle connections cannot hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Connections served at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Of those, from one source address (IPv6: one /64); more are closed likewise.
    pub max_connections_per_source: usize,
    /// How long a connection may take to send a request's headers.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection with no request in flight that has received nothing for this long
    /// (before its first request, between keep-alive requests) is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// The longest a connection may stay open.
    #[serde(with = "humantime_serde")]
    pub connection_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        let d = signet_runtime::http::HttpLimits::default();
        Self {
            max_connections: d.max_connections,
            max_connections_per_source: d.max_connections_per_source,
            header_read_timeout: d.header_read_timeout,
            idle_timeout: d.idle_timeout,
            connection_timeout: d.connection_timeout,
        }
    }
}

impl HttpConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.limits()
            .validate(|field| format!("http.{field}"))
            .map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    /// As the listener takes them.
    pub fn limits(&self) -> signet_runtime::http::HttpLimits {
        signet_runtime::http::HttpLimits {
            max_connections: self.max_connections,
            max_connections_per_source: self.max_connections_per_source,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            connection_timeout: self.connection_timeout,
        }
    }
}

impl Config {
    /// Layers defaults, the optional TOML file and the environment (`SIGNET_AGENT_*`), then
    /// validates.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_flags(file, serde_json::json!({}))
    }

    /// [`Self::load`], with `flags` (already serialized, absent flags skipped) over the
    /// environment: `--log-level`.
    pub fn load_with_flags(
        file: Option<&Path>,
        flags: impl Serialize,
    ) -> Result<Self, ConfigError> {
        Self::load_with_env(file, &ENV, flags)
    }

    fn load_with_env(
        file: Option<&Path>,
        env: &signet_runtime::config::EnvSpec,
        flags: impl Serialize,
    ) -> Result<Self, ConfigError> {
        let cfg: Config = Layers::new(Config::default())
            .file(file)?
            .env(env)?
            .flags(flags)
            .extract()?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.renew_fraction > 0.0 && self.renew_fraction < 0.9) {
            return Err(ConfigError::Invalid(format!(
                "renew_fraction must be in (0, 0.9), got {}",
                self.renew_fraction
            )));
        }
        if let Some(td) = &self.trust_domain {
            td.parse::<signet_types::TrustDomain>()
                .map_err(|e| ConfigError::Invalid(format!("trust_domain {td:?}: {e}")))?;
        }
        if self.sync_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "sync_interval must be more than zero".into(),
            ));
        }
        self.http.validate()?;
        self.telemetry
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.join_token.is_some() && self.join_token_file.is_some() {
            return Err(ConfigError::Invalid(
                "set join_token or join_token_file, not both".into(),
            ));
        }
        if self.attestation == Attestation::Kubernetes
            && (self.join_token.is_some() || self.join_token_file.is_some())
        {
            return Err(ConfigError::Invalid(
                "attestation = \"kubernetes\" uses kubernetes_token_file; remove join_token \
                 and join_token_file"
                    .into(),
            ));
        }
        if self.kubernetes_api.timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "kubernetes_api.timeout must be more than zero".into(),
            ));
        }
        self.workload_api.validate()?;
        let mut names = std::collections::HashSet::new();
        for s in &self.sinks {
            if s.name.is_empty() {
                return Err(ConfigError::Invalid("a sink has an empty name".into()));
            }
            if !names.insert(s.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "sink name {:?} is used twice",
                    s.name
                )));
            }
            if s.timeout.is_zero() {
                return Err(ConfigError::Invalid(format!(
                    "sink {:?}: timeout must be more than zero",
                    s.name
                )));
            }
            s.spiffe_id.parse::<SpiffeId>().map_err(|e| {
                ConfigError::Invalid(format!(
                    "sink {:?}: spiffe_id {:?}: {e}",
                    s.name, s.spiffe_id
                ))
            })?;
            if let SinkKind::KubernetesSecret(k) = &s.kind {
                for (what, v, ok) in [
                    (
                        "namespace",
                        &k.namespace,
                        Dns1123Label::is_valid(&k.namespace),
                    ),
                    (
                        "secret_name",
                        &k.secret_name,
                        Dns1123Subdomain::is_valid(&k.secret_name),
                    ),
                ] {
                    if !ok {
                        return Err(ConfigError::Invalid(format!(
                            "sink {:?}: {what} {v:?} is not a valid Kubernetes name",
                            s.name
                        )));
                    }
                }
            }
            if let SinkKind::Files(f) = &s.kind {
                if f.reload_signal.is_some() != f.pid_file.is_some() {
                    return Err(ConfigError::Invalid(format!(
                        "sink {:?}: reload_signal and pid_file go together",
                        s.name
                    )));
                }
                if let Some(sig) = &f.reload_signal
                    && crate::signal::signal_by_name(sig).is_none()
                {
                    return Err(ConfigError::Invalid(format!(
                        "sink {:?}: reload_signal {sig:?} is not a signal name (one of {})",
                        s.name,
                        crate::signal::SIGNAL_NAMES.join(", ")
                    )));
                }
                if f.reload_timeout.is_zero() {
                    return Err(ConfigError::Invalid(format!(
                        "sink {:?}: reload_timeout must be more than zero",
                        s.name
                    )));
                }
                if matches!(&f.reload_command, Some(c) if c.is_empty()) {
                    return Err(ConfigError::Invalid(format!(
                        "sink {:?}: reload_command is empty",
                        s.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// What the node attests with, read now (a token file may have been rotated or written
    /// since start-up). None: no join token configured.
    pub fn attest_credential(&self) -> Result<Option<AttestCredential>, ConfigError> {
        match self.attestation {
            Attestation::JoinToken => Ok(self.join_token()?.map(AttestCredential::JoinToken)),
            Attestation::Kubernetes => {
                let p = &self.kubernetes_token_file;
                let token = std::fs::read_to_string(p)
                    .map_err(|e| {
                        ConfigError::Load(format!("kubernetes_token_file {}: {e}", p.display()))
                    })?
                    .trim()
                    .to_owned();
                if token.is_empty() {
                    return Err(ConfigError::Load(format!(
                        "kubernetes_token_file {} is empty",
                        p.display()
                    )));
                }
                Ok(Some(AttestCredential::ServiceAccountToken(token)))
            }
        }
    }

    /// The join token, from the config or its file (trimmed).
    pub fn join_token(&self) -> Result<Option<String>, ConfigError> {
        if let Some(t) = &self.join_token {
            return Ok(Some(t.clone()));
        }
        match &self.join_token_file {
            None => Ok(None),
            Some(p) => std::fs::read_to_string(p)
                .map(|s| Some(s.trim().to_owned()))
                .map_err(|e| ConfigError::Load(format!("join_token_file {}: {e}", p.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn load_toml(s: &str) -> Result<Config, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(s.as_bytes()).expect("write");
        Config::load_with_env(
            Some(f.path()),
            &signet_runtime::config::EnvSpec {
                prefix: "SIGNET_AGENT_TEST_NONE_",
                ..ENV
            },
            serde_json::json!({}),
        )
    }

    #[test]
    fn defaults_are_valid() {
        let c = Config::default();
        c.validate().expect("valid");
        assert_eq!(c.renew_fraction, 0.5);
    }

    #[test]
    fn full_file_parses() {
        let c = load_toml(
            r#"
            server_address = "signet.example:8443"
            trust_bundle_file = "/etc/signet/bundle.pem"
            join_token_file = "/etc/signet/token"
            data_dir = "/var/lib/signet-agent"
            workload_api_socket = "/run/signet/agent.sock"
            renew_fraction = 0.6
            http_listen = "127.0.0.1:9100"
            sync_interval = "2s"

            [[sinks]]
            name = "web"
            kind = "files"
            spiffe_id = "spiffe://example.org/web"
            directory = "/etc/web/tls"
            layout = "spiffe-helper"
            reload_signal = "HUP"
            pid_file = "/run/web.pid"
            deletion_policy = "retain"

            [[sinks]]
            name = "k8s"
            kind = "kubernetes-secret"
            spiffe_id = "spiffe://example.org/ns/a/sa/b"
            namespace = "a"
            secret_name = "istio.b"
            secret_type = "istio.io/key-and-cert"
            "#,
        )
        .expect("loads");
        assert_eq!(c.renew_fraction, 0.6);
        assert_eq!(c.sync_interval, Duration::from_secs(2));
        assert_eq!(c.sinks.len(), 2);
        assert_eq!(c.sinks[0].deletion_policy, DeletionPolicy::Retain);
        match &c.sinks[0].kind {
            SinkKind::Files(f) => assert_eq!(f.layout, FileLayout::SpiffeHelper),
            other => panic!("unexpected {other:?}"),
        }
        match &c.sinks[1].kind {
            SinkKind::KubernetesSecret(k) => {
                assert_eq!(k.secret_type, SecretType::IstioKeyAndCert);
                assert_eq!(c.sinks[1].deletion_policy, DeletionPolicy::Delete);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = load_toml("renew_fractoin = 0.3\n").expect_err("refused");
        assert!(err.to_string().contains("renew_fractoin"), "{err}");
        let err = load_toml(
            "[[sinks]]\nname='a'\nkind='files'\nspiffe_id='spiffe://e.org/a'\ndirectory='/x'\ncolour='red'\n",
        )
        .expect_err("refused");
        assert!(err.to_string().contains("colour"), "{err}");
        let err = load_toml("[[sinks]]\nname='a'\nkind='ftp'\nspiffe_id='spiffe://e.org/a'\n")
            .expect_err("refused");
        assert!(err.to_string().contains("ftp"), "{err}");
    }

    #[test]
    fn bad_values_are_explained() {
        let err = load_toml("renew_fraction = 0.95\n").expect_err("refused");
        assert!(err.to_string().contains("renew_fraction"), "{err}");
        let err = load_toml("join_token = 'a'\njoin_token_file = '/x'\n").expect_err("refused");
        assert!(err.to_string().contains("not both"), "{err}");
        let err =
            load_toml("[[sinks]]\nname='a'\nkind='files'\nspiffe_id='not-an-id'\ndirectory='/x'\n")
                .expect_err("refused");
        assert!(err.to_string().contains("spiffe_id"), "{err}");
        let err = load_toml(
            "[[sinks]]\nname='a'\nkind='files'\nspiffe_id='spiffe://e.org/a'\ndirectory='/x'\nreload_signal='HUP'\n",
        )
        .expect_err("refused");
        assert!(err.to_string().contains("pid_file"), "{err}");
        let err = load_toml(
            "[[sinks]]\nname='a'\nkind='kubernetes-secret'\nspiffe_id='spiffe://e.org/a'\nnamespace='../x'\nsecret_name='s'\n",
        )
        .expect_err("refused");
        assert!(err.to_string().contains("namespace"), "{err}");
        // Kubernetes names are `signet_types::dns`'s: a namespace is an RFC 1123 label, a
        // Secret name a subdomain. Refused since issue 25 (the old check let these through).
        for (ns, name, what) in [
            ("a.b", "s", "namespace"),
            ("a", "a..b", "secret_name"),
            ("a", "a.-b", "secret_name"),
            ("a", &format!("a.{}", "b".repeat(64)), "secret_name"),
        ] {
            let err = load_toml(&format!(
                "[[sinks]]\nname='a'\nkind='kubernetes-secret'\nspiffe_id='spiffe://e.org/a'\nnamespace='{ns}'\nsecret_name='{name}'\n",
            ))
            .expect_err("refused");
            assert!(err.to_string().contains(what), "{err}");
        }
        let err = load_toml("trust_domain = 'Not A Domain'\n").expect_err("refused");
        assert!(err.to_string().contains("trust_domain"), "{err}");
    }

    #[test]
    fn kubernetes_attestation_reads_the_token_file_each_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        let c = load_toml(&format!(
            "attestation = 'kubernetes'\nkubernetes_token_file = '{}'\n",
            token.display()
        ))
        .expect("loads");
        assert_eq!(c.attestation, Attestation::Kubernetes);
        let err = c.attest_credential().expect_err("no file yet");
        assert!(err.to_string().contains("kubernetes_token_file"), "{err}");
        std::fs::write(&token, "first.token.x\n").expect("write");
        assert!(matches!(
            c.attest_credential().expect("read"),
            Some(AttestCredential::ServiceAccountToken(t)) if t == "first.token.x"
        ));
        std::fs::write(&token, "second.token.y").expect("write");
        assert!(matches!(
            c.attest_credential().expect("read"),
            Some(AttestCredential::ServiceAccountToken(t)) if t == "second.token.y"
        ));
        std::fs::write(&token, "  \n").expect("write");
        assert!(c.attest_credential().is_err());
        let d = load_toml("").expect("defaults");
        assert_eq!(d.attestation, Attestation::JoinToken);
        assert_eq!(
            d.kubernetes_token_file,
            PathBuf::from("/var/run/secrets/signet/token")
        );
        assert!(d.attest_credential().expect("none").is_none());
        let err = load_toml("attestation = 'kubernetes'\njoin_token = 'a'\n").expect_err("both");
        assert!(err.to_string().contains("kubernetes_token_file"), "{err}");
        let err = load_toml("attestation = 'psat'\n").expect_err("unknown");
        assert!(err.to_string().contains("psat"), "{err}");
    }

    #[test]
    fn sink_safety_options_have_safe_defaults_and_are_checked() {
        let c = load_toml(
            "[[sinks]]\nname='a'\nkind='files'\nspiffe_id='spiffe://e.org/a'\ndirectory='/x'\n",
        )
        .expect("loads");
        assert_eq!(c.sinks[0].timeout, DEFAULT_SINK_TIMEOUT);
        match &c.sinks[0].kind {
            SinkKind::Files(f) => {
                assert!(!f.allow_shared_directory);
                assert_eq!(f.reload_timeout, DEFAULT_RELOAD_TIMEOUT);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(c.kubernetes_api, KubernetesApiConfig::default());
        assert_eq!(c.kubernetes_api.timeout, DEFAULT_KUBERNETES_API_TIMEOUT);

        let c = load_toml(
            "[kubernetes_api]\nserver='https://10.0.0.1:6443'\ntimeout='2s'\n\
             [[sinks]]\nname='a'\nkind='files'\nspiffe_id='spiffe://e.org/a'\ndirectory='/x'\n\
             timeout='3s'\nreload_timeout='1s'\nallow_shared_directory=true\n\
             reload_signal='SIGUSR1'\npid_file='/run/a.pid'\n",
        )
        .expect("loads");
        assert_eq!(c.sinks[0].timeout, Duration::from_secs(3));
        assert_eq!(c.kubernetes_api.timeout, Duration::from_secs(2));
        assert_eq!(
            c.kubernetes_api.server.as_deref(),
            Some("https://10.0.0.1:6443")
        );

        let sink =
            "[[sinks]]\nname='a'\nkind='files'\nspiffe_id='spiffe://e.org/a'\ndirectory='/x'\n";
        for (extra, named) in [
            ("timeout='0s'\n", "timeout"),
            ("reload_timeout='0s'\n", "reload_timeout"),
            ("reload_signal='KILL'\npid_file='/p'\n", "reload_signal"),
            ("reload_signal='9'\npid_file='/p'\n", "reload_signal"),
        ] {
            let err = load_toml(&format!("{sink}{extra}")).expect_err(extra);
            assert!(err.to_string().contains(named), "{extra}: {err}");
        }
        let err = load_toml("[kubernetes_api]\ntimeout='0s'\n").expect_err("zero");
        assert!(err.to_string().contains("kubernetes_api.timeout"), "{err}");
        let err = load_toml("[kubernetes_api]\nurl='x'\n").expect_err("unknown");
        assert!(err.to_string().contains("url"), "{err}");
    }

    #[test]
    fn workload_api_limits_and_kubernetes_attestor() {
        let d = load_toml("").expect("defaults");
        assert_eq!(d.workload_api, WorkloadApiConfig::default());
        assert_eq!(d.workload_api.socket_mode().expect("mode"), 0o777);
        assert!(!d.workload_api.kubernetes.enabled);
        let c = load_toml(
            r#"
            [workload_api]
            max_connections = 64
            max_connections_per_uid = 8
            first_request_timeout = "2s"
            idle_timeout = "30s"
            max_concurrent_streams = 4
            socket_mode = "0770"
            socket_group = "spiffe"
            proc_root = "/host/proc"
            unix_only_entries_for_containers = true

            [workload_api.kubernetes]
            enabled = true
            url = "https://127.0.0.1:10250"
            ca_file = "/etc/kubelet-ca.pem"
            pod_cache_ttl = "1s"
            refresh_min_interval = "100ms"
            "#,
        )
        .expect("loads");
        let w = &c.workload_api;
        assert_eq!((w.max_connections, w.max_connections_per_uid), (64, 8));
        assert_eq!(w.first_request_timeout, Duration::from_secs(2));
        assert_eq!(w.socket_mode().expect("mode"), 0o770);
        assert_eq!(w.kubernetes.source, PodSource::Kubelet);
        assert_eq!(w.kubernetes.url(), "https://127.0.0.1:10250");
        assert_eq!(w.jwt_cache_size, crate::jwt_cache::DEFAULT_CAPACITY);
        for (bad, why) in [
            ("[workload_api]\nmax_connections = 0\n", "at least 1"),
            (
                "[workload_api]\nmax_connections = 4\nmax_connections_per_uid = 5\n",
                "exceed",
            ),
            ("[workload_api]\nidle_timeout = \"0s\"\n", "more than zero"),
            ("[workload_api]\njwt_cache_size = 0\n", "jwt_cache_size"),
            ("[workload_api]\nsocket_mode = \"0999\"\n", "octal"),
            ("[workload_api]\nsocket_mode = \"01777\"\n", "octal"),
            ("[workload_api]\nmax_connectoins = 1\n", "max_connectoins"),
            (
                "[workload_api.kubernetes]\nenabled = true\nsource = \"api-server\"\nskip_kubelet_verification = true\nnode_name = \"n\"\n",
                "kubelet",
            ),
            (
                "[workload_api.kubernetes]\nenabled = true\nsource = \"api-server\"\nnode_name_env = \"SIGNET_TEST_NO_SUCH_VAR\"\n",
                "node_name",
            ),
        ] {
            let err = load_toml(bad).expect_err(bad);
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn http_listener_bounds_default_and_are_checked() {
        let c = load_toml("").expect("defaults");
        assert_eq!(c.http, HttpConfig::default());
        assert_eq!(c.http.limits(), signet_runtime::http::HttpLimits::default());
        let c =
            load_toml("[http]\nmax_connections = 8\nheader_read_timeout = '1s'\n").expect("loads");
        assert_eq!(c.http.max_connections, 8);
        assert_eq!(c.http.header_read_timeout, Duration::from_secs(1));
        for bad in [
            "[http]\nmax_connections = 0\n",
            "[http]\nheader_read_timeout = '0s'\n",
            "[http]\nconnection_timeout = '0s'\n",
        ] {
            let e = load_toml(bad).expect_err(bad);
            assert!(e.to_string().contains("http."), "{bad}: {e}");
        }
        let e = load_toml("[http]\nbacklog = 5\n").expect_err("unknown");
        assert!(e.to_string().contains("backlog"), "{e}");
    }

    #[test]
    fn join_token_is_not_in_debug() {
        let c = Config {
            join_token: Some("s3cr3t-token".into()),
            ..Config::default()
        };
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API
    fn environment_overrides_file_and_unknown_variables_are_refused() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("agent.toml", "renew_fraction = 0.3\n")?;
            jail.set_env("SIGNET_AGENT_RENEW_FRACTION", "0.7");
            // The server's and the bridge's variables, and Kubernetes' service links.
            jail.set_env("SIGNET_DATABASE_URL", "postgres://db/signet");
            jail.set_env("SIGNET_K8S_SERVER", "x");
            jail.set_env("SIGNET_AGENT_SERVICE_HOST", "10.0.0.1");
            jail.set_env("SIGNET_AGENT_PORT_8081_TCP_ADDR", "10.0.0.1");
            let c = Config::load(Some(Path::new("agent.toml")))
                .map_err(|e| figment::Error::from(e.to_string()))?;
            assert_eq!(c.renew_fraction, 0.7);
            let c = Config::load_with_flags(
                Some(Path::new("agent.toml")),
                serde_json::json!({"log_level": "debug"}),
            )
            .map_err(|e| figment::Error::from(e.to_string()))?;
            assert_eq!(c.log_level.map(|l| l.to_string()).as_deref(), Some("debug"));
            jail.set_env("SIGNET_AGENT_RENEW_FRACTON", "0.6");
            let e = Config::load(Some(Path::new("agent.toml"))).unwrap_err();
            assert_eq!(
                e.to_string(),
                "configuration: environment variable SIGNET_AGENT_RENEW_FRACTON is not a \
                 setting of signet-agent: did you mean SIGNET_AGENT_RENEW_FRACTION? Rename or \
                 unset it"
            );
            Ok(())
        });
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
}
