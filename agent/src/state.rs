//! The agent's state as the Workload API and the sinks see it: the identities it holds (entry,
//! selectors, current SVID: a [`signet_pki::X509Svid`], checked when it was made) and the
//! trust bundle. Published through a `tokio::sync::watch`. Nothing here is persisted: the
//! node identity's files are [`crate::node`]'s.
//!
//! Memory: each SVID, the bundle and the CRLs are held once, behind an `Arc`, and shared by
//! the rotator, this state and the sinks ([`crate::sinks::Delivered`]); a new state clones
//! pointers, never certificates.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use signet_pki::X509Svid;

/// A workload selector. All of an entry's selectors must match a caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Selector {
    Uid(u32),
    Gid(u32),
    /// A user name, resolved to a uid through `/etc/passwd` at match time.
    User(String),
    /// The caller's executable, an absolute path.
    Path(PathBuf),
    /// The namespace of the caller's pod (Kubernetes workload attestation).
    K8sNamespace(String),
    /// The service account of the caller's pod.
    K8sServiceAccount(String),
    /// A label of the caller's pod: key, value.
    K8sPodLabel(String, String),
}

impl Selector {
    /// Whether this selector is proved by the Kubernetes attestor (the caller's pod), rather
    /// than by the caller's Unix credentials.
    pub fn is_kubernetes(&self) -> bool {
        matches!(
            self,
            Selector::K8sNamespace(_) | Selector::K8sServiceAccount(_) | Selector::K8sPodLabel(..)
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selector {0:?}: {1}")]
pub struct SelectorError(pub String, pub &'static str);

impl FromStr for Selector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| SelectorError(s.to_owned(), why);
        if let Some(rest) = s.strip_prefix("k8s:") {
            return parse_k8s(rest).map_err(err);
        }
        let rest = s
            .strip_prefix("unix:")
            .ok_or_else(|| err("only unix: and k8s: selectors are supported"))?;
        let (kind, value) = rest
            .split_once(':')
            .ok_or_else(|| err("expected unix:<kind>:<value>"))?;
        match kind {
            "uid" => value.parse().map(Selector::Uid).map_err(|_| err("bad uid")),
            "gid" => value.parse().map(Selector::Gid).map_err(|_| err("bad gid")),
            "user" if !value.is_empty() && !value.contains(':') => {
                Ok(Selector::User(value.to_owned()))
            }
            "user" => Err(err("bad user name")),
            "path" if value.starts_with('/') => Ok(Selector::Path(PathBuf::from(value))),
            "path" => Err(err("path must be absolute")),
            _ => Err(err("unknown unix selector kind")),
        }
    }
}

/// `ns:<ns>`, `sa:<sa>`, `pod-label:<key>:<value>` (after `k8s:`), with the server's rules:
/// namespace and service account are DNS labels; a label key may hold a `prefix/`.
fn parse_k8s(rest: &str) -> Result<Selector, &'static str> {
    let (kind, value) = rest.split_once(':').ok_or("expected k8s:<kind>:<value>")?;
    match kind {
        "ns" if is_dns_label(value) => Ok(Selector::K8sNamespace(value.to_owned())),
        "sa" if is_dns_label(value) => Ok(Selector::K8sServiceAccount(value.to_owned())),
        "ns" | "sa" => Err("namespace and service account must be DNS labels"),
        "pod-label" => {
            let (k, v) = value
                .split_once(':')
                .ok_or("expected k8s:pod-label:<key>:<value>")?;
            let key_ok = !k.is_empty()
                && k.len() <= 317
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
            let value_ok = v.len() <= 63
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if key_ok && value_ok {
                Ok(Selector::K8sPodLabel(k.to_owned(), v.to_owned()))
            } else {
                Err("label key or value has characters Kubernetes does not allow")
            }
        }
        _ => Err("k8s selectors are ns, sa or pod-label"),
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Uid(u) => write!(f, "unix:uid:{u}"),
            Selector::Gid(g) => write!(f, "unix:gid:{g}"),
            Selector::User(n) => write!(f, "unix:user:{n}"),
            Selector::Path(p) => write!(f, "unix:path:{}", p.display()),
            Selector::K8sNamespace(n) => write!(f, "k8s:ns:{n}"),
            Selector::K8sServiceAccount(n) => write!(f, "k8s:sa:{n}"),
            Selector::K8sPodLabel(k, v) => write!(f, "k8s:pod-label:{k}:{v}"),
        }
    }
}

/// One registration entry the agent serves, with its current SVID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub entry_id: String,
    pub selectors: Vec<Selector>,
    /// The chain (leaf first, the roots left out: they are the bundle) and its key; shared with
    /// the rotator and the sinks.
    pub svid: Arc<X509Svid>,
}

/// Everything the Workload API serves. Cheap to clone (shared behind `Arc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentState {
    pub identities: Vec<Identity>,
    /// The trust domain's roots, DER.
    pub bundle_der: Ders,
    /// The trust domain, `spiffe://example.org`, for `X509BundlesResponse` keys. Empty when
    /// no bundle is known yet.
    pub trust_domain_id: String,
    /// The issuing CAs' verified CRLs (DER, one per CA key; see [`crate::revocation`]),
    /// served in the Workload API's `crl` fields and written as `crl.pem` by the files sink.
    pub crls_der: Ders,
}

/// DER blobs held once and shared (the bundle's roots, the CRLs): cloning copies a pointer.
pub type Ders = Arc<[Vec<u8>]>;

pub type SharedState = Arc<AgentState>;
pub type StateSender = tokio::sync::watch::Sender<SharedState>;
pub type StateReceiver = tokio::sync::watch::Receiver<SharedState>;

/// A fresh, empty state channel.
pub fn channel() -> (StateSender, StateReceiver) {
    tokio::sync::watch::channel(Arc::new(AgentState::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_round_trip() {
        for s in [
            "unix:uid:1000",
            "unix:gid:0",
            "unix:user:www-data",
            "unix:path:/usr/bin/app",
            "k8s:ns:team-a",
            "k8s:sa:web-1",
            "k8s:pod-label:app.kubernetes.io/name:web",
            "k8s:pod-label:tier:",
        ] {
            let sel: Selector = s.parse().expect(s);
            assert_eq!(sel.to_string(), s);
        }
    }

    #[test]
    fn bad_selectors_are_refused() {
        for s in [
            "k8s:ns:Default",
            "k8s:ns:-x",
            "k8s:sa:",
            "k8s:pod-label:app",
            "k8s:pod-label::v",
            "k8s:pod-label:app:a b",
            "k8s:node:x",
            "docker:label:x",
            "unix:uid:-1",
            "unix:uid:x",
            "unix:path:relative",
            "unix:user:",
            "unix:shell:/bin/sh",
            "unix:uid",
        ] {
            assert!(s.parse::<Selector>().is_err(), "{s}");
        }
    }

    #[test]
    fn kubernetes_selectors_are_told_apart() {
        let k: Selector = "k8s:pod-label:a:b".parse().expect("label");
        assert_eq!(k, Selector::K8sPodLabel("a".into(), "b".into()));
        assert!(k.is_kubernetes());
        assert!(!Selector::Uid(0).is_kubernetes());
        assert!(!Selector::Path("/bin/x".into()).is_kubernetes());
    }

    #[test]
    fn svid_debug_hides_key() {
        let svid = crate::testing::self_signed_svid(
            "spiffe://example.org/a",
            std::time::SystemTime::now(),
            std::time::Duration::from_secs(60),
        );
        let key = svid.key().pkcs8_der();
        let shown = format!("{svid:?}");
        assert!(!shown.contains(&format!("{key:?}")), "{shown}");
        assert!(!shown.contains(&format!("{:?}", &key[..8])), "{shown}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
    }
}
