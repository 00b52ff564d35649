//! Sinks off the renewal path: one worker task per sink, fed through a latest-wins inbox.
//!
//! The rotator only ever *hands over* what a sink should hold now ([`SinkSet::update`], which
//! never waits); the sink's own task applies it with a deadline (the sink's `timeout`, which
//! covers the files, the reload and the API calls), retries a failure with capped, jittered
//! backoff, and skips straight to the newest SVID when a newer one arrives meanwhile. So a
//! sink that hangs (a reload command that never returns, an API server that never answers, a
//! hung filesystem) delays nothing but itself: not node renewal, not entry sync, not another
//! sink, not the Workload API. Its state is kept in [`crate::sinks::health::SinkHealth`] (shown
//! on `/readyz`), in the `signet_agent_sink_*` metrics (both through [`Telemetry`]) and in the
//! logs.
//!
//! Memory: at most [`DELIVERY_SLOTS`] deliveries or removals are under way at once (each
//! builds its PEM files in memory), so a burst of 1,000 new certificates does not hold 1,000
//! sets of files at once and leave the heap fragmented by them. A slot is lent for at most
//! [`SLOT_LEASE`]: a delivery still running then goes on without it, so a hung sink holds the
//! others back by at most that, once. What a worker holds between deliveries is the
//! [`Delivered`] it was handed, whose SVID, bundle and CRLs are shared with the rotator.
//!
//! An idle worker is small, since an agent may run a thousand of them: its task waits on a
//! [`Inbox`] (the newest job and a `Notify`), what all workers share (the slots, the clock,
//! where they report) is one [`Shared`], and the delivery itself, with its deadline and slot
//! lease, is a future of its own, allocated only while it runs.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use crate::config::DeletionPolicy;
use crate::sinks::{Applied, Delivered, Sink, SinkError};

pub use crate::sinks::telemetry::Telemetry;
use signet_runtime::backoff::Backoff;
use signet_runtime::clock::Clock;
use signet_runtime::random::Random;
use signet_types::SpiffeId;

pub const RETRY_BASE: Duration = Duration::from_secs(1);
pub const RETRY_CAP: Duration = Duration::from_secs(300);
/// How a failed delivery is retried: capped exponential, full jitter.
pub const RETRY: Backoff = Backoff::full(RETRY_BASE, RETRY_CAP);
/// Deliveries and removals under way at once, across all sinks (the blocking pool that does
/// their file I/O has 8 threads).
pub const DELIVERY_SLOTS: usize = 16;
/// The longest a delivery keeps its slot; after that it goes on without one.
pub const SLOT_LEASE: Duration = Duration::from_secs(1);

/// A sink bound to the SPIFFE ID whose certificate it receives.
pub struct SinkBinding {
    pub spiffe_id: SpiffeId,
    pub deletion_policy: DeletionPolicy,
    /// Deadline of one delivery or removal.
    pub timeout: Duration,
    pub sink: Arc<dyn Sink>,
}

/// What a sink should hold.
#[derive(Clone)]
enum Desired {
    /// Nothing to do (not delivered yet, or retained after the identity went away).
    Nothing,
    Deliver(Arc<Delivered>),
    Remove,
}

#[derive(Clone)]
struct Job {
    seq: u64,
    desired: Desired,
}

/// A worker's inbox: the newest job only (latest wins), and a wake-up for its task. One
/// task waits on it; a job handed over while the task is busy is found when it looks again
/// (`Notify` keeps the wake-up until then).
struct Inbox {
    job: Mutex<Job>,
    changed: Notify,
}

impl Inbox {
    fn new() -> Self {
        Self {
            job: Mutex::new(Job {
                seq: 0,
                desired: Desired::Nothing,
            }),
            changed: Notify::new(),
        }
    }

    /// Replaces the job and wakes the task.
    fn put(&self, job: Job) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = job;
        self.changed.notify_one();
    }

    /// The newest job's number.
    fn seq(&self) -> u64 {
        self.job.lock().unwrap_or_else(PoisonError::into_inner).seq
    }

    /// The newest job.
    fn get(&self) -> Job {
        self.job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What every worker of a [`SinkSet`] shares.
struct Shared {
    /// The delivery slots ([`DELIVERY_SLOTS`]).
    slots: Semaphore,
    telemetry: Telemetry,
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
}

/// What was last handed to a worker, to hand over only changes.
enum Sent {
    Nothing,
    /// The same allocation the worker's job holds.
    Delivered(Arc<Delivered>),
    Removed,
}

impl Sent {
    /// Whether `d` is what was handed over: the whole [`Delivered`] (see its equality), so a
    /// change of any part a sink writes, the CRLs alone included, is a delivery.
    fn is(&self, d: &Delivered) -> bool {
        match self {
            Sent::Delivered(s) => **s == *d,
            Sent::Nothing | Sent::Removed => false,
        }
    }
}

struct Worker {
    spiffe_id: SpiffeId,
    deletion_policy: DeletionPolicy,
    inbox: Arc<Inbox>,
    sent: Sent,
    seq: u64,
    task: tokio::task::JoinHandle<()>,
}

/// The workers of all sinks. Dropping it stops them (a running reload command is killed).
pub struct SinkSet {
    workers: Vec<Worker>,
}

impl SinkSet {
    /// Starts one worker task per binding. Needs a Tokio runtime.
    pub fn start(
        bindings: Vec<SinkBinding>,
        telemetry: Telemetry,
        clock: Arc<dyn Clock>,
        random: Arc<dyn Random>,
    ) -> Self {
        let shared = Arc::new(Shared {
            slots: Semaphore::new(DELIVERY_SLOTS),
            telemetry,
            clock,
            random,
        });
        let workers = bindings
            .into_iter()
            .map(|b| {
                shared.telemetry.register(b.sink.name(), shared.clock.now());
                let inbox = Arc::new(Inbox::new());
                let task = tokio::spawn(run(b.sink, b.timeout, inbox.clone(), shared.clone()));
                Worker {
                    spiffe_id: b.spiffe_id,
                    deletion_policy: b.deletion_policy,
                    inbox,
                    sent: Sent::Nothing,
                    seq: 0,
                    task,
                }
            })
            .collect();
        Self { workers }
    }

    /// Hands each sink what it should hold now: the SVID `current` returns for its SPIFFE ID
    /// (with the bundle), or, when there is none, removal per its deletion policy. Only
    /// changes are handed over; never waits for a sink.
    pub fn update(&mut self, current: impl Fn(&SpiffeId) -> Option<Delivered>) {
        for w in &mut self.workers {
            let (sent, desired) = match current(&w.spiffe_id) {
                Some(d) if w.sent.is(&d) => continue,
                Some(d) => {
                    let d = Arc::new(d);
                    (Sent::Delivered(d.clone()), Desired::Deliver(d))
                }
                None => match (&w.sent, w.deletion_policy) {
                    (Sent::Delivered(_), DeletionPolicy::Delete) => {
                        (Sent::Removed, Desired::Remove)
                    }
                    (Sent::Delivered(_), DeletionPolicy::Retain) => {
                        (Sent::Nothing, Desired::Nothing)
                    }
                    (Sent::Nothing | Sent::Removed, _) => continue,
                },
            };
            w.seq += 1;
            w.sent = sent;
            w.inbox.put(Job {
                seq: w.seq,
                desired,
            });
        }
    }
}

impl Drop for SinkSet {
    fn drop(&mut self) {
        for w in &self.workers {
            w.task.abort();
        }
    }
}

/// Applies the newest job of `inbox`, with a deadline, in one of the shared delivery slots;
/// retries failures with backoff. Runs until aborted (dropping the [`SinkSet`]).
///
/// What this future keeps while it waits is small (an idle agent holds one per sink): the
/// delivery and the retry wait are boxed, allocated only while they run.
async fn run(sink: Arc<dyn Sink>, timeout: Duration, inbox: Arc<Inbox>, shared: Arc<Shared>) {
    let mut applied_seq = 0u64;
    let mut failures = 0u32;
    loop {
        let job = inbox.get();
        if job.seq == applied_seq {
            inbox.changed.notified().await;
            continue;
        }
        let name = sink.name();
        let now = || shared.clock.now();
        let result = match &job.desired {
            Desired::Nothing => {
                applied_seq = job.seq;
                failures = 0;
                shared.telemetry.idle(name, now());
                continue;
            }
            Desired::Deliver(d) => {
                Box::pin(apply(&*sink, "delivery", sink.deliver(d), timeout, &shared)).await
            }
            Desired::Remove => {
                Box::pin(apply(&*sink, "removal", sink.remove(), timeout, &shared)).await
            }
        };
        match result {
            Ok((what, applied)) => {
                applied_seq = job.seq;
                failures = 0;
                shared.telemetry.succeeded(name, what, &applied, now());
            }
            Err((what, e)) => {
                let wait = RETRY.delay(failures, shared.random.unit());
                failures = failures.saturating_add(1);
                shared
                    .telemetry
                    .failed(name, what, &e, failures, wait, now());
                // Until the wait is over, or a newer job arrives.
                let mut sleep = Box::pin(tokio::time::sleep(wait));
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        _ = inbox.changed.notified() => if inbox.seq() != job.seq { break },
                    }
                }
            }
        }
    }
}

/// One delivery or removal (`what`): waits for a delivery slot, keeps it at most
/// [`SLOT_LEASE`], and gives up after `timeout`.
async fn apply<'a>(
    sink: &dyn Sink,
    what: &'static str,
    op: impl std::future::Future<Output = Result<Applied, SinkError>> + 'a,
    timeout: Duration,
    shared: &Shared,
) -> Result<(&'static str, Applied), (&'static str, SinkError)> {
    let name = sink.name();
    // The semaphore is never closed; were it, the delivery would go on without a slot.
    let mut slot = shared.slots.acquire().await.ok();
    shared.telemetry.busy(name, shared.clock.now());
    let op = tokio::time::timeout(timeout, op);
    tokio::pin!(op);
    let result = tokio::select! {
        r = &mut op => r,
        _ = tokio::time::sleep(SLOT_LEASE) => {
            slot = None;
            op.await
        }
    };
    drop(slot);
    match result {
        Ok(Ok(applied)) => Ok((what, applied)),
        Ok(Err(e)) => Err((what, e)),
        Err(_) => Err((
            what,
            SinkError::timeout(
                name,
                format!("{what} did not finish within {timeout:?}; abandoned"),
            ),
        )),
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
