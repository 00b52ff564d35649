//! Start-up steps that touch the host: the private data directory, the database connection
//! (retried with [`signet_runtime::backoff`] while it is unavailable, and its URL redacted for
//! logs), the admin socket (0600 from the start).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use signet_runtime::backoff::Backoff;
use tokio::net::UnixListener;

use crate::store::{Store, StoreError};

/// Creates `data_dir` with mode 0700, or forces an existing one to 0700. Refuses a directory
/// owned by another user (whoever owns it can read the CA's key-encryption key and replace
/// the admin socket), or something that is not a directory.
pub(super) fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating data_dir {}", dir.display()))?;
    }
    // Not following a symlink: the directory itself must be ours.
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("reading data_dir {}", dir.display()))?;
    if !meta.is_dir() {
        bail!(
            "data_dir {} is not a directory{}",
            dir.display(),
            if meta.file_type().is_symlink() {
                " (it is a symlink: point data_dir at the real directory)"
            } else {
                ""
            }
        );
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        bail!(
            "data_dir {} is owned by uid {}, but signet-server runs as uid {me}: it holds the \
             CA's keys and admin socket, so it must belong to the server's own user \
             (chown it, or choose another data_dir)",
            dir.display(),
            meta.uid()
        );
    }
    if meta.permissions().mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod 0700 data_dir {}", dir.display()))?;
        tracing::info!(data_dir = %dir.display(), "data_dir mode set to 0700");
    }
    Ok(())
}

/// The wait between attempts while the database is unavailable at start-up: 250 ms, doubling,
/// at most 10 s. No jitter: one server waits for its database.
const CONNECT_RETRY: Backoff = Backoff::exact(Duration::from_millis(250), Duration::from_secs(10));

/// Connects to the database, retrying while it is unavailable (each failure logged and told to
/// `status`, for `/readyz`, with its real cause: see `store::postgres`); any other failure
/// (authentication, no such database, a bad URL) stops the start.
pub(super) async fn connect_store(
    url: &str,
    db: &crate::config::DatabaseConfig,
    status: &super::starting::StartupStatus,
) -> anyhow::Result<Arc<dyn Store>> {
    let mut failures = 0;
    let database = redact_url(url);
    status.set(format!("connecting to the database {database}"));
    loop {
        match crate::store::connect_with(url, db).await {
            Ok(s) => return Ok(s),
            Err(StoreError::Unavailable(e)) => {
                let delay = CONNECT_RETRY.delay(failures, 0.0);
                failures = failures.saturating_add(1);
                tracing::warn!(%database, error = %e, retry_in = ?delay, attempts = failures, "database unavailable; retrying");
                status.set(format!(
                    "waiting for the database {database} ({failures} attempts): {e}"
                ));
                tokio::time::sleep(delay).await;
            }
            Err(e) => bail!("database {database}: {e}"),
        }
    }
}

/// The URL with its secrets replaced by `…`: the password in the userinfo
/// (`postgres://user:secret@host/db` -> `postgres://user:…@host/db`, a password containing `@`
/// included) and `password` / `sslpassword` query parameters. The URL is read the way sqlx
/// reads it (the `url` crate, WHATWG rules); one that does not parse is hidden entirely.
pub fn redact_url(raw: &str) -> String {
    // SQLite URLs carry no credentials, but may carry parameters.
    if raw.starts_with("sqlite:") {
        return redact_query(raw);
    }
    let Ok(u) = url::Url::parse(raw) else {
        let scheme = raw.split_once(':').map_or("", |(s, _)| s);
        return format!("{scheme}://… (unparsable URL hidden)");
    };
    let mut out = format!("{}://", u.scheme());
    if !u.username().is_empty() || u.password().is_some() {
        out.push_str(u.username());
        if u.password().is_some() {
            out.push_str(":…");
        }
        out.push('@');
    }
    out.push_str(u.host_str().unwrap_or_default());
    if let Some(port) = u.port() {
        out.push_str(&format!(":{port}"));
    }
    out.push_str(u.path());
    if let Some(q) = u.query() {
        out.push_str(&redact_query(&format!("?{q}")));
    }
    out
}

/// Hides the values of secret query parameters.
fn redact_query(s: &str) -> String {
    let Some((base, query)) = s.split_once('?') else {
        return s.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|kv| {
            let key = kv.split_once('=').map_or(kv, |(k, _)| k);
            let secret = ["password", "sslpassword"]
                .iter()
                .any(|k| key.eq_ignore_ascii_case(k));
            if secret && kv.contains('=') {
                format!("{key}=…")
            } else {
                kv.to_owned()
            }
        })
        .collect();
    format!("{base}?{}", params.join("&"))
}

/// Binds the admin socket so that no other user can ever connect to it: it is created inside
/// a fresh private directory (mode 0700, ours), set to 0600 there, and only then renamed into
/// place. There is no moment at which the socket is reachable with a wider mode (chmod after
/// bind leaves such a window, and a connection made in it keeps working).
pub(super) fn bind_admin_socket(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if path.exists() {
        // A socket left by a previous run that did not shut down cleanly.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "admin socket {} is in use: is another signet-server running with this data_dir?",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale admin socket {}", path.display()))?;
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut random = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random)
        .map_err(|_| anyhow!("no randomness for the admin socket's staging directory"))?;
    let staging = parent.join(format!(".admin-sock-{}", hex::encode(random)));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .with_context(|| format!("creating {}", staging.display()))?;
    let result = (|| {
        let staged = staging.join("admin.sock");
        let listener = UnixListener::bind(&staged)
            .with_context(|| format!("binding admin socket {}", staged.display()))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 0600 {}", staged.display()))?;
        std::fs::rename(&staged, path)
            .with_context(|| format!("moving the admin socket into place at {}", path.display()))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_retried_after_250ms_doubling_to_10s() {
        let ms = Duration::from_millis;
        let waits: Vec<Duration> = (0..9).map(|n| CONNECT_RETRY.delay(n, 0.7)).collect();
        assert_eq!(
            waits,
            [
                ms(250),
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                ms(10_000),
                ms(10_000),
                ms(10_000)
            ]
        );
        assert_eq!(CONNECT_RETRY.delay(u32::MAX, 0.0), ms(10_000));
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("postgres://signet:hunter2@db:5432/signet"),
            "postgres://signet:…@db:5432/signet"
        );
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
        assert_eq!(
            redact_url("postgres://signet@db/signet"),
            "postgres://signet@db/signet"
        );
    }

    #[test]
    fn passwords_in_query_parameters_are_redacted() {
        let r = redact_url("postgres://db/signet?user=signet&password=hunter2&sslmode=require");
        assert_eq!(
            r,
            "postgres://db/signet?user=signet&password=…&sslmode=require"
        );
        let r = redact_url("postgresql://u@db/x?PassWord=hunter2&sslpassword=k3y");
        assert_eq!(r, "postgresql://u@db/x?PassWord=…&sslpassword=…");
        assert!(!redact_url("sqlite:x.db?password=hunter2").contains("hunter2"));
    }

    #[test]
    fn passwords_containing_at_signs_are_redacted() {
        let r = redact_url("postgres://signet:p@ss@w0rd@db:5432/signet");
        assert_eq!(r, "postgres://signet:…@db:5432/signet");
        assert!(!r.contains("ss"), "{r}");
        let r = redact_url("postgres://signet:a:b@c@db/signet?password=x@y");
        assert_eq!(r, "postgres://signet:…@db/signet?password=…");
        // An @ in another query parameter keeps the host readable.
        let r = redact_url("postgres://u@127.0.0.1:1/x?password=s3cr@t&sslmode=disable");
        assert_eq!(r, "postgres://u@127.0.0.1:1/x?password=…&sslmode=disable");
        // Unparsable (a password with '/', '?' or '#' unescaped): hidden entirely.
        for bad in [
            "postgres://u:p/ss@db/x",
            "postgres://u:p?ss@db/x",
            "postgres://u:p#ss@db/x",
        ] {
            let r = redact_url(bad);
            assert!(!r.contains("ss"), "{bad}: {r}");
        }
        assert_eq!(
            redact_url("postgres://[::1]:5432/x"),
            "postgres://[::1]:5432/x"
        );
    }

    #[test]
    fn the_admin_socket_is_0600_from_the_start_and_nothing_is_left_behind() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let _l = bind_admin_socket(&path).unwrap();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert!(meta.file_type().is_socket());
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
            // Connectable at its final path.
            std::os::unix::net::UnixStream::connect(&path).unwrap();
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(names, ["admin.sock"]);
            // A second server on the same data_dir is refused, naming the socket.
            let err = bind_admin_socket(&path).unwrap_err().to_string();
            assert!(err.contains("in use"), "{err}");
        });
    }

    #[test]
    fn data_dir_is_forced_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&data).unwrap();
        let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        let fresh = dir.path().join("a/b");
        create_private_dir(&fresh).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        // A symlink is refused rather than followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        let err = create_private_dir(&link).unwrap_err().to_string();
        assert!(err.contains("symlink"), "{err}");
    }
}
