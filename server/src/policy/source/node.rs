//! The node API: a node's own node identity (Attest, RenewNode) and its registration
//! entries' workload identities (SignWorkloads); and the refusal of a node anywhere else.

use signet_types::SpiffeId;
use signet_types::untrusted::shown;

use super::{Ctx, Resolver, dns_refused, fixed, unexpected_caller};
use crate::policy::{Denial, EntryGrant, is_reserved};
use crate::provenance::{Provenance, Source};

/// A node's own node identity: after attesting (`attestation` is the method) or renewing
/// (`renewal`). No DNS names.
pub(super) struct NodeIdentity<'a> {
    pub(super) attestation: &'a str,
    /// The caller's node ID; `None` if the caller is not a node (refused).
    pub(super) node_id: Option<&'a str>,
}

impl Resolver for NodeIdentity<'_> {
    fn admit(&self, cx: &Ctx<'_>) -> Result<(), Denial> {
        admit_node(cx, self.node_id)
    }

    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        fixed(cx, cx.caller_id().clone(), uri, false)
    }

    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial> {
        Err(dns_refused(cx, name, NODE_DNS))
    }

    fn owns_reserved(&self, cx: &Ctx<'_>, id: &SpiffeId) -> bool {
        id == cx.caller_id()
    }

    fn provenance(&self, cx: &Ctx<'_>, now: i64) -> Result<Provenance, Denial> {
        let node_id = self.node_id.ok_or_else(|| unexpected_caller(cx))?;
        let source = Source::Node {
            node_id: node_id.to_owned(),
            attestation: self.attestation.to_owned(),
        };
        Ok(Provenance::new(source, now))
    }
}

/// A node asking for a workload identity of one of its registration entries: the entry's
/// identity, DNS names and TTL, only if the entry is parented to that node, or to a node set
/// the node is a member of now.
pub(super) struct Entry<'a> {
    pub(super) entry: &'a EntryGrant,
    /// The caller's node ID; `None` if the caller is not a node (refused).
    pub(super) node_id: Option<&'a str>,
}

impl Resolver for Entry<'_> {
    fn admit(&self, cx: &Ctx<'_>) -> Result<(), Denial> {
        admit_node(cx, self.node_id)?;
        let e = self.entry;
        match &e.node_set {
            // A node set's entry: the caller must be a member now (the proof says, for this
            // very parent).
            Some(m) if m.set_id() == &e.parent_id && !m.is_member() => {
                return Err(Denial::denied(
                    "policy.entry",
                    format!(
                        "node {} is not a member of node set {} (the parent of entry {}): its \
                         attested node selectors do not include all of the set's, it is banned, \
                         or the set is gone",
                        cx.caller_id(),
                        m.name(),
                        shown(&e.entry_id)
                    ),
                ));
            }
            Some(m) if m.set_id() == &e.parent_id => {}
            _ if &e.parent_id != cx.caller_id() => {
                return Err(Denial::denied(
                    "policy.entry",
                    format!(
                        "entry {} is not parented to node {}",
                        shown(&e.entry_id),
                        cx.caller_id()
                    ),
                ));
            }
            _ => {}
        }
        if is_reserved(&e.spiffe_id) {
            return Err(Denial::denied(
                "policy.entry",
                format!(
                    "entry {} names {}, which is reserved for Signet",
                    shown(&e.entry_id),
                    e.spiffe_id
                ),
            ));
        }
        Ok(())
    }

    fn requested_ttl(&self, _: &Ctx<'_>) -> i64 {
        self.entry.ttl_seconds
    }

    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        fixed(cx, self.entry.spiffe_id.clone(), uri, false)
    }

    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial> {
        if self
            .entry
            .dns_names
            .iter()
            .any(|d| d.eq_ignore_ascii_case(name))
        {
            return Ok(());
        }
        Err(dns_refused(cx, name, NODE_DNS))
    }

    fn provenance(&self, cx: &Ctx<'_>, now: i64) -> Result<Provenance, Denial> {
        let node_id = self.node_id.ok_or_else(|| unexpected_caller(cx))?;
        let source = Source::Entry {
            entry_id: self.entry.entry_id.clone(),
            node_id: node_id.to_owned(),
        };
        Ok(Provenance::new(source, now))
    }
}

/// A node on an ordinary API (SignCsr, Istio): refused. Its identity is renewed only where
/// the ban is checked (RenewNode), and it never impersonates.
pub(super) struct NodeOutsideNodeApi;

impl Resolver for NodeOutsideNodeApi {
    fn admit(&self, cx: &Ctx<'_>) -> Result<(), Denial> {
        Err(Denial::denied(
            "policy.node",
            format!(
                "caller {} is a node: it renews its identity with signet.agent.v1.Node/RenewNode \
                 and obtains workload identities with SignWorkloads, not through this API",
                cx.caller_id()
            ),
        ))
    }

    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        fixed(cx, cx.caller_id().clone(), uri, false)
    }

    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial> {
        Err(dns_refused(cx, name, NODE_DNS))
    }

    fn provenance(&self, cx: &Ctx<'_>, _now: i64) -> Result<Provenance, Denial> {
        Err(unexpected_caller(cx))
    }
}

/// The node API's sources: a node, never on behalf of another identity.
fn admit_node(cx: &Ctx<'_>, node_id: Option<&str>) -> Result<(), Denial> {
    if node_id.is_none() {
        return Err(Denial::denied(
            "policy.node",
            format!(
                "caller {} is not a node; only node identities use the node API",
                cx.caller_id()
            ),
        ));
    }
    if cx.req.impersonated().is_some() {
        return Err(Denial::denied(
            "policy.impersonation",
            "a node never asks on behalf of another identity",
        ));
    }
    Ok(())
}

const NODE_DNS: &str =
    "a node's own identity carries no DNS names; a workload's are its registration entry's";
