use super::validate::forbidden_fields;
use super::*;
use crate::crd::{IssuerAuth, KeyRef, LocalObjectRef, ServiceAccountTokenAuth, TrustBundleSource};

fn r(group: Option<&str>, kind: Option<&str>) -> IssuerRef {
    IssuerRef {
        name: "s".into(),
        kind: kind.map(Into::into),
        group: group.map(Into::into),
    }
}

#[test]
fn ref_matching() {
    assert_eq!(IssuerKey::from_ref(&r(None, None), "a"), RefMatch::NotOurs);
    assert_eq!(
        IssuerKey::from_ref(&r(Some("cert-manager.io"), Some("Issuer")), "a"),
        RefMatch::NotOurs
    );
    let RefMatch::Ours(k) = IssuerKey::from_ref(&r(Some("signet.dev"), None), "a") else {
        panic!()
    };
    assert_eq!(k.to_string(), "Issuer/a/s");
    let RefMatch::Ours(k) = IssuerKey::from_ref(&r(Some("signet.dev"), Some("ClusterIssuer")), "a")
    else {
        panic!()
    };
    assert_eq!(k.to_string(), "ClusterIssuer/s");
    assert_eq!(
        IssuerKey::from_ref(&r(Some("signet.dev"), Some("Foo")), "a"),
        RefMatch::UnknownKind("Foo".into())
    );
}

fn cluster() -> ClusterIssuerSpec {
    ClusterIssuerSpec {
        server: "https://signet:8443".into(),
        server_name: None,
        trust_bundle: TrustBundleSource {
            pem: Some("x".into()),
            ..Default::default()
        },
        trust_domain: None,
        auth: None,
    }
}

fn tls_ref(name: &str, namespace: Option<&str>) -> Option<IssuerAuth> {
    Some(IssuerAuth {
        service_account_token: None,
        tls_secret_ref: Some(LocalObjectRef {
            name: name.into(),
            namespace: namespace.map(Into::into),
        }),
    })
}

#[test]
fn cluster_issuer_validation() {
    let ns = "signet-system";
    assert!(validate_cluster(&cluster(), ns).is_ok());
    let mut s = cluster();
    s.server = "http://x".into();
    assert_eq!(
        validate_cluster(&s, ns).unwrap_err().reason(),
        "InvalidSpec"
    );
    let mut s = cluster();
    s.trust_bundle.config_map_ref = Some(KeyRef {
        name: "b".into(),
        key: None,
    });
    assert!(
        validate_cluster(&s, ns)
            .unwrap_err()
            .to_string()
            .contains("exactly one")
    );
    let mut s = cluster();
    s.trust_bundle.pem = None;
    assert!(validate_cluster(&s, ns).is_err());
    let mut s = cluster();
    s.auth = Some(IssuerAuth {
        service_account_token: Some(ServiceAccountTokenAuth::default()),
        tls_secret_ref: Some(LocalObjectRef {
            name: "t".into(),
            namespace: None,
        }),
    });
    assert!(validate_cluster(&s, ns).is_err());
    let mut s = cluster();
    s.trust_domain = Some("Not a domain".into());
    assert!(
        validate_cluster(&s, ns)
            .unwrap_err()
            .to_string()
            .contains("spec.trustDomain")
    );
    let mut s = cluster();
    s.auth = tls_ref("svid", Some("team-a"));
    assert!(validate_cluster(&s, ns).is_err());
    s.auth = tls_ref("svid", Some(ns));
    assert!(validate_cluster(&s, ns).is_ok());
}

/// The API server refuses what the bridge refuses: each forbidden field has a CEL rule in
/// the Issuer CRD naming it (the bridge still checks, for objects stored before).
#[test]
fn the_issuer_crd_refuses_the_same_fields_at_admission() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(Issuer::crd()).unwrap();
    let rules = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"];
    let all = IssuerSpec {
        server: Some("s".into()),
        server_name: Some("n".into()),
        trust_bundle: Some(TrustBundleSource::default()),
        auth: Some(IssuerAuth {
            service_account_token: Some(ServiceAccountTokenAuth::default()),
            tls_secret_ref: None,
        }),
    };
    let fields = forbidden_fields(&all);
    assert_eq!(fields.len(), 4);
    for f in fields {
        let path = f.trim_start_matches("spec");
        let rule = rules
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["fieldPath"] == path)
            .unwrap_or_else(|| panic!("no CEL rule for {f}: {rules}"));
        assert!(rule["message"].as_str().unwrap().starts_with(f), "{rule}");
        assert_eq!(rule["reason"], "FieldValueForbidden");
    }
}

#[test]
fn namespaced_issuer_may_not_choose_server_bundle_or_token_file() {
    assert!(validate_namespaced(&IssuerSpec::default(), "a").is_ok());
    let own = IssuerSpec {
        auth: tls_ref("issuer-svid", None),
        ..Default::default()
    };
    assert!(validate_namespaced(&own, "a").is_ok());
    let own_explicit = IssuerSpec {
        auth: tls_ref("issuer-svid", Some("a")),
        ..Default::default()
    };
    assert!(validate_namespaced(&own_explicit, "a").is_ok());

    // Each forbidden field is named.
    let cases: Vec<(IssuerSpec, &str)> = vec![
        (
            IssuerSpec {
                server: Some("https://evil:443".into()),
                ..Default::default()
            },
            "spec.server is not allowed on a namespaced Issuer",
        ),
        (
            IssuerSpec {
                server_name: Some("localhost".into()),
                ..Default::default()
            },
            "spec.serverName is not allowed",
        ),
        (
            IssuerSpec {
                trust_bundle: Some(TrustBundleSource {
                    pem: Some("x".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            "spec.trustBundle is not allowed",
        ),
        (
            IssuerSpec {
                auth: Some(IssuerAuth {
                    service_account_token: Some(ServiceAccountTokenAuth {
                        path: Some("/var/run/secrets/kubernetes.io/serviceaccount/token".into()),
                    }),
                    tls_secret_ref: None,
                }),
                ..Default::default()
            },
            "spec.auth.serviceAccountToken is not allowed",
        ),
        (
            IssuerSpec {
                server: Some("https://evil:443".into()),
                trust_bundle: Some(TrustBundleSource::default()),
                auth: Some(IssuerAuth {
                    service_account_token: Some(ServiceAccountTokenAuth::default()),
                    tls_secret_ref: None,
                }),
                server_name: None,
            },
            "spec.server, spec.trustBundle, spec.auth.serviceAccountToken are not allowed",
        ),
        (
            IssuerSpec {
                auth: tls_ref("svid", Some("team-b")),
                ..Default::default()
            },
            "spec.auth.tlsSecretRef.namespace \"team-b\": an issuer may use only Secrets of \
             this Issuer's namespace (a)",
        ),
        (
            IssuerSpec {
                auth: tls_ref("team-b/svid", None),
                ..Default::default()
            },
            "is not a Secret name",
        ),
    ];
    for (spec, says) in cases {
        let err = validate_namespaced(&spec, "a").unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        assert!(err.to_string().contains(says), "{spec:?}: {err}");
    }
}
