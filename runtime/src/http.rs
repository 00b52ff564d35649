//! A bounded HTTP/1 listener for health, readiness and metrics endpoints.
//!
//! Served with hyper directly (not `axum::serve`) so that every connection is bounded: at most
//! [`HttpLimits::max_connections`] at once (more are closed at once, never queued), the request
//! headers must arrive within [`HttpLimits::header_read_timeout`], and no connection lives
//! longer than [`HttpLimits::connection_timeout`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The bounds of one HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// The longest a connection may stay open, whatever it does.
    pub connection_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(60),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves; then stops
/// accepting and waits (at most `connection_timeout`) for open connections. `on_refused` is
/// called for each connection closed because the cap was reached (count it in metrics).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    on_refused: impl Fn() + Send,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut refused: u64 = 0;
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            refused += 1;
            on_refused();
            if refused.is_power_of_two() || refused.is_multiple_of(1024) {
                tracing::warn!(%peer, refused_total = refused,
                    "HTTP connection refused: the listener's connection cap is reached");
            }
            drop(tcp);
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            let deadline = tokio::time::sleep(limits.connection_timeout);
            let mut deadline = std::pin::pin!(deadline);
            let mut draining = false;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "HTTP connection ended");
                        }
                        break;
                    }
                    () = &mut deadline => {
                        tracing::debug!(%peer, "HTTP connection closed: it reached the connection lifetime bound");
                        break;
                    }
                    _ = stop.wait_for(|s| *s), if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(limits: HttpLimits) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let refused = Arc::new(AtomicUsize::new(0));
        let r = refused.clone();
        let router = Router::new().route("/healthz", axum::routing::get(|| async { "ok\n" }));
        tokio::spawn(serve(
            listener,
            router,
            limits,
            move || {
                r.fetch_add(1, Ordering::Relaxed);
            },
            std::future::pending(),
        ));
        (addr, refused)
    }

    async fn get(addr: std::net::SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    /// Reads until the peer closes (or 5 s pass).
    async fn closed_by_peer(s: &mut TcpStream) -> bool {
        let mut buf = [0u8; 256];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn serves_and_closes_a_half_sent_request_after_the_header_timeout() {
        let limits = HttpLimits {
            max_connections: 4,
            header_read_timeout: Duration::from_millis(300),
            connection_timeout: Duration::from_secs(30),
        };
        let (addr, _) = start(limits).await;
        assert!(get(addr).await.contains("200 OK"));
        let mut half = TcpStream::connect(addr).await.expect("connect");
        half.write_all(b"GET /healthz HTTP/1.1\r\nhost:")
            .await
            .expect("write");
        assert!(
            closed_by_peer(&mut half).await,
            "a half-sent request is held"
        );
        assert!(get(addr).await.contains("200 OK"));
    }

    #[tokio::test]
    async fn connections_past_the_cap_are_closed_and_slots_come_back() {
        let limits = HttpLimits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(30),
            connection_timeout: Duration::from_secs(30),
        };
        let (addr, refused) = start(limits).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .expect("write");
            let mut buf = [0u8; 64];
            assert!(s.read(&mut buf).await.expect("read") > 0);
            held.push(s);
        }
        let mut extra = TcpStream::connect(addr).await.expect("connect");
        assert!(closed_by_peer(&mut extra).await, "past the cap");
        assert!(refused.load(Ordering::Relaxed) >= 1);
        drop(held);
        // The slots free up as the held connections go.
        let mut ok = false;
        for _ in 0..50 {
            if get(addr).await.contains("200 OK") {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ok);
    }

    #[tokio::test]
    async fn no_connection_outlives_its_lifetime_bound() {
        let limits = HttpLimits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(30),
            connection_timeout: Duration::from_millis(300),
        };
        let (addr, _) = start(limits).await;
        // Keep-alive, then silence: closed at the lifetime bound.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 256];
        assert!(s.read(&mut buf).await.expect("read") > 0);
        assert!(closed_by_peer(&mut s).await);
    }
}
