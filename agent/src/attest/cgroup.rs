//! Which container (and which pod) a process runs in, from its `/proc/<pid>/cgroup`, as
//! SPIRE's Kubernetes workload attestor reads it.
//!
//! Handled shapes (cgroup v1 lines `id:controllers:path` and the v2 line `0::path`; the
//! cgroupfs and systemd drivers; containerd, CRI-O and Docker naming):
//!
//! ```text
//! /kubepods/burstable/pod2c48913c-b29f-11e7-9350-020968147796/<64 hex>
//! /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice/cri-containerd-<64 hex>.scope
//! /kubepods.slice/kubepods-pod…slice/crio-<64 hex>.scope, …/docker-<64 hex>.scope
//! /system.slice/containerd.service/kubepods-burstable-pod…slice:cri-containerd:<64 hex>
//! /../../kubepods-besteffort-pod….slice/cri-containerd-<64 hex>.scope   (agent in a cgroup namespace)
//! /docker/<64 hex>, /system.slice/docker-<64 hex>.scope, /machine.slice/libpod-<64 hex>.scope
//! ```
//!
//! **What is trusted.** A pod UID is only taken from a path whose first component (after the
//! `..` components a cgroup namespace shows) is a cgroup only root can create: `kubepods*`,
//! `system.slice`, or a runtime's own top-level `crio-…`/`cri-containerd-…`/`docker-…`. A
//! user with a delegated cgroup subtree (systemd `user@<uid>.service`) can name its cgroups
//! anything, `pod<uuid>` included, but that subtree is under `user.slice`, so such a name
//! never makes its process look like a pod's container. Container IDs are no secret (any
//! process's cgroup is world-readable), so a container ID under an untrusted root is not used
//! to find a pod either; it only counts towards "this caller runs in a container" (which only
//! ever takes identities away).

/// The container a process runs in, from its cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerRef {
    /// The pod's UID, canonical (`-` separated, lowercase), when the path names one under a
    /// trusted root.
    pub pod_uid: Option<String>,
    /// The container ID (hex), when the path names one.
    pub container_id: Option<String>,
    /// Whether the path is under a root-owned cgroup root, so that its pod UID or container
    /// ID may be used to look the pod up. An untrusted path still marks the caller as
    /// containerized.
    pub trusted: bool,
}

impl ContainerRef {
    /// Whether `other` is the same container (same ID; or, without IDs, the same pod).
    pub fn same_container(&self, other: &ContainerRef) -> bool {
        match (&self.container_id, &other.container_id) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.pod_uid.is_some() && self.pod_uid == other.pod_uid,
            _ => false,
        }
    }
}

/// The container of a process from the text of its `/proc/<pid>/cgroup`, or `None` for a
/// process that is not in a container.
pub fn container_of(cgroup_file: &str) -> Option<ContainerRef> {
    let mut found: Option<ContainerRef> = None;
    for line in cgroup_file.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Some(c) = container_of_path(path) else {
            continue;
        };
        // The line with the most information wins (v1 has one line per hierarchy).
        let score =
            |c: &ContainerRef| c.pod_uid.is_some() as u8 * 2 + c.container_id.is_some() as u8;
        if found.as_ref().is_none_or(|f| score(&c) > score(f)) {
            found = Some(c);
        }
    }
    found
}

/// One cgroup path.
pub fn container_of_path(path: &str) -> Option<ContainerRef> {
    let path = path.strip_suffix(".scope").unwrap_or(path);
    let trusted_root = trusted_root(path);
    let pod = find_pod_uid(path);
    let (pod_uid, container_id) = match pod {
        Some((uid, end)) if trusted_root => (Some(uid), trailing_container_id(&path[end..], 32)),
        // Without a pod, only a runtime's 64-hex ID counts (not any hex-named cgroup).
        _ => (None, trailing_container_id(path, 64)),
    };
    if pod_uid.is_none() && container_id.is_none() {
        return None;
    }
    Some(ContainerRef {
        pod_uid,
        container_id,
        trusted: trusted_root,
    })
}

/// Whether the first real component of `path` is a cgroup only root can create.
fn trusted_root(path: &str) -> bool {
    let first = path
        .split('/')
        .find(|c| !c.is_empty() && *c != "..")
        .unwrap_or("");
    first.starts_with("kubepods")
        || first == "system.slice"
        || first.starts_with("crio-")
        || first.starts_with("cri-containerd-")
        || first.starts_with("docker-")
}

/// The first `<punct>pod<uuid>` followed by punctuation or the end, in `path`: the canonical
/// UID and the index just past the UUID.
fn find_pod_uid(path: &str) -> Option<(String, usize)> {
    let b = path.as_bytes();
    let mut i = 1;
    while i + 3 < b.len() {
        if b[i - 1].is_ascii_punctuation()
            && &b[i..i + 3] == b"pod"
            && let Some((uid, end)) = uuid_at(b, i + 3)
            && (end == b.len() || b[end].is_ascii_punctuation())
        {
            return Some((uid, end));
        }
        i += 1;
    }
    None
}

/// A UUID (groups of 8-4-4-4-12 hex digits, each separated by at most one punctuation
/// character) starting at `start`: canonical form and end index.
fn uuid_at(b: &[u8], start: usize) -> Option<(String, usize)> {
    let mut out = String::with_capacity(36);
    let mut i = start;
    for (n, len) in [8usize, 4, 4, 4, 12].into_iter().enumerate() {
        // No separator at all: a static pod's hash UID, kept undashed.
        if n > 0 && i < b.len() && b[i].is_ascii_punctuation() {
            i += 1;
            out.push('-');
        }
        let group = b.get(i..i + len)?;
        if !group.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        out.extend(group.iter().map(|c| c.to_ascii_lowercase() as char));
        i += len;
    }
    // Mixed separators (some groups separated, some not) are not a UUID.
    let dashes = out.matches('-').count();
    if dashes != 0 && dashes != 4 {
        return None;
    }
    Some((out, i))
}

/// The container ID at the end of `s`: its last run of non-punctuation characters, when that
/// run is `min_len` to 128 hex digits (runtimes use 64).
fn trailing_container_id(s: &str, min_len: usize) -> Option<String> {
    let run = s.rsplit(|c: char| c.is_ascii_punctuation()).next()?;
    ((min_len..=128).contains(&run.len()) && run.bytes().all(|c| c.is_ascii_hexdigit()))
        .then(|| run.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "9bca8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";
    const UID: &str = "2c48913c-b29f-11e7-9350-020968147796";

    fn both() -> Option<ContainerRef> {
        Some(ContainerRef {
            pod_uid: Some(UID.into()),
            container_id: Some(CID.into()),
            trusted: true,
        })
    }

    #[test]
    fn kubernetes_shapes() {
        for path in [
            format!("/kubepods/burstable/pod{UID}/{CID}"),
            format!("/kubepods/pod{UID}/{CID}"),
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice/cri-containerd-{CID}.scope"
            ),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod2c48913c_b29f_11e7_9350_020968147796.slice/crio-{CID}.scope"
            ),
            format!(
                "/kubepods.slice/kubepods-pod2c48913c_b29f_11e7_9350_020968147796.slice/docker-{CID}.scope"
            ),
            format!(
                "/system.slice/containerd.service/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice:cri-containerd:{CID}"
            ),
            format!(
                "/../../kubepods-besteffort-pod2c48913c_b29f_11e7_9350_020968147796.slice/cri-containerd-{CID}.scope"
            ),
            format!("/kubepods/burstable/pod2C48913C-B29F-11E7-9350-020968147796/{CID}"),
        ] {
            assert_eq!(container_of_path(&path), both(), "{path}");
        }
    }

    #[test]
    fn cgroup_files_v1_and_v2() {
        let v2 = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice/cri-containerd-{CID}.scope\n"
        );
        assert_eq!(container_of(&v2), both());
        let v1 = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:cpuset:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n0::/\n"
        );
        assert_eq!(container_of(&v1), both());
        for host in [
            "0::/user.slice/user-1000.slice/session-2.scope\n",
            "0::/system.slice/sshd.service\n",
            "0::/\n",
            "12:pids:/user.slice\n1:name=systemd:/init.scope\n",
            "4:memory:/process_api/3489bc9cb566a1440c8df42188c2b7bb\n0::/\n",
            "0::/system.slice/run-r3d2f6a0b2c9e3f1d4e5a8b7c6d5e4f3a2.scope\n",
            "",
            "garbage",
        ] {
            assert_eq!(container_of(host), None, "{host:?}");
        }
    }

    #[test]
    fn containers_without_pods() {
        for (path, trusted) in [
            (format!("/docker/{CID}"), false),
            (format!("/system.slice/docker-{CID}.scope"), true),
            (format!("/machine.slice/libpod-{CID}.scope"), false),
            (format!("/../crio-{CID}.scope"), true),
        ] {
            assert_eq!(
                container_of_path(&path),
                Some(ContainerRef {
                    pod_uid: None,
                    container_id: Some(CID.into()),
                    trusted,
                }),
                "{path}"
            );
        }
        // A pod's own cgroup (no container yet): in a pod, no container ID.
        assert_eq!(
            container_of_path(&format!("/kubepods/burstable/pod{UID}")),
            Some(ContainerRef {
                pod_uid: Some(UID.into()),
                container_id: None,
                trusted: true,
            })
        );
        // A static pod's hash UID (no dashes).
        let hash = "6a0b2c9e3f1d4e5a8b7c6d5e4f3a2b1c";
        assert_eq!(
            container_of_path(&format!("/kubepods/besteffort/pod{hash}/{CID}")),
            Some(ContainerRef {
                pod_uid: Some(hash.into()),
                container_id: Some(CID.into()),
                trusted: true,
            })
        );
    }

    #[test]
    fn a_user_delegated_cgroup_cannot_claim_a_pod() {
        // systemd delegates user@1000.service to uid 1000, who can create any name there.
        let spoof = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods/pod{UID}/{CID}\n"
        );
        let c = container_of(&spoof).expect("looks like a container");
        assert_eq!(c.pod_uid, None, "no pod from an untrusted root");
        assert!(!c.trusted, "nor a container to look up");
        // Through a cgroup namespace the same path still starts with user.slice.
        let spoof = format!("0::/../../user.slice/user-1000.slice/kubepods-pod{UID}.slice/x/{CID}");
        assert_eq!(container_of(&spoof).expect("container").pod_uid, None);
    }

    #[test]
    fn near_misses() {
        // Not hex, mixed separators, not after punctuation, too short an ID.
        for path in [
            "/kubepods/burstable/podzzzzzzzz-b29f-11e7-9350-020968147796/abc",
            "/kubepods/burstable/pod2c48913c-b29f11e7-9350-020968147796/x",
            "/kubepods/burstable/xpod2c48913c-b29f-11e7-9350-020968147796/x",
            "/docker/abc123",
        ] {
            let c = container_of_path(path);
            assert!(c.is_none(), "{path}: {c:?}");
        }
        let a = ContainerRef {
            pod_uid: Some(UID.into()),
            container_id: Some(CID.into()),
            trusted: true,
        };
        let mut b = a.clone();
        assert!(a.same_container(&b));
        b.container_id = Some("0".repeat(64));
        assert!(!a.same_container(&b));
    }

    #[test]
    fn hostile_names_never_panic() {
        // Cgroup names are partly chosen by users (delegated subtrees): splice fragments
        // that stress the parser (multibyte characters next to "pod", truncated UUIDs, many
        // colons) in a deterministic pseudo-random order.
        let parts = [
            "pod",
            "-",
            "_",
            ".",
            ":",
            "/",
            "..",
            "é",
            "💥",
            "2c48913c",
            "b29f",
            "11e7",
            "9350",
            "020968147796",
            CID,
            "kubepods",
            "slice",
            "scope",
            "cri-containerd-",
            "0::",
            "\n",
        ];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..20_000 {
            let mut s = String::new();
            for _ in 0..(x % 24) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.push_str(parts[(x % parts.len() as u64) as usize]);
            }
            let _ = container_of(&s);
            let _ = container_of_path(&s);
            x = x.wrapping_add(1);
        }
    }
}
