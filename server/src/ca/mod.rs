//! The CA core: sans-I/O.
//!
//! Functions of (CA key, verified CSR, grant, now, serial source) -> certificate. Nothing here
//! reads the clock, the network or the database. The identity and names in a certificate come
//! from the [`Grant`] (decided by policy from the authenticated caller), never from the CSR;
//! the CSR contributes only its public key, and a CSR asking for anything outside the grant is
//! refused.
//!
//! - [`csr`]: parse and verify PKCS#10 requests into [`csr::VerifiedCsr`].
//! - [`authority`]: a signing CA ([`Authority`]): generated root or plugged-in Istio `cacerts`.
//! - [`issue`]: issuing one leaf, the one-way pipeline template -> sign -> validate.
//! - [`template`]: what goes into a certificate before signing (the X509-SVID leaf profile, the
//!   CA certificates Signet generates).
//! - [`validate`]: re-checks every certificate the core signed before it leaves.
//! - `time`: whole-second certificate time.
//! - [`kek`]: encryption of CA private keys kept in the database.
//! - [`serial`]: serial number sources.
//! - [`rotator`]: which CA key transition is due (pure: slots, time, seeded jitter).
//! - [`config`]: the `[ca]` configuration section.
//! - [`jwt_key`]: the active JWT-SVID signing key, as issuance asks for it.
//! - [`manager`]: the CA key slots: loading, creation, sealing, transitions, the published view.

pub mod authority;
pub mod config;
pub mod csr;
mod issue;
pub mod jwt_key;
pub mod kek;
pub mod manager;
pub mod rotator;
pub mod serial;
pub mod template;
#[cfg(test)]
mod testutil;
pub(crate) mod time;
pub mod validate;

use std::net::IpAddr;
use std::time::SystemTime;

use signet_types::SpiffeId;

pub use authority::Authority;
pub use serial::{RandomSerials, SerialSource};

/// The CA key algorithm Signet generates (`[ca] key_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum KeyType {
    #[default]
    EcdsaP256,
    EcdsaP384,
}

/// Shared with policy, defined below both (`crate::issuance`).
pub use crate::issuance::{BACKDATE, RequestedNames};

/// What policy decided the caller may have: defined by policy, which alone makes one.
pub use crate::policy::grant::Grant;

/// A certificate the core signed and re-validated.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// The leaf, DER.
    pub der: Vec<u8>,
    /// The full chain: leaf first, then intermediates, the root last.
    pub chain: Vec<Vec<u8>>,
    /// Lowercase hex of the serial's DER integer content (no leading zero byte).
    pub serial: String,
    pub spiffe_id: SpiffeId,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// SHA-256 of `der`.
    pub sha256: [u8; 32],
    /// Which CA key signed it.
    pub ca_key_id: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("serial", &self.serial)
            .field("spiffe_id", &self.spiffe_id)
            .field("dns_names", &self.dns_names)
            .field("not_after", &self.not_after)
            .field("ca_key_id", &self.ca_key_id)
            .finish_non_exhaustive()
    }
}

/// Why the core would not issue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    /// The CSR asks for a name the grant does not contain (caller's fault: PermissionDenied).
    #[error("{0}")]
    NotGranted(String),
    /// The issuing CA has expired or is not yet valid (operator's problem: Unavailable).
    #[error("the issuing CA is not valid at this time: {0}")]
    CaNotValid(String),
    /// Signing failed (internal).
    #[error("signing failed: {0}")]
    Signing(String),
    /// The signed certificate failed its own re-validation (internal; never returned to a caller).
    #[error("issued certificate failed self-check: {0}")]
    SelfCheck(validate::CertError),
}
