//! Real-shaped API objects and the API server's own answers for the mock in [`super`]: a
//! minimal object, `metav1.Status` failures, RFC 7386 merge patches, and objects kept across
//! requests the way the API server keeps them (merged, with a new `resourceVersion`).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// A minimal real-shaped object: `apiVersion`, `kind`, `metadata` (name, namespace when
/// given, uid, resourceVersion, generation, creationTimestamp) merged with `rest`.
pub fn object(
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    resource_version: &str,
    rest: Value,
) -> Value {
    let mut meta = json!({
        "name": name,
        "uid": format!("00000000-0000-4000-8000-{:012x}", fnv(name)),
        "resourceVersion": resource_version,
        "generation": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z",
    });
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    let mut v = json!({"apiVersion": api_version, "kind": kind, "metadata": meta});
    if let (Value::Object(dst), Value::Object(src)) = (&mut v, rest) {
        for (k, val) in src {
            if k == "metadata" {
                if let (Some(Value::Object(m)), Value::Object(extra)) =
                    (dst.get_mut("metadata"), val)
                {
                    m.extend(extra);
                }
            } else {
                dst.insert(k, val);
            }
        }
    }
    v
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    }) & 0xffff_ffff_ffff
}

/// A `metav1.Status` failure, as the API server writes it.
pub fn status_failure(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    })
}

/// The API server's 404 for `kind` (plural) `name`.
pub fn not_found(plural: &str, name: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{plural} \"{name}\" not found"), "reason": "NotFound",
        "details": {"name": name, "kind": plural}, "code": 404
    })
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// An object kept by the fake server: status patches are merged into it and it is returned
/// with a new resourceVersion, as the API server does.
#[derive(Clone)]
pub struct Stored(pub Arc<Mutex<Value>>);

impl Stored {
    pub fn new(v: Value) -> Self {
        Self(Arc::new(Mutex::new(v)))
    }

    pub fn get(&self) -> Value {
        self.0.lock().expect("lock").clone()
    }

    /// A responder that merges the request body and answers with the result.
    pub fn merge_patch(&self) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
        let me = self.clone();
        move |body| {
            let mut v = me.0.lock().expect("lock");
            merge(&mut v, body);
            let rv = v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(1);
            v["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
            (200, v.clone())
        }
    }
}

/// Answers a server-side apply of a new object as the API server would: the body plus the
/// server's metadata.
pub fn applied(uid: &str) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
    let uid = uid.to_owned();
    move |body| {
        let mut v = body.clone();
        merge(
            &mut v,
            &json!({"metadata": {"uid": uid, "resourceVersion": "500",
                "creationTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        (200, v)
    }
}
