//! The JWT-SVID signing keys against the real server: `signetctl ca status` shows the active
//! JWT key, `ca prepare --kind jwt` publishes a new one that `ca activate` refuses until its
//! propagation window has passed, `ca taint` of the active JWT key replaces it at once (the old
//! one listed as tainted in the bundle); the native bundle carries the keys; OIDC discovery and
//! its JWKS are served over plain HTTP (`http_listen`) and over TLS (`oidc_listen`) with the
//! configured issuer, whatever the Host header says.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use signet_proto::ca::GetBundleRequest;
use signet_tests::{Server, ServerOpts, bin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ISSUER: &str = "https://oidc.example.org/signet";

pub(crate) fn status(server: &Server) -> serde_json::Value {
    let out = server.signetctl(&["ca", "status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

pub(crate) fn jwt_slots(st: &serde_json::Value) -> Vec<serde_json::Value> {
    st["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "jwt")
        .cloned()
        .collect()
}

/// `GET path` over `io` with a hostile Host header; the status code, head and body.
async fn get_over<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut io: S,
    path: &str,
) -> (u16, String, String) {
    io.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: evil.example.com\r\nX-Forwarded-Host: evil.example.com\r\n\
             X-Forwarded-Proto: http\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), io.read_to_end(&mut out))
        .await
        .expect("answered in time")
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_owned(), body.to_owned())
}

async fn plain_get(addr: SocketAddr, path: &str) -> (u16, String, serde_json::Value) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (code, head, body) = get_over(tcp, path).await;
    (
        code,
        head,
        serde_json::from_str(body.trim()).unwrap_or_default(),
    )
}

/// Checks the discovery document and JWKS served at `get` against `kids` (the published JWT
/// key IDs).
fn check_oidc(doc: &serde_json::Value, jwks: &serde_json::Value, kids: &[String]) {
    assert_eq!(doc["issuer"], ISSUER, "{doc}");
    assert_eq!(doc["jwks_uri"], format!("{ISSUER}/keys"));
    assert_eq!(
        doc["response_types_supported"],
        serde_json::json!(["id_token"])
    );
    assert_eq!(
        doc["subject_types_supported"],
        serde_json::json!(["public"])
    );
    assert_eq!(
        doc["id_token_signing_alg_values_supported"],
        serde_json::json!(["ES256"])
    );
    assert!(!doc.to_string().contains("evil"), "{doc}");
    let keys = jwks["keys"].as_array().unwrap();
    let mut served: Vec<String> = keys
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect();
    served.sort();
    let mut want = kids.to_vec();
    want.sort();
    assert_eq!(served, want, "{jwks}");
    for k in keys {
        assert_eq!(k["use"], "sig");
        assert_eq!(k["alg"], "ES256");
        assert_eq!(k["kty"], "EC");
        assert_eq!(k["crv"], "P-256");
        assert!(k["x"].is_string() && k["y"].is_string());
    }
}

#[tokio::test]
async fn jwt_keys_are_operated_published_and_discoverable() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::IpAddress([127, 0, 0, 1].into())];
    let cert = params.self_signed(&key).unwrap();
    let cert_file = dir.path().join("oidc.pem");
    let key_file = dir.path().join("oidc.key");
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let server = Server::start(ServerOpts {
        extra_toml: format!(
            "[jwt_svid]\nissuer = \"{ISSUER}\"\nkey_propagation = \"1h\"\n\
             oidc_listen = \"127.0.0.1:0\"\noidc_tls_cert_file = \"{}\"\n\
             oidc_tls_key_file = \"{}\"\n",
            cert_file.display(),
            key_file.display()
        ),
        ..ServerOpts::default()
    })
    .await;

    // One active JWT key, shown with its kind, and named as the JWT signing key.
    let st = status(&server);
    let jwt = jwt_slots(&st);
    assert_eq!(jwt.len(), 1, "{st}");
    assert_eq!(jwt[0]["state"], "active");
    assert_eq!(jwt[0]["algorithm"], "ES256");
    let first = jwt[0]["key_id"].as_str().unwrap().to_owned();
    assert_eq!(st["active_jwt_key_id"], first.as_str());
    assert_ne!(st["active_key_id"], first.as_str());
    let text = server.signetctl(&["ca", "status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("jwt signing: {first}")), "{text}");

    // The native bundle carries it; the PEM bundle does not.
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.jwt_keys.len(), 1);
    assert_eq!(b.jwt_keys[0].key_id, first);
    assert_eq!(b.jwt_keys[0].alg, "ES256");
    assert!(!b.jwt_keys[0].public_key.is_empty());
    assert!(b.jwt_keys[0].not_after > 0);
    let pem = std::fs::read_to_string(server.bundle_path()).unwrap();
    assert_eq!(pem.matches("BEGIN CERTIFICATE").count(), b.roots.len());

    // Prepared: published at once, refused activation before its propagation window.
    let out = server.signetctl(&["ca", "prepare", "--kind", "jwt"]);
    assert!(out.status.success(), "{out:?}");
    let second = String::from_utf8_lossy(&out.stdout)
        .trim()
        .strip_prefix("prepared ")
        .unwrap()
        .to_owned();
    let st = status(&server);
    assert!(
        jwt_slots(&st)
            .iter()
            .any(|s| s["key_id"] == second.as_str() && s["state"] == "prepared"),
        "{st}"
    );
    let out = server.signetctl(&["ca", "activate", &second]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("jwt_svid.key_propagation") && err.contains("may be activated from"),
        "{err}"
    );
    assert_eq!(status(&server)["active_jwt_key_id"], first.as_str());

    // OIDC discovery over plain HTTP (behind an ingress): the configured issuer, every
    // published key (the prepared one too), whatever the Host header says.
    let (code, head, doc) =
        plain_get(server.http, "/signet/.well-known/openid-configuration").await;
    assert_eq!(code, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("cache-control: public, max-age="),
        "{head}"
    );
    let (code, _, jwks) = plain_get(server.http, "/signet/keys").await;
    assert_eq!(code, 200);
    check_oidc(&doc, &jwks, &[first.clone(), second.clone()]);
    assert_eq!(
        plain_get(server.http, "/.well-known/openid-configuration")
            .await
            .0,
        404
    );

    // Tainting the active JWT key: the prepared one signs at once, the old one is tainted.
    let out = server.signetctl(&["ca", "taint", &first]);
    assert!(out.status.success(), "{out:?}");
    let st = status(&server);
    assert_eq!(st["active_jwt_key_id"], second.as_str(), "{st}");
    let old = jwt_slots(&st)
        .into_iter()
        .find(|s| s["key_id"] == first.as_str())
        .unwrap();
    assert_eq!(old["state"], "retired");
    assert_eq!(old["tainted"], true);
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        b.tainted_key_ids.contains(&first),
        "{:?}",
        b.tainted_key_ids
    );
    assert!(b.jwt_keys.iter().any(|k| k.key_id == second));

    // The same documents over TLS (oidc_listen), with the configured certificate.
    let addr: SocketAddr = server
        .stdout
        .iter()
        .find_map(|l| l.trim().strip_prefix("OIDC discovery (TLS): https://"))
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("no OIDC listener in {:?}", server.stdout))
        .parse()
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tls_get = |path: &'static str| {
        let connector = connector.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let tls = connector.connect(name, tcp).await.unwrap();
            let (code, head, body) = get_over(tls, path).await;
            assert_eq!(code, 200, "{head}");
            serde_json::from_str::<serde_json::Value>(body.trim()).unwrap()
        }
    };
    let doc = tls_get("/signet/.well-known/openid-configuration").await;
    let jwks = tls_get("/signet/keys").await;
    check_oidc(&doc, &jwks, &[first.clone(), second.clone()]);
    server.stop().await;
}

/// Review findings F6 and F10: an OIDC certificate with another certificate's key is refused at
/// start, naming both files (rustls would have served it and failed every handshake), and so is
/// a missing file; either way before the server creates anything in its data directory.
#[test]
fn oidc_tls_files_are_checked_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["oidc.example.org".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(p("oidc.pem"), cert.pem()).unwrap();
    std::fs::write(p("other.key"), other.serialize_pem()).unwrap();
    for (key_file, want) in [
        ("other.key", "is not the key of the first certificate"),
        ("missing.key", "missing.key"),
    ] {
        let data = p(&format!("data-{key_file}"));
        let cfg = p("server.toml");
        std::fs::write(
            &cfg,
            format!(
                "data_dir = \"{}\"\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\
                 [jwt_svid]\nissuer = \"{ISSUER}\"\noidc_listen = \"127.0.0.1:0\"\n\
                 oidc_tls_cert_file = \"{}\"\noidc_tls_key_file = \"{}\"\n",
                data.display(),
                p("oidc.pem").display(),
                p(key_file).display()
            ),
        )
        .unwrap();
        let out = std::process::Command::new(bin("signet-server"))
            .args(["--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
        assert!(
            err.contains("oidc_tls_key_file") || err.contains(key_file),
            "{err}"
        );
        let left: Vec<_> = std::fs::read_dir(&data)
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{key_file}: left behind {left:?}");
    }
}
