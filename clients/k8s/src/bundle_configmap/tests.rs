//! The trust bundle ConfigMap against a scripted API server: written (forced apply of
//! `data.ca.crt` only) when the roots differ, left alone when they are the same, never emptied,
//! and followed through a rotation by `run`.

use serde_json::json;

use super::*;
use crate::testing::{Expect, applied, scripted};

const CM_URI: &str = "/api/v1/namespaces/signet-system/configmaps/signet-bundle";
const PATCH_URI: &str =
    "/api/v1/namespaces/signet-system/configmaps/signet-bundle?&force=true&fieldManager=signet-k8s";
const ROOT1: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const ROOT2: &str = "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n";

fn bundle(roots: &str, revision: u64) -> BundleInfo {
    BundleInfo {
        trust_domain: "example.org".into(),
        roots_pem: roots.into(),
        revision,
        ..Default::default()
    }
}

/// The ConfigMap as `kubectl create configmap signet-bundle --from-file=ca.crt` leaves it.
fn installed(roots: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "signet-bundle", "namespace": "signet-system", "uid": "cm-1",
            "resourceVersion": "7", "creationTimestamp": "2026-12-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl-create", "operation": "Update",
                "apiVersion": "v1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:data": {".": {}, "f:ca.crt": {}}}}]},
        "data": {"ca.crt": roots}
    })
}

#[tokio::test]
async fn the_roots_are_written_when_they_differ_and_only_then() {
    let (client, server) = scripted(vec![
        Expect::reply("GET", CM_URI, 200, installed(ROOT1)),
        Expect::reply("GET", CM_URI, 200, installed(ROOT1)),
        Expect::exchange("PATCH", PATCH_URI, applied("cm-1")),
    ]);
    let same = write_if_changed(&client, "signet-system", "signet-bundle", &bundle(ROOT1, 1))
        .await
        .unwrap();
    assert!(!same, "the same roots are not written again");
    let both = format!("{ROOT1}{ROOT2}");
    let wrote = write_if_changed(&client, "signet-system", "signet-bundle", &bundle(&both, 2))
        .await
        .unwrap();
    assert!(wrote);
    let seen = server.await.unwrap();
    assert_eq!(
        seen[2].body,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "signet-bundle", "namespace": "signet-system",
                "labels": {"signet.dev/managed-by": "signet-k8s"}},
            "data": {"ca.crt": both}
        })
    );
}

#[tokio::test]
async fn a_bundle_without_roots_never_empties_the_configmap() {
    let (client, server) = scripted(vec![]);
    let err = write_if_changed(
        &client,
        "signet-system",
        "signet-bundle",
        &bundle("  \n", 3),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::NoRoots), "{err}");
    assert!(
        server.await.unwrap().is_empty(),
        "nothing asked of the API server"
    );
}

#[tokio::test]
async fn run_follows_a_rotation() {
    let both = format!("{ROOT1}{ROOT2}");
    let (client, server) = scripted(vec![
        Expect::reply("GET", CM_URI, 200, installed(ROOT1)),
        Expect::reply("GET", CM_URI, 200, installed(ROOT1)),
        Expect::exchange("PATCH", PATCH_URI, applied("cm-1")),
    ]);
    let (tx, rx) = watch::channel(Some(bundle(ROOT1, 1)));
    let task = tokio::spawn(run(
        client,
        "signet-system".into(),
        "signet-bundle".into(),
        rx,
    ));
    // Let the first (unchanged) bundle be looked at, then rotate.
    tokio::task::yield_now().await;
    signet_runtime::clock::sleep(Duration::from_millis(50)).await;
    tx.send(Some(bundle(&both, 2))).unwrap();
    signet_runtime::clock::sleep(Duration::from_millis(200)).await;
    drop(tx);
    task.await.unwrap();
    let seen = server.await.unwrap();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[2].body["data"]["ca.crt"], json!(both));
}
