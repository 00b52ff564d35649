//! The Kubernetes bridge (SignCsr with `kubernetes_namespace`): certificates for the objects
//! of one namespace at a time, never naming another namespace's identity or DNS names.
//!
//! The bridge's rules are written once here and shared with the Registration service
//! (`crate::registration`), which polices the entries the bridge keeps by the same rules:
//! who is a bridge ([`Policy::admit_bridge`]), what a namespace is ([`check_namespace`]),
//! which IDs belong to a namespace ([`is_under_namespace`]) and which DNS names
//! ([`Policy::bridge_may_have_dns_name`]).

use signet_types::SpiffeId;
use signet_types::dns::Dns1123Label;
use signet_types::untrusted::quoted;

use super::{Ctx, Resolver, foreign, named};
use crate::authn::{AuthenticatedCaller, CallerKind};
use crate::policy::{Denial, Policy};
use crate::provenance::{Provenance, Source};

/// The Kubernetes bridge for an object in `namespace`: a listed caller (never a node), no
/// impersonation, a namespace that is a DNS-1123 label; the CSR's one SPIFFE ID under
/// `/ns/<namespace>/`, DNS names by `policy.kubernetes_bridge.dns_templates`.
pub(super) struct Bridge<'a> {
    pub(super) namespace: &'a str,
}

impl Resolver for Bridge<'_> {
    fn admit(&self, cx: &Ctx<'_>) -> Result<(), Denial> {
        cx.policy.admit_bridge(
            cx.caller,
            cx.req.impersonated(),
            "may set kubernetes_namespace (leave it empty to ask for your own identity)",
        )?;
        check_namespace(self.namespace)
    }

    /// The CSR's one URI SAN, in our trust domain, under `/ns/<namespace>/` and naming
    /// something below it.
    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        let namespace = self.namespace;
        let td = &cx.policy.td;
        let prefix = format!("spiffe://{td}/ns/{namespace}/");
        let id = named(uri, || {
            format!(
                "a certificate for an object in namespace {namespace} names its SPIFFE ID in \
                 the CSR's URI SAN (exactly one, under {prefix})"
            )
        })?;
        if !id.is_member_of(td) {
            return Err(foreign(&id, cx.policy));
        }
        if !is_under_namespace(&id, namespace) {
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

    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial> {
        cx.policy.bridge_may_have_dns_name(self.namespace, name)
    }

    fn provenance(&self, cx: &Ctx<'_>, now: i64) -> Result<Provenance, Denial> {
        let source = Source::Bridge {
            bridge: cx.caller_id().to_string(),
            namespace: self.namespace.to_owned(),
        };
        Ok(Provenance::new(source, now))
    }
}

impl Policy {
    /// Whether `caller` may act as the Kubernetes bridge: listed in
    /// `policy.kubernetes_bridge.callers`, never a node, the operator or the server itself, and
    /// never on behalf of another identity. `what` ends the refusal: what only a bridge may do.
    pub(crate) fn admit_bridge(
        &self,
        caller: &AuthenticatedCaller,
        impersonated: Option<&str>,
        what: &str,
    ) -> Result<(), Denial> {
        let listed = !matches!(
            caller.kind(),
            CallerKind::Node { .. } | CallerKind::Admin | CallerKind::Server
        ) && self.bridge_callers.contains(caller.spiffe_id());
        if !listed {
            return Err(Denial::denied(
                "policy.bridge",
                format!(
                    "caller {} is not a Kubernetes bridge; only the callers in \
                     policy.kubernetes_bridge.callers {what}",
                    caller.spiffe_id()
                ),
            ));
        }
        if impersonated.is_some() {
            return Err(Denial::denied(
                "policy.impersonation",
                "the Kubernetes bridge never asks on behalf of another identity",
            ));
        }
        Ok(())
    }

    /// Whether the bridge may put DNS name `name` on an identity of an object in `namespace`:
    /// one of `policy.kubernetes_bridge.dns_templates` matches it; the refusal lists them.
    pub(crate) fn bridge_may_have_dns_name(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(), Denial> {
        let templates = &self.bridge_dns_templates;
        if templates.iter().any(|t| t.matches(name, namespace, None)) {
            return Ok(());
        }
        let why = if templates.is_empty() {
            "no DNS names are allowed (policy.kubernetes_bridge.dns_templates is empty)".to_owned()
        } else {
            let allowed: Vec<String> = templates
                .iter()
                .map(|t| t.expand(namespace, None))
                .collect();
            format!("allowed patterns: {}", allowed.join(", "))
        };
        Err(Denial::denied(
            "policy.dns_name",
            format!(
                "a certificate for an object in namespace {namespace} may not carry DNS name \
                 {name}: {why}"
            ),
        ))
    }
}

/// A Kubernetes namespace name: a DNS-1123 label.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), Denial> {
    if Dns1123Label::is_valid(namespace) {
        return Ok(());
    }
    Err(Denial::invalid(
        "policy.bridge_namespace",
        format!(
            "kubernetes_namespace {} is not a Kubernetes namespace name (a DNS-1123 \
             label: 1 to 63 lowercase letters, digits and '-', starting and ending with \
             a letter or digit)",
            quoted(namespace)
        ),
    ))
}

/// Whether `id`'s path is `/ns/<namespace>/<something>`: an identity of an object of that
/// namespace (its trust domain is checked apart).
pub(crate) fn is_under_namespace(id: &SpiffeId, namespace: &str) -> bool {
    id.path()
        .strip_prefix("/ns/")
        .and_then(|rest| rest.strip_prefix(namespace))
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|rest| !rest.is_empty())
}
