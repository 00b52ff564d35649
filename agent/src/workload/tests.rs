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
async fn jwt_rpcs_are_unimplemented() {
    let (_tx, rx) = channel();
    let api = WorkloadApi::new(rx, Attestor::default());
    let e = api
        .fetch_jwtsvid(req(pb::JwtsvidRequest::default(), true))
        .await
        .expect_err("unimplemented");
    assert_eq!(e.code(), tonic::Code::Unimplemented);
    let e = api
        .validate_jwtsvid(req(pb::ValidateJwtsvidRequest::default(), true))
        .await
        .expect_err("unimplemented");
    assert_eq!(e.code(), tonic::Code::Unimplemented);
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
