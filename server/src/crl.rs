//! Certificate revocation lists (RFC 5280 §5, v2): one per issuing CA key, signed by that key.
//!
//! - [`sign_crl`] is the sans-I/O signer: a function of (the CA's key and certificate, the
//!   revoked entries, the CRL number, thisUpdate, nextUpdate, now). Entries of certificates
//!   expired at `now` leave the list (RFC 5280 §3.3 allows it). Every CRL carries the CRL number
//!   and the authority key identifier (the CA certificate's subject key identifier).
//! - [`due`] decides, from the key's last CRL, the revocation mark and `now`, whether a new one
//!   must be signed: when there is none, when a revocation happened since (the mark moved), or
//!   when half of `crl.next_update` has passed since its thisUpdate (so a fresh CRL is always
//!   out well before relying parties consider the old one stale).
//! - [`CrlPublisher`] is the thin async shell. It takes the set of CA keys to publish for from
//!   one place ([`CrlSigners`]: today the issuer's one signing key; the CA key manager at
//!   merge), signs through the store ([`crate::store::CrlStore::refresh_crl`], under a
//!   row lock, so CRL numbers only increase across restarts and replicas, and replicas
//!   sharing a database serve the same bytes), and publishes: in the native bundle
//!   (`Bundle.crls`, so `GetBundle` and `WatchBundle` carry them), over HTTP at
//!   `/crl/<key id>.crl` (see [`crate::http`]), and as `<data_dir>/crl/<key id>.crl`, written
//!   atomically.
//!
//! A revocation on this server refreshes at once (the admin RPC waits for it). Revocations made
//! by another replica are noticed by polling the revocation mark (one indexed read) every
//! `crl.poll_interval` (default 10 s).
//!
//! Part of the CA core with `ca/`: it signs with the CA keys and reads back only the CRLs it
//! signed (their number, their entries, and the revocation dates of the cACompromise entries a
//! root served, which `signet_pki::ParsedCrl` does not keep). So, like `ca/`, it reads them with
//! x509-parser itself; every CRL from elsewhere (agents, the bridge) is read by signet-pki.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{CertificateRevocationListParams, KeyIdMethod, RevokedCertParams, SerialNumber};

use crate::audit::AuditLog;
use crate::bundle::BundleHandle;
use crate::ca::Authority;
use crate::ca::time::to_offset;
use crate::clock::{Clock, from_unix, unix};
use crate::files::write_atomic;
use crate::revoked::Reason;
pub use crate::revoked::{CrlConfig, RevokedEntry};
use crate::store::{CrlStore, StoreError, StoredCrl};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CrlError {
    #[error("CRL times out of range")]
    Time,
    #[error("nextUpdate must be after thisUpdate")]
    Window,
    #[error("serial {0:?} is not hexadecimal")]
    Serial(String),
    #[error("CA key {key_id} cannot sign a CRL: {reason}")]
    Sign { key_id: String, reason: String },
}

/// Signs the CRL of `ca` numbered `number`, listing `revoked` except the entries whose
/// certificate has expired at `now`.
pub fn sign_crl(
    ca: &Authority,
    revoked: &[RevokedEntry],
    number: u64,
    this_update: SystemTime,
    next_update: SystemTime,
    now: SystemTime,
) -> Result<Vec<u8>, CrlError> {
    let this = to_offset(this_update).ok_or(CrlError::Time)?;
    let next = to_offset(next_update).ok_or(CrlError::Time)?;
    if next <= this {
        return Err(CrlError::Window);
    }
    let now = unix(now);
    let mut revoked_certs = Vec::with_capacity(revoked.len());
    for r in revoked.iter().filter(|r| r.not_after >= now) {
        let bytes = hex::decode(&r.serial).map_err(|_| CrlError::Serial(r.serial.clone()))?;
        revoked_certs.push(RevokedCertParams {
            serial_number: SerialNumber::from_slice(&bytes),
            revocation_time: to_offset(from_unix(r.revoked_at)).ok_or(CrlError::Time)?,
            reason_code: Some(r.reason.to_rcgen()),
            invalidity_date: None,
        });
    }
    let params = CertificateRevocationListParams {
        this_update: this,
        next_update: next,
        crl_number: SerialNumber::from_slice(&number.to_be_bytes()),
        issuing_distribution_point: None,
        revoked_certs,
        key_identifier_method: authority_key_id(ca.cert_der()),
    };
    let crl = params.signed_by(ca.issuer()).map_err(|e| CrlError::Sign {
        key_id: ca.key_id().to_owned(),
        reason: e.to_string(),
    })?;
    Ok(crl.der().to_vec())
}

/// The CA certificate's subject key identifier (what the leaves it signs name as their
/// authority key identifier), or rcgen's SHA-256 method when it has none (as rcgen does for
/// the leaves too).
fn authority_key_id(ca_cert_der: &[u8]) -> KeyIdMethod {
    crate::ca::validate::parse_cert(ca_cert_der)
        .ok()
        .and_then(|c| crate::ca::validate::subject_key_id(&c).map(|s| s.to_vec()))
        .map_or(KeyIdMethod::Sha256, KeyIdMethod::PreSpecified)
}

/// Why a new CRL is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// The key has none yet.
    First,
    /// A revocation happened since it was signed.
    Revoked,
    /// Half of its window has passed.
    Refresh,
}

/// Whether `key`'s CRL must be re-signed now; see the module docs.
pub fn due(stored: Option<&StoredCrl>, mark: u64, now: i64, next_update: Duration) -> Option<Due> {
    let Some(s) = stored else {
        return Some(Due::First);
    };
    if s.mark < mark {
        return Some(Due::Revoked);
    }
    let half = i64::try_from(next_update.as_secs() / 2).unwrap_or(i64::MAX);
    if now >= s.this_update.saturating_add(half) || now >= s.next_update {
        return Some(Due::Refresh);
    }
    None
}

/// Decided under the key's CRL lock, with `cur` the CRL stored now and `mark` the revocation
/// mark read before the revoked list this replica would sign: the number to sign, or None to
/// keep `cur`. Not when nothing is [`due`], and never when `cur` covers a later mark than ours
/// (another replica signed with revocations our list may lack: signing ours would drop them).
///
/// Also due: `cur` lacks one of `extra` (a root's revoked intermediates, which no mark covers),
/// or is numbered below `floor` (the highest number this server has served for the key: an
/// older CRL written back into the database). The number is above both.
pub fn number_to_sign(
    cur: Option<&StoredCrl>,
    mark: u64,
    now: i64,
    next_update: Duration,
    extra: &[RevokedEntry],
    floor: u64,
) -> Option<u64> {
    if cur.is_some_and(|c| c.mark > mark) {
        return None;
    }
    let forced = cur.is_some_and(|c| c.number < floor || !lists_all(&c.der, extra));
    if !forced {
        due(cur, mark, now, next_update)?;
    }
    Some(cur.map_or(0, |c| c.number).max(floor) + 1)
}

/// When the CRL `s` must be re-signed at the latest (unix seconds).
pub fn refresh_at(s: &StoredCrl, next_update: Duration) -> i64 {
    let half = i64::try_from(next_update.as_secs() / 2).unwrap_or(i64::MAX);
    s.this_update.saturating_add(half).min(s.next_update)
}

/// A CRL as published (defined with the bundle, which carries them).
pub use crate::bundle::PublishedCrl;

impl PublishedCrl {
    fn from_stored(s: &StoredCrl) -> Self {
        let entries = x509_parser::parse_x509_crl(&s.der)
            .map(|(_, c)| c.iter_revoked_certificates().count() as u64)
            .unwrap_or(0);
        Self {
            key_id: s.ca_key_id.clone(),
            der: s.der.clone(),
            number: s.number,
            this_update: s.this_update,
            next_update: s.next_update,
            entries,
        }
    }
}

/// The CA keys that publish CRLs: every key that signed certificates that may still be valid
/// and still holds its private key. The one place the publisher asks.
pub trait CrlSigners: Send + Sync + 'static {
    fn crl_signers(&self) -> Vec<Arc<Authority>>;

    /// What `key_id`'s CRL lists besides the revoked certificates of its ledger: a root's
    /// tainted or revoked intermediates.
    fn extra_entries(&self, _key_id: &str) -> Vec<RevokedEntry> {
        Vec::new()
    }
}

/// Every CA key that has signed and is not removed (active, retired: certificates issued
/// under a retired key may still be valid, so its CRL is published until the key is removed).
impl CrlSigners for crate::ca::manager::CaManager {
    fn crl_signers(&self) -> Vec<Arc<Authority>> {
        self.signing_authorities()
    }

    fn extra_entries(&self, key_id: &str) -> Vec<RevokedEntry> {
        self.view().revoked_intermediates(key_id)
    }
}

/// The CRL number of `der`, if it reads and fits.
fn crl_number(der: &[u8]) -> Option<u64> {
    let (_, crl) = x509_parser::parse_x509_crl(der).ok()?;
    u64::try_from(crl.crl_number()?).ok()
}

/// Whether the CRL `der` lists every serial of `entries` (lowercase hex, as the ledger
/// writes them); an unreadable CRL lists nothing.
pub fn lists_all(der: &[u8], entries: &[RevokedEntry]) -> bool {
    if entries.is_empty() {
        return true;
    }
    let Ok((_, crl)) = x509_parser::parse_x509_crl(der) else {
        return false;
    };
    let listed: std::collections::BTreeSet<String> = crl
        .iter_revoked_certificates()
        .map(|r| hex::encode(r.raw_serial()))
        .collect();
    entries.iter().all(|e| listed.contains(&e.serial))
}

/// A key ID usable as a file name and URL path segment (lowercase hex).
pub fn valid_key_id(key_id: &str) -> bool {
    !key_id.is_empty()
        && key_id.len() <= 128
        && key_id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Signs, stores and publishes the CRLs; see the module docs.
pub struct CrlPublisher {
    store: Arc<dyn CrlStore>,
    signers: Arc<dyn CrlSigners>,
    bundle: BundleHandle,
    dir: PathBuf,
    cfg: CrlConfig,
    clock: Arc<dyn Clock>,
    audit: Option<AuditLog>,
    /// One refresh at a time on this server (replicas are serialised by the store's lock).
    running: tokio::sync::Mutex<()>,
    /// The highest CRL number served per key (see [`CrlPublisher::served_floor`]).
    served: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    wake: tokio::sync::Notify,
}

impl std::fmt::Debug for CrlPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrlPublisher")
            .field("dir", &self.dir)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// Why a refresh failed (the previous CRLs stay published).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing {path}: {error}")]
    Write { path: String, error: std::io::Error },
}

impl CrlPublisher {
    pub fn new(
        store: Arc<dyn CrlStore>,
        signers: Arc<dyn CrlSigners>,
        bundle: BundleHandle,
        dir: PathBuf,
        cfg: CrlConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            store,
            signers,
            bundle,
            dir,
            cfg,
            clock,
            audit: None,
            running: tokio::sync::Mutex::new(()),
            served: std::sync::Mutex::new(std::collections::HashMap::new()),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Records every CRL signed here as an audit event (`crl.issued`).
    pub fn with_audit(mut self, audit: AuditLog) -> Self {
        self.audit = Some(audit);
        self
    }

    /// Signs what is due for every key, then publishes every key's current CRL (bundle,
    /// files). Returns what is published. A key that cannot sign CRLs (a plugged-in CA
    /// without the cRLSign key usage) is logged and skipped.
    pub async fn refresh(&self) -> Result<Vec<PublishedCrl>, PublishError> {
        let _one = self.running.lock().await;
        // The mark first, then the list: the list then holds at least what the mark covers.
        let mark = self.store.revocation_mark().await?;
        let mut published = Vec::new();
        for ca in self.signers.crl_signers() {
            let key_id = ca.key_id().to_owned();
            if !valid_key_id(&key_id) {
                tracing::warn!(key_id, "CA key ID is not lowercase hex; no CRL for it");
                continue;
            }
            let now_t = self.clock.now();
            let now = unix(now_t);
            let stored = self.store.stored_crl(&key_id).await?;
            let mut extra = self.signers.extra_entries(&key_id);
            // What a root's CRL has listed as compromised stays listed, whatever the database
            // says now (a cleared taint, a deleted slot): a stolen intermediate stays cut off.
            for e in self.served_ca_compromises(&ca) {
                if !extra.iter().any(|x| x.serial == e.serial) {
                    tracing::error!(
                        key_id,
                        serial = %e.serial,
                        "an intermediate this root's CRL listed as compromised is no longer tainted in the database; it stays listed"
                    );
                    extra.push(e);
                }
            }
            let floor = self.served_floor(&key_id);
            let rolled_back = stored.as_ref().filter(|s| s.number < floor);
            if let Some(s) = rolled_back {
                tracing::error!(
                    key_id,
                    stored = s.number,
                    served = floor,
                    "the database holds an older CRL than this server has served; not serving it, signing a newer one"
                );
                if let Some(audit) = &self.audit {
                    audit.record(
                        "crl.rollback_refused",
                        "server",
                        format!(
                            "CA key {key_id}: the database's CRL is number {}, below number {floor} already served; it is not served, a newer one is signed",
                            s.number
                        ),
                        now,
                    );
                }
            }
            let lacking = rolled_back.is_some()
                || stored.as_ref().is_some_and(|s| !lists_all(&s.der, &extra));
            let current =
                if lacking || due(stored.as_ref(), mark, now, self.cfg.next_update).is_some() {
                    let mut revoked: Vec<RevokedEntry> = self
                        .store
                        .revoked_certificates(&key_id, now)
                        .await?
                        .iter()
                        .map(RevokedEntry::from_row)
                        .collect();
                    revoked.extend(extra.iter().cloned());
                    let next_update = self.cfg.next_update;
                    let failed = std::sync::Mutex::new(None);
                    let sign = |cur: Option<&StoredCrl>| -> Option<StoredCrl> {
                        // Under the lock: another replica may have signed meanwhile.
                        let number = number_to_sign(cur, mark, now, next_update, &extra, floor)?;
                        let next_t = now_t + next_update;
                        match sign_crl(&ca, &revoked, number, now_t, next_t, now_t) {
                            Ok(der) => Some(StoredCrl {
                                ca_key_id: key_id.clone(),
                                number,
                                der,
                                this_update: now,
                                next_update: unix(next_t),
                                mark,
                            }),
                            Err(e) => {
                                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                                None
                            }
                        }
                    };
                    let before = stored.as_ref().map(|s| s.number);
                    let current = self.store.refresh_crl(&key_id, &sign).await?;
                    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
                        tracing::warn!(key_id, error = %e, "cannot sign a CRL for this CA key");
                    }
                    if let Some(c) = &current
                        && Some(c.number) != before
                    {
                        let p = PublishedCrl::from_stored(c);
                        tracing::info!(
                            key_id,
                            number = p.number,
                            entries = p.entries,
                            "published a new CRL"
                        );
                        if let Some(audit) = &self.audit {
                            audit.record(
                                "crl.issued",
                                "server",
                                format!(
                                    "CRL {} of CA key {key_id}: {} revoked serials, next update {}",
                                    p.number, p.entries, p.next_update
                                ),
                                now,
                            );
                        }
                    }
                    current
                } else {
                    stored
                };
            match current {
                Some(c) if c.number >= floor => published.push(PublishedCrl::from_stored(&c)),
                // Never serve a number lower than one served: keep the one served.
                _ => published.extend(
                    self.bundle
                        .current()
                        .crls
                        .iter()
                        .find(|o| o.key_id == key_id)
                        .cloned(),
                ),
            }
        }
        {
            let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
            for c in &published {
                let n = served.entry(c.key_id.clone()).or_default();
                *n = (*n).max(c.number);
            }
        }
        self.publish(&published)?;
        Ok(published)
    }

    /// The highest CRL number served for `key_id`: remembered, or on first use read from the
    /// CRL file this server last wrote (so a restart keeps the floor).
    fn served_floor(&self, key_id: &str) -> u64 {
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        *served.entry(key_id.to_owned()).or_insert_with(|| {
            std::fs::read(self.dir.join(format!("{key_id}.crl")))
                .ok()
                .and_then(|der| crl_number(&der))
                .unwrap_or(0)
        })
    }

    /// The cACompromise entries of the CRL last served for the root `ca` (from memory, or the
    /// CRL file this server wrote); none for an intermediate.
    fn served_ca_compromises(&self, ca: &Authority) -> Vec<RevokedEntry> {
        let der = ca.cert_der();
        if crate::ca::authority::verify_issued_by(der, der).is_err() {
            return Vec::new();
        }
        let key_id = ca.key_id();
        let served = self
            .bundle
            .current()
            .crls
            .iter()
            .find(|c| c.key_id == key_id)
            .map(|c| c.der.clone())
            .or_else(|| std::fs::read(self.dir.join(format!("{key_id}.crl"))).ok());
        let Some(served) = served else {
            return Vec::new();
        };
        let Ok((_, crl)) = x509_parser::parse_x509_crl(&served) else {
            return Vec::new();
        };
        crl.iter_revoked_certificates()
            .filter(|r| {
                r.reason_code()
                    .is_some_and(|(_, c)| c == x509_parser::x509::ReasonCode::CACompromise)
            })
            .map(|r| RevokedEntry {
                serial: hex::encode(r.raw_serial()),
                revoked_at: r.revocation_date.timestamp(),
                reason: Reason::CA_COMPROMISE,
                not_after: i64::MAX,
            })
            .collect()
    }

    /// Refreshes at the next chance (the CA view changed: a taint, a revoked intermediate).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Writes the files that changed and hands the list to the bundle.
    fn publish(&self, crls: &[PublishedCrl]) -> Result<(), PublishError> {
        let old = self.bundle.current();
        let write_err = |path: &std::path::Path, error| PublishError::Write {
            path: path.display().to_string(),
            error,
        };
        if !crls.is_empty() {
            std::fs::create_dir_all(&self.dir).map_err(|e| write_err(&self.dir, e))?;
        }
        for c in crls {
            let unchanged = old
                .crls
                .iter()
                .any(|o| o.key_id == c.key_id && o.der == c.der);
            let path = self.dir.join(format!("{}.crl", c.key_id));
            if !unchanged || !path.exists() {
                write_atomic(&path, &c.der, 0o644).map_err(|e| write_err(&path, e))?;
            }
        }
        self.bundle.set_crls(crls.to_vec());
        Ok(())
    }

    /// Refreshes now, then at least every `crl.poll_interval` and whenever a CRL is due, until
    /// `stop` turns true. A failed refresh is logged and retried at the next tick.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            let wait = match self.refresh().await {
                Ok(crls) => {
                    let now = unix(self.clock.now());
                    let soonest = crls
                        .iter()
                        .map(|c| {
                            refresh_at(
                                &StoredCrl {
                                    ca_key_id: c.key_id.clone(),
                                    number: c.number,
                                    der: Vec::new(),
                                    this_update: c.this_update,
                                    next_update: c.next_update,
                                    mark: 0,
                                },
                                self.cfg.next_update,
                            )
                        })
                        .min()
                        .unwrap_or(i64::MAX);
                    let until_due = Duration::from_secs(
                        u64::try_from(soonest.saturating_sub(now)).unwrap_or(0),
                    );
                    self.cfg
                        .poll_interval
                        .min(until_due.max(Duration::from_millis(200)))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "CRL refresh failed; retrying");
                    self.cfg.poll_interval
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::ca::KeyType;
    use crate::ca::RandomSerials;
    use x509_parser::prelude::*;

    const T0: i64 = 1_800_000_000;

    fn root() -> Authority {
        let td = signet_types::TrustDomain::new("example.org").unwrap();
        Authority::generate_root(
            &td,
            KeyType::EcdsaP256,
            from_unix(T0 - 100),
            Duration::from_secs(86400 * 30),
            &RandomSerials::default(),
        )
        .unwrap()
        .0
    }

    fn entry(serial: &str, revoked_at: i64, reason: Reason, not_after: i64) -> RevokedEntry {
        RevokedEntry {
            serial: serial.into(),
            revoked_at,
            reason,
            not_after,
        }
    }

    #[test]
    fn a_crl_lists_its_entries_with_reasons_number_aki_and_window() {
        let ca = root();
        let entries = [
            entry("7f01a2", T0 - 50, Reason::KEY_COMPROMISE, T0 + 3600),
            // A serial whose first byte has the high bit set (DER adds a leading zero).
            entry("00c3d4", T0 - 40, Reason::SUPERSEDED, T0 + 3600),
            // Expired before now: it leaves the CRL.
            entry("77", T0 - 3000, Reason::CESSATION_OF_OPERATION, T0 - 1),
        ];
        let der = sign_crl(
            &ca,
            &entries,
            7,
            from_unix(T0),
            from_unix(T0 + 600),
            from_unix(T0),
        )
        .unwrap();
        let (_, crl) = parse_x509_crl(&der).unwrap();
        assert_eq!(crl.version(), Some(X509Version::V2));
        assert_eq!(crl.last_update().timestamp(), T0);
        assert_eq!(crl.next_update().unwrap().timestamp(), T0 + 600);
        assert_eq!(crl.crl_number().unwrap(), &7u32.into());
        // Signed by the CA key, issued in the CA's name.
        let (_, cert) = X509Certificate::from_der(ca.cert_der()).unwrap();
        assert_eq!(crl.issuer(), cert.subject());
        crl.verify_signature(cert.public_key()).unwrap();
        // The authority key identifier is the CA's subject key identifier.
        let ski = crate::ca::validate::subject_key_id(&cert).unwrap().to_vec();
        let aki = crl
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(a) => a.key_identifier.clone(),
                _ => None,
            })
            .unwrap();
        assert_eq!(aki.0, &ski[..]);
        assert_eq!(hex::encode(&ski), ca.key_id());
        let listed: Vec<(String, i64, Option<u8>)> = crl
            .iter_revoked_certificates()
            .map(|r| {
                (
                    hex::encode(r.raw_serial()),
                    r.revocation_date.timestamp(),
                    r.reason_code().map(|(_, c)| c.0),
                )
            })
            .collect();
        assert_eq!(
            listed,
            vec![
                ("7f01a2".to_owned(), T0 - 50, Some(1)),
                ("00c3d4".to_owned(), T0 - 40, Some(4)),
            ]
        );
    }

    #[test]
    fn an_empty_crl_is_valid_and_a_bad_window_or_serial_is_refused() {
        let ca = root();
        let der = sign_crl(
            &ca,
            &[],
            1,
            from_unix(T0),
            from_unix(T0 + 60),
            from_unix(T0),
        )
        .unwrap();
        let (_, crl) = parse_x509_crl(&der).unwrap();
        assert_eq!(crl.iter_revoked_certificates().count(), 0);
        assert_eq!(
            sign_crl(&ca, &[], 1, from_unix(T0), from_unix(T0), from_unix(T0)),
            Err(CrlError::Window)
        );
        let bad = [entry("zz", T0, Reason::UNSPECIFIED, T0 + 10)];
        assert!(matches!(
            sign_crl(
                &ca,
                &bad,
                1,
                from_unix(T0),
                from_unix(T0 + 1),
                from_unix(T0)
            ),
            Err(CrlError::Serial(_))
        ));
    }

    fn stored(number: u64, this_update: i64, next_update: i64, mark: u64) -> StoredCrl {
        StoredCrl {
            ca_key_id: "k".into(),
            number,
            der: vec![],
            this_update,
            next_update,
            mark,
        }
    }

    #[test]
    fn reissue_on_first_use_on_revocation_and_at_half_the_window() {
        let day = Duration::from_secs(86400);
        assert_eq!(due(None, 0, T0, day), Some(Due::First));
        let s = stored(3, T0, T0 + 86400, 10);
        // Nothing new, early in the window: keep it.
        assert_eq!(due(Some(&s), 10, T0 + 1, day), None);
        assert_eq!(due(Some(&s), 10, T0 + 43_199, day), None);
        // A revocation since: re-sign at once.
        assert_eq!(due(Some(&s), 11, T0 + 1, day), Some(Due::Revoked));
        // Half of next_update gone: re-sign.
        assert_eq!(due(Some(&s), 10, T0 + 43_200, day), Some(Due::Refresh));
        assert_eq!(refresh_at(&s, day), T0 + 43_200);
        // A shorter configured window than the stored CRL's applies at once.
        let short = Duration::from_secs(60);
        assert_eq!(due(Some(&s), 10, T0 + 30, short), Some(Due::Refresh));
        // Past its nextUpdate whatever the configuration says.
        let odd = stored(3, T0, T0 + 10, 10);
        assert_eq!(due(Some(&odd), 10, T0 + 10, day), Some(Due::Refresh));
        assert_eq!(refresh_at(&odd, day), T0 + 10);
    }

    #[test]
    fn under_the_lock_a_stale_view_never_replaces_a_newer_crl() {
        let day = Duration::from_secs(86400);
        assert_eq!(number_to_sign(None, 0, T0, day, &[], 0), Some(1));
        let s = stored(3, T0, T0 + 86400, 10);
        assert_eq!(number_to_sign(Some(&s), 10, T0 + 1, day, &[], 0), None);
        assert_eq!(number_to_sign(Some(&s), 11, T0 + 1, day, &[], 0), Some(4));
        assert_eq!(
            number_to_sign(Some(&s), 10, T0 + 43_200, day, &[], 0),
            Some(4)
        );
        // Another replica signed with mark 10 while we read mark 9 and its revoked list: even
        // when a refresh is due by time, ours would lack revocation 10.
        assert_eq!(number_to_sign(Some(&s), 9, T0 + 43_200, day, &[], 0), None);
    }

    #[test]
    fn key_ids_are_safe_path_segments() {
        assert!(valid_key_id("0a1b2c"));
        for bad in ["", "../x", "AB", "a/b", "a.crl"] {
            assert!(!valid_key_id(bad), "{bad}");
        }
    }

    /// The publisher against a real SQLite store with an injected clock: numbers increase
    /// across re-issues and restarts (a second publisher on the same database), a revocation
    /// re-issues, time re-issues at half the window, and the bundle and the file follow.
    #[tokio::test]
    async fn the_publisher_numbers_increase_and_reissue_follows_the_clock() {
        use crate::clock::fake::FakeClock;
        use crate::store::{NewCertificate, NewRevocation, SqliteStore, Store};
        let dir = tempfile::tempdir().unwrap();
        let url = signet_testutil::sqlite_url(dir.path());
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::connect(&url, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        let ca = Arc::new(root());
        struct One(Arc<Authority>);
        impl CrlSigners for One {
            fn crl_signers(&self) -> Vec<Arc<Authority>> {
                vec![self.0.clone()]
            }
        }
        let td = signet_types::TrustDomain::new("example.org").unwrap();
        let bundle = BundleHandle::new(
            crate::bundle::Bundle {
                trust_domain: td,
                roots: vec![ca.cert_der().to_vec()],
                tainted_key_ids: Vec::new(),
                jwt_keys: Vec::new(),
                revision: 1,
                crls: Vec::new(),
            },
            dir.path().join("bundle.pem"),
        )
        .unwrap();
        let clock = Arc::new(FakeClock::at_unix(T0));
        let cfg = CrlConfig {
            next_update: Duration::from_secs(600),
            poll_interval: Duration::from_secs(1),
        };
        let crl_dir = dir.path().join("crl");
        let publisher = |clock: Arc<FakeClock>| {
            CrlPublisher::new(
                store.clone(),
                Arc::new(One(ca.clone())),
                bundle.clone(),
                crl_dir.clone(),
                cfg.clone(),
                clock,
            )
        };
        let p = publisher(clock.clone());
        let first = p.refresh().await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].number, first[0].entries), (1, 0));
        let file = crl_dir.join(format!("{}.crl", ca.key_id()));
        assert_eq!(std::fs::read(&file).unwrap(), first[0].der);
        assert_eq!(bundle.current().crls, first);
        let rev = bundle.current().revision;

        // Nothing due: the same CRL, no new bundle revision.
        clock.advance(Duration::from_secs(10));
        assert_eq!(p.refresh().await.unwrap(), first);
        assert_eq!(bundle.current().revision, rev);

        // A revocation: a new CRL at once, listing it.
        let cert = NewCertificate {
            serial: "8f01".into(),
            spiffe_id: "spiffe://example.org/w".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            not_before: T0 - 10,
            not_after: T0 + 3600,
            cert_sha256: [3; 32],
            ca_key_id: ca.key_id().into(),
            caller: "test".into(),
            issued_at: T0 - 10,
            request_id: "r".into(),
            cert_der: vec![1],
            provenance: String::new(),
        };
        store.append_certificates(&[cert]).await.unwrap();
        store
            .append_revocations(&[NewRevocation {
                serial: "8f01".into(),
                reason: "keyCompromise".into(),
                at: T0 + 10,
                caller: "admin".into(),
                request_id: "r".into(),
                detail: "{}".into(),
            }])
            .await
            .unwrap();
        let second = p.refresh().await.unwrap();
        assert_eq!((second[0].number, second[0].entries), (2, 1));
        assert_eq!(second[0].this_update, T0 + 10);
        assert!(bundle.current().revision > rev);
        assert_eq!(std::fs::read(&file).unwrap(), second[0].der);

        // A restarted server (a new publisher on the same database) keeps the number.
        let again = publisher(clock.clone());
        assert_eq!(again.refresh().await.unwrap(), second);
        // Half the window later: re-issued with the next number.
        clock.advance(Duration::from_secs(300));
        let third = again.refresh().await.unwrap();
        assert_eq!((third[0].number, third[0].entries), (3, 1));
        assert_eq!(third[0].next_update, T0 + 310 + 600);
        // Once the certificate expires, its entry leaves at the next re-issue.
        clock.advance(Duration::from_secs(3600));
        let fourth = p.refresh().await.unwrap();
        assert_eq!((fourth[0].number, fourth[0].entries), (4, 0));

        // Someone with database access writes an older, validly signed CRL (number 2, listing
        // the revoked certificate... or not) back: it is never served again, by this server or
        // after a restart (the floor comes from the CRL file it wrote), and a newer one is
        // signed above the highest number served.
        let mark = store.revocation_mark().await.unwrap();
        let older = StoredCrl {
            ca_key_id: ca.key_id().into(),
            number: second[0].number,
            der: second[0].der.clone(),
            this_update: unix(clock.now()),
            next_update: unix(clock.now()) + 600,
            mark,
        };
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query(
            "UPDATE crl_state SET number = $1, der = $2, this_update = $3, next_update = $4, \
             mark = $5 WHERE ca_key_id = $6",
        )
        .bind(i64::try_from(older.number).unwrap())
        .bind(&older.der)
        .bind(older.this_update)
        .bind(older.next_update)
        .bind(i64::try_from(older.mark).unwrap())
        .bind(ca.key_id())
        .execute(&pool)
        .await
        .unwrap();
        let restarted = publisher(clock.clone());
        let fifth = restarted.refresh().await.unwrap();
        assert_eq!(fifth[0].number, 5, "never below the 4 already served");
        assert_eq!(std::fs::read(&file).unwrap(), fifth[0].der);
        assert_eq!(bundle.current().crls, fifth);
    }
}
