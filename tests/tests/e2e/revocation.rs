//! Revocation and CRLs against the real server on PostgreSQL: `signetctl certs revoke` by
//! serial, SPIFFE ID, node (`node ban --revoke`), entry and CA key; the revoked serial is in the
//! CRL served over HTTP, in `GetBundle`'s `crls` and under `<data_dir>/crl/`; `openssl verify
//! -crl_check -x509_strict` rejects the revoked certificate and accepts its replacement; mTLS
//! renewal with the revoked certificate is refused and audited; `signetctl ledger verify`
//! recomputes the events and catches an altered one; bad input changes nothing.

use std::time::Duration;

use signet_client::ClientIdentity;
use signet_proto::admin::node_admin_client::NodeAdminClient;
use signet_proto::admin::{CreateEntryRequest, CreateJoinTokenRequest, ListAuditEventsRequest};
use signet_proto::agent::node_client::NodeClient;
use signet_proto::agent::{AttestRequest, SignWorkloadsRequest, WorkloadCsr};
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_proto::ca::{GetBundleRequest, SignCsrRequest};
use signet_tests::*;

pub(crate) fn pems(chain: &[Vec<u8>]) -> Vec<String> {
    chain
        .iter()
        .map(|d| signet_types::pem::cert_to_pem(d))
        .collect()
}

/// A certificate for `web/frontend` through a token: (chain PEMs, key PEM, serial).
async fn issue(server: &Server, tokens: &TokenIssuer, sa: &str) -> (Vec<String>, String, String) {
    let kc = signet_client::new_key_and_csr().unwrap();
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: kc.csr_der.clone(),
            ttl_seconds: 600,
            kubernetes_namespace: String::new(),
        },
        &tokens.token("web", sa),
    )
    .unwrap();
    let r = server
        .native()
        .await
        .sign_csr(req)
        .await
        .unwrap()
        .into_inner();
    (pems(&r.cert_chain), kc.key_pem, r.serial)
}

/// A raw HTTP GET: (status, content type, body bytes).
async fn http_bytes(server: &Server, path: &str) -> (u16, String, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(server.http).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&buf[..split]).to_ascii_lowercase();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let ctype = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    (code, ctype, buf[split + 4..].to_vec())
}

fn crl_serials(der: &[u8]) -> Vec<(String, Option<u8>)> {
    let crl = signet_pki::ParsedCrl::from_der(der).unwrap();
    crl.entries()
        .iter()
        .map(|(serial, reason)| {
            (
                signet_types::serial_hex(serial),
                reason.map(signet_pki::CrlReason::code),
            )
        })
        .collect()
}

/// `openssl verify -x509_strict -crl_check` of a chain's leaf (through its intermediate, the
/// chain's second certificate) against the root and the leaf's issuer's CRL.
fn openssl_verify_crl(chain: &[String], root_pem: &[u8], crl_der: &[u8]) -> Result<(), String> {
    openssl_verify_crl_via(
        &chain[0],
        chain.get(1).map(String::as_str),
        root_pem,
        crl_der,
    )
}

/// The authority key identifier of a PEM certificate (its issuer's key ID), lowercase hex.
fn issuer_key_id(pem: &str) -> String {
    let der = signet_types::pem::parse_certs(pem.as_bytes())
        .unwrap()
        .remove(0);
    signet_pki::ParsedCert::from_der(&der)
        .unwrap()
        .authority_key_id()
        .expect("an authority key identifier")
        .to_owned()
}

/// The same, through an intermediate (`-untrusted`).
fn openssl_verify_crl_via(
    leaf_pem: &str,
    intermediate_pem: Option<&str>,
    root_pem: &[u8],
    crl_der: &[u8],
) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root.pem");
    let leaf = dir.path().join("leaf.pem");
    let crl = dir.path().join("crl.pem");
    std::fs::write(&root, root_pem).unwrap();
    std::fs::write(&leaf, leaf_pem).unwrap();
    std::fs::write(
        &crl,
        pem::encode(&pem::Pem::new("X509 CRL", crl_der.to_vec())),
    )
    .unwrap();
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["verify", "-x509_strict", "-crl_check", "-CAfile"])
        .arg(&root)
        .arg("-CRLfile")
        .arg(&crl);
    if let Some(inter) = intermediate_pem {
        let path = dir.path().join("inter.pem");
        std::fs::write(&path, inter).unwrap();
        cmd.arg("-untrusted").arg(path);
    }
    let out = cmd.arg(&leaf).output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn audit_events(server: &Server, kind: &str, min: usize) -> Vec<(String, String)> {
    for _ in 0..100 {
        let events: Vec<(String, String)> = server
            .admin()
            .await
            .list_audit_events(ListAuditEventsRequest {
                after_id: 0,
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .events
            .into_iter()
            .filter(|e| e.kind == kind)
            .map(|e| (e.caller, e.detail))
            .collect();
        if events.len() >= min {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("fewer than {min} audit events {kind}");
}

#[tokio::test]
async fn revoked_certificate_is_in_every_crl_fails_openssl_and_cannot_renew() {
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
    let (chain, key, serial) = issue(&server, &tokens, "frontend").await;
    openssl_verify(&chain, &server.bundle_pem).unwrap();

    // Before any revocation the CRL exists and is empty.
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    // One per CA key: the root's and the issuing intermediate's.
    assert_eq!(b.crls.len(), 2, "{b:?}");
    let key_id = issuer_key_id(&chain[0]);
    let issuing = b
        .crls
        .iter()
        .find(|c| c.key_id == key_id)
        .expect("the issuer's CRL");
    let first_number = issuing.number;
    assert!(crl_serials(&issuing.der).is_empty());
    openssl_verify_crl(&chain, &server.bundle_pem, &issuing.der).unwrap();

    // Bad input: a clear error, nothing changes.
    let head = server.cert_count().await;
    let out = server.signetctl(&["certs", "revoke", "00ff00ff", "--reason", "keyCompromise"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NotFound"), "{err}");
    let out = server.signetctl(&["certs", "revoke", &serial, "--reason", "compromised"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("InvalidArgument") && err.contains("keyCompromise"),
        "{err}"
    );
    let out = server.signetctl(&["certs", "revoke", "zz-not-hex", "--reason", "superseded"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("InvalidArgument"));
    let out = server.signetctl(&["certs", "revoke", "--reason", "superseded"]);
    assert!(!out.status.success(), "no selector");
    let out = server.signetctl(&[
        "certs",
        "revoke",
        "--spiffe-id",
        "spiffe://other.org/x",
        "--reason",
        "superseded",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("InvalidArgument"));
    // The same over gRPC, where no client-side check stands in front.
    let mut ra = signet_proto::admin::revocation_admin_client::RevocationAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    );
    use signet_proto::admin::{RevokeRequest, revoke_request::Selector};
    for (selector, reason, code) in [
        (None, "keyCompromise", tonic::Code::InvalidArgument),
        (
            Some(Selector::Serial(serial.clone())),
            "",
            tonic::Code::InvalidArgument,
        ),
        (
            Some(Selector::Serial(serial.clone())),
            "certificateHold",
            tonic::Code::InvalidArgument,
        ),
        (
            Some(Selector::Serial(String::new())),
            "superseded",
            tonic::Code::InvalidArgument,
        ),
        (
            Some(Selector::CaKeyId("../../kek".into())),
            "superseded",
            tonic::Code::InvalidArgument,
        ),
        (
            Some(Selector::Node("no-such-node".into())),
            "superseded",
            tonic::Code::NotFound,
        ),
        (
            Some(Selector::CaKeyId("abcdef".into())),
            "superseded",
            tonic::Code::NotFound,
        ),
    ] {
        let err = ra
            .revoke(RevokeRequest {
                selector: selector.clone(),
                reason: reason.into(),
                dry_run: false,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{selector:?} {reason}: {err:?}");
    }
    assert_eq!(
        server.cert_count().await,
        head,
        "bad input changed the ledger"
    );

    // Revoke by serial (colon form accepted).
    let colons: Vec<String> = serial
        .as_bytes()
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c).to_uppercase())
        .collect();
    let v = json(&server.signetctl(&[
        "certs",
        "revoke",
        &colons.join(":"),
        "--reason",
        "keyCompromise",
        "--json",
    ]));
    assert_eq!(v["revoked_count"], 1, "{v}");
    assert_eq!(v["revoked"][0]["serial"], serial.as_str());
    // The issuer's CRL, re-signed with the entry (the root's has none).
    let issuer_crl = v["crls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["ca_key_id"] == key_id.as_str())
        .unwrap_or_else(|| panic!("no CRL of {key_id}: {v}"));
    assert_eq!(issuer_crl["entries"], 1, "{v}");
    let head = server.cert_count().await;
    // Again: already revoked, unchanged.
    let v = json(&server.signetctl(&[
        "certs",
        "revoke",
        &serial,
        "--reason",
        "superseded",
        "--json",
    ]));
    assert_eq!(
        (
            v["revoked_count"].as_u64(),
            v["already_revoked_count"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(v["already_revoked"][0]["reason"], "keyCompromise");
    assert_eq!(server.cert_count().await, head);

    // certs show / list say so.
    let v = json(&server.signetctl(&["certs", "show", &serial, "--json"]));
    assert_eq!(v["revocation_reason"], "keyCompromise", "{v}");
    assert!(v["revoked_at"].is_string());
    let out = server.signetctl(&["certs", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains(&serial) && l.contains("REVOKED") && l.contains("keyCompromise")),
        "{text}"
    );

    // The CRL: in GetBundle, over HTTP, on disk; the same bytes; listing the serial.
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    let crl = b.crls.iter().find(|c| c.key_id == key_id).unwrap().clone();
    assert!(crl.number > first_number);
    assert!(crl.next_update > crl.this_update);
    assert_eq!(crl_serials(&crl.der), vec![(serial.clone(), Some(1))]);
    let (code, ctype, body) = http_bytes(&server, &format!("/crl/{key_id}.crl")).await;
    assert_eq!(code, 200);
    assert_eq!(ctype, "application/pkix-crl");
    assert_eq!(body, crl.der);
    assert_eq!(
        std::fs::read(server.data_dir.join("crl").join(format!("{key_id}.crl"))).unwrap(),
        crl.der
    );
    let out = server.signetctl(&["crl", "list", "--json"]);
    let listed: serde_json::Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|c| c["ca_key_id"] == key_id.as_str())
        .expect("crl list shows the issuer's CRL");
    assert_eq!(listed["ca_key_id"], key_id.as_str());
    assert_eq!(listed["number"], crl.number);
    assert_eq!(listed["entries"], 1);
    // Every CRL, PEM (the root's and the intermediate's), for `openssl -CRLfile`.
    let out = server.signetctl(&["crl", "list", "--pem"]);
    let pems = pem::parse_many(&out.stdout).unwrap();
    assert_eq!(pems.len(), 2);
    assert!(pems.iter().any(|p| p.contents() == crl.der.as_slice()));
    let (code, _, _) = http_bytes(&server, "/crl/0000.crl").await;
    assert_eq!(code, 404);
    let (code, _, _) = http_bytes(&server, "/crl/..%2Fkek.crl").await;
    assert_eq!(code, 404);

    // openssl: the CRL verifies; the revoked certificate is rejected, a replacement accepted.
    let dir = tempfile::tempdir().unwrap();
    // The CRL is the intermediate's: -CAfile holds the chain up to the root.
    std::fs::write(
        dir.path().join("root.pem"),
        [server.bundle_pem.clone(), chain[1].clone().into_bytes()].concat(),
    )
    .unwrap();
    std::fs::write(dir.path().join("crl.der"), &crl.der).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["crl", "-inform", "DER", "-noout", "-verify", "-in"])
        .arg(dir.path().join("crl.der"))
        .arg("-CAfile")
        .arg(dir.path().join("root.pem"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stderr).contains("verify OK"),
        "{out:?}"
    );
    let e = openssl_verify_crl(&chain, &server.bundle_pem, &crl.der).unwrap_err();
    assert!(e.contains("revoked"), "{e}");
    let (replacement, _, _) = issue(&server, &tokens, "frontend").await;
    openssl_verify_crl(&replacement, &server.bundle_pem, &crl.der).unwrap();

    // mTLS renewal with the revoked certificate: refused, and audited.
    let id = ClientIdentity {
        cert_chain_pem: chain[0].clone().into_bytes(),
        key_pem: key.into_bytes(),
    };
    let kc = signet_client::new_key_and_csr().unwrap();
    let err = CertificateAuthorityClient::new(server.channel_with(&id).await)
        .sign_csr(SignCsrRequest {
            csr: kc.csr_der,
            ttl_seconds: 60,
            kubernetes_namespace: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("revoked"), "{}", err.message());
    let denied = audit_events(&server, "issue.denied", 1).await;
    assert!(
        denied
            .iter()
            .any(|(_, d)| d.contains(&serial) && d.contains("revoked")),
        "{denied:?}"
    );
    let revoked = audit_events(&server, "cert.revoke", 1).await;
    assert!(
        revoked.iter().any(|(_, d)| d.contains(&serial)),
        "{revoked:?}"
    );
    audit_events(&server, "admin.revoke", 1).await;

    // The ledger verifies with the event in the chain (recomputed by signetctl) ...
    let v = json(&server.signetctl(&["ledger", "verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["rows"].as_u64(), Some(server.cert_count().await));
    // ... and not once the database un-revokes the row: the column CRLs and renewal read is
    // cleared while the event stays (the review's break: verify said OK).
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (at, why): (Option<i64>, Option<String>) =
        sqlx::query_as("SELECT revoked_at, revocation_reason FROM certificates WHERE serial = $1")
            .bind(&serial)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(at.is_some() && why.is_some());
    sqlx::query(
        "UPDATE certificates SET revoked_at = NULL, revocation_reason = NULL WHERE serial = $1",
    )
    .bind(&serial)
    .execute(&pool)
    .await
    .unwrap();
    let out = server.signetctl(&["ledger", "verify", "--json"]);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("the database no longer marks it revoked"),
        "{v}"
    );
    sqlx::query(
        "UPDATE certificates SET revoked_at = $2, revocation_reason = $3 WHERE serial = $1",
    )
    .bind(&serial)
    .bind(at)
    .bind(&why)
    .execute(&pool)
    .await
    .unwrap();
    let v = json(&server.signetctl(&["ledger", "verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
    // ... and not once an event row is altered.
    sqlx::query("UPDATE ledger_events SET reason = 'superseded' WHERE serial = $1")
        .bind(&serial)
        .execute(&pool)
        .await
        .unwrap();
    let out = server.signetctl(&["ledger", "verify", "--json"]);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert!(v["error"].as_str().unwrap().contains("altered"), "{v}");
    // Deleted: the chain has a gap where the event was.
    sqlx::query("DELETE FROM ledger_events WHERE serial = $1")
        .bind(&serial)
        .execute(&pool)
        .await
        .unwrap();
    let out = server.signetctl(&["ledger", "verify", "--json"]);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["error"].as_str().unwrap().contains("missing"), "{v}");
    pool.close().await;
}

pub(crate) async fn node_admin(server: &Server) -> NodeAdminClient<tonic::transport::Channel> {
    NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    )
}

/// Attests `node_id`; returns its mTLS identity and node SVID serial.
pub(crate) async fn attest(server: &Server, node_id: &str) -> (ClientIdentity, String) {
    let t = node_admin(server)
        .await
        .create_join_token(CreateJoinTokenRequest {
            ttl_seconds: 0,
            node_id: node_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let kc = signet_client::new_key_and_csr().unwrap();
    let r = NodeClient::new(server.channel().await)
        .attest(AttestRequest {
            join_token: t,
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let svid = r.svid.unwrap();
    let id = ClientIdentity {
        cert_chain_pem: pems(&svid.cert_chain).concat().into_bytes(),
        key_pem: kc.key_pem.into_bytes(),
    };
    (id, svid.serial)
}

/// An entry under `node` and one workload certificate for it: (entry ID, serial).
async fn entry_cert(
    server: &Server,
    node: &ClientIdentity,
    node_id: &str,
    path: &str,
) -> (String, String) {
    let e = node_admin(server)
        .await
        .create_entry(CreateEntryRequest {
            spiffe_id: format!("spiffe://example.org/{path}"),
            parent: node_id.into(),
            selectors: vec!["unix:uid:1000".into()],
            ttl_seconds: 600,
            dns_names: vec![],
            jwt_ttl_seconds: 0,
            federates_with: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let w = signet_client::new_key_and_csr().unwrap();
    let r = NodeClient::new(server.channel_with(node).await)
        .sign_workloads(SignWorkloadsRequest {
            csrs: vec![WorkloadCsr {
                entry_id: e.id.clone(),
                csr: w.csr_der,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let svid = r.results[0].svid.as_ref().unwrap();
    (e.id, svid.serial.clone())
}

fn revoked_serials(v: &serde_json::Value) -> Vec<String> {
    let mut s: Vec<String> = v["revoked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["serial"].as_str().unwrap().to_owned())
        .collect();
    s.sort();
    s
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn revoke_by_spiffe_id_entry_node_and_ca_key() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = crate::pg_server(&tokens, "").await else {
        return;
    };
    // By SPIFFE ID: both certificates of web/api, not web/frontend's.
    let (_, _, a1) = issue(&server, &tokens, "api").await;
    let (_, _, a2) = issue(&server, &tokens, "api").await;
    let (_, _, f1) = issue(&server, &tokens, "frontend").await;
    let v = json(&server.signetctl(&[
        "certs",
        "revoke",
        "--spiffe-id",
        "spiffe://example.org/ns/web/sa/api",
        "--reason",
        "affiliationChanged",
        "--json",
    ]));
    assert_eq!(
        revoked_serials(&v),
        sorted(vec![a1.clone(), a2.clone()]),
        "{v}"
    );
    let out = server.signetctl(&[
        "certs",
        "revoke",
        "--spiffe-id",
        "spiffe://example.org/ns/never/sa/issued",
        "--reason",
        "superseded",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{out:?}"
    );

    // By entry: that entry's certificate only.
    let (n1, n1_svid) = attest(&server, "n1").await;
    let (n2, n2_svid) = attest(&server, "n2").await;
    let (e1, e1_cert) = entry_cert(&server, &n1, "n1", "app/one").await;
    let (_, e2_cert) = entry_cert(&server, &n1, "n1", "app/two").await;
    let (_, n2_cert) = entry_cert(&server, &n2, "n2", "app/three").await;
    let v = json(&server.signetctl(&[
        "certs",
        "revoke",
        "--entry",
        &e1,
        "--reason",
        "superseded",
        "--json",
    ]));
    assert_eq!(revoked_serials(&v), vec![e1_cert.clone()], "{v}");
    let out = server.signetctl(&[
        "certs",
        "revoke",
        "--entry",
        "nope",
        "--reason",
        "superseded",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{out:?}"
    );

    // By node, through `node ban --revoke`: n1's node SVID and its remaining entry
    // certificate; n2's stay. A bad reason is refused before the ban.
    let out = server.signetctl(&["node", "ban", "n1", "--revoke", "--reason", "nope"]);
    assert!(!out.status.success());
    let out = server.signetctl(&["node", "list", "--json"]);
    let nodes = String::from_utf8_lossy(&out.stdout);
    assert!(
        nodes
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .all(|n| n["banned"] == false),
        "{nodes}"
    );
    let out = server.signetctl(&["node", "ban", "n1", "--revoke"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("banned node n1"), "{text}");
    assert!(text.contains(&n1_svid) && text.contains(&e2_cert), "{text}");
    assert!(
        !text.contains(&n2_svid) && !text.contains(&n2_cert),
        "{text}"
    );
    assert!(text.contains("already revoked: 0"), "{text}");
    let show = |serial: &str| json(&server.signetctl(&["certs", "show", serial, "--json"]));
    assert_eq!(show(&n1_svid)["revocation_reason"], "keyCompromise");
    assert_eq!(show(&e1_cert)["revocation_reason"], "superseded");
    assert!(show(&n2_cert)["revoked_at"].is_null());

    // By CA key: everything still valid (f1, n2's, and the server's own TLS certificate).
    let key_id = show(&f1)["ca_key_id"].as_str().unwrap().to_owned();
    let dry = json(&server.signetctl(&[
        "certs",
        "revoke",
        "--ca-key",
        &key_id,
        "--reason",
        "cACompromise",
        "--dry-run",
        "--json",
    ]));
    assert_eq!(dry["dry_run"], true);
    let want = revoked_serials(&dry);
    assert!(want.contains(&f1) && want.contains(&n2_svid) && want.contains(&n2_cert));
    assert!(
        show(&f1)["revoked_at"].is_null(),
        "a dry run revokes nothing"
    );
    let v = json(&server.signetctl(&[
        "certs",
        "revoke",
        "--ca-key",
        &key_id,
        "--reason",
        "cACompromise",
        "--json",
    ]));
    // What the dry run listed, plus whatever the server issued itself in between (its own TLS
    // certificate is re-issued in the background when revoked, and renews on its own).
    let got = revoked_serials(&v);
    assert!(
        want.iter().all(|s| got.contains(s)),
        "{want:?} not in {got:?}"
    );
    for extra in got.iter().filter(|s| !want.contains(s)) {
        assert_eq!(
            show(extra)["spiffe_id"],
            "spiffe://example.org/signet/server",
            "{extra} was revoked by key but not listed by the dry run"
        );
    }
    // Every revoked certificate is in the CRL, with its reason.
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    let listed = crl_serials(
        &b.crls
            .iter()
            .find(|c| c.key_id == key_id)
            .expect("the key's CRL")
            .der,
    );
    for s in [
        &a1, &a2, &f1, &e1_cert, &e2_cert, &n1_svid, &n2_svid, &n2_cert,
    ] {
        assert!(listed.iter().any(|(l, _)| l == s), "{s} not in {listed:?}");
    }
    assert!(listed.contains(&(f1.clone(), Some(2))));
    assert!(listed.contains(&(a1.clone(), Some(3))));
    // The server's own TLS certificate was among them: it is replaced at once, and the
    // server keeps serving with the new one.
    let server_id = "spiffe://example.org/signet/server";
    let mut replaced = false;
    for _ in 0..100 {
        let out = server.signetctl(&["certs", "list", "--json", "--spiffe-id", server_id]);
        let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if rows.len() >= 2 && rows.last().unwrap()["revoked_at"].is_null() {
            assert!(rows[0]["revoked_at"].is_string(), "{rows:?}");
            replaced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(replaced, "the revoked server certificate was not replaced");
    issue(&server, &tokens, "after").await;
    let v = json(&server.signetctl(&["ledger", "verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
}

/// The CRL of the CA that issued `leaf_pem`, from `GetBundle`.
async fn bundle_crl(server: &Server, leaf_pem: &str) -> signet_proto::ca::Crl {
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    let key_id = issuer_key_id(leaf_pem);
    b.crls
        .iter()
        .find(|c| c.key_id == key_id)
        .unwrap_or_else(|| panic!("no CRL of {key_id}: {b:?}"))
        .clone()
}

/// Two replicas on one PostgreSQL: a revocation on one reaches the other's CRL (by its poll),
/// both serve the same bytes, numbers never repeat, the CRL is re-signed before nextUpdate
/// without any revocation, `WatchBundle` carries each new CRL, and the other replica refuses
/// the revoked certificate's renewal.
#[tokio::test]
async fn replicas_publish_the_same_crl_and_reissue_it_before_next_update() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    // Re-signed every 2 s (half of next_update); other replicas' revocations polled every 1 s.
    let crl_toml = "[crl]\nnext_update = \"4s\"\npoll_interval = \"1s\"\n";
    let a = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: crl_toml.into(),
        ..ServerOpts::default()
    })
    .await;
    let kek = std::fs::read_to_string(a.data_dir.join("kek")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kek_path = dir.path().join("kek");
    std::fs::write(&kek_path, kek).unwrap();
    let b = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: format!("{crl_toml}[ca]\nkek_file = \"{}\"\n", kek_path.display()),
        ..ServerOpts::default()
    })
    .await;
    let (chain, key, serial) = issue(&b, &tokens, "frontend").await;
    let mut watch = a
        .native()
        .await
        .watch_bundle(signet_proto::ca::WatchBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert!(
        first
            .crls
            .iter()
            .any(|c| c.key_id == issuer_key_id(&chain[0]))
    );

    let v = json(&a.signetctl(&[
        "certs",
        "revoke",
        &serial,
        "--reason",
        "superseded",
        "--json",
    ]));
    assert_eq!(v["revoked_count"], 1, "{v}");
    let on_a = bundle_crl(&a, &chain[0]).await;
    assert_eq!(crl_serials(&on_a.der), vec![(serial.clone(), Some(4))]);
    // The watch stream carries the new CRL.
    let pushed = loop {
        let m = watch.message().await.unwrap().unwrap();
        if m.crls.iter().any(|c| !crl_serials(&c.der).is_empty()) {
            break m;
        }
    };
    assert!(pushed.revision > first.revision);
    // B notices at its next poll, and serves the same bytes (or a later CRL that lists it).
    let key_id = on_a.key_id.clone();
    let mut on_b = None;
    for _ in 0..100 {
        let (code, _, body) = http_bytes(&b, &format!("/crl/{key_id}.crl")).await;
        if code == 200 && crl_serials(&body).iter().any(|(s, _)| s == &serial) {
            on_b = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on_b = on_b.expect("replica B never listed the revocation");
    let crl_b = signet_pki::ParsedCrl::from_der(&on_b).unwrap();
    let number_b = crl_b.number().unwrap();
    assert!(number_b >= on_a.number);
    // B refuses the revoked certificate's renewal (its row cache lives at most 1 s).
    let id = ClientIdentity {
        cert_chain_pem: chain[0].clone().into_bytes(),
        key_pem: key.into_bytes(),
    };
    let kc = signet_client::new_key_and_csr().unwrap();
    let err = CertificateAuthorityClient::new(b.channel_with(&id).await)
        .sign_csr(SignCsrRequest {
            csr: kc.csr_der,
            ttl_seconds: 60,
            kubernetes_namespace: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    // Without revocations, the CRL is re-signed before its nextUpdate, with a higher number,
    // still listing the serial; both replicas converge on one CRL per number.
    let mut seen = vec![on_a.number];
    let start = std::time::Instant::now();
    while seen.len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no re-issue: {seen:?}"
        );
        for s in [&a, &b] {
            let c = bundle_crl(s, &chain[0]).await;
            let parsed = signet_pki::ParsedCrl::from_der(&c.der).unwrap();
            let now = now_unix();
            assert!(
                signet_runtime::clock::unix(parsed.next_update().unwrap()) >= now,
                "a published CRL is past its nextUpdate"
            );
            assert_eq!(crl_serials(&c.der), vec![(serial.clone(), Some(4))]);
            if !seen.contains(&c.number) {
                assert!(
                    c.number > *seen.iter().max().unwrap(),
                    "{seen:?} then {}",
                    c.number
                );
                seen.push(c.number);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The same number is the same CRL on both replicas.
    for _ in 0..50 {
        let (ca, cb) = (
            bundle_crl(&a, &chain[0]).await,
            bundle_crl(&b, &chain[0]).await,
        );
        if ca.number == cb.number {
            assert_eq!(ca.der, cb.der);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ca_params(cn: &str) -> rcgen::CertificateParams {
    use rcgen::{BasicConstraints, DistinguishedName, DnType, IsCa, KeyUsagePurpose};
    let mut p = rcgen::CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.use_authority_key_identifier_extension = true;
    p
}

/// With a plugged-in intermediate (Istio's cacerts layout) the CRL is the intermediate's:
/// issued in its name, with its key identifier, and openssl checks a chain through it.
#[tokio::test]
async fn a_plugged_in_intermediate_signs_the_crl_of_what_it_issued() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let root_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let root = ca_params("Example Root CA").self_signed(&root_key).unwrap();
    let inter_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let root_issuer = rcgen::Issuer::new(ca_params("Example Root CA"), &root_key);
    let inter = ca_params("Example Mesh Intermediate")
        .signed_by(&inter_key, &root_issuer)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    std::fs::write(p("ca-cert.pem"), inter.pem()).unwrap();
    std::fs::write(p("ca-key.pem"), inter_key.serialize_pem()).unwrap();
    std::fs::write(
        p("cert-chain.pem"),
        format!("{}{}", inter.pem(), root.pem()),
    )
    .unwrap();
    std::fs::write(p("root-cert.pem"), root.pem()).unwrap();
    let server = Server::start(ServerOpts {
        database_url: Some(url),
        tokens: Some(tokens.jwks_json()),
        extra_toml: format!(
            "[ca]\ncert_file = \"{}\"\nkey_file = \"{}\"\nchain_file = \"{}\"\nroot_file = \"{}\"\n",
            p("ca-cert.pem").display(),
            p("ca-key.pem").display(),
            p("cert-chain.pem").display(),
            p("root-cert.pem").display()
        ),
        ..ServerOpts::default()
    })
    .await;
    let (chain, _, serial) = issue(&server, &tokens, "gateway").await;
    assert_eq!(chain.len(), 3, "leaf, intermediate, root");
    let (replacement, _, _) = issue(&server, &tokens, "gateway").await;
    let v = json(&server.signetctl(&[
        "certs",
        "revoke",
        &serial,
        "--reason",
        "keyCompromise",
        "--json",
    ]));
    assert_eq!(v["revoked_count"], 1, "{v}");
    let crl = bundle_crl(&server, &chain[0]).await;
    let parsed = signet_pki::ParsedCrl::from_der(&crl.der).unwrap();
    let inter_cert = signet_pki::ParsedCert::from_der(inter.der()).unwrap();
    assert_eq!(parsed.issuer_der(), inter_cert.subject_der());
    // The issuer name matches (again) and the signature verifies with its key.
    parsed.verify(&inter_cert).unwrap();
    let ski = inter_cert.subject_key_id().unwrap();
    assert_eq!(crl.key_id, ski);
    let root_pem = root.pem();
    let e = openssl_verify_crl_via(&chain[0], Some(&chain[1]), root_pem.as_bytes(), &crl.der)
        .unwrap_err();
    assert!(e.contains("revoked"), "{e}");
    openssl_verify_crl_via(
        &replacement[0],
        Some(&replacement[1]),
        root_pem.as_bytes(),
        &crl.der,
    )
    .unwrap();
}

/// The real agent against the real server: `signetctl certs revoke` of the certificate the
/// agent holds reaches the agent through the bundle stream (the server's CRL, verified by the
/// agent against the issuing CA); the agent replaces it at once, writes the CRL as `crl.pem`
/// beside the files, and serves it in both Workload API `crl` fields, as py-spiffe's own
/// Workload API stub reads them. `openssl verify -crl_check` with that `crl.pem` refuses the
/// revoked certificate and accepts its replacement.
#[tokio::test]
async fn the_agent_replaces_a_revoked_certificate_at_once_and_delivers_the_crl() {
    use crate::agent::{Agent, create_entry, create_token, eventually, write_config};
    let tokens = TokenIssuer::new("k1");
    // Long-lived workload certificates: without the revocation nothing would renew.
    let Some(server) = crate::pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/revoked-app";
    let token = create_token(&server, "vm-revoke");
    create_entry(&server, app, "vm-revoke", &["--ttl", "1h"]);
    let l = write_config(&server, &token, app);
    let agent = Agent::start(&l.config);
    // The sink's chain (leaf, intermediate), one PEM per certificate.
    let sink_leaf = |dir: &std::path::Path| {
        let pem = std::fs::read(dir.join("svid.pem")).ok()?;
        let certs = signet_types::pem::parse_certs(&pem).ok()?;
        (!certs.is_empty()).then(|| {
            certs
                .iter()
                .map(|d| signet_types::pem::cert_to_pem(d))
                .collect::<Vec<String>>()
        })
    };
    let first = eventually(30, "the files sink", || async { sink_leaf(&l.sink_dir) }).await;
    let serial = serial_of(&first[0]);

    let revoked_at = std::time::Instant::now();
    let out = server.signetctl(&["certs", "revoke", &serial, "--reason", "keyCompromise"]);
    assert!(out.status.success(), "{out:?}");
    let second = eventually(15, "a replacement in the files sink", || async {
        sink_leaf(&l.sink_dir).filter(|c| serial_of(&c[0]) != serial)
    })
    .await;
    let replaced_in = revoked_at.elapsed();
    eprintln!("revoked certificate replaced by the agent in {replaced_in:?}");
    assert!(replaced_in < Duration::from_secs(10), "{replaced_in:?}");

    // crl.pem beside the files lists the revoked serial; openssl agrees.
    let crl_pem = eventually(10, "crl.pem listing the serial", || async {
        let pem = std::fs::read(l.sink_dir.join("crl.pem")).ok()?;
        // One CRL per CA key (the root's and the intermediate's): the issuer's lists it.
        ::pem::parse_many(&pem).ok()?.into_iter().find_map(|b| {
            let der = b.contents().to_vec();
            crl_serials(&der)
                .iter()
                .any(|(s, _)| s == &serial)
                .then_some(der)
        })
    })
    .await;
    assert!(openssl_verify_crl(&first, &server.bundle_pem, &crl_pem).is_err());
    openssl_verify_crl(&second, &server.bundle_pem, &crl_pem).unwrap();

    // The Workload API's crl fields, through py-spiffe's stub (SPIRE leaves them empty).
    if let Some(python) = crate::workload_clients::python() {
        let v = eventually(15, "the CRL in py-spiffe's view", || async {
            let v =
                crate::workload_clients::py_fetch(&python, &l.socket, Some("localhost")).ok()?;
            let listed = |k: &str| {
                v[k].as_array()?.iter().find_map(|h| {
                    let der = unhex(h.as_str()?)?;
                    crl_serials(&der)
                        .iter()
                        .any(|(s, _)| s == &serial)
                        .then_some(())
                })
            };
            (listed("svid_crls").is_some() && listed("bundle_crls").is_some()).then_some(v)
        })
        .await;
        assert_eq!(v["svids"][0]["chain_pem"][0], second[0], "{v}");
    }
    agent.stop().await;
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
