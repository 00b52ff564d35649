//! `signet.admin.v1.RevocationAdmin`, on the admin Unix socket: revoke certificates, read the
//! ledger's events, read the CRLs. The work is in [`crate::revocation`] and [`crate::crl`];
//! this converts protos and maps errors.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use signet_proto::admin::{
    Crl as PbCrl, GetCrlsRequest, GetCrlsResponse, LedgerEventRecord, RevokeRequest,
    RevokeResponse, RevokedCertificate, StreamLedgerEventsRequest,
    revocation_admin_server::RevocationAdmin, revoke_request,
};
use tonic::{Request, Response, Status};

use super::{ApiError, request_id};
use crate::authn::AuthenticatedCaller;
use crate::bundle::BundleHandle;
use crate::crl::PublishedCrl;
use crate::revocation::{Reason, RevokeError, Revoked, Revoker, parse_selector};
use crate::store::{EventRow, RevocationStore};

const PAGE: u32 = 1000;

pub struct RevocationAdminApi {
    revoker: Arc<Revoker>,
    store: Arc<dyn RevocationStore>,
    bundle: BundleHandle,
    td: signet_types::TrustDomain,
}

impl RevocationAdminApi {
    pub fn new(
        revoker: Arc<Revoker>,
        store: Arc<dyn RevocationStore>,
        bundle: BundleHandle,
        td: signet_types::TrustDomain,
    ) -> Self {
        Self {
            revoker,
            store,
            bundle,
            td,
        }
    }
}

impl From<RevokeError> for ApiError {
    fn from(e: RevokeError) -> Self {
        match e {
            RevokeError::InvalidArgument(m) => ApiError::InvalidArgument(m),
            RevokeError::NotFound(m) => ApiError::NotFound(m),
            RevokeError::Store(e) => ApiError::from(e),
        }
    }
}

fn revoked_to_proto(r: Revoked) -> RevokedCertificate {
    RevokedCertificate {
        serial: r.serial,
        spiffe_id: r.spiffe_id,
        ca_key_id: r.ca_key_id,
        not_after: r.not_after,
        revoked_at: r.revoked_at,
        reason: r.reason,
        event_seq: r.event_seq,
    }
}

pub(crate) fn crl_to_proto(c: &PublishedCrl) -> PbCrl {
    PbCrl {
        ca_key_id: c.key_id.clone(),
        der: c.der.clone(),
        number: c.number,
        this_update: c.this_update,
        next_update: c.next_update,
        entries: c.entries,
    }
}

pub(crate) fn event_to_proto(r: EventRow) -> LedgerEventRecord {
    let e = r.event;
    LedgerEventRecord {
        seq: e.seq,
        kind: e.kind,
        serial: e.serial,
        cert_seq: e.cert_seq,
        cert_hash: e.cert_hash.to_vec(),
        reason: e.reason,
        at: e.at,
        caller: e.caller,
        request_id: e.request_id,
        detail: e.detail,
        prev_hash: r.prev_hash.to_vec(),
        hash: r.hash.to_vec(),
    }
}

#[tonic::async_trait]
impl RevocationAdmin for RevocationAdminApi {
    async fn revoke(
        &self,
        request: Request<RevokeRequest>,
    ) -> Result<Response<RevokeResponse>, Status> {
        let request_id = request_id(&request);
        let req = request.into_inner();
        use revoke_request::Selector as S;
        let (by, value) = match &req.selector {
            None => {
                return Err(ApiError::InvalidArgument(
                    "say what to revoke: a serial, spiffe_id, node, entry or ca_key_id".into(),
                )
                .into());
            }
            Some(S::Serial(v)) => ("serial", v),
            Some(S::SpiffeId(v)) => ("spiffe_id", v),
            Some(S::Node(v)) => ("node", v),
            Some(S::Entry(v)) => ("entry", v),
            Some(S::CaKeyId(v)) => ("ca_key", v),
        };
        let selector = parse_selector(&self.td, by, value).map_err(ApiError::from)?;
        if req.reason.is_empty() {
            return Err(ApiError::InvalidArgument(
                "a reason is required (RFC 5280 name, e.g. keyCompromise, superseded, \
                 cessationOfOperation)"
                    .into(),
            )
            .into());
        }
        let reason: Reason = req
            .reason
            .parse()
            .map_err(|e: crate::revoked::UnknownReason| ApiError::InvalidArgument(e.to_string()))?;
        let caller = AuthenticatedCaller::admin_label(&self.td);
        let report = self
            .revoker
            .revoke(&selector, reason, &caller, &request_id, req.dry_run)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(RevokeResponse {
            revoked: report.revoked.into_iter().map(revoked_to_proto).collect(),
            revoked_count: report.revoked_count,
            already_revoked: report
                .already_revoked
                .into_iter()
                .map(revoked_to_proto)
                .collect(),
            already_revoked_count: report.already_revoked_count,
            expired_count: report.expired_count,
            dry_run: report.dry_run,
            crls: report.crls.iter().map(crl_to_proto).collect(),
        }))
    }

    type StreamLedgerEventsStream =
        Pin<Box<dyn Stream<Item = Result<LedgerEventRecord, Status>> + Send>>;

    async fn stream_ledger_events(
        &self,
        request: Request<StreamLedgerEventsRequest>,
    ) -> Result<Response<Self::StreamLedgerEventsStream>, Status> {
        let req = request.into_inner();
        let store = self.store.clone();
        Ok(Response::new(super::paged_ledger_stream(
            req.after_seq,
            req.up_to_seq,
            move |after| {
                let store = store.clone();
                async move { store.ledger_events(after, PAGE).await }
            },
            |r: &EventRow| r.event.seq,
            event_to_proto,
        )))
    }

    async fn get_crls(
        &self,
        _request: Request<GetCrlsRequest>,
    ) -> Result<Response<GetCrlsResponse>, Status> {
        Ok(Response::new(GetCrlsResponse {
            crls: self
                .bundle
                .current()
                .crls
                .iter()
                .map(crl_to_proto)
                .collect(),
        }))
    }
}
