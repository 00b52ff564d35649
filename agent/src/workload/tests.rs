use super::*;
use crate::state::channel;
use futures::StreamExt;
use signet_pki::X509Svid;

fn me() -> Caller {
    Caller::host(1000, 1000, Some(1), None)
}

/// The `key`th SVID of `spiffe://example.org/app` (chain of two: leaf, CA).
fn svid(key: u8) -> Arc<X509Svid> {
    crate::testing::delivered("spiffe://example.org/app", key).svid
}

fn state_with(uid: u32, key: u8) -> AgentState {
    AgentState {
        identities: vec![Identity {
            entry_id: "e1".into(),
            selectors: vec![crate::state::Selector::Uid(uid)],
            svid: svid(key),
            federates_with: vec![],
        }],
        bundle_der: vec![vec![9], vec![8]].into(),
        trust_domain_id: "spiffe://example.org".into(),
        crls_der: Default::default(),
        ..Default::default()
    }
}

fn req<T>(msg: T, header: bool) -> Request<T> {
    let mut r = Request::new(msg);
    if header {
        r.metadata_mut()
            .insert(SECURITY_HEADER, "true".parse().expect("value"));
    }
    r.extensions_mut().insert(PeerInfo::fixed(me()));
    r
}

#[tokio::test]
async fn missing_header_is_invalid_argument() {
    let (_tx, rx) = channel();
    let api = WorkloadApi::new(rx, Attestor::default());
    let err = api
        .fetch_x509svid(req(pb::X509svidRequest {}, false))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn no_identity_is_permission_denied() {
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(state_with(2000, 1)));
    let api = WorkloadApi::new(rx, Attestor::default());
    let err = api
        .fetch_x509svid(req(pb::X509svidRequest {}, true))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let err = api
        .fetch_x509_bundles(req(pb::X509BundlesRequest {}, true))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
}

#[tokio::test]
async fn streams_current_state_then_changes_then_denies() {
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(state_with(1000, 1)));
    let api = WorkloadApi::new(rx, Attestor::default());
    let mut s = api
        .fetch_x509svid(req(pb::X509svidRequest {}, true))
        .await
        .expect("stream")
        .into_inner();
    let first = s.next().await.expect("item").expect("ok");
    assert_eq!(first.svids.len(), 1);
    assert_eq!(first.svids[0].spiffe_id, "spiffe://example.org/app");
    assert_eq!(
        first.svids[0].x509_svid,
        svid(1).certificate().chain_der().concat()
    );
    assert_eq!(first.svids[0].x509_svid_key, svid(1).key().pkcs8_der());
    assert_eq!(first.svids[0].bundle, [9, 8]);

    // A change that does not concern this caller's view is not resent.
    let mut same = state_with(1000, 1);
    same.identities.push(Identity {
        entry_id: "other".into(),
        ..state_with(5, 0).identities.remove(0)
    });
    tx.send_replace(Arc::new(same));
    tx.send_replace(Arc::new(state_with(1000, 2)));
    let second = s.next().await.expect("item").expect("ok");
    assert_eq!(second.svids[0].x509_svid_key, svid(2).key().pkcs8_der());

    tx.send_replace(Arc::new(state_with(2000, 3)));
    let err = s.next().await.expect("item").expect_err("denied");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(s.next().await.is_none());
}

#[tokio::test]
async fn bundles_are_keyed_by_trust_domain() {
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(state_with(1000, 1)));
    let api = WorkloadApi::new(rx, Attestor::default());
    let mut s = api
        .fetch_x509_bundles(req(pb::X509BundlesRequest {}, true))
        .await
        .expect("stream")
        .into_inner();
    let b = s.next().await.expect("item").expect("ok");
    assert_eq!(b.bundles.get("spiffe://example.org"), Some(&vec![9, 8]));
}

#[tokio::test]
async fn stream_ends_when_agent_stops() {
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(state_with(1000, 1)));
    let api = WorkloadApi::new(rx, Attestor::default());
    let mut s = api
        .fetch_x509svid(req(pb::X509svidRequest {}, true))
        .await
        .expect("stream")
        .into_inner();
    s.next().await.expect("item").expect("ok");
    drop(api);
    drop(tx);
    assert!(s.next().await.is_none());
}

#[tokio::test]
async fn without_a_jwt_cache_fetch_jwtsvid_is_unimplemented() {
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(state_with(1000, 1)));
    let api = WorkloadApi::new(rx, Attestor::default());
    let e = api
        .fetch_jwtsvid(req(jwt_req(&["x"], ""), true))
        .await
        .expect_err("unimplemented");
    assert_eq!(e.code(), tonic::Code::Unimplemented);
}

// --- the JWT profile ------------------------------------------------------------------------

use crate::ca::{CaError, MintedJwt};
use crate::jwt_cache::{JwtCache, JwtMinter};
use signet_pki::jwt::{JwtSigner, JwtSvidClaims};
use signet_runtime::clock::{FakeClock, unix};
use std::sync::atomic::{AtomicUsize, Ordering};

const T0: i64 = 1_700_000_000;

/// Mints real tokens with `signer` for the entries of [`jwt_state`] (`e1`: `/app`, `e2`:
/// `/db`), counting its calls.
struct SignerMinter {
    signer: std::sync::Mutex<Arc<JwtSigner>>,
    clock: FakeClock,
    calls: AtomicUsize,
}

#[async_trait::async_trait]
impl JwtMinter for SignerMinter {
    async fn mint(&self, entry_id: &str, audience: &[String]) -> Result<MintedJwt, CaError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let subject: SpiffeId = match entry_id {
            "e1" => "spiffe://example.org/app",
            "e2" => "spiffe://example.org/db",
            _ => return Err(CaError::Invalid("unknown entry".into())),
        }
        .parse()
        .expect("id");
        let now = unix(self.clock.now());
        let signer = self.signer.lock().expect("lock").clone();
        let claims = JwtSvidClaims {
            subject: subject.clone(),
            audience: audience.to_vec(),
            issued_at: now,
            expires_at: now + 300,
            issuer: None,
        };
        Ok(MintedJwt {
            token: signer.mint(&claims).expect("mint"),
            spiffe_id: subject,
            issued_at: now,
            expires_at: now + 300,
            key_id: signer.key_id().to_owned(),
            audience: audience.to_vec(),
        })
    }
}

fn signer() -> Arc<JwtSigner> {
    let key = signet_pki::generate(signet_pki::KeyAlgorithm::EcdsaP256).expect("key");
    Arc::new(JwtSigner::new(&key).expect("signer"))
}

/// uid 1000 is `/app` (entry e1), uid 2000 `/db` (e2); the JWT keys are `keys`' public halves.
fn jwt_state(keys: &[&JwtSigner], tainted: &[&str]) -> AgentState {
    let db = crate::testing::delivered("spiffe://example.org/db", 7).svid;
    let mut s = state_with(1000, 1);
    s.identities.push(Identity {
        entry_id: "e2".into(),
        selectors: vec![crate::state::Selector::Uid(2000)],
        svid: db,
        federates_with: vec![],
    });
    s.jwt_keys = keys.iter().map(|k| k.public_key().clone()).collect();
    s.jwt_tainted = tainted.iter().map(|t| (*t).to_owned()).collect();
    s
}

struct Jwt {
    api: WorkloadApi,
    tx: crate::state::StateSender,
    minter: Arc<SignerMinter>,
    clock: FakeClock,
    metrics: Arc<WorkloadMetrics>,
}

fn jwt_api(signer: Arc<JwtSigner>) -> Jwt {
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(jwt_state(&[&signer], &[])));
    let clock = FakeClock::at_unix(T0);
    let minter = Arc::new(SignerMinter {
        signer: std::sync::Mutex::new(signer),
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let cache = Arc::new(JwtCache::new(minter.clone(), Arc::new(clock.clone()), 64));
    let metrics = Arc::new(WorkloadMetrics::default());
    let api = WorkloadApi::new(rx, Attestor::default())
        .with_jwt(cache, Arc::new(clock.clone()))
        .with_metrics(metrics.clone());
    Jwt {
        api,
        tx,
        minter,
        clock,
        metrics,
    }
}

fn jwt_req(audience: &[&str], spiffe_id: &str) -> pb::JwtsvidRequest {
    pb::JwtsvidRequest {
        audience: audience.iter().map(|a| (*a).to_owned()).collect(),
        spiffe_id: spiffe_id.into(),
    }
}

fn as_caller<T>(mut r: Request<T>, uid: u32) -> Request<T> {
    r.extensions_mut()
        .insert(PeerInfo::fixed(Caller::host(uid, uid, Some(1), None)));
    r
}

fn validate_req(audience: &str, token: &str) -> Request<pb::ValidateJwtsvidRequest> {
    req(
        pb::ValidateJwtsvidRequest {
            audience: audience.into(),
            svid: token.into(),
        },
        true,
    )
}

async fn code_of<T: std::fmt::Debug>(r: Result<Response<T>, Status>) -> (tonic::Code, String) {
    let e = r.expect_err("refused");
    (e.code(), e.message().to_owned())
}

#[tokio::test]
async fn jwt_requests_without_the_header_are_invalid_argument() {
    let j = jwt_api(signer());
    let (c, _) = code_of(j.api.fetch_jwtsvid(req(jwt_req(&["x"], ""), false)).await).await;
    assert_eq!(c, tonic::Code::InvalidArgument);
    let (c, _) = code_of(
        j.api
            .validate_jwtsvid(req(pb::ValidateJwtsvidRequest::default(), false))
            .await,
    )
    .await;
    assert_eq!(c, tonic::Code::InvalidArgument);
    let e = j
        .api
        .fetch_jwt_bundles(req(pb::JwtBundlesRequest {}, false))
        .await
        .err()
        .expect("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn fetch_jwtsvid_refuses_bad_requests_and_callers_not_entitled() {
    let j = jwt_api(signer());
    let cases: Vec<(pb::JwtsvidRequest, u32, tonic::Code, &str)> = vec![
        (
            jwt_req(&[], ""),
            1000,
            tonic::Code::InvalidArgument,
            "audience must be specified",
        ),
        (
            jwt_req(&[""], ""),
            1000,
            tonic::Code::InvalidArgument,
            "empty",
        ),
        (
            jwt_req(&["a"; 33], ""),
            1000,
            tonic::Code::InvalidArgument,
            "at most 32",
        ),
        (
            jwt_req(&["x"], "not an id"),
            1000,
            tonic::Code::InvalidArgument,
            "spiffe_id",
        ),
        // Another entry's identity.
        (
            jwt_req(&["x"], "spiffe://example.org/db"),
            1000,
            tonic::Code::PermissionDenied,
            "no identity issued for spiffe://example.org/db",
        ),
        // No identity at all.
        (
            jwt_req(&["x"], ""),
            3000,
            tonic::Code::PermissionDenied,
            "no identity issued",
        ),
    ];
    for (r, uid, code, message) in cases {
        let (c, m) = code_of(
            j.api
                .fetch_jwtsvid(as_caller(req(r.clone(), true), uid))
                .await,
        )
        .await;
        assert_eq!(c, code, "{r:?}: {m}");
        assert!(m.contains(message), "{r:?}: {m}");
    }
    assert_eq!(j.minter.calls.load(Ordering::SeqCst), 0, "nothing minted");
}

#[tokio::test]
async fn fetch_jwtsvid_serves_each_callers_own_token_from_the_cache() {
    let j = jwt_api(signer());
    let app = j
        .api
        .fetch_jwtsvid(req(jwt_req(&["svc-b", "svc-a"], ""), true))
        .await
        .expect("app")
        .into_inner();
    assert_eq!(app.svids.len(), 1);
    assert_eq!(app.svids[0].spiffe_id, "spiffe://example.org/app");
    assert_eq!(app.svids[0].hint, "");
    // Named, reversed audiences: the same cached token.
    let again = j
        .api
        .fetch_jwtsvid(req(
            jwt_req(&["svc-a", "svc-b"], "spiffe://example.org/app"),
            true,
        ))
        .await
        .expect("again")
        .into_inner();
    assert_eq!(again.svids[0].svid, app.svids[0].svid);
    assert_eq!(j.minter.calls.load(Ordering::SeqCst), 1);
    // Another uid gets its own identity's token, never the cached one of /app.
    let db = j
        .api
        .fetch_jwtsvid(as_caller(req(jwt_req(&["svc-a", "svc-b"], ""), true), 2000))
        .await
        .expect("db")
        .into_inner();
    assert_eq!(db.svids[0].spiffe_id, "spiffe://example.org/db");
    assert_ne!(db.svids[0].svid, app.svids[0].svid);
    // The relying party validates it.
    let v = j
        .api
        .validate_jwtsvid(validate_req("svc-a", &app.svids[0].svid))
        .await
        .expect("valid")
        .into_inner();
    assert_eq!(v.spiffe_id, "spiffe://example.org/app");
    let claims = v.claims.expect("claims").fields;
    assert_eq!(
        claims["sub"].kind,
        Some(prost_types::value::Kind::StringValue(
            "spiffe://example.org/app".into()
        ))
    );
    assert_eq!(
        claims["exp"].kind,
        Some(prost_types::value::Kind::NumberValue((T0 + 300) as f64))
    );
    let count = |source: &str| {
        j.metrics
            .jwt_svids
            .get_or_create(&vec![("source", source.to_owned())])
            .get()
    };
    assert_eq!((count("minted"), count("cache")), (2, 1));
}

#[tokio::test]
async fn a_tainted_key_s_cached_tokens_are_replaced_by_the_new_key_s() {
    let old = signer();
    let j = jwt_api(old.clone());
    let first = j
        .api
        .fetch_jwtsvid(req(jwt_req(&["x"], ""), true))
        .await
        .expect("first")
        .into_inner();
    let new = signer();
    *j.minter.signer.lock().expect("lock") = new.clone();
    j.tx.send_replace(Arc::new(jwt_state(&[&old, &new], &[old.key_id()])));
    let second = j
        .api
        .fetch_jwtsvid(req(jwt_req(&["x"], ""), true))
        .await
        .expect("second")
        .into_inner();
    assert_ne!(second.svids[0].svid, first.svids[0].svid);
    let header = second.svids[0].svid.split('.').next().expect("header");
    use base64::Engine;
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .expect("b64");
    assert!(
        String::from_utf8_lossy(&header).contains(new.key_id()),
        "signed by the new key"
    );
}

#[tokio::test]
async fn validate_jwtsvid_refuses_every_invalid_token_with_the_reason() {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let signer = signer();
    let j = jwt_api(signer.clone());
    let good = j
        .api
        .fetch_jwtsvid(req(jwt_req(&["svc"], ""), true))
        .await
        .expect("token")
        .into_inner()
        .svids
        .remove(0)
        .svid;
    let payload = b64(&format!(
        r#"{{"sub":"spiffe://example.org/app","aud":"svc","exp":{}}}"#,
        T0 + 300
    ));
    let forged = |header: &str| format!("{}.{payload}.{}", b64(header), b64("sig"));
    let kid = signer.key_id();
    let other = signer_token(&self::signer(), "spiffe://example.org/app", "svc");
    let foreign = signer_token(&signer, "spiffe://other.org/app", "svc");
    let cases: Vec<(&str, String, &str)> = vec![
        ("", good.clone(), "audience must be specified"),
        ("svc", String::new(), "svid must be specified"),
        ("svc", "garbage".into(), "not a compact JWS"),
        ("svc", forged(r#"{"alg":"none"}"#), "alg none is refused"),
        (
            "svc",
            forged(&format!(r#"{{"alg":"HS256","kid":"{kid}"}}"#)),
            "alg HS256 is refused",
        ),
        ("svc", other, "is not in the trust bundle"),
        (
            "svc",
            forged(&format!(r#"{{"alg":"ES256","kid":"{kid}"}}"#)),
            "signature",
        ),
        ("other-audience", good.clone(), "not for audience"),
        ("svc", foreign, "no keys for trust domain other.org"),
    ];
    for (audience, token, message) in cases {
        let (c, m) = code_of(j.api.validate_jwtsvid(validate_req(audience, &token)).await).await;
        assert_eq!(c, tonic::Code::InvalidArgument, "{message}: {m}");
        assert!(m.contains(message), "{message}: {m}");
    }
    j.clock.advance(std::time::Duration::from_secs(301));
    let (c, m) = code_of(j.api.validate_jwtsvid(validate_req("svc", &good)).await).await;
    assert_eq!(
        (c, m.contains("expired")),
        (tonic::Code::InvalidArgument, true),
        "{m}"
    );
    let count = |result: &str| {
        j.metrics
            .jwt_validations
            .get_or_create(&vec![("result", result.to_owned())])
            .get()
    };
    assert_eq!((count("alg"), count("expired"), count("valid")), (2, 1, 0));
}

fn signer_token(signer: &JwtSigner, sub: &str, aud: &str) -> String {
    signer
        .mint(&JwtSvidClaims {
            subject: sub.parse().expect("id"),
            audience: vec![aud.into()],
            issued_at: T0,
            expires_at: T0 + 300,
            issuer: None,
        })
        .expect("mint")
}

#[tokio::test]
async fn jwt_bundles_stream_the_trust_domains_jwks_and_each_change() {
    let s1 = signer();
    let j = jwt_api(s1.clone());
    let mut stream = j
        .api
        .fetch_jwt_bundles(req(pb::JwtBundlesRequest {}, true))
        .await
        .expect("stream")
        .into_inner();
    let jwks = |item: pb::JwtBundlesResponse| -> serde_json::Value {
        assert_eq!(item.bundles.len(), 1);
        serde_json::from_slice(&item.bundles["example.org"]).expect("json")
    };
    let first = jwks(stream.next().await.expect("item").expect("ok"));
    let keys = first["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["kid"], s1.key_id());
    assert_eq!(
        (keys[0]["alg"].as_str(), keys[0]["use"].as_str()),
        (Some("ES256"), Some("jwt-svid"))
    );
    let s2 = signer();
    j.tx.send_replace(Arc::new(jwt_state(&[&s1, &s2], &[])));
    let second = jwks(stream.next().await.expect("item").expect("ok"));
    assert_eq!(second["keys"].as_array().expect("keys").len(), 2);
    // A caller without an identity gets none.
    let e = j
        .api
        .fetch_jwt_bundles(as_caller(req(pb::JwtBundlesRequest {}, true), 3000))
        .await
        .err()
        .expect("refused");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
}

/// A fake /proc holding one process, 4242, running `exe`, started at `start`.
fn fake_process(root: &std::path::Path, exe: &str, start: u64) {
    let dir = root.join("4242");
    std::fs::create_dir_all(&dir).expect("dir");
    let stat = format!(
        "4242 (app) S 1 4242 4242 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0 0 0 0 0 0 0 0 0"
    );
    std::fs::write(dir.join("stat"), stat).expect("stat");
    std::fs::write(dir.join("cgroup"), "0::/user.slice\n").expect("cgroup");
    let _ = std::fs::remove_file(dir.join("exe"));
    std::os::unix::fs::symlink(exe, dir.join("exe")).expect("exe");
}

fn path_state(key: u8) -> AgentState {
    let mut s = state_with(1000, key);
    s.identities[0].selectors = vec![
        crate::state::Selector::Uid(1000),
        crate::state::Selector::Path("/usr/bin/app".into()),
    ];
    s
}

fn process_req<T>(msg: T, peer: &PeerInfo) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert(SECURITY_HEADER, "true".parse().expect("value"));
    r.extensions_mut().insert(peer.clone());
    r
}

#[tokio::test]
async fn every_request_on_a_connection_is_attested_again() {
    let root = tempfile::tempdir().expect("tempdir");
    fake_process(root.path(), "/usr/bin/app", 100);
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(path_state(1)));
    let api = WorkloadApi::new(rx, Attestor::default());
    let peer = PeerInfo::process(crate::attest::PeerProcess::from_parts(
        1000,
        1000,
        Some(4242),
        None,
        Some(100),
        root.path(),
    ));
    let mut s = api
        .fetch_x509svid(process_req(pb::X509svidRequest {}, &peer))
        .await
        .expect("the allowed binary")
        .into_inner();
    assert_eq!(s.next().await.expect("item").expect("ok").svids.len(), 1);

    // The same connection, after the process execs another binary: refused.
    fake_process(root.path(), "/usr/bin/other", 100);
    let err = api
        .fetch_x509svid(process_req(pb::X509svidRequest {}, &peer))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    // And the open stream's next update is for the caller as it is now: denied, end.
    tx.send_replace(Arc::new(path_state(2)));
    let err = s.next().await.expect("item").expect_err("denied");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(s.next().await.is_none());
}

#[tokio::test]
async fn a_stream_ends_when_its_pid_is_reused() {
    let root = tempfile::tempdir().expect("tempdir");
    fake_process(root.path(), "/usr/bin/app", 100);
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(path_state(1)));
    let api = WorkloadApi::new(rx, Attestor::default());
    let peer = PeerInfo::process(crate::attest::PeerProcess::from_parts(
        1000,
        1000,
        Some(4242),
        None,
        Some(100),
        root.path(),
    ));
    let mut s = api
        .fetch_x509_bundles(process_req(pb::X509BundlesRequest {}, &peer))
        .await
        .expect("stream")
        .into_inner();
    s.next().await.expect("item").expect("ok");
    // The process exits; another one, running the same binary, gets pid 4242.
    fake_process(root.path(), "/usr/bin/app", 200);
    tx.send_replace(Arc::new(path_state(2)));
    let err = s.next().await.expect("item").expect_err("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message().contains("another process"),
        "{}",
        err.message()
    );
    let err = api
        .fetch_x509svid(process_req(pb::X509svidRequest {}, &peer))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
}

struct KubeletDown;

#[async_trait::async_trait]
impl crate::attest::k8s::PodLister for KubeletDown {
    async fn list(&self) -> Result<Vec<crate::attest::PodInfo>, crate::attest::K8sError> {
        Err(crate::attest::K8sError(
            "connect 127.0.0.1:10250: refused".into(),
        ))
    }
}

#[tokio::test]
async fn a_pod_whose_kubelet_cannot_be_asked_gets_unavailable() {
    let root = tempfile::tempdir().expect("tempdir");
    fake_process(root.path(), "/usr/bin/app", 100);
    std::fs::write(
            root.path().join("4242/cgroup"),
            "0::/kubepods/besteffort/pod2c48913c-b29f-11e7-9350-020968147796/9bca8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961\n",
        )
        .expect("cgroup");
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(state_with(1000, 1)));
    let k8s = crate::attest::K8sAttestor::new(
        Arc::new(KubeletDown),
        std::time::Duration::from_secs(5),
        std::time::Duration::ZERO,
    );
    let attestor = Attestor::default().with_kubernetes(Arc::new(k8s));
    let api = WorkloadApi::new(rx, attestor);
    let peer = PeerInfo::process(crate::attest::PeerProcess::from_parts(
        1000,
        1000,
        Some(4242),
        None,
        Some(100),
        root.path(),
    ));
    let err = api
        .fetch_x509svid(process_req(pb::X509svidRequest {}, &peer))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
}

#[test]
fn bind_replaces_stale_socket_but_not_files() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("agent.sock");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        drop(bind(&sock).expect("first bind"));
        let l = bind(&sock).expect("rebinds over a stale socket");
        let mode = std::fs::metadata(&sock).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o777);
        drop(l);
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        assert!(matches!(bind(&file), Err(ListenError::NotASocket(_))));
        assert_eq!(std::fs::read(&file).expect("kept"), b"x");
        // A restrictive mode and a group, set before the socket is reachable by name;
        // the private staging directory is gone.
        let gid = std::fs::metadata("/proc/self").expect("self").gid();
        let l = bind_with(&sock, 0o660, Some(gid)).expect("bind 0660");
        let m = std::fs::metadata(&sock).expect("meta");
        assert_eq!(m.permissions().mode() & 0o777, 0o660);
        assert_eq!(m.gid(), gid);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
        drop(l);
    });
}

// --- federation ---------------------------------------------------------------------------

const PARTNER: &str = "partner.example";

/// `jwt_state` with a federated bundle for [`PARTNER`] (`root`'s DER, `partner`'s JWT key):
/// uid 1000's entry (e1, `/app`) federates with it, uid 2000's (e2, `/db`) does not.
fn federated_state(own: &JwtSigner, partner: &JwtSigner, root: &[u8]) -> AgentState {
    let mut s = jwt_state(&[own], &[]);
    s.identities[0].federates_with = vec![PARTNER.parse().expect("td")];
    s.federated = vec![crate::state::FederatedBundle {
        trust_domain: PARTNER.parse().expect("td"),
        roots_der: vec![root.to_vec()].into(),
        jwt_keys: vec![partner.public_key().clone()].into(),
    }]
    .into();
    s
}

fn partner_root() -> Vec<u8> {
    crate::testing::TestCa::new("partner root").der
}

async fn first<T>(r: Result<Response<WatchStream<T>>, Status>) -> T {
    r.expect("stream")
        .into_inner()
        .next()
        .await
        .expect("item")
        .expect("ok")
}

/// Whether `s` sends nothing for a while.
async fn quiet<T>(s: &mut WatchStream<T>) -> bool {
    tokio::time::timeout(std::time::Duration::from_millis(200), s.next())
        .await
        .is_err()
}

/// What the caller of uid `uid` gets from the three bundle-carrying APIs: the X509-SVID
/// response's federated bundles, the X.509 bundles' keys and the JWT bundles' keys.
async fn bundles_seen(
    api: &WorkloadApi,
    uid: u32,
) -> (
    HashMap<String, Vec<u8>>,
    Vec<String>,
    HashMap<String, Vec<u8>>,
) {
    let svid: pb::X509svidResponse = first(
        api.fetch_x509svid(as_caller(req(pb::X509svidRequest {}, true), uid))
            .await,
    )
    .await;
    let x509: pb::X509BundlesResponse = first(
        api.fetch_x509_bundles(as_caller(req(pb::X509BundlesRequest {}, true), uid))
            .await,
    )
    .await;
    let jwt: pb::JwtBundlesResponse = first(
        api.fetch_jwt_bundles(as_caller(req(pb::JwtBundlesRequest {}, true), uid))
            .await,
    )
    .await;
    let mut x509_keys: Vec<String> = x509.bundles.keys().cloned().collect();
    x509_keys.sort();
    (svid.federated_bundles, x509_keys, jwt.bundles)
}

#[tokio::test]
async fn a_federated_bundle_reaches_only_callers_whose_entries_federate() {
    let (own, partner, root) = (signer(), signer(), partner_root());
    let j = jwt_api(own.clone());
    j.tx.send_replace(Arc::new(federated_state(&own, &partner, &root)));

    let (fed, x509, jwt) = bundles_seen(&j.api, 1000).await;
    assert_eq!(fed.len(), 1);
    assert_eq!(fed["spiffe://partner.example"], root);
    assert_eq!(x509, ["spiffe://example.org", "spiffe://partner.example"]);
    let jwks: serde_json::Value = serde_json::from_slice(&jwt[PARTNER]).expect("json");
    assert_eq!(jwks["keys"][0]["kid"], partner.key_id());
    assert_eq!(jwks["keys"].as_array().expect("keys").len(), 1);
    assert!(jwt.contains_key("example.org"));

    // Attack: a caller whose entry does not federate gets none of it, anywhere.
    let (fed, x509, jwt) = bundles_seen(&j.api, 2000).await;
    assert!(fed.is_empty(), "{fed:?}");
    assert_eq!(x509, ["spiffe://example.org"]);
    assert_eq!(jwt.keys().collect::<Vec<_>>(), ["example.org"]);
    for b in jwt.values() {
        assert!(!String::from_utf8_lossy(b).contains(partner.key_id()));
    }
}

#[tokio::test]
async fn validate_jwtsvid_picks_the_keys_of_the_tokens_trust_domain() {
    let (own, partner, root) = (signer(), signer(), partner_root());
    let j = jwt_api(own.clone());
    j.tx.send_replace(Arc::new(federated_state(&own, &partner, &root)));
    let validate = |uid: u32, token: String| {
        let api = j.api.clone();
        async move {
            api.validate_jwtsvid(as_caller(validate_req("aud", &token), uid))
                .await
        }
    };
    // A partner token validates with the partner's key for a caller that federates.
    let foreign = signer_token(&partner, "spiffe://partner.example/x", "aud");
    let ok = validate(1000, foreign.clone())
        .await
        .expect("valid")
        .into_inner();
    assert_eq!(ok.spiffe_id, "spiffe://partner.example/x");
    // ... and is refused for one that does not.
    let (c, m) = code_of(validate(2000, foreign).await).await;
    assert_eq!(c, tonic::Code::InvalidArgument);
    assert!(m.contains(PARTNER), "{m}");
    // Our trust domain claimed, signed by the partner's key: our keys do not know it.
    let forged = signer_token(&partner, "spiffe://example.org/app", "aud");
    let (c, m) = code_of(validate(1000, forged).await).await;
    assert_eq!(c, tonic::Code::InvalidArgument);
    assert!(m.contains(partner.key_id()), "{m}");
    // The partner's trust domain claimed, signed by our key: the partner's keys do not know it.
    let forged = signer_token(&own, "spiffe://partner.example/x", "aud");
    let (c, m) = code_of(validate(1000, forged).await).await;
    assert_eq!(c, tonic::Code::InvalidArgument);
    assert!(m.contains(own.key_id()), "{m}");
    // Our own tokens still validate with our keys, for either caller.
    let mine = signer_token(&own, "spiffe://example.org/app", "aud");
    for uid in [1000, 2000] {
        validate(uid, mine.clone()).await.expect("own token");
    }
}

/// The unverified subject only chooses the key set: a partner token is validated with the
/// partner's keys even when the same key also (wrongly) sits in our own set, and comes out as
/// the partner's SPIFFE ID; an unreadable token claims nothing.
#[test]
fn the_tokens_subject_only_chooses_the_key_set() {
    let (own, partner, root) = (signer(), signer(), partner_root());
    let mut st = federated_state(&own, &partner, &root);
    // The same key listed for both trust domains (a misconfiguration).
    st.jwt_keys = vec![own.public_key().clone(), partner.public_key().clone()].into();
    let mine: Vec<&Identity> = st.identities.iter().take(1).collect();
    let token = signer_token(&partner, "spiffe://partner.example/x", "aud");
    let ok = jwt::validate(&st, &mine, "aud", &token, T0).expect("valid with partner keys");
    assert_eq!(ok.spiffe_id, "spiffe://partner.example/x");
    assert_eq!(
        jwt::claimed_trust_domain(&token).map(|t| t.as_str().to_owned()),
        Some(PARTNER.to_owned())
    );
    assert_eq!(jwt::claimed_trust_domain("not.a.token"), None);
    assert_eq!(jwt::claimed_trust_domain(""), None);
}

#[tokio::test]
async fn a_federated_bundle_change_is_pushed_to_the_callers_that_federate_only() {
    let (own, partner, root) = (signer(), signer(), partner_root());
    let j = jwt_api(own.clone());
    j.tx.send_replace(Arc::new(federated_state(&own, &partner, &root)));
    let open = |uid: u32| {
        let api = j.api.clone();
        async move {
            api.fetch_x509svid(as_caller(req(pb::X509svidRequest {}, true), uid))
                .await
                .expect("stream")
                .into_inner()
        }
    };
    let (mut fed, mut other) = (open(1000).await, open(2000).await);
    let mut jwt_fed = j
        .api
        .fetch_jwt_bundles(req(pb::JwtBundlesRequest {}, true))
        .await
        .expect("stream")
        .into_inner();
    fed.next().await.expect("first").expect("ok");
    other.next().await.expect("first").expect("ok");
    jwt_fed.next().await.expect("first").expect("ok");

    // The same bundle again (a new state, equal content): nothing is pushed.
    j.tx.send_replace(Arc::new(federated_state(&own, &partner, &root)));
    assert!(quiet(&mut fed).await, "an unchanged bundle is not pushed");

    // New partner roots: pushed to the federating caller, not to the other.
    let root2 = partner_root();
    j.tx.send_replace(Arc::new(federated_state(&own, &partner, &root2)));
    let pushed = fed.next().await.expect("pushed").expect("ok");
    assert_eq!(pushed.federated_bundles["spiffe://partner.example"], root2);
    assert!(
        quiet(&mut other).await,
        "a caller that does not federate sees no change"
    );
    // New partner JWT key: the JWT bundles stream pushes it.
    let partner2 = signer();
    j.tx.send_replace(Arc::new(federated_state(&own, &partner2, &root2)));
    let item = jwt_fed.next().await.expect("pushed").expect("ok");
    let jwks: serde_json::Value = serde_json::from_slice(&item.bundles[PARTNER]).expect("json");
    assert_eq!(jwks["keys"][0]["kid"], partner2.key_id());
}
