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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

/// The code, RFC 5280 name and finality of each defined reason: the one table.
const TABLE: [(CrlReason, u8, &str); 10] = [
    (CrlReason::Unspecified, 0, "unspecified"),
    (CrlReason::KeyCompromise, 1, "keyCompromise"),
    (CrlReason::CaCompromise, 2, "cACompromise"),
    (CrlReason::AffiliationChanged, 3, "affiliationChanged"),
    (CrlReason::Superseded, 4, "superseded"),
    (CrlReason::CessationOfOperation, 5, "cessationOfOperation"),
    (CrlReason::CertificateHold, 6, "certificateHold"),
    (CrlReason::RemoveFromCrl, 8, "removeFromCRL"),
    (CrlReason::PrivilegeWithdrawn, 9, "privilegeWithdrawn"),
    (CrlReason::AaCompromise, 10, "aACompromise"),
];

impl CrlReason {
    /// Every reason RFC 5280 defines, in code order.
    pub const DEFINED: [CrlReason; 10] = {
        let mut out = [CrlReason::Unspecified; 10];
        let mut i = 0;
        while i < TABLE.len() {
            out[i] = TABLE[i].0;
            i += 1;
        }
        out
    };

    /// The reason of a `CRLReason` code ([`CrlReason::Other`] for an undefined one).
    pub fn from_code(code: u8) -> Self {
        TABLE
            .iter()
            .find(|(_, c, _)| *c == code)
            .map_or(Self::Other(code), |(r, _, _)| *r)
    }

    /// The `CRLReason` code.
    pub fn code(self) -> u8 {
        match self {
            Self::Other(code) => code,
            defined => TABLE
                .iter()
                .find(|(r, _, _)| *r == defined)
                .map_or(0, |(_, c, _)| *c),
        }
    }

    /// The RFC 5280 name (`keyCompromise`, `cACompromise`, …); `None` for an undefined code.
    pub fn name(self) -> Option<&'static str> {
        TABLE
            .iter()
            .find(|(r, _, _)| *r == self)
            .map(|(_, _, n)| *n)
    }

    /// Whether a revocation for this reason is final: every defined reason but
    /// `certificateHold` (a suspension) and `removeFromCRL` (its lifting, delta CRLs only).
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            Self::CertificateHold | Self::RemoveFromCrl | Self::Other(_)
        )
    }
}

impl fmt::Display for CrlReason {
    /// The RFC 5280 name, or `reason code N` for an undefined one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "reason code {}", self.code()),
        }
    }
}

/// Text that names no RFC 5280 reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown CRL reason {0:?}")]
pub struct UnknownCrlReason(pub String);

impl std::str::FromStr for CrlReason {
    type Err = UnknownCrlReason;

    /// A defined reason by its RFC 5280 name in any case, with or without `-` / `_`
    /// (`keyCompromise`, `key-compromise`, `KEY_COMPROMISE`).
    fn from_str(s: &str) -> Result<Self, UnknownCrlReason> {
        let norm = |n: &str| {
            n.chars()
                .filter(|c| *c != '-' && *c != '_')
                .flat_map(char::to_lowercase)
                .collect::<String>()
        };
        let want = norm(s);
        TABLE
            .iter()
            .find(|(_, _, n)| norm(n) == want)
            .map(|(r, _, _)| *r)
            .ok_or_else(|| UnknownCrlReason(s.to_owned()))
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
