//! One Workload API connection: who is on the other end, whether every byte comes from that
//! process, how many connections a uid holds, and when an unused connection is closed.
//!
//! **Per-message credentials.** The listening socket has `SO_PASSCRED`, which accepted
//! sockets inherit before the kernel hands them over, so every chunk the agent reads comes
//! with the pid of the process that wrote it (`SCM_CREDENTIALS`), and the kernel never glues
//! bytes of two writers into one read. A chunk written by any process other than the one that
//! connected (a child that inherited the socket across `fork`, a process it was passed to)
//! closes the connection before h2 sees a byte of it. This is what defeats the
//! connect-fork-exec attack: the parent connects and execs an allowed binary, the child asks.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::task::AtomicWaker;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixCredentials, recvmsg};
use prometheus_client::metrics::gauge::Gauge;
use signet_runtime::clock::{Clock, SystemClock};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::metrics::WorkloadMetrics;
#[cfg(test)]
use crate::attest::Caller;
use crate::attest::PeerProcess;

/// Global and per-uid connection caps.
#[derive(Debug)]
pub struct ConnLimiter {
    max_total: usize,
    max_per_uid: usize,
    counts: Mutex<Counts>,
    /// Open connections, for `/metrics`.
    gauge: Gauge,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_uid: HashMap<u32, usize>,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` are open.
    Total,
    /// This uid holds `max_connections_per_uid`.
    PerUid,
}

impl ConnLimiter {
    pub fn new(max_total: usize, max_per_uid: usize, gauge: Gauge) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_uid,
            counts: Mutex::new(Counts::default()),
            gauge,
        })
    }

    /// A slot for one connection of `uid`, given back when the permit drops.
    pub fn try_acquire(self: &Arc<Self>, uid: u32) -> Result<ConnPermit, Refusal> {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if c.total >= self.max_total {
            return Err(Refusal::Total);
        }
        let mine = c.per_uid.entry(uid).or_default();
        if *mine >= self.max_per_uid {
            return Err(Refusal::PerUid);
        }
        *mine += 1;
        c.total += 1;
        self.gauge.set(i64::try_from(c.total).unwrap_or(i64::MAX));
        Ok(ConnPermit {
            limiter: self.clone(),
            uid,
        })
    }

    /// Open connections (all uids).
    pub fn open(&self) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

/// One admitted connection's slot.
#[derive(Debug)]
pub struct ConnPermit {
    limiter: Arc<ConnLimiter>,
    uid: u32,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut c = self
            .limiter
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        self.limiter
            .gauge
            .set(i64::try_from(c.total).unwrap_or(i64::MAX));
        if let Some(n) = c.per_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_uid.remove(&self.uid);
            }
        }
    }
}

/// How long an unused connection may stay open.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// From accept to the first request.
    pub first_request: Duration,
    /// From the end of the last request or stream to the next.
    pub idle: Duration,
}

/// Requests in flight on one connection, and since when it has had none.
#[derive(Debug)]
pub struct Activity {
    active: AtomicUsize,
    /// (since when nothing is in flight, whether a request was ever seen)
    idle: Mutex<(Instant, bool)>,
    reader: AtomicWaker,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            active: AtomicUsize::new(0),
            idle: Mutex::new((SystemClock.monotonic(), false)),
            reader: AtomicWaker::new(),
        })
    }

    /// When the connection must be closed, if nothing starts before: `None` while a request
    /// or stream is open.
    fn deadline(&self, t: &Timeouts) -> Option<Instant> {
        if self.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let (since, seen) = *self.idle.lock().unwrap_or_else(|e| e.into_inner());
        Some(since + if seen { t.idle } else { t.first_request })
    }
}

/// Held while a request or stream is open on the connection.
#[derive(Debug)]
pub struct ActiveGuard(Arc<Activity>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            *self.0.idle.lock().unwrap_or_else(|e| e.into_inner()) =
                (SystemClock.monotonic(), true);
            // The reader re-arms its idle deadline.
            self.0.reader.wake();
        }
    }
}

/// The connection's caller, as every request on it sees it (a request extension).
#[derive(Debug)]
pub struct Peer {
    source: PeerSource,
    activity: Arc<Activity>,
}

#[derive(Debug)]
pub(crate) enum PeerSource {
    /// A process on the other end of the socket, attested at each request.
    Process(PeerProcess),
    /// Unit tests of the API: a fixed caller, no socket.
    #[cfg(test)]
    Fixed(Caller),
}

impl Peer {
    pub(crate) fn source(&self) -> &PeerSource {
        &self.source
    }

    /// The uid the connection was accepted from.
    pub fn uid(&self) -> u32 {
        match &self.source {
            PeerSource::Process(p) => p.uid,
            #[cfg(test)]
            PeerSource::Fixed(c) => c.uid,
        }
    }

    /// Marks a request or stream open until the guard drops.
    pub fn begin_request(&self) -> ActiveGuard {
        self.activity.active.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(self.activity.clone())
    }
}

/// The request extension carrying the connection's [`Peer`].
#[derive(Debug, Clone)]
pub struct PeerInfo(pub Arc<Peer>);

impl PeerInfo {
    /// For unit tests of the API: a peer process without a socket.
    #[cfg(test)]
    pub fn process(process: PeerProcess) -> Self {
        PeerInfo(Arc::new(Peer {
            source: PeerSource::Process(process),
            activity: Activity::new(),
        }))
    }

    /// A fixed caller for unit tests of the API (no socket, nothing re-attested).
    #[cfg(test)]
    pub fn fixed(caller: Caller) -> Self {
        PeerInfo(Arc::new(Peer {
            source: PeerSource::Fixed(caller),
            activity: Activity::new(),
        }))
    }
}

/// An accepted, admitted connection.
pub struct AttestedStream {
    inner: UnixStream,
    peer: Arc<Peer>,
    timeouts: Timeouts,
    deadline: Pin<Box<Sleep>>,
    armed_for: Option<Instant>,
    cmsg: Vec<u8>,
    metrics: Arc<WorkloadMetrics>,
    _permit: ConnPermit,
}

impl AttestedStream {
    pub fn new(
        inner: UnixStream,
        process: PeerProcess,
        permit: ConnPermit,
        timeouts: Timeouts,
        metrics: Arc<WorkloadMetrics>,
    ) -> Self {
        let activity = Activity::new();
        let first = SystemClock.monotonic() + timeouts.first_request;
        Self {
            inner,
            peer: Arc::new(Peer {
                source: PeerSource::Process(process),
                activity,
            }),
            timeouts,
            deadline: Box::pin(tokio::time::sleep_until(first)),
            armed_for: Some(first),
            cmsg: nix::cmsg_space!(UnixCredentials),
            metrics,
            _permit: permit,
        }
    }

    fn peer_pid(&self) -> Option<i32> {
        match &self.peer.source {
            PeerSource::Process(p) => p.pid,
            #[cfg(test)]
            PeerSource::Fixed(c) => c.pid,
        }
    }
}

impl Connected for AttestedStream {
    type ConnectInfo = PeerInfo;
    fn connect_info(&self) -> PeerInfo {
        PeerInfo(self.peer.clone())
    }
}

/// One `recvmsg`: the bytes read and the pid of the process that wrote them (`None`: the
/// kernel attached no credentials). Passed file descriptors are closed and refused.
fn recv_with_creds(fd: RawFd, dst: &mut [u8], cmsg: &mut [u8]) -> io::Result<(usize, Option<i32>)> {
    let mut iov = [io::IoSliceMut::new(dst)];
    let msg = recvmsg::<()>(
        fd,
        &mut iov,
        Some(cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let bytes = msg.bytes;
    // MSG_CTRUNC (nix: ENOBUFS): more ancillary data than credentials, e.g. passed file
    // descriptors, which the kernel then closes. Nothing legitimate sends any.
    let cmsgs = msg.cmsgs().map_err(|_| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "unexpected ancillary data on the Workload API socket",
        )
    })?;
    let mut writer = None;
    for c in cmsgs {
        match c {
            ControlMessageOwned::ScmCredentials(cred) => writer = Some(cred.pid()),
            ControlMessageOwned::ScmRights(fds) => {
                for fd in fds {
                    let _ = nix::unistd::close(fd);
                }
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "file descriptors passed on the Workload API socket",
                ));
            }
            _ => {}
        }
    }
    Ok((bytes, writer))
}

impl AsyncRead for AttestedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // The first-request / idle deadline: closes a connection nobody uses.
        this.peer.activity.reader.register(cx.waker());
        match this.peer.activity.deadline(&this.timeouts) {
            None => this.armed_for = None,
            Some(when) => {
                if this.armed_for != Some(when) {
                    this.deadline.as_mut().reset(when);
                    this.armed_for = Some(when);
                }
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.metrics.timed_out.inc();
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "Workload API connection unused for too long",
                    )));
                }
            }
        }
        let peer_pid = this.peer_pid();
        loop {
            ready!(this.inner.poll_read_ready(cx))?;
            let fd = this.inner.as_raw_fd();
            let dst = buf.initialize_unfilled();
            let cmsg = &mut this.cmsg;
            match this
                .inner
                .try_io(Interest::READABLE, || recv_with_creds(fd, dst, cmsg))
            {
                Ok((n, writer)) => {
                    if n > 0
                        && let Some(pid) = peer_pid
                        && writer != Some(pid)
                    {
                        this.metrics.foreign_writers.inc();
                        // An attacker can repeat this at will: at most one line per 10 s.
                        if warn_foreign_writer_now(SystemClock.monotonic()) {
                            tracing::warn!(
                            peer_pid = pid,
                            writer_pid = ?writer,
                                "Workload API: bytes written by another process than the one \
                                 that connected (an inherited or passed socket); connection \
                                 closed (counted in workload_api_foreign_writers; logged at most \
                                 every 10s)"
                            );
                        }
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            "written by another process than the connected peer",
                        )));
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for AttestedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Whether a foreign-writer warning may be logged at `now` (monotonic): at most one every
/// 10 s, whatever the connection, as an attacker can repeat the write at will.
fn warn_foreign_writer_now(now: Instant) -> bool {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|l| now < l + Duration::from_secs(10)) {
        return false;
    }
    *last = Some(now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_global_and_per_uid() {
        let l = ConnLimiter::new(3, 2, Gauge::default());
        let a1 = l.try_acquire(1).expect("a1");
        let a2 = l.try_acquire(1).expect("a2");
        assert_eq!(l.try_acquire(1).err(), Some(Refusal::PerUid));
        let b1 = l.try_acquire(2).expect("b1");
        assert_eq!(l.try_acquire(3).err(), Some(Refusal::Total));
        assert_eq!(l.open(), 3);
        drop(a1);
        let _a3 = l.try_acquire(1).expect("a slot came back");
        drop((a2, b1));
        assert_eq!(l.open(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_follows_activity() {
        let t = Timeouts {
            first_request: Duration::from_secs(1),
            idle: Duration::from_secs(10),
        };
        let a = Activity::new();
        let start = SystemClock.monotonic();
        assert_eq!(a.deadline(&t), Some(start + t.first_request));
        let peer = Peer {
            source: PeerSource::Fixed(Caller::host(1, 1, None, None)),
            activity: a.clone(),
        };
        let g1 = peer.begin_request();
        let g2 = peer.begin_request();
        assert_eq!(a.deadline(&t), None);
        drop(g1);
        assert_eq!(a.deadline(&t), None, "a stream is still open");
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(g2);
        assert_eq!(a.deadline(&t), Some(start + Duration::from_secs(15)));
    }

    async fn pair() -> (UnixStream, AttestedStream, Arc<WorkloadMetrics>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let listener = super::super::listen::bind_with(&path, 0o700, None).expect("bind");
        let client = UnixStream::connect(&path).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let process =
            PeerProcess::from_socket(&server, std::path::Path::new("/proc")).expect("peer");
        let metrics = Arc::new(WorkloadMetrics::default());
        let s = AttestedStream::new(
            server,
            process,
            ConnLimiter::new(1, 1, Gauge::default())
                .try_acquire(0)
                .expect("slot"),
            Timeouts {
                first_request: Duration::from_millis(200),
                idle: Duration::from_millis(200),
            },
            metrics.clone(),
        );
        (client, s, metrics)
    }

    // Paused time: the deadline passes as soon as nothing else can happen.
    #[tokio::test(start_paused = true)]
    async fn bytes_from_the_peer_pass_and_an_unused_connection_times_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, mut server, metrics) = pair().await;
        client.write_all(b"hello").await.expect("write");
        let mut buf = [0u8; 16];
        let n = server.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"hello");
        let err = server.read(&mut buf).await.expect_err("times out");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(metrics.timed_out.get(), 1);
    }

    #[tokio::test]
    async fn passed_file_descriptors_are_refused() {
        use nix::sys::socket::{ControlMessage, sendmsg};
        use tokio::io::AsyncReadExt;
        let (client, mut server, _) = pair().await;
        let file = std::fs::File::open("/dev/null").expect("file");
        let fds = [file.as_raw_fd()];
        let iov = [io::IoSlice::new(b"x")];
        sendmsg::<()>(
            client.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .expect("sendmsg");
        let mut buf = [0u8; 4];
        let err = server.read(&mut buf).await.expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
    }

    #[tokio::test]
    async fn bytes_written_by_another_process_close_the_connection() {
        use tokio::io::AsyncReadExt;
        let (client, mut server, metrics) = pair().await;
        // A child inherits the connected socket (as after fork) and writes on it.
        let fd: std::os::fd::OwnedFd = client.into_std().expect("std").into();
        let Ok(mut child) = std::process::Command::new("python3")
            .args(["-c", "import os; os.write(0, b'PRI * HTTP/2.0')"])
            .stdin(std::process::Stdio::from(fd))
            .spawn()
        else {
            eprintln!("python3 not available; skipped");
            return;
        };
        child.wait().expect("child");
        let mut buf = [0u8; 64];
        let err = server.read(&mut buf).await.expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert_eq!(metrics.foreign_writers.get(), 1);
    }
}
