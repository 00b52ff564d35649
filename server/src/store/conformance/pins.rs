//! The [`PinStore`] part of the conformance suite: the first writer of a pin wins (also between
//! store instances racing on an empty database), a later proposal adds only the names not yet
//! pinned, the evidence an older database offers, and the migration history that keeps an
//! older binary off a newer database (why the ledger format needs no pin of its own).
#![allow(clippy::unwrap_used)]

use super::{ACQUIRE, Db, certs};
use crate::store::pins::{PIN_DERIVED, PIN_FROM_CONFIGURATION};
use crate::store::{Pin, PinEvidence, StoredCaKey, connect};

conformance!(
    the_first_writer_of_each_pin_wins,
    racing_instances_pin_one_proposal_whole,
    evidence_is_what_the_database_holds,
    an_older_binary_cannot_start_on_a_newer_database,
);

fn pin(name: &str, value: &str, at: i64, source: &str) -> Pin {
    Pin {
        name: name.into(),
        value: value.into(),
        pinned_at: at,
        source: source.into(),
    }
}

async fn the_first_writer_of_each_pin_wins(db: Db) {
    assert!(db.store.deployment_pins().await.unwrap().is_empty());
    let first = [
        pin("trust_domain", "example.org", 10, PIN_FROM_CONFIGURATION),
        pin("ca_mode", "generated", 10, PIN_FROM_CONFIGURATION),
    ];
    let out = db.store.pin_deployment(&first).await.unwrap();
    assert_eq!(out.inserted, ["ca_mode", "trust_domain"]);
    let mut sorted = first.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(out.pins, sorted);
    // Another proposal changes nothing pinned, and pins only what is new.
    let other = db.another().await;
    let second = [
        pin("trust_domain", "corp.example", 20, PIN_DERIVED),
        pin("ca_mode", "plugged", 20, PIN_DERIVED),
        pin("zz_later", "v", 20, PIN_FROM_CONFIGURATION),
    ];
    let out = other.pin_deployment(&second).await.unwrap();
    assert_eq!(out.inserted, ["zz_later"]);
    let mut want = sorted.clone();
    want.push(second[2].clone());
    assert_eq!(out.pins, want);
    assert_eq!(db.store.deployment_pins().await.unwrap(), want);
    // Nothing proposed: the stored pins, unchanged.
    let out = db.store.pin_deployment(&[]).await.unwrap();
    assert!(out.inserted.is_empty());
    assert_eq!(out.pins, want);
}

/// Replicas starting together on an empty database: each proposes its own configuration at
/// once; one proposal is pinned whole (never a mix), and every instance reads that one.
async fn racing_instances_pin_one_proposal_whole(db: Db) {
    for round in 0..5 {
        let name = |n: &str| format!("{n}-{round}");
        let instances = [db.store.clone(), db.another().await, db.another().await];
        let tasks: Vec<_> = instances
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let proposal = [
                    pin(
                        &name("a"),
                        &format!("v{i}"),
                        i as i64,
                        PIN_FROM_CONFIGURATION,
                    ),
                    pin(
                        &name("b"),
                        &format!("v{i}"),
                        i as i64,
                        PIN_FROM_CONFIGURATION,
                    ),
                ];
                tokio::spawn(async move { s.pin_deployment(&proposal).await.unwrap() })
            })
            .collect();
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap());
        }
        let winners: Vec<_> = outcomes.iter().filter(|o| !o.inserted.is_empty()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        assert_eq!(winners[0].inserted, [name("a"), name("b")]);
        let mine: Vec<&Pin> = outcomes[0]
            .pins
            .iter()
            .filter(|p| p.name.ends_with(&format!("-{round}")))
            .collect();
        assert_eq!(mine.len(), 2);
        assert_eq!(mine[0].value, mine[1].value, "one proposal, whole");
        for o in &outcomes {
            assert_eq!(o.pins, outcomes[0].pins);
        }
    }
}

async fn evidence_is_what_the_database_holds(db: Db) {
    let e = db.store.pin_evidence().await.unwrap();
    assert_eq!(e, PinEvidence::default());
    assert!(e.is_empty());
    db.store.append_certificates(&certs(0..4)).await.unwrap();
    for (id, created_at) in [("root-b", 2), ("root-a", 1)] {
        db.store
            .insert_ca_key_if_absent(&StoredCaKey {
                id: id.into(),
                slot: id.into(),
                algorithm: "ecdsa-p256".into(),
                cert_pem: format!("pem of {id}"),
                encrypted_key: vec![1, 2],
                created_at,
            })
            .await
            .unwrap();
    }
    let e = db.store.pin_evidence().await.unwrap();
    assert!(!e.is_empty());
    assert_eq!(
        e.roots,
        [
            ("root-a".to_owned(), "pem of root-a".to_owned()),
            ("root-b".to_owned(), "pem of root-b".to_owned())
        ]
    );
    assert_eq!(e.ca_key_ids, ["root-a", "root-b"]);
    let first = e.first_certificate.unwrap();
    let last = e.last_certificate.unwrap();
    assert_eq!(
        (first.seq, first.spiffe_id),
        (1, certs(0..1)[0].spiffe_id.clone())
    );
    assert_eq!(
        (last.seq, last.spiffe_id),
        (4, certs(3..4)[0].spiffe_id.clone())
    );
    assert_eq!(last.ca_key_id, "root-1");
}

/// sqlx refuses to run on a database that has applied a migration it does not know: a binary
/// from before an upgrade cannot start on the upgraded database (and so cannot write a ledger
/// format older than the one the newer binary writes).
async fn an_older_binary_cannot_start_on_a_newer_database(db: Db) {
    let sql = "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
               execution_time) VALUES (9999, 'from a newer Signet', TRUE, $1, 0)";
    if db.url.starts_with("sqlite:") {
        let pool = sqlx::sqlite::SqlitePool::connect(&db.url).await.unwrap();
        sqlx::query(sql)
            .bind(vec![0u8; 48])
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    } else {
        let pool = sqlx::postgres::PgPool::connect(&db.url).await.unwrap();
        sqlx::query(sql)
            .bind(vec![0u8; 48])
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
    let err = connect(&db.url, ACQUIRE).await.err().expect("refused");
    assert!(err.to_string().contains("9999"), "{err}");
}
