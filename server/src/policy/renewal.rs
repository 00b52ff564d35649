//! Renewal over mTLS: what a certificate presented by its holder may be renewed into.
//!
//! The TLS layer proved that the caller holds a certificate that chains to this CA. That alone
//! is not enough to renew it: the authority it was issued under may be gone (the entry
//! deleted, its node banned, the service-account token long expired). So every mTLS request is
//! decided together with a [`RenewalBasis`], which only [`assess`] builds, from
//!
//! 1. the presented certificate's ledger row (by serial): it must be there, be this very
//!    certificate (same SHA-256), name the caller's identity, and not be revoked;
//! 2. the row's provenance, re-checked by source ([`crate::provenance`] has the table): an
//!    `entry` still exists with that identity under a node that is not banned (for a node
//!    set's entry: that node is still a member of the set, now), and (like a
//!    `service_account` or `admin` authorization) was delivered through the node API less than
//!    `policy.mtls_renewal_max_age` ago (carried forward through renewals, so every chain
//!    ends); any other source (the bridge, an
//!    impersonator, a node's own SVID, the server) and any row without provenance cannot renew
//!    over mTLS.
//!
//! The basis then bounds the new certificate: the same identity, only the presented DNS names
//! that the source still allows, and a lifetime no longer than the source allows.
//!
//! Pure: the issuer looks the rows up (see [`entry_to_check`]) and passes them in.

use std::time::Duration;

use signet_types::SpiffeId;

use super::{Denial, Policy};
use crate::authn::{AuthenticatedCaller, CallerKind};
use crate::issuance::BACKDATE;
use crate::provenance::{Provenance, ProvenanceError, Source};
use crate::store::{EntryRow, LedgerRecord, NodeRow, NodeSetRow};

/// What a presented certificate may be renewed into. Only [`assess`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewalBasis {
    serial: String,
    spiffe_id: SpiffeId,
    source: Source,
    authorized_at: i64,
    dns_names: Vec<String>,
    max_ttl: Duration,
}

impl RenewalBasis {
    /// The presented certificate's serial.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }

    /// The DNS names a renewal may carry.
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// The longest lifetime a renewal may have.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// The provenance of the renewed certificate: the same source, the same moment of
    /// authorization, and the serial it renews.
    pub fn carried_forward(&self) -> Provenance {
        Provenance {
            source: self.source.clone(),
            authorized_at: self.authorized_at,
            renewed_from: Some(self.serial.clone()),
        }
    }
}

#[cfg(test)]
impl RenewalBasis {
    /// A basis as [`assess`] would make it for `caller` (an mTLS caller) from an admin-sourced
    /// row, for policy tests.
    pub(crate) fn for_tests(
        caller: &AuthenticatedCaller,
        dns_names: Vec<String>,
        max_ttl: Duration,
    ) -> Self {
        let serial = match caller.kind() {
            CallerKind::Mtls { serial, .. } => serial.clone(),
            _ => String::new(),
        };
        Self {
            serial,
            spiffe_id: caller.spiffe_id().clone(),
            source: Source::Admin,
            authorized_at: 0,
            dns_names,
            max_ttl,
        }
    }
}

/// For a row whose source is a registration entry: the entry ID and node ID to look up.
pub fn entry_to_check(row: &LedgerRecord) -> Option<(String, String)> {
    match Provenance::from_ledger_text(&row.entry.provenance) {
        Ok(Provenance {
            source: Source::Entry { entry_id, node_id },
            ..
        }) => Some((entry_id, node_id)),
        _ => None,
    }
}

/// The registration entry of an entry-sourced row and its parent node's row, as found now
/// (`None` when gone).
#[derive(Debug, Clone, Copy, Default)]
pub struct EntryFacts<'a> {
    pub entry: Option<&'a EntryRow>,
    pub node: Option<&'a NodeRow>,
    /// When the entry's parent is a node set: that set as found now (`None` when gone, or
    /// when the parent is a node).
    pub node_set: Option<&'a NodeSetRow>,
}

fn refused(message: String) -> Denial {
    Denial::denied("policy.renewal", message)
}

/// The presented certificate's ledger row checks: present, this very certificate, the caller's
/// identity, not revoked. Shared by workload renewal and the node API.
pub fn check_presented(
    caller: &AuthenticatedCaller,
    serial: &str,
    leaf_sha256: &[u8; 32],
    row: Option<&LedgerRecord>,
) -> Result<(), Denial> {
    let Some(row) = row else {
        return Err(refused(format!(
            "the presented certificate (serial {serial}) is not in this CA's ledger, so it \
             cannot be renewed; authenticate with the credential it was issued for"
        )));
    };
    if &row.entry.cert_sha256 != leaf_sha256 {
        return Err(refused(format!(
            "the presented certificate is not the one this CA recorded under serial {serial}"
        )));
    }
    if row.entry.spiffe_id != caller.spiffe_id().to_string() {
        return Err(refused(format!(
            "the ledger records serial {serial} for {}, not {}",
            row.entry.spiffe_id,
            caller.spiffe_id()
        )));
    }
    if let Some(revoked) = &row.revocation {
        return Err(refused(format!(
            "the presented certificate (serial {serial}) was revoked at {}",
            revoked.at
        )));
    }
    Ok(())
}

/// Decides what the mTLS `caller` may renew its presented certificate into, from its ledger
/// `row` and, for an entry-sourced row, the entry and node as they are now. `now` is unix
/// seconds.
pub fn assess(
    policy: &Policy,
    caller: &AuthenticatedCaller,
    row: Option<&LedgerRecord>,
    facts: EntryFacts<'_>,
    now: i64,
) -> Result<RenewalBasis, Denial> {
    let CallerKind::Mtls {
        serial,
        leaf_sha256,
        ..
    } = caller.kind()
    else {
        return Err(Denial::invalid(
            "policy.renewal",
            "only a caller presenting a certificate over mTLS renews it",
        ));
    };
    check_presented(caller, serial, leaf_sha256, row)?;
    let Some(row) = row else {
        return Err(refused(format!("serial {serial} is not in the ledger")));
    };
    let provenance = Provenance::from_ledger_text(&row.entry.provenance).map_err(|e| match e {
        ProvenanceError::Missing => refused(format!(
            "the presented certificate (serial {serial}) was issued before this CA recorded \
             where a certificate's authority comes from, so its source cannot be re-checked; \
             obtain a new one with the credential it was issued for"
        )),
        ProvenanceError::Malformed(m) => {
            tracing::error!(serial = %serial, error = %m, "ledger row has unreadable provenance");
            refused(format!(
                "the ledger row of serial {serial} cannot be read, so the certificate cannot be \
                 renewed"
            ))
        }
    })?;
    let presented_lifetime = Duration::from_secs(
        u64::try_from(row.entry.not_after.saturating_sub(row.entry.not_before))
            .unwrap_or(0)
            .saturating_sub(BACKDATE.as_secs()),
    );
    let within_age = |what: &str| -> Result<(), Denial> {
        let age = now.saturating_sub(provenance.authorized_at);
        let max = policy.mtls_renewal_max_age();
        if u64::try_from(age).unwrap_or(0) > max.as_secs() {
            return Err(refused(format!(
                "{what} that authorized this certificate was checked {} ago, longer than \
                 policy.mtls_renewal_max_age ({}); authenticate with it again instead of renewing \
                 over mTLS",
                humantime::format_duration(Duration::from_secs(u64::try_from(age).unwrap_or(0))),
                humantime::format_duration(max)
            )));
        }
        Ok(())
    };
    let presented_dns = &row.entry.dns_names;
    let (dns_names, max_ttl, authorized_at) = match &provenance.source {
        Source::ServiceAccount {
            namespace,
            service_account,
            ..
        } => {
            within_age("the service-account token")?;
            let own = format!("/ns/{namespace}/sa/{service_account}");
            if caller.spiffe_id().path() != own {
                return Err(refused(format!(
                    "the ledger records serial {serial} for service account \
                     {namespace}/{service_account}, which is not {}",
                    caller.spiffe_id()
                )));
            }
            let names = presented_dns
                .iter()
                .filter(|n| policy.service_account_may_have(n, namespace, service_account))
                .cloned()
                .collect();
            (names, presented_lifetime, provenance.authorized_at)
        }
        Source::Admin => {
            within_age("the operator's mint")?;
            (
                presented_dns.clone(),
                presented_lifetime,
                provenance.authorized_at,
            )
        }
        Source::Entry { entry_id, node_id } => {
            let gone = || {
                refused(format!(
                    "registration entry {entry_id} that authorized this certificate no longer \
                     exists for {}",
                    caller.spiffe_id()
                ))
            };
            let entry = facts.entry.ok_or_else(gone)?;
            if entry.id != *entry_id || entry.spiffe_id != caller.spiffe_id().to_string() {
                return Err(gone());
            }
            let node_spiffe_id = signet_types::node::node_spiffe_id(policy.trust_domain(), node_id)
                .map_err(|e| refused(format!("entry {entry_id}: {e}")))?;
            let own = entry.parent_id == node_spiffe_id.to_string();
            let set = if own {
                None
            } else {
                let parent: Option<SpiffeId> = entry.parent_id.parse().ok();
                let name = parent
                    .as_ref()
                    .and_then(|p| signet_types::node_set::node_set_of(p, policy.trust_domain()));
                match name {
                    Some(name) => Some(name),
                    None => {
                        return Err(refused(format!(
                            "registration entry {entry_id} is no longer parented to node \
                             {node_id}"
                        )));
                    }
                }
            };
            match facts.node {
                None => {
                    return Err(refused(format!(
                        "node {node_id}, the parent of entry {entry_id}, is not attested"
                    )));
                }
                Some(n) if n.banned_at.is_some() => {
                    let role = match &set {
                        Some(name) => format!("the member of node set {name} that delivered"),
                        None => "the parent of".to_owned(),
                    };
                    return Err(refused(format!(
                        "node {node_id}, {role} entry {entry_id}, is banned; its workloads' \
                         certificates cannot be renewed"
                    )));
                }
                Some(n) => {
                    // A node set's entry: the node that got it delivered must still be a
                    // member of the set, now.
                    if let Some(name) = &set {
                        let member = facts.node_set.is_some_and(|s| {
                            s.name == name.as_str() && crate::node_sets::is_member_now(n, s)
                        });
                        if !member {
                            return Err(refused(format!(
                                "node {node_id} is no longer a member of node set {name}, the \
                                 parent of entry {entry_id} (or the set is gone); its \
                                 workloads' certificates for that entry cannot be renewed"
                            )));
                        }
                    }
                }
            }
            let names = presented_dns
                .iter()
                .filter(|n| entry.dns_names.iter().any(|d| d.eq_ignore_ascii_case(n)))
                .cloned()
                .collect();
            let ttl = match u64::try_from(entry.ttl_seconds) {
                Ok(0) | Err(_) => policy.default_ttl,
                Ok(s) => Duration::from_secs(s),
            };
            // The entry is re-checked live, and the chain still ages out: its authorization is
            // the delivery through the node API (carried forward), so a stolen certificate
            // cannot be renewed forever while the entry stands; the agent delivers afresh.
            within_age("the node API delivery")?;
            (names, ttl, provenance.authorized_at)
        }
        other => {
            let why = match other {
                Source::Bridge { namespace, .. } => format!(
                    "it was issued to the Kubernetes bridge for an object in namespace \
                     {namespace}; the bridge renews it"
                ),
                Source::Impersonated { impersonator } => {
                    format!(
                        "it was obtained by {impersonator} on this workload's behalf; ask it again"
                    )
                }
                Source::Node { .. } => {
                    "it is a node identity; nodes renew with signet.agent.v1.Node/RenewNode".into()
                }
                _ => "it is the CA server's own certificate".into(),
            };
            return Err(refused(format!(
                "the presented certificate (serial {serial}) cannot be renewed over mTLS: {why}"
            )));
        }
    };
    Ok(RenewalBasis {
        serial: serial.clone(),
        spiffe_id: caller.spiffe_id().clone(),
        source: provenance.source,
        authorized_at,
        dns_names,
        max_ttl,
    })
}

/// For a node calling the node API with its node SVID: the presented certificate must be this
/// CA's record of that node's identity (rows written before provenance was recorded are
/// accepted on their identity alone, so agents keep working across the upgrade).
pub fn assess_node(caller: &AuthenticatedCaller, row: Option<&LedgerRecord>) -> Result<(), Denial> {
    let CallerKind::Node {
        node_id,
        serial: Some(serial),
        leaf_sha256: Some(sha),
    } = caller.kind()
    else {
        return Err(Denial::invalid(
            "policy.renewal",
            "the node API takes the node SVID over mTLS",
        ));
    };
    check_presented(caller, serial, sha, row)?;
    let provenance = row.map(|r| Provenance::from_ledger_text(&r.entry.provenance));
    match provenance {
        Some(Err(ProvenanceError::Missing)) => Ok(()),
        Some(Ok(Provenance {
            source: Source::Node { node_id: n, .. },
            ..
        })) if &n == node_id => Ok(()),
        _ => Err(refused(format!(
            "the presented certificate (serial {serial}) was not issued as node {node_id}'s identity"
        ))),
    }
}

#[cfg(test)]
#[path = "renewal_tests.rs"]
mod tests;
