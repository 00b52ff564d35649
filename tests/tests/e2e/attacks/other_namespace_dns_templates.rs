//! A pod in another namespace, whose namespace and service-account names were chosen so that a
//! careless DNS template gives it the same name as a victim's (issue 8, finding 11): namespace
//! `a-b` with service account `c`, and namespace `a` with service account `b-c`, under
//! `{namespace}-{serviceaccount}.svc`. Such templates are refused at start-up; with a sound
//! template each gets its own name and never the other's.

use signet_proto::ca::SignCsrRequest;
use signet_tests::{TokenIssuer, bin, csr_with};

use crate::pg_server;

#[tokio::test]
async fn ambiguous_templates_stop_start_up_and_sound_ones_keep_namespaces_apart() {
    let dir = tempfile::tempdir().unwrap();
    for (template, want) in [
        ("{namespace}-{serviceaccount}.svc", "whole label"),
        ("{serviceaccount}.svc", "does not contain {namespace}"),
    ] {
        let cfg = dir.path().join("server.toml");
        std::fs::write(
            &cfg,
            format!(
                "data_dir = \"{}\"\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\
                 [policy]\nkubernetes_dns_templates = [\"{template}\"]\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let out = std::process::Command::new(bin("signet-server"))
            .args(["--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{template} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(template) && err.contains(want),
            "{template}: {err}"
        );
    }

    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(
        &tokens,
        "[policy]\nkubernetes_dns_templates = [\"{serviceaccount}.{namespace}.svc\"]\n",
    )
    .await
    else {
        return;
    };
    let ask = |ns: &'static str, sa: &'static str, dns: &'static str| {
        let (csr, _k) = csr_with(&[], &[dns]);
        signet_client::with_bearer(
            SignCsrRequest {
                csr: csr.into_bytes(),
                ttl_seconds: 0,
                kubernetes_namespace: String::new(),
            },
            &tokens.token(ns, sa),
        )
        .unwrap()
    };
    let mut native = server.native().await;
    native
        .sign_csr(ask("a-b", "c", "c.a-b.svc"))
        .await
        .expect("own name");
    native
        .sign_csr(ask("a", "b-c", "b-c.a.svc"))
        .await
        .expect("own name");
    for (ns, sa, other) in [("a", "b-c", "c.a-b.svc"), ("a-b", "c", "b-c.a.svc")] {
        let e = native.sign_csr(ask(ns, sa, other)).await.expect_err(other);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    }
}
