//! Tenancy: which Signet [`Tenant`] a namespace belongs to, and the bounds that tenant puts
//! on the namespace's Identities. Pure functions over already-read objects.
//!
//! A namespace belongs to the Signet Tenant that names it in `namespaces`, or that names (in
//! `capsuleTenant`) the Capsule Tenant owning it. Capsule's ownership is the Namespace's
//! `ownerReferences` entry that Capsule sets (`apiVersion: capsule.clastix.io/*`, `kind:
//! Tenant`, the Capsule Tenant's name AND uid, read from the Capsule Tenant object), or the
//! Capsule Tenant's `status.namespaces`; never the `capsule.clastix.io/tenant` label, which any
//! namespace admin can set. Without Capsule (its CRD absent) only `namespaces` lists count.
//!
//! A namespace claimed by two Signet Tenants belongs to neither (both statuses say so); a
//! tenant whose spec is invalid still holds its namespaces (their Identities are refused: a
//! bad tenant fails closed, it never falls back to the no-tenant defaults).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::DynamicObject;

use super::crd::Tenant;
use crate::certmanager::parse_go_duration;

pub const CAPSULE_GROUP: &str = "capsule.clastix.io";
pub const CAPSULE_VERSION: &str = "v1beta2";
/// The label Capsule also sets; never trusted on its own.
pub const CAPSULE_LABEL: &str = "capsule.clastix.io/tenant";
pub const DEFAULT_PATH_PREFIXES: &[&str] = &["/ns/{namespace}/"];
pub const DEFAULT_DNS_PATTERNS: &[&str] = &["*.{namespace}.svc", "*.{namespace}.svc.cluster.local"];

/// An owner reference of a namespace, the fields tenancy looks at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// A namespace as tenancy and namespace selectors see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub owners: Vec<OwnerRef>,
}

impl From<&Namespace> for NamespaceInfo {
    fn from(ns: &Namespace) -> Self {
        Self {
            name: ns.name_any(),
            labels: ns.labels().clone().into_iter().collect(),
            owners: ns
                .owner_references()
                .iter()
                .map(|o| OwnerRef {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                })
                .collect(),
        }
    }
}

/// A Capsule Tenant: its name, uid and `status.namespaces`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapsuleTenant {
    pub name: String,
    pub uid: String,
    pub namespaces: Vec<String>,
}

impl From<&DynamicObject> for CapsuleTenant {
    fn from(o: &DynamicObject) -> Self {
        let namespaces = o
            .data
            .pointer("/status/namespaces")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            name: o.name_any(),
            uid: o.metadata.uid.clone().unwrap_or_default(),
            namespaces,
        }
    }
}

/// Whether Capsule's ownerReference on `ns` names `t` (name and uid).
pub fn capsule_owns(ns: &NamespaceInfo, t: &CapsuleTenant) -> bool {
    !t.uid.is_empty()
        && ns.owners.iter().any(|o| {
            o.api_version
                .strip_prefix(CAPSULE_GROUP)
                .is_some_and(|v| v.starts_with('/'))
                && o.kind == "Tenant"
                && o.name == t.name
                && o.uid == t.uid
        })
}

/// What a tenant allows its namespaces' Identities.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The Signet Tenant's name; empty for the no-tenant defaults.
    pub tenant: String,
    /// Path prefix templates (`{namespace}`), each starting and ending with `/`.
    pub path_prefixes: Vec<String>,
    /// DNS name patterns (`{namespace}`, leading `*.`); `None`: not checked here (the
    /// no-tenant defaults: the server's `dns_templates` decide).
    pub dns_patterns: Option<Vec<String>>,
    pub max_ttl: Option<Duration>,
    pub max_identities: Option<u32>,
}

impl Bounds {
    /// What a namespace in no tenant gets with `--identities-without-tenant`: `/ns/<ns>/`,
    /// DNS names left to the server, no cap, no quota.
    pub fn no_tenant() -> Self {
        Self {
            tenant: String::new(),
            path_prefixes: DEFAULT_PATH_PREFIXES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            dns_patterns: None,
            max_ttl: None,
            max_identities: None,
        }
    }

    /// A tenant's bounds, or why its spec is unusable.
    pub fn of(t: &Tenant) -> Result<Self, String> {
        let s = &t.spec;
        match (&s.capsule_tenant, &s.namespaces) {
            (Some(_), Some(_)) | (None, None) => {
                return Err("set exactly one of spec.capsuleTenant and spec.namespaces".into());
            }
            _ => {}
        }
        let path_prefixes = match &s.spiffe_id_path_prefixes {
            Some(p) if p.is_empty() => {
                return Err("spec.spiffeIdPathPrefixes is empty: no ID would be allowed".into());
            }
            Some(p) => p.clone(),
            None => DEFAULT_PATH_PREFIXES
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        for p in &path_prefixes {
            check_prefix(p)?;
        }
        let dns_patterns = match &s.dns_name_patterns {
            Some(p) => p.clone(),
            None => DEFAULT_DNS_PATTERNS.iter().map(|s| s.to_string()).collect(),
        };
        for p in &dns_patterns {
            check_pattern(p)?;
        }
        let max_ttl = match &s.max_ttl {
            Some(d) => Some(parse_go_duration(d).map_err(|e| format!("spec.maxTtl: {e}"))?),
            None => None,
        };
        Ok(Self {
            tenant: t.name_any(),
            path_prefixes,
            dns_patterns: Some(dns_patterns),
            max_ttl,
            max_identities: s.max_identities,
        })
    }

    /// The path prefixes for namespace `ns`.
    pub fn prefixes_for(&self, ns: &str) -> Vec<String> {
        self.path_prefixes
            .iter()
            .map(|p| p.replace("{namespace}", ns))
            .collect()
    }

    /// Whether a SPIFFE ID path (already validated: no `.`/`..`/empty segments) is under one
    /// of the prefixes for `ns`.
    pub fn path_allowed(&self, ns: &str, path: &str) -> bool {
        self.prefixes_for(ns).iter().any(|p| path.starts_with(p))
    }

    /// Whether DNS name `name` is allowed for namespace `ns` (`true` when not checked here).
    pub fn dns_allowed(&self, ns: &str, name: &str) -> bool {
        let Some(patterns) = &self.dns_patterns else {
            return true;
        };
        let name = name.to_ascii_lowercase();
        patterns.iter().any(|p| {
            let p = p.replace("{namespace}", ns).to_ascii_lowercase();
            if name.starts_with("*.") {
                // A wildcard name only where the pattern is that very wildcard.
                return name == p;
            }
            match p.strip_prefix("*.") {
                Some(rest) => name
                    .strip_suffix(rest)
                    .and_then(|head| head.strip_suffix('.'))
                    .is_some_and(|head| !head.is_empty()),
                None => name == p,
            }
        })
    }
}

fn check_prefix(p: &str) -> Result<(), String> {
    let shown = p.replace("{namespace}", "ns");
    if !(shown.starts_with('/') && shown.ends_with('/') && shown.len() > 1) {
        return Err(format!(
            "spec.spiffeIdPathPrefixes: {p:?} must start and end with '/' (e.g. \"/ns/{{namespace}}/\")"
        ));
    }
    let probe = format!("spiffe://td.invalid{shown}x");
    probe
        .parse::<signet_types::SpiffeId>()
        .map_err(|e| format!("spec.spiffeIdPathPrefixes: {p:?}: {e}"))?;
    if shown.starts_with("/signet/") {
        return Err(format!(
            "spec.spiffeIdPathPrefixes: {p:?}: /signet/ is Signet's own"
        ));
    }
    Ok(())
}

fn check_pattern(p: &str) -> Result<(), String> {
    let shown = p.replace("{namespace}", "ns");
    let rest = shown.strip_prefix("*.").unwrap_or(&shown);
    if rest.contains('*') || !signet_types::dns::DnsName::is_valid(rest) {
        return Err(format!(
            "spec.dnsNamePatterns: {p:?} is not a DNS name with an optional leading '*.'"
        ));
    }
    Ok(())
}

/// Where a namespace belongs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Membership<'a> {
    /// One tenant, usable.
    Tenant(&'a Bounds),
    /// One tenant whose spec is unusable (why).
    InvalidTenant { tenant: String, why: String },
    /// Several tenants claim it (their names): it belongs to none.
    Conflict(Vec<String>),
    /// No tenant claims it.
    None,
}

/// Every tenant's namespaces and bounds.
#[derive(Clone, Debug, Default)]
pub struct Tenancy {
    /// Tenant name → bounds, or why its spec is unusable.
    pub tenants: BTreeMap<String, Result<Bounds, String>>,
    /// Namespace → the tenants that claim it.
    pub claims: BTreeMap<String, BTreeSet<String>>,
    /// Tenant name → a note about its source (Capsule missing, Capsule Tenant not found).
    pub notes: BTreeMap<String, String>,
}

impl Tenancy {
    /// Resolves tenancy. `capsule`: the Capsule Tenants, or `None` when Capsule's CRD is not
    /// installed.
    pub fn resolve(
        tenants: &[Tenant],
        capsule: Option<&[CapsuleTenant]>,
        namespaces: &[NamespaceInfo],
    ) -> Self {
        let mut out = Self::default();
        for t in tenants {
            let name = t.name_any();
            out.tenants.insert(name.clone(), Bounds::of(t));
            let mut claimed: BTreeSet<String> = BTreeSet::new();
            if let Some(list) = &t.spec.namespaces {
                claimed.extend(list.iter().cloned());
            }
            if let Some(ct) = &t.spec.capsule_tenant {
                match capsule {
                    None => {
                        out.notes.insert(
                            name.clone(),
                            format!(
                                "spec.capsuleTenant {ct:?}: Capsule (capsule.clastix.io) is not installed"
                            ),
                        );
                    }
                    Some(all) => match all.iter().find(|c| &c.name == ct) {
                        None => {
                            out.notes.insert(
                                name.clone(),
                                format!("spec.capsuleTenant {ct:?}: no such Capsule Tenant"),
                            );
                        }
                        Some(c) => {
                            claimed.extend(c.namespaces.iter().cloned());
                            claimed.extend(
                                namespaces
                                    .iter()
                                    .filter(|ns| capsule_owns(ns, c))
                                    .map(|ns| ns.name.clone()),
                            );
                        }
                    },
                }
            }
            for ns in claimed {
                out.claims.entry(ns).or_default().insert(name.clone());
            }
        }
        out
    }

    /// Where `ns` belongs.
    pub fn membership(&self, ns: &str) -> Membership<'_> {
        let Some(claims) = self.claims.get(ns) else {
            return Membership::None;
        };
        if claims.len() > 1 {
            return Membership::Conflict(claims.iter().cloned().collect());
        }
        let Some(name) = claims.iter().next() else {
            return Membership::None;
        };
        match self.tenants.get(name) {
            Some(Ok(b)) => Membership::Tenant(b),
            Some(Err(why)) => Membership::InvalidTenant {
                tenant: name.clone(),
                why: why.clone(),
            },
            None => Membership::None,
        }
    }

    /// The namespaces `tenant` holds alone, sorted.
    pub fn namespaces_of(&self, tenant: &str) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(_, c)| c.len() == 1 && c.contains(tenant))
            .map(|(ns, _)| ns.clone())
            .collect()
    }

    /// `(namespace, the other tenants)` of each namespace `tenant` shares with others.
    pub fn conflicts_of(&self, tenant: &str) -> Vec<(String, Vec<String>)> {
        self.claims
            .iter()
            .filter(|(_, c)| c.len() > 1 && c.contains(tenant))
            .map(|(ns, c)| {
                (
                    ns.clone(),
                    c.iter().filter(|t| *t != tenant).cloned().collect(),
                )
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "tenant_tests.rs"]
pub(crate) mod tests;
