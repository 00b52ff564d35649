//! What the loop learns of the server from each answer, recorded for `/readyz`
//! ([`crate::readiness`]), the logs and the metrics: whether it answers, and whether it
//! refuses this node as banned.
//!
//! Invariant: a ban is logged once when it starts (an error naming the node and the
//! `signetctl node unban` that lifts it) and once when it ends; the refused retries in between
//! log at debug only, and are spaced by [`crate::ca::BANNED_RETRY`] (the refusal's
//! `retry_after`).

use super::Driver;
use crate::ca::CaError;
use crate::node::NodeIdentity;
use crate::readiness::ban_message;

impl Driver {
    /// The server failed or refused a call of `node` (None: before there is one) with `e`.
    /// Returns whether it refused the node as banned.
    pub(super) fn server_failed(&mut self, e: &CaError, node: Option<&NodeIdentity>) -> bool {
        let now = self.clock.now();
        if e.is_banned() {
            let id = e
                .banned_node_id()
                .map(str::to_owned)
                .or_else(|| {
                    node.and_then(|n| {
                        signet_types::node::node_id_of(n.spiffe_id(), n.spiffe_id().trust_domain())
                            .map(str::to_owned)
                    })
                })
                .unwrap_or_else(|| "<node id>".to_owned());
            if self.banned.as_deref() != Some(id.as_str()) {
                tracing::error!(node_id = %id, error = %e, retry_every = ?crate::ca::BANNED_RETRY, "{}", ban_message(&id));
                self.banned = Some(id.clone());
                self.cache.banned_since = Some(now);
            }
            if let Some(r) = &self.ready {
                r.banned(&id, self.cache.banned_since.unwrap_or(now));
                r.server_reached();
            }
            if let Some(m) = &self.metrics {
                m.node_banned.set(1);
            }
            return true;
        }
        if e.is_unreachable()
            && let Some(r) = &self.ready
        {
            r.server_unreachable(now, &e.to_string());
        }
        false
    }

    /// The server answered a call of the node (not as banned).
    pub(super) fn server_answered(&mut self) {
        if let Some(r) = &self.ready {
            r.server_reached();
            r.not_banned();
        }
        if let Some(id) = self.banned.take() {
            self.cache.banned_since = None;
            tracing::info!(node_id = %id, "the server no longer refuses node {id} as banned");
            if let Some(m) = &self.metrics {
                m.node_banned.set(0);
            }
        }
    }
}
