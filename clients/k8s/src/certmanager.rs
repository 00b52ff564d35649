//! Typed `cert-manager.io/v1` `CertificateRequest` and `Certificate`, with the spec and status
//! fields of cert-manager's CRDs (camelCase; unknown fields are tolerated, so never write a
//! whole object back: patch only what you own, e.g. the status subresource).
//!
//! We do not publish these CRDs (cert-manager does); `schema = "disabled"`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;

pub const GROUP: &str = "cert-manager.io";
pub const CONDITION_READY: &str = "Ready";
pub const CONDITION_APPROVED: &str = "Approved";
pub const CONDITION_DENIED: &str = "Denied";
pub const CONDITION_ISSUING: &str = "Issuing";
pub const CONDITION_INVALID_REQUEST: &str = "InvalidRequest";

/// cert-manager's Ready reasons for a CertificateRequest.
pub mod reason {
    pub const PENDING: &str = "Pending";
    pub const FAILED: &str = "Failed";
    pub const ISSUED: &str = "Issued";
    pub const DENIED: &str = "Denied";
}

/// `issuerRef` of a Certificate or CertificateRequest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    pub name: String,
    /// `Issuer` when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `cert-manager.io` when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl IssuerRef {
    pub fn kind(&self) -> &str {
        match self.kind.as_deref() {
            None | Some("") => "Issuer",
            Some(k) => k,
        }
    }
    pub fn group(&self) -> &str {
        match self.group.as_deref() {
            None | Some("") => GROUP,
            Some(g) => g,
        }
    }
}

/// A request for one certificate from one CSR.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "CertificateRequest",
    namespaced,
    status = "CertificateRequestStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRequestSpec {
    /// Go duration, e.g. `2160h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    pub issuer_ref: IssuerRef,
    /// The PEM CSR (base64 in JSON, decoded here).
    #[serde(with = "b64")]
    pub request: Vec<u8>,
    #[serde(default, rename = "isCA", skip_serializing_if = "Option::is_none")]
    pub is_ca: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRequestStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// PEM leaf and intermediates (base64 in JSON).
    #[serde(default, with = "b64_opt", skip_serializing_if = "Option::is_none")]
    pub certificate: Option<Vec<u8>>,
    /// PEM root (base64 in JSON).
    #[serde(default, with = "b64_opt", skip_serializing_if = "Option::is_none")]
    pub ca: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_time: Option<Time>,
}

/// A desired certificate kept in a Secret.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "Certificate",
    namespaced,
    status = "CertificateStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    pub secret_name: String,
    pub issuer_ref: IssuerRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uris: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub email_addresses: Vec<String>,
    /// Go duration, e.g. `2160h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Go duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before_percentage: Option<i32>,
    #[serde(default, rename = "isCA", skip_serializing_if = "Option::is_none")]
    pub is_ca: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKeySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_template: Option<SecretTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub literal_subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature_algorithm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encode_usages_in_request: Option<bool>,
}

/// `privateKey`: `algorithm` RSA | ECDSA | Ed25519, `size`, `encoding` PKCS1 | PKCS8,
/// `rotationPolicy` Never | Always.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKeySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_policy: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretTemplate {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_private_key_secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_issuance_attempts: Option<i32>,
}

/// A text that is not a Go `time.Duration` [`parse_go_duration`] accepts (the text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected a Go duration such as \"2160h\" or \"1h30m\"")]
pub struct BadDuration(pub String);

/// Parses a Go `time.Duration` string as cert-manager writes them (`2160h`, `1h30m0s`,
/// `90s`, `1.5h`, `500ms`). Negative durations are refused.
pub fn parse_go_duration(s: &str) -> Result<Duration, BadDuration> {
    let bad = || BadDuration(s.to_owned());
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() || rest.starts_with('-') {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = rest;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_end == 0 {
            return Err(bad());
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        let unit_rest = &rest[num_end..];
        let unit_end = unit_rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(unit_rest.len());
        let scale = match &unit_rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = &unit_rest[unit_end..];
    }
    if !total.is_finite() || total > 1e12 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

/// Base64 of a byte field, as Kubernetes writes `[]byte`.
mod b64 {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(v))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        STANDARD.decode(s.trim()).map_err(serde::de::Error::custom)
    }
}

mod b64_opt {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&STANDARD.encode(v)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) if s.is_empty() => Ok(None),
            Some(s) => STANDARD
                .decode(s.trim())
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn go_durations() {
        assert_eq!(
            parse_go_duration("2160h").unwrap(),
            Duration::from_secs(2160 * 3600)
        );
        assert_eq!(
            parse_go_duration("1h30m0s").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            parse_go_duration("1.5h").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            parse_go_duration("500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "-1h", "1d", "h", "1h-", "abc", "1e3h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn issuer_ref_defaults() {
        let r = IssuerRef {
            name: "x".into(),
            ..Default::default()
        };
        assert_eq!((r.kind(), r.group()), ("Issuer", "cert-manager.io"));
    }

    #[test]
    fn certificate_request_as_cert_manager_writes_it() {
        let cr: CertificateRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "CertificateRequest",
            "metadata": {"name": "web-1", "namespace": "a", "uid": "u1", "resourceVersion": "7",
                "annotations": {"cert-manager.io/certificate-name": "web"}},
            "spec": {
                "duration": "1h", "isCA": false,
                "issuerRef": {"name": "signet", "kind": "Issuer", "group": "signet.dev"},
                "request": "LS0tLS1CRUdJTg==",
                "usages": ["digital signature", "key encipherment", "server auth"],
                "username": "system:serviceaccount:cert-manager:cert-manager",
                "groups": ["system:authenticated"], "extra": {"k": ["v"]}, "uid": "x",
                "unknownFutureField": true
            },
            "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "policy.cert-manager.io",
                "message": "ok", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        assert_eq!(cr.spec.request, b"-----BEGIN");
        assert_eq!(cr.spec.is_ca, Some(false));
        assert_eq!(cr.spec.issuer_ref.group(), "signet.dev");
        assert_eq!(cr.status.unwrap().conditions[0].type_, "Approved");
        assert_eq!(CertificateRequest::plural(&()), "certificaterequests");
    }

    #[test]
    fn certificate_as_cert_manager_writes_it() {
        let c: Certificate = serde_json::from_value(serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "web", "namespace": "a"},
            "spec": {
                "secretName": "web-tls", "commonName": "web", "dnsNames": ["web.a.svc"],
                "uris": ["spiffe://example.org/ns/a/sa/web"], "ipAddresses": ["10.0.0.1"],
                "emailAddresses": ["a@example.org"], "duration": "24h", "renewBefore": "8h",
                "isCA": false, "usages": ["server auth"],
                "privateKey": {"algorithm": "ECDSA", "size": 256, "encoding": "PKCS8", "rotationPolicy": "Always"},
                "secretTemplate": {"labels": {"l": "1"}, "annotations": {"a": "2"}},
                "issuerRef": {"name": "signet", "kind": "ClusterIssuer", "group": "signet.dev"},
                "revisionHistoryLimit": 2, "keystores": {"jks": {"create": true}}
            },
            "status": {"notAfter": "2024-01-02T00:00:00Z", "revision": 3, "failedIssuanceAttempts": 1,
                "nextPrivateKeySecretName": "web-abcde", "lastFailureTime": "2024-01-01T00:00:00Z",
                "renewalTime": "2024-01-01T16:00:00Z", "notBefore": "2024-01-01T00:00:00Z",
                "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 1}]}
        }))
        .unwrap();
        assert_eq!(
            c.spec
                .private_key
                .as_ref()
                .unwrap()
                .rotation_policy
                .as_deref(),
            Some("Always")
        );
        assert_eq!(c.spec.secret_template.as_ref().unwrap().labels["l"], "1");
        let st = c.status.unwrap();
        assert_eq!(st.revision, Some(3));
        assert_eq!(st.conditions[0].observed_generation, Some(1));
    }
}
