//! Our API group `signet.dev/v1`: `Issuer` (namespaced) and `ClusterIssuer` (cluster-scoped).
//!
//! A `ClusterIssuer` is the operator's: it says where the Signet server is, how to trust it
//! and how the bridge authenticates. A namespaced `Issuer` is its tenant's, so it decides none
//! of that: it uses the server the operator gave the bridge (`signet-k8s run --server
//! --bundle`), and authenticates either as the bridge (its own token, `--token`) or with an
//! mTLS SVID from a Secret of its own namespace (`auth.tlsSecretRef`). The fields that used to
//! choose the server and the bridge's token file are still in the `Issuer` schema only so that
//! an Issuer that sets them is reported (`Ready=False InvalidSpec` naming the field) instead of
//! silently changing meaning; the bridge never acts on them.
//!
//! The two specs share their parts ([`IssuerAuth`], [`TrustBundleSource`], [`LocalObjectRef`])
//! but are deliberately not one flattened struct: what a ClusterIssuer must name (`server`,
//! `trustBundle`) a namespaced Issuer may not name at all, so one struct would make the
//! ClusterIssuer's required fields optional in its schema and move a type-level guarantee into
//! run-time checks. The checks of both live in one place, `issuers::validate`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;

/// The API group of our issuer kinds; `issuerRef.group` of requests we sign.
pub const GROUP: &str = "signet.dev";
pub const VERSION: &str = "v1";
/// Where the bridge's service-account token is projected by default.
pub const DEFAULT_TOKEN_PATH: &str = "/var/run/secrets/signet/token";

/// A namespaced issuer: Certificates and CertificateRequests of its namespace that name it
/// are signed by the operator's Signet server.
// The printcolumn(...) arguments repeat `type_ = "string"`; that is not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
// The API server itself refuses a new or changed Issuer that sets a field only the operator
// may decide (CEL rules; old objects stay readable and are reported by the bridge).
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.server)", "fieldPath": ".server", "reason": "FieldValueForbidden",
     "message": "spec.server is not allowed on a namespaced Issuer: it uses the Signet server the bridge's operator configured (use a ClusterIssuer to name a server)"},
    {"rule": "!has(self.serverName)", "fieldPath": ".serverName", "reason": "FieldValueForbidden",
     "message": "spec.serverName is not allowed on a namespaced Issuer (use a ClusterIssuer)"},
    {"rule": "!has(self.trustBundle)", "fieldPath": ".trustBundle", "reason": "FieldValueForbidden",
     "message": "spec.trustBundle is not allowed on a namespaced Issuer: the server's roots come from the bridge's operator"},
    {"rule": "!has(self.auth) || !has(self.auth.serviceAccountToken)", "fieldPath": ".auth.serviceAccountToken", "reason": "FieldValueForbidden",
     "message": "spec.auth.serviceAccountToken is not allowed on a namespaced Issuer: the bridge's own token file is the operator's (use auth.tlsSecretRef for a credential of this namespace)"}
]))]
pub struct IssuerSpec {
    /// How the bridge authenticates for this Issuer: `tlsSecretRef`, a `kubernetes.io/tls`
    /// Secret of this Issuer's namespace; default: the bridge's own identity. The server is
    /// always the one the operator configured the bridge with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<IssuerAuth>,
    /// Not allowed on a namespaced Issuer (use a ClusterIssuer): the bridge talks only to the
    /// server its operator configured. An Issuer that sets it is refused (InvalidSpec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Not allowed on a namespaced Issuer (use a ClusterIssuer). An Issuer that sets it is
    /// refused (InvalidSpec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Not allowed on a namespaced Issuer (use a ClusterIssuer): the server's roots come from
    /// the operator. An Issuer that sets it is refused (InvalidSpec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_bundle: Option<TrustBundleSource>,
}

/// A cluster-wide issuer, created by the operator: which server, how to trust it, how to
/// authenticate. Its `configMapRef`/`secretRef`/`tlsSecretRef` are read from the bridge's own
/// namespace (like cert-manager's cluster resource namespace).
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
    /// The server must present `spiffe://<trustDomain>/signet/server`. Default: the bridge's
    /// `--trust-domain`, else the trust domain the bundle's roots name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
    /// How the bridge authenticates; default: the bridge's own token (`--token`, default
    /// `/var/run/secrets/signet/token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<IssuerAuth>,
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

/// A key of a ConfigMap or Secret in the bridge's namespace (a ClusterIssuer's trust bundle).
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

/// At most one of `serviceAccountToken`, `tlsSecretRef`; neither means the bridge's own token.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerAuth {
    /// ClusterIssuer only (a namespaced Issuer that sets it is refused): a token file in the
    /// bridge's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<ServiceAccountTokenAuth>,
    /// An mTLS SVID in a `kubernetes.io/tls` Secret of the issuer's namespace (the bridge's,
    /// for a ClusterIssuer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret_ref: Option<LocalObjectRef>,
}

/// A projected token file in the bridge's pod, re-read at every call and sent as a bearer
/// (ClusterIssuer only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountTokenAuth {
    /// Default `/var/run/secrets/signet/token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// A `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) holding an mTLS SVID, in the issuer's
/// own namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectRef {
    pub name: String,
    /// Only the issuer's own namespace (the bridge's, for a ClusterIssuer) is allowed; any
    /// other is refused (InvalidSpec). Leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
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

/// The CRD YAML documents of every signet.dev kind (`Issuer`, `ClusterIssuer`, then the
/// identity kinds of [`crate::identity::crd`]), as `(file name, YAML)` — what `signet-k8s
/// crds` prints and `deploy/crds/` holds.
pub fn crd_files() -> Vec<(&'static str, String)> {
    use kube::CustomResourceExt;
    let mut files = vec![
        (
            "signet.dev_issuers.yaml",
            crate::yaml::to_yaml(&Issuer::crd()),
        ),
        (
            "signet.dev_clusterissuers.yaml",
            crate::yaml::to_yaml(&ClusterIssuer::crd()),
        ),
    ];
    files.extend(crate::identity::crd::crd_files());
    files
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
    fn parses_manifests() {
        let c: ClusterIssuer = serde_json::from_value(serde_json::json!({
            "apiVersion": "signet.dev/v1", "kind": "ClusterIssuer",
            "metadata": {"name": "signet", "generation": 2},
            "spec": {
                "server": "https://signet.signet-system.svc:8443",
                "trustBundle": {"configMapRef": {"name": "signet-bundle", "key": "root.pem"}},
                "auth": {"serviceAccountToken": {}},
                "someFutureField": 1
            }
        }))
        .unwrap();
        assert_eq!(
            c.spec.trust_bundle.config_map_ref.as_ref().unwrap().key(),
            "root.pem"
        );
        assert_eq!(
            c.spec.auth.unwrap().service_account_token,
            Some(ServiceAccountTokenAuth::default())
        );
        // A namespaced Issuer needs nothing; an old one's fields are still read (to refuse it).
        let i: Issuer = serde_json::from_value(serde_json::json!({
            "apiVersion": "signet.dev/v1", "kind": "Issuer",
            "metadata": {"name": "signet", "namespace": "a"}, "spec": {}
        }))
        .unwrap();
        assert_eq!(i.spec.auth, None);
        let old: Issuer = serde_json::from_value(serde_json::json!({
            "apiVersion": "signet.dev/v1", "kind": "Issuer",
            "metadata": {"name": "signet", "namespace": "a"},
            "spec": {"server": "https://evil:443", "trustBundle": {"pem": "x"}}
        }))
        .unwrap();
        assert_eq!(old.spec.server.as_deref(), Some("https://evil:443"));
        assert!(old.spec.trust_bundle.is_some());
    }
}
