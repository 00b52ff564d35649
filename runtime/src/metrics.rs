//! What every binary's `/metrics` does the same way: the process metrics
//! ([`ProcessCollector`]: CPU, memory, file descriptors, start time, from `/proc/self`), the
//! `signet_<binary>_build_info` gauge ([`standard_registry`]), and the exposition format the
//! scraper asked for ([`negotiate`], [`encode`], [`response`]).
//!
//! # Formats
//!
//! `prometheus-client` writes OpenMetrics 1.0.0. Prometheus asks for it (its `Accept` header
//! lists `application/openmetrics-text` first), but a scraper that asks only for the classic
//! text format (`Accept: text/plain;version=0.0.4`, or no `Accept` at all: curl, older agents,
//! `promtool check metrics`) gets that format, converted by [`openmetrics_to_text`]:
//! - `# EOF` and `# UNIT` lines are dropped (the unit is already the name's suffix);
//! - a counter's `# HELP`/`# TYPE` name gains the `_total` its samples carry (OpenMetrics names
//!   the family without it), and its `_created` samples are dropped;
//! - an info family becomes a gauge named `<name>_info`; OpenMetrics-only types
//!   (`gaugehistogram`, `stateset`, `unknown`) become `untyped`;
//! - exemplars (` # {…} v`) are cut off the sample lines;
//! - `\"` in help text, escaped in OpenMetrics only, is unescaped.

use std::fmt::Write as _;
use std::path::Path;

use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use http::header::{ACCEPT, CONTENT_TYPE};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// The `Content-Type` of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the Prometheus text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Text,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Text => TEXT_CONTENT_TYPE,
        }
    }
}

/// The format a request's `Accept` header prefers: OpenMetrics when it lists
/// `application/openmetrics-text` with a quality at least that of any text it accepts
/// (`text/plain`, `text/*`, `*/*`), else the text format (also with no `Accept`, or one that
/// cannot be read).
pub fn negotiate(headers: &HeaderMap) -> Format {
    let mut openmetrics = 0.0_f32;
    let mut text = 0.0_f32;
    for value in headers.get_all(ACCEPT) {
        let Ok(value) = value.to_str() else { continue };
        for range in value.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok())
                .unwrap_or(0.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
    }
    if openmetrics > 0.0 && openmetrics >= text {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

/// `registry` in `format` (empty when encoding fails, which a registry of this crate's metric
/// types does not).
pub fn encode(registry: &Registry, format: Format) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    match format {
        Format::OpenMetrics => out,
        Format::Text => openmetrics_to_text(&out),
    }
}

/// The HTTP answer: `body` (encoded in `format`) with its content type.
pub fn response(format: Format, body: String) -> Response {
    ([(CONTENT_TYPE, format.content_type())], body).into_response()
}

/// The OpenMetrics text `om` in the Prometheus text format 0.0.4 (see the module docs for
/// what changes). Written for what `prometheus-client` encodes: one `# HELP`, `# TYPE` and
/// optional `# UNIT` per family, then its samples.
pub fn openmetrics_to_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    // The current family's name (as OpenMetrics writes it) and its type.
    let mut family: (&str, &str) = ("", "");
    let mut pending_help: Option<&str> = None;
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            // Written once its TYPE says what the name becomes.
            pending_help = Some(rest);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            family = (name, kind);
            let (text_name, text_kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                _ => (name.to_owned(), "untyped"),
            };
            if let Some(help) = pending_help.take() {
                let text = help
                    .split_once(' ')
                    .map_or("", |(_, h)| h)
                    .replace("\\\"", "\"");
                let _ = writeln!(out, "# HELP {text_name} {text}");
            }
            let _ = writeln!(out, "# TYPE {text_name} {text_kind}");
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let sample = strip_exemplar(line);
        let name_end = sample.find(['{', ' ']).unwrap_or(sample.len());
        let (fam, kind) = family;
        if kind == "counter" && sample[..name_end].strip_prefix(fam) == Some("_created") {
            continue;
        }
        out.push_str(sample);
        out.push('\n');
    }
    out
}

/// A sample line without its exemplar (` # {labels} value [timestamp]`), found after the
/// label set (whose quoted values may hold anything, escaped).
fn strip_exemplar(line: &str) -> &str {
    let mut in_quotes = false;
    let mut escaped = false;
    let mut labels_end = 0;
    if line.contains('{') {
        for (i, c) in line.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_quotes => escaped = true,
                '"' => in_quotes = !in_quotes,
                '}' if !in_quotes => {
                    labels_end = i;
                    break;
                }
                _ => {}
            }
        }
    }
    match line[labels_end..].find(" # ") {
        Some(at) => &line[..labels_end + at],
        None => line,
    }
}

/// A registry with what every Signet binary exposes besides its own families: the process
/// metrics (`process_*`) and `signet_<binary>_build_info{version, rustc[, commit]}` = 1. The
/// binary registers its own families in a sub-registry with its prefix.
pub fn standard_registry(binary: &str, version: &str) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector::new("/proc/self")));
    let info = Family::<Vec<(&'static str, String)>, Gauge>::default();
    info.get_or_create(&build_labels(version)).set(1);
    registry.register(
        format!("signet_{binary}_build_info"),
        "1, labelled with the version of this binary, the compiler that built it and (when the build set SIGNET_BUILD_COMMIT) its source commit",
        info,
    );
    registry
}

fn build_labels(version: &str) -> Vec<(&'static str, String)> {
    let mut labels = vec![
        ("version", version.to_owned()),
        ("rustc", env!("SIGNET_RUSTC_VERSION").to_owned()),
    ];
    if let Some(commit) = option_env!("SIGNET_BUILD_COMMIT").filter(|c| !c.is_empty()) {
        labels.push(("commit", commit.to_owned()));
    }
    labels
}

/// The process metrics Prometheus's client libraries export, read from `/proc/self` at each
/// scrape (Linux; elsewhere, or when a file cannot be read, the families it cannot compute are
/// left out):
/// `process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
/// `process_start_time_seconds`, `process_threads`.
#[derive(Debug)]
pub struct ProcessCollector {
    proc_self: std::path::PathBuf,
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times (`USER_HZ`): 100 on every Linux
/// architecture the kernel exposes to user space (the Prometheus Go client assumes the same).
const USER_HZ: f64 = 100.0;

/// What the collector reads, parsed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessSample {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
    pub threads: Option<u64>,
}

impl ProcessCollector {
    /// Reads `proc_self` (`/proc/self`, or a directory shaped like it in tests); the boot time
    /// comes from `stat` in its parent.
    pub fn new(proc_self: impl Into<std::path::PathBuf>) -> Self {
        Self {
            proc_self: proc_self.into(),
        }
    }

    /// The values now.
    pub fn sample(&self) -> ProcessSample {
        let read = |name: &str| std::fs::read_to_string(self.proc_self.join(name)).ok();
        let stat = read("stat").as_deref().and_then(parse_stat);
        let boot = self
            .proc_self
            .parent()
            .map(|p| p.join("stat"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .as_deref()
            .and_then(parse_boot_time);
        ProcessSample {
            cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / USER_HZ),
            resident_bytes: read("status").as_deref().and_then(parse_vm_rss_bytes),
            virtual_bytes: stat.map(|s| s.vsize),
            open_fds: count_entries(&self.proc_self.join("fd")),
            max_fds: read("limits").as_deref().and_then(parse_max_fds),
            start_time_seconds: stat
                .zip(boot)
                .map(|(s, boot)| boot as f64 + s.starttime as f64 / USER_HZ),
            threads: stat.map(|s| s.threads),
        }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.sample();
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        let gauges: [(&str, &str, Option<f64>); 6] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
                s.max_fds.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                s.start_time_seconds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                s.threads.map(|v| v as f64),
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v);
                m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
            }
        }
        Ok(())
    }
}

/// The fields of `/proc/<pid>/stat` the collector uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub utime: u64,
    pub stime: u64,
    pub threads: u64,
    pub starttime: u64,
    pub vsize: u64,
}

/// Parses `/proc/<pid>/stat` (proc(5)): the fields after the command name, which is in
/// parentheses and may itself hold spaces and parentheses (so the last `)` ends it).
pub fn parse_stat(stat: &str) -> Option<Stat> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is index 0 here.
    let f: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        threads: field(20)?,
        starttime: field(22)?,
        vsize: field(23)?,
    })
}

/// The boot time (`btime`, unix seconds) from `/proc/stat`.
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `VmRSS` from `/proc/<pid>/status`, in bytes.
pub fn parse_vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut parts = line.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        _ => None,
    }
}

/// The soft limit of "Max open files" in `/proc/<pid>/limits` (`None` when unlimited).
pub fn parse_max_fds(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

fn count_entries(dir: &Path) -> Option<u64> {
    let entries = std::fs::read_dir(dir).ok()?;
    Some(entries.count() as u64)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "metrics_tests.rs"]
mod tests;
