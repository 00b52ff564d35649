//! `signet-runtime`: what every Signet binary does the same way.
//!
//! - [`telemetry`]: logs (text or JSON) and OpenTelemetry traces exported over OTLP/gRPC when
//!   `[telemetry] otlp_endpoint` is set; the gRPC server layer that opens one span per call
//!   and continues the caller's W3C trace; trace-context injection for outgoing calls.
//! - [`shutdown`]: the SIGTERM / ctrl-c future.
//! - [`config`]: layered configuration (defaults, TOML file, environment, flags), unknown
//!   keys refused by name.
//! - [`http`]: the small HTTP listener each binary runs for `/healthz`, `/readyz` and
//!   `/metrics`, bounded like every other listener (a connection cap, a header-read timeout and
//!   a connection lifetime), so a port scanner or a half-sent request cannot hold it.
//! - [`clock`]: the one `Clock` (system, fake and tokio clocks), saturating conversions between
//!   `SystemTime` and Unix seconds, and the one `sleep`.
//! - [`backoff`]: capped exponential backoff with a jitter choice (full, equal, ±spread) and the
//!   `Retry` state a retried step keeps.
//! - [`random`]: one randomness trait (`SystemRandom` on ring; fixed and seeded sources for
//!   tests).
#![forbid(unsafe_code)]

pub mod backoff;
pub mod clock;
pub mod config;
pub mod http;
pub mod random;
pub mod shutdown;
pub mod telemetry;
