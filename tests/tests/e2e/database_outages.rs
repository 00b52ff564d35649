//! The server and its PostgreSQL going away and coming back, each on a PostgreSQL of its own
//! (`scripts/pg`, restarted on the same port): the first issuance after a database restart
//! succeeds on its first try (broken sessions are replaced before use), and a server started
//! while its database is down serves `/healthz`, says on `/readyz` and in its log why it waits
//! (the connection's real error, never "pool timed out"), then starts when the database does.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::*;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A PostgreSQL cluster of this test's own, stopped when dropped.
struct OwnPostgres {
    dir: tempfile::TempDir,
}

impl OwnPostgres {
    /// None (skipped) where PostgreSQL tests cannot run, as the other PostgreSQL tests.
    fn available() -> Option<Self> {
        if std::env::var("SIGNET_TEST_DATABASE_URL").is_err()
            && std::env::var("CI").as_deref() != Ok("true")
        {
            eprintln!("SKIPPED: PostgreSQL tests need scripts/test");
            return None;
        }
        Some(Self {
            dir: tempfile::tempdir().unwrap(),
        })
    }

    /// `scripts/pg start` (its URL) or `stop`.
    fn pg(&self, cmd: &str) -> String {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg");
        let out = std::process::Command::new(script)
            .args([cmd, self.dir.path().to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/pg {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg");
        let _ = std::process::Command::new(script)
            .args(["stop", self.dir.path().to_str().unwrap()])
            .output();
    }
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
async fn the_first_issuance_after_a_database_restart_succeeds() {
    let Some(pg) = OwnPostgres::available() else {
        return;
    };
    let url = pg.pg("start");
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        ..ServerOpts::default()
    })
    .await;
    issue(&server, &tokens).await.unwrap();
    // Twice: each restart ends every session the server holds.
    for round in 1..=2 {
        pg.pg("stop");
        assert_eq!(pg.pg("start"), url, "PostgreSQL came back on the same port");
        let chain = issue(&server, &tokens)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the first issuance failed: {e:?}"));
        openssl_verify(&chain, &server.bundle_pem).unwrap();
        assert_eq!(server.http_get("/readyz").await.0, 200);
    }
    // The server certificate and three issued, one chain: nothing was recorded twice.
    let out = server.signetctl(&["ledger", "verify", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"ok": true, "rows": 4, "jwt_svids": 0})
    );
    server.stop().await;
}

/// A free port on loopback (bound, then closed).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn a_server_waiting_for_its_database_serves_health_and_says_why() {
    let Some(pg) = OwnPostgres::available() else {
        return;
    };
    // Started once for its port, then stopped: the server starts against a dead address.
    let url = pg.pg("start");
    pg.pg("stop");
    // postgres://signet@127.0.0.1:PORT/postgres
    let pg_port: u16 = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(port, _)| port.parse().unwrap())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let http = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let cfg = dir.path().join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\nhttp_listen = \"{http}\"\ndata_dir = \"{}\"\n\
             database_url = \"{url}\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(bin("signet-server"))
        .args(["--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "info,sqlx=warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Every log line, echoed for the test's output, and sent to the test.
    let (log_tx, mut log) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(l)) = stderr.next_line().await {
            eprintln!("{l}");
            let _ = log_tx.send(l);
        }
    });
    let waiting = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(l) = log.recv().await {
            if l.contains("database unavailable; retrying") {
                return l;
            }
        }
        panic!("the server's log ended");
    })
    .await
    .expect("a log line saying the database is unavailable");
    // The real cause, and where: never the pool's "pool timed out".
    assert!(
        waiting.contains(&format!("PostgreSQL at 127.0.0.1:{pg_port}"))
            && waiting.to_lowercase().contains("refused")
            && !waiting.contains("pool timed out"),
        "{waiting}"
    );

    // While it waits: alive, not ready, and why.
    let (code, body) = http_get(http, "/healthz").await;
    assert_eq!((code, body.trim()), (200, "ok"), "{body}");
    let (code, body) = http_get(http, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("waiting for the database") && body.to_lowercase().contains("refused"),
        "{body}"
    );

    // The database comes up: the server starts on the same address and is ready.
    assert_eq!(pg.pg("start"), url);
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(l)) = stdout.next_line().await {
            if l == "ready" {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(ready, "the server did not start once its database did");
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    let (code, body) = http_get(http, "/readyz").await;
    assert_eq!((code, body.trim()), (200, "ready"), "{body}");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status();
    let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
}
