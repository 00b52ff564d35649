//! A writing transaction, and the line SQLite's writers wait in for their turn.
//!
//! Every backend opens its writing transactions through `begin_write` (the shared queries
//! call it), which returns a [`WriteTx`]; a write of one statement goes through it too, so no
//! writer bypasses SQLite's line.
//!
//! - PostgreSQL: a plain `BEGIN`; writers wait for each other on row locks, in the order they
//!   asked (bounded by `lock_timeout`).
//! - SQLite has one write lock for the whole database, and a writer that finds it taken polls:
//!   the busy handler sleeps 1, 2, 5 … 100 ms between tries, whoever tries first after a commit
//!   wins, and each waiter gives up when `sqlite_busy_timeout` runs out. Under a few long
//!   writers (batch entry creations of 1,000 rows) next to the ledger's stream of short ones,
//!   that is unfair (an early waiter can lose every race) and wasteful (the lock sits free
//!   while the waiters sleep). So this process's writers first take their turn from a
//!   [`WriteGate`], a first-come-first-served queue, and only then `BEGIN IMMEDIATE`: inside the
//!   process they queue in order and the next one starts the moment the previous one ends;
//!   SQLite's busy handler is left to arbitrate with other processes only. A writer waits at
//!   most `sqlite_busy_timeout` for its turn, then answers Unavailable (retryable) having
//!   changed nothing.
//!
//! The line needs no length limit of its own: who can stand in it is bounded upstream.
//! Issuance reaches the store through the ledger writer (one writer behind a bounded queue,
//! `ledger.queue_depth`); the network's other writes are requests the listener admitted under
//! `limits.max_concurrent_requests`; the rest come from the owner-only admin socket and the
//! server's own periodic tasks. Each waits at most the wait above.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};

use super::error::StoreError;

/// A transaction opened to write, holding its writer's turn (SQLite) until it ends. It derefs
/// to the connection, so `&mut *tx` is an executor, as with `sqlx::Transaction`.
pub(super) struct WriteTx<'c, DB: sqlx::Database> {
    tx: sqlx::Transaction<'c, DB>,
    /// Released after `tx` (fields drop in declaration order), so an abandoned transaction's
    /// rollback is queued on its connection before the next writer is let in.
    _turn: Option<OwnedMutexGuard<()>>,
}

impl<'c, DB: sqlx::Database> WriteTx<'c, DB> {
    /// A transaction already begun, with the writer's turn if it took one.
    pub(super) fn new(tx: sqlx::Transaction<'c, DB>, turn: Option<OwnedMutexGuard<()>>) -> Self {
        Self { tx, _turn: turn }
    }

    pub(super) async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }

    pub(super) async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }
}

impl<DB: sqlx::Database> Deref for WriteTx<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.tx
    }
}

impl<DB: sqlx::Database> DerefMut for WriteTx<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }
}

/// This process's writers of one SQLite database, in line: see the module documentation.
/// Clones share the line.
#[derive(Debug, Clone)]
pub(super) struct WriteGate {
    line: Arc<Mutex<()>>,
    wait: Duration,
}

impl WriteGate {
    /// A line whose writers wait at most `wait` for their turn.
    pub(super) fn new(wait: Duration) -> Self {
        Self {
            line: Arc::new(Mutex::new(())),
            wait,
        }
    }

    /// Waits for this writer's turn (tokio's mutex hands it over in arrival order), at most
    /// the gate's wait; past it, Unavailable.
    pub(super) async fn turn(&self) -> Result<OwnedMutexGuard<()>, StoreError> {
        tokio::time::timeout(self.wait, Arc::clone(&self.line).lock_owned())
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "the database is busy: waited {} for a turn to write (database.sqlite_busy_timeout)",
                    humantime::format_duration(self.wait)
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::WriteGate;
    use crate::store::StoreError;

    #[tokio::test(start_paused = true)]
    async fn writers_get_their_turns_in_arrival_order() {
        let gate = WriteGate::new(Duration::from_secs(2));
        let first = gate.turn().await.unwrap();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..5 {
            let (gate, order) = (gate.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = gate.turn().await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }));
            // Each waiter is in line before the next one is spawned.
            tokio::task::yield_now().await;
        }
        drop(first);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_past_the_wait_is_refused_retryably_and_the_line_moves_on() {
        let gate = WriteGate::new(Duration::from_secs(2));
        let held = gate.turn().await.unwrap();
        let started = crate::clock::monotonic();
        let err = gate.turn().await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m.contains("sqlite_busy_timeout")),
            "{err:?}"
        );
        drop(held);
        // The refused writer left the line: the next one gets its turn at once.
        let _next = gate.turn().await.unwrap();
    }
}
