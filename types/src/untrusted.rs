//! Text a caller sent, made safe to put in a message (an error, a log line, an audit reason).
//!
//! The one helper for it: whatever a client, a CSR, a token or a configuration file says may be
//! long or contain control characters (terminal escapes, new lines that forge log lines).
//! Invariant: what these functions return is at most [`MAX_CHARS`] characters of the input
//! plus a `…`, and never contains a control character unescaped.
//!
//! - [`quoted`]: always in quotes, escaped as Rust's `Debug` escapes (`"a\nb"`): for values a
//!   person should see exactly (a name, an ID that failed to parse).
//! - [`shown`]: bare when it is plain text, quoted and escaped only when it has control
//!   characters: for values that usually read well as they are (a SAN, an entry ID).

/// How many characters of untrusted text a message carries.
pub const MAX_CHARS: usize = 256;

/// `s` cut to [`MAX_CHARS`], in quotes, with control characters (and quotes) escaped.
pub fn quoted(s: &str) -> String {
    format!("{:?}", truncate(s))
}

/// `s` cut to [`MAX_CHARS`]; quoted and escaped (as [`quoted`]) only if it contains a control
/// character or one a reader cannot see (bidirectional overrides, zero-width characters: see
/// [`crate::selector::is_invisible`]), which could make a message read as something else.
pub fn shown(s: &str) -> String {
    let t = truncate(s);
    if t.chars()
        .any(|c| c.is_control() || crate::selector::is_invisible(c))
    {
        format!("{t:?}")
    } else {
        t
    }
}

/// `s` cut to [`MAX_CHARS`] characters, with `…` where it was cut. Not escaped: use [`quoted`]
/// or [`shown`] for a message.
fn truncate(s: &str) -> String {
    if s.chars().count() <= MAX_CHARS {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX_CHARS).collect();
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Second review, finding F3: an audience with a bidi override was echoed raw.
    #[test]
    fn invisible_characters_are_escaped() {
        for s in ["a\u{202e}gnp.", "a\u{200b}b", "a\u{feff}"] {
            let out = shown(s);
            assert!(out.starts_with('"'), "{out}");
            assert!(
                out.chars().all(|c| !crate::selector::is_invisible(c)),
                "{out:?}"
            );
        }
        assert_eq!(shown("plain"), "plain");
    }

    #[test]
    fn short_plain_text_is_kept() {
        assert_eq!(quoted("web"), "\"web\"");
        assert_eq!(shown("web"), "web");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(quoted("a\nb"), "\"a\\nb\"");
        assert_eq!(shown("a\nb"), "\"a\\nb\"");
        assert_eq!(shown("\u{1b}[31m"), "\"\\u{1b}[31m\"");
        assert!(!shown("x\u{7f}").contains('\u{7f}'));
    }

    #[test]
    fn long_text_is_cut_with_an_ellipsis() {
        let long = "é".repeat(MAX_CHARS + 10);
        let s = shown(&long);
        assert_eq!(s.chars().count(), MAX_CHARS + 1);
        assert!(s.ends_with('…'));
        let q = quoted(&long);
        assert_eq!(q.chars().count(), MAX_CHARS + 3);
        assert_eq!(shown(&"x".repeat(MAX_CHARS)), "x".repeat(MAX_CHARS));
    }
}
