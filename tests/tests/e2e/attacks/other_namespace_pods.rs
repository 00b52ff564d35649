//! A pod in another namespace (or a container that is not a running pod's) tries to get a
//! namespace's identity from the node agent. The agent attests `k8s:` selectors as SPIRE's
//! k8s workload attestor does: the caller's cgroup names its pod and container, the kubelet
//! (mock: HTTPS, its own CA, the agent's bearer token, a real PodList) says which namespace,
//! service account and labels that pod has, and the container must be running in it. Callers
//! are real processes; what the agent reads of them comes from a fake `/proc` root with
//! real-shaped cgroup files.

use signet_tests::workload::{Fetched, MockKubelet, WaitingProbe, fake_proc_entry};
use signet_tests::*;

use crate::agent::{Agent, create_token, eventually, my_uid, write_config};
use crate::pg_server;

const POD_A: &str = "2c48913c-b29f-11e7-9350-020968147796";
const POD_B: &str = "72f7f152-440c-66ac-9084-e0fc1d8a910c";
const CID_A: &str = "aaaa8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";
const CID_A_DONE: &str = "adad8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";
const CID_B: &str = "b2a102854b4969b2ce98dc329c86b4fb2b06e4ad2cc8da9d8a7578c9cd2004a2";
const CID_STRAY: &str = "5555555554b4969b2ce98dc329c86b4fb2b06e4ad2cc8da9d8a7578c9cd2004a";

fn pods() -> String {
    serde_json::json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": {},
        "items": [
            {
                "metadata": {"name": "web-7d9f8b6c5-x2k4q", "namespace": "team-a", "uid": POD_A,
                             "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5"}},
                "spec": {"serviceAccountName": "web", "nodeName": "node-1",
                         "containers": [{"name": "web", "image": "web:1"}, {"name": "migrate", "image": "web:1"}]},
                "status": {"phase": "Running", "podIP": "10.0.0.5",
                    "containerStatuses": [
                        {"name": "web", "ready": true, "restartCount": 0, "image": "web:1",
                         "containerID": format!("containerd://{CID_A}"),
                         "state": {"running": {"startedAt": "2026-12-01T08:00:00Z"}}},
                        {"name": "migrate", "ready": false, "restartCount": 0, "image": "web:1",
                         "containerID": format!("containerd://{CID_A_DONE}"),
                         "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                    ]}
            },
            {
                "metadata": {"name": "db-0", "namespace": "team-b", "uid": POD_B,
                             "labels": {"app": "db"}},
                "spec": {"serviceAccountName": "db", "nodeName": "node-1"},
                "status": {"phase": "Running",
                    "containerStatuses": [
                        {"name": "db", "ready": true, "restartCount": 1,
                         "containerID": format!("containerd://{CID_B}"),
                         "state": {"running": {"startedAt": "2026-12-01T08:00:00Z"}}}
                    ]}
            }
        ]
    })
    .to_string()
}

fn systemd_cgroup(pod_uid: &str, cid: &str) -> String {
    let pod = pod_uid.replace('-', "_");
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/cri-containerd-{cid}.scope\n"
    )
}

fn cgroupfs_v1(pod_uid: &str, cid: &str) -> String {
    format!(
        "12:pids:/kubepods/besteffort/pod{pod_uid}/{cid}\n11:memory:/kubepods/besteffort/pod{pod_uid}/{cid}\n1:name=systemd:/kubepods/besteffort/pod{pod_uid}/{cid}\n"
    )
}

fn entry(server: &Server, id: &str, selectors: &[&str]) {
    let mut args = vec!["entry", "create", "--spiffe-id", id, "--parent", "k8n1"];
    for s in selectors {
        args.push("--selector");
        args.push(s);
    }
    let out = server.signetctl(&args);
    assert!(out.status.success(), "{out:?}");
}

/// A real process that the fake /proc places in `cgroup`, fetching once.
async fn caller_in(socket: &std::path::Path, proc_root: &std::path::Path, cgroup: &str) -> Fetched {
    let probe = WaitingProbe::spawn(socket);
    fake_proc_entry(proc_root, probe.pid, cgroup);
    probe.go().await
}

#[tokio::test]
async fn pods_get_their_namespace_identity_and_nothing_else() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let kubelet = MockKubelet::start(pods()).await;
    let a = "spiffe://example.org/ns/team-a/sa/web";
    let b = "spiffe://example.org/ns/team-b/sa/db";
    let host = "spiffe://example.org/host/app";
    let token = create_token(&server, "k8n1");
    entry(
        &server,
        a,
        &["k8s:ns:team-a", "k8s:sa:web", "k8s:pod-label:app:web"],
    );
    entry(&server, b, &["k8s:ns:team-b", "k8s:sa:db"]);
    let uid = format!("unix:uid:{}", my_uid());
    entry(&server, host, &[&uid]);

    let l = write_config(&server, &token, host);
    let proc_root = tempfile::tempdir().unwrap();
    let mut cfg = std::fs::read_to_string(&l.config).unwrap();
    cfg.push_str(&format!(
        "\n[workload_api]\nproc_root = \"{}\"\n\n[workload_api.kubernetes]\nenabled = true\n\
         url = \"{}\"\nca_file = \"{}\"\ntoken_file = \"{}\"\npod_cache_ttl = \"2s\"\n\
         refresh_min_interval = \"100ms\"\n",
        proc_root.path().display(),
        kubelet.url,
        kubelet.ca_file.display(),
        kubelet.token_file.display(),
    ));
    std::fs::write(&l.config, cfg).unwrap();
    let agent = Agent::start(&l.config);

    // A host process gets its unix entry (once the agent holds all three certificates).
    let host_cgroup = "0::/user.slice/user-1000.slice/session-3.scope\n";
    eventually(30, "the host workload's SVID", || async {
        (caller_in(&l.socket, proc_root.path(), host_cgroup)
            .await
            .ids()
            == [host])
        .then_some(())
    })
    .await;
    // Pod A's container (systemd driver, cgroup v2): A's identity only, not B's, and not the
    // unix:uid entry even though its uid matches (asked until A's certificate is signed).
    let got = eventually(30, "pod A's SVID", || async {
        let got = caller_in(&l.socket, proc_root.path(), &systemd_cgroup(POD_A, CID_A)).await;
        (!got.ids().is_empty()).then_some(got)
    })
    .await;
    assert_eq!(got.ids(), [a], "{got:?}");
    // Pod B's container (cgroupfs driver, cgroup v1): B's only.
    let got = eventually(30, "pod B's SVID", || async {
        let got = caller_in(&l.socket, proc_root.path(), &cgroupfs_v1(POD_B, CID_B)).await;
        (!got.ids().is_empty()).then_some(got)
    })
    .await;
    assert_eq!(got.ids(), [b], "{got:?}");

    // Refused: B's container claiming pod A; A's finished container; a container in pod A's
    // cgroup that the kubelet does not list; a container of no pod at all.
    for (what, cgroup) in [
        ("B's container under pod A", systemd_cgroup(POD_A, CID_B)),
        (
            "A's terminated container",
            systemd_cgroup(POD_A, CID_A_DONE),
        ),
        ("an unlisted container", systemd_cgroup(POD_A, CID_STRAY)),
        (
            "a plain docker container",
            format!("0::/system.slice/docker-{CID_STRAY}.scope\n"),
        ),
        (
            "a user's own cgroup named like pod A",
            format!(
                "0::/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods/pod{POD_A}/{CID_A}\n"
            ),
        ),
    ] {
        let got = caller_in(&l.socket, proc_root.path(), &cgroup).await;
        match got {
            Fetched::Refused(code, _) => {
                assert_eq!(code, tonic::Code::PermissionDenied as i32, "{what}")
            }
            other => panic!("{what}: got {other:?}"),
        }
    }

    // The agent asked the kubelet with its token, verifying the kubelet's certificate.
    assert!(kubelet.requests.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert_eq!(
        kubelet
            .unauthorized
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    agent.stop().await;
}
