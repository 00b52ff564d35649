//! Helpers for the Workload API attack tests: `wl-probe` processes (each a caller with a pid
//! of its own), a fake `/proc` for them, a mock kubelet, and the agent's CPU time.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::bin;

/// The canonical path of the `wl-probe` binary (what `/proc/<pid>/exe` shows).
pub fn probe_path() -> PathBuf {
    std::fs::canonicalize(bin("wl-probe")).unwrap()
}

/// What one `wl-probe` fetch got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// The SPIFFE IDs served, and how many came with a private key.
    Svids(Vec<String>, usize),
    /// The gRPC status code (negative: transport failure) and message.
    Refused(i32, String),
}

impl Fetched {
    pub fn parse(line: &str) -> Self {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("wl-probe printed {line:?}: {e}"));
        if v["ok"].as_bool() == Some(true) {
            let ids = v["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect();
            Fetched::Svids(ids, v["keys"].as_u64().unwrap() as usize)
        } else {
            Fetched::Refused(
                v["code"].as_i64().unwrap() as i32,
                v["message"].as_str().unwrap_or_default().to_owned(),
            )
        }
    }

    pub fn ids(&self) -> Vec<String> {
        match self {
            Fetched::Svids(ids, _) => ids.clone(),
            Fetched::Refused(..) => Vec::new(),
        }
    }
}

/// `wl-probe fetch SOCKET` from `exe` (default the real probe), once.
pub async fn probe_fetch(exe: Option<&Path>, socket: &Path) -> Fetched {
    probe_fetch_over(exe, socket, "workload").await
}

/// [`probe_fetch`] over `api`: `workload` (FetchX509SVID) or `sds` (Envoy SDS, `default`).
pub async fn probe_fetch_over(exe: Option<&Path>, socket: &Path, api: &str) -> Fetched {
    let exe = exe.map(Path::to_owned).unwrap_or_else(probe_path);
    let out = Command::new(exe)
        .env("WL_PROBE_API", api)
        .arg("fetch")
        .arg(socket)
        .output()
        .await
        .unwrap();
    Fetched::parse(String::from_utf8_lossy(&out.stdout).trim())
}

/// A `wl-probe fetch SOCKET --wait-stdin` process: it has a pid before it connects, so a
/// test can prepare what the agent will see of it.
pub struct WaitingProbe {
    pub child: Child,
    pub pid: i32,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl WaitingProbe {
    pub fn spawn(socket: &Path) -> Self {
        let mut child = Command::new(probe_path())
            .arg("fetch")
            .arg(socket)
            .arg("--wait-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap() as i32;
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            pid,
            stdin,
            stdout,
        }
    }

    /// Lets it connect and fetch; its answer.
    pub async fn go(mut self) -> Fetched {
        self.stdin.write_all(b"go\n").await.unwrap();
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(30), self.stdout.read_line(&mut line))
            .await
            .expect("wl-probe answers")
            .unwrap();
        let _ = self.child.wait().await;
        Fetched::parse(line.trim())
    }
}

/// Makes `<root>/<pid>` describe the real process `pid` (its real `stat`, so the start time
/// matches, and `exe`), but with `cgroup` as given.
pub fn fake_proc_entry(root: &Path, pid: i32, cgroup: &str) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    std::fs::write(dir.join("stat"), stat).unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let _ = std::fs::remove_file(dir.join("exe"));
    std::os::unix::fs::symlink(exe, dir.join("exe")).unwrap();
}

/// User + system CPU time of a process, in clock ticks (`/proc/<pid>/stat` fields 14, 15).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // After ")": field 3 is index 0, so fields 14 and 15 are 11 and 12.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Clock ticks per second (USER_HZ; 100 on Linux).
pub const TICKS_PER_SECOND: u64 = 100;

/// A free loopback port (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A metric's value in an OpenMetrics text, 0 when absent.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0.0)
}

/// A mock kubelet: HTTPS on 127.0.0.1 with a certificate for that IP from its own CA,
/// answering `GET /pods` with `pods_json` to requests bearing `token`, 401 to others.
pub struct MockKubelet {
    pub url: String,
    pub ca_file: PathBuf,
    pub token_file: PathBuf,
    pub requests: Arc<AtomicUsize>,
    pub unauthorized: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockKubelet {
    pub async fn start(pods_json: String) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let ca_file = dir.path().join("kubelet-ca.pem");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        let token = "agent-sa-token-for-the-kubelet";
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();

        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let unauthorized = Arc::new(AtomicUsize::new(0));
        let (req_count, unauth) = (requests.clone(), unauthorized.clone());
        let body = Arc::new(pods_json);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let body = body.clone();
                let (req_count, unauth) = (req_count.clone(), unauth.clone());
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).to_string();
                    let authorized = head
                        .lines()
                        .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {token}")));
                    let is_pods = head.starts_with("GET /pods ");
                    let (status, body) = if !authorized {
                        unauth.fetch_add(1, Ordering::SeqCst);
                        ("401 Unauthorized", String::from("Unauthorized"))
                    } else if is_pods {
                        req_count.fetch_add(1, Ordering::SeqCst);
                        ("200 OK", body.to_string())
                    } else {
                        ("404 Not Found", String::new())
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Self {
            url,
            ca_file,
            token_file,
            requests,
            unauthorized,
            _dir: dir,
            task,
        }
    }
}
