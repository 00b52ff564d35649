//! The cert-manager external-issuer contract for `CertificateRequest`s naming a Signet issuer.
//!
//! Pure decisions — [`triage`] (which requests to touch), [`prepare`] (is the request
//! signable), [`outcome_of`] (what a signing result means), [`next_status`] (the new status)
//! — and a thin async [`reconcile`] that does the I/O: read the issuer, call the server,
//! write the status subresource with one JSON merge patch carrying the object's
//! `resourceVersion` (so a concurrent approval or denial is never overwritten).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::certmanager::{
    BadDuration, CONDITION_APPROVED, CONDITION_DENIED, CONDITION_READY, CertificateRequest,
    CertificateRequestStatus, parse_go_duration, reason,
};
use crate::conditions::{self, Condition, ConditionStatus};
use crate::context::{Context, Error};
use crate::csr;
use crate::issuers::{self, IssuerKey, IssuerObj, RefMatch};
use crate::signer::{SignError, Signed};

/// What to do with a request, from the request alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Triage {
    /// `issuerRef.group` is not `signet.dev`: another issuer's.
    NotOurs,
    /// Has `status.certificate` (or Ready=True): done.
    AlreadyIssued,
    /// Ready=False reason Failed: final.
    AlreadyFailed,
    /// Ready=False reason Denied: final.
    AlreadyDenied,
    /// Denied=True: mark it Denied and stop.
    Denied,
    /// Not (yet) Approved: never sign, write nothing.
    NotApproved,
    /// Our group, but a kind we do not serve: Failed.
    UnknownKind(String),
    /// Approved and ours: sign it with this issuer.
    Proceed(IssuerKey),
}

/// cert-manager's external-issuer contract, in order.
pub fn triage(cr: &CertificateRequest) -> Triage {
    let ns = cr.namespace().unwrap_or_default();
    let ours = IssuerKey::from_ref(&cr.spec.issuer_ref, &ns);
    if ours == RefMatch::NotOurs {
        return Triage::NotOurs;
    }
    let empty = CertificateRequestStatus::default();
    let st = cr.status.as_ref().unwrap_or(&empty);
    if st.certificate.as_ref().is_some_and(|c| !c.is_empty())
        || conditions::is_true(&st.conditions, CONDITION_READY)
    {
        return Triage::AlreadyIssued;
    }
    if conditions::has(
        &st.conditions,
        CONDITION_READY,
        ConditionStatus::False,
        reason::FAILED,
    ) {
        return Triage::AlreadyFailed;
    }
    if conditions::has(
        &st.conditions,
        CONDITION_READY,
        ConditionStatus::False,
        reason::DENIED,
    ) {
        return Triage::AlreadyDenied;
    }
    if conditions::is_true(&st.conditions, CONDITION_DENIED) {
        return Triage::Denied;
    }
    if !conditions::is_true(&st.conditions, CONDITION_APPROVED) {
        return Triage::NotApproved;
    }
    match ours {
        RefMatch::Ours(k) => Triage::Proceed(k),
        RefMatch::UnknownKind(k) => Triage::UnknownKind(k),
        RefMatch::NotOurs => Triage::NotOurs,
    }
}

/// What the reconciler writes and whether it comes back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub ready: ConditionStatus,
    pub reason: &'static str,
    pub message: String,
    /// Set `status.failureTime` (Failed, Denied).
    pub failed: bool,
    /// `(certificate, ca)` PEM for `status.certificate` / `status.ca`.
    pub issued: Option<(Vec<u8>, Vec<u8>)>,
    /// Come back after a backoff (Pending).
    pub retry: bool,
}

impl Outcome {
    pub fn pending(message: impl Into<String>) -> Self {
        Self {
            ready: ConditionStatus::False,
            reason: reason::PENDING,
            message: message.into(),
            failed: false,
            issued: None,
            retry: true,
        }
    }
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            ready: ConditionStatus::False,
            reason: reason::FAILED,
            message: message.into(),
            failed: true,
            issued: None,
            retry: false,
        }
    }
    pub fn denied() -> Self {
        Self {
            ready: ConditionStatus::False,
            reason: reason::DENIED,
            message: "The CertificateRequest was denied by an approval controller".into(),
            failed: true,
            issued: None,
            retry: false,
        }
    }
}

/// A request that passed every check made before calling the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    pub csr_der: Vec<u8>,
    pub ttl: Option<Duration>,
}

/// Why the issuer does not allow signing now. The message is the request's Pending message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssuerClosed {
    #[error(
        "{0} not found: create it, or fix spec.issuerRef (kind Issuer is looked up in the \
         request's namespace)"
    )]
    NotFound(IssuerKey),
    /// Its Ready condition is not True (the condition's reason and message).
    #[error("{key} is not Ready ({reason}: {message})")]
    NotReady {
        key: IssuerKey,
        reason: String,
        message: String,
    },
    /// It has no Ready condition yet.
    #[error("{0} is not Ready yet: the bridge has not reached its server")]
    NotReadyYet(IssuerKey),
}

/// Whether the issuer allows signing now.
pub fn issuer_gate(key: &IssuerKey, issuer: Option<&IssuerObj>) -> Result<(), IssuerClosed> {
    let Some(issuer) = issuer else {
        return Err(IssuerClosed::NotFound(key.clone()));
    };
    if issuer.is_ready() {
        return Ok(());
    }
    Err(match issuer.ready_condition() {
        Some(c) => IssuerClosed::NotReady {
            key: key.clone(),
            reason: c.reason.as_deref().unwrap_or("NoReason").to_owned(),
            message: c.message.as_deref().unwrap_or("").to_owned(),
        },
        None => IssuerClosed::NotReadyYet(key.clone()),
    })
}

/// Why a request itself is refused before any call to the server. The message is the Failed
/// message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestRefusal {
    #[error(transparent)]
    Csr(#[from] csr::CsrRefusal),
    #[error("spec.duration: {0}")]
    Duration(#[from] BadDuration),
}

/// Checks the request itself: CSR, isCA, usages, duration.
pub fn prepare(cr: &CertificateRequest) -> Result<Prepared, RequestRefusal> {
    let checked = csr::check(
        &cr.spec.request,
        cr.spec.is_ca.unwrap_or(false),
        &cr.spec.usages,
    )?;
    let ttl = match cr.spec.duration.as_deref() {
        None | Some("") => None,
        Some(d) => {
            let d = parse_go_duration(d)?;
            if d.is_zero() { None } else { Some(d) }
        }
    };
    Ok(Prepared {
        csr_der: checked.der,
        ttl,
    })
}

/// Whole seconds the way cert-manager users write durations: `1000h`, `1h30m`, `45s`.
fn fmt_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if out.is_empty() { "0s".into() } else { out }
}

/// What a signing result means for the request.
pub fn outcome_of(
    key: &IssuerKey,
    ttl: Option<Duration>,
    res: Result<Signed, SignError>,
) -> Outcome {
    match res {
        Ok(s) => {
            let c = &s.certificate;
            let lifetime = c
                .not_after()
                .duration_since(c.not_before())
                .unwrap_or_default();
            let mut message = format!("Certificate issued by {key} for {}", c.spiffe_id());
            if let Some(want) = ttl
                && lifetime + Duration::from_secs(120) < want
            {
                message.push_str(&format!(
                    "; the server shortened the requested duration {} to {} (its maximum)",
                    fmt_duration(want),
                    fmt_duration(lifetime)
                ));
            }
            Outcome {
                ready: ConditionStatus::True,
                reason: reason::ISSUED,
                message,
                failed: false,
                issued: Some((s.chain_pem().into_bytes(), s.ca_pem.into_bytes())),
                retry: false,
            }
        }
        Err(SignError::Permanent { reason, message }) => {
            Outcome::failed(format!("Signet refused to sign ({reason}): {message}"))
        }
        Err(SignError::Retryable { reason, message }) => Outcome::pending(format!(
            "Signing failed, will retry with backoff ({reason}): {message}"
        )),
    }
}

/// The status after `out`, or `None` when nothing would change (no write, no churn).
pub fn next_status(
    old: Option<&CertificateRequestStatus>,
    out: &Outcome,
    now: SystemTime,
) -> Option<CertificateRequestStatus> {
    let mut st = old.cloned().unwrap_or_default();
    let t = conditions::time(now);
    let mut changed = conditions::set(
        &mut st.conditions,
        Condition::new(CONDITION_READY, out.ready, out.reason, out.message.clone()),
        &t,
    );
    if out.failed && st.failure_time.is_none() {
        st.failure_time = Some(t);
        changed = true;
    }
    if let Some((cert, ca)) = &out.issued {
        st.certificate = Some(cert.clone());
        st.ca = Some(ca.clone());
        changed = true;
    }
    changed.then_some(st)
}

/// The JSON merge patch for the status subresource: the whole new status, guarded by the
/// `resourceVersion` the decision was made on (the API server answers 409 if it moved).
pub fn status_patch(resource_version: Option<&str>, st: &CertificateRequestStatus) -> Value {
    let mut v = json!({ "status": st });
    if let Some(rv) = resource_version {
        v["metadata"] = json!({ "resourceVersion": rv });
    }
    v
}

fn object_key(cr: &CertificateRequest) -> String {
    format!(
        "CertificateRequest/{}/{}",
        cr.namespace().unwrap_or_default(),
        cr.name_any()
    )
}

async fn sign_step(
    cr: &CertificateRequest,
    key: &IssuerKey,
    ctx: &Context,
) -> Result<Outcome, Error> {
    let issuer = issuers::fetch(&ctx.client, key).await?;
    if let Err(closed) = issuer_gate(key, issuer.as_ref()) {
        return Ok(Outcome::pending(closed.to_string()));
    }
    let Some(issuer) = issuer else {
        return Ok(Outcome::pending(format!("{key} not found")));
    };
    let prepared = match prepare(cr) {
        Ok(p) => p,
        Err(refusal) => return Ok(Outcome::failed(refusal.to_string())),
    };
    let cfg = match issuers::resolve(&ctx.client, &issuer, &ctx.bridge, &ctx.bridge_namespace).await
    {
        Ok(c) => c,
        Err(e) => {
            return Ok(Outcome::pending(format!(
                "{key} cannot be used ({}): {e}",
                e.reason()
            )));
        }
    };
    let ns = cr.namespace().unwrap_or_default();
    let res = ctx
        .backend
        .sign(&key.to_string(), &cfg, &prepared.csr_der, &ns, prepared.ttl)
        .await;
    Ok(outcome_of(key, prepared.ttl, res))
}

/// Reconciles one CertificateRequest.
#[tracing::instrument(
    target = "signet_trace",
    name = "reconcile.certificate_request",
    skip_all,
    fields(
        k8s.namespace = %cr.namespace().unwrap_or_default(),
        k8s.name = %cr.name_any(),
    ),
    err(Display)
)]
pub async fn reconcile(cr: Arc<CertificateRequest>, ctx: Arc<Context>) -> Result<Action, Error> {
    let okey = object_key(&cr);
    let out = match triage(&cr) {
        Triage::NotOurs
        | Triage::AlreadyIssued
        | Triage::AlreadyFailed
        | Triage::AlreadyDenied
        | Triage::NotApproved => {
            ctx.backoffs.reset(&okey);
            return Ok(Action::await_change());
        }
        Triage::Denied => Outcome::denied(),
        Triage::UnknownKind(kind) => Outcome::failed(format!(
            "spec.issuerRef.kind {kind:?} is not served by signet-k8s: use Issuer or ClusterIssuer"
        )),
        Triage::Proceed(key) => sign_step(&cr, &key, &ctx).await?,
    };
    tracing::info!(request = %okey, reason = out.reason, message = %out.message, "CertificateRequest");
    if let Some(st) = next_status(cr.status.as_ref(), &out, ctx.clock.now()) {
        let api: Api<CertificateRequest> =
            Api::namespaced(ctx.client.clone(), &cr.namespace().unwrap_or_default());
        let patch = status_patch(cr.resource_version().as_deref(), &st);
        api.patch_status(
            &cr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        let note = crate::events::Note::new(
            out.ready != ConditionStatus::True,
            out.reason,
            out.message.clone(),
            "SignRequest",
        );
        ctx.events.publish(cr.object_ref(&()), note).await;
    }
    if out.retry {
        Ok(Action::requeue(ctx.backoffs.next(&okey)))
    } else {
        ctx.backoffs.reset(&okey);
        Ok(Action::await_change())
    }
}

/// Which CertificateRequests to look at again when the issuer `key` changes (e.g. becomes
/// Ready): those naming it that are still waiting (triage `Proceed`).
pub fn waiting_on<'a>(
    requests: impl IntoIterator<Item = &'a CertificateRequest>,
    key: &IssuerKey,
) -> Vec<kube::runtime::reflector::ObjectRef<CertificateRequest>> {
    requests
        .into_iter()
        .filter(|cr| matches!(triage(cr), Triage::Proceed(k) if k == *key))
        .map(kube::runtime::reflector::ObjectRef::from_obj)
        .collect()
}

/// The CertificateRequest controller, woken also when an Issuer or ClusterIssuer changes, so
/// a request waiting for its issuer is signed as soon as the issuer is Ready rather than at
/// its next backoff. Runs until a termination signal.
pub async fn run_controller(client: kube::Client, ctx: Arc<Context>) {
    use futures::StreamExt;
    use kube::runtime::{Controller, watcher};

    use crate::crd::{ClusterIssuer, Issuer};

    let ctl = Controller::new(
        Api::<CertificateRequest>::all(client.clone()),
        watcher::Config::default(),
    );
    let (s1, s2) = (ctl.store(), ctl.store());
    ctl.watches(
        Api::<Issuer>::all(client.clone()),
        watcher::Config::default(),
        move |i: Issuer| {
            let key = IssuerObj::from(i).key;
            let state = s1.state();
            waiting_on(state.iter().map(|a| a.as_ref()), &key)
        },
    )
    .watches(
        Api::<ClusterIssuer>::all(client),
        watcher::Config::default(),
        move |i: ClusterIssuer| {
            let key = IssuerObj::from(i).key;
            let state = s2.state();
            waiting_on(state.iter().map(|a| a.as_ref()), &key)
        },
    )
    .shutdown_on_signal()
    .run(reconcile, error_policy, ctx)
    .for_each(|r| async move {
        crate::metrics::reconciled("certificate_request", &r);
        if let Err(e) = r {
            tracing::debug!(error = %e, "CertificateRequest controller");
        }
    })
    .await;
}

/// Retries API failures with the object's backoff.
pub fn error_policy(cr: Arc<CertificateRequest>, err: &Error, ctx: Arc<Context>) -> Action {
    let okey = object_key(&cr);
    tracing::warn!(request = %okey, error = %err, "CertificateRequest reconcile failed");
    Action::requeue(ctx.backoffs.next(&okey))
}

#[cfg(test)]
mod tests;
