use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use signet_runtime::clock::FakeClock;

use super::*;

/// A minter that counts its calls, answers tokens of `ttl` seconds issued now (key ID
/// `kid`, the token naming the call), and can be made to fail or to wait for a go-ahead.
struct Counting {
    clock: FakeClock,
    calls: AtomicUsize,
    ttl: i64,
    kid: Mutex<String>,
    fail: Mutex<Option<CaError>>,
    gate: Option<tokio::sync::Semaphore>,
}

impl Counting {
    fn new(clock: &FakeClock, ttl: i64) -> Arc<Self> {
        Arc::new(Self {
            clock: clock.clone(),
            calls: AtomicUsize::new(0),
            ttl,
            kid: Mutex::new("k1".into()),
            fail: Mutex::new(None),
            gate: None,
        })
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn fail_with(&self, e: Option<CaError>) {
        *self.fail.lock().expect("lock") = e;
    }
}

#[async_trait::async_trait]
impl JwtMinter for Counting {
    async fn mint(&self, entry_id: &str, audience: &[String]) -> Result<MintedJwt, CaError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(g) = &self.gate {
            let _permit = g.acquire().await.expect("gate");
        }
        if let Some(e) = self.fail.lock().expect("lock").clone() {
            return Err(e);
        }
        let now = unix(self.clock.now());
        let spiffe_id = match entry_id {
            "liar" => "spiffe://example.org/other",
            _ => "spiffe://example.org/web",
        };
        Ok(MintedJwt {
            token: format!("token-{n}"),
            spiffe_id: spiffe_id.parse().expect("id"),
            issued_at: now,
            expires_at: now + self.ttl,
            key_id: self.kid.lock().expect("lock").clone(),
            audience: audience.to_vec(),
        })
    }
}

fn web() -> SpiffeId {
    "spiffe://example.org/web".parse().expect("id")
}

fn aud(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

fn cache(minter: Arc<Counting>, clock: &FakeClock, capacity: usize) -> JwtCache {
    JwtCache::new(minter, Arc::new(clock.clone()), capacity)
}

#[test]
fn keys_are_sorted_deduplicated_and_unambiguous() {
    let id = web();
    assert_ne!(
        JwtCacheKey::new(&id, &aud(&["ab", "cd"])),
        JwtCacheKey::new(&id, &aud(&["a", "bcd"])),
        "no joined string: the audiences stay apart"
    );
    assert_ne!(
        JwtCacheKey::new(&id, &aud(&["a,b"])),
        JwtCacheKey::new(&id, &aud(&["a", "b"]))
    );
    assert_eq!(
        JwtCacheKey::new(&id, &aud(&["b", "a", "b"])),
        JwtCacheKey::new(&id, &aud(&["a", "b"]))
    );
    assert_eq!(
        JwtCacheKey::new(&id, &aud(&["b", "a", "b"])).audience(),
        ["a", "b"]
    );
    let other: SpiffeId = "spiffe://example.org/db".parse().expect("id");
    assert_ne!(
        JwtCacheKey::new(&id, &aud(&["a"])),
        JwtCacheKey::new(&other, &aud(&["a"]))
    );
}

#[tokio::test]
async fn a_token_is_reused_until_half_its_lifetime_then_minted_again() {
    let clock = FakeClock::at_unix(1_000_000);
    let m = Counting::new(&clock, 300);
    let c = cache(m.clone(), &clock, 16);
    let (t1, s1) = c.get("e1", &web(), &aud(&["x"])).await.expect("minted");
    assert_eq!((s1, m.calls()), (Served::Minted, 1));
    clock.advance(Duration::from_secs(149));
    let (t2, s2) = c
        .get("e1", &web(), &aud(&["x", "x"]))
        .await
        .expect("cached");
    assert_eq!((s2, t2.token.as_str()), (Served::Cached, t1.token.as_str()));
    assert_eq!(m.calls(), 1);
    clock.advance(Duration::from_secs(1));
    let (t3, s3) = c.get("e1", &web(), &aud(&["x"])).await.expect("re-minted");
    assert_eq!((s3, m.calls()), (Served::Minted, 2));
    assert_ne!(t3.token, t1.token);
    // Another audience set is another token.
    let (_, s4) = c
        .get("e1", &web(), &aud(&["x", "y"]))
        .await
        .expect("minted");
    assert_eq!((s4, m.calls()), (Served::Minted, 3));
}

#[tokio::test]
async fn while_the_server_is_down_an_unexpired_token_is_served_then_refreshed() {
    let clock = FakeClock::at_unix(1_000_000);
    let m = Counting::new(&clock, 300);
    let c = cache(m.clone(), &clock, 16);
    let (t1, _) = c.get("e1", &web(), &aud(&["x"])).await.expect("minted");
    m.fail_with(Some(CaError::Unavailable("connection refused".into())));
    clock.advance(Duration::from_secs(200));
    let (t2, s2) = c.get("e1", &web(), &aud(&["x"])).await.expect("stale");
    assert_eq!((s2, t2.token.as_str()), (Served::Stale, t1.token.as_str()));
    // Expired: nothing to serve.
    clock.advance(Duration::from_secs(100));
    let e = c
        .get("e1", &web(), &aud(&["x"]))
        .await
        .expect_err("expired");
    assert!(matches!(e, JwtCacheError::Mint { .. }), "{e}");
    // The server is back.
    m.fail_with(None);
    let (t3, s3) = c.get("e1", &web(), &aud(&["x"])).await.expect("minted");
    assert_eq!(s3, Served::Minted);
    assert_ne!(t3.token, t1.token);
}

#[tokio::test]
async fn a_refusal_is_not_hidden_behind_a_cached_token() {
    let clock = FakeClock::at_unix(1_000_000);
    let m = Counting::new(&clock, 300);
    let c = cache(m.clone(), &clock, 16);
    c.get("e1", &web(), &aud(&["x"])).await.expect("minted");
    clock.advance(Duration::from_secs(200));
    m.fail_with(Some(CaError::Refused {
        code: tonic::Code::PermissionDenied,
        message: "entry deleted".into(),
    }));
    let e = c
        .get("e1", &web(), &aud(&["x"]))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("entry deleted"), "{e}");
}

#[tokio::test]
async fn the_cache_holds_at_most_its_capacity_dropping_the_least_recently_used() {
    let clock = FakeClock::at_unix(1_000_000);
    let m = Counting::new(&clock, 300);
    let c = cache(m.clone(), &clock, 2);
    c.get("e1", &web(), &aud(&["a"])).await.expect("a");
    c.get("e1", &web(), &aud(&["b"])).await.expect("b");
    c.get("e1", &web(), &aud(&["a"])).await.expect("a again");
    assert_eq!(m.calls(), 2);
    c.get("e1", &web(), &aud(&["c"])).await.expect("c evicts b");
    assert_eq!(c.len(), 2);
    c.get("e1", &web(), &aud(&["a"]))
        .await
        .expect("a still cached");
    assert_eq!(m.calls(), 3);
    c.get("e1", &web(), &aud(&["b"]))
        .await
        .expect("b minted again");
    assert_eq!(m.calls(), 4);
    assert_eq!(c.len(), 2);
}

#[tokio::test]
async fn a_taint_drops_every_token_its_key_signed_at_once() {
    let clock = FakeClock::at_unix(1_000_000);
    let m = Counting::new(&clock, 300);
    let c = cache(m.clone(), &clock, 16);
    c.get("e1", &web(), &aud(&["a"])).await.expect("a");
    c.get("e1", &web(), &aud(&["b"])).await.expect("b");
    *m.kid.lock().expect("lock") = "k2".into();
    c.apply_taints(&Arc::from(vec!["k1".to_owned()]));
    let (ta, sa) = c.get("e1", &web(), &aud(&["a"])).await.expect("a");
    let (tb, sb) = c.get("e1", &web(), &aud(&["b"])).await.expect("b");
    assert_eq!((sa, sb), (Served::Minted, Served::Minted));
    assert_eq!((ta.key_id.as_str(), tb.key_id.as_str()), ("k2", "k2"));
    // A tainted token is not served while the server is down either.
    *m.kid.lock().expect("lock") = "k3".into();
    c.get("e1", &web(), &aud(&["c"])).await.expect("c");
    m.fail_with(Some(CaError::Unavailable("down".into())));
    c.apply_taints(&Arc::from(vec!["k1".to_owned(), "k3".to_owned()]));
    c.get("e1", &web(), &aud(&["c"]))
        .await
        .expect_err("the k3 token is gone");
    assert_eq!(m.calls(), 6, "a, b, a and b again, c, then c refused");
}

#[tokio::test]
async fn concurrent_misses_for_one_key_make_one_call() {
    let clock = FakeClock::at_unix(1_000_000);
    let m = Arc::new(Counting {
        gate: Some(tokio::sync::Semaphore::new(0)),
        ..Arc::into_inner(Counting::new(&clock, 300)).expect("sole owner")
    });
    let c = Arc::new(cache(m.clone(), &clock, 16));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.get("e1", &web(), &aud(&["x"])).await })
        })
        .collect();
    // Every task has asked (one is in the minter, the rest wait for it).
    for _ in 0..1000 {
        if m.calls() >= 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    m.gate.as_ref().expect("gate").add_permits(100);
    let mut tokens = Vec::new();
    for t in tasks {
        tokens.push(t.await.expect("task").expect("token").0.token);
    }
    assert_eq!(m.calls(), 1, "one call to the server");
    tokens.dedup();
    assert_eq!(tokens, ["token-1"]);
}

#[tokio::test]
async fn concurrent_requests_share_one_failure() {
    let clock = FakeClock::at_unix(1_000_000);
    let m = Arc::new(Counting {
        gate: Some(tokio::sync::Semaphore::new(0)),
        ..Arc::into_inner(Counting::new(&clock, 300)).expect("sole owner")
    });
    m.fail_with(Some(CaError::Unavailable("server hangs".into())));
    let c = Arc::new(cache(m.clone(), &clock, 16));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.get("e1", &web(), &aud(&["x"])).await })
        })
        .collect();
    for _ in 0..1000 {
        if m.calls() >= 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    m.gate.as_ref().expect("gate").add_permits(100);
    for t in tasks {
        let e = t.await.expect("task").expect_err("the server failed");
        assert!(e.to_string().contains("server hangs"), "{e}");
    }
    assert_eq!(m.calls(), 1, "one call, its failure shared");
    // A later request asks again.
    m.fail_with(None);
    let (_, s) = c.get("e1", &web(), &aud(&["x"])).await.expect("minted");
    assert_eq!((s, m.calls()), (Served::Minted, 2));
}

#[tokio::test]
async fn a_token_for_another_identity_is_refused() {
    let clock = FakeClock::at_unix(1_000_000);
    let m = Counting::new(&clock, 300);
    let c = cache(m.clone(), &clock, 16);
    let e = c
        .get("liar", &web(), &aud(&["x"]))
        .await
        .expect_err("wrong sub");
    assert!(matches!(e, JwtCacheError::BadToken { .. }), "{e}");
    assert!(
        c.get("liar", &web(), &aud(&["x"])).await.is_err(),
        "nothing cached"
    );
}

/// Second review, finding F1: a workload flooding its agent with new audiences is refused by the
/// agent itself once its identity's budget is spent (ResourceExhausted with when to retry), so
/// its calls never reach the server, while another identity still gets new tokens; the budget
/// refills with time.
#[tokio::test]
async fn new_tokens_take_from_their_identitys_budget() {
    let clock = FakeClock::at(std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let minter = Counting::new(&clock, 300);
    let c = cache(minter.clone(), &clock, 64).with_mint_rate(MintRate {
        burst: 3,
        per_second: 1.0,
    });
    let other: SpiffeId = "spiffe://example.org/other".parse().expect("id");
    for i in 0..3 {
        c.get("e", &web(), &aud(&[&format!("a{i}")]))
            .await
            .expect("within the burst");
    }
    let err = c.get("e", &web(), &aud(&["a3"])).await.unwrap_err();
    let JwtCacheError::Limited { retry_after, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(*retry_after, Duration::from_secs(1));
    assert!(err.to_string().contains("jwt_mint_rate"), "{err}");
    assert_eq!(
        minter.calls(),
        3,
        "the refused request never reached the server"
    );
    // A token already cached is still served from the cache.
    let (_, served) = c.get("e", &web(), &aud(&["a0"])).await.expect("cached");
    assert_eq!(served, Served::Cached);
    // Another identity has a budget of its own (the minter answers for web; the cache only
    // counts what it asks).
    let _ = c.get("liar", &other, &aud(&["x"])).await;
    assert_eq!(minter.calls(), 4);
    // One second later, one more.
    clock.advance(Duration::from_secs(1));
    c.get("e", &web(), &aud(&["a3"])).await.expect("refilled");
    assert!(matches!(
        c.get("e", &web(), &aud(&["a4"])).await,
        Err(JwtCacheError::Limited { .. })
    ));
}
