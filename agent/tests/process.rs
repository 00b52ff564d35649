//! The `signet-agent` binary as a process: starts from a config file, serves the Workload API
//! (no identities yet: PermissionDenied) and HTTP health, stays up (not ready) without a node
//! identity, a join token or a reachable server, and stops cleanly on SIGTERM.

use std::time::Duration;

use signet_proto::workload as pb;
use signet_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

async fn http_get(port: u16, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

#[tokio::test]
async fn agent_process_serves_and_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("agent.sock");
    let port = free_port();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "server_address = \"127.0.0.1:1\"\nworkload_api_socket = \"{}\"\nhttp_listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n",
            socket.display(),
            dir.path().display()
        ),
    )
    .expect("config");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_signet-agent"))
        .arg("--config")
        .arg(&config)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn agent");

    let mut up = false;
    for _ in 0..200 {
        if socket.exists()
            && tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(up, "agent did not start");

    assert!(http_get(port, "/healthz").await.starts_with("HTTP/1.1 200"));
    // No node identity, no join token, no server: alive, retrying, not ready.
    assert!(http_get(port, "/readyz").await.starts_with("HTTP/1.1 503"));
    assert!(
        http_get(port, "/metrics")
            .await
            .contains("signet_agent_certificates 0")
    );

    let channel = signet_client::connect_admin(&socket)
        .await
        .expect("connect");
    let mut client = SpiffeWorkloadApiClient::new(channel);
    let mut req = tonic::Request::new(pb::X509svidRequest {});
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().expect("value"));
    let err = client
        .fetch_x509svid(req)
        .await
        .expect_err("no identity yet");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    drop(client);

    let pid = child.id().expect("pid").to_string();
    let status = std::process::Command::new("kill")
        .args(["-s", "TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("agent exits")
        .expect("wait");
    assert!(exit.success(), "{exit:?}");
    assert!(!socket.exists(), "socket removed on exit");
}

#[tokio::test]
async fn bad_config_exits_with_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, "renew_fractoin = 0.5\n").expect("config");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_signet-agent"))
        .arg("--config")
        .arg(&config)
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("renew_fractoin"));
}
