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
//! # Federated trust domains
//!
//! For an identity whose entry federates with foreign trust domains, each one's roots are
//! written as [`federated_file`] (`federated-<trust domain>.pem`), a flat name beside the
//! others (trust domain names are `[a-z0-9._-]`, so one is a safe single file name), in the
//! same generation and switched with the rest: the per-domain files and the own bundle always
//! agree. A flat name rather than a `federated/` directory keeps the one-level generation
//! scheme (and its sweep) as it is. When a trust domain is no longer federated its link is
//! removed after the switch, as `crl.pem`'s is.
//!
//! With `include_federated_domains = true` on the sink (spiffe-helper's option name), the
//! federated roots are also appended to the layout's bundle file (`root-cert.pem`,
//! `svid_bundle.pem`, `ca.crt`), for consumers that read one CA file. **Off by default**: a
//! consumer that reads the bundle file as "our CA" must not start trusting a partner's CA
//! because an entry changed on the server; the operator opts in per sink.
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

use signet_runtime::clock::{Clock, SystemClock};

use crate::config::{FileLayout, FilesSinkConfig};
use crate::sinks::reload;
use crate::sinks::safe_dir::{Component, DATA_LINK, GenerationName, OpenError, SinkDir};
use crate::sinks::{Applied, Delivered, Sink, SinkError};

use crate::signal::signal_by_name;

/// The CRL file every layout gets when there are CRLs.
pub const CRL_FILE: &str = "crl.pem";

/// The prefix of the per-trust-domain federated bundle files.
pub const FEDERATED_PREFIX: &str = "federated-";

/// The file of a federated trust domain's roots: `federated-<trust domain>.pem`.
pub fn federated_file(trust_domain: &str) -> String {
    format!("{FEDERATED_PREFIX}{trust_domain}.pem")
}

/// Whether `name` is one of the federated bundle files this sink writes.
fn is_federated_file(name: &str) -> bool {
    name.strip_prefix(FEDERATED_PREFIX)
        .and_then(|n| n.strip_suffix(".pem"))
        .is_some_and(|td| td.parse::<signet_types::TrustDomain>().is_ok())
}

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
    /// Names the generations (see [`Inner::generation_name`]).
    clock: Arc<dyn Clock>,
    /// Held by the blocking writer. A write abandoned at its deadline (a hung filesystem) still
    /// holds it, and the next attempt fails at once instead of piling up blocked threads.
    busy: Mutex<()>,
}

/// A constant component (the layout names and `..data` are all single names).
fn comp(s: &str) -> Component<'_> {
    Component::new(s).unwrap_or_else(|| unreachable!("{s:?} is a constant single name"))
}

impl FilesSink {
    /// On the system clock.
    pub fn new(name: &str, cfg: FilesSinkConfig) -> Self {
        Self::with_clock(name, cfg, Arc::new(SystemClock))
    }

    pub fn with_clock(name: &str, cfg: FilesSinkConfig, clock: Arc<dyn Clock>) -> Self {
        Self(Arc::new(Inner {
            name: name.to_owned(),
            cfg,
            counter: AtomicU64::new(0),
            clock,
            busy: Mutex::new(()),
        }))
    }
}

impl Inner {
    fn err(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> SinkError {
        SinkError::new(&self.name, format!("{what} {}: {e}", path.display()))
    }

    /// A fresh generation's name: unique across restarts (the clock's wall time, the pid) and
    /// within the process (the counter). Only uniqueness matters: nothing decides by it.
    fn generation_name(&self) -> GenerationName {
        let nanos = self
            .clock
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
                    "directory {dir} is writable by its group or by other users (mode \
                     {mode:o}: made under umask 002?), so they could swap the files it serves; \
                     nothing was written. Fix: `chmod {who}-w {dir}` (or `chmod 0750 {dir}`), \
                     or set allow_shared_directory = true on the sink if that is intended",
                    dir = path.display(),
                    mode = dir.mode(),
                    who = if dir.mode() & 0o002 == 0 { "g" } else { "go" },
                ),
            ));
        }
        Ok(dir)
    }

    /// Writes a new generation and switches to it. Blocking.
    fn write_generation(&self, files: Vec<(String, Vec<u8>, u32)>) -> Result<Applied, SinkError> {
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
        files: &[(String, Vec<u8>, u32)],
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
        // No CRL (or no longer this federated trust domain) in this generation: the visible
        // link would dangle; remove ours.
        let optional = match dir.names_with_prefix(FEDERATED_PREFIX) {
            Ok(names) => names,
            Err(e) => {
                applied
                    .warnings
                    .push(format!("cannot list {}: {e}", path.display()));
                Vec::new()
            }
        };
        let stale = std::iter::once(CRL_FILE.to_owned())
            .chain(optional.into_iter().filter(|n| is_federated_file(n)))
            .filter(|n| !files.iter().any(|(f, _, _)| f == n));
        for name in stale {
            let Some(c) = Component::new(&name) else {
                continue;
            };
            if dir.read_link(c).as_deref() == Some(format!("{DATA_LINK}/{name}").as_bytes())
                && let Err(e) = dir.unlink(c)
            {
                applied
                    .warnings
                    .push(format!("cannot remove {}: {e}", path.join(&name).display()));
            }
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
                Ok(Some(note)) => applied
                    .warnings
                    .push(format!("in {}: {note}", dir.path().display())),
                Err(left) => applied
                    .warnings
                    .push(format!("in {}: {left}", dir.path().display())),
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
        let federated = dir
            .names_with_prefix(FEDERATED_PREFIX)
            .map_err(|e| self.err("cannot list", path, e))?
            .into_iter()
            .filter(|n| is_federated_file(n));
        let names = layout_names(self.cfg.layout)
            .into_iter()
            .chain([CRL_FILE])
            .map(str::to_owned)
            .chain(federated);
        for name in names {
            let Some(c) = Component::new(&name) else {
                continue;
            };
            // Only our symlinks; a regular file someone else put there stays.
            let target = format!("{DATA_LINK}/{name}");
            if dir.read_link(c).as_deref() == Some(target.as_bytes()) {
                dir.unlink(c)
                    .map_err(|e| self.err("cannot remove", &path.join(&name), e))?;
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
        let mut bundle_pem = svid.bundle_pem();
        let mut files = vec![
            (chain.to_owned(), svid.chain_pem().into_bytes(), 0o644),
            (key.to_owned(), svid.key_pem().into_bytes(), 0o600),
        ];
        for (td, roots_pem) in svid.federated_pems() {
            let name = federated_file(td);
            // A trust domain name is one safe file name; should one ever not be, skip it.
            if Component::new(&name).is_none() || !is_federated_file(&name) {
                tracing::warn!(sink = %self.0.name, trust_domain = %td, "skipping a federated bundle whose trust domain is not a file name");
                continue;
            }
            if self.0.cfg.include_federated_domains {
                bundle_pem.push_str(&roots_pem);
            }
            files.push((name, roots_pem.into_bytes(), 0o644));
        }
        files.push((bundle.to_owned(), bundle_pem.into_bytes(), 0o644));
        if !svid.crls_der.is_empty() {
            files.push((CRL_FILE.to_owned(), svid.crls_pem().into_bytes(), 0o644));
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
#[path = "files_tests.rs"]
mod tests;
