//! The checks an issuer's spec passes before anything is read or dialled, and the
//! [`ResolveError`] every resolution failure is reported as (its `reason()` is the word of the
//! issuer's Ready condition). Pure: no I/O and nothing of the operator's configuration.

use signet_types::dns::Dns1123Subdomain;

use crate::crd::{ClusterIssuerSpec, IssuerSpec, LocalObjectRef};

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
pub(super) fn forbidden_fields(spec: &IssuerSpec) -> Vec<&'static str> {
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
    if !Dns1123Subdomain::is_valid(&r.name) {
        return Err(ResolveError::InvalidSpec(format!(
            "spec.auth.tlsSecretRef.name {:?} is not a Secret name",
            r.name
        )));
    }
    Ok(())
}

pub(crate) fn check_pem_roots(pem_bytes: &[u8], from: &str) -> Result<Vec<u8>, ResolveError> {
    match pem::parse_many(pem_bytes) {
        Ok(blocks) if blocks.iter().any(|b| b.tag() == "CERTIFICATE") => Ok(pem_bytes.to_vec()),
        _ => Err(ResolveError::BundleNotFound(format!(
            "{from} holds no PEM CERTIFICATE"
        ))),
    }
}
