//! Registration: the entries a registrar (the Kubernetes bridge) keeps, and who may keep which.
//!
//! The bridge turns Signet's identity objects into registration entries whose parent is a node
//! set, through `signet.ca.v1.Registration` (`crate::api::registration`). This module is the
//! decision, pure: [`authorize`] takes the caller, its scope and entries, and the node sets
//! that exist, and answers an [`AuthorizedSync`] (only it makes one) or the first [`Denial`],
//! whose message names the entry's index and the rule. The store then applies the sync in one
//! transaction (`store::registration`).
//!
//! The rules, in order (the bridge's own rules are reused from the policy, never copied:
//! `policy::source::bridge`):
//! 1. the caller is a Kubernetes bridge ([`Policy::admit_bridge`]: listed in
//!    `policy.kubernetes_bridge.callers`, never a node, the operator or the server);
//! 2. the scope is 1–253 of `[A-Za-z0-9._:/-]`, at most [`MAX_SYNC_ENTRIES`] entries;
//! 3. per entry: its node set is listed in `policy.kubernetes_bridge.node_sets` and exists;
//!    the entry is one `CreateEntry` would accept under that parent
//!    ([`crate::nodes::validate_entry_under`]: selectors, TTLs, DNS name syntax, not under
//!    `/signet/`, not the server's names; federation names); its selectors hold exactly one
//!    `k8s:ns:<namespace>`; its SPIFFE ID is under `/ns/<namespace>/` (something below it) or
//!    under one of `policy.kubernetes_bridge.entry_path_prefixes`; each DNS name is allowed for
//!    that namespace by `policy.kubernetes_bridge.dns_templates`;
//! 4. no two entries are the same registration (SPIFFE ID, node set, sorted selectors).
//!
//! Malformed input is InvalidArgument, anything else PermissionDenied
//! ([`crate::policy::DenialKind`]); the API edge audits every refusal.

use std::collections::{BTreeSet, HashMap};

use signet_types::node_set::NodeSetName;
use signet_types::selector::Selector;
use signet_types::untrusted::quoted;

use crate::authn::AuthenticatedCaller;
use crate::config::KubernetesBridgeConfig;
use crate::nodes::{EntryError, ValidEntry, validate_entry_under};
use crate::policy::{Denial, Policy, check_namespace, is_under_namespace};

#[cfg(test)]
mod tests;

/// Most entries in one sync (as `BatchCreateEntries`).
pub const MAX_SYNC_ENTRIES: usize = crate::nodes::MAX_BATCH_ENTRIES;
/// Longest scope.
pub const MAX_SCOPE_LEN: usize = 253;

/// The Registration service's settings (`[policy.kubernetes_bridge]` `node_sets`,
/// `entry_path_prefixes`, `max_owned_entries`), validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registrar {
    node_sets: Vec<NodeSetName>,
    path_prefixes: Vec<String>,
    max_owned_entries: u32,
}

impl Registrar {
    /// From the configuration, which `Config::validate` has checked; a name that does not
    /// parse (only reachable by skipping that) is dropped rather than trusted.
    pub fn from_config(cfg: &KubernetesBridgeConfig) -> Self {
        Self {
            node_sets: cfg
                .node_sets
                .iter()
                .filter_map(|n| NodeSetName::new(n).ok())
                .collect(),
            path_prefixes: cfg.entry_path_prefixes.clone(),
            max_owned_entries: cfg.max_owned_entries,
        }
    }

    /// Whether the service is on: at least one node set listed.
    pub fn is_on(&self) -> bool {
        !self.node_sets.is_empty()
    }

    /// The listed node sets' names.
    pub fn node_sets(&self) -> impl Iterator<Item = &str> {
        self.node_sets.iter().map(NodeSetName::as_str)
    }

    pub fn max_owned_entries(&self) -> u32 {
        self.max_owned_entries
    }
}

/// One entry as the registrar sent it (`OwnedEntry`'s fields).
#[derive(Debug, Clone, Copy)]
pub struct EntryRequest<'a> {
    pub spiffe_id: &'a str,
    pub node_set: &'a str,
    pub selectors: &'a [String],
    pub ttl_seconds: i64,
    pub dns_names: &'a [String],
    pub jwt_ttl_seconds: i64,
    pub federates_with: &'a [String],
}

/// A sync the caller may make: its owner (the caller's SPIFFE ID), scope and entries, each
/// validated (parent: its node set's SPIFFE ID). Made only by [`authorize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizedSync {
    owner: String,
    scope: String,
    entries: Vec<ValidEntry>,
}

impl AuthorizedSync {
    pub fn owner(&self) -> &str {
        &self.owner
    }
    pub fn scope(&self) -> &str {
        &self.scope
    }
    pub fn entries(&self) -> &[ValidEntry] {
        &self.entries
    }
}

/// Whether `caller` may list its owned entries: a Kubernetes bridge.
pub fn authorize_caller(policy: &Policy, caller: &AuthenticatedCaller) -> Result<(), Denial> {
    policy.admit_bridge(
        caller,
        None,
        "may keep registration entries (signet.ca.v1.Registration)",
    )
}

/// A scope: 1 to [`MAX_SCOPE_LEN`] of `[A-Za-z0-9._:/-]`.
pub fn check_scope(scope: &str) -> Result<(), Denial> {
    let ok = !scope.is_empty()
        && scope.len() <= MAX_SCOPE_LEN
        && scope
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'));
    if ok {
        return Ok(());
    }
    Err(Denial::invalid(
        "registration.scope",
        format!(
            "scope {} must be 1 to {MAX_SCOPE_LEN} of letters, digits and '.', '_', ':', '/', \
             '-' (e.g. \"Identity/team-a/web\")",
            quoted(scope)
        ),
    ))
}

/// The decision: see the module docs. `existing` holds the node sets that exist in the
/// database (of those listed; the caller reads them in the request's transaction-free read).
pub fn authorize(
    policy: &Policy,
    registrar: &Registrar,
    caller: &AuthenticatedCaller,
    scope: &str,
    entries: &[EntryRequest<'_>],
    existing: &BTreeSet<String>,
) -> Result<AuthorizedSync, Denial> {
    authorize_caller(policy, caller)?;
    check_scope(scope)?;
    if entries.len() > MAX_SYNC_ENTRIES {
        return Err(Denial::invalid(
            "registration.entry_count",
            format!(
                "{} entries in one sync; send at most {MAX_SYNC_ENTRIES}",
                entries.len()
            ),
        ));
    }
    let mut valid = Vec::with_capacity(entries.len());
    let mut seen: HashMap<(String, String, Vec<String>), usize> =
        HashMap::with_capacity(entries.len());
    for (index, e) in entries.iter().enumerate() {
        let v = authorize_entry(policy, registrar, e, existing).map_err(|d| at(index, d))?;
        let key = (
            v.spiffe_id.to_string(),
            v.parent_id.to_string(),
            v.selectors.clone(),
        );
        if let Some(first) = seen.insert(key, index) {
            return Err(Denial::invalid(
                "registration.duplicate",
                format!(
                    "entry {index}: the same registration as entry {first} of this request \
                     (spiffe_id {}, node set {} and selectors); send each once",
                    v.spiffe_id, e.node_set
                ),
            ));
        }
        valid.push(v);
    }
    Ok(AuthorizedSync {
        owner: caller.spiffe_id().to_string(),
        scope: scope.to_owned(),
        entries: valid,
    })
}

/// The denial, its message prefixed with the entry's index.
fn at(index: usize, d: Denial) -> Denial {
    Denial {
        message: format!("entry {index}: {}", d.message),
        ..d
    }
}

fn authorize_entry(
    policy: &Policy,
    registrar: &Registrar,
    e: &EntryRequest<'_>,
    existing: &BTreeSet<String>,
) -> Result<ValidEntry, Denial> {
    let td = policy.trust_domain();
    let node_set = NodeSetName::new(e.node_set)
        .map_err(|err| Denial::invalid("registration.node_set", err.to_string()))?;
    if !registrar.node_sets.contains(&node_set) {
        return Err(Denial::denied(
            "registration.node_set",
            format!(
                "node set {node_set} is not listed in policy.kubernetes_bridge.node_sets \
                 (listed: {})",
                registrar.node_sets().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    if !existing.contains(node_set.as_str()) {
        return Err(Denial::denied(
            "registration.node_set",
            format!(
                "node set {node_set} does not exist; the operator creates it first \
                 (signetctl nodeset create {node_set} …)"
            ),
        ));
    }
    let parent = node_set.spiffe_id(td).map_err(|err| {
        Denial::invalid(
            "registration.node_set",
            format!("node set {node_set}: {err}"),
        )
    })?;
    let v = validate_entry_under(
        policy,
        e.spiffe_id,
        parent,
        e.selectors,
        e.ttl_seconds,
        e.dns_names,
    )
    .and_then(|v| v.with_jwt_ttl(e.jwt_ttl_seconds))
    .and_then(|v| v.with_federates_with(e.federates_with, td))
    .map_err(entry_denial)?;
    if let Some(role) = policy.privileged_role(&v.spiffe_id) {
        // A workload holding such an entry's SVID would act as that caller over mTLS.
        return Err(Denial::denied(
            "registration.identity",
            format!(
                "{} is {role}: an entry kept by the bridge never yields a privileged identity                  (the operator registers one on the admin socket if it must)",
                v.spiffe_id
            ),
        ));
    }
    let namespace = one_namespace(&v.selectors)?;
    check_namespace(&namespace)?;
    let under_namespace = is_under_namespace(&v.spiffe_id, &namespace);
    let under_prefix = registrar
        .path_prefixes
        .iter()
        .any(|p| v.spiffe_id.path().starts_with(p.as_str()));
    if !(under_namespace || under_prefix) {
        let prefixes = if registrar.path_prefixes.is_empty() {
            String::new()
        } else {
            format!(
                " or one of policy.kubernetes_bridge.entry_path_prefixes ({})",
                registrar.path_prefixes.join(", ")
            )
        };
        return Err(Denial::denied(
            "registration.identity",
            format!(
                "an entry for namespace {namespace} (its k8s:ns selector) may only name a \
                 SPIFFE ID under spiffe://{td}/ns/{namespace}/{prefixes}; it names {}",
                v.spiffe_id
            ),
        ));
    }
    for name in &v.dns_names {
        policy.bridge_may_have_dns_name(&namespace, name)?;
    }
    Ok(v)
}

/// The namespace of the entry's one `k8s:ns` selector.
fn one_namespace(selectors: &[String]) -> Result<String, Denial> {
    let namespaces: Vec<String> = selectors
        .iter()
        .filter_map(|s| match s.parse::<Selector>() {
            Ok(Selector::K8sNamespace(ns)) => Some(ns.as_str().to_owned()),
            _ => None,
        })
        .collect();
    match namespaces.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Denial::invalid(
            "registration.namespace",
            "an entry kept by the bridge needs exactly one k8s:ns:<namespace> selector (it has \
             none): the namespace its identity belongs to",
        )),
        many => Err(Denial::invalid(
            "registration.namespace",
            format!(
                "an entry kept by the bridge needs exactly one k8s:ns:<namespace> selector; it \
                 has {} ({})",
                many.len(),
                many.join(", ")
            ),
        )),
    }
}

/// `CreateEntry`'s refusals as denials: what signing would refuse whoever asks (another trust
/// domain, `/signet/`, the server's names) is not allowed; the rest is malformed.
fn entry_denial(e: EntryError) -> Denial {
    match e {
        EntryError::ForeignTrustDomain { .. } | EntryError::Reserved(_) => {
            Denial::denied("registration.identity", e.to_string())
        }
        EntryError::ServerDnsName(_) => Denial::denied("policy.dns_name", e.to_string()),
        _ => Denial::invalid("registration.entry", e.to_string()),
    }
}
