//! Citadel mode's pure decisions and object bodies.

use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::certificate::policy::{IssuedCert, LABEL_MANAGED_BY, MANAGER, renewal_time};
use crate::keys::PrivateKey;
use crate::revocation::Revocations;

pub const NAMESPACE_LABEL: &str = "signet.dev/citadel";
pub const NAMESPACE_LABEL_VALUE: &str = "enabled";
pub const SECRET_TYPE: &str = "istio.io/key-and-cert";
pub const ANN_SERVICE_ACCOUNT: &str = "istio.io/service-account.name";
/// When the Secret's certificate is to be renewed (RFC 3339), drawn with jitter at issuance.
pub const ANN_RENEWAL_TIME: &str = "signet.dev/renewal-time";
pub const CONFIGMAP_NAME: &str = "istio-ca-root-cert";
pub const CERT_CHAIN_KEY: &str = "cert-chain.pem";
pub const KEY_KEY: &str = "key.pem";
pub const ROOT_KEY: &str = "root-cert.pem";
/// Istio's key for the CRLs in `istio-ca-root-cert` (PEM, every issuing CA's CRL).
pub const CRL_KEY: &str = "ca-crl.pem";
/// How many re-issuances in a row came back compromised (the server still signing with a
/// tainted key, or listing the new serial too).
pub const ANN_REISSUES: &str = "signet.dev/compromised-reissues";
/// Not before this time (RFC 3339) is a certificate that came back compromised re-issued again.
pub const ANN_REISSUE_AFTER: &str = "signet.dev/reissue-after";
/// First wait before re-issuing a certificate that came back compromised.
pub const COMPROMISED_RETRY_BASE: Duration = Duration::from_secs(5);
/// Longest such wait.
pub const COMPROMISED_RETRY_CAP: Duration = Duration::from_secs(600);

/// The wait before the `attempt`-th (from 1) re-issuance of a certificate that came back
/// compromised: doubling from [`COMPROMISED_RETRY_BASE`], capped, jittered into `[½, 1]` of it
/// with `rnd` in `[0, 1)`.
pub fn compromised_retry(attempt: u32, rnd: f64) -> Duration {
    let shift = attempt.saturating_sub(1).min(16);
    let ceiling = COMPROMISED_RETRY_BASE
        .saturating_mul(1u32 << shift)
        .min(COMPROMISED_RETRY_CAP);
    ceiling.mul_f64(0.5 + rnd.clamp(0.0, 1.0) / 2.0)
}

pub fn citadel_enabled(ns: &Namespace) -> bool {
    ns.labels().get(NAMESPACE_LABEL).map(String::as_str) == Some(NAMESPACE_LABEL_VALUE)
}

pub fn secret_name(service_account: &str) -> String {
    format!("istio.{service_account}")
}

pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

/// Whether `secret` is the Citadel Secret of `service_account` (ours, or Citadel's that we
/// took over): the Istio type and annotation.
pub fn is_ours(secret: &Secret, service_account: &str) -> bool {
    secret.type_.as_deref() == Some(SECRET_TYPE)
        && secret
            .annotations()
            .get(ANN_SERVICE_ACCOUNT)
            .map(String::as_str)
            == Some(service_account)
}

/// What to do with a ServiceAccount's Secret.
#[derive(Debug, PartialEq, Eq)]
pub enum Renew {
    /// Someone else's Secret has that name: leave it.
    NotOurs(String),
    /// Issue a new certificate, for this reason.
    Now(String),
    /// The certificate is good but the root changed: rewrite with the new root.
    RootOnly {
        chain_pem: String,
        key_pem: String,
        renewal: SystemTime,
    },
    /// Nothing until this time.
    At(SystemTime),
}

fn data(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .filter(|b| !b.is_empty())
}

/// What to do with `sa`'s Secret `existing` at `now`, given the server's roots and its taints
/// and CRLs: a certificate issued under a tainted key or revoked is re-issued now, or, when the
/// last re-issuance came back compromised too, at its `signet.dev/reissue-after` time.
pub fn decide(
    existing: Option<&Secret>,
    sa: &ServiceAccount,
    spiffe_id: &str,
    roots_pem: &str,
    revocations: &Revocations,
    now: SystemTime,
) -> Renew {
    let Some(s) = existing else {
        return Renew::Now("the Secret does not exist".into());
    };
    if !is_ours(s, &sa.name_any()) {
        return Renew::NotOurs(format!(
            "Secret {} is not of type {SECRET_TYPE} annotated {ANN_SERVICE_ACCOUNT}={}",
            s.name_any(),
            sa.name_any()
        ));
    }
    let (Some(chain), Some(key)) = (data(s, CERT_CHAIN_KEY), data(s, KEY_KEY)) else {
        return Renew::Now("the Secret has no certificate or key".into());
    };
    let cert = match IssuedCert::parse(&chain) {
        Ok(c) => c,
        Err(e) => return Renew::Now(format!("the certificate does not parse: {e}")),
    };
    let key_ok = PrivateKey::from_pem(&key)
        .ok()
        .and_then(|k| k.public_key_der().ok())
        .is_some_and(|spki| spki == cert.spki);
    if !key_ok {
        return Renew::Now("the key does not match the certificate".into());
    }
    if cert.uris != [spiffe_id.to_owned()] {
        return Renew::Now(format!(
            "the certificate is for {:?}, not {spiffe_id}",
            cert.uris
        ));
    }
    if cert.not_after <= now {
        return Renew::Now("the certificate expired".into());
    }
    if let Some(why) = revocations.check_pem(&chain) {
        let after = s
            .annotations()
            .get(ANN_REISSUE_AFTER)
            .and_then(|t| humantime::parse_rfc3339(t).ok());
        return match after {
            Some(t) if t > now => Renew::At(t),
            _ => Renew::Now(format!("the certificate {why}")),
        };
    }
    let renewal = s
        .annotations()
        .get(ANN_RENEWAL_TIME)
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .unwrap_or_else(|| renewal_time(cert.not_before, cert.not_after, None, None, 0.0));
    if renewal <= now {
        return Renew::Now("renewal is due".into());
    }
    if data(s, ROOT_KEY).as_deref() != Some(roots_pem.as_bytes()) {
        return Renew::RootOnly {
            chain_pem: String::from_utf8_lossy(&chain).into_owned(),
            key_pem: String::from_utf8_lossy(&key).into_owned(),
            renewal,
        };
    }
    Renew::At(renewal)
}

/// How many re-issuances in a row came back compromised, from the Secret's annotation.
pub fn compromised_reissues(existing: Option<&Secret>) -> u32 {
    existing
        .and_then(|s| s.annotations().get(ANN_REISSUES).cloned())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The apply body of `istio.<sa>`. `retry`: the certificate came back compromised — the
/// re-issuances in a row and when to try again.
pub fn secret_body(
    sa: &ServiceAccount,
    chain_pem: &str,
    key_pem: &str,
    roots_pem: &str,
    renewal: SystemTime,
    retry: Option<(u32, SystemTime)>,
) -> Value {
    let mut body = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(&sa.name_any()),
            "namespace": sa.namespace().unwrap_or_default(),
            "labels": {LABEL_MANAGED_BY: MANAGER},
            "annotations": {
                ANN_SERVICE_ACCOUNT: sa.name_any(),
                ANN_RENEWAL_TIME: humantime::format_rfc3339_seconds(renewal).to_string(),
            },
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "name": sa.name_any(),
                "uid": sa.uid().unwrap_or_default(),
                "controller": true,
            }],
        },
        "type": SECRET_TYPE,
        "data": {
            CERT_CHAIN_KEY: STANDARD.encode(chain_pem),
            KEY_KEY: STANDARD.encode(key_pem),
            ROOT_KEY: STANDARD.encode(roots_pem),
        },
    });
    if let Some((n, after)) = retry {
        body["metadata"]["annotations"][ANN_REISSUES] = json!(n.to_string());
        body["metadata"]["annotations"][ANN_REISSUE_AFTER] =
            json!(humantime::format_rfc3339_seconds(after).to_string());
    }
    body
}

/// The apply body of `istio-ca-root-cert` in `namespace`: the roots, and the CRLs
/// (`ca-crl.pem`, PEM) when there are any (without, the key is dropped: server-side apply
/// removes a field its manager no longer sends).
pub fn configmap_body(namespace: &str, roots_pem: &str, crls_pem: &str) -> Value {
    let mut body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CONFIGMAP_NAME,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGER, "istio.io/config": "true"},
        },
        "data": {ROOT_KEY: roots_pem},
    });
    if !crls_pem.is_empty() {
        body["data"][CRL_KEY] = json!(crls_pem);
    }
    body
}
