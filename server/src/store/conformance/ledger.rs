//! The [`LedgerStore`] part of the conformance suite: the hash chain, paging, lookups,
//! all-or-nothing batches, and two instances appending to one chain.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use super::{Db, cert, certs, verify_chain};
use crate::store::paging::CertPage;
use crate::store::{CertQuery, NewCertificate, Order, StoreError, certificates_page};

conformance!(
    appended_batches_form_a_verifiable_chain,
    list_pages_and_filters_by_spiffe_id,
    certificate_by_serial_and_count,
    a_duplicate_serial_fails_the_whole_batch,
    concurrent_appends_from_two_instances_keep_one_chain,
    an_append_after_another_instance_moved_the_head_chains_on_its_rows,
    pages_by_key_follow_their_tokens_both_ways,
    pages_with_equal_timestamps_neither_repeat_nor_skip,
    an_empty_ledger_and_a_last_page_have_no_next_token,
    a_garbage_or_foreign_page_token_is_invalid_argument,
);

async fn appended_batches_form_a_verifiable_chain(db: Db) {
    assert_eq!(
        db.store.append_certificates(&[]).await.unwrap(),
        Vec::<u64>::new()
    );
    let mut next = 0;
    let mut seq = 1u64;
    for size in [1usize, 5, 64, 3, 200] {
        let batch = certs(next..next + size);
        let seqs = db.store.append_certificates(&batch).await.unwrap();
        assert_eq!(seqs, (seq..seq + size as u64).collect::<Vec<_>>());
        next += size;
        seq += size as u64;
    }
    assert_eq!(verify_chain(&*db.store).await, next as u64);
    // Rows hold exactly what was appended.
    let rows = db.store.list_certificates(0, 1000, None).await.unwrap();
    for (i, r) in rows.iter().enumerate() {
        let c = cert(i);
        assert_eq!(r.entry.seq, i as u64 + 1);
        assert_eq!(r.entry.serial, c.serial);
        assert_eq!(r.entry.spiffe_id, c.spiffe_id);
        assert_eq!(r.entry.dns_names, c.dns_names);
        assert_eq!(r.entry.ip_addresses, c.ip_addresses);
        assert_eq!(r.entry.not_before, c.not_before);
        assert_eq!(r.entry.not_after, c.not_after);
        assert_eq!(r.entry.cert_sha256, c.cert_sha256);
        assert_eq!(r.entry.ca_key_id, c.ca_key_id);
        assert_eq!(r.entry.caller, c.caller);
        assert_eq!(r.entry.issued_at, c.issued_at);
        assert_eq!(r.entry.request_id, c.request_id);
        assert_eq!(r.cert_der, c.cert_der);
    }
    // The head is the last row's hash.
    let head = db.store.ledger_head().await.unwrap();
    assert_eq!(head.seq, next as u64);
    assert_eq!(Some(head.hash), rows.last().map(|r| r.hash));
}

async fn list_pages_and_filters_by_spiffe_id(db: Db) {
    db.store.append_certificates(&certs(0..25)).await.unwrap();
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = db.store.list_certificates(after, 10, None).await.unwrap();
        assert!(page.len() <= 10);
        let Some(last) = page.last() else { break };
        after = last.entry.seq;
        seen.extend(page.iter().map(|r| r.entry.seq));
    }
    assert_eq!(seen, (1..=25).collect::<Vec<u64>>());
    assert!(
        db.store
            .list_certificates(25, 10, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        db.store
            .list_certificates(0, 0, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        db.store
            .list_certificates(u64::MAX, 10, None)
            .await
            .unwrap()
            .is_empty()
    );

    let id = "spiffe://example.org/ns/n1/sa/s";
    let expected: Vec<u64> = (0..25)
        .filter(|i| i % 3 == 1)
        .map(|i| i as u64 + 1)
        .collect();
    let mut got = Vec::new();
    let mut after = 0;
    loop {
        let page = db
            .store
            .list_certificates(after, 3, Some(id))
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.entry.seq;
        assert!(page.iter().all(|r| r.entry.spiffe_id == id));
        got.extend(page.iter().map(|r| r.entry.seq));
    }
    assert_eq!(got, expected);
    assert!(
        db.store
            .list_certificates(0, 10, Some("spiffe://example.org/nobody"))
            .await
            .unwrap()
            .is_empty()
    );
}

async fn certificate_by_serial_and_count(db: Db) {
    assert_eq!(db.store.count_certificates().await.unwrap(), 0);
    db.store.append_certificates(&certs(0..10)).await.unwrap();
    assert_eq!(db.store.count_certificates().await.unwrap(), 10);
    let c = cert(7);
    let row = db
        .store
        .certificate_by_serial(&c.serial)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.entry.seq, 8);
    assert_eq!(row.entry.request_id, c.request_id);
    assert_eq!(row.cert_der, c.cert_der);
    let all = db.store.list_certificates(7, 1, None).await.unwrap();
    assert_eq!(all, vec![row]);
    assert_eq!(db.store.certificate_by_serial("ffff").await.unwrap(), None);
}

async fn a_duplicate_serial_fails_the_whole_batch(db: Db) {
    db.store.append_certificates(&certs(0..5)).await.unwrap();
    let head = db.store.ledger_head().await.unwrap();

    // Clashes with a stored row.
    let mut batch = certs(5..9);
    batch[2].serial = cert(1).serial;
    let err = db.store.append_certificates(&batch).await.unwrap_err();
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
    // Clashes within the batch.
    let mut batch = certs(5..9);
    batch[3].serial = batch[0].serial.clone();
    let err = db.store.append_certificates(&batch).await.unwrap_err();
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");

    assert_eq!(db.store.ledger_head().await.unwrap(), head);
    assert_eq!(db.store.count_certificates().await.unwrap(), 5);
    assert_eq!(
        db.store
            .certificate_by_serial(&cert(5).serial)
            .await
            .unwrap(),
        None
    );
    // The chain carries on from where it was.
    let seqs = db.store.append_certificates(&certs(5..9)).await.unwrap();
    assert_eq!(seqs, vec![6, 7, 8, 9]);
    assert_eq!(verify_chain(&*db.store).await, 9);
}

async fn concurrent_appends_from_two_instances_keep_one_chain(db: Db) {
    let other = db.another().await;
    let mut tasks = Vec::new();
    for t in 0..10usize {
        let store = if t % 2 == 0 {
            db.store.clone()
        } else {
            other.clone()
        };
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for b in 0..4usize {
                let start = (t * 4 + b) * 5;
                seqs.extend(
                    store
                        .append_certificates(&certs(start..start + 5))
                        .await
                        .unwrap(),
                );
            }
            seqs
        }));
    }
    let mut all = BTreeSet::new();
    for t in tasks {
        for s in t.await.unwrap() {
            assert!(all.insert(s), "seq {s} handed out twice");
        }
    }
    assert_eq!(all, (1..=200).collect::<BTreeSet<u64>>());
    assert_eq!(verify_chain(&*db.store).await, 200);
    assert_eq!(verify_chain(&*other).await, 200);
}

/// A replica that appended last, then was overtaken by another (its remembered head is stale:
/// PostgreSQL's one-statement append finds the head moved and writes nothing), still appends
/// after the other's rows, never beside them.
async fn an_append_after_another_instance_moved_the_head_chains_on_its_rows(db: Db) {
    let other = db.another().await;
    assert_eq!(
        db.store.append_certificates(&certs(0..5)).await.unwrap(),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(
        other.append_certificates(&certs(5..8)).await.unwrap(),
        vec![6, 7, 8]
    );
    assert_eq!(
        db.store.append_certificates(&certs(8..10)).await.unwrap(),
        vec![9, 10]
    );
    // And again the other way round, then twice in a row on one instance.
    assert_eq!(
        other.append_certificates(&certs(10..11)).await.unwrap(),
        vec![11]
    );
    assert_eq!(
        db.store.append_certificates(&certs(11..12)).await.unwrap(),
        vec![12]
    );
    assert_eq!(
        db.store.append_certificates(&certs(12..14)).await.unwrap(),
        vec![13, 14]
    );
    assert_eq!(verify_chain(&*db.store).await, 14);
    let head = db.store.ledger_head().await.unwrap();
    assert_eq!(head, other.ledger_head().await.unwrap());
    assert_eq!(head.seq, 14);
}

/// Prints `append_certificates` throughput on PostgreSQL for batches of 64 and 512, single
/// writer, 700-byte certificates. Run with:
/// `cargo test -p signet-server --lib store::conformance::ledger::postgres_append_throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn postgres_append_throughput() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    let mut next = 0;
    for batch_size in [1usize, 64, 512] {
        let rows_target = if batch_size == 1 { 2_000 } else { 50_000 };
        let batches = rows_target / batch_size;
        let prepared: Vec<Vec<NewCertificate>> = (0..batches)
            .map(|b| certs(next + b * batch_size..next + (b + 1) * batch_size))
            .collect();
        next += batches * batch_size;
        let started =
            signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock).into_std();
        for batch in &prepared {
            db.store.append_certificates(batch).await.unwrap();
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "append_certificates batch={batch_size}: {batches} batches, {} rows in {secs:.2}s = {:.0} rows/s, {:.2} ms/batch",
            batches * batch_size,
            (batches * batch_size) as f64 / secs,
            secs * 1000.0 / batches as f64
        );
    }
    assert_eq!(verify_chain(&*db.store).await, next as u64);
}

/// Every page of `q`, following the tokens; the seqs in the order they came.
async fn all_pages(db: &Db, q: CertQuery<'_>) -> (Vec<u64>, usize) {
    let (mut seqs, mut pages, mut token) = (Vec::new(), 0, None::<String>);
    loop {
        let page: CertPage = certificates_page(
            &*db.store,
            &CertQuery {
                page_token: token.as_deref(),
                ..q
            },
        )
        .await
        .unwrap();
        assert!(page.rows.len() <= q.limit as usize);
        if let Some(id) = q.spiffe_id {
            assert!(page.rows.iter().all(|r| r.entry.spiffe_id == id));
        }
        seqs.extend(page.rows.iter().map(|r| r.entry.seq));
        pages += 1;
        match page.next {
            Some(next) => {
                assert_eq!(
                    page.rows.len(),
                    q.limit as usize,
                    "a short page with a next token"
                );
                token = Some(next);
            }
            None => return (seqs, pages),
        }
    }
}

async fn pages_by_key_follow_their_tokens_both_ways(db: Db) {
    db.store.append_certificates(&certs(0..25)).await.unwrap();
    let oldest = CertQuery {
        limit: 10,
        ..CertQuery::default()
    };
    // 25 rows in pages of 10: 10, 10, 5; exactly a page boundary: 5 pages of 5, no empty sixth.
    assert_eq!(all_pages(&db, oldest).await, ((1..=25).collect(), 3));
    assert_eq!(
        all_pages(&db, CertQuery { limit: 5, ..oldest }).await,
        ((1..=25).collect(), 5)
    );
    let newest = CertQuery {
        order: Order::NewestFirst,
        limit: 4,
        ..CertQuery::default()
    };
    assert_eq!(all_pages(&db, newest).await, ((1..=25).rev().collect(), 7));

    // One SPIFFE ID, newest first: its own rows only, through the (spiffe_id, seq) index.
    let id = "spiffe://example.org/ns/n1/sa/s";
    let mine: Vec<u64> = (0..25u64).filter(|i| i % 3 == 1).map(|i| i + 1).collect();
    let (got, _) = all_pages(
        &db,
        CertQuery {
            spiffe_id: Some(id),
            ..newest
        },
    )
    .await;
    assert_eq!(got, mine.iter().rev().copied().collect::<Vec<_>>());
    let (got, _) = all_pages(
        &db,
        CertQuery {
            spiffe_id: Some(id),
            limit: 3,
            ..oldest
        },
    )
    .await;
    assert_eq!(got, mine);

    // Rows appended after a page was read show up on the next oldest-first page, and the
    // newest-first listing that is under way does not repeat anything.
    let first = certificates_page(&*db.store, &newest).await.unwrap();
    db.store.append_certificates(&certs(25..30)).await.unwrap();
    let second = certificates_page(
        &*db.store,
        &CertQuery {
            page_token: first.next.as_deref(),
            ..newest
        },
    )
    .await
    .unwrap();
    let seqs: Vec<u64> = second.rows.iter().map(|r| r.entry.seq).collect();
    assert_eq!(seqs, vec![21, 20, 19, 18]);
    assert_eq!(all_pages(&db, oldest).await.0, (1..=30).collect::<Vec<_>>());
}

async fn pages_with_equal_timestamps_neither_repeat_nor_skip(db: Db) {
    // A burst within one second: every row has the same issued_at and validity.
    let burst: Vec<NewCertificate> = certs(0..23)
        .into_iter()
        .map(|c| NewCertificate {
            issued_at: 1_700_000_000,
            not_before: 1_700_000_000,
            not_after: 1_700_003_600,
            ..c
        })
        .collect();
    db.store.append_certificates(&burst).await.unwrap();
    for order in [Order::OldestFirst, Order::NewestFirst] {
        let (seqs, _) = all_pages(
            &db,
            CertQuery {
                order,
                limit: 4,
                ..CertQuery::default()
            },
        )
        .await;
        let unique: BTreeSet<u64> = seqs.iter().copied().collect();
        assert_eq!((seqs.len(), unique.len()), (23, 23), "{order:?}: {seqs:?}");
    }
}

async fn an_empty_ledger_and_a_last_page_have_no_next_token(db: Db) {
    for order in [Order::OldestFirst, Order::NewestFirst] {
        let q = CertQuery {
            order,
            limit: 10,
            ..CertQuery::default()
        };
        let page = certificates_page(&*db.store, &q).await.unwrap();
        assert_eq!(
            page,
            CertPage {
                rows: vec![],
                next: None
            }
        );
    }
    db.store.append_certificates(&certs(0..3)).await.unwrap();
    let q = CertQuery {
        limit: 3,
        ..CertQuery::default()
    };
    let page = certificates_page(&*db.store, &q).await.unwrap();
    assert_eq!((page.rows.len(), page.next), (3, None));
    // A limit of 0 is an empty page, not everything.
    let page = certificates_page(&*db.store, &CertQuery { limit: 0, ..q })
        .await
        .unwrap();
    assert_eq!(
        page,
        CertPage {
            rows: vec![],
            next: None
        }
    );
    // No such SPIFFE ID: an empty page.
    let page = certificates_page(
        &*db.store,
        &CertQuery {
            spiffe_id: Some("spiffe://example.org/nobody"),
            ..q
        },
    )
    .await
    .unwrap();
    assert_eq!(
        page,
        CertPage {
            rows: vec![],
            next: None
        }
    );
}

async fn a_garbage_or_foreign_page_token_is_invalid_argument(db: Db) {
    db.store.append_certificates(&certs(0..10)).await.unwrap();
    let q = CertQuery {
        limit: 2,
        ..CertQuery::default()
    };
    let token = certificates_page(&*db.store, &q)
        .await
        .unwrap()
        .next
        .unwrap();
    for (bad, says) in [
        ("%%%", "not a page token"),
        ("AAAAAAAAAAAAAAAAAAAAAAAA", "not a page token"),
        (&token[1..], "not a page token"),
    ] {
        let err = certificates_page(
            &*db.store,
            &CertQuery {
                page_token: Some(bad),
                ..q
            },
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidArgument(m) if m.contains(says)),
            "{bad}: {err}"
        );
    }
    // The token of another listing (another SPIFFE ID, or the other order) is refused too.
    for other in [
        CertQuery {
            spiffe_id: Some("spiffe://example.org/ns/n1/sa/s"),
            ..q
        },
        CertQuery {
            order: Order::NewestFirst,
            ..q
        },
    ] {
        let err = certificates_page(
            &*db.store,
            &CertQuery {
                page_token: Some(&token),
                ..other
            },
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidArgument(m) if m.contains("another listing")),
            "{err}"
        );
    }
}
