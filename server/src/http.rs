//! The HTTP listener: `/healthz` (the process is up), `/readyz` (it can issue: the database
//! answers), `/metrics` (Prometheus text).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;
use crate::store::Store;

#[derive(Clone)]
struct HttpState {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

pub fn router(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(HttpState { store, metrics })
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
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
