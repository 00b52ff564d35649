//! Whoever holds a service-account token signed by a key the cluster has retired (issue 24:
//! the JWKS was read only at start-up). Kubernetes rotates its signing keys; before, a server
//! kept trusting the removed key (and its memoised tokens) until restarted, and refused the
//! new key's tokens until then. Now the server re-reads `jwks_file` every `jwks_refresh`, and
//! at once when a token names a key it does not know: the new key's token is accepted, the
//! retired key's token (memoised while it was valid) is refused, without a restart.

use std::time::{Duration, Instant};

use signet_proto::ca::SignCsrRequest;
use signet_tests::{Server, ServerOpts, TokenIssuer, csr_with};
use tonic::Code;

async fn sign(server: &Server, token: &str) -> Result<(), tonic::Status> {
    let (csr, _key) = csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        SignCsrRequest {
            csr: csr.into_bytes(),
            ttl_seconds: 0,
            kubernetes_namespace: String::new(),
        },
        token,
    )
    .unwrap();
    server.native().await.sign_csr(req).await.map(|_| ())
}

/// A JWKS holding the keys of `issuers`.
fn jwks(issuers: &[&TokenIssuer]) -> String {
    let keys: Vec<serde_json::Value> = issuers
        .iter()
        .map(|i| {
            let doc: serde_json::Value = serde_json::from_str(&i.jwks_json()).unwrap();
            doc["keys"][0].clone()
        })
        .collect();
    serde_json::json!({ "keys": keys }).to_string()
}

/// Polls `sign` every 100 ms until it answers as `want` (Ok, or the refusal's code), for at
/// most 10 s; the last answer.
async fn until(server: &Server, token: &str, want: Result<(), Code>) -> Result<(), tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = sign(server, token).await;
        if got.as_ref().map(|_| ()).map_err(|s| s.code()) == want || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_rotated_jwks_is_read_again_and_the_retired_keys_tokens_are_refused() {
    let (old, new) = (TokenIssuer::new("old-key"), TokenIssuer::new("new-key"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks(&[&old])).unwrap();
    let server = Server::start(ServerOpts {
        extra_toml: format!(
            "[auth.kubernetes]\nissuer = \"{}\"\njwks_file = \"{}\"\njwks_refresh = \"1s\"\n",
            old.issuer,
            file.display()
        ),
        ..ServerOpts::default()
    })
    .await;
    let (old_token, new_token) = (old.token("shop", "cart"), new.token("shop", "cart"));
    // The old key's token is verified (and memoised); the new key is unknown.
    sign(&server, &old_token).await.unwrap();
    let e = sign(&server, &new_token).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // The cluster adds its new key: the new token is accepted without a restart.
    std::fs::write(&file, jwks(&[&old, &new])).unwrap();
    until(&server, &new_token, Ok(())).await.unwrap();
    sign(&server, &old_token).await.unwrap();

    // Then retires the old one: the old key's token, memoised, is refused within the
    // refresh interval, and says why; the new key's still works.
    std::fs::write(&file, jwks(&[&new])).unwrap();
    let e = until(&server, &old_token, Err(Code::Unauthenticated))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("not in the configured JWKS"), "{e:?}");
    sign(&server, &new_token).await.unwrap();

    // A broken file keeps the keys last read: no outage from a bad write.
    std::fs::write(&file, "{\"keys\": [").unwrap();
    // A real wait: the server re-reads the file only on a request at least `jwks_refresh`
    // (1 s) after its last read, on its own clock; a good read and a refused one answer the
    // same, so no answer says the broken file was read: wait out the interval.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    sign(&server, &new_token).await.unwrap();
    let e = sign(&server, &old_token).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}
