//! The CA lifecycle as two workloads see it: each behind its own real `signet-agent`, they keep
//! opening mutual-TLS connections to each other (about 25 a second), each side using the SVID
//! and verifying the peer against the bundle its own Workload API serves at that moment, while
//! the real server (PostgreSQL) rotates its intermediate, then its root (prepared → active →
//! retired → removed) by itself with short lifetimes, and the operator then performs an
//! emergency rotation (`ca prepare`, `ca activate`, `ca taint` of the old key). Not one handshake
//! may fail, and after the taint both workloads hold a certificate from the new key within
//! seconds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use signet_tests::*;
use signet_types::SpiffeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::agent::{Agent, create_entry, create_token, eventually, write_config};
use crate::pg_server;

const CA: &str = "[ca]\nroot_ttl = \"30s\"\nintermediate_ttl = \"8s\"\nrotation_interval = \"200ms\"\n\
                  root_propagation = \"2s\"\nrotation_jitter = 0.0\n";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a workload holds: its SVID chain (leaf first), key, and the roots of its bundle.
#[derive(Clone)]
struct Material {
    chain: Vec<Vec<u8>>,
    key: Vec<u8>,
    roots: Vec<Vec<u8>>,
}

impl Material {
    fn certs(&self) -> Vec<CertificateDer<'static>> {
        self.chain
            .iter()
            .map(|d| CertificateDer::from(d.clone()))
            .collect()
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
    }

    /// The leaf's authority key identifier, lowercase hex.
    fn issuer_key_id(&self) -> String {
        signet_pki::ParsedCert::from_der(&self.chain[0])
            .unwrap()
            .authority_key_id()
            .expect("leaf has an authority key identifier")
            .to_owned()
    }
}

/// The workload's view of its Workload API, kept current from the X.509 context stream (what
/// go-spiffe's and the `spiffe` crate's sources do), reconnecting when the stream ends.
struct Workload {
    latest: Arc<Mutex<Option<Material>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Workload {
    fn watch(socket: &std::path::Path) -> Self {
        use futures::StreamExt;
        let latest = Arc::new(Mutex::new(None));
        let endpoint = format!("unix:{}", socket.display());
        let l = latest.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(client) = spiffe::WorkloadApiClient::connect_to(&endpoint).await
                    && let Ok(mut stream) = client.stream_x509_contexts().await
                {
                    while let Some(Ok(ctx)) = stream.next().await {
                        let Some(svid) = ctx.default_svid() else {
                            continue;
                        };
                        let td = svid.spiffe_id().trust_domain().clone();
                        let roots = ctx
                            .bundle_set()
                            .get(&td)
                            .map(|b| {
                                b.authorities()
                                    .iter()
                                    .map(|c| c.as_bytes().to_vec())
                                    .collect()
                            })
                            .unwrap_or_default();
                        *l.lock().unwrap() = Some(Material {
                            chain: svid
                                .cert_chain()
                                .iter()
                                .map(|c| c.as_bytes().to_vec())
                                .collect(),
                            key: svid.private_key().as_bytes().to_vec(),
                            roots,
                        });
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Self { latest, task }
    }

    fn now(&self) -> Option<Material> {
        self.latest.lock().unwrap().clone()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Default)]
struct Tally {
    ok: u64,
    failed: Vec<String>,
}

/// Workload A serves on `listener`: every connection is accepted with A's SVID of that moment,
/// and the client's certificate verified against A's bundle of that moment.
async fn serve(listener: tokio::net::TcpListener, a: Arc<Workload>, tally: Arc<Mutex<Tally>>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let a = a.clone();
        let tally = tally.clone();
        tokio::spawn(async move {
            let result = async {
                let m = a.now().ok_or("A has no SVID")?;
                let mut roots = rustls::RootCertStore::empty();
                for r in &m.roots {
                    roots
                        .add(CertificateDer::from(r.clone()))
                        .map_err(|e| e.to_string())?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .map_err(|e| e.to_string())?;
                let cfg = rustls::ServerConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(m.certs(), m.key())
                    .map_err(|e| e.to_string())?;
                let mut tls = tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
                    .accept(tcp)
                    .await
                    .map_err(|e| format!("server side: {e}"))?;
                let mut b = [0u8; 1];
                tls.read_exact(&mut b).await.map_err(|e| e.to_string())?;
                tls.write_all(&b).await.map_err(|e| e.to_string())?;
                tls.shutdown().await.ok();
                Ok::<_, String>(())
            }
            .await;
            if let Err(e) = result {
                tally.lock().unwrap().failed.push(e);
            }
        });
    }
}

/// Workload B connects to A: B's SVID of that moment, A's certificate verified against B's
/// bundle of that moment and A's SPIFFE ID; one byte there and back.
async fn connect_once(
    addr: std::net::SocketAddr,
    b: &Workload,
    a_id: &SpiffeId,
) -> Result<(), String> {
    let m = b.now().ok_or("B has no SVID")?;
    let verifier = SpiffePeer::new(&m.roots, a_id.clone())?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(m.certs(), m.key())
        .map_err(|e| e.to_string())?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| format!("client side: {e}"))?;
    tls.write_all(b"x").await.map_err(|e| e.to_string())?;
    let mut r = [0u8; 1];
    tls.read_exact(&mut r)
        .await
        .map_err(|e| format!("client side, after the handshake (peer refused us?): {e}"))?;
    Ok(())
}

/// What a SPIFFE client checks of its server (go-spiffe's `tlsconfig.AuthorizeID`): the chain
/// to a root of its own bundle, and the peer's SPIFFE ID (no DNS name is involved).
#[derive(Debug)]
struct SpiffePeer {
    roots: rustls::RootCertStore,
    expected: SpiffeId,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl SpiffePeer {
    fn new(roots: &[Vec<u8>], expected: SpiffeId) -> Result<Self, String> {
        let mut store = rustls::RootCertStore::empty();
        for r in roots {
            store
                .add(CertificateDer::from(r.clone()))
                .map_err(|e| e.to_string())?;
        }
        Ok(Self {
            roots: store,
            expected,
            provider: provider(),
        })
    }
}

impl rustls::client::danger::ServerCertVerifier for SpiffePeer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        signet_client::tls::check_server_id(end_entity, &self.expected)
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn status(server: &Server) -> serde_json::Value {
    let out = server.signetctl(&["ca", "status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The key IDs of the slots of `kind` in `state`.
fn keys(st: &serde_json::Value, kind: &str, state: &str) -> Vec<String> {
    let slots = st["slots"]
        .as_array()
        .or_else(|| st.as_array())
        .expect("ca status lists slots");
    slots
        .iter()
        .filter(|s| s["kind"] == kind && s["state"] == state)
        .map(|s| s["key_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Two workloads behind two agents, B connecting to A about 25 times a second.
struct Mesh {
    a: Arc<Workload>,
    b: Workload,
    a_id: SpiffeId,
    addr: std::net::SocketAddr,
    tally: Arc<Mutex<Tally>>,
    server_task: tokio::task::JoinHandle<()>,
    agents: Vec<Agent>,
    seen_intermediates: std::collections::BTreeSet<String>,
    seen_roots: std::collections::BTreeSet<Vec<u8>>,
    _layouts: Vec<crate::agent::Layout>,
}

impl Mesh {
    async fn start(server: &Server, entry_ttl: &str) -> Self {
        let (a_id, b_id) = (
            "spiffe://example.org/rotation/a",
            "spiffe://example.org/rotation/b",
        );
        let ta = create_token(server, "rot-a");
        let tb = create_token(server, "rot-b");
        create_entry(server, a_id, "rot-a", &["--ttl", entry_ttl]);
        create_entry(server, b_id, "rot-b", &["--ttl", entry_ttl]);
        let (la, lb) = (
            write_config(server, &ta, a_id),
            write_config(server, &tb, b_id),
        );
        let agents = vec![Agent::start(&la.config), Agent::start(&lb.config)];
        let a = Arc::new(Workload::watch(&la.socket));
        let b = Workload::watch(&lb.socket);
        eventually(30, "both workloads hold an SVID", || async {
            (a.now().is_some() && b.now().is_some()).then_some(())
        })
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tally = Arc::new(Mutex::new(Tally::default()));
        let server_task = tokio::spawn(serve(listener, a.clone(), tally.clone()));
        Self {
            a,
            b,
            a_id: a_id.parse().unwrap(),
            addr,
            tally,
            server_task,
            agents,
            seen_intermediates: Default::default(),
            seen_roots: Default::default(),
            _layouts: vec![la, lb],
        }
    }

    fn now(&self) -> (Material, Material) {
        (self.a.now().unwrap(), self.b.now().unwrap())
    }

    /// Handshakes until `until(a, b)` holds (panics after `secs`); how long that took.
    async fn run(
        &mut self,
        until: &mut dyn FnMut(&Material, &Material) -> bool,
        secs: u64,
        what: &str,
    ) -> Duration {
        let start = Instant::now();
        loop {
            let r = connect_once(self.addr, &self.b, &self.a_id).await;
            {
                let mut t = self.tally.lock().unwrap();
                match r {
                    Ok(()) => t.ok += 1,
                    Err(e) => t.failed.push(e),
                }
            }
            let (ma, mb) = self.now();
            for m in [&ma, &mb] {
                self.seen_intermediates.insert(m.issuer_key_id());
                self.seen_roots.extend(m.roots.iter().cloned());
            }
            if until(&ma, &mb) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    /// Stops everything; the handshakes that succeeded (none may have failed).
    async fn finish(self, what: &str) -> u64 {
        self.server_task.abort();
        let (ok, failed) = {
            let t = self.tally.lock().unwrap();
            (t.ok, t.failed.clone())
        };
        eprintln!(
            "{what}: {ok} handshakes ok, {} failed; intermediates seen: {}, roots seen: {}",
            failed.len(),
            self.seen_intermediates.len(),
            self.seen_roots.len()
        );
        assert!(
            failed.is_empty(),
            "{} failed handshakes, the first: {:?}",
            failed.len(),
            &failed[..failed.len().min(3)]
        );
        for agent in self.agents {
            agent.stop().await;
        }
        ok
    }
}

/// Short lifetimes: the intermediate rotates every few seconds and the root within 30 s, all by
/// the rotator.
#[tokio::test]
async fn mtls_between_two_workloads_survives_intermediate_and_root_rotation() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, CA).await else {
        return;
    };
    let mut mesh = Mesh::start(&server, "4s").await;

    // 1. Intermediate rotation: both workloads move to a second intermediate by themselves.
    let first = mesh.now().0.issuer_key_id();
    mesh.run(
        &mut |ma, mb| ma.issuer_key_id() != first && mb.issuer_key_id() != first,
        30,
        "an intermediate rotation",
    )
    .await;

    // 2. Root rotation: a second root appears in both bundles, new certificates chain to it,
    //    and the first root leaves the bundles once nothing chains to it.
    let first_root = mesh.now().0.roots.clone();
    assert_eq!(first_root.len(), 1);
    let old_root = first_root[0].clone();
    mesh.run(
        &mut |ma, mb| ma.roots.len() == 2 && mb.roots.len() == 2,
        40,
        "a prepared root in both bundles",
    )
    .await;
    let old_root_id = keys(&status(&server), "root", "active")[0].clone();
    mesh.run(
        &mut |ma, mb| {
            !ma.roots.contains(&old_root)
                && !mb.roots.contains(&old_root)
                && !ma.roots.is_empty()
                && !mb.roots.is_empty()
        },
        60,
        "the old root removed from both bundles",
    )
    .await;
    assert!(
        keys(&status(&server), "root", "removed").contains(&old_root_id),
        "{}",
        status(&server)
    );
    assert!(
        mesh.seen_intermediates.len() >= 3,
        "{:?}",
        mesh.seen_intermediates
    );
    assert!(mesh.seen_roots.len() >= 2);
    let ok = mesh.finish("intermediate and root rotation").await;
    assert!(ok > 200, "only {ok} handshakes");
}

/// Default lifetimes (7-day intermediate, 1-hour workload certificates renewed at half-life):
/// only the taint can make the workloads replace their certificates within seconds. The
/// operator's emergency rotation: prepare and activate a new intermediate, taint the old one.
#[tokio::test]
async fn mtls_between_two_workloads_survives_an_emergency_rotation_and_taint() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let mut mesh = Mesh::start(&server, "1h").await;
    let mut n = 0;
    mesh.run(
        &mut |_, _| {
            n += 1;
            n > 10
        },
        10,
        "handshakes before",
    )
    .await;
    let compromised = keys(&status(&server), "intermediate", "active")[0].clone();
    let (ma, mb) = mesh.now();
    assert_eq!(ma.issuer_key_id(), compromised);
    assert_eq!(mb.issuer_key_id(), compromised);

    let out = server.signetctl(&["ca", "prepare"]);
    assert!(out.status.success(), "{out:?}");
    let prepared = keys(&status(&server), "intermediate", "prepared");
    assert_eq!(prepared.len(), 1, "{}", status(&server));
    let out = server.signetctl(&["ca", "activate", &prepared[0]]);
    assert!(out.status.success(), "{out:?}");
    // Activation alone replaces nothing: certificates are renewed at half their life.
    let mut n = 0;
    mesh.run(
        &mut |_, _| {
            n += 1;
            n > 10
        },
        10,
        "handshakes after the activation",
    )
    .await;
    assert_eq!(mesh.now().0.issuer_key_id(), compromised);

    let out = server.signetctl(&["ca", "taint", &compromised]);
    assert!(out.status.success(), "{out:?}");
    let replaced_in = mesh
        .run(
            &mut |ma, mb| ma.issuer_key_id() == prepared[0] && mb.issuer_key_id() == prepared[0],
            20,
            "both workloads on the new key",
        )
        .await;
    eprintln!("taint → both workloads on the new intermediate: {replaced_in:?}");
    let mut n = 0;
    mesh.run(
        &mut |_, _| {
            n += 1;
            n > 10
        },
        10,
        "handshakes after the taint",
    )
    .await;
    // The rest of the procedure: the old key's certificates revoked (its outstanding count in
    // `ca status` falls to zero), then the key removed from the bundle, which was refused while
    // they were outstanding.
    let outstanding = |st: &serde_json::Value| {
        let slots = st["slots"].as_array().or_else(|| st.as_array()).unwrap();
        slots
            .iter()
            .find(|s| s["key_id"] == compromised.as_str())
            .unwrap()["unexpired_certificates"]
            .as_u64()
            .unwrap()
    };
    assert!(outstanding(&status(&server)) >= 2);
    let out = server.signetctl(&["ca", "revoke", &compromised]);
    assert!(!out.status.success(), "{out:?}");
    let out = server.signetctl(&[
        "certs",
        "revoke",
        "--ca-key",
        &compromised,
        "--reason",
        "keyCompromise",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(outstanding(&status(&server)), 0, "{}", status(&server));
    let out = server.signetctl(&["ca", "revoke", &compromised]);
    assert!(out.status.success(), "{out:?}");
    let mut n = 0;
    mesh.run(
        &mut |_, _| {
            n += 1;
            n > 10
        },
        10,
        "handshakes after the key's removal",
    )
    .await;
    mesh.finish("emergency rotation and taint").await;
}

/// A running agent follows a root rotation into its own connection to the server: after
/// `ca prepare --root`, `ca activate --force` and a restart of the server (whose TLS
/// certificate then chains to the new root, which the agent received over the bundle stream
/// but did not have at its start), the agent reconnects and keeps renewing its workload's SVID
/// without being restarted.
#[tokio::test]
async fn a_running_agent_trusts_a_new_root_for_the_server_after_a_restart() {
    let tokens = TokenIssuer::new("k1");
    let Some(mut server) = pg_server(&tokens, "").await else {
        return;
    };
    let id = "spiffe://example.org/rotation/follow";
    let token = create_token(&server, "rot-follow");
    create_entry(&server, id, "rot-follow", &["--ttl", "4s"]);
    let layout = write_config(&server, &token, id);
    let agent = Agent::start(&layout.config);
    let w = Workload::watch(&layout.socket);
    eventually(30, "an SVID", || async { w.now().map(|_| ()) }).await;
    let first_root = w.now().unwrap().roots;
    assert_eq!(first_root.len(), 1);

    let out = server.signetctl(&["ca", "prepare", "--root"]);
    assert!(out.status.success(), "{out:?}");
    let new_root = String::from_utf8(out.stdout).unwrap();
    let new_root = new_root
        .trim()
        .strip_prefix("prepared ")
        .unwrap()
        .to_owned();
    eventually(20, "the new root in the workload's bundle", || async {
        (w.now().unwrap().roots.len() == 2).then_some(())
    })
    .await;
    let out = server.signetctl(&["ca", "activate", &new_root, "--force"]);
    assert!(out.status.success(), "{out:?}");

    // After the restart the server's TLS certificate chains to the new root only.
    server = server.restart().await;
    let old_only = signet_types::pem::certs_to_pem(first_root.iter().map(Vec::as_slice));
    let target = signet_client::ServerTarget::new(
        server.grpc.to_string(),
        old_only.into_bytes(),
        "example.org".parse().unwrap(),
    );
    let refused = signet_client::connect(&target, None).await;
    assert!(
        refused.is_err(),
        "the restarted server's certificate still chains to the first root"
    );

    // The agent was not restarted: it must reconnect and renew the 4 s SVID, twice.
    let at_restart = w.now().unwrap().chain[0].clone();
    let mut seen = std::collections::BTreeSet::new();
    eventually(30, "two SVIDs renewed after the restart", || {
        if let Some(m) = w.now()
            && m.chain[0] != at_restart
        {
            seen.insert(m.chain[0].clone());
        }
        let n = seen.len();
        async move { (n >= 2).then_some(()) }
    })
    .await;
    agent.stop().await;
}
