//! The operator's commands on the CA key slots (`signetctl ca prepare|activate|taint|revoke|
//! status`): each is validated against freshly read slots and applied through the same
//! exactly-once path as the rotator's transitions ([`super::staging`]). With a plugged-in CA
//! only the JWT keys can be changed: its operator rotates the CA by replacing its files.

use super::*;

impl CaManager {
    /// Refuses a command on a plugged-in CA's own certificates (the operator's files).
    fn refuse_plugged_ca_key(&self, id: &str) -> Result<(), ManagerError> {
        let view = self.view();
        if view.plugged && view.slots.iter().any(|s| s.external && s.slot.id == id) {
            return Err(plugged_refusal());
        }
        Ok(())
    }

    /// Runs an operator's change: validated against freshly read slots, applied if nothing
    /// changed meanwhile (else re-read and re-validated), then the rotator settles whatever
    /// follows from it (an activated root gets a new intermediate at once).
    async fn operate<F>(
        &self,
        now: SystemTime,
        actor: &str,
        mut plan: F,
    ) -> Result<Outcome, ManagerError>
    where
        F: FnMut(&[SlotInfo]) -> Result<(Step, Outcome), ManagerError>,
    {
        let _op = self.op.lock().await;
        let staging = self.staging();
        for _ in 0..8 {
            let (generation, slots) = self.read(now).await?;
            let (t, outcome) = plan(&slots)?;
            if staging.apply(generation, &slots, &t, actor, now).await? {
                tracing::info!(transition = ?t, actor, "CA slot transition (operator)");
                self.settle(now).await?;
                return Ok(outcome);
            }
        }
        Err(ManagerError::Store(StoreError::Unavailable(
            "the CA slots keep changing under this request; retry".into(),
        )))
    }

    /// Prepares a new key of `kind`: an intermediate under the active root, a root, or a JWT
    /// signing key.
    pub async fn prepare(
        &self,
        kind: Kind,
        actor: &str,
        now: SystemTime,
    ) -> Result<Outcome, ManagerError> {
        if kind != Kind::Jwt && self.is_plugged() {
            return Err(plugged_refusal());
        }
        self.operate(now, actor, |slots| {
            if let Some(p) = slots
                .iter()
                .find(|s| s.slot.kind == kind && s.slot.state == State::Prepared)
            {
                return Err(ManagerError::FailedPrecondition(format!(
                    "{} {} is already prepared: activate it (signetctl ca activate {}) or remove it (signetctl ca revoke {})",
                    kind.as_str(),
                    p.slot.id,
                    p.slot.id,
                    p.slot.id
                )));
            }
            let t = if kind == Kind::Root {
                Transition::PrepareRoot {
                    reason: Reason::Operator,
                }
            } else if kind == Kind::Jwt {
                Transition::PrepareJwt {
                    reason: Reason::Operator,
                }
            } else {
                let r = active_of(slots, Kind::Root).ok_or_else(|| {
                    ManagerError::FailedPrecondition("there is no active root".into())
                })?;
                Transition::PrepareIntermediate {
                    parent: r.slot.id.clone(),
                    reason: Reason::Operator,
                }
            };
            Ok((Step::Rotate(t), Outcome::default()))
        })
        .await
        .map(|mut o| {
            // The new key is the newest prepared one of its kind.
            if let Some(s) = self
                .view()
                .slots
                .iter()
                .filter(|s| s.slot.kind == kind && s.slot.state == State::Prepared)
                .max_by_key(|s| s.slot.prepared_at)
            {
                o.key_id = s.slot.id.clone();
            }
            o
        })
    }

    /// Activates the prepared key `id`, retiring the active key of its kind. A root that has
    /// been in the trust bundle for less than `ca.root_propagation` is refused unless `force`
    /// (then activated with a warning).
    pub async fn activate(
        &self,
        id: &str,
        force: bool,
        actor: &str,
        now: SystemTime,
    ) -> Result<Outcome, ManagerError> {
        self.refuse_plugged_ca_key(id)?;
        let policy = self.cfg.policy.clone();
        self.operate(now, actor, |slots| {
            let s = find(slots, id)?;
            if s.slot.state != State::Prepared {
                return Err(ManagerError::FailedPrecondition(format!(
                    "{} {id} is {}, not prepared: only a prepared key can be activated (signetctl ca prepare{})",
                    s.slot.kind.as_str(),
                    s.slot.state.as_str(),
                    prepare_flag(s.slot.kind)
                )));
            }
            let mut outcome = Outcome {
                key_id: id.to_owned(),
                warnings: Vec::new(),
            };
            match s.slot.kind {
                Kind::Intermediate => {
                    let root = active_of(slots, Kind::Root);
                    if root.map(|r| &r.slot.id) != s.slot.parent.as_ref() {
                        return Err(ManagerError::FailedPrecondition(format!(
                            "intermediate {id} was signed by {}, which is not the active root; prepare a new intermediate",
                            s.slot.parent.as_deref().unwrap_or("?")
                        )));
                    }
                    if s.slot.tainted {
                        outcome.warnings.push(format!("intermediate {id} is tainted"));
                    }
                }
                Kind::Jwt => {
                    if s.slot.tainted {
                        return Err(ManagerError::FailedPrecondition(format!(
                            "jwt key {id} is tainted: it must never sign; prepare a new one (signetctl ca prepare --kind jwt)"
                        )));
                    }
                    let current = active_of(slots, Kind::Jwt);
                    let replaceable_now = current
                        .is_none_or(|a| a.slot.tainted || a.slot.not_after <= now);
                    let ready = s.slot.prepared_at + policy.jwt_propagation;
                    if !replaceable_now && now < ready {
                        let since = now.duration_since(s.slot.prepared_at).unwrap_or_default();
                        return Err(ManagerError::FailedPrecondition(format!(
                            "jwt key {id} has been published for {} only, less than jwt_svid.key_propagation ({}): validators that have not fetched it yet would refuse its tokens. It may be activated from {} (unix {}), in {}",
                            humantime::format_duration(Duration::from_secs(since.as_secs())),
                            humantime::format_duration(policy.jwt_propagation),
                            humantime::format_rfc3339_seconds(ready),
                            unix(ready),
                            humantime::format_duration(Duration::from_secs(
                                ready.duration_since(now).unwrap_or_default().as_secs()
                            ))
                        )));
                    }
                }
                Kind::Root => {
                    let since = now
                        .duration_since(s.slot.prepared_at)
                        .unwrap_or_default();
                    if since < policy.root_propagation {
                        let young = format!(
                            "root {id} has been in the trust bundle for {} only, less than ca.root_propagation ({}): relying parties that have not received it yet will refuse certificates issued from now on",
                            humantime::format_duration(Duration::from_secs(since.as_secs())),
                            humantime::format_duration(policy.root_propagation)
                        );
                        if !force {
                            let ready = s.slot.prepared_at + policy.root_propagation;
                            return Err(ManagerError::FailedPrecondition(format!(
                                "{young}. It may be activated from {} (in {}); to activate it now anyway, pass --force (signetctl ca activate {id} --force)",
                                humantime::format_rfc3339_seconds(ready),
                                humantime::format_duration(Duration::from_secs(
                                    ready.duration_since(now).unwrap_or_default().as_secs()
                                ))
                            )));
                        }
                        outcome.warnings.push(format!("{young} (activated with --force)"));
                    }
                }
            }
            Ok((
                Step::Rotate(Transition::Activate {
                    id: id.to_owned(),
                    reason: Reason::Operator,
                }),
                outcome,
            ))
        })
        .await
    }

    /// Taints `id`: its ID (and, for a root, its intermediates') goes into the bundle's
    /// tainted key IDs, so every holder of a certificate issued under it replaces it.
    pub async fn taint(
        &self,
        id: &str,
        actor: &str,
        now: SystemTime,
    ) -> Result<Outcome, ManagerError> {
        self.refuse_plugged_ca_key(id)?;
        let outcome = self
            .operate(now, actor, |slots| {
                let s = find(slots, id)?;
                if s.slot.state == State::Removed {
                    return Err(ManagerError::FailedPrecondition(format!(
                        "{id} is removed; nothing trusts it any more"
                    )));
                }
                if s.slot.tainted {
                    return Err(ManagerError::FailedPrecondition(format!(
                        "{id} is already tainted"
                    )));
                }
                Ok((
                    Step::Taint(id.to_owned()),
                    Outcome {
                        key_id: id.to_owned(),
                        warnings: Vec::new(),
                    },
                ))
            })
            .await?;
        let mut outcome = outcome;
        let view = self.view();
        if let Some(s) = view
            .slots
            .iter()
            .find(|s| s.slot.id == id && s.slot.kind == Kind::Jwt)
        {
            outcome.warnings.push(match &view.active_jwt {
                Some(a) if s.slot.state != State::Active => format!(
                    "jwt key {id} signs nothing any more; JWT-SVIDs are signed by {}",
                    a.signer.key_id()
                ),
                Some(a) => format!(
                    "JWT-SVIDs are signed by {} from now on (valid until {})",
                    a.signer.key_id(),
                    humantime::format_rfc3339_seconds(a.not_after)
                ),
                None => "no JWT key is active: JWT-SVIDs are refused until one is (see signetctl ca status)".into(),
            });
        }
        if view.active_is_tainted() {
            outcome.warnings.push(format!(
                "the active signing key {} is tainted: certificates renewed now still come from it. \
                 Replace it: signetctl ca prepare{} and signetctl ca activate NEW_KEY_ID",
                view.active.key_id(),
                if view.tainted.contains(id)
                    && view
                        .slots
                        .iter()
                        .any(|s| s.slot.id == id && s.slot.kind == Kind::Root)
                {
                    " --root"
                } else {
                    ""
                }
            ));
        }
        Ok(outcome)
    }

    /// Removes the non-active key `id` (and, for a root, its intermediates) from the bundle
    /// and from the keys that authenticate mTLS clients. Refused while unexpired certificates
    /// issued under it remain, unless `force`.
    pub async fn revoke(
        &self,
        id: &str,
        force: bool,
        actor: &str,
        now: SystemTime,
    ) -> Result<Outcome, ManagerError> {
        self.refuse_plugged_ca_key(id)?;
        // A slot that failed vetting is trusted nowhere already: removing it only clears it
        // from the database (and `/readyz`), whatever it claims to have issued.
        if self.remove_rejected(id, actor, now).await? {
            return Ok(Outcome {
                key_id: id.to_owned(),
                warnings: Vec::new(),
            });
        }
        // Who still holds certificates under it (read before deciding).
        let (_, slots) = self.read(now).await?;
        let target = find(&slots, id)?;
        // The state first: an active key is never removed, whatever it issued.
        refuse_removal(target, &slots)?;
        let mut family = vec![target.slot.id.clone()];
        if target.slot.kind == Kind::Root {
            family.extend(
                slots
                    .iter()
                    .filter(|s| {
                        s.slot.parent.as_deref() == Some(id) && s.slot.state != State::Removed
                    })
                    .map(|s| s.slot.id.clone()),
            );
        }
        let outstanding: u64 = slots
            .iter()
            .filter(|s| family.contains(&s.slot.id))
            .map(|s| s.slot.issued_unexpired)
            .sum();
        let mut warnings = Vec::new();
        // A JWT key leaves no ledger count behind it: the tokens it signed live until at most
        // `max_ttl` after its retirement.
        if target.slot.kind == Kind::Jwt
            && let Some(retired) = target.slot.retired_at
            && retired + self.cfg.policy.jwt_max_ttl > now
        {
            warnings.push(format!(
                "JWT-SVIDs signed by jwt key {id} before its retirement may be unexpired until {}: they no longer validate once relying parties refresh their keys",
                humantime::format_rfc3339_seconds(retired + self.cfg.policy.jwt_max_ttl)
            ));
        }
        if outstanding > 0 {
            let holders = self.store.ca_key_holders(&family, unix(now), 10).await?;
            let list = holders
                .iter()
                .map(|(who, n)| format!("{who} ({n})"))
                .collect::<Vec<_>>()
                .join(", ");
            let msg = format!(
                "{outstanding} unexpired certificate(s) issued under {id} remain, held by: {list}{}",
                if holders.len() as u64 >= 10 {
                    ", …"
                } else {
                    ""
                }
            );
            if !force {
                return Err(ManagerError::FailedPrecondition(format!(
                    "{msg}. Taint it first (signetctl ca taint {id}) and wait until `signetctl ca status` shows 0, or pass --force to break them now"
                )));
            }
            warnings.push(format!("forced: {msg} will no longer verify"));
        }
        let mut outcome = self
            .operate(now, actor, move |slots| {
                let s = find(slots, id)?;
                refuse_removal(s, slots)?;
                Ok((Step::Revoke(id.to_owned()), Outcome::default()))
            })
            .await?;
        outcome.key_id = id.to_owned();
        outcome.warnings = warnings;
        Ok(outcome)
    }

    /// Removes `id` if it is a live slot that failed vetting; whether it was one.
    async fn remove_rejected(
        &self,
        id: &str,
        actor: &str,
        now: SystemTime,
    ) -> Result<bool, ManagerError> {
        let _op = self.op.lock().await;
        let staging = self.staging();
        for _ in 0..8 {
            let (generation, vetted) = self.read_vetted().await?;
            let Some(r) = vetted
                .rejected
                .iter()
                .find(|r| r.id == id && r.state != State::Removed.as_str())
            else {
                return Ok(false);
            };
            if staging.remove_rejected(generation, r, actor, now).await? {
                tracing::warn!(
                    key_id = id,
                    actor,
                    "a CA key slot that failed vetting was removed"
                );
                self.settle(now).await?;
                return Ok(true);
            }
        }
        Err(ManagerError::Store(StoreError::Unavailable(
            "the CA slots keep changing under this request; retry".into(),
        )))
    }

    /// Every slot with its ledger counts.
    pub async fn status(&self, now: SystemTime) -> Result<Vec<SlotStatus>, ManagerError> {
        let view = self.view();
        // Fresh slots (another replica may have moved them since the last tick).
        let mut slots = self.read(now).await?.1;
        if view.plugged {
            // The plugged-in CA's certificates (its files), then the JWT keys (the database).
            let mut external: Vec<SlotInfo> =
                view.slots.iter().filter(|s| s.external).cloned().collect();
            external.append(&mut slots);
            slots = external;
        }
        let usage = self.store.ca_key_usage(unix(now)).await?;
        let direct = |id: &str| {
            usage
                .iter()
                .find(|u| u.ca_key_id == id)
                .map_or((0, None), |u| (u.unexpired, Some(u.last_not_after)))
        };
        let tainted: Vec<String> = slots
            .iter()
            .filter(|s| s.slot.tainted)
            .map(|s| s.slot.id.clone())
            .collect();
        let mut waiting = HashMap::new();
        for s in slots
            .iter()
            .filter(|s| s.slot.tainted && s.slot.state != State::Removed)
        {
            let mut family = vec![s.slot.id.clone()];
            family.extend(
                slots
                    .iter()
                    .filter(|c| c.slot.parent.as_deref() == Some(s.slot.id.as_str()))
                    .map(|c| c.slot.id.clone()),
            );
            let n = self
                .store
                .ca_key_holders_not_replaced(&family, &tainted, unix(now))
                .await?;
            waiting.insert(s.slot.id.clone(), n);
        }
        let out = slots
            .iter()
            .map(|s| {
                let (mut n, mut last) = direct(&s.slot.id);
                if s.slot.kind == Kind::Root {
                    for c in slots
                        .iter()
                        .filter(|c| c.slot.parent.as_deref() == Some(s.slot.id.as_str()))
                    {
                        let (cn, cl) = direct(&c.slot.id);
                        n += cn;
                        last = last.max(cl);
                    }
                }
                SlotStatus {
                    info: s.clone(),
                    unexpired: n,
                    last_expiry: last,
                    holders_not_replaced: waiting.get(&s.slot.id).copied().unwrap_or(0),
                }
            })
            .collect();
        Ok(out)
    }
}

/// The `signetctl ca prepare` flag that makes a key of `kind`.
fn prepare_flag(kind: Kind) -> &'static str {
    match kind {
        Kind::Root => " --root",
        Kind::Intermediate => "",
        Kind::Jwt => " --kind jwt",
    }
}

/// Why `s` may not be removed now, if it may not: it is active, already removed, or (a root)
/// the active intermediate chains to it.
pub(super) fn refuse_removal(s: &SlotInfo, slots: &[SlotInfo]) -> Result<(), ManagerError> {
    let id = &s.slot.id;
    match s.slot.state {
        State::Active => {
            return Err(ManagerError::FailedPrecondition(format!(
                "{} {id} is active: {}",
                s.slot.kind.as_str(),
                if s.slot.kind == Kind::Jwt {
                    format!(
                        "taint it first (signetctl ca taint {id}): a new JWT key replaces it at once"
                    )
                } else {
                    format!(
                        "prepare and activate a successor first (signetctl ca prepare{}; signetctl ca activate NEW_KEY_ID)",
                        prepare_flag(s.slot.kind)
                    )
                }
            )));
        }
        State::Removed => {
            return Err(ManagerError::FailedPrecondition(format!(
                "{id} is already removed"
            )));
        }
        _ => {}
    }
    if let Some(child) = slots
        .iter()
        .find(|c| c.slot.parent.as_deref() == Some(id.as_str()) && c.slot.state == State::Active)
    {
        return Err(ManagerError::FailedPrecondition(format!(
            "the active intermediate {} chains to {id}: activate a new root first",
            child.slot.id
        )));
    }
    Ok(())
}
