use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::*;
use crate::certificate::triggers::issuance_reason;
use crate::keys::KeyEncoding;
use crate::keys::{KeyAlgorithm, generate};

const T0: u64 = 1_767_225_600; // 2026-01-01T00:00:00Z

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn cert(spec: serde_json::Value) -> Certificate {
    let mut base = json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": "web", "namespace": "a", "uid": "c1", "generation": 1},
        "spec": {
            "secretName": "web-tls",
            "issuerRef": {"name": "signet", "kind": "Issuer", "group": "signet.dev"},
            "uris": ["spiffe://example.org/ns/a/sa/web"],
            "dnsNames": ["web.a.svc"],
        }
    });
    crate::testing::merge(&mut base, &json!({ "spec": spec }));
    serde_json::from_value(base).unwrap()
}

fn blocked(spec: serde_json::Value) -> Blocked {
    validate(&cert(spec)).unwrap_err()
}

#[test]
fn validate_accepts_a_spiffe_certificate_with_defaults() {
    let d = validate(&cert(json!({}))).unwrap().unwrap();
    assert_eq!(d.spiffe_id, "spiffe://example.org/ns/a/sa/web");
    assert_eq!(d.duration, DEFAULT_DURATION);
    assert_eq!(d.key, KeySpec::default());
    assert_eq!(d.issuer.to_string(), "Issuer/a/signet");
}

#[test]
fn other_issuers_are_left_alone() {
    let c = cert(
        json!({"issuerRef": {"name": "le", "kind": "ClusterIssuer", "group": "cert-manager.io"}}),
    );
    assert_eq!(validate(&c).unwrap(), None);
}

#[test]
fn validate_says_what_to_fix() {
    let b = blocked(json!({"secretName": ""}));
    assert_eq!(b.reason, "MissingSecretName");
    let b = blocked(json!({"uris": null}));
    assert_eq!(b.reason, "MissingSPIFFEID");
    assert!(b.message.contains("exactly one URI"), "{}", b.message);
    let b = blocked(json!({"uris": ["https://example.org/x"]}));
    assert_eq!(b.reason, "InvalidSPIFFEID");
    let b = blocked(json!({"uris": ["spiffe://example.org/a", "spiffe://example.org/b"]}));
    assert_eq!(b.reason, "MultipleURIs");
    let b = blocked(json!({"ipAddresses": ["10.0.0.1"], "emailAddresses": ["a@b.c"]}));
    assert_eq!(b.reason, "UnsupportedSANs");
    assert!(
        b.message
            .contains("spec.ipAddresses and spec.emailAddresses"),
        "{}",
        b.message
    );
    let b = blocked(json!({"isCA": true}));
    assert_eq!(b.reason, "CANotSupported");
    let b = blocked(json!({"privateKey": {"algorithm": "ECDSA", "size": 521}}));
    assert_eq!(b.reason, "UnsupportedPrivateKey");
    assert!(b.message.contains("P-521"));
    let b = blocked(json!({"duration": "90d"}));
    assert_eq!(b.reason, "InvalidDuration");
    let b = blocked(json!({"issuerRef": {"name": "x", "kind": "Other", "group": "signet.dev"}}));
    assert_eq!(b.reason, "InvalidIssuerRef");
}

#[test]
fn conflicts_are_seen_from_both_sides() {
    let a = Arc::new(cert(json!({})));
    let mut b = cert(json!({}));
    b.metadata.name = Some("api".into());
    let b = Arc::new(b);
    let mut other_ns = cert(json!({}));
    other_ns.metadata.namespace = Some("z".into());
    let mut other_secret = cert(json!({"secretName": "x"}));
    other_secret.metadata.name = Some("x".into());
    let all = vec![
        a.clone(),
        b.clone(),
        Arc::new(other_ns),
        Arc::new(other_secret),
    ];
    assert_eq!(conflicts(&a, &all), ["api"]);
    assert_eq!(conflicts(&b, &all), ["web"]);
    let blk = conflict_blocked("web-tls", &conflicts(&a, &all));
    assert_eq!(blk.reason, "SecretConflict");
    assert!(blk.message.contains("Certificate api"), "{}", blk.message);
}

#[test]
fn secret_ownership() {
    let mut s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "web-tls", "namespace": "a"}
    }))
    .unwrap();
    let b = secret_owner_problem(&s, "web").unwrap();
    assert_eq!(b.reason, "SecretOwnedByOther");
    assert!(
        b.message.contains("no cert-manager.io/certificate-name"),
        "{}",
        b.message
    );
    s.metadata.annotations = Some([(ANN_CERTIFICATE_NAME.to_owned(), "api".to_owned())].into());
    assert!(
        secret_owner_problem(&s, "web")
            .unwrap()
            .message
            .contains("\"api\"")
    );
    assert_eq!(secret_owner_problem(&s, "api"), None);
}

#[test]
fn renewal_time_is_a_third_before_expiry_minus_jitter() {
    let nb = at(T0);
    let na = at(T0 + 90 * 3600);
    // No jitter: two thirds of the lifetime.
    assert_eq!(renewal_time(nb, na, None, None, 0.0), at(T0 + 60 * 3600));
    // Jitter 0.5: 5% of 90h = 4.5h earlier.
    assert_eq!(
        renewal_time(nb, na, None, None, 0.5),
        at(T0 + 60 * 3600 - 16200)
    );
    // renewBefore wins; a renewBefore not shorter than the lifetime falls back to the third.
    let h = |n: u64| Duration::from_secs(n * 3600);
    assert_eq!(
        renewal_time(nb, na, Some(h(10)), None, 0.0),
        at(T0 + 80 * 3600)
    );
    assert_eq!(
        renewal_time(nb, na, Some(h(100)), None, 0.0),
        at(T0 + 60 * 3600)
    );
    assert_eq!(
        renewal_time(nb, na, None, Some(50), 0.0),
        at(T0 + 45 * 3600)
    );
    // Never before notBefore, whatever the jitter.
    assert_eq!(
        renewal_time(nb, na, Some(h(89) + Duration::from_secs(3599)), None, 0.99),
        nb
    );
    // A thousand certificates created together spread over the jitter window.
    let mut times: Vec<_> = (0..1000)
        .map(|i| renewal_time(nb, na, None, None, f64::from(i) / 1000.0))
        .collect();
    times.sort();
    times.dedup();
    assert!(times.len() > 900, "{}", times.len());
}

#[test]
fn backoff_doubles_and_is_capped() {
    assert_eq!(failure_backoff(1), Duration::from_secs(60));
    assert_eq!(failure_backoff(2), Duration::from_secs(120));
    assert_eq!(failure_backoff(7), Duration::from_secs(3600));
    assert_eq!(failure_backoff(1000), Duration::from_secs(3600));
    assert_eq!(failure_backoff(0), Duration::from_secs(60));
}

/// A test CA and a leaf for `key` naming `uris`/`dns`, valid for `hours` from T0.
fn issued_secret(
    key: &PrivateKey,
    uris: &[&str],
    dns: &[&str],
    hours: u64,
    annotations: serde_json::Value,
) -> SecretView {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(vec![]).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let pem_csr = crate::keys::build_csr(
        key,
        &crate::keys::CsrNames {
            spiffe_id: uris[0].into(),
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            common_name: None,
        },
    )
    .unwrap();
    let mut csr = rcgen::CertificateSigningRequestParams::from_pem(&pem_csr).unwrap();
    csr.params.not_before = time::OffsetDateTime::from_unix_timestamp(T0 as i64).unwrap();
    csr.params.not_after =
        time::OffsetDateTime::from_unix_timestamp((T0 + hours * 3600) as i64).unwrap();
    let leaf = csr.signed_by(&issuer).unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "web-tls", "namespace": "a", "annotations": annotations},
        "data": {
            "tls.crt": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, leaf.pem()),
            "tls.key": base64::Engine::encode(&base64::engine::general_purpose::STANDARD,
                key.to_pem(KeyEncoding::Pkcs1).unwrap()),
        }
    }))
    .unwrap();
    SecretView::of(&secret)
}

fn ours() -> serde_json::Value {
    json!({ANN_CERTIFICATE_NAME: "web", ANN_ISSUER_NAME: "signet", ANN_ISSUER_KIND: "Issuer"})
}

#[test]
fn trigger_chain_in_order() {
    let d = validate(&cert(json!({}))).unwrap().unwrap();
    let now = at(T0 + 3600);
    assert_eq!(
        issuance_reason(&d, None, None, now).unwrap().reason,
        "DoesNotExist"
    );

    let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
    // A SecretView is not Clone (a key's parse error is not): each variation starts anew.
    let good_view = || {
        issued_secret(
            &key,
            &["spiffe://example.org/ns/a/sa/web"],
            &["web.a.svc"],
            90,
            ours(),
        )
    };
    let good = good_view();
    assert_eq!(issuance_reason(&d, Some(&good), None, now), None);
    // Renewal at two thirds of 90h, or the recorded time.
    let r = issuance_reason(&d, Some(&good), None, at(T0 + 60 * 3600)).unwrap();
    assert_eq!(r.reason, "Renewing");
    let r = issuance_reason(&d, Some(&good), Some(at(T0 + 7200)), at(T0 + 7200)).unwrap();
    assert_eq!(r.reason, "Renewing");
    assert_eq!(
        issuance_reason(&d, Some(&good), None, at(T0 + 90 * 3600))
            .unwrap()
            .reason,
        "Expired"
    );

    let wrong_dns = issued_secret(
        &key,
        &["spiffe://example.org/ns/a/sa/web"],
        &["x.a.svc"],
        90,
        ours(),
    );
    let r = issuance_reason(&d, Some(&wrong_dns), None, now).unwrap();
    assert_eq!(r.reason, "SecretMismatch");
    assert!(r.message.contains("x.a.svc"), "{}", r.message);

    let wrong_uri = issued_secret(
        &key,
        &["spiffe://example.org/ns/a/sa/api"],
        &["web.a.svc"],
        90,
        ours(),
    );
    assert_eq!(
        issuance_reason(&d, Some(&wrong_uri), None, now)
            .unwrap()
            .reason,
        "SecretMismatch"
    );

    let d384 = validate(&cert(
        json!({"privateKey": {"algorithm": "ECDSA", "size": 384}}),
    ))
    .unwrap()
    .unwrap();
    let r = issuance_reason(&d384, Some(&good), None, now).unwrap();
    assert_eq!(r.reason, "SecretMismatch");
    assert!(r.message.contains("ECDSA P-384"), "{}", r.message);

    let d8 = validate(&cert(json!({"privateKey": {"encoding": "PKCS8"}})))
        .unwrap()
        .unwrap();
    assert_eq!(
        issuance_reason(&d8, Some(&good), None, now).unwrap().reason,
        "SecretMismatch"
    );

    let d24 = validate(&cert(json!({"duration": "24h"})))
        .unwrap()
        .unwrap();
    let r = issuance_reason(&d24, Some(&good), None, now).unwrap();
    assert!(r.message.contains("spec.duration changed"), "{}", r.message);

    let other_issuer = issued_secret(
        &key,
        &["spiffe://example.org/ns/a/sa/web"],
        &["web.a.svc"],
        90,
        json!({ANN_CERTIFICATE_NAME: "web", ANN_ISSUER_NAME: "old", ANN_ISSUER_KIND: "Issuer"}),
    );
    assert_eq!(
        issuance_reason(&d, Some(&other_issuer), None, now)
            .unwrap()
            .reason,
        "IncorrectIssuer"
    );

    let mut swapped = good_view();
    swapped.key = Some(Ok(generate(KeyAlgorithm::EcdsaP256).unwrap()));
    assert_eq!(
        issuance_reason(&d, Some(&swapped), None, now)
            .unwrap()
            .reason,
        "InvalidKeyPair"
    );
    let mut empty = good_view();
    empty.cert = None;
    assert_eq!(
        issuance_reason(&d, Some(&empty), None, now).unwrap().reason,
        "MissingData"
    );
}

#[test]
fn rotation_never_reuses_a_matching_key_only() {
    let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
    let s = issued_secret(&key, &["spiffe://example.org/ns/a/sa/web"], &[], 90, ours());
    let never = validate(&cert(json!({"privateKey": {"rotationPolicy": "Never"}})))
        .unwrap()
        .unwrap();
    assert_eq!(
        reusable_key(&never, Some(&s)).map(|k| k.public_key_der().unwrap()),
        Some(key.public_key_der().unwrap())
    );
    let always = validate(&cert(json!({}))).unwrap().unwrap();
    assert_eq!(reusable_key(&always, Some(&s)), None);
    let never384 = validate(&cert(
        json!({"privateKey": {"rotationPolicy": "Never", "size": 384}}),
    ))
    .unwrap()
    .unwrap();
    assert_eq!(reusable_key(&never384, Some(&s)), None);
}

#[test]
fn clamp_is_reported() {
    let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
    let s = issued_secret(&key, &["spiffe://example.org/ns/a/sa/web"], &[], 24, ours());
    let Some(Ok(c)) = &s.cert else { panic!() };
    let d = validate(&cert(json!({}))).unwrap().unwrap();
    let note = clamp_note(&d, c).unwrap();
    assert!(note.contains("limited its lifetime to 1day"), "{note}");
    let d24 = validate(&cert(json!({"duration": "24h"})))
        .unwrap()
        .unwrap();
    assert_eq!(clamp_note(&d24, c), None);
}
