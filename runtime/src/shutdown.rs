//! The shutdown signal every binary waits for: SIGTERM (what Kubernetes and systemd send) or
//! ctrl-c. It only says *when*; each binary decides how to stop (drain, flush, exit). And
//! SIGHUP ([`Hangups`]), which never stops a binary: it asks for a reload.

/// Resolves on the first SIGTERM or ctrl-c, then logs `shutting down`. Where SIGTERM cannot
/// be watched (no signal handler could be installed), it never resolves, as before.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
}

/// SIGHUP, the operator's request to reload. Its default action terminates the process, so
/// each binary calls [`Hangups::watch`] first thing inside its runtime: from then on a SIGHUP
/// never terminates it (tokio keeps its handler for the process's life), and each one is a
/// reload.
#[derive(Debug)]
pub struct Hangups(Option<tokio::signal::unix::Signal>);

impl Hangups {
    /// Installs the handler; must run inside a tokio runtime. Where it cannot be installed
    /// (no signal driver), [`Self::recv`] never resolves and SIGHUP keeps its default action,
    /// which is logged.
    pub fn watch() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(s) => Self(Some(s)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGHUP: it will terminate the process");
                Self(None)
            }
        }
    }

    /// Resolves at the next SIGHUP (several sent while a reload ran count as one).
    pub async fn recv(&mut self) {
        match &mut self.0 {
            Some(s) => {
                if s.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}
