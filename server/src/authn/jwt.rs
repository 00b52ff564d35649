//! Kubernetes projected service-account tokens, validated offline against the issuer's JWKS.
//!
//! The checks, in order: size cap; compact JWS shape; header `alg` (asymmetric only: `none` and
//! HMAC are refused, so a public key can never be used as an HMAC secret); key chosen by `kid`
//! (or, without a `kid`, every JWKS key compatible with `alg`); signature; legacy Secret-based
//! tokens refused; `iss`; `exp` (required), `nbf`, `iat` against the injected `now` with the
//! configured leeway; `aud`; `sub` and the `kubernetes.io` claim object.
//!
//! Error messages say what is wrong and what to do, and never contain the token.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use signet_types::TrustDomain;

use super::{AuthenticatedCaller, AuthnError, CallerKind};
use crate::config::KubernetesAuthConfig;

/// Longest token accepted, in bytes. Real projected tokens are 1–2 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The issuer of legacy Secret-based service-account tokens.
const LEGACY_ISSUER: &str = "kubernetes/serviceaccount";

const SUB_PREFIX: &str = "system:serviceaccount:";

const SUPPORTED_ALGS: &str = "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384";

/// Why the Kubernetes token authenticator could not be built from configuration. Messages
/// name the `[auth.kubernetes]` setting (without that prefix, which the caller adds).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtConfigError {
    #[error("{0}")]
    Config(String),
    #[error("jwks_file: {0}")]
    Jwks(String),
}

/// The kind of public key a JWKS entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    EcP256,
    EcP384,
}

impl KeyKind {
    fn supports(self, alg: Algorithm) -> bool {
        match self {
            KeyKind::Rsa => matches!(
                alg,
                Algorithm::RS256
                    | Algorithm::RS384
                    | Algorithm::RS512
                    | Algorithm::PS256
                    | Algorithm::PS384
                    | Algorithm::PS512
            ),
            KeyKind::EcP256 => alg == Algorithm::ES256,
            KeyKind::EcP384 => alg == Algorithm::ES384,
        }
    }
}

struct VerifyKey {
    kid: Option<String>,
    kind: KeyKind,
    /// The JWK's own `alg`, when it names one: then only that algorithm is accepted.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

impl VerifyKey {
    fn accepts(&self, alg: Algorithm) -> bool {
        self.kind.supports(alg) && self.alg.is_none_or(|a| a == alg)
    }
}

/// Validates Kubernetes projected service-account tokens offline.
pub struct JwtAuthenticator {
    issuer: String,
    audiences: Vec<String>,
    leeway_secs: i64,
    keys: Vec<VerifyKey>,
    td: TrustDomain,
}

impl fmt::Debug for JwtAuthenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtAuthenticator")
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .field("leeway_secs", &self.leeway_secs)
            .field(
                "kids",
                &self
                    .keys
                    .iter()
                    .map(|k| k.kid.as_deref())
                    .collect::<Vec<_>>(),
            )
            .field("trust_domain", &self.td)
            .finish()
    }
}

impl JwtAuthenticator {
    /// Builds the authenticator from `[auth.kubernetes]` and the JWKS document (the caller reads
    /// `cfg.jwks_file`). Refuses symmetric or unsupported keys by name.
    pub fn new(
        cfg: &KubernetesAuthConfig,
        jwks_json: &str,
        td: TrustDomain,
    ) -> Result<Self, JwtConfigError> {
        if cfg.issuer.trim().is_empty() {
            return Err(JwtConfigError::Config("issuer is empty".into()));
        }
        if cfg.issuer == LEGACY_ISSUER {
            return Err(JwtConfigError::Config(format!(
                "issuer {LEGACY_ISSUER:?} is the issuer of legacy Secret-based tokens, which are \
                 refused; set the cluster's service-account issuer URL (kube-apiserver \
                 --service-account-issuer)"
            )));
        }
        if cfg.audiences.is_empty() || cfg.audiences.iter().any(|a| a.is_empty()) {
            return Err(JwtConfigError::Config(
                "audiences must list at least one non-empty audience (e.g. \"istio-ca\")".into(),
            ));
        }
        let leeway_secs = i64::try_from(cfg.leeway.as_secs())
            .ok()
            .filter(|s| *s <= 3600)
            .ok_or_else(|| {
                JwtConfigError::Config(format!(
                    "leeway {} is longer than one hour",
                    humantime::format_duration(cfg.leeway)
                ))
            })?;
        let keys = parse_jwks(jwks_json)?;
        Ok(Self {
            issuer: cfg.issuer.clone(),
            audiences: cfg.audiences.clone(),
            leeway_secs,
            keys,
            td,
        })
    }

    /// Validates `token` at time `now` and returns the service account it names, as
    /// `spiffe://<td>/ns/<namespace>/sa/<name>`.
    pub fn authenticate(
        &self,
        token: &str,
        now: SystemTime,
    ) -> Result<AuthenticatedCaller, AuthnError> {
        self.verify(token, now, &self.audiences).map(|t| t.caller)
    }

    /// Validates a node agent's token: the same checks as [`Self::authenticate`], but against
    /// `audiences` (the node audiences, kept apart from the workload ones), and returns the
    /// node the token is bound to as well.
    pub fn authenticate_node_token(
        &self,
        token: &str,
        now: SystemTime,
        audiences: &[String],
    ) -> Result<VerifiedToken, AuthnError> {
        self.verify(token, now, audiences)
    }

    fn verify(
        &self,
        token: &str,
        now: SystemTime,
        audiences: &[String],
    ) -> Result<VerifiedToken, AuthnError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(bad(format!(
                "token is {} bytes, more than the {MAX_TOKEN_BYTES}-byte limit",
                token.len()
            )));
        }
        if token.is_empty() {
            return Err(bad("token is empty"));
        }
        let parts: Vec<&str> = token.split('.').collect();
        let (header_b64, payload_b64, sig_b64) = match parts.as_slice() {
            [h, p, s] => (*h, *p, *s),
            [_, _, _, _, _] => {
                return Err(bad(
                    "encrypted tokens (JWE) are not accepted; send the service-account token (a signed JWT)",
                ));
            }
            _ => {
                return Err(bad(format!(
                    "not a JWT: expected 3 dot-separated parts, found {}",
                    parts.len()
                )));
            }
        };

        let header: RawHeader = decode_part(header_b64, "header")?;
        let alg = check_alg(header.alg.as_deref())?;
        if let Some(crit) = &header.crit {
            return Err(bad(format!(
                "token header marks {} extension(s) critical (\"crit\"); none are supported",
                crit.len()
            )));
        }
        self.verify_signature(header.kid.as_deref(), alg, header_b64, payload_b64, sig_b64)?;

        let claims: Claims = decode_part(payload_b64, "payload")?;
        self.check_claims(&claims, now, audiences)
    }

    fn verify_signature(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
        header_b64: &str,
        payload_b64: &str,
        sig_b64: &str,
    ) -> Result<(), AuthnError> {
        if sig_b64.is_empty() {
            return Err(bad("token has no signature"));
        }
        let message_len = header_b64.len() + 1 + payload_b64.len();
        let message = token_message(header_b64, payload_b64, message_len);
        let alg_name = self::alg_name(alg);
        let candidates: Vec<&VerifyKey> = match kid {
            Some(kid) => {
                let Some(key) = self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)) else {
                    return Err(bad(format!(
                        "signed by a key that is not in the configured JWKS (kid {}); refresh \
                         auth.kubernetes.jwks_file from the issuer's jwks_uri",
                        quoted(kid)
                    )));
                };
                if !key.accepts(alg) {
                    return Err(bad(format!(
                        "header alg {alg_name} does not match JWKS key {} ({:?} key{})",
                        quoted(kid),
                        key.kind,
                        key.alg
                            .map(|a| format!(" for {}", self::alg_name(a)))
                            .unwrap_or_default()
                    )));
                }
                vec![key]
            }
            None => {
                let c: Vec<&VerifyKey> = self.keys.iter().filter(|k| k.accepts(alg)).collect();
                if c.is_empty() {
                    return Err(bad(format!(
                        "signed by a key that is not in the configured JWKS (no kid, and no \
                         configured key supports {alg_name})"
                    )));
                }
                c
            }
        };
        for key in &candidates {
            // `alg` is asymmetric (checked above) and `key` matches it, so this is a public-key
            // verification; the library's HMAC path is never reached.
            if let Ok(true) = jsonwebtoken::crypto::verify(sig_b64, &message, &key.key, alg) {
                return Ok(());
            }
        }
        Err(bad(match kid {
            Some(kid) => format!(
                "signature does not verify with JWKS key {} ({alg_name}); the token was altered \
                 or signed by another key",
                quoted(kid)
            ),
            None => format!(
                "signed by a key that is not in the configured JWKS (no kid; the signature \
                 verifies with none of the {} {alg_name} key(s))",
                candidates.len()
            ),
        }))
    }

    /// The claim checks alone, on a payload's JSON: what a token whose signature verified may
    /// carry. For `crate::fuzzing`, which cannot sign its mutations.
    pub(crate) fn verify_claims_json(
        &self,
        json: &[u8],
        now: SystemTime,
        audiences: &[String],
    ) -> Result<VerifiedToken, AuthnError> {
        let claims: Claims = serde_json::from_slice(json)
            .map_err(|_| bad("token payload is not the expected JSON object"))?;
        self.check_claims(&claims, now, audiences)
    }

    fn check_claims(
        &self,
        claims: &Claims,
        now: SystemTime,
        accepted: &[String],
    ) -> Result<VerifiedToken, AuthnError> {
        // Legacy Secret-based tokens: never expire, must not be accepted.
        if claims.iss.as_deref() == Some(LEGACY_ISSUER) || claims.legacy_namespace.is_some() {
            return Err(bad(
                "legacy Secret-based service-account token (issuer \"kubernetes/serviceaccount\", \
                 no expiry) refused; mount a projected token (serviceAccountToken volume) or use \
                 the TokenRequest API",
            ));
        }
        let Some(exp) = claims.exp.as_ref() else {
            return Err(bad(
                "token has no exp: legacy Secret-based or non-expiring tokens are refused; use a \
                 projected service-account token",
            ));
        };
        let exp = numeric_date(exp, "exp")?;

        match claims.iss.as_deref() {
            Some(iss) if iss == self.issuer => {}
            Some(iss) => {
                return Err(bad(format!(
                    "issuer {} is not the configured issuer {}",
                    quoted(iss),
                    quoted(&self.issuer)
                )));
            }
            None => {
                return Err(bad(format!(
                    "token has no iss; expected {}",
                    quoted(&self.issuer)
                )));
            }
        }

        let now_secs = unix_secs(now);
        if now_secs > exp.saturating_add(self.leeway_secs) {
            return Err(bad(format!(
                "token expired at {} (now {}); request a fresh token",
                rfc3339(exp),
                rfc3339(now_secs)
            )));
        }
        if let Some(nbf) = claims.nbf.as_ref() {
            let nbf = numeric_date(nbf, "nbf")?;
            if nbf > now_secs.saturating_add(self.leeway_secs) {
                return Err(bad(format!(
                    "token is not valid before {} (now {}); check the clocks",
                    rfc3339(nbf),
                    rfc3339(now_secs)
                )));
            }
        }
        if let Some(iat) = claims.iat.as_ref() {
            let iat = numeric_date(iat, "iat")?;
            if iat > now_secs.saturating_add(self.leeway_secs) {
                return Err(bad(format!(
                    "token was issued in the future, at {} (now {}); check the clocks",
                    rfc3339(iat),
                    rfc3339(now_secs)
                )));
            }
        }

        let auds = audiences(claims.aud.as_ref())?;
        if !auds.iter().any(|a| accepted.iter().any(|c| c == a)) {
            return Err(bad(format!(
                "audience [{}] is not one of [{}]; request the token with one of those audiences",
                auds.iter()
                    .map(|a| truncate(a))
                    .collect::<Vec<_>>()
                    .join(", "),
                accepted.join(", ")
            )));
        }

        let Some(sub) = claims.sub.as_deref() else {
            return Err(bad(
                "token has no sub; expected system:serviceaccount:<namespace>:<name>",
            ));
        };
        let (namespace, service_account) = sub
            .strip_prefix(SUB_PREFIX)
            .and_then(|rest| rest.split_once(':'))
            .filter(|(_, name)| !name.contains(':'))
            .ok_or_else(|| {
                bad(format!(
                    "sub {} is not a service account (system:serviceaccount:<namespace>:<name>)",
                    quoted(sub)
                ))
            })?;
        check_segment(namespace, "namespace")?;
        check_segment(service_account, "service account name")?;

        let mut pod = None;
        let mut node = None;
        if let Some(k8s) = &claims.kubernetes {
            if let Some(ns) = k8s.namespace.as_deref()
                && ns != namespace
            {
                return Err(bad(format!(
                    "sub names namespace {} but the kubernetes.io claim says {}",
                    quoted(namespace),
                    quoted(ns)
                )));
            }
            if let Some(name) = k8s.serviceaccount.as_ref().and_then(|s| s.name.as_deref())
                && name != service_account
            {
                return Err(bad(format!(
                    "sub names service account {} but the kubernetes.io claim says {}",
                    quoted(service_account),
                    quoted(name)
                )));
            }
            pod = k8s.pod.as_ref().and_then(|p| p.name.clone());
            node = k8s.node.as_ref().and_then(|n| n.name.clone());
        }

        let id = self
            .td
            .id(&format!("/ns/{namespace}/sa/{service_account}"))
            .map_err(|e| bad(format!("service account does not make a SPIFFE ID: {e}")))?;
        Ok(VerifiedToken {
            caller: AuthenticatedCaller::new(
                id,
                CallerKind::KubernetesServiceAccount {
                    namespace: namespace.to_owned(),
                    service_account: service_account.to_owned(),
                    pod,
                    node: node.clone(),
                },
            ),
            node_name: node,
        })
    }
}

/// A token that passed every check: the service account it names and, for a bound token, the
/// node its pod runs on (`kubernetes.io.node.name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    pub caller: AuthenticatedCaller,
    pub node_name: Option<String>,
}

/// Extracts the token from an `authorization` header value: `Bearer <token>`, the scheme
/// case-insensitive. Anything else is [`AuthnError::MalformedHeader`].
pub fn bearer_token(header: &str) -> Result<&str, AuthnError> {
    let header = header.trim();
    let (scheme, rest) = header
        .split_once([' ', '\t'])
        .ok_or_else(|| malformed("expected 'Bearer <token>'"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(malformed(
            "only the Bearer scheme is accepted ('Bearer <token>')",
        ));
    }
    let token = rest.trim();
    if token.is_empty() {
        return Err(malformed("the Bearer token is empty"));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(malformed("the Bearer token contains whitespace"));
    }
    Ok(token)
}

// ---- helpers ----------------------------------------------------------------------------

fn bad(reason: impl Into<String>) -> AuthnError {
    AuthnError::BadToken(reason.into())
}

fn malformed(reason: &str) -> AuthnError {
    AuthnError::MalformedHeader(reason.into())
}

/// Untrusted text echoed in a message: quoted, escaped, and cut short.
fn quoted(s: &str) -> String {
    format!("{:?}", truncate(s))
}

fn truncate(s: &str) -> String {
    const MAX: usize = 96;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push('…');
        out
    }
}

fn token_message(header_b64: &str, payload_b64: &str, len: usize) -> Vec<u8> {
    let mut message = Vec::with_capacity(len);
    message.extend_from_slice(header_b64.as_bytes());
    message.push(b'.');
    message.extend_from_slice(payload_b64.as_bytes());
    message
}

fn decode_part<T: serde::de::DeserializeOwned>(part: &str, what: &str) -> Result<T, AuthnError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| bad(format!("token {what} is not base64url")))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        // serde_json's message names the expected type and position; cut it short, since it
        // may quote a (claim) value.
        bad(format!(
            "token {what} is not the expected JSON object: {}",
            truncate(&e.to_string())
        ))
    })
}

#[derive(Deserialize)]
struct RawHeader {
    alg: Option<String>,
    kid: Option<String>,
    crit: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct Claims {
    iss: Option<String>,
    sub: Option<String>,
    aud: Option<serde_json::Value>,
    exp: Option<serde_json::Value>,
    nbf: Option<serde_json::Value>,
    iat: Option<serde_json::Value>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
    #[serde(rename = "kubernetes.io/serviceaccount/namespace")]
    legacy_namespace: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct KubernetesClaims {
    namespace: Option<String>,
    serviceaccount: Option<ObjectRef>,
    pod: Option<ObjectRef>,
    node: Option<ObjectRef>,
}

#[derive(Deserialize)]
struct ObjectRef {
    name: Option<String>,
}

fn check_alg(alg: Option<&str>) -> Result<Algorithm, AuthnError> {
    let Some(alg) = alg else {
        return Err(bad("token header has no alg"));
    };
    match alg {
        "RS256" => Ok(Algorithm::RS256),
        "RS384" => Ok(Algorithm::RS384),
        "RS512" => Ok(Algorithm::RS512),
        "PS256" => Ok(Algorithm::PS256),
        "PS384" => Ok(Algorithm::PS384),
        "PS512" => Ok(Algorithm::PS512),
        "ES256" => Ok(Algorithm::ES256),
        "ES384" => Ok(Algorithm::ES384),
        a if a.eq_ignore_ascii_case("none") => Err(bad(format!(
            "alg \"none\" (an unsigned token) is refused; service-account tokens are signed \
             ({SUPPORTED_ALGS})"
        ))),
        a if a.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("HS")) => Err(bad(format!(
            "alg {} is a shared-secret (HMAC) algorithm and is refused; service-account tokens \
             are signed with the issuer's private key ({SUPPORTED_ALGS})",
            quoted(a)
        ))),
        a => Err(bad(format!(
            "alg {} is not supported; expected one of {SUPPORTED_ALGS}",
            quoted(a)
        ))),
    }
}

fn alg_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::HS256 => "HS256",
        Algorithm::HS384 => "HS384",
        Algorithm::HS512 => "HS512",
        Algorithm::ES256 => "ES256",
        Algorithm::ES384 => "ES384",
        Algorithm::RS256 => "RS256",
        Algorithm::RS384 => "RS384",
        Algorithm::RS512 => "RS512",
        Algorithm::PS256 => "PS256",
        Algorithm::PS384 => "PS384",
        Algorithm::PS512 => "PS512",
        Algorithm::EdDSA => "EdDSA",
    }
}

/// A JWT NumericDate: seconds since the epoch, possibly fractional.
fn numeric_date(v: &serde_json::Value, name: &str) -> Result<i64, AuthnError> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    match v.as_f64() {
        Some(f) if f.is_finite() && f.abs() < 1e15 => Ok(f.floor() as i64),
        _ => Err(bad(format!(
            "claim {name} is not a NumericDate (seconds since 1970)"
        ))),
    }
}

fn audiences(aud: Option<&serde_json::Value>) -> Result<Vec<String>, AuthnError> {
    let none = || bad("token has no aud (audience); request it with an audience such as istio-ca");
    match aud {
        None | Some(serde_json::Value::Null) => Err(none()),
        Some(serde_json::Value::String(s)) => Ok(vec![s.clone()]),
        Some(serde_json::Value::Array(items)) => {
            let out = items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| bad("aud contains a value that is not a string"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if out.is_empty() {
                return Err(none());
            }
            Ok(out)
        }
        Some(_) => Err(bad("aud is neither a string nor an array of strings")),
    }
}

/// A namespace or service-account name must be usable as a SPIFFE path segment.
fn check_segment(seg: &str, what: &str) -> Result<(), AuthnError> {
    let ok = !seg.is_empty()
        && seg != "."
        && seg != ".."
        && seg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "{what} {} is not a valid SPIFFE path segment (letters, digits, '.', '-', '_')",
            quoted(seg)
        )))
    }
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn rfc3339(secs: i64) -> String {
    match u64::try_from(secs) {
        Ok(s) if s < 253_402_300_800 => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(s)).to_string()
        }
        _ => format!("{secs} (seconds since 1970)"),
    }
}

fn parse_jwks(jwks_json: &str) -> Result<Vec<VerifyKey>, JwtConfigError> {
    let err = |m: String| JwtConfigError::Jwks(m);
    let doc: serde_json::Value =
        serde_json::from_str(jwks_json).map_err(|e| err(format!("not valid JSON: {e}")))?;
    let Some(items) = doc.get("keys").and_then(|k| k.as_array()) else {
        return Err(err(
            "not a JWKS: expected an object with a \"keys\" array (the document served at the \
             issuer's jwks_uri)"
                .into(),
        ));
    };
    let mut keys = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let kid_label = item
            .get("kid")
            .and_then(|k| k.as_str())
            .map(|k| format!(" (kid {k:?})"))
            .unwrap_or_default();
        let at = format!("key #{i}{kid_label}");
        let kty = item.get("kty").and_then(|k| k.as_str()).unwrap_or("");
        match kty {
            "RSA" | "EC" => {}
            "oct" => {
                return Err(err(format!(
                    "{at} is a symmetric (oct) key; only RSA and EC public keys are accepted"
                )));
            }
            "" => return Err(err(format!("{at} has no kty"))),
            other => {
                return Err(err(format!(
                    "{at} has kty {other:?}; only RSA and EC (P-256, P-384) keys are supported"
                )));
            }
        }
        if item.get("d").is_some() {
            return Err(err(format!(
                "{at} contains a private key (\"d\"); the JWKS must hold public keys only"
            )));
        }
        let jwk: Jwk = serde_json::from_value(item.clone())
            .map_err(|e| err(format!("{at} is not a valid JWK: {e}")))?;
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue; // not a signing key
        }
        let kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(p) => {
                let n = URL_SAFE_NO_PAD
                    .decode(&p.n)
                    .map_err(|_| err(format!("{at}: n is not base64url")))?;
                let bits = n.iter().skip_while(|b| **b == 0).count() * 8;
                if bits < 2048 {
                    return Err(err(format!(
                        "{at}: RSA key of about {bits} bits; at least 2048 are required"
                    )));
                }
                KeyKind::Rsa
            }
            AlgorithmParameters::EllipticCurve(p) => match p.curve {
                EllipticCurve::P256 => KeyKind::EcP256,
                EllipticCurve::P384 => KeyKind::EcP384,
                ref c => {
                    return Err(err(format!(
                        "{at}: curve {c:?} is not supported (P-256 or P-384)"
                    )));
                }
            },
            _ => return Err(err(format!("{at}: only RSA and EC keys are supported"))),
        };
        let alg = match jwk.common.key_algorithm {
            None => None,
            Some(ka) => {
                let alg = key_alg(ka).ok_or_else(|| {
                    err(format!(
                        "{at}: alg {ka} is not a supported signature algorithm"
                    ))
                })?;
                if !kind.supports(alg) {
                    return Err(err(format!("{at}: alg {ka} does not fit a {kind:?} key")));
                }
                Some(alg)
            }
        };
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| err(format!("{at}: {e}")))?;
        keys.push(VerifyKey {
            kid: jwk.common.key_id.clone(),
            kind,
            alg,
            key,
        });
    }
    if keys.is_empty() {
        return Err(err("holds no signing keys".into()));
    }
    Ok(keys)
}

fn key_alg(ka: KeyAlgorithm) -> Option<Algorithm> {
    Some(match ka {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::{Value, json};
    use std::path::PathBuf;
    use std::sync::OnceLock;

    const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
    /// 2026-01-01T00:00:00Z
    const NOW: u64 = 1_767_225_600;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(NOW)
    }

    fn td() -> TrustDomain {
        TrustDomain::new("cluster.local").expect("td")
    }

    fn cfg() -> KubernetesAuthConfig {
        KubernetesAuthConfig {
            issuer: ISSUER.into(),
            jwks_file: PathBuf::from("/unused"),
            audiences: vec!["istio-ca".into(), "signet".into()],
            leeway: Duration::from_secs(30),
        }
    }

    struct EcKey {
        pkcs8: Vec<u8>,
        jwk: Value,
    }

    fn ec_key(kid: &str) -> EcKey {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("generate");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("parse");
        let point = pair.public_key().as_ref();
        assert_eq!(point.len(), 65);
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        });
        EcKey {
            pkcs8: pkcs8.as_ref().to_vec(),
            jwk,
        }
    }

    struct RsaKey {
        pem: Vec<u8>,
        jwk: Value,
    }

    /// A 2048-bit RSA key made by openssl once per test run (real clusters sign RS256).
    fn rsa_key() -> &'static RsaKey {
        static KEY: OnceLock<RsaKey> = OnceLock::new();
        KEY.get_or_init(|| {
            use x509_parser::prelude::FromDer;
            use x509_parser::public_key::PublicKey;
            use x509_parser::x509::SubjectPublicKeyInfo;
            let dir = tempfile::tempdir().expect("tempdir");
            let key_path = dir.path().join("key.pem");
            let status = std::process::Command::new("openssl")
                .args([
                    "genpkey",
                    "-algorithm",
                    "RSA",
                    "-pkeyopt",
                    "rsa_keygen_bits:2048",
                    "-out",
                ])
                .arg(&key_path)
                .stderr(std::process::Stdio::null())
                .status()
                .expect("run openssl");
            assert!(status.success());
            let out = std::process::Command::new("openssl")
                .args(["pkey", "-pubout", "-outform", "DER", "-in"])
                .arg(&key_path)
                .output()
                .expect("run openssl");
            assert!(out.status.success());
            let (_, spki) = SubjectPublicKeyInfo::from_der(&out.stdout).expect("spki");
            let PublicKey::RSA(rsa) = spki.parsed().expect("parsed") else {
                panic!("not RSA")
            };
            let strip = |b: &[u8]| {
                b.iter()
                    .skip_while(|x| **x == 0)
                    .copied()
                    .collect::<Vec<_>>()
            };
            let jwk = json!({
                "kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256",
                "n": URL_SAFE_NO_PAD.encode(strip(rsa.modulus)),
                "e": URL_SAFE_NO_PAD.encode(strip(rsa.exponent)),
            });
            RsaKey {
                pem: std::fs::read(&key_path).expect("read key"),
                jwk,
            }
        })
    }

    fn jwks(keys: &[&Value]) -> String {
        json!({ "keys": keys }).to_string()
    }

    fn claims() -> Value {
        json!({
            "iss": ISSUER,
            "sub": "system:serviceaccount:default:web",
            "aud": ["istio-ca"],
            "exp": NOW + 3600,
            "iat": NOW - 60,
            "nbf": NOW - 60,
            "kubernetes.io": {
                "namespace": "default",
                "serviceaccount": { "name": "web", "uid": "8c1f" },
                "pod": { "name": "web-7d9f", "uid": "a1b2" },
            },
        })
    }

    fn sign_es(key: &EcKey, kid: Option<&str>, claims: &Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&h, claims, &EncodingKey::from_ec_der(&key.pkcs8)).expect("sign")
    }

    fn sign_rs(claims: &Value) -> String {
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some("rsa-1".into());
        let key = EncodingKey::from_rsa_pem(&rsa_key().pem).expect("rsa key");
        jsonwebtoken::encode(&h, claims, &key).expect("sign")
    }

    struct Fixture {
        key: EcKey,
        auth: JwtAuthenticator,
    }

    fn fixture() -> Fixture {
        let key = ec_key("ec-1");
        let auth = JwtAuthenticator::new(&cfg(), &jwks(&[&key.jwk]), td()).expect("authn");
        Fixture { key, auth }
    }

    #[test]
    fn node_tokens_use_their_own_audiences_and_carry_the_node() {
        let f = fixture();
        let node_aud = vec!["signet-node".to_owned()];
        let mut c = with(claims(), "aud", json!(["signet-node"]));
        c["kubernetes.io"]["node"] = json!({ "name": "worker-1", "uid": "9f8e" });
        let token = sign_es(&f.key, Some("ec-1"), &c);
        let t = f
            .auth
            .authenticate_node_token(&token, now(), &node_aud)
            .expect("node token");
        assert_eq!(t.node_name.as_deref(), Some("worker-1"));
        assert_eq!(
            t.caller.spiffe_id().to_string(),
            "spiffe://cluster.local/ns/default/sa/web"
        );
        // A node token is no workload token, and a workload token is no node token.
        let m = refused(&f.auth, &token);
        assert!(m.contains("audience [signet-node]"), "{m}");
        let workload = sign_es(&f.key, Some("ec-1"), &claims());
        let e = f
            .auth
            .authenticate_node_token(&workload, now(), &node_aud)
            .expect_err("workload audience");
        assert!(e.to_string().contains("is not one of [signet-node]"), "{e}");
        // Every other check still applies: expiry, signature.
        let expired = with(c.clone(), "exp", json!(NOW - 3600));
        let e = f
            .auth
            .authenticate_node_token(&sign_es(&f.key, Some("ec-1"), &expired), now(), &node_aud)
            .expect_err("expired");
        assert!(e.to_string().contains("expired"), "{e}");
        // Without a node claim, no node.
        let plain = with(claims(), "aud", json!("signet-node"));
        let t = f
            .auth
            .authenticate_node_token(&sign_es(&f.key, Some("ec-1"), &plain), now(), &node_aud)
            .expect("valid");
        assert_eq!(t.node_name, None);
    }

    /// Runs `authenticate` expecting a refusal; checks the message never contains the token.
    fn refused(auth: &JwtAuthenticator, token: &str) -> String {
        let err = auth.authenticate(token, now()).expect_err("refused");
        let msg = err.to_string();
        assert!(matches!(err, AuthnError::BadToken(_)), "{err:?}");
        assert!(!msg.contains(token), "message contains the token: {msg}");
        for part in token.split('.').filter(|p| p.len() > 8) {
            assert!(!msg.contains(part), "message contains a token part: {msg}");
        }
        msg
    }

    fn with(mut c: Value, key: &str, v: Value) -> Value {
        c[key] = v;
        c
    }

    fn without(mut c: Value, key: &str) -> Value {
        c.as_object_mut().expect("object").remove(key);
        c
    }

    #[test]
    fn valid_es256_token_is_accepted() {
        let f = fixture();
        let caller = f
            .auth
            .authenticate(&sign_es(&f.key, Some("ec-1"), &claims()), now())
            .expect("accepted");
        assert_eq!(
            caller.spiffe_id().to_string(),
            "spiffe://cluster.local/ns/default/sa/web"
        );
        assert_eq!(
            caller.kind(),
            &CallerKind::KubernetesServiceAccount {
                namespace: "default".into(),
                service_account: "web".into(),
                pod: Some("web-7d9f".into()),
                node: None,
            }
        );
    }

    #[test]
    fn valid_rs256_token_is_accepted() {
        let rsa = rsa_key();
        let ec = ec_key("ec-1");
        let auth = JwtAuthenticator::new(&cfg(), &jwks(&[&ec.jwk, &rsa.jwk]), td()).expect("authn");
        let c = with(claims(), "aud", json!("signet"));
        let caller = auth.authenticate(&sign_rs(&c), now()).expect("accepted");
        assert_eq!(
            caller.spiffe_id().to_string(),
            "spiffe://cluster.local/ns/default/sa/web"
        );
    }

    #[test]
    fn token_without_kid_tries_compatible_keys() {
        let other = ec_key("ec-0");
        let key = ec_key("ec-1");
        let auth =
            JwtAuthenticator::new(&cfg(), &jwks(&[&rsa_key().jwk, &other.jwk, &key.jwk]), td())
                .expect("authn");
        let caller = auth
            .authenticate(&sign_es(&key, None, &claims()), now())
            .expect("accepted");
        assert_eq!(caller.spiffe_id().path(), "/ns/default/sa/web");
        // And without the kubernetes.io object (sub alone names the account).
        let c = without(claims(), "kubernetes.io");
        let caller = auth
            .authenticate(&sign_es(&key, None, &c), now())
            .expect("accepted");
        assert!(matches!(
            caller.kind(),
            CallerKind::KubernetesServiceAccount { pod: None, .. }
        ));
    }

    #[test]
    fn leeway_is_honoured_at_the_edges() {
        let f = fixture();
        // Expired 20 s ago: within the 30 s leeway.
        let c = with(claims(), "exp", json!(NOW - 20));
        f.auth
            .authenticate(&sign_es(&f.key, Some("ec-1"), &c), now())
            .expect("within leeway");
        // nbf 20 s ahead: within leeway.
        let c = with(claims(), "nbf", json!(NOW + 20));
        f.auth
            .authenticate(&sign_es(&f.key, Some("ec-1"), &c), now())
            .expect("within leeway");
        // Fractional NumericDate.
        let c = with(claims(), "exp", json!(NOW as f64 + 100.5));
        f.auth
            .authenticate(&sign_es(&f.key, Some("ec-1"), &c), now())
            .expect("fractional exp");
    }

    #[test]
    fn expired_token_is_refused() {
        let f = fixture();
        let c = with(claims(), "exp", json!(NOW - 120));
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(
            msg.contains("token expired at 2025-12-31T23:58:00Z (now 2026-01-01T00:00:00Z)"),
            "{msg}"
        );
    }

    #[test]
    fn not_yet_valid_token_is_refused() {
        let f = fixture();
        let c = with(claims(), "nbf", json!(NOW + 600));
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(
            msg.contains("not valid before 2026-01-01T00:10:00Z"),
            "{msg}"
        );
    }

    #[test]
    fn token_issued_in_the_future_is_refused() {
        let f = fixture();
        let c = with(claims(), "iat", json!(NOW + 600));
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("issued in the future"), "{msg}");
    }

    #[test]
    fn alg_none_is_refused() {
        let f = fixture();
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        let payload = URL_SAFE_NO_PAD.encode(claims().to_string());
        let token = format!("{header}.{payload}.");
        let msg = refused(&f.auth, &token);
        assert!(msg.contains("alg \"none\""), "{msg}");
        // Same with "None" and a kid naming a real key.
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"None","kid":"ec-1"}"#);
        let msg = refused(&f.auth, &format!("{header}.{payload}."));
        assert!(msg.contains("unsigned"), "{msg}");
    }

    #[test]
    fn hs256_with_the_public_key_as_secret_is_refused() {
        // Key confusion: an attacker HMACs the token with the (public) key bytes.
        let rsa = rsa_key();
        let auth = JwtAuthenticator::new(&cfg(), &jwks(&[&rsa.jwk]), td()).expect("authn");
        for secret in [
            rsa.jwk.to_string().into_bytes(),
            URL_SAFE_NO_PAD
                .decode(rsa.jwk["n"].as_str().expect("n"))
                .expect("n"),
        ] {
            let mut h = Header::new(Algorithm::HS256);
            h.kid = Some("rsa-1".into());
            let token = jsonwebtoken::encode(&h, &claims(), &EncodingKey::from_secret(&secret))
                .expect("sign");
            let msg = refused(&auth, &token);
            assert!(msg.contains("HMAC"), "{msg}");
        }
    }

    #[test]
    fn token_signed_by_another_key_is_refused() {
        let f = fixture();
        let stranger = ec_key("ec-1");
        // Same kid, different key.
        let msg = refused(&f.auth, &sign_es(&stranger, Some("ec-1"), &claims()));
        assert!(msg.contains("signature does not verify"), "{msg}");
        // Unknown kid.
        let msg = refused(&f.auth, &sign_es(&stranger, Some("ec-9"), &claims()));
        assert!(
            msg.contains("signed by a key that is not in the configured JWKS"),
            "{msg}"
        );
        // No kid.
        let msg = refused(&f.auth, &sign_es(&stranger, None, &claims()));
        assert!(
            msg.contains("signed by a key that is not in the configured JWKS"),
            "{msg}"
        );
        // RS256 token against an EC-only JWKS.
        let msg = refused(&f.auth, &sign_rs(&claims()));
        assert!(msg.contains("not in the configured JWKS"), "{msg}");
    }

    #[test]
    fn tampered_payload_is_refused() {
        let f = fixture();
        let token = sign_es(&f.key, Some("ec-1"), &claims());
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let evil = with(
            claims(),
            "sub",
            json!("system:serviceaccount:kube-system:admin"),
        );
        parts[1] = URL_SAFE_NO_PAD.encode(evil.to_string());
        let msg = refused(&f.auth, &parts.join("."));
        assert!(msg.contains("signature does not verify"), "{msg}");
    }

    #[test]
    fn wrong_audience_is_refused() {
        let f = fixture();
        let c = with(
            claims(),
            "aud",
            json!(["https://kubernetes.default.svc", "vault"]),
        );
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(
            msg.contains(
                "audience [https://kubernetes.default.svc, vault] is not one of [istio-ca, signet]"
            ),
            "{msg}"
        );
        let c = without(claims(), "aud");
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("no aud"), "{msg}");
    }

    #[test]
    fn wrong_issuer_is_refused() {
        let f = fixture();
        let c = with(claims(), "iss", json!("https://evil.example"));
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(
            msg.contains(&format!(
                "issuer \"https://evil.example\" is not the configured issuer \"{ISSUER}\""
            )),
            "{msg}"
        );
    }

    #[test]
    fn missing_exp_is_refused() {
        let f = fixture();
        let c = without(claims(), "exp");
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("no exp"), "{msg}");
        assert!(msg.contains("legacy"), "{msg}");
    }

    #[test]
    fn legacy_secret_token_is_refused() {
        let f = fixture();
        let legacy = json!({
            "iss": "kubernetes/serviceaccount",
            "kubernetes.io/serviceaccount/namespace": "default",
            "kubernetes.io/serviceaccount/secret.name": "web-token-abcde",
            "kubernetes.io/serviceaccount/service-account.name": "web",
            "kubernetes.io/serviceaccount/service-account.uid": "8c1f",
            "sub": "system:serviceaccount:default:web",
        });
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &legacy));
        assert!(msg.contains("legacy Secret-based"), "{msg}");
    }

    #[test]
    fn sub_and_claims_must_agree() {
        let f = fixture();
        let mut c = claims();
        c["kubernetes.io"]["namespace"] = json!("kube-system");
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("namespace"), "{msg}");
        let mut c = claims();
        c["kubernetes.io"]["serviceaccount"]["name"] = json!("admin");
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("service account"), "{msg}");
        for sub in [
            "system:node:worker-1",
            "system:serviceaccount:default",
            "system:serviceaccount:default:web:extra",
            "system:serviceaccount::web",
        ] {
            let c = with(claims(), "sub", json!(sub));
            let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
            assert!(
                msg.contains("not a service account") || msg.contains("path segment"),
                "{sub}: {msg}"
            );
        }
        let mut c = with(claims(), "sub", json!("system:serviceaccount:de fault:web"));
        c["kubernetes.io"]["namespace"] = json!("de fault");
        let msg = refused(&f.auth, &sign_es(&f.key, Some("ec-1"), &c));
        assert!(msg.contains("SPIFFE path segment"), "{msg}");
    }

    #[test]
    fn garbage_and_oversize_are_refused() {
        let f = fixture();
        for token in [
            "",
            "garbage",
            "a.b",
            "a.b.c.d",
            "!!!.???.###",
            "eyJhbGciOiJFUzI1NiJ9.bm90IGpzb24.c2ln",
        ] {
            let err = f.auth.authenticate(token, now()).expect_err("refused");
            assert!(matches!(err, AuthnError::BadToken(_)), "{token}: {err:?}");
        }
        refused(&f.auth, "eyJhbGciOiJFUzI1NiJ9.bm90IGpzb24.c2lnbmF0dXJl");
        // Odd algorithm names (non-ASCII, unknown) are refused, not panicked on.
        for alg in ["H\u{e9}", "\u{e9}", "EdDSA", "RSA-OAEP", ""] {
            let header = URL_SAFE_NO_PAD.encode(json!({ "alg": alg }).to_string());
            let payload = URL_SAFE_NO_PAD.encode(claims().to_string());
            let msg = refused(&f.auth, &format!("{header}.{payload}.c2lnbmF0dXJl"));
            assert!(msg.contains("alg"), "{alg}: {msg}");
        }
        let huge = format!(
            "{}.{}.{}",
            "a".repeat(8000),
            "b".repeat(9000),
            "c".repeat(100)
        );
        let msg = refused(&f.auth, &huge);
        assert!(msg.contains("16384-byte limit"), "{msg}");
    }

    #[test]
    fn bearer_header_is_parsed() {
        assert_eq!(bearer_token("Bearer abc.def.ghi"), Ok("abc.def.ghi"));
        assert_eq!(bearer_token("bearer  abc"), Ok("abc"));
        assert_eq!(bearer_token("BEARER abc "), Ok("abc"));
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            "Basic dXNlcjpwYXNz",
            "abc",
            "Bearer a b",
        ] {
            let err = bearer_token(bad).expect_err("refused");
            assert!(matches!(err, AuthnError::MalformedHeader(_)), "{bad:?}");
            if bad.len() > 8 {
                assert!(!err.to_string().contains(&bad[7..]), "{err}");
            }
        }
    }

    #[test]
    fn bad_configuration_is_named() {
        let key = ec_key("ec-1");
        let good = jwks(&[&key.jwk]);
        let mut c = cfg();
        c.issuer = String::new();
        assert!(JwtAuthenticator::new(&c, &good, td()).is_err());
        let mut c = cfg();
        c.audiences.clear();
        let err = JwtAuthenticator::new(&c, &good, td()).expect_err("refused");
        assert!(err.to_string().contains("audiences"), "{err}");
        let cases: [(&str, &str); 7] = [
            ("not json", "not valid JSON"),
            (r#"{"kids": []}"#, "\"keys\" array"),
            (r#"{"keys": []}"#, "no signing keys"),
            (
                r#"{"keys": [{"kty":"oct","k":"c2VjcmV0","kid":"h"}]}"#,
                "symmetric",
            ),
            (
                r#"{"keys": [{"kty":"OKP","crv":"Ed25519","x":"AA"}]}"#,
                "OKP",
            ),
            (r#"{"keys": [{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#, "2048"),
            (
                r#"{"keys": [{"kty":"EC","crv":"P-256","x":"AA"}]}"#,
                "not a valid JWK",
            ),
        ];
        for (doc, want) in cases {
            let err = JwtAuthenticator::new(&cfg(), doc, td()).expect_err(doc);
            assert!(err.to_string().contains(want), "{doc}: {err}");
        }
        let mut private = key.jwk.clone();
        private["d"] = json!("AAAA");
        let err = JwtAuthenticator::new(&cfg(), &jwks(&[&private]), td()).expect_err("private");
        assert!(err.to_string().contains("private key"), "{err}");
        let mut mismatched = key.jwk.clone();
        mismatched["alg"] = json!("RS256");
        let err = JwtAuthenticator::new(&cfg(), &jwks(&[&mismatched]), td()).expect_err("alg");
        assert!(err.to_string().contains("does not fit"), "{err}");
    }

    #[test]
    fn debug_output_names_no_key_material() {
        let f = fixture();
        let dbg = format!("{:?}", f.auth);
        assert!(dbg.contains("ec-1") && dbg.contains(ISSUER), "{dbg}");
        assert!(!dbg.contains(f.key.jwk["x"].as_str().expect("x")), "{dbg}");
    }
}
