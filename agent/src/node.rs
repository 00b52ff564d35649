//! The node's own identity (its SVID and key) and the trust bundle the server gave it, kept in
//! `data_dir` so that they survive restarts: `node.key` (PKCS#8 PEM, 0600), `node.pem` (the
//! chain, leaf first), `bundle.pem` and `crls.pem` (the verified CRLs of the issuing CAs, so a
//! restarted agent serves them before the server answers). Every write is atomic (temporary file, fsync, rename,
//! fsync of the directory). A file that cannot be read back is reported as corrupt, never
//! trusted: the identity is a [`signet_pki::X509Svid`] ([`NodeIdentity`]), so what loads is an
//! X509-SVID whose leaf the key matches. The on-disk format is the one earlier agents wrote
//! (PKCS#8 `PRIVATE KEY` and the chain, PEM with LF line endings). The workloads' certificates
//! and entries are kept beside them in `cache.sealed`, sealed under the node key
//! ([`crate::cache`]).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::SystemTime;

use signet_client::ClientIdentity;
use signet_pki::{KeyEncoding, KeyError, PrivateKey, SvidCertificate, SvidError, X509Svid};

pub const KEY_FILE: &str = "node.key";
pub const CERT_FILE: &str = "node.pem";
pub const BUNDLE_FILE: &str = "bundle.pem";
pub const CRLS_FILE: &str = "crls.pem";

/// The node SVID and its key: a [`signet_pki::X509Svid`] (an X509-SVID whose leaf the key
/// matches), its chain as the server sent it (leaf first, the root last). `Debug` never
/// shows the key.
pub type NodeIdentity = X509Svid;

/// Why a node identity cannot be made from what the server issued.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The key the agent generated does not import (a local fault).
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The chain is not an X509-SVID, or not for that key.
    #[error(transparent)]
    Svid(#[from] SvidError),
}

/// The node identity from the server's answer and the key the agent generated for it
/// (PKCS#8 DER): refused when the key is not the leaf's or the chain is not an X509-SVID.
pub fn from_issued(
    issued: SvidCertificate,
    key_pkcs8_der: &[u8],
) -> Result<NodeIdentity, IdentityError> {
    let key = PrivateKey::from_pkcs8_der(key_pkcs8_der)?;
    Ok(X509Svid::new(issued, key)?)
}

/// Whether the node certificate may be used at `now` (see [`crate::rotation::should_serve`]).
pub fn is_valid_at(id: &NodeIdentity, now: SystemTime) -> bool {
    crate::rotation::serves(id.certificate(), now)
}

/// The key as PEM `PRIVATE KEY` (PKCS#8, LF line endings). Never log it.
fn key_pem(id: &NodeIdentity) -> Result<String, KeyError> {
    id.key().to_pem(KeyEncoding::Pkcs8)
}

/// The identity for mTLS to the server.
pub fn client_identity(id: &NodeIdentity) -> Result<ClientIdentity, KeyError> {
    Ok(ClientIdentity {
        cert_chain_pem: id.certificate().chain_pem().into_bytes(),
        key_pem: key_pem(id)?.into_bytes(),
    })
}

/// What `data_dir` holds.
#[derive(Debug)]
pub enum Stored {
    Absent,
    /// Present but unusable; the reason names the file, never its content.
    Corrupt(String),
    Found(NodeIdentity),
}

/// Reads the node identity from `dir`.
pub fn load(dir: &Path) -> Stored {
    let key_path = dir.join(KEY_FILE);
    let cert_path = dir.join(CERT_FILE);
    let key = match std::fs::read(&key_path) {
        Ok(k) => k,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return if cert_path.exists() {
                Stored::Corrupt(format!("{} exists without {KEY_FILE}", cert_path.display()))
            } else {
                Stored::Absent
            };
        }
        Err(e) => return Stored::Corrupt(format!("{}: {e}", key_path.display())),
    };
    let chain = match std::fs::read(&cert_path) {
        Ok(c) => c,
        Err(e) => return Stored::Corrupt(format!("{}: {e}", cert_path.display())),
    };
    let key_der = match signet_types::pem::parse_one(&key, &["PRIVATE KEY"]) {
        Ok((_, der)) => der,
        Err(e) => return Stored::Corrupt(format!("{}: {e}", key_path.display())),
    };
    let chain_der = match signet_types::pem::parse_certs(&chain) {
        Ok(c) => c,
        Err(e) => return Stored::Corrupt(format!("{}: {e}", cert_path.display())),
    };
    match X509Svid::from_der(chain_der, &key_der) {
        Ok(id) => Stored::Found(id),
        Err(e) => Stored::Corrupt(format!("{} / {}: {e}", cert_path.display(), KEY_FILE)),
    }
}

/// Persists the identity: the key first, then the chain (a crash in between leaves a pair
/// that [`load`] reports as corrupt, never a wrong one).
pub fn save(dir: &Path, id: &NodeIdentity) -> std::io::Result<()> {
    ensure_dir(dir)?;
    let key = key_pem(id).map_err(std::io::Error::other)?;
    write_atomic(&dir.join(KEY_FILE), key.as_bytes(), 0o600)?;
    write_atomic(
        &dir.join(CERT_FILE),
        id.certificate().chain_pem().as_bytes(),
        0o644,
    )
}

/// The bundle the server sent at attestation, if any (a corrupt file is logged and ignored).
pub fn load_bundle(dir: &Path) -> Vec<Vec<u8>> {
    let path = dir.join(BUNDLE_FILE);
    match std::fs::read(&path) {
        Ok(b) => signet_types::pem::parse_certs(&b).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "ignoring a corrupt bundle file");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    }
}

pub fn save_bundle(dir: &Path, bundle_der: &[Vec<u8>]) -> std::io::Result<()> {
    ensure_dir(dir)?;
    let pem = signet_types::pem::certs_to_pem(bundle_der.iter().map(Vec::as_slice));
    write_atomic(&dir.join(BUNDLE_FILE), pem.as_bytes(), 0o644)
}

/// The CRLs persisted by [`save_crls`] (DER); none when the file is absent or corrupt.
pub fn load_crls(dir: &Path) -> Vec<Vec<u8>> {
    let path = dir.join(CRLS_FILE);
    let Ok(text) = std::fs::read(&path) else {
        return Vec::new();
    };
    match pem::parse_many(text) {
        Ok(blocks) => blocks
            .into_iter()
            .filter(|b| b.tag() == "X509 CRL")
            .map(|b| b.into_contents())
            .collect(),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "ignoring a corrupt CRL file");
            Vec::new()
        }
    }
}

/// Persists the verified CRLs (PEM `X509 CRL` blocks), atomically.
pub fn save_crls(dir: &Path, crls_der: &[Vec<u8>]) -> std::io::Result<()> {
    ensure_dir(dir)?;
    let pem = crate::sinks::crls_to_pem(crls_der);
    write_atomic(&dir.join(CRLS_FILE), pem.as_bytes(), 0o644)
}

/// Creates `dir` (mode 0700) when absent.
pub(crate) fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

use std::os::unix::fs::DirBuilderExt;

/// Writes `data` to `path` atomically with `mode`: a temporary file in the same directory,
/// fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use signet_runtime::clock::{Clock, SystemClock};
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    /// A self-signed SPIFFE certificate and its key, valid from now for `secs`.
    fn identity(secs: u64) -> NodeIdentity {
        crate::testing::self_signed_svid(
            "spiffe://example.org/signet/node/n1",
            SystemClock.now(),
            Duration::from_secs(secs),
        )
    }

    #[test]
    fn round_trips_with_a_private_key_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        assert!(matches!(load(&data), Stored::Absent));
        let id = identity(3600);
        assert_eq!(
            id.spiffe_id().to_string(),
            "spiffe://example.org/signet/node/n1"
        );
        save(&data, &id).expect("save");
        let mode = std::fs::metadata(data.join(KEY_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        match load(&data) {
            Stored::Found(back) => assert_eq!(back, id),
            other => panic!("unexpected {other:?}"),
        }
        assert!(is_valid_at(&id, SystemClock.now()));
        assert!(!is_valid_at(
            &id,
            SystemClock.now() + Duration::from_secs(7200)
        ));
        assert!(!format!("{id:?}").contains("PRIVATE"));
    }

    #[test]
    fn corrupt_or_mismatched_files_are_reported_not_trusted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = identity(3600);
        let b = identity(3600);
        save(dir.path(), &a).expect("save");
        // The key of another identity: a crash between the two renames looks like this.
        let b_key = key_pem(&b).expect("pem");
        write_atomic(&dir.path().join(KEY_FILE), b_key.as_bytes(), 0o600).expect("w");
        match load(dir.path()) {
            Stored::Corrupt(why) => assert!(why.contains("does not match"), "{why}"),
            other => panic!("unexpected {other:?}"),
        }
        std::fs::write(dir.path().join(CERT_FILE), "garbage").expect("w");
        assert!(matches!(load(dir.path()), Stored::Corrupt(_)));
        std::fs::remove_file(dir.path().join(KEY_FILE)).expect("rm");
        assert!(matches!(load(dir.path()), Stored::Corrupt(_)));
        std::fs::remove_file(dir.path().join(CERT_FILE)).expect("rm");
        assert!(matches!(load(dir.path()), Stored::Absent));
    }

    /// `node.key` and `node.pem` as the agent wrote them before its identity became a
    /// `signet_pki::X509Svid` (PKCS#8 `PRIVATE KEY` and the chain, LF line endings; the
    /// certificate is valid until 2125): they still load, and are written back byte for byte.
    #[test]
    fn files_written_by_the_previous_agent_still_load() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/testdata/node-v1");
        let id = match load(&fixture) {
            Stored::Found(id) => id,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(
            id.spiffe_id().to_string(),
            "spiffe://example.org/signet/node/fixture"
        );
        assert!(is_valid_at(&id, SystemClock.now()));
        let dir = tempfile::tempdir().expect("tempdir");
        save(dir.path(), &id).expect("save");
        for file in [KEY_FILE, CERT_FILE] {
            assert_eq!(
                std::fs::read(dir.path().join(file)).expect("written"),
                std::fs::read(fixture.join(file)).expect("fixture"),
                "{file}: same on-disk format"
            );
        }
    }

    #[test]
    fn a_client_identity_is_the_chain_and_key_as_pem() {
        let id = identity(60);
        let c = client_identity(&id).expect("identity");
        assert_eq!(c.cert_chain_pem, id.certificate().chain_pem().into_bytes());
        let key = String::from_utf8(c.key_pem).expect("utf-8");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{key}");
        assert!(!key.contains('\r'));
    }

    #[test]
    fn bundle_round_trips_and_corruption_is_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(load_bundle(dir.path()).is_empty());
        let id = identity(60);
        save_bundle(dir.path(), id.certificate().chain_der()).expect("save");
        assert_eq!(load_bundle(dir.path()), id.certificate().chain_der());
        std::fs::write(dir.path().join(BUNDLE_FILE), "nope").expect("w");
        assert!(load_bundle(dir.path()).is_empty());
    }

    #[test]
    fn crls_round_trip_atomically_and_corruption_is_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(load_crls(dir.path()).is_empty());
        let crls = vec![vec![0x30, 1, 2], vec![0x30, 3]];
        save_crls(dir.path(), &crls).expect("save");
        assert_eq!(load_crls(dir.path()), crls);
        let text = std::fs::read_to_string(dir.path().join(CRLS_FILE)).expect("read");
        assert_eq!(text.matches("-----BEGIN X509 CRL-----").count(), 2);
        save_crls(dir.path(), &crls[1..]).expect("replace");
        assert_eq!(load_crls(dir.path()), &crls[1..]);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, [CRLS_FILE], "no temporary file left");
        std::fs::write(dir.path().join(CRLS_FILE), "-----BEGIN X509 CRL-----\nnope").expect("w");
        assert!(load_crls(dir.path()).is_empty());
    }
}
