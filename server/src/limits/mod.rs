//! Resource limits (`[limits]`): every listener, stream and queue is bounded and timed out.
//!
//! - [`conn`]: the gRPC listener's connection cap and per-connection idle timeout;
//! - [`context`]: the request context (its peer) and the source key, a leaf that the audit log
//!   may use without depending on the limits themselves;
//! - [`layer`]: server-wide caps on requests and long-lived streams, per-source rate limits on
//!   issuance and attestation, and the request context (the peer address);
//! - [`rate`]: the keyed token buckets behind every rate limit;
//! - [`source`]: per-source caps on connections and requests held at once;
//! - [`CallerLimits`]: the per-caller issuance limit, checked once the caller is authenticated.
//!
//! Every refusal is a ResourceExhausted status whose message says when to retry and whose
//! `grpc-retry-pushback-ms` metadata carries the same hint for machines (gRPC's retry
//! pushback). Nothing waits in a queue for a slot: excess is refused at once.

pub mod conn;
pub mod context;
pub mod layer;
pub mod rate;
pub mod source;

use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;

use crate::config::LimitsConfig;
use rate::{RateLimiter, human};

/// The metadata key of gRPC's retry pushback (milliseconds).
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

pub(crate) use context::CONTEXT;
pub use context::RequestContext;

/// A ResourceExhausted status with a retry hint, in the message and in
/// `grpc-retry-pushback-ms`.
pub fn resource_exhausted(message: String, retry_after: Duration) -> tonic::Status {
    let ms = retry_after.as_millis().clamp(1, u128::from(u32::MAX));
    let mut md = MetadataMap::new();
    if let Ok(v) = ms.to_string().parse() {
        md.insert(RETRY_PUSHBACK, v);
    }
    tonic::Status::with_metadata(tonic::Code::ResourceExhausted, message, md)
}

/// Why a caller was refused by a rate limit: what to tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    pub message: String,
    pub retry_after: Duration,
}

/// The rate-limit key of an authenticated caller asking for a certificate: its label
/// (`jwt:<id>`, `mtls:<id>`, …), narrowed to the pod for a pod-bound service-account token
/// (the replicas of one Deployment share a service account, not a budget) and to the workload
/// an impersonator asks for (a ztunnel asks for every pod on its node).
pub fn caller_key(caller: &crate::authn::AuthenticatedCaller, impersonate: Option<&str>) -> String {
    let mut key = caller.label();
    if let crate::authn::CallerKind::KubernetesServiceAccount { pod: Some(pod), .. } = caller.kind()
    {
        key.push_str(" pod ");
        key.push_str(pod);
    }
    if let Some(who) = impersonate {
        key.push_str(" for ");
        key.push_str(who);
    }
    key
}

/// The per-caller issuance limit (`limits.issuance_per_caller`), keyed by [`caller_key`].
#[derive(Debug)]
pub struct CallerLimits {
    issuance: RateLimiter<String>,
    attestation: RateLimiter<String>,
}

impl CallerLimits {
    pub fn new(cfg: &LimitsConfig) -> Self {
        Self {
            issuance: RateLimiter::new(cfg.issuance_per_caller, cfg.rate_limit_max_keys),
            attestation: RateLimiter::new(cfg.attestation_per_caller, cfg.rate_limit_max_keys),
        }
    }

    /// Takes one attestation for node `node_id` (Kubernetes node tokens; a join token attests
    /// once anyway).
    pub fn check_attestation(&self, node_id: &str, now: Instant) -> Result<(), Limited> {
        self.attestation
            .check(&node_id.to_owned(), now)
            .map_err(|wait| Limited {
                message: format!(
                    "node {node_id} attested more often than this server allows \
                     (limits.attestation_per_caller): retry in {}",
                    human(wait)
                ),
                retry_after: wait,
            })
    }

    /// Takes one issuance for `caller`, or says how long it must wait.
    pub fn check_issuance(&self, caller: &str, now: Instant) -> Result<(), Limited> {
        self.issuance
            .check(&caller.to_owned(), now)
            .map_err(|wait| Limited {
                message: format!(
                    "{caller} asked for certificates faster than this server allows \
                 (limits.issuance_per_caller): retry in {}",
                    human(wait)
                ),
                retry_after: wait,
            })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::context::current;
    use super::*;
    use crate::config::RateConfig;

    #[test]
    fn callers_are_limited_one_by_one() {
        let l = CallerLimits::new(&LimitsConfig {
            issuance_per_caller: RateConfig::new(1, 0.25),
            ..LimitsConfig::default()
        });
        let now = crate::clock::monotonic().into_std();
        l.check_issuance("jwt:spiffe://example.org/ns/a/sa/x", now)
            .unwrap();
        let e = l
            .check_issuance("jwt:spiffe://example.org/ns/a/sa/x", now)
            .unwrap_err();
        assert_eq!(e.retry_after, Duration::from_secs(4));
        assert!(e.message.contains("retry in 4.0s"), "{}", e.message);
        l.check_issuance("jwt:spiffe://example.org/ns/a/sa/y", now)
            .unwrap();
    }

    #[test]
    fn the_hint_is_in_the_metadata() {
        let s = resource_exhausted("slow down".into(), Duration::from_millis(1500));
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert_eq!(s.metadata().get(RETRY_PUSHBACK).unwrap(), "1500");
    }

    #[tokio::test]
    async fn the_context_is_scoped_to_the_request() {
        assert!(current().peer.is_none());
        let peer: std::net::SocketAddr = "192.0.2.9:7".parse().unwrap();
        let seen = CONTEXT
            .scope(RequestContext { peer: Some(peer) }, async {
                current().peer
            })
            .await;
        assert_eq!(seen, Some(peer));
    }
}
