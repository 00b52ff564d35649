//! Signed ledger checkpoints, end to end on PostgreSQL: they appear at start, on schedule when
//! the head moved and on demand (files, `/checkpoint`, `/checkpoint.pub`, audit events); then
//! someone with write access to the database (but not the checkpoint key) rewrites a middle row
//! and recomputes the whole chain after it, and separately deletes the ledger's last rows. The
//! plain `signetctl ledger verify` passes on both; `--checkpoint` and `--expect-head` catch
//! both and say what is wrong. A checkpoint with a bad signature, or checked against another
//! key, is refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use signet_tests::{Server, ServerOpts};
use signet_types::ledger::{Hash, LedgerEntry, chain_hash};
use sqlx::{Connection, Row};

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

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
            &format!("spiffe://example.org/app/{i}"),
            "--ttl",
            "10m",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{text}");
}

/// The checkpoint files on disk, parsed, oldest first.
fn files(data_dir: &Path) -> Vec<(PathBuf, serde_json::Value)> {
    let Ok(rd) = std::fs::read_dir(data_dir.join("checkpoints")) else {
        return vec![];
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v.into_iter()
        .map(|p| {
            let j = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (p, j)
        })
        .collect()
}

async fn poll<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..100 {
        if let Some(v) = f() {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn head(db: &mut sqlx::PgConnection) -> (u64, Hash) {
    let r = sqlx::query("SELECT seq, hash FROM ledger_head WHERE id = 1")
        .fetch_one(db)
        .await
        .unwrap();
    let seq: i64 = r.get(0);
    let hash: Vec<u8> = r.get(1);
    (seq as u64, hash.try_into().unwrap())
}

/// What an attacker with database access does after changing row `from`'s content: recomputes
/// the hash of every row from `from` on, and the head, so that the chain is consistent again.
async fn rechain_from(db: &mut sqlx::PgConnection, from: u64) {
    let rows = sqlx::query(
        "SELECT seq, serial, spiffe_id, dns_names, ip_addresses, not_before, not_after, \
         cert_sha256, ca_key_id, caller, issued_at, request_id, provenance, prev_hash \
         FROM certificates WHERE seq >= $1 ORDER BY seq",
    )
    .bind(from as i64)
    .fetch_all(&mut *db)
    .await
    .unwrap();
    let mut prev: Option<Hash> = None;
    for r in rows {
        let seq: i64 = r.get("seq");
        let dns: String = r.get("dns_names");
        let ips: String = r.get("ip_addresses");
        let cert_sha256: Vec<u8> = r.get("cert_sha256");
        let stored_prev: Vec<u8> = r.get("prev_hash");
        let prev_hash = prev.unwrap_or_else(|| stored_prev.try_into().unwrap());
        let entry = LedgerEntry {
            seq: seq as u64,
            serial: r.get("serial"),
            spiffe_id: r.get("spiffe_id"),
            dns_names: serde_json::from_str(&dns).unwrap(),
            ip_addresses: serde_json::from_str(&ips).unwrap(),
            not_before: r.get("not_before"),
            not_after: r.get("not_after"),
            cert_sha256: cert_sha256.try_into().unwrap(),
            ca_key_id: r.get("ca_key_id"),
            caller: r.get("caller"),
            issued_at: r.get("issued_at"),
            request_id: r.get("request_id"),
            provenance: r.get("provenance"),
        };
        let hash = chain_hash(&prev_hash, &entry);
        sqlx::query("UPDATE certificates SET prev_hash = $1, hash = $2 WHERE seq = $3")
            .bind(&prev_hash[..])
            .bind(&hash[..])
            .bind(seq)
            .execute(&mut *db)
            .await
            .unwrap();
        sqlx::query("UPDATE ledger_head SET seq = $1, hash = $2 WHERE id = 1")
            .bind(seq)
            .bind(&hash[..])
            .execute(&mut *db)
            .await
            .unwrap();
        prev = Some(hash);
    }
}

fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Rebuilds the signed statement from the checkpoint's JSON as the README spells it out, and
/// has `openssl pkeyutl -verify` check the signature with the public key file.
fn openssl_verifies(cp: &serde_json::Value, key: &Path, dir: &Path) {
    let td = cp["trust_domain"].as_str().unwrap().as_bytes();
    let mut stmt = b"signet-ledger-checkpoint-v2\0".to_vec();
    stmt.extend_from_slice(&(td.len() as u64).to_be_bytes());
    stmt.extend_from_slice(td);
    stmt.extend_from_slice(&cp["seq"].as_u64().unwrap().to_be_bytes());
    stmt.extend_from_slice(&from_hex(cp["hash"].as_str().unwrap()));
    stmt.extend_from_slice(&cp["time"].as_i64().unwrap().to_be_bytes());
    stmt.extend_from_slice(&cp["previous_seq"].as_u64().unwrap().to_be_bytes());
    stmt.extend_from_slice(&from_hex(cp["previous_hash"].as_str().unwrap()));
    let (stmt_path, sig_path) = (dir.join("statement.bin"), dir.join("signature.bin"));
    std::fs::write(&stmt_path, &stmt).unwrap();
    std::fs::write(&sig_path, from_hex(cp["signature"].as_str().unwrap())).unwrap();
    let o = std::process::Command::new("openssl")
        .args(["pkeyutl", "-verify", "-pubin", "-rawin", "-inkey"])
        .arg(key)
        .arg("-in")
        .arg(&stmt_path)
        .arg("-sigfile")
        .arg(&sig_path)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "openssl refused the checkpoint signature: {o:?}"
    );
    // And the key id is the SHA-256 of the key's DER SubjectPublicKeyInfo.
    let o = std::process::Command::new("openssl")
        .args(["pkey", "-pubin", "-outform", "DER", "-in"])
        .arg(key)
        .output()
        .unwrap();
    assert_eq!(
        cp["key_id"].as_str().unwrap(),
        to_hex(&signet_types::ledger::sha256(&o.stdout))
    );
}

#[tokio::test]
async fn checkpoints_catch_a_deleted_tail_and_a_rewritten_history() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        extra_toml: "[checkpoint]\ninterval = \"200ms\"\n".into(),
        ..ServerOpts::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut db = sqlx::PgConnection::connect(&url).await.unwrap();

    // The key file: outside the database, 0600.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(server.data_dir.join("checkpoint.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // At start: the head (the server certificate's row) is signed.
    let (seq0, _) = head(&mut db).await;
    let first = poll("the first checkpoint", || files(&server.data_dir).pop()).await;
    assert_eq!(first.1["seq"], seq0);
    assert_eq!(first.1["format"], "signet-ledger-checkpoint-v2");
    assert_eq!(first.1["trust_domain"], server.trust_domain.as_str());

    // On schedule: the head moved, a new checkpoint at the new head; then none while it rests.
    for i in 0..5 {
        mint(&server, tmp.path(), i);
    }
    let (n, n_hash) = head(&mut db).await;
    assert_eq!(n, seq0 + 5);
    let periodic = poll("a periodic checkpoint at the new head", || {
        files(&server.data_dir)
            .into_iter()
            .find(|(_, j)| j["seq"] == n)
    })
    .await;
    assert_eq!(periodic.1["hash"], to_hex(&n_hash));
    // (Checkpoints of intermediate heads may have been made while minting.)
    let count = files(&server.data_dir).len();
    assert!(count >= 2);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        files(&server.data_dir).len(),
        count,
        "an unchanged head is not signed again"
    );

    // Published over HTTP: the latest, and the public key (the same as over the admin socket).
    let (status, body) = server.http_get("/checkpoint").await;
    assert_eq!(status, 200);
    let latest: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(latest, periodic.1);
    let (status, pub_pem) = server.http_get("/checkpoint.pub").await;
    assert_eq!(status, 200);
    assert!(
        pub_pem.starts_with("-----BEGIN PUBLIC KEY-----"),
        "{pub_pem}"
    );
    let key = tmp.path().join("checkpoint.pub");
    let (ok, text) = run(
        &server,
        &[
            "ledger",
            "checkpoint",
            "key",
            "--out",
            key.to_str().unwrap(),
        ],
    );
    assert!(ok, "{text}");
    assert_eq!(std::fs::read_to_string(&key).unwrap(), pub_pem);
    // OpenSSL reads it as an Ed25519 key.
    let o = std::process::Command::new("openssl")
        .args(["pkey", "-pubin", "-noout", "-text", "-in"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ED25519"),
        "{o:?}"
    );

    // On demand: signed although the head did not move. (Within the same second it would be
    // the same statement, and so the same file: wait for the next second.)
    let last = files(&server.data_dir).pop().unwrap().1["time"]
        .as_i64()
        .unwrap();
    poll("the next second", || {
        (signet_tests::now_unix() > last).then_some(())
    })
    .await;
    let cp_n = tmp.path().join("cp-n.json");
    let (ok, text) = run(
        &server,
        &[
            "ledger",
            "checkpoint",
            "create",
            "--out",
            cp_n.to_str().unwrap(),
        ],
    );
    assert!(ok, "{text}");
    let asked: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cp_n).unwrap()).unwrap();
    assert_eq!(asked["seq"], n);
    // OpenSSL, with only the public key, verifies the signature over the documented statement.
    openssl_verifies(&asked, &key, tmp.path());
    assert_eq!(files(&server.data_dir).len(), count + 1);
    let (ok, listed) = run(&server, &["ledger", "checkpoint", "list", "--json"]);
    assert!(ok, "{listed}");
    assert_eq!(listed.lines().count(), count + 1, "{listed}");
    let newest: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(newest, asked, "newest first");

    // Every checkpoint is an audit event.
    let kinds = poll("the checkpoint audit events", || {
        let (ok, out) = run(&server, &["audit", "list", "--json"]);
        assert!(ok, "{out}");
        let kinds: Vec<String> = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["kind"].as_str().map(str::to_owned))
            .filter(|k| k.contains("checkpoint"))
            .collect();
        (kinds.len() >= 3).then_some(kinds)
    })
    .await;
    assert!(
        kinds.iter().filter(|k| *k == "ledger.checkpoint").count() >= 2,
        "{kinds:?}"
    );
    assert!(
        kinds.iter().any(|k| k == "admin.ledger_checkpoint"),
        "{kinds:?}"
    );

    let key_s = key.to_str().unwrap();
    let cp_s = cp_n.to_str().unwrap();
    let expect_n = format!("{n}:{}", to_hex(&n_hash));
    // Intact: every form passes and says what it checked.
    let (ok, out) = run(
        &server,
        &[
            "ledger",
            "verify",
            "--checkpoint",
            cp_s,
            "--checkpoint-key",
            key_s,
            "--expect-head",
            &expect_n,
        ],
    );
    assert!(ok, "{out}");
    assert!(out.contains("consistent with checkpoint"), "{out}");

    // A checkpoint with a bad signature, or with another key: refused (exit status, reason).
    let mut forged = asked.clone();
    forged["seq"] = serde_json::json!(n + 1);
    let forged_path = tmp.path().join("forged.json");
    std::fs::write(&forged_path, forged.to_string()).unwrap();
    let (ok, out) = run(
        &server,
        &[
            "ledger",
            "verify",
            "--checkpoint",
            forged_path.to_str().unwrap(),
            "--checkpoint-key",
            key_s,
        ],
    );
    assert!(!ok && out.contains("signature does not verify"), "{out}");
    let other_key = tmp.path().join("other.key");
    let other_pub = tmp.path().join("other.pub");
    let o = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&other_key)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let o = std::process::Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&other_key)
        .arg("-out")
        .arg(&other_pub)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let (ok, out) = run(
        &server,
        &[
            "ledger",
            "verify",
            "--checkpoint",
            cp_s,
            "--checkpoint-key",
            other_pub.to_str().unwrap(),
        ],
    );
    assert!(!ok && out.contains("signed by another key"), "{out}");

    // 1. A middle row rewritten (another SPIFFE ID) and the whole chain after it recomputed.
    let middle = seq0 + 2;
    sqlx::query(
        "UPDATE certificates SET spiffe_id = 'spiffe://example.org/app/innocent' WHERE seq = $1",
    )
    .bind(middle as i64)
    .execute(&mut db)
    .await
    .unwrap();
    rechain_from(&mut db, middle).await;
    let (n2, rewritten_hash) = head(&mut db).await;
    assert_eq!(n2, n);
    assert_ne!(rewritten_hash, n_hash);
    let (ok, out) = run(&server, &["ledger", "verify"]);
    assert!(ok, "the plain chain cannot see a consistent rewrite: {out}");
    let (ok, out) = run(
        &server,
        &[
            "ledger",
            "verify",
            "--checkpoint",
            cp_s,
            "--checkpoint-key",
            key_s,
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("row {n}:")) && out.contains("rewritten") && out.contains(cp_s),
        "{out}"
    );
    let (ok, out) = run(&server, &["ledger", "verify", "--expect-head", &expect_n]);
    assert!(
        !ok && out.contains("rewritten") && out.contains("--expect-head"),
        "{out}"
    );

    // The server does not sign the rewritten head: it does not extend its last checkpoint.
    let (ok, text) = run(&server, &["ledger", "checkpoint", "create"]);
    assert!(
        !ok && text.contains("ledger rollback detected") && text.contains(&format!("row {n}")),
        "{text}"
    );

    // 2. Then the last rows deleted and the head moved back: the checkpoint of row n (taken
    // before the rewrite) catches it: the chain ends before its row.
    let keep = n - 2;
    sqlx::query("DELETE FROM certificates WHERE seq > $1")
        .bind(keep as i64)
        .execute(&mut db)
        .await
        .unwrap();
    let kept_hash: Vec<u8> = sqlx::query("SELECT hash FROM certificates WHERE seq = $1")
        .bind(keep as i64)
        .fetch_one(&mut db)
        .await
        .unwrap()
        .get(0);
    sqlx::query("UPDATE ledger_head SET seq = $1, hash = $2 WHERE id = 1")
        .bind(keep as i64)
        .bind(&kept_hash)
        .execute(&mut db)
        .await
        .unwrap();
    let (ok, out) = run(&server, &["ledger", "verify"]);
    assert!(ok, "the plain chain cannot see a deleted tail: {out}");
    let (ok, out) = run(
        &server,
        &[
            "ledger",
            "verify",
            "--checkpoint",
            cp_s,
            "--checkpoint-key",
            key_s,
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("the chain ends at row {keep}"))
            && out.contains(&format!("rows {}..={n} were deleted", keep + 1)),
        "{out}"
    );
    let (ok, out) = run(&server, &["ledger", "verify", "--expect-head", &expect_n]);
    assert!(!ok && out.contains("were deleted"), "{out}");

    server.stop().await;
}

/// Replicas sharing one PostgreSQL share the checkpoint key file like the KEK: a checkpoint
/// signed by one verifies, with the one public key, against the chain read through the other.
#[tokio::test]
async fn replicas_sharing_the_key_file_sign_checkpoints_one_key_verifies() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let a = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        ..ServerOpts::default()
    })
    .await;
    let shared = tempfile::tempdir().unwrap();
    let (kek, key) = (
        shared.path().join("kek"),
        shared.path().join("checkpoint.key"),
    );
    std::fs::copy(a.data_dir.join("kek"), &kek).unwrap();
    std::fs::copy(a.data_dir.join("checkpoint.key"), &key).unwrap();
    let b = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        extra_toml: format!(
            "[ca]\nkek_file = \"{}\"\n[checkpoint]\nkey_file = \"{}\"\n",
            kek.display(),
            key.display()
        ),
        ..ServerOpts::default()
    })
    .await;
    mint(&a, shared.path(), 1);
    mint(&b, shared.path(), 2);
    let (_, pub_a) = a.http_get("/checkpoint.pub").await;
    let (_, pub_b) = b.http_get("/checkpoint.pub").await;
    assert_eq!(pub_a, pub_b, "one checkpoint key");
    let pub_path = shared.path().join("checkpoint.pub");
    std::fs::write(&pub_path, &pub_a).unwrap();
    let cp = shared.path().join("cp-b.json");
    let (ok, out) = run(
        &b,
        &[
            "ledger",
            "checkpoint",
            "create",
            "--out",
            cp.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");
    let (ok, out) = run(
        &a,
        &[
            "ledger",
            "verify",
            "--checkpoint",
            cp.to_str().unwrap(),
            "--checkpoint-key",
            pub_path.to_str().unwrap(),
        ],
    );
    assert!(ok && out.contains("consistent with checkpoint"), "{out}");
    b.stop().await;
    a.stop().await;
}

/// `ledger verify --from-checkpoint`: the checkpoint's signature is verified with the key kept
/// apart, then only the rows after it, the first chaining from its hash. A row changed after
/// the checkpoint is caught; a forged checkpoint (or none verifiable) is refused.
#[tokio::test]
async fn verify_from_a_checkpoint_checks_only_what_follows() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        ..ServerOpts::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
    let key = tmp.path().join("checkpoint.pub");
    let key_s = key.to_str().unwrap();
    let (ok, text) = run(&server, &["ledger", "checkpoint", "key", "--out", key_s]);
    assert!(ok, "{text}");
    for i in 0..3 {
        mint(&server, tmp.path(), i);
    }
    let cp = tmp.path().join("cp.json");
    let (ok, text) = run(
        &server,
        &[
            "ledger",
            "checkpoint",
            "create",
            "--out",
            cp.to_str().unwrap(),
        ],
    );
    assert!(ok, "{text}");
    let (cp_seq, _) = head(&mut db).await;
    for i in 3..7 {
        mint(&server, tmp.path(), i);
    }
    let verify = |from: &str| {
        run(
            &server,
            &[
                "ledger",
                "verify",
                "--from-checkpoint",
                from,
                "--checkpoint-key",
                key_s,
                "--json",
            ],
        )
    };
    // From the file, by its seq, and the latest (the same one): 4 rows after it.
    for from in [cp.to_str().unwrap(), &cp_seq.to_string(), "latest"] {
        let (ok, out) = verify(from);
        assert!(ok, "{from}: {out}");
        let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        assert_eq!(
            (v["ok"].as_bool(), v["rows"].as_u64()),
            (Some(true), Some(4)),
            "{out}"
        );
        assert_eq!(v["from_seq"], cp_seq, "{out}");
    }
    // It needs the key.
    let (ok, out) = run(
        &server,
        &["ledger", "verify", "--from-checkpoint", "latest"],
    );
    assert!(!ok && out.contains("--checkpoint-key"), "{out}");

    // A forged checkpoint (its head moved): refused, nothing verified.
    let mut forged: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cp).unwrap()).unwrap();
    forged["seq"] = serde_json::json!(cp_seq - 1);
    let forged_path = tmp.path().join("forged.json");
    std::fs::write(&forged_path, forged.to_string()).unwrap();
    let (ok, out) = verify(forged_path.to_str().unwrap());
    assert!(!ok && out.contains("signature does not verify"), "{out}");

    // A row before the checkpoint changed: not this verification's business (the checkpoint
    // vouches for everything up to it), so it passes; the full verification catches it.
    let before = cp_seq - 1;
    sqlx::query("UPDATE certificates SET caller = 'tampered' WHERE seq = $1")
        .bind(before as i64)
        .execute(&mut db)
        .await
        .unwrap();
    let (ok, out) = verify("latest");
    assert!(ok, "{out}");
    let (ok, out) = run(&server, &["ledger", "verify"]);
    assert!(!ok && out.contains(&format!("row {before}")), "{out}");
    // A row after it changed: caught, and where.
    let after = cp_seq + 2;
    sqlx::query("UPDATE certificates SET caller = 'tampered' WHERE seq = $1")
        .bind(after as i64)
        .execute(&mut db)
        .await
        .unwrap();
    let (ok, out) = verify("latest");
    assert!(!ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains(&format!("row {after}")),
        "{out}"
    );
}
