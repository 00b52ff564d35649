//! The SPIFFE Workload API on a Unix socket.
//!
//! Every connection is attested from the kernel's peer credentials when it is accepted
//! ([`AttestedStream`]); each request is then matched against the entries in the agent's state.
//! `FetchX509SVID` and `FetchX509Bundles` stream the caller's full current view at once and
//! again whenever it changes; a caller that loses its last identity gets PermissionDenied and
//! the stream ends. The JWT RPCs answer Unimplemented.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use signet_proto::workload as pb;
use signet_proto::workload::spiffe_workload_api_server::{
    SpiffeWorkloadApi, SpiffeWorkloadApiServer,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status};

use crate::attest::{Attestor, Caller};
use crate::state::{AgentState, Identity, StateReceiver};

/// The metadata every Workload API request must carry.
pub const SECURITY_HEADER: &str = "workload.spiffe.io";

/// A Unix stream with the caller's credentials, read once at accept time.
pub struct AttestedStream {
    inner: UnixStream,
    peer: PeerInfo,
}

/// The request extension carrying the caller; `None` when the kernel gave no credentials.
#[derive(Debug, Clone)]
pub struct PeerInfo(pub Option<Arc<Caller>>);

impl AttestedStream {
    pub fn new(inner: UnixStream, proc_root: &Path) -> Self {
        let caller = Caller::from_stream(&inner, proc_root).ok().map(Arc::new);
        Self {
            inner,
            peer: PeerInfo(caller),
        }
    }
}

impl Connected for AttestedStream {
    type ConnectInfo = PeerInfo;
    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

impl AsyncRead for AttestedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for AttestedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The Workload API service.
#[derive(Clone)]
pub struct WorkloadApi {
    state: StateReceiver,
    attestor: Arc<Attestor>,
}

impl WorkloadApi {
    pub fn new(state: StateReceiver, attestor: Attestor) -> Self {
        Self {
            state,
            attestor: Arc::new(attestor),
        }
    }

    pub fn into_server(self) -> SpiffeWorkloadApiServer<Self> {
        SpiffeWorkloadApiServer::new(self)
    }

    pub(crate) fn caller<T>(req: &Request<T>) -> Result<Arc<Caller>, Status> {
        let header = req
            .metadata()
            .get(SECURITY_HEADER)
            .and_then(|v| v.to_str().ok());
        if header != Some("true") {
            return Err(Status::invalid_argument(
                "security header workload.spiffe.io: true is missing",
            ));
        }
        req.extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.0.clone())
            .ok_or_else(|| Status::permission_denied("caller could not be attested"))
    }

    /// A stream of `view(state)` for this caller: the current one at once, then each change.
    /// `view` returns `None` when the caller has no identity left: PermissionDenied, end.
    fn watch<T, F>(&self, caller: Arc<Caller>, view: F) -> Result<WatchStream<T>, Status>
    where
        T: PartialEq + Clone + Send + 'static,
        F: Fn(&Attestor, &Caller, &AgentState) -> Option<T> + Copy + Send + Sync + 'static,
    {
        let mut rx = self.state.clone();
        let attestor = self.attestor.clone();
        let first = {
            let state = rx.borrow_and_update();
            view(&attestor, &caller, &state)
        }
        .ok_or_else(no_identity)?;
        let stream = futures::stream::unfold(
            (rx, Some(first), None::<T>, false),
            move |(mut rx, pending, last, done)| {
                let attestor = attestor.clone();
                let caller = caller.clone();
                async move {
                    if done {
                        return None;
                    }
                    if let Some(item) = pending {
                        return Some((Ok(item.clone()), (rx, None, Some(item), false)));
                    }
                    loop {
                        // The sender went away: the agent is shutting down; end the stream.
                        rx.changed().await.ok()?;
                        let now = {
                            let state = rx.borrow_and_update();
                            view(&attestor, &caller, &state)
                        };
                        match now {
                            None => return Some((Err(no_identity()), (rx, None, None, true))),
                            Some(item) if last.as_ref() == Some(&item) => continue,
                            Some(item) => {
                                return Some((Ok(item.clone()), (rx, None, Some(item), false)));
                            }
                        }
                    }
                }
            },
        );
        Ok(Box::pin(stream))
    }
}

type WatchStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn no_identity() -> Status {
    Status::permission_denied("no identity issued")
}

fn concat(ders: &[Vec<u8>]) -> Vec<u8> {
    ders.concat()
}

/// The X509-SVID response for a caller, or `None` when it has no identity.
pub fn x509_svid_view(
    attestor: &Attestor,
    caller: &Caller,
    state: &AgentState,
) -> Option<pb::X509svidResponse> {
    let ids: Vec<&Identity> = attestor.identities_for(caller, state);
    if ids.is_empty() {
        return None;
    }
    let bundle = concat(&state.bundle_der);
    Some(pb::X509svidResponse {
        svids: ids
            .iter()
            .map(|id| pb::X509svid {
                spiffe_id: id.svid.spiffe_id.to_string(),
                x509_svid: concat(&id.svid.chain_der),
                x509_svid_key: id.svid.key_pkcs8_der.clone(),
                bundle: bundle.clone(),
                hint: String::new(),
            })
            .collect(),
        crl: Vec::new(),
        federated_bundles: HashMap::new(),
    })
}

/// The X.509 bundles response for a caller, or `None` when it has no identity.
pub fn x509_bundles_view(
    attestor: &Attestor,
    caller: &Caller,
    state: &AgentState,
) -> Option<pb::X509BundlesResponse> {
    if attestor.identities_for(caller, state).is_empty() {
        return None;
    }
    let mut bundles = HashMap::new();
    if !state.trust_domain_id.is_empty() {
        bundles.insert(state.trust_domain_id.clone(), concat(&state.bundle_der));
    }
    Some(pb::X509BundlesResponse {
        crl: Vec::new(),
        bundles,
    })
}

#[tonic::async_trait]
impl SpiffeWorkloadApi for WorkloadApi {
    type FetchX509SVIDStream = WatchStream<pb::X509svidResponse>;
    type FetchX509BundlesStream = WatchStream<pb::X509BundlesResponse>;
    type FetchJWTBundlesStream = WatchStream<pb::JwtBundlesResponse>;

    async fn fetch_x509svid(
        &self,
        req: Request<pb::X509svidRequest>,
    ) -> Result<Response<Self::FetchX509SVIDStream>, Status> {
        let caller = Self::caller(&req)?;
        tracing::debug!(uid = caller.uid, pid = ?caller.pid, "FetchX509SVID");
        self.watch(caller, x509_svid_view).map(Response::new)
    }

    async fn fetch_x509_bundles(
        &self,
        req: Request<pb::X509BundlesRequest>,
    ) -> Result<Response<Self::FetchX509BundlesStream>, Status> {
        let caller = Self::caller(&req)?;
        self.watch(caller, x509_bundles_view).map(Response::new)
    }

    async fn fetch_jwtsvid(
        &self,
        _req: Request<pb::JwtsvidRequest>,
    ) -> Result<Response<pb::JwtsvidResponse>, Status> {
        Err(Status::unimplemented("JWT-SVIDs are not supported"))
    }

    async fn fetch_jwt_bundles(
        &self,
        _req: Request<pb::JwtBundlesRequest>,
    ) -> Result<Response<Self::FetchJWTBundlesStream>, Status> {
        Err(Status::unimplemented("JWT bundles are not supported"))
    }

    async fn validate_jwtsvid(
        &self,
        _req: Request<pb::ValidateJwtsvidRequest>,
    ) -> Result<Response<pb::ValidateJwtsvidResponse>, Status> {
        Err(Status::unimplemented("JWT-SVIDs are not supported"))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("workload API socket {0}: {1}")]
    Socket(PathBuf, io::Error),
    #[error("workload API socket {0}: a file that is not a socket is in the way")]
    NotASocket(PathBuf),
    #[error("workload API server: {0}")]
    Serve(String),
}

/// Binds the socket: removes a stale socket file (never another kind of file), binds, and sets
/// mode 0777 — any local process may connect; its identity comes from its peer credentials.
/// The directory is the operator's to protect.
pub fn bind(path: &Path) -> Result<UnixListener, WorkloadError> {
    let err = |e| WorkloadError::Socket(path.to_owned(), e);
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(err)?,
        Ok(_) => return Err(WorkloadError::NotASocket(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).map_err(err)?;
    Ok(listener)
}

/// Serves the Workload API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    api: WorkloadApi,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), WorkloadError> {
    let proc_root = PathBuf::from("/proc");
    let incoming = futures::stream::unfold(listener, move |listener| {
        let proc_root = proc_root.clone();
        async move {
            let next = listener
                .accept()
                .await
                .map(|(s, _)| AttestedStream::new(s, &proc_root));
            Some((next, listener))
        }
    });
    tonic::transport::Server::builder()
        .add_service(api.into_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| WorkloadError::Serve(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{X509Svid, channel};
    use futures::StreamExt;
    use std::time::SystemTime;

    fn me() -> Arc<Caller> {
        Arc::new(Caller {
            uid: 1000,
            gid: 1000,
            pid: Some(1),
            exe: None,
        })
    }

    fn state_with(uid: u32, key: u8) -> AgentState {
        AgentState {
            identities: vec![Identity {
                entry_id: "e1".into(),
                selectors: vec![crate::state::Selector::Uid(uid)],
                svid: X509Svid {
                    spiffe_id: "spiffe://example.org/app".parse().expect("id"),
                    chain_der: vec![vec![1, 2], vec![3]],
                    key_pkcs8_der: vec![key],
                    not_before: SystemTime::UNIX_EPOCH,
                    not_after: SystemTime::UNIX_EPOCH,
                },
            }],
            bundle_der: vec![vec![9], vec![8]],
            trust_domain_id: "spiffe://example.org".into(),
        }
    }

    fn req<T>(msg: T, header: bool) -> Request<T> {
        let mut r = Request::new(msg);
        if header {
            r.metadata_mut()
                .insert(SECURITY_HEADER, "true".parse().expect("value"));
        }
        r.extensions_mut().insert(PeerInfo(Some(me())));
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
        assert_eq!(first.svids[0].x509_svid, [1, 2, 3]);
        assert_eq!(first.svids[0].x509_svid_key, [1]);
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
        assert_eq!(second.svids[0].x509_svid_key, [2]);

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

    #[test]
    fn bind_replaces_stale_socket_but_not_files() {
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
            assert!(matches!(bind(&file), Err(WorkloadError::NotASocket(_))));
            assert_eq!(std::fs::read(&file).expect("kept"), b"x");
        });
    }
}
