//! The identity reconcilers: read the objects a plan needs, plan ([`super::plan`]), sync the
//! object's scope on the server ([`super::registrar`]), report in the object's status (and an
//! Event when its Ready condition changes). Also the Tenant status and the garbage
//! collection of scopes whose object is gone.
//!
//! Scopes: `ClusterIdentity/<name>` and `Identity/<namespace>/<name>`. The bridge removes only
//! scopes of those two shapes whose object no longer exists; any other scope it may own is
//! never touched.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::crd::{ClusterIdentity, Identity, IdentityStatus, MAX_REFUSALS, Tenant, TenantStatus};
use super::plan::{self, Env, Plan, Refusal, Workload};
use super::registrar::Registrar;
use super::tenant::{
    Bounds, CAPSULE_GROUP, CAPSULE_VERSION, CapsuleTenant, NamespaceInfo, Tenancy,
};
use crate::backoff::{Backoffs, Policy};
use crate::conditions::{self, Condition, ConditionStatus};
use crate::events::{Events, Note};
use crate::signer::SignError;
use signet_runtime::clock::Clock;

pub const REASON_SYNCED: &str = "Synced";
pub const REASON_SERVER_REFUSED: &str = "ServerRefused";
pub const REASON_SYNC_FAILED: &str = "SyncFailed";
/// How often a reconciled object is looked at again (a quota freed elsewhere, a namespace
/// moved) when nothing woke it before.
pub const RECHECK: Duration = Duration::from_secs(300);

/// What the identity reconcilers share.
pub struct IdentityContext {
    pub client: Client,
    pub registrar: Arc<dyn Registrar>,
    pub env: Env,
    pub clock: Arc<dyn Clock>,
    pub events: Arc<dyn Events>,
    pub backoffs: Backoffs<String>,
}

impl IdentityContext {
    pub fn new(
        client: Client,
        registrar: Arc<dyn Registrar>,
        env: Env,
        clock: Arc<dyn Clock>,
        events: Arc<dyn Events>,
    ) -> Self {
        Self {
            client,
            registrar,
            env,
            clock,
            events,
            backoffs: Backoffs::new(Policy::default()),
        }
    }
}

/// A failure the controller retries with backoff (API or server errors).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("signet-server: {0}")]
    Server(#[from] SignError),
}

pub fn cluster_scope(name: &str) -> String {
    format!("ClusterIdentity/{name}")
}

pub fn identity_scope(ns: &str, name: &str) -> String {
    format!("Identity/{ns}/{name}")
}

/// An owned scope the bridge knows how to check, parsed back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Cluster(String),
    Namespaced(String, String),
}

/// `ClusterIdentity/<name>` or `Identity/<ns>/<name>`; anything else is not ours to judge.
pub fn parse_scope(s: &str) -> Option<Scope> {
    let parts: Vec<&str> = s.split('/').collect();
    match parts.as_slice() {
        ["ClusterIdentity", n] if !n.is_empty() => Some(Scope::Cluster((*n).to_owned())),
        ["Identity", ns, n] if !ns.is_empty() && !n.is_empty() => {
            Some(Scope::Namespaced((*ns).to_owned(), (*n).to_owned()))
        }
        _ => None,
    }
}

/// The Capsule Tenant API resource.
pub fn capsule_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CAPSULE_GROUP, CAPSULE_VERSION, "Tenant"),
        "tenants",
    )
}

/// The Capsule Tenants, or `None` when Capsule is not installed (404 on its API).
pub async fn capsule_tenants(client: &Client) -> Result<Option<Vec<CapsuleTenant>>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &capsule_resource());
    match api.list(&ListParams::default()).await {
        Ok(l) => Ok(Some(l.items.iter().map(CapsuleTenant::from).collect())),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

async fn namespaces(client: &Client) -> Result<Vec<NamespaceInfo>, kube::Error> {
    Ok(Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(NamespaceInfo::from)
        .collect())
}

/// Running pods only: a finished pod needs no identity.
fn workloads(pods: Vec<Pod>) -> Vec<Workload> {
    pods.iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .map(Workload::from)
        .collect()
}

fn label_query(labels: &BTreeMap<String, String>) -> ListParams {
    let sel: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if sel.is_empty() {
        ListParams::default()
    } else {
        ListParams::default().labels(&sel.join(","))
    }
}

async fn tenancy(client: &Client) -> Result<(Tenancy, Vec<NamespaceInfo>), kube::Error> {
    let tenants = Api::<Tenant>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let capsule = capsule_tenants(client).await?;
    let nss = namespaces(client).await?;
    Ok((Tenancy::resolve(&tenants, capsule.as_deref(), &nss), nss))
}

/// The status after a reconcile (None: unchanged) and the Ready condition.
pub fn next_status(
    old: Option<&IdentityStatus>,
    plan: &Plan,
    synced: Result<u32, &SignError>,
    generation: Option<i64>,
    now: std::time::SystemTime,
) -> (Option<IdentityStatus>, Condition) {
    let mut st = old.cloned().unwrap_or_default();
    let refusals: Vec<String> = plan
        .refusals
        .iter()
        .take(MAX_REFUSALS)
        .map(|r| format!("{}: {}", r.reason, r.message))
        .collect();
    let ready = match (synced, plan.refusals.first()) {
        (Err(e), _) if e.is_permanent() => Condition::new(
            "Ready",
            ConditionStatus::False,
            REASON_SERVER_REFUSED,
            format!(
                "signet-server refused the entries ({}): {}",
                e.reason(),
                e.message()
            ),
        ),
        (Err(e), _) => Condition::new(
            "Ready",
            ConditionStatus::False,
            REASON_SYNC_FAILED,
            format!(
                "cannot sync the entries with signet-server yet ({}): {}; retrying",
                e.reason(),
                e.message()
            ),
        ),
        (Ok(_), Some(r)) => {
            let more = plan.refusals.len() - 1;
            Condition::new(
                "Ready",
                ConditionStatus::False,
                r.reason,
                if more > 0 {
                    format!(
                        "{} (and {more} more refusals: see status.refusals)",
                        r.message
                    )
                } else {
                    r.message.clone()
                },
            )
        }
        (Ok(n), None) => Condition::new(
            "Ready",
            ConditionStatus::True,
            REASON_SYNCED,
            format!("{n} registration entries on signet-server"),
        ),
    }
    .with_generation(generation);
    let mut changed = conditions::set(&mut st.conditions, ready.clone(), &conditions::time(now));
    if let Ok(n) = synced
        && st.entries != n
    {
        st.entries = n;
        changed = true;
    }
    if st.refusals != refusals {
        st.refusals = refusals;
        changed = true;
    }
    if st.observed_generation != generation {
        st.observed_generation = generation;
        changed = true;
    }
    (changed.then_some(st), ready)
}

fn ready_note(c: &Condition) -> Note {
    Note::new(
        c.status != ConditionStatus::True,
        c.reason.as_deref().unwrap_or("Unknown"),
        c.message.clone().unwrap_or_default(),
        "SyncIdentity",
    )
}

/// Syncs `plan` into `scope`, patches the status (through `patch`), publishes an event on a
/// Ready change, and decides what next.
async fn sync_and_report<K>(
    obj: &K,
    scope: &str,
    plan: Plan,
    ctx: &IdentityContext,
    api: Api<K>,
    old: Option<&IdentityStatus>,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let synced = ctx.registrar.sync(scope, &plan.entries).await;
    let count = u32::try_from(plan.entries.len()).unwrap_or(u32::MAX);
    let (status, ready) = next_status(
        old,
        &plan,
        synced.as_ref().map(|_| count),
        obj.meta().generation,
        ctx.clock.now(),
    );
    let was = old.and_then(|s| conditions::get(&s.conditions, "Ready").cloned());
    if let Some(st) = status {
        api.patch_status(
            &obj.meta().name.clone().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": st })),
        )
        .await?;
    }
    if was.as_ref().map(|c| (c.status, c.reason.clone()))
        != Some((ready.status, ready.reason.clone()))
    {
        ctx.events
            .publish(obj.object_ref(&()), ready_note(&ready))
            .await;
    }
    match synced {
        Ok(r) => {
            ctx.backoffs.reset(&scope.to_owned());
            if r.created + r.updated + r.deleted > 0 {
                tracing::info!(
                    scope,
                    created = r.created,
                    updated = r.updated,
                    deleted = r.deleted,
                    revision = r.revision,
                    "identity entries synced"
                );
            }
            Ok(Action::requeue(RECHECK))
        }
        Err(e) => {
            tracing::warn!(scope, error = %e, "identity entries not synced");
            Ok(Action::requeue(ctx.backoffs.next(&scope.to_owned())))
        }
    }
}

/// Reconciles one ClusterIdentity.
#[tracing::instrument(
    target = "signet_trace",
    name = "reconcile.cluster_identity",
    skip_all,
    fields(k8s.name = %ci.name_any()),
    err(Display)
)]
pub async fn reconcile_cluster_identity(
    ci: Arc<ClusterIdentity>,
    ctx: Arc<IdentityContext>,
) -> Result<Action, Error> {
    let scope = cluster_scope(&ci.name_any());
    if ci.meta().deletion_timestamp.is_some() {
        ctx.registrar.sync(&scope, &[]).await?;
        return Ok(Action::await_change());
    }
    let nss = namespaces(&ctx.client).await?;
    // A spec refused as a whole is refused without listing pods (its podSelector may not
    // even be a valid label query).
    let refused = plan::plan_cluster_identity(&ci.spec, &ctx.env, &nss, &[]);
    let plan = if refused.refusals.is_empty() {
        let pods = Api::<Pod>::all(ctx.client.clone())
            .list(&label_query(&ci.spec.pod_selector.match_labels))
            .await?
            .items;
        plan::plan_cluster_identity(&ci.spec, &ctx.env, &nss, &workloads(pods))
    } else {
        refused
    };
    let api = Api::<ClusterIdentity>::all(ctx.client.clone());
    sync_and_report(&*ci, &scope, plan, &ctx, api, ci.status.as_ref()).await
}

/// Reconciles one Identity: under its namespace's tenant, the tenant's quota counted over
/// all the tenant's Identities (ordered by creation time, namespace, name).
#[tracing::instrument(
    target = "signet_trace",
    name = "reconcile.identity",
    skip_all,
    fields(k8s.namespace = %id.namespace().unwrap_or_default(), k8s.name = %id.name_any()),
    err(Display)
)]
pub async fn reconcile_identity(
    id: Arc<Identity>,
    ctx: Arc<IdentityContext>,
) -> Result<Action, Error> {
    let ns = id.namespace().unwrap_or_default();
    let name = id.name_any();
    let scope = identity_scope(&ns, &name);
    if id.meta().deletion_timestamp.is_some() {
        ctx.registrar.sync(&scope, &[]).await?;
        return Ok(Action::await_change());
    }
    let (tenancy, _) = tenancy(&ctx.client).await?;
    let no_tenant = Bounds::no_tenant();
    let membership = tenancy.membership(&ns);
    let plan = match plan::bounds_for(&membership, &ns, &ctx.env, &no_tenant) {
        Err(r) => Plan {
            entries: Vec::new(),
            refusals: vec![r],
        },
        Ok(bounds) if bounds.max_identities.is_none() || bounds.tenant.is_empty() => {
            let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
                .list(&ListParams::default())
                .await?
                .items;
            plan::plan_identity(&id.spec, &ns, &ctx.env, bounds, &workloads(pods))
        }
        Ok(bounds) => tenant_plan(&id, &ns, &name, bounds, &tenancy, &ctx).await?,
    };
    let api = Api::<Identity>::namespaced(ctx.client.clone(), &ns);
    sync_and_report(&*id, &scope, plan, &ctx, api, id.status.as_ref()).await
}

/// The plan of `id` among all the Identities of its tenant, with the quota applied.
async fn tenant_plan(
    id: &Identity,
    ns: &str,
    name: &str,
    bounds: &Bounds,
    tenancy: &Tenancy,
    ctx: &IdentityContext,
) -> Result<Plan, Error> {
    let tenant_nss = tenancy.namespaces_of(&bounds.tenant);
    let mut all: Vec<Identity> = Api::<Identity>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|i| {
            i.meta().deletion_timestamp.is_none()
                && tenant_nss.contains(&i.namespace().unwrap_or_default())
        })
        .collect();
    // This very object, as the reconciler saw it (the list may lag behind).
    all.retain(|i| !(i.namespace().as_deref() == Some(ns) && i.name_any() == name));
    all.push(id.clone());
    all.sort_by_key(|i| {
        (
            i.meta().creation_timestamp.as_ref().map(|t| t.0),
            i.namespace().unwrap_or_default(),
            i.name_any(),
        )
    });
    let mut pods: BTreeMap<String, Vec<Workload>> = BTreeMap::new();
    for i in &all {
        let n = i.namespace().unwrap_or_default();
        if let std::collections::btree_map::Entry::Vacant(slot) = pods.entry(n) {
            let list = Api::<Pod>::namespaced(ctx.client.clone(), slot.key())
                .list(&ListParams::default())
                .await?
                .items;
            slot.insert(workloads(list));
        }
    }
    let mut plans: Vec<((String, String), Plan)> = all
        .iter()
        .map(|i| {
            let n = i.namespace().unwrap_or_default();
            let p = plan::plan_identity(
                &i.spec,
                &n,
                &ctx.env,
                bounds,
                pods.get(&n).map(Vec::as_slice).unwrap_or_default(),
            );
            ((n, i.name_any()), p)
        })
        .collect();
    plan::apply_quota(&mut plans, bounds.max_identities, &bounds.tenant);
    Ok(plans
        .into_iter()
        .find(|((n, m), _)| n == ns && m == name)
        .map(|(_, p)| p)
        .unwrap_or_default())
}

/// Reconciles a Tenant's status: its namespaces, conflicts, spec problems, entries in use.
#[tracing::instrument(
    target = "signet_trace",
    name = "reconcile.tenant",
    skip_all,
    fields(k8s.name = %t.name_any()),
    err(Display)
)]
pub async fn reconcile_tenant(t: Arc<Tenant>, ctx: Arc<IdentityContext>) -> Result<Action, Error> {
    let name = t.name_any();
    let (tenancy, _) = tenancy(&ctx.client).await?;
    let nss = tenancy.namespaces_of(&name);
    let records = ctx.registrar.list().await?;
    let entries = records
        .iter()
        .filter(|r| {
            matches!(parse_scope(&r.scope), Some(Scope::Namespaced(ns, _)) if nss.contains(&ns))
        })
        .count();
    let mut refusals: Vec<Refusal> = Vec::new();
    if let Some(Err(why)) = tenancy.tenants.get(&name) {
        refusals.push(Refusal::new(plan::REASON_INVALID_SPEC, why.clone()));
    }
    if let Some(note) = tenancy.notes.get(&name) {
        refusals.push(Refusal::new("NoNamespaces", note.clone()));
    }
    for (ns, others) in tenancy.conflicts_of(&name) {
        refusals.push(Refusal::new(
            plan::REASON_TENANT_CONFLICT,
            format!(
                "namespace {ns} is also claimed by Tenant {}: it belongs to neither",
                others.join(", ")
            ),
        ));
    }
    let next = next_tenant_status(
        t.status.as_ref(),
        u32::try_from(nss.len()).unwrap_or(u32::MAX),
        u32::try_from(entries).unwrap_or(u32::MAX),
        &refusals,
        t.meta().generation,
        ctx.clock.now(),
    );
    if let Some((st, ready)) = next {
        let was = t
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Ready").cloned());
        Api::<Tenant>::all(ctx.client.clone())
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": st })),
            )
            .await?;
        if was.map(|c| (c.status, c.reason)) != Some((ready.status, ready.reason.clone())) {
            ctx.events
                .publish(t.object_ref(&()), ready_note(&ready))
                .await;
        }
    }
    ctx.backoffs.reset(&format!("Tenant/{name}"));
    Ok(Action::requeue(RECHECK))
}

/// The Tenant status (None: unchanged) and its Ready condition.
pub fn next_tenant_status(
    old: Option<&TenantStatus>,
    namespaces: u32,
    entries: u32,
    refusals: &[Refusal],
    generation: Option<i64>,
    now: std::time::SystemTime,
) -> Option<(TenantStatus, Condition)> {
    let mut st = old.cloned().unwrap_or_default();
    let ready = match refusals.first() {
        Some(r) => Condition::new("Ready", ConditionStatus::False, r.reason, r.message.clone()),
        None => Condition::new(
            "Ready",
            ConditionStatus::True,
            "Resolved",
            format!("{namespaces} namespaces, {entries} entries of their Identities"),
        ),
    }
    .with_generation(generation);
    let mut changed = conditions::set(&mut st.conditions, ready.clone(), &conditions::time(now));
    let msgs: Vec<String> = refusals
        .iter()
        .take(MAX_REFUSALS)
        .map(|r| format!("{}: {}", r.reason, r.message))
        .collect();
    for (a, b) in [
        (&mut st.namespace_count, namespaces),
        (&mut st.entries, entries),
    ] {
        if *a != b {
            *a = b;
            changed = true;
        }
    }
    if st.refusals != msgs {
        st.refusals = msgs;
        changed = true;
    }
    if st.observed_generation != generation {
        st.observed_generation = generation;
        changed = true;
    }
    changed.then_some((st, ready))
}

/// Empties every scope of the bridge's whose object is gone (or being deleted); returns the
/// scopes emptied. Scopes of other shapes are left alone.
pub async fn collect_garbage(ctx: &IdentityContext) -> Result<Vec<String>, Error> {
    let records = ctx.registrar.list().await?;
    let mut scopes: Vec<&str> = records.iter().map(|r| r.scope.as_str()).collect();
    scopes.dedup();
    let mut emptied = Vec::new();
    for scope in scopes {
        if empty_if_gone(ctx, scope).await? {
            emptied.push(scope.to_owned());
        }
    }
    Ok(emptied)
}

/// Empties `scope` if it is one of the bridge's two shapes and its object is gone (or being
/// deleted), as the API server says now; returns whether it did.
pub async fn empty_if_gone(ctx: &IdentityContext, scope: &str) -> Result<bool, Error> {
    let gone = match parse_scope(scope) {
        None => return Ok(false),
        Some(Scope::Cluster(n)) => Api::<ClusterIdentity>::all(ctx.client.clone())
            .get_opt(&n)
            .await?
            .is_none_or(|o| o.meta().deletion_timestamp.is_some()),
        Some(Scope::Namespaced(ns, n)) => Api::<Identity>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&n)
            .await?
            .is_none_or(|o| o.meta().deletion_timestamp.is_some()),
    };
    if gone {
        ctx.registrar.sync(scope, &[]).await?;
        tracing::info!(scope, "entries of a deleted identity object removed");
    }
    Ok(gone)
}

/// A failed reconcile of a ClusterIdentity: retried with the crate's backoff.
pub fn error_policy_cluster_identity(
    o: Arc<ClusterIdentity>,
    err: &Error,
    ctx: Arc<IdentityContext>,
) -> Action {
    let key = cluster_scope(&o.name_any());
    tracing::warn!(object = %key, error = %err, "identity reconcile failed");
    Action::requeue(ctx.backoffs.next(&key))
}

/// A failed reconcile of an Identity: retried with the crate's backoff.
pub fn error_policy_identity(o: Arc<Identity>, err: &Error, ctx: Arc<IdentityContext>) -> Action {
    let key = identity_scope(&o.namespace().unwrap_or_default(), &o.name_any());
    tracing::warn!(object = %key, error = %err, "identity reconcile failed");
    Action::requeue(ctx.backoffs.next(&key))
}

/// A failed reconcile of a Tenant: retried with the crate's backoff.
pub fn error_policy_tenant(o: Arc<Tenant>, err: &Error, ctx: Arc<IdentityContext>) -> Action {
    let key = format!("Tenant/{}", o.name_any());
    tracing::warn!(object = %key, error = %err, "tenant reconcile failed");
    Action::requeue(ctx.backoffs.next(&key))
}
