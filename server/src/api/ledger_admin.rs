//! `signet.admin.v1.LedgerAdmin`: signed ledger checkpoints, on the admin Unix socket only.

use std::sync::Arc;

use signet_proto::admin::{
    Checkpoint as PbCheckpoint, CheckpointKey as PbCheckpointKey, CreateCheckpointRequest,
    GetCheckpointKeyRequest, GetLatestCheckpointRequest, ListCheckpointsRequest,
    ListCheckpointsResponse, ledger_admin_server::LedgerAdmin,
};
use tonic::{Request, Response, Status};

use super::ApiError;
use crate::checkpoint::{CheckpointError, Checkpointer, Stored, Trigger};
use crate::clock::Clock;

const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

pub struct LedgerAdminApi {
    checkpoints: Arc<Checkpointer>,
    clock: Arc<dyn Clock>,
}

impl LedgerAdminApi {
    pub fn new(checkpoints: Arc<Checkpointer>, clock: Arc<dyn Clock>) -> Self {
        Self { checkpoints, clock }
    }
}

impl From<CheckpointError> for ApiError {
    fn from(e: CheckpointError) -> Self {
        match e {
            CheckpointError::Store(s) => ApiError::from(s),
            other => {
                tracing::error!(error = %other, "checkpoint");
                ApiError::Internal("checkpoint".into())
            }
        }
    }
}

fn to_proto(s: &Stored) -> PbCheckpoint {
    let c = &s.checkpoint;
    PbCheckpoint {
        format: signet_types::checkpoint::FORMAT.into(),
        trust_domain: c.head.trust_domain.clone(),
        seq: c.head.seq,
        hash: c.head.hash.to_vec(),
        time: c.head.time,
        key_id: c.key_id.clone(),
        signature: c.signature.clone(),
        json: s.json.clone(),
        path: s.path.display().to_string(),
    }
}

#[tonic::async_trait]
impl LedgerAdmin for LedgerAdminApi {
    async fn create_checkpoint(
        &self,
        _request: Request<CreateCheckpointRequest>,
    ) -> Result<Response<PbCheckpoint>, Status> {
        let made = self
            .checkpoints
            .create(self.clock.now(), Trigger::Admin)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(to_proto(&made)))
    }

    async fn get_latest_checkpoint(
        &self,
        _request: Request<GetLatestCheckpointRequest>,
    ) -> Result<Response<PbCheckpoint>, Status> {
        let latest = self.checkpoints.latest().ok_or_else(|| {
            ApiError::NotFound(
                "no checkpoint yet (the first is made at start; `signetctl ledger checkpoint create` makes one now)"
                    .into(),
            )
        })?;
        Ok(Response::new(to_proto(&latest)))
    }

    async fn list_checkpoints(
        &self,
        request: Request<ListCheckpointsRequest>,
    ) -> Result<Response<ListCheckpointsResponse>, Status> {
        let limit = match request.into_inner().limit {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let cp = self.checkpoints.clone();
        let listed = tokio::task::spawn_blocking(move || cp.list(limit as usize))
            .await
            .map_err(|e| ApiError::Internal(format!("listing checkpoints: {e}")))?
            .map_err(|e| {
                tracing::error!(error = %e, "listing checkpoints");
                ApiError::Internal("listing checkpoints".into())
            })?;
        Ok(Response::new(ListCheckpointsResponse {
            checkpoints: listed.iter().map(to_proto).collect(),
        }))
    }

    async fn get_checkpoint_key(
        &self,
        _request: Request<GetCheckpointKeyRequest>,
    ) -> Result<Response<PbCheckpointKey>, Status> {
        let k = self.checkpoints.public_key();
        Ok(Response::new(PbCheckpointKey {
            algorithm: "ed25519".into(),
            key_id: k.key_id(),
            public_key_pem: k.to_pem(),
        }))
    }
}
