//! A workload that can write its own files-sink directory attacks the agent (root): it plants
//! links where the agent used to follow them (`..data`, the generation directory, a link named
//! like a generation, the pid file) and names other processes in its pid file. Against the
//! real agent and server: after the next rotation every victim is intact (content, mode,
//! owner), no signal reached a process that is not the sink owner's, the sink reports the
//! problem (logs, `/readyz`, metrics), and the same sinks, clean, keep working. A directory
//! that other users can write is refused unless the sink allows it, and so is one whose
//! parent the workload owns (it could swap the directory itself for a link).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use signet_tests::TokenIssuer;

use crate::agent::{create_entry, create_token, eventually, fetch_svid};
use crate::pg_server;
use crate::sink_harness::{RunningAgent, agent_files, is_root, leaf_serial, next_delivery};

/// The "workload": an unprivileged uid that owns its sink directories.
const WORKLOAD_UID: u32 = 65534;

fn mkdir(p: &Path, mode: u32, uid: u32) -> PathBuf {
    std::fs::create_dir_all(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
    p.to_owned()
}

/// A victim directory owned by root, mode 0700, holding a file.
fn victim(p: &Path) -> PathBuf {
    let v = mkdir(p, 0o700, 0);
    std::fs::write(v.join("precious"), b"keep").unwrap();
    std::fs::set_permissions(v.join("precious"), std::fs::Permissions::from_mode(0o600)).unwrap();
    v
}

fn assert_intact(v: &Path) {
    assert_eq!(
        std::fs::read(v.join("precious")).unwrap(),
        b"keep",
        "{}",
        v.display()
    );
    let m = std::fs::metadata(v).unwrap();
    assert_eq!(
        (m.mode() & 0o7777, m.uid()),
        (0o700, 0),
        "{} unchanged",
        v.display()
    );
    let f = std::fs::metadata(v.join("precious")).unwrap();
    assert_eq!((f.mode() & 0o7777, f.uid()), (0o600, 0));
}

/// A process of `uid` that survives SIGHUP and appends a line to `log` for each one.
fn hup_counter(uid: u32, log: &Path) -> tokio::process::Child {
    tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "trap 'echo hup >> {}' HUP; while :; do sleep 0.1; done",
            log.display()
        ))
        .uid(uid)
        .gid(uid)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn hups(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Writes `pid` to `file`, owned by `uid`, mode 0644.
fn pid_file(file: &Path, pid: u32, uid: u32) {
    std::fs::write(file, format!("{pid}\n")).unwrap();
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(file, Some(uid), Some(uid)).unwrap();
}

fn files_sink(name: &str, dir: &Path, extra: &str) -> String {
    format!(
        "[[sinks]]\nname = \"{name}\"\nkind = \"files\"\nspiffe_id = \"spiffe://example.org/linked\"\n\
         directory = \"{}\"\nlayout = \"tls\"\n{extra}\n",
        dir.display()
    )
}

#[tokio::test]
async fn planted_links_and_foreign_pids_are_refused_and_clean_sinks_keep_working() {
    if !is_root() {
        eprintln!("skipped: acting as another uid on the node needs root");
        return;
    }
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let token = create_token(&server, "links");
    create_entry(
        &server,
        "spiffe://example.org/linked",
        "links",
        &["--ttl", "4s"],
    );

    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    std::fs::set_permissions(t, std::fs::Permissions::from_mode(0o755)).unwrap();
    let w = WORKLOAD_UID;
    let clean = mkdir(&t.join("clean"), 0o755, w);
    let data_link = mkdir(&t.join("data-link"), 0o755, w);
    let gen_link = mkdir(&t.join("gen-link"), 0o755, w);
    let shared = mkdir(&t.join("shared"), 0o777, w);
    let shared_ok = mkdir(&t.join("shared-ok"), 0o777, w);
    let victim_a = victim(&t.join("victim-a"));
    let victim_b = victim(&t.join("victim-b"));
    // A sink directory whose parent the workload owns: it can swap the directory itself for a
    // link to a victim that holds a file named like the layout's.
    let parent = mkdir(&t.join("workload-home"), 0o755, w);
    let swapped = parent.join("certs");
    let victim_c = victim(&t.join("victim-c"));
    std::fs::write(victim_c.join("tls.crt"), b"keep").unwrap();
    std::os::unix::fs::symlink(&victim_c, &swapped).unwrap();

    // The reload signal: the workload's own process gets it; nothing else does.
    let pid_ok = mkdir(&t.join("pid-ok"), 0o755, w);
    let pid_root = mkdir(&t.join("pid-root"), 0o755, w);
    let pid_link = mkdir(&t.join("pid-link"), 0o755, w);
    let pid_one = mkdir(&t.join("pid-one"), 0o755, w);
    let logs = mkdir(&t.join("hup-logs"), 0o777, 0);
    let mut app = hup_counter(w, &logs.join("app"));
    let mut root_victim = hup_counter(0, &logs.join("root-victim"));
    let mut linked_victim = hup_counter(w, &logs.join("linked-victim"));
    pid_file(&pid_ok.join("app.pid"), app.id().unwrap(), w);
    // A root process named in the workload's pid file.
    pid_file(&pid_root.join("app.pid"), root_victim.id().unwrap(), w);
    // A link to a pid file the workload does not control, naming another of its uid's
    // processes: the link itself is refused.
    let elsewhere = t.join("elsewhere.pid");
    pid_file(&elsewhere, linked_victim.id().unwrap(), 0);
    std::os::unix::fs::symlink(&elsewhere, pid_link.join("app.pid")).unwrap();
    pid_file(&pid_one.join("app.pid"), 1, w);

    let hup = |d: &Path| {
        format!(
            "reload_signal = \"HUP\"\npid_file = \"{}\"\n",
            d.join("app.pid").display()
        )
    };
    let owner = format!("owner_uid = {w}\nowner_gid = {w}\n");
    let sinks = [
        files_sink("clean", &clean, ""),
        files_sink("data-link", &data_link, &owner),
        files_sink("gen-link", &gen_link, &owner),
        files_sink("shared", &shared, ""),
        files_sink("parent-swap", &swapped, ""),
        files_sink("shared-ok", &shared_ok, "allow_shared_directory = true"),
        files_sink("pid-ok", &pid_ok, &hup(&pid_ok)),
        files_sink("pid-root", &pid_root, &hup(&pid_root)),
        files_sink("pid-link", &pid_link, &hup(&pid_link)),
        files_sink("pid-one", &pid_one, &hup(&pid_one)),
    ]
    .concat();
    let files = agent_files(&server, &token, "", &sinks);
    let agent = RunningAgent::start(&files.config).await;

    // First deliveries.
    let crt = |d: &Path| d.join("tls.crt");
    let first_a = next_delivery(30, "data-link delivered", &crt(&data_link), None).await;
    let first_b = next_delivery(10, "gen-link delivered", &crt(&gen_link), None).await;
    next_delivery(10, "shared-ok delivered", &crt(&shared_ok), None).await;
    let first_clean = next_delivery(10, "clean delivered", &crt(&clean), None).await;
    // The owner's process got its signal.
    eventually(10, "the workload's process signalled", || async {
        (hups(&logs.join("app")) >= 1).then_some(())
    })
    .await;
    // Files are the workload's (owner_uid), the key private.
    let key = std::fs::metadata(data_link.join("tls.key")).unwrap();
    assert_eq!((key.uid(), key.mode() & 0o777), (w, 0o600));

    // The attacks, as uid 65534 could do them in its own directories.
    let data = data_link.join("..data");
    std::fs::remove_file(&data).unwrap();
    std::os::unix::fs::symlink(&victim_a, &data).unwrap();
    let current = std::fs::read_link(gen_link.join("..data")).unwrap();
    let current = gen_link.join(current);
    std::fs::remove_dir_all(&current).unwrap();
    std::os::unix::fs::symlink(&victim_b, &current).unwrap();
    let named_like_a_generation = gen_link.join("..signet-1-2-3");
    std::os::unix::fs::symlink(&victim_b, &named_like_a_generation).unwrap();
    // Links named like the federated bundle files the agent removes when a trust domain is no
    // longer federated (it scans `federated-*` at every delivery): one to a victim, one
    // pointing into `..data` as the agent's own do.
    let planted_federated = clean.join("federated-evil.test.pem");
    std::os::unix::fs::symlink(victim_b.join("precious"), &planted_federated).unwrap();
    let mimic = clean.join("federated-mimic.test.pem");
    std::os::unix::fs::symlink("..data/federated-mimic.test.pem", &mimic).unwrap();

    // The next rotation goes through both directories.
    next_delivery(20, "data-link rotated", &crt(&data_link), Some(&first_a)).await;
    next_delivery(20, "gen-link rotated", &crt(&gen_link), Some(&first_b)).await;
    next_delivery(20, "clean rotated", &crt(&clean), Some(&first_clean)).await;
    // The link to a victim is not the agent's: left as it is, never followed.
    assert_eq!(
        std::fs::read_link(&planted_federated).unwrap(),
        victim_b.join("precious")
    );
    // The one shaped like the agent's own (a dangling link in the workload's directory) is
    // removed as a link.
    assert!(std::fs::symlink_metadata(&mimic).is_err());
    assert_intact(&victim_a);
    assert_intact(&victim_b);
    assert_intact(&victim_c);
    assert_eq!(std::fs::read(victim_c.join("tls.crt")).unwrap(), b"keep");
    assert_eq!(
        std::fs::read_dir(&victim_c).unwrap().count(),
        2,
        "nothing added"
    );
    assert!(
        std::fs::symlink_metadata(&named_like_a_generation).is_err(),
        "the planted link was removed as a link"
    );
    assert!(std::fs::symlink_metadata(&current).is_err());
    // The new files are in a real directory of the agent's.
    let gen_now = gen_link.join(std::fs::read_link(gen_link.join("..data")).unwrap());
    let m = std::fs::symlink_metadata(&gen_now).unwrap();
    assert!(m.is_dir() && m.uid() == 0, "{m:?}");

    // Signals: the root process and the one behind the link got nothing; none died.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hups(&logs.join("root-victim")), 0);
    assert_eq!(hups(&logs.join("linked-victim")), 0);
    assert!(root_victim.try_wait().unwrap().is_none(), "alive");
    assert!(linked_victim.try_wait().unwrap().is_none(), "alive");
    assert!(app.try_wait().unwrap().is_none(), "alive");

    // A shared directory got nothing.
    assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 0);

    // The sink reports it: logs, /readyz detail, metrics.
    eventually(10, "the planted link in the logs", || async {
        agent
            .logged("is not a generation of this sink")
            .then_some(())
    })
    .await;
    let (code, body) = agent.readyz().await;
    assert_eq!(code, 200, "{body}");
    for (sink, why) in [
        ("shared", "writable by its group or by other users"),
        ("parent-swap", "is not safe"),
        ("pid-root", "not as the sink's owner"),
        ("pid-link", "symbolic link"),
        ("pid-one", "pid 1"),
    ] {
        assert!(
            body.lines()
                .any(|l| l.contains(&format!("sink \"{sink}\"")) && l.contains(why)),
            "{sink}: {body}"
        );
    }
    assert!(!body.contains("sink \"clean\""), "{body}");
    assert!(!body.contains("sink \"pid-ok\": failing"), "{body}");
    for sink in ["shared", "parent-swap", "pid-root", "pid-link", "pid-one"] {
        let refused = agent
            .metric(
                "signet_agent_sink_failures_total",
                &[&format!("sink=\"{sink}\""), "reason=\"refused\""],
            )
            .await;
        assert!(refused.unwrap_or(0.0) >= 1.0, "{sink}");
    }
    for sink in ["data-link", "gen-link"] {
        let warned = agent
            .metric(
                "signet_agent_sink_warnings_total",
                &[&format!("sink=\"{sink}\"")],
            )
            .await;
        assert!(warned.unwrap_or(0.0) >= 1.0, "{sink}");
    }

    // The clean sink and the Workload API never stopped.
    assert!(leaf_serial(&crt(&clean)).is_some());
    let (id, _) = eventually(10, "the Workload API", || fetch_svid(&files.socket)).await;
    assert_eq!(id, "spiffe://example.org/linked");
    agent.stop().await;
    let _ = (
        app.kill().await,
        root_victim.kill().await,
        linked_victim.kill().await,
    );
}
