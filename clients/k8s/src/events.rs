//! Kubernetes Events for what the bridge decides about an object (`kubectl describe` shows
//! them): an issuer becoming Ready or not, a CertificateRequest issued, failed, denied or
//! pending, a Certificate issued or its issuance failing. Published through kube-rs's
//! [`Recorder`] (`events.k8s.io/v1`; a repeat of the same event becomes a series, patched);
//! only on a change of the object's status, so a failing object does not flood the API.
//! Publishing never fails a reconcile: an error is logged.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// One event about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    /// CamelCase, as the condition's reason.
    pub reason: String,
    /// What happened, for a person (at most 1 kB; longer is cut).
    pub note: String,
    /// The bridge's action: `CheckIssuer`, `SignRequest`, `IssueCertificate`.
    pub action: &'static str,
}

/// Longest `note` the Events API takes.
const MAX_NOTE: usize = 1024;

impl Note {
    pub fn new(warning: bool, reason: &str, note: impl Into<String>, action: &'static str) -> Self {
        let mut note = note.into();
        if note.len() > MAX_NOTE {
            let mut cut = MAX_NOTE - 3;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        Self {
            warning,
            reason: reason.to_owned(),
            note,
            action,
        }
    }
}

/// Where events go: the API ([`KubeEvents`]), nowhere ([`NoEvents`]), or a test's list.
pub trait Events: Send + Sync {
    fn publish<'a>(&'a self, regarding: ObjectReference, note: Note) -> BoxFuture<'a, ()>;
}

/// Events through kube-rs's [`Recorder`], reported as controller `signet-k8s`.
pub struct KubeEvents(Recorder);

impl KubeEvents {
    /// `instance`: the bridge's pod name, when known.
    pub fn new(client: Client, instance: Option<String>) -> Self {
        Self(Recorder::new(
            client,
            Reporter {
                controller: crate::FIELD_MANAGER.into(),
                instance,
            },
        ))
    }
}

impl Events for KubeEvents {
    fn publish<'a>(&'a self, regarding: ObjectReference, note: Note) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let ev = Event {
                type_: if note.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: note.reason.clone(),
                note: Some(note.note.clone()),
                action: note.action.into(),
                secondary: None,
            };
            if let Err(e) = self.0.publish(&ev, &regarding).await {
                tracing::warn!(
                    kind = ?regarding.kind, name = ?regarding.name, namespace = ?regarding.namespace,
                    reason = %note.reason, error = %e, "cannot publish an event"
                );
            }
        })
    }
}

/// No events (tests that do not look at them).
pub struct NoEvents;

impl Events for NoEvents {
    fn publish<'a>(&'a self, _: ObjectReference, _: Note) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Expect, mock_client, object};
    use kube::Resource;
    use serde_json::json;

    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let n = Note::new(true, "Failed", "é".repeat(600), "SignRequest");
        assert!(n.note.len() <= MAX_NOTE, "{}", n.note.len());
        assert!(n.note.ends_with("..."));
    }

    /// What the API server answers for a created or patched Event: a real events.k8s.io/v1
    /// object.
    fn stored_event(name: &str) -> serde_json::Value {
        object(
            "events.k8s.io/v1",
            "Event",
            Some("a"),
            name,
            "11",
            json!({"eventTime": "2027-01-15T08:00:00.000000Z", "type": "Warning",
                "reason": "InvalidSpec", "action": "CheckIssuer", "note": "x",
                "reportingController": "signet-k8s", "reportingInstance": "signet-k8s-abc",
                "regarding": {"apiVersion": "signet.dev/v1", "kind": "Issuer", "name": "signet",
                    "namespace": "a"}}),
        )
    }

    #[tokio::test]
    async fn publishes_an_events_k8s_io_event_then_a_series() {
        let (client, api) = mock_client();
        let issuer_json = object(
            "signet.dev/v1",
            "Issuer",
            Some("a"),
            "signet",
            "9",
            json!({"spec": {}}),
        );
        let uid = issuer_json["metadata"]["uid"].clone();
        let issuer: crate::crd::Issuer = serde_json::from_value(issuer_json).unwrap();
        let regarding = issuer.object_ref(&());
        let scenario = api.run(vec![
            Expect::post("/apis/events.k8s.io/v1/namespaces/a/events")
                .body_with(move |b| {
                    assert_eq!(b["apiVersion"], "events.k8s.io/v1");
                    assert_eq!(b["kind"], "Event");
                    assert_eq!(b["metadata"]["namespace"], "a");
                    assert_eq!(b["type"], "Warning");
                    assert_eq!(b["reason"], "InvalidSpec");
                    assert_eq!(b["action"], "CheckIssuer");
                    assert_eq!(b["note"], "spec.server is not allowed");
                    assert_eq!(b["reportingController"], "signet-k8s");
                    assert_eq!(b["reportingInstance"], "signet-k8s-abc");
                    assert_eq!(
                        b["regarding"],
                        json!({"apiVersion": "signet.dev/v1", "kind": "Issuer", "name": "signet",
                            "namespace": "a", "uid": uid})
                    );
                    assert!(b["eventTime"].is_string());
                    assert!(b.get("series").is_none());
                })
                .respond(stored_event("signet.1")),
        ]);
        let events = KubeEvents::new(client, Some("signet-k8s-abc".into()));
        let note = Note::new(
            true,
            "InvalidSpec",
            "spec.server is not allowed",
            "CheckIssuer",
        );
        events.publish(regarding.clone(), note.clone()).await;
        let (api, got) = scenario.finish_keep().await;
        let name = got[0].body["metadata"]["name"].as_str().unwrap().to_owned();
        assert!(name.starts_with("signet."), "{name}");

        // The same event again: the first one becomes a series of two (a merge patch).
        let scenario = api.run(vec![
            Expect::patch(&format!(
                "/apis/events.k8s.io/v1/namespaces/a/events/{name}"
            ))
            .content_type("application/merge-patch+json")
            .body_with(|b| {
                assert_eq!(b["series"]["count"], 2);
                assert!(b["series"]["lastObservedTime"].is_string());
            })
            .respond(stored_event(&name)),
        ]);
        events.publish(regarding, note).await;
        scenario.finish().await;
    }
}
