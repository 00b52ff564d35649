//! Someone who wants a certificate with the CA server's own names or identity, to sit between
//! clients and the server (issue 8, finding 9, server side): not the operator's mint, not the
//! bridge's templates for the server's namespace, not an impersonator (impersonator tests).
//! Only the server's own certificate carries them.

use signet_proto::admin::MintX509SvidRequest;
use signet_proto::ca::SignCsrRequest;
use signet_tests::{TokenIssuer, csr_with};

use crate::pg_server;

const BRIDGE: &str = "spiffe://example.org/ns/signet-system/sa/signet-k8s";

#[tokio::test]
async fn no_certificate_but_the_servers_carries_its_names() {
    let tokens = TokenIssuer::new("k1");
    let cfg = format!(
        "server_names = [\"signet.signet-system.svc\"]\n\
         [policy.kubernetes_bridge]\ncallers = [\"{BRIDGE}\"]\n"
    );
    let Some(server) = pg_server(&tokens, &cfg).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("minted");
    let out = out.to_str().unwrap();

    // The operator's mint: not the server's ID, not its names, not a wildcard over them.
    for (args, want) in [
        (
            vec!["--spiffe-id", "spiffe://example.org/signet/server"],
            "reserved",
        ),
        (
            vec!["--spiffe-id", "spiffe://example.org/signet/node/n1"],
            "reserved",
        ),
        (
            vec![
                "--spiffe-id",
                "spiffe://example.org/web",
                "--dns",
                "localhost",
            ],
            "the CA server's own name",
        ),
        (
            vec![
                "--spiffe-id",
                "spiffe://example.org/web",
                "--dns",
                "*.signet-system.svc",
            ],
            "the CA server's own name",
        ),
    ] {
        let mut argv = vec!["mint"];
        argv.extend(args.iter().copied());
        argv.extend(["--out", out]);
        let o = server.signetctl(&argv);
        assert!(!o.status.success(), "{argv:?} was minted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{argv:?}: {err}");
    }
    let (csr, _k) = csr_with(&[], &[]);
    let e = server
        .admin()
        .await
        .mint_x509_svid(MintX509SvidRequest {
            spiffe_id: "spiffe://example.org/web".into(),
            csr: csr.into_bytes(),
            ttl_seconds: 0,
            dns_names: vec!["signet.signet-system.svc".into()],
        })
        .await
        .expect_err("server name");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // An ordinary mint still works.
    let o = server.signetctl(&[
        "mint",
        "--spiffe-id",
        "spiffe://example.org/web",
        "--dns",
        "web.example.org",
        "--out",
        out,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // The bridge, for an object in the server's own namespace: not the server's name.
    let bridge_sign = |dns: &'static str| {
        let (csr, _k) = csr_with(&["spiffe://example.org/ns/signet-system/sa/web"], &[dns]);
        signet_client::with_bearer(
            SignCsrRequest {
                csr: csr.into_bytes(),
                ttl_seconds: 0,
                kubernetes_namespace: "signet-system".into(),
            },
            &tokens.token("signet-system", "signet-k8s"),
        )
        .unwrap()
    };
    let e = server
        .native()
        .await
        .sign_csr(bridge_sign("signet.signet-system.svc"))
        .await
        .expect_err("the server's name");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("the CA server's own name"),
        "{}",
        e.message()
    );
    server
        .native()
        .await
        .sign_csr(bridge_sign("web.signet-system.svc"))
        .await
        .expect("another name in that namespace");

    // The server's own certificate has them all.
    let o = server.signetctl(&[
        "certs",
        "list",
        "--json",
        "--spiffe-id",
        "spiffe://example.org/signet/server",
    ]);
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(listed.contains("signet.signet-system.svc"), "{listed}");
    assert!(listed.contains("localhost"), "{listed}");
    assert!(
        listed.contains(r#""kind":"server""#) || listed.contains(r#""kind": "server""#),
        "{listed}"
    );
}
