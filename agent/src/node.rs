//! The node's own identity (its SVID and key) and the trust bundle the server gave it, kept in
//! `data_dir` so that they survive restarts: `node.key` (PKCS#8 PEM, 0600), `node.pem` (the
//! chain, leaf first), `bundle.pem` and `crls.pem` (the verified CRLs of the issuing CAs, so a
//! restarted agent serves them before the server answers). Every write is atomic (temporary file, fsync, rename,
//! fsync of the directory). A file that cannot be read back is reported as corrupt, never
//! trusted.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::SystemTime;

use rcgen::PublicKeyData;
use signet_client::ClientIdentity;
use signet_types::SpiffeId;

pub const KEY_FILE: &str = "node.key";
pub const CERT_FILE: &str = "node.pem";
pub const BUNDLE_FILE: &str = "bundle.pem";
pub const CRLS_FILE: &str = "crls.pem";

/// The node SVID and its key. `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub spiffe_id: SpiffeId,
    /// DER, leaf first, as the server sent it.
    pub chain_der: Vec<Vec<u8>>,
    /// PKCS#8 DER.
    pub key_pkcs8_der: Vec<u8>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeIdentity")
            .field("spiffe_id", &self.spiffe_id)
            .field("chain_len", &self.chain_der.len())
            .field("key", &"…")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish()
    }
}

fn unix(secs: i64) -> Result<SystemTime, String> {
    signet_runtime::clock::from_unix_checked(secs)
        .ok_or_else(|| format!("time {secs} out of range"))
}

impl NodeIdentity {
    /// Checks that the chain's leaf is a SPIFFE certificate whose public key is the key's,
    /// and reads its validity.
    pub fn from_parts(chain_der: Vec<Vec<u8>>, key_pkcs8_der: Vec<u8>) -> Result<Self, String> {
        let leaf = chain_der.first().ok_or("empty certificate chain")?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| format!("leaf certificate: {e}"))?;
        let key = rcgen::KeyPair::try_from(key_pkcs8_der.as_slice())
            .map_err(|e| format!("private key: {e}"))?;
        if key.der_bytes() != cert.public_key().subject_public_key.data.as_ref() {
            return Err("the private key does not belong to the certificate".into());
        }
        let uri = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .and_then(|san| {
                san.value.general_names.iter().find_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
            })
            .ok_or("the certificate has no URI SAN")?;
        let spiffe_id = uri
            .parse::<SpiffeId>()
            .map_err(|e| format!("URI SAN {uri:?}: {e}"))?;
        let not_before = unix(cert.validity().not_before.timestamp())?;
        let not_after = unix(cert.validity().not_after.timestamp())?;
        Ok(Self {
            spiffe_id,
            chain_der,
            key_pkcs8_der,
            not_before,
            not_after,
        })
    }

    pub fn is_valid_at(&self, now: SystemTime) -> bool {
        crate::rotation::should_serve(self.not_before, self.not_after, now)
    }

    pub fn chain_pem(&self) -> String {
        signet_types::pem::certs_to_pem(self.chain_der.iter().map(Vec::as_slice))
    }

    /// The key as PEM `PRIVATE KEY`. Never log it.
    fn key_pem(&self) -> String {
        pem::encode_config(
            &pem::Pem::new("PRIVATE KEY", self.key_pkcs8_der.clone()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        )
    }

    /// The identity for mTLS to the server.
    pub fn client_identity(&self) -> ClientIdentity {
        ClientIdentity {
            cert_chain_pem: self.chain_pem().into_bytes(),
            key_pem: self.key_pem().into_bytes(),
        }
    }
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
    match NodeIdentity::from_parts(chain_der, key_der) {
        Ok(id) => Stored::Found(id),
        Err(e) => Stored::Corrupt(format!("{} / {}: {e}", cert_path.display(), KEY_FILE)),
    }
}

/// Persists the identity: the key first, then the chain (a crash in between leaves a pair
/// that [`load`] reports as corrupt, never a wrong one).
pub fn save(dir: &Path, id: &NodeIdentity) -> std::io::Result<()> {
    ensure_dir(dir)?;
    write_atomic(&dir.join(KEY_FILE), id.key_pem().as_bytes(), 0o600)?;
    write_atomic(&dir.join(CERT_FILE), id.chain_pem().as_bytes(), 0o644)
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

fn ensure_dir(dir: &Path) -> std::io::Result<()> {
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
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    /// A self-signed SPIFFE certificate and its key.
    fn identity(secs: u64) -> NodeIdentity {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let mut p = rcgen::CertificateParams::default();
        p.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://example.org/signet/node/n1"
                .try_into()
                .expect("uri"),
        )];
        let now = SystemTime::now();
        p.not_before = now.into();
        p.not_after = (now + Duration::from_secs(secs)).into();
        let cert = p.self_signed(&key).expect("cert");
        NodeIdentity::from_parts(vec![cert.der().to_vec()], key.serialize_der()).expect("valid")
    }

    #[test]
    fn round_trips_with_a_private_key_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        assert!(matches!(load(&data), Stored::Absent));
        let id = identity(3600);
        assert_eq!(
            id.spiffe_id.to_string(),
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
        assert!(id.is_valid_at(SystemTime::now()));
        assert!(!id.is_valid_at(SystemTime::now() + Duration::from_secs(7200)));
        assert!(!format!("{id:?}").contains("PRIVATE"));
    }

    #[test]
    fn corrupt_or_mismatched_files_are_reported_not_trusted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = identity(3600);
        let b = identity(3600);
        save(dir.path(), &a).expect("save");
        // The key of another identity: a crash between the two renames looks like this.
        write_atomic(&dir.path().join(KEY_FILE), b.key_pem().as_bytes(), 0o600).expect("w");
        match load(dir.path()) {
            Stored::Corrupt(why) => assert!(why.contains("does not belong"), "{why}"),
            other => panic!("unexpected {other:?}"),
        }
        std::fs::write(dir.path().join(CERT_FILE), "garbage").expect("w");
        assert!(matches!(load(dir.path()), Stored::Corrupt(_)));
        std::fs::remove_file(dir.path().join(KEY_FILE)).expect("rm");
        assert!(matches!(load(dir.path()), Stored::Corrupt(_)));
        std::fs::remove_file(dir.path().join(CERT_FILE)).expect("rm");
        assert!(matches!(load(dir.path()), Stored::Absent));
    }

    #[test]
    fn bundle_round_trips_and_corruption_is_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(load_bundle(dir.path()).is_empty());
        let id = identity(60);
        save_bundle(dir.path(), &id.chain_der).expect("save");
        assert_eq!(load_bundle(dir.path()), id.chain_der);
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
