//! A network attacker against the server's listeners (issue 8, finding 6): many streams on one
//! connection, idle and half-open connections, more connections than the cap, request floods
//! past the rate limits, and audit floods. Each attack is refused by a limit from `[limits]`,
//! and the legitimate use next to it keeps working.
//!
//! The hostile HTTP/2 client is written by hand ([`RawH2`]): real clients (tonic, h2) obey the
//! server's SETTINGS_MAX_CONCURRENT_STREAMS and queue, an attacker does not.

use std::sync::Arc;
use std::time::Duration;

use signet_proto::admin::ListAuditEventsRequest;
use signet_proto::admin::node_admin_client::NodeAdminClient;
use signet_proto::agent::AttestRequest;
use signet_proto::agent::node_client::NodeClient;
use signet_proto::ca::{GetBundleRequest, SignCsrRequest, WatchBundleRequest};
use signet_tests::{Server, ServerOpts, TokenIssuer, csr_with};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

const WATCH: &str = "/signet.ca.v1.CertificateAuthority/WatchBundle";

// HTTP/2 frame types and codes (RFC 9113).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const REFUSED_STREAM: u32 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A TCP connection to `addr` from the loopback address `from` (127.0.0.0/8 is all loopback
/// on Linux: several "sources" on one host).
async fn tcp_from(from: &str, addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse().unwrap())?;
    socket.connect(addr).await
}

/// A TLS connection to the server's gRPC listener, ALPN h2.
async fn tls_connect(server: &Server) -> tokio_rustls::client::TlsStream<TcpStream> {
    tls_connect_from(server, "127.0.0.1").await.unwrap()
}

async fn tls_connect_from(
    server: &Server,
    from: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for der in signet_types::pem::parse_certs(&server.bundle_pem).unwrap() {
        roots
            .add(rustls::pki_types::CertificateDer::from(der))
            .unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tcp_from(from, server.grpc).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
}

/// One unary call on a raw connection: true when it was answered with response headers.
async fn raw_get_bundle<S: AsyncRead + AsyncWrite + Unpin>(h: &mut RawH2<S>) -> bool {
    let (id, bytes) = h.call_bytes("/signet.ca.v1.CertificateAuthority/GetBundle");
    if h.io.write_all(&bytes).await.is_err() {
        return false;
    }
    while let Some(f) = h.next().await {
        if f.stream == id && f.kind == HEADERS {
            return true;
        }
    }
    false
}

/// A hand-written HTTP/2 client that ignores every limit the server announces.
struct RawH2<S> {
    io: S,
    next_stream: u32,
}

#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK integer with a 7-bit prefix (RFC 7541 §5.1), no Huffman.
fn hpack_len(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(u8::try_from(n).unwrap());
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push(u8::try_from(n % 128).unwrap() | 0x80);
        n /= 128;
    }
    out.push(u8::try_from(n).unwrap());
}

/// Literal header fields without indexing, new names (RFC 7541 §6.2.2).
fn hpack(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0);
        hpack_len(&mut out, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_len(&mut out, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

impl<S: AsyncRead + AsyncWrite + Unpin> RawH2<S> {
    async fn start(io: S) -> Self {
        Self::start_with(io, &[]).await
    }

    /// Starts with these SETTINGS (id, value).
    async fn start_with(mut io: S, settings: &[(u16, u32)]) -> Self {
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let mut payload = Vec::new();
        for (id, value) in settings {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        hello.extend(frame(SETTINGS, 0, 0, &payload));
        io.write_all(&hello).await.unwrap();
        Self { io, next_stream: 1 }
    }

    /// Bytes that open a gRPC call to `path` with an empty request message.
    fn call_bytes(&mut self, path: &str) -> (u32, Vec<u8>) {
        let id = self.next_stream;
        self.next_stream += 2;
        let block = hpack(&[
            (":method", "POST"),
            (":scheme", "https"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]);
        let mut out = frame(HEADERS, END_HEADERS, id, &block);
        out.extend(frame(DATA, END_STREAM, id, &[0, 0, 0, 0, 0]));
        (id, out)
    }

    /// Opens `n` calls to `path` in one write; returns their stream ids. A write the server
    /// cut short (it closed the connection) is not an error here: the reads tell.
    async fn open_calls(&mut self, path: &str, n: usize) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut bytes = Vec::new();
        for _ in 0..n {
            let (id, b) = self.call_bytes(path);
            ids.push(id);
            bytes.extend(b);
        }
        let _ = self.io.write_all(&bytes).await;
        ids
    }

    async fn ping(&mut self) {
        self.io
            .write_all(&frame(PING, 0, 0, b"signet!!"))
            .await
            .unwrap();
    }

    /// The next frame; `None` at end of stream (or a reset connection). SETTINGS are ACKed.
    async fn next(&mut self) -> Option<Frame> {
        let mut head = [0u8; 9];
        self.io.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        self.io.read_exact(&mut payload).await.ok()?;
        let f = Frame {
            kind: head[3],
            flags: head[4],
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload,
        };
        if f.kind == SETTINGS && f.flags & ACK == 0 {
            let _ = self.io.write_all(&frame(SETTINGS, ACK, 0, &[])).await;
        }
        Some(f)
    }
}

fn error_code(f: &Frame) -> u32 {
    let at = if f.kind == GOAWAY { 4 } else { 0 };
    u32::from_be_bytes(f.payload[at..at + 4].try_into().unwrap())
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Waits until the peer closes `s` (EOF or reset); panics after `within` (a generous bound:
/// it catches "never", not "slow").
async fn closed_by_peer(s: &mut (impl AsyncRead + Unpin), within: Duration) {
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server kept the connection open for {within:?}"
    );
}

async fn sign(server: &Server, token: &str) -> Result<(), tonic::Status> {
    let (csr, _key) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: csr.into_bytes(),
            ttl_seconds: 0,
            kubernetes_namespace: String::new(),
        },
        token,
    )
    .unwrap();
    server.native().await.sign_csr(req).await.map(|_| ())
}

fn pushback_ms(status: &tonic::Status) -> u64 {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap_or_else(|| panic!("no retry pushback in {status:?}"))
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Reads until every stream in `ids` has been answered: served (response headers, the stream
/// stays open), refused (RST_STREAM REFUSED_STREAM) or shed (trailers-only ResourceExhausted).
async fn answers<S: AsyncRead + AsyncWrite + Unpin>(
    h: &mut RawH2<S>,
    ids: &[u32],
) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let (mut served, mut refused, mut shed) = (Vec::new(), Vec::new(), Vec::new());
    while served.len() + refused.len() + shed.len() < ids.len() {
        let f = tokio::time::timeout(Duration::from_secs(20), h.next())
            .await
            .expect("the server did not answer")
            .expect("the connection was closed");
        if !ids.contains(&f.stream) {
            continue;
        }
        match f.kind {
            HEADERS if f.flags & END_STREAM == 0 && !served.contains(&f.stream) => {
                served.push(f.stream)
            }
            HEADERS if f.flags & END_STREAM != 0 && !served.contains(&f.stream) => {
                shed.push(f.stream)
            }
            RST_STREAM if error_code(&f) == REFUSED_STREAM => refused.push(f.stream),
            _ => {}
        }
    }
    (served, refused, shed)
}

/// One connection opening many `WatchBundle` streams: past the per-connection cap each new
/// stream is refused (REFUSED_STREAM) while the first ones are served; a client that keeps
/// opening streams loses the connection (GOAWAY ENHANCE_YOUR_CALM) and the server's memory
/// stays flat. Across connections, the server-wide cap on watches answers ResourceExhausted
/// with a retry hint and frees its slot when a watch ends. Everyone else is served meanwhile,
/// and an open watch keeps its connection alive past the idle timeout.
#[tokio::test]
async fn stream_floods_are_refused_per_connection_and_server_wide() {
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        tokens: Some(tokens.jwks_json()),
        extra_toml: "[limits]\nmax_concurrent_streams = 8\nmax_watch_streams = 12\n\
                     http2_max_local_error_reset_streams = 50\nconnection_idle_timeout = \"1s\"\n"
            .into(),
        ..ServerOpts::default()
    })
    .await;

    // 12 watches on one connection: the first 8 are served, the other 4 refused.
    let mut a = RawH2::start(tls_connect(&server).await).await;
    let ids = a.open_calls(WATCH, 12).await;
    let (served, mut refused, shed) = answers(&mut a, &ids).await;
    refused.sort_unstable();
    assert_eq!(served.len(), 8, "served {served:?}");
    assert_eq!(refused, ids[8..].to_vec());
    assert!(shed.is_empty());

    // 4 more on a second connection fill the server-wide cap of 12 watches...
    let mut b = RawH2::start(tls_connect(&server).await).await;
    let ids = b.open_calls(WATCH, 4).await;
    assert_eq!(answers(&mut b, &ids).await.0.len(), 4);
    // ...so a 13th, on a third connection, is shed with a retry hint.
    let mut native = server.native().await;
    let exhausted = native
        .watch_bundle(WatchBundleRequest {})
        .await
        .expect_err("a 13th watch");
    assert_eq!(exhausted.code(), Code::ResourceExhausted, "{exhausted:?}");
    assert!(
        exhausted.message().contains("limits.max_watch_streams")
            && exhausted.message().contains("retry in"),
        "{}",
        exhausted.message()
    );
    assert_eq!(pushback_ms(&exhausted), 1000);
    // Meanwhile everyone else is served: unary calls have their own cap.
    native.get_bundle(GetBundleRequest {}).await.unwrap();
    sign(&server, &tokens.token("shop", "cart")).await.unwrap();

    // The watches outlive the 1 s idle timeout: a connection with open streams is not idle.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    a.ping().await;
    loop {
        let f = a
            .next()
            .await
            .expect("a connection with open watches was closed");
        if f.kind == PING && f.flags & ACK != 0 {
            break;
        }
    }

    // When watches end, their slots are free again.
    drop((a, b));
    let mut stream = loop {
        match native.watch_bundle(WatchBundleRequest {}).await {
            Ok(s) => break s.into_inner(),
            Err(e) if e.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert!(!stream.message().await.unwrap().unwrap().roots.is_empty());

    // The flood: 400 watches on one connection, sent at once, ignoring every refusal.
    let pid = server.pid().unwrap();
    let rss_before = rss_kib(pid);
    let mut h2 = RawH2::start(tls_connect(&server).await).await;
    let ids = h2.open_calls(WATCH, 400).await;
    let (mut refused, mut goaway) = (Vec::new(), None);
    while let Some(f) = tokio::time::timeout(Duration::from_secs(20), h2.next())
        .await
        .expect("the server neither answered nor closed")
    {
        match f.kind {
            RST_STREAM => {
                assert_eq!(error_code(&f), REFUSED_STREAM, "{f:?}");
                refused.push(f.stream);
            }
            GOAWAY => goaway = Some(error_code(&f)),
            _ => {}
        }
    }
    // Never one of the first 8; then the server had enough and closed the connection.
    assert!(
        refused.iter().all(|id| !ids[..8].contains(id)),
        "{refused:?}"
    );
    assert!(refused.len() >= 10, "only {} refusals", refused.len());
    assert_eq!(goaway, Some(ENHANCE_YOUR_CALM));
    let rss_after = rss_kib(pid);
    eprintln!(
        "stream flood: {} refused, then closed (GOAWAY {goaway:?}); server RSS {rss_before} KiB before, {rss_after} KiB after",
        refused.len()
    );
    assert!(
        rss_after < rss_before + 32 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    // And the server serves on.
    drop(stream);
    native.get_bundle(GetBundleRequest {}).await.unwrap();
}

/// A client that never reads its responses (a zero flow-control window: the server can send
/// headers but no data) cannot hold the server's request slots: a unary call frees its slot
/// when its handler is done, so others are served while the unread responses sit there.
#[tokio::test]
async fn a_client_that_never_reads_cannot_hold_request_slots() {
    let server = Server::start(ServerOpts {
        extra_toml: "[limits]\nmax_concurrent_requests = 4\n".into(),
        ..ServerOpts::default()
    })
    .await;
    // SETTINGS_INITIAL_WINDOW_SIZE (0x4) = 0.
    let mut h2 = RawH2::start_with(tls_connect(&server).await, &[(0x4, 0)]).await;
    let ids = h2
        .open_calls("/signet.ca.v1.CertificateAuthority/GetBundle", 20)
        .await;
    let (answered, refused, shed) = answers(&mut h2, &ids).await;
    // Every handler ran (headers sent) although no response body could be delivered.
    assert_eq!(answered.len(), 20, "refused {refused:?}, shed {shed:?}");
    // The slots are free: a legitimate client is served, several times over the cap.
    let mut native = server.native().await;
    for _ in 0..8 {
        native.get_bundle(GetBundleRequest {}).await.unwrap();
    }
    drop(h2);
}

/// Connections that do nothing are closed: an idle TLS connection after the idle timeout, a
/// TCP connection that never finishes its TLS handshake after the handshake timeout, and an
/// HTTP/1 request whose headers never end, on http_listen, after the header-read timeout. A
/// legitimate client is served next to each.
#[tokio::test]
async fn idle_and_half_open_connections_are_closed() {
    let server = Server::start(ServerOpts {
        extra_toml: "[limits]\nconnection_idle_timeout = \"1s\"\ntls_handshake_timeout = \"1s\"\n\
                     http_header_read_timeout = \"1s\"\n"
            .into(),
        ..ServerOpts::default()
    })
    .await;
    let limit = Duration::from_secs(15);

    // An idle TLS + HTTP/2 connection, after one completed call.
    let mut h2 = RawH2::start(tls_connect(&server).await).await;
    let (id, bytes) = h2.call_bytes("/signet.ca.v1.CertificateAuthority/GetBundle");
    h2.io.write_all(&bytes).await.unwrap();
    loop {
        let f = h2.next().await.expect("GetBundle answered");
        if f.stream == id && f.flags & END_STREAM != 0 {
            break;
        }
    }
    let idle = tokio::time::timeout(limit, async { while h2.next().await.is_some() {} }).await;
    assert!(
        idle.is_ok(),
        "an idle connection was kept open for {limit:?}"
    );

    // A TCP connection that never sends a ClientHello.
    let mut silent = TcpStream::connect(server.grpc).await.unwrap();
    // A TLS handshake begun but never finished (the ClientHello's first bytes only).
    let mut partial = TcpStream::connect(server.grpc).await.unwrap();
    partial
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    // Half an HTTP/1 request on http_listen.
    let mut half = TcpStream::connect(server.http).await.unwrap();
    half.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();

    // The legitimate clients next to them are served.
    assert_eq!(server.http_get("/readyz").await.0, 200);
    server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap();

    closed_by_peer(&mut silent, limit).await;
    closed_by_peer(&mut partial, limit).await;
    closed_by_peer(&mut half, limit).await;
    assert_eq!(server.http_get("/healthz").await.0, 200);

    // A legitimate client whose connection was closed for idleness does not notice: its
    // channel reconnects for the next call.
    let mut native = server.native().await;
    native.get_bundle(GetBundleRequest {}).await.unwrap();
    // A real wait: the server's idle timer (1 s, its own clock) closes the connection, which
    // the channel does not report; `grpc_connections_open` is published only once a second,
    // so watching it would take longer than this.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..3 {
        native.get_bundle(GetBundleRequest {}).await.unwrap();
    }
}

/// More connections than the caps: beyond `limits.max_connections_per_source` from one source,
/// and beyond `limits.max_connections` in all, a connection is closed as soon as it is accepted
/// (not queued); another source is still served while one is at its cap, and a legitimate
/// client is served again once others go away. The HTTP listener has its own cap.
#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let server = Server::start(ServerOpts {
        extra_toml: "[limits]\nmax_connections = 6\nmax_connections_per_source = 3\n\
                     http_max_connections = 2\nhttp_max_connections_per_source = 2\n"
            .into(),
        ..ServerOpts::default()
    })
    .await;
    let limit = Duration::from_secs(10);
    // Source A (127.0.0.2) holds its three slots (handshakes in progress count)...
    let mut held_a = Vec::new();
    for _ in 0..3 {
        held_a.push(tcp_from("127.0.0.2", server.grpc).await.unwrap());
    }
    for _ in 0..3 {
        let mut extra = tcp_from("127.0.0.2", server.grpc).await.unwrap();
        // Closed without a word: no TLS handshake is even attempted.
        closed_by_peer(&mut extra, limit).await;
    }
    // ...while source B is served.
    let mut b = RawH2::start(tls_connect_from(&server, "127.0.0.3").await.unwrap()).await;
    assert!(raw_get_bundle(&mut b).await, "another source was refused");
    // B and C fill the server-wide cap of 6: one more, from anywhere, is closed at once.
    let _held_b = tcp_from("127.0.0.3", server.grpc).await.unwrap();
    let _held_c = tcp_from("127.0.0.4", server.grpc).await.unwrap();
    let mut extra = tcp_from("127.0.0.5", server.grpc).await.unwrap();
    closed_by_peer(&mut extra, limit).await;
    let refused = signet_client::connect_tls(
        &server.grpc.to_string(),
        &server.bundle_pem,
        Some("localhost"),
        None,
    )
    .await;
    assert!(refused.is_err(), "connected past the cap");
    // A legitimate client is served as soon as one goes away.
    drop(held_a.pop());
    let mut ok = None;
    for _ in 0..100 {
        if let Ok(ch) = signet_client::connect_tls(
            &server.grpc.to_string(),
            &server.bundle_pem,
            Some("localhost"),
            None,
        )
        .await
        {
            ok = Some(ch);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ch = ok.expect("a slot freed by a closed connection is never reused");
    signet_proto::ca::certificate_authority_client::CertificateAuthorityClient::new(ch)
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap();

    // The HTTP listener: two held, the third closed at once, served again after.
    let h1 = TcpStream::connect(server.http).await.unwrap();
    let _h2 = TcpStream::connect(server.http).await.unwrap();
    let mut h3 = TcpStream::connect(server.http).await.unwrap();
    closed_by_peer(&mut h3, limit).await;
    drop(h1);
    let mut served = false;
    for _ in 0..100 {
        let mut s = TcpStream::connect(server.http).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        if out.starts_with(b"HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "the HTTP listener never served again");
}

/// A caller asking for certificates faster than `limits.issuance_per_caller` gets
/// ResourceExhausted with a retry hint, in the message and in grpc-retry-pushback-ms; another
/// caller is unaffected. Guessing join tokens from one source hits
/// `limits.attestation_per_source` likewise, after a legitimate attestation went through.
#[tokio::test]
async fn issuance_and_attestation_floods_are_rate_limited() {
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        tokens: Some(tokens.jwks_json()),
        extra_toml: "[limits]\nissuance_per_caller = { burst = 3, per_second = 0.01 }\n\
                     attestation_per_source = { burst = 3, per_second = 0.01 }\n"
            .into(),
        ..ServerOpts::default()
    })
    .await;
    let greedy = tokens.token("shop", "cart");
    for _ in 0..3 {
        sign(&server, &greedy).await.unwrap();
    }
    let before = server.cert_count().await;
    let refused = sign(&server, &greedy).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("jwt:spiffe://example.org/ns/shop/sa/cart")
            && refused.message().contains("limits.issuance_per_caller")
            && refused.message().contains("retry in"),
        "{}",
        refused.message()
    );
    // 0.01 tokens per second: the next one is about 100 s away.
    let ms = pushback_ms(&refused);
    assert!((90_000..=100_000).contains(&ms), "{ms}");
    assert_eq!(
        server.cert_count().await,
        before,
        "nothing issued when refused"
    );
    // Another caller is unaffected, and so is another pod of the same service account (the
    // replicas of a Deployment do not share one budget).
    sign(&server, &tokens.token("shop", "checkout"))
        .await
        .unwrap();
    let mut other_pod = tokens.claims("shop", "cart");
    other_pod["kubernetes.io"]["pod"]["name"] = serde_json::json!("cart-7d9f8b6c5-zzzzz");
    sign(&server, &tokens.sign(&other_pod)).await.unwrap();

    // Attestation: one legitimate join token, then guesses, from the same source.
    let token = NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    )
    .create_join_token(signet_proto::admin::CreateJoinTokenRequest {
        ttl_seconds: 0,
        node_id: "n1".into(),
    })
    .await
    .unwrap()
    .into_inner()
    .token;
    let attest = |join_token: String| {
        let server = &server;
        async move {
            let kc = signet_client::new_key_and_csr().unwrap();
            NodeClient::new(server.channel().await)
                .attest(AttestRequest {
                    join_token,
                    csr: kc.csr_der,
                })
                .await
        }
    };
    attest(token).await.unwrap();
    for i in 0..2 {
        let e = attest(format!("guess-{i}")).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }
    let e = attest("guess-3".into()).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("node attestations from 127.0.0.1")
            && e.message().contains("limits.attestation_per_source"),
        "{}",
        e.message()
    );
    assert!(pushback_ms(&e) > 1000);
    // Other calls from that source still work.
    sign(&server, &tokens.token("shop", "checkout"))
        .await
        .unwrap();
}

/// Thousands of unauthenticated failures do not push out an admin action or an authenticated
/// caller's denial; the flood itself is recorded as aggregate events.
#[tokio::test]
async fn an_audit_flood_is_aggregated_and_pushes_out_no_real_event() {
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        tokens: Some(tokens.jwks_json()),
        extra_toml: "[limits]\naudit_window = \"1s\"\n\
                     issuance_per_source = { burst = 0, per_second = 0 }\n"
            .into(),
        ..ServerOpts::default()
    })
    .await;
    let flood = 3000;
    let channel = server.channel().await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let mut client =
            signet_proto::ca::certificate_authority_client::CertificateAuthorityClient::new(
                channel.clone(),
            );
        tasks.push(tokio::spawn(async move {
            for i in 0..flood / 8 {
                let req = signet_client::with_bearer(
                    SignCsrRequest {
                        csr: b"x".to_vec(),
                        ttl_seconds: 0,
                        kubernetes_namespace: String::new(),
                    },
                    &format!("forged.{w}.{i}"),
                )
                .unwrap();
                let e = client.sign_csr(req).await.unwrap_err();
                assert_eq!(e.code(), Code::Unauthenticated);
            }
        }));
    }
    // In the middle of the flood: an admin action and an authenticated denial.
    let mut admin = NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    );
    admin
        .create_join_token(signet_proto::admin::CreateJoinTokenRequest {
            ttl_seconds: 0,
            node_id: "during-the-flood".into(),
        })
        .await
        .unwrap();
    let (other, _k) = csr_with(&["spiffe://example.org/ns/bank/sa/vault"], &[]);
    let denied = signet_client::with_bearer(
        SignCsrRequest {
            csr: other.into_bytes(),
            ttl_seconds: 0,
            kubernetes_namespace: String::new(),
        },
        &tokens.token("shop", "cart"),
    )
    .unwrap();
    let e = server.native().await.sign_csr(denied).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    for t in tasks {
        t.await.unwrap();
    }

    // Wait until every refusal is accounted for: recorded one by one, or counted in an
    // aggregate event written when its window ended.
    let mut events = Vec::new();
    let mut accounted = 0;
    for _ in 0..600 {
        events = server
            .admin()
            .await
            .list_audit_events(ListAuditEventsRequest {
                after_id: 0,
                limit: 10_000,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .events;
        let aggregated: u64 = events
            .iter()
            .filter(|e| e.caller == "anonymous")
            .filter_map(|e| e.detail.strip_prefix("aggregate: "))
            .filter_map(|d| d.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        let single = events
            .iter()
            .filter(|e| e.caller == "anonymous" && !e.detail.starts_with("aggregate: "))
            .count() as u64;
        accounted = aggregated + single;
        if accounted == flood as u64 {
            eprintln!(
                "audit flood: {flood} refusals stored as {single} events and aggregates of \
                 {aggregated}; {} events in all",
                events.len()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(accounted, flood as u64, "refusals lost: {events:?}");
    // One-by-one events are at most audit_burst per second-long window: far fewer than the
    // flood, however long it took.
    assert!(
        events.len() < flood / 10,
        "the flood was not aggregated: {} events",
        events.len()
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == "admin.join_token" && e.detail.contains("during-the-flood")),
        "the admin action was pushed out: {events:?}"
    );
    assert!(
        events.iter().any(|e| e.kind == "issue.denied"
            && e.caller == "jwt:spiffe://example.org/ns/shop/sa/cart"
            && e.detail.contains("ns/bank/sa/vault")),
        "the authenticated denial was pushed out: {events:?}"
    );
    assert!(
        events.iter().any(|e| e.kind == "authn.refused"
            && e.detail.starts_with("aggregate: ")
            && e.detail.contains("from 127.0.0.1")),
        "no aggregate event: {events:?}"
    );
}

/// A node's Kubernetes token re-attesting in a loop (each attestation issues a node
/// certificate) hits `limits.attestation_per_caller`; another node attests meanwhile.
#[tokio::test]
async fn a_node_token_reattesting_in_a_loop_is_rate_limited() {
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        tokens: Some(tokens.jwks_json()),
        extra_toml:
            "[nodes.kubernetes]\nallowed_service_accounts = [\"signet-system:signet-agent\"]\n\
                     [limits]\nattestation_per_caller = { burst = 2, per_second = 0.01 }\n"
                .into(),
        ..ServerOpts::default()
    })
    .await;
    let node_token = |node: &str| {
        let mut c = tokens.claims("signet-system", "signet-agent");
        c["aud"] = serde_json::json!(["signet-node"]);
        c["kubernetes.io"]["node"] =
            serde_json::json!({"name": node, "uid": "6b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e"});
        tokens.sign(&c)
    };
    let attest = |token: String| {
        let server = &server;
        async move {
            let kc = signet_client::new_key_and_csr().unwrap();
            let req = signet_client::with_bearer(
                AttestRequest {
                    join_token: String::new(),
                    csr: kc.csr_der,
                },
                &token,
            )
            .unwrap();
            NodeClient::new(server.channel().await)
                .attest(req)
                .await
                .map(|r| r.into_inner().node_id)
        }
    };
    let token = node_token("worker-1");
    for _ in 0..2 {
        assert_eq!(attest(token.clone()).await.unwrap(), "k8s-worker-1");
    }
    let e = attest(token).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("k8s-worker-1")
            && e.message().contains("limits.attestation_per_caller"),
        "{}",
        e.message()
    );
    assert!(pushback_ms(&e) > 60_000);
    assert_eq!(
        attest(node_token("worker-2")).await.unwrap(),
        "k8s-worker-2"
    );
}
