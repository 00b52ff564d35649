//! One test suite for every [`Store`] implementation: each case below runs against SQLite (a
//! temporary file) and PostgreSQL (a fresh database from `signet-testutil`; skipped locally
//! without `SIGNET_TEST_DATABASE_URL`, required in CI).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use signet_types::ledger::{GENESIS, Verifier, sha256};

use super::{
    AuditEvent, LedgerStore, NewCertificate, PgStore, SqliteStore, Store, StoreError, StoredCaKey,
    connect,
};

const ACQUIRE: Duration = Duration::from_secs(10);

/// One database, and a way to open more store instances on it (as more replicas would).
pub(super) struct Db {
    pub(super) url: String,
    pub(super) store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

impl Db {
    pub(super) async fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        // A directory that does not exist yet: connect creates it.
        let url = signet_testutil::sqlite_url(&dir.path().join("sub"));
        let store = Arc::new(SqliteStore::connect(&url, ACQUIRE).await.unwrap());
        Db {
            url,
            store,
            _dir: Some(dir),
        }
    }

    pub(super) async fn postgres() -> Option<Db> {
        let url = signet_testutil::fresh_postgres_database().await?;
        let store = Arc::new(PgStore::connect(&url, ACQUIRE).await.unwrap());
        Some(Db {
            url,
            store,
            _dir: None,
        })
    }

    /// Another store instance on the same database (connecting runs migrations again).
    pub(super) async fn another(&self) -> Arc<dyn Store> {
        connect(&self.url, ACQUIRE).await.unwrap()
    }
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Db::sqlite().await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if let Some(db) = super::Db::postgres().await {
                        super::$case(db).await;
                    }
                }
            )*
        }
    };
}

conformance!(
    migrations_are_idempotent,
    ca_key_insert_race_has_one_winner,
    appended_batches_form_a_verifiable_chain,
    list_pages_and_filters_by_spiffe_id,
    certificate_by_serial_and_count,
    a_duplicate_serial_fails_the_whole_batch,
    audit_events_round_trip_with_paging,
    concurrent_appends_from_two_instances_keep_one_chain,
    join_tokens_are_single_use_and_expire,
    racing_consumers_of_one_token_have_one_winner,
    nodes_are_upserted_renewed_and_banned,
    entries_round_trip_and_revisions_track_changes,
);

pub(super) fn cert(i: usize) -> NewCertificate {
    NewCertificate {
        serial: format!("{:032x}", i as u128 * 0x9e37_79b9_7f4a_7c15),
        spiffe_id: format!("spiffe://example.org/ns/n{}/sa/s", i % 3),
        dns_names: vec![format!("s.n{}.svc", i % 3), format!("w{i}.example")],
        ip_addresses: if i.is_multiple_of(2) {
            vec!["10.0.0.1".into(), "::1".into()]
        } else {
            vec![]
        },
        not_before: 1_700_000_000 + i as i64,
        not_after: 1_700_003_600 + i as i64,
        cert_sha256: sha256(&i.to_be_bytes()),
        ca_key_id: "root-1".into(),
        caller: format!("jwt:spiffe://example.org/ns/n{}/sa/s", i % 3),
        issued_at: 1_700_000_000 + i as i64,
        request_id: format!("req-{i}"),
        cert_der: vec![(i % 251) as u8; 700],
        // Rows without provenance (written before it was recorded) and with it share a chain.
        provenance: if i.is_multiple_of(5) {
            String::new()
        } else {
            format!(
                r#"{{"source":{{"kind":"entry","entry_id":"e{i}","node_id":"n1"}},"authorized_at":{i}}}"#
            )
        },
    }
}

fn certs(range: std::ops::Range<usize>) -> Vec<NewCertificate> {
    range.map(cert).collect()
}

/// Reads the whole ledger in pages and verifies it against the head; returns the row count.
async fn verify_chain(store: &dyn Store) -> u64 {
    let mut v = Verifier::default();
    let mut after = 0;
    loop {
        let page = store.list_certificates(after, 37, None).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.entry.seq;
        for r in &page {
            v.push(&r.entry, &r.prev_hash, &r.hash).unwrap();
        }
    }
    let head = store.ledger_head().await.unwrap();
    v.finish(head.seq, &head.hash).unwrap()
}

async fn migrations_are_idempotent(db: Db) {
    let head = db.store.ledger_head().await.unwrap();
    assert_eq!((head.seq, head.hash), (0, GENESIS));
    db.store.append_certificates(&certs(0..3)).await.unwrap();
    // Connecting again re-runs the migrator: nothing is reapplied, nothing is lost.
    let again = db.another().await;
    let third = db.another().await;
    again.ping().await.unwrap();
    third.ping().await.unwrap();
    assert_eq!(again.count_certificates().await.unwrap(), 3);
    assert_eq!(again.ledger_head().await.unwrap().seq, 3);
    assert_eq!(verify_chain(&*third).await, 3);
}

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

#[tokio::test]
async fn postgres_unreachable_is_unavailable_quickly() {
    // Port 1 on loopback: nothing listens, the connection is refused.
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        PgStore::connect(
            "postgres://signet@127.0.0.1:1/postgres",
            Duration::from_secs(2),
        ),
    )
    .await
    .expect("connect must give up by itself");
    let err = result.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    // Generous bound: only catches "minutes, not seconds".
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn connect_dispatches_on_the_scheme() {
    let dir = tempfile::tempdir().unwrap();
    let store = connect(&signet_testutil::sqlite_url(dir.path()), ACQUIRE)
        .await
        .unwrap();
    store.ping().await.unwrap();
    let err = connect("mysql://root:hunter2@db/x", ACQUIRE)
        .await
        .err()
        .unwrap();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

/// Prints `append_certificates` throughput on PostgreSQL for batches of 64 and 512, single
/// writer, 700-byte certificates. Run with:
/// `cargo test -p signet-server --lib store::conformance::postgres_append_throughput -- --ignored --nocapture`
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

/// Replicas starting together on a database nobody has migrated yet all come up.
async fn concurrent_first_connects(url: String) {
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { connect(&url, ACQUIRE).await })
        })
        .collect();
    for t in tasks {
        let store = t.await.unwrap().unwrap();
        assert_eq!(store.ledger_head().await.unwrap().seq, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_concurrent_first_connects() {
    let dir = tempfile::tempdir().unwrap();
    concurrent_first_connects(signet_testutil::sqlite_url(dir.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_first_connects() {
    if let Some(url) = signet_testutil::fresh_postgres_database().await {
        concurrent_first_connects(url).await;
    }
}

#[tokio::test]
async fn sqlite_in_memory_works() {
    let store = connect("sqlite::memory:", ACQUIRE).await.unwrap();
    let (a, b) = (store.clone(), store.clone());
    let t1 = tokio::spawn(async move { a.append_certificates(&certs(0..10)).await });
    let t2 = tokio::spawn(async move { b.append_certificates(&certs(10..20)).await });
    t1.await.unwrap().unwrap();
    t2.await.unwrap().unwrap();
    assert_eq!(verify_chain(&*store).await, 20);
}

/// A database that goes away under a running store answers Unavailable within the acquire
/// timeout. Starts (and stops) its own cluster with `scripts/pg`, so it needs the PostgreSQL
/// server binaries: `cargo test -p signet-server --lib store::conformance::postgres_that_stops -- --ignored`
#[tokio::test]
#[ignore = "starts its own PostgreSQL cluster with scripts/pg"]
async fn postgres_that_stops_is_unavailable_within_the_acquire_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg");
    let out = std::process::Command::new(script)
        .args([std::ffi::OsStr::new("start"), dir.path().as_os_str()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let store = PgStore::connect(&url, Duration::from_secs(2))
        .await
        .unwrap();
    store.append_certificates(&certs(0..2)).await.unwrap();
    let stopped = std::process::Command::new(script)
        .args([std::ffi::OsStr::new("stop"), dir.path().as_os_str()])
        .status()
        .unwrap();
    assert!(stopped.success());
    for _ in 0..2 {
        let started = Instant::now();
        let err = store.append_certificates(&certs(2..4)).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        let err = store.ping().await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
    }
}

// ---- nodes, join tokens, entries ----------------------------------------------------------

async fn join_tokens_are_single_use_and_expire(db: Db) {
    use super::TokenUse;
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
    use super::TokenUse;
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
    use super::NodeRow;
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
        attestation: super::nodes::ATTESTATION_JOIN_TOKEN.into(),
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
        attestation: super::nodes::ATTESTATION_K8S_PSAT.into(),
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
    use super::NewEntry;
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
    };
    // Nothing yet: revision 0, unchanged for a caller that knows 0.
    let sync = s.entries_for_parent_since(p1, 0).await.unwrap();
    assert_eq!((sync.revision, sync.unchanged), (0, true));

    let a = s.create_entry(&entry("a", p1)).await.unwrap();
    let b = s.create_entry(&entry("b", p2)).await.unwrap();
    let c = s.create_entry(&entry("c", p1)).await.unwrap();
    assert!(a.revision < b.revision && b.revision < c.revision);
    assert_eq!(s.entry("a").await.unwrap(), Some(a.clone()));
    assert_eq!(s.entry("zz").await.unwrap(), None);
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
    s.create_entry(&entry("d", p2)).await.unwrap();
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
