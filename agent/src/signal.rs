//! The reload signals a files sink may send (`reload_signal`), by name: which names the
//! configuration accepts and the signal each means.
//!
//! A leaf module (no other module of the agent), so the configuration can validate a name and
//! the sinks can send it without the configuration depending on the sinks.

use rustix::process::Signal;

/// Signal names `reload_signal` accepts (with or without `SIG`).
pub const SIGNAL_NAMES: &[&str] = &[
    "HUP", "INT", "QUIT", "USR1", "USR2", "TERM", "WINCH", "ALRM", "CONT",
];

/// The signal named `name` (`HUP`, `SIGHUP`, any case), among [`SIGNAL_NAMES`].
pub fn signal_by_name(name: &str) -> Option<Signal> {
    let upper = name.to_ascii_uppercase();
    let n = upper.strip_prefix("SIG").unwrap_or(&upper);
    Some(match n {
        "HUP" => Signal::HUP,
        "INT" => Signal::INT,
        "QUIT" => Signal::QUIT,
        "USR1" => Signal::USR1,
        "USR2" => Signal::USR2,
        "TERM" => Signal::TERM,
        "WINCH" => Signal::WINCH,
        "ALRM" => Signal::ALARM,
        "CONT" => Signal::CONT,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names() {
        assert_eq!(signal_by_name("HUP"), Some(Signal::HUP));
        assert_eq!(signal_by_name("sigusr1"), Some(Signal::USR1));
        assert_eq!(signal_by_name("KILL"), None);
        assert_eq!(signal_by_name("9"), None);
        assert_eq!(signal_by_name(""), None);
    }
}
