//! Telling a workload that its files changed: a signal to the pid in a pid file, or a
//! command. Both run with the agent's privileges (often root) on the word of files the
//! workload may write, so:
//!
//! **`reload_signal` + `pid_file`.** The directory holding the pid file is reached through
//! directories only root and the agent can change (unless the sink sets
//! `allow_shared_directory`); the pid file is opened in it with `O_NOFOLLOW` (a link is
//! refused) and `O_NONBLOCK` (a FIFO cannot hang the agent), must be a regular file of at most
//! 64 bytes, owned by root or by the expected owner and not writable by its group or others.
//! The pid must not be 1 nor the agent itself. The process is pinned with `pidfd_open` before
//! it is checked, and its real, effective and saved uids (`/proc/<pid>/status`) must all be
//! the expected owner: the sink's `owner_uid` when set, else the uid owning the sink
//! directory. Only then is the signal sent, through the pidfd (`pidfd_send_signal`), so a pid
//! reused between the check and the signal gets nothing (the call fails with ESRCH).
//!
//! **`reload_command`.** Run without a shell, with only `PATH` from the agent's environment
//! (which may hold the agent's secrets), stdin and stdout closed, in a process group of its
//! own; when its deadline passes the whole group is killed (SIGKILL) and reaped, and the
//! delivery counts as timed out. Only the first 4 KiB of its stderr is kept for the error.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::process::{Pid, PidfdFlags, Signal};
use tokio::io::AsyncReadExt;

use crate::sinks::SinkError;
use crate::sinks::safe_dir::{OpenError, open_trusted_dir};

/// Reads the pid from `pid_file` (see the module docs for what is checked). With
/// `trusted_path`, the directory holding it is opened with
/// [`crate::sinks::safe_dir::open_trusted_dir`].
pub fn read_pid_file(
    sink: &str,
    pid_file: &Path,
    expected_uid: u32,
    trusted_path: bool,
) -> Result<i32, SinkError> {
    let shown = pid_file.display();
    let (Some(parent), Some(name)) = (pid_file.parent(), pid_file.file_name()) else {
        return Err(SinkError::new(
            sink,
            format!("pid file {shown} names no file"),
        ));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = if trusted_path {
        open_trusted_dir(parent).map_err(|e| match e {
            OpenError::Untrusted(why) => SinkError::refused(
                sink,
                format!("the path to pid file {shown} is not safe: {why}"),
            ),
            OpenError::Io(e) => SinkError::new(sink, format!("cannot read pid file {shown}: {e}")),
        })?
    } else {
        rustix::fs::openat(
            rustix::fs::CWD,
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| SinkError::new(sink, format!("cannot read pid file {shown}: {e}")))?
    };
    let fd = rustix::fs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => SinkError::refused(
            sink,
            format!("pid file {shown} is a symbolic link; the agent does not follow it"),
        ),
        e => SinkError::new(sink, format!("cannot read pid file {shown}: {e}")),
    })?;
    let mut f = File::from(fd);
    let meta = f
        .metadata()
        .map_err(|e| SinkError::new(sink, format!("cannot read pid file {shown}: {e}")))?;
    if !meta.file_type().is_file() {
        return Err(SinkError::refused(
            sink,
            format!("pid file {shown} is not a regular file"),
        ));
    }
    if meta.uid() != 0 && meta.uid() != expected_uid {
        return Err(SinkError::refused(
            sink,
            format!(
                "pid file {shown} is owned by uid {}, not by root or the sink's owner (uid \
                 {expected_uid})",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(SinkError::refused(
            sink,
            format!(
                "pid file {shown} is writable by its group or others (mode {:o})",
                meta.mode() & 0o7777
            ),
        ));
    }
    let mut buf = Vec::new();
    (&mut f)
        .take(65)
        .read_to_end(&mut buf)
        .map_err(|e| SinkError::new(sink, format!("cannot read pid file {shown}: {e}")))?;
    let pid = std::str::from_utf8(&buf)
        .ok()
        .filter(|_| buf.len() <= 64)
        .and_then(|t| t.trim().parse::<i32>().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| SinkError::new(sink, format!("pid file {shown} holds no valid pid")))?;
    Ok(pid)
}

/// The real, effective and saved uids of `pid`, from `/proc/<pid>/status`.
fn process_uids(pid: i32) -> std::io::Result<[u32; 3]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .ok_or_else(|| std::io::Error::other("no Uid line"))?;
    let ids: Vec<u32> = line
        .split_whitespace()
        .take(3)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| std::io::Error::other("bad Uid line"))?;
    <[u32; 3]>::try_from(ids).map_err(|_| std::io::Error::other("short Uid line"))
}

/// Sends `sig` to `pid` if it is a process wholly of `expected_uid`, not pid 1, not the agent.
pub fn signal_owner_process(
    sink: &str,
    pid: i32,
    sig: Signal,
    expected_uid: u32,
) -> Result<(), SinkError> {
    if pid == 1 {
        return Err(SinkError::refused(
            sink,
            "the pid file names pid 1; not signalled",
        ));
    }
    if u32::try_from(pid).ok() == Some(std::process::id()) {
        return Err(SinkError::refused(
            sink,
            "the pid file names the agent itself; not signalled",
        ));
    }
    let p = Pid::from_raw(pid)
        .ok_or_else(|| SinkError::new(sink, format!("{pid} is not a valid pid")))?;
    // Pin the process first; everything checked below is about this very process.
    let pidfd = rustix::process::pidfd_open(p, PidfdFlags::empty())
        .map_err(|e| SinkError::new(sink, format!("no process {pid} to signal: {e}")))?;
    let uids = process_uids(pid)
        .map_err(|e| SinkError::new(sink, format!("cannot inspect process {pid}: {e}")))?;
    if uids.iter().any(|u| *u != expected_uid) {
        return Err(SinkError::refused(
            sink,
            format!(
                "process {pid} runs as uid {}/{}/{} (real/effective/saved), not as the sink's \
                 owner uid {expected_uid}; not signalled",
                uids[0], uids[1], uids[2]
            ),
        ));
    }
    rustix::process::pidfd_send_signal(&pidfd, sig)
        .map_err(|e| SinkError::new(sink, format!("cannot signal process {pid}: {e}")))
}

/// Kills a process group when dropped (unless disarmed), so a reload command abandoned for
/// any reason (deadline, cancelled delivery, agent shutdown) leaves nothing running.
struct GroupKill(Option<i32>);

impl GroupKill {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take().and_then(Pid::from_raw) {
            let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `prog args…` with a deadline (see the module docs).
pub async fn run_command(
    sink: &str,
    prog: &str,
    args: &[String],
    deadline: Duration,
) -> Result<(), SinkError> {
    // Only PATH from the agent's environment: it may hold the agent's own secrets
    // (SIGNET_AGENT_JOIN_TOKEN), which are not the command's business.
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    let mut child = tokio::process::Command::new(prog)
        .args(args)
        .env_clear()
        .env("PATH", path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| SinkError::new(sink, format!("cannot run {prog}: {e}")))?;
    let mut group = GroupKill(child.id().and_then(|id| i32::try_from(id).ok()));
    let stderr = child.stderr.take();
    let collect = tokio::spawn(async move {
        let mut kept = Vec::new();
        if let Some(mut s) = stderr {
            let mut buf = [0u8; 1024];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if kept.len() < 4096 {
                    kept.extend_from_slice(&buf[..n.min(4096 - kept.len())]);
                }
            }
        }
        kept
    });
    let status = match tokio::time::timeout(deadline, child.wait()).await {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(SinkError::new(sink, format!("{prog}: {e}"))),
        Err(_) => {
            group.kill();
            let _ = child.kill().await;
            collect.abort();
            return Err(SinkError::timeout(
                sink,
                format!("reload command {prog} did not finish within {deadline:?}; it was killed"),
            ));
        }
    };
    // The command exited: whatever it left running in the background is its business.
    group.0 = None;
    if status.success() {
        collect.abort();
        return Ok(());
    }
    // Its stderr, if it closes soon (a background child may hold it open).
    let stderr = tokio::time::timeout(Duration::from_millis(500), collect)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    Err(SinkError::new(
        sink,
        format!(
            "{prog} failed ({status}): {}",
            String::from_utf8_lossy(&stderr).trim()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    #[test]
    fn pid_file_checks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("app.pid");
        std::fs::write(&good, "1234\n").expect("write");
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(read_pid_file("s", &good, me(), true).expect("pid"), 1234);

        let link = dir.path().join("link.pid");
        std::os::unix::fs::symlink(&good, &link).expect("link");
        let err = read_pid_file("s", &link, me(), true).expect_err("link");
        assert_eq!(err.kind, crate::sinks::SinkErrorKind::Refused);
        assert!(err.reason.contains("symbolic link"), "{err}");

        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let err = read_pid_file("s", &good, me(), true).expect_err("shared");
        assert!(err.reason.contains("writable"), "{err}");
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o644)).expect("chmod");

        if me() != 0 {
            // Owned by us, and we are neither root nor the expected owner.
            let err = read_pid_file("s", &good, me() + 1, true).expect_err("owner");
            assert!(err.reason.contains("owned by uid"), "{err}");
        }

        for bad in ["", "abc", "-5", "0", &"9".repeat(70)] {
            std::fs::write(&good, bad).expect("write");
            assert!(read_pid_file("s", &good, me(), true).is_err(), "{bad:?}");
        }
        let sub = dir.path().join("d.pid");
        std::fs::create_dir(&sub).expect("mkdir");
        assert!(read_pid_file("s", &sub, me(), true).is_err());
    }

    #[tokio::test]
    async fn signals_only_the_owners_processes() {
        let err = signal_owner_process("s", 1, Signal::HUP, me()).expect_err("pid 1");
        assert_eq!(err.kind, crate::sinks::SinkErrorKind::Refused);
        let own = i32::try_from(std::process::id()).expect("pid");
        let err = signal_owner_process("s", own, Signal::HUP, me()).expect_err("self");
        assert!(err.reason.contains("agent itself"), "{err}");

        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .expect("sleep");
        let pid = i32::try_from(child.id().expect("pid")).expect("pid");
        let err = signal_owner_process("s", pid, Signal::TERM, me() + 1).expect_err("not owner");
        assert!(err.reason.contains("not as the sink's owner"), "{err}");
        assert!(child.try_wait().expect("wait").is_none(), "not signalled");
        signal_owner_process("s", pid, Signal::TERM, me()).expect("owner's process");
        let status = child.wait().await.expect("wait");
        assert!(!status.success());
    }

    #[tokio::test]
    async fn commands_are_killed_at_their_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pids = dir.path().join("pids");
        // A shell that starts a grandchild in the same group, then hangs.
        let script = format!(
            "sleep 1000 & echo $! >> {p}; echo $$ >> {p}; wait",
            p = pids.display()
        );
        let err = run_command(
            "s",
            "sh",
            &["-c".into(), script],
            Duration::from_millis(300),
        )
        .await
        .expect_err("timed out");
        assert_eq!(err.kind, crate::sinks::SinkErrorKind::Timeout);
        let listed = std::fs::read_to_string(&pids).expect("pids");
        for pid in listed.split_whitespace() {
            // Gone, or at most a zombie waiting for its parent (init) to reap it. SIGKILL takes
            // effect when the process is next scheduled, which on a loaded machine may take a
            // moment: poll for the state rather than read it once.
            let state_of = || {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let state = stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .next()
                    .map(str::to_owned);
                (state, stat)
            };
            let mut seen = state_of();
            for _ in 0..200 {
                if matches!(seen.0.as_deref(), None | Some("Z") | Some("X")) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                seen = state_of();
            }
            assert!(
                matches!(seen.0.as_deref(), None | Some("Z") | Some("X")),
                "{pid}: {}",
                seen.1
            );
        }

        run_command("s", "true", &[], Duration::from_secs(5))
            .await
            .expect("true");
        // The agent's environment (HOME here; its secrets in production) stays with it.
        let err = run_command(
            "s",
            "sh",
            &[
                "-c".into(),
                "test -z \"$SIGNET_AGENT_JOIN_TOKEN$HOME\" || { echo leaked >&2; exit 1; }".into(),
            ],
            Duration::from_secs(5),
        )
        .await;
        assert!(err.is_ok(), "{err:?}");
        let err = run_command(
            "s",
            "sh",
            &["-c".into(), "echo broken >&2; exit 3".into()],
            Duration::from_secs(5),
        )
        .await
        .expect_err("fails");
        assert!(err.reason.contains("broken"), "{err}");
        assert_eq!(err.kind, crate::sinks::SinkErrorKind::Failed);
    }
}
