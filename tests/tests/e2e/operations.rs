//! Safe configuration with the real binaries (issue 30, item 1): a misspelt `SIGNET_*`
//! variable and a missing database where one is expected stop start-up with what to do;
//! `--log-json` writes only JSON lines; SIGHUP reloads the log level, the service-account JWKS
//! and a plugged-in CA's files, logs one line per thing, keeps what is in force when a file is
//! broken, and never stops the server, the agent or the bridge.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{Issuer, KeyPair};
use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::plugged::ca_params;

/// Every line a child wrote on one stream, as it arrives.
#[derive(Clone, Default)]
struct Lines(
    Arc<(Mutex<Vec<String>>, tokio::sync::Notify)>,
    Arc<tokio::sync::Notify>,
);

impl Lines {
    fn follow(&self, stream: impl tokio::io::AsyncRead + Unpin + Send + 'static) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                me.0.0.lock().unwrap().push(l);
                me.0.1.notify_waiters();
            }
            me.1.notify_one();
        });
    }

    /// Resolves once the stream has ended (the process exited).
    async fn closed(&self) {
        tokio::time::timeout(Duration::from_secs(20), self.1.notified())
            .await
            .expect("the stream ends");
    }

    fn all(&self) -> Vec<String> {
        self.0.0.lock().unwrap().clone()
    }

    fn len(&self) -> usize {
        self.0.0.lock().unwrap().len()
    }

    /// The first line from index `from` on whose JSON message contains `needle`.
    async fn wait_for(&self, from: usize, needle: &str) -> serde_json::Value {
        let find = || {
            self.0.0.lock().unwrap()[from..].iter().find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                v["fields"]["message"]
                    .as_str()?
                    .contains(needle)
                    .then_some(v)
            })
        };
        let wait = async {
            loop {
                let notified = self.0.1.notified();
                if let Some(v) = find() {
                    return v;
                }
                notified.await;
            }
        };
        match tokio::time::timeout(Duration::from_secs(60), wait).await {
            Ok(v) => v,
            Err(_) => panic!("no log line with {needle:?}: {:#?}", self.all()),
        }
    }
}

/// Every line parses as a JSON object.
fn all_json(what: &str, lines: &[String]) {
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l)
            .unwrap_or_else(|e| panic!("{what}: not a JSON line ({e}): {l:?}"));
        assert!(v.is_object(), "{what}: {l}");
    }
}

fn hangup(child: &Child) {
    let pid = child.id().expect("running").to_string();
    let st = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(st.success());
}

fn still_running(child: &mut Child) {
    assert!(
        child.try_wait().unwrap().is_none(),
        "the process ended after SIGHUP"
    );
}

fn spawn_json(bin_name: &str, args: &[&str], envs: &[(&str, &str)]) -> (Child, Lines, Lines) {
    let mut cmd = Command::new(bin(bin_name));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let (out, err) = (Lines::default(), Lines::default());
    out.follow(child.stdout.take().unwrap());
    err.follow(child.stderr.take().unwrap());
    (child, out, err)
}

fn run(bin_name: &str, args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let out = std::process::Command::new(bin(bin_name))
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn mistakes_in_the_environment_stop_the_server_and_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let listen = ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"];
    let args: Vec<&str> = listen.iter().copied().chain(["--data-dir", data]).collect();

    let (code, out) = run(
        "signet-server",
        &args,
        &[("SIGNET_DATABASE_UR", "postgres://db/signet")],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(
            "environment variable SIGNET_DATABASE_UR is not a setting of signet-server: did \
             you mean SIGNET_DATABASE_URL?"
        ),
        "{out}"
    );
    // One underscore where a nested key takes two.
    let (code, out) = run("signet-server", &args, &[("SIGNET_CA_MAX_TTL", "2h")]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("did you mean SIGNET_CA__MAX_TTL?"), "{out}");

    // In Kubernetes, no database URL is no CA.
    let (code, out) = run(
        "signet-server",
        &args,
        &[("KUBERNETES_SERVICE_HOST", "10.96.0.1")],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("runs in Kubernetes (KUBERNETES_SERVICE_HOST is set)")
            && out.contains("Set SIGNET_DATABASE_URL to postgres://"),
        "{out}"
    );
    assert!(
        !Path::new(data).join("signet.db").exists(),
        "nothing created"
    );
    // require_database_url, as deploy/server.yaml sets it.
    let (code, out) = run(
        "signet-server",
        &args,
        &[("SIGNET_REQUIRE_DATABASE_URL", "true")],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("database_url is not set and require_database_url = true"),
        "{out}"
    );
    // A bad --log-level, refused as JSON in JSON mode.
    let json_args: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--log-json", "--log-level", "verbose"])
        .collect();
    let (code, out) = run("signet-server", &json_args, &[]);
    assert_eq!(code, 2, "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    all_json("signet-server --log-level verbose", &lines);
    assert!(out.contains("is not a level"), "{out}");

    // The agent: its own prefix.
    let (code, out) = run(
        "signet-agent",
        &[],
        &[("SIGNET_AGENT_SERVER_ADRESS", "127.0.0.1:8443")],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(
            "environment variable SIGNET_AGENT_SERVER_ADRESS is not a setting of signet-agent: \
             did you mean SIGNET_AGENT_SERVER_ADDRESS?"
        ),
        "{out}"
    );
}

/// An explicit SQLite file is a choice a Kubernetes replica may make (one replica); the
/// server's own test variables and Kubernetes' service links pass the check.
#[tokio::test]
async fn an_explicit_embedded_database_starts_in_kubernetes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ca.db");
    let server = Server::start(ServerOpts {
        database_url: Some(format!("sqlite://{}", db.display())),
        env: vec![
            ("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()),
            ("SIGNET_SERVER_SERVICE_HOST".into(), "10.96.0.7".into()),
            (
                "SIGNET_SERVER_PORT_8443_TCP_ADDR".into(),
                "10.96.0.7".into(),
            ),
            ("SIGNET_ADMIN_SOCKET".into(), "/tmp/none.sock".into()),
            ("SIGNET_TEST_DATABASE_URL".into(), "postgres://x/y".into()),
        ],
        ..ServerOpts::default()
    })
    .await;
    assert!(db.exists());
    server.stop().await;
}

/// A plugged-in CA: a root, and an intermediate of it whose files the server loads.
struct Cacerts {
    dir: PathBuf,
    root: rcgen::Certificate,
    root_key: KeyPair,
}

impl Cacerts {
    fn new(dir: &Path) -> Self {
        let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let root = ca_params("Ops Root").self_signed(&root_key).unwrap();
        Self {
            dir: dir.to_owned(),
            root,
            root_key,
        }
    }

    /// Writes a new intermediate's files; its PEM.
    fn write_intermediate(&self, cn: &str) -> String {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let issuer = Issuer::new(ca_params("Ops Root"), &self.root_key);
        let inter = ca_params(cn).signed_by(&key, &issuer).unwrap();
        let p = |n: &str| self.dir.join(n);
        std::fs::write(p("ca-cert.pem"), inter.pem()).unwrap();
        std::fs::write(p("ca-key.pem"), key.serialize_pem()).unwrap();
        std::fs::write(
            p("cert-chain.pem"),
            format!("{}{}", inter.pem(), self.root.pem()),
        )
        .unwrap();
        std::fs::write(p("root-cert.pem"), self.root.pem()).unwrap();
        inter.pem()
    }

    fn toml(&self) -> String {
        let p = |n: &str| self.dir.join(n).display().to_string();
        format!(
            "[ca]\ncert_file = \"{}\"\nkey_file = \"{}\"\nchain_file = \"{}\"\nroot_file = \"{}\"\n\
             rotation_interval = \"1h\"\n",
            p("ca-cert.pem"),
            p("ca-key.pem"),
            p("cert-chain.pem"),
            p("root-cert.pem")
        )
    }
}

/// Issues through the Istio API with `token`: the chain, or the refusal.
async fn issue(
    target: &signet_client::ServerTarget,
    token: &str,
) -> Result<Vec<String>, tonic::Status> {
    let channel = signet_client::connect(target, None).await.unwrap();
    let (csr, _k) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr,
            validity_duration: 600,
            metadata: None,
        },
        token,
    )
    .unwrap();
    signet_proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient::new(
        channel,
    )
    .create_certificate(req)
    .await
    .map(|r| r.into_inner().cert_chain)
}

#[tokio::test]
async fn the_server_logs_only_json_and_reloads_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let cacerts = Cacerts::new(dir.path());
    let first = cacerts.write_intermediate("Ops Intermediate 1");
    let (k1, k2) = (TokenIssuer::new("k1"), TokenIssuer::new("k2"));
    let jwks = |issuers: &[&TokenIssuer]| {
        let keys: Vec<serde_json::Value> = issuers
            .iter()
            .map(|t| {
                serde_json::from_str::<serde_json::Value>(&t.jwks_json()).unwrap()["keys"][0]
                    .clone()
            })
            .collect();
        serde_json::json!({ "keys": keys }).to_string()
    };
    let jwks_path = data.join("jwks.json");
    std::fs::write(&jwks_path, jwks(&[&k1, &k2])).unwrap();
    let cfg_path = data.join("server.toml");
    let config = |log_level: &str, extra: &str| {
        format!(
            "listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\
             log_level = \"{log_level}\"\n{extra}\n{}\n[auth.kubernetes]\nissuer = \"{ISSUER}\"\n\
             jwks_file = \"{}\"\njwks_refresh = \"1h\"\n",
            data.display(),
            cacerts.toml(),
            jwks_path.display()
        )
    };
    std::fs::write(&cfg_path, config("info", "")).unwrap();
    let (mut child, out, err) = spawn_json(
        "signet-server",
        &["--config", cfg_path.to_str().unwrap(), "--log-json"],
        &[],
    );
    let ready = err.wait_for(0, "ready").await;
    let fields = &ready["fields"];
    let target = signet_client::ServerTarget::new(
        fields["grpc"].as_str().unwrap().to_owned(),
        std::fs::read(data.join("bundle.pem")).unwrap(),
        "example.org".parse().unwrap(),
    )
    .with_server_name(Some("localhost".into()));
    let http: std::net::SocketAddr = fields["http"].as_str().unwrap().parse().unwrap();
    let chain = issue(&target, &k2.token("ops", "api")).await.unwrap();
    assert_eq!(chain[1].trim(), first.trim());

    // The JWKS loses k2: in force at the SIGHUP, not at the next jwks_refresh (an hour).
    std::fs::write(&jwks_path, jwks(&[&k1])).unwrap();
    let from = err.len();
    hangup(&child);
    let line = err
        .wait_for(from, "SIGHUP: auth.kubernetes.jwks_file reloaded")
        .await;
    assert!(
        line["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("keys k1"),
        "{line}"
    );
    err.wait_for(from, "SIGHUP: configuration unchanged").await;
    err.wait_for(from, "SIGHUP: log level unchanged: info")
        .await;
    err.wait_for(from, "SIGHUP: plugged-in CA files unchanged")
        .await;
    let refused = issue(&target, &k2.token("ops", "api")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    issue(&target, &k1.token("ops", "api")).await.unwrap();

    // A broken JWKS is refused and k1 keeps working.
    std::fs::write(&jwks_path, "{ not json").unwrap();
    let from = err.len();
    hangup(&child);
    err.wait_for(from, "SIGHUP: auth.kubernetes.jwks_file not reloaded")
        .await;
    err.wait_for(from, "SIGHUP: plugged-in CA files").await;
    issue(&target, &k1.token("ops", "api")).await.unwrap();

    // New plugged-in CA files: the next certificate chains through the new intermediate.
    let second = cacerts.write_intermediate("Ops Intermediate 2");
    let from = err.len();
    hangup(&child);
    err.wait_for(from, "SIGHUP: plugged-in CA files reloaded: signing key")
        .await;
    let chain = issue(&target, &k1.token("ops", "api")).await.unwrap();
    assert_eq!(chain[1].trim(), second.trim());
    // A key that is not the certificate's: refused, the loaded CA kept.
    let stray = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    std::fs::write(dir.path().join("ca-key.pem"), stray.serialize_pem()).unwrap();
    let from = err.len();
    hangup(&child);
    err.wait_for(
        from,
        "SIGHUP: plugged-in CA files not reloaded: the files changed but do not load",
    )
    .await;
    let chain = issue(&target, &k1.token("ops", "api")).await.unwrap();
    assert_eq!(chain[1].trim(), second.trim());

    // The log level, from the file; and a key read only at start is named.
    std::fs::write(
        &cfg_path,
        config("debug", "server_names = [\"ops.example\"]"),
    )
    .unwrap();
    let from = err.len();
    hangup(&child);
    err.wait_for(from, "SIGHUP: log level reloaded: debug")
        .await;
    err.wait_for(
        from,
        "SIGHUP: configuration: server_names changed; read only at start",
    )
    .await;
    // A configuration that no longer loads changes nothing.
    std::fs::write(&cfg_path, config("debug", "trust_domian = \"x\"")).unwrap();
    let from = err.len();
    hangup(&child);
    let line = err
        .wait_for(from, "SIGHUP: configuration not reloaded")
        .await;
    assert!(
        line["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("trust_domian"),
        "{line}"
    );
    err.wait_for(from, "SIGHUP: log level unchanged: debug")
        .await;

    still_running(&mut child);
    assert_eq!(http_get(http, "/healthz").await.0, 200);
    issue(&target, &k1.token("ops", "api")).await.unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    err.closed().await;
    out.closed().await;
    assert!(out.all().is_empty(), "stdout: {:?}", out.all());
    all_json("signet-server stderr", &err.all());
    assert!(err.all().iter().any(|l| l.contains("\"DEBUG\"")));
}

#[tokio::test]
async fn the_agent_logs_only_json_and_survives_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    // A server that is not there: the agent runs and retries.
    let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let root = ca_params("Agent Test Root").self_signed(&root_key).unwrap();
    std::fs::write(p("bundle.pem"), root.pem()).unwrap();
    let config = |level: &str| {
        format!(
            "server_address = \"127.0.0.1:9\"\ntrust_domain = \"example.org\"\n\
             trust_bundle_file = \"{}\"\njoin_token = \"not-a-token\"\ndata_dir = \"{}\"\n\
             workload_api_socket = \"{}\"\nhttp_listen = \"127.0.0.1:0\"\nlog_level = \"{level}\"\n",
            p("bundle.pem").display(),
            p("agent-data").display(),
            p("agent.sock").display()
        )
    };
    let cfg = p("agent.toml");
    std::fs::write(&cfg, config("info")).unwrap();
    let (mut child, out, err) = spawn_json(
        "signet-agent",
        &["--config", cfg.to_str().unwrap(), "--log-json"],
        &[],
    );
    let started = err.wait_for(0, "signet-agent started").await;
    let http: std::net::SocketAddr = started["fields"]["http"].as_str().unwrap().parse().unwrap();

    std::fs::write(&cfg, config("debug")).unwrap();
    let from = err.len();
    hangup(&child);
    err.wait_for(from, "SIGHUP: log level reloaded: debug")
        .await;
    err.wait_for(from, "SIGHUP: configuration unchanged").await;
    // A broken file: refused, the agent goes on.
    std::fs::write(&cfg, "renew_fraction = \"half\"\n").unwrap();
    let from = err.len();
    hangup(&child);
    err.wait_for(from, "SIGHUP: configuration not reloaded")
        .await;
    err.wait_for(from, "SIGHUP: log level unchanged: debug")
        .await;
    still_running(&mut child);
    assert_eq!(http_get(http, "/healthz").await.0, 200);

    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status();
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    err.closed().await;
    out.closed().await;
    assert!(out.all().is_empty(), "stdout: {:?}", out.all());
    all_json("signet-agent stderr", &err.all());
}

/// The bridge: `--log-level` and `--log-json`; an error that stops it is a JSON line too.
#[tokio::test]
async fn the_bridge_logs_only_json_even_when_it_fails() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let envs = [("KUBECONFIG", "/nonexistent/kubeconfig"), ("HOME", home)];
    let (code, out) = run(
        "signet-k8s",
        &["run", "--log-json", "--log-level", "debug"],
        &envs,
    );
    assert_ne!(code, 0, "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    assert!(!lines.is_empty());
    all_json("signet-k8s run", &lines);
    assert!(out.contains("no Kubernetes client configuration"), "{out}");
    let (code, out) = run(
        "signet-k8s",
        &["run", "--log-json", "--log-level", "loud"],
        &envs,
    );
    assert_eq!(code, 2, "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    all_json("signet-k8s --log-level loud", &lines);
    assert!(out.contains("--log-level"), "{out}");
}

/// A server whose database URL went missing (here: another, empty database) beside a data
/// directory that holds signed checkpoints of its ledger stops, rather than generating a second
/// root and overwriting `bundle.pem` with it (review of issue 30, F3).
#[tokio::test]
async fn a_lost_database_url_does_not_make_a_new_root_beside_the_old_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(ServerOpts {
        database_url: Some(format!(
            "sqlite://{}",
            dir.path().join("first.db").display()
        )),
        data_dir: Some(data.clone()),
        ..ServerOpts::default()
    })
    .await;
    let bundle = std::fs::read(data.join("bundle.pem")).unwrap();
    server.stop().await;
    assert!(
        std::fs::read_dir(data.join("checkpoints")).unwrap().count() > 0,
        "the first server signed a checkpoint"
    );
    let other = format!("sqlite://{}", dir.path().join("empty.db").display());
    let data_arg = data.display().to_string();
    let (code, out) = run(
        "signet-server",
        &[
            "--data-dir",
            &data_arg,
            "--database-url",
            &other,
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("holds no CA keys") && out.contains("SIGNET_DATABASE_URL"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(data.join("bundle.pem")).unwrap(),
        bundle,
        "bundle.pem kept"
    );
}
