//! The real `signet-agent` against the real `signet-server` (PostgreSQL): attestation with a
//! join token, entries created with signetctl reaching the Workload API and a files sink,
//! the node identity reused across a restart, short-lived certificates rotating, and the
//! workload keeping its certificate while the server is down.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use signet_proto::admin::GetCertificateRequest;
use signet_tests::*;
use tokio::process::{Child, Command};

use crate::pg_server;

pub(crate) struct Agent {
    pub(crate) child: Child,
}

impl Agent {
    pub(crate) fn start(config: &Path) -> Self {
        let child = Command::new(bin("signet-agent"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info,h2=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child }
    }

    /// SIGTERM, then waits for a clean exit.
    pub(crate) async fn stop(mut self) {
        let pid = self.child.id().unwrap();
        let st = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("the agent stops on SIGTERM")
            .unwrap();
        assert!(status.success(), "agent exit: {status:?}");
    }
}

pub(crate) struct Layout {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) config: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) sink_dir: PathBuf,
    pub(crate) data_dir: PathBuf,
}

pub(crate) fn my_uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}

pub(crate) fn write_config(server: &Server, token: &str, spiffe_id: &str) -> Layout {
    write_config_at(server.grpc.port(), server, token, spiffe_id)
}

pub(crate) fn write_config_at(port: u16, server: &Server, token: &str, spiffe_id: &str) -> Layout {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let sink_dir = dir.path().join("sink");
    let data_dir = dir.path().join("data");
    let config = dir.path().join("agent.toml");
    std::fs::create_dir(&sink_dir).unwrap();
    let toml = format!(
        r#"server_address = "https://127.0.0.1:{port}"
trust_bundle_file = "{bundle}"
join_token = "{token}"
data_dir = "{data}"
workload_api_socket = "{socket}"
http_listen = "127.0.0.1:0"
sync_interval = "300ms"

[[sinks]]
name = "app"
kind = "files"
spiffe_id = "{spiffe_id}"
directory = "{sink}"
layout = "spiffe-helper"
"#,
        port = port,
        bundle = server.bundle_path().display(),
        data = data_dir.display(),
        socket = socket.display(),
        sink = sink_dir.display(),
    );
    std::fs::write(&config, toml).unwrap();
    Layout {
        _dir: dir,
        config,
        socket,
        sink_dir,
        data_dir,
    }
}

/// Polls `f` every 100 ms until it returns Some, or panics after `secs`.
pub(crate) async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The SVID from the Workload API, as PEM (leaf first), once one is served.
pub(crate) async fn fetch_svid(socket: &Path) -> Option<(String, Vec<String>)> {
    let client = spiffe::WorkloadApiClient::connect_to(format!("unix:{}", socket.display()))
        .await
        .ok()?;
    let svid = client.fetch_x509_svid().await.ok()?;
    let chain = svid
        .cert_chain()
        .iter()
        .map(|c| signet_types::pem::cert_to_pem(c.as_ref()))
        .collect();
    Some((svid.spiffe_id().to_string(), chain))
}

fn sink_leaf(dir: &Path) -> Option<String> {
    let pem = std::fs::read_to_string(dir.join("svid.pem")).ok()?;
    let first_end = pem.find("-----END CERTIFICATE-----")?;
    Some(pem[..first_end + "-----END CERTIFICATE-----\n".len()].to_owned())
}

/// Every certificate in the sink's `svid.pem`, one PEM each.
fn sink_chain(dir: &Path) -> Vec<String> {
    let pem = std::fs::read_to_string(dir.join("svid.pem")).unwrap_or_default();
    const END: &str = "-----END CERTIFICATE-----";
    pem.split_inclusive(END)
        .filter(|p| p.contains("-----BEGIN CERTIFICATE-----"))
        .map(|p| format!("{}\n", p.trim_start()))
        .collect()
}

pub(crate) fn create_token(server: &Server, node_id: &str) -> String {
    let out = server.signetctl(&["token", "create", "--node-id", node_id]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub(crate) fn create_entry(
    server: &Server,
    spiffe_id: &str,
    parent: &str,
    extra: &[&str],
) -> String {
    let uid = format!("unix:uid:{}", my_uid());
    let mut args = vec![
        "entry",
        "create",
        "--spiffe-id",
        spiffe_id,
        "--parent",
        parent,
        "--selector",
        &uid,
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = server.signetctl(&args);
    assert!(out.status.success(), "{out:?}");
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    e["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn agent_attests_serves_the_workload_api_and_survives_restart() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/app";
    let token = create_token(&server, "vm1");
    let entry_id = create_entry(&server, app, "vm1", &[]);
    let l = write_config(&server, &token, app);
    let agent = Agent::start(&l.config);

    // The Workload API serves the entry's SVID, which chains to the server's root.
    let (id, chain) = eventually(30, "an SVID from the Workload API", || {
        fetch_svid(&l.socket)
    })
    .await;
    assert_eq!(id, app);
    assert_eq!(uri_sans(&chain[0]), [app]);
    let mut full = chain.clone();
    full.push(String::from_utf8(server.bundle_pem.clone()).unwrap());
    openssl_verify(&full, &server.bundle_pem).unwrap();

    // The files sink has it too, in the spiffe-helper layout.
    let leaf = eventually(10, "the files sink", || async { sink_leaf(&l.sink_dir) }).await;
    assert_eq!(leaf, chain[0]);
    assert!(l.sink_dir.join("svid_key.pem").exists());
    let bundle = std::fs::read_to_string(l.sink_dir.join("svid_bundle.pem")).unwrap();
    assert!(bundle.contains("BEGIN CERTIFICATE"));

    // The node identity is on disk, its key private.
    let key_mode = std::fs::metadata(l.data_dir.join("node.key"))
        .unwrap()
        .mode();
    assert_eq!(key_mode & 0o777, 0o600);
    let node_pem = std::fs::read_to_string(l.data_dir.join("node.pem")).unwrap();
    let node_id = uri_sans(&node_pem)[0].clone();
    assert!(node_id.ends_with("/signet/node/vm1"), "{node_id}");

    // The ledger records the workload certificate as issued to the node.
    let row = server
        .admin()
        .await
        .get_certificate(GetCertificateRequest {
            serial: serial_of(&chain[0]),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(row.spiffe_id, app);
    assert_eq!(row.caller, format!("node:{node_id}"));

    // Restart: the single-use token is spent, so serving again proves the identity was reused.
    agent.stop().await;
    assert!(!l.socket.exists(), "socket removed on shutdown");
    let agent = Agent::start(&l.config);
    let (id, _) = eventually(30, "an SVID after the restart", || fetch_svid(&l.socket)).await;
    assert_eq!(id, app);
    let node_pem_after = std::fs::read_to_string(l.data_dir.join("node.pem")).unwrap();
    assert_eq!(uri_sans(&node_pem_after)[0], node_id);

    // Deleting the entry stops serving it and removes the sink's files.
    let out = server.signetctl(&["entry", "delete", &entry_id]);
    assert!(out.status.success(), "{out:?}");
    eventually(15, "the sink files removed", || async {
        (!l.sink_dir.join("svid.pem").exists()).then_some(())
    })
    .await;
    agent.stop().await;
}

#[tokio::test]
async fn short_lived_certificates_rotate_and_outlive_the_server() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/short";
    let token = create_token(&server, "vm2");
    create_entry(&server, app, "vm2", &["--ttl", "6s"]);
    let l = write_config(&server, &token, app);
    let agent = Agent::start(&l.config);

    let first = eventually(30, "the first certificate in the sink", || async {
        sink_leaf(&l.sink_dir)
    })
    .await;
    let first_serial = serial_of(&first);
    // Renewed at about half of the six seconds: a new serial well within 15 s.
    let _rotated = eventually(15, "a rotated certificate in the sink", || async {
        sink_leaf(&l.sink_dir).filter(|p| serial_of(p) != first_serial)
    })
    .await;
    // The sink holds the leaf and the intermediate (the roots are the bundle).
    let mut chain = sink_chain(&l.sink_dir);
    assert_eq!(chain.len(), 2, "leaf and intermediate: {chain:?}");
    assert_ne!(serial_of(&chain[0]), first_serial);
    chain.push(String::from_utf8(server.bundle_pem.clone()).unwrap());
    openssl_verify(&chain, &server.bundle_pem).unwrap();

    // With the server gone, the workload still gets its (last good) certificate.
    server.stop().await;
    let (id, chain) =
        eventually(10, "an SVID with the server down", || fetch_svid(&l.socket)).await;
    assert_eq!(id, app);
    assert!(!chain.is_empty());
    agent.stop().await;
}

/// A TCP gate in front of the server: closed, it drops each connection at once and counts it
/// (an unreachable server, whose attempts can be seen); open, it forwards them.
#[derive(Clone, Default)]
struct Gate {
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Connections dropped while closed.
    fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn serve(self, listener: tokio::net::TcpListener, to: std::net::SocketAddr) {
        while let Ok((mut inbound, _)) = listener.accept().await {
            if !self.open.load(std::sync::atomic::Ordering::SeqCst) {
                drop(inbound);
                self.refused
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    }
}

#[tokio::test]
async fn agent_started_before_the_server_is_reachable_retries_then_serves() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/late";
    let token = create_token(&server, "vm3");
    create_entry(&server, app, "vm3", &[]);
    // The agent's address: a gate that closes every connection at once (the server is not
    // reachable) and counts them, until it is opened.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let gate = Gate::default();
    let forward = tokio::spawn(gate.clone().serve(listener, server.grpc));
    let l = write_config_at(port, &server, &token, app);
    let mut agent = Agent::start(&l.config);
    // Two attempts refused: the agent tried, failed, and tried again (after its backoff).
    eventually(20, "a second connection attempt", || async {
        (gate.refused() >= 2).then_some(())
    })
    .await;
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent keeps retrying instead of exiting"
    );
    assert!(fetch_svid(&l.socket).await.is_none());

    // The server becomes reachable at that address.
    gate.open();
    let (id, chain) = eventually(40, "an SVID once the server is reachable", || {
        fetch_svid(&l.socket)
    })
    .await;
    assert_eq!(id, app);
    let mut full = chain.clone();
    full.push(String::from_utf8(server.bundle_pem.clone()).unwrap());
    openssl_verify(&full, &server.bundle_pem).unwrap();
    agent.stop().await;
    forward.abort();
}

#[tokio::test]
async fn node_certificate_is_renewed_persisted_and_still_signs() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "[ca]\ndefault_ttl = \"6s\"\n").await else {
        return;
    };
    let app = "spiffe://example.org/renewing";
    let token = create_token(&server, "vm4");
    create_entry(&server, app, "vm4", &[]);
    let l = write_config(&server, &token, app);
    let agent = Agent::start(&l.config);
    eventually(30, "the first SVID", || fetch_svid(&l.socket)).await;
    // The first node certificate was issued before this, for six seconds.
    let first_expired = Instant::now() + Duration::from_secs(7);
    let node_serial = || {
        std::fs::read_to_string(l.data_dir.join("node.pem"))
            .ok()
            .map(|p| serial_of(&p))
    };
    let first = node_serial().unwrap();
    let second = eventually(20, "a renewed node certificate", || async {
        node_serial().filter(|s| *s != first)
    })
    .await;
    eventually(20, "a second node renewal", || async {
        node_serial().filter(|s| *s != first && *s != second)
    })
    .await;
    // The renewed node identity still gets workload certificates signed: a new entry is
    // served after the first node certificate has expired. A real wait: the expiry is on the
    // wall clock of the agent and the server, real processes; no event marks it.
    tokio::time::sleep(first_expired.saturating_duration_since(Instant::now())).await;
    let late = "spiffe://example.org/renewing-late";
    create_entry(&server, late, "vm4", &[]);
    // Both entries match this process; the ledger shows the new one signed for the node.
    let row = eventually(20, "a certificate for the new entry", || async {
        let rows = server
            .admin()
            .await
            .list_certificates(signet_proto::admin::ListCertificatesRequest {
                spiffe_id: late.into(),
                ..Default::default()
            })
            .await
            .ok()?
            .into_inner();
        rows.certificates.into_iter().next()
    })
    .await;
    assert!(row.caller.ends_with("/signet/node/vm4"), "{row:?}");
    agent.stop().await;
}

/// The roots of `example.org` the Workload API serves (FetchX509Bundles), sorted.
async fn served_roots(socket: &Path) -> Option<Vec<Vec<u8>>> {
    let client = spiffe::WorkloadApiClient::connect_to(format!("unix:{}", socket.display()))
        .await
        .ok()?;
    let bundles = client.fetch_x509_bundles().await.ok()?;
    let td = spiffe::TrustDomain::new("example.org").ok()?;
    let mut roots: Vec<Vec<u8>> = bundles
        .get(&td)?
        .authorities()
        .iter()
        .map(|a| a.as_ref().to_vec())
        .collect();
    roots.sort();
    Some(roots)
}

fn sorted_certs(pem: &[u8]) -> Vec<Vec<u8>> {
    let mut v = signet_types::pem::parse_certs(pem).unwrap();
    v.sort();
    v
}

#[tokio::test]
async fn a_stale_persisted_bundle_is_replaced_from_the_servers_bundle_stream() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/bundled";
    let token = create_token(&server, "vm5");
    create_entry(&server, app, "vm5", &[]);
    let l = write_config(&server, &token, app);
    let agent = Agent::start(&l.config);
    eventually(30, "the first SVID", || fetch_svid(&l.socket)).await;
    agent.stop().await;

    // While the agent is down, its persisted bundle goes stale: it holds a root the server no
    // longer publishes. Neither the bootstrap file nor the persisted bundle can correct that;
    // only the server's WatchBundle stream can.
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let retired = p.self_signed(&key).unwrap().pem();
    let mut stale = server.bundle_pem.clone();
    stale.extend_from_slice(retired.as_bytes());
    std::fs::write(l.data_dir.join("bundle.pem"), &stale).unwrap();

    let want = sorted_certs(&server.bundle_pem);
    let agent = Agent::start(&l.config);
    eventually(30, "the server's roots on the Workload API", || async {
        served_roots(&l.socket).await.filter(|r| *r == want)
    })
    .await;
    eventually(
        10,
        "the server's roots in the sink and data_dir",
        || async {
            let sink = std::fs::read(l.sink_dir.join("svid_bundle.pem")).ok()?;
            let kept = std::fs::read(l.data_dir.join("bundle.pem")).ok()?;
            (sorted_certs(&sink) == want && sorted_certs(&kept) == want).then_some(())
        },
    )
    .await;
    agent.stop().await;
}

/// More entries than one `SignWorkloads` call carries (the server takes 256): the agent
/// splits them into several calls and every one is signed and delivered. Found by the
/// 1,000-entry footprint benchmark (tests/src/bin/bench-agent.rs), where the agent sent them
/// all in one refused call.
#[tokio::test]
async fn agent_signs_more_entries_than_one_call_carries() {
    use signet_proto::admin::CreateEntryRequest;
    use signet_proto::admin::node_admin_client::NodeAdminClient;

    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let token = create_token(&server, "big");
    let n = 300;
    let id = |i: usize| format!("spiffe://example.org/many/app-{i}");
    let mut admin = NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    );
    for i in 0..n {
        admin
            .create_entry(CreateEntryRequest {
                spiffe_id: id(i),
                parent: "big".into(),
                selectors: vec![format!("unix:uid:{}", 60000 + i)],
                ttl_seconds: 3600,
                dns_names: vec![],
                jwt_ttl_seconds: 0,
                federates_with: vec![],
            })
            .await
            .unwrap();
    }
    // The files sink follows the last entry created; the agent signs all due entries in one
    // pass, so the last one on disk means the pass went through every call.
    let l = write_config(&server, &token, &id(n - 1));
    let agent = Agent::start(&l.config);
    let leaf = eventually(60, "the last entry's certificate on disk", || async {
        sink_leaf(&l.sink_dir)
    })
    .await;
    assert_eq!(uri_sans(&leaf), [id(n - 1)]);
    // Every entry was issued: at least one certificate per entry, plus the server's own and
    // the node's.
    eventually(30, "all entries issued", || async {
        (server.cert_count().await >= n as u64 + 2).then_some(())
    })
    .await;
    agent.stop().await;
}
