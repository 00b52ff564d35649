//! The agent's cache of what it serves, kept in `data_dir` (file [`CACHE_FILE`]) so that a
//! restart while the server is down keeps serving: the last `SyncEntries` answer (entries,
//! revision, federated bundles), the trust bundle, the CRLs and JWT keys in force, and the
//! workloads' X509-SVIDs with their private keys. The driver writes it after the served state
//! changes ([`crate::driver`]) and reads it once at start, before the server answers.
//!
//! The file is sealed: AES-256-GCM under a key derived with HKDF-SHA256 from the node's
//! private key (`node.key`), with a fresh random nonce per write, the header bound in as
//! associated data. So a file that was modified, truncated, corrupted, copied from another node
//! or written under an earlier node key is refused as a whole ([`CacheError`]), never read,
//! and the agent starts without it (the server sends everything again when it answers).
//! What decrypts is still checked, as what the server sends is ([`load`]): the trust domain is
//! the node's, every entry parses, and every SVID is an X509-SVID for its key, names its
//! entry's SPIFFE ID, chains to the cached bundle and is valid now; an expired one is dropped,
//! any other failure drops that SVID and is reported. (One a CRL the agent holds lists is
//! dropped by the rotator: [`crate::rotator::Rotator::restore`].)
//!
//! Replay: each write seals a sequence number one above the floor in [`FLOOR_FILE`], then
//! raises the floor; a cache below the floor is refused ([`CacheError::Replayed`]). A writer
//! who puts back the floor too is not detected (SECURITY.md). The ban state is sealed too.
//!
//! What this protects against, and what not (SECURITY.md, "The agent's data directory"): a
//! writer of the directory who does not hold the node key cannot make the agent serve an
//! identity it was not given; whoever can replace `node.key` itself (the agent's uid, root)
//! already controls the agent. The directory must be owned by the agent's uid and closed to
//! group and others (0700; created so when absent): in one others can write, the cache is
//! refused and the reason logged with the `chmod` that fixes it. So is a cache file owned by
//! another uid (root aside) or writable by group or others; it is opened with `O_NOFOLLOW`.
//!
//! Format (version 1): `MAGIC` (8 bytes) ‖ key ID (16 bytes, HKDF of the node key under
//! another label: tells "another node key" apart from "tampered") ‖ nonce (12 bytes) ‖
//! ciphertext and tag. The plaintext is a protobuf message ([`CacheDoc`], prost-derived, this
//! module's only reader and writer). Written atomically, mode 0600 ([`crate::node::write_atomic`]).

use std::io::Read as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf;
use ring::rand::SecureRandom;
use signet_pki::X509Svid;
use signet_pki::jwt::{JwtAlg, JwtPublicKey};
use signet_types::{SpiffeId, TrustDomain};

use crate::ca::{EntrySpec, FederatedBundle};
use crate::node::NodeIdentity;
use crate::state::{AgentState, Selector};

/// The cache file in `data_dir`.
pub const CACHE_FILE: &str = "cache.sealed";
/// The replay floor in `data_dir`: the sequence number of the last cache written, in decimal
/// (not secret, not sealed). A cache sealed with a lower sequence is a replay and is refused.
pub const FLOOR_FILE: &str = "cache.floor";
/// Format version 1.
const MAGIC: &[u8; 8] = b"SGNTAC\x00\x01";
const KEY_ID_LEN: usize = 16;
const HEADER_LEN: usize = MAGIC.len() + KEY_ID_LEN + NONCE_LEN;
/// A larger file is refused unread (10,000 entries take about 30 MB).
pub const MAX_FILE_BYTES: u64 = 64 << 20;
const HKDF_SALT: &[u8] = b"signet-agent cache v1";

/// Why the cache was not written or not used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The directory could be changed by another user: its files are not trusted.
    #[error(
        "data_dir {} is {why}: other users could replace the agent's files, so the cache is \
         not used. Fix: `chown <agent user> {0}` and `chmod 0700 {0}`",
        dir.display(),
        why = why
    )]
    UnsafeDir { dir: PathBuf, why: String },
    #[error("{} is {size} bytes, over the {MAX_FILE_BYTES}-byte limit; ignoring it", path.display())]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{} is not an agent cache of this format (bad header); ignoring it", path.display())]
    Format { path: PathBuf },
    #[error(
        "{} was sealed under another node key (the node re-attested, or its key was replaced); \
         ignoring it",
        path.display()
    )]
    OtherKey { path: PathBuf },
    #[error(
        "{} fails authentication: it was modified, truncated or corrupted after the agent \
         wrote it; ignoring it (nothing in it is served)",
        path.display()
    )]
    Tampered { path: PathBuf },
    /// Authentic but not usable (another trust domain, an entry that does not parse).
    #[error("{}: {why}; ignoring it", path.display())]
    Content { path: PathBuf, why: String },
    /// The file may be changed by another user (its owner or mode).
    #[error(
        "{} is {why}: another user could replace it, so it is not used. Fix: `chown <agent \
         user> {0}` and `chmod 0600 {0}`",
        path.display(),
        why = why
    )]
    UnsafeFile { path: PathBuf, why: String },
    /// Authentic, but older than the last cache the agent wrote ([`FLOOR_FILE`]).
    #[error(
        "{} is an older cache (sequence {sequence}) than the last one the agent wrote \
         (sequence {floor}, {FLOOR_FILE}): it was replayed; ignoring it",
        path.display()
    )]
    Replayed {
        path: PathBuf,
        sequence: u64,
        floor: u64,
    },
    /// The sealing key cannot be derived, or a nonce drawn (a local fault).
    #[error("cannot seal the cache: {0}")]
    Crypto(&'static str),
}

/// What the agent saves: the entries it holds at `revision` and the state it serves.
pub struct Snapshot<'a> {
    pub revision: u64,
    pub entries: &'a [EntrySpec],
    pub trust_domain: &'a TrustDomain,
    pub state: &'a AgentState,
    /// The node ID the server refuses as banned, and since when (restored as banned).
    pub banned: Option<(&'a str, SystemTime)>,
}

/// What [`load`] found usable.
#[derive(Debug)]
pub struct Restored {
    pub written_at: SystemTime,
    pub revision: u64,
    pub entries: Vec<EntrySpec>,
    pub bundle: Vec<Vec<u8>>,
    pub crls: Vec<Vec<u8>>,
    pub jwt_keys: Vec<JwtPublicKey>,
    pub jwt_tainted: Vec<String>,
    pub federated: Vec<FederatedBundle>,
    /// The SVIDs to serve, by entry ID: checked as the module docs say.
    pub svids: Vec<(String, X509Svid)>,
    /// SVIDs that had expired (dropped).
    pub expired: usize,
    /// SVIDs dropped for another reason: entry ID and why.
    pub dropped: Vec<(String, String)>,
    /// The node was banned when the cache was written: its node ID, since when.
    pub banned: Option<(String, SystemTime)>,
}

/// What `data_dir` holds.
#[derive(Debug)]
pub enum Loaded {
    Absent,
    /// Present and refused: the reason (log it; nothing in the file is used).
    Refused(CacheError),
    Found(Box<Restored>),
}

// --- the plaintext --------------------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
struct CacheDoc {
    #[prost(uint64, tag = "1")]
    written_at_unix: u64,
    #[prost(string, tag = "2")]
    trust_domain: String,
    #[prost(uint64, tag = "3")]
    revision: u64,
    #[prost(message, repeated, tag = "4")]
    entries: Vec<EntryDoc>,
    #[prost(bytes = "vec", repeated, tag = "5")]
    bundle: Vec<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    crls: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "7")]
    jwt_keys: Vec<JwtKeyDoc>,
    #[prost(string, repeated, tag = "8")]
    jwt_tainted: Vec<String>,
    #[prost(message, repeated, tag = "9")]
    federated: Vec<FederatedDoc>,
    #[prost(message, repeated, tag = "10")]
    svids: Vec<SvidDoc>,
    /// One more than the floor at the write ([`FLOOR_FILE`]); 0 in caches written before.
    #[prost(uint64, tag = "11")]
    sequence: u64,
    /// Empty: not banned.
    #[prost(string, tag = "12")]
    banned_node_id: String,
    #[prost(uint64, tag = "13")]
    banned_since_unix: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EntryDoc {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    spiffe_id: String,
    #[prost(string, tag = "3")]
    parent_id: String,
    #[prost(string, repeated, tag = "4")]
    selectors: Vec<String>,
    #[prost(uint64, tag = "5")]
    ttl_millis: u64,
    #[prost(string, repeated, tag = "6")]
    dns_names: Vec<String>,
    #[prost(uint64, tag = "7")]
    revision: u64,
    #[prost(string, repeated, tag = "8")]
    federates_with: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct JwtKeyDoc {
    #[prost(string, tag = "1")]
    kid: String,
    /// Empty: none stated.
    #[prost(string, tag = "2")]
    alg: String,
    #[prost(bytes = "vec", tag = "3")]
    spki_der: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FederatedDoc {
    #[prost(string, tag = "1")]
    trust_domain: String,
    #[prost(bytes = "vec", repeated, tag = "2")]
    roots: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "3")]
    jwt_keys: Vec<JwtKeyDoc>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SvidDoc {
    #[prost(string, tag = "1")]
    entry_id: String,
    #[prost(bytes = "vec", repeated, tag = "2")]
    chain: Vec<Vec<u8>>,
    /// PKCS#8 DER (sealed with the rest).
    #[prost(bytes = "vec", tag = "3")]
    key: Vec<u8>,
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn jwt_doc(k: &JwtPublicKey) -> JwtKeyDoc {
    JwtKeyDoc {
        kid: k.key_id().to_owned(),
        alg: k.alg().map(|a| a.as_str().to_owned()).unwrap_or_default(),
        spki_der: k.spki_der().to_vec(),
    }
}

fn jwt_key(d: &JwtKeyDoc) -> Result<JwtPublicKey, String> {
    let alg = match d.alg.as_str() {
        "" => None,
        a => Some(JwtAlg::parse(a).ok_or_else(|| format!("JWT key {}: alg {a}", d.kid))?),
    };
    JwtPublicKey::from_spki(d.kid.clone(), alg, &d.spki_der)
        .map_err(|e| format!("JWT key {}: {e}", d.kid))
}

impl CacheDoc {
    fn of(s: &Snapshot<'_>, now: SystemTime, sequence: u64) -> Self {
        let st = s.state;
        CacheDoc {
            sequence,
            banned_node_id: s.banned.map(|(id, _)| id.to_owned()).unwrap_or_default(),
            banned_since_unix: s.banned.map_or(0, |(_, t)| unix_secs(t)),
            written_at_unix: unix_secs(now),
            trust_domain: s.trust_domain.as_str().to_owned(),
            revision: s.revision,
            entries: s
                .entries
                .iter()
                .map(|e| EntryDoc {
                    id: e.id.clone(),
                    spiffe_id: e.spiffe_id.to_string(),
                    parent_id: e.parent_id.clone(),
                    selectors: e.selectors.iter().map(ToString::to_string).collect(),
                    ttl_millis: u64::try_from(e.ttl.as_millis()).unwrap_or(u64::MAX),
                    dns_names: e.dns_names.clone(),
                    revision: e.revision,
                    federates_with: e
                        .federates_with
                        .iter()
                        .map(|t| t.as_str().to_owned())
                        .collect(),
                })
                .collect(),
            bundle: st.bundle_der.to_vec(),
            crls: st.crls_der.to_vec(),
            jwt_keys: st.jwt_keys.iter().map(jwt_doc).collect(),
            jwt_tainted: st.jwt_tainted.to_vec(),
            federated: st
                .federated
                .iter()
                .map(|b| FederatedDoc {
                    trust_domain: b.trust_domain.as_str().to_owned(),
                    roots: b.roots_der.to_vec(),
                    jwt_keys: b.jwt_keys.iter().map(jwt_doc).collect(),
                })
                .collect(),
            svids: st
                .identities
                .iter()
                .map(|i| SvidDoc {
                    entry_id: i.entry_id.clone(),
                    chain: i.svid.certificate().chain_der().to_vec(),
                    key: i.svid.key().pkcs8_der().to_vec(),
                })
                .collect(),
        }
    }
}

// --- sealing --------------------------------------------------------------------------------

/// An HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// The AEAD key and its ID, derived from the node's private key.
struct SealKey {
    aead: LessSafeKey,
    id: [u8; KEY_ID_LEN],
}

impl SealKey {
    fn of(node: &NodeIdentity) -> Result<Self, CacheError> {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT).extract(node.key().pkcs8_der());
        let okm = prk
            .expand(&[b"aes-256-gcm key"], &AES_256_GCM)
            .map_err(|_| CacheError::Crypto("HKDF"))?;
        let aead = LessSafeKey::new(UnboundKey::from(okm));
        let mut id = [0u8; KEY_ID_LEN];
        prk.expand(&[b"key id"], Len(KEY_ID_LEN))
            .and_then(|o| o.fill(&mut id))
            .map_err(|_| CacheError::Crypto("HKDF"))?;
        Ok(Self { aead, id })
    }
}

fn seal(key: &SealKey, mut plaintext: Vec<u8>) -> Result<Vec<u8>, CacheError> {
    let mut nonce = [0u8; NONCE_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| CacheError::Crypto("random nonce"))?;
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&key.id);
    key.aead
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&header[..]),
            &mut plaintext,
        )
        .map_err(|_| CacheError::Crypto("AES-GCM"))?;
    header.extend_from_slice(&nonce);
    header.append(&mut plaintext);
    Ok(header)
}

fn open(key: &SealKey, path: &Path, mut file: Vec<u8>) -> Result<Vec<u8>, CacheError> {
    if file.len() < HEADER_LEN || &file[..MAGIC.len()] != MAGIC {
        return Err(CacheError::Format {
            path: path.to_owned(),
        });
    }
    if file[MAGIC.len()..MAGIC.len() + KEY_ID_LEN] != key.id {
        return Err(CacheError::OtherKey {
            path: path.to_owned(),
        });
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&file[MAGIC.len() + KEY_ID_LEN..HEADER_LEN]);
    let mut body = file.split_off(HEADER_LEN);
    let aad = &file[..MAGIC.len() + KEY_ID_LEN];
    let n = key
        .aead
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut body,
        )
        .map_err(|_| CacheError::Tampered {
            path: path.to_owned(),
        })?
        .len();
    body.truncate(n);
    Ok(body)
}

// --- the directory --------------------------------------------------------------------------

/// Refuses a `data_dir` that another user could change: not owned by the agent's uid, or
/// writable by its group or others.
fn check_dir(dir: &Path) -> Result<(), CacheError> {
    let meta = std::fs::metadata(dir).map_err(|source| CacheError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let me = rustix::process::geteuid().as_raw();
    let why = if meta.uid() != me && meta.uid() != 0 {
        Some(format!(
            "owned by uid {}, not the agent's uid {me}",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "writable by its group or others (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(CacheError::UnsafeDir {
            dir: dir.to_owned(),
            why,
        }),
        None => Ok(()),
    }
}

// --- save and load --------------------------------------------------------------------------

/// Seals `snapshot` under `node`'s key and writes it to `dir` atomically (mode 0600; the
/// directory is created 0700 when absent). Blocking (encrypt, write, fsync).
pub fn save(
    dir: &Path,
    node: &NodeIdentity,
    snapshot: &Snapshot<'_>,
    now: SystemTime,
) -> Result<(), CacheError> {
    let io = |source| CacheError::Io {
        path: dir.to_owned(),
        source,
    };
    crate::node::ensure_dir(dir).map_err(io)?;
    check_dir(dir)?;
    let sequence = read_floor(dir).saturating_add(1);
    let plaintext = prost::Message::encode_to_vec(&CacheDoc::of(snapshot, now, sequence));
    let sealed = seal(&SealKey::of(node)?, plaintext)?;
    let path = dir.join(CACHE_FILE);
    crate::node::write_atomic(&path, &sealed, 0o600)
        .map_err(|source| CacheError::Io { path, source })?;
    let floor = dir.join(FLOOR_FILE);
    crate::node::write_atomic(&floor, format!("{sequence}\n").as_bytes(), 0o600).map_err(|source| {
        CacheError::Io {
            path: floor,
            source,
        }
    })
}

/// The replay floor in `dir` ([`FLOOR_FILE`]); 0 when absent or unreadable (the first write,
/// or a floor removed: then a replay is not detected, see SECURITY.md).
fn read_floor(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join(FLOOR_FILE))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Reads the cache in `dir` sealed under `node`'s key, and checks what it holds at `now` (see
/// the module docs). Blocking.
pub fn load(dir: &Path, node: &NodeIdentity, now: SystemTime) -> Loaded {
    let path = dir.join(CACHE_FILE);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::Absent,
        Err(source) => return Loaded::Refused(CacheError::Io { path, source }),
    };
    match read_checked(dir, &path, &meta, node, now) {
        Ok(r) => Loaded::Found(Box::new(r)),
        Err(e) => Loaded::Refused(e),
    }
}

fn read_checked(
    dir: &Path,
    path: &Path,
    meta: &std::fs::Metadata,
    node: &NodeIdentity,
    now: SystemTime,
) -> Result<Restored, CacheError> {
    check_dir(dir)?;
    if !meta.file_type().is_file() {
        return Err(CacheError::Content {
            path: path.to_owned(),
            why: "not a regular file".into(),
        });
    }
    let io = |source| CacheError::Io {
        path: path.to_owned(),
        source,
    };
    // Not through a symbolic link swapped in since; the checks are of what was opened.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    check_file(path, &meta)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(CacheError::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
        });
    }
    let mut file = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    (&mut f)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut file)
        .map_err(io)?;
    let plaintext = open(&SealKey::of(node)?, path, file)?;
    let content = |why: String| CacheError::Content {
        path: path.to_owned(),
        why,
    };
    let doc: CacheDoc = prost::Message::decode(plaintext.as_slice())
        .map_err(|e| content(format!("does not decode: {e}")))?;
    let floor = read_floor(dir);
    if doc.sequence < floor {
        return Err(CacheError::Replayed {
            path: path.to_owned(),
            sequence: doc.sequence,
            floor,
        });
    }
    restore(doc, node, now).map_err(content)
}

/// Refuses a cache file another user could have written: a regular file, owned by the agent's
/// uid or root, not writable by its group or others.
fn check_file(path: &Path, meta: &std::fs::Metadata) -> Result<(), CacheError> {
    let me = rustix::process::geteuid().as_raw();
    let why = if !meta.file_type().is_file() {
        Some("not a regular file".to_owned())
    } else if meta.uid() != me && meta.uid() != 0 {
        Some(format!(
            "owned by uid {}, not the agent's uid {me}",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "writable by its group or others (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(CacheError::UnsafeFile {
            path: path.to_owned(),
            why,
        }),
        None => Ok(()),
    }
}

/// The checks of what decrypted (see the module docs).
fn restore(doc: CacheDoc, node: &NodeIdentity, now: SystemTime) -> Result<Restored, String> {
    let own = node.spiffe_id().trust_domain();
    if doc.trust_domain != own.as_str() {
        return Err(format!(
            "written for trust domain {:?}, not the node's {}",
            doc.trust_domain, own
        ));
    }
    let mut entries = Vec::with_capacity(doc.entries.len());
    for e in doc.entries {
        let bad = |why: String| format!("entry {}: {why}", e.id);
        let spiffe_id: SpiffeId = e.spiffe_id.parse().map_err(|x| bad(format!("{x}")))?;
        let selectors = e
            .selectors
            .iter()
            .map(|s| s.parse::<Selector>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|x| bad(format!("{x}")))?;
        let federates_with = e
            .federates_with
            .iter()
            .map(|t| t.parse::<TrustDomain>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|x| bad(format!("{x}")))?;
        entries.push(EntrySpec {
            id: e.id,
            spiffe_id,
            parent_id: e.parent_id,
            selectors,
            ttl: Duration::from_millis(e.ttl_millis),
            dns_names: e.dns_names,
            revision: e.revision,
            federates_with,
        });
    }
    let jwt_keys = doc
        .jwt_keys
        .iter()
        .map(jwt_key)
        .collect::<Result<Vec<_>, _>>()?;
    let mut federated = Vec::with_capacity(doc.federated.len());
    for f in doc.federated {
        federated.push(FederatedBundle {
            trust_domain: f
                .trust_domain
                .parse()
                .map_err(|e| format!("federated bundle {}: {e}", f.trust_domain))?,
            x509_authorities: f.roots,
            jwt_authorities: f.jwt_keys.iter().map(jwt_key).collect::<Result<_, _>>()?,
            sequence: 0,
        });
    }
    let mut svids = Vec::with_capacity(doc.svids.len());
    let mut expired = 0;
    let mut dropped = Vec::new();
    for s in doc.svids {
        match check_svid(&s, &entries, &doc.bundle, now) {
            Ok(svid) => svids.push((s.entry_id, svid)),
            Err(None) => expired += 1,
            Err(Some(why)) => dropped.push((s.entry_id, why)),
        }
    }
    let banned = (!doc.banned_node_id.is_empty()).then(|| {
        (
            doc.banned_node_id,
            SystemTime::UNIX_EPOCH + Duration::from_secs(doc.banned_since_unix),
        )
    });
    Ok(Restored {
        banned,
        written_at: SystemTime::UNIX_EPOCH + Duration::from_secs(doc.written_at_unix),
        revision: doc.revision,
        entries,
        bundle: doc.bundle,
        crls: doc.crls,
        jwt_keys,
        jwt_tainted: doc.jwt_tainted,
        federated,
        svids,
        expired,
        dropped,
    })
}

/// A cached SVID as the agent may serve it at `now`; `Err(None)`: it expired (or is not
/// valid yet), `Err(Some(why))`: refused.
fn check_svid(
    s: &SvidDoc,
    entries: &[EntrySpec],
    bundle: &[Vec<u8>],
    now: SystemTime,
) -> Result<X509Svid, Option<String>> {
    let entry = entries
        .iter()
        .find(|e| e.id == s.entry_id)
        .ok_or_else(|| Some("no such entry in the cache".to_owned()))?;
    let svid = X509Svid::from_der(s.chain.clone(), &s.key).map_err(|e| Some(e.to_string()))?;
    if *svid.spiffe_id() != entry.spiffe_id {
        return Err(Some(format!(
            "a certificate for {}, not the entry's {}",
            svid.spiffe_id(),
            entry.spiffe_id
        )));
    }
    svid.certificate()
        .verify_to(bundle)
        .map_err(|e| Some(e.to_string()))?;
    if !crate::rotation::serves(svid.certificate(), now) {
        return Err(None);
    }
    Ok(svid)
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
