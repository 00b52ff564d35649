//! The `kubernetes.io/tls` Secret a Certificate writes, as a server-side-apply body: only the
//! fields we own (data, type, our labels and annotations, `secretTemplate`'s), nothing read
//! back from the server.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::{Resource, ResourceExt};
use serde_json::{Map, Value, json};

use super::policy::{
    ANN_ALT_NAMES, ANN_CERTIFICATE_NAME, ANN_COMMON_NAME, ANN_ISSUER_GROUP, ANN_ISSUER_KIND,
    ANN_ISSUER_NAME, ANN_REQUESTED_DURATION, ANN_URI_SANS, Desired, LABEL_MANAGED_BY, MANAGER,
};
use crate::certmanager::Certificate;
use crate::issuers::IssuerKind;

/// What goes into the Secret. `Debug` hides the key.
pub struct SecretData {
    /// PEM leaf and intermediates.
    pub chain_pem: String,
    pub key_pem: String,
    /// PEM root(s).
    pub ca_pem: String,
}

impl std::fmt::Debug for SecretData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretData")
            .field("chain_pem", &self.chain_pem)
            .field("key_pem", &"…")
            .finish_non_exhaustive()
    }
}

/// The apply body for `cert`'s Secret. `owner_ref`: also point the Secret at the Certificate
/// (cert-manager's `--enable-certificate-owner-ref`; off by default, so deleting a Certificate
/// keeps its Secret).
pub fn apply_body(cert: &Certificate, d: &Desired, data: &SecretData, owner_ref: bool) -> Value {
    let template = cert.spec.secret_template.clone().unwrap_or_default();
    let mut labels: Map<String, Value> = template
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    labels.insert(LABEL_MANAGED_BY.into(), MANAGER.into());
    let mut annotations: Map<String, Value> = template
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let kind = match d.issuer.kind {
        IssuerKind::Issuer => "Issuer",
        IssuerKind::ClusterIssuer => "ClusterIssuer",
    };
    for (k, v) in [
        (ANN_CERTIFICATE_NAME, d.name.clone()),
        (ANN_ISSUER_NAME, d.issuer.name.clone()),
        (ANN_ISSUER_KIND, kind.to_owned()),
        (ANN_ISSUER_GROUP, crate::crd::GROUP.to_owned()),
        (ANN_URI_SANS, d.spiffe_id.clone()),
        (ANN_ALT_NAMES, d.dns_names.join(",")),
        (ANN_COMMON_NAME, d.common_name.clone().unwrap_or_default()),
    ] {
        annotations.insert(k.into(), Value::String(v));
    }
    if let Some(t) = &d.duration_text {
        annotations.insert(ANN_REQUESTED_DURATION.into(), Value::String(t.clone()));
    }
    let mut metadata = json!({
        "name": d.secret_name,
        "namespace": d.namespace,
        "labels": labels,
        "annotations": annotations,
    });
    if owner_ref {
        metadata["ownerReferences"] = json!([{
            "apiVersion": Certificate::api_version(&()),
            "kind": Certificate::kind(&()),
            "name": cert.name_any(),
            "uid": cert.uid().unwrap_or_default(),
            "controller": true,
            "blockOwnerDeletion": true,
        }]);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": STANDARD.encode(&data.chain_pem),
            "tls.key": STANDARD.encode(&data.key_pem),
            "ca.crt": STANDARD.encode(&data.ca_pem),
        },
    })
}
