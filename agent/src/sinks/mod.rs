//! Sinks: where an identity's SVID is delivered besides the Workload API. One small trait,
//! implementations registered by name (`files`, `kubernetes-secret`) in a [`Registry`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use signet_pki::X509Svid;
use signet_types::SpiffeId;

use crate::config::{SinkConfig, SinkKind};
use crate::state::{Ders, FederatedBundle};
use signet_runtime::clock::{Clock, SystemClock};

pub mod apiserver;
pub mod files;
pub mod health;
pub mod kubernetes;
pub mod reload;
pub mod safe_dir;
pub mod telemetry;
pub mod worker;

/// What a sink delivers: an X509-SVID (chain leaf first, roots left out, and its key), the
/// trust bundle and the CRLs. `Debug` hides the key. All three are shared with the rotator
/// and the Workload API state (`Arc`s); the PEM a sink writes is made when it writes.
///
/// **Its equality is the sinks' "already delivered" test** ([`worker::SinkSet::update`]
/// hands a sink a new delivery exactly when the new value differs from the last one): every
/// sink writes only what is in here, and the equality, derived, compares every field, so a
/// change of any part (the CRLs alone, the bundle alone) is a delivery, and a field added
/// here takes part without anyone remembering to add it.
#[derive(Clone, PartialEq, Eq)]
pub struct Delivered {
    pub svid: Arc<X509Svid>,
    /// DER roots.
    pub bundle_der: Ders,
    /// DER CRLs of the issuing CAs (verified; may be empty).
    pub crls_der: Ders,
    /// The foreign trust domains' bundles this SPIFFE ID's entries federate with (sorted by
    /// trust domain; empty when it does not federate).
    pub federated: Vec<FederatedBundle>,
}

impl fmt::Debug for Delivered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivered")
            .field("svid", &self.svid)
            .field("bundle_len", &self.bundle_der.len())
            .field("crls", &self.crls_der.len())
            .field(
                "federated",
                &self
                    .federated
                    .iter()
                    .map(|b| b.trust_domain.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Delivered {
    pub fn spiffe_id(&self) -> &SpiffeId {
        self.svid.spiffe_id()
    }
    pub fn chain_der(&self) -> &[Vec<u8>] {
        self.svid.certificate().chain_der()
    }
    pub fn chain_pem(&self) -> String {
        self.svid.certificate().chain_pem()
    }
    pub fn bundle_pem(&self) -> String {
        signet_types::pem::certs_to_pem(self.bundle_der.iter().map(Vec::as_slice))
    }
    /// The roots of each federated trust domain as PEM, by trust domain (sorted).
    pub fn federated_pems(&self) -> impl Iterator<Item = (&str, String)> {
        self.federated.iter().map(|b| {
            (
                b.trust_domain.as_str(),
                signet_types::pem::certs_to_pem(b.roots_der.iter().map(Vec::as_slice)),
            )
        })
    }
    /// The CRLs as PEM `X509 CRL` blocks (empty when there are none).
    pub fn crls_pem(&self) -> String {
        crls_to_pem(&self.crls_der)
    }
    /// The key as PEM `PRIVATE KEY` (PKCS#8; CRLF line endings, as the sinks have always
    /// written it). Never log it.
    pub fn key_pem(&self) -> String {
        pem::encode(&pem::Pem::new(
            "PRIVATE KEY",
            self.svid.key().pkcs8_der().to_vec(),
        ))
    }
}

/// DER CRLs as concatenated PEM `X509 CRL` blocks (LF line endings).
pub fn crls_to_pem(ders: &[Vec<u8>]) -> String {
    ders.iter()
        .map(|d| {
            pem::encode_config(
                &pem::Pem::new("X509 CRL", d.clone()),
                pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
            )
        })
        .collect()
}

/// Why a sink operation did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkErrorKind {
    /// It failed (I/O error, the API server refused or was unreachable); retried.
    Failed,
    /// Refused for safety, nothing written: a directory others can write, a link the agent
    /// did not create, a Secret the agent does not own, a process that is not the owner's.
    Refused,
    /// It did not finish before its deadline and was abandoned (a reload command is killed).
    Timeout,
}

impl SinkErrorKind {
    pub const ALL: [SinkErrorKind; 3] = [
        SinkErrorKind::Failed,
        SinkErrorKind::Refused,
        SinkErrorKind::Timeout,
    ];

    /// The `reason` label of the failure metric.
    pub fn label(self) -> &'static str {
        match self {
            SinkErrorKind::Failed => "error",
            SinkErrorKind::Refused => "refused",
            SinkErrorKind::Timeout => "timeout",
        }
    }
}

/// A sink failure. The message names the sink and never contains key material.
#[derive(Debug, thiserror::Error)]
#[error("sink {sink:?}: {reason}")]
pub struct SinkError {
    pub sink: String,
    pub reason: String,
    pub kind: SinkErrorKind,
}

impl SinkError {
    pub fn new(sink: &str, reason: impl Into<String>) -> Self {
        Self {
            sink: sink.to_owned(),
            reason: reason.into(),
            kind: SinkErrorKind::Failed,
        }
    }

    /// Refused for safety (see [`SinkErrorKind::Refused`]).
    pub fn refused(sink: &str, reason: impl Into<String>) -> Self {
        Self {
            kind: SinkErrorKind::Refused,
            ..Self::new(sink, reason)
        }
    }

    /// Ran past its deadline.
    pub fn timeout(sink: &str, reason: impl Into<String>) -> Self {
        Self {
            kind: SinkErrorKind::Timeout,
            ..Self::new(sink, reason)
        }
    }
}

/// What a completed delivery or removal found on the way: things it refused to touch (a
/// planted link, a directory it did not create) and left alone. Reported like failures.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    pub warnings: Vec<String>,
}

#[async_trait::async_trait]
pub trait Sink: Send + Sync {
    /// The configured sink name, for logs and errors.
    fn name(&self) -> &str;
    /// Delivers (or replaces) the SVID.
    async fn deliver(&self, svid: &Delivered) -> Result<Applied, SinkError>;
    /// Removes what was delivered (the identity went away and the policy is `delete`).
    async fn remove(&self) -> Result<Applied, SinkError>;
}

/// Shared dependencies a sink factory may need.
#[derive(Clone)]
pub struct Deps {
    /// The Kubernetes API, when the agent has one.
    pub kube: Option<Arc<dyn kubernetes::KubeTransport>>,
    /// The agent's clock.
    pub clock: Arc<dyn Clock>,
}

impl Default for Deps {
    /// No Kubernetes API; the system clock.
    fn default() -> Self {
        Self {
            kube: None,
            clock: Arc::new(SystemClock),
        }
    }
}

type Factory = Box<dyn Fn(&SinkConfig, &Deps) -> Result<Arc<dyn Sink>, SinkError> + Send + Sync>;

/// Sink factories by kind name.
pub struct Registry {
    factories: HashMap<&'static str, Factory>,
}

impl Default for Registry {
    /// The built-in sinks: `files` and `kubernetes-secret`.
    fn default() -> Self {
        let mut r = Registry::empty();
        r.register("files", |cfg, deps| match &cfg.kind {
            SinkKind::Files(f) => Ok(Arc::new(files::FilesSink::with_clock(
                &cfg.name,
                f.clone(),
                deps.clock.clone(),
            ))),
            _ => Err(SinkError::new(&cfg.name, "not a files sink")),
        });
        r.register("kubernetes-secret", |cfg, deps| match &cfg.kind {
            SinkKind::KubernetesSecret(k) => {
                let api = deps.kube.clone().ok_or_else(|| {
                    SinkError::new(
                        &cfg.name,
                        "kubernetes-secret sinks need access to the Kubernetes API",
                    )
                })?;
                Ok(Arc::new(kubernetes::SecretSink::new(
                    &cfg.name,
                    k.clone(),
                    api,
                )))
            }
            _ => Err(SinkError::new(&cfg.name, "not a kubernetes-secret sink")),
        });
        r
    }
}

impl Registry {
    pub fn empty() -> Self {
        Self {
            factories: HashMap::new(),
        }
    }

    pub fn register(
        &mut self,
        kind: &'static str,
        factory: impl Fn(&SinkConfig, &Deps) -> Result<Arc<dyn Sink>, SinkError> + Send + Sync + 'static,
    ) {
        self.factories.insert(kind, Box::new(factory));
    }

    pub fn build(&self, cfg: &SinkConfig, deps: &Deps) -> Result<Arc<dyn Sink>, SinkError> {
        let kind = cfg.kind.name();
        let factory = self
            .factories
            .get(kind)
            .ok_or_else(|| SinkError::new(&cfg.name, format!("no sink kind {kind:?}")))?;
        factory(cfg, deps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeletionPolicy, FilesSinkConfig, KubernetesSecretSinkConfig};

    fn files_cfg() -> SinkConfig {
        SinkConfig {
            name: "web".into(),
            spiffe_id: "spiffe://example.org/web".into(),
            deletion_policy: DeletionPolicy::Delete,
            timeout: crate::config::DEFAULT_SINK_TIMEOUT,
            kind: SinkKind::Files(FilesSinkConfig::new("/tmp/x")),
        }
    }

    #[test]
    fn registry_builds_by_name() {
        let r = Registry::default();
        let s = r.build(&files_cfg(), &Deps::default()).expect("files");
        assert_eq!(s.name(), "web");

        let k8s = SinkConfig {
            kind: SinkKind::KubernetesSecret(KubernetesSecretSinkConfig {
                namespace: "a".into(),
                secret_name: "b".into(),
                secret_type: Default::default(),
            }),
            ..files_cfg()
        };
        let err = r.build(&k8s, &Deps::default()).err().expect("no client");
        assert!(err.to_string().contains("\"web\""), "{err}");
        assert!(
            Registry::empty()
                .build(&files_cfg(), &Deps::default())
                .is_err()
        );
    }

    #[test]
    fn delivered_debug_hides_key() {
        let d = Delivered {
            svid: Arc::new(crate::testing::self_signed_svid(
                "spiffe://example.org/a",
                signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock),
                std::time::Duration::from_secs(60),
            )),
            bundle_der: Ders::default(),
            crls_der: Ders::default(),
            federated: Vec::new(),
        };
        let s = format!("{d:?}");
        let key = d.svid.key().pkcs8_der();
        assert!(!s.contains(&format!("{:?}", &key[..8])), "{s}");
        assert!(s.contains("spiffe://example.org/a"), "{s}");
        assert!(d.key_pem().starts_with("-----BEGIN PRIVATE KEY-----"));
        let back = pem::parse(d.key_pem()).expect("pem");
        assert_eq!(back.contents(), key);
    }
}
