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
    pub(super) keys: &'a Mutex<KeyCache>,
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
            Step::Rotate(Transition::PrepareJwt { reason }) => {
                let (row, signer) = self.jwt_row(now, at).await?;
                change.audit.push(event(
                    "ca.prepared",
                    format!(
                        "jwt {} prepared ({}), {}, valid until {}",
                        row.id,
                        reason.as_str(),
                        signer.alg(),
                        unix(now + self.cfg.jwt_key_ttl)
                    ),
                ));
                change.inserts.push(row);
            }
            Step::Rotate(Transition::PrepareIntermediate { parent, reason }) => {
                let parent_slot = find(slots, parent)?;
                let root = self
                    .keys
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get(parent_slot)
                    .ok_or_else(|| {
                        ManagerError::Key(format!("root {parent} is not open (see ca status)"))
                    })?;
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
                    state: State::Active,
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
                        state: State::Retired,
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
                // A tainted JWT key never signs again: its private key goes with the taint, so
                // clearing the taint in the database leaves a slot that opens nothing.
                if find(slots, id)?.slot.kind == Kind::Jwt {
                    change.updates.push(SlotUpdate::erase_key(id.clone()));
                }
                change
                    .audit
                    .push(event("ca.tainted", format!("{id} tainted")));
            }
            Step::Revoke(id) => {
                let s = find(slots, id)?;
                let mut ids = vec![id.clone()];
                // Revoking is distrust: the key is tainted too (its root's CRL lists it, and
                // holders replace what it signed until it expires).
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
                    change.updates.push(SlotUpdate::Taint { id: k.clone(), at });
                    change.updates.push(SlotUpdate::State {
                        id: k.clone(),
                        state: State::Removed,
                        at,
                    });
                    change.updates.push(SlotUpdate::erase_key(k));
                }
            }
            Step::Rotate(Transition::Remove { id, reason }) => {
                let s = find(slots, id)?;
                change.updates.push(SlotUpdate::State {
                    id: id.clone(),
                    state: State::Removed,
                    at,
                });
                change.updates.push(SlotUpdate::erase_key(id.clone()));
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

    /// Stores keys sealed before the slot binding sealed again with it (see `vetting`), if the
    /// slots are still at `generation`.
    pub(super) async fn reseal(
        &self,
        generation: u64,
        resealed: &[(String, Vec<u8>)],
        actor: &str,
        now: SystemTime,
    ) -> Result<bool, ManagerError> {
        let mut change = CaChange::default();
        for (id, sealed) in resealed {
            change.updates.push(SlotUpdate::SealedKey {
                id: id.clone(),
                encrypted_key: sealed.clone(),
            });
            change.audit.push(AuditEvent {
                id: 0,
                at: unix(now),
                kind: "ca.resealed".into(),
                caller: actor.into(),
                detail: format!(
                    "{id}: its key is sealed again, bound to its certificate, kind and parent"
                ),
            });
        }
        Ok(self.store.apply_ca_change(generation, &change).await?)
    }

    /// Removes a slot that failed vetting (its key erased), if the slots are still at
    /// `generation`.
    pub(super) async fn remove_rejected(
        &self,
        generation: u64,
        r: &RejectedSlot,
        actor: &str,
        now: SystemTime,
    ) -> Result<bool, ManagerError> {
        let at = unix(now);
        let mut change = CaChange::default();
        change.updates.push(SlotUpdate::State {
            id: r.id.clone(),
            state: State::Removed,
            at,
        });
        change.updates.push(SlotUpdate::erase_key(r.id.clone()));
        change.audit.push(AuditEvent {
            id: 0,
            at,
            kind: "ca.revoked".into(),
            caller: actor.into(),
            detail: format!(
                "{} {} ({}), which failed vetting ({}), removed",
                r.kind, r.id, r.state, r.reason
            ),
        });
        Ok(self.store.apply_ca_change(generation, &change).await?)
    }

    /// Generates a JWT signing key (RSA off the async runtime) and its self-signed
    /// certificate, valid from `now` for `jwt_key_ttl`, sealed into a `jwt` slot row.
    async fn jwt_row(
        &self,
        now: SystemTime,
        at: i64,
    ) -> Result<(CaSlotRow, Arc<signet_pki::jwt::JwtSigner>), ManagerError> {
        let alg = self.cfg.jwt_key_type.key_algorithm();
        let failed =
            |e: &dyn std::fmt::Display| ManagerError::Key(format!("generating a JWT key: {e}"));
        let key = match alg {
            signet_pki::key::KeyAlgorithm::Rsa(_) => {
                tokio::task::spawn_blocking(move || signet_pki::key::generate(alg))
                    .await
                    .map_err(|e| failed(&e))?
            }
            _ => signet_pki::key::generate(alg),
        }
        .map_err(|e| failed(&e))?;
        let signer = Arc::new(signet_pki::jwt::JwtSigner::new(&key).map_err(|e| failed(&e))?);
        let kid = signer.key_id().to_owned();
        let not_after = now + self.cfg.jwt_key_ttl;
        let params = crate::ca::template::jwt_key_params(
            &kid,
            now,
            not_after,
            &self.serials.next_serial(now),
        )
        .ok_or_else(|| failed(&"the key's validity is out of range"))?;
        let sign_alg = match alg {
            signet_pki::key::KeyAlgorithm::Rsa(_) => &rcgen::PKCS_RSA_SHA256,
            _ => &rcgen::PKCS_ECDSA_P256_SHA256,
        };
        let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &rustls::pki_types::PrivatePkcs8KeyDer::from(key.pkcs8_der().to_vec()),
            sign_alg,
        )
        .map_err(|e| failed(&e))?;
        let cert = params.self_signed(&pair).map_err(|e| failed(&e))?;
        let cert_der = cert.der().to_vec();
        let aad = vetting::slot_aad(&kid, Kind::Jwt, None, &cert_der);
        let row = CaSlotRow {
            encrypted_key: self.kek.seal(key.pkcs8_der(), &aad),
            slot: kid.clone(),
            id: kid,
            kind: Kind::Jwt.as_str().into(),
            state: State::Prepared.as_str().into(),
            parent_id: None,
            algorithm: signer.alg().as_str().into(),
            cert_pem: signet_types::pem::cert_to_pem(&cert_der),
            created_at: at,
            activated_at: None,
            retired_at: None,
            removed_at: None,
            tainted_at: None,
        };
        Ok((row, signer))
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
        let aad = vetting::slot_aad(&id, kind, parent.as_deref(), authority.cert_der());
        CaSlotRow {
            encrypted_key: self.kek.seal(pkcs8, &aad),
            slot: id.clone(),
            id,
            kind: kind.as_str().into(),
            state: State::Prepared.as_str().into(),
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
