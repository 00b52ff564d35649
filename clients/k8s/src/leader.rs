//! Leader election on a `coordination.k8s.io/v1` Lease, so two bridge replicas run with one
//! acting (`--leader-election`): the shape of client-go's `leaderelection` package, written
//! for kube 5 and the injected clock.
//!
//! - **One place gates every writer**: [`Elector::run_while_leading`] polls nothing of the work
//!   it is given until this replica holds the Lease, and drops it (every controller, the bundle
//!   ConfigMap task) the moment leadership is in doubt. A follower starts no controller at all.
//! - **Acquire** when the Lease is absent (create; a 409 means another replica created it
//!   first: a loss, not an error), when its holder is empty (released), or when its record has
//!   not changed for `leaseDurationSeconds` *as measured here*: the local monotonic time since
//!   this replica last saw the record change (client-go's `observedTime`), never the holder's
//!   `renewTime` against the local wall clock, so clock skew between nodes cannot hand the
//!   Lease over early. [`decide`] is that rule, pure.
//! - **Every write is optimistic**: the update carries the `resourceVersion` read just before;
//!   a 409 means someone else wrote first, and this replica lost that round.
//! - **Renew** every retry period. A leader that has not renewed successfully within the renew
//!   deadline (measured from the *start* of its last successful attempt, so the server's write
//!   time is never earlier) stops acting: the work is dropped and [`LeaderError::Lost`] is
//!   returned, on which the binary exits non-zero and restarts as a follower. Since renew
//!   deadline < lease duration and a follower starts counting only when it sees the renewed
//!   record (after it was written), the old leader has stopped before any follower can take over.
//!   Every API call is bounded by that deadline: a hung call cannot keep a leader past it.
//! - **Release** on a clean shutdown: the work is dropped first, then the Lease is written with
//!   no holder and `leaseDurationSeconds: 1`, so the other replica takes over at its next
//!   retry instead of a whole lease duration later.
//! - `leaseTransitions` counts handovers (+1 whenever an identity other than the last holder
//!   acquires it).
//!
//! Time: `Clock::now` only for the timestamps written into the Lease; every duration is
//! measured with `Clock::monotonic` and waited on tokio's timers (`sleep_until`, `timeout_at`),
//! the same clock outside tests and a paused runtime's virtual clock in them.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use signet_runtime::clock::Clock;
use tokio::time::Instant;

/// The Lease's name in deploy/bridge.yaml (`--lease-name`).
pub const DEFAULT_LEASE_NAME: &str = "signet-k8s-leader";

/// What the election is about and how fast it moves (client-go's `LeaderElectionConfig`).
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// The Lease's namespace (the bridge's own).
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity, unique among the replicas (the pod name).
    pub identity: String,
    /// How long a follower waits, after it last saw the record change, before taking over.
    pub lease_duration: Duration,
    /// How long a leader keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// How often a follower tries to acquire and a leader renews.
    pub retry_period: Duration,
}

/// A configuration that cannot give one leader.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "the leader election identity is empty: set POD_NAME (the downward API's metadata.name)"
    )]
    NoIdentity,
    #[error("--lease-name is empty")]
    NoName,
    #[error(
        "--lease-duration ({lease:?}) must be longer than --renew-deadline ({renew:?}): a leader must stop before a follower may take over"
    )]
    DeadlineNotBeforeExpiry { lease: Duration, renew: Duration },
    #[error(
        "--renew-deadline ({renew:?}) must be longer than --retry-period ({retry:?}): a leader must get more than one try to renew"
    )]
    RetryNotBeforeDeadline { renew: Duration, retry: Duration },
    #[error("--lease-duration ({0:?}) must be whole seconds, at least 1s and at most 24h")]
    LeaseDuration(Duration),
    #[error("--retry-period must be at least 100ms")]
    RetryTooShort,
}

impl LeaseConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.identity.trim().is_empty() {
            return Err(ConfigError::NoIdentity);
        }
        if self.name.trim().is_empty() {
            return Err(ConfigError::NoName);
        }
        let d = self.lease_duration;
        if d.subsec_nanos() != 0 || d < Duration::from_secs(1) || d > Duration::from_secs(86_400) {
            return Err(ConfigError::LeaseDuration(d));
        }
        if self.renew_deadline >= d {
            return Err(ConfigError::DeadlineNotBeforeExpiry {
                lease: d,
                renew: self.renew_deadline,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(ConfigError::RetryNotBeforeDeadline {
                renew: self.renew_deadline,
                retry: self.retry_period,
            });
        }
        if self.retry_period < Duration::from_millis(100) {
            return Err(ConfigError::RetryTooShort);
        }
        Ok(())
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// Why a leader stopped acting.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "lost the Lease {namespace}/{name}: not renewed within --renew-deadline ({deadline:?}); every controller was stopped, restart to follow"
    )]
    Lost {
        namespace: String,
        name: String,
        deadline: Duration,
    },
    #[error(
        "the Lease {namespace}/{name} is now held by {holder:?}; every controller was stopped, restart to follow"
    )]
    Taken {
        namespace: String,
        name: String,
        holder: String,
    },
}

/// How [`Elector::run_while_leading`] ended without losing the Lease.
#[derive(Debug)]
pub enum Outcome<T> {
    /// The work ended on its own while this replica led (the Lease was then released).
    Finished(T),
    /// Shutdown while leading: the work was dropped, then the Lease released.
    ShutdownWhileLeading,
    /// Shutdown before this replica ever led: nothing ran.
    ShutdownWhileFollowing,
}

/// The election's metrics (registered by [`crate::metrics::Metrics`]); clones share them.
#[derive(Clone, Debug, Default)]
pub struct LeaderMetrics {
    /// `signet_k8s_leader{identity}`: 1 while this replica leads, else 0.
    pub leader: Family<Vec<(&'static str, String)>, Gauge>,
    /// `signet_k8s_leader_transitions_total`: times this replica became the leader.
    pub transitions: Counter,
    /// `signet_k8s_lease_renew_failures_total`: renewals that failed (error, timeout, conflict).
    pub renew_failures: Counter,
}

impl LeaderMetrics {
    fn set_leader(&self, identity: &str, leading: bool) {
        self.leader
            .get_or_create(&vec![("identity", identity.to_owned())])
            .set(i64::from(leading));
    }
}

/// What a try at the Lease should do, from what was read (pure: [`decide`]).
#[derive(Debug, PartialEq)]
pub enum Step {
    /// No Lease: create it with this record.
    Create(LeaseSpec),
    /// Write this record over the one read (with its resourceVersion).
    Update(LeaseSpec),
    /// Another identity holds it and its record changed less than a lease duration ago.
    Held { holder: String },
}

/// The holder named by a record, if any (an empty string is none, as client-go reads it).
pub fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// client-go's `tryAcquireOrRenew` decision. `current` is the record read now (`None`: no
/// Lease); `observed_at` is when this replica first saw that exact record (local monotonic
/// time), `now` the monotonic time now, `wall` the wall time to write. The holder's own
/// timestamps are never compared with the local clock.
pub fn decide(
    current: Option<&LeaseSpec>,
    observed_at: Instant,
    now: Instant,
    wall: SystemTime,
    cfg: &LeaseConfig,
) -> Step {
    let stamp = micro_time(wall);
    let fresh = |transitions: i32, acquire: Option<MicroTime>| LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(cfg.lease_seconds()),
        acquire_time: acquire.or_else(|| Some(stamp.clone())),
        renew_time: Some(stamp.clone()),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let Some(spec) = current else {
        return Step::Create(fresh(0, None));
    };
    let transitions = spec.lease_transitions.unwrap_or(0);
    match holder(spec) {
        Some(h) if h == cfg.identity => Step::Update(LeaseSpec {
            preferred_holder: spec.preferred_holder.clone(),
            strategy: spec.strategy.clone(),
            ..fresh(transitions, spec.acquire_time.clone())
        }),
        Some(h) => {
            let seconds = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
            let expires = observed_at.checked_add(Duration::from_secs(seconds));
            if expires.is_none_or(|e| e > now) {
                Step::Held {
                    holder: h.to_owned(),
                }
            } else {
                Step::Update(fresh(transitions.saturating_add(1), None))
            }
        }
        None => Step::Update(fresh(transitions.saturating_add(1), None)),
    }
}

/// The record a leader writes when it lets go: no holder, a one-second duration.
pub fn released(spec: &LeaseSpec, wall: SystemTime) -> LeaseSpec {
    let stamp = micro_time(wall);
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(stamp.clone()),
        renew_time: Some(stamp),
        lease_transitions: spec.lease_transitions,
        ..LeaseSpec::default()
    }
}

fn micro_time(t: SystemTime) -> MicroTime {
    MicroTime(
        k8s_openapi::jiff::Timestamp::try_from(t)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    clock: Arc<dyn Clock>,
    metrics: LeaderMetrics,
    /// The record last seen and when it was first seen (client-go's observedRecord/Time).
    observed: Option<(LeaseSpec, Instant)>,
}

/// The result of one try at the Lease.
#[derive(Debug, PartialEq, Eq)]
enum Try {
    Leading,
    /// Another identity holds it (or won the write).
    Follower(Option<String>),
}

impl Elector {
    /// An elector for `cfg` (checked here) on `client`'s API server.
    pub fn new(
        client: Client,
        cfg: LeaseConfig,
        clock: Arc<dyn Clock>,
        metrics: LeaderMetrics,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        metrics.set_leader(&cfg.identity, false);
        Ok(Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            clock,
            metrics,
            observed: None,
        })
    }

    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    /// Waits until this replica holds the Lease, then runs `work` for as long as it keeps it.
    /// `work` is not polled before leadership and is dropped when leadership is lost (the
    /// error) or on `shutdown` (then the Lease is released). A follower's `shutdown` returns
    /// at once, nothing having run.
    pub async fn run_while_leading<T>(
        mut self,
        shutdown: impl Future<Output = ()>,
        work: impl Future<Output = T>,
    ) -> Result<Outcome<T>, LeaderError> {
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(
            lease = %self.cfg.name,
            namespace = %self.cfg.namespace,
            identity = %self.cfg.identity,
            "waiting for the leader election Lease"
        );
        let renewed_at = loop {
            let started = self.clock.monotonic();
            let attempt = tokio::time::timeout_at(
                started + self.cfg.renew_deadline,
                self.try_acquire_or_renew(),
            );
            tokio::select! {
                r = attempt => match r {
                    Ok(Ok(Try::Leading)) => break started,
                    Ok(Ok(Try::Follower(_))) => {}
                    Ok(Err(e)) => tracing::warn!(lease = %self.cfg.name, error = %e, "cannot read or write the leader election Lease"),
                    Err(_) => tracing::warn!(lease = %self.cfg.name, "the leader election Lease did not answer in time"),
                },
                () = &mut shutdown => return Ok(Outcome::ShutdownWhileFollowing),
            }
            tokio::select! {
                () = tokio::time::sleep_until(self.clock.monotonic() + self.cfg.retry_period) => {}
                () = &mut shutdown => return Ok(Outcome::ShutdownWhileFollowing),
            }
        };
        self.metrics.transitions.inc();
        self.metrics.set_leader(&self.cfg.identity, true);
        tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "leading: controllers start");

        let mut work = Box::pin(work);
        enum End<T> {
            Done(T),
            Shutdown,
            Lost(LeaderError),
        }
        let end = tokio::select! {
            out = &mut work => End::Done(out),
            () = &mut shutdown => End::Shutdown,
            e = self.keep_leading(renewed_at) => End::Lost(e),
        };
        // Stop acting before anything else: nothing of the work runs after this line.
        drop(work);
        self.metrics.set_leader(&self.cfg.identity, false);
        match end {
            End::Lost(e) => {
                tracing::error!(error = %e, "stopped leading");
                Err(e)
            }
            End::Done(out) => {
                self.release_bounded().await;
                Ok(Outcome::Finished(out))
            }
            End::Shutdown => {
                self.release_bounded().await;
                Ok(Outcome::ShutdownWhileLeading)
            }
        }
    }

    /// Renews every retry period; returns (never before) when leadership is lost or in doubt:
    /// another holder, or no success within the renew deadline.
    async fn keep_leading(&mut self, mut renewed_at: Instant) -> LeaderError {
        loop {
            let deadline = renewed_at + self.cfg.renew_deadline;
            let next = (self.clock.monotonic() + self.cfg.retry_period).min(deadline);
            tokio::time::sleep_until(next).await;
            let started = self.clock.monotonic();
            if started >= deadline {
                return self.lost();
            }
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(Try::Leading)) => renewed_at = started,
                Ok(Ok(Try::Follower(holder))) => {
                    self.metrics.renew_failures.inc();
                    if let Some(holder) = holder {
                        return LeaderError::Taken {
                            namespace: self.cfg.namespace.clone(),
                            name: self.cfg.name.clone(),
                            holder,
                        };
                    }
                    tracing::warn!(lease = %self.cfg.name, "renewing the Lease conflicted; retrying");
                }
                Ok(Err(e)) => {
                    self.metrics.renew_failures.inc();
                    tracing::warn!(lease = %self.cfg.name, error = %e, "cannot renew the leader election Lease");
                }
                Err(_) => {
                    self.metrics.renew_failures.inc();
                    return self.lost();
                }
            }
        }
    }

    fn lost(&self) -> LeaderError {
        LeaderError::Lost {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            deadline: self.cfg.renew_deadline,
        }
    }

    /// One round of client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> Result<Try, kube::Error> {
        let current = self.api.get_opt(&self.cfg.name).await?;
        let now = self.clock.monotonic();
        let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        if let Some(spec) = &spec
            && self.observed.as_ref().is_none_or(|(seen, _)| seen != spec)
        {
            self.observed = Some((spec.clone(), now));
        }
        let observed_at = self.observed.as_ref().map_or(now, |(_, at)| *at);
        let step = decide(spec.as_ref(), observed_at, now, self.clock.now(), &self.cfg);
        let written = match step {
            Step::Held { holder } => return Ok(Try::Follower(Some(holder))),
            Step::Create(spec) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Step::Update(spec) => {
                // `current` is Some here: decide() updates only a Lease it read.
                let mut lease = current.unwrap_or_default();
                lease.spec = Some(spec);
                self.api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(lease) => {
                self.observed = Some((lease.spec.unwrap_or_default(), self.clock.monotonic()));
                Ok(Try::Leading)
            }
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => {
                Ok(Try::Follower(None))
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the Lease if this replica still holds it, bounded by the renew deadline.
    async fn release_bounded(&mut self) {
        match tokio::time::timeout(self.cfg.renew_deadline, self.release()).await {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.cfg.name, "released the leader election Lease")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.cfg.name, error = %e, "cannot release the Lease; the other replica takes over when it expires")
            }
            Err(_) => {
                tracing::warn!(lease = %self.cfg.name, "releasing the Lease timed out; the other replica takes over when it expires")
            }
        }
    }

    async fn release(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if holder(&spec) != Some(self.cfg.identity.as_str()) {
            return Ok(false);
        }
        lease.spec = Some(released(&spec, self.clock.now()));
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
