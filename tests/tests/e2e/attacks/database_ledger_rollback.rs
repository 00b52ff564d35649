//! Someone with write access to the database (but not the checkpoint key file) deletes the
//! ledger's tail (certificates that had been returned) and moves `ledger_head` back. Before
//! issue 24 the server signed a checkpoint of the shorter head within one interval, served it
//! at `/checkpoint`, and `signetctl ledger verify --from-checkpoint latest` passed. Now the
//! server signs only a head that extends the last checkpoint it signed: nothing newer is
//! signed or served, `/readyz` is not ready and says why, the rollback is an audit event, and
//! the auditor's `--from-checkpoint latest` fails saying which rows went missing. Appending new
//! rows on the shorter head (past the old top) does not launder it either. The legitimate path:
//! normal growth keeps producing version 2 checkpoints, each naming the one before.

use std::path::Path;
use std::time::{Duration, Instant};

use signet_tests::{Server, ServerOpts};
use sqlx::{Connection, Row};

fn run(server: &Server, args: &[&str]) -> (bool, String) {
    let o = server.signetctl(args);
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn mint(server: &Server, dir: &Path, i: usize) {
    let out = dir.join(format!("m{i}"));
    let (ok, text) = run(
        server,
        &[
            "mint",
            "--spiffe-id",
            &format!("spiffe://example.org/rollback/{i}"),
            "--ttl",
            "10m",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{text}");
}

async fn db(server: &Server) -> sqlx::SqliteConnection {
    sqlx::SqliteConnection::connect(&signet_testutil::sqlite_url(&server.data_dir))
        .await
        .unwrap()
}

async fn head(server: &Server) -> (u64, String) {
    let r = sqlx::query("SELECT seq, hash FROM ledger_head WHERE id = 1")
        .fetch_one(&mut db(server).await)
        .await
        .unwrap();
    let seq: i64 = r.get(0);
    let hash: Vec<u8> = r.get(1);
    (seq as u64, hex::encode(hash))
}

/// The checkpoint `/checkpoint` serves (404: none).
async fn served(server: &Server) -> Option<serde_json::Value> {
    let (status, body) = server.http_get("/checkpoint").await;
    (status == 200).then(|| serde_json::from_str(&body).unwrap())
}

/// Polls `f` every 50 ms for up to 10 s.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every checkpoint file, oldest first (by seq, then time: the file names).
fn files(server: &Server) -> Vec<serde_json::Value> {
    let mut v: Vec<_> = std::fs::read_dir(server.data_dir.join("checkpoints"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v.iter()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}

#[tokio::test]
async fn a_rolled_back_head_is_not_signed_and_is_flagged() {
    let server = Server::start(ServerOpts {
        extra_toml: "[checkpoint]\ninterval = \"100ms\"\n".into(),
        ..ServerOpts::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("checkpoint.pub");
    let key_s = key.to_str().unwrap();
    let (ok, text) = run(&server, &["ledger", "checkpoint", "key", "--out", key_s]);
    assert!(ok, "{text}");
    let verify = || {
        run(
            &server,
            &[
                "ledger",
                "verify",
                "--from-checkpoint",
                "latest",
                "--checkpoint-key",
                key_s,
            ],
        )
    };

    // The legitimate path: the ledger grows, checkpoints follow, each naming the one before.
    for i in 0..4 {
        mint(&server, tmp.path(), i);
    }
    let (top, top_hash) = head(&server).await;
    let good = until("a checkpoint of the head", || async {
        served(&server).await.filter(|c| c["seq"] == top)
    })
    .await;
    assert_eq!(good["format"], "signet-ledger-checkpoint-v2");
    assert_eq!(good["hash"], top_hash.as_str());
    let chain = files(&server);
    assert!(chain.len() >= 2, "{chain:?}");
    assert_eq!(
        chain[0]["previous_seq"], 0,
        "the first extends the empty ledger"
    );
    for pair in chain.windows(2) {
        assert_eq!(
            (&pair[1]["previous_seq"], &pair[1]["previous_hash"]),
            (&pair[0]["seq"], &pair[0]["hash"]),
            "each checkpoint names the one before: {chain:?}"
        );
    }
    let (ok, out) = verify();
    assert!(ok && out.contains("checkpoint chain"), "{out}");
    let (status, body) = server.http_get("/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    // The attack: the last two rows deleted and the head moved back.
    let keep = top - 2;
    {
        let mut c = db(&server).await;
        sqlx::query("DELETE FROM certificates WHERE seq > $1")
            .bind(keep as i64)
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::query(
            "UPDATE ledger_head SET seq = $1, \
             hash = (SELECT hash FROM certificates WHERE seq = $1) WHERE id = 1",
        )
        .bind(keep as i64)
        .execute(&mut c)
        .await
        .unwrap();
    }
    assert_eq!(head(&server).await.0, keep);

    // Flagged within an interval: /readyz names the check and the rows.
    let why = until("/readyz to turn red", || async {
        let (status, body) = server.http_get("/readyz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(
        why.contains("ledger_rollback")
            && why.contains(&format!("rows {}..={top} were deleted", keep + 1)),
        "{why}"
    );
    // The last good checkpoint is still the one served; nothing of the shorter head was signed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served(&server).await.as_ref(), Some(&good));
    assert!(
        files(&server)
            .iter()
            .all(|c| c["time"].as_i64() <= good["time"].as_i64()),
        "a checkpoint was signed after the rollback: {:?}",
        files(&server)
    );
    // Not on demand either: refused, saying why and what to do.
    let (ok, out) = run(&server, &["ledger", "checkpoint", "create"]);
    assert!(
        !ok && out.contains("ledger rollback detected") && out.contains("Restore the missing rows"),
        "{out}"
    );
    // An audit event.
    let audited = until("the rollback audit event", || async {
        let (ok, out) = run(&server, &["audit", "list", "--json", "--limit", "1000"]);
        assert!(ok, "{out}");
        out.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| e["kind"] == "ledger.rollback_detected")
    })
    .await;
    assert!(
        audited["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("below row {top}")),
        "{audited}"
    );
    // The auditor's follow-up fails, saying which rows went missing. Under load a periodic
    // checkpoint may also have been signed at a row between `keep` and `top` (the mints above
    // straddle an interval); the verifier then names that checkpoint's row as the first
    // deleted one, which is the same finding: the first missing row, deleted.
    let (ok, out) = verify();
    assert!(!ok, "{out}");
    let first_missing = keep + 1;
    assert!(
        (out.contains(&format!("the chain ends at row {keep}"))
            && out.contains(&format!("rows {first_missing}..={top} were deleted")))
            || out.contains(&format!(
                "row {first_missing} is gone from the ledger (deleted)"
            )),
        "{out}"
    );

    // Laundering: new rows appended on the shorter head, past the old top. Row `top` now has
    // another hash: still refused, still flagged, still caught.
    for i in 10..13 {
        mint(&server, tmp.path(), i);
    }
    assert!(head(&server).await.0 > top);
    let why = until("/readyz to name the rewritten row", || async {
        let (status, body) = server.http_get("/readyz").await;
        (status == 503 && body.contains(&format!("row {top} of the last checkpoint")))
            .then_some(body)
    })
    .await;
    assert!(why.contains("now has hash"), "{why}");
    assert_eq!(served(&server).await.as_ref(), Some(&good));
    // (The rows after the checkpoint no longer chain from its hash.)
    let (ok, out) = verify();
    assert!(
        !ok && out.contains(&format!("row {}: its stored previous hash", top + 1)),
        "{out}"
    );

    server.stop().await;
}
