//! Someone with write access to the database (but not the key-encryption key or the host) edits
//! the ledger: rewrites a certificate's provenance so that a certificate that may not renew
//! over mTLS (obtained through an impersonator) becomes renewable, blanks a provenance to pass
//! a row off as an old one, or deletes the row of a certificate to hide it. The server trusts
//! its database for decisions, so the defence is detection: every provenance is covered by the
//! row's hash, and `signetctl ledger verify` (run by an auditor) names the altered row; a
//! certificate whose row is gone can no longer renew at all.

use std::collections::BTreeMap;

use prost_types::{Struct, Value, value::Kind};
use signet_proto::istio_ca::IstioCertificateRequest;
use signet_tests::{Server, ServerOpts, TokenIssuer, csr_with};

use super::support::*;

const ZTUNNEL: &str = "spiffe://example.org/ns/istio-system/sa/ztunnel";

fn verify(server: &Server) -> (bool, String) {
    let o = server.signetctl(&["ledger", "verify"]);
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

async fn impersonated(
    server: &Server,
    tokens: &TokenIssuer,
) -> (signet_client::ClientIdentity, String) {
    let (csr, key) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        IstioCertificateRequest {
            csr,
            validity_duration: 600,
            metadata: Some(Struct {
                fields: BTreeMap::from([(
                    "ImpersonatedIdentity".to_owned(),
                    Value {
                        kind: Some(Kind::StringValue(
                            "spiffe://example.org/ns/default/sa/web".into(),
                        )),
                    },
                )]),
            }),
        },
        &tokens.token("istio-system", "ztunnel"),
    )
    .unwrap();
    let chain = server
        .istio()
        .await
        .create_certificate(req)
        .await
        .unwrap()
        .into_inner()
        .cert_chain;
    let ders: Vec<Vec<u8>> = chain
        .iter()
        .map(|p| {
            signet_types::pem::parse_certs(p.as_bytes())
                .unwrap()
                .remove(0)
        })
        .collect();
    (
        identity(&ders, &key.serialize_pem()),
        signet_tests::serial_of(&chain[0]),
    )
}

#[tokio::test]
async fn ledger_edits_are_detected_and_a_deleted_row_renews_nothing() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: format!("[policy]\nimpersonators = [\"{ZTUNNEL}\"]\n"),
        ..ServerOpts::default()
    })
    .await;
    let (holder, serial) = impersonated(&server, &tokens).await;
    assert_denied(
        renew_over_mtls(&server, &holder, 0, &[]).await,
        "on this workload's behalf",
    );
    let (ok, out) = verify(&server);
    assert!(ok, "{out}");

    // Rewrite the provenance to "the operator minted it just now".
    let forged = format!(
        r#"{{"source":{{"kind":"admin"}},"authorized_at":{}}}"#,
        signet_tests::now_unix()
    );
    psql(
        &url,
        &format!("UPDATE certificates SET provenance = '{forged}' WHERE serial = '{serial}'"),
    );
    // The server believes its database (once its one-second cache of presented certificates'
    // rows has moved on)...
    let mut renewed = renew_over_mtls(&server, &holder, 0, &[]).await;
    for _ in 0..30 {
        if renewed.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        renewed = renew_over_mtls(&server, &holder, 0, &[]).await;
    }
    renewed.expect("a forged provenance is trusted by the server");
    // ... and the auditor's verification names the altered row.
    let (ok, out) = verify(&server);
    assert!(!ok, "the forged row verified: {out}");
    assert!(out.contains("altered"), "{out}");

    // Blanking it (passing the row off as written before provenance existed) is caught too.
    psql(
        &url,
        &format!("UPDATE certificates SET provenance = '' WHERE serial = '{serial}'"),
    );
    let (ok, out) = verify(&server);
    assert!(!ok && out.contains("altered"), "{out}");

    // Deleting the row: the certificate can no longer renew, and the gap shows.
    psql(
        &url,
        &format!("DELETE FROM certificates WHERE serial = '{serial}'"),
    );
    let mut r = renew_over_mtls(&server, &holder, 0, &[]).await;
    for _ in 0..30 {
        if r.is_err() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        r = renew_over_mtls(&server, &holder, 0, &[]).await;
    }
    assert_denied(r, "not in this CA's ledger");
    let (ok, out) = verify(&server);
    assert!(!ok, "{out}");
}
