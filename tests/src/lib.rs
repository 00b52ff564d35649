//! Test harness: starts the real `signet-server` binary on loopback with a temp data
//! directory, mints Kubernetes-style service-account tokens against a JWKS it writes, and
//! talks to the server with real TLS.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]
// The harness waits on real processes (servers, agents, benchmarks) and measures them on the real
// clock; the wall-clock ban (clippy.toml) is for the products' logic.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use signet_proto::admin::admin_client::AdminClient;
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

pub mod bench;
pub mod fake_ca;
pub mod otlp;
pub mod rogue;
pub mod workload;

pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// A built binary of the workspace: in `SIGNET_BIN_DIR` when set (a private copy, for
/// machines where several checkouts share one target directory and overwrite each other's
/// binaries), else next to the test executable's `deps/`.
pub fn bin(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("SIGNET_BIN_DIR") {
        let p = PathBuf::from(dir).join(name);
        assert!(
            p.exists(),
            "{} does not exist (SIGNET_BIN_DIR)",
            p.display()
        );
        return p;
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let dir = if dir.ends_with("deps") {
        dir.parent().unwrap()
    } else {
        dir
    };
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not built: run the tests through scripts/test or cargo nextest run --workspace",
        p.display()
    );
    p
}

pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A service-account token issuer: an ES256 key and its JWKS, like a cluster's OIDC issuer.
pub struct TokenIssuer {
    pkcs8: Vec<u8>,
    pub kid: String,
    pub issuer: String,
}

impl TokenIssuer {
    pub fn new(kid: &str) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap()
            .as_ref()
            .to_vec();
        Self {
            pkcs8,
            kid: kid.into(),
            issuer: ISSUER.into(),
        }
    }

    pub fn jwks_json(&self) -> String {
        let rng = ring::rand::SystemRandom::new();
        let kp =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &self.pkcs8, &rng).unwrap();
        let point = kp.public_key().as_ref();
        let (x, y) = (&point[1..33], &point[33..65]);
        serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
        }]})
        .to_string()
    }

    /// The claims of a projected token for `ns`/`sa`, valid for an hour.
    pub fn claims(&self, ns: &str, sa: &str) -> serde_json::Value {
        let now = now_unix();
        serde_json::json!({
            "iss": self.issuer,
            "sub": format!("system:serviceaccount:{ns}:{sa}"),
            "aud": ["istio-ca"],
            "iat": now, "nbf": now, "exp": now + 3600,
            "kubernetes.io": {
                "namespace": ns,
                "serviceaccount": {"name": sa, "uid": "8e5f6b8c-1f2e-4d2a-9a53-0c7d1e2f3a4b"},
                "pod": {"name": format!("{sa}-7d9f8b6c5-x2k4q"), "uid": "3c1d2e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"}
            }
        })
    }

    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(
            &header,
            claims,
            &jsonwebtoken::EncodingKey::from_ec_der(&self.pkcs8),
        )
        .unwrap()
    }

    pub fn token(&self, ns: &str, sa: &str) -> String {
        self.sign(&self.claims(ns, sa))
    }
}

/// Options for [`Server::start`].
#[derive(Default)]
pub struct ServerOpts {
    pub database_url: Option<String>,
    pub extra_toml: String,
    pub env: Vec<(String, String)>,
    /// Reuse this data directory (restart tests).
    pub data_dir: Option<PathBuf>,
    pub tokens: Option<String>,
}

/// A running `signet-server` process.
pub struct Server {
    child: Child,
    _dir: Option<tempfile::TempDir>,
    pub data_dir: PathBuf,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The probe listener, when `probe_listen` is set.
    pub probes: Option<SocketAddr>,
    pub root_sha256: String,
    pub bundle_pem: Vec<u8>,
    /// From the start-up banner ("CA for trust domain …").
    pub trust_domain: String,
    pub stdout: Vec<String>,
}

impl Server {
    /// Starts the binary with a config written from `opts` and waits for "ready".
    pub async fn start(opts: ServerOpts) -> Self {
        let (dir, data_dir) = match opts.data_dir {
            Some(d) => (None, d),
            None => {
                let d = tempfile::tempdir().unwrap();
                let p = d.path().join("data");
                (Some(d), p)
            }
        };
        std::fs::create_dir_all(&data_dir).unwrap();
        let mut toml = format!(
            "listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n",
            data_dir.display()
        );
        if let Some(url) = &opts.database_url {
            toml.push_str(&format!("database_url = \"{url}\"\n"));
        }
        toml.push_str(&opts.extra_toml);
        if let Some(jwks) = &opts.tokens {
            let jwks_path = data_dir.join("jwks.json");
            std::fs::write(&jwks_path, jwks).unwrap();
            toml.push_str(&format!(
                "\n[auth.kubernetes]\nissuer = \"{ISSUER}\"\njwks_file = \"{}\"\n",
                jwks_path.display()
            ));
        }
        let cfg_path = data_dir.join("server.toml");
        std::fs::write(&cfg_path, toml).unwrap();
        Self::spawn(
            dir,
            data_dir,
            &["--config", cfg_path.to_str().unwrap()],
            &opts.env,
        )
        .await
    }

    async fn spawn(
        dir: Option<tempfile::TempDir>,
        data_dir: PathBuf,
        args: &[&str],
        env: &[(String, String)],
    ) -> Self {
        let mut cmd = Command::new(bin("signet-server"));
        cmd.args(args)
            .envs(env.iter().cloned())
            .env("RUST_LOG", "info,sqlx=warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut stdout = Vec::new();
        let read = async {
            while let Some(l) = lines.next_line().await.unwrap() {
                let done = l == "ready";
                stdout.push(l);
                if done {
                    return true;
                }
            }
            false
        };
        let ok = tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .unwrap_or(false);
        assert!(ok, "signet-server did not become ready; stdout: {stdout:?}");
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let field = |name: &str| -> String {
            stdout
                .iter()
                .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_owned()))
                .unwrap_or_else(|| panic!("no {name} in {stdout:?}"))
        };
        let grpc = field("gRPC (TLS):").parse().unwrap();
        let http = field("HTTP:").parse().unwrap();
        let probes = stdout
            .iter()
            .find_map(|l| l.trim().strip_prefix("probes:"))
            .map(|v| v.trim().parse().unwrap());
        let root_sha256 = field("root SHA-256:");
        let bundle_pem = std::fs::read(data_dir.join("bundle.pem")).unwrap();
        let trust_domain = stdout
            .iter()
            .find_map(|l| {
                l.split_once("CA for trust domain ")
                    .map(|x| x.1.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("no trust domain in {stdout:?}"));
        Self {
            child,
            _dir: dir,
            data_dir,
            grpc,
            http,
            probes,
            root_sha256,
            bundle_pem,
            trust_domain,
            stdout,
        }
    }

    pub fn admin_socket(&self) -> PathBuf {
        self.data_dir.join("admin.sock")
    }

    /// The server process's id (for /proc checks).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn bundle_path(&self) -> PathBuf {
        self.data_dir.join("bundle.pem")
    }

    /// How a client reaches and recognises this server (its SPIFFE ID included).
    pub fn target(&self) -> signet_client::ServerTarget {
        signet_client::ServerTarget::new(
            self.grpc.to_string(),
            self.bundle_pem.clone(),
            self.trust_domain.parse().unwrap(),
        )
        .with_server_name(Some("localhost".into()))
    }

    pub async fn channel(&self) -> Channel {
        signet_client::connect(&self.target(), None).await.unwrap()
    }

    pub async fn channel_with(&self, id: &signet_client::ClientIdentity) -> Channel {
        signet_client::connect(&self.target(), Some(id))
            .await
            .unwrap()
    }

    pub async fn istio(&self) -> IstioCertificateServiceClient<Channel> {
        IstioCertificateServiceClient::new(self.channel().await)
    }

    pub async fn native(&self) -> CertificateAuthorityClient<Channel> {
        CertificateAuthorityClient::new(self.channel().await)
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(
            signet_client::connect_admin(&self.admin_socket())
                .await
                .unwrap(),
        )
    }

    /// Runs `signetctl --socket <admin.sock> ARGS`.
    pub fn signetctl(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(bin("signetctl"))
            .arg("--socket")
            .arg(self.admin_socket())
            .args(args)
            .output()
            .unwrap()
    }

    pub async fn http_get(&self, path: &str) -> (u16, String) {
        http_get(self.http, path).await
    }

    pub async fn cert_count(&self) -> u64 {
        let head = self
            .admin()
            .await
            .get_ledger_head(signet_proto::admin::GetLedgerHeadRequest {})
            .await
            .unwrap()
            .into_inner();
        head.seq
    }

    /// Stops the server and starts it again from the same data directory and configuration,
    /// on the same gRPC address, so clients already pointed at it reconnect to it.
    pub async fn restart(self) -> Self {
        let grpc = self.grpc;
        let data_dir = self.stop().await;
        let cfg_path = data_dir.join("server.toml");
        let toml: String = std::fs::read_to_string(&cfg_path)
            .unwrap()
            .lines()
            .map(|l| {
                if l.starts_with("listen =") {
                    format!("listen = \"{grpc}\"\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(&cfg_path, toml).unwrap();
        Self::spawn(
            None,
            data_dir,
            &["--config", cfg_path.to_str().unwrap()],
            &[],
        )
        .await
    }

    /// SIGTERM, then wait for the exit.
    pub async fn stop(mut self) -> PathBuf {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        if let Some(d) = self._dir.take() {
            // Keep the directory for the caller (restart tests) by leaking the guard.
            let p = d.keep();
            return p.join("data");
        }
        self.data_dir.clone()
    }
}

/// A minimal HTTP/1.1 GET on loopback.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (code, _, body) = http_get_with(addr, path, &[]).await;
    (code, body)
}

/// [`http_get`] with extra request headers; also returns the response's headers (one
/// `name: value` line each, as sent).
pub async fn http_get_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .map(|(h, b)| (h.to_owned(), b.to_owned()))
        .unwrap_or_default();
    (code, head, body)
}

/// A fresh key and a CSR with the given URI/DNS SANs (none: the server fills in the identity).
pub fn csr_with(uris: &[&str], dns: &[&str]) -> (String, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    for u in uris {
        params
            .subject_alt_names
            .push(rcgen::SanType::URI((*u).try_into().unwrap()));
    }
    for d in dns {
        params
            .subject_alt_names
            .push(rcgen::SanType::DnsName((*d).try_into().unwrap()));
    }
    let csr = params.serialize_request(&key).unwrap();
    (csr.pem().unwrap(), key)
}

/// Runs `openssl verify -x509_strict` on a chain (PEM strings, leaf first, root last) with
/// `root_pem` as the only trust anchor. Returns openssl's output on failure.
pub fn openssl_verify(chain: &[String], root_pem: &[u8]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root.pem");
    let leaf = dir.path().join("leaf.pem");
    let untrusted = dir.path().join("untrusted.pem");
    std::fs::write(&root, root_pem).unwrap();
    std::fs::write(&leaf, &chain[0]).unwrap();
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["verify", "-x509_strict", "-purpose", "sslclient", "-CAfile"])
        .arg(&root);
    if chain.len() > 2 {
        std::fs::write(&untrusted, chain[1..chain.len() - 1].concat()).unwrap();
        cmd.arg("-untrusted").arg(&untrusted);
    }
    let out = cmd
        .arg(&leaf)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The URI SANs of a PEM certificate.
pub fn uri_sans(pem: &str) -> Vec<String> {
    signet_pki::ParsedCert::from_pem_first(pem.as_bytes())
        .unwrap()
        .uris()
        .to_vec()
}

/// The serial (lowercase hex) of a PEM certificate.
pub fn serial_of(pem: &str) -> String {
    signet_pki::ParsedCert::from_pem_first(pem.as_bytes())
        .unwrap()
        .serial_hex()
        .to_owned()
}

pub fn data_path(p: &Path, name: &str) -> PathBuf {
    p.join(name)
}
