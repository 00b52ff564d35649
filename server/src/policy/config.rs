//! Building a [`Policy`] from configuration (`[ca]` lifetimes and `[policy]`).
//!
//! Invariant: a [`Policy`] only exists validated. Every rule a configuration value must meet
//! is checked here, once, at start-up, and a refusal is a [`PolicyConfigError`] that names the
//! key and says what to write instead (the server prints it as `policy: <message>`).

use std::time::Duration;

use signet_types::{SpiffeId, SpiffeIdError, TrustDomain};

use super::dns_template::{DnsTemplate, TemplateError, TemplateFor};
use super::{Policy, is_reserved};
use crate::config::PolicyConfig;

const IMPERSONATORS: &str = "policy.impersonators";
const BRIDGE_CALLERS: &str = "policy.kubernetes_bridge.callers";

/// Why the policy configuration is refused. Each message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyConfigError {
    #[error("ca.default_ttl and ca.max_ttl must be positive")]
    TtlNotPositive,
    #[error(
        "ca.default_ttl ({}) is longer than ca.max_ttl ({})",
        humantime::format_duration(*default_ttl),
        humantime::format_duration(*max_ttl)
    )]
    DefaultTtlAboveMax {
        default_ttl: Duration,
        max_ttl: Duration,
    },
    /// A DNS template of `key` is refused.
    #[error("{}: {template:?} {why}", from.key())]
    DnsTemplate {
        from: TemplateFor,
        template: String,
        why: TemplateError,
    },
    #[error("{key}: {value:?} is not a SPIFFE ID: {source}")]
    NotASpiffeId {
        key: &'static str,
        value: String,
        source: SpiffeIdError,
    },
    #[error("{key}: {id} is not in trust domain {td}")]
    ForeignTrustDomain {
        key: &'static str,
        id: SpiffeId,
        td: TrustDomain,
    },
    #[error("policy.impersonators: {0} is a trust domain ID; name a workload (a path)")]
    ImpersonatorWithoutPath(SpiffeId),
    #[error(
        "policy.impersonators: {id} is one of Signet's own identities; name the \
         impersonating workload (e.g. spiffe://{td}/ns/istio-system/sa/ztunnel)"
    )]
    ImpersonatorReserved { id: SpiffeId, td: TrustDomain },
    #[error(
        "policy.kubernetes_bridge.callers: {id} is not a workload ID (name the bridge's own \
         identity, e.g. spiffe://{td}/ns/signet-system/sa/signet-k8s)"
    )]
    BridgeNotAWorkload { id: SpiffeId, td: TrustDomain },
    #[error(
        "{0} is in both policy.impersonators and policy.kubernetes_bridge.callers; give each \
         role its own identity"
    )]
    TwoRoles(SpiffeId),
}

impl Policy {
    /// Validates the configuration: TTLs, DNS templates (see [`super::dns_template`]),
    /// impersonator and bridge IDs (in `td`, workload paths, not Signet's own, no ID in both
    /// roles).
    pub fn new(
        td: TrustDomain,
        default_ttl: Duration,
        max_ttl: Duration,
        cfg: &PolicyConfig,
    ) -> Result<Self, PolicyConfigError> {
        if default_ttl.is_zero() || max_ttl.is_zero() {
            return Err(PolicyConfigError::TtlNotPositive);
        }
        if default_ttl > max_ttl {
            return Err(PolicyConfigError::DefaultTtlAboveMax {
                default_ttl,
                max_ttl,
            });
        }
        let dns_templates = templates(&cfg.kubernetes_dns_templates, TemplateFor::ServiceAccount)?;
        let mut impersonators = Vec::new();
        for s in &cfg.impersonators {
            let id = member(IMPERSONATORS, s, &td)?;
            if id.path().is_empty() {
                return Err(PolicyConfigError::ImpersonatorWithoutPath(id));
            }
            if is_reserved(&id) {
                return Err(PolicyConfigError::ImpersonatorReserved { id, td });
            }
            impersonators.push(id);
        }
        let mut bridge_callers = Vec::new();
        for s in &cfg.kubernetes_bridge.callers {
            let id = member(BRIDGE_CALLERS, s, &td)?;
            if id.path().is_empty() || is_reserved(&id) {
                return Err(PolicyConfigError::BridgeNotAWorkload { id, td });
            }
            bridge_callers.push(id);
        }
        if let Some(both) = bridge_callers.iter().find(|b| impersonators.contains(b)) {
            return Err(PolicyConfigError::TwoRoles(both.clone()));
        }
        let bridge_dns_templates =
            templates(&cfg.kubernetes_bridge.dns_templates, TemplateFor::Bridge)?;
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
}

fn templates(list: &[String], from: TemplateFor) -> Result<Vec<DnsTemplate>, PolicyConfigError> {
    list.iter()
        .map(|t| {
            DnsTemplate::parse(t, from).map_err(|why| PolicyConfigError::DnsTemplate {
                from,
                template: t.clone(),
                why,
            })
        })
        .collect()
}

/// `value` of `key` as a SPIFFE ID of `td`.
fn member(key: &'static str, value: &str, td: &TrustDomain) -> Result<SpiffeId, PolicyConfigError> {
    let id: SpiffeId = value
        .parse()
        .map_err(|source| PolicyConfigError::NotASpiffeId {
            key,
            value: value.to_owned(),
            source,
        })?;
    if !id.is_member_of(td) {
        return Err(PolicyConfigError::ForeignTrustDomain {
            key,
            id,
            td: td.clone(),
        });
    }
    Ok(id)
}
