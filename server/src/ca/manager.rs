//! The CA key manager (SPIRE's `ca/manager`): loads, creates, seals and moves the CA key slots,
//! and publishes what the rest of the server needs from them — the key that signs workload
//! certificates, the trust bundle's roots, the tainted key IDs, the keys that authenticate mTLS
//! clients — to the listeners registered with [`CaManager::on_change`].
//!
//! Two modes:
//! - **Generated** (the default): a root Signet generated (its key sealed under the KEK in the
//!   database) signs only intermediates; the active intermediate signs leaves. Slots move
//!   prepared → active → retired → removed as [`super::rotator::decide`] says, on every
//!   [`CaManager::tick`], or as the operator says ([`CaManager::prepare`], [`CaManager::activate`],
//!   [`CaManager::taint`], [`CaManager::revoke`]). Each transition is one
//!   [`crate::store::CaChange`] applied only if the slots did not change since they were read
//!   (see `store::ca_slots`): exactly once across replicas, with its audit event in the same
//!   transaction. A replica that lost the race re-reads the slots and decides again; the tick
//!   also picks up transitions made by other replicas.
//! - **Plugged** (`ca.cert_file` …, Istio's `cacerts`): the operator's signing certificate is
//!   the intermediate and `root-cert.pem` is the bundle. The files are re-read on every tick
//!   and a change is loaded without a restart (a broken change is logged and ignored). The
//!   operator rotates by replacing the files; the slot commands are refused.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use signet_types::TrustDomain;

use super::kek::Kek;
use super::rotator::{self, Jitter, Kind, Reason, Slot, State, Transition};
use super::serial::SerialSource;
use super::{Authority, validate};
use crate::clock::{from_unix, unix};
use crate::config::{CaConfig, KeyType};
use crate::store::{AuditEvent, CaChange, CaSlotRow, SlotUpdate, Store, StoreError};

/// Why a manager operation failed, by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// No such key.
    #[error("{0}")]
    NotFound(String),
    /// The slots are not in a state that allows it (the message says what to do first).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The database could not be reached (retryable) or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A key could not be generated, decrypted or loaded.
    #[error("{0}")]
    Key(String),
}

/// The lifetimes and thresholds, from `[ca]`.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    pub trust_domain: TrustDomain,
    pub key_type: KeyType,
    pub root_ttl: Duration,
    pub intermediate_ttl: Duration,
    pub policy: rotator::Policy,
}

impl ManagerConfig {
    pub fn from_config(td: TrustDomain, ca: &CaConfig) -> Self {
        Self {
            trust_domain: td,
            key_type: ca.key_type,
            root_ttl: ca.root_ttl,
            intermediate_ttl: ca.intermediate_ttl,
            policy: rotator::Policy {
                intermediate_prepare_at: ca.intermediate_prepare_at,
                intermediate_activate_at: ca.intermediate_activate_at,
                root_prepare_at: ca.root_prepare_at,
                root_activate_at: ca.root_activate_at,
                root_propagation: ca.root_propagation,
                jitter: ca.rotation_jitter,
                // Another replica signs with a key until its next tick has seen the key
                // retired (up to 1.1 intervals later); its last certificates must be in the
                // ledger before the removal decision counts them.
                removal_grace: rotator::REMOVAL_GRACE.max(ca.rotation_interval.saturating_mul(3)),
            },
        }
    }
}

/// The plugged-in CA's files.
#[derive(Debug, Clone)]
pub struct PluggedFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub chain: PathBuf,
    pub root: PathBuf,
}

impl PluggedFiles {
    fn read(&self) -> Result<[Vec<u8>; 4], ManagerError> {
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| ManagerError::Key(format!("reading {}: {e}", p.display())))
        };
        Ok([
            read(&self.cert)?,
            read(&self.key)?,
            read(&self.chain)?,
            read(&self.root)?,
        ])
    }

    fn load(&self, files: &[Vec<u8>; 4]) -> Result<Authority, ManagerError> {
        Authority::from_cacerts_pem(&files[0], &files[1], &files[2], &files[3])
            .map_err(|e| ManagerError::Key(format!("plugged-in CA ({}): {e}", self.cert.display())))
    }
}

/// One slot as the manager knows it.
#[derive(Debug, Clone)]
pub struct SlotInfo {
    pub slot: Slot,
    pub algorithm: String,
    /// The key's certificate, DER.
    pub cert_der: Vec<u8>,
    pub activated_at: Option<i64>,
    pub retired_at: Option<i64>,
    pub removed_at: Option<i64>,
    pub tainted_at: Option<i64>,
    /// A plugged-in CA's certificate (not a slot in the database).
    pub external: bool,
    sealed: Sealed,
}

/// A private key sealed under the KEK; `Debug` prints only its length.
#[derive(Clone, Default)]
struct Sealed(Vec<u8>);

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealed({} bytes)", self.0.len())
    }
}

/// A change to the slots: one of the rotator's transitions, or an operator's taint or
/// revocation. All go through the same apply path and its exactly-once rule.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Rotate(Transition),
    Taint(String),
    Revoke(String),
}

/// What the manager publishes; every field is derived from the slots.
#[derive(Debug)]
pub struct CaView {
    /// The slot generation this was built from (plugged: counts file reloads).
    pub generation: u64,
    pub slots: Vec<SlotInfo>,
    /// Signs workload certificates.
    pub active: Arc<Authority>,
    /// Every key that has signed (active or retired, not removed) and whose private key is
    /// loaded: the issuing keys a CRL is signed with. A prepared key has issued nothing, and
    /// relying parties do not know its certificate yet, so it publishes no CRL.
    pub signers: Vec<Arc<Authority>>,
    /// The trust bundle: every root that is prepared, active, or retired (still trusted).
    pub roots: Vec<Vec<u8>>,
    /// The root the active intermediate chains to.
    pub active_root: Vec<u8>,
    /// Certificates that authenticate mTLS clients: every non-removed key Signet generated;
    /// with a plugged-in CA only its signing certificate(s), never a sibling under its root.
    pub client_anchors: Vec<Vec<u8>>,
    /// Tainted keys that are not removed, and the intermediates under a tainted root.
    pub tainted: BTreeSet<String>,
    pub plugged: bool,
}

impl CaView {
    /// Whether the active signing key (or the root above it) is tainted: renewing then
    /// replaces nothing.
    pub fn active_is_tainted(&self) -> bool {
        self.tainted.contains(self.active.key_id())
    }
}

type Listener = Box<dyn Fn(&Arc<CaView>) + Send + Sync>;

struct Plugged {
    files: PluggedFiles,
    loaded: [Vec<u8>; 4],
    /// Signing certificates of earlier file versions, kept as mTLS anchors until they expire.
    previous: Vec<Arc<Authority>>,
}

/// What an operator's activation reports besides success.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub key_id: String,
    /// Something the operator should know (printed by `signetctl`).
    pub warnings: Vec<String>,
}

/// One slot in `ca status`.
#[derive(Debug, Clone)]
pub struct SlotStatus {
    pub info: SlotInfo,
    /// Unexpired, unrevoked certificates issued under the key (for a root: directly and under
    /// its intermediates).
    pub unexpired: u64,
    /// When the last of them expires (unix seconds).
    pub last_expiry: Option<i64>,
}

pub struct CaManager {
    store: Arc<dyn Store>,
    kek: Option<Kek>,
    cfg: ManagerConfig,
    serials: Arc<dyn SerialSource>,
    jitter: Arc<dyn Jitter>,
    plugged: Mutex<Option<Plugged>>,
    view: ArcSwap<CaView>,
    listeners: Mutex<Vec<Listener>>,
    /// Decrypted keys by ID (a slot's key never changes).
    keys: Mutex<HashMap<String, Arc<Authority>>>,
    /// One tick or operator action at a time in this process.
    op: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for CaManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaManager")
            .field("active", &self.view.load().active.key_id())
            .finish_non_exhaustive()
    }
}

const ROTATOR: &str = "rotator";

impl CaManager {
    /// A manager of generated keys: loads the slots, creating the first root and intermediate
    /// (or, on a database from before slots, the first intermediate) if needed.
    pub async fn generated(
        store: Arc<dyn Store>,
        kek: Kek,
        cfg: ManagerConfig,
        serials: Arc<dyn SerialSource>,
        jitter: Arc<dyn Jitter>,
        now: SystemTime,
    ) -> Result<Arc<CaManager>, ManagerError> {
        let mut generation = u64::MAX;
        let mut view = None;
        let keys = Mutex::new(HashMap::new());
        // Bootstrap: a handful of transitions at most; other replicas may be racing.
        for _ in 0..16 {
            let (g, rows) = store.ca_slots().await?;
            let slots = parse_slots(&rows)?;
            let has = |k: Kind| {
                slots
                    .iter()
                    .any(|s| s.slot.kind == k && s.slot.state == State::Active)
            };
            if has(Kind::Root) && has(Kind::Intermediate) {
                generation = g;
                view = Some(slots);
                break;
            }
            let bare: Vec<Slot> = slots.iter().map(|s| s.slot.clone()).collect();
            let Some(t) = rotator::decide(&bare, now, &cfg.policy, jitter.as_ref())
                .into_iter()
                .next()
            else {
                return Err(ManagerError::Key(
                    "the CA slots have no active key and nothing to do".into(),
                ));
            };
            let staging = Staging {
                store: store.as_ref(),
                kek: &kek,
                cfg: &cfg,
                serials: serials.as_ref(),
                keys: &keys,
            };
            staging
                .apply(g, &slots, &Step::Rotate(t), ROTATOR, now)
                .await?;
        }
        let Some(slots) = view else {
            return Err(ManagerError::Key(
                "could not create the first CA keys (another replica keeps changing them?)".into(),
            ));
        };
        let built = build_view(generation, slots, &kek, &keys)?;
        let manager = Arc::new(CaManager {
            store,
            kek: Some(kek),
            cfg,
            serials,
            jitter,
            plugged: Mutex::new(None),
            view: ArcSwap::from_pointee(built),
            listeners: Mutex::new(Vec::new()),
            keys,
            op: tokio::sync::Mutex::new(()),
        });
        // Whatever is overdue (a server down past its intermediate's rotation or expiry)
        // happens before the first certificate is signed.
        manager.tick(now).await?;
        Ok(manager)
    }

    /// A manager of a plugged-in CA.
    pub fn plugged(
        store: Arc<dyn Store>,
        files: PluggedFiles,
        cfg: ManagerConfig,
        serials: Arc<dyn SerialSource>,
    ) -> Result<Arc<CaManager>, ManagerError> {
        let loaded = files.read()?;
        let authority = Arc::new(files.load(&loaded)?);
        tracing::info!(key_id = authority.key_id(), "using plugged-in CA");
        let view = plugged_view(0, authority, &[]);
        Ok(Arc::new(CaManager {
            store,
            kek: None,
            cfg,
            serials,
            jitter: Arc::new(rotator::KeyIdJitter),
            plugged: Mutex::new(Some(Plugged {
                files,
                loaded,
                previous: Vec::new(),
            })),
            view: ArcSwap::from_pointee(view),
            listeners: Mutex::new(Vec::new()),
            keys: Mutex::new(HashMap::new()),
            op: tokio::sync::Mutex::new(()),
        }))
    }

    /// The current view.
    pub fn view(&self) -> Arc<CaView> {
        self.view.load_full()
    }

    /// Calls `f` with the current view now and with every new one, synchronously, in the
    /// order views are published.
    pub fn on_change(&self, f: impl Fn(&Arc<CaView>) + Send + Sync + 'static) {
        let view = self.view();
        f(&view);
        self.listeners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Box::new(f));
    }

    /// For each key that is not removed, something that can sign with it (CRLs).
    pub fn signing_authorities(&self) -> Vec<Arc<Authority>> {
        self.view().signers.clone()
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.cfg
    }

    fn publish(&self, view: CaView) {
        let view = Arc::new(view);
        self.view.store(view.clone());
        let listeners = self
            .listeners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for l in listeners.iter() {
            l(&view);
        }
    }

    fn staging(&self) -> Result<Staging<'_>, ManagerError> {
        let kek = self.kek.as_ref().ok_or_else(plugged_refusal)?;
        Ok(Staging {
            store: self.store.as_ref(),
            kek,
            cfg: &self.cfg,
            serials: self.serials.as_ref(),
            keys: &self.keys,
        })
    }

    /// Reads the slots and the ledger's usage; the slots with usage filled in.
    async fn read(&self, now: SystemTime) -> Result<(u64, Vec<SlotInfo>), ManagerError> {
        let (generation, rows) = self.store.ca_slots().await?;
        let mut slots = parse_slots(&rows)?;
        let usage = self.store.ca_key_usage(unix(now)).await?;
        for s in &mut slots {
            s.slot.issued_unexpired = usage
                .iter()
                .find(|u| u.ca_key_id == s.slot.id)
                .map_or(0, |u| u.unexpired);
        }
        Ok((generation, slots))
    }

    /// One rotator step: re-reads the slots (picking up other replicas' transitions), applies
    /// every transition due at `now`, and publishes a new view if anything changed. Returns the
    /// transitions this replica applied.
    pub async fn tick(&self, now: SystemTime) -> Result<Vec<Transition>, ManagerError> {
        let _op = self.op.lock().await;
        if self.kek.is_none() {
            self.reload_plugged(now).await;
            return Ok(Vec::new());
        }
        self.settle(now).await
    }

    /// Applies due transitions until there are none (the caller holds `op`).
    async fn settle(&self, now: SystemTime) -> Result<Vec<Transition>, ManagerError> {
        let staging = self.staging()?;
        let mut applied = Vec::new();
        let mut last = None;
        for _ in 0..16 {
            let (generation, slots) = self.read(now).await?;
            let bare: Vec<Slot> = slots.iter().map(|s| s.slot.clone()).collect();
            let due = rotator::decide(&bare, now, &self.cfg.policy, self.jitter.as_ref());
            let Some(t) = due.into_iter().next() else {
                last = Some((generation, slots));
                break;
            };
            if staging
                .apply(generation, &slots, &Step::Rotate(t.clone()), ROTATOR, now)
                .await?
            {
                tracing::info!(transition = ?t, "CA slot transition");
                applied.push(t);
            }
        }
        let (generation, slots) = match last {
            Some(l) => l,
            None => self.read(now).await?,
        };
        if generation != self.view().generation {
            let kek = self.kek.as_ref().ok_or_else(plugged_refusal)?;
            let view = build_view(generation, slots, kek, &self.keys)?;
            self.publish(view);
        }
        Ok(applied)
    }

    async fn reload_plugged(&self, now: SystemTime) {
        let (files, changed) = {
            let guard = self
                .plugged
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(p) = guard.as_ref() else { return };
            match p.files.read() {
                Ok(bytes) if bytes != p.loaded => (p.files.clone(), bytes),
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "plugged-in CA files unreadable; keeping the loaded CA");
                    return;
                }
            }
        };
        let authority = match files.load(&changed) {
            Ok(a) => Arc::new(a),
            Err(e) => {
                tracing::warn!(error = %e, "plugged-in CA files changed but do not load; keeping the loaded CA");
                return;
            }
        };
        let old = self.view();
        let view = {
            let mut guard = self
                .plugged
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(p) = guard.as_mut() else { return };
            p.loaded = changed;
            if old.active.key_id() != authority.key_id() {
                p.previous.push(old.active.clone());
            }
            p.previous
                .retain(|a| a.not_after() > now && a.key_id() != authority.key_id());
            plugged_view(old.generation + 1, authority.clone(), &p.previous)
        };
        tracing::info!(key_id = authority.key_id(), "reloaded the plugged-in CA");
        let event = AuditEvent {
            id: 0,
            at: unix(now),
            kind: "ca.plugged.reloaded".into(),
            caller: ROTATOR.into(),
            detail: format!(
                "plugged-in CA files changed: signing key {} (was {}), {} root(s)",
                authority.key_id(),
                old.active.key_id(),
                view.roots.len()
            ),
        };
        if let Err(e) = self.store.record_audit_events(&[event]).await {
            tracing::warn!(error = %e, "could not record the plugged-in CA reload");
        }
        self.publish(view);
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
        let staging = self.staging()?;
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

    /// Prepares a new intermediate under the active root (or, with `root`, a new root).
    pub async fn prepare(
        &self,
        root: bool,
        actor: &str,
        now: SystemTime,
    ) -> Result<Outcome, ManagerError> {
        self.operate(now, actor, |slots| {
            let kind = if root { Kind::Root } else { Kind::Intermediate };
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
            let t = if root {
                Transition::PrepareRoot {
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
            let kind = if root { Kind::Root } else { Kind::Intermediate };
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

    /// Activates the prepared key `id`, retiring the active key of its kind.
    pub async fn activate(
        &self,
        id: &str,
        actor: &str,
        now: SystemTime,
    ) -> Result<Outcome, ManagerError> {
        let policy = self.cfg.policy.clone();
        self.operate(now, actor, |slots| {
            let s = find(slots, id)?;
            if s.slot.state != State::Prepared {
                return Err(ManagerError::FailedPrecondition(format!(
                    "{} {id} is {}, not prepared: only a prepared key can be activated (signetctl ca prepare{})",
                    s.slot.kind.as_str(),
                    s.slot.state.as_str(),
                    if s.slot.kind == Kind::Root { " --root" } else { "" }
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
                Kind::Root => {
                    let since = now
                        .duration_since(s.slot.prepared_at)
                        .unwrap_or_default();
                    if since < policy.root_propagation {
                        outcome.warnings.push(format!(
                            "root {id} has been in the trust bundle for {} only, less than ca.root_propagation ({}): relying parties that have not received it yet will refuse certificates issued from now on",
                            humantime::format_duration(Duration::from_secs(since.as_secs())),
                            humantime::format_duration(policy.root_propagation)
                        ));
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

    /// Every slot with its ledger counts.
    pub async fn status(&self, now: SystemTime) -> Result<Vec<SlotStatus>, ManagerError> {
        let view = self.view();
        // Fresh slots (another replica may have moved them since the last tick).
        let slots = if view.plugged {
            view.slots.clone()
        } else {
            self.read(now).await?.1
        };
        let usage = self.store.ca_key_usage(unix(now)).await?;
        let direct = |id: &str| {
            usage
                .iter()
                .find(|u| u.ca_key_id == id)
                .map_or((0, None), |u| (u.unexpired, Some(u.last_not_after)))
        };
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
                }
            })
            .collect();
        Ok(out)
    }
}

/// Why `s` may not be removed now, if it may not: it is active, already removed, or (a root)
/// the active intermediate chains to it.
fn refuse_removal(s: &SlotInfo, slots: &[SlotInfo]) -> Result<(), ManagerError> {
    let id = &s.slot.id;
    match s.slot.state {
        State::Active => {
            return Err(ManagerError::FailedPrecondition(format!(
                "{} {id} is active: prepare and activate a successor first (signetctl ca prepare{}; signetctl ca activate NEW_KEY_ID)",
                s.slot.kind.as_str(),
                if s.slot.kind == Kind::Root {
                    " --root"
                } else {
                    ""
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

fn plugged_refusal() -> ManagerError {
    ManagerError::FailedPrecondition(
        "the CA is plugged in (ca.cert_file): rotate it by replacing its files, which are reloaded without a restart".into(),
    )
}

fn find<'a>(slots: &'a [SlotInfo], id: &str) -> Result<&'a SlotInfo, ManagerError> {
    slots.iter().find(|s| s.slot.id == id).ok_or_else(|| {
        ManagerError::NotFound(format!("no CA key {id:?} (see signetctl ca status)"))
    })
}

fn active_of(slots: &[SlotInfo], kind: Kind) -> Option<&SlotInfo> {
    slots
        .iter()
        .filter(|s| s.slot.kind == kind && s.slot.state == State::Active)
        .max_by_key(|s| s.slot.prepared_at)
}

/// What applying a transition needs.
struct Staging<'a> {
    store: &'a dyn Store,
    kek: &'a Kek,
    cfg: &'a ManagerConfig,
    serials: &'a dyn SerialSource,
    keys: &'a Mutex<HashMap<String, Arc<Authority>>>,
}

impl Staging<'_> {
    /// Turns `t` into a change and applies it if the slots are still at `generation`.
    /// Returns whether it was applied.
    async fn apply(
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

fn parse_slots(rows: &[CaSlotRow]) -> Result<Vec<SlotInfo>, ManagerError> {
    rows.iter()
        .map(|r| {
            let corrupt = |m: String| {
                ManagerError::Store(StoreError::Corrupt(format!("CA key {}: {m}", r.id)))
            };
            let kind = Kind::parse(&r.kind).ok_or_else(|| corrupt(format!("kind {:?}", r.kind)))?;
            let state =
                State::parse(&r.state).ok_or_else(|| corrupt(format!("state {:?}", r.state)))?;
            let der = signet_types::pem::parse_certs(r.cert_pem.as_bytes())
                .map_err(|e| corrupt(format!("certificate: {e}")))?
                .into_iter()
                .next()
                .ok_or_else(|| corrupt("no certificate".into()))?;
            let cert = validate::parse_cert(&der).map_err(corrupt)?;
            let nb = validate::to_system_time(&cert.validity().not_before);
            let na = validate::to_system_time(&cert.validity().not_after);
            Ok(SlotInfo {
                slot: Slot {
                    id: r.id.clone(),
                    kind,
                    state,
                    parent: r.parent_id.clone(),
                    not_before: nb,
                    not_after: na,
                    prepared_at: from_unix(r.created_at),
                    retired_at: r.retired_at.map(from_unix),
                    tainted: r.tainted_at.is_some(),
                    issued_unexpired: 0,
                },
                algorithm: r.algorithm.clone(),
                cert_der: der,
                activated_at: r.activated_at,
                retired_at: r.retired_at,
                removed_at: r.removed_at,
                tainted_at: r.tainted_at,
                external: false,
                sealed: Sealed(r.encrypted_key.clone()),
            })
        })
        .collect()
}

/// The slot's key as an authority (decrypted once, then cached).
fn load_authority(
    s: &SlotInfo,
    slots: &[SlotInfo],
    kek: &Kek,
    keys: &Mutex<HashMap<String, Arc<Authority>>>,
) -> Result<Arc<Authority>, ManagerError> {
    if let Some(a) = keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&s.slot.id)
    {
        return Ok(a.clone());
    }
    let id = &s.slot.id;
    let pkcs8 = kek.open(&s.sealed.0, id.as_bytes()).map_err(|e| {
        ManagerError::Key(format!(
            "cannot decrypt CA key {id}: {e} (is this the key-encryption key it was stored with?)"
        ))
    })?;
    let anchor = match s.slot.kind {
        Kind::Root => s.cert_der.clone(),
        Kind::Intermediate => {
            let parent = s.slot.parent.as_deref().unwrap_or_default();
            find(slots, parent)
                .map_err(|_| {
                    ManagerError::Key(format!(
                        "intermediate {id}: its root {parent} is not stored"
                    ))
                })?
                .cert_der
                .clone()
        }
    };
    let authority = Arc::new(
        Authority::from_parts(s.cert_der.clone(), &pkcs8, Vec::new(), vec![anchor])
            .map_err(|e| ManagerError::Key(format!("stored CA key {id}: {e}")))?,
    );
    keys.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(id.clone(), authority.clone());
    Ok(authority)
}

fn build_view(
    generation: u64,
    slots: Vec<SlotInfo>,
    kek: &Kek,
    keys: &Mutex<HashMap<String, Arc<Authority>>>,
) -> Result<CaView, ManagerError> {
    let live = |s: &&SlotInfo| s.slot.state != State::Removed;
    let active_int = active_of(&slots, Kind::Intermediate)
        .ok_or_else(|| ManagerError::Key("there is no active intermediate".into()))?;
    let active = load_authority(active_int, &slots, kek, keys)?;
    let mut signers = Vec::new();
    for s in slots
        .iter()
        .filter(live)
        .filter(|s| s.slot.state != State::Prepared)
    {
        match load_authority(s, &slots, kek, keys) {
            Ok(a) => signers.push(a),
            Err(e) => tracing::error!(key_id = %s.slot.id, error = %e, "CA key not loaded"),
        }
    }
    let active_root_id = active_int.slot.parent.clone().unwrap_or_default();
    let active_root = find(&slots, &active_root_id)?.cert_der.clone();
    let mut roots: Vec<&SlotInfo> = slots
        .iter()
        .filter(live)
        .filter(|s| s.slot.kind == Kind::Root)
        .collect();
    // The active root first, then the others oldest first.
    roots.sort_by_key(|s| (s.slot.state != State::Active, s.slot.prepared_at));
    let roots: Vec<Vec<u8>> = roots.into_iter().map(|s| s.cert_der.clone()).collect();
    // The active intermediate's authority carries every trusted root (the Istio answer ends
    // with all of them; `Authority::roots` is the bundle).
    let active = Arc::new(
        Authority::from_parts(
            active.cert_der().to_vec(),
            active.key_pkcs8_der(),
            Vec::new(),
            roots.clone(),
        )
        .map_err(|e| ManagerError::Key(format!("active intermediate {}: {e}", active.key_id())))?,
    );
    let client_anchors = slots
        .iter()
        .filter(live)
        .map(|s| s.cert_der.clone())
        .collect();
    let tainted_roots: BTreeSet<&str> = slots
        .iter()
        .filter(live)
        .filter(|s| s.slot.tainted)
        .map(|s| s.slot.id.as_str())
        .collect();
    let tainted = slots
        .iter()
        .filter(live)
        .filter(|s| {
            s.slot.tainted
                || s.slot
                    .parent
                    .as_deref()
                    .is_some_and(|p| tainted_roots.contains(p))
        })
        .map(|s| s.slot.id.clone())
        .collect();
    Ok(CaView {
        generation,
        slots,
        active,
        signers,
        roots,
        active_root,
        client_anchors,
        tainted,
        plugged: false,
    })
}

/// The view of a plugged-in CA: its signing certificate is the (external) active
/// intermediate, `root-cert.pem` the roots; earlier signing certificates are retired.
fn plugged_view(generation: u64, authority: Arc<Authority>, previous: &[Arc<Authority>]) -> CaView {
    let external = |der: &[u8], kind: Kind, state: State, parent: Option<String>| {
        let cert = validate::parse_cert(der).ok()?;
        Some(SlotInfo {
            slot: Slot {
                id: super::authority::key_id_of(&cert),
                kind,
                state,
                parent,
                not_before: validate::to_system_time(&cert.validity().not_before),
                not_after: validate::to_system_time(&cert.validity().not_after),
                prepared_at: validate::to_system_time(&cert.validity().not_before),
                retired_at: None,
                tainted: false,
                issued_unexpired: 0,
            },
            algorithm: cert.public_key().algorithm.algorithm.to_id_string(),
            cert_der: der.to_vec(),
            activated_at: None,
            retired_at: None,
            removed_at: None,
            tainted_at: None,
            external: true,
            sealed: Sealed::default(),
        })
    };
    let chain = authority.chain();
    let active_root = chain.last().cloned().unwrap_or_default();
    let parent_of = |a: &Authority| {
        a.chain()
            .get(1)
            .and_then(|d| super::authority::key_id_of_der(d))
    };
    let mut slots: Vec<SlotInfo> = authority
        .roots()
        .iter()
        .filter_map(|r| external(r, Kind::Root, State::Active, None))
        .collect();
    slots.extend(external(
        authority.cert_der(),
        Kind::Intermediate,
        State::Active,
        parent_of(&authority),
    ));
    for p in previous {
        slots.extend(external(
            p.cert_der(),
            Kind::Intermediate,
            State::Retired,
            parent_of(p),
        ));
    }
    let mut client_anchors = vec![authority.cert_der().to_vec()];
    client_anchors.extend(previous.iter().map(|p| p.cert_der().to_vec()));
    let mut signers = vec![authority.clone()];
    signers.extend(previous.iter().cloned());
    CaView {
        generation,
        slots,
        roots: authority.roots().to_vec(),
        active: authority,
        signers,
        active_root,
        client_anchors,
        tainted: BTreeSet::new(),
        plugged: true,
    }
}

#[cfg(test)]
mod tests;
