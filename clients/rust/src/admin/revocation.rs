//! [`RevocationAdminClient`]: the typed client of `signet.admin.v1.RevocationAdmin`: revoke
//! certificates (by serial, SPIFFE ID, node, entry or CA key) and read the current CRLs.
//!
//! The invariant is the crate's: a revoked certificate reaches the caller only with its
//! serial, a CRL only with its issuing key ID and a DER body of at most
//! [`crate::ca::MAX_CRL_BYTES`] (not verified here: whoever enforces it checks its
//! signature). A malformed answer is a [`CallError::InvalidAnswer`].

use std::path::Path;

use signet_proto::admin as pb;
use signet_proto::admin::revocation_admin_client::RevocationAdminClient as PbRevocationAdminClient;
use tonic::transport::Channel;

use crate::ClientError;
use crate::ca::MAX_CRL_BYTES;
use crate::convert::request;
use crate::error::CallError;

/// Which certificates to revoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeSelector {
    /// One certificate by serial (hex, colons allowed).
    Serial(String),
    /// Every unexpired certificate of this SPIFFE ID.
    SpiffeId(String),
    /// Everything a node holds (node ID or node SPIFFE ID).
    Node(String),
    /// Every unexpired certificate issued for this registration entry.
    Entry(String),
    /// Every unexpired certificate issued under this CA key (hex key ID).
    CaKeyId(String),
}

impl From<RevokeSelector> for pb::revoke_request::Selector {
    fn from(s: RevokeSelector) -> Self {
        use pb::revoke_request::Selector as S;
        match s {
            RevokeSelector::Serial(v) => S::Serial(v),
            RevokeSelector::SpiffeId(v) => S::SpiffeId(v),
            RevokeSelector::Node(v) => S::Node(v),
            RevokeSelector::Entry(v) => S::Entry(v),
            RevokeSelector::CaKeyId(v) => S::CaKeyId(v),
        }
    }
}

/// A certificate a revocation selected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedCertificate {
    pub serial: String,
    pub spiffe_id: String,
    pub ca_key_id: String,
    /// Unix seconds.
    pub not_after: i64,
    /// When it was revoked (unix seconds); 0 in a dry run.
    pub revoked_at: i64,
    /// The RFC 5280 reason's name; empty in a dry run.
    pub reason: String,
    /// The ledger event that revoked it; 0 in a dry run.
    pub event_seq: u64,
}

/// A CRL as the server publishes it (not verified here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedCrl {
    pub ca_key_id: String,
    /// DER (an RFC 5280 v2 CRL signed by the CA key).
    pub der: Vec<u8>,
    /// The CRL number the server claims.
    pub number: u64,
    /// Unix seconds.
    pub this_update: i64,
    /// Unix seconds.
    pub next_update: i64,
    /// Serials listed.
    pub entries: u64,
}

/// What a revocation did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeReport {
    /// Revoked now (at most the first 1000; see `revoked_count`).
    pub revoked: Vec<RevokedCertificate>,
    pub revoked_count: u64,
    /// Already revoked before: unchanged (at most the first 1000).
    pub already_revoked: Vec<RevokedCertificate>,
    pub already_revoked_count: u64,
    /// Selected but already expired: left alone.
    pub expired_count: u64,
    pub dry_run: bool,
    /// The CRLs now published, by CA key.
    pub crls: Vec<PublishedCrl>,
}

/// See the module documentation. Cloning is cheap (one shared channel).
#[derive(Clone, Debug)]
pub struct RevocationAdminClient {
    revocation: PbRevocationAdminClient<Channel>,
}

impl RevocationAdminClient {
    /// Connects to the admin API on the server's Unix socket.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect_admin(socket).await?))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            revocation: PbRevocationAdminClient::new(channel),
        }
    }

    /// `Revoke` what `selector` selects, for `reason` (an RFC 5280 reason's name; the
    /// server validates it); with `dry_run`, only report it.
    pub async fn revoke(
        &self,
        selector: RevokeSelector,
        reason: &str,
        dry_run: bool,
    ) -> Result<RevokeReport, CallError> {
        let msg = pb::RevokeRequest {
            selector: Some(selector.into()),
            reason: reason.to_owned(),
            dry_run,
        };
        revoke_report(
            self.revocation
                .clone()
                .revoke(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `GetCrls`: the current CRL of every issuing CA key.
    pub async fn crls(&self) -> Result<Vec<PublishedCrl>, CallError> {
        self.revocation
            .clone()
            .get_crls(request(pb::GetCrlsRequest {}, None)?)
            .await?
            .into_inner()
            .crls
            .into_iter()
            .map(published_crl)
            .collect()
    }
}

fn revoked_certificate(c: pb::RevokedCertificate) -> Result<RevokedCertificate, CallError> {
    if c.serial.is_empty() {
        return Err(CallError::invalid_answer(
            "a revoked certificate without a serial",
        ));
    }
    Ok(RevokedCertificate {
        serial: c.serial,
        spiffe_id: c.spiffe_id,
        ca_key_id: c.ca_key_id,
        not_after: c.not_after,
        revoked_at: c.revoked_at,
        reason: c.reason,
        event_seq: c.event_seq,
    })
}

fn published_crl(c: pb::Crl) -> Result<PublishedCrl, CallError> {
    if c.ca_key_id.is_empty() {
        return Err(CallError::invalid_answer("a CRL naming no CA key"));
    }
    if c.der.is_empty() || c.der.len() > MAX_CRL_BYTES {
        return Err(CallError::invalid_answer(format!(
            "the CRL of CA key {} is {} bytes (at most {MAX_CRL_BYTES}, not empty)",
            c.ca_key_id,
            c.der.len()
        )));
    }
    Ok(PublishedCrl {
        ca_key_id: c.ca_key_id,
        der: c.der,
        number: c.number,
        this_update: c.this_update,
        next_update: c.next_update,
        entries: c.entries,
    })
}

fn revoke_report(r: pb::RevokeResponse) -> Result<RevokeReport, CallError> {
    let certs = |v: Vec<pb::RevokedCertificate>| {
        v.into_iter()
            .map(revoked_certificate)
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(RevokeReport {
        revoked: certs(r.revoked)?,
        revoked_count: r.revoked_count,
        already_revoked: certs(r.already_revoked)?,
        already_revoked_count: r.already_revoked_count,
        expired_count: r.expired_count,
        dry_run: r.dry_run,
        crls: r
            .crls
            .into_iter()
            .map(published_crl)
            .collect::<Result<_, _>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert() -> pb::RevokedCertificate {
        pb::RevokedCertificate {
            serial: "0a".into(),
            spiffe_id: "spiffe://example.org/web".into(),
            ca_key_id: "k1".into(),
            not_after: 20,
            revoked_at: 10,
            reason: "keyCompromise".into(),
            event_seq: 4,
        }
    }

    fn crl() -> pb::Crl {
        pb::Crl {
            ca_key_id: "k1".into(),
            der: vec![0x30, 0],
            number: 2,
            this_update: 10,
            next_update: 30,
            entries: 1,
        }
    }

    #[test]
    fn a_revoke_report_converts_and_each_selector_maps_to_its_own() {
        let r = revoke_report(pb::RevokeResponse {
            revoked: vec![cert()],
            revoked_count: 1,
            already_revoked: vec![],
            already_revoked_count: 0,
            expired_count: 2,
            dry_run: false,
            crls: vec![crl()],
        })
        .unwrap();
        assert_eq!((r.revoked_count, r.expired_count, r.dry_run), (1, 2, false));
        assert_eq!(r.revoked[0].serial, "0a");
        assert_eq!((r.revoked[0].revoked_at, r.revoked[0].event_seq), (10, 4));
        assert_eq!((r.crls[0].number, r.crls[0].next_update), (2, 30));
        use pb::revoke_request::Selector as S;
        let v = || "x".to_owned();
        assert_eq!(S::from(RevokeSelector::Serial(v())), S::Serial(v()));
        assert_eq!(S::from(RevokeSelector::SpiffeId(v())), S::SpiffeId(v()));
        assert_eq!(S::from(RevokeSelector::Node(v())), S::Node(v()));
        assert_eq!(S::from(RevokeSelector::Entry(v())), S::Entry(v()));
        assert_eq!(S::from(RevokeSelector::CaKeyId(v())), S::CaKeyId(v()));
    }

    #[test]
    fn a_certificate_without_serial_or_a_crl_without_key_or_body_is_refused() {
        let refused = |r: pb::RevokeResponse| {
            let e = revoke_report(r).unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        };
        let good = pb::RevokeResponse {
            revoked: vec![cert()],
            crls: vec![crl()],
            ..Default::default()
        };
        refused(pb::RevokeResponse {
            already_revoked: vec![pb::RevokedCertificate {
                serial: String::new(),
                ..cert()
            }],
            ..good.clone()
        });
        for bad in [
            pb::Crl {
                ca_key_id: String::new(),
                ..crl()
            },
            pb::Crl {
                der: vec![],
                ..crl()
            },
            pb::Crl {
                der: vec![0; MAX_CRL_BYTES + 1],
                ..crl()
            },
        ] {
            refused(pb::RevokeResponse {
                crls: vec![bad.clone()],
                ..good.clone()
            });
            assert!(published_crl(bad).is_err());
        }
    }
}
