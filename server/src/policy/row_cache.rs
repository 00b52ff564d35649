//! A short-lived cache of the ledger rows of certificates presented over mTLS.
//!
//! Every mTLS request re-checks the presented certificate's ledger row ([`super::renewal`]). A
//! client on one TLS connection presents the same certificate for every request, so looking the
//! row up each time costs a database round trip per issuance for no new information: a row's
//! content never changes, except its revocation. Rows (and "not in the ledger") are kept for
//! [`RowCache::TTL`], so a revocation made elsewhere reaches renewals within that time; entries,
//! nodes and bans are not cached (they are re-read at every renewal that depends on them).
//!
//! Bounded: at most [`RowCache::MAX_ENTRIES`]; when full, expired entries go, and if that is not
//! enough the cache starts over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::store::LedgerRecord;

/// When a row was looked up, and what was found (`None`: not in the ledger).
type Cached = (SystemTime, Option<Arc<LedgerRecord>>);

/// Keyed by the presented certificate's SHA-256.
#[derive(Debug, Default)]
pub struct RowCache {
    entries: Mutex<HashMap<[u8; 32], Cached>>,
}

impl RowCache {
    /// How long a looked-up row is reused.
    pub const TTL: Duration = Duration::from_secs(1);
    /// Most rows kept.
    pub const MAX_ENTRIES: usize = 10_000;

    /// The cached lookup of `sha256` at `now`, if fresh: `Some(None)` means "not in the ledger".
    pub fn get(&self, sha256: &[u8; 32], now: SystemTime) -> Option<Option<Arc<LedgerRecord>>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (at, row) = entries.get(sha256)?;
        let age = now.duration_since(*at).unwrap_or(Duration::MAX);
        (age < Self::TTL).then(|| row.clone())
    }

    /// Records a lookup made at `now`.
    pub fn put(&self, sha256: [u8; 32], row: Option<Arc<LedgerRecord>>, now: SystemTime) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= Self::MAX_ENTRIES {
            entries
                .retain(|_, (at, _)| now.duration_since(*at).unwrap_or(Duration::MAX) < Self::TTL);
            if entries.len() >= Self::MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(sha256, (now, row));
    }

    /// Forgets `sha256` (its row changed here: a revocation).
    pub fn forget(&self, sha256: &[u8; 32]) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.remove(sha256);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use signet_types::ledger::LedgerEntry;

    fn row(seq: u64) -> Arc<LedgerRecord> {
        Arc::new(LedgerRecord {
            entry: LedgerEntry {
                seq,
                serial: "01".into(),
                spiffe_id: "spiffe://example.org/a".into(),
                dns_names: vec![],
                ip_addresses: vec![],
                not_before: 0,
                not_after: 1,
                cert_sha256: [1; 32],
                ca_key_id: "k".into(),
                caller: "c".into(),
                issued_at: 0,
                request_id: "r".into(),
                provenance: String::new(),
            },
            revocation: None,
            prev_hash: [0; 32],
            hash: [0; 32],
            cert_der: vec![],
        })
    }

    #[test]
    fn rows_are_reused_within_the_ttl_only() {
        let c = RowCache::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(c.get(&[1; 32], t0), None);
        c.put([1; 32], Some(row(7)), t0);
        c.put([2; 32], None, t0);
        let hit = c
            .get(&[1; 32], t0 + Duration::from_millis(500))
            .expect("fresh");
        assert_eq!(hit.map(|r| r.entry.seq), Some(7));
        assert_eq!(c.get(&[2; 32], t0), Some(None), "absence is cached too");
        assert_eq!(c.get(&[1; 32], t0 + RowCache::TTL), None, "expired");
        // A clock that went backwards does not make an entry fresh forever.
        assert_eq!(c.get(&[1; 32], t0 - Duration::from_secs(5)), None);
        c.forget(&[2; 32]);
        assert_eq!(c.get(&[2; 32], t0), None);
    }

    #[test]
    fn the_cache_is_bounded() {
        let c = RowCache::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        for i in 0..RowCache::MAX_ENTRIES + 5 {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&(i as u64).to_be_bytes());
            c.put(k, None, t0);
        }
        let n = c.entries.lock().expect("lock").len();
        assert!(n <= RowCache::MAX_ENTRIES, "{n}");
    }
}
