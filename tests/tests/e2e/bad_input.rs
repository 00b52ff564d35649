//! Bad input gets a clear error and changes nothing: every case answers the right code with
//! a message a person can act on, the server keeps serving, and no certificate row is written.

use signet_proto::istio_ca::IstioCertificateRequest;
use signet_proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use signet_tests::*;
use tonic::Code;
use tonic::transport::Channel;

use crate::pg_server;

async fn call(
    client: &mut IstioCertificateServiceClient<Channel>,
    csr: String,
    ttl: i64,
    token: Option<&str>,
) -> Result<Vec<String>, tonic::Status> {
    let msg = IstioCertificateRequest {
        csr,
        validity_duration: ttl,
        metadata: None,
    };
    let req = match token {
        Some(t) => signet_client::with_bearer(msg, t).unwrap(),
        None => tonic::Request::new(msg),
    };
    client
        .create_certificate(req)
        .await
        .map(|r| r.into_inner().cert_chain)
}

fn openssl_csr(args: &[&str]) -> String {
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-new",
            "-nodes",
            "-keyout",
            "/dev/null",
            "-subj",
            "/CN=x",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn tampered_csr() -> String {
    let (pem, _k) = csr_with(&[], &[]);
    let mut der = pem::parse(pem.as_bytes()).unwrap().into_contents();
    let n = der.len();
    der[n - 3] ^= 0x55; // inside the signature
    pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der))
}

fn ca_csr() -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.serialize_request(&key).unwrap().pem().unwrap()
}

/// (name, csr, ttl, bearer token, expected code, a phrase the message must contain)
type Case = (
    &'static str,
    String,
    i64,
    Option<String>,
    Code,
    &'static str,
);

#[tokio::test]
async fn hostile_and_malformed_requests_change_nothing() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let before = server.cert_count().await;
    let mut client = server.istio().await;
    let good = tokens.token("shop", "cart");
    let (good_csr, _k) = csr_with(&[], &[]);

    let mut claims_expired = tokens.claims("shop", "cart");
    claims_expired["exp"] = serde_json::json!(now_unix() - 3600);
    claims_expired["iat"] = serde_json::json!(now_unix() - 7200);
    claims_expired["nbf"] = serde_json::json!(now_unix() - 7200);
    let mut claims_future = tokens.claims("shop", "cart");
    claims_future["nbf"] = serde_json::json!(now_unix() + 3600);
    claims_future["iat"] = serde_json::json!(now_unix() + 3600);
    let mut claims_aud = tokens.claims("shop", "cart");
    claims_aud["aud"] = serde_json::json!(["vault"]);
    let mut claims_iss = tokens.claims("shop", "cart");
    claims_iss["iss"] = serde_json::json!("https://evil.example");
    let other_key = TokenIssuer::new("k1");
    let b64 = |v: &serde_json::Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let alg_none = format!(
        "{}.{}.",
        b64(&serde_json::json!({"alg": "none", "typ": "JWT", "kid": "k1"})),
        b64(&tokens.claims("shop", "cart"))
    );
    let big = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        "A".repeat(70 * 1024)
    );
    let huge = "A".repeat(300 * 1024);

    let cases: Vec<Case> = vec![
        (
            "not PEM",
            "hello".into(),
            0,
            Some(good.clone()),
            Code::InvalidArgument,
            "CSR",
        ),
        (
            "bad signature",
            tampered_csr(),
            0,
            Some(good.clone()),
            Code::InvalidArgument,
            "signature",
        ),
        (
            "RSA-1024",
            openssl_csr(&["-newkey", "rsa:1024"]),
            0,
            Some(good.clone()),
            Code::InvalidArgument,
            "2048",
        ),
        (
            "CA=true",
            ca_csr(),
            0,
            Some(good.clone()),
            Code::InvalidArgument,
            "CA",
        ),
        (
            "over 64 KiB",
            big,
            0,
            Some(good.clone()),
            Code::InvalidArgument,
            "64 KiB",
        ),
        (
            "negative TTL",
            good_csr.clone(),
            -5,
            Some(good.clone()),
            Code::InvalidArgument,
            "negative",
        ),
        (
            "absurd TTL",
            good_csr.clone(),
            i64::MAX,
            Some(good.clone()),
            Code::InvalidArgument,
            "absurd",
        ),
        (
            "over the message limit",
            huge,
            0,
            Some(good.clone()),
            Code::InvalidArgument,
            "at most",
        ),
        (
            "expired JWT",
            good_csr.clone(),
            0,
            Some(tokens.sign(&claims_expired)),
            Code::Unauthenticated,
            "expired",
        ),
        (
            "not-yet-valid JWT",
            good_csr.clone(),
            0,
            Some(tokens.sign(&claims_future)),
            Code::Unauthenticated,
            "not",
        ),
        (
            "alg none",
            good_csr.clone(),
            0,
            Some(alg_none),
            Code::Unauthenticated,
            "none",
        ),
        (
            "another key",
            good_csr.clone(),
            0,
            Some(other_key.token("shop", "cart")),
            Code::Unauthenticated,
            "key",
        ),
        (
            "another audience",
            good_csr.clone(),
            0,
            Some(tokens.sign(&claims_aud)),
            Code::Unauthenticated,
            "audience",
        ),
        (
            "another issuer",
            good_csr.clone(),
            0,
            Some(tokens.sign(&claims_iss)),
            Code::Unauthenticated,
            "issuer",
        ),
        (
            "no credentials",
            good_csr.clone(),
            0,
            None,
            Code::Unauthenticated,
            "credentials",
        ),
        (
            "garbage bearer",
            good_csr.clone(),
            0,
            Some("not.a.jwt".into()),
            Code::Unauthenticated,
            "token",
        ),
        (
            "another identity",
            csr_with(&["spiffe://example.org/ns/bank/sa/vault"], &[]).0,
            0,
            Some(good.clone()),
            Code::PermissionDenied,
            "spiffe://example.org/ns/bank/sa/vault",
        ),
        (
            "another trust domain",
            csr_with(&["spiffe://evil.org/ns/shop/sa/cart"], &[]).0,
            0,
            Some(good.clone()),
            Code::PermissionDenied,
            "evil.org",
        ),
        (
            "ungranted DNS name",
            csr_with(&[], &["www.google.com"]).0,
            0,
            Some(good.clone()),
            Code::PermissionDenied,
            "www.google.com",
        ),
    ];
    for (name, csr, ttl, token, code, phrase) in cases {
        let err = call(&mut client, csr, ttl, token.as_deref())
            .await
            .expect_err(name);
        assert_eq!(err.code(), code, "{name}: {err:?}");
        assert!(
            err.message().contains(phrase),
            "{name}: message {:?} should mention {phrase:?}",
            err.message()
        );
        if let Some(t) = &token {
            assert!(!err.message().contains(t.as_str()), "{name}: token echoed");
        }
    }

    // Nothing was written, and the server still serves.
    assert_eq!(server.cert_count().await, before);
    let chain = call(&mut client, good_csr, 0, Some(&good)).await.unwrap();
    openssl_verify(&chain, &server.bundle_pem).unwrap();
    assert_eq!(server.cert_count().await, before + 1);

    // Refusals are audit events (written in the background: poll briefly).
    let mut text = String::new();
    for _ in 0..100 {
        let out = server.signetctl(&["audit", "list", "--json", "--limit", "1000"]);
        assert!(out.status.success());
        text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("issue.denied") && text.contains("authn.refused") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(text.contains("issue.denied"), "{text}");
    assert!(text.contains("authn.refused"), "{text}");
    assert!(!text.contains(&good), "audit log holds a token");
}
