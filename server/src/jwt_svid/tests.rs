#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use signet_pki::jwt::{JwtKeySet, JwtSigner, validate};
use signet_pki::key::{KeyAlgorithm, generate};

use super::*;
use crate::clock::from_unix;

const NOW: i64 = 1_800_000_000;

pub(crate) fn test_key(not_after: SystemTime) -> ActiveJwtKey {
    let key = generate(KeyAlgorithm::EcdsaP256).unwrap();
    ActiveJwtKey {
        signer: Arc::new(JwtSigner::new(&key).unwrap()),
        not_after,
    }
}

fn id() -> SpiffeId {
    "spiffe://example.org/web".parse().unwrap()
}

fn auds(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn req<'a>(
    subject: &'a SpiffeId,
    audience: &'a [String],
    ttl: i64,
    entry: i64,
) -> JwtMintRequest<'a> {
    JwtMintRequest {
        subject,
        audience,
        ttl_seconds: ttl,
        entry_ttl_seconds: entry,
    }
}

#[test]
fn a_token_carries_the_claims_asked_and_validates_with_the_keys_public_half() {
    let key = test_key(from_unix(NOW + 86_400));
    let sub = id();
    let aud = auds(&["https://api.example.org", "vault"]);
    let policy = JwtIssuePolicy {
        issuer: Some("https://oidc.example.org".into()),
        ..JwtIssuePolicy::default()
    };
    let t = mint(&policy, &req(&sub, &aud, 0, 0), from_unix(NOW), Some(&key)).unwrap();
    assert_eq!(t.claims.subject, sub);
    assert_eq!(t.claims.audience, aud);
    assert_eq!(t.claims.issued_at, NOW);
    assert_eq!(t.claims.expires_at, NOW + 300);
    assert_eq!(t.key_id, key.signer.key_id());
    assert_eq!(t.token_sha256, sha256(t.token().as_bytes()));
    let keys = JwtKeySet::new([key.signer.public_key().clone()]);
    let v = validate(t.token(), "vault", &keys, NOW + 1).unwrap();
    assert_eq!(v.claims["iss"], "https://oidc.example.org");
    assert_eq!(v.key_id, key.signer.key_id());
    // Without an issuer, no iss claim.
    let t = mint(
        &JwtIssuePolicy::default(),
        &req(&sub, &aud, 0, 0),
        from_unix(NOW),
        Some(&key),
    )
    .unwrap();
    let v = validate(t.token(), "vault", &keys, NOW + 1).unwrap();
    assert!(!v.claims.contains_key("iss"));
    // The token never shows in Debug.
    assert!(!format!("{t:?}").contains(t.token()));
}

#[test]
fn the_lifetime_is_the_request_then_the_entry_then_the_default_clamped_to_max_and_the_key() {
    let p = JwtIssuePolicy::default();
    assert_eq!(lifetime(&p, 0, 0), Ok(300));
    assert_eq!(lifetime(&p, 0, 600), Ok(600));
    assert_eq!(lifetime(&p, 60, 600), Ok(60));
    assert_eq!(lifetime(&p, 7200, 0), Ok(3600));
    assert_eq!(lifetime(&p, 0, 86_400), Ok(3600));
    assert!(matches!(lifetime(&p, -1, 0), Err(JwtMintError::Invalid(m)) if m.contains("negative")));

    // exp never past the key's notAfter.
    let key = test_key(from_unix(NOW + 100));
    let sub = id();
    let aud = auds(&["a"]);
    let t = mint(&p, &req(&sub, &aud, 3600, 0), from_unix(NOW), Some(&key)).unwrap();
    assert_eq!(t.claims.expires_at, NOW + 100);
}

#[test]
fn a_key_about_to_expire_or_no_key_is_unavailable() {
    let sub = id();
    let aud = auds(&["a"]);
    let p = JwtIssuePolicy::default();
    let key = test_key(from_unix(NOW + 29));
    let err = mint(&p, &req(&sub, &aud, 0, 0), from_unix(NOW), Some(&key)).unwrap_err();
    assert!(
        matches!(&err, JwtMintError::Unavailable(m) if m.contains("expires in 29s")),
        "{err}"
    );
    let key = test_key(from_unix(NOW - 5));
    assert!(matches!(
        mint(&p, &req(&sub, &aud, 0, 0), from_unix(NOW), Some(&key)),
        Err(JwtMintError::Unavailable(_))
    ));
    let err = mint(&p, &req(&sub, &aud, 0, 0), from_unix(NOW), None).unwrap_err();
    assert_eq!(err, JwtMintError::Unavailable(NO_ACTIVE_KEY.into()));
    assert!(
        err.to_string()
            .contains("no JWT-SVID signing key is active")
    );
    // 30 s left is enough.
    let key = test_key(from_unix(NOW + 30));
    let t = mint(&p, &req(&sub, &aud, 0, 0), from_unix(NOW), Some(&key)).unwrap();
    assert_eq!(t.claims.expires_at, NOW + 30);
}

#[test]
fn audiences_follow_the_rules_and_duplicates_go_keeping_order() {
    let invalid = |list: Vec<String>, needle: &str| {
        let err = normalize_audience(&list).unwrap_err();
        assert!(
            matches!(&err, JwtMintError::Invalid(m) if m.contains(needle)),
            "{err} lacks {needle}"
        );
    };
    invalid(vec![], "no audience");
    invalid(auds(&["a", ""]), "audience 2 is empty");
    invalid(vec!["x".repeat(257)], "at most 256");
    invalid(auds(&["a\u{0}b"]), "control character");
    invalid(auds(&["a\nb"]), "control character");
    invalid((0..33).map(|i| i.to_string()).collect(), "at most 32");
    assert_eq!(normalize_audience(&["x".repeat(256)]).unwrap().len(), 1);
    assert_eq!(
        normalize_audience(&auds(&["b", "a", "b", "c", "a"])).unwrap(),
        auds(&["b", "a", "c"])
    );
    // Minting applies the same rules.
    let key = test_key(from_unix(NOW + 3600));
    let sub = id();
    let none: Vec<String> = vec![];
    assert!(matches!(
        mint(
            &JwtIssuePolicy::default(),
            &req(&sub, &none, 0, 0),
            from_unix(NOW),
            Some(&key)
        ),
        Err(JwtMintError::Invalid(_))
    ));
    let dup = auds(&["a", "a"]);
    let t = mint(
        &JwtIssuePolicy::default(),
        &req(&sub, &dup, 0, 0),
        from_unix(NOW),
        Some(&key),
    )
    .unwrap();
    assert_eq!(t.claims.audience, auds(&["a"]));
}

#[test]
fn the_self_check_refuses_a_token_that_does_not_say_what_was_asked() {
    let key = test_key(from_unix(NOW + 3600));
    let other = test_key(from_unix(NOW + 3600));
    let claims = JwtSvidClaims {
        subject: id(),
        audience: auds(&["a", "b"]),
        issued_at: NOW,
        expires_at: NOW + 300,
        issuer: None,
    };
    let good = key.signer.mint(&claims).unwrap();
    assert_eq!(self_check(&good, &claims, &key), Ok(()));
    // Signed by another key: does not validate with this key's public half.
    let foreign = other.signer.mint(&claims).unwrap();
    assert!(matches!(
        self_check(&foreign, &claims, &key),
        Err(JwtMintError::SelfCheck(_))
    ));
    // Says something else than asked.
    for change in [
        |c: &mut JwtSvidClaims| c.subject = "spiffe://example.org/other".parse().unwrap(),
        |c: &mut JwtSvidClaims| c.audience.push("c".into()),
        |c: &mut JwtSvidClaims| c.expires_at += 1,
    ] {
        let mut asked = claims.clone();
        change(&mut asked);
        let err = self_check(&good, &asked, &key).unwrap_err();
        assert!(matches!(err, JwtMintError::SelfCheck(_)), "{err}");
    }
    // An already expired token (exp before iat) fails validation.
    let mut stale = claims.clone();
    stale.expires_at = NOW;
    let t = key.signer.mint(&stale).unwrap();
    assert!(self_check(&t, &stale, &key).is_err());
    let _ = Duration::ZERO;
}
