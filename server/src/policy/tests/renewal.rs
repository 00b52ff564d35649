//! Renewal over mTLS within its basis, and the provenance every grant records.

use super::*;

#[test]
fn an_mtls_caller_renews_only_with_a_basis_for_its_own_certificate() {
    let m = mtls("/web", &["web.example.org"]);
    let msg = denied(
        decide_with(&m, &names(&[], &[]), 0, None),
        DenialKind::PermissionDenied,
        "policy.renewal",
    );
    assert!(msg.contains("not re-checked"), "{msg}");
    // A basis made for another caller's certificate does not count.
    let other = mtls("/db", &[]);
    let basis = RenewalBasis::for_tests(&other, vec![], HOUR);
    denied(
        decide_with(&m, &names(&[], &[]), 0, Some(&basis)),
        DenialKind::PermissionDenied,
        "policy.renewal",
    );
    // A basis is meaningless for anyone else.
    let basis = RenewalBasis::for_tests(&m, vec![], HOUR);
    denied(
        decide_with(&sa("a", "b"), &names(&[], &[]), 0, Some(&basis)),
        DenialKind::InvalidArgument,
        "policy.renewal",
    );
}

#[test]
fn a_renewal_is_bounded_by_its_basis() {
    let m = mtls("/web", &["web.example.org", "old.example.org"]);
    // The source still allows one of the two presented names, for ten minutes.
    let basis =
        RenewalBasis::for_tests(&m, vec!["web.example.org".into()], Duration::from_secs(600));
    let g = decide_with(&m, &names(&[], &["web.example.org"]), 86400, Some(&basis))
        .expect("within the basis");
    assert_eq!(g.ttl, Duration::from_secs(600));
    assert_eq!(g.spiffe_id, id("/web"));
    let p = g.provenance;
    assert_eq!(p.source, Source::Admin);
    assert_eq!(p.renewed_from.as_deref(), Some("01"));
    let g = decide_with(&m, &names(&[], &[]), 0, Some(&basis)).expect("default");
    assert_eq!(g.ttl, Duration::from_secs(600));
    let msg = denied(
        decide_with(&m, &names(&[], &["old.example.org"]), 0, Some(&basis)),
        DenialKind::PermissionDenied,
        "policy.dns_name",
    );
    assert!(msg.contains("still allows: web.example.org"), "{msg}");
}

// ---- provenance ----

#[test]
fn every_grant_records_where_its_authority_came_from() {
    let caller = AuthenticatedCaller::for_tests(
        id("/ns/web/sa/frontend"),
        CallerKind::KubernetesServiceAccount {
            namespace: "web".into(),
            service_account: "frontend".into(),
            pod: Some("frontend-x".into()),
            node: Some("worker-1".into()),
        },
    );
    let g = decide(&caller, &names(&[], &[]), 0, None).expect("sa");
    assert_eq!(
        g.provenance,
        Provenance::new(
            Source::ServiceAccount {
                namespace: "web".into(),
                service_account: "frontend".into(),
                pod: Some("frontend-x".into()),
                node: Some("worker-1".into()),
            },
            NOW
        )
    );
    let attesting = AuthenticatedCaller::for_tests(
        id("/signet/node/n1"),
        CallerKind::Node {
            node_id: "n1".into(),
            serial: None,
            leaf_sha256: None,
        },
    );
    let g = decide_src(
        &attesting,
        &names(&[], &[]),
        GrantSource::NodeAttestation {
            method: "join_token",
        },
        None,
    )
    .expect("attest");
    assert_eq!(
        g.provenance.source,
        Source::Node {
            node_id: "n1".into(),
            attestation: "join_token".into()
        }
    );
    let g = decide_src(
        &node("n1"),
        &names(&[], &[]),
        GrantSource::NodeRenewal,
        None,
    )
    .expect("renew");
    assert_eq!(
        g.provenance.source,
        Source::Node {
            node_id: "n1".into(),
            attestation: "renewal".into()
        }
    );
    let e = entry("n1", 600);
    let g = decide_src(&node("n1"), &names(&[], &[]), GrantSource::Entry(&e), None).expect("entry");
    assert_eq!(
        g.provenance,
        Provenance::new(
            Source::Entry {
                entry_id: "e1".into(),
                node_id: "n1".into()
            },
            NOW
        )
    );
    let n = names(&["spiffe://example.org/ns/a/sa/x"], &[]);
    let g = policy()
        .decide(
            &sa("signet-system", "signet-k8s"),
            &IssueRequest {
                source: GrantSource::Bridge { namespace: "a" },
                names: &n,
                ttl_seconds: 0,
                impersonate: None,
                renewal: None,
            },
            NOW,
        )
        .expect("bridge");
    assert_eq!(
        g.provenance.source,
        Source::Bridge {
            bridge: "spiffe://example.org/ns/signet-system/sa/signet-k8s".into(),
            namespace: "a".into()
        }
    );
}
