//! The SPIFFE bundle endpoint (`[federation]`): the trust bundle as a SPIFFE bundle, for other
//! trust domains to federate with (SPIFFE Trust Domain and Bundle, section 4; SPIFFE
//! Federation).
//!
//! `GET /` on `federation.bundle_endpoint_listen` (off unless set) answers a JWK set:
//!
//! ```json
//! {"keys":[{"use":"x509-svid","kty":"EC","crv":"P-256","x":"…","y":"…","x5c":["<base64 DER>"]}],
//!  "spiffe_sequence":1764590000,"spiffe_refresh_hint":300}
//! ```
//!
//! one key per root of [`BundleHandle::current`] (`x5c`: exactly that root, standard base64 of
//! its DER; `kty` and the key's parameters per RFC 7518 section 6: EC P-256/P-384, RSA, or
//! Ed25519 as `OKP`), then one `{"use":"jwt-svid","kid":…,"alg":…}` key per published JWT-SVID
//! signing key (prepared, active and retired: a validator knows a key before it signs). `spiffe_refresh_hint` is `federation.refresh_hint` in seconds. The
//! document is written by [`signet_pki::SpiffeBundle`], the one reader and writer of the format.
//! `spiffe_sequence` is the deployment's, kept in the database beside the hash of the keys it
//! was given to ([`crate::store::FederationStore::bundle_endpoint_sequence`]): the same as long
//! as the served roots and JWT keys are, and `max(previous + 1, now)` when they change, so it
//! increases across restarts and never goes down whichever replica a relying party reaches.
//! Without the database the endpoint answers 503 rather than guess a sequence.
//!
//! Served over HTTPS only. Profile `https_spiffe` (the default): Signet's own X509-SVID for
//! `spiffe://<trust domain>/signet/server` (the gRPC listener's certificate, renewed in place);
//! the relying party authenticates it with a bundle obtained out of band and checks that SPIFFE
//! ID. Profile `https_web`: a configured certificate chain and key (`web_cert_file`,
//! `web_key_file`), for Web PKI. Bounded like `http_listen` (the same listener code, see
//! [`signet_runtime::http`]): at most `limits.http_max_connections` connections and
//! `limits.http_max_connections_per_source` from one source (more are closed at once), the TLS
//! handshake within `limits.tls_handshake_timeout`, the request headers within
//! `limits.http_header_read_timeout`, idle connections closed after `limits.http_idle_timeout`,
//! no connection longer than `limits.http_connection_timeout`.

pub(crate) mod fetch;
pub(crate) mod relationships;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use signet_pki::{ParsedCert, SpiffeBundle};
use signet_runtime::http::{Handshake, HttpLimits, HttpListener, Refusal};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::bundle::{Bundle, BundleHandle};
use crate::clock::{Clock, unix};
use crate::config::{BundleEndpointProfile, Config};
use crate::metrics::Metrics;
use crate::tls::ServerCertResolver;

/// Why the bundle cannot be served as a SPIFFE bundle document.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("a root does not parse: {0}")]
    Root(#[source] signet_pki::cert::CertError),
    #[error(transparent)]
    Bundle(#[from] signet_pki::bundle::BundleError),
}

/// The SPIFFE bundle document of `bundle`'s roots ([`SpiffeBundle::to_json`]).
pub fn bundle_document(
    bundle: &Bundle,
    sequence: u64,
    refresh_hint: Duration,
) -> Result<serde_json::Value, DocumentError> {
    let x509_authorities = bundle
        .roots
        .iter()
        .map(|r| ParsedCert::from_der(r).map_err(DocumentError::Root))
        .collect::<Result<Vec<_>, _>>()?;
    let jwt_authorities = bundle
        .jwt_keys
        .iter()
        .map(|k| {
            let mut jwk = k.key.jwk("jwt-svid")?;
            // `SpiffeBundle` writes `use` and `kid` itself.
            jwk.remove("use");
            jwk.remove("kid");
            Ok(signet_pki::bundle::JwtAuthority {
                key_id: k.key.key_id().to_owned(),
                jwk,
            })
        })
        .collect::<Result<Vec<_>, DocumentError>>()?;
    Ok(SpiffeBundle {
        x509_authorities,
        jwt_authorities,
        sequence: Some(sequence),
        refresh_hint: Some(refresh_hint),
    }
    .to_json()?)
}

/// Why the endpoint cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Document(#[from] DocumentError),
    #[error("the bundle endpoint's sequence cannot be read or moved: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// The endpoint's state: the bundle it serves, and the store that keeps its sequence.
pub struct BundleEndpoint {
    bundle: BundleHandle,
    clock: Arc<dyn Clock>,
    refresh_hint: Duration,
    sequences: Arc<dyn crate::store::FederationStore>,
    /// When set, the keys served are the CA view's, with the slot generation they came from
    /// (one read, so the two agree); otherwise `bundle`'s, unordered.
    ca: Option<Arc<crate::ca::manager::CaManager>>,
}

impl std::fmt::Debug for BundleEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BundleEndpoint")
            .field("refresh_hint", &self.refresh_hint)
            .finish_non_exhaustive()
    }
}

impl BundleEndpoint {
    pub fn new(
        bundle: BundleHandle,
        clock: Arc<dyn Clock>,
        refresh_hint: Duration,
        sequences: Arc<dyn crate::store::FederationStore>,
    ) -> Self {
        Self {
            bundle,
            clock,
            refresh_hint,
            sequences,
            ca: None,
        }
    }

    /// Serves the CA view's keys with its slot generation (the server's endpoint).
    pub fn following(mut self, ca: Arc<crate::ca::manager::CaManager>) -> Self {
        self.ca = Some(ca);
        self
    }

    /// The document for the current bundle, with the deployment's sequence for its keys
    /// ([`crate::store::FederationStore::bundle_endpoint_sequence`]: the same as long as the keys
    /// are, a larger one when they change, whichever replica answers).
    pub async fn document(&self) -> Result<serde_json::Value, ServeError> {
        let (current, generation) = match &self.ca {
            Some(ca) => {
                let view = ca.view();
                let generation = (!view.plugged)
                    .then(|| i64::try_from(view.generation).ok())
                    .flatten();
                let mut b = (*self.bundle.current()).clone();
                b.roots = view.roots.clone();
                b.jwt_keys = view.jwt_keys.clone();
                (Arc::new(b), generation)
            }
            None => (self.bundle.current(), None),
        };
        let keys = bundle_document(&current, 0, self.refresh_hint)?;
        let mut keys_only = keys.clone();
        if let Some(o) = keys_only.as_object_mut() {
            o.remove("spiffe_sequence");
            o.remove("spiffe_refresh_hint");
        }
        let sha = hex::encode(ring::digest::digest(
            &ring::digest::SHA256,
            keys_only.to_string().as_bytes(),
        ));
        let mut doc = keys;
        if let Some(o) = doc.as_object_mut() {
            o.remove("spiffe_sequence");
        }
        let decided = self
            .sequences
            .bundle_endpoint_sequence(&sha, generation, &doc.to_string(), unix(self.clock.now()))
            .await?;
        if let Some(newer) = decided.newer_document {
            // This replica has not caught up with the deployment's keys yet: serve what the
            // deployment published (written by a replica of the same code, so it reads).
            match serde_json::from_str::<serde_json::Value>(&newer) {
                Ok(v) => doc = v,
                Err(e) => {
                    tracing::warn!(error = %e, "the stored bundle document does not read; serving this replica's")
                }
            }
        }
        if let Some(o) = doc.as_object_mut() {
            o.insert("spiffe_sequence".into(), decided.sequence.into());
        }
        Ok(doc)
    }
}

/// `GET /`: the SPIFFE bundle.
pub fn routes(endpoint: Arc<BundleEndpoint>) -> Router {
    Router::new()
        .route("/", get(serve_bundle))
        .with_state(endpoint)
}

async fn serve_bundle(State(ep): State<Arc<BundleEndpoint>>) -> impl IntoResponse {
    match ep.document().await {
        Ok(doc) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            doc.to_string(),
        ),
        Err(e @ ServeError::Store(_)) => {
            tracing::warn!(error = %e, "the SPIFFE bundle cannot be served now");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "the bundle's sequence cannot be read from the database; try again\n".to_owned(),
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "the SPIFFE bundle cannot be served");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "the bundle cannot be served as a SPIFFE bundle\n".to_owned(),
            )
        }
    }
}

/// The TLS configuration of the profile: the server's own SVID (`resolver`), or the configured
/// Web PKI certificate. HTTP/1.1, no client certificates.
pub fn tls_config(
    cfg: &Config,
    resolver: Arc<ServerCertResolver>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use anyhow::anyhow;
    let f = &cfg.federation;
    let resolver = match f.bundle_endpoint_profile {
        BundleEndpointProfile::HttpsSpiffe => resolver,
        BundleEndpointProfile::HttpsWeb => {
            let (Some(cert_file), Some(key_file)) = (&f.web_cert_file, &f.web_key_file) else {
                return Err(anyhow!(
                    "federation.bundle_endpoint_profile = \"https_web\" needs web_cert_file and web_key_file"
                ));
            };
            return web_tls_config(
                cert_file,
                key_file,
                "federation.web_cert_file",
                "federation.web_key_file",
            );
        }
    };
    http11_tls(resolver)
}

/// A TLS configuration serving the PEM certificate chain `cert_file` (leaf first) with the
/// PEM PKCS#8 key `key_file` (Web PKI): the bundle endpoint's `https_web` profile and the
/// OIDC discovery listener. `cert_key` and `key_key` name the settings in errors.
pub fn web_tls_config(
    cert_file: &std::path::Path,
    key_file: &std::path::Path,
    cert_key: &str,
    key_key: &str,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use anyhow::{Context, anyhow};
    let chain_pem =
        std::fs::read(cert_file).with_context(|| format!("reading {}", cert_file.display()))?;
    let chain =
        signet_types::pem::parse_certs(&chain_pem).map_err(|e| anyhow!("{cert_key}: {e}"))?;
    let key_pem =
        std::fs::read(key_file).with_context(|| format!("reading {}", key_file.display()))?;
    let (_, key) = signet_types::pem::parse_one(&key_pem, &["PRIVATE KEY"])
        .map_err(|e| anyhow!("{key_key} (PEM PKCS#8): {e}"))?;
    let certified =
        crate::tls::certified_key(&chain, &key).map_err(|e| anyhow!("{cert_key}: {e}"))?;
    // rustls would serve a mismatched pair and fail every handshake (review finding F6).
    certified.keys_match().map_err(|e| {
        anyhow!(
            "{key_key} ({}) is not the key of the first certificate in {cert_key} ({}): {e}",
            key_file.display(),
            cert_file.display()
        )
    })?;
    http11_tls(ServerCertResolver::new(certified))
}

/// Reads and checks the operator's Web PKI certificate files (`[jwt_svid] oidc_tls_*`,
/// `[federation] web_*`) before the server creates anything, so a mistake in them leaves no
/// data directory, key or database behind (review finding F10). The listeners read them again
/// when they bind.
pub fn check_web_tls_files(cfg: &Config) -> anyhow::Result<()> {
    let j = &cfg.jwt_svid;
    if let (Some(cert), Some(key)) = (&j.oidc_tls_cert_file, &j.oidc_tls_key_file) {
        web_tls_config(
            cert,
            key,
            "jwt_svid.oidc_tls_cert_file",
            "jwt_svid.oidc_tls_key_file",
        )?;
    }
    let f = &cfg.federation;
    if let (BundleEndpointProfile::HttpsWeb, Some(cert), Some(key)) =
        (f.bundle_endpoint_profile, &f.web_cert_file, &f.web_key_file)
    {
        web_tls_config(
            cert,
            key,
            "federation.web_cert_file",
            "federation.web_key_file",
        )?;
    }
    Ok(())
}

/// HTTP/1.1 over TLS, no client certificates.
fn http11_tls(resolver: Arc<ServerCertResolver>) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use anyhow::anyhow;
    let mut tls = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// The bounds of the bundle endpoint's listener: those of `http_listen` (`limits.http_*`),
/// and the TLS handshake within `limits.tls_handshake_timeout`.
#[derive(Debug, Clone, Copy)]
pub struct EndpointLimits {
    pub http: HttpLimits,
    pub handshake_timeout: Duration,
}

impl EndpointLimits {
    pub fn from_config(cfg: &Config) -> Self {
        Self {
            http: cfg.limits.http_limits(),
            handshake_timeout: cfg.limits.tls_handshake_timeout,
        }
    }
}

/// The bundle endpoint's TLS handshake, bounded in time.
#[derive(Clone)]
struct TlsHandshake {
    acceptor: TlsAcceptor,
    timeout: Duration,
}

impl Handshake for TlsHandshake {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;

    async fn handshake(&self, tcp: TcpStream) -> std::io::Result<Self::Io> {
        match tokio::time::timeout(self.timeout, self.acceptor.accept(tcp)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "TLS handshake not finished within limits.tls_handshake_timeout",
            )),
        }
    }
}

/// Serves `router` over TLS on `listener` within `limits` until `shutdown` resolves (see
/// [`signet_runtime::http::serve_with`]). Refused connections are counted as
/// `bundle_endpoint_connections` and `bundle_endpoint_connections_per_source`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    limits: EndpointLimits,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let names = TlsListenerNames {
        setting: "federation.bundle_endpoint_listen",
        listener_full: "bundle_endpoint_connections",
        source_full: "bundle_endpoint_connections_per_source",
    };
    serve_tls(names, listener, tls, router, limits, metrics, shutdown).await
}

/// What a TLS listener is called: its setting (in logs) and its two refusal counters
/// (`signet_limited_total{limit=…}`).
#[derive(Debug, Clone, Copy)]
pub struct TlsListenerNames {
    pub setting: &'static str,
    pub listener_full: &'static str,
    pub source_full: &'static str,
}

/// Serves `router` over TLS on `listener` within `limits` until `shutdown` resolves: the
/// bundle endpoint's listener, reused by the OIDC discovery listener (`crate::oidc`).
pub async fn serve_tls(
    names: TlsListenerNames,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    limits: EndpointLimits,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let handshake = TlsHandshake {
        acceptor: TlsAcceptor::from(tls),
        timeout: limits.handshake_timeout,
    };
    let l = HttpListener {
        name: names.setting,
        listener,
        limits: limits.http,
    };
    signet_runtime::http::serve_with(
        l,
        handshake,
        router,
        move |why| {
            metrics.limited(match why {
                Refusal::ListenerFull => names.listener_full,
                Refusal::SourceFull => names.source_full,
            })
        },
        shutdown,
    )
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::clock::fake::FakeClock;
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

    /// One root as a JWK (`use: x509-svid`), or why it cannot be one.
    fn root_jwk(der: &[u8]) -> Result<serde_json::Value, DocumentError> {
        let cert = ParsedCert::from_der(der).map_err(DocumentError::Root)?;
        Ok(signet_pki::bundle::x509_svid_jwk(&cert)?)
    }
    use signet_types::TrustDomain;
    use tower::ServiceExt;

    fn root(alg: &'static rcgen::SignatureAlgorithm) -> (Vec<u8>, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = p.self_signed(&key).unwrap();
        (cert.der().to_vec(), key)
    }

    /// A store for the endpoint's sequence (SQLite in `dir`).
    async fn sequence_store(dir: &tempfile::TempDir) -> Arc<dyn crate::store::FederationStore> {
        let url = signet_testutil::sqlite_url(&dir.path().join("db"));
        crate::store::connect(&url, Duration::from_secs(5))
            .await
            .unwrap()
    }

    async fn get(router: &Router) -> (StatusCode, serde_json::Value) {
        let resp = router
            .clone()
            .oneshot(
                axum::http::Request::get("/")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = resp.status();
        let ct = resp.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(ct, "application/json");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn the_document_is_a_spiffe_bundle_and_its_sequence_follows_the_roots() {
        let dir = tempfile::tempdir().unwrap();
        let (r1, k1) = root(&rcgen::PKCS_ECDSA_P256_SHA256);
        let handle = BundleHandle::new(
            Bundle {
                trust_domain: TrustDomain::new("example.org").unwrap(),
                roots: vec![r1.clone()],
                tainted_key_ids: Vec::new(),
                jwt_keys: Vec::new(),
                revision: 1,
                crls: Vec::new(),
            },
            dir.path().join("bundle.pem"),
        )
        .unwrap();
        let clock = Arc::new(FakeClock::at_unix(1_800_000_000));
        let ep = Arc::new(BundleEndpoint::new(
            handle.clone(),
            clock.clone(),
            Duration::from_secs(300),
            sequence_store(&dir).await,
        ));
        let router = routes(ep);

        let (status, doc) = get(&router).await;
        assert_eq!(status, StatusCode::OK);
        let obj = doc.as_object().unwrap();
        let mut members: Vec<&str> = obj.keys().map(String::as_str).collect();
        members.sort_unstable();
        assert_eq!(members, ["keys", "spiffe_refresh_hint", "spiffe_sequence"]);
        assert_eq!(doc["spiffe_refresh_hint"], 300);
        assert_eq!(doc["spiffe_sequence"], 1_800_000_000u64);
        let keys = doc["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1);
        let k = &keys[0];
        assert_eq!(k["use"], "x509-svid");
        assert_eq!(k["kty"], "EC");
        assert_eq!(k["crv"], "P-256");
        assert_eq!(STANDARD.decode(k["x5c"][0].as_str().unwrap()).unwrap(), r1);
        assert_eq!(k["x5c"].as_array().unwrap().len(), 1);
        // x and y are the root's public key point.
        let point = k1.public_key_raw();
        let x = URL_SAFE_NO_PAD.decode(k["x"].as_str().unwrap()).unwrap();
        let y = URL_SAFE_NO_PAD.decode(k["y"].as_str().unwrap()).unwrap();
        assert_eq!([&[4u8][..], &x, &y].concat(), point);

        // Unchanged roots: the same sequence, however much later.
        clock.advance(Duration::from_secs(3600));
        assert_eq!(get(&router).await.1["spiffe_sequence"], 1_800_000_000u64);

        // A root added (rotation): a larger sequence, both roots.
        let (r2, _) = root(&rcgen::PKCS_ECDSA_P384_SHA384);
        handle.update(vec![r1.clone(), r2.clone()]).unwrap();
        let (_, doc) = get(&router).await;
        assert_eq!(doc["spiffe_sequence"], 1_800_003_600u64);
        let keys = doc["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[1]["crv"], "P-384");
        // The old root removed in the same second: still larger.
        handle.update(vec![r2]).unwrap();
        let (_, doc) = get(&router).await;
        assert_eq!(doc["spiffe_sequence"], 1_800_003_601u64);
        assert_eq!(doc["keys"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn ed25519_roots_are_okp_keys() {
        let (r, key) = root(&rcgen::PKCS_ED25519);
        let jwk = root_jwk(&r).unwrap();
        assert_eq!(jwk["kty"], "OKP");
        assert_eq!(jwk["crv"], "Ed25519");
        assert_eq!(
            URL_SAFE_NO_PAD.decode(jwk["x"].as_str().unwrap()).unwrap(),
            key.public_key_raw()
        );
        assert!(root_jwk(b"not a certificate").is_err());
    }
    #[tokio::test]
    async fn jwt_keys_are_published_as_jwt_svid_jwks_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (r1, _) = root(&rcgen::PKCS_ECDSA_P256_SHA256);
        let key = signet_pki::key::generate(signet_pki::KeyAlgorithm::EcdsaP256).unwrap();
        let signer = signet_pki::jwt::JwtSigner::new(&key).unwrap();
        let published = crate::bundle::PublishedJwtKey {
            key: signer.public_key().clone(),
            not_after: std::time::UNIX_EPOCH + Duration::from_secs(1_900_000_000),
        };
        let handle = BundleHandle::new(
            Bundle {
                trust_domain: TrustDomain::new("example.org").unwrap(),
                roots: vec![r1.clone()],
                tainted_key_ids: Vec::new(),
                jwt_keys: vec![published.clone()],
                revision: 1,
                crls: Vec::new(),
            },
            dir.path().join("bundle.pem"),
        )
        .unwrap();
        // The PEM file holds the X.509 roots only.
        let pem = std::fs::read_to_string(dir.path().join("bundle.pem")).unwrap();
        assert_eq!(pem.matches("BEGIN CERTIFICATE").count(), 1);
        let clock = Arc::new(FakeClock::at_unix(1_800_000_000));
        let ep = Arc::new(BundleEndpoint::new(
            handle.clone(),
            clock.clone(),
            Duration::from_secs(300),
            sequence_store(&dir).await,
        ));
        let router = routes(ep);
        let (_, doc) = get(&router).await;
        let keys = doc["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 2);
        let j = &keys[1];
        assert_eq!(j["use"], "jwt-svid");
        assert_eq!(j["kid"], signer.key_id());
        assert_eq!(j["alg"], "ES256");
        assert_eq!(j["kty"], "EC");
        assert_eq!(j["crv"], "P-256");
        assert!(j.get("x5c").is_none());
        // Read back by the one reader of the format.
        let parsed = SpiffeBundle::parse(doc.to_string().as_bytes()).unwrap();
        assert_eq!(parsed.x509_authorities.len(), 1);
        assert_eq!(parsed.jwt_authorities.len(), 1);
        assert_eq!(parsed.jwt_authorities[0].key_id, signer.key_id());
        let mut expected = signer.public_key().jwk("jwt-svid").unwrap();
        expected.remove("use");
        expected.remove("kid");
        assert_eq!(parsed.jwt_authorities[0].jwk, expected);
        // The same keys: the same sequence; a JWT key added (roots unchanged): a new one.
        clock.advance(Duration::from_secs(10));
        assert_eq!(get(&router).await.1["spiffe_sequence"], 1_800_000_000u64);
        let key2 = signet_pki::key::generate(signet_pki::KeyAlgorithm::EcdsaP256).unwrap();
        let signer2 = signet_pki::jwt::JwtSigner::new(&key2).unwrap();
        let mut both = vec![published.clone()];
        both.push(crate::bundle::PublishedJwtKey {
            key: signer2.public_key().clone(),
            not_after: published.not_after,
        });
        handle
            .update_with(vec![r1.clone()], Vec::new(), both.clone())
            .unwrap();
        assert_eq!(handle.current().revision, 2);
        let (_, doc) = get(&router).await;
        assert_eq!(doc["spiffe_sequence"], 1_800_000_010u64);
        assert_eq!(doc["keys"].as_array().unwrap().len(), 3);
        // The native API's bundle carries them too: kid, alg, DER SPKI, notAfter.
        let pb = crate::api::native::bundle_to_proto(&handle.current());
        assert_eq!(pb.jwt_keys.len(), 2);
        assert_eq!(pb.jwt_keys[0].key_id, signer.key_id());
        assert_eq!(pb.jwt_keys[0].alg, "ES256");
        assert_eq!(pb.jwt_keys[0].public_key, signer.public_key().spki_der());
        assert_eq!(pb.jwt_keys[0].not_after, 1_900_000_000);
        assert_eq!(pb.roots, vec![r1]);
        // A taint alone moves the revision too.
        handle
            .update_with(
                handle.current().roots.clone(),
                vec![signer.key_id().to_owned()],
                both,
            )
            .unwrap();
        assert_eq!(handle.current().revision, 3);
        assert_eq!(
            crate::api::native::bundle_to_proto(&handle.current()).tainted_key_ids,
            vec![signer.key_id().to_owned()]
        );
    }
}
