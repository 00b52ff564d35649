//! `signet.dev/v1alpha1` identity objects: [`ClusterIdentity`] (cluster-scoped, the platform
//! team's), [`Identity`] (namespaced, a tenant's) and [`Tenant`] (cluster-scoped, the platform
//! team's bounds on a group of namespaces).
//!
//! CEL rules (`x-kubernetes-validations`) catch the common mistakes at admission; the bridge
//! re-checks everything in `plan` and `tenant` (an old API server ignores CEL, and CEL is not
//! a security boundary). An [`Identity`] has no trust domain, node set or federation field: it
//! can only ever yield `spiffe://<td>/ns/<its namespace>/...`.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;

pub const VERSION: &str = "v1alpha1";
/// The default SPIFFE ID template of a ClusterIdentity.
pub const DEFAULT_SPIFFE_ID_TEMPLATE: &str =
    "spiffe://{trustDomain}/ns/{namespace}/sa/{serviceAccount}";
/// At most this many refusal messages are kept in a status.
pub const MAX_REFUSALS: usize = 10;

/// A Kubernetes label selector (`metav1.LabelSelector`), written here because k8s-openapi's
/// `schemars` feature stays off (see `conditions`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` item: `In`, `NotIn`, `Exists`, `DoesNotExist`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// Pods whose labels hold every pair; each pair becomes a `k8s:pod-label:<key>:<value>`
/// selector of the entries (no `matchExpressions`: the agent matches labels exactly).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.matchExpressions)", "reason": "FieldValueForbidden",
     "message": "podSelector takes matchLabels only: each pair becomes a k8s:pod-label selector"}
]))]
pub struct PodSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Not allowed (refused by CEL and by the bridge); in the schema so that an object that
    /// sets it is refused rather than pruned into "every pod".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// Workload identities for the pods of many namespaces, made by the platform team.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "signet.dev",
    version = "v1alpha1",
    kind = "ClusterIdentity",
    status = "IdentityStatus",
    shortname = "cid",
    category = "signet",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Entries", type_ = "integer", json_path = ".status.entries"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterIdentitySpec {
    /// The SPIFFE ID of each workload; `{trustDomain}`, `{namespace}`, `{serviceAccount}`.
    /// Default `spiffe://{trustDomain}/ns/{namespace}/sa/{serviceAccount}`. Without
    /// `{namespace}` the namespaceSelector must be a single `kubernetes.io/metadata.name`
    /// match (two namespaces would share an ID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub spiffe_id_template: Option<String>,
    /// The namespaces (by their labels); empty: every namespace.
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    /// The pods (matchLabels only); empty: every pod of the namespaces.
    #[serde(default)]
    pub pod_selector: PodSelector,
    /// DNS names of each workload, with the template's variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_name_templates: Vec<String>,
    /// X.509-SVID lifetime, a Go duration (`1h`); default: the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// JWT-SVID lifetime, a Go duration; default: the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_ttl: Option<String>,
    /// Trust domains whose bundles the workloads receive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub federates_with: Vec<String>,
    /// The node set the entries are served to; default: the bridge's `--node-set`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_set: Option<String>,
}

/// A workload identity in one namespace, made by that namespace's admins: always
/// `spiffe://<td>/ns/<this namespace>/<path>`, within the namespace's tenant's bounds.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "signet.dev",
    version = "v1alpha1",
    kind = "Identity",
    namespaced,
    status = "IdentityStatus",
    shortname = "sid",
    category = "signet",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Entries", type_ = "integer", json_path = ".status.entries"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct IdentitySpec {
    /// The SPIFFE ID path after `/ns/<namespace>/`, e.g. `sa/{serviceAccount}` or `web`: path
    /// segments of letters, digits, `.`, `-`, `_` (never `.`, `..` or empty); may use
    /// `{serviceAccount}`.
    #[schemars(length(min = 1, max = 1024))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "!self.startsWith('/')", "reason": "FieldValueInvalid",
         "message": "path is relative: the bridge puts it after /ns/<namespace>/"}
    ]))]
    pub path: String,
    /// The pods (matchLabels only); empty: every pod of the namespace.
    #[serde(default)]
    pub pod_selector: PodSelector,
    /// Only pods of this service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// DNS names (may use `{serviceAccount}`), each allowed by the tenant's dnsNamePatterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    /// X.509-SVID lifetime, a Go duration; at most the tenant's maxTtl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// JWT-SVID lifetime, a Go duration; at most the tenant's maxTtl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_ttl: Option<String>,
}

/// A group of namespaces and the bounds on their Identities, made by the platform team:
/// the namespaces of a Capsule Tenant (by Capsule's ownership) or an explicit list.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "signet.dev",
    version = "v1alpha1",
    kind = "Tenant",
    status = "TenantStatus",
    shortname = "stnt",
    category = "signet",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Namespaces",
        type_ = "integer",
        json_path = ".status.namespaceCount"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.capsuleTenant) != has(self.namespaces)", "reason": "FieldValueInvalid",
     "message": "set exactly one of capsuleTenant and namespaces"}
]))]
pub struct TenantSpec {
    /// The name of a Capsule `capsule.clastix.io/v1beta2` Tenant: its namespaces (by Capsule's
    /// ownerReference or the Capsule Tenant's status, never the label alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capsule_tenant: Option<String>,
    /// An explicit list of namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// SPIFFE ID path prefixes, each rendered per namespace (`{namespace}`); default
    /// `["/ns/{namespace}/"]`. Each starts and ends with `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spiffe_id_path_prefixes: Option<Vec<String>>,
    /// DNS name patterns (`{namespace}`; a leading `*.` is one or more labels); default
    /// `["*.{namespace}.svc", "*.{namespace}.svc.cluster.local"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_name_patterns: Option<Vec<String>>,
    /// The longest ttl or jwtTtl an Identity may ask for (Go duration); none: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ttl: Option<String>,
    /// The most entries all Identities of the tenant's namespaces may make together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_identities: Option<u32>,
}

/// The status of a ClusterIdentity or Identity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityStatus {
    /// `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How many registration entries the object has on the server.
    #[serde(default)]
    pub entries: u32,
    /// Why parts were refused (at most ten; the first ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The status of a Tenant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    /// `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How many namespaces the tenant holds (claimed by it alone).
    #[serde(default)]
    pub namespace_count: u32,
    /// How many registration entries its namespaces' Identities have on the server.
    #[serde(default)]
    pub entries: u32,
    /// Why parts were refused (namespaces another tenant claims too, a bad field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CRD files of the three kinds, as `(file name, YAML)`.
pub fn crd_files() -> Vec<(&'static str, String)> {
    use kube::CustomResourceExt;
    vec![
        (
            "signet.dev_clusteridentities.yaml",
            crate::yaml::to_yaml(&ClusterIdentity::crd()),
        ),
        (
            "signet.dev_identities.yaml",
            crate::yaml::to_yaml(&Identity::crd()),
        ),
        (
            "signet.dev_tenants.yaml",
            crate::yaml::to_yaml(&Tenant::crd()),
        ),
    ]
}
