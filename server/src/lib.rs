//! `signet-server`: the Signet certificate authority.
//!
//! The issuance flow (see `ARCHITECTURE.md`): the API edge ([`api`]) parses and converts
//! protos to domain requests; [`authn`] turns credentials into an `AuthenticatedCaller`;
//! [`policy`] decides what that caller may have (a [`ca::Grant`]) or refuses; the sans-I/O
//! [`ca`] core signs and re-validates; the [`ledger`] writer commits the record (group
//! commit) and only then does the reply leave.
#![forbid(unsafe_code)]

pub mod api;
pub mod attestation;
pub mod audit;
pub mod authn;
pub mod bundle;
pub mod ca;
pub mod checkpoint;
pub mod clock;
pub mod config;
pub mod crl;
pub mod federation;
pub(crate) mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod issuer;
pub mod ledger;
#[doc(hidden)]
pub mod ledger_fill;
pub mod limits;
pub mod metrics;
pub(crate) mod nodes;
pub(crate) mod policy;
pub mod provenance;
pub mod revocation;
pub mod server;
pub mod store;
pub mod tls;
