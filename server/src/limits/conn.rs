//! Per-connection bookkeeping on the gRPC listener: how many requests a connection has in
//! flight (streams included), so that a connection with none for `connection_idle_timeout` is
//! closed, as gRPC's `MaxConnectionIdle` does. Long-lived streams (`WatchBundle`) keep their
//! connection busy, so an agent's watch is never cut.
//!
//! The request layer ([`super::layer`]) finds a request's connection by its peer address (the
//! one thing tonic hands both the IO object and the request), through [`ConnRegistry`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::source::SourceSlot;

/// One open connection's state.
#[derive(Debug)]
pub struct ConnState {
    in_flight: AtomicUsize,
    /// When `in_flight` last dropped to zero (or the connection opened).
    idle_since: Mutex<Instant>,
}

impl ConnState {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(crate::clock::monotonic()),
        }
    }

    /// Marks one request in flight until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// When this connection becomes closable, if it is idle now.
    fn idle_deadline(&self, timeout: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = *self
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(since + timeout)
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            *self
                .0
                .idle_since
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = crate::clock::monotonic();
        }
    }
}

/// Open connections by peer address.
#[derive(Debug, Default)]
pub struct ConnRegistry {
    conns: Mutex<HashMap<SocketAddr, Arc<ConnState>>>,
}

impl ConnRegistry {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn register(&self, peer: SocketAddr) -> Arc<ConnState> {
        let state = Arc::new(ConnState::new());
        self.lock().insert(peer, state.clone());
        state
    }

    fn unregister(&self, peer: SocketAddr, state: &Arc<ConnState>) {
        let mut conns = self.lock();
        // A new connection may already reuse the address: remove only our own entry.
        if conns.get(&peer).is_some_and(|s| Arc::ptr_eq(s, state)) {
            conns.remove(&peer);
        }
    }

    /// The connection a request arrived on.
    pub fn get(&self, peer: SocketAddr) -> Option<Arc<ConnState>> {
        self.lock().get(&peer).cloned()
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Arc<ConnState>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection that holds a slot of the listener's connection caps and closes itself (the
/// read side reports end of stream, so hyper drops it) after `idle_timeout` without a request
/// in flight.
pub struct LimitedIo<T> {
    inner: T,
    peer: Option<SocketAddr>,
    state: Arc<ConnState>,
    registry: Arc<ConnRegistry>,
    idle_timeout: Duration,
    timer: Pin<Box<Sleep>>,
    _slots: (OwnedSemaphorePermit, SourceSlot),
}

impl<T> std::fmt::Debug for LimitedIo<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitedIo")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl<T> LimitedIo<T> {
    pub fn new(
        inner: T,
        peer: Option<SocketAddr>,
        registry: Arc<ConnRegistry>,
        idle_timeout: Duration,
        slots: (OwnedSemaphorePermit, SourceSlot),
    ) -> Self {
        let state = match peer {
            Some(p) => registry.register(p),
            None => Arc::new(ConnState::new()),
        };
        Self {
            inner,
            peer,
            state,
            registry,
            idle_timeout,
            timer: Box::pin(tokio::time::sleep(idle_timeout)),
            _slots: slots,
        }
    }

    /// True when the connection has been idle for `idle_timeout`; re-arms the timer otherwise.
    /// Reads tokio's clock ([`crate::clock::monotonic`]), not an injected one: the deadline
    /// re-arms a tokio `Sleep`, which runs on that clock (tests pause and advance it).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> bool {
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = crate::clock::monotonic();
            match self.state.idle_deadline(self.idle_timeout) {
                Some(deadline) if deadline <= now => return true,
                Some(deadline) => self.timer.as_mut().reset(deadline),
                None => self.timer.as_mut().reset(now + self.idle_timeout),
            }
        }
        false
    }
}

impl<T> Drop for LimitedIo<T> {
    fn drop(&mut self) {
        if let Some(p) = self.peer {
            self.registry.unregister(p, &self.state);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for LimitedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending => {
                if this.poll_idle(cx) {
                    tracing::debug!(peer = ?this.peer, timeout = ?this.idle_timeout, "closing idle connection");
                    // End of stream: hyper closes the connection.
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for LimitedIo<T> {
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

/// The request sees the inner stream's connection info (peer address, client certificates).
impl<T: Connected> Connected for LimitedIo<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::sync::Semaphore;

    fn permit() -> (OwnedSemaphorePermit, SourceSlot) {
        let p = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let s = super::super::source::PerSource::new(1)
            .try_take("192.0.2.1".parse().unwrap())
            .unwrap();
        (p, s)
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_ends_and_a_busy_one_does_not() {
        let registry = ConnRegistry::new();
        let peer: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let (client, server) = tokio::io::duplex(64);
        let mut io = LimitedIo::new(
            server,
            Some(peer),
            registry.clone(),
            Duration::from_secs(10),
            permit(),
        );
        let state = registry.get(peer).unwrap();

        // A request in flight for 25 s: the connection stays open past the idle timeout.
        let guard = state.begin();
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(25), io.read(&mut buf)).await;
        assert!(read.is_err(), "closed while a request was in flight");
        drop(guard);

        // Idle from now on: the read side ends after 10 s, not before.
        let started = crate::clock::monotonic();
        let n = io.read(&mut buf).await.unwrap();
        assert_eq!(n, 0);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        drop(client);
        drop(io);
        assert!(registry.get(peer).is_none(), "unregistered on drop");
        assert!(registry.is_empty());
    }

    #[tokio::test]
    async fn a_reused_address_keeps_the_newer_entry() {
        let registry = ConnRegistry::new();
        let peer: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let (_c1, s1) = tokio::io::duplex(8);
        let (_c2, s2) = tokio::io::duplex(8);
        let old = LimitedIo::new(
            s1,
            Some(peer),
            registry.clone(),
            Duration::from_secs(1),
            permit(),
        );
        let new = LimitedIo::new(
            s2,
            Some(peer),
            registry.clone(),
            Duration::from_secs(1),
            permit(),
        );
        drop(old);
        assert!(Arc::ptr_eq(&registry.get(peer).unwrap(), &new.state));
    }
}
