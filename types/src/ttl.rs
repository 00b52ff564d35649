//! Limits on the lifetimes a request or a registration entry may ask for.
//!
//! One definition for every place that checks a requested TTL (the server's issuance policy
//! and its registration-entry validation). Invariant: a requested TTL in seconds is 0 (the
//! CA's default) or 1 to [`ABSURD_TTL_SECONDS`]; the CA then clamps it to its own maximum.

/// Longer requested lifetimes (ten years) are not clamped but refused: they are a client bug.
pub const ABSURD_TTL_SECONDS: i64 = 10 * 365 * 24 * 3600;

/// Whether `seconds` is a TTL a request may ask for: 0 (the default) up to ten years.
pub fn is_requestable(seconds: i64) -> bool {
    (0..=ABSURD_TTL_SECONDS).contains(&seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_to_ten_years() {
        assert!(is_requestable(0));
        assert!(is_requestable(ABSURD_TTL_SECONDS));
        assert!(!is_requestable(-1));
        assert!(!is_requestable(ABSURD_TTL_SECONDS + 1));
    }
}
