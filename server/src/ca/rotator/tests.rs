//! The rotation policy, driven by an injected clock and seeded jitter.

use super::*;

const T0: u64 = 1_700_000_000;
const DAY: Duration = Duration::from_secs(86_400);

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(T0 + secs)
}

fn slot(id: &str, kind: Kind, state: State, parent: Option<&str>, nb: u64, na: u64) -> Slot {
    Slot {
        id: id.into(),
        kind,
        state,
        parent: parent.map(Into::into),
        not_before: at(nb),
        not_after: at(na),
        prepared_at: at(nb),
        retired_at: None,
        tainted: false,
        issued_unexpired: 0,
    }
}

fn policy() -> Policy {
    Policy {
        jitter: 0.0,
        root_propagation: Duration::from_secs(600),
        ..Policy::default()
    }
}

/// An active root (0..1000 days) and an active intermediate (0..6 days) under it.
fn steady() -> Vec<Slot> {
    vec![
        slot("r1", Kind::Root, State::Active, None, 0, 1000 * 86_400),
        slot(
            "i1",
            Kind::Intermediate,
            State::Active,
            Some("r1"),
            0,
            6 * 86_400,
        ),
    ]
}

fn first(slots: &[Slot], now: SystemTime) -> Option<Transition> {
    decide_ca(slots, now, &policy(), &NoJitter)
        .into_iter()
        .next()
}

#[test]
fn first_start_prepares_and_activates_a_root_then_an_intermediate() {
    assert_eq!(
        first(&[], at(0)),
        Some(Transition::PrepareRoot {
            reason: Reason::Bootstrap
        })
    );
    let mut s = vec![slot("r1", Kind::Root, State::Prepared, None, 0, 1000)];
    assert_eq!(
        first(&s, at(0)),
        Some(Transition::Activate {
            id: "r1".into(),
            reason: Reason::Bootstrap
        })
    );
    s[0].state = State::Active;
    assert_eq!(
        first(&s, at(0)),
        Some(Transition::PrepareIntermediate {
            parent: "r1".into(),
            reason: Reason::Bootstrap
        })
    );
    s.push(slot(
        "i1",
        Kind::Intermediate,
        State::Prepared,
        Some("r1"),
        0,
        100,
    ));
    assert_eq!(
        first(&s, at(0)),
        Some(Transition::Activate {
            id: "i1".into(),
            reason: Reason::Bootstrap
        })
    );
    s[1].state = State::Active;
    assert_eq!(first(&s, at(1)), None);
}

#[test]
fn an_upgraded_database_with_only_a_root_gets_an_intermediate_and_keeps_the_root() {
    // Before slots, one root signed leaves directly; it has unexpired leaves.
    let mut root = slot("legacy", Kind::Root, State::Active, None, 0, 3650 * 86_400);
    root.issued_unexpired = 12;
    let t = decide_ca(&[root], at(100), &policy(), &NoJitter);
    assert_eq!(
        t,
        vec![Transition::PrepareIntermediate {
            parent: "legacy".into(),
            reason: Reason::Bootstrap
        }]
    );
}

#[test]
fn intermediate_is_prepared_at_one_half_and_activated_at_five_sixths() {
    let mut s = steady();
    let life = 6 * 86_400;
    let half = life / 2;
    assert_eq!(first(&s, at(half - 1)), None);
    assert_eq!(
        first(&s, at(half)),
        Some(Transition::PrepareIntermediate {
            parent: "r1".into(),
            reason: Reason::Threshold
        })
    );
    s.push(slot(
        "i2",
        Kind::Intermediate,
        State::Prepared,
        Some("r1"),
        half,
        half + life,
    ));
    let five_sixths = life * 5 / 6;
    assert_eq!(first(&s, at(five_sixths - 1)), None);
    assert_eq!(
        first(&s, at(five_sixths)),
        Some(Transition::Activate {
            id: "i2".into(),
            reason: Reason::Threshold
        })
    );
    // Thresholds exposed for the status and the tests agree.
    let p = policy();
    assert_eq!(intermediate_prepare_time(&s[1], &p, &NoJitter), at(half));
    assert_eq!(
        intermediate_activate_time(&s[1], &p, &NoJitter),
        at(five_sixths)
    );
}

#[test]
fn an_expired_active_intermediate_is_replaced_at_once() {
    let mut s = steady();
    s.push(slot(
        "i2",
        Kind::Intermediate,
        State::Prepared,
        Some("r1"),
        10,
        6 * 86_400 + 10,
    ));
    let p = Policy {
        intermediate_activate_at: 0.99,
        ..policy()
    };
    let t = decide_ca(&s, at(6 * 86_400), &p, &NoJitter);
    assert_eq!(
        t[0],
        Transition::Activate {
            id: "i2".into(),
            reason: Reason::Expired
        }
    );
}

/// A small deterministic generator (splitmix64) for seeded test randomness.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn jitter_stays_within_its_bounds_is_stable_and_spreads_keys() {
    let p = Policy {
        jitter: 0.05,
        ..policy()
    };
    let life = 6 * 86_400u64;
    let lo_p = at((life as f64 * 0.45) as u64 - 1);
    let hi_p = at((life as f64 * 0.55) as u64 + 1);
    let lo_a = at((life as f64 * (5.0 / 6.0 - 0.05)) as u64 - 1);
    let hi_a = at((life as f64 * (5.0 / 6.0 + 0.05)) as u64 + 1);
    let mut seed = 7u64;
    let mut prepares = std::collections::BTreeSet::new();
    let (mut below, mut above) = (0, 0);
    for _ in 0..500 {
        let id = format!("{:016x}", splitmix(&mut seed));
        let mut s = slot(&id, Kind::Intermediate, State::Active, Some("r1"), 0, life);
        s.kind = Kind::Intermediate;
        let prep = intermediate_prepare_time(&s, &p, &KeyIdJitter);
        let act = intermediate_activate_time(&s, &p, &KeyIdJitter);
        assert!(prep >= lo_p && prep <= hi_p, "{id}: prepare {prep:?}");
        assert!(act >= lo_a && act <= hi_a, "{id}: activate {act:?}");
        assert!(act > prep);
        // The same key always gets the same thresholds (every replica agrees).
        assert_eq!(prep, intermediate_prepare_time(&s, &p, &KeyIdJitter));
        prepares.insert(prep);
        if prep < at(life / 2) {
            below += 1;
        } else {
            above += 1;
        }
    }
    assert!(
        prepares.len() > 400,
        "jitter spreads keys: {}",
        prepares.len()
    );
    assert!(below > 150 && above > 150, "{below} below, {above} above");
    for id in ["a", "b", "c"] {
        for t in [Threshold::Prepare, Threshold::Activate] {
            let o = KeyIdJitter.offset(id, t);
            assert!((-1.0..1.0).contains(&o), "{o}");
        }
    }
}

/// The keyed jitter is the one every replica already computed for a key: the top 53 bits of
/// SHA-256(label ‖ key ID), mapped to [-1, 1). Moving it into signet-runtime changed no
/// threshold of an existing key.
#[test]
fn key_id_jitter_is_the_same_function_of_the_key_id_as_before() {
    let before = |label: &[u8], id: &str| {
        let h = signet_types::ledger::sha256(&[label, id.as_bytes()].concat());
        let mut eight = [0u8; 8];
        eight.copy_from_slice(&h[..8]);
        (u64::from_be_bytes(eight) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    for id in ["a", "0f3c9e", "a-much-longer-key-id-of-64-hex-digits"] {
        assert_eq!(
            KeyIdJitter.offset(id, Threshold::Prepare),
            before(b"signet rotation prepare\0", id)
        );
        assert_eq!(
            KeyIdJitter.offset(id, Threshold::Activate),
            before(b"signet rotation activate\0", id)
        );
    }
    assert_ne!(
        KeyIdJitter.offset("a", Threshold::Prepare),
        KeyIdJitter.offset("a", Threshold::Activate),
        "each threshold has its own draw"
    );
}

#[test]
fn root_is_prepared_at_one_half_and_waits_for_the_propagation_window() {
    let root_life = 1000 * 86_400u64;
    let mut s = steady();
    // Keep the intermediate fresh so only the root's thresholds matter.
    s[1] = slot(
        "i1",
        Kind::Intermediate,
        State::Active,
        Some("r1"),
        root_life / 2 - 10,
        root_life / 2 + 6 * 86_400,
    );
    assert_eq!(first(&s, at(root_life / 2 - 11)), None);
    assert_eq!(
        first(&s, at(root_life / 2)),
        Some(Transition::PrepareRoot {
            reason: Reason::Threshold
        })
    );
    // Prepared late (at 0.9 of the active root's life): the activate fraction (5/6) is past,
    // but the new root must sit in the bundle for the propagation window first.
    let late = root_life * 9 / 10;
    let mut next = slot(
        "r2",
        Kind::Root,
        State::Prepared,
        None,
        late,
        late + root_life,
    );
    next.prepared_at = at(late);
    s.push(next);
    s[1] = slot(
        "i1",
        Kind::Intermediate,
        State::Active,
        Some("r1"),
        late,
        late + 6 * 86_400,
    );
    let p = policy();
    assert_eq!(
        decide_ca(&s, at(late + 599), &p, &NoJitter),
        Vec::<Transition>::new()
    );
    assert_eq!(
        first(&s, at(late + 600)),
        Some(Transition::Activate {
            id: "r2".into(),
            reason: Reason::Threshold
        })
    );
    assert_eq!(
        root_activate_time(&s[0], &s[2], &p, &NoJitter),
        at(late + 600)
    );
}

#[test]
fn a_short_lived_root_is_prepared_at_least_one_propagation_window_before_it_expires() {
    let p = Policy {
        root_prepare_at: 0.9,
        root_activate_at: 0.95,
        root_propagation: Duration::from_secs(300),
        ..policy()
    };
    let root = slot("r1", Kind::Root, State::Active, None, 0, 1000);
    // 0.9 * 1000 = 900 > 1000 - 300: prepared at 700.
    assert_eq!(root_prepare_time(&root, &p, &NoJitter), at(700));
}

#[test]
fn after_a_root_rotation_the_intermediate_follows_at_once() {
    let mut s = steady();
    s[0].state = State::Retired;
    s[0].retired_at = Some(at(100));
    s.push(slot(
        "r2",
        Kind::Root,
        State::Active,
        None,
        50,
        2000 * 86_400,
    ));
    assert_eq!(
        first(&s, at(101)),
        Some(Transition::PrepareIntermediate {
            parent: "r2".into(),
            reason: Reason::RootRotated
        })
    );
    s.push(slot(
        "i2",
        Kind::Intermediate,
        State::Prepared,
        Some("r2"),
        101,
        101 + 6 * 86_400,
    ));
    assert_eq!(
        first(&s, at(101)),
        Some(Transition::Activate {
            id: "i2".into(),
            reason: Reason::RootRotated
        })
    );
    // A prepared intermediate under the old root is discarded instead.
    let mut s = steady();
    s.push(slot(
        "i2",
        Kind::Intermediate,
        State::Prepared,
        Some("r1"),
        10,
        100_000,
    ));
    s[0].state = State::Retired;
    s.push(slot(
        "r2",
        Kind::Root,
        State::Active,
        None,
        50,
        2000 * 86_400,
    ));
    assert_eq!(
        first(&s, at(200)),
        Some(Transition::Remove {
            id: "i2".into(),
            reason: Reason::Superseded
        })
    );
}

#[test]
fn a_retired_key_is_removed_when_its_last_certificate_expires() {
    let mut s = steady();
    s.push(slot(
        "i0",
        Kind::Intermediate,
        State::Retired,
        Some("r1"),
        0,
        6 * 86_400,
    ));
    s[2].retired_at = Some(at(100));
    s[2].issued_unexpired = 3;
    assert_eq!(first(&s, at(200)), None);
    s[2].issued_unexpired = 0;
    // Never within the grace period of its retirement.
    assert_eq!(first(&s, at(105)), None);
    assert_eq!(
        first(&s, at(110)),
        Some(Transition::Remove {
            id: "i0".into(),
            reason: Reason::Unused
        })
    );
}

#[test]
fn a_retired_root_stays_while_anything_chains_to_it_and_goes_when_it_expires() {
    let mut s = vec![
        slot(
            "r1",
            Kind::Root,
            State::Retired,
            None,
            0,
            10 * DAY.as_secs(),
        ),
        slot(
            "r2",
            Kind::Root,
            State::Active,
            None,
            0,
            100 * DAY.as_secs(),
        ),
        slot(
            "i1",
            Kind::Intermediate,
            State::Retired,
            Some("r1"),
            0,
            6 * DAY.as_secs(),
        ),
        slot(
            "i2",
            Kind::Intermediate,
            State::Active,
            Some("r2"),
            0,
            6 * DAY.as_secs(),
        ),
    ];
    s[2].issued_unexpired = 1;
    // r1 signed nothing directly, but i1 (not removed) chains to it; i1 has a live leaf.
    assert_eq!(first(&s, at(1000)), None);
    // The leaf expires: i1 goes first, then r1.
    s[2].issued_unexpired = 0;
    assert_eq!(
        first(&s, at(1000)),
        Some(Transition::Remove {
            id: "i1".into(),
            reason: Reason::Unused
        })
    );
    s[2].state = State::Removed;
    assert_eq!(
        first(&s, at(1000)),
        Some(Transition::Remove {
            id: "r1".into(),
            reason: Reason::Unused
        })
    );
    // A root that signed leaves directly (before slots) stays while they live...
    s[0].issued_unexpired = 5;
    assert_eq!(first(&s, at(1000)), None);
    // ...but not past its own expiry (i2 is due for rotation by then too).
    let due = decide_ca(&s, at(10 * DAY.as_secs()), &policy(), &NoJitter);
    assert!(
        due.contains(&Transition::Remove {
            id: "r1".into(),
            reason: Reason::Expired
        }),
        "{due:?}"
    );
}

/// Applies transitions the way the manager does, in memory.
struct Sim {
    slots: Vec<Slot>,
    next: u32,
    root_ttl: u64,
    int_ttl: u64,
}

impl Sim {
    fn apply(&mut self, t: &Transition, now: u64) {
        let mut new = |kind: Kind, parent: Option<String>, nb: u64, na: u64| {
            self.next += 1;
            Slot {
                id: format!("k{}", self.next),
                kind,
                state: State::Prepared,
                parent,
                not_before: at(nb),
                not_after: at(na),
                prepared_at: at(now),
                retired_at: None,
                tainted: false,
                issued_unexpired: 0,
            }
        };
        match t {
            Transition::PrepareRoot { .. } => {
                let s = new(Kind::Root, None, now, now + self.root_ttl);
                self.slots.push(s);
            }
            Transition::PrepareIntermediate { parent, .. } => {
                let root_na = self
                    .slots
                    .iter()
                    .find(|s| &s.id == parent)
                    .unwrap()
                    .not_after;
                let na = at(now + self.int_ttl).min(root_na);
                let na = na.duration_since(at(0)).unwrap().as_secs();
                let s = new(Kind::Intermediate, Some(parent.clone()), now, na);
                self.slots.push(s);
            }
            Transition::Activate { id, .. } => {
                let kind = self.slots.iter().find(|s| &s.id == id).unwrap().kind;
                for s in &mut self.slots {
                    if s.kind == kind && s.state == State::Active {
                        s.state = State::Retired;
                        s.retired_at = Some(at(now));
                    }
                }
                self.slots.iter_mut().find(|s| &s.id == id).unwrap().state = State::Active;
            }
            Transition::PrepareJwt { .. } => {
                let s = new(Kind::Jwt, None, now, now + self.int_ttl);
                self.slots.push(s);
            }
            Transition::Remove { id, .. } => {
                self.slots.iter_mut().find(|s| &s.id == id).unwrap().state = State::Removed;
            }
        }
    }
}

/// A whole life: rotations happen on schedule, there is always exactly one active root and
/// intermediate, the active intermediate always chains to a root that has been in the bundle
/// for the propagation window (or since the first start), and nothing is removed while a
/// certificate (simulated: leaves live 2 s, issued every second) chains to it.
#[test]
fn a_simulated_life_rotates_on_schedule_and_keeps_every_chain_trusted() {
    let p = Policy {
        jitter: 0.02,
        root_propagation: Duration::from_secs(5),
        removal_grace: Duration::from_secs(2),
        ..Policy::default()
    };
    let mut sim = Sim {
        slots: Vec::new(),
        next: 0,
        root_ttl: 120,
        int_ttl: 20,
    };
    // Leaves: (issuer id, not_after).
    let mut leaves: Vec<(String, u64)> = Vec::new();
    let mut bundle_since: std::collections::HashMap<String, u64> = Default::default();
    let (mut root_activations, mut int_activations) = (0, 0);
    for now in 0..400u64 {
        for s in &mut sim.slots {
            s.issued_unexpired = leaves
                .iter()
                .filter(|(k, na)| *k == s.id && *na > now)
                .count() as u64;
        }
        let mut steps = 0;
        while let Some(t) = decide_ca(&sim.slots, at(now), &p, &KeyIdJitter)
            .into_iter()
            .next()
        {
            if let Transition::Activate { id, .. } = &t {
                match sim.slots.iter().find(|s| &s.id == id).unwrap().kind {
                    Kind::Root => root_activations += 1,
                    Kind::Intermediate => int_activations += 1,
                    Kind::Jwt => unreachable!("decide_ca never moves a JWT key"),
                }
            }
            sim.apply(&t, now);
            steps += 1;
            assert!(steps < 10, "decide does not settle at {now}: {t:?}");
        }
        for s in sim
            .slots
            .iter()
            .filter(|s| s.kind == Kind::Root && s.state != State::Removed)
        {
            bundle_since.entry(s.id.clone()).or_insert(now);
        }
        let active: Vec<&Slot> = sim
            .slots
            .iter()
            .filter(|s| s.state == State::Active)
            .collect();
        assert_eq!(active.len(), 2, "at {now}: {active:?}");
        let int = active
            .iter()
            .find(|s| s.kind == Kind::Intermediate)
            .unwrap();
        let root_id = int.parent.clone().unwrap();
        let since = bundle_since[&root_id];
        assert!(
            since == 0 || now >= since + 5,
            "at {now}: root {root_id} in the bundle only since {since}"
        );
        assert!(
            int.not_after > at(now),
            "at {now}: active intermediate expired"
        );
        // Every live leaf still chains to a non-removed intermediate and root.
        let int_na = int.not_after.duration_since(at(0)).unwrap().as_secs();
        leaves.push((int.id.clone(), (now + 2).min(int_na)));
        for (k, na) in leaves.iter().filter(|(_, na)| *na > now) {
            let i = sim.slots.iter().find(|s| &s.id == k).unwrap();
            assert_ne!(
                i.state,
                State::Removed,
                "at {now}: a live leaf (until {na}) lost {k}"
            );
            let r = sim
                .slots
                .iter()
                .find(|s| Some(&s.id) == i.parent.as_ref())
                .unwrap();
            assert_ne!(
                r.state,
                State::Removed,
                "at {now}: a live leaf lost its root"
            );
        }
    }
    // 400 s of 20 s intermediates activated every ~10 s; 120 s roots every ~60-100 s.
    assert!((30..=60).contains(&int_activations), "{int_activations}");
    assert!((4..=7).contains(&root_activations), "{root_activations}");
    let removed = sim
        .slots
        .iter()
        .filter(|s| s.state == State::Removed)
        .count();
    assert!(removed > 20, "old keys are removed: {removed}");
}

/// A JWT key valid `nb..na` (seconds after T0), in `state`.
fn jwt(id: &str, state: State, nb: u64, na: u64) -> Slot {
    slot(id, Kind::Jwt, state, None, nb, na)
}

fn jwt_first(slots: &[Slot], now: SystemTime) -> Option<Transition> {
    decide_jwt(slots, now, &policy(), &NoJitter)
        .into_iter()
        .next()
}

#[test]
fn jwt_keys_bootstrap_after_the_ca_keys_and_independently_of_them() {
    // No JWT key: the CA's transitions come first, the JWT key's after them.
    let s = vec![slot("r1", Kind::Root, State::Prepared, None, 0, 1000)];
    assert_eq!(
        decide(&s, at(0), &policy(), &NoJitter),
        vec![
            Transition::Activate {
                id: "r1".into(),
                reason: Reason::Bootstrap
            },
            Transition::PrepareJwt {
                reason: Reason::Bootstrap
            }
        ]
    );
    let mut s = steady();
    assert_eq!(
        first(&s, at(1)),
        None,
        "the CA rules ignore the missing JWT key"
    );
    assert_eq!(
        decide(&s, at(1), &policy(), &NoJitter),
        vec![Transition::PrepareJwt {
            reason: Reason::Bootstrap
        }]
    );
    // None active: the prepared key is activated at once, whatever the propagation.
    s.push(jwt("j1", State::Prepared, 1, 86_400));
    assert_eq!(
        decide(&s, at(1), &policy(), &NoJitter),
        vec![Transition::Activate {
            id: "j1".into(),
            reason: Reason::Bootstrap
        }]
    );
    s[2].state = State::Active;
    assert!(decide(&s, at(2), &policy(), &NoJitter).is_empty());
}

#[test]
fn jwt_key_is_prepared_at_one_half_and_activated_at_five_sixths_after_propagation() {
    let life = 86_400;
    let mut s = vec![jwt("j1", State::Active, 0, life)];
    assert_eq!(jwt_first(&s, at(life / 2 - 1)), None);
    assert_eq!(
        jwt_first(&s, at(life / 2)),
        Some(Transition::PrepareJwt {
            reason: Reason::Threshold
        })
    );
    // Prepared late (just before 5/6): it waits for the propagation window (600 s).
    let five_sixths = life * 5 / 6;
    s.push(jwt(
        "j2",
        State::Prepared,
        five_sixths - 100,
        five_sixths - 100 + life,
    ));
    assert_eq!(jwt_first(&s, at(five_sixths)), None);
    assert_eq!(jwt_first(&s, at(five_sixths + 499)), None);
    assert_eq!(
        jwt_first(&s, at(five_sixths + 500)),
        Some(Transition::Activate {
            id: "j2".into(),
            reason: Reason::Threshold
        })
    );
    // Prepared on time: activated at 5/6 exactly.
    s[1].prepared_at = at(life / 2);
    assert_eq!(jwt_first(&s, at(five_sixths - 1)), None);
    assert_eq!(
        jwt_first(&s, at(five_sixths)),
        Some(Transition::Activate {
            id: "j2".into(),
            reason: Reason::Threshold
        })
    );
    // An expired active key is replaced at once, propagation or not.
    s[1].prepared_at = at(life - 1);
    assert_eq!(
        jwt_first(&s, at(life)),
        Some(Transition::Activate {
            id: "j2".into(),
            reason: Reason::Expired
        })
    );
}

#[test]
fn a_tainted_jwt_key_is_replaced_at_once() {
    let mut s = vec![jwt("j1", State::Active, 0, 86_400)];
    s[0].tainted = true;
    assert_eq!(
        jwt_first(&s, at(10)),
        Some(Transition::PrepareJwt {
            reason: Reason::Tainted
        })
    );
    // Just prepared: activated at once (the tainted key must stop signing).
    s.push(jwt("j2", State::Prepared, 10, 86_410));
    assert_eq!(
        jwt_first(&s, at(10)),
        Some(Transition::Activate {
            id: "j2".into(),
            reason: Reason::Tainted
        })
    );
    // A tainted prepared key is removed, never activated.
    s[1].tainted = true;
    assert_eq!(
        decide_jwt(&s, at(10), &policy(), &NoJitter),
        vec![
            Transition::Remove {
                id: "j2".into(),
                reason: Reason::Tainted
            },
            Transition::PrepareJwt {
                reason: Reason::Tainted
            }
        ]
    );
}

#[test]
fn a_retired_jwt_key_is_removed_once_its_tokens_cannot_be_live() {
    let p = policy();
    let mut s = vec![
        jwt("j2", State::Active, 1000, 90_000),
        jwt("j1", State::Retired, 0, 86_400),
    ];
    s[1].retired_at = Some(at(1000));
    let gone = 1000 + p.jwt_max_ttl.as_secs() + p.removal_grace.as_secs();
    assert_eq!(jwt_first(&s, at(gone - 1)), None);
    assert_eq!(
        jwt_first(&s, at(gone)),
        Some(Transition::Remove {
            id: "j1".into(),
            reason: Reason::TokensExpired
        })
    );
    // An expired retired key goes whatever its retirement time.
    s[1].retired_at = Some(at(86_000));
    assert!(
        decide_jwt(&s, at(86_400), &p, &NoJitter).contains(&Transition::Remove {
            id: "j1".into(),
            reason: Reason::Expired
        })
    );
    // The CA rules never remove a JWT key (its ledger count means nothing to them).
    let mut all = steady();
    all.extend(s);
    assert!(decide_ca(&all, at(86_400), &p, &NoJitter).is_empty());
}

#[test]
fn jwt_thresholds_move_with_the_key_id_jitter() {
    let p = Policy {
        jitter: 0.02,
        ..policy()
    };
    let a = jwt("key-a", State::Active, 0, 86_400);
    let b = jwt("key-b", State::Active, 0, 86_400);
    let ta = jwt_prepare_time(&a, &p, &KeyIdJitter);
    let tb = jwt_prepare_time(&b, &p, &KeyIdJitter);
    assert_ne!(ta, tb, "two keys get different thresholds");
    assert_eq!(ta, jwt_prepare_time(&a, &p, &KeyIdJitter), "stable per key");
    let half = at(43_200);
    let bound = Duration::from_secs_f64(86_400.0 * 0.02);
    for t in [ta, tb] {
        let d = t.duration_since(half).unwrap_or_else(|e| e.duration());
        assert!(d <= bound, "{d:?}");
    }
}
