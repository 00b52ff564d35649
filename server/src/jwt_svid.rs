//! Minting a JWT-SVID: the sans-I/O core of JWT issuance, as `ca::issue` is for certificates.
//!
//! [`mint`] is a function of (the identity policy granted, the audiences asked, the requested
//! and the entry's lifetime, [`JwtIssuePolicy`], `now`, the active key) -> a signed token that
//! has been re-validated. It never reads the clock, the database or the key manager: the issuer
//! (`crate::issuer`) asks the key source for the active key, calls this, commits the row this
//! returns to the ledger, and only then returns the token.
//!
//! The rules, in order (each refusal a [`JwtMintError`] naming the rule):
//! 1. **Audiences**: the grammar of [`signet_types::audience`] (at least one, at most 32, each
//!    non-empty, at most 256 bytes, nothing a reader cannot see); duplicates are dropped keeping
//!    the first (so `aud` is the list asked, in order, each once).
//! 2. **Lifetime**: the requested ttl (negative: refused), or when 0 the entry's `jwt_ttl`, or
//!    when that is 0 the policy's `ttl`; clamped to `max_ttl`; and `exp` never past the key's
//!    notAfter. A key with less than [`MIN_KEY_REMAINING`] left cannot mint (Unavailable: the
//!    rotator activates the next key before then).
//! 3. **Claims**: `sub`, `aud`, `iat` = now, `exp`; `iss` only when the policy has an issuer.
//! 4. **Self-check** (SPIRE's credvalidator): the token validates with `signet_pki::jwt::validate`
//!    against the key's own public key for every audience, and its `sub`, `aud`, `exp` and `kid`
//!    are what was asked. A token that fails is never returned.

use std::fmt;
use std::time::{Duration, SystemTime};

use signet_pki::jwt::{JwtKeySet, JwtSvidClaims, validate};
use signet_types::SpiffeId;
use signet_types::ledger::{Hash, sha256};

use crate::ca::jwt_key::ActiveJwtKey;
use crate::clock::unix;

/// A key with less than this left before its notAfter mints nothing.
pub const MIN_KEY_REMAINING: Duration = Duration::from_secs(30);
/// Longest `jwt_ttl` an entry may have (entries are created before the server's `max_ttl` is
/// known to the caller; the lifetime is clamped to `max_ttl` at mint).
pub const MAX_ENTRY_JWT_TTL: Duration = Duration::from_secs(24 * 3600);

/// The server's JWT-SVID settings as issuance needs them (the `[jwt_svid]` configuration maps
/// onto this).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtIssuePolicy {
    /// Lifetime when neither the request nor the entry asks for one.
    pub ttl: Duration,
    /// Longest lifetime of any token.
    pub max_ttl: Duration,
    /// The `iss` claim (an OpenID Connect issuer URL), when configured.
    pub issuer: Option<String>,
}

impl Default for JwtIssuePolicy {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(5 * 60),
            max_ttl: Duration::from_secs(3600),
            issuer: None,
        }
    }
}

/// What to mint: the identity policy granted and what the caller asked.
#[derive(Debug, Clone, Copy)]
pub struct JwtMintRequest<'a> {
    pub subject: &'a SpiffeId,
    /// Already normalised by [`normalize_audience`].
    pub audience: &'a [String],
    /// Requested lifetime in seconds; 0: the entry's, else the policy's.
    pub ttl_seconds: i64,
    /// The registration entry's `jwt_ttl_seconds` (0: none, or not an entry).
    pub entry_ttl_seconds: i64,
}

/// A minted, self-checked token and what its ledger row records. `Debug` never shows the token.
#[derive(Clone)]
pub struct MintedJwtSvid {
    token: String,
    pub claims: JwtSvidClaims,
    pub key_id: String,
    pub token_sha256: Hash,
}

impl MintedJwtSvid {
    /// The compact JWS: return it to the caller only after its ledger row committed.
    pub fn token(&self) -> &str {
        &self.token
    }
}

impl fmt::Debug for MintedJwtSvid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MintedJwtSvid")
            .field("token", &"…")
            .field("claims", &self.claims)
            .field("key_id", &self.key_id)
            .finish()
    }
}

/// Why a token was not minted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtMintError {
    /// The request breaks a rule (gRPC `InvalidArgument`); the message names the rule.
    #[error("{0}")]
    Invalid(String),
    /// No key can sign now (gRPC `Unavailable`, retryable).
    #[error("{0}")]
    Unavailable(String),
    /// Signing or the self-check failed: our bug; logged, never returned in detail.
    #[error("JWT-SVID minting failed its self-check: {0}")]
    SelfCheck(String),
}

/// The message a caller gets while no JWT signing key is active.
pub const NO_ACTIVE_KEY: &str =
    "no JWT-SVID signing key is active; retry once the server has one (see `signetctl ca status`)";

/// Checks `audience` against the rules (see the module doc) and drops duplicates, keeping the
/// first of each, in order.
pub fn normalize_audience(audience: &[String]) -> Result<Vec<String>, JwtMintError> {
    signet_types::audience::normalize(audience).map_err(|e| JwtMintError::Invalid(e.to_string()))
}

/// The token's lifetime in seconds (see the module doc), before the key's notAfter cap.
pub fn lifetime(
    policy: &JwtIssuePolicy,
    ttl_seconds: i64,
    entry_ttl_seconds: i64,
) -> Result<u64, JwtMintError> {
    if ttl_seconds < 0 {
        return Err(JwtMintError::Invalid(format!(
            "ttl_seconds {ttl_seconds} is negative: ask for 0 (the default) or a positive lifetime"
        )));
    }
    let asked = if ttl_seconds > 0 {
        ttl_seconds.unsigned_abs()
    } else if entry_ttl_seconds > 0 {
        entry_ttl_seconds.unsigned_abs()
    } else {
        policy.ttl.as_secs()
    };
    Ok(asked.min(policy.max_ttl.as_secs()).max(1))
}

/// Mints and self-checks a JWT-SVID with `key` (`None`: no active key, Unavailable) at `now`.
pub fn mint(
    policy: &JwtIssuePolicy,
    req: &JwtMintRequest<'_>,
    now: SystemTime,
    key: Option<&ActiveJwtKey>,
) -> Result<MintedJwtSvid, JwtMintError> {
    let audience = normalize_audience(req.audience)?;
    let ttl = lifetime(policy, req.ttl_seconds, req.entry_ttl_seconds)?;
    let key = key.ok_or_else(|| JwtMintError::Unavailable(NO_ACTIVE_KEY.into()))?;
    let now_s = unix(now);
    let key_end = unix(key.not_after);
    let remaining = key_end.saturating_sub(now_s);
    if remaining < i64::try_from(MIN_KEY_REMAINING.as_secs()).unwrap_or(i64::MAX) {
        return Err(JwtMintError::Unavailable(format!(
            "the active JWT-SVID signing key {} expires in {}s; retry once the next key is active",
            key.signer.key_id(),
            remaining.max(0)
        )));
    }
    let expires_at = now_s
        .saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX))
        .min(key_end);
    let claims = JwtSvidClaims {
        subject: req.subject.clone(),
        audience,
        issued_at: now_s,
        expires_at,
        issuer: policy.issuer.clone(),
    };
    let token = key
        .signer
        .mint(&claims)
        .map_err(|e| JwtMintError::SelfCheck(format!("signing: {e}")))?;
    self_check(&token, &claims, key)?;
    Ok(MintedJwtSvid {
        token_sha256: sha256(token.as_bytes()),
        token,
        key_id: key.signer.key_id().to_owned(),
        claims,
    })
}

/// SPIRE's credvalidator for JWT-SVIDs: the token must validate with the key's own public key
/// for every audience, and say exactly what was asked.
fn self_check(token: &str, claims: &JwtSvidClaims, key: &ActiveJwtKey) -> Result<(), JwtMintError> {
    let keys = JwtKeySet::new([key.signer.public_key().clone()]);
    for aud in &claims.audience {
        let v = validate(token, aud, &keys, claims.issued_at)
            .map_err(|e| JwtMintError::SelfCheck(e.to_string()))?;
        let mismatch = if v.spiffe_id != claims.subject {
            Some("sub")
        } else if v.audience != claims.audience {
            Some("aud")
        } else if v.expires_at != claims.expires_at {
            Some("exp")
        } else if v.key_id != key.signer.key_id() {
            Some("kid")
        } else if v.issued_at != Some(claims.issued_at) {
            Some("iat")
        } else {
            None
        };
        if let Some(claim) = mismatch {
            return Err(JwtMintError::SelfCheck(format!(
                "the token's {claim} is not what was asked"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
