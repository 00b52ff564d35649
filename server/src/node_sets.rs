//! Node sets as the server decides them: which sets a node is a member of, now. Pure; the
//! callers read the rows (the node, and the sets once per request) and pass them in.
//!
//! A node is a member of a set when it is not banned and the selectors its last attestation
//! proved include every selector the set requires ([`signet_types::node_set::is_member`]).
//! Membership is never stored: it is decided again at every sync, every watch wake-up, every
//! signing and every renewal, so a node that re-attests with other selectors, or is banned,
//! leaves a set at once.
//!
//! The node selectors a node proves are written here too ([`join_token_selectors`],
//! [`psat_selectors`]): the one place that says what each attestation method proves.

use signet_types::node_set::{NodeSelector, NodeSetName, is_member, node_set_of};
use signet_types::{SpiffeId, TrustDomain};

use crate::store::{NodeRow, NodeSetRow};

/// Reads stored selectors; one that no longer reads is left out (and logged), so it can only
/// ever narrow a membership.
fn read(what: &str, list: &[String]) -> Vec<NodeSelector> {
    list.iter()
        .filter_map(|s| match NodeSelector::parse(s) {
            Ok(sel) => Some(sel),
            Err(e) => {
                tracing::error!(owner = %what, error = %e, "a stored node selector does not read; ignored");
                None
            }
        })
        .collect()
}

/// Whether `node` is a member of `set` now: not banned, and its selectors include all of the
/// set's.
pub fn is_member_now(node: &NodeRow, set: &NodeSetRow) -> bool {
    if node.banned_at.is_some() {
        return false;
    }
    let required = read(&set.name, &set.selectors);
    // A set whose selectors no longer all read matches nobody.
    if required.len() != set.selectors.len() {
        return false;
    }
    is_member(&required, &read(&node.node_id, &node.selectors))
}

/// The SPIFFE ID a node set's entries name as parent.
pub fn set_id(td: &TrustDomain, name: &str) -> Option<SpiffeId> {
    NodeSetName::new(name).ok()?.spiffe_id(td).ok()
}

/// The parents whose entries `node` receives now: its own SPIFFE ID first, then the IDs of
/// the sets (of `sets`, all of them, as read once for the request) it is a member of.
pub fn parents_of(td: &TrustDomain, node: &NodeRow, sets: &[NodeSetRow]) -> Vec<String> {
    let mut out = vec![node.spiffe_id.clone()];
    out.extend(
        sets.iter()
            .filter(|s| is_member_now(node, s))
            .filter_map(|s| set_id(td, &s.name))
            .map(|id| id.to_string()),
    );
    out
}

/// Whether the calling node is, now, a member of the node set an entry names as parent. Only
/// [`NodeSetMembership::decide`] makes one (a proof by field visibility): the signing policy
/// admits an entry of a node set on it alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSetMembership {
    set: SpiffeId,
    name: String,
    member: bool,
}

impl NodeSetMembership {
    /// For an entry whose parent is `parent`: None when that is not a node set of `td`; else
    /// whether `node` is a member of `set` (the set as read now; None: it does not exist, so
    /// nobody is a member).
    pub fn decide(
        td: &TrustDomain,
        parent: &SpiffeId,
        set: Option<&NodeSetRow>,
        node: &NodeRow,
    ) -> Option<Self> {
        let name = node_set_of(parent, td)?;
        let member = set.is_some_and(|s| s.name == name.as_str() && is_member_now(node, s));
        Some(Self {
            set: parent.clone(),
            name: name.as_str().to_owned(),
            member,
        })
    }

    /// The set's SPIFFE ID (the entry's parent).
    pub fn set_id(&self) -> &SpiffeId {
        &self.set
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_member(&self) -> bool {
        self.member
    }
}

/// What a node attested with a join token proved: the method and its node ID, sorted.
pub fn join_token_selectors(node_id: &str) -> Vec<String> {
    let mut out = vec![
        format!("join_token:node_id:{node_id}"),
        format!(
            "signet:attestation:{}",
            crate::store::nodes::ATTESTATION_JOIN_TOKEN
        ),
    ];
    out.sort();
    out
}

/// What a node attested with a Kubernetes projected service-account token proved: the method,
/// the agent's namespace and service account, the node name, and the cluster
/// (`[nodes.kubernetes] cluster`) when configured; sorted.
pub fn psat_selectors(
    namespace: &str,
    service_account: &str,
    node_name: &str,
    cluster: Option<&str>,
) -> Vec<String> {
    let mut out = vec![
        format!(
            "signet:attestation:{}",
            crate::store::nodes::ATTESTATION_K8S_PSAT
        ),
        format!("k8s_psat:agent_ns:{namespace}"),
        format!("k8s_psat:agent_sa:{namespace}:{service_account}"),
        format!("k8s_psat:node_name:{node_name}"),
    ];
    if let Some(c) = cluster {
        out.push(format!("k8s_psat:cluster:{c}"));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn td() -> TrustDomain {
        TrustDomain::new("example.org").expect("td")
    }

    fn node(id: &str, selectors: &[&str]) -> NodeRow {
        NodeRow {
            node_id: id.into(),
            spiffe_id: format!("spiffe://example.org/signet/node/{id}"),
            attested_at: 1,
            banned_at: None,
            last_serial: "01".into(),
            not_after: 2,
            attestation: "k8s_psat".into(),
            selectors: selectors.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn set(name: &str, selectors: &[&str]) -> NodeSetRow {
        NodeSetRow {
            name: name.into(),
            selectors: selectors.iter().map(|s| (*s).to_owned()).collect(),
            created_at: 1,
        }
    }

    #[test]
    fn a_node_receives_its_own_entries_and_those_of_the_sets_it_belongs_to() {
        let n = node(
            "k8s-w1",
            &psat_selectors("signet-system", "signet-agent", "w1", Some("prod"))
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        let sets = [
            set("prod", &["k8s_psat:cluster:prod"]),
            set("dev", &["k8s_psat:cluster:dev"]),
            set(
                "w1-prod",
                &["k8s_psat:cluster:prod", "k8s_psat:node_name:w1"],
            ),
        ];
        assert_eq!(
            parents_of(&td(), &n, &sets),
            [
                "spiffe://example.org/signet/node/k8s-w1",
                "spiffe://example.org/signet/nodeset/prod",
                "spiffe://example.org/signet/nodeset/w1-prod",
            ]
        );
        let mut banned = n.clone();
        banned.banned_at = Some(3);
        assert_eq!(
            parents_of(&td(), &banned, &sets),
            [banned.spiffe_id.clone()]
        );
    }

    #[test]
    fn unreadable_stored_selectors_only_narrow() {
        let n = node("n", &["join_token:node_id:n", "bogus"]);
        assert!(is_member_now(&n, &set("a", &["join_token:node_id:n"])));
        assert!(!is_member_now(&n, &set("b", &["bogus"])));
        assert!(!is_member_now(
            &n,
            &set("c", &["join_token:node_id:n", "bogus"])
        ));
    }

    #[test]
    fn membership_is_decided_for_node_set_parents_only() {
        let n = node(
            "a",
            &join_token_selectors("a")
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        let s = set("ab", &["signet:attestation:join_token"]);
        let parent = set_id(&td(), "ab").expect("id");
        let m = NodeSetMembership::decide(&td(), &parent, Some(&s), &n).expect("a set");
        assert!(m.is_member());
        assert_eq!((m.name(), m.set_id()), ("ab", &parent));
        // The set is gone: nobody is a member.
        let m = NodeSetMembership::decide(&td(), &parent, None, &n).expect("a set");
        assert!(!m.is_member());
        // Another set's row does not count.
        let other = set("cd", &["signet:attestation:join_token"]);
        assert!(
            !NodeSetMembership::decide(&td(), &parent, Some(&other), &n)
                .expect("a set")
                .is_member()
        );
        let own: SpiffeId = n.spiffe_id.parse().expect("id");
        assert_eq!(NodeSetMembership::decide(&td(), &own, Some(&s), &n), None);
    }

    #[test]
    fn attestation_selectors_are_sorted_and_read() {
        let j = join_token_selectors("vm_7");
        assert_eq!(
            j,
            ["join_token:node_id:vm_7", "signet:attestation:join_token"]
        );
        let p = psat_selectors("ns", "sa", "node-1", None);
        assert_eq!(p.len(), 4);
        let mut sorted = p.clone();
        sorted.sort();
        assert_eq!(p, sorted);
        for s in j
            .iter()
            .chain(&p)
            .chain(&psat_selectors("ns", "sa", "n", Some("c.example")))
        {
            NodeSelector::parse(s).expect(s);
        }
    }
}
