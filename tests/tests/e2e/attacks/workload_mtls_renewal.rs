//! A workload (or whoever stole its certificate) renewing over mTLS after its authority is
//! gone: the entry deleted, its node banned, the service-account token long past. Issue 8,
//! finding 3. The server re-checks the presented certificate's ledger row and provenance at
//! every renewal (server/src/policy/renewal.rs).

use signet_proto::admin::{BanNodeRequest, DeleteEntryRequest};
use signet_proto::agent::SyncEntriesRequest;
use signet_proto::agent::node_client::NodeClient;
use signet_proto::ca::SignCsrRequest;
use signet_tests::TokenIssuer;

use super::support::*;
use crate::pg_server;

#[tokio::test]
async fn a_delivered_certificate_renews_within_its_entry_and_stops_when_entry_or_node_goes() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let node = attest_node(&server, "vm1").await;
    let entry = create_entry(&server, "vm1", "/app", 600, &["app.example.org"]).await;
    let (delivered, serial) = entry_certificate(&server, &node, &entry).await;

    // Allowed: renewing within the entry — its TTL (10 min, not the 24 h asked for), its name.
    let (renewed, renewed_serial, life) =
        renew_over_mtls(&server, &delivered, 86400, &["app.example.org"])
            .await
            .expect("renewal within the entry");
    assert_eq!(life, 600 + 10, "the entry's TTL bounds the renewal");
    let p = provenance(&server, &renewed_serial).await;
    assert_eq!(p["source"]["kind"], "entry");
    assert_eq!(p["source"]["entry_id"], entry.as_str());
    assert_eq!(p["renewed_from"], serial.as_str());
    // The renewed certificate renews again while the entry stands.
    let (_again, _, _) = renew_over_mtls(&server, &renewed, 0, &[])
        .await
        .expect("a renewal of a renewal");
    // Refused: a name the entry does not carry.
    assert_denied(
        renew_over_mtls(&server, &delivered, 0, &["evil.example.org"]).await,
        "may not obtain DNS name evil.example.org",
    );

    // The operator deletes the entry: neither the delivered nor the renewed certificate
    // renews any more.
    node_admin(&server)
        .await
        .delete_entry(DeleteEntryRequest { id: entry.clone() })
        .await
        .unwrap();
    for holder in [&delivered, &renewed] {
        assert_denied(
            renew_over_mtls(&server, holder, 0, &[]).await,
            "no longer exists",
        );
    }

    // Another entry on the same node: fine until the node is banned, then refused.
    let entry2 = create_entry(&server, "vm1", "/app2", 0, &[]).await;
    let (delivered2, _) = entry_certificate(&server, &node, &entry2).await;
    let (_, _, life) = renew_over_mtls(&server, &delivered2, 0, &[]).await.unwrap();
    assert_eq!(life, 3600 + 10, "entry TTL 0 is the default");
    node_admin(&server)
        .await
        .ban_node(BanNodeRequest {
            node_id: "vm1".into(),
        })
        .await
        .unwrap();
    assert_denied(
        renew_over_mtls(&server, &delivered2, 0, &[]).await,
        "is banned",
    );
    // ... and the node itself can do nothing either.
    let err = NodeClient::new(server.channel_with(&node).await)
        .sync_entries(SyncEntriesRequest { known_revision: 0 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    // Every refusal is an audit event.
    let out = server.signetctl(&["audit", "list"]);
    let audit = String::from_utf8_lossy(&out.stdout);
    assert!(audit.contains("policy.renewal"), "{audit}");
}

#[tokio::test]
async fn a_token_certificate_renews_over_mtls_only_for_a_while() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "[policy]\nmtls_renewal_max_age = \"2s\"\n").await else {
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
    let r = server
        .native()
        .await
        .sign_csr(req)
        .await
        .unwrap()
        .into_inner();
    let issued = identity(&r.cert_chain, &kc.key_pem);
    let p = provenance(&server, &r.serial).await;
    assert_eq!(p["source"]["kind"], "service_account");
    assert_eq!(p["source"]["namespace"], "web");

    // Right away: renews, never longer than the presented certificate.
    let (renewed, renewed_serial, life) = renew_over_mtls(&server, &issued, 86400, &[])
        .await
        .expect("fresh token authorization");
    assert_eq!(life, 600 + 10);
    let p2 = provenance(&server, &renewed_serial).await;
    assert_eq!(
        p2["authorized_at"], p["authorized_at"],
        "the token check is carried forward, not refreshed"
    );

    // Past policy.mtls_renewal_max_age the whole chain stops renewing; the token still works.
    tokio::time::sleep(std::time::Duration::from_millis(3100)).await;
    for holder in [&issued, &renewed] {
        assert_denied(
            renew_over_mtls(&server, holder, 0, &[]).await,
            "policy.mtls_renewal_max_age",
        );
    }
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: kc.csr_der,
            ttl_seconds: 0,
            kubernetes_namespace: String::new(),
        },
        &tokens.token("web", "frontend"),
    )
    .unwrap();
    server
        .native()
        .await
        .sign_csr(req)
        .await
        .expect("token again");
}
