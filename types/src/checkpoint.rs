//! Signed ledger checkpoints: the ledger's head (sequence number and chain hash) at a moment,
//! signed with a key that is not in the database.
//!
//! The hash chain alone proves that the rows up to the head are consistent with each other;
//! it cannot tell that the last rows were deleted (with the head moved back), nor that someone
//! with write access rewrote a row and recomputed every hash after it. A checkpoint can: an
//! auditor who holds one (seq S, hash H) checks that the chain still reaches row S and that the
//! recomputed hash at row S is still H.
//!
//! # The signed statement (fixed; version 1)
//!
//! The signature is Ed25519 (RFC 8032) over these bytes, nothing else:
//!
//! ```text
//! "signet-ledger-checkpoint-v1\0"          28 bytes, the domain separator
//! u64 big-endian length of trust_domain  ||  trust_domain (UTF-8)
//! u64 big-endian seq                       the head row's sequence number (0: empty ledger)
//! 32 bytes hash                            the head row's chain hash (all zeroes when empty)
//! i64 big-endian time                      unix seconds when the head was read
//! ```
//!
//! The domain separator keeps a checkpoint signature from ever being valid as anything else
//! (and vice versa); the key signs nothing but these statements.
//!
//! # The published form
//!
//! A JSON object with exactly these members (unknown members are refused, so that nobody can
//! believe a field is signed when it is not):
//!
//! ```json
//! {"format":"signet-ledger-checkpoint-v1","trust_domain":"example.org","seq":42,
//!  "hash":"<64 hex>","time":1700000000,"key_id":"<64 hex>","signature":"<128 hex>"}
//! ```
//!
//! `key_id` is the SHA-256 of the public key's DER `SubjectPublicKeyInfo` (what
//! `openssl pkey -pubin -in checkpoint.pub -outform DER | sha256sum` prints); it names the key,
//! the signature is what proves it.

use ring::signature::{self, Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};

use crate::ledger::Hash;

/// The statement format this module signs and verifies.
pub const FORMAT: &str = "signet-ledger-checkpoint-v1";

const DOMAIN: &[u8] = b"signet-ledger-checkpoint-v1\0";

/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo` (RFC 8410): the key's 32 bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// What a checkpoint attests: the head of `trust_domain`'s ledger at `time`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub trust_domain: String,
    /// The last row's sequence number; 0 when the ledger is empty.
    pub seq: u64,
    /// The last row's chain hash; `GENESIS` when the ledger is empty.
    pub hash: Hash,
    /// Unix seconds.
    pub time: i64,
}

/// The exact bytes that are signed (see the module documentation).
pub fn statement(head: &Head) -> Vec<u8> {
    let td = head.trust_domain.as_bytes();
    let mut out = Vec::with_capacity(DOMAIN.len() + 8 + td.len() + 8 + 32 + 8);
    out.extend_from_slice(DOMAIN);
    out.extend_from_slice(&(td.len() as u64).to_be_bytes());
    out.extend_from_slice(td);
    out.extend_from_slice(&head.seq.to_be_bytes());
    out.extend_from_slice(&head.hash);
    out.extend_from_slice(&head.time.to_be_bytes());
    out
}

/// A checkpoint as published: the head, which key signed it, and the signature. Not yet
/// verified: only [`PublicKey::verify`] turns it into a [`VerifiedCheckpoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCheckpoint {
    pub head: Head,
    /// Hex SHA-256 of the signing key's `SubjectPublicKeyInfo`.
    pub key_id: String,
    /// Ed25519 signature over [`statement`].
    pub signature: Vec<u8>,
}

/// Why a checkpoint was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    #[error("not a checkpoint: {0}")]
    Malformed(String),
    #[error("checkpoint format {0:?} is not {FORMAT:?}")]
    Format(String),
    #[error(
        "the checkpoint names signing key {found}, but the given checkpoint key is {expected}: \
         it was signed by another key (or its key id was altered)"
    )]
    OtherKey { expected: String, found: String },
    #[error(
        "the checkpoint's signature does not verify with the checkpoint key: it was altered or forged"
    )]
    BadSignature,
    #[error("not an Ed25519 checkpoint public key: {0}")]
    BadKey(String),
}

/// A checkpoint whose signature verified with a given key: only [`PublicKey::verify`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedCheckpoint {
    head: Head,
    key_id: String,
}

impl VerifiedCheckpoint {
    pub fn head(&self) -> &Head {
        &self.head
    }
    pub fn key_id(&self) -> &str {
        &self.key_id
    }
}

/// The JSON form, field for field.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    format: String,
    trust_domain: String,
    seq: u64,
    hash: String,
    time: i64,
    key_id: String,
    signature: String,
}

impl SignedCheckpoint {
    /// The published JSON (one line, members in the documented order).
    pub fn to_json(&self) -> String {
        let w = Wire {
            format: FORMAT.to_owned(),
            trust_domain: self.head.trust_domain.clone(),
            seq: self.head.seq,
            hash: to_hex(&self.head.hash),
            time: self.head.time,
            key_id: self.key_id.clone(),
            signature: to_hex(&self.signature),
        };
        // Serializing plain strings and integers cannot fail.
        serde_json::to_string(&w).unwrap_or_default()
    }

    /// Parses the published JSON strictly (every member present, no other member).
    pub fn from_json(text: &str) -> Result<Self, CheckpointError> {
        let w: Wire =
            serde_json::from_str(text).map_err(|e| CheckpointError::Malformed(e.to_string()))?;
        if w.format != FORMAT {
            return Err(CheckpointError::Format(w.format));
        }
        let hash: Hash = from_hex(&w.hash)
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| CheckpointError::Malformed("hash is not 64 hex digits".into()))?;
        let signature = from_hex(&w.signature)
            .filter(|s| s.len() == 64)
            .ok_or_else(|| CheckpointError::Malformed("signature is not 128 hex digits".into()))?;
        if from_hex(&w.key_id).is_none_or(|k| k.len() != 32) {
            return Err(CheckpointError::Malformed(
                "key_id is not 64 hex digits".into(),
            ));
        }
        Ok(Self {
            head: Head {
                trust_domain: w.trust_domain,
                seq: w.seq,
                hash,
                time: w.time,
            },
            key_id: w.key_id.to_ascii_lowercase(),
            signature,
        })
    }
}

/// Signs `head` with `key` (the server's checkpoint key).
pub fn sign(key: &Ed25519KeyPair, head: Head) -> SignedCheckpoint {
    let sig = key.sign(&statement(&head));
    let public = PublicKey::from_raw(key.public_key().as_ref()).unwrap_or(PublicKey([0; 32]));
    SignedCheckpoint {
        head,
        key_id: public.key_id(),
        signature: sig.as_ref().to_vec(),
    }
}

/// An Ed25519 checkpoint public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// From the raw 32 bytes.
    pub fn from_raw(raw: &[u8]) -> Result<Self, CheckpointError> {
        raw.try_into()
            .map(Self)
            .map_err(|_| CheckpointError::BadKey(format!("{} bytes, not 32", raw.len())))
    }

    /// From a DER `SubjectPublicKeyInfo`.
    pub fn from_spki_der(der: &[u8]) -> Result<Self, CheckpointError> {
        match der.strip_prefix(&ED25519_SPKI_PREFIX[..]) {
            Some(raw) if raw.len() == 32 => Self::from_raw(raw),
            _ => Err(CheckpointError::BadKey(
                "the SubjectPublicKeyInfo is not an Ed25519 key (RFC 8410)".into(),
            )),
        }
    }

    /// From a PEM `PUBLIC KEY` block (what `/checkpoint.pub` serves).
    pub fn from_pem(pem: &[u8]) -> Result<Self, CheckpointError> {
        let (_, der) = crate::pem::parse_one(pem, &["PUBLIC KEY"])
            .map_err(|e| CheckpointError::BadKey(e.to_string()))?;
        Self::from_spki_der(&der)
    }

    pub fn spki_der(&self) -> Vec<u8> {
        let mut out = ED25519_SPKI_PREFIX.to_vec();
        out.extend_from_slice(&self.0);
        out
    }

    pub fn to_pem(&self) -> String {
        pem::encode_config(
            &pem::Pem::new("PUBLIC KEY", self.spki_der()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        )
    }

    /// Hex SHA-256 of the DER `SubjectPublicKeyInfo`.
    pub fn key_id(&self) -> String {
        to_hex(&crate::ledger::sha256(&self.spki_der()))
    }

    /// Checks that this key signed `cp`.
    pub fn verify(&self, cp: &SignedCheckpoint) -> Result<VerifiedCheckpoint, CheckpointError> {
        let mine = self.key_id();
        if !cp.key_id.eq_ignore_ascii_case(&mine) {
            return Err(CheckpointError::OtherKey {
                expected: mine,
                found: cp.key_id.clone(),
            });
        }
        signature::UnparsedPublicKey::new(&signature::ED25519, &self.0)
            .verify(&statement(&cp.head), &cp.signature)
            .map_err(|_| CheckpointError::BadSignature)?;
        Ok(VerifiedCheckpoint {
            head: cp.head.clone(),
            key_id: mine,
        })
    }
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8032 test 1's secret key: a fixed key, so that signatures are known answers.
    fn rfc8032_key() -> Ed25519KeyPair {
        let seed = [
            0x9d, 0x61, 0xb1, 0x9d, 0xef, 0xfd, 0x5a, 0x60, 0xba, 0x84, 0x4a, 0xf4, 0x92, 0xec,
            0x2c, 0xc4, 0x44, 0x49, 0xc5, 0x69, 0x7b, 0x32, 0x69, 0x19, 0x70, 0x3b, 0xac, 0x03,
            0x1c, 0xae, 0x7f, 0x60,
        ];
        Ed25519KeyPair::from_seed_unchecked(&seed).expect("seed")
    }

    fn head() -> Head {
        Head {
            trust_domain: "example.org".into(),
            seq: 42,
            hash: [0xab; 32],
            time: 1_700_000_000,
        }
    }

    #[test]
    fn the_statement_encoding_is_fixed() {
        let mut want = b"signet-ledger-checkpoint-v1\0".to_vec();
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 11]);
        want.extend_from_slice(b"example.org");
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 42]);
        want.extend_from_slice(&[0xab; 32]);
        want.extend_from_slice(&[0, 0, 0, 0, 0x65, 0x53, 0xf1, 0x00]);
        assert_eq!(statement(&head()), want);
        // Known answer: the SHA-256 of that statement, pinned so that any change to the
        // encoding (which would orphan every published checkpoint) fails here.
        assert_eq!(
            to_hex(&crate::ledger::sha256(&statement(&head()))),
            KNOWN_STATEMENT_SHA256
        );
    }

    /// Computed independently (Python's hashlib over the bytes spelled out above).
    const KNOWN_STATEMENT_SHA256: &str =
        "2ecdc1278de2e7cd08b63a11bffe359e2ad4ddd08e2000ed95b00ad9b6f4832e";

    #[test]
    fn a_known_key_gives_a_known_signature_and_key_id() {
        let key = rfc8032_key();
        let cp = sign(&key, head());
        // RFC 8032 test 1's public key.
        assert_eq!(
            to_hex(key.public_key().as_ref()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
        assert_eq!(to_hex(&cp.signature), KNOWN_SIGNATURE);
        assert_eq!(cp.key_id, KNOWN_KEY_ID);
        let json = cp.to_json();
        assert_eq!(SignedCheckpoint::from_json(&json).expect("parses"), cp);
    }

    /// Computed independently with OpenSSL: the RFC 8032 seed as a PKCS#8 key,
    /// `openssl pkeyutl -sign -rawin` over the statement bytes, and
    /// `openssl pkey -pubout -outform DER | sha256sum` for the key id.
    const KNOWN_SIGNATURE: &str = "ae445d8f67b6bb22c4c37809cfbb1e3a4f22573b18414195bdd024dfd2392526\
                                   52556870a17706d33de24ed6f29cffde498c03f2014eb28d94fb8b55cceb8b09";
    const KNOWN_KEY_ID: &str = "06e3fd8fda29bb60ab59557de61edb0aecdb231134be30e75b455f8e1b792fa9";

    #[test]
    fn signatures_verify_only_with_the_right_key_and_content() {
        let key = rfc8032_key();
        let public = PublicKey::from_raw(key.public_key().as_ref()).expect("key");
        let cp = sign(&key, head());
        let v = public.verify(&cp).expect("verifies");
        assert_eq!(v.head(), &head());

        // Another key: refused, by key id and by signature.
        let rng = ring::rand::SystemRandom::new();
        let other_pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("generate");
        let other = Ed25519KeyPair::from_pkcs8(other_pkcs8.as_ref()).expect("key");
        let other_public = PublicKey::from_raw(other.public_key().as_ref()).expect("key");
        assert!(matches!(
            other_public.verify(&cp),
            Err(CheckpointError::OtherKey { .. })
        ));
        let mut relabelled = cp.clone();
        relabelled.key_id = other_public.key_id();
        assert_eq!(
            other_public.verify(&relabelled),
            Err(CheckpointError::BadSignature)
        );

        // Any altered field breaks the signature.
        let alterations: [fn(&mut SignedCheckpoint); 5] = [
            |c| c.head.seq += 1,
            |c| c.head.hash[31] ^= 1,
            |c| c.head.time += 1,
            |c| c.head.trust_domain.push('x'),
            |c| c.signature[0] ^= 1,
        ];
        for alter in alterations {
            let mut bad = cp.clone();
            alter(&mut bad);
            assert_eq!(public.verify(&bad), Err(CheckpointError::BadSignature));
        }
    }

    #[test]
    fn the_json_form_is_strict() {
        let cp = sign(&rfc8032_key(), head());
        let json = cp.to_json();
        let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
        v["extra"] = serde_json::json!(1);
        assert!(matches!(
            SignedCheckpoint::from_json(&v.to_string()),
            Err(CheckpointError::Malformed(_))
        ));
        let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
        v["format"] = serde_json::json!("signet-ledger-checkpoint-v0");
        assert!(matches!(
            SignedCheckpoint::from_json(&v.to_string()),
            Err(CheckpointError::Format(_))
        ));
        let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
        v["hash"] = serde_json::json!("abcd");
        assert!(SignedCheckpoint::from_json(&v.to_string()).is_err());
        assert!(SignedCheckpoint::from_json("not json").is_err());
    }

    #[test]
    fn public_key_pem_round_trip() {
        let key = rfc8032_key();
        let public = PublicKey::from_raw(key.public_key().as_ref()).expect("key");
        let pem = public.to_pem();
        assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----"));
        assert_eq!(PublicKey::from_pem(pem.as_bytes()).expect("parses"), public);
        assert!(
            PublicKey::from_pem(b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n")
                .is_err()
        );
    }
}
