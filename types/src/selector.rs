//! Registration-entry selectors: the one grammar the server validates an entry's selectors
//! with and the agent parses them with before matching a caller.
//!
//! ```text
//! unix:uid:<n>            n: 0..=4294967295, decimal, no sign, no leading zero
//! unix:gid:<n>            as uid
//! unix:user:<name>        letters, digits, '_', '-', '.', '$'
//! unix:path:<path>        absolute; no '.', '..' or empty components ('//', a trailing '/')
//! k8s:ns:<namespace>      a Kubernetes namespace: an RFC 1123 label
//! k8s:sa:<name>           a service account: an RFC 1123 label (as the server always required)
//! k8s:pod-label:<key>:<value>
//!                         key: 1..=317 of letters, digits, '-', '_', '.', '/';
//!                         value: 0..=63 of letters, digits, '-', '_', '.'
//! ```
//!
//! Invariants: a selector is at most [`MAX_SELECTOR_LEN`] bytes with no control character;
//! only the canonical spelling parses, so for every accepted `s`,
//! `s.parse::<Selector>()?.to_string() == s` (the server stores what the operator wrote and
//! the agent prints the same text back; two stored strings that differ are two different
//! selectors). Anything the server accepts, the agent can match, and the other way round:
//! they both call [`Selector::from_str`].
//!
//! The variants are public so that code (and tests) can build a selector from values it
//! already trusts (a uid, an executable path); text from outside goes through `FromStr`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::dns::Dns1123Label;
use crate::untrusted::quoted;

/// Longest selector, in bytes.
pub const MAX_SELECTOR_LEN: usize = 1024;
/// Longest pod label key (a 253-byte DNS prefix, `/`, a 63-byte name), in bytes.
pub const MAX_LABEL_KEY_LEN: usize = 317;
/// Longest pod label value, in bytes.
pub const MAX_LABEL_VALUE_LEN: usize = 63;

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
    K8sNamespace(Dns1123Label),
    /// The service account of the caller's pod.
    K8sServiceAccount(Dns1123Label),
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

/// Why a selector was refused, without the input (which may be hostile).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorReason {
    #[error("is longer than {MAX_SELECTOR_LEN} bytes")]
    TooLong,
    #[error("contains control characters")]
    ControlCharacter,
    #[error(
        "contains an invisible character (a Unicode format character such as a zero-width space \
         or a bidirectional override, or a line or paragraph separator)"
    )]
    InvisibleCharacter,
    #[error("ends with a space, which a listing does not show")]
    TrailingSpace,
    #[error("expected <type>:<key>:<value>, e.g. unix:uid:1000")]
    Shape,
    #[error("has an empty value")]
    EmptyValue,
    #[error("the type must be unix or k8s")]
    UnknownType,
    #[error("unix selectors are uid, gid, user or path")]
    UnknownUnixKind,
    #[error("k8s selectors are ns, sa or pod-label")]
    UnknownK8sKind,
    #[error(
        "the value must be a number (0 to 4294967295), written without a sign or leading zeros"
    )]
    BadId,
    #[error("a user name may contain letters, digits, '_', '-', '.', '$'")]
    BadUser,
    #[error("the path must be absolute")]
    RelativePath,
    #[error("the path must not contain '.', '..' or empty components ('//', a trailing '/')")]
    PathComponents,
    #[error("must be a DNS label (lowercase letters, digits, '-', at most 63)")]
    BadKubernetesName,
    #[error("expected k8s:pod-label:<key>:<value>")]
    PodLabelShape,
    #[error(
        "label key must be 1 to {MAX_LABEL_KEY_LEN} bytes and the value at most \
         {MAX_LABEL_VALUE_LEN}"
    )]
    PodLabelLength,
    #[error("label key or value has characters Kubernetes does not allow")]
    PodLabelCharacters,
}

/// A refused selector: the input, quoted and cut short ([`crate::untrusted::quoted`]), and
/// why. Displays as `selector "<input>": <reason>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("selector {input}: {reason}")]
pub struct SelectorError {
    input: String,
    reason: SelectorReason,
}

impl SelectorError {
    fn new(input: &str, reason: SelectorReason) -> Self {
        Self {
            input: quoted(input),
            reason,
        }
    }

    pub fn reason(&self) -> SelectorReason {
        self.reason
    }
}

impl FromStr for Selector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, SelectorError> {
        parse(s).map_err(|reason| SelectorError::new(s, reason))
    }
}

impl TryFrom<&str> for Selector {
    type Error = SelectorError;
    fn try_from(s: &str) -> Result<Self, SelectorError> {
        s.parse()
    }
}

/// Whether `c` is a character a person reading a selector cannot see or cannot tell from a
/// space: Unicode's format characters (general category Cf, as of Unicode 15: zero-width spaces
/// and joiners, bidirectional marks and overrides, the byte order mark, invisible operators,
/// tags), the other default-ignorable code points, and whitespace other than the ASCII space
/// (no-break, ideographic, line and paragraph separators). Two selectors that look the same must be the same selector,
/// so an operator reviewing `entry show` sees what the agent matches. (JWT-SVID audiences
/// follow the same rule: [`crate::audience`].)
pub fn is_invisible(c: char) -> bool {
    // Whitespace other than the ASCII space (no-break and ideographic spaces look like it).
    (c.is_whitespace() && c != ' ')
        || matches!(
            c,
            // Default-ignorable code points that are not format characters: the combining
            // grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian free variation
            // selectors, variation selectors, unassigned ignorables.
            '\u{34f}'
                | '\u{115f}'..='\u{1160}'
                | '\u{17b4}'..='\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{ffa0}'
                | '\u{fff0}'..='\u{fff8}'
                | '\u{e0000}'..='\u{e0fff}'
        )
        || matches!(
            c,
            '\u{ad}'
                | '\u{600}'..='\u{605}'
                | '\u{61c}'
                | '\u{6dd}'
                | '\u{70f}'
                | '\u{890}'..='\u{891}'
                | '\u{8e2}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{110bd}'
                | '\u{110cd}'
                | '\u{13430}'..='\u{1343f}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0001}'
                | '\u{e0020}'..='\u{e007f}'
        )
}

fn parse(s: &str) -> Result<Selector, SelectorReason> {
    use SelectorReason as R;
    if s.len() > MAX_SELECTOR_LEN {
        return Err(R::TooLong);
    }
    if s.chars().any(char::is_control) {
        return Err(R::ControlCharacter);
    }
    if s.chars().any(is_invisible) {
        return Err(R::InvisibleCharacter);
    }
    if s.ends_with(' ') {
        return Err(R::TrailingSpace);
    }
    let mut parts = s.splitn(3, ':');
    let (Some(kind), Some(key), Some(value)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(R::Shape);
    };
    if value.is_empty() {
        return Err(R::EmptyValue);
    }
    match (kind, key) {
        ("unix", "uid") => parse_id(value).map(Selector::Uid),
        ("unix", "gid") => parse_id(value).map(Selector::Gid),
        ("unix", "user") => {
            if value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'))
            {
                Ok(Selector::User(value.to_owned()))
            } else {
                Err(R::BadUser)
            }
        }
        ("unix", "path") => {
            let Some(rest) = value.strip_prefix('/') else {
                return Err(R::RelativePath);
            };
            if rest
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
            {
                return Err(R::PathComponents);
            }
            Ok(Selector::Path(PathBuf::from(value)))
        }
        ("k8s", "ns") => Dns1123Label::new(value)
            .map(Selector::K8sNamespace)
            .map_err(|_| R::BadKubernetesName),
        ("k8s", "sa") => Dns1123Label::new(value)
            .map(Selector::K8sServiceAccount)
            .map_err(|_| R::BadKubernetesName),
        ("k8s", "pod-label") => {
            let (k, v) = value.split_once(':').ok_or(R::PodLabelShape)?;
            if k.is_empty() || k.len() > MAX_LABEL_KEY_LEN || v.len() > MAX_LABEL_VALUE_LEN {
                return Err(R::PodLabelLength);
            }
            let key_ok = k
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
            let value_ok = v
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if key_ok && value_ok {
                Ok(Selector::K8sPodLabel(k.to_owned(), v.to_owned()))
            } else {
                Err(R::PodLabelCharacters)
            }
        }
        ("unix", _) => Err(R::UnknownUnixKind),
        ("k8s", _) => Err(R::UnknownK8sKind),
        _ => Err(R::UnknownType),
    }
}

/// A uid or gid in its one spelling: decimal digits, no sign, no leading zero (but `0`).
fn parse_id(value: &str) -> Result<u32, SelectorReason> {
    let canonical =
        value.bytes().all(|b| b.is_ascii_digit()) && (value == "0" || !value.starts_with('0'));
    if !canonical {
        return Err(SelectorReason::BadId);
    }
    value.parse().map_err(|_| SelectorReason::BadId)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> Dns1123Label {
        s.parse().expect("namespace")
    }

    /// The agent's round trip (was `agent/src/state.rs`) and the server's accepted list (was
    /// `server/src/nodes.rs`), now one grammar.
    #[test]
    fn selectors_round_trip() {
        for s in [
            // agent
            "unix:uid:1000",
            "unix:gid:0",
            "unix:user:www-data",
            "unix:path:/usr/bin/app",
            "k8s:ns:team-a",
            "k8s:sa:web-1",
            "k8s:pod-label:app.kubernetes.io/name:web",
            "k8s:pod-label:tier:",
            // server
            "k8s:ns:default",
            "unix:uid:4294967295",
            "unix:user:svc$",
            "unix:path:/opt/a:b",
        ] {
            let sel: Selector = s.parse().expect(s);
            assert_eq!(sel.to_string(), s);
            assert_eq!(Selector::try_from(s).as_ref(), Ok(&sel));
            assert_eq!(sel.to_string().parse::<Selector>().as_ref(), Ok(&sel));
        }
    }

    #[test]
    fn bad_selectors_are_refused() {
        use SelectorReason as R;
        for (s, why) in [
            // the agent's refusals
            ("k8s:ns:Default", R::BadKubernetesName),
            ("k8s:ns:-x", R::BadKubernetesName),
            ("k8s:sa:", R::EmptyValue),
            ("k8s:pod-label:app", R::PodLabelShape),
            ("k8s:pod-label::v", R::PodLabelLength),
            ("k8s:pod-label:app:a b", R::PodLabelCharacters),
            ("k8s:node:x", R::UnknownK8sKind),
            ("docker:label:x", R::UnknownType),
            ("unix:uid:-1", R::BadId),
            ("unix:uid:x", R::BadId),
            ("unix:path:relative", R::RelativePath),
            ("unix:user:", R::EmptyValue),
            ("unix:shell:/bin/sh", R::UnknownUnixKind),
            ("unix:uid", R::Shape),
            // the server's refusals
            ("", R::Shape),
            ("unix", R::Shape),
            ("unix:uid:", R::EmptyValue),
            ("unix:uid:abc", R::BadId),
            ("unix:uid:99999999999", R::BadId),
            ("unix:path:relative/app", R::RelativePath),
            ("unix:path:/usr/../bin/sh", R::PathComponents),
            ("unix:user:bad user", R::BadUser),
            ("unix:pid:1", R::UnknownUnixKind),
            ("unix:path:/a\nb", R::ControlCharacter),
        ] {
            let e = s.parse::<Selector>().expect_err(s);
            assert_eq!(e.reason(), why, "{s:?}");
            assert!(e.to_string().starts_with("selector \""), "{e}");
        }
        let long = format!("unix:path:/{}", "a".repeat(MAX_SELECTOR_LEN));
        assert_eq!(
            long.parse::<Selector>().map_err(|e| e.reason()),
            Err(R::TooLong)
        );
    }

    /// Where the agent's parser (`agent/src/state.rs`) and the server's validation
    /// (`server/src/nodes.rs`) disagreed, the stricter rule won; and a selector now has one
    /// spelling. Each of these was accepted by at least one of them before.
    #[test]
    fn inputs_that_changed() {
        use SelectorReason as R;
        for (s, why) in [
            // accepted by the agent only
            ("unix:user:a b", R::BadUser),
            ("unix:user:ü", R::BadUser),
            ("unix:path:/usr/../bin/sh", R::PathComponents),
            ("unix:path:/usr/./bin/sh", R::PathComponents),
            ("unix:path:/a\tb", R::ControlCharacter),
            ("k8s:pod-label:app:a\u{7f}", R::ControlCharacter),
            ("unix:path:/usr/bin/\u{202e}hsab", R::InvisibleCharacter),
            ("unix:path:/usr/bin/ba\u{200b}sh", R::InvisibleCharacter),
            ("unix:path:/a\u{2028}b", R::InvisibleCharacter),
            ("unix:path:/a\u{2029}b", R::InvisibleCharacter),
            ("unix:path:/\u{feff}a", R::InvisibleCharacter),
            ("unix:path:/a\u{e0041}", R::InvisibleCharacter),
            ("unix:path:/usr/bin/app\u{a0}", R::InvisibleCharacter),
            ("unix:path:/usr/bin/app\u{3164}", R::InvisibleCharacter),
            ("unix:path:/usr/bin/app\u{34f}", R::InvisibleCharacter),
            ("unix:path:/usr/bin/app\u{fe0f}", R::InvisibleCharacter),
            ("unix:path:/usr/bin\u{3000}/app", R::InvisibleCharacter),
            ("unix:path:/usr/bin/app ", R::TrailingSpace),
            ("unix:user:app ", R::TrailingSpace),
            // accepted by both: not in the one canonical spelling
            ("unix:uid:+1000", R::BadId),
            ("unix:uid:01000", R::BadId),
            ("unix:gid:00", R::BadId),
            ("unix:path:/usr//bin/app", R::PathComponents),
            ("unix:path:/usr/bin/app/", R::PathComponents),
            ("unix:path:/", R::PathComponents),
        ] {
            assert_eq!(
                s.parse::<Selector>().map_err(|e| e.reason()),
                Err(why),
                "{s:?}"
            );
        }
        let long = format!("unix:path:/{}", "a".repeat(MAX_SELECTOR_LEN));
        assert!(
            long.parse::<Selector>().is_err(),
            "agent had no length bound"
        );
        // Visible non-ASCII stays a path a person can read and match.
        assert_eq!(
            "unix:path:/opt/café/bin/ünïcode".parse::<Selector>(),
            Ok(Selector::Path(PathBuf::from("/opt/café/bin/ünïcode")))
        );
    }

    #[test]
    fn kubernetes_selectors_are_told_apart() {
        let k: Selector = "k8s:pod-label:a:b".parse().expect("label");
        assert_eq!(k, Selector::K8sPodLabel("a".into(), "b".into()));
        assert!(k.is_kubernetes());
        assert!(!Selector::Uid(0).is_kubernetes());
        assert!(!Selector::Path("/bin/x".into()).is_kubernetes());
        let n: Selector = "k8s:ns:team-a".parse().expect("ns");
        assert_eq!(n, Selector::K8sNamespace(ns("team-a")));
        assert!(n.is_kubernetes());
    }

    #[test]
    fn errors_quote_the_input() {
        let e = "unix:uid:\u{1b}[31m".parse::<Selector>().expect_err("bad");
        assert!(!e.to_string().contains('\u{1b}'), "{e}");
        let e = format!("x{}", "a".repeat(5000))
            .parse::<Selector>()
            .expect_err("bad");
        assert!(e.to_string().len() < 600, "{e}");
    }
}
