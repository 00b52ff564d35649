//! The [`NodeAdminStore`](crate::store::node_admin::NodeAdminStore) part of the conformance
//! suite: a banned node's join token refused without being spent, join tokens listed and
//! revoked, nodes unbanned and deleted (refused with entries unless cascading), entries updated
//! in place under one revision with every refusal writing nothing.
#![allow(clippy::unwrap_used)]

use super::Db;
use super::nodes::created;
use crate::store::node_admin::{EntryUpdate, NodeDelete, TokenRevoke};
use crate::store::{NewEntry, NodeRow, TokenUse};

conformance!(
    a_banned_nodes_token_is_refused_and_not_spent,
    join_tokens_are_listed_and_unused_ones_revoked,
    nodes_are_unbanned_and_deleted_with_their_entries_only_on_cascade,
    entries_are_updated_in_place_under_one_revision,
);

fn node(id: &str) -> NodeRow {
    NodeRow {
        node_id: id.into(),
        spiffe_id: format!("spiffe://example.org/signet/node/{id}"),
        attested_at: 10,
        banned_at: None,
        last_serial: "aa".into(),
        not_after: 100,
        attestation: crate::store::nodes::ATTESTATION_JOIN_TOKEN.into(),
        selectors: vec!["signet:attestation:join_token".into()],
    }
}

fn entry(id: &str, parent: &str) -> NewEntry {
    NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://example.org/app/{id}"),
        parent_id: parent.into(),
        selectors: vec!["unix:uid:1000".into()],
        ttl_seconds: 600,
        dns_names: vec![format!("{id}.example.org")],
        created_at: 42,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    }
}

async fn a_banned_nodes_token_is_refused_and_not_spent(db: Db) {
    let s = &db.store;
    s.upsert_attested_node(&node("n1")).await.unwrap();
    s.ban_node("n1", 20).await.unwrap();
    s.create_join_token("aa11", "n1", 100, 1000).await.unwrap();
    assert_eq!(
        s.consume_join_token("aa11", 150).await.unwrap(),
        TokenUse::NodeBanned {
            node_id: "n1".into()
        }
    );
    // Again: still refused for the ban, never "already used".
    assert_eq!(
        s.consume_join_token("aa11", 160).await.unwrap(),
        TokenUse::NodeBanned {
            node_id: "n1".into()
        }
    );
    let listed = s.join_tokens(Some("n1")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].used_at, None);
    // Once unbanned, the same token attests.
    assert!(
        s.unban_node("n1")
            .await
            .unwrap()
            .unwrap()
            .banned_at
            .is_none()
    );
    assert_eq!(
        s.consume_join_token("aa11", 170).await.unwrap(),
        TokenUse::Consumed {
            node_id: "n1".into()
        }
    );
    // A token for a node never seen is consumed as before.
    s.create_join_token("bb22", "n2", 100, 1000).await.unwrap();
    assert_eq!(
        s.consume_join_token("bb22", 150).await.unwrap(),
        TokenUse::Consumed {
            node_id: "n2".into()
        }
    );
}

async fn join_tokens_are_listed_and_unused_ones_revoked(db: Db) {
    let s = &db.store;
    s.create_join_token("aaaa0000aaaa0000ffff", "n1", 100, 1000)
        .await
        .unwrap();
    s.create_join_token("aaaa0000bbbb0000ffff", "n1", 200, 1000)
        .await
        .unwrap();
    s.create_join_token("cccc0000cccc0000ffff", "n2", 300, 1000)
        .await
        .unwrap();
    assert_eq!(
        s.consume_join_token("cccc0000cccc0000ffff", 400)
            .await
            .unwrap(),
        TokenUse::Consumed {
            node_id: "n2".into()
        }
    );
    // Newest first; one node's only.
    let all: Vec<(String, Option<i64>)> = s
        .join_tokens(None)
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.node_id, t.used_at))
        .collect();
    assert_eq!(
        all,
        [
            ("n2".to_owned(), Some(400)),
            ("n1".to_owned(), None),
            ("n1".to_owned(), None)
        ]
    );
    assert_eq!(s.join_tokens(Some("n1")).await.unwrap().len(), 2);
    assert!(s.join_tokens(Some("zz")).await.unwrap().is_empty());
    assert_eq!(
        crate::store::node_admin::token_id("aaaa0000bbbb0000ffff"),
        "aaaa0000bbbb0000"
    );
    // A prefix of two tokens is ambiguous; a used one is not revoked; an unknown one is not
    // found; a unique prefix revokes exactly that one.
    assert_eq!(
        s.revoke_join_token("aaaa0000").await.unwrap(),
        TokenRevoke::Ambiguous { matches: 2 }
    );
    assert!(matches!(
        s.revoke_join_token("cccc0000").await.unwrap(),
        TokenRevoke::Used(t) if t.node_id == "n2"
    ));
    assert_eq!(
        s.revoke_join_token("dddd0000").await.unwrap(),
        TokenRevoke::NotFound
    );
    assert!(matches!(
        s.revoke_join_token("aaaa0000bbbb").await.unwrap(),
        TokenRevoke::Revoked(t) if t.token_hash == "aaaa0000bbbb0000ffff"
    ));
    assert_eq!(
        s.consume_join_token("aaaa0000bbbb0000ffff", 500)
            .await
            .unwrap(),
        TokenUse::Unknown
    );
    assert_eq!(s.join_tokens(None).await.unwrap().len(), 2);
}

async fn nodes_are_unbanned_and_deleted_with_their_entries_only_on_cascade(db: Db) {
    let s = &db.store;
    let n1 = node("n1");
    let p1 = n1.spiffe_id.clone();
    let p2 = node("n2").spiffe_id;
    assert_eq!(s.unban_node("n1").await.unwrap(), None);
    assert_eq!(
        s.delete_node("n1", true).await.unwrap(),
        NodeDelete::NotFound
    );
    s.upsert_attested_node(&n1).await.unwrap();
    s.upsert_attested_node(&node("n2")).await.unwrap();
    // Unbanning a node that is not banned changes nothing.
    assert_eq!(s.unban_node("n1").await.unwrap(), Some(n1.clone()));
    s.ban_node("n1", 50).await.unwrap();
    assert_eq!(s.unban_node("n1").await.unwrap(), Some(n1.clone()));
    assert_eq!(s.node("n1").await.unwrap().unwrap().banned_at, None);

    let a = created(s.create_entry(&entry("a", &p1)).await.unwrap());
    created(s.create_entry(&entry("b", &p1)).await.unwrap());
    created(s.create_entry(&entry("c", &p2)).await.unwrap());
    s.create_join_token("t-unused", "n1", 1, 1000)
        .await
        .unwrap();
    s.create_join_token("t-used", "n1", 1, 1000).await.unwrap();
    s.consume_join_token("t-used", 5).await.unwrap();
    // Entries name it: refused, nothing deleted.
    assert_eq!(
        s.delete_node("n1", false).await.unwrap(),
        NodeDelete::HasEntries { entries: 2 }
    );
    assert!(s.node("n1").await.unwrap().is_some());
    assert_eq!(s.list_entries(Some(&p1)).await.unwrap().len(), 2);

    let mut sub = s.entry_events().subscribe(&p1, 4).unwrap();
    let before = s.entry_revision(&p1).await.unwrap();
    assert_eq!(
        s.delete_node("n1", true).await.unwrap(),
        NodeDelete::Deleted {
            node: n1.clone(),
            entries: 2,
            tokens: 1
        }
    );
    assert_eq!(s.node("n1").await.unwrap(), None);
    assert!(s.list_entries(Some(&p1)).await.unwrap().is_empty());
    assert!(s.entry(&a.id).await.unwrap().is_none());
    // The other node's entries stay; the used token stays (it is the ledger of what attested).
    assert_eq!(s.list_entries(Some(&p2)).await.unwrap().len(), 1);
    let left: Vec<String> = s
        .join_tokens(Some("n1"))
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.token_hash)
        .collect();
    assert_eq!(left, ["t-used"]);
    // Its watchers wake, at a new revision.
    assert!(s.entry_revision(&p1).await.unwrap() > before);
    tokio::time::timeout(std::time::Duration::from_secs(10), sub.changed())
        .await
        .unwrap();
    // A node without entries is deleted without cascade.
    assert!(matches!(
        s.delete_node("n2", false).await.unwrap(),
        NodeDelete::HasEntries { entries: 1 }
    ));
    assert!(s.delete_entry("c").await.unwrap());
    assert!(matches!(
        s.delete_node("n2", false).await.unwrap(),
        NodeDelete::Deleted { entries: 0, .. }
    ));
    assert!(s.list_nodes().await.unwrap().is_empty());
}

async fn entries_are_updated_in_place_under_one_revision(db: Db) {
    let s = &db.store;
    let p1 = node("n1").spiffe_id;
    let p2 = node("n2").spiffe_id;
    let a = created(s.create_entry(&entry("a", &p1)).await.unwrap());
    let b = created(s.create_entry(&entry("b", &p1)).await.unwrap());

    // Everything but the id and created_at changes, the parent too: one new revision on the
    // entry and on both parents.
    let changed = NewEntry {
        spiffe_id: "spiffe://example.org/app/a2".into(),
        parent_id: p2.clone(),
        selectors: vec!["unix:uid:2000".into(), "unix:gid:5".into()],
        ttl_seconds: 120,
        dns_names: Vec::new(),
        created_at: 999, // kept as stored
        jwt_ttl_seconds: 60,
        ..entry("a", &p1)
    };
    let EntryUpdate::Updated(row) = s.update_entry(&changed, a.revision).await.unwrap() else {
        panic!("refused")
    };
    assert!(row.revision > b.revision);
    assert_eq!(row.created_at, 42);
    assert_eq!(s.entry("a").await.unwrap(), Some(row.clone()));
    assert_eq!(s.entry_revision(&p1).await.unwrap(), row.revision);
    assert_eq!(s.entry_revision(&p2).await.unwrap(), row.revision);
    let sync = s.entries_for_parent_since(&p2, 0).await.unwrap();
    assert_eq!(sync.entries, vec![row.clone()]);

    // A stale revision: Changed, nothing written, no revision taken for the entry.
    assert_eq!(
        s.update_entry(&changed, a.revision).await.unwrap(),
        EntryUpdate::Changed {
            revision: row.revision
        }
    );
    // Becoming the same registration as b: Duplicate, nothing written.
    let dup = NewEntry {
        created_at: 42,
        ..entry("b", &p1)
    };
    let dup = NewEntry {
        id: "a".into(),
        ..dup
    };
    assert_eq!(
        s.update_entry(&dup, row.revision).await.unwrap(),
        EntryUpdate::Duplicate {
            existing_id: "b".into()
        }
    );
    // An entry may be rewritten as itself (its own registration is not a duplicate).
    let same = NewEntry {
        id: "a".into(),
        ..changed.clone()
    };
    let EntryUpdate::Updated(again) = s.update_entry(&same, row.revision).await.unwrap() else {
        panic!("refused")
    };
    assert!(again.revision > row.revision);
    // A federated trust domain without a relationship, a node set that does not exist.
    let fed = NewEntry {
        federates_with: vec!["partner.example".into()],
        ..same.clone()
    };
    assert_eq!(
        s.update_entry(&fed, again.revision).await.unwrap(),
        EntryUpdate::NoRelationship {
            trust_domain: "partner.example".into()
        }
    );
    let under_set = NewEntry {
        parent_id: "spiffe://example.org/signet/nodeset/none".into(),
        ..same.clone()
    };
    assert_eq!(
        s.update_entry(&under_set, again.revision).await.unwrap(),
        EntryUpdate::NoNodeSet {
            name: "none".into()
        }
    );
    assert_eq!(s.entry("a").await.unwrap(), Some(again.clone()));
    assert_eq!(
        s.update_entry(&entry("zz", &p1), 1).await.unwrap(),
        EntryUpdate::NotFound
    );

    // A registrar's entry is never changed from here.
    assert!(
        s.create_node_set(&crate::store::NodeSetRow {
            name: "k8s".into(),
            selectors: vec!["k8s_psat:cluster:prod".into()],
            created_at: 1,
        })
        .await
        .unwrap()
    );
    let owner = "spiffe://example.org/ns/signet-system/sa/signet-k8s";
    let owned = NewEntry {
        parent_id: "spiffe://example.org/signet/nodeset/k8s".into(),
        selectors: vec!["k8s:ns:team-a".into()],
        ..entry("o1", &p1)
    };
    let crate::store::SyncResult::Synced(out) = s
        .sync_owned_entries(
            owner,
            "Identity/team-a/web",
            std::slice::from_ref(&owned),
            10,
        )
        .await
        .unwrap()
    else {
        panic!("sync refused")
    };
    assert_eq!(
        s.update_entry(&owned, out.revision).await.unwrap(),
        EntryUpdate::Owned {
            owner: owner.into(),
            owner_scope: "Identity/team-a/web".into()
        }
    );
}
