//! What a Kubernetes service-account token says, and the identity it makes.
//!
//! The payload of a projected token (TokenRequest API) is [`Payload`]. Rules:
//! - a legacy Secret-based token (issuer `kubernetes/serviceaccount`, or the
//!   `kubernetes.io/serviceaccount/namespace` claim) is refused before anything else
//!   ([`refuse_legacy`]): those tokens never expire and cannot be revoked;
//! - `sub` is `system:serviceaccount:<namespace>:<name>`, both segments usable as SPIFFE path
//!   segments (letters, digits, `.`, `-`, `_`; not `.` or `..`);
//! - the `kubernetes.io` object, when present, must name the same namespace and service account;
//!   its pod and node (`kubernetes.io.node.name`, Kubernetes 1.30+) are carried along;
//! - the identity is `spiffe://<td>/ns/<namespace>/sa/<name>` ([`identity`]).

use serde::Deserialize;
use signet_types::TrustDomain;

use super::claims::Registered;
use super::refuse::{bad, quoted};
use crate::authn::{AuthenticatedCaller, AuthnError, CallerKind};

/// The issuer of legacy Secret-based service-account tokens.
pub(super) const LEGACY_ISSUER: &str = "kubernetes/serviceaccount";

const SUB_PREFIX: &str = "system:serviceaccount:";

/// The payload of a service-account token: the registered claims and Kubernetes' own.
#[derive(Deserialize)]
pub(super) struct Payload {
    iss: Option<String>,
    sub: Option<String>,
    aud: Option<serde_json::Value>,
    exp: Option<serde_json::Value>,
    nbf: Option<serde_json::Value>,
    iat: Option<serde_json::Value>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
    #[serde(rename = "kubernetes.io/serviceaccount/namespace")]
    legacy_namespace: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct KubernetesClaims {
    namespace: Option<String>,
    serviceaccount: Option<ObjectRef>,
    pod: Option<ObjectRef>,
    node: Option<ObjectRef>,
}

#[derive(Deserialize)]
struct ObjectRef {
    name: Option<String>,
}

impl Payload {
    /// The registered claims, for [`super::claims::check`].
    pub(super) fn registered(&self) -> Registered<'_> {
        Registered {
            iss: self.iss.as_deref(),
            aud: self.aud.as_ref(),
            exp: self.exp.as_ref(),
            nbf: self.nbf.as_ref(),
            iat: self.iat.as_ref(),
        }
    }
}

/// A token that passed every check: the service account it names and, for a bound token, the
/// node its pod runs on (`kubernetes.io.node.name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    pub caller: AuthenticatedCaller,
    pub node_name: Option<String>,
}

/// Legacy Secret-based tokens: never expire, must not be accepted.
pub(super) fn refuse_legacy(p: &Payload) -> Result<(), AuthnError> {
    if p.iss.as_deref() == Some(LEGACY_ISSUER) || p.legacy_namespace.is_some() {
        return Err(bad(
            "legacy Secret-based service-account token (issuer \"kubernetes/serviceaccount\", \
             no expiry) refused; mount a projected token (serviceAccountToken volume) or use \
             the TokenRequest API",
        ));
    }
    Ok(())
}

/// The caller `p` names, in trust domain `td` (the rules of the module doc). Call only on a
/// payload whose signature and registered claims were checked.
pub(super) fn identity(p: &Payload, td: &TrustDomain) -> Result<VerifiedToken, AuthnError> {
    let Some(sub) = p.sub.as_deref() else {
        return Err(bad(
            "token has no sub; expected system:serviceaccount:<namespace>:<name>",
        ));
    };
    let (namespace, service_account) = sub
        .strip_prefix(SUB_PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .filter(|(_, name)| !name.contains(':'))
        .ok_or_else(|| {
            bad(format!(
                "sub {} is not a service account (system:serviceaccount:<namespace>:<name>)",
                quoted(sub)
            ))
        })?;
    check_segment(namespace, "namespace")?;
    check_segment(service_account, "service account name")?;

    let mut pod = None;
    let mut node = None;
    if let Some(k8s) = &p.kubernetes {
        if let Some(ns) = k8s.namespace.as_deref()
            && ns != namespace
        {
            return Err(bad(format!(
                "sub names namespace {} but the kubernetes.io claim says {}",
                quoted(namespace),
                quoted(ns)
            )));
        }
        if let Some(name) = k8s.serviceaccount.as_ref().and_then(|s| s.name.as_deref())
            && name != service_account
        {
            return Err(bad(format!(
                "sub names service account {} but the kubernetes.io claim says {}",
                quoted(service_account),
                quoted(name)
            )));
        }
        pod = k8s.pod.as_ref().and_then(|p| p.name.clone());
        node = k8s.node.as_ref().and_then(|n| n.name.clone());
    }

    let id = td
        .id(&format!("/ns/{namespace}/sa/{service_account}"))
        .map_err(|e| bad(format!("service account does not make a SPIFFE ID: {e}")))?;
    Ok(VerifiedToken {
        caller: AuthenticatedCaller::new(
            id,
            CallerKind::KubernetesServiceAccount {
                namespace: namespace.to_owned(),
                service_account: service_account.to_owned(),
                pod,
                node: node.clone(),
            },
        ),
        node_name: node,
    })
}

/// A namespace or service-account name must be usable as a SPIFFE path segment.
fn check_segment(seg: &str, what: &str) -> Result<(), AuthnError> {
    let ok = !seg.is_empty()
        && seg != "."
        && seg != ".."
        && seg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "{what} {} is not a valid SPIFFE path segment (letters, digits, '.', '-', '_')",
            quoted(seg)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn valid_es256_token_is_accepted() {
        let f = fixture();
        let caller = f
            .auth
            .authenticate(&sign_es(&f.key, Some("ec-1"), &claims()), now())
            .expect("accepted");
        assert_eq!(
            caller.spiffe_id().to_string(),
            "spiffe://cluster.local/ns/default/sa/web"
        );
        assert_eq!(
            caller.kind(),
            &CallerKind::KubernetesServiceAccount {
                namespace: "default".into(),
                service_account: "web".into(),
                pod: Some("web-7d9f".into()),
                node: None,
            }
        );
    }

    #[test]
    fn legacy_secret_token_is_refused() {
        let f = fixture();
        let legacy = json!({
            "iss": "kubernetes/serviceaccount",
            "kubernetes.io/serviceaccount/namespace": "default",
            "kubernetes.io/serviceaccount/secret.name": "web-token-abcde",
            "kubernetes.io/serviceaccount/service-account.name": "web",
            "kubernetes.io/serviceaccount/service-account.uid": "8c1f",
            "sub": "system:serviceaccount:default:web",
        });
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &legacy));
        assert!(msg.contains("legacy Secret-based"), "{msg}");
    }

    #[test]
    fn sub_and_claims_must_agree() {
        let f = fixture();
        let mut c = claims();
        c["kubernetes.io"]["namespace"] = json!("kube-system");
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("namespace"), "{msg}");
        let mut c = claims();
        c["kubernetes.io"]["serviceaccount"]["name"] = json!("admin");
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("service account"), "{msg}");
        for sub in [
            "system:node:worker-1",
            "system:serviceaccount:default",
            "system:serviceaccount:default:web:extra",
            "system:serviceaccount::web",
        ] {
            let c = with(claims(), "sub", json!(sub));
            let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
            assert!(
                msg.contains("not a service account") || msg.contains("path segment"),
                "{sub}: {msg}"
            );
        }
        let mut c = with(claims(), "sub", json!("system:serviceaccount:de fault:web"));
        c["kubernetes.io"]["namespace"] = json!("de fault");
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("SPIFFE path segment"), "{msg}");
    }

    fn payload(v: serde_json::Value) -> Payload {
        serde_json::from_value(v).expect("payload")
    }

    /// `identity` and `refuse_legacy` directly, on payloads no signature covers.
    #[test]
    fn the_identity_is_the_sub_and_the_node_comes_along() {
        let mut c = claims();
        c["kubernetes.io"]["node"] = json!({ "name": "worker-1" });
        let t = identity(&payload(c), &td()).expect("identity");
        assert_eq!(t.caller.spiffe_id().path(), "/ns/default/sa/web");
        assert_eq!(t.node_name.as_deref(), Some("worker-1"));
        assert_eq!(
            t.caller.label(),
            "jwt:spiffe://cluster.local/ns/default/sa/web"
        );
        let e = identity(&payload(without(claims(), "sub")), &td()).expect_err("no sub");
        assert!(e.to_string().contains("token has no sub"), "{e}");
        for seg in [".", "..", "a/b", "é"] {
            let c = without(
                with(
                    claims(),
                    "sub",
                    json!(format!("system:serviceaccount:{seg}:web")),
                ),
                "kubernetes.io",
            );
            let e = identity(&payload(c), &td()).expect_err(seg);
            assert!(e.to_string().contains("namespace"), "{seg}: {e}");
        }
        // Either legacy marker is enough.
        let legacy_iss = with(claims(), "iss", json!(LEGACY_ISSUER));
        assert!(refuse_legacy(&payload(legacy_iss)).is_err());
        let legacy_claim = with(
            claims(),
            "kubernetes.io/serviceaccount/namespace",
            json!("default"),
        );
        assert!(refuse_legacy(&payload(legacy_claim)).is_err());
        assert_eq!(refuse_legacy(&payload(claims())), Ok(()));
    }
}
