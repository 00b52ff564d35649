//! JWT-SVID issuance and its ledger rows against the real server on PostgreSQL:
//! - the refusals: no audience is InvalidArgument (native and node API), another node's entry
//!   is PermissionDenied, a banned node is refused, an unauthenticated call is Unauthenticated;
//! - a minted token validates with the keys from `GetBundle.jwt_keys`, carries the lifetime
//!   asked (the server's ttl, the request's, the entry's), and `signetctl jwt list` shows its
//!   row;
//! - the ledger paths, with a JWT-SVID row appended to the database exactly as the server
//!   appends one (under the head lock, hashed with `signet_types::ledger::jwt_hash`):
//!   `ledger verify` counts it, a checkpoint whose head is that row verifies, `jwt list/show`
//!   print it, and editing or deleting it makes `ledger verify` BROKEN at its seq.

use signet_client::ClientIdentity;
use signet_proto::admin::{BanNodeRequest, CreateEntryRequest};
use signet_proto::agent::node_client::NodeClient;
use signet_proto::agent::{MintWorkloadJwtsRequest, WorkloadJwtRequest};
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_proto::ca::{MintJwtSvidRequest, SignCsrRequest};
use signet_tests::*;

use crate::revocation::{node_admin, pems};
use signet_types::ledger::{Hash, JwtSvidEntry, jwt_hash, sha256};
use sqlx::Row;

/// Validates `token` for `audience` with the keys the server publishes in `GetBundle.jwt_keys`.
pub(crate) async fn validates(
    server: &signet_tests::Server,
    token: &str,
    audience: &str,
) -> signet_pki::jwt::ValidatedJwtSvid {
    let bundle = server
        .native()
        .await
        .get_bundle(signet_proto::ca::GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    let keys = signet_pki::jwt::JwtKeySet::new(bundle.jwt_keys.iter().map(|k| {
        signet_pki::jwt::JwtPublicKey::from_spki(
            k.key_id.clone(),
            signet_pki::jwt::JwtAlg::parse(&k.alg),
            &k.public_key,
        )
        .unwrap()
    }));
    signet_pki::jwt::validate(token, audience, &keys, signet_tests::now_unix())
        .unwrap_or_else(|e| panic!("the token does not validate: {e}"))
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Attests `node_id` with a join token; its mTLS identity.
async fn attest(server: &Server, node_id: &str) -> ClientIdentity {
    crate::revocation::attest(server, node_id).await.0
}

async fn entry(server: &Server, node_id: &str, path: &str, jwt_ttl_seconds: i64) -> String {
    node_admin(server)
        .await
        .create_entry(CreateEntryRequest {
            spiffe_id: format!("spiffe://example.org/{path}"),
            parent: node_id.into(),
            selectors: vec!["unix:uid:1000".into()],
            ttl_seconds: 600,
            dns_names: vec![],
            jwt_ttl_seconds,
            federates_with: vec![],
        })
        .await
        .unwrap()
        .into_inner()
        .id
}

fn jwt_req(entry_id: &str, audience: &[&str]) -> WorkloadJwtRequest {
    WorkloadJwtRequest {
        entry_id: entry_id.into(),
        audience: audience.iter().map(|a| (*a).to_owned()).collect(),
    }
}

#[tokio::test]
async fn jwt_svid_requests_are_authorized_as_x509_and_minted_tokens_validate() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = crate::pg_server(&tokens, "").await else {
        return;
    };
    let mut native = server.native().await;

    // A service-account caller: no audience is InvalidArgument ...
    let err = native
        .mint_jwt_svid(
            signet_client::with_bearer(
                MintJwtSvidRequest {
                    audience: vec![],
                    ttl_seconds: 0,
                },
                &tokens.token("web", "frontend"),
            )
            .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("no audience"), "{}", err.message());
    // ... a control character in one too ...
    let err = native
        .mint_jwt_svid(
            signet_client::with_bearer(
                MintJwtSvidRequest {
                    audience: vec!["a\u{7}b".into()],
                    ttl_seconds: 0,
                },
                &tokens.token("web", "frontend"),
            )
            .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    // ... and a good request gets a token for its own identity, valid with GetBundle.jwt_keys.
    let minted = native
        .mint_jwt_svid(
            signet_client::with_bearer(
                MintJwtSvidRequest {
                    audience: vec!["vault".into()],
                    ttl_seconds: 0,
                },
                &tokens.token("web", "frontend"),
            )
            .unwrap(),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(minted.spiffe_id, "spiffe://example.org/ns/web/sa/frontend");
    let v = validates(&server, &minted.token, "vault").await;
    assert_eq!(v.spiffe_id.to_string(), minted.spiffe_id);
    assert_eq!(v.key_id, minted.key_id);
    assert_eq!(v.expires_at - v.issued_at.unwrap(), 300, "[jwt_svid] ttl");
    // No credentials: Unauthenticated, as SignCsr.
    let err = native
        .mint_jwt_svid(MintJwtSvidRequest {
            audience: vec!["vault".into()],
            ttl_seconds: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    // An mTLS caller (an X509-SVID from SignCsr): authorized as SignCsr's renewal, then the key.
    let kc = signet_client::new_key_and_csr().unwrap();
    let r = native
        .sign_csr(
            signet_client::with_bearer(
                SignCsrRequest {
                    csr: kc.csr_der.clone(),
                    ttl_seconds: 600,
                    kubernetes_namespace: String::new(),
                },
                &tokens.token("web", "frontend"),
            )
            .unwrap(),
        )
        .await
        .unwrap()
        .into_inner();
    let svid = ClientIdentity {
        cert_chain_pem: pems(&r.cert_chain).concat().into_bytes(),
        key_pem: kc.key_pem.into_bytes(),
    };
    let minted = CertificateAuthorityClient::new(server.channel_with(&svid).await)
        .mint_jwt_svid(MintJwtSvidRequest {
            audience: vec!["vault".into()],
            ttl_seconds: 60,
        })
        .await
        .unwrap()
        .into_inner();
    let v = validates(&server, &minted.token, "vault").await;
    assert_eq!(
        v.spiffe_id.to_string(),
        "spiffe://example.org/ns/web/sa/frontend"
    );
    assert_eq!(v.expires_at - v.issued_at.unwrap(), 60);

    // The node API: n1 may ask only for its own entries.
    let n1 = attest(&server, "n1").await;
    let _n2 = attest(&server, "n2").await;
    let mine = entry(&server, "n1", "app", 120).await;
    let theirs = entry(&server, "n2", "other", 0).await;
    let mut node = NodeClient::new(server.channel_with(&n1).await);
    let r = node
        .mint_workload_jwts(MintWorkloadJwtsRequest {
            requests: vec![
                jwt_req(&theirs, &["vault"]),
                jwt_req("no-such-entry", &["vault"]),
                jwt_req(&mine, &[]),
                jwt_req(&mine, &["vault"]),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let codes: Vec<i32> = r.results.iter().map(|x| x.code).collect();
    assert_eq!(
        codes,
        vec![
            tonic::Code::PermissionDenied as i32,
            tonic::Code::PermissionDenied as i32,
            tonic::Code::InvalidArgument as i32,
            0,
        ],
        "{r:?}"
    );
    assert!(
        r.results[0].message.contains("not parented to node"),
        "{r:?}"
    );
    assert_eq!(r.results[0].entry_id, theirs);
    assert!(r.results[..3].iter().all(|x| x.svid.is_none()));
    let own = r.results[3]
        .svid
        .as_ref()
        .expect("a token for the node's own entry");
    let v = validates(&server, &own.token, "vault").await;
    assert_eq!(v.spiffe_id.to_string(), "spiffe://example.org/app");
    assert_eq!(
        v.expires_at - v.issued_at.unwrap(),
        120,
        "the entry's jwt_ttl"
    );
    // Every minted token is on the ledger, and the chain verifies.
    let out = server.signetctl(&["jwt", "list", "--json"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && listed.contains("spiffe://example.org/app"),
        "{listed}"
    );
    // A reader that goes away (`| head`) ends the listing quietly: no panic, no backtrace
    // (second review, finding F4).
    let mut child = std::process::Command::new(bin("signetctl"))
        .arg("--socket")
        .arg(server.admin_socket())
        .args(["jwt", "list", "--json"])
        .env("RUST_BACKTRACE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let out = server.signetctl(&["ledger", "verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Too many in one call: refused whole.
    let err = node
        .mint_workload_jwts(MintWorkloadJwtsRequest {
            requests: (0..257).map(|_| jwt_req(&mine, &["a"])).collect(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    // A banned node gets nothing.
    node_admin(&server)
        .await
        .ban_node(BanNodeRequest {
            node_id: "n1".into(),
        })
        .await
        .unwrap();
    let err = node
        .mint_workload_jwts(MintWorkloadJwtsRequest {
            requests: vec![jwt_req(&mine, &["vault"])],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    // The three tokens minted are on the ledger, and nothing refused is; the entry shows its
    // JWT lifetime.
    let v = json(&server.signetctl(&["ledger", "verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["jwt_svids"], 3, "{v}");
    let out = server.signetctl(&["entry", "list", "--json"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.contains(&mine) && l.contains("\"jwt_ttl_seconds\":120")),
        "{listed}"
    );
}

/// Appends a JWT-SVID row as the server does: under the head lock, chained from the head.
async fn append_jwt_row(pool: &sqlx::PgPool, spiffe_id: &str) -> (u64, Hash) {
    let mut tx = pool.begin().await.unwrap();
    let head = sqlx::query("SELECT seq, hash FROM ledger_head WHERE id = 1 FOR UPDATE")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let seq = u64::try_from(head.get::<i64, _>(0)).unwrap() + 1;
    let prev: Hash = head.get::<Vec<u8>, _>(1).try_into().unwrap();
    let e = JwtSvidEntry {
        seq,
        spiffe_id: spiffe_id.into(),
        audience: vec!["vault".into(), "https://api.example.org".into()],
        issued_at: now_unix(),
        expires_at: now_unix() + 300,
        key_id: "test-kid".into(),
        token_sha256: sha256(b"header.claims.signature"),
        caller: "mtls:spiffe://example.org/signet/node/n1".into(),
        request_id: "e2e".into(),
        provenance: r#"{"source":{"kind":"entry","entry_id":"e1","node_id":"n1"}}"#.into(),
    };
    let hash = jwt_hash(&prev, &e);
    sqlx::query(
        "INSERT INTO jwt_svids (seq, spiffe_id, audience, issued_at, expires_at, key_id, \
         token_sha256, caller, request_id, provenance, prev_hash, hash) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(i64::try_from(seq).unwrap())
    .bind(&e.spiffe_id)
    .bind(serde_json::to_string(&e.audience).unwrap())
    .bind(e.issued_at)
    .bind(e.expires_at)
    .bind(&e.key_id)
    .bind(&e.token_sha256[..])
    .bind(&e.caller)
    .bind(&e.request_id)
    .bind(&e.provenance)
    .bind(&prev[..])
    .bind(&hash[..])
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("UPDATE ledger_head SET seq = $1, hash = $2 WHERE id = 1")
        .bind(i64::try_from(seq).unwrap())
        .bind(&hash[..])
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    (seq, hash)
}

#[tokio::test]
async fn jwt_rows_verify_in_the_chain_and_checkpoints_and_tampering_breaks_verify() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        ..ServerOpts::default()
    })
    .await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (seq, hash) = append_jwt_row(&pool, "spiffe://example.org/app").await;

    // The head is the JWT row: verify counts it, and a checkpoint of that head verifies.
    let v = json(&server.signetctl(&["ledger", "verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["jwt_svids"], 1, "{v}");
    assert_eq!(v["rows"].as_u64(), Some(seq), "{v}");
    let dir = tempfile::tempdir().unwrap();
    let cp = dir.path().join("cp.json");
    let key = dir.path().join("cp.pub");
    let out = server.signetctl(&[
        "ledger",
        "checkpoint",
        "create",
        "--out",
        cp.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checkpoint: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cp).unwrap()).unwrap();
    assert_eq!(checkpoint["seq"].as_u64(), Some(seq), "{checkpoint}");
    let out = server.signetctl(&[
        "ledger",
        "checkpoint",
        "key",
        "--out",
        key.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verify_cp = [
        "ledger",
        "verify",
        "--json",
        "--checkpoint",
        cp.to_str().unwrap(),
        "--checkpoint-key",
        key.to_str().unwrap(),
    ];
    let v = json(&server.signetctl(&verify_cp));
    assert_eq!(v["ok"], true, "{v}");

    // Certificates chain on after it (the server's writer learns the moved head).
    let kc = signet_client::new_key_and_csr().unwrap();
    server
        .native()
        .await
        .sign_csr(
            signet_client::with_bearer(
                SignCsrRequest {
                    csr: kc.csr_der,
                    ttl_seconds: 600,
                    kubernetes_namespace: String::new(),
                },
                &tokens.token("web", "frontend"),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let v = json(&server.signetctl(&verify_cp));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["jwt_svids"], 1, "{v}");

    // jwt list / show print the row, with the token's hash and never a token.
    let out = server.signetctl(&["jwt", "list", "--json"]);
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["seq"].as_u64(), Some(seq));
    assert_eq!(rows[0]["spiffe_id"], "spiffe://example.org/app");
    assert_eq!(rows[0]["hash"], hex::encode(hash));
    assert_eq!(
        rows[0]["token_sha256"],
        hex::encode(sha256(b"header.claims.signature"))
    );
    let out = server.signetctl(&["jwt", "show", &seq.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(r#"["vault", "https://api.example.org"]"#),
        "{text}"
    );
    let out = server.signetctl(&["jwt", "show", "1"]);
    assert!(!out.status.success(), "row 1 is a certificate");
    // certs list is unchanged: certificate rows only.
    let out = server.signetctl(&["certs", "list", "--json"]);
    let certs: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!certs.is_empty());
    assert!(
        certs.iter().all(|c| c["seq"].as_u64() != Some(seq)),
        "{certs:?}"
    );

    // Someone with database access edits the row: BROKEN at its seq.
    sqlx::query("UPDATE jwt_svids SET audience = '[\"evil\"]' WHERE seq = $1")
        .bind(i64::try_from(seq).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    let out = server.signetctl(&["ledger", "verify", "--json"]);
    assert!(!out.status.success());
    let v = json(&out);
    let why = v["error"].as_str().unwrap();
    assert!(
        why.contains(&format!("row {seq}")) && why.contains("altered"),
        "{v}"
    );
    // ... or deletes it: a gap where it was.
    sqlx::query("DELETE FROM jwt_svids WHERE seq = $1")
        .bind(i64::try_from(seq).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    let out = server.signetctl(&["ledger", "verify", "--json"]);
    assert!(!out.status.success());
    let v = json(&out);
    let why = v["error"].as_str().unwrap();
    assert!(
        why.contains("missing") && why.contains(&format!("{}", seq + 1)),
        "{v}"
    );
    // The checkpoint's row is gone too.
    let out = server.signetctl(&verify_cp);
    assert!(!out.status.success());
    pool.close().await;
}
