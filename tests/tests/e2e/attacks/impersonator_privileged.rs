//! A compromised impersonator (a ztunnel-like node proxy allowed to use Istio's
//! `ImpersonatedIdentity`) reaching for identities other than ordinary workloads'. Issue 8,
//! finding 2.

use std::collections::BTreeMap;

use prost_types::{Struct, Value, value::Kind};
use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::{Server, TokenIssuer, csr_with, openssl_verify};

use super::support::*;
use crate::pg_server;

const ZTUNNEL: &str = "spiffe://example.org/ns/istio-system/sa/ztunnel";
const BRIDGE: &str = "spiffe://example.org/ns/signet-system/sa/signet-k8s";

fn on_behalf_of(target: &str) -> Struct {
    Struct {
        fields: BTreeMap::from([(
            "ImpersonatedIdentity".to_owned(),
            Value {
                kind: Some(Kind::StringValue(target.to_owned())),
            },
        )]),
    }
}

async fn impersonate(
    server: &Server,
    tokens: &TokenIssuer,
    target: &str,
) -> Result<(Vec<String>, rcgen::KeyPair), tonic::Status> {
    let (csr, key) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: Some(on_behalf_of(target)),
        },
        &tokens.token("istio-system", "ztunnel"),
    )
    .unwrap();
    let chain = server
        .istio()
        .await
        .create_certificate(req)
        .await?
        .into_inner()
        .cert_chain;
    Ok((chain, key))
}

#[tokio::test]
async fn an_impersonator_gets_ordinary_workloads_only() {
    let tokens = TokenIssuer::new("k1");
    let cfg = format!(
        "[policy]\nimpersonators = [\"{ZTUNNEL}\"]\n[policy.kubernetes_bridge]\ncallers = [\"{BRIDGE}\"]\n"
    );
    let Some(server) = pg_server(&tokens, &cfg).await else {
        return;
    };
    // A real node exists, so its identity would be worth having.
    let _node = attest_node(&server, "n1").await;
    let before = server.cert_count().await;
    for target in [
        "spiffe://example.org/signet/node/n1",
        "spiffe://example.org/signet/server",
        "spiffe://example.org/signet/admin",
        BRIDGE,
        ZTUNNEL,
        "spiffe://example.org/web",
        "spiffe://example.org/ns/default/sa/web/extra",
    ] {
        let e = impersonate(&server, &tokens, target)
            .await
            .expect_err(target);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{target}: {e:?}");
        assert!(
            e.message().contains("on behalf of another identity"),
            "{target}: {}",
            e.message()
        );
    }
    assert_eq!(server.cert_count().await, before, "nothing was issued");

    // What impersonation is for still works: an ordinary workload, verified by openssl.
    let (chain, key) = impersonate(&server, &tokens, "spiffe://example.org/ns/default/sa/web")
        .await
        .expect("ordinary workload");
    openssl_verify(&chain, &server.bundle_pem).unwrap();
    assert_eq!(
        signet_tests::uri_sans(&chain[0]),
        ["spiffe://example.org/ns/default/sa/web"]
    );
    let serial = signet_tests::serial_of(&chain[0]);
    let p = provenance(&server, &serial).await;
    assert_eq!(p["source"]["kind"], "impersonated");
    assert_eq!(p["source"]["impersonator"], ZTUNNEL);
    // The workload cannot stretch that certificate by renewing it over mTLS itself.
    let ders: Vec<Vec<u8>> = chain
        .iter()
        .map(|p| {
            signet_types::pem::parse_certs(p.as_bytes())
                .unwrap()
                .remove(0)
        })
        .collect();
    let holder = identity(&ders, &key.serialize_pem());
    assert_denied(
        renew_over_mtls(&server, &holder, 0, &[]).await,
        "on this workload's behalf",
    );
}
