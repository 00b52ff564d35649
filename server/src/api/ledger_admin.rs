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
            // The head does not extend the last checkpoint: the message says what was found
            // and what to do; signing it anyway is exactly what must not happen.
            rollback @ CheckpointError::Rollback(_) => {
                ApiError::FailedPrecondition(rollback.to_string())
            }
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
        format: c.head.format().into(),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::audit::AuditLog;
    use crate::checkpoint::CheckpointKey;
    use crate::clock::fake::FakeClock;
    use crate::store::{SqliteStore, Store};
    use signet_types::TrustDomain;
    use signet_types::checkpoint::{PublicKey, SignedCheckpoint};

    #[tokio::test]
    async fn the_rpcs_create_get_list_and_publish_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let url = signet_testutil::sqlite_url(dir.path());
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::connect(&url, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        let (key, _) = CheckpointKey::generate().unwrap();
        let cp = Checkpointer::new(
            store.clone(),
            key,
            TrustDomain::new("example.org").unwrap(),
            dir.path().join("checkpoints"),
            100,
            AuditLog::spawn(store, 64),
            crate::metrics::Metrics::new(),
        )
        .unwrap();
        let clock = Arc::new(FakeClock::at_unix(1_800_000_000));
        let api = LedgerAdminApi::new(Arc::new(cp), clock.clone());

        // Before the first: NotFound, saying how to make one; an empty list.
        let err = api
            .get_latest_checkpoint(Request::new(GetLatestCheckpointRequest {}))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert!(err.message().contains("checkpoint create"), "{err:?}");
        let listed = api
            .list_checkpoints(Request::new(ListCheckpointsRequest { limit: 0 }))
            .await
            .unwrap()
            .into_inner();
        assert!(listed.checkpoints.is_empty());

        let key = api
            .get_checkpoint_key(Request::new(GetCheckpointKeyRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(key.algorithm, "ed25519");
        let public = PublicKey::from_pem(key.public_key_pem.as_bytes()).unwrap();
        assert_eq!(public.key_id(), key.key_id);

        for _ in 0..3 {
            clock.advance(Duration::from_secs(1));
            let made = api
                .create_checkpoint(Request::new(CreateCheckpointRequest {}))
                .await
                .unwrap()
                .into_inner();
            // The message's fields are the JSON's, and the JSON verifies with the key.
            let parsed = SignedCheckpoint::from_json(&made.json).unwrap();
            public.verify(&parsed).unwrap();
            assert_eq!(made.seq, parsed.head.seq);
            assert_eq!(made.hash, parsed.head.hash.to_vec());
            assert_eq!(made.signature, parsed.signature);
            assert_eq!(made.time, parsed.head.time);
            assert_eq!(made.format, signet_types::checkpoint::FORMAT);
        }
        let latest = api
            .get_latest_checkpoint(Request::new(GetLatestCheckpointRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(latest.time, 1_800_000_003);
        // A huge limit is capped, not refused; a small one is honoured.
        let all = api
            .list_checkpoints(Request::new(ListCheckpointsRequest { limit: u32::MAX }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(all.checkpoints.len(), 3);
        assert_eq!(all.checkpoints[0], latest, "newest first");
        let one = api
            .list_checkpoints(Request::new(ListCheckpointsRequest { limit: 1 }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(one.checkpoints.len(), 1);
    }
}
