//! The trust bundle ConfigMap kept current (`--bundle-configmap NAME`): the ConfigMap that
//! agents bootstrap from (`ca.crt`, deploy/agent.yaml) and that non-SPIFFE consumers and
//! trust-manager read, rewritten from the server's `WatchBundle` stream on every change of its
//! roots, so a root rotation no longer leaves it stale.
//!
//! - It is the bridge's own namespace's ConfigMap, named by the operator. The operator creates
//!   it at install (deploy/README.md, step 3: the bridge needs it to reach the server at all);
//!   from then on the bridge owns `data.ca.crt` (server-side apply, field manager `signet-k8s`,
//!   forced: the install's `kubectl create` owned the field first). Its RBAC is the Role
//!   `signet-k8s` of the bridge's namespace: `patch` of that one name, `get`, and `create`
//!   (which Kubernetes cannot limit by name; deploy/bridge.yaml).
//! - Written only when the roots differ from what the ConfigMap holds, and never empty (a
//!   bundle without roots is not one the stream delivers; it is refused here too).
//! - The stream is the server's, over TLS authenticated with the bundle itself: the ConfigMap
//!   follows the server the bridge already trusts; it cannot be moved to another CA by anyone
//!   who cannot already sign as that server.
//! - A failed write is retried with capped, jittered backoff (1 s to 60 s) and logged; the next
//!   bundle change is written whatever happened to the previous one.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use signet_runtime::backoff::Backoff;
use tokio::sync::watch;

use crate::certificate::policy::{LABEL_MANAGED_BY, MANAGER};
use crate::signer::BundleInfo;

/// The key agents and trust-manager read.
pub const KEY: &str = "ca.crt";

/// Retries of a failed write.
const RETRY: Backoff = Backoff::full(Duration::from_secs(1), Duration::from_secs(60))
    .with_floor(Duration::from_millis(500));

/// The apply body: only the field the bridge owns (and the managed-by label).
pub fn body(namespace: &str, name: &str, roots_pem: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGER},
        },
        "data": {KEY: roots_pem},
    })
}

/// Why the ConfigMap was not written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the bundle holds no root; the ConfigMap is left as it is")]
    NoRoots,
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Writes `bundle`'s roots into ConfigMap `name` of `namespace` unless it holds them already;
/// true if it wrote.
pub async fn write_if_changed(
    client: &Client,
    namespace: &str,
    name: &str,
    bundle: &BundleInfo,
) -> Result<bool, Error> {
    if bundle.roots_pem.trim().is_empty() {
        return Err(Error::NoRoots);
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let current = api.get_opt(name).await?;
    if current
        .as_ref()
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(KEY))
        == Some(&bundle.roots_pem)
    {
        return Ok(false);
    }
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(body(namespace, name, &bundle.roots_pem)),
    )
    .await?;
    tracing::info!(
        namespace,
        configmap = name,
        revision = bundle.revision,
        "trust bundle ConfigMap written"
    );
    Ok(true)
}

/// Keeps ConfigMap `name` of `namespace` at the roots of every bundle `bundles` carries,
/// until the stream's sender is gone.
pub async fn run(
    client: Client,
    namespace: String,
    name: String,
    mut bundles: watch::Receiver<Option<BundleInfo>>,
) {
    let random = signet_runtime::random::SystemRandom::default();
    let jitter = || signet_runtime::random::Random::unit(&random);
    loop {
        let current = bundles.borrow_and_update().clone();
        if let Some(bundle) = current {
            let mut attempt = 0u32;
            loop {
                match write_if_changed(&client, &namespace, &name, &bundle).await {
                    Ok(_) => break,
                    Err(e) => {
                        attempt = attempt.saturating_add(1);
                        let wait = RETRY.delay(attempt, jitter());
                        tracing::warn!(configmap = %name, error = %e, retry_in = ?wait, "cannot write the trust bundle ConfigMap");
                        tokio::select! {
                            () = signet_runtime::clock::sleep(wait) => {}
                            changed = bundles.changed() => {
                                if changed.is_err() {
                                    return;
                                }
                                break;
                            }
                        }
                    }
                }
            }
            if bundles.has_changed().unwrap_or(false) {
                continue;
            }
        }
        if bundles.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
