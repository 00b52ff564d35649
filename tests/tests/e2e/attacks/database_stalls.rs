//! Someone with database access (or a stuck client, a long migration, a forgotten `psql`
//! session) holds the ledger head row lock (issue 8, finding 8). Before: every replica froze
//! for as long as the lock was held and `/readyz` stayed green. Now: every server session has
//! `lock_timeout`, each issuance a commit deadline, and readiness follows ledger progress.

use std::time::{Duration, Instant};

use signet_proto::ca::SignCsrRequest;
use signet_tests::{Server, ServerOpts, TokenIssuer, csr_with};
use sqlx::Connection;
use tonic::Code;

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

/// Two servers on one PostgreSQL; a foreign session takes the ledger head lock and sits on it.
/// Issuance on both answers Unavailable (never hangs) and issues nothing; `/readyz` on both
/// turns 503 and says why; once the lock is released both recover by themselves.
#[tokio::test]
async fn a_held_ledger_head_lock_answers_unavailable_and_readyz_says_why() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let tokens = TokenIssuer::new("k1");
    // Replicas share the key-encryption key (and so the CA key in the database).
    let dir = tempfile::tempdir().unwrap();
    let kek = dir.path().join("kek");
    std::fs::write(&kek, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n").unwrap();
    let toml = format!(
        "[ca]\nkek_file = \"{}\"\n[database]\nlock_timeout = \"1s\"\n\
         [ledger]\ncommit_deadline = \"3s\"\nready_max_wait = \"4s\"\n",
        kek.display()
    );
    let start = || {
        Server::start(ServerOpts {
            database_url: Some(url.clone()),
            tokens: Some(tokens.jwks_json()),
            extra_toml: toml.clone(),
            ..ServerOpts::default()
        })
    };
    let (a, b) = tokio::join!(start(), start());
    let token = tokens.token("shop", "cart");
    sign(&a, &token).await.unwrap();
    sign(&b, &token).await.unwrap();
    let before = a.cert_count().await;
    assert_eq!(a.http_get("/readyz").await.0, 200);

    // The stall: a session that locks the chain head and does nothing.
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT seq FROM ledger_head WHERE id = 1 FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();

    // Both servers answer, within their bounds, with Unavailable. (The outer timeout only
    // catches "hangs"; it is not a speed assertion.)
    let started = Instant::now();
    let (ra, rb) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(sign(&a, &token), sign(&b, &token))
    })
    .await
    .expect("issuance hung on a held ledger lock");
    eprintln!("stalled issuance answered after {:?}", started.elapsed());
    for r in [ra, rb] {
        let e = r.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(
            e.message()
                .contains("could not be recorded, so it was not issued"),
            "{}",
            e.message()
        );
    }
    // Readiness says so, and why.
    for s in [&a, &b] {
        let (code, body) = s.http_get("/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("ledger commit failed"), "{body}");
        assert!(body.contains("lock"), "{body}");
    }

    // Released: both recover by themselves (readiness first, then issuance).
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    for s in [&a, &b] {
        let mut ready = false;
        for _ in 0..300 {
            if s.http_get("/readyz").await.0 == 200 {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ready, "{:?}", s.http_get("/readyz").await);
        sign(s, &token).await.unwrap();
    }
    // Nothing refused was issued: exactly the two new certificates are in the ledger.
    assert_eq!(a.cert_count().await, before + 2);
    let out = a.signetctl(&["ledger", "verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// With a long `lock_timeout`, issuances wait on the held lock: `/readyz` turns 503 as soon as
/// they have waited `ledger.ready_max_wait` without a commit (before any of them fails), and
/// the waiting issuance completes once the lock is released.
#[tokio::test]
async fn readyz_turns_503_while_issuances_wait_on_a_held_lock() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: "[database]\nlock_timeout = \"20s\"\nstatement_timeout = \"30s\"\n\
                     [ledger]\ncommit_deadline = \"25s\"\nready_max_wait = \"1s\"\n"
            .into(),
        ..ServerOpts::default()
    })
    .await;
    let token = tokens.token("shop", "cart");
    sign(&server, &token).await.unwrap();
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT seq FROM ledger_head WHERE id = 1 FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let pending = {
        let token = token.clone();
        let server = &server;
        async move { sign(server, &token).await }
    };
    let probe = async {
        // While the issuance waits, readiness turns 503 once it has waited ready_max_wait.
        for _ in 0..200 {
            let (code, body) = server.http_get("/readyz").await;
            if code == 503 {
                assert!(body.contains("without a ledger commit"), "{body}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (code, body) = server.http_get("/readyz").await;
        sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
        (code, body)
    };
    let (issued, (code, body)) = tokio::join!(pending, probe);
    assert_eq!(code, 503, "{body}");
    // Released before the deadline: the waiting issuance completes.
    issued.unwrap();
}

/// The embedded store: another process holds SQLite's write lock (`BEGIN IMMEDIATE` on the
/// server's own `signet.db`). Issuance answers Unavailable after the busy timeout, `/readyz`
/// says why, and both recover once the lock is released.
#[tokio::test]
async fn a_held_sqlite_write_lock_answers_unavailable_and_recovers() {
    let tokens = TokenIssuer::new("k1");
    let server = Server::start(ServerOpts {
        tokens: Some(tokens.jwks_json()),
        extra_toml: "[database]\nsqlite_busy_timeout = \"1s\"\n\
                     [ledger]\ncommit_deadline = \"3s\"\nready_max_wait = \"4s\"\n"
            .into(),
        ..ServerOpts::default()
    })
    .await;
    let token = tokens.token("shop", "cart");
    sign(&server, &token).await.unwrap();
    let before = server.cert_count().await;

    let url = format!("sqlite://{}", server.data_dir.join("signet.db").display());
    let mut holder = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .unwrap();

    let e = tokio::time::timeout(Duration::from_secs(30), sign(&server, &token))
        .await
        .expect("issuance hung on a held SQLite lock")
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    let (code, body) = server.http_get("/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("ledger commit failed"), "{body}");

    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    drop(holder);
    let mut ready = false;
    for _ in 0..300 {
        if server.http_get("/readyz").await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "{:?}", server.http_get("/readyz").await);
    sign(&server, &token).await.unwrap();
    assert_eq!(server.cert_count().await, before + 1);
}
