//! Signed ledger checkpoints: the ledger's head (sequence number and chain hash) at a moment,
//! signed with a key that is not in the database.
//!
//! The hash chain alone proves that the rows up to the head are consistent with each other;
//! it cannot tell that the last rows were deleted (with the head moved back), nor that someone
//! with write access rewrote a row and recomputed every hash after it. A checkpoint can: an
//! auditor who holds one (seq S, hash H) checks that the chain still reaches row S and that the
//! recomputed hash at row S is still H.
//!
//! Since version 2 a checkpoint also names the checkpoint it extends (its `previous`): the
//! signer only signs a head whose chain still holds that earlier (seq, hash), so one retained
//! checkpoint proves continuity with its predecessor, and a chain of them shows a head that
//! went back (a checkpoint whose `previous` is not the one before it, or is above itself).
//!
//! # The signed statement, version 2 (what the server signs)
//!
//! The signature is Ed25519 (RFC 8032) over these bytes, nothing else:
//!
//! ```text
//! "signet-ledger-checkpoint-v2\0"          28 bytes, the domain separator
//! u64 big-endian length of trust_domain  ||  trust_domain (UTF-8)
//! u64 big-endian seq                       the head row's sequence number (0: empty ledger)
//! 32 bytes hash                            the head row's chain hash (all zeroes when empty)
//! i64 big-endian time                      unix seconds when the head was read
//! u64 big-endian previous_seq              the seq of the checkpoint this one extends
//! 32 bytes previous_hash                   that checkpoint's hash
//! ```
//!
//! `previous` is the newest checkpoint the signer knew this key had signed (its own, or one it
//! found and verified); `0` and all zeroes (the empty ledger, which every chain extends) when it
//! knew none. It is never above the checkpoint's own seq, and equal to it only with the same
//! hash (a checkpoint of an unchanged head).
//!
//! # The signed statement, version 1 (verified, no longer signed)
//!
//! ```text
//! "signet-ledger-checkpoint-v1\0"          28 bytes, the domain separator
//! u64 big-endian length of trust_domain  ||  trust_domain (UTF-8)
//! u64 big-endian seq
//! 32 bytes hash
//! i64 big-endian time
//! ```
//!
//! The domain separators keep a checkpoint signature from ever being valid as anything else,
//! or as the other version (and vice versa); the key signs nothing but these statements.
//!
//! # The published form
//!
//! A JSON object with exactly these members (unknown members are refused, so that nobody can
//! believe a field is signed when it is not; `previous_*` only, and always, in version 2):
//!
//! ```json
//! {"format":"signet-ledger-checkpoint-v2","trust_domain":"example.org","seq":42,
//!  "hash":"<64 hex>","time":1700000000,"previous_seq":40,"previous_hash":"<64 hex>",
//!  "key_id":"<64 hex>","signature":"<128 hex>"}
//! ```
//!
//! `key_id` is the SHA-256 of the public key's DER `SubjectPublicKeyInfo` (what
//! `openssl pkey -pubin -in checkpoint.pub -outform DER | sha256sum` prints); it names the key,
//! the signature is what proves it.

use ring::signature::{self, Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};

use crate::ledger::{GENESIS, Hash};

/// The statement format the server signs (version 2).
pub const FORMAT: &str = FORMAT_V2;
/// Version 2: the head and the checkpoint it extends.
pub const FORMAT_V2: &str = "signet-ledger-checkpoint-v2";
/// Version 1: the head only. Still verified (checkpoints signed before version 2).
pub const FORMAT_V1: &str = "signet-ledger-checkpoint-v1";

const DOMAIN_V1: &[u8] = b"signet-ledger-checkpoint-v1\0";
const DOMAIN_V2: &[u8] = b"signet-ledger-checkpoint-v2\0";

/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo` (RFC 8410): the key's 32 bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// A point of the ledger's chain: a row's sequence number and its chain hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mark {
    pub seq: u64,
    pub hash: Hash,
}

impl Mark {
    /// The empty ledger (seq 0, all zeroes), which every chain extends.
    pub const GENESIS: Mark = Mark {
        seq: 0,
        hash: GENESIS,
    };
}

impl std::fmt::Display for Mark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "row {} (hash {})", self.seq, to_hex(&self.hash))
    }
}

/// What a checkpoint attests: the head of `trust_domain`'s ledger at `time`, and (version 2)
/// the checkpoint it extends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub trust_domain: String,
    /// The last row's sequence number; 0 when the ledger is empty.
    pub seq: u64,
    /// The last row's chain hash; `GENESIS` when the ledger is empty.
    pub hash: Hash,
    /// Unix seconds.
    pub time: i64,
    /// The checkpoint this one extends ([`Mark::GENESIS`] when the signer knew none): a
    /// version 2 statement. `None`: a version 1 statement, which does not say.
    pub previous: Option<Mark>,
}

impl Head {
    /// The head as a point of the chain.
    pub fn mark(&self) -> Mark {
        Mark {
            seq: self.seq,
            hash: self.hash,
        }
    }

    /// The statement format this head is signed in.
    pub fn format(&self) -> &'static str {
        if self.previous.is_some() {
            FORMAT_V2
        } else {
            FORMAT_V1
        }
    }
}

/// The exact bytes that are signed (see the module documentation): version 2 when the head
/// names its previous checkpoint, version 1 when not.
pub fn statement(head: &Head) -> Vec<u8> {
    let td = head.trust_domain.as_bytes();
    let domain = if head.previous.is_some() {
        DOMAIN_V2
    } else {
        DOMAIN_V1
    };
    let mut out = Vec::with_capacity(domain.len() + 8 + td.len() + 8 + 32 + 8 + 8 + 32);
    out.extend_from_slice(domain);
    out.extend_from_slice(&(td.len() as u64).to_be_bytes());
    out.extend_from_slice(td);
    out.extend_from_slice(&head.seq.to_be_bytes());
    out.extend_from_slice(&head.hash);
    out.extend_from_slice(&head.time.to_be_bytes());
    if let Some(p) = &head.previous {
        out.extend_from_slice(&p.seq.to_be_bytes());
        out.extend_from_slice(&p.hash);
    }
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
    #[error("checkpoint format {0:?} is neither {FORMAT_V2:?} nor {FORMAT_V1:?}")]
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

/// The JSON form, field for field (`previous_*`: version 2 only).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    format: String,
    trust_domain: String,
    seq: u64,
    hash: String,
    time: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_hash: Option<String>,
    key_id: String,
    signature: String,
}

fn hash_of(hex: &str, what: &str) -> Result<Hash, CheckpointError> {
    from_hex(hex)
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| CheckpointError::Malformed(format!("{what} is not 64 hex digits")))
}

impl SignedCheckpoint {
    /// The published JSON (one line, members in the documented order).
    pub fn to_json(&self) -> String {
        let w = Wire {
            format: self.head.format().to_owned(),
            trust_domain: self.head.trust_domain.clone(),
            seq: self.head.seq,
            hash: to_hex(&self.head.hash),
            time: self.head.time,
            previous_seq: self.head.previous.map(|p| p.seq),
            previous_hash: self.head.previous.map(|p| to_hex(&p.hash)),
            key_id: self.key_id.clone(),
            signature: to_hex(&self.signature),
        };
        // Serializing plain strings and integers cannot fail.
        serde_json::to_string(&w).unwrap_or_default()
    }

    /// Parses the published JSON strictly (every member of its version present, no other
    /// member).
    pub fn from_json(text: &str) -> Result<Self, CheckpointError> {
        let w: Wire =
            serde_json::from_str(text).map_err(|e| CheckpointError::Malformed(e.to_string()))?;
        let previous = match (w.format.as_str(), w.previous_seq, &w.previous_hash) {
            (FORMAT_V2, Some(seq), Some(hash)) => Some(Mark {
                seq,
                hash: hash_of(hash, "previous_hash")?,
            }),
            (FORMAT_V2, _, _) => {
                return Err(CheckpointError::Malformed(
                    "a version 2 checkpoint needs previous_seq and previous_hash".into(),
                ));
            }
            (FORMAT_V1, None, None) => None,
            (FORMAT_V1, _, _) => {
                return Err(CheckpointError::Malformed(
                    "a version 1 checkpoint has no previous_seq or previous_hash (they would \
                     not be signed)"
                        .into(),
                ));
            }
            _ => return Err(CheckpointError::Format(w.format)),
        };
        let hash = hash_of(&w.hash, "hash")?;
        if let Some(p) = previous
            && (p.seq > w.seq || (p.seq == w.seq && p.hash != hash))
        {
            return Err(CheckpointError::Malformed(format!(
                "previous_seq {} is above seq {} (or the same row with another hash): a \
                 checkpoint extends its previous one, it never goes back",
                p.seq, w.seq
            )));
        }
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
                previous,
            },
            key_id: w.key_id.to_ascii_lowercase(),
            signature,
        })
    }
}

/// Signs `head` with `key` (the server's checkpoint key): version 2 when `head.previous` is
/// set (what the server does), version 1 when not (kept for tests of old checkpoints).
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

    /// A version 1 head (no previous).
    fn head() -> Head {
        Head {
            trust_domain: "example.org".into(),
            seq: 42,
            hash: [0xab; 32],
            time: 1_700_000_000,
            previous: None,
        }
    }

    /// The same head, version 2, extending row 40.
    fn head_v2() -> Head {
        Head {
            previous: Some(Mark {
                seq: 40,
                hash: [0xcd; 32],
            }),
            ..head()
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
    fn the_v2_statement_encoding_is_fixed() {
        let mut want = b"signet-ledger-checkpoint-v2\0".to_vec();
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 11]);
        want.extend_from_slice(b"example.org");
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 42]);
        want.extend_from_slice(&[0xab; 32]);
        want.extend_from_slice(&[0, 0, 0, 0, 0x65, 0x53, 0xf1, 0x00]);
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 40]);
        want.extend_from_slice(&[0xcd; 32]);
        assert_eq!(statement(&head_v2()), want);
        assert_eq!(
            to_hex(&crate::ledger::sha256(&statement(&head_v2()))),
            KNOWN_V2_STATEMENT_SHA256
        );
        assert_eq!(head_v2().format(), FORMAT_V2);
        assert_eq!(head().format(), FORMAT_V1);
    }

    /// Computed independently (Python's hashlib over the bytes spelled out above).
    const KNOWN_V2_STATEMENT_SHA256: &str =
        "9039d33f547d4d7834ac2e07913d30ac50fce3df3dc12f13c2d7d505bd5602a2";

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

        let v2 = sign(&key, head_v2());
        assert_eq!(to_hex(&v2.signature), KNOWN_V2_SIGNATURE);
        let json = v2.to_json();
        assert!(json.contains(r#""format":"signet-ledger-checkpoint-v2""#));
        assert!(
            json.contains(r#""previous_seq":40,"previous_hash":"cdcd"#),
            "{json}"
        );
        assert_eq!(SignedCheckpoint::from_json(&json).expect("parses"), v2);
    }

    /// Computed independently with OpenSSL: the RFC 8032 seed as a PKCS#8 key,
    /// `openssl pkeyutl -sign -rawin` over the statement bytes, and
    /// `openssl pkey -pubout -outform DER | sha256sum` for the key id.
    const KNOWN_SIGNATURE: &str = "ae445d8f67b6bb22c4c37809cfbb1e3a4f22573b18414195bdd024dfd2392526\
                                   52556870a17706d33de24ed6f29cffde498c03f2014eb28d94fb8b55cceb8b09";
    const KNOWN_KEY_ID: &str = "06e3fd8fda29bb60ab59557de61edb0aecdb231134be30e75b455f8e1b792fa9";
    /// Computed independently with Python's `cryptography` (Ed25519 over the v2 bytes above).
    const KNOWN_V2_SIGNATURE: &str = "9ee0f7397ab5c4f8c8d9c6edf226ee095bf2463ad6fe5373e6373eebe33f9252\
                                      ecd8d8bffad3616a1bad32e87067c68b0bc76d3f629c60f42a7aa27aa302e309";

    #[test]
    fn signatures_verify_only_with_the_right_key_and_content() {
        let key = rfc8032_key();
        let public = PublicKey::from_raw(key.public_key().as_ref()).expect("key");
        for head in [head(), head_v2()] {
            let cp = sign(&key, head.clone());
            let v = public.verify(&cp).expect("verifies");
            assert_eq!(v.head(), &head);

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
        // The previous checkpoint is signed too.
        let cp = sign(&key, head_v2());
        for alter in [|p: &mut Mark| p.seq -= 1, |p: &mut Mark| p.hash[0] ^= 1] {
            let mut bad = cp.clone();
            alter(bad.head.previous.as_mut().expect("v2"));
            assert_eq!(public.verify(&bad), Err(CheckpointError::BadSignature));
        }
    }

    #[test]
    fn a_signature_of_one_version_is_not_valid_as_the_other() {
        let key = rfc8032_key();
        let public = PublicKey::from_raw(key.public_key().as_ref()).expect("key");
        // A v2 signature presented as v1 (previous dropped): refused.
        let mut as_v1 = sign(&key, head_v2());
        as_v1.head.previous = None;
        assert_eq!(public.verify(&as_v1), Err(CheckpointError::BadSignature));
        // A v1 signature presented as v2 (any previous added, even the empty ledger): refused.
        for previous in [Mark::GENESIS, head().mark()] {
            let mut as_v2 = sign(&key, head());
            as_v2.head.previous = Some(previous);
            assert_eq!(public.verify(&as_v2), Err(CheckpointError::BadSignature));
        }
        // The same through the JSON: a v1 file relabelled v2 (with previous members) or a v2
        // file relabelled v1 (without them) parses, and does not verify.
        let v1 = sign(&key, head()).to_json();
        let mut j: serde_json::Value = serde_json::from_str(&v1).expect("json");
        j["format"] = serde_json::json!(FORMAT_V2);
        j["previous_seq"] = serde_json::json!(0);
        j["previous_hash"] = serde_json::json!(to_hex(&GENESIS));
        let relabelled = SignedCheckpoint::from_json(&j.to_string()).expect("parses");
        assert_eq!(
            public.verify(&relabelled),
            Err(CheckpointError::BadSignature)
        );
        let v2 = sign(&key, head_v2()).to_json();
        let mut j: serde_json::Value = serde_json::from_str(&v2).expect("json");
        j["format"] = serde_json::json!(FORMAT_V1);
        let obj = j.as_object_mut().expect("object");
        obj.remove("previous_seq");
        obj.remove("previous_hash");
        let relabelled = SignedCheckpoint::from_json(&j.to_string()).expect("parses");
        assert_eq!(
            public.verify(&relabelled),
            Err(CheckpointError::BadSignature)
        );
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

        // Version 1 never carries previous members (they would not be signed)...
        let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
        v["previous_seq"] = serde_json::json!(1);
        v["previous_hash"] = serde_json::json!(to_hex(&[1; 32]));
        let err = SignedCheckpoint::from_json(&v.to_string()).unwrap_err();
        assert!(err.to_string().contains("version 1"), "{err}");
        // ... and version 2 always does, with a hash, never above its own head.
        let v2 = sign(&rfc8032_key(), head_v2()).to_json();
        for (member, value) in [
            ("previous_seq", serde_json::Value::Null),
            ("previous_hash", serde_json::Value::Null),
            ("previous_hash", serde_json::json!("abcd")),
            ("previous_seq", serde_json::json!(43)),
            ("previous_seq", serde_json::json!(42)),
        ] {
            let mut v: serde_json::Value = serde_json::from_str(&v2).expect("json");
            v[member] = value;
            assert!(
                matches!(
                    SignedCheckpoint::from_json(&v.to_string()),
                    Err(CheckpointError::Malformed(_))
                ),
                "{v}"
            );
        }
        // An unchanged head (previous = itself) is fine.
        let same = Head {
            previous: Some(head().mark()),
            ..head()
        };
        let cp = sign(&rfc8032_key(), same);
        assert_eq!(
            SignedCheckpoint::from_json(&cp.to_json()).expect("parses"),
            cp
        );
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
