//! The group-commit ledger writer.
//!
//! Every issuance sends its record to one background task and waits for the answer. The task
//! takes everything already queued (up to `max_batch`), certificates and JWT-SVIDs alike, in
//! the order queued, into a single [`LedgerStore::append_rows`] transaction, then answers each waiter with its sequence
//! number, or all of them with the same error. While one batch commits, the next accumulates
//! in the queue, so durability costs one commit per batch rather than per certificate.
//!
//! The writer runs on a thread of its own with a single-threaded runtime, and on PostgreSQL
//! through a connection made there ([`crate::store::connect_ledger_writer`]). The server's
//! runtime workers spend a quarter of a millisecond per issuance inside one poll (checking and
//! making signatures), and they look at their I/O driver only between polls: a commit reply
//! arriving at a socket of theirs waited for milliseconds under load. The writer's thread
//! sleeps in its own driver and the kernel wakes it the moment the answer arrives, so a
//! transaction takes about its round trip (measured at 2,700 issuances/s: 0.65-1.2 ms mean,
//! against 1.9 ms on the shared runtime) and requests wait less for their commit.
//!
//! No issuance waits forever: each waits at most `ledger.commit_deadline` for its commit
//! (queueing included) and then answers Unavailable; its certificate is discarded, never
//! returned. A record whose waiter has already given up is not committed at all. The writer's
//! progress ([`LedgerProgress`]) is what `/readyz` reports: requests waiting without a commit,
//! a deep queue, or a recent failed commit make the server not ready.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::clock::Clock;
use crate::config::LedgerConfig;
use crate::store::{LedgerStore, NewCertificate, NewJwtSvid, NewLedgerRow, StoreError};

/// Why a certificate was not recorded. The caller must not return the certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The store failed or is unreachable: retryable (gRPC `Unavailable`).
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    /// Too many issuances are waiting for a commit.
    #[error("ledger queue is full")]
    Overloaded,
    /// The writer has stopped.
    #[error("ledger writer has stopped")]
    Closed,
    /// The commit was not done within `ledger.commit_deadline`.
    #[error("no ledger commit within {} (ledger.commit_deadline); the database may be stalled", humantime::format_duration(*.0))]
    DeadlineExceeded(Duration),
    /// A renewal of a certificate that has been revoked (possibly a moment ago, on another
    /// replica): never recorded, never returned.
    #[error("the presented certificate {0} has been revoked; it cannot be renewed")]
    RevokedParent(String),
}

/// What `/readyz` checks the writer's progress against.
#[derive(Debug, Clone, Copy)]
pub struct ReadyThresholds {
    /// Requests waiting this long without any commit (or a failed commit this recent) make
    /// the server not ready.
    pub max_wait: Duration,
    /// More requests than this waiting make the server not ready.
    pub max_queue: usize,
}

#[derive(Debug, Default)]
struct Progress {
    /// Issuances waiting for their commit.
    pending: usize,
    /// When `pending` last rose from zero.
    busy_since: Option<Instant>,
    last_commit: Option<Instant>,
    /// The last failed commit, cleared by a successful one.
    last_failure: Option<(Instant, String)>,
    failures: u64,
}

/// The writer's progress, shared with `/readyz` and the metrics.
#[derive(Debug)]
pub struct LedgerProgress {
    state: Mutex<Progress>,
    thresholds: ReadyThresholds,
}

impl LedgerProgress {
    pub fn new(thresholds: ReadyThresholds) -> Self {
        Self {
            state: Mutex::new(Progress::default()),
            thresholds,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One issuance starts waiting; it stops when the guard is dropped.
    fn wait(self: &Arc<Self>, now: Instant) -> Waiting {
        let mut s = self.lock();
        if s.pending == 0 {
            s.busy_since = Some(now);
        }
        s.pending += 1;
        Waiting(self.clone())
    }

    fn committed(&self, now: Instant) {
        let mut s = self.lock();
        s.last_commit = Some(now);
        s.last_failure = None;
    }

    fn failed(&self, now: Instant, error: String) {
        let mut s = self.lock();
        s.last_failure = Some((now, error));
        s.failures += 1;
    }

    /// Issuances waiting for a commit now.
    pub fn pending(&self) -> usize {
        self.lock().pending
    }

    /// Failed commits so far.
    pub fn failures(&self) -> u64 {
        self.lock().failures
    }

    /// `Ok` when the ledger is making progress, else why not (for `/readyz`'s body).
    pub fn readiness(&self, now: Instant) -> Result<(), LedgerNotReady> {
        let s = self.lock();
        let t = self.thresholds;
        if s.pending > t.max_queue {
            return Err(LedgerNotReady::QueueDeep {
                pending: s.pending,
                max_queue: t.max_queue,
            });
        }
        if s.pending > 0 {
            // Waiting since the later of: the last commit, the moment requests began waiting.
            let since = match (s.last_commit, s.busy_since) {
                (Some(a), Some(b)) => a.max(b),
                (a, b) => a.or(b).unwrap_or(now),
            };
            let waited = now.saturating_duration_since(since);
            if waited > t.max_wait {
                return Err(LedgerNotReady::Stalled {
                    pending: s.pending,
                    waited,
                    max_wait: t.max_wait,
                });
            }
        }
        if let Some((at, error)) = &s.last_failure {
            let ago = now.saturating_duration_since(*at);
            if ago <= t.max_wait {
                return Err(LedgerNotReady::Failing {
                    ago,
                    error: error.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Why the ledger writer is not making progress ([`LedgerProgress::readiness`]); durations are
/// shown to the millisecond.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerNotReady {
    #[error(
        "{pending} issuances are waiting for a ledger commit (more than ledger.ready_max_queue = {max_queue})"
    )]
    QueueDeep { pending: usize, max_queue: usize },
    #[error(
        "{pending} issuances have waited {} without a ledger commit (ledger.ready_max_wait = {}); \
         is the database stalled or the ledger head row locked?",
        millis(.waited),
        millis(.max_wait)
    )]
    Stalled {
        pending: usize,
        waited: Duration,
        max_wait: Duration,
    },
    #[error(
        "the last ledger commit failed {} ago and none has succeeded since: {error}",
        millis(.ago)
    )]
    Failing { ago: Duration, error: String },
}

fn millis(d: &Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

/// An issuance waiting for its commit.
struct Waiting(Arc<LedgerProgress>);

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.pending = s.pending.saturating_sub(1);
    }
}

/// The record's sequence number, and the batch it was committed in (its first sequence
/// number and size, for the issuance's trace).
type Reply = oneshot::Sender<Result<(u64, u64, usize), LedgerError>>;

/// Called after each commit attempt with the batch size and how long the commit took.
pub type OnBatch = Arc<dyn Fn(usize, Duration) + Send + Sync>;

/// A handle to the group-commit writer task; cheap to clone.
#[derive(Clone)]
pub struct LedgerWriter {
    tx: mpsc::Sender<(NewLedgerRow, Reply)>,
    deadline: Duration,
    progress: Arc<LedgerProgress>,
    /// When waiting starts (the writer task reads the same clock for its commits).
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for LedgerWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerWriter")
            .field("queued", &(self.tx.max_capacity() - self.tx.capacity()))
            .finish()
    }
}

impl LedgerWriter {
    /// Starts the writer task on the current tokio runtime (tests; the server gives the
    /// writer a thread of its own, [`LedgerWriter::spawn_on_own_thread`]). It stops when every
    /// handle is dropped (after committing what is queued). It reads the system clock
    /// (tokio's, so a paused test runtime moves it).
    #[cfg(test)]
    pub fn spawn(
        store: Arc<dyn LedgerStore>,
        cfg: &LedgerConfig,
        on_batch: OnBatch,
    ) -> LedgerWriter {
        let (tx, rx) = mpsc::channel(cfg.queue_depth.max(1));
        let progress = Arc::new(LedgerProgress::new(ReadyThresholds {
            max_wait: cfg.ready_max_wait,
            max_queue: cfg.ready_max_queue,
        }));
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::SystemClock);
        tokio::spawn(run(
            store,
            rx,
            cfg.max_batch.max(1),
            on_batch,
            progress.clone(),
            clock.clone(),
        ));
        LedgerWriter {
            tx,
            deadline: cfg.commit_deadline,
            progress,
            clock,
        }
    }

    /// Starts the writer on a thread of its own, on a single-threaded runtime, appending
    /// through the store `open` makes there (see the module doc for why); returns once the
    /// store is open, or why it could not be. The thread ends when every handle is dropped.
    /// `clock` times the waits and commits `/readyz` judges.
    pub async fn spawn_on_own_thread<F, Fut>(
        open: F,
        cfg: &LedgerConfig,
        on_batch: OnBatch,
        clock: Arc<dyn Clock>,
    ) -> Result<LedgerWriter, StoreError>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Arc<dyn LedgerStore>, StoreError>>,
    {
        let (tx, rx) = mpsc::channel(cfg.queue_depth.max(1));
        let progress = Arc::new(LedgerProgress::new(ReadyThresholds {
            max_wait: cfg.ready_max_wait,
            max_queue: cfg.ready_max_queue,
        }));
        let (opened_tx, opened) = oneshot::channel();
        let max_batch = cfg.max_batch.max(1);
        let task_progress = progress.clone();
        let task_clock = clock.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unavailable(format!("ledger writer runtime: {e}")))?;
        std::thread::Builder::new()
            .name("signet-ledger".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let store = match open().await {
                        Ok(store) => {
                            let _ = opened_tx.send(Ok(()));
                            store
                        }
                        Err(e) => {
                            let _ = opened_tx.send(Err(e));
                            return;
                        }
                    };
                    run(store, rx, max_batch, on_batch, task_progress, task_clock).await;
                });
            })
            .map_err(|e| StoreError::Unavailable(format!("ledger writer thread: {e}")))?;
        opened
            .await
            .map_err(|_| StoreError::Unavailable("the ledger writer thread died".into()))??;
        Ok(LedgerWriter {
            tx,
            deadline: cfg.commit_deadline,
            progress,
            clock,
        })
    }

    /// The writer's progress (for `/readyz` and metrics).
    pub fn progress(&self) -> Arc<LedgerProgress> {
        self.progress.clone()
    }

    /// Records `cert` in the ledger; returns its sequence number once the transaction holding
    /// it has committed. Never waits for queue space: a full queue answers `Overloaded`; never
    /// waits longer than the commit deadline: then `DeadlineExceeded`, and the certificate
    /// must be discarded (it may still be recorded later, but is never returned).
    pub async fn commit(&self, cert: NewCertificate) -> Result<u64, LedgerError> {
        self.commit_row(NewLedgerRow::Certificate(cert)).await
    }

    /// Records a JWT-SVID in the ledger, as [`LedgerWriter::commit`] does a certificate: in the
    /// same batches, under the same deadline; the token must not be returned unless this
    /// answers its seq.
    pub async fn commit_jwt(&self, jwt: NewJwtSvid) -> Result<u64, LedgerError> {
        self.commit_row(NewLedgerRow::JwtSvid(jwt)).await
    }

    async fn commit_row(&self, cert: NewLedgerRow) -> Result<u64, LedgerError> {
        let _waiting = self.progress.wait(self.clock.monotonic().into_std());
        let (reply, answer) = oneshot::channel();
        self.tx.try_send((cert, reply)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => LedgerError::Overloaded,
            mpsc::error::TrySendError::Closed(_) => LedgerError::Closed,
        })?;
        let (seq, first, size) = match tokio::time::timeout(self.deadline, answer).await {
            // A dropped reply means the writer task died before answering.
            Ok(answer) => answer.unwrap_or(Err(LedgerError::Closed))?,
            Err(_) => return Err(LedgerError::DeadlineExceeded(self.deadline)),
        };
        // Into the caller's `ledger.commit` span, when it is traced.
        let span = tracing::Span::current();
        span.record("seq", seq);
        span.record("batch_first_seq", first);
        span.record("batch_size", size);
        Ok(seq)
    }
}

async fn run(
    store: Arc<dyn LedgerStore>,
    mut rx: mpsc::Receiver<(NewLedgerRow, Reply)>,
    max_batch: usize,
    on_batch: OnBatch,
    progress: Arc<LedgerProgress>,
    clock: Arc<dyn Clock>,
) {
    let mut pending: Vec<(NewLedgerRow, Reply)> = Vec::with_capacity(max_batch);
    let mut batch: Vec<NewLedgerRow> = Vec::with_capacity(max_batch);
    let mut replies: Vec<Reply> = Vec::with_capacity(max_batch);
    // Waits for one, then takes whatever else is already queued, up to max_batch.
    while rx.recv_many(&mut pending, max_batch).await > 0 {
        for (cert, reply) in pending.drain(..) {
            // Its waiter gave up (deadline, or the client went away): the certificate will
            // never be returned, so it need not be recorded.
            if reply.is_closed() {
                continue;
            }
            batch.push(cert);
            replies.push(reply);
        }
        if batch.is_empty() {
            continue;
        }
        let started = clock.monotonic();
        let mut result = store.append_rows(&batch).await;
        // Renewals of certificates revoked meanwhile were refused, and with them the batch:
        // answer those, and commit the rest again (once: nothing else in it renews those).
        if let Err(StoreError::RevokedParent(serials)) = &result {
            let serials = serials.clone();
            let mut kept = Vec::with_capacity(batch.len());
            let mut kept_replies = Vec::with_capacity(batch.len());
            for (cert, reply) in batch.drain(..).zip(replies.drain(..)) {
                match cert.renewed_from().filter(|s| serials.contains(s)) {
                    Some(parent) => {
                        let _ = reply.send(Err(LedgerError::RevokedParent(parent)));
                    }
                    None => {
                        kept.push(cert);
                        kept_replies.push(reply);
                    }
                }
            }
            batch = kept;
            replies = kept_replies;
            if batch.is_empty() {
                continue;
            }
            result = store.append_rows(&batch).await;
        }
        let done = clock.monotonic();
        on_batch(batch.len(), done.saturating_duration_since(started));
        let done = done.into_std();
        match &result {
            Ok(seqs) if seqs.len() == replies.len() => progress.committed(done),
            Ok(_) => progress.failed(
                done,
                "the store returned the wrong number of sequence numbers".into(),
            ),
            Err(e) => progress.failed(done, e.to_string()),
        }
        match result {
            Ok(seqs) if seqs.len() == replies.len() => {
                let (first, size) = (seqs.first().copied().unwrap_or_default(), seqs.len());
                for (reply, seq) in replies.drain(..).zip(seqs) {
                    // The requester may have gone away; the record is committed regardless.
                    let _ = reply.send(Ok((seq, first, size)));
                }
            }
            Ok(seqs) => {
                let err = LedgerError::Unavailable(format!(
                    "store returned {} sequence numbers for a batch of {}",
                    seqs.len(),
                    replies.len()
                ));
                tracing::error!(error = %err, "ledger commit");
                for reply in replies.drain(..) {
                    let _ = reply.send(Err(err.clone()));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, batch = batch.len(), "ledger commit failed");
                let err = LedgerError::Unavailable(e.to_string());
                for reply in replies.drain(..) {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
        batch.clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use signet_types::ledger::{GENESIS, Hash, LedgerEntry, Verifier, chain_hash, sha256};
    use tokio::sync::Semaphore;

    use super::*;
    use crate::store::ledger::Order;
    use crate::store::{LedgerHead, LedgerRecord, SqliteStore, Store, StoreError};

    fn cert(i: usize) -> NewCertificate {
        NewCertificate {
            serial: format!("{i:032x}"),
            spiffe_id: format!("spiffe://example.org/w/{}", i % 7),
            dns_names: vec![format!("w{i}.svc")],
            ip_addresses: vec![],
            not_before: 1_700_000_000,
            not_after: 1_700_003_600,
            cert_sha256: sha256(&i.to_be_bytes()),
            ca_key_id: "root-1".into(),
            caller: "test".into(),
            issued_at: 1_700_000_000,
            request_id: format!("req-{i}"),
            cert_der: vec![1, 2, 3],
            provenance: String::new(),
        }
    }

    /// An in-memory ledger whose commits can be held back (`gate`) or made to fail.
    #[derive(Default)]
    struct FakeStore {
        rows: Mutex<Vec<(NewLedgerRow, Hash)>>,
        batches: Mutex<Vec<usize>>,
        fail: Mutex<Option<String>>,
        gate: Option<Semaphore>,
        /// Appends begun (including those held at the gate).
        entered: std::sync::atomic::AtomicUsize,
        /// The thread the last append ran on.
        appended_on: Mutex<Option<String>>,
    }

    impl FakeStore {
        fn gated() -> Self {
            Self {
                gate: Some(Semaphore::new(0)),
                ..Self::default()
            }
        }
        fn open(&self, commits: usize) {
            if let Some(g) = &self.gate {
                g.add_permits(commits);
            }
        }
        fn entered(&self) -> usize {
            self.entered.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn serials(&self) -> Vec<String> {
            let rows = self.rows.lock().unwrap();
            rows.iter()
                .map(|(r, _)| match r {
                    NewLedgerRow::Certificate(c) => c.serial.clone(),
                    NewLedgerRow::JwtSvid(j) => format!("jwt:{}", j.request_id),
                })
                .collect()
        }
    }

    #[async_trait]
    impl LedgerStore for FakeStore {
        async fn ping(&self) -> Result<(), StoreError> {
            Ok(())
        }
        async fn append_rows(&self, batch: &[NewLedgerRow]) -> Result<Vec<u64>, StoreError> {
            self.entered
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            *self.appended_on.lock().unwrap() = std::thread::current().name().map(str::to_owned);
            if let Some(g) = &self.gate {
                g.acquire().await.unwrap().forget();
            }
            self.batches.lock().unwrap().push(batch.len());
            if let Some(msg) = self.fail.lock().unwrap().clone() {
                return Err(StoreError::Unavailable(msg));
            }
            let mut rows = self.rows.lock().unwrap();
            let first = rows.len() as u64 + 1;
            for c in batch {
                rows.push((c.clone(), GENESIS));
            }
            Ok((first..first + batch.len() as u64).collect())
        }
        async fn ledger_head(&self) -> Result<LedgerHead, StoreError> {
            Ok(LedgerHead {
                seq: self.rows.lock().unwrap().len() as u64,
                hash: GENESIS,
            })
        }
        async fn certificates_page(
            &self,
            _: Order,
            _: Option<u64>,
            _: u32,
            _: Option<&str>,
        ) -> Result<Vec<LedgerRecord>, StoreError> {
            Ok(vec![])
        }
        async fn certificate_by_serial(&self, _: &str) -> Result<Option<LedgerRecord>, StoreError> {
            Ok(None)
        }
        async fn jwt_svids_page(
            &self,
            _: Order,
            _: Option<u64>,
            _: u32,
            _: Option<&str>,
        ) -> Result<Vec<signet_types::ledger::JwtSvidRecord>, StoreError> {
            Ok(vec![])
        }
        async fn count_certificates(&self) -> Result<u64, StoreError> {
            Ok(self.rows.lock().unwrap().len() as u64)
        }
    }

    fn cfg(max_batch: usize, queue_depth: usize) -> LedgerConfig {
        LedgerConfig {
            max_batch,
            queue_depth,
            ..LedgerConfig::default()
        }
    }

    fn recorder() -> (OnBatch, Arc<Mutex<Vec<usize>>>) {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let s = sizes.clone();
        (Arc::new(move |n, _| s.lock().unwrap().push(n)), sizes)
    }

    fn queued(w: &LedgerWriter) -> usize {
        w.tx.max_capacity() - w.tx.capacity()
    }

    /// Waits (without sleeping on wall-clock deadlines) until `cond` holds.
    async fn until(mut cond: impl FnMut() -> bool) {
        for _ in 0..100_000 {
            if cond() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("condition never held");
    }

    type Waiter = tokio::task::JoinHandle<Result<u64, LedgerError>>;

    /// Submits `certs` one at a time, each enqueued before the next (so the order is known).
    async fn submit(w: &LedgerWriter, certs: impl IntoIterator<Item = usize>) -> Vec<Waiter> {
        let mut out = Vec::new();
        for i in certs {
            let before = queued(w);
            let w2 = w.clone();
            out.push(tokio::spawn(async move { w2.commit(cert(i)).await }));
            until(|| queued(w) == before + 1).await;
        }
        out
    }

    /// Submits cert 0 and waits until the writer holds it at the store's gate.
    async fn hold_first(w: &LedgerWriter, store: &FakeStore) -> Vec<Waiter> {
        let w2 = w.clone();
        let h = tokio::spawn(async move { w2.commit(cert(0)).await });
        until(|| store.entered() == 1).await;
        vec![h]
    }

    #[tokio::test]
    async fn batches_what_queued_during_a_commit_in_order() {
        let store = Arc::new(FakeStore::gated());
        let (on_batch, sizes) = recorder();
        let w = LedgerWriter::spawn(store.clone(), &cfg(4, 100), on_batch);

        // The first commit is taken alone and held at the gate.
        let first = hold_first(&w, &store).await;
        // Ten more queue up behind it.
        let rest = submit(&w, 1..11).await;
        store.open(100);

        let mut seqs = Vec::new();
        for h in first.into_iter().chain(rest) {
            seqs.push(h.await.unwrap().unwrap());
        }
        assert_eq!(seqs, (1..=11).collect::<Vec<u64>>());
        assert_eq!(*sizes.lock().unwrap(), vec![1, 4, 4, 2]);
        assert_eq!(*store.batches.lock().unwrap(), vec![1, 4, 4, 2]);
        let expected: Vec<String> = (0..11).map(|i| cert(i).serial).collect();
        assert_eq!(store.serials(), expected);
    }

    fn jwt(i: usize) -> NewJwtSvid {
        NewJwtSvid {
            spiffe_id: "spiffe://example.org/w/1".into(),
            audience: vec!["a".into()],
            issued_at: 1_700_000_000,
            expires_at: 1_700_000_300,
            key_id: "k".into(),
            token_sha256: sha256(&i.to_be_bytes()),
            caller: "test".into(),
            request_id: format!("{i}"),
            provenance: String::new(),
        }
    }

    #[tokio::test]
    async fn jwt_rows_join_the_same_batches_in_order_and_answer_only_after_the_commit() {
        let store = Arc::new(FakeStore::gated());
        let (on_batch, sizes) = recorder();
        let w = LedgerWriter::spawn(store.clone(), &cfg(64, 100), on_batch);

        let first = hold_first(&w, &store).await;
        let w2 = w.clone();
        let token = tokio::spawn(async move { w2.commit_jwt(jwt(1)).await });
        until(|| queued(&w) == 1).await;
        let rest = submit(&w, 2..3).await;
        // Held at the store: the JWT-SVID's waiter has no answer, so no token can leave.
        for _ in 0..1000 {
            tokio::task::yield_now().await;
        }
        assert!(!token.is_finished(), "answered before its row committed");
        store.open(100);
        assert_eq!(first.into_iter().next().unwrap().await.unwrap(), Ok(1));
        assert_eq!(token.await.unwrap(), Ok(2));
        assert_eq!(rest.into_iter().next().unwrap().await.unwrap(), Ok(3));
        // The JWT-SVID and the certificate queued behind the first commit went in one batch,
        // in the order queued.
        assert_eq!(*sizes.lock().unwrap(), vec![1, 2]);
        assert_eq!(
            store.serials(),
            vec![cert(0).serial, "jwt:1".to_owned(), cert(2).serial]
        );
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_waiter_and_records_nothing() {
        let store = Arc::new(FakeStore::gated());
        let (on_batch, sizes) = recorder();
        let w = LedgerWriter::spawn(store.clone(), &cfg(64, 100), on_batch);

        let first = hold_first(&w, &store).await;
        let rest = submit(&w, 1..6).await;
        *store.fail.lock().unwrap() = Some("disk on fire".into());
        store.open(2);
        for h in first.into_iter().chain(rest) {
            let err = h.await.unwrap().unwrap_err();
            assert_eq!(
                err,
                LedgerError::Unavailable("database unavailable: disk on fire".into())
            );
        }
        assert_eq!(*sizes.lock().unwrap(), vec![1, 5]);
        assert!(store.serials().is_empty());

        // The writer carries on once the store recovers.
        *store.fail.lock().unwrap() = None;
        store.open(1);
        assert_eq!(w.commit(cert(9)).await, Ok(1));
    }

    #[tokio::test]
    async fn the_writer_on_its_own_thread_appends_through_the_store_opened_there() {
        let store = Arc::new(FakeStore::default());
        let opened = store.clone();
        let (on_batch, sizes) = recorder();
        let w = LedgerWriter::spawn_on_own_thread(
            move || async move {
                // Made on the writer's thread, as the PostgreSQL connection is.
                assert_eq!(std::thread::current().name(), Some("signet-ledger"));
                Ok(opened as Arc<dyn LedgerStore>)
            },
            &cfg(64, 100),
            on_batch,
            Arc::new(crate::clock::SystemClock),
        )
        .await
        .unwrap();
        assert_eq!(w.commit(cert(0)).await, Ok(1));
        assert_eq!(w.commit(cert(1)).await, Ok(2));
        assert_eq!(store.serials(), vec![cert(0).serial, cert(1).serial]);
        assert_eq!(
            store.appended_on.lock().unwrap().as_deref(),
            Some("signet-ledger")
        );
        assert_eq!(*sizes.lock().unwrap(), vec![1, 1]);
    }

    #[tokio::test]
    async fn a_store_the_writer_cannot_open_is_reported_and_nothing_starts() {
        let (on_batch, _) = recorder();
        let err = LedgerWriter::spawn_on_own_thread(
            || async { Err(StoreError::Unavailable("no route to the database".into())) },
            &cfg(64, 100),
            on_batch,
            Arc::new(crate::clock::SystemClock),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m == "no route to the database"),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_full_queue_answers_overloaded() {
        let store = Arc::new(FakeStore::gated());
        let (on_batch, _) = recorder();
        let w = LedgerWriter::spawn(store.clone(), &cfg(64, 2), on_batch);

        let first = hold_first(&w, &store).await;
        let rest = submit(&w, 1..3).await;
        assert_eq!(w.commit(cert(3)).await, Err(LedgerError::Overloaded));
        store.open(100);
        for h in first.into_iter().chain(rest) {
            h.await.unwrap().unwrap();
        }
        assert_eq!(store.serials().len(), 3);
    }

    #[tokio::test]
    async fn a_dead_writer_answers_closed() {
        /// A store whose append panics: the writer task dies with replies outstanding.
        struct Panics;
        #[async_trait]
        impl LedgerStore for Panics {
            async fn ping(&self) -> Result<(), StoreError> {
                Ok(())
            }
            async fn append_rows(&self, _: &[NewLedgerRow]) -> Result<Vec<u64>, StoreError> {
                panic!("store bug (expected by this test)")
            }
            async fn jwt_svids_page(
                &self,
                _: Order,
                _: Option<u64>,
                _: u32,
                _: Option<&str>,
            ) -> Result<Vec<signet_types::ledger::JwtSvidRecord>, StoreError> {
                unreachable!()
            }
            async fn ledger_head(&self) -> Result<LedgerHead, StoreError> {
                unreachable!()
            }
            async fn certificates_page(
                &self,
                _: Order,
                _: Option<u64>,
                _: u32,
                _: Option<&str>,
            ) -> Result<Vec<LedgerRecord>, StoreError> {
                unreachable!()
            }
            async fn certificate_by_serial(
                &self,
                _: &str,
            ) -> Result<Option<LedgerRecord>, StoreError> {
                unreachable!()
            }
            async fn count_certificates(&self) -> Result<u64, StoreError> {
                unreachable!()
            }
        }
        let (on_batch, _) = recorder();
        let w = LedgerWriter::spawn(Arc::new(Panics), &cfg(64, 8), on_batch);
        assert_eq!(w.commit(cert(0)).await, Err(LedgerError::Closed));
        // The receiver is gone too: later commits fail fast.
        until(|| w.tx.is_closed()).await;
        assert_eq!(w.commit(cert(1)).await, Err(LedgerError::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_commit_answers_within_the_deadline_and_readyz_says_why() {
        let store = Arc::new(FakeStore::gated());
        let (on_batch, _) = recorder();
        let config = LedgerConfig {
            commit_deadline: Duration::from_secs(3),
            ready_max_wait: Duration::from_secs(2),
            ..cfg(64, 100)
        };
        let w = LedgerWriter::spawn(store.clone(), &config, on_batch);
        let progress = w.progress();
        assert_eq!(
            progress.readiness(crate::clock::monotonic().into_std()),
            Ok(())
        );

        // The store never answers: the waiters give up at the deadline, not later.
        let first = hold_first(&w, &store).await;
        let rest = submit(&w, 1..4).await;
        assert_eq!(progress.pending(), 4);
        // While they wait, readiness turns bad once they have waited ready_max_wait.
        let why = progress
            .readiness(crate::clock::monotonic().into_std() + Duration::from_secs(3))
            .unwrap_err();
        assert!(why.to_string().contains("4 issuances have waited"), "{why}");
        let started = crate::clock::monotonic();
        for h in first.into_iter().chain(rest) {
            assert_eq!(
                h.await.unwrap(),
                Err(LedgerError::DeadlineExceeded(Duration::from_secs(3)))
            );
        }
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert_eq!(progress.pending(), 0);

        // The first batch commits late (its waiter is gone); the queued ones, whose waiters
        // gave up before the writer reached them, are never recorded.
        store.open(100);
        assert_eq!(w.commit(cert(9)).await, Ok(2));
        assert_eq!(store.serials(), vec![cert(0).serial, cert(9).serial]);
        assert_eq!(
            progress.readiness(crate::clock::monotonic().into_std()),
            Ok(())
        );
    }

    #[tokio::test]
    async fn readiness_reports_failures_and_deep_queues_then_recovers() {
        let p = Arc::new(LedgerProgress::new(ReadyThresholds {
            max_wait: Duration::from_secs(5),
            max_queue: 2,
        }));
        let t0 = crate::clock::monotonic().into_std();
        p.failed(t0, "database unavailable: lock timeout".into());
        let why = p.readiness(t0 + Duration::from_secs(1)).unwrap_err();
        assert!(
            why.to_string().contains("failed 1s ago") && why.to_string().contains("lock timeout"),
            "{why}"
        );
        // A failure long ago with nothing since: ready again (the next request will tell).
        assert_eq!(p.readiness(t0 + Duration::from_secs(6)), Ok(()));
        p.failed(t0, "x".into());
        p.committed(t0 + Duration::from_millis(10));
        assert_eq!(p.readiness(t0 + Duration::from_secs(1)), Ok(()));

        let waiting: Vec<_> = (0..3).map(|_| p.wait(t0)).collect();
        let why = p.readiness(t0).unwrap_err();
        assert!(why.to_string().contains("ready_max_queue = 2"), "{why}");
        drop(waiting);
        assert_eq!(p.pending(), 0);
        // An idle server whose last commit is old is ready; a new waiter is not stalled yet.
        let _w = p.wait(t0 + Duration::from_secs(100));
        assert_eq!(p.readiness(t0 + Duration::from_secs(101)), Ok(()));
        assert!(p.readiness(t0 + Duration::from_secs(106)).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_concurrent_commits_form_one_valid_chain() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::connect(&url, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        let (on_batch, sizes) = recorder();
        let w = LedgerWriter::spawn(store.clone(), &cfg(64, 1024), on_batch);

        let handles: Vec<_> = (0..200)
            .map(|i| {
                let w = w.clone();
                tokio::spawn(async move { (i, w.commit(cert(i)).await) })
            })
            .collect();
        let mut by_seq = std::collections::BTreeMap::new();
        for h in handles {
            let (i, r) = h.await.unwrap();
            assert!(
                by_seq.insert(r.unwrap(), i).is_none(),
                "seq handed out twice"
            );
        }
        assert_eq!(
            by_seq.keys().copied().collect::<Vec<_>>(),
            (1..=200).collect::<Vec<u64>>()
        );

        let rows = store.list_certificates(0, 1000, None).await.unwrap();
        assert_eq!(rows.len(), 200);
        let mut v = Verifier::default();
        for r in &rows {
            // Each waiter got the seq of its own certificate.
            assert_eq!(r.entry.serial, cert(by_seq[&r.entry.seq]).serial);
            v.push(&r.entry, &r.prev_hash, &r.hash).unwrap();
        }
        let head = store.ledger_head().await.unwrap();
        assert_eq!(v.finish(head.seq, &head.hash), Ok(200));

        let sizes = sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 200);
        assert!(
            sizes.iter().any(|&n| n > 1),
            "no group commit happened: {sizes:?}"
        );
        // Sanity: the hash really is the chain function over the stored entry.
        let e: &LedgerEntry = &rows[0].entry;
        assert_eq!(chain_hash(&GENESIS, e), rows[0].hash);
    }

    /// Prints end-to-end group-commit throughput on PostgreSQL: `clients` tasks each commit
    /// certificates one at a time through one writer. Run with:
    /// `cargo test -p signet-server --lib ledger::tests::postgres_group_commit_throughput -- --ignored --nocapture`
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "benchmark: prints figures"]
    async fn postgres_group_commit_throughput() {
        let Some(url) = signet_testutil::fresh_postgres_database().await else {
            return;
        };
        let store: Arc<dyn Store> = Arc::new(
            crate::store::PgStore::connect(&url, Duration::from_secs(10))
                .await
                .unwrap(),
        );
        let (on_batch, sizes) = recorder();
        let w = LedgerWriter::spawn(store.clone(), &LedgerConfig::default(), on_batch);
        let (clients, per_client) = (1000usize, 30usize);
        let started = crate::clock::monotonic().into_std();
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let w = w.clone();
                tokio::spawn(async move {
                    for k in 0..per_client {
                        w.commit(cert(c * per_client + k)).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let secs = started.elapsed().as_secs_f64();
        let n = clients * per_client;
        let sizes = sizes.lock().unwrap().clone();
        println!(
            "group commit: {n} commits from {clients} concurrent clients in {secs:.2}s = {:.0}/s; \
             {} batches, mean {:.0}, max {}",
            n as f64 / secs,
            sizes.len(),
            n as f64 / sizes.len() as f64,
            sizes.iter().max().unwrap()
        );
        assert_eq!(store.count_certificates().await.unwrap(), n as u64);
    }
}
