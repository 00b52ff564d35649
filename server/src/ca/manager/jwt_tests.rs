//! The JWT-SVID signing key slots (kind `jwt`) against real stores: sealed and vetted like the
//! CA keys, rotated with the propagation window, replaced at once when tainted, never an X.509
//! anchor, and each transition once across managers sharing one database.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use signet_pki::jwt::{JwtKeySet, JwtSvidClaims, key_id_for, validate as validate_jwt};

use super::*;
use crate::ca::RandomSerials;
use crate::ca::jwt_config::JwtKeyType;
use crate::ca::rotator::NoJitter;
use crate::ca::testutil::{self, now};
use crate::store::{PgStore, SqliteStore};

const ACQUIRE: Duration = Duration::from_secs(10);
/// JWT keys live 4000 s: prepared at 2000, activated at 3333 (5/6), after 300 s of propagation.
const JWT_TTL: Duration = Duration::from_secs(4000);
const PROPAGATION: Duration = Duration::from_secs(300);
const MAX_TTL: Duration = Duration::from_secs(600);

fn cfg(key_type: JwtKeyType) -> ManagerConfig {
    ManagerConfig {
        trust_domain: testutil::td(),
        key_type: KeyType::EcdsaP256,
        root_ttl: Duration::from_secs(100_000),
        intermediate_ttl: Duration::from_secs(50_000),
        jwt_key_type: key_type,
        jwt_key_ttl: JWT_TTL,
        policy: rotator::Policy {
            jitter: 0.0,
            jwt_propagation: PROPAGATION,
            jwt_max_ttl: MAX_TTL,
            ..rotator::Policy::default()
        },
    }
}

async fn sqlite() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = signet_testutil::sqlite_url(dir.path());
    (
        Arc::new(SqliteStore::connect(&url, ACQUIRE).await.unwrap()),
        dir,
    )
}

async fn manager_with(
    store: Arc<dyn Store>,
    kek: Kek,
    key_type: JwtKeyType,
    at: SystemTime,
) -> Arc<CaManager> {
    CaManager::generated(
        store,
        kek,
        cfg(key_type),
        Arc::new(RandomSerials::default()),
        Arc::new(NoJitter),
        at,
    )
    .await
    .unwrap()
}

async fn manager(store: Arc<dyn Store>, kek: Kek, at: SystemTime) -> Arc<CaManager> {
    manager_with(store, kek, JwtKeyType::Es256, at).await
}

fn after(secs: u64) -> SystemTime {
    now() + Duration::from_secs(secs)
}

fn jwt_slots(v: &CaView, state: State) -> Vec<&SlotInfo> {
    v.slots
        .iter()
        .filter(|s| s.slot.kind == Kind::Jwt && s.slot.state == state)
        .collect()
}

fn published(v: &CaView) -> Vec<String> {
    v.jwt_keys
        .iter()
        .map(|k| k.key.key_id().to_owned())
        .collect()
}

fn active_kid(m: &CaManager) -> String {
    m.active_jwt_key().unwrap().signer.key_id().to_owned()
}

/// Mints with the active key and validates against the published keys.
fn mint_and_validate(m: &CaManager, at: SystemTime) -> String {
    let active = m.active_jwt_key().unwrap();
    let token = active
        .signer
        .mint(&JwtSvidClaims {
            subject: "spiffe://example.org/ns/a/sa/b".parse().unwrap(),
            audience: vec!["aud".into()],
            issued_at: unix(at),
            expires_at: unix(at) + 60,
            issuer: None,
        })
        .unwrap();
    let set = JwtKeySet::new(m.view().jwt_keys.iter().map(|k| k.key.clone()));
    let ok = validate_jwt(&token, "aud", &set, unix(at)).unwrap();
    ok.key_id
}

#[tokio::test]
async fn the_first_jwt_key_is_sealed_vetted_published_and_never_an_x509_anchor() {
    let (store, _dir) = sqlite().await;
    let kek = Kek::generate();
    let m = manager(
        store.clone(),
        Kek::from_base64(&kek.to_base64()).unwrap(),
        now(),
    )
    .await;
    let v = m.view();
    let active = jwt_slots(&v, State::Active);
    assert_eq!(active.len(), 1);
    let slot = active[0];
    // Its ID is the kid of its public key; its certificate only carries the key.
    let cert = validate::parse_cert(&slot.cert_der).unwrap();
    assert_eq!(slot.slot.id, key_id_for(cert.public_key().raw));
    assert_eq!(active_kid(&m), slot.slot.id);
    assert_eq!(slot.algorithm, "ES256");
    assert!(!cert.basic_constraints().unwrap().unwrap().value.ca);
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && !ku.key_cert_sign() && !ku.crl_sign());
    assert_eq!(
        cert.subject().to_string(),
        format!("O=Signet, CN=Signet JWT-SVID key {}", slot.slot.id)
    );
    assert_eq!(slot.slot.not_after, after(JWT_TTL.as_secs()));
    assert_eq!(m.active_jwt_key().unwrap().not_after, slot.slot.not_after);
    // Never an X.509 trust anchor, CRL signer or mTLS anchor.
    assert!(!v.roots.contains(&slot.cert_der));
    assert!(!v.client_anchors.contains(&slot.cert_der));
    assert!(v.signers.iter().all(|a| a.key_id() != slot.slot.id));
    assert!(v.active.roots().iter().all(|r| r != &slot.cert_der));
    // Published, and what it signs validates against what is published.
    assert_eq!(published(&v), vec![slot.slot.id.clone()]);
    assert_eq!(mint_and_validate(&m, after(1)), slot.slot.id);
    // Sealed under the KEK, bound to its row.
    let (_, rows) = store.ca_slots().await.unwrap();
    let row = rows.iter().find(|r| r.id == slot.slot.id).unwrap();
    assert_eq!(row.kind, "jwt");
    let aad = vetting::slot_aad(&row.id, Kind::Jwt, None, &slot.cert_der);
    assert!(kek.open(&row.encrypted_key, &aad).is_ok());
    assert!(kek.open(&row.encrypted_key, row.id.as_bytes()).is_err());
    assert!(Kek::generate().open(&row.encrypted_key, &aad).is_err());
    // Audited like the CA keys.
    let events = store.audit_events(0, 100).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "ca.prepared" && e.detail.starts_with(&format!("jwt {}", row.id))),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == "ca.activated" && e.detail.starts_with(&format!("jwt {}", row.id))),
        "{events:?}"
    );
    // A restart opens the same key.
    let again = manager(store, kek, now()).await;
    assert_eq!(active_kid(&again), slot.slot.id);
}

#[tokio::test]
async fn the_jwt_key_rotates_after_propagation_and_the_retired_one_goes_after_max_ttl() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let first = active_kid(&m);
    m.tick(after(1999)).await.unwrap();
    assert!(jwt_slots(&m.view(), State::Prepared).is_empty());
    // 1/2 of its life: the next is prepared and published, signing nothing yet.
    m.tick(after(2000)).await.unwrap();
    let v = m.view();
    let next = jwt_slots(&v, State::Prepared)[0].slot.id.clone();
    assert_eq!(published(&v), vec![first.clone(), next.clone()]);
    assert_eq!(active_kid(&m), first);
    // The operator may not activate it before its propagation window is over.
    let refused = m
        .activate(&next, false, "op", after(2100))
        .await
        .unwrap_err();
    let msg = refused.to_string();
    assert!(
        matches!(refused, ManagerError::FailedPrecondition(_))
            && msg.contains("jwt_svid.key_propagation")
            && msg.contains(&format!("unix {}", unix(after(2300)))),
        "{msg}"
    );
    // 5/6: activated by the rotator; the old one is retired and still published.
    m.tick(after(3332)).await.unwrap();
    assert_eq!(active_kid(&m), first);
    m.tick(after(3334)).await.unwrap();
    let v = m.view();
    assert_eq!(active_kid(&m), next);
    assert_eq!(published(&v), vec![next.clone(), first.clone()]);
    assert_eq!(jwt_slots(&v, State::Retired)[0].slot.id, first);
    // Removed once no token it signed can be live: max_ttl (+ grace) after its retirement.
    let gone = 3334 + MAX_TTL.as_secs() + rotator::REMOVAL_GRACE.as_secs();
    m.tick(after(gone - 1)).await.unwrap();
    assert!(published(&m.view()).contains(&first));
    m.tick(after(gone)).await.unwrap();
    let v = m.view();
    assert_eq!(published(&v), vec![next.clone()]);
    assert_eq!(jwt_slots(&v, State::Removed)[0].slot.id, first);
    // Its sealed key is erased.
    let (_, rows) = store.ca_slots().await.unwrap();
    assert!(
        rows.iter()
            .find(|r| r.id == first)
            .unwrap()
            .encrypted_key
            .is_empty()
    );
}

#[tokio::test]
async fn tainting_the_active_jwt_key_replaces_it_at_once_and_revoking_unpublishes_it() {
    let (store, _dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let first = active_kid(&m);
    let ca_active = m.view().active.key_id().to_owned();
    let out = m.taint(&first, "op", after(10)).await.unwrap();
    let v = m.view();
    let second = active_kid(&m);
    assert_ne!(second, first, "a tainted JWT key stops signing at once");
    assert!(v.tainted.contains(&first));
    assert!(!v.tainted.contains(&second));
    assert_eq!(v.active.key_id(), ca_active, "the X.509 CA is untouched");
    assert!(
        out.warnings.iter().any(|w| w.contains(&second)),
        "{:?}",
        out.warnings
    );
    // Still published (validators learn it is tainted), but it signs nothing.
    assert!(published(&v).contains(&first));
    assert_eq!(mint_and_validate(&m, after(11)), second);
    // Revoking removes it from what is published; it stays tainted until it expires.
    let out = m.revoke(&first, false, "op", after(20)).await.unwrap();
    assert!(
        out.warnings
            .iter()
            .any(|w| w.contains("may be unexpired until")),
        "{:?}",
        out.warnings
    );
    let v = m.view();
    assert!(!published(&v).contains(&first));
    assert!(v.tainted.contains(&first));
    // The active JWT key may not be revoked: taint it (and so replace it) first.
    let e = m.revoke(&second, false, "op", after(30)).await.unwrap_err();
    assert!(e.to_string().contains("taint it first"), "{e}");
    // A prepared JWT key that is tainted is removed, never activated.
    m.prepare(Kind::Jwt, "op", after(40)).await.unwrap();
    let third = jwt_slots(&m.view(), State::Prepared)[0].slot.id.clone();
    m.taint(&third, "op", after(50)).await.unwrap();
    let v = m.view();
    assert_eq!(active_kid(&m), second);
    assert_eq!(jwt_slots(&v, State::Removed).len(), 2);
    let kinds: Vec<String> = store
        .audit_events(0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.detail.contains(&first))
        .map(|e| e.kind)
        .collect();
    assert!(
        ["ca.tainted", "ca.retired", "ca.revoked"]
            .iter()
            .all(|k| kinds.iter().any(|x| x == k)),
        "{kinds:?}"
    );
}

#[tokio::test]
async fn operator_prepare_and_activate_of_a_jwt_key() {
    let (store, _dir) = sqlite().await;
    let m = manager(store, Kek::generate(), now()).await;
    let first = active_kid(&m);
    let o = m.prepare(Kind::Jwt, "op", after(10)).await.unwrap();
    assert_ne!(o.key_id, first);
    let e = m.prepare(Kind::Jwt, "op", after(11)).await.unwrap_err();
    assert!(e.to_string().contains("already prepared"), "{e}");
    // Once published for the propagation window, it may be activated.
    let o2 = m
        .activate(&o.key_id, false, "op", after(10 + 300))
        .await
        .unwrap();
    assert_eq!(o2.key_id, o.key_id);
    assert_eq!(active_kid(&m), o.key_id);
}

#[tokio::test]
async fn a_jwt_row_inserted_by_a_database_writer_is_trusted_nowhere() {
    let (store, _dir) = sqlite().await;
    let kek = Kek::generate();
    let m = manager(
        store.clone(),
        Kek::from_base64(&kek.to_base64()).unwrap(),
        now(),
    )
    .await;
    // A real JWT row, copied with its key sealed under another key-encryption key.
    let (_, rows) = store.ca_slots().await.unwrap();
    let mut row = rows.iter().find(|r| r.kind == "jwt").unwrap().clone();
    let theirs = Kek::generate();
    let key = signet_pki::key::generate(signet_pki::key::KeyAlgorithm::EcdsaP256).unwrap();
    let signer = signet_pki::jwt::JwtSigner::new(&key).unwrap();
    // Their own key, with the certificate of ours: the kid does not match the certificate.
    row.id = signer.key_id().to_owned();
    row.slot = row.id.clone();
    row.state = "prepared".into();
    row.encrypted_key = theirs.seal(key.pkcs8_der(), b"x");
    let (g, _) = store.ca_slots().await.unwrap();
    let change = CaChange {
        inserts: vec![row.clone()],
        ..CaChange::default()
    };
    assert!(store.apply_ca_change(g, &change).await.unwrap());
    m.tick(after(1)).await.unwrap();
    let v = m.view();
    assert!(!published(&v).contains(&row.id));
    assert_eq!(v.rejected.len(), 1, "{:?}", v.rejected);
    assert!(v.rejected[0].reason.contains("key ID"), "{:?}", v.rejected);
    assert!(v.readiness().is_err());
}

/// Two managers on one database: each JWT transition happens once.
async fn racing(s1: Arc<dyn Store>, s2: Arc<dyn Store>) {
    let kek = Kek::generate();
    let copy = || Kek::from_base64(&kek.to_base64()).unwrap();
    let (a, b) = tokio::join!(
        manager(s1.clone(), copy(), now()),
        manager(s2.clone(), copy(), now())
    );
    assert_eq!(active_kid(&a), active_kid(&b));
    let jwt_rows = |rows: &[CaSlotRow]| rows.iter().filter(|r| r.kind == "jwt").count();
    let (_, rows) = s1.ca_slots().await.unwrap();
    assert_eq!(jwt_rows(&rows), 1, "{rows:?}");
    for (round, at) in [2000u64, 3334, 4034, 5400, 7000].into_iter().enumerate() {
        let (ta, tb) = tokio::join!(a.tick(after(at)), b.tick(after(at)));
        let (ta, tb) = (ta.unwrap(), tb.unwrap());
        assert!(
            !ta.iter().any(|t| tb.contains(t)),
            "round {round}: both applied {ta:?} / {tb:?}"
        );
        a.tick(after(at)).await.unwrap();
        b.tick(after(at)).await.unwrap();
        assert_eq!(active_kid(&a), active_kid(&b), "round {round}");
        assert_eq!(published(&a.view()), published(&b.view()), "round {round}");
        let (_, rows) = s1.ca_slots().await.unwrap();
        let prepared = rows
            .iter()
            .filter(|r| r.kind == "jwt" && r.state == "prepared")
            .count();
        assert!(prepared <= 1, "round {round}: {rows:?}");
    }
    let events = s1.audit_events(0, 1000).await.unwrap();
    let prepared = events
        .iter()
        .filter(|e| e.kind == "ca.prepared" && e.detail.starts_with("jwt "))
        .count();
    let (_, rows) = s1.ca_slots().await.unwrap();
    assert_eq!(prepared, jwt_rows(&rows), "one event per key: {events:?}");
    // 0: the first; 2000: the second prepared; 3334: activated; 4034: the first removed, the
    // third prepared; 5400: activated; 7000: the second removed, the fourth prepared.
    assert_eq!(jwt_rows(&rows), 4, "{rows:?}");
}

#[tokio::test]
async fn two_managers_on_one_sqlite_file_move_the_jwt_keys_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = signet_testutil::sqlite_url(dir.path());
    let s1: Arc<dyn Store> = Arc::new(SqliteStore::connect(&url, ACQUIRE).await.unwrap());
    let s2: Arc<dyn Store> = Arc::new(SqliteStore::connect(&url, ACQUIRE).await.unwrap());
    racing(s1, s2).await;
}

#[tokio::test]
async fn two_managers_on_one_postgresql_move_the_jwt_keys_once() {
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let s1: Arc<dyn Store> = Arc::new(PgStore::connect(&url, ACQUIRE).await.unwrap());
    let s2: Arc<dyn Store> = Arc::new(PgStore::connect(&url, ACQUIRE).await.unwrap());
    racing(s1, s2).await;
}

#[tokio::test]
async fn rs256_jwt_keys_are_rsa_2048() {
    let (store, _dir) = sqlite().await;
    let m = manager_with(store, Kek::generate(), JwtKeyType::Rs256, now()).await;
    let active = m.active_jwt_key().unwrap();
    assert_eq!(active.signer.alg().as_str(), "RS256");
    let v = m.view();
    let slot = jwt_slots(&v, State::Active)[0];
    assert_eq!(slot.algorithm, "RS256");
    assert_eq!(mint_and_validate(&m, after(1)), slot.slot.id);
    let jwk = v.jwt_keys[0].key.jwk("jwt-svid").unwrap();
    assert_eq!(jwk["kty"], "RSA");
    assert_eq!(jwk["alg"], "RS256");
}

/// A plugged-in CA (Istio's `cacerts` files: a generated root as the signing CA) for `dir`.
fn cacerts(dir: &std::path::Path) -> (PluggedFiles, String) {
    let (root, _) = testutil::root(KeyType::EcdsaP256, Duration::from_secs(100_000));
    let cert = signet_types::pem::cert_to_pem(root.cert_der());
    let key = rcgen::KeyPair::try_from(root.key_pkcs8_der())
        .unwrap()
        .serialize_pem();
    let files = PluggedFiles {
        cert: dir.join("ca-cert.pem"),
        key: dir.join("ca-key.pem"),
        chain: dir.join("cert-chain.pem"),
        root: dir.join("root-cert.pem"),
    };
    std::fs::write(&files.cert, &cert).unwrap();
    std::fs::write(&files.key, key).unwrap();
    std::fs::write(&files.chain, "").unwrap();
    std::fs::write(&files.root, &cert).unwrap();
    (files, root.key_id().to_owned())
}

async fn plugged(
    store: Arc<dyn Store>,
    files: PluggedFiles,
    kek: Kek,
    at: SystemTime,
) -> Arc<CaManager> {
    CaManager::plugged(
        store,
        files,
        kek,
        cfg(JwtKeyType::Es256),
        Arc::new(RandomSerials::default()),
        Arc::new(NoJitter),
        at,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn plugged_ca_has_jwt_keys_of_its_own_that_rotate_and_taint() {
    let (store, dir) = sqlite().await;
    let (files, ca_id) = cacerts(dir.path());
    let m = plugged(store.clone(), files.clone(), Kek::generate(), now()).await;
    let v = m.view();
    assert!(v.plugged);
    assert_eq!(
        v.active.key_id(),
        ca_id,
        "the operator's CA signs certificates"
    );
    let first = active_kid(&m);
    assert_eq!(published(&v), vec![first.clone()]);
    assert_eq!(mint_and_validate(&m, after(1)), first);
    // JWT keys are never X.509 anchors, and the only CA slots are the files'.
    assert_eq!(v.client_anchors.len(), 1);
    assert!(
        v.slots
            .iter()
            .all(|s| s.external || s.slot.kind == Kind::Jwt),
        "{:?}",
        v.slots
    );
    // The rotator prepares and activates JWT keys as with generated CA keys.
    m.tick(after(2000)).await.unwrap();
    let next = jwt_slots(&m.view(), State::Prepared)[0].slot.id.clone();
    assert_eq!(published(&m.view()), vec![first.clone(), next.clone()]);
    m.tick(after(3334)).await.unwrap();
    assert_eq!(active_kid(&m), next);
    assert_eq!(m.view().active.key_id(), ca_id);
    // A taint replaces the active JWT key at once.
    m.taint(&next, "op", after(3400)).await.unwrap();
    let third = active_kid(&m);
    assert_ne!(third, next);
    assert!(m.view().tainted.contains(&next));
    // The CA itself is the operator's: its slot commands are refused, JWT ones allowed.
    for e in [
        m.prepare(Kind::Intermediate, "op", after(3500))
            .await
            .unwrap_err(),
        m.prepare(Kind::Root, "op", after(3500)).await.unwrap_err(),
        m.taint(&ca_id, "op", after(3500)).await.unwrap_err(),
        m.revoke(&ca_id, true, "op", after(3500)).await.unwrap_err(),
        m.activate(&ca_id, false, "op", after(3500))
            .await
            .unwrap_err(),
    ] {
        assert!(
            matches!(e, ManagerError::FailedPrecondition(_))
                && e.to_string().contains("plugged in"),
            "{e}"
        );
    }
    m.prepare(Kind::Jwt, "op", after(3500)).await.unwrap();
    // Status lists the files' CA and the JWT keys.
    let st = m.status(after(3501)).await.unwrap();
    assert!(st.iter().any(|s| s.info.slot.id == ca_id));
    assert_eq!(
        st.iter().filter(|s| s.info.slot.kind == Kind::Jwt).count(),
        4
    );
    // A restart opens the same JWT keys.
    let again = plugged(
        store,
        files,
        Kek::from_base64(&m.kek.to_base64()).unwrap(),
        after(3502),
    )
    .await;
    assert_eq!(active_kid(&again), third);
}

#[tokio::test]
async fn plugged_ca_reads_only_jwt_rows_and_keeps_the_jwt_key_across_a_switch() {
    // Generated keys first (a root, an intermediate and a JWT key in the database)…
    let (store, dir) = sqlite().await;
    let kek = Kek::generate();
    let g = manager(
        store.clone(),
        Kek::from_base64(&kek.to_base64()).unwrap(),
        now(),
    )
    .await;
    let jwt = active_kid(&g);
    let generated_root = g.view().roots[0].clone();
    drop(g);
    // … then the operator plugs in a CA: its root is the only one trusted, the stored CA
    // rows are not read at all, and the JWT key carries on.
    let (files, ca_id) = cacerts(dir.path());
    let m = plugged(
        store.clone(),
        files.clone(),
        Kek::from_base64(&kek.to_base64()).unwrap(),
        after(10),
    )
    .await;
    let v = m.view();
    assert_eq!(v.active.key_id(), ca_id);
    assert_eq!(v.roots.len(), 1);
    assert_ne!(v.roots[0], generated_root);
    assert_eq!(v.client_anchors.len(), 1);
    assert!(v.rejected.is_empty());
    assert_eq!(active_kid(&m), jwt);
    assert!(
        v.slots
            .iter()
            .all(|s| s.external || s.slot.kind == Kind::Jwt)
    );
    // A tick does not touch the stored CA rows (no rotation of a CA it does not run).
    let (g1, _) = store.ca_slots().await.unwrap();
    m.tick(after(20)).await.unwrap();
    let (g2, rows) = store.ca_slots().await.unwrap();
    assert_eq!(g1, g2);
    assert_eq!(rows.iter().filter(|r| r.kind != "jwt").count(), 2);
    // Another KEK opens none of the JWT rows: a clear refusal, not a silent new key.
    let e = CaManager::plugged(
        store,
        files,
        Kek::generate(),
        cfg(JwtKeyType::Es256),
        Arc::new(RandomSerials::default()),
        Arc::new(NoJitter),
        after(30),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("key-encryption key"), "{e}");
}

/// Review finding F2: a tainted JWT key's private key is erased with the taint, so a database
/// writer who clears the taint and makes it active again gets a slot that opens nothing: it is
/// rejected and reported, and the key never signs again.
#[tokio::test]
async fn clearing_a_jwt_keys_taint_in_the_database_does_not_make_it_sign_again() {
    let (store, dir) = sqlite().await;
    let m = manager(store.clone(), Kek::generate(), now()).await;
    let stolen = active_kid(&m);
    m.taint(&stolen, "op", after(10)).await.unwrap();
    let replacement = active_kid(&m);
    let (_, rows) = store.ca_slots().await.unwrap();
    let row = rows.iter().find(|r| r.id == stolen).unwrap();
    assert!(row.encrypted_key.is_empty(), "the taint erases the key");
    // Still published from its certificate (validators learn it is tainted).
    assert!(published(&m.view()).contains(&stolen));
    assert!(m.view().readiness().is_ok());
    // The database writer's edit, as the reviewer ran it against the real server.
    let pool = sqlx::SqlitePool::connect(&signet_testutil::sqlite_url(dir.path()))
        .await
        .unwrap();
    for sql in [
        format!("UPDATE ca_keys SET state = 'retired', retired_at = 1 WHERE id = '{replacement}'"),
        format!(
            "UPDATE ca_keys SET state = 'active', tainted_at = NULL, retired_at = NULL \
             WHERE id = '{stolen}'"
        ),
        "UPDATE ca_generation SET gen = gen + 1".to_owned(),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    m.tick(after(20)).await.unwrap();
    let v = m.view();
    assert!(
        v.rejected.iter().any(|r| r.id == stolen),
        "{:?}",
        v.rejected
    );
    assert!(!published(&v).contains(&stolen));
    assert!(v.readiness().is_err());
    if let Some(k) = m.active_jwt_key() {
        assert_ne!(k.signer.key_id(), stolen, "the stolen key signs again");
    }
    let events = store.audit_events(0, 1000).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "ca.slot_rejected" && e.detail.contains(&stolen)),
        "{events:?}"
    );
}
