//! A CA key slot's state, as the server stores it (`ca_keys.state`), reports it
//! (`CaAdmin.Status`) and `signetctl ca status` prints it: one spelling on every side.
//!
//! A slot goes prepared -> active -> retired -> removed (an operator may remove a slot in any
//! state). Being tainted is a flag beside the state, not a state; a slot that fails the server's
//! vetting is reported apart, with the stored text as it is.

use std::fmt;
use std::str::FromStr;

/// A CA key slot's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotState {
    /// A root: in the bundle, signing nothing yet. An intermediate: signing nothing yet.
    Prepared,
    /// Signing (a root: intermediates; an intermediate: workload certificates).
    Active,
    /// No longer signing; a root stays in the bundle while anything chains to it.
    Retired,
    /// Gone from the bundle and from the keys that authenticate mTLS clients.
    Removed,
}

impl SlotState {
    pub const ALL: [SlotState; 4] = [
        SlotState::Prepared,
        SlotState::Active,
        SlotState::Retired,
        SlotState::Removed,
    ];

    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotState::Prepared => "prepared",
            SlotState::Active => "active",
            SlotState::Retired => "retired",
            SlotState::Removed => "removed",
        }
    }
}

impl fmt::Display for SlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Text that is not a slot state (exactly as [`SlotState::as_str`] spells one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown CA slot state {0:?} (one of: prepared, active, retired, removed)")]
pub struct UnknownSlotState(pub String);

impl FromStr for SlotState {
    type Err = UnknownSlotState;

    /// Exactly the stored spelling: no other case, no whitespace.
    fn from_str(s: &str) -> Result<Self, UnknownSlotState> {
        SlotState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownSlotState(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_through_its_stored_spelling() {
        for state in SlotState::ALL {
            assert_eq!(state.as_str().parse::<SlotState>(), Ok(state));
            assert_eq!(state.to_string(), state.as_str());
        }
        let spelled: Vec<&str> = SlotState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(spelled, ["prepared", "active", "retired", "removed"]);
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "", "Active", "ACTIVE", " active", "active ", "tainted", "rejected", "activ",
        ] {
            assert_eq!(
                bad.parse::<SlotState>(),
                Err(UnknownSlotState(bad.to_owned())),
                "{bad:?}"
            );
        }
    }
}
