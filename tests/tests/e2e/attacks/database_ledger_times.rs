//! Someone with write access to the database rewrites a certificate's ledger row with extreme
//! validity times (found by the `renewal` fuzz target): `not_before` near `i64::MIN`,
//! `not_after` near `i64::MAX`, so that the presented lifetime overflows. Renewing that
//! certificate over mTLS used to panic the request (`not_after - not_before` overflowed);
//! now the lifetime saturates, policy still bounds the renewal by `ca.max_ttl`, the server
//! keeps serving, and `signetctl ledger verify` names the altered row.

use signet_proto::ca::{GetBundleRequest, SignCsrRequest};
use signet_tests::{Server, ServerOpts, TokenIssuer, csr_with};

use super::support::*;

#[tokio::test]
async fn extreme_times_in_a_ledger_row_neither_crash_nor_widen_a_renewal() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        ..ServerOpts::default()
    })
    .await;

    // A workload's own certificate, from its service-account token.
    let (csr, key) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: csr.into_bytes(),
            ttl_seconds: 600,
            kubernetes_namespace: String::new(),
        },
        &tokens.token("default", "web"),
    )
    .unwrap();
    let r = server
        .native()
        .await
        .sign_csr(req)
        .await
        .unwrap()
        .into_inner();
    let holder = identity(&r.cert_chain, &key.serialize_pem());

    // Legitimate: it renews over mTLS, within what it had.
    let (_, _, lifetime) = renew_over_mtls(&server, &holder, 0, &[]).await.unwrap();
    assert!(lifetime <= 600 + 120, "renewed for {lifetime}s");

    // The attack: its row now claims a lifetime that does not fit in an i64.
    psql(
        &url,
        &format!(
            "UPDATE certificates SET not_before = {}, not_after = {} WHERE serial = '{}'",
            i64::MIN + 1,
            i64::MAX - 1,
            r.serial
        ),
    );
    let (_, _, lifetime) = renew_over_mtls(&server, &holder, 0, &[])
        .await
        .expect("the server trusts its database, and does not crash on it");
    assert!(
        lifetime <= 24 * 3600 + 120,
        "a renewal beyond ca.max_ttl: {lifetime}s"
    );
    // Still serving, and the auditor sees the edit.
    server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .expect("the server still answers");
    let o = server.signetctl(&["ledger", "verify"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && out.contains("altered"), "{out}");
}
