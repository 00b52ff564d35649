//! Signet's shared vocabulary.
//!
//! Every other crate may depend on this one; it depends on almost nothing and does no I/O.
//! - [`SpiffeId`] and [`TrustDomain`]: validated newtypes, only constructible valid
//!   (the rules of the SPIFFE-ID standard).
//! - [`pem`]: splitting and joining PEM certificate chains.
//! - [`ledger`]: the canonical encoding and hash chain of the issuance ledger, shared by the
//!   server that writes it and the CLI that verifies it.
//! - [`checkpoint`]: the signed statement of the ledger's head (encoding, signature, JSON).
//! - [`dns`]: DNS names and labels ([`dns::DnsName`], [`dns::DnsLabel`]) and Kubernetes names
//!   ([`dns::Dns1123Label`] for a namespace, [`dns::Dns1123Subdomain`] for an object name),
//!   only constructible valid.
//! - [`selector`]: registration-entry selectors ([`Selector`]), the one grammar the server
//!   validates and the agent matches.
//! - [`node`]: node IDs and the node SPIFFE IDs they make.
//! - [`ttl`]: the limits on a requested certificate lifetime.
//! - [`untrusted`]: the one way to put text a caller sent into a message (quoted, cut short,
//!   control characters escaped).
#![forbid(unsafe_code)]

pub mod audience;
pub mod ca_slot;
pub mod checkpoint;
pub mod dns;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod ledger;
pub mod node;
pub mod node_set;
pub mod pem;
pub mod selector;
mod spiffe_id;
pub mod ttl;
pub mod untrusted;

pub use selector::{Selector, SelectorError};
pub use spiffe_id::{SpiffeId, SpiffeIdError, TrustDomain};

/// Lowercase hex of a certificate serial's magnitude: the DER INTEGER content without leading
/// zero bytes (`00 8f 01` -> `8f01`). The one spelling Signet uses for serials everywhere.
pub fn serial_hex(raw: &[u8]) -> String {
    let start = raw
        .iter()
        .position(|b| *b != 0)
        .unwrap_or(raw.len().saturating_sub(1));
    raw[start..].iter().map(|b| format!("{b:02x}")).collect()
}

/// Normalises a serial typed by a person (`00:8F:01`, `8f01`) to [`serial_hex`]'s spelling.
/// Returns `None` if it is not hex.
pub fn normalize_serial(input: &str) -> Option<String> {
    let cleaned: String = input
        .trim()
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    if cleaned.is_empty() || !cleaned.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let trimmed = cleaned.trim_start_matches('0');
    let mut out = if trimmed.is_empty() {
        "0".to_owned()
    } else {
        trimmed.to_owned()
    };
    if out.len() % 2 == 1 {
        out.insert(0, '0');
    }
    Some(out)
}

#[cfg(test)]
mod serial_tests {
    use super::*;

    #[test]
    fn serial_spellings_agree() {
        assert_eq!(serial_hex(&[0x00, 0x8f, 0x01]), "8f01");
        assert_eq!(serial_hex(&[0x01]), "01");
        assert_eq!(serial_hex(&[0x00]), "00");
        assert_eq!(normalize_serial("00:8F:01").as_deref(), Some("8f01"));
        assert_eq!(normalize_serial("f01").as_deref(), Some("0f01"));
        assert_eq!(normalize_serial("xyz"), None);
        assert_eq!(
            normalize_serial(&serial_hex(&[0x7f, 0x00])),
            Some("7f00".into())
        );
    }
}
