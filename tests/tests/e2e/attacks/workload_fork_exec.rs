//! A workload on the node tries to get another workload's SVID and key by making the agent
//! attest one process while another asks: connect, "fork" (hand the connection to a child),
//! exec the binary an entry allows by `unix:path` in the process that connected, and send
//! `FetchX509SVID` from the child on the inherited connection. The agent sees, in every chunk
//! it reads, which process wrote it (SCM_CREDENTIALS) and closes the connection; the allowed
//! binary asking for itself still gets its SVID. The same attack over Envoy SDS (the child
//! opens `StreamSecrets` for `default`) meets the same rule: SDS shares the socket's
//! per-message check.

use signet_tests::workload::{Fetched, probe_fetch_over, probe_path};
use signet_tests::*;
use tokio::io::AsyncBufReadExt;

use crate::agent::{Agent, create_token, eventually, my_uid, write_config};
use crate::pg_server;

#[tokio::test]
async fn fork_exec_child_on_the_inherited_connection_gets_nothing() {
    fork_exec_attack("workload").await;
}

#[tokio::test]
async fn fork_exec_child_gets_nothing_over_envoy_sds_either() {
    fork_exec_attack("sds").await;
}

async fn fork_exec_attack(api: &str) {
    let probe_fetch = |exe: Option<std::path::PathBuf>, socket: std::path::PathBuf| async move {
        probe_fetch_over(exe.as_deref(), &socket, api).await
    };
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let app = "spiffe://example.org/path-app";
    let token = create_token(&server, "fx1");
    let allowed = probe_path();
    let path_sel = format!("unix:path:{}", allowed.display());
    let uid_sel = format!("unix:uid:{}", my_uid());
    let out = server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        app,
        "--parent",
        "fx1",
        "--selector",
        &uid_sel,
        "--selector",
        &path_sel,
    ]);
    assert!(out.status.success(), "{out:?}");
    let l = write_config(&server, &token, app);
    let agent = Agent::start(&l.config);

    // The allowed binary asking for itself gets its SVID and key.
    let got = eventually(30, "the allowed binary's SVID", || async {
        match probe_fetch(None, l.socket.clone()).await {
            Fetched::Svids(ids, keys) if !ids.is_empty() => Some((ids, keys)),
            _ => None,
        }
    })
    .await;
    assert_eq!(got, (vec![app.to_owned()], 1));

    // The attacker: the same program under another path (so not allowed itself).
    let dir = tempfile::tempdir().unwrap();
    let attacker = dir.path().join("attacker");
    std::fs::copy(&allowed, &attacker).unwrap();
    // Asking for itself: refused, it is not the allowed binary.
    match probe_fetch(Some(attacker.clone()), l.socket.clone()).await {
        Fetched::Refused(code, _) => assert_eq!(code, tonic::Code::PermissionDenied as i32),
        other => panic!("the attacker binary got {other:?}"),
    }

    // The attack, several times (it is a race in an agent without the per-message check).
    for round in 0..3 {
        let mut parent = tokio::process::Command::new(&attacker)
            .env("WL_PROBE_API", api)
            .arg("fork-exec")
            .arg(&l.socket)
            .arg(&allowed)
            .args(["sleep", "20"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // The child prints its result on the stdout it shares with the parent.
        let mut lines = tokio::io::BufReader::new(parent.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
            .await
            .expect("the child answers")
            .unwrap()
            .expect("a line");
        let got = Fetched::parse(&line);
        // The parent really became the allowed binary before the child asked.
        let ppid = parent.id().unwrap();
        if let Ok(exe) = std::fs::read_link(format!("/proc/{ppid}/exe")) {
            assert_eq!(exe, allowed, "round {round}");
        }
        assert!(
            matches!(&got, Fetched::Refused(..)),
            "round {round}: the forked child got {got:?}"
        );
        assert!(got.ids().is_empty());
        let _ = parent.kill().await;
    }

    // And the legitimate caller still works after the attacks.
    assert_eq!(
        probe_fetch(None, l.socket.clone()).await,
        Fetched::Svids(vec![app.to_owned()], 1)
    );
    agent.stop().await;
}
