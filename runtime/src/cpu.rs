//! CPU-bound work off the async runtime: a fixed set of threads and a bounded queue.
//!
//! A tokio worker that spends a quarter of a millisecond verifying and signing inside one poll
//! holds up every other task queued behind it, and it looks at the I/O driver only between
//! polls: under load, a socket that became readable waits for milliseconds before anyone
//! notices (the database's commit reply, a TLS record). [`CpuPool::run`] hands such work to
//! one of a few dedicated threads (one per core by default) and awaits the result, so the
//! async workers only ever run short polls and answer I/O promptly, while the operating
//! system's scheduler shares the cores between the two kinds of thread.
//!
//! Bounded everywhere: `threads` jobs run at once, at most `queue` wait, and a full queue is
//! refused at once ([`CpuError::Busy`]), never waited for. A job whose caller has gone away
//! (the request was cancelled) is skipped without running. A job that panics is reported to
//! its caller ([`CpuError::Panicked`]) and its thread goes on serving.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Why [`CpuPool::run`] returned no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CpuError {
    /// The queue is full: shed the request (retryable).
    #[error("the CPU work queue is full ({0} jobs waiting)")]
    Busy(usize),
    /// The pool's threads are gone.
    #[error("the CPU work pool has stopped")]
    Closed,
    /// The job panicked (a bug; its thread keeps serving).
    #[error("the CPU job panicked")]
    Panicked,
}

/// A handle to the pool; cheap to clone. The threads stop when the last handle is dropped.
#[derive(Clone)]
pub struct CpuPool {
    jobs: SyncSender<Job>,
    queue: usize,
}

impl std::fmt::Debug for CpuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPool")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl CpuPool {
    /// Starts `threads` threads named `{name}-{i}` (at least one) sharing a queue of at most
    /// `queue` waiting jobs.
    pub fn new(name: &str, threads: usize, queue: usize) -> std::io::Result<CpuPool> {
        let (jobs, rx) = sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || serve(&rx))?;
        }
        Ok(CpuPool { jobs, queue })
    }

    /// [`CpuPool::new`] with one thread per core of this machine.
    pub fn per_core(name: &str, queue: usize) -> std::io::Result<CpuPool> {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        CpuPool::new(name, cores, queue)
    }

    /// Runs `f` on one of the pool's threads, inside the caller's tracing span, and returns
    /// its result. Never waits for queue space.
    pub async fn run<T, F>(&self, f: F) -> Result<T, CpuError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let span = tracing::Span::current();
        let job: Job = Box::new(move || {
            // Its caller went away: nobody would read the answer.
            if tx.is_closed() {
                return;
            }
            let _ = tx.send(span.in_scope(f));
        });
        self.jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => CpuError::Busy(self.queue),
            TrySendError::Disconnected(_) => CpuError::Closed,
        })?;
        // A dropped sender without an answer: the job panicked.
        rx.await.map_err(|_| CpuError::Panicked)
    }
}

/// One thread's loop: take the next job, run it, survive its panic; end when every handle is
/// gone.
fn serve(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        // The job's oneshot sender is dropped by the unwinding, which tells its caller.
        let _ = catch_unwind(AssertUnwindSafe(job));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier, mpsc};

    use super::*;

    /// A pool of one thread, busy with a job that waits at the returned barrier (after telling
    /// the returned receiver it started), and that job's task.
    fn held(pool: &CpuPool) -> (Arc<Barrier>, tokio::task::JoinHandle<Result<(), CpuError>>) {
        let (started, is_started) = mpsc::channel();
        let gate = Arc::new(Barrier::new(2));
        let g = gate.clone();
        let pool = pool.clone();
        let task = tokio::spawn(async move {
            pool.run(move || {
                started.send(()).unwrap();
                g.wait();
            })
            .await
        });
        is_started.recv().unwrap();
        (gate, task)
    }

    #[tokio::test]
    async fn runs_on_its_own_threads_and_returns_the_result() {
        let pool = CpuPool::new("test-cpu", 2, 8).unwrap();
        let (v, there) = pool
            .run(|| (6 * 7, std::thread::current().name().map(str::to_owned)))
            .await
            .unwrap();
        assert_eq!(v, 42);
        assert!(there.unwrap().starts_with("test-cpu-"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_is_refused_at_once_and_never_waited_for() {
        // One thread, held; one job waits in the queue (its first poll queued it); the next is
        // refused without waiting.
        let pool = CpuPool::new("test-busy", 1, 1).unwrap();
        let (gate, first) = held(&pool);
        let mut queued = Box::pin(pool.run(|| 1));
        assert!(poll_once(queued.as_mut()).await.is_none());
        assert_eq!(pool.run(|| 2).await, Err(CpuError::Busy(1)));
        gate.wait();
        first.await.unwrap().unwrap();
        assert_eq!(queued.await, Ok(1));
    }

    #[tokio::test]
    async fn a_panicking_job_is_reported_and_its_thread_keeps_serving() {
        let pool = CpuPool::new("test-panic", 1, 4).unwrap();
        let r: Result<(), _> = pool.run(|| panic!("a bug")).await;
        assert_eq!(r, Err(CpuError::Panicked));
        assert_eq!(pool.run(|| 3).await, Ok(3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_whose_caller_went_away_is_not_run() {
        let pool = CpuPool::new("test-cancel", 1, 4).unwrap();
        let (gate, first) = held(&pool);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        // Queued behind the held job, then its caller goes away.
        let mut cancelled = Box::pin(pool.run(move || r.fetch_add(1, Ordering::SeqCst)));
        assert!(poll_once(cancelled.as_mut()).await.is_none());
        drop(cancelled);
        gate.wait();
        first.await.unwrap().unwrap();
        // Jobs are taken in order: once this one has run, the cancelled one was skipped.
        assert_eq!(pool.run(|| 5).await, Ok(5));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    /// Polls `f` once: `Some` if it finished.
    async fn poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
