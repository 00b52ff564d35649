//! The request context: what the request layer knows about the request being handled (its
//! TCP peer), kept in a task-local for the handler's duration, and the source key by which
//! rate limits and the audit log's flood folding group peers. A leaf: it imports nothing from
//! the crate, so lower layers (the audit log) may read it without depending on the limits.

use std::net::SocketAddr;

/// What the request layer knows about the request being handled.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestContext {
    /// The TCP peer of the gRPC connection.
    pub peer: Option<SocketAddr>,
}

tokio::task_local! {
    pub(crate) static CONTEXT: RequestContext;
}

/// The current request's context (outside a request: empty).
pub fn current() -> RequestContext {
    CONTEXT.try_with(|c| *c).unwrap_or_default()
}

/// The rate-limit key of a source address: IPv4 as is (IPv4-mapped IPv6 too), IPv6 by its /64
/// (see [`signet_runtime::source`] for why).
pub use signet_runtime::source::source_key;
