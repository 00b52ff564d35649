//! The `files` sink: the chain, key and bundle as PEM files in a directory.
//!
//! # What a reader can rely on
//!
//! Files are never rewritten in place (spiffe-helper's torn-pair bug). Each delivery goes to a
//! fresh generation directory, `..signet-<n>`, whose files are written, fsynced and given
//! their modes (key 0600, certificates 0644) and owner before anything visible changes. Then
//! one `rename(2)` of a symlink switches `..data` to the new generation, and the directory is
//! fsynced. The visible names (`cert-chain.pem`, `key.pem`, …) are symlinks to
//! `..data/<name>` (the layout of Kubernetes' projected volumes), so **all three files switch
//! together, in one atomic step**:
//!
//! - a reader never sees a partly written file;
//! - a reader that opens the key and the certificate while no rotation happens in between gets
//!   a matching pair; one that resolves `..data` once (or reloads on our signal, which is sent
//!   after the switch) always does. A reader whose two `open`s straddle the switch instant can
//!   still pair an old file with a new one — no multi-file scheme can prevent that without the
//!   reader's help — but the window is one rename, not a rewrite.
//!
//! If the directory cannot be written, the error names the sink and the previous generation
//! stays in place and visible.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{FileLayout, FilesSinkConfig};
use crate::sinks::{Delivered, Sink, SinkError};

const DATA_LINK: &str = "..data";
const GEN_PREFIX: &str = "..signet-";

/// File names of a layout: (chain, key, bundle).
pub fn layout_names(layout: FileLayout) -> [&'static str; 3] {
    match layout {
        FileLayout::Istio => ["cert-chain.pem", "key.pem", "root-cert.pem"],
        FileLayout::SpiffeHelper => ["svid.pem", "svid_key.pem", "svid_bundle.pem"],
        FileLayout::Tls => ["tls.crt", "tls.key", "ca.crt"],
    }
}

pub struct FilesSink(Arc<Inner>);

struct Inner {
    name: String,
    cfg: FilesSinkConfig,
    counter: AtomicU64,
}

impl FilesSink {
    pub fn new(name: &str, cfg: FilesSinkConfig) -> Self {
        Self(Arc::new(Inner {
            name: name.to_owned(),
            cfg,
            counter: AtomicU64::new(0),
        }))
    }
}

impl Inner {
    fn err(&self, what: &str, path: &Path, e: std::io::Error) -> SinkError {
        SinkError::new(&self.name, format!("{what} {}: {e}", path.display()))
    }

    fn generation_name(&self) -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{GEN_PREFIX}{nanos}-{}-{n}", std::process::id())
    }

    /// Writes a new generation and switches to it. Blocking.
    fn write_generation(&self, files: [(&str, Vec<u8>, u32); 3]) -> Result<(), SinkError> {
        let dir = &self.cfg.directory;
        let gen_name = self.generation_name();
        let gen_dir = dir.join(&gen_name);
        std::fs::create_dir(&gen_dir).map_err(|e| self.err("cannot create", &gen_dir, e))?;
        let result = self.fill_and_switch(dir, &gen_name, &gen_dir, &files);
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&gen_dir);
        }
        result
    }

    fn fill_and_switch(
        &self,
        dir: &Path,
        gen_name: &str,
        gen_dir: &Path,
        files: &[(&str, Vec<u8>, u32); 3],
    ) -> Result<(), SinkError> {
        std::fs::set_permissions(gen_dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| self.err("cannot set mode of", gen_dir, e))?;
        for (name, content, mode) in files {
            let path = gen_dir.join(name);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(*mode)
                .open(&path)
                .map_err(|e| self.err("cannot create", &path, e))?;
            // The mode given to open() is masked by the umask; set it exactly.
            f.set_permissions(std::fs::Permissions::from_mode(*mode))
                .map_err(|e| self.err("cannot set mode of", &path, e))?;
            f.write_all(content)
                .and_then(|()| f.sync_all())
                .map_err(|e| self.err("cannot write", &path, e))?;
            if self.cfg.owner_uid.is_some() || self.cfg.owner_gid.is_some() {
                std::os::unix::fs::chown(&path, self.cfg.owner_uid, self.cfg.owner_gid)
                    .map_err(|e| self.err("cannot chown", &path, e))?;
            }
        }
        sync_dir(gen_dir).map_err(|e| self.err("cannot sync", gen_dir, e))?;

        // Visible names point into `..data`, once and for all. Done before the switch so a
        // failure here leaves the previous generation fully in place.
        for (name, _, _) in files {
            let visible = dir.join(name);
            let target = Path::new(DATA_LINK).join(name);
            if std::fs::read_link(&visible).ok().as_deref() != Some(target.as_path()) {
                let tmp = dir.join(format!(".{name}.tmp-{gen_name}"));
                std::os::unix::fs::symlink(&target, &tmp)
                    .and_then(|()| std::fs::rename(&tmp, &visible))
                    .map_err(|e| {
                        let _ = std::fs::remove_file(&tmp);
                        self.err("cannot link", &visible, e)
                    })?;
            }
        }
        // The switch: a new symlink renamed over `..data`.
        let tmp_link = dir.join(format!("{DATA_LINK}_tmp-{gen_name}"));
        std::os::unix::fs::symlink(gen_name, &tmp_link)
            .map_err(|e| self.err("cannot create", &tmp_link, e))?;
        let data = dir.join(DATA_LINK);
        let previous = std::fs::read_link(&data).ok();
        if let Err(e) = std::fs::rename(&tmp_link, &data) {
            let _ = std::fs::remove_file(&tmp_link);
            return Err(self.err("cannot switch", &data, e));
        }
        // The switch is done: from here on, never fail (the caller would remove the
        // generation that is now current).
        if let Err(e) = sync_dir(dir) {
            tracing::warn!(sink = %self.name, dir = %dir.display(), error = %e, "cannot sync directory after switch");
        }
        // Old generations go only after the switch is durable.
        if let Some(prev) = previous
            && prev.as_os_str() != gen_name
        {
            let _ = std::fs::remove_dir_all(dir.join(prev));
        }
        Ok(())
    }

    async fn reload(&self) -> Result<(), SinkError> {
        if let (Some(sig), Some(pid_file)) = (&self.cfg.reload_signal, &self.cfg.pid_file) {
            let text = tokio::fs::read_to_string(pid_file)
                .await
                .map_err(|e| self.err("cannot read pid file", pid_file, e))?;
            let pid: u32 = text.trim().parse().ok().filter(|p| *p > 1).ok_or_else(|| {
                SinkError::new(
                    &self.name,
                    format!("pid file {} holds no valid pid", pid_file.display()),
                )
            })?;
            run(&self.name, "kill", &["-s", sig, &pid.to_string()]).await?;
        }
        if let Some(cmd) = &self.cfg.reload_command
            && let Some((prog, args)) = cmd.split_first()
        {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run(&self.name, prog, &args).await?;
        }
        Ok(())
    }
}

async fn run(sink: &str, prog: &str, args: &[&str]) -> Result<(), SinkError> {
    let out = tokio::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| SinkError::new(sink, format!("cannot run {prog}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(SinkError::new(
            sink,
            format!("{prog} failed ({}): {}", out.status, stderr.trim()),
        ))
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[async_trait::async_trait]
impl Sink for FilesSink {
    fn name(&self) -> &str {
        &self.0.name
    }

    async fn deliver(&self, svid: &Delivered) -> Result<(), SinkError> {
        let [chain, key, bundle] = layout_names(self.0.cfg.layout);
        let files = [
            (chain, svid.chain_pem().into_bytes(), 0o644),
            (key, svid.key_pem().into_bytes(), 0o600),
            (bundle, svid.bundle_pem().into_bytes(), 0o644),
        ];
        let inner = self.0.clone();
        tokio::task::spawn_blocking(move || inner.write_generation(files))
            .await
            .map_err(|e| SinkError::new(&self.0.name, format!("writer task failed: {e}")))??;
        tracing::info!(sink = %self.0.name, spiffe_id = %svid.spiffe_id, dir = %self.0.cfg.directory.display(), "delivered");
        self.0.reload().await
    }

    async fn remove(&self) -> Result<(), SinkError> {
        let dir: PathBuf = self.0.cfg.directory.clone();
        let names = layout_names(self.0.cfg.layout);
        let sink = self.0.name.clone();
        tokio::task::spawn_blocking(move || {
            for name in names {
                let p = dir.join(name);
                // Only our symlinks; a regular file someone else put there stays.
                if std::fs::read_link(&p).ok() == Some(Path::new(DATA_LINK).join(name)) {
                    std::fs::remove_file(&p).map_err(|e| {
                        SinkError::new(&sink, format!("cannot remove {}: {e}", p.display()))
                    })?;
                }
            }
            let data = dir.join(DATA_LINK);
            if let Ok(target) = std::fs::read_link(&data) {
                std::fs::remove_file(&data).map_err(|e| {
                    SinkError::new(&sink, format!("cannot remove {}: {e}", data.display()))
                })?;
                if target.to_string_lossy().starts_with(GEN_PREFIX) {
                    let _ = std::fs::remove_dir_all(dir.join(target));
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| SinkError::new(&self.0.name, format!("remover task failed: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn cfg(dir: &Path, layout: FileLayout) -> FilesSinkConfig {
        FilesSinkConfig {
            directory: dir.to_owned(),
            layout,
            owner_uid: None,
            owner_gid: None,
            reload_signal: None,
            pid_file: None,
            reload_command: None,
        }
    }

    fn svid(n: u8) -> Delivered {
        Delivered {
            spiffe_id: "spiffe://example.org/web".into(),
            chain_der: vec![vec![n, 1], vec![n, 2]],
            key_pkcs8_der: vec![n; 8],
            bundle_der: vec![vec![n, 3]],
        }
    }

    fn read_pem(p: &Path) -> Vec<Vec<u8>> {
        let text = std::fs::read(p).expect("read");
        pem::parse_many(text)
            .expect("pem")
            .into_iter()
            .map(|p| p.into_contents())
            .collect()
    }

    #[tokio::test]
    async fn writes_each_layout_with_modes() {
        for layout in [FileLayout::Istio, FileLayout::SpiffeHelper, FileLayout::Tls] {
            let dir = tempfile::tempdir().expect("tempdir");
            let sink = FilesSink::new("web", cfg(dir.path(), layout));
            sink.deliver(&svid(7)).await.expect("deliver");
            let [chain, key, bundle] = layout_names(layout);
            assert_eq!(read_pem(&dir.path().join(chain)), [vec![7, 1], vec![7, 2]]);
            assert_eq!(read_pem(&dir.path().join(key)), [vec![7; 8]]);
            assert_eq!(read_pem(&dir.path().join(bundle)), [vec![7, 3]]);
            let mode =
                |n: &str| std::fs::metadata(dir.path().join(n)).expect("meta").mode() & 0o777;
            assert_eq!(mode(key), 0o600);
            assert_eq!(mode(chain), 0o644);
            assert_eq!(mode(bundle), 0o644);
        }
    }

    #[tokio::test]
    async fn owner_is_set_when_configured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = std::fs::metadata(dir.path()).expect("meta");
        // Only root may give files away; others can still chown to themselves.
        let (uid, gid) = if me.uid() == 0 {
            (65534, 65534)
        } else {
            (me.uid(), me.gid())
        };
        let mut c = cfg(dir.path(), FileLayout::Tls);
        c.owner_uid = Some(uid);
        c.owner_gid = Some(gid);
        FilesSink::new("web", c)
            .deliver(&svid(1))
            .await
            .expect("deliver");
        for n in ["tls.crt", "tls.key", "ca.crt"] {
            let m = std::fs::metadata(dir.path().join(n)).expect("meta");
            assert_eq!((m.uid(), m.gid()), (uid, gid), "{n}");
        }
    }

    #[tokio::test]
    async fn rotation_switches_all_files_and_drops_old_generation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FilesSink::new("web", cfg(dir.path(), FileLayout::Tls));
        sink.deliver(&svid(1)).await.expect("first");
        sink.deliver(&svid(2)).await.expect("second");
        assert_eq!(read_pem(&dir.path().join("tls.key")), [vec![2; 8]]);
        assert_eq!(read_pem(&dir.path().join("tls.crt"))[0], vec![2, 1]);
        let gens: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(GEN_PREFIX))
            .collect();
        assert_eq!(gens.len(), 1);
    }

    #[tokio::test]
    async fn unwritable_directory_names_sink_and_keeps_previous_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FilesSink::new("web", cfg(dir.path(), FileLayout::Istio));
        sink.deliver(&svid(1)).await.expect("first");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555))
            .expect("chmod");
        let result = sink.deliver(&svid(2)).await;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        // Root ignores directory modes; only check the failure where it can happen.
        let current = if result.is_ok() { 2 } else { 1 };
        if let Err(err) = result {
            assert!(err.to_string().contains("\"web\""), "{err}");
            assert!(!err.to_string().contains("PRIVATE"), "{err}");
            assert_eq!(read_pem(&dir.path().join("key.pem")), [vec![1; 8]]);
            assert_eq!(read_pem(&dir.path().join("cert-chain.pem"))[0], vec![1, 1]);
        }
        // A failure that root cannot override: a directory in the way of a visible name.
        std::fs::remove_file(dir.path().join("root-cert.pem")).expect("rm");
        std::fs::create_dir_all(dir.path().join("root-cert.pem/x")).expect("mkdir");
        let err = sink.deliver(&svid(3)).await.expect_err("blocked");
        assert!(err.to_string().contains("\"web\""), "{err}");
        assert_eq!(read_pem(&dir.path().join("key.pem")), [vec![current; 8]]);
        assert_eq!(
            read_pem(&dir.path().join("cert-chain.pem"))[0],
            vec![current, 1]
        );
        let gens = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(GEN_PREFIX))
            .count();
        assert_eq!(gens, 1, "the failed generation is cleaned up");

        let missing = FilesSink::new("gone", cfg(&dir.path().join("nope"), FileLayout::Istio));
        let err = missing.deliver(&svid(1)).await.expect_err("no directory");
        assert!(err.to_string().contains("\"gone\""), "{err}");
    }

    #[tokio::test]
    async fn remove_deletes_only_what_we_wrote() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("other.txt"), b"keep").expect("write");
        let sink = FilesSink::new("web", cfg(dir.path(), FileLayout::Istio));
        sink.deliver(&svid(1)).await.expect("deliver");
        sink.remove().await.expect("remove");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["other.txt"]);
    }

    #[tokio::test]
    async fn reload_command_runs_after_delivery_and_failure_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("reloaded");
        let mut c = cfg(dir.path(), FileLayout::Istio);
        c.reload_command = Some(vec!["touch".into(), marker.display().to_string()]);
        FilesSink::new("web", c.clone())
            .deliver(&svid(1))
            .await
            .expect("deliver");
        assert!(marker.exists());
        c.reload_command = Some(vec!["false".into()]);
        let err = FilesSink::new("web", c)
            .deliver(&svid(2))
            .await
            .expect_err("fails");
        assert!(err.to_string().contains("false failed"), "{err}");
    }

    #[tokio::test]
    async fn reload_signal_reaches_the_pid_in_the_pid_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid_file = dir.path().join("app.pid");
        std::fs::write(&pid_file, format!("{}\n", child.id().expect("pid"))).expect("write");
        let mut c = cfg(dir.path(), FileLayout::Istio);
        c.reload_signal = Some("TERM".into());
        c.pid_file = Some(pid_file.clone());
        FilesSink::new("web", c.clone())
            .deliver(&svid(1))
            .await
            .expect("deliver");
        let status = child.wait().await.expect("wait");
        assert!(!status.success());
        std::fs::write(&pid_file, "garbage").expect("write");
        let err = FilesSink::new("web", c)
            .deliver(&svid(2))
            .await
            .expect_err("bad pid");
        assert!(err.to_string().contains("no valid pid"), "{err}");
    }
}
