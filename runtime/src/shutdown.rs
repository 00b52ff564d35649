//! The shutdown signal every binary waits for: SIGTERM (what Kubernetes and systemd send) or
//! ctrl-c. It only says *when*; each binary decides how to stop (drain, flush, exit).

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
