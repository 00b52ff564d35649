//! A bounded memo of tokens whose signature verified: a pod sends the same projected token
//! with every request for its validity window, so its signature is verified once, not per
//! request.
//!
//! What a hit skips is only rules 1 to 3 of the parent module (shape, header, signature) and
//! the payload's decoding; every claim check (legacy refusal, `exp`/`nbf`/`iat` against the
//! `now` passed in, `iss`, `aud`, the identity) still runs on every use. The invariants:
//! - keyed by the SHA-256 of the whole token, so a hit is that exact token, byte for byte;
//! - only a verified token is ever stored (a refusal is never memoised);
//! - owned together with the key set that verified its tokens ([`super::Generation`]): a new
//!   JWKS (a re-read `jwks_file`) comes with an empty memo, replaced in the same step, so no
//!   token verified under a removed key is ever served;
//! - an entry is dropped once its token has expired (`exp` plus leeway, when every use would be
//!   refused anyway) or after [`MAX_AGE_SECS`], whichever is first, judged against the clock
//!   the caller passes in;
//! - at most [`CAPACITY`] tokens: when full, expired entries are swept (at most once a
//!   second) and a new token that still finds no room is verified every time, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::kubernetes::Payload;

/// Most tokens remembered (one per pod that calls; a few hundred bytes each).
pub(super) const CAPACITY: usize = 4096;

/// Longest an entry is kept, whatever the token's `exp` says.
pub(super) const MAX_AGE_SECS: i64 = 3600;

/// The memo's key: the SHA-256 of the token.
pub(super) type TokenKey = [u8; 32];

/// The key of `token`.
pub(super) fn key(token: &str) -> TokenKey {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut k = [0u8; 32];
    k.copy_from_slice(d.as_ref());
    k
}

struct Entry {
    payload: Arc<Payload>,
    /// Unix seconds after which the entry is not used.
    drop_after: i64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<TokenKey, Entry>,
    /// No sweep of a full memo before this (unix seconds).
    next_sweep: i64,
}

/// Verified tokens by the SHA-256 of their bytes. See the module doc.
pub(super) struct VerifiedTokens {
    inner: Mutex<Inner>,
    capacity: usize,
}

impl Default for VerifiedTokens {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl VerifiedTokens {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            inner: Mutex::default(),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map holds plain values: a panic elsewhere cannot leave it half-updated.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The verified payload of the token with this key, unless it was never verified here or
    /// its entry is past `drop_after` at `now` (unix seconds).
    pub(super) fn get(&self, key: &TokenKey, now: i64) -> Option<Arc<Payload>> {
        let mut inner = self.lock();
        match inner.map.get(key) {
            Some(e) if now <= e.drop_after => Some(e.payload.clone()),
            Some(_) => {
                inner.map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers a token whose signature verified, until `expires` (its `exp` plus leeway,
    /// unix seconds) or [`MAX_AGE_SECS`] from `now`.
    pub(super) fn insert(&self, key: TokenKey, payload: Arc<Payload>, expires: i64, now: i64) {
        let drop_after = expires.min(now.saturating_add(MAX_AGE_SECS));
        if drop_after < now {
            return;
        }
        let mut inner = self.lock();
        if inner.map.len() >= self.capacity && !inner.map.contains_key(&key) {
            if now < inner.next_sweep {
                return;
            }
            inner.next_sweep = now.saturating_add(1);
            inner.map.retain(|_, e| now <= e.drop_after);
            if inner.map.len() >= self.capacity {
                return;
            }
        }
        inner.map.insert(
            key,
            Entry {
                payload,
                drop_after,
            },
        );
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload() -> Arc<Payload> {
        Arc::new(serde_json::from_str(r#"{"sub": "x"}"#).expect("payload"))
    }

    #[test]
    fn entries_end_at_expiry_or_max_age() {
        let m = VerifiedTokens::default();
        let (a, b) = (key("a"), key("b"));
        assert_ne!(a, b);
        m.insert(a, payload(), 1_100, 1_000);
        assert!(m.get(&a, 1_000).is_some());
        assert!(m.get(&a, 1_100).is_some());
        assert!(m.get(&a, 1_101).is_none(), "past its exp");
        assert_eq!(m.len(), 0, "an expired entry is dropped on sight");
        // A token valid for a year is kept an hour at most.
        m.insert(b, payload(), 1_000 + 365 * 86_400, 1_000);
        assert!(m.get(&b, 1_000 + MAX_AGE_SECS).is_some());
        assert!(m.get(&b, 1_001 + MAX_AGE_SECS).is_none());
        // An already expired token is not stored.
        m.insert(a, payload(), 999, 1_000);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn a_full_memo_sweeps_expired_entries_at_most_once_a_second() {
        let m = VerifiedTokens::with_capacity(2);
        m.insert(key("old"), payload(), 1_005, 1_000);
        m.insert(key("long"), payload(), 2_000, 1_000);
        // Full, nothing expired: the newcomer is not stored (it is verified every time).
        m.insert(key("new"), payload(), 2_000, 1_001);
        assert!(m.get(&key("new"), 1_001).is_none());
        assert_eq!(m.len(), 2);
        // Still full, and the last sweep was less than a second ago: no sweep.
        m.insert(key("new"), payload(), 2_000, 1_001);
        assert!(m.get(&key("new"), 1_001).is_none());
        // Once "old" has expired, the next sweep makes room.
        m.insert(key("new"), payload(), 2_000, 1_006);
        assert!(m.get(&key("new"), 1_006).is_some());
        assert!(m.get(&key("long"), 1_006).is_some());
        assert_eq!(m.len(), 2);
    }
}
