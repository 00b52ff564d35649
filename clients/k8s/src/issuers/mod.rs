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
};
use crate::operator::BridgeConfig;
use crate::signer::{Credentials, SignerConfig};

mod operator_target;
pub(crate) mod validate;
use signet_client::{ClientIdentity, ServerTarget};
pub(crate) use validate::check_pem_roots;
pub use validate::{ResolveError, validate_cluster, validate_namespaced};

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
mod tests;
