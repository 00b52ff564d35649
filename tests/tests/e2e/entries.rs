//! Registration entries in bulk and pushed to nodes: `BatchCreateEntries` (all or nothing, each
//! entry validated as CreateEntry validates one; a duplicate of a stored entry refused by both)
//! over the admin socket and through
//! `signetctl entry create --file`, on the embedded SQLite and on PostgreSQL; and
//! `WatchEntries` across two server processes sharing one PostgreSQL (LISTEN/NOTIFY). The
//! real binaries.

use std::time::Duration;

use signet_client::ClientIdentity;
use signet_proto::admin::node_admin_client::NodeAdminClient;
use signet_proto::admin::{
    BanNodeRequest, BatchCreateEntriesRequest, CreateEntryRequest, CreateJoinTokenRequest,
    ListAuditEventsRequest, ListEntriesRequest,
};
use signet_proto::agent::node_client::NodeClient;
use signet_proto::agent::{AttestRequest, WatchEntriesRequest};
use signet_tests::*;
use tonic::Code;
use tonic::transport::Channel;

use crate::pg_server;

async fn node_admin(server: &Server) -> NodeAdminClient<Channel> {
    NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    )
}

fn req(td: &str, name: &str, parent: &str) -> CreateEntryRequest {
    CreateEntryRequest {
        spiffe_id: format!("spiffe://{td}/batch/{name}"),
        parent: parent.into(),
        selectors: vec!["unix:uid:1000".into()],
        ttl_seconds: 0,
        dns_names: vec![],
        jwt_ttl_seconds: 0,
        federates_with: vec![],
    }
}

async fn entry_count(server: &Server) -> usize {
    node_admin(server)
        .await
        .list_entries(ListEntriesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .len()
}

/// Every case of the batch RPC against one server.
async fn batch_rpc_cases(server: &Server) {
    let td = server.trust_domain.clone();
    let mut admin = node_admin(server).await;

    // 1,000 entries under two nodes in one call: one revision, the request's order.
    let entries: Vec<_> = (0..1000)
        .map(|i| req(&td, &format!("w{i}"), if i % 2 == 0 { "n1" } else { "n2" }))
        .collect();
    let r = admin
        .batch_create_entries(BatchCreateEntriesRequest { entries })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.entries.len(), 1000);
    assert!(r.revision > 0);
    assert!(r.entries.iter().all(|e| e.revision == r.revision));
    assert_eq!(
        r.entries[999].spiffe_id,
        format!("spiffe://{td}/batch/w999")
    );
    assert_eq!(
        r.entries[999].parent_id,
        format!("spiffe://{td}/signet/node/n2")
    );
    assert_eq!(entry_count(server).await, 1000);

    let refused = |entries: Vec<CreateEntryRequest>| {
        let mut admin = admin.clone();
        async move {
            admin
                .batch_create_entries(BatchCreateEntriesRequest { entries })
                .await
                .unwrap_err()
        }
    };
    // One bad entry refuses the whole batch, naming its index and CreateEntry's reason.
    let mut bad: Vec<_> = (0..10).map(|i| req(&td, &format!("x{i}"), "n1")).collect();
    bad[6].selectors = vec!["unix:uid:root".into()];
    let err = refused(bad).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("entry 6: selector"), "{err:?}");
    // Too many, and none.
    let many: Vec<_> = (0..1001)
        .map(|i| req(&td, &format!("m{i}"), "n1"))
        .collect();
    let err = refused(many).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("at most 1000"), "{err:?}");
    assert_eq!(refused(Vec::new()).await.code(), Code::InvalidArgument);
    // The same registration twice in the batch.
    let twice = vec![
        req(&td, "d0", "n1"),
        req(&td, "d1", "n1"),
        req(&td, "d0", "n1"),
    ];
    let err = refused(twice).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("entry 2: duplicates entry 0"),
        "{err:?}"
    );
    // The same registration as a stored entry (here the parent named by its SPIFFE ID).
    let stored = vec![
        req(&td, "new", "n1"),
        req(&td, "w3", &format!("spiffe://{td}/signet/node/n2")),
    ];
    let err = refused(stored).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("entry 1: "), "{err:?}");
    assert!(err.message().contains(&r.entries[3].id), "{err:?}");
    assert!(err.message().contains("already registered"), "{err:?}");
    // Nothing of any refused batch was written.
    assert_eq!(entry_count(server).await, 1000);
    // The single-entry call still takes what it always took.
    admin.create_entry(req(&td, "single", "n1")).await.unwrap();

    // Audited as one event naming the batch's revision.
    let mut found = false;
    for _ in 0..50 {
        let events = server
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
            .events;
        found = events.iter().any(|e| {
            e.kind == "admin.entry_batch_create"
                && e.detail.contains("1000 entries")
                && e.detail.contains(&format!("revision {}", r.revision))
        });
        if found {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(found, "no admin.entry_batch_create audit event");
}

#[tokio::test]
async fn batch_create_is_all_or_nothing_on_sqlite() {
    let server = Server::start(ServerOpts::default()).await;
    batch_rpc_cases(&server).await;
}

#[tokio::test]
async fn batch_create_is_all_or_nothing_on_postgres() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    batch_rpc_cases(&server).await;
}

/// A registration (SPIFFE ID, parent, set of selectors) is stored once: `CreateEntry` refuses
/// a repeat with AlreadyExists, as the batch does with InvalidArgument, both naming the stored
/// entry; a distinct registration is still accepted.
async fn duplicate_cases(server: &Server) {
    let td = server.trust_domain.clone();
    let mut admin = node_admin(server).await;
    let first = admin
        .create_entry(req(&td, "dup", "n1"))
        .await
        .unwrap()
        .into_inner();
    // The same again, the parent named by its SPIFFE ID and the selector repeated.
    let mut same = req(&td, "dup", &format!("spiffe://{td}/signet/node/n1"));
    same.selectors = vec!["unix:uid:1000".into(), "unix:uid:1000".into()];
    same.ttl_seconds = 60;
    let err = admin.create_entry(same).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().contains(&first.id), "{err:?}");
    assert!(err.message().contains("already registered"), "{err:?}");
    // A single create repeating a batch-created entry, and the other way round.
    let batch = admin
        .batch_create_entries(BatchCreateEntriesRequest {
            entries: vec![req(&td, "dup-batch", "n2")],
        })
        .await
        .unwrap()
        .into_inner();
    let err = admin
        .create_entry(req(&td, "dup-batch", "n2"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().contains(&batch.entries[0].id), "{err:?}");
    let err = admin
        .batch_create_entries(BatchCreateEntriesRequest {
            entries: vec![req(&td, "dup-new", "n1"), req(&td, "dup", "n1")],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("entry 1: "), "{err:?}");
    assert!(err.message().contains(&first.id), "{err:?}");
    // signetctl shows the refusal and fails.
    let out = server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        &format!("spiffe://{td}/batch/dup"),
        "--parent",
        "n1",
        "--selector",
        "unix:uid:1000",
    ]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&first.id),
        "{out:?}"
    );
    // Nothing was written by any refusal.
    assert_eq!(entry_count(server).await, 2);
    // Distinct registrations are accepted: other selectors, another parent.
    let mut other = req(&td, "dup", "n1");
    other.selectors = vec!["unix:uid:1000".into(), "unix:gid:1000".into()];
    admin.create_entry(other).await.unwrap();
    admin.create_entry(req(&td, "dup", "n2")).await.unwrap();
    assert_eq!(entry_count(server).await, 4);
}

#[tokio::test]
async fn a_duplicate_entry_is_refused_by_single_and_batch_create_on_sqlite() {
    let server = Server::start(ServerOpts::default()).await;
    duplicate_cases(&server).await;
}

#[tokio::test]
async fn a_duplicate_entry_is_refused_by_single_and_batch_create_on_postgres() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    duplicate_cases(&server).await;
}

async fn cli_file_cases(server: &Server) {
    let td = server.trust_domain.clone();
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("entries.yaml");
    std::fs::write(
        &yaml,
        format!(
            "- spiffe_id: spiffe://{td}/f/a\n  parent: n1\n  selectors: [unix:uid:1]\n  ttl: 10m\n  \
             dns_names: [a.example.org]\n- spiffe_id: spiffe://{td}/f/b\n  parent: n1\n  \
             selectors: [unix:uid:2]\n"
        ),
    )
    .unwrap();
    let out = server.signetctl(&["entry", "create", "--file", yaml.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let ids: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(ids.len(), 2, "{out:?}");

    let json = dir.path().join("entries.json");
    std::fs::write(
        &json,
        format!(
            r#"[{{"spiffe_id":"spiffe://{td}/f/c","parent":"n2","selectors":["unix:uid:3"],"ttl":600}}]"#
        ),
    )
    .unwrap();
    let out = server.signetctl(&[
        "entry",
        "create",
        "--file",
        json.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["spiffe_id"], format!("spiffe://{td}/f/c"));
    assert_eq!(e["ttl_seconds"], 600);
    assert_eq!(entry_count(server).await, 3);

    // An unknown field is refused by name, before anything reaches the server.
    std::fs::write(
        &yaml,
        format!("- spiffe_id: spiffe://{td}/f/d\n  parent: n1\n  selector: [unix:uid:1]\n"),
    )
    .unwrap();
    let out = server.signetctl(&["entry", "create", "--file", yaml.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown field `selector`"), "{stderr}");
    // A bad entry: the server's reason, with its index; nothing created.
    std::fs::write(
        &yaml,
        format!(
            "- {{spiffe_id: spiffe://{td}/f/e, parent: n1, selectors: [unix:uid:5]}}\n\
             - {{spiffe_id: spiffe://{td}/signet/f, parent: n1, selectors: [unix:uid:5]}}\n"
        ),
    )
    .unwrap();
    let out = server.signetctl(&["entry", "create", "--file", yaml.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("entry 1: "), "{stderr}");
    assert!(stderr.contains("reserved"), "{stderr}");
    assert_eq!(entry_count(server).await, 3);
    // --file and the one-entry flags do not mix.
    let out = server.signetctl(&[
        "entry",
        "create",
        "--file",
        yaml.to_str().unwrap(),
        "--parent",
        "n1",
    ]);
    assert!(!out.status.success());
}

#[tokio::test]
async fn signetctl_entry_create_file_on_sqlite() {
    let server = Server::start(ServerOpts::default()).await;
    cli_file_cases(&server).await;
}

#[tokio::test]
async fn signetctl_entry_create_file_on_postgres() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    cli_file_cases(&server).await;
}

/// Attests `node_id` through `server` with a fresh join token; its mTLS identity.
async fn attest(server: &Server, node_id: &str) -> ClientIdentity {
    let token = node_admin(server)
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
            join_token: token,
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let chain: String = r
        .svid
        .unwrap()
        .cert_chain
        .iter()
        .map(|d| signet_types::pem::cert_to_pem(d))
        .collect();
    ClientIdentity {
        cert_chain_pem: chain.into_bytes(),
        key_pem: kc.key_pem.into_bytes(),
    }
}

#[tokio::test]
async fn an_entry_created_through_one_replica_wakes_a_stream_on_another() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let a = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        ..ServerOpts::default()
    })
    .await;
    // B is a replica of A: the same database and the same key-encryption key.
    let shared = tempfile::tempdir().unwrap();
    let kek = shared.path().join("kek");
    std::fs::copy(a.data_dir.join("kek"), &kek).unwrap();
    let b = Server::start(ServerOpts {
        database_url: Some(url),
        extra_toml: format!("[ca]\nkek_file = \"{}\"\n", kek.display()),
        ..ServerOpts::default()
    })
    .await;
    let td = a.trust_domain.clone();
    let n1 = attest(&a, "n1").await;
    let mut watch = NodeClient::new(b.channel_with(&n1).await);
    let mut stream = watch
        .watch_entries(WatchEntriesRequest {})
        .await
        .unwrap()
        .into_inner();
    // The revision at once.
    assert_eq!(stream.message().await.unwrap().unwrap().revision, 0);

    // Well inside the first keep-alive (15 s): only the notification can bring these.
    let within = Duration::from_secs(8);
    let mut next = async || {
        tokio::time::timeout(within, stream.message())
            .await
            .expect("B's stream was not woken by a change made through A")
            .unwrap()
            .expect("stream ended")
            .revision
    };
    let mut admin_a = node_admin(&a).await;
    let e1 = admin_a
        .create_entry(req(&td, "one", "n1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next().await, e1.revision);

    // Another node's entry is not this node's business: it moves nothing on n1's stream, so
    // the next message is the batch's revision.
    admin_a.create_entry(req(&td, "other", "n2")).await.unwrap();
    let batch: Vec<_> = (0..100).map(|i| req(&td, &format!("b{i}"), "n1")).collect();
    let r = admin_a
        .batch_create_entries(BatchCreateEntriesRequest { entries: batch })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next().await, r.revision);

    // At most 4 streams per node on one replica.
    let mut extra = Vec::new();
    for _ in 0..3 {
        extra.push(
            watch
                .watch_entries(WatchEntriesRequest {})
                .await
                .unwrap()
                .into_inner(),
        );
    }
    let err = watch
        .watch_entries(WatchEntriesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    // Not a node (no client certificate): refused as SyncEntries refuses it.
    let err = NodeClient::new(b.channel().await)
        .watch_entries(WatchEntriesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    // A banned node opens no new stream.
    drop(extra);
    node_admin(&a)
        .await
        .ban_node(BanNodeRequest {
            node_id: "n1".into(),
        })
        .await
        .unwrap();
    let err = watch
        .watch_entries(WatchEntriesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
}

/// `signetctl bench --workloads N` (a figure-printing program, run here with a fixed small
/// amount of work, asserting only what it did, never how fast): it attests a node, creates its
/// N entries, signs N CSRs per `SignWorkloads` call and verifies the ledger.
#[tokio::test]
async fn signetctl_bench_workloads_signs_batches_and_verifies_the_ledger() {
    let server = Server::start(ServerOpts::default()).await;
    let before = server.cert_count().await;
    let addr = format!("https://{}", server.grpc);
    let out = server.signetctl(&[
        "bench",
        "--addr",
        &addr,
        "--server-name",
        "localhost",
        "--workloads",
        "4",
        "-c",
        "2",
        "--requests",
        "6",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("issued:        6 calls"), "{stdout}");
    assert!(stdout.contains("4 per call"), "{stdout}");
    assert!(stdout.contains("refused certs: 0"), "{stdout}");
    assert!(stdout.contains("hash chain intact"), "{stdout}");
    // The node's certificate and 6 calls of 4 workload certificates.
    assert!(server.cert_count().await >= before + 1 + 24);
    let entries = node_admin(&server)
        .await
        .list_entries(ListEntriesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(entries.len(), 4);
    assert!(
        entries
            .iter()
            .all(|e| e.parent_id.contains("/signet/node/bench-"))
    );
    // A batch the server would refuse is refused before anything is set up.
    let out = server.signetctl(&["bench", "--addr", &addr, "--workloads", "257"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 to 256"),
        "{out:?}"
    );
}

/// An entry naming the server's own DNS name (or a wildcard covering it) could only ever fail
/// at signing, so its workload would silently never get a certificate: creation refuses it,
/// single and batch, with the name and the reason. A name beside them is fine.
#[tokio::test]
async fn an_entry_with_the_servers_own_dns_name_is_refused_at_creation() {
    let server = Server::start(ServerOpts {
        extra_toml: "server_names = [\"signet.example.org\"]\n".into(),
        ..ServerOpts::default()
    })
    .await;
    let td = server.trust_domain.clone();
    let create = |dns: &str| {
        server.signetctl(&[
            "entry",
            "create",
            "--spiffe-id",
            &format!("spiffe://{td}/web"),
            "--parent",
            "n1",
            "--selector",
            "unix:uid:1000",
            "--dns",
            "web.example.org",
            "--dns",
            dns,
        ])
    };
    for (dns, named) in [
        (
            "signet.example.org",
            "DNS name signet.example.org is the CA server's own name",
        ),
        (
            "localhost",
            "DNS name localhost is the CA server's own name",
        ),
        (
            "*.example.org",
            "DNS name signet.example.org (through *.example.org)",
        ),
    ] {
        let out = create(dns);
        assert!(!out.status.success(), "{dns}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{dns}: {stderr}");
        assert!(stderr.contains("would never get a certificate"), "{stderr}");
    }
    // A batch: refused whole, naming the entry's index.
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("entries.yaml");
    std::fs::write(
        &yaml,
        format!(
            "- {{spiffe_id: spiffe://{td}/a, parent: n1, selectors: [unix:uid:1]}}\n\
             - {{spiffe_id: spiffe://{td}/b, parent: n1, selectors: [unix:uid:2], \
             dns_names: [signet.example.org]}}\n"
        ),
    )
    .unwrap();
    let out = server.signetctl(&["entry", "create", "--file", yaml.to_str().unwrap()]);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("entry 1: DNS name signet.example.org is the CA server's own name"),
        "{stderr}"
    );
    assert_eq!(entry_count(&server).await, 0, "nothing created");
    // The same over the RPC: InvalidArgument.
    let mut bad = req(&td, "rpc", "n1");
    bad.dns_names = vec!["SIGNET.example.org".into()];
    let err = node_admin(&server)
        .await
        .create_entry(bad)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("signet.example.org"), "{err:?}");
    // Names that are not the server's are accepted.
    let out = create("api.example.com");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(entry_count(&server).await, 1);
}
