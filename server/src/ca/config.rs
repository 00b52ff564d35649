//! The `[ca]` configuration section: lifetimes, rotation thresholds, a plugged-in CA's files,
//! the key-encryption key. Owned by the CA (the key manager reads it); `crate::config`
//! assembles it into the whole configuration and turns its errors into `ConfigError`s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::KeyType;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaConfig {
    /// Key type of a generated root.
    pub key_type: KeyType,
    /// TTL of an issued certificate when the request names none.
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    /// Longest TTL ever issued; longer requests are clamped to it.
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    /// Lifetime of a generated root. The root signs only intermediates.
    #[serde(with = "humantime_serde")]
    pub root_ttl: Duration,
    /// Lifetime of a generated intermediate (the key that signs workload certificates; never
    /// beyond its root's notAfter). Default 48h: a stolen intermediate key is good for at most
    /// two days against relying parties that do not check CRLs (7 days before; SPIRE's CA uses
    /// 24h). Not shorter: certificates of the default life (1h) always get their full life,
    /// and one of `ca.max_ttl` (24h) does for the first 24 of the 40 hours the intermediate is
    /// active (then it is cut to the intermediate's notAfter, as no leaf outlives its issuer);
    /// the 8 hours between its successor's activation and its end cover lagging replicas.
    #[serde(with = "humantime_serde")]
    pub intermediate_ttl: Duration,
    /// The next intermediate is prepared at this fraction of the active one's lifetime…
    pub intermediate_prepare_at: f64,
    /// …and activated (the old one retired) at this fraction.
    pub intermediate_activate_at: f64,
    /// The next root is prepared (published in the bundle, signing nothing) at this fraction
    /// of the active root's lifetime…
    pub root_prepare_at: f64,
    /// …and activated at this fraction, but never before it has been in the bundle for
    /// `root_propagation`.
    pub root_activate_at: f64,
    /// How long a new root is in the trust bundle before anything chains to it, so that every
    /// relying party (bundle stream, agents, sinks, the bridge's ConfigMaps) has it first.
    #[serde(with = "humantime_serde")]
    pub root_propagation: Duration,
    /// Each threshold moves by up to ± this fraction of the key's lifetime (derived from the
    /// key ID, so every replica agrees).
    pub rotation_jitter: f64,
    /// How often the rotator checks the thresholds and re-reads the slots (another replica's
    /// transitions, a plugged-in CA's files); ±10% jitter.
    #[serde(with = "humantime_serde")]
    pub rotation_interval: Duration,
    /// Plugged-in CA, in the layout of Istio's `cacerts`: `ca-cert.pem` (signing cert),
    /// `ca-key.pem` (its key), `cert-chain.pem` (chain to the root), `root-cert.pem`.
    /// All four or none.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub chain_file: Option<PathBuf>,
    pub root_file: Option<PathBuf>,
    /// Key-encryption key for CA keys stored in the database: a file holding 32 random bytes
    /// (base64). When absent, `<data_dir>/kek` is created (mode 0600) on first start. Replicas
    /// sharing one PostgreSQL must share this key.
    pub kek_file: Option<PathBuf>,
}

impl Default for CaConfig {
    fn default() -> Self {
        Self {
            key_type: KeyType::default(),
            default_ttl: Duration::from_secs(3600),
            max_ttl: Duration::from_secs(24 * 3600),
            root_ttl: Duration::from_secs(10 * 365 * 24 * 3600),
            intermediate_ttl: Duration::from_secs(48 * 3600),
            intermediate_prepare_at: 0.5,
            intermediate_activate_at: 5.0 / 6.0,
            root_prepare_at: 0.5,
            root_activate_at: 5.0 / 6.0,
            root_propagation: Duration::from_secs(24 * 3600),
            rotation_jitter: 0.02,
            rotation_interval: Duration::from_secs(10),
            cert_file: None,
            key_file: None,
            chain_file: None,
            root_file: None,
            kek_file: None,
        }
    }
}

/// The plugged-in CA files, when all four are configured.
#[derive(Debug, Clone)]
pub struct PluggedCaFiles<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub chain: &'a Path,
    pub root: &'a Path,
}

/// Why the `[ca]` section is refused; `crate::config` shows it as a configuration error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CaConfigError {
    #[error("ca.root_ttl and ca.intermediate_ttl must be positive")]
    NonPositiveTtl,
    #[error(
        "ca.intermediate_ttl ({}) is longer than ca.root_ttl ({})",
        humantime::format_duration(*.intermediate),
        humantime::format_duration(*.root)
    )]
    IntermediateOutlivesRoot {
        intermediate: Duration,
        root: Duration,
    },
    #[error("ca.rotation_jitter ({0}) must be in [0, 0.25)")]
    Jitter(f64),
    /// `what` is `intermediate` or `root`.
    #[error(
        "ca.{what}_prepare_at ({prepare}) and ca.{what}_activate_at ({activate}) must satisfy \
         0 < prepare < activate < 1 with room for ca.rotation_jitter ({jitter}) on each side"
    )]
    Thresholds {
        what: &'static str,
        prepare: f64,
        activate: f64,
        jitter: f64,
    },
    #[error("ca.rotation_interval must be at least 100ms")]
    RotationInterval,
    #[error(
        "ca.cert_file, ca.key_file, ca.chain_file and ca.root_file go together: set all four or none"
    )]
    PartlyPlugged,
}

impl CaConfig {
    /// The rotation thresholds and lifetimes must make sense together.
    pub fn validate_rotation(&self) -> Result<(), CaConfigError> {
        if self.root_ttl.is_zero() || self.intermediate_ttl.is_zero() {
            return Err(CaConfigError::NonPositiveTtl);
        }
        if self.intermediate_ttl > self.root_ttl {
            return Err(CaConfigError::IntermediateOutlivesRoot {
                intermediate: self.intermediate_ttl,
                root: self.root_ttl,
            });
        }
        let j = self.rotation_jitter;
        if !(0.0..0.25).contains(&j) {
            return Err(CaConfigError::Jitter(j));
        }
        for (what, p, a) in [
            (
                "intermediate",
                self.intermediate_prepare_at,
                self.intermediate_activate_at,
            ),
            ("root", self.root_prepare_at, self.root_activate_at),
        ] {
            if !(p > j && p + j < a - j && a + j < 1.0) {
                return Err(CaConfigError::Thresholds {
                    what,
                    prepare: p,
                    activate: a,
                    jitter: j,
                });
            }
        }
        if self.rotation_interval < Duration::from_millis(100) {
            return Err(CaConfigError::RotationInterval);
        }
        Ok(())
    }

    pub fn plugged(&self) -> Result<Option<PluggedCaFiles<'_>>, CaConfigError> {
        match (
            &self.cert_file,
            &self.key_file,
            &self.chain_file,
            &self.root_file,
        ) {
            (None, None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(chain), Some(root)) => Ok(Some(PluggedCaFiles {
                cert,
                key,
                chain,
                root,
            })),
            _ => Err(CaConfigError::PartlyPlugged),
        }
    }
}
