//! The issuer's JWT-SVID flow against real parts: a SQLite store, the group-commit ledger
//! writer, a generated CA, the policy, and a fixed JWT key (the key manager's source is wired
//! elsewhere). What SignCsr refuses, MintJwtSvid refuses with the same code; every token
//! returned is on the ledger, and validates with the key's public half.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use signet_pki::jwt::{JwtKeySet, validate};
use signet_types::ledger::sha256;

use super::*;
use crate::authn::AdminSocket;
use crate::ca::jwt_key::{ActiveJwtKey, JwtKeySource};
use crate::ca::serial::SequentialSerials;
use crate::ca::{KeyType, testutil};
use crate::clock::fake::FakeClock;
use crate::config::LedgerConfig;
use crate::jwt_svid::JwtIssuePolicy;
use crate::policy::EntryGrant;

struct Fixed(Option<ActiveJwtKey>);

impl JwtKeySource for Fixed {
    fn active_jwt_key(&self) -> Option<ActiveJwtKey> {
        self.0.clone()
    }
}

struct Rig {
    issuer: Issuer,
    store: Arc<dyn Store>,
    key: ActiveJwtKey,
    _dir: tempfile::TempDir,
}

async fn rig(with_key: bool) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let url = signet_testutil::sqlite_url(&dir.path().join("db"));
    let store = crate::store::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let (authority, _) = testutil::root(KeyType::EcdsaP256, Duration::from_secs(30 * 86_400));
    let clock = Arc::new(FakeClock::at(testutil::now()));
    let ledger = LedgerWriter::spawn(store.clone(), &LedgerConfig::default(), Arc::new(|_, _| {}));
    let policy = Policy::new(
        testutil::td(),
        Duration::from_secs(3600),
        Duration::from_secs(86_400),
        &Default::default(),
    )
    .unwrap();
    let key = crate::jwt_svid::tests::test_key(testutil::now() + Duration::from_secs(86_400));
    let issuer = Issuer::new(IssuerParts {
        td: testutil::td(),
        clock,
        serials: Arc::new(SequentialSerials::new(1)),
        authority: Arc::new(authority),
        policy,
        jwt: None,
        ledger,
        store: store.clone(),
        audit: AuditLog::spawn(store.clone(), 64),
        metrics: crate::metrics::Metrics::new(),
    })
    .with_jwt_svids(
        Arc::new(Fixed(with_key.then(|| key.clone()))),
        JwtIssuePolicy::default(),
    );
    Rig {
        issuer,
        store,
        key,
        _dir: dir,
    }
}

/// An X509-SVID for `path`, minted by the operator (recorded like any other), as mTLS
/// credentials.
async fn mtls_creds(r: &Rig, path: &str) -> Credentials {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let csr = crate::ca::csr::tests::csr_with(&key, vec![]);
    let caller = AuthenticatedCaller::admin(&testutil::td(), AdminSocket::for_fuzzing());
    let cert = r
        .issuer
        .issue(
            &caller,
            IssueInput {
                csr: &csr,
                ttl_seconds: 0,
                impersonate: None,
                request_id: "mint".into(),
                api: "admin",
                extra_names: Some(RequestedNames {
                    uris: vec![testutil::id(path).to_string()],
                    ..RequestedNames::default()
                }),
                source: GrantSource::Caller,
            },
        )
        .await
        .unwrap();
    Credentials {
        authorization: None,
        peer_leaf: Some(cert.der.clone()),
    }
}

fn input<'a>(audience: &'a [String], source: GrantSource<'a>) -> JwtInput<'a> {
    JwtInput {
        source,
        audience,
        ttl_seconds: 0,
        entry_ttl_seconds: 0,
        request_id: "req-jwt".into(),
        api: "native_jwt",
    }
}

#[tokio::test]
async fn an_mtls_caller_gets_a_token_for_its_own_identity_recorded_on_the_ledger() {
    let r = rig(true).await;
    let creds = mtls_creds(&r, "/web").await;
    let aud = vec!["https://api.example.org".to_owned(), "vault".to_owned()];
    let t = r
        .issuer
        .authenticate_and_mint_jwt(&creds, input(&aud, GrantSource::Caller))
        .await
        .unwrap();
    assert_eq!(t.claims.subject, testutil::id("/web"));
    let keys = JwtKeySet::new([r.key.signer.public_key().clone()]);
    let v = validate(t.token(), "vault", &keys, t.claims.issued_at).unwrap();
    assert_eq!(v.spiffe_id, testutil::id("/web"));

    // The row committed before the token came back: it is there, with the token's hash only.
    let rows = r.store.list_jwt_svids(0, 10, None).await.unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.entry.token_sha256, sha256(t.token().as_bytes()));
    assert_eq!(row.entry.spiffe_id, "spiffe://example.org/web");
    assert_eq!(row.entry.audience, aud);
    assert_eq!(row.entry.key_id, r.key.signer.key_id());
    assert!(
        row.entry.caller.starts_with("mtls:"),
        "{}",
        row.entry.caller
    );
    assert!(
        row.entry.provenance.contains("admin"),
        "{}",
        row.entry.provenance
    );
    assert!(row.hashes_to_itself());
    // It follows the certificate row in the one chain.
    assert_eq!(row.entry.seq, 2);
    assert_eq!(r.store.ledger_head().await.unwrap().hash, row.hash);
}

#[tokio::test]
async fn refusals_keep_signcsr_codes_and_record_nothing() {
    let r = rig(true).await;
    let creds = mtls_creds(&r, "/web").await;
    let none: Vec<String> = vec![];
    let err = r
        .issuer
        .authenticate_and_mint_jwt(&creds, input(&none, GrantSource::Caller))
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), "invalid_argument", "{err}");
    assert!(err.to_string().contains("no audience"), "{err}");

    // No credentials: Unauthenticated, as SignCsr.
    let aud = vec!["a".to_owned()];
    let err = r
        .issuer
        .authenticate_and_mint_jwt(&Credentials::default(), input(&aud, GrantSource::Caller))
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), "unauthenticated");

    // The bridge's namespace form is policy's to refuse for a caller that is no bridge.
    let err = r
        .issuer
        .authenticate_and_mint_jwt(
            &creds,
            input(
                &aud,
                GrantSource::Bridge {
                    namespace: "default",
                },
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), "permission_denied", "{err}");

    // A node asking for another node's entry: PermissionDenied by policy.
    let node = AuthenticatedCaller::for_tests(
        testutil::id("/signet/node/n1"),
        CallerKind::Node {
            node_id: "n1".into(),
            serial: Some("01".into()),
            leaf_sha256: Some([0; 32]),
        },
    );
    let grant = EntryGrant {
        entry_id: "e1".into(),
        spiffe_id: testutil::id("/app"),
        parent_id: testutil::id("/signet/node/n2"),
        dns_names: vec![],
        ttl_seconds: 0,
        node_set: None,
    };
    let err = r
        .issuer
        .mint_jwt(&node, input(&aud, GrantSource::Entry(&grant)))
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), "permission_denied", "{err}");
    // Its own entry: a token, with the entry's JWT lifetime.
    let own = EntryGrant {
        parent_id: testutil::id("/signet/node/n1"),
        ..grant
    };
    let t = r
        .issuer
        .mint_jwt(
            &node,
            JwtInput {
                entry_ttl_seconds: 120,
                ..input(&aud, GrantSource::Entry(&own))
            },
        )
        .await
        .unwrap();
    assert_eq!(t.claims.expires_at - t.claims.issued_at, 120);
    assert_eq!(t.claims.subject, testutil::id("/app"));
    // Only that token is on the ledger.
    assert_eq!(r.store.list_jwt_svids(0, 10, None).await.unwrap().len(), 1);
}

#[tokio::test]
async fn without_an_active_key_minting_is_unavailable_and_says_so() {
    let r = rig(false).await;
    let creds = mtls_creds(&r, "/web").await;
    let aud = vec!["a".to_owned()];
    let err = r
        .issuer
        .authenticate_and_mint_jwt(&creds, input(&aud, GrantSource::Caller))
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), "unavailable");
    assert!(
        err.to_string()
            .contains("no JWT-SVID signing key is active"),
        "{err}"
    );
    assert!(
        r.store
            .list_jwt_svids(0, 10, None)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Review finding F1: a hostile workload flooding its agent with new audiences (each a server
/// mint and a ledger row) is held to its own identity's share, not its node's: past
/// `issuance_per_caller` it is refused (ResourceExhausted with a retry hint) while another
/// identity on the same node still gets tokens.
#[tokio::test]
async fn a_nodes_mints_for_one_identity_are_held_to_that_identitys_rate() {
    let r = rig(true).await;
    let limits = crate::config::LimitsConfig {
        issuance_per_caller: crate::config::RateConfig::new(3, 0.001),
        ..Default::default()
    };
    let issuer = r
        .issuer
        .with_caller_limits(Arc::new(crate::limits::CallerLimits::new(&limits)));
    let node = AuthenticatedCaller::for_tests(
        testutil::id("/signet/node/n1"),
        CallerKind::Node {
            node_id: "n1".into(),
            serial: Some("01".into()),
            leaf_sha256: Some([0; 32]),
        },
    );
    let grant = |path: &str| EntryGrant {
        entry_id: path.into(),
        spiffe_id: testutil::id(path),
        parent_id: testutil::id("/signet/node/n1"),
        dns_names: vec![],
        ttl_seconds: 0,
        node_set: None,
    };
    let (hostile, neighbour) = (grant("/mallory"), grant("/web"));
    for i in 0..3 {
        let aud = vec![format!("aud-{i}")];
        issuer
            .mint_jwt(&node, input(&aud, GrantSource::Entry(&hostile)))
            .await
            .unwrap();
    }
    let aud = vec!["aud-3".to_owned()];
    let err = issuer
        .mint_jwt(&node, input(&aud, GrantSource::Entry(&hostile)))
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), "resource_exhausted", "{err}");
    // The neighbour on the same node is untouched.
    issuer
        .mint_jwt(&node, input(&aud, GrantSource::Entry(&neighbour)))
        .await
        .unwrap();
    assert_eq!(r.store.list_jwt_svids(0, 10, None).await.unwrap().len(), 4);
}
