//! Workload attestation: who is on the other end of the Unix socket, and which entries'
//! selectors that caller satisfies.
//!
//! - [`unix`]: the connected process, pinned (pidfd, start time) so that every later `/proc`
//!   read is of that process and not of one that reused its pid.
//! - [`cgroup`]: the container and pod a process runs in, from its cgroup.
//! - [`k8s`]: the pod's namespace, service account and labels, from the kubelet or the API
//!   server.
//!
//! [`Attestor::attest`] turns a [`PeerProcess`] into a [`Caller`], a snapshot of what was proved
//! about it at that moment; the Workload API attests again for every request and every update
//! it streams, never once per connection.
//!
//! **What a selector proves.** `unix:uid`/`unix:gid`/`unix:user`: the effective credentials of
//! the process when it connected (`SO_PEERCRED`); every byte on the connection was written by
//! that same process (see `workload::conn`). `unix:path`: the executable image the process
//! runs when it is inspected, not the code it executes (`LD_PRELOAD`, `ptrace`, an interpreter
//! running a script, a writable binary replaced on disk all run other code under the same
//! path), nor what it ran when it wrote a request it sent before an `exec` that happened
//! before the agent accepted the connection (an `exec` after it is refused). `k8s:*`: the pod
//! whose running container the process's cgroup names, as the kubelet or API server reports
//! it. A caller in a container is not served entries whose selectors are all `unix:*` unless
//! `workload_api.unix_only_entries_for_containers` says so.

pub mod cgroup;
pub mod k8s;
pub mod unix;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use cgroup::ContainerRef;
pub use k8s::{K8sAttestor, K8sError, PodInfo};
pub use unix::{PeerProcess, ProcessError};

use crate::state::{AgentState, Identity, Selector};

/// What was proved about a caller at one moment. Built by [`Attestor::attest`] (and, for
/// matching tests, [`Caller::host`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    /// `/proc/<pid>/exe`, when readable.
    pub exe: Option<PathBuf>,
    /// The container the caller runs in, when that is not the agent's own.
    pub container: Option<ContainerRef>,
    /// The caller's pod, when the Kubernetes attestor found its container running in one.
    pub pod: Option<Arc<PodInfo>>,
}

impl Caller {
    /// A caller on the host (no container), with the given credentials.
    pub fn host(uid: u32, gid: u32, pid: Option<i32>, exe: Option<PathBuf>) -> Self {
        Self {
            uid,
            gid,
            pid,
            exe,
            container: None,
            pod: None,
        }
    }
}

/// Why a caller could not be attested.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Kubernetes(#[from] K8sError),
}

/// Attests callers and matches them against selectors. User names resolve through a passwd
/// file. A caller in the agent's own cgroup or container is not "in another container".
#[derive(Clone)]
pub struct Attestor {
    passwd: PathBuf,
    proc_root: PathBuf,
    k8s: Option<Arc<K8sAttestor>>,
    unix_only_entries_for_containers: bool,
    /// The agent's own cgroup file and container (callers in it are not "another
    /// container").
    own_cgroup: Option<String>,
    own_container: Option<ContainerRef>,
}

impl std::fmt::Debug for Attestor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attestor")
            .field("passwd", &self.passwd)
            .field("proc_root", &self.proc_root)
            .field("k8s", &self.k8s.is_some())
            .field(
                "unix_only_entries_for_containers",
                &self.unix_only_entries_for_containers,
            )
            .field("own_container", &self.own_container)
            .finish()
    }
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
            proc_root: PathBuf::new(),
            k8s: None,
            unix_only_entries_for_containers: false,
            own_cgroup: None,
            own_container: None,
        }
        .with_proc_root("/proc")
    }

    /// Reads callers' processes under `proc_root` (default `/proc`), and the agent's own
    /// cgroup from `<proc_root>/self/cgroup`.
    pub fn with_proc_root(mut self, proc_root: impl Into<PathBuf>) -> Self {
        self.proc_root = proc_root.into();
        self.own_cgroup = std::fs::read_to_string(self.proc_root.join("self/cgroup")).ok();
        self.own_container = self.own_cgroup.as_deref().and_then(cgroup::container_of);
        self
    }

    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Enables `k8s:` selectors.
    pub fn with_kubernetes(mut self, k8s: Arc<K8sAttestor>) -> Self {
        self.k8s = Some(k8s);
        self
    }

    /// Serve `unix:`-only entries to callers in containers (off by default).
    pub fn with_unix_only_entries_for_containers(mut self, allow: bool) -> Self {
        self.unix_only_entries_for_containers = allow;
        self
    }

    /// What can be proved about `peer` now: its executable and container, read while the
    /// process is pinned, and its pod. Fails when the process is gone or its pid reused, or
    /// when the caller is in a container and its pod cannot be looked up.
    pub async fn attest(&self, peer: &PeerProcess) -> Result<Caller, AttestError> {
        let facts = peer.inspect()?;
        let container = if peer.pid.is_none() {
            // Not in the agent's pid namespace (nor one below it): another container, whose
            // cgroup cannot be read.
            Some(ContainerRef {
                pod_uid: None,
                container_id: None,
                trusted: false,
            })
        } else {
            facts
                .cgroup
                .as_deref()
                .filter(|c| self.own_cgroup.as_deref() != Some(*c))
                .and_then(cgroup::container_of)
                .filter(|c| {
                    !self
                        .own_container
                        .as_ref()
                        .is_some_and(|own| own.same_container(c))
                })
        };
        let pod = match (&self.k8s, &container) {
            (Some(k8s), Some(c)) => k8s.pod_of(c).await?.map(Arc::new),
            _ => None,
        };
        if pod.is_some() {
            // The lookup took time: the process must still be the one whose cgroup was read.
            peer.check()?;
        }
        Ok(Caller {
            uid: peer.uid,
            gid: peer.gid,
            pid: peer.pid,
            exe: facts.exe,
            container,
            pod,
        })
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
            Selector::K8sNamespace(ns) => caller.pod.as_ref().is_some_and(|p| &p.namespace == ns),
            Selector::K8sServiceAccount(sa) => caller
                .pod
                .as_ref()
                .is_some_and(|p| &p.service_account == sa),
            Selector::K8sPodLabel(k, v) => caller
                .pod
                .as_ref()
                .is_some_and(|p| p.labels.get(k) == Some(v)),
        }
    }

    /// Whether an entry with `selectors` is the caller's: it has selectors, the caller
    /// satisfies every one, and a caller in a container is proved by at least one `k8s:`
    /// selector (unless `unix_only_entries_for_containers`).
    pub fn entry_matches(&self, caller: &Caller, selectors: &[Selector]) -> bool {
        !selectors.is_empty()
            && (caller.container.is_none()
                || self.unix_only_entries_for_containers
                || selectors.iter().any(Selector::is_kubernetes))
            && selectors.iter().all(|s| self.matches(caller, s))
    }

    /// The identities whose every selector the caller satisfies. An entry with no
    /// selectors matches nobody.
    pub fn identities_for<'a>(&self, caller: &Caller, state: &'a AgentState) -> Vec<&'a Identity> {
        state
            .identities
            .iter()
            .filter(|id| self.entry_matches(caller, &id.selectors))
            .collect()
    }
}

/// The uid of `name` in passwd-format `text` (`name:x:uid:gid:…`); also the gid of a group
/// in group-format text (`name:x:gid:members`).
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

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n# comment:x:5:5\nwww-data:x:33:33::/var/www:/usr/sbin/nologin\nbroken\n";

    fn caller(uid: u32, gid: u32, exe: Option<&str>) -> Caller {
        Caller::host(uid, gid, Some(42), exe.map(PathBuf::from))
    }

    fn identity(id: &str, selectors: &[&str]) -> Identity {
        Identity {
            entry_id: id.into(),
            selectors: selectors
                .iter()
                .map(|s| s.parse().expect("selector"))
                .collect(),
            svid: crate::testing::delivered(&format!("spiffe://example.org/{id}"), 1).svid,
            federates_with: vec![],
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
    async fn a_peer_outside_our_pid_namespace_counts_as_another_container() {
        let peer = PeerProcess::from_parts(1000, 1000, None, None, None, Path::new("/proc"));
        let c = Attestor::default().attest(&peer).await.expect("attested");
        assert!(c.container.is_some());
        let state = AgentState {
            identities: vec![identity("uid", &["unix:uid:1000"])],
            ..AgentState::default()
        };
        assert!(Attestor::default().identities_for(&c, &state).is_empty());
        let lax = Attestor::default().with_unix_only_entries_for_containers(true);
        assert_eq!(lax.identities_for(&c, &state).len(), 1);
    }

    #[tokio::test]
    async fn attests_own_process_from_a_socket_pair() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let peer = PeerProcess::from_socket(&a, Path::new("/proc")).expect("creds");
        let c = Attestor::default().attest(&peer).await.expect("attested");
        let me = std::fs::metadata("/proc/self").expect("self");
        assert_eq!(c.uid, std::os::unix::fs::MetadataExt::uid(&me));
        assert_eq!(c.pid, Some(std::process::id() as i32));
        assert_eq!(c.exe, std::env::current_exe().ok());
    }

    const CID: &str = "aaaa8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";

    fn pod(ns: &str, sa: &str, labels: &[(&str, &str)]) -> Arc<PodInfo> {
        let json = serde_json::json!({"items": [{
            "metadata": {"name": "p", "namespace": ns, "uid": "u",
                         "labels": labels.iter().cloned().collect::<std::collections::BTreeMap<_, _>>()},
            "spec": {"serviceAccountName": sa},
            "status": {"containerStatuses": [{"containerID": format!("containerd://{CID}"), "state": {"running": {}}}]}
        }]});
        Arc::new(
            k8s::parse_pod_list(json.to_string().as_bytes())
                .expect("pods")
                .remove(0),
        )
    }

    #[test]
    fn kubernetes_selectors_need_the_pod_and_unix_only_entries_skip_containers() {
        let state = AgentState {
            identities: vec![
                identity(
                    "a",
                    &["k8s:ns:team-a", "k8s:sa:web", "k8s:pod-label:app:web"],
                ),
                identity("a-uid", &["k8s:ns:team-a", "unix:uid:1000"]),
                identity("b", &["k8s:ns:team-b"]),
                identity("uid", &["unix:uid:1000"]),
            ],
            ..AgentState::default()
        };
        let names = |a: &Attestor, c: &Caller| {
            a.identities_for(c, &state)
                .iter()
                .map(|i| i.entry_id.clone())
                .collect::<Vec<_>>()
        };
        let a = Attestor::default();
        let in_pod = Caller {
            container: Some(ContainerRef {
                pod_uid: Some("u".into()),
                container_id: Some(CID.into()),
                trusted: true,
            }),
            pod: Some(pod("team-a", "web", &[("app", "web")])),
            ..caller(1000, 1000, Some("/app"))
        };
        assert_eq!(names(&a, &in_pod), ["a", "a-uid"]);
        // Another label value: not the entry with the label.
        let other_label = Caller {
            pod: Some(pod("team-a", "web", &[("app", "db")])),
            ..in_pod.clone()
        };
        assert_eq!(names(&a, &other_label), ["a-uid"]);
        // A container whose pod is unknown: nothing, not even the uid entry.
        let unknown = Caller {
            pod: None,
            ..in_pod.clone()
        };
        assert!(names(&a, &unknown).is_empty());
        // Unless configured, then only the unix-only entry.
        let lax = Attestor::default().with_unix_only_entries_for_containers(true);
        assert_eq!(names(&lax, &unknown), ["uid"]);
        assert_eq!(names(&lax, &in_pod), ["a", "a-uid", "uid"]);
        // A host process gets its unix entry and no k8s one.
        assert_eq!(names(&a, &caller(1000, 1000, Some("/app"))), ["uid"]);
    }
}
