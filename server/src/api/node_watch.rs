//! `signet.agent.v1.Node/WatchEntries`: the server-push stream that tells a node its entry
//! revision changed, so its agent syncs at once instead of at its next poll.
//!
//! The handler (`api::node`) authenticates and authorizes exactly as `SyncEntries` (mTLS node
//! SVID, node known and not banned) and hands the node's own parent ID to [`watch`]; the stream
//! can only ever speak of that node. What it sends, and when:
//! - the node's effective revision at once: the highest of its own parent's and those of the
//!   node sets it is a member of as the store's rows say at that read (the node row, the sets
//!   once, then one revision read: `crate::node_sets::parents_of`); a node banned meanwhile
//!   gets PermissionDenied at that read;
//! - the revision again after a change notification of its own parent or of any node set
//!   ([`crate::store::entry_events`]), read
//!   back from the store after a short coalescing pause (a burst of writes gives one message),
//!   and only if it differs from the last one sent;
//! - the revision every `keepalive` (`nodes.watch.keepalive`, 15 s), changed or not: it keeps
//!   idle connections and proxies alive, lets the node notice a dead stream, and is the server
//!   side's safety net for a notification that never came (the agent's slow poll is the other);
//! - the node is looked up again at every read: a node banned meanwhile gets
//!   PermissionDenied (at the latest at the next keep-alive) and the stream ends.
//!
//! The stream ends with OK after `max_lifetime` (`nodes.watch.max_lifetime`, 10 min: the node
//! reconnects, and is authenticated again, so an expired or revoked node SVID cannot keep a
//! stream forever), or at shutdown.
//!
//! Why a "changed, sync now" tick and not the changes themselves: `SyncEntries` stays the one
//! way a node gets its entry set, by revision; a tick that is lost, late, duplicated or
//! coalesced only makes a node sync once more or a little later, never hold a partial or
//! reordered set. Bounded by construction: the stream is pulled (`unfold`), so nothing is
//! queued for a slow consumer; each stream holds one subscription slot, and a node may hold
//! at most `per_node` (`nodes.watch.streams_per_node`, 4) on one replica, the next one
//! refused with ResourceExhausted naming that limit (the server-wide cap is the limits layer's
//! `max_watch_streams`). The limits are `[nodes.watch]` (`config::NodesWatchConfig`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use signet_proto::agent::EntriesChanged;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::Status;

use signet_types::{SpiffeId, TrustDomain};

use super::ApiError;
use crate::attestation::node_refusal;
use crate::config::NodesWatchConfig;
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

/// How long after a notification the revision is read: not a setting (it only trades a few
/// milliseconds of latency for one read per burst).
const COALESCE: Duration = Duration::from_millis(50);

impl From<&NodesWatchConfig> for WatchLimits {
    fn from(c: &NodesWatchConfig) -> Self {
        Self {
            per_node: c.streams_per_node,
            keepalive: c.keepalive,
            max_lifetime: c.max_lifetime,
            coalesce: COALESCE,
        }
    }
}

impl Default for WatchLimits {
    /// `[nodes.watch]`'s defaults: 4 streams per node, a 15 s keep-alive, a 10 min lifetime.
    fn default() -> Self {
        Self::from(&NodesWatchConfig::default())
    }
}

pub type EntryStream = Pin<Box<dyn Stream<Item = Result<EntriesChanged, Status>> + Send>>;

struct State {
    store: Arc<dyn NodeStore>,
    /// The trust domain node set IDs are made in (the node's own).
    td: TrustDomain,
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

/// The stream of `parent`'s revisions for the authenticated node `node_id`, opened `now` (the
/// keep-alives and the lifetime count from there).
pub fn watch(
    store: Arc<dyn NodeStore>,
    parent: String,
    node_id: String,
    limits: WatchLimits,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
    now: Instant,
) -> Result<EntryStream, ApiError> {
    let sub = store
        .entry_events()
        .subscribe(&parent, limits.per_node)
        .map_err(|_| ApiError::ResourceExhausted {
            message: format!(
                "node {node_id} already has {} entry streams open on this server, the limit \
                 (nodes.watch.streams_per_node); close one or retry later",
                limits.per_node
            ),
            retry_after: limits.keepalive,
        })?;
    let td = parent
        .parse::<SpiffeId>()
        .map_err(|_| ApiError::Internal(format!("node {node_id}: unreadable SPIFFE ID")))?
        .trust_domain()
        .clone();
    let mut keepalive = tokio::time::interval_at(now + limits.keepalive, limits.keepalive);
    keepalive.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let state = State {
        store,
        td,
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
                    match self.effective_revision().await {
                        Ok(rev) if Some(rev) == self.last => continue,
                        Ok(rev) => return Some(Ok(self.sent(rev))),
                        Err(e) => return Some(Err(self.fail(e))),
                    }
                }
                Wake::Keepalive => return Some(self.send_current().await),
            }
        }
    }

    async fn send_current(&mut self) -> Result<EntriesChanged, Status> {
        match self.effective_revision().await {
            Ok(rev) => Ok(self.sent(rev)),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The node's effective revision now: its row (refused if banned or gone), the node sets
    /// (one read), the highest revision of its parents (one read).
    async fn effective_revision(&self) -> Result<u64, ApiError> {
        let node = self.store.node(&self.node_id).await?;
        if let Some(msg) = node_refusal(&self.node_id, node.as_ref(), true) {
            return Err(ApiError::PermissionDenied(msg));
        }
        let Some(node) = node else {
            return Err(ApiError::Internal(self.node_id.clone()));
        };
        let sets = self.store.list_node_sets().await?;
        let parents = crate::node_sets::parents_of(&self.td, &node, &sets);
        let parents: Vec<&str> = parents.iter().map(String::as_str).collect();
        Ok(self.store.entry_revision_of(&parents).await?)
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

#[cfg(test)]
mod tests {
    //! The stream against a fake store under paused time: every wait below is a timer the
    //! runtime advances at once, so `Instant::now()` tells exactly when a message came.
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use futures::StreamExt;

    use super::*;
    use crate::store::entry_events::EntryEvents;
    use crate::store::nodes::EntrySync;
    use crate::store::{
        BatchCreate, EntryCreate, EntryRow, NewEntry, NodeRow, NodeSetRow, StoreError, TokenUse,
    };

    const PARENT: &str = "spiffe://example.org/signet/node/n1";
    const SET: &str = "spiffe://example.org/signet/nodeset/vms";

    /// What a stream reads: one node ("n1", attested with a join token), its parent's
    /// revision, whether it is banned, and the node sets (their entries' revision is
    /// `set_revision`).
    struct Fake {
        events: EntryEvents,
        revision: Mutex<u64>,
        banned: Mutex<bool>,
        sets: Mutex<Vec<NodeSetRow>>,
        set_revision: Mutex<u64>,
    }

    impl Fake {
        fn new(revision: u64) -> Arc<Self> {
            Arc::new(Self {
                events: EntryEvents::local(),
                revision: Mutex::new(revision),
                banned: Mutex::new(false),
                sets: Mutex::new(Vec::new()),
                set_revision: Mutex::new(0),
            })
        }

        fn change(&self, revision: u64) {
            *self.revision.lock().unwrap() = revision;
            self.events.notify(PARENT);
        }

        /// A change to the entries of node set `vms`.
        fn change_set(&self, revision: u64) {
            *self.set_revision.lock().unwrap() = revision;
            self.events.notify(SET);
        }
    }

    #[async_trait::async_trait]
    impl crate::store::NodeSetStore for Fake {
        async fn create_node_set(&self, _: &NodeSetRow) -> Result<bool, StoreError> {
            Err(not_here())
        }
        async fn list_node_sets(&self) -> Result<Vec<NodeSetRow>, StoreError> {
            Ok(self.sets.lock().unwrap().clone())
        }
        async fn node_set(&self, _: &str) -> Result<Option<NodeSetRow>, StoreError> {
            Err(not_here())
        }
        async fn delete_node_set(
            &self,
            _: &str,
            _: &str,
        ) -> Result<crate::store::NodeSetDelete, StoreError> {
            Err(not_here())
        }
        async fn entry_counts(
            &self,
            _: &[&str],
        ) -> Result<std::collections::HashMap<String, u64>, StoreError> {
            Err(not_here())
        }
    }

    fn not_here() -> StoreError {
        StoreError::Database("not used by the entry stream".into())
    }

    #[async_trait::async_trait]
    impl crate::store::node_admin::NodeAdminStore for Fake {
        async fn join_tokens(
            &self,
            _: Option<&str>,
        ) -> Result<Vec<crate::store::JoinTokenRow>, StoreError> {
            Err(not_here())
        }
        async fn revoke_join_token(
            &self,
            _: &str,
        ) -> Result<crate::store::TokenRevoke, StoreError> {
            Err(not_here())
        }
        async fn unban_node(&self, _: &str) -> Result<Option<NodeRow>, StoreError> {
            Err(not_here())
        }
        async fn delete_node(
            &self,
            _: &str,
            _: bool,
        ) -> Result<crate::store::NodeDelete, StoreError> {
            Err(not_here())
        }
        async fn update_entry(
            &self,
            _: &crate::store::NewEntry,
            _: u64,
        ) -> Result<crate::store::EntryUpdate, StoreError> {
            Err(not_here())
        }
    }

    #[async_trait::async_trait]
    impl NodeStore for Fake {
        async fn create_join_token(
            &self,
            _: &str,
            _: &str,
            _: i64,
            _: i64,
        ) -> Result<(), StoreError> {
            Err(not_here())
        }
        async fn consume_join_token(&self, _: &str, _: i64) -> Result<TokenUse, StoreError> {
            Err(not_here())
        }
        async fn release_join_token(&self, _: &str, _: i64) -> Result<bool, StoreError> {
            Err(not_here())
        }
        async fn upsert_attested_node(&self, _: &NodeRow) -> Result<(), StoreError> {
            Err(not_here())
        }
        async fn update_node_certificate(
            &self,
            _: &str,
            _: &str,
            _: i64,
        ) -> Result<(), StoreError> {
            Err(not_here())
        }
        async fn node(&self, node_id: &str) -> Result<Option<NodeRow>, StoreError> {
            Ok((node_id == "n1").then(|| NodeRow {
                node_id: "n1".into(),
                spiffe_id: PARENT.into(),
                attested_at: 0,
                banned_at: self.banned.lock().unwrap().then_some(1),
                last_serial: "01".into(),
                not_after: i64::MAX,
                attestation: "join_token".into(),
                selectors: crate::node_sets::join_token_selectors("n1"),
            }))
        }
        async fn list_nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
            Err(not_here())
        }
        async fn ban_node(&self, _: &str, _: i64) -> Result<Option<NodeRow>, StoreError> {
            Err(not_here())
        }
        async fn create_entry(&self, _: &NewEntry) -> Result<EntryCreate, StoreError> {
            Err(not_here())
        }
        async fn create_entries(&self, _: &[NewEntry]) -> Result<BatchCreate, StoreError> {
            Err(not_here())
        }
        async fn entry(&self, _: &str) -> Result<Option<EntryRow>, StoreError> {
            Err(not_here())
        }
        async fn entries_by_id(&self, _: &[&str]) -> Result<Vec<EntryRow>, StoreError> {
            Err(not_here())
        }
        async fn list_entries(&self, _: Option<&str>) -> Result<Vec<EntryRow>, StoreError> {
            Err(not_here())
        }
        async fn delete_entry(&self, _: &str) -> Result<bool, StoreError> {
            Err(not_here())
        }
        async fn replace_entry_selectors(
            &self,
            _: &str,
            _: &[String],
            _: &[String],
        ) -> Result<bool, StoreError> {
            Err(not_here())
        }
        fn entry_events(&self) -> EntryEvents {
            self.events.clone()
        }
        async fn entry_revision_of(&self, parents: &[&str]) -> Result<u64, StoreError> {
            let mut max = 0;
            for p in parents {
                max = max.max(match *p {
                    PARENT => *self.revision.lock().unwrap(),
                    SET => *self.set_revision.lock().unwrap(),
                    other => panic!("a stream reads only its own parents, not {other}"),
                });
            }
            Ok(max)
        }
        async fn entries_for_parents_since(
            &self,
            _: &[&str],
            _: u64,
        ) -> Result<EntrySync, StoreError> {
            Err(not_here())
        }
    }

    fn open(store: &Arc<Fake>, limits: WatchLimits) -> Result<EntryStream, ApiError> {
        watch(
            store.clone(),
            PARENT.into(),
            "n1".into(),
            limits,
            None,
            crate::clock::monotonic(),
        )
    }

    async fn revision(s: &mut EntryStream) -> u64 {
        s.next()
            .await
            .expect("a message")
            .expect("a revision")
            .revision
    }

    #[tokio::test(start_paused = true)]
    async fn an_unchanged_revision_is_sent_again_at_each_keepalive() {
        let store = Fake::new(7);
        let mut s = open(&store, WatchLimits::default()).unwrap();
        let t0 = crate::clock::monotonic();
        assert_eq!(revision(&mut s).await, 7);
        assert_eq!(t0.elapsed(), Duration::ZERO);
        // Nothing changes: the same revision, every 15 s.
        assert_eq!(revision(&mut s).await, 7);
        assert_eq!(t0.elapsed(), Duration::from_secs(15));
        assert_eq!(revision(&mut s).await, 7);
        assert_eq!(t0.elapsed(), Duration::from_secs(30));
        // A change is pushed after the coalescing pause, not at the next keep-alive.
        store.change(8);
        assert_eq!(revision(&mut s).await, 8);
        assert_eq!(t0.elapsed(), Duration::from_secs(30) + COALESCE);
        // A notification that changed nothing sends nothing: the next message is the
        // keep-alive.
        store.change(8);
        assert_eq!(revision(&mut s).await, 8);
        assert_eq!(t0.elapsed(), Duration::from_secs(45));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_to_a_node_set_reaches_its_member_nodes_stream_at_once() {
        let store = Fake::new(5);
        let mut s = open(&store, WatchLimits::default()).unwrap();
        let t0 = crate::clock::monotonic();
        assert_eq!(revision(&mut s).await, 5);
        // A set the node is not a member of: its change is read, and nothing is sent.
        store.sets.lock().unwrap().push(NodeSetRow {
            name: "vms".into(),
            selectors: vec!["join_token:node_id:n2".into()],
            created_at: 0,
        });
        store.change_set(9);
        assert_eq!(revision(&mut s).await, 5);
        assert_eq!(t0.elapsed(), Duration::from_secs(15));
        // Now a member (the set matches its attestation): the set's change is pushed at once.
        store.sets.lock().unwrap()[0].selectors = vec!["signet:attestation:join_token".into()];
        store.change_set(10);
        assert_eq!(revision(&mut s).await, 10);
        assert_eq!(t0.elapsed(), Duration::from_secs(15) + COALESCE);
        // Its own later change is higher than the set's: the effective revision is the max.
        store.change(11);
        assert_eq!(revision(&mut s).await, 11);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_banned_while_its_stream_is_open_is_cut_at_the_next_keepalive() {
        let store = Fake::new(3);
        let mut s = open(&store, WatchLimits::default()).unwrap();
        let t0 = crate::clock::monotonic();
        assert_eq!(revision(&mut s).await, 3);
        tokio::time::sleep(Duration::from_secs(1)).await;
        *store.banned.lock().unwrap() = true;
        let err = s.next().await.expect("an answer").expect_err("refused");
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(
            err.message().contains("node n1 is banned"),
            "{}",
            err.message()
        );
        assert_eq!(t0.elapsed(), Duration::from_secs(15));
        // Then the stream ends, and its slot is free again.
        assert!(s.next().await.is_none());
        let again: Vec<EntryStream> = (0..4)
            .map(|_| open(&store, WatchLimits::default()).unwrap())
            .collect();
        assert_eq!(again.len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn the_stream_ends_at_its_max_lifetime() {
        let store = Fake::new(1);
        let limits = WatchLimits::from(&NodesWatchConfig {
            streams_per_node: 1,
            keepalive: Duration::from_secs(15),
            max_lifetime: Duration::from_secs(60),
        });
        let mut s = open(&store, limits).unwrap();
        let t0 = crate::clock::monotonic();
        let mut sent = 0;
        while let Some(m) = s.next().await {
            assert_eq!(m.unwrap().revision, 1);
            sent += 1;
        }
        // It ended with OK (no error) at exactly its lifetime: the first message, then the
        // keep-alives at 15, 30, 45 s (and perhaps the one due at 60 s itself).
        assert_eq!(t0.elapsed(), Duration::from_secs(60));
        assert!((4..=5).contains(&sent), "{sent} messages");
        // Its slot is free: the node's reconnect (here with a limit of one) is accepted.
        assert!(open(&store, limits).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_when_the_server_shuts_down() {
        let store = Fake::new(1);
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut s = watch(
            store.clone(),
            PARENT.into(),
            "n1".into(),
            WatchLimits::default(),
            Some(rx),
            crate::clock::monotonic(),
        )
        .unwrap();
        let t0 = crate::clock::monotonic();
        assert_eq!(revision(&mut s).await, 1);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            tx.send(true).unwrap();
        });
        assert!(s.next().await.is_none());
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn the_fifth_stream_of_a_node_is_refused_naming_the_limit() {
        let store = Fake::new(1);
        let limits = WatchLimits::default();
        let mut open_streams: Vec<EntryStream> =
            (0..4).map(|_| open(&store, limits).unwrap()).collect();
        let Err(refused) = open(&store, limits) else {
            panic!("a fifth stream was accepted")
        };
        let status = Status::from(refused);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("already has 4 entry streams")
                && status.message().contains("nodes.watch.streams_per_node"),
            "{}",
            status.message()
        );
        // With a retry hint: the keep-alive interval.
        assert_eq!(
            status.metadata().get("grpc-retry-pushback-ms").unwrap(),
            "15000"
        );
        // Another node's stream is not affected.
        let other = watch(
            store.clone(),
            "spiffe://example.org/signet/node/n2".into(),
            "n2".into(),
            limits,
            None,
            crate::clock::monotonic(),
        );
        assert!(other.is_ok());
        // Closing one frees a slot.
        open_streams.pop();
        assert!(open(&store, limits).is_ok());
    }
}
