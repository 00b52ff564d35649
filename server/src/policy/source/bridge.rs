//! The Kubernetes bridge (SignCsr with `kubernetes_namespace`): certificates for the objects
//! of one namespace at a time, never naming another namespace's identity or DNS names.

use signet_types::SpiffeId;
use signet_types::dns::Dns1123Label;
use signet_types::untrusted::quoted;

use super::{Ctx, Resolver, foreign, named};
use crate::authn::CallerKind;
use crate::policy::Denial;
use crate::provenance::{Provenance, Source};

/// The Kubernetes bridge for an object in `namespace`: a listed caller (never a node), no
/// impersonation, a namespace that is a DNS-1123 label; the CSR's one SPIFFE ID under
/// `/ns/<namespace>/`, DNS names by `policy.kubernetes_bridge.dns_templates`.
pub(super) struct Bridge<'a> {
    pub(super) namespace: &'a str,
}

impl Resolver for Bridge<'_> {
    fn admit(&self, cx: &Ctx<'_>) -> Result<(), Denial> {
        let listed = !matches!(
            cx.caller.kind(),
            CallerKind::Node { .. } | CallerKind::Admin | CallerKind::Server
        ) && cx.policy.bridge_callers.contains(cx.caller_id());
        if !listed {
            return Err(Denial::denied(
                "policy.bridge",
                format!(
                    "caller {} is not a Kubernetes bridge; only the callers in \
                     policy.kubernetes_bridge.callers may set kubernetes_namespace (leave it \
                     empty to ask for your own identity)",
                    cx.caller_id()
                ),
            ));
        }
        if cx.req.impersonated().is_some() {
            return Err(Denial::denied(
                "policy.impersonation",
                "the Kubernetes bridge never asks on behalf of another identity",
            ));
        }
        if !Dns1123Label::is_valid(self.namespace) {
            return Err(Denial::invalid(
                "policy.bridge_namespace",
                format!(
                    "kubernetes_namespace {} is not a Kubernetes namespace name (a DNS-1123 \
                     label: 1 to 63 lowercase letters, digits and '-', starting and ending with \
                     a letter or digit)",
                    quoted(self.namespace)
                ),
            ));
        }
        Ok(())
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

    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial> {
        let namespace = self.namespace;
        let templates = &cx.policy.bridge_dns_templates;
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

    fn provenance(&self, cx: &Ctx<'_>, now: i64) -> Result<Provenance, Denial> {
        let source = Source::Bridge {
            bridge: cx.caller_id().to_string(),
            namespace: self.namespace.to_owned(),
        };
        Ok(Provenance::new(source, now))
    }
}
