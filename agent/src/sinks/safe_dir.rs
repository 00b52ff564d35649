//! Directory operations for sinks that never follow a link the agent did not create.
//!
//! A sink directory may be writable by the workload it serves, and the agent often runs as
//! root, so every name in it is hostile: `..data` may point anywhere, a generation directory
//! may have been swapped for a link, a file for a FIFO. Hence:
//!
//! - the directory is opened once ([`SinkDir::open`]) and everything after that is relative to
//!   its descriptor: `mkdirat`, `openat`, `symlinkat`, `renameat`, `readlinkat`, `unlinkat`;
//! - a name is always one path component ([`Component`]), so no operation leaves the directory;
//! - a directory inside it is only opened with `O_DIRECTORY | O_NOFOLLOW` and then checked,
//!   through its descriptor, to be owned by the agent's own uid ([`OwnDir`]); modes and owners
//!   are only ever changed through descriptors (`fchmod`, `fchown`), never by path;
//! - files are created with `O_CREAT | O_EXCL | O_NOFOLLOW` inside such a directory;
//! - the only directories ever removed are generations, named by [`GenerationName`] (a type
//!   only its parser and its constructor build), verified as real directories owned by the
//!   agent; their entries are unlinked one by one (a link inside is removed as a link, never
//!   followed; a subdirectory stops the removal).

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};

/// `..data`: the link that names the current generation.
pub const DATA_LINK: &str = "..data";
/// Every generation directory's name starts with this.
pub const GEN_PREFIX: &str = "..signet-";
/// At most this many stale generations are removed per delivery, and at most `MAX_SCAN`
/// entries are looked at (a hostile directory may be huge; the work per delivery stays
/// bounded; what is left is swept by later deliveries).
const MAX_SWEEP: usize = 64;
const MAX_SCAN: usize = 4096;

/// One path component: not empty, no `/`, no NUL, not `.` or `..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component<'a>(&'a str);

impl<'a> Component<'a> {
    pub fn new(s: &'a str) -> Option<Self> {
        (!s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0'])).then_some(Self(s))
    }

    pub fn as_str(&self) -> &'a str {
        self.0
    }
}

/// The name of a generation directory: `..signet-<nanos>-<pid>-<counter>`. Only
/// [`GenerationName::parse`] (which checks exactly that shape) and [`GenerationName::new`]
/// build one, so [`SinkDir::remove_generation`] can only be asked to remove a name of the
/// agent's own naming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationName(String);

impl GenerationName {
    pub fn new(nanos: u128, pid: u32, counter: u64) -> Self {
        Self(format!("{GEN_PREFIX}{nanos}-{pid}-{counter}"))
    }

    /// The name if `raw` (a link target or a directory entry) is exactly a generation name:
    /// one component, the prefix, then three groups of decimal digits.
    pub fn parse(raw: &[u8]) -> Option<Self> {
        let s = std::str::from_utf8(raw).ok()?;
        let rest = s.strip_prefix(GEN_PREFIX)?;
        let parts: Vec<&str> = rest.split('-').collect();
        let digits =
            |p: &&str| !p.is_empty() && p.len() <= 40 && p.bytes().all(|b| b.is_ascii_digit());
        (parts.len() == 3 && parts.iter().all(digits)).then(|| Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn component(&self) -> Component<'_> {
        Component(&self.0)
    }
}

/// An open sink directory.
pub struct SinkDir {
    fd: OwnedFd,
    path: PathBuf,
    owner_uid: u32,
    mode: u32,
}

/// A directory inside a [`SinkDir`], opened without following links and owned by the agent.
pub struct OwnDir {
    fd: OwnedFd,
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from(e)
}

/// Why [`open_trusted_dir`] refused a path.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A directory on the way can be changed by a user other than root or the agent, so the
    /// path could be redirected anywhere.
    #[error("{0}")]
    Untrusted(String),
}

/// Could `st` (a directory) be changed only by root or the agent? A sticky directory (`/tmp`)
/// qualifies for entries owned by root or the agent.
fn trusted_dir(st: &rfs::Stat, me: u32) -> (bool, bool) {
    let owner_ok = st.st_uid == 0 || st.st_uid == me;
    let closed = st.st_mode & 0o022 == 0;
    let sticky = st.st_mode & 0o1000 != 0;
    (owner_ok && (closed || sticky), owner_ok && closed)
}

/// Why the directory `shown` (owner `uid`, `mode`) on a sink's path is not trusted, with the
/// command that fixes it: a directory made under the common umask 002 is group-writable, and
/// any member of its group could swap what it leads to.
fn untrusted_dir(shown: &Path, uid: u32, mode: u32, me: u32) -> String {
    let dir = shown.display();
    let fix = if uid != 0 && uid != me {
        format!("`chown root {dir}` (or the agent's user) and `chmod go-w {dir}`")
    } else if mode & 0o020 != 0 && mode & 0o002 == 0 {
        format!("`chmod g-w {dir}` (or `chmod 0755 {dir}`)")
    } else {
        format!("`chmod go-w {dir}` (or `chmod 0755 {dir}`), or make it sticky (`chmod +t {dir}`)")
    };
    format!(
        "{dir} (owner uid {uid}, mode {:o}) can be changed by a user other than root or the \
         agent; fix: {fix}",
        mode & 0o7777
    )
}

/// Opens the directory `path` so that nobody but root and the agent can have decided where it
/// leads: walking from `/`, every directory looked into must be owned by root or the agent
/// and not writable by its group or others (or sticky, like `/tmp`, with the entry owned by
/// root or the agent), and symbolic links are followed only when they sit in such a
/// directory. The last directory itself may belong to anyone (a workload's own directory);
/// it is opened without following a link. At most 40 links are followed.
pub fn open_trusted_dir(path: &Path) -> Result<OwnedFd, OpenError> {
    use std::collections::VecDeque;
    use std::path::Component as C;
    let me = euid();
    let abs = std::path::absolute(path)?;
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let root = || rfs::openat(rfs::CWD, "/", dir_flags, Mode::empty()).map_err(errno);
    let mut pending: VecDeque<std::ffi::OsString> = VecDeque::new();
    let push_front = |pending: &mut VecDeque<_>, p: &Path| {
        for c in p.components().rev() {
            match c {
                C::Normal(n) => pending.push_front(n.to_owned()),
                C::ParentDir => pending.push_front("..".into()),
                C::RootDir | C::CurDir | C::Prefix(_) => {}
            }
        }
    };
    push_front(&mut pending, &abs);
    let mut cur = root()?;
    let mut shown = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            cur = rfs::openat(&cur, "..", dir_flags, Mode::empty()).map_err(errno)?;
            shown.pop();
            continue;
        }
        let st_cur = rfs::fstat(&cur).map_err(errno)?;
        let (trusted, closed) = trusted_dir(&st_cur, me);
        if !trusted {
            return Err(OpenError::Untrusted(untrusted_dir(
                &shown,
                st_cur.st_uid,
                st_cur.st_mode,
                me,
            )));
        }
        let st = rfs::statat(&cur, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
        shown.push(&name);
        if !closed && st.st_uid != 0 && st.st_uid != me {
            return Err(OpenError::Untrusted(format!(
                "{} is owned by uid {} inside a directory others can write",
                shown.display(),
                st.st_uid
            )));
        }
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            links += 1;
            if links > 40 {
                return Err(OpenError::Io(io::Error::from(rustix::io::Errno::LOOP)));
            }
            let target = rfs::readlinkat(&cur, name.as_os_str(), Vec::new()).map_err(errno)?;
            let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
            shown.pop();
            if target.is_absolute() {
                cur = root()?;
                shown = PathBuf::from("/");
            }
            push_front(&mut pending, &target);
            continue;
        }
        cur = rfs::openat(&cur, name.as_os_str(), dir_flags, Mode::empty()).map_err(errno)?;
    }
    Ok(cur)
}

impl SinkDir {
    /// Opens the configured directory as given (its path is trusted; nothing below it is).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rfs::openat(
            rfs::CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        Self::from_fd(fd, path)
    }

    /// Opens the configured directory with [`open_trusted_dir`].
    pub fn open_trusted(path: &Path) -> Result<Self, OpenError> {
        let fd = open_trusted_dir(path)?;
        Ok(Self::from_fd(fd, path)?)
    }

    fn from_fd(fd: OwnedFd, path: &Path) -> io::Result<Self> {
        let meta = File::from(fd.try_clone()?).metadata()?;
        Ok(Self {
            fd,
            path: path.to_owned(),
            owner_uid: meta.uid(),
            mode: meta.mode(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's owner.
    pub fn owner_uid(&self) -> u32 {
        self.owner_uid
    }

    /// The permission bits.
    pub fn mode(&self) -> u32 {
        self.mode & 0o7777
    }

    /// Writable by its group or by other users: any of them could plant links.
    pub fn is_shared(&self) -> bool {
        self.mode & 0o022 != 0
    }

    /// Creates `name` (mode 0700) and opens it as an [`OwnDir`].
    pub fn create_generation(&self, name: &GenerationName) -> io::Result<OwnDir> {
        rfs::mkdirat(&self.fd, name.as_str(), Mode::from_raw_mode(0o700)).map_err(errno)?;
        self.open_own_dir(name.component())
    }

    /// Opens `name` only if it is a real directory (not a link) owned by the agent's uid.
    pub fn open_own_dir(&self, name: Component<'_>) -> io::Result<OwnDir> {
        let fd = rfs::openat(
            &self.fd,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        let meta = File::from(fd.try_clone()?).metadata()?;
        if meta.uid() != euid() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is owned by uid {}, not by the agent",
                    name.as_str(),
                    meta.uid()
                ),
            ));
        }
        Ok(OwnDir { fd })
    }

    /// The target of the link `name`, if it is a link.
    pub fn read_link(&self, name: Component<'_>) -> Option<Vec<u8>> {
        rfs::readlinkat(&self.fd, name.as_str(), Vec::new())
            .ok()
            .map(|c| c.into_bytes())
    }

    /// Makes `name` a link to `target`: a new link `tmp` renamed over it (a directory in the
    /// way makes the rename fail; nothing is followed).
    pub fn replace_with_link(
        &self,
        name: Component<'_>,
        target: &str,
        tmp: Component<'_>,
    ) -> io::Result<()> {
        let _ = rfs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        rfs::symlinkat(target, &self.fd, tmp.as_str()).map_err(errno)?;
        if let Err(e) = rfs::renameat(&self.fd, tmp.as_str(), &self.fd, name.as_str()) {
            let _ = rfs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
            return Err(errno(e));
        }
        Ok(())
    }

    /// Removes the entry `name` if it is not a directory (a link is removed, not followed).
    pub fn unlink(&self, name: Component<'_>) -> io::Result<()> {
        rfs::unlinkat(&self.fd, name.as_str(), AtFlags::empty()).map_err(errno)
    }

    pub fn sync(&self) -> io::Result<()> {
        rfs::fsync(&self.fd).map_err(errno)
    }

    /// The names in the directory that start with `prefix` (among the first [`MAX_SCAN`]
    /// entries): what a sink looks at to remove the links it made and no longer wants.
    pub fn names_with_prefix(&self, prefix: &str) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in rfs::Dir::read_from(&self.fd).map_err(errno)?.take(MAX_SCAN) {
            let entry = entry.map_err(errno)?;
            if let Ok(name) = entry.file_name().to_str()
                && name.starts_with(prefix)
            {
                out.push(name.to_owned());
            }
        }
        Ok(out)
    }

    /// The generation directories present (at most [`MAX_SWEEP`], among the first
    /// [`MAX_SCAN`] entries).
    pub fn generations(&self) -> io::Result<Vec<GenerationName>> {
        let mut out = Vec::new();
        for entry in rfs::Dir::read_from(&self.fd).map_err(errno)?.take(MAX_SCAN) {
            let entry = entry.map_err(errno)?;
            if let Some(g) = GenerationName::parse(entry.file_name().to_bytes()) {
                out.push(g);
                if out.len() >= MAX_SWEEP {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Removes the generation `name`: a link or a file of that name is unlinked (never
    /// followed); a directory only if it is a real directory owned by the agent, holding no
    /// directory. Returns why something was left in place, or what was not the agent's.
    pub fn remove_generation(
        &self,
        name: &GenerationName,
    ) -> Result<Option<String>, GenerationLeft> {
        let n = name.as_str();
        let left = |action: &'static str, e: &dyn std::fmt::Display| GenerationLeft::Io {
            action,
            name: n.to_owned(),
            reason: e.to_string(),
        };
        let st = match rfs::statat(&self.fd, n, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(left("inspect", &errno(e))),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {}
            FileType::Symlink | FileType::RegularFile | FileType::Fifo | FileType::Socket => {
                // Someone put a non-directory under a generation name: drop the entry itself.
                self.unlink(name.component())
                    .map_err(|e| left("remove", &e))?;
                return Ok(Some(format!(
                    "{n} was not a directory the agent created (a link or file); the entry \
                     was removed, nothing it pointed at was touched"
                )));
            }
            _ => {
                return Err(GenerationLeft::NotOurs(n.to_owned()));
            }
        }
        let dir = self
            .open_own_dir(name.component())
            .map_err(|e| GenerationLeft::NotOwnDir {
                name: n.to_owned(),
                reason: e.to_string(),
            })?;
        for entry in rfs::Dir::read_from(&dir.fd).map_err(|e| left("list", &e))? {
            let entry = entry.map_err(|e| left("list", &e))?;
            let file = entry.file_name();
            if is_dot(file) {
                continue;
            }
            // unlinkat without AT_REMOVEDIR refuses a directory (EISDIR): no recursion.
            rfs::unlinkat(&dir.fd, file, AtFlags::empty()).map_err(|e| GenerationLeft::Entry {
                name: n.to_owned(),
                file: OsStr::from_bytes(file.to_bytes())
                    .to_string_lossy()
                    .into_owned(),
                reason: e.to_string(),
            })?;
        }
        rfs::unlinkat(&self.fd, n, AtFlags::REMOVEDIR).map_err(|e| left("remove", &e))?;
        Ok(None)
    }
}

/// Why a generation (or part of it) was left in place; the wording is the warning a sink
/// reports. Reasons are the system's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerationLeft {
    /// An entry could not be inspected, listed or removed.
    #[error("cannot {action} {name}: {reason}")]
    Io {
        action: &'static str,
        name: String,
        reason: String,
    },
    /// Neither a directory nor a link or file: not of the agent's making.
    #[error("{0} is not a directory the agent created; left in place")]
    NotOurs(String),
    /// A directory that is not the agent's own (owner, mode, a link).
    #[error("{name} was left in place: {reason}")]
    NotOwnDir { name: String, reason: String },
    /// A file inside the generation could not be removed (a subdirectory, say).
    #[error("cannot remove {name}/{file}: {reason}; left in place")]
    Entry {
        name: String,
        file: String,
        reason: String,
    },
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

impl OwnDir {
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        rfs::fchmod(&self.fd, Mode::from_raw_mode(mode)).map_err(errno)
    }

    /// Creates the new file `name` (never an existing one, never through a link), gives it
    /// exactly `mode` and the owner, writes and fsyncs it.
    pub fn write_file(
        &self,
        name: Component<'_>,
        content: &[u8],
        mode: u32,
        owner: (Option<u32>, Option<u32>),
    ) -> io::Result<()> {
        use std::io::Write;
        let fd = rfs::openat(
            &self.fd,
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(errno)?;
        // The mode given to open() is masked by the umask; set it exactly.
        rfs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(errno)?;
        if owner.0.is_some() || owner.1.is_some() {
            rfs::fchown(
                &fd,
                owner.0.map(rustix::fs::Uid::from_raw),
                owner.1.map(rustix::fs::Gid::from_raw),
            )
            .map_err(errno)?;
        }
        let mut f = File::from(fd);
        f.write_all(content)?;
        f.sync_all()
    }

    pub fn sync(&self) -> io::Result<()> {
        rfs::fsync(self.fd.as_fd()).map_err(errno)
    }
}

#[cfg(test)]
#[path = "safe_dir_tests.rs"]
mod tests;
