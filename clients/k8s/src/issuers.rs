//! Finding the issuer an `issuerRef` names and resolving it into a [`SignerConfig`]: the one
//! check every signing and status path passes through ([`resolve`]).
//!
//! - A `ClusterIssuer` (the operator's) names its server, trust bundle (ConfigMap, Secret or
//!   inline PEM, read from the bridge's namespace) and credentials (a token file, default the
//!   bridge's `--token`, or a `kubernetes.io/tls` Secret of the bridge's namespace).
//! - A namespaced `Issuer` (its tenant's) names none of that: the server, its roots and its
//!   trust domain are the operator's ([`BridgeConfig`]); the credentials are the bridge's own
//!   token or a `kubernetes.io/tls` Secret of the Issuer's own namespace. An Issuer that still
//!   sets `server`, `serverName`, `trustBundle` or `auth.serviceAccountToken` is refused
//!   (InvalidSpec naming the field) before anything is read or dialled.

use std::fmt;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};

use crate::certmanager::IssuerRef;
use crate::conditions::{self, Condition};
use crate::crd::{
    ClusterIssuer, ClusterIssuerSpec, GROUP, Issuer, IssuerAuth, IssuerSpec, IssuerStatus,
    LocalObjectRef,
};
use crate::operator::BridgeConfig;
use crate::signer::{Credentials, SignerConfig};
use signet_client::{ClientIdentity, ServerTarget};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IssuerKind {
    Issuer,
    ClusterIssuer,
}

/// Which issuer: `Issuer/<ns>/<name>` or `ClusterIssuer/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IssuerKey {
    pub kind: IssuerKind,
    /// Set for `Issuer` only.
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for IssuerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.kind, &self.namespace) {
            (IssuerKind::Issuer, Some(ns)) => write!(f, "Issuer/{ns}/{}", self.name),
            (IssuerKind::Issuer, None) => write!(f, "Issuer/{}", self.name),
            (IssuerKind::ClusterIssuer, _) => write!(f, "ClusterIssuer/{}", self.name),
        }
    }
}

/// Why an `issuerRef` is not ours or not usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefMatch {
    /// Ours: sign with this issuer.
    Ours(IssuerKey),
    /// Another issuer's (group not `signet.dev`): leave the object alone.
    NotOurs,
    /// Our group but a kind we do not serve.
    UnknownKind(String),
}

impl IssuerKey {
    /// Classifies the `issuerRef` of an object in `namespace`.
    pub fn from_ref(r: &IssuerRef, namespace: &str) -> RefMatch {
        if r.group() != GROUP {
            return RefMatch::NotOurs;
        }
        match r.kind() {
            "Issuer" => RefMatch::Ours(IssuerKey {
                kind: IssuerKind::Issuer,
                namespace: Some(namespace.to_owned()),
                name: r.name.clone(),
            }),
            "ClusterIssuer" => RefMatch::Ours(IssuerKey {
                kind: IssuerKind::ClusterIssuer,
                namespace: None,
                name: r.name.clone(),
            }),
            other => RefMatch::UnknownKind(other.to_owned()),
        }
    }
}

/// The spec of an issuer, by kind: what each kind may decide differs.
#[derive(Clone, Debug, PartialEq)]
pub enum AnyIssuerSpec {
    /// A namespaced `Issuer`: its tenant's.
    Namespaced(IssuerSpec),
    /// A `ClusterIssuer`: the operator's.
    Cluster(ClusterIssuerSpec),
}

/// An issuer as read from the API.
#[derive(Clone, Debug)]
pub struct IssuerObj {
    pub key: IssuerKey,
    pub spec: AnyIssuerSpec,
    pub status: Option<IssuerStatus>,
    pub generation: Option<i64>,
}

impl IssuerObj {
    pub fn ready_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Ready"))
    }
    /// Ready=True (for the current generation when the status says which).
    pub fn is_ready(&self) -> bool {
        let Some(st) = &self.status else { return false };
        let gen_ok = match (st.observed_generation, self.generation) {
            (Some(o), Some(g)) => o == g,
            _ => true,
        };
        gen_ok && conditions::is_true(&st.conditions, "Ready")
    }
}

impl From<Issuer> for IssuerObj {
    fn from(i: Issuer) -> Self {
        Self {
            key: IssuerKey {
                kind: IssuerKind::Issuer,
                namespace: i.metadata.namespace.clone(),
                name: i.metadata.name.clone().unwrap_or_default(),
            },
            generation: i.metadata.generation,
            spec: AnyIssuerSpec::Namespaced(i.spec),
            status: i.status,
        }
    }
}

impl From<ClusterIssuer> for IssuerObj {
    fn from(i: ClusterIssuer) -> Self {
        Self {
            key: IssuerKey {
                kind: IssuerKind::ClusterIssuer,
                namespace: None,
                name: i.metadata.name.clone().unwrap_or_default(),
            },
            generation: i.metadata.generation,
            spec: AnyIssuerSpec::Cluster(i.spec),
            status: i.status,
        }
    }
}

/// Reads the issuer `key` names; `Ok(None)` when it does not exist.
pub async fn fetch(client: &Client, key: &IssuerKey) -> Result<Option<IssuerObj>, kube::Error> {
    Ok(match key.kind {
        IssuerKind::Issuer => {
            let ns = key.namespace.as_deref().unwrap_or("default");
            Api::<Issuer>::namespaced(client.clone(), ns)
                .get_opt(&key.name)
                .await?
                .map(IssuerObj::from)
        }
        IssuerKind::ClusterIssuer => Api::<ClusterIssuer>::all(client.clone())
            .get_opt(&key.name)
            .await?
            .map(IssuerObj::from),
    })
}

/// Why an issuer's spec cannot be turned into a [`SignerConfig`]. `reason()` is the word for
/// its Ready condition.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{0}")]
    InvalidSpec(String),
    #[error("{0}")]
    BundleNotFound(String),
    #[error("{0}")]
    CredentialsNotFound(String),
    /// The bridge's own configuration lacks what this issuer needs (no `--server` for a
    /// namespaced Issuer, no way to tell the trust domain).
    #[error("{0}")]
    NotConfigured(String),
    #[error("reading from the Kubernetes API: {0}")]
    Api(#[from] kube::Error),
}

impl ResolveError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "InvalidSpec",
            Self::BundleNotFound(_) => "BundleNotFound",
            Self::CredentialsNotFound(_) => "CredentialsNotFound",
            Self::NotConfigured(_) => "BridgeNotConfigured",
            Self::Api(_) => "ApiError",
        }
    }
}

/// The fields a namespaced Issuer may not set, each with why, in the order reported.
fn forbidden_fields(spec: &IssuerSpec) -> Vec<&'static str> {
    let mut out = Vec::new();
    if spec.server.is_some() {
        out.push("spec.server");
    }
    if spec.server_name.is_some() {
        out.push("spec.serverName");
    }
    if spec.trust_bundle.is_some() {
        out.push("spec.trustBundle");
    }
    if spec
        .auth
        .as_ref()
        .is_some_and(|a| a.service_account_token.is_some())
    {
        out.push("spec.auth.serviceAccountToken");
    }
    out
}

/// Checks a namespaced Issuer without I/O: none of the operator's fields, and a
/// `tlsSecretRef` (if any) in `namespace`, the Issuer's own.
pub fn validate_namespaced(spec: &IssuerSpec, namespace: &str) -> Result<(), ResolveError> {
    let forbidden = forbidden_fields(spec);
    if !forbidden.is_empty() {
        let (them, are) = if forbidden.len() == 1 {
            ("it", "is")
        } else {
            ("them", "are")
        };
        return Err(ResolveError::InvalidSpec(format!(
            "{} {are} not allowed on a namespaced Issuer: the Signet server, its trust bundle \
             and the bridge's own token are chosen by the bridge's operator (signet-k8s run \
             --server, --bundle, --token), never by an Issuer. Remove {them} (the Issuer then \
             uses the operator's server), or ask the operator for a ClusterIssuer",
            forbidden.join(", ")
        )));
    }
    if let Some(r) = spec.auth.as_ref().and_then(|a| a.tls_secret_ref.as_ref()) {
        check_secret_ref(r, namespace, "this Issuer's namespace")?;
    }
    Ok(())
}

/// Checks a ClusterIssuer without I/O: an https server URL, exactly one bundle source, at
/// most one credential kind, a valid trust domain, a `tlsSecretRef` in the bridge's namespace.
pub fn validate_cluster(
    spec: &ClusterIssuerSpec,
    bridge_namespace: &str,
) -> Result<(), ResolveError> {
    if !spec.server.starts_with("https://") {
        return Err(ResolveError::InvalidSpec(format!(
            "spec.server must be an https:// URL of signet-server, got {:?}",
            spec.server
        )));
    }
    let tb = &spec.trust_bundle;
    let n = [
        tb.config_map_ref.is_some(),
        tb.secret_ref.is_some(),
        tb.pem.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if n != 1 {
        return Err(ResolveError::InvalidSpec(format!(
            "spec.trustBundle must set exactly one of configMapRef, secretRef, pem ({n} set)"
        )));
    }
    if let Some(td) = &spec.trust_domain {
        td.parse::<signet_types::TrustDomain>()
            .map_err(|e| ResolveError::InvalidSpec(format!("spec.trustDomain {td:?}: {e}")))?;
    }
    if let Some(a) = &spec.auth {
        if a.service_account_token.is_some() && a.tls_secret_ref.is_some() {
            return Err(ResolveError::InvalidSpec(
                "spec.auth must set at most one of serviceAccountToken, tlsSecretRef".into(),
            ));
        }
        if let Some(r) = &a.tls_secret_ref {
            check_secret_ref(r, bridge_namespace, "the bridge's namespace")?;
        }
    }
    Ok(())
}

/// A Secret name (DNS-1123 subdomain), and no namespace but `namespace`.
fn check_secret_ref(r: &LocalObjectRef, namespace: &str, which: &str) -> Result<(), ResolveError> {
    if let Some(other) = &r.namespace
        && other != namespace
    {
        return Err(ResolveError::InvalidSpec(format!(
            "spec.auth.tlsSecretRef.namespace {other:?}: an issuer may use only Secrets of \
             {which} ({namespace}); remove the namespace"
        )));
    }
    if !is_dns_subdomain(&r.name) {
        return Err(ResolveError::InvalidSpec(format!(
            "spec.auth.tlsSecretRef.name {:?} is not a Secret name",
            r.name
        )));
    }
    Ok(())
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

pub(crate) fn check_pem_roots(pem_bytes: &[u8], from: &str) -> Result<Vec<u8>, ResolveError> {
    match pem::parse_many(pem_bytes) {
        Ok(blocks) if blocks.iter().any(|b| b.tag() == "CERTIFICATE") => Ok(pem_bytes.to_vec()),
        _ => Err(ResolveError::BundleNotFound(format!(
            "{from} holds no PEM CERTIFICATE"
        ))),
    }
}

/// Resolves `obj` into a [`SignerConfig`]: the one place an issuer becomes a server address, a
/// trust bundle and credentials. Nothing is read or dialled for an issuer that fails its
/// checks.
pub async fn resolve(
    client: &Client,
    obj: &IssuerObj,
    bridge: &BridgeConfig,
    bridge_namespace: &str,
) -> Result<SignerConfig, ResolveError> {
    match &obj.spec {
        AnyIssuerSpec::Namespaced(spec) => {
            let Some(ns) = obj.key.namespace.as_deref() else {
                return Err(ResolveError::InvalidSpec(
                    "an Issuer without a namespace".into(),
                ));
            };
            validate_namespaced(spec, ns)?;
            let target = bridge.operator_target()?;
            let credentials = credentials(client, spec.auth.as_ref(), ns, bridge).await?;
            Ok(SignerConfig {
                target,
                credentials,
            })
        }
        AnyIssuerSpec::Cluster(spec) => {
            validate_cluster(spec, bridge_namespace)?;
            let bundle_pem = read_bundle(client, spec, bridge_namespace).await?;
            let configured = match &spec.trust_domain {
                Some(td) => Some(td.parse().map_err(|e| {
                    ResolveError::InvalidSpec(format!("spec.trustDomain {td:?}: {e}"))
                })?),
                None => None,
            };
            let td =
                bridge.trust_domain_for(configured.as_ref(), &bundle_pem, "spec.trustBundle")?;
            let credentials =
                credentials(client, spec.auth.as_ref(), bridge_namespace, bridge).await?;
            Ok(SignerConfig {
                target: ServerTarget::new(spec.server.clone(), bundle_pem, td)
                    .with_server_name(spec.server_name.clone()),
                credentials,
            })
        }
    }
}

/// A ClusterIssuer's trust bundle, from the bridge's namespace or inline.
async fn read_bundle(
    client: &Client,
    spec: &ClusterIssuerSpec,
    refs_namespace: &str,
) -> Result<Vec<u8>, ResolveError> {
    let tb = &spec.trust_bundle;
    if let Some(pem) = &tb.pem {
        check_pem_roots(pem.as_bytes(), "spec.trustBundle.pem")
    } else if let Some(r) = &tb.config_map_ref {
        let from = format!("ConfigMap {refs_namespace}/{} key {:?}", r.name, r.key());
        let cm = Api::<ConfigMap>::namespaced(client.clone(), refs_namespace)
            .get_opt(&r.name)
            .await?
            .ok_or_else(|| ResolveError::BundleNotFound(format!("{from}: ConfigMap not found")))?;
        let v = cm
            .data
            .as_ref()
            .and_then(|d| d.get(r.key()))
            .map(|s| s.as_bytes().to_vec())
            .or_else(|| {
                cm.binary_data
                    .as_ref()
                    .and_then(|d| d.get(r.key()))
                    .map(|b| b.0.clone())
            })
            .ok_or_else(|| ResolveError::BundleNotFound(format!("{from}: no such key")))?;
        check_pem_roots(&v, &from)
    } else if let Some(r) = &tb.secret_ref {
        let from = format!("Secret {refs_namespace}/{} key {:?}", r.name, r.key());
        let s = Api::<Secret>::namespaced(client.clone(), refs_namespace)
            .get_opt(&r.name)
            .await?
            .ok_or_else(|| ResolveError::BundleNotFound(format!("{from}: Secret not found")))?;
        let v = s
            .data
            .as_ref()
            .and_then(|d| d.get(r.key()))
            .map(|b| b.0.clone())
            .ok_or_else(|| ResolveError::BundleNotFound(format!("{from}: no such key")))?;
        check_pem_roots(&v, &from)
    } else {
        Err(ResolveError::InvalidSpec(
            "spec.trustBundle is empty".into(),
        ))
    }
}

/// The credentials: a `kubernetes.io/tls` Secret of `namespace` (already checked to be the
/// issuer's own), else a token file: a ClusterIssuer's `serviceAccountToken.path` (validated
/// callers only reach here with it for a ClusterIssuer), else the bridge's own `--token`.
async fn credentials(
    client: &Client,
    auth: Option<&IssuerAuth>,
    namespace: &str,
    bridge: &BridgeConfig,
) -> Result<Credentials, ResolveError> {
    if let Some(r) = auth.and_then(|a| a.tls_secret_ref.as_ref()) {
        let from = format!("Secret {namespace}/{}", r.name);
        let s = Api::<Secret>::namespaced(client.clone(), namespace)
            .get_opt(&r.name)
            .await?
            .ok_or_else(|| ResolveError::CredentialsNotFound(format!("{from} not found")))?;
        let get = |k: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|b| b.0.clone())
                .ok_or_else(|| ResolveError::CredentialsNotFound(format!("{from} has no {k:?}")))
        };
        return Ok(Credentials::Identity(ClientIdentity {
            cert_chain_pem: get("tls.crt")?,
            key_pem: get("tls.key")?,
        }));
    }
    let path = auth
        .and_then(|a| a.service_account_token.as_ref())
        .and_then(|t| t.path.as_deref())
        .map(PathBuf::from)
        .unwrap_or_else(|| bridge.token_path.clone());
    if !path.exists() {
        return Err(ResolveError::CredentialsNotFound(format!(
            "the service-account token file {} does not exist in the bridge's pod: \
             project a token with the server's audience there",
            path.display()
        )));
    }
    Ok(Credentials::TokenFile(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{
        IssuerAuth, KeyRef, LocalObjectRef, ServiceAccountTokenAuth, TrustBundleSource,
    };

    fn r(group: Option<&str>, kind: Option<&str>) -> IssuerRef {
        IssuerRef {
            name: "s".into(),
            kind: kind.map(Into::into),
            group: group.map(Into::into),
        }
    }

    #[test]
    fn ref_matching() {
        assert_eq!(IssuerKey::from_ref(&r(None, None), "a"), RefMatch::NotOurs);
        assert_eq!(
            IssuerKey::from_ref(&r(Some("cert-manager.io"), Some("Issuer")), "a"),
            RefMatch::NotOurs
        );
        let RefMatch::Ours(k) = IssuerKey::from_ref(&r(Some("signet.dev"), None), "a") else {
            panic!()
        };
        assert_eq!(k.to_string(), "Issuer/a/s");
        let RefMatch::Ours(k) =
            IssuerKey::from_ref(&r(Some("signet.dev"), Some("ClusterIssuer")), "a")
        else {
            panic!()
        };
        assert_eq!(k.to_string(), "ClusterIssuer/s");
        assert_eq!(
            IssuerKey::from_ref(&r(Some("signet.dev"), Some("Foo")), "a"),
            RefMatch::UnknownKind("Foo".into())
        );
    }

    fn cluster() -> ClusterIssuerSpec {
        ClusterIssuerSpec {
            server: "https://signet:8443".into(),
            server_name: None,
            trust_bundle: TrustBundleSource {
                pem: Some("x".into()),
                ..Default::default()
            },
            trust_domain: None,
            auth: None,
        }
    }

    fn tls_ref(name: &str, namespace: Option<&str>) -> Option<IssuerAuth> {
        Some(IssuerAuth {
            service_account_token: None,
            tls_secret_ref: Some(LocalObjectRef {
                name: name.into(),
                namespace: namespace.map(Into::into),
            }),
        })
    }

    #[test]
    fn cluster_issuer_validation() {
        let ns = "signet-system";
        assert!(validate_cluster(&cluster(), ns).is_ok());
        let mut s = cluster();
        s.server = "http://x".into();
        assert_eq!(
            validate_cluster(&s, ns).unwrap_err().reason(),
            "InvalidSpec"
        );
        let mut s = cluster();
        s.trust_bundle.config_map_ref = Some(KeyRef {
            name: "b".into(),
            key: None,
        });
        assert!(
            validate_cluster(&s, ns)
                .unwrap_err()
                .to_string()
                .contains("exactly one")
        );
        let mut s = cluster();
        s.trust_bundle.pem = None;
        assert!(validate_cluster(&s, ns).is_err());
        let mut s = cluster();
        s.auth = Some(IssuerAuth {
            service_account_token: Some(ServiceAccountTokenAuth::default()),
            tls_secret_ref: Some(LocalObjectRef {
                name: "t".into(),
                namespace: None,
            }),
        });
        assert!(validate_cluster(&s, ns).is_err());
        let mut s = cluster();
        s.trust_domain = Some("Not a domain".into());
        assert!(
            validate_cluster(&s, ns)
                .unwrap_err()
                .to_string()
                .contains("spec.trustDomain")
        );
        let mut s = cluster();
        s.auth = tls_ref("svid", Some("team-a"));
        assert!(validate_cluster(&s, ns).is_err());
        s.auth = tls_ref("svid", Some(ns));
        assert!(validate_cluster(&s, ns).is_ok());
    }

    /// The API server refuses what the bridge refuses: each forbidden field has a CEL rule in
    /// the Issuer CRD naming it (the bridge still checks, for objects stored before).
    #[test]
    fn the_issuer_crd_refuses_the_same_fields_at_admission() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(Issuer::crd()).unwrap();
        let rules = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["x-kubernetes-validations"];
        let all = IssuerSpec {
            server: Some("s".into()),
            server_name: Some("n".into()),
            trust_bundle: Some(TrustBundleSource::default()),
            auth: Some(IssuerAuth {
                service_account_token: Some(ServiceAccountTokenAuth::default()),
                tls_secret_ref: None,
            }),
        };
        let fields = forbidden_fields(&all);
        assert_eq!(fields.len(), 4);
        for f in fields {
            let path = f.trim_start_matches("spec");
            let rule = rules
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["fieldPath"] == path)
                .unwrap_or_else(|| panic!("no CEL rule for {f}: {rules}"));
            assert!(rule["message"].as_str().unwrap().starts_with(f), "{rule}");
            assert_eq!(rule["reason"], "FieldValueForbidden");
        }
    }

    #[test]
    fn namespaced_issuer_may_not_choose_server_bundle_or_token_file() {
        assert!(validate_namespaced(&IssuerSpec::default(), "a").is_ok());
        let own = IssuerSpec {
            auth: tls_ref("issuer-svid", None),
            ..Default::default()
        };
        assert!(validate_namespaced(&own, "a").is_ok());
        let own_explicit = IssuerSpec {
            auth: tls_ref("issuer-svid", Some("a")),
            ..Default::default()
        };
        assert!(validate_namespaced(&own_explicit, "a").is_ok());

        // Each forbidden field is named.
        let cases: Vec<(IssuerSpec, &str)> = vec![
            (
                IssuerSpec {
                    server: Some("https://evil:443".into()),
                    ..Default::default()
                },
                "spec.server is not allowed on a namespaced Issuer",
            ),
            (
                IssuerSpec {
                    server_name: Some("localhost".into()),
                    ..Default::default()
                },
                "spec.serverName is not allowed",
            ),
            (
                IssuerSpec {
                    trust_bundle: Some(TrustBundleSource {
                        pem: Some("x".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "spec.trustBundle is not allowed",
            ),
            (
                IssuerSpec {
                    auth: Some(IssuerAuth {
                        service_account_token: Some(ServiceAccountTokenAuth {
                            path: Some(
                                "/var/run/secrets/kubernetes.io/serviceaccount/token".into(),
                            ),
                        }),
                        tls_secret_ref: None,
                    }),
                    ..Default::default()
                },
                "spec.auth.serviceAccountToken is not allowed",
            ),
            (
                IssuerSpec {
                    server: Some("https://evil:443".into()),
                    trust_bundle: Some(TrustBundleSource::default()),
                    auth: Some(IssuerAuth {
                        service_account_token: Some(ServiceAccountTokenAuth::default()),
                        tls_secret_ref: None,
                    }),
                    server_name: None,
                },
                "spec.server, spec.trustBundle, spec.auth.serviceAccountToken are not allowed",
            ),
            (
                IssuerSpec {
                    auth: tls_ref("svid", Some("team-b")),
                    ..Default::default()
                },
                "spec.auth.tlsSecretRef.namespace \"team-b\": an issuer may use only Secrets of \
                 this Issuer's namespace (a)",
            ),
            (
                IssuerSpec {
                    auth: tls_ref("team-b/svid", None),
                    ..Default::default()
                },
                "is not a Secret name",
            ),
        ];
        for (spec, says) in cases {
            let err = validate_namespaced(&spec, "a").unwrap_err();
            assert_eq!(err.reason(), "InvalidSpec");
            assert!(err.to_string().contains(says), "{spec:?}: {err}");
        }
    }
}
