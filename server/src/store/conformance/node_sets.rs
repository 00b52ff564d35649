//! The [`NodeSetStore`](crate::store::NodeSetStore) part of the conformance suite, and what
//! node sets change in the [`NodeStore`](crate::store::NodeStore): an entry under a set only
//! while the set exists, a set deleted only without entries (also when raced), a node's
//! effective revision over its parents, and a re-attestation with other selectors moving the
//! node's revision.
#![allow(clippy::unwrap_used)]

use super::Db;
use super::nodes::created;
use crate::store::{BatchCreate, EntryCreate, NewEntry, NodeRow, NodeSetDelete, NodeSetRow};

conformance!(
    node_sets_are_created_once_listed_and_deleted,
    entries_name_only_existing_sets_and_keep_them,
    a_racing_delete_and_entry_create_never_leave_an_orphan,
    a_nodes_revision_is_the_highest_of_its_parents,
    a_reattestation_with_other_selectors_moves_the_nodes_revision,
    a_node_sets_entry_change_wakes_every_nodes_watcher_on_every_replica,
);

const SET: &str = "spiffe://example.org/signet/nodeset/k8s";
const N1: &str = "spiffe://example.org/signet/node/n1";

fn set(name: &str, selectors: &[&str]) -> NodeSetRow {
    NodeSetRow {
        name: name.into(),
        selectors: selectors.iter().map(|s| (*s).to_owned()).collect(),
        created_at: 7,
    }
}

fn entry(id: &str, parent: &str) -> NewEntry {
    NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://example.org/app/{id}"),
        parent_id: parent.into(),
        selectors: vec!["k8s:ns:default".into()],
        ttl_seconds: 0,
        dns_names: vec![],
        created_at: 42,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    }
}

async fn node_sets_are_created_once_listed_and_deleted(db: Db) {
    let s = &db.store;
    let k8s = set(
        "k8s",
        &["k8s_psat:cluster:prod", "signet:attestation:k8s_psat"],
    );
    assert!(s.create_node_set(&k8s).await.unwrap());
    // The name is taken, whatever the selectors.
    assert!(
        !s.create_node_set(&set("k8s", &["k8s_psat:cluster:dev"]))
            .await
            .unwrap()
    );
    assert!(
        s.create_node_set(&set("a", &["join_token:node_id:a"]))
            .await
            .unwrap()
    );
    let names: Vec<String> = s
        .list_node_sets()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["a", "k8s"]);
    assert_eq!(s.node_set("k8s").await.unwrap(), Some(k8s));
    assert_eq!(s.node_set("nope").await.unwrap(), None);
    assert_eq!(
        s.delete_node_set("a", "spiffe://example.org/signet/nodeset/a")
            .await
            .unwrap(),
        NodeSetDelete::Deleted
    );
    assert_eq!(
        s.delete_node_set("a", "spiffe://example.org/signet/nodeset/a")
            .await
            .unwrap(),
        NodeSetDelete::NotFound
    );
    assert_eq!(s.list_node_sets().await.unwrap().len(), 1);
}

async fn entries_name_only_existing_sets_and_keep_them(db: Db) {
    let s = &db.store;
    match s.create_entry(&entry("e1", SET)).await.unwrap() {
        EntryCreate::NoNodeSet { name } => assert_eq!(name, "k8s"),
        other => panic!("created under a missing set: {other:?}"),
    }
    // A batch: the first entry naming a missing set, nothing written.
    match s
        .create_entries(&[entry("e0", N1), entry("e1", SET)])
        .await
        .unwrap()
    {
        BatchCreate::NoNodeSet { index, name } => assert_eq!((index, name.as_str()), (1, "k8s")),
        other => panic!("created under a missing set: {other:?}"),
    }
    assert!(s.list_entries(None).await.unwrap().is_empty());
    s.create_node_set(&set("k8s", &["k8s_psat:cluster:prod"]))
        .await
        .unwrap();
    let e1 = created(s.create_entry(&entry("e1", SET)).await.unwrap());
    assert!(matches!(
        s.create_entries(&[entry("e2", SET), entry("e3", SET)])
            .await
            .unwrap(),
        BatchCreate::Created { .. }
    ));
    // The set's revision row moves like a node's.
    assert!(s.entry_revision(SET).await.unwrap() > e1.revision);
    let listed: Vec<String> = s
        .list_entries(Some(SET))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(listed, ["e1", "e2", "e3"]);
    let counts = s.entry_counts(&[SET, N1]).await.unwrap();
    assert_eq!(counts.get(SET), Some(&3));
    assert_eq!(counts.get(N1), None);
    assert_eq!(
        s.delete_node_set("k8s", SET).await.unwrap(),
        NodeSetDelete::InUse { entries: 3 }
    );
    for id in ["e1", "e2", "e3"] {
        assert!(s.delete_entry(id).await.unwrap());
    }
    assert_eq!(
        s.delete_node_set("k8s", SET).await.unwrap(),
        NodeSetDelete::Deleted
    );
}

/// Eight rounds of a delete racing an entry create under one set, each on its own store
/// instance (another replica on PostgreSQL): either the entry was refused (the set was gone) or
/// the delete was (the entry exists); never an entry whose set is gone.
async fn a_racing_delete_and_entry_create_never_leave_an_orphan(db: Db) {
    let other = db.another().await;
    for round in 0..8 {
        db.store
            .create_node_set(&set("k8s", &["k8s_psat:cluster:prod"]))
            .await
            .unwrap();
        let id = format!("r{round}");
        let e = entry(&id, SET);
        let (created, deleted) =
            tokio::join!(other.create_entry(&e), db.store.delete_node_set("k8s", SET));
        let created = matches!(created.unwrap(), EntryCreate::Created(_));
        let deleted = deleted.unwrap();
        let set_exists = db.store.node_set("k8s").await.unwrap().is_some();
        let entry_exists = db.store.entry(&id).await.unwrap().is_some();
        assert_eq!(entry_exists, created);
        assert!(
            !entry_exists || set_exists,
            "round {round}: an orphan entry"
        );
        assert_eq!(deleted == NodeSetDelete::Deleted, !set_exists);
        if entry_exists {
            assert!(db.store.delete_entry(&id).await.unwrap());
        }
        if set_exists {
            db.store.delete_node_set("k8s", SET).await.unwrap();
        }
    }
}

async fn a_nodes_revision_is_the_highest_of_its_parents(db: Db) {
    let s = &db.store;
    assert_eq!(s.entry_revision_of(&[N1, SET]).await.unwrap(), 0);
    s.create_node_set(&set("k8s", &["k8s_psat:cluster:prod"]))
        .await
        .unwrap();
    let own = created(s.create_entry(&entry("own", N1)).await.unwrap());
    assert_eq!(s.entry_revision_of(&[N1, SET]).await.unwrap(), own.revision);
    let shared = created(s.create_entry(&entry("shared", SET)).await.unwrap());
    assert_eq!(
        s.entry_revision_of(&[N1, SET]).await.unwrap(),
        shared.revision
    );
    // Without the set (not a member), only its own.
    assert_eq!(s.entry_revision_of(&[N1]).await.unwrap(), own.revision);
    let sync = s.entries_for_parents_since(&[N1, SET], 0).await.unwrap();
    let ids: Vec<&str> = sync.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        (sync.revision, ids),
        (shared.revision, vec!["own", "shared"])
    );
    let again = s
        .entries_for_parents_since(&[N1, SET], sync.revision)
        .await
        .unwrap();
    assert!(again.unchanged && again.entries.is_empty());
    // A change to the set's entries moves the effective revision past the known one.
    assert!(s.delete_entry("shared").await.unwrap());
    let after = s
        .entries_for_parents_since(&[N1, SET], sync.revision)
        .await
        .unwrap();
    assert!(!after.unchanged && after.revision > sync.revision);
    assert_eq!(after.entries.len(), 1);
}

async fn a_reattestation_with_other_selectors_moves_the_nodes_revision(db: Db) {
    use std::time::Duration;
    let s = &db.store;
    let node = NodeRow {
        node_id: "n1".into(),
        spiffe_id: N1.into(),
        attested_at: 10,
        banned_at: None,
        last_serial: "aa".into(),
        not_after: 100,
        attestation: "k8s_psat".into(),
        selectors: vec![
            "k8s_psat:cluster:dev".into(),
            "signet:attestation:k8s_psat".into(),
        ],
    };
    s.upsert_attested_node(&node).await.unwrap();
    assert_eq!(
        s.node("n1").await.unwrap().unwrap().selectors,
        node.selectors
    );
    let r0 = s.entry_revision(N1).await.unwrap();
    // The same selectors again: nothing to re-sync.
    s.upsert_attested_node(&NodeRow {
        attested_at: 20,
        ..node.clone()
    })
    .await
    .unwrap();
    assert_eq!(s.entry_revision(N1).await.unwrap(), r0);
    // Other selectors: the node's own revision moves, and its watchers wake.
    let mut sub = s.entry_events().subscribe(N1, 4).unwrap();
    sub.mark_seen();
    let moved = NodeRow {
        attested_at: 30,
        selectors: vec![
            "k8s_psat:cluster:prod".into(),
            "signet:attestation:k8s_psat".into(),
        ],
        ..node
    };
    s.upsert_attested_node(&moved).await.unwrap();
    assert!(s.entry_revision(N1).await.unwrap() > r0);
    assert_eq!(
        s.node("n1").await.unwrap().unwrap().selectors,
        moved.selectors
    );
    tokio::time::timeout(Duration::from_secs(10), sub.changed())
        .await
        .unwrap();
}

/// A node's watcher subscribes to its own parent only; a change to a node set's entries made
/// through another replica (PostgreSQL: LISTEN/NOTIFY) still wakes it, since any node may be a
/// member (the stream then re-reads the node's effective revision).
async fn a_node_sets_entry_change_wakes_every_nodes_watcher_on_every_replica(db: Db) {
    use std::time::Duration;
    let postgres = !db.url.starts_with("sqlite");
    let writer = if postgres {
        db.another().await
    } else {
        db.store.clone()
    };
    writer
        .create_node_set(&set("k8s", &["k8s_psat:cluster:prod"]))
        .await
        .unwrap();
    let mut n1 = db.store.entry_events().subscribe(N1, 4).unwrap();
    let mut n2 = db
        .store
        .entry_events()
        .subscribe("spiffe://example.org/signet/node/n2", 4)
        .unwrap();
    let wait = Duration::from_secs(10);
    if postgres {
        // The listener wakes every subscriber once it listens (n2 perhaps subscribed after:
        // forget whatever it saw until then).
        tokio::time::timeout(wait, n1.changed()).await.unwrap();
        n2.mark_seen();
    }
    created(writer.create_entry(&entry("shared", SET)).await.unwrap());
    tokio::time::timeout(wait, n1.changed()).await.unwrap();
    tokio::time::timeout(wait, n2.changed()).await.unwrap();
    assert!(writer.delete_entry("shared").await.unwrap());
    tokio::time::timeout(wait, n1.changed()).await.unwrap();
}
