//! Where a grant's authority comes from: one [`Resolver`] per grant source.
//!
//! A request is decided by the resolver that [`Ctx::new`] picks from its [`GrantSource`], its
//! `ImpersonatedIdentity` and the caller's kind. Each resolver answers, for its source alone:
//! who may use it ([`Resolver::admit`], the chain's `source` check), which identity is granted,
//! which DNS names and IP addresses the certificate may carry, whether a reserved `/signet/`
//! identity is its own, how long the certificate may live and the provenance the ledger
//! records. A new kind of caller is one new resolver and one line in [`Ctx::new`].
//!
//! | resolver | request |
//! |---|---|
//! | [`ServiceAccount`](caller::ServiceAccount) | a Kubernetes service-account token, for its own identity |
//! | [`MtlsRenewal`](caller::MtlsRenewal) | a Signet certificate over mTLS, renewing itself |
//! | [`Operator`](caller::Operator) | the admin socket: any identity it names |
//! | [`ServerOwn`](caller::ServerOwn) | the server's own TLS certificate |
//! | [`Impersonation`](impersonation::Impersonation) | `ImpersonatedIdentity`: a listed impersonator on behalf of a workload |
//! | [`Bridge`](bridge::Bridge) | SignCsr with `kubernetes_namespace`: the bridge, for an object's identity |
//! | [`NodeIdentity`](node::NodeIdentity) | Attest and RenewNode: a node's own node identity |
//! | [`Entry`](node::Entry) | SignWorkloads: a node, for one of its registration entries |
//! | [`NodeOutsideNodeApi`](node::NodeOutsideNodeApi) | a node on an ordinary API: always refused |
//!
//! Invariant: every method is pure and sees only the [`Ctx`]; the identity a resolver
//! returns is then checked for every source alike ([`resolve_identity`]: our trust domain, a
//! path), so no resolver can grant a foreign or pathless ID.

use std::time::Duration;

use signet_types::SpiffeId;
use signet_types::untrusted::{quoted, shown};

use super::{Denial, GrantSource, IssueRequest, Policy};
use crate::authn::{AuthenticatedCaller, CallerKind};
use crate::provenance::Provenance;

pub(crate) mod bridge;
mod caller;
mod impersonation;
mod node;

use bridge::Bridge;
use caller::{MtlsRenewal, Operator, ServerOwn, ServiceAccount};
use impersonation::Impersonation;
use node::{Entry, NodeIdentity, NodeOutsideNodeApi};

/// One decision's inputs and the resolver for its source.
pub(super) struct Ctx<'a> {
    pub(super) policy: &'a Policy,
    pub(super) caller: &'a AuthenticatedCaller,
    pub(super) req: &'a IssueRequest<'a>,
    pub(super) resolver: Box<dyn Resolver + 'a>,
}

impl<'a> Ctx<'a> {
    /// Picks the resolver for `req` from `caller`.
    pub(super) fn new(
        policy: &'a Policy,
        caller: &'a AuthenticatedCaller,
        req: &'a IssueRequest<'a>,
    ) -> Self {
        let node_id = match caller.kind() {
            CallerKind::Node { node_id, .. } => Some(node_id.as_str()),
            _ => None,
        };
        let resolver: Box<dyn Resolver + 'a> = match req.source {
            GrantSource::Bridge { namespace } => Box::new(Bridge { namespace }),
            GrantSource::Entry(entry) => Box::new(Entry { entry, node_id }),
            GrantSource::NodeRenewal => Box::new(NodeIdentity {
                attestation: "renewal",
                node_id,
            }),
            GrantSource::NodeAttestation { method } => Box::new(NodeIdentity {
                attestation: method,
                node_id,
            }),
            GrantSource::Caller => match (caller.kind(), req.impersonated()) {
                (CallerKind::Node { .. }, _) => Box::new(NodeOutsideNodeApi),
                (_, Some(target)) => Box::new(Impersonation { target }),
                (
                    CallerKind::KubernetesServiceAccount {
                        namespace,
                        service_account,
                        pod,
                        node,
                    },
                    None,
                ) => Box::new(ServiceAccount {
                    namespace,
                    service_account,
                    pod,
                    node,
                }),
                (CallerKind::Mtls { .. }, None) => Box::new(MtlsRenewal),
                (CallerKind::Admin, None) => Box::new(Operator),
                (CallerKind::Server, None) => Box::new(ServerOwn),
            },
        };
        Self {
            policy,
            caller,
            req,
            resolver,
        }
    }

    pub(super) fn caller_id(&self) -> &SpiffeId {
        self.caller.spiffe_id()
    }
}

/// What one grant source decides. See the module docs.
pub(super) trait Resolver {
    /// The chain's `source` check: whether this caller may use this source at all.
    fn admit(&self, cx: &Ctx<'_>) -> Result<(), Denial>;

    /// The lifetime asked for, in seconds (0: the default).
    fn requested_ttl(&self, cx: &Ctx<'_>) -> i64 {
        cx.req.ttl_seconds
    }

    /// The SPIFFE ID to grant, given the CSR's one URI SAN, if any.
    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial>;

    /// Further checks of the identity, once it is known to be a workload ID of our trust
    /// domain.
    fn check_identity(&self, _cx: &Ctx<'_>, _id: &SpiffeId) -> Result<(), Denial> {
        Ok(())
    }

    /// Whether the certificate may carry `name` (already a valid DNS name); the refusal says
    /// which names it may carry.
    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial>;

    /// Whether the certificate may carry IP addresses.
    fn allows_ip_addresses(&self) -> bool {
        false
    }

    /// Whether `id`, under `/signet/`, is this grant's own (the server's, a node's node ID).
    fn owns_reserved(&self, _cx: &Ctx<'_>, _id: &SpiffeId) -> bool {
        false
    }

    /// Whether this is the server's own certificate, the only one that may carry the server's
    /// DNS names and addresses.
    fn is_server_own(&self) -> bool {
        false
    }

    /// A bound on the lifetime below the CA's maximum.
    fn max_ttl(&self, _cx: &Ctx<'_>) -> Option<Duration> {
        None
    }

    /// Where the authority for the grant comes from (see [`crate::provenance`]). A
    /// combination the chain should not have let through is refused rather than recorded
    /// under a guessed source.
    fn provenance(&self, cx: &Ctx<'_>, now: i64) -> Result<Provenance, Denial>;
}

/// The chain's `identity` step: the source's identity, then the rules every identity meets.
pub(super) fn resolve_identity(cx: &Ctx<'_>) -> Result<SpiffeId, Denial> {
    let uri = requested_uri(cx.req)?;
    let id = cx.resolver.identity(cx, uri)?;
    let td = &cx.policy.td;
    if !id.is_member_of(td) {
        return Err(foreign(&id, cx.policy));
    }
    if id.path().is_empty() {
        return Err(Denial::denied(
            "policy.identity",
            format!("{id} is the trust domain's own ID; an X509-SVID names a workload path"),
        ));
    }
    cx.resolver.check_identity(cx, &id)?;
    Ok(id)
}

/// The CSR's URI SAN: none or one.
pub(super) fn requested_uri<'a>(req: &IssueRequest<'a>) -> Result<Option<&'a str>, Denial> {
    match req.names.uris.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.as_str())),
        many => Err(Denial::invalid(
            "policy.uri_count",
            format!(
                "the CSR asks for {} URI SANs; an X509-SVID carries exactly one (its SPIFFE ID)",
                many.len()
            ),
        )),
    }
}

// ---- shared by the resolvers ------------------------------------------------------------

fn foreign(id: &SpiffeId, p: &Policy) -> Denial {
    Denial::denied(
        "policy.trust_domain",
        format!(
            "{id} is outside trust domain {}; this CA issues only spiffe://{}/… IDs",
            p.td, p.td
        ),
    )
}

/// A fixed identity: the CSR's URI SAN, if any, must be exactly `id`.
fn fixed(
    cx: &Ctx<'_>,
    id: SpiffeId,
    uri: Option<&str>,
    on_behalf: bool,
) -> Result<SpiffeId, Denial> {
    if let Some(uri) = uri
        && !uri.parse::<SpiffeId>().is_ok_and(|asked| asked == id)
    {
        let on_behalf = if on_behalf {
            format!(" (asking on behalf of {id})")
        } else {
            String::new()
        };
        return Err(Denial::denied(
            "policy.identity",
            format!(
                "caller {}{on_behalf} may not obtain {}",
                cx.caller_id(),
                shown(uri)
            ),
        ));
    }
    Ok(id)
}

/// An identity the caller names: the CSR's URI SAN, which must be there and be a SPIFFE ID.
fn named(uri: Option<&str>, missing: impl FnOnce() -> String) -> Result<SpiffeId, Denial> {
    let Some(uri) = uri else {
        return Err(Denial::invalid("policy.identity", missing()));
    };
    uri.parse().map_err(|e| {
        Denial::invalid(
            "policy.identity",
            format!("URI SAN {} is not a SPIFFE ID: {e}", quoted(uri)),
        )
    })
}

fn dns_refused(cx: &Ctx<'_>, name: &str, why: &str) -> Denial {
    Denial::denied(
        "policy.dns_name",
        format!(
            "caller {} may not obtain DNS name {name}: {why}",
            cx.caller_id()
        ),
    )
}

fn unexpected_caller(cx: &Ctx<'_>) -> Denial {
    Denial::denied(
        "policy.provenance",
        format!(
            "caller {} cannot be granted a certificate through this API",
            cx.caller_id()
        ),
    )
}
