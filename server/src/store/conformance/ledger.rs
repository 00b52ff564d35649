//! The [`LedgerStore`] part of the conformance suite: the hash chain, paging, lookups,
//! all-or-nothing batches, and two instances appending to one chain.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Instant;

use super::{Db, cert, certs, verify_chain};
use crate::store::{NewCertificate, StoreError};

conformance!(
    appended_batches_form_a_verifiable_chain,
    list_pages_and_filters_by_spiffe_id,
    certificate_by_serial_and_count,
    a_duplicate_serial_fails_the_whole_batch,
    concurrent_appends_from_two_instances_keep_one_chain,
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
        let started = Instant::now();
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
