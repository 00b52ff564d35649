//! The HTTP listener: `/healthz` (the process is up), `/readyz` (it can issue: the database
//! answers, the ledger is making progress, and every named [`ReadinessCheck`] passes),
//! `/metrics` (OpenMetrics or the Prometheus text format, as the scraper asks), and
//! `/crl/<key id>.crl` (the current CRL of that CA key, DER, `application/pkix-crl`; see
//! [`crl_router`]).
//!
//! Served by [`signet_runtime::http::serve`], so that every connection is bounded: at most
//! `limits.http_max_connections` at once and `limits.http_max_connections_per_source` from one
//! source (more are closed at once), headers must arrive within
//! `limits.http_header_read_timeout`, a connection with nothing in flight is closed after
//! `limits.http_idle_timeout`, and no connection lives longer than
//! `limits.http_connection_timeout`. With `probe_listen` set, `/healthz` and `/readyz` are
//! also served there by [`serve_probes`], which no client of `http_listen` can crowd out
//! (why a listener of its own: [`signet_runtime::http`]).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use signet_runtime::http::{HttpListener, Refusal};
use tokio::net::TcpListener;

use crate::clock::Clock;
use crate::config::LimitsConfig;
use crate::ledger::LedgerProgress;
use crate::metrics::Metrics;
use crate::store::LedgerStore;

/// A named condition `/readyz` checks besides the database and the ledger writer:
/// `Err(reason)` makes the server not ready, and the answer names the check
/// (`not ready: <name>: <reason>`).
pub trait ReadinessCheck: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn check(&self) -> Result<(), NotReady>;
}

/// Why a [`ReadinessCheck`] fails: the checked layer's own error (its type is the layer's, e.g.
/// [`crate::checkpoint::RollbackDetected`]), shown as it is after the check's name.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct NotReady(Box<dyn std::error::Error + Send + Sync>);

impl NotReady {
    pub fn new(reason: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(reason))
    }
}

#[derive(Clone)]
struct HttpState {
    store: Arc<dyn LedgerStore>,
    metrics: Arc<Metrics>,
    ledger: Option<Arc<LedgerProgress>>,
    checks: Arc<[Arc<dyn ReadinessCheck>]>,
    /// What the ledger's progress is judged against.
    clock: Arc<dyn Clock>,
}

/// The router, with `/readyz` also checking the ledger writer's progress (at `clock`'s
/// monotonic reading) and `checks`.
pub fn router_with(
    store: Arc<dyn LedgerStore>,
    metrics: Arc<Metrics>,
    ledger: Option<Arc<LedgerProgress>>,
    checks: Vec<Arc<dyn ReadinessCheck>>,
    clock: Arc<dyn Clock>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(HttpState {
            store,
            metrics,
            ledger,
            checks: checks.into(),
            clock,
        })
}

/// `/crl/<key id>.crl`: the CRL the bundle holds for that key (DER), served from memory.
pub fn crl_router(bundle: crate::bundle::BundleHandle) -> Router {
    Router::new()
        .route("/crl/{file}", get(crl))
        .with_state(bundle)
}

async fn crl(
    State(bundle): State<crate::bundle::BundleHandle>,
    Path(file): Path<String>,
) -> axum::response::Response {
    let found = file.strip_suffix(".crl").and_then(|key_id| {
        bundle
            .current()
            .crls
            .iter()
            .find(|c| c.key_id == key_id)
            .map(|c| c.der.clone())
    });
    match found {
        Some(der) => (
            [
                (header::CONTENT_TYPE, "application/pkix-crl"),
                (header::CACHE_CONTROL, "max-age=60"),
            ],
            der,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "no CRL for that CA key (GET /crl/<key id>.crl, key id in lowercase hex)\n",
        )
            .into_response(),
    }
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if let Some(ledger) = &s.ledger
        && let Err(why) = ledger.readiness(s.clock.monotonic().into_std())
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        );
    }
    for c in s.checks.iter() {
        if let Err(why) = c.check() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {}: {why}\n", c.name()),
            );
        }
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

/// OpenMetrics or the text format 0.0.4, as the scraper's `Accept` asks
/// ([`signet_runtime::metrics::negotiate`]).
async fn metrics_text(
    State(s): State<HttpState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let format = signet_runtime::metrics::negotiate(&headers);
    signet_runtime::metrics::response(format, s.metrics.encode(format))
}

/// Serves `router` on `listener` with the connection limits of `limits` until `shutdown`
/// resolves (see [`signet_runtime::http::serve`]). Refused connections are counted in
/// `signet_limited_total{limit="http_connections"}` (listener full) and
/// `{limit="http_connections_per_source"}` (one source at its cap).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &LimitsConfig,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let l = HttpListener {
        name: "http_listen",
        listener,
        limits: limits.http_limits(),
    };
    signet_runtime::http::serve(
        l,
        router,
        move |why| {
            metrics.limited(match why {
                Refusal::ListenerFull => "http_connections",
                Refusal::SourceFull => "http_connections_per_source",
            })
        },
        shutdown,
    )
    .await
}

/// Serves the probes of `router` on `probe_listen` (see [`signet_runtime::http::serve_probes`]).
/// Refusals are counted as `probe_connections` and `probe_connections_per_source`.
pub async fn serve_probes(
    listener: TcpListener,
    router: Router,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    signet_runtime::http::serve_probes(
        "probe_listen",
        listener,
        router,
        move |why| {
            metrics.limited(match why {
                Refusal::ListenerFull => "probe_connections",
                Refusal::SourceFull => "probe_connections_per_source",
            })
        },
        shutdown,
    )
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Mutex;

    use tower::ServiceExt;

    use super::*;
    use crate::store::SqliteStore;

    /// A check whose answer the test sets.
    struct Switch(Mutex<Result<(), HeadWentBack>>);

    #[derive(Debug, Clone, thiserror::Error)]
    #[error("the head went back")]
    struct HeadWentBack;

    impl ReadinessCheck for Switch {
        fn name(&self) -> &'static str {
            "switch"
        }
        fn check(&self) -> Result<(), NotReady> {
            self.0.lock().unwrap().clone().map_err(NotReady::new)
        }
    }

    #[tokio::test]
    async fn readyz_names_a_failing_check_and_recovers_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let url = signet_testutil::sqlite_url(dir.path());
        let store: Arc<dyn LedgerStore> = Arc::new(
            SqliteStore::connect(&url, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        let switch = Arc::new(Switch(Mutex::new(Err(HeadWentBack))));
        let router = router_with(
            store,
            Metrics::new(),
            None,
            vec![switch.clone()],
            Arc::new(crate::clock::SystemClock),
        );
        let readyz = || async {
            let resp = router
                .clone()
                .oneshot(
                    axum::http::Request::get("/readyz")
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            let status = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .unwrap();
            (status, String::from_utf8(body.to_vec()).unwrap())
        };
        assert_eq!(
            readyz().await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: switch: the head went back\n".to_owned()
            )
        );
        *switch.0.lock().unwrap() = Ok(());
        assert_eq!(readyz().await, (StatusCode::OK, "ready\n".to_owned()));
    }
}
