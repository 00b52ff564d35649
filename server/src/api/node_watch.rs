//! `signet.agent.v1.Node/WatchEntries`: the server-push stream that tells a node its entry
//! revision changed, so its agent syncs at once instead of at its next poll.
//!
//! The handler (`api::node`) authenticates and authorizes exactly as `SyncEntries` (mTLS node
//! SVID, node known and not banned) and hands the node's own parent ID to [`watch`]; the stream
//! can only ever speak of that parent. What it sends, and when:
//! - the parent's revision at once;
//! - the revision again after a change notification ([`crate::store::entry_events`]), read
//!   back from the store after a short coalescing pause (a burst of writes gives one message),
//!   and only if it differs from the last one sent;
//! - the revision every `keepalive`, changed or not: it keeps idle connections and proxies
//!   alive, lets the node notice a dead stream, and is the server side's safety net for a
//!   notification that never came (the agent's slow poll is the other);
//! - before each keep-alive the node is looked up again: a node banned meanwhile gets
//!   PermissionDenied and the stream ends.
//!
//! The stream ends with OK after `max_lifetime` (the node reconnects, and is authenticated
//! again, so an expired or revoked node SVID cannot keep a stream forever), or at shutdown.
//!
//! Why a "changed, sync now" tick and not the changes themselves: `SyncEntries` stays the one
//! way a node gets its entry set, by revision; a tick that is lost, late, duplicated or
//! coalesced only makes a node sync once more or a little later, never hold a partial or
//! reordered set. Bounded by construction: the stream is pulled (`unfold`), so nothing is
//! queued for a slow consumer; each stream holds one subscription slot, and a node may hold
//! at most `per_node` on one replica (the server-wide cap is the limits layer's
//! `max_watch_streams`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use signet_proto::agent::EntriesChanged;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::Status;

use super::ApiError;
use crate::attestation::node_refusal;
use crate::store::{EntrySubscription, NodeStore};

/// The limits of the entry streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLimits {
    /// Most open streams per node on one replica (an agent holds one; a restart overlaps).
    pub per_node: usize,
    /// How often an unchanged revision is sent again.
    pub keepalive: Duration,
    /// How long one stream lives before the node must reconnect.
    pub max_lifetime: Duration,
    /// How long after a notification the revision is read (collapsing a burst of writes).
    pub coalesce: Duration,
}

impl Default for WatchLimits {
    fn default() -> Self {
        Self {
            per_node: 4,
            keepalive: Duration::from_secs(15),
            max_lifetime: Duration::from_secs(600),
            coalesce: Duration::from_millis(50),
        }
    }
}

pub type EntryStream = Pin<Box<dyn Stream<Item = Result<EntriesChanged, Status>> + Send>>;

struct State {
    store: Arc<dyn NodeStore>,
    parent: String,
    node_id: String,
    sub: EntrySubscription,
    limits: WatchLimits,
    /// The last revision sent; None before the first message.
    last: Option<u64>,
    keepalive: tokio::time::Interval,
    deadline: Instant,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
    done: bool,
}

enum Wake {
    Changed,
    Keepalive,
    End,
}

/// The stream of `parent`'s revisions for the authenticated node `node_id`.
pub fn watch(
    store: Arc<dyn NodeStore>,
    parent: String,
    node_id: String,
    limits: WatchLimits,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
) -> Result<EntryStream, ApiError> {
    let sub = store
        .entry_events()
        .subscribe(&parent, limits.per_node)
        .map_err(|e| ApiError::ResourceExhausted {
            message: format!(
                "node {node_id} already has {} entry streams open on this server; close one",
                e.limit
            ),
            retry_after: limits.keepalive,
        })?;
    let now = Instant::now();
    let mut keepalive = tokio::time::interval_at(now + limits.keepalive, limits.keepalive);
    keepalive.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let state = State {
        store,
        parent,
        node_id,
        sub,
        limits,
        last: None,
        keepalive,
        deadline: now + limits.max_lifetime,
        stop,
        done: false,
    };
    Ok(Box::pin(futures::stream::unfold(
        state,
        |mut st| async move {
            let item = st.next().await?;
            Some((item, st))
        },
    )))
}

/// Resolves when the server shuts down (never without a shutdown signal).
async fn stopped(stop: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    match stop {
        Some(rx) => {
            let _ = rx.wait_for(|s| *s).await;
        }
        None => std::future::pending().await,
    }
}

impl State {
    async fn next(&mut self) -> Option<Result<EntriesChanged, Status>> {
        if self.done {
            return None;
        }
        if self.last.is_none() {
            return Some(self.send_current().await);
        }
        loop {
            let wake = tokio::select! {
                () = self.sub.changed() => Wake::Changed,
                _ = self.keepalive.tick() => Wake::Keepalive,
                () = tokio::time::sleep_until(self.deadline) => Wake::End,
                () = stopped(&mut self.stop) => Wake::End,
            };
            match wake {
                Wake::End => return None,
                Wake::Changed => {
                    tokio::time::sleep(self.limits.coalesce).await;
                    // Whatever was notified until now is covered by the read below.
                    self.sub.mark_seen();
                    match self.store.entry_revision(&self.parent).await {
                        Ok(rev) if Some(rev) == self.last => continue,
                        Ok(rev) => return Some(Ok(self.sent(rev))),
                        Err(e) => return Some(Err(self.fail(e.into()))),
                    }
                }
                Wake::Keepalive => {
                    let node = match self.store.node(&self.node_id).await {
                        Ok(n) => n,
                        Err(e) => return Some(Err(self.fail(e.into()))),
                    };
                    if let Some(msg) = node_refusal(&self.node_id, node.as_ref(), true) {
                        return Some(Err(self.fail(ApiError::PermissionDenied(msg))));
                    }
                    return Some(self.send_current().await);
                }
            }
        }
    }

    async fn send_current(&mut self) -> Result<EntriesChanged, Status> {
        match self.store.entry_revision(&self.parent).await {
            Ok(rev) => Ok(self.sent(rev)),
            Err(e) => Err(self.fail(e.into())),
        }
    }

    fn sent(&mut self, revision: u64) -> EntriesChanged {
        self.last = Some(revision);
        EntriesChanged { revision }
    }

    /// The stream's last item: an error, then the end.
    fn fail(&mut self, e: ApiError) -> Status {
        self.done = true;
        Status::from(e)
    }
}
