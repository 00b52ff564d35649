//! Listing the ledger a page at a time by key: [`CertQuery`] in, [`CertPage`] out, and the
//! opaque [`PageToken`] that carries a listing from one page to the next.
//!
//! Invariant: a page is one keyset query on the ledger's sequence number (never `OFFSET`), so
//! page one and page ten thousand cost the same: the primary key, or the `(spiffe_id, seq)`
//! index, entered at the token's seq and read forwards (oldest first) or backwards (newest
//! first). Sequence numbers are unique and never reused, so rows with equal timestamps are
//! neither repeated nor skipped, and rows appended meanwhile appear in an oldest-first listing
//! (never in a newest-first one, which starts below the head it saw). A token is only good for
//! the listing that issued it: it names its order and a fingerprint of its SPIFFE ID filter,
//! and anything else (garbage, another listing's token) is [`StoreError::InvalidArgument`]. A
//! token is a position, not a credential: a hand-made one shows nothing the listing would not.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::error::StoreError;
pub use super::ledger::Order;
use super::ledger::{LedgerRecord, LedgerStore};

/// One page to list.
#[derive(Debug, Clone, Copy, Default)]
pub struct CertQuery<'a> {
    /// Only this SPIFFE ID.
    pub spiffe_id: Option<&'a str>,
    pub order: Order,
    /// At most this many rows (0: an empty page).
    pub limit: u32,
    /// Where the previous page ended ([`CertPage::next`]); None: the first page.
    pub page_token: Option<&'a str>,
}

/// A page of rows and, when more follow, the token for the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPage {
    pub rows: Vec<LedgerRecord>,
    /// None on the last page.
    pub next: Option<String>,
}

const VERSION: u8 = 1;
const TOKEN_LEN: usize = 18;

/// A decoded page token: the listing it belongs to and the last seq it showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageToken {
    order: Order,
    filter: [u8; 8],
    seq: u64,
}

/// The first 8 bytes of SHA-256 of the filter (empty: none): enough to tell listings apart.
fn fingerprint(spiffe_id: Option<&str>) -> [u8; 8] {
    let digest = signet_types::ledger::sha256(spiffe_id.unwrap_or("").as_bytes());
    let mut fp = [0u8; 8];
    fp.copy_from_slice(&digest[..8]);
    fp
}

impl PageToken {
    fn new(q: &CertQuery<'_>, seq: u64) -> Self {
        Self::keyed(q.order, q.spiffe_id.unwrap_or(""), seq)
    }

    /// The token of any keyset listing: its order, a fingerprint of its filters' text (the
    /// listing's own canonical spelling of them) and the last key it showed.
    pub fn keyed(order: Order, filter: &str, key: u64) -> Self {
        Self {
            order,
            filter: fingerprint(Some(filter)),
            seq: key,
        }
    }

    /// The text of the token that continues an oldest-first listing after `seq` (for the
    /// older `after_seq` requests).
    pub fn after(spiffe_id: Option<&str>, seq: u64) -> String {
        let q = CertQuery {
            spiffe_id,
            ..CertQuery::default()
        };
        PageToken::new(&q, seq).encode()
    }

    /// The token's text: URL-safe base64 of version, order, seq and filter fingerprint.
    pub fn encode(&self) -> String {
        let mut b = [0u8; TOKEN_LEN];
        b[0] = VERSION;
        b[1] = match self.order {
            Order::OldestFirst => 0,
            Order::NewestFirst => 1,
        };
        b[2..10].copy_from_slice(&self.seq.to_be_bytes());
        b[10..].copy_from_slice(&self.filter);
        URL_SAFE_NO_PAD.encode(b)
    }

    /// Reads `text` as a token of the listing `q`; the seq to continue from.
    pub fn decode_for(text: &str, q: &CertQuery<'_>) -> Result<u64, StoreError> {
        Self::decode_keyed(
            text,
            "ListCertificates",
            q.order,
            q.spiffe_id.unwrap_or(""),
            "a different SPIFFE ID filter or order",
        )
    }

    /// Reads `text` as a token of the listing `listing` with this order and filter text
    /// ([`Self::keyed`]); the key to continue from. `differs` says what another listing of
    /// the same call would differ in.
    pub fn decode_keyed(
        text: &str,
        listing: &str,
        order: Order,
        filter: &str,
        differs: &str,
    ) -> Result<u64, StoreError> {
        let bad = |why: &str| {
            StoreError::InvalidArgument(format!(
                "page_token {:?} is not a page token from {listing} ({why}); \
                 pass the next_page_token of the previous page unchanged, or none to start",
                text.chars().take(40).collect::<String>()
            ))
        };
        let bytes = URL_SAFE_NO_PAD
            .decode(text.trim())
            .map_err(|_| bad("not URL-safe base64"))?;
        let b: [u8; TOKEN_LEN] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| bad("wrong length"))?;
        if b[0] != VERSION {
            return Err(bad("unknown version"));
        }
        let token_order = match b[1] {
            0 => Order::OldestFirst,
            1 => Order::NewestFirst,
            _ => return Err(bad("unknown order")),
        };
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[2..10]);
        let token = PageToken {
            order: token_order,
            filter: b[10..].try_into().map_err(|_| bad("wrong length"))?,
            seq: u64::from_be_bytes(seq),
        };
        let expected = PageToken::keyed(order, filter, token.seq);
        if token != expected {
            return Err(StoreError::InvalidArgument(format!(
                "page_token belongs to another listing ({differs}): list again without it"
            )));
        }
        Ok(token.seq)
    }
}

/// One page of `q` from `store`: one keyset query for `limit + 1` rows (the extra one only
/// tells whether a next page exists).
pub async fn certificates_page<S: LedgerStore + ?Sized>(
    store: &S,
    q: &CertQuery<'_>,
) -> Result<CertPage, StoreError> {
    let from = match q.page_token {
        Some(t) if !t.is_empty() => Some(PageToken::decode_for(t, q)?),
        _ => None,
    };
    if q.limit == 0 {
        return Ok(CertPage {
            rows: Vec::new(),
            next: None,
        });
    }
    let want = q.limit.saturating_add(1);
    let mut rows = store
        .certificates_page(q.order, from, want, q.spiffe_id)
        .await?;
    let limit = usize::try_from(q.limit).unwrap_or(usize::MAX);
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| PageToken::new(q, r.entry.seq).encode())
    } else {
        None
    };
    Ok(CertPage { rows, next })
}

/// A page of JWT-SVID rows and, when more follow, the token for the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtPage {
    pub rows: Vec<signet_types::ledger::JwtSvidRecord>,
    /// None on the last page.
    pub next: Option<String>,
}

/// One page of JWT-SVID rows (`ListJwtSvids`), exactly as [`certificates_page`] pages the
/// certificate rows: the same query shape, the same tokens.
pub async fn jwt_svids_page<S: LedgerStore + ?Sized>(
    store: &S,
    q: &CertQuery<'_>,
) -> Result<JwtPage, StoreError> {
    let from = match q.page_token {
        Some(t) if !t.is_empty() => Some(PageToken::decode_for(t, q)?),
        _ => None,
    };
    if q.limit == 0 {
        return Ok(JwtPage {
            rows: Vec::new(),
            next: None,
        });
    }
    let want = q.limit.saturating_add(1);
    let mut rows = store
        .jwt_svids_page(q.order, from, want, q.spiffe_id)
        .await?;
    let limit = usize::try_from(q.limit).unwrap_or(usize::MAX);
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| PageToken::new(q, r.entry.seq).encode())
    } else {
        None
    };
    Ok(JwtPage { rows, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q<'a>(spiffe_id: Option<&'a str>, order: Order) -> CertQuery<'a> {
        CertQuery {
            spiffe_id,
            order,
            limit: 10,
            page_token: None,
        }
    }

    #[test]
    fn a_token_round_trips_only_in_its_own_listing() {
        let a = q(Some("spiffe://example.org/a"), Order::NewestFirst);
        let text = PageToken::new(&a, 12_345).encode();
        assert_eq!(PageToken::decode_for(&text, &a).unwrap(), 12_345);
        for other in [
            q(Some("spiffe://example.org/b"), Order::NewestFirst),
            q(None, Order::NewestFirst),
            q(Some("spiffe://example.org/a"), Order::OldestFirst),
        ] {
            let err = PageToken::decode_for(&text, &other).unwrap_err();
            assert!(
                matches!(&err, StoreError::InvalidArgument(m) if m.contains("another listing")),
                "{err}"
            );
        }
    }

    #[test]
    fn garbage_is_invalid_argument_with_a_clear_message() {
        let query = q(None, Order::OldestFirst);
        let good = PageToken::new(&query, 7).encode();
        let mut unknown_version = URL_SAFE_NO_PAD.decode(&good).unwrap();
        unknown_version[0] = 9;
        for (text, why) in [
            ("not a token!", "base64"),
            ("AAAA", "wrong length"),
            (URL_SAFE_NO_PAD.encode(&unknown_version).as_str(), "version"),
            (&good[..good.len() - 2], "base64"),
        ] {
            let err = PageToken::decode_for(text, &query).unwrap_err();
            let StoreError::InvalidArgument(m) = &err else {
                panic!("{err:?}")
            };
            assert!(m.contains("not a page token") && m.contains(why), "{m}");
        }
    }
}
