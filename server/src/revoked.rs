//! What a CRL lists, and how: the revocation reasons Signet records (RFC 5280 CRLReason), one
//! revoked entry, the `[crl]` settings. A leaf below the revoker (`crate::revocation`), the CRL
//! publisher (`crate::crl`), the CA key manager (a root's revoked intermediates) and the
//! configuration, so each of them imports it and none imports another for it.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use signet_pki::CrlReason;

use crate::store::RevokedRow;

/// A reason a Signet revocation may give: an RFC 5280 §5.3.1 CRLReason ([`CrlReason`], whose
/// codes and names are read and written in `signet_pki` only) that is final, so neither
/// `certificateHold` nor `removeFromCRL`: a Signet revocation is never lifted. Only
/// [`Reason::try_from`] and [`str::parse`] build one, so the revoker cannot be handed a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reason(CrlReason);

/// A [`CrlReason`] an operator may not revoke for (a hold, its removal, an undefined code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not a final revocation reason")]
pub struct NotFinal(pub CrlReason);

impl TryFrom<CrlReason> for Reason {
    type Error = NotFinal;

    fn try_from(r: CrlReason) -> Result<Self, NotFinal> {
        if r.is_final() {
            Ok(Self(r))
        } else {
            Err(NotFinal(r))
        }
    }
}

impl From<Reason> for CrlReason {
    fn from(r: Reason) -> Self {
        r.0
    }
}

impl Reason {
    pub const UNSPECIFIED: Reason = Reason(CrlReason::Unspecified);
    pub const KEY_COMPROMISE: Reason = Reason(CrlReason::KeyCompromise);
    pub const CA_COMPROMISE: Reason = Reason(CrlReason::CaCompromise);
    pub const SUPERSEDED: Reason = Reason(CrlReason::Superseded);
    pub const CESSATION_OF_OPERATION: Reason = Reason(CrlReason::CessationOfOperation);

    /// Every reason an operator may give, in code order.
    pub fn all() -> impl Iterator<Item = Reason> {
        CrlReason::DEFINED
            .into_iter()
            .filter_map(|r| Reason::try_from(r).ok())
    }

    /// The RFC 5280 name (stored in the ledger).
    pub fn name(self) -> &'static str {
        // Every final reason is a defined one, so it has a name.
        self.0.name().unwrap_or("unspecified")
    }

    /// The CRLReason code.
    #[cfg(test)]
    pub fn code(self) -> u8 {
        self.0.code()
    }

    pub(crate) fn to_rcgen(self) -> rcgen::RevocationReason {
        use rcgen::RevocationReason as R;
        match self.0 {
            CrlReason::KeyCompromise => R::KeyCompromise,
            CrlReason::CaCompromise => R::CaCompromise,
            CrlReason::AffiliationChanged => R::AffiliationChanged,
            CrlReason::Superseded => R::Superseded,
            CrlReason::CessationOfOperation => R::CessationOfOperation,
            CrlReason::PrivilegeWithdrawn => R::PrivilegeWithdrawn,
            CrlReason::AaCompromise => R::AaCompromise,
            // Unspecified, and (never built, see `Reason`) anything not final.
            _ => R::Unspecified,
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
#[error("unknown revocation reason {0:?} (one of: {names})", names = Reason::all().map(Reason::name).collect::<Vec<_>>().join(", "))]
pub struct UnknownReason(pub String);

impl std::str::FromStr for Reason {
    type Err = UnknownReason;

    /// The RFC 5280 name of a final reason in any case, with or without `-` / `_`
    /// (`keyCompromise`, `key-compromise`, `KEY_COMPROMISE`).
    fn from_str(s: &str) -> Result<Self, UnknownReason> {
        s.parse::<CrlReason>()
            .ok()
            .and_then(|r| Reason::try_from(r).ok())
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
    pub fn validate(&self) -> Result<(), CrlConfigError> {
        if self.next_update < Duration::from_secs(2) {
            return Err(CrlConfigError::NextUpdateTooShort);
        }
        if self.poll_interval.is_zero() {
            return Err(CrlConfigError::ZeroPollInterval);
        }
        Ok(())
    }
}

/// Why a [`CrlConfig`] is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CrlConfigError {
    /// A shorter validity leaves no time to publish the next CRL before this one expires.
    #[error("crl.next_update must be at least 2s")]
    NextUpdateTooShort,
    /// The poll for other replicas' revocations would spin.
    #[error("crl.poll_interval must be positive")]
    ZeroPollInterval,
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
            reason: r.reason.parse().unwrap_or(Reason::UNSPECIFIED),
            not_after: r.not_after,
        }
    }
}
