//! The loop against a fake server that really signs, in tokio's virtual time: every test
//! runs paused (`start_paused`), and the driver, the rotator and the fake read a
//! [`TokioClock`], so certificate lifetimes, backoffs and polls pass without waiting.

use super::*;
use crate::ca::{
    Attested, BundleStream, CaError, Crl, EntriesUpdate, EntryRevisionStream, TrustBundle,
    WorkloadCsr,
};
use crate::node::{self, Stored};
use crate::revocation::CertRef;
use crate::state::{Selector, StateReceiver, channel};
use futures::StreamExt;
use signet_pki::SvidCertificate;
use signet_runtime::clock::TokioClock;
use std::sync::Mutex;

/// A CA that really signs (so node identities pass their key check), counts calls and
/// can refuse connections.
struct Fake {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    root_der: Vec<u8>,
    /// Virtual wall time, shared with the driver.
    clock: TokioClock,
    node_ttl: Duration,
    failing_connects: Mutex<u32>,
    /// The leaf presented on each mTLS connection.
    connects: Mutex<Vec<Vec<u8>>>,
    /// The PEM roots trusted on each connection attempt.
    roots_seen: Mutex<Vec<String>>,
    attests: Mutex<u32>,
    /// What `WatchBundle` streams: the current value, then each change.
    bundle: tokio::sync::watch::Sender<TrustBundle>,
    watches: Mutex<u32>,
    /// Statuses the next node renewals are refused with, in order.
    renew_refusals: Mutex<Vec<tonic::Code>>,
    /// When each node renewal was asked for.
    renewals: Mutex<Vec<SystemTime>>,
    /// The node's entry revision: `SyncEntries` answers entries `e1..=e<revision>` for it, and
    /// `WatchEntries` streams it (now, then each change).
    entry_revision: tokio::sync::watch::Sender<u64>,
    syncs: Mutex<u32>,
    /// Refuse every call of the node as banned (as the server does).
    banned: Mutex<bool>,
    /// The lifetime of the workload certificates it signs.
    workload_ttl: Mutex<Duration>,
    signs: Mutex<u32>,
}

impl Fake {
    fn new(node_ttl: Duration, failing_connects: u32) -> Arc<Self> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let mut p = rcgen::CertificateParams::default();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let root = p.self_signed(&key).expect("root");
        let (bundle, _) = tokio::sync::watch::channel(TrustBundle {
            trust_domain: "example.org".parse().expect("td"),
            roots_der: vec![root.der().to_vec()],
            revision: 1,
            tainted_key_ids: Vec::new(),
            crls: Vec::new(),
            jwt_keys: Vec::new(),
            tainted_jwt_key_ids: Vec::new(),
        });
        Arc::new(Self {
            issuer: rcgen::Issuer::new(p, key),
            root_der: root.der().to_vec(),
            clock: TokioClock::starting_at(signet_runtime::clock::SystemClock.now()),
            node_ttl,
            failing_connects: Mutex::new(failing_connects),
            connects: Mutex::new(Vec::new()),
            roots_seen: Mutex::new(Vec::new()),
            attests: Mutex::new(0),
            bundle,
            watches: Mutex::new(0),
            renew_refusals: Mutex::new(Vec::new()),
            renewals: Mutex::new(Vec::new()),
            entry_revision: tokio::sync::watch::channel(1).0,
            syncs: Mutex::new(0),
            banned: Mutex::new(false),
            workload_ttl: Mutex::new(Duration::from_secs(3600)),
            signs: Mutex::new(0),
        })
    }

    fn issue(&self, csr: &[u8], path: &str, ttl: Duration) -> Result<SvidCertificate, CaError> {
        let id = format!("spiffe://example.org{path}");
        let now = self.clock.now();
        let leaf = crate::testing::sign_csr(
            &self.issuer,
            csr,
            &id,
            None,
            now - Duration::from_secs(1),
            now + ttl,
        )
        .map_err(|e| CaError::Invalid(e.to_string()))?;
        SvidCertificate::from_chain_der(vec![leaf, self.root_der.clone()])
            .map_err(|e| CaError::Invalid(e.to_string()))
    }

    fn count(m: &Mutex<u32>) -> u32 {
        m.lock().map(|g| *g).unwrap_or(0)
    }

    fn set<T>(m: &Mutex<T>, v: T) {
        if let Ok(mut g) = m.lock() {
            *g = v;
        }
    }

    /// The server's refusal of a banned node.
    fn refuse_if_banned(&self) -> Result<(), CaError> {
        if self.banned.lock().map(|b| *b).unwrap_or(false) {
            return Err(tonic::Status::permission_denied(
                "node n1 is banned; it can renew nothing and sign nothing",
            )
            .into());
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Ca for Fake {
    async fn attest(&self, _: &AttestCredential, csr: &[u8]) -> Result<Attested, CaError> {
        if let Ok(mut n) = self.attests.lock() {
            *n += 1;
        }
        self.refuse_if_banned()?;
        Ok(Attested {
            node_id: "n1".into(),
            svid: self.issue(csr, "/signet/node/n1", self.node_ttl)?,
            bundle_der: vec![self.root_der.clone()],
        })
    }
    async fn renew_node(&self, csr: &[u8]) -> Result<SvidCertificate, CaError> {
        if let Ok(mut r) = self.renewals.lock() {
            r.push(self.clock.now());
        }
        let refusal = self.renew_refusals.lock().ok().and_then(|mut r| {
            if r.is_empty() {
                None
            } else {
                Some(r.remove(0))
            }
        });
        if let Some(code) = refusal {
            return Err(tonic::Status::new(code, "refused by the test").into());
        }
        self.refuse_if_banned()?;
        self.issue(csr, "/signet/node/n1", self.node_ttl)
    }
    async fn sync_entries(&self, known: u64) -> Result<EntriesUpdate, CaError> {
        if let Ok(mut n) = self.syncs.lock() {
            *n += 1;
        }
        self.refuse_if_banned()?;
        let revision = *self.entry_revision.borrow();
        if known == revision {
            return Ok(EntriesUpdate::Unchanged);
        }
        let entries = (1..=revision)
            .map(|i| {
                Ok(EntrySpec {
                    id: format!("e{i}"),
                    spiffe_id: "spiffe://example.org/app"
                        .parse()
                        .map_err(|_| CaError::Invalid("id".into()))?,
                    parent_id: "spiffe://example.org/signet/node/n1".into(),
                    selectors: vec![Selector::Uid(999 + u32::try_from(i).unwrap_or(0))],
                    ttl: Duration::from_secs(3600),
                    dns_names: vec![],
                    revision: i,
                    federates_with: vec![],
                })
            })
            .collect::<Result<Vec<_>, CaError>>()?;
        Ok(EntriesUpdate::Changed {
            revision,
            entries,
            federated_bundles: vec![],
        })
    }
    async fn watch_entries(&self) -> Result<EntryRevisionStream, CaError> {
        self.refuse_if_banned()?;
        let rx = self.entry_revision.subscribe();
        let s = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first {
                rx.changed().await.ok()?;
            }
            let r = *rx.borrow_and_update();
            Some((Ok(r), (rx, false)))
        });
        Ok(Box::pin(s))
    }
    async fn sign_workloads(
        &self,
        csrs: Vec<WorkloadCsr>,
    ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError> {
        if let Ok(mut n) = self.signs.lock() {
            *n += 1;
        }
        self.refuse_if_banned()?;
        let ttl = self
            .workload_ttl
            .lock()
            .map(|t| *t)
            .unwrap_or(Duration::from_secs(3600));
        Ok(csrs
            .into_iter()
            .map(|c| {
                let r = self.issue(&c.csr_der, "/app", ttl);
                (c.entry_id, r)
            })
            .collect())
    }
    async fn watch_bundle(&self) -> Result<BundleStream, CaError> {
        if let Ok(mut n) = self.watches.lock() {
            *n += 1;
        }
        self.refuse_if_banned()?;
        let rx = self.bundle.subscribe();
        let s = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first {
                rx.changed().await.ok()?;
            }
            let b = rx.borrow_and_update().clone();
            Some((Ok(b), (rx, false)))
        });
        Ok(Box::pin(s))
    }
}

struct FakeConnector(Arc<Fake>);

#[async_trait::async_trait]
impl Connector for FakeConnector {
    async fn connect(
        &self,
        roots_pem: &[u8],
        identity: Option<&NodeIdentity>,
    ) -> Result<Arc<dyn Ca>, CaError> {
        if let Ok(mut r) = self.0.roots_seen.lock() {
            r.push(String::from_utf8_lossy(roots_pem).into_owned());
        }
        if let Ok(mut n) = self.0.failing_connects.lock()
            && *n > 0
        {
            *n -= 1;
            return Err(CaError::Unavailable("connection refused".into()));
        }
        if let (Some(id), Ok(mut c)) = (identity, self.0.connects.lock()) {
            c.push(id.certificate().leaf_der().to_vec());
        }
        Ok(self.0.clone())
    }
}

struct Running {
    ready: crate::http::Readiness,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    state: StateReceiver,
    _bundle: tempfile::NamedTempFile,
}

fn start(fake: &Arc<Fake>, data_dir: &std::path::Path, token: Option<&str>) -> Running {
    start_with_sinks(fake, data_dir, token, Vec::new())
}

fn start_with_sinks(
    fake: &Arc<Fake>,
    data_dir: &std::path::Path,
    token: Option<&str>,
    sinks: Vec<SinkBinding>,
) -> Running {
    start_polling_every(fake, data_dir, token, sinks, Duration::from_millis(100))
}

fn start_polling_every(
    fake: &Arc<Fake>,
    data_dir: &std::path::Path,
    token: Option<&str>,
    sinks: Vec<SinkBinding>,
    sync_interval: Duration,
) -> Running {
    let bundle = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(
        bundle.path(),
        signet_types::pem::cert_to_pem(&fake.root_der),
    )
    .expect("write");
    let token = token.map(str::to_owned);
    let settings = Settings {
        data_dir: data_dir.to_owned(),
        trust_bundle_file: Some(bundle.path().to_owned()),
        renew_fraction: 0.5,
        sync_interval,
        credential: Arc::new(move || Ok(token.clone().map(AttestCredential::JoinToken))),
    };
    let (tx, state) = channel();
    let random: Random = Arc::new(|| 0.0);
    let ready = crate::http::Readiness::default();
    let driver = Driver::new(
        settings,
        Arc::new(FakeConnector(fake.clone())),
        Arc::new(fake.clock),
        random,
        tx,
    )
    .with_sinks(sinks)
    .with_readiness(ready.clone());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(driver.run(stop_rx));
    Running {
        ready,
        stop,
        task,
        state,
        _bundle: bundle,
    }
}

async fn wait_for(secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock)
        + Duration::from_secs(secs);
    while !f() {
        assert!(
            signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock) < deadline,
            "timed out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn stop(r: Running) {
    let _ = r.stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), r.task)
        .await
        .expect("stops promptly")
        .expect("no panic");
}

#[tokio::test(start_paused = true)]
async fn unreachable_server_is_retried_then_attests_persists_and_serves() {
    let fake = Fake::new(Duration::from_secs(3600), 2);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    wait_for(10, || r.ready.is_ready()).await;
    let s = state.borrow().clone();
    assert_eq!(s.trust_domain_id, "spiffe://example.org");
    assert_eq!(*s.bundle_der, *std::slice::from_ref(&fake.root_der));
    assert_eq!(
        s.identities[0].svid.certificate().chain_der().len(),
        1,
        "root not in chain"
    );
    assert!(matches!(node::load(dir.path()), Stored::Found(_)));
    assert_eq!(Fake::count(&fake.attests), 1);
    stop(r).await;

    // A restart reuses the stored identity: no second attestation.
    let r = start(&fake, dir.path(), None);
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    assert_eq!(Fake::count(&fake.attests), 1);
    stop(r).await;
}

#[tokio::test(start_paused = true)]
async fn a_pushed_entry_change_is_synced_at_once_not_at_the_poll() {
    let fake = Fake::new(Duration::from_secs(3600), 0);
    let dir = tempfile::tempdir().expect("tmp");
    // An hour between polls: only the entry stream can bring the change in time.
    let r = start_polling_every(
        &fake,
        dir.path(),
        Some("tok"),
        Vec::new(),
        Duration::from_secs(3600),
    );
    let state = r.state.clone();
    let signed = |n: usize| {
        let state = state.clone();
        move || state.borrow().identities.len() == n
    };
    wait_for(10, signed(1)).await;
    wait_for(10, || r.ready.is_ready()).await;
    // The stream is open (its first revision equals the held one: no extra sync).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let syncs = Fake::count(&fake.syncs);
    assert_eq!(
        syncs, 1,
        "one sync at start, none for the stream's first revision"
    );

    let t0 = signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock);
    fake.entry_revision.send_replace(2);
    wait_for(5, signed(2)).await;
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(Fake::count(&fake.syncs), syncs + 1);

    // Each further change: one more sync, still long before the poll.
    fake.entry_revision.send_replace(3);
    wait_for(5, signed(3)).await;
    assert_eq!(Fake::count(&fake.syncs), syncs + 2);
    stop(r).await;
}

#[tokio::test(start_paused = true)]
async fn corrupt_identity_without_a_token_is_retried_not_fatal() {
    let fake = Fake::new(Duration::from_secs(3600), 0);
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join(node::KEY_FILE), "garbage").expect("w");
    std::fs::write(dir.path().join(node::CERT_FILE), "garbage").expect("w");
    let r = start(&fake, dir.path(), None);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!r.task.is_finished(), "keeps trying");
    assert!(!r.ready.is_ready());
    assert_eq!(Fake::count(&fake.attests), 0);
    assert!(r.state.borrow().identities.is_empty());
    stop(r).await;

    // With a token, the corrupt files are replaced by a fresh attestation.
    let r = start(&fake, dir.path(), Some("tok"));
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    assert!(matches!(node::load(dir.path()), Stored::Found(_)));
    stop(r).await;
}

#[tokio::test(start_paused = true)]
async fn node_renewal_is_persisted_and_used_for_new_connections() {
    // Four seconds of life (backdated by one): renewed within about a second.
    let fake = Fake::new(Duration::from_secs(3), 0);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    let connects = || fake.connects.lock().map(|c| c.clone()).unwrap_or_default();
    wait_for(10, || connects().len() >= 2).await;
    let c = connects();
    assert_ne!(c[0], c[1], "reconnected with the renewed certificate");
    match node::load(dir.path()) {
        Stored::Found(n) => assert!(c.contains(&n.certificate().leaf_der().to_vec())),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(Fake::count(&fake.attests), 1);
    stop(r).await;
}

/// A request from a workload of uid 1000, the Fake's entry's selector.
fn workload_request<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        crate::workload::SECURITY_HEADER,
        "true".parse().expect("value"),
    );
    r.extensions_mut().insert(crate::workload::PeerInfo::fixed(
        crate::attest::Caller::host(1000, 1000, None, None),
    ));
    r
}

fn new_root() -> Vec<u8> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut p = rcgen::CertificateParams::default();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.self_signed(&key).expect("root").der().to_vec()
}

async fn next_item<T>(
    s: &mut (impl futures::Stream<Item = Result<T, tonic::Status>> + Unpin),
) -> T {
    tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .expect("an update in time")
        .expect("an item")
        .expect("ok")
}

#[tokio::test(start_paused = true)]
async fn bundle_stream_reaches_workload_api_sinks_and_survives_restart() {
    use crate::config::{DeletionPolicy, FileLayout, FilesSinkConfig};
    use signet_proto::workload as wpb;
    use signet_proto::workload::spiffe_workload_api_server::SpiffeWorkloadApi;

    let fake = Fake::new(Duration::from_secs(3600), 0);
    let dir = tempfile::tempdir().expect("tmp");
    let sink_dir = tempfile::tempdir().expect("tmp");
    let files = crate::sinks::files::FilesSink::new(
        "app",
        FilesSinkConfig {
            layout: FileLayout::Istio,
            ..FilesSinkConfig::new(sink_dir.path())
        },
    );
    let sinks = vec![SinkBinding {
        spiffe_id: "spiffe://example.org/app".parse().expect("id"),
        deletion_policy: DeletionPolicy::Delete,
        timeout: Duration::from_secs(30),
        sink: Arc::new(files),
    }];
    let r = start_with_sinks(&fake, dir.path(), Some("tok"), sinks);
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    let sink_roots = || {
        std::fs::read(sink_dir.path().join("root-cert.pem"))
            .ok()
            .and_then(|p| signet_types::pem::parse_certs(&p).ok())
            .unwrap_or_default()
    };
    let root1 = fake.root_der.clone();
    wait_for(10, || sink_roots() == [root1.clone()]).await;
    wait_for(10, || Fake::count(&fake.watches) >= 1).await;

    // A workload holds both Workload API streams open.
    let api =
        crate::workload::WorkloadApi::new(r.state.clone(), crate::attest::Attestor::default());
    let mut svids = api
        .fetch_x509svid(workload_request(wpb::X509svidRequest {}))
        .await
        .expect("stream")
        .into_inner();
    let mut bundles = api
        .fetch_x509_bundles(workload_request(wpb::X509BundlesRequest {}))
        .await
        .expect("stream")
        .into_inner();
    assert_eq!(next_item(&mut svids).await.svids[0].bundle, root1);
    assert_eq!(
        next_item(&mut bundles).await.bundles["spiffe://example.org"],
        root1
    );

    // The server publishes revision 2: a second root, as in a CA rotation.
    let root2 = new_root();
    let both = vec![root1.clone(), root2.clone()];
    fake.bundle.send_replace(TrustBundle {
        trust_domain: "example.org".parse().expect("td"),
        roots_der: both.clone(),
        revision: 2,
        tainted_key_ids: Vec::new(),
        crls: Vec::new(),
        jwt_keys: Vec::new(),
        tainted_jwt_key_ids: Vec::new(),
    });
    let svid = next_item(&mut svids).await;
    assert_eq!(svid.svids[0].bundle, both.concat(), "FetchX509SVID pushed");
    assert_eq!(svid.svids[0].spiffe_id, "spiffe://example.org/app");
    let b = next_item(&mut bundles).await;
    assert_eq!(
        b.bundles["spiffe://example.org"],
        both.concat(),
        "FetchX509Bundles pushed"
    );
    wait_for(10, || sink_roots() == both).await;
    assert_eq!(node::load_bundle(dir.path()), both, "persisted");

    // A bundle for another trust domain is ignored.
    fake.bundle.send_replace(TrustBundle {
        trust_domain: "other.org".parse().expect("td"),
        roots_der: vec![new_root()],
        revision: 3,
        tainted_key_ids: Vec::new(),
        crls: Vec::new(),
        jwt_keys: Vec::new(),
        tainted_jwt_key_ids: Vec::new(),
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*state.borrow().bundle_der, both);
    assert_eq!(node::load_bundle(dir.path()), both);
    drop((svids, bundles));
    stop(r).await;

    // Restarted with the server unreachable, the agent serves and trusts the newest
    // bundle, not only the bootstrap file's root.
    if let Ok(mut n) = fake.failing_connects.lock() {
        *n = u32::MAX;
    }
    let seen_before = fake.roots_seen.lock().map(|r| r.len()).unwrap_or(0);
    let r = start(&fake, dir.path(), None);
    let state = r.state.clone();
    wait_for(10, || *state.borrow().bundle_der == both).await;
    wait_for(10, || {
        fake.roots_seen.lock().map(|r| r.len()).unwrap_or(0) > seen_before
    })
    .await;
    let trusted = fake
        .roots_seen
        .lock()
        .expect("lock")
        .last()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        signet_types::pem::parse_certs(trusted.as_bytes()).expect("pem"),
        both
    );
    stop(r).await;
}

/// A CRL of the Fake's root numbered `number` listing the serials (raw DER integer bytes).
fn fake_crl(fake: &Fake, number: u64, serials: &[Vec<u8>]) -> Vec<u8> {
    crate::testing::crl(&fake.issuer, fake.clock.now(), number, serials)
}

/// The leaf's serial (unsigned big-endian, as `signet_pki` reads it).
fn serial_bytes(der: &[u8]) -> Vec<u8> {
    signet_pki::ParsedCert::from_der(der)
        .expect("leaf")
        .serial()
        .to_vec()
}

#[tokio::test(start_paused = true)]
async fn a_taint_then_a_crl_from_the_bundle_stream_replace_the_certificates_now() {
    // Hour-long certificates: nothing would be renewed during this test on its own.
    let fake = Fake::new(Duration::from_secs(3600), 0);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    wait_for(10, || Fake::count(&fake.watches) >= 1).await;
    let leaf = || {
        state.borrow().identities[0]
            .svid
            .certificate()
            .leaf_der()
            .to_vec()
    };
    let connects = || fake.connects.lock().map(|c| c.len()).unwrap_or(0);
    let first = leaf();
    let key_id = CertRef::parse(&first)
        .and_then(|c| c.issuer_key_id)
        .expect("AKI");
    let node_before = connects();
    let bundle = |tainted: Vec<String>, crls: Vec<Crl>| TrustBundle {
        trust_domain: "example.org".parse().expect("td"),
        roots_der: vec![fake.root_der.clone()],
        revision: 2,
        tainted_key_ids: tainted,
        crls,
        jwt_keys: Vec::new(),
        tainted_jwt_key_ids: Vec::new(),
    };

    // The root's key is tainted (the fake keeps signing with it): the workload and the
    // node certificates are replaced at once, then again only after a backoff.
    fake.bundle
        .send_replace(bundle(vec![key_id.clone()], vec![]));
    wait_for(5, || leaf() != first).await;
    wait_for(5, || connects() > node_before).await;
    // Over two seconds, with jitter 0 (every retry at the 0.5 s floor): a handful of
    // replacements, not a loop.
    let (mut seen, node_soon) = (vec![leaf()], connects());
    let until = signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock)
        + Duration::from_secs(2);
    while signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock) < until {
        let l = leaf();
        if seen.last() != Some(&l) {
            seen.push(l);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        seen.len() <= 6,
        "{} workload replacements in 2 s",
        seen.len()
    );
    assert!(seen.len() >= 2, "retried while the key stays tainted");
    assert!(
        connects() - node_soon <= 6,
        "node: {}",
        connects() - node_soon
    );

    // The taint is lifted and a CRL lists the workload's current serial: replaced again.
    fake.bundle.send_replace(bundle(vec![], vec![]));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = leaf();
    let crl = fake_crl(&fake, 7, &[serial_bytes(&held)]);
    fake.bundle.send_replace(bundle(
        vec![],
        vec![Crl {
            key_id: key_id.clone(),
            der: crl.clone(),
            number: 7,
        }],
    ));
    wait_for(5, || leaf() != held).await;
    wait_for(5, || *state.borrow().crls_der == [crl.clone()]).await;
    assert_eq!(
        node::load_crls(dir.path()),
        std::slice::from_ref(&crl),
        "persisted"
    );
    // A forged or older CRL changes nothing.
    fake.bundle.send_replace(bundle(
        vec![],
        vec![Crl {
            key_id: key_id.clone(),
            der: fake_crl(&fake, 6, &[]),
            number: 6,
        }],
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*state.borrow().crls_der, *std::slice::from_ref(&crl));
    stop(r).await;

    // Restarted with the server unreachable, the agent serves the CRL it kept.
    if let Ok(mut n) = fake.failing_connects.lock() {
        *n = u32::MAX;
    }
    let r = start(&fake, dir.path(), None);
    let state = r.state.clone();
    wait_for(10, || *state.borrow().crls_der == [crl.clone()]).await;
    stop(r).await;
}

#[tokio::test(start_paused = true)]
async fn bundle_stream_is_reopened_after_the_connection_is_replaced() {
    // Renewed within about a second: the new connection opens a new stream.
    let fake = Fake::new(Duration::from_secs(3), 0);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    wait_for(10, || {
        fake.connects.lock().map(|c| c.len()).unwrap_or(0) >= 2
    })
    .await;
    wait_for(10, || Fake::count(&fake.watches) >= 2).await;
    stop(r).await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_node_renewal_is_retried_with_backoff_whatever_the_status() {
    // Today's behaviour: Unauthenticated, Unavailable and ResourceExhausted alike are retried
    // after the backoff (jitter 0: the half-second floor each time), while the agent keeps
    // its node certificate and serves; no new attestation.
    let fake = Fake::new(Duration::from_secs(20), 0);
    if let Ok(mut r) = fake.renew_refusals.lock() {
        *r = vec![
            tonic::Code::Unauthenticated,
            tonic::Code::Unavailable,
            tonic::Code::ResourceExhausted,
        ];
    }
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    let state = r.state.clone();
    let connects = || fake.connects.lock().map(|c| c.len()).unwrap_or(0);
    wait_for(60, || connects() >= 2).await;
    let renewals = fake.renewals.lock().expect("lock").clone();
    assert_eq!(renewals.len(), 4, "three refusals, then the renewal");
    for pair in renewals.windows(2) {
        let gap = pair[1].duration_since(pair[0]).expect("later");
        assert!(
            gap >= RETRY_BASE / 2 && gap < RETRY_BASE / 2 + Duration::from_millis(20),
            "{gap:?}"
        );
    }
    assert_eq!(Fake::count(&fake.attests), 1);
    assert_eq!(state.borrow().identities.len(), 1, "served throughout");
    stop(r).await;
}

// --- outages and bans ------------------------------------------------------------------------

/// The leaf DER of each identity served, by entry.
fn served_leaves(state: &StateReceiver) -> Vec<(String, Vec<u8>)> {
    state
        .borrow()
        .identities
        .iter()
        .map(|i| (i.entry_id.clone(), i.svid.certificate().leaf_der().to_vec()))
        .collect()
}

/// A restart while the server is down serves the cached certificates at once (the same ones,
/// before any connection succeeds), says so on `/readyz`, and renews them when the server is
/// back.
#[tokio::test(start_paused = true)]
async fn a_restart_during_an_outage_serves_the_cache_then_renews() {
    use std::os::unix::fs::PermissionsExt;
    let fake = Fake::new(Duration::from_secs(24 * 3600), 0);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    wait_for(10, || r.ready.is_ready()).await;
    let before = served_leaves(&state);
    stop(r).await;
    let cache = dir.path().join(crate::cache::CACHE_FILE);
    let mode = std::fs::metadata(&cache)
        .expect("cache written")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // The server goes down; the agent restarts.
    Fake::set(&fake.failing_connects, u32::MAX);
    let signs = Fake::count(&fake.signs);
    let r = start(&fake, dir.path(), None);
    let state = r.state.clone();
    wait_for(10, || !state.borrow().identities.is_empty()).await;
    assert_eq!(served_leaves(&state), before, "the same certificate");
    assert_eq!(
        *state.borrow().bundle_der,
        *std::slice::from_ref(&fake.root_der)
    );
    wait_for(10, || {
        matches!(
            r.ready.status().server,
            crate::readiness::Server::Unreachable { .. }
        )
    })
    .await;
    let report = r.ready.report();
    assert!(report.ready, "{report:?}");
    let body = report.body(&[]);
    assert!(body.contains("server: unreachable since "), "{body}");
    assert!(
        body.contains("restored from the cache written at"),
        "{body}"
    );
    assert!(body.contains("certificates: 1 served"), "{body}");

    // Past its renewal time (half its hour) it is still served: renewals fail meanwhile.
    tokio::time::sleep(Duration::from_secs(2000)).await;
    assert_eq!(served_leaves(&state), before);
    assert_eq!(
        Fake::count(&fake.signs),
        signs,
        "nothing reached the server"
    );

    // The server is back: the agent reconnects and renews.
    Fake::set(&fake.failing_connects, 0);
    wait_for(10, || {
        let now = served_leaves(&state);
        now.len() == 1 && now != before
    })
    .await;
    assert!(Fake::count(&fake.signs) > signs);
    let status = r.ready.status();
    assert_eq!(status.server, crate::readiness::Server::Connected);
    assert!(status.synced);
    stop(r).await;
}

/// A certificate that expires during the outage is withdrawn at its expiry, and `/readyz`
/// turns not ready once nothing valid is left.
#[tokio::test(start_paused = true)]
async fn a_cached_certificate_stops_being_served_at_its_expiry() {
    let fake = Fake::new(Duration::from_secs(24 * 3600), 0);
    Fake::set(&fake.workload_ttl, Duration::from_secs(300));
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    let not_after = state.borrow().identities[0].svid.certificate().not_after();
    stop(r).await;

    Fake::set(&fake.failing_connects, u32::MAX);
    let r = start(&fake, dir.path(), None);
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    assert!(r.ready.is_ready());
    let mut watch = state.clone();
    watch.borrow_and_update();
    // The next change of the served state is its withdrawal, at its expiry.
    watch.changed().await.expect("changed");
    assert!(state.borrow().identities.is_empty());
    let at = fake.clock.now();
    assert!(at >= not_after, "not before its expiry");
    assert!(
        at.duration_since(not_after).unwrap_or_default() < Duration::from_secs(1),
        "at its expiry, not a pass later"
    );
    let report = r.ready.report();
    assert!(!report.ready);
    assert!(
        report
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("no valid certificate is left")),
        "{report:?}"
    );
    stop(r).await;
}

/// A cache that was tampered with is refused whole: nothing served until the server answers.
#[tokio::test(start_paused = true)]
async fn a_tampered_cache_is_refused_and_nothing_is_served_from_it() {
    let fake = Fake::new(Duration::from_secs(24 * 3600), 0);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    let state = r.state.clone();
    wait_for(10, || state.borrow().identities.len() == 1).await;
    stop(r).await;
    let cache = dir.path().join(crate::cache::CACHE_FILE);
    let mut bytes = std::fs::read(&cache).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    std::fs::write(&cache, &bytes).expect("write");

    Fake::set(&fake.failing_connects, 3);
    let r = start(&fake, dir.path(), None);
    let state = r.state.clone();
    // Not served while the server cannot be reached; served once it answers.
    wait_for(10, || {
        matches!(
            r.ready.status().server,
            crate::readiness::Server::Unreachable { .. }
        )
    })
    .await;
    assert!(state.borrow().identities.is_empty());
    assert!(r.ready.status().restored.is_none());
    let report = r.ready.report();
    assert!(!report.ready, "{report:?}");
    wait_for(10, || state.borrow().identities.len() == 1).await;
    // And the cache is written again, readable.
    stop(r).await;
    let node = match node::load(dir.path()) {
        Stored::Found(n) => n,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        crate::cache::load(dir.path(), &node, fake.clock.now()),
        crate::cache::Loaded::Found(_)
    ));
}

/// A banned node: not ready, saying why and how to lift it; retried every
/// [`crate::ca::BANNED_RETRY`], not in a loop; served again once unbanned.
#[tokio::test(start_paused = true)]
async fn a_banned_node_is_reported_and_retried_slowly() {
    let fake = Fake::new(Duration::from_secs(24 * 3600), 0);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    wait_for(10, || r.ready.is_ready()).await;

    Fake::set(&fake.banned, true);
    // The next poll (every 100 ms in these tests) is refused.
    wait_for(10, || r.ready.status().banned.is_some()).await;
    let report = r.ready.report();
    assert!(!report.ready);
    assert_eq!(
        report.reason.as_deref(),
        Some("node n1 is banned by the server; ask an operator to run `signetctl node unban n1`")
    );
    // Twenty minutes: a handful of attempts (one per BANNED_RETRY, per call), not thousands.
    let syncs = Fake::count(&fake.syncs);
    tokio::time::sleep(Duration::from_secs(1200)).await;
    let retried = Fake::count(&fake.syncs) - syncs;
    assert!((1..=5).contains(&retried), "{retried} syncs in 20 minutes");

    // Unbanned: within one BANNED_RETRY the agent is ready again.
    Fake::set(&fake.banned, false);
    tokio::time::sleep(crate::ca::BANNED_RETRY + Duration::from_secs(31)).await;
    wait_for(10, || r.ready.is_ready()).await;
    assert!(r.ready.status().banned.is_none());
    stop(r).await;
}

/// A ban is kept in the cache: a node banned while connected and restarted during an outage
/// is still reported banned (not ready) until the server answers otherwise.
#[tokio::test(start_paused = true)]
async fn a_ban_survives_a_restart_during_an_outage() {
    let fake = Fake::new(Duration::from_secs(24 * 3600), 0);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    wait_for(10, || r.ready.is_ready()).await;
    Fake::set(&fake.banned, true);
    wait_for(10, || r.ready.status().banned.is_some()).await;
    stop(r).await;

    Fake::set(&fake.failing_connects, u32::MAX);
    let r = start(&fake, dir.path(), None);
    wait_for(10, || r.ready.status().banned.is_some()).await;
    let report = r.ready.report();
    assert!(!report.ready, "{report:?}");
    assert!(
        report
            .reason
            .as_deref()
            .is_some_and(|x| x.contains("`signetctl node unban n1`")),
        "{report:?}"
    );

    // The server is back and no longer refuses the node: ready again, the ban forgotten.
    Fake::set(&fake.banned, false);
    Fake::set(&fake.failing_connects, 0);
    tokio::time::sleep(crate::ca::BANNED_RETRY + Duration::from_secs(31)).await;
    wait_for(10, || r.ready.is_ready()).await;
    assert!(r.ready.status().banned.is_none());
    stop(r).await;
    Fake::set(&fake.failing_connects, u32::MAX);
    let r = start(&fake, dir.path(), None);
    wait_for(10, || r.ready.is_ready()).await;
    assert!(r.ready.status().banned.is_none());
    stop(r).await;
}

/// A banned node attesting: refused (the token is the server's to keep), reported, retried
/// slowly.
#[tokio::test(start_paused = true)]
async fn a_banned_node_s_attestation_is_retried_slowly() {
    let fake = Fake::new(Duration::from_secs(24 * 3600), 0);
    Fake::set(&fake.banned, true);
    let dir = tempfile::tempdir().expect("tmp");
    let r = start(&fake, dir.path(), Some("tok"));
    wait_for(10, || r.ready.status().banned.is_some()).await;
    let report = r.ready.report();
    assert!(
        report
            .reason
            .as_deref()
            .is_some_and(|x| x.contains("`signetctl node unban n1`")),
        "{report:?}"
    );
    tokio::time::sleep(Duration::from_secs(1200)).await;
    let attests = Fake::count(&fake.attests);
    assert!(
        (2..=6).contains(&attests),
        "{attests} attestations in 20 minutes"
    );
    stop(r).await;
}
