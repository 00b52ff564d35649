//! Workload attestation: who is on the other end of the Unix socket (from the kernel's peer
//! credentials), and which entries' selectors that caller satisfies.

use std::path::{Path, PathBuf};

use crate::state::{AgentState, Identity, Selector};

/// What the kernel told us about a caller when it connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    /// `/proc/<pid>/exe`, when readable.
    pub exe: Option<PathBuf>,
}

impl Caller {
    /// Reads the peer credentials of a connected Unix stream, and the executable path of
    /// the peer process under `proc_root` (normally `/proc`).
    pub fn from_stream(stream: &tokio::net::UnixStream, proc_root: &Path) -> std::io::Result<Self> {
        let cred = stream.peer_cred()?;
        let pid = cred.pid();
        let exe =
            pid.and_then(|p| std::fs::read_link(proc_root.join(p.to_string()).join("exe")).ok());
        Ok(Caller {
            uid: cred.uid(),
            gid: cred.gid(),
            pid,
            exe,
        })
    }
}

/// Matches callers against selectors. User names resolve through a passwd file.
#[derive(Debug, Clone)]
pub struct Attestor {
    passwd: PathBuf,
}

impl Default for Attestor {
    fn default() -> Self {
        Self::new("/etc/passwd")
    }
}

impl Attestor {
    pub fn new(passwd: impl Into<PathBuf>) -> Self {
        Self {
            passwd: passwd.into(),
        }
    }

    /// Whether `caller` satisfies one selector.
    pub fn matches(&self, caller: &Caller, selector: &Selector) -> bool {
        match selector {
            Selector::Uid(u) => caller.uid == *u,
            Selector::Gid(g) => caller.gid == *g,
            Selector::User(name) => std::fs::read_to_string(&self.passwd)
                .ok()
                .and_then(|text| uid_of(&text, name))
                .is_some_and(|uid| uid == caller.uid),
            Selector::Path(p) => caller.exe.as_deref() == Some(p.as_path()),
        }
    }

    /// The identities whose every selector the caller satisfies. An entry with no
    /// selectors matches nobody.
    pub fn identities_for<'a>(&self, caller: &Caller, state: &'a AgentState) -> Vec<&'a Identity> {
        state
            .identities
            .iter()
            .filter(|id| {
                !id.selectors.is_empty() && id.selectors.iter().all(|s| self.matches(caller, s))
            })
            .collect()
    }
}

/// The uid of `name` in passwd-format `text` (`name:x:uid:gid:…`).
pub fn uid_of(text: &str, name: &str) -> Option<u32> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let mut f = line.split(':');
            (f.next()? == name).then_some(())?;
            f.next()?;
            f.next()?.parse().ok()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::X509Svid;
    use std::time::SystemTime;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n# comment:x:5:5\nwww-data:x:33:33::/var/www:/usr/sbin/nologin\nbroken\n";

    fn caller(uid: u32, gid: u32, exe: Option<&str>) -> Caller {
        Caller {
            uid,
            gid,
            pid: Some(42),
            exe: exe.map(PathBuf::from),
        }
    }

    fn identity(id: &str, selectors: &[&str]) -> Identity {
        Identity {
            entry_id: id.into(),
            selectors: selectors
                .iter()
                .map(|s| s.parse().expect("selector"))
                .collect(),
            svid: X509Svid {
                spiffe_id: format!("spiffe://example.org/{id}").parse().expect("id"),
                chain_der: vec![],
                key_pkcs8_der: vec![],
                not_before: SystemTime::UNIX_EPOCH,
                not_after: SystemTime::UNIX_EPOCH,
            },
        }
    }

    #[test]
    fn passwd_parsing() {
        assert_eq!(uid_of(PASSWD, "root"), Some(0));
        assert_eq!(uid_of(PASSWD, "www-data"), Some(33));
        assert_eq!(uid_of(PASSWD, "comment"), None);
        assert_eq!(uid_of(PASSWD, "broken"), None);
        assert_eq!(uid_of(PASSWD, "nobody"), None);
        assert_eq!(uid_of(PASSWD, "www"), None);
    }

    #[test]
    fn all_selectors_must_match() {
        let dir = tempfile::tempdir().expect("tempdir");
        let passwd = dir.path().join("passwd");
        std::fs::write(&passwd, PASSWD).expect("write");
        let a = Attestor::new(&passwd);
        let state = AgentState {
            identities: vec![
                identity("web", &["unix:uid:33", "unix:path:/usr/bin/web"]),
                identity("any33", &["unix:user:www-data"]),
                identity("gid", &["unix:gid:100"]),
                identity("none", &[]),
            ],
            ..AgentState::default()
        };
        let names = |c: &Caller| {
            a.identities_for(c, &state)
                .iter()
                .map(|i| i.entry_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&caller(33, 33, Some("/usr/bin/web"))),
            ["web", "any33"]
        );
        assert_eq!(
            names(&caller(33, 100, Some("/usr/bin/other"))),
            ["any33", "gid"]
        );
        assert_eq!(names(&caller(33, 33, None)), ["any33"]);
        assert!(names(&caller(1000, 1000, Some("/usr/bin/web"))).is_empty());
    }

    #[test]
    fn unreadable_passwd_matches_no_user() {
        let a = Attestor::new("/nonexistent/passwd");
        assert!(!a.matches(&caller(0, 0, None), &Selector::User("root".into())));
    }

    #[tokio::test]
    async fn reads_own_credentials_from_a_socket_pair() {
        let (a, _b) = tokio::net::UnixStream::pair().expect("pair");
        let c = Caller::from_stream(&a, Path::new("/proc")).expect("creds");
        let me = std::fs::read_to_string("/proc/self/status").expect("status");
        let uid_line = me
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .expect("Uid line");
        let uid: u32 = uid_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("uid");
        assert_eq!(c.uid, uid);
        assert_eq!(c.pid, Some(std::process::id() as i32));
        assert_eq!(c.exe, std::env::current_exe().ok());
    }
}
