//! The issuance decision: may this authenticated caller have this identity, these names and
//! this lifetime?
//!
//! Written as a chain of small pure checks (the cert-manager policy-chain style): each check is
//! a function of (policy, caller, request) returning `Ok(())` or a [`Denial`], run in the order
//! of [`CHAIN`]; the first failure is the answer. When every check passes, [`Policy::decide`]
//! assembles the [`Grant`], the only source of a certificate's names.
//!
//! The rules:
//! - **TTL**: negative or more than ten years is InvalidArgument; 0 means the default; anything
//!   else is clamped to the maximum.
//! - **One URI SAN at most**: an X509-SVID carries exactly one SPIFFE ID.
//! - **SAN types**: e-mail addresses and other SAN types are never issued.
//! - **Identity**: a token or mTLS caller gets its own SPIFFE ID (the CSR's URI SAN must be
//!   empty or exactly that ID). A caller listed in `policy.impersonators` may ask on behalf of
//!   another ID (Istio's `ImpersonatedIdentity`). The operator (admin) names any ID in the CSR's
//!   URI SAN. Every granted ID is in our trust domain and has a path.
//! - **DNS names**: admin any valid name; Kubernetes service accounts the names produced by
//!   `policy.kubernetes_dns_templates`; mTLS callers the names of the certificate they
//!   presented; none when asking on behalf of another identity.
//! - **IP addresses**: admin only.
//! - **Nodes** (callers with a node SVID or a join token, `CallerKind::Node`): the grant source
//!   says why a node asks. `NodeRenewal` (Attest, RenewNode): the node's own ID, no DNS names.
//!   `Entry`: a registration entry's ID, DNS names and TTL, only if the entry is parented to
//!   the calling node. A node may not use the other APIs (`Caller` source: SignCsr, Istio):
//!   its identity is renewed only where the ban is checked, and it never impersonates.
//!   Conversely only a node may use the `NodeRenewal` and `Entry` sources.
//! - **Kubernetes bridge** (`Bridge` source: SignCsr with `kubernetes_namespace`): only a
//!   caller listed in `policy.kubernetes_bridge.callers`, for a namespace that is a DNS-1123
//!   label. The CSR names exactly one SPIFFE ID, in our trust domain, under
//!   `/ns/<namespace>/` with at least one more segment; its DNS names each match one of
//!   `policy.kubernetes_bridge.dns_templates` for that namespace. So a bridge serves every
//!   namespace, but one object's certificate never names another namespace's identity.
//! - **Reserved**: identities under `/signet/` are only ever Signet's own (the server's own
//!   certificate, a node's own node ID); the server's DNS names and addresses
//!   ([`Policy::with_server_names`]) are only ever in the server's own certificate — not even the
//!   operator may mint them, and no wildcard may cover one.
//! - **Impersonation** yields only ordinary workload identities, `/ns/<namespace>/sa/<name>`,
//!   never an impersonator's, a bridge's or anything under `/signet/`, with no DNS names.
//! - **Renewal over mTLS**: an mTLS caller's request is only decided together with a
//!   [`renewal::RenewalBasis`], which only [`renewal::assess`] builds after re-checking the
//!   presented certificate's ledger row and the source of its authority (see
//!   [`crate::provenance`]); names and lifetime are bounded by that basis. Without one, refused.
//!
//! Every grant carries its [`Provenance`], which the issuer records in the ledger.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use signet_types::{SpiffeId, TrustDomain};

use crate::authn::{AuthenticatedCaller, CallerKind, SERVER_PATH};
use crate::ca::{Grant, RequestedNames};
use crate::config::PolicyConfig;
use crate::provenance::{Provenance, Source};

pub mod renewal;
pub mod row_cache;

use renewal::RenewalBasis;

/// Longer requested lifetimes are not clamped but refused: they are a client bug.
pub const ABSURD_TTL_SECONDS: i64 = 10 * 365 * 24 * 3600;

/// How a refusal maps to the API: malformed request, or not allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenialKind {
    InvalidArgument,
    PermissionDenied,
}

/// Why policy refused. `reason` is a short stable code for the audit log and metrics
/// (`policy.ttl`, `policy.identity`, …); `message` tells the caller what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub kind: DenialKind,
    pub reason: &'static str,
    pub message: String,
}

impl Denial {
    fn invalid(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind: DenialKind::InvalidArgument,
            reason,
            message: message.into(),
        }
    }

    fn denied(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind: DenialKind::PermissionDenied,
            reason,
            message: message.into(),
        }
    }
}

/// The message alone: it is what the caller sees.
impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Denial {}

/// Why a certificate is asked for, beyond "for the caller itself".
#[derive(Debug, Clone, Copy, Default)]
pub enum GrantSource<'a> {
    /// The ordinary APIs: the caller's own identity (or, for the operator, what it names).
    #[default]
    Caller,
    /// A node renewing its own node identity over mTLS (`RenewNode`).
    NodeRenewal,
    /// A node that has just proved itself with `method` (`join_token`, `k8s_psat`), for its
    /// own node identity (`Attest`).
    NodeAttestation { method: &'a str },
    /// A node asking for a workload identity of one of its registration entries.
    Entry(&'a EntryGrant),
    /// The Kubernetes bridge, for an object in `namespace` (SignCsr's `kubernetes_namespace`).
    Bridge { namespace: &'a str },
}

/// A registration entry as policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryGrant {
    pub entry_id: String,
    pub spiffe_id: SpiffeId,
    /// The parent node's SPIFFE ID.
    pub parent_id: SpiffeId,
    pub dns_names: Vec<String>,
    /// 0: the default; clamped to the maximum like any request.
    pub ttl_seconds: i64,
}

/// What is being asked for.
#[derive(Debug, Clone, Copy)]
pub struct IssueRequest<'a> {
    /// Why: the caller's own identity, a node's renewal, or a registration entry.
    pub source: GrantSource<'a>,
    /// The names the CSR asks for.
    pub names: &'a RequestedNames,
    /// Requested lifetime in seconds; 0 means the default.
    pub ttl_seconds: i64,
    /// Istio's `ImpersonatedIdentity`: the SPIFFE ID a trusted node agent asks on behalf of.
    pub impersonate: Option<&'a str>,
    /// For an mTLS caller: what re-checking the presented certificate's source allows.
    pub renewal: Option<&'a RenewalBasis>,
}

/// One check of the chain.
type Check = fn(&Policy, &AuthenticatedCaller, &IssueRequest<'_>) -> Result<(), Denial>;

/// The checks, in the order they run. The first failure is reported.
const CHAIN: &[(&str, Check)] = &[
    ("source", check_source),
    ("renewal", check_renewal),
    ("ttl", check_ttl),
    ("single_uri", check_single_uri),
    ("san_types", check_san_types),
    ("identity", check_identity),
    ("dns_names", check_dns_names),
    ("ip_addresses", check_ip_addresses),
    ("reserved", check_reserved),
];

/// The issuance policy, built once from configuration.
#[derive(Debug, Clone)]
pub struct Policy {
    td: TrustDomain,
    default_ttl: Duration,
    max_ttl: Duration,
    dns_templates: Vec<DnsTemplate>,
    impersonators: Vec<SpiffeId>,
    bridge_callers: Vec<SpiffeId>,
    bridge_dns_templates: Vec<BridgeDnsTemplate>,
    mtls_renewal_max_age: Duration,
    server_dns_names: Vec<String>,
    server_ip_addresses: Vec<IpAddr>,
}

impl Policy {
    /// Validates the configuration: TTLs, DNS templates (placeholders `{namespace}` and
    /// `{serviceaccount}`, an optional leading `*.`), impersonator IDs (in `td`, with a path).
    pub fn new(
        td: TrustDomain,
        default_ttl: Duration,
        max_ttl: Duration,
        cfg: &PolicyConfig,
    ) -> Result<Self, String> {
        if default_ttl.is_zero() || max_ttl.is_zero() {
            return Err("ca.default_ttl and ca.max_ttl must be positive".into());
        }
        if default_ttl > max_ttl {
            return Err(format!(
                "ca.default_ttl ({}) is longer than ca.max_ttl ({})",
                humantime::format_duration(default_ttl),
                humantime::format_duration(max_ttl)
            ));
        }
        let dns_templates = cfg
            .kubernetes_dns_templates
            .iter()
            .map(|t| DnsTemplate::parse(t))
            .collect::<Result<Vec<_>, _>>()?;
        let mut impersonators = Vec::new();
        for s in &cfg.impersonators {
            let id: SpiffeId = s
                .parse()
                .map_err(|e| format!("policy.impersonators: {s:?} is not a SPIFFE ID: {e}"))?;
            if !id.is_member_of(&td) {
                return Err(format!(
                    "policy.impersonators: {id} is not in trust domain {td}"
                ));
            }
            if id.path().is_empty() {
                return Err(format!(
                    "policy.impersonators: {id} is a trust domain ID; name a workload (a path)"
                ));
            }
            if id.path() == "/signet" || id.path().starts_with("/signet/") {
                return Err(format!(
                    "policy.impersonators: {id} is one of Signet's own identities; name the \
                     impersonating workload (e.g. spiffe://{td}/ns/istio-system/sa/ztunnel)"
                ));
            }
            impersonators.push(id);
        }
        let mut bridge_callers = Vec::new();
        for s in &cfg.kubernetes_bridge.callers {
            let key = "policy.kubernetes_bridge.callers";
            let id: SpiffeId = s
                .parse()
                .map_err(|e| format!("{key}: {s:?} is not a SPIFFE ID: {e}"))?;
            if !id.is_member_of(&td) {
                return Err(format!("{key}: {id} is not in trust domain {td}"));
            }
            let path = id.path();
            if path.is_empty() || path == "/signet" || path.starts_with("/signet/") {
                return Err(format!(
                    "{key}: {id} is not a workload ID (name the bridge's own identity, e.g. \
                     spiffe://{td}/ns/signet-system/sa/signet-k8s)"
                ));
            }
            bridge_callers.push(id);
        }
        if let Some(both) = bridge_callers.iter().find(|b| impersonators.contains(b)) {
            return Err(format!(
                "{both} is in both policy.impersonators and policy.kubernetes_bridge.callers; \
                 give each role its own identity"
            ));
        }
        let bridge_dns_templates = cfg
            .kubernetes_bridge
            .dns_templates
            .iter()
            .map(|t| BridgeDnsTemplate::parse(t))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            td,
            default_ttl,
            max_ttl,
            dns_templates,
            impersonators,
            bridge_callers,
            bridge_dns_templates,
            mtls_renewal_max_age: cfg.mtls_renewal_max_age,
            server_dns_names: Vec::new(),
            server_ip_addresses: Vec::new(),
        })
    }

    /// The server's own DNS names and addresses: only the server's certificate may carry them.
    pub fn with_server_names(mut self, dns_names: Vec<String>, ips: Vec<IpAddr>) -> Self {
        self.server_dns_names = dns_names;
        self.server_ip_addresses = ips;
        self
    }

    /// How long after its original credential was checked a certificate may renew over mTLS.
    pub fn mtls_renewal_max_age(&self) -> Duration {
        self.mtls_renewal_max_age
    }

    pub(crate) fn trust_domain(&self) -> &TrustDomain {
        &self.td
    }

    /// Whether a service account may have `name` by `kubernetes_dns_templates`.
    pub(crate) fn service_account_may_have(
        &self,
        name: &str,
        namespace: &str,
        service_account: &str,
    ) -> bool {
        self.dns_templates
            .iter()
            .any(|t| t.matches(name, namespace, service_account))
    }

    /// Runs the chain; on success, the grant: identity, the requested (allowed) DNS names and
    /// IP addresses, the lifetime, and the provenance to record. `now` is the issuance time
    /// (unix seconds), recorded as the moment a live source was checked.
    pub fn decide(
        &self,
        caller: &AuthenticatedCaller,
        req: &IssueRequest<'_>,
        now: i64,
    ) -> Result<Grant, Denial> {
        for (_name, check) in CHAIN {
            check(self, caller, req)?;
        }
        let mut ttl = self.ttl(effective_ttl(req))?;
        let renewing_own =
            matches!(req.source, GrantSource::Caller) && req.impersonate.is_none_or(str::is_empty);
        if let (CallerKind::Mtls { .. }, Some(basis), true) =
            (caller.kind(), req.renewal, renewing_own)
        {
            ttl = ttl.min(basis.max_ttl());
        }
        Ok(Grant {
            spiffe_id: self.identity(caller, req)?,
            dns_names: req.names.dns_names.clone(),
            ip_addresses: req.names.ip_addresses.clone(),
            ttl,
            provenance: provenance(caller, req, now)?,
        })
    }

    /// The lifetime to grant for a requested number of seconds.
    fn ttl(&self, seconds: i64) -> Result<Duration, Denial> {
        if seconds < 0 {
            return Err(Denial::invalid(
                "policy.ttl",
                format!("requested validity {seconds} s is negative; send 0 for the default"),
            ));
        }
        if seconds > ABSURD_TTL_SECONDS {
            return Err(Denial::invalid(
                "policy.ttl",
                format!(
                    "requested validity {seconds} s is more than ten years, which is absurd; the \
                     longest this CA issues is {}",
                    humantime::format_duration(self.max_ttl)
                ),
            ));
        }
        let Ok(seconds) = u64::try_from(seconds) else {
            return Err(Denial::invalid(
                "policy.ttl",
                "requested validity is negative",
            ));
        };
        if seconds == 0 {
            return Ok(self.default_ttl);
        }
        Ok(Duration::from_secs(seconds).min(self.max_ttl))
    }

    /// The SPIFFE ID to grant.
    fn identity(
        &self,
        caller: &AuthenticatedCaller,
        req: &IssueRequest<'_>,
    ) -> Result<SpiffeId, Denial> {
        let uri = match req.names.uris.as_slice() {
            [] => None,
            [one] => Some(one.as_str()),
            many => return Err(too_many_uris(many.len())),
        };
        let impersonate = req.impersonate.filter(|s| !s.is_empty());

        let target = match (req.source, impersonate) {
            (GrantSource::Entry(e), _) => Some(e.spiffe_id.clone()),
            (GrantSource::Bridge { namespace }, _) => {
                return self.bridge_identity(uri, namespace);
            }
            (_, Some(imp)) => {
                if !self.impersonators.contains(caller.spiffe_id()) {
                    return Err(Denial::denied(
                        "policy.impersonation",
                        format!(
                            "caller {} may not ask on behalf of another identity \
                             (ImpersonatedIdentity {}): it is not in policy.impersonators",
                            caller.spiffe_id(),
                            quoted(imp)
                        ),
                    ));
                }
                let id: SpiffeId = imp.parse().map_err(|e| {
                    Denial::invalid(
                        "policy.impersonation",
                        format!(
                            "ImpersonatedIdentity {} is not a SPIFFE ID: {e}",
                            quoted(imp)
                        ),
                    )
                })?;
                Some(id)
            }
            (_, None) => match caller.kind() {
                CallerKind::Admin => None,
                CallerKind::Server => Some(self.td.id(SERVER_PATH).map_err(|e| {
                    Denial::invalid("policy.identity", format!("server SPIFFE ID: {e}"))
                })?),
                CallerKind::KubernetesServiceAccount { .. }
                | CallerKind::Mtls { .. }
                | CallerKind::Node { .. } => Some(caller.spiffe_id().clone()),
            },
        };

        let id = match target {
            Some(id) => {
                if let Some(uri) = uri {
                    let same = uri.parse::<SpiffeId>().is_ok_and(|asked| asked == id);
                    if !same {
                        let on_behalf = if impersonate.is_some() {
                            format!(" (asking on behalf of {id})")
                        } else {
                            String::new()
                        };
                        return Err(Denial::denied(
                            "policy.identity",
                            format!(
                                "caller {}{on_behalf} may not obtain {}",
                                caller.spiffe_id(),
                                shown(uri)
                            ),
                        ));
                    }
                }
                id
            }
            None => {
                let Some(uri) = uri else {
                    return Err(Denial::invalid(
                        "policy.identity",
                        "name the SPIFFE ID to issue in the CSR's URI SAN (exactly one)",
                    ));
                };
                uri.parse().map_err(|e| {
                    Denial::invalid(
                        "policy.identity",
                        format!("URI SAN {} is not a SPIFFE ID: {e}", quoted(uri)),
                    )
                })?
            }
        };

        if !id.is_member_of(&self.td) {
            return Err(Denial::denied(
                "policy.trust_domain",
                format!(
                    "{id} is outside trust domain {}; this CA issues only spiffe://{}/… IDs",
                    self.td, self.td
                ),
            ));
        }
        if id.path().is_empty() {
            return Err(Denial::denied(
                "policy.identity",
                format!("{id} is the trust domain's own ID; an X509-SVID names a workload path"),
            ));
        }
        if impersonate.is_some() {
            self.check_impersonated(caller, &id)?;
        }
        Ok(id)
    }

    /// What an impersonator may obtain: an ordinary workload identity
    /// (`/ns/<namespace>/sa/<name>`), never one under `/signet/`, never an identity that is
    /// itself privileged here (an impersonator or a Kubernetes bridge). Istio's node authorizer
    /// also checks that the workload runs on the impersonator's node; this server has no view of
    /// pods, so that check is not made (SECURITY.md).
    fn check_impersonated(
        &self,
        caller: &AuthenticatedCaller,
        id: &SpiffeId,
    ) -> Result<(), Denial> {
        let refuse = |why: &str| {
            Denial::denied(
                "policy.impersonation",
                format!(
                    "caller {} may not obtain {id} on behalf of another identity: {why}",
                    caller.spiffe_id()
                ),
            )
        };
        if !is_workload_service_account_path(id.path()) {
            return Err(refuse(
                "impersonation yields only Kubernetes workload identities \
                 (spiffe://<trust domain>/ns/<namespace>/sa/<service account>)",
            ));
        }
        if self.impersonators.contains(id) {
            return Err(refuse("it is an impersonator's identity"));
        }
        if self.bridge_callers.contains(id) {
            return Err(refuse("it is a Kubernetes bridge's identity"));
        }
        Ok(())
    }

    /// The SPIFFE ID the bridge asks for, for an object in `namespace`: the CSR's one URI SAN,
    /// in our trust domain, under `/ns/<namespace>/` and naming something below it.
    fn bridge_identity(&self, uri: Option<&str>, namespace: &str) -> Result<SpiffeId, Denial> {
        let prefix = format!("spiffe://{}/ns/{namespace}/", self.td);
        let Some(uri) = uri else {
            return Err(Denial::invalid(
                "policy.identity",
                format!(
                    "a certificate for an object in namespace {namespace} names its SPIFFE ID in \
                     the CSR's URI SAN (exactly one, under {prefix})"
                ),
            ));
        };
        let id: SpiffeId = uri.parse().map_err(|e| {
            Denial::invalid(
                "policy.identity",
                format!("URI SAN {} is not a SPIFFE ID: {e}", quoted(uri)),
            )
        })?;
        if !id.is_member_of(&self.td) {
            return Err(Denial::denied(
                "policy.trust_domain",
                format!(
                    "{id} is outside trust domain {}; this CA issues only spiffe://{}/… IDs",
                    self.td, self.td
                ),
            ));
        }
        let below = id
            .path()
            .strip_prefix("/ns/")
            .and_then(|rest| rest.strip_prefix(namespace))
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|rest| !rest.is_empty());
        if !below {
            return Err(Denial::denied(
                "policy.bridge_namespace",
                format!(
                    "a certificate for an object in namespace {namespace} may only carry a \
                     SPIFFE ID under {prefix}; the CSR asks for {id}"
                ),
            ));
        }
        Ok(id)
    }

    /// The DNS names this caller may have, spelled out for a refusal message.
    fn allowed_dns_description(
        &self,
        caller: &AuthenticatedCaller,
        renewal: Option<&RenewalBasis>,
    ) -> String {
        match caller.kind() {
            CallerKind::KubernetesServiceAccount {
                namespace,
                service_account,
                ..
            } => {
                if self.dns_templates.is_empty() {
                    "no DNS names are allowed for service accounts (policy.kubernetes_dns_templates is empty)".into()
                } else {
                    let names: Vec<String> = self
                        .dns_templates
                        .iter()
                        .map(|t| t.expand(namespace, service_account))
                        .collect();
                    format!("allowed: {}", names.join(", "))
                }
            }
            CallerKind::Mtls { .. } => {
                let names = renewal.map(RenewalBasis::dns_names).unwrap_or_default();
                if names.is_empty() {
                    "a renewal carries no DNS names here (none on the presented certificate that \
                     its source still allows)"
                        .into()
                } else {
                    format!(
                        "a renewal may carry only the presented certificate's DNS names that its \
                         source still allows: {}",
                        names.join(", ")
                    )
                }
            }
            CallerKind::Node { .. } => "a node's own identity carries no DNS names; a \
                workload's are its registration entry's"
                .into(),
            CallerKind::Admin | CallerKind::Server => String::new(),
        }
    }
}

// ---- the checks -------------------------------------------------------------------------

/// Who may use which grant source (see the module docs).
fn check_source(
    p: &Policy,
    caller: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
) -> Result<(), Denial> {
    let is_node = matches!(caller.kind(), CallerKind::Node { .. });
    if let GrantSource::Bridge { namespace } = req.source {
        return check_bridge(p, caller, req, namespace);
    }
    match req.source {
        GrantSource::Caller if is_node => Err(Denial::denied(
            "policy.node",
            format!(
                "caller {} is a node: it renews its identity with signet.agent.v1.Node/RenewNode \
                 and obtains workload identities with SignWorkloads, not through this API",
                caller.spiffe_id()
            ),
        )),
        GrantSource::Caller => Ok(()),
        GrantSource::NodeRenewal | GrantSource::NodeAttestation { .. } | GrantSource::Entry(_)
            if !is_node =>
        {
            Err(Denial::denied(
                "policy.node",
                format!(
                    "caller {} is not a node; only node identities use the node API",
                    caller.spiffe_id()
                ),
            ))
        }
        _ if req.impersonate.is_some_and(|s| !s.is_empty()) => Err(Denial::denied(
            "policy.impersonation",
            "a node never asks on behalf of another identity",
        )),
        GrantSource::NodeRenewal
        | GrantSource::NodeAttestation { .. }
        | GrantSource::Bridge { .. } => Ok(()),
        GrantSource::Entry(e) => {
            if &e.parent_id != caller.spiffe_id() {
                return Err(Denial::denied(
                    "policy.entry",
                    format!(
                        "entry {} is not parented to node {}",
                        shown(&e.entry_id),
                        caller.spiffe_id()
                    ),
                ));
            }
            let path = e.spiffe_id.path();
            if path == "/signet" || path.starts_with("/signet/") {
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
    }
}

/// The bridge source: a listed caller (never a node), no impersonation, a namespace that is
/// a DNS-1123 label.
fn check_bridge(
    p: &Policy,
    caller: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
    namespace: &str,
) -> Result<(), Denial> {
    let listed = !matches!(
        caller.kind(),
        CallerKind::Node { .. } | CallerKind::Admin | CallerKind::Server
    ) && p.bridge_callers.contains(caller.spiffe_id());
    if !listed {
        return Err(Denial::denied(
            "policy.bridge",
            format!(
                "caller {} is not a Kubernetes bridge; only the callers in \
                 policy.kubernetes_bridge.callers may set kubernetes_namespace (leave it empty \
                 to ask for your own identity)",
                caller.spiffe_id()
            ),
        ));
    }
    if req.impersonate.is_some_and(|s| !s.is_empty()) {
        return Err(Denial::denied(
            "policy.impersonation",
            "the Kubernetes bridge never asks on behalf of another identity",
        ));
    }
    if !is_dns1123_label(namespace) {
        return Err(Denial::invalid(
            "policy.bridge_namespace",
            format!(
                "kubernetes_namespace {} is not a Kubernetes namespace name (a DNS-1123 label: \
                 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or \
                 digit)",
                quoted(namespace)
            ),
        ));
    }
    Ok(())
}

/// The requested lifetime: an entry's own TTL when issuing for an entry.
fn effective_ttl(req: &IssueRequest<'_>) -> i64 {
    match req.source {
        GrantSource::Entry(e) => e.ttl_seconds,
        _ => req.ttl_seconds,
    }
}

fn check_ttl(p: &Policy, _: &AuthenticatedCaller, req: &IssueRequest<'_>) -> Result<(), Denial> {
    p.ttl(effective_ttl(req)).map(|_| ())
}

fn check_single_uri(
    _: &Policy,
    _: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
) -> Result<(), Denial> {
    match req.names.uris.len() {
        0 | 1 => Ok(()),
        n => Err(too_many_uris(n)),
    }
}

fn check_san_types(
    _: &Policy,
    _: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
) -> Result<(), Denial> {
    if let Some(email) = req.names.emails.first() {
        return Err(Denial::denied(
            "policy.san_type",
            format!(
                "e-mail SAN {} is never issued: an X509-SVID carries a SPIFFE ID and DNS names",
                quoted(email)
            ),
        ));
    }
    if let Some(other) = req.names.other.first() {
        return Err(Denial::denied(
            "policy.san_type",
            format!(
                "SAN type {} is never issued: an X509-SVID carries a SPIFFE ID and DNS names",
                shown(other)
            ),
        ));
    }
    Ok(())
}

fn check_identity(
    p: &Policy,
    caller: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
) -> Result<(), Denial> {
    p.identity(caller, req).map(|_| ())
}

fn check_dns_names(
    p: &Policy,
    caller: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
) -> Result<(), Denial> {
    let on_behalf = req.impersonate.is_some_and(|s| !s.is_empty());
    for name in &req.names.dns_names {
        if !is_dns_name(name) {
            return Err(Denial::invalid(
                "policy.dns_name",
                format!("{} is not a valid DNS name", quoted(name)),
            ));
        }
        if let GrantSource::Bridge { namespace } = req.source {
            if p.bridge_dns_templates
                .iter()
                .any(|t| t.matches(name, namespace))
            {
                continue;
            }
            let why = if p.bridge_dns_templates.is_empty() {
                "no DNS names are allowed (policy.kubernetes_bridge.dns_templates is empty)"
                    .to_owned()
            } else {
                let allowed: Vec<String> = p
                    .bridge_dns_templates
                    .iter()
                    .map(|t| t.expand(namespace))
                    .collect();
                format!("allowed patterns: {}", allowed.join(", "))
            };
            return Err(Denial::denied(
                "policy.dns_name",
                format!(
                    "a certificate for an object in namespace {namespace} may not carry DNS \
                     name {name}: {why}"
                ),
            ));
        }
        let allowed = match caller.kind() {
            CallerKind::Admin => true,
            _ if on_behalf => false,
            CallerKind::KubernetesServiceAccount {
                namespace,
                service_account,
                ..
            } => p
                .dns_templates
                .iter()
                .any(|t| t.matches(name, namespace, service_account)),
            CallerKind::Mtls { .. } => req
                .renewal
                .is_some_and(|b| b.dns_names().iter().any(|d| d.eq_ignore_ascii_case(name))),
            CallerKind::Server => true,
            CallerKind::Node { .. } => match req.source {
                GrantSource::Entry(e) => e.dns_names.iter().any(|d| d.eq_ignore_ascii_case(name)),
                _ => false,
            },
        };
        if !allowed {
            let why = if on_behalf && !matches!(caller.kind(), CallerKind::Admin) {
                "no DNS names are granted when asking on behalf of another identity".to_owned()
            } else {
                p.allowed_dns_description(caller, req.renewal)
            };
            return Err(Denial::denied(
                "policy.dns_name",
                format!(
                    "caller {} may not obtain DNS name {name}: {why}",
                    caller.spiffe_id()
                ),
            ));
        }
    }
    Ok(())
}

fn check_ip_addresses(
    _: &Policy,
    caller: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
) -> Result<(), Denial> {
    let Some(ip) = req.names.ip_addresses.first() else {
        return Ok(());
    };
    match caller.kind() {
        CallerKind::Admin | CallerKind::Server => Ok(()),
        CallerKind::KubernetesServiceAccount { .. }
        | CallerKind::Mtls { .. }
        | CallerKind::Node { .. } => Err(Denial::denied(
            "policy.ip_address",
            format!(
                "caller {} may not obtain IP address {}: only the operator issues \
                     certificates with IP addresses",
                caller.spiffe_id(),
                ip
            ),
        )),
    }
}

/// An mTLS caller is renewing the certificate it presents: only with a basis that re-checked
/// that certificate's ledger row and source ([`renewal::assess`]), for the same identity. A
/// basis is meaningless for any other caller.
fn check_renewal(
    _: &Policy,
    caller: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
) -> Result<(), Denial> {
    match (caller.kind(), req.renewal) {
        (CallerKind::Mtls { serial, .. }, Some(basis)) => {
            if basis.serial() != serial || basis.spiffe_id() != caller.spiffe_id() {
                return Err(Denial::denied(
                    "policy.renewal",
                    format!(
                        "the renewal check was made for another certificate than the one {} \
                         presented",
                        caller.spiffe_id()
                    ),
                ));
            }
            Ok(())
        }
        (CallerKind::Mtls { .. }, None) => Err(Denial::denied(
            "policy.renewal",
            format!(
                "caller {} presents a certificate whose source was not re-checked, so it may not \
                 renew it",
                caller.spiffe_id()
            ),
        )),
        (_, Some(_)) => Err(Denial::invalid(
            "policy.renewal",
            "a renewal basis applies only to a caller presenting a certificate over mTLS",
        )),
        (_, None) => Ok(()),
    }
}

/// Signet's own identities and names: `/signet/…` IDs only for the server itself and a node's
/// own ID; the server's DNS names and addresses only in the server's certificate, and no
/// wildcard may cover one of them. This runs for every grant, whoever the caller.
fn check_reserved(
    p: &Policy,
    caller: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
) -> Result<(), Denial> {
    let id = p.identity(caller, req)?;
    let path = id.path();
    if path == "/signet" || path.starts_with("/signet/") {
        let own = match (caller.kind(), req.source) {
            (CallerKind::Server, GrantSource::Caller) => path == SERVER_PATH,
            (
                CallerKind::Node { .. },
                GrantSource::NodeRenewal | GrantSource::NodeAttestation { .. },
            ) => &id == caller.spiffe_id(),
            _ => false,
        };
        if !own {
            return Err(Denial::denied(
                "policy.reserved",
                format!(
                    "{id} is reserved: identities under spiffe://{}/signet/ are only ever \
                     Signet's own (the server's, a node's own node ID)",
                    p.td
                ),
            ));
        }
    }
    if matches!(caller.kind(), CallerKind::Server) {
        return Ok(());
    }
    for name in &req.names.dns_names {
        if let Some(reserved) = p.server_dns_names.iter().find(|r| dns_name_covers(name, r)) {
            let how = if name.eq_ignore_ascii_case(reserved) {
                String::new()
            } else {
                format!(" (through {name})")
            };
            return Err(Denial::denied(
                "policy.reserved",
                format!(
                    "DNS name {reserved}{how} is the CA server's own name; no other certificate \
                     may carry it"
                ),
            ));
        }
    }
    if let Some(ip) = req
        .names
        .ip_addresses
        .iter()
        .find(|ip| p.server_ip_addresses.contains(ip))
    {
        return Err(Denial::denied(
            "policy.reserved",
            format!(
                "IP address {ip} is the CA server's own address; no other certificate may carry it"
            ),
        ));
    }
    Ok(())
}

/// Whether a certificate for `granted` would be accepted for `name`: equal, or `granted` is a
/// wildcard (`*.rest`) matching `name`'s first label (how TLS clients match).
fn dns_name_covers(granted: &str, name: &str) -> bool {
    if granted.eq_ignore_ascii_case(name) {
        return true;
    }
    match (granted.strip_prefix("*."), name.split_once('.')) {
        (Some(rest), Some((_, name_rest))) => rest.eq_ignore_ascii_case(name_rest),
        _ => false,
    }
}

/// Where the authority for the grant comes from (see [`crate::provenance`]). A combination the
/// chain should not have let through is refused rather than recorded under a guessed source.
fn provenance(
    caller: &AuthenticatedCaller,
    req: &IssueRequest<'_>,
    now: i64,
) -> Result<Provenance, Denial> {
    let impersonating = req.impersonate.is_some_and(|s| !s.is_empty());
    if impersonating {
        let source = Source::Impersonated {
            impersonator: caller.spiffe_id().to_string(),
        };
        return Ok(Provenance::new(source, now));
    }
    let source = match (req.source, caller.kind()) {
        (GrantSource::Caller, CallerKind::Mtls { .. }) => {
            return req.renewal.map(|b| b.carried_forward()).ok_or_else(|| {
                Denial::denied(
                    "policy.renewal",
                    "a renewal over mTLS needs its re-checked basis",
                )
            });
        }
        (GrantSource::Entry(e), CallerKind::Node { node_id, .. }) => Source::Entry {
            entry_id: e.entry_id.clone(),
            node_id: node_id.clone(),
        },
        (GrantSource::Bridge { namespace }, _) => Source::Bridge {
            bridge: caller.spiffe_id().to_string(),
            namespace: namespace.to_owned(),
        },
        (GrantSource::NodeAttestation { method }, CallerKind::Node { node_id, .. }) => {
            Source::Node {
                node_id: node_id.clone(),
                attestation: method.to_owned(),
            }
        }
        (GrantSource::NodeRenewal, CallerKind::Node { node_id, .. }) => Source::Node {
            node_id: node_id.clone(),
            attestation: "renewal".to_owned(),
        },
        (
            GrantSource::Caller,
            CallerKind::KubernetesServiceAccount {
                namespace,
                service_account,
                pod,
                node,
            },
        ) => Source::ServiceAccount {
            namespace: namespace.clone(),
            service_account: service_account.clone(),
            pod: pod.clone(),
            node: node.clone(),
        },
        (GrantSource::Caller, CallerKind::Admin) => Source::Admin,
        (GrantSource::Caller, CallerKind::Server) => Source::Server,
        _ => {
            return Err(Denial::denied(
                "policy.provenance",
                format!(
                    "caller {} cannot be granted a certificate through this API",
                    caller.spiffe_id()
                ),
            ));
        }
    };
    Ok(Provenance::new(source, now))
}

// ---- helpers ----------------------------------------------------------------------------

fn too_many_uris(n: usize) -> Denial {
    Denial::invalid(
        "policy.uri_count",
        format!("the CSR asks for {n} URI SANs; an X509-SVID carries exactly one (its SPIFFE ID)"),
    )
}

/// Untrusted text in a message, quoted and cut short.
fn quoted(s: &str) -> String {
    format!("{:?}", truncate(s))
}

/// Untrusted text in a message, cut short and with control characters escaped.
fn shown(s: &str) -> String {
    let t = truncate(s);
    if t.chars().any(|c| c.is_control()) {
        format!("{t:?}")
    } else {
        t
    }
}

fn truncate(s: &str) -> String {
    const MAX: usize = 256;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push('…');
        out
    }
}

/// A DNS name as it may appear in a certificate: LDH labels of 1–63 characters, at most 253
/// in all, no trailing dot, optionally a leading `*` label; not an IP address literal.
pub(crate) fn is_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 || name.parse::<IpAddr>().is_ok() {
        return false;
    }
    let rest = name.strip_prefix("*.").unwrap_or(name);
    !rest.is_empty() && rest.split('.').all(is_ldh_label)
}

fn is_ldh_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// `/ns/<namespace>/sa/<service account>`: a namespace that is a DNS-1123 label and a service
/// account name that is a DNS-1123 subdomain, nothing before or after.
fn is_workload_service_account_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/ns/") else {
        return false;
    };
    let Some((namespace, rest)) = rest.split_once('/') else {
        return false;
    };
    let Some(service_account) = rest.strip_prefix("sa/") else {
        return false;
    };
    is_dns1123_label(namespace)
        && !service_account.is_empty()
        && service_account.len() <= 253
        && service_account.split('.').all(is_dns1123_label)
}

/// A Kubernetes namespace name: a DNS-1123 label (lowercase).
fn is_dns1123_label(s: &str) -> bool {
    is_ldh_label(s) && !s.bytes().any(|b| b.is_ascii_uppercase())
}

/// One entry of `policy.kubernetes_bridge.dns_templates`: `{namespace}` is the only
/// placeholder; a leading `*.` matches one or more concrete labels.
#[derive(Debug, Clone)]
struct BridgeDnsTemplate {
    wildcard: bool,
    body: String,
}

impl BridgeDnsTemplate {
    fn parse(template: &str) -> Result<Self, String> {
        let err = |why: &str| format!("policy.kubernetes_bridge.dns_templates: {template:?} {why}");
        let (wildcard, body) = match template.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, template),
        };
        let stripped = body.replace(NAMESPACE, "");
        if stripped.contains('{') || stripped.contains('}') {
            return Err(err("has an unknown placeholder; use {namespace}"));
        }
        if body.contains('*') {
            return Err(err("may use '*' only as a whole leading label (\"*.\")"));
        }
        if !body.contains(NAMESPACE) {
            return Err(err(
                "does not contain {namespace}: it would give every namespace the same names",
            ));
        }
        check_placeholder_labels(body).map_err(|why| err(&why))?;
        if !is_dns_name(&body.replace(NAMESPACE, "ns")) {
            return Err(err("does not make a valid DNS name"));
        }
        Ok(Self {
            wildcard,
            body: body.to_owned(),
        })
    }

    /// For messages.
    fn expand(&self, namespace: &str) -> String {
        let body = self.body.replace(NAMESPACE, namespace);
        if self.wildcard {
            format!("*.{body}")
        } else {
            body
        }
    }

    /// `name` has already passed [`is_dns_name`]. A wildcard matches one or more concrete
    /// labels in front of the body, on a label boundary (so `x.ab.svc` is not under `b.svc`).
    fn matches(&self, name: &str, namespace: &str) -> bool {
        let body = self.body.replace(NAMESPACE, namespace);
        if !self.wildcard {
            return name.eq_ignore_ascii_case(&body);
        }
        let Some(split) = name.len().checked_sub(body.len()) else {
            return false;
        };
        let (Some(front), Some(tail)) = (name.get(..split), name.get(split..)) else {
            return false;
        };
        let Some(front) = front.strip_suffix('.') else {
            return false;
        };
        !front.is_empty()
            && tail.eq_ignore_ascii_case(&body)
            && front.split('.').all(|l| l != "*" && is_ldh_label(l))
    }
}

/// Each placeholder must be a whole DNS label of its own and appear once, so that a name maps
/// back to exactly one namespace (and service account): `{namespace}-{serviceaccount}.svc`
/// would give namespace `a-b` with account `c` and namespace `a` with account `b-c` the same
/// name.
fn check_placeholder_labels(body: &str) -> Result<(), String> {
    for placeholder in [NAMESPACE, SERVICE_ACCOUNT] {
        let count = body.matches(placeholder).count();
        if count > 1 {
            return Err(format!("uses {placeholder} {count} times; use it once"));
        }
    }
    for label in body.split('.') {
        let has_placeholder = label.contains(NAMESPACE) || label.contains(SERVICE_ACCOUNT);
        if has_placeholder && label != NAMESPACE && label != SERVICE_ACCOUNT {
            return Err(format!(
                "puts {label:?} in one label; each placeholder must be a whole label of its own \
                 (e.g. {{serviceaccount}}.{{namespace}}.svc), or two namespaces and service \
                 accounts could be given the same name"
            ));
        }
    }
    Ok(())
}

const NAMESPACE: &str = "{namespace}";
const SERVICE_ACCOUNT: &str = "{serviceaccount}";

/// One entry of `policy.kubernetes_dns_templates`.
#[derive(Debug, Clone)]
struct DnsTemplate {
    /// `*.` prefix: matches exactly one (concrete) label.
    wildcard: bool,
    /// The rest, with placeholders.
    body: String,
}

impl DnsTemplate {
    fn parse(template: &str) -> Result<Self, String> {
        let err = |why: &str| format!("policy.kubernetes_dns_templates: {template:?} {why}");
        let (wildcard, body) = match template.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, template),
        };
        // Placeholders: only the two known ones, nothing else in braces.
        let stripped = body.replace(NAMESPACE, "").replace(SERVICE_ACCOUNT, "");
        if stripped.contains('{') || stripped.contains('}') {
            return Err(err(
                "has an unknown placeholder; use {namespace} and {serviceaccount}",
            ));
        }
        if body.contains('*') {
            return Err(err("may use '*' only as a whole leading label (\"*.\")"));
        }
        let sample = body.replace(NAMESPACE, "ns").replace(SERVICE_ACCOUNT, "sa");
        if !is_dns_name(&sample) {
            return Err(err("does not make a valid DNS name"));
        }
        if !body.contains(NAMESPACE) {
            return Err(err(
                "does not contain {namespace}: service accounts of the same name in different \
                 namespaces would get the same DNS names",
            ));
        }
        check_placeholder_labels(body).map_err(|why| err(&why))?;
        Ok(Self {
            wildcard,
            body: body.to_owned(),
        })
    }

    fn expand_body(&self, namespace: &str, service_account: &str) -> String {
        self.body
            .replace(NAMESPACE, namespace)
            .replace(SERVICE_ACCOUNT, service_account)
    }

    /// For messages: the names this template allows the service account.
    fn expand(&self, namespace: &str, service_account: &str) -> String {
        let body = self.expand_body(namespace, service_account);
        if self.wildcard {
            format!("*.{body}")
        } else {
            body
        }
    }

    fn matches(&self, name: &str, namespace: &str, service_account: &str) -> bool {
        let body = self.expand_body(namespace, service_account);
        if self.wildcard {
            match name.split_once('.') {
                Some((first, rest)) => {
                    first != "*" && is_ldh_label(first) && rest.eq_ignore_ascii_case(&body)
                }
                None => false,
            }
        } else {
            name.eq_ignore_ascii_case(&body)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KubernetesBridgeConfig;
    use std::net::Ipv4Addr;

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

    #[test]
    fn a_node_renews_only_its_own_id_without_names() {
        let n1 = node("n1");
        let g = decide_src(&n1, &names(&[], &[]), GrantSource::NodeRenewal, None).expect("ok");
        assert_eq!(g.spiffe_id, id("/signet/node/n1"));
        assert!(g.dns_names.is_empty());
        let r = decide_src(
            &n1,
            &names(&["spiffe://example.org/signet/node/n2"], &[]),
            GrantSource::NodeRenewal,
            None,
        );
        denied(r, DenialKind::PermissionDenied, "policy.identity");
        let r = decide_src(
            &n1,
            &names(&[], &["x.example.org"]),
            GrantSource::NodeRenewal,
            None,
        );
        denied(r, DenialKind::PermissionDenied, "policy.dns_name");
        let r = decide_src(
            &n1,
            &names(&[], &[]),
            GrantSource::NodeRenewal,
            Some("spiffe://example.org/app"),
        );
        denied(r, DenialKind::PermissionDenied, "policy.impersonation");
    }

    #[test]
    fn a_node_may_not_use_the_other_apis() {
        let r = decide_src(&node("n1"), &names(&[], &[]), GrantSource::Caller, None);
        let msg = denied(r, DenialKind::PermissionDenied, "policy.node");
        assert!(msg.contains("RenewNode"), "{msg}");
    }

    #[test]
    fn only_nodes_use_node_sources() {
        let e = entry("n1", 0);
        for caller in [sa("default", "web"), mtls("/app", &[]), admin()] {
            let r = decide_src(&caller, &names(&[], &[]), GrantSource::NodeRenewal, None);
            denied(r, DenialKind::PermissionDenied, "policy.node");
            let r = decide_src(&caller, &names(&[], &[]), GrantSource::Entry(&e), None);
            denied(r, DenialKind::PermissionDenied, "policy.node");
        }
    }

    #[test]
    fn a_node_gets_its_entries_with_their_names_and_ttl() {
        let e = entry("n1", 600);
        let g = decide_src(
            &node("n1"),
            &names(&[], &["app.example.org"]),
            GrantSource::Entry(&e),
            None,
        )
        .expect("ok");
        assert_eq!(g.spiffe_id, id("/app"));
        assert_eq!(g.dns_names, ["app.example.org"]);
        assert_eq!(g.ttl, Duration::from_secs(600));
        // The entry's TTL is clamped like any other.
        let long = entry("n1", 7 * 86400);
        let g = decide_src(
            &node("n1"),
            &names(&[], &[]),
            GrantSource::Entry(&long),
            None,
        )
        .expect("ok");
        assert_eq!(g.ttl, 24 * HOUR);
        // Another node's entry.
        let r = decide_src(&node("n2"), &names(&[], &[]), GrantSource::Entry(&e), None);
        denied(r, DenialKind::PermissionDenied, "policy.entry");
        // Names beyond the entry's, or another ID in the CSR.
        let r = decide_src(
            &node("n1"),
            &names(&[], &["evil.example.org"]),
            GrantSource::Entry(&e),
            None,
        );
        denied(r, DenialKind::PermissionDenied, "policy.dns_name");
        let r = decide_src(
            &node("n1"),
            &names(&["spiffe://example.org/other"], &[]),
            GrantSource::Entry(&e),
            None,
        );
        denied(r, DenialKind::PermissionDenied, "policy.identity");
        // Never an ID under /signet/, even if such an entry existed.
        let reserved = EntryGrant {
            spiffe_id: id("/signet/server"),
            ..entry("n1", 0)
        };
        let r = decide_src(
            &node("n1"),
            &names(&[], &[]),
            GrantSource::Entry(&reserved),
            None,
        );
        denied(r, DenialKind::PermissionDenied, "policy.entry");
    }

    // ---- TTL ----

    #[test]
    fn ttl_zero_is_default_and_long_is_clamped() {
        let web = sa("default", "web");
        let n = names(&[], &[]);
        assert_eq!(decide(&web, &n, 0, None).expect("ok").ttl, HOUR);
        assert_eq!(
            decide(&web, &n, 600, None).expect("ok").ttl,
            Duration::from_secs(600)
        );
        assert_eq!(
            decide(&web, &n, 7 * 86400, None).expect("ok").ttl,
            24 * HOUR
        );
        assert_eq!(
            decide(&web, &n, ABSURD_TTL_SECONDS, None).expect("ok").ttl,
            24 * HOUR
        );
    }

    #[test]
    fn ttl_negative_or_absurd_is_invalid() {
        let web = sa("default", "web");
        let n = names(&[], &[]);
        let m = denied(
            decide(&web, &n, -1, None),
            DenialKind::InvalidArgument,
            "policy.ttl",
        );
        assert!(m.contains("negative"), "{m}");
        let m = denied(
            decide(&web, &n, ABSURD_TTL_SECONDS + 1, None),
            DenialKind::InvalidArgument,
            "policy.ttl",
        );
        assert!(m.contains("absurd"), "{m}");
        denied(
            decide(&web, &n, i64::MAX, None),
            DenialKind::InvalidArgument,
            "policy.ttl",
        );
        denied(
            decide(&web, &n, i64::MIN, None),
            DenialKind::InvalidArgument,
            "policy.ttl",
        );
    }

    // ---- identity ----

    #[test]
    fn caller_gets_its_own_id_with_empty_or_matching_uri() {
        let web = sa("default", "web");
        let g = decide(&web, &names(&[], &[]), 0, None).expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/default/sa/web"));
        assert!(g.dns_names.is_empty() && g.ip_addresses.is_empty());
        // Same ID; scheme and trust domain compare case-insensitively.
        for uri in [
            "spiffe://example.org/ns/default/sa/web",
            "SPIFFE://EXAMPLE.org/ns/default/sa/web",
        ] {
            let g = decide(&web, &names(&[uri], &[]), 0, None).expect(uri);
            assert_eq!(g.spiffe_id, id("/ns/default/sa/web"));
        }
        let m = mtls("/agent/node-1", &[]);
        let g = decide(
            &m,
            &names(&["spiffe://example.org/agent/node-1"], &[]),
            0,
            None,
        )
        .expect("ok");
        assert_eq!(g.spiffe_id, id("/agent/node-1"));
    }

    #[test]
    fn caller_may_not_obtain_another_id() {
        let web = sa("a", "b");
        let msg = denied(
            decide(
                &web,
                &names(&["spiffe://example.org/ns/x/sa/y"], &[]),
                0,
                None,
            ),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        assert_eq!(
            msg,
            "caller spiffe://example.org/ns/a/sa/b may not obtain spiffe://example.org/ns/x/sa/y"
        );
        // The path compares case-sensitively.
        denied(
            decide(
                &web,
                &names(&["spiffe://example.org/ns/A/sa/b"], &[]),
                0,
                None,
            ),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        // Not a SPIFFE ID at all.
        let msg = denied(
            decide(&web, &names(&["https://example.org/"], &[]), 0, None),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        assert!(msg.contains("https://example.org/"), "{msg}");
        // mTLS callers too.
        denied(
            decide(
                &mtls("/agent/node-1", &[]),
                &names(&["spiffe://example.org/agent/node-2"], &[]),
                0,
                None,
            ),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
    }

    #[test]
    fn more_than_one_uri_is_refused() {
        let web = sa("default", "web");
        let own = "spiffe://example.org/ns/default/sa/web";
        let m = denied(
            decide(&web, &names(&[own, own], &[]), 0, None),
            DenialKind::InvalidArgument,
            "policy.uri_count",
        );
        assert!(m.contains("exactly one"), "{m}");
        denied(
            decide(
                &admin(),
                &names(&[own, "spiffe://example.org/x"], &[]),
                0,
                None,
            ),
            DenialKind::InvalidArgument,
            "policy.uri_count",
        );
    }

    #[test]
    fn foreign_trust_domain_is_refused() {
        // A caller whose own ID is outside the trust domain (cannot come from our
        // authenticators, but policy does not rely on that).
        let foreign = AuthenticatedCaller::for_tests(
            "spiffe://other.org/ns/a/sa/b".parse().expect("id"),
            CallerKind::Mtls {
                dns_names: vec![],
                serial: "01".into(),
                leaf_sha256: [7; 32],
            },
        );
        let m = denied(
            decide(&foreign, &names(&[], &[]), 0, None),
            DenialKind::PermissionDenied,
            "policy.trust_domain",
        );
        assert!(m.contains("outside trust domain example.org"), "{m}");
        denied(
            decide(&admin(), &names(&["spiffe://other.org/web"], &[]), 0, None),
            DenialKind::PermissionDenied,
            "policy.trust_domain",
        );
    }

    // ---- impersonation ----

    #[test]
    fn impersonator_may_ask_on_behalf_of_an_id() {
        let ztunnel = sa("istio-system", "ztunnel");
        let target = "spiffe://example.org/ns/default/sa/web";
        let g = decide(&ztunnel, &names(&[], &[]), 0, Some(target)).expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/default/sa/web"));
        let g = decide(&ztunnel, &names(&[target], &[]), 0, Some(target)).expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/default/sa/web"));
        // An empty ImpersonatedIdentity is no impersonation.
        let g = decide(&ztunnel, &names(&[], &[]), 0, Some("")).expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/istio-system/sa/ztunnel"));
    }

    #[test]
    fn impersonation_is_refused_unless_allowed() {
        let target = "spiffe://example.org/ns/default/sa/web";
        let m = denied(
            decide(&sa("default", "other"), &names(&[], &[]), 0, Some(target)),
            DenialKind::PermissionDenied,
            "policy.impersonation",
        );
        assert!(m.contains("not in policy.impersonators"), "{m}");
        let ztunnel = sa("istio-system", "ztunnel");
        denied(
            decide(
                &ztunnel,
                &names(&[], &[]),
                0,
                Some("spiffe://other.org/ns/a/sa/b"),
            ),
            DenialKind::PermissionDenied,
            "policy.trust_domain",
        );
        denied(
            decide(&ztunnel, &names(&[], &[]), 0, Some("not an id")),
            DenialKind::InvalidArgument,
            "policy.impersonation",
        );
        denied(
            decide(&ztunnel, &names(&[], &[]), 0, Some("spiffe://example.org")),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        // The CSR's URI must be the impersonated ID.
        let m = denied(
            decide(
                &ztunnel,
                &names(&["spiffe://example.org/ns/default/sa/db"], &[]),
                0,
                Some(target),
            ),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        assert!(
            m.contains("on behalf of spiffe://example.org/ns/default/sa/web"),
            "{m}"
        );
        // No DNS names on behalf of someone else.
        denied(
            decide(&ztunnel, &names(&[], &["web.default.svc"]), 0, Some(target)),
            DenialKind::PermissionDenied,
            "policy.dns_name",
        );
    }

    // ---- admin ----

    #[test]
    fn admin_may_obtain_any_id_in_the_trust_domain() {
        let n = RequestedNames {
            uris: vec!["spiffe://example.org/ns/web/sa/frontend".into()],
            dns_names: vec!["web.example.org".into(), "*.internal.example.org".into()],
            ip_addresses: vec![
                Ipv4Addr::new(10, 1, 2, 3).into(),
                "fd00::1".parse().expect("ip"),
            ],
            ..RequestedNames::default()
        };
        let g = decide(&admin(), &n, 0, None).expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/web/sa/frontend"));
        assert_eq!(g.dns_names, n.dns_names);
        assert_eq!(g.ip_addresses, n.ip_addresses);
        assert_eq!(g.provenance, Provenance::new(Source::Admin, NOW));
    }

    #[test]
    fn no_one_but_signet_gets_signets_identities_and_names() {
        // The operator may not mint Signet's own identities...
        for path in [
            "/signet/server",
            "/signet/node/n1",
            "/signet/admin",
            "/signet",
        ] {
            let m = denied(
                decide(
                    &admin(),
                    &names(&[&format!("spiffe://example.org{path}")], &[]),
                    0,
                    None,
                ),
                DenialKind::PermissionDenied,
                "policy.reserved",
            );
            assert!(m.contains("reserved"), "{m}");
        }
        // ... nor the server's names or addresses, nor a wildcard that covers one.
        for dns in [
            "localhost",
            "SIGNET.example.com",
            "*.example.com",
            "*.signet-system.svc",
        ] {
            let m = denied(
                decide(
                    &admin(),
                    &names(&["spiffe://example.org/web"], &[dns]),
                    0,
                    None,
                ),
                DenialKind::PermissionDenied,
                "policy.reserved",
            );
            assert!(m.contains("the CA server's own name"), "{dns}: {m}");
        }
        for ip in [Ipv4Addr::LOCALHOST.into(), "::1".parse().expect("ip")] {
            let mut n = names(&["spiffe://example.org/web"], &[]);
            n.ip_addresses = vec![ip];
            denied(
                decide(&admin(), &n, 0, None),
                DenialKind::PermissionDenied,
                "policy.reserved",
            );
        }
        // A name next to a reserved one is fine.
        decide(
            &admin(),
            &names(
                &["spiffe://example.org/web"],
                &["other.example.com", "*.x.example.com"],
            ),
            0,
            None,
        )
        .expect("not reserved");
        // The server itself gets exactly its own identity, with its names and addresses.
        let mut n = names(
            &["spiffe://example.org/signet/server"],
            &["localhost", "signet.example.com"],
        );
        n.ip_addresses = vec![Ipv4Addr::LOCALHOST.into()];
        let g = decide(&server(), &n, 0, None).expect("own");
        assert_eq!(g.spiffe_id, id("/signet/server"));
        assert_eq!(g.provenance.source, Source::Server);
        denied(
            decide(
                &server(),
                &names(&["spiffe://example.org/web"], &[]),
                0,
                None,
            ),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        // A node's entry may not carry the server's name either.
        let mut e = entry("n1", 0);
        e.dns_names = vec!["signet.example.com".into()];
        let m = denied(
            decide_src(
                &node("n1"),
                &names(&[], &["signet.example.com"]),
                GrantSource::Entry(&e),
                None,
            ),
            DenialKind::PermissionDenied,
            "policy.reserved",
        );
        assert!(m.contains("signet.example.com"), "{m}");
        // Nor a bridge's template for the server's own namespace.
        let ask = |dns: &str| {
            let n = names(&["spiffe://example.org/ns/signet-system/sa/x"], &[dns]);
            policy().decide(
                &sa("signet-system", "signet-k8s"),
                &IssueRequest {
                    source: GrantSource::Bridge {
                        namespace: "signet-system",
                    },
                    names: &n,
                    ttl_seconds: 0,
                    impersonate: None,
                    renewal: None,
                },
                NOW,
            )
        };
        assert_eq!(
            ask("signet.signet-system.svc")
                .expect_err("the server's")
                .reason,
            "policy.reserved"
        );
        ask("web.signet-system.svc").expect("another name in that namespace");
    }

    #[test]
    fn admin_must_name_one_valid_id() {
        denied(
            decide(&admin(), &names(&[], &[]), 0, None),
            DenialKind::InvalidArgument,
            "policy.identity",
        );
        denied(
            decide(
                &admin(),
                &names(&["spiffe://example.org/a//b"], &[]),
                0,
                None,
            ),
            DenialKind::InvalidArgument,
            "policy.identity",
        );
        denied(
            decide(&admin(), &names(&["spiffe://example.org"], &[]), 0, None),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        denied(
            decide(
                &admin(),
                &names(&["spiffe://example.org/x"], &["bad_name.example"]),
                0,
                None,
            ),
            DenialKind::InvalidArgument,
            "policy.dns_name",
        );
    }

    // ---- DNS names ----

    #[test]
    fn service_account_gets_its_template_names() {
        let web = sa("default", "web");
        let n = names(
            &[],
            &[
                "web.default.svc",
                "WEB.Default.SVC",
                "api.default.svc.cluster.local",
            ],
        );
        let g = decide(&web, &n, 0, None).expect("ok");
        assert_eq!(g.dns_names, n.dns_names);
    }

    #[test]
    fn service_account_is_refused_other_names() {
        let web = sa("default", "web");
        for name in [
            "db.default.svc",                // another account's name
            "web.kube-system.svc",           // another namespace
            "a.b.default.svc.cluster.local", // '*.' matches exactly one label
            "default.svc.cluster.local",     // and not zero
            "*.default.svc.cluster.local",   // a wildcard is not a label
            "example.com",
        ] {
            let m = denied(
                decide(&web, &names(&[], &[name]), 0, None),
                DenialKind::PermissionDenied,
                "policy.dns_name",
            );
            assert!(m.contains(name), "{m}");
            assert!(
                m.contains("allowed: web.default.svc, *.default.svc.cluster.local"),
                "{m}"
            );
        }
        for name in [
            "",
            "web..default.svc",
            "web.default.svc.",
            "-a.default.svc",
            "10.0.0.1",
        ] {
            denied(
                decide(&web, &names(&[], &[name]), 0, None),
                DenialKind::InvalidArgument,
                "policy.dns_name",
            );
        }
        // Without templates, no names at all.
        let bare = Policy::new(td(), HOUR, 24 * HOUR, &PolicyConfig::default()).expect("policy");
        let n = names(&[], &["web.default.svc"]);
        let d = bare
            .decide(
                &web,
                &IssueRequest {
                    source: GrantSource::Caller,
                    names: &n,
                    ttl_seconds: 0,
                    impersonate: None,
                    renewal: test_basis(&web).as_ref(),
                },
                NOW,
            )
            .expect_err("denied");
        assert!(
            d.message.contains("kubernetes_dns_templates is empty"),
            "{d}"
        );
    }

    #[test]
    fn mtls_caller_renews_only_its_presented_names() {
        let m = mtls("/agent/node-1", &["node-1.example.org", "node-1.internal"]);
        let g = decide(&m, &names(&[], &["NODE-1.example.org"]), 0, None).expect("ok");
        assert_eq!(g.dns_names, ["NODE-1.example.org"]);
        let msg = denied(
            decide(&m, &names(&[], &["node-2.example.org"]), 0, None),
            DenialKind::PermissionDenied,
            "policy.dns_name",
        );
        assert!(msg.contains("node-2.example.org"), "{msg}");
        assert!(msg.contains("node-1.example.org, node-1.internal"), "{msg}");
    }

    // ---- IPs, e-mails, other SAN types ----

    #[test]
    fn ip_addresses_only_for_admin() {
        let mut n = names(&[], &[]);
        n.ip_addresses = vec![Ipv4Addr::new(10, 0, 0, 1).into()];
        for caller in [sa("default", "web"), mtls("/agent/node-1", &[])] {
            let m = denied(
                decide(&caller, &n, 0, None),
                DenialKind::PermissionDenied,
                "policy.ip_address",
            );
            assert!(m.contains("10.0.0.1"), "{m}");
        }
        n.uris = vec!["spiffe://example.org/x".into()];
        decide(&admin(), &n, 0, None).expect("admin");
    }

    #[test]
    fn emails_and_other_san_types_are_never_issued() {
        let mut n = names(&["spiffe://example.org/x"], &[]);
        n.emails = vec!["ops@example.org".into()];
        let m = denied(
            decide(&admin(), &n, 0, None),
            DenialKind::PermissionDenied,
            "policy.san_type",
        );
        assert!(m.contains("ops@example.org"), "{m}");
        let mut n = names(&[], &[]);
        n.other = vec!["otherName".into()];
        let m = denied(
            decide(&sa("default", "web"), &n, 0, None),
            DenialKind::PermissionDenied,
            "policy.san_type",
        );
        assert!(m.contains("otherName"), "{m}");
    }

    // ---- the chain as a whole ----

    #[test]
    fn chain_reports_the_first_failing_check() {
        let web = sa("a", "b");
        let mut n = names(&["spiffe://example.org/ns/x/sa/y"], &["evil.example.com"]);
        n.ip_addresses = vec![Ipv4Addr::new(10, 0, 0, 1).into()];
        n.emails = vec!["x@example.org".into()];
        // Bad TTL comes first.
        denied(
            decide(&web, &n, -5, None),
            DenialKind::InvalidArgument,
            "policy.ttl",
        );
        // Then the e-mail (SAN types).
        denied(
            decide(&web, &n, 0, None),
            DenialKind::PermissionDenied,
            "policy.san_type",
        );
        n.emails.clear();
        // Then the foreign URI.
        denied(
            decide(&web, &n, 0, None),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        n.uris.clear();
        // Then DNS, then IP.
        denied(
            decide(&web, &n, 0, None),
            DenialKind::PermissionDenied,
            "policy.dns_name",
        );
        n.dns_names.clear();
        denied(
            decide(&web, &n, 0, None),
            DenialKind::PermissionDenied,
            "policy.ip_address",
        );
        n.ip_addresses.clear();
        decide(&web, &n, 0, None).expect("all clear");
        // Two URIs is reported before the identity check would look at either.
        let n = names(
            &["spiffe://example.org/ns/a/sa/b", "spiffe://other.org/z"],
            &[],
        );
        denied(
            decide(&web, &n, 0, None),
            DenialKind::InvalidArgument,
            "policy.uri_count",
        );
        assert_eq!(
            CHAIN.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
            [
                "source",
                "renewal",
                "ttl",
                "single_uri",
                "san_types",
                "identity",
                "dns_names",
                "ip_addresses",
                "reserved"
            ]
        );
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

    #[test]
    fn bridge_gets_ids_and_names_of_the_objects_namespace() {
        let g = decide_bridge(
            &bridge(),
            "a",
            &["spiffe://example.org/ns/a/sa/web"],
            &[
                "web.a.svc",
                "x.y.a.svc",
                "web.a.svc.cluster.local",
                "WEB.A.SVC.Cluster.Local",
            ],
        )
        .expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/a/sa/web"));
        assert_eq!(g.dns_names.len(), 4);
        // Any path below the namespace, not only service accounts.
        let g =
            decide_bridge(&bridge(), "a", &["spiffe://example.org/ns/a/x/y/z"], &[]).expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/a/x/y/z"));
        // A bridge presenting a Signet certificate over mTLS works the same way.
        let g = decide_bridge(
            &mtls("/bridge", &[]),
            "kube-system",
            &["spiffe://example.org/ns/kube-system/sa/dns"],
            &["dns.kube-system.svc"],
        )
        .expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/kube-system/sa/dns"));
        // TTL is clamped as for anyone.
        let n = names(&["spiffe://example.org/ns/a/sa/web"], &[]);
        let g = policy()
            .decide(
                &bridge(),
                &IssueRequest {
                    source: GrantSource::Bridge { namespace: "a" },
                    names: &n,
                    ttl_seconds: 7 * 86400,
                    impersonate: None,
                    renewal: test_basis(&bridge()).as_ref(),
                },
                NOW,
            )
            .expect("ok");
        assert_eq!(g.ttl, 24 * HOUR);
    }

    #[test]
    fn bridge_is_refused_other_namespaces_ids() {
        let m = denied(
            decide_bridge(&bridge(), "a", &["spiffe://example.org/ns/b/sa/x"], &[]),
            DenialKind::PermissionDenied,
            "policy.bridge_namespace",
        );
        assert_eq!(
            m,
            "a certificate for an object in namespace a may only carry a SPIFFE ID under \
             spiffe://example.org/ns/a/; the CSR asks for spiffe://example.org/ns/b/sa/x"
        );
        for uri in [
            "spiffe://example.org/ns/a",       // the namespace itself, nothing below
            "spiffe://example.org/ns/ab/sa/x", // a namespace that merely starts with "a"
            "spiffe://example.org/ns/A/sa/x",  // paths compare case-sensitively
            "spiffe://example.org/a/sa/x",     // not under /ns/
            "spiffe://example.org/signet/node/n", // Signet's own IDs
            "spiffe://example.org/ns/signet-system/sa/signet-k8s", // the bridge's own ID
        ] {
            let m = denied(
                decide_bridge(&bridge(), "a", &[uri], &[]),
                DenialKind::PermissionDenied,
                "policy.bridge_namespace",
            );
            assert!(m.contains(uri), "{m}");
        }
        let m = denied(
            decide_bridge(&bridge(), "a", &["spiffe://other.org/ns/a/sa/x"], &[]),
            DenialKind::PermissionDenied,
            "policy.trust_domain",
        );
        assert!(m.contains("outside trust domain example.org"), "{m}");
        // The CSR must name exactly one ID.
        denied(
            decide_bridge(&bridge(), "a", &[], &["web.a.svc"]),
            DenialKind::InvalidArgument,
            "policy.identity",
        );
        denied(
            decide_bridge(
                &bridge(),
                "a",
                &[
                    "spiffe://example.org/ns/a/sa/x",
                    "spiffe://example.org/ns/a/sa/y",
                ],
                &[],
            ),
            DenialKind::InvalidArgument,
            "policy.uri_count",
        );
        denied(
            decide_bridge(&bridge(), "a", &["https://example.org/ns/a/sa/x"], &[]),
            DenialKind::InvalidArgument,
            "policy.identity",
        );
    }

    #[test]
    fn bridge_is_refused_other_namespaces_names() {
        let own = "spiffe://example.org/ns/b/sa/x";
        for name in [
            "web.a.svc",              // another namespace
            "x.ab.svc",               // "ab.svc" is not under "b.svc"
            "x.ab.svc.cluster.local", // nor here
            "b.svc",                  // the wildcard needs at least one label
            "b.svc.cluster.local",
            "*.b.svc", // a wildcard is not a concrete label
            "web.b.svc.example.com",
            "example.com",
        ] {
            let m = denied(
                decide_bridge(&bridge(), "b", &[own], &[name]),
                DenialKind::PermissionDenied,
                "policy.dns_name",
            );
            assert!(m.contains(name), "{m}");
            assert!(
                m.contains("allowed patterns: *.b.svc, *.b.svc.cluster.local"),
                "{m}"
            );
        }
        denied(
            decide_bridge(&bridge(), "b", &[own], &["bad_name.b.svc"]),
            DenialKind::InvalidArgument,
            "policy.dns_name",
        );
        // IPs and e-mails as for anyone but the operator.
        let mut n = names(&[own], &[]);
        n.ip_addresses = vec![Ipv4Addr::new(10, 0, 0, 1).into()];
        let r = decide_src(&bridge(), &n, GrantSource::Bridge { namespace: "b" }, None);
        denied(r, DenialKind::PermissionDenied, "policy.ip_address");
        let mut n = names(&[own], &[]);
        n.emails = vec!["x@example.org".into()];
        let r = decide_src(&bridge(), &n, GrantSource::Bridge { namespace: "b" }, None);
        denied(r, DenialKind::PermissionDenied, "policy.san_type");
    }

    #[test]
    fn only_listed_callers_act_as_the_bridge() {
        let uri = "spiffe://example.org/ns/a/sa/web";
        for caller in [
            sa("a", "web"),
            sa("signet-system", "other"),
            mtls("/bridge/x", &[]),
            node("n1"),
            admin(),
        ] {
            let m = denied(
                decide_bridge(&caller, "a", &[uri], &[]),
                DenialKind::PermissionDenied,
                "policy.bridge",
            );
            assert!(
                m.starts_with(&format!(
                    "caller {} is not a Kubernetes bridge;",
                    caller.spiffe_id()
                )),
                "{m}"
            );
        }
        // Even with a malformed namespace, a stranger learns only that it is no bridge.
        denied(
            decide_bridge(&sa("a", "web"), "Not_A_Namespace", &[uri], &[]),
            DenialKind::PermissionDenied,
            "policy.bridge",
        );
        // A bridge asking without a namespace is an ordinary caller: its own identity.
        let g = decide(&bridge(), &names(&[], &[]), 0, None).expect("ok");
        assert_eq!(g.spiffe_id, id("/ns/signet-system/sa/signet-k8s"));
        denied(
            decide(&bridge(), &names(&[uri], &[]), 0, None),
            DenialKind::PermissionDenied,
            "policy.identity",
        );
        // No impersonation through the bridge.
        let r = decide_src(
            &bridge(),
            &names(&[uri], &[]),
            GrantSource::Bridge { namespace: "a" },
            Some(uri),
        );
        denied(r, DenialKind::PermissionDenied, "policy.impersonation");
    }

    #[test]
    fn bridge_namespace_must_be_a_dns_label() {
        for ns in [
            "A",
            "a_b",
            "-a",
            "a-",
            "a.b",
            "a/b",
            &"a".repeat(64),
            "a\nb",
            " a",
        ] {
            let m = denied(
                decide_bridge(&bridge(), ns, &["spiffe://example.org/ns/a/sa/x"], &[]),
                DenialKind::InvalidArgument,
                "policy.bridge_namespace",
            );
            assert!(m.contains("DNS-1123 label"), "{m}");
        }
        decide_bridge(
            &bridge(),
            &"a".repeat(63),
            &[&format!("spiffe://example.org/ns/{}/sa/x", "a".repeat(63))],
            &[],
        )
        .expect("63 characters is fine");
    }

    #[test]
    fn bridge_feature_is_off_by_default_and_templates_are_checked() {
        let bare = Policy::new(td(), HOUR, 24 * HOUR, &PolicyConfig::default()).expect("policy");
        let n = names(&["spiffe://example.org/ns/a/sa/x"], &[]);
        let d = bare
            .decide(
                &bridge(),
                &IssueRequest {
                    source: GrantSource::Bridge { namespace: "a" },
                    names: &n,
                    ttl_seconds: 0,
                    impersonate: None,
                    renewal: test_basis(&bridge()).as_ref(),
                },
                NOW,
            )
            .expect_err("off");
        assert_eq!(d.reason, "policy.bridge");
        // An exact template is an exact name.
        let cfg = PolicyConfig {
            kubernetes_bridge: KubernetesBridgeConfig {
                callers: vec!["spiffe://example.org/ns/signet-system/sa/signet-k8s".into()],
                dns_templates: vec!["gw.{namespace}.example.com".into()],
            },
            ..PolicyConfig::default()
        };
        let p = Policy::new(td(), HOUR, 24 * HOUR, &cfg).expect("policy");
        let ask = |dns: &str| {
            let n = names(&["spiffe://example.org/ns/a/sa/x"], &[dns]);
            p.decide(
                &bridge(),
                &IssueRequest {
                    source: GrantSource::Bridge { namespace: "a" },
                    names: &n,
                    ttl_seconds: 0,
                    impersonate: None,
                    renewal: test_basis(&bridge()).as_ref(),
                },
                NOW,
            )
        };
        ask("gw.a.example.com").expect("exact");
        assert_eq!(
            ask("x.gw.a.example.com").expect_err("exact only").reason,
            "policy.dns_name"
        );
        for (t, want) in [
            ("*.{serviceaccount}.svc", "unknown placeholder"),
            ("web.*.svc", "'*'"),
            ("*.svc", "{namespace}"),
            ("bad_name.{namespace}", "valid DNS name"),
        ] {
            let cfg = PolicyConfig {
                kubernetes_bridge: KubernetesBridgeConfig {
                    callers: vec![],
                    dns_templates: vec![t.into()],
                },
                ..PolicyConfig::default()
            };
            let e = Policy::new(td(), HOUR, HOUR, &cfg).expect_err(t);
            assert!(
                e.contains("policy.kubernetes_bridge.dns_templates") && e.contains(want),
                "{t}: {e}"
            );
        }
        for (c, want) in [
            ("signet-k8s", "not a SPIFFE ID"),
            ("spiffe://other.org/ns/a/sa/b", "not in trust domain"),
            ("spiffe://example.org", "not a workload ID"),
            ("spiffe://example.org/signet/node/n1", "not a workload ID"),
        ] {
            let cfg = PolicyConfig {
                kubernetes_bridge: KubernetesBridgeConfig {
                    callers: vec![c.into()],
                    ..KubernetesBridgeConfig::default()
                },
                ..PolicyConfig::default()
            };
            let e = Policy::new(td(), HOUR, HOUR, &cfg).expect_err(c);
            assert!(
                e.contains("policy.kubernetes_bridge.callers") && e.contains(want),
                "{c}: {e}"
            );
        }
    }

    // ---- configuration ----

    #[test]
    fn bad_configuration_is_refused_by_name() {
        let ok = PolicyConfig::default();
        assert!(Policy::new(td(), Duration::ZERO, HOUR, &ok).is_err());
        let e = Policy::new(td(), 2 * HOUR, HOUR, &ok).expect_err("refused");
        assert!(e.contains("longer than ca.max_ttl"), "{e}");
        for (t, want) in [
            ("{namespace}.{pod}.svc", "unknown placeholder"),
            ("{namespace.svc", "unknown placeholder"),
            ("web.*.svc", "'*'"),
            ("**.svc", "'*'"),
            ("bad_name.{namespace}", "valid DNS name"),
            ("", "valid DNS name"),
        ] {
            let cfg = PolicyConfig {
                kubernetes_dns_templates: vec![t.into()],
                ..PolicyConfig::default()
            };
            let e = Policy::new(td(), HOUR, HOUR, &cfg).expect_err(t);
            assert!(
                e.contains("kubernetes_dns_templates") && e.contains(want),
                "{t}: {e}"
            );
        }
        for (imp, want) in [
            ("ztunnel", "not a SPIFFE ID"),
            (
                "spiffe://other.org/ns/istio-system/sa/ztunnel",
                "not in trust domain",
            ),
            ("spiffe://example.org", "trust domain ID"),
        ] {
            let cfg = PolicyConfig {
                impersonators: vec![imp.into()],
                ..PolicyConfig::default()
            };
            let e = Policy::new(td(), HOUR, HOUR, &cfg).expect_err(imp);
            assert!(
                e.contains("policy.impersonators") && e.contains(want),
                "{imp}: {e}"
            );
        }
    }

    #[test]
    fn dns_name_syntax() {
        for ok in [
            "localhost",
            "a.b",
            "*.example.org",
            "x-1.example.org",
            &"a".repeat(63),
        ] {
            assert!(is_dns_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "a.",
            "*",
            "*.",
            "a.*.b",
            "a_b",
            "-a",
            "a-",
            "::1",
            "1.2.3.4",
            &"a".repeat(64),
            &format!("{}.b", "a.".repeat(127)),
        ] {
            assert!(!is_dns_name(bad), "{bad}");
        }
    }

    // ---- impersonation yields only ordinary workloads ----

    #[test]
    fn impersonation_never_reaches_privileged_identities() {
        let ztunnel = sa("istio-system", "ztunnel");
        for target in [
            "spiffe://example.org/signet/node/n1",
            "spiffe://example.org/signet/server",
            "spiffe://example.org/signet/admin",
            // a configured bridge, and the impersonator itself
            "spiffe://example.org/ns/signet-system/sa/signet-k8s",
            "spiffe://example.org/ns/istio-system/sa/ztunnel",
            // not a workload's service-account identity
            "spiffe://example.org/bridge",
            "spiffe://example.org/web",
            "spiffe://example.org/ns/a/sa/b/extra",
            "spiffe://example.org/ns/A/sa/b",
            "spiffe://example.org/ns/a",
        ] {
            let r = decide(&ztunnel, &names(&[], &[]), 0, Some(target));
            let d = r.expect_err(target);
            assert!(
                matches!(d.reason, "policy.impersonation" | "policy.identity"),
                "{target}: {d:?}"
            );
            assert_eq!(d.kind, DenialKind::PermissionDenied, "{target}: {d:?}");
        }
        // An ordinary workload still works, without names, recorded as impersonated.
        let g = decide(
            &ztunnel,
            &names(&[], &[]),
            0,
            Some("spiffe://example.org/ns/default/sa/web.v2"),
        )
        .expect("ordinary workload");
        assert_eq!(g.spiffe_id, id("/ns/default/sa/web.v2"));
        assert!(g.dns_names.is_empty());
        assert_eq!(
            g.provenance.source,
            Source::Impersonated {
                impersonator: "spiffe://example.org/ns/istio-system/sa/ztunnel".into()
            }
        );
    }

    #[test]
    fn impersonators_must_be_workloads_and_not_bridges() {
        let cfg = PolicyConfig {
            impersonators: vec!["spiffe://example.org/signet/node/n1".into()],
            ..PolicyConfig::default()
        };
        let e = Policy::new(td(), HOUR, HOUR, &cfg).expect_err("signet");
        assert!(e.contains("one of Signet's own identities"), "{e}");
        let both = "spiffe://example.org/ns/istio-system/sa/ztunnel";
        let cfg = PolicyConfig {
            impersonators: vec![both.into()],
            kubernetes_bridge: KubernetesBridgeConfig {
                callers: vec![both.into()],
                ..KubernetesBridgeConfig::default()
            },
            ..PolicyConfig::default()
        };
        let e = Policy::new(td(), HOUR, HOUR, &cfg).expect_err("both");
        assert!(e.contains("in both policy.impersonators"), "{e}");
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

    #[test]
    fn an_mtls_caller_renews_only_with_a_basis_for_its_own_certificate() {
        let m = mtls("/web", &["web.example.org"]);
        let msg = denied(
            decide_with(&m, &names(&[], &[]), 0, None),
            DenialKind::PermissionDenied,
            "policy.renewal",
        );
        assert!(msg.contains("not re-checked"), "{msg}");
        // A basis made for another caller's certificate does not count.
        let other = mtls("/db", &[]);
        let basis = RenewalBasis::for_tests(&other, vec![], HOUR);
        denied(
            decide_with(&m, &names(&[], &[]), 0, Some(&basis)),
            DenialKind::PermissionDenied,
            "policy.renewal",
        );
        // A basis is meaningless for anyone else.
        let basis = RenewalBasis::for_tests(&m, vec![], HOUR);
        denied(
            decide_with(&sa("a", "b"), &names(&[], &[]), 0, Some(&basis)),
            DenialKind::InvalidArgument,
            "policy.renewal",
        );
    }

    #[test]
    fn a_renewal_is_bounded_by_its_basis() {
        let m = mtls("/web", &["web.example.org", "old.example.org"]);
        // The source still allows one of the two presented names, for ten minutes.
        let basis =
            RenewalBasis::for_tests(&m, vec!["web.example.org".into()], Duration::from_secs(600));
        let g = decide_with(&m, &names(&[], &["web.example.org"]), 86400, Some(&basis))
            .expect("within the basis");
        assert_eq!(g.ttl, Duration::from_secs(600));
        assert_eq!(g.spiffe_id, id("/web"));
        let p = g.provenance;
        assert_eq!(p.source, Source::Admin);
        assert_eq!(p.renewed_from.as_deref(), Some("01"));
        let g = decide_with(&m, &names(&[], &[]), 0, Some(&basis)).expect("default");
        assert_eq!(g.ttl, Duration::from_secs(600));
        let msg = denied(
            decide_with(&m, &names(&[], &["old.example.org"]), 0, Some(&basis)),
            DenialKind::PermissionDenied,
            "policy.dns_name",
        );
        assert!(msg.contains("still allows: web.example.org"), "{msg}");
    }

    // ---- provenance ----

    #[test]
    fn every_grant_records_where_its_authority_came_from() {
        let caller = AuthenticatedCaller::for_tests(
            id("/ns/web/sa/frontend"),
            CallerKind::KubernetesServiceAccount {
                namespace: "web".into(),
                service_account: "frontend".into(),
                pod: Some("frontend-x".into()),
                node: Some("worker-1".into()),
            },
        );
        let g = decide(&caller, &names(&[], &[]), 0, None).expect("sa");
        assert_eq!(
            g.provenance,
            Provenance::new(
                Source::ServiceAccount {
                    namespace: "web".into(),
                    service_account: "frontend".into(),
                    pod: Some("frontend-x".into()),
                    node: Some("worker-1".into()),
                },
                NOW
            )
        );
        let attesting = AuthenticatedCaller::for_tests(
            id("/signet/node/n1"),
            CallerKind::Node {
                node_id: "n1".into(),
                serial: None,
                leaf_sha256: None,
            },
        );
        let g = decide_src(
            &attesting,
            &names(&[], &[]),
            GrantSource::NodeAttestation {
                method: "join_token",
            },
            None,
        )
        .expect("attest");
        assert_eq!(
            g.provenance.source,
            Source::Node {
                node_id: "n1".into(),
                attestation: "join_token".into()
            }
        );
        let g = decide_src(
            &node("n1"),
            &names(&[], &[]),
            GrantSource::NodeRenewal,
            None,
        )
        .expect("renew");
        assert_eq!(
            g.provenance.source,
            Source::Node {
                node_id: "n1".into(),
                attestation: "renewal".into()
            }
        );
        let e = entry("n1", 600);
        let g =
            decide_src(&node("n1"), &names(&[], &[]), GrantSource::Entry(&e), None).expect("entry");
        assert_eq!(
            g.provenance,
            Provenance::new(
                Source::Entry {
                    entry_id: "e1".into(),
                    node_id: "n1".into()
                },
                NOW
            )
        );
        let n = names(&["spiffe://example.org/ns/a/sa/x"], &[]);
        let g = policy()
            .decide(
                &sa("signet-system", "signet-k8s"),
                &IssueRequest {
                    source: GrantSource::Bridge { namespace: "a" },
                    names: &n,
                    ttl_seconds: 0,
                    impersonate: None,
                    renewal: None,
                },
                NOW,
            )
            .expect("bridge");
        assert_eq!(
            g.provenance.source,
            Source::Bridge {
                bridge: "spiffe://example.org/ns/signet-system/sa/signet-k8s".into(),
                namespace: "a".into()
            }
        );
    }

    // ---- DNS templates are unambiguous ----

    #[test]
    fn ambiguous_dns_templates_are_refused_at_start_up() {
        for (t, want) in [
            ("{namespace}-{serviceaccount}.svc", "whole label"),
            ("{serviceaccount}-x.{namespace}.svc", "whole label"),
            ("web.{serviceaccount}.svc", "{namespace}"),
            ("*.cluster.local", "{namespace}"),
            ("{namespace}.{namespace}.svc", "once"),
            ("{serviceaccount}.{serviceaccount}.{namespace}.svc", "once"),
        ] {
            let cfg = PolicyConfig {
                kubernetes_dns_templates: vec![t.into()],
                ..PolicyConfig::default()
            };
            let e = Policy::new(td(), HOUR, HOUR, &cfg).expect_err(t);
            assert!(
                e.contains("policy.kubernetes_dns_templates") && e.contains(want),
                "{t}: {e}"
            );
        }
        for (t, want) in [
            ("x{namespace}.svc", "whole label"),
            ("{namespace}.{namespace}.svc", "once"),
        ] {
            let cfg = PolicyConfig {
                kubernetes_bridge: KubernetesBridgeConfig {
                    callers: vec![],
                    dns_templates: vec![t.into()],
                },
                ..PolicyConfig::default()
            };
            let e = Policy::new(td(), HOUR, HOUR, &cfg).expect_err(t);
            assert!(
                e.contains("policy.kubernetes_bridge.dns_templates") && e.contains(want),
                "{t}: {e}"
            );
        }
        // Whole-label placeholders in either order are fine.
        let cfg = PolicyConfig {
            kubernetes_dns_templates: vec![
                "{serviceaccount}.{namespace}.svc".into(),
                "{namespace}.{serviceaccount}.example.com".into(),
                "*.{namespace}.svc.cluster.local".into(),
            ],
            ..PolicyConfig::default()
        };
        Policy::new(td(), HOUR, HOUR, &cfg).expect("unambiguous");
    }
}
