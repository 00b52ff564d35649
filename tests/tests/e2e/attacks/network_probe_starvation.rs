//! A network attacker starving the health probes (issue 24, finding 5): 70 idle keep-alive
//! connections from one pod held all 64 slots of `http_listen`; the kubelet's probes were
//! reset, readiness took every replica out of its Service and liveness restarted it.
//!
//! Against the real `signet-server` with the shipped defaults (`limits.http_*`) and a probe
//! listener (`probe_listen`, as deploy/ sets it):
//! - one source opening 70 keep-alive connections keeps at most
//!   `limits.http_max_connections_per_source` (8); the others are closed as soon as they are
//!   accepted, and counted in `/metrics`;
//! - `/readyz` and `/healthz` answer at once, on the probe listener and on `http_listen` from
//!   another source;
//! - the held connections are closed once idle (`limits.http_idle_timeout`);
//! - many sources filling all of `http_listen` still leave the probe listener answering.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use signet_tests::{Server, ServerOpts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TCP connection from the loopback address `from` (127.0.0.0/8 is all loopback on Linux).
async fn tcp_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// One keep-alive GET on `s`: the status code, or `None` when the server closed the
/// connection instead of answering.
async fn keep_alive_get(s: &mut TcpStream, path: &str) -> Option<u16> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if body.len() >= len {
                return head.split_whitespace().nth(1)?.parse().ok();
            }
        }
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await {
            Ok(Ok(0) | Err(_)) | Err(_) => return None,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// True when the peer closes `s` within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// A probe as the kubelet sends it (one request, `Connection: close`), from `from`: its
/// status and how long it took.
async fn probe(from: &str, addr: SocketAddr, path: &str) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut s = tcp_from(from, addr).await;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = Vec::new();
    if s.write_all(req.as_bytes()).await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    }
    let text = String::from_utf8_lossy(&out);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, t0.elapsed())
}

#[tokio::test]
async fn one_source_holding_connections_cannot_starve_the_probes() {
    let server = Server::start(ServerOpts {
        // The shipped [limits] defaults; a probe listener as deploy/ has it.
        extra_toml: "probe_listen = \"127.0.0.1:0\"\n".into(),
        ..ServerOpts::default()
    })
    .await;
    let probes = server
        .probes
        .expect("the server printed its probe listener");

    // The attack: 70 keep-alive connections from one pod, each served once and then held.
    let attacker = "127.0.0.2";
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..70 {
        let mut s = tcp_from(attacker, server.http).await;
        match keep_alive_get(&mut s, "/healthz").await {
            Some(200) => held.push(s),
            None => refused += 1,
            Some(code) => panic!("unexpected status {code}"),
        }
    }
    assert_eq!(held.len(), 8, "limits.http_max_connections_per_source");
    assert_eq!(refused, 62);

    // The probes answer at once: on the probe listener, and on http_listen from the kubelet's
    // own source.
    for path in ["/readyz", "/healthz"] {
        let (code, took) = probe("127.0.0.1", probes, path).await;
        assert_eq!(code, 200, "{path} on probe_listen");
        assert!(took < Duration::from_secs(1), "{path} took {took:?}");
        let (code, took) = probe("127.0.0.3", server.http, path).await;
        assert_eq!(code, 200, "{path} on http_listen from another source");
        assert!(took < Duration::from_secs(1), "{path} took {took:?}");
    }
    // The probe listener answers nothing else.
    assert_eq!(probe("127.0.0.1", probes, "/metrics").await.0, 404);

    // Refusals are counted.
    let (code, metrics) = signet_tests::http_get(server.http, "/metrics").await;
    assert_eq!(code, 200);
    let line = metrics
        .lines()
        .find(|l| l.contains("limit=\"http_connections_per_source\"") && !l.starts_with('#'))
        .unwrap_or_else(|| panic!("no per-source refusal counter in {metrics}"));
    let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 62.0, "{line}");

    // The held connections are idle: closed after limits.http_idle_timeout (3 s), well
    // before the connection lifetime bound (60 s).
    let t0 = Instant::now();
    for s in &mut held {
        assert!(
            closed_within(s, Duration::from_secs(10)).await,
            "an idle keep-alive connection stayed open"
        );
    }
    eprintln!(
        "probe starvation: 8 held, 62 refused; idle connections closed within {:?}",
        t0.elapsed()
    );
    // And the attacker's source is served again (nothing is banned, only bounded).
    assert_eq!(probe(attacker, server.http, "/healthz").await.0, 200);

    // Many sources together fill all 64 slots of http_listen: the probe listener, which they
    // cannot reach through http_listen, still answers.
    let mut all = Vec::new();
    for host in 10..18 {
        for _ in 0..8 {
            let mut s = tcp_from(&format!("127.0.0.{host}"), server.http).await;
            assert_eq!(keep_alive_get(&mut s, "/healthz").await, Some(200));
            all.push(s);
        }
    }
    let mut extra = tcp_from("127.0.0.30", server.http).await;
    assert_eq!(
        keep_alive_get(&mut extra, "/healthz").await,
        None,
        "the 65th connection was served"
    );
    let (code, took) = probe("127.0.0.1", probes, "/readyz").await;
    assert_eq!(code, 200, "/readyz on probe_listen with http_listen full");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    drop(all);
}
