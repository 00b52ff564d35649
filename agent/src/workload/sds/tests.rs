//! SDS through the real socket (the Workload API listener, the caller attested from its
//! credentials: this test process) with tonic's generated client, and the views by themselves.

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use hyper_util::rt::TokioIo;
use prost::Message;
use signet_pki::X509Svid;
use signet_proto::envoy::config::core::v3 as core;
use signet_proto::envoy::extensions::transport_sockets::tls::v3 as tls;
use signet_proto::envoy::service::discovery::v3 as xds;
use signet_proto::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use signet_proto::envoy::r#type::v3::SemanticVersion;
use tonic::transport::{Channel, Endpoint, Uri};

use super::view::{self, CRL_MARGIN, Form, Prepared, SECRET_TYPE_URL, SdsNames};
use crate::attest::Attestor;
use crate::config::SdsConfig;
use crate::state::{AgentState, Identity, Selector, StateSender, channel};
use crate::testing::TestCa;
use crate::workload::{ServeOptions, WorkloadApi, WorkloadMetrics, bind_with, serve_with};

const APP: &str = "spiffe://example.org/app";
const OTHER: &str = "spiffe://example.org/other";

fn my_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

fn identity(entry: &str, uid: u32, svid: Arc<X509Svid>) -> Identity {
    Identity {
        entry_id: entry.into(),
        selectors: vec![Selector::Uid(uid)],
        svid,
        federates_with: vec![],
    }
}

/// The `n`th SVID of `id` (a real chain: leaf, its CA) and the bundle it goes with.
fn delivered(id: &str, n: u8) -> crate::sinks::Delivered {
    crate::testing::delivered(id, n)
}

/// This process's identity `APP` (`n`th certificate), and `OTHER` for another uid.
fn state(n: u8) -> AgentState {
    let d = delivered(APP, n);
    AgentState {
        identities: vec![
            identity("e1", my_uid(), d.svid.clone()),
            identity("e2", my_uid() + 1, delivered(OTHER, n).svid),
        ],
        bundle_der: d.bundle_der.clone(),
        trust_domain_id: "spiffe://example.org".into(),
        ..Default::default()
    }
}

struct Harness {
    tx: StateSender,
    socket: std::path::PathBuf,
    metrics: Arc<WorkloadMetrics>,
    _dir: tempfile::TempDir,
}

async fn start(state: AgentState, sds: SdsConfig) -> Harness {
    let (tx, rx) = channel();
    tx.send_replace(Arc::new(state));
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("agent.sock");
    let listener = bind_with(&socket, 0o700, None).expect("bind");
    let api = WorkloadApi::new(rx, Attestor::default());
    let opts = ServeOptions {
        sds: Some(sds),
        ..ServeOptions::default()
    };
    let metrics = Arc::new(WorkloadMetrics::default());
    tokio::spawn(serve_with(
        listener,
        api,
        opts,
        metrics.clone(),
        std::future::pending(),
    ));
    Harness {
        tx,
        socket,
        metrics,
        _dir: dir,
    }
}

async fn client(socket: &std::path::Path) -> SecretDiscoveryServiceClient<Channel> {
    let path = socket.to_owned();
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .expect("connect");
    SecretDiscoveryServiceClient::new(channel)
}

fn envoy_node(major: u32, minor: u32) -> core::Node {
    core::Node {
        id: "sidecar~10.0.0.1~app".into(),
        cluster: "app".into(),
        user_agent_name: "envoy".into(),
        user_agent_version_type: Some(core::node::UserAgentVersionType::UserAgentBuildVersion(
            core::BuildVersion {
                version: Some(SemanticVersion {
                    major_number: major,
                    minor_number: minor,
                    patch: 0,
                }),
                metadata: None,
            },
        )),
        ..Default::default()
    }
}

/// An Envoy 1.30 node whose metadata says `disable_spiffe_cert_validation: value`.
fn node_disabling_spiffe(value: prost_types::value::Kind) -> core::Node {
    core::Node {
        metadata: Some(prost_types::Struct {
            fields: [(
                view::DISABLE_SPIFFE_KEY.to_owned(),
                prost_types::Value { kind: Some(value) },
            )]
            .into(),
        }),
        ..envoy_node(1, 30)
    }
}

fn request(
    node: Option<core::Node>,
    names: &[&str],
    nonce: &str,
    version: &str,
) -> xds::DiscoveryRequest {
    xds::DiscoveryRequest {
        version_info: version.into(),
        node,
        resource_names: names.iter().map(|s| (*s).to_owned()).collect(),
        type_url: SECRET_TYPE_URL.into(),
        response_nonce: nonce.into(),
        error_detail: None,
    }
}

/// A bidirectional stream: the sender of requests and the responses.
async fn open(
    socket: &std::path::Path,
) -> (
    mpsc::UnboundedSender<xds::DiscoveryRequest>,
    tonic::Streaming<xds::DiscoveryResponse>,
) {
    let (tx, rx) = mpsc::unbounded();
    let responses = client(socket)
        .await
        .stream_secrets(rx)
        .await
        .expect("stream")
        .into_inner();
    (tx, responses)
}

async fn next(
    s: &mut tonic::Streaming<xds::DiscoveryResponse>,
) -> Result<xds::DiscoveryResponse, tonic::Status> {
    match tokio::time::timeout(Duration::from_secs(10), s.message()).await {
        Ok(Ok(Some(r))) => Ok(r),
        Ok(Ok(None)) => Err(tonic::Status::unknown("the stream ended")),
        Ok(Err(e)) => Err(e),
        Err(_) => panic!("no SDS response within 10s"),
    }
}

fn secrets(r: &xds::DiscoveryResponse) -> Vec<tls::Secret> {
    r.resources
        .iter()
        .map(|a| {
            assert_eq!(a.type_url, SECRET_TYPE_URL);
            tls::Secret::decode(a.value.as_slice()).expect("a Secret")
        })
        .collect()
}

fn inline(d: &Option<core::DataSource>) -> String {
    match d.as_ref().and_then(|d| d.specifier.as_ref()) {
        Some(core::data_source::Specifier::InlineBytes(b)) => {
            String::from_utf8(b.clone()).expect("PEM")
        }
        other => panic!("not inline bytes: {other:?}"),
    }
}

fn tls_cert(s: &tls::Secret) -> (String, String) {
    match &s.r#type {
        Some(tls::secret::Type::TlsCertificate(c)) => {
            (inline(&c.certificate_chain), inline(&c.private_key))
        }
        other => panic!("not a TlsCertificate: {other:?}"),
    }
}

/// The SPIFFE validator's trust domains (name, bundle PEM), or panics.
fn spiffe_validator(s: &tls::Secret) -> Vec<(String, String)> {
    let Some(tls::secret::Type::ValidationContext(v)) = &s.r#type else {
        panic!("not a validation context: {s:?}");
    };
    let c = v
        .custom_validator_config
        .as_ref()
        .expect("custom validator");
    assert_eq!(c.name, "envoy.tls.cert_validator.spiffe");
    let any = c.typed_config.as_ref().expect("typed config");
    assert_eq!(
        any.type_url,
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig"
    );
    let cfg = tls::SpiffeCertValidatorConfig::decode(any.value.as_slice()).expect("config");
    assert!(v.trusted_ca.is_none());
    cfg.trust_domains
        .iter()
        .map(|t| (t.name.clone(), inline(&t.trust_bundle)))
        .collect()
}

fn trusted_ca(s: &tls::Secret) -> (String, Option<String>) {
    let Some(tls::secret::Type::ValidationContext(v)) = &s.r#type else {
        panic!("not a validation context: {s:?}");
    };
    assert!(v.custom_validator_config.is_none());
    (
        inline(&v.trusted_ca),
        v.crl.as_ref().map(|_| inline(&v.crl)),
    )
}

fn roots_pem(n: u8) -> String {
    signet_types::pem::certs_to_pem(delivered(APP, n).bundle_der.iter().map(Vec::as_slice))
}

fn count(m: &WorkloadMetrics, kind: &str) -> u64 {
    m.sds_requests
        .get_or_create(&vec![("kind", kind.to_owned())])
        .get()
}

#[tokio::test]
async fn default_and_rootca_then_ack_nack_stale_and_a_renewal_pushed() {
    let h = start(state(1), SdsConfig::default()).await;
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(
        Some(envoy_node(1, 30)),
        &["default", "ROOTCA"],
        "",
        "",
    ))
    .expect("send");
    let r1 = next(&mut rx).await.expect("first response");
    assert_eq!(r1.type_url, SECRET_TYPE_URL);
    assert!(!r1.version_info.is_empty() && !r1.nonce.is_empty());
    let s = secrets(&r1);
    assert_eq!(
        s.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["ROOTCA", "default"],
        "sorted names, each answered"
    );
    let (chain, key) = tls_cert(&s[1]);
    let svid = delivered(APP, 1).svid;
    assert_eq!(chain, svid.certificate().chain_pem());
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "PKCS#8 PEM");
    assert_eq!(
        spiffe_validator(&s[0]),
        [("example.org".to_owned(), roots_pem(1))]
    );

    // An ACK of the same names: nothing is sent.
    tx.unbounded_send(request(
        None,
        &["default", "ROOTCA"],
        &r1.nonce,
        &r1.version_info,
    ))
    .expect("ack");
    // A stale nonce (a reply to some earlier response), even with new names: ignored.
    tx.unbounded_send(request(None, &["ROOTCA"], "stale", "0"))
        .expect("stale");
    // A NACK: logged and counted; the stream keeps working.
    let mut nack = request(None, &["default", "ROOTCA"], &r1.nonce, "");
    nack.error_detail = Some(signet_proto::google::rpc::Status {
        code: 3,
        message: "Failed to load certificate chain".into(),
        details: vec![],
    });
    tx.unbounded_send(nack).expect("nack");
    // Once the three are read (they race the renewal below otherwise, and would then be
    // replies to an earlier response: stale).
    for _ in 0..500 {
        if count(&h.metrics, "nack") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A renewal is pushed, as the very next response (none was sent for the above).
    h.tx.send_replace(Arc::new(state(2)));
    let r2 = next(&mut rx).await.expect("pushed");
    assert_ne!(r2.nonce, r1.nonce);
    assert_ne!(r2.version_info, r1.version_info);
    let s2 = secrets(&r2);
    assert_eq!(
        tls_cert(&s2[1]).0,
        delivered(APP, 2).svid.certificate().chain_pem()
    );
    assert_eq!(spiffe_validator(&s2[0])[0].1, roots_pem(2));
    assert_eq!(count(&h.metrics, "ack"), 1);
    assert_eq!(count(&h.metrics, "stale"), 1);
    assert_eq!(count(&h.metrics, "nack"), 1);

    // A change that does not touch this caller's view is not sent; new names are answered.
    let mut unrelated = state(2);
    unrelated.identities[1].svid = delivered(OTHER, 3).svid;
    h.tx.send_replace(Arc::new(unrelated));
    tx.unbounded_send(request(None, &[APP], &r2.nonce, &r2.version_info))
        .expect("names");
    let r3 = next(&mut rx).await.expect("new names");
    let s3 = secrets(&r3);
    assert_eq!(s3.len(), 1);
    assert_eq!(s3[0].name, APP);
    assert_eq!(
        tls_cert(&s3[0]).0,
        delivered(APP, 2).svid.certificate().chain_pem()
    );

    // Another entry's identity, by name: PermissionDenied naming it, and the stream ends.
    tx.unbounded_send(request(None, &[OTHER, APP], &r3.nonce, &r3.version_info))
        .expect("other");
    let err = next(&mut rx).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains(OTHER), "{}", err.message());
    assert!(
        !err.message().contains("\"spiffe://example.org/app\""),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn an_envoy_reconnecting_with_an_old_nonce_is_answered() {
    let h = start(state(1), SdsConfig::default()).await;
    let (tx, mut rx) = open(&h.socket).await;
    // As after an agent restart: the first request of the stream carries the nonce and
    // version of a response from the previous process.
    tx.unbounded_send(request(
        Some(envoy_node(1, 30)),
        &["default"],
        "0123-7",
        "7",
    ))
    .expect("send");
    let r = next(&mut rx).await.expect("answered");
    assert_eq!(secrets(&r).len(), 1);
}

#[tokio::test]
async fn no_names_means_every_identity_and_trust_domain() {
    let mut st = state(1);
    st.identities
        .push(identity("e3", my_uid(), delivered(OTHER, 1).svid));
    let h = start(st, SdsConfig::default()).await;
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &[], "", ""))
        .expect("send");
    let r = next(&mut rx).await.expect("all");
    let names: Vec<String> = secrets(&r).into_iter().map(|s| s.name).collect();
    assert_eq!(names, [APP, OTHER, "spiffe://example.org"]);
}

#[tokio::test]
async fn the_legacy_form_for_old_envoys_or_when_asked_and_all() {
    let h = start(state(1), SdsConfig::default()).await;
    // Envoy 1.17: trusted_ca.
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(
        Some(envoy_node(1, 17)),
        &["ROOTCA", "ALL", "spiffe://example.org"],
        "",
        "",
    ))
    .expect("send");
    let s = secrets(&next(&mut rx).await.expect("legacy"));
    assert_eq!(s.len(), 3);
    for v in &s {
        assert_eq!(trusted_ca(v), (roots_pem(1), None));
    }
    // Envoy 1.30 asking for the legacy form in its node metadata (a string, as SPIRE reads it).
    let node = node_disabling_spiffe(prost_types::value::Kind::StringValue("true".into()));
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(node), &["ALL"], "", ""))
        .expect("send");
    let s = secrets(&next(&mut rx).await.expect("legacy by metadata"));
    assert_eq!(trusted_ca(&s[0]).0, roots_pem(1));
    // The SPIFFE form for ALL.
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["ALL"], "", ""))
        .expect("send");
    let s = secrets(&next(&mut rx).await.expect("spiffe"));
    assert_eq!(s[0].name, "ALL");
    assert_eq!(spiffe_validator(&s[0]).len(), 1);
}

#[test]
fn the_form_follows_spires_rule() {
    let meta = node_disabling_spiffe;
    use prost_types::value::Kind;
    assert_eq!(
        Form::for_node(Some(&envoy_node(1, 18)), false),
        Form::Spiffe
    );
    assert_eq!(Form::for_node(Some(&envoy_node(2, 0)), false), Form::Spiffe);
    assert_eq!(
        Form::for_node(Some(&envoy_node(1, 17)), false),
        Form::TrustedCa
    );
    assert_eq!(
        Form::for_node(Some(&core::Node::default()), false),
        Form::TrustedCa
    );
    assert_eq!(Form::for_node(None, false), Form::TrustedCa);
    assert_eq!(
        Form::for_node(Some(&envoy_node(1, 30)), true),
        Form::TrustedCa
    );
    assert_eq!(
        Form::for_node(Some(&meta(Kind::BoolValue(true))), false),
        Form::TrustedCa
    );
    assert_eq!(
        Form::for_node(Some(&meta(Kind::BoolValue(false))), true),
        Form::Spiffe
    );
    assert_eq!(
        Form::for_node(Some(&meta(Kind::StringValue("false".into()))), true),
        Form::Spiffe
    );
    // A value that is not a boolean is ignored: the configuration decides.
    assert_eq!(
        Form::for_node(Some(&meta(Kind::StringValue("perhaps".into()))), true),
        Form::TrustedCa
    );
}

#[tokio::test]
async fn bad_requests_end_the_stream_with_a_status_that_says_why() {
    let h = start(
        state(1),
        SdsConfig {
            first_request_timeout: Duration::from_millis(300),
            ..SdsConfig::default()
        },
    )
    .await;
    let cases: Vec<(xds::DiscoveryRequest, tonic::Code, &str)> = vec![
        (
            request(None, &["default"], "", ""),
            tonic::Code::InvalidArgument,
            "must carry the node",
        ),
        (
            xds::DiscoveryRequest {
                type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
                ..request(Some(envoy_node(1, 30)), &[], "", "")
            },
            tonic::Code::InvalidArgument,
            "envoy.config.cluster.v3.Cluster",
        ),
        (
            request(
                Some(envoy_node(1, 30)),
                &["ROOTCA", "nonsense\u{202e}"],
                "",
                "",
            ),
            tonic::Code::PermissionDenied,
            "\\u{202e}",
        ),
        (
            request(Some(envoy_node(1, 30)), &["spiffe://elsewhere.org"], "", ""),
            tonic::Code::PermissionDenied,
            "spiffe://elsewhere.org",
        ),
        (
            xds::DiscoveryRequest {
                resource_names: (0..300).map(|i| format!("n{i}")).collect(),
                ..request(Some(envoy_node(1, 30)), &[], "", "")
            },
            tonic::Code::InvalidArgument,
            "300 resource names",
        ),
    ];
    for (req, code, text) in cases {
        let (tx, mut rx) = open(&h.socket).await;
        tx.unbounded_send(req).expect("send");
        let err = next(&mut rx).await.expect_err("refused");
        assert_eq!(err.code(), code, "{err:?}");
        assert!(err.message().contains(text), "{}", err.message());
    }
    // A stream that never asks ends after first_request_timeout.
    let (_tx, mut rx) = open(&h.socket).await;
    let err = next(&mut rx).await.expect_err("timed out");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    // Delta xDS is not served.
    let (_dtx, drx) = mpsc::unbounded::<xds::DeltaDiscoveryRequest>();
    let err = client(&h.socket)
        .await
        .delta_secrets(drx)
        .await
        .expect_err("unimplemented");
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    // The server keeps serving.
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["default"], "", ""))
        .expect("send");
    next(&mut rx).await.expect("still serving");
    let refused = |r: &str| {
        h.metrics
            .sds_refused
            .get_or_create(&vec![("reason", r.to_owned())])
            .get()
    };
    assert_eq!(refused("no_node"), 1);
    assert_eq!(refused("not_served"), 2);
    assert_eq!(refused("no_first_request"), 1);
}

#[tokio::test]
async fn a_caller_without_identity_gets_nothing_and_loses_a_stream_when_its_identity_goes() {
    let mut st = state(1);
    st.identities.remove(0);
    let h = start(st, SdsConfig::default()).await;
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["ROOTCA"], "", ""))
        .expect("send");
    assert_eq!(
        next(&mut rx).await.expect_err("no identity").code(),
        tonic::Code::PermissionDenied
    );
    h.tx.send_replace(Arc::new(state(1)));
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &[APP], "", ""))
        .expect("send");
    next(&mut rx).await.expect("served");
    // The entry is deleted: the name is no longer served, and the stream says so.
    let mut gone = state(1);
    gone.identities.remove(0);
    gone.identities
        .push(identity("e9", my_uid(), delivered(OTHER, 1).svid));
    h.tx.send_replace(Arc::new(gone));
    let err = next(&mut rx).await.expect_err("gone");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(err.message().contains(APP), "{}", err.message());
}

#[tokio::test]
async fn streams_are_capped_per_uid() {
    let h = start(
        state(1),
        SdsConfig {
            max_streams_per_uid: 2,
            max_streams: 4,
            ..SdsConfig::default()
        },
    )
    .await;
    let mut open_streams = Vec::new();
    for _ in 0..2 {
        let (tx, mut rx) = open(&h.socket).await;
        tx.unbounded_send(request(Some(envoy_node(1, 30)), &["default"], "", ""))
            .expect("send");
        next(&mut rx).await.expect("served");
        open_streams.push((tx, rx));
    }
    let (tx, rx) = mpsc::unbounded();
    let err = client(&h.socket)
        .await
        .stream_secrets(rx)
        .await
        .expect_err("capped");
    drop(tx);
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(
        err.message().contains("max_streams_per_uid"),
        "{}",
        err.message()
    );
    assert_eq!(h.metrics.sds_streams.get(), 2);
    // A stream that ends gives its slot back.
    open_streams.pop();
    let mut reopened = false;
    for _ in 0..50 {
        if h.metrics.sds_streams.get() == 1 {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reopened, "the slot came back");
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["default"], "", ""))
        .expect("send");
    next(&mut rx).await.expect("served again");
}

#[tokio::test]
async fn fetch_secrets_answers_once() {
    let h = start(state(1), SdsConfig::default()).await;
    let r = client(&h.socket)
        .await
        .fetch_secrets(request(
            Some(envoy_node(1, 30)),
            &["default", "ROOTCA"],
            "",
            "",
        ))
        .await
        .expect("fetch")
        .into_inner();
    assert_eq!(secrets(&r).len(), 2);
    let err = client(&h.socket)
        .await
        .fetch_secrets(request(None, &[OTHER], "", ""))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
}

// ---- CRLs: only complete and fresh ---------------------------------------------------------

struct Pki {
    root: TestCa,
    int: TestCa,
    svid: Arc<X509Svid>,
}

fn pki() -> Pki {
    let root = TestCa::new("root");
    let int = root.intermediate("intermediate", 7);
    let nb = signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock)
        - Duration::from_secs(60);
    let (leaf, key) = int.leaf(APP, 9, nb, Duration::from_secs(3600));
    let svid = Arc::new(
        X509Svid::from_der(vec![leaf, int.der.clone()], &key.serialize_der()).expect("svid"),
    );
    Pki { root, int, svid }
}

fn crl_state(p: &Pki, crls: Vec<Vec<u8>>) -> AgentState {
    AgentState {
        identities: vec![identity("e1", 1, p.svid.clone())],
        bundle_der: vec![p.root.der.clone()].into(),
        trust_domain_id: "spiffe://example.org".into(),
        crls_der: crls.into(),
        ..Default::default()
    }
}

fn aliases() -> SdsNames {
    SdsNames {
        svid: "default".into(),
        bundle: "ROOTCA".into(),
        all: "ALL".into(),
    }
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| (*s).to_owned()).collect()
}

/// The view of `name` for the identities of `st` in `form` at `now`, and its first secret.
fn view_one(
    st: &AgentState,
    name: &str,
    form: Form,
    now: std::time::SystemTime,
) -> (view::View, tls::Secret) {
    let mine: Vec<&Identity> = st.identities.iter().collect();
    let v = view::view(
        &Prepared::of(st),
        &mine,
        &names(&[name]),
        form,
        &aliases(),
        now,
    )
    .expect("view");
    let secret = tls::Secret::decode(v.resources[0].value.as_slice()).expect("secret");
    (v, secret)
}

#[test]
fn crls_go_with_the_bundle_only_when_every_ca_has_a_fresh_one() {
    let p = pki();
    let root_crl = p.root.crl(1, &[]);
    let int_crl = p.int.crl(1, &[9]);
    let now = signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock);
    let complete = crl_state(&p, vec![root_crl, int_crl.clone()]);
    let (v, secret) = view_one(&complete, "ROOTCA", Form::Spiffe, now);
    let bundle = &spiffe_validator(&secret)[0].1;
    assert_eq!(bundle.matches("BEGIN X509 CRL").count(), 2, "{bundle}");
    assert!(bundle.starts_with(&signet_types::pem::cert_to_pem(&p.root.der)));
    assert!(!v.crls_withheld);
    // Looked at again a margin before the CRLs' nextUpdate (an hour after they were made).
    let next_update = signet_pki::ParsedCrl::from_der(&int_crl)
        .expect("crl")
        .next_update()
        .expect("next update");
    assert_eq!(v.recheck_at, Some(next_update - CRL_MARGIN));
    // The legacy form: the default validator's `crl`.
    let (_, secret) = view_one(&complete, "ROOTCA", Form::TrustedCa, now);
    let (_, crl) = trusted_ca(&secret);
    assert_eq!(crl.expect("crl").matches("BEGIN X509 CRL").count(), 2);

    // Near the nextUpdate: withheld, and counted as such.
    let late = next_update - CRL_MARGIN + Duration::from_secs(1);
    let (v, secret) = view_one(&complete, "ROOTCA", Form::Spiffe, late);
    assert!(!spiffe_validator(&secret)[0].1.contains("X509 CRL"));
    assert!(v.crls_withheld);
    assert_eq!(v.recheck_at, None);

    // Only the intermediate's CRL (the root's is missing): Envoy would refuse every chain.
    let partial = crl_state(&p, vec![int_crl]);
    assert!(
        matches!(Prepared::of(&partial).crls, view::CrlCover::Incomplete(ref why) if why.contains(&p.root.key_id))
    );
    let (v, secret) = view_one(&partial, "ROOTCA", Form::TrustedCa, now);
    assert_eq!(trusted_ca(&secret).1, None);
    assert!(v.crls_withheld);

    // No CRLs at all: nothing withheld, nothing to recheck.
    let none = crl_state(&p, vec![]);
    let (v, _) = view_one(&none, "default", Form::Spiffe, now);
    assert!(!v.crls_withheld);
    assert_eq!(v.recheck_at, None);
}

#[test]
fn all_with_two_trust_domains_needs_the_spiffe_validator() {
    let p = pki();
    let st = crl_state(&p, vec![]);
    let mut prepared = Prepared::of(&st);
    let mut federated = prepared.trust_domains[0].clone();
    federated.id = "spiffe://partner.org".into();
    federated.name = "partner.org".into();
    prepared.trust_domains.push(federated);
    let mine: Vec<&Identity> = st.identities.iter().collect();
    let now = signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock);
    assert_eq!(
        view::view(
            &prepared,
            &mine,
            &names(&["ALL"]),
            Form::TrustedCa,
            &aliases(),
            now
        ),
        Err(view::SdsRefusal::AllNeedsSpiffeValidator)
    );
    let v = view::view(
        &prepared,
        &mine,
        &names(&["ALL", "spiffe://partner.org"]),
        Form::Spiffe,
        &aliases(),
        now,
    )
    .expect("view");
    let all = tls::Secret::decode(v.resources[0].value.as_slice()).expect("secret");
    let tds: Vec<String> = spiffe_validator(&all).into_iter().map(|t| t.0).collect();
    assert_eq!(tds, ["example.org", "partner.org"]);
    let one = tls::Secret::decode(v.resources[1].value.as_slice()).expect("secret");
    assert_eq!(one.name, "spiffe://partner.org");
}

/// Fresh-eyes review, low findings: a SPIFFE ID is served only as it is written (not
/// `SPIFFE://` or an upper-case trust domain), an empty name is not a wildcard, and the
/// metadata string is read as SPIRE reads it (Go's ParseBool).
#[tokio::test]
async fn names_match_exactly_and_an_empty_name_is_not_served() {
    let h = start(state(1), SdsConfig::default()).await;
    for names in [
        vec!["SPIFFE://example.org/app"],
        vec!["spiffe://EXAMPLE.org/app"],
        vec![""],
        vec!["", "default"],
    ] {
        let (tx, mut rx) = open(&h.socket).await;
        tx.unbounded_send(request(Some(envoy_node(1, 30)), &names, "", ""))
            .expect("send");
        let err = next(&mut rx).await.expect_err("refused");
        assert_eq!(
            err.code(),
            tonic::Code::PermissionDenied,
            "{names:?}: {err:?}"
        );
    }
    let meta = |v: &str| node_disabling_spiffe(prost_types::value::Kind::StringValue(v.into()));
    assert_eq!(Form::for_node(Some(&meta("TRUE")), false), Form::TrustedCa);
    assert_eq!(Form::for_node(Some(&meta("tRuE")), false), Form::Spiffe);
}

/// Fresh-eyes review, finding 1: a request larger than `max_request_bytes` ends its stream
/// with OutOfRange (the agent does not buffer it), and the agent keeps serving.
#[tokio::test]
async fn a_request_over_max_request_bytes_ends_the_stream() {
    let h = start(state(1), SdsConfig::default()).await;
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["default"], "", ""))
        .expect("send");
    let r = next(&mut rx).await.expect("first");
    let big = "n".repeat(70 * 1024);
    tx.unbounded_send(request(None, &[big.as_str()], &r.nonce, &r.version_info))
        .expect("send");
    let err = next(&mut rx).await.expect_err("too large");
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["default"], "", ""))
        .expect("send");
    next(&mut rx).await.expect("still serving");
}

// --- federation ---------------------------------------------------------------------------

const PARTNER: &str = "spiffe://partner.example";

/// `state(1)` with a federated bundle for `partner.example` (`root`); this process's entry
/// (e1) federates with it when `federates`, the other uid's (e2) always does.
fn federated_state(root: &[u8], federates: bool) -> AgentState {
    let mut st = state(1);
    let td: signet_types::TrustDomain = "partner.example".parse().expect("td");
    if federates {
        st.identities[0].federates_with = vec![td.clone()];
    }
    st.identities[1].federates_with = vec![td.clone()];
    st.federated = vec![crate::state::FederatedBundle {
        trust_domain: td,
        roots_der: vec![root.to_vec()].into(),
        jwt_keys: Default::default(),
    }]
    .into();
    st
}

#[tokio::test]
async fn federated_trust_domains_are_served_to_the_callers_that_federate_only() {
    let root = TestCa::new("partner root").der;
    let partner_pem = signet_types::pem::cert_to_pem(&root);
    let h = start(federated_state(&root, true), SdsConfig::default()).await;
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["ALL", PARTNER], "", ""))
        .expect("send");
    let s = secrets(&next(&mut rx).await.expect("served"));
    assert_eq!(s.len(), 2);
    let all = spiffe_validator(&s[0]);
    assert_eq!(
        all,
        [
            ("example.org".to_owned(), roots_pem(1)),
            ("partner.example".to_owned(), partner_pem.clone())
        ]
    );
    assert_eq!(s[1].name, PARTNER);
    assert_eq!(
        spiffe_validator(&s[1]),
        [("partner.example".to_owned(), partner_pem.clone())]
    );
    // No names: the federated trust domain is listed too.
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &[], "", ""))
        .expect("send");
    let names: Vec<String> = secrets(&next(&mut rx).await.expect("all"))
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, [APP, "spiffe://example.org", PARTNER]);
    // The legacy form: one foreign trust domain is served as trusted_ca; ALL with two is not.
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(
        Some(envoy_node(1, 17)),
        &[PARTNER, "ROOTCA"],
        "",
        "",
    ))
    .expect("send");
    let s = secrets(&next(&mut rx).await.expect("legacy"));
    // Names are answered sorted: ROOTCA, then the trust domain.
    assert_eq!(
        (s[0].name.as_str(), s[1].name.as_str()),
        ("ROOTCA", PARTNER)
    );
    assert_eq!(trusted_ca(&s[0]), (roots_pem(1), None));
    assert_eq!(trusted_ca(&s[1]), (partner_pem.clone(), None));
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 17)), &["ALL"], "", ""))
        .expect("send");
    assert_eq!(
        next(&mut rx)
            .await
            .expect_err("ALL needs the SPIFFE validator")
            .code(),
        tonic::Code::FailedPrecondition
    );

    // Attack: this caller's entry no longer federates (the other uid's still does).
    h.tx.send_replace(Arc::new(federated_state(&root, false)));
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["ALL"], "", ""))
        .expect("send");
    let s = secrets(&next(&mut rx).await.expect("own only"));
    assert_eq!(
        spiffe_validator(&s[0]),
        [("example.org".to_owned(), roots_pem(1))]
    );
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &[PARTNER], "", ""))
        .expect("send");
    let err = next(&mut rx).await.expect_err("not served");
    let unknown = {
        let (tx, mut rx) = open(&h.socket).await;
        tx.unbounded_send(request(
            Some(envoy_node(1, 30)),
            &["spiffe://nowhere.example"],
            "",
            "",
        ))
        .expect("send");
        next(&mut rx).await.expect_err("unknown")
    };
    assert_eq!(
        err.code(),
        unknown.code(),
        "refused exactly like an unknown name"
    );
    assert!(err.message().contains(PARTNER), "{}", err.message());
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &[], "", ""))
        .expect("send");
    let names: Vec<String> = secrets(&next(&mut rx).await.expect("all"))
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, [APP, "spiffe://example.org"]);
}

#[tokio::test]
async fn a_federated_bundle_change_is_pushed_and_an_unchanged_one_is_not() {
    let root = TestCa::new("partner root").der;
    let h = start(federated_state(&root, true), SdsConfig::default()).await;
    let (tx, mut rx) = open(&h.socket).await;
    tx.unbounded_send(request(Some(envoy_node(1, 30)), &["ALL"], "", ""))
        .expect("send");
    let first = next(&mut rx).await.expect("first");
    tx.unbounded_send(request(
        Some(envoy_node(1, 30)),
        &["ALL"],
        &first.nonce,
        &first.version_info,
    ))
    .expect("ack");
    // The same bundle in a new state: nothing is pushed.
    h.tx.send_replace(Arc::new(federated_state(&root, true)));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.message())
            .await
            .is_err(),
        "an unchanged federated bundle is not pushed"
    );
    let root2 = TestCa::new("partner root 2").der;
    h.tx.send_replace(Arc::new(federated_state(&root2, true)));
    let pushed = secrets(&next(&mut rx).await.expect("pushed"));
    let tds = spiffe_validator(&pushed[0]);
    assert_eq!(
        tds[1],
        (
            "partner.example".to_owned(),
            signet_types::pem::cert_to_pem(&root2)
        )
    );
}
