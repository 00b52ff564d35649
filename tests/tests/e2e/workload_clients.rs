//! Independent SPIFFE Workload API clients against the real `signet-agent` and `signet-server`
//! (PostgreSQL):
//!
//! - py-spiffe (PyPI `spiffe`, installed by scripts/test into target/pytools, found through
//!   `SIGNET_PYTHON`) runs `tests/py/fetch_svid.py`, which fetches the X509-SVID and the
//!   bundles; openssl verifies the chain against the server's bundle. gRPC's C core, under
//!   py-spiffe, sends the percent-encoded socket path as the HTTP/2 `:authority` on a Unix
//!   socket, which upstream h2 refuses with RST_STREAM(PROTOCOL_ERROR); the workspace patches
//!   h2 to serve such requests (vendor/h2/SIGNET-PATCH.md). py-spiffe runs unchanged, and
//!   also with `:authority` `localhost` (the gRPC channel option `grpc.default_authority`, as
//!   go-spiffe sends).
//! - Two identities, told apart by their selectors, fetched with the Rust `spiffe` crate,
//!   authenticate each other in a real TLS 1.3 connection (tokio-rustls) that checks the chain
//!   against the fetched bundle and the peer's SPIFFE ID on both sides; a certificate from
//!   another trust domain, and one of this trust domain with the wrong SPIFFE ID, are refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use signet_tests::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::agent::{Agent, create_entry, create_token, eventually, write_config};
use crate::pg_server;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/fetch_svid.py");

/// The Python with py-spiffe; in CI its absence fails the test, locally it skips it loudly.
pub(crate) fn python() -> Option<PathBuf> {
    match std::env::var_os("SIGNET_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("SIGNET_PYTHON is not set: CI requires py-spiffe (scripts/test installs it)")
        }
        None => {
            eprintln!(
                "SKIPPED: set SIGNET_PYTHON to a Python with py-spiffe (PyPI: spiffe) or run \
                 scripts/test"
            );
            None
        }
    }
}

/// The `:authority` py-spiffe's gRPC sends: `localhost`, as grpc-go and tonic clients do,
/// instead of gRPC C-core's percent-encoded socket path that h2 refuses (see the module doc).
const AUTHORITY: Option<&str> = Some("localhost");

/// Runs the py-spiffe script against the agent's socket (with `authority` as the HTTP/2
/// `:authority`, or gRPC's default); its JSON output, or its error.
pub(crate) fn py_fetch(
    python: &Path,
    socket: &Path,
    authority: Option<&str>,
) -> Result<serde_json::Value, String> {
    let mut cmd = std::process::Command::new(python);
    cmd.arg(SCRIPT)
        .env(
            "SPIFFE_ENDPOINT_SOCKET",
            format!("unix://{}", socket.display()),
        )
        .env_remove("SIGNET_GRPC_DEFAULT_AUTHORITY");
    if let Some(a) = authority {
        cmd.env("SIGNET_GRPC_DEFAULT_AUTHORITY", a);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("output is not JSON: {e}"))
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// DER certificates of PEM texts, sorted, for comparing sets of roots.
fn ders(pems: &[String]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = pems
        .iter()
        .flat_map(|p| signet_types::pem::parse_certs(p.as_bytes()).unwrap())
        .collect();
    out.sort();
    out
}

fn server_roots(server: &Server) -> Vec<Vec<u8>> {
    let mut roots = signet_types::pem::parse_certs(&server.bundle_pem).unwrap();
    roots.sort();
    roots
}

#[tokio::test]
async fn py_spiffe_fetches_the_svid_and_bundle_from_the_agent() {
    py_spiffe_fetch_and_check(AUTHORITY).await;
}

#[tokio::test]
async fn unchanged_py_spiffe_fetches_the_svid_from_the_agent() {
    py_spiffe_fetch_and_check(None).await;
}

async fn py_spiffe_fetch_and_check(authority: Option<&str>) {
    let Some(python) = python() else { return };
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/py-app";
    let token = create_token(&server, "vm-py");
    create_entry(&server, app, "vm-py", &[]);
    let l = write_config(&server, &token, app);
    let agent = Agent::start(&l.config);

    // Until the agent has the identity, py-spiffe reports the agent's PermissionDenied.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let out = loop {
        match py_fetch(&python, &l.socket, authority) {
            Ok(v) => break v,
            Err(e) if std::time::Instant::now() > deadline => panic!("py-spiffe: {e}"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    };

    let svids = out["svids"].as_array().unwrap();
    assert_eq!(svids.len(), 1, "{out}");
    assert_eq!(svids[0]["spiffe_id"], app);
    assert_eq!(svids[0]["key_matches_leaf"], true, "the key is the leaf's");
    let chain = strings(&svids[0]["chain_pem"]);
    assert_eq!(uri_sans(&chain[0]), [app]);
    let mut full = chain.clone();
    full.push(String::from_utf8(server.bundle_pem.clone()).unwrap());
    openssl_verify(&full, &server.bundle_pem).unwrap();

    // The bundle, both as FetchX509SVID carries it and from FetchX509Bundles, is the
    // server's roots, keyed by the trust domain.
    for key in ["svid_bundles", "bundles"] {
        let by_td = out[key].as_object().unwrap();
        assert_eq!(by_td.len(), 1, "{key}: {out}");
        let roots = strings(&by_td["example.org"]);
        assert_eq!(ders(&roots), server_roots(&server), "{key}");
    }
    agent.stop().await;
}

// --- SPIFFE mTLS ------------------------------------------------------------------------

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts a peer whose chain leads to one of `roots` and whose only URI SAN is `expected`:
/// what a SPIFFE-aware TLS library does in place of host-name checks.
#[derive(Debug)]
struct SpiffePeer {
    roots: Vec<CertificateDer<'static>>,
    expected: String,
    provider: Arc<CryptoProvider>,
}

fn invalid(e: webpki::Error) -> rustls::Error {
    use rustls::CertificateError as C;
    rustls::Error::InvalidCertificate(match e {
        webpki::Error::UnknownIssuer => C::UnknownIssuer,
        webpki::Error::CertExpired { .. } => C::Expired,
        webpki::Error::InvalidSignatureForPublicKey => C::BadSignature,
        other => C::Other(rustls::OtherError(Arc::new(other))),
    })
}

impl SpiffePeer {
    fn new(roots: &[Vec<u8>], expected: &str) -> Arc<Self> {
        Arc::new(Self {
            roots: roots
                .iter()
                .map(|r| CertificateDer::from(r.clone()))
                .collect(),
            expected: expected.to_owned(),
            provider: provider(),
        })
    }

    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
        usage: webpki::KeyUsage,
    ) -> Result<(), rustls::Error> {
        let anchors = self
            .roots
            .iter()
            .map(|r| webpki::anchor_from_trusted_cert(r).map_err(invalid))
            .collect::<Result<Vec<_>, _>>()?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(invalid)?;
        cert.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            intermediates,
            now,
            usage,
            None,
            None,
        )
        .map_err(invalid)?;
        let uris: Vec<&str> = cert.valid_uri_names().collect();
        if uris != [self.expected.as_str()] {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ));
        }
        Ok(())
    }
}

impl ServerCertVerifier for SpiffePeer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(
            end_entity,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl ClientCertVerifier for SpiffePeer {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(
            end_entity,
            intermediates,
            now,
            webpki::KeyUsage::client_auth(),
        )?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ServerCertVerifier::verify_tls12_signature(self, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ServerCertVerifier::verify_tls13_signature(self, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        ServerCertVerifier::supported_verify_schemes(self)
    }
}

/// A certificate chain (leaf first) and its PKCS#8 key.
#[derive(Clone)]
struct Credential {
    chain: Vec<Vec<u8>>,
    key_pkcs8: Vec<u8>,
}

impl Credential {
    fn of(svid: &spiffe::X509Svid) -> Self {
        Self {
            chain: svid
                .cert_chain()
                .iter()
                .map(|c| c.as_ref().to_vec())
                .collect(),
            key_pkcs8: svid.private_key().as_ref().to_vec(),
        }
    }

    fn certs(&self) -> Vec<CertificateDer<'static>> {
        self.chain
            .iter()
            .map(|c| CertificateDer::from(c.clone()))
            .collect()
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_pkcs8.clone()))
    }
}

fn server_config(me: &Credential, peer: Arc<SpiffePeer>) -> Arc<rustls::ServerConfig> {
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(peer)
        .with_single_cert(me.certs(), me.key())
        .unwrap();
    Arc::new(cfg)
}

fn client_config(me: &Credential, peer: Arc<SpiffePeer>) -> Arc<rustls::ClientConfig> {
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(peer)
        .with_client_auth_cert(me.certs(), me.key())
        .unwrap();
    Arc::new(cfg)
}

/// The only URI SAN of a DER certificate.
fn uri_of(der: &[u8]) -> String {
    let pem = signet_types::pem::cert_to_pem(der);
    let mut uris = uri_sans(&pem);
    assert_eq!(uris.len(), 1, "{uris:?}");
    uris.remove(0)
}

/// What each side of one connection saw.
struct Exchange {
    /// Server: the client's SPIFFE ID and the line it received, or the handshake error.
    server: Result<(String, String), String>,
    /// Client: the server's SPIFFE ID and its answer, or the error.
    client: Result<(String, String), String>,
}

/// One TLS 1.3 connection on loopback: the client sends a line, the server answers with
/// another naming both peers.
async fn exchange(
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
) -> Exchange {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let server_side = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
        let (_, conn) = tls.get_ref();
        assert_eq!(
            conn.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        let peer = uri_of(conn.peer_certificates().ok_or("no client certificate")?[0].as_ref());
        let (r, mut w) = tokio::io::split(tls);
        let mut line = String::new();
        BufReader::new(r)
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?;
        w.write_all(format!("pong to {peer}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        w.shutdown().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((peer, line.trim_end().to_owned()))
    });
    let client_side = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        // The name is not checked: the SPIFFE ID is.
        let name = ServerName::try_from("signet.test").unwrap();
        let tls = tokio_rustls::TlsConnector::from(client)
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let (_, conn) = tls.get_ref();
        let peer = uri_of(conn.peer_certificates().ok_or("no server certificate")?[0].as_ref());
        let (r, mut w) = tokio::io::split(tls);
        w.write_all(b"ping\n").await.map_err(|e| e.to_string())?;
        let mut answer = String::new();
        // In TLS 1.3 a refused client certificate shows as an alert on the first read.
        let n = BufReader::new(r)
            .read_line(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed without an answer".to_owned());
        }
        Ok((peer, answer.trim_end().to_owned()))
    };
    let client = tokio::time::timeout(std::time::Duration::from_secs(10), client_side)
        .await
        .unwrap_or_else(|_| Err("client timed out".into()));
    let server = tokio::time::timeout(std::time::Duration::from_secs(10), server_side)
        .await
        .map(|j| j.unwrap())
        .unwrap_or_else(|_| Err("server timed out".into()));
    Exchange { server, client }
}

/// A CA of another trust domain (rcgen) and a leaf it issues for `id`, with the same key
/// usages as a Signet SVID.
fn foreign_credential(id: &str) -> (Credential, Vec<u8>) {
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut leaf = rcgen::CertificateParams::default();
    leaf.subject_alt_names = vec![rcgen::SanType::URI(id.try_into().unwrap())];
    leaf.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (
        Credential {
            chain: vec![cert.der().to_vec()],
            key_pkcs8: key.serialize_der(),
        },
        ca_cert.der().to_vec(),
    )
}

#[tokio::test]
async fn two_fetched_identities_authenticate_each_other_in_mutual_tls() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let client_id = "spiffe://example.org/tls-client";
    let server_id = "spiffe://example.org/tls-server";
    let token = create_token(&server, "vm-tls");
    // Both entries are for this uid; the server identity also requires this executable, so
    // another program run by the same user (py-spiffe's Python, below) gets only the first.
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let path_selector = format!("unix:path:{}", exe.display());
    create_entry(&server, client_id, "vm-tls", &[]);
    create_entry(
        &server,
        server_id,
        "vm-tls",
        &["--selector", &path_selector],
    );
    let l = write_config(&server, &token, client_id);
    let agent = Agent::start(&l.config);

    let endpoint = format!("unix:{}", l.socket.display());
    let ctx = eventually(40, "both SVIDs from the Workload API", || async {
        let c = spiffe::WorkloadApiClient::connect_to(&endpoint)
            .await
            .ok()?;
        let ctx = c.fetch_x509_context().await.ok()?;
        (ctx.svids().len() == 2).then_some(ctx)
    })
    .await;
    let find = |id: &str| {
        let svid = ctx
            .svids()
            .iter()
            .find(|s| s.spiffe_id().to_string() == id)
            .unwrap_or_else(|| panic!("no SVID for {id}"));
        Credential::of(svid)
    };
    let (client_cred, server_cred) = (find(client_id), find(server_id));
    let c = spiffe::WorkloadApiClient::connect_to(&endpoint)
        .await
        .unwrap();
    let bundles = c.fetch_x509_bundles().await.unwrap();
    let td = spiffe::TrustDomain::new("example.org").unwrap();
    let mut roots: Vec<Vec<u8>> = bundles
        .get(&td)
        .expect("a bundle for example.org")
        .authorities()
        .iter()
        .map(|a| a.as_ref().to_vec())
        .collect();
    roots.sort();
    assert_eq!(roots, server_roots(&server));
    if let Some(python) = python() {
        // Selectors tell the two programs apart.
        let out = py_fetch(&python, &l.socket, AUTHORITY).unwrap();
        let ids: Vec<&str> = out["svids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["spiffe_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [client_id], "{out}");
    }

    // Each side requires the other's SPIFFE ID; data round-trips over TLS 1.3.
    let ok = exchange(
        server_config(&server_cred, SpiffePeer::new(&roots, client_id)),
        client_config(&client_cred, SpiffePeer::new(&roots, server_id)),
    )
    .await;
    assert_eq!(
        ok.server.unwrap(),
        (client_id.to_owned(), "ping".to_owned())
    );
    assert_eq!(
        ok.client.unwrap(),
        (server_id.to_owned(), format!("pong to {client_id}"))
    );

    // A certificate from another trust domain is refused by the handshake, even for the
    // expected path and even though its own CA signed it properly.
    let (foreign, foreign_root) = foreign_credential("spiffe://other.org/tls-client");
    let r = exchange(
        server_config(&server_cred, SpiffePeer::new(&roots, client_id)),
        client_config(&foreign, SpiffePeer::new(&roots, server_id)),
    )
    .await;
    let err = r.server.expect_err("foreign client refused");
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(r.client.is_err(), "the client gets no answer");
    // The same foreign identity as a server: the client refuses it.
    let r = exchange(
        server_config(&foreign, SpiffePeer::new(&roots, client_id)),
        client_config(&client_cred, SpiffePeer::new(&roots, server_id)),
    )
    .await;
    let err = r.client.expect_err("foreign server refused");
    assert!(err.contains("UnknownIssuer"), "{err}");
    // Trusting the foreign root does not help a peer with the wrong SPIFFE ID.
    let mut both = roots.clone();
    both.push(foreign_root);
    let r = exchange(
        server_config(&server_cred, SpiffePeer::new(&both, client_id)),
        client_config(&foreign, SpiffePeer::new(&both, server_id)),
    )
    .await;
    assert!(r.server.is_err(), "wrong SPIFFE ID refused");

    // Our own trust domain, the wrong identity: the server identity is not a client.
    let r = exchange(
        server_config(&server_cred, SpiffePeer::new(&roots, client_id)),
        client_config(&server_cred, SpiffePeer::new(&roots, server_id)),
    )
    .await;
    let err = r.server.expect_err("wrong SPIFFE ID refused");
    assert!(err.contains("ApplicationVerificationFailure"), "{err}");
    agent.stop().await;
}
