//! What a CRL lists, and how: the revocation reasons Signet records (RFC 5280 CRLReason), one
//! revoked entry, the `[crl]` settings. A leaf below the revoker (`crate::revocation`), the CRL
//! publisher (`crate::crl`), the CA key manager (a root's revoked intermediates) and the
//! configuration, so each of them imports it and none imports another for it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::RevokedRow;

/// RFC 5280 §5.3.1 CRLReason, without `certificateHold` and `removeFromCRL`: a Signet
/// revocation is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Unspecified,
    KeyCompromise,
    CaCompromise,
    AffiliationChanged,
    Superseded,
    CessationOfOperation,
    PrivilegeWithdrawn,
    AaCompromise,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::Unspecified,
        Reason::KeyCompromise,
        Reason::CaCompromise,
        Reason::AffiliationChanged,
        Reason::Superseded,
        Reason::CessationOfOperation,
        Reason::PrivilegeWithdrawn,
        Reason::AaCompromise,
    ];

    /// The RFC 5280 name (stored in the ledger).
    pub fn name(self) -> &'static str {
        match self {
            Reason::Unspecified => "unspecified",
            Reason::KeyCompromise => "keyCompromise",
            Reason::CaCompromise => "cACompromise",
            Reason::AffiliationChanged => "affiliationChanged",
            Reason::Superseded => "superseded",
            Reason::CessationOfOperation => "cessationOfOperation",
            Reason::PrivilegeWithdrawn => "privilegeWithdrawn",
            Reason::AaCompromise => "aACompromise",
        }
    }

    /// The CRLReason code.
    #[cfg(test)]
    pub fn code(self) -> u8 {
        match self {
            Reason::Unspecified => 0,
            Reason::KeyCompromise => 1,
            Reason::CaCompromise => 2,
            Reason::AffiliationChanged => 3,
            Reason::Superseded => 4,
            Reason::CessationOfOperation => 5,
            Reason::PrivilegeWithdrawn => 9,
            Reason::AaCompromise => 10,
        }
    }

    pub(crate) fn to_rcgen(self) -> rcgen::RevocationReason {
        use rcgen::RevocationReason as R;
        match self {
            Reason::Unspecified => R::Unspecified,
            Reason::KeyCompromise => R::KeyCompromise,
            Reason::CaCompromise => R::CaCompromise,
            Reason::AffiliationChanged => R::AffiliationChanged,
            Reason::Superseded => R::Superseded,
            Reason::CessationOfOperation => R::CessationOfOperation,
            Reason::PrivilegeWithdrawn => R::PrivilegeWithdrawn,
            Reason::AaCompromise => R::AaCompromise,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Text that names no [`Reason`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown revocation reason {0:?} (one of: {names})", names = Reason::ALL.map(Reason::name).join(", "))]
pub struct UnknownReason(pub String);

impl std::str::FromStr for Reason {
    type Err = UnknownReason;

    /// The RFC 5280 name in any case, with or without `-` / `_` (`keyCompromise`,
    /// `key-compromise`, `KEY_COMPROMISE`).
    fn from_str(s: &str) -> Result<Self, UnknownReason> {
        let norm = |n: &str| {
            n.chars()
                .filter(|c| *c != '-' && *c != '_')
                .flat_map(char::to_lowercase)
                .collect::<String>()
        };
        let want = norm(s);
        Reason::ALL
            .into_iter()
            .find(|r| norm(r.name()) == want)
            .ok_or_else(|| UnknownReason(s.to_owned()))
    }
}

/// `[crl]` in the server configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct CrlConfig {
    /// nextUpdate - thisUpdate of every CRL. A new CRL is signed on every revocation, and at
    /// the latest when half of this has passed.
    #[serde(with = "humantime_serde")]
    pub next_update: Duration,
    /// How often a server checks the database for revocations made by other replicas.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
}

impl Default for CrlConfig {
    fn default() -> Self {
        Self {
            next_update: Duration::from_secs(24 * 3600),
            poll_interval: Duration::from_secs(10),
        }
    }
}

impl CrlConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.next_update < Duration::from_secs(2) {
            return Err("crl.next_update must be at least 2s".into());
        }
        if self.poll_interval.is_zero() {
            return Err("crl.poll_interval must be positive".into());
        }
        Ok(())
    }
}

/// One revoked certificate as a CRL lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedEntry {
    /// Lowercase hex of the serial's DER integer content, as in the ledger.
    pub serial: String,
    /// Unix seconds.
    pub revoked_at: i64,
    pub reason: Reason,
    /// The certificate's notAfter (unix seconds): past it, the entry may leave the CRL.
    pub not_after: i64,
}

impl RevokedEntry {
    /// From the store's row; an unreadable reason is listed as `unspecified`.
    pub fn from_row(r: &RevokedRow) -> Self {
        Self {
            serial: r.serial.clone(),
            revoked_at: r.revoked_at,
            reason: r.reason.parse().unwrap_or(Reason::Unspecified),
            not_after: r.not_after,
        }
    }
}
