//! A small OTLP/gRPC trace receiver (the collector's `TraceService`, from the
//! `opentelemetry-proto` types) for the telemetry end-to-end tests: it keeps every span it
//! is sent, flattened to strings, so a test can assert trace ids, parents and attributes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use tonic::{Request, Response, Status};

/// One received span; ids are lower-case hex (`""` for no parent).
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The resource's `service.name`.
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// Every attribute, its value as text.
    pub attributes: BTreeMap<String, String>,
    /// Event attributes and names, as text (searched for leaked secrets).
    pub events: Vec<String>,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

fn text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => hex::encode(b),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut got = Vec::new();
        for rs in request.into_inner().resource_spans {
            let resource = rs
                .resource
                .map(|r| attrs(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(ReceivedSpan {
                        service: service.clone(),
                        name: s.name,
                        trace_id: hex::encode(&s.trace_id),
                        span_id: hex::encode(&s.span_id),
                        parent_span_id: hex::encode(&s.parent_span_id),
                        attributes: attrs(&s.attributes),
                        events: s
                            .events
                            .iter()
                            .map(|e| format!("{} {:?}", e.name, attrs(&e.attributes)))
                            .collect(),
                    });
                }
            }
        }
        self.spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(got);
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running receiver on `127.0.0.1:<port 0>`; stops when dropped.
pub struct OtlpReceiver {
    pub addr: SocketAddr,
    collector: Collector,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("local addr");
        let collector = Collector::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let svc = TraceServiceServer::new(collector.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await;
        });
        Self {
            addr,
            collector,
            _stop: stop,
        }
    }

    /// What a binary's `[telemetry] otlp_endpoint` should say.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.collector
            .spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Polls (every 50 ms, up to `timeout`) until `done` holds for the spans received, and
    /// returns them; panics with what was received when it never does.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; received: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
