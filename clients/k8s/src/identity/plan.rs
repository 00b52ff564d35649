//! Planning: from an identity object, the namespaces and pods it matches, and tenancy, the
//! exact registration entries its scope must hold, plus what was refused and why. Pure.
//!
//! One entry per distinct (namespace, service account, rendered ID); its selectors are
//! `k8s:ns:<ns>`, `k8s:sa:<sa>` and one `k8s:pod-label:<key>:<value>` per podSelector pair;
//! entries and selectors sorted, duplicates dropped.
//!
//! An [`Identity`](super::crd::Identity)'s ID is `spiffe://<td>/ns/<its namespace>/<path>` by
//! construction (its path cannot leave that prefix: segments are checked, `.`/`..`/empty and
//! anything but letters, digits, `.`, `-`, `_` refused), and the whole path must also be under
//! one of its tenant's prefixes; its DNS names must fit its tenant's patterns, its TTLs its
//! tenant's `maxTtl` (refused above it, never clamped), and all of a tenant's Identities
//! together at most `maxIdentities` entries ([`apply_quota`]: the object that would overflow
//! it is refused, the earlier ones keep theirs).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use signet_types::node_set::NodeSetName;
use signet_types::selector::Selector;
use signet_types::{SpiffeId, TrustDomain};

use super::crd::{ClusterIdentitySpec, DEFAULT_SPIFFE_ID_TEMPLATE, IdentitySpec, LabelSelector};
use super::tenant::{Bounds, Membership, NamespaceInfo};
use crate::certmanager::parse_go_duration;

/// The label every namespace carries with its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A registration entry the bridge asks the server to hold (the domain side of the proto's
/// `OwnedEntry`).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnedEntry {
    pub spiffe_id: String,
    pub node_set: String,
    /// Sorted.
    pub selectors: Vec<String>,
    /// Seconds; 0: the server's default.
    pub ttl_seconds: i64,
    pub dns_names: Vec<String>,
    /// Seconds; 0: the server's default.
    pub jwt_ttl_seconds: i64,
    pub federates_with: Vec<String>,
}

/// A pod, as planning sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
}

impl From<&k8s_openapi::api::core::v1::Pod> for Workload {
    fn from(p: &k8s_openapi::api::core::v1::Pod) -> Self {
        use kube::ResourceExt;
        Self {
            namespace: p.namespace().unwrap_or_default(),
            service_account: p
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
            labels: p.labels().clone().into_iter().collect(),
        }
    }
}

/// Why something was refused: a CamelCase reason (the condition's, the event's) and a
/// message naming the thing and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
pub const REASON_NO_TENANT: &str = "NoTenant";
pub const REASON_TENANT_CONFLICT: &str = "TenantConflict";
pub const REASON_TENANT_INVALID: &str = "TenantInvalid";
pub const REASON_PATH_NOT_ALLOWED: &str = "PathNotAllowed";
pub const REASON_DNS_NOT_ALLOWED: &str = "DnsNameNotAllowed";
pub const REASON_TTL_ABOVE_MAX: &str = "TtlAboveMax";
pub const REASON_QUOTA: &str = "QuotaExceeded";
pub const REASON_NAMESPACE_COLLISION: &str = "NamespaceCollision";
pub const REASON_WORKLOAD: &str = "WorkloadRefused";

/// The entries a scope must hold and what was refused. A refusal of the object as a whole
/// leaves `entries` empty (the scope is emptied); a refusal of one workload drops only that
/// workload's entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub entries: Vec<OwnedEntry>,
    pub refusals: Vec<Refusal>,
}

impl Plan {
    fn refused(r: Refusal) -> Self {
        Self {
            entries: Vec::new(),
            refusals: vec![r],
        }
    }
}

/// What every plan needs from the bridge's configuration.
#[derive(Clone, Debug)]
pub struct Env {
    pub trust_domain: TrustDomain,
    /// `--node-set`.
    pub node_set: NodeSetName,
    /// `--identities-without-tenant`.
    pub without_tenant: bool,
}

/// Renders `{trustDomain}`, `{namespace}`, `{serviceAccount}`; any other `{...}` is an error.
pub fn render(template: &str, td: &str, ns: &str, sa: &str) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(j) = after.find('}') else {
            return Err(format!("{template:?}: '{{' without '}}'"));
        };
        match &after[..j] {
            "trustDomain" => out.push_str(td),
            "namespace" => out.push_str(ns),
            "serviceAccount" => out.push_str(sa),
            other => {
                return Err(format!(
                    "{template:?}: unknown variable {{{other}}} (use {{trustDomain}}, {{namespace}}, {{serviceAccount}})"
                ));
            }
        }
        rest = &after[j + 1..];
    }
    if rest.contains('}') {
        return Err(format!("{template:?}: '}}' without '{{'"));
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether `sel` matches `labels` (matchLabels and matchExpressions: In, NotIn, Exists,
/// DoesNotExist); an unknown operator is an error.
pub fn selector_matches(
    sel: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    if sel
        .match_labels
        .iter()
        .any(|(k, v)| labels.get(k) != Some(v))
    {
        return Ok(false);
    }
    for e in &sel.match_expressions {
        let v = labels.get(&e.key);
        let ok = match e.operator.as_str() {
            "In" => v.is_some_and(|v| e.values.contains(v)),
            "NotIn" => !v.is_some_and(|v| e.values.contains(v)),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            other => {
                return Err(format!(
                    "matchExpressions: unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"
                ));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `sel` can only ever match one namespace: a single `kubernetes.io/metadata.name`
/// match (matchLabels, or matchExpressions `In` with one value), nothing else.
pub fn single_namespace(sel: &LabelSelector) -> Option<&str> {
    match (sel.match_labels.len(), sel.match_expressions.as_slice()) {
        (1, []) => sel
            .match_labels
            .get(NAMESPACE_NAME_LABEL)
            .map(String::as_str),
        (0, [e]) if e.key == NAMESPACE_NAME_LABEL && e.operator == "In" && e.values.len() == 1 => {
            e.values.first().map(String::as_str)
        }
        _ => None,
    }
}

/// A TTL field as seconds (0 when unset); whole seconds, at least 1.
fn ttl_seconds(field: &str, v: Option<&str>) -> Result<(i64, Option<Duration>), Refusal> {
    let Some(text) = v else { return Ok((0, None)) };
    let d = parse_go_duration(text)
        .map_err(|e| Refusal::new(REASON_INVALID_SPEC, format!("spec.{field}: {e}")))?;
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    if secs < 1 || !signet_types::ttl::is_requestable(secs) {
        return Err(Refusal::new(
            REASON_INVALID_SPEC,
            format!("spec.{field} {text:?}: must be from 1s to ten years"),
        ));
    }
    Ok((secs, Some(d)))
}

/// The podSelector's pairs as `k8s:pod-label` selectors, or why not.
fn pod_label_selectors(ps: &super::crd::PodSelector) -> Result<Vec<String>, Refusal> {
    if !ps.match_expressions.is_empty() {
        return Err(Refusal::new(
            REASON_INVALID_SPEC,
            "spec.podSelector.matchExpressions is not allowed: use matchLabels (each pair becomes a k8s:pod-label selector)",
        ));
    }
    ps.match_labels
        .iter()
        .map(|(k, v)| {
            let s = format!("k8s:pod-label:{k}:{v}");
            s.parse::<Selector>()
                .map(|_| s)
                .map_err(|e| Refusal::new(REASON_INVALID_SPEC, format!("spec.podSelector: {e}")))
        })
        .collect()
}

fn pod_matches(ps: &super::crd::PodSelector, w: &Workload) -> bool {
    ps.match_labels
        .iter()
        .all(|(k, v)| w.labels.get(k) == Some(v))
}

/// The `k8s:sa` selector of a service account, or a refusal of that workload.
fn sa_selector(w: &Workload) -> Result<String, Refusal> {
    let s = format!("k8s:sa:{}", w.service_account);
    s.parse::<Selector>().map(|_| s).map_err(|e| {
        Refusal::new(
            REASON_WORKLOAD,
            format!("pods of {}/{}: {e}", w.namespace, w.service_account),
        )
    })
}

fn entry_selectors(ns: &str, sa: String, labels: &[String]) -> Vec<String> {
    let mut s: Vec<String> = [format!("k8s:ns:{ns}"), sa]
        .into_iter()
        .chain(labels.iter().cloned())
        .collect();
    s.sort();
    s.dedup();
    s
}

/// Sorts and deduplicates entries and refusals.
fn finish(entries: BTreeSet<OwnedEntry>, mut refusals: Vec<Refusal>) -> Plan {
    let mut seen = BTreeSet::new();
    refusals.retain(|r| seen.insert((r.reason, r.message.clone())));
    Plan {
        entries: entries.into_iter().collect(),
        refusals,
    }
}

/// The plan of a ClusterIdentity over `namespaces` (all of them; the selector picks) and
/// `pods` (any namespace; those of unselected namespaces are ignored).
pub fn plan_cluster_identity(
    spec: &ClusterIdentitySpec,
    env: &Env,
    namespaces: &[NamespaceInfo],
    pods: &[Workload],
) -> Plan {
    match cluster_identity_common(spec, env) {
        Err(r) => Plan::refused(r),
        Ok(c) => {
            let mut selected = BTreeSet::new();
            for ns in namespaces {
                match selector_matches(&spec.namespace_selector, &ns.labels) {
                    Ok(true) => {
                        selected.insert(ns.name.as_str());
                    }
                    Ok(false) => {}
                    Err(e) => {
                        return Plan::refused(Refusal::new(
                            REASON_INVALID_SPEC,
                            format!("spec.namespaceSelector: {e}"),
                        ));
                    }
                }
            }
            let mut entries = BTreeSet::new();
            let mut refusals = Vec::new();
            for w in pods {
                if !selected.contains(w.namespace.as_str()) || !pod_matches(&spec.pod_selector, w) {
                    continue;
                }
                match c.entry(env, w) {
                    Ok(e) => {
                        entries.insert(e);
                    }
                    Err(r) => refusals.push(r),
                }
            }
            finish(entries, refusals)
        }
    }
}

/// What is checked once per ClusterIdentity, before any workload.
struct ClusterCommon<'a> {
    spec: &'a ClusterIdentitySpec,
    template: &'a str,
    node_set: String,
    labels: Vec<String>,
    ttl: i64,
    jwt_ttl: i64,
    federates_with: Vec<String>,
}

fn cluster_identity_common<'a>(
    spec: &'a ClusterIdentitySpec,
    env: &Env,
) -> Result<ClusterCommon<'a>, Refusal> {
    let template = spec
        .spiffe_id_template
        .as_deref()
        .unwrap_or(DEFAULT_SPIFFE_ID_TEMPLATE);
    let invalid = |m: String| Refusal::new(REASON_INVALID_SPEC, m);
    // A probe rendering: the template's shape, independent of any workload.
    let probe = render(template, env.trust_domain.as_str(), "ns", "sa")
        .map_err(|e| invalid(format!("spec.spiffeIdTemplate: {e}")))?;
    check_id(&probe, &env.trust_domain)
        .map_err(|e| invalid(format!("spec.spiffeIdTemplate: {e}")))?;
    for t in &spec.dns_name_templates {
        render(t, env.trust_domain.as_str(), "ns", "sa")
            .map_err(|e| invalid(format!("spec.dnsNameTemplates: {e}")))?;
    }
    // `{namespace}` and `{serviceAccount}` each fill a whole path segment (DNS label): in
    // `/platform/{namespace}-{serviceAccount}`, namespace x with account y-z and namespace x-y
    // with account z would share one ID (review finding F3 of issue 29).
    let segments = template
        .strip_prefix("spiffe://")
        .unwrap_or(template)
        .split('/')
        .skip(1);
    let labels = spec
        .dns_name_templates
        .iter()
        .flat_map(|t| t.split('.').map(move |l| (t.as_str(), l)));
    for (field, t, part) in segments
        .map(|p| ("spiffeIdTemplate", template, p))
        .chain(labels.map(|(t, l)| ("dnsNameTemplates", t, l)))
    {
        let placeholder = part.contains("{namespace}") || part.contains("{serviceAccount}");
        if placeholder && part != "{namespace}" && part != "{serviceAccount}" {
            return Err(invalid(format!(
                "spec.{field} {t:?}: {part:?} mixes a variable with other text; {{namespace}} \
                 and {{serviceAccount}} must each be a whole {} (else two namespaces' workloads \
                 could render the same name)",
                if field == "spiffeIdTemplate" {
                    "path segment"
                } else {
                    "DNS label"
                }
            )));
        }
    }
    if single_namespace(&spec.namespace_selector).is_none() {
        for (field, t) in std::iter::once(("spiffeIdTemplate", template)).chain(
            spec.dns_name_templates
                .iter()
                .map(|t| ("dnsNameTemplates", t.as_str())),
        ) {
            if !t.contains("{namespace}") {
                return Err(Refusal::new(
                    REASON_NAMESPACE_COLLISION,
                    format!(
                        "spec.{field} {t:?} has no {{namespace}} but the namespaceSelector can match several namespaces, whose workloads would share it: add {{namespace}}, or select one namespace with kubernetes.io/metadata.name"
                    ),
                ));
            }
        }
    }
    let node_set = match &spec.node_set {
        Some(n) => NodeSetName::new(n)
            .map_err(|e| invalid(format!("spec.nodeSet {n:?}: {e}")))?
            .as_str()
            .to_owned(),
        None => env.node_set.as_str().to_owned(),
    };
    let labels = pod_label_selectors(&spec.pod_selector)?;
    let (ttl, _) = ttl_seconds("ttl", spec.ttl.as_deref())?;
    let (jwt_ttl, _) = ttl_seconds("jwtTtl", spec.jwt_ttl.as_deref())?;
    let mut federates_with = Vec::new();
    for td in &spec.federates_with {
        let t =
            TrustDomain::new(td).map_err(|e| invalid(format!("spec.federatesWith {td:?}: {e}")))?;
        federates_with.push(t.as_str().to_owned());
    }
    federates_with.sort();
    federates_with.dedup();
    Ok(ClusterCommon {
        spec,
        template,
        node_set,
        labels,
        ttl,
        jwt_ttl,
        federates_with,
    })
}

impl ClusterCommon<'_> {
    fn entry(&self, env: &Env, w: &Workload) -> Result<OwnedEntry, Refusal> {
        let td = env.trust_domain.as_str();
        let who = format!("pods of {}/{}", w.namespace, w.service_account);
        let sa = sa_selector(w)?;
        let refuse = |m: String| Refusal::new(REASON_WORKLOAD, format!("{who}: {m}"));
        let id = render(self.template, td, &w.namespace, &w.service_account).map_err(&refuse)?;
        check_id(&id, &env.trust_domain).map_err(&refuse)?;
        let mut dns_names = Vec::new();
        for t in &self.spec.dns_name_templates {
            let n = render(t, td, &w.namespace, &w.service_account).map_err(&refuse)?;
            signet_types::dns::DnsName::new(&n)
                .map_err(|e| refuse(format!("DNS name {n:?}: {e}")))?;
            dns_names.push(n);
        }
        dns_names.sort();
        dns_names.dedup();
        Ok(OwnedEntry {
            spiffe_id: id,
            node_set: self.node_set.clone(),
            selectors: entry_selectors(&w.namespace, sa, &self.labels),
            ttl_seconds: self.ttl,
            dns_names,
            jwt_ttl_seconds: self.jwt_ttl,
            federates_with: self.federates_with.clone(),
        })
    }
}

/// A rendered SPIFFE ID must parse, be of the bridge's trust domain, have a path, and not be
/// under `/signet/` (Signet's own).
fn check_id(id: &str, td: &TrustDomain) -> Result<SpiffeId, String> {
    let parsed: SpiffeId = id.parse().map_err(|e| format!("SPIFFE ID {id:?}: {e}"))?;
    if !parsed.is_member_of(td) {
        return Err(format!(
            "SPIFFE ID {id:?} is not in the trust domain {}",
            td.as_str()
        ));
    }
    if parsed.path().is_empty() {
        return Err(format!("SPIFFE ID {id:?} has no path"));
    }
    if parsed.path() == "/signet" || parsed.path().starts_with("/signet/") {
        return Err(format!("SPIFFE ID {id:?}: /signet/ is Signet's own"));
    }
    Ok(parsed)
}

/// Checks an Identity's relative path (after rendering): segments of letters, digits, `.`,
/// `-`, `_`, none empty, `.` or `..`.
pub fn check_relative_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("spec.path is empty".into());
    }
    if path.starts_with('/') {
        return Err(format!(
            "spec.path {path:?} starts with '/': it is relative to /ns/<namespace>/"
        ));
    }
    for seg in path.split('/') {
        match seg {
            "" => return Err(format!("spec.path {path:?} has an empty segment")),
            "." | ".." => {
                return Err(format!(
                    "spec.path {path:?}: '.' and '..' segments are not allowed"
                ));
            }
            _ => {}
        }
        if let Some(c) = seg
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        {
            return Err(format!(
                "spec.path {path:?} contains {c:?}: only letters, digits, '.', '-', '_' and '/' between segments"
            ));
        }
    }
    Ok(())
}

/// The bounds an Identity of namespace `ns` is planned under, or the refusal of the whole
/// object.
pub fn bounds_for<'a>(
    membership: &Membership<'a>,
    ns: &str,
    env: &Env,
    no_tenant: &'a Bounds,
) -> Result<&'a Bounds, Refusal> {
    match membership {
        Membership::Tenant(b) => Ok(b),
        Membership::InvalidTenant { tenant, why } => Err(Refusal::new(
            REASON_TENANT_INVALID,
            format!("namespace {ns} belongs to Tenant {tenant}, whose spec is invalid: {why}"),
        )),
        Membership::Conflict(ts) => Err(Refusal::new(
            REASON_TENANT_CONFLICT,
            format!(
                "namespace {ns} is claimed by several Tenants ({}): it belongs to none until one lets it go",
                ts.join(", ")
            ),
        )),
        Membership::None if env.without_tenant => Ok(no_tenant),
        Membership::None => Err(Refusal::new(
            REASON_NO_TENANT,
            format!(
                "namespace {ns} belongs to no Tenant: ask the platform team to add it to one (or to run the bridge with --identities-without-tenant)"
            ),
        )),
    }
}

/// The plan of one Identity of namespace `ns` under `bounds` (quota not applied yet:
/// [`apply_quota`]). `pods`: any namespace; those of other namespaces are ignored.
pub fn plan_identity(
    spec: &IdentitySpec,
    ns: &str,
    env: &Env,
    bounds: &Bounds,
    pods: &[Workload],
) -> Plan {
    let common = match identity_common(spec, ns, env, bounds) {
        Ok(c) => c,
        Err(r) => return Plan::refused(r),
    };
    let mut entries = BTreeSet::new();
    let mut refusals = Vec::new();
    for w in pods {
        if w.namespace != ns
            || !pod_matches(&spec.pod_selector, w)
            || spec
                .service_account_name
                .as_ref()
                .is_some_and(|sa| *sa != w.service_account)
        {
            continue;
        }
        match identity_entry(spec, ns, env, bounds, &common, w) {
            Ok(e) => {
                entries.insert(e);
            }
            // A rendered path or name out of bounds for one service account refuses the
            // whole object: its author asked for it.
            Err(r) if r.reason != REASON_WORKLOAD => return Plan::refused(r),
            Err(r) => refusals.push(r),
        }
    }
    finish(entries, refusals)
}

struct IdentityCommon {
    labels: Vec<String>,
    ttl: i64,
    jwt_ttl: i64,
}

fn identity_common(
    spec: &IdentitySpec,
    ns: &str,
    env: &Env,
    bounds: &Bounds,
) -> Result<IdentityCommon, Refusal> {
    let invalid = |m: String| Refusal::new(REASON_INVALID_SPEC, m);
    // The shape with a probe service account: refused even when no pod matches yet.
    let probe = render_identity_path(&spec.path, "sa").map_err(invalid)?;
    check_relative_path(&probe).map_err(invalid)?;
    for n in &spec.dns_names {
        render_identity_path(n, "sa").map_err(|e| invalid(format!("spec.dnsNames: {e}")))?;
    }
    if let Some(sa) = &spec.service_account_name
        && !signet_types::dns::Dns1123Label::is_valid(sa)
    {
        return Err(invalid(format!(
            "spec.serviceAccountName {sa:?} is not a service account name this bridge can select (an RFC 1123 label)"
        )));
    }
    let labels = pod_label_selectors(&spec.pod_selector)?;
    let (ttl, ttl_d) = ttl_seconds("ttl", spec.ttl.as_deref())?;
    let (jwt_ttl, jwt_d) = ttl_seconds("jwtTtl", spec.jwt_ttl.as_deref())?;
    if let Some(max) = bounds.max_ttl {
        for (field, d) in [("ttl", ttl_d), ("jwtTtl", jwt_d)] {
            if let Some(d) = d
                && d > max
            {
                return Err(Refusal::new(
                    REASON_TTL_ABOVE_MAX,
                    format!(
                        "spec.{field} {} is above Tenant {}'s maxTtl {}: ask for at most that",
                        humantime::format_duration(d),
                        bounds.tenant,
                        humantime::format_duration(max)
                    ),
                ));
            }
        }
    }
    let _ = (ns, env);
    Ok(IdentityCommon {
        labels,
        ttl,
        jwt_ttl,
    })
}

/// Renders `{serviceAccount}` only (an Identity has no other variable).
fn render_identity_path(template: &str, sa: &str) -> Result<String, String> {
    let out = template.replace("{serviceAccount}", sa);
    if out.contains('{') || out.contains('}') {
        return Err(format!(
            "{template:?}: the only variable is {{serviceAccount}}"
        ));
    }
    Ok(out)
}

fn identity_entry(
    spec: &IdentitySpec,
    ns: &str,
    env: &Env,
    bounds: &Bounds,
    c: &IdentityCommon,
    w: &Workload,
) -> Result<OwnedEntry, Refusal> {
    let sa = sa_selector(w)?;
    let rel = render_identity_path(&spec.path, &w.service_account)
        .map_err(|e| Refusal::new(REASON_INVALID_SPEC, e))?;
    check_relative_path(&rel).map_err(|e| Refusal::new(REASON_INVALID_SPEC, e))?;
    // The prefix is forced: nothing in `rel` can leave /ns/<ns>/ (checked just above).
    let path = format!("/ns/{ns}/{rel}");
    let id = env
        .trust_domain
        .id(&path)
        .map_err(|e| Refusal::new(REASON_INVALID_SPEC, format!("spec.path: {e}")))?;
    if !bounds.path_allowed(ns, &path) {
        return Err(Refusal::new(
            REASON_PATH_NOT_ALLOWED,
            format!(
                "{id} is not under Tenant {}'s spiffeIdPathPrefixes for namespace {ns} ({})",
                bounds.tenant,
                bounds.prefixes_for(ns).join(", ")
            ),
        ));
    }
    let mut dns_names = Vec::new();
    for t in &spec.dns_names {
        let n = render_identity_path(t, &w.service_account)
            .map_err(|e| Refusal::new(REASON_INVALID_SPEC, format!("spec.dnsNames: {e}")))?;
        signet_types::dns::DnsName::new(&n)
            .map_err(|e| Refusal::new(REASON_INVALID_SPEC, format!("spec.dnsNames {n:?}: {e}")))?;
        if !bounds.dns_allowed(ns, &n) {
            return Err(Refusal::new(
                REASON_DNS_NOT_ALLOWED,
                format!(
                    "DNS name {n:?} does not fit Tenant {}'s dnsNamePatterns for namespace {ns} ({})",
                    bounds.tenant,
                    bounds
                        .dns_patterns
                        .iter()
                        .flatten()
                        .map(|p| p.replace("{namespace}", ns))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        dns_names.push(n);
    }
    dns_names.sort();
    dns_names.dedup();
    Ok(OwnedEntry {
        spiffe_id: id.to_string(),
        node_set: env.node_set.as_str().to_owned(),
        selectors: entry_selectors(ns, sa, &c.labels),
        ttl_seconds: c.ttl,
        dns_names,
        jwt_ttl_seconds: c.jwt_ttl,
        federates_with: Vec::new(),
    })
}

/// Applies a tenant's `maxIdentities` to its Identities' plans, given in a stable order (the
/// reconciler sorts by creation time, then namespace and name): each keeps its entries while
/// the running total fits; the first that would overflow it, and every later one that would,
/// is refused as a whole (QuotaExceeded).
pub fn apply_quota<K>(plans: &mut [(K, Plan)], max: Option<u32>, tenant: &str) {
    let Some(max) = max else { return };
    let mut used: usize = 0;
    for (_, plan) in plans.iter_mut() {
        let n = plan.entries.len();
        if used.saturating_add(n) > max as usize {
            *plan = Plan::refused(Refusal::new(
                REASON_QUOTA,
                format!(
                    "these {n} entries would take Tenant {tenant} over its maxIdentities {max} ({used} in use by its other Identities): remove some, or ask the platform team for more"
                ),
            ));
        } else {
            used += n;
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
