//! [`fetch`] against a real TLS server on 127.0.0.1 (tokio-rustls and a hand-written HTTP/1.1
//! responder), with certificates made by rcgen.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, date_time_ymd,
};
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use signet_pki::ParsedCert;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::*;
use crate::clock::fake::FakeClock;

/// 2027-01-15: the certificates below are valid 2020–2030 unless a test says otherwise.
const NOW: i64 = 1_800_000_000;
const ENDPOINT_ID: &str = "spiffe://other.org/signet/server";

fn clock() -> Arc<dyn Clock> {
    Arc::new(FakeClock::at_unix(NOW))
}

fn limits() -> FetchLimits {
    FetchLimits {
        connect_timeout: Duration::from_secs(5),
        total_timeout: Duration::from_secs(10),
        max_bytes: MAX_DOCUMENT_BYTES,
    }
}

/// A root CA: its DER and what signs with it.
struct Ca {
    der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, name.to_owned());
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = date_time_ymd(2020, 1, 1);
    p.not_after = date_time_ymd(2030, 1, 1);
    let der = p.self_signed(&key).unwrap().der().to_vec();
    Ca {
        der,
        issuer: Issuer::new(p, key),
    }
}

/// A server certificate (EKU serverAuth) issued by `ca`: its DER and key.
fn leaf(ca: &Ca, sans: Vec<SanType>, not_after: (i32, u8, u8)) -> (Vec<u8>, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.subject_alt_names = sans;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.not_before = date_time_ymd(2020, 1, 1);
    p.not_after = date_time_ymd(not_after.0, not_after.1, not_after.2);
    let der = p.signed_by(&key, &ca.issuer).unwrap().der().to_vec();
    (der, key)
}

fn uri(s: &str) -> SanType {
    SanType::URI(s.try_into().unwrap())
}

fn svid(ca: &Ca, id: &str) -> (Vec<u8>, KeyPair) {
    leaf(ca, vec![uri(id)], (2030, 1, 1))
}

fn spiffe_profile(anchor: &Ca) -> Profile {
    Profile::HttpsSpiffe {
        endpoint_id: ENDPOINT_ID.parse().unwrap(),
        trust_anchors: vec![anchor.der.clone()],
    }
}

/// A bundle document holding `root`.
fn document(root: &[u8]) -> Vec<u8> {
    SpiffeBundle {
        x509_authorities: vec![ParsedCert::from_der(root).unwrap()],
        sequence: Some(7),
        ..SpiffeBundle::default()
    }
    .to_json()
    .unwrap()
    .to_string()
    .into_bytes()
}

/// What the test endpoint answers.
#[derive(Clone)]
enum Reply {
    /// 200 with this body (and its Content-Length).
    Body(Vec<u8>),
    /// This status line and extra header lines, empty body.
    Status(&'static str, Vec<&'static str>),
    /// 200, chunked, 64 KiB chunks for as long as the client reads (at most 256 MiB).
    Endless,
    /// 200 declaring this Content-Length, then nothing.
    Declared(u64),
    /// Reads the request and never answers (at most 30 s).
    Silent,
}

/// The test endpoint: what it received and how much body it wrote.
struct Endpoint {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    written: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Endpoint {
    fn url(&self, host: &str, path: &str) -> url::Url {
        format!("https://{host}:{}{path}", self.addr.port())
            .parse()
            .unwrap()
    }
}

async fn endpoint(chain: Vec<Vec<u8>>, key: &KeyPair, reply: Reply) -> Endpoint {
    let certs = chain.into_iter().map(CertificateDer::from).collect();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let written = Arc::new(AtomicUsize::new(0));
    let (h, w) = (Arc::clone(&heads), Arc::clone(&written));
    let task = tokio::spawn(async move {
        // A test makes a handful of connections at most.
        for _ in 0..8 {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, reply, h, w) = (acceptor.clone(), reply.clone(), h.clone(), w.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                h.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let _ = respond(&mut tls, reply, &w).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    Endpoint {
        addr,
        heads,
        written,
        task,
    }
}

async fn respond(
    tls: &mut tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    reply: Reply,
    written: &AtomicUsize,
) -> std::io::Result<()> {
    match reply {
        Reply::Body(body) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            );
            tls.write_all(head.as_bytes()).await?;
            tls.write_all(&body).await?;
            written.fetch_add(body.len(), Ordering::Relaxed);
        }
        Reply::Status(line, headers) => {
            let mut head = format!("HTTP/1.1 {line}\r\n");
            for h in headers {
                head.push_str(h);
                head.push_str("\r\n");
            }
            head.push_str("Content-Length: 0\r\nConnection: close\r\n\r\n");
            tls.write_all(head.as_bytes()).await?;
        }
        Reply::Endless => {
            tls.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await?;
            let chunk = [b' '; 64 * 1024];
            for _ in 0..4096 {
                tls.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                tls.write_all(&chunk).await?;
                tls.write_all(b"\r\n").await?;
                written.fetch_add(chunk.len(), Ordering::Relaxed);
            }
        }
        Reply::Declared(n) => {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n");
            tls.write_all(head.as_bytes()).await?;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Reply::Silent => tokio::time::sleep(Duration::from_secs(30)).await,
    }
    tls.flush().await
}

async fn spiffe_endpoint(ca: &Ca, reply: Reply) -> Endpoint {
    let (cert, key) = svid(ca, ENDPOINT_ID);
    endpoint(vec![cert], &key, reply).await
}

#[tokio::test]
async fn https_spiffe_endpoint_is_fetched() {
    let ca = ca("other.org");
    let doc = document(&ca.der);
    let ep = spiffe_endpoint(&ca, Reply::Body(doc.clone())).await;
    let url = ep.url("127.0.0.1", "/bundle?v=1");
    let got = fetch(&url, &spiffe_profile(&ca), &limits(), &clock())
        .await
        .unwrap();
    assert_eq!(got.document, doc, "the raw document as received");
    assert_eq!(got.bundle.x509_authorities.len(), 1);
    assert_eq!(got.bundle.x509_authorities[0].der(), ca.der.as_slice());
    assert_eq!(got.bundle.sequence, Some(7));
    let heads = ep.heads.lock().unwrap().clone();
    let [head] = heads.as_slice() else {
        panic!("one request expected: {heads:?}")
    };
    assert!(head.starts_with("GET /bundle?v=1 HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("host: 127.0.0.1:{}\r\n", ep.addr.port())),
        "{head}"
    );
}

#[tokio::test]
async fn https_spiffe_refuses_another_spiffe_id_naming_both() {
    let ca = ca("other.org");
    let (cert, key) = svid(&ca, "spiffe://other.org/workload");
    let ep = endpoint(vec![cert], &key, Reply::Body(document(&ca.der))).await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &limits(),
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "spiffe_id", "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(
            "the bundle endpoint presented spiffe://other.org/workload, expected \
             spiffe://other.org/signet/server"
        ),
        "{msg}"
    );
    assert!(ep.heads.lock().unwrap().is_empty(), "no request was sent");

    // Two URI SANs, one of them right, are refused too.
    let (cert, key) = leaf(
        &ca,
        vec![uri(ENDPOINT_ID), uri("spiffe://other.org/x")],
        (2030, 1, 1),
    );
    let ep = endpoint(vec![cert], &key, Reply::Body(document(&ca.der))).await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &limits(),
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "spiffe_id", "{err}");
    assert!(err.to_string().contains("2 URI SANs"), "{err}");
}

#[tokio::test]
async fn https_spiffe_refuses_a_chain_to_another_root() {
    let (held, other) = (ca("other.org"), ca("impostor"));
    let ep = spiffe_endpoint(&other, Reply::Body(document(&other.der))).await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&held),
        &limits(),
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "tls", "{err}");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

#[tokio::test]
async fn https_spiffe_refuses_an_expired_svid_at_the_clocks_time() {
    let ca = ca("other.org");
    let (cert, key) = leaf(&ca, vec![uri(ENDPOINT_ID)], (2026, 1, 1));
    let ep = endpoint(vec![cert], &key, Reply::Body(document(&ca.der))).await;
    let url = ep.url("127.0.0.1", "/");
    let err = fetch(&url, &spiffe_profile(&ca), &limits(), &clock())
        .await
        .unwrap_err();
    assert_eq!(err.label(), "tls", "{err}");
    assert!(err.to_string().contains("expired"), "{err}");
    // The same certificate at a time it was valid: the clock decides, not the wall clock.
    let before: Arc<dyn Clock> = Arc::new(FakeClock::at_unix(1_700_000_000));
    fetch(&url, &spiffe_profile(&ca), &limits(), &before)
        .await
        .unwrap();
}

#[tokio::test]
async fn https_spiffe_without_trust_anchors_is_refused_before_connecting() {
    let profile = Profile::HttpsSpiffe {
        endpoint_id: ENDPOINT_ID.parse().unwrap(),
        trust_anchors: vec![],
    };
    let url = "https://127.0.0.1:1/".parse().unwrap();
    let err = fetch(&url, &profile, &limits(), &clock())
        .await
        .unwrap_err();
    assert_eq!(err.label(), "tls", "{err}");
    assert!(err.to_string().contains("no trust anchors"), "{err}");
}

/// An `https_web` endpoint for `localhost` whose CA is in a PEM file, and the roots read from it.
async fn web_endpoint(reply: Reply) -> (Endpoint, Profile, tempfile::TempDir) {
    let ca = ca("Web CA");
    let (cert, key) = leaf(
        &ca,
        vec![SanType::DnsName("localhost".try_into().unwrap())],
        (2030, 1, 1),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ca.pem");
    let pem = pem::encode(&pem::Pem::new("CERTIFICATE", ca.der.clone()));
    std::fs::write(&file, pem).unwrap();
    let roots = web_roots(Some(&file)).unwrap();
    let ep = endpoint(vec![cert], &key, reply).await;
    (
        ep,
        Profile::HttpsWeb {
            roots: Arc::new(roots),
        },
        dir,
    )
}

#[tokio::test]
async fn https_web_with_a_ca_file_and_the_host_name_is_accepted() {
    let doc = document(&ca("other.org").der);
    let (ep, profile, _dir) = web_endpoint(Reply::Body(doc.clone())).await;
    let got = fetch(&ep.url("localhost", "/"), &profile, &limits(), &clock())
        .await
        .unwrap();
    assert_eq!(got.document, doc);
}

#[tokio::test]
async fn https_web_refuses_a_certificate_for_another_host() {
    let doc = document(&ca("other.org").der);
    let (ep, profile, _dir) = web_endpoint(Reply::Body(doc)).await;
    let err = fetch(&ep.url("127.0.0.1", "/"), &profile, &limits(), &clock())
        .await
        .unwrap_err();
    assert_eq!(err.label(), "tls", "{err}");
    assert!(err.to_string().contains("not valid for name"), "{err}");
}

#[test]
fn web_roots_are_the_compiled_in_ones_or_a_ca_files() {
    assert!(web_roots(None).unwrap().len() > 50);
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    assert!(matches!(
        web_roots(Some(&missing)),
        Err(RootsError::Read { .. })
    ));
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no PEM here\n").unwrap();
    assert!(matches!(
        web_roots(Some(&empty)),
        Err(RootsError::Empty { .. })
    ));
}

#[tokio::test]
async fn urls_other_than_https_are_refused_at_parse_time() {
    let ca = ca("other.org");
    for (url, says) in [
        ("http://127.0.0.1:8443/", "is http"),
        ("ftp://127.0.0.1/", "scheme"),
        ("https://user:pw@127.0.0.1/", "user name"),
    ] {
        let err = fetch(
            &url.parse().unwrap(),
            &spiffe_profile(&ca),
            &limits(),
            &clock(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.label(), "url", "{url}: {err}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}

#[tokio::test]
async fn redirects_are_not_followed_and_name_their_location() {
    let ca = ca("other.org");
    let ep = spiffe_endpoint(
        &ca,
        Reply::Status("302 Found", vec!["Location: https://elsewhere.example/b"]),
    )
    .await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &limits(),
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "http", "{err}");
    assert!(
        matches!(&err, FetchError::Redirect { status, location: Some(l), .. }
            if status.as_u16() == 302 && l == "https://elsewhere.example/b"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("https://elsewhere.example/b"),
        "{err}"
    );
    assert_eq!(
        ep.heads.lock().unwrap().len(),
        1,
        "one request, not followed"
    );
}

#[tokio::test]
async fn statuses_other_than_200_are_refused() {
    let ca = ca("other.org");
    let ep = spiffe_endpoint(&ca, Reply::Status("500 Internal Server Error", vec![])).await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &limits(),
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "http", "{err}");
    assert!(
        matches!(&err, FetchError::Http { status, .. } if status.as_u16() == 500),
        "{err:?}"
    );
}

#[tokio::test]
async fn oversized_bodies_are_refused_without_being_read_whole() {
    let ca = ca("other.org");
    let small = FetchLimits {
        max_bytes: 100 * 1024,
        ..limits()
    };
    // Chunked and endless: reading stops past the limit.
    let ep = spiffe_endpoint(&ca, Reply::Endless).await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &small,
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "too_large", "{err}");
    // The endpoint stops once the connection is gone; give it a moment to notice.
    let mut written = 0;
    for _ in 0..50 {
        let before = ep.written.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(20)).await;
        written = ep.written.load(Ordering::Relaxed);
        if written == before {
            break;
        }
    }
    assert!(
        written < 32 << 20,
        "the endpoint wrote {written} bytes of 256 MiB: the client stopped reading early"
    );

    // A declared length over the limit is refused before any of the body is read.
    let ep = spiffe_endpoint(&ca, Reply::Declared(10 << 20)).await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &small,
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "too_large", "{err}");
}

#[tokio::test]
async fn a_slow_endpoint_times_out() {
    let ca = ca("other.org");
    let ep = spiffe_endpoint(&ca, Reply::Silent).await;
    let quick = FetchLimits {
        total_timeout: Duration::from_millis(500),
        ..limits()
    };
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &quick,
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "timeout", "{err}");

    // A body that never comes after its header times out the same way.
    let ep = spiffe_endpoint(&ca, Reply::Declared(100)).await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &quick,
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "timeout", "{err}");
}

#[tokio::test]
async fn documents_the_reader_refuses_are_refused() {
    let ca = ca("other.org");
    let ep = spiffe_endpoint(&ca, Reply::Body(b"{\"keys\": [".to_vec())).await;
    let err = fetch(
        &ep.url("127.0.0.1", "/"),
        &spiffe_profile(&ca),
        &limits(),
        &clock(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.label(), "document", "{err}");
    assert!(
        matches!(
            &err,
            FetchError::Document {
                source: BundleError::Json(_),
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_bundle_without_keys_is_refused() {
    let ca = ca("other.org");
    for body in [
        &b"{\"keys\":[]}"[..],
        b"{\"keys\":[{\"use\":\"something-else\",\"kty\":\"EC\"}],\"spiffe_sequence\":2}",
    ] {
        let ep = spiffe_endpoint(&ca, Reply::Body(body.to_vec())).await;
        let err = fetch(
            &ep.url("127.0.0.1", "/"),
            &spiffe_profile(&ca),
            &limits(),
            &clock(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.label(), "empty", "{err}");
    }
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let ca = ca("other.org");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let url = format!("https://127.0.0.1:{port}/").parse().unwrap();
    let err = fetch(&url, &spiffe_profile(&ca), &limits(), &clock())
        .await
        .unwrap_err();
    assert_eq!(err.label(), "connect", "{err}");
}
