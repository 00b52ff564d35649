//! A thief copies a workload's key and certificate and renews it over mTLS with a key of their
//! own (twice: a renewal of the renewal). The operator revokes the leaked serial as the README
//! says. Issue 24, finding 3: before, the renewals lived on (and an entry-sourced one renewed
//! forever). Now the revocation follows `renewed_from` forward: every renewal is revoked with
//! it, listed in the CRL, and none renews again.

use signet_proto::admin::GetCertificateRequest;

use super::support::*;
use crate::agent::eventually;
use crate::pg_server;
use signet_tests::TokenIssuer;

async fn revoked_at(server: &signet_tests::Server, serial: &str) -> i64 {
    server
        .admin()
        .await
        .get_certificate(GetCertificateRequest {
            serial: serial.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .revoked_at
}

#[tokio::test]
async fn revoking_a_leaked_certificate_revokes_every_renewal_made_from_it() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let node = attest_node(&server, "vm1").await;
    let entry = create_entry(&server, "vm1", "/app", 600, &[]).await;
    let (delivered, leaked) = entry_certificate(&server, &node, &entry).await;

    // The thief's renewals (allowed: the entry stands and the delivery is recent).
    let (stolen1, serial1, _) = renew_over_mtls(&server, &delivered, 0, &[])
        .await
        .expect("the thief renews");
    let (stolen2, serial2, _) = renew_over_mtls(&server, &stolen1, 0, &[])
        .await
        .expect("and renews the renewal");

    // The operator revokes the leaked serial.
    let out = server.signetctl(&["certs", "revoke", &leaked, "--reason", "keyCompromise"]);
    assert!(out.status.success(), "{out:?}");
    for s in [&leaked, &serial1, &serial2] {
        assert!(revoked_at(&server, s).await > 0, "{s} not revoked");
    }
    // The CRL of the issuing key lists every one of them.
    let int = server
        .admin()
        .await
        .get_certificate(GetCertificateRequest {
            serial: serial2.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .ca_key_id;
    let want = [leaked.clone(), serial1.clone(), serial2.clone()];
    eventually(10, "the CRL lists the renewals", || async {
        let der = std::fs::read(server.data_dir.join("crl").join(format!("{int}.crl"))).ok()?;
        let crl = signet_pki::ParsedCrl::from_der(&der).ok()?;
        let listed: Vec<String> = crl.entries().keys().map(hex::encode).collect();
        want.iter().all(|s| listed.contains(s)).then_some(())
    })
    .await;
    // None of them renews again.
    for holder in [&delivered, &stolen1, &stolen2] {
        let e = renew_over_mtls(&server, holder, 0, &[])
            .await
            .expect_err("a revoked chain renewed");
        assert!(
            matches!(
                e.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
            ),
            "{e:?}"
        );
    }
    // The legitimate path: the agent delivers afresh through the node API.
    let (fresh, _) = entry_certificate(&server, &node, &entry).await;
    renew_over_mtls(&server, &fresh, 0, &[])
        .await
        .expect("a fresh delivery renews");
}
