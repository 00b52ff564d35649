//! The `[jwt_svid]` configuration section: the JWT-SVID signing keys (type, lifetime, rotation
//! thresholds, propagation), the lifetime of the tokens they sign, and the OpenID Connect
//! issuer with its optional TLS listener. Owned by the CA (the key manager reads the key
//! settings; issuance reads `ttl`, `max_ttl` and `issuer`); `crate::config` assembles it into the
//! whole configuration and turns its errors into `ConfigError`s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The JWT signing key algorithm (`[jwt_svid] key_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JwtKeyType {
    /// ECDSA P-256 with SHA-256.
    #[default]
    Es256,
    /// RSA-2048 with PKCS#1 v1.5 and SHA-256 (for validators that accept only RSA).
    Rs256,
}

impl JwtKeyType {
    /// The key algorithm generated for it.
    pub fn key_algorithm(self) -> signet_pki::key::KeyAlgorithm {
        match self {
            JwtKeyType::Es256 => signet_pki::key::KeyAlgorithm::EcdsaP256,
            JwtKeyType::Rs256 => signet_pki::key::KeyAlgorithm::Rsa(2048),
        }
    }
}

/// `[jwt_svid]`: every field public, so issuance can take the section as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtSvidConfig {
    /// `es256` (default) or `rs256`: the type of the JWT signing keys generated from now on.
    pub key_type: JwtKeyType,
    /// Lifetime of a JWT signing key (its self-signed certificate's validity).
    #[serde(with = "humantime_serde")]
    pub key_ttl: Duration,
    /// The next JWT key is prepared (published, signing nothing) at this fraction of the active
    /// key's lifetime…
    pub key_prepare_at: f64,
    /// …and activated at this fraction, but never before it has been published for
    /// `key_propagation` (unless the active key has expired or is tainted).
    pub key_activate_at: f64,
    /// How long a new JWT key is published (bundle, SPIFFE bundle endpoint, OIDC JWKS) before
    /// it signs, so validators never meet an unknown `kid`.
    #[serde(with = "humantime_serde")]
    pub key_propagation: Duration,
    /// Lifetime of a JWT-SVID when the entry names none.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// Longest lifetime of a JWT-SVID (entries asking for more are clamped). A retired JWT key
    /// is removed once this long has passed since its retirement.
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    /// The OpenID Connect issuer URL: tokens carry it as `iss`, and the discovery document and
    /// JWKS are served under its path. `https://` only, with a host, no port (AWS refuses
    /// one), query, fragment, user info or trailing slash.
    pub issuer: Option<String>,
    /// A TLS listener for OIDC discovery (besides `http_listen`, which serves it plainly for an
    /// ingress). Needs `oidc_tls_cert_file` and `oidc_tls_key_file`.
    pub oidc_listen: Option<SocketAddr>,
    /// PEM certificate chain (leaf first) and its private key for `oidc_listen`.
    pub oidc_tls_cert_file: Option<PathBuf>,
    pub oidc_tls_key_file: Option<PathBuf>,
}

impl Default for JwtSvidConfig {
    fn default() -> Self {
        Self {
            key_type: JwtKeyType::default(),
            key_ttl: Duration::from_secs(24 * 3600),
            key_prepare_at: 0.5,
            key_activate_at: 5.0 / 6.0,
            key_propagation: Duration::from_secs(600),
            ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(3600),
            issuer: None,
            oidc_listen: None,
            oidc_tls_cert_file: None,
            oidc_tls_key_file: None,
        }
    }
}

/// Why `[jwt_svid]` is refused; each message names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JwtSvidConfigError {
    #[error(
        "jwt_svid.ttl, jwt_svid.max_ttl, jwt_svid.key_ttl and jwt_svid.key_propagation must be \
         positive"
    )]
    NonPositive,
    #[error(
        "jwt_svid.ttl ({}) is longer than jwt_svid.max_ttl ({})",
        humantime::format_duration(*.ttl),
        humantime::format_duration(*.max_ttl)
    )]
    TtlOverMax { ttl: Duration, max_ttl: Duration },
    #[error(
        "jwt_svid.max_ttl ({}) is longer than a quarter of jwt_svid.key_ttl ({}): a key must \
         outlive the tokens it signs by far",
        humantime::format_duration(*.max_ttl),
        humantime::format_duration(*.key_ttl)
    )]
    MaxTtlOverKey {
        max_ttl: Duration,
        key_ttl: Duration,
    },
    #[error(
        "jwt_svid.key_prepare_at ({prepare}) and jwt_svid.key_activate_at ({activate}) must \
         satisfy 0 < prepare < activate < 1 with room for ca.rotation_jitter ({jitter}) on each side"
    )]
    Thresholds {
        prepare: f64,
        activate: f64,
        jitter: f64,
    },
    #[error(
        "jwt_svid.key_propagation ({}) must be shorter than the time between preparing and \
         activating a key (jwt_svid.key_ttl × (key_activate_at − key_prepare_at) = {})",
        humantime::format_duration(*.propagation),
        humantime::format_duration(*.window)
    )]
    Propagation {
        propagation: Duration,
        window: Duration,
    },
    #[error(
        "jwt_svid.key_ttl ({}) is too short: a key signs until jwt_svid.key_activate_at (+ \
         ca.rotation_jitter) of its life, and mints only with at least {} left",
        humantime::format_duration(*.key_ttl),
        humantime::format_duration(crate::jwt_svid::MIN_KEY_REMAINING)
    )]
    KeyTooShort { key_ttl: Duration },
    #[error("jwt_svid.issuer {issuer:?}: {reason}")]
    Issuer { issuer: String, reason: String },
    #[error(
        "jwt_svid.oidc_tls_cert_file and jwt_svid.oidc_tls_key_file go together: set both or neither"
    )]
    PartlyTls,
    #[error(
        "jwt_svid.oidc_listen needs jwt_svid.issuer (what it serves) and jwt_svid.oidc_tls_cert_file and oidc_tls_key_file (its TLS)"
    )]
    OidcListen,
    #[error(
        "jwt_svid.oidc_tls_cert_file and oidc_tls_key_file are set but jwt_svid.oidc_listen is not"
    )]
    TlsWithoutListen,
}

impl JwtSvidConfig {
    /// Checks the section; `jitter` is `ca.rotation_jitter` (JWT keys rotate with it too).
    pub fn validate(&self, jitter: f64) -> Result<(), JwtSvidConfigError> {
        // A zero propagation would let a key sign as soon as it is published: validators would
        // meet its kid unknown (second review, finding F6).
        if self.ttl.is_zero()
            || self.max_ttl.is_zero()
            || self.key_ttl.is_zero()
            || self.key_propagation.is_zero()
        {
            return Err(JwtSvidConfigError::NonPositive);
        }
        if self.ttl > self.max_ttl {
            return Err(JwtSvidConfigError::TtlOverMax {
                ttl: self.ttl,
                max_ttl: self.max_ttl,
            });
        }
        if self.max_ttl > self.key_ttl / 4 {
            return Err(JwtSvidConfigError::MaxTtlOverKey {
                max_ttl: self.max_ttl,
                key_ttl: self.key_ttl,
            });
        }
        let (p, a, j) = (self.key_prepare_at, self.key_activate_at, jitter);
        if !(p > j && p + j < a - j && a + j < 1.0) {
            return Err(JwtSvidConfigError::Thresholds {
                prepare: p,
                activate: a,
                jitter: j,
            });
        }
        // The active key is replaced by key_activate_at (+ jitter) of its life; until then it
        // must keep MIN_KEY_REMAINING, or minting stops before the next key takes over.
        if self.key_ttl.mul_f64(1.0 - a - j) < crate::jwt_svid::MIN_KEY_REMAINING {
            return Err(JwtSvidConfigError::KeyTooShort {
                key_ttl: self.key_ttl,
            });
        }
        let window = self.key_ttl.mul_f64(a - p);
        if self.key_propagation >= window {
            return Err(JwtSvidConfigError::Propagation {
                propagation: self.key_propagation,
                window,
            });
        }
        if let Some(issuer) = &self.issuer {
            check_issuer(issuer).map_err(|reason| JwtSvidConfigError::Issuer {
                issuer: issuer.clone(),
                reason: reason.into(),
            })?;
        }
        match (&self.oidc_tls_cert_file, &self.oidc_tls_key_file) {
            (Some(_), Some(_)) | (None, None) => {}
            _ => return Err(JwtSvidConfigError::PartlyTls),
        }
        let tls = self.oidc_tls_cert_file.is_some();
        match self.oidc_listen {
            Some(_) if !tls || self.issuer.is_none() => Err(JwtSvidConfigError::OidcListen),
            None if tls => Err(JwtSvidConfigError::TlsWithoutListen),
            _ => Ok(()),
        }
    }

    /// The issuer's path ("" for `https://host`, `/signet` for `https://host/signet`): the
    /// discovery document is served at this path + `/.well-known/openid-configuration`, the
    /// JWKS at this path + `/keys`.
    pub fn issuer_path(&self) -> Option<String> {
        let issuer = self.issuer.as_deref()?;
        let url = url::Url::parse(issuer).ok()?;
        Some(url.path().trim_end_matches('/').to_owned())
    }
}

/// Why `issuer` is not an issuer URL relying parties accept, if it is not.
fn check_issuer(issuer: &str) -> Result<(), &'static str> {
    let url = url::Url::parse(issuer).map_err(|_| "not a URL")?;
    if url.scheme() != "https" {
        return Err("must start with https:// (OpenID Connect and AWS require TLS)");
    }
    if !url.has_host() || url.host_str().is_none_or(str::is_empty) {
        return Err("has no host");
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry user info");
    }
    if url.port().is_some() || issuer_has_port(issuer) {
        return Err("must not name a port (AWS refuses an issuer with one)");
    }
    if url.query().is_some() || issuer.contains('?') {
        return Err("must not have a query");
    }
    if url.fragment().is_some() || issuer.contains('#') {
        return Err("must not have a fragment");
    }
    // Served as routes under this path: keep it to unreserved characters.
    if !url
        .path()
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b))
    {
        return Err("its path may hold only letters, digits, '-', '.', '_', '~' and '/'");
    }
    if url.path().contains("//") {
        return Err("its path has an empty segment");
    }
    if issuer.ends_with('/') {
        return Err("must not end with a slash (tokens carry it exactly as written)");
    }
    // Exactly as written: `url` would normalise case, dot segments and escapes, and the `iss`
    // a token carries must equal what relying parties are configured with, byte for byte.
    if url.as_str() != issuer && url.as_str().trim_end_matches('/') != issuer {
        return Err(
            "is not in normal form (lowercase scheme and host, no dot segments or needless escapes)",
        );
    }
    Ok(())
}

/// Whether the authority of `issuer` ends with `:port` (`url` drops the default port 443).
fn issuer_has_port(issuer: &str) -> bool {
    let rest = issuer.strip_prefix("https://").unwrap_or(issuer);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    match host.rfind(']') {
        Some(end) => host[end..].contains(':'),
        None => host.contains(':'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_issuer(issuer: &str) -> Result<(), JwtSvidConfigError> {
        JwtSvidConfig {
            issuer: Some(issuer.into()),
            ..Default::default()
        }
        .validate(0.02)
    }

    #[test]
    fn defaults_are_valid() {
        JwtSvidConfig::default().validate(0.02).unwrap();
    }

    #[test]
    fn good_issuers_are_accepted() {
        for ok in [
            "https://oidc.example.org",
            "https://example.org/signet",
            "https://example.org/a/b",
        ] {
            with_issuer(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn bad_issuers_are_refused_with_a_reason() {
        for (bad, why) in [
            ("http://example.org", "https://"),
            ("https://", "URL"),
            ("example.org", "URL"),
            ("https://example.org:8443", "port"),
            ("https://example.org:443", "port"),
            ("https://example.org?x=1", "query"),
            ("https://example.org/#frag", "fragment"),
            ("https://user:pw@example.org", "user info"),
            ("https://example.org/", "slash"),
            ("https://example.org/signet/", "slash"),
            ("https://EXAMPLE.org", "normal form"),
            ("https://example.org/a/../b", "normal form"),
            ("https://example.org/a%20b", "path may hold only"),
            ("https://example.org/a//b", "empty segment"),
        ] {
            let e = with_issuer(bad).expect_err(bad).to_string();
            assert!(e.starts_with("jwt_svid.issuer"), "{bad}: {e}");
            assert!(e.contains(why), "{bad}: {e} (expected {why:?})");
        }
    }

    #[test]
    fn lifetimes_and_thresholds_are_checked() {
        let c = JwtSvidConfig {
            ttl: Duration::from_secs(7200),
            ..Default::default()
        };
        assert!(matches!(
            c.validate(0.02),
            Err(JwtSvidConfigError::TtlOverMax { .. })
        ));
        let c = JwtSvidConfig {
            max_ttl: Duration::from_secs(7 * 3600),
            ..Default::default()
        };
        let e = c.validate(0.02).unwrap_err();
        assert!(e.to_string().contains("jwt_svid.max_ttl"), "{e}");
        let c = JwtSvidConfig {
            key_prepare_at: 0.9,
            ..Default::default()
        };
        assert!(matches!(
            c.validate(0.02),
            Err(JwtSvidConfigError::Thresholds { .. })
        ));
        let c = JwtSvidConfig {
            key_propagation: Duration::from_secs(9 * 3600),
            ..Default::default()
        };
        assert!(matches!(
            c.validate(0.02),
            Err(JwtSvidConfigError::Propagation { .. })
        ));
        let c = JwtSvidConfig {
            key_propagation: Duration::ZERO,
            ..Default::default()
        };
        let e = c.validate(0.02).unwrap_err();
        assert!(e.to_string().contains("key_propagation must be"), "{e}");
        // A key that would have under 30 s left while still active: minting would stop.
        let c = JwtSvidConfig {
            key_ttl: Duration::from_secs(24),
            ttl: Duration::from_secs(2),
            max_ttl: Duration::from_secs(6),
            key_prepare_at: 0.25,
            key_activate_at: 0.5,
            key_propagation: Duration::from_secs(3),
            ..Default::default()
        };
        let e = c.validate(0.0).unwrap_err();
        assert!(matches!(e, JwtSvidConfigError::KeyTooShort { .. }), "{e}");
        assert!(e.to_string().contains("30s left"), "{e}");
    }

    #[test]
    fn oidc_listener_needs_issuer_and_tls() {
        let listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        let c = JwtSvidConfig {
            oidc_listen: listen,
            issuer: Some("https://example.org".into()),
            ..Default::default()
        };
        assert_eq!(c.validate(0.02), Err(JwtSvidConfigError::OidcListen));
        let c = JwtSvidConfig {
            oidc_tls_cert_file: Some("c.pem".into()),
            ..Default::default()
        };
        assert_eq!(c.validate(0.02), Err(JwtSvidConfigError::PartlyTls));
        let c = JwtSvidConfig {
            oidc_tls_cert_file: Some("c.pem".into()),
            oidc_tls_key_file: Some("k.pem".into()),
            ..Default::default()
        };
        assert_eq!(c.validate(0.02), Err(JwtSvidConfigError::TlsWithoutListen));
        let c = JwtSvidConfig {
            oidc_listen: listen,
            issuer: Some("https://example.org".into()),
            oidc_tls_cert_file: Some("c.pem".into()),
            oidc_tls_key_file: Some("k.pem".into()),
            ..Default::default()
        };
        c.validate(0.02).unwrap();
    }

    #[test]
    fn issuer_path_is_the_url_path() {
        let c = |i: &str| JwtSvidConfig {
            issuer: Some(i.into()),
            ..Default::default()
        };
        assert_eq!(c("https://example.org").issuer_path().as_deref(), Some(""));
        assert_eq!(
            c("https://example.org/signet").issuer_path().as_deref(),
            Some("/signet")
        );
    }
}
