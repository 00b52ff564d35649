//! DNS name templates: `policy.kubernetes_dns_templates` (the names a Kubernetes service
//! account may have) and `policy.kubernetes_bridge.dns_templates` (the names a bridged object
//! in a namespace may have). One type for both; [`TemplateFor`] says which list a template is
//! from, and so which placeholders it may use and how far its wildcard reaches.
//!
//! Invariant (checked by [`DnsTemplate::parse`], so a running policy never holds a template
//! that breaks it): a template contains `{namespace}`, each placeholder is a whole DNS label
//! of its own and appears once, `*` appears only as a whole leading label, and filling the
//! placeholders in makes a valid DNS name. So a name maps back to exactly one namespace (and
//! service account), and no two namespaces share a name.

use signet_types::dns::{DnsLabel, DnsName};

const NAMESPACE: &str = "{namespace}";
const SERVICE_ACCOUNT: &str = "{serviceaccount}";

/// Which configuration list a template is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateFor {
    /// `policy.kubernetes_dns_templates`: placeholders `{namespace}` and `{serviceaccount}`;
    /// a leading `*.` matches exactly one concrete label.
    ServiceAccount,
    /// `policy.kubernetes_bridge.dns_templates`: placeholder `{namespace}` only; a leading
    /// `*.` matches one or more concrete labels.
    Bridge,
}

impl TemplateFor {
    /// The configuration key, for messages.
    pub(super) fn key(self) -> &'static str {
        match self {
            Self::ServiceAccount => "policy.kubernetes_dns_templates",
            Self::Bridge => "policy.kubernetes_bridge.dns_templates",
        }
    }

    fn placeholders(self) -> &'static [&'static str] {
        match self {
            Self::ServiceAccount => &[NAMESPACE, SERVICE_ACCOUNT],
            Self::Bridge => &[NAMESPACE],
        }
    }
}

/// Why a template is refused. Shown after the key and the template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("has an unknown placeholder; use {0}")]
    UnknownPlaceholder(&'static str),
    #[error("may use '*' only as a whole leading label (\"*.\")")]
    Star,
    #[error("does not make a valid DNS name")]
    NotADnsName,
    #[error(
        "does not contain {{namespace}}: service accounts of the same name in different \
         namespaces would get the same DNS names"
    )]
    NoNamespaceForServiceAccounts,
    #[error("does not contain {{namespace}}: it would give every namespace the same names")]
    NoNamespaceForBridge,
    #[error("uses {placeholder} {count} times; use it once")]
    Repeated {
        placeholder: &'static str,
        count: usize,
    },
    #[error(
        "puts {0:?} in one label; each placeholder must be a whole label of its own \
         (e.g. {{serviceaccount}}.{{namespace}}.svc), or two namespaces and service \
         accounts could be given the same name"
    )]
    SharedLabel(String),
}

/// One entry of a DNS template list.
#[derive(Debug, Clone)]
pub(super) struct DnsTemplate {
    from: TemplateFor,
    /// A `*.` prefix (see [`TemplateFor`] for how many labels it matches).
    wildcard: bool,
    /// The rest, with placeholders.
    body: String,
}

impl DnsTemplate {
    pub(super) fn parse(template: &str, from: TemplateFor) -> Result<Self, TemplateError> {
        let (wildcard, body) = match template.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, template),
        };
        // Placeholders: only the known ones, nothing else in braces.
        let stripped = from
            .placeholders()
            .iter()
            .fold(body.to_owned(), |b, p| b.replace(p, ""));
        if stripped.contains('{') || stripped.contains('}') {
            return Err(TemplateError::UnknownPlaceholder(match from {
                TemplateFor::ServiceAccount => "{namespace} and {serviceaccount}",
                TemplateFor::Bridge => "{namespace}",
            }));
        }
        if body.contains('*') {
            return Err(TemplateError::Star);
        }
        let sample = body.replace(NAMESPACE, "ns").replace(SERVICE_ACCOUNT, "sa");
        if !DnsName::is_valid(&sample) {
            return Err(TemplateError::NotADnsName);
        }
        if !body.contains(NAMESPACE) {
            return Err(match from {
                TemplateFor::ServiceAccount => TemplateError::NoNamespaceForServiceAccounts,
                TemplateFor::Bridge => TemplateError::NoNamespaceForBridge,
            });
        }
        check_placeholder_labels(body)?;
        Ok(Self {
            from,
            wildcard,
            body: body.to_owned(),
        })
    }

    fn expand_body(&self, namespace: &str, service_account: Option<&str>) -> String {
        let body = self.body.replace(NAMESPACE, namespace);
        match service_account {
            Some(sa) => body.replace(SERVICE_ACCOUNT, sa),
            None => body,
        }
    }

    /// For messages: the names this template allows (`service_account` is `None` for the
    /// bridge's templates, which have no such placeholder).
    pub(super) fn expand(&self, namespace: &str, service_account: Option<&str>) -> String {
        let body = self.expand_body(namespace, service_account);
        if self.wildcard {
            format!("*.{body}")
        } else {
            body
        }
    }

    /// Whether `name` (already a valid DNS name) is one this template allows. Case-insensitive.
    /// A wildcard matches concrete labels in front of the body, on a label boundary (so
    /// `x.ab.svc` is not under `b.svc`): exactly one for a service account's template, one or
    /// more for the bridge's.
    pub(super) fn matches(
        &self,
        name: &str,
        namespace: &str,
        service_account: Option<&str>,
    ) -> bool {
        let body = self.expand_body(namespace, service_account);
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
        let concrete = |l: &str| l != "*" && DnsLabel::is_valid(l);
        let labels_ok = match self.from {
            TemplateFor::ServiceAccount => concrete(front),
            TemplateFor::Bridge => front.split('.').all(concrete),
        };
        !front.is_empty() && tail.eq_ignore_ascii_case(&body) && labels_ok
    }
}

/// Each placeholder must be a whole DNS label of its own and appear once, so that a name maps
/// back to exactly one namespace (and service account): `{namespace}-{serviceaccount}.svc`
/// would give namespace `a-b` with account `c` and namespace `a` with account `b-c` the same
/// name.
fn check_placeholder_labels(body: &str) -> Result<(), TemplateError> {
    for placeholder in [NAMESPACE, SERVICE_ACCOUNT] {
        let count = body.matches(placeholder).count();
        if count > 1 {
            return Err(TemplateError::Repeated { placeholder, count });
        }
    }
    for label in body.split('.') {
        let has_placeholder = label.contains(NAMESPACE) || label.contains(SERVICE_ACCOUNT);
        if has_placeholder && label != NAMESPACE && label != SERVICE_ACCOUNT {
            return Err(TemplateError::SharedLabel(label.to_owned()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(t: &str) -> DnsTemplate {
        DnsTemplate::parse(t, TemplateFor::ServiceAccount).expect("valid")
    }

    fn bridge(t: &str) -> DnsTemplate {
        DnsTemplate::parse(t, TemplateFor::Bridge).expect("valid")
    }

    #[test]
    fn a_wildcard_reaches_one_label_for_accounts_and_more_for_the_bridge() {
        let t = sa("*.{namespace}.svc");
        assert!(t.matches("x.web.svc", "web", Some("a")));
        assert!(t.matches("X.WEB.svc", "web", Some("a")));
        assert!(!t.matches("y.x.web.svc", "web", Some("a")));
        assert!(!t.matches("*.web.svc", "web", Some("a")));
        assert!(!t.matches("web.svc", "web", Some("a")));
        let b = bridge("*.{namespace}.svc");
        assert!(b.matches("x.web.svc", "web", None));
        assert!(b.matches("y.x.web.svc", "web", None));
        assert!(!b.matches("*.x.web.svc", "web", None));
        assert!(!b.matches("x.aweb.svc", "web", None), "a label boundary");
        assert_eq!(b.expand("web", None), "*.web.svc");
    }

    #[test]
    fn exact_templates_fill_in_their_placeholders() {
        let t = sa("{serviceaccount}.{namespace}.svc");
        assert!(t.matches("front.web.svc", "web", Some("front")));
        assert!(!t.matches("back.web.svc", "web", Some("front")));
        assert_eq!(t.expand("web", Some("front")), "front.web.svc");
    }

    #[test]
    fn each_list_allows_only_its_own_placeholders() {
        assert_eq!(
            DnsTemplate::parse("{serviceaccount}.{namespace}.svc", TemplateFor::Bridge)
                .expect_err("bridge has no service account"),
            TemplateError::UnknownPlaceholder("{namespace}")
        );
        assert_eq!(
            DnsTemplate::parse("*.svc", TemplateFor::Bridge).expect_err("no namespace"),
            TemplateError::NoNamespaceForBridge
        );
        assert_eq!(
            DnsTemplate::parse("*.svc", TemplateFor::ServiceAccount).expect_err("no namespace"),
            TemplateError::NoNamespaceForServiceAccounts
        );
    }
}
