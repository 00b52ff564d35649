//! The [`FederationStore`] part of the conformance suite: what replicas sharing one database
//! agree on — one claim per due fetch, one bundle written per compare-and-set, one own
//! bundle-endpoint sequence that never goes down nor comes back with older keys.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use super::Db;
use crate::store::federation::EndpointSequence;
use crate::store::{BundleReplace, BundleWrite, FederationStore, RelationshipRow};

conformance!(
    replicas_share_one_bundle_endpoint_sequence,
    racing_replicas_claim_a_fetch_once_and_write_a_bundle_once,
);

fn row(td: &str) -> RelationshipRow {
    RelationshipRow {
        trust_domain: td.into(),
        endpoint_url: "https://partner.test/".into(),
        profile: "https_spiffe".into(),
        endpoint_spiffe_id: format!("spiffe://{td}/e"),
        created_at: 1,
        bundle_document: "{\"keys\":[]}".into(),
        bundle_sha256: "aa".into(),
        bundle_sequence: Some(1),
        bundle_updated_at: 1,
        last_success_at: 0,
        last_attempt_at: 0,
        next_refresh_at: 100,
        last_error: String::new(),
        consecutive_failures: 0,
    }
}

async fn replicas_share_one_bundle_endpoint_sequence(db: Db) {
    let a: Arc<dyn FederationStore> = db.store.clone();
    let b: Arc<dyn FederationStore> = db.another().await;
    let seq = |e: EndpointSequence| {
        assert_eq!(e.newer_document, None);
        e.sequence
    };
    // The first keys take the clock's value; the same keys keep it on every replica.
    assert_eq!(
        seq(a
            .bundle_endpoint_sequence("h1", Some(1), "d1", 1_000)
            .await
            .unwrap()),
        1_000
    );
    assert_eq!(
        seq(b
            .bundle_endpoint_sequence("h1", Some(1), "d1", 5_000)
            .await
            .unwrap()),
        1_000
    );
    // Newer keys (a newer generation): at least previous + 1, even with a clock behind.
    assert_eq!(
        seq(b
            .bundle_endpoint_sequence("h2", Some(2), "d2", 10)
            .await
            .unwrap()),
        1_001
    );
    // A replica still at generation 1 serves the stored document and sequence: never its
    // older keys under a newer number, and nothing written.
    let behind = a
        .bundle_endpoint_sequence("h1", Some(1), "d1", 10)
        .await
        .unwrap();
    assert_eq!(
        behind,
        EndpointSequence {
            sequence: 1_001,
            newer_document: Some("d2".into())
        }
    );
    // Unordered keys (a plugged-in CA) that differ move it on.
    assert_eq!(
        seq(a
            .bundle_endpoint_sequence("h3", None, "d3", 10)
            .await
            .unwrap()),
        1_002
    );
    // Racing replicas with new keys of newer generations take distinct sequences.
    let racers = (0..8).map(|i| {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move {
            s.bundle_endpoint_sequence(&format!("r{i}"), Some(10 + i), "d", 0)
                .await
                .unwrap()
                .sequence
        }
    });
    let got = futures::future::join_all(racers).await;
    assert!(got.iter().all(|s| *s > 1_002), "{got:?}");
}

async fn racing_replicas_claim_a_fetch_once_and_write_a_bundle_once(db: Db) {
    let a: Arc<dyn FederationStore> = db.store.clone();
    let b: Arc<dyn FederationStore> = db.another().await;
    assert!(a.create_relationship(&row("partner.test")).await.unwrap());
    assert!(!b.create_relationship(&row("partner.test")).await.unwrap());
    let claims = (0..8).map(|i| {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move {
            s.claim_refresh("partner.test", 100, 160, false)
                .await
                .unwrap()
        }
    });
    let won = futures::future::join_all(claims).await;
    assert_eq!(won.iter().filter(|w| **w).count(), 1);
    let writes = (0..8).map(|i| {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move {
            let sha = format!("bb{i}");
            s.replace_bundle(
                "partner.test",
                "aa",
                &BundleWrite {
                    document: "{\"keys\":[]}",
                    sha256: &sha,
                    sequence: Some(2),
                },
                200,
            )
            .await
            .unwrap()
        }
    });
    let done = futures::future::join_all(writes).await;
    assert_eq!(
        done.iter()
            .filter(|d| matches!(d, BundleReplace::Replaced { .. }))
            .count(),
        1,
        "{done:?}"
    );
    let held = a.relationship("partner.test").await.unwrap().unwrap().row;
    assert!(held.bundle_sha256.starts_with("bb"));
    assert_eq!(held.bundle_sequence, Some(2));
}
