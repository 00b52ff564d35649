//! The policy's tests, by topic. The helpers here build one test policy (trust domain
//! `example.org`, two service-account DNS templates, one impersonator, two bridge callers,
//! the server's names) and callers of every kind; each topic file drives
//! [`Policy::decide`] through them.

use super::*;
use crate::authn::CallerKind;
use crate::config::{KubernetesBridgeConfig, PolicyConfig};
use crate::provenance::{Provenance, Source};
use signet_types::ttl::ABSURD_TTL_SECONDS;
use std::net::Ipv4Addr;

mod bridge;
mod config;
mod identity;
mod names;
mod nodes;
mod renewal;

const HOUR: Duration = Duration::from_secs(3600);
/// The issuance time the tests decide at (unix seconds).
const NOW: i64 = 1_700_000_000;

fn td() -> TrustDomain {
    TrustDomain::new("example.org").expect("td")
}

fn id(path: &str) -> SpiffeId {
    td().id(path).expect("id")
}

fn policy() -> Policy {
    Policy::new(
        td(),
        HOUR,
        24 * HOUR,
        &PolicyConfig {
            kubernetes_dns_templates: vec![
                "{serviceaccount}.{namespace}.svc".into(),
                "*.{namespace}.svc.cluster.local".into(),
            ],
            impersonators: vec!["spiffe://example.org/ns/istio-system/sa/ztunnel".into()],
            kubernetes_bridge: KubernetesBridgeConfig {
                callers: vec![
                    "spiffe://example.org/ns/signet-system/sa/signet-k8s".into(),
                    "spiffe://example.org/bridge".into(),
                ],
                ..KubernetesBridgeConfig::default()
            },
            ..PolicyConfig::default()
        },
    )
    .expect("policy")
    .with_server_names(
        vec![
            "localhost".into(),
            "signet.example.com".into(),
            "signet.signet-system.svc".into(),
        ],
        vec![Ipv4Addr::LOCALHOST.into(), "::1".parse().expect("ip")],
    )
}

fn server() -> AuthenticatedCaller {
    AuthenticatedCaller::for_tests(id("/signet/server"), CallerKind::Server)
}

fn sa(ns: &str, name: &str) -> AuthenticatedCaller {
    AuthenticatedCaller::for_tests(
        id(&format!("/ns/{ns}/sa/{name}")),
        CallerKind::KubernetesServiceAccount {
            namespace: ns.into(),
            service_account: name.into(),
            pod: None,
            node: None,
        },
    )
}

fn mtls(path: &str, dns: &[&str]) -> AuthenticatedCaller {
    AuthenticatedCaller::for_tests(
        id(path),
        CallerKind::Mtls {
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            serial: "01".into(),
            leaf_sha256: [7; 32],
        },
    )
}

fn admin() -> AuthenticatedCaller {
    AuthenticatedCaller::for_tests(id("/signet/admin"), CallerKind::Admin)
}

fn names(uris: &[&str], dns: &[&str]) -> RequestedNames {
    RequestedNames {
        uris: uris.iter().map(|s| s.to_string()).collect(),
        dns_names: dns.iter().map(|s| s.to_string()).collect(),
        ..RequestedNames::default()
    }
}

fn decide(
    caller: &AuthenticatedCaller,
    names: &RequestedNames,
    ttl: i64,
    imp: Option<&str>,
) -> Result<Grant, Denial> {
    policy().decide(
        caller,
        &IssueRequest {
            source: GrantSource::Caller,
            names,
            ttl_seconds: ttl,
            impersonate: imp,
            renewal: test_basis(caller).as_ref(),
        },
        NOW,
    )
}

/// What re-checking an mTLS test caller's presented certificate would allow: its own
/// names, up to a day. None for other callers.
fn test_basis(caller: &AuthenticatedCaller) -> Option<RenewalBasis> {
    match caller.kind() {
        CallerKind::Mtls { dns_names, .. } => Some(RenewalBasis::for_tests(
            caller,
            dns_names.clone(),
            24 * HOUR,
        )),
        _ => None,
    }
}

fn denied(r: Result<Grant, Denial>, kind: DenialKind, reason: &str) -> String {
    let d = r.expect_err("denied");
    assert_eq!(d.kind, kind, "{d:?}");
    assert_eq!(d.reason, reason, "{d:?}");
    assert_eq!(d.to_string(), d.message);
    d.message
}

// ---- nodes ----

fn node(name: &str) -> AuthenticatedCaller {
    AuthenticatedCaller::for_tests(
        id(&format!("/signet/node/{name}")),
        CallerKind::Node {
            node_id: name.into(),
            serial: Some("01".into()),
            leaf_sha256: Some([7; 32]),
        },
    )
}

fn entry(parent: &str, ttl: i64) -> EntryGrant {
    EntryGrant {
        entry_id: "e1".into(),
        spiffe_id: id("/app"),
        parent_id: id(&format!("/signet/node/{parent}")),
        dns_names: vec!["app.example.org".into()],
        ttl_seconds: ttl,
        node_set: None,
    }
}

fn decide_src(
    caller: &AuthenticatedCaller,
    names: &RequestedNames,
    source: GrantSource<'_>,
    imp: Option<&str>,
) -> Result<Grant, Denial> {
    policy().decide(
        caller,
        &IssueRequest {
            source,
            names,
            ttl_seconds: 0,
            impersonate: imp,
            renewal: test_basis(caller).as_ref(),
        },
        NOW,
    )
}

// ---- the Kubernetes bridge ----

fn bridge() -> AuthenticatedCaller {
    sa("signet-system", "signet-k8s")
}

fn decide_bridge(
    caller: &AuthenticatedCaller,
    ns: &str,
    uris: &[&str],
    dns: &[&str],
) -> Result<Grant, Denial> {
    decide_src(
        caller,
        &names(uris, dns),
        GrantSource::Bridge { namespace: ns },
        None,
    )
}

// ---- renewal over mTLS ----

fn decide_with(
    caller: &AuthenticatedCaller,
    n: &RequestedNames,
    ttl: i64,
    renewal: Option<&RenewalBasis>,
) -> Result<Grant, Denial> {
    policy().decide(
        caller,
        &IssueRequest {
            source: GrantSource::Caller,
            names: n,
            ttl_seconds: ttl,
            impersonate: None,
            renewal,
        },
        NOW,
    )
}
