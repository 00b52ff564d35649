//! Signet's own identity objects (issue 29): SPIRE controller manager's shape, with its gap
//! closed by tenants.
//!
//! - [`crd`]: `signet.dev/v1alpha1` `ClusterIdentity` (cluster-scoped, the platform team's),
//!   `Identity` (namespaced, a tenant's: always `spiffe://<td>/ns/<its namespace>/...`) and
//!   `Tenant` (the platform team's bounds on a group of namespaces).
//! - [`tenant`]: which tenant a namespace belongs to (Capsule's ownership, never its label; or
//!   an explicit list) and that tenant's bounds. Pure.
//! - [`plan`]: an object, its namespaces and pods, tenancy → the exact entries of its scope,
//!   and what was refused. Pure.
//! - [`registrar`]: the server's `signet.ca.v1.Registration` (`SyncOwnedEntries`, `ListOwnedEntries`)
//!   behind the [`registrar::Registrar`] trait.
//! - [`reconcile`]: the reconcilers (ClusterIdentity, Identity, Tenant status) and the garbage
//!   collection of scopes whose object is gone.
//!
//! [`run_identities`] runs them all (`signet-k8s run --identities`).

pub mod crd;
pub mod plan;
pub mod reconcile;
pub mod registrar;
pub mod tenant;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use signet_types::node_set::NodeSetName;

use crate::events::Events;
use crate::operator::BridgeConfig;
use crd::{ClusterIdentity, Identity, Tenant};
use plan::Env;
use reconcile::IdentityContext;
use registrar::{GrpcRegistrar, Registrar};

/// How often scopes whose object is gone are looked for.
pub const GC_INTERVAL: Duration = Duration::from_secs(60);

/// The controllers' settings from the bridge's flags.
#[derive(Clone, Debug)]
pub struct IdentityOptions {
    /// `--node-set`: the node set entries are served to (a ClusterIdentity may name another).
    pub node_set: NodeSetName,
    /// `--identities-without-tenant`: Identities of a namespace in no tenant get the
    /// namespace defaults instead of being refused.
    pub without_tenant: bool,
}

/// Runs the identity controllers until the process stops: ClusterIdentity and Identity (to
/// the server's owned entries), Tenant status, and the garbage collection of deleted
/// objects' scopes. Needs the operator's server (`--server`, `--bundle`): the trust domain is
/// the bridge's `--trust-domain`, else the one the bundle names (waited for).
pub async fn run_identities(
    client: Client,
    bridge: Arc<BridgeConfig>,
    options: IdentityOptions,
    events: Arc<dyn Events>,
) {
    let trust_domain = loop {
        match bridge.operator_target() {
            Ok(t) => break t.trust_domain,
            Err(e) => {
                tracing::warn!(error = %e, "identities: no trust domain yet (the bridge's --server/--bundle)");
                signet_runtime::clock::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    let registrar: Arc<dyn Registrar> = Arc::new(GrpcRegistrar::new(bridge.clone()));
    let env = Env {
        trust_domain,
        node_set: options.node_set.clone(),
        without_tenant: options.without_tenant,
    };
    tracing::info!(
        trust_domain = %env.trust_domain.as_str(),
        node_set = %env.node_set.as_str(),
        without_tenant = env.without_tenant,
        "identities: reconciling ClusterIdentities, Identities and Tenants"
    );
    let ctx = Arc::new(IdentityContext::new(
        client.clone(),
        registrar,
        env,
        Arc::new(signet_runtime::clock::SystemClock),
        events,
    ));
    // Capsule: watched only when installed at start (a later install needs a restart; the
    // reconcilers read it at every pass either way).
    let capsule = matches!(reconcile::capsule_tenants(&client).await, Ok(Some(_)));
    let config = controller::Config::default().debounce(Duration::from_secs(1));

    let cluster = {
        let c = Controller::new(
            Api::<ClusterIdentity>::all(client.clone()),
            watcher::Config::default(),
        )
        .with_config(config.clone());
        let all = c.store();
        let all2 = all.clone();
        c.watches(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default(),
            move |_pod| refs(&all),
        )
        .watches(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
            move |_ns| refs(&all2),
        )
        .shutdown_on_signal()
        .run(
            reconcile::reconcile_cluster_identity,
            reconcile::error_policy_cluster_identity,
            ctx.clone(),
        )
        .for_each(|r| {
            crate::metrics::reconciled("cluster_identity", &r);
            let ctx = ctx.clone();
            async move { after(r, &ctx).await }
        })
    };

    let namespaced = {
        let c = Controller::new(
            Api::<Identity>::all(client.clone()),
            watcher::Config::default(),
        )
        .with_config(config.clone());
        let store = c.store();
        let (s1, s2, s3) = (store.clone(), store.clone(), store.clone());
        let c = c
            .watches(
                Api::<Pod>::all(client.clone()),
                watcher::Config::default(),
                move |pod| in_namespace(&s1, pod.namespace().as_deref()),
            )
            .watches(
                Api::<Namespace>::all(client.clone()),
                watcher::Config::default(),
                move |ns| in_namespace(&s2, Some(&ns.name_any())),
            )
            .watches(
                Api::<Tenant>::all(client.clone()),
                watcher::Config::default(),
                move |_t| refs(&s3),
            );
        let c = if capsule {
            let s4 = store.clone();
            c.watches_with(
                Api::<kube::api::DynamicObject>::all_with(
                    client.clone(),
                    &reconcile::capsule_resource(),
                ),
                reconcile::capsule_resource(),
                watcher::Config::default(),
                move |_t| refs(&s4),
            )
        } else {
            c
        };
        c.shutdown_on_signal()
            .run(
                reconcile::reconcile_identity,
                reconcile::error_policy_identity,
                ctx.clone(),
            )
            .for_each(|r| {
                crate::metrics::reconciled("identity", &r);
                let ctx = ctx.clone();
                async move { after(r, &ctx).await }
            })
    };

    let tenants = {
        let c = Controller::new(
            Api::<Tenant>::all(client.clone()),
            watcher::Config::default(),
        )
        .with_config(config);
        let store = c.store();
        let (s1, s2, s3) = (store.clone(), store.clone(), store.clone());
        // Another Tenant's change can make or end a conflict: every Tenant looks again.
        let c = c
            .watches(
                Api::<Namespace>::all(client.clone()),
                watcher::Config::default(),
                move |_ns| refs(&s1),
            )
            .watches(
                Api::<Tenant>::all(client.clone()),
                watcher::Config::default(),
                move |_t| refs(&s3),
            );
        let c = if capsule {
            c.watches_with(
                Api::<kube::api::DynamicObject>::all_with(
                    client.clone(),
                    &reconcile::capsule_resource(),
                ),
                reconcile::capsule_resource(),
                watcher::Config::default(),
                move |_t| refs(&s2),
            )
        } else {
            c
        };
        c.shutdown_on_signal()
            .run(
                reconcile::reconcile_tenant,
                reconcile::error_policy_tenant,
                ctx.clone(),
            )
            .for_each(|r| async move {
                crate::metrics::reconciled("tenant", &r);
                if let Err(e) = r {
                    tracing::debug!(error = %e, "Tenant controller");
                }
            })
    };

    let gc = {
        let ctx = ctx.clone();
        async move {
            loop {
                signet_runtime::clock::sleep(GC_INTERVAL).await;
                if let Err(e) = reconcile::collect_garbage(&ctx).await {
                    tracing::warn!(error = %e, "identities: garbage collection failed; next pass in a minute");
                }
            }
        }
    };
    // The controllers stop on a signal; the garbage collection with them.
    let controllers = async { tokio::join!(cluster, namespaced, tenants) };
    tokio::select! {
        _ = controllers => {}
        _ = gc => {}
    }
}

fn refs<K>(store: &kube::runtime::reflector::Store<K>) -> Vec<ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .map(|o| ObjectRef::from(&**o))
        .collect()
}

fn in_namespace(
    store: &kube::runtime::reflector::Store<Identity>,
    ns: Option<&str>,
) -> Vec<ObjectRef<Identity>> {
    store
        .state()
        .iter()
        .filter(|o| o.namespace().as_deref() == ns)
        .map(|o| ObjectRef::from(&**o))
        .collect()
}

/// After a reconcile: an object no longer in the controller's store may have been deleted; its
/// scope is emptied now if the API server confirms it is gone (the periodic garbage
/// collection catches what this misses).
async fn after<K, E: std::fmt::Display, Q: std::fmt::Display>(
    r: Result<(ObjectRef<K>, kube::runtime::controller::Action), controller::Error<E, Q>>,
    ctx: &IdentityContext,
) where
    K: kube::Resource,
{
    let Err(e) = r else { return };
    if let controller::Error::ObjectNotFound(obj) = &e {
        let scope = match (obj.dyntype.kind.as_str(), obj.namespace.as_deref()) {
            ("ClusterIdentity", None) => reconcile::cluster_scope(&obj.name),
            ("Identity", Some(ns)) => reconcile::identity_scope(ns, &obj.name),
            _ => return,
        };
        if let Err(e) = reconcile::empty_if_gone(ctx, &scope).await {
            tracing::warn!(%scope, error = %e, "cannot remove a deleted object's entries yet; the garbage collection will");
        }
        return;
    }
    tracing::debug!(error = %e, "identity controller");
}

#[cfg(test)]
mod tests;
