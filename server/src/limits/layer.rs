//! The tower layer in front of every gRPC service on the TLS listener. Per request it:
//!
//! 1. marks the request in flight on its connection (idle timeout, see [`super::conn`]);
//! 2. takes a slot of its source's cap (`max_requests_per_source`) and of the server-wide cap: long-lived streams (`WatchBundle`, `WatchEntries`, health `Watch`,
//!    reflection) from `max_watch_streams`, everything else from `max_concurrent_requests`;
//!    a full cap answers ResourceExhausted at once (load shedding, never a queue);
//! 3. applies the per-source rate limits on issuance and attestation;
//! 4. runs the handler with the request's [`super::RequestContext`] (its peer), which the
//!    per-caller rate limit and the audit log read.
//!
//! A stream holds its slots until its response body ends (for as long as it is open); a unary
//! call until its handler is done, so a client that never reads its responses cannot hold
//! them. The connection's in-flight mark lasts until the response body ends.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::conn::{ConnRegistry, InFlight};
use super::rate::{RateLimiter, human, source_key};
use super::source::{PerSource, SourceSlot};
use super::{CONTEXT, RequestContext, resource_exhausted};
use crate::clock::Clock;
use crate::config::LimitsConfig;
use crate::metrics::Metrics;

/// How long a client is told to wait when a server-wide cap is full.
const BUSY_RETRY: Duration = Duration::from_secs(1);

/// What kind of call a gRPC path is, for the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A server stream that stays open (bundle and health watches, reflection).
    Stream,
    /// Asks for a certificate.
    Issuance,
    /// Node attestation (join token or node token).
    Attestation,
    Other,
}

pub fn classify(path: &str) -> CallKind {
    match path {
        "/signet.ca.v1.CertificateAuthority/WatchBundle"
        | "/signet.agent.v1.Node/WatchEntries"
        | "/grpc.health.v1.Health/Watch"
        | "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        | "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo" => CallKind::Stream,
        "/signet.ca.v1.CertificateAuthority/SignCsr"
        | "/istio.v1.auth.IstioCertificateService/CreateCertificate"
        | "/signet.agent.v1.Node/SignWorkloads"
        | "/signet.ca.v1.CertificateAuthority/MintJwtSvid"
        | "/signet.agent.v1.Node/MintWorkloadJwts"
        | "/signet.agent.v1.Node/RenewNode" => CallKind::Issuance,
        "/signet.agent.v1.Node/Attest" => CallKind::Attestation,
        _ => CallKind::Other,
    }
}

/// Shared by every connection's copy of the layer.
pub struct GrpcLimits {
    conns: Arc<ConnRegistry>,
    requests: Arc<Semaphore>,
    max_requests: usize,
    streams: Arc<Semaphore>,
    max_streams: usize,
    per_source: Arc<PerSource>,
    issuance_per_source: RateLimiter<std::net::IpAddr>,
    attestation_per_source: RateLimiter<std::net::IpAddr>,
    metrics: Arc<Metrics>,
    /// What the rate limits' buckets refill by.
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for GrpcLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcLimits")
            .field("max_requests", &self.max_requests)
            .field("max_streams", &self.max_streams)
            .finish_non_exhaustive()
    }
}

/// What a request holds until its response ends.
struct Held {
    _in_flight: Option<InFlight>,
    slots: Option<(OwnedSemaphorePermit, Option<SourceSlot>)>,
}

impl Held {
    /// A unary call's handler is done: its slots are free again even if the client is slow to
    /// read the response (the body keeps only the connection's in-flight mark). A stream keeps
    /// its slots for as long as it is open.
    fn handler_done(&mut self, kind: CallKind) {
        if kind != CallKind::Stream {
            self.slots = None;
        }
    }
}

impl GrpcLimits {
    pub fn new(
        cfg: &LimitsConfig,
        conns: Arc<ConnRegistry>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        Arc::new(Self {
            conns,
            requests: Arc::new(Semaphore::new(cfg.max_concurrent_requests)),
            max_requests: cfg.max_concurrent_requests,
            streams: Arc::new(Semaphore::new(cfg.max_watch_streams)),
            max_streams: cfg.max_watch_streams,
            per_source: PerSource::new(cfg.max_requests_per_source),
            issuance_per_source: RateLimiter::new(cfg.issuance_per_source, cfg.rate_limit_max_keys),
            attestation_per_source: RateLimiter::new(
                cfg.attestation_per_source,
                cfg.rate_limit_max_keys,
            ),
            metrics,
            clock,
        })
    }

    /// Admits a request, or says why not (a ResourceExhausted status with a retry hint).
    fn admit(&self, kind: CallKind, peer: Option<SocketAddr>) -> Result<Held, tonic::Status> {
        let source = peer.map(|p| source_key(p.ip()));
        let limited = match kind {
            CallKind::Issuance => Some((
                &self.issuance_per_source,
                "certificate requests",
                "limits.issuance_per_source",
            )),
            CallKind::Attestation => Some((
                &self.attestation_per_source,
                "node attestations",
                "limits.attestation_per_source",
            )),
            CallKind::Stream | CallKind::Other => None,
        };
        if let (Some((limiter, what, key)), Some(src)) = (limited, source)
            && let Err(wait) = limiter.check(&src, self.clock.monotonic().into_std())
        {
            self.metrics.limited("per_source");
            return Err(resource_exhausted(
                format!(
                    "too many {what} from {src}: retry in {} ({key})",
                    human(wait)
                ),
                wait,
            ));
        }
        let source_slot = match peer {
            None => None,
            Some(p) => Some(self.per_source.try_take(p.ip()).ok_or_else(|| {
                self.metrics.limited("per_source_in_flight");
                resource_exhausted(
                    format!(
                        "{} has {} requests and streams open, the most one source may hold \
                         (limits.max_requests_per_source): retry in {}",
                        source_key(p.ip()),
                        self.per_source.max(),
                        human(BUSY_RETRY)
                    ),
                    BUSY_RETRY,
                )
            })?),
        };
        let (sem, max, what, key) = match kind {
            CallKind::Stream => (
                &self.streams,
                self.max_streams,
                "open streams",
                "limits.max_watch_streams",
            ),
            _ => (
                &self.requests,
                self.max_requests,
                "requests in progress",
                "limits.max_concurrent_requests",
            ),
        };
        let slot = sem.clone().try_acquire_owned().map_err(|_| {
            self.metrics.limited(if kind == CallKind::Stream {
                "streams"
            } else {
                "requests"
            });
            resource_exhausted(
                format!(
                    "the server is at its limit of {max} {what} ({key}): retry in {}",
                    human(BUSY_RETRY)
                ),
                BUSY_RETRY,
            )
        })?;
        let in_flight = peer.and_then(|p| self.conns.get(p)).map(|c| c.begin());
        Ok(Held {
            _in_flight: in_flight,
            slots: Some((slot, source_slot)),
        })
    }
}

#[derive(Clone, Debug)]
pub struct GrpcLimitLayer(pub Arc<GrpcLimits>);

impl<S> tower::Layer<S> for GrpcLimitLayer {
    type Service = GrpcLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcLimitService {
            inner,
            limits: self.0.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GrpcLimitService<S> {
    inner: S,
    limits: Arc<GrpcLimits>,
}

fn peer_of<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    let ext = req.extensions();
    ext.get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.get_ref().remote_addr())
        .or_else(|| ext.get::<TcpConnectInfo>().and_then(|i| i.remote_addr()))
}

impl<S> tower::Service<http::Request<Body>> for GrpcLimitService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let peer = peer_of(&req);
        let kind = classify(req.uri().path());
        let mut held = match self.limits.admit(kind, peer) {
            Ok(h) => h,
            Err(status) => return Box::pin(async move { Ok(status.into_http()) }),
        };
        // The standard tower dance: the clone that was made ready serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let ctx = RequestContext { peer };
        Box::pin(CONTEXT.scope(ctx, async move {
            let resp = inner.call(req).await?;
            held.handler_done(kind);
            Ok(resp.map(|body| {
                Body::new(Guarded {
                    inner: body,
                    _held: held,
                })
            }))
        }))
    }
}

/// A response body that keeps the request's slot until it ends or is dropped.
struct Guarded {
    inner: Body,
    _held: Held,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::clock::fake::FakeClock;
    use crate::config::RateConfig;

    fn limits(cfg: LimitsConfig) -> Arc<GrpcLimits> {
        limits_at(cfg, FakeClock::at_unix(1_000u64))
    }

    /// The limits on a clock the test moves.
    fn limits_at(cfg: LimitsConfig, clock: FakeClock) -> Arc<GrpcLimits> {
        GrpcLimits::new(&cfg, ConnRegistry::new(), Metrics::new(), Arc::new(clock))
    }

    #[test]
    fn paths_are_classified() {
        assert_eq!(
            classify("/signet.ca.v1.CertificateAuthority/WatchBundle"),
            CallKind::Stream
        );
        assert_eq!(
            classify("/signet.ca.v1.CertificateAuthority/SignCsr"),
            CallKind::Issuance
        );
        assert_eq!(
            classify("/istio.v1.auth.IstioCertificateService/CreateCertificate"),
            CallKind::Issuance
        );
        assert_eq!(
            classify("/signet.agent.v1.Node/Attest"),
            CallKind::Attestation
        );
        assert_eq!(
            classify("/signet.ca.v1.CertificateAuthority/GetBundle"),
            CallKind::Other
        );
    }

    #[test]
    fn caps_shed_load_and_free_their_slot_when_the_response_ends() {
        let l = limits(LimitsConfig {
            max_watch_streams: 2,
            max_concurrent_requests: 1,
            ..LimitsConfig::default()
        });
        let a = l.admit(CallKind::Stream, None).unwrap();
        let _b = l.admit(CallKind::Stream, None).unwrap();
        let refused = l.admit(CallKind::Stream, None).err().unwrap();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("limits.max_watch_streams"),
            "{}",
            refused.message()
        );
        assert_eq!(
            refused.metadata().get("grpc-retry-pushback-ms").unwrap(),
            "1000"
        );
        // Unary requests have their own cap: streams do not starve them.
        let mut r = l.admit(CallKind::Other, None).unwrap();
        assert!(l.admit(CallKind::Issuance, None).is_err());
        // The handler is done: the slot is free though the response is still being read.
        r.handler_done(CallKind::Other);
        let r2 = l.admit(CallKind::Other, None).unwrap();
        drop((r, r2));
        // A stream's slot outlives its handler.
        let mut w = a;
        w.handler_done(CallKind::Stream);
        assert!(l.admit(CallKind::Stream, None).is_err());
        drop(w);
        l.admit(CallKind::Stream, None).unwrap();
        l.admit(CallKind::Other, None).unwrap();
    }

    #[test]
    fn one_source_cannot_hold_every_slot() {
        let l = limits(LimitsConfig {
            max_requests_per_source: 2,
            ..LimitsConfig::default()
        });
        let a: SocketAddr = "192.0.2.1:1000".parse().unwrap();
        let a2: SocketAddr = "192.0.2.1:2000".parse().unwrap();
        let b: SocketAddr = "192.0.2.2:1000".parse().unwrap();
        let _x = l.admit(CallKind::Stream, Some(a)).unwrap();
        let y = l.admit(CallKind::Other, Some(a2)).unwrap();
        let refused = l.admit(CallKind::Other, Some(a)).err().unwrap();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("limits.max_requests_per_source"),
            "{}",
            refused.message()
        );
        l.admit(CallKind::Other, Some(b)).unwrap();
        drop(y);
        l.admit(CallKind::Other, Some(a)).unwrap();
    }

    #[test]
    fn per_source_limits_name_the_source_and_the_wait() {
        let clock = FakeClock::at_unix(1_000u64);
        let l = limits_at(
            LimitsConfig {
                attestation_per_source: RateConfig::new(2, 0.5),
                ..LimitsConfig::default()
            },
            clock.clone(),
        );
        let a: SocketAddr = "192.0.2.1:1000".parse().unwrap();
        let b: SocketAddr = "192.0.2.2:1000".parse().unwrap();
        l.admit(CallKind::Attestation, Some(a)).unwrap();
        l.admit(CallKind::Attestation, Some(a)).unwrap();
        let refused = l.admit(CallKind::Attestation, Some(a)).err().unwrap();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("192.0.2.1"),
            "{}",
            refused.message()
        );
        assert!(
            refused.message().contains("retry in 2.0s"),
            "{}",
            refused.message()
        );
        let ms: u64 = refused
            .metadata()
            .get("grpc-retry-pushback-ms")
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        // No time passed on the injected clock: the hint is exactly the refill time.
        assert_eq!(ms, 2000);
        // Another source, and other calls from the same source, are unaffected.
        l.admit(CallKind::Attestation, Some(b)).unwrap();
        l.admit(CallKind::Issuance, Some(a)).unwrap();
        // The wait is over when the clock says so, and not before.
        clock.advance(Duration::from_secs(1));
        assert!(l.admit(CallKind::Attestation, Some(a)).is_err());
        clock.advance(Duration::from_secs(1));
        l.admit(CallKind::Attestation, Some(a)).unwrap();
    }
}
