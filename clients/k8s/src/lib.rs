//! The Kubernetes bridge: maps cert-manager `Certificate` and `CertificateRequest` objects onto
//! Signet's gRPC calls. Built on kube-rs. See `README.md` for the module map.
//!
//! - [`crd`]: our `signet.dev/v1` `Issuer` and `ClusterIssuer`.
//! - [`certmanager`]: typed `cert-manager.io/v1` `CertificateRequest` and `Certificate`.
//! - [`conditions`]: set/get status conditions (`lastTransitionTime` moves only on change).
//! - [`events`]: Kubernetes Events for outcomes (kube-rs `Recorder`).
//! - [`issuers`]: `issuerRef` -> issuer -> resolved [`signer::SignerConfig`].
//! - [`operator`]: what only the operator decides (the server of namespaced Issuers, the
//!   bridge's token), from the flags.
//! - [`signer`]: one connected client per issuer; errors classified Permanent / Retryable.
//! - [`backoff`]: per-object attempt counters over the runtime's capped exponential backoff.
//! - `testing` (feature `testing`): the one mock API server for controller tests (exact
//!   expected requests, answers computed from merged state), and real-shaped objects.
//! - [`certificate`]: standalone mode, `Certificate` reconcilers (trigger, issuing, readiness).
//! - [`keys`]: private keys for Certificates (ECDSA, Ed25519, RSA; PKCS#1/SEC1/PKCS#8) and CSRs.
//! - [`citadel`]: Citadel compatibility (`istio.<sa>` Secrets, `istio-ca-root-cert`).
//! - [`leader`]: leader election on a Lease; every controller runs behind
//!   `Elector::run_while_leading`.
//! - [`metrics`]: the bridge's Prometheus metrics.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod bundle_configmap;
pub mod certificate;
pub mod certmanager;
pub mod citadel;
pub mod conditions;
pub mod context;
pub mod crd;
pub mod csr;
pub mod events;
pub mod issuer_status;
pub mod issuers;
pub mod keys;
pub mod leader;
pub mod metrics;
pub mod operator;
pub mod request;
pub mod revocation;
pub mod signer;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod yaml;

/// What a reconciler returns (re-exported for tests outside this crate).
pub use kube::runtime::controller::Action;

/// The field manager name of every write the bridge makes.
pub const FIELD_MANAGER: &str = "signet-k8s";
