//! The [`NodeStore`] part of the conformance suite: single-use join tokens (also when raced),
//! attested nodes, registration entries and their revisions.
#![allow(clippy::unwrap_used)]

use super::Db;
use crate::store::{EntryCreate, EntryRow};

/// The row of a create that must succeed.
pub(super) fn created(c: EntryCreate) -> EntryRow {
    match c {
        EntryCreate::Created(row) => row,
        EntryCreate::Duplicate { existing_id } => panic!("refused as a duplicate of {existing_id}"),
        EntryCreate::NoRelationship { trust_domain } => {
            panic!("refused: no relationship with {trust_domain}")
        }
        EntryCreate::NoNodeSet { name } => panic!("refused: no node set {name}"),
    }
}

conformance!(
    join_tokens_are_single_use_and_expire,
    racing_consumers_of_one_token_have_one_winner,
    nodes_are_upserted_renewed_and_banned,
    entries_round_trip_and_revisions_track_changes,
    entry_batches_are_all_or_nothing,
    a_single_entry_repeating_a_stored_registration_is_refused,
    entry_changes_wake_watchers_on_every_replica,
    legacy_selector_spellings_are_rewritten_or_reported,
);

async fn join_tokens_are_single_use_and_expire(db: Db) {
    use crate::store::TokenUse;
    let s = &db.store;
    s.create_join_token("h1", "n1", 100, 200).await.unwrap();
    s.create_join_token("h2", "n2", 100, 200).await.unwrap();
    // Expired at exactly expires_at.
    assert_eq!(
        s.consume_join_token("h2", 200).await.unwrap(),
        TokenUse::Expired
    );
    assert_eq!(
        s.consume_join_token("nope", 150).await.unwrap(),
        TokenUse::Unknown
    );
    assert_eq!(
        s.consume_join_token("h1", 150).await.unwrap(),
        TokenUse::Consumed {
            node_id: "n1".into()
        }
    );
    assert_eq!(
        s.consume_join_token("h1", 151).await.unwrap(),
        TokenUse::AlreadyUsed
    );
    // Used, then expired: still reported as used.
    assert_eq!(
        s.consume_join_token("h1", 500).await.unwrap(),
        TokenUse::AlreadyUsed
    );
    // A duplicate hash is refused.
    assert!(s.create_join_token("h1", "n3", 100, 200).await.is_err());

    // Released after a failed issuance: usable again, once.
    assert!(!s.release_join_token("h1", 999).await.unwrap());
    assert!(s.release_join_token("h1", 150).await.unwrap());
    assert_eq!(
        s.consume_join_token("h1", 160).await.unwrap(),
        TokenUse::Consumed {
            node_id: "n1".into()
        }
    );
    assert_eq!(
        s.consume_join_token("h1", 161).await.unwrap(),
        TokenUse::AlreadyUsed
    );
    assert!(!s.release_join_token("nope", 160).await.unwrap());
}

async fn racing_consumers_of_one_token_have_one_winner(db: Db) {
    use crate::store::TokenUse;
    db.store
        .create_join_token("race", "n1", 0, i64::MAX)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        // Half of them through other store instances, as other replicas would.
        let store = if i % 2 == 0 {
            db.store.clone()
        } else {
            db.another().await
        };
        tasks.push(tokio::spawn(async move {
            store.consume_join_token("race", 10).await.unwrap()
        }));
    }
    let mut won = 0;
    for t in tasks {
        match t.await.unwrap() {
            TokenUse::Consumed { node_id } => {
                assert_eq!(node_id, "n1");
                won += 1;
            }
            TokenUse::AlreadyUsed => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(won, 1);
}

async fn nodes_are_upserted_renewed_and_banned(db: Db) {
    use crate::store::NodeRow;
    let s = &db.store;
    assert_eq!(s.node("n1").await.unwrap(), None);
    assert_eq!(s.ban_node("n1", 5).await.unwrap(), None);
    let n1 = NodeRow {
        node_id: "n1".into(),
        spiffe_id: "spiffe://example.org/signet/node/n1".into(),
        attested_at: 10,
        banned_at: None,
        last_serial: "aa".into(),
        not_after: 100,
        attestation: crate::store::nodes::ATTESTATION_JOIN_TOKEN.into(),
        selectors: vec!["signet:attestation:join_token".into()],
    };
    s.upsert_attested_node(&n1).await.unwrap();
    assert_eq!(s.node("n1").await.unwrap(), Some(n1.clone()));
    s.update_node_certificate("n1", "bb", 200).await.unwrap();
    let got = s.node("n1").await.unwrap().unwrap();
    assert_eq!((got.last_serial.as_str(), got.not_after), ("bb", 200));
    // Re-attestation updates the times.
    // Re-attestation records how the node attested this time.
    let again = NodeRow {
        attested_at: 20,
        last_serial: "cc".into(),
        not_after: 300,
        attestation: crate::store::nodes::ATTESTATION_K8S_PSAT.into(),
        selectors: vec![
            "k8s_psat:node_name:w1".into(),
            "signet:attestation:k8s_psat".into(),
        ],
        ..n1.clone()
    };
    s.upsert_attested_node(&again).await.unwrap();
    assert_eq!(s.node("n1").await.unwrap(), Some(again.clone()));
    let n0 = NodeRow {
        node_id: "n0".into(),
        spiffe_id: "spiffe://example.org/signet/node/n0".into(),
        ..n1.clone()
    };
    s.upsert_attested_node(&n0).await.unwrap();
    let ids: Vec<String> = s
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.node_id)
        .collect();
    assert_eq!(ids, ["n0", "n1"]);
    // Ban keeps the first time; re-attestation does not lift a ban.
    let banned = s.ban_node("n1", 50).await.unwrap().unwrap();
    assert_eq!(banned.banned_at, Some(50));
    let banned = s.ban_node("n1", 60).await.unwrap().unwrap();
    assert_eq!(banned.banned_at, Some(50));
    s.upsert_attested_node(&again).await.unwrap();
    assert_eq!(s.node("n1").await.unwrap().unwrap().banned_at, Some(50));
    assert_eq!(s.node("n0").await.unwrap().unwrap().banned_at, None);
}

async fn entries_round_trip_and_revisions_track_changes(db: Db) {
    use crate::store::NewEntry;
    let s = &db.store;
    let p1 = "spiffe://example.org/signet/node/n1";
    let p2 = "spiffe://example.org/signet/node/n2";
    let entry = |id: &str, parent: &str| NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://example.org/app/{id}"),
        parent_id: parent.into(),
        selectors: vec!["unix:uid:1000".into(), "unix:path:/usr/bin/app".into()],
        ttl_seconds: 600,
        dns_names: vec![format!("{id}.example.org")],
        created_at: 42,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    };
    // Nothing yet: revision 0, unchanged for a caller that knows 0.
    let sync = s.entries_for_parent_since(p1, 0).await.unwrap();
    assert_eq!((sync.revision, sync.unchanged), (0, true));

    let a = created(s.create_entry(&entry("a", p1)).await.unwrap());
    let b = created(s.create_entry(&entry("b", p2)).await.unwrap());
    let c = created(s.create_entry(&entry("c", p1)).await.unwrap());
    assert!(a.revision < b.revision && b.revision < c.revision);
    assert_eq!(s.entry("a").await.unwrap(), Some(a.clone()));
    assert_eq!(s.entry("zz").await.unwrap(), None);
    // By ids, in one query: the unknown one left out, the repeated one answered once.
    let mut found = s.entries_by_id(&["c", "zz", "a", "c"]).await.unwrap();
    found.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(found, vec![a.clone(), c.clone()]);
    assert!(s.entries_by_id(&[]).await.unwrap().is_empty());
    assert!(s.entries_by_id(&["zz"]).await.unwrap().is_empty());
    assert_eq!(
        s.list_entries(None).await.unwrap(),
        vec![a.clone(), b.clone(), c.clone()]
    );
    assert_eq!(
        s.list_entries(Some(p1)).await.unwrap(),
        vec![a.clone(), c.clone()]
    );
    // A duplicate id is refused, and moves nothing.
    assert!(s.create_entry(&entry("a", p2)).await.is_err());

    let sync = s.entries_for_parent_since(p1, 0).await.unwrap();
    assert_eq!(sync.revision, c.revision);
    assert!(!sync.unchanged);
    assert_eq!(sync.entries, vec![a.clone(), c.clone()]);
    let sync = s.entries_for_parent_since(p1, c.revision).await.unwrap();
    assert!(sync.unchanged);
    assert!(sync.entries.is_empty());
    // Another parent's change does not disturb p1.
    created(s.create_entry(&entry("d", p2)).await.unwrap());
    assert!(
        s.entries_for_parent_since(p1, c.revision)
            .await
            .unwrap()
            .unchanged
    );

    // A deletion moves the revision.
    assert!(s.delete_entry("a").await.unwrap());
    assert!(!s.delete_entry("a").await.unwrap());
    let sync = s.entries_for_parent_since(p1, c.revision).await.unwrap();
    assert!(!sync.unchanged);
    assert!(sync.revision > c.revision);
    assert_eq!(sync.entries, vec![c.clone()]);
    // Deleting the last entry still shows as a change, with no entries.
    assert!(s.delete_entry("c").await.unwrap());
    let last = s.entries_for_parent_since(p1, sync.revision).await.unwrap();
    assert!(!last.unchanged);
    assert!(last.entries.is_empty());
    assert!(
        s.entries_for_parent_since(p1, last.revision)
            .await
            .unwrap()
            .unchanged
    );
}

async fn entry_batches_are_all_or_nothing(db: Db) {
    use crate::store::{BatchCreate, NewEntry};
    let s = &db.store;
    let p1 = "spiffe://example.org/signet/node/n1";
    let p2 = "spiffe://example.org/signet/node/n2";
    let entry = |id: &str, parent: &str| NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://example.org/app/{id}"),
        parent_id: parent.into(),
        selectors: vec!["unix:path:/usr/bin/app".into(), "unix:uid:1000".into()],
        ttl_seconds: 600,
        dns_names: vec![],
        created_at: 42,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    };
    let before = created(s.create_entry(&entry("x", p1)).await.unwrap());
    let batch: Vec<NewEntry> = (0..300)
        .map(|i| entry(&format!("b{i:03}"), if i % 2 == 0 { p1 } else { p2 }))
        .collect();
    let BatchCreate::Created { revision, entries } = s.create_entries(&batch).await.unwrap() else {
        panic!("refused")
    };
    // One revision for the whole batch, newer than anything before; order kept.
    assert!(revision > before.revision);
    assert_eq!(entries.len(), 300);
    assert!(entries.iter().all(|e| e.revision == revision));
    assert_eq!(entries[7].id, "b007");
    assert_eq!(s.entry("b007").await.unwrap().as_ref(), Some(&entries[7]));
    // All 300 by id: more than one query's worth.
    let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
    let mut found = s.entries_by_id(&ids).await.unwrap();
    found.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(found, entries);
    // Both parents moved to the batch's revision.
    for p in [p1, p2] {
        let sync = s
            .entries_for_parent_since(p, before.revision)
            .await
            .unwrap();
        assert_eq!(sync.revision, revision);
        assert!(!sync.unchanged);
    }
    assert_eq!(s.list_entries(Some(p1)).await.unwrap().len(), 151);

    // The same registration as a stored entry (selectors in another order): refused whole,
    // naming the first such index; nothing written, no revision taken.
    let mut again = vec![entry("n0", p2), entry("n1", p2)];
    let mut dup = entry("n2", p1);
    dup.spiffe_id = "spiffe://example.org/app/b004".into();
    dup.selectors.reverse();
    dup.selectors.sort();
    again.push(dup);
    again.push(entry("n3", p2));
    let mut dup2 = entry("n4", p1);
    dup2.spiffe_id = "spiffe://example.org/app/x".into();
    again.push(dup2);
    assert_eq!(
        s.create_entries(&again).await.unwrap(),
        BatchCreate::Duplicate {
            index: 2,
            existing_id: "b004".into()
        }
    );
    assert_eq!(s.entry("n0").await.unwrap(), None);
    assert!(
        s.entries_for_parent_since(p2, revision)
            .await
            .unwrap()
            .unchanged
    );
    // The same SPIFFE ID under another parent is another registration.
    let mut elsewhere = entry("n5", p2);
    elsewhere.spiffe_id = "spiffe://example.org/app/b004".into();
    assert!(matches!(
        s.create_entries(&[elsewhere]).await.unwrap(),
        BatchCreate::Created { .. }
    ));
    // A clashing id anywhere in the batch rolls the whole batch back.
    let mut same_id = entry("b010", p1);
    same_id.spiffe_id = "spiffe://example.org/app/other".into();
    let clash = vec![entry("n6", p1), same_id];
    assert!(s.create_entries(&clash).await.is_err());
    assert_eq!(s.entry("n6").await.unwrap(), None);
    assert!(s.create_entries(&[]).await.is_err());
}

async fn a_single_entry_repeating_a_stored_registration_is_refused(db: Db) {
    use crate::store::{BatchCreate, NewEntry};
    let s = &db.store;
    let p1 = "spiffe://example.org/signet/node/n1";
    let p2 = "spiffe://example.org/signet/node/n2";
    let entry = |id: &str, spiffe: &str, parent: &str, selectors: &[&str]| NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://example.org/app/{spiffe}"),
        parent_id: parent.into(),
        selectors: selectors.iter().map(|s| s.to_string()).collect(),
        ttl_seconds: 600,
        dns_names: vec![],
        created_at: 42,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    };
    let two = ["unix:uid:1000", "unix:path:/usr/bin/app"];
    let a = created(s.create_entry(&entry("a", "web", p1, &two)).await.unwrap());
    // The same registration (selectors in another order, one repeated, another TTL): refused,
    // naming the stored entry; nothing written, no revision taken.
    let mut again = entry(
        "a2",
        "web",
        p1,
        &["unix:path:/usr/bin/app", "unix:uid:1000", "unix:uid:1000"],
    );
    again.ttl_seconds = 60;
    assert_eq!(
        s.create_entry(&again).await.unwrap(),
        EntryCreate::Duplicate {
            existing_id: "a".into()
        }
    );
    assert_eq!(s.entry("a2").await.unwrap(), None);
    assert_eq!(s.entry_revision(p1).await.unwrap(), a.revision);
    // Distinct registrations are still accepted: fewer selectors, another SPIFFE ID, another
    // parent.
    let fewer = created(
        s.create_entry(&entry("b", "web", p1, &["unix:uid:1000"]))
            .await
            .unwrap(),
    );
    assert!(fewer.revision > a.revision);
    created(s.create_entry(&entry("c", "api", p1, &two)).await.unwrap());
    created(s.create_entry(&entry("d", "web", p2, &two)).await.unwrap());
    // Single and batch creates share one definition, both ways.
    let BatchCreate::Created { entries, .. } = s
        .create_entries(&[entry("e", "batch", p2, &["unix:uid:7"])])
        .await
        .unwrap()
    else {
        panic!("refused")
    };
    assert_eq!(
        s.create_entry(&entry("e2", "batch", p2, &["unix:uid:7"]))
            .await
            .unwrap(),
        EntryCreate::Duplicate {
            existing_id: entries[0].id.clone()
        }
    );
    assert_eq!(
        s.create_entries(&[entry("f", "web", p1, &["unix:uid:1000"])])
            .await
            .unwrap(),
        BatchCreate::Duplicate {
            index: 0,
            existing_id: "b".into()
        }
    );
    assert_eq!(s.list_entries(None).await.unwrap().len(), 5);
}

async fn entry_changes_wake_watchers_on_every_replica(db: Db) {
    use std::time::Duration;

    use crate::store::NewEntry;
    let p1 = "spiffe://example.org/signet/node/n1";
    let postgres = !db.url.starts_with("sqlite");
    // PostgreSQL: the change is made through another store instance (another replica) and
    // must arrive through LISTEN/NOTIFY. SQLite is one process: the same instance.
    let writer = if postgres {
        db.another().await
    } else {
        db.store.clone()
    };
    let mut sub = db.store.entry_events().subscribe(p1, 4).unwrap();
    let wait = Duration::from_secs(10);
    if postgres {
        // The listener wakes every subscriber once it listens (it cannot know what it missed).
        tokio::time::timeout(wait, sub.changed()).await.unwrap();
    }
    let entry = |id: &str| NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://example.org/app/{id}"),
        parent_id: p1.into(),
        selectors: vec!["unix:uid:1000".into()],
        ttl_seconds: 0,
        dns_names: vec![],
        created_at: 42,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    };
    assert_eq!(db.store.entry_revision(p1).await.unwrap(), 0);
    let a = created(writer.create_entry(&entry("a")).await.unwrap());
    tokio::time::timeout(wait, sub.changed()).await.unwrap();
    assert_eq!(db.store.entry_revision(p1).await.unwrap(), a.revision);
    writer
        .create_entries(&[entry("b"), entry("c")])
        .await
        .unwrap();
    tokio::time::timeout(wait, sub.changed()).await.unwrap();
    assert!(writer.delete_entry("a").await.unwrap());
    tokio::time::timeout(wait, sub.changed()).await.unwrap();
}

/// An upgrade from a version whose server accepted other selector spellings: what has a
/// canonical spelling is rewritten (with a new revision, so agents fetch it), what has none is
/// left as stored and reported, a rewrite into another entry's registration is not made, and a
/// second pass changes nothing.
async fn legacy_selector_spellings_are_rewritten_or_reported(db: Db) {
    use crate::audit::AuditLog;
    use crate::entry_upgrade::upgrade_selectors;
    use crate::store::NewEntry;
    let s = &db.store;
    let parent = "spiffe://example.org/signet/node/n1";
    let entry = |id: &str, app: &str, selectors: &[&str]| NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://example.org/app/{app}"),
        parent_id: parent.into(),
        selectors: selectors.iter().map(|s| (*s).to_owned()).collect(),
        ttl_seconds: 600,
        dns_names: vec![],
        created_at: 42,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    };
    let fine = created(
        s.create_entry(&entry("fine", "a", &["unix:uid:1000"]))
            .await
            .unwrap(),
    );
    let legacy = created(
        s.create_entry(&entry(
            "legacy",
            "b",
            &[
                "unix:uid:+01000",
                "unix:path:/usr//bin/./app/",
                "unix:gid:0",
            ],
        ))
        .await
        .unwrap(),
    );
    let dotdot = created(
        s.create_entry(&entry("dotdot", "c", &["unix:path:/usr/../bin/sh"]))
            .await
            .unwrap(),
    );
    let twin = created(
        s.create_entry(&entry("twin", "a", &["unix:uid:01000"]))
            .await
            .unwrap(),
    );
    let before = s.entry_revision(parent).await.unwrap();

    let audit = AuditLog::spawn(s.clone(), 64);
    let report = upgrade_selectors(s.as_ref(), &audit, 1_700_000_000)
        .await
        .unwrap();
    assert_eq!(report.rewritten, ["legacy"]);
    let mut unservable = report.unservable.clone();
    unservable.sort();
    assert_eq!(unservable, ["dotdot", "twin"]);

    let now = s.entry("legacy").await.unwrap().unwrap();
    assert_eq!(
        now.selectors,
        ["unix:uid:1000", "unix:path:/usr/bin/app", "unix:gid:0"]
    );
    assert!(now.revision > legacy.revision);
    let after = s.entry_revision(parent).await.unwrap();
    assert!(after > before, "agents must see a change");
    assert_eq!(s.entry("fine").await.unwrap(), Some(fine));
    assert_eq!(s.entry("dotdot").await.unwrap(), Some(dotdot));
    assert_eq!(s.entry("twin").await.unwrap(), Some(twin));

    // The stored selectors moved on: a stale compare-and-set writes nothing.
    assert!(
        !s.replace_entry_selectors(
            "legacy",
            &["unix:uid:+01000".into()],
            &["unix:uid:7".into()]
        )
        .await
        .unwrap()
    );
    assert!(!s.replace_entry_selectors("gone", &[], &[]).await.unwrap());
    assert_eq!(s.entry_revision(parent).await.unwrap(), after);

    // Idempotent: nothing left to rewrite.
    let again = upgrade_selectors(s.as_ref(), &audit, 1_700_000_001)
        .await
        .unwrap();
    assert!(again.rewritten.is_empty());
    assert_eq!(s.entry_revision(parent).await.unwrap(), after);

    // Audited: the rewrite with both spellings, and each entry left as stored.
    // The audit log writes in the background: up to 10 s of 10 ms polls.
    for round in 0.. {
        let events = s.audit_events(0, 100).await.unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        if kinds.iter().filter(|k| **k == "entry.unservable").count() >= 2
            && kinds.contains(&"entry.selectors_upgraded")
        {
            let up = events
                .iter()
                .find(|e| e.kind == "entry.selectors_upgraded")
                .unwrap();
            assert!(up.detail.contains("unix:uid:+01000"), "{}", up.detail);
            assert!(
                up.detail.contains("unix:path:/usr/bin/app"),
                "{}",
                up.detail
            );
            let twin = events
                .iter()
                .find(|e| e.kind == "entry.unservable" && e.detail.contains("\"twin\""))
                .unwrap();
            assert!(
                twin.detail.contains("same registration as entry \"fine\""),
                "{}",
                twin.detail
            );
            break;
        }
        assert!(round < 1000, "{kinds:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
