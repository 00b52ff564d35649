//! The trust bundle: the roots relying parties trust and the JWT-SVID signing keys they
//! validate tokens with, published on a watch channel (the
//! native API's `WatchBundle` streams it) and written atomically to `<data_dir>/bundle.pem`
//! on start and on every change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use signet_types::TrustDomain;
use tokio::sync::watch;

pub use crate::ca::manager::PublishedJwtKey;

/// Kept here for the callers that import it from the bundle; it lives in [`crate::files`].
pub use crate::files::write_atomic;

/// A CRL as published with the bundle: one per issuing CA key (see `crate::crl`, which signs
/// and refreshes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedCrl {
    pub key_id: String,
    pub der: Vec<u8>,
    pub number: u64,
    pub this_update: i64,
    pub next_update: i64,
    /// Serials listed.
    pub entries: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub trust_domain: TrustDomain,
    /// DER roots.
    pub roots: Vec<Vec<u8>>,
    /// CA and JWT key IDs whose certificates or tokens holders should replace (see
    /// `ca::manager`).
    pub tainted_key_ids: Vec<String>,
    /// The JWT-SVID signing keys: prepared (published before they sign), active and retired.
    /// Never in the PEM file, which holds X.509 roots only.
    pub jwt_keys: Vec<PublishedJwtKey>,
    pub revision: u64,
    /// The current CRL of every issuing CA key ([`BundleHandle::set_crls`]).
    pub crls: Vec<PublishedCrl>,
}

impl Bundle {
    pub fn to_pem(&self) -> String {
        signet_types::pem::certs_to_pem(self.roots.iter().map(Vec::as_slice))
    }
}

#[derive(Debug, Clone)]
pub struct BundleHandle {
    tx: Arc<watch::Sender<Arc<Bundle>>>,
    path: PathBuf,
}

impl BundleHandle {
    /// Publishes the first bundle and writes its file.
    pub fn new(bundle: Bundle, path: PathBuf) -> std::io::Result<Self> {
        write_atomic(&path, bundle.to_pem().as_bytes(), 0o644)?;
        let (tx, _) = watch::channel(Arc::new(bundle));
        Ok(Self {
            tx: Arc::new(tx),
            path,
        })
    }

    pub fn current(&self) -> Arc<Bundle> {
        self.tx.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Bundle>> {
        self.tx.subscribe()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the roots if they changed: bumps the revision, rewrites the file, and wakes
    /// every watcher.
    #[cfg(test)]
    pub fn update(&self, roots: Vec<Vec<u8>>) -> std::io::Result<()> {
        let cur = self.current();
        self.update_with(roots, cur.tainted_key_ids.clone(), cur.jwt_keys.clone())
    }

    /// Replaces the roots, the tainted key IDs and the JWT keys if any changed: bumps the
    /// revision, rewrites the file, and wakes every watcher.
    pub fn update_with(
        &self,
        roots: Vec<Vec<u8>>,
        tainted_key_ids: Vec<String>,
        jwt_keys: Vec<PublishedJwtKey>,
    ) -> std::io::Result<()> {
        // Read-modify-write under the channel's lock, so a concurrent `set_crls` is never lost.
        let mut result = Ok(());
        self.tx.send_if_modified(|cur| {
            if cur.roots == roots
                && cur.tainted_key_ids == tainted_key_ids
                && cur.jwt_keys == jwt_keys
            {
                return false;
            }
            let next = Bundle {
                trust_domain: cur.trust_domain.clone(),
                roots: roots.clone(),
                tainted_key_ids: tainted_key_ids.clone(),
                jwt_keys: jwt_keys.clone(),
                revision: cur.revision + 1,
                crls: cur.crls.clone(),
            };
            if let Err(e) = write_atomic(&self.path, next.to_pem().as_bytes(), 0o644) {
                result = Err(e);
                return false;
            }
            *cur = Arc::new(next);
            true
        });
        result
    }
}

impl BundleHandle {
    /// Replaces the CRLs if they changed: bumps the revision and wakes every watcher (the
    /// roots file does not hold CRLs; the publisher writes them under `<data_dir>/crl/`).
    pub fn set_crls(&self, crls: Vec<PublishedCrl>) {
        self.tx.send_if_modified(|cur| {
            if cur.crls == crls {
                return false;
            }
            *cur = Arc::new(Bundle {
                trust_domain: cur.trust_domain.clone(),
                roots: cur.roots.clone(),
                tainted_key_ids: cur.tainted_key_ids.clone(),
                jwt_keys: cur.jwt_keys.clone(),
                revision: cur.revision + 1,
                crls,
            });
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_rewrites_file_and_bumps_revision() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bundle.pem");
        let td = TrustDomain::new("example.org").expect("td");
        let h = BundleHandle::new(
            Bundle {
                trust_domain: td,
                roots: vec![vec![0x30, 0x00]],
                tainted_key_ids: vec![],
                jwt_keys: Vec::new(),
                revision: 1,
                crls: Vec::new(),
            },
            path.clone(),
        )
        .expect("bundle");
        let mut rx = h.subscribe();
        assert!(
            std::fs::read_to_string(&path)
                .expect("read")
                .contains("BEGIN CERTIFICATE")
        );
        h.update(vec![vec![0x30, 0x00]]).expect("same roots");
        assert_eq!(h.current().revision, 1);
        assert!(!rx.has_changed().expect("open"));
        h.update(vec![vec![0x30, 0x00], vec![0x30, 0x01, 0x00]])
            .expect("new roots");
        assert!(rx.has_changed().expect("open"));
        assert_eq!(rx.borrow_and_update().revision, 2);
        let pem = std::fs::read_to_string(&path).expect("read");
        assert_eq!(pem.matches("BEGIN CERTIFICATE").count(), 2);

        // CRLs: a change bumps the revision and wakes watchers; the same list does not; a
        // later roots update keeps them.
        let crl = PublishedCrl {
            key_id: "0a".into(),
            der: vec![0x30, 0x00],
            number: 1,
            this_update: 1,
            next_update: 2,
            entries: 0,
        };
        h.set_crls(vec![crl.clone()]);
        assert!(rx.has_changed().expect("open"));
        assert_eq!(rx.borrow_and_update().revision, 3);
        h.set_crls(vec![crl.clone()]);
        assert!(!rx.has_changed().expect("open"));
        h.update(vec![vec![0x30, 0x00]]).expect("roots");
        assert_eq!(h.current().crls, vec![crl]);
        assert_eq!(h.current().revision, 4);
    }
}
