//! `signet-server`: the Signet certificate authority.
//!
//! The issuance flow (see `ARCHITECTURE.md`): the API edge ([`api`]) parses and converts
//! protos to domain requests; [`authn`] turns credentials into an `AuthenticatedCaller`;
//! [`policy`] decides what that caller may have (a [`ca::Grant`]) or refuses; the sans-I/O
//! [`ca`] core signs and re-validates; the [`ledger`] writer commits the record (group
//! commit) and only then does the reply leave.
#![forbid(unsafe_code)]

pub(crate) mod api;
pub(crate) mod attestation;
pub(crate) mod audit;
pub(crate) mod authn;
pub(crate) mod bundle;
pub(crate) mod ca;
pub(crate) mod checkpoint;
pub(crate) mod clock;
pub mod config;
pub(crate) mod crl;
pub(crate) mod entry_upgrade;
pub(crate) mod federation;
pub(crate) mod files;
/// The cargo-fuzz targets' bodies (fuzz/ enables the `fuzzing` feature); never in a production
/// build.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod http;
pub(crate) mod issuance;
pub(crate) mod issuer;
pub(crate) mod jwt_svid;
pub(crate) mod ledger;
/// The benchmark fill (`signet-ledger-fill`, a binary of this package, so it must be `pub`);
/// only with the `bench` feature, which that binary requires.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod ledger_fill;
pub(crate) mod limits;
pub(crate) mod metrics;
pub(crate) mod node_sets;
pub(crate) mod nodes;
pub(crate) mod oidc;
pub(crate) mod policy;
pub(crate) mod provenance;
pub(crate) mod registration;
pub mod reload;
pub(crate) mod revocation;
pub(crate) mod revoked;
pub mod server;
pub(crate) mod store;
pub(crate) mod tls;
