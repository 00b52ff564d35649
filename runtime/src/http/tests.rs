use super::*;
use std::sync::atomic::AtomicUsize;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

fn router() -> Router {
    Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route("/readyz", axum::routing::get(|| async { "ready\n" }))
        .route("/metrics", axum::routing::get(|| async { "# EOF\n" }))
        .route(
            "/slow",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                "slow\n"
            }),
        )
        .route(
            "/never",
            axum::routing::get(std::future::pending::<&'static str>),
        )
}

/// Refusals seen by `on_refused`, by cap.
#[derive(Default)]
struct Refused {
    listener: AtomicUsize,
    source: AtomicUsize,
}

impl Refused {
    fn note(&self, why: Refusal) {
        let c = match why {
            Refusal::ListenerFull => &self.listener,
            Refusal::SourceFull => &self.source,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
    fn listener(&self) -> usize {
        self.listener.load(Ordering::Relaxed)
    }
    fn source(&self) -> usize {
        self.source.load(Ordering::Relaxed)
    }
}

async fn start(limits: HttpLimits) -> (SocketAddr, Arc<Refused>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let refused = Arc::new(Refused::default());
    let r = refused.clone();
    let l = HttpListener {
        name: "test",
        listener,
        limits,
    };
    tokio::spawn(serve(
        l,
        router(),
        move |why| r.note(why),
        std::future::pending(),
    ));
    (addr, refused)
}

/// A TCP connection from the loopback address `from` (127.0.0.0/8 is all loopback on Linux:
/// several sources on one host).
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("address"))
        .expect("bind");
    socket.connect(addr).await.expect("connect")
}

/// Reads one response (headers and a Content-Length body); empty when the peer closed first.
async fn read_response(s: &mut (impl AsyncRead + Unpin)) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= len {
                return text;
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&buf).into_owned(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn request(s: &mut (impl AsyncRead + AsyncWrite + Unpin), path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    read_response(s).await
}

/// One request on a new connection from `from`; the response, or empty when refused.
async fn get_from(from: &str, addr: SocketAddr, path: &str) -> String {
    let mut s = connect_from(from, addr).await;
    request(&mut s, path).await
}

/// A connection from `from` that has been served once and stays open (keep-alive).
async fn held_from(from: &str, addr: SocketAddr) -> TcpStream {
    let mut s = connect_from(from, addr).await;
    assert!(request(&mut s, "/healthz").await.contains("200 OK"));
    s
}

/// True when the peer closes `s` within 5 s (a generous bound: it catches "never").
async fn closed_by_peer(s: &mut (impl AsyncRead + Unpin)) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// Polls `get` until it is answered 200 (slots come back as connections close).
async fn eventually_served(from: &str, addr: SocketAddr) -> bool {
    for _ in 0..100 {
        if get_from(from, addr, "/healthz").await.contains("200 OK") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn long(limits: HttpLimits) -> HttpLimits {
    HttpLimits {
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        connection_timeout: Duration::from_secs(30),
        ..limits
    }
}

#[tokio::test]
async fn a_source_over_its_cap_is_refused_while_another_source_gets_in() {
    let (addr, refused) = start(long(HttpLimits {
        max_connections: 4,
        max_connections_per_source: 2,
        ..HttpLimits::default()
    }))
    .await;
    let mut hog = vec![
        held_from("127.0.0.1", addr).await,
        held_from("127.0.0.1", addr).await,
    ];
    // The hog's third connection is closed at once, without a byte read...
    let mut extra = connect_from("127.0.0.1", addr).await;
    assert!(closed_by_peer(&mut extra).await, "past the per-source cap");
    assert_eq!(refused.source(), 1);
    assert_eq!(refused.listener(), 0);
    // ...while another source is served, though the listener has room for only two more.
    assert!(
        get_from("127.0.0.2", addr, "/healthz")
            .await
            .contains("200 OK")
    );
    // The hog gets a slot back when one of its connections goes.
    drop(hog.pop());
    assert!(eventually_served("127.0.0.1", addr).await);
    drop(hog);
}

#[tokio::test]
async fn the_listener_cap_holds_across_sources_and_slots_come_back() {
    let (addr, refused) = start(long(HttpLimits {
        max_connections: 2,
        max_connections_per_source: 2,
        ..HttpLimits::default()
    }))
    .await;
    let a = held_from("127.0.0.1", addr).await;
    let _b = held_from("127.0.0.2", addr).await;
    let mut extra = connect_from("127.0.0.3", addr).await;
    assert!(closed_by_peer(&mut extra).await, "past the listener cap");
    assert_eq!(refused.listener(), 1);
    drop(a);
    assert!(eventually_served("127.0.0.3", addr).await);
}

#[tokio::test]
async fn probes_answer_while_the_general_listener_is_full() {
    let (addr, refused) = start(long(HttpLimits {
        max_connections: 4,
        max_connections_per_source: 2,
        ..HttpLimits::default()
    }))
    .await;
    let probes = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let probe_addr = probes.local_addr().expect("addr");
    tokio::spawn(serve_probes(
        "probe_listen",
        probes,
        router(),
        |_| {},
        std::future::pending(),
    ));
    // Two sources hold every slot of the general listener: nobody else gets in...
    let _held = [
        held_from("127.0.0.1", addr).await,
        held_from("127.0.0.1", addr).await,
        held_from("127.0.0.2", addr).await,
        held_from("127.0.0.2", addr).await,
    ];
    let mut kubelet = connect_from("127.0.0.3", addr).await;
    assert!(closed_by_peer(&mut kubelet).await);
    assert_eq!(refused.listener(), 1);
    // ...but the probe listener answers the probes, from any of them.
    for from in ["127.0.0.3", "127.0.0.1"] {
        let r = get_from(from, probe_addr, "/readyz").await;
        assert!(r.contains("200 OK") && r.ends_with("ready\n"), "{r}");
        let r = get_from(from, probe_addr, "/healthz").await;
        assert!(r.contains("200 OK") && r.ends_with("ok\n"), "{r}");
    }
    // Nothing else is served there.
    let r = get_from("127.0.0.3", probe_addr, "/metrics").await;
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
}

#[tokio::test]
async fn the_probe_listener_has_its_own_per_source_cap() {
    let probes = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = probes.local_addr().expect("addr");
    let refused = Arc::new(Refused::default());
    let r = refused.clone();
    tokio::spawn(serve_probes(
        "probe_listen",
        probes,
        router(),
        move |why| r.note(why),
        std::future::pending(),
    ));
    let per_source = HttpLimits::PROBES.max_connections_per_source;
    let mut held = Vec::new();
    for _ in 0..per_source {
        held.push(held_from("127.0.0.1", addr).await);
    }
    let mut extra = connect_from("127.0.0.1", addr).await;
    assert!(closed_by_peer(&mut extra).await);
    assert_eq!(refused.source(), 1);
    assert!(
        get_from("127.0.0.2", addr, "/readyz")
            .await
            .contains("200 OK")
    );
    // And its connections do not linger: the hog's are closed after a second of idleness.
    for s in &mut held {
        assert!(closed_by_peer(s).await, "an idle probe connection was kept");
    }
}

// ---------------------------------------------------------------------------------------------
// One connection's timeouts, on an in-memory stream under tokio's paused clock.

fn spawn_conn(limits: HttpLimits, routes: Routes) -> DuplexStream {
    let (client, server) = tokio::io::duplex(4096);
    let (stop_tx, stop) = watch::channel(false);
    let ctx = ConnCtx {
        name: "test",
        peer: "192.0.2.1:4000".parse().expect("address"),
        limits,
        stop,
    };
    let deadline = SystemClock.monotonic() + limits.connection_timeout;
    tokio::spawn(async move {
        serve_connection(server, routes, ctx, deadline).await;
        drop(stop_tx);
    });
    client
}

/// Reads until the peer closes; how long that took.
async fn time_to_close(s: &mut DuplexStream) -> Duration {
    let started = SystemClock.monotonic();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => {}
        }
    }
}

const TIMED: HttpLimits = HttpLimits {
    max_connections: 1,
    max_connections_per_source: 1,
    header_read_timeout: Duration::from_secs(20),
    idle_timeout: Duration::from_secs(2),
    connection_timeout: Duration::from_secs(60),
};

#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let mut c = spawn_conn(TIMED, Routes::All(router()));
    for _ in 0..3 {
        // Each request within the idle timeout keeps the connection.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let r = request(&mut c, "/healthz").await;
        assert!(r.contains("200 OK"), "{r}");
    }
    // Then silence: closed after exactly the idle timeout, not before.
    let mut buf = [0u8; 8];
    let early = tokio::time::timeout(
        TIMED.idle_timeout - Duration::from_millis(1),
        c.read(&mut buf),
    )
    .await;
    assert!(early.is_err(), "closed before the idle timeout");
    assert_eq!(time_to_close(&mut c).await, Duration::from_millis(1));
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_sends_is_closed_after_the_idle_timeout() {
    let mut c = spawn_conn(TIMED, Routes::All(router()));
    assert_eq!(time_to_close(&mut c).await, TIMED.idle_timeout);
}

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_is_not_idle() {
    let mut c = spawn_conn(TIMED, Routes::All(router()));
    let started = SystemClock.monotonic();
    // The handler takes 10 s, five idle timeouts.
    let r = request(&mut c, "/slow").await;
    assert!(r.contains("200 OK") && r.ends_with("slow\n"), "{r}");
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    // Idle from the response on.
    assert_eq!(time_to_close(&mut c).await, TIMED.idle_timeout);
}

#[tokio::test(start_paused = true)]
async fn a_trickled_request_is_bounded_by_the_header_read_timeout() {
    let limits = HttpLimits {
        header_read_timeout: Duration::from_secs(5),
        ..TIMED
    };
    let mut c = spawn_conn(limits, Routes::All(router()));
    let started = SystemClock.monotonic();
    // A byte a second: never idle for 2 s, never a whole header.
    let trickle = async {
        for b in b"GET /healthz HTTP/1.1\r\nhost: xxxxxxxxxxxxxxxxxxxxxxxxxxxxx" {
            if c.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), trickle).await;
    let closed_after = started.elapsed() + time_to_close(&mut c).await;
    assert!(
        closed_after >= limits.header_read_timeout
            && closed_after <= limits.header_read_timeout + Duration::from_secs(1),
        "closed after {closed_after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn no_connection_outlives_its_lifetime_bound() {
    let limits = HttpLimits {
        connection_timeout: Duration::from_secs(7),
        ..TIMED
    };
    let mut c = spawn_conn(limits, Routes::All(router()));
    c.write_all(b"GET /never HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(time_to_close(&mut c).await, limits.connection_timeout);
}

#[tokio::test(start_paused = true)]
async fn a_probe_listener_answers_only_the_probe_paths() {
    let mut c = spawn_conn(TIMED, Routes::Only(router(), &PROBE_PATHS));
    assert!(request(&mut c, "/readyz").await.contains("200 OK"));
    let r = request(&mut c, "/metrics").await;
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    assert!(r.contains("only /healthz and /readyz"), "{r}");
    assert!(request(&mut c, "/healthz").await.contains("200 OK"));
}

// ---------------------------------------------------------------------------------------------
// Pure parts.

#[test]
fn refusals_are_logged_once_per_interval_with_the_count_since() {
    let mut log = RefusalLog::default();
    let t0 = SystemClock.monotonic();
    assert_eq!(log.note(t0), Some(1));
    for _ in 0..500 {
        assert_eq!(log.note(t0 + Duration::from_secs(1)), None);
    }
    assert_eq!(log.note(t0 + REFUSAL_LOG_INTERVAL), Some(501));
    assert_eq!(log.note(t0 + REFUSAL_LOG_INTERVAL), None);
    assert_eq!(log.total, 503);
}

#[test]
fn limits_are_checked_and_named_as_the_binary_spells_them() {
    let key = |f: &'static str| format!("limits.http_{f}");
    assert_eq!(HttpLimits::default().validate(key), Ok(()));
    assert_eq!(HttpLimits::PROBES.validate(key), Ok(()));
    let e = HttpLimits {
        idle_timeout: Duration::ZERO,
        ..HttpLimits::default()
    }
    .validate(key)
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "limits.http_idle_timeout must be positive (a zero would refuse everything or wait forever)"
    );
    let e = HttpLimits {
        max_connections_per_source: 0,
        ..HttpLimits::default()
    }
    .validate(key)
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("limits.http_max_connections_per_source must be positive"),
        "{e}"
    );
    let e = HttpLimits {
        max_connections: 4,
        max_connections_per_source: 5,
        ..HttpLimits::default()
    }
    .validate(|f| format!("http.{f}"))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "http.max_connections_per_source (5) is larger than http.max_connections (4): one \
         source could take the whole listener"
    );
}
