//! The [`RegistrationStore`](crate::store::RegistrationStore) part of the conformance suite:
//! a registrar's scope synced to a list (create, update in place, delete, unchanged), one
//! revision per change and none for a no-op, other owners' and the operator's entries never
//! touched, the per-owner cap, racing syncs of one scope.
#![allow(clippy::unwrap_used)]

use super::Db;
use crate::store::registration::SyncOutcome;
use crate::store::{EntryCreate, NewEntry, SyncResult};

conformance!(
    a_sync_creates_updates_deletes_and_keeps,
    only_the_owners_scope_is_touched,
    the_cap_counts_every_scope_of_the_owner,
    racing_syncs_of_one_scope_converge,
    node_sets_that_exist_are_found,
    a_sync_under_a_deleted_node_set_writes_nothing,
    owned_entries_are_listed_a_page_at_a_time,
);

const BRIDGE: &str = "spiffe://example.org/ns/signet-system/sa/signet-k8s";
const OTHER: &str = "spiffe://example.org/ns/other/sa/bridge";
const K8S: &str = "spiffe://example.org/signet/nodeset/k8s";

fn entry(id: &str, path: &str, ttl: i64) -> NewEntry {
    NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://example.org{path}"),
        parent_id: K8S.into(),
        selectors: vec!["k8s:ns:team-a".into(), "k8s:sa:web".into()],
        ttl_seconds: ttl,
        dns_names: vec!["web.team-a.svc".into()],
        created_at: 100,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    }
}

/// Node set k8s, which the entries name as parent: entries (the operator's or a registrar's)
/// are written only under a set that exists (`store::node_sets`).
async fn k8s_set(db: &Db) {
    assert!(
        db.store
            .create_node_set(&crate::store::NodeSetRow {
                name: "k8s".into(),
                selectors: vec!["k8s_psat:cluster:prod".into()],
                created_at: 1,
            })
            .await
            .unwrap()
    );
}

fn synced(r: SyncResult) -> SyncOutcome {
    match r {
        SyncResult::Synced(o) => o,
        other => panic!("refused: {other:?}"),
    }
}

async fn a_sync_creates_updates_deletes_and_keeps(db: Db) {
    k8s_set(&db).await;
    let s = &db.store;
    let before = s.entry_revision(K8S).await.unwrap();
    let first = synced(
        s.sync_owned_entries(
            BRIDGE,
            "Identity/team-a/web",
            &[
                entry("e1", "/ns/team-a/web", 0),
                entry("e2", "/ns/team-a/api", 0),
            ],
            100,
        )
        .await
        .unwrap(),
    );
    assert_eq!(
        (first.created, first.updated, first.deleted, first.unchanged),
        (2, 0, 0, 0)
    );
    assert_eq!(first.entry_ids, ["e1", "e2"]);
    assert!(first.revision > before);
    assert_eq!(s.entry_revision(K8S).await.unwrap(), first.revision);
    let rows = s.list_owned_entries(BRIDGE, None).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.owner == BRIDGE
        && r.owner_scope == "Identity/team-a/web"
        && r.revision == first.revision));

    // The same list again: nothing written, no revision taken.
    let again = synced(
        s.sync_owned_entries(
            BRIDGE,
            "Identity/team-a/web",
            &[
                entry("x1", "/ns/team-a/web", 0),
                entry("x2", "/ns/team-a/api", 0),
            ],
            100,
        )
        .await
        .unwrap(),
    );
    assert_eq!(
        (again.created, again.updated, again.deleted, again.unchanged),
        (0, 0, 0, 2)
    );
    assert_eq!(again.revision, 0);
    assert_eq!(again.entry_ids, ["e1", "e2"]);
    assert_eq!(s.entry_revision(K8S).await.unwrap(), first.revision);

    // One changed (same id, new TTL and names), one gone, one new: one revision for all.
    let mut changed = entry("y1", "/ns/team-a/web", 600);
    changed.dns_names = vec!["a.team-a.svc".into(), "b.team-a.svc".into()];
    changed.jwt_ttl_seconds = 60;
    let third = synced(
        s.sync_owned_entries(
            BRIDGE,
            "Identity/team-a/web",
            &[entry("e3", "/ns/team-a/db", 0), changed],
            100,
        )
        .await
        .unwrap(),
    );
    assert_eq!(
        (third.created, third.updated, third.deleted, third.unchanged),
        (1, 1, 1, 0)
    );
    assert_eq!(third.entry_ids, ["e3", "e1"]);
    assert!(third.revision > first.revision);
    assert_eq!(s.entry_revision(K8S).await.unwrap(), third.revision);
    let e1 = s.entry("e1").await.unwrap().unwrap();
    assert_eq!(e1.ttl_seconds, 600);
    assert_eq!(e1.jwt_ttl_seconds, 60);
    assert_eq!(e1.dns_names, ["a.team-a.svc", "b.team-a.svc"]);
    assert_eq!(e1.revision, third.revision);
    assert!(s.entry("e2").await.unwrap().is_none());

    // A federation name without a relationship: nothing written.
    let mut fed = entry("f1", "/ns/team-a/web", 600);
    fed.dns_names = vec!["a.team-a.svc".into(), "b.team-a.svc".into()];
    fed.jwt_ttl_seconds = 60;
    fed.federates_with = vec!["partner.org".into()];
    let refused = s
        .sync_owned_entries(
            BRIDGE,
            "Identity/team-a/web",
            &[entry("e3", "/ns/team-a/db", 0), fed],
            100,
        )
        .await
        .unwrap();
    assert_eq!(
        refused,
        SyncResult::NoRelationship {
            index: 1,
            trust_domain: "partner.org".into()
        }
    );
    assert_eq!(s.entry_revision(K8S).await.unwrap(), third.revision);

    // Empty: the scope is deleted.
    let gone = synced(
        s.sync_owned_entries(BRIDGE, "Identity/team-a/web", &[], 100)
            .await
            .unwrap(),
    );
    assert_eq!((gone.deleted, gone.created), (2, 0));
    assert!(gone.revision > third.revision);
    assert!(s.list_owned_entries(BRIDGE, None).await.unwrap().is_empty());
    // And an empty scope stays a no-op.
    let none = synced(
        s.sync_owned_entries(BRIDGE, "Identity/team-a/web", &[], 100)
            .await
            .unwrap(),
    );
    assert_eq!(none, SyncOutcome::default());
    assert!(s.sync_owned_entries("", "x", &[], 100).await.is_err());
}

async fn only_the_owners_scope_is_touched(db: Db) {
    k8s_set(&db).await;
    let s = &db.store;
    // The operator's entry with the very same registration, and another registrar's.
    let op = entry("op", "/ns/team-a/web", 0);
    assert!(matches!(
        s.create_entry(&op).await.unwrap(),
        EntryCreate::Created(_)
    ));
    synced(
        s.sync_owned_entries(
            OTHER,
            "Identity/team-a/web",
            &[entry("o1", "/ns/team-a/web", 0)],
            100,
        )
        .await
        .unwrap(),
    );
    // The bridge: two scopes, the same registration in both.
    synced(
        s.sync_owned_entries(BRIDGE, "a", &[entry("a1", "/ns/team-a/web", 0)], 100)
            .await
            .unwrap(),
    );
    synced(
        s.sync_owned_entries(BRIDGE, "b", &[entry("b1", "/ns/team-a/web", 0)], 100)
            .await
            .unwrap(),
    );
    // Changing and then emptying scope "a" leaves the rest alone.
    let o = synced(
        s.sync_owned_entries(BRIDGE, "a", &[entry("a2", "/ns/team-a/web", 60)], 100)
            .await
            .unwrap(),
    );
    assert_eq!(
        (o.updated, o.entry_ids.as_slice()),
        (1, &["a1".to_owned()][..])
    );
    synced(s.sync_owned_entries(BRIDGE, "a", &[], 100).await.unwrap());
    let op_row = s.entry("op").await.unwrap().unwrap();
    assert_eq!((op_row.owner.as_str(), op_row.ttl_seconds), ("", 0));
    let other = s.list_owned_entries(OTHER, None).await.unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!((other[0].id.as_str(), other[0].ttl_seconds), ("o1", 0));
    let mine = s.list_owned_entries(BRIDGE, None).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(
        (mine[0].id.as_str(), mine[0].owner_scope.as_str()),
        ("b1", "b")
    );
    assert_eq!(
        s.list_owned_entries(BRIDGE, Some("b")).await.unwrap().len(),
        1
    );
    assert!(
        s.list_owned_entries(BRIDGE, Some("a"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.list_owned_entries("", None).await.is_err());
    // list_entries sees them all, with their owners.
    let all = s.list_entries(Some(K8S)).await.unwrap();
    let owners: Vec<&str> = all.iter().map(|e| e.owner.as_str()).collect();
    assert_eq!(all.len(), 3, "{owners:?}");
}

async fn the_cap_counts_every_scope_of_the_owner(db: Db) {
    k8s_set(&db).await;
    let s = &db.store;
    synced(
        s.sync_owned_entries(
            BRIDGE,
            "a",
            &[
                entry("a1", "/ns/team-a/1", 0),
                entry("a2", "/ns/team-a/2", 0),
            ],
            3,
        )
        .await
        .unwrap(),
    );
    // Another owner's entries do not count.
    synced(
        s.sync_owned_entries(
            OTHER,
            "a",
            &[
                entry("o1", "/ns/team-a/1", 0),
                entry("o2", "/ns/team-a/2", 0),
            ],
            3,
        )
        .await
        .unwrap(),
    );
    let rev = s.entry_revision(K8S).await.unwrap();
    let too_many = s
        .sync_owned_entries(
            BRIDGE,
            "b",
            &[
                entry("b1", "/ns/team-a/3", 0),
                entry("b2", "/ns/team-a/4", 0),
            ],
            3,
        )
        .await
        .unwrap();
    assert_eq!(
        too_many,
        SyncResult::TooMany {
            would_own: 4,
            max: 3
        }
    );
    assert_eq!(s.entry_revision(K8S).await.unwrap(), rev);
    assert!(
        s.list_owned_entries(BRIDGE, Some("b"))
            .await
            .unwrap()
            .is_empty()
    );
    // Counted after the sync: replacing scope "a" by three is fine.
    let o = synced(
        s.sync_owned_entries(
            BRIDGE,
            "a",
            &[
                entry("x1", "/ns/team-a/1", 0),
                entry("x3", "/ns/team-a/3", 0),
                entry("x4", "/ns/team-a/4", 0),
            ],
            3,
        )
        .await
        .unwrap(),
    );
    assert_eq!((o.created, o.deleted, o.unchanged), (2, 1, 1));
}

async fn racing_syncs_of_one_scope_converge(db: Db) {
    k8s_set(&db).await;
    let other = db.another().await;
    let lists: Vec<Vec<NewEntry>> = (0..8)
        .map(|i| {
            (0..4)
                .map(|j| {
                    entry(
                        &format!("r{i}-{j}"),
                        &format!("/ns/team-a/w{}", (i + j) % 6),
                        i,
                    )
                })
                .collect()
        })
        .collect();
    let mut tasks = Vec::new();
    for (i, list) in lists.iter().cloned().enumerate() {
        let s = if i % 2 == 0 {
            db.store.clone()
        } else {
            other.clone()
        };
        tasks.push(tokio::spawn(async move {
            s.sync_owned_entries(BRIDGE, "race", &list, 100).await
        }));
    }
    let mut revisions = Vec::new();
    for t in tasks {
        revisions.push(synced(t.await.unwrap().unwrap()).revision);
    }
    // Every sync changed something, each with its own revision.
    revisions.sort_unstable();
    revisions.dedup();
    assert_eq!(revisions.len(), 8);
    // The scope is exactly one of the lists: the last writer's, without duplicate rows.
    let rows = db
        .store
        .list_owned_entries(BRIDGE, Some("race"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 4);
    let mut ids: Vec<&str> = rows.iter().map(|r| r.spiffe_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4);
    let ttl = rows[0].ttl_seconds;
    assert!(rows.iter().all(|r| r.ttl_seconds == ttl));
    let mut want: Vec<String> = lists[usize::try_from(ttl).unwrap()]
        .iter()
        .map(|e| e.spiffe_id.clone())
        .collect();
    want.sort();
    assert_eq!(ids, want);
    assert_eq!(
        db.store.entry_revision(K8S).await.unwrap(),
        *revisions.last().unwrap()
    );
}

async fn node_sets_that_exist_are_found(db: Db) {
    let insert = "INSERT INTO node_sets (name, selectors, created_at) VALUES \
                  ('k8s', '[\"signet:attestation:k8s_psat\"]', 1)";
    if db.url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
        sqlx::query(insert).execute(&pool).await.unwrap();
        pool.close().await;
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        sqlx::query(insert).execute(&pool).await.unwrap();
        pool.close().await;
    }
    let s = &db.store;
    assert_eq!(
        s.existing_node_sets(&["gpu", "k8s"]).await.unwrap(),
        ["k8s"]
    );
    assert!(s.existing_node_sets(&[]).await.unwrap().is_empty());
    assert!(s.existing_node_sets(&["gpu"]).await.unwrap().is_empty());
}

/// The API checks that a node set exists before it syncs; the store checks again inside the
/// sync's transaction, so a set deleted in between gets no entries.
async fn a_sync_under_a_deleted_node_set_writes_nothing(db: Db) {
    let s = &db.store;
    k8s_set(&db).await;
    assert_eq!(
        s.delete_node_set("k8s", K8S).await.unwrap(),
        crate::store::NodeSetDelete::Deleted
    );
    let r = s
        .sync_owned_entries(
            BRIDGE,
            "Identity/team-a/web",
            &[entry("e1", "/ns/team-a/web", 0)],
            100,
        )
        .await
        .unwrap();
    assert_eq!(
        r,
        SyncResult::NoNodeSet {
            index: 0,
            name: "k8s".into()
        }
    );
    assert!(s.list_owned_entries(BRIDGE, None).await.unwrap().is_empty());
    assert_eq!(s.entry_revision(K8S).await.unwrap(), 0);
}

/// Pages walk the owner's entries by (scope, id), within a scope filter or across scopes,
/// each entry once; another owner's never (review finding F4 of issue 29).
async fn owned_entries_are_listed_a_page_at_a_time(db: Db) {
    k8s_set(&db).await;
    let s = &db.store;
    for (scope, ids) in [("a", ["a1", "a2"]), ("b", ["b1", "b2"])] {
        let batch: Vec<NewEntry> = ids
            .iter()
            .map(|id| entry(id, &format!("/ns/team-a/{id}"), 0))
            .collect();
        synced(
            s.sync_owned_entries(BRIDGE, scope, &batch, 100)
                .await
                .unwrap(),
        );
    }
    synced(
        s.sync_owned_entries(OTHER, "a", &[entry("o1", "/ns/team-a/o1", 0)], 100)
            .await
            .unwrap(),
    );
    for (scope, want) in [
        (None, vec!["a1", "a2", "b1", "b2"]),
        (Some("b"), vec!["b1", "b2"]),
    ] {
        let mut seen: Vec<String> = Vec::new();
        let mut after: Option<(String, String)> = None;
        loop {
            let page = s
                .list_owned_entries_page(
                    BRIDGE,
                    scope,
                    after.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
                    1,
                )
                .await
                .unwrap();
            let Some(last) = page.last() else { break };
            assert_eq!(page.len(), 1);
            after = Some((last.owner_scope.clone(), last.id.clone()));
            seen.push(last.id.clone());
        }
        assert_eq!(seen, want, "{scope:?}");
    }
}
