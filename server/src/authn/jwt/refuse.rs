//! How a token refusal is worded, for every check in [`super`].
//!
//! Every refusal is [`AuthnError::BadToken`] with a message that says what is wrong and what to
//! do. Text taken from the token (a `kid`, an issuer, a `sub`) is shown only through [`quoted`]
//! or [`truncate`]: escaped and cut short, so a hostile token cannot forge log lines or flood
//! them; the token itself is never shown. A leaf: it imports nothing of its siblings.

use crate::authn::AuthnError;

/// Longest piece of untrusted text shown in a message, in characters.
const MAX_SHOWN_CHARS: usize = 96;

/// A token refusal with `reason` as its message.
pub(super) fn bad(reason: impl Into<String>) -> AuthnError {
    AuthnError::BadToken(reason.into())
}

/// Untrusted text echoed in a message: quoted, escaped, and cut short.
pub(super) fn quoted(s: &str) -> String {
    format!("{:?}", truncate(s))
}

/// Untrusted text cut to [`MAX_SHOWN_CHARS`] characters (an ellipsis marks the cut).
pub(super) fn truncate(s: &str) -> String {
    if s.chars().count() <= MAX_SHOWN_CHARS {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX_SHOWN_CHARS).collect();
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_text_is_escaped_and_cut_short() {
        assert_eq!(quoted("ec-1"), "\"ec-1\"");
        assert_eq!(quoted("a\nb\"c"), "\"a\\nb\\\"c\"");
        let long = "é".repeat(200);
        let shown = truncate(&long);
        assert_eq!(shown.chars().count(), MAX_SHOWN_CHARS + 1);
        assert!(shown.ends_with('…'));
        assert_eq!(truncate(&"x".repeat(MAX_SHOWN_CHARS)), "x".repeat(96));
        assert_eq!(bad("why"), AuthnError::BadToken("why".into()));
    }
}
