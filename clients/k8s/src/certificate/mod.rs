//! Standalone mode: reconciles `cert-manager.io/v1` `Certificate`s whose `issuerRef.group` is
//! `signet.dev`, without cert-manager installed.
//!
//! Three small reconcilers, each owning one transition and cooperating only through the
//! Certificate's status (cert-manager's `trigger`, `issuing` and `readiness` controllers):
//!
//! 1. **trigger** ([`steps::trigger`]): a (re)issuance is due (no Secret, wrong names or key,
//!    expired, renewal time reached) and no failure backoff is running → `Issuing=True`.
//! 2. **issuing** ([`issue`]): while `Issuing=True`, makes or reuses the key, sends the CSR,
//!    writes the `kubernetes.io/tls` Secret with server-side apply, then bumps `revision`;
//!    on failure records `lastFailureTime`/`failedIssuanceAttempts` and backs off.
//! 3. **readiness** ([`steps::readiness`]): derives `Ready`, `notBefore`, `notAfter` and a
//!    jittered `renewalTime` from the Secret.
//!
//! The decisions are pure ([`policy`], [`steps`]); this module reads the Secret, calls the
//! signer, applies the Secret and patches the status subresource (a JSON merge patch of the
//! changed fields only, so a settled Certificate causes no writes and no hot loop).

pub mod policy;
pub mod secret;
pub mod steps;
pub mod triggers;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Map, Value, json};

use crate::certmanager::{Certificate, CertificateStatus};
use crate::issuers::IssuerKey;
use crate::keys::{self, CsrNames};
use crate::signer::{SignBackend, SignError, Signed, Signer};
use policy::{Blocked, Desired, MANAGER, SecretView};
use signet_runtime::clock::Clock;
use signet_runtime::random::Random;

/// Signs a CSR for the issuer a Certificate names. Production resolves the issuer
/// ([`IssuerSigners`]); a bridge-wide server ([`FixedSigner`]) serves tests and Citadel mode.
pub trait CertSigner: Send + Sync {
    fn sign<'a>(
        &'a self,
        issuer: &'a IssuerKey,
        csr: &'a [u8],
        namespace: &'a str,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Signed, SignError>>;
}

/// One server for every issuer: the bridge's default connection.
pub struct FixedSigner(pub Signer);

impl CertSigner for FixedSigner {
    fn sign<'a>(
        &'a self,
        _issuer: &'a IssuerKey,
        csr: &'a [u8],
        namespace: &'a str,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Signed, SignError>> {
        Box::pin(self.0.sign(csr, namespace, ttl))
    }
}

/// Resolves the `Issuer`/`ClusterIssuer` and signs with its server (the foundation's
/// [`SignBackend`], a connection cache in production).
pub struct IssuerSigners {
    pub client: Client,
    pub backend: Arc<dyn SignBackend>,
    /// Where a ClusterIssuer's references are read.
    pub bridge_namespace: String,
    /// The operator's server and the bridge's own token.
    pub bridge: Arc<crate::operator::BridgeConfig>,
}

impl CertSigner for IssuerSigners {
    fn sign<'a>(
        &'a self,
        issuer: &'a IssuerKey,
        csr: &'a [u8],
        namespace: &'a str,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Signed, SignError>> {
        Box::pin(async move {
            let obj = crate::issuers::fetch(&self.client, issuer)
                .await
                .map_err(|e| SignError::retryable("ApiError", e.to_string()))?
                .ok_or_else(|| {
                    SignError::retryable("IssuerNotFound", format!("{issuer} does not exist"))
                })?;
            if !obj.is_ready() {
                return Err(SignError::retryable(
                    "IssuerNotReady",
                    format!("{issuer} is not Ready"),
                ));
            }
            let cfg =
                crate::issuers::resolve(&self.client, &obj, &self.bridge, &self.bridge_namespace)
                    .await
                    .map_err(|e| SignError::retryable(e.reason(), e.to_string()))?;
            self.backend
                .sign(&issuer.to_string(), &cfg, csr, namespace, ttl)
                .await
        })
    }
}

/// What the Certificate reconcilers share.
pub struct Context {
    pub client: Client,
    pub signer: Arc<dyn CertSigner>,
    pub clock: Arc<dyn Clock>,
    /// Renewal jitter.
    pub random: Arc<dyn Random>,
    /// All Certificates (the controller's cache), to find two naming one Secret.
    pub peers: Store<Certificate>,
    /// Put an ownerReference to the Certificate on its Secret.
    pub owner_ref: bool,
    /// Events for issuance outcomes.
    pub events: Arc<dyn crate::events::Events>,
    /// The server's bundle (its taints and CRLs make a compromised certificate due now);
    /// `None` until one arrives, or always without an operator connection.
    pub bundle: tokio::sync::watch::Receiver<Option<crate::signer::BundleInfo>>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Internal(String),
}

/// Longest wait between two looks at a settled Certificate.
const RESYNC: Duration = Duration::from_secs(3600);

/// Runs the three reconcilers on one Certificate, in order, each on the status the one before
/// wrote.
#[tracing::instrument(
    target = "signet_trace",
    name = "reconcile.certificate",
    skip_all,
    fields(
        k8s.namespace = %cert.namespace().unwrap_or_default(),
        k8s.name = %cert.name_any(),
    ),
    err(Display)
)]
pub async fn reconcile(cert: Arc<Certificate>, ctx: Arc<Context>) -> Result<Action, Error> {
    let d = match policy::validate(&cert) {
        Ok(None) => return Ok(Action::await_change()),
        Ok(Some(d)) => Ok(d),
        Err(b) => Err(b),
    };
    let ns = cert.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut secret = if cert.spec.secret_name.is_empty() {
        None
    } else {
        secrets.get_opt(&cert.spec.secret_name).await?
    };
    let blocked: Option<Blocked> = match &d {
        Err(b) => Some(b.clone()),
        Ok(d) => {
            let others = policy::conflicts(&cert, &ctx.peers.state());
            if !others.is_empty() {
                Some(policy::conflict_blocked(&d.secret_name, &others))
            } else {
                secret
                    .as_ref()
                    .and_then(|s| policy::secret_owner_problem(s, &d.name))
            }
        }
    };
    let d = d.ok();
    let generation = cert.metadata.generation;
    let mut cert = (*cert).clone();
    let mut view = secret.as_ref().map(SecretView::of);
    let mut wakes: Vec<Duration> = Vec::new();

    // 1. trigger
    let now = ctx.clock.now();
    let revocations = ctx
        .bundle
        .borrow()
        .as_ref()
        .map(|b| b.revocations.clone())
        .unwrap_or_default();
    let st = cert.status.clone().unwrap_or_default();
    let (next, wake) = steps::trigger(
        &st,
        d.as_ref(),
        blocked.as_ref(),
        view.as_ref(),
        now,
        generation,
        &revocations,
    );
    wakes.extend(wake);
    patch_status(&ctx.client, &mut cert, &st, &next).await?;

    // 2. issuing
    let st = cert.status.clone().unwrap_or_default();
    if crate::conditions::is_true(&st.conditions, crate::certmanager::CONDITION_ISSUING) {
        let (next, wake, applied) = issue(
            &ctx,
            &cert,
            &st,
            d.as_ref(),
            blocked.as_ref(),
            view.as_ref(),
        )
        .await?;
        wakes.extend(wake);
        // Issued under a key that is still tainted (or listed already): counted as a failure,
        // so the next attempt waits the failure backoff.
        let new_view = applied.as_ref().map(SecretView::of);
        let next = match steps::compromised(new_view.as_ref(), &revocations) {
            Some(why) => {
                let (next, wait) = steps::issued_compromised(&st, &next, ctx.clock.now());
                tracing::warn!(certificate = %format!("{ns}/{}", cert.name_any()), retry_in = %humantime::format_duration(wait), "{}; the new certificate is compromised too", why.message);
                wakes.push(wait);
                next
            }
            None => next,
        };
        let event = issuing_event(&st, &next, &cert.spec.secret_name);
        let regarding = cert.object_ref(&());
        patch_status(&ctx.client, &mut cert, &st, &next).await?;
        if let Some(note) = event {
            ctx.events.publish(regarding, note).await;
        }
        if let Some(s) = applied {
            view = Some(SecretView::of(&s));
            secret = Some(s);
        }
    }
    let _ = &secret;

    // 3. readiness
    let now = ctx.clock.now();
    let st = cert.status.clone().unwrap_or_default();
    let (next, wake) = steps::readiness(
        &st,
        d.as_ref(),
        blocked.as_ref(),
        view.as_ref(),
        now,
        ctx.random.unit(),
        generation,
    );
    wakes.extend(wake);
    patch_status(&ctx.client, &mut cert, &st, &next).await?;

    let wait = wakes.into_iter().min().unwrap_or(RESYNC).min(RESYNC);
    Ok(Action::requeue(wait.max(Duration::from_secs(1))))
}

/// The event for an issuing step that issued (the revision moved) or failed (a new failure
/// time), from the status before and after it.
fn issuing_event(
    before: &CertificateStatus,
    after: &CertificateStatus,
    secret: &str,
) -> Option<crate::events::Note> {
    use crate::events::Note;
    if after.revision != before.revision {
        return Some(Note::new(
            false,
            crate::certmanager::reason::ISSUED,
            format!(
                "The certificate has been issued into Secret {secret:?} (revision {})",
                after.revision.unwrap_or(0)
            ),
            "IssueCertificate",
        ));
    }
    if after.last_failure_time != before.last_failure_time {
        let c = crate::conditions::get(&after.conditions, crate::certmanager::CONDITION_ISSUING)?;
        return Some(Note::new(
            true,
            c.reason
                .as_deref()
                .unwrap_or(crate::certmanager::reason::FAILED),
            c.message.clone().unwrap_or_default(),
            "IssueCertificate",
        ));
    }
    None
}

/// The issuing reconciler: one attempt. Returns the status it wants, when to look again, and
/// the Secret it applied.
async fn issue(
    ctx: &Context,
    cert: &Certificate,
    st: &CertificateStatus,
    d: Option<&Desired>,
    blocked: Option<&Blocked>,
    view: Option<&SecretView>,
) -> Result<(CertificateStatus, Option<Duration>, Option<Secret>), Error> {
    let now = ctx.clock.now();
    let generation = cert.metadata.generation;
    let d = match (d, blocked) {
        (_, Some(b)) => return Ok((steps::abandoned(st, b, now, generation), None, None)),
        (None, None) => return Ok((st.clone(), None, None)),
        (Some(d), None) => d,
    };
    // A retryable failure keeps Issuing=True: wait out its backoff.
    if let Some(t) = steps::backoff_until(st)
        && now < t
    {
        return Ok((st.clone(), t.duration_since(now).ok(), None));
    }
    let fail = |permanent: bool, reason: &str, message: &str| {
        let (next, wait) = steps::failed(st, permanent, reason, message, now, generation);
        Ok((next, Some(wait), None))
    };
    let key = match policy::reusable_key(d, view) {
        Some(k) => k.clone(),
        None => {
            let alg = d.key.algorithm;
            match tokio::task::spawn_blocking(move || keys::generate(alg)).await {
                Ok(Ok(k)) => k,
                Ok(Err(e)) => return fail(true, "KeyGenerationFailed", &e.to_string()),
                Err(e) => return Err(Error::Internal(format!("key generation task: {e}"))),
            }
        }
    };
    let names = CsrNames {
        spiffe_id: d.spiffe_id.clone(),
        dns_names: d.dns_names.clone(),
        common_name: d.common_name.clone(),
    };
    let csr = match keys::build_csr(&key, &names) {
        Ok(c) => c,
        Err(e) => return fail(true, "InvalidRequest", &e.to_string()),
    };
    let key_pem = match key.to_pem(d.key.encoding) {
        Ok(k) => k,
        Err(e) => return fail(true, "KeyGenerationFailed", &e.to_string()),
    };
    let signed = match ctx
        .signer
        .sign(&d.issuer, csr.as_bytes(), &d.namespace, Some(d.duration))
        .await
    {
        Ok(s) => s,
        Err(e) => return fail(e.is_permanent(), e.reason(), e.message()),
    };
    let body = secret::apply_body(
        cert,
        d,
        &secret::SecretData {
            chain_pem: signed.chain_pem(),
            key_pem,
            ca_pem: signed.ca_pem,
        },
        ctx.owner_ref,
    );
    // Force only over a Secret we already own (checked by the owner policy before getting here).
    let ours = view.is_some();
    let mut pp = PatchParams::apply(MANAGER);
    if ours {
        pp = pp.force();
    }
    // A refused write (e.g. a field another manager owns) is a failure with backoff like any
    // other, not an error retried at once with a fresh key and certificate.
    let applied = match Api::<Secret>::namespaced(ctx.client.clone(), &d.namespace)
        .patch(&d.secret_name, &pp, &Patch::Apply(&body))
        .await
    {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("writing Secret {:?}: {e}", d.secret_name);
            return fail(false, "SecretWriteFailed", &msg);
        }
    };
    tracing::info!(
        certificate = %format!("{}/{}", d.namespace, d.name),
        secret = %d.secret_name,
        spiffe_id = %signed.certificate.spiffe_id(),
        serial = %signed.certificate.serial_hex(),
        "issued"
    );
    Ok((steps::issued(st), None, Some(applied)))
}

/// The fields of `new` that differ from `old`, as a merge patch of `status` (`null` removes).
pub fn status_patch(old: &CertificateStatus, new: &CertificateStatus) -> Option<Value> {
    let to_map = |s: &CertificateStatus| match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let (old, new) = (to_map(old), to_map(new));
    let mut diff = Map::new();
    for (k, v) in &new {
        if old.get(k) != Some(v) {
            diff.insert(k.clone(), v.clone());
        }
    }
    for k in old.keys() {
        if !new.contains_key(k) {
            diff.insert(k.clone(), Value::Null);
        }
    }
    (!diff.is_empty()).then(|| json!({ "status": diff }))
}

async fn patch_status(
    client: &Client,
    cert: &mut Certificate,
    old: &CertificateStatus,
    new: &CertificateStatus,
) -> Result<(), Error> {
    let Some(patch) = status_patch(old, new) else {
        return Ok(());
    };
    let api: Api<Certificate> =
        Api::namespaced(client.clone(), &cert.namespace().unwrap_or_default());
    let updated = api
        .patch_status(
            &cert.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    *cert = updated;
    Ok(())
}

/// A store holding `certs`, for running [`reconcile`] outside a controller (tests, tools).
pub fn store_of(certs: impl IntoIterator<Item = Certificate>) -> Store<Certificate> {
    let mut w: kube::runtime::reflector::store::Writer<Certificate> = Default::default();
    for c in certs {
        w.apply_watcher_event(&watcher::Event::Apply(c));
    }
    w.as_reader()
}

fn error_policy(_cert: Arc<Certificate>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "certificate reconcile failed");
    Action::requeue(Duration::from_secs(30))
}

/// Builds the controller (exposed so `run` can share its store as the peer list).
pub fn controller(client: &Client) -> Controller<Certificate> {
    Controller::new(
        Api::<Certificate>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<Secret>::all(client.clone()),
        watcher::Config::default().labels(&format!("{}={MANAGER}", policy::LABEL_MANAGED_BY)),
        |s: Secret| {
            let ns = s.namespace()?;
            let name = s.annotations().get(policy::ANN_CERTIFICATE_NAME)?.clone();
            Some(ObjectRef::<Certificate>::new(&name).within(&ns))
        },
    )
}

/// Runs the Certificate reconcilers until the stream ends.
pub async fn run(
    client: Client,
    signer: Arc<dyn CertSigner>,
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
    owner_ref: bool,
    events: Arc<dyn crate::events::Events>,
    bundle: tokio::sync::watch::Receiver<Option<crate::signer::BundleInfo>>,
) {
    // A change of taints or CRLs looks at every Certificate again.
    let c = controller(&client)
        .reconcile_all_on(crate::signer::revocation_changes(bundle.clone()))
        .shutdown_on_signal();
    let ctx = Arc::new(Context {
        client,
        signer,
        clock,
        random,
        peers: c.store(),
        owner_ref,
        events,
        bundle,
    });
    c.run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            crate::metrics::reconciled("certificate", &r);
            if let Err(e) = r {
                tracing::debug!(error = %e, "certificate controller");
            }
        })
        .await;
}

#[cfg(test)]
pub(crate) mod tests;
