//! Node attestation with a Kubernetes projected service-account token (PSAT).
//!
//! The agent runs as a DaemonSet and presents its projected token (`authorization: Bearer`).
//! The token is validated offline by [`JwtAuthenticator`] (same issuer and JWKS as workload
//! tokens) against the *node* audiences, which configuration keeps apart from the workload
//! audiences, so a workload's token can never attest a node. Then the checks here, pure:
//! the token's service account is one of `nodes.kubernetes.allowed_service_accounts`, and the
//! token is bound to a pod on a node (`kubernetes.io.node.name`). The node ID is derived from
//! that node name, so one DaemonSet pod can only ever become the node it runs on.

use std::time::SystemTime;

use signet_types::dns::Dns1123Subdomain;

use super::jwt::{JwtAuthenticator, VerifiedToken};
use super::{AuthnError, CallerKind};
use crate::config::NodesKubernetesConfig;

/// Node IDs of PSAT-attested nodes: `k8s-<node name>`.
pub const NODE_ID_PREFIX: &str = "k8s-";

/// Why a node token was refused: not a valid token at all (Unauthenticated), or a valid token
/// that may not attest a node (PermissionDenied). Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PsatRefusal {
    Unauthenticated(AuthnError),
    /// `caller` is the token's label (`jwt:<id>`) for the audit log.
    Denied {
        caller: String,
        reason: PsatDenial,
    },
}

/// Why a valid token may not attest a node ([`PsatAttestor::node_for`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PsatDenial {
    #[error("not a service-account token")]
    NotServiceAccount,
    /// `allowed` is `nodes.kubernetes.allowed_service_accounts`, joined.
    #[error(
        "service account {service_account} may not attest a node; nodes.kubernetes.\
         allowed_service_accounts lists {allowed}"
    )]
    ServiceAccount {
        service_account: String,
        allowed: String,
    },
    #[error(
        "the token of {0} is not bound to a node (no kubernetes.io.node.name claim): \
         mount a projected service-account token in the agent's pod (Kubernetes 1.30 \
         or later binds it to the node)"
    )]
    NoNode(String),
    /// The node name, cut to 64 characters.
    #[error(
        "node name {0:?} from the token does not make a node ID: a Kubernetes node name \
         is lowercase letters, digits, '-' and '.'"
    )]
    NodeName(String),
    #[error("node name from the token does not make a node ID: {0}")]
    NodeId(#[source] signet_types::node::NodeIdError),
}

/// A node proved by its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsatNode {
    pub node_id: String,
    pub node_name: String,
    /// `<namespace>:<serviceaccount>` of the token.
    pub service_account: String,
    pub pod: Option<String>,
    /// The node selectors the token proved, sorted (`crate::node_sets::psat_selectors`).
    pub selectors: Vec<String>,
}

/// `[nodes.kubernetes]`, ready to check tokens.
#[derive(Debug, Clone)]
pub struct PsatAttestor {
    allowed: Vec<String>,
    audiences: Vec<String>,
    /// `nodes.kubernetes.cluster`: proved as `k8s_psat:cluster:<name>` when set.
    cluster: Option<String>,
}

impl PsatAttestor {
    pub fn new(cfg: &NodesKubernetesConfig) -> Self {
        Self {
            allowed: cfg.allowed_service_accounts.clone(),
            audiences: cfg.audiences.clone(),
            cluster: cfg.cluster.clone(),
        }
    }

    /// Validates `token` at `now` and derives the node it may attest as.
    pub fn attest(
        &self,
        jwt: Option<&JwtAuthenticator>,
        token: &str,
        now: SystemTime,
    ) -> Result<PsatNode, PsatRefusal> {
        let Some(jwt) = jwt else {
            return Err(PsatRefusal::Unauthenticated(AuthnError::JwtNotConfigured));
        };
        let verified = jwt
            .authenticate_node_token(token, now, &self.audiences)
            .map_err(PsatRefusal::Unauthenticated)?;
        self.node_for(&verified)
            .map_err(|reason| PsatRefusal::Denied {
                caller: verified.caller.label(),
                reason,
            })
    }

    /// The claim checks on an already verified token: an allowed service account, bound to a
    /// node whose name makes a valid node ID.
    pub fn node_for(&self, t: &VerifiedToken) -> Result<PsatNode, PsatDenial> {
        let CallerKind::KubernetesServiceAccount {
            namespace,
            service_account,
            pod,
            ..
        } = t.caller.kind()
        else {
            return Err(PsatDenial::NotServiceAccount);
        };
        let sa = format!("{namespace}:{service_account}");
        if !self.allowed.contains(&sa) {
            return Err(PsatDenial::ServiceAccount {
                service_account: sa,
                allowed: self.allowed.join(", "),
            });
        }
        let Some(node_name) = t.node_name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(PsatDenial::NoNode(sa));
        };
        // A Kubernetes node name is an RFC 1123 subdomain (and its length is checked again
        // as a node ID's below).
        if !Dns1123Subdomain::is_valid(node_name) {
            return Err(PsatDenial::NodeName(
                node_name.chars().take(64).collect::<String>(),
            ));
        }
        let node_id = format!("{NODE_ID_PREFIX}{node_name}");
        crate::nodes::validate_node_id(&node_id).map_err(PsatDenial::NodeId)?;
        Ok(PsatNode {
            node_id,
            node_name: node_name.to_owned(),
            selectors: crate::node_sets::psat_selectors(
                namespace,
                service_account,
                node_name,
                self.cluster.as_deref(),
            ),
            service_account: sa,
            pod: pod.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authn::AuthenticatedCaller;

    fn attestor() -> PsatAttestor {
        PsatAttestor::new(&NodesKubernetesConfig {
            allowed_service_accounts: vec!["signet-system:signet-agent".into()],
            audiences: vec!["signet-node".into()],
            cluster: Some("prod".into()),
        })
    }

    fn token(ns: &str, sa: &str, node: Option<&str>) -> VerifiedToken {
        VerifiedToken {
            caller: AuthenticatedCaller::for_tests(
                format!("spiffe://example.org/ns/{ns}/sa/{sa}")
                    .parse()
                    .expect("id"),
                CallerKind::KubernetesServiceAccount {
                    namespace: ns.into(),
                    service_account: sa.into(),
                    pod: Some("signet-agent-x2k4q".into()),
                    node: node.map(str::to_owned),
                },
            ),
            node_name: node.map(str::to_owned),
        }
    }

    #[test]
    fn allowed_agent_on_a_node_gets_that_nodes_id() {
        let n = attestor()
            .node_for(&token("signet-system", "signet-agent", Some("worker-1")))
            .expect("ok");
        assert_eq!(n.node_id, "k8s-worker-1");
        assert_eq!(n.node_name, "worker-1");
        assert_eq!(n.service_account, "signet-system:signet-agent");
        assert_eq!(n.pod.as_deref(), Some("signet-agent-x2k4q"));
        assert_eq!(
            n.selectors,
            [
                "k8s_psat:agent_ns:signet-system",
                "k8s_psat:agent_sa:signet-system:signet-agent",
                "k8s_psat:cluster:prod",
                "k8s_psat:node_name:worker-1",
                "signet:attestation:k8s_psat",
            ]
        );
        // Dotted node names (FQDNs) are fine.
        let n = attestor()
            .node_for(&token(
                "signet-system",
                "signet-agent",
                Some("ip-10-0-0-1.ec2.internal"),
            ))
            .expect("ok");
        assert_eq!(n.node_id, "k8s-ip-10-0-0-1.ec2.internal");
    }

    #[test]
    fn other_service_accounts_are_refused() {
        for (ns, sa) in [
            ("default", "signet-agent"),
            ("signet-system", "default"),
            ("signet-system", "signet-k8s"),
        ] {
            let e = attestor()
                .node_for(&token(ns, sa, Some("worker-1")))
                .expect_err("refused")
                .to_string();
            assert!(
                e.contains(&format!("service account {ns}:{sa} may not attest")),
                "{e}"
            );
            assert!(e.contains("signet-system:signet-agent"), "{e}");
        }
    }

    #[test]
    fn a_token_not_bound_to_a_node_is_refused() {
        for node in [None, Some("")] {
            let e = attestor()
                .node_for(&token("signet-system", "signet-agent", node))
                .expect_err("refused")
                .to_string();
            assert!(e.contains("not bound to a node"), "{e}");
        }
    }

    #[test]
    fn node_names_that_make_no_node_id_are_refused() {
        // A label over 63 (`n.nnn…`) was accepted before issue 25 (the node-ID length held).
        let long_label = format!("n.{}", "n".repeat(64));
        for bad in [
            "a/b",
            "..",
            "x y",
            "Worker",
            "-a",
            &"n".repeat(130),
            &long_label,
        ] {
            let e = attestor()
                .node_for(&token("signet-system", "signet-agent", Some(bad)))
                .expect_err(bad)
                .to_string();
            assert!(e.contains("does not make a node ID"), "{e}");
        }
    }

    #[test]
    fn without_token_authentication_nothing_attests() {
        let r = attestor().attest(None, "x.y.z", SystemTime::UNIX_EPOCH);
        assert_eq!(
            r,
            Err(PsatRefusal::Unauthenticated(AuthnError::JwtNotConfigured))
        );
    }
}
