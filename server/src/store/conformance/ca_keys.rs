//! The [`CaSlotStore`] part of the conformance suite: the first root's insert race, the
//! generation rule (one change per generation, even between two store instances racing), the
//! ledger counts per key, and the upgrade of a database whose single root (written before
//! slots existed) signed leaves directly.
#![allow(clippy::unwrap_used)]

use signet_types::ca_slot::SlotState;

use super::{ACQUIRE, Db};
use crate::store::{
    AuditEvent, CaChange, CaSlotRow, CertFilter, NewCertificate, NewRevocation, SlotUpdate,
    StoredCaKey, connect,
};

conformance!(
    ca_key_insert_race_has_one_winner,
    a_change_applies_once_per_generation_even_between_racing_instances,
    a_failing_change_is_rolled_back_whole,
    usage_counts_unexpired_unrevoked_certificates_per_key,
    keys_in_use_are_those_usage_counts_above_zero,
);

fn ca_key(id: &str, slot: &str) -> StoredCaKey {
    StoredCaKey {
        id: id.into(),
        slot: slot.into(),
        algorithm: "ecdsa-p256".into(),
        cert_pem: format!("-----BEGIN CERTIFICATE-----\n{id}\n-----END CERTIFICATE-----\n"),
        encrypted_key: id.as_bytes().iter().rev().copied().collect(),
        created_at: 1_700_000_000,
    }
}

async fn ca_key_insert_race_has_one_winner(db: Db) {
    assert_eq!(db.store.ca_key("root").await.unwrap(), None);
    let other = db.another().await;
    for round in 0..10 {
        let slot = format!("slot-{round}");
        let (a, b) = (
            ca_key(&format!("a-{round}"), &slot),
            ca_key(&format!("b-{round}"), &slot),
        );
        let (s1, s2) = (db.store.clone(), other.clone());
        let t1 = tokio::spawn(async move { s1.insert_ca_key_if_absent(&a).await });
        let t2 = tokio::spawn(async move { s2.insert_ca_key_if_absent(&b).await });
        let (w1, w2) = (t1.await.unwrap().unwrap(), t2.await.unwrap().unwrap());
        assert_eq!(w1, w2, "both replicas must see the same winner");
        assert!(w1.id == format!("a-{round}") || w1.id == format!("b-{round}"));
        assert_eq!(db.store.ca_key(&slot).await.unwrap(), Some(w1.clone()));
        assert_eq!(other.ca_key(&slot).await.unwrap(), Some(w1));
    }
    // A later insert into a taken slot returns the incumbent, untouched.
    let incumbent = db.store.ca_key("slot-0").await.unwrap().unwrap();
    let late = db
        .store
        .insert_ca_key_if_absent(&ca_key("late", "slot-0"))
        .await
        .unwrap();
    assert_eq!(late, incumbent);
    // Every field round-trips.
    let root = ca_key("root-1", "root");
    assert_eq!(db.store.insert_ca_key_if_absent(&root).await.unwrap(), root);
}

fn row(id: &str, kind: &str, parent: Option<&str>) -> CaSlotRow {
    CaSlotRow {
        id: id.into(),
        slot: id.into(),
        kind: kind.into(),
        state: "prepared".into(),
        parent_id: parent.map(Into::into),
        algorithm: "EcdsaP256".into(),
        cert_pem: format!("-----BEGIN CERTIFICATE-----\n{id}\n-----END CERTIFICATE-----\n"),
        encrypted_key: vec![1, 2, 3],
        created_at: 1_700_000_000,
        activated_at: None,
        retired_at: None,
        removed_at: None,
        tainted_at: None,
    }
}

fn event(detail: &str) -> AuditEvent {
    AuditEvent {
        id: 0,
        at: 1_700_000_000,
        kind: "ca.prepared".into(),
        caller: "rotator".into(),
        detail: detail.into(),
    }
}

fn leaf(serial: u32, key: &str, not_after: i64, spiffe: &str) -> NewCertificate {
    NewCertificate {
        serial: format!("{serial:032x}"),
        spiffe_id: spiffe.into(),
        dns_names: vec![],
        ip_addresses: vec![],
        not_before: 1_700_000_000,
        not_after,
        cert_sha256: signet_types::ledger::sha256(&serial.to_be_bytes()),
        ca_key_id: key.into(),
        caller: "test".into(),
        issued_at: 1_700_000_000,
        request_id: format!("r{serial}"),
        cert_der: vec![0x30, 0],
        provenance: String::new(),
    }
}

async fn a_change_applies_once_per_generation_even_between_racing_instances(db: Db) {
    let (url, store) = (db.url.as_str(), db.store.clone());
    let other = db.another().await;
    let (g0, slots) = store.ca_slots().await.unwrap();
    assert!(slots.is_empty(), "{url}");
    for round in 0..8u64 {
        let (g, _) = store.ca_slots().await.unwrap();
        assert_eq!(g, g0 + round);
        let a = CaChange {
            inserts: vec![row(&format!("a{round}"), "root", None)],
            updates: vec![],
            audit: vec![event(&format!("a{round}"))],
        };
        let b = CaChange {
            inserts: vec![row(&format!("b{round}"), "root", None)],
            updates: vec![],
            audit: vec![event(&format!("b{round}"))],
        };
        let (s1, s2) = (store.clone(), other.clone());
        let t1 = tokio::spawn(async move { s1.apply_ca_change(g, &a).await });
        let t2 = tokio::spawn(async move { s2.apply_ca_change(g, &b).await });
        let (w1, w2) = (t1.await.unwrap().unwrap(), t2.await.unwrap().unwrap());
        assert!(w1 ^ w2, "{url}: exactly one applies (got {w1}, {w2})");
    }
    let (g, slots) = other.ca_slots().await.unwrap();
    assert_eq!(g, g0 + 8);
    assert_eq!(slots.len(), 8, "{url}: one key per round");
    let events = store.audit_events(0, 100).await.unwrap();
    assert_eq!(events.len(), 8, "{url}: one audit event per applied change");
    let mut ids: Vec<&str> = slots.iter().map(|s| s.id.as_str()).collect();
    let mut details: Vec<&str> = events.iter().map(|e| e.detail.as_str()).collect();
    ids.sort_unstable();
    details.sort_unstable();
    assert_eq!(
        ids, details,
        "{url}: each event belongs to an applied change"
    );
    // A stale generation changes nothing.
    let stale = CaChange {
        inserts: vec![row("late", "root", None)],
        ..CaChange::default()
    };
    assert!(!store.apply_ca_change(g0, &stale).await.unwrap());
    assert_eq!(store.ca_slots().await.unwrap(), (g, slots.clone()));
}

async fn a_failing_change_is_rolled_back_whole(db: Db) {
    let (url, store) = (db.url.as_str(), db.store.clone());
    let (g, _) = store.ca_slots().await.unwrap();
    let bad = CaChange {
        inserts: vec![row("r1", "root", None)],
        updates: vec![SlotUpdate::State {
            id: "nope".into(),
            state: SlotState::Active,
            at: 5,
        }],
        audit: vec![event("r1")],
    };
    assert!(store.apply_ca_change(g, &bad).await.is_err(), "{url}");
    assert_eq!(store.ca_slots().await.unwrap(), (g, vec![]), "{url}");
    assert!(store.audit_events(0, 10).await.unwrap().is_empty());
    // States and taints stamp their times; a second taint keeps the first time.
    let ok = CaChange {
        inserts: vec![
            row("r1", "root", None),
            row("i1", "intermediate", Some("r1")),
        ],
        ..CaChange::default()
    };
    assert!(store.apply_ca_change(g, &ok).await.unwrap());
    let moves = CaChange {
        updates: vec![
            SlotUpdate::State {
                id: "r1".into(),
                state: SlotState::Active,
                at: 10,
            },
            SlotUpdate::Taint {
                id: "i1".into(),
                at: 11,
            },
            SlotUpdate::Taint {
                id: "i1".into(),
                at: 12,
            },
            SlotUpdate::State {
                id: "i1".into(),
                state: SlotState::Removed,
                at: 13,
            },
        ],
        ..CaChange::default()
    };
    assert!(store.apply_ca_change(g + 1, &moves).await.unwrap());
    let (_, slots) = store.ca_slots().await.unwrap();
    assert_eq!(slots[0].id, "i1");
    assert_eq!(slots[1].id, "r1");
    assert_eq!(
        (slots[1].state.as_str(), slots[1].activated_at),
        ("active", Some(10))
    );
    assert_eq!(slots[0].tainted_at, Some(11));
    assert_eq!(
        (slots[0].state.as_str(), slots[0].removed_at),
        ("removed", Some(13))
    );
    assert_eq!(slots[0].parent_id.as_deref(), Some("r1"));
}

async fn usage_counts_unexpired_unrevoked_certificates_per_key(db: Db) {
    let (url, store) = (db.url.as_str(), db.store.clone());
    store
        .append_certificates(&[
            leaf(1, "k1", 2_000, "spiffe://td/a"),
            leaf(2, "k1", 3_000, "spiffe://td/a"),
            leaf(3, "k1", 900, "spiffe://td/old"),
            leaf(4, "k2", 2_500, "spiffe://td/b"),
        ])
        .await
        .unwrap();
    let mut usage = store.ca_key_usage(1_000).await.unwrap();
    usage.sort_by(|a, b| a.ca_key_id.cmp(&b.ca_key_id));
    let got: Vec<_> = usage
        .iter()
        .map(|u| (u.ca_key_id.as_str(), u.unexpired, u.last_not_after))
        .collect();
    assert_eq!(got, [("k1", 2, 3_000), ("k2", 1, 2_500)], "{url}");
    assert!(store.ca_key_usage(3_000).await.unwrap().is_empty());
    let holders = store
        .ca_key_holders(&["k1".into(), "k2".into()], 1_000, 10)
        .await
        .unwrap();
    assert_eq!(
        holders,
        [
            ("spiffe://td/a".to_owned(), 2),
            ("spiffe://td/b".to_owned(), 1)
        ]
    );
    assert_eq!(
        store
            .ca_key_holders(&["k1".into()], 1_000, 1)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        store
            .ca_key_holders(&[], 1_000, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// `ca_keys_in_use` (the rotator's probe) agrees with `ca_key_usage` (the count) on which keys
/// have an unexpired, unrevoked certificate: expiry and revocation both take a key out, a key
/// with no certificate is never in, and only the keys asked about are answered.
async fn keys_in_use_are_those_usage_counts_above_zero(db: Db) {
    let (url, store) = (db.url.as_str(), db.store.clone());
    let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let all = ids(&["k1", "k2", "k3", "none"]);
    assert!(store.ca_keys_in_use(&all, 1_000).await.unwrap().is_empty());
    assert!(
        !store
            .any_certificate(&CertFilter::CaKey("k1".into()))
            .await
            .unwrap()
    );
    store
        .append_certificates(&[
            leaf(1, "k1", 2_000, "spiffe://td/a"),
            leaf(2, "k1", 3_000, "spiffe://td/a"),
            leaf(3, "k2", 900, "spiffe://td/old"),
            leaf(4, "k3", 2_500, "spiffe://td/b"),
        ])
        .await
        .unwrap();
    let agree = |now: i64, want: &[&str]| {
        let store = store.clone();
        let all = all.clone();
        let want = ids(want);
        async move {
            let mut got = store.ca_keys_in_use(&all, now).await.unwrap();
            got.sort();
            assert_eq!(got, want, "in use at {now}: {url}");
            let mut counted: Vec<String> = store
                .ca_key_usage(now)
                .await
                .unwrap()
                .into_iter()
                .filter(|u| u.unexpired > 0)
                .map(|u| u.ca_key_id)
                .collect();
            counted.sort();
            assert_eq!(counted, want, "counted at {now}: {url}");
        }
    };
    agree(1_000, &["k1", "k3"]).await;
    agree(2_000, &["k1", "k3"]).await;
    agree(2_500, &["k1"]).await;
    agree(3_000, &[]).await;
    // Only the keys asked about.
    assert_eq!(
        store.ca_keys_in_use(&ids(&["k3"]), 1_000).await.unwrap(),
        ids(&["k3"])
    );
    // Revoking k3's only certificate takes it out; k1 keeps its other one.
    let revoke = |serial: u32| NewRevocation {
        serial: format!("{serial:032x}"),
        reason: "keyCompromise".into(),
        at: 1_500,
        caller: "test".into(),
        request_id: format!("rv{serial}"),
        detail: "{}".into(),
    };
    store
        .append_revocations(&[revoke(4), revoke(2)])
        .await
        .unwrap();
    agree(1_000, &["k1"]).await;
    agree(2_000, &[]).await;
    // The probe walks past a key's own revoked rows to a later unrevoked one: from 2,000,
    // k1's row expiring at 3,000 is revoked, the one expiring at 4,000 is not.
    store
        .append_certificates(&[leaf(5, "k1", 4_000, "spiffe://td/a")])
        .await
        .unwrap();
    agree(2_000, &["k1"]).await;
    agree(4_000, &[]).await;
    // A key whose every certificate is revoked or expired still has certificates.
    for k in ["k1", "k2", "k3"] {
        assert!(
            store
                .any_certificate(&CertFilter::CaKey(k.into()))
                .await
                .unwrap(),
            "{k}: {url}"
        );
    }
    assert!(
        !store
            .any_certificate(&CertFilter::CaKey("none".into()))
            .await
            .unwrap()
    );
}

/// A database migrated before slots existed, holding the single root that signed leaves
/// directly (slot `root`, state `active`), upgrades to an active root slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_from_before_slots_upgrades_its_root_to_the_active_root_slot() {
    let insert = "INSERT INTO ca_keys (id, slot, algorithm, cert_pem, encrypted_key, created_at) \
                  VALUES ('old-root', 'root', 'EcdsaP256', 'pem', X'0102', 1700000000)";
    let old = |m: &sqlx::migrate::Migrator| sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            m.migrations
                .iter()
                .filter(|x| x.version < 5)
                .cloned()
                .collect(),
        ),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    let mut urls = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    {
        let path = dir.path().join("signet.db");
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect_with(
                sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true),
            )
            .await
            .unwrap();
        old(&crate::store::migrations::sqlite().await.unwrap())
            .run(&pool)
            .await
            .unwrap();
        sqlx::query(insert).execute(&pool).await.unwrap();
        pool.close().await;
        urls.push(signet_testutil::sqlite_url(dir.path()));
    }
    if let Some(url) = signet_testutil::fresh_postgres_database().await {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect(&url)
            .await
            .unwrap();
        old(&crate::store::migrations::postgres().await.unwrap())
            .run(&pool)
            .await
            .unwrap();
        sqlx::query(&insert.replace("X'0102'", "'\\x0102'::bytea"))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        urls.push(url);
    }
    for url in urls {
        let store = connect(&url, ACQUIRE).await.unwrap();
        let (_, slots) = store.ca_slots().await.unwrap();
        assert_eq!(slots.len(), 1, "{url}");
        let r = &slots[0];
        assert_eq!(
            (
                r.id.as_str(),
                r.slot.as_str(),
                r.kind.as_str(),
                r.state.as_str()
            ),
            ("old-root", "root", "root", "active"),
            "{url}"
        );
        assert_eq!(r.activated_at, Some(1_700_000_000));
        assert_eq!(r.parent_id, None);
        assert_eq!(r.tainted_at, None);
    }
}
