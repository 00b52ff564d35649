//! OpenID Connect discovery for JWT-SVIDs: with `[jwt_svid] issuer` set, relying parties that
//! speak OIDC (AWS IAM OIDC providers, GCP workload identity federation, Vault's JWT auth) find
//! the JWT-SVID signing keys the way they find any OIDC provider's.
//!
//! - `GET <issuer path>/.well-known/openid-configuration`:
//!   `{"issuer": <exactly the configured issuer>, "jwks_uri": "<issuer>/keys",
//!   "response_types_supported": ["id_token"], "subject_types_supported": ["public"],
//!   "id_token_signing_alg_values_supported": [<the algorithms of the published keys>]}`;
//! - `GET <issuer path>/keys`: `{"keys": [...]}`, every published JWT key (prepared, active,
//!   retired: a validator knows a key before it signs) as a JWK with `kid`, `alg` and
//!   `use: "sig"`.
//!
//! The issuer's path is the URL path of `issuer` (`https://example.org/signet` → `/signet`), so
//! the documents are where an OIDC client looks for them. Nothing is derived from the request
//! (no Host header, no forwarded headers): the issuer is the configured one, byte for byte. Both
//! answers carry `Cache-Control: public, max-age=<n>` with `n` shorter than half the key
//! propagation window, so a cached JWKS always has a key before it signs.
//!
//! Served on `http_listen` (plain HTTP, for an ingress that terminates TLS) and, with
//! `[jwt_svid] oidc_listen`, on a TLS listener of its own with the configured certificate
//! (`oidc_tls_cert_file`, `oidc_tls_key_file`), bounded like the bundle endpoint
//! ([`crate::federation::serve_tls`]: `limits.http_*`, `limits.tls_handshake_timeout`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::{Value, json};

use crate::bundle::{Bundle, BundleHandle};
use crate::ca::jwt_config::{JwtKeyType, JwtSvidConfig};

/// The discovery document's path below the issuer's path.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// The JWKS's path below the issuer's path.
pub const JWKS_PATH: &str = "/keys";

/// What the discovery routes serve.
#[derive(Debug, Clone)]
pub struct Discovery {
    issuer: String,
    /// The issuer's URL path, without a trailing slash (`""` for a bare host).
    path: String,
    /// The algorithm new keys sign with (listed even before such a key is published).
    configured_alg: &'static str,
    bundle: BundleHandle,
    max_age: Duration,
}

impl Discovery {
    /// The discovery routes' state, when `[jwt_svid] issuer` is set. `max_age` is
    /// [`crate::config::Config::published_refresh`]; capped here too at half of
    /// `key_propagation`.
    pub fn from_config(
        jwt: &JwtSvidConfig,
        bundle: BundleHandle,
        max_age: Duration,
    ) -> Option<Arc<Self>> {
        let issuer = jwt.issuer.clone()?;
        let path = jwt.issuer_path()?;
        let max_age = max_age
            .min(jwt.key_propagation / 2)
            .max(Duration::from_secs(1));
        Some(Arc::new(Self {
            issuer,
            path,
            configured_alg: match jwt.key_type {
                JwtKeyType::Es256 => "ES256",
                JwtKeyType::Rs256 => "RS256",
            },
            bundle,
            max_age,
        }))
    }

    /// The discovery document for `bundle`.
    pub fn document(&self, bundle: &Bundle) -> Value {
        let mut algs: BTreeSet<&str> = bundle
            .jwt_keys
            .iter()
            .filter_map(|k| k.key.alg().map(|a| a.as_str()))
            .collect();
        algs.insert(self.configured_alg);
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}{JWKS_PATH}", self.issuer),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": algs.into_iter().collect::<Vec<_>>(),
        })
    }

    /// The JWKS for `bundle`: every published JWT key with `kid`, `alg` and `use: sig`. A key
    /// that cannot be written as a JWK is left out (and logged): validators then refuse only
    /// its tokens.
    pub fn jwks(&self, bundle: &Bundle) -> Value {
        let keys: Vec<Value> = bundle
            .jwt_keys
            .iter()
            .filter_map(|k| match k.key.jwk("sig") {
                Ok(jwk) => Some(Value::Object(jwk)),
                Err(e) => {
                    tracing::error!(kid = k.key.key_id(), error = %e, "a JWT key cannot be published as a JWK");
                    None
                }
            })
            .collect();
        json!({ "keys": keys })
    }

    fn cache_control(&self) -> String {
        format!("public, max-age={}", self.max_age.as_secs())
    }
}

/// `GET <issuer path>/.well-known/openid-configuration` and `GET <issuer path>/keys`.
pub fn routes(discovery: Arc<Discovery>) -> Router {
    Router::new()
        .route(
            &format!("{}{DISCOVERY_PATH}", discovery.path),
            get(serve_discovery),
        )
        .route(&format!("{}{JWKS_PATH}", discovery.path), get(serve_jwks))
        .with_state(discovery)
}

fn json_response(d: &Discovery, body: &Value) -> impl IntoResponse + use<> {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::CACHE_CONTROL, d.cache_control()),
        ],
        body.to_string(),
    )
}

async fn serve_discovery(State(d): State<Arc<Discovery>>) -> impl IntoResponse {
    json_response(&d, &d.document(&d.bundle.current()))
}

async fn serve_jwks(State(d): State<Arc<Discovery>>) -> impl IntoResponse {
    json_response(&d, &d.jwks(&d.bundle.current()))
}

/// The OIDC TLS listener's names in logs and refusal counters.
pub const TLS_LISTENER: crate::federation::TlsListenerNames = crate::federation::TlsListenerNames {
    setting: "jwt_svid.oidc_listen",
    listener_full: "oidc_connections",
    source_full: "oidc_connections_per_source",
};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::bundle::PublishedJwtKey;
    use signet_types::TrustDomain;
    use tower::ServiceExt;

    fn key(alg: signet_pki::KeyAlgorithm) -> PublishedJwtKey {
        let k = signet_pki::key::generate(alg).unwrap();
        let signer = signet_pki::jwt::JwtSigner::new(&k).unwrap();
        PublishedJwtKey {
            key: signer.public_key().clone(),
            not_after: std::time::UNIX_EPOCH + Duration::from_secs(1_900_000_000),
        }
    }

    fn handle(dir: &tempfile::TempDir, keys: Vec<PublishedJwtKey>) -> BundleHandle {
        BundleHandle::new(
            Bundle {
                trust_domain: TrustDomain::new("example.org").unwrap(),
                roots: Vec::new(),
                tainted_key_ids: Vec::new(),
                jwt_keys: keys,
                revision: 1,
                crls: Vec::new(),
            },
            dir.path().join("bundle.pem"),
        )
        .unwrap()
    }

    fn config(issuer: &str) -> JwtSvidConfig {
        JwtSvidConfig {
            issuer: Some(issuer.into()),
            ..Default::default()
        }
    }

    async fn get(router: &Router, path: &str, host: &str) -> (StatusCode, Option<String>, Value) {
        let resp = router
            .clone()
            .oneshot(
                axum::http::Request::get(path)
                    .header(header::HOST, host)
                    .header("x-forwarded-host", host)
                    .header("x-forwarded-proto", "http")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = resp.status();
        let cache = resp
            .headers()
            .get(header::CACHE_CONTROL)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
        (status, cache, json)
    }

    #[test]
    fn no_issuer_no_discovery() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            Discovery::from_config(
                &JwtSvidConfig::default(),
                handle(&dir, Vec::new()),
                Duration::from_secs(300)
            )
            .is_none()
        );
    }

    #[tokio::test]
    async fn discovery_and_jwks_carry_the_configured_issuer_whatever_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let es = key(signet_pki::KeyAlgorithm::EcdsaP256);
        let issuer = "https://oidc.example.org";
        let d = Discovery::from_config(
            &config(issuer),
            handle(&dir, vec![es.clone()]),
            Duration::from_secs(3600),
        )
        .unwrap();
        let router = routes(d);
        let (status, cache, doc) = get(
            &router,
            "/.well-known/openid-configuration",
            "evil.example.com",
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        // Capped below half the propagation window (10 min).
        assert_eq!(cache.as_deref(), Some("public, max-age=300"));
        assert_eq!(
            doc,
            json!({
                "issuer": issuer,
                "jwks_uri": "https://oidc.example.org/keys",
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["ES256"],
            })
        );
        let (status, cache, jwks) = get(&router, "/keys", "evil.example.com").await;
        assert_eq!(status, StatusCode::OK);
        assert!(cache.is_some());
        let keys = jwks["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0]["kid"], es.key.key_id());
        assert_eq!(keys[0]["alg"], "ES256");
        assert_eq!(keys[0]["use"], "sig");
        assert_eq!(keys[0]["kty"], "EC");
        assert_eq!(keys[0]["crv"], "P-256");
        // Nothing else is served.
        assert_eq!(
            get(&router, "/signet/keys", "x").await.0,
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn an_issuer_with_a_path_serves_under_it_and_lists_every_algorithm() {
        let dir = tempfile::tempdir().unwrap();
        let es = key(signet_pki::KeyAlgorithm::EcdsaP256);
        let rs = key(signet_pki::KeyAlgorithm::Rsa(2048));
        let issuer = "https://example.org/signet";
        let d = Discovery::from_config(
            &config(issuer),
            handle(&dir, vec![es, rs.clone()]),
            Duration::from_secs(60),
        )
        .unwrap();
        let router = routes(d);
        let (status, cache, doc) =
            get(&router, "/signet/.well-known/openid-configuration", "h").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(cache.as_deref(), Some("public, max-age=60"));
        assert_eq!(doc["issuer"], issuer);
        assert_eq!(doc["jwks_uri"], "https://example.org/signet/keys");
        assert_eq!(
            doc["id_token_signing_alg_values_supported"],
            json!(["ES256", "RS256"])
        );
        let (_, _, jwks) = get(&router, "/signet/keys", "h").await;
        let keys = jwks["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[1]["kid"], rs.key.key_id());
        assert_eq!(keys[1]["alg"], "RS256");
        assert_eq!(keys[1]["kty"], "RSA");
        assert_eq!(keys[1]["use"], "sig");
        // Not at the root.
        assert_eq!(
            get(&router, "/.well-known/openid-configuration", "h")
                .await
                .0,
            StatusCode::NOT_FOUND
        );
    }
}
