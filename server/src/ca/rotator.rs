//! The rotator: which transition the CA key slots are due for, as a pure function of the slots,
//! the time and the (seeded) jitter — [`decide`]. The manager (`super::manager`) applies what
//! it returns, one transition at a time, on a tick; nothing here reads a clock or a database.
//!
//! The policy, in order:
//! 1. No active root: activate the prepared one, or prepare one (first start).
//! 2. No active intermediate: activate a prepared one signed by the active root, or prepare one.
//! 3. Root rotation: prepare the next root at `root_prepare_at` of the active root's life (and
//!    at the latest `root_propagation` before it expires); activate it at `root_activate_at`,
//!    but never before it has been in the bundle for `root_propagation` (unless the active
//!    root has already expired: then nothing trusts it anyway).
//! 4. Intermediate rotation: prepare the next intermediate at `intermediate_prepare_at` of the
//!    active one's life and activate it at `intermediate_activate_at`; at once when the active
//!    intermediate was signed by a root that is no longer the active one (after a root
//!    rotation). A prepared intermediate signed by a root that is no longer active is removed.
//! 5. Removal: a retired key is removed once no unexpired certificate chains to it (the
//!    ledger's count of unexpired certificates it issued is zero and every key it signed is
//!    removed), or once it has expired itself; never within `removal_grace` of its retirement
//!    (a certificate signed just before might not be committed to the ledger yet).
//!
//! 6. JWT signing keys (kind `jwt`, independent of the CA keys; see [`decide_jwt`]): no active
//!    JWT key: activate the prepared one, or prepare one. Prepare the next at `jwt_prepare_at`
//!    of the active key's life; activate it at `jwt_activate_at`, but never before it has been
//!    published for `jwt_propagation` (unless the active key has expired or is tainted: a
//!    tainted JWT key is replaced at once, by the prepared key or by a new one). A retired JWT
//!    key is removed once no unexpired token it signed can exist: `jwt_max_ttl` (plus
//!    `removal_grace`) after its retirement, or once it has expired. A prepared JWT key that
//!    is tainted is removed (it never signed).
//!
//! Every threshold moves by up to ± `jitter` of the key's lifetime; the offset comes from a
//! [`Jitter`] seeded with the key ID, so every replica computes the same thresholds.

use std::time::{Duration, SystemTime};

/// Root, intermediate, or JWT-SVID signing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Root,
    Intermediate,
    /// A JWT-SVID signing key: its certificate is a self-signed end-entity certificate that
    /// only carries the key and its validity; it is never an X.509 trust anchor.
    Jwt,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Root => "root",
            Kind::Intermediate => "intermediate",
            Kind::Jwt => "jwt",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "root" => Some(Kind::Root),
            "intermediate" => Some(Kind::Intermediate),
            "jwt" => Some(Kind::Jwt),
            _ => None,
        }
    }
}

/// A slot's state (one spelling with the store, the admin API and `signetctl`). `tainted` is
/// a flag beside it, not a state.
pub use signet_types::ca_slot::SlotState as State;

/// What [`decide`] knows about a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub id: String,
    pub kind: Kind,
    pub state: State,
    /// The key that signed it (intermediates).
    pub parent: Option<String>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// When it was created (prepared).
    pub prepared_at: SystemTime,
    pub retired_at: Option<SystemTime>,
    pub tainted: bool,
    /// Unexpired, unrevoked certificates this key signed directly (from the ledger). The
    /// rotator needs only whether there are any, so its tick fills in 0 or 1
    /// (`CaManager::read_for_rotation`); operator commands fill in the count.
    pub issued_unexpired: u64,
}

impl Slot {
    fn life(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }

    fn at_fraction(&self, fraction: f64) -> SystemTime {
        self.not_before + self.life().mul_f64(fraction.clamp(0.0, 1.0))
    }
}

/// The thresholds (see `[ca]` in the configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub intermediate_prepare_at: f64,
    pub intermediate_activate_at: f64,
    pub root_prepare_at: f64,
    pub root_activate_at: f64,
    pub root_propagation: Duration,
    /// ± this fraction of the lifetime.
    pub jitter: f64,
    pub removal_grace: Duration,
    pub jwt_prepare_at: f64,
    pub jwt_activate_at: f64,
    /// How long a prepared JWT key is published before it signs.
    pub jwt_propagation: Duration,
    /// The longest JWT-SVID lifetime: how long a retired JWT key's tokens may still be live.
    pub jwt_max_ttl: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            intermediate_prepare_at: 0.5,
            intermediate_activate_at: 5.0 / 6.0,
            root_prepare_at: 0.5,
            root_activate_at: 5.0 / 6.0,
            root_propagation: Duration::from_secs(24 * 3600),
            jitter: 0.02,
            removal_grace: REMOVAL_GRACE,
            jwt_prepare_at: 0.5,
            jwt_activate_at: 5.0 / 6.0,
            jwt_propagation: Duration::from_secs(600),
            jwt_max_ttl: Duration::from_secs(3600),
        }
    }
}

/// How long after its retirement a key is kept at least.
pub const REMOVAL_GRACE: Duration = Duration::from_secs(10);

/// Which threshold a jitter offset is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold {
    Prepare,
    Activate,
}

/// Seeded randomness for the thresholds: an offset in [-1, 1] per key and threshold.
pub trait Jitter: Send + Sync {
    fn offset(&self, key_id: &str, threshold: Threshold) -> f64;
}

/// The production jitter: keyed by the threshold and the key ID
/// ([`signet_runtime::random::keyed_unit`], from their SHA-256; random, since the key ID is the
/// hash of a fresh public key), so every replica agrees on a key's thresholds.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyIdJitter;

impl Jitter for KeyIdJitter {
    fn offset(&self, key_id: &str, threshold: Threshold) -> f64 {
        let label: &[u8] = match threshold {
            Threshold::Prepare => b"signet rotation prepare\0",
            Threshold::Activate => b"signet rotation activate\0",
        };
        // [0, 1) -> [-1, 1).
        signet_runtime::random::keyed_unit(&[label, key_id.as_bytes()].concat()) * 2.0 - 1.0
    }
}

/// No jitter (tests that check exact thresholds).
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJitter;

#[cfg(test)]
impl Jitter for NoJitter {
    fn offset(&self, _: &str, _: Threshold) -> f64 {
        0.0
    }
}

/// Why a transition is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// There is no active key of this kind (first start, or an upgrade from a root that
    /// signed leaves directly).
    Bootstrap,
    /// The active key passed its prepare or activate threshold.
    Threshold,
    /// The active root changed: intermediates follow it.
    RootRotated,
    /// The active key has expired.
    Expired,
    /// No unexpired certificate chains to the key any more.
    Unused,
    /// A prepared intermediate whose root is no longer active.
    Superseded,
    /// An operator asked for it.
    Operator,
    /// The active key is tainted: replaced at once.
    Tainted,
    /// No token signed by the key can still be unexpired.
    TokensExpired,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Bootstrap => "bootstrap",
            Reason::Threshold => "threshold",
            Reason::RootRotated => "root rotated",
            Reason::Expired => "expired",
            Reason::Unused => "no unexpired certificate chains to it",
            Reason::Superseded => "its root is no longer active",
            Reason::Operator => "operator",
            Reason::Tainted => "tainted",
            Reason::TokensExpired => "no unexpired token signed by it can exist",
        }
    }
}

/// One change to the slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Generate a new root, in `prepared`.
    PrepareRoot { reason: Reason },
    /// Generate a new intermediate signed by `parent` (the active root), in `prepared`.
    PrepareIntermediate { parent: String, reason: Reason },
    /// Generate a new JWT signing key, in `prepared`.
    PrepareJwt { reason: Reason },
    /// Make `id` active; the active key of the same kind, if any, becomes retired.
    Activate { id: String, reason: Reason },
    /// Remove `id` (retired, or a superseded prepared intermediate).
    Remove { id: String, reason: Reason },
}

/// When the active intermediate's successor is prepared.
pub fn intermediate_prepare_time(active: &Slot, p: &Policy, j: &dyn Jitter) -> SystemTime {
    active.at_fraction(
        p.intermediate_prepare_at + p.jitter * j.offset(&active.id, Threshold::Prepare),
    )
}

/// When the active intermediate's successor is activated.
pub fn intermediate_activate_time(active: &Slot, p: &Policy, j: &dyn Jitter) -> SystemTime {
    active
        .at_fraction(
            p.intermediate_activate_at + p.jitter * j.offset(&active.id, Threshold::Activate),
        )
        .max(intermediate_prepare_time(active, p, j))
}

/// When the active root's successor is prepared: at its fraction, and at the latest one
/// propagation window before the active root expires.
pub fn root_prepare_time(active: &Slot, p: &Policy, j: &dyn Jitter) -> SystemTime {
    let at =
        active.at_fraction(p.root_prepare_at + p.jitter * j.offset(&active.id, Threshold::Prepare));
    let latest = active
        .not_after
        .checked_sub(p.root_propagation)
        .unwrap_or(active.not_before)
        .max(active.not_before);
    at.min(latest)
}

/// When the prepared root `next` replaces `active`: at the active root's fraction, but not
/// before `next` has been in the bundle for the propagation window.
pub fn root_activate_time(active: &Slot, next: &Slot, p: &Policy, j: &dyn Jitter) -> SystemTime {
    let at = active
        .at_fraction(p.root_activate_at + p.jitter * j.offset(&active.id, Threshold::Activate))
        .max(root_prepare_time(active, p, j));
    at.max(next.prepared_at + p.root_propagation)
}

fn newest<'a>(slots: impl Iterator<Item = &'a Slot>) -> Option<&'a Slot> {
    slots.max_by(|a, b| {
        a.prepared_at
            .cmp(&b.prepared_at)
            .then_with(|| a.id.cmp(&b.id))
    })
}

/// When the active JWT key's successor is prepared.
pub fn jwt_prepare_time(active: &Slot, p: &Policy, j: &dyn Jitter) -> SystemTime {
    active.at_fraction(p.jwt_prepare_at + p.jitter * j.offset(&active.id, Threshold::Prepare))
}

/// When the prepared JWT key `next` replaces `active`: at the active key's fraction, but not
/// before `next` has been published for the propagation window.
pub fn jwt_activate_time(active: &Slot, next: &Slot, p: &Policy, j: &dyn Jitter) -> SystemTime {
    let at = active
        .at_fraction(p.jwt_activate_at + p.jitter * j.offset(&active.id, Threshold::Activate))
        .max(jwt_prepare_time(active, p, j));
    at.max(next.prepared_at + p.jwt_propagation)
}

/// The transitions due at `now`, most urgent first: the CA keys' ([`decide_ca`]), then the
/// JWT keys' ([`decide_jwt`]). The manager applies the first, re-reads the slots and asks
/// again.
pub fn decide(slots: &[Slot], now: SystemTime, p: &Policy, j: &dyn Jitter) -> Vec<Transition> {
    let mut out = decide_ca(slots, now, p, j);
    out.extend(decide_jwt(slots, now, p, j));
    out
}

/// The JWT signing keys' transitions (rule 6 of the module docs).
pub fn decide_jwt(slots: &[Slot], now: SystemTime, p: &Policy, j: &dyn Jitter) -> Vec<Transition> {
    let find = |state: State| {
        newest(
            slots
                .iter()
                .filter(move |s| s.kind == Kind::Jwt && s.state == state),
        )
    };
    let mut out = Vec::new();
    // A tainted prepared key never signs.
    for s in slots
        .iter()
        .filter(|s| s.kind == Kind::Jwt && s.state == State::Prepared && s.tainted)
    {
        out.push(Transition::Remove {
            id: s.id.clone(),
            reason: Reason::Tainted,
        });
    }
    let next = newest(
        slots
            .iter()
            .filter(|s| s.kind == Kind::Jwt && s.state == State::Prepared && !s.tainted),
    );
    match (find(State::Active), next) {
        (None, Some(next)) => out.push(Transition::Activate {
            id: next.id.clone(),
            reason: Reason::Bootstrap,
        }),
        (None, None) => out.push(Transition::PrepareJwt {
            reason: Reason::Bootstrap,
        }),
        (Some(active), None) if active.tainted => out.push(Transition::PrepareJwt {
            reason: Reason::Tainted,
        }),
        (Some(active), Some(next)) if active.tainted => out.push(Transition::Activate {
            id: next.id.clone(),
            reason: Reason::Tainted,
        }),
        (Some(active), None) if now >= jwt_prepare_time(active, p, j) => {
            out.push(Transition::PrepareJwt {
                reason: if active.not_after <= now {
                    Reason::Expired
                } else {
                    Reason::Threshold
                },
            });
        }
        (Some(active), Some(next)) if active.not_after <= now => {
            out.push(Transition::Activate {
                id: next.id.clone(),
                reason: Reason::Expired,
            });
        }
        (Some(active), Some(next)) if now >= jwt_activate_time(active, next, p, j) => {
            out.push(Transition::Activate {
                id: next.id.clone(),
                reason: Reason::Threshold,
            });
        }
        _ => {}
    }
    for s in slots
        .iter()
        .filter(|s| s.kind == Kind::Jwt && s.state == State::Retired)
    {
        let retired = s.retired_at.unwrap_or(s.prepared_at);
        if s.not_after <= now {
            out.push(Transition::Remove {
                id: s.id.clone(),
                reason: Reason::Expired,
            });
        } else if now >= retired + p.jwt_max_ttl + p.removal_grace {
            out.push(Transition::Remove {
                id: s.id.clone(),
                reason: Reason::TokensExpired,
            });
        }
    }
    out
}

/// The CA keys' transitions (rules 1 to 5 of the module docs); JWT keys play no part.
pub fn decide_ca(slots: &[Slot], now: SystemTime, p: &Policy, j: &dyn Jitter) -> Vec<Transition> {
    let find = |kind: Kind, state: State| {
        newest(
            slots
                .iter()
                .filter(move |s| s.kind == kind && s.state == state),
        )
    };
    let mut out = Vec::new();

    // 1. A root.
    let Some(root) = find(Kind::Root, State::Active) else {
        out.push(match find(Kind::Root, State::Prepared) {
            Some(next) => Transition::Activate {
                id: next.id.clone(),
                reason: Reason::Bootstrap,
            },
            None => Transition::PrepareRoot {
                reason: Reason::Bootstrap,
            },
        });
        return out;
    };
    let prepared_int = find(Kind::Intermediate, State::Prepared);

    // 2. An intermediate.
    let Some(int) = find(Kind::Intermediate, State::Active) else {
        out.push(match prepared_int {
            Some(next) if next.parent.as_deref() == Some(root.id.as_str()) => {
                Transition::Activate {
                    id: next.id.clone(),
                    reason: Reason::Bootstrap,
                }
            }
            Some(stale) => Transition::Remove {
                id: stale.id.clone(),
                reason: Reason::Superseded,
            },
            None => Transition::PrepareIntermediate {
                parent: root.id.clone(),
                reason: Reason::Bootstrap,
            },
        });
        return out;
    };

    // 3. Root rotation.
    match find(Kind::Root, State::Prepared) {
        None if now >= root_prepare_time(root, p, j) => {
            out.push(Transition::PrepareRoot {
                reason: Reason::Threshold,
            });
        }
        Some(next) if root.not_after <= now => out.push(Transition::Activate {
            id: next.id.clone(),
            reason: Reason::Expired,
        }),
        Some(next) if now >= root_activate_time(root, next, p, j) => {
            out.push(Transition::Activate {
                id: next.id.clone(),
                reason: Reason::Threshold,
            });
        }
        _ => {}
    }

    // 4. Intermediate rotation.
    let follows_root = int.parent.as_deref() == Some(root.id.as_str());
    match prepared_int {
        Some(next) if next.parent.as_deref() != Some(root.id.as_str()) => {
            out.push(Transition::Remove {
                id: next.id.clone(),
                reason: Reason::Superseded,
            });
        }
        None if !follows_root => out.push(Transition::PrepareIntermediate {
            parent: root.id.clone(),
            reason: Reason::RootRotated,
        }),
        None if now >= intermediate_prepare_time(int, p, j) => {
            out.push(Transition::PrepareIntermediate {
                parent: root.id.clone(),
                reason: Reason::Threshold,
            });
        }
        Some(next) if !follows_root => out.push(Transition::Activate {
            id: next.id.clone(),
            reason: Reason::RootRotated,
        }),
        Some(next) if int.not_after <= now => out.push(Transition::Activate {
            id: next.id.clone(),
            reason: Reason::Expired,
        }),
        Some(next) if now >= intermediate_activate_time(int, p, j) => {
            out.push(Transition::Activate {
                id: next.id.clone(),
                reason: Reason::Threshold,
            });
        }
        _ => {}
    }

    // 5. Removal of retired keys.
    for s in slots
        .iter()
        .filter(|s| s.state == State::Retired && s.kind != Kind::Jwt)
    {
        if let Some(retired) = s.retired_at
            && now < retired + p.removal_grace
        {
            continue;
        }
        let children = slots
            .iter()
            .any(|c| c.parent.as_deref() == Some(s.id.as_str()) && c.state != State::Removed);
        if s.not_after <= now {
            out.push(Transition::Remove {
                id: s.id.clone(),
                reason: Reason::Expired,
            });
        } else if s.issued_unexpired == 0 && !children {
            out.push(Transition::Remove {
                id: s.id.clone(),
                reason: Reason::Unused,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
