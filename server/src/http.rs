//! The HTTP listener: `/healthz` (the process is up), `/readyz` (it can issue: the database
//! answers and the ledger is making progress), `/metrics` (Prometheus text).
//!
//! Served with hyper's HTTP/1 directly (not `axum::serve`), so that every connection is
//! bounded: at most `limits.http_max_connections` at once (more are closed at once), headers
//! must arrive within `limits.http_header_read_timeout`, and no connection lives longer than
//! `limits.http_connection_timeout`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::LimitsConfig;
use crate::ledger::LedgerProgress;
use crate::metrics::Metrics;
use crate::store::Store;

#[derive(Clone)]
struct HttpState {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    ledger: Option<Arc<LedgerProgress>>,
}

pub fn router(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Router {
    router_with(store, metrics, None)
}

/// The router, with `/readyz` also checking the ledger writer's progress.
pub fn router_with(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    ledger: Option<Arc<LedgerProgress>>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(HttpState {
            store,
            metrics,
            ledger,
        })
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if let Some(ledger) = &s.ledger
        && let Err(why) = ledger.readiness(Instant::now())
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        );
    }
    match tokio::time::timeout(Duration::from_secs(2), s.store.ping()).await {
        Ok(Ok(())) => (StatusCode::OK, "ready\n".to_owned()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: database did not answer within 2s\n".to_owned(),
        ),
    }
}

async fn metrics_text(State(s): State<HttpState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

/// Serves `router` on `listener` with the connection limits of `limits` until `shutdown`
/// resolves; then stops accepting and waits (at most `http_connection_timeout`) for open
/// connections.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &LimitsConfig,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.http_max_connections));
    let header_timeout = limits.http_header_read_timeout;
    let lifetime = limits.http_connection_timeout;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut refused: u64 = 0;
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            refused += 1;
            metrics.limited("http_connections");
            if refused.is_power_of_two() || refused.is_multiple_of(1024) {
                tracing::warn!(%peer, refused_total = refused,
                    "HTTP connection refused: limits.http_max_connections reached");
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
                .header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            let deadline = tokio::time::sleep(lifetime);
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
                        tracing::debug!(%peer, "HTTP connection closed: limits.http_connection_timeout");
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
        lifetime,
        slots.acquire_many(u32::try_from(limits.http_max_connections).unwrap_or(u32::MAX)),
    )
    .await;
    Ok(())
}
