//! The agent across a server outage (issue 30, item 4), with the real binaries: the server
//! stopped, the agent restarted meanwhile serves the same unexpired SVID from its sealed cache
//! (`data_dir/cache.sealed`) at once, to the Rust client and to py-spiffe, and `/readyz` says
//! the server is unreachable and the entries came from the cache; a tampered cache is refused,
//! logged, and nothing in it served; the server back (same database, same CA), the agent
//! renews. And a banned node: `/readyz` not ready naming `signetctl node unban`, one error
//! in the log, the `signet_agent_node_banned` gauge at 1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use signet_tests::*;

use crate::agent::{create_entry, create_token, eventually, fetch_svid};
use crate::sink_harness::RunningAgent;

/// A TCP relay at a fixed address to wherever the server listens now (it listens on a new
/// port each time it starts); `None`: every connection is dropped, as a server that is down.
#[derive(Clone, Default)]
struct Relay(Arc<Mutex<Option<SocketAddr>>>);

impl Relay {
    fn point_to(&self, to: Option<SocketAddr>) {
        *self.0.lock().unwrap() = to;
    }

    async fn serve(self, listener: tokio::net::TcpListener) {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let Some(to) = *self.0.lock().unwrap() else {
                drop(inbound);
                continue;
            };
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    }
}

struct Files {
    _dir: tempfile::TempDir,
    config: std::path::PathBuf,
    socket: std::path::PathBuf,
    data_dir: std::path::PathBuf,
}

fn agent_files(port: u16, server: &Server, token: &str) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let data_dir = dir.path().join("data");
    let config = dir.path().join("agent.toml");
    let toml = format!(
        r#"server_address = "https://127.0.0.1:{port}"
trust_bundle_file = "{bundle}"
join_token = "{token}"
data_dir = "{data}"
workload_api_socket = "{socket}"
http_listen = "127.0.0.1:0"
sync_interval = "300ms"
"#,
        bundle = server.bundle_path().display(),
        data = data_dir.display(),
        socket = socket.display(),
    );
    std::fs::write(&config, toml).unwrap();
    Files {
        _dir: dir,
        config,
        socket,
        data_dir,
    }
}

/// The serial of the leaf the Workload API serves now, if one is served.
async fn served_serial(socket: &Path) -> Option<String> {
    fetch_svid(socket)
        .await
        .map(|(_, chain)| serial_of(&chain[0]))
}

#[tokio::test]
async fn a_restart_while_the_server_is_down_serves_the_cached_svid_then_renews() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let tokens = TokenIssuer::new("k1");
    let opts = |data_dir| ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        data_dir,
        ..ServerOpts::default()
    };
    let server = Server::start(opts(None)).await;
    let app = "spiffe://example.org/outage";
    let token = create_token(&server, "vm-outage");
    // Renewed at about half of the 90 s: well after the outage below has begun.
    create_entry(&server, app, "vm-outage", &["--ttl", "90s"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let relay = Relay::default();
    relay.point_to(Some(server.grpc));
    let forward = tokio::spawn(relay.clone().serve(listener));
    let f = agent_files(port, &server, &token);

    let agent = RunningAgent::start(&f.config).await;
    let serial = eventually(30, "an SVID from the Workload API", || {
        served_serial(&f.socket)
    })
    .await;
    // The cache is written, private, in a private directory.
    let cache = f.data_dir.join("cache.sealed");
    eventually(10, "the cache written", || async {
        cache.exists().then_some(())
    })
    .await;
    let mode = |p: &Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
            & 0o777
    };
    assert_eq!(mode(&cache), 0o600);
    assert_eq!(mode(&f.data_dir), 0o700);

    // The server stops; the agent restarts while it is down.
    let server_dir = server.stop().await;
    relay.point_to(None);
    agent.stop().await;
    let agent = RunningAgent::start(&f.config).await;
    let again = eventually(10, "the cached SVID after the restart", || {
        served_serial(&f.socket)
    })
    .await;
    assert_eq!(again, serial, "the same certificate, from the cache");
    assert!(agent.logged("serving the cached certificates until the server answers"));
    if let Some(python) = crate::workload_clients::python() {
        let out = crate::workload_clients::py_fetch(&python, &f.socket, Some("localhost"))
            .expect("py-spiffe fetches the cached SVID");
        let chain = out["svids"][0]["chain_pem"][0].as_str().unwrap().to_owned();
        assert_eq!(serial_of(&chain), serial, "{out}");
        assert_eq!(out["svids"][0]["key_matches_leaf"], true);
    }
    let (code, body) = eventually(10, "/readyz saying the server is unreachable", || async {
        let (code, body) = agent.readyz().await;
        body.contains("server: unreachable since ")
            .then_some((code, body))
    })
    .await;
    assert_eq!(code, 200, "ready: it serves valid certificates\n{body}");
    assert!(
        body.contains("restored from the cache written at"),
        "{body}"
    );
    assert!(body.contains("certificates: 1 served"), "{body}");
    agent.stop().await;

    // A tampered cache is refused, logged, and nothing in it is served.
    let good = std::fs::read(&cache).unwrap();
    let mut bad = good.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x01;
    std::fs::write(&cache, &bad).unwrap();
    let agent = RunningAgent::start(&f.config).await;
    eventually(10, "the refusal in the log", || async {
        agent.logged("fails authentication").then_some(())
    })
    .await;
    assert!(agent.logged("not using the agent's cache"));
    let (code, body) = agent.readyz().await;
    assert_eq!(code, 503, "{body}");
    assert!(served_serial(&f.socket).await.is_none(), "nothing served");
    agent.stop().await;

    // The untouched cache serves again; then the server comes back and the agent renews.
    std::fs::write(&cache, &good).unwrap();
    let agent = RunningAgent::start(&f.config).await;
    let again = eventually(10, "the cached SVID", || served_serial(&f.socket)).await;
    assert_eq!(again, serial);
    let server = Server::start(opts(Some(server_dir))).await;
    relay.point_to(Some(server.grpc));
    let renewed = eventually(90, "a renewed SVID once the server is back", || async {
        served_serial(&f.socket).await.filter(|s| *s != serial)
    })
    .await;
    assert_ne!(renewed, serial);
    let (code, body) = eventually(20, "/readyz connected", || async {
        let (code, body) = agent.readyz().await;
        body.contains("server: connected").then_some((code, body))
    })
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("entries: 1, synced"), "{body}");
    agent.stop().await;
    forward.abort();
}

#[tokio::test]
async fn a_banned_node_is_not_ready_and_says_how_to_unban_it() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = crate::pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/banned-app";
    let token = create_token(&server, "vm-banned");
    create_entry(&server, app, "vm-banned", &[]);
    let f = agent_files(server.grpc.port(), &server, &token);
    let agent = RunningAgent::start(&f.config).await;
    eventually(30, "an SVID", || served_serial(&f.socket)).await;
    let (code, _) = eventually(10, "ready", || async {
        let (code, body) = agent.readyz().await;
        (code == 200).then_some((code, body))
    })
    .await;
    assert_eq!(code, 200);

    let out = server.signetctl(&["node", "ban", "vm-banned"]);
    assert!(out.status.success(), "{out:?}");
    let body = eventually(20, "/readyz naming the ban", || async {
        let (code, body) = agent.readyz().await;
        (code == 503).then_some(body)
    })
    .await;
    assert!(
        body.starts_with(
            "not ready: node vm-banned is banned by the server; ask an operator to run \
             `signetctl node unban vm-banned`\n"
        ),
        "{body}"
    );
    assert!(body.contains(", banned by the server since "), "{body}");
    assert_eq!(
        agent.metric("signet_agent_node_banned", &[]).await,
        Some(1.0)
    );
    // Logged once, however many calls were refused (the sync poll runs every 300 ms).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(
        agent.count_logged("is banned by the server; ask an operator to run"),
        1
    );
    agent.stop().await;
}
