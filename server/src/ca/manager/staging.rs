//! Persisting one slot change: turns a [`Step`] into a [`CaChange`] (generating and sealing a
//! new key under the KEK when one is prepared) and applies it only if the slots are still at
//! the generation they were read at, with its audit event in the same transaction.

use super::*;

/// What applying a transition needs.
pub(super) struct Staging<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) kek: &'a Kek,
    pub(super) cfg: &'a ManagerConfig,
    pub(super) serials: &'a dyn SerialSource,
    pub(super) keys: &'a Mutex<HashMap<String, Arc<Authority>>>,
}

impl Staging<'_> {
    /// Turns `t` into a change and applies it if the slots are still at `generation`.
    /// Returns whether it was applied.
    pub(super) async fn apply(
        &self,
        generation: u64,
        slots: &[SlotInfo],
        step: &Step,
        actor: &str,
        now: SystemTime,
    ) -> Result<bool, ManagerError> {
        let at = unix(now);
        let event = |kind: &str, detail: String| AuditEvent {
            id: 0,
            at,
            kind: kind.into(),
            caller: actor.into(),
            detail,
        };
        let mut change = CaChange::default();
        match step {
            Step::Rotate(Transition::PrepareRoot { reason }) => {
                let (authority, pkcs8) = Authority::generate_root(
                    &self.cfg.trust_domain,
                    self.cfg.key_type,
                    now,
                    self.cfg.root_ttl,
                    self.serials,
                )
                .map_err(|e| ManagerError::Key(format!("generating a root: {e}")))?;
                change
                    .inserts
                    .push(self.row(&authority, &pkcs8, Kind::Root, None, at));
                change.audit.push(event(
                    "ca.prepared",
                    format!(
                        "root {} prepared ({}), valid until {}",
                        authority.key_id(),
                        reason.as_str(),
                        unix(authority.not_after())
                    ),
                ));
            }
            Step::Rotate(Transition::PrepareIntermediate { parent, reason }) => {
                let parent_slot = find(slots, parent)?;
                let root = load_authority(parent_slot, slots, self.kek, self.keys)?;
                let (authority, pkcs8) = root
                    .sign_intermediate(
                        &self.cfg.trust_domain,
                        self.cfg.key_type,
                        now,
                        self.cfg.intermediate_ttl,
                        self.serials,
                    )
                    .map_err(|e| ManagerError::Key(format!("signing an intermediate: {e}")))?;
                change.inserts.push(self.row(
                    &authority,
                    &pkcs8,
                    Kind::Intermediate,
                    Some(parent.clone()),
                    at,
                ));
                change.audit.push(event(
                    "ca.prepared",
                    format!(
                        "intermediate {} prepared under root {parent} ({}), valid until {}",
                        authority.key_id(),
                        reason.as_str(),
                        unix(authority.not_after())
                    ),
                ));
            }
            Step::Rotate(Transition::Activate { id, reason }) => {
                let s = find(slots, id)?;
                change.updates.push(SlotUpdate::State {
                    id: id.clone(),
                    state: "active".into(),
                    at,
                });
                change.audit.push(event(
                    "ca.activated",
                    format!(
                        "{} {id} activated ({})",
                        s.slot.kind.as_str(),
                        reason.as_str()
                    ),
                ));
                for old in slots
                    .iter()
                    .filter(|o| o.slot.kind == s.slot.kind && o.slot.state == State::Active)
                {
                    change.updates.push(SlotUpdate::State {
                        id: old.slot.id.clone(),
                        state: "retired".into(),
                        at,
                    });
                    change.audit.push(event(
                        "ca.retired",
                        format!(
                            "{} {} retired, replaced by {id}",
                            old.slot.kind.as_str(),
                            old.slot.id
                        ),
                    ));
                }
            }
            Step::Taint(id) => {
                change
                    .updates
                    .push(SlotUpdate::Taint { id: id.clone(), at });
                change
                    .audit
                    .push(event("ca.tainted", format!("{id} tainted")));
            }
            Step::Revoke(id) => {
                let s = find(slots, id)?;
                let mut ids = vec![id.clone()];
                if s.slot.kind == Kind::Root {
                    ids.extend(
                        slots
                            .iter()
                            .filter(|c| {
                                c.slot.parent.as_deref() == Some(id.as_str())
                                    && c.slot.state != State::Removed
                            })
                            .map(|c| c.slot.id.clone()),
                    );
                }
                for k in ids {
                    change.audit.push(event(
                        "ca.revoked",
                        format!(
                            "{k} removed from the trust bundle{}",
                            if &k == id {
                                String::new()
                            } else {
                                format!(" (under root {id})")
                            }
                        ),
                    ));
                    change.updates.push(SlotUpdate::State {
                        id: k,
                        state: "removed".into(),
                        at,
                    });
                }
            }
            Step::Rotate(Transition::Remove { id, reason }) => {
                let s = find(slots, id)?;
                change.updates.push(SlotUpdate::State {
                    id: id.clone(),
                    state: "removed".into(),
                    at,
                });
                change.audit.push(event(
                    "ca.removed",
                    format!(
                        "{} {id} removed ({})",
                        s.slot.kind.as_str(),
                        reason.as_str()
                    ),
                ));
            }
        }
        Ok(self.store.apply_ca_change(generation, &change).await?)
    }

    fn row(
        &self,
        authority: &Authority,
        pkcs8: &[u8],
        kind: Kind,
        parent: Option<String>,
        at: i64,
    ) -> CaSlotRow {
        let id = authority.key_id().to_owned();
        CaSlotRow {
            encrypted_key: self.kek.seal(pkcs8, id.as_bytes()),
            slot: id.clone(),
            id,
            kind: kind.as_str().into(),
            state: "prepared".into(),
            parent_id: parent,
            algorithm: format!("{:?}", self.cfg.key_type),
            cert_pem: signet_types::pem::cert_to_pem(authority.cert_der()),
            created_at: at,
            activated_at: None,
            retired_at: None,
            removed_at: None,
            tainted_at: None,
        }
    }
}
