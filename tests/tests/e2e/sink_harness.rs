//! For the sink attack tests: the real `signet-agent` with any sinks, its logs kept and its
//! HTTP port known (for `/readyz` and `/metrics`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use signet_tests::{Server, bin, http_get, serial_of};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::agent::eventually;

/// Whether the tests run as root (needed to act as another uid on the node).
pub(crate) fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

/// A running `signet-agent`, its stderr kept.
pub(crate) struct RunningAgent {
    child: Child,
    pub(crate) http: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl RunningAgent {
    pub(crate) async fn start(config: &Path) -> Self {
        let mut child = Command::new(bin("signet-agent"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info,h2=warn")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let http = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await.unwrap() {
                eprintln!("agent: {l}");
                let found = l.contains("signet-agent started").then(|| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix("http="))
                        .and_then(|a| a.parse::<SocketAddr>().ok())
                });
                logs.lock().unwrap().push(l);
                if let Some(Some(a)) = found {
                    return a;
                }
            }
            panic!(
                "signet-agent exited before it started: {:?}",
                logs.lock().unwrap()
            );
        })
        .await
        .expect("signet-agent started");
        let kept = logs.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                eprintln!("agent: {l}");
                kept.lock().unwrap().push(l);
            }
        });
        Self { child, http, logs }
    }

    pub(crate) fn logged(&self, needle: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// How many log lines contain `needle`.
    pub(crate) fn count_logged(&self, needle: &str) -> usize {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    pub(crate) async fn readyz(&self) -> (u16, String) {
        http_get(self.http, "/readyz").await
    }

    pub(crate) async fn metrics(&self) -> String {
        http_get(self.http, "/metrics").await.1
    }

    /// The value of the metric line naming all of `labels`, if any.
    pub(crate) async fn metric(&self, name: &str, labels: &[&str]) -> Option<f64> {
        self.metrics().await.lines().find_map(|l| {
            (l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
                .then(|| l.rsplit(' ').next()?.parse().ok())
                .flatten()
        })
    }

    pub(crate) async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("the agent stops on SIGTERM")
            .unwrap();
        assert!(status.success(), "agent exit: {status:?}");
    }
}

/// An agent configuration with `sinks` (TOML `[[sinks]]` tables) and `extra` top-level keys.
pub(crate) struct AgentFiles {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) config: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) data_dir: PathBuf,
}

pub(crate) fn agent_files(server: &Server, token: &str, extra: &str, sinks: &str) -> AgentFiles {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let socket = root.join("agent.sock");
    let data_dir = root.join("data");
    let config = root.join("agent.toml");
    let toml = format!(
        r#"server_address = "https://127.0.0.1:{port}"
trust_bundle_file = "{bundle}"
join_token = "{token}"
data_dir = "{data}"
workload_api_socket = "{socket}"
http_listen = "127.0.0.1:0"
sync_interval = "300ms"
{extra}
{sinks}
"#,
        port = server.grpc.port(),
        bundle = server.bundle_path().display(),
        data = data_dir.display(),
        socket = socket.display(),
    );
    std::fs::write(&config, toml).unwrap();
    AgentFiles {
        _dir: dir,
        config,
        socket,
        data_dir,
    }
}

/// The serial of the first certificate in `file`, when it can be read.
pub(crate) fn leaf_serial(file: &Path) -> Option<String> {
    let pem = std::fs::read_to_string(file).ok()?;
    let end = pem.find("-----END CERTIFICATE-----")?;
    Some(serial_of(&pem[..end + "-----END CERTIFICATE-----\n".len()]))
}

/// Waits until `file`'s leaf has a serial other than `before` (a new delivery).
pub(crate) async fn next_delivery(
    secs: u64,
    what: &str,
    file: &Path,
    before: Option<&str>,
) -> String {
    eventually(secs, what, || async {
        leaf_serial(file).filter(|s| Some(s.as_str()) != before)
    })
    .await
}
