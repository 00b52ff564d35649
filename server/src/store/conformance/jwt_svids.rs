//! JWT-SVID rows in the ledger: appended in the same batches as certificates (one chain, one
//! head, order kept), between certificate rows and revocation events, streamed and paged, and
//! appended by two instances at once into one chain.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use signet_types::ledger::{Hash, Verifier, sha256};

use super::{Db, cert};
use crate::store::revocations::NewRevocation;
use crate::store::{NewJwtSvid, NewLedgerRow, Order, Store};

conformance!(
    jwt_rows_share_batches_and_the_chain_with_certificates_and_events,
    jwt_rows_page_both_ways_and_filter_by_spiffe_id,
    two_instances_appending_jwt_and_certificate_rows_keep_one_chain,
);

pub(crate) fn jwt(i: usize) -> NewJwtSvid {
    NewJwtSvid {
        spiffe_id: format!("spiffe://example.org/w/{}", i % 3),
        audience: vec![format!("aud-{i}"), "shared".into()],
        issued_at: 1_700_000_000 + i as i64,
        expires_at: 1_700_000_300 + i as i64,
        key_id: "kid-1".into(),
        token_sha256: sha256(format!("token-{i}").as_bytes()),
        caller: "mtls:spiffe://example.org/signet/node/n1".into(),
        request_id: format!("jwt-req-{i}"),
        provenance: format!(
            r#"{{"source":{{"kind":"entry","entry_id":"e{i}","node_id":"n1"}},"authorized_at":{i}}}"#
        ),
    }
}

enum Row {
    Cert(Box<signet_types::ledger::LedgerRecord>),
    Event(crate::store::EventRow),
    Jwt(signet_types::ledger::JwtSvidRecord),
}

/// Every row of the chain (certificates, events, JWT-SVIDs), merged by seq and verified against
/// the head; returns the rows by seq.
async fn verify_all(store: &dyn Store) -> BTreeMap<u64, Row> {
    let mut rows = BTreeMap::new();
    for r in store.list_certificates(0, 10_000, None).await.unwrap() {
        rows.insert(r.entry.seq, Row::Cert(Box::new(r)));
    }
    for e in store.ledger_events(0, 10_000).await.unwrap() {
        assert!(rows.insert(e.event.seq, Row::Event(e)).is_none());
    }
    let mut after = 0;
    loop {
        let page = store.list_jwt_svids(after, 7, None).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.entry.seq;
        for j in page {
            assert!(rows.insert(j.entry.seq, Row::Jwt(j)).is_none());
        }
    }
    let mut v = Verifier::default();
    for row in rows.values() {
        match row {
            Row::Cert(r) => v.push(&r.entry, &r.prev_hash, &r.hash).unwrap(),
            Row::Event(e) => v.push_event(&e.event, &e.prev_hash, &e.hash).unwrap(),
            Row::Jwt(j) => v.push_jwt(&j.entry, &j.prev_hash, &j.hash).unwrap(),
        }
    }
    let head = store.ledger_head().await.unwrap();
    v.finish(head.seq, &head.hash).unwrap();
    rows
}

async fn jwt_rows_share_batches_and_the_chain_with_certificates_and_events(db: Db) {
    let s = &db.store;
    // One batch: cert, jwt, jwt, cert: seqs in that order.
    let batch = vec![
        NewLedgerRow::Certificate(cert(0)),
        NewLedgerRow::JwtSvid(jwt(0)),
        NewLedgerRow::JwtSvid(jwt(1)),
        NewLedgerRow::Certificate(cert(1)),
    ];
    assert_eq!(s.append_rows(&batch).await.unwrap(), vec![1, 2, 3, 4]);
    // A JWT-only batch (the fast path on PostgreSQL knows the head now), then a revocation
    // event, then a mixed batch again (the head moved under the fast path: the locking path).
    assert_eq!(
        s.append_rows(&[NewLedgerRow::JwtSvid(jwt(2))])
            .await
            .unwrap(),
        vec![5]
    );
    let out = s
        .append_revocations(&[NewRevocation {
            serial: cert(0).serial,
            reason: "keyCompromise".into(),
            at: 1_700_000_050,
            caller: "admin".into(),
            request_id: "rev".into(),
            detail: r#"{"by":"serial"}"#.into(),
        }])
        .await
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        s.append_rows(&[
            NewLedgerRow::JwtSvid(jwt(3)),
            NewLedgerRow::Certificate(cert(2)),
        ])
        .await
        .unwrap(),
        vec![7, 8]
    );
    let rows = verify_all(&**s).await;
    let kinds: String = rows
        .values()
        .map(|r| match r {
            Row::Cert(_) => 'c',
            Row::Event(_) => 'e',
            Row::Jwt(_) => 'j',
        })
        .collect();
    assert_eq!(kinds, "cjjcjejc");
    // A row holds exactly what was appended (and never a token: there is no column for one).
    let Some(Row::Jwt(j)) = rows.get(&2) else {
        panic!("row 2 is a JWT-SVID")
    };
    let want = jwt(0);
    assert_eq!(j.entry.spiffe_id, want.spiffe_id);
    assert_eq!(j.entry.audience, want.audience);
    assert_eq!(j.entry.issued_at, want.issued_at);
    assert_eq!(j.entry.expires_at, want.expires_at);
    assert_eq!(j.entry.key_id, want.key_id);
    assert_eq!(j.entry.token_sha256, want.token_sha256);
    assert_eq!(j.entry.caller, want.caller);
    assert_eq!(j.entry.request_id, want.request_id);
    assert_eq!(j.entry.provenance, want.provenance);
    assert!(j.hashes_to_itself());
    // The certificate listing is unchanged: certificates only.
    let certs = s.list_certificates(0, 100, None).await.unwrap();
    assert_eq!(
        certs.iter().map(|r| r.entry.seq).collect::<Vec<_>>(),
        vec![1, 4, 8]
    );
    // A failed batch writes neither kind: a duplicate serial after a JWT row.
    let err = s
        .append_rows(&[
            NewLedgerRow::JwtSvid(jwt(9)),
            NewLedgerRow::Certificate(cert(1)),
        ])
        .await;
    assert!(err.is_err());
    assert_eq!(s.ledger_head().await.unwrap().seq, 8);
    assert_eq!(s.list_jwt_svids(0, 100, None).await.unwrap().len(), 4);
}

async fn jwt_rows_page_both_ways_and_filter_by_spiffe_id(db: Db) {
    let s = &db.store;
    let batch: Vec<NewLedgerRow> = (0..12)
        .map(|i| {
            if i % 4 == 3 {
                NewLedgerRow::Certificate(cert(i))
            } else {
                NewLedgerRow::JwtSvid(jwt(i))
            }
        })
        .collect();
    s.append_rows(&batch).await.unwrap();
    let seqs = |rows: &[signet_types::ledger::JwtSvidRecord]| {
        rows.iter().map(|r| r.entry.seq).collect::<Vec<_>>()
    };
    let all = s
        .jwt_svids_page(Order::OldestFirst, None, 100, None)
        .await
        .unwrap();
    assert_eq!(seqs(&all), vec![1, 2, 3, 5, 6, 7, 9, 10, 11]);
    let newest = s
        .jwt_svids_page(Order::NewestFirst, None, 4, None)
        .await
        .unwrap();
    assert_eq!(seqs(&newest), vec![11, 10, 9, 7]);
    let older = s
        .jwt_svids_page(Order::NewestFirst, Some(7), 100, None)
        .await
        .unwrap();
    assert_eq!(seqs(&older), vec![6, 5, 3, 2, 1]);
    let after = s
        .jwt_svids_page(Order::OldestFirst, Some(5), 2, None)
        .await
        .unwrap();
    assert_eq!(seqs(&after), vec![6, 7]);
    // Only one identity: jwt(i) is w/{i % 3}, so i = 1, 4, 10 (7 is a certificate).
    let one = s
        .jwt_svids_page(
            Order::OldestFirst,
            None,
            100,
            Some("spiffe://example.org/w/1"),
        )
        .await
        .unwrap();
    assert_eq!(seqs(&one), vec![2, 5, 11]);
    assert!(
        one.iter()
            .all(|r| r.entry.spiffe_id == "spiffe://example.org/w/1")
    );
}

async fn two_instances_appending_jwt_and_certificate_rows_keep_one_chain(db: Db) {
    let a = db.store.clone();
    let b = db.another().await;
    let mk = |start: usize| -> Vec<NewLedgerRow> {
        (start..start + 6)
            .map(|i| {
                if i % 2 == 0 {
                    NewLedgerRow::JwtSvid(jwt(i))
                } else {
                    NewLedgerRow::Certificate(cert(i))
                }
            })
            .collect()
    };
    let mut tasks = Vec::new();
    for k in 0..4usize {
        let (a, b) = (a.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            let s = if k % 2 == 0 { a } else { b };
            for round in 0..3usize {
                s.append_rows(&mk(100 * k + 10 * round)).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rows = verify_all(&*db.store).await;
    assert_eq!(rows.len(), 4 * 3 * 6);
    let _: Option<Hash> = None;
}
