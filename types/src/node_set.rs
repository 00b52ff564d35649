//! Node sets: a named set of nodes that an entry can name as its parent, so that one entry
//! serves a workload on whichever member node it runs.
//!
//! A node set's SPIFFE ID is `spiffe://<td>/signet/nodeset/<name>`; it is never presented by
//! anyone (no certificate carries it): it is only the value an entry's `parent_id` holds.
//! Membership is decided by the server from the selectors a node's attestation proved
//! ([`NodeSelector`]), at every sync and every signing. Invariant: a [`NodeSetName`] is 1–64
//! of `[a-z0-9-]` starting with a letter or digit, so it is one SPIFFE ID path segment, and
//! [`NodeSetName::spiffe_id`] and [`node_set_of`] are each other's inverse.

use std::fmt;

use crate::untrusted::quoted;
use crate::{SpiffeId, SpiffeIdError, TrustDomain};

/// Node set SPIFFE IDs live under this path: `spiffe://<td>/signet/nodeset/<name>`.
pub const NODE_SET_PATH_PREFIX: &str = "/signet/nodeset/";

/// How an operator names a node set as a parent: `nodeset:<name>`.
pub const NODE_SET_PARENT_PREFIX: &str = "nodeset:";

/// Longest node set name accepted.
pub const MAX_NODE_SET_NAME: usize = 64;

/// Most selectors one node set may require.
pub const MAX_NODE_SET_SELECTORS: usize = 16;

/// Why a string is not a node set name or a node selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeSetError {
    /// The input, quoted and cut short.
    #[error(
        "node set name {0} must be 1 to {MAX_NODE_SET_NAME} of lowercase letters, digits and \
         '-', starting with a letter or digit"
    )]
    Name(String),
    /// The input, quoted and cut short.
    #[error(
        "node selector {0} is not one of signet:attestation:<join_token|k8s_psat>, \
         k8s_psat:cluster:<name>, k8s_psat:agent_ns:<namespace>, \
         k8s_psat:agent_sa:<namespace>:<service account>, k8s_psat:node_name:<node>, \
         join_token:node_id:<node id>"
    )]
    Selector(String),
}

/// A node set's name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeSetName(String);

impl NodeSetName {
    pub fn new(name: &str) -> Result<Self, NodeSetError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NODE_SET_NAME
            && !name.starts_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(NodeSetError::Name(quoted(name)))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `spiffe://<td>/signet/nodeset/<name>`: what an entry's `parent_id` holds.
    /// (A valid name is one valid path segment; the error is only a too-long trust domain.)
    pub fn spiffe_id(&self, td: &TrustDomain) -> Result<SpiffeId, SpiffeIdError> {
        td.id(&format!("{NODE_SET_PATH_PREFIX}{}", self.0))
    }
}

impl fmt::Display for NodeSetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeSetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeSetName({:?})", self.0)
    }
}

/// The node set a parent SPIFFE ID of `td` names, if it names one.
pub fn node_set_of(id: &SpiffeId, td: &TrustDomain) -> Option<NodeSetName> {
    if !id.is_member_of(td) {
        return None;
    }
    let rest = id.path().strip_prefix(NODE_SET_PATH_PREFIX)?;
    NodeSetName::new(rest).ok()
}

/// A fact a node's attestation proved, as node sets select on it. Kept as its canonical text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeSelector(String);

impl NodeSelector {
    /// Parses one of the forms [`NodeSetError::Selector`] lists. Values are checked as the
    /// thing they name: a Kubernetes namespace or service account is a DNS-1123 label, a
    /// cluster or node name a DNS-1123 subdomain, a node ID a [`crate::node::NodeId`].
    pub fn parse(s: &str) -> Result<Self, NodeSetError> {
        use crate::dns::{Dns1123Label, Dns1123Subdomain};
        let bad = || NodeSetError::Selector(quoted(s));
        let (kind, value) = s
            .strip_prefix("signet:attestation:")
            .map(|v| ("attestation", v))
            .or_else(|| s.strip_prefix("k8s_psat:cluster:").map(|v| ("cluster", v)))
            .or_else(|| {
                s.strip_prefix("k8s_psat:agent_ns:")
                    .map(|v| ("agent_ns", v))
            })
            .or_else(|| {
                s.strip_prefix("k8s_psat:agent_sa:")
                    .map(|v| ("agent_sa", v))
            })
            .or_else(|| {
                s.strip_prefix("k8s_psat:node_name:")
                    .map(|v| ("node_name", v))
            })
            .or_else(|| {
                s.strip_prefix("join_token:node_id:")
                    .map(|v| ("node_id", v))
            })
            .ok_or_else(bad)?;
        let ok = match kind {
            "attestation" => matches!(value, "join_token" | "k8s_psat"),
            "cluster" | "node_name" => Dns1123Subdomain::is_valid(value),
            "agent_ns" => Dns1123Label::is_valid(value),
            "agent_sa" => value.split_once(':').is_some_and(|(ns, sa)| {
                Dns1123Label::is_valid(ns) && Dns1123Subdomain::is_valid(sa)
            }),
            _ => crate::node::NodeId::new(value).is_ok(),
        };
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(bad())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeSelector({:?})", self.0)
    }
}

/// Whether a node that proved `node` belongs to a set that requires `required`: every
/// required selector is among the node's (an empty requirement matches nobody).
pub fn is_member(required: &[NodeSelector], node: &[NodeSelector]) -> bool {
    !required.is_empty() && required.iter().all(|r| node.contains(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn td() -> TrustDomain {
        TrustDomain::new("example.org").expect("td")
    }

    #[test]
    fn names_round_trip_through_their_spiffe_id() {
        for n in ["k8s", "prod-eu-1", "0", &"a".repeat(64)] {
            let name = NodeSetName::new(n).expect(n);
            let id = name.spiffe_id(&td()).expect("id");
            assert_eq!(
                id.to_string(),
                format!("spiffe://example.org/signet/nodeset/{n}")
            );
            assert_eq!(node_set_of(&id, &td()), Some(name));
        }
        for n in ["", "-a", "A", "a_b", "a.b", "a/b", &"a".repeat(65)] {
            assert!(NodeSetName::new(n).is_err(), "{n:?}");
        }
        let other = TrustDomain::new("other.org").expect("td");
        let id = NodeSetName::new("k8s")
            .expect("name")
            .spiffe_id(&other)
            .expect("id");
        assert_eq!(node_set_of(&id, &td()), None);
        let node: SpiffeId = "spiffe://example.org/signet/node/k8s".parse().expect("id");
        assert_eq!(node_set_of(&node, &td()), None);
    }

    #[test]
    fn selectors_are_checked_as_what_they_name() {
        for s in [
            "signet:attestation:k8s_psat",
            "signet:attestation:join_token",
            "k8s_psat:cluster:prod.eu",
            "k8s_psat:agent_ns:signet-system",
            "k8s_psat:agent_sa:signet-system:signet-agent",
            "k8s_psat:node_name:ip-10-0-0-1.ec2.internal",
            "join_token:node_id:vm_7",
        ] {
            assert_eq!(NodeSelector::parse(s).expect(s).as_str(), s);
        }
        for s in [
            "",
            "signet:attestation:x509pop",
            "k8s_psat:cluster:",
            "k8s_psat:agent_ns:Kube",
            "k8s_psat:agent_sa:ns-only",
            "k8s_psat:node_name:a b",
            "join_token:node_id:..",
            "unix:uid:0",
        ] {
            let err = NodeSelector::parse(s).expect_err(s);
            assert!(err.to_string().contains("signet:attestation:"), "{err}");
        }
    }

    #[test]
    fn a_member_proves_every_required_selector() {
        let sel = |s: &str| NodeSelector::parse(s).expect(s);
        let node = [
            sel("signet:attestation:k8s_psat"),
            sel("k8s_psat:cluster:prod"),
        ];
        assert!(is_member(&[sel("k8s_psat:cluster:prod")], &node));
        assert!(is_member(&node, &node));
        assert!(!is_member(&[sel("k8s_psat:cluster:dev")], &node));
        assert!(!is_member(
            &[sel("k8s_psat:cluster:prod"), sel("k8s_psat:node_name:n1")],
            &node
        ));
        assert!(!is_member(&[], &node));
    }
}
