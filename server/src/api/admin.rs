//! `signet.admin.v1.Admin`, served only on the admin Unix socket (`<data_dir>/admin.sock`,
//! mode 0600): whoever can open the socket is the operator.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use signet_proto::admin::{
    AuditEvent as PbAuditEvent, BundleResponse, CertificateRecord, GetBundleRequest,
    GetCertificateRequest, GetLedgerHeadRequest, LedgerHead as PbLedgerHead,
    ListAuditEventsRequest, ListAuditEventsResponse, ListCertificatesRequest,
    ListCertificatesResponse, MintX509SvidRequest, MintX509SvidResponse, StreamLedgerRequest,
    admin_server::Admin,
};
use tonic::{Request, Response, Status};

use super::{ApiError, request_id};
use crate::authn::{AdminSocket, AuthenticatedCaller};
use crate::bundle::BundleHandle;
use crate::ca::RequestedNames;
use crate::issuer::{IssueInput, Issuer};
use crate::store::audit::{AuditFilter, AuditQuery, KindFilter, audit_page, page_after};
use crate::store::paging::PageToken;
use crate::store::{
    CertQuery, LedgerRecord, Order, Store, StoreError, certificates_page, jwt_svids_page,
};
use signet_types::ledger::JwtSvidRecord;

const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

pub struct AdminApi {
    issuer: Arc<Issuer>,
    store: Arc<dyn Store>,
    bundle: BundleHandle,
    socket: AdminSocket,
}

impl AdminApi {
    /// `socket`: the proof that this API is served on the admin socket (and only there).
    pub(crate) fn new(
        issuer: Arc<Issuer>,
        store: Arc<dyn Store>,
        bundle: BundleHandle,
        socket: AdminSocket,
    ) -> Self {
        Self {
            issuer,
            store,
            bundle,
            socket,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) => ApiError::Unavailable(m),
            StoreError::InvalidArgument(m) => ApiError::InvalidArgument(m),
            other => {
                tracing::error!(error = %other, "store error");
                ApiError::Internal("store".into())
            }
        }
    }
}

pub(crate) fn row_to_proto(r: LedgerRecord) -> CertificateRecord {
    let e = r.entry;
    let (revoked_at, revocation_reason) = r
        .revocation
        .map_or((0, String::new()), |v| (v.at, v.reason));
    CertificateRecord {
        seq: e.seq,
        serial: e.serial,
        spiffe_id: e.spiffe_id,
        dns_names: e.dns_names,
        ip_addresses: e.ip_addresses,
        not_before: e.not_before,
        not_after: e.not_after,
        cert_sha256: e.cert_sha256.to_vec(),
        ca_key_id: e.ca_key_id,
        caller: e.caller,
        issued_at: e.issued_at,
        request_id: e.request_id,
        prev_hash: r.prev_hash.to_vec(),
        hash: r.hash.to_vec(),
        cert_der: r.cert_der,
        provenance: e.provenance,
        revoked_at,
        revocation_reason,
    }
}

fn page(limit: u32) -> u32 {
    match limit {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    }
}

#[tonic::async_trait]
impl Admin for AdminApi {
    type StreamJwtSvidsStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<signet_proto::admin::JwtSvidRecord, Status>> + Send>,
    >;

    /// JWT-SVID rows in `(after_seq, up_to_seq]`, as `StreamLedger` streams certificate rows.
    async fn stream_jwt_svids(
        &self,
        request: Request<StreamLedgerRequest>,
    ) -> Result<Response<Self::StreamJwtSvidsStream>, Status> {
        let req = request.into_inner();
        let store = self.store.clone();
        Ok(Response::new(super::paged_ledger_stream(
            req.after_seq,
            req.up_to_seq,
            move |after| {
                let store = store.clone();
                async move { store.list_jwt_svids(after, MAX_PAGE, None).await }
            },
            |r: &JwtSvidRecord| r.entry.seq,
            jwt_row_to_proto,
        )))
    }

    /// One page of JWT-SVID rows, as `ListCertificates` (page tokens, `spiffe_id`,
    /// `newest_first`; `after_seq` oldest first only).
    async fn list_jwt_svids(
        &self,
        request: Request<ListCertificatesRequest>,
    ) -> Result<Response<signet_proto::admin::ListJwtSvidsResponse>, Status> {
        let req = request.into_inner();
        let spiffe_id = (!req.spiffe_id.is_empty()).then_some(req.spiffe_id.as_str());
        let order = if req.newest_first {
            Order::NewestFirst
        } else {
            Order::OldestFirst
        };
        if req.after_seq != 0 && (!req.page_token.is_empty() || req.newest_first) {
            return Err(ApiError::InvalidArgument(
                "after_seq goes with neither page_token nor newest_first: use page_token".into(),
            )
            .into());
        }
        let token = if req.after_seq != 0 {
            PageToken::after(spiffe_id, req.after_seq)
        } else {
            req.page_token.clone()
        };
        let page = jwt_svids_page(
            &*self.store,
            &CertQuery {
                spiffe_id,
                order,
                limit: page(req.limit),
                page_token: Some(&token),
            },
        )
        .await
        .map_err(ApiError::from)?;
        Ok(Response::new(signet_proto::admin::ListJwtSvidsResponse {
            jwt_svids: page.rows.into_iter().map(jwt_row_to_proto).collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }

    async fn list_certificates(
        &self,
        request: Request<ListCertificatesRequest>,
    ) -> Result<Response<ListCertificatesResponse>, Status> {
        let req = request.into_inner();
        let spiffe_id = (!req.spiffe_id.is_empty()).then_some(req.spiffe_id.as_str());
        let order = if req.newest_first {
            Order::NewestFirst
        } else {
            Order::OldestFirst
        };
        if req.after_seq != 0 && (!req.page_token.is_empty() || req.newest_first) {
            return Err(ApiError::InvalidArgument(
                "after_seq goes with neither page_token nor newest_first: use page_token".into(),
            )
            .into());
        }
        let page = if req.after_seq != 0 {
            // The older form: rows after a seq, oldest first; the token still says what follows.
            let token = PageToken::after(spiffe_id, req.after_seq);
            certificates_page(
                &*self.store,
                &CertQuery {
                    spiffe_id,
                    order,
                    limit: page(req.limit),
                    page_token: Some(&token),
                },
            )
            .await
        } else {
            certificates_page(
                &*self.store,
                &CertQuery {
                    spiffe_id,
                    order,
                    limit: page(req.limit),
                    page_token: Some(&req.page_token),
                },
            )
            .await
        }
        .map_err(ApiError::from)?;
        Ok(Response::new(ListCertificatesResponse {
            certificates: page.rows.into_iter().map(row_to_proto).collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }

    async fn get_certificate(
        &self,
        request: Request<GetCertificateRequest>,
    ) -> Result<Response<CertificateRecord>, Status> {
        let req = request.into_inner();
        let serial = signet_types::normalize_serial(&req.serial).ok_or_else(|| {
            ApiError::InvalidArgument(format!(
                "serial {:?} is not hexadecimal (e.g. 5f3a… or 5F:3A:…)",
                req.serial
            ))
        })?;
        let row = self
            .store
            .certificate_by_serial(&serial)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| ApiError::NotFound(format!("no certificate with serial {serial}")))?;
        Ok(Response::new(row_to_proto(row)))
    }

    async fn get_bundle(
        &self,
        _request: Request<GetBundleRequest>,
    ) -> Result<Response<BundleResponse>, Status> {
        let b = self.bundle.current();
        Ok(Response::new(BundleResponse {
            trust_domain: b.trust_domain.to_string(),
            roots: b.roots.clone(),
            revision: b.revision,
            path: self.bundle.path().display().to_string(),
        }))
    }

    async fn get_ledger_head(
        &self,
        _request: Request<GetLedgerHeadRequest>,
    ) -> Result<Response<PbLedgerHead>, Status> {
        let head = self.store.ledger_head().await.map_err(ApiError::from)?;
        Ok(Response::new(PbLedgerHead {
            seq: head.seq,
            hash: head.hash.to_vec(),
        }))
    }

    type StreamLedgerStream = Pin<Box<dyn Stream<Item = Result<CertificateRecord, Status>> + Send>>;

    async fn stream_ledger(
        &self,
        request: Request<StreamLedgerRequest>,
    ) -> Result<Response<Self::StreamLedgerStream>, Status> {
        let req = request.into_inner();
        let store = self.store.clone();
        Ok(Response::new(super::paged_ledger_stream(
            req.after_seq,
            req.up_to_seq,
            move |after| {
                let store = store.clone();
                async move { store.list_certificates(after, MAX_PAGE, None).await }
            },
            |r: &LedgerRecord| r.entry.seq,
            row_to_proto,
        )))
    }

    async fn mint_x509_svid(
        &self,
        request: Request<MintX509SvidRequest>,
    ) -> Result<Response<MintX509SvidResponse>, Status> {
        let request_id = request_id(&request);
        let req = request.into_inner();
        if req.spiffe_id.is_empty() {
            return Err(ApiError::InvalidArgument("spiffe_id is required".into()).into());
        }
        let caller = AuthenticatedCaller::admin(self.issuer.trust_domain(), self.socket);
        let extra = RequestedNames {
            uris: vec![req.spiffe_id.clone()],
            dns_names: req.dns_names.clone(),
            ..RequestedNames::default()
        };
        let cert = self
            .issuer
            .issue(
                &caller,
                IssueInput {
                    source: crate::policy::GrantSource::Caller,
                    csr: &req.csr,
                    ttl_seconds: req.ttl_seconds,
                    impersonate: None,
                    request_id,
                    api: "admin",
                    extra_names: Some(extra),
                },
            )
            .await?;
        self.issuer.audit().record(
            "admin.mint",
            &caller.label(),
            format!("minted {} serial {}", cert.spiffe_id, cert.serial),
            crate::clock::unix(self.issuer.now()),
        );
        Ok(Response::new(MintX509SvidResponse {
            serial: cert.serial.clone(),
            cert_chain: cert.chain,
        }))
    }

    async fn list_audit_events(
        &self,
        request: Request<ListAuditEventsRequest>,
    ) -> Result<Response<ListAuditEventsResponse>, Status> {
        let req = request.into_inner();
        if req.after_id != 0 && (!req.page_token.is_empty() || req.newest_first) {
            return Err(ApiError::InvalidArgument(
                "after_id goes with neither page_token nor newest_first: use page_token".into(),
            )
            .into());
        }
        for (name, value) in [("kind", &req.kind), ("caller", &req.caller)] {
            if value.len() > 512 {
                return Err(ApiError::InvalidArgument(format!(
                    "{name} is {} bytes; at most 512",
                    value.len()
                ))
                .into());
            }
        }
        if req.since < 0 {
            return Err(ApiError::InvalidArgument(format!(
                "since {} is before 1970; give unix seconds (0: no bound)",
                req.since
            ))
            .into());
        }
        let filter = AuditFilter {
            kind: KindFilter::parse(&req.kind),
            since: (req.since != 0).then_some(req.since),
            caller: (!req.caller.is_empty()).then_some(req.caller.as_str()),
        };
        let token = if req.after_id != 0 {
            page_after(&filter, req.after_id)
        } else {
            req.page_token.clone()
        };
        let page = audit_page(
            &*self.store,
            &AuditQuery {
                filter,
                order: if req.newest_first {
                    Order::NewestFirst
                } else {
                    Order::OldestFirst
                },
                limit: page(req.limit),
                page_token: Some(&token),
            },
        )
        .await
        .map_err(ApiError::from)?;
        Ok(Response::new(ListAuditEventsResponse {
            events: page
                .events
                .into_iter()
                .map(|e| PbAuditEvent {
                    id: e.id,
                    at: e.at,
                    kind: e.kind,
                    caller: e.caller,
                    detail: e.detail,
                })
                .collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }
}

/// A JWT-SVID ledger row as the admin API sends it (the token itself is never stored).
fn jwt_row_to_proto(r: JwtSvidRecord) -> signet_proto::admin::JwtSvidRecord {
    signet_proto::admin::JwtSvidRecord {
        seq: r.entry.seq,
        spiffe_id: r.entry.spiffe_id,
        audience: r.entry.audience,
        issued_at: r.entry.issued_at,
        expires_at: r.entry.expires_at,
        key_id: r.entry.key_id,
        token_sha256: r.entry.token_sha256.to_vec(),
        caller: r.entry.caller,
        request_id: r.entry.request_id,
        provenance: r.entry.provenance,
        prev_hash: r.prev_hash.to_vec(),
        hash: r.hash.to_vec(),
    }
}
