//! One test suite for every [`Store`] implementation, one module per trait: each case runs
//! against SQLite (a temporary file) and PostgreSQL (a fresh database from `signet-testutil`;
//! skipped locally without `SIGNET_TEST_DATABASE_URL`, required in CI) through
//! [`conformance!`]. This module holds the shared fixtures and what concerns connecting
//! (migrations, URL schemes, unreachable or stopping databases).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use signet_types::ledger::{GENESIS, Verifier, sha256};

use super::{LedgerStore, NewCertificate, PgStore, SqliteStore, Store, StoreError, connect};

pub(super) const ACQUIRE: Duration = Duration::from_secs(10);

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

/// `conformance!(case, …)`: each `async fn case(db: Db)` of the calling module becomes two
/// tests, `sqlite::case` and `postgres::case`.
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

mod audit;
mod ca_keys;
mod crls;
mod federation;
mod jwt_svids;
mod ledger;
mod node_admin;
mod node_sets;
mod nodes;
mod pins;
mod registration;
mod revocations;

conformance!(migrations_are_idempotent);

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
pub(super) fn certs(range: std::ops::Range<usize>) -> Vec<NewCertificate> {
    range.map(cert).collect()
}
/// Reads the whole ledger in pages and verifies it against the head; returns the row count.
pub(super) async fn verify_chain(store: &dyn Store) -> u64 {
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

#[tokio::test]
async fn postgres_unreachable_is_unavailable_quickly() {
    // Port 1 on loopback: nothing listens, the connection is refused.
    let started =
        signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock).into_std();
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
        let started =
            signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock).into_std();
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

/// The wiring hands one `Arc<dyn Store>` to components that each take the one part they use:
/// every part answers through its own narrowed handle.
#[tokio::test]
async fn one_store_serves_as_each_of_its_parts() {
    use crate::store::{
        AuditStore, CaSlotStore, CertFilter, CrlStore, NodeStore, PinStore, RevocationStore,
    };
    let store = connect("sqlite::memory:", ACQUIRE).await.unwrap();
    let ledger: Arc<dyn LedgerStore> = store.clone();
    assert_eq!(
        ledger.append_certificates(&certs(0..2)).await.unwrap(),
        [1, 2]
    );
    let audit: Arc<dyn AuditStore> = store.clone();
    assert!(audit.audit_events(0, 10).await.unwrap().is_empty());
    let slots: Arc<dyn CaSlotStore> = store.clone();
    assert!(slots.ca_slots().await.unwrap().1.is_empty());
    let crls: Arc<dyn CrlStore> = store.clone();
    assert_eq!(crls.revocation_mark().await.unwrap(), 0);
    let nodes: Arc<dyn NodeStore> = store.clone();
    assert!(nodes.list_nodes().await.unwrap().is_empty());
    let revocations: Arc<dyn RevocationStore> = store.clone();
    assert!(revocations.any_certificate(&CertFilter::Any).await.unwrap());
    let pins: Arc<dyn PinStore> = store.clone();
    assert!(pins.deployment_pins().await.unwrap().is_empty());
}
