//! The issued-certificate calls of `signet.admin.v1.Admin` on [`AdminClient`]: a page of the
//! ledger's certificate rows ([`AdminClient::certificates`], paged by the server's opaque
//! token) and one row by serial ([`AdminClient::certificate`]), each a [`LedgerRecord`], the
//! row shape the server stores. [`ledger_record`] is the one conversion from the wire's
//! `CertificateRecord`; `signetctl ledger verify` uses it on the rows it streams.
//!
//! The invariant is the crate's: a row reaches the caller only with its three 32-byte hashes
//! (the certificate's SHA-256, the previous and the chain hash) and, from the listing calls,
//! its serial; a revocation only with its time. A malformed answer is a
//! [`CallError::InvalidAnswer`] ([`RecordError`] says why).

use signet_proto::admin as pb;
use signet_types::ledger::{
    Hash, JwtSvidEntry, JwtSvidRecord, LedgerEntry, LedgerRecord, Revocation,
};

use super::AdminClient;
use crate::convert::request;
use crate::error::CallError;

/// Which hash of a row is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashField {
    CertSha256,
    PrevHash,
    Hash,
    /// A JWT-SVID row's hash of its token.
    TokenSha256,
}

impl std::fmt::Display for HashField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HashField::CertSha256 => "the certificate's SHA-256",
            HashField::PrevHash => "the previous hash",
            HashField::Hash => "the chain hash",
            HashField::TokenSha256 => "the token's SHA-256",
        })
    }
}

/// Why a `CertificateRecord` from the server is not a ledger row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A hash that is not 32 bytes long.
    #[error("row {seq}: {field} is {len} bytes, not 32")]
    HashLength {
        seq: u64,
        field: HashField,
        len: usize,
    },
    /// A listed row without a serial.
    #[error("row {seq}: a certificate without a serial")]
    NoSerial { seq: u64 },
}

impl From<RecordError> for CallError {
    fn from(e: RecordError) -> Self {
        CallError::invalid_answer(e.to_string())
    }
}

/// One page of JWT-SVID rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSvidPage {
    pub jwt_svids: Vec<JwtSvidRecord>,
    /// Set when more rows follow: the next query's `page_token`.
    pub next_page_token: Option<String>,
}

/// The one conversion of the wire's `JwtSvidRecord` into the ledger's JWT-SVID row: its three
/// hashes must be 32 bytes; nothing else is judged (as [`ledger_record`]).
pub fn jwt_svid_record(r: pb::JwtSvidRecord) -> Result<JwtSvidRecord, RecordError> {
    let seq = r.seq;
    Ok(JwtSvidRecord {
        prev_hash: hash32(&r.prev_hash, HashField::PrevHash, seq)?,
        hash: hash32(&r.hash, HashField::Hash, seq)?,
        entry: JwtSvidEntry {
            seq,
            token_sha256: hash32(&r.token_sha256, HashField::TokenSha256, seq)?,
            spiffe_id: r.spiffe_id,
            audience: r.audience,
            issued_at: r.issued_at,
            expires_at: r.expires_at,
            key_id: r.key_id,
            caller: r.caller,
            request_id: r.request_id,
            provenance: r.provenance,
        },
    })
}

/// Which rows [`AdminClient::certificates`] asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertificateQuery {
    /// Rows after this seq (oldest first, first page only; the token carries on).
    pub after_seq: u64,
    /// At most this many (0: the server's default).
    pub limit: u32,
    /// Only this SPIFFE ID.
    pub spiffe_id: Option<String>,
    /// The previous page's token, unchanged.
    pub page_token: Option<String>,
    pub newest_first: bool,
}

/// One page of certificate rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificatePage {
    pub certificates: Vec<LedgerRecord>,
    /// Set when more rows follow: the next query's `page_token`.
    pub next_page_token: Option<String>,
}

impl AdminClient {
    /// `ListCertificates`: one page.
    pub async fn certificates(&self, q: &CertificateQuery) -> Result<CertificatePage, CallError> {
        let msg = pb::ListCertificatesRequest {
            after_seq: q.after_seq,
            limit: q.limit,
            spiffe_id: q.spiffe_id.clone().unwrap_or_default(),
            page_token: q.page_token.clone().unwrap_or_default(),
            newest_first: q.newest_first,
        };
        let r = self
            .admin
            .clone()
            .list_certificates(request(msg, None)?)
            .await?
            .into_inner();
        Ok(CertificatePage {
            certificates: r
                .certificates
                .into_iter()
                .map(certificate_row)
                .collect::<Result<_, _>>()?,
            next_page_token: (!r.next_page_token.is_empty()).then_some(r.next_page_token),
        })
    }

    /// `ListJwtSvids`: one page of JWT-SVID rows, queried as [`AdminClient::certificates`].
    pub async fn jwt_svids(&self, q: &CertificateQuery) -> Result<JwtSvidPage, CallError> {
        let msg = pb::ListCertificatesRequest {
            after_seq: q.after_seq,
            limit: q.limit,
            spiffe_id: q.spiffe_id.clone().unwrap_or_default(),
            page_token: q.page_token.clone().unwrap_or_default(),
            newest_first: q.newest_first,
        };
        let r = self
            .admin
            .clone()
            .list_jwt_svids(request(msg, None)?)
            .await?
            .into_inner();
        Ok(JwtSvidPage {
            jwt_svids: r
                .jwt_svids
                .into_iter()
                .map(jwt_svid_record)
                .collect::<Result<_, _>>()?,
            next_page_token: (!r.next_page_token.is_empty()).then_some(r.next_page_token),
        })
    }

    /// `GetCertificate` by serial (hex, colons allowed).
    pub async fn certificate(&self, serial: &str) -> Result<LedgerRecord, CallError> {
        let msg = pb::GetCertificateRequest {
            serial: serial.to_owned(),
        };
        Ok(certificate_row(
            self.admin
                .clone()
                .get_certificate(request(msg, None)?)
                .await?
                .into_inner(),
        )?)
    }
}

fn hash32(v: &[u8], field: HashField, seq: u64) -> Result<Hash, RecordError> {
    v.try_into().map_err(|_| RecordError::HashLength {
        seq,
        field,
        len: v.len(),
    })
}

/// The one conversion of the wire's `CertificateRecord` into the ledger's row: its hashes must
/// be 32 bytes; nothing else is judged (a `signetctl ledger verify` of a tampered row must
/// reach the chain as stored, and break it at its row). An empty provenance is a row written
/// before provenance was recorded; a `revoked_at` of 0 means not revoked.
pub fn ledger_record(r: pb::CertificateRecord) -> Result<LedgerRecord, RecordError> {
    let seq = r.seq;
    Ok(LedgerRecord {
        prev_hash: hash32(&r.prev_hash, HashField::PrevHash, seq)?,
        hash: hash32(&r.hash, HashField::Hash, seq)?,
        revocation: (r.revoked_at != 0).then_some(Revocation {
            at: r.revoked_at,
            reason: r.revocation_reason,
        }),
        cert_der: r.cert_der,
        entry: LedgerEntry {
            seq,
            cert_sha256: hash32(&r.cert_sha256, HashField::CertSha256, seq)?,
            serial: r.serial,
            spiffe_id: r.spiffe_id,
            dns_names: r.dns_names,
            ip_addresses: r.ip_addresses,
            not_before: r.not_before,
            not_after: r.not_after,
            ca_key_id: r.ca_key_id,
            caller: r.caller,
            issued_at: r.issued_at,
            request_id: r.request_id,
            provenance: r.provenance,
        },
    })
}

/// A listed row: [`ledger_record`], and it names its certificate by serial.
fn certificate_row(r: pb::CertificateRecord) -> Result<LedgerRecord, RecordError> {
    if r.serial.is_empty() {
        return Err(RecordError::NoSerial { seq: r.seq });
    }
    ledger_record(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> pb::CertificateRecord {
        pb::CertificateRecord {
            seq: 3,
            serial: "0a".into(),
            spiffe_id: "spiffe://example.org/web".into(),
            dns_names: vec!["web".into()],
            ip_addresses: vec![],
            not_before: 1,
            not_after: 2,
            cert_sha256: vec![5; 32],
            ca_key_id: "k1".into(),
            caller: "admin".into(),
            issued_at: 1,
            request_id: "r".into(),
            prev_hash: vec![0; 32],
            hash: vec![6; 32],
            cert_der: vec![0x30],
            provenance: String::new(),
            revoked_at: 0,
            revocation_reason: String::new(),
        }
    }

    #[test]
    fn a_row_converts_with_no_provenance_or_revocation_as_none() {
        let r = certificate_row(rec()).unwrap();
        assert_eq!(
            (r.entry.seq, r.entry.cert_sha256, r.prev_hash, r.hash),
            (3, [5; 32], [0; 32], [6; 32])
        );
        assert_eq!((r.entry.recorded_provenance(), r.revocation), (None, None));
        let r = certificate_row(pb::CertificateRecord {
            provenance: "{\"source\":\"x\"}".into(),
            revoked_at: 9,
            revocation_reason: "superseded".into(),
            ..rec()
        })
        .unwrap();
        assert_eq!(r.entry.recorded_provenance(), Some("{\"source\":\"x\"}"));
        assert_eq!(
            r.revocation,
            Some(Revocation {
                at: 9,
                reason: "superseded".into()
            })
        );
    }

    #[test]
    fn a_row_without_serial_or_with_a_short_hash_is_refused() {
        for bad in [
            pb::CertificateRecord {
                serial: String::new(),
                ..rec()
            },
            pb::CertificateRecord {
                hash: vec![6; 31],
                ..rec()
            },
            pb::CertificateRecord {
                cert_sha256: vec![],
                ..rec()
            },
            pb::CertificateRecord {
                prev_hash: vec![0; 33],
                ..rec()
            },
        ] {
            let e = CallError::from(certificate_row(bad).unwrap_err());
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        }
    }

    #[test]
    fn a_bad_hash_says_which_and_how_long_and_a_streamed_row_needs_no_serial() {
        assert_eq!(
            ledger_record(pb::CertificateRecord {
                hash: vec![6; 31],
                ..rec()
            }),
            Err(RecordError::HashLength {
                seq: 3,
                field: HashField::Hash,
                len: 31
            })
        );
        assert_eq!(
            ledger_record(pb::CertificateRecord {
                cert_sha256: vec![],
                ..rec()
            })
            .unwrap_err()
            .to_string(),
            "row 3: the certificate's SHA-256 is 0 bytes, not 32"
        );
        // The chain, not the conversion, judges a streamed row's content.
        let r = ledger_record(pb::CertificateRecord {
            serial: String::new(),
            ..rec()
        })
        .unwrap();
        assert_eq!(r.entry.serial, "");
    }
}
