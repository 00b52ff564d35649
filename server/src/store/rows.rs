//! Row shapes and conversions shared by both backends and by the ledger and revocation queries:
//! the `certificates` row, the chain-head decoding, the chaining of a batch, and the integer
//! conversions between the domain's unsigned numbers and the databases' signed 64-bit columns
//! (a negative stored value is [`StoreError::Corrupt`], never a panic).

use signet_types::ledger::{
    Hash, JwtSvidEntry, JwtSvidRecord, LedgerEntry, Revocation, chain_hash, jwt_hash,
};

use super::error::StoreError;
use super::ledger::{LedgerHead, LedgerRecord, NewCertificate, NewJwtSvid, NewLedgerRow};

/// Columns selected for a [`LedgerRecord`], in [`DbCertificate`]'s order.
pub(super) const CERT_COLUMNS: &str = "seq, serial, spiffe_id, dns_names, ip_addresses, \
     not_before, not_after, issued_at, cert_sha256, prev_hash, hash, cert_der, ca_key_id, \
     caller, request_id, provenance, revoked_at, revocation_reason";

super::db_row! {
    /// A `certificates` row as both drivers decode it.
    pub(super) struct DbCertificate {
        seq: i64,
        serial: String,
        spiffe_id: String,
        dns_names: String,
        ip_addresses: String,
        not_before: i64,
        not_after: i64,
        issued_at: i64,
        cert_sha256: Vec<u8>,
        prev_hash: Vec<u8>,
        hash: Vec<u8>,
        cert_der: Vec<u8>,
        ca_key_id: String,
        caller: String,
        request_id: String,
        provenance: String,
        revoked_at: Option<i64>,
        revocation_reason: Option<String>,
    }
}

impl TryFrom<DbCertificate> for LedgerRecord {
    type Error = StoreError;

    fn try_from(r: DbCertificate) -> Result<Self, StoreError> {
        let seq = u64::try_from(r.seq)
            .map_err(|_| StoreError::Corrupt(format!("negative ledger seq {}", r.seq)))?;
        Ok(LedgerRecord {
            entry: LedgerEntry {
                seq,
                serial: r.serial,
                spiffe_id: r.spiffe_id,
                dns_names: json_list(seq, "dns_names", &r.dns_names)?,
                ip_addresses: json_list(seq, "ip_addresses", &r.ip_addresses)?,
                not_before: r.not_before,
                not_after: r.not_after,
                cert_sha256: hash(seq, "cert_sha256", &r.cert_sha256)?,
                ca_key_id: r.ca_key_id,
                caller: r.caller,
                issued_at: r.issued_at,
                request_id: r.request_id,
                provenance: r.provenance,
            },
            // Both columns are set by the same statement; a reason is kept only with its time.
            revocation: r.revoked_at.map(|at| Revocation {
                at,
                reason: r.revocation_reason.unwrap_or_default(),
            }),
            prev_hash: hash(seq, "prev_hash", &r.prev_hash)?,
            hash: hash(seq, "hash", &r.hash)?,
            cert_der: r.cert_der,
        })
    }
}

/// Columns selected for a [`JwtSvidRecord`], in [`DbJwtSvid`]'s order.
pub(super) const JWT_COLUMNS: &str = "seq, spiffe_id, audience, issued_at, expires_at, key_id, \
     token_sha256, caller, request_id, provenance, prev_hash, hash";

super::db_row! {
    /// A `jwt_svids` row as both drivers decode it.
    pub(super) struct DbJwtSvid {
        seq: i64,
        spiffe_id: String,
        audience: String,
        issued_at: i64,
        expires_at: i64,
        key_id: String,
        token_sha256: Vec<u8>,
        caller: String,
        request_id: String,
        provenance: String,
        prev_hash: Vec<u8>,
        hash: Vec<u8>,
    }
}

impl TryFrom<DbJwtSvid> for JwtSvidRecord {
    type Error = StoreError;

    fn try_from(r: DbJwtSvid) -> Result<Self, StoreError> {
        let seq = u64::try_from(r.seq)
            .map_err(|_| StoreError::Corrupt(format!("negative JWT-SVID row seq {}", r.seq)))?;
        Ok(JwtSvidRecord {
            entry: JwtSvidEntry {
                seq,
                spiffe_id: r.spiffe_id,
                audience: json_list(seq, "audience", &r.audience)?,
                issued_at: r.issued_at,
                expires_at: r.expires_at,
                key_id: r.key_id,
                token_sha256: hash(seq, "token_sha256", &r.token_sha256)?,
                caller: r.caller,
                request_id: r.request_id,
                provenance: r.provenance,
            },
            prev_hash: hash(seq, "prev_hash", &r.prev_hash)?,
            hash: hash(seq, "hash", &r.hash)?,
        })
    }
}

fn json_list(seq: u64, column: &str, text: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Corrupt(format!(
            "ledger row {seq}: {column} is not a JSON list: {e}"
        ))
    })
}

pub(super) fn hash(seq: u64, column: &str, bytes: &[u8]) -> Result<Hash, StoreError> {
    Hash::try_from(bytes).map_err(|_| {
        StoreError::Corrupt(format!(
            "ledger row {seq}: {column} has {} bytes, not 32",
            bytes.len()
        ))
    })
}

/// Decodes the `ledger_head` row.
pub(super) fn head(seq: i64, hash_bytes: &[u8]) -> Result<LedgerHead, StoreError> {
    let seq = u64::try_from(seq)
        .map_err(|_| StoreError::Corrupt(format!("negative ledger head seq {seq}")))?;
    let hash = Hash::try_from(hash_bytes).map_err(|_| {
        StoreError::Corrupt(format!(
            "ledger head hash has {} bytes, not 32",
            hash_bytes.len()
        ))
    })?;
    Ok(LedgerHead { seq, hash })
}

/// One certificate row ready to insert: the entry with its seq and both hashes.
pub(super) struct Chained<'a> {
    pub cert: &'a NewCertificate,
    pub seq: i64,
    pub prev_hash: Hash,
    pub hash: Hash,
    pub dns_json: String,
    pub ip_json: String,
    /// The serial this row renews (indexed as `certificates.renewed_from`).
    pub renewed_from: Option<String>,
}

/// One JWT-SVID row ready to insert.
pub(super) struct ChainedJwt<'a> {
    pub jwt: &'a NewJwtSvid,
    pub seq: i64,
    pub prev_hash: Hash,
    pub hash: Hash,
    pub audience_json: String,
}

/// Chains `batch` onto the head `(seq, hash)` in its order; returns the certificate rows, the
/// JWT-SVID rows (each with its seq: they interleave in the chain as queued) and the new head.
#[allow(clippy::type_complexity)]
pub(super) fn chain<'a>(
    head_seq: u64,
    head_hash: Hash,
    batch: &'a [NewLedgerRow],
) -> Result<(Vec<Chained<'a>>, Vec<ChainedJwt<'a>>, u64, Hash), StoreError> {
    let mut prev = head_hash;
    let mut certs = Vec::with_capacity(batch.len());
    let mut jwts = Vec::new();
    let mut seq = head_seq;
    for row in batch {
        seq += 1;
        let hash = match row {
            NewLedgerRow::Certificate(cert) => {
                let entry = LedgerEntry {
                    seq,
                    serial: cert.serial.clone(),
                    spiffe_id: cert.spiffe_id.clone(),
                    dns_names: cert.dns_names.clone(),
                    ip_addresses: cert.ip_addresses.clone(),
                    not_before: cert.not_before,
                    not_after: cert.not_after,
                    cert_sha256: cert.cert_sha256,
                    ca_key_id: cert.ca_key_id.clone(),
                    caller: cert.caller.clone(),
                    issued_at: cert.issued_at,
                    request_id: cert.request_id.clone(),
                    provenance: cert.provenance.clone(),
                };
                let hash = chain_hash(&prev, &entry);
                certs.push(Chained {
                    cert,
                    seq: db_seq(seq)?,
                    prev_hash: prev,
                    hash,
                    dns_json: to_json(&cert.dns_names)?,
                    ip_json: to_json(&cert.ip_addresses)?,
                    renewed_from: cert.renewed_from(),
                });
                hash
            }
            NewLedgerRow::JwtSvid(jwt) => {
                let entry = JwtSvidEntry {
                    seq,
                    spiffe_id: jwt.spiffe_id.clone(),
                    audience: jwt.audience.clone(),
                    issued_at: jwt.issued_at,
                    expires_at: jwt.expires_at,
                    key_id: jwt.key_id.clone(),
                    token_sha256: jwt.token_sha256,
                    caller: jwt.caller.clone(),
                    request_id: jwt.request_id.clone(),
                    provenance: jwt.provenance.clone(),
                };
                let hash = jwt_hash(&prev, &entry);
                jwts.push(ChainedJwt {
                    jwt,
                    seq: db_seq(seq)?,
                    prev_hash: prev,
                    hash,
                    audience_json: to_json(&jwt.audience)?,
                });
                hash
            }
        };
        prev = hash;
    }
    Ok((certs, jwts, seq, prev))
}

pub(super) fn db_seq(seq: u64) -> Result<i64, StoreError> {
    i64::try_from(seq).map_err(|_| StoreError::Database(format!("seq {seq} out of range")))
}

fn to_json(list: &[String]) -> Result<String, StoreError> {
    serde_json::to_string(list).map_err(|e| StoreError::Database(format!("encoding a list: {e}")))
}

/// SQLite's `LIMIT` and PostgreSQL's both take a signed 64-bit integer.
pub(super) fn limit(limit: u32) -> i64 {
    i64::from(limit)
}

/// The keyset page query over a ledger table (`certificates`, `jwt_svids`) by `seq`, in one
/// form for both directions (`seq > from ORDER BY seq` or `seq < from ORDER BY seq DESC`),
/// optionally for one SPIFFE ID: the SQL (`$1` the key, `$2` the limit, `$3` the SPIFFE ID)
/// and the key to bind.
pub(super) fn page_query(
    columns: &str,
    table: &str,
    order: super::ledger::Order,
    from: Option<u64>,
    by_spiffe_id: bool,
) -> (String, i64) {
    use super::ledger::Order;
    let (key, cmp, dir) = match order {
        Order::OldestFirst => (after(from.unwrap_or(0)), ">", ""),
        Order::NewestFirst => (before(from.unwrap_or(u64::MAX)), "<", " DESC"),
    };
    let only = if by_spiffe_id {
        "spiffe_id = $3 AND "
    } else {
        ""
    };
    let sql = format!(
        "SELECT {columns} FROM {table} WHERE {only}seq {cmp} $1 ORDER BY seq{dir} LIMIT $2"
    );
    (sql, key)
}

/// `after` as a signed key for `>` comparisons (anything beyond `i64::MAX` matches nothing).
pub(super) fn after(after: u64) -> i64 {
    i64::try_from(after).unwrap_or(i64::MAX)
}

/// `before` as a signed key for `<` comparisons (anything beyond `i64::MAX`: every row).
pub(super) fn before(before: u64) -> i64 {
    i64::try_from(before).unwrap_or(i64::MAX)
}

/// A stored count (never negative unless the row is corrupt).
pub(super) fn count(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("negative count {n}")))
}

/// A number to store in a signed 64-bit column.
pub(super) fn i64_of(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Database(format!("{what} {v} out of range")))
}
