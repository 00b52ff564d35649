//! The [`AuditStore`] part of the conformance suite.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use super::Db;
use crate::store::AuditEvent;

conformance!(audit_events_round_trip_with_paging,);

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
