//! The socket and the accept loop: bind without a window in which the socket has the wrong
//! mode, admit connections within the caps, back off when accept fails.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};
use tokio::net::UnixListener;

use super::conn::{AttestedStream, ConnLimiter, Refusal, Timeouts};
use super::metrics::WorkloadMetrics;
use super::{ListenError, WorkloadApi};
use crate::attest::PeerProcess;
use crate::config::WorkloadApiConfig;

/// Binds the socket with mode 0777 (see [`bind_with`]).
pub fn bind(path: &Path) -> Result<UnixListener, ListenError> {
    bind_with(path, 0o777, None)
}

/// Binds the socket: removes a stale socket file (never another kind of file), binds in a
/// private (0700) directory next to `path`, sets `mode` and the group, turns on per-message
/// credentials (`SO_PASSCRED`, inherited by accepted sockets), then renames the socket into
/// place. So no one can connect to it before it has its final mode and group.
pub fn bind_with(path: &Path, mode: u32, gid: Option<u32>) -> Result<UnixListener, ListenError> {
    let err = |e| ListenError::Socket(path.to_owned(), e);
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(err)?,
        Ok(_) => return Err(ListenError::NotASocket(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| err(io::Error::new(io::ErrorKind::InvalidInput, "no file name")))?;
    let private = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(err)?;
    let staged = private.join("s");
    let result = (|| {
        let listener = UnixListener::bind(&staged)?;
        setsockopt(&listener, sockopt::PassCred, &true).map_err(io::Error::from)?;
        if let Some(g) = gid {
            std::os::unix::fs::chown(&staged, None, Some(g))?;
        }
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&staged, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    result.map_err(err)
}

/// What the accept loop and each connection are held to.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub max_connections: usize,
    pub max_connections_per_uid: usize,
    pub timeouts: Timeouts,
    pub max_concurrent_streams: u32,
    pub max_header_list_size: u32,
    pub max_request_bytes: usize,
    pub accept_backoff_max: Duration,
    pub proc_root: std::path::PathBuf,
    /// Envoy SDS on the same socket; `None`: not served.
    pub sds: Option<crate::config::SdsConfig>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self::from(&WorkloadApiConfig::default())
    }
}

impl From<&WorkloadApiConfig> for ServeOptions {
    fn from(c: &WorkloadApiConfig) -> Self {
        Self {
            max_connections: c.max_connections,
            max_connections_per_uid: c.max_connections_per_uid,
            timeouts: Timeouts {
                first_request: c.first_request_timeout,
                idle: c.idle_timeout,
            },
            max_concurrent_streams: c.max_concurrent_streams,
            max_header_list_size: c.max_header_list_size,
            max_request_bytes: c.max_request_bytes,
            accept_backoff_max: c.accept_backoff_max,
            proc_root: c.proc_root.clone(),
            sds: c.sds.enabled.then(|| c.sds.clone()),
        }
    }
}

/// The first pause after a failed accept; it doubles up to `accept_backoff_max`.
const ACCEPT_BACKOFF_START: Duration = Duration::from_millis(10);

/// Serves the Workload API on `listener` with the default limits until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    api: WorkloadApi,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ListenError> {
    serve_with(
        listener,
        api,
        ServeOptions::default(),
        Arc::new(WorkloadMetrics::default()),
        shutdown,
    )
    .await
}

struct Accepting {
    listener: UnixListener,
    opts: ServeOptions,
    limiter: Arc<ConnLimiter>,
    metrics: Arc<WorkloadMetrics>,
    /// Failed accepts in a row: the pause is `signet_runtime::backoff::ceiling` of it.
    accept_failures: u32,
    /// Failed accepts / refused connections since the last log line about them.
    failed_unlogged: u64,
    refused_unlogged: u64,
    /// No new warning about either before this (one line per burst, at most every 10 s).
    quiet_failed_until: Option<tokio::time::Instant>,
    quiet_refused_until: Option<tokio::time::Instant>,
}

/// At most one warning per this long about accept failures, and one about refusals.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether to log now; arms the next quiet period.
fn log_due(quiet_until: &mut Option<tokio::time::Instant>) -> bool {
    let now = signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock);
    if quiet_until.is_some_and(|q| now < q) {
        return false;
    }
    *quiet_until = Some(now + LOG_EVERY);
    true
}

impl Accepting {
    /// The next admitted connection. Never fails: accept errors are counted, logged once
    /// per burst and waited out with backoff, so a full fd table cannot spin the CPU.
    async fn next(&mut self) -> AttestedStream {
        loop {
            let stream = match self.listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    self.metrics.accept_errors.inc();
                    self.failed_unlogged += 1;
                    if log_due(&mut self.quiet_failed_until) {
                        tracing::warn!(
                            error = %e,
                            failed = self.failed_unlogged,
                            "Workload API: accept failing; backing off (logged at most every 10s)"
                        );
                        self.failed_unlogged = 0;
                    }
                    let pause = signet_runtime::backoff::ceiling(
                        self.accept_failures,
                        ACCEPT_BACKOFF_START,
                        self.opts.accept_backoff_max,
                    );
                    self.accept_failures = self.accept_failures.saturating_add(1);
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            self.accept_failures = 0;
            let process = match PeerProcess::from_socket(&stream, &self.opts.proc_root) {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!(error = %e, "Workload API: no peer credentials; closed");
                    continue;
                }
            };
            let permit = match self.limiter.try_acquire(process.uid) {
                Ok(p) => p,
                Err(why) => {
                    match why {
                        Refusal::Total => self.metrics.refused_total_cap.inc(),
                        Refusal::PerUid => self.metrics.refused_uid_cap.inc(),
                    };
                    self.refused_unlogged += 1;
                    if log_due(&mut self.quiet_refused_until) {
                        tracing::warn!(
                            uid = process.uid,
                            pid = ?process.pid,
                            reason = ?why,
                            refused = self.refused_unlogged,
                            max_connections = self.opts.max_connections,
                            max_connections_per_uid = self.opts.max_connections_per_uid,
                            "Workload API: connection cap reached; closing new connections \
                             (logged at most every 10s)"
                        );
                        self.refused_unlogged = 0;
                    }
                    continue;
                }
            };
            // Inherited from the listener; set again in case a kernel does not.
            if let Err(e) = setsockopt(&stream, sockopt::PassCred, &true) {
                tracing::warn!(error = %e, "Workload API: SO_PASSCRED failed; closed");
                continue;
            }
            return AttestedStream::new(
                stream,
                process,
                permit,
                self.opts.timeouts,
                self.metrics.clone(),
            );
        }
    }
}

/// Serves the Workload API on `listener` until `shutdown` resolves, within `opts`.
pub async fn serve_with(
    listener: UnixListener,
    api: WorkloadApi,
    opts: ServeOptions,
    metrics: Arc<WorkloadMetrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ListenError> {
    let limiter = ConnLimiter::new(
        opts.max_connections,
        opts.max_connections_per_uid,
        metrics.connections.clone(),
    );
    let accepting = Accepting {
        listener,
        limiter: limiter.clone(),
        metrics: metrics.clone(),
        accept_failures: 0,
        failed_unlogged: 0,
        refused_unlogged: 0,
        quiet_failed_until: None,
        quiet_refused_until: None,
        opts: opts.clone(),
    };
    let incoming = futures::stream::unfold(accepting, |mut a| async move {
        let s = a.next().await;
        Some((Ok::<_, io::Error>(s), a))
    });
    let api = api.with_metrics(metrics);
    let sds = opts.sds.as_ref().map(|c| {
        super::sds::Sds::new(api.clone(), c)
            .into_server()
            .max_decoding_message_size(opts.max_request_bytes)
    });
    let workload = api
        .into_server()
        .max_decoding_message_size(opts.max_request_bytes);
    let mut served = vec![service_name(&workload)];
    served.extend(sds.as_ref().map(service_name));
    let (reflection, reflection_alpha) = match reflection(&served) {
        Ok((v1, v1alpha)) => (Some(v1), Some(v1alpha)),
        Err(e) => {
            tracing::error!(error = %e, "Workload API: serving without gRPC reflection");
            (None, None)
        }
    };
    tonic::transport::Server::builder()
        .max_concurrent_streams(opts.max_concurrent_streams)
        .http2_max_header_list_size(opts.max_header_list_size)
        .add_service(workload)
        .add_optional_service(sds)
        .add_optional_service(reflection)
        .add_optional_service(reflection_alpha)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(ListenError::Serve)
}

/// The gRPC name of a generated server (`SpiffeWorkloadAPI`).
fn service_name<S: tonic::server::NamedService>(_: &S) -> &'static str {
    S::NAME
}

/// gRPC reflection on the socket, as the SPIFFE Workload Endpoint standard recommends, in
/// both versions (grpcurl and many tools still speak only v1alpha): it lists and describes
/// exactly `services` (the Workload API, and SDS when served) and itself.
///
/// Reflection calls need no `workload.spiffe.io` header: the standard asks it of Workload API
/// calls, and SPIRE's agent checks it only for `/SpiffeWorkloadAPI/` methods, so tools that
/// do not send it (grpcurl, grpcui) can list and describe. Reflection reveals only the
/// published protocol definitions; it returns no identity, and its connections are held to
/// the same caps and timeouts as every other on the socket.
fn reflection(
    services: &[&'static str],
) -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    Box<dyn std::error::Error + Send + Sync>,
> {
    let descriptors = signet_proto::descriptors_for(services)?;
    let builder = || {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_file_descriptor_set(descriptors.clone())
            .with_service_name("grpc.reflection.v1.ServerReflection")
            .with_service_name("grpc.reflection.v1alpha.ServerReflection");
        for s in services {
            b = b.with_service_name(*s);
        }
        b
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// The gid of a `socket_group` value: a number, or a name in `group_file` (`/etc/group`).
pub fn resolve_group(value: &str, group_file: &Path) -> Result<u32, ListenError> {
    if let Ok(gid) = value.parse() {
        return Ok(gid);
    }
    let text = std::fs::read_to_string(group_file).map_err(|source| ListenError::GroupFile {
        value: value.to_owned(),
        path: group_file.to_owned(),
        source,
    })?;
    crate::attest::uid_of(&text, value).ok_or_else(|| ListenError::NoSuchGroup {
        value: value.to_owned(),
        path: group_file.to_owned(),
    })
}

/// Makes room in the fd table for `max_connections`: raises the soft RLIMIT_NOFILE towards
/// the hard limit when needed, and warns when even that is too low (accept then fails with
/// EMFILE, which the accept loop survives with backoff).
pub fn ensure_fd_headroom(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    // Each connection holds its socket and the peer's pidfd.
    const SPARE: u64 = 256;
    let want = 2 * max_connections as u64 + SPARE;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= want {
        return;
    }
    let new = want.min(hard);
    if new > soft && setrlimit(Resource::RLIMIT_NOFILE, new, hard).is_ok() && new >= want {
        return;
    }
    tracing::warn!(
        soft = soft.max(new),
        hard,
        max_connections,
        "RLIMIT_NOFILE is lower than workload_api.max_connections needs; accept will fail \
         (and back off) before the cap is reached"
    );
}
