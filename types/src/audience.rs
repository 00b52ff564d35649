//! The JWT-SVID audience grammar, one for the agent (which refuses a bad request before it
//! reaches the server) and the server (which refuses it from any caller): a request names 1 to
//! [`MAX_AUDIENCES`] audiences, each 1 to [`MAX_AUDIENCE_BYTES`] bytes, with no control
//! character, no character a person cannot see or cannot tell from a space (the selector
//! grammar's rule: zero-width and bidirectional marks, other whitespace), and no leading or
//! trailing space. An audience is a relying party's name that operators read in `signetctl jwt
//! list` and auditors match: two audiences that look the same must be the same audience.

/// Most audiences one JWT-SVID carries.
pub const MAX_AUDIENCES: usize = 32;
/// Longest audience (bytes).
pub const MAX_AUDIENCE_BYTES: usize = 256;

/// Why an audience list is refused; the message names the rule and the audience's position
/// (1-based), never its text (which the caller has).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AudienceError {
    #[error("no audience: a JWT-SVID is for at least one audience (the aud claim)")]
    None,
    #[error("{0} audiences: a JWT-SVID carries at most {MAX_AUDIENCES}")]
    TooMany(usize),
    #[error("audience {0} is empty: every audience names a relying party")]
    Empty(usize),
    #[error("audience {0} is {1} bytes long: at most {MAX_AUDIENCE_BYTES}")]
    TooLong(usize, usize),
    #[error("audience {0} contains a control character")]
    Control(usize),
    #[error(
        "audience {0} contains an invisible character (a zero-width or bidirectional mark, or \
         whitespace other than the ASCII space)"
    )]
    Invisible(usize),
    #[error("audience {0} starts or ends with a space")]
    Space(usize),
}

/// Checks a request's audiences; the list with duplicates dropped, in the order asked.
pub fn normalize(audience: &[String]) -> Result<Vec<String>, AudienceError> {
    if audience.is_empty() {
        return Err(AudienceError::None);
    }
    if audience.len() > MAX_AUDIENCES {
        return Err(AudienceError::TooMany(audience.len()));
    }
    let mut out: Vec<String> = Vec::with_capacity(audience.len());
    for (i, a) in audience.iter().enumerate() {
        let n = i + 1;
        if a.is_empty() {
            return Err(AudienceError::Empty(n));
        }
        if a.len() > MAX_AUDIENCE_BYTES {
            return Err(AudienceError::TooLong(n, a.len()));
        }
        if a.chars().any(char::is_control) {
            return Err(AudienceError::Control(n));
        }
        if a.chars().any(crate::selector::is_invisible) {
            return Err(AudienceError::Invisible(n));
        }
        if a.starts_with(' ') || a.ends_with(' ') {
            return Err(AudienceError::Space(n));
        }
        if !out.contains(a) {
            out.push(a.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(a: &str) -> Result<Vec<String>, AudienceError> {
        normalize(&[a.to_owned()])
    }

    #[test]
    fn good_audiences_pass_and_duplicates_go() {
        let got = normalize(&["vault".into(), "sts.amazonaws.com".into(), "vault".into()]).unwrap();
        assert_eq!(got, ["vault", "sts.amazonaws.com"]);
        assert_eq!(one("https://api.example.org/a b").unwrap().len(), 1);
        assert_eq!(one("ünïcödé").unwrap().len(), 1);
        assert_eq!(one(&"a".repeat(MAX_AUDIENCE_BYTES)).unwrap().len(), 1);
    }

    /// Review finding F7: what a person cannot see, or cannot tell apart, is refused.
    #[test]
    fn what_a_reader_cannot_see_is_refused() {
        assert_eq!(normalize(&[]), Err(AudienceError::None));
        assert_eq!(one(""), Err(AudienceError::Empty(1)));
        assert_eq!(
            one(&"a".repeat(MAX_AUDIENCE_BYTES + 1)),
            Err(AudienceError::TooLong(1, MAX_AUDIENCE_BYTES + 1))
        );
        assert_eq!(
            normalize(&vec!["a".to_owned(); MAX_AUDIENCES + 1]),
            Err(AudienceError::TooMany(MAX_AUDIENCES + 1))
        );
        for bad in ["a\u{7}b", "a\u{1b}[31m", "a\u{85}", "a\u{7f}"] {
            assert_eq!(one(bad), Err(AudienceError::Control(1)), "{bad:?}");
        }
        for bad in [
            "evil\u{202e}gnp.",
            "a\u{200b}b",
            "a\u{a0}b",
            "a\u{3000}",
            "\u{feff}a",
        ] {
            assert_eq!(one(bad), Err(AudienceError::Invisible(1)), "{bad:?}");
        }
        for bad in [" ", " a", "a "] {
            assert_eq!(one(bad), Err(AudienceError::Space(1)), "{bad:?}");
        }
        assert_eq!(
            normalize(&["ok".into(), "a\u{200b}".into()]),
            Err(AudienceError::Invisible(2))
        );
    }
}
