//! Every task the server spawns, under one shutdown: a [`JoinSet`] and one stop signal.
//!
//! Two kinds of task: a *listener* serves until told to stop and then drains (it watches the
//! stop signal itself, as tonic's `serve_with_incoming_shutdown` does); a *loop* (the rotator's
//! tick, the server certificate's renewal, checkpoints, metrics) runs forever and is dropped at
//! the stop signal. [`Supervisor::run`] waits for the process's shutdown or for the first task
//! to end by itself, whichever comes first; either way it signals stop and awaits every task.
//! A task that ends (or panics) before the stop signal is a fault: it is logged, the others are
//! stopped, and the server ends with that error, so a supervisor (systemd, Kubernetes) restarts
//! a whole server rather than one left running without, say, its rotator.

use std::collections::HashMap;
use std::future::Future;

use anyhow::anyhow;
use tokio::sync::watch;
use tokio::task::{Id, JoinError, JoinSet};

/// The server's tasks and their one stop signal.
pub(super) struct Supervisor {
    set: JoinSet<anyhow::Result<()>>,
    names: HashMap<Id, &'static str>,
    stop: watch::Sender<bool>,
}

impl Supervisor {
    pub(super) fn new() -> Self {
        Self {
            set: JoinSet::new(),
            names: HashMap::new(),
            stop: watch::channel(false).0,
        }
    }

    /// The stop signal, for parts that watch it themselves (streams that must end, the CRL
    /// publisher).
    pub(super) fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Resolves once stop is signalled.
    pub(super) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    /// A listener (or anything that ends by itself once [`Self::stopped`] resolves).
    pub(super) fn spawn_listener<F, E>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<anyhow::Error>,
    {
        let handle = self
            .set
            .spawn(async move { task.await.map_err(Into::into) });
        self.names.insert(handle.id(), name);
    }

    /// A loop that runs until the server stops, when it is dropped.
    pub(super) fn spawn_loop(
        &mut self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let stopped = self.stopped();
        let handle = self.set.spawn(async move {
            tokio::select! {
                () = task => {}
                () = stopped => {}
            }
            Ok(())
        });
        self.names.insert(handle.id(), name);
    }

    /// Runs until `shutdown` resolves or a task ends by itself, then stops every task and awaits
    /// them all. The first fault is the result.
    pub(super) async fn run(mut self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let first = tokio::select! {
            () = shutdown => None,
            Some(ended) = self.set.join_next_with_id() => Some(ended),
        };
        let mut fault = first.and_then(|ended| self.fault(ended, false));
        if let Some(e) = &fault {
            tracing::error!(error = %format!("{e:#}"), "a server task ended unexpectedly; stopping the server");
        }
        let _ = self.stop.send(true);
        while let Some(ended) = self.set.join_next_with_id().await {
            if let Some(e) = self.fault(ended, true) {
                tracing::error!(error = %format!("{e:#}"), "a server task failed while stopping");
                fault.get_or_insert(e);
            }
        }
        fault.map_or(Ok(()), Err)
    }

    /// What a task's end means: nothing when it ended cleanly after the stop signal, else the
    /// fault, named.
    fn fault(
        &mut self,
        ended: Result<(Id, anyhow::Result<()>), JoinError>,
        stopping: bool,
    ) -> Option<anyhow::Error> {
        let (id, result) = match ended {
            Ok((id, result)) => (id, result),
            Err(e) => (e.id(), Err(anyhow!("panicked: {e}"))),
        };
        let name = self.names.remove(&id).unwrap_or("a server task");
        match result {
            Ok(()) if stopping => None,
            Ok(()) => Some(anyhow!("{name} ended before the server was stopped")),
            Err(e) => Some(e.context(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stopping_awaits_every_task_and_a_clean_stop_is_ok() {
        let mut s = Supervisor::new();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<&str>(4);
        let stopped = s.stopped();
        let tx = done_tx.clone();
        s.spawn_listener("listener", async move {
            stopped.await;
            // Draining takes a while: run must wait for it.
            tokio::time::sleep(Duration::from_secs(5)).await;
            tx.send("listener").await.ok();
            Ok::<(), std::io::Error>(())
        });
        s.spawn_loop("loop", std::future::pending());
        drop(done_tx);
        s.run(tokio::time::sleep(Duration::from_secs(1)))
            .await
            .unwrap();
        assert_eq!(done_rx.recv().await, Some("listener"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_ends_by_itself_stops_the_server_with_its_name() {
        let mut s = Supervisor::new();
        let stopped = s.stopped();
        s.spawn_listener("gRPC server", async move {
            stopped.await;
            Ok::<(), std::io::Error>(())
        });
        s.spawn_loop("CA rotator", async {});
        let e = s.run(std::future::pending()).await.unwrap_err();
        assert!(format!("{e:#}").contains("CA rotator"), "{e:#}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_or_panicking_task_is_the_result() {
        let mut s = Supervisor::new();
        s.spawn_listener("HTTP server", async {
            Err::<(), _>(std::io::Error::other("address vanished"))
        });
        let e = s.run(std::future::pending()).await.unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains("HTTP server") && text.contains("address vanished"),
            "{text}"
        );

        let mut s = Supervisor::new();
        s.spawn_loop("metrics publisher", async { panic!("boom") });
        let e = s.run(std::future::pending()).await.unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains("metrics publisher") && text.contains("panicked"),
            "{text}"
        );
    }
}
