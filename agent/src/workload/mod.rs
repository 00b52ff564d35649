//! The SPIFFE Workload API on a Unix socket.
//!
//! - [`listen`]: the socket (mode, group, no window before they are set) and the accept loop
//!   (connection caps global and per uid, backoff on accept errors).
//! - [`conn`]: one connection: its peer process, per-message credentials (bytes written by
//!   any other process close it), first-request and idle timeouts.
//!
//! The caller is attested for **every request, and again for every update a stream sends**
//! ([`crate::attest::Attestor::attest`]), never once per connection: a process that died, whose
//! pid was reused, or that now runs another executable gets what it proves now. `FetchX509SVID`
//! and `FetchX509Bundles` stream the caller's full current view at once and again whenever it
//! changes; a caller that loses its last identity gets PermissionDenied and the stream ends.
//! Both fill their `crl` field (DER, one per issuing CA key) with the CRLs the agent verified
//! (SPIRE leaves it empty); a new CRL is a change, so it is streamed at once.
//! **Federation** (SPIRE's rule): a caller receives the bundles of the foreign trust domains its
//! identities' entries federate with (the union over the identities returned to it), and no
//! other: in `X509SVIDResponse.federated_bundles` (`spiffe://<td>` to the concatenated DER
//! roots), in `FetchX509Bundles` and `FetchJWTBundles` beside the own trust domain, and as the
//! key sets `ValidateJWTSVID` may validate a foreign token with ([`jwt::validate`]). A change of
//! those bundles is a change of the caller's view, so open streams push it; a caller whose
//! identities do not federate sees no change and gets no push.
//! - [`jwt`]: the JWT profile. `FetchJWTSVID` (an audience required) answers one JWT-SVID per
//!   SPIFFE ID the caller is entitled to, or the one it names (PermissionDenied when it is not
//!   entitled to it), each from the [`JwtCache`] (minted by the server when not cached);
//!   `FetchJWTBundles` streams the trust domain's JWT keys as a JWKS to a caller with an
//!   identity, at once and on every change; `ValidateJWTSVID` (audience and token required)
//!   validates against those keys for any caller that can be attested.
//! - [`sds`]: Envoy's Secret Discovery Service on the same socket and under the same rules
//!   (per-request attestation, per-message credentials, the connection caps), with its own
//!   stream caps.
//!
//! Every refusal is a [`WorkloadError`], made a gRPC status in one place ([`error`]).

pub mod conn;
pub mod error;
pub mod jwt;
pub mod listen;
pub mod metrics;
pub mod sds;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use signet_proto::workload as pb;
use signet_proto::workload::spiffe_workload_api_server::{
    SpiffeWorkloadApi, SpiffeWorkloadApiServer,
};
use tonic::{Request, Response, Status};

use crate::attest::{Attestor, Caller};
use crate::jwt_cache::JwtCache;
use crate::state::{AgentState, Identity, StateReceiver};
use conn::{ActiveGuard, PeerSource};
pub use conn::{AttestedStream, Peer, PeerInfo};
pub use error::{ListenError, WorkloadError};
pub use listen::{ServeOptions, bind, bind_with, serve, serve_with};
pub use metrics::WorkloadMetrics;
use signet_runtime::clock::{Clock, SystemClock};
use signet_types::SpiffeId;

/// The metadata every Workload API request must carry.
pub const SECURITY_HEADER: &str = "workload.spiffe.io";

/// The Workload API service.
#[derive(Clone)]
pub struct WorkloadApi {
    state: StateReceiver,
    attestor: Arc<Attestor>,
    metrics: Arc<WorkloadMetrics>,
    /// Where `FetchJWTSVID` gets tokens; `None`: the JWT-SVID RPC answers Unimplemented.
    jwt: Option<Arc<JwtCache>>,
    /// The agent's clock: `ValidateJWTSVID`'s now.
    clock: Arc<dyn Clock>,
}

impl WorkloadApi {
    pub fn new(state: StateReceiver, attestor: Attestor) -> Self {
        Self {
            state,
            attestor: Arc::new(attestor),
            metrics: Arc::new(WorkloadMetrics::default()),
            jwt: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// Serves JWT-SVIDs from `cache`, and validates tokens at `clock`'s time.
    pub fn with_jwt(mut self, cache: Arc<JwtCache>, clock: Arc<dyn Clock>) -> Self {
        self.jwt = Some(cache);
        self.clock = clock;
        self
    }

    /// Counts attestation failures in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<WorkloadMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn into_server(self) -> SpiffeWorkloadApiServer<Self> {
        SpiffeWorkloadApiServer::new(self)
    }

    /// The connection's peer, once the security header is checked.
    pub(crate) fn peer<T>(req: &Request<T>) -> Result<Arc<Peer>, WorkloadError> {
        let header = req
            .metadata()
            .get(SECURITY_HEADER)
            .and_then(|v| v.to_str().ok());
        if header != Some("true") {
            return Err(WorkloadError::MissingHeader);
        }
        Self::connection_peer(req)
    }

    /// The connection's peer (the request extension the listener puts there), whatever the
    /// headers: Envoy's SDS requests carry no security header.
    pub(crate) fn connection_peer<T>(req: &Request<T>) -> Result<Arc<Peer>, WorkloadError> {
        req.extensions()
            .get::<PeerInfo>()
            .map(|p| p.0.clone())
            .ok_or(WorkloadError::NoPeer)
    }

    /// What the peer proves now.
    async fn attest(
        attestor: &Attestor,
        metrics: &WorkloadMetrics,
        peer: &Peer,
    ) -> Result<Caller, WorkloadError> {
        let result = match peer.source() {
            PeerSource::Process(p) => attestor.attest(p).await,
            #[cfg(test)]
            PeerSource::Fixed(c) => Ok(c.clone()),
        };
        result.map_err(|e| {
            metrics.attestation_failures.inc();
            tracing::debug!(error = %e, "Workload API: caller not attested");
            WorkloadError::from(e)
        })
    }

    /// A stream of `view(state)` for this peer: the current one at once, then each change,
    /// each time for the caller as attested at that moment. `view` returns `None` when the
    /// caller has no identity: PermissionDenied, end. The connection counts as in use while
    /// the stream is open.
    async fn watch<T, F>(&self, peer: Arc<Peer>, view: F) -> Result<WatchStream<T>, WorkloadError>
    where
        T: PartialEq + Clone + Send + 'static,
        F: Fn(&Attestor, &Caller, &AgentState) -> Option<T> + Copy + Send + Sync + 'static,
    {
        let guard = peer.begin_request();
        let mut rx = self.state.clone();
        let attestor = self.attestor.clone();
        let metrics = self.metrics.clone();
        let caller = Self::attest(&attestor, &metrics, &peer).await?;
        tracing::debug!(uid = caller.uid, pid = ?caller.pid, exe = ?caller.exe, pod = ?caller.pod.as_ref().map(|p| (&p.namespace, &p.name)), "Workload API request");
        let first = {
            let state = rx.borrow_and_update();
            view(&attestor, &caller, &state)
        }
        .ok_or(WorkloadError::NoIdentity)?;
        struct Watch<T> {
            rx: StateReceiver,
            pending: Option<T>,
            last: Option<T>,
            done: bool,
            peer: Arc<Peer>,
            _guard: ActiveGuard,
        }
        let init = Watch {
            rx,
            pending: Some(first),
            last: None,
            done: false,
            peer,
            _guard: guard,
        };
        let stream = futures::stream::unfold(init, move |mut w| {
            let attestor = attestor.clone();
            let metrics = metrics.clone();
            async move {
                if w.done {
                    return None;
                }
                if let Some(item) = w.pending.take() {
                    w.last = Some(item.clone());
                    return Some((Ok(item), w));
                }
                loop {
                    // The sender went away: the agent is shutting down; end the stream.
                    w.rx.changed().await.ok()?;
                    let state = w.rx.borrow_and_update().clone();
                    // Attested again for every update: the process may have exited, its pid
                    // been reused, or it may run another executable now.
                    let caller = match Self::attest(&attestor, &metrics, &w.peer).await {
                        Ok(c) => c,
                        Err(e) => {
                            w.done = true;
                            return Some((Err(e.into()), w));
                        }
                    };
                    match view(&attestor, &caller, &state) {
                        None => {
                            w.done = true;
                            return Some((Err(WorkloadError::NoIdentity.into()), w));
                        }
                        Some(item) if w.last.as_ref() == Some(&item) => continue,
                        Some(item) => {
                            w.last = Some(item.clone());
                            return Some((Ok(item), w));
                        }
                    }
                }
            }
        });
        Ok(Box::pin(stream))
    }
}

impl WorkloadApi {
    /// `FetchJWTSVID` for `peer`, by the rules of the module documentation.
    async fn fetch_jwt(
        &self,
        peer: &Peer,
        r: pb::JwtsvidRequest,
    ) -> Result<pb::JwtsvidResponse, WorkloadError> {
        let cache = self
            .jwt
            .as_ref()
            .ok_or(WorkloadError::Unsupported("JWT-SVIDs"))?;
        jwt::check_audiences(&r.audience)?;
        let wanted: Option<SpiffeId> = if r.spiffe_id.is_empty() {
            None
        } else {
            Some(
                r.spiffe_id
                    .parse()
                    .map_err(
                        |e: signet_types::SpiffeIdError| WorkloadError::BadSpiffeId {
                            value: signet_types::untrusted::shown(&r.spiffe_id),
                            reason: e.to_string(),
                        },
                    )?,
            )
        };
        let caller = Self::attest(&self.attestor, &self.metrics, peer).await?;
        let state = self.state.borrow().clone();
        cache.apply_taints(&state.jwt_tainted);
        // One token per SPIFFE ID (two entries may name the same one); the first entry that
        // names it is the one minted for.
        let mut chosen: Vec<(&str, &SpiffeId)> = Vec::new();
        for id in self.attestor.identities_for(&caller, &state) {
            let spiffe_id = id.svid.spiffe_id();
            if !chosen.iter().any(|(_, s)| *s == spiffe_id) {
                chosen.push((id.entry_id.as_str(), spiffe_id));
            }
        }
        if chosen.is_empty() {
            return Err(WorkloadError::NoIdentity);
        }
        if let Some(w) = &wanted {
            chosen.retain(|(_, s)| *s == w);
            if chosen.is_empty() {
                return Err(WorkloadError::NotEntitled(w.to_string()));
            }
        }
        let mut svids = Vec::with_capacity(chosen.len());
        for (entry_id, spiffe_id) in chosen {
            let (token, served) = cache
                .get(entry_id, spiffe_id, &r.audience)
                .await
                .map_err(WorkloadError::Jwt)?;
            self.metrics
                .jwt_svids
                .get_or_create(&vec![("source", served.label().to_owned())])
                .inc();
            svids.push(pb::Jwtsvid {
                spiffe_id: spiffe_id.to_string(),
                svid: token.token,
                hint: String::new(),
            });
        }
        Ok(pb::JwtsvidResponse { svids })
    }
}

type WatchStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

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
    let federated_bundles = state
        .federated_for(&ids)
        .into_iter()
        .map(|b| (b.trust_domain.id_string(), concat(&b.roots_der)))
        .collect();
    Some(pb::X509svidResponse {
        svids: ids
            .iter()
            .map(|id| pb::X509svid {
                spiffe_id: id.svid.spiffe_id().to_string(),
                x509_svid: concat(id.svid.certificate().chain_der()),
                x509_svid_key: id.svid.key().pkcs8_der().to_vec(),
                bundle: bundle.clone(),
                hint: String::new(),
            })
            .collect(),
        crl: state.crls_der.to_vec(),
        federated_bundles,
    })
}

/// The X.509 bundles response for a caller, or `None` when it has no identity.
pub fn x509_bundles_view(
    attestor: &Attestor,
    caller: &Caller,
    state: &AgentState,
) -> Option<pb::X509BundlesResponse> {
    let ids = attestor.identities_for(caller, state);
    if ids.is_empty() {
        return None;
    }
    let mut bundles = HashMap::new();
    if !state.trust_domain_id.is_empty() {
        bundles.insert(state.trust_domain_id.clone(), concat(&state.bundle_der));
    }
    for b in state.federated_for(&ids) {
        bundles.insert(b.trust_domain.id_string(), concat(&b.roots_der));
    }
    Some(pb::X509BundlesResponse {
        crl: state.crls_der.to_vec(),
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
        let peer = Self::peer(&req)?;
        Ok(Response::new(self.watch(peer, x509_svid_view).await?))
    }

    async fn fetch_x509_bundles(
        &self,
        req: Request<pb::X509BundlesRequest>,
    ) -> Result<Response<Self::FetchX509BundlesStream>, Status> {
        let peer = Self::peer(&req)?;
        Ok(Response::new(self.watch(peer, x509_bundles_view).await?))
    }

    async fn fetch_jwtsvid(
        &self,
        req: Request<pb::JwtsvidRequest>,
    ) -> Result<Response<pb::JwtsvidResponse>, Status> {
        let peer = Self::peer(&req)?;
        let _active = peer.begin_request();
        Ok(Response::new(
            self.fetch_jwt(&peer, req.into_inner()).await?,
        ))
    }

    async fn fetch_jwt_bundles(
        &self,
        req: Request<pb::JwtBundlesRequest>,
    ) -> Result<Response<Self::FetchJWTBundlesStream>, Status> {
        let peer = Self::peer(&req)?;
        Ok(Response::new(
            self.watch(peer, jwt::jwt_bundles_view).await?,
        ))
    }

    async fn validate_jwtsvid(
        &self,
        req: Request<pb::ValidateJwtsvidRequest>,
    ) -> Result<Response<pb::ValidateJwtsvidResponse>, Status> {
        let peer = Self::peer(&req)?;
        let _active = peer.begin_request();
        let r = req.into_inner();
        // The request's own faults first, as SPIRE answers them; then who is asking.
        let checked = if r.audience.is_empty() {
            Err(WorkloadError::NoAudience)
        } else if r.svid.is_empty() {
            Err(WorkloadError::NoToken)
        } else {
            Ok(())
        };
        let result = match checked {
            Err(e) => Err(e),
            Ok(()) => match Self::attest(&self.attestor, &self.metrics, &peer).await {
                Err(e) => Err(e),
                Ok(caller) => {
                    let state = self.state.borrow().clone();
                    let now = signet_runtime::clock::unix(self.clock.now());
                    let mine = self.attestor.identities_for(&caller, &state);
                    jwt::validate(&state, &mine, &r.audience, &r.svid, now)
                }
            },
        };
        self.metrics
            .jwt_validations
            .get_or_create(&vec![("result", jwt::validation_label(&result).to_owned())])
            .inc();
        Ok(Response::new(result?))
    }
}

#[cfg(test)]
mod tests;
