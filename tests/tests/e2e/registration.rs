//! The Registration service (`signet.ca.v1.Registration`): the Kubernetes bridge keeps
//! entries whose parent is a node set, scope by scope, on the server's TLS port. Against
//! PostgreSQL and the real binary; the bridge authenticates with a service-account token.

use signet_proto::ca::registration_client::RegistrationClient;
use signet_proto::ca::{
    ListOwnedEntriesRequest, OwnedEntry, SyncOwnedEntriesRequest, SyncOwnedEntriesResponse,
};
use signet_tests::*;
use sqlx::Connection;
use tonic::Code;

const BRIDGE: &str = "spiffe://example.org/ns/signet-system/sa/signet-k8s";

const TOML: &str = r#"
[policy.kubernetes_bridge]
callers = ["spiffe://example.org/ns/signet-system/sa/signet-k8s",
           "spiffe://example.org/ns/other-system/sa/bridge"]
node_sets = ["k8s"]
"#;

fn owned(spiffe_id: &str, ttl: i64) -> OwnedEntry {
    OwnedEntry {
        spiffe_id: spiffe_id.into(),
        node_set: "k8s".into(),
        selectors: vec!["k8s:ns:team-a".into(), "k8s:sa:web".into()],
        ttl_seconds: ttl,
        dns_names: vec!["web.team-a.svc".into()],
        jwt_ttl_seconds: 0,
        federates_with: vec![],
    }
}

async fn sync(
    server: &Server,
    token: &str,
    scope: &str,
    entries: Vec<OwnedEntry>,
) -> Result<SyncOwnedEntriesResponse, tonic::Status> {
    let req = signet_client::with_bearer(
        SyncOwnedEntriesRequest {
            scope: scope.into(),
            entries,
        },
        token,
    )
    .unwrap();
    RegistrationClient::new(server.channel().await)
        .sync_owned_entries(req)
        .await
        .map(tonic::Response::into_inner)
}

/// `signetctl entry list --json`, one object per entry.
fn entry_list(server: &Server) -> Vec<serde_json::Value> {
    let out = server.signetctl(&["entry", "list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn the_bridge_keeps_its_own_entries_under_a_node_set() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: TOML.into(),
        ..ServerOpts::default()
    })
    .await;
    let bridge = tokens.token("signet-system", "signet-k8s");
    let web = "spiffe://example.org/ns/team-a/sa/web";

    // The node set does not exist yet: refused, naming it.
    let err = sync(&server, &bridge, "Identity/team-a/web", vec![owned(web, 0)])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message()
            .starts_with("entry 0: node set k8s does not exist"),
        "{err:?}"
    );
    // The operator makes it (with SQL: the node-set admin commands land apart), and an entry of
    // their own with the same SPIFFE ID under a node.
    let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO node_sets (name, selectors, created_at) \
         VALUES ('k8s', '[\"signet:attestation:k8s_psat\"]', 1)",
    )
    .execute(&mut db)
    .await
    .unwrap();
    let out = server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        web,
        "--parent",
        "n1",
        "--selector",
        "k8s:ns:team-a",
    ]);
    assert!(out.status.success(), "{out:?}");

    // Created.
    let first = sync(
        &server,
        &bridge,
        "Identity/team-a/web",
        vec![
            owned(web, 0),
            owned("spiffe://example.org/ns/team-a/sa/api", 0),
        ],
    )
    .await
    .unwrap();
    assert_eq!((first.created, first.updated, first.deleted), (2, 0, 0));
    assert!(first.revision > 0);
    let list = entry_list(&server);
    assert_eq!(list.len(), 3, "{list:?}");
    let owned_rows: Vec<&serde_json::Value> =
        list.iter().filter(|e| e["owner"] == BRIDGE).collect();
    assert_eq!(owned_rows.len(), 2, "{list:?}");
    for e in &owned_rows {
        assert_eq!(e["owner_scope"], "Identity/team-a/web");
        assert_eq!(e["parent_id"], "spiffe://example.org/signet/nodeset/k8s");
    }
    let table = server.signetctl(&["entry", "list"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.lines().next().unwrap().ends_with("OWNER"), "{table}");
    assert!(
        table.contains(&format!("{BRIDGE} (Identity/team-a/web)")),
        "{table}"
    );

    // The same list again: nothing written.
    let again = sync(
        &server,
        &bridge,
        "Identity/team-a/web",
        vec![
            owned(web, 0),
            owned("spiffe://example.org/ns/team-a/sa/api", 0),
        ],
    )
    .await
    .unwrap();
    assert_eq!((again.unchanged, again.revision), (2, 0));
    assert_eq!(again.entry_ids, first.entry_ids);

    // Listed a page at a time, following the server's tokens (review finding F4): one entry
    // per page, both seen once; a token the server never gave is refused.
    let mut pager = RegistrationClient::new(server.channel().await);
    let (mut seen, mut token) = (Vec::new(), String::new());
    for _ in 0..4 {
        let page = pager
            .list_owned_entries(
                signet_client::with_bearer(
                    ListOwnedEntriesRequest {
                        page_token: token.clone(),
                        page_size: 1,
                        ..Default::default()
                    },
                    &bridge,
                )
                .unwrap(),
            )
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 1, "{page:?}");
        seen.extend(page.entries.into_iter().map(|e| e.id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert!(token.is_empty(), "the listing did not end");
    let mut want = first.entry_ids.clone();
    want.sort();
    assert_eq!(seen, want);
    let err = pager
        .list_owned_entries(
            signet_client::with_bearer(
                ListOwnedEntriesRequest {
                    page_token: "no such token".into(),
                    ..Default::default()
                },
                &bridge,
            )
            .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    // Updated in place (same id), the other one deleted.
    let second = sync(
        &server,
        &bridge,
        "Identity/team-a/web",
        vec![owned(web, 600)],
    )
    .await
    .unwrap();
    assert_eq!((second.created, second.updated, second.deleted), (0, 1, 1));
    assert_eq!(second.entry_ids[0], first.entry_ids[0]);
    let list = entry_list(&server);
    let kept = list
        .iter()
        .find(|e| e["id"] == first.entry_ids[0].as_str())
        .unwrap();
    assert_eq!(kept["ttl_seconds"], 600);

    // A second bridge sees none of it and cannot touch it: its own scope of the same name
    // is its own.
    let other = tokens.token("other-system", "bridge");
    let mut client = RegistrationClient::new(server.channel().await);
    let theirs = client
        .list_owned_entries(
            signet_client::with_bearer(ListOwnedEntriesRequest::default(), &other).unwrap(),
        )
        .await
        .unwrap()
        .into_inner();
    assert!(theirs.entries.is_empty(), "{theirs:?}");
    let emptied = sync(&server, &other, "Identity/team-a/web", vec![])
        .await
        .unwrap();
    assert_eq!((emptied.deleted, emptied.revision), (0, 0));
    let mine = client
        .list_owned_entries(
            signet_client::with_bearer(
                ListOwnedEntriesRequest {
                    scope: "Identity/team-a/web".into(),
                    ..Default::default()
                },
                &bridge,
            )
            .unwrap(),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.entries.len(), 1);
    assert_eq!(mine.entries[0].entry.as_ref().unwrap().node_set, "k8s");

    // Not a bridge: refused, audited; another namespace's ID and /signet/ too.
    let err = sync(
        &server,
        &tokens.token("team-a", "web"),
        "Identity/team-a/web",
        vec![],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("is not a Kubernetes bridge"),
        "{err:?}"
    );
    for id in [
        "spiffe://example.org/ns/team-b/sa/web",
        "spiffe://example.org/signet/node/n1",
    ] {
        let err = sync(&server, &bridge, "Identity/team-a/web", vec![owned(id, 0)])
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{id}: {err:?}");
    }
    // The audit log is written in the background: wait for it.
    let mut audit = String::new();
    for _ in 0..50 {
        let out = server.signetctl(&["audit", "list", "--json"]);
        audit = String::from_utf8_lossy(&out.stdout).into_owned();
        if audit.contains("registration.denied") && audit.contains("registration.sync") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(audit.contains("registration.denied"), "{audit}");
    assert!(audit.contains("registration.sync"), "{audit}");

    // Deleting the scope leaves the operator's entry with the same SPIFFE ID.
    let gone = sync(&server, &bridge, "Identity/team-a/web", vec![])
        .await
        .unwrap();
    assert_eq!(gone.deleted, 1);
    let list = entry_list(&server);
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["spiffe_id"], web);
    assert_eq!(list[0]["owner"], "");

    let (_, metrics) = server.http_get("/metrics").await;
    assert!(
        metrics.contains("signet_registration_syncs_total{outcome=\"changed\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("signet_registration_syncs_total{outcome=\"permission_denied\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn registration_is_off_without_node_sets() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = crate::pg_server(
        &tokens,
        "[policy.kubernetes_bridge]\ncallers = [\"spiffe://example.org/ns/signet-system/sa/signet-k8s\"]\n",
    )
    .await
    else {
        return;
    };
    // Served (and SERVING) on the TLS port all the same.
    let st = tonic_health::pb::health_client::HealthClient::new(server.channel().await)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "signet.ca.v1.Registration".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.status, 1, "SERVING");
    let err = sync(
        &server,
        &tokens.token("signet-system", "signet-k8s"),
        "s",
        vec![],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(
        err.message(),
        "registration is off: list node sets in [policy.kubernetes_bridge] node_sets"
    );
}
