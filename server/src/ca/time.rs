//! Certificate time: X.509 validity holds whole seconds, so every instant the core puts in a
//! certificate goes through these conversions (rounded down, never up). No clock is read here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;

/// `t` as an `OffsetDateTime`, rounded down to whole seconds (certificates hold seconds).
pub(crate) fn to_offset(t: SystemTime) -> Option<OffsetDateTime> {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).ok()?,
        Err(e) => {
            let d = e.duration();
            let whole = i64::try_from(d.as_secs()).ok()?;
            -whole - i64::from(d.subsec_nanos() > 0)
        }
    };
    OffsetDateTime::from_unix_timestamp(secs).ok()
}

/// `t` rounded down to whole seconds.
pub(crate) fn floor_secs(t: SystemTime) -> Option<SystemTime> {
    let odt = to_offset(t)?;
    let secs = odt.unix_timestamp();
    Some(if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    })
}

/// Unix seconds as text, for messages.
pub(crate) fn unix_text(t: SystemTime) -> String {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs().to_string(),
        Err(e) => format!("-{}", e.duration().as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_down_on_both_sides_of_the_epoch() {
        let after = UNIX_EPOCH + Duration::from_millis(1_500);
        assert_eq!(floor_secs(after), Some(UNIX_EPOCH + Duration::from_secs(1)));
        let before = UNIX_EPOCH - Duration::from_millis(1_500);
        assert_eq!(
            floor_secs(before),
            Some(UNIX_EPOCH - Duration::from_secs(2))
        );
        assert_eq!(to_offset(before).map(|t| t.unix_timestamp()), Some(-2));
        assert_eq!(unix_text(after), "1");
        assert_eq!(unix_text(UNIX_EPOCH - Duration::from_secs(3)), "-3");
    }
}
