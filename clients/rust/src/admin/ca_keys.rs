//! [`CaAdminClient`]: the typed client of `signet.admin.v1.CaAdmin`, the CA key slots (roots
//! and intermediates): their status, and preparing, activating, tainting and revoking one.
//!
//! The invariant is the crate's: a slot or an action's answer reaches the caller only if it
//! names a key (an empty key ID is a [`CallError::InvalidAnswer`]), and a slot that passed the
//! server's vetting names a [`SlotState`] (any other text is an invalid answer); the proto's
//! "0 means none" times and empty parent are `None` here.

use std::path::Path;

use signet_proto::admin as pb;
use signet_proto::admin::ca_admin_client::CaAdminClient as PbCaAdminClient;
use signet_types::ca_slot::{SlotState, UnknownSlotState};
use tonic::transport::Channel;

use crate::ClientError;

use crate::convert::request;
use crate::error::CallError;

/// One CA key slot, as `CaAdmin.Status` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaKeySlot {
    pub key_id: String,
    /// `root`, `intermediate` or `jwt` (a JWT-SVID signing key), as the server names it.
    pub kind: String,
    /// The slot's state. Only a slot that failed the server's vetting (`rejected`) may hold
    /// stored text that is no state: then the error carries that text.
    pub state: Result<SlotState, UnknownSlotState>,
    pub tainted: bool,
    pub algorithm: String,
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub not_after: i64,
    /// The key that signed this one (intermediates).
    pub parent_key_id: Option<String>,
    /// Unexpired, unrevoked certificates issued under it.
    pub unexpired_certificates: u64,
    /// When the last of them expires (unix seconds).
    pub last_expiry: Option<i64>,
    pub prepared_at: Option<i64>,
    pub activated_at: Option<i64>,
    pub retired_at: Option<i64>,
    pub removed_at: Option<i64>,
    /// A plugged-in CA's certificate.
    pub external: bool,
    /// Why the stored slot failed vetting and is trusted nowhere (`None`: it passed).
    pub rejected: Option<String>,
    /// A tainted key: holders of unexpired certificates under it not yet replaced.
    pub holders_not_replaced: u64,
}

/// `CaAdmin.Status`: every slot, whether the CA is plugged in, the signing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaStatus {
    pub slots: Vec<CaKeySlot>,
    pub plugged: bool,
    /// The key that signs workload certificates.
    pub active_key_id: String,
    /// The key that signs JWT-SVIDs (`None`: none is active).
    pub active_jwt_key_id: Option<String>,
}

/// Which kind of key `Prepare` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaKeyKind {
    Root,
    Intermediate,
    /// A JWT-SVID signing key.
    Jwt,
}

impl CaKeyKind {
    /// The server's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CaKeyKind::Root => "root",
            CaKeyKind::Intermediate => "intermediate",
            CaKeyKind::Jwt => "jwt",
        }
    }
}

/// What a CA key action did: the key it acted on and what the operator should know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaAction {
    pub key_id: String,
    pub warnings: Vec<String>,
}

/// See the module documentation. Cloning is cheap (one shared channel).
#[derive(Clone, Debug)]
pub struct CaAdminClient {
    ca: PbCaAdminClient<Channel>,
}

impl CaAdminClient {
    /// Connects to the admin API on the server's Unix socket.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect_admin(socket).await?))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            ca: PbCaAdminClient::new(channel),
        }
    }

    /// `Status`.
    pub async fn status(&self) -> Result<CaStatus, CallError> {
        let r = self
            .ca
            .clone()
            .status(request(pb::CaStatusRequest {}, None)?)
            .await?
            .into_inner();
        ca_status(r)
    }

    /// `Prepare`: a new intermediate under the active root (with `root`, a new root).
    pub async fn prepare(&self, root: bool) -> Result<CaAction, CallError> {
        self.prepare_kind(if root {
            CaKeyKind::Root
        } else {
            CaKeyKind::Intermediate
        })
        .await
    }

    /// `Prepare` a key of `kind`: a root, an intermediate under the active root, or a JWT-SVID
    /// signing key (published at once, signing nothing until activated).
    pub async fn prepare_kind(&self, kind: CaKeyKind) -> Result<CaAction, CallError> {
        let msg = pb::CaPrepareRequest {
            root: kind == CaKeyKind::Root,
            kind: kind.as_str().into(),
        };
        ca_action(
            self.ca
                .clone()
                .prepare(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `Activate` a prepared key (`force`: a root even before its propagation window is over;
    /// without it the server refuses such a root with FailedPrecondition).
    pub async fn activate(&self, key_id: &str, force: bool) -> Result<CaAction, CallError> {
        let msg = pb::CaActivateRequest {
            key_id: key_id.to_owned(),
            force,
        };
        ca_action(
            self.ca
                .clone()
                .activate(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `Taint` a key.
    pub async fn taint(&self, key_id: &str) -> Result<CaAction, CallError> {
        let msg = pb::CaKeyRequest {
            key_id: key_id.to_owned(),
        };
        ca_action(
            self.ca
                .clone()
                .taint(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `Revoke`: remove a non-active key from the trust bundle (`force`: even while
    /// unexpired certificates issued under it remain).
    pub async fn revoke(&self, key_id: &str, force: bool) -> Result<CaAction, CallError> {
        let msg = pb::CaRevokeRequest {
            key_id: key_id.to_owned(),
            force,
        };
        ca_action(
            self.ca
                .clone()
                .revoke(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }
}

fn nonzero(t: i64) -> Option<i64> {
    (t != 0).then_some(t)
}

fn ca_slot(s: pb::CaSlot) -> Result<CaKeySlot, CallError> {
    if s.key_id.is_empty() {
        return Err(CallError::invalid_answer("a CA key slot without a key ID"));
    }
    let state = match s.state.parse::<SlotState>() {
        Ok(state) => Ok(state),
        Err(e) if !s.rejected.is_empty() => Err(e),
        Err(e) => {
            return Err(CallError::invalid_answer(format!(
                "CA key slot {}: {e}",
                s.key_id
            )));
        }
    };
    Ok(CaKeySlot {
        key_id: s.key_id,
        kind: s.kind,
        state,
        tainted: s.tainted,
        algorithm: s.algorithm,
        not_before: s.not_before,
        not_after: s.not_after,
        parent_key_id: (!s.parent_key_id.is_empty()).then_some(s.parent_key_id),
        unexpired_certificates: s.unexpired_certificates,
        last_expiry: nonzero(s.last_expiry),
        prepared_at: nonzero(s.prepared_at),
        activated_at: nonzero(s.activated_at),
        retired_at: nonzero(s.retired_at),
        removed_at: nonzero(s.removed_at),
        external: s.external,
        rejected: (!s.rejected.is_empty()).then_some(s.rejected),
        holders_not_replaced: s.holders_not_replaced,
    })
}

fn ca_status(r: pb::CaStatusResponse) -> Result<CaStatus, CallError> {
    Ok(CaStatus {
        slots: r.slots.into_iter().map(ca_slot).collect::<Result<_, _>>()?,
        plugged: r.plugged,
        active_key_id: r.active_key_id,
        active_jwt_key_id: (!r.active_jwt_key_id.is_empty()).then_some(r.active_jwt_key_id),
    })
}

fn ca_action(r: pb::CaActionResponse) -> Result<CaAction, CallError> {
    if r.key_id.is_empty() {
        return Err(CallError::invalid_answer("a CA key action naming no key"));
    }
    Ok(CaAction {
        key_id: r.key_id,
        warnings: r.warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot() -> pb::CaSlot {
        pb::CaSlot {
            key_id: "k1".into(),
            kind: "intermediate".into(),
            state: "active".into(),
            tainted: true,
            algorithm: "ecdsa-p256".into(),
            not_before: 10,
            not_after: 20,
            parent_key_id: "r1".into(),
            unexpired_certificates: 3,
            last_expiry: 0,
            prepared_at: 5,
            activated_at: 6,
            retired_at: 0,
            removed_at: 0,
            external: false,
            rejected: String::new(),
            holders_not_replaced: 0,
        }
    }

    #[test]
    fn a_slot_converts_with_zero_times_and_no_parent_as_none() {
        let s = ca_slot(slot()).unwrap();
        assert_eq!(s.parent_key_id.as_deref(), Some("r1"));
        assert_eq!(
            (s.last_expiry, s.prepared_at, s.activated_at),
            (None, Some(5), Some(6))
        );
        assert_eq!((s.retired_at, s.removed_at), (None, None));
        assert_eq!(
            (s.not_before, s.not_after, s.unexpired_certificates),
            (10, 20, 3)
        );
        assert!(s.tainted && !s.external);
        let root = ca_slot(pb::CaSlot {
            parent_key_id: String::new(),
            ..slot()
        })
        .unwrap();
        assert_eq!(root.parent_key_id, None);
        let st = ca_status(pb::CaStatusResponse {
            slots: vec![slot()],
            plugged: true,
            active_key_id: "k1".into(),
            active_jwt_key_id: String::new(),
        })
        .unwrap();
        assert!(st.plugged && st.slots.len() == 1 && st.active_key_id == "k1");
        assert_eq!(st.active_jwt_key_id, None);
        let st = ca_status(pb::CaStatusResponse {
            slots: vec![pb::CaSlot {
                key_id: "Jw-k_1".into(),
                kind: "jwt".into(),
                ..slot()
            }],
            plugged: false,
            active_key_id: "k1".into(),
            active_jwt_key_id: "Jw-k_1".into(),
        })
        .unwrap();
        assert_eq!(st.active_jwt_key_id.as_deref(), Some("Jw-k_1"));
        assert_eq!(st.slots[0].kind, "jwt");
        assert_eq!(CaKeyKind::Jwt.as_str(), "jwt");
    }

    #[test]
    fn a_slot_state_is_typed_and_only_a_rejected_slot_may_hold_other_text() {
        assert_eq!(ca_slot(slot()).unwrap().state, Ok(SlotState::Active));
        let e = ca_slot(pb::CaSlot {
            state: "Active".into(),
            ..slot()
        })
        .unwrap_err();
        assert!(e.to_string().contains("\"Active\""), "{e}");
        let rejected = ca_slot(pb::CaSlot {
            state: "bogus".into(),
            rejected: "state \"bogus\"".into(),
            ..slot()
        })
        .unwrap();
        assert_eq!(rejected.state, Err(UnknownSlotState("bogus".into())));
        assert_eq!(rejected.rejected.as_deref(), Some("state \"bogus\""));
    }

    #[test]
    fn a_slot_or_action_naming_no_key_is_refused() {
        let e = ca_status(pb::CaStatusResponse {
            slots: vec![
                slot(),
                pb::CaSlot {
                    key_id: String::new(),
                    ..slot()
                },
            ],
            plugged: false,
            active_key_id: "k1".into(),
            active_jwt_key_id: String::new(),
        })
        .unwrap_err();
        assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        let a = ca_action(pb::CaActionResponse {
            key_id: "k2".into(),
            warnings: vec!["w".into()],
        })
        .unwrap();
        assert_eq!((a.key_id.as_str(), a.warnings.len()), ("k2", 1));
        let e = ca_action(pb::CaActionResponse::default()).unwrap_err();
        assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
    }
}
