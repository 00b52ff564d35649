//! Another uid on the server's host (issue 8, finding 11): the admin socket, `data_dir` and
//! the SQLite database must never be reachable by it, and the database password must never
//! reach the log it may read.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::process::Stdio;
use std::time::Duration;

use signet_tests::{Server, ServerOpts, bin};
use tokio::io::{AsyncBufReadExt, BufReader};

fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// `data_dir` created 0755 beforehand (as `mkdir` does): the server forces it to 0700; the
/// admin socket is 0600 from the moment it exists; signet.db, its -wal/-shm and the
/// key-encryption key are 0600. The admin socket still works for its owner.
#[tokio::test]
async fn data_dir_admin_socket_and_database_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    // An existing database file with a world-readable mode is tightened too.
    std::fs::write(data.join("signet.db"), b"").unwrap();
    std::fs::set_permissions(
        data.join("signet.db"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let server = Server::start(ServerOpts {
        data_dir: Some(data.clone()),
        ..ServerOpts::default()
    })
    .await;
    assert_eq!(mode(&data), 0o700);
    let sock = server.admin_socket();
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(mode(&sock), 0o600);
    for name in ["signet.db", "signet.db-wal", "signet.db-shm", "kek"] {
        let p = data.join(name);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{name}");
        } else {
            assert_ne!(name, "signet.db");
        }
    }
    // Nothing else was left in data_dir (no staging directory).
    let mut names: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".admin-sock"))
        .collect();
    names.sort();
    assert!(names.is_empty(), "{names:?}");
    // The owner's admin socket works.
    assert!(server.signetctl(&["ledger", "verify"]).status.success());
}

/// A data_dir owned by another uid is refused at start-up, saying so (needs root to chown;
/// skipped otherwise).
#[tokio::test]
async fn a_data_dir_owned_by_another_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    if std::os::unix::fs::chown(&data, Some(65534), Some(65534)).is_err() {
        eprintln!("SKIPPED: chown needs root");
        return;
    }
    assert_eq!(std::fs::metadata(&data).unwrap().uid(), 65534);
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(bin("signet-server"))
            .args(["--data-dir", data.to_str().unwrap()])
            .env("SIGNET_LISTEN", "127.0.0.1:0")
            .env("SIGNET_HTTP_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output(),
    )
    .await
    .expect("the server neither started nor refused")
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("owned by uid 65534"), "{err}");
    assert!(!data.join("admin.sock").exists());
}

/// The database URL's password, in the userinfo (containing `@`) or as a `password=` query
/// parameter, never reaches the log, even while the server retries an unreachable database.
#[tokio::test]
async fn database_passwords_never_reach_the_log() {
    for url in [
        "postgres://signet:s3cr@t@127.0.0.1:1/signet",
        "postgres://signet@127.0.0.1:1/signet?password=s3cr@t&sslmode=disable",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(bin("signet-server"))
            .args(["--data-dir", dir.path().join("d").to_str().unwrap()])
            .env("SIGNET_DATABASE_URL", url)
            .env("SIGNET_DATABASE__ACQUIRE_TIMEOUT", "200ms")
            .env("SIGNET_LISTEN", "127.0.0.1:0")
            .env("SIGNET_HTTP_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Read the log until the server has said twice that it retries, then stop it.
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut log = String::new();
        let mut retries = 0;
        let read = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(l)) = lines.next_line().await {
                retries += usize::from(l.contains("database unavailable"));
                log.push_str(&l);
                log.push('\n');
                if retries == 2 {
                    return;
                }
            }
        })
        .await;
        child.start_kill().unwrap();
        let _ = child.wait().await;
        assert!(read.is_ok(), "{url}: no retries logged within 30 s: {log}");
        assert!(log.contains("database unavailable"), "{url}: {log}");
        assert!(!log.contains("s3cr"), "{url}: password in the log: {log}");
        assert!(
            log.contains("127.0.0.1:1"),
            "{url}: the host is still named: {log}"
        );
    }
}
