//! The issuance decision: may this authenticated caller have this identity, these names and
//! this lifetime?
//!
//! Written as a chain of small pure checks (the cert-manager policy-chain style).
//! [`Policy::decide`] first picks the resolver for the request's grant source
//! ([`source`]: one per source, so a new kind of caller is one new resolver), then runs the
//! checks of [`checks::CHAIN`] in order; the first failure is the answer. The `identity` step of
//! the chain resolves the SPIFFE ID once, and the checks after it look at that result. When
//! every check passes, `decide` assembles the [`Grant`], the only source of a certificate's
//! names.
//!
//! Where each part lives:
//! - this file: the request ([`IssueRequest`], [`GrantSource`]), the answer ([`Denial`]) and
//!   [`Policy::decide`];
//! - [`checks`]: the chain and the checks that do not depend on the source;
//! - [`source`]: the resolvers (who may use a source, the identity, DNS names, IPs, reserved
//!   identities, lifetime bound and provenance of each source);
//! - [`grant`]: the [`Grant`], which only `decide` makes;
//! - [`config`]: building a [`Policy`] from configuration, with a typed [`config::PolicyConfigError`];
//! - [`dns_template`]: the DNS templates of service accounts and of the bridge (one type);
//! - [`renewal`]: what a certificate presented over mTLS may be renewed into;
//! - [`row_cache`]: the short-lived cache of presented certificates' ledger rows.
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
//! Every grant carries its [`Provenance`](crate::provenance::Provenance), which the issuer
//! records in the ledger.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use signet_types::{SpiffeId, TrustDomain};

use crate::authn::AuthenticatedCaller;
use crate::issuance::RequestedNames;

mod checks;
pub(crate) mod config;
pub(crate) mod dns_template;
pub(crate) mod grant;
pub(crate) mod renewal;
pub(crate) mod row_cache;
mod source;
#[cfg(test)]
mod tests;

pub use grant::Grant;
pub(crate) use source::bridge::{check_namespace, is_under_namespace};

use checks::{CHAIN, Step};
use dns_template::DnsTemplate;
use renewal::RenewalBasis;

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
    pub(crate) fn invalid(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind: DenialKind::InvalidArgument,
            reason,
            message: message.into(),
        }
    }

    pub(crate) fn denied(reason: &'static str, message: impl Into<String>) -> Self {
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

/// Why a certificate is asked for, beyond "for the caller itself". Each source has its
/// resolver in [`source`].
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
    /// The parent's SPIFFE ID: a node's, or a node set's.
    pub parent_id: SpiffeId,
    pub dns_names: Vec<String>,
    /// 0: the default; clamped to the maximum like any request.
    pub ttl_seconds: i64,
    /// When the parent is a node set: whether the calling node is a member of it now
    /// (decided from the stored rows at this request). None for a node parent.
    pub node_set: Option<crate::node_sets::NodeSetMembership>,
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

impl IssueRequest<'_> {
    /// The identity asked on behalf of, if any (an empty `ImpersonatedIdentity` is none).
    fn impersonated(&self) -> Option<&str> {
        self.impersonate.filter(|s| !s.is_empty())
    }
}

/// The issuance policy, built once from configuration ([`Policy::new`], in [`config`]).
#[derive(Debug, Clone)]
pub struct Policy {
    td: TrustDomain,
    default_ttl: Duration,
    max_ttl: Duration,
    dns_templates: Vec<DnsTemplate>,
    impersonators: Vec<SpiffeId>,
    bridge_callers: Vec<SpiffeId>,
    bridge_dns_templates: Vec<DnsTemplate>,
    mtls_renewal_max_age: Duration,
    server_dns_names: Vec<String>,
    server_ip_addresses: Vec<IpAddr>,
}

impl Policy {
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

    /// Whether `id` is itself privileged here, and as what: an impersonator's or a Kubernetes
    /// bridge's identity. Neither impersonation nor a registrar's entry may ever yield one
    /// (a certificate for it would act as that privileged caller over mTLS).
    pub(crate) fn privileged_role(&self, id: &SpiffeId) -> Option<&'static str> {
        if self.impersonators.contains(id) {
            Some("an impersonator's identity")
        } else if self.bridge_callers.contains(id) {
            Some("a Kubernetes bridge's identity")
        } else {
            None
        }
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
            .any(|t| t.matches(name, namespace, Some(service_account)))
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
        let cx = source::Ctx::new(self, caller, req);
        let mut identity = None;
        for (_name, step) in CHAIN {
            match step {
                Step::Request(check) => check(&cx)?,
                Step::Identity => identity = Some(source::resolve_identity(&cx)?),
                Step::Granted(check) => {
                    check(&cx, identity.as_ref().ok_or_else(checks::unordered)?)?
                }
            }
        }
        let spiffe_id = identity.ok_or_else(checks::unordered)?;
        let mut ttl = checks::granted_ttl(self, cx.resolver.requested_ttl(&cx))?;
        if let Some(bound) = cx.resolver.max_ttl(&cx) {
            ttl = ttl.min(bound);
        }
        Ok(Grant {
            spiffe_id,
            dns_names: req.names.dns_names.clone(),
            ip_addresses: req.names.ip_addresses.clone(),
            ttl,
            provenance: cx.resolver.provenance(&cx, now)?,
        })
    }
}

/// `/signet` and everything under `/signet/`: Signet's own identities.
fn is_reserved(id: &SpiffeId) -> bool {
    let path = id.path();
    path == "/signet" || path.starts_with("/signet/")
}
