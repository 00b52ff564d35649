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
//!
//! # CRLs
//!
//! When the agent holds verified CRLs of its issuing CAs (see [`crate::revocation`]), every
//! layout also gets [`CRL_FILE`] (`crl.pem`: one PEM `X509 CRL` block per issuing CA key, as
//! `openssl verify -crl_check -CRLfile crl.pem` and nginx's `ssl_crl` read it), written in the
//! same generation as the certificates and switched with them. A delivery without CRLs
//! removes the `crl.pem` link the agent made.
//!
//! # A directory the workload can write
//!
//! The agent (often root) never follows a link it did not create and never works outside the
//! directory: every operation goes through [`super::safe_dir`] (descriptor-relative calls, one
//! path component per name, `O_NOFOLLOW`, modes and owners set through descriptors). Old
//! generations are removed only when `..data` names one by the agent's own naming
//! (`..signet-<n>-<n>-<n>`), and only as a real directory owned by the agent; a `..data`
//! pointing anywhere else is replaced, and whatever it pointed at is left untouched and
//! reported. A directory that its group or other users may write is refused (nothing is
//! written), and so is a path to it that a user other than root or the agent could redirect
//! (see [`super::safe_dir::open_trusted_dir`]), unless the sink sets
//! `allow_shared_directory = true`. The reload signal and
//! command are checked as [`super::reload`] describes.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{FileLayout, FilesSinkConfig};
use crate::sinks::reload;
use crate::sinks::safe_dir::{Component, DATA_LINK, GenerationName, OpenError, SinkDir};
use crate::sinks::{Applied, Delivered, Sink, SinkError};

use crate::signal::signal_by_name;

/// The CRL file every layout gets when there are CRLs.
pub const CRL_FILE: &str = "crl.pem";

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
    /// Held by the blocking writer. A write abandoned at its deadline (a hung filesystem) still
    /// holds it, and the next attempt fails at once instead of piling up blocked threads.
    busy: Mutex<()>,
}

/// A constant component (the layout names and `..data` are all single names).
fn comp(s: &str) -> Component<'_> {
    Component::new(s).unwrap_or_else(|| unreachable!("{s:?} is a constant single name"))
}

impl FilesSink {
    pub fn new(name: &str, cfg: FilesSinkConfig) -> Self {
        Self(Arc::new(Inner {
            name: name.to_owned(),
            cfg,
            counter: AtomicU64::new(0),
            busy: Mutex::new(()),
        }))
    }
}

impl Inner {
    fn err(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> SinkError {
        SinkError::new(&self.name, format!("{what} {}: {e}", path.display()))
    }

    /// A fresh generation's name: unique across restarts (the wall time through the runtime's
    /// clock, the pid) and within the process (the counter). Only uniqueness matters: nothing
    /// decides by it.
    fn generation_name(&self) -> GenerationName {
        use signet_runtime::clock::{Clock, SystemClock};
        let nanos = SystemClock
            .now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        GenerationName::new(nanos, std::process::id(), n)
    }

    /// Runs `f` holding the writer lock, or fails at once if a previous write still runs.
    fn exclusive<T>(&self, f: impl FnOnce() -> Result<T, SinkError>) -> Result<T, SinkError> {
        let _guard = match self.busy.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(SinkError::new(
                    &self.name,
                    format!(
                        "a previous write to {} has not finished (is the filesystem hung?)",
                        self.cfg.directory.display()
                    ),
                ));
            }
        };
        f()
    }

    /// Opens the sink directory through a path only root and the agent can change, without
    /// following a link at the end (see [`super::safe_dir::open_trusted_dir`]); with
    /// `allow_shared_directory`, as given.
    fn open_sink_dir(&self) -> Result<SinkDir, SinkError> {
        let path = &self.cfg.directory;
        if self.cfg.allow_shared_directory {
            return SinkDir::open(path).map_err(|e| self.err("cannot open directory", path, e));
        }
        SinkDir::open_trusted(path).map_err(|e| match e {
            OpenError::Untrusted(why) => SinkError::refused(
                &self.name,
                format!(
                    "the path to directory {} is not safe: {why}, so it could be redirected \
                     anywhere; nothing was written. Use a path through directories only root \
                     can change, or set allow_shared_directory = true on the sink",
                    path.display()
                ),
            ),
            OpenError::Io(e) => self.err("cannot open directory", path, e),
        })
    }

    /// Opens the sink directory and refuses it if others may write it (unless allowed).
    fn open_dir(&self) -> Result<SinkDir, SinkError> {
        let path = &self.cfg.directory;
        let dir = self.open_sink_dir()?;
        if dir.is_shared() && !self.cfg.allow_shared_directory {
            return Err(SinkError::refused(
                &self.name,
                format!(
                    "directory {} is writable by its group or by other users (mode {:o}); \
                     nothing was written. Make it writable by its owner only (chmod go-w), or \
                     set allow_shared_directory = true on the sink if that is intended",
                    path.display(),
                    dir.mode()
                ),
            ));
        }
        Ok(dir)
    }

    /// Writes a new generation and switches to it. Blocking.
    fn write_generation(&self, files: Vec<(&str, Vec<u8>, u32)>) -> Result<Applied, SinkError> {
        let dir = self.open_dir()?;
        let gen_name = self.generation_name();
        let result = self.fill_and_switch(&dir, &gen_name, &files);
        if result.is_err() {
            let _ = dir.remove_generation(&gen_name);
        }
        result
    }

    fn fill_and_switch(
        &self,
        dir: &SinkDir,
        gen_name: &GenerationName,
        files: &[(&str, Vec<u8>, u32)],
    ) -> Result<Applied, SinkError> {
        let path = dir.path();
        let gen_path = path.join(gen_name.as_str());
        let generation = dir
            .create_generation(gen_name)
            .map_err(|e| self.err("cannot create", &gen_path, e))?;
        let owner = (self.cfg.owner_uid, self.cfg.owner_gid);
        for (name, content, mode) in files {
            generation
                .write_file(comp(name), content, *mode, owner)
                .map_err(|e| self.err("cannot write", &gen_path.join(name), e))?;
        }
        generation
            .set_mode(0o755)
            .and_then(|()| generation.sync())
            .map_err(|e| self.err("cannot sync", &gen_path, e))?;

        // Visible names point into `..data`, once and for all. Done before the switch so a
        // failure here leaves the previous generation fully in place.
        for (name, _, _) in files {
            let target = format!("{DATA_LINK}/{name}");
            if dir.read_link(comp(name)).as_deref() != Some(target.as_bytes()) {
                let tmp = format!(".{name}.tmp-{}", gen_name.as_str());
                dir.replace_with_link(comp(name), &target, comp(&tmp))
                    .map_err(|e| self.err("cannot link", &path.join(name), e))?;
            }
        }
        // The switch: a new symlink renamed over `..data`.
        let previous = dir.read_link(comp(DATA_LINK));
        let tmp_link = format!("{DATA_LINK}_tmp-{}", gen_name.as_str());
        dir.replace_with_link(comp(DATA_LINK), gen_name.as_str(), comp(&tmp_link))
            .map_err(|e| self.err("cannot switch", &path.join(DATA_LINK), e))?;
        // The switch is done: from here on, never fail (the caller would remove the
        // generation that is now current).
        if let Err(e) = dir.sync() {
            tracing::warn!(sink = %self.name, dir = %path.display(), error = %e, "cannot sync directory after switch");
        }
        let mut applied = Applied::default();
        // No CRL in this generation: the visible `crl.pem` link would dangle; remove ours.
        if !files.iter().any(|(n, _, _)| *n == CRL_FILE)
            && dir.read_link(comp(CRL_FILE)).as_deref()
                == Some(format!("{DATA_LINK}/{CRL_FILE}").as_bytes())
            && let Err(e) = dir.unlink(comp(CRL_FILE))
        {
            applied.warnings.push(format!(
                "cannot remove {}: {e}",
                path.join(CRL_FILE).display()
            ));
        }
        if let Some(prev) = previous
            && GenerationName::parse(&prev).is_none()
        {
            applied.warnings.push(format!(
                "{} pointed at {:?}, which is not a generation of this sink; it was replaced \
                 and nothing it pointed at was touched",
                path.join(DATA_LINK).display(),
                String::from_utf8_lossy(&prev)
            ));
        }
        // Old generations go only after the switch is durable.
        self.sweep(dir, Some(gen_name), &mut applied);
        Ok(applied)
    }

    /// Removes every generation but `keep`, noting what was not the agent's.
    fn sweep(&self, dir: &SinkDir, keep: Option<&GenerationName>, applied: &mut Applied) {
        let gens = match dir.generations() {
            Ok(g) => g,
            Err(e) => {
                applied
                    .warnings
                    .push(format!("cannot list {}: {e}", dir.path().display()));
                return;
            }
        };
        for g in gens.iter().filter(|g| Some(*g) != keep) {
            match dir.remove_generation(g) {
                Ok(None) => {}
                Ok(Some(note)) | Err(note) => applied
                    .warnings
                    .push(format!("in {}: {note}", dir.path().display())),
            }
        }
    }

    /// The uid a reload signal's target must run as.
    fn expected_owner(&self) -> Result<u32, SinkError> {
        if let Some(uid) = self.cfg.owner_uid {
            return Ok(uid);
        }
        self.open_sink_dir().map(|d| d.owner_uid())
    }

    async fn reload(&self) -> Result<(), SinkError> {
        if let (Some(sig), Some(pid_file)) = (&self.cfg.reload_signal, &self.cfg.pid_file) {
            let signal = signal_by_name(sig).ok_or_else(|| {
                SinkError::new(&self.name, format!("{sig:?} is not a signal name"))
            })?;
            let owner = self.expected_owner()?;
            let pid = reload::read_pid_file(
                &self.name,
                pid_file,
                owner,
                !self.cfg.allow_shared_directory,
            )?;
            reload::signal_owner_process(&self.name, pid, signal, owner)?;
        }
        if let Some(cmd) = &self.cfg.reload_command
            && let Some((prog, args)) = cmd.split_first()
        {
            reload::run_command(&self.name, prog, args, self.cfg.reload_timeout).await?;
        }
        Ok(())
    }

    /// Removes what [`Self::write_generation`] made. Blocking.
    fn remove_all(&self) -> Result<Applied, SinkError> {
        let path = &self.cfg.directory;
        if !path.exists() {
            return Ok(Applied::default());
        }
        let dir = self.open_sink_dir()?;
        for name in layout_names(self.cfg.layout).into_iter().chain([CRL_FILE]) {
            // Only our symlinks; a regular file someone else put there stays.
            let target = format!("{DATA_LINK}/{name}");
            if dir.read_link(comp(name)).as_deref() == Some(target.as_bytes()) {
                dir.unlink(comp(name))
                    .map_err(|e| self.err("cannot remove", &path.join(name), e))?;
            }
        }
        let mut applied = Applied::default();
        if let Some(prev) = dir.read_link(comp(DATA_LINK)) {
            dir.unlink(comp(DATA_LINK))
                .map_err(|e| self.err("cannot remove", &path.join(DATA_LINK), e))?;
            if GenerationName::parse(&prev).is_none() {
                applied.warnings.push(format!(
                    "{} pointed at {:?}, which is not a generation of this sink; the link was \
                     removed and nothing it pointed at was touched",
                    path.join(DATA_LINK).display(),
                    String::from_utf8_lossy(&prev)
                ));
            }
        }
        self.sweep(&dir, None, &mut applied);
        Ok(applied)
    }
}

#[async_trait::async_trait]
impl Sink for FilesSink {
    fn name(&self) -> &str {
        &self.0.name
    }

    async fn deliver(&self, svid: &Delivered) -> Result<Applied, SinkError> {
        let [chain, key, bundle] = layout_names(self.0.cfg.layout);
        let mut files = vec![
            (chain, svid.chain_pem().into_bytes(), 0o644),
            (key, svid.key_pem().into_bytes(), 0o600),
            (bundle, svid.bundle_pem().into_bytes(), 0o644),
        ];
        if !svid.crls_der.is_empty() {
            files.push((CRL_FILE, svid.crls_pem().into_bytes(), 0o644));
        }
        let inner = self.0.clone();
        let applied =
            tokio::task::spawn_blocking(move || inner.exclusive(|| inner.write_generation(files)))
                .await
                .map_err(|e| SinkError::new(&self.0.name, format!("writer task failed: {e}")))??;
        tracing::info!(sink = %self.0.name, spiffe_id = %svid.spiffe_id(), dir = %self.0.cfg.directory.display(), "delivered");
        self.0.reload().await?;
        Ok(applied)
    }

    async fn remove(&self) -> Result<Applied, SinkError> {
        let inner = self.0.clone();
        tokio::task::spawn_blocking(move || inner.exclusive(|| inner.remove_all()))
            .await
            .map_err(|e| SinkError::new(&self.0.name, format!("remover task failed: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::SinkErrorKind;
    use crate::sinks::safe_dir::GEN_PREFIX;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn cfg(dir: &Path, layout: FileLayout) -> FilesSinkConfig {
        FilesSinkConfig {
            layout,
            ..FilesSinkConfig::new(dir)
        }
    }

    fn generations(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(GEN_PREFIX))
            .collect()
    }

    /// A victim directory outside the sink, with a file in it and an unusual mode.
    fn victim(root: &Path) -> std::path::PathBuf {
        let v = root.join("victim");
        std::fs::create_dir(&v).expect("mkdir");
        std::fs::write(v.join("precious"), b"keep").expect("write");
        std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        v
    }

    fn assert_intact(v: &Path) {
        assert_eq!(
            std::fs::read(v.join("precious")).expect("victim file"),
            b"keep"
        );
        let m = std::fs::metadata(v).expect("meta");
        assert_eq!(m.mode() & 0o7777, 0o700, "victim mode unchanged");
    }

    #[tokio::test]
    async fn a_planted_data_link_never_deletes_its_target() {
        let root = tempfile::tempdir().expect("tempdir");
        let v = victim(root.path());
        let dir = root.path().join("sink");
        std::fs::create_dir(&dir).expect("mkdir");
        let sink = FilesSink::new("web", cfg(&dir, FileLayout::Tls));
        sink.deliver(&svid(1)).await.expect("first");
        for target in [v.clone(), Path::new("../victim").to_owned()] {
            // The attacker points `..data` at the victim (absolute, then relative).
            let data = dir.join(DATA_LINK);
            std::fs::remove_file(&data).expect("rm");
            std::os::unix::fs::symlink(&target, &data).expect("plant");
            let applied = sink.deliver(&svid(2)).await.expect("delivered anyway");
            assert_intact(&v);
            assert!(
                applied
                    .warnings
                    .iter()
                    .any(|w| w.contains("not a generation")),
                "{applied:?}"
            );
            assert_eq!(read_pem(&dir.join("tls.key")), key_of(2));
        }
        // The generation the attacker detached from `..data` is still swept.
        assert_eq!(generations(&dir).len(), 1);
        // Removal with a planted `..data` removes the link, not the victim.
        std::fs::remove_file(dir.join(DATA_LINK)).expect("rm");
        std::os::unix::fs::symlink(&v, dir.join(DATA_LINK)).expect("plant");
        let applied = sink.remove().await.expect("remove");
        assert!(!applied.warnings.is_empty());
        assert_intact(&v);
    }

    #[tokio::test]
    async fn a_generation_swapped_for_a_link_is_unlinked_not_followed() {
        let root = tempfile::tempdir().expect("tempdir");
        let v = victim(root.path());
        let dir = root.path().join("sink");
        std::fs::create_dir(&dir).expect("mkdir");
        let sink = FilesSink::new("web", cfg(&dir, FileLayout::Istio));
        sink.deliver(&svid(1)).await.expect("first");
        // The current generation is replaced by a link to the victim.
        let current = generations(&dir).remove(0);
        std::fs::remove_dir_all(dir.join(&current)).expect("rm");
        std::os::unix::fs::symlink(&v, dir.join(&current)).expect("plant");
        // And a link named like a generation, pointing at the victim, is planted beside it.
        std::os::unix::fs::symlink(&v, dir.join(format!("{GEN_PREFIX}1-2-3"))).expect("plant");
        // A directory named like a generation that the agent did not create stays.
        let foreign = dir.join(format!("{GEN_PREFIX}4-5-6"));
        std::fs::create_dir(&foreign).expect("mkdir");
        std::fs::write(foreign.join("theirs"), b"x").expect("write");
        if rustix::process::geteuid().as_raw() == 0 {
            std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).expect("chown");
        }
        let applied = sink.deliver(&svid(2)).await.expect("second");
        assert_intact(&v);
        assert_eq!(read_pem(&dir.join("key.pem")), key_of(2));
        assert!(!applied.warnings.is_empty(), "{applied:?}");
        if rustix::process::geteuid().as_raw() == 0 {
            assert!(
                foreign.join("theirs").exists(),
                "not the agent's: left in place"
            );
        }
        sink.deliver(&svid(3)).await.expect("third");
        assert_intact(&v);
    }

    #[tokio::test]
    async fn a_shared_directory_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        let err = FilesSink::new("web", cfg(dir.path(), FileLayout::Tls))
            .deliver(&svid(1))
            .await
            .expect_err("refused");
        assert_eq!(err.kind, SinkErrorKind::Refused);
        assert!(err.reason.contains("allow_shared_directory"), "{err}");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("ls").count(),
            0,
            "nothing written"
        );
        let mut c = cfg(dir.path(), FileLayout::Tls);
        c.allow_shared_directory = true;
        FilesSink::new("web", c)
            .deliver(&svid(1))
            .await
            .expect("allowed");
        assert_eq!(read_pem(&dir.path().join("tls.key")), key_of(1));
    }

    /// The `n`th delivery (the same for the same `n`): chain of two, key, bundle of one.
    fn svid(n: u8) -> Delivered {
        crate::testing::delivered("spiffe://example.org/web", n)
    }
    fn key_of(n: u8) -> Vec<Vec<u8>> {
        vec![svid(n).svid.key().pkcs8_der().to_vec()]
    }
    fn chain_of(n: u8) -> Vec<Vec<u8>> {
        svid(n).chain_der().to_vec()
    }

    #[tokio::test]
    async fn crl_pem_is_written_in_each_layout_switched_and_removed() {
        for layout in [FileLayout::Istio, FileLayout::SpiffeHelper, FileLayout::Tls] {
            let dir = tempfile::tempdir().expect("tempdir");
            let sink = FilesSink::new("web", cfg(dir.path(), layout));
            sink.deliver(&svid(1)).await.expect("without CRLs");
            assert!(!dir.path().join(CRL_FILE).exists(), "{layout:?}");
            let with = Delivered {
                crls_der: vec![vec![1, 9], vec![2, 9]].into(),
                ..svid(2)
            };
            sink.deliver(&with).await.expect("with CRLs");
            let text = std::fs::read_to_string(dir.path().join(CRL_FILE)).expect("crl.pem");
            assert_eq!(
                text.matches("-----BEGIN X509 CRL-----").count(),
                2,
                "{text}"
            );
            assert_eq!(
                read_pem(&dir.path().join(CRL_FILE)),
                [vec![1, 9], vec![2, 9]]
            );
            let m = std::fs::symlink_metadata(dir.path().join(CRL_FILE)).expect("meta");
            assert!(
                m.file_type().is_symlink(),
                "switched with the others through ..data"
            );
            let mode = std::fs::metadata(dir.path().join(CRL_FILE))
                .expect("meta")
                .mode();
            assert_eq!(mode & 0o777, 0o644);
            let [_, key, _] = layout_names(layout);
            assert_eq!(read_pem(&dir.path().join(key)), key_of(2));
            // A new CRL replaces it with the certificates, in one generation.
            let newer = Delivered {
                crls_der: vec![vec![3, 9]].into(),
                ..svid(3)
            };
            sink.deliver(&newer).await.expect("newer CRL");
            assert_eq!(read_pem(&dir.path().join(CRL_FILE)), [vec![3, 9]]);
            assert_eq!(generations(dir.path()).len(), 1);
            // None any more: no dangling link.
            sink.deliver(&svid(4)).await.expect("no CRLs");
            assert!(std::fs::symlink_metadata(dir.path().join(CRL_FILE)).is_err());
            sink.deliver(&newer).await.expect("again");
            sink.remove().await.expect("remove");
            assert_eq!(
                std::fs::read_dir(dir.path()).expect("ls").count(),
                0,
                "{layout:?}"
            );
        }
    }

    /// The name `..data` points at now.
    fn current_generation(dir: &Path) -> String {
        std::fs::read_link(dir.join(DATA_LINK))
            .expect("..data")
            .to_string_lossy()
            .into_owned()
    }

    /// Polls `f` every 10 ms until it holds; panics after 10 s. Real time: the writes run on
    /// the blocking threads, which paused time would not wait for.
    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Through the sink's worker, as the rotator hands deliveries over: the CRL arriving
    /// after the certificate, then changing alone, is written to `crl.pem` each time (the
    /// certificate and key as they were); the same delivery again writes nothing.
    #[tokio::test]
    async fn a_crl_alone_is_written_in_each_layout_and_an_unchanged_delivery_writes_nothing() {
        use crate::config::DeletionPolicy;
        use crate::sinks::worker::{SinkBinding, SinkSet, Telemetry};
        for layout in [FileLayout::Istio, FileLayout::SpiffeHelper, FileLayout::Tls] {
            let dir = tempfile::tempdir().expect("tempdir");
            let d = dir.path().to_owned();
            let telemetry = Telemetry::new(None);
            let mut set = SinkSet::start(
                vec![SinkBinding {
                    spiffe_id: "spiffe://example.org/web".parse().expect("id"),
                    deletion_policy: DeletionPolicy::Delete,
                    timeout: std::time::Duration::from_secs(30),
                    sink: Arc::new(FilesSink::new("web", cfg(&d, layout))),
                }],
                telemetry.clone(),
                Arc::new(signet_runtime::clock::SystemClock),
                Arc::new(|| 0.5),
            );
            let [chain, key, bundle] = layout_names(layout);
            let first = svid(1);
            set.update(|_| Some(first.clone()));
            until("the first delivery", || d.join(DATA_LINK).exists()).await;
            assert!(!d.join(CRL_FILE).exists(), "{layout:?}: no CRL yet");
            let g1 = current_generation(&d);
            let cert_before = read_pem(&d.join(chain));

            // The CRL arrives a moment after the certificate.
            let crl1 = Delivered {
                crls_der: vec![vec![1, 9]].into(),
                ..first.clone()
            };
            set.update(|_| Some(crl1.clone()));
            until("crl.pem", || d.join(CRL_FILE).exists()).await;
            assert_eq!(read_pem(&d.join(CRL_FILE)), [vec![1, 9]], "{layout:?}");
            let g2 = current_generation(&d);
            assert_ne!(g1, g2);

            // Another peer revoked: only the CRL changes.
            let crl2 = Delivered {
                crls_der: vec![vec![2, 9]].into(),
                ..first.clone()
            };
            set.update(|_| Some(crl2.clone()));
            until("the newer CRL", || {
                read_pem(&d.join(CRL_FILE)) == [vec![2, 9]]
            })
            .await;
            assert_eq!(read_pem(&d.join(chain)), cert_before, "{layout:?}");
            assert_eq!(read_pem(&d.join(key)), key_of(1), "{layout:?}");
            assert_eq!(read_pem(&d.join(bundle)), first.bundle_der.to_vec());
            let g3 = current_generation(&d);

            // The same again, in new allocations (as every pass builds it): nothing written.
            let same = Delivered {
                svid: Arc::new((*crl2.svid).clone()),
                bundle_der: crl2.bundle_der.to_vec().into(),
                crls_der: crl2.crls_der.to_vec().into(),
            };
            set.update(|_| Some(same.clone()));
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            assert_eq!(current_generation(&d), g3, "{layout:?}: rewritten");
            assert_eq!(generations(&d), std::slice::from_ref(&g3));
            let reports = telemetry.health().reports();
            assert!(reports.iter().all(|(_, r)| r.failures == 0), "{reports:?}");
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
            assert_eq!(read_pem(&dir.path().join(chain)), chain_of(7));
            assert_eq!(read_pem(&dir.path().join(key)), key_of(7));
            assert_eq!(
                read_pem(&dir.path().join(bundle)),
                svid(7).bundle_der.to_vec()
            );
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
        assert_eq!(read_pem(&dir.path().join("tls.key")), key_of(2));
        assert_eq!(read_pem(&dir.path().join("tls.crt"))[0], chain_of(2)[0]);
        assert_eq!(generations(dir.path()).len(), 1);
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
            assert_eq!(read_pem(&dir.path().join("key.pem")), key_of(1));
            assert_eq!(
                read_pem(&dir.path().join("cert-chain.pem"))[0],
                chain_of(1)[0]
            );
        }
        // A failure that root cannot override: a directory in the way of a visible name.
        std::fs::remove_file(dir.path().join("root-cert.pem")).expect("rm");
        std::fs::create_dir_all(dir.path().join("root-cert.pem/x")).expect("mkdir");
        let err = sink.deliver(&svid(3)).await.expect_err("blocked");
        assert!(err.to_string().contains("\"web\""), "{err}");
        assert_eq!(read_pem(&dir.path().join("key.pem")), key_of(current));
        assert_eq!(
            read_pem(&dir.path().join("cert-chain.pem"))[0],
            chain_of(current)[0]
        );
        assert_eq!(
            generations(dir.path()).len(),
            1,
            "the failed generation is cleaned up"
        );

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
