//! The real `signet-agent` binary against a fake CA that really signs (tests/src/fake_ca.rs)
//! and pushes bundles on `WatchBundle`: a taint of the key that issued the workload's
//! certificate, then a CRL naming the serial it holds. Each time the workload's certificate
//! (as its files sink and the Workload API serve it) is replaced within seconds, not at half
//! its hour-long life; the CRL is served in `crl.pem` and in both Workload API streams, and
//! a restarted agent serves it from `data_dir` before the server answers. `openssl verify
//! -crl_check` reading the written `crl.pem` refuses the revoked certificate and accepts its
//! replacement.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use signet_tests::bin;
use signet_tests::fake_ca::FakeCa;

use crate::agent::{eventually, my_uid};

struct Agent {
    child: tokio::process::Child,
}

impl Agent {
    fn start(config: &Path) -> Self {
        let child = tokio::process::Command::new(bin("signet-agent"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info,h2=warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child }
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// The serial of the leaf in `sink/svid.pem`, once there is one.
fn sink_serial(sink: &Path) -> Option<u64> {
    let pem = std::fs::read(sink.join("svid.pem")).ok()?;
    let blocks = pem::parse_many(pem).ok()?;
    let c = signet_pki::ParsedCert::from_der(blocks.first()?.contents()).ok()?;
    let raw = c.serial();
    (raw.len() <= 8).then(|| raw.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)))
}

/// The serial of the leaf the Workload API serves, and its `crl` field.
async fn workload_api(socket: &Path) -> Option<(u64, Vec<Vec<u8>>)> {
    use signet_proto::workload as pb;
    let channel = signet_client::connect_admin(socket).await.ok()?;
    let mut client =
        signet_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient::new(channel);
    let mut req = tonic::Request::new(pb::X509svidRequest {});
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    let mut stream = client.fetch_x509svid(req).await.ok()?.into_inner();
    let resp = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .ok()?
        .ok()??;
    let svid = resp.svids.first()?;
    let c = signet_pki::ParsedCert::from_der(&svid.x509_svid).ok()?;
    let raw = c.serial();
    let serial = raw.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b));
    Some((serial, resp.crl))
}

fn config(dir: &Path, port: u16, bundle: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let sink = dir.join("sink");
    std::fs::create_dir_all(&sink).unwrap();
    let socket = dir.join("agent.sock");
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            r#"server_address = "https://localhost:{port}"
trust_bundle_file = "{bundle}"
join_token = "tok"
data_dir = "{data}"
workload_api_socket = "{socket}"
http_listen = "127.0.0.1:0"
sync_interval = "300ms"

[[sinks]]
name = "app"
kind = "files"
spiffe_id = "{app}"
directory = "{sink}"
layout = "spiffe-helper"
"#,
            bundle = bundle.display(),
            data = dir.join("data").display(),
            socket = socket.display(),
            sink = sink.display(),
            app = signet_tests::fake_ca::APP_ID,
        ),
    )
    .unwrap();
    (path, sink, socket)
}

/// Waits for the sink's certificate to differ from `held`; returns the new serial and how
/// long it took.
async fn replaced(sink: &Path, held: u64, what: &str) -> (u64, Duration) {
    let t = Instant::now();
    let serial = eventually(20, what, || async {
        sink_serial(sink).filter(|s| *s != held)
    })
    .await;
    (serial, t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_replaces_a_tainted_then_a_revoked_workload_certificate_within_seconds() {
    let ca = FakeCa::start(my_uid()).await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle.pem");
    std::fs::write(&bundle, ca.root_pem()).unwrap();
    let (cfg, sink, socket) = config(dir.path(), ca.addr.port(), &bundle);
    let agent = Agent::start(&cfg);

    let first = eventually(30, "the first workload certificate", || async {
        sink_serial(&sink)
    })
    .await;
    // The Workload API serves the same one, without CRLs yet.
    let (api_serial, api_crls) = eventually(10, "the Workload API", || workload_api(&socket)).await;
    assert_eq!(api_serial, first);
    assert!(api_crls.is_empty());
    assert!(!sink.join("crl.pem").exists());

    // The operator taints the root's key; the fake keeps signing with it (the agent backs off
    // between replacements, it does not loop).
    ca.push(vec![ca.key_id.clone()], vec![]);
    let (after_taint, took_taint) = replaced(&sink, first, "replacement after the taint").await;
    eprintln!("tainted: workload certificate replaced in {took_taint:?}");
    assert!(took_taint < Duration::from_secs(5), "{took_taint:?}");
    let node_renewals = || {
        ca.signed()
            .iter()
            .filter(|s| s.spiffe_id == signet_tests::fake_ca::NODE_ID)
            .count()
    };
    eventually(10, "the node certificate replaced too", || async {
        (node_renewals() >= 2).then_some(())
    })
    .await;
    let signed_before = ca.signed().len();
    // A real wait: a rate over a window of the real agent's time (its backoff runs on its own
    // clock); no event marks "not a loop".
    tokio::time::sleep(Duration::from_secs(2)).await;
    let burst = ca.signed().len() - signed_before;
    assert!(
        burst <= 12,
        "{burst} certificates signed in 2 s while the key stays tainted: a loop"
    );

    // The taint is lifted: the agent settles on the last certificate, nothing more is signed.
    ca.push(vec![], vec![]);
    // A real wait: a replacement already under way when the taint was lifted may still land;
    // nothing the agent exposes says it has taken the new bundle in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = ca.signed().len();
    let last_app = || {
        ca.signed()
            .iter()
            .rev()
            .find(|s| s.spiffe_id == signet_tests::fake_ca::APP_ID)
            .map(|s| s.serial)
    };
    let held = eventually(10, "the sink to hold the last certificate", || async {
        sink_serial(&sink).filter(|s| Some(*s) == last_app())
    })
    .await;
    assert_ne!(held, first);
    let _ = after_taint;
    // A real wait: that nothing more is signed can only be watched for, over a window.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ca.signed().len(), settled, "nothing signed once untainted");

    // A CRL lists the serial the workload holds now.
    let crl = ca.crl(1, &[held]);
    ca.push(vec![], vec![crl.clone()]);
    let (after_crl, took_crl) = replaced(&sink, held, "replacement after the CRL").await;
    eprintln!("revoked: workload certificate replaced in {took_crl:?}");
    assert!(took_crl < Duration::from_secs(5), "{took_crl:?}");
    // crl.pem and the Workload API carry the CRL.
    let crl_pem = eventually(10, "crl.pem", || async {
        std::fs::read(sink.join("crl.pem")).ok()
    })
    .await;
    let blocks = pem::parse_many(crl_pem).unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].tag(), "X509 CRL");
    assert_eq!(blocks[0].contents(), crl.der.as_slice());
    // openssl, reading crl.pem as written: the revoked certificate fails, its replacement holds.
    let pem_of = |serial: u64| {
        let der = ca
            .signed()
            .into_iter()
            .find(|s| s.serial == serial)
            .unwrap()
            .der;
        pem::encode(&pem::Pem::new("CERTIFICATE", der))
    };
    let (root_file, old_file, new_file) = (
        dir.path().join("root.pem"),
        dir.path().join("old.pem"),
        dir.path().join("new.pem"),
    );
    std::fs::write(&root_file, ca.root_pem()).unwrap();
    std::fs::write(&old_file, pem_of(held)).unwrap();
    std::fs::write(&new_file, pem_of(after_crl)).unwrap();
    let verify = |leaf: &Path| {
        std::process::Command::new("openssl")
            .args(["verify", "-crl_check", "-CAfile"])
            .arg(&root_file)
            .arg("-CRLfile")
            .arg(sink.join("crl.pem"))
            .arg(leaf)
            .output()
            .unwrap()
    };
    let old = verify(&old_file);
    assert!(!old.status.success());
    assert!(
        String::from_utf8_lossy(&old.stdout).contains("certificate revoked")
            || String::from_utf8_lossy(&old.stderr).contains("certificate revoked"),
        "{old:?}"
    );
    let new = verify(&new_file);
    assert!(new.status.success(), "{new:?}");
    let (api_serial, api_crls) = eventually(10, "the CRL on the Workload API", || async {
        workload_api(&socket)
            .await
            .filter(|(s, c)| *s == after_crl && !c.is_empty())
    })
    .await;
    assert_eq!(api_serial, after_crl);
    assert_eq!(api_crls, std::slice::from_ref(&crl.der));
    agent.stop().await;

    // Restarted while the server is away, the agent still serves the CRL it kept.
    drop(ca);
    let agent = Agent::start(&cfg);
    let (_, api_crls) = eventually(20, "the kept CRL after a restart", || async {
        workload_api(&socket).await.filter(|(_, c)| !c.is_empty())
    })
    .await;
    assert_eq!(api_crls, [crl.der]);
    agent.stop().await;
}
