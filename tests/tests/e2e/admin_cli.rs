//! The operator's day-two commands, with the real `signetctl` against the real server on
//! PostgreSQL: node unban and delete, join token list and revoke (a banned node's token is
//! refused without being spent), entry update, audit list (newest first, filtered, paged),
//! `ca activate --force`, every `--json` output's shape; and the admin calls refused to
//! anyone but the operator.

use signet_client::ClientIdentity;
use signet_proto::admin::node_admin_client::NodeAdminClient;
use signet_proto::admin::{
    DeleteNodeRequest, ListJoinTokensRequest, RevokeJoinTokenRequest, UnbanNodeRequest,
    UpdateEntryRequest,
};
use signet_proto::agent::node_client::NodeClient;
use signet_proto::agent::{AttestRequest, SyncEntriesRequest};
use signet_tests::*;
use tonic::Code;

use crate::agent::eventually;
use crate::pg_server;

/// The JSON lines of `audit list ARGS --all --json` once they are at least `n` (the audit log
/// is written in the background).
async fn audit_at_least(server: &Server, args: &[&str], n: usize) -> Vec<serde_json::Value> {
    eventually(10, "audit events", || async {
        let mut cmd = vec!["audit", "list"];
        cmd.extend_from_slice(args);
        cmd.extend(["--all", "--json"]);
        let events = json_lines(&ok(&server.signetctl(&cmd)));
        (events.len() >= n).then_some(events)
    })
    .await
}

fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn refused(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A join token for `node_id`, made with signetctl.
fn token(server: &Server, node_id: &str) -> String {
    ok(&server.signetctl(&["token", "create", "--node-id", node_id]))
        .trim()
        .to_owned()
}

async fn attest_with(server: &Server, token: &str) -> Result<ClientIdentity, tonic::Status> {
    let kc = signet_client::new_key_and_csr().unwrap();
    let r = NodeClient::new(server.channel().await)
        .attest(AttestRequest {
            join_token: token.to_owned(),
            csr: kc.csr_der,
        })
        .await?
        .into_inner();
    let svid = r.svid.unwrap();
    Ok(ClientIdentity {
        cert_chain_pem: svid
            .cert_chain
            .iter()
            .map(|d| signet_types::pem::cert_to_pem(d))
            .collect::<String>()
            .into_bytes(),
        key_pem: kc.key_pem.into_bytes(),
    })
}

/// The JSON lines of a `--json` command, each an object.
fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert!(v.is_object(), "{l}");
            v
        })
        .collect()
}

fn td_of(server: &Server) -> String {
    let out = ok(&server.signetctl(&["bundle", "show"]));
    out.lines()
        .find_map(|l| l.strip_prefix("trust domain:"))
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_banned_nodes_token_is_not_spent_and_nodes_are_unbanned_and_deleted() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let td = td_of(&server);
    let first = token(&server, "vm-1");
    let vm1 = attest_with(&server, &first).await.unwrap();
    ok(&server.signetctl(&["node", "ban", "vm-1"]));

    // A new token for the banned node: refused as banned, with how to unban, and not spent.
    let second = token(&server, "vm-1");
    let err = attest_with(&server, &second).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().starts_with("node vm-1 is banned")
            && err.message().contains("join token was not used")
            && err.message().contains("signetctl node unban vm-1"),
        "{err:?}"
    );
    // token list: both, newest first, the second unused; never the token itself.
    let out = ok(&server.signetctl(&["token", "list", "--node-id", "vm-1", "--json"]));
    assert!(!out.contains(&second) && !out.contains(&first), "{out}");
    let listed = json_lines(&out);
    assert_eq!(listed.len(), 2, "{out}");
    // (Made within one second, their order is the ids'.)
    let unused: Vec<_> = listed.iter().filter(|t| t["used"] == false).collect();
    assert_eq!(unused.len(), 1, "{out}");
    assert_eq!(unused[0]["used_at"], serde_json::Value::Null, "{out}");
    let table = ok(&server.signetctl(&["token", "list"]));
    assert!(table.starts_with("ID") && table.contains("vm-1"), "{table}");

    // Unbanned: the same token now attests.
    let out = ok(&server.signetctl(&["node", "unban", "vm-1"]));
    assert!(out.contains("unbanned node vm-1"), "{out}");
    let vm1_again = attest_with(&server, &second).await.unwrap();
    // Unknown node: not found.
    assert!(refused(&server.signetctl(&["node", "unban", "vm-9"])).contains("no attested node"));

    // An unused token is revoked by id, and no longer attests; a used one is not revoked.
    let third = token(&server, "vm-1");
    let listed = json_lines(&ok(&server.signetctl(&[
        "token",
        "list",
        "--node-id",
        "vm-1",
        "--json",
    ])));
    let id_where = |used: bool| {
        listed
            .iter()
            .filter(|t| t["used"] == used)
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let (unused, used) = (id_where(false), id_where(true));
    assert_eq!((unused.len(), used.len()), (1, 2), "{listed:?}");
    let (unused_id, used_id) = (unused[0].clone(), used[0].clone());
    assert_eq!(unused_id.len(), 16);
    let out = ok(&server.signetctl(&["token", "revoke", &unused_id[..10]]));
    assert!(out.contains(&unused_id), "{out}");
    assert_eq!(
        attest_with(&server, &third).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    assert!(refused(&server.signetctl(&["token", "revoke", &used_id])).contains("already used"));
    assert!(refused(&server.signetctl(&["token", "revoke", "zz"])).contains("hex"));

    // An entry under the node: delete refused without --cascade, naming the count.
    let entry_id = ok(&server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        &format!("spiffe://{td}/app/web"),
        "--parent",
        "vm-1",
        "--selector",
        "unix:uid:1000",
    ]))
    .trim()
    .to_owned();
    let _pending = token(&server, "vm-1");
    let err = refused(&server.signetctl(&["node", "delete", "vm-1"]));
    assert!(
        err.contains("1 entry") && err.contains("--cascade"),
        "{err}"
    );
    let mut sync = NodeClient::new(server.channel_with(&vm1_again).await);
    sync.sync_entries(SyncEntriesRequest { known_revision: 0 })
        .await
        .unwrap();
    // With --cascade: the node, its entry and its unused token go.
    let out = ok(&server.signetctl(&["node", "delete", "vm-1", "--cascade", "--json"]));
    let deleted = &json_lines(&out)[0];
    assert_eq!(deleted["entries_deleted"], 1, "{out}");
    assert_eq!(deleted["tokens_deleted"], 1, "{out}");
    assert!(!ok(&server.signetctl(&["node", "list"])).contains("vm-1"));
    assert!(!ok(&server.signetctl(&["entry", "list"])).contains(&entry_id));
    // Its certificates, old and new, are refused everything, as a banned node's.
    for id in [&vm1, &vm1_again] {
        let err = NodeClient::new(server.channel_with(id).await)
            .sync_entries(SyncEntriesRequest { known_revision: 0 })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
        assert!(err.message().contains("not attested"), "{err:?}");
    }
    assert!(refused(&server.signetctl(&["node", "delete", "vm-1"])).contains("no attested node"));

    // Each operation is an audit event.
    for k in [
        "admin.node_unban",
        "admin.node_delete",
        "admin.join_token_revoke",
    ] {
        audit_at_least(&server, &["--kind", k], 1).await;
    }
    let denied = audit_at_least(&server, &["--kind", "node.denied"], 1).await;
    assert!(
        denied
            .iter()
            .any(|e| e["detail"].as_str().unwrap().contains("vm-1 is banned")),
        "{denied:?}"
    );
}

#[tokio::test]
async fn entries_are_updated_in_place_and_validated_as_created() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let td = td_of(&server);
    let created = json_lines(&ok(&server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        &format!("spiffe://{td}/app/api"),
        "--parent",
        "n1",
        "--selector",
        "unix:uid:1000",
        "--ttl",
        "10m",
        "--dns",
        "api.example.org",
        "--json",
    ])))
    .remove(0);
    let id = created["id"].as_str().unwrap().to_owned();
    let rev = created["revision"].as_u64().unwrap();

    let out = ok(&server.signetctl(&[
        "entry",
        "update",
        &id,
        "--ttl",
        "5m",
        "--selector",
        "unix:uid:2000",
        "--no-dns",
        "--json",
    ]));
    let updated = &json_lines(&out)[0];
    assert_eq!(updated["id"], id.as_str());
    assert_eq!(updated["ttl_seconds"], 300);
    assert_eq!(updated["selectors"], serde_json::json!(["unix:uid:2000"]));
    assert_eq!(updated["dns_names"], serde_json::json!([]));
    assert_eq!(updated["spiffe_id"], created["spiffe_id"]);
    assert_eq!(updated["created_at"], created["created_at"]);
    assert!(updated["revision"].as_u64().unwrap() > rev);

    // Validated as CreateEntry validates: a bad selector, a reserved identity, a federation
    // without a relationship; nothing changes.
    for (args, why) in [
        (vec!["--selector", "unix:uid:x"], "InvalidArgument"),
        (
            vec!["--federates-with", "partner.example"],
            "federation relationship",
        ),
    ] {
        let mut cmd = vec!["entry", "update", id.as_str()];
        cmd.extend(args);
        let err = refused(&server.signetctl(&cmd));
        assert!(err.contains(why), "{why}: {err}");
    }
    let reserved = format!("spiffe://{td}/signet/agent");
    let err = refused(&server.signetctl(&["entry", "update", &id, "--spiffe-id", &reserved]));
    assert!(err.contains("InvalidArgument"), "{err}");
    // A stale revision: Aborted.
    let stale = rev.to_string();
    let err =
        refused(&server.signetctl(&["entry", "update", &id, "--ttl", "1m", "--revision", &stale]));
    assert!(err.contains("Aborted") && err.contains("changed"), "{err}");
    // Nothing to change; an unknown entry.
    assert!(refused(&server.signetctl(&["entry", "update", &id])).contains("nothing to change"));
    assert!(
        refused(&server.signetctl(&["entry", "update", "nope", "--ttl", "1m"]))
            .contains("no entry")
    );
    let now = json_lines(&ok(&server.signetctl(&["entry", "list", "--json"])));
    assert_eq!(now.len(), 1);
    assert_eq!(&now[0], updated);

    let events = audit_at_least(&server, &["--kind", "admin.entry_update"], 1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0]["detail"]
            .as_str()
            .unwrap()
            .contains("ttl_seconds 600 -> 300"),
        "{events:?}"
    );
}

#[tokio::test]
async fn audit_list_is_newest_first_filtered_and_paged() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    for i in 0..5 {
        ok(&server.signetctl(&["token", "create", "--node-id", &format!("vm-{i}")]));
    }
    ok(&server.signetctl(&["ca", "prepare"]));
    let ids = |out: &str| -> Vec<u64> {
        json_lines(out)
            .iter()
            .map(|e| e["id"].as_u64().unwrap())
            .collect()
    };
    // The five join tokens and the CA's prepare, once written.
    audit_at_least(&server, &["--kind", "admin.join_token"], 5).await;
    audit_at_least(&server, &["--kind", "ca."], 1).await;
    let all = ids(&ok(&server.signetctl(&["audit", "list", "--all", "--json"])));
    assert!(all.len() >= 6, "{all:?}");
    assert!(all.windows(2).all(|w| w[0] > w[1]), "newest first: {all:?}");
    let oldest = ids(&ok(&server.signetctl(&[
        "audit",
        "list",
        "--all",
        "--oldest-first",
        "--json",
    ])));
    // (Events written meanwhile, if any, are left out of the comparison.)
    let mut reversed = all.clone();
    reversed.reverse();
    let common: Vec<u64> = oldest.into_iter().filter(|i| all.contains(i)).collect();
    assert_eq!(common, reversed);

    // --kind with a prefix: the CA's own events only (the README's example).
    let ca = json_lines(&ok(
        &server.signetctl(&["audit", "list", "--kind", "ca.", "--all", "--json"])
    ));
    assert!(!ca.is_empty());
    assert!(
        ca.iter()
            .all(|e| e["kind"].as_str().unwrap().starts_with("ca.")),
        "{ca:?}"
    );
    // Pages of 2 of the five join-token events, carried on by the printed token.
    let out = server.signetctl(&[
        "audit",
        "list",
        "--kind",
        "admin.join_token",
        "--limit",
        "2",
        "--json",
    ]);
    let first = ids(&ok(&out));
    assert_eq!(first.len(), 2);
    let hint = String::from_utf8_lossy(&out.stderr).into_owned();
    let token = hint
        .split("--page-token ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_else(|| panic!("{hint}"))
        .to_owned();
    let rest = ids(&ok(&server.signetctl(&[
        "audit",
        "list",
        "--kind",
        "admin.join_token",
        "--all",
        "--page-token",
        &token,
        "--json",
    ])));
    assert_eq!(rest.len(), 3);
    assert!(first[1] > rest[0]);
    // The token belongs to its filters.
    let err = refused(&server.signetctl(&["audit", "list", "--page-token", &token]));
    assert!(err.contains("another listing"), "{err}");
    // --since and --caller.
    let recent =
        ids(&ok(&server.signetctl(&[
            "audit", "list", "--since", "1h", "--all", "--json",
        ])));
    assert!(all.iter().all(|i| recent.contains(i)), "{recent:?} {all:?}");
    let future =
        ok(&server.signetctl(&["audit", "list", "--since", "2999-01-01T00:00:00Z", "--json"]));
    assert!(future.is_empty(), "{future}");
    let caller = json_lines(&ok(
        &server.signetctl(&["audit", "list", "--limit", "1", "--json"])
    ))[0]["caller"]
        .as_str()
        .unwrap()
        .to_owned();
    let by_caller =
        json_lines(&ok(&server.signetctl(&[
            "audit", "list", "--caller", &caller, "--all", "--json",
        ])));
    assert!(by_caller.iter().all(|e| e["caller"] == caller.as_str()));
    assert!(refused(&server.signetctl(&["audit", "list", "--since", "soon"])).contains("RFC 3339"));
}

#[tokio::test]
async fn a_young_root_is_activated_only_with_force() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let out = ok(&server.signetctl(&["ca", "prepare", "--root"]));
    let root = out.trim().strip_prefix("prepared ").unwrap().to_owned();
    // The default ca.root_propagation is a day: refused, naming the time left and --force.
    let err = refused(&server.signetctl(&["ca", "activate", &root]));
    assert!(
        err.contains("FailedPrecondition")
            && err.contains("ca.root_propagation")
            && err.contains("--force"),
        "{err}"
    );
    let status = ok(&server.signetctl(&["ca", "status", "--json"]));
    assert!(status.contains(&format!("\"key_id\":\"{root}\"")));
    let out = server.signetctl(&["ca", "activate", &root, "--force"]);
    assert!(ok(&out).contains(&format!("activated {root}")));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("warning: root"),
        "{out:?}"
    );
    let st: serde_json::Value =
        serde_json::from_str(&ok(&server.signetctl(&["ca", "status", "--json"]))).unwrap();
    let active = st["slots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "root" && s["state"] == "active")
        .unwrap();
    assert_eq!(active["key_id"], root.as_str());
}

/// Every time field of a JSON value (keys ending `_at`, `_update`, `not_before`, `not_after`,
/// `last_expiry`, `at`) is null or RFC 3339 UTC to the second.
fn times_are_rfc3339(v: &serde_json::Value, path: &str) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let timeish = k == "at"
                    || k.ends_with("_at")
                    || k.ends_with("_update")
                    || k == "not_before"
                    || k == "not_after"
                    || k == "last_expiry";
                if timeish && !x.is_null() {
                    let s = x
                        .as_str()
                        .unwrap_or_else(|| panic!("{path}.{k} is not a string: {x}"));
                    assert!(
                        humantime::parse_rfc3339(s).is_ok() && s.ends_with('Z'),
                        "{path}.{k} = {s} is not RFC 3339 UTC"
                    );
                }
                times_are_rfc3339(x, &format!("{path}.{k}"));
            }
        }
        serde_json::Value::Array(a) => {
            for x in a {
                times_are_rfc3339(x, path);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn every_json_output_is_json_lines_with_rfc3339_times() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let td = td_of(&server);
    let t = token(&server, "vm-1");
    attest_with(&server, &t).await.unwrap();
    ok(&server.signetctl(&[
        "nodeset",
        "create",
        "vms",
        "--node-selector",
        "signet:attestation:join_token",
    ]));
    let entry = ok(&server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        &format!("spiffe://{td}/app/web"),
        "--parent",
        "vm-1",
        "--selector",
        "unix:uid:1000",
    ]));
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("minted");
    ok(&server.signetctl(&[
        "mint",
        "--spiffe-id",
        &format!("spiffe://{td}/app/minted"),
        "--out",
        out_dir.to_str().unwrap(),
    ]));
    let serial = json_lines(&ok(&server.signetctl(&["certs", "list", "--json"])))
        .last()
        .unwrap()["serial"]
        .as_str()
        .unwrap()
        .to_owned();
    let commands: Vec<Vec<String>> = [
        vec!["certs", "list"],
        vec!["certs", "list", "--newest"],
        vec!["certs", "show", serial.as_str()],
        vec!["jwt", "list"],
        vec!["audit", "list", "--all"],
        vec!["node", "list"],
        vec!["nodeset", "list"],
        vec!["entry", "list"],
        vec!["entry", "update", entry.trim(), "--ttl", "2m"],
        vec!["token", "list"],
        vec!["token", "create", "--node-id", "vm-2"],
        vec!["crl", "list"],
        vec!["federation", "list"],
        vec!["ca", "status"],
        vec!["ledger", "verify"],
        vec!["node", "unban", "vm-1"],
    ]
    .into_iter()
    .map(|c| c.into_iter().map(str::to_owned).collect())
    .collect();
    for cmd in &commands {
        let mut args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        args.push("--json");
        let out = ok(&server.signetctl(&args));
        let lines = json_lines(&out);
        for l in &lines {
            times_are_rfc3339(l, &cmd.join(" "));
        }
    }
    // Tables print the same times.
    let table = ok(&server.signetctl(&["node", "list"]));
    assert!(table.lines().nth(1).unwrap().contains('Z'), "{table}");
}

#[tokio::test]
async fn the_new_admin_calls_are_refused_to_anyone_but_the_operator() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let t = token(&server, "vm-1");
    let node = attest_with(&server, &t).await.unwrap();
    // The admin services are served only on the admin socket: on the TLS listener, with a
    // node's certificate or with none, every one of them is refused.
    for channel in [server.channel_with(&node).await, server.channel().await] {
        let mut admin = NodeAdminClient::new(channel);
        let codes = [
            admin
                .unban_node(UnbanNodeRequest {
                    node_id: "vm-1".into(),
                })
                .await
                .unwrap_err()
                .code(),
            admin
                .delete_node(DeleteNodeRequest {
                    node_id: "vm-1".into(),
                    cascade: true,
                })
                .await
                .unwrap_err()
                .code(),
            admin
                .list_join_tokens(ListJoinTokensRequest::default())
                .await
                .unwrap_err()
                .code(),
            admin
                .revoke_join_token(RevokeJoinTokenRequest {
                    id: "00000000".into(),
                })
                .await
                .unwrap_err()
                .code(),
            admin
                .update_entry(UpdateEntryRequest {
                    id: "x".into(),
                    ..UpdateEntryRequest::default()
                })
                .await
                .unwrap_err()
                .code(),
        ];
        assert!(codes.iter().all(|c| *c == Code::Unimplemented), "{codes:?}");
    }
    // Nothing changed.
    assert!(ok(&server.signetctl(&["node", "list"])).contains("vm-1"));
}
