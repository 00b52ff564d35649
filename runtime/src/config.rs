//! Layered configuration, loaded the same way by every binary that has a configuration file:
//! the binary's defaults, then a TOML file, then environment variables under the binary's
//! prefix, then command-line flags; each layer wins over the ones before it.
//!
//! The invariants: **an unknown key is refused, by name and source** (the configuration types
//! are `#[serde(deny_unknown_fields)]`; figment's message names the key and where it came
//! from), and **so is an unknown variable under the binary's prefix** ([`EnvSpec`]): a
//! misspelt `SIGNET_DATABASE_UR` stops start-up with "did you mean SIGNET_DATABASE_URL?"
//! instead of being ignored. The only variables under the prefix that are not configuration
//! are the ones the binary lists as another program's ([`EnvSpec::others`]: signetctl's
//! `SIGNET_ADMIN_SOCKET`, the agent's `SIGNET_AGENT_*` seen by the server…) and the service
//! links Kubernetes adds for a Service whose name starts like the prefix (`SIGNET_SERVER_PORT`,
//! `SIGNET_SERVER_SERVICE_HOST`, …, see [`is_kubernetes_service_link`]). Below a known key a
//! misspelt name is refused by the key's type (`SIGNET_CA__MAX_TLL`). Nested keys use a double
//! underscore in the environment (`SIGNET_CA__DEFAULT_TTL=30m`).

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why the configuration could not be read: every problem figment found, joined by `; `,
/// each naming its key and source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(String);

impl From<figment::Error> for LoadError {
    fn from(e: figment::Error) -> Self {
        let msgs: Vec<String> = e
            .into_iter()
            .map(|e| without_source_lines(&e.to_string()))
            .collect();
        LoadError(msgs.join("; "))
    }
}

/// A parse error's message without the lines of the file it quotes (`9 | database_url =
/// "postgres://app:secret@…`, and the caret line under it): the file may hold secrets, and the
/// line and column the message keeps are enough to find the mistake.
fn without_source_lines(msg: &str) -> String {
    msg.lines()
        .filter(|l| {
            let t = l.trim_start();
            let t = t
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start();
            !t.starts_with('|')
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The largest configuration file read: far above any real one, and a bound on what a
/// misplaced path (a device, a log) can make the process read.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The layers, lowest first: `Layers::new(defaults).file(…)?.env(…).flags(…).extract()`.
pub struct Layers {
    fig: Figment,
}

impl std::fmt::Debug for Layers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The merged values may hold secrets (join tokens, database passwords).
        f.debug_struct("Layers").finish_non_exhaustive()
    }
}

impl Layers {
    /// Starts from the binary's defaults.
    pub fn new(defaults: impl Serialize) -> Self {
        Self {
            fig: Figment::from(Serialized::defaults(defaults)),
        }
    }

    /// Merges the TOML file, when one is named; a named file that does not exist is an error.
    ///
    /// The file must be a regular file (after links) of at most [`MAX_CONFIG_BYTES`]: a FIFO
    /// would block start-up or a SIGHUP reload for ever, a device would be read without end.
    pub fn file(mut self, file: Option<&Path>) -> Result<Self, LoadError> {
        if let Some(f) = file {
            let meta = std::fs::metadata(f).map_err(|e| {
                LoadError(if e.kind() == std::io::ErrorKind::NotFound {
                    format!("config file {} does not exist", f.display())
                } else {
                    format!("config file {}: {e}", f.display())
                })
            })?;
            if !meta.is_file() {
                return Err(LoadError(format!(
                    "config file {} is not a regular file (a FIFO, device or directory is \
                     never read as configuration)",
                    f.display()
                )));
            }
            if meta.len() > MAX_CONFIG_BYTES {
                return Err(LoadError(format!(
                    "config file {} is larger than {MAX_CONFIG_BYTES} bytes",
                    f.display()
                )));
            }
            self.fig = self.fig.merge(Toml::file_exact(f));
        }
        Ok(self)
    }

    /// Merges the variables `<prefix><KEY>` whose first key is one of `spec.keys` (compared
    /// without case); `__` separates nested keys. Any other variable under the prefix that
    /// [`EnvSpec`] does not name as another program's is refused (see [`check_env`]).
    pub fn env(mut self, spec: &EnvSpec) -> Result<Self, LoadError> {
        check_env(std::env::vars_os().map(|(k, _)| k), spec)?;
        let keys = spec.keys;
        let env = Env::prefixed(spec.prefix).split("__").filter(move |key| {
            let top = key.as_str().split('.').next().unwrap_or_default();
            keys.iter().any(|k| k.eq_ignore_ascii_case(top))
        });
        self.fig = self.fig.merge(env);
        Ok(self)
    }

    /// Merges values given as flags (already serialized, absent flags skipped): the highest
    /// layer.
    pub fn flags(mut self, flags: impl Serialize) -> Self {
        self.fig = self.fig.merge(Serialized::defaults(flags));
        self
    }

    /// The merged configuration. Validating it is the caller's job.
    pub fn extract<T: DeserializeOwned>(self) -> Result<T, LoadError> {
        Ok(self.fig.extract()?)
    }
}

/// How one binary's configuration is named in the environment.
#[derive(Debug, Clone, Copy)]
pub struct EnvSpec {
    /// The binary, for messages (`signet-server`).
    pub binary: &'static str,
    /// `SIGNET_` (the server) or `SIGNET_AGENT_` (the agent); matched without case, as
    /// figment does.
    pub prefix: &'static str,
    /// The configuration's top-level keys (`trust_domain`, `ca`…).
    pub keys: &'static [&'static str],
    /// Variables under `prefix` that belong to another program and are not configuration,
    /// each with the program that reads it: an exact name, or a name ending in `*` for every
    /// variable that starts with it (`SIGNET_AGENT_*`).
    pub others: &'static [(&'static str, &'static str)],
}

/// Refuses the first variable in `names` that is under `spec.prefix` but is neither a
/// configuration key nor listed in `spec.others` nor a Kubernetes service link, naming the
/// closest known variable. Names that are not Unicode are compared lossily.
pub fn check_env(
    names: impl IntoIterator<Item = std::ffi::OsString>,
    spec: &EnvSpec,
) -> Result<(), LoadError> {
    let mut unknown: Vec<String> = names
        .into_iter()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| is_unknown(n, spec))
        .collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(name) => Err(LoadError(unknown_variable_message(name, spec))),
    }
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len()
        && s.is_char_boundary(prefix.len())
        && s[..prefix.len()].eq_ignore_ascii_case(prefix)
}

fn is_unknown(name: &str, spec: &EnvSpec) -> bool {
    if !starts_with_ignore_case(name, spec.prefix) {
        return false;
    }
    let rest = &name[spec.prefix.len()..];
    let top = rest.split("__").next().unwrap_or_default();
    if spec.keys.iter().any(|k| k.eq_ignore_ascii_case(top)) {
        return false;
    }
    let other = spec.others.iter().any(|(o, _)| match o.strip_suffix('*') {
        Some(p) => starts_with_ignore_case(name, p),
        None => o.eq_ignore_ascii_case(name),
    });
    !other && !is_kubernetes_service_link(name)
}

/// Whether `name` has the shape of the variables Kubernetes puts in every container for each
/// Service of its namespace (unless the pod sets `enableServiceLinks: false`): for a Service
/// `signet-server`, `SIGNET_SERVER_SERVICE_HOST`, `SIGNET_SERVER_SERVICE_PORT[_<PORT NAME>]`,
/// `SIGNET_SERVER_PORT` and `SIGNET_SERVER_PORT_<NUMBER>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR]`.
pub fn is_kubernetes_service_link(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    if n.ends_with("_SERVICE_HOST") || n.ends_with("_SERVICE_PORT") || n.ends_with("_PORT") {
        return true;
    }
    if n.contains("_SERVICE_PORT_") {
        return true;
    }
    // …_PORT_8443_TCP, …_PORT_8443_TCP_ADDR
    let Some(at) = n.rfind("_PORT_") else {
        return false;
    };
    let mut parts = n[at + "_PORT_".len()..].split('_');
    let number = parts.next().unwrap_or_default();
    let proto = parts.next().unwrap_or_default();
    let field = parts.next();
    !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
        && matches!(proto, "TCP" | "UDP" | "SCTP")
        && matches!(field, None | Some("PROTO" | "PORT" | "ADDR"))
        && parts.next().is_none()
}

/// "environment variable X is not a setting of B: did you mean Y? …".
fn unknown_variable_message(name: &str, spec: &EnvSpec) -> String {
    let rest = &name[spec.prefix.len()..];
    let prefix = spec.prefix.to_ascii_uppercase();
    let var = |key: &str| format!("{prefix}{}", key.to_ascii_uppercase());
    let head = format!(
        "environment variable {name} is not a setting of {}",
        spec.binary
    );
    let top = rest
        .split("__")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let closest = spec
        .keys
        .iter()
        .map(|k| (edit_distance(&top, k), *k))
        .min()
        .filter(|(d, key)| *d <= 2.max(key.len() / 3));
    if let Some((_, key)) = closest {
        let nested = rest.find("__").map(|i| &rest[i..]).unwrap_or_default();
        return format!(
            "{head}: did you mean {}{}? Rename or unset it",
            var(key),
            nested.to_ascii_uppercase()
        );
    }
    // SIGNET_CA_MAX_TTL: a nested key written with one underscore.
    let nested = spec.keys.iter().find(|k| {
        starts_with_ignore_case(rest, k)
            && rest.len() > k.len() + 1
            && rest.as_bytes()[k.len()] == b'_'
            && rest.as_bytes()[k.len() + 1] != b'_'
    });
    match nested {
        Some(key) => format!(
            "{head}: did you mean {}__{}? (a nested key takes a double underscore); rename or \
             unset it",
            var(key),
            rest[key.len() + 1..].to_ascii_uppercase()
        ),
        None => format!(
            "{head}: its variables are {prefix}<KEY> for the keys {} (nested keys joined with \
             '__'); rename or unset it",
            spec.keys.join(", "),
        ),
    }
}

/// Levenshtein distance over bytes (ASCII names).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Cfg {
        name: String,
        port: u16,
        inner: Inner,
    }

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Inner {
        ttl: u32,
    }

    const KEYS: &[&str] = &["name", "port", "inner"];

    fn toml(s: &str) -> tempfile_like::File {
        tempfile_like::File::new(s)
    }

    /// A temporary file without another dependency.
    mod tempfile_like {
        pub struct File(pub std::path::PathBuf);
        impl File {
            pub fn new(s: &str) -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "signet-runtime-config-{}-{}.toml",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&p, s).unwrap();
                File(p)
            }
        }
        impl Drop for File {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn a_parse_error_never_quotes_the_file() {
        let f = toml("name = 'x'\nport = \"postgres://app:S3cret@db/x\n");
        let err = Layers::new(Cfg::default())
            .file(Some(&f.0))
            .unwrap()
            .extract::<Cfg>()
            .unwrap_err()
            .to_string();
        assert!(!err.contains("S3cret"), "{err}");
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn only_a_bounded_regular_file_is_read() {
        let load = |p: &Path| Layers::new(Cfg::default()).file(Some(p)).map(|_| ());
        let err = load(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let link = toml("");
        std::fs::remove_file(&link.0).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &link.0).unwrap();
        assert!(
            load(&link.0)
                .unwrap_err()
                .to_string()
                .contains("not a regular file")
        );
        let fifo = toml("");
        std::fs::remove_file(&fifo.0).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo.0)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(
            load(&fifo.0)
                .unwrap_err()
                .to_string()
                .contains("not a regular file")
        );
        let big = toml(&"#".repeat(MAX_CONFIG_BYTES as usize + 1));
        assert!(
            load(&big.0)
                .unwrap_err()
                .to_string()
                .contains("larger than")
        );
        let dir = std::env::temp_dir();
        assert!(
            load(&dir)
                .unwrap_err()
                .to_string()
                .contains("not a regular file")
        );
    }

    #[test]
    fn layers_win_in_order() {
        let f = toml("name = 'file'\nport = 1\n[inner]\nttl = 5\n");
        #[derive(Serialize)]
        struct Flags {
            port: u16,
        }
        let c: Cfg = Layers::new(Cfg::default())
            .file(Some(&f.0))
            .unwrap()
            .env(&EnvSpec {
                binary: "test",
                prefix: "SIGNET_RUNTIME_TEST_NONE_",
                keys: KEYS,
                others: &[],
            })
            .unwrap()
            .flags(Flags { port: 9 })
            .extract()
            .unwrap();
        assert_eq!(
            c,
            Cfg {
                name: "file".into(),
                port: 9,
                inner: Inner { ttl: 5 }
            }
        );
    }

    #[test]
    fn unknown_keys_are_named_and_a_missing_file_is_an_error() {
        let f = toml("name = 'x'\n[inner]\ntll = 5\n");
        let e = Layers::new(Cfg::default())
            .file(Some(&f.0))
            .unwrap()
            .extract::<Cfg>()
            .unwrap_err();
        assert!(e.to_string().contains("tll"), "{e}");
        let e = Layers::new(Cfg::default())
            .file(Some(Path::new("/nonexistent/signet.toml")))
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "config file /nonexistent/signet.toml does not exist"
        );
    }

    fn spec() -> EnvSpec {
        EnvSpec {
            binary: "signet-server",
            prefix: "SIGNET_",
            keys: &["trust_domain", "database_url", "ca", "data_dir"],
            others: &[
                ("SIGNET_ADMIN_SOCKET", "signetctl"),
                ("SIGNET_AGENT_*", "signet-agent"),
            ],
        }
    }

    fn check(names: &[&str]) -> Result<(), LoadError> {
        check_env(names.iter().map(std::ffi::OsString::from), &spec())
    }

    #[test]
    fn a_misspelt_variable_is_refused_with_the_closest_one() {
        let e = check(&["PATH", "SIGNET_DATABASE_UR"])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "environment variable SIGNET_DATABASE_UR is not a setting of signet-server: did \
             you mean SIGNET_DATABASE_URL? Rename or unset it"
        );
        let e = check(&["signet_trust_domian"]).unwrap_err().to_string();
        assert!(e.contains("did you mean SIGNET_TRUST_DOMAIN?"), "{e}");
        // The nested part is kept; its own spelling is the key type's to check.
        let e = check(&["SIGNET_CAA__MAX_TTL"]).unwrap_err().to_string();
        assert!(e.contains("did you mean SIGNET_CA__MAX_TTL?"), "{e}");
        // A nested key with one underscore.
        let e = check(&["SIGNET_CA_MAX_TTL"]).unwrap_err().to_string();
        assert!(
            e.contains("did you mean SIGNET_CA__MAX_TTL? (a nested key takes a double"),
            "{e}"
        );
        // Nothing close: the keys are listed.
        let e = check(&["SIGNET_WHATEVER"]).unwrap_err().to_string();
        assert!(
            e.contains("its variables are SIGNET_<KEY> for the keys trust_domain, database_url"),
            "{e}"
        );
    }

    #[test]
    fn keys_other_programs_and_service_links_pass() {
        check(&[
            "SIGNET_DATABASE_URL",
            "SIGNET_CA__MAX_TTL",
            "signet_data_dir",
            "SIGNET_ADMIN_SOCKET",
            "SIGNET_AGENT_JOIN_TOKEN",
            "SIGNET_SERVER_SERVICE_HOST",
            "SIGNET_SERVER_SERVICE_PORT",
            "SIGNET_SERVER_SERVICE_PORT_GRPC",
            "SIGNET_SERVER_PORT",
            "SIGNET_SERVER_PORT_8443_TCP",
            "SIGNET_SERVER_PORT_8443_TCP_ADDR",
            "SIGNET_SERVER_PORT_53_UDP_PROTO",
            "OTHER_VARIABLE",
        ])
        .unwrap();
        for not_a_link in [
            "SIGNET_SERVER_PORT_X_TCP",
            "SIGNET_SERVER_PORT_8443_TCP_HOST",
            "SIGNET_SERVER_PORTS",
        ] {
            assert!(!is_kubernetes_service_link(not_a_link), "{not_a_link}");
            check(&[not_a_link]).unwrap_err();
        }
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("database_ur", "database_url"), 1);
        assert_eq!(edit_distance("trust_domian", "trust_domain"), 2);
        assert_eq!(edit_distance("", "ca"), 2);
        assert_eq!(edit_distance("ca", "ca"), 0);
    }
}
