//! The trust bundle the agent serves, and the server's bundle stream that keeps it current.
//!
//! The bootstrap `trust_bundle_file` is only the first trust anchor: once the server has sent a
//! bundle (at attestation, then on `WatchBundle`), that bundle is what the Workload API and the
//! sinks serve, and it is persisted in `data_dir` so a restart without the server still uses
//! the newest one. [`BundleWatch`] holds the stream over the node's mTLS connection and reopens
//! it with capped, jittered backoff; [`decide`] says what to do with each bundle received.

use std::time::SystemTime;

use signet_types::TrustDomain;

use crate::ca::{Ca, TrustBundle};
use crate::watch::Watch;
pub use crate::watch::{REOPEN, REOPEN_BASE, REOPEN_CAP};

/// What to do with a bundle from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The roots served now: nothing to do.
    Unchanged,
    /// New roots: serve, deliver and persist them.
    Replace(Vec<Vec<u8>>),
    /// Not for this agent (another trust domain); the reason is logged.
    Reject(String),
}

/// Decides on `received` for a node of trust domain `td` currently serving `current`.
/// Revisions are not compared: replicas count them separately, and the server sends its
/// current bundle at once on every (re)connection, so the roots themselves decide.
pub fn decide(td: &TrustDomain, current: &[Vec<u8>], received: &TrustBundle) -> Decision {
    if &received.trust_domain != td {
        return Decision::Reject(format!(
            "bundle revision {} is for trust domain {}, not {td}",
            received.revision, received.trust_domain
        ));
    }
    if received.roots_der == current {
        Decision::Unchanged
    } else {
        Decision::Replace(received.roots_der.clone())
    }
}

/// The bundle stream over the current connection, reopened with backoff when it fails.
pub type BundleWatch = Watch<TrustBundle>;

impl Watch<TrustBundle> {
    pub fn bundle(now: SystemTime) -> Self {
        Watch::new("trust bundle", now)
    }

    /// Opens the stream on `ca` if it is closed and due; on failure, schedules the next try.
    pub async fn open_if_due(&mut self, ca: &dyn Ca, now: SystemTime, rnd: f64) {
        if !self.is_due(now) {
            return;
        }
        match ca.watch_bundle().await {
            Ok(s) => self.opened(s),
            Err(e) => self.failed_with(now, rnd, &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{
        AttestCredential, Attested, BundleStream, CaError, EntriesUpdate, WorkloadCsr,
    };
    use signet_pki::SvidCertificate;
    use std::sync::Mutex;
    use std::time::Duration;

    fn td(s: &str) -> TrustDomain {
        s.parse().expect("td")
    }

    fn bundle(domain: &str, roots: &[&[u8]], revision: u64) -> TrustBundle {
        TrustBundle {
            trust_domain: td(domain),
            roots_der: roots.iter().map(|r| r.to_vec()).collect(),
            revision,
            tainted_key_ids: Vec::new(),
            crls: Vec::new(),
            jwt_keys: Vec::new(),
            tainted_jwt_key_ids: Vec::new(),
        }
    }

    #[test]
    fn decides_on_roots_not_revisions() {
        let cur = vec![b"r1".to_vec()];
        let example = td("example.org");
        assert_eq!(
            decide(&example, &cur, &bundle("example.org", &[b"r1"], 7)),
            Decision::Unchanged
        );
        // A lower revision from another replica with other roots still replaces.
        assert_eq!(
            decide(&example, &cur, &bundle("example.org", &[b"r1", b"r2"], 1)),
            Decision::Replace(vec![b"r1".to_vec(), b"r2".to_vec()])
        );
        match decide(&example, &cur, &bundle("other.org", &[b"r9"], 2)) {
            Decision::Reject(why) => assert!(why.contains("other.org"), "{why}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Refuses the stream `fail` times, then serves the given items.
    struct Flaky {
        fail: Mutex<u32>,
        items: Vec<TrustBundle>,
    }

    #[async_trait::async_trait]
    impl Ca for Flaky {
        async fn attest(&self, _: &AttestCredential, _: &[u8]) -> Result<Attested, CaError> {
            Err(CaError::Unavailable("n/a".into()))
        }
        async fn renew_node(&self, _: &[u8]) -> Result<SvidCertificate, CaError> {
            Err(CaError::Unavailable("n/a".into()))
        }
        async fn sync_entries(&self, _: u64) -> Result<EntriesUpdate, CaError> {
            Ok(EntriesUpdate::Unchanged)
        }
        async fn sign_workloads(
            &self,
            _: Vec<WorkloadCsr>,
        ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError> {
            Ok(vec![])
        }
        async fn watch_bundle(&self) -> Result<BundleStream, CaError> {
            let mut f = self
                .fail
                .lock()
                .map_err(|e| CaError::Invalid(e.to_string()))?;
            if *f > 0 {
                *f -= 1;
                return Err(CaError::Unavailable("down".into()));
            }
            let items: Vec<Result<TrustBundle, CaError>> =
                self.items.iter().cloned().map(Ok).collect();
            Ok(Box::pin(futures::stream::iter(items)))
        }
    }

    #[tokio::test]
    async fn reopens_with_capped_jittered_backoff() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let ca = Flaky {
            fail: Mutex::new(8),
            items: vec![bundle("example.org", &[b"r1"], 1)],
        };
        let mut w = BundleWatch::bundle(t0);
        let mut now = t0;
        let mut waits = Vec::new();
        while !w.is_open() {
            w.open_if_due(&ca, now, 0.999).await;
            if let Some(at) = w.reopen_at() {
                waits.push(at.duration_since(now).expect("later"));
                now = at;
            }
        }
        assert_eq!(waits.len(), 8);
        assert!(waits.windows(2).all(|p| p[0] <= p[1]), "{waits:?}");
        assert!(waits.iter().all(|w| *w < REOPEN_CAP), "{waits:?}");
        assert!(waits[7] > REOPEN_CAP / 2, "{waits:?}");
        // Not due yet: nothing happens.
        let mut early = BundleWatch::bundle(t0);
        early.failed(t0, 0.0, &"x");
        early.open_if_due(&ca, t0, 0.0).await;
        assert!(!early.is_open());

        let first = w.next().await.expect("item").expect("ok");
        assert_eq!(first.revision, 1);
        w.succeeded();
        assert!(w.next().await.is_none(), "the stream ended");
        w.failed(now, 0.0, &"ended");
        assert_eq!(w.reopen_at(), Some(now + REOPEN_BASE / 2), "failures reset");
        w.reset(now);
        assert_eq!(w.reopen_at(), Some(now));
    }
}
