//! Kubernetes workload attestation: from the caller's container (its cgroup, see
//! [`super::cgroup`]) to its pod (namespace, service account, labels), as SPIRE's `k8s`
//! workload attestor does.
//!
//! The pods come from the kubelet (`GET https://127.0.0.1:10250/pods`, authenticated with the
//! agent's service-account token, the kubelet's certificate verified against a configured CA,
//! or explicitly not verified) or from the API server (`GET /api/v1/pods?fieldSelector=
//! spec.nodeName=<node>`). The list is cached for a short time and fetched again on a miss
//! (at most once per `refresh_min_interval`). A caller is a pod's workload only when its
//! container is listed in that pod's statuses and is running.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use signet_runtime::clock::{Clock, SystemClock};
use tokio::time::Instant;

use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde::Deserialize;

use super::cgroup::ContainerRef;
use crate::config::{KubernetesAttestorConfig, PodSource};
use crate::kube_https::{KubeHttps, roots_from_pem};

/// What the attestor knows about a caller's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
    /// The static pod's hash, for a mirror pod (annotation `kubernetes.io/config.mirror`).
    mirror_uid: Option<String>,
    /// Container ID (without the `runtime://` prefix) and whether it is running.
    containers: Vec<(String, bool)>,
}

impl PodInfo {
    fn is_pod(&self, uid: &str) -> bool {
        self.uid == uid || self.mirror_uid.as_deref() == Some(uid)
    }

    fn running(&self, container_id: &str) -> Option<bool> {
        self.containers
            .iter()
            .find(|(id, _)| id == container_id)
            .map(|(_, running)| *running)
    }
}

/// Why the pod of a container could not be looked up (the kubelet or API server failed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Kubernetes workload attestation: {0}")]
pub struct K8sError(pub String);

/// Where pods come from: the real HTTPS client or, in tests, a fixed list.
#[async_trait::async_trait]
pub trait PodLister: Send + Sync {
    async fn list(&self) -> Result<Vec<PodInfo>, K8sError>;
}

/// The pod of a container, from a cached pod list.
pub struct K8sAttestor {
    lister: Arc<dyn PodLister>,
    cache_ttl: Duration,
    refresh_min_interval: Duration,
    cache: tokio::sync::Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    pods: Arc<Vec<PodInfo>>,
    fetched: Option<Instant>,
}

impl K8sAttestor {
    pub fn new(
        lister: Arc<dyn PodLister>,
        cache_ttl: Duration,
        refresh_min_interval: Duration,
    ) -> Self {
        Self {
            lister,
            cache_ttl,
            refresh_min_interval,
            cache: tokio::sync::Mutex::new(Cache::default()),
        }
    }

    pub fn from_config(cfg: &KubernetesAttestorConfig) -> Result<Self, K8sError> {
        let lister = HttpPodLister::new(cfg)?;
        Ok(Self::new(
            Arc::new(lister),
            cfg.pod_cache_ttl,
            cfg.refresh_min_interval,
        ))
    }

    /// The running pod that `container` belongs to, or `None`.
    pub async fn pod_of(&self, container: &ContainerRef) -> Result<Option<PodInfo>, K8sError> {
        let mut cache = self.cache.lock().await;
        let age = cache
            .fetched
            .map(|t| SystemClock.monotonic().saturating_duration_since(t));
        if age.is_some_and(|a| a < self.cache_ttl)
            && let Some(p) = find(&cache.pods, container)
        {
            return Ok(Some(p));
        }
        if age.is_some_and(|a| a < self.refresh_min_interval) {
            return Ok(find(&cache.pods, container));
        }
        let pods = self.lister.list().await?;
        cache.pods = Arc::new(pods);
        cache.fetched = Some(SystemClock.monotonic());
        Ok(find(&cache.pods, container))
    }
}

/// The pod `container` runs in: by pod UID when the cgroup names one, else by container ID;
/// the container must be in the pod's statuses and running, and the cgroup path under a
/// root-owned root (see [`super::cgroup`]).
fn find(pods: &[PodInfo], container: &ContainerRef) -> Option<PodInfo> {
    if !container.trusted {
        return None;
    }
    let cid = container.container_id.as_deref()?;
    pods.iter()
        .filter(|p| container.pod_uid.as_deref().is_none_or(|uid| p.is_pod(uid)))
        .find(|p| p.running(cid) == Some(true))
        .cloned()
}

// --- The PodList JSON (only the fields used) -------------------------------------------

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct Spec {
    #[serde(default, rename = "serviceAccountName")]
    service_account_name: String,
}

#[derive(Deserialize, Default)]
struct Status {
    #[serde(default, rename = "containerStatuses")]
    container_statuses: Vec<ContainerStatus>,
    #[serde(default, rename = "initContainerStatuses")]
    init_container_statuses: Vec<ContainerStatus>,
    #[serde(default, rename = "ephemeralContainerStatuses")]
    ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Deserialize)]
struct ContainerStatus {
    #[serde(default, rename = "containerID")]
    container_id: String,
    #[serde(default)]
    state: ContainerState,
}

#[derive(Deserialize, Default)]
struct ContainerState {
    running: Option<serde_json::Value>,
}

/// Parses a PodList (kubelet `/pods` or API server `/api/v1/pods`).
pub fn parse_pod_list(json: &[u8]) -> Result<Vec<PodInfo>, K8sError> {
    let list: PodList =
        serde_json::from_slice(json).map_err(|e| K8sError(format!("pod list: {e}")))?;
    Ok(list
        .items
        .into_iter()
        .map(|p| {
            let containers = p
                .status
                .container_statuses
                .iter()
                .chain(&p.status.init_container_statuses)
                .chain(&p.status.ephemeral_container_statuses)
                .filter_map(|c| {
                    let id = c.container_id.split_once("://").map(|(_, id)| id)?;
                    (!id.is_empty()).then(|| (id.to_ascii_lowercase(), c.state.running.is_some()))
                })
                .collect();
            // An empty serviceAccountName means "default".
            let sa = if p.spec.service_account_name.is_empty() {
                "default".to_owned()
            } else {
                p.spec.service_account_name
            };
            PodInfo {
                uid: p.metadata.uid,
                name: p.metadata.name,
                namespace: p.metadata.namespace,
                service_account: sa,
                mirror_uid: p
                    .metadata
                    .annotations
                    .get("kubernetes.io/config.mirror")
                    .cloned(),
                labels: p.metadata.labels,
                containers,
            }
        })
        .collect())
}

// --- HTTPS client -----------------------------------------------------------------------

/// Lists pods over HTTPS with the agent's service-account token (re-read on every request:
/// projected tokens rotate).
pub struct HttpPodLister {
    http: KubeHttps,
    path_and_query: String,
    timeout: Duration,
}

impl HttpPodLister {
    pub fn new(cfg: &KubernetesAttestorConfig) -> Result<Self, K8sError> {
        let err = |m: String| K8sError(m);
        let url: http::Uri = cfg
            .url()
            .parse()
            .map_err(|e| err(format!("url {:?}: {e}", cfg.url())))?;
        if url.scheme_str() != Some("https") {
            return Err(err(format!("url {:?} must be https://", cfg.url())));
        }
        let authority = url
            .authority()
            .ok_or_else(|| err(format!("url {:?} has no host", cfg.url())))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(443);
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let base = url.path().trim_end_matches('/');
        let path_and_query = match cfg.source {
            PodSource::Kubelet => format!("{base}/pods"),
            PodSource::ApiServer => {
                let node = cfg.node_name().ok_or_else(|| {
                    err(format!(
                        "source = \"api-server\" needs node_name or the environment variable {}",
                        cfg.node_name_env
                    ))
                })?;
                format!("{base}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
            }
        };
        let name = cfg.server_name.clone().unwrap_or_else(|| host.to_owned());
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| err(format!("server name {name:?}: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| err(e.to_string()))?;
        let tls = if cfg.skip_kubelet_verification {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyKubeletCertificate(
                    provider.signature_verification_algorithms,
                )))
                .with_no_client_auth()
        } else {
            let ca_file = cfg.ca_file.as_ref().ok_or_else(|| {
                err("ca_file is required (or, for the kubelet only, skip_kubelet_verification = true)".into())
            })?;
            let pem = std::fs::read(ca_file)
                .map_err(|e| err(format!("ca_file {}: {e}", ca_file.display())))?;
            let roots = roots_from_pem(&pem, &format!("ca_file {}", ca_file.display()))
                .map_err(|e| err(e.to_string()))?;
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        Ok(Self {
            http: KubeHttps::new(
                addr,
                server_name,
                Arc::new(tls),
                cfg.token_file.clone(),
                cfg.max_response_bytes,
            ),
            path_and_query,
            timeout: cfg.request_timeout,
        })
    }

    async fn fetch(&self) -> Result<Vec<u8>, K8sError> {
        let answer = self
            .http
            .send(http::Method::GET, &self.path_and_query, None, Vec::new())
            .await
            .map_err(|e| K8sError(e.to_string()))?;
        if !answer.status.is_success() {
            return Err(K8sError(format!(
                "GET {} answered {}",
                self.path_and_query, answer.status
            )));
        }
        Ok(answer.body)
    }
}

#[async_trait::async_trait]
impl PodLister for HttpPodLister {
    async fn list(&self) -> Result<Vec<PodInfo>, K8sError> {
        let body = tokio::time::timeout(self.timeout, self.fetch())
            .await
            .map_err(|_| {
                K8sError(format!(
                    "no pod list from {} in {:?}",
                    self.http.addr(),
                    self.timeout
                ))
            })??;
        parse_pod_list(&body)
    }
}

/// `skip_kubelet_verification = true`, for the kubelet only (the configuration refuses it
/// for the API server): any certificate the kubelet presents is accepted, as SPIRE's `k8s`
/// workload attestor does with the same setting. The kubelet's serving certificate on port
/// 10250 is, by default, self-signed by the kubelet at start (unless the cluster runs
/// `serverTLSBootstrap`), so there is no CA to verify it with; the connection goes to
/// `127.0.0.1` on the agent's own node. The handshake's signatures are still checked, so the
/// peer holds the key of the certificate it presented.
///
/// The agent's one "danger" verifier: private to this module, used only here, and never
/// shared with a test or another crate (the test suite's rogue servers build their own,
/// differently: `tests/src/rogue.rs`).
#[derive(Debug)]
struct AnyKubeletCertificate(rustls::crypto::WebPkiSupportedAlgorithms);

impl rustls::client::danger::ServerCertVerifier for AnyKubeletCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const CID_A: &str = "aaaa8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";
    const CID_DONE: &str = "dddd8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";
    const CID_B: &str = "bbbb8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";

    pub(crate) fn pod_list_json() -> String {
        serde_json::json!({
            "kind": "PodList", "apiVersion": "v1", "metadata": {},
            "items": [
                {
                    "metadata": {"name": "web-1", "namespace": "team-a", "uid": "11111111-2222-3333-4444-555555555555",
                                 "labels": {"app": "web"}},
                    "spec": {"serviceAccountName": "web", "nodeName": "n1"},
                    "status": {"phase": "Running",
                        "containerStatuses": [
                            {"name": "app", "containerID": format!("containerd://{CID_A}"),
                             "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}},
                            {"name": "done", "containerID": format!("containerd://{CID_DONE}"),
                             "state": {"terminated": {"exitCode": 0}}}
                        ],
                        "initContainerStatuses": [{"name": "init", "containerID": "containerd://", "state": {"waiting": {}}}]}
                },
                {
                    "metadata": {"name": "db-1", "namespace": "team-b", "uid": "99999999-2222-3333-4444-555555555555"},
                    "spec": {},
                    "status": {"containerStatuses": [
                        {"name": "db", "containerID": format!("cri-o://{CID_B}"), "state": {"running": {}}}]}
                }
            ]
        })
        .to_string()
    }

    #[test]
    fn pod_list_parsing() {
        let pods = parse_pod_list(pod_list_json().as_bytes()).expect("parses");
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].namespace, "team-a");
        assert_eq!(pods[0].service_account, "web");
        assert_eq!(pods[0].labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(pods[0].running(CID_A), Some(true));
        assert_eq!(pods[0].running(CID_DONE), Some(false));
        assert_eq!(pods[1].service_account, "default");
        assert!(parse_pod_list(b"{not json").is_err());
        assert!(parse_pod_list(b"{}").expect("empty").is_empty());
    }

    fn cref(pod: Option<&str>, cid: Option<&str>) -> ContainerRef {
        ContainerRef {
            pod_uid: pod.map(Into::into),
            container_id: cid.map(Into::into),
            trusted: true,
        }
    }

    #[test]
    fn the_container_must_be_in_that_pod_and_running() {
        let pods = parse_pod_list(pod_list_json().as_bytes()).expect("parses");
        let a = "11111111-2222-3333-4444-555555555555";
        let b = "99999999-2222-3333-4444-555555555555";
        assert_eq!(
            find(&pods, &cref(Some(a), Some(CID_A))).expect("a").name,
            "web-1"
        );
        // By container ID alone (a CRI-O cgroup without the pod UID).
        assert_eq!(
            find(&pods, &cref(None, Some(CID_B))).expect("b").name,
            "db-1"
        );
        // B's container claimed for pod A: no.
        assert_eq!(find(&pods, &cref(Some(a), Some(CID_B))), None);
        // Pod B's UID with A's container: no.
        assert_eq!(find(&pods, &cref(Some(b), Some(CID_A))), None);
        // A terminated container, an unknown one, none at all.
        assert_eq!(find(&pods, &cref(Some(a), Some(CID_DONE))), None);
        assert_eq!(find(&pods, &cref(Some(a), Some(&"e".repeat(64)))), None);
        assert_eq!(find(&pods, &cref(Some(a), None)), None);
        // A container ID from a cgroup a user could have named: never looked up.
        let untrusted = ContainerRef {
            trusted: false,
            ..cref(None, Some(CID_A))
        };
        assert_eq!(find(&pods, &untrusted), None);
    }

    #[test]
    fn a_static_pod_is_found_by_its_hash_through_the_mirror_annotation() {
        let hash = "6a0b2c9e3f1d4e5a8b7c6d5e4f3a2b1c";
        let json = serde_json::json!({"items": [{
            "metadata": {"name": "etcd-n1", "namespace": "kube-system",
                         "uid": "11111111-2222-3333-4444-000000000000",
                         "annotations": {"kubernetes.io/config.mirror": hash}},
            "status": {"containerStatuses": [{"containerID": format!("containerd://{CID_A}"),
                                              "state": {"running": {}}}]}
        }]});
        let pods = parse_pod_list(json.to_string().as_bytes()).expect("parses");
        assert_eq!(
            find(&pods, &cref(Some(hash), Some(CID_A)))
                .expect("mirror")
                .name,
            "etcd-n1"
        );
    }

    struct Counting {
        calls: AtomicUsize,
        pods: std::sync::Mutex<Vec<PodInfo>>,
    }

    #[async_trait::async_trait]
    impl PodLister for Counting {
        async fn list(&self) -> Result<Vec<PodInfo>, K8sError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(self.pods.lock().expect("lock").clone())
        }
    }

    #[tokio::test]
    async fn cache_serves_hits_and_refreshes_on_a_miss() {
        let pods = parse_pod_list(pod_list_json().as_bytes()).expect("parses");
        let lister = Arc::new(Counting {
            calls: AtomicUsize::new(0),
            pods: std::sync::Mutex::new(vec![pods[0].clone()]),
        });
        let k = K8sAttestor::new(lister.clone(), Duration::from_secs(60), Duration::ZERO);
        let a = cref(None, Some(CID_A));
        let b = cref(None, Some(CID_B));
        assert!(k.pod_of(&a).await.expect("ok").is_some());
        assert!(k.pod_of(&a).await.expect("ok").is_some());
        assert_eq!(lister.calls.load(Ordering::SeqCst), 1, "a hit is cached");
        // B's pod appears: the miss refreshes.
        assert!(k.pod_of(&b).await.expect("ok").is_none());
        *lister.pods.lock().expect("lock") = pods.clone();
        assert!(k.pod_of(&b).await.expect("ok").is_some());
        assert_eq!(lister.calls.load(Ordering::SeqCst), 3);
        // With a minimum refresh interval, misses do not hammer the kubelet.
        let k = K8sAttestor::new(
            lister.clone(),
            Duration::from_secs(60),
            Duration::from_secs(60),
        );
        assert!(
            k.pod_of(&cref(None, Some(CID_DONE)))
                .await
                .expect("ok")
                .is_none()
        );
        assert!(
            k.pod_of(&cref(None, Some(CID_DONE)))
                .await
                .expect("ok")
                .is_none()
        );
        assert_eq!(lister.calls.load(Ordering::SeqCst), 4);
    }

    /// A TLS server on 127.0.0.1 answering every request with `body` when it carries the
    /// bearer token `good`, 401 otherwise; it records each request line. Returns its URL and
    /// its CA's PEM.
    async fn https_server(body: String) -> (String, String, Arc<std::sync::Mutex<Vec<String>>>) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("key");
        let mut leaf = CertificateParams::new(Vec::<String>::new()).expect("params");
        leaf.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
        let cert = leaf.signed_by(&key, &issuer).expect("leaf");
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("cert");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    continue;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 512];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                log.lock()
                    .expect("lock")
                    .push(head.lines().next().unwrap_or_default().to_owned());
                let ok = head.contains("authorization: Bearer good\r\n");
                let (status, b) = if ok {
                    ("200 OK", body.clone())
                } else {
                    ("401 Unauthorized", String::new())
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                    b.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            }
        });
        (url, ca_cert.pem(), seen)
    }

    #[tokio::test]
    async fn the_kubelet_is_verified_and_authenticated_to() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (url, ca_pem, seen) = https_server(pod_list_json()).await;
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &ca_pem).expect("ca");
        let token = dir.path().join("token");
        std::fs::write(&token, "good\n").expect("token");
        let cfg = KubernetesAttestorConfig {
            enabled: true,
            url: Some(url.clone()),
            ca_file: Some(ca_file.clone()),
            token_file: token.clone(),
            ..KubernetesAttestorConfig::default()
        };
        let pods = HttpPodLister::new(&cfg)
            .expect("lister")
            .list()
            .await
            .expect("pods");
        assert_eq!(pods.len(), 2);

        // Another CA: the kubelet's certificate is refused.
        let (_, other_ca, _) = https_server(String::new()).await;
        std::fs::write(&ca_file, other_ca).expect("ca");
        let err = HttpPodLister::new(&cfg)
            .expect("lister")
            .list()
            .await
            .expect_err("untrusted");
        assert!(err.0.contains("TLS"), "{err}");
        // Unless verification is skipped, explicitly.
        let skip = KubernetesAttestorConfig {
            skip_kubelet_verification: true,
            ca_file: None,
            ..cfg.clone()
        };
        assert_eq!(
            HttpPodLister::new(&skip)
                .expect("lister")
                .list()
                .await
                .expect("pods")
                .len(),
            2
        );
        // No CA and no skip: a configuration error, not an open door.
        let none = KubernetesAttestorConfig {
            ca_file: None,
            ..cfg.clone()
        };
        assert!(HttpPodLister::new(&none).is_err());
        // A wrong token: the kubelet's 401 is an error, never an empty pod list.
        std::fs::write(&token, "bad").expect("token");
        let err = HttpPodLister::new(&skip)
            .expect("lister")
            .list()
            .await
            .expect_err("401");
        assert!(err.0.contains("401"), "{err}");
        assert!(!err.0.contains("bad"), "the token is not in errors: {err}");
        // http:// is refused.
        let plain = KubernetesAttestorConfig {
            url: Some("http://127.0.0.1:10255".into()),
            ..skip.clone()
        };
        assert!(HttpPodLister::new(&plain).is_err());

        // The API server source asks for this node's pods.
        std::fs::write(&token, "good").expect("token");
        let api = KubernetesAttestorConfig {
            source: PodSource::ApiServer,
            skip_kubelet_verification: false,
            ca_file: Some(dir.path().join("ca2.pem")),
            node_name: Some("node-1".into()),
            ..cfg.clone()
        };
        std::fs::write(dir.path().join("ca2.pem"), &ca_pem).expect("ca");
        assert_eq!(
            HttpPodLister::new(&api)
                .expect("lister")
                .list()
                .await
                .expect("pods")
                .len(),
            2
        );
        let lines = seen.lock().expect("lock").clone();
        assert_eq!(
            lines.first().map(String::as_str),
            Some("GET /pods HTTP/1.1")
        );
        assert_eq!(
            lines.last().map(String::as_str),
            Some("GET /api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1 HTTP/1.1")
        );
    }
}
