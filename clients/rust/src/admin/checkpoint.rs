//! [`LedgerAdminClient`]: the typed client of `signet.admin.v1.LedgerAdmin`, the signed ledger
//! checkpoints: create one, the latest, the list, the checkpoint public key.
//!
//! The invariant is the crate's: a checkpoint reaches the caller only with a 32-byte chain
//! hash and its published JSON (which is what a verifier checks, with only the public key:
//! nothing here trusts the server's other fields for that); a key only with its PEM. A
//! malformed answer is a [`CallError::InvalidAnswer`].

use std::path::Path;

use signet_proto::admin as pb;
use signet_proto::admin::ledger_admin_client::LedgerAdminClient as PbLedgerAdminClient;
use tonic::transport::Channel;

use crate::ClientError;
use crate::convert::request;
use crate::error::CallError;

/// A signed checkpoint of the ledger's head, as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerCheckpoint {
    pub trust_domain: String,
    /// The head row's sequence number (0: the empty ledger).
    pub seq: u64,
    /// The chain hash at that row.
    pub hash: [u8; 32],
    /// Unix seconds when the head was read.
    pub time: i64,
    /// Hex SHA-256 of the signing key's DER SubjectPublicKeyInfo.
    pub key_id: String,
    /// The published JSON, exactly as written to the checkpoint file.
    pub json: String,
    /// Where the server wrote it.
    pub path: String,
}

/// The checkpoint public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointKey {
    pub algorithm: String,
    pub key_id: String,
    /// PEM SubjectPublicKeyInfo.
    pub public_key_pem: String,
}

/// See the module documentation. Cloning is cheap (one shared channel).
#[derive(Clone, Debug)]
pub struct LedgerAdminClient {
    ledger: PbLedgerAdminClient<Channel>,
}

impl LedgerAdminClient {
    /// Connects to the admin API on the server's Unix socket.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect_admin(socket).await?))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            ledger: PbLedgerAdminClient::new(channel),
        }
    }

    /// `CreateCheckpoint`: sign the current head now.
    pub async fn create_checkpoint(&self) -> Result<LedgerCheckpoint, CallError> {
        let msg = pb::CreateCheckpointRequest {};
        checkpoint(
            self.ledger
                .clone()
                .create_checkpoint(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `GetLatestCheckpoint` (`NotFound` before the first).
    pub async fn latest_checkpoint(&self) -> Result<LedgerCheckpoint, CallError> {
        let msg = pb::GetLatestCheckpointRequest {};
        checkpoint(
            self.ledger
                .clone()
                .get_latest_checkpoint(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `ListCheckpoints`: at most `limit` (0: the server's default), newest first.
    pub async fn checkpoints(&self, limit: u32) -> Result<Vec<LedgerCheckpoint>, CallError> {
        let msg = pb::ListCheckpointsRequest { limit };
        self.ledger
            .clone()
            .list_checkpoints(request(msg, None)?)
            .await?
            .into_inner()
            .checkpoints
            .into_iter()
            .map(checkpoint)
            .collect()
    }

    /// `GetCheckpointKey`.
    pub async fn checkpoint_key(&self) -> Result<CheckpointKey, CallError> {
        let msg = pb::GetCheckpointKeyRequest {};
        let k = self
            .ledger
            .clone()
            .get_checkpoint_key(request(msg, None)?)
            .await?
            .into_inner();
        checkpoint_key(k)
    }
}

fn checkpoint(c: pb::Checkpoint) -> Result<LedgerCheckpoint, CallError> {
    let hash: [u8; 32] = c.hash.as_slice().try_into().map_err(|_| {
        CallError::invalid_answer(format!(
            "checkpoint of row {}: its hash is {} bytes, not 32",
            c.seq,
            c.hash.len()
        ))
    })?;
    if c.json.trim().is_empty() {
        return Err(CallError::invalid_answer(format!(
            "checkpoint of row {}: no published JSON",
            c.seq
        )));
    }
    Ok(LedgerCheckpoint {
        trust_domain: c.trust_domain,
        seq: c.seq,
        hash,
        time: c.time,
        key_id: c.key_id,
        json: c.json,
        path: c.path,
    })
}

fn checkpoint_key(k: pb::CheckpointKey) -> Result<CheckpointKey, CallError> {
    if k.public_key_pem.trim().is_empty() {
        return Err(CallError::invalid_answer(
            "a checkpoint key without its PEM",
        ));
    }
    Ok(CheckpointKey {
        algorithm: k.algorithm,
        key_id: k.key_id,
        public_key_pem: k.public_key_pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp() -> pb::Checkpoint {
        pb::Checkpoint {
            format: "signet-ledger-checkpoint-v1".into(),
            trust_domain: "example.org".into(),
            seq: 7,
            hash: vec![9; 32],
            time: 100,
            key_id: "ab".into(),
            signature: vec![1; 64],
            json: "{\"seq\":7}".into(),
            path: "/data/checkpoints/7.json".into(),
        }
    }

    #[test]
    fn a_checkpoint_needs_a_32_byte_hash_and_its_json() {
        let c = checkpoint(cp()).unwrap();
        assert_eq!((c.seq, c.hash, c.time), (7, [9; 32], 100));
        assert_eq!(c.json, "{\"seq\":7}");
        assert_eq!(c.path, "/data/checkpoints/7.json");
        for bad in [
            pb::Checkpoint {
                hash: vec![9; 31],
                ..cp()
            },
            pb::Checkpoint {
                json: " \n".into(),
                ..cp()
            },
        ] {
            let e = checkpoint(bad).unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        }
    }

    #[test]
    fn a_checkpoint_key_needs_its_pem() {
        let good = pb::CheckpointKey {
            algorithm: "ed25519".into(),
            key_id: "ab".into(),
            public_key_pem: "-----BEGIN PUBLIC KEY-----\n".into(),
        };
        assert_eq!(checkpoint_key(good.clone()).unwrap().key_id, "ab");
        let e = checkpoint_key(pb::CheckpointKey {
            public_key_pem: String::new(),
            ..good
        })
        .unwrap_err();
        assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
    }
}
