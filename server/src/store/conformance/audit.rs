//! The [`AuditStore`] part of the conformance suite.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use super::Db;
use crate::store::audit::{AuditFilter, AuditQuery, KindFilter, audit_page, page_after};
use crate::store::{AuditEvent, Order, StoreError};

conformance!(
    audit_events_round_trip_with_paging,
    newest_audit_event_of_kinds_within_a_window,
    filtered_audit_pages_see_every_match_in_either_order,
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

/// Every page of `q`, following the tokens; the ids in the order listed.
async fn all_pages(db: &Db, q: AuditQuery<'_>) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let this = AuditQuery {
            page_token: token.as_deref(),
            ..q
        };
        let page = audit_page(&*db.store, &this).await.unwrap();
        assert!(page.events.len() <= q.limit as usize);
        ids.extend(page.events.iter().map(|e| e.id));
        match page.next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    ids
}

async fn filtered_audit_pages_see_every_match_in_either_order(db: Db) {
    // 250 events: kinds ca.prepare / ca.activate / admin.node_ban / cab.x (a lookalike that
    // the prefix "ca." must not match), two callers, one a second apart.
    let kinds = ["ca.prepare", "ca.activate", "admin.node_ban", "cab.x"];
    let events: Vec<AuditEvent> = (0..250)
        .map(|i| AuditEvent {
            id: 0,
            at: 1_800_000_000 + i as i64,
            kind: kinds[i % 4].into(),
            caller: if i % 3 == 0 { "op" } else { "node:n1" }.into(),
            detail: format!("event {i}"),
        })
        .collect();
    db.store.record_audit_events(&events).await.unwrap();
    let all = all_pages(
        &db,
        AuditQuery {
            limit: 1000,
            ..AuditQuery::default()
        },
    )
    .await;
    assert_eq!(all.len(), 250);
    let id_of = |i: usize| all[i];
    let matching =
        |f: &dyn Fn(usize) -> bool| -> Vec<u64> { (0..250).filter(|i| f(*i)).map(id_of).collect() };
    let cases: Vec<(AuditFilter<'_>, Vec<u64>)> = vec![
        (AuditFilter::default(), all.clone()),
        (
            AuditFilter {
                kind: KindFilter::parse("ca."),
                ..AuditFilter::default()
            },
            matching(&|i| i % 4 < 2),
        ),
        (
            AuditFilter {
                kind: KindFilter::parse("ca.*"),
                ..AuditFilter::default()
            },
            matching(&|i| i % 4 < 2),
        ),
        (
            AuditFilter {
                kind: KindFilter::parse("admin.node_ban"),
                ..AuditFilter::default()
            },
            matching(&|i| i % 4 == 2),
        ),
        (
            AuditFilter {
                caller: Some("op"),
                ..AuditFilter::default()
            },
            matching(&|i| i % 3 == 0),
        ),
        (
            AuditFilter {
                since: Some(1_800_000_200),
                ..AuditFilter::default()
            },
            matching(&|i| i >= 200),
        ),
        (
            AuditFilter {
                kind: KindFilter::parse("ca.activate"),
                since: Some(1_800_000_100),
                caller: Some("op"),
            },
            matching(&|i| i % 4 == 1 && i >= 100 && i % 3 == 0),
        ),
        (
            AuditFilter {
                kind: KindFilter::parse("nothing."),
                ..AuditFilter::default()
            },
            Vec::new(),
        ),
    ];
    for (filter, want) in cases {
        for (order, limit) in [(Order::OldestFirst, 7), (Order::NewestFirst, 10)] {
            let got = all_pages(
                &db,
                AuditQuery {
                    filter,
                    order,
                    limit,
                    page_token: None,
                },
            )
            .await;
            let mut expected = want.clone();
            if order == Order::NewestFirst {
                expected.reverse();
            }
            assert_eq!(got, expected, "{filter:?} {order:?}");
        }
    }
    // A token is good only for its own filters and order.
    let kind_ca = AuditFilter {
        kind: KindFilter::parse("ca."),
        ..AuditFilter::default()
    };
    let first = audit_page(
        &*db.store,
        &AuditQuery {
            filter: kind_ca,
            order: Order::NewestFirst,
            limit: 5,
            page_token: None,
        },
    )
    .await
    .unwrap();
    let token = first.next.unwrap();
    for (filter, order) in [
        (AuditFilter::default(), Order::NewestFirst),
        (kind_ca, Order::OldestFirst),
    ] {
        let err = audit_page(
            &*db.store,
            &AuditQuery {
                filter,
                order,
                limit: 5,
                page_token: Some(&token),
            },
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidArgument(m) if m.contains("another listing")),
            "{err}"
        );
    }
    // The older after_id form continues an oldest-first listing.
    let rest = audit_page(
        &*db.store,
        &AuditQuery {
            filter: kind_ca,
            limit: 1000,
            page_token: Some(&page_after(&kind_ca, id_of(245))),
            ..AuditQuery::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        rest.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![id_of(248), id_of(249)]
    );
}
