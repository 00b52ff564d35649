//! Kubernetes projected service-account tokens, validated offline against the issuer's JWKS.
//!
//! [`JwtAuthenticator`] is the API the rest of the server calls: built once from
//! `[auth.kubernetes]` and the JWKS document, it turns a token string into the caller it names
//! ([`JwtAuthenticator::authenticate`]) or, for node attestation, into a [`VerifiedToken`]
//! checked against the node audiences ([`JwtAuthenticator::authenticate_node_token`]). It takes
//! the token only: the `authorization` header is parsed at the API edge (`crate::api::bearer`),
//! which hands over a [`Bearer`].
//!
//! The checks, in order, and the module that owns each rule:
//! 1. [`jws`]: size cap; compact JWS shape (JWE refused); header `alg` asymmetric only (`none`
//!    and HMAC refused, so a public key can never be used as an HMAC secret); no `crit`;
//! 2. [`jwks`]: the key chosen by `kid` (or, without a `kid`, every key compatible with `alg`);
//! 3. [`jws`]: the signature; only a verified token yields its payload;
//! 4. [`kubernetes`]: legacy Secret-based tokens refused;
//! 5. [`claims`]: `exp` (required), `iss`, `exp`/`nbf`/`iat` against the `now` passed in (the
//!    injected clock's) with the configured leeway, `aud`;
//! 6. [`kubernetes`]: `sub` and the `kubernetes.io` claim object, which make the identity.
//!
//! Checks 1 to 3 (and the payload's decoding) are memoised per token by [`memo`]: a pod sends
//! the same token for its whole validity window, so its signature is verified once; checks 4 to
//! 6 run on every use, against that use's `now` and audiences.
//!
//! Kubernetes rotates its service-account signing keys, so the JWKS is not read once: built
//! with [`JwtAuthenticator::from_file`], the authenticator re-reads `jwks_file` ([`reload`])
//! before a token is checked when the last read is older than `jwks_refresh`, and at once (at
//! most once a second) when a token's signature finds no key. The key set and the memo of
//! tokens verified under it are one value ([`Generation`]), replaced together: a new JWKS comes
//! with an empty memo, so a token remembered under a key that has left the JWKS is never
//! accepted again, by construction. A file that becomes unreadable or invalid keeps the last
//! good keys (logged loudly, once per distinct problem): an operator's typo must not lock every
//! workload out.
//!
//! Error messages say what is wrong and what to do, and never contain the token ([`refuse`]).
//! The submodules import only downwards (jws → jwks → refuse; kubernetes → claims → refuse;
//! memo → kubernetes); this module wires them.

mod claims;
mod jwks;
mod jws;
mod kubernetes;
mod memo;
mod refuse;
mod reload;
#[cfg(test)]
mod test_support;

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use signet_types::TrustDomain;

use self::claims::Expected;
use self::jwks::KeySet;
use self::jws::{Jws, MAX_TOKEN_BYTES};
use self::kubernetes::{LEGACY_ISSUER, Payload};
use self::memo::VerifiedTokens;
#[cfg(any(test, feature = "fuzzing"))]
use self::refuse::bad;
use self::reload::JwksFile;
use super::{AuthenticatedCaller, AuthnError};
use crate::clock::{Clock, unix};
use crate::config::KubernetesAuthConfig;

pub use self::jwks::JwksError;
pub use self::kubernetes::VerifiedToken;

/// Longest leeway (clock skew) `[auth.kubernetes]` may set, in seconds.
const MAX_LEEWAY_SECS: i64 = 3600;

/// The range of `[auth.kubernetes] jwks_refresh`.
const JWKS_REFRESH_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);

/// Why the Kubernetes token authenticator could not be built from configuration. Messages
/// name the `[auth.kubernetes]` setting (without that prefix, which the caller adds).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtConfigError {
    #[error("{0}")]
    Config(String),
    #[error("jwks_file: {0}")]
    Jwks(JwksError),
    #[error("jwks_file {path}: {error}")]
    Read { path: String, error: String },
}

/// One JWKS document's keys and the tokens verified under them, replaced together (see the
/// module doc): no token is ever served from a memo whose keys are not the current ones.
pub(super) struct Generation {
    keys: KeySet,
    /// Tokens whose signature verified under `keys`.
    verified: VerifiedTokens,
}

impl Generation {
    fn new(keys: KeySet) -> Arc<Self> {
        Arc::new(Self {
            keys,
            verified: VerifiedTokens::default(),
        })
    }
}

/// Validates Kubernetes projected service-account tokens offline.
pub struct JwtAuthenticator {
    issuer: String,
    audiences: Vec<String>,
    leeway_secs: i64,
    td: TrustDomain,
    /// The current keys and their memo.
    current: RwLock<Arc<Generation>>,
    /// Where the keys are re-read from; `None` when built from a document ([`Self::new`]).
    source: Option<JwksFile>,
}

impl fmt::Debug for JwtAuthenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtAuthenticator")
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .field("leeway_secs", &self.leeway_secs)
            .field("kids", &self.generation().keys.kids())
            .field(
                "jwks_file",
                &self.source.as_ref().map(|s| s.path().display().to_string()),
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
            .filter(|s| *s <= MAX_LEEWAY_SECS)
            .ok_or_else(|| {
                JwtConfigError::Config(format!(
                    "leeway {} is longer than one hour",
                    humantime::format_duration(cfg.leeway)
                ))
            })?;
        let keys = KeySet::parse(jwks_json).map_err(JwtConfigError::Jwks)?;
        Ok(Self {
            issuer: cfg.issuer.clone(),
            audiences: cfg.audiences.clone(),
            leeway_secs,
            td,
            current: RwLock::new(Generation::new(keys)),
            source: None,
        })
    }

    /// Builds the authenticator from `[auth.kubernetes]`, reading `cfg.jwks_file`, and keeps
    /// re-reading it every `cfg.jwks_refresh` (and on a token whose key it does not know), so
    /// a rotation of the cluster's signing keys needs no restart (see the module doc). `clock`
    /// says when a re-read is due.
    pub fn from_file(
        cfg: &KubernetesAuthConfig,
        td: TrustDomain,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, JwtConfigError> {
        if !JWKS_REFRESH_RANGE.contains(&cfg.jwks_refresh) {
            return Err(JwtConfigError::Config(format!(
                "jwks_refresh {} is outside 1s to 1h",
                humantime::format_duration(cfg.jwks_refresh)
            )));
        }
        let (source, text) =
            JwksFile::open(&cfg.jwks_file, cfg.jwks_refresh, clock).map_err(|error| {
                JwtConfigError::Read {
                    path: cfg.jwks_file.display().to_string(),
                    error: error.to_string(),
                }
            })?;
        let mut auth = Self::new(cfg, &text, td)?;
        auth.source = Some(source);
        Ok(auth)
    }

    /// The current keys and memo (a clone of the `Arc`: a reload does not disturb a check
    /// under way, which finishes under the keys it started with).
    fn generation(&self) -> Arc<Generation> {
        // Only ever holds a whole `Arc`: a panic elsewhere cannot leave it half-updated.
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the JWKS file if the last read is at least `min_gap` old; installs its keys
    /// (with an empty memo) when they differ. Whether the keys changed.
    fn refresh(&self, min_gap: Duration) -> bool {
        let Some(source) = &self.source else {
            return false;
        };
        let Some(text) = source.changed_text(min_gap) else {
            return false;
        };
        match KeySet::parse(&text) {
            Ok(keys) => {
                let kids: Vec<String> = keys
                    .kids()
                    .into_iter()
                    .map(|k| k.unwrap_or("(no kid)").to_owned())
                    .collect();
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Generation::new(keys);
                source.installed(&text);
                tracing::info!(
                    jwks_file = %source.path().display(),
                    kids = ?kids,
                    "auth.kubernetes: the JWKS changed; verifying tokens with its keys from now on"
                );
                true
            }
            Err(e) => {
                source.report_problem(format!(
                    "the new contents are refused ({e}); still verifying tokens with the keys \
                     last read. Fix the file (kubectl get --raw /openid/v1/jwks)"
                ));
                false
            }
        }
    }

    /// Re-reads the JWKS file now (SIGHUP), whatever `jwks_refresh` says, and installs its
    /// keys when they changed; a file that cannot be read or parsed leaves the keys in force.
    /// What happened, for the reload's log line. An authenticator built without a file says
    /// `Unchanged`.
    pub fn reload_now(&self) -> crate::reload::Outcome {
        use crate::reload::Outcome;
        let Some(source) = &self.source else {
            return Outcome::Unchanged(String::new());
        };
        let path = source.path().display().to_string();
        let text = match source.read_now() {
            Ok(None) => return Outcome::Unchanged(path),
            Ok(Some(text)) => text,
            Err(e) => {
                return Outcome::Failed(format!(
                    "{path} cannot be read ({e}); still verifying tokens with the keys last read"
                ));
            }
        };
        match KeySet::parse(&text) {
            Ok(keys) => {
                let kids: Vec<String> = keys
                    .kids()
                    .into_iter()
                    .map(|k| k.unwrap_or("(no kid)").to_owned())
                    .collect();
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Generation::new(keys);
                source.installed(&text);
                Outcome::Reloaded(format!("{path}: keys {}", kids.join(", ")))
            }
            Err(e) => Outcome::Failed(format!(
                "{path}: the new contents are refused ({e}); still verifying tokens with the \
                 keys last read. Fix the file (kubectl get --raw /openid/v1/jwks)"
            )),
        }
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
        let payload = self.verified_payload(token, now)?;
        self.check_claims(&payload, now, audiences)
    }

    /// Checks 1 to 3 of the module doc and the payload's decoding: from the memo when this
    /// exact token verified before (and its entry is still current at `now`), else verified
    /// here and remembered until the token's `exp` (plus leeway).
    fn verified_payload(&self, token: &str, now: SystemTime) -> Result<Arc<Payload>, AuthnError> {
        // An oversized token is refused by `Jws::parse` before anything hashes it.
        let key = (token.len() <= MAX_TOKEN_BYTES).then(|| memo::key(token));
        let now_secs = unix(now);
        if let Some(source) = &self.source {
            self.refresh(source.interval());
        }
        let mut generation = self.generation();
        if let Some(hit) = key
            .as_ref()
            .and_then(|k| generation.verified.get(k, now_secs))
        {
            return Ok(hit);
        }
        let verified = match Jws::parse(token)?.verify(&generation.keys) {
            Ok(v) => v,
            // Perhaps signed by a key the cluster has just added: read the file again (at most
            // once a second, whoever sends such tokens) and try once more under the new keys.
            Err(e) => {
                if !self.refresh(reload::UNKNOWN_KEY_GAP) {
                    return Err(e);
                }
                generation = self.generation();
                Jws::parse(token)?.verify(&generation.keys)?
            }
        };
        let payload: Arc<Payload> = Arc::new(verified.payload()?);
        let exp = payload
            .registered()
            .exp
            .and_then(|v| claims::numeric_date(v, "exp").ok());
        if let (Some(key), Some(exp)) = (key, exp) {
            let expires = exp.saturating_add(self.leeway_secs);
            generation
                .verified
                .insert(key, payload.clone(), expires, now_secs);
        }
        Ok(payload)
    }

    /// The claim checks alone, on a payload's JSON: what a token whose signature verified may
    /// carry. For `crate::fuzzing`, which cannot sign its mutations.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn verify_claims_json(
        &self,
        json: &[u8],
        now: SystemTime,
        audiences: &[String],
    ) -> Result<VerifiedToken, AuthnError> {
        let payload: Payload = serde_json::from_slice(json)
            .map_err(|_| bad("token payload is not the expected JSON object"))?;
        self.check_claims(&payload, now, audiences)
    }

    /// Checks 4 to 6 of the module doc, on a payload whose signature verified.
    fn check_claims(
        &self,
        payload: &Payload,
        now: SystemTime,
        accepted: &[String],
    ) -> Result<VerifiedToken, AuthnError> {
        kubernetes::refuse_legacy(payload)?;
        let want = Expected {
            issuer: &self.issuer,
            audiences: accepted,
            leeway_secs: self.leeway_secs,
        };
        claims::check(&payload.registered(), &want, now)?;
        kubernetes::identity(payload, &self.td)
    }
}

/// A bearer credential as the API edge read it from `authorization: Bearer <token>`
/// (`crate::api::bearer`): the token, or why the header held none. Whoever needs the token
/// calls [`Bearer::token`], so a malformed header is refused (and audited) exactly where a bad
/// token would be. `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Bearer(Result<String, AuthnError>);

impl Bearer {
    /// What the header parser made of the header.
    pub(crate) fn new(parsed: Result<&str, AuthnError>) -> Self {
        Self(parsed.map(str::to_owned))
    }

    /// The token, for [`JwtAuthenticator::authenticate`]; or why the header held none
    /// ([`AuthnError::MalformedHeader`]).
    pub fn token(&self) -> Result<&str, AuthnError> {
        self.0.as_deref().map_err(Clone::clone)
    }
}

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Ok(_) => f.write_str("Bearer(…)"),
            Err(e) => write!(f, "Bearer(refused: {e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use serde_json::json;

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

    /// The memo spares the signature check of a token seen before, and nothing else: expiry,
    /// not-before and audience are judged on every use against that use's clock.
    #[test]
    fn a_memoised_token_still_meets_every_claim_check() {
        let f = fixture();
        let at = |secs: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let token = sign_es(&f.key, Some("ec-1"), &claims());
        let first = f.auth.authenticate(&token, now()).expect("valid");
        assert_eq!(
            f.auth.generation().verified.len(),
            1,
            "a verified token is remembered"
        );
        let again = f.auth.authenticate(&token, now()).expect("valid again");
        assert_eq!(first.spiffe_id(), again.spiffe_id());
        // Expiry (exp = NOW + 3600, leeway 30 s): accepted up to the leeway, refused after,
        // from the memo exactly as without it.
        f.auth
            .authenticate(&token, at(NOW + 3630))
            .expect("within leeway");
        let e = f
            .auth
            .authenticate(&token, at(NOW + 3631))
            .expect_err("expired");
        assert!(e.to_string().contains("expired"), "{e}");
        // The expired entry was dropped; a clock set back (the injected one) verifies anew.
        assert_eq!(f.auth.generation().verified.len(), 0);
        f.auth.authenticate(&token, now()).expect("valid at NOW");
        // Not yet valid: a token remembered at its nbf is refused before it.
        let early = sign_es(
            &f.key,
            Some("ec-1"),
            &with(claims(), "nbf", json!(NOW + 600)),
        );
        f.auth
            .authenticate(&early, at(NOW + 600))
            .expect("valid at its nbf");
        let e = f
            .auth
            .authenticate(&early, now())
            .expect_err("not yet valid");
        assert!(e.to_string().contains("not valid before"), "{e}");
        // Audience: a node token remembered on the node path is no workload token, and a
        // workload token remembered on the workload path is no node token.
        let node_aud = vec!["signet-node".to_owned()];
        let node = sign_es(
            &f.key,
            Some("ec-1"),
            &with(claims(), "aud", json!("signet-node")),
        );
        f.auth
            .authenticate_node_token(&node, now(), &node_aud)
            .expect("node token");
        let m = refused(&f.auth, &node);
        assert!(m.contains("audience"), "{m}");
        let e = f
            .auth
            .authenticate_node_token(&token, now(), &node_aud)
            .expect_err("workload token on the node path");
        assert!(e.to_string().contains("is not one of [signet-node]"), "{e}");
    }

    /// Only verified tokens are remembered, under their exact bytes, and only by the
    /// authenticator whose keys verified them.
    #[test]
    fn the_memo_never_serves_a_token_its_keys_did_not_verify() {
        let f = fixture();
        let token = sign_es(&f.key, Some("ec-1"), &claims());
        f.auth.authenticate(&token, now()).expect("valid");
        // The same header and payload with another signature is another token: refused.
        let (signing, _) = token.rsplit_once('.').expect("three parts");
        let forged = sign_es(&ec_key("ec-1"), Some("ec-1"), &claims());
        let (_, other_sig) = forged.rsplit_once('.').expect("three parts");
        let spliced = format!("{signing}.{other_sig}");
        let m = refused(&f.auth, &spliced);
        assert!(m.contains("signature does not verify"), "{m}");
        // A refusal is never remembered: refused again, and the memo holds the good one only.
        refused(&f.auth, &spliced);
        assert_eq!(f.auth.generation().verified.len(), 1);
        // The key is revoked: the JWKS without it builds a new authenticator, whose memo is
        // empty, so the token remembered under the old key set is refused.
        let other = ec_key("ec-2");
        let rotated = JwtAuthenticator::new(&cfg(), &jwks(&[&other.jwk]), td()).expect("authn");
        let m = refused(&rotated, &token);
        assert!(m.contains("ec-1"), "{m}");
        assert_eq!(rotated.generation().verified.len(), 0);
        // The other side: a token of the new key passes there, and not under the old set.
        let fresh = sign_es(&other, Some("ec-2"), &claims());
        rotated.authenticate(&fresh, now()).expect("new key");
        refused(&f.auth, &fresh);
        // An oversized token is refused by size before anything hashes or remembers it.
        let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
        let m = refused(&f.auth, &huge);
        assert!(m.contains("limit"), "{m}");
        assert_eq!(f.auth.generation().verified.len(), 1);
    }

    /// The cluster rotates its signing keys: the file is re-read without a restart. A token of
    /// a new key is accepted as soon as the file has it (an unknown key re-reads at once); a
    /// token of a removed key is refused after the next read even though it was memoised;
    /// an invalid file keeps the keys last read; reads are rate-limited.
    #[test]
    fn a_rotated_jwks_file_is_read_again_and_the_memo_follows_it() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("jwks.json");
        let (old, new) = (ec_key("ec-1"), ec_key("ec-2"));
        std::fs::write(&path, jwks(&[&old.jwk])).expect("write");
        let mut c = cfg();
        c.jwks_file = path.clone();
        // The re-reads are timed by the monotonic reading of this clock, moved by hand.
        let clock = crate::clock::fake::FakeClock::at(now());
        let auth = JwtAuthenticator::from_file(&c, td(), Arc::new(clock.clone())).expect("authn");
        let source = auth.source.as_ref().expect("a file source");
        const INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
        assert_eq!(source.interval(), INTERVAL);
        let old_token = sign_es(&old, Some("ec-1"), &claims());
        let new_token = sign_es(&new, Some("ec-2"), &claims());
        auth.authenticate(&old_token, now()).expect("old key");
        assert_eq!(auth.generation().verified.len(), 1);
        refused(&auth, &new_token);

        // The cluster adds a key: its token re-reads the file at once (2 s after the last read,
        // well within the 10 s interval; the unknown key's gap is 1 s).
        std::fs::write(&path, jwks(&[&old.jwk, &new.jwk])).expect("write");
        clock.advance(std::time::Duration::from_secs(2));
        auth.authenticate(&new_token, now())
            .expect("new key after the file changed");
        auth.authenticate(&old_token, now())
            .expect("old key still listed");
        // Then removes the old one: within one interval, the memoised token is refused.
        std::fs::write(&path, jwks(&[&new.jwk])).expect("write");
        clock.advance(INTERVAL);
        let m = refused(&auth, &old_token);
        assert!(m.contains("not in the configured JWKS"), "{m}");
        auth.authenticate(&new_token, now()).expect("new key");

        // A broken file (a typo, half a write) keeps the keys last read.
        for broken in ["{not json", r#"{"keys": []}"#] {
            std::fs::write(&path, broken).expect("write");
            clock.advance(INTERVAL);
            auth.authenticate(&new_token, now()).expect("keys kept");
        }
        std::fs::remove_file(&path).expect("remove");
        clock.advance(INTERVAL);
        auth.authenticate(&new_token, now())
            .expect("keys kept without the file");

        // Reads are rate-limited: a change is not seen before the interval is up, however
        // many unknown-key tokens arrive.
        std::fs::write(&path, jwks(&[&old.jwk])).expect("write");
        clock.advance(INTERVAL);
        auth.authenticate(&old_token, now()).expect("old key back");
        std::fs::write(&path, jwks(&[&new.jwk])).expect("write");
        for _ in 0..3 {
            refused(&auth, &new_token);
        }
        auth.authenticate(&old_token, now())
            .expect("not yet re-read");
        clock.advance(INTERVAL);
        auth.authenticate(&new_token, now()).expect("re-read");
        refused(&auth, &old_token);
    }

    #[test]
    fn jwks_refresh_and_an_unreadable_file_are_named() {
        let dir = tempfile::tempdir().expect("dir");
        let mut c = cfg();
        c.jwks_file = dir.path().join("missing.json");
        let e = JwtAuthenticator::from_file(&c, td(), Arc::new(crate::clock::SystemClock))
            .expect_err("missing");
        assert!(matches!(e, JwtConfigError::Read { .. }), "{e}");
        assert!(e.to_string().contains("missing.json"), "{e}");
        c.jwks_refresh = std::time::Duration::from_millis(500);
        let e = JwtAuthenticator::from_file(&c, td(), Arc::new(crate::clock::SystemClock))
            .expect_err("too short");
        assert_eq!(e.to_string(), "jwks_refresh 500ms is outside 1s to 1h");
    }

    /// The `[auth.kubernetes]` half of `bad_configuration_is_named` (the JWKS half is in
    /// `jwks::tests`).
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
    }

    #[test]
    fn configuration_errors_name_the_setting() {
        let good = jwks(&[&ec_key("ec-1").jwk]);
        let mut c = cfg();
        c.issuer = LEGACY_ISSUER.into();
        let err = JwtAuthenticator::new(&c, &good, td()).expect_err("legacy issuer");
        assert!(matches!(err, JwtConfigError::Config(_)), "{err:?}");
        assert!(
            err.to_string().contains("--service-account-issuer"),
            "{err}"
        );
        let mut c = cfg();
        c.audiences = vec!["istio-ca".into(), String::new()];
        assert!(JwtAuthenticator::new(&c, &good, td()).is_err());
        let mut c = cfg();
        c.leeway = std::time::Duration::from_secs(3600);
        assert!(JwtAuthenticator::new(&c, &good, td()).is_ok());
        c.leeway = std::time::Duration::from_secs(3601);
        let err = JwtAuthenticator::new(&c, &good, td()).expect_err("leeway");
        assert_eq!(err.to_string(), "leeway 1h 1s is longer than one hour");
        let err = JwtAuthenticator::new(&cfg(), r#"{"keys": []}"#, td()).expect_err("jwks");
        assert_eq!(err, JwtConfigError::Jwks(JwksError::NoSigningKeys));
        assert_eq!(err.to_string(), "jwks_file: holds no signing keys");
    }

    #[test]
    fn debug_output_names_no_key_material() {
        let f = fixture();
        let dbg = format!("{:?}", f.auth);
        assert!(dbg.contains("ec-1") && dbg.contains(ISSUER), "{dbg}");
        assert!(!dbg.contains(f.key.jwk["x"].as_str().expect("x")), "{dbg}");
    }
}
