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
//!
//! Files: this one holds the types, the two constructors, the tick and publishing;
//! `commands.rs` the operator's commands; `staging.rs` how one change is sealed and persisted;
//! `loading.rs` decoding slots, decrypting keys, the published view, and [`start`] (the KEK and
//! the manager from `[ca]`: what `server.rs` calls at start-up); `vetting.rs` the checks every
//! slot passes before it is trusted.
//!
//! About 650 lines, on purpose: the types the other files share, and the tick with its
//! publishing, which must be read together (a tick decides from the view it publishes).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use signet_types::TrustDomain;

use super::KeyType;
use super::config::CaConfig;
use super::jwt_config::{JwtKeyType, JwtSvidConfig};
use super::jwt_key::{ActiveJwtKey, JwtKeySource};
use super::kek::Kek;
use super::rotator::{self, Jitter, Kind, Reason, Slot, State, Transition};
use super::serial::SerialSource;
use super::{Authority, validate};
use crate::clock::{from_unix, unix};
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
    /// The type of new JWT-SVID signing keys (`[jwt_svid] key_type`).
    pub jwt_key_type: JwtKeyType,
    /// The lifetime of a JWT-SVID signing key (`[jwt_svid] key_ttl`).
    pub jwt_key_ttl: Duration,
    pub policy: rotator::Policy,
}

impl ManagerConfig {
    pub fn from_config(td: TrustDomain, ca: &CaConfig, jwt: &JwtSvidConfig) -> Self {
        Self {
            trust_domain: td,
            key_type: ca.key_type,
            root_ttl: ca.root_ttl,
            intermediate_ttl: ca.intermediate_ttl,
            jwt_key_type: jwt.key_type,
            jwt_key_ttl: jwt.key_ttl,
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
                jwt_prepare_at: jwt.key_prepare_at,
                jwt_activate_at: jwt.key_activate_at,
                jwt_propagation: jwt.key_propagation,
                jwt_max_ttl: jwt.max_ttl,
            },
        }
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
    /// Tainted keys (JWT keys too) and the intermediates under a tainted root, until they
    /// expire: a removed key stays here until its notAfter, so holders still replace what it
    /// signed (and agents drop the tokens a tainted JWT key signed).
    pub tainted: BTreeSet<String>,
    /// The JWT-SVID signing keys validators must know: prepared (published before they sign),
    /// active and retired ones, not removed, each with its algorithm. Never X.509 anchors.
    pub jwt_keys: Vec<PublishedJwtKey>,
    /// The JWT key that signs JWT-SVIDs now: `None` while there is none or the active one is
    /// tainted (it stops signing at once; the rotator replaces it).
    pub active_jwt: Option<ActiveJwtKey>,
    pub plugged: bool,
    /// Stored slots that failed vetting (see `vetting`): trusted nowhere; `/readyz` is red
    /// while a live one remains.
    pub rejected: Vec<RejectedSlot>,
}

impl CaView {
    /// Whether the active signing key (or the root above it) is tainted: renewing then
    /// replaces nothing.
    pub fn active_is_tainted(&self) -> bool {
        self.tainted.contains(self.active.key_id())
    }

    /// What a root's CRL must list besides the certificates of its ledger: every
    /// intermediate it signed that was tainted or revoked (`ca taint`, `ca revoke`), with
    /// reason cACompromise, from the taint on and for as long as the root publishes a CRL
    /// (past the intermediate's notAfter: a relying party may not check it).
    pub fn revoked_intermediates(&self, root_id: &str) -> Vec<crate::revoked::RevokedEntry> {
        self.slots
            .iter()
            .filter(|s| {
                s.slot.kind == Kind::Intermediate && s.slot.parent.as_deref() == Some(root_id)
            })
            .filter_map(|s| {
                let at = s.tainted_at?;
                let cert = validate::parse_cert(&s.cert_der).ok()?;
                Some(crate::revoked::RevokedEntry {
                    serial: hex::encode(cert.raw_serial()),
                    revoked_at: at,
                    reason: crate::revoked::Reason::CA_COMPROMISE,
                    not_after: i64::MAX,
                })
            })
            .collect()
    }

    /// Whether the CA can be trusted to serve: an error naming every live slot the database
    /// holds that failed vetting.
    pub fn readiness(&self) -> Result<(), UntrustedSlots> {
        let live: Vec<RejectedSlot> = self
            .rejected
            .iter()
            .filter(|r| r.state != State::Removed.as_str())
            .cloned()
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        Err(UntrustedSlots(live))
    }
}

/// A published JWT signing key: its public half (`kid`, `alg`, SPKI) and its notAfter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedJwtKey {
    pub key: signet_pki::jwt::JwtPublicKey,
    /// No token it signs outlives this.
    pub not_after: SystemTime,
}

/// `/readyz`'s reason while the database holds live CA key slots that failed vetting
/// ([`CaView::readiness`]): every one of them, with why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the database holds CA key slot(s) that fail vetting and are trusted nowhere: {}; \
     investigate (audit event ca.slot_rejected) and remove them (signetctl ca revoke ID)",
    listed(.0)
)]
pub struct UntrustedSlots(pub Vec<RejectedSlot>);

fn listed(slots: &[RejectedSlot]) -> String {
    slots
        .iter()
        .map(|r| format!("{} {} ({}): {}", r.kind, r.id, r.state, r.reason))
        .collect::<Vec<_>>()
        .join("; ")
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
    /// A tainted key: holders not yet replaced (see
    /// `CaSlotStore::ca_key_holders_not_replaced`); 0 otherwise.
    pub holders_not_replaced: u64,
}

pub struct CaManager {
    store: Arc<dyn Store>,
    /// Seals the generated keys: the CA keys, and the JWT keys (with a plugged-in CA too).
    kek: Kek,
    cfg: ManagerConfig,
    serials: Arc<dyn SerialSource>,
    jitter: Arc<dyn Jitter>,
    plugged: Mutex<Option<Plugged>>,
    view: ArcSwap<CaView>,
    listeners: Mutex<Vec<Listener>>,
    /// Opened keys by ID, each with the row it was opened from (see `vetting`).
    keys: Mutex<KeyCache>,
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
        let keys = Mutex::new(KeyCache::default());
        let (generation, vetted, rejections) = bootstrap(
            store.as_ref(),
            &kek,
            &cfg,
            serials.as_ref(),
            jitter.as_ref(),
            &keys,
            false,
            now,
        )
        .await?;
        let built = build_view(generation, vetted, &keys, now)?;
        let manager = Arc::new(CaManager {
            store,
            kek,
            cfg,
            serials,
            jitter,
            plugged: Mutex::new(None),
            view: ArcSwap::from_pointee(built),
            listeners: Mutex::new(Vec::new()),
            keys,
            op: tokio::sync::Mutex::new(()),
        });
        manager.report_rejections(&rejections, now).await;
        // Whatever is overdue (a server down past its intermediate's rotation or expiry)
        // happens before the first certificate is signed.
        manager.tick(now).await?;
        Ok(manager)
    }

    /// A manager of a plugged-in CA: the CA is the operator's files (reloaded when they
    /// change); the JWT signing keys are Signet's own, in the database under `kek`, created on
    /// a fresh database and rotated as with generated CA keys.
    pub async fn plugged(
        store: Arc<dyn Store>,
        files: PluggedFiles,
        kek: Kek,
        cfg: ManagerConfig,
        serials: Arc<dyn SerialSource>,
        jitter: Arc<dyn Jitter>,
        now: SystemTime,
    ) -> Result<Arc<CaManager>, ManagerError> {
        let loaded = files.read()?;
        let authority = Arc::new(files.load(&loaded)?);
        tracing::info!(key_id = authority.key_id(), "using plugged-in CA");
        let keys = Mutex::new(KeyCache::default());
        let (generation, vetted, rejections) = bootstrap(
            store.as_ref(),
            &kek,
            &cfg,
            serials.as_ref(),
            jitter.as_ref(),
            &keys,
            true,
            now,
        )
        .await?;
        let jwt = JwtPart::vetted(vetted, &keys, now)?;
        let view = plugged_view(generation, authority, &[], jwt);
        let manager = Arc::new(CaManager {
            store,
            kek,
            cfg,
            serials,
            jitter,
            plugged: Mutex::new(Some(Plugged {
                files,
                loaded,
                previous: Vec::new(),
            })),
            view: ArcSwap::from_pointee(view),
            listeners: Mutex::new(Vec::new()),
            keys,
            op: tokio::sync::Mutex::new(()),
        });
        manager.report_rejections(&rejections, now).await;
        manager.tick(now).await?;
        Ok(manager)
    }

    /// Whether the CA is plugged in (only the JWT keys are Signet's own).
    fn is_plugged(&self) -> bool {
        self.plugged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
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

    fn staging(&self) -> Staging<'_> {
        Staging {
            store: self.store.as_ref(),
            kek: &self.kek,
            cfg: &self.cfg,
            serials: self.serials.as_ref(),
            keys: &self.keys,
        }
    }

    /// Reads the slots and vets them (see `vetting`): only what passes is decided on. With a
    /// plugged-in CA, only the JWT key slots.
    async fn read_vetted(&self) -> Result<(u64, Vetted), ManagerError> {
        let (generation, rows) = self.store.ca_slots().await?;
        Ok((
            generation,
            vet_rows(&rows, &self.kek, &self.keys, self.is_plugged()),
        ))
    }

    /// Reads the slots and the ledger's usage; the slots with usage filled in (the exact
    /// counts: for operator commands, which report them).
    async fn read(&self, now: SystemTime) -> Result<(u64, Vec<SlotInfo>), ManagerError> {
        let (generation, vetted) = self.read_vetted().await?;
        let mut slots = vetted.slots;
        let usage = self.store.ca_key_usage(unix(now)).await?;
        for s in &mut slots {
            s.slot.issued_unexpired = usage
                .iter()
                .find(|u| u.ca_key_id == s.slot.id)
                .map_or(0, |u| u.unexpired);
        }
        Ok((generation, slots))
    }

    /// [`Self::read`] for the rotator, which asks only whether a key still has unexpired
    /// certificates (`issued_unexpired == 0`): each slot's `issued_unexpired` is 1 when it has
    /// any, 0 when not, at one index probe per key rather than a count of every unexpired row
    /// (which the tick would otherwise run every `ca.rotation_interval`, at any ledger size).
    async fn read_for_rotation(&self, now: SystemTime) -> Result<(u64, Vetted), ManagerError> {
        let (generation, mut vetted) = self.read_vetted().await?;
        let slots = &mut vetted.slots;
        let ids: Vec<String> = slots
            .iter()
            .filter(|s| s.slot.state != State::Removed)
            .map(|s| s.slot.id.clone())
            .collect();
        let in_use = self.store.ca_keys_in_use(&ids, unix(now)).await?;
        for s in slots.iter_mut() {
            s.slot.issued_unexpired = u64::from(in_use.contains(&s.slot.id));
        }
        Ok((generation, vetted))
    }

    /// One rotator step: re-reads the slots (picking up other replicas' transitions), applies
    /// every transition due at `now`, and publishes a new view if anything changed. Returns the
    /// transitions this replica applied.
    pub async fn tick(&self, now: SystemTime) -> Result<Vec<Transition>, ManagerError> {
        let _op = self.op.lock().await;
        if self.is_plugged()
            && let crate::reload::Outcome::Failed(why) = self.reload_plugged(now).await
        {
            tracing::warn!("plugged-in CA files: {why}");
        }
        self.settle(now).await
    }

    /// Applies due transitions until there are none (the caller holds `op`).
    async fn settle(&self, now: SystemTime) -> Result<Vec<Transition>, ManagerError> {
        let staging = self.staging();
        let plugged = self.is_plugged();
        let mut applied = Vec::new();
        let mut last = None;
        for _ in 0..16 {
            let (generation, vetted) = self.read_for_rotation(now).await?;
            self.report_rejections(&vetted.new_rejections, now).await;
            if !vetted.reseal.is_empty() {
                staging
                    .reseal(generation, &vetted.reseal, ROTATOR, now)
                    .await?;
                continue;
            }
            let slots = &vetted.slots;
            let bare: Vec<Slot> = slots.iter().map(|s| s.slot.clone()).collect();
            let due = if plugged {
                rotator::decide_jwt(&bare, now, &self.cfg.policy, self.jitter.as_ref())
            } else {
                rotator::decide(&bare, now, &self.cfg.policy, self.jitter.as_ref())
            };
            let refused = vetted.root_replacement_refused();
            let mut due = due.into_iter();
            let t = loop {
                match due.next() {
                    Some(t) if vetted.is_root_step(&t) && refused.is_some() => {
                        tracing::error!(
                            transition = ?t,
                            reason = refused.as_deref().unwrap_or_default(),
                            "CA root transition withheld"
                        );
                    }
                    other => break other,
                }
            };
            let Some(t) = t else {
                last = Some((generation, vetted));
                break;
            };
            if staging
                .apply(generation, slots, &Step::Rotate(t.clone()), ROTATOR, now)
                .await?
            {
                tracing::info!(transition = ?t, "CA slot transition");
                applied.push(t);
            }
        }
        let (generation, vetted) = match last {
            Some(l) => l,
            None => self.read_for_rotation(now).await?,
        };
        let old = self.view();
        // A new generation, or a taint that has just expired out of the view.
        if generation != old.generation || expired_taints(&old, now) {
            let view = if plugged {
                let jwt = JwtPart::vetted(vetted, &self.keys, now)?;
                let guard = self
                    .plugged
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let previous = guard.as_ref().map_or(&[][..], |p| &p.previous[..]);
                plugged_view(generation, old.active.clone(), previous, jwt)
            } else {
                build_view(generation, vetted, &self.keys, now)?
            };
            self.publish(view);
        }
        Ok(applied)
    }

    /// Logs and audits the slots vetting rejected for the first time (once per row content).
    async fn report_rejections(&self, rejections: &[RejectedSlot], now: SystemTime) {
        if rejections.is_empty() {
            return;
        }
        let events: Vec<AuditEvent> = rejections
            .iter()
            .map(|r| {
                tracing::error!(
                    key_id = %r.id, kind = %r.kind, state = %r.state, reason = %r.reason,
                    "a stored CA key slot fails vetting: it is trusted nowhere"
                );
                AuditEvent {
                    id: 0,
                    at: unix(now),
                    kind: "ca.slot_rejected".into(),
                    caller: ROTATOR.into(),
                    detail: format!("{} {} ({}) rejected: {}", r.kind, r.id, r.state, r.reason),
                }
            })
            .collect();
        if let Err(e) = self.store.record_audit_events(&events).await {
            tracing::warn!(error = %e, "could not record a rejected CA key slot");
        }
    }

    /// Re-reads a plugged-in CA's files now (SIGHUP) and loads them when they changed, as the
    /// tick does; `None` without a plugged-in CA. A change that does not load leaves the loaded
    /// CA in force.
    pub async fn reload_plugged_now(&self, now: SystemTime) -> Option<crate::reload::Outcome> {
        if !self.is_plugged() {
            return None;
        }
        let _op = self.op.lock().await;
        let outcome = self.reload_plugged(now).await;
        if let crate::reload::Outcome::Reloaded(_) = outcome
            && let Err(e) = self.settle(now).await
        {
            tracing::warn!(error = %e, "after reloading the plugged-in CA");
        }
        Some(outcome)
    }

    async fn reload_plugged(&self, now: SystemTime) -> crate::reload::Outcome {
        use crate::reload::Outcome;
        let (files, changed) = {
            let guard = self
                .plugged
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(p) = guard.as_ref() else {
                return Outcome::Unchanged(String::new());
            };
            match p.files.read() {
                Ok(bytes) if bytes != p.loaded => (p.files.clone(), bytes),
                Ok(_) => {
                    return Outcome::Unchanged(format!(
                        "signing key {}",
                        self.view().active.key_id()
                    ));
                }
                Err(e) => {
                    return Outcome::Failed(format!("unreadable ({e}); keeping the loaded CA"));
                }
            }
        };
        let authority = match files.load(&changed) {
            Ok(a) => Arc::new(a),
            Err(e) => {
                return Outcome::Failed(format!(
                    "the files changed but do not load ({e}); keeping the loaded CA"
                ));
            }
        };
        let old = self.view();
        let view = {
            let mut guard = self
                .plugged
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(p) = guard.as_mut() else {
                return Outcome::Unchanged(String::new());
            };
            p.loaded = changed;
            if old.active.key_id() != authority.key_id() {
                p.previous.push(old.active.clone());
            }
            p.previous
                .retain(|a| a.not_after() > now && a.key_id() != authority.key_id());
            plugged_view(
                old.generation,
                authority.clone(),
                &p.previous,
                JwtPart::of(&old),
            )
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
        Outcome::Reloaded(format!(
            "signing key {} (was {})",
            authority.key_id(),
            old.active.key_id()
        ))
    }
}

/// Brings a fresh or partial set of slots to one with an active key of every kind the manager
/// keeps (a root, an intermediate and a JWT key; with a plugged-in CA, a JWT key), racing
/// replicas safely: the slots' generation, vetted, and the rejections seen on the way.
#[allow(clippy::too_many_arguments)]
async fn bootstrap(
    store: &dyn Store,
    kek: &Kek,
    cfg: &ManagerConfig,
    serials: &dyn SerialSource,
    jitter: &dyn Jitter,
    keys: &Mutex<KeyCache>,
    plugged: bool,
    now: SystemTime,
) -> Result<(u64, Vetted, Vec<RejectedSlot>), ManagerError> {
    let mut rejections = Vec::new();
    // A handful of transitions at most; other replicas may be racing.
    for _ in 0..16 {
        let (g, rows) = store.ca_slots().await?;
        let vetted = vet_rows(&rows, kek, keys, plugged);
        refuse_foreign_kek(&vetted)?;
        rejections.extend(vetted.new_rejections.iter().cloned());
        let slots = &vetted.slots;
        let has = |k: Kind| {
            slots
                .iter()
                .any(|s| s.slot.kind == k && s.slot.state == State::Active)
        };
        if has(Kind::Jwt) && (plugged || (has(Kind::Root) && has(Kind::Intermediate))) {
            return Ok((g, vetted, rejections));
        }
        let bare: Vec<Slot> = slots.iter().map(|s| s.slot.clone()).collect();
        let due = if plugged {
            rotator::decide_jwt(&bare, now, &cfg.policy, jitter)
        } else {
            rotator::decide(&bare, now, &cfg.policy, jitter)
        };
        let Some(t) = due.into_iter().next() else {
            return Err(ManagerError::Key(
                "the CA slots have no active key and nothing to do".into(),
            ));
        };
        if vetted.is_root_step(&t)
            && let Some(why) = vetted.root_replacement_refused()
        {
            return Err(ManagerError::Key(why));
        }
        let staging = Staging {
            store,
            kek,
            cfg,
            serials,
            keys,
        };
        staging
            .apply(g, slots, &Step::Rotate(t), ROTATOR, now)
            .await?;
    }
    Err(ManagerError::Key(
        "could not create the first CA keys (another replica keeps changing them?)".into(),
    ))
}

fn plugged_refusal() -> ManagerError {
    ManagerError::FailedPrecondition(
        "the CA is plugged in (ca.cert_file): rotate it by replacing its files, which are reloaded without a restart; only its JWT keys (--kind jwt) are Signet's to prepare, activate, taint and revoke".into(),
    )
}

fn find<'a>(slots: &'a [SlotInfo], id: &str) -> Result<&'a SlotInfo, ManagerError> {
    slots.iter().find(|s| s.slot.id == id).ok_or_else(|| {
        ManagerError::NotFound(format!("no CA key {id:?} (see signetctl ca status)"))
    })
}

impl JwtKeySource for CaManager {
    fn active_jwt_key(&self) -> Option<ActiveJwtKey> {
        self.view.load().active_jwt.clone()
    }
}

fn active_of(slots: &[SlotInfo], kind: Kind) -> Option<&SlotInfo> {
    slots
        .iter()
        .filter(|s| s.slot.kind == kind && s.slot.state == State::Active)
        .max_by_key(|s| s.slot.prepared_at)
}

mod commands;
mod loading;
mod staging;
mod vetting;

use loading::{JwtPart, build_view, expired_taints, plugged_view, refuse_foreign_kek, vet_rows};
pub use loading::{PluggedFiles, start};
use staging::Staging;
pub use vetting::RejectedSlot;
use vetting::{KeyCache, Vetted};

#[cfg(test)]
mod jwt_tests;
#[cfg(test)]
mod tests;
