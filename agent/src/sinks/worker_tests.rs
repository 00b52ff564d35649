use super::*;
use crate::metrics::Metrics;
use crate::sinks::SinkErrorKind;
use crate::sinks::health::SinkState;
use signet_runtime::clock::SystemClock;
use std::sync::Mutex;

/// Hangs on the first delivery; records the others.
struct Hanging {
    log: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Sink for Hanging {
    fn name(&self) -> &str {
        "hang"
    }
    async fn deliver(&self, svid: &Delivered) -> Result<Applied, SinkError> {
        let first = self.log.lock().map(|l| l.is_empty()).unwrap_or(false);
        if let Ok(mut l) = self.log.lock() {
            l.push(svid.spiffe_id().to_string());
        }
        if first {
            std::future::pending::<()>().await;
        }
        Ok(Applied::default())
    }
    async fn remove(&self) -> Result<Applied, SinkError> {
        Ok(Applied::default())
    }
}

/// A delivery for `spiffe://example.org/<name>`, with no bundle.
fn delivered(name: &str) -> Delivered {
    Delivered {
        bundle_der: Default::default(),
        ..crate::testing::delivered(&format!("spiffe://example.org/{name}"), 1)
    }
}

/// Always refuses.
struct Refusing;

#[async_trait::async_trait]
impl Sink for Refusing {
    fn name(&self) -> &str {
        "refusing"
    }
    async fn deliver(&self, _: &Delivered) -> Result<Applied, SinkError> {
        Err(SinkError::refused("refusing", "directory is shared"))
    }
    async fn remove(&self) -> Result<Applied, SinkError> {
        Ok(Applied::default())
    }
}

/// Keeps every delivery it was handed.
#[derive(Default)]
struct Keeping(Mutex<Vec<Delivered>>);

#[async_trait::async_trait]
impl Sink for Keeping {
    fn name(&self) -> &str {
        "keeping"
    }
    async fn deliver(&self, d: &Delivered) -> Result<Applied, SinkError> {
        self.0.lock().expect("lock").push(d.clone());
        Ok(Applied::default())
    }
    async fn remove(&self) -> Result<Applied, SinkError> {
        Ok(Applied::default())
    }
}

#[tokio::test(start_paused = true)]
async fn any_change_of_what_a_sink_writes_is_a_delivery_and_nothing_new_is_none() {
    let sink = Arc::new(Keeping::default());
    let mut set = SinkSet::start(
        vec![SinkBinding {
            spiffe_id: "spiffe://example.org/web".parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(5),
            sink: sink.clone(),
        }],
        Telemetry::new(None),
        Arc::new(SystemClock),
        Arc::new(|| 0.5),
    );
    let first = crate::testing::delivered("spiffe://example.org/web", 1);
    let with_crl = Delivered {
        crls_der: vec![vec![1, 9]].into(),
        ..first.clone()
    };
    let newer_crl = Delivered {
        crls_der: vec![vec![2, 9]].into(),
        ..first.clone()
    };
    let other_bundle = Delivered {
        bundle_der: vec![b"another root".to_vec()].into(),
        ..newer_crl.clone()
    };
    let mut handed = Vec::new();
    // Each value twice, the second time in new allocations (as every pass builds them):
    // the CRL arriving after the certificate, a newer CRL alone, a bundle alone, no CRL.
    for d in [&first, &with_crl, &newer_crl, &other_bundle, &first] {
        for copy in [d.clone(), deep_copy(d)] {
            set.update(|_| Some(copy.clone()));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handed.push(d.clone());
    }
    assert_eq!(*sink.0.lock().expect("lock"), handed);
}

/// `d` in allocations of its own.
fn deep_copy(d: &Delivered) -> Delivered {
    Delivered {
        svid: Arc::new((*d.svid).clone()),
        bundle_der: d.bundle_der.to_vec().into(),
        crls_der: d.crls_der.to_vec().into(),
        federated: d.federated.clone(),
    }
}

#[tokio::test(start_paused = true)]
async fn failures_reach_readyz_and_the_metrics() {
    let (_tx, rx) = crate::state::channel();
    let metrics = Arc::new(Metrics::new(rx, Arc::new(SystemClock)));
    let mut set = SinkSet::start(
        vec![SinkBinding {
            spiffe_id: "spiffe://example.org/a".parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(5),
            sink: Arc::new(Refusing),
        }],
        Telemetry::new(Some(metrics.sinks.clone())),
        Arc::new(SystemClock),
        Arc::new(|| 0.5),
    );
    let text = metrics.encode(signet_runtime::metrics::Format::OpenMetrics);
    assert!(
        text.contains("signet_agent_sink_healthy{sink=\"refusing\"} 1"),
        "{text}"
    );
    set.update(|_| Some(delivered("one")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let problems = metrics.sink_problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("sink \"refusing\": failing"),
        "{problems:?}"
    );
    assert!(
        problems[0].contains("refused): directory is shared"),
        "{problems:?}"
    );
    let text = metrics.encode(signet_runtime::metrics::Format::OpenMetrics);
    assert!(
        text.contains("signet_agent_sink_failures_total{sink=\"refusing\",reason=\"refused\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("signet_agent_sink_healthy{sink=\"refusing\"} 0"),
        "{text}"
    );
    let app = crate::http::router(metrics.clone(), crate::http::Readiness::default());
    let resp = tower::ServiceExt::oneshot(
        app,
        axum::http::Request::get("/readyz")
            .body(axum::body::Body::empty())
            .expect("request"),
    )
    .await
    .expect("response");
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("sink \"refusing\": failing"), "{body}");
}

/// A files sink whose directory was made under umask 002: `/readyz` names the sink, the
/// reason and the fix (the agent stays ready: the Workload API does not depend on a sink).
#[tokio::test]
async fn a_group_writable_sink_directory_is_explained_on_readyz() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("certs");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o775)).expect("chmod");
    let (_tx, rx) = crate::state::channel();
    let metrics = Arc::new(Metrics::new(rx, Arc::new(SystemClock)));
    let sink =
        crate::sinks::files::FilesSink::new("web-certs", crate::config::FilesSinkConfig::new(&dir));
    let mut set = SinkSet::start(
        vec![SinkBinding {
            spiffe_id: "spiffe://example.org/web".parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(5),
            sink: Arc::new(sink),
        }],
        Telemetry::new(Some(metrics.sinks.clone())),
        Arc::new(SystemClock),
        Arc::new(|| 0.5),
    );
    set.update(|_| Some(delivered("web")));
    let ready = crate::http::Readiness::default();
    ready.node_obtained("spiffe://example.org/signet/node/n1");
    ready.set_ready();
    let app = crate::http::router(metrics.clone(), ready);
    let mut body = String::new();
    for _ in 0..500 {
        let resp = tower::ServiceExt::oneshot(
            app.clone(),
            axum::http::Request::get("/readyz")
                .body(axum::body::Body::empty())
                .expect("request"),
        )
        .await
        .expect("response");
        assert_eq!(resp.status(), axum::http::StatusCode::OK);
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        body = String::from_utf8_lossy(&bytes).into_owned();
        if body.contains("sink \"web-certs\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let line = body
        .lines()
        .find(|l| l.starts_with("sink \"web-certs\": failing"))
        .unwrap_or_else(|| panic!("{body}"));
    assert!(line.contains("writable by its group"), "{line}");
    assert!(
        line.contains(&format!("`chmod g-w {}`", dir.display())),
        "{line}"
    );
}

/// Counts deliveries under way; each takes `takes`.
struct Slow {
    name: String,
    takes: Duration,
    running: Arc<std::sync::atomic::AtomicUsize>,
    started: Arc<std::sync::atomic::AtomicUsize>,
    finished: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait::async_trait]
impl Sink for Slow {
    fn name(&self) -> &str {
        &self.name
    }
    async fn deliver(&self, _: &Delivered) -> Result<Applied, SinkError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.started.fetch_add(1, SeqCst);
        self.running.fetch_add(1, SeqCst);
        tokio::time::sleep(self.takes).await;
        self.running.fetch_sub(1, SeqCst);
        self.finished.fetch_add(1, SeqCst);
        Ok(Applied::default())
    }
    async fn remove(&self) -> Result<Applied, SinkError> {
        Ok(Applied::default())
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_delivers_in_bounded_slots_and_a_slow_sink_gives_its_slot_back() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let counter = || Arc::new(AtomicUsize::new(0));
    let (running, started, finished) = (counter(), counter(), counter());
    let n = DELIVERY_SLOTS + 4;
    // Each delivery takes three slot leases: the first 16 start at once, the other 4 when
    // the first leases run out, while the first 16 still run.
    let bindings = (0..n)
        .map(|i| SinkBinding {
            spiffe_id: format!("spiffe://example.org/s{i}").parse().expect("id"),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(60),
            sink: Arc::new(Slow {
                name: format!("s{i}"),
                takes: SLOT_LEASE * 3,
                running: running.clone(),
                started: started.clone(),
                finished: finished.clone(),
            }),
        })
        .collect();
    let telemetry = Telemetry::new(None);
    let mut set = SinkSet::start(
        bindings,
        telemetry.clone(),
        Arc::new(SystemClock),
        Arc::new(|| 0.5),
    );
    set.update(|id| Some(delivered(id.path().trim_start_matches('/'))));
    tokio::time::sleep(SLOT_LEASE / 2).await;
    assert_eq!(
        started.load(SeqCst),
        DELIVERY_SLOTS,
        "no more than the slots"
    );
    assert_eq!(running.load(SeqCst), DELIVERY_SLOTS);
    tokio::time::sleep(SLOT_LEASE).await;
    assert_eq!(
        started.load(SeqCst),
        n,
        "the lease ran out: the others start"
    );
    assert_eq!(finished.load(SeqCst), 0);
    tokio::time::sleep(SLOT_LEASE * 4).await;
    assert_eq!(finished.load(SeqCst), n, "every delivery completed");
    assert!(
        telemetry
            .health()
            .reports()
            .iter()
            .all(|(_, r)| r.state == SinkState::Healthy)
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_sink_times_out_is_reported_and_moves_to_the_newest() {
    let sink = Arc::new(Hanging {
        log: Mutex::new(Vec::new()),
    });
    let id: SpiffeId = "spiffe://example.org/a".parse().expect("id");
    let telemetry = Telemetry::new(None);
    let mut set = SinkSet::start(
        vec![SinkBinding {
            spiffe_id: id.clone(),
            deletion_policy: DeletionPolicy::Delete,
            timeout: Duration::from_secs(5),
            sink: sink.clone(),
        }],
        telemetry.clone(),
        Arc::new(SystemClock),
        Arc::new(|| 0.9),
    );
    // update() returns at once although the sink hangs.
    set.update(|_| Some(delivered("one")));
    // Timed out at 5 s, backing off until 5.9 s.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let (_, r) = telemetry.health().reports().remove(0);
    assert_eq!(r.state, SinkState::Failing);
    assert_eq!(r.last_error_kind, Some(SinkErrorKind::Timeout));
    // While it backs off, a newer SVID arrives: that one is delivered, not the old one.
    set.update(|_| Some(delivered("two")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let (_, r) = telemetry.health().reports().remove(0);
    assert_eq!(r.state, SinkState::Healthy);
    assert_eq!(
        sink.log.lock().expect("lock").clone(),
        [
            "spiffe://example.org/one".to_owned(),
            "spiffe://example.org/two".to_owned()
        ]
    );
    assert!(telemetry.health().problems(SystemClock.now()).is_empty());
}
