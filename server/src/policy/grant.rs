//! What policy decided a caller may have: the [`Grant`], the only source of a certificate's
//! identity, names and lifetime (the CA core signs exactly what it says, see `crate::ca`).
//!
//! Invariant: only policy makes a `Grant` ([`super::Policy::decide`]); its fields are private
//! to `crate::policy`, everyone else reads them through the accessors. So a certificate can
//! only carry what the chain of checks allowed.

use std::net::IpAddr;
use std::time::Duration;

use signet_types::SpiffeId;

use crate::provenance::Provenance;

/// What policy decided the caller may have. The only source of a certificate's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub(in crate::policy) spiffe_id: SpiffeId,
    pub(in crate::policy) dns_names: Vec<String>,
    pub(in crate::policy) ip_addresses: Vec<IpAddr>,
    pub(in crate::policy) ttl: Duration,
    pub(in crate::policy) provenance: Provenance,
}

impl Grant {
    /// The identity, the certificate's one URI SAN.
    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }

    /// DNS SANs to include (already checked against what the caller may have).
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// IP SANs to include.
    pub fn ip_addresses(&self) -> &[IpAddr] {
        &self.ip_addresses
    }

    /// Lifetime, already clamped to the configured maximum. The core also caps notAfter at
    /// the issuing CA's notAfter.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Where the authority for this grant came from; recorded in the ledger with the
    /// certificate (the core itself does not look at it).
    pub fn provenance(&self) -> &Provenance {
        &self.provenance
    }
}

/// Grants made by hand, for the CA core's own tests (which test what the core does with a
/// grant, not how policy decides one).
#[cfg(test)]
impl Grant {
    /// `spiffe_id` for `ttl`, no names, as the operator's (admin) grant.
    pub(crate) fn for_tests(spiffe_id: SpiffeId, ttl: Duration) -> Self {
        Self {
            spiffe_id,
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            ttl,
            provenance: Provenance::new(crate::provenance::Source::Admin, 0),
        }
    }

    pub(crate) fn with_spiffe_id(mut self, spiffe_id: SpiffeId) -> Self {
        self.spiffe_id = spiffe_id;
        self
    }

    pub(crate) fn with_dns_names(mut self, dns_names: Vec<String>) -> Self {
        self.dns_names = dns_names;
        self
    }

    pub(crate) fn with_ip_addresses(mut self, ip_addresses: Vec<IpAddr>) -> Self {
        self.ip_addresses = ip_addresses;
        self
    }
}
