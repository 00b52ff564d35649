//! Finding the issuer an `issuerRef` names and resolving its spec into a [`SignerConfig`]:
//! the trust bundle from a ConfigMap, Secret or inline PEM, the credentials from a token file
//! or a `kubernetes.io/tls` Secret. For a `ClusterIssuer`, refs are read from the bridge's own
//! namespace.

use std::fmt;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};

use crate::certmanager::IssuerRef;
use crate::conditions::{self, Condition};
use crate::crd::{ClusterIssuer, DEFAULT_TOKEN_PATH, GROUP, Issuer, IssuerSpec, IssuerStatus};
use crate::signer::{Credentials, SignerConfig};
use signet_client::ClientIdentity;

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

/// An issuer as read from the API, kind erased.
#[derive(Clone, Debug)]
pub struct IssuerObj {
    pub key: IssuerKey,
    pub spec: IssuerSpec,
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
    /// The namespace its `configMapRef`/`secretRef`/`tlsSecretRef` are read from.
    pub fn refs_namespace<'a>(&'a self, bridge_namespace: &'a str) -> &'a str {
        match self.key.kind {
            IssuerKind::Issuer => self.key.namespace.as_deref().unwrap_or(bridge_namespace),
            IssuerKind::ClusterIssuer => bridge_namespace,
        }
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
            spec: i.spec,
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
            spec: i.spec.into(),
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
    #[error("reading from the Kubernetes API: {0}")]
    Api(#[from] kube::Error),
}

impl ResolveError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "InvalidSpec",
            Self::BundleNotFound(_) => "BundleNotFound",
            Self::CredentialsNotFound(_) => "CredentialsNotFound",
            Self::Api(_) => "ApiError",
        }
    }
}

/// Checks what can be checked without I/O: a server URL, exactly one bundle source, at most
/// one credential kind.
pub fn validate_spec(spec: &IssuerSpec) -> Result<(), ResolveError> {
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
    if let Some(a) = &spec.auth
        && a.service_account_token.is_some()
        && a.tls_secret_ref.is_some()
    {
        return Err(ResolveError::InvalidSpec(
            "spec.auth must set at most one of serviceAccountToken, tlsSecretRef".into(),
        ));
    }
    Ok(())
}

fn check_pem_roots(pem_bytes: &[u8], from: &str) -> Result<Vec<u8>, ResolveError> {
    match pem::parse_many(pem_bytes) {
        Ok(blocks) if blocks.iter().any(|b| b.tag() == "CERTIFICATE") => Ok(pem_bytes.to_vec()),
        _ => Err(ResolveError::BundleNotFound(format!(
            "{from} holds no PEM CERTIFICATE"
        ))),
    }
}

/// Resolves `spec` into a [`SignerConfig`], reading refs from `refs_namespace`.
pub async fn resolve(
    client: &Client,
    spec: &IssuerSpec,
    refs_namespace: &str,
) -> Result<SignerConfig, ResolveError> {
    validate_spec(spec)?;
    let tb = &spec.trust_bundle;
    let bundle_pem = if let Some(pem) = &tb.pem {
        check_pem_roots(pem.as_bytes(), "spec.trustBundle.pem")?
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
        check_pem_roots(&v, &from)?
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
        check_pem_roots(&v, &from)?
    } else {
        return Err(ResolveError::InvalidSpec(
            "spec.trustBundle is empty".into(),
        ));
    };

    let credentials = match spec.auth.as_ref().and_then(|a| a.tls_secret_ref.as_ref()) {
        Some(r) => {
            let from = format!("Secret {refs_namespace}/{}", r.name);
            let s = Api::<Secret>::namespaced(client.clone(), refs_namespace)
                .get_opt(&r.name)
                .await?
                .ok_or_else(|| ResolveError::CredentialsNotFound(format!("{from} not found")))?;
            let get = |k: &str| {
                s.data
                    .as_ref()
                    .and_then(|d| d.get(k))
                    .map(|b| b.0.clone())
                    .ok_or_else(|| {
                        ResolveError::CredentialsNotFound(format!("{from} has no {k:?}"))
                    })
            };
            Credentials::Identity(ClientIdentity {
                cert_chain_pem: get("tls.crt")?,
                key_pem: get("tls.key")?,
            })
        }
        None => {
            let path = spec
                .auth
                .as_ref()
                .and_then(|a| a.service_account_token.as_ref())
                .and_then(|t| t.path.clone())
                .unwrap_or_else(|| DEFAULT_TOKEN_PATH.to_owned());
            let path = PathBuf::from(path);
            if !path.exists() {
                return Err(ResolveError::CredentialsNotFound(format!(
                    "the service-account token file {} does not exist in the bridge's pod: \
                     project a token with the server's audience there",
                    path.display()
                )));
            }
            Credentials::TokenFile(path)
        }
    };
    Ok(SignerConfig {
        server: spec.server.clone(),
        server_name: spec.server_name.clone(),
        bundle_pem,
        credentials,
    })
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

    fn spec() -> IssuerSpec {
        IssuerSpec {
            server: "https://signet:8443".into(),
            server_name: None,
            trust_bundle: TrustBundleSource {
                pem: Some("x".into()),
                ..Default::default()
            },
            auth: None,
        }
    }

    #[test]
    fn spec_validation() {
        assert!(validate_spec(&spec()).is_ok());
        let mut s = spec();
        s.server = "http://x".into();
        assert_eq!(validate_spec(&s).unwrap_err().reason(), "InvalidSpec");
        let mut s = spec();
        s.trust_bundle.config_map_ref = Some(KeyRef {
            name: "b".into(),
            key: None,
        });
        assert!(
            validate_spec(&s)
                .unwrap_err()
                .to_string()
                .contains("exactly one")
        );
        let mut s = spec();
        s.trust_bundle.pem = None;
        assert!(validate_spec(&s).is_err());
        let mut s = spec();
        s.auth = Some(IssuerAuth {
            service_account_token: Some(ServiceAccountTokenAuth::default()),
            tls_secret_ref: Some(LocalObjectRef { name: "t".into() }),
        });
        assert!(validate_spec(&s).is_err());
    }
}
