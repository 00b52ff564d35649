//! `signet.agent.v1.Node`: what signet-agent speaks to the server, on the TLS listener.
//!
//! - `Attest`: the protocol is [`crate::attestation`] (join token or Kubernetes
//!   service-account token); this handler reads the request and converts the outcome.
//! - `RenewNode`, `SyncEntries`, `WatchEntries` (the push stream, [`super::node_watch`]),
//!   `SignWorkloads`: mTLS with the node SVID only. A banned node is
//!   refused (PermissionDenied, audit event) before anything else happens.
//!
//! `SignWorkloads` answers per entry, in the request's order: a certificate, or the code and
//! message the same refusal would have as a call, plus the retry hint it would carry
//! (`retry_after_ms`: a ResourceExhausted's `grpc-retry-pushback-ms`; 0 without one). Today no
//! per-entry refusal carries one: the per-caller issuance rate is not applied on the node API
//! ([`Issuer::issue`]), and an entry shed by a full or slow ledger is Unavailable with no hint,
//! as a call would be. A shed *call* (the limits layer: `issuance_per_source`,
//! `max_concurrent_requests`) is ResourceExhausted with `grpc-retry-pushback-ms`.
//!
//! Every certificate goes through [`Issuer::issue`] (policy, CA core, ledger commit) with a
//! node grant source, so policy is where "own ID only" and "only entries parented to me" live.
//!
//! Node sets: a node's entries are its own and those of every node set it is a member of at
//! that request (`crate::node_sets`: its stored attestation selectors include all of the
//! set's, and it is not banned). `SyncEntries` reads the sets once per call and answers with
//! the highest revision of those parents; `SignWorkloads` and `MintWorkloadJwts` decide the
//! membership of each node-set entry for the call (one read of the sets, only if one of its
//! entries names a set) and policy refuses a non-member, naming the set.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt as _;
use signet_proto::agent::{
    AttestRequest, AttestResponse, Entry as PbEntry, MintWorkloadJwtsRequest,
    MintWorkloadJwtsResponse, RenewNodeRequest, SignWorkloadsRequest, SignWorkloadsResponse, Svid,
    SyncEntriesRequest, SyncEntriesResponse, WatchEntriesRequest, WorkloadJwtResult,
    WorkloadResult, node_server::Node,
};
use tonic::{Request, Response, Status};

use super::node_watch::{EntryStream, WatchLimits};
use super::{ApiError, check_size, request_id};
use crate::attestation::{AttestInput, Attestation, node_refusal};
use crate::authn::psat::PsatAttestor;
use crate::authn::{AuthenticatedCaller, AuthnError, CallerKind};
use crate::bundle::BundleHandle;
use crate::ca::IssuedCert;
use crate::ca::RequestedNames;
use crate::clock::unix;
use crate::issuer::{Credentials, IssueInput, Issuer, JwtInput};
use crate::jwt_svid::MintedJwtSvid;
use crate::node_sets::NodeSetMembership;
use crate::policy::{EntryGrant, GrantSource};
use crate::store::{EntryRow, FederationStore, NodeRow, NodeSetRow, NodeStore};

/// Most CSRs in one `SignWorkloads` call.
pub const MAX_WORKLOADS_PER_CALL: usize = 256;

/// Most CSRs of one `SignWorkloads` call being signed or committed at once.
const WORKLOADS_IN_FLIGHT: usize = 16;

pub struct NodeApi {
    issuer: Arc<Issuer>,
    store: Arc<dyn NodeStore>,
    bundle: BundleHandle,
    max_message_bytes: usize,
    attestation: Attestation,
    watch_limits: WatchLimits,
    /// Turns true when the server shuts down: `WatchEntries` streams end then.
    stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// Where `SyncEntries` reads the federated bundles the node's entries need.
    federation: Option<Arc<dyn FederationStore>>,
}

impl NodeApi {
    pub fn new(
        issuer: Arc<Issuer>,
        store: Arc<dyn NodeStore>,
        bundle: BundleHandle,
        max_message_bytes: usize,
    ) -> Self {
        Self {
            attestation: Attestation::new(issuer.clone(), store.clone()),
            issuer,
            store,
            bundle,
            max_message_bytes,
            watch_limits: WatchLimits::default(),
            stop: None,
            federation: None,
        }
    }

    /// The `WatchEntries` limits (`[nodes.watch]`; the defaults without it).
    /// `SyncEntries` answers with the federated bundles the node's entries need, from `store`.
    pub fn with_federation(mut self, store: Arc<dyn FederationStore>) -> Self {
        self.federation = Some(store);
        self
    }

    pub fn with_entry_watch(mut self, watch: &crate::config::NodesWatchConfig) -> Self {
        self.watch_limits = WatchLimits::from(watch);
        self
    }

    /// Ends the `WatchEntries` streams when `stop` turns true.
    pub fn with_shutdown(mut self, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Accepts Kubernetes projected service-account tokens for attestation.
    pub fn with_kubernetes_attestation(self, psat: PsatAttestor) -> Self {
        Self {
            attestation: self.attestation.with_kubernetes(psat),
            ..self
        }
    }

    fn now(&self) -> i64 {
        unix(self.issuer.now())
    }

    fn audit(&self, kind: &str, caller: &str, detail: String) {
        self.issuer.audit().record(kind, caller, detail, self.now());
    }

    /// The calling node, over mTLS with its node SVID, if it is known and not banned, with its
    /// row as read now (its node selectors decide its node-set memberships).
    async fn node_caller(
        &self,
        creds: &Credentials,
    ) -> Result<(AuthenticatedCaller, NodeRow), ApiError> {
        if creds.authorization.is_some() {
            // A bearer token would take precedence in `authenticate`; the node API is mTLS only.
            let e = AuthnError::BadCertificate(
                "the node API authenticates with the node SVID over mTLS only; send no \
                 authorization header"
                    .into(),
            );
            self.audit("authn.refused", "anonymous", e.to_string());
            return Err(ApiError::Unauthenticated(e));
        }
        let caller = self.issuer.authenticate(creds)?;
        let CallerKind::Node { node_id, .. } = caller.kind() else {
            let msg = format!(
                "caller {} is not a node: the node API takes a node SVID \
                 (spiffe://{}/signet/node/<node-id>)",
                caller.spiffe_id(),
                self.issuer.trust_domain()
            );
            self.audit("node.denied", &caller.label(), msg.clone());
            return Err(ApiError::PermissionDenied(msg));
        };
        let node = self.store.node(node_id).await?;
        self.check_not_banned(&caller, node_id, node.as_ref())?;
        let Some(node) = node else {
            // check_not_banned refuses an unknown node.
            return Err(ApiError::Internal(format!("node {node_id}")));
        };
        self.issuer.check_node_certificate(&caller).await?;
        Ok((caller, node))
    }

    /// The parents whose entries `node` receives now: its own SPIFFE ID and the node sets it
    /// is a member of (the sets read once for this request).
    async fn parents_of(&self, node: &NodeRow) -> Result<Vec<String>, ApiError> {
        let sets = self.store.list_node_sets().await?;
        Ok(crate::node_sets::parents_of(
            self.issuer.trust_domain(),
            node,
            &sets,
        ))
    }

    /// Refuses a banned (or unknown) node, with an audit event.
    fn check_not_banned(
        &self,
        caller: &AuthenticatedCaller,
        node_id: &str,
        node: Option<&NodeRow>,
    ) -> Result<(), ApiError> {
        let Some(msg) = node_refusal(node_id, node, true) else {
            return Ok(());
        };
        self.audit("node.denied", &caller.label(), msg.clone());
        Err(ApiError::PermissionDenied(msg))
    }
}

fn svid(cert: &IssuedCert) -> Svid {
    Svid {
        spiffe_id: cert.spiffe_id.to_string(),
        cert_chain: cert.chain.clone(),
        serial: cert.serial.clone(),
        not_before: unix(cert.not_before),
        not_after: unix(cert.not_after),
    }
}

/// A per-entry result's retry hint: the `grpc-retry-pushback-ms` the same refusal carries as a
/// whole call's status ([`ApiError`]'s one conversion sets it), so an agent learns when to
/// retry one shed entry exactly as it learns it for a shed call; 0 without one.
/// One item of a batch call as its result carries it: the credential, or the refusal's code,
/// message and retry hint.
struct Outcome<S> {
    svid: Option<S>,
    code: i32,
    message: String,
    retry_after_ms: u32,
}

impl<S> Outcome<S> {
    fn of<T>(result: Result<T, ApiError>, to_proto: impl FnOnce(&T) -> S) -> Self {
        match result {
            Ok(t) => Self {
                svid: Some(to_proto(&t)),
                code: 0,
                message: String::new(),
                retry_after_ms: 0,
            },
            Err(e) => {
                let status = Status::from(e);
                Self {
                    svid: None,
                    code: status.code() as i32,
                    message: status.message().to_owned(),
                    retry_after_ms: retry_after_ms(&status),
                }
            }
        }
    }
}

/// A batch call's items, WORKLOADS_IN_FLIGHT at a time: the ledger's group commit records them
/// in a few transactions instead of one per item, and no poll of the call's task signs more
/// than that many in a row (all 256 at once would hold a runtime worker, and every request
/// queued behind it, for tens of milliseconds). Results keep the request's order.
/// (The futures come collected: an iterator of them would not be `Send` for every lifetime.)
async fn in_order<R>(items: Vec<impl Future<Output = R>>) -> Vec<R> {
    futures::stream::iter(items)
        .buffered(WORKLOADS_IN_FLIGHT)
        .collect()
        .await
}

fn retry_after_ms(status: &Status) -> u32 {
    status
        .metadata()
        .get(crate::limits::RETRY_PUSHBACK)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The bundles of the trust domains `entries` federate with, as the store holds them. A stored
/// document that no longer reads is left out and logged (the entries still come).
async fn federated_bundles(
    store: &dyn FederationStore,
    entries: &[EntryRow],
) -> Result<Vec<signet_proto::agent::FederatedBundle>, ApiError> {
    let mut tds: Vec<&str> = entries
        .iter()
        .flat_map(|e| e.federates_with.iter().map(String::as_str))
        .collect();
    tds.sort_unstable();
    tds.dedup();
    let docs = store.federated_bundles(&tds).await?;
    Ok(docs
        .into_iter()
        .filter_map(|(td, doc)| {
            match crate::federation::relationships::federated_bundle_proto(&td, &doc) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::error!(trust_domain = %td, error = %e, "a stored federated bundle does not read; not sent");
                    None
                }
            }
        })
        .collect())
}

/// One entry of a batch call as stored, with the caller's membership of its node set (for a
/// node set's entry), decided for this call.
struct EntryGrantInput {
    row: EntryRow,
    node_set: Option<NodeSetMembership>,
}

pub(crate) fn entry_to_proto(e: EntryRow) -> PbEntry {
    PbEntry {
        id: e.id,
        spiffe_id: e.spiffe_id,
        parent_id: e.parent_id,
        selectors: e.selectors,
        ttl_seconds: e.ttl_seconds,
        dns_names: e.dns_names,
        revision: e.revision,
        jwt_ttl_seconds: e.jwt_ttl_seconds,
        federates_with: e.federates_with,
    }
}

#[tonic::async_trait]
impl Node for NodeApi {
    /// JWT-SVIDs for entries parented to the calling node: the same node checks as
    /// `SignWorkloads` (mTLS node SVID, not banned, this CA's record of it), the same batch
    /// limit, the same per-entry policy (`GrantSource::Entry`); per-request results in order.
    async fn mint_workload_jwts(
        &self,
        request: Request<MintWorkloadJwtsRequest>,
    ) -> Result<Response<MintWorkloadJwtsResponse>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        let ids = req.requests.iter().map(|w| w.entry_id.as_str()).collect();
        let (caller, entries) = self.batch_start(&creds, "JWT-SVID requests", ids).await?;
        let mintings = req.requests.iter().enumerate().map(|(i, w)| {
            let (caller, request_id) = (&caller, &request_id);
            let entry = entries.get(&w.entry_id);
            async move {
                let request_id = format!("{request_id}-{i}");
                let minted = self
                    .mint_one(caller, &w.entry_id, entry, &w.audience, request_id)
                    .await;
                let o = Outcome::of(minted, super::native::jwt_svid_to_proto);
                WorkloadJwtResult {
                    entry_id: w.entry_id.clone(),
                    svid: o.svid,
                    code: o.code,
                    message: o.message,
                    retry_after_ms: o.retry_after_ms,
                }
            }
        });
        let results = in_order(mintings.collect()).await;
        Ok(Response::new(MintWorkloadJwtsResponse { results }))
    }

    async fn attest(
        &self,
        request: Request<AttestRequest>,
    ) -> Result<Response<AttestResponse>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        let input = AttestInput {
            join_token: &req.join_token,
            authorization: creds.authorization.as_ref(),
            csr: &req.csr,
        };
        let attested = self.attestation.attest(input, request_id).await;
        self.issuer.observe_attestation(&attested);
        let (node_id, cert) = attested?;
        Ok(Response::new(AttestResponse {
            node_id,
            svid: Some(svid(&cert)),
            bundle: self.bundle.current().roots.clone(),
        }))
    }

    async fn renew_node(
        &self,
        request: Request<RenewNodeRequest>,
    ) -> Result<Response<Svid>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        let (caller, _) = self.node_caller(&creds).await?;
        let cert = self
            .issuer
            .issue(
                &caller,
                IssueInput {
                    csr: &req.csr,
                    ttl_seconds: 0,
                    impersonate: None,
                    request_id,
                    api: "node",
                    extra_names: None,
                    source: GrantSource::NodeRenewal,
                },
            )
            .await?;
        if let CallerKind::Node { node_id, .. } = caller.kind() {
            self.store
                .update_node_certificate(node_id, &cert.serial, unix(cert.not_after))
                .await?;
        }
        Ok(Response::new(svid(&cert)))
    }

    async fn sync_entries(
        &self,
        request: Request<SyncEntriesRequest>,
    ) -> Result<Response<SyncEntriesResponse>, Status> {
        let creds = super::credentials(&request)?;
        let req = request.into_inner();
        let (_, node) = self.node_caller(&creds).await?;
        // Its own entries and those of every node set it is a member of now; the revision is
        // the highest of theirs (`NodeStore::entries_for_parents_since`).
        let parents = self.parents_of(&node).await?;
        let parents: Vec<&str> = parents.iter().map(String::as_str).collect();
        let sync = self
            .store
            .entries_for_parents_since(&parents, req.known_revision)
            .await?;
        let federated_bundles = match &self.federation {
            Some(store) if !sync.unchanged => {
                federated_bundles(store.as_ref(), &sync.entries).await?
            }
            _ => Vec::new(),
        };
        Ok(Response::new(SyncEntriesResponse {
            revision: sync.revision,
            unchanged: sync.unchanged,
            entries: sync.entries.into_iter().map(entry_to_proto).collect(),
            federated_bundles,
        }))
    }

    type WatchEntriesStream = EntryStream;

    async fn watch_entries(
        &self,
        request: Request<WatchEntriesRequest>,
    ) -> Result<Response<Self::WatchEntriesStream>, Status> {
        let creds = super::credentials(&request)?;
        let (caller, _) = self.node_caller(&creds).await?;
        let CallerKind::Node { node_id, .. } = caller.kind() else {
            // node_caller admits nodes only.
            return Err(ApiError::Internal(request_id(&request)).into());
        };
        let stream = super::node_watch::watch(
            self.store.clone(),
            caller.spiffe_id().to_string(),
            node_id.to_owned(),
            self.watch_limits,
            self.stop.clone(),
            self.issuer.monotonic(),
        )?;
        Ok(Response::new(stream))
    }

    async fn sign_workloads(
        &self,
        request: Request<SignWorkloadsRequest>,
    ) -> Result<Response<SignWorkloadsResponse>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        let ids = req.csrs.iter().map(|w| w.entry_id.as_str()).collect();
        let (caller, entries) = self.batch_start(&creds, "CSRs", ids).await?;
        let signings = req.csrs.iter().enumerate().map(|(i, w)| {
            let (caller, request_id) = (&caller, &request_id);
            let entry = entries.get(&w.entry_id);
            async move {
                let request_id = format!("{request_id}-{i}");
                let signed = self
                    .sign_one(caller, &w.entry_id, entry, &w.csr, request_id)
                    .await;
                let o = Outcome::of(signed, svid);
                WorkloadResult {
                    entry_id: w.entry_id.clone(),
                    svid: o.svid,
                    code: o.code,
                    message: o.message,
                    retry_after_ms: o.retry_after_ms,
                }
            }
        });
        let results = in_order(signings.collect()).await;
        Ok(Response::new(SignWorkloadsResponse { results }))
    }
}

impl NodeApi {
    /// The start of a batch call (`SignWorkloads`, `MintWorkloadJwts`) over the entries `ids`:
    /// at most MAX_WORKLOADS_PER_CALL items, the calling node (mTLS, not banned, on record),
    /// and the call's entries in one query (not one per item), by ID.
    async fn batch_start(
        &self,
        creds: &Credentials,
        what: &str,
        ids: Vec<&str>,
    ) -> Result<(AuthenticatedCaller, HashMap<String, EntryGrantInput>), Status> {
        if ids.len() > MAX_WORKLOADS_PER_CALL {
            return Err(ApiError::InvalidArgument(format!(
                "{} {what} in one call; send at most {MAX_WORKLOADS_PER_CALL}",
                ids.len()
            ))
            .into());
        }
        let (caller, node) = self.node_caller(creds).await?;
        let entries = self
            .store
            .entries_by_id(&ids)
            .await
            .map_err(ApiError::from)?;
        // The node sets once for the call, only if one of its entries names a set.
        let td = self.issuer.trust_domain();
        let sets: HashMap<String, NodeSetRow> = if entries
            .iter()
            .any(|e| crate::store::node_sets::node_set_name_of_parent(&e.parent_id).is_some())
        {
            self.store
                .list_node_sets()
                .await
                .map_err(ApiError::from)?
                .into_iter()
                .map(|s| (s.name.clone(), s))
                .collect()
        } else {
            HashMap::new()
        };
        let entries = entries
            .into_iter()
            .map(|e| {
                // Decided now, for this call: membership is re-checked at every signing.
                let node_set = e.parent_id.parse().ok().and_then(|parent| {
                    let set = crate::store::node_sets::node_set_name_of_parent(&e.parent_id)
                        .and_then(|name| sets.get(name));
                    NodeSetMembership::decide(td, &parent, set, &node)
                });
                (e.id.clone(), EntryGrantInput { row: e, node_set })
            })
            .collect();
        Ok((caller, entries))
    }

    /// The entry as policy sees it, if it is this node's (an unknown entry answers like
    /// another node's: a node learns nothing of others).
    fn entry_grant(
        &self,
        caller: &AuthenticatedCaller,
        entry_id: &str,
        entry: Option<&EntryGrantInput>,
        request_id: &str,
    ) -> Result<EntryGrant, ApiError> {
        let not_yours = || {
            let msg = format!(
                "entry {:?} is not parented to node {}",
                entry_id.chars().take(128).collect::<String>(),
                caller.spiffe_id()
            );
            self.audit(
                "issue.denied",
                &caller.label(),
                format!("policy.entry: {msg}"),
            );
            ApiError::PermissionDenied(msg)
        };
        let Some(EntryGrantInput {
            row: entry,
            node_set,
        }) = entry
        else {
            return Err(not_yours());
        };
        let (Ok(spiffe_id), Ok(parent_id)) = (entry.spiffe_id.parse(), entry.parent_id.parse())
        else {
            tracing::error!(entry = %entry.id, "stored entry has an unparsable SPIFFE ID");
            return Err(ApiError::Internal(request_id.to_owned()));
        };
        Ok(EntryGrant {
            entry_id: entry.id.clone(),
            spiffe_id,
            parent_id,
            dns_names: entry.dns_names.clone(),
            ttl_seconds: entry.ttl_seconds,
            node_set: node_set.clone(),
        })
    }

    async fn mint_one(
        &self,
        caller: &AuthenticatedCaller,
        entry_id: &str,
        entry: Option<&EntryGrantInput>,
        audience: &[String],
        request_id: String,
    ) -> Result<MintedJwtSvid, ApiError> {
        let grant = self.entry_grant(caller, entry_id, entry, &request_id)?;
        self.issuer
            .mint_jwt(
                caller,
                JwtInput {
                    source: GrantSource::Entry(&grant),
                    audience,
                    ttl_seconds: 0,
                    entry_ttl_seconds: entry.map_or(0, |e| e.row.jwt_ttl_seconds),
                    request_id,
                    api: "node_jwt",
                },
            )
            .await
            .map_err(ApiError::from)
    }

    async fn sign_one(
        &self,
        caller: &AuthenticatedCaller,
        entry_id: &str,
        entry: Option<&EntryGrantInput>,
        csr: &[u8],
        request_id: String,
    ) -> Result<IssuedCert, ApiError> {
        let grant = self.entry_grant(caller, entry_id, entry, &request_id)?;
        let Some(EntryGrantInput { row: entry, .. }) = entry else {
            return Err(ApiError::Internal(request_id));
        };
        self.issuer
            .issue(
                caller,
                IssueInput {
                    csr,
                    ttl_seconds: entry.ttl_seconds,
                    impersonate: None,
                    request_id,
                    api: "node",
                    extra_names: Some(RequestedNames {
                        dns_names: entry.dns_names.clone(),
                        ..RequestedNames::default()
                    }),
                    source: GrantSource::Entry(&grant),
                },
            )
            .await
            .map_err(ApiError::from)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_per_entry_result_carries_the_retry_hint_its_status_would() {
        let shed = Status::from(ApiError::ResourceExhausted {
            message: "slow down".into(),
            retry_after: Duration::from_millis(1500),
        });
        assert_eq!(retry_after_ms(&shed), 1500);
        // A sub-millisecond hint still says "wait" (the conversion rounds up to 1 ms).
        let tiny = Status::from(ApiError::ResourceExhausted {
            message: "slow down".into(),
            retry_after: Duration::from_micros(10),
        });
        assert_eq!(retry_after_ms(&tiny), 1);
        for no_hint in [
            ApiError::Unavailable("ledger overloaded".into()),
            ApiError::PermissionDenied("not yours".into()),
        ] {
            assert_eq!(retry_after_ms(&Status::from(no_hint)), 0);
        }
    }
}
