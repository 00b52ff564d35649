//! `signet-pki`: the only reader of X.509 certificates, CRLs, private keys and SPIFFE bundle
//! documents in Signet, so that the server, the agent, the Kubernetes bridge and
//! `signet-client` read, check and convert them in one way.
//!
//! - [`cert`]: [`ParsedCert`], any X.509 certificate read once (SPIFFE ID, SANs, key
//!   identifiers, validity, serial, fingerprint, CA or not).
//! - [`crl`]: [`ParsedCrl`], a CRL read once and verified against its issuer.
//! - [`key`]: private keys — generate (ECDSA P-256/P-384, Ed25519, RSA), read and write PEM in
//!   PKCS#8, SEC1 and PKCS#1, the public key to compare with a certificate's.
//! - [`csr`]: the one CSR builder, and [`ParsedCsr`] for a CSR a client did not build.
//! - [`svid`]: [`SvidCertificate`] (an issued X509-SVID chain, checked) and [`X509Svid`]
//!   (such a chain with its private key, checked to match).
//! - [`fingerprint`]: SHA-256 fingerprints as Signet prints them.
//! - [`bundle`]: [`SpiffeBundle`], the SPIFFE bundle document (JWK set) read and written.
//! - [`jwt`]: JWT-SVIDs: [`jwt::JwtSigner`] mints one, [`jwt::validate`] checks one against a key set.
//!
//! `x509-parser` is used here (and in the server's CA core) only: every other crate asks these
//! types.
//!
//! No I/O and no clock: these are values and their rules.
#![forbid(unsafe_code)]

pub mod bundle;
pub mod cert;
pub mod crl;
pub mod csr;
pub mod fingerprint;
pub mod jwt;
pub mod key;
pub mod svid;

pub use bundle::{BundleError, JwtAuthority, SpiffeBundle};
pub use cert::{CertError, ParsedCert};
pub use crl::{CrlError, CrlReason, ParsedCrl, UnknownCrlReason};
pub use csr::{CsrError, CsrNames, KeyAndCsr, ParsedCsr, build_csr, new_key_and_csr};
pub use key::{KeyAlgorithm, KeyEncoding, KeyError, PrivateKey, generate};
pub use svid::{SvidCertificate, SvidError, X509Svid};
