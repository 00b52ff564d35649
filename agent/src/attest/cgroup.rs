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
//! **What is trusted.** A cgroup's name is chosen by whoever may create it: root (the kubelet,
//! the container runtime, systemd) above and at a container's own cgroup, and, below it,
//! anyone the container's cgroup is delegated to (a container with a writable cgroup subtree,
//! a systemd unit with `Delegate=yes`, `user@<uid>.service`), who can name a child anything,
//! another container's ID or `pod<uuid>` included, and move itself into it. So a pod UID and a
//! container ID are taken only **from their place in a known layout**, every level above
//! them a cgroup only root creates:
//!
//! - a pod: below `kubepods*` levels only (`kubepods`, `kubepods.slice`, `burstable`,
//!   `kubepods-besteffort.slice`, …), or directly in `system.slice/containerd.service`; the
//!   pod's own cgroup named exactly as the kubelet names it (`pod<uuid>`,
//!   `kubepods[-<qos>]-pod<uuid>.slice`); its container the cgroup directly below it (or the
//!   `:<runtime>:<id>` suffix of the pod's name);
//! - a container of no pod: a runtime's scope (`cri-containerd-`, `crio-`, `docker-` and 64
//!   hex digits) as the first component, or directly in `system.slice`.
//!
//! The first component is the first after the `..` components a cgroup namespace shows; a
//! cgroup that appears there is a sibling of an ancestor of the reader's own cgroup, created
//! by root. Whatever lies **below** the container's cgroup is the container's own (only it,
//! or root, can create and enter cgroups there), so a process in a sub-cgroup is attested as
//! that container, whatever the sub-cgroup is called: a container that names a child
//! `cri-containerd-<victim>.scope` and moves into it is still itself. A path in no known layout
//! (a delegated unit, a user's slice, `/docker/<id>`, `machine.slice`) never names a pod or a
//! container to look up; a container ID anywhere in it only marks the caller as containerized
//! (which only ever takes identities away). On cgroup v1, where each hierarchy has a line,
//! lines that name different pods or containers prove nothing either.
//!
//! Ownership and modes of the cgroup directories are not consulted: a container whose cgroup
//! is delegated to it (user-namespaced pods, systemd in a container) owns it legitimately,
//! and through a cgroup namespace the agent cannot resolve the path it reads. The layout is
//! what root alone decides.

/// The container a process runs in, from its cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerRef {
    /// The pod's UID, canonical (`-` separated, lowercase), when the path names one in a known
    /// layout.
    pub pod_uid: Option<String>,
    /// The container ID (hex), when the path names one.
    pub container_id: Option<String>,
    /// Whether the path is a known layout under root-owned levels, so that its pod UID or
    /// container ID may be used to look the pod up. An untrusted path still marks the caller
    /// as containerized.
    pub trusted: bool,
}

impl ContainerRef {
    /// Whether `other` is the same container (same ID; or, without IDs, the same pod). Only
    /// what was proved counts: an untrusted path is nobody's container.
    pub fn same_container(&self, other: &ContainerRef) -> bool {
        if !(self.trusted && other.trusted) {
            return false;
        }
        match (&self.container_id, &other.container_id) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.pod_uid.is_some() && self.pod_uid == other.pod_uid,
            _ => false,
        }
    }

    /// In a container that cannot be told (lines that disagree).
    fn unknown() -> Self {
        ContainerRef {
            pod_uid: None,
            container_id: None,
            trusted: false,
        }
    }
}

/// The container of a process from the text of its `/proc/<pid>/cgroup`, or `None` for a
/// process that is not in a container. Cgroup v1 has a line per hierarchy: the line with the
/// most information wins, if no two lines name different pods or containers; if they do,
/// the process is in a container that cannot be told (untrusted, nothing to look up).
pub fn container_of(cgroup_file: &str) -> Option<ContainerRef> {
    let refs: Vec<ContainerRef> = cgroup_file
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
                return None;
            };
            container_of_path(path)
        })
        .collect();
    let first_pod = refs.iter().find_map(|c| c.pod_uid.as_ref());
    let first_id = refs.iter().find_map(|c| c.container_id.as_ref());
    let agrees = |a: Option<&String>, first: Option<&String>| a.is_none() || a == first;
    if !refs
        .iter()
        .all(|c| agrees(c.pod_uid.as_ref(), first_pod) && agrees(c.container_id.as_ref(), first_id))
    {
        return Some(ContainerRef::unknown());
    }
    let score = |c: &ContainerRef| {
        u8::from(c.pod_uid.is_some()) * 4
            + u8::from(c.container_id.is_some()) * 2
            + u8::from(c.trusted)
    };
    let mut found: Option<ContainerRef> = None;
    for c in refs {
        if found.as_ref().is_none_or(|f| score(&c) > score(f)) {
            found = Some(c);
        }
    }
    found
}

/// One cgroup path: a known pod layout, a known runtime's container, or (untrusted) any path
/// with a container ID in it.
pub fn container_of_path(path: &str) -> Option<ContainerRef> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    // A cgroup namespace shows the way up from the reader's cgroup as leading `..`s.
    let rest = &comps[comps.iter().take_while(|c| **c == "..").count()..];
    // The kernel shows no other `.` or `..`: such a path is not one it wrote, and proves
    // nothing (a container that cannot be told, never a host process).
    if rest.iter().any(|c| *c == "." || *c == "..") {
        return Some(ContainerRef::unknown());
    }
    pod_layout(rest)
        .or_else(|| runtime_layout(rest))
        .or_else(|| {
            let id = rest.iter().find_map(|c| trailing_container_id(c, 64))?;
            Some(ContainerRef {
                pod_uid: None,
                container_id: Some(id),
                trusted: false,
            })
        })
}

/// Runtimes' names of a container's own cgroup: `<prefix><id>[.scope]`.
const RUNTIME_PREFIXES: [&str; 3] = ["cri-containerd-", "crio-", "docker-"];

/// The kubelet's names of a pod's cgroup: `<prefix>pod<uuid>`, then `.slice` (systemd
/// driver) or nothing (cgroupfs driver).
const POD_PREFIXES: [&str; 4] = [
    "",
    "kubepods-",
    "kubepods-burstable-",
    "kubepods-besteffort-",
];

/// A pod's cgroup in a known place: below `kubepods*` levels only, or directly in
/// `system.slice/containerd.service` (with the container as a `:<runtime>:<id>` suffix);
/// its container is the next component (or that suffix). Deeper components are the
/// container's own.
fn pod_layout(rest: &[&str]) -> Option<ContainerRef> {
    let in_containerd = matches!(rest, ["system.slice", "containerd.service", ..]);
    let mut i = if in_containerd {
        2
    } else if rest.first()?.starts_with("kubepods") {
        0
    } else {
        return None;
    };
    let (uid, suffix) = loop {
        let c = rest.get(i)?;
        if let Some(pod) = pod_component(c) {
            break pod;
        }
        // Only the kubelet's own levels above the pod.
        if in_containerd || !kubepods_level(c) {
            return None;
        }
        i += 1;
    };
    let container_id = match suffix {
        "" | ".slice" => rest.get(i + 1).and_then(|c| trailing_container_id(c, 32)),
        s => {
            // `kubepods-…-pod<uuid>.slice:<runtime>:<id>` (containerd, cgroup v1, systemd).
            let (runtime, id) = s.strip_prefix(".slice:")?.split_once(':')?;
            if runtime.is_empty()
                || !runtime
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            {
                return None;
            }
            Some(hex_id(id, 32)?)
        }
    };
    Some(ContainerRef {
        pod_uid: Some(uid),
        container_id,
        trusted: true,
    })
}

/// A level the kubelet creates above pods: `kubepods`, `kubepods.slice`,
/// `kubepods-<qos>.slice`, or a cgroupfs QoS class.
fn kubepods_level(c: &str) -> bool {
    c.starts_with("kubepods") || c == "burstable" || c == "besteffort"
}

/// `<prefix>pod<uuid><suffix>` as the kubelet names a pod's cgroup: its canonical UID and
/// what follows the UUID.
fn pod_component(c: &str) -> Option<(String, &str)> {
    POD_PREFIXES.iter().find_map(|prefix| {
        let rest = c.strip_prefix(prefix)?.strip_prefix("pod")?;
        let (uid, end) = uuid_at(rest.as_bytes(), 0)?;
        let suffix = &rest[end..];
        (suffix.is_empty() || suffix.starts_with('.') || suffix.starts_with(':'))
            .then_some((uid, suffix))
    })
}

/// A container of no pod in a known place: a runtime's scope as the first component, or
/// directly in `system.slice`. Deeper components are the container's own.
fn runtime_layout(rest: &[&str]) -> Option<ContainerRef> {
    let scope = match rest {
        ["system.slice", second, ..] => second,
        [first, ..] => first,
        [] => return None,
    };
    let name = scope.strip_suffix(".scope").unwrap_or(scope);
    let id = RUNTIME_PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .and_then(|id| hex_id(id, 64))?;
    Some(ContainerRef {
        pod_uid: None,
        container_id: Some(id),
        trusted: true,
    })
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

/// The container ID at the end of one component (`.scope` left out): its last run of
/// non-punctuation characters, when that run is `min_len` to 128 hex digits (runtimes use
/// 64).
fn trailing_container_id(component: &str, min_len: usize) -> Option<String> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    hex_id(
        name.rsplit(|c: char| c.is_ascii_punctuation()).next()?,
        min_len,
    )
}

/// `s`, lowercased, when it is `min_len` to 128 hex digits.
fn hex_id(s: &str, min_len: usize) -> Option<String> {
    ((min_len..=128).contains(&s.len()) && s.bytes().all(|c| c.is_ascii_hexdigit()))
        .then(|| s.to_ascii_lowercase())
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

    /// Another container's ID, the one an attacker would name a cgroup after.
    const VICTIM: &str = "4f2d0c7bd1e0a6b3c5f8e9a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5";
    const VICTIM_UID: &str = "7d3a1e52-8c4f-4b1a-9e6d-2f0c5b8a9e13";

    fn mine(pod: Option<&str>) -> Option<ContainerRef> {
        Some(ContainerRef {
            pod_uid: pod.map(Into::into),
            container_id: Some(CID.into()),
            trusted: true,
        })
    }

    /// A container whose cgroup is delegated to it (writable: systemd in a container,
    /// user-namespaced pods, a runtime scope with `Delegate=yes`) names a child cgroup after
    /// another container, or after another pod and its container, and moves into it. Whatever
    /// it creates below its own cgroup is still its own: it is attested as itself, never as
    /// the container it named.
    #[test]
    fn a_child_cgroup_named_after_another_container_is_still_its_parents() {
        let victim_pod_systemd = VICTIM_UID.replace('-', "_");
        for (path, want) in [
            // Pod-less runtime scopes (containerd, CRI-O, Docker with the systemd driver).
            (
                format!("/system.slice/cri-containerd-{CID}.scope/cri-containerd-{VICTIM}.scope"),
                mine(None),
            ),
            (
                format!("/system.slice/docker-{CID}.scope/{VICTIM}"),
                mine(None),
            ),
            (
                format!("/system.slice/crio-{CID}.scope/init.scope/crio-{VICTIM}.scope"),
                mine(None),
            ),
            // The same scope seen through the agent's cgroup namespace.
            (
                format!("/../../cri-containerd-{CID}.scope/cri-containerd-{VICTIM}.scope"),
                mine(None),
            ),
            // A whole pod layout spelled out below a pod-less scope: no pod at all.
            (
                format!(
                    "/system.slice/docker-{CID}.scope/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{victim_pod_systemd}.slice/cri-containerd-{VICTIM}.scope"
                ),
                mine(None),
            ),
            (
                format!(
                    "/system.slice/cri-containerd-{CID}.scope/kubepods/pod{VICTIM_UID}/{VICTIM}"
                ),
                mine(None),
            ),
            // In a pod (systemd driver, cgroupfs driver): the pod's own container.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c48913c_b29f_11e7_9350_020968147796.slice/cri-containerd-{CID}.scope/cri-containerd-{VICTIM}.scope"
                ),
                mine(Some(UID)),
            ),
            (
                format!("/kubepods/burstable/pod{UID}/{CID}/{VICTIM}"),
                mine(Some(UID)),
            ),
            (
                format!("/kubepods/burstable/pod{UID}/{CID}/kubepods/pod{VICTIM_UID}/{VICTIM}"),
                mine(Some(UID)),
            ),
        ] {
            assert_eq!(container_of_path(&path), want, "{path}");
            assert_eq!(container_of(&format!("0::{path}\n")), want, "{path}");
        }
    }

    /// Paths in no layout only root creates never name a container or pod to look up,
    /// whatever IDs they spell: a unit delegated under `system.slice`, containerd's own
    /// service cgroup with something other than a pod directly in it, a user's slice.
    #[test]
    fn a_container_id_outside_a_known_layout_proves_nothing() {
        let victim_pod_systemd = VICTIM_UID.replace('-', "_");
        for path in [
            format!("/system.slice/app.service/cri-containerd-{VICTIM}.scope"),
            format!("/system.slice/app.service/docker-{VICTIM}.scope"),
            format!(
                "/system.slice/containerd.service/sub/kubepods-besteffort-pod{victim_pod_systemd}.slice:cri-containerd:{VICTIM}"
            ),
            format!("/system.slice/containerd.service/{VICTIM}"),
            format!("/user.slice/user-1000.slice/user@1000.service/cri-containerd-{VICTIM}.scope"),
            format!(
                "/user.slice/user-1000.slice/user@1000.service/kubepods/pod{VICTIM_UID}/{VICTIM}"
            ),
            // A pod UID in a name the kubelet does not use, above or beside kubepods.
            format!("/kubepods/burstable/x-pod{VICTIM_UID}/{VICTIM}"),
            format!("/kubepods/burstable/app/pod{VICTIM_UID}/{VICTIM}"),
            format!(
                "/kubepods.slice/kubepods-burstable.slice/mine.slice/kubepods-pod{victim_pod_systemd}.slice/cri-containerd-{VICTIM}.scope"
            ),
        ] {
            let c = container_of_path(&path).expect("marked as containerized");
            assert!(!c.trusted, "{path}: {c:?}");
            assert_eq!(c.pod_uid, None, "{path}");
            // Nobody's container either, not even one with the same ID.
            let victim = ContainerRef {
                pod_uid: Some(VICTIM_UID.into()),
                container_id: Some(VICTIM.into()),
                trusted: true,
            };
            assert!(!c.same_container(&victim), "{path}");
            assert!(!victim.same_container(&c), "{path}");
            assert!(!c.same_container(&c), "{path}");
        }
        // `.` or `..` below the namespace's `..`s: not a path the kernel writes.
        assert_eq!(
            container_of_path(&format!(
                "/kubepods/burstable/pod{UID}/../pod{VICTIM_UID}/{VICTIM}"
            )),
            Some(ContainerRef::unknown())
        );
    }

    /// Cgroup v1: one line per hierarchy. A container with a delegated hierarchy (say
    /// `name=systemd`) can move in one of them only: lines that name different containers
    /// or pods prove nothing.
    #[test]
    fn cgroup_v1_lines_that_disagree_prove_nothing() {
        let file = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{VICTIM_UID}/{VICTIM}\n0::/\n"
        );
        let c = container_of(&file).expect("containerized");
        assert_eq!(c, ContainerRef::unknown());
        let file = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{VICTIM}\n"
        );
        assert!(!container_of(&file).expect("containerized").trusted);
        // Lines that agree (some with less to say) are one container.
        let file = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:cpu:/kubepods/burstable/pod{UID}\n0::/\n"
        );
        assert_eq!(container_of(&file), both());
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
