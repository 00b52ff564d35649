//! The registered claims (RFC 7519 §4.1) of a verified token: `exp`, `iss`, `nbf`, `iat`, `aud`.
//!
//! [`check`] is a pure function of the claims, the expectations and `now`. `now` is what the
//! caller read from the injected [`crate::clock::Clock`] (the issuer's); nothing here reads the
//! wall clock, so a test moves time by passing another `now`. Rules, in this order:
//! 1. `exp` is required (a token that never expires is refused) and is a NumericDate;
//! 2. `iss` is the configured issuer, exactly;
//! 3. `now` is not past `exp` + leeway;
//! 4. `nbf`, if present, is not after `now` + leeway;
//! 5. `iat`, if present, is not after `now` + leeway (a token issued in the future);
//! 6. `aud` (a string or an array of strings) names at least one accepted audience.
//!
//! NumericDates may be fractional (rounded down). Times in messages are RFC 3339.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::refuse::{bad, quoted, shown};
use crate::authn::AuthnError;
use crate::clock::unix;

/// The registered claims as the payload carries them, unchecked.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Registered<'a> {
    pub iss: Option<&'a str>,
    pub aud: Option<&'a serde_json::Value>,
    pub exp: Option<&'a serde_json::Value>,
    pub nbf: Option<&'a serde_json::Value>,
    pub iat: Option<&'a serde_json::Value>,
}

/// What the claims must say.
#[derive(Debug, Clone, Copy)]
pub(super) struct Expected<'a> {
    pub issuer: &'a str,
    /// At least one of the token's audiences must be one of these.
    pub audiences: &'a [String],
    /// Allowed clock skew, in seconds, on each time check.
    pub leeway_secs: i64,
}

/// Rules 1 to 6 of the module doc, at `now`.
pub(super) fn check(
    claims: &Registered<'_>,
    want: &Expected<'_>,
    now: SystemTime,
) -> Result<(), AuthnError> {
    let Some(exp) = claims.exp else {
        return Err(bad(
            "token has no exp: legacy Secret-based or non-expiring tokens are refused; use a \
             projected service-account token",
        ));
    };
    let exp = numeric_date(exp, "exp")?;

    match claims.iss {
        Some(iss) if iss == want.issuer => {}
        Some(iss) => {
            return Err(bad(format!(
                "issuer {} is not the configured issuer {}",
                quoted(iss),
                quoted(want.issuer)
            )));
        }
        None => {
            return Err(bad(format!(
                "token has no iss; expected {}",
                quoted(want.issuer)
            )));
        }
    }

    let now_secs = unix(now);
    let leeway = want.leeway_secs;
    if now_secs > exp.saturating_add(leeway) {
        return Err(bad(format!(
            "token expired at {} (now {}); request a fresh token",
            rfc3339(exp),
            rfc3339(now_secs)
        )));
    }
    if let Some(nbf) = claims.nbf {
        let nbf = numeric_date(nbf, "nbf")?;
        if nbf > now_secs.saturating_add(leeway) {
            return Err(bad(format!(
                "token is not valid before {} (now {}); check the clocks",
                rfc3339(nbf),
                rfc3339(now_secs)
            )));
        }
    }
    if let Some(iat) = claims.iat {
        let iat = numeric_date(iat, "iat")?;
        if iat > now_secs.saturating_add(leeway) {
            return Err(bad(format!(
                "token was issued in the future, at {} (now {}); check the clocks",
                rfc3339(iat),
                rfc3339(now_secs)
            )));
        }
    }

    let auds = audiences(claims.aud)?;
    if !auds.iter().any(|a| want.audiences.iter().any(|c| c == a)) {
        return Err(bad(format!(
            "audience [{}] is not one of [{}]; request the token with one of those audiences",
            auds.iter().map(|a| shown(a)).collect::<Vec<_>>().join(", "),
            want.audiences.join(", ")
        )));
    }
    Ok(())
}

/// A JWT NumericDate: seconds since the epoch, possibly fractional.
pub(super) fn numeric_date(v: &serde_json::Value, name: &str) -> Result<i64, AuthnError> {
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

/// `aud`: a string, or a non-empty array of strings.
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

fn rfc3339(secs: i64) -> String {
    match u64::try_from(secs) {
        Ok(s) if s < 253_402_300_800 => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(s)).to_string()
        }
        _ => format!("{secs} (seconds since 1970)"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use serde_json::{Value, json};

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

    /// `check` directly: the same claims, judged at the `now` passed in and nothing else.
    #[test]
    fn time_rules_follow_the_now_passed_in() {
        let (exp, nbf, iat) = (json!(NOW + 3600), json!(NOW - 60), json!(NOW - 60));
        let aud = json!("istio-ca");
        let claims = Registered {
            iss: Some(ISSUER),
            aud: Some(&aud),
            exp: Some(&exp),
            nbf: Some(&nbf),
            iat: Some(&iat),
        };
        let audiences = vec!["istio-ca".to_owned()];
        let want = Expected {
            issuer: ISSUER,
            audiences: &audiences,
            leeway_secs: 30,
        };
        let at = |secs: u64| check(&claims, &want, UNIX_EPOCH + Duration::from_secs(secs));
        let reason = |r: Result<(), AuthnError>| r.expect_err("refused").to_string();
        assert_eq!(at(NOW), Ok(()));
        // The edges, each side of the 30 s leeway.
        assert_eq!(at(NOW + 3600 + 30), Ok(()));
        assert!(reason(at(NOW + 3600 + 31)).contains("token expired at"));
        assert_eq!(at(NOW - 60 - 30), Ok(()));
        assert!(reason(at(NOW - 60 - 31)).contains("not valid before"));
        // Without nbf, an iat in the future (for that `now`) is what refuses.
        let claims = Registered {
            nbf: None,
            ..claims
        };
        let early = check(&claims, &want, UNIX_EPOCH + Duration::from_secs(NOW - 91));
        assert!(reason(early).contains("issued in the future"));
        // Before 1970 is a time like any other, never a panic.
        let m = reason(check(&claims, &want, UNIX_EPOCH - Duration::from_secs(1)));
        assert!(m.contains("(now -1 (seconds since 1970))"), "{m}");
    }

    #[test]
    fn numeric_dates_and_audiences_have_one_shape_each() {
        assert_eq!(numeric_date(&json!(5), "exp"), Ok(5));
        assert_eq!(numeric_date(&json!(5.9), "exp"), Ok(5));
        assert_eq!(numeric_date(&json!(-0.5), "exp"), Ok(-1));
        for bad in [json!("5"), json!(1e16), json!(null), json!([1])] {
            let e = numeric_date(&bad, "nbf").expect_err("refused").to_string();
            assert!(e.contains("claim nbf is not a NumericDate"), "{bad}: {e}");
        }
        assert_eq!(audiences(Some(&json!("a"))), Ok(vec!["a".to_owned()]));
        assert_eq!(
            audiences(Some(&json!(["a", "b"]))),
            Ok(vec!["a".to_owned(), "b".to_owned()])
        );
        let cases: [(Option<Value>, &str); 5] = [
            (None, "no aud"),
            (Some(json!(null)), "no aud"),
            (Some(json!([])), "no aud"),
            (Some(json!(["a", 1])), "not a string"),
            (Some(json!({"a": 1})), "neither a string nor an array"),
        ];
        for (aud, want) in cases {
            let e = audiences(aud.as_ref()).expect_err("refused").to_string();
            assert!(e.contains(want), "{aud:?}: {e}");
        }
    }
}
