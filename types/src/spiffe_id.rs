use std::fmt;
use std::str::FromStr;

const SCHEME: &str = "spiffe://";
/// The standard says implementations accept IDs up to 2048 bytes.
const MAX_ID_LEN: usize = 2048;
const MAX_TRUST_DOMAIN_LEN: usize = 255;

/// Why a string is not a SPIFFE ID or trust domain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpiffeIdError {
    #[error("SPIFFE ID is empty")]
    Empty,
    #[error("SPIFFE ID must start with \"spiffe://\"")]
    WrongScheme,
    #[error("SPIFFE ID is longer than {MAX_ID_LEN} bytes")]
    TooLong,
    #[error("trust domain is missing")]
    MissingTrustDomain,
    #[error("trust domain is longer than {MAX_TRUST_DOMAIN_LEN} bytes")]
    TrustDomainTooLong,
    #[error(
        "trust domain contains {0:?}; only lowercase letters, digits, '.', '-' and '_' are allowed (no port, no user info)"
    )]
    BadTrustDomainChar(char),
    #[error("path segment is empty (double or trailing '/')")]
    EmptySegment,
    #[error("path segment '.' or '..' is not allowed")]
    DotSegment,
    #[error("path contains {0:?}; only letters, digits, '.', '-' and '_' are allowed")]
    BadPathChar(char),
    #[error("a trust domain ID has no path, but this one does")]
    UnexpectedPath,
}

/// A trust domain name such as `example.org`: validated, stored lowercase.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrustDomain(String);

impl TrustDomain {
    /// Parses a bare trust domain name (`example.org`) or a trust domain ID (`spiffe://example.org`).
    pub fn new(s: &str) -> Result<Self, SpiffeIdError> {
        if s.is_empty() {
            return Err(SpiffeIdError::MissingTrustDomain);
        }
        if let Some(rest) = strip_scheme(s) {
            let id = SpiffeId::from_str(s)?;
            if !id.path().is_empty() {
                return Err(SpiffeIdError::UnexpectedPath);
            }
            debug_assert!(!rest.is_empty());
            return Ok(id.trust_domain().clone());
        }
        validate_trust_domain(s)?;
        Ok(Self(s.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trust domain's own ID, `spiffe://<name>`, as used for bundle map keys.
    pub fn id_string(&self) -> String {
        format!("{SCHEME}{}", self.0)
    }

    /// Builds `spiffe://<td><path>`, validating `path` (which must start with '/').
    pub fn id(&self, path: &str) -> Result<SpiffeId, SpiffeIdError> {
        SpiffeId::from_str(&format!("{SCHEME}{}{path}", self.0))
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrustDomain({})", self.0)
    }
}

impl FromStr for TrustDomain {
    type Err = SpiffeIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// A syntactically valid SPIFFE ID, `spiffe://<trust-domain><path>`.
///
/// Scheme and trust domain are normalised to lowercase (they compare case-insensitively);
/// the path keeps its case.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    td: TrustDomain,
    path: String,
}

impl SpiffeId {
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.td
    }

    /// The path, empty or starting with '/'.
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn is_member_of(&self, td: &TrustDomain) -> bool {
        &self.td == td
    }

    /// Path segments, without the leading '/'.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.path.split('/').skip(1)
    }
}

fn strip_scheme(s: &str) -> Option<&str> {
    let head = s.get(..SCHEME.len())?;
    head.eq_ignore_ascii_case(SCHEME)
        .then(|| &s[SCHEME.len()..])
}

fn validate_trust_domain(td: &str) -> Result<(), SpiffeIdError> {
    if td.is_empty() {
        return Err(SpiffeIdError::MissingTrustDomain);
    }
    if td.len() > MAX_TRUST_DOMAIN_LEN {
        return Err(SpiffeIdError::TrustDomainTooLong);
    }
    for c in td.chars() {
        let c = c.to_ascii_lowercase();
        if !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_')) {
            return Err(SpiffeIdError::BadTrustDomainChar(c));
        }
    }
    Ok(())
}

fn validate_path(path: &str) -> Result<(), SpiffeIdError> {
    if path.is_empty() {
        return Ok(());
    }
    for seg in path.split('/').skip(1) {
        match seg {
            "" => return Err(SpiffeIdError::EmptySegment),
            "." | ".." => return Err(SpiffeIdError::DotSegment),
            _ => {}
        }
        if let Some(c) = seg
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        {
            return Err(SpiffeIdError::BadPathChar(c));
        }
    }
    Ok(())
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(SpiffeIdError::Empty);
        }
        if s.len() > MAX_ID_LEN {
            return Err(SpiffeIdError::TooLong);
        }
        let rest = strip_scheme(s).ok_or(SpiffeIdError::WrongScheme)?;
        let (td, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        validate_trust_domain(td)?;
        validate_path(path)?;
        Ok(Self {
            td: TrustDomain(td.to_ascii_lowercase()),
            path: path.to_owned(),
        })
    }
}

impl TryFrom<&str> for SpiffeId {
    type Error = SpiffeIdError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}{}", self.td.0, self.path)
    }
}

impl fmt::Debug for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpiffeId({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for s in [
            "spiffe://example.org",
            "spiffe://example.org/ns/default/sa/web",
            "spiffe://a-b_c.d9/Path.With-Case_9",
        ] {
            let id: SpiffeId = s.parse().expect(s);
            assert_eq!(id.to_string(), s);
            assert_eq!(id.to_string().parse::<SpiffeId>().expect(s), id);
        }
    }

    #[test]
    fn scheme_and_trust_domain_are_case_insensitive_path_is_not() {
        let a: SpiffeId = "SPIFFE://Example.ORG/Web".parse().expect("valid");
        assert_eq!(a.to_string(), "spiffe://example.org/Web");
        let b: SpiffeId = "spiffe://example.org/web".parse().expect("valid");
        assert_ne!(a, b);
    }

    #[test]
    fn rejects_what_the_standard_forbids() {
        use SpiffeIdError::*;
        let cases = [
            ("", Empty),
            ("http://example.org/a", WrongScheme),
            ("spiffe://", MissingTrustDomain),
            ("spiffe:///a", MissingTrustDomain),
            ("spiffe://example.org:8080/a", BadTrustDomainChar(':')),
            ("spiffe://user@example.org/a", BadTrustDomainChar('@')),
            ("spiffe://exa%41mple.org", BadTrustDomainChar('%')),
            ("spiffe://example.org/", EmptySegment),
            ("spiffe://example.org//a", EmptySegment),
            ("spiffe://example.org/a/", EmptySegment),
            ("spiffe://example.org/./a", DotSegment),
            ("spiffe://example.org/a/..", DotSegment),
            ("spiffe://example.org/a%20b", BadPathChar('%')),
            ("spiffe://example.org/a?q=1", BadPathChar('?')),
            ("spiffe://example.org/a#f", BadPathChar('#')),
        ];
        for (input, want) in cases {
            assert_eq!(input.parse::<SpiffeId>(), Err(want), "{input}");
        }
        let long = format!("spiffe://example.org/{}", "a".repeat(2048));
        assert_eq!(long.parse::<SpiffeId>(), Err(TooLong));
        let long_td = format!("spiffe://{}", "a".repeat(256));
        assert_eq!(long_td.parse::<SpiffeId>(), Err(TrustDomainTooLong));
    }

    #[test]
    fn trust_domain_parses_name_or_id() {
        let td = TrustDomain::new("Example.org").expect("valid");
        assert_eq!(td.as_str(), "example.org");
        assert_eq!(TrustDomain::new("spiffe://example.org").expect("valid"), td);
        assert_eq!(
            TrustDomain::new("spiffe://example.org/x"),
            Err(SpiffeIdError::UnexpectedPath)
        );
        assert_eq!(td.id_string(), "spiffe://example.org");
        let id = td.id("/ns/a/sa/b").expect("valid");
        assert!(id.is_member_of(&td));
        assert_eq!(id.segments().collect::<Vec<_>>(), ["ns", "a", "sa", "b"]);
    }
}
