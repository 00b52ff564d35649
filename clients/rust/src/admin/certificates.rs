//! The issued-certificate calls of `signet.admin.v1.Admin` on [`AdminClient`]: a page of the
//! ledger's certificate rows ([`AdminClient::certificates`], paged by the server's opaque
//! token) and one row by serial ([`AdminClient::certificate`]).
//!
//! The invariant is the crate's: a row reaches the caller only with its serial and its two
//! 32-byte hashes (the certificate's SHA-256 and the chain hash); a revocation only with its
//! time. A malformed answer is a [`CallError::InvalidAnswer`].

use signet_proto::admin as pb;

use super::AdminClient;
use crate::convert::request;
use crate::error::CallError;

/// One certificate row of the ledger, as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateRow {
    pub seq: u64,
    pub serial: String,
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub not_after: i64,
    /// SHA-256 of the certificate's DER.
    pub cert_sha256: [u8; 32],
    pub ca_key_id: String,
    pub caller: String,
    /// Unix seconds.
    pub issued_at: i64,
    pub request_id: String,
    /// The row's chain hash.
    pub hash: [u8; 32],
    pub cert_der: Vec<u8>,
    /// Where the certificate's authority came from (JSON); `None` for rows written before it
    /// was recorded.
    pub provenance: Option<String>,
    /// Its revocation, if it was revoked.
    pub revocation: Option<Revocation>,
}

/// When and why a certificate was revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// Unix seconds.
    pub at: i64,
    /// The RFC 5280 reason's name.
    pub reason: String,
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
    pub certificates: Vec<CertificateRow>,
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

    /// `GetCertificate` by serial (hex, colons allowed).
    pub async fn certificate(&self, serial: &str) -> Result<CertificateRow, CallError> {
        let msg = pb::GetCertificateRequest {
            serial: serial.to_owned(),
        };
        certificate_row(
            self.admin
                .clone()
                .get_certificate(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }
}

fn hash32(v: &[u8], what: &str, seq: u64) -> Result<[u8; 32], CallError> {
    v.try_into().map_err(|_| {
        CallError::invalid_answer(format!("row {seq}: {what} is {} bytes, not 32", v.len()))
    })
}

pub(super) fn certificate_row(r: pb::CertificateRecord) -> Result<CertificateRow, CallError> {
    if r.serial.is_empty() {
        return Err(CallError::invalid_answer(format!(
            "row {}: a certificate without a serial",
            r.seq
        )));
    }
    Ok(CertificateRow {
        cert_sha256: hash32(&r.cert_sha256, "the certificate's SHA-256", r.seq)?,
        hash: hash32(&r.hash, "the chain hash", r.seq)?,
        revocation: (r.revoked_at != 0).then_some(Revocation {
            at: r.revoked_at,
            reason: r.revocation_reason,
        }),
        provenance: (!r.provenance.is_empty()).then_some(r.provenance),
        seq: r.seq,
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
        cert_der: r.cert_der,
    })
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
        assert_eq!((r.seq, r.cert_sha256, r.hash), (3, [5; 32], [6; 32]));
        assert_eq!((r.provenance, r.revocation), (None, None));
        let r = certificate_row(pb::CertificateRecord {
            provenance: "{\"source\":\"x\"}".into(),
            revoked_at: 9,
            revocation_reason: "superseded".into(),
            ..rec()
        })
        .unwrap();
        assert_eq!(r.provenance.as_deref(), Some("{\"source\":\"x\"}"));
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
        ] {
            let e = certificate_row(bad).unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        }
    }
}
