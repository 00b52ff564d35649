//! Start-up, restart, configuration and database outages.

use std::path::PathBuf;
use std::time::Duration;

use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::*;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

async fn issue(server: &Server, tokens: &TokenIssuer) -> Result<Vec<String>, tonic::Status> {
    let (csr, _k) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr,
            validity_duration: 300,
            metadata: None,
        },
        &tokens.token("ops", "job"),
    )
    .unwrap();
    server
        .istio()
        .await
        .create_certificate(req)
        .await
        .map(|r| r.into_inner().cert_chain)
}

#[tokio::test]
async fn restart_keeps_the_root_and_a_verifying_ledger() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let opts = |data_dir: Option<PathBuf>| ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        data_dir,
        ..ServerOpts::default()
    };
    let first = Server::start(opts(None)).await;
    let root = first.root_sha256.clone();
    let bundle = first.bundle_pem.clone();
    let chain = issue(&first, &tokens).await.unwrap();
    let data_dir = first.stop().await;

    let second = Server::start(opts(Some(data_dir))).await;
    assert_eq!(second.root_sha256, root, "same root after restart");
    assert_eq!(second.bundle_pem, bundle);
    // A certificate issued before the restart still verifies against the bundle.
    openssl_verify(&chain, &second.bundle_pem).unwrap();
    issue(&second, &tokens).await.unwrap();
    // Two server TLS certs and two issued, one unbroken chain across both runs.
    assert_eq!(second.cert_count().await, 4);
    let out = second.signetctl(&["ledger", "verify", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"ok": true, "rows": 4, "jwt_svids": 0})
    );
}

#[tokio::test]
async fn replicas_sharing_postgres_share_one_root_and_one_chain() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let start = || {
        Server::start(ServerOpts {
            database_url: Some(url.clone()),
            tokens: Some(tokens.jwks_json()),
            // Replicas share the key-encryption key, as the docs require.
            extra_toml: String::new(),
            ..ServerOpts::default()
        })
    };
    let a = start().await;
    // The second replica reads the root the first one stored; give it the same KEK.
    let kek = std::fs::read_to_string(a.data_dir.join("kek")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kek_path = dir.path().join("kek");
    std::fs::write(&kek_path, kek).unwrap();
    let b = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: format!("[ca]\nkek_file = \"{}\"\n", kek_path.display()),
        ..ServerOpts::default()
    })
    .await;
    assert_eq!(a.root_sha256, b.root_sha256);
    let mut tasks = Vec::new();
    for s in [&a, &b] {
        for _ in 0..10 {
            tasks.push(issue(s, &tokens));
        }
    }
    for r in futures::future::join_all(tasks).await {
        r.unwrap();
    }
    let out = b.signetctl(&["ledger", "verify", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"ok": true, "rows": 22, "jwt_svids": 0})
    );
}

#[tokio::test]
async fn database_outage_answers_unavailable_and_recovers() {
    // A PostgreSQL of its own, so stopping it disturbs no other test.
    if std::env::var("SIGNET_TEST_DATABASE_URL").is_err()
        && std::env::var("CI").as_deref() != Ok("true")
    {
        eprintln!("SKIPPED: PostgreSQL tests need scripts/test");
        return;
    }
    let pgdir = tempfile::tempdir().unwrap();
    let pg = |cmd: &str| {
        let out = std::process::Command::new(workspace().join("scripts/pg"))
            .args([cmd, pgdir.path().to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/pg {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let url = pg("start");
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        ..ServerOpts::default()
    })
    .await;
    issue(&server, &tokens).await.unwrap();

    pg("stop");
    let err = issue(&server, &tokens).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("not issued") || err.message().contains("retry"),
        "{}",
        err.message()
    );
    let (code, body) = server.http_get("/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(server.http_get("/healthz").await.0, 200);

    let url2 = pg("start");
    assert_eq!(url2, url, "PostgreSQL came back on the same port");
    // Service resumes by itself.
    let mut ok = false;
    for _ in 0..50 {
        if issue(&server, &tokens).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ok, "issuance resumed after the database returned");
    assert_eq!(server.http_get("/readyz").await.0, 200);
    // Only committed certificates exist: server cert + 2 issued.
    let out = server.signetctl(&["ledger", "verify", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"ok": true, "rows": 3, "jwt_svids": 0})
    );
    drop(server);
    pg("stop");
}

#[tokio::test]
async fn zero_config_start_uses_sqlite_under_signet_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(bin("signet-server"))
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut out = Vec::new();
    while let Some(l) = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
    {
        let done = l == "ready";
        out.push(l);
        if done {
            break;
        }
    }
    let text = out.join("\n");
    assert!(text.contains("trust domain example.org"), "{text}");
    assert!(text.contains("root SHA-256:"), "{text}");
    assert!(text.contains("signet-data/bundle.pem"), "{text}");
    let data = dir.path().join("signet-data");
    assert!(data.join("signet.db").exists());
    assert!(data.join("bundle.pem").exists());
    use std::os::unix::fs::PermissionsExt;
    let kek_mode = std::fs::metadata(data.join("kek"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(kek_mode & 0o777, 0o600);
    let out = std::process::Command::new(bin("signetctl"))
        .args(["ledger", "verify"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test]
async fn configuration_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "trust_domain = \"example.org\"\n[ca]\nmax_tll = \"1h\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(bin("signet-server"))
        .args(["--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_tll"), "{err}");

    let out = std::process::Command::new(bin("signet-server"))
        .env("SIGNET_CA__DEFAULT_TTL", "forever")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("default_ttl"), "{err}");
}

#[tokio::test]
async fn environment_overrides_the_file() {
    let server = Server::start(ServerOpts {
        env: vec![("SIGNET_TRUST_DOMAIN".into(), "corp.example".into())],
        ..ServerOpts::default()
    })
    .await;
    assert!(
        server.stdout[0].contains("corp.example"),
        "{:?}",
        server.stdout
    );
    let b = server
        .native()
        .await
        .get_bundle(signet_proto::ca::GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.trust_domain, "corp.example");
}
