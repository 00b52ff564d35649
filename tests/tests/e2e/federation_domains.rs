//! Federation end to end, with real processes only: two Signet trust domains (a.test, b.test),
//! each a server on its own PostgreSQL database with its own SPIFFE bundle endpoint and an
//! agent, federating both ways (https_spiffe); and an independent bundle endpoint
//! (tests/py/bundle_endpoint.py) for a partner.test whose root and JWT key are made here.
//!
//! The workloads are py-spiffe processes (tests/py/federation_peer.py): they see the other
//! trust domain's bundle only when their entry federates with it, and two of them, one per
//! trust domain, make a mutual TLS connection with only what their own agent delivered, each
//! verifying the peer against the bundle of the peer's trust domain and checking its SPIFFE ID.
//! A root rotation on one side reaches the other side's workloads within the refresh hint; a
//! partner's bad documents (unparsable, sequence going backwards, an endpoint with the wrong
//! SPIFFE ID) are refused with the bundle held kept, and a good one accepted after them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use signet_proto::admin::federation_admin_client::FederationAdminClient;
use signet_proto::admin::{
    CreateRelationshipRequest, GetRelationshipRequest, RefreshRelationshipRequest, Relationship,
};
use signet_tests::*;
use tonic::transport::Channel;

use crate::agent::{Agent, Layout, create_entry, create_token, eventually, write_config};
use crate::pg_server;
use crate::workload_clients::python;

const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/federation_peer.py");
const ENDPOINT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/bundle_endpoint.py");
/// The uid of the workloads whose entries do not federate.
pub(crate) const NOBODY: u32 = 65534;

/// `federation_peer.py ARGS` against the agent socket, as `uid` (setpriv) when given.
pub(crate) fn peer_command(
    python: &Path,
    socket: &Path,
    uid: Option<u32>,
    args: &[&str],
) -> tokio::process::Command {
    let mut c = match uid {
        Some(uid) => {
            let mut c = tokio::process::Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(python);
            c
        }
        None => tokio::process::Command::new(python),
    };
    c.arg(PEER)
        .args(args)
        .env(
            "SPIFFE_ENDPOINT_SOCKET",
            format!("unix://{}", socket.display()),
        )
        .env_remove("SIGNET_GRPC_DEFAULT_AUTHORITY")
        .env("PYTHONWARNINGS", "ignore")
        .env("HOME", "/tmp")
        .kill_on_drop(true);
    c
}

/// One run's JSON line; Err(stderr) when the script failed (exit 2).
pub(crate) async fn peer_run(
    python: &Path,
    socket: &Path,
    uid: Option<u32>,
    args: &[&str],
) -> Result<serde_json::Value, String> {
    let out = peer_command(python, socket, uid, args)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{}{}", text, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("federation_peer.py {args:?}: {e}; stdout {text:?}")))
}

/// The trust domains a JSON map (`svid_bundles`, `bundles`, `jwt_bundles`) names.
pub(crate) fn tds(v: &serde_json::Value) -> Vec<String> {
    let mut t: Vec<String> = v
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    t.sort();
    t
}

/// The bundle endpoint address the server printed.
pub(crate) fn endpoint_of(server: &Server) -> SocketAddr {
    server
        .stdout
        .iter()
        .find_map(|l| l.trim().strip_prefix("SPIFFE bundle endpoint: https://"))
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("no bundle endpoint in {:?}", server.stdout))
        .parse()
        .unwrap()
}

pub(crate) async fn federation_admin(server: &Server) -> FederationAdminClient<Channel> {
    FederationAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    )
}

pub(crate) async fn relationship(server: &Server, td: &str) -> Relationship {
    federation_admin(server)
        .await
        .get_relationship(GetRelationshipRequest {
            trust_domain: td.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// `RefreshRelationship`, then the relationship as stored (the call's own answer or, if it
/// answered an error, `GetRelationship`).
pub(crate) async fn refresh(server: &Server, td: &str) -> Relationship {
    let r = federation_admin(server)
        .await
        .refresh_relationship(RefreshRelationshipRequest {
            trust_domain: td.into(),
        })
        .await;
    match r {
        Ok(r) => r.into_inner(),
        Err(status) => {
            eprintln!("RefreshRelationship({td}): {status:?}");
            relationship(server, td).await
        }
    }
}

/// One trust domain: a server with a bundle endpoint, an agent, an entry for this uid that
/// federates with `other` (its files sink with `include_federated_domains`) and one for
/// `nobody` that does not (a files sink too).
pub(crate) struct Domain {
    pub(crate) td: String,
    pub(crate) server: Server,
    pub(crate) agent: Option<Agent>,
    pub(crate) layout: Layout,
    pub(crate) fed_id: String,
    pub(crate) plain_id: String,
    pub(crate) plain_sink: PathBuf,
}

impl Domain {
    async fn server(td: &str, tokens: &TokenIssuer, federation: &str) -> Option<Server> {
        let toml = format!(
            "trust_domain = \"{td}\"\n[federation]\nbundle_endpoint_listen = \"127.0.0.1:0\"\n\
             fetch_retry = \"1s\"\n{federation}"
        );
        let s = pg_server(tokens, &toml).await?;
        assert_eq!(s.trust_domain, td);
        Some(s)
    }

    /// Entries and the agent, once the relationship with `other` exists.
    async fn start_agent(server: Server, other: &str) -> Self {
        let td = server.trust_domain.clone();
        let node = format!("node-{td}");
        let token = create_token(&server, &node);
        let fed_id = format!("spiffe://{td}/fed");
        let plain_id = format!("spiffe://{td}/plain");
        create_entry(
            &server,
            &fed_id,
            &node,
            &["--federates-with", other, "--ttl", "1h"],
        );
        let nobody = format!("unix:uid:{NOBODY}");
        let out = server.signetctl(&[
            "entry",
            "create",
            "--spiffe-id",
            &plain_id,
            "--parent",
            &node,
            "--selector",
            &nobody,
            "--ttl",
            "1h",
        ]);
        assert!(out.status.success(), "{out:?}");
        let layout = write_config(&server, &token, &fed_id);
        let plain_sink = layout._dir.path().join("plain-sink");
        std::fs::create_dir(&plain_sink).unwrap();
        let mut cfg = std::fs::read_to_string(&layout.config).unwrap();
        cfg.push_str(&format!(
            "include_federated_domains = true\n\n[[sinks]]\nname = \"plain\"\nkind = \"files\"\n\
             spiffe_id = \"{plain_id}\"\ndirectory = \"{}\"\nlayout = \"spiffe-helper\"\n\
             include_federated_domains = true\n",
            plain_sink.display()
        ));
        std::fs::write(&layout.config, cfg).unwrap();
        let dir = layout.socket.parent().unwrap();
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let agent = Agent::start(&layout.config);
        Self {
            td,
            server,
            agent: Some(agent),
            layout,
            fed_id,
            plain_id,
            plain_sink,
        }
    }

    pub(crate) async fn stop(mut self) {
        if let Some(a) = self.agent.take() {
            a.stop().await;
        }
        self.server.stop().await;
    }
}

/// `https_spiffe` relationship on `on` with `with`'s bundle endpoint, starting from its bundle.
async fn federate(on: &Server, with: &Server) -> Relationship {
    let td = &with.trust_domain;
    federation_admin(on)
        .await
        .create_relationship(CreateRelationshipRequest {
            trust_domain: td.clone(),
            bundle_endpoint_url: format!("https://{}/", endpoint_of(with)),
            profile: "https_spiffe".into(),
            endpoint_spiffe_id: format!("spiffe://{td}/signet/server"),
            bundle: with.bundle_pem.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateRelationship({td}) on {}: {e:?}", on.trust_domain))
        .into_inner()
}

/// a.test and b.test federating both ways; `b_federation` is appended to B's `[federation]`,
/// `a_federation` to A's. None without PostgreSQL outside CI.
pub(crate) async fn two_domains(
    a_federation: &str,
    b_federation: &str,
) -> Option<(Domain, Domain)> {
    let tokens = TokenIssuer::new("k1");
    let (a, b) = tokio::join!(
        Domain::server("a.test", &tokens, a_federation),
        Domain::server("b.test", &tokens, b_federation)
    );
    let (a, b) = (a?, b?);
    let ra = federate(&a, &b).await;
    assert!(ra.last_error.is_empty(), "{ra:?}");
    assert!(!ra.bundle_document.is_empty(), "{ra:?}");
    let rb = federate(&b, &a).await;
    assert!(rb.last_error.is_empty(), "{rb:?}");
    let a = Domain::start_agent(a, "b.test").await;
    let b = Domain::start_agent(b, "a.test").await;
    Some((a, b))
}

/// The federating workload's view, once it holds `want` as a foreign trust domain.
pub(crate) async fn info_with(
    python: &Path,
    d: &Domain,
    want: &str,
    secs: u64,
) -> serde_json::Value {
    eventually(
        secs,
        &format!("{want}'s bundle at {}", d.fed_id),
        || async {
            let v = peer_run(python, &d.layout.socket, None, &["info"])
                .await
                .ok()?;
            tds(&v["svid_bundles"])
                .contains(&want.to_owned())
                .then_some(v)
        },
    )
    .await
}

/// The roots (PEM) of `td` in a JSON map.
fn roots(v: &serde_json::Value, td: &str) -> Vec<String> {
    v[td]
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn pem_certs(pem: &[u8]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .map(|c| c.unwrap().to_vec())
        .collect();
    v.sort();
    v
}

use rustls::pki_types::pem::PemObject;

/// A `serve` process of federation_peer.py and its port.
pub(crate) struct Serving {
    pub(crate) child: tokio::process::Child,
    pub(crate) lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    pub(crate) port: u16,
    _dir: tempfile::TempDir,
}

impl Serving {
    pub(crate) async fn start(python: &Path, socket: &Path, expected: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let mut child = peer_command(
            python,
            socket,
            None,
            &["serve", expected, port_file.to_str().unwrap()],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
        let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().unwrap(),
        ));
        let port = eventually(20, "the serving workload's port", || async {
            std::fs::read_to_string(&port_file)
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .await;
        Self {
            child,
            lines,
            port,
            _dir: dir,
        }
    }

    /// The next connection's JSON line.
    pub(crate) async fn next(&mut self) -> serde_json::Value {
        let l = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("a connection line in time")
            .unwrap()
            .expect("a line");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l:?}: {e}"))
    }
}

#[tokio::test]
async fn two_signet_domains_federate_both_ways() {
    let Some(python) = python() else { return };
    let t0 = Instant::now();
    let Some((a, b)) = two_domains("", "").await else {
        return;
    };
    // Each federating workload sees the other trust domain's roots, exactly the other
    // server's bundle, in its X509-SVID response and in FetchX509Bundles, and its JWT keys.
    for (me, other) in [(&a, &b), (&b, &a)] {
        let v = info_with(&python, me, &other.td, 30).await;
        assert_eq!(v["svids"], serde_json::json!([me.fed_id]), "{v}");
        assert_eq!(
            tds(&v["svid_bundles"]),
            [a.td.as_str(), b.td.as_str()],
            "{v}"
        );
        assert_eq!(tds(&v["bundles"]), [a.td.as_str(), b.td.as_str()], "{v}");
        assert_eq!(
            tds(&v["jwt_bundles"]),
            [a.td.as_str(), b.td.as_str()],
            "{v}"
        );
        let theirs = roots(&v["svid_bundles"], &other.td).concat();
        assert_eq!(
            pem_certs(theirs.as_bytes()),
            pem_certs(&other.server.bundle_pem),
            "{}'s roots as {} delivered them",
            other.td,
            me.td
        );
        // The files sink writes federated-<td>.pem beside the SVID.
        let f = me
            .layout
            .sink_dir
            .join(format!("federated-{}.pem", other.td));
        let held = eventually(20, "federated file", || async { std::fs::read(&f).ok() }).await;
        assert_eq!(pem_certs(&held), pem_certs(&other.server.bundle_pem));
    }
    println!("both domains federated after {:?}", t0.elapsed());

    // Mutual TLS between a.test's workload (server) and b.test's (client), with only what
    // each one's own agent delivered.
    let mut serving = Serving::start(&python, &a.layout.socket, &b.fed_id).await;
    let client = peer_run(
        &python,
        &b.layout.socket,
        None,
        &["connect", &serving.port.to_string(), &a.fed_id],
    )
    .await
    .unwrap();
    let server_side = serving.next().await;
    assert_eq!(client["ok"], true, "{client}; server: {server_side}");
    assert_eq!(client["peer"], a.fed_id.as_str(), "{client}");
    assert!(
        client["peer"]
            .as_str()
            .unwrap()
            .starts_with("spiffe://a.test/")
    );
    assert_eq!(server_side["ok"], true, "{server_side}");
    assert_eq!(server_side["peer"], b.fed_id.as_str(), "{server_side}");
    assert!(
        server_side["peer"]
            .as_str()
            .unwrap()
            .starts_with("spiffe://b.test/")
    );
    // A client expecting another SPIFFE ID of a.test refuses the same server.
    let wrong = peer_run(
        &python,
        &b.layout.socket,
        None,
        &[
            "connect",
            &serving.port.to_string(),
            "spiffe://a.test/other",
        ],
    )
    .await
    .unwrap();
    assert_eq!(wrong["ok"], false, "{wrong}");
    let _ = serving.next().await;
    let _ = serving.child.kill().await;
    println!("mutual TLS across trust domains after {:?}", t0.elapsed());

    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_root_rotation_reaches_the_other_domains_workloads_within_the_refresh_hint() {
    let Some(python) = python() else { return };
    const HINT: Duration = Duration::from_secs(2);
    let Some((a, b)) = two_domains("fetch_refresh_min = \"1s\"\n", "refresh_hint = \"2s\"\n").await
    else {
        return;
    };
    let before = info_with(&python, &a, "b.test", 30).await;
    assert_eq!(
        roots(&before["svid_bundles"], "b.test").len(),
        1,
        "{before}"
    );
    // Let A's refresh schedule follow B's 2 s hint (the first fetch, at creation, set it).
    let r = relationship(&a.server, "b.test").await;
    assert!(
        r.next_refresh_at - r.last_attempt_at <= 2,
        "A schedules B's endpoint by its hint: {r:?}"
    );

    let out = b.server.signetctl(&["ca", "prepare", "--root"]);
    assert!(out.status.success(), "{out:?}");
    let t0 = Instant::now();
    let after = eventually(30, "B's new root at A's workload", || async {
        let v = peer_run(&python, &a.layout.socket, None, &["info"])
            .await
            .ok()?;
        (roots(&v["svid_bundles"], "b.test").len() == 2).then_some(v)
    })
    .await;
    let took = t0.elapsed();
    println!("B's new root reached A's federating workload in {took:?} (hint {HINT:?})");
    let b_bundle = std::fs::read(b.server.bundle_path()).unwrap();
    assert_eq!(
        pem_certs(roots(&after["svid_bundles"], "b.test").concat().as_bytes()),
        pem_certs(&b_bundle),
        "A's workload holds B's bundle as B serves it"
    );
    // The hint, the refresh_min floor's rounding, and the agent's sync: 3 s of margin.
    assert!(
        took <= HINT + Duration::from_secs(3),
        "took {took:?}, hint {HINT:?}"
    );
    a.stop().await;
    b.stop().await;
}

// ---- an independent bundle endpoint ----

/// partner.test: a root, a JWT key, and the documents a bundle endpoint serves.
pub(crate) struct Partner {
    pub(crate) root_cert: rcgen::Certificate,
    pub(crate) issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub(crate) jwt: TokenIssuer,
    root_point: Vec<u8>,
}

impl Partner {
    pub(crate) fn new() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "partner.test root");
        p.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://partner.test".try_into().unwrap(),
        ));
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let root_cert = p.self_signed(&key).unwrap();
        let root_point = key.public_key_raw().to_vec();
        Self {
            root_point,
            root_cert,
            issuer: rcgen::Issuer::new(p, key),
            jwt: TokenIssuer::new("partner-jwt-1"),
        }
    }

    /// A leaf for `spiffe_id` signed by the partner root: (chain PEM, key PEM).
    pub(crate) fn leaf(&self, spiffe_id: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names
            .push(rcgen::SanType::URI(spiffe_id.try_into().unwrap()));
        p.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        let leaf = p.signed_by(&key, &self.issuer).unwrap();
        (leaf.pem(), key.serialize_pem())
    }

    /// A SPIFFE bundle document, written by hand: the root (x5c) and the JWT key.
    pub(crate) fn document(&self, sequence: u64) -> String {
        let der = self.root_cert.der().to_vec();
        let point = &self.root_point;
        let (x, y) = (&point[1..33], &point[33..65]);
        let jwks: serde_json::Value = serde_json::from_str(&self.jwt.jwks_json()).unwrap();
        let mut jwt = jwks["keys"][0].clone();
        jwt["use"] = "jwt-svid".into();
        serde_json::json!({
            "keys": [
                {"use": "x509-svid", "kty": "EC", "crv": "P-256",
                 "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
                 "x5c": [STANDARD.encode(&der)]},
                jwt,
            ],
            "spiffe_sequence": sequence,
            "spiffe_refresh_hint": 60,
        })
        .to_string()
    }
}

/// tests/py/bundle_endpoint.py behind a fixed loopback port (a forwarder), so it can be
/// restarted with another certificate while the relationship's URL stays the same.
pub(crate) struct PartnerEndpoint {
    pub(crate) addr: SocketAddr,
    pub(crate) doc_dir: PathBuf,
    dir: tempfile::TempDir,
    child: Option<tokio::process::Child>,
    target: Arc<AtomicU16>,
}

impl PartnerEndpoint {
    pub(crate) async fn start(chain: &str, key: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let doc_dir = dir.path().join("docs");
        std::fs::create_dir(&doc_dir).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(AtomicU16::new(0));
        let t = target.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let port = t.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });
        let mut e = Self {
            addr,
            doc_dir,
            dir,
            child: None,
            target,
        };
        e.restart(chain, key).await;
        e
    }

    /// (Re)starts the endpoint with this certificate chain and key.
    pub(crate) async fn restart(&mut self, chain: &str, key: &str) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
        let n = rand_suffix();
        let cert_file = self.dir.path().join(format!("cert-{n}.pem"));
        let key_file = self.dir.path().join(format!("key-{n}.pem"));
        let port_file = self.dir.path().join(format!("port-{n}"));
        std::fs::write(&cert_file, chain).unwrap();
        std::fs::write(&key_file, key).unwrap();
        let child = tokio::process::Command::new("python3")
            .arg(ENDPOINT)
            .arg("--cert")
            .arg(&cert_file)
            .arg("--key")
            .arg(&key_file)
            .arg("--port-file")
            .arg(&port_file)
            .arg("--doc-dir")
            .arg(&self.doc_dir)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let port: u16 = eventually(20, "the bundle endpoint's port", || async {
            std::fs::read_to_string(&port_file)
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .await;
        self.target.store(port, Ordering::SeqCst);
        self.child = Some(child);
    }

    /// Serves `doc` from now on (renamed over current.json).
    pub(crate) fn serve(&self, doc: &str) {
        let tmp = self.doc_dir.join("next.json");
        std::fs::write(&tmp, doc).unwrap();
        std::fs::rename(&tmp, self.doc_dir.join("current.json")).unwrap();
    }

    pub(crate) fn url(&self) -> String {
        format!("https://{}/", self.addr)
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// partner.test (a root, a JWT key) served by an independent endpoint at sequence 5, and
/// `server`'s https_spiffe relationship with it, its first fetch accepted.
async fn federate_with_partner(server: &Server) -> (Partner, PartnerEndpoint) {
    let partner = Partner::new();
    let (chain, key) = partner.leaf("spiffe://partner.test/bundle-endpoint");
    let endpoint = PartnerEndpoint::start(&chain, &key).await;
    endpoint.serve(&partner.document(5));
    let r = federation_admin(server)
        .await
        .create_relationship(CreateRelationshipRequest {
            trust_domain: "partner.test".into(),
            bundle_endpoint_url: endpoint.url(),
            profile: "https_spiffe".into(),
            endpoint_spiffe_id: "spiffe://partner.test/bundle-endpoint".into(),
            bundle: partner.root_cert.pem().into_bytes(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.last_error.is_empty(), "{r:?}");
    assert_eq!(r.sequence, 5, "{r:?}");
    (partner, endpoint)
}

/// a.test (server and agent) federating with partner.test served by an independent endpoint
/// at sequence 5; the entry for this uid federates, the one for `nobody` does not.
pub(crate) async fn with_partner() -> Option<(Domain, Partner, PartnerEndpoint)> {
    let tokens = TokenIssuer::new("k1");
    let server = Domain::server("a.test", &tokens, "").await?;
    let (partner, endpoint) = federate_with_partner(&server).await;
    let a = Domain::start_agent(server, "partner.test").await;
    Some((a, partner, endpoint))
}

fn held_sequence(r: &Relationship) -> u64 {
    let doc: serde_json::Value = serde_json::from_slice(&r.bundle_document)
        .unwrap_or_else(|e| panic!("bundle_document: {e}: {r:?}"));
    doc["spiffe_sequence"].as_u64().unwrap()
}

#[tokio::test]
async fn an_independent_bundle_endpoint_is_fetched_and_its_bad_documents_refused() {
    let Some(python) = python() else { return };
    let t0 = Instant::now();
    let Some((a, partner, mut endpoint)) = with_partner().await else {
        return;
    };
    // The agent delivers partner.test's root and JWT key to the federating workload.
    let v = info_with(&python, &a, "partner.test", 30).await;
    assert_eq!(
        pem_certs(
            roots(&v["svid_bundles"], "partner.test")
                .concat()
                .as_bytes()
        ),
        pem_certs(partner.root_cert.pem().as_bytes())
    );
    assert_eq!(
        v["jwt_bundles"]["partner.test"],
        serde_json::json!(["partner-jwt-1"]),
        "{v}"
    );
    // ValidateJWTSVID accepts a token the partner's JWT key signed.
    let now = now_unix();
    let claims = serde_json::json!({
        "sub": "spiffe://partner.test/x", "aud": ["svc-a"], "iat": now, "exp": now + 300,
    });
    // ring's ECDSA signatures are not normalized; Signet (rightly) takes only low-S ones.
    let token = loop {
        let t = partner.jwt.sign(&claims);
        let sig = URL_SAFE_NO_PAD
            .decode(t.rsplit('.').next().unwrap())
            .unwrap();
        if sig[32] < 0x7f {
            break t;
        }
    };
    let ok = peer_run(
        &python,
        &a.layout.socket,
        None,
        &["validate", &token, "svc-a"],
    )
    .await
    .unwrap();
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(ok["spiffe_id"], "spiffe://partner.test/x", "{ok}");

    // Bad documents: each refused with a reason, the sequence-5 document kept.
    let cases: [(&str, Option<String>, &[&str]); 2] = [
        (
            "unparsable",
            Some("{\"keys\": [ not json".into()),
            &["pars", "json", "JSON"],
        ),
        ("backwards", Some(partner.document(4)), &["sequence"]),
    ];
    for (what, doc, words) in cases {
        endpoint.serve(&doc.unwrap());
        let r = refresh(&a.server, "partner.test").await;
        assert!(!r.last_error.is_empty(), "{what}: {r:?}");
        assert!(
            words.iter().any(|w| r.last_error.contains(w)),
            "{what}: the reason {:?} names none of {words:?}",
            r.last_error
        );
        assert_eq!(held_sequence(&r), 5, "{what}: {r:?}");
        assert_eq!(r.sequence, 5, "{what}");
        println!("{what}: refused: {}", r.last_error);
    }
    // The endpoint restarted with an SVID for another SPIFFE ID (same root, good document).
    endpoint.serve(&partner.document(6));
    let (chain, key) = partner.leaf("spiffe://partner.test/not-the-endpoint");
    endpoint.restart(&chain, &key).await;
    let r = refresh(&a.server, "partner.test").await;
    assert!(
        r.last_error.contains("not-the-endpoint") || r.last_error.contains("bundle-endpoint"),
        "the wrong SPIFFE ID is named: {r:?}"
    );
    assert_eq!(held_sequence(&r), 5, "{r:?}");
    println!("wrong endpoint ID: refused: {}", r.last_error);

    // The right endpoint again, sequence 6: accepted.
    let (chain, key) = partner.leaf("spiffe://partner.test/bundle-endpoint");
    endpoint.restart(&chain, &key).await;
    let r = refresh(&a.server, "partner.test").await;
    assert!(r.last_error.is_empty(), "{r:?}");
    assert_eq!(r.consecutive_failures, 0, "{r:?}");
    assert_eq!(r.sequence, 6, "{r:?}");
    assert_eq!(held_sequence(&r), 6, "{r:?}");
    println!("took {:?}", t0.elapsed());
    a.stop().await;
}

/// `GET /` on `server`'s bundle endpoint: (spiffe_sequence, the x5c roots).
async fn own_document(server: &Server) -> (u64, Vec<String>) {
    let id = format!("spiffe://{}/signet/server", server.trust_domain)
        .parse()
        .unwrap();
    let (_, body) = crate::federation::fetch(endpoint_of(server), &server.bundle_pem, id)
        .await
        .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let roots = doc["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["use"] == "x509-svid")
        .map(|k| k["x5c"][0].as_str().unwrap().to_owned())
        .collect();
    (doc["spiffe_sequence"].as_u64().unwrap(), roots)
}

/// Two replicas of one deployment on one PostgreSQL database: racing refreshes of one
/// relationship converge on one stored bundle with no failure reported, and the replicas'
/// own bundle endpoints serve one `spiffe_sequence` that never goes down, also while a new
/// root reaches one replica before the other.
#[tokio::test]
async fn two_replicas_on_one_database_converge_on_one_bundle_and_one_sequence() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kek_path = dir.path().join("kek");
    let kek = std::process::Command::new("openssl")
        .args(["rand", "-base64", "32"])
        .output()
        .unwrap();
    std::fs::write(&kek_path, &kek.stdout).unwrap();
    let extra = format!(
        "[ca]\nkek_file = \"{}\"\nrotation_interval = \"200ms\"\nroot_propagation = \"2s\"\n\
         [federation]\nbundle_endpoint_listen = \"127.0.0.1:0\"\nfetch_retry = \"1s\"\n",
        kek_path.display()
    );
    let start = || {
        Server::start(ServerOpts {
            database_url: Some(url.clone()),
            tokens: Some(tokens.jwks_json()),
            extra_toml: extra.clone(),
            ..ServerOpts::default()
        })
    };
    let (a, b) = tokio::join!(start(), start());

    let (partner, endpoint) = federate_with_partner(&a).await;
    // Both replicas see it (one database) and race a refresh of a newer document.
    endpoint.serve(&partner.document(6));
    let (ra, rb) = tokio::join!(refresh(&a, "partner.test"), refresh(&b, "partner.test"));
    for r in [&ra, &rb] {
        assert!(r.last_error.is_empty(), "a racing replica reported {r:?}");
        assert_eq!(held_sequence(r), 6, "{r:?}");
    }
    assert_eq!(
        relationship(&a, "partner.test").await.bundle_document,
        relationship(&b, "partner.test").await.bundle_document
    );

    // The own bundle endpoints: one sequence for one set of keys.
    let (sa, roots_a) = own_document(&a).await;
    let (sb, roots_b) = own_document(&b).await;
    assert_eq!((sa, &roots_a), (sb, &roots_b));
    // A new root, prepared through replica a: watch both endpoints until both serve it.
    let out = a.signetctl(&["ca", "prepare", "--root"]);
    assert!(out.status.success(), "{out:?}");
    let mut seen: Vec<(u64, Vec<String>)> = vec![(sa, roots_a.clone())];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let x = own_document(&a).await;
        let y = own_document(&b).await;
        let done = x.1.len() == 2 && y.1.len() == 2;
        seen.push(x);
        seen.push(y);
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new root never reached both: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Once the new keys were served, the old ones never come back (review finding 1: a
    // replica behind the rotation served its older keys under a newer sequence).
    let first_new = seen.iter().position(|x| x.1.len() == 2).unwrap();
    assert!(
        seen[first_new..].iter().all(|x| x.1.len() == 2),
        "older keys served after newer ones: {seen:?}"
    );
    for w in seen.windows(2) {
        assert!(w[1].0 >= w[0].0, "the sequence went down: {seen:?}");
        if w[1].0 == w[0].0 {
            assert_eq!(w[1].1, w[0].1, "one sequence, two sets of keys: {seen:?}");
        }
    }
    assert!(seen.last().unwrap().0 > sa);
}

/// The operator's commands against a real server (SQLite): a static relationship from a PEM
/// file, shown and listed; an entry federating with it (and one naming a domain without a
/// relationship, refused); the relationship kept from deletion while the entry stands; its
/// bundle replaced with a SPIFFE bundle document; a refresh of a static one refused; then
/// deleted. The same refusals for this server's own trust domain and an http:// endpoint.
#[tokio::test]
async fn signetctl_federation_manages_a_static_relationship() {
    let server = Server::start(ServerOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let partner = Partner::new();
    let pem = dir.path().join("partner.pem");
    std::fs::write(&pem, partner.root_cert.pem()).unwrap();
    let ok = |args: &[&str]| {
        let out = server.signetctl(args);
        assert!(
            out.status.success(),
            "signetctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let refused = |args: &[&str], want: &str| {
        let out = server.signetctl(args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "signetctl {args:?} succeeded");
        assert!(err.contains(want), "signetctl {args:?}: {err}");
    };
    let pem_arg = pem.to_str().unwrap();
    ok(&[
        "federation",
        "create",
        "--trust-domain",
        "partner.test",
        "--bundle-file",
        pem_arg,
    ]);
    let shown: serde_json::Value =
        serde_json::from_str(&ok(&["federation", "show", "partner.test", "--json"])).unwrap();
    assert_eq!(shown["profile"], "static", "{shown}");
    assert_eq!(
        shown["bundle_document"]["keys"].as_array().unwrap().len(),
        1,
        "{shown}"
    );
    let listed = ok(&["federation", "list", "--json"]);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    // Summaries only (review finding 3: whole documents outgrew the message); show has them.
    let summary: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    assert!(summary["bundle_document"].is_null(), "{summary}");
    refused(
        &[
            "federation",
            "create",
            "--trust-domain",
            "p.test.",
            "--bundle-file",
            pem_arg,
        ],
        "a label is empty",
    );
    refused(
        &[
            "federation",
            "create",
            "--trust-domain",
            "q.test",
            "--bundle-endpoint-url",
            "https://q.test/?token=s3cr3t",
            "--profile",
            "https_web",
        ],
        "query",
    );
    refused(
        &[
            "federation",
            "create",
            "--trust-domain",
            "partner.test",
            "--bundle-file",
            pem_arg,
        ],
        "exists",
    );
    refused(
        &[
            "federation",
            "create",
            "--trust-domain",
            &server.trust_domain,
            "--bundle-file",
            pem_arg,
        ],
        "own trust domain",
    );
    refused(
        &[
            "federation",
            "create",
            "--trust-domain",
            "web.test",
            "--bundle-endpoint-url",
            "http://web.test/",
            "--profile",
            "https_web",
        ],
        "https://",
    );

    // Entries: only with a relationship, and they keep it from deletion.
    let token = ok(&["token", "create", "--node-id", "n1"]);
    assert!(!token.trim().is_empty());
    let entry = |td: &str| {
        server.signetctl(&[
            "entry",
            "create",
            "--spiffe-id",
            &format!("spiffe://{}/fed", server.trust_domain),
            "--parent",
            "n1",
            "--selector",
            "unix:uid:1000",
            "--federates-with",
            td,
        ])
    };
    let out = entry("nowhere.test");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no federation relationship"),
        "{out:?}"
    );
    let out = entry("spiffe://partner.test");
    assert!(out.status.success(), "{out:?}");
    let entry_id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let entries = ok(&["entry", "list", "--json"]);
    assert!(
        entries.contains("\"federates_with\":[\"partner.test\"]"),
        "{entries}"
    );
    refused(
        &["federation", "delete", "partner.test"],
        "entries federate with",
    );

    // A static relationship: no refresh, but a new bundle (here a SPIFFE document).
    refused(&["federation", "refresh", "partner.test"], "static");
    let doc = dir.path().join("partner.json");
    std::fs::write(&doc, partner.document(9)).unwrap();
    ok(&[
        "federation",
        "set-bundle",
        "partner.test",
        "--bundle-file",
        doc.to_str().unwrap(),
    ]);
    let held: serde_json::Value =
        serde_json::from_str(&ok(&["federation", "show", "partner.test", "--bundle"])).unwrap();
    assert_eq!(held["spiffe_sequence"], 9, "{held}");
    assert_eq!(
        held["keys"].as_array().unwrap().len(),
        2,
        "the root and the JWT key"
    );

    ok(&["entry", "delete", &entry_id]);
    ok(&["federation", "delete", "partner.test"]);
    refused(
        &["federation", "show", "partner.test"],
        "no federation relationship",
    );
    let audit = ok(&["audit", "list", "--json"]);
    for kind in [
        "admin.federation_create",
        "admin.federation_set_bundle",
        "admin.federation_delete",
    ] {
        assert!(audit.contains(kind), "{kind} not audited: {audit}");
    }
}
