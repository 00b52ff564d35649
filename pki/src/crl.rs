//! [`ParsedCrl`]: an X.509 CRL read once (from DER or PEM), and checked against the CA
//! certificate that should have signed it ([`ParsedCrl::verify`]).
//!
//! This module reads and verifies; which CRL to keep (number ordering, which issuers are
//! trusted) is the holder's policy (the agent's `revocation`, the bridge's `revocation`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::FromDer;
use x509_parser::revocation_list::CertificateRevocationList;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::cert::{ParsedCert, hex, serial_bytes, unix};

/// Why bytes are not a CRL Signet can read, or a CRL is not its issuer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CrlError {
    /// Not a DER CRL.
    #[error("not a DER CRL: {0}")]
    Malformed(String),
    /// A CRL followed by more bytes.
    #[error("trailing data after the CRL")]
    TrailingBytes,
    /// Not PEM, or not exactly one `X509 CRL` block.
    #[error("not a PEM CRL: {0}")]
    Pem(String),
    /// The CRL number does not fit 64 bits.
    #[error("CRL number above 2^64")]
    NumberTooLarge,
    /// The CRL's issuer name is not the given CA's subject.
    #[error("its issuer name is not that CA's subject")]
    IssuerMismatch,
    /// The CA certificate's public key cannot be read.
    #[error("issuer key: {0}")]
    IssuerKey(String),
    /// The signature does not verify with the CA's key.
    #[error("the signature does not verify with that CA's key")]
    BadSignature,
}

/// The reason code of a CRL entry (RFC 5280 §5.3.1 `CRLReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CrlReason {
    Unspecified,
    KeyCompromise,
    CaCompromise,
    AffiliationChanged,
    Superseded,
    CessationOfOperation,
    CertificateHold,
    RemoveFromCrl,
    PrivilegeWithdrawn,
    AaCompromise,
    /// A value RFC 5280 does not define.
    Other(u8),
}

impl CrlReason {
    fn from_code(code: u8) -> Self {
        match code {
            0 => Self::Unspecified,
            1 => Self::KeyCompromise,
            2 => Self::CaCompromise,
            3 => Self::AffiliationChanged,
            4 => Self::Superseded,
            5 => Self::CessationOfOperation,
            6 => Self::CertificateHold,
            8 => Self::RemoveFromCrl,
            9 => Self::PrivilegeWithdrawn,
            10 => Self::AaCompromise,
            other => Self::Other(other),
        }
    }

    /// The RFC 5280 reason code (`keyCompromise` is 1, `cACompromise` 2, …).
    pub fn code(self) -> u8 {
        match self {
            Self::Unspecified => 0,
            Self::KeyCompromise => 1,
            Self::CaCompromise => 2,
            Self::AffiliationChanged => 3,
            Self::Superseded => 4,
            Self::CessationOfOperation => 5,
            Self::CertificateHold => 6,
            Self::RemoveFromCrl => 8,
            Self::PrivilegeWithdrawn => 9,
            Self::AaCompromise => 10,
            Self::Other(code) => code,
        }
    }
}

/// A CRL and what Signet reads from it.
#[derive(Clone, PartialEq, Eq)]
pub struct ParsedCrl {
    der: Vec<u8>,
    issuer_der: Vec<u8>,
    authority_key_id: Option<String>,
    number: Option<u64>,
    this_update: SystemTime,
    next_update: Option<SystemTime>,
    /// Serial (unsigned, without leading zero bytes) -> reason, when the entry gives one.
    entries: BTreeMap<Vec<u8>, Option<CrlReason>>,
}

impl fmt::Debug for ParsedCrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParsedCrl")
            .field("authority_key_id", &self.authority_key_id)
            .field("number", &self.number)
            .field("entries", &self.entries.len())
            .finish()
    }
}

fn parse(der: &[u8]) -> Result<CertificateRevocationList<'_>, CrlError> {
    let (rest, crl) =
        x509_parser::parse_x509_crl(der).map_err(|e| CrlError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CrlError::TrailingBytes);
    }
    Ok(crl)
}

impl ParsedCrl {
    /// Reads one DER CRL (nothing may follow it).
    pub fn from_der(der: &[u8]) -> Result<Self, CrlError> {
        let crl = parse(der)?;
        let number = crl
            .crl_number()
            .map(|n| u64::try_from(n).map_err(|_| CrlError::NumberTooLarge))
            .transpose()?;
        let authority_key_id = crl
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(a) => {
                    a.key_identifier.as_ref().map(|k| hex(k.0))
                }
                _ => None,
            });
        let entries = crl
            .iter_revoked_certificates()
            .map(|r| {
                (
                    serial_bytes(r.raw_serial()).to_vec(),
                    r.reason_code().map(|(_, c)| CrlReason::from_code(c.0)),
                )
            })
            .collect();
        Ok(Self {
            issuer_der: crl.issuer().as_raw().to_vec(),
            authority_key_id,
            number,
            this_update: unix(crl.last_update().timestamp()),
            next_update: crl.next_update().map(|t| unix(t.timestamp())),
            entries,
            der: der.to_vec(),
        })
    }

    /// Reads a PEM document holding exactly one `X509 CRL` block.
    pub fn from_pem(pem: &[u8]) -> Result<Self, CrlError> {
        let blocks = pem::parse_many(pem).map_err(|e| CrlError::Pem(e.to_string()))?;
        let [block] = blocks.as_slice() else {
            return Err(CrlError::Pem(format!(
                "{} PEM blocks, one X509 CRL expected",
                blocks.len()
            )));
        };
        if block.tag() != "X509 CRL" {
            return Err(CrlError::Pem(format!(
                "a {:?} block, not X509 CRL",
                block.tag()
            )));
        }
        Self::from_der(block.contents())
    }

    /// Checks that `issuer` signed this CRL: the CRL's issuer name is its subject and the
    /// signature verifies with its public key. (Whether `issuer` is trusted, and is the CA the
    /// CRL claims by its authority key identifier, is the caller's to decide.)
    pub fn verify(&self, issuer: &ParsedCert) -> Result<(), CrlError> {
        if self.issuer_der != issuer.subject_der() {
            return Err(CrlError::IssuerMismatch);
        }
        let crl = parse(&self.der)?;
        let (_, spki) = SubjectPublicKeyInfo::from_der(issuer.spki_der())
            .map_err(|e| CrlError::IssuerKey(e.to_string()))?;
        crl.verify_signature(&spki)
            .map_err(|_| CrlError::BadSignature)
    }

    /// The CRL, DER.
    pub fn der(&self) -> &[u8] {
        &self.der
    }
    pub fn into_der(self) -> Vec<u8> {
        self.der
    }
    /// The CRL as one PEM `X509 CRL` block, LF line endings.
    pub fn to_pem(&self) -> String {
        pem::encode_config(
            &pem::Pem::new("X509 CRL", self.der.clone()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        )
    }
    /// The issuer name, raw DER.
    pub fn issuer_der(&self) -> &[u8] {
        &self.issuer_der
    }
    /// The authority key identifier's key ID, lowercase hex (as
    /// [`ParsedCert::subject_key_id`] spells the issuer's).
    pub fn authority_key_id(&self) -> Option<&str> {
        self.authority_key_id.as_deref()
    }
    /// The CRL number extension, when present.
    pub fn number(&self) -> Option<u64> {
        self.number
    }
    pub fn this_update(&self) -> SystemTime {
        self.this_update
    }
    pub fn next_update(&self) -> Option<SystemTime> {
        self.next_update
    }
    /// The revoked serials (unsigned big-endian, without leading zero bytes, as
    /// [`ParsedCert::serial`]) and each entry's reason when it gives one.
    pub fn entries(&self) -> &BTreeMap<Vec<u8>, Option<CrlReason>> {
        &self.entries
    }
    /// Whether `serial` ([`ParsedCert::serial`]'s form, leading zeros allowed) is listed.
    pub fn lists(&self, serial: &[u8]) -> bool {
        self.entries.contains_key(serial_bytes(serial))
    }
}

#[cfg(test)]
mod tests;
