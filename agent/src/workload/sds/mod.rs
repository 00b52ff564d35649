//! Envoy's Secret Discovery Service (`envoy.service.secret.v3.SecretDiscoveryService`) on the
//! Workload API socket, so Envoy and istio-agent get their SPIFFE certificates and trust
//! bundles from signet-agent as they do from SPIRE's agent.
//!
//! - **Same socket, same rules.** SDS shares the Workload API's listener, so a connection is
//!   admitted and its bytes are checked per message exactly as there ([`super::conn`]); the
//!   caller is attested again for every request and for every update a stream sends, never once
//!   per stream. No `workload.spiffe.io` header is needed (Envoy does not send one), as with
//!   SPIRE.
//! - **What a name means** is [`view`]'s business; this module runs the protocol:
//!   state-of-the-world xDS. The first request of a stream must carry the node; the validator
//!   form is chosen from it once, for the stream's life. Every response has a new
//!   `version_info` and `nonce`. A request whose `response_nonce` is not the last nonce sent is
//!   stale and ignored (counted), except the first request of a stream, which is always
//!   answered, whatever nonce it carries (an Envoy reconnecting after an agent restart sends
//!   its old one). A NACK (`error_detail`) is logged and counted and changes nothing: the
//!   stream keeps working and the next change is pushed. A new set of names is answered at
//!   once; an ACK of the same names is not.
//! - **Pushes.** A stream sends its caller's view again on every change of the agent's state
//!   (renewal, taint-driven replacement, bundle or CRL change) and when its CRLs are about to
//!   go stale ([`view::View::recheck_at`]), but only when the resources differ from the last
//!   ones sent. A caller that loses an identity it asked for by name gets PermissionDenied
//!   naming it, and the stream ends (Envoy retries); so does a caller that can no longer be
//!   attested.
//! - **Bounds.** Streams at most per uid and in all ([`crate::config::SdsConfig`]), within the
//!   connection caps and HTTP/2 stream limits of the socket; a stream that sends no request
//!   within `first_request_timeout` ends with DeadlineExceeded; at most [`view::MAX_NAMES`]
//!   names per request. `DeltaSecrets` answers Unimplemented (Envoy falls back to
//!   `StreamSecrets`).

pub mod view;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::Stream;
use prometheus_client::metrics::gauge::Gauge;
use signet_proto::envoy::service::discovery::v3 as xds;
use signet_proto::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use tonic::{Request, Response, Status, Streaming};

use super::conn::{ActiveGuard, ConnLimiter, ConnPermit, Refusal};
use super::{Peer, WorkloadApi, WorkloadError};
use crate::attest::Caller;
use crate::config::SdsConfig;
use crate::state::SharedState;
use view::{Form, Prepared, SdsNames, SdsRefusal, View};

/// The SDS service: the Workload API's state, attestor and metrics, and the SDS options.
#[derive(Clone)]
pub struct Sds {
    api: WorkloadApi,
    shared: Arc<Shared>,
}

struct Shared {
    names: SdsNames,
    disable_spiffe: bool,
    first_request_timeout: Duration,
    streams: Arc<ConnLimiter>,
    /// The last state read, and what every stream shares of it.
    prepared: Mutex<Option<(SharedState, Arc<Prepared>)>>,
    /// Tells this process's responses apart from an earlier run's (nonces are
    /// `<salt>-<version>`).
    salt: u64,
}

impl Sds {
    /// SDS over `api`'s state and attestor, counting in its metrics.
    pub fn new(api: WorkloadApi, config: &SdsConfig) -> Self {
        let salt = api
            .clock
            .now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 ^ u64::from(std::process::id()))
            .unwrap_or_default();
        let gauge: Gauge = api.metrics.sds_streams.clone();
        Self {
            shared: Arc::new(Shared {
                names: SdsNames {
                    svid: config.default_svid_name.clone(),
                    bundle: config.default_bundle_name.clone(),
                    all: config.default_all_bundles_name.clone(),
                },
                disable_spiffe: config.disable_spiffe_cert_validation,
                first_request_timeout: config.first_request_timeout,
                streams: ConnLimiter::new(config.max_streams, config.max_streams_per_uid, gauge),
                prepared: Mutex::new(None),
                salt,
            }),
            api,
        }
    }

    pub fn into_server(self) -> SecretDiscoveryServiceServer<Self> {
        SecretDiscoveryServiceServer::new(self)
    }

    /// What every stream shares of `state`, read once per state.
    fn prepared(&self, state: &SharedState) -> Arc<Prepared> {
        let mut slot = self
            .shared
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((s, p)) = slot.as_ref()
            && Arc::ptr_eq(s, state)
        {
            return p.clone();
        }
        let p = Arc::new(Prepared::of(state));
        *slot = Some((state.clone(), p.clone()));
        p
    }

    /// The view of `names` for `caller` in the agent's current state.
    fn view_now(
        &self,
        caller: &Caller,
        state: &SharedState,
        names: &[String],
        form: Form,
    ) -> Result<View, WorkloadError> {
        let prepared = self.prepared(state);
        let mine = self.api.attestor.identities_for(caller, state);
        let now = self.api.clock.now();
        let v = view::view(&prepared, &mine, names, form, &self.shared.names, now).map_err(
            |r| match r {
                SdsRefusal::NoIdentity => WorkloadError::NoIdentity,
                SdsRefusal::NotServed(names) => WorkloadError::SdsNotServed(quoted(&names)),
                SdsRefusal::AllNeedsSpiffeValidator => WorkloadError::SdsAllNeedsSpiffeValidator,
            },
        )?;
        if v.crls_withheld {
            self.api.metrics.sds_crls_withheld.inc();
            if let view::CrlCover::Incomplete(why) = &prepared.crls {
                tracing::debug!(reason = %why, "SDS: CRLs withheld from a validation context");
            }
        }
        Ok(v)
    }

    fn refused(&self, e: &WorkloadError) {
        let reason = match e {
            WorkloadError::NoIdentity => "no_identity",
            WorkloadError::SdsNotServed(_) => "not_served",
            WorkloadError::SdsNoNode => "no_node",
            WorkloadError::SdsTypeUrl(_) => "type_url",
            WorkloadError::SdsTooManyNames(_) => "too_many_names",
            WorkloadError::SdsAllNeedsSpiffeValidator => "all_needs_spiffe_validator",
            WorkloadError::SdsNoFirstRequest(_) => "no_first_request",
            WorkloadError::SdsStreamCap(_) => "stream_cap",
            WorkloadError::NotAttested(_)
            | WorkloadError::AttestationUnavailable(_)
            | WorkloadError::NoPeer => "not_attested",
            _ => "other",
        };
        self.api
            .metrics
            .sds_refused
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }
}

/// Up to five names, quoted and escaped, then how many more.
fn quoted(names: &[String]) -> String {
    let mut s: Vec<String> = names
        .iter()
        .take(5)
        .map(|n| signet_types::untrusted::quoted(n))
        .collect();
    if names.len() > 5 {
        s.push(format!("and {} more", names.len() - 5));
    }
    s.join(", ")
}

fn check_type_url(type_url: &str) -> Result<(), WorkloadError> {
    if type_url.is_empty() || type_url == view::SECRET_TYPE_URL {
        Ok(())
    } else {
        Err(WorkloadError::SdsTypeUrl(signet_types::untrusted::quoted(
            type_url,
        )))
    }
}

/// One `StreamSecrets` stream.
struct Subscription {
    sds: Sds,
    peer: Arc<Peer>,
    inbound: Streaming<xds::DiscoveryRequest>,
    rx: crate::state::StateReceiver,
    /// Chosen from the first request's node.
    form: Option<Form>,
    /// The names last asked for; `None` before the first request.
    names: Option<Vec<String>>,
    version: u64,
    nonce: Option<String>,
    /// The digest of the resources last sent.
    sent: Option<u64>,
    /// When the view changes by itself (CRLs about to go stale).
    recheck: Option<tokio::time::Instant>,
    first_deadline: tokio::time::Instant,
    done: bool,
    _active: ActiveGuard,
    _permit: ConnPermit,
}

enum Event {
    Request(Box<xds::DiscoveryRequest>),
    /// The client closed its side, or the connection went.
    Closed,
    /// A request could not be read (too large: `max_request_bytes`; not a DiscoveryRequest).
    Unreadable(Status),
    StateChanged(bool),
    Recheck,
    NoFirstRequest,
}

impl Subscription {
    /// The next response, `None` at the end, an error that ends the stream.
    async fn next(&mut self) -> Option<Result<xds::DiscoveryResponse, Status>> {
        if self.done {
            return None;
        }
        loop {
            let subscribed = self.names.is_some();
            let recheck = self.recheck;
            // Requests first: a reply read before a change is judged against the response
            // it answers.
            let event = tokio::select! {
                biased;
                m = self.inbound.message() => match m {
                    Ok(Some(r)) => Event::Request(Box::new(r)),
                    Ok(None) => Event::Closed,
                    Err(s) if matches!(s.code(), tonic::Code::OutOfRange | tonic::Code::Internal) => {
                        Event::Unreadable(s)
                    }
                    Err(_) => Event::Closed,
                },
                c = self.rx.changed(), if subscribed => Event::StateChanged(c.is_ok()),
                () = sleep_until(recheck), if subscribed && recheck.is_some() => Event::Recheck,
                () = tokio::time::sleep_until(self.first_deadline), if !subscribed => Event::NoFirstRequest,
            };
            let step = match event {
                // The client closed its side, or the connection went; or the agent is
                // shutting down: the stream is over.
                Event::Closed | Event::StateChanged(false) => return None,
                Event::Request(req) => self.on_request(*req).await,
                Event::Unreadable(status) => {
                    self.sds
                        .api
                        .metrics
                        .sds_refused
                        .get_or_create(&vec![("reason", "unreadable".to_owned())])
                        .inc();
                    self.done = true;
                    return Some(Err(status));
                }
                Event::StateChanged(true) | Event::Recheck => {
                    self.recheck = None;
                    self.push(false).await
                }
                Event::NoFirstRequest => Err(WorkloadError::SdsNoFirstRequest(
                    self.sds.shared.first_request_timeout,
                )),
            };
            match step {
                Ok(Some(resp)) => return Some(Ok(resp)),
                Ok(None) => continue,
                Err(e) => {
                    self.sds.refused(&e);
                    self.done = true;
                    return Some(Err(e.into()));
                }
            }
        }
    }

    fn count(&self, kind: &str) {
        self.sds
            .api
            .metrics
            .sds_requests
            .get_or_create(&vec![("kind", kind.to_owned())])
            .inc();
    }

    async fn on_request(
        &mut self,
        req: xds::DiscoveryRequest,
    ) -> Result<Option<xds::DiscoveryResponse>, WorkloadError> {
        check_type_url(&req.type_url)?;
        if self.form.is_none() {
            let node = req.node.as_ref().ok_or(WorkloadError::SdsNoNode)?;
            let form = Form::for_node(Some(node), self.sds.shared.disable_spiffe);
            tracing::debug!(
                node = %signet_types::untrusted::shown(&node.id),
                cluster = %signet_types::untrusted::shown(&node.cluster),
                form = form.label(),
                "SDS stream opened"
            );
            self.form = Some(form);
        } else if let Some(last) = &self.nonce {
            if req.response_nonce != *last {
                // A reply to an earlier response: the client has not seen the last one yet.
                self.count("stale");
                return Ok(None);
            }
            if let Some(err) = &req.error_detail {
                self.count("nack");
                // A client can NACK at will: at most one line every 10 s, all streams together.
                if let Some(unlogged) = nack_log_due(self.sds.api.clock.monotonic()) {
                    tracing::warn!(
                        version = %signet_types::untrusted::shown(&req.version_info),
                        code = err.code,
                        error = %signet_types::untrusted::shown(&err.message),
                        nacks_not_logged = unlogged,
                        "SDS: the client rejected the secrets sent (NACK); it keeps its \
                         previous ones, and the next change is sent (counted in \
                         workload_api_sds_requests{{kind=\"nack\"}}; logged at most every 10s)"
                    );
                }
            } else {
                self.count("ack");
            }
        }
        let names =
            view::normalize_names(&req.resource_names).map_err(WorkloadError::SdsTooManyNames)?;
        if self.names.as_ref() == Some(&names) {
            return Ok(None);
        }
        self.count("subscribe");
        self.names = Some(names);
        self.push(true).await
    }

    /// The caller's view now, attested now; `None` when it is what was last sent (unless
    /// `always`).
    async fn push(
        &mut self,
        always: bool,
    ) -> Result<Option<xds::DiscoveryResponse>, WorkloadError> {
        let (Some(names), Some(form)) = (&self.names, self.form) else {
            return Ok(None);
        };
        let caller =
            WorkloadApi::attest(&self.sds.api.attestor, &self.sds.api.metrics, &self.peer).await?;
        let state = self.rx.borrow_and_update().clone();
        let view = self.sds.view_now(&caller, &state, names, form)?;
        self.recheck = view.recheck_at.map(|at| {
            let wait = at
                .duration_since(self.sds.api.clock.now())
                .unwrap_or_default();
            self.sds.api.clock.monotonic() + wait
        });
        let digest = view.digest();
        if !always && self.sent == Some(digest) {
            return Ok(None);
        }
        self.version += 1;
        let nonce = format!("{:016x}-{}", self.sds.shared.salt, self.version);
        self.nonce = Some(nonce.clone());
        self.sent = Some(digest);
        self.sds.api.metrics.sds_responses.inc();
        Ok(Some(xds::DiscoveryResponse {
            version_info: self.version.to_string(),
            resources: view.resources,
            canary: false,
            type_url: view::SECRET_TYPE_URL.to_owned(),
            nonce,
        }))
    }
}

/// Whether a NACK may be logged at `now` (monotonic): `Some(NACKs not logged since the last
/// line)` at most once every 10 s.
fn nack_log_due(now: tokio::time::Instant) -> Option<u64> {
    static LAST: Mutex<(Option<tokio::time::Instant>, u64)> = Mutex::new((None, 0));
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.0.is_some_and(|l| now < l + Duration::from_secs(10)) {
        last.1 += 1;
        return None;
    }
    let unlogged = std::mem::take(&mut last.1);
    last.0 = Some(now);
    Some(unlogged)
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

type SdsStream = Pin<Box<dyn Stream<Item = Result<xds::DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<xds::DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl SecretDiscoveryService for Sds {
    type DeltaSecretsStream = DeltaStream;
    type StreamSecretsStream = SdsStream;

    async fn delta_secrets(
        &self,
        _req: Request<Streaming<xds::DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "SDS: incremental (delta) xDS is not served; use StreamSecrets (state of the world)",
        ))
    }

    async fn stream_secrets(
        &self,
        req: Request<Streaming<xds::DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let peer = WorkloadApi::connection_peer(&req).inspect_err(|e| self.refused(e))?;
        let permit = self.shared.streams.try_acquire(peer.uid()).map_err(|r| {
            let e = WorkloadError::SdsStreamCap(match r {
                Refusal::Total => "max_streams",
                Refusal::PerUid => "max_streams_per_uid",
            });
            self.refused(&e);
            e
        })?;
        let sub = Subscription {
            sds: self.clone(),
            _active: peer.begin_request(),
            peer,
            inbound: req.into_inner(),
            rx: self.api.state.clone(),
            form: None,
            names: None,
            version: 0,
            nonce: None,
            sent: None,
            recheck: None,
            first_deadline: self.api.clock.monotonic() + self.shared.first_request_timeout,
            done: false,
            _permit: permit,
        };
        let stream = futures::stream::unfold(sub, |mut s| async move {
            let item = s.next().await?;
            Some((item, s))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn fetch_secrets(
        &self,
        req: Request<xds::DiscoveryRequest>,
    ) -> Result<Response<xds::DiscoveryResponse>, Status> {
        let result = async {
            let peer = WorkloadApi::connection_peer(&req)?;
            let _active = peer.begin_request();
            let r = req.get_ref();
            check_type_url(&r.type_url)?;
            let names =
                view::normalize_names(&r.resource_names).map_err(WorkloadError::SdsTooManyNames)?;
            let form = Form::for_node(r.node.as_ref(), self.shared.disable_spiffe);
            let caller = WorkloadApi::attest(&self.api.attestor, &self.api.metrics, &peer).await?;
            let state = self.api.state.borrow().clone();
            let view = self.view_now(&caller, &state, &names, form)?;
            self.api.metrics.sds_responses.inc();
            Ok::<_, WorkloadError>(xds::DiscoveryResponse {
                version_info: String::new(),
                resources: view.resources,
                canary: false,
                type_url: view::SECRET_TYPE_URL.to_owned(),
                nonce: String::new(),
            })
        }
        .await;
        match result {
            Ok(r) => Ok(Response::new(r)),
            Err(e) => {
                self.refused(&e);
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests;
