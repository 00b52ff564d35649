//! Where what the rotator holds is served: the Workload API state and the sinks.
//!
//! The main loop ([`crate::driver`]) owns the [`Outlets`] and starts the sinks' workers
//! ([`Outlets::start_sinks`]); each pass of the rotator publishes through them what it holds
//! at that moment with the [`Trust`]'s roots and CRLs. Publishing never waits: the state is a
//! `watch` channel (sent only when it changed), and a sink is handed its delivery through its
//! worker's latest-wins inbox ([`crate::sinks::worker`]).

use std::sync::Arc;
use std::time::SystemTime;

use super::hold::Holdings;
use crate::sinks::Delivered;
use crate::sinks::worker::{SinkBinding, SinkSet, Telemetry};
use crate::state::{AgentState, StateSender};
use crate::trust::Trust;
use signet_runtime::clock::Clock;
use signet_runtime::random::Random;

pub struct Outlets {
    state: StateSender,
    /// Sinks not started yet.
    pending: Vec<SinkBinding>,
    /// The sinks' workers: handed the current SVIDs, never waited for.
    sinks: Option<SinkSet>,
}

impl Outlets {
    pub fn new(state: StateSender) -> Self {
        Self {
            state,
            pending: Vec::new(),
            sinks: None,
        }
    }

    /// What the Workload API is served now (what the cache saves).
    pub fn current(&self) -> crate::state::SharedState {
        self.state.borrow().clone()
    }

    /// A receiver of the published state (what `/readyz` judges).
    pub fn subscribe(&self) -> crate::state::StateReceiver {
        self.state.subscribe()
    }

    /// The sinks to start with [`Self::start_sinks`].
    pub fn with_sinks(mut self, sinks: Vec<SinkBinding>) -> Self {
        self.pending = sinks;
        self
    }

    /// Starts one worker per sink (none without sinks; once). Needs a Tokio runtime.
    pub fn start_sinks(
        &mut self,
        telemetry: Telemetry,
        clock: Arc<dyn Clock>,
        random: Arc<dyn Random>,
    ) {
        if self.sinks.is_some() || self.pending.is_empty() {
            return;
        }
        let bindings = std::mem::take(&mut self.pending);
        self.sinks = Some(SinkSet::start(bindings, telemetry, clock, random));
    }

    /// Serves what `held` holds at `now` with `trust`'s roots and CRLs: to the Workload API
    /// state (when it changed) and to every sink (the current certificate of its SPIFFE ID, or
    /// its removal per the deletion policy when there is none; see [`SinkSet::update`]).
    pub fn publish(&mut self, held: &Holdings, trust: &Trust, now: SystemTime) {
        let next = AgentState {
            identities: held.identities(trust.revocations(), now),
            bundle_der: trust.bundle_der().clone(),
            trust_domain_id: trust.trust_domain_id().to_owned(),
            crls_der: trust.crls_der().clone(),
            jwt_keys: trust.jwt_keys().clone(),
            jwt_tainted: trust.jwt_tainted().clone(),
            federated: trust.federated().clone(),
        };
        self.state.send_if_modified(|cur| {
            if **cur == next {
                false
            } else {
                *cur = Arc::new(next);
                true
            }
        });
        if let Some(set) = &mut self.sinks {
            let current = held.current(trust.revocations(), now);
            let (bundle, crls) = (trust.bundle_der(), trust.crls_der());
            let state = self.state.borrow().clone();
            set.update(|spiffe_id| {
                current.get(spiffe_id).map(|svid| {
                    // The union of the federates_with of the entries serving this SPIFFE ID.
                    let mine: Vec<_> = state
                        .identities
                        .iter()
                        .filter(|id| id.svid.spiffe_id() == spiffe_id)
                        .collect();
                    Delivered {
                        svid: Arc::clone(svid),
                        bundle_der: bundle.clone(),
                        crls_der: crls.clone(),
                        federated: state.federated_for(&mine).into_iter().cloned().collect(),
                    }
                })
            });
        }
    }
}
