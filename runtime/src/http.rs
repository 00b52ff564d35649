//! Bounded HTTP/1 listeners: the one each binary runs for `/healthz`, `/readyz` and `/metrics`
//! (`http_listen`; the server's CRLs and checkpoints too), the server's SPIFFE bundle endpoint
//! (the same over TLS, [`serve_with`]), and the probe listener ([`serve_probes`]).
//!
//! Served with hyper directly (not `axum::serve`) so that every connection is bounded:
//! - at most [`HttpLimits::max_connections`] at once, and at most
//!   [`HttpLimits::max_connections_per_source`] from one source (an IPv4 address, an IPv6 /64;
//!   see [`crate::source`]). A connection over either cap is closed as soon as it is accepted
//!   (never queued, no byte read), reported to the caller's `on_refused` (its metric), and
//!   logged at most once per [`REFUSAL_LOG_INTERVAL`] per listener, with the count since;
//! - a TLS handshake, when there is one, within the handshake's own timeout
//!   ([`Handshake`]), and the request headers within [`HttpLimits::header_read_timeout`];
//! - a connection with no request in flight that has received nothing for
//!   [`HttpLimits::idle_timeout`] is closed: a new connection must start its first request,
//!   and a keep-alive connection its next one, within it;
//! - no connection lives longer than [`HttpLimits::connection_timeout`], handshake included.
//!
//! # Why the probes have a listener of their own
//!
//! The caps keep one source from holding a listener, but a listener whose cap is full, of one
//! source's connections or of many sources', still refuses the kubelet: its readiness probe
//! fails and the replica leaves its Service, its liveness probe fails and the container is
//! restarted (issue 24, finding 5: 70 idle connections from one pod did that to every server
//! replica). Reserving slots on the shared listener for probe requests cannot work: which path
//! a connection will ask for is known only once its headers are read, and by then it holds a
//! slot; refusing or evicting on a guess hands the attacker the same lever. So the probes get
//! a listener of their own ([`serve_probes`]; `probe_listen` in the server's and the agent's
//! configuration, `--health-addr` for the bridge) that answers nothing but [`PROBE_PATHS`],
//! within [`HttpLimits::PROBES`]: sized for the kubelet, which opens one connection per probe,
//! sends one request and closes, so that holding one of its slots costs an attacker a new
//! connection every second. In Kubernetes the deploy/ manifests point the probes at it and
//! admit it only from the nodes (NetworkPolicy). The probe paths stay on `http_listen` too, for
//! whatever else polls them there.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::clock::{Clock, SystemClock};
use crate::source::{PerSource, SourceSlot};

/// The paths a probe listener answers; anything else is 404 there.
pub const PROBE_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// At most one "connection refused" line per listener this often (with the count since the
/// last line): a flood of refused connections must not also flood the log.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The bounds of one HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Of those, from one source (an IPv4 address, an IPv6 /64); more are closed likewise.
    pub max_connections_per_source: usize,
    /// How long a connection may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight and nothing received
    /// (before its first request, and between keep-alive requests).
    pub idle_timeout: Duration,
    /// The longest a connection may stay open, whatever it does.
    pub connection_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_connections_per_source: 8,
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(3),
            connection_timeout: Duration::from_secs(60),
        }
    }
}

impl HttpLimits {
    /// The probe listener's bounds, fixed: the kubelet sends one small request per connection
    /// (`Connection: close`) and gives up after its probe timeout (1 s by default), so nothing
    /// legitimate needs more; an attacker gets little.
    pub const PROBES: HttpLimits = HttpLimits {
        max_connections: 32,
        max_connections_per_source: 8,
        header_read_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(1),
        connection_timeout: Duration::from_secs(10),
    };

    /// Every count and timeout must be positive (a zero would refuse everything or wait
    /// forever), and one source may not be allowed more than the whole listener. `key` names a
    /// field as the binary's configuration spells it (`max_connections` ->
    /// `limits.http_max_connections`), for the message.
    pub fn validate(&self, key: impl Fn(&'static str) -> String) -> Result<(), HttpLimitsError> {
        let counts = [
            ("max_connections", self.max_connections),
            (
                "max_connections_per_source",
                self.max_connections_per_source,
            ),
        ];
        for (field, v) in counts {
            if v == 0 {
                return Err(HttpLimitsError::Zero(key(field)));
            }
        }
        let durations = [
            ("header_read_timeout", self.header_read_timeout),
            ("idle_timeout", self.idle_timeout),
            ("connection_timeout", self.connection_timeout),
        ];
        for (field, v) in durations {
            if v.is_zero() {
                return Err(HttpLimitsError::Zero(key(field)));
            }
        }
        if self.max_connections_per_source > self.max_connections {
            return Err(HttpLimitsError::PerSourceAboveTotal {
                per_source_key: key("max_connections_per_source"),
                per_source: self.max_connections_per_source,
                total_key: key("max_connections"),
                total: self.max_connections,
            });
        }
        Ok(())
    }
}

/// Why a set of [`HttpLimits`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpLimitsError {
    #[error("{0} must be positive (a zero would refuse everything or wait forever)")]
    Zero(String),
    #[error(
        "{per_source_key} ({per_source}) is larger than {total_key} ({total}): one source \
         could take the whole listener"
    )]
    PerSourceAboveTotal {
        per_source_key: String,
        per_source: usize,
        total_key: String,
        total: usize,
    },
}

/// Which cap closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The listener held [`HttpLimits::max_connections`].
    ListenerFull,
    /// The connection's source held [`HttpLimits::max_connections_per_source`].
    SourceFull,
}

impl Refusal {
    /// The limit's field name, for metric labels and logs.
    pub fn limit(self) -> &'static str {
        match self {
            Refusal::ListenerFull => "max_connections",
            Refusal::SourceFull => "max_connections_per_source",
        }
    }
}

/// One bounded listener: its name in logs (its configuration key, e.g. `http_listen`), its
/// socket and its bounds.
#[derive(Debug)]
pub struct HttpListener {
    pub name: &'static str,
    pub listener: TcpListener,
    pub limits: HttpLimits,
}

/// What turns an accepted TCP connection into the stream HTTP is spoken on: nothing
/// ([`Plain`]) or a TLS handshake (the server's bundle endpoint). An implementation bounds its
/// own handshake in time; the connection's lifetime bound applies as well.
pub trait Handshake: Clone + Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

/// Plain HTTP: the TCP stream as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = std::io::Result<TcpStream>> + Send {
        std::future::ready(Ok(tcp))
    }
}

/// Serves `router` on `l` within its limits until `shutdown` resolves; then stops accepting
/// and waits (at most `connection_timeout`) for open connections. `on_refused` is called for
/// each connection closed by a cap (count it in metrics).
pub async fn serve(
    l: HttpListener,
    router: Router,
    on_refused: impl Fn(Refusal) + Send,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    accept_loop(l, Plain, Routes::All(router), on_refused, shutdown).await
}

/// Serves the probes of `router` ([`PROBE_PATHS`]; every other path is 404) on `listener`
/// within [`HttpLimits::PROBES`] (see the module docs for why probes have a listener of their
/// own). `name` is the listener's configuration key, for logs.
pub async fn serve_probes(
    name: &'static str,
    listener: TcpListener,
    router: Router,
    on_refused: impl Fn(Refusal) + Send,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let l = HttpListener {
        name,
        listener,
        limits: HttpLimits::PROBES,
    };
    accept_loop(
        l,
        Plain,
        Routes::Only(router, &PROBE_PATHS),
        on_refused,
        shutdown,
    )
    .await
}

/// [`serve`], with each accepted connection first passed through `handshake` (TLS).
pub async fn serve_with<H: Handshake>(
    l: HttpListener,
    handshake: H,
    router: Router,
    on_refused: impl Fn(Refusal) + Send,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    accept_loop(l, handshake, Routes::All(router), on_refused, shutdown).await
}

/// What a listener answers: every route of its router, or only some paths of it.
#[derive(Clone)]
enum Routes {
    All(Router),
    Only(Router, &'static [&'static str]),
}

async fn accept_loop<H: Handshake>(
    l: HttpListener,
    handshake: H,
    routes: Routes,
    on_refused: impl Fn(Refusal) + Send,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let HttpListener {
        name,
        listener,
        limits,
    } = l;
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_source = PerSource::new(limits.max_connections_per_source);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut log = RefusalLog::default();
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(listener = name, error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let taken = per_source
            .try_take(peer.ip())
            .ok_or(Refusal::SourceFull)
            .and_then(|source| {
                let slot = slots.clone().try_acquire_owned();
                slot.map(|slot| (slot, source))
                    .map_err(|_| Refusal::ListenerFull)
            });
        let held = match taken {
            Ok(held) => held,
            Err(why) => {
                on_refused(why);
                if let Some(since) = log.note(SystemClock.monotonic()) {
                    tracing::warn!(
                        listener = name,
                        %peer,
                        limit = why.limit(),
                        refused = since,
                        refused_total = log.total,
                        "HTTP connection refused: a connection cap is reached"
                    );
                }
                drop(tcp);
                continue;
            }
        };
        let ctx = ConnCtx {
            name,
            peer,
            limits,
            stop: stop_rx.clone(),
        };
        tokio::spawn(connection(
            tcp,
            handshake.clone(),
            routes.clone(),
            ctx,
            held,
        ));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Connections end by themselves within their lifetime bound; wait for them (the permits).
    let _ = tokio::time::timeout(
        limits.connection_timeout,
        slots.acquire_many(u32::try_from(limits.max_connections).unwrap_or(u32::MAX)),
    )
    .await;
    Ok(())
}

/// What a connection's task knows besides its stream.
struct ConnCtx {
    name: &'static str,
    peer: SocketAddr,
    limits: HttpLimits,
    stop: watch::Receiver<bool>,
}

async fn connection<H: Handshake>(
    tcp: TcpStream,
    handshake: H,
    routes: Routes,
    ctx: ConnCtx,
    _held: (OwnedSemaphorePermit, SourceSlot),
) {
    let deadline = SystemClock.monotonic() + ctx.limits.connection_timeout;
    let io = match tokio::time::timeout_at(deadline, handshake.handshake(tcp)).await {
        Ok(Ok(io)) => io,
        Ok(Err(e)) => {
            tracing::debug!(listener = ctx.name, peer = %ctx.peer, error = %e, "handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(listener = ctx.name, peer = %ctx.peer, "handshake outlived the connection");
            return;
        }
    };
    serve_connection(io, routes, ctx, deadline).await;
}

/// Serves HTTP/1 on one established stream until the client is done, the connection has been
/// idle for `idle_timeout`, `deadline` passes, or the listener stops.
async fn serve_connection<I>(io: I, routes: Routes, mut ctx: ConnCtx, deadline: Instant)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = ctx.limits;
    let activity = Arc::new(Activity::new());
    let io = Watched {
        inner: io,
        activity: activity.clone(),
    };
    let service = Tracked {
        routes,
        activity: activity.clone(),
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let lifetime = tokio::time::sleep_until(deadline);
    let mut lifetime = std::pin::pin!(lifetime);
    let idle = tokio::time::sleep(limits.idle_timeout);
    let mut idle = std::pin::pin!(idle);
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(listener = ctx.name, peer = %ctx.peer, error = %e, "HTTP connection ended");
                }
                break;
            }
            () = &mut lifetime => {
                tracing::debug!(listener = ctx.name, peer = %ctx.peer,
                    "HTTP connection closed: it reached the connection lifetime bound");
                break;
            }
            () = &mut idle, if !closing => {
                let now = SystemClock.monotonic();
                match activity.idle_deadline(limits.idle_timeout) {
                    Some(at) if at <= now => {
                        tracing::debug!(listener = ctx.name, peer = %ctx.peer,
                            "HTTP connection closed: idle for the idle timeout");
                        closing = true;
                        // Closes an idle connection at once; a response being written is
                        // finished first.
                        conn.as_mut().graceful_shutdown();
                    }
                    Some(at) => idle.as_mut().reset(at),
                    None => idle.as_mut().reset(now + limits.idle_timeout),
                }
            }
            _ = ctx.stop.wait_for(|s| *s), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// When a connection last did something, and how many of its requests are being handled.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(SystemClock.monotonic()),
        }
    }

    fn touch(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = SystemClock.monotonic();
    }

    fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// When the connection becomes idle long enough to close, unless a request is in flight.
    fn idle_deadline(&self, timeout: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let last = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        Some(last + timeout)
    }
}

/// A request being handled; its end counts as activity.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The stream, noting when bytes arrive.
struct Watched<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.touch();
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The router as hyper calls it, counting requests in flight and answering only the allowed
/// paths.
#[derive(Clone)]
struct Tracked {
    routes: Routes,
    activity: Arc<Activity>,
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<http::Request<Incoming>> for Tracked {
    type Response = Response;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let busy = self.activity.begin();
        let router = match &self.routes {
            Routes::All(r) => r.clone(),
            Routes::Only(r, paths) if paths.iter().any(|p| *p == req.uri().path()) => r.clone(),
            Routes::Only(..) => {
                drop(busy);
                let resp = (
                    http::StatusCode::NOT_FOUND,
                    "this listener answers only /healthz and /readyz\n",
                )
                    .into_response();
                return Box::pin(std::future::ready(Ok(resp)));
            }
        };
        let fut = router.oneshot(req.map(Body::new));
        Box::pin(async move {
            let resp = fut.await;
            drop(busy);
            resp
        })
    }
}

/// Throttles the "connection refused" log line of one listener: the first refusal is logged,
/// then at most one line per [`REFUSAL_LOG_INTERVAL`] with the count since the last one.
#[derive(Debug, Default)]
struct RefusalLog {
    next: Option<Instant>,
    since: u64,
    total: u64,
}

impl RefusalLog {
    /// Counts one refusal at `now`; `Some(n)` when a line is due, `n` refusals since the last.
    fn note(&mut self, now: Instant) -> Option<u64> {
        self.total += 1;
        self.since += 1;
        if self.next.is_some_and(|next| now < next) {
            return None;
        }
        self.next = Some(now + REFUSAL_LOG_INTERVAL);
        Some(std::mem::take(&mut self.since))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
