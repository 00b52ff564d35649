//! Istio's `ImpersonatedIdentity`: a trusted node agent (ztunnel) asks on behalf of a
//! workload. Only callers in `policy.impersonators`, only ordinary workload identities.

use signet_types::SpiffeId;
use signet_types::dns::{Dns1123Label, Dns1123Subdomain};
use signet_types::untrusted::quoted;

use super::{Ctx, Resolver, dns_refused, fixed};
use crate::policy::Denial;
use crate::provenance::{Provenance, Source};

/// Istio's `ImpersonatedIdentity`: a caller listed in `policy.impersonators` asks on behalf
/// of `target`, an ordinary workload identity, with no DNS names.
pub(super) struct Impersonation<'a> {
    pub(super) target: &'a str,
}

impl Resolver for Impersonation<'_> {
    fn admit(&self, _: &Ctx<'_>) -> Result<(), Denial> {
        Ok(())
    }

    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        if !cx.policy.impersonators.contains(cx.caller_id()) {
            return Err(Denial::denied(
                "policy.impersonation",
                format!(
                    "caller {} may not ask on behalf of another identity \
                     (ImpersonatedIdentity {}): it is not in policy.impersonators",
                    cx.caller_id(),
                    quoted(self.target)
                ),
            ));
        }
        let id: SpiffeId = self.target.parse().map_err(|e| {
            Denial::invalid(
                "policy.impersonation",
                format!(
                    "ImpersonatedIdentity {} is not a SPIFFE ID: {e}",
                    quoted(self.target)
                ),
            )
        })?;
        fixed(cx, id, uri, true)
    }

    /// What an impersonator may obtain: an ordinary workload identity
    /// (`/ns/<namespace>/sa/<name>`), never one under `/signet/`, never an identity that is
    /// itself privileged here (an impersonator or a Kubernetes bridge). Istio's node authorizer
    /// also checks that the workload runs on the impersonator's node; this server has no view of
    /// pods, so that check is not made (SECURITY.md).
    fn check_identity(&self, cx: &Ctx<'_>, id: &SpiffeId) -> Result<(), Denial> {
        let refuse = |why: &str| {
            Denial::denied(
                "policy.impersonation",
                format!(
                    "caller {} may not obtain {id} on behalf of another identity: {why}",
                    cx.caller_id()
                ),
            )
        };
        if !is_workload_service_account_path(id.path()) {
            return Err(refuse(
                "impersonation yields only Kubernetes workload identities \
                 (spiffe://<trust domain>/ns/<namespace>/sa/<service account>)",
            ));
        }
        match cx.policy.privileged_role(id) {
            Some(role) => Err(refuse(&format!("it is {role}"))),
            None => Ok(()),
        }
    }

    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial> {
        Err(dns_refused(
            cx,
            name,
            "no DNS names are granted when asking on behalf of another identity",
        ))
    }

    fn provenance(&self, cx: &Ctx<'_>, now: i64) -> Result<Provenance, Denial> {
        let source = Source::Impersonated {
            impersonator: cx.caller_id().to_string(),
        };
        Ok(Provenance::new(source, now))
    }
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
    Dns1123Label::is_valid(namespace) && Dns1123Subdomain::is_valid(service_account)
}
