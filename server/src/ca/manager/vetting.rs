//! Vetting the CA key slots the database returns, before anything trusts them.
//!
//! The database is not trusted to say which keys are Signet's: someone with write access to
//! it (and not the key-encryption key) could otherwise insert a row holding a root of their
//! own, and it would be published in the bundle, Istio's chains, the federation endpoint and
//! the mTLS anchors. So a slot is used only when the KEK proves it:
//!
//! - **The sealing binds the slot.** A key is sealed (AES-256-GCM under the KEK) with
//!   associated data that names the slot's ID, kind, parent and the SHA-256 of its
//!   certificate ([`slot_aad`]); a sealed key opens only for the row it was sealed for.
//!   Keys sealed before this binding (associated data: the ID alone) still open, pass every
//!   check below, and are sealed again with the binding at once (`ca.resealed`).
//! - **Every live slot is opened** (prepared roots too, which sign nothing yet but are
//!   published), and its key must be the certificate's key; the ID must be the
//!   certificate's key ID; a root must be self-signed and a CA; an intermediate must be
//!   signed by its stored parent root, which must itself pass.
//! - **A JWT key slot** (kind `jwt`) holds a JWT-SVID signing key and a self-signed
//!   end-entity certificate of it (never a CA): its ID must be the `kid` of the certificate's
//!   public key ([`signet_pki::jwt::key_id_for`]), it has no parent, its certificate must be
//!   self-signed and not a CA, and its sealed key must open for the row and be the
//!   certificate's key. **A tainted JWT key holds no key**: the taint erases it in the same
//!   transaction (a tainted JWT key never signs again; only its public half stays published,
//!   from its certificate, until it is removed). A database writer who clears that taint gets
//!   a live JWT slot with nothing to open: it is rejected, never signs and is reported.
//! - **A removed slot holds no key**: removal erases the sealed key, so a removed root put
//!   back into a live state no longer opens. A removed slot is never trusted; it is checked
//!   only for what it still publishes: an intermediate tainted or revoked goes on its root's
//!   CRL, so its certificate must carry its ID and be signed by its parent.
//!
//! A slot that fails is rejected: not published, not trusted, not signed with, not rotated,
//! and reported (the audit event `ca.slot_rejected`, once per row content per process;
//! `/readyz`; the `signet_ca_slots_rejected` gauge; `signetctl ca status`). The operator
//! clears it with `signetctl ca revoke ID` (removal) or by deleting the row.
//!
//! What this does not stop: a database writer who kept a copy of a live row (sealed key
//! included) can restore it after its removal, or clear a CA key's taint (or a JWT key's,
//! putting back the sealed key from that copy); see SECURITY.md.

use ring::digest::{Context, SHA256};

use super::*;
use crate::ca::authority::verify_issued_by;
use crate::ca::validate::CertError;

/// The associated data a slot's key is sealed with: the ID, kind and parent, length-prefixed,
/// and the SHA-256 of the certificate.
pub(super) fn slot_aad(id: &str, kind: Kind, parent: Option<&str>, cert_der: &[u8]) -> Vec<u8> {
    let mut aad = b"signet-ca-slot-v2\0".to_vec();
    for part in [id, kind.as_str(), parent.unwrap_or("")] {
        aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
        aad.extend_from_slice(part.as_bytes());
    }
    aad.extend_from_slice(&signet_types::ledger::sha256(cert_der));
    aad
}

/// A slot the manager refuses to trust, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedSlot {
    pub id: String,
    pub kind: String,
    pub state: String,
    pub reason: String,
}

/// Why vetting refuses a slot: the `reason` of its [`RejectedSlot`].
#[derive(Debug, thiserror::Error)]
pub(super) enum SlotRejection {
    /// `found`: the certificate's key ID, or `unreadable`.
    #[error("its certificate's key ID is {found}, not {id}")]
    KeyId { found: String, id: String },
    #[error("a root with a parent")]
    RootWithParent,
    #[error("the root is not self-signed: {0}")]
    NotSelfSigned(#[source] CertError),
    #[error("an intermediate without a parent")]
    NoParent,
    #[error("its parent {0} is not stored")]
    ParentMissing(String),
    #[error("its parent {0} is not a root")]
    ParentNotRoot(String),
    #[error("its parent {0} was rejected")]
    ParentRejected(String),
    #[error("not signed by its parent {parent}: {error}")]
    NotSignedByParent { parent: String, error: CertError },
    #[error("its sealed key does not open for this row under this key-encryption key ({0})")]
    Sealed(#[source] crate::ca::kek::KekError),
    #[error("its key and certificate do not form a CA: {0}")]
    NotACa(#[source] crate::ca::authority::AuthorityError),
    #[error("a JWT key with a parent")]
    JwtWithParent,
    #[error("a JWT key's certificate is a CA certificate")]
    JwtIsCa,
    #[error("its certificate is not self-signed: {0}")]
    JwtNotSelfSigned(#[source] CertError),
    #[error("its key is not a JWT signing key: {0}")]
    JwtKey(String),
    #[error("its key is not its certificate's key")]
    JwtKeyMismatch,
}

/// An opened slot key: a CA that signs certificates, or a JWT-SVID signing key.
#[derive(Clone)]
pub(super) enum Opened {
    Ca(Arc<Authority>),
    Jwt(Arc<signet_pki::jwt::JwtSigner>),
}

/// What the cache remembers of a row: a digest of everything the checks read.
type RowDigest = [u8; 32];

fn row_digest(s: &SlotInfo) -> RowDigest {
    let mut h = Context::new(&SHA256);
    for part in [
        s.slot.id.as_bytes(),
        s.slot.kind.as_str().as_bytes(),
        s.slot.parent.as_deref().unwrap_or("").as_bytes(),
        &s.cert_der,
        &s.sealed.0,
    ] {
        h.update(&(part.len() as u64).to_be_bytes());
        h.update(part);
    }
    let mut d = [0u8; 32];
    d.copy_from_slice(h.finish().as_ref());
    d
}

/// Opened keys by slot ID, each with the digest of the row it was opened from: a row that
/// changes is vetted again.
#[derive(Default)]
pub(super) struct KeyCache {
    opened: HashMap<String, (RowDigest, Opened)>,
    /// Rejections already reported (by row digest), so each is audited once.
    reported: BTreeSet<RowDigest>,
}

impl KeyCache {
    /// Remembers a key this process generated and sealed for `s`.
    pub(super) fn insert(&mut self, s: &SlotInfo, key: Opened) {
        self.opened.insert(s.slot.id.clone(), (row_digest(s), key));
    }

    /// Whether `r` (a row that did not decode) is reported for the first time.
    pub(super) fn report(&mut self, r: &RejectedSlot) -> bool {
        let text = format!("{}\0{}\0{}\0{}", r.id, r.kind, r.state, r.reason);
        self.reported
            .insert(signet_types::ledger::sha256(text.as_bytes()))
    }

    fn opened(&self, s: &SlotInfo) -> Option<&Opened> {
        self.opened
            .get(&s.slot.id)
            .filter(|(d, _)| *d == row_digest(s))
            .map(|(_, k)| k)
    }

    /// The opened CA key of `s`'s row.
    pub(super) fn get(&self, s: &SlotInfo) -> Option<Arc<Authority>> {
        match self.opened(s)? {
            Opened::Ca(a) => Some(a.clone()),
            Opened::Jwt(_) => None,
        }
    }

    /// The opened JWT signing key of `s`'s row.
    pub(super) fn get_jwt(&self, s: &SlotInfo) -> Option<Arc<signet_pki::jwt::JwtSigner>> {
        match self.opened(s)? {
            Opened::Jwt(k) => Some(k.clone()),
            Opened::Ca(_) => None,
        }
    }
}

/// The outcome of vetting the stored slots.
#[derive(Debug, Default)]
pub(super) struct Vetted {
    /// The slots that passed, with the removed ones that are consistent, in the stored order.
    pub(super) slots: Vec<SlotInfo>,
    pub(super) rejected: Vec<RejectedSlot>,
    /// Rejections not reported before (audit them).
    pub(super) new_rejections: Vec<RejectedSlot>,
    /// Slots whose key is sealed without the binding: (ID, the key sealed again with it).
    pub(super) reseal: Vec<(String, Vec<u8>)>,
}

impl Vetted {
    /// Why the rotator must not make or activate a root by itself now, if it must not: there
    /// is no accepted active root, yet the database holds roots (retired, or live but
    /// rejected). That is the database's doing (a changed state, a swapped
    /// certificate), not a first start: a new root would break every relying party's trust
    /// without the propagation a root rotation waits for. The operator decides.
    pub(super) fn root_replacement_refused(&self) -> Option<String> {
        let root = |s: &&SlotInfo| s.slot.kind == Kind::Root;
        if self
            .slots
            .iter()
            .filter(root)
            .any(|s| s.slot.state == State::Active)
        {
            return None;
        }
        let mut held: Vec<String> = self
            .slots
            .iter()
            .filter(root)
            // A prepared root with none active is a first start (or the active one put back
            // to prepared: activating it again changes no trust).
            .filter(|s| s.slot.state == State::Retired)
            .map(|s| format!("{} ({})", s.slot.id, s.slot.state.as_str()))
            .collect();
        held.extend(
            self.rejected
                .iter()
                .filter(|r| r.kind == Kind::Root.as_str() && r.state != State::Removed.as_str())
                .map(|r| format!("{} ({}, rejected: {})", r.id, r.state, r.reason)),
        );
        if held.is_empty() {
            return None;
        }
        Some(format!(
            "no stored root is active and usable, but the database holds root(s) {}: refusing to \
             generate or activate a root by itself (that would replace the trust every relying \
             party has); restore the row, or prepare and activate a root deliberately \
             (signetctl ca prepare --root; signetctl ca activate KEY_ID)",
            held.join(", ")
        ))
    }

    /// Whether `t` makes or activates a root.
    pub(super) fn is_root_step(&self, t: &Transition) -> bool {
        match t {
            Transition::PrepareRoot { .. } => true,
            Transition::Activate { id, .. } => self
                .slots
                .iter()
                .any(|s| s.slot.id == *id && s.slot.kind == Kind::Root),
            _ => false,
        }
    }

    /// The opened JWT signing key of an accepted live JWT slot.
    pub(super) fn jwt_signer(
        &self,
        id: &str,
        keys: &Mutex<KeyCache>,
    ) -> Option<Arc<signet_pki::jwt::JwtSigner>> {
        let s = self.slots.iter().find(|s| s.slot.id == id)?;
        keys.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_jwt(s)
    }

    /// The opened key of an accepted live slot.
    pub(super) fn authority(&self, id: &str, keys: &Mutex<KeyCache>) -> Option<Arc<Authority>> {
        let s = self.slots.iter().find(|s| s.slot.id == id)?;
        keys.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(s)
    }
}

/// Vets `slots` (see the module docs): roots first, so that each intermediate's parent has
/// been decided before it.
pub(super) fn vet(slots: Vec<SlotInfo>, kek: &Kek, keys: &Mutex<KeyCache>) -> Vetted {
    let mut out = Vetted::default();
    let mut accepted: HashMap<String, bool> = HashMap::new();
    let of_kind = |k: Kind| -> Vec<usize> {
        (0..slots.len())
            .filter(|&i| slots[i].slot.kind == k)
            .collect()
    };
    let order = [
        of_kind(Kind::Root),
        of_kind(Kind::Intermediate),
        of_kind(Kind::Jwt),
    ]
    .concat();
    let mut decided: Vec<(usize, Result<(), SlotRejection>)> = Vec::with_capacity(slots.len());
    for i in order {
        let s = &slots[i];
        let result = vet_one(s, &slots, &accepted, kek, keys, &mut out.reseal);
        accepted.insert(s.slot.id.clone(), result.is_ok());
        decided.push((i, result));
    }
    decided.sort_by_key(|(i, _)| *i);
    let mut cache = keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (i, result) in decided {
        let s = &slots[i];
        match result {
            Ok(()) => out.slots.push(s.clone()),
            Err(reason) => {
                let r = RejectedSlot {
                    id: s.slot.id.clone(),
                    kind: s.slot.kind.as_str().into(),
                    state: s.slot.state.as_str().into(),
                    reason: reason.to_string(),
                };
                if cache.reported.insert(row_digest(s)) {
                    out.new_rejections.push(r.clone());
                }
                out.rejected.push(r);
            }
        }
    }
    out
}

fn vet_one(
    s: &SlotInfo,
    slots: &[SlotInfo],
    accepted: &HashMap<String, bool>,
    kek: &Kek,
    keys: &Mutex<KeyCache>,
    reseal: &mut Vec<(String, Vec<u8>)>,
) -> Result<(), SlotRejection> {
    let id = &s.slot.id;
    if s.slot.kind == Kind::Jwt {
        return vet_jwt(s, kek, keys);
    }
    let key_id = crate::ca::authority::key_id_of_der(&s.cert_der);
    if key_id.as_deref() != Some(id.as_str()) {
        return Err(SlotRejection::KeyId {
            found: key_id.unwrap_or_else(|| "unreadable".into()),
            id: id.clone(),
        });
    }
    let parent = match s.slot.kind {
        Kind::Root => {
            if s.slot.parent.is_some() {
                return Err(SlotRejection::RootWithParent);
            }
            verify_issued_by(&s.cert_der, &s.cert_der).map_err(SlotRejection::NotSelfSigned)?;
            None
        }
        Kind::Jwt => return Err(SlotRejection::JwtWithParent),
        Kind::Intermediate => {
            let pid = s.slot.parent.as_deref().ok_or(SlotRejection::NoParent)?;
            let p = slots
                .iter()
                .find(|p| p.slot.id == pid)
                .ok_or_else(|| SlotRejection::ParentMissing(pid.to_owned()))?;
            if p.slot.kind != Kind::Root {
                return Err(SlotRejection::ParentNotRoot(pid.to_owned()));
            }
            if !accepted.get(pid).copied().unwrap_or(false) {
                return Err(SlotRejection::ParentRejected(pid.to_owned()));
            }
            verify_issued_by(&s.cert_der, &p.cert_der).map_err(|error| {
                SlotRejection::NotSignedByParent {
                    parent: pid.to_owned(),
                    error,
                }
            })?;
            Some(p)
        }
    };
    if s.slot.state == State::Removed {
        // Nothing is opened: removal erased the key.
        return Ok(());
    }
    if keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(s)
        .is_some()
    {
        return Ok(());
    }
    let aad = slot_aad(id, s.slot.kind, s.slot.parent.as_deref(), &s.cert_der);
    let (pkcs8, legacy) = match kek.open(&s.sealed.0, &aad) {
        Ok(k) => (k, false),
        // Sealed before the binding (the ID alone); checked like any other, then resealed.
        Err(_) => match kek.open(&s.sealed.0, id.as_bytes()) {
            Ok(k) => (k, true),
            Err(e) => return Err(SlotRejection::Sealed(e)),
        },
    };
    let anchor = parent.map_or_else(|| s.cert_der.clone(), |p| p.cert_der.clone());
    let authority = Authority::from_parts(s.cert_der.clone(), &pkcs8, Vec::new(), vec![anchor])
        .map_err(SlotRejection::NotACa)?;
    if legacy {
        reseal.push((id.clone(), kek.seal(&pkcs8, &aad)));
    }
    keys.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(s, Opened::Ca(Arc::new(authority)));
    Ok(())
}

/// Vets a JWT key slot (see the module docs).
fn vet_jwt(s: &SlotInfo, kek: &Kek, keys: &Mutex<KeyCache>) -> Result<(), SlotRejection> {
    let id = &s.slot.id;
    let cert = validate::parse_cert(&s.cert_der).map_err(SlotRejection::JwtNotSelfSigned)?;
    let spki = cert.public_key().raw;
    let kid = signet_pki::jwt::key_id_for(spki);
    if kid != *id {
        return Err(SlotRejection::KeyId {
            found: kid,
            id: id.clone(),
        });
    }
    if s.slot.parent.is_some() {
        return Err(SlotRejection::JwtWithParent);
    }
    if cert
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|bc| bc.value.ca)
    {
        return Err(SlotRejection::JwtIsCa);
    }
    crate::ca::authority::verify_self_signed(&s.cert_der)
        .map_err(SlotRejection::JwtNotSelfSigned)?;
    if s.slot.state == State::Removed {
        return Ok(());
    }
    if s.slot.tainted && s.sealed.0.is_empty() {
        // Its key was erased with the taint: published from its certificate, never opened.
        return Ok(());
    }
    let cached = keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get_jwt(s)
        .is_some();
    if cached {
        return Ok(());
    }
    // JWT keys were always sealed with the binding: there is no legacy form to accept.
    let aad = slot_aad(id, Kind::Jwt, None, &s.cert_der);
    let pkcs8 = kek.open(&s.sealed.0, &aad).map_err(SlotRejection::Sealed)?;
    let key = signet_pki::key::PrivateKey::from_pkcs8_der(&pkcs8)
        .map_err(|e| SlotRejection::JwtKey(e.to_string()))?;
    let signer =
        signet_pki::jwt::JwtSigner::new(&key).map_err(|e| SlotRejection::JwtKey(e.to_string()))?;
    if signer.public_key().spki_der() != spki {
        return Err(SlotRejection::JwtKeyMismatch);
    }
    keys.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(s, Opened::Jwt(Arc::new(signer)));
    Ok(())
}
