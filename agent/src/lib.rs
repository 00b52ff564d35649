//! `signet-agent`: the node agent.
//!
//! - [`config`]: the TOML/env configuration.
//! - [`rotation`]: when to renew, backoff, whether to keep serving (pure functions).
//! - [`rotator`]: workload certificate rotation against a [`ca::Ca`]: signs and holds, and
//!   publishes what it holds through the [`rotator::Outlets`] (Workload API state, sinks).
//! - [`trust`]: the trust state (served roots, taints, verified CRLs) the driver owns and lends
//!   to each rotator pass.
//! - [`state`]: identities and bundle, published on a `watch` channel.
//! - [`bundle`]: which trust bundle is served; the server's bundle stream that updates it.
//! - [`revocation`]: tainted CA keys and verified CRLs (which held certificates to replace now).
//! - [`attest`]: caller attestation (Unix peer credentials, pinned process, cgroup, pod);
//!   selector matching.
//! - [`workload`]: the SPIFFE Workload API server.
//! - [`jwt_cache`]: the JWT-SVIDs it hands out, per SPIFFE ID and audiences, minted by the
//!   server through the node's connection.
//! - [`signal`]: the reload signals a files sink may send, by name.
//! - [`sinks`]: delivery of SVIDs to files and Kubernetes Secrets.
//! - [`ca`]: the seam to the Signet server (trait [`ca::Ca`], gRPC implementation [`ca::GrpcCa`]).
//! - [`node`]: the node identity and bundle persisted in `data_dir`.
//! - [`cache`]: the entries, bundles and workload SVIDs kept in `data_dir`, sealed under the
//!   node key, so a restart while the server is down keeps serving.
//! - [`driver`]: the main loop (attestation, node renewal, entry sync, bundle stream, rotation):
//!   a pure schedule decides what is due, a thin `select!` loop executes it.
//! - [`http`]: `/healthz`, `/readyz`, `/metrics`; [`readiness`]: what `/readyz` says.
//!
//! Every certificate the agent holds is a `signet_pki` type, checked when it is made: what
//! the CA answers is a [`signet_pki::SvidCertificate`], the node identity and each workload
//! SVID a [`signet_pki::X509Svid`] (chain and its key), what a sink delivers a
//! [`sinks::Delivered`] (an `X509Svid` with the bundle and CRLs).
#![forbid(unsafe_code)]

pub mod attest;
pub mod bundle;
pub mod ca;
pub mod cache;
pub mod config;
pub mod driver;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod http;
pub mod jwt_cache;
pub mod kube_https;
pub mod metrics;
pub mod node;
pub mod readiness;
pub mod revocation;
pub mod rotation;
pub mod rotator;
pub mod signal;
pub mod sinks;
pub mod state;
#[cfg(test)]
pub(crate) mod testing;
pub mod trust;
pub mod watch;
pub mod workload;
