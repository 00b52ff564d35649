//! End to end: the Workload API served on a real Unix socket, fetched by an independent client
//! (the `spiffe` crate) and by the raw generated tonic client.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use signet_agent::attest::Attestor;
use signet_agent::state::{AgentState, Identity, Selector, StateSender, channel};
use signet_agent::workload::{self, WorkloadApi};
use signet_pki::X509Svid;
use signet_proto::workload as pb;
use signet_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use spiffe::{TrustDomain, WorkloadApiClient};

const ID: &str = "spiffe://example.org/e2e/app";

struct Pki {
    root_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let key = KeyPair::generate().expect("root key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.subject_alt_names = vec![SanType::URI(
            "spiffe://example.org".try_into().expect("uri"),
        )];
        let root = p.self_signed(&key).expect("root");
        Pki {
            root_der: root.der().to_vec(),
            issuer: Issuer::new(p, key),
        }
    }

    fn leaf(&self) -> X509Svid {
        let key = KeyPair::generate().expect("leaf key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.subject_alt_names = vec![SanType::URI(ID.try_into().expect("uri"))];
        let now = signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock);
        p.not_before = now.into();
        p.not_after = (now + Duration::from_secs(3600)).into();
        let cert = p.signed_by(&key, &self.issuer).expect("leaf");
        X509Svid::from_der(vec![cert.der().to_vec()], &key.serialize_der()).expect("svid")
    }
}

fn my_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("uid")
}

fn state(pki: &Pki, svid: X509Svid, uid: u32) -> Arc<AgentState> {
    Arc::new(AgentState {
        identities: vec![Identity {
            entry_id: "entry-1".into(),
            selectors: vec![Selector::Uid(uid)],
            svid: svid.into(),
            federates_with: vec![],
        }],
        bundle_der: vec![pki.root_der.clone()].into(),
        trust_domain_id: "spiffe://example.org".into(),
        crls_der: Default::default(),
        ..Default::default()
    })
}

impl Pki {
    /// A CRL of the root numbered `number`.
    fn crl(&self, number: u64) -> Vec<u8> {
        let now = signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock);
        rcgen::CertificateRevocationListParams {
            this_update: now.into(),
            next_update: (now + Duration::from_secs(3600)).into(),
            crl_number: rcgen::SerialNumber::from(number.to_be_bytes().to_vec()),
            issuing_distribution_point: None,
            revoked_certs: vec![rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from(vec![0x42]),
                revocation_time: now.into(),
                reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                invalidity_date: None,
            }],
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.issuer)
        .expect("crl")
        .der()
        .to_vec()
    }
}

struct Running {
    tx: StateSender,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
}

impl Running {
    async fn start(initial: Arc<AgentState>) -> Self {
        Self::start_with(initial, workload::ServeOptions::default()).await
    }

    async fn start_with(initial: Arc<AgentState>, opts: workload::ServeOptions) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("agent.sock");
        let (tx, rx) = channel();
        tx.send_replace(initial);
        let listener = workload::bind(&socket).expect("bind");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let api = WorkloadApi::new(rx, Attestor::default());
        let task = tokio::spawn(async move {
            workload::serve_with(
                listener,
                api,
                opts,
                Arc::new(workload::WorkloadMetrics::default()),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .expect("serve");
        });
        Running {
            tx,
            stop: Some(stop),
            task,
            _dir: dir,
            socket,
        }
    }

    fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Ends open streams (the state sender goes away), then stops the server gracefully.
    async fn stop(self) {
        let Running { tx, stop, task, .. } = self;
        drop(tx);
        if let Some(s) = stop {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("server stops")
            .expect("server task");
    }
}

async fn raw_client(socket: &Path) -> SpiffeWorkloadApiClient<tonic::transport::Channel> {
    let channel = signet_client::connect_admin(socket).await.expect("connect");
    SpiffeWorkloadApiClient::new(channel)
}

#[tokio::test]
async fn spiffe_client_fetches_svid_and_bundle_and_sees_rotation() {
    let pki = Pki::new();
    let first = pki.leaf();
    let server = Running::start(state(&pki, first.clone(), my_uid())).await;

    let client = WorkloadApiClient::connect_to(server.endpoint())
        .await
        .expect("spiffe client connects");
    let svid = client.fetch_x509_svid().await.expect("fetch svid");
    assert_eq!(svid.spiffe_id().to_string(), ID);
    assert_eq!(svid.cert_chain().len(), 1);
    assert_eq!(
        svid.cert_chain()[0].as_bytes(),
        first.certificate().leaf_der()
    );
    assert_eq!(svid.private_key().as_bytes(), first.key().pkcs8_der());

    let bundles = client.fetch_x509_bundles().await.expect("fetch bundles");
    let td = TrustDomain::new("example.org").expect("td");
    let bundle = bundles.get(&td).expect("bundle for example.org");
    assert_eq!(bundle.authorities().len(), 1);
    assert_eq!(bundle.authorities()[0].as_bytes(), pki.root_der.as_slice());

    // A stream delivers the current SVID, then the rotated one.
    let mut stream = client.stream_x509_svids().await.expect("stream");
    let now = stream.next().await.expect("item").expect("svid");
    assert_eq!(
        now.cert_chain()[0].as_bytes(),
        first.certificate().leaf_der()
    );

    // A second client that disconnects mid-stream disturbs nobody.
    let other = WorkloadApiClient::connect_to(server.endpoint())
        .await
        .expect("second client");
    let mut dropped = other.stream_x509_svids().await.expect("stream");
    dropped.next().await.expect("item").expect("svid");
    drop(dropped);
    drop(other);

    let second = pki.leaf();
    server
        .tx
        .send_replace(state(&pki, second.clone(), my_uid()));
    let rotated = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("rotation arrives")
        .expect("item")
        .expect("svid");
    assert_eq!(
        rotated.cert_chain()[0].as_bytes(),
        second.certificate().leaf_der()
    );
    assert_eq!(rotated.private_key().as_bytes(), second.key().pkcs8_der());
    drop(stream);
    server.stop().await;
}

fn with_header<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().expect("value"));
    req
}

#[tokio::test]
async fn both_streams_carry_the_crls_and_stream_a_new_one() {
    let pki = Pki::new();
    let svid = pki.leaf();
    let crl1 = pki.crl(1);
    let mut initial = (*state(&pki, svid.clone(), my_uid())).clone();
    initial.crls_der = vec![crl1.clone()].into();
    let server = Running::start(Arc::new(initial.clone())).await;
    let mut raw = raw_client(&server.socket).await;
    let mut svids = raw
        .fetch_x509svid(with_header(pb::X509svidRequest {}))
        .await
        .expect("stream")
        .into_inner();
    let mut bundles = raw
        .fetch_x509_bundles(with_header(pb::X509BundlesRequest {}))
        .await
        .expect("stream")
        .into_inner();
    let first = svids.message().await.expect("message").expect("some");
    assert_eq!(
        first.crl,
        std::slice::from_ref(&crl1),
        "X509SVIDResponse.crl"
    );
    let b = bundles.message().await.expect("message").expect("some");
    assert_eq!(
        b.crl,
        std::slice::from_ref(&crl1),
        "X509BundlesResponse.crl"
    );
    // Each is a DER CRL as a relying party reads it.
    let parsed = signet_pki::ParsedCrl::from_der(&b.crl[0]).expect("DER CRL");
    assert_eq!(parsed.entries().len(), 1);

    // A new CRL, same SVID and roots: both streams send an update.
    let crl2 = pki.crl(2);
    let mut next = initial.clone();
    next.crls_der = vec![crl2.clone()].into();
    server.tx.send_replace(Arc::new(next));
    let within = Duration::from_secs(10);
    let update = tokio::time::timeout(within, svids.message())
        .await
        .expect("in time")
        .expect("message")
        .expect("some");
    assert_eq!(update.crl, std::slice::from_ref(&crl2));
    assert_eq!(
        update.svids[0].x509_svid,
        svid.certificate().chain_der().concat(),
        "same SVID"
    );
    let update = tokio::time::timeout(within, bundles.message())
        .await
        .expect("in time")
        .expect("message")
        .expect("some");
    assert_eq!(update.crl, [crl2]);
    drop((svids, bundles));
    server.stop().await;
}

#[tokio::test]
async fn request_without_security_header_is_invalid_argument() {
    let pki = Pki::new();
    let server = Running::start(state(&pki, pki.leaf(), my_uid())).await;
    let mut raw = raw_client(&server.socket).await;
    let err = raw
        .fetch_x509svid(pb::X509svidRequest {})
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // With the header, the raw client gets the SVID and its chain.
    let mut req = tonic::Request::new(pb::X509svidRequest {});
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().expect("value"));
    let mut s = raw.fetch_x509svid(req).await.expect("stream").into_inner();
    let resp = s.message().await.expect("message").expect("some");
    assert_eq!(resp.svids.len(), 1);
    assert_eq!(resp.svids[0].spiffe_id, ID);
    assert_eq!(resp.svids[0].bundle, pki.root_der);
    server.stop().await;
}

#[tokio::test]
async fn caller_without_matching_entry_is_permission_denied() {
    let pki = Pki::new();
    let server = Running::start(state(&pki, pki.leaf(), my_uid().wrapping_add(1))).await;
    let mut raw = raw_client(&server.socket).await;
    let mut req = tonic::Request::new(pb::X509svidRequest {});
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().expect("value"));
    let err = raw.fetch_x509svid(req).await.expect_err("denied");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);

    let client = WorkloadApiClient::connect_to(server.endpoint())
        .await
        .expect("connects");
    assert!(client.fetch_x509_svid().await.is_err());
    server.stop().await;
}

#[tokio::test]
async fn stream_ends_with_permission_denied_when_identity_is_removed() {
    let pki = Pki::new();
    let server = Running::start(state(&pki, pki.leaf(), my_uid())).await;
    let mut raw = raw_client(&server.socket).await;
    let mut req = tonic::Request::new(pb::X509svidRequest {});
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().expect("value"));
    let mut s = raw.fetch_x509svid(req).await.expect("stream").into_inner();
    s.message().await.expect("first").expect("some");
    server.tx.send_replace(Arc::new(AgentState::default()));
    let err = tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("ends")
        .expect_err("denied");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    server.stop().await;
}

/// Sends the HTTP/2 preface and an empty SETTINGS; returns the server's first frame's
/// settings (id, value), or None when the server closed the connection instead.
async fn server_settings(conn: &mut tokio::net::UnixStream) -> Option<Vec<(u16, u32)>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .ok()?;
    let mut head = [0u8; 9];
    conn.read_exact(&mut head).await.ok()?;
    assert_eq!(head[3], 4, "the first frame is SETTINGS");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    conn.read_exact(&mut payload).await.ok()?;
    Some(
        payload
            .chunks(6)
            .map(|c| {
                (
                    u16::from_be_bytes([c[0], c[1]]),
                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                )
            })
            .collect(),
    )
}

/// Reads until the server closes the connection (true), or `within` passes (false).
async fn closed_within(conn: &mut tokio::net::UnixStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn http2_limits_caps_and_first_request_timeout() {
    let pki = Pki::new();
    let opts = workload::ServeOptions {
        max_connections: 8,
        max_connections_per_uid: 2,
        timeouts: workload::conn::Timeouts {
            first_request: Duration::from_millis(300),
            idle: Duration::from_secs(30),
        },
        max_concurrent_streams: 4,
        max_header_list_size: 8192,
        ..workload::ServeOptions::default()
    };
    let server = Running::start_with(state(&pki, pki.leaf(), my_uid()), opts).await;

    // The server announces its HTTP/2 limits.
    let mut a = tokio::net::UnixStream::connect(&server.socket)
        .await
        .expect("connect");
    let settings = server_settings(&mut a).await.expect("settings");
    assert!(
        settings.contains(&(0x3, 4)),
        "MAX_CONCURRENT_STREAMS: {settings:?}"
    );
    assert!(
        settings.contains(&(0x6, 8192)),
        "MAX_HEADER_LIST_SIZE: {settings:?}"
    );
    // A second connection of this uid is admitted, a third is closed at once.
    let mut b = tokio::net::UnixStream::connect(&server.socket)
        .await
        .expect("connect");
    assert!(server_settings(&mut b).await.is_some());
    let mut c = tokio::net::UnixStream::connect(&server.socket)
        .await
        .expect("connect");
    assert!(
        server_settings(&mut c).await.is_none(),
        "over the per-uid cap"
    );
    // Connections that never send a request are closed after the first-request timeout,
    // which gives the slots back.
    assert!(closed_within(&mut a, Duration::from_secs(10)).await);
    assert!(closed_within(&mut b, Duration::from_secs(10)).await);
    let mut client = raw_client(&server.socket).await;
    let mut req = tonic::Request::new(pb::X509svidRequest {});
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().expect("value"));
    let mut stream = client
        .fetch_x509svid(req)
        .await
        .expect("stream")
        .into_inner();
    assert!(stream.message().await.expect("message").is_some());
    drop(stream);
    drop(client);
    server.stop().await;
}
