//! The request context: what the request layer knows about the request being handled (its
//! TCP peer), kept in a task-local for the handler's duration, and the source key by which
//! rate limits and the audit log's flood folding group peers. A leaf: it imports nothing from
//! the crate, so lower layers (the audit log) may read it without depending on the limits.

use std::net::{IpAddr, SocketAddr};

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

/// The rate-limit key of a source address: IPv4 as is (IPv4-mapped IPv6 too), IPv6 by its /64,
/// since one host or customer usually holds a whole /64.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}
