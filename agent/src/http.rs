//! The HTTP listener: `/healthz` (the process is up), `/readyz` (the node is attested and its
//! entries synced: the Workload API serves what it should), `/metrics` (Prometheus text).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// Set once the Workload API listens.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct HttpState {
    metrics: Arc<Metrics>,
    ready: Readiness,
}

pub fn router(metrics: Arc<Metrics>, ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(HttpState { metrics, ready })
}

/// Ready or not, the body lists every sink that fails, is stuck, or refused something (a
/// sink never makes the agent unready: the Workload API does not depend on it).
async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    let detail: String = s
        .metrics
        .sink_problems()
        .iter()
        .map(|p| format!("{p}\n"))
        .collect();
    if s.ready.is_ready() {
        (StatusCode::OK, format!("ready\n{detail}"))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: no node identity or no entries synced yet\n{detail}"),
        )
    }
}

/// OpenMetrics or the text format 0.0.4, as the scraper's `Accept` asks.
async fn metrics_text(
    State(s): State<HttpState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let format = signet_runtime::metrics::negotiate(&headers);
    signet_runtime::metrics::response(format, s.metrics.encode(format))
}

#[cfg(test)]
mod tests {
    use super::*;
    use signet_runtime::clock::SystemClock;
    use tower::ServiceExt;

    async fn get_status(app: &Router, path: &str) -> (StatusCode, String) {
        let resp = app
            .clone()
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .expect("request"),
            )
            .await
            .expect("response");
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn endpoints_answer() {
        let (_tx, rx) = crate::state::channel();
        let ready = Readiness::default();
        let app = router(
            Arc::new(Metrics::new(rx, Arc::new(SystemClock))),
            ready.clone(),
        );
        assert_eq!(get_status(&app, "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get_status(&app, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        ready.set_ready();
        assert_eq!(get_status(&app, "/readyz").await.0, StatusCode::OK);
        let (status, body) = get_status(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("signet_agent_certificates"), "{body}");
    }
}
