//! The manager against real stores (SQLite, and PostgreSQL when `SIGNET_TEST_DATABASE_URL` is
//! set), on an injected clock without jitter.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::ca::RandomSerials;
use crate::ca::rotator::NoJitter;
use crate::ca::testutil::{self, grant, now, openssl_verify, p256_csr};
use crate::store::{NewCertificate, PgStore, SqliteStore, StoredCaKey};

const ACQUIRE: Duration = Duration::from_secs(10);
const INT_TTL: Duration = Duration::from_secs(600);
const ROOT_TTL: Duration = Duration::from_secs(6000);

fn cfg() -> ManagerConfig {
    ManagerConfig {
        trust_domain: testutil::td(),
        key_type: KeyType::EcdsaP256,
        root_ttl: ROOT_TTL,
        intermediate_ttl: INT_TTL,
        jwt_key_type: crate::ca::jwt_config::JwtKeyType::Es256,
        // Far beyond the CA tests' horizon: the JWT key rotates in its own tests.
        jwt_key_ttl: ROOT_TTL * 10,
        policy: rotator::Policy {
            jitter: 0.0,
            root_propagation: Duration::from_secs(300),
            ..rotator::Policy::default()
        },
    }
}

fn kek_copy(k: &Kek) -> Kek {
    Kek::from_base64(&k.to_base64()).unwrap()
}

async fn sqlite() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = signet_testutil::sqlite_url(dir.path());
    (
        Arc::new(SqliteStore::connect(&url, ACQUIRE).await.unwrap()),
        dir,
    )
}

async fn manager(store: Arc<dyn Store>, kek: Kek, at: SystemTime) -> Arc<CaManager> {
    CaManager::generated(
        store,
        kek,
        cfg(),
        Arc::new(RandomSerials::default()),
        Arc::new(NoJitter),
        at,
    )
    .await
    .unwrap()
}

fn after(d: Duration) -> SystemTime {
    now() + d
}

/// Records a leaf the active key issued, as the ledger would.
async fn record_leaf(store: &dyn Store, m: &CaManager, serial: u32, at: SystemTime) -> Vec<u8> {
    let (_, csr) = p256_csr();
    let issued = m
        .view()
        .active
        .issue(
            &csr,
            &grant("/ns/a/sa/b", Duration::from_secs(300)),
            at,
            &RandomSerials::default(),
        )
        .unwrap();
    store
        .append_certificates(&[NewCertificate {
            serial: format!("{serial:032x}"),
            spiffe_id: issued.spiffe_id.to_string(),
            dns_names: vec![],
            ip_addresses: vec![],
            not_before: unix(issued.not_before),
            not_after: unix(issued.not_after),
            cert_sha256: issued.sha256,
            ca_key_id: issued.ca_key_id.clone(),
            caller: "test".into(),
            issued_at: unix(at),
            request_id: format!("r{serial}"),
            cert_der: issued.der.clone(),
            provenance: String::new(),
        }])
        .await
        .unwrap();
    issued.der
}

fn count(slots: &[SlotInfo], kind: Kind, state: State) -> usize {
    slots
        .iter()
        .filter(|s| s.slot.kind == kind && s.slot.state == state)
        .count()
}

#[tokio::test]
async fn first_start_makes_a_root_that_signs_only_an_intermediate_and_chains_verify_strictly() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let v = m.view();
    assert_eq!(count(&v.slots, Kind::Root, State::Active), 1);
    assert_eq!(count(&v.slots, Kind::Intermediate, State::Active), 1);
    assert_eq!(v.roots.len(), 1);
    assert_eq!(v.roots[0], v.active_root);
    // The intermediate: pathlen 0, under the root, never outliving it.
    let int = validate::parse_cert(v.active.cert_der()).unwrap();
    let bc = int.basic_constraints().unwrap().unwrap().value;
    assert!(bc.ca);
    assert_eq!(bc.path_len_constraint, Some(0));
    assert!(v.active.not_after() <= now() + INT_TTL);
    assert_ne!(v.active.cert_der(), v.active_root.as_slice());
    // A leaf: leaf, intermediate, root; verifies with -x509_strict against the bundle.
    let (_, csr) = p256_csr();
    let issued = v
        .active
        .issue(
            &csr,
            &grant("/ns/a/sa/b", Duration::from_secs(300)),
            now(),
            &RandomSerials::default(),
        )
        .unwrap();
    assert_eq!(issued.chain.len(), 3);
    assert_eq!(issued.chain[1], v.active.cert_der());
    assert_eq!(issued.chain[2], v.active_root);
    let dir = tempfile::tempdir().unwrap();
    openssl_verify(dir.path(), &v.roots, &issued.chain[1..2], &issued.der).unwrap();
    // Without the intermediate it does not verify: the root signs no leaves.
    assert!(openssl_verify(dir.path(), &v.roots, &[], &issued.der).is_err());
    // Each creation and activation is an audit event.
    let kinds: Vec<String> = store
        .audit_events(0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    // Root, intermediate, then the first JWT-SVID signing key.
    assert_eq!(
        kinds,
        [
            "ca.prepared",
            "ca.activated",
            "ca.prepared",
            "ca.activated",
            "ca.prepared",
            "ca.activated"
        ]
    );
    // A restart loads the same keys.
    let again = manager(store, kek_copy(&m.kek), now()).await;
    assert_eq!(again.view().active.key_id(), v.active.key_id());
}

#[tokio::test]
async fn an_intermediate_has_no_life_beyond_its_root() {
    let (store, _dir) = sqlite().await;
    let m = manager(store, Kek::generate(), now()).await;
    let v = m.view();
    let root = v.slots.iter().find(|s| s.slot.kind == Kind::Root).unwrap();
    let root_auth = m.keys.lock().unwrap().get(root).unwrap();
    let late = root.slot.not_after - Duration::from_secs(60);
    let (int, _) = root_auth
        .sign_intermediate(
            &testutil::td(),
            KeyType::EcdsaP256,
            late,
            INT_TTL,
            &RandomSerials::default(),
        )
        .unwrap();
    assert_eq!(int.not_after(), root.slot.not_after);
    assert!(
        root_auth
            .sign_intermediate(
                &testutil::td(),
                KeyType::EcdsaP256,
                root.slot.not_after,
                INT_TTL,
                &RandomSerials::default()
            )
            .is_err()
    );
}

#[tokio::test]
async fn the_intermediate_rotates_on_ticks_and_the_old_one_goes_when_its_leaves_expire() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let first = m.view().active.key_id().to_owned();
    let seen = Arc::new(Mutex::new(Vec::new()));
    {
        let seen = seen.clone();
        m.on_change(move |v| seen.lock().unwrap().push(v.active.key_id().to_owned()));
    }
    let leaf_at = after(Duration::from_secs(250));
    record_leaf(store.as_ref(), &m, 1, leaf_at).await;
    // Before 1/2: nothing.
    assert!(
        m.tick(after(Duration::from_secs(290)))
            .await
            .unwrap()
            .is_empty()
    );
    // At 1/2: a prepared intermediate, still signing with the first.
    let t = m.tick(after(Duration::from_secs(300))).await.unwrap();
    assert!(
        matches!(t[..], [Transition::PrepareIntermediate { .. }]),
        "{t:?}"
    );
    assert_eq!(m.view().active.key_id(), first);
    // At 5/6: the new one signs; the old one is retired, kept while its leaf lives.
    let t = m.tick(after(Duration::from_secs(500))).await.unwrap();
    assert!(matches!(t[..], [Transition::Activate { .. }]), "{t:?}");
    let second = m.view().active.key_id().to_owned();
    assert_ne!(second, first);
    assert_eq!(
        seen.lock().unwrap().last(),
        Some(&second),
        "listeners hear of it"
    );
    let old = |v: &CaView| {
        v.slots
            .iter()
            .find(|s| s.slot.id == first)
            .unwrap()
            .slot
            .state
    };
    assert_eq!(old(&m.view()), State::Retired);
    assert!(
        m.tick(after(Duration::from_secs(520)))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        m.view()
            .client_anchors
            .iter()
            .any(|a| rotator_id(a) == first)
    );
    // The leaf (250 + 300 s) expires at 550 s: removed at the next tick after that.
    let t = m.tick(after(Duration::from_secs(560))).await.unwrap();
    assert_eq!(
        t,
        [Transition::Remove {
            id: first.clone(),
            reason: Reason::Unused
        }]
    );
    assert_eq!(old(&m.view()), State::Removed);
    assert!(
        !m.view()
            .client_anchors
            .iter()
            .any(|a| rotator_id(a) == first)
    );
}

fn rotator_id(der: &[u8]) -> String {
    super::super::authority::key_id_of_der(der).unwrap()
}

#[tokio::test]
async fn a_root_rotation_keeps_both_roots_in_the_bundle_during_the_overlap() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let old_root = m.view().active_root.clone();
    // Tick through a root life in intermediate-sized steps.
    let mut saw_two = false;
    let mut t = 0;
    while t < 6000 {
        t += 60;
        m.tick(after(Duration::from_secs(t))).await.unwrap();
        let v = m.view();
        saw_two |= v.roots.len() == 2;
        assert!(v.roots.contains(&v.active_root), "at {t}");
        // Whatever signs chains to a root in the bundle.
        let parent = v
            .slots
            .iter()
            .find(|s| s.slot.id == v.active.key_id())
            .unwrap()
            .slot
            .parent
            .clone()
            .unwrap();
        assert!(v.roots.iter().any(|r| rotator_id(r) == parent), "at {t}");
    }
    assert!(saw_two, "the new root was published before it signed");
    let v = m.view();
    assert_ne!(v.active_root, old_root);
    assert!(
        !v.roots.contains(&old_root),
        "the old root goes once nothing chains to it"
    );
}

/// An existing database: one root (slot `root`) that signed leaves directly.
#[tokio::test]
async fn a_database_whose_root_signed_leaves_directly_upgrades_and_keeps_trusting_them() {
    let (store, _dir) = sqlite().await;
    let kek = Kek::generate();
    let (root, pkcs8) = testutil::root(KeyType::EcdsaP256, ROOT_TTL);
    store
        .insert_ca_key_if_absent(&StoredCaKey {
            id: root.key_id().into(),
            slot: "root".into(),
            algorithm: "EcdsaP256".into(),
            cert_pem: signet_types::pem::cert_to_pem(root.cert_der()),
            encrypted_key: kek.seal(&pkcs8, root.key_id().as_bytes()),
            created_at: unix(now()),
        })
        .await
        .unwrap();
    // A leaf the root signed directly, before the upgrade.
    let (_, csr) = p256_csr();
    let old_leaf = root
        .issue(
            &csr,
            &grant("/ns/a/sa/b", Duration::from_secs(3000)),
            now(),
            &RandomSerials::default(),
        )
        .unwrap();
    store
        .append_certificates(&[NewCertificate {
            serial: old_leaf.serial.clone(),
            spiffe_id: old_leaf.spiffe_id.to_string(),
            dns_names: vec![],
            ip_addresses: vec![],
            not_before: unix(old_leaf.not_before),
            not_after: unix(old_leaf.not_after),
            cert_sha256: old_leaf.sha256,
            ca_key_id: old_leaf.ca_key_id.clone(),
            caller: "test".into(),
            issued_at: unix(now()),
            request_id: "old".into(),
            cert_der: old_leaf.der.clone(),
            provenance: String::new(),
        }])
        .await
        .unwrap();
    let at = after(Duration::from_secs(10));
    let m = manager(store.clone(), kek, at).await;
    let v = m.view();
    // The old root is the active root and signs the new intermediate; the bundle is unchanged.
    assert_eq!(v.roots, [root.cert_der().to_vec()]);
    assert_eq!(v.active_root, root.cert_der());
    let int = v
        .slots
        .iter()
        .find(|s| s.slot.id == v.active.key_id())
        .unwrap();
    assert_eq!(int.slot.kind, Kind::Intermediate);
    assert_eq!(int.slot.parent.as_deref(), Some(root.key_id()));
    // Old leaves still authenticate (the root is a client anchor) and verify.
    assert!(v.client_anchors.contains(&root.cert_der().to_vec()));
    let dir = tempfile::tempdir().unwrap();
    openssl_verify(dir.path(), &v.roots, &[], &old_leaf.der).unwrap();
    // ca status counts the leaf under the root.
    let st = m.status(at).await.unwrap();
    let r = st.iter().find(|s| s.info.slot.id == root.key_id()).unwrap();
    assert_eq!(
        (r.unexpired, r.last_expiry),
        (1, Some(unix(old_leaf.not_after)))
    );
}

/// Two managers (two replicas) on one PostgreSQL tick at the same moment past the prepare
/// threshold: one prepared intermediate, one audit event; both end with the same view.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_managers_racing_on_one_postgresql_prepare_once() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let kek = Kek::generate();
    let s1: Arc<dyn Store> = Arc::new(PgStore::connect(&url, ACQUIRE).await.unwrap());
    let s2: Arc<dyn Store> = Arc::new(PgStore::connect(&url, ACQUIRE).await.unwrap());
    // Both start together on an empty database: one root, one intermediate.
    let (a, b) = tokio::join!(
        manager(s1.clone(), kek_copy(&kek), now()),
        manager(s2.clone(), kek_copy(&kek), now())
    );
    assert_eq!(a.view().active.key_id(), b.view().active.key_id());
    let (_, rows) = s1.ca_slots().await.unwrap();
    let ca_rows = rows.iter().filter(|r| r.kind != "jwt").count();
    assert_eq!(ca_rows, 2, "one root and one intermediate: {rows:?}");
    assert_eq!(rows.len(), 3, "and one JWT key: {rows:?}");
    for round in 0..5u64 {
        // Every round moves past the next threshold (prepare, activate, ...).
        let at = after(Duration::from_secs(300 + round * 200));
        let before = s1.audit_events(0, 1000).await.unwrap().len();
        let (ta, tb) = tokio::join!(a.tick(at), b.tick(at));
        let (ta, tb) = (ta.unwrap(), tb.unwrap());
        let events = s1.audit_events(0, 1000).await.unwrap();
        let (_, rows) = s1.ca_slots().await.unwrap();
        let prepared = rows
            .iter()
            .filter(|r| r.kind == "intermediate" && r.state == "prepared")
            .count();
        assert!(prepared <= 1, "round {round}: {rows:?}");
        // Whatever was due happened once: the transitions applied by either replica add up to
        // the new audit events (an activation also retires: two events).
        let new: Vec<&str> = events[before..].iter().map(|e| e.kind.as_str()).collect();
        let expected: usize = ta
            .iter()
            .chain(&tb)
            .map(|t| match t {
                Transition::Activate { .. } => 2,
                _ => 1,
            })
            .sum();
        assert_eq!(
            new.len(),
            expected,
            "round {round}: {new:?} vs {ta:?} + {tb:?}"
        );
        assert!(
            !ta.iter().any(|t| tb.contains(t)),
            "round {round}: both applied {ta:?} / {tb:?}"
        );
        assert!(new.iter().filter(|k| **k == "ca.prepared").count() <= 1);
        a.tick(at).await.unwrap();
        b.tick(at).await.unwrap();
        assert_eq!(a.view().active.key_id(), b.view().active.key_id());
        assert_eq!(a.view().roots, b.view().roots);
    }
    let (_, rows) = s1.ca_slots().await.unwrap();
    let ints = rows.iter().filter(|r| r.kind == "intermediate").count();
    // Rotations at 300 (prepare), 500 (activate), 700 (prepare), 900? (activate) ...
    assert!((3..=4).contains(&ints), "{rows:?}");
}

#[tokio::test]
async fn operator_actions_are_checked_against_the_slots() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let at = after(Duration::from_secs(10));
    let first = m.view().active.key_id().to_owned();
    let root_id = rotator_id(&m.view().active_root);
    // Activating the active key, or an unknown one, is refused.
    assert!(matches!(
        m.activate(&first, false, "op", at).await,
        Err(ManagerError::FailedPrecondition(_))
    ));
    assert!(matches!(
        m.activate("nope", false, "op", at).await,
        Err(ManagerError::NotFound(_))
    ));
    // Revoking the active key is refused.
    assert!(matches!(
        m.revoke(&first, false, "op", at).await,
        Err(ManagerError::FailedPrecondition(_))
    ));
    // Prepare, then prepare again: refused.
    let p = m.prepare(Kind::Intermediate, "op", at).await.unwrap();
    assert_ne!(p.key_id, first);
    assert!(matches!(
        m.prepare(Kind::Intermediate, "op", at).await,
        Err(ManagerError::FailedPrecondition(_))
    ));
    record_leaf(store.as_ref(), &m, 7, at).await;
    m.activate(&p.key_id, false, "op", at).await.unwrap();
    assert_eq!(m.view().active.key_id(), p.key_id);
    // The retired first intermediate still has a live leaf: revoke refused, names the holder.
    let Err(ManagerError::FailedPrecondition(msg)) = m.revoke(&first, false, "op", at).await else {
        panic!("revoke with live leaves must be refused");
    };
    assert!(
        msg.contains("1 unexpired") && msg.contains("spiffe://example.org/ns/a/sa/b"),
        "{msg}"
    );
    assert_eq!(
        m.view()
            .slots
            .iter()
            .find(|s| s.slot.id == first)
            .unwrap()
            .slot
            .state,
        State::Retired,
        "a refusal changes nothing"
    );
    // Taint: in the bundle's tainted IDs; tainting the active key warns.
    let o = m.taint(&first, "op", at).await.unwrap();
    assert!(o.warnings.is_empty(), "{o:?}");
    assert!(m.view().tainted.contains(&first));
    assert!(matches!(
        m.taint(&first, "op", at).await,
        Err(ManagerError::FailedPrecondition(_))
    ));
    let o = m.taint(&p.key_id, "op", at).await.unwrap();
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("signetctl ca prepare")),
        "{o:?}"
    );
    assert!(m.view().active_is_tainted());
    // --force removes it despite the leaf.
    let o = m.revoke(&first, true, "op", at).await.unwrap();
    assert!(o.warnings.iter().any(|w| w.contains("forced")), "{o:?}");
    assert!(
        !m.view()
            .client_anchors
            .iter()
            .any(|a| rotator_id(a) == first)
    );
    assert!(
        m.view().tainted.contains(&first),
        "a removed key stays tainted until it expires: holders still replace what it signed"
    );
    // Tainting the root taints its intermediates.
    m.taint(&root_id, "op", at).await.unwrap();
    assert!(m.view().tainted.contains(&root_id));
    // Every action is an audit event with the operator as caller.
    let ops: Vec<String> = store
        .audit_events(0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.caller == "op")
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        ops,
        [
            "ca.prepared",
            "ca.activated",
            "ca.retired",
            "ca.tainted",
            "ca.tainted",
            "ca.revoked",
            "ca.tainted"
        ]
    );
}

#[test]
fn removal_waits_for_other_replicas_to_see_a_retirement() {
    let mut ca = crate::ca::config::CaConfig::default();
    let grace = |ca: &crate::ca::config::CaConfig| {
        ManagerConfig::from_config(testutil::td(), ca, &Default::default())
            .policy
            .removal_grace
    };
    ca.rotation_interval = Duration::from_secs(1);
    assert_eq!(grace(&ca), rotator::REMOVAL_GRACE);
    ca.rotation_interval = Duration::from_secs(30);
    assert_eq!(grace(&ca), Duration::from_secs(90));
}

#[tokio::test]
async fn a_restart_after_the_intermediate_expired_replaces_it_before_signing() {
    let (store, _dir) = sqlite().await;
    let kek = Kek::generate();
    let m = manager(store.clone(), kek_copy(&kek), now()).await;
    let first = m.view().active.key_id().to_owned();
    drop(m);
    // Down for longer than the intermediate lives.
    let later = after(INT_TTL * 2);
    let m = manager(store, kek, later).await;
    let v = m.view();
    assert_ne!(v.active.key_id(), first);
    assert!(v.active.not_before() <= later && later < v.active.not_after());
}

#[test]
fn the_kek_is_generated_once_0600_and_a_configured_one_is_never_replaced() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = crate::ca::config::CaConfig::default();
    let first = super::loading::load_kek(&ca, dir.path()).expect("generated");
    let path = dir.path().join("kek");
    let mode = std::fs::metadata(&path)
        .expect("kek file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let again = super::loading::load_kek(&ca, dir.path()).expect("read back");
    assert_eq!(first.to_base64(), again.to_base64());

    let configured = crate::ca::config::CaConfig {
        kek_file: Some(dir.path().join("missing")),
        ..Default::default()
    };
    let e =
        super::loading::load_kek(&configured, dir.path()).expect_err("a configured KEK must exist");
    assert!(
        e.to_string().starts_with("reading key-encryption key"),
        "{e}"
    );
    assert!(!dir.path().join("missing").exists());

    std::fs::write(&path, "not base64!").expect("write");
    let e = super::loading::load_kek(&ca, dir.path()).expect_err("a broken KEK is refused");
    assert!(e.to_string().starts_with("key-encryption key"), "{e}");
}

// ---- vetting: the database alone adds no trust (issue 24, finding 1) ----------------------

/// A new self-signed root and its PKCS#8 key, stored nowhere.
fn fresh_root() -> (Authority, Vec<u8>) {
    Authority::generate_root(
        &testutil::td(),
        KeyType::EcdsaP256,
        now(),
        ROOT_TTL,
        &RandomSerials::default(),
    )
    .unwrap()
}

/// A stored root row of `authority` (prepared), its key sealed under `kek` with `aad`.
fn root_row(authority: &Authority, pkcs8: &[u8], kek: &Kek, aad: &[u8]) -> CaSlotRow {
    let id = authority.key_id().to_owned();
    CaSlotRow {
        encrypted_key: kek.seal(pkcs8, aad),
        slot: id.clone(),
        id,
        kind: "root".into(),
        state: "prepared".into(),
        parent_id: None,
        algorithm: "EcdsaP256".into(),
        cert_pem: signet_types::pem::cert_to_pem(authority.cert_der()),
        created_at: unix(now()),
        activated_at: None,
        retired_at: None,
        removed_at: None,
        tainted_at: None,
    }
}

async fn insert_row(store: &dyn Store, row: CaSlotRow) {
    let (g, _) = store.ca_slots().await.unwrap();
    let change = CaChange {
        inserts: vec![row],
        ..CaChange::default()
    };
    assert!(store.apply_ca_change(g, &change).await.unwrap());
}

async fn audit_kinds(store: &dyn Store) -> Vec<String> {
    store
        .audit_events(0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

#[tokio::test]
async fn a_root_inserted_by_a_database_writer_is_trusted_nowhere_and_reported_once() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    // The attacker's own root, "sealed" under a key-encryption key of their own (they do not
    // have ours), inserted as a prepared root; the generation moves with it.
    let (evil, pkcs8) = fresh_root();
    let id = evil.key_id().to_owned();
    let theirs = Kek::generate();
    let aad = vetting::slot_aad(&id, Kind::Root, None, evil.cert_der());
    insert_row(store.as_ref(), root_row(&evil, &pkcs8, &theirs, &aad)).await;
    m.tick(after(Duration::from_secs(1))).await.unwrap();
    m.tick(after(Duration::from_secs(2))).await.unwrap();
    let v = m.view();
    let evil_der = evil.cert_der().to_vec();
    assert!(!v.roots.contains(&evil_der), "published in the bundle");
    assert!(!v.client_anchors.contains(&evil_der), "an mTLS anchor");
    assert!(!v.slots.iter().any(|s| s.slot.id == id));
    assert_eq!(v.rejected.len(), 1, "{:?}", v.rejected);
    assert!(
        v.rejected[0].reason.contains("does not open"),
        "{:?}",
        v.rejected
    );
    let why = v.readiness().unwrap_err().to_string();
    assert!(
        why.contains(&id) && why.contains("signetctl ca revoke"),
        "{why}"
    );
    // Audited once, however often it is read.
    let kinds = audit_kinds(store.as_ref()).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "ca.slot_rejected").count(),
        1,
        "{kinds:?}"
    );
    // A restart does not trust it either, and still starts (our keys open).
    let again = manager(store.clone(), kek_copy(&m.kek), now()).await;
    assert!(!again.view().roots.contains(&evil_der));
    // The operator removes it; readiness is green again.
    m.revoke(&id, false, "op", after(Duration::from_secs(3)))
        .await
        .unwrap();
    assert!(m.view().readiness().is_ok(), "{:?}", m.view().rejected);
    let st = m.status(now()).await.unwrap();
    let shown = st.iter().find(|s| s.info.slot.id == id).unwrap();
    assert_eq!(shown.info.slot.state, State::Removed);
    assert!(!m.view().roots.contains(&evil_der));
}

#[tokio::test]
async fn a_stored_row_whose_certificate_was_swapped_does_not_open() {
    // The database writer keeps a real sealed key but swaps in their own certificate (same ID
    // claimed): the binding to the certificate fails it.
    let (store, _dir) = sqlite().await;
    let kek = Kek::generate();
    let m = manager(store.clone(), kek_copy(&kek), now()).await;
    let (evil, pkcs8) = fresh_root();
    // Sealed under OUR key (as if by a replica), then its certificate replaced by another.
    let aad = vetting::slot_aad(evil.key_id(), Kind::Root, None, evil.cert_der());
    let mut row = root_row(&evil, &pkcs8, &kek, &aad);
    let (other, _) = fresh_root();
    row.cert_pem = signet_types::pem::cert_to_pem(other.cert_der());
    insert_row(store.as_ref(), row).await;
    m.tick(after(Duration::from_secs(1))).await.unwrap();
    let v = m.view();
    assert!(!v.roots.contains(&other.cert_der().to_vec()));
    assert!(!v.roots.contains(&evil.cert_der().to_vec()));
    assert_eq!(v.rejected.len(), 1, "{:?}", v.rejected);
}

#[tokio::test]
async fn a_key_sealed_before_the_binding_is_checked_and_sealed_again() {
    let (store, _dir) = sqlite().await;
    let kek = Kek::generate();
    let m = manager(store.clone(), kek_copy(&kek), now()).await;
    let (old, pkcs8) = fresh_root();
    let id = old.key_id().to_owned();
    // The earlier sealing: the ID alone as associated data.
    insert_row(store.as_ref(), root_row(&old, &pkcs8, &kek, id.as_bytes())).await;
    m.tick(after(Duration::from_secs(1))).await.unwrap();
    let v = m.view();
    assert!(
        v.roots.contains(&old.cert_der().to_vec()),
        "a legacy key stays trusted"
    );
    assert!(v.rejected.is_empty(), "{:?}", v.rejected);
    assert!(
        audit_kinds(store.as_ref())
            .await
            .contains(&"ca.resealed".to_owned())
    );
    let (_, rows) = store.ca_slots().await.unwrap();
    let row = rows.iter().find(|r| r.id == id).unwrap();
    let aad = vetting::slot_aad(&id, Kind::Root, None, old.cert_der());
    assert!(
        kek.open(&row.encrypted_key, &aad).is_ok(),
        "now bound to its row"
    );
    assert!(kek.open(&row.encrypted_key, id.as_bytes()).is_err());
}

#[tokio::test]
async fn a_root_younger_than_its_propagation_window_is_activated_only_with_force() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let p = m.prepare(Kind::Root, "op", now()).await.unwrap();
    let old_root = rotator_id(&m.view().active_root);
    // 100 s of the 300 s window: refused, naming the time left and --force; nothing changes.
    let at = after(Duration::from_secs(100));
    let Err(ManagerError::FailedPrecondition(msg)) = m.activate(&p.key_id, false, "op", at).await
    else {
        panic!("a young root must need --force");
    };
    assert!(
        msg.contains("less than ca.root_propagation")
            && msg.contains("in 3m 20s")
            && msg.contains("--force"),
        "{msg}"
    );
    assert_eq!(rotator_id(&m.view().active_root), old_root);
    // With force: activated, with the warning.
    let o = m.activate(&p.key_id, true, "op", at).await.unwrap();
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("activated with --force")),
        "{:?}",
        o.warnings
    );
    assert_eq!(rotator_id(&m.view().active_root), p.key_id);
    // After the window, no force is needed.
    let (store, _dir) = sqlite().await;
    let m = manager(store, Kek::generate(), now()).await;
    let p = m.prepare(Kind::Root, "op", now()).await.unwrap();
    let o = m
        .activate(&p.key_id, false, "op", after(Duration::from_secs(300)))
        .await
        .unwrap();
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
}

#[tokio::test]
async fn a_removed_root_put_back_by_the_database_does_not_come_back() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let p = m.prepare(Kind::Root, "op", now()).await.unwrap();
    m.revoke(&p.key_id, false, "op", now()).await.unwrap();
    let der = m
        .view()
        .slots
        .iter()
        .find(|s| s.slot.id == p.key_id)
        .unwrap()
        .cert_der
        .clone();
    assert!(!m.view().roots.contains(&der));
    // Someone with database access resurrects it.
    sql(
        &_dir,
        &[
            &format!(
                "UPDATE ca_keys SET state = 'prepared', removed_at = NULL WHERE id = '{}'",
                p.key_id
            ),
            "UPDATE ca_generation SET gen = gen + 1",
        ],
    )
    .await;
    m.tick(after(Duration::from_secs(1))).await.unwrap();
    assert!(!m.view().roots.contains(&der), "removal erased its key");
    assert!(m.view().readiness().is_err());
}

#[tokio::test]
async fn the_wrong_key_encryption_key_refuses_to_start_rather_than_make_a_new_root() {
    let (store, _dir) = sqlite().await;
    let _m = manager(store.clone(), Kek::generate(), now()).await;
    let Err(err) = CaManager::generated(
        store.clone(),
        Kek::generate(),
        cfg(),
        Arc::new(RandomSerials::default()),
        Arc::new(NoJitter),
        now(),
    )
    .await
    else {
        panic!("another KEK must not start");
    };
    assert!(err.to_string().contains("key-encryption key"), "{err}");
    let (_, rows) = store.ca_slots().await.unwrap();
    assert_eq!(rows.iter().filter(|r| r.kind == "root").count(), 1);
}

// ---- a stolen intermediate is cut off by its root's CRL (issue 24, finding 2) --------------

#[tokio::test]
async fn a_tainted_intermediate_is_listed_by_its_root_until_the_root_stops_publishing() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let old = m.view().active.key_id().to_owned();
    let root_id = m
        .view()
        .slots
        .iter()
        .find(|s| s.slot.id == old)
        .and_then(|s| s.slot.parent.clone())
        .unwrap();
    let p = m.prepare(Kind::Intermediate, "op", now()).await.unwrap();
    m.activate(&p.key_id, false, "op", now()).await.unwrap();
    assert!(m.view().revoked_intermediates(&root_id).is_empty());
    m.taint(&old, "op", now()).await.unwrap();
    let listed = m.view().revoked_intermediates(&root_id);
    let old_slot = m
        .view()
        .slots
        .iter()
        .find(|s| s.slot.id == old)
        .cloned()
        .unwrap();
    let serial = hex::encode(
        validate::parse_cert(&old_slot.cert_der)
            .unwrap()
            .raw_serial(),
    );
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].serial, serial);
    assert_eq!(listed[0].reason, crate::revoked::Reason::CA_COMPROMISE);
    // Removal keeps it listed (and tainted) : `ca revoke` is not a way out of the CRL.
    m.revoke(&old, true, "op", now()).await.unwrap();
    assert_eq!(m.view().revoked_intermediates(&root_id).len(), 1);
    assert!(m.view().tainted.contains(&old));
    // The root's CRL, signed with it, lists the intermediate; openssl checks a forged leaf.
    let root = m
        .view()
        .signers
        .iter()
        .find(|a| a.key_id() == root_id)
        .cloned()
        .expect("the root signs CRLs");
    let crl = crate::crl::sign_crl(
        &root,
        &listed,
        1,
        now(),
        now() + Duration::from_secs(3600),
        now() + ROOT_TTL,
    )
    .unwrap();
    assert!(
        crate::crl::lists_all(&crl, &listed),
        "kept past the notAfter"
    );
}

// ---- fresh-eyes review: database edits that used to make a new root or drop a CRL entry --

async fn sql(dir: &tempfile::TempDir, statements: &[&str]) {
    let pool = sqlx::SqlitePool::connect(&signet_testutil::sqlite_url(dir.path()))
        .await
        .unwrap();
    for s in statements {
        sqlx::query(s).execute(&pool).await.unwrap();
    }
}

#[tokio::test]
async fn a_database_that_breaks_the_active_root_gets_no_new_root_by_itself() {
    for edit in [
        // The active root's state changed to retired (no rejection at all).
        "UPDATE ca_keys SET state = 'retired' WHERE kind = 'root'",
        // Its certificate swapped for another (rejected).
        "UPDATE ca_keys SET cert_pem = (SELECT cert_pem FROM ca_keys WHERE kind = 'intermediate') WHERE kind = 'root'",
    ] {
        let (store, dir) = sqlite().await;
        let kek = Kek::generate();
        let m = manager(store.clone(), kek_copy(&kek), now()).await;
        let roots = m.view().roots.clone();
        sql(&dir, &[edit, "UPDATE ca_generation SET gen = gen + 1"]).await;
        let _ = m.tick(after(Duration::from_secs(1))).await;
        let (_, rows) = store.ca_slots().await.unwrap();
        assert_eq!(
            rows.iter().filter(|r| r.kind == "root").count(),
            1,
            "{edit}: a new root was made"
        );
        assert_eq!(m.view().roots, roots, "{edit}: the published roots changed");
        // A restart refuses rather than replace the trust.
        let Err(e) = CaManager::generated(
            store.clone(),
            kek_copy(&kek),
            cfg(),
            Arc::new(RandomSerials::default()),
            Arc::new(NoJitter),
            after(Duration::from_secs(2)),
        )
        .await
        else {
            panic!("{edit}: started with a new root");
        };
        let e = e.to_string();
        assert!(
            e.contains("refusing to generate") || e.contains("none of the"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn a_roots_crl_keeps_listing_an_intermediate_whose_taint_the_database_cleared() {
    use crate::clock::fake::FakeClock;
    let (store, dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let old = m.view().active.key_id().to_owned();
    let p = m.prepare(Kind::Intermediate, "op", now()).await.unwrap();
    m.activate(&p.key_id, false, "op", now()).await.unwrap();
    m.taint(&old, "op", now()).await.unwrap();
    m.revoke(&old, true, "op", now()).await.unwrap();
    let bundle = crate::bundle::BundleHandle::new(
        crate::bundle::Bundle {
            trust_domain: testutil::td(),
            roots: m.view().roots.clone(),
            tainted_key_ids: Vec::new(),
            jwt_keys: Vec::new(),
            revision: 1,
            crls: Vec::new(),
        },
        dir.path().join("bundle.pem"),
    )
    .unwrap();
    let publisher = |clock: Arc<FakeClock>| {
        crate::crl::CrlPublisher::new(
            store.clone(),
            m.clone(),
            bundle.clone(),
            dir.path().join("crl"),
            crate::revoked::CrlConfig::default(),
            clock,
        )
    };
    let old_serial = hex::encode(
        validate::parse_cert(
            &m.view()
                .slots
                .iter()
                .find(|s| s.slot.id == old)
                .unwrap()
                .cert_der,
        )
        .unwrap()
        .raw_serial(),
    );
    let listed = |crls: &[crate::bundle::PublishedCrl]| {
        crls.iter().any(|c| {
            x509_parser::parse_x509_crl(&c.der).is_ok_and(|(_, crl)| {
                crl.iter_revoked_certificates()
                    .any(|r| hex::encode(r.raw_serial()) == old_serial)
            })
        })
    };
    let clock = Arc::new(FakeClock::at_unix(unix(now())));
    assert!(listed(&publisher(clock.clone()).refresh().await.unwrap()));
    // The database writer clears the taint (or deletes the row) and a revocation re-signs.
    sql(
        &dir,
        &[
            &format!("DELETE FROM ca_keys WHERE id = '{old}'"),
            "UPDATE ca_generation SET gen = gen + 1",
        ],
    )
    .await;
    m.tick(after(Duration::from_secs(1))).await.unwrap();
    assert!(
        m.view()
            .revoked_intermediates(
                &m.view()
                    .slots
                    .iter()
                    .find(|s| s.slot.kind == Kind::Root)
                    .unwrap()
                    .slot
                    .id
            )
            .is_empty()
    );
    clock.advance(Duration::from_secs(13 * 3600));
    // Same process, and a restart (a new publisher reading the CRL file it wrote).
    assert!(listed(&publisher(clock.clone()).refresh().await.unwrap()));
}
