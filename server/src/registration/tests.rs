//! The Registration service's decision, allowed and refused from both sides.

use std::time::Duration;

use signet_types::{SpiffeId, TrustDomain};

use super::*;
use crate::authn::CallerKind;
use crate::config::PolicyConfig;
use crate::policy::DenialKind;

const HOUR: Duration = Duration::from_secs(3600);
const BRIDGE: &str = "spiffe://example.org/ns/signet-system/sa/signet-k8s";

fn td() -> TrustDomain {
    TrustDomain::new("example.org").expect("td")
}

fn id(path: &str) -> SpiffeId {
    td().id(path).expect("id")
}

fn bridge_config() -> KubernetesBridgeConfig {
    KubernetesBridgeConfig {
        callers: vec![BRIDGE.into()],
        node_sets: vec!["k8s".into(), "gpu".into()],
        entry_path_prefixes: vec!["/platform/".into()],
        ..KubernetesBridgeConfig::default()
    }
}

fn policy() -> Policy {
    Policy::new(
        td(),
        HOUR,
        24 * HOUR,
        &PolicyConfig {
            kubernetes_bridge: bridge_config(),
            ..PolicyConfig::default()
        },
    )
    .expect("policy")
    .with_server_names(vec!["signet.team-a.svc".into()], Vec::new())
}

fn registrar() -> Registrar {
    Registrar::from_config(&bridge_config())
}

/// `k8s` exists; `gpu` is listed but was never created.
fn existing() -> BTreeSet<String> {
    ["k8s".to_owned()].into()
}

fn bridge() -> AuthenticatedCaller {
    sa("signet-system", "signet-k8s")
}

fn sa(ns: &str, name: &str) -> AuthenticatedCaller {
    AuthenticatedCaller::for_tests(
        id(&format!("/ns/{ns}/sa/{name}")),
        CallerKind::KubernetesServiceAccount {
            namespace: ns.into(),
            service_account: name.into(),
            pod: None,
            node: None,
        },
    )
}

struct Owned {
    spiffe_id: String,
    node_set: String,
    selectors: Vec<String>,
    dns_names: Vec<String>,
}

fn owned(spiffe_id: &str) -> Owned {
    Owned {
        spiffe_id: spiffe_id.into(),
        node_set: "k8s".into(),
        selectors: vec!["k8s:ns:team-a".into(), "k8s:sa:web".into()],
        dns_names: vec!["web.team-a.svc".into()],
    }
}

fn request(o: &Owned) -> EntryRequest<'_> {
    EntryRequest {
        spiffe_id: &o.spiffe_id,
        node_set: &o.node_set,
        selectors: &o.selectors,
        ttl_seconds: 0,
        dns_names: &o.dns_names,
        jwt_ttl_seconds: 0,
        federates_with: &[],
    }
}

fn decide(caller: &AuthenticatedCaller, entries: &[Owned]) -> Result<AuthorizedSync, Denial> {
    let inputs: Vec<EntryRequest<'_>> = entries.iter().map(request).collect();
    authorize(
        &policy(),
        &registrar(),
        caller,
        "Identity/team-a/web",
        &inputs,
        &existing(),
    )
}

/// The refusal's kind and message; panics if allowed.
fn refused(caller: &AuthenticatedCaller, entries: &[Owned]) -> (DenialKind, String) {
    let d = decide(caller, entries).expect_err("refused");
    (d.kind, d.message)
}

#[test]
fn a_bridge_keeps_entries_under_its_namespaces_and_listed_prefixes() {
    let entries = [
        owned("spiffe://example.org/ns/team-a/sa/web"),
        Owned {
            dns_names: vec![],
            ..owned("spiffe://example.org/platform/ingress")
        },
        Owned {
            selectors: vec!["k8s:ns:team-b".into()],
            dns_names: vec!["api.team-b.svc.cluster.local".into()],
            ..owned("spiffe://example.org/ns/team-b/api")
        },
    ];
    let sync = decide(&bridge(), &entries).expect("allowed");
    assert_eq!(sync.owner(), BRIDGE);
    assert_eq!(sync.scope(), "Identity/team-a/web");
    assert_eq!(sync.entries().len(), 3);
    assert_eq!(
        sync.entries()[0].parent_id.to_string(),
        "spiffe://example.org/signet/nodeset/k8s"
    );
    // Sorted selectors, as CreateEntry keeps them.
    assert_eq!(sync.entries()[0].selectors, ["k8s:ns:team-a", "k8s:sa:web"]);
    // An empty list is a sync too: it deletes the scope.
    assert!(decide(&bridge(), &[]).expect("empty").entries().is_empty());
}

#[test]
fn callers_other_than_a_listed_bridge_are_refused() {
    let e = [owned("spiffe://example.org/ns/team-a/sa/web")];
    let node = AuthenticatedCaller::for_tests(
        id("/signet/node/n1"),
        CallerKind::Node {
            node_id: "n1".into(),
            serial: Some("aa".into()),
            leaf_sha256: Some([0; 32]),
        },
    );
    let server = AuthenticatedCaller::for_tests(id("/signet/server"), CallerKind::Server);
    let admin = AuthenticatedCaller::for_tests(id("/signet/admin"), CallerKind::Admin);
    // A node whose ID is listed is still a node.
    let listed_node = AuthenticatedCaller::for_tests(
        BRIDGE.parse().expect("id"),
        CallerKind::Node {
            node_id: "n1".into(),
            serial: None,
            leaf_sha256: None,
        },
    );
    for caller in [sa("team-a", "web"), node, server, admin, listed_node] {
        let (kind, msg) = refused(&caller, &e);
        assert_eq!(kind, DenialKind::PermissionDenied, "{msg}");
        assert!(
            msg.contains("is not a Kubernetes bridge")
                && msg.contains("policy.kubernetes_bridge.callers"),
            "{msg}"
        );
        assert!(authorize_caller(&policy(), &caller).is_err());
    }
    // A bridge over mTLS is a bridge.
    let mtls = AuthenticatedCaller::for_tests(
        BRIDGE.parse().expect("id"),
        CallerKind::Mtls {
            dns_names: vec![],
            serial: "aa".into(),
            leaf_sha256: [0; 32],
        },
    );
    decide(&mtls, &e).expect("mTLS bridge");
}

#[test]
fn node_sets_must_be_listed_and_exist() {
    let (kind, msg) = refused(
        &bridge(),
        &[
            owned("spiffe://example.org/ns/team-a/sa/web"),
            Owned {
                node_set: "prod".into(),
                ..owned("spiffe://example.org/ns/team-a/sa/api")
            },
        ],
    );
    assert_eq!(kind, DenialKind::PermissionDenied);
    assert!(
        msg.starts_with(
            "entry 1: node set prod is not listed in policy.kubernetes_bridge.node_sets"
        ),
        "{msg}"
    );
    let (kind, msg) = refused(
        &bridge(),
        &[Owned {
            node_set: "gpu".into(),
            ..owned("spiffe://example.org/ns/team-a/sa/web")
        }],
    );
    assert_eq!(kind, DenialKind::PermissionDenied);
    assert!(
        msg.starts_with("entry 0: node set gpu does not exist"),
        "{msg}"
    );
    let (kind, msg) = refused(
        &bridge(),
        &[Owned {
            node_set: "Not A Name".into(),
            ..owned("spiffe://example.org/ns/team-a/sa/web")
        }],
    );
    assert_eq!(kind, DenialKind::InvalidArgument, "{msg}");
}

#[test]
fn ids_stay_under_the_entrys_namespace_or_a_listed_prefix() {
    for (path, why) in [
        ("/ns/team-b/sa/web", "under spiffe://example.org/ns/team-a/"),
        ("/ns/team-a", "under spiffe://example.org/ns/team-a/"),
        ("/ns/team-a/", "under spiffe://example.org/ns/team-a/"),
        ("/ns/team-ab/web", "under spiffe://example.org/ns/team-a/"),
        ("/platformx/web", "entry_path_prefixes (/platform/)"),
        ("/web", "under spiffe://example.org/ns/team-a/"),
    ] {
        let Err(d) = decide(&bridge(), &[owned(&format!("spiffe://example.org{path}"))]) else {
            // "/ns/team-a/" does not parse as a SPIFFE ID (a trailing '/'): also refused.
            panic!("{path}: allowed");
        };
        if path.ends_with('/') {
            assert_eq!(d.kind, DenialKind::InvalidArgument, "{path}: {}", d.message);
            continue;
        }
        assert_eq!(
            d.kind,
            DenialKind::PermissionDenied,
            "{path}: {}",
            d.message
        );
        assert!(d.message.starts_with("entry 0: "), "{}", d.message);
        assert!(d.message.contains(why), "{path}: {}", d.message);
    }
    // Signet's own IDs, even under a namespace-looking path, and other trust domains.
    for id in [
        "spiffe://example.org/signet/nodeset/k8s",
        "spiffe://example.org/signet/node/n1",
        "spiffe://other.org/ns/team-a/sa/web",
    ] {
        let (kind, msg) = refused(&bridge(), &[owned(id)]);
        assert_eq!(kind, DenialKind::PermissionDenied, "{id}: {msg}");
    }
    let (_, msg) = refused(&bridge(), &[owned("spiffe://example.org/signet/x")]);
    assert!(msg.contains("reserved"), "{msg}");
}

#[test]
fn dns_names_follow_the_namespaces_templates() {
    for (name, allowed) in [
        ("web.team-a.svc", true),
        ("a.b.team-a.svc.cluster.local", true),
        ("web.team-b.svc", false),
        ("web.example.com", false),
    ] {
        let got = decide(
            &bridge(),
            &[Owned {
                dns_names: vec![name.into()],
                ..owned("spiffe://example.org/ns/team-a/sa/web")
            }],
        );
        match (allowed, got) {
            (true, Ok(_)) => {}
            (false, Err(d)) => {
                assert_eq!(d.kind, DenialKind::PermissionDenied);
                assert!(
                    d.message
                        .contains(&format!("may not carry DNS name {name}")),
                    "{}",
                    d.message
                );
            }
            (a, got) => panic!("{name}: expected allowed={a}, got {got:?}"),
        }
    }
    // The server's own names, even inside the template, are the server's only.
    let (kind, msg) = refused(
        &bridge(),
        &[Owned {
            dns_names: vec!["signet.team-a.svc".into()],
            ..owned("spiffe://example.org/ns/team-a/sa/web")
        }],
    );
    assert_eq!(kind, DenialKind::PermissionDenied);
    assert!(msg.contains("server's own name"), "{msg}");
}

#[test]
fn exactly_one_namespace_selector() {
    for (selectors, want) in [
        (vec!["k8s:sa:web"], "it has none"),
        (vec!["k8s:ns:team-a", "k8s:ns:team-b"], "it has 2"),
        (vec!["unix:uid:1000"], "it has none"),
    ] {
        let (kind, msg) = refused(
            &bridge(),
            &[Owned {
                selectors: selectors.iter().map(|s| s.to_string()).collect(),
                ..owned("spiffe://example.org/ns/team-a/sa/web")
            }],
        );
        assert_eq!(kind, DenialKind::InvalidArgument, "{msg}");
        assert!(msg.contains("exactly one k8s:ns:<namespace>"), "{msg}");
        assert!(msg.contains(want), "{msg}");
    }
    // A malformed selector is CreateEntry's refusal.
    let (kind, msg) = refused(
        &bridge(),
        &[Owned {
            selectors: vec!["k8s:ns:Team_A".into()],
            ..owned("spiffe://example.org/ns/team-a/sa/web")
        }],
    );
    assert_eq!(kind, DenialKind::InvalidArgument);
    assert!(msg.starts_with("entry 0: selector"), "{msg}");
}

#[test]
fn duplicate_identities_scopes_and_sizes_are_refused() {
    let mut twice = owned("spiffe://example.org/ns/team-a/sa/web");
    // Same registration once the selectors are sorted; other DNS names do not count.
    twice.selectors.reverse();
    twice.dns_names.clear();
    let (kind, msg) = refused(
        &bridge(),
        &[owned("spiffe://example.org/ns/team-a/sa/web"), twice],
    );
    assert_eq!(kind, DenialKind::InvalidArgument);
    assert!(
        msg.starts_with("entry 1: the same registration as entry 0"),
        "{msg}"
    );
    // Other selectors are another registration.
    decide(
        &bridge(),
        &[
            owned("spiffe://example.org/ns/team-a/sa/web"),
            Owned {
                node_set: "k8s".into(),
                selectors: vec!["k8s:ns:team-a".into()],
                ..owned("spiffe://example.org/ns/team-a/sa/web")
            },
        ],
    )
    .expect("different selectors");

    let inputs: Vec<Owned> = (0..=MAX_SYNC_ENTRIES)
        .map(|i| owned(&format!("spiffe://example.org/ns/team-a/w{i}")))
        .collect();
    let (kind, msg) = refused(&bridge(), &inputs);
    assert_eq!(kind, DenialKind::InvalidArgument);
    assert!(msg.contains("at most 1000"), "{msg}");

    for bad in ["", "a b", "Identity/team-a/web\n", &"x".repeat(254), "ns=a"] {
        let d =
            authorize(&policy(), &registrar(), &bridge(), bad, &[], &existing()).expect_err(bad);
        assert_eq!(d.kind, DenialKind::InvalidArgument);
        assert!(d.message.starts_with("scope "), "{}", d.message);
    }
    for ok in [
        "ClusterIdentity/web",
        "Identity/team-a/web:v1.2_x",
        &"x".repeat(253),
    ] {
        check_scope(ok).expect(ok);
    }
}

#[test]
fn ttls_and_federation_are_checked_as_create_entry_checks_them() {
    let base = owned("spiffe://example.org/ns/team-a/sa/web");
    let fed = ["partner.org".to_owned()];
    let own = ["example.org".to_owned()];
    let run = |ttl: i64, jwt: i64, federates_with: &[String]| {
        let mut r = request(&base);
        r.ttl_seconds = ttl;
        r.jwt_ttl_seconds = jwt;
        r.federates_with = federates_with;
        authorize(&policy(), &registrar(), &bridge(), "s", &[r], &existing())
    };
    let v = run(600, 300, &fed).expect("allowed");
    assert_eq!(v.entries()[0].ttl_seconds, 600);
    assert_eq!(v.entries()[0].federates_with, ["partner.org"]);
    for (ttl, jwt, f) in [(-1, 0, &[][..]), (0, 86_401, &[][..]), (0, 0, &own[..])] {
        let d = run(ttl, jwt, f).expect_err("refused");
        assert_eq!(d.kind, DenialKind::InvalidArgument, "{}", d.message);
        assert!(d.message.starts_with("entry 0: "), "{}", d.message);
    }
}

#[test]
fn registration_is_off_without_node_sets() {
    let off = Registrar::from_config(&KubernetesBridgeConfig {
        callers: vec![BRIDGE.into()],
        ..KubernetesBridgeConfig::default()
    });
    assert!(!off.is_on());
    assert!(registrar().is_on());
    assert_eq!(registrar().node_sets().collect::<Vec<_>>(), ["k8s", "gpu"]);
    assert_eq!(registrar().max_owned_entries(), 10_000);
}

/// Review finding F1: an entry for the bridge's own ID (or an impersonator's) would give a
/// workload on a member node a certificate that acts as that caller over mTLS.
#[test]
fn an_entry_never_yields_a_privileged_identity() {
    let impersonator = "spiffe://example.org/ns/istio-system/sa/ztunnel";
    let policy = Policy::new(
        td(),
        HOUR,
        24 * HOUR,
        &PolicyConfig {
            kubernetes_bridge: bridge_config(),
            impersonators: vec![impersonator.into()],
            ..PolicyConfig::default()
        },
    )
    .expect("policy");
    for (id, ns, role) in [
        (BRIDGE, "signet-system", "a Kubernetes bridge's identity"),
        (impersonator, "istio-system", "an impersonator's identity"),
    ] {
        let o = Owned {
            selectors: vec![format!("k8s:ns:{ns}"), "k8s:sa:default".into()],
            dns_names: Vec::new(),
            ..owned(id)
        };
        let d = authorize(
            &policy,
            &registrar(),
            &bridge(),
            "Identity/x/y",
            &[request(&o)],
            &existing(),
        )
        .expect_err("a privileged identity");
        assert_eq!(d.kind, DenialKind::PermissionDenied, "{}", d.message);
        assert!(d.message.contains(role), "{}", d.message);
    }
    // The control: an ordinary workload of the same namespace.
    let o = Owned {
        selectors: vec!["k8s:ns:signet-system".into(), "k8s:sa:default".into()],
        dns_names: Vec::new(),
        ..owned("spiffe://example.org/ns/signet-system/sa/default")
    };
    authorize(
        &policy,
        &registrar(),
        &bridge(),
        "Identity/x/y",
        &[request(&o)],
        &existing(),
    )
    .expect("an ordinary workload");
}
