//! DNS names and labels as a certificate or a Kubernetes object may carry them.
//!
//! The one definition of their syntax: the server's issuance policy, its registration-entry
//! validation and the fuzz bodies all ask these types. Invariant: a [`DnsName`], [`DnsLabel`]
//! or [`Dns1123Label`] can only be built valid (the constructors check, there is no other way
//! in), and each `is_valid` says exactly what its constructor accepts.
//!
//! - [`DnsName`]: LDH labels of 1–63 characters, at most 253 in all, no trailing dot,
//!   optionally a leading `*` label (`*.example.org`); never an IP address literal.
//! - [`DnsLabel`]: one LDH label (letters, digits, `-`; 1–63; no leading or trailing `-`).
//! - [`Dns1123Label`]: a Kubernetes namespace name (RFC 1123 label): a [`DnsLabel`] in
//!   lowercase.
//! - [`Dns1123Subdomain`]: a Kubernetes object name (Secret, ServiceAccount, Node): one or more
//!   [`Dns1123Label`]s joined by `.`, at most 253 in all. Stricter than Kubernetes' own
//!   `IsDNS1123Subdomain` in one way: each label is at most 63 (RFC 1123), as a DNS name's is.
//!
//! Which to use for a Kubernetes name: a namespace is a [`Dns1123Label`]; a Secret, a Node or
//! a ServiceAccount name is a [`Dns1123Subdomain`].

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// Longest DNS name, in bytes (RFC 1035 without the trailing dot).
pub const MAX_NAME_LEN: usize = 253;
/// Longest DNS label, in bytes.
pub const MAX_LABEL_LEN: usize = 63;

/// Why a string is not a DNS name or label. The input itself is never repeated: it may be
/// hostile, so the caller quotes it (see [`crate::untrusted`]) where a message needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DnsError {
    #[error("is empty")]
    Empty,
    #[error("is longer than {MAX_NAME_LEN} bytes")]
    NameTooLong,
    #[error("is an IP address, not a DNS name")]
    IpAddress,
    #[error(
        "has a label that is empty, longer than {MAX_LABEL_LEN} bytes, starts or ends with '-', \
         or has a character other than a letter, a digit or '-'"
    )]
    BadLabel,
    #[error("has uppercase letters; a Kubernetes name is lowercase")]
    Uppercase,
}

/// A DNS name as it may appear in a certificate (see the module docs). Kept as written; names
/// compare case-insensitively where they are matched (policy), not here.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsName(String);

impl DnsName {
    /// Checks `name`: see the module docs.
    pub fn new(name: &str) -> Result<Self, DnsError> {
        check_name(name)?;
        Ok(Self(name.to_owned()))
    }

    /// Whether [`DnsName::new`] accepts `name`.
    pub fn is_valid(name: &str) -> bool {
        check_name(name).is_ok()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the name is a wildcard (`*.rest`).
    pub fn is_wildcard(&self) -> bool {
        self.0.starts_with("*.")
    }
}

fn check_name(name: &str) -> Result<(), DnsError> {
    if name.is_empty() {
        return Err(DnsError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(DnsError::NameTooLong);
    }
    if name.parse::<IpAddr>().is_ok() {
        return Err(DnsError::IpAddress);
    }
    let rest = name.strip_prefix("*.").unwrap_or(name);
    if rest.is_empty() || !rest.split('.').all(DnsLabel::is_valid) {
        return Err(DnsError::BadLabel);
    }
    Ok(())
}

/// One LDH label: 1–63 letters, digits and `-`, not starting or ending with `-`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsLabel(String);

impl DnsLabel {
    pub fn new(label: &str) -> Result<Self, DnsError> {
        check_label(label)?;
        Ok(Self(label.to_owned()))
    }

    /// Whether [`DnsLabel::new`] accepts `label`.
    pub fn is_valid(label: &str) -> bool {
        check_label(label).is_ok()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn check_label(label: &str) -> Result<(), DnsError> {
    if label.is_empty() {
        return Err(DnsError::Empty);
    }
    let ldh = label.len() <= MAX_LABEL_LEN
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ldh { Ok(()) } else { Err(DnsError::BadLabel) }
}

/// A Kubernetes namespace (or other RFC 1123 label) name: a [`DnsLabel`] in lowercase.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dns1123Label(String);

impl Dns1123Label {
    pub fn new(label: &str) -> Result<Self, DnsError> {
        check_1123_label(label)?;
        Ok(Self(label.to_owned()))
    }

    /// Whether [`Dns1123Label::new`] accepts `label`.
    pub fn is_valid(label: &str) -> bool {
        check_1123_label(label).is_ok()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn check_1123_label(label: &str) -> Result<(), DnsError> {
    check_label(label)?;
    if label.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(DnsError::Uppercase);
    }
    Ok(())
}

/// A Kubernetes object name (RFC 1123 subdomain): lowercase [`Dns1123Label`]s of 1–63
/// joined by `.`, at most 253 bytes; so every label starts and ends with a letter or digit,
/// and there is no empty label (`a..b`, `.a`, `a.` are refused).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dns1123Subdomain(String);

impl Dns1123Subdomain {
    pub fn new(name: &str) -> Result<Self, DnsError> {
        check_1123_subdomain(name)?;
        Ok(Self(name.to_owned()))
    }

    /// Whether [`Dns1123Subdomain::new`] accepts `name`.
    pub fn is_valid(name: &str) -> bool {
        check_1123_subdomain(name).is_ok()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn check_1123_subdomain(name: &str) -> Result<(), DnsError> {
    if name.is_empty() {
        return Err(DnsError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(DnsError::NameTooLong);
    }
    for label in name.split('.') {
        check_1123_label(label).map_err(|e| match e {
            DnsError::Empty => DnsError::BadLabel,
            e => e,
        })?;
    }
    Ok(())
}

macro_rules! string_newtype {
    ($t:ident) => {
        impl FromStr for $t {
            type Err = DnsError;
            fn from_str(s: &str) -> Result<Self, DnsError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $t {
            type Error = DnsError;
            fn try_from(s: String) -> Result<Self, DnsError> {
                Self::new(&s)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($t), self.0)
            }
        }

        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.0
            }
        }

        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<String> for $t {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$t> for String {
            fn eq(&self, other: &$t) -> bool {
                self == &other.0
            }
        }
    };
}

string_newtype!(DnsName);
string_newtype!(DnsLabel);
string_newtype!(Dns1123Label);
string_newtype!(Dns1123Subdomain);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_name_syntax() {
        for ok in [
            "localhost",
            "a.b",
            "*.example.org",
            "x-1.example.org",
            "Mixed.Case.org",
            &"a".repeat(63),
        ] {
            assert!(DnsName::is_valid(ok), "{ok}");
            let n: DnsName = ok.parse().expect("valid");
            assert_eq!(n.to_string(), ok, "kept as written");
            assert_eq!(n.is_wildcard(), ok.starts_with("*."));
        }
        for (bad, why) in [
            ("", DnsError::Empty),
            (".", DnsError::BadLabel),
            ("a.", DnsError::BadLabel),
            ("*", DnsError::BadLabel),
            ("*.", DnsError::BadLabel),
            ("a.*.b", DnsError::BadLabel),
            ("a_b", DnsError::BadLabel),
            ("-a", DnsError::BadLabel),
            ("a-", DnsError::BadLabel),
            ("::1", DnsError::IpAddress),
            ("1.2.3.4", DnsError::IpAddress),
            (&"a".repeat(64), DnsError::BadLabel),
            (&format!("{}.b", "a.".repeat(127)), DnsError::NameTooLong),
        ] {
            assert!(!DnsName::is_valid(bad), "{bad}");
            assert_eq!(DnsName::new(bad), Err(why), "{bad}");
        }
    }

    #[test]
    fn labels_and_kubernetes_names() {
        for ok in ["a", "web-1", "A1", &"z".repeat(63)] {
            assert!(DnsLabel::is_valid(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "a.b", "a_b", "*", &"z".repeat(64)] {
            assert!(!DnsLabel::is_valid(bad), "{bad}");
        }
        assert!(Dns1123Label::is_valid("signet-system"));
        assert_eq!(Dns1123Label::new("Default"), Err(DnsError::Uppercase));
        assert_eq!(Dns1123Label::new("a.b"), Err(DnsError::BadLabel));
        let ns: Dns1123Label = "web".parse().expect("valid");
        assert_eq!(ns.as_str(), "web");
        assert_eq!(format!("{ns:?}"), "Dns1123Label(\"web\")");
    }

    #[test]
    fn kubernetes_object_names() {
        for ok in [
            "a",
            "web-1",
            "signet-agent",
            "a.b",
            "istio.default",
            "0.1-x.z9",
            &"z".repeat(63),
            &format!("{}b", "a.".repeat(126)),
        ] {
            assert!(Dns1123Subdomain::is_valid(ok), "{ok}");
            let n: Dns1123Subdomain = ok.parse().expect("valid");
            assert_eq!(n.to_string(), ok, "kept as written");
        }
        for (bad, why) in [
            ("", DnsError::Empty),
            (".", DnsError::BadLabel),
            ("a.", DnsError::BadLabel),
            (".a", DnsError::BadLabel),
            ("a..b", DnsError::BadLabel),
            ("-a", DnsError::BadLabel),
            ("a-", DnsError::BadLabel),
            ("a.-b", DnsError::BadLabel),
            ("a-.b", DnsError::BadLabel),
            ("a_b", DnsError::BadLabel),
            ("a b", DnsError::BadLabel),
            ("*.a", DnsError::BadLabel),
            ("Web", DnsError::Uppercase),
            ("a.B", DnsError::Uppercase),
            (&"z".repeat(64), DnsError::BadLabel),
            (&format!("a.{}", "z".repeat(64)), DnsError::BadLabel),
            (&format!("{}bc", "a.".repeat(126)), DnsError::NameTooLong),
        ] {
            assert!(!Dns1123Subdomain::is_valid(bad), "{bad}");
            assert_eq!(Dns1123Subdomain::new(bad), Err(why), "{bad}");
        }
        // Every RFC 1123 label is a one-label subdomain, and only lowercase DNS names are.
        assert!(Dns1123Subdomain::is_valid("signet-system"));
        let ns: Dns1123Label = "web".parse().expect("valid");
        let owned = String::from("web");
        assert_eq!(ns, *"web");
        assert_eq!(ns, owned);
        assert_eq!(owned, ns);
    }

    /// What the four copies this type replaced accepted and it does not (issue 25): the
    /// agent's sink-name check (`agent/src/config.rs`) let `a..b`, `a.-b`, `a-.b` and `.` in
    /// names of more than one character through (it only looked at the first and last
    /// character); none of the four bounded a label to 63; the server's PSAT node-name check
    /// (`server/src/authn/psat.rs`) had no total bound of 253 either.
    #[test]
    fn inputs_the_old_copies_accepted_are_refused() {
        let long_label = format!("a.{}", "b".repeat(64));
        let long_name = format!("{}bc", "a.".repeat(126));
        for bad in ["a..b", "a.-b", "a-.b", &long_label, &long_name] {
            assert!(!Dns1123Subdomain::is_valid(bad), "{bad}");
        }
    }

    #[test]
    fn errors_never_repeat_the_input() {
        let hostile = "evil\u{1b}[31m_name";
        let e = DnsName::new(hostile).expect_err("invalid");
        assert!(!e.to_string().contains("evil"), "{e}");
    }
}
