//! Test-time PKI helpers for the CA core's unit tests (no checked-in keys).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{KeyPair, PublicKeyData, SanType};
use signet_types::{SpiffeId, TrustDomain};

use super::csr::VerifiedCsr;
use super::serial::SequentialSerials;
use super::{Authority, Grant};
use crate::ca::KeyType;

/// The injected clock: 2023-11-14T22:13:20Z.
pub(crate) const NOW_SECS: u64 = 1_700_000_000;

pub(crate) fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW_SECS)
}

pub(crate) fn td() -> TrustDomain {
    TrustDomain::new("example.org").expect("trust domain")
}

pub(crate) fn id(path: &str) -> SpiffeId {
    td().id(path).expect("spiffe id")
}

pub(crate) fn root(key_type: KeyType, ttl: Duration) -> (Authority, Vec<u8>) {
    Authority::generate_root(&td(), key_type, now(), ttl, &SequentialSerials::new(1000))
        .expect("generate root")
}

pub(crate) fn csr(key: &impl rcgen::SigningKey, sans: Vec<SanType>) -> VerifiedCsr {
    let der = super::csr::tests::csr_with(key, sans);
    VerifiedCsr::parse(&der).expect("CSR parses")
}

pub(crate) fn p256_csr() -> (KeyPair, VerifiedCsr) {
    let key = KeyPair::generate().expect("key");
    let csr = csr(&key, vec![]);
    assert_eq!(csr.public_key_der(), key.subject_public_key_info());
    (key, csr)
}

pub(crate) fn grant(path: &str, ttl: Duration) -> Grant {
    Grant::for_tests(id(path), ttl)
}

/// Runs openssl with `args`, returning stdout; panics with stderr on failure.
pub(crate) fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `openssl verify -x509_strict` of `leaf` (DER) against `roots`, with `untrusted`
/// intermediates, at `NOW_SECS`. Returns openssl's output on failure.
pub(crate) fn openssl_verify(
    dir: &Path,
    roots: &[Vec<u8>],
    untrusted: &[Vec<u8>],
    leaf: &[u8],
) -> Result<(), String> {
    use signet_types::pem::{cert_to_pem, certs_to_pem};
    let root_path = dir.join("root.pem");
    let leaf_path = dir.join("leaf.pem");
    let chain_path = dir.join("chain.pem");
    std::fs::write(&root_path, certs_to_pem(roots.iter().map(Vec::as_slice))).expect("write");
    std::fs::write(&leaf_path, cert_to_pem(leaf)).expect("write");
    let at = NOW_SECS.to_string();
    let mut cmd = Command::new("openssl");
    cmd.args([
        "verify",
        "-x509_strict",
        "-attime",
        &at,
        "-purpose",
        "sslclient",
        "-CAfile",
    ])
    .arg(&root_path);
    if !untrusted.is_empty() {
        std::fs::write(
            &chain_path,
            certs_to_pem(untrusted.iter().map(Vec::as_slice)),
        )
        .expect("write");
        cmd.arg("-untrusted").arg(&chain_path);
    }
    let out = cmd.arg(&leaf_path).output().expect("run openssl");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
