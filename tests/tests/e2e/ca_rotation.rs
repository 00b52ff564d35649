//! The CA key lifecycle against the real server: intermediate and root rotation with tiny
//! lifetimes (chains verify with `openssl verify -x509_strict` before, during and after),
//! two servers on one PostgreSQL rotating once, and `signetctl ca …` allowed and refused.

use std::time::{Duration, Instant};

use signet_proto::ca::GetBundleRequest;
use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::*;

use crate::agent::eventually;
use crate::pg_server;

/// Short lifetimes; the rotator looks every 200 ms.
const FAST: &str = "[ca]\nintermediate_ttl = \"20s\"\nrotation_interval = \"200ms\"\n\
                    root_propagation = \"2s\"\nrotation_jitter = 0.0\n";

async fn istio_chain(server: &Server, tokens: &TokenIssuer) -> Vec<String> {
    let (csr, _key) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr,
            validity_duration: 5,
            metadata: None,
        },
        &tokens.token("payments", "api"),
    )
    .unwrap();
    server
        .istio()
        .await
        .create_certificate(req)
        .await
        .unwrap()
        .into_inner()
        .cert_chain
}

fn status(server: &Server) -> serde_json::Value {
    let out = server.signetctl(&["ca", "status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn slots<'a>(
    st: &'a serde_json::Value,
    kind: &'a str,
    state: &'a str,
) -> impl Iterator<Item = &'a serde_json::Value> + 'a {
    st["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(move |s| s["kind"] == kind && (state.is_empty() || s["state"] == state))
}

fn bundle_now(server: &Server) -> Vec<u8> {
    std::fs::read(server.bundle_path()).unwrap()
}

/// The chain verifies strictly against the current bundle; returns its intermediate (PEM).
fn verify(server: &Server, chain: &[String]) -> String {
    assert_eq!(chain.len(), 3, "leaf, intermediate, roots: {chain:?}");
    let bundle = bundle_now(server);
    assert_eq!(
        chain[2].as_bytes(),
        bundle.as_slice(),
        "last element = every root"
    );
    openssl_verify(chain, &bundle).unwrap();
    chain[1].clone()
}

#[tokio::test]
async fn ca_intermediate_rotates_and_chains_verify_before_during_and_after() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, FAST).await else {
        return;
    };
    let st = status(&server);
    assert_eq!(slots(&st, "root", "active").count(), 1, "{st}");
    assert_eq!(slots(&st, "intermediate", "active").count(), 1, "{st}");
    let first_int = verify(&server, &istio_chain(&server, &tokens).await);
    let first_bundle = bundle_now(&server);
    // Half-way (10 s): a prepared intermediate; still signing with the first.
    eventually(20, "a prepared intermediate", || async {
        (slots(&status(&server), "intermediate", "prepared").count() == 1).then_some(())
    })
    .await;
    assert_eq!(
        verify(&server, &istio_chain(&server, &tokens).await),
        first_int
    );
    // At 5/6: the new one signs, the old one is retired; the bundle (roots) is unchanged.
    eventually(20, "a retired intermediate", || async {
        (slots(&status(&server), "intermediate", "retired").count() == 1).then_some(())
    })
    .await;
    // `ca status` reads the committed slots; the signer follows when the rotator publishes the
    // new view, a moment later.
    let chain = eventually(5, "the new intermediate signing", || async {
        let chain = istio_chain(&server, &tokens).await;
        (chain[1] != first_int).then_some(chain)
    })
    .await;
    assert_ne!(
        verify(&server, &chain),
        first_int,
        "the new intermediate signs"
    );
    assert_eq!(bundle_now(&server), first_bundle);
    // The old one is removed once its last leaf (5 s) has expired.
    eventually(20, "the old intermediate removed", || async {
        (slots(&status(&server), "intermediate", "removed").count() == 1).then_some(())
    })
    .await;
    verify(&server, &istio_chain(&server, &tokens).await);
    let audit = server.signetctl(&["audit", "list", "--json", "--limit", "1000"]);
    let text = String::from_utf8_lossy(&audit.stdout);
    for kind in ["ca.prepared", "ca.activated", "ca.retired", "ca.removed"] {
        assert!(text.contains(kind), "{kind} in {text}");
    }
}

#[tokio::test]
async fn ca_root_rotation_by_the_operator_keeps_both_roots_during_the_overlap() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, FAST).await else {
        return;
    };
    let before = istio_chain(&server, &tokens).await;
    verify(&server, &before);
    let old_root = slots(&status(&server), "root", "active").next().unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Prepare: in the bundle at once (and in the Istio answer's last element), signing nothing.
    let out = server.signetctl(&["ca", "prepare", "--root"]);
    assert!(out.status.success(), "{out:?}");
    let new_root = String::from_utf8(out.stdout).unwrap();
    let new_root = new_root
        .trim()
        .strip_prefix("prepared ")
        .unwrap()
        .to_owned();
    // Prepared twice: refused.
    let out = server.signetctl(&["ca", "prepare", "--root"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already prepared"),
        "{out:?}"
    );
    eventually(10, "two roots in bundle.pem", || async {
        (signet_types::pem::parse_certs(&bundle_now(&server))
            .unwrap()
            .len()
            == 2)
            .then_some(())
    })
    .await;
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.roots.len(), 2);
    let during = istio_chain(&server, &tokens).await;
    assert_eq!(during[1], before[1], "the old intermediate still signs");
    verify(&server, &during);
    assert_eq!(
        signet_types::pem::parse_certs(during[2].as_bytes())
            .unwrap()
            .len(),
        2,
        "both roots in the last element"
    );

    // Activate: a new intermediate under the new root signs at once. Not before the root has
    // been in the bundle for root_propagation (2 s here): until then the server refuses it
    // without --force.
    eventually(10, "the new root's activation", || async {
        let out = server.signetctl(&["ca", "activate", &new_root]);
        if out.status.success() {
            return Some(());
        }
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--force"),
            "{out:?}"
        );
        None
    })
    .await;
    eventually(10, "an intermediate under the new root", || async {
        let st = status(&server);
        slots(&st, "intermediate", "active")
            .any(|s| s["parent_key_id"] == new_root.as_str())
            .then_some(())
    })
    .await;
    let after = istio_chain(&server, &tokens).await;
    assert_ne!(after[1], before[1]);
    verify(&server, &after);
    // The old root is retired but trusted while its certificates live: the earlier leaves
    // (and the server's own TLS certificate) still verify.
    let st = status(&server);
    let old = slots(&st, "root", "retired").next().unwrap();
    assert_eq!(old["key_id"], old_root.as_str());
    assert!(old["unexpired_certificates"].as_u64().unwrap() >= 1, "{st}");
    openssl_verify(&before, &bundle_now(&server)).unwrap();
    // Revoking it now is refused and says who holds certificates under it.
    let out = server.signetctl(&["ca", "revoke", &old_root]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unexpired certificate") && err.contains("FailedPrecondition"),
        "{err}"
    );
    assert_eq!(
        signet_types::pem::parse_certs(&bundle_now(&server))
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn ca_signetctl_refuses_what_the_slots_do_not_allow() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let st = status(&server);
    let active = st["active_key_id"].as_str().unwrap().to_owned();
    let root = slots(&st, "root", "active").next().unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let fails = |args: &[&str], code: &str, text: &str| {
        let out = server.signetctl(args);
        assert!(!out.status.success(), "{args:?} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(code) && err.contains(text), "{args:?}: {err}");
    };
    // The table names every key and the signing one.
    let out = server.signetctl(&["ca", "status"]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&root) && table.contains(&format!("signing: {active}")),
        "{table}"
    );
    fails(
        &["ca", "activate", &active],
        "FailedPrecondition",
        "not prepared",
    );
    fails(
        &["ca", "revoke", &active],
        "FailedPrecondition",
        "is active",
    );
    fails(&["ca", "revoke", &root], "FailedPrecondition", "");
    fails(&["ca", "taint", "00ff"], "NotFound", "no CA key");
    fails(&["ca", "taint", "not-hex!"], "InvalidArgument", "hex");
    // Nothing changed.
    assert_eq!(status(&server)["slots"], st["slots"]);

    // Prepare and activate an intermediate by hand; the old one is retired.
    let out = server.signetctl(&["ca", "prepare"]);
    assert!(out.status.success(), "{out:?}");
    let next = String::from_utf8(out.stdout).unwrap();
    let next = next.trim().strip_prefix("prepared ").unwrap().to_owned();
    let out = server.signetctl(&["ca", "activate", &next]);
    assert!(out.status.success(), "{out:?}");
    let chain = istio_chain(&server, &tokens).await;
    verify(&server, &chain);
    assert_eq!(status(&server)["active_key_id"], next.as_str());

    // Taint the active key: in the bundle's tainted IDs; the CLI says what to do next.
    let out = server.signetctl(&["ca", "taint", &next]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("signetctl ca prepare"),
        "{out:?}"
    );
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.tainted_key_ids, std::slice::from_ref(&next));
    let st = status(&server);
    assert!(slots(&st, "intermediate", "active").all(|s| s["tainted"] == true));

    // The retired first intermediate: revoke refused while the server's TLS certificate (issued
    // under it) lives, then forced.
    fails(
        &["ca", "revoke", &active],
        "FailedPrecondition",
        "unexpired certificate",
    );
    let out = server.signetctl(&["ca", "revoke", &active, "--force"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("forced"),
        "{out:?}"
    );
    let st = status(&server);
    assert_eq!(slots(&st, "intermediate", "removed").count(), 1, "{st}");

    // Every action and refusal is in the audit log (refusals are written in the background).
    eventually(10, "the CA audit events", || async {
        let audit = server.signetctl(&["audit", "list", "--json", "--limit", "1000"]);
        let text = String::from_utf8_lossy(&audit.stdout).into_owned();
        [
            "ca.refused",
            "ca.prepared",
            "ca.activated",
            "ca.tainted",
            "ca.revoked",
        ]
        .iter()
        .all(|k| text.contains(k))
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn ca_two_servers_on_one_postgresql_rotate_once() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    // One key-encryption key for both replicas (32 random bytes, base64).
    let dir = tempfile::tempdir().unwrap();
    let kek_path = dir.path().join("kek");
    let kek = std::process::Command::new("openssl")
        .args(["rand", "-base64", "32"])
        .output()
        .unwrap();
    assert!(kek.status.success());
    std::fs::write(&kek_path, &kek.stdout).unwrap();
    let extra = format!(
        "{}kek_file = \"{}\"\n",
        FAST.replace("200ms", "100ms"),
        kek_path.display()
    );
    let start = || {
        Server::start(ServerOpts {
            database_url: Some(url.clone()),
            tokens: Some(tokens.jwks_json()),
            extra_toml: extra.clone(),
            ..ServerOpts::default()
        })
    };
    let (a, b) = tokio::join!(start(), start());
    let st = status(&a);
    assert_eq!(slots(&st, "root", "").count(), 1, "{st}");
    assert_eq!(slots(&st, "intermediate", "").count(), 1, "{st}");
    // Both sign with the same intermediate.
    assert_eq!(
        verify(&a, &istio_chain(&a, &tokens).await),
        verify(&b, &istio_chain(&b, &tokens).await)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(&a);
        assert!(
            slots(&st, "intermediate", "prepared").count() <= 1,
            "two replicas prepared twice: {st}"
        );
        assert_eq!(slots(&st, "intermediate", "active").count(), 1, "{st}");
        if slots(&st, "intermediate", "retired").count() == 1 {
            // The retired one, the active one, and perhaps already the next prepared one
            // (with 20 s lifetimes the successor is half-way through its life when activated).
            assert!(slots(&st, "intermediate", "").count() <= 3, "{st}");
            // The server's own certificate is renewed at half its remaining life, so a few
            // renewals at most, never a loop (it is cut short by the intermediate's notAfter).
            let issued: u64 = slots(&st, "root", "")
                .map(|s| s["unexpired_certificates"].as_u64().unwrap())
                .sum();
            assert!(issued < 40, "{st}");
            break;
        }
        assert!(Instant::now() < deadline, "no rotation: {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both replicas pick up the one new intermediate.
    let new = eventually(
        10,
        "both replicas sign with the new intermediate",
        || async {
            let (x, y) = (
                verify(&a, &istio_chain(&a, &tokens).await),
                verify(&b, &istio_chain(&b, &tokens).await),
            );
            (x == y).then_some(x)
        },
    )
    .await;
    assert!(!new.is_empty());
    // Every key was created once and activated at most once, whichever replica did it.
    let audit = a.signetctl(&["audit", "list", "--json", "--limit", "1000"]);
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&audit.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let st = status(&a);
    for s in st["slots"].as_array().unwrap() {
        let (kind, id) = (s["kind"].as_str().unwrap(), s["key_id"].as_str().unwrap());
        let count = |what: &str, verb: &str| {
            events
                .iter()
                .filter(|e| {
                    e["kind"] == what
                        && e["detail"]
                            .as_str()
                            .unwrap()
                            .starts_with(&format!("{kind} {id} {verb}"))
                })
                .count()
        };
        assert_eq!(count("ca.prepared", "prepared"), 1, "{id}: {events:?}");
        assert!(count("ca.activated", "activated") <= 1, "{id}: {events:?}");
    }
    let activations = events
        .iter()
        .filter(|e| e["kind"] == "ca.activated")
        .count();
    assert!(
        activations >= 3,
        "root, first and second intermediate: {events:?}"
    );
}

#[tokio::test]
async fn ca_taint_of_the_active_key_blocks_mtls_renewal_until_an_untainted_key_signs() {
    use signet_proto::ca::SignCsrRequest;
    use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let kc = signet_client::new_key_and_csr().unwrap();
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: kc.csr_der.clone(),
            ttl_seconds: 600,
            kubernetes_namespace: String::new(),
        },
        &tokens.token("web", "frontend"),
    )
    .unwrap();
    let resp = server
        .native()
        .await
        .sign_csr(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.cert_chain.len(), 3, "leaf, intermediate, root");
    let id = signet_client::ClientIdentity {
        cert_chain_pem: signet_types::pem::cert_to_pem(&resp.cert_chain[0]).into_bytes(),
        key_pem: kc.key_pem.clone().into_bytes(),
    };
    let renew = || async {
        let mut c = CertificateAuthorityClient::new(server.channel_with(&id).await);
        let kc = signet_client::new_key_and_csr().unwrap();
        c.sign_csr(SignCsrRequest {
            csr: kc.csr_der,
            ttl_seconds: 60,
            kubernetes_namespace: String::new(),
        })
        .await
    };
    let first = status(&server)["active_key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    renew().await.unwrap();
    let out = server.signetctl(&["ca", "taint", &first]);
    assert!(out.status.success(), "{out:?}");
    // Renewing now would hand out another certificate from the tainted key: refused.
    let err = renew().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("tainted"), "{err:?}");
    // A new untainted intermediate: the same certificate renews again, from the new key.
    let out = server.signetctl(&["ca", "prepare"]);
    assert!(out.status.success(), "{out:?}");
    let next = String::from_utf8(out.stdout).unwrap();
    let next = next.trim().strip_prefix("prepared ").unwrap().to_owned();
    let out = server.signetctl(&["ca", "activate", &next]);
    assert!(out.status.success(), "{out:?}");
    let renewed = renew().await.unwrap().into_inner();
    assert_ne!(renewed.cert_chain[1], resp.cert_chain[1]);
    let pems: Vec<String> = renewed
        .cert_chain
        .iter()
        .map(|d| signet_types::pem::cert_to_pem(d))
        .collect();
    openssl_verify(&pems, &bundle_now(&server)).unwrap();
}

#[tokio::test]
async fn ca_plugged_in_files_that_change_are_picked_up_without_a_restart() {
    use crate::plugged::ca_params;
    use rcgen::{Issuer, KeyPair};
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let root_key = KeyPair::generate().unwrap();
    let root = ca_params("Example Root CA").self_signed(&root_key).unwrap();
    let root_issuer = Issuer::new(ca_params("Example Root CA"), &root_key);
    let inter = |cn: &str, issuer: &Issuer<'_, &KeyPair>| {
        let k = KeyPair::generate().unwrap();
        let c = ca_params(cn).signed_by(&k, issuer).unwrap();
        (c, k)
    };
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let write = |cert: &rcgen::Certificate, key: &KeyPair, chain: String, roots: String| {
        // Each file atomically (the manager may read between two files: a mismatch is ignored
        // and read again on the next tick).
        for (name, data) in [
            ("ca-key.pem", key.serialize_pem()),
            ("ca-cert.pem", cert.pem()),
            ("cert-chain.pem", chain),
            ("root-cert.pem", roots),
        ] {
            let tmp = p(&format!(".{name}.tmp"));
            std::fs::write(&tmp, data).unwrap();
            std::fs::rename(&tmp, p(name)).unwrap();
        }
    };
    let (i1, k1) = inter("Mesh Intermediate 1", &root_issuer);
    write(&i1, &k1, format!("{}{}", i1.pem(), root.pem()), root.pem());
    let extra = format!(
        "[ca]\nrotation_interval = \"200ms\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n\
         chain_file = \"{}\"\nroot_file = \"{}\"\n",
        p("ca-cert.pem").display(),
        p("ca-key.pem").display(),
        p("cert-chain.pem").display(),
        p("root-cert.pem").display()
    );
    let server = Server::start(ServerOpts {
        database_url: Some(url),
        tokens: Some(tokens.jwks_json()),
        extra_toml: extra,
        ..ServerOpts::default()
    })
    .await;
    let chain = istio_chain(&server, &tokens).await;
    assert_eq!(chain[1].trim(), i1.pem().trim());
    verify(&server, &chain);
    // The slot commands are refused: the operator rotates by replacing the files.
    let out = server.signetctl(&["ca", "prepare"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("plugged in"),
        "{out:?}"
    );
    // The JWT keys are Signet's own even so: one is active, JWT-SVIDs are minted with it and
    // validate with the published keys, and `ca prepare --kind jwt` works.
    let jwt_key = status(&server)["active_jwt_key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let minted = server
        .native()
        .await
        .mint_jwt_svid(
            signet_client::with_bearer(
                signet_proto::ca::MintJwtSvidRequest {
                    audience: vec!["api".into()],
                    ttl_seconds: 0,
                },
                &tokens.token("payments", "api"),
            )
            .unwrap(),
        )
        .await
        .unwrap()
        .into_inner();
    let ok = crate::jwt_issuance::validates(&server, &minted.token, "api").await;
    assert_eq!(ok.key_id, jwt_key);
    let out = server.signetctl(&["ca", "prepare", "--kind", "jwt"]);
    assert!(out.status.success(), "{out:?}");

    // A new intermediate under the same root.
    let (i2, k2) = inter("Mesh Intermediate 2", &root_issuer);
    write(&i2, &k2, format!("{}{}", i2.pem(), root.pem()), root.pem());
    eventually(10, "the new intermediate signing", || async {
        let chain = istio_chain(&server, &tokens).await;
        (chain[1].trim() == i2.pem().trim()).then_some(())
    })
    .await;
    verify(&server, &istio_chain(&server, &tokens).await);

    // A new root (both trusted while the operator rotates) with an intermediate under it.
    let root2_key = KeyPair::generate().unwrap();
    let root2 = ca_params("Example Root CA 2")
        .self_signed(&root2_key)
        .unwrap();
    let root2_issuer = Issuer::new(ca_params("Example Root CA 2"), &root2_key);
    let (i3, k3) = inter("Mesh Intermediate 3", &root2_issuer);
    write(
        &i3,
        &k3,
        format!("{}{}", i3.pem(), root2.pem()),
        format!("{}{}", root.pem(), root2.pem()),
    );
    eventually(10, "both roots in bundle.pem", || async {
        (signet_types::pem::parse_certs(&bundle_now(&server))
            .unwrap()
            .len()
            == 2)
            .then_some(())
    })
    .await;
    let chain = istio_chain(&server, &tokens).await;
    assert_eq!(chain[1].trim(), i3.pem().trim());
    verify(&server, &chain);
    // A broken change (a key that does not match) is ignored: the last good CA keeps signing.
    std::fs::write(p("ca-key.pem"), k1.serialize_pem()).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let chain = istio_chain(&server, &tokens).await;
    assert_eq!(chain[1].trim(), i3.pem().trim());
}

#[tokio::test]
async fn ca_root_rotates_by_itself_and_the_old_root_leaves_once_nothing_chains_to_it() {
    let tokens = TokenIssuer::new("k1");
    let toml = "[ca]\nroot_ttl = \"30s\"\nintermediate_ttl = \"8s\"\nrotation_interval = \"200ms\"\n\
                root_propagation = \"2s\"\nrotation_jitter = 0.0\n";
    let Some(mut server) = pg_server(&tokens, toml).await else {
        return;
    };
    let root_id = |st: &serde_json::Value| {
        slots(st, "root", "active").next().unwrap()["key_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let old_root = root_id(&status(&server));
    let old_root_der = signet_types::pem::parse_certs(&bundle_now(&server)).unwrap();
    assert_eq!(old_root_der.len(), 1);
    verify(&server, &istio_chain(&server, &tokens).await);
    // Prepared: two roots in the bundle and in the Istio answer, the old one still anchoring.
    eventually(40, "a prepared root in the bundle", || async {
        let chain = istio_chain(&server, &tokens).await;
        (signet_types::pem::parse_certs(chain[2].as_bytes())
            .unwrap()
            .len()
            == 2)
            .then_some(())
    })
    .await;
    verify(&server, &istio_chain(&server, &tokens).await);
    // This test's client follows the bundle like any relying party (the server's own
    // certificate moves to the new root too).
    server.bundle_pem = bundle_now(&server);
    // Activated: a new root anchors new chains; the old one is still trusted.
    eventually(40, "the new root active", || async {
        (root_id(&status(&server)) != old_root).then_some(())
    })
    .await;
    let chain = istio_chain(&server, &tokens).await;
    verify(&server, &chain);
    // Removed once nothing chains to it (or it expires): one root again.
    eventually(40, "the old root out of the bundle", || async {
        let st = status(&server);
        slots(&st, "root", "removed")
            .any(|s| s["key_id"] == old_root.as_str())
            .then_some(())
    })
    .await;
    let chain = istio_chain(&server, &tokens).await;
    verify(&server, &chain);
    // (With 30 s roots the next one may already be prepared: only the old one must be gone.)
    let roots = signet_types::pem::parse_certs(&bundle_now(&server)).unwrap();
    assert!(!roots.contains(&old_root_der[0]));
    assert!(!roots.is_empty());
}
