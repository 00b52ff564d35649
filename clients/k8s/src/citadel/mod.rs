//! Citadel compatibility, opt-in per namespace (label `signet.dev/citadel: enabled`): what
//! Istio's old Citadel wrote, so meshes that read it keep working.
//!
//! - Per ServiceAccount, a Secret `istio.<sa>` of type `istio.io/key-and-cert` (`cert-chain.pem`,
//!   `key.pem`, `root-cert.pem`), annotated `istio.io/service-account.name`, owned by the
//!   ServiceAccount (so garbage collection removes it too) and deleted explicitly when the
//!   ServiceAccount goes away. Its identity is `spiffe://<td>/ns/<ns>/sa/<sa>`; it is renewed
//!   at the Certificate rule (a third of the lifetime before expiry, minus jitter), the
//!   renewal time being drawn once per certificate and kept in an annotation.
//! - Per namespace, the ConfigMap `istio-ca-root-cert` (`root-cert.pem`, and `ca-crl.pem`: the
//!   issuing CAs' CRLs, PEM, while there are any), rewritten when the server's bundle changes
//!   (`WatchBundle`).
//! - A Secret whose certificate was issued under a CA key the bundle names as tainted, or whose
//!   serial a CRL lists, is re-issued at once (every ServiceAccount is reconciled again when the
//!   taints or CRLs change); if the new certificate comes back compromised too (the server still
//!   signs with that key), the Secret says so (`signet.dev/compromised-reissues`,
//!   `signet.dev/reissue-after`) and the next attempt waits a growing backoff (5 s to 10 min).
//!
//! Pure decisions in [`plan`]; the reconcilers here do the I/O.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use crate::certificate::CertSigner;
use crate::certificate::policy::MANAGER;
use crate::issuers::{IssuerKey, IssuerKind};
use crate::keys::{self, CsrNames, KeyAlgorithm, KeyEncoding};
use crate::signer::BundleInfo;
use plan::{CONFIGMAP_NAME, Renew};
use signet_runtime::clock::Clock;
use signet_runtime::random::Random;

/// How often namespaces are looked at again for the label.
pub const NAMESPACE_RECHECK: Duration = Duration::from_secs(300);

/// The issuer key Citadel signs under: the bridge's default server connection.
pub fn default_issuer() -> IssuerKey {
    IssuerKey {
        kind: IssuerKind::ClusterIssuer,
        namespace: None,
        name: "signet-k8s-default".into(),
    }
}

pub struct Context {
    pub client: Client,
    pub signer: Arc<dyn CertSigner>,
    pub clock: Arc<dyn Clock>,
    pub random: Arc<dyn Random>,
    /// The server's current bundle (None until the first one arrives).
    pub bundle: watch::Receiver<Option<BundleInfo>>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Sign(#[from] crate::signer::SignError),
    #[error("{0}")]
    Key(#[from] keys::KeyError),
    #[error("{0}")]
    Internal(String),
}

async fn namespace_enabled(client: &Client, ns: &str) -> Result<bool, kube::Error> {
    Ok(Api::<Namespace>::all(client.clone())
        .get_opt(ns)
        .await?
        .is_some_and(|n| plan::citadel_enabled(&n)))
}

/// Makes `istio.<sa>` current for one ServiceAccount.
#[tracing::instrument(
    target = "signet_trace",
    name = "reconcile.citadel_service_account",
    skip_all,
    fields(
        k8s.namespace = %sa.namespace().unwrap_or_default(),
        k8s.name = %sa.name_any(),
    ),
    err(Display)
)]
pub async fn reconcile_service_account(
    sa: Arc<ServiceAccount>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ns = sa.namespace().unwrap_or_default();
    if sa.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if !namespace_enabled(&ctx.client, &ns).await? {
        // Look again later: the namespace may be labelled meanwhile.
        return Ok(Action::requeue(NAMESPACE_RECHECK));
    }
    let Some(bundle) = ctx.bundle.borrow().clone() else {
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    let name = plan::secret_name(&sa.name_any());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = secrets.get_opt(&name).await?;
    let now = ctx.clock.now();
    let spiffe_id = plan::spiffe_id(&bundle.trust_domain, &ns, &sa.name_any());
    let ours = match plan::decide(
        existing.as_ref(),
        &sa,
        &spiffe_id,
        &bundle.roots_pem,
        &bundle.revocations,
        now,
    ) {
        Renew::NotOurs(why) => {
            tracing::warn!(secret = %format!("{ns}/{name}"), "{why}; left untouched");
            return Ok(Action::requeue(Duration::from_secs(3600)));
        }
        Renew::At(t) => {
            return Ok(Action::requeue(
                t.duration_since(now)
                    .unwrap_or_default()
                    .clamp(Duration::from_secs(1), Duration::from_secs(3600)),
            ));
        }
        Renew::RootOnly {
            chain_pem,
            key_pem,
            renewal,
        } => {
            let body =
                plan::secret_body(&sa, &chain_pem, &key_pem, &bundle.roots_pem, renewal, None);
            apply_secret(&secrets, &name, &body, true).await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Renew::Now(why) => {
            if why.contains("tainted") || why.contains("revoked") {
                tracing::info!(secret = %format!("{ns}/{name}"), "re-issuing now: {why}");
            } else {
                tracing::debug!(secret = %format!("{ns}/{name}"), "{why}");
            }
            existing.is_some()
        }
    };
    let key = tokio::task::spawn_blocking(|| keys::generate(KeyAlgorithm::EcdsaP256))
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
    let csr = keys::build_csr(
        &key,
        &CsrNames {
            spiffe_id: spiffe_id.clone(),
            dns_names: Vec::new(),
            common_name: None,
        },
    )?;
    let signed = ctx
        .signer
        .sign(&default_issuer(), csr.as_bytes(), &ns, None)
        .await?;
    let chain_pem = signed.chain_pem();
    let issued = crate::certificate::policy::IssuedCert::parse(chain_pem.as_bytes())
        .map_err(|e| Error::Internal(e.to_string()))?;
    let renewal = crate::certificate::policy::renewal_time(
        issued.not_before,
        issued.not_after,
        None,
        None,
        ctx.random.unit(),
    );
    // Signed under a key that is still tainted (or listed already): keep it, and try again
    // after a growing backoff rather than in a loop.
    let retry = bundle
        .revocations
        .check_pem(chain_pem.as_bytes())
        .map(|why| {
            let n = plan::compromised_reissues(existing.as_ref()).saturating_add(1);
            // Whole seconds, as the annotation says it.
            let after = now + plan::compromised_retry(n, ctx.random.unit());
            let after = std::time::SystemTime::UNIX_EPOCH
                + Duration::from_secs(
                    after
                        .duration_since(std::time::SystemTime::UNIX_EPOCH)
                        .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
                        .unwrap_or(0),
                );
            tracing::warn!(secret = %format!("{ns}/{name}"), attempt = n, retry_at = %humantime::format_rfc3339_seconds(after), "the new certificate {why} too");
            (n, after)
        });
    let body = plan::secret_body(
        &sa,
        &chain_pem,
        &key.to_pem(KeyEncoding::Pkcs8)?,
        &bundle.roots_pem,
        renewal,
        retry,
    );
    apply_secret(&secrets, &name, &body, ours).await?;
    tracing::info!(secret = %format!("{ns}/{name}"), %spiffe_id, "citadel secret issued");
    let next = retry.map_or(renewal, |(_, after)| after.min(renewal));
    Ok(Action::requeue(
        next.duration_since(now)
            .unwrap_or_default()
            .clamp(Duration::from_secs(1), Duration::from_secs(3600)),
    ))
}

async fn apply_secret(
    api: &Api<Secret>,
    name: &str,
    body: &serde_json::Value,
    force: bool,
) -> Result<(), kube::Error> {
    let mut pp = PatchParams::apply(MANAGER);
    if force {
        pp = pp.force();
    }
    api.patch(name, &pp, &Patch::Apply(body)).await?;
    Ok(())
}

/// Writes `istio-ca-root-cert` in `ns` if its root differs from the bundle's.
pub async fn reconcile_root_configmap(
    client: &Client,
    ns: &str,
    bundle: &BundleInfo,
) -> Result<(), Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let current = api.get_opt(CONFIGMAP_NAME).await?;
    let data = current.as_ref().and_then(|c| c.data.as_ref());
    let crls_pem = &bundle.revocations.crls_pem;
    if data.and_then(|d| d.get(plan::ROOT_KEY)) == Some(&bundle.roots_pem)
        && data
            .and_then(|d| d.get(plan::CRL_KEY))
            .map_or("", String::as_str)
            == crls_pem.as_str()
    {
        return Ok(());
    }
    // No force: a field someone else manages is a conflict reported, not overwritten.
    api.patch(
        CONFIGMAP_NAME,
        &PatchParams::apply(MANAGER),
        &Patch::Apply(plan::configmap_body(ns, &bundle.roots_pem, crls_pem)),
    )
    .await?;
    tracing::info!(
        namespace = ns,
        revision = bundle.revision,
        "istio-ca-root-cert written"
    );
    Ok(())
}

fn error_policy(_sa: Arc<ServiceAccount>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "citadel reconcile failed");
    Action::requeue(Duration::from_secs(30))
}

/// Keeps the bundle receiver current from the server's `WatchBundle` stream (reconnecting
/// with backoff).
pub async fn watch_bundle(
    channel: tonic::transport::Channel,
    token_file: Option<std::path::PathBuf>,
    tx: watch::Sender<Option<BundleInfo>>,
) {
    let client = signet_client::ca::CaClient::from_channel(channel);
    let mut attempt = 0u32;
    loop {
        // Sent only when readable and fit for a header, as before: else the call goes without.
        let mut token = None;
        if let Some(path) = &token_file
            && let Ok(t) = tokio::fs::read_to_string(path).await
            && signet_client::with_bearer((), t.trim()).is_ok()
        {
            token = Some(t.trim().to_owned());
        }
        match client.watch_bundle(token.as_deref()).await {
            Ok(mut stream) => loop {
                match stream.next().await {
                    Some(Ok(b)) => {
                        attempt = 0;
                        tx.send_replace(Some(BundleInfo::from(b)));
                    }
                    // A malformed bundle (checked by signet_client) is not taken: reconnect.
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "WatchBundle: the stream failed");
                        break;
                    }
                    None => break,
                }
            },
            Err(e) => tracing::warn!(error = %e, "WatchBundle failed"),
        }
        if tx.is_closed() {
            return;
        }
        // Equal jitter, drawn at the middle: three quarters of the ceiling.
        let wait = signet_runtime::backoff::Backoff::equal(
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
        .delay(attempt, 0.5);
        attempt = attempt.saturating_add(1);
        signet_runtime::clock::sleep(wait).await;
    }
}

/// Runs Citadel mode: the ServiceAccount controller, the deletion watcher and the
/// per-namespace root ConfigMaps, until the process stops.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let label = format!("{}={}", plan::NAMESPACE_LABEL, plan::NAMESPACE_LABEL_VALUE);

    // Root ConfigMaps: on every bundle change and every namespace change.
    let roots = {
        let client = client.clone();
        let mut bundle = ctx.bundle.clone();
        let label = label.clone();
        async move {
            loop {
                let b = bundle.borrow_and_update().clone();
                if let Some(b) = b {
                    match Api::<Namespace>::all(client.clone())
                        .list(&ListParams::default().labels(&label))
                        .await
                    {
                        Ok(list) => {
                            for ns in list.items {
                                if let Err(e) =
                                    reconcile_root_configmap(&client, &ns.name_any(), &b).await
                                {
                                    tracing::warn!(namespace = %ns.name_any(), error = %e, "istio-ca-root-cert");
                                }
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "listing namespaces"),
                    }
                }
                // Look again on a bundle change, or every five minutes for new namespaces.
                if let Ok(Err(_)) = tokio::time::timeout(NAMESPACE_RECHECK, bundle.changed()).await
                {
                    // The bundle watcher is gone: no busy loop, just the periodic pass.
                    signet_runtime::clock::sleep(NAMESPACE_RECHECK).await;
                }
            }
        }
    };

    // A deleted ServiceAccount's Secret is removed by Kubernetes' garbage collector through
    // its ownerReference (controller: true): the bridge needs no `delete` on Secrets.
    let controller = Controller::new(
        Api::<ServiceAccount>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<Secret>::all(client.clone()),
        watcher::Config::default().fields("type=istio.io/key-and-cert"),
    )
    .reconcile_all_on(crate::signer::revocation_changes(ctx.bundle.clone()))
    .shutdown_on_signal()
    .run(reconcile_service_account, error_policy, ctx)
    .for_each(|r| async move {
        if let Err(e) = r {
            tracing::debug!(error = %e, "citadel controller");
        }
    });
    tokio::join!(roots, controller);
}

#[cfg(test)]
mod tests;
