//! Layered configuration, loaded the same way by every binary that has a configuration file:
//! the binary's defaults, then a TOML file, then environment variables under the binary's
//! prefix, then command-line flags; each layer wins over the ones before it.
//!
//! The invariants: **an unknown key is refused, by name and source** (the configuration types
//! are `#[serde(deny_unknown_fields)]`; figment's message names the key and where it came
//! from), and **only variables naming a known top-level key are configuration**: other tools'
//! variables under the same prefix (`SIGNET_ADMIN_SOCKET` for signetctl, test settings) are
//! not ours, while below a known key a misspelt name is still refused (`SIGNET_CA__MAX_TLL`).
//! Nested keys use a double underscore in the environment (`SIGNET_CA__DEFAULT_TTL=30m`).

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
        let msgs: Vec<String> = e.into_iter().map(|e| e.to_string()).collect();
        LoadError(msgs.join("; "))
    }
}

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
    pub fn file(mut self, file: Option<&Path>) -> Result<Self, LoadError> {
        if let Some(f) = file {
            if !f.exists() {
                return Err(LoadError(format!(
                    "config file {} does not exist",
                    f.display()
                )));
            }
            self.fig = self.fig.merge(Toml::file_exact(f));
        }
        Ok(self)
    }

    /// Merges the variables `<prefix><KEY>` whose first key is one of `top_level_keys`
    /// (compared without case); `__` separates nested keys.
    pub fn env(mut self, prefix: &str, top_level_keys: &'static [&'static str]) -> Self {
        let env = Env::prefixed(prefix).split("__").filter(move |key| {
            let top = key.as_str().split('.').next().unwrap_or_default();
            top_level_keys.iter().any(|k| k.eq_ignore_ascii_case(top))
        });
        self.fig = self.fig.merge(env);
        self
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
    fn layers_win_in_order() {
        let f = toml("name = 'file'\nport = 1\n[inner]\nttl = 5\n");
        #[derive(Serialize)]
        struct Flags {
            port: u16,
        }
        let c: Cfg = Layers::new(Cfg::default())
            .file(Some(&f.0))
            .unwrap()
            .env("SIGNET_RUNTIME_TEST_NONE_", KEYS)
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
}
