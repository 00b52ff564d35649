//! `signet-runtime`: what every Signet binary does the same way.
//!
//! - [`telemetry`]: logs (text or JSON) and OpenTelemetry traces exported over OTLP/gRPC when
//!   `[telemetry] otlp_endpoint` is set; the gRPC server layer that opens one span per call
//!   and continues the caller's W3C trace; trace-context injection for outgoing calls.
//! - [`shutdown`]: the SIGTERM / ctrl-c future, and SIGHUP watched as a reload request.
//! - [`reload`]: what a SIGHUP reload reports (one log line per thing) and which configuration
//!   keys changed.
//! - [`config`]: layered configuration (defaults, TOML file, environment, flags), unknown
//!   keys refused by name.
//! - [`http`]: the small HTTP listeners each binary runs for `/healthz`, `/readyz` and
//!   `/metrics` (and the server's CRLs, checkpoints and SPIFFE bundle endpoint), bounded like
//!   every other listener (a connection cap, a per-source cap, header-read, idle and lifetime
//!   timeouts), and the separate probe listener that no other client can crowd out.
//! - [`source`]: what a source address is (IPv6: its /64) and the per-source counters behind
//!   every per-source cap.
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
pub mod metrics;
pub mod random;
pub mod reload;
pub mod shutdown;
pub mod source;
pub mod telemetry;
