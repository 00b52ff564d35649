//! The ordinary APIs (SignCsr, Istio's CreateCertificate, the admin socket), for the caller's
//! own identity: a service account with its token, a certificate renewing itself over mTLS,
//! the operator, the server's own certificate.

use std::time::Duration;

use signet_types::SpiffeId;

use super::{Ctx, Resolver, dns_refused, fixed, named};
use crate::authn::SERVER_PATH;
use crate::policy::Denial;
use crate::provenance::{Provenance, Source};

/// A Kubernetes service account with its token: its own identity, the DNS names of
/// `policy.kubernetes_dns_templates`.
pub(super) struct ServiceAccount<'a> {
    pub(super) namespace: &'a str,
    pub(super) service_account: &'a str,
    pub(super) pod: &'a Option<String>,
    pub(super) node: &'a Option<String>,
}

impl Resolver for ServiceAccount<'_> {
    fn admit(&self, _: &Ctx<'_>) -> Result<(), Denial> {
        Ok(())
    }

    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        fixed(cx, cx.caller_id().clone(), uri, false)
    }

    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial> {
        let p = cx.policy;
        if p.service_account_may_have(name, self.namespace, self.service_account) {
            return Ok(());
        }
        let why = if p.dns_templates.is_empty() {
            "no DNS names are allowed for service accounts (policy.kubernetes_dns_templates is \
             empty)"
                .to_owned()
        } else {
            let names: Vec<String> = p
                .dns_templates
                .iter()
                .map(|t| t.expand(self.namespace, Some(self.service_account)))
                .collect();
            format!("allowed: {}", names.join(", "))
        };
        Err(dns_refused(cx, name, &why))
    }

    fn provenance(&self, _: &Ctx<'_>, now: i64) -> Result<Provenance, Denial> {
        let source = Source::ServiceAccount {
            namespace: self.namespace.to_owned(),
            service_account: self.service_account.to_owned(),
            pod: self.pod.clone(),
            node: self.node.clone(),
        };
        Ok(Provenance::new(source, now))
    }
}

/// A Signet certificate presented over mTLS, renewed within its [`super::RenewalBasis`]: the
/// same identity, the presented names its source still allows, the basis's lifetime.
pub(super) struct MtlsRenewal;

impl Resolver for MtlsRenewal {
    fn admit(&self, _: &Ctx<'_>) -> Result<(), Denial> {
        Ok(())
    }

    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        fixed(cx, cx.caller_id().clone(), uri, false)
    }

    fn check_dns_name(&self, cx: &Ctx<'_>, name: &str) -> Result<(), Denial> {
        let names = cx.req.renewal.map(|b| b.dns_names()).unwrap_or_default();
        if names.iter().any(|d| d.eq_ignore_ascii_case(name)) {
            return Ok(());
        }
        let why = if names.is_empty() {
            "a renewal carries no DNS names here (none on the presented certificate that its \
             source still allows)"
                .to_owned()
        } else {
            format!(
                "a renewal may carry only the presented certificate's DNS names that its source \
                 still allows: {}",
                names.join(", ")
            )
        };
        Err(dns_refused(cx, name, &why))
    }

    fn max_ttl(&self, cx: &Ctx<'_>) -> Option<Duration> {
        cx.req.renewal.map(|b| b.max_ttl())
    }

    fn provenance(&self, cx: &Ctx<'_>, _now: i64) -> Result<Provenance, Denial> {
        cx.req.renewal.map(|b| b.carried_forward()).ok_or_else(|| {
            Denial::denied(
                "policy.renewal",
                "a renewal over mTLS needs its re-checked basis",
            )
        })
    }
}

/// The operator on the admin socket: the identity it names, any DNS names and IP addresses
/// (but never Signet's own, see the `reserved` check).
pub(super) struct Operator;

impl Resolver for Operator {
    fn admit(&self, _: &Ctx<'_>) -> Result<(), Denial> {
        Ok(())
    }

    fn identity(&self, _: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        named(uri, || {
            "name the SPIFFE ID to issue in the CSR's URI SAN (exactly one)".to_owned()
        })
    }

    fn check_dns_name(&self, _: &Ctx<'_>, _: &str) -> Result<(), Denial> {
        Ok(())
    }

    fn allows_ip_addresses(&self) -> bool {
        true
    }

    fn provenance(&self, _: &Ctx<'_>, now: i64) -> Result<Provenance, Denial> {
        Ok(Provenance::new(Source::Admin, now))
    }
}

/// The server's own TLS certificate: `spiffe://<td>/signet/server` with the server's names.
pub(super) struct ServerOwn;

impl Resolver for ServerOwn {
    fn admit(&self, _: &Ctx<'_>) -> Result<(), Denial> {
        Ok(())
    }

    fn identity(&self, cx: &Ctx<'_>, uri: Option<&str>) -> Result<SpiffeId, Denial> {
        let id =
            cx.policy.td.id(SERVER_PATH).map_err(|e| {
                Denial::invalid("policy.identity", format!("server SPIFFE ID: {e}"))
            })?;
        fixed(cx, id, uri, false)
    }

    fn check_dns_name(&self, _: &Ctx<'_>, _: &str) -> Result<(), Denial> {
        Ok(())
    }

    fn allows_ip_addresses(&self) -> bool {
        true
    }

    fn owns_reserved(&self, _: &Ctx<'_>, id: &SpiffeId) -> bool {
        id.path() == SERVER_PATH
    }

    fn is_server_own(&self) -> bool {
        true
    }

    fn provenance(&self, _: &Ctx<'_>, now: i64) -> Result<Provenance, Denial> {
        Ok(Provenance::new(Source::Server, now))
    }
}
