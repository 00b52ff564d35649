//! Logs and traces, set up the same way by every binary.
//!
//! [`init`] installs one `tracing` subscriber with two independent outputs:
//!
//! - **Logs** on standard error, text or JSON lines, filtered by the binary's `log_level`
//!   ([`LogLevel`]: `--log-level`, or the configuration) when set, else by `RUST_LOG`, else by
//!   the binary's default filter. The filter can be replaced while the binary runs
//!   ([`LogControl`], on SIGHUP). In JSON mode every line a binary writes on its standard
//!   output and error is one JSON object: errors before the subscriber exists go through
//!   [`log_early_error`].
//! - **Traces** exported over OTLP/gRPC when `[telemetry] otlp_endpoint` is set (off when it
//!   is absent): plain `http://`, or `https://` verified against the system's roots or
//!   `otlp_ca_file`, with an optional client certificate for mTLS (rustls, ring). Only spans of the target [`TARGET`] become OpenTelemetry spans, and logs
//!   never see those spans: so traces add no fields to log lines, log events never travel to
//!   the collector, and with tracing off every traced call site is disabled at its first use
//!   (one atomic load per span afterwards: nothing measurable on the issuance benchmark).
//!
//! The invariant: **a dead or slow collector never blocks a request nor grows memory.** Spans
//! wait in a bounded queue ([`TelemetryConfig::max_queue_size`]; when full, new spans are
//! dropped) for a background exporter thread whose every export is cut off after
//! [`TelemetryConfig::export_timeout`]; the final flush at shutdown is bounded the same way.
//!
//! Sampling is parent-based: a caller that sends a sampled W3C `traceparent` is traced, one
//! that sends an unsampled one is not, and a trace that starts here is kept with probability
//! [`TelemetryConfig::sampling`]. [`GrpcTraceLayer`] opens the server-side span of every gRPC
//! call and continues the caller's trace; [`inject_context`] carries the current span to an
//! outgoing call. What a span may carry: identities (SPIFFE IDs, serials, object names),
//! outcomes and counts — never a key, CSR, token or certificate body.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use serde::{Deserialize, Serialize};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The `tracing` target of every span that becomes an OpenTelemetry span:
/// `tracing::info_span!(target: signet_runtime::telemetry::TARGET, "sign", …)`.
pub const TARGET: &str = "signet_trace";

/// `[telemetry]`: where traces go. Absent `otlp_endpoint`: no traces, no exporter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The OTLP/gRPC collector: `http://host:port` (e.g. `http://127.0.0.1:4317`, a local
    /// collector or mesh sidecar), or `https://host:port`, whose certificate must be valid for
    /// `host` and chain to `otlp_ca_file` (or, without it, to the system's roots).
    pub otlp_endpoint: Option<String>,
    /// PEM CA certificates the `https://` collector's certificate must chain to, instead of the
    /// system's roots.
    pub otlp_ca_file: Option<PathBuf>,
    /// A PEM client certificate (chain) to present to an `https://` collector that asks for
    /// one (mTLS); with `otlp_client_key_file`.
    pub otlp_client_cert_file: Option<PathBuf>,
    /// The PEM private key of `otlp_client_cert_file`.
    pub otlp_client_key_file: Option<PathBuf>,
    /// The `service.name` resource attribute. Default: the binary's name.
    pub service_name: Option<String>,
    /// The share of new traces kept, from 0 to 1 (a caller's sampled trace is always
    /// continued, its unsampled one never).
    pub sampling: f64,
    /// Spans waiting for export at most; more are dropped (never blocking, never growing).
    pub max_queue_size: usize,
    /// How long spans may wait before a batch is sent.
    #[serde(with = "humantime_serde")]
    pub batch_delay: Duration,
    /// The longest one export (and the final flush) may take.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            otlp_ca_file: None,
            otlp_client_cert_file: None,
            otlp_client_key_file: None,
            service_name: None,
            sampling: 1.0,
            max_queue_size: 2048,
            batch_delay: Duration::from_secs(5),
            export_timeout: Duration::from_secs(5),
        }
    }
}

/// Why telemetry could not be set up (a configuration error: the binary exits).
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry.{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("telemetry: cannot build the OTLP exporter: {0}")]
    Exporter(String),
    #[error("telemetry: a tracing subscriber is already installed")]
    AlreadyInstalled,
    #[error("logs: cannot replace the filter: {0}")]
    Reload(String),
}

impl TelemetryConfig {
    /// Checks every field; the binaries call it while validating their configuration.
    pub fn validate(&self) -> Result<(), TelemetryError> {
        let bad = |field, message: &str| {
            Err(TelemetryError::Invalid {
                field,
                message: message.into(),
            })
        };
        let mut https = false;
        if let Some(ep) = &self.otlp_endpoint {
            let uri: http::Uri = match ep.parse() {
                Ok(u) => u,
                Err(_) => return bad("otlp_endpoint", "is not a URL (http://host:port)"),
            };
            match uri.scheme_str() {
                Some("http") if uri.authority().is_some() => {}
                Some("https") if uri.authority().is_some() => https = true,
                _ => {
                    return bad(
                        "otlp_endpoint",
                        "must be http://host:port or https://host:port",
                    );
                }
            }
        }
        for (field, set) in [
            ("otlp_ca_file", self.otlp_ca_file.is_some()),
            (
                "otlp_client_cert_file",
                self.otlp_client_cert_file.is_some(),
            ),
            ("otlp_client_key_file", self.otlp_client_key_file.is_some()),
        ] {
            if set && !https {
                return bad(
                    field,
                    "is used only with an https:// otlp_endpoint (set one, or remove this key)",
                );
            }
        }
        match (&self.otlp_client_cert_file, &self.otlp_client_key_file) {
            (Some(_), None) => {
                return bad(
                    "otlp_client_key_file",
                    "is missing: otlp_client_cert_file needs its private key",
                );
            }
            (None, Some(_)) => {
                return bad(
                    "otlp_client_cert_file",
                    "is missing: otlp_client_key_file needs its certificate",
                );
            }
            _ => {}
        }
        if self.service_name.as_deref().is_some_and(str::is_empty) {
            return bad("service_name", "must not be empty");
        }
        if !(0.0..=1.0).contains(&self.sampling) {
            return bad("sampling", "must be between 0 and 1");
        }
        if self.max_queue_size == 0 {
            return bad("max_queue_size", "must be more than zero");
        }
        if self.batch_delay.is_zero() || self.export_timeout.is_zero() {
            return bad(
                "batch_delay",
                "telemetry.batch_delay and telemetry.export_timeout must be more than zero",
            );
        }
        Ok(())
    }
}

/// How logs are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOptions {
    /// JSON lines instead of text.
    pub json: bool,
    /// The filter used when neither `level` nor `RUST_LOG` is set (or `RUST_LOG` is invalid),
    /// e.g. `info,h2=warn`: a level, then the noisy crates held back.
    pub default_filter: &'static str,
    /// The binary's `log_level` (`--log-level`, the configuration): wins over `RUST_LOG`.
    pub level: Option<LogLevel>,
}

/// The levels a `log_level` may name.
const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// A log filter as `--log-level` and `log_level` take it: a level (`error`, `warn`, `info`,
/// `debug`, `trace`, `off`), which keeps the binary's noisy dependencies (`h2`, `sqlx`) at
/// `warn` or quieter, or `RUST_LOG`'s directives (`info,signet_server=debug`, used as
/// written). A bare word that is not a level is refused: `RUST_LOG` would read it as a target
/// name and log nearly nothing, silently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LogLevel(String);

impl LogLevel {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A bare level (`debug`), as opposed to directives.
    fn bare(&self) -> Option<tracing::level_filters::LevelFilter> {
        if LEVELS.iter().any(|l| l.eq_ignore_ascii_case(&self.0)) {
            self.0.parse().ok()
        } else {
            None
        }
    }

    /// The filter: directives as written, or a bare level with `default_filter`'s
    /// per-target directives each kept at its level or quieter.
    fn filter_directives(&self, default_filter: &str) -> String {
        let Some(level) = self.bare() else {
            return self.0.clone();
        };
        let mut out = vec![level.to_string().to_ascii_lowercase()];
        for d in default_filter.split(',').filter(|d| d.contains('=')) {
            let Some((target, l)) = d.rsplit_once('=') else {
                continue;
            };
            let l: tracing::level_filters::LevelFilter = l
                .parse()
                .unwrap_or(tracing::level_filters::LevelFilter::WARN);
            out.push(format!(
                "{target}={}",
                l.min(level).to_string().to_ascii_lowercase()
            ));
        }
        out.join(",")
    }
}

impl std::fmt::Display for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<LogLevel> for String {
    fn from(l: LogLevel) -> String {
        l.0
    }
}

impl TryFrom<String> for LogLevel {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl std::str::FromStr for LogLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let hint = "use a level (error, warn, info, debug, trace, off) or RUST_LOG's \
                    directives, e.g. \"info,signet_server=debug\"";
        if s.is_empty() {
            return Err(format!("log level is empty: {hint}"));
        }
        for d in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let level = match d.rsplit_once('=') {
                Some((target, level)) if !target.is_empty() => level,
                Some(_) => return Err(format!("log level {s:?}: {d:?} names no target: {hint}")),
                None => d,
            };
            if !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level)) {
                return Err(format!("log level {s:?}: {level:?} is not a level: {hint}"));
            }
            d.parse::<tracing_subscriber::filter::Directive>()
                .map_err(|e| format!("log level {s:?}: {d:?}: {e}: {hint}"))?;
        }
        Ok(LogLevel(s.to_owned()))
    }
}

/// The filter logs are written through, and where it came from.
fn log_filter(
    level: Option<&LogLevel>,
    default_filter: &str,
) -> (tracing_subscriber::EnvFilter, String) {
    use tracing_subscriber::EnvFilter;
    if let Some(l) = level {
        let d = l.filter_directives(default_filter);
        if let Ok(f) = EnvFilter::try_new(&d) {
            return (f, format!("{d} (log_level)"));
        }
    }
    if let Ok(env) = std::env::var("RUST_LOG")
        && let Ok(f) = EnvFilter::try_new(&env)
    {
        return (f, format!("{env} (RUST_LOG)"));
    }
    (
        EnvFilter::new(default_filter),
        format!("{default_filter} (default)"),
    )
}

type FilterHandle =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Replaces the log filter of a running binary (SIGHUP).
#[derive(Clone)]
pub struct LogControl {
    handle: FilterHandle,
    default_filter: &'static str,
    /// The filter in force and its source, as [`Self::set`] reports it.
    current: Arc<Mutex<String>>,
}

impl std::fmt::Debug for LogControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogControl")
            .field("current", &self.current())
            .finish_non_exhaustive()
    }
}

/// What [`LogControl::set`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogChange {
    /// The filter in force, with its source (`info (RUST_LOG)`).
    Unchanged(String),
    Changed {
        from: String,
        to: String,
    },
}

impl LogControl {
    /// The filter in force, with its source: `debug (log_level)`, `info (RUST_LOG)`,
    /// `info,h2=warn (default)`.
    pub fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Filters logs by `level` from now on (`None`: `RUST_LOG`, else the default).
    pub fn set(&self, level: Option<&LogLevel>) -> Result<LogChange, TelemetryError> {
        let (filter, described) = log_filter(level, self.default_filter);
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if *current == described {
            return Ok(LogChange::Unchanged(described));
        }
        self.handle
            .reload(without_trace_spans(filter))
            .map_err(|e| TelemetryError::Reload(e.to_string()))?;
        let from = std::mem::replace(&mut *current, described.clone());
        Ok(LogChange::Changed {
            from,
            to: described,
        })
    }
}

/// Writes `message` as an error log line before [`init`] has run (a configuration that does
/// not load): one JSON line when `json`, else `<binary>: <message>` on standard error, as
/// before logs existed.
pub fn log_early_error(binary: &str, json: bool, message: &str) {
    if !json {
        eprintln!("{binary}: {message}");
        return;
    }
    let logs = LogOptions {
        json,
        default_filter: "info",
        level: None,
    };
    let (layer, _) = log_layer(
        &logs,
        std::io::stderr,
        false,
        tracing_subscriber::EnvFilter::new("info"),
    );
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        tracing::error!(binary, "{message}");
    });
}

/// The installed telemetry; [`Telemetry::shutdown`] (or dropping it) flushes the spans still
/// queued, within the export timeout.
#[must_use = "dropping it at once shuts the trace exporter down"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    timeout: Duration,
    logs: LogControl,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("traces", &self.provider.is_some())
            .finish()
    }
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn traces_enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// The log filter's control, for a reload.
    pub fn log_control(&self) -> LogControl {
        self.logs.clone()
    }

    /// Exports what is queued and stops the exporter (bounded by the export timeout). Call
    /// it outside the async runtime, while the runtime is still alive (the exporter's
    /// connection runs on it).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown_with_timeout(self.timeout)
        {
            tracing::warn!(error = %e, "telemetry: spans not flushed at shutdown");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Installs logs and (when configured) traces for `binary`. With an `otlp_endpoint` it must
/// run inside a tokio runtime (`Runtime::enter`): the exporter's gRPC connection lives there.
pub fn init(
    binary: &'static str,
    logs: LogOptions,
    cfg: &TelemetryConfig,
) -> Result<Telemetry, TelemetryError> {
    cfg.validate()?;
    let (filter, described) = log_filter(logs.level.as_ref(), logs.default_filter);
    let ansi = !logs.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (fmt, handle) = log_layer(&logs, std::io::stderr, ansi, filter);
    let provider = match &cfg.otlp_endpoint {
        None => None,
        Some(endpoint) => Some(provider(binary, endpoint, cfg)?),
    };
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(binary))
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(TARGET, tracing::Level::TRACE),
            )
    });
    // For any library that propagates through the global API; ours use the W3C one directly.
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing_subscriber::registry()
        .with(fmt)
        .with(traces)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    if let Some(ep) = &cfg.otlp_endpoint {
        tracing::info!(endpoint = %ep, sampling = cfg.sampling, "exporting traces over OTLP/gRPC");
    }
    if logs.level.is_none()
        && let Ok(env) = std::env::var("RUST_LOG")
        && tracing_subscriber::EnvFilter::try_new(&env).is_err()
    {
        tracing::warn!(rust_log = %env, filter = %described, "RUST_LOG is not a valid filter; ignored");
    }
    Ok(Telemetry {
        provider,
        timeout: cfg.export_timeout,
        logs: LogControl {
            handle,
            default_filter: logs.default_filter,
            current: Arc::new(Mutex::new(described)),
        },
    })
}

/// The log output: text or JSON lines to `writer`, filtered by `filter` (replaceable through
/// the handle), never seeing the trace spans of [`TARGET`] (see the module doc).
fn log_layer<W>(
    logs: &LogOptions,
    writer: W,
    ansi: bool,
    filter: tracing_subscriber::EnvFilter,
) -> (
    impl tracing_subscriber::Layer<tracing_subscriber::Registry>,
    FilterHandle,
)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi);
    let fmt = if logs.json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    // One filter (nested per-layer filters would leave the span enabled for the outer one):
    // with traces off, the trace spans' call sites are then disabled for good.
    let (filter, handle) = tracing_subscriber::reload::Layer::new(without_trace_spans(filter));
    (fmt.with_filter(filter), handle)
}

/// `filter` plus `signet_trace=off`, which replaces any directive for [`TARGET`] that
/// `RUST_LOG` had.
fn without_trace_spans(filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    match format!("{TARGET}=off").parse() {
        Ok(off) => filter.add_directive(off),
        // A constant target and level always parse.
        Err(_) => filter,
    }
}

fn provider(
    binary: &'static str,
    endpoint: &str,
    cfg: &TelemetryConfig,
) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(cfg.export_timeout);
    if endpoint.starts_with("https:") {
        exporter = exporter.with_tls_config(collector_tls(cfg)?);
    }
    let exporter = exporter
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(cfg.max_queue_size)
        .with_max_export_batch_size(cfg.max_queue_size.min(512))
        .with_scheduled_delay(cfg.batch_delay)
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch)
        .build();
    let name = cfg
        .service_name
        .clone()
        .unwrap_or_else(|| binary.to_owned());
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            cfg.sampling,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(name)
                .build(),
        )
        .build())
}

/// The TLS of an `https://` collector: its certificate checked against `otlp_ca_file` or the
/// system's roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` are honoured), and the client certificate
/// when configured. The files are read once, here: a file that cannot be read or holds no PEM
/// stops the start with the key's name.
// The collector is not a Signet server (no SPIFFE ID to check): a Web PKI server name check is
// what it has, as any OTLP exporter does.
#[allow(clippy::disallowed_methods)]
fn collector_tls(
    cfg: &TelemetryConfig,
) -> Result<tonic::transport::ClientTlsConfig, TelemetryError> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new();
    tls = match &cfg.otlp_ca_file {
        Some(path) => tls.ca_certificate(Certificate::from_pem(read_pem(
            "otlp_ca_file",
            path,
            "CERTIFICATE",
        )?)),
        None => tls.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&cfg.otlp_client_cert_file, &cfg.otlp_client_key_file) {
        tls = tls.identity(Identity::from_pem(
            read_pem("otlp_client_cert_file", cert, "CERTIFICATE")?,
            read_pem("otlp_client_key_file", key, "PRIVATE KEY")?,
        ));
    }
    Ok(tls)
}

/// The PEM file `path` of `field`, which must hold a block whose label ends with `label`
/// (`CERTIFICATE`; `PRIVATE KEY` also matches `EC PRIVATE KEY` and `RSA PRIVATE KEY`). The
/// error names the key and the file, never the contents.
fn read_pem(field: &'static str, path: &Path, label: &str) -> Result<Vec<u8>, TelemetryError> {
    let pem = std::fs::read(path).map_err(|e| TelemetryError::Invalid {
        field,
        message: format!("cannot read {}: {e}", path.display()),
    })?;
    let text = String::from_utf8_lossy(&pem);
    let found = text.lines().any(|l| {
        l.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if !found {
        return Err(TelemetryError::Invalid {
            field,
            message: format!("{} holds no PEM {label}", path.display()),
        });
    }
    Ok(pem)
}

// --- propagation ----------------------------------------------------------------------------

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// Makes `span` continue the trace of the W3C `traceparent`/`tracestate` in `headers`, if
/// any (a disabled span, with tracing off, costs nothing here).
pub fn set_remote_parent(span: &Span, headers: &http::HeaderMap) {
    if span.is_disabled() || !headers.contains_key("traceparent") {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    // Fails only when the span has already started a trace of its own: it just has no parent.
    let _ = span.set_parent(cx);
}

/// Adds the current span's `traceparent` (and `tracestate`) to an outgoing call's metadata,
/// so the server's spans join this trace. Nothing when no span is being traced.
pub fn inject_context(metadata: &mut tonic::metadata::MetadataMap) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    TraceContextPropagator::new().inject_context(&span.context(), &mut MetadataInjector(metadata));
}

/// A request carrying the current span's trace context (see [`inject_context`]).
pub fn traced_request<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    inject_context(req.metadata_mut());
    req
}

// --- the server side of every gRPC call -----------------------------------------------------

/// A tower layer for a tonic server: each call is one span `grpc.server` named
/// `package.Service/Method`, continuing the caller's W3C trace context, with its gRPC status
/// (`rpc.grpc.status_code`, `outcome`) recorded when the handler answers.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcTraceLayer;

impl<S> tower::Layer<S> for GrpcTraceLayer {
    type Service = GrpcTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTrace { inner }
    }
}

/// See [`GrpcTraceLayer`].
#[derive(Debug, Clone)]
pub struct GrpcTrace<S> {
    inner: S,
}

impl<S, B, RB> tower::Service<http::Request<B>> for GrpcTrace<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = GrpcTraceFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        let name = path.strip_prefix('/').unwrap_or(path);
        let span = tracing::info_span!(
            target: TARGET,
            "grpc.server",
            otel.name = name,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.method = name,
            rpc.grpc.status_code = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        set_remote_parent(&span, req.headers());
        let inner = span.in_scope(|| self.inner.call(req));
        GrpcTraceFuture { inner, span }
    }
}

pin_project_lite::pin_project! {
    /// See [`GrpcTraceLayer`].
    pub struct GrpcTraceFuture<F> {
        #[pin]
        inner: F,
        span: Span,
    }
}

impl<F, RB, E> Future for GrpcTraceFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let out = std::task::ready!(this.inner.poll(cx));
        if !this.span.is_disabled() {
            // A unary answer carries its status in the headers when it failed; without one it
            // succeeded (the trailers will say 0).
            let code = match &out {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0),
                Err(_) => 2,
            };
            this.span.record("rpc.grpc.status_code", code);
            this.span.record(
                "outcome",
                if code == 0 {
                    "ok"
                } else {
                    grpc_code_name(code)
                },
            );
        }
        Poll::Ready(out)
    }
}

/// The canonical name of a gRPC status code (`PERMISSION_DENIED`), for the `outcome`.
fn grpc_code_name(code: i64) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

/// Records `outcome` on `span`: `ok`, or the error's short name from `name`.
pub fn record_outcome<T, E>(span: &Span, result: &Result<T, E>, name: impl FnOnce(&E) -> &str) {
    match result {
        Ok(_) => span.record("outcome", "ok"),
        Err(e) => span.record("outcome", name(e)),
    };
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_off_and_valid() {
        let c = TelemetryConfig::default();
        assert_eq!(c.otlp_endpoint, None);
        assert_eq!(c.sampling, 1.0);
        c.validate().unwrap();
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let with = |f: fn(&mut TelemetryConfig)| {
            let mut c = TelemetryConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        let e = with(|c| c.otlp_endpoint = Some("ftp://collector:4317".into()));
        assert!(
            e.contains("telemetry.otlp_endpoint") && e.contains("https://"),
            "{e}"
        );
        let e = with(|c| c.otlp_endpoint = Some("collector:4317".into()));
        assert!(e.contains("telemetry.otlp_endpoint"), "{e}");
        let e = with(|c| c.sampling = 1.5);
        assert!(e.contains("telemetry.sampling"), "{e}");
        let e = with(|c| c.max_queue_size = 0);
        assert!(e.contains("telemetry.max_queue_size"), "{e}");
        let e = with(|c| c.export_timeout = Duration::ZERO);
        assert!(e.contains("export_timeout"), "{e}");
        let e = with(|c| c.service_name = Some(String::new()));
        assert!(e.contains("telemetry.service_name"), "{e}");
        let mut ok = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4317".into()),
            ..TelemetryConfig::default()
        };
        ok.validate().unwrap();
        ok.sampling = 0.0;
        ok.validate().unwrap();
    }

    #[test]
    fn tls_settings_need_an_https_endpoint_and_come_in_pairs() {
        let https = || TelemetryConfig {
            otlp_endpoint: Some("https://collector.example:4317".into()),
            ..TelemetryConfig::default()
        };
        https().validate().unwrap();
        let e = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4317".into()),
            otlp_ca_file: Some("/etc/ca.pem".into()),
            ..TelemetryConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("telemetry.otlp_ca_file") && e.contains("https://"),
            "{e}"
        );
        let e = TelemetryConfig {
            otlp_client_cert_file: Some("/etc/c.pem".into()),
            ..https()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("telemetry.otlp_client_key_file"), "{e}");
        let e = TelemetryConfig {
            otlp_client_key_file: Some("/etc/k.pem".into()),
            ..https()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("telemetry.otlp_client_cert_file"), "{e}");
        TelemetryConfig {
            otlp_ca_file: Some("/etc/ca.pem".into()),
            otlp_client_cert_file: Some("/etc/c.pem".into()),
            otlp_client_key_file: Some("/etc/k.pem".into()),
            ..https()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn tls_files_are_read_once_and_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("signet-otlp-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let key = dir.join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let with = |ca: &Path| TelemetryConfig {
            otlp_endpoint: Some("https://collector.example:4317".into()),
            otlp_ca_file: Some(ca.to_owned()),
            ..TelemetryConfig::default()
        };
        let e = collector_tls(&with(&dir.join("missing.pem")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("telemetry.otlp_ca_file") && e.contains("missing.pem"),
            "{e}"
        );
        let e = collector_tls(&with(&junk)).unwrap_err().to_string();
        assert!(
            e.contains("telemetry.otlp_ca_file") && e.contains("no PEM CERTIFICATE"),
            "{e}"
        );
        // The key file's contents never appear in the error.
        let e = collector_tls(&TelemetryConfig {
            otlp_ca_file: None,
            otlp_client_cert_file: Some(key.clone()),
            otlp_client_key_file: Some(key.clone()),
            ..with(&junk)
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("telemetry.otlp_client_cert_file"), "{e}");
        assert!(!e.contains("MC4CAQ"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn config_reads_durations_and_refuses_unknown_keys() {
        let c: TelemetryConfig = serde_json::from_str(
            r#"{"otlp_endpoint":"http://127.0.0.1:4317","batch_delay":"100ms","sampling":0.5}"#,
        )
        .unwrap();
        assert_eq!(c.batch_delay, Duration::from_millis(100));
        assert_eq!(c.sampling, 0.5);
        let e = serde_json::from_str::<TelemetryConfig>(r#"{"otlp_endpont":"x"}"#).unwrap_err();
        assert!(e.to_string().contains("otlp_endpont"), "{e}");
    }

    #[test]
    fn remote_parent_is_read_from_w3c_headers() {
        let mut h = http::HeaderMap::new();
        h.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        );
        let cx = TraceContextPropagator::new().extract(&HeaderExtractor(&h));
        use opentelemetry::trace::TraceContextExt as _;
        let sc = cx.span().span_context().clone();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_remote() && sc.is_sampled());
    }

    /// With traces off, a trace span is disabled at its call site (what makes tracing off
    /// free), while logs flow as before and never show trace spans.
    #[test]
    fn with_traces_off_trace_spans_are_disabled_and_logs_unchanged() {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let logs = LogOptions {
            json: false,
            default_filter: "info",
            level: None,
        };
        let (layer, _) = log_layer(
            &logs,
            move || out.clone(),
            false,
            tracing_subscriber::EnvFilter::new("info"),
        );
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let traced = tracing::info_span!(target: TARGET, "sign", serial = "ab");
            assert!(traced.is_disabled());
            let _in = traced.enter();
            let plain = tracing::info_span!("plain");
            assert!(!plain.is_disabled());
            tracing::info!(seq = 7, "issued");
            tracing::debug!("not at info");
        });
        // RUST_LOG naming the target does not bring the spans into the logs.
        let subscriber = tracing_subscriber::registry().with(
            log_layer(
                &logs,
                std::io::sink,
                false,
                tracing_subscriber::EnvFilter::new("info,signet_trace=trace"),
            )
            .0,
        );
        tracing::subscriber::with_default(subscriber, || {
            assert!(tracing::info_span!(target: TARGET, "sign").is_disabled());
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("issued seq=7"), "{text}");
        // No `sign{serial="ab"}:` span context before the message.
        assert!(
            !text.contains("serial") && !text.contains("not at info"),
            "{text}"
        );
    }

    #[test]
    fn nothing_is_injected_without_a_traced_span() {
        let mut md = tonic::metadata::MetadataMap::new();
        inject_context(&mut md);
        assert!(md.is_empty());
        assert_eq!(grpc_code_name(7), "PERMISSION_DENIED");
    }

    #[test]
    fn log_levels_are_levels_or_directives() {
        for ok in [
            "debug",
            "WARN",
            "off",
            "info,signet_server=debug",
            "h2=trace",
        ] {
            ok.parse::<LogLevel>().unwrap();
        }
        for (bad, why) in [
            ("verbose", "\"verbose\" is not a level"),
            ("", "empty"),
            ("signet_server", "is not a level"),
            ("info,h2=loud", "\"loud\" is not a level"),
            ("=debug", "names no target"),
        ] {
            let e = bad.parse::<LogLevel>().unwrap_err();
            assert!(e.contains(why) && e.contains("use a level"), "{bad}: {e}");
        }
        let l: LogLevel = "debug".parse().unwrap();
        assert_eq!(
            l.filter_directives("info,sqlx=warn,h2=warn"),
            "debug,sqlx=warn,h2=warn"
        );
        let l: LogLevel = "error".parse().unwrap();
        assert_eq!(l.filter_directives("info,h2=warn"), "error,h2=error");
        let l: LogLevel = "info,h2=debug".parse().unwrap();
        assert_eq!(l.filter_directives("info,h2=warn"), "info,h2=debug");
        let e = serde_json::from_str::<LogLevel>("\"loud\"").unwrap_err();
        assert!(e.to_string().contains("is not a level"), "{e}");
    }

    /// The filter is replaced while logging: a debug line appears only after the change, and
    /// setting the same filter again says so.
    #[test]
    fn the_log_filter_is_replaced_in_place() {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let info: LogLevel = "info".parse().unwrap();
        let logs = LogOptions {
            json: true,
            default_filter: "info",
            level: Some(info.clone()),
        };
        let (filter, described) = log_filter(logs.level.as_ref(), logs.default_filter);
        let (layer, handle) = log_layer(&logs, move || out.clone(), false, filter);
        let control = LogControl {
            handle,
            default_filter: "info",
            current: Arc::new(Mutex::new(described)),
        };
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!("hidden");
            let debug: LogLevel = "debug".parse().unwrap();
            assert_eq!(
                control.set(Some(&debug)).unwrap(),
                LogChange::Changed {
                    from: "info (log_level)".into(),
                    to: "debug (log_level)".into()
                }
            );
            tracing::debug!("shown");
            assert_eq!(
                control.set(Some(&debug)).unwrap(),
                LogChange::Unchanged("debug (log_level)".into())
            );
            control.set(Some(&info)).unwrap();
            tracing::debug!("hidden again");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("shown") && !text.contains("hidden"), "{text}");
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }
}
