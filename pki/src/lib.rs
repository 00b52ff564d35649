//! `signet-pki`: the certificate and key types every Signet client shares, so that the agent,
//! the Kubernetes bridge and `signet-client` hold, check and convert certificates in one way.
//!
//! - [`key`]: private keys — generate (ECDSA P-256/P-384, Ed25519, RSA), read and write PEM in
//!   PKCS#8, SEC1 and PKCS#1, the public key to compare with a certificate's.
//! - [`csr`]: the one CSR builder.
//! - [`svid`]: [`SvidCertificate`] (an issued X509-SVID chain, checked) and [`X509Svid`]
//!   (such a chain with its private key, checked to match).
//! - [`fingerprint`]: SHA-256 fingerprints as Signet prints them.
//!
//! No I/O and no clock: these are values and their rules.
#![forbid(unsafe_code)]

pub mod csr;
pub mod fingerprint;
pub mod key;
pub mod svid;

pub use csr::{CsrNames, KeyAndCsr, build_csr, new_key_and_csr};
pub use key::{KeyAlgorithm, KeyEncoding, KeyError, PrivateKey, generate};
pub use svid::{SvidCertificate, SvidError, X509Svid};
