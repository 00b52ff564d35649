//! Helpers for the benchmark programs (`src/bin/bench-*.rs`): what they read of a running
//! process (`/proc` memory and CPU), of a Prometheus exposition, and of a certificate a sink
//! wrote, and a `signet-server` they can stop and start again on the same ports and data.
//!
//! Nothing here asserts: a benchmark prints figures. Readers return 0 / `None` for what is not
//! there (a process that exited, a file being replaced), so a sampling loop never panics on a
//! race.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A field of `/proc/<pid>/status` in kB (`"VmRSS:"`, `"VmHWM:"`); 0 when unreadable.
pub fn status_kb(pid: u32, field: &str) -> u64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Where a process's resident memory is, from `/proc/<pid>/status` (0 for what is unreadable).
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub rss_kb: u64,
    /// The peak resident set so far (VmHWM).
    pub hwm_kb: u64,
    pub anon_kb: u64,
    pub file_kb: u64,
    pub shmem_kb: u64,
    pub threads: u64,
}

impl Memory {
    pub fn of(pid: u32) -> Self {
        Self {
            rss_kb: status_kb(pid, "VmRSS:"),
            hwm_kb: status_kb(pid, "VmHWM:"),
            anon_kb: status_kb(pid, "RssAnon:"),
            file_kb: status_kb(pid, "RssFile:"),
            shmem_kb: status_kb(pid, "RssShmem:"),
            // Not in kB, but the same "Name:\tvalue" shape.
            threads: status_kb(pid, "Threads:"),
        }
    }

    /// One line: `when`, VmRSS and where it is.
    pub fn print(&self, when: &str) {
        let mb = |kb: u64| kb as f64 / 1024.0;
        println!(
            "  {when:<44} {:>8.1} MB  (anon {:.1} MB, file {:.1} MB, shmem {:.1} MB; {} threads)",
            mb(self.rss_kb),
            mb(self.anon_kb),
            mb(self.file_kb),
            mb(self.shmem_kb),
            self.threads
        );
    }
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` spells them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// utime + stime of a process, in clock ticks; 0 when unreadable.
pub fn cpu_ticks(pid: u32) -> u64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name may contain spaces; the fields after it start after the last ')'.
    let Some(rest) = s.rfind(')').and_then(|i| s.get(i + 2..)) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

pub fn clock_ticks_per_sec() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// A loopback port free now (bound, then released: a listener started soon after gets it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The sum of every sample of metric `name` in a Prometheus text exposition whose labels
/// contain each of `labels` (`key="value"` strings); counters end in `_total`.
pub fn metric_sum(exposition: &str, name: &str, labels: &[&str]) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, r)) => (m, r),
                None => (series, ""),
            };
            (metric == name && labels.iter().all(|want| rest.contains(want)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        // A float sum of nothing is -0.0.
        .fold(0.0, |a, b| a + b)
}

/// What a sink's certificate file says of its leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafInfo {
    /// Lowercase hex.
    pub serial: String,
    /// Unix seconds (the server backdates it a little from the issuance).
    pub not_before: i64,
    /// The authority key identifier, lowercase hex: the issuing CA key's ID.
    pub issuer_key_id: String,
}

/// The leaf of a PEM chain file; `None` when missing or not (yet) a whole certificate.
pub fn leaf_info(path: &Path) -> Option<LeafInfo> {
    let pem = std::fs::read(path).ok()?;
    let der = signet_types::pem::parse_certs(&pem)
        .ok()?
        .into_iter()
        .next()?;
    let cert = signet_pki::ParsedCert::from_der(&der).ok()?;
    let not_before = cert
        .not_before()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    Some(LeafInfo {
        serial: cert.serial_hex().to_owned(),
        not_before,
        issuer_key_id: cert.authority_key_id().unwrap_or_default().to_owned(),
    })
}

/// `signet-server` on fixed loopback ports with a kept data directory, so it can be stopped
/// and started again where its clients expect it (an outage).
pub struct FixedServer {
    pub config: PathBuf,
    pub data_dir: PathBuf,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    child: Option<Child>,
    log: PathBuf,
}

impl FixedServer {
    /// Writes the config (`database_url`: PostgreSQL, else the embedded SQLite in `data_dir`;
    /// `extra_toml` appended) and starts the server.
    pub async fn start(
        data_dir: &Path,
        database_url: Option<&str>,
        extra_toml: &str,
        log: &Path,
    ) -> Self {
        std::fs::create_dir_all(data_dir).unwrap();
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut toml = format!(
            "listen = \"{grpc}\"\nhttp_listen = \"{http}\"\ndata_dir = \"{}\"\n",
            data_dir.display()
        );
        if let Some(url) = database_url {
            toml.push_str(&format!("database_url = \"{url}\"\n"));
        }
        toml.push_str(extra_toml);
        let config = data_dir.join("server.toml");
        std::fs::write(&config, toml).unwrap();
        let mut s = Self {
            config,
            data_dir: data_dir.to_owned(),
            grpc,
            http,
            child: None,
            log: log.to_owned(),
        };
        s.restart().await;
        s
    }

    /// Starts the process (again) and waits for its "ready" line.
    pub async fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = Command::new(crate::bin("signet-server"))
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "warn,sqlx=warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("start signet-server");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = async {
            while let Ok(Some(l)) = lines.next_line().await {
                if l == "ready" {
                    return true;
                }
            }
            false
        };
        let ok = tokio::time::timeout(Duration::from_secs(120), ready)
            .await
            .unwrap_or(false);
        assert!(
            ok,
            "signet-server did not become ready (log: {})",
            self.log.display()
        );
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.child = Some(child);
    }

    /// SIGTERM, then wait for the exit (killed after 30 s).
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    pub fn admin_socket(&self) -> PathBuf {
        self.data_dir.join("admin.sock")
    }

    pub fn bundle_path(&self) -> PathBuf {
        self.data_dir.join("bundle.pem")
    }

    /// `GET /metrics` (empty when the server does not answer).
    pub async fn metrics(&self) -> String {
        scrape(self.http).await
    }
}

/// `GET /metrics` on `addr` within 5 s (empty when it does not answer).
pub async fn scrape(addr: SocketAddr) -> String {
    let get = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        text.split_once("\r\n\r\n").map(|x| x.1.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Waits until `done` (checked every `every`) or `limit`; returns the time taken, or `None`
/// at the limit.
pub async fn wait_until(
    limit: Duration,
    every: Duration,
    mut done: impl FnMut() -> bool,
) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if done() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// The admin API of `server`, and a join token (ten minutes) for the node `bench`.
pub async fn bench_node(
    server: &crate::Server,
) -> (
    signet_proto::admin::node_admin_client::NodeAdminClient<tonic::transport::Channel>,
    String,
) {
    let mut admin = signet_proto::admin::node_admin_client::NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .expect("admin socket"),
    );
    let token = admin
        .create_join_token(signet_proto::admin::CreateJoinTokenRequest {
            ttl_seconds: 600,
            node_id: "bench".into(),
        })
        .await
        .expect("join token")
        .into_inner()
        .token;
    (admin, token)
}

/// The real `signet-agent` with `config`, its output (both streams) in `log` and
/// `RUST_LOG=warn`; under `wrapper` (a tool and its arguments, e.g. valgrind's massif) when
/// given. Killed when the child is dropped.
pub fn spawn_agent(config: &Path, log: &Path, wrapper: &[String]) -> Child {
    let log = std::fs::File::create(log).unwrap();
    let mut agent = match wrapper.split_first() {
        Some((tool, tool_args)) => {
            let mut c = Command::new(tool);
            c.args(tool_args).arg(crate::bin("signet-agent"));
            c
        }
        None => Command::new(crate::bin("signet-agent")),
    };
    agent
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("start signet-agent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_adds_the_matching_series() {
        let text = "# HELP signet_issuances Certificate requests\n\
                    signet_issuances_total{api=\"node\",outcome=\"issued\"} 7\n\
                    signet_issuances_total{api=\"istio\",outcome=\"issued\"} 3\n\
                    signet_issuances_total{api=\"node\",outcome=\"refused\"} 2\n\
                    signet_limited_total{limit=\"per_source\"} 5\n";
        assert_eq!(metric_sum(text, "signet_issuances_total", &[]), 12.0);
        assert_eq!(
            metric_sum(text, "signet_issuances_total", &["outcome=\"issued\""]),
            10.0
        );
        assert_eq!(metric_sum(text, "signet_limited_total", &[]), 5.0);
        assert_eq!(metric_sum(text, "signet_absent_total", &[]), 0.0);
        assert_eq!(
            format!("{:.0}", metric_sum(text, "signet_absent_total", &[])),
            "0"
        );
    }

    #[test]
    fn readers_of_a_missing_process_or_file_answer_nothing() {
        assert_eq!(status_kb(u32::MAX, "VmRSS:"), 0);
        assert_eq!(cpu_ticks(u32::MAX), 0);
        assert!(leaf_info(Path::new("/nonexistent/svid.pem")).is_none());
        assert!(status_kb(std::process::id(), "VmRSS:") > 0);
    }
}
