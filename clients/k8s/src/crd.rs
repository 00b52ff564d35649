//! Our API group `signet.dev/v1`: `Issuer` (namespaced) and `ClusterIssuer` (cluster-scoped).
//! Both carry the same spec: where the Signet server is, how to trust it, how to authenticate.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;

/// The API group of our issuer kinds; `issuerRef.group` of requests we sign.
pub const GROUP: &str = "signet.dev";
pub const VERSION: &str = "v1";
/// Where the bridge's service-account token is projected by default.
pub const DEFAULT_TOKEN_PATH: &str = "/var/run/secrets/signet/token";

/// How to reach one Signet server.
// The printcolumn(...) arguments repeat `type_ = "string"`; that is not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "signet.dev",
    version = "v1",
    kind = "Issuer",
    namespaced,
    status = "IssuerStatus",
    shortname = "signetissuer",
    category = "signet",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Ready\")].message"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct IssuerSpec {
    /// The signet-server CA endpoint, `https://host:port`.
    pub server: String,
    /// The name checked in the server's certificate, when it is not the host of `server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// The roots that sign the server's certificate.
    pub trust_bundle: TrustBundleSource,
    /// How the bridge authenticates; default: the service-account token at
    /// `/var/run/secrets/signet/token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<IssuerAuth>,
}

/// A cluster-wide issuer: the spec of [`Issuer`]; its `configMapRef`/`secretRef`s are read from
/// the bridge's own namespace (like cert-manager's cluster resource namespace).
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "signet.dev",
    version = "v1",
    kind = "ClusterIssuer",
    status = "IssuerStatus",
    shortname = "signetclusterissuer",
    category = "signet",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Ready\")].message"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterIssuerSpec {
    /// The signet-server CA endpoint, `https://host:port`.
    pub server: String,
    /// The name checked in the server's certificate, when it is not the host of `server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// The roots that sign the server's certificate.
    pub trust_bundle: TrustBundleSource,
    /// How the bridge authenticates; default: the service-account token at
    /// `/var/run/secrets/signet/token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<IssuerAuth>,
}

impl From<ClusterIssuerSpec> for IssuerSpec {
    fn from(s: ClusterIssuerSpec) -> Self {
        Self {
            server: s.server,
            server_name: s.server_name,
            trust_bundle: s.trust_bundle,
            auth: s.auth,
        }
    }
}

impl From<IssuerSpec> for ClusterIssuerSpec {
    fn from(s: IssuerSpec) -> Self {
        Self {
            server: s.server,
            server_name: s.server_name,
            trust_bundle: s.trust_bundle,
            auth: s.auth,
        }
    }
}

/// Exactly one of `configMapRef`, `secretRef`, `pem`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustBundleSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<KeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<KeyRef>,
    /// PEM roots inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pem: Option<String>,
}

/// A key of a ConfigMap or Secret in the issuer's namespace (the bridge's, for a ClusterIssuer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    pub name: String,
    /// Default `ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl KeyRef {
    pub const DEFAULT_KEY: &'static str = "ca.crt";
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(Self::DEFAULT_KEY)
    }
}

/// At most one of `serviceAccountToken`, `tlsSecretRef`; neither means the default token path.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerAuth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<ServiceAccountTokenAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret_ref: Option<LocalObjectRef>,
}

/// A projected token file in the bridge's pod, re-read at every call and sent as a bearer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountTokenAuth {
    /// Default `/var/run/secrets/signet/token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// A `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) holding an mTLS SVID.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectRef {
    pub name: String,
}

/// The status of an `Issuer` or `ClusterIssuer`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerStatus {
    /// `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CRD YAML documents for both kinds, in the order `Issuer`, `ClusterIssuer`, as
/// `(file name, YAML)` — what `signet-k8s crds` prints and `deploy/crds/` holds.
pub fn crd_files() -> Vec<(&'static str, String)> {
    use kube::CustomResourceExt;
    vec![
        (
            "signet.dev_issuers.yaml",
            crate::yaml::to_yaml(&Issuer::crd()),
        ),
        (
            "signet.dev_clusterissuers.yaml",
            crate::yaml::to_yaml(&ClusterIssuer::crd()),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::{CustomResourceExt, Resource};

    #[test]
    fn kinds_and_scopes() {
        let i = Issuer::crd();
        assert_eq!(i.spec.group, "signet.dev");
        assert_eq!(i.spec.scope, "Namespaced");
        assert_eq!(i.spec.names.plural, "issuers");
        let c = ClusterIssuer::crd();
        assert_eq!(c.spec.scope, "Cluster");
        assert_eq!(c.spec.names.plural, "clusterissuers");
        assert_eq!(Issuer::api_version(&()), "signet.dev/v1");
        assert!(
            i.spec.versions[0]
                .subresources
                .as_ref()
                .unwrap()
                .status
                .is_some()
        );
    }

    #[test]
    fn checked_in_crds_match_the_types() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
        for (name, yaml) in crd_files() {
            let got = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
            assert!(
                got == yaml,
                "deploy/crds/{name} does not match the Rust types: regenerate it with \
                 `cargo run -p signet-k8s -- crds --out-dir deploy/crds`"
            );
        }
    }

    #[test]
    fn parses_a_manifest() {
        let i: Issuer = serde_json::from_value(serde_json::json!({
            "apiVersion": "signet.dev/v1", "kind": "Issuer",
            "metadata": {"name": "signet", "namespace": "a", "generation": 2},
            "spec": {
                "server": "https://signet.signet-system.svc:8443",
                "trustBundle": {"configMapRef": {"name": "signet-bundle", "key": "root.pem"}},
                "auth": {"serviceAccountToken": {}},
                "someFutureField": 1
            }
        }))
        .unwrap();
        assert_eq!(
            i.spec.trust_bundle.config_map_ref.as_ref().unwrap().key(),
            "root.pem"
        );
        assert_eq!(
            i.spec.auth.unwrap().service_account_token,
            Some(ServiceAccountTokenAuth::default())
        );
    }
}
