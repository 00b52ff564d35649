//! How a token refusal is worded, for every check in [`super`].
//!
//! Every refusal is [`AuthnError::BadToken`] with a message that says what is wrong and what to
//! do. Text taken from the token (a `kid`, an issuer, a `sub`) is shown only through [`quoted`]
//! or [`shown`]: escaped and cut short, so a hostile token cannot forge log lines or flood
//! them; the token itself is never shown. A leaf: it imports nothing of its siblings.

use crate::authn::AuthnError;

/// Untrusted text is shown the one way the server shows it (`signet_types::untrusted`).
pub(super) use signet_types::untrusted::{quoted, shown};

/// A token refusal with `reason` as its message.
pub(super) fn bad(reason: impl Into<String>) -> AuthnError {
    AuthnError::BadToken(reason.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_text_is_escaped_and_cut_short() {
        assert_eq!(quoted("ec-1"), "\"ec-1\"");
        assert_eq!(quoted("a\nb\"c"), "\"a\\nb\\\"c\"");
        let long = "é".repeat(400);
        let cut = shown(&long);
        assert_eq!(cut.chars().count(), signet_types::untrusted::MAX_CHARS + 1);
        assert!(cut.ends_with('…'));
        // Control characters from a token never reach a message unescaped.
        assert!(!shown("iss\u{1b}[2J").contains('\u{1b}'));
        assert_eq!(bad("why"), AuthnError::BadToken("why".into()));
    }
}
