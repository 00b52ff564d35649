//! The server side of identities: `signet.ca.v1.Registration` behind the small [`Registrar`]
//! trait (reconcilers are tested with an in-memory fake). [`GrpcRegistrar`] calls the
//! operator's server (`--server`) over the bridge's authenticated connection (TLS to
//! `spiffe://<td>/signet/server`, the bridge's token re-read at each call); its errors are
//! classified as every other call's ([`crate::signer::classify`]: permanent or retryable).

use std::sync::Arc;

use futures::future::BoxFuture;
use signet_proto::signet::ca::v1 as pb;
use signet_proto::signet::ca::v1::registration_client::RegistrationClient;
use tonic::transport::Channel;

use super::plan::OwnedEntry;
use crate::operator::BridgeConfig;
use crate::signer::{CALL_TIMEOUT, REASON_WRONG_SERVER, SignError, classify};

/// What a sync did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncResult {
    pub created: u32,
    pub updated: u32,
    pub deleted: u32,
    pub unchanged: u32,
    /// 0 when nothing changed.
    pub revision: u64,
}

/// One of the bridge's entries on the server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedRecord {
    pub id: String,
    pub scope: String,
    pub entry: OwnedEntry,
}

/// The bridge's owned entries on the server.
pub trait Registrar: Send + Sync {
    /// Makes the bridge's entries in `scope` exactly `entries` (all or nothing).
    fn sync<'a>(
        &'a self,
        scope: &'a str,
        entries: &'a [OwnedEntry],
    ) -> BoxFuture<'a, Result<SyncResult, SignError>>;
    /// Every entry the bridge owns, sorted by scope then id.
    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<OwnedRecord>, SignError>>;
}

impl From<&OwnedEntry> for pb::OwnedEntry {
    fn from(e: &OwnedEntry) -> Self {
        Self {
            spiffe_id: e.spiffe_id.clone(),
            node_set: e.node_set.clone(),
            selectors: e.selectors.clone(),
            ttl_seconds: e.ttl_seconds,
            dns_names: e.dns_names.clone(),
            jwt_ttl_seconds: e.jwt_ttl_seconds,
            federates_with: e.federates_with.clone(),
        }
    }
}

impl From<pb::OwnedEntry> for OwnedEntry {
    fn from(e: pb::OwnedEntry) -> Self {
        Self {
            spiffe_id: e.spiffe_id,
            node_set: e.node_set,
            selectors: e.selectors,
            ttl_seconds: e.ttl_seconds,
            dns_names: e.dns_names,
            jwt_ttl_seconds: e.jwt_ttl_seconds,
            federates_with: e.federates_with,
        }
    }
}

/// [`Registrar`] over gRPC to the operator's server, connecting on first use (and again
/// after a failed call).
pub struct GrpcRegistrar {
    bridge: Arc<BridgeConfig>,
    channel: tokio::sync::Mutex<Option<Channel>>,
}

impl GrpcRegistrar {
    pub fn new(bridge: Arc<BridgeConfig>) -> Self {
        Self {
            bridge,
            channel: tokio::sync::Mutex::new(None),
        }
    }

    async fn client(&self) -> Result<RegistrationClient<Channel>, SignError> {
        let mut guard = self.channel.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(RegistrationClient::new(c.clone()));
        }
        let target = self.bridge.operator_target().map_err(|e| {
            SignError::permanent(
                "NoServer",
                format!("identities need the bridge's --server and --bundle: {e}"),
            )
        })?;
        let connect = signet_client::connect(&target, None);
        let channel = match tokio::time::timeout(CALL_TIMEOUT, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(signet_client::ClientError::WrongServer(_, why))) => {
                return Err(SignError::retryable(REASON_WRONG_SERVER, why));
            }
            Ok(Err(e)) => return Err(SignError::retryable("Unreachable", e.to_string())),
            Err(_) => {
                return Err(SignError::retryable(
                    "Unreachable",
                    format!("no connection to {} within {CALL_TIMEOUT:?}", target.addr),
                ));
            }
        };
        *guard = Some(channel.clone());
        Ok(RegistrationClient::new(channel))
    }

    /// A registrar over an open channel (tests use a plain in-process server).
    #[cfg(test)]
    pub(crate) fn over(channel: Channel, bridge: Arc<BridgeConfig>) -> Self {
        Self {
            bridge,
            channel: tokio::sync::Mutex::new(Some(channel)),
        }
    }

    /// `msg` with the bridge's token (read now: kubelet rotates it) and the current span's
    /// trace context.
    async fn request<T>(&self, msg: T) -> Result<tonic::Request<T>, SignError> {
        let path = &self.bridge.token_path;
        let token = tokio::fs::read_to_string(path).await.map_err(|e| {
            SignError::retryable(
                "CredentialsNotFound",
                format!(
                    "cannot read the service-account token {}: {e}",
                    path.display()
                ),
            )
        })?;
        let mut req = signet_client::with_bearer(msg, token.trim()).map_err(|_| {
            SignError::retryable(
                "CredentialsNotFound",
                format!("{}: the token cannot be sent in a header", path.display()),
            )
        })?;
        req.set_timeout(CALL_TIMEOUT);
        signet_runtime::telemetry::inject_context(req.metadata_mut());
        Ok(req)
    }

    /// Forgets the channel after a failure that may be the connection's.
    async fn failed(&self, s: tonic::Status) -> SignError {
        let e = classify(&signet_client::CallError::from(s));
        if !e.is_permanent() {
            *self.channel.lock().await = None;
        }
        e
    }
}

impl Registrar for GrpcRegistrar {
    fn sync<'a>(
        &'a self,
        scope: &'a str,
        entries: &'a [OwnedEntry],
    ) -> BoxFuture<'a, Result<SyncResult, SignError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let req = self
                .request(pb::SyncOwnedEntriesRequest {
                    scope: scope.to_owned(),
                    entries: entries.iter().map(pb::OwnedEntry::from).collect(),
                })
                .await?;
            match client.sync_owned_entries(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    Ok(SyncResult {
                        created: r.created,
                        updated: r.updated,
                        deleted: r.deleted,
                        unchanged: r.unchanged,
                        revision: r.revision,
                    })
                }
                Err(s) => Err(self.failed(s).await),
            }
        })
    }

    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<OwnedRecord>, SignError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let mut all = Vec::new();
            let mut page_token = String::new();
            // Pages of up to 1,000: the server's cap on one owner's entries (10,000 by
            // default) is far inside this bound, which only stops a server that never ends.
            for _ in 0..MAX_LIST_PAGES {
                let req = self
                    .request(pb::ListOwnedEntriesRequest {
                        scope: String::new(),
                        page_token: std::mem::take(&mut page_token),
                        page_size: LIST_PAGE_SIZE,
                    })
                    .await?;
                let page = match client.list_owned_entries(req).await {
                    Ok(r) => r.into_inner(),
                    Err(s) => return Err(self.failed(s).await),
                };
                all.extend(page.entries.into_iter().map(|rec| OwnedRecord {
                    id: rec.id,
                    scope: rec.scope,
                    entry: rec.entry.map(OwnedEntry::from).unwrap_or_default(),
                }));
                if page.next_page_token.is_empty() {
                    return Ok(all);
                }
                page_token = page.next_page_token;
            }
            Err(SignError::retryable(
                "ListTooLong",
                format!(
                    "the server's list of this bridge's entries did not end after \
                     {MAX_LIST_PAGES} pages"
                ),
            ))
        })
    }
}

/// Entries asked for per ListOwnedEntries page, and the most pages one listing reads.
const LIST_PAGE_SIZE: u32 = 500;
const MAX_LIST_PAGES: usize = 1000;

/// A [`Registrar`] in memory, for tests: scopes → entries, every sync recorded, and an
/// optional error answered to the next sync.
#[cfg(any(test, feature = "testing"))]
#[derive(Default)]
pub struct FakeRegistrar {
    pub scopes: std::sync::Mutex<std::collections::BTreeMap<String, Vec<OwnedEntry>>>,
    pub syncs: std::sync::Mutex<Vec<(String, Vec<OwnedEntry>)>>,
    pub fail_next: std::sync::Mutex<Option<SignError>>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeRegistrar {
    pub fn syncs(&self) -> Vec<(String, Vec<OwnedEntry>)> {
        self.syncs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn with_scope(self, scope: &str, entries: Vec<OwnedEntry>) -> Self {
        self.scopes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(scope.to_owned(), entries);
        self
    }
}

#[cfg(any(test, feature = "testing"))]
impl Registrar for FakeRegistrar {
    fn sync<'a>(
        &'a self,
        scope: &'a str,
        entries: &'a [OwnedEntry],
    ) -> BoxFuture<'a, Result<SyncResult, SignError>> {
        let r = (|| {
            if let Some(e) = self
                .fail_next
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                return Err(e);
            }
            self.syncs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((scope.to_owned(), entries.to_vec()));
            let mut m = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
            let old = m.remove(scope).unwrap_or_default();
            let res = SyncResult {
                created: entries.iter().filter(|e| !old.contains(e)).count() as u32,
                deleted: old.iter().filter(|e| !entries.contains(e)).count() as u32,
                unchanged: entries.iter().filter(|e| old.contains(e)).count() as u32,
                ..Default::default()
            };
            if !entries.is_empty() {
                m.insert(scope.to_owned(), entries.to_vec());
            }
            Ok(res)
        })();
        Box::pin(async move { r })
    }

    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<OwnedRecord>, SignError>> {
        let m = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        let out = m
            .iter()
            .flat_map(|(scope, es)| {
                es.iter().enumerate().map(move |(i, e)| OwnedRecord {
                    id: format!("{scope}#{i}"),
                    scope: scope.clone(),
                    entry: e.clone(),
                })
            })
            .collect();
        Box::pin(async move { Ok(out) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use signet_proto::signet::ca::v1::registration_server::{Registration, RegistrationServer};
    use tonic::{Code, Status};

    use super::*;
    use crate::testing::{TempFile, TestBridge};

    /// Records each request (method, bearer, body) and answers from a script.
    #[derive(Clone, Default)]
    struct Recorder {
        seen: Arc<Mutex<Vec<(String, String, String)>>>,
        fail: Arc<Mutex<Option<Status>>>,
    }

    #[tonic::async_trait]
    impl Registration for Recorder {
        async fn sync_owned_entries(
            &self,
            req: tonic::Request<pb::SyncOwnedEntriesRequest>,
        ) -> Result<tonic::Response<pb::SyncOwnedEntriesResponse>, Status> {
            let bearer = req
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            self.seen
                .lock()
                .unwrap()
                .push(("Sync".into(), bearer, format!("{:?}", req.get_ref())));
            if let Some(s) = self.fail.lock().unwrap().take() {
                return Err(s);
            }
            Ok(tonic::Response::new(pb::SyncOwnedEntriesResponse {
                entry_ids: vec!["e1".into()],
                created: 1,
                revision: 7,
                ..Default::default()
            }))
        }
        async fn list_owned_entries(
            &self,
            req: tonic::Request<pb::ListOwnedEntriesRequest>,
        ) -> Result<tonic::Response<pb::ListOwnedEntriesResponse>, Status> {
            self.seen.lock().unwrap().push((
                "List".into(),
                String::new(),
                format!("{:?}", req.get_ref()),
            ));
            // Two pages: the second only for the first page's token.
            let (id, ns, next) = match req.get_ref().page_token.as_str() {
                "" => ("e1", "a", "Identity/a/web|e1"),
                "Identity/a/web|e1" => ("e2", "b", ""),
                other => return Err(Status::invalid_argument(format!("token {other}"))),
            };
            Ok(tonic::Response::new(pb::ListOwnedEntriesResponse {
                entries: vec![pb::OwnedEntryRecord {
                    id: id.into(),
                    scope: format!("Identity/{ns}/web"),
                    entry: Some(pb::OwnedEntry {
                        spiffe_id: format!("spiffe://example.org/ns/{ns}/web"),
                        node_set: "k8s".into(),
                        selectors: vec![format!("k8s:ns:{ns}")],
                        ..Default::default()
                    }),
                    revision: 7,
                    created_at: 1,
                }],
                next_page_token: next.into(),
            }))
        }
    }

    async fn serve(r: Recorder) -> Channel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(r))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn syncs_and_lists_with_the_bridges_token_and_classifies_errors() {
        let r = Recorder::default();
        let bridge = TestBridge::new("https://signet:8443", b"", "example.org", "tok-1\n");
        let reg = GrpcRegistrar::over(serve(r.clone()).await, bridge.config.clone());
        let e = OwnedEntry {
            spiffe_id: "spiffe://example.org/ns/a/web".into(),
            node_set: "k8s".into(),
            selectors: vec!["k8s:ns:a".into(), "k8s:sa:web".into()],
            ttl_seconds: 3600,
            dns_names: vec!["web.a.svc".into()],
            jwt_ttl_seconds: 300,
            federates_with: vec!["partner.example".into()],
        };
        let res = reg
            .sync("Identity/a/web", std::slice::from_ref(&e))
            .await
            .unwrap();
        assert_eq!((res.created, res.revision), (1, 7));
        {
            let seen = r.seen.lock().unwrap();
            assert_eq!(seen[0].0, "Sync");
            assert_eq!(seen[0].1, "Bearer tok-1");
            assert!(
                seen[0].2.contains("scope: \"Identity/a/web\""),
                "{}",
                seen[0].2
            );
            assert!(seen[0].2.contains("federates_with: [\"partner.example\"]"));
            assert!(seen[0].2.contains("jwt_ttl_seconds: 300"));
        }
        // Every page, following the server's tokens (review finding F4 of issue 29).
        let listed = reg.list().await.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].scope, "Identity/a/web");
        assert_eq!(listed[0].entry.selectors, ["k8s:ns:a"]);
        assert_eq!(listed[1].scope, "Identity/b/web");

        // A refusal is permanent; an unavailable server retryable.
        *r.fail.lock().unwrap() = Some(Status::permission_denied("entries[0]: not allowed"));
        let err = reg.sync("Identity/a/web", &[]).await.unwrap_err();
        assert!(err.is_permanent(), "{err:?}");
        assert_eq!(err.reason(), "PermissionDenied");
        assert!(err.message().contains("entries[0]"));
        *r.fail.lock().unwrap() = Some(Status::new(Code::Unavailable, "database down"));
        let err = reg.sync("Identity/a/web", &[]).await.unwrap_err();
        assert!(!err.is_permanent(), "{err:?}");
        // The channel is dropped after a retryable failure: the next call reconnects (here:
        // the test bridge's bundle is no PEM, so it cannot, and says so).
        let err = reg.list().await.unwrap_err();
        assert_eq!(err.reason(), "NoServer");
    }

    #[tokio::test]
    async fn an_unreadable_token_is_retryable_and_named() {
        let r = Recorder::default();
        let bridge = TestBridge::new("https://signet:8443", b"", "example.org", "t");
        let mut cfg = (*bridge.config).clone();
        cfg.token_path = TempFile::with("gone", b"").0.clone();
        let missing = cfg.token_path.clone();
        let reg = GrpcRegistrar::over(serve(r).await, Arc::new(cfg));
        let err = reg.sync("Identity/a/web", &[]).await.unwrap_err();
        assert_eq!(err.reason(), "CredentialsNotFound");
        assert!(err.message().contains(&missing.display().to_string()));
    }
}
