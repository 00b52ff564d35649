#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::Mutex;

use signet_pki::ParsedCert;

use super::*;
use crate::clock::fake::FakeClock;
use crate::store::{NewEntry, Store};

fn root(cn: &str) -> ParsedCert {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    ParsedCert::from_der(p.self_signed(&key).unwrap().der()).unwrap()
}

fn bundle(roots: &[&ParsedCert], sequence: Option<u64>) -> SpiffeBundle {
    SpiffeBundle {
        x509_authorities: roots.iter().map(|r| (*r).clone()).collect(),
        sequence,
        refresh_hint: Some(Duration::from_secs(60)),
        ..SpiffeBundle::default()
    }
}

#[test]
fn documents_are_judged_by_their_keys_and_sequence() {
    let (r1, r2) = (root("r1"), root("r2"));
    let held = normalize(&bundle(&[&r1], Some(5))).unwrap();
    let judge = |b: SpiffeBundle| decide(&held.content_sha256, Some(5), &normalize(&b).unwrap());
    assert_eq!(judge(bundle(&[&r1], Some(5))), Verdict::Unchanged);
    assert_eq!(judge(bundle(&[&r1], Some(6))), Verdict::NewSequence);
    assert_eq!(judge(bundle(&[&r1, &r2], Some(6))), Verdict::Replace);
    let refused = |v: Verdict, want: &str| match v {
        Verdict::Refuse(why) => assert!(why.contains(want), "{why}"),
        other => panic!("expected a refusal with {want:?}, got {other:?}"),
    };
    refused(
        judge(bundle(&[&r2], Some(4))),
        "went backwards, from 5 held to 4",
    );
    refused(judge(bundle(&[&r1], Some(4))), "went backwards");
    refused(judge(bundle(&[&r2], None)), "has no spiffe_sequence");
    refused(
        judge(bundle(&[&r2], Some(5))),
        "the keys changed but spiffe_sequence stayed at 5",
    );
    // Without a held sequence (a PEM bootstrap bundle), anything with keys is taken.
    let pem_held = normalize(&bundle(&[&r1], None)).unwrap();
    assert_eq!(
        decide(
            &pem_held.content_sha256,
            None,
            &normalize(&bundle(&[&r2], None)).unwrap()
        ),
        Verdict::Replace
    );
    assert_eq!(
        decide("", None, &normalize(&bundle(&[&r2], Some(1))).unwrap()),
        Verdict::Replace
    );
    // The refresh hint is not part of the keys.
    let mut other_hint = bundle(&[&r1], Some(5));
    other_hint.refresh_hint = Some(Duration::from_secs(7));
    assert_eq!(
        normalize(&other_hint).unwrap().content_sha256,
        held.content_sha256
    );
    assert!(
        normalize(&SpiffeBundle::default())
            .unwrap_err()
            .contains("no X.509 or JWT")
    );
    assert!(
        normalize(&bundle(&[&r1], Some(u64::MAX)))
            .unwrap_err()
            .contains("2^63")
    );
}

#[test]
fn operator_bundles_are_pem_or_spiffe_documents() {
    let r = root("op");
    let pem = signet_types::pem::cert_to_pem(r.der());
    let b = read_bundle_input(pem.as_bytes()).unwrap();
    assert_eq!(b.x509_authorities, vec![r.clone()]);
    assert_eq!(b.sequence, None);
    let doc = bundle(&[&r], Some(9)).to_json().unwrap().to_string();
    let b = read_bundle_input(format!("\n  {doc}").as_bytes()).unwrap();
    assert_eq!(b.sequence, Some(9));
    let empty = read_bundle_input(b"").unwrap_err();
    assert!(
        empty.contains("neither a SPIFFE bundle document nor PEM"),
        "{empty}"
    );
    assert!(
        read_bundle_input(b"{\"keys\":1}")
            .unwrap_err()
            .contains("SPIFFE bundle document")
    );
    assert!(
        read_bundle_input(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
            .is_err()
    );
}

/// A bundle source answering from a queue.
#[derive(Default)]
struct Scripted {
    answers: Mutex<VecDeque<Result<SpiffeBundle, FetchFailure>>>,
    asked: Mutex<Vec<Endpoint>>,
}

#[async_trait]
impl BundleSource for Scripted {
    async fn fetch(&self, endpoint: &Endpoint) -> Result<SpiffeBundle, FetchFailure> {
        self.asked.lock().unwrap().push(endpoint.clone());
        self.answers.lock().unwrap().pop_front().unwrap_or_else(|| {
            Err(FetchFailure {
                label: "connect",
                message: "nothing scripted".into(),
            })
        })
    }
}

struct Rig {
    store: Arc<dyn Store>,
    source: Arc<Scripted>,
    clock: FakeClock,
    federation: Federation,
    _dir: tempfile::TempDir,
}

/// A federation of `own.test` over `store`, fetching from `source`.
fn federation_over(
    store: &Arc<dyn Store>,
    source: Arc<dyn BundleSource>,
    clock: &FakeClock,
) -> Federation {
    Federation::new(
        store.clone(),
        source,
        Arc::new(clock.clone()),
        AuditLog::spawn(store.clone(), 64),
        Metrics::new(),
        Settings {
            refresh_min: Duration::from_secs(30),
            refresh_max: Duration::from_secs(3600),
            default_refresh: Duration::from_secs(300),
            retry_base: Duration::from_secs(5),
            lease: Duration::from_secs(60),
        },
        TrustDomain::new("own.test").unwrap(),
    )
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let url = signet_testutil::sqlite_url(&dir.path().join("db"));
    let store = crate::store::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let clock = FakeClock::at_unix(1_800_000_000);
    let source = Arc::new(Scripted::default());
    let federation = federation_over(&store, source.clone(), &clock);
    Rig {
        store,
        source,
        clock,
        federation,
        _dir: dir,
    }
}

fn relationship(td: &str, held: &Normalized, now: i64) -> RelationshipRow {
    RelationshipRow {
        trust_domain: td.into(),
        endpoint_url: "https://partner.test/bundle".into(),
        profile: PROFILE_HTTPS_SPIFFE.into(),
        endpoint_spiffe_id: format!("spiffe://{td}/endpoint"),
        created_at: now,
        bundle_document: held.document.clone(),
        bundle_sha256: held.content_sha256.clone(),
        bundle_sequence: held.sequence.map(|s| i64::try_from(s).unwrap()),
        bundle_updated_at: now,
        last_success_at: 0,
        last_attempt_at: 0,
        next_refresh_at: now,
        last_error: String::new(),
        consecutive_failures: 0,
    }
}

fn entry(id: &str, parent: &str, federates_with: &[&str]) -> NewEntry {
    NewEntry {
        id: id.into(),
        spiffe_id: format!("spiffe://own.test/{id}"),
        parent_id: parent.into(),
        selectors: vec!["unix:uid:1".into()],
        ttl_seconds: 0,
        dns_names: vec![],
        created_at: 1,
        jwt_ttl_seconds: 0,
        federates_with: federates_with.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[tokio::test]
async fn a_refresh_replaces_refuses_and_keeps_what_it_must() {
    let r = rig().await;
    let (r1, r2, r3) = (root("r1"), root("r2"), root("r3"));
    let held = normalize(&bundle(&[&r1], Some(5))).unwrap();
    let now = r.federation.now();
    assert!(
        r.store
            .create_relationship(&relationship("partner.test", &held, now))
            .await
            .unwrap()
    );
    const NODE: &str = "spiffe://own.test/signet/node/n1";
    const OTHER: &str = "spiffe://own.test/signet/node/n2";
    for e in [
        entry("fed", NODE, &["partner.test"]),
        entry("plain", OTHER, &[]),
    ] {
        assert!(matches!(
            r.store.create_entry(&e).await.unwrap(),
            crate::store::EntryCreate::Created(_)
        ));
    }
    let before = r.store.entry_revision(NODE).await.unwrap();
    let other_before = r.store.entry_revision(OTHER).await.unwrap();

    // A new root at a new sequence: replaced; the federating node's revision moves, the
    // other's does not; the endpoint was authenticated with the held root.
    r.source
        .answers
        .lock()
        .unwrap()
        .push_back(Ok(bundle(&[&r1, &r2], Some(6))));
    assert_eq!(
        r.federation.refresh("partner.test", false).await.unwrap(),
        Refreshed::Changed
    );
    assert_eq!(
        r.source.asked.lock().unwrap()[0].trust_anchors,
        vec![r1.der().to_vec()]
    );
    assert!(r.store.entry_revision(NODE).await.unwrap() > before);
    assert_eq!(r.store.entry_revision(OTHER).await.unwrap(), other_before);
    let stored = r.store.relationship("partner.test").await.unwrap().unwrap();
    assert_eq!(stored.row.bundle_sequence, Some(6));
    assert_eq!(stored.federating_entries, 1);
    assert_eq!(stored.row.next_refresh_at, now + 60, "the document's hint");
    let sent = r.store.federated_bundles(&["partner.test"]).await.unwrap();
    let proto = federated_bundle_proto("partner.test", &sent[0].1).unwrap();
    assert_eq!(proto.x509_authorities.len(), 2);
    assert_eq!(proto.sequence, 6);

    // Not due yet: another call does not claim it.
    assert_eq!(
        r.federation.refresh("partner.test", false).await.unwrap(),
        Refreshed::NotClaimed
    );

    // Each refused document keeps the bundle held, says why, and retries sooner.
    let rev = r.store.entry_revision(NODE).await.unwrap();
    for (answer, want) in [
        (Ok(bundle(&[&r3], Some(5))), "went backwards"),
        (Ok(bundle(&[&r3], Some(6))), "stayed at 6"),
        (
            Err(FetchFailure {
                label: "spiffe_id",
                message: "presented spiffe://partner.test/other".into(),
            }),
            "presented spiffe://partner.test/other",
        ),
    ] {
        r.clock.advance(Duration::from_secs(3600));
        r.source.answers.lock().unwrap().push_back(answer);
        match r.federation.refresh("partner.test", false).await.unwrap() {
            Refreshed::Failed(why) => assert!(why.contains(want), "{why}"),
            other => panic!("{want}: {other:?}"),
        }
        let row = r
            .store
            .relationship("partner.test")
            .await
            .unwrap()
            .unwrap()
            .row;
        assert!(row.last_error.contains(want), "{}", row.last_error);
        assert_eq!(row.bundle_sequence, Some(6));
        assert!(row.next_refresh_at <= r.federation.now() + 60);
    }
    assert_eq!(r.store.entry_revision(NODE).await.unwrap(), rev);
    let row = r
        .store
        .relationship("partner.test")
        .await
        .unwrap()
        .unwrap()
        .row;
    assert_eq!(row.consecutive_failures, 3);

    // The same keys at a newer sequence: kept, no revision moved, the error cleared.
    r.clock.advance(Duration::from_secs(3600));
    r.source
        .answers
        .lock()
        .unwrap()
        .push_back(Ok(bundle(&[&r1, &r2], Some(7))));
    assert_eq!(
        r.federation.refresh("partner.test", false).await.unwrap(),
        Refreshed::Unchanged
    );
    assert_eq!(r.store.entry_revision(NODE).await.unwrap(), rev);
    let row = r
        .store
        .relationship("partner.test")
        .await
        .unwrap()
        .unwrap()
        .row;
    assert_eq!(
        (
            row.bundle_sequence,
            row.last_error.as_str(),
            row.consecutive_failures
        ),
        (Some(7), "", 0)
    );
    // An operator's refresh claims it whatever the schedule.
    r.source
        .answers
        .lock()
        .unwrap()
        .push_back(Ok(bundle(&[&r1, &r2], Some(7))));
    assert_eq!(
        r.federation.refresh("partner.test", true).await.unwrap(),
        Refreshed::Unchanged
    );
}

#[tokio::test]
async fn one_replica_claims_each_due_fetch() {
    let r = rig().await;
    let held = normalize(&bundle(&[&root("r")], Some(1))).unwrap();
    let now = r.federation.now();
    r.store
        .create_relationship(&relationship("partner.test", &held, now))
        .await
        .unwrap();
    let claims = futures::future::join_all(
        (0..8).map(|_| r.store.claim_refresh("partner.test", now, now + 60, false)),
    )
    .await;
    assert_eq!(claims.iter().filter(|c| *c.as_ref().unwrap()).count(), 1);
    let (due, next) = r.store.due_relationships(now).await.unwrap();
    assert!(due.is_empty());
    assert_eq!(next, Some(now + 60));
}

#[tokio::test]
async fn entries_need_a_relationship_and_keep_it_from_deletion() {
    let r = rig().await;
    let e = entry("fed", "spiffe://own.test/signet/node/n1", &["partner.test"]);
    assert_eq!(
        r.store.create_entry(&e).await.unwrap(),
        crate::store::EntryCreate::NoRelationship {
            trust_domain: "partner.test".into()
        }
    );
    let held = normalize(&bundle(&[&root("r")], None)).unwrap();
    r.store
        .create_relationship(&relationship("partner.test", &held, 1))
        .await
        .unwrap();
    assert!(
        !r.store
            .create_relationship(&relationship("partner.test", &held, 1))
            .await
            .unwrap()
    );
    assert!(matches!(
        r.store.create_entry(&e).await.unwrap(),
        crate::store::EntryCreate::Created(_)
    ));
    assert_eq!(
        r.store.delete_relationship("partner.test").await.unwrap(),
        crate::store::RelationshipDelete::InUse {
            entry_ids: vec!["fed".into()],
            count: 1
        }
    );
    assert!(r.store.delete_entry("fed").await.unwrap());
    assert_eq!(
        r.store.delete_relationship("partner.test").await.unwrap(),
        crate::store::RelationshipDelete::Deleted
    );
    assert_eq!(
        r.store.delete_relationship("partner.test").await.unwrap(),
        crate::store::RelationshipDelete::NotFound
    );
}

#[tokio::test]
async fn the_configuration_file_creates_what_the_database_lacks_and_never_overrides_it() {
    let r = rig().await;
    let pem = r._dir.path().join("partner.pem");
    std::fs::write(&pem, signet_types::pem::cert_to_pem(root("p").der())).unwrap();
    let declared = crate::config::RelationshipConfig {
        trust_domain: "spiffe://partner.test".into(),
        bundle_file: Some(pem.clone()),
        ..Default::default()
    };
    r.federation
        .declare(std::slice::from_ref(&declared))
        .await
        .unwrap();
    let held = r
        .store
        .relationship("partner.test")
        .await
        .unwrap()
        .unwrap()
        .row;
    assert_eq!(held.profile, PROFILE_STATIC);
    assert!(!held.bundle_document.is_empty());
    // A changed declaration: the database's relationship is kept as it is.
    let changed = crate::config::RelationshipConfig {
        bundle_endpoint_url: "https://partner.test/bundle".into(),
        profile: PROFILE_HTTPS_SPIFFE.into(),
        endpoint_spiffe_id: "spiffe://partner.test/e".into(),
        ..declared.clone()
    };
    r.federation.declare(&[changed]).await.unwrap();
    assert_eq!(
        r.store
            .relationship("partner.test")
            .await
            .unwrap()
            .unwrap()
            .row,
        held
    );
    // Declarations that do not check stop the start.
    for (bad, want) in [
        (
            crate::config::RelationshipConfig {
                trust_domain: "other.test".into(),
                bundle_endpoint_url: "https://other.test/".into(),
                profile: PROFILE_HTTPS_SPIFFE.into(),
                bundle_file: Some(pem.clone()),
                ..Default::default()
            },
            "endpoint_spiffe_id",
        ),
        (
            crate::config::RelationshipConfig {
                trust_domain: "other.test".into(),
                bundle_file: Some(r._dir.path().join("missing.pem")),
                ..Default::default()
            },
            "missing.pem",
        ),
        (
            crate::config::RelationshipConfig {
                trust_domain: "other.test".into(),
                bundle_endpoint_url: "http://other.test/".into(),
                profile: PROFILE_HTTPS_WEB.into(),
                ..Default::default()
            },
            "https://",
        ),
    ] {
        let err = r.federation.declare(&[bad]).await.unwrap_err();
        assert!(err.contains(want), "{err}");
    }
    assert!(r.store.relationship("other.test").await.unwrap().is_none());
}

fn leaf_cert(cn: &str) -> ParsedCert {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    ParsedCert::from_der(p.self_signed(&key).unwrap().der()).unwrap()
}

fn expired_root(cn: &str) -> ParsedCert {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    p.not_before = rcgen::date_time_ymd(2000, 1, 1);
    p.not_after = rcgen::date_time_ymd(2001, 1, 1);
    ParsedCert::from_der(p.self_signed(&key).unwrap().der()).unwrap()
}

/// Review finding 4: names that would pass for our own domain, or for no domain.
#[test]
fn federated_trust_domains_have_no_empty_label_and_are_not_ours() {
    let own = TrustDomain::new("a.test").unwrap();
    for bad in [
        "a.test.",
        ".a.test",
        "x..y",
        ".",
        "..",
        "a.test",
        "spiffe://A.TEST",
        "spiffe://a.test/x",
    ] {
        assert!(federated_trust_domain(bad, &own).is_err(), "{bad} accepted");
    }
    assert_eq!(
        federated_trust_domain("spiffe://Partner.test", &own)
            .unwrap()
            .as_str(),
        "partner.test"
    );
}

/// Review finding 5: authorities that are not CAs, or none valid now.
#[test]
fn authorities_must_be_cas_and_one_valid_now() {
    let now = 1_800_000_000;
    let ok = bundle(&[&root("r")], Some(1));
    assert_eq!(check_authorities(&ok, now), Ok(()));
    let leaf = bundle(&[&root("r"), &leaf_cert("leaf")], Some(1));
    assert!(
        check_authorities(&leaf, now)
            .unwrap_err()
            .contains("not a CA")
    );
    let expired = bundle(&[&expired_root("old")], Some(1));
    assert!(
        check_authorities(&expired, now)
            .unwrap_err()
            .contains("valid now")
    );
    // One valid root beside an expired one is fine (a rotation's tail).
    let mixed = bundle(&[&expired_root("old"), &root("new")], Some(1));
    assert_eq!(check_authorities(&mixed, now), Ok(()));
}

/// Review finding 6: a query (a token) in the endpoint URL would be logged and audited.
#[test]
fn endpoint_urls_carry_no_query_fragment_or_user_info() {
    let td = TrustDomain::new("partner.test").unwrap();
    for url in [
        "https://p.test/?token=s3cr3t",
        "https://p.test/#x",
        "https://u:p@p.test/",
        "http://p.test/",
    ] {
        let err = new_relationship(&td, url, PROFILE_HTTPS_WEB, "", b"", 1).unwrap_err();
        assert!(err.contains("bundle_endpoint_url"), "{url}: {err}");
    }
    assert!(
        new_relationship(
            &td,
            "https://p.test:8443/bundle",
            PROFILE_HTTPS_WEB,
            "",
            b"",
            1
        )
        .is_ok()
    );
}

/// A source whose answer for `slow.test` never comes.
struct OneHangs;

#[async_trait]
impl BundleSource for OneHangs {
    async fn fetch(&self, endpoint: &Endpoint) -> Result<SpiffeBundle, FetchFailure> {
        if endpoint.trust_domain == "slow.test" {
            std::future::pending::<()>().await;
        }
        Ok(bundle(&[&root("fast")], Some(2)))
    }
}

/// Review finding 2: one endpoint that never answers holds back no other relationship.
#[tokio::test]
async fn a_silent_endpoint_holds_back_no_other_relationship() {
    let r = rig().await;
    let federation = Arc::new(federation_over(&r.store, Arc::new(OneHangs), &r.clock));
    let held = normalize(&bundle(&[&root("h")], Some(1))).unwrap();
    let now = federation.now();
    // The silent one is due first.
    r.store
        .create_relationship(&relationship("slow.test", &held, now - 10))
        .await
        .unwrap();
    r.store
        .create_relationship(&relationship("fast.test", &held, now))
        .await
        .unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let loop_ = tokio::spawn(federation.clone().run(async move {
        let _ = stop_rx.await;
    }));
    // At most 10 s (500 polls of 20 ms).
    for polls in 0.. {
        let fast = r
            .store
            .relationship("fast.test")
            .await
            .unwrap()
            .unwrap()
            .row;
        if fast.bundle_sequence == Some(2) {
            break;
        }
        assert!(
            polls < 500,
            "fast.test was never refreshed while slow.test hung"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(());
    loop_.await.unwrap();
}
