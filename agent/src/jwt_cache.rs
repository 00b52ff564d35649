//! The agent's JWT-SVID cache: the tokens `FetchJWTSVID` hands out, minted by the server
//! (`Node/MintWorkloadJwts`) through a [`JwtMinter`] and kept per SPIFFE ID and audience set.
//!
//! The rules, in the order [`JwtCache::get`] applies them:
//! - **Key.** The SPIFFE ID and the audiences sorted and de-duplicated, held as a `Vec<String>`
//!   ([`JwtCacheKey`]), never joined into one string: `{"ab","cd"}` and `{"a","bcd"}` are two
//!   keys (SPIRE once let them collide).
//! - **Taint.** A token whose key ID is tainted is never served: the cache drops every such
//!   token as soon as it sees the new taint set (and checks again before serving).
//! - **Reuse.** A token is reused until half of its lifetime has passed (`iat + (exp-iat)/2`),
//!   then minted again.
//! - **Single flight.** Concurrent requests for one key wait for one call to the server, and
//!   share its answer: a failure too, so a server that hangs or refuses is asked once, not once
//!   per waiting request.
//! - **Server down.** When minting fails with a retryable error (the server unreachable or
//!   shedding), a cached token that has not expired is served (counted as stale), and minted
//!   again on the next request once the server answers. A refusal (the entry was deleted, the
//!   node banned) is returned, never hidden behind an old token.
//! - **Bound.** At most `capacity` keys; a new key beyond it evicts the one used least
//!   recently.
//! - **Budget.** Every call to the server takes a token from its SPIFFE ID's bucket
//!   ([`MintRate`], `workload_api.jwt_mint_rate`). A workload asking for token after token,
//!   each for a new audience (each a cache miss, a server mint and a ledger row), is refused
//!   here (ResourceExhausted, with when to retry; an unexpired cached token is served instead
//!   when there is one) before its calls use up the node's share of the server's
//!   `issuance_per_source`, which every other workload on the node needs.
//!
//! The clock is the agent's ([`Clock`]); nothing here reads the time itself. Tokens are
//! bearer credentials: nothing here logs or shows one (`MintedJwt`'s `Debug` hides it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use signet_runtime::clock::{Clock, unix};
use signet_types::SpiffeId;

use crate::ca::{Ca, CaError, JwtRequest, MintedJwt};

/// Keys kept by default.
pub const DEFAULT_CAPACITY: usize = 4096;

/// How many server calls one SPIFFE ID's new tokens may cause: `burst` at once, refilled at
/// `per_second` (`workload_api.jwt_mint_rate`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MintRate {
    pub burst: u32,
    pub per_second: f64,
}

impl Default for MintRate {
    /// Below the server's default `limits.issuance_per_caller` (burst 100, 10/s), so the agent
    /// refuses first and the server never sees the flood.
    fn default() -> Self {
        Self {
            burst: 50,
            per_second: 5.0,
        }
    }
}

/// A SPIFFE ID's remaining budget of server calls, as of `at`.
#[derive(Debug, Clone, Copy)]
struct Budget {
    tokens: f64,
    at: tokio::time::Instant,
}

/// What a cached token is for: a SPIFFE ID and its sorted, de-duplicated audiences, each kept
/// whole.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JwtCacheKey {
    spiffe_id: String,
    audience: Vec<String>,
}

impl JwtCacheKey {
    pub fn new(spiffe_id: &SpiffeId, audience: &[String]) -> Self {
        let mut audience = audience.to_vec();
        audience.sort();
        audience.dedup();
        Self {
            spiffe_id: spiffe_id.to_string(),
            audience,
        }
    }

    /// The audiences, sorted and de-duplicated (what is sent to the server).
    pub fn audience(&self) -> &[String] {
        &self.audience
    }
}

/// Mints one JWT-SVID for a registration entry.
#[async_trait::async_trait]
pub trait JwtMinter: Send + Sync {
    async fn mint(&self, entry_id: &str, audience: &[String]) -> Result<MintedJwt, CaError>;
}

/// [`JwtMinter`] through the agent's connection to the server.
pub struct CaMinter<C: ?Sized>(pub Arc<C>);

#[async_trait::async_trait]
impl<C: Ca + ?Sized> JwtMinter for CaMinter<C> {
    async fn mint(&self, entry_id: &str, audience: &[String]) -> Result<MintedJwt, CaError> {
        let req = JwtRequest {
            entry_id: entry_id.to_owned(),
            audience: audience.to_vec(),
        };
        let mut results = self.0.mint_workload_jwts(vec![req]).await?;
        match (results.pop(), results.is_empty()) {
            (Some((id, r)), true) if id == entry_id => r,
            _ => Err(CaError::Invalid(
                "the server did not answer the one JWT-SVID request it was sent".into(),
            )),
        }
    }
}

/// Where a served token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Reused: less than half of its lifetime has passed.
    Cached,
    /// Minted for this request.
    Minted,
    /// Past half of its lifetime, but the server could not be reached: served until it
    /// expires.
    Stale,
}

impl Served {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Served::Cached => "cache",
            Served::Minted => "minted",
            Served::Stale => "stale",
        }
    }
}

/// Why no token can be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtCacheError {
    /// The server did not mint it (unreachable, shedding, refusing) and no unexpired token is
    /// cached.
    #[error("JWT-SVID for {spiffe_id}: {source}")]
    Mint {
        spiffe_id: String,
        #[source]
        source: CaError,
    },
    /// The server answered with a token for another SPIFFE ID or that is already expired.
    #[error("JWT-SVID for {spiffe_id}: the server answered {why}")]
    BadToken { spiffe_id: String, why: String },
    /// This SPIFFE ID asked for more new tokens than `workload_api.jwt_mint_rate` allows.
    #[error(
        "JWT-SVID for {spiffe_id}: more new tokens asked than this agent allows one identity \
         (workload_api.jwt_mint_rate); retry in {} ms",
        retry_after.as_millis()
    )]
    Limited {
        spiffe_id: String,
        retry_after: std::time::Duration,
    },
}

struct Slot {
    /// Tick of the last request (for least-recently-used eviction).
    last_used: AtomicU64,
    /// Held across a call to the server: concurrent requests for the key wait on it.
    token: tokio::sync::Mutex<Option<MintedJwt>>,
    /// Calls to the server made for this key so far (changed under `token`).
    attempts: AtomicU64,
    /// The last call's error, `None` after a success (written under `token`).
    last_error: Mutex<Option<CaError>>,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<JwtCacheKey, Arc<Slot>>,
    tick: u64,
    /// The taint set last applied.
    tainted: Arc<[String]>,
}

/// See the module documentation.
pub struct JwtCache {
    minter: Arc<dyn JwtMinter>,
    clock: Arc<dyn Clock>,
    capacity: usize,
    inner: Mutex<Inner>,
    rate: MintRate,
    /// Per SPIFFE ID (only identities a caller was entitled to: bounded by the entries).
    budgets: Mutex<HashMap<String, Budget>>,
}

impl JwtCache {
    pub fn new(minter: Arc<dyn JwtMinter>, clock: Arc<dyn Clock>, capacity: usize) -> Self {
        Self {
            minter,
            clock,
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
            rate: MintRate::default(),
            budgets: Mutex::new(HashMap::new()),
        }
    }

    /// Each SPIFFE ID's budget of server calls (see the module documentation).
    pub fn with_mint_rate(mut self, rate: MintRate) -> Self {
        self.rate = rate;
        self
    }

    /// Takes one server call from `spiffe_id`'s budget, or says when there is one.
    fn take_budget(&self, spiffe_id: &SpiffeId) -> Result<(), std::time::Duration> {
        let (burst, per_second) = (f64::from(self.rate.burst), self.rate.per_second);
        let now = self.clock.monotonic();
        let mut budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        let b = budgets.entry(spiffe_id.to_string()).or_insert(Budget {
            tokens: burst,
            at: now,
        });
        let add = now.saturating_duration_since(b.at).as_secs_f64() * per_second;
        b.tokens = (b.tokens + add).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - b.tokens) / per_second.max(f64::MIN_POSITIVE);
        Err(std::time::Duration::from_secs_f64(wait.min(3600.0))
            .max(std::time::Duration::from_millis(1)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every cached token signed by a key in `tainted` (the complete current set), once
    /// per new set. A token being minted right now is checked when it is served.
    pub fn apply_taints(&self, tainted: &Arc<[String]>) {
        let mut inner = self.lock();
        if *inner.tainted == **tainted {
            return;
        }
        inner.tainted = tainted.clone();
        if tainted.is_empty() {
            return;
        }
        let mut dropped = 0usize;
        for slot in inner.slots.values() {
            if let Ok(mut t) = slot.token.try_lock()
                && t.as_ref().is_some_and(|t| tainted.contains(&t.key_id))
            {
                *t = None;
                dropped += 1;
            }
        }
        tracing::info!(dropped, "cached JWT-SVIDs signed by a tainted key dropped");
    }

    /// The slot for `key`, made (evicting the least recently used beyond the bound) if new.
    fn slot(&self, key: JwtCacheKey) -> Arc<Slot> {
        let mut inner = self.lock();
        inner.tick += 1;
        let tick = inner.tick;
        if let Some(s) = inner.slots.get(&key) {
            s.last_used.store(tick, Ordering::Relaxed);
            return s.clone();
        }
        while inner.slots.len() >= self.capacity {
            let oldest = inner
                .slots
                .iter()
                .min_by_key(|(_, s)| s.last_used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => inner.slots.remove(&k),
                None => break,
            };
        }
        let slot = Arc::new(Slot {
            last_used: AtomicU64::new(tick),
            token: tokio::sync::Mutex::new(None),
            attempts: AtomicU64::new(0),
            last_error: Mutex::new(None),
        });
        inner.slots.insert(key, slot.clone());
        slot
    }

    fn is_tainted(&self, key_id: &str) -> bool {
        self.lock().tainted.iter().any(|k| k == key_id)
    }

    /// A JWT-SVID for `spiffe_id` (minted for the entry `entry_id`, which must name it) and
    /// `audience` (at least one; the caller checks), by the rules of the module
    /// documentation.
    pub async fn get(
        &self,
        entry_id: &str,
        spiffe_id: &SpiffeId,
        audience: &[String],
    ) -> Result<(MintedJwt, Served), JwtCacheError> {
        let key = JwtCacheKey::new(spiffe_id, audience);
        let slot = self.slot(key.clone());
        let seen = slot.attempts.load(Ordering::SeqCst);
        let mut held = slot.token.lock().await;
        let now = unix(self.clock.now());
        if held.as_ref().is_some_and(|t| self.is_tainted(&t.key_id)) {
            *held = None;
        }
        if let Some(t) = held.as_ref()
            && now < half_life(t)
        {
            return Ok((t.clone(), Served::Cached));
        }
        // A call for this key ended while this request waited for it and failed: its answer
        // is this request's too (no second call).
        let shared = if slot.attempts.load(Ordering::SeqCst) != seen {
            slot.last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        } else {
            None
        };
        let result = match shared {
            Some(e) => Err(e),
            None => {
                if let Err(retry_after) = self.take_budget(spiffe_id) {
                    if let Some(old) = held.as_ref()
                        && now < old.expires_at
                    {
                        return Ok((old.clone(), Served::Stale));
                    }
                    return Err(JwtCacheError::Limited {
                        spiffe_id: spiffe_id.to_string(),
                        retry_after,
                    });
                }
                let r = self.minter.mint(entry_id, key.audience()).await;
                *slot.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                    r.as_ref().err().cloned();
                slot.attempts.fetch_add(1, Ordering::SeqCst);
                r
            }
        };
        match result {
            Ok(t) => {
                let now = unix(self.clock.now());
                if t.spiffe_id != *spiffe_id {
                    return Err(JwtCacheError::BadToken {
                        spiffe_id: spiffe_id.to_string(),
                        why: format!("a token for {}", t.spiffe_id),
                    });
                }
                if t.expires_at <= now {
                    return Err(JwtCacheError::BadToken {
                        spiffe_id: spiffe_id.to_string(),
                        why: "a token that has expired".into(),
                    });
                }
                *held = Some(t.clone());
                Ok((t, Served::Minted))
            }
            Err(e) => {
                let now = unix(self.clock.now());
                match held.as_ref() {
                    Some(old) if e.is_retryable() && now < old.expires_at => {
                        tracing::debug!(
                            spiffe_id = %spiffe_id,
                            error = %e,
                            "serving a cached JWT-SVID while the server cannot mint"
                        );
                        Ok((old.clone(), Served::Stale))
                    }
                    _ => {
                        if held.as_ref().is_some_and(|o| now >= o.expires_at) {
                            *held = None;
                        }
                        Err(JwtCacheError::Mint {
                            spiffe_id: spiffe_id.to_string(),
                            source: e,
                        })
                    }
                }
            }
        }
    }
}

/// When a token is minted again: half of its lifetime after it was issued.
fn half_life(t: &MintedJwt) -> i64 {
    t.issued_at + (t.expires_at - t.issued_at) / 2
}

#[cfg(test)]
mod tests;
