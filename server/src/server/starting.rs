//! While the server starts, above all while it waits for its database, `http_listen` and
//! `probe_listen` already answer: `/healthz` 200 (the process is alive, so a liveness probe
//! does not restart a server that only waits for its database) and `/readyz` 503 with what
//! start-up is doing, the database's real error included ([`StartupStatus`]). Every other path
//! is 404 until the server is up. Once the parts are built, [`Starting::finish`] stops these
//! answers and hands the same sockets to the full HTTP server, so the address never stops
//! accepting connections.

use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::listeners::HttpListeners;
use crate::config::Config;

/// What start-up is doing, as `/readyz` says it while the server starts.
#[derive(Debug, Default)]
pub(crate) struct StartupStatus(Mutex<String>);

impl StartupStatus {
    pub(crate) fn set(&self, what: impl Into<String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = what.into();
    }

    fn get(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The start-up answers being served; [`Starting::finish`] ends them.
pub(super) struct Starting {
    listeners: HttpListeners,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

/// Serves the start-up answers on (a second descriptor of) each HTTP listener, within the
/// listener's usual bounds.
pub(super) fn serve(
    cfg: &Config,
    listeners: HttpListeners,
    status: Arc<StartupStatus>,
) -> std::io::Result<Starting> {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(status);
    let (stop, stopped) = watch::channel(false);
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let (http, http_copy) = twin(listeners.http)?;
    let limits = cfg.limits.http_limits();
    let mut tasks = vec![tokio::spawn(signet_runtime::http::serve(
        signet_runtime::http::HttpListener {
            name: "http_listen",
            listener: http_copy,
            limits,
        },
        router.clone(),
        |_| {},
        until_stopped(),
    ))];
    let probes = match listeners.probes {
        Some(l) => {
            let (probes, probes_copy) = twin(l)?;
            tasks.push(tokio::spawn(signet_runtime::http::serve_probes(
                "probe_listen",
                probes_copy,
                router,
                |_| {},
                until_stopped(),
            )));
            Some(probes)
        }
        None => None,
    };
    Ok(Starting {
        listeners: HttpListeners { http, probes },
        stop,
        tasks,
    })
}

impl Starting {
    /// Stops the start-up answers (connections in flight finish) and returns the listeners.
    pub(super) async fn finish(self) -> HttpListeners {
        let _ = self.stop.send(true);
        for t in self.tasks {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "start-up HTTP answers ended"),
                Err(e) => tracing::warn!(error = %e, "start-up HTTP answers ended"),
            }
        }
        self.listeners
    }
}

async fn readyz(State(status): State<Arc<StartupStatus>>) -> (StatusCode, String) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: starting: {}\n", status.get()),
    )
}

/// Two descriptors of one listening socket: one serves the start-up answers and is closed
/// with them, the other stays open for the server, so connections waiting in the backlog are
/// kept for it.
fn twin(l: TcpListener) -> std::io::Result<(TcpListener, TcpListener)> {
    let l = l.into_std()?;
    let copy = l.try_clone()?;
    Ok((TcpListener::from_std(l)?, TcpListener::from_std(copy)?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_answers_while_starting_then_the_socket_is_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config {
            data_dir: dir.path().to_owned(),
            ..Config::default()
        };
        cfg.http_listen = "127.0.0.1:0".parse().unwrap();
        cfg.probe_listen = Some("127.0.0.1:0".parse().unwrap());
        let listeners = HttpListeners::bind(&cfg).await.unwrap();
        let http = listeners.http.local_addr().unwrap();
        let probes = listeners.probes.as_ref().unwrap().local_addr().unwrap();
        let status = Arc::new(StartupStatus::default());
        status.set("waiting for the database: connection refused");
        let starting = serve(&cfg, listeners, status.clone()).unwrap();
        for addr in [http, probes] {
            let (code, body) = get_path(addr, "/healthz").await;
            assert_eq!((code, body.as_str()), (200, "ok\n"));
            let (code, body) = get_path(addr, "/readyz").await;
            assert_eq!(code, 503);
            assert_eq!(
                body,
                "not ready: starting: waiting for the database: connection refused\n"
            );
        }
        assert_eq!(get_path(http, "/metrics").await.0, 404);
        status.set("opening the CA keys");
        assert!(
            get_path(http, "/readyz")
                .await
                .1
                .contains("opening the CA keys")
        );

        // Handed over: the same address, now answered by whoever serves the listener.
        let back = starting.finish().await;
        assert_eq!(back.http.local_addr().unwrap(), http);
        let served = tokio::spawn(async move {
            let (tcp, _) = back.http.accept().await.unwrap();
            drop(tcp);
        });
        let _ = tokio::net::TcpStream::connect(http).await.unwrap();
        served.await.unwrap();
    }

    /// A minimal HTTP/1.1 GET: status and body.
    async fn get_path(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let code = out[9..12].parse().unwrap();
        let body = out
            .split_once("\r\n\r\n")
            .map(|x| x.1.to_owned())
            .unwrap_or_default();
        (code, body)
    }
}
