//! Signed ledger checkpoints (`[checkpoint]`).
//!
//! The ledger's head (seq, hash) is signed, with the time, the trust domain and the checkpoint
//! it extends, in the fixed statement of [`signet_types::checkpoint`] (version 2), by a
//! checkpoint key that is not in the database: an Ed25519 key in a file
//! (`checkpoint.key_file`, default `<data_dir>/checkpoint.key`, mode 0600, generated on first
//! start like the key-encryption key; replicas sharing one PostgreSQL share it the same way).
//! Someone who can write the database but not that file can delete the ledger's last rows or
//! rewrite a row and recompute every hash after it, and the plain chain still verifies; a
//! checkpoint taken before catches both (`signetctl ledger verify --checkpoint`).
//!
//! A checkpoint is made every `checkpoint.interval` when the head moved since the last one, and
//! on demand (`signet.admin.v1.LedgerAdmin/CreateCheckpoint`, `signetctl ledger checkpoint
//! create`). Each is written to `<data_dir>/checkpoints/<seq>-<time>.json` (atomically; the
//! newest `checkpoint.keep` are kept; two checkpoints of one head in the same second are the
//! same signed statement, so the same file), published at `http_listen` (`/checkpoint`, the latest;
//! `/checkpoint.pub`, the public key), and is an audit event (`ledger.checkpoint`, or
//! `admin.ledger_checkpoint` on demand) whose detail ends with the signed JSON.
//!
//! # Only a head that extends the last checkpoint is signed
//!
//! A checkpoint must never vouch for a ledger that lost what an earlier checkpoint vouched for:
//! someone with database access who deletes the tail and moves `ledger_head` back would
//! otherwise get the shorter head signed within one interval, and an auditor starting from
//! the latest checkpoint would see nothing wrong. So before signing, the head must extend
//! every *floor* (a checkpoint this key signed): the head's seq is not below the floor's, the
//! row at the floor's seq is still there with the floor's hash, and the row `ledger_head`
//! names is there with its hash ([`extends`], pure). Otherwise nothing is signed, `/checkpoint`
//! keeps serving the last good checkpoint, the rollback is an audit event
//! (`ledger.rollback_detected`, once per distinct rollback), `/readyz` is not ready (check
//! `ledger_rollback`), the gauge `signet_ledger_rollback` is 1, and `CreateCheckpoint` answers
//! FailedPrecondition; all clear by themselves once the head extends the floors again (the
//! rows restored). The floors, and the attacker each defends against:
//!
//! - the newest checkpoint this process signed (memory): the database alone cannot lower it;
//! - the newest file under `<data_dir>/checkpoints/` signed by this key for this trust domain,
//!   read at start: survives a restart; the database alone cannot touch it (an attacker who can
//!   also write the data directory is out of scope: they could as well read the key);
//! - the newest checkpoint in the database's audit events (any replica's) whose signature
//!   verifies with this key: a hint that can only add a floor, never remove one (the
//!   attacker cannot forge one, only delete or replay them). It lets a replica on a fresh
//!   `data_dir` (an `emptyDir`) and a replica that has not signed lately refuse a head below
//!   what another replica signed.
//!
//! The floors are read before the head (a head only grows, so a floor read first is never
//! above an honest head read after it). The new checkpoint's `previous` is the highest floor
//! ([`Mark::GENESIS`] when there is none), so one retained checkpoint proves continuity with
//! its predecessor.
//!
//! What remains: rows appended after the last checkpoint and deleted before the next are not
//! covered by any floor (the window is `checkpoint.interval`); a replica started on a fresh
//! `data_dir` after the attacker also deleted the checkpoint audit events has no floor and
//! signs the shorter head, with a `previous` that does not link to the real last checkpoint,
//! which `signetctl ledger verify --from-checkpoint` and any retained checkpoint then show.
//! After a deliberate restore from a backup (a real rollback), move `<data_dir>/checkpoints/`
//! aside on every replica (keep it: it records what was lost) and restart.
//!
//! The decisions are [`head_moved`] and [`extends`] (pure); [`Checkpointer::tick`] applies
//! them at an injected `now`; [`run_periodic`] is the thin loop around it.
//!
//! About 790 lines, on purpose: the rollback defence is one argument — which floors exist,
//! where each is read, and the order of reads — and splitting the key, the files and the
//! signing apart would scatter it; the statement's format and its verification already live in
//! `signet_types::checkpoint`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::{Context, anyhow};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use ring::signature::{Ed25519KeyPair, KeyPair};
use signet_types::TrustDomain;
use signet_types::checkpoint::{self, Head, Mark, PublicKey, SignedCheckpoint};
use signet_types::ledger::{GENESIS, Hash};

use crate::audit::AuditLog;
use crate::authn::AuthenticatedCaller;
use crate::bundle::write_atomic;
use crate::clock::{Clock, unix};
use crate::metrics::Metrics;
use crate::store::{LedgerHead, Order, Store, StoreError};

/// The server's checkpoint signing key. Its `Debug` shows only the public key id.
pub struct CheckpointKey {
    pair: Ed25519KeyPair,
    public: PublicKey,
}

impl std::fmt::Debug for CheckpointKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointKey")
            .field("key_id", &self.public.key_id())
            .finish_non_exhaustive()
    }
}

impl CheckpointKey {
    /// A new random key and its PKCS#8 DER.
    pub fn generate() -> anyhow::Result<(Self, Vec<u8>)> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| anyhow!("no randomness for the checkpoint key"))?;
        let key = Self::from_pkcs8(pkcs8.as_ref())?;
        Ok((key, pkcs8.as_ref().to_vec()))
    }

    /// From PKCS#8 DER (v1, as `openssl genpkey -algorithm ed25519` writes, or v2).
    pub fn from_pkcs8(der: &[u8]) -> anyhow::Result<Self> {
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .map_err(|e| anyhow!("not an Ed25519 PKCS#8 private key: {e}"))?;
        let public = PublicKey::from_raw(pair.public_key().as_ref())
            .map_err(|e| anyhow!("checkpoint public key: {e}"))?;
        Ok(Self { pair, public })
    }

    /// Loads the key from `path` (PEM `PRIVATE KEY`); when the file does not exist and
    /// `generate` is set (the default path), creates it with mode 0600.
    pub fn load_or_generate(path: &Path, generate: bool) -> anyhow::Result<Self> {
        match std::fs::read(path) {
            Ok(bytes) => {
                warn_if_readable_by_others(path);
                let (_, der) = signet_types::pem::parse_one(&bytes, &["PRIVATE KEY"])
                    .map_err(|e| anyhow!("checkpoint key {}: {e}", path.display()))?;
                Self::from_pkcs8(&der)
                    .map_err(|e| anyhow!("checkpoint key {}: {e}", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && generate => {
                let (key, der) = Self::generate()?;
                let pem = pem::encode_config(
                    &pem::Pem::new("PRIVATE KEY", der),
                    pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
                );
                write_atomic(path, pem.as_bytes(), 0o600)
                    .with_context(|| format!("writing {}", path.display()))?;
                tracing::info!(path = %path.display(), key_id = %key.public.key_id(), "generated the ledger checkpoint key");
                Ok(key)
            }
            Err(e) => Err(anyhow!("reading checkpoint key {}: {e}", path.display())),
        }
    }

    pub fn public(&self) -> PublicKey {
        self.public
    }

    pub fn sign(&self, head: Head) -> SignedCheckpoint {
        checkpoint::sign(&self.pair, head)
    }
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path)
        // Group read is how a Kubernetes Secret volume (0440, the pod's fsGroup) works.
        && m.permissions().mode() & 0o027 != 0
    {
        tracing::warn!(path = %path.display(), mode = format!("{:o}", m.permissions().mode() & 0o777),
            "the checkpoint key is readable by other users: chmod 0600 it");
    }
}

/// Who asked for a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The periodic task (the head moved).
    Periodic,
    /// The operator, on the admin socket.
    Admin,
}

/// One checkpoint as kept: the signed head, its published JSON, and its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub checkpoint: SignedCheckpoint,
    pub json: String,
    pub path: PathBuf,
}

/// Where a floor (a checkpoint the head must extend) came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FloorSource {
    /// Signed by this process.
    SignedHere,
    /// The newest file under `<data_dir>/checkpoints/` signed by this key, read at start.
    File(PathBuf),
    /// A checkpoint signed by this key (by any replica) in the database's audit events.
    Database { audit_id: u64 },
}

impl std::fmt::Display for FloorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FloorSource::SignedHere => f.write_str("signed by this server"),
            FloorSource::File(p) => write!(f, "file {}", p.display()),
            FloorSource::Database { audit_id } => {
                write!(f, "signed by a replica, audit event {audit_id}")
            }
        }
    }
}

/// A checkpoint this key signed, which every head signed from now on must extend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    pub mark: Mark,
    pub source: FloorSource,
}

/// Why a head is not signed: it does not extend a checkpoint this key signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollback {
    /// The head is below the floor: rows were deleted and `ledger_head` moved back.
    Shorter { head: Mark, floor: Floor },
    /// The row at the floor's seq is gone (`found: None`) or has another hash.
    Rewritten { floor: Floor, found: Option<Hash> },
    /// `ledger_head` names a row that is not there (`found: None`) or has another hash.
    HeadRow { head: Mark, found: Option<Hash> },
}

fn found_text(found: Option<&Hash>) -> String {
    match found {
        None => "is gone".to_owned(),
        Some(h) => format!("now has hash {}", hex::encode(h)),
    }
}

/// `/readyz`'s reason while a [`Rollback`] is in force ([`Checkpointer::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "ledger rollback detected ({0}); no checkpoint is signed until the ledger \
     extends the last one again"
)]
pub struct RollbackDetected(pub Rollback);

impl std::fmt::Display for Rollback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rollback::Shorter { head, floor } => write!(
                f,
                "the ledger head is row {} (hash {}), below row {} (hash {}) of the last \
                 checkpoint ({}): rows {}..={} were deleted and the head moved back",
                head.seq,
                hex::encode(head.hash),
                floor.mark.seq,
                hex::encode(floor.mark.hash),
                floor.source,
                head.seq + 1,
                floor.mark.seq
            ),
            Rollback::Rewritten { floor, found } => write!(
                f,
                "row {} of the last checkpoint ({}, hash {}) {}: the ledger's history up to \
                 it was deleted or rewritten",
                floor.mark.seq,
                floor.source,
                hex::encode(floor.mark.hash),
                found_text(found.as_ref())
            ),
            Rollback::HeadRow { head, found } => write!(
                f,
                "ledger_head names row {} with hash {}, but that row {}: the ledger's tail \
                 was deleted or the head moved",
                head.seq,
                hex::encode(head.hash),
                found_text(found.as_ref())
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the checkpoint file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The head does not extend a checkpoint this key signed: nothing was signed.
    #[error(
        "ledger rollback detected, no checkpoint signed: {0}. Restore the missing rows (from a \
         backup of the database) so that the ledger extends the last checkpoint again; after a \
         deliberate restore to an older state, move <data_dir>/checkpoints/ aside on every \
         replica (keep it) and restart"
    )]
    Rollback(Rollback),
}

/// The periodic rule: a new checkpoint is due when there is none yet, or when the head moved
/// since the last one (a different seq or hash).
pub fn head_moved(latest: Option<&Head>, head: &LedgerHead) -> bool {
    match latest {
        None => true,
        Some(l) => l.seq != head.seq || l.hash != head.hash,
    }
}

/// Whether `head` may be signed after `floor`: `at_floor` and `at_head` are the hashes the
/// ledger holds at the floor's and the head's seq (`None`: no row there; seq 0 is the empty
/// ledger, `GENESIS`). The head must not be below the floor, the floor's row must still have
/// its hash, and the head's row must be the one `ledger_head` names. An unchanged head
/// extends itself.
pub fn extends(
    floor: &Floor,
    head: Mark,
    at_floor: Option<Hash>,
    at_head: Option<Hash>,
) -> Result<(), Rollback> {
    if head.seq < floor.mark.seq {
        return Err(Rollback::Shorter {
            head,
            floor: floor.clone(),
        });
    }
    if at_floor != Some(floor.mark.hash) {
        return Err(Rollback::Rewritten {
            floor: floor.clone(),
            found: at_floor,
        });
    }
    if at_head != Some(head.hash) {
        return Err(Rollback::HeadRow {
            head,
            found: at_head,
        });
    }
    Ok(())
}

/// The separator between an audit event's text and the signed checkpoint JSON it ends with
/// (compact JSON has no spaces, so the last one is the separator).
const SIGNED_IN_AUDIT: &str = " signed ";

/// The newest audit events searched for another replica's checkpoint.
const AUDIT_WINDOW: u32 = 100_000;

/// How many of the newest checkpoint events in that window are read (the highest one this key
/// signed is the floor).
const AUDIT_EVENTS: u32 = 64;

/// What [`Checkpointer`] keeps between ticks.
#[derive(Debug, Default)]
struct Kept {
    /// What `/checkpoint` serves: the newest checkpoint this server made or found at start.
    latest: Option<Arc<Stored>>,
    /// The newest checkpoint this server signed or found on file at start.
    floor: Option<Floor>,
    /// The rollback in force, if any (readiness, the metric; audited when it changes).
    rollback: Option<Rollback>,
}

/// Makes, keeps and publishes checkpoints.
pub struct Checkpointer {
    store: Arc<dyn Store>,
    key: CheckpointKey,
    trust_domain: TrustDomain,
    dir: PathBuf,
    keep: usize,
    audit: AuditLog,
    metrics: Arc<Metrics>,
    kept: Mutex<Kept>,
    /// One checkpoint at a time, so that files and `latest` move in order.
    making: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer")
            .field("key", &self.key)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Checkpointer {
    /// Creates `dir` (mode 0755) if needed and picks up the newest checkpoint in it that this
    /// key signed for this trust domain: it is served, it is the floor, and a restart does
    /// not re-sign an unchanged head.
    pub fn new(
        store: Arc<dyn Store>,
        key: CheckpointKey,
        trust_domain: TrustDomain,
        dir: PathBuf,
        keep: usize,
        audit: AuditLog,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let cp = Self {
            store,
            key,
            trust_domain,
            dir,
            keep: keep.max(1),
            audit,
            metrics,
            kept: Mutex::new(Kept::default()),
            making: tokio::sync::Mutex::new(()),
        };
        let mine = cp
            .read_dir(usize::MAX)?
            .into_iter()
            .find(|s| cp.verify(&s.checkpoint).is_some());
        let mut kept = cp.lock();
        kept.floor = mine.as_ref().map(|s| Floor {
            mark: s.checkpoint.head.mark(),
            source: FloorSource::File(s.path.clone()),
        });
        kept.latest = mine.map(Arc::new);
        drop(kept);
        Ok(cp)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The head of `cp` when this key signed it for this trust domain.
    fn verify(&self, cp: &SignedCheckpoint) -> Option<Head> {
        let v = self.key.public().verify(cp).ok()?;
        (v.head().trust_domain == self.trust_domain.as_str()).then(|| v.head().clone())
    }

    pub fn public_key(&self) -> PublicKey {
        self.key.public()
    }

    /// The newest checkpoint this server made or found at start (never one of a head that
    /// did not extend it).
    pub fn latest(&self) -> Option<Arc<Stored>> {
        self.lock().latest.clone()
    }

    /// The rollback in force, if the last look at the head found one.
    pub fn rollback(&self) -> Option<Rollback> {
        self.lock().rollback.clone()
    }

    /// For `/readyz`: not ready while the head does not extend the last checkpoint.
    pub fn readiness(&self) -> Result<(), RollbackDetected> {
        match self.rollback() {
            None => Ok(()),
            Some(r) => Err(RollbackDetected(r)),
        }
    }

    /// Signs the current head now, whether or not it moved (if it extends the floors).
    pub async fn create(
        &self,
        now: SystemTime,
        trigger: Trigger,
    ) -> Result<Arc<Stored>, CheckpointError> {
        let _one = self.making.lock().await;
        let (head, previous) = self.checked_head(now).await?;
        self.sign_and_keep(head, previous, now, trigger).await
    }

    /// The periodic step: signs the head at `now` if it moved since the last checkpoint (and
    /// extends the floors).
    pub async fn tick(&self, now: SystemTime) -> Result<Option<Arc<Stored>>, CheckpointError> {
        let _one = self.making.lock().await;
        let (head, previous) = self.checked_head(now).await?;
        let latest = self.latest();
        if !head_moved(latest.as_ref().map(|s| &s.checkpoint.head), &head) {
            return Ok(None);
        }
        self.sign_and_keep(head, previous, now, Trigger::Periodic)
            .await
            .map(Some)
    }

    /// The head, checked against every floor, and the highest floor (the new checkpoint's
    /// `previous`); or the rollback, flagged.
    async fn checked_head(&self, now: SystemTime) -> Result<(LedgerHead, Mark), CheckpointError> {
        // The floors first: a checkpoint signed before this read is never above the head
        // read after it, unless the head went back.
        let mut floors: Vec<Floor> = self.lock().floor.iter().cloned().collect();
        floors.extend(self.database_floor().await);
        let head = self.store.ledger_head().await?;
        self.metrics
            .ledger_head_sequence
            .set(i64::try_from(head.seq).unwrap_or(i64::MAX));
        let head_mark = Mark {
            seq: head.seq,
            hash: head.hash,
        };
        let at_head = self.hash_at(head.seq).await?;
        for floor in &floors {
            let at_floor = if floor.mark.seq == head.seq {
                at_head
            } else {
                self.hash_at(floor.mark.seq).await?
            };
            if let Err(r) = extends(floor, head_mark, at_floor, at_head) {
                self.flag(r.clone(), now);
                return Err(CheckpointError::Rollback(r));
            }
        }
        self.clear();
        let previous = floors
            .iter()
            .map(|f| f.mark)
            .max_by_key(|m| m.seq)
            .unwrap_or(Mark::GENESIS);
        Ok((head, previous))
    }

    /// The hash the ledger holds at `seq`: a certificate row's, an event's or a JWT-SVID row's
    /// (they share one chain); `GENESIS` at 0; `None` when no row has that seq.
    async fn hash_at(&self, seq: u64) -> Result<Option<Hash>, StoreError> {
        let Some(before) = seq.checked_sub(1) else {
            return Ok(Some(GENESIS));
        };
        let rows = self
            .store
            .certificates_page(Order::OldestFirst, Some(before), 1, None)
            .await?;
        if let Some(r) = rows.first()
            && r.entry.seq == seq
        {
            return Ok(Some(r.hash));
        }
        let events = self.store.ledger_events(before, 1).await?;
        if let Some(e) = events.first().filter(|e| e.event.seq == seq) {
            return Ok(Some(e.hash));
        }
        let jwts = self
            .store
            .jwt_svids_page(Order::OldestFirst, Some(before), 1, None)
            .await?;
        Ok(jwts.first().filter(|j| j.entry.seq == seq).map(|j| j.hash))
    }

    /// The highest checkpoint among the newest checkpoint audit events that this key signed
    /// for this trust domain (a hint: an unreadable database, or missing, unparsable or forged
    /// events give none; a forged event does not hide a genuine one among the newest
    /// [`AUDIT_EVENTS`]).
    async fn database_floor(&self) -> Option<Floor> {
        let events = match self
            .store
            .newest_audit_events(
                &["ledger.checkpoint", "admin.ledger_checkpoint"],
                AUDIT_WINDOW,
                AUDIT_EVENTS,
            )
            .await
        {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(error = %e, "reading the newest checkpoint audit events");
                return None;
            }
        };
        events
            .iter()
            .filter_map(|event| {
                let (_, json) = event.detail.rsplit_once(SIGNED_IN_AUDIT)?;
                let head = self.verify(&SignedCheckpoint::from_json(json).ok()?)?;
                Some(Floor {
                    mark: head.mark(),
                    source: FloorSource::Database { audit_id: event.id },
                })
            })
            .max_by_key(|f| f.mark.seq)
    }

    /// A rollback found: flagged for readiness and the metric; audited and logged once per
    /// distinct rollback (not at every tick while it lasts).
    fn flag(&self, r: Rollback, now: SystemTime) {
        let mut kept = self.lock();
        let new = kept.rollback.as_ref() != Some(&r);
        kept.rollback = Some(r.clone());
        drop(kept);
        self.metrics.ledger_rollback.set(1);
        if new {
            tracing::error!(rollback = %r, "ledger rollback detected: not signing checkpoints");
            self.audit.record(
                "ledger.rollback_detected",
                &AuthenticatedCaller::server(&self.trust_domain).label(),
                format!("{r}; no checkpoint signed until the ledger extends the last one again"),
                unix(now),
            );
        }
    }

    fn clear(&self) {
        if let Some(r) = self.lock().rollback.take() {
            tracing::warn!(was = %r, "the ledger extends the last checkpoint again");
        }
        self.metrics.ledger_rollback.set(0);
    }

    async fn sign_and_keep(
        &self,
        head: LedgerHead,
        previous: Mark,
        now: SystemTime,
        trigger: Trigger,
    ) -> Result<Arc<Stored>, CheckpointError> {
        let signed = self.key.sign(Head {
            trust_domain: self.trust_domain.as_str().to_owned(),
            seq: head.seq,
            hash: head.hash,
            time: unix(now),
            previous: Some(previous),
        });
        let json = signed.to_json();
        let path = self.dir.join(file_name(signed.head.seq, signed.head.time));
        // The file write (fsync) and the pruning run off the async workers.
        let (dir, keep, file, bytes) = (
            self.dir.clone(),
            self.keep,
            path.clone(),
            format!("{json}\n").into_bytes(),
        );
        tokio::task::spawn_blocking(move || {
            write_atomic(&file, &bytes, 0o644)?;
            prune(&dir, keep);
            Ok(())
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(|source| CheckpointError::Io {
            path: path.clone(),
            source,
        })?;
        let stored = Arc::new(Stored {
            checkpoint: signed,
            json,
            path,
        });
        {
            let mut kept = self.lock();
            kept.latest = Some(stored.clone());
            kept.floor = Some(Floor {
                mark: stored.checkpoint.head.mark(),
                source: FloorSource::SignedHere,
            });
        }
        let (kind, caller, why) = match trigger {
            Trigger::Periodic => (
                "ledger.checkpoint",
                AuthenticatedCaller::server(&self.trust_domain).label(),
                "periodic",
            ),
            Trigger::Admin => (
                "admin.ledger_checkpoint",
                AuthenticatedCaller::admin_label(&self.trust_domain),
                "requested by the operator",
            ),
        };
        let h = &stored.checkpoint.head;
        self.audit.record(
            kind,
            &caller,
            format!(
                "ledger checkpoint ({why}): seq {} hash {} time {} previous seq {} key {} file \
                 {};{SIGNED_IN_AUDIT}{}",
                h.seq,
                hex::encode(h.hash),
                h.time,
                previous.seq,
                stored.checkpoint.key_id,
                stored.path.display(),
                stored.json
            ),
            h.time,
        );
        tracing::info!(seq = h.seq, hash = %hex::encode(h.hash), previous = previous.seq, ?trigger, "ledger checkpoint");
        Ok(stored)
    }

    /// Checkpoints on file, newest first, at most `limit` (files that do not parse are skipped).
    pub fn list(&self, limit: usize) -> std::io::Result<Vec<Stored>> {
        self.read_dir(limit)
    }

    fn read_dir(&self, limit: usize) -> std::io::Result<Vec<Stored>> {
        let mut out = Vec::new();
        for (_, path) in checkpoint_files(&self.dir)? {
            if out.len() >= limit {
                break;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            match SignedCheckpoint::from_json(text.trim()) {
                Ok(checkpoint) => out.push(Stored {
                    checkpoint,
                    json: text.trim().to_owned(),
                    path,
                }),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "unreadable checkpoint file skipped")
                }
            }
        }
        Ok(out)
    }
}

/// `/readyz`: not ready while the head does not extend the last checkpoint.
impl crate::http::ReadinessCheck for Checkpointer {
    fn name(&self) -> &'static str {
        "ledger_rollback"
    }

    fn check(&self) -> Result<(), crate::http::NotReady> {
        self.readiness().map_err(crate::http::NotReady::new)
    }
}

/// The checkpoint files in `dir`, newest first.
fn checkpoint_files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut names: Vec<(String, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            is_checkpoint_name(&name).then(|| (name, e.path()))
        })
        .collect();
    // Names sort by (seq, time): fixed-width decimal fields.
    names.sort();
    names.reverse();
    Ok(names)
}

/// Keeps the newest `keep` files of `dir`.
fn prune(dir: &Path, keep: usize) {
    let Ok(files) = checkpoint_files(dir) else {
        return;
    };
    for (_, path) in files.into_iter().skip(keep) {
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "could not remove an old checkpoint file");
        }
    }
}

/// `<seq, 20 digits>-<time, 20 digits>.json`: sorts by seq, then time.
fn file_name(seq: u64, time: i64) -> String {
    format!("{seq:020}-{:020}.json", time.max(0))
}

fn is_checkpoint_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".json") else {
        return false;
    };
    let Some((a, b)) = stem.split_once('-') else {
        return false;
    };
    a.len() == 20
        && b.len() == 20
        && a.bytes().all(|c| c.is_ascii_digit())
        && b.bytes().all(|c| c.is_ascii_digit())
}

/// Runs [`Checkpointer::tick`] at once and then every `interval`, until the task is dropped.
pub async fn run_periodic(cp: Arc<Checkpointer>, clock: Arc<dyn Clock>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(e) = cp.tick(clock.now()).await {
            tracing::warn!(error = %e, "ledger checkpoint failed; retrying at the next interval");
        }
    }
}

/// `GET /checkpoint` (the latest, JSON; 404 before the first) and `GET /checkpoint.pub` (the
/// public key, PEM), for [`crate::http`]'s listener.
pub fn routes(cp: Arc<Checkpointer>) -> Router {
    Router::new()
        .route("/checkpoint", get(latest_json))
        .route("/checkpoint.pub", get(public_pem))
        .with_state(cp)
}

async fn latest_json(State(cp): State<Arc<Checkpointer>>) -> impl IntoResponse {
    match cp.latest() {
        Some(s) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            format!("{}\n", s.json),
        ),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no checkpoint yet\n".to_owned(),
        ),
    }
}

async fn public_pem(State(cp): State<Arc<Checkpointer>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/x-pem-file")],
        cp.public_key().to_pem(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::clock::fake::FakeClock;
    use crate::store::{NewCertificate, SqliteStore};
    use signet_types::ledger::sha256;

    fn cert(i: usize) -> NewCertificate {
        NewCertificate {
            serial: format!("{i:032x}"),
            spiffe_id: "spiffe://example.org/w".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            not_before: 1_700_000_000,
            not_after: 1_700_003_600,
            cert_sha256: sha256(&i.to_be_bytes()),
            ca_key_id: "root-1".into(),
            caller: "admin:test".into(),
            issued_at: 1_700_000_000,
            request_id: format!("req-{i}"),
            cert_der: vec![1, 2, 3],
            provenance: r#"{"source":{"kind":"admin"}}"#.into(),
        }
    }

    async fn setup(dir: &Path) -> (Arc<dyn Store>, Checkpointer) {
        let url = signet_testutil::sqlite_url(dir);
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::connect(&url, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        let key = CheckpointKey::load_or_generate(&dir.join("checkpoint.key"), true).unwrap();
        let cp = checkpointer(&store, key, &dir.join("checkpoints"), 3);
        (store, cp)
    }

    fn checkpointer(
        store: &Arc<dyn Store>,
        key: CheckpointKey,
        dir: &Path,
        keep: usize,
    ) -> Checkpointer {
        Checkpointer::new(
            store.clone(),
            key,
            TrustDomain::new("example.org").unwrap(),
            dir.to_owned(),
            keep,
            AuditLog::spawn(store.clone(), 64),
            Metrics::new(),
        )
        .unwrap()
    }

    /// What someone with write access to the database does: one statement on the file.
    async fn sql(dir: &Path, statement: &str) {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&signet_testutil::sqlite_url(dir))
            .await
            .unwrap();
        sqlx::query(statement).execute(&mut c).await.unwrap();
    }

    /// Moves `ledger_head` to `(seq, hash)`.
    async fn set_head(dir: &Path, seq: u64, hash: &Hash) {
        sql(
            dir,
            &format!(
                "UPDATE ledger_head SET seq = {seq}, hash = X'{}' WHERE id = 1",
                hex::encode(hash)
            ),
        )
        .await;
    }

    /// The audit events of `kind`, polled until there are `n` (the audit log writes in the
    /// background).
    async fn audited(
        store: &Arc<dyn Store>,
        kind: &str,
        n: usize,
    ) -> Vec<crate::store::AuditEvent> {
        for _ in 0..200 {
            let found: Vec<_> = store
                .audit_events(0, 1000)
                .await
                .unwrap()
                .into_iter()
                .filter(|e| e.kind == kind)
                .collect();
            if found.len() >= n {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no {n} {kind} audit events");
    }

    fn floor(seq: u64, hash: Hash) -> Floor {
        Floor {
            mark: Mark { seq, hash },
            source: FloorSource::SignedHere,
        }
    }

    fn mark(seq: u64, hash: Hash) -> Mark {
        Mark { seq, hash }
    }

    #[test]
    fn a_head_is_signed_only_when_it_extends_the_floor() {
        let (f, h) = ([1; 32], [2; 32]);
        // The head moved on; the floor's row and the head's row are what was signed / named.
        assert_eq!(extends(&floor(5, f), mark(7, h), Some(f), Some(h)), Ok(()));
        // The equal head (an unchanged ledger; an on-demand checkpoint).
        assert_eq!(extends(&floor(5, f), mark(5, f), Some(f), Some(f)), Ok(()));
        // The empty ledger's floor is extended by any consistent head.
        assert_eq!(
            extends(&floor(0, GENESIS), mark(3, h), Some(GENESIS), Some(h)),
            Ok(())
        );
        assert_eq!(
            extends(
                &floor(0, GENESIS),
                mark(0, GENESIS),
                Some(GENESIS),
                Some(GENESIS)
            ),
            Ok(())
        );

        // Shorter: the tail deleted and the head moved back (its row is consistent).
        let r = extends(&floor(5, f), mark(3, h), None, Some(h)).unwrap_err();
        assert!(matches!(r, Rollback::Shorter { .. }), "{r:?}");
        let text = r.to_string();
        assert!(
            text.contains("row 3") && text.contains("below row 5") && text.contains("rows 4..=5"),
            "{text}"
        );
        // Same seq, another hash: the head's row was rewritten.
        let r = extends(&floor(5, f), mark(5, h), Some(h), Some(h)).unwrap_err();
        assert!(
            matches!(r, Rollback::Rewritten { found: Some(x), .. } if x == h),
            "{r:?}"
        );
        // Longer, but the floor's row was rewritten (the history recomputed after it) ...
        let r = extends(&floor(5, f), mark(9, h), Some([3; 32]), Some(h)).unwrap_err();
        assert!(matches!(r, Rollback::Rewritten { .. }), "{r:?}");
        assert!(r.to_string().contains("row 5"), "{r}");
        // ... or is gone (the tail deleted, then new rows appended past the floor).
        let r = extends(&floor(5, f), mark(9, h), None, Some(h)).unwrap_err();
        assert!(
            matches!(r, Rollback::Rewritten { found: None, .. }),
            "{r:?}"
        );
        assert!(r.to_string().contains("is gone"), "{r}");
        // The head row is not the one ledger_head names (its row deleted, or the head moved).
        let r = extends(&floor(5, f), mark(9, h), Some(f), None).unwrap_err();
        assert!(matches!(r, Rollback::HeadRow { found: None, .. }), "{r:?}");
        let r = extends(&floor(5, f), mark(9, h), Some(f), Some([4; 32])).unwrap_err();
        assert!(matches!(r, Rollback::HeadRow { .. }), "{r:?}");
        // A floor at 0 must be the empty ledger's.
        let r = extends(&floor(0, [9; 32]), mark(3, h), Some(GENESIS), Some(h)).unwrap_err();
        assert!(matches!(r, Rollback::Rewritten { .. }), "{r:?}");
    }

    #[test]
    fn a_checkpoint_is_due_only_when_the_head_moved() {
        let at = |seq, hash| Head {
            trust_domain: "example.org".into(),
            seq,
            hash,
            time: 0,
            previous: Some(Mark::GENESIS),
        };
        let head = |seq, hash| LedgerHead { seq, hash };
        assert!(head_moved(None, &head(0, GENESIS)));
        assert!(!head_moved(Some(&at(5, [1; 32])), &head(5, [1; 32])));
        assert!(head_moved(Some(&at(5, [1; 32])), &head(6, [2; 32])));
        // Same seq, another hash, or a head that went back: "moved" (and then refused by
        // `extends`, which the checkpointer applies first).
        assert!(head_moved(Some(&at(5, [1; 32])), &head(5, [2; 32])));
        assert!(head_moved(Some(&at(5, [1; 32])), &head(4, [1; 32])));
    }

    #[tokio::test]
    async fn periodic_checkpoints_follow_the_head_with_an_injected_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (store, cp) = setup(dir.path()).await;
        let clock = FakeClock::at_unix(1_800_000_000);
        let public = cp.public_key();

        // Empty ledger: the genesis head is signed once.
        let first = cp
            .tick(clock.now())
            .await
            .unwrap()
            .expect("first checkpoint");
        assert_eq!(first.checkpoint.head.seq, 0);
        assert_eq!(first.checkpoint.head.hash, GENESIS);
        // Version 2; nothing signed before it: it extends the empty ledger.
        assert_eq!(first.checkpoint.head.previous, Some(Mark::GENESIS));
        assert!(first.json.contains("signet-ledger-checkpoint-v2"));
        clock.advance(Duration::from_secs(60));
        assert!(
            cp.tick(clock.now()).await.unwrap().is_none(),
            "head did not move"
        );

        store
            .append_certificates(&[cert(1), cert(2)])
            .await
            .unwrap();
        clock.advance(Duration::from_secs(60));
        let second = cp.tick(clock.now()).await.unwrap().expect("head moved");
        let head = store.ledger_head().await.unwrap();
        assert_eq!(second.checkpoint.head.seq, 2);
        assert_eq!(second.checkpoint.head.hash, head.hash);
        assert_eq!(second.checkpoint.head.time, 1_800_000_120);
        assert_eq!(second.checkpoint.head.trust_domain, "example.org");
        // It names the one before.
        assert_eq!(
            second.checkpoint.head.previous,
            Some(first.checkpoint.head.mark())
        );
        public.verify(&second.checkpoint).unwrap();
        clock.advance(Duration::from_secs(60));
        assert!(cp.tick(clock.now()).await.unwrap().is_none());

        // On demand: signed even though the head did not move, with the new time.
        clock.advance(Duration::from_secs(5));
        let asked = cp.create(clock.now(), Trigger::Admin).await.unwrap();
        assert_eq!(asked.checkpoint.head.seq, 2);
        assert_eq!(asked.checkpoint.head.time, 1_800_000_185);
        assert_eq!(
            asked.checkpoint.head.previous,
            Some(second.checkpoint.head.mark())
        );
        assert_eq!(cp.latest().unwrap(), asked);

        // The files: one per checkpoint, the newest first, the file is the published JSON.
        let listed = cp.list(10).unwrap();
        assert_eq!(listed.len(), 3);
        assert_eq!(listed[0], *asked);
        assert_eq!(
            std::fs::read_to_string(&asked.path).unwrap().trim(),
            asked.json
        );

        // Only `keep` (3) files are kept.
        store.append_certificates(&[cert(3)]).await.unwrap();
        clock.advance(Duration::from_secs(60));
        cp.tick(clock.now()).await.unwrap().expect("moved");
        let listed = cp.list(10).unwrap();
        assert_eq!(listed.len(), 3);
        assert_eq!(listed[0].checkpoint.head.seq, 3);
        assert!(listed.iter().all(|s| s.checkpoint.head.seq >= 2));
    }

    #[tokio::test]
    async fn a_restart_reuses_the_key_and_does_not_re_sign_an_unchanged_head() {
        let dir = tempfile::tempdir().unwrap();
        let (store, cp) = setup(dir.path()).await;
        store.append_certificates(&[cert(1)]).await.unwrap();
        let made = cp.tick(crate::clock::system_now()).await.unwrap().unwrap();
        let key_id = cp.public_key().key_id();
        drop(cp);
        let (_store2, again) = setup(dir.path()).await;
        assert_eq!(
            again.public_key().key_id(),
            key_id,
            "the key file is reused"
        );
        assert_eq!(again.latest().unwrap(), made);
        assert!(
            again
                .tick(crate::clock::system_now())
                .await
                .unwrap()
                .is_none()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("checkpoint.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // The key's Debug names only its public id.
        let dbg = format!("{:?}", again.key);
        assert!(dbg.contains(&key_id) && !dbg.contains("pair"), "{dbg}");
    }

    #[tokio::test]
    async fn http_serves_the_latest_checkpoint_and_the_public_key() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let (_store, cp) = setup(dir.path()).await;
        let cp = Arc::new(cp);
        let router = routes(cp.clone());
        let get = |path: &'static str| {
            let router = router.clone();
            async move {
                let resp = router
                    .oneshot(
                        axum::http::Request::get(path)
                            .body(axum::body::Body::empty())
                            .unwrap(),
                    )
                    .await
                    .unwrap();
                let status = resp.status();
                let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                    .await
                    .unwrap();
                (status, String::from_utf8(body.to_vec()).unwrap())
            }
        };
        assert_eq!(get("/checkpoint").await.0, StatusCode::NOT_FOUND);
        let (status, pem) = get("/checkpoint.pub").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            PublicKey::from_pem(pem.as_bytes()).unwrap(),
            cp.public_key()
        );
        let made = cp.tick(crate::clock::system_now()).await.unwrap().unwrap();
        let (status, body) = get("/checkpoint").await;
        assert_eq!(status, StatusCode::OK);
        let parsed = SignedCheckpoint::from_json(body.trim()).unwrap();
        assert_eq!(parsed, made.checkpoint);
        cp.public_key().verify(&parsed).unwrap();
    }

    #[test]
    fn a_configured_key_file_must_exist_and_an_openssl_key_loads() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.key");
        let err = CheckpointKey::load_or_generate(&missing, false).unwrap_err();
        assert!(err.to_string().contains("nope.key"), "{err}");
        // `openssl genpkey -algorithm ed25519` writes PKCS#8 v1: RFC 8410's example key.
        let v1 = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n";
        let path = dir.path().join("openssl.key");
        std::fs::write(&path, v1).unwrap();
        let key = CheckpointKey::load_or_generate(&path, false).unwrap();
        assert_eq!(
            key.public().to_pem(),
            "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n"
        );
    }

    #[tokio::test]
    async fn a_rolled_back_head_is_not_signed_and_is_flagged_until_it_extends_again() {
        let dir = tempfile::tempdir().unwrap();
        let (store, cp) = setup(dir.path()).await;
        let clock = FakeClock::at_unix(1_800_000_000);
        store
            .append_certificates(&[cert(1), cert(2), cert(3)])
            .await
            .unwrap();
        let good = cp.tick(clock.now()).await.unwrap().expect("signed");
        let top = store.ledger_head().await.unwrap();
        assert_eq!(good.checkpoint.head.seq, 3);
        let row1 = store.list_certificates(0, 1, None).await.unwrap().remove(0);

        // The tail deleted and the head moved back to row 1.
        sql(dir.path(), "DELETE FROM certificates WHERE seq > 1").await;
        set_head(dir.path(), 1, &row1.hash).await;
        clock.advance(Duration::from_secs(60));
        let err = cp.tick(clock.now()).await.unwrap_err();
        let CheckpointError::Rollback(r) = &err else {
            panic!("{err:?}")
        };
        assert!(matches!(r, Rollback::Shorter { .. }), "{r:?}");
        assert!(err.to_string().contains("rows 2..=3"), "{err}");
        // Nothing signed or written; the last good checkpoint is still the one served.
        assert_eq!(cp.latest().unwrap(), good);
        assert_eq!(cp.list(10).unwrap().len(), 1);
        // On demand: refused the same way.
        let err = cp.create(clock.now(), Trigger::Admin).await.unwrap_err();
        assert!(matches!(err, CheckpointError::Rollback(_)), "{err:?}");
        assert_eq!(cp.list(10).unwrap().len(), 1);
        // Flagged: readiness, the metric, one audit event (not one per tick).
        let why = cp.readiness().unwrap_err().to_string();
        assert!(
            why.contains("ledger rollback detected") && why.contains("row 1"),
            "{why}"
        );
        assert_eq!(crate::http::ReadinessCheck::name(&cp), "ledger_rollback");
        assert_eq!(cp.metrics.ledger_rollback.get(), 1);
        let events = audited(&store, "ledger.rollback_detected", 1).await;
        assert!(events[0].detail.contains("below row 3"), "{events:?}");
        clock.advance(Duration::from_secs(60));
        assert!(cp.tick(clock.now()).await.is_err());

        // Rows appended on the shorter head: longer than the floor again, but row 3 now has
        // another hash (a rewritten history): still refused.
        store
            .append_certificates(&[cert(12), cert(13), cert(14)])
            .await
            .unwrap();
        clock.advance(Duration::from_secs(60));
        let err = cp.tick(clock.now()).await.unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Rollback(Rollback::Rewritten { floor, found: Some(_) }) if floor.mark.seq == 3),
            "{err:?}"
        );
        // A second, different rollback is audited too.
        audited(&store, "ledger.rollback_detected", 2).await;
        assert_eq!(cp.latest().unwrap(), good);
        // Everything after the move was appended: delete it and put the head back where it
        // was (the operator restored the rows): signed again, flags cleared.
        sql(dir.path(), "DELETE FROM certificates WHERE seq > 1").await;
        sql(
            dir.path(),
            &format!(
                "UPDATE ledger_head SET seq = 1, hash = X'{}' WHERE id = 1",
                hex::encode(row1.hash)
            ),
        )
        .await;
        store
            .append_certificates(&[cert(2), cert(3)])
            .await
            .unwrap();
        assert_eq!(
            store.ledger_head().await.unwrap(),
            top,
            "the same rows again"
        );
        clock.advance(Duration::from_secs(60));
        assert!(
            cp.tick(clock.now()).await.unwrap().is_none(),
            "unchanged head"
        );
        assert_eq!(cp.readiness(), Ok(()));
        assert_eq!(cp.metrics.ledger_rollback.get(), 0);
        store.append_certificates(&[cert(4)]).await.unwrap();
        let next = cp.tick(clock.now()).await.unwrap().expect("signed");
        assert_eq!(
            next.checkpoint.head.previous,
            Some(good.checkpoint.head.mark())
        );
    }

    #[tokio::test]
    async fn a_head_whose_row_is_missing_is_not_signed() {
        let dir = tempfile::tempdir().unwrap();
        let (store, cp) = setup(dir.path()).await;
        store
            .append_certificates(&[cert(1), cert(2)])
            .await
            .unwrap();
        cp.tick(crate::clock::system_now())
            .await
            .unwrap()
            .expect("signed");
        store.append_certificates(&[cert(3)]).await.unwrap();
        // The new tail row deleted, the head left in place.
        sql(dir.path(), "DELETE FROM certificates WHERE seq = 3").await;
        let err = cp.tick(crate::clock::system_now()).await.unwrap_err();
        assert!(
            matches!(
                err,
                CheckpointError::Rollback(Rollback::HeadRow { found: None, .. })
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("ledger_head names row 3"), "{err}");
    }

    #[tokio::test]
    async fn after_a_restart_the_newest_file_is_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let (store, cp) = setup(dir.path()).await;
        store
            .append_certificates(&[cert(1), cert(2), cert(3)])
            .await
            .unwrap();
        let good = cp
            .tick(crate::clock::system_now())
            .await
            .unwrap()
            .expect("signed");
        drop(cp);
        // Rolled back while the server was down.
        let row2 = store.list_certificates(1, 1, None).await.unwrap().remove(0);
        sql(dir.path(), "DELETE FROM certificates WHERE seq = 3").await;
        set_head(dir.path(), 2, &row2.hash).await;
        let (_store, again) = setup(dir.path()).await;
        assert_eq!(again.latest().unwrap(), good);
        let err = again.tick(crate::clock::system_now()).await.unwrap_err();
        let CheckpointError::Rollback(Rollback::Shorter { floor, .. }) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(floor.source, FloorSource::File(good.path.clone()));
        assert!(again.readiness().is_err());
        assert_eq!(again.latest().unwrap(), good, "still served");
    }

    #[tokio::test]
    async fn a_replica_on_a_fresh_data_dir_takes_the_floor_from_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let (store, a) = setup(dir.path()).await;
        store
            .append_certificates(&[cert(1), cert(2), cert(3)])
            .await
            .unwrap();
        let signed = a
            .tick(crate::clock::system_now())
            .await
            .unwrap()
            .expect("signed");
        // The checkpoint is in its audit event, signed.
        let events = audited(&store, "ledger.checkpoint", 1).await;
        assert!(events[0].detail.ends_with(&signed.json), "{events:?}");
        let key =
            || CheckpointKey::load_or_generate(&dir.path().join("checkpoint.key"), false).unwrap();

        // A replica with the same key and database, and an empty checkpoint directory.
        let fresh_dir = tempfile::tempdir().unwrap();
        let b = checkpointer(&store, key(), fresh_dir.path(), 3);
        assert!(b.latest().is_none());
        // It extends what A signed.
        store.append_certificates(&[cert(4)]).await.unwrap();
        let made = b
            .tick(crate::clock::system_now())
            .await
            .unwrap()
            .expect("signed");
        assert_eq!(
            made.checkpoint.head.previous,
            Some(signed.checkpoint.head.mark())
        );

        // Another fresh replica after a rollback below A's checkpoint: refused.
        let row1 = store.list_certificates(0, 1, None).await.unwrap().remove(0);
        set_head(dir.path(), 1, &row1.hash).await;
        let c_dir = tempfile::tempdir().unwrap();
        let c = checkpointer(&store, key(), c_dir.path(), 3);
        let err = c.tick(crate::clock::system_now()).await.unwrap_err();
        let CheckpointError::Rollback(Rollback::Shorter { floor, .. }) = &err else {
            panic!("{err:?}")
        };
        assert!(
            matches!(floor.source, FloorSource::Database { .. }),
            "{floor:?}"
        );
        assert_eq!(std::fs::read_dir(c_dir.path()).unwrap().count(), 0);

        // A database event the key did not sign (another key's checkpoint of a high row) is
        // no floor, and does not hide the genuine one behind it.
        let (other, _) = CheckpointKey::generate().unwrap();
        let forged = other.sign(Head {
            trust_domain: "example.org".into(),
            seq: 1000,
            hash: [7; 32],
            time: 1,
            previous: Some(Mark::GENESIS),
        });
        store
            .record_audit_events(&[crate::store::AuditEvent {
                id: 0,
                at: 1,
                kind: "ledger.checkpoint".into(),
                caller: "x".into(),
                detail: format!("forged;{SIGNED_IN_AUDIT}{}", forged.to_json()),
            }])
            .await
            .unwrap();
        let d_dir = tempfile::tempdir().unwrap();
        let d = checkpointer(&store, key(), d_dir.path(), 3);
        let floor = d.database_floor().await.expect("the genuine checkpoint");
        assert_eq!(
            floor.mark,
            made.checkpoint.head.mark(),
            "not the forged row 1000"
        );
        let err = d.tick(crate::clock::system_now()).await.unwrap_err();
        assert!(
            matches!(err, CheckpointError::Rollback(Rollback::Shorter { .. })),
            "{err:?}"
        );
        assert_eq!(std::fs::read_dir(d_dir.path()).unwrap().count(), 0);
    }
}
