//! The [`AuditStore`] part of the conformance suite.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use super::Db;
use crate::store::AuditEvent;

conformance!(
    audit_events_round_trip_with_paging,
    newest_audit_event_of_kinds_within_a_window,
);

async fn audit_events_round_trip_with_paging(db: Db) {
    db.store.record_audit_events(&[]).await.unwrap();
    assert!(db.store.audit_events(0, 10).await.unwrap().is_empty());
    let event = |i: usize| AuditEvent {
        id: 999, // ignored
        at: 1_700_000_000 + i as i64,
        kind: if i.is_multiple_of(2) {
            "issue.denied"
        } else {
            "admin.mint"
        }
        .into(),
        caller: format!("mtls:spiffe://example.org/c{i}"),
        detail: format!("reason \"{i}\" ✓"),
    };
    let first: Vec<_> = (0..20).map(event).collect();
    let second: Vec<_> = (20..30).map(event).collect();
    db.store.record_audit_events(&first).await.unwrap();
    db.store.record_audit_events(&second).await.unwrap();

    let mut got = Vec::new();
    let mut after = 0;
    loop {
        let page = db.store.audit_events(after, 7).await.unwrap();
        assert!(page.len() <= 7);
        let Some(last) = page.last() else { break };
        after = last.id;
        got.extend(page);
    }
    assert_eq!(got.len(), 30);
    let ids: BTreeSet<u64> = got.iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), 30);
    assert!(got.windows(2).all(|w| w[0].id < w[1].id));
    for (i, e) in got.iter().enumerate() {
        let want = event(i);
        assert_eq!(
            (e.at, &e.kind, &e.caller, &e.detail),
            (want.at, &want.kind, &want.caller, &want.detail)
        );
    }
}

async fn newest_audit_event_of_kinds_within_a_window(db: Db) {
    let kinds = ["ledger.checkpoint", "admin.ledger_checkpoint"];
    let details =
        |events: Vec<AuditEvent>| -> Vec<String> { events.into_iter().map(|e| e.detail).collect() };
    assert!(
        db.store
            .newest_audit_events(&kinds, 100, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let event = |kind: &str, i: usize| AuditEvent {
        id: 0,
        at: 1_700_000_000 + i as i64,
        kind: kind.into(),
        caller: "server".into(),
        detail: format!("d{i}"),
    };
    db.store
        .record_audit_events(&[
            event("ledger.checkpoint", 0),
            event("admin.ledger_checkpoint", 1),
            event("ledger.checkpoint", 2),
            event("issue.denied", 3),
            event("issue.denied", 4),
        ])
        .await
        .unwrap();
    // Newest first, of the kinds asked, at most `limit`.
    assert_eq!(
        details(db.store.newest_audit_events(&kinds, 100, 10).await.unwrap()),
        ["d2", "d1", "d0"]
    );
    let newest = db.store.newest_audit_events(&kinds, 100, 1).await.unwrap();
    assert_eq!(newest.len(), 1);
    assert_eq!(
        (newest[0].kind.as_str(), newest[0].detail.as_str()),
        ("ledger.checkpoint", "d2")
    );
    assert_eq!(
        details(
            db.store
                .newest_audit_events(&["admin.ledger_checkpoint"], 100, 10)
                .await
                .unwrap()
        ),
        ["d1"]
    );
    // Only the newest `window` events are searched: the two denials hide the checkpoints
    // from a window of 2, not all of them from one of 4.
    assert!(
        db.store
            .newest_audit_events(&kinds, 2, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        details(db.store.newest_audit_events(&kinds, 4, 10).await.unwrap()),
        ["d2", "d1"]
    );
    assert!(
        db.store
            .newest_audit_events(&[], 100, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        db.store
            .newest_audit_events(&kinds, 100, 0)
            .await
            .unwrap()
            .is_empty()
    );
}
