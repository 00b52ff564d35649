//! Another local user tries to stop the Workload API for everyone: it opens connections up to
//! its fd limit and never sends a request. The agent caps connections per uid and overall,
//! closes connections that send nothing within the first-request timeout, and, when accept
//! itself fails (its own fd table full), backs off instead of spinning; legitimate fetches
//! keep working.

use std::time::{Duration, Instant};

use signet_tests::workload::{
    Fetched, TICKS_PER_SECOND, cpu_ticks, free_port, metric, probe_fetch, probe_path,
};
use signet_tests::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::agent::{Agent, create_entry, create_token, eventually, write_config};
use crate::pg_server;

/// The flooding attacker: `wl-probe flood SOCKET N`, as uid 65534 when the test runs as root
/// (another local user), else as the test's own uid.
struct Flood {
    child: tokio::process::Child,
    opened: usize,
}

impl Flood {
    /// Opens connections until `n` or its own fd limit (`fd_limit`) stops it.
    async fn start(socket: &std::path::Path, n: usize, fd_limit: u32, other_uid: bool) -> Self {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "ulimit -n {fd_limit} && exec \"$0\" flood \"$1\" {n}"
            ))
            .arg(probe_path())
            .arg(socket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if other_uid {
            cmd.uid(65534).gid(65534);
        }
        let mut child = cmd.spawn().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let opened = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("flood reports")
            .unwrap()
            .expect("a count")
            .parse()
            .unwrap();
        Self { child, opened }
    }

    async fn stop(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n").await;
        }
        let _ = self.child.wait().await;
    }
}

fn am_root() -> bool {
    crate::agent::my_uid() == 0
}

async fn metrics(port: u16) -> String {
    http_get(([127, 0, 0, 1], port).into(), "/metrics").await.1
}

#[tokio::test]
async fn idle_connection_flood_does_not_lock_out_workloads() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/flooded";
    let token = create_token(&server, "lu1");
    create_entry(&server, app, "lu1", &[]);
    let l = write_config(&server, &token, app);
    // The socket's directory must be reachable by the other uid.
    if am_root() {
        use std::os::unix::fs::PermissionsExt;
        let dir = l.socket.parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let port = free_port();
    let mut cfg = std::fs::read_to_string(&l.config).unwrap();
    cfg = cfg.replace(
        "http_listen = \"127.0.0.1:0\"",
        &format!("http_listen = \"127.0.0.1:{port}\""),
    );
    cfg.push_str(
        "\n[workload_api]\nmax_connections = 48\nmax_connections_per_uid = 16\n\
         first_request_timeout = \"700ms\"\nidle_timeout = \"2s\"\n",
    );
    std::fs::write(&l.config, cfg).unwrap();
    let agent = Agent::start(&l.config);
    let first = eventually(30, "an SVID", || async {
        match probe_fetch(None, &l.socket).await {
            Fetched::Svids(ids, _) if !ids.is_empty() => Some(ids),
            _ => None,
        }
    })
    .await;
    assert_eq!(first, [app]);

    // Flood: connections up to the attacker's fd limit (1024), far more than the per-uid
    // cap, never a byte sent.
    let flood = Flood::start(&l.socket, 100_000, 1024, am_root()).await;
    assert!(flood.opened >= 1000, "opened {}", flood.opened);
    if am_root() {
        // Another uid's flood does not touch this uid's slots: served at once, every time.
        for _ in 0..5 {
            assert_eq!(
                probe_fetch(None, &l.socket).await,
                Fetched::Svids(vec![app.to_owned()], 1)
            );
        }
    }
    // Whoever floods, the idle connections are closed within the first-request timeout and
    // fetches work again (for the same uid: once its slots are free).
    let ids = eventually(20, "an SVID during the flood", || async {
        match probe_fetch(None, &l.socket).await {
            Fetched::Svids(ids, _) => Some(ids),
            Fetched::Refused(..) => None,
        }
    })
    .await;
    assert_eq!(ids, [app]);
    let text = eventually(10, "the caps and timeouts in /metrics", || async {
        let t = metrics(port).await;
        (metric(&t, "signet_agent_workload_api_refused_uid_cap_total") > 0.0
            && metric(&t, "signet_agent_workload_api_timed_out_total") >= 16.0)
            .then_some(t)
    })
    .await;
    assert!(metric(&text, "signet_agent_workload_api_connections") <= 48.0);
    flood.stop().await;
    agent.stop().await;
}

#[tokio::test]
async fn accept_failures_back_off_instead_of_spinning() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/emfile";
    let token = create_token(&server, "lu2");
    create_entry(&server, app, "lu2", &[]);
    let l = write_config(&server, &token, app);
    let port = free_port();
    let mut cfg = std::fs::read_to_string(&l.config).unwrap();
    cfg = cfg.replace(
        "http_listen = \"127.0.0.1:0\"",
        &format!("http_listen = \"127.0.0.1:{port}\""),
    );
    // Caps above what the fd table allows, so accept itself fails (EMFILE).
    cfg.push_str(
        "\n[workload_api]\nmax_connections = 4000\nmax_connections_per_uid = 4000\n\
         first_request_timeout = \"500ms\"\naccept_backoff_max = \"200ms\"\n",
    );
    std::fs::write(&l.config, cfg).unwrap();
    // The agent with a small fd table.
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 96 && exec \"$0\" --config \"$1\"")
        .arg(bin("signet-agent"))
        .arg(&l.config)
        .env("RUST_LOG", "info,h2=warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let agent = Agent { child };
    eventually(30, "an SVID", || async {
        matches!(probe_fetch(None, &l.socket).await, Fetched::Svids(ids, _) if !ids.is_empty())
            .then_some(())
    })
    .await;

    let flood = Flood::start(&l.socket, 300, 1024, false).await;
    assert!(flood.opened >= 150, "opened {}", flood.opened);
    // Over a window of flooding, the agent uses little CPU: a loop retrying a failing
    // accept would use a whole core.
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    // A real wait: the measurement window of the real agent's CPU use.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (wall, cpu) = (t0.elapsed(), cpu_ticks(pid) - c0);
    let wall_ticks = wall.as_secs_f64() * TICKS_PER_SECOND as f64;
    eprintln!("agent CPU during the flood: {cpu} ticks over {wall_ticks:.0} ticks of wall time");
    assert!(
        (cpu as f64) < wall_ticks * 0.25,
        "the agent used {cpu} CPU ticks in {wall_ticks:.0}"
    );
    let text = metrics(port).await;
    assert!(
        metric(&text, "signet_agent_workload_api_accept_errors_total") > 0.0,
        "the flood did exhaust the fd table: {text}"
    );
    // Legitimate fetches come through as the idle connections time out.
    let ids = eventually(30, "an SVID during the flood", || async {
        match probe_fetch(None, &l.socket).await {
            Fetched::Svids(ids, _) => Some(ids),
            Fetched::Refused(..) => None,
        }
    })
    .await;
    assert_eq!(ids, [app]);
    flood.stop().await;
    agent.stop().await;
}

#[tokio::test]
async fn socket_mode_and_group_keep_other_users_out_when_configured() {
    if !am_root() {
        eprintln!("needs root to act as another uid; skipped");
        return;
    }
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/grouped";
    let token = create_token(&server, "lu3");
    create_entry(&server, app, "lu3", &[]);
    let l = write_config(&server, &token, app);
    {
        use std::os::unix::fs::PermissionsExt;
        let dir = l.socket.parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cfg = std::fs::read_to_string(&l.config).unwrap();
    cfg.push_str("\n[workload_api]\nsocket_mode = \"0770\"\nsocket_group = \"0\"\n");
    std::fs::write(&l.config, cfg).unwrap();
    let agent = Agent::start(&l.config);
    let ids = eventually(30, "an SVID for a member of the group", || async {
        match probe_fetch(None, &l.socket).await {
            Fetched::Svids(ids, _) if !ids.is_empty() => Some(ids),
            _ => None,
        }
    })
    .await;
    assert_eq!(ids, [app]);
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = std::fs::metadata(&l.socket).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o770);
        assert_eq!(m.gid(), 0);
    }
    // uid 65534, not in group 0: cannot even connect.
    let out = tokio::process::Command::new(probe_path())
        .arg("fetch")
        .arg(&l.socket)
        .uid(65534)
        .gid(65534)
        .output()
        .await
        .unwrap();
    match Fetched::parse(String::from_utf8_lossy(&out.stdout).trim()) {
        Fetched::Refused(-2, msg) => assert!(msg.contains("ermission denied"), "{msg}"),
        other => panic!("another user reached the socket: {other:?}"),
    }
    agent.stop().await;
}
