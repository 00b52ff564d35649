//! The process on the other end of a Unix socket, pinned so that a later `/proc` read cannot
//! describe another process.
//!
//! At accept the kernel tells us who connected (`SO_PEERCRED`: pid, uid, gid, as of
//! `connect(2)`) and gives a pidfd for exactly that process (`SO_PEERPIDFD`, Linux 6.5+). We
//! also note its start time (`/proc/<pid>/stat`, field 22). Every later look at the process
//! ([`PeerProcess::inspect`]) checks, before and after reading `/proc/<pid>/…`, that the pidfd's
//! process is still alive, or without a pidfd that the start time is unchanged: a live
//! process's pid is never reused (a pidfd polls readable as soon as its process exits, before
//! it can be reaped and its pid handed out again), so the files read in between were that
//! process's. With a pidfd the start time is not read again: it could only tell what the pidfd
//! already says, and reading it was most of the cost of a cached Workload API answer. A peer that exited, or whose pid now
//! names another process, is refused ([`ProcessError::Gone`], [`ProcessError::PidReused`]).
//!
//! The executable is also noted at accept; a process that runs another one at a request than
//! when it was accepted (it called `exec` in between) is refused
//! ([`ProcessError::ExecutableChanged`]). This narrows, but cannot close, the race of a process
//! that writes a request and then execs an allowed binary before the agent accepts it.
//!
//! Without `SO_PEERPIDFD` (older kernels) only the start time guards the reads, and the pid
//! could in principle be reused between `connect` and `accept` by a process started in that
//! window; see the Security section of the README.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{getsockopt, sockopt};

/// What [`PeerProcess::inspect`] read about the peer, all of it from the one pinned process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    /// `/proc/<pid>/exe`, when readable.
    pub exe: Option<PathBuf>,
    /// `/proc/<pid>/cgroup`, when readable.
    pub cgroup: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessError {
    #[error("the calling process {0} has exited")]
    Gone(i32),
    #[error("pid {0} now belongs to another process than the one that connected")]
    PidReused(i32),
    #[error("cannot read the calling process {0}: {1}")]
    Unreadable(i32, String),
    #[error("the calling process {0} runs another executable than when it connected")]
    ExecutableChanged(i32),
}

/// The connected peer: its credentials from the kernel and a handle that keeps telling us
/// whether it is the same, live process.
#[derive(Debug)]
pub struct PeerProcess {
    pub uid: u32,
    pub gid: u32,
    /// None when the peer is not visible in the agent's pid namespace (the kernel says 0).
    pub pid: Option<i32>,
    pidfd: Option<OwnedFd>,
    /// Field 22 of `/proc/<pid>/stat` at accept, in clock ticks since boot.
    start_time: Option<u64>,
    /// `/proc/<pid>/exe` at accept: a process that execs another binary after connecting
    /// (possibly after writing a request) is refused.
    exe_at_accept: Option<PathBuf>,
    proc_root: PathBuf,
}

impl PeerProcess {
    /// Reads the peer of a connected Unix socket. `proc_root` is normally `/proc`.
    pub fn from_socket(fd: impl AsFd, proc_root: &Path) -> std::io::Result<Self> {
        let cred = getsockopt(&fd, sockopt::PeerCredentials)?;
        let pid = (cred.pid() > 0).then_some(cred.pid());
        // Linux 6.5+: a pidfd for the very process that connected, race-free. ESRCH: that
        // process is gone (its pid may already name another one); older kernels say
        // ENOPROTOOPT and only the start time guards.
        let (pidfd, gone) = match pid.map(|_| getsockopt(&fd, sockopt::PeerPidfd)) {
            Some(Ok(fd)) => (Some(fd), false),
            Some(Err(nix::errno::Errno::ESRCH)) => (None, true),
            _ => (None, false),
        };
        let start_time = pid
            .filter(|_| !gone)
            .and_then(|p| read_start_time(proc_root, p).ok());
        let exe_at_accept =
            pid.and_then(|p| std::fs::read_link(proc_root.join(p.to_string()).join("exe")).ok());
        let mut peer = Self {
            uid: cred.uid(),
            gid: cred.gid(),
            pid,
            pidfd,
            start_time,
            exe_at_accept,
            proc_root: proc_root.to_owned(),
        };
        // The process may already be gone (it connected and exited): keep the credentials,
        // every inspection will refuse. The executable read above must be this process's.
        if peer.check().is_err() {
            peer.start_time = None;
        }
        Ok(peer)
    }

    /// For tests: a peer with explicit parts.
    pub fn from_parts(
        uid: u32,
        gid: u32,
        pid: Option<i32>,
        pidfd: Option<OwnedFd>,
        start_time: Option<u64>,
        proc_root: &Path,
    ) -> Self {
        let exe_at_accept =
            pid.and_then(|p| std::fs::read_link(proc_root.join(p.to_string()).join("exe")).ok());
        Self {
            uid,
            gid,
            pid,
            pidfd,
            start_time,
            exe_at_accept,
            proc_root: proc_root.to_owned(),
        }
    }

    /// Whether the kernel gave a pidfd (the strong pid-reuse guard).
    pub fn has_pidfd(&self) -> bool {
        self.pidfd.is_some()
    }

    /// Checks that the peer is still the live process that connected.
    pub fn check(&self) -> Result<(), ProcessError> {
        let Some(pid) = self.pid else {
            return Ok(());
        };
        if let Some(fd) = &self.pidfd
            && exited(fd)
        {
            return Err(ProcessError::Gone(pid));
        }
        let Some(expected) = self.start_time else {
            // Unknown at accept: the process was already gone or unreadable then.
            return Err(ProcessError::Gone(pid));
        };
        if self.pidfd.is_some() {
            // Alive (checked above): its pid names it still.
            return Ok(());
        }
        match read_start_time(&self.proc_root, pid) {
            Ok(t) if t == expected => Ok(()),
            Ok(_) => Err(ProcessError::PidReused(pid)),
            Err(_) => Err(ProcessError::Gone(pid)),
        }
    }

    /// Reads the peer's executable and cgroup, guarded on both sides by [`Self::check`]. A
    /// peer outside the agent's pid namespace has no facts.
    pub fn inspect(&self) -> Result<ProcessFacts, ProcessError> {
        let Some(pid) = self.pid else {
            return Ok(ProcessFacts::default());
        };
        self.check()?;
        let dir = self.proc_root.join(pid.to_string());
        let exe = std::fs::read_link(dir.join("exe")).ok();
        let cgroup = match std::fs::read_to_string(dir.join("cgroup")) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ProcessError::Unreadable(pid, format!("cgroup: {e}"))),
        };
        self.check()?;
        if exe != self.exe_at_accept {
            return Err(ProcessError::ExecutableChanged(pid));
        }
        Ok(ProcessFacts { exe, cgroup })
    }
}

/// Whether a pidfd's process has exited (the pidfd polls readable).
fn exited(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) => n > 0,
        // Cannot tell: treat as gone (fail closed).
        Err(_) => true,
    }
}

/// Why [`read_start_time`] has no start time: the stat file could not be read (the process is
/// gone, or not visible), or it is not a stat line.
#[derive(Debug, thiserror::Error)]
pub enum StatError {
    #[error("{0}")]
    Unreadable(#[from] std::io::Error),
    #[error("malformed stat")]
    Malformed,
}

/// The start time (field 22) of `<proc_root>/<pid>/stat`.
pub fn read_start_time(proc_root: &Path, pid: i32) -> Result<u64, StatError> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat"))?;
    start_time_of(&text).ok_or(StatError::Malformed)
}

/// Field 22 of a `/proc/<pid>/stat` line. The command (field 2) is in parentheses and may
/// hold spaces and parentheses itself, so fields are counted after the last `)`.
pub fn start_time_of(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")" come fields 3 (state), 4, …: field 22 is the 20th.
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (we(ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 10000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";

    #[test]
    fn start_time_parsing() {
        assert_eq!(start_time_of(STAT), Some(987654));
        assert_eq!(start_time_of("1 (x) S 1 2"), None);
        assert_eq!(start_time_of("no parenthesis"), None);
        let me = std::fs::read_to_string("/proc/self/stat").expect("stat");
        assert!(start_time_of(&me).is_some());
    }

    fn fake_proc(pid: i32, start: u64) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join(pid.to_string());
        std::fs::create_dir(&p).expect("dir");
        std::fs::write(p.join("stat"), STAT.replace("987654", &start.to_string())).expect("stat");
        std::fs::write(p.join("cgroup"), "0::/user.slice\n").expect("cgroup");
        std::os::unix::fs::symlink("/usr/bin/app", p.join("exe")).expect("exe");
        dir
    }

    #[test]
    fn a_changed_start_time_is_pid_reuse() {
        let root = fake_proc(4242, 100);
        let peer = PeerProcess::from_parts(1, 1, Some(4242), None, Some(100), root.path());
        let facts = peer.inspect().expect("same process");
        assert_eq!(facts.exe.as_deref(), Some(Path::new("/usr/bin/app")));
        assert_eq!(facts.cgroup.as_deref(), Some("0::/user.slice\n"));
        // The process exits and another one gets its pid.
        std::fs::write(root.path().join("4242/stat"), STAT.replace("987654", "200")).expect("stat");
        assert_eq!(peer.inspect(), Err(ProcessError::PidReused(4242)));
        // Gone entirely.
        std::fs::remove_dir_all(root.path().join("4242")).expect("rm");
        assert_eq!(peer.inspect(), Err(ProcessError::Gone(4242)));
        // The process execs another binary after connecting: refused, even if that binary is
        // the one an entry allows.
        let root = fake_proc(4242, 100);
        let peer = PeerProcess::from_parts(1, 1, Some(4242), None, Some(100), root.path());
        std::fs::remove_file(root.path().join("4242/exe")).expect("rm");
        std::os::unix::fs::symlink("/usr/bin/allowed", root.path().join("4242/exe")).expect("exe");
        assert_eq!(peer.inspect(), Err(ProcessError::ExecutableChanged(4242)));
        // Unknown start time at accept: never trusted.
        let root = fake_proc(4242, 100);
        let peer = PeerProcess::from_parts(1, 1, Some(4242), None, None, root.path());
        assert_eq!(peer.inspect(), Err(ProcessError::Gone(4242)));
    }

    #[test]
    fn a_dead_pidfd_refuses_even_when_proc_still_looks_the_same() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        // A child process that connects and stays.
        let Ok(mut child) = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(60)",
            ])
            .arg(&sock)
            .spawn()
        else {
            eprintln!("python3 not available; skipped");
            return;
        };
        let (conn, _) = listener.accept().expect("accept");
        let pid = getsockopt(&conn, sockopt::PeerCredentials)
            .expect("creds")
            .pid();
        assert_eq!(pid, child.id() as i32);
        let start = read_start_time(Path::new("/proc"), pid).expect("start");
        // A fake /proc that keeps showing the same process after it is gone, as a reused pid
        // with a matching start time would: only the pidfd can tell.
        let root = fake_proc(pid, start);
        let peer = PeerProcess::from_socket(&conn, root.path()).expect("peer");
        assert_eq!(peer.pid, Some(pid));
        peer.check().expect("alive");
        if !peer.has_pidfd() {
            eprintln!("no SO_PEERPIDFD on this kernel; the pidfd half is skipped");
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        // While the pidfd is alive the start time is not read again: it cannot have changed.
        std::fs::remove_file(root.path().join(format!("{pid}/stat"))).expect("rm stat");
        peer.check().expect("alive, by its pidfd");
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert_eq!(peer.check(), Err(ProcessError::Gone(pid)));
        assert_eq!(peer.inspect(), Err(ProcessError::Gone(pid)));
    }

    #[test]
    fn a_peer_that_exited_before_accept_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let Ok(status) = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.send(b'x')",
            ])
            .arg(&sock)
            .status()
        else {
            eprintln!("python3 not available; skipped");
            return;
        };
        assert!(status.success());
        // Connected, wrote, exited and was reaped before the agent accepted.
        let (conn, _) = listener.accept().expect("accept");
        let peer = PeerProcess::from_socket(&conn, Path::new("/proc")).expect("peer");
        let pid = peer.pid.expect("pid");
        assert_eq!(peer.check(), Err(ProcessError::Gone(pid)));
        assert_eq!(peer.inspect(), Err(ProcessError::Gone(pid)));
    }
}
