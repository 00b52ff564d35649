//! What the agent knows about compromised certificates, from the server's bundle: the CA keys
//! the operator tainted and each issuing CA's CRL. Pure: no I/O, no clock.
//!
//! - A **taint** names a CA key (its subject key identifier); a certificate whose authority key
//!   identifier is that key is replaced now ([`crate::rotation::renewal_due`]).
//! - A **CRL** is accepted only when its signature verifies with the CA certificate it names
//!   (an issuer the agent learnt from its bundle roots and the chains it holds, [`Issuers`]),
//!   its issuer name and authority key identifier agree with that certificate, and its CRL
//!   number is higher than the one kept for that key: a replayed older CRL never un-revokes a
//!   certificate. A CRL that fails any check is ignored, logged and counted; the previous one
//!   stays. A certificate whose serial is listed is replaced now.
//!
//! The accepted CRLs are what the Workload API serves (`crl` fields) and the sinks write
//! (`crl.pem`); they are persisted in `data_dir` (see [`crate::node::save_crls`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::SystemTime;

use signet_pki::{CrlError, ParsedCert, ParsedCrl};

use crate::ca::Crl;

/// Most CA certificates remembered as CRL issuers.
pub const MAX_ISSUERS: usize = 256;

/// What the revocation checks need of a certificate the agent holds: the key that issued it
/// and its serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRef {
    /// The issuing key (the leaf's authority key identifier, lowercase hex); `None` when the
    /// certificate carries none (then no taint can name it, but its CRL can still list it).
    pub issuer_key_id: Option<String>,
    /// The issuer's name (raw DER), to find its CRL when there is no AKI.
    pub issuer_name: Vec<u8>,
    serial: Vec<u8>,
    /// For logs: the serial as lowercase hex.
    pub serial_hex: String,
    /// The CA certificates the chain carries above the leaf (its intermediates), each with
    /// its own issuing key and serial, so that a root's CRL listing one of them (a revoked
    /// intermediate) names every certificate under it. Empty for a CA certificate itself.
    pub cas: Vec<CertRef>,
}

impl CertRef {
    /// Reads a DER certificate; `None` if it does not parse ([`ParsedCert::from_der`]).
    pub fn parse(der: &[u8]) -> Option<Self> {
        Some(Self::of(&ParsedCert::from_der(der).ok()?))
    }

    /// What the checks need of a certificate already read.
    pub fn of(cert: &ParsedCert) -> Self {
        Self {
            issuer_key_id: cert.authority_key_id().map(str::to_owned),
            issuer_name: cert.issuer_der().to_vec(),
            serial: cert.serial().to_vec(),
            serial_hex: cert.serial_hex().to_owned(),
            cas: Vec::new(),
        }
    }

    /// Reads a DER chain, leaf first, with the CA certificates above it; `None` if the leaf
    /// does not parse (a CA certificate that does not parse is left out: no CRL can name it,
    /// and the chain would not verify anyway).
    pub fn parse_chain(chain: &[Vec<u8>]) -> Option<Self> {
        let (leaf, cas) = chain.split_first()?;
        Some(Self {
            cas: cas.iter().filter_map(|der| Self::parse(der)).collect(),
            ..Self::parse(leaf)?
        })
    }
}

/// Why a held certificate must be replaced now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compromise {
    /// Issued under a key the operator tainted.
    Tainted { key_id: String },
    /// Listed in its issuer's CRL.
    Revoked { key_id: String, crl_number: u64 },
    /// A CA certificate of its chain (an intermediate) is listed in its issuer's (a root's)
    /// CRL: everything it signed is cut off for relying parties that check the chain.
    CaRevoked {
        serial_hex: String,
        key_id: String,
        crl_number: u64,
    },
}

impl fmt::Display for Compromise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compromise::Tainted { key_id } => write!(f, "issued under tainted CA key {key_id}"),
            Compromise::Revoked { key_id, crl_number } => {
                write!(f, "revoked (CRL {crl_number} of CA key {key_id})")
            }
            Compromise::CaRevoked {
                serial_hex,
                key_id,
                crl_number,
            } => write!(
                f,
                "its issuing CA certificate {serial_hex} is revoked (CRL {crl_number} of CA key \
                 {key_id})"
            ),
        }
    }
}

/// A CA certificate that may sign CRLs.
#[derive(Clone, PartialEq, Eq)]
struct Issuer {
    cert: ParsedCert,
}

/// The CA certificates the agent knows by key ID: its bundle roots and the intermediates in
/// the chains it holds or held (kept until they expire, at most [`MAX_ISSUERS`]), so the CRL
/// of an intermediate the agent no longer uses still verifies.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Issuers(BTreeMap<String, Issuer>);

impl fmt::Debug for Issuers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Issuers {
    /// Remembers every CA certificate among `ders` that has a subject key identifier.
    pub fn learn<'a>(&mut self, ders: impl IntoIterator<Item = &'a Vec<u8>>) {
        for der in ders {
            let Ok(cert) = ParsedCert::from_der(der) else {
                continue;
            };
            if !cert.is_ca() {
                continue;
            }
            let Some(ski) = cert.subject_key_id().map(str::to_owned) else {
                continue;
            };
            let issuer = Issuer { cert };
            if self.0.len() >= MAX_ISSUERS && !self.0.contains_key(&ski) {
                // Forget the one expiring first.
                if let Some(k) = self
                    .0
                    .iter()
                    .min_by_key(|(_, i)| i.cert.not_after())
                    .map(|(k, _)| k.clone())
                {
                    self.0.remove(&k);
                }
            }
            self.0.insert(ski, issuer);
        }
    }

    /// Forgets issuers expired at `now` (their certificates are all expired too).
    pub fn prune(&mut self, now: SystemTime) {
        self.0.retain(|_, i| i.cert.not_after() > now);
    }

    pub fn knows(&self, key_id: &str) -> bool {
        self.0.contains_key(key_id)
    }
}

/// A CRL that passed every check.
#[derive(Clone, PartialEq, Eq)]
pub struct AcceptedCrl {
    pub key_id: String,
    pub der: Vec<u8>,
    pub number: u64,
    issuer_name: Vec<u8>,
    pub this_update: SystemTime,
    pub next_update: Option<SystemTime>,
    revoked: BTreeSet<Vec<u8>>,
}

impl fmt::Debug for AcceptedCrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcceptedCrl")
            .field("key_id", &self.key_id)
            .field("number", &self.number)
            .field("revoked", &self.revoked.len())
            .finish()
    }
}

impl AcceptedCrl {
    pub fn revoked_count(&self) -> usize {
        self.revoked.len()
    }
}

/// Why a CRL was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CrlRejected {
    #[error("CRL of key {0}: {1}")]
    Malformed(String, String),
    /// No CA certificate with that key ID is known (yet): it cannot be verified.
    #[error(
        "CRL of key {0}: no CA certificate with that key ID is known, so it cannot be verified"
    )]
    UnknownIssuer(String),
    #[error("CRL of key {0}: {1}")]
    Mismatch(String, String),
    #[error("CRL of key {0}: the signature does not verify with that CA's key")]
    BadSignature(String),
    /// Not newer than the CRL kept: a replay or an older replica's; ignored.
    #[error("CRL of key {key_id}: number {number} is not above the {kept} already kept")]
    NotNewer {
        key_id: String,
        number: u64,
        kept: u64,
    },
}

impl CrlRejected {
    /// The `reason` label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            CrlRejected::Malformed(..) => "malformed",
            CrlRejected::UnknownIssuer(_) => "unknown_issuer",
            CrlRejected::Mismatch(..) => "mismatch",
            CrlRejected::BadSignature(_) => "bad_signature",
            CrlRejected::NotNewer { .. } => "not_newer",
        }
    }
}

/// Parses `der` as a CRL and checks it against the CA known as `key_id` (when `issuers` is
/// given; `None` skips the signature check, for CRLs the agent itself persisted).
fn check(key_id: &str, der: &[u8], issuers: Option<&Issuers>) -> Result<AcceptedCrl, CrlRejected> {
    let malformed = |why: String| CrlRejected::Malformed(key_id.to_owned(), why);
    let crl = ParsedCrl::from_der(der).map_err(|e| malformed(e.to_string()))?;
    let number = crl
        .number()
        .ok_or_else(|| malformed("no CRL number extension".into()))?;
    if let Some(aki) = crl.authority_key_id()
        && aki != key_id
    {
        return Err(CrlRejected::Mismatch(
            key_id.to_owned(),
            format!("its authority key identifier is {aki}"),
        ));
    }
    if let Some(issuers) = issuers {
        let issuer = issuers
            .0
            .get(key_id)
            .ok_or_else(|| CrlRejected::UnknownIssuer(key_id.to_owned()))?;
        crl.verify(&issuer.cert).map_err(|e| match e {
            CrlError::IssuerMismatch => CrlRejected::Mismatch(key_id.to_owned(), e.to_string()),
            CrlError::BadSignature => CrlRejected::BadSignature(key_id.to_owned()),
            other => malformed(other.to_string()),
        })?;
    }
    Ok(AcceptedCrl {
        key_id: key_id.to_owned(),
        number,
        issuer_name: crl.issuer_der().to_vec(),
        this_update: crl.this_update(),
        next_update: crl.next_update(),
        revoked: crl.entries().keys().cloned().collect(),
        der: crl.into_der(),
    })
}

/// The taints and CRLs in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocations {
    tainted: BTreeSet<String>,
    crls: BTreeMap<String, AcceptedCrl>,
}

impl Revocations {
    /// Replaces the tainted key IDs (the bundle carries the full current set). Returns whether
    /// they changed.
    pub fn set_tainted(&mut self, ids: &[String]) -> bool {
        let next: BTreeSet<String> = ids.iter().cloned().collect();
        if next == self.tainted {
            return false;
        }
        self.tainted = next;
        true
    }

    pub fn tainted(&self) -> impl Iterator<Item = &str> {
        self.tainted.iter().map(String::as_str)
    }

    /// Checks `crl` and keeps it if it verifies and is newer than the one kept for its key.
    /// `Ok(false)`: the same CRL as kept (same number and bytes), nothing changed.
    pub fn offer(&mut self, crl: &Crl, issuers: &Issuers) -> Result<bool, CrlRejected> {
        if let Some(kept) = self.crls.get(&crl.key_id)
            && kept.der == crl.der
        {
            return Ok(false);
        }
        let accepted = check(&crl.key_id, &crl.der, Some(issuers))?;
        self.keep(accepted)
    }

    /// Restores a CRL the agent persisted itself (checked when it was received): parsed, not
    /// verified again, and kept only if newer.
    pub fn restore(&mut self, der: &[u8]) -> Result<bool, CrlRejected> {
        let crl = ParsedCrl::from_der(der)
            .map_err(|e| CrlRejected::Malformed("?".into(), e.to_string()))?;
        let key_id = crl.authority_key_id().map(str::to_owned).ok_or_else(|| {
            CrlRejected::Malformed("?".into(), "no authority key identifier".into())
        })?;
        let accepted = check(&key_id, der, None)?;
        self.keep(accepted)
    }

    fn keep(&mut self, accepted: AcceptedCrl) -> Result<bool, CrlRejected> {
        if let Some(kept) = self.crls.get(&accepted.key_id)
            && accepted.number <= kept.number
        {
            return Err(CrlRejected::NotNewer {
                key_id: accepted.key_id,
                number: accepted.number,
                kept: kept.number,
            });
        }
        self.crls.insert(accepted.key_id.clone(), accepted);
        Ok(true)
    }

    /// Drops the CRLs of keys whose certificates are all expired (issuer certificate gone and
    /// the CRL's next update long past is not enough reason: only an explicit `retain`).
    pub fn retain_crls(&mut self, keep: impl Fn(&AcceptedCrl) -> bool) -> bool {
        let before = self.crls.len();
        self.crls.retain(|_, c| keep(c));
        before != self.crls.len()
    }

    /// The accepted CRLs, DER, ordered by key ID.
    pub fn crls_der(&self) -> Vec<Vec<u8>> {
        self.crls.values().map(|c| c.der.clone()).collect()
    }

    pub fn crls(&self) -> impl Iterator<Item = &AcceptedCrl> {
        self.crls.values()
    }

    /// Why `cert` must be replaced now, if it must: its issuing key is tainted, its issuer's
    /// CRL lists it, or a CRL lists a CA certificate of its chain (a root's CRL listing the
    /// intermediate that signed it).
    pub fn check(&self, cert: &CertRef) -> Option<Compromise> {
        if let Some(k) = &cert.issuer_key_id
            && self.tainted.contains(k)
        {
            return Some(Compromise::Tainted { key_id: k.clone() });
        }
        if let Some(crl) = self.listing(cert) {
            return Some(Compromise::Revoked {
                key_id: crl.key_id.clone(),
                crl_number: crl.number,
            });
        }
        cert.cas.iter().find_map(|ca| {
            self.listing(ca).map(|crl| Compromise::CaRevoked {
                serial_hex: ca.serial_hex.clone(),
                key_id: crl.key_id.clone(),
                crl_number: crl.number,
            })
        })
    }

    /// The CRL of `cert`'s issuer, when it lists `cert`.
    /// Without a key identifier the issuer is known only by name, which two CA keys (a root
    /// and its successor, rotated intermediates) share: any CRL of that name listing the serial
    /// counts.
    fn listing(&self, cert: &CertRef) -> Option<&AcceptedCrl> {
        match &cert.issuer_key_id {
            Some(k) => self
                .crls
                .get(k)
                .filter(|crl| crl.revoked.contains(&cert.serial)),
            None => self
                .crls
                .values()
                .find(|c| c.issuer_name == cert.issuer_name && c.revoked.contains(&cert.serial)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestCa;
    use std::time::Duration;

    fn issuers(cas: &[&TestCa]) -> Issuers {
        let mut i = Issuers::default();
        let ders: Vec<Vec<u8>> = cas.iter().map(|c| c.der.clone()).collect();
        i.learn(&ders);
        i
    }

    fn t0() -> SystemTime {
        signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock)
            - Duration::from_secs(10)
    }

    #[test]
    fn a_leaf_names_its_issuing_key_and_serial() {
        let ca = TestCa::new("ca");
        let (leaf, _) = ca.leaf(
            "spiffe://example.org/a",
            0x80_01,
            t0(),
            Duration::from_secs(60),
        );
        let r = CertRef::parse(&leaf).expect("parse");
        assert_eq!(r.issuer_key_id.as_deref(), Some(ca.key_id.as_str()));
        assert_eq!(
            r.serial_hex, "8001",
            "leading zero of the DER integer dropped"
        );
        assert!(CertRef::parse(b"junk").is_none());
    }

    #[test]
    fn a_taint_names_every_certificate_of_that_key_only() {
        let (a, b) = (TestCa::new("a"), TestCa::new("b"));
        let mut rev = Revocations::default();
        assert!(rev.set_tainted(std::slice::from_ref(&a.key_id)));
        assert!(
            !rev.set_tainted(std::slice::from_ref(&a.key_id)),
            "unchanged"
        );
        let under_a = CertRef::parse(
            &a.leaf("spiffe://x.org/1", 1, t0(), Duration::from_secs(60))
                .0,
        );
        let under_b = CertRef::parse(
            &b.leaf("spiffe://x.org/1", 1, t0(), Duration::from_secs(60))
                .0,
        );
        assert_eq!(
            rev.check(&under_a.expect("a")),
            Some(Compromise::Tainted {
                key_id: a.key_id.clone()
            })
        );
        assert_eq!(rev.check(&under_b.expect("b")), None);
        assert!(rev.set_tainted(&[]));
    }

    #[test]
    fn a_verified_crl_revokes_its_serials() {
        let ca = TestCa::new("ca");
        let iss = issuers(&[&ca]);
        let mut rev = Revocations::default();
        assert_eq!(rev.offer(&ca.crl_msg(1, &[7]), &iss), Ok(true));
        let listed = CertRef::parse(
            &ca.leaf("spiffe://x.org/a", 7, t0(), Duration::from_secs(60))
                .0,
        )
        .expect("leaf");
        let other = CertRef::parse(
            &ca.leaf("spiffe://x.org/a", 8, t0(), Duration::from_secs(60))
                .0,
        )
        .expect("leaf");
        assert_eq!(
            rev.check(&listed),
            Some(Compromise::Revoked {
                key_id: ca.key_id.clone(),
                crl_number: 1
            })
        );
        assert_eq!(rev.check(&other), None);
        assert_eq!(rev.crls_der().len(), 1);
        // The same CRL again changes nothing.
        let same = Crl {
            der: rev.crls_der().remove(0),
            ..ca.crl_msg(1, &[7])
        };
        assert_eq!(rev.offer(&same, &iss), Ok(false));
    }

    /// A certificate without an authority key identifier is found by its issuer's name, which
    /// two CA keys can share: every CRL of that name is asked, not the first one found.
    #[test]
    fn without_a_key_identifier_every_crl_of_the_issuers_name_is_asked() {
        let (old, new) = (TestCa::new("ca"), TestCa::new("ca"));
        let iss = issuers(&[&old, &new]);
        let mut rev = Revocations::default();
        assert_eq!(rev.offer(&old.crl_msg(1, &[1]), &iss), Ok(true));
        assert_eq!(rev.offer(&new.crl_msg(1, &[7]), &iss), Ok(true));
        for (ca, serial) in [(&new, 7), (&old, 1)] {
            let mut cert = CertRef::parse(
                &ca.leaf("spiffe://x.org/a", serial, t0(), Duration::from_secs(60))
                    .0,
            )
            .expect("leaf");
            cert.issuer_key_id = None;
            assert_eq!(
                rev.check(&cert),
                Some(Compromise::Revoked {
                    key_id: ca.key_id.clone(),
                    crl_number: 1
                }),
                "serial {serial}"
            );
        }
    }

    #[test]
    fn a_crl_that_does_not_verify_is_refused_and_the_old_one_kept() {
        let (ca, evil) = (TestCa::new("ca"), TestCa::new("ca"));
        let iss = issuers(&[&ca]);
        let mut rev = Revocations::default();
        rev.offer(&ca.crl_msg(1, &[7]), &iss).expect("good");
        // Signed by another key under the same name, claiming to be ca's.
        let forged = Crl {
            key_id: ca.key_id.clone(),
            ..evil.crl_msg(5, &[])
        };
        let err = rev.offer(&forged, &iss).expect_err("forged");
        assert!(
            matches!(
                err,
                CrlRejected::Mismatch(..) | CrlRejected::BadSignature(_)
            ),
            "{err}"
        );
        // Same AKI and name, other key: the signature decides.
        let mut tampered = ca.crl(6, &[]);
        let n = tampered.len();
        tampered[n - 3] ^= 0x55;
        let err = rev
            .offer(
                &Crl {
                    key_id: ca.key_id.clone(),
                    der: tampered,
                    number: 6,
                },
                &iss,
            )
            .expect_err("tampered");
        assert!(
            matches!(
                err,
                CrlRejected::BadSignature(_) | CrlRejected::Malformed(..)
            ),
            "{err}"
        );
        // An issuer the agent does not know.
        let err = rev.offer(&evil.crl_msg(1, &[]), &iss).expect_err("unknown");
        assert_eq!(err, CrlRejected::UnknownIssuer(evil.key_id.clone()));
        assert_eq!(err.label(), "unknown_issuer");
        assert!(
            rev.offer(
                &Crl {
                    der: b"junk".to_vec(),
                    ..ca.crl_msg(9, &[])
                },
                &iss
            )
            .is_err()
        );
        let listed = CertRef::parse(
            &ca.leaf("spiffe://x.org/a", 7, t0(), Duration::from_secs(60))
                .0,
        )
        .expect("leaf");
        assert!(
            rev.check(&listed).is_some(),
            "the verified CRL is still in force"
        );
    }

    #[test]
    fn a_lower_crl_number_is_ignored() {
        let ca = TestCa::new("ca");
        let iss = issuers(&[&ca]);
        let mut rev = Revocations::default();
        rev.offer(&ca.crl_msg(5, &[7]), &iss).expect("5");
        let err = rev.offer(&ca.crl_msg(4, &[]), &iss).expect_err("older");
        assert_eq!(
            err,
            CrlRejected::NotNewer {
                key_id: ca.key_id.clone(),
                number: 4,
                kept: 5
            }
        );
        assert!(
            rev.offer(&ca.crl_msg(5, &[]), &iss).is_err(),
            "same number, other content"
        );
        let listed = CertRef::parse(
            &ca.leaf("spiffe://x.org/a", 7, t0(), Duration::from_secs(60))
                .0,
        )
        .expect("leaf");
        assert!(rev.check(&listed).is_some(), "never un-revoked by a replay");
        assert_eq!(rev.offer(&ca.crl_msg(6, &[7, 8]), &iss), Ok(true));
        assert_eq!(rev.crls().next().map(|c| c.revoked_count()), Some(2));
    }

    /// A root's CRL and its intermediate's, side by side (one per CA key, as the server
    /// publishes them): both kept and served; the root's listing the intermediate names every
    /// chain through it, the intermediate's listing a leaf names that leaf only.
    #[test]
    fn a_roots_crl_listing_an_intermediate_names_every_chain_under_it() {
        let root = TestCa::new("root");
        let (inter, other) = (
            root.intermediate("old", 0x51),
            root.intermediate("new", 0x52),
        );
        let iss = issuers(&[&root, &inter, &other]);
        let chain = |ca: &TestCa, serial: u64| {
            let (leaf, _) = ca.leaf("spiffe://x.org/a", serial, t0(), Duration::from_secs(60));
            CertRef::parse_chain(&[leaf, ca.der.clone()]).expect("chain")
        };
        let (under_old, under_new) = (chain(&inter, 7), chain(&other, 8));
        assert_eq!(under_old.cas.len(), 1);
        assert_eq!(under_old.cas[0].serial_hex, "51");
        assert_eq!(
            under_old.cas[0].issuer_key_id.as_deref(),
            Some(root.key_id.as_str())
        );
        let mut rev = Revocations::default();
        assert_eq!(rev.offer(&inter.crl_msg(1, &[9]), &iss), Ok(true));
        assert_eq!(rev.offer(&root.crl_msg(1, &[]), &iss), Ok(true));
        assert_eq!(
            rev.crls_der().len(),
            2,
            "one per CA key, the root's included"
        );
        assert_eq!(rev.check(&under_old), None);
        // The root revokes the old intermediate.
        assert_eq!(rev.offer(&root.crl_msg(2, &[0x51]), &iss), Ok(true));
        assert_eq!(
            rev.check(&under_old),
            Some(Compromise::CaRevoked {
                serial_hex: "51".into(),
                key_id: root.key_id.clone(),
                crl_number: 2
            })
        );
        assert!(rev.check(&under_old).is_some_and(|c| {
            c.to_string()
                .contains("issuing CA certificate 51 is revoked")
        }));
        assert_eq!(
            rev.check(&under_new),
            None,
            "the other intermediate's chains"
        );
        // The leaf's own CRL still decides first.
        assert_eq!(rev.offer(&other.crl_msg(1, &[8]), &iss), Ok(true));
        assert_eq!(
            rev.check(&under_new),
            Some(Compromise::Revoked {
                key_id: other.key_id.clone(),
                crl_number: 1
            })
        );
        assert_eq!(rev.crls_der().len(), 3);
        // A leaf alone (no chain) is only named by its own CRL.
        assert!(CertRef::parse_chain(&[]).is_none());
        let (leaf, _) = inter.leaf("spiffe://x.org/a", 7, t0(), Duration::from_secs(60));
        assert_eq!(rev.check(&CertRef::parse(&leaf).expect("leaf")), None);
    }

    #[test]
    fn persisted_crls_are_restored_by_their_aki() {
        let ca = TestCa::new("ca");
        let mut rev = Revocations::default();
        assert_eq!(rev.restore(&ca.crl(3, &[1])), Ok(true));
        assert_eq!(
            rev.crls().next().map(|c| (c.key_id.clone(), c.number)),
            Some((ca.key_id.clone(), 3))
        );
        assert!(rev.restore(&ca.crl(2, &[])).is_err());
        assert!(rev.restore(b"junk").is_err());
    }

    #[test]
    fn issuers_learn_only_ca_certificates_and_forget_expired_ones() {
        let ca = TestCa::new("ca");
        let (leaf, _) = ca.leaf("spiffe://x.org/a", 1, t0(), Duration::from_secs(60));
        let mut i = Issuers::default();
        i.learn(&[leaf, ca.der.clone(), b"junk".to_vec()]);
        assert!(i.knows(&ca.key_id));
        assert_eq!(i.0.len(), 1);
        i.prune(
            signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock)
                + Duration::from_secs(2 * 86_400),
        );
        assert!(!i.knows(&ca.key_id));
    }
}
