//! The HTTP listener: `/healthz` (liveness: the process answers; nothing else), `/readyz`
//! (readiness: whether the Workload API serves what it should, and why not, as
//! [`crate::readiness`] decides and words it, plus one line per sink in trouble), `/metrics`
//! (Prometheus text).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

pub use crate::readiness::Readiness;

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

/// 200 when ready, 503 when not; the body ([`crate::readiness`]'s format) says why either
/// way and lists every sink that fails, is stuck, or refused something (a sink never makes the
/// agent unready: the Workload API does not depend on it).
async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    let report = s.ready.report();
    let body = report.body(&s.metrics.sink_problems());
    let code = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
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
    use signet_runtime::clock::{Clock, SystemClock};
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
        let (code, body) = get_status(&app, "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.starts_with("not ready: no node identity yet\n"),
            "{body}"
        );
        ready.node_obtained("spiffe://example.org/signet/node/n1");
        ready.server_reached();
        ready.set_ready();
        let (code, body) = get_status(&app, "/readyz").await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(body.starts_with("ready\nnode: spiffe://"), "{body}");
        // Banned: not ready, and the fix in the body; liveness is untouched.
        ready.banned("n1", SystemClock.now());
        let (code, body) = get_status(&app, "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("`signetctl node unban n1`"), "{body}");
        assert_eq!(
            get_status(&app, "/healthz").await,
            (StatusCode::OK, "ok\n".into())
        );
        let (status, body) = get_status(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("signet_agent_certificates"), "{body}");
    }
}
