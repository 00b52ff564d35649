//! A small OTLP/gRPC trace receiver (the collector's `TraceService`, from the
//! `opentelemetry-proto` types) for the telemetry end-to-end tests: it keeps every span it
//! is sent, flattened to strings, so a test can assert trace ids, parents and attributes.
//! Plain ([`OtlpReceiver::start`]) or over TLS, optionally requiring a client certificate
//! ([`OtlpReceiver::start_tls`], with a test PKI from [`TestPki`]).

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
    tls: bool,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// A CA and certificates it signed, as PEM files in a directory of their own.
pub struct TestPki {
    _dir: tempfile::TempDir,
    pub ca_file: std::path::PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    dir: std::path::PathBuf,
}

/// A certificate and its key, as PEM text and as files.
pub struct IssuedPem {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
}

impl TestPki {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = p.self_signed(&key).unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        Self {
            ca_file,
            issuer: rcgen::Issuer::new(p, key),
            dir: dir.path().to_owned(),
            _dir: dir,
        }
    }

    /// A certificate for 127.0.0.1 and `localhost` (server and client use), written as
    /// `<name>.pem` and `<name>-key.pem`.
    pub fn issue(&self, name: &str) -> IssuedPem {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.subject_alt_names
            .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
        p.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        let cert_file = self.dir.join(format!("{name}.pem"));
        let key_file = self.dir.join(format!("{name}-key.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        IssuedPem {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_file,
            key_file,
        }
    }

    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(&self.ca_file).unwrap()
    }
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Over TLS with `server`'s certificate; with `client_ca`, only clients presenting a
    /// certificate it signed are served.
    pub async fn start_tls(server: &IssuedPem, client_ca: Option<&TestPki>) -> Self {
        let mut tls = tonic::transport::ServerTlsConfig::new().identity(
            tonic::transport::Identity::from_pem(&server.cert_pem, &server.key_pem),
        );
        if let Some(ca) = client_ca {
            tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(ca.ca_pem()));
        }
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<tonic::transport::ServerTlsConfig>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("local addr");
        let collector = Collector::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let svc = TraceServiceServer::new(collector.clone());
        let with_tls = tls.is_some();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("the receiver's TLS");
        }
        tokio::spawn(async move {
            let _ = builder
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
            tls: with_tls,
            _stop: stop,
        }
    }

    /// What a binary's `[telemetry] otlp_endpoint` should say.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
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
