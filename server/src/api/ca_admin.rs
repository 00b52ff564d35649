//! `signet.admin.v1.CaAdmin`: operator control of the CA key slots (`ca::manager`), served
//! only on the admin Unix socket. Every action, allowed or refused, is an audit event; the
//! allowed ones are written with the slot change itself.

use std::sync::Arc;

use signet_proto::admin::ca_admin_server::CaAdmin;
use signet_proto::admin::{
    CaActionResponse, CaActivateRequest, CaKeyRequest, CaPrepareRequest, CaRevokeRequest, CaSlot,
    CaStatusRequest, CaStatusResponse,
};
use tonic::{Request, Response, Status};

use super::ApiError;
use crate::authn::AuthenticatedCaller;
use crate::ca::jwt_key::JwtKeySource;
use crate::ca::manager::{CaManager, CaView, ManagerError, Outcome};
use crate::ca::rotator::Kind;
use crate::clock::unix;
use crate::issuer::Issuer;
use crate::store::StoreError;

pub struct CaAdminApi {
    issuer: Arc<Issuer>,
    manager: Arc<CaManager>,
}

impl CaAdminApi {
    pub fn new(issuer: Arc<Issuer>, manager: Arc<CaManager>) -> Self {
        Self { issuer, manager }
    }

    fn actor(&self) -> String {
        AuthenticatedCaller::admin_label(self.issuer.trust_domain())
    }

    /// Maps a manager failure, recording the refusal.
    fn refused(&self, what: &str, e: ManagerError) -> Status {
        let err = match e {
            ManagerError::NotFound(m) => ApiError::NotFound(m),
            ManagerError::FailedPrecondition(m) => ApiError::FailedPrecondition(m),
            ManagerError::Store(StoreError::Unavailable(m)) => ApiError::Unavailable(m),
            other => {
                tracing::error!(error = %other, what, "CA operation failed");
                ApiError::Internal(format!("ca {what}"))
            }
        };
        self.issuer.audit().record(
            "ca.refused",
            &self.actor(),
            format!("ca {what}: {err}"),
            unix(self.issuer.now()),
        );
        err.into()
    }
}

/// A key ID as `ca status` prints it: a CA key's in hex (any case), a JWT key's in base64url
/// (exactly). `view` tells which one a hex-looking ID is.
fn key_id(raw: &str, view: &CaView) -> Result<String, Status> {
    let id = raw.trim();
    let base64url = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if id.is_empty() || id.len() > 128 || !id.bytes().all(base64url) {
        return Err(ApiError::InvalidArgument(
            "key_id must be a key ID as `signetctl ca status` shows it (hex for a CA key, base64url for a JWT key)".into(),
        )
        .into());
    }
    if view.slots.iter().any(|s| s.slot.id == id) {
        return Ok(id.to_owned());
    }
    if id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(id.to_ascii_lowercase());
    }
    Ok(id.to_owned())
}

fn action(o: Outcome) -> Response<CaActionResponse> {
    Response::new(CaActionResponse {
        key_id: o.key_id,
        warnings: o.warnings,
    })
}

#[tonic::async_trait]
impl CaAdmin for CaAdminApi {
    async fn status(
        &self,
        _request: Request<CaStatusRequest>,
    ) -> Result<Response<CaStatusResponse>, Status> {
        let now = self.issuer.now();
        let slots = self
            .manager
            .status(now)
            .await
            .map_err(|e| self.refused("status", e))?;
        let view = self.manager.view();
        let secs = |t: std::time::SystemTime| unix(t);
        Ok(Response::new(CaStatusResponse {
            slots: slots
                .into_iter()
                .map(|s| {
                    let i = s.info;
                    CaSlot {
                        key_id: i.slot.id.clone(),
                        kind: i.slot.kind.as_str().into(),
                        state: i.slot.state.as_str().into(),
                        tainted: i.slot.tainted,
                        algorithm: i.algorithm.clone(),
                        not_before: secs(i.slot.not_before),
                        not_after: secs(i.slot.not_after),
                        parent_key_id: i.slot.parent.clone().unwrap_or_default(),
                        unexpired_certificates: s.unexpired,
                        last_expiry: s.last_expiry.unwrap_or(0),
                        prepared_at: secs(i.slot.prepared_at),
                        activated_at: i.activated_at.unwrap_or(0),
                        retired_at: i.retired_at.unwrap_or(0),
                        removed_at: i.removed_at.unwrap_or(0),
                        external: i.external,
                        rejected: String::new(),
                        holders_not_replaced: s.holders_not_replaced,
                    }
                })
                .chain(view.rejected.iter().map(|r| CaSlot {
                    key_id: r.id.clone(),
                    kind: r.kind.clone(),
                    state: r.state.clone(),
                    rejected: r.reason.clone(),
                    ..CaSlot::default()
                }))
                .collect(),
            plugged: view.plugged,
            active_key_id: view.active.key_id().to_owned(),
            active_jwt_key_id: self
                .manager
                .active_jwt_key()
                .map(|k| k.signer.key_id().to_owned())
                .unwrap_or_default(),
        }))
    }

    async fn prepare(
        &self,
        request: Request<CaPrepareRequest>,
    ) -> Result<Response<CaActionResponse>, Status> {
        let req = request.into_inner();
        let kind = match req.kind.trim() {
            "" if req.root => Kind::Root,
            "" => Kind::Intermediate,
            k => Kind::parse(k).ok_or_else(|| {
                Status::from(ApiError::InvalidArgument(format!(
                    "kind {:?}: must be root, intermediate or jwt",
                    signet_types::untrusted::shown(k)
                )))
            })?,
        };
        if req.root && kind != Kind::Root {
            return Err(ApiError::InvalidArgument(format!(
                "root is set but kind is {}: set one",
                kind.as_str()
            ))
            .into());
        }
        let what = format!("prepare --kind {}", kind.as_str());
        self.manager
            .prepare(kind, &self.actor(), self.issuer.now())
            .await
            .map(action)
            .map_err(|e| self.refused(&what, e))
    }

    async fn activate(
        &self,
        request: Request<CaActivateRequest>,
    ) -> Result<Response<CaActionResponse>, Status> {
        let req = request.into_inner();
        let id = key_id(&req.key_id, &self.manager.view())?;
        self.manager
            .activate(&id, req.force, &self.actor(), self.issuer.now())
            .await
            .map(action)
            .map_err(|e| self.refused(&format!("activate {id}"), e))
    }

    async fn taint(
        &self,
        request: Request<CaKeyRequest>,
    ) -> Result<Response<CaActionResponse>, Status> {
        let id = key_id(&request.into_inner().key_id, &self.manager.view())?;
        self.manager
            .taint(&id, &self.actor(), self.issuer.now())
            .await
            .map(action)
            .map_err(|e| self.refused(&format!("taint {id}"), e))
    }

    async fn revoke(
        &self,
        request: Request<CaRevokeRequest>,
    ) -> Result<Response<CaActionResponse>, Status> {
        let req = request.into_inner();
        let id = key_id(&req.key_id, &self.manager.view())?;
        self.manager
            .revoke(&id, req.force, &self.actor(), self.issuer.now())
            .await
            .map(action)
            .map_err(|e| self.refused(&format!("revoke {id}"), e))
    }
}
