//! Signed ledger checkpoints (`[checkpoint]`).
//!
//! The ledger's head (seq, hash) is signed, with the time and the trust domain, in the fixed
//! statement of [`signet_types::checkpoint`], by a checkpoint key that is not in the database:
//! an Ed25519 key in a file (`checkpoint.key_file`, default `<data_dir>/checkpoint.key`, mode
//! 0600, generated on first start like the key-encryption key; replicas sharing one PostgreSQL
//! share it the same way). Someone who can write the database but not that file can delete the
//! ledger's last rows or rewrite a row and recompute every hash after it, and the plain chain
//! still verifies; a checkpoint taken before catches both (`signetctl ledger verify
//! --checkpoint`).
//!
//! A checkpoint is made every `checkpoint.interval` when the head moved since the last one, and
//! on demand (`signet.admin.v1.LedgerAdmin/CreateCheckpoint`, `signetctl ledger checkpoint
//! create`). Each is written to `<data_dir>/checkpoints/<seq>-<time>.json` (atomically; the
//! newest `checkpoint.keep` are kept; two checkpoints of one head in the same second are the
//! same signed statement, so the same file), published at `http_listen` (`/checkpoint`, the latest;
//! `/checkpoint.pub`, the public key), and is an audit event (`ledger.checkpoint`, or
//! `admin.ledger_checkpoint` on demand).
//!
//! The decision is [`head_moved`] (pure); [`Checkpointer::tick`] applies it at an injected
//! `now`; [`run_periodic`] is the thin loop around it.

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
use signet_types::checkpoint::{self, Head, PublicKey, SignedCheckpoint};

use crate::audit::AuditLog;
use crate::authn::AuthenticatedCaller;
use crate::bundle::write_atomic;
use crate::clock::{Clock, unix};
use crate::store::{LedgerHead, LedgerStore, StoreError};

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

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the checkpoint file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The periodic rule: a new checkpoint is due when there is none yet, or when the head moved
/// since the last one (a different seq or hash; a head that went backwards is a change too).
pub fn head_moved(latest: Option<&Head>, head: &LedgerHead) -> bool {
    match latest {
        None => true,
        Some(l) => l.seq != head.seq || l.hash != head.hash,
    }
}

/// Makes, keeps and publishes checkpoints.
pub struct Checkpointer {
    store: Arc<dyn LedgerStore>,
    key: CheckpointKey,
    trust_domain: TrustDomain,
    dir: PathBuf,
    keep: usize,
    audit: AuditLog,
    latest: Mutex<Option<Arc<Stored>>>,
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
    /// key signed, so that a restart does not re-sign an unchanged head.
    pub fn new(
        store: Arc<dyn LedgerStore>,
        key: CheckpointKey,
        trust_domain: TrustDomain,
        dir: PathBuf,
        keep: usize,
        audit: AuditLog,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let cp = Self {
            store,
            key,
            trust_domain,
            dir,
            keep: keep.max(1),
            audit,
            latest: Mutex::new(None),
            making: tokio::sync::Mutex::new(()),
        };
        let public = cp.key.public();
        let mine = cp
            .read_dir(usize::MAX)?
            .into_iter()
            .find(|s| public.verify(&s.checkpoint).is_ok());
        *cp.lock_latest() = mine.map(Arc::new);
        Ok(cp)
    }

    fn lock_latest(&self) -> std::sync::MutexGuard<'_, Option<Arc<Stored>>> {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn public_key(&self) -> PublicKey {
        self.key.public()
    }

    /// The newest checkpoint this server made or found at start.
    pub fn latest(&self) -> Option<Arc<Stored>> {
        self.lock_latest().clone()
    }

    /// Signs the current head now, whether or not it moved.
    pub async fn create(
        &self,
        now: SystemTime,
        trigger: Trigger,
    ) -> Result<Arc<Stored>, CheckpointError> {
        let _one = self.making.lock().await;
        let head = self.store.ledger_head().await?;
        self.sign_and_keep(head, now, trigger).await
    }

    /// The periodic step: signs the head at `now` if it moved since the last checkpoint.
    pub async fn tick(&self, now: SystemTime) -> Result<Option<Arc<Stored>>, CheckpointError> {
        let _one = self.making.lock().await;
        let head = self.store.ledger_head().await?;
        let latest = self.latest();
        if !head_moved(latest.as_ref().map(|s| &s.checkpoint.head), &head) {
            return Ok(None);
        }
        self.sign_and_keep(head, now, Trigger::Periodic)
            .await
            .map(Some)
    }

    async fn sign_and_keep(
        &self,
        head: LedgerHead,
        now: SystemTime,
        trigger: Trigger,
    ) -> Result<Arc<Stored>, CheckpointError> {
        let signed = self.key.sign(Head {
            trust_domain: self.trust_domain.as_str().to_owned(),
            seq: head.seq,
            hash: head.hash,
            time: unix(now),
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
        *self.lock_latest() = Some(stored.clone());
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
                "ledger checkpoint ({why}): seq {} hash {} time {} key {} file {}",
                h.seq,
                hex::encode(h.hash),
                h.time,
                stored.checkpoint.key_id,
                stored.path.display()
            ),
            h.time,
        );
        tracing::info!(seq = h.seq, hash = %hex::encode(h.hash), ?trigger, "ledger checkpoint");
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
    use crate::store::{NewCertificate, SqliteStore, Store};
    use signet_types::ledger::{GENESIS, sha256};

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
        let audit = AuditLog::spawn(store.clone(), 64);
        let cp = Checkpointer::new(
            store.clone(),
            key,
            TrustDomain::new("example.org").unwrap(),
            dir.join("checkpoints"),
            3,
            audit,
        )
        .unwrap();
        (store, cp)
    }

    #[test]
    fn a_checkpoint_is_due_only_when_the_head_moved() {
        let at = |seq, hash| Head {
            trust_domain: "example.org".into(),
            seq,
            hash,
            time: 0,
        };
        let head = |seq, hash| LedgerHead { seq, hash };
        assert!(head_moved(None, &head(0, GENESIS)));
        assert!(!head_moved(Some(&at(5, [1; 32])), &head(5, [1; 32])));
        assert!(head_moved(Some(&at(5, [1; 32])), &head(6, [2; 32])));
        // Same seq, another hash (a rewritten head), or a head that went back: due.
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
        public.verify(&second.checkpoint).unwrap();
        clock.advance(Duration::from_secs(60));
        assert!(cp.tick(clock.now()).await.unwrap().is_none());

        // On demand: signed even though the head did not move, with the new time.
        clock.advance(Duration::from_secs(5));
        let asked = cp.create(clock.now(), Trigger::Admin).await.unwrap();
        assert_eq!(asked.checkpoint.head.seq, 2);
        assert_eq!(asked.checkpoint.head.time, 1_800_000_185);
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
        let made = cp.tick(SystemTime::now()).await.unwrap().unwrap();
        let key_id = cp.public_key().key_id();
        drop(cp);
        let (_store2, again) = setup(dir.path()).await;
        assert_eq!(
            again.public_key().key_id(),
            key_id,
            "the key file is reused"
        );
        assert_eq!(again.latest().unwrap(), made);
        assert!(again.tick(SystemTime::now()).await.unwrap().is_none());
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
        let made = cp.tick(SystemTime::now()).await.unwrap().unwrap();
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
}
