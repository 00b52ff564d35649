//! The SPIFFE bundle endpoint, end to end: served over HTTPS with the server's own X509-SVID
//! (profile https_spiffe), fetched by a client that authenticates it with the bundle obtained
//! out of band and checks the SPIFFE ID `spiffe://<td>/signet/server` (and refuses another ID);
//! the document is a strict SPIFFE bundle whose `x5c` root is the server's root (checked with
//! openssl). The sequence increasing on a change is a unit test of the handler
//! (`federation::tests`), until rotation can change the roots of a running server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use signet_client::tls::SignetServerVerifier;
use signet_tests::{Server, ServerOpts};
use signet_types::SpiffeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub(crate) async fn fetch(
    addr: SocketAddr,
    bundle_pem: &[u8],
    expected: SpiffeId,
) -> Result<(String, String), String> {
    let verifier = SignetServerVerifier::new(bundle_pem, expected).map_err(|e| e.to_string())?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    fetch_with(addr, cfg).await
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `GET /` over TLS with `cfg` (HTTP/1.1); the response's head and body.
async fn fetch_with(
    addr: SocketAddr,
    mut cfg: rustls::ClientConfig,
) -> Result<(String, String), String> {
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(b"GET / HTTP/1.1\r\nHost: signet\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8(out).map_err(|e| e.to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    Ok((head.to_owned(), body.to_owned()))
}

#[tokio::test]
async fn the_bundle_endpoint_serves_a_spiffe_bundle_over_spiffe_tls() {
    let server =
        Server::start(ServerOpts {
            extra_toml:
                "[federation]\nbundle_endpoint_listen = \"127.0.0.1:0\"\nrefresh_hint = \"2m\"\n"
                    .into(),
            ..ServerOpts::default()
        })
        .await;
    let addr = endpoint_of(&server);
    let td = &server.trust_domain;
    let server_id: SpiffeId = format!("spiffe://{td}/signet/server").parse().unwrap();

    // The right SPIFFE ID: served.
    let (head, body) = fetch(addr, &server.bundle_pem, server_id)
        .await
        .expect("fetch");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let doc: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    // Strictly the SPIFFE bundle shape.
    let obj = doc.as_object().unwrap();
    let mut members: Vec<&str> = obj.keys().map(String::as_str).collect();
    members.sort_unstable();
    assert_eq!(members, ["keys", "spiffe_refresh_hint", "spiffe_sequence"]);
    assert_eq!(doc["spiffe_refresh_hint"], 120);
    assert!(doc["spiffe_sequence"].as_u64().unwrap() >= signet_tests::now_unix() as u64 - 60);
    let keys = doc["keys"].as_array().unwrap();
    // One root, then the JWT-SVID signing key (published as a jwt-svid JWK with kid and alg).
    assert_eq!(keys.len(), 2, "{doc}");
    assert_eq!(keys[1]["use"], "jwt-svid");
    assert_eq!(keys[1]["alg"], "ES256");
    assert!(keys[1]["kid"].as_str().is_some_and(|k| !k.is_empty()));
    let k = keys[0].as_object().unwrap();
    assert_eq!(k["use"], "x509-svid");
    assert_eq!(k["kty"], "EC");
    for m in k.keys() {
        assert!(
            ["use", "kty", "crv", "x", "y", "x5c"].contains(&m.as_str()),
            "unexpected member {m}"
        );
    }
    let x5c = k["x5c"].as_array().unwrap();
    assert_eq!(x5c.len(), 1);
    // The one reader of the format accepts it: one x509 authority, the SPIFFE members set.
    let parsed = signet_pki::SpiffeBundle::parse(body.trim().as_bytes()).unwrap();
    assert_eq!(parsed.x509_authorities.len(), 1);
    assert_eq!(parsed.refresh_hint, Some(Duration::from_secs(120)));
    assert_eq!(parsed.sequence, doc["spiffe_sequence"].as_u64());
    let der = base64::engine::general_purpose::STANDARD
        .decode(x5c[0].as_str().unwrap())
        .unwrap();
    // openssl reads it, and it is the server's root (the fingerprint the server printed).
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("root.der");
    std::fs::write(&p, &der).unwrap();
    let o = std::process::Command::new("openssl")
        .args([
            "x509",
            "-inform",
            "DER",
            "-noout",
            "-fingerprint",
            "-sha256",
            "-in",
        ])
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let fp = String::from_utf8_lossy(&o.stdout)
        .trim()
        .rsplit('=')
        .next()
        .unwrap()
        .replace(':', "")
        .to_ascii_lowercase();
    assert_eq!(
        fp,
        server.root_sha256.replace(':', "").to_ascii_lowercase(),
        "the x5c root is the server's root"
    );
    let o = std::process::Command::new("openssl")
        .args([
            "x509",
            "-inform",
            "DER",
            "-noout",
            "-ext",
            "subjectAltName,basicConstraints",
            "-in",
        ])
        .arg(&p)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("CA:TRUE"), "{text}");

    // A client expecting another SPIFFE ID refuses the connection before sending anything.
    let other: SpiffeId = format!("spiffe://{td}/not/the/server").parse().unwrap();
    let err = fetch(addr, &server.bundle_pem, other).await.unwrap_err();
    assert!(
        err.contains("not/the/server") || err.contains("SPIFFE"),
        "{err}"
    );

    // A root rotation: `ca prepare --root` puts a second root in the bundle at once; the
    // endpoint serves both, with a higher spiffe_sequence.
    let server_id: SpiffeId = format!("spiffe://{td}/signet/server").parse().unwrap();
    let before = doc["spiffe_sequence"].as_u64().unwrap();
    let out = server.signetctl(&["ca", "prepare", "--root"]);
    assert!(out.status.success(), "{out:?}");
    let mut after = None;
    for _ in 0..50 {
        let (_, body) = fetch(addr, &server.bundle_pem, server_id.clone())
            .await
            .expect("fetch");
        let d: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
        let roots = d["keys"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["use"] == "x509-svid")
            .count();
        if roots == 2 {
            after = Some(d);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let after = after.expect("the prepared root in the SPIFFE bundle");
    assert!(
        after["spiffe_sequence"].as_u64().unwrap() > before,
        "{before} then {after}"
    );

    server.stop().await;
}

fn endpoint_of(server: &Server) -> SocketAddr {
    server
        .stdout
        .iter()
        .find_map(|l| l.trim().strip_prefix("SPIFFE bundle endpoint: https://"))
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("no bundle endpoint in {:?}", server.stdout))
        .parse()
        .unwrap()
}

/// Waits for the peer to close `tcp` (EOF or reset), at most `limit`; the time it took.
async fn closed_within(tcp: &mut tokio::net::TcpStream, limit: Duration) -> Duration {
    let t0 = std::time::Instant::now();
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(limit, tcp.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return t0.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the connection stayed open longer than {limit:?}"),
        }
    }
}

#[tokio::test]
async fn the_bundle_endpoint_is_bounded_and_timed_out() {
    let server = Server::start(ServerOpts {
        extra_toml: "[federation]\nbundle_endpoint_listen = \"127.0.0.1:0\"\n\
                     [limits]\nhttp_max_connections = 2\nhttp_max_connections_per_source = 2\n\
                     tls_handshake_timeout = \"2s\"\n"
            .into(),
        ..ServerOpts::default()
    })
    .await;
    let addr = endpoint_of(&server);
    // Two connections that never start TLS hold both slots...
    let mut a = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut b = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ... so a third is closed at once, never queued.
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let t = closed_within(&mut c, Duration::from_secs(5)).await;
    assert!(t < Duration::from_millis(1500), "closed after {t:?}");
    // The silent ones are dropped at the handshake timeout.
    let t = closed_within(&mut a, Duration::from_secs(10)).await;
    assert!(t >= Duration::from_millis(1000), "closed after {t:?}");
    closed_within(&mut b, Duration::from_secs(5)).await;
    // And the endpoint serves again.
    let td = &server.trust_domain;
    let id: SpiffeId = format!("spiffe://{td}/signet/server").parse().unwrap();
    let (head, _) = fetch(addr, &server.bundle_pem, id).await.expect("fetch");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    server.stop().await;
}

#[tokio::test]
async fn the_https_web_profile_serves_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::IpAddress([127, 0, 0, 1].into())];
    let cert = params.self_signed(&key).unwrap();
    let cert_file = dir.path().join("web.pem");
    let key_file = dir.path().join("web.key");
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let server = Server::start(ServerOpts {
        extra_toml: format!(
            "[federation]\nbundle_endpoint_listen = \"127.0.0.1:0\"\n\
             bundle_endpoint_profile = \"https_web\"\nweb_cert_file = \"{}\"\n\
             web_key_file = \"{}\"\n",
            cert_file.display(),
            key_file.display()
        ),
        ..ServerOpts::default()
    })
    .await;
    let addr = endpoint_of(&server);
    // A Web PKI client trusting (only) the configured certificate gets the bundle...
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let web = || {
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_no_client_auth()
    };
    let (head, body) = fetch_with(addr, web()).await.expect("fetch");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let doc: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(doc["keys"][0]["use"], "x509-svid");
    // ... and a client expecting Signet's own SVID refuses that certificate.
    let td = &server.trust_domain;
    let id: SpiffeId = format!("spiffe://{td}/signet/server").parse().unwrap();
    assert!(fetch(addr, &server.bundle_pem, id).await.is_err());
    server.stop().await;
}
