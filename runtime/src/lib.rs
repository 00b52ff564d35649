//! `signet-runtime`: what every Signet binary does the same way.
//!
//! - [`http`]: the small HTTP listener each binary runs for `/healthz`, `/readyz` and
//!   `/metrics`, bounded like every other listener (a connection cap, a header-read timeout and
//!   a connection lifetime), so a port scanner or a half-sent request cannot hold it.
//!
//! Tracing set-up, the shutdown signal, layered configuration, the clock and backoff are to
//! follow here (ARCHITECTURE.md); today each binary still has its own.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod clock;
pub mod http;
pub mod random;
