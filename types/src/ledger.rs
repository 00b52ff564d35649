//! The issuance ledger's canonical record encoding and hash chain.
//!
//! Each ledger row stores `hash = SHA-256(DOMAIN || prev_hash || encode(entry))`, where
//! `prev_hash` is the hash of the row before it (all zeroes for the first row). Altering,
//! removing or reordering any row changes every hash after it, so an auditor holding the
//! head hash can prove the ledger intact. The encoding is length-prefixed and fixed here:
//! the server that writes the chain and `signetctl ledger verify` both call this module.
//!
//! Two row formats share the chain. A row with an empty `provenance` (written before provenance
//! was recorded) hashes as `signet-ledger-v1`; every row written since carries its provenance
//! (where the certificate's authority came from, see the server's `provenance` module) and hashes
//! as `signet-ledger-v2`, which covers the provenance too. Blanking a row's provenance to pass it
//! off as an old row changes its hash, so it is detected like any other alteration.
//!
//! The chain also holds *events*: things that happen to a certificate after it was issued (a
//! revocation). An event is appended, never edited into the certificate's row; it takes the next
//! `seq` of the same chain (certificates and events share one total order and one head) and
//! hashes as `signet-ledger-event-v1` ([`event_hash`]), a domain of its own, so no event can be
//! passed off as a certificate row or the reverse. An event names the row it is about by serial,
//! `seq` and chain hash, and must come after it.
//!
//! And it holds *JWT-SVIDs*: a bearer token is a credential like a certificate, so every token
//! the server mints is a row of the same chain ([`JwtSvidEntry`]), hashed under a domain of its
//! own (`signet-ledger-jwt-v1`, [`jwt_hash`]). The row commits to the token's SHA-256, never the
//! token: the ledger proves what was issued without becoming a store of live credentials.

use ring::digest;

/// A SHA-256 chain hash.
pub type Hash = [u8; 32];

/// The hash that precedes the first row.
pub const GENESIS: Hash = [0u8; 32];

const DOMAIN_V1: &[u8] = b"signet-ledger-v1\0";
const DOMAIN_V2: &[u8] = b"signet-ledger-v2\0";
const DOMAIN_EVENT_V1: &[u8] = b"signet-ledger-event-v1\0";
const DOMAIN_JWT_V1: &[u8] = b"signet-ledger-jwt-v1\0";

/// [`LedgerEvent::kind`] of a revocation.
pub const EVENT_REVOKE: &str = "revoke";

/// Everything a ledger row commits to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Position in the chain, starting at 1, without gaps.
    pub seq: u64,
    /// Certificate serial number, lowercase hex of the DER integer's content.
    pub serial: String,
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub not_after: i64,
    /// SHA-256 of the certificate's DER.
    pub cert_sha256: Hash,
    /// Which CA key signed it.
    pub ca_key_id: String,
    /// Who asked for it, as authenticated (e.g. `jwt:spiffe://…`, `mtls:spiffe://…`).
    pub caller: String,
    /// Unix seconds when the server issued it.
    pub issued_at: i64,
    pub request_id: String,
    /// Where the authority for the certificate came from (canonical JSON); empty only on rows
    /// written before provenance was recorded.
    pub provenance: String,
}

impl LedgerEntry {
    /// The recorded provenance, `None` on rows written before provenance was recorded.
    pub fn recorded_provenance(&self) -> Option<&str> {
        (!self.provenance.is_empty()).then_some(self.provenance.as_str())
    }
}

/// When and why a certificate was revoked: the lookup index a certificate's row carries beside
/// what it commits to. The record itself is the revocation event later in the chain
/// ([`LedgerEvent`]); this is not covered by the row's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// Unix seconds.
    pub at: i64,
    /// The RFC 5280 CRLReason by name (`keyCompromise`, `superseded`, …), as recorded.
    pub reason: String,
}

/// One certificate row of the ledger as stored and as listed: what it commits to, where it sits
/// in the chain, the certificate itself, and its revocation if it was revoked. The server's
/// store reads it, the admin API sends it (`CertificateRecord`), and the client converts it back
/// once; `signetctl` lists it and recomputes its hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRecord {
    pub entry: LedgerEntry,
    /// The stored hash of the row before it ([`GENESIS`] for the first).
    pub prev_hash: Hash,
    /// The stored chain hash of this row.
    pub hash: Hash,
    /// The certificate, DER; its SHA-256 should be `entry.cert_sha256`.
    pub cert_der: Vec<u8>,
    /// Set when it was revoked (not part of the row's hash, see [`Revocation`]).
    pub revocation: Option<Revocation>,
}

impl LedgerRecord {
    /// Whether the stored certificate is the one the entry records (its SHA-256).
    pub fn holds_its_certificate(&self) -> bool {
        sha256(&self.cert_der) == self.entry.cert_sha256
    }

    /// Whether the row is intact on its own: it holds its certificate and its content chained
    /// onto its stored previous hash gives its stored hash. (Whether the previous hash is the
    /// row before's is [`Verifier`]'s to check.)
    pub fn hashes_to_itself(&self) -> bool {
        self.holds_its_certificate() && chain_hash(&self.prev_hash, &self.entry) == self.hash
    }
}

fn put(ctx: &mut digest::Context, bytes: &[u8]) {
    ctx.update(&(bytes.len() as u64).to_be_bytes());
    ctx.update(bytes);
}

/// The hash of `entry` chained onto `prev`.
pub fn chain_hash(prev: &Hash, entry: &LedgerEntry) -> Hash {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(if entry.provenance.is_empty() {
        DOMAIN_V1
    } else {
        DOMAIN_V2
    });
    ctx.update(prev);
    ctx.update(&entry.seq.to_be_bytes());
    put(&mut ctx, entry.serial.as_bytes());
    put(&mut ctx, entry.spiffe_id.as_bytes());
    ctx.update(&(entry.dns_names.len() as u64).to_be_bytes());
    for n in &entry.dns_names {
        put(&mut ctx, n.as_bytes());
    }
    ctx.update(&(entry.ip_addresses.len() as u64).to_be_bytes());
    for n in &entry.ip_addresses {
        put(&mut ctx, n.as_bytes());
    }
    ctx.update(&entry.not_before.to_be_bytes());
    ctx.update(&entry.not_after.to_be_bytes());
    ctx.update(&entry.cert_sha256);
    put(&mut ctx, entry.ca_key_id.as_bytes());
    put(&mut ctx, entry.caller.as_bytes());
    ctx.update(&entry.issued_at.to_be_bytes());
    put(&mut ctx, entry.request_id.as_bytes());
    if !entry.provenance.is_empty() {
        put(&mut ctx, entry.provenance.as_bytes());
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Everything a ledger event commits to: something that happened to the certificate of an
/// earlier row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEvent {
    /// Position in the chain (shared with certificate rows).
    pub seq: u64,
    /// What happened: [`EVENT_REVOKE`].
    pub kind: String,
    /// The certificate's serial (lowercase hex, as in its row).
    pub serial: String,
    /// The `seq` of the certificate's row: earlier than this event's.
    pub cert_seq: u64,
    /// The chain hash of the certificate's row.
    pub cert_hash: Hash,
    /// The RFC 5280 CRLReason by name (`keyCompromise`, `superseded`, …).
    pub reason: String,
    /// Unix seconds when it happened (a revocation's date in the CRL).
    pub at: i64,
    /// Who did it, as authenticated (e.g. `admin`).
    pub caller: String,
    pub request_id: String,
    /// How the operator selected the certificate (canonical JSON, e.g.
    /// `{"by":"node","value":"vm1"}`).
    pub detail: String,
}

/// The hash of `event` chained onto `prev`.
pub fn event_hash(prev: &Hash, event: &LedgerEvent) -> Hash {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(DOMAIN_EVENT_V1);
    ctx.update(prev);
    ctx.update(&event.seq.to_be_bytes());
    put(&mut ctx, event.kind.as_bytes());
    put(&mut ctx, event.serial.as_bytes());
    ctx.update(&event.cert_seq.to_be_bytes());
    ctx.update(&event.cert_hash);
    put(&mut ctx, event.reason.as_bytes());
    ctx.update(&event.at.to_be_bytes());
    put(&mut ctx, event.caller.as_bytes());
    put(&mut ctx, event.request_id.as_bytes());
    put(&mut ctx, event.detail.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Everything a JWT-SVID row commits to: the token's claims that matter, its hash, who asked and
/// where the authority came from. The token itself is never stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSvidEntry {
    /// Position in the chain (shared with certificate rows and events).
    pub seq: u64,
    /// The token's `sub`.
    pub spiffe_id: String,
    /// The token's `aud`, in the order the token carries it.
    pub audience: Vec<String>,
    /// The token's `iat`, unix seconds.
    pub issued_at: i64,
    /// The token's `exp`, unix seconds.
    pub expires_at: i64,
    /// The `kid` of the key that signed it.
    pub key_id: String,
    /// SHA-256 of the compact token (its ASCII bytes).
    pub token_sha256: Hash,
    /// Who asked for it, as authenticated.
    pub caller: String,
    pub request_id: String,
    /// Where the authority for the token came from (canonical JSON, as a certificate row's).
    pub provenance: String,
}

/// The hash of a JWT-SVID row chained onto `prev`.
pub fn jwt_hash(prev: &Hash, entry: &JwtSvidEntry) -> Hash {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(DOMAIN_JWT_V1);
    ctx.update(prev);
    ctx.update(&entry.seq.to_be_bytes());
    put(&mut ctx, entry.spiffe_id.as_bytes());
    ctx.update(&(entry.audience.len() as u64).to_be_bytes());
    for a in &entry.audience {
        put(&mut ctx, a.as_bytes());
    }
    ctx.update(&entry.issued_at.to_be_bytes());
    ctx.update(&entry.expires_at.to_be_bytes());
    put(&mut ctx, entry.key_id.as_bytes());
    ctx.update(&entry.token_sha256);
    put(&mut ctx, entry.caller.as_bytes());
    put(&mut ctx, entry.request_id.as_bytes());
    put(&mut ctx, entry.provenance.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// One JWT-SVID row as stored and as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSvidRecord {
    pub entry: JwtSvidEntry,
    pub prev_hash: Hash,
    pub hash: Hash,
}

impl JwtSvidRecord {
    /// Whether its content chained onto its stored previous hash gives its stored hash.
    pub fn hashes_to_itself(&self) -> bool {
        jwt_hash(&self.prev_hash, &self.entry) == self.hash
    }
}

/// SHA-256 of arbitrary bytes (certificate DER).
pub fn sha256(bytes: &[u8]) -> Hash {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, bytes).as_ref());
    out
}

/// Where a chain stops verifying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainBreak {
    #[error("row {found} follows row {after}: rows are missing or out of order")]
    Gap { after: u64, found: u64 },
    #[error("row {seq}: its stored previous hash does not match the hash of the row before it")]
    PrevMismatch { seq: u64 },
    #[error("row {seq}: its content does not match its stored hash (altered)")]
    HashMismatch { seq: u64 },
    #[error("event {seq}: it is about row {cert_seq}, which does not come before it")]
    EventOrder { seq: u64, cert_seq: u64 },
    #[error(
        "the chain ends at row {last} with hash {last_hash}, but the head says row {head} with hash {head_hash}"
    )]
    HeadMismatch {
        last: u64,
        last_hash: String,
        head: u64,
        head_hash: String,
    },
}

/// Verifies rows one by one, in order. Feed it every row, then call [`Verifier::finish`].
#[derive(Debug, Clone)]
pub struct Verifier {
    last_seq: u64,
    last_hash: Hash,
}

impl Default for Verifier {
    fn default() -> Self {
        Self {
            last_seq: 0,
            last_hash: GENESIS,
        }
    }
}

impl Verifier {
    /// A verifier that continues a chain already trusted up to row `seq` with hash `hash` (a
    /// verified checkpoint's head): the next row must be `seq + 1` and chain from `hash`.
    pub fn resume(seq: u64, hash: Hash) -> Self {
        Self {
            last_seq: seq,
            last_hash: hash,
        }
    }

    /// The checks every row kind shares: the next seq, chained onto the last hash, and its own
    /// content (`computed`, the hash of the row chained onto `prev_hash`) giving its stored hash.
    fn check(
        &self,
        seq: u64,
        prev_hash: &Hash,
        hash: &Hash,
        computed: impl FnOnce() -> Hash,
    ) -> Result<(), ChainBreak> {
        if seq != self.last_seq + 1 {
            return Err(ChainBreak::Gap {
                after: self.last_seq,
                found: seq,
            });
        }
        if prev_hash != &self.last_hash {
            return Err(ChainBreak::PrevMismatch { seq });
        }
        if &computed() != hash {
            return Err(ChainBreak::HashMismatch { seq });
        }
        Ok(())
    }

    fn advance(&mut self, seq: u64, hash: &Hash) {
        self.last_seq = seq;
        self.last_hash = *hash;
    }

    /// Checks one row: its sequence, its stored `prev_hash`, and its stored `hash`.
    pub fn push(
        &mut self,
        entry: &LedgerEntry,
        prev_hash: &Hash,
        hash: &Hash,
    ) -> Result<(), ChainBreak> {
        self.check(entry.seq, prev_hash, hash, || chain_hash(prev_hash, entry))?;
        self.advance(entry.seq, hash);
        Ok(())
    }

    /// Checks one event row, like [`Verifier::push`]; the row it is about must come before it.
    pub fn push_event(
        &mut self,
        event: &LedgerEvent,
        prev_hash: &Hash,
        hash: &Hash,
    ) -> Result<(), ChainBreak> {
        self.check(event.seq, prev_hash, hash, || event_hash(prev_hash, event))?;
        if event.cert_seq == 0 || event.cert_seq >= event.seq {
            return Err(ChainBreak::EventOrder {
                seq: event.seq,
                cert_seq: event.cert_seq,
            });
        }
        self.advance(event.seq, hash);
        Ok(())
    }

    /// Checks one JWT-SVID row, like [`Verifier::push`].
    pub fn push_jwt(
        &mut self,
        entry: &JwtSvidEntry,
        prev_hash: &Hash,
        hash: &Hash,
    ) -> Result<(), ChainBreak> {
        self.check(entry.seq, prev_hash, hash, || jwt_hash(prev_hash, entry))?;
        self.advance(entry.seq, hash);
        Ok(())
    }

    /// The last row verified (or resumed from): its seq.
    pub fn count(&self) -> u64 {
        self.last_seq
    }

    /// Checks that the chain ends where the head says it does.
    pub fn finish(self, head_seq: u64, head_hash: &Hash) -> Result<u64, ChainBreak> {
        if self.last_seq != head_seq || &self.last_hash != head_hash {
            return Err(ChainBreak::HeadMismatch {
                last: self.last_seq,
                last_hash: hex(&self.last_hash),
                head: head_seq,
                head_hash: hex(head_hash),
            });
        }
        Ok(self.last_seq)
    }
}

fn hex(h: &Hash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64) -> LedgerEntry {
        LedgerEntry {
            seq,
            serial: format!("{seq:032x}"),
            spiffe_id: "spiffe://example.org/ns/a/sa/b".into(),
            dns_names: vec!["b.a.svc".into()],
            ip_addresses: vec![],
            not_before: 1_700_000_000,
            not_after: 1_700_003_600,
            cert_sha256: sha256(&seq.to_be_bytes()),
            ca_key_id: "root-1".into(),
            caller: "jwt:spiffe://example.org/ns/a/sa/b".into(),
            issued_at: 1_700_000_010,
            request_id: format!("req-{seq}"),
            provenance: r#"{"source":"service_account"}"#.into(),
        }
    }

    #[test]
    fn a_record_hashes_to_itself_only_with_its_certificate_and_content() {
        let cert_der = vec![0x30, 0x03, 1, 2, 3];
        let mut e = entry(1);
        e.cert_sha256 = sha256(&cert_der);
        let rec = LedgerRecord {
            hash: chain_hash(&GENESIS, &e),
            entry: e,
            prev_hash: GENESIS,
            cert_der,
            revocation: None,
        };
        assert!(rec.holds_its_certificate() && rec.hashes_to_itself());
        let mut swapped = rec.clone();
        swapped.cert_der.push(0);
        assert!(!swapped.holds_its_certificate() && !swapped.hashes_to_itself());
        let mut altered = rec.clone();
        altered.entry.caller.push('x');
        assert!(altered.holds_its_certificate() && !altered.hashes_to_itself());
        let mut moved = rec.clone();
        moved.prev_hash[0] ^= 1;
        assert!(!moved.hashes_to_itself());
        // The revocation is an index beside the row, not part of its hash.
        let revoked = LedgerRecord {
            revocation: Some(Revocation {
                at: 1,
                reason: "superseded".into(),
            }),
            ..rec
        };
        assert!(revoked.hashes_to_itself());
    }

    fn jwt(seq: u64) -> JwtSvidEntry {
        JwtSvidEntry {
            seq,
            spiffe_id: "spiffe://example.org/web".into(),
            audience: vec!["ab".into(), "cd".into()],
            issued_at: 1_700_000_000,
            expires_at: 1_700_000_300,
            key_id: "k1".into(),
            token_sha256: sha256(b"a.b.c"),
            caller: "mtls:spiffe://example.org/signet/node/n1".into(),
            request_id: "r".into(),
            provenance: r#"{"source":"entry"}"#.into(),
        }
    }

    #[test]
    fn jwt_rows_chain_with_certificate_rows_under_their_own_domain() {
        let c1 = entry(1);
        let h1 = chain_hash(&GENESIS, &c1);
        let j2 = jwt(2);
        let h2 = jwt_hash(&h1, &j2);
        let mut v = Verifier::default();
        v.push(&c1, &GENESIS, &h1).unwrap();
        v.push_jwt(&j2, &h1, &h2).unwrap();
        assert_eq!(v.finish(2, &h2), Ok(2));
        // Every field is covered, and the audience list is length-prefixed: {"ab","cd"} and
        // {"a","bcd"} hash apart.
        let mut moved = j2.clone();
        moved.audience = vec!["a".into(), "bcd".into()];
        assert_ne!(jwt_hash(&h1, &moved), h2);
        for change in [
            |e: &mut JwtSvidEntry| e.spiffe_id.push('x'),
            |e: &mut JwtSvidEntry| e.expires_at += 1,
            |e: &mut JwtSvidEntry| e.key_id.push('x'),
            |e: &mut JwtSvidEntry| e.token_sha256[0] ^= 1,
            |e: &mut JwtSvidEntry| e.provenance.clear(),
        ] {
            let mut altered = j2.clone();
            change(&mut altered);
            let mut v = Verifier::resume(1, h1);
            assert_eq!(
                v.push_jwt(&altered, &h1, &h2),
                Err(ChainBreak::HashMismatch { seq: 2 })
            );
        }
        let rec = JwtSvidRecord {
            entry: j2,
            prev_hash: h1,
            hash: h2,
        };
        assert!(rec.hashes_to_itself());
    }

    #[test]
    fn provenance_is_recorded_only_when_not_empty() {
        let mut e = entry(1);
        assert_eq!(
            e.recorded_provenance(),
            Some(r#"{"source":"service_account"}"#)
        );
        e.provenance.clear();
        assert_eq!(e.recorded_provenance(), None);
    }

    #[test]
    fn resume_continues_a_trusted_prefix_and_refuses_another() {
        let rows = chain(6);
        let (_, _, h3) = &rows[2];
        let mut v = Verifier::resume(3, *h3);
        for (e, prev, hash) in &rows[3..] {
            v.push(e, prev, hash).unwrap();
        }
        let (_, _, head) = &rows[5];
        assert_eq!(v.finish(6, head), Ok(6));
        // Resumed from a hash the chain does not have at row 3: the next row is refused.
        let mut v = Verifier::resume(3, [9; 32]);
        let (e, prev, hash) = &rows[3];
        assert_eq!(
            v.push(e, prev, hash),
            Err(ChainBreak::PrevMismatch { seq: 4 })
        );
        // Or at another seq: a gap.
        let mut v = Verifier::resume(2, *h3);
        assert!(matches!(v.push(e, prev, hash), Err(ChainBreak::Gap { .. })));
    }

    fn chain(n: u64) -> Vec<(LedgerEntry, Hash, Hash)> {
        let mut prev = GENESIS;
        (1..=n)
            .map(|s| {
                let e = entry(s);
                let h = chain_hash(&prev, &e);
                let row = (e, prev, h);
                prev = h;
                row
            })
            .collect()
    }

    fn verify(rows: &[(LedgerEntry, Hash, Hash)], head: (u64, Hash)) -> Result<u64, ChainBreak> {
        let mut v = Verifier::default();
        for (e, p, h) in rows {
            v.push(e, p, h)?;
        }
        v.finish(head.0, &head.1)
    }

    #[test]
    fn intact_chain_verifies() {
        let rows = chain(5);
        let head = (5, rows[4].2);
        assert_eq!(verify(&rows, head), Ok(5));
        assert_eq!(verify(&[], (0, GENESIS)), Ok(0));
    }

    #[test]
    fn every_field_is_covered() {
        let base = entry(1);
        let h = chain_hash(&GENESIS, &base);
        let mutations: [fn(&mut LedgerEntry); 13] = [
            |e| e.serial.push('0'),
            |e| e.spiffe_id.push('x'),
            |e| e.dns_names.push("x".into()),
            |e| e.ip_addresses.push("127.0.0.1".into()),
            |e| e.not_before += 1,
            |e| e.not_after += 1,
            |e| e.cert_sha256[0] ^= 1,
            |e| e.ca_key_id.push('x'),
            |e| e.caller.push('x'),
            |e| e.issued_at += 1,
            |e| e.request_id.push('x'),
            |e| e.provenance.push('x'),
            // Blanking the provenance (passing the row off as a v1 row) is an alteration too.
            |e| e.provenance.clear(),
        ];
        for m in mutations {
            let mut e = base.clone();
            m(&mut e);
            assert_ne!(chain_hash(&GENESIS, &e), h);
        }
        // Moving a byte between adjacent strings changes the hash too (length prefixes).
        let mut a = base.clone();
        a.dns_names = vec!["ab".into(), "c".into()];
        let mut b = base;
        b.dns_names = vec!["a".into(), "bc".into()];
        assert_ne!(chain_hash(&GENESIS, &a), chain_hash(&GENESIS, &b));
    }

    #[test]
    fn rows_without_provenance_keep_the_v1_hash() {
        // A v1 row's hash, computed by the encoding as it was before provenance existed, so
        // ledgers written by earlier versions keep verifying.
        let mut e = entry(1);
        e.provenance.clear();
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(b"signet-ledger-v1\0");
        ctx.update(&GENESIS);
        ctx.update(&e.seq.to_be_bytes());
        put(&mut ctx, e.serial.as_bytes());
        put(&mut ctx, e.spiffe_id.as_bytes());
        ctx.update(&1u64.to_be_bytes());
        put(&mut ctx, b"b.a.svc");
        ctx.update(&0u64.to_be_bytes());
        ctx.update(&e.not_before.to_be_bytes());
        ctx.update(&e.not_after.to_be_bytes());
        ctx.update(&e.cert_sha256);
        put(&mut ctx, e.ca_key_id.as_bytes());
        put(&mut ctx, e.caller.as_bytes());
        ctx.update(&e.issued_at.to_be_bytes());
        put(&mut ctx, e.request_id.as_bytes());
        assert_eq!(chain_hash(&GENESIS, &e).as_slice(), ctx.finish().as_ref());
    }

    fn event(seq: u64, cert_seq: u64) -> LedgerEvent {
        LedgerEvent {
            seq,
            kind: EVENT_REVOKE.into(),
            serial: format!("{cert_seq:032x}"),
            cert_seq,
            cert_hash: sha256(&cert_seq.to_be_bytes()),
            reason: "keyCompromise".into(),
            at: 1_700_000_100,
            caller: "admin".into(),
            request_id: format!("req-ev-{seq}"),
            detail: r#"{"by":"serial"}"#.into(),
        }
    }

    #[derive(Clone)]
    enum Row {
        Cert(LedgerEntry),
        Event(LedgerEvent),
    }

    /// Certificates at 1..=n, then events about rows 2 and 1, then one more certificate.
    fn mixed(n: u64) -> Vec<(Row, Hash, Hash)> {
        let mut prev = GENESIS;
        let mut out = Vec::new();
        let mut rows: Vec<Row> = (1..=n).map(|s| Row::Cert(entry(s))).collect();
        rows.push(Row::Event(event(n + 1, 2)));
        rows.push(Row::Event(event(n + 2, 1)));
        rows.push(Row::Cert(entry(n + 3)));
        for r in rows {
            let h = match &r {
                Row::Cert(e) => chain_hash(&prev, e),
                Row::Event(e) => event_hash(&prev, e),
            };
            out.push((r, prev, h));
            prev = h;
        }
        out
    }

    fn verify_mixed(rows: &[(Row, Hash, Hash)], head: (u64, Hash)) -> Result<u64, ChainBreak> {
        let mut v = Verifier::default();
        for (r, p, h) in rows {
            match r {
                Row::Cert(e) => v.push(e, p, h)?,
                Row::Event(e) => v.push_event(e, p, h)?,
            }
        }
        v.finish(head.0, &head.1)
    }

    #[test]
    fn every_event_field_is_covered() {
        let base = event(5, 2);
        let h = event_hash(&GENESIS, &base);
        let mutations: [fn(&mut LedgerEvent); 10] = [
            |e| e.seq += 1,
            |e| e.kind.push('x'),
            |e| e.serial.push('0'),
            |e| e.cert_seq += 1,
            |e| e.cert_hash[31] ^= 1,
            |e| e.reason = "superseded".into(),
            |e| e.at += 1,
            |e| e.caller.push('x'),
            |e| e.request_id.push('x'),
            |e| e.detail.push('x'),
        ];
        for m in mutations {
            let mut e = base.clone();
            m(&mut e);
            assert_ne!(event_hash(&GENESIS, &e), h);
        }
        let mut prev = GENESIS;
        prev[0] = 1;
        assert_ne!(event_hash(&prev, &base), h);
        // Length prefixes: moving a byte between adjacent strings changes the hash.
        let mut a = base.clone();
        a.caller = "ab".into();
        a.request_id = "c".into();
        let mut b = base;
        b.caller = "a".into();
        b.request_id = "bc".into();
        assert_ne!(event_hash(&GENESIS, &a), event_hash(&GENESIS, &b));
    }

    #[test]
    fn events_and_certificates_hash_in_separate_domains() {
        // The same bytes after the domain never collide across the two kinds, because the
        // domain strings differ; check the domain is really part of the hash.
        let e = event(3, 1);
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(b"signet-ledger-event-v1\0");
        ctx.update(&GENESIS);
        ctx.update(&3u64.to_be_bytes());
        put(&mut ctx, b"revoke");
        put(&mut ctx, e.serial.as_bytes());
        ctx.update(&1u64.to_be_bytes());
        ctx.update(&e.cert_hash);
        put(&mut ctx, b"keyCompromise");
        ctx.update(&e.at.to_be_bytes());
        put(&mut ctx, b"admin");
        put(&mut ctx, e.request_id.as_bytes());
        put(&mut ctx, e.detail.as_bytes());
        assert_eq!(event_hash(&GENESIS, &e).as_slice(), ctx.finish().as_ref());
    }

    #[test]
    fn events_share_the_chain_and_verify_catches_their_alteration_removal_and_reordering() {
        let rows = mixed(3);
        let head = (6, rows[5].2);
        assert_eq!(verify_mixed(&rows, head), Ok(6));

        // Altered: the reason of the first event.
        let mut altered = rows.clone();
        if let Row::Event(e) = &mut altered[3].0 {
            e.reason = "superseded".into();
        }
        assert_eq!(
            verify_mixed(&altered, head),
            Err(ChainBreak::HashMismatch { seq: 4 })
        );

        // Deleted: the second event.
        let mut deleted = rows.clone();
        deleted.remove(4);
        assert_eq!(
            verify_mixed(&deleted, head),
            Err(ChainBreak::Gap { after: 4, found: 6 })
        );

        // Deleted at the tail (an event was the last row): the head tells.
        let tail = &rows[..4];
        assert!(matches!(
            verify_mixed(tail, head),
            Err(ChainBreak::HeadMismatch {
                last: 4,
                head: 6,
                ..
            })
        ));

        // Reordered: the two events swapped, seqs and all.
        let mut swapped = rows.clone();
        swapped.swap(3, 4);
        assert_eq!(
            verify_mixed(&swapped, head),
            Err(ChainBreak::Gap { after: 3, found: 5 })
        );
        // Reordered with renumbered seqs: the stored hashes no longer fit.
        let mut renumbered = rows.clone();
        renumbered.swap(3, 4);
        for (i, (r, _, _)) in renumbered.iter_mut().enumerate().skip(3).take(2) {
            if let Row::Event(e) = r {
                e.seq = i as u64 + 1;
            }
        }
        assert!(verify_mixed(&renumbered, head).is_err());

        // An event passed off as a certificate row (or the reverse) does not verify.
        let Row::Event(ev) = &rows[3].0 else {
            panic!("row 4 is an event")
        };
        let mut v = Verifier::default();
        for (r, p, h) in &rows[..3] {
            let Row::Cert(e) = r else { panic!() };
            v.push(e, p, h).unwrap();
        }
        let as_cert = LedgerEntry {
            seq: ev.seq,
            serial: ev.serial.clone(),
            ..entry(ev.seq)
        };
        assert_eq!(
            v.clone().push(&as_cert, &rows[3].1, &rows[3].2),
            Err(ChainBreak::HashMismatch { seq: 4 })
        );

        // An event about itself or a later row is refused even when its hash is right.
        let mut future = event(4, 4);
        let h = event_hash(&rows[3].1, &future);
        assert_eq!(
            v.clone().push_event(&future, &rows[3].1, &h),
            Err(ChainBreak::EventOrder {
                seq: 4,
                cert_seq: 4
            })
        );
        future.cert_seq = 0;
        let h = event_hash(&rows[3].1, &future);
        assert!(matches!(
            v.push_event(&future, &rows[3].1, &h),
            Err(ChainBreak::EventOrder { .. })
        ));
    }

    #[test]
    fn detects_alteration_removal_and_truncation() {
        let rows = chain(4);
        let head = (4, rows[3].2);

        let mut altered = rows.clone();
        altered[1].0.spiffe_id = "spiffe://example.org/evil".into();
        assert_eq!(
            verify(&altered, head),
            Err(ChainBreak::HashMismatch { seq: 2 })
        );

        let mut removed = rows.clone();
        removed.remove(2);
        assert_eq!(
            verify(&removed, head),
            Err(ChainBreak::Gap { after: 2, found: 4 })
        );

        let mut rehashed = rows.clone();
        rehashed[2].1[0] ^= 1;
        assert_eq!(
            verify(&rehashed, head),
            Err(ChainBreak::PrevMismatch { seq: 3 })
        );

        let truncated = &rows[..3];
        assert!(matches!(
            verify(truncated, head),
            Err(ChainBreak::HeadMismatch {
                last: 3,
                head: 4,
                ..
            })
        ));
    }
}
