//! Configuration refused at start-up, by name.

use super::*;

// ---- configuration ----

#[test]
fn bad_configuration_is_refused_by_name() {
    let ok = PolicyConfig::default();
    assert!(Policy::new(td(), Duration::ZERO, HOUR, &ok).is_err());
    let e = Policy::new(td(), 2 * HOUR, HOUR, &ok)
        .expect_err("refused")
        .to_string();
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
        let e = Policy::new(td(), HOUR, HOUR, &cfg)
            .expect_err(t)
            .to_string();
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
        let e = Policy::new(td(), HOUR, HOUR, &cfg)
            .expect_err(imp)
            .to_string();
        assert!(
            e.contains("policy.impersonators") && e.contains(want),
            "{imp}: {e}"
        );
    }
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
        let e = Policy::new(td(), HOUR, HOUR, &cfg)
            .expect_err(t)
            .to_string();
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
                ..KubernetesBridgeConfig::default()
            },
            ..PolicyConfig::default()
        };
        let e = Policy::new(td(), HOUR, HOUR, &cfg)
            .expect_err(t)
            .to_string();
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

#[test]
fn configuration_errors_are_typed() {
    use crate::policy::config::PolicyConfigError;
    use crate::policy::dns_template::{TemplateError, TemplateFor};
    let ok = PolicyConfig::default();
    assert_eq!(
        Policy::new(td(), Duration::ZERO, HOUR, &ok).expect_err("zero"),
        PolicyConfigError::TtlNotPositive
    );
    assert_eq!(
        Policy::new(td(), 2 * HOUR, HOUR, &ok).expect_err("default above max"),
        PolicyConfigError::DefaultTtlAboveMax {
            default_ttl: 2 * HOUR,
            max_ttl: HOUR
        }
    );
    let ztunnel = "spiffe://example.org/ns/istio-system/sa/ztunnel";
    let both = PolicyConfig {
        impersonators: vec![ztunnel.into()],
        kubernetes_bridge: KubernetesBridgeConfig {
            callers: vec![ztunnel.into()],
            ..KubernetesBridgeConfig::default()
        },
        ..PolicyConfig::default()
    };
    assert_eq!(
        Policy::new(td(), HOUR, HOUR, &both).expect_err("two roles"),
        PolicyConfigError::TwoRoles(ztunnel.parse().expect("id"))
    );
    let template = PolicyConfig {
        kubernetes_bridge: KubernetesBridgeConfig {
            dns_templates: vec!["*.svc".into()],
            ..KubernetesBridgeConfig::default()
        },
        ..PolicyConfig::default()
    };
    let e = Policy::new(td(), HOUR, HOUR, &template).expect_err("no namespace");
    assert_eq!(
        e,
        PolicyConfigError::DnsTemplate {
            from: TemplateFor::Bridge,
            template: "*.svc".into(),
            why: TemplateError::NoNamespaceForBridge,
        }
    );
    // The message a person reads names the key, the template and what is wrong.
    assert_eq!(
        e.to_string(),
        "policy.kubernetes_bridge.dns_templates: \"*.svc\" does not contain {namespace}: it \
         would give every namespace the same names"
    );
}
