//! Status conditions shared by our CRDs and cert-manager's: set one with `lastTransitionTime`
//! moved only when its status changes, read one back. Time comes in as an argument.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `True`, `False` or `Unknown`, as in every Kubernetes condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// One condition, in the shape both cert-manager and `metav1.Condition` use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `Approved`, `Denied`, `Issuing`, `InvalidRequest`…
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "transition_time_schema")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The schema of an optional `metav1.Time`, as k8s-openapi's `schemars` feature describes it
/// (written here so that feature, which doubles k8s-openapi's build time, stays off; the
/// test in `crd` holds `deploy/crds/` to it).
fn transition_time_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON.  Wrappers are provided for many of the factory methods that the time package offers.",
        "format": "date-time",
        "nullable": true,
        "type": "string",
    })
}

impl Condition {
    pub fn new(
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_: type_.to_owned(),
            status,
            reason: Some(reason.to_owned()),
            message: Some(message.into()),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    pub fn with_generation(mut self, generation: Option<i64>) -> Self {
        self.observed_generation = generation;
        self
    }

    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// The condition of this type, if any.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether a condition of this type is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(Condition::is_true)
}

/// Whether the condition of this type has this status and reason.
pub fn has(conditions: &[Condition], type_: &str, status: ConditionStatus, reason: &str) -> bool {
    get(conditions, type_)
        .is_some_and(|c| c.status == status && c.reason.as_deref() == Some(reason))
}

/// Sets `new` in `conditions`, replacing the one of the same type. `lastTransitionTime` is
/// `now` when the status changes (or the condition is new) and kept otherwise, as cert-manager
/// and `meta.SetStatusCondition` do. Returns whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, mut new: Condition, now: &Time) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            new.last_transition_time = if old.status == new.status {
                old.last_transition_time
                    .clone()
                    .or_else(|| Some(now.clone()))
            } else {
                Some(now.clone())
            };
            let changed = *old != new;
            *old = new;
            changed
        }
        None => {
            new.last_transition_time = Some(now.clone());
            conditions.push(new);
            true
        }
    }
}

/// A `Time` from a `SystemTime`, truncated to whole seconds as the API server stores it.
pub fn time(t: std::time::SystemTime) -> Time {
    let secs = signet_runtime::clock::unix(t);
    Time(
        k8s_openapi::jiff::Timestamp::from_second(secs)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(s: u64) -> Time {
        time(UNIX_EPOCH + Duration::from_secs(s))
    }

    #[test]
    fn new_condition_gets_now() {
        let mut cs = vec![];
        assert!(set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "Pending", "wait"),
            &at(10)
        ));
        assert_eq!(cs[0].last_transition_time, Some(at(10)));
        assert!(has(&cs, "Ready", ConditionStatus::False, "Pending"));
        assert!(!is_true(&cs, "Ready"));
    }

    #[test]
    fn same_status_keeps_transition_time_but_updates_message() {
        let mut cs = vec![];
        set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "Pending", "a"),
            &at(10),
        );
        assert!(set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "Pending", "b"),
            &at(20)
        ));
        assert_eq!(cs[0].last_transition_time, Some(at(10)));
        assert_eq!(cs[0].message.as_deref(), Some("b"));
        assert!(!set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "Pending", "b"),
            &at(30)
        ));
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut cs = vec![];
        set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "Pending", "a"),
            &at(10),
        );
        set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::True, "Issued", "ok"),
            &at(20),
        );
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, Some(at(20)));
        assert!(is_true(&cs, "Ready"));
    }

    #[test]
    fn other_types_untouched() {
        let mut cs = vec![Condition::new("Approved", ConditionStatus::True, "ok", "")];
        set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::True, "Issued", "ok"),
            &at(20),
        );
        assert_eq!(cs.len(), 2);
        assert!(is_true(&cs, "Approved"));
    }

    #[test]
    fn serializes_like_kubernetes() {
        let mut c =
            Condition::new("Ready", ConditionStatus::True, "Issued", "ok").with_generation(Some(3));
        c.last_transition_time = Some(at(0));
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"type":"Ready","status":"True","reason":"Issued","message":"ok",
                "lastTransitionTime":"1970-01-01T00:00:00Z","observedGeneration":3})
        );
    }
}
