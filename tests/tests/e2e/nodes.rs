//! The node-agent server side: join tokens, attestation, node renewal over mTLS, registration
//! entries, SignWorkloads, bans. Against PostgreSQL, the real binary, real TLS.

use std::time::Duration;

use signet_client::ClientIdentity;
use signet_proto::admin::node_admin_client::NodeAdminClient;
use signet_proto::admin::{
    BanNodeRequest, CreateEntryRequest, CreateJoinTokenRequest, DeleteEntryRequest,
    GetCertificateRequest, ListAuditEventsRequest, ListNodesRequest,
};
use signet_proto::agent::node_client::NodeClient;
use signet_proto::agent::{
    AttestRequest, RenewNodeRequest, SignWorkloadsRequest, Svid, SyncEntriesRequest, WorkloadCsr,
};
use signet_proto::ca::SignCsrRequest;
use signet_tests::*;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::pg_server;

fn pem_chain(svid: &Svid) -> Vec<String> {
    svid.cert_chain
        .iter()
        .map(|d| signet_types::pem::cert_to_pem(d))
        .collect()
}

async fn node_admin(server: &Server) -> NodeAdminClient<Channel> {
    NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    )
}

async fn token(server: &Server, node_id: &str, ttl: i64) -> String {
    let r = node_admin(server)
        .await
        .create_join_token(CreateJoinTokenRequest {
            ttl_seconds: ttl,
            node_id: node_id.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.node_id, node_id);
    r.token
}

/// Attests `node_id` with a fresh token; returns its mTLS identity and SVID.
async fn attest(server: &Server, node_id: &str) -> (ClientIdentity, Svid) {
    let t = token(server, node_id, 0).await;
    let kc = signet_client::new_key_and_csr().unwrap();
    let r = NodeClient::new(server.channel().await)
        .attest(AttestRequest {
            join_token: t,
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.node_id, node_id);
    assert!(!r.bundle.is_empty());
    let svid = r.svid.unwrap();
    let id = ClientIdentity {
        cert_chain_pem: pem_chain(&svid).concat().into_bytes(),
        key_pem: kc.key_pem.into_bytes(),
    };
    (id, svid)
}

async fn node_client(server: &Server, id: &ClientIdentity) -> NodeClient<Channel> {
    NodeClient::new(server.channel_with(id).await)
}

async fn audit_kinds(server: &Server) -> Vec<(String, String, String)> {
    // The audit log is written in the background: give it a moment.
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
        if events.iter().any(|e| e.kind == "node.denied") {
            return events
                .into_iter()
                .map(|e| (e.kind, e.caller, e.detail))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Vec::new()
}

#[tokio::test]
async fn join_token_attests_once_and_the_node_svid_is_real() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let t = token(&server, "n1", 0).await;
    let kc = signet_client::new_key_and_csr().unwrap();
    let mut anon = NodeClient::new(server.channel().await);
    let r = anon
        .attest(AttestRequest {
            join_token: t.clone(),
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let svid = r.svid.unwrap();
    let td_node = svid.spiffe_id.clone();
    assert!(td_node.ends_with("/signet/node/n1"), "{td_node}");
    let chain = pem_chain(&svid);
    openssl_verify(&chain, &server.bundle_pem).unwrap();
    assert_eq!(uri_sans(&chain[0]), vec![td_node.clone()]);
    // In the ledger, recorded for the node.
    let row = server
        .admin()
        .await
        .get_certificate(GetCertificateRequest {
            serial: svid.serial.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(row.spiffe_id, td_node);
    assert_eq!(row.caller, format!("node:{td_node}"));
    // Listed as a node.
    let nodes = node_admin(&server)
        .await
        .list_nodes(ListNodesRequest {})
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert_eq!(nodes.len(), 1);
    assert_eq!((nodes[0].node_id.as_str(), nodes[0].banned), ("n1", false));
    assert_eq!(nodes[0].serial, svid.serial);

    // The token is spent.
    let err = anon
        .attest(AttestRequest {
            join_token: t.clone(),
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("already been used"), "{err:?}");
    assert!(
        !err.message().contains(&t[4..]),
        "the token leaked: {err:?}"
    );

    // An unknown and a malformed token.
    let err = anon
        .attest(AttestRequest {
            join_token: format!("sjt_{}", "0".repeat(64)),
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = anon
        .attest(AttestRequest {
            join_token: "hunter2".into(),
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(!err.message().contains("hunter2"));

    // An expired token (one second of life).
    let short = token(&server, "n2", 1).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let err = anon
        .attest(AttestRequest {
            join_token: short,
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("expired"), "{err:?}");

    // The token never shows in the server's output.
    let stdout = server.stdout.join("\n");
    assert!(!stdout.contains(&t[4..]));
}

#[tokio::test]
async fn racing_agents_with_one_token_attest_once() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let t = token(&server, "racer", 0).await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let ch = server.channel().await;
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            let kc = signet_client::new_key_and_csr().unwrap();
            NodeClient::new(ch)
                .attest(AttestRequest {
                    join_token: t,
                    csr: kc.csr_der,
                })
                .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e.code(), Code::Unauthenticated, "{e:?}"),
        }
    }
    assert_eq!(ok, 1);
}

#[tokio::test]
async fn node_renews_syncs_entries_signs_workloads_and_is_banned() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let (n1, svid) = attest(&server, "n1").await;
    let (n2, _) = attest(&server, "n2").await;
    let node_id = svid.spiffe_id.clone();
    let td = node_id
        .strip_prefix("spiffe://")
        .and_then(|s| s.split('/').next())
        .unwrap()
        .to_owned();
    let mut c1 = node_client(&server, &n1).await;

    // RenewNode over mTLS: the same ID, a new serial, in the ledger.
    let kc = signet_client::new_key_and_csr().unwrap();
    let renewed = c1
        .renew_node(RenewNodeRequest {
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.spiffe_id, node_id);
    assert_ne!(renewed.serial, svid.serial);
    openssl_verify(&pem_chain(&renewed), &server.bundle_pem).unwrap();

    // A node SVID may not use SignCsr.
    let err = signet_proto::ca::certificate_authority_client::CertificateAuthorityClient::new(
        server.channel_with(&n1).await,
    )
    .sign_csr(SignCsrRequest {
        csr: kc.csr_der.clone(),
        ttl_seconds: 0,
        kubernetes_namespace: String::new(),
    })
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Entries: nothing yet.
    let s = c1
        .sync_entries(SyncEntriesRequest { known_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(s.unchanged);
    assert_eq!(s.revision, 0);

    let out = server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        &format!("spiffe://{td}/app/web"),
        "--parent",
        "n1",
        "--selector",
        "unix:uid:1000",
        "--selector",
        "unix:path:/usr/bin/web",
        "--ttl",
        "10m",
        "--dns",
        "web.example.org",
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry_id = e["id"].as_str().unwrap().to_owned();
    // Bad selectors are refused at creation.
    let out = server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        &format!("spiffe://{td}/app/x"),
        "--parent",
        "n1",
        "--selector",
        "unix:uid:root",
    ]);
    assert!(!out.status.success());
    // An entry for n2.
    let other = node_admin(&server)
        .await
        .create_entry(CreateEntryRequest {
            spiffe_id: format!("spiffe://{td}/app/db"),
            parent: "n2".into(),
            selectors: vec!["unix:uid:999".into()],
            ttl_seconds: 0,
            dns_names: vec![],
            jwt_ttl_seconds: 0,
            federates_with: vec![],
        })
        .await
        .unwrap()
        .into_inner();

    let s = c1
        .sync_entries(SyncEntriesRequest { known_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(!s.unchanged);
    assert_eq!(s.entries.len(), 1);
    assert_eq!(s.entries[0].id, entry_id);
    assert_eq!(s.entries[0].parent_id, node_id);
    assert_eq!(s.entries[0].ttl_seconds, 600);
    let rev = s.revision;
    assert!(rev > 0);
    // n2's entry does not change n1's revision.
    let s = c1
        .sync_entries(SyncEntriesRequest {
            known_revision: rev,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(s.unchanged);
    assert!(s.entries.is_empty());

    // SignWorkloads: its own entry, and n2's.
    let w = signet_client::new_key_and_csr().unwrap();
    let r = c1
        .sign_workloads(SignWorkloadsRequest {
            csrs: vec![
                WorkloadCsr {
                    entry_id: entry_id.clone(),
                    csr: w.csr_der.clone(),
                },
                WorkloadCsr {
                    entry_id: other.id.clone(),
                    csr: w.csr_der.clone(),
                },
                WorkloadCsr {
                    entry_id: "no-such-entry".into(),
                    csr: w.csr_der.clone(),
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.results.len(), 3);
    let ok = &r.results[0];
    assert_eq!(ok.code, 0, "{ok:?}");
    let ws = ok.svid.as_ref().unwrap();
    assert_eq!(ws.spiffe_id, format!("spiffe://{td}/app/web"));
    assert!(ws.not_after - ws.not_before <= 600 + 60, "{ws:?}");
    let chain = pem_chain(ws);
    openssl_verify(&chain, &server.bundle_pem).unwrap();
    let row = server
        .admin()
        .await
        .get_certificate(GetCertificateRequest {
            serial: ws.serial.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(row.caller, format!("node:{node_id}"));
    assert_eq!(row.dns_names, ["web.example.org"]);
    for denied in &r.results[1..] {
        assert_eq!(denied.code, Code::PermissionDenied as i32, "{denied:?}");
        assert!(denied.svid.is_none());
    }

    // n2 cannot renew as n1 through its own identity, nor take n1's entry.
    let mut c2 = node_client(&server, &n2).await;
    let r2 = c2
        .sign_workloads(SignWorkloadsRequest {
            csrs: vec![WorkloadCsr {
                entry_id: entry_id.clone(),
                csr: w.csr_der.clone(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r2.results[0].code, Code::PermissionDenied as i32);

    // A deletion is visible to the poll.
    node_admin(&server)
        .await
        .delete_entry(DeleteEntryRequest {
            id: entry_id.clone(),
        })
        .await
        .unwrap();
    let s = c1
        .sync_entries(SyncEntriesRequest {
            known_revision: rev,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!s.unchanged);
    assert!(s.revision > rev);
    assert!(s.entries.is_empty());
    let out = server.signetctl(&["entry", "list", "--parent", "n2", "--json"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);

    // Ban n2: it can renew nothing and sign nothing.
    let out = server.signetctl(&["node", "ban", "n2"]);
    assert!(out.status.success(), "{out:?}");
    let err = c2
        .renew_node(RenewNodeRequest {
            csr: kc.csr_der.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("banned"), "{err:?}");
    let err = c2
        .sign_workloads(SignWorkloadsRequest {
            csrs: vec![WorkloadCsr {
                entry_id: other.id.clone(),
                csr: w.csr_der.clone(),
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = c2
        .sync_entries(SyncEntriesRequest { known_revision: 0 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    // n1 is unaffected.
    c1.renew_node(RenewNodeRequest {
        csr: kc.csr_der.clone(),
    })
    .await
    .unwrap();
    let out = server.signetctl(&["node", "list", "--json"]);
    let listed: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let banned: Vec<_> = listed
        .iter()
        .filter(|n| n["banned"] == serde_json::json!(true))
        .map(|n| n["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(banned, ["n2"]);
    // Banning an unknown node is NotFound.
    let err = node_admin(&server)
        .await
        .ban_node(BanNodeRequest {
            node_id: "ghost".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let events = audit_kinds(&server).await;
    let n2_id = node_id.replace("/n1", "/n2");
    assert!(
        events.iter().any(|(k, c, d)| k == "node.denied"
            && c == &format!("node:{n2_id}")
            && d.contains("banned")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|(k, _, _)| k == "admin.node_ban"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(k, _, d)| k == "issue.denied" && d.contains("policy.entry")),
        "{events:?}"
    );
}

#[tokio::test]
async fn signetctl_token_create_prints_only_the_token() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let out = server.signetctl(&["token", "create", "--ttl", "10m", "--node-id", "vm-1"]);
    assert!(out.status.success(), "{out:?}");
    let t = String::from_utf8(out.stdout).unwrap();
    let t = t.trim();
    assert!(t.starts_with("sjt_") && t.len() == 68, "{t}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("vm-1"), "{err}");
    // It attests vm-1.
    let kc = signet_client::new_key_and_csr().unwrap();
    let r = NodeClient::new(server.channel().await)
        .attest(AttestRequest {
            join_token: t.to_owned(),
            csr: kc.csr_der,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.node_id, "vm-1");
    let out = server.signetctl(&["node", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("vm-1"));
    // A bad node ID is refused.
    let out = server.signetctl(&["token", "create", "--node-id", "a/b"]);
    assert!(!out.status.success());

    // Both services report SERVING: Node on the TLS listener, NodeAdmin on the admin socket.
    let mut health = HealthClient::new(server.channel().await);
    let st = health
        .check(HealthCheckRequest {
            service: "signet.agent.v1.Node".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.status, 1, "SERVING");
    let mut admin_health = HealthClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    );
    let st = admin_health
        .check(HealthCheckRequest {
            service: "signet.admin.v1.NodeAdmin".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.status, 1, "SERVING");

    // The node API needs a node SVID: nothing, or a bearer token, is refused.
    let mut anon = NodeClient::new(server.channel().await);
    let err = anon
        .sync_entries(SyncEntriesRequest { known_revision: 0 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let req = signet_client::with_bearer(
        SyncEntriesRequest { known_revision: 0 },
        &tokens.token("default", "web"),
    )
    .unwrap();
    let err = anon.sync_entries(req).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}
