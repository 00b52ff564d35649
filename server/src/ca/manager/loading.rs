//! Loading the CA keys: decoding stored slot rows, decrypting a slot's key once (then cached),
//! reading a plugged-in CA's files, deriving the published [`CaView`] from the slots, and
//! starting the manager from configuration ([`start`]: the KEK, a plugged-in CA or the
//! generated keys, created on a fresh database).

use std::path::Path;

use super::*;

/// The plugged-in CA's files.
#[derive(Debug, Clone)]
pub struct PluggedFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub chain: PathBuf,
    pub root: PathBuf,
}

impl PluggedFiles {
    pub(super) fn read(&self) -> Result<[Vec<u8>; 4], ManagerError> {
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| ManagerError::Key(format!("reading {}: {e}", p.display())))
        };
        Ok([
            read(&self.cert)?,
            read(&self.key)?,
            read(&self.chain)?,
            read(&self.root)?,
        ])
    }

    pub(super) fn load(&self, files: &[Vec<u8>; 4]) -> Result<Authority, ManagerError> {
        Authority::from_cacerts_pem(&files[0], &files[1], &files[2], &files[3])
            .map_err(|e| ManagerError::Key(format!("plugged-in CA ({}): {e}", self.cert.display())))
    }
}

/// Decodes the stored rows; a row that does not even decode is rejected (see `vetting`).
fn parse_slots(rows: &[CaSlotRow]) -> (Vec<SlotInfo>, Vec<RejectedSlot>) {
    let mut slots = Vec::with_capacity(rows.len());
    let mut rejected = Vec::new();
    for r in rows {
        match parse_slot(r) {
            Ok(s) => slots.push(s),
            Err(reason) => rejected.push(RejectedSlot {
                id: r.id.clone(),
                kind: r.kind.clone(),
                state: r.state.clone(),
                reason: reason.to_string(),
            }),
        }
    }
    (slots, rejected)
}

/// Why a stored slot row cannot even be read (the `reason` of its [`RejectedSlot`]).
#[derive(Debug, thiserror::Error)]
enum UnreadableSlot {
    #[error("kind {0:?}")]
    Kind(String),
    #[error("state {0:?}")]
    State(String),
    #[error("certificate: {0}")]
    Pem(#[source] signet_types::pem::PemError),
    #[error("no certificate")]
    NoCertificate,
    #[error(transparent)]
    Certificate(#[from] validate::CertError),
}

fn parse_slot(r: &CaSlotRow) -> Result<SlotInfo, UnreadableSlot> {
    let kind = Kind::parse(&r.kind).ok_or_else(|| UnreadableSlot::Kind(r.kind.clone()))?;
    let state: State = r
        .state
        .parse()
        .map_err(|_| UnreadableSlot::State(r.state.clone()))?;
    let der = signet_types::pem::parse_certs(r.cert_pem.as_bytes())
        .map_err(UnreadableSlot::Pem)?
        .into_iter()
        .next()
        .ok_or(UnreadableSlot::NoCertificate)?;
    let cert = validate::parse_cert(&der)?;
    let nb = validate::to_system_time(&cert.validity().not_before);
    let na = validate::to_system_time(&cert.validity().not_after);
    Ok(SlotInfo {
        slot: Slot {
            id: r.id.clone(),
            kind,
            state,
            parent: r.parent_id.clone(),
            not_before: nb,
            not_after: na,
            prepared_at: from_unix(r.created_at),
            retired_at: r.retired_at.map(from_unix),
            tainted: r.tainted_at.is_some(),
            issued_unexpired: 0,
        },
        algorithm: r.algorithm.clone(),
        cert_der: der,
        activated_at: r.activated_at,
        retired_at: r.retired_at,
        removed_at: r.removed_at,
        tainted_at: r.tainted_at,
        external: false,
        sealed: Sealed(r.encrypted_key.clone()),
    })
}

/// Decodes and vets the stored rows (see `vetting`). With a plugged-in CA only the JWT key
/// rows count: the CA is the operator's files, and CA slots a database still holds (from
/// before the CA was plugged in, or written by someone else) are never read, let alone trusted.
pub(super) fn vet_rows(
    rows: &[CaSlotRow],
    kek: &Kek,
    keys: &Mutex<KeyCache>,
    plugged: bool,
) -> Vetted {
    let jwt_only: Vec<CaSlotRow>;
    let rows = if plugged {
        jwt_only = rows
            .iter()
            .filter(|r| r.kind == Kind::Jwt.as_str())
            .cloned()
            .collect();
        &jwt_only[..]
    } else {
        rows
    };
    let (slots, unreadable) = parse_slots(rows);
    let mut vetted = vetting::vet(slots, kek, keys);
    let mut cache = keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for r in unreadable {
        if cache.report(&r) {
            vetted.new_rejections.push(r.clone());
        }
        vetted.rejected.push(r);
    }
    vetted
}

/// Refuses to go on when slots are stored but not one live slot opens: that is a wrong
/// key-encryption key, not an attack on one row, and going on would generate a new root.
pub(super) fn refuse_foreign_kek(vetted: &Vetted) -> Result<(), ManagerError> {
    let live_ok = vetted.slots.iter().any(|s| s.slot.state != State::Removed);
    let live_bad: Vec<&RejectedSlot> = vetted
        .rejected
        .iter()
        .filter(|r| r.state != State::Removed.as_str())
        .collect();
    if live_ok || live_bad.is_empty() {
        return Ok(());
    }
    Err(ManagerError::Key(format!(
        "none of the {} stored CA keys can be used (is this the key-encryption key they were stored with?): {}",
        live_bad.len(),
        live_bad
            .iter()
            .map(|r| format!("{} {}: {}", r.kind, r.id, r.reason))
            .collect::<Vec<_>>()
            .join("; ")
    )))
}

/// Whether a taint in `view` has expired at `now` (the view must drop it).
pub(super) fn expired_taints(view: &CaView, now: SystemTime) -> bool {
    view.slots
        .iter()
        .any(|s| view.tainted.contains(&s.slot.id) && s.slot.not_after <= now)
}

pub(super) fn build_view(
    generation: u64,
    vetted: Vetted,
    keys: &Mutex<KeyCache>,
    now: SystemTime,
) -> Result<CaView, ManagerError> {
    let opened = |s: &SlotInfo| {
        vetted.authority(&s.slot.id, keys).ok_or_else(|| {
            ManagerError::Key(format!("CA key {} was vetted but is not open", s.slot.id))
        })
    };
    let slots = &vetted.slots;
    let live = |s: &&SlotInfo| s.slot.state != State::Removed;
    let active_int = active_of(slots, Kind::Intermediate)
        .ok_or_else(|| ManagerError::Key("there is no active intermediate".into()))?;
    let active = opened(active_int)?;
    let mut signers = Vec::new();
    for s in slots
        .iter()
        .filter(live)
        .filter(|s| s.slot.state != State::Prepared && s.slot.kind != Kind::Jwt)
    {
        signers.push(opened(s)?);
    }
    let (jwt_keys, active_jwt) = jwt_view(&vetted, keys)?;
    let active_root_id = active_int.slot.parent.clone().unwrap_or_default();
    let active_root = find(slots, &active_root_id)?.cert_der.clone();
    let mut roots: Vec<&SlotInfo> = slots
        .iter()
        .filter(live)
        .filter(|s| s.slot.kind == Kind::Root)
        .collect();
    // The active root first, then the others oldest first.
    roots.sort_by_key(|s| (s.slot.state != State::Active, s.slot.prepared_at));
    let roots: Vec<Vec<u8>> = roots.into_iter().map(|s| s.cert_der.clone()).collect();
    // The active intermediate's authority carries every trusted root (the Istio answer ends
    // with all of them; `Authority::roots` is the bundle).
    let active = Arc::new(
        Authority::from_parts(
            active.cert_der().to_vec(),
            active.key_pkcs8_der(),
            Vec::new(),
            roots.clone(),
        )
        .map_err(|e| ManagerError::Key(format!("active intermediate {}: {e}", active.key_id())))?,
    );
    // JWT keys are never X.509 anchors: their certificates only carry the key.
    let client_anchors = slots
        .iter()
        .filter(live)
        .filter(|s| s.slot.kind != Kind::Jwt)
        .map(|s| s.cert_der.clone())
        .collect();
    // A taint lasts until the key expires, removed or not: holders of what it signed must
    // still replace it, and its root's CRL still lists it.
    let tainted_here = |s: &&SlotInfo| s.slot.tainted && s.slot.not_after > now;
    let tainted_roots: BTreeSet<&str> = slots
        .iter()
        .filter(tainted_here)
        .filter(|s| s.slot.kind == Kind::Root)
        .map(|s| s.slot.id.as_str())
        .collect();
    let tainted = slots
        .iter()
        .filter(|s| s.slot.not_after > now)
        .filter(|s| {
            s.slot.tainted
                || s.slot
                    .parent
                    .as_deref()
                    .is_some_and(|p| tainted_roots.contains(p))
        })
        .map(|s| s.slot.id.clone())
        .collect();
    Ok(CaView {
        generation,
        slots: vetted.slots,
        active,
        signers,
        roots,
        active_root,
        client_anchors,
        tainted,
        jwt_keys,
        active_jwt,
        plugged: false,
        rejected: vetted.rejected,
    })
}

/// The JWT keys' share of a plugged-in CA's view: their slots, the published keys, the active
/// signer, the tainted ones and the rejected rows (all the database holds for it).
pub(super) struct JwtPart {
    slots: Vec<SlotInfo>,
    published: Vec<PublishedJwtKey>,
    active: Option<ActiveJwtKey>,
    tainted: BTreeSet<String>,
    rejected: Vec<RejectedSlot>,
}

impl JwtPart {
    /// From freshly vetted JWT slots (`vet_rows(.., plugged)`).
    pub(super) fn vetted(
        vetted: Vetted,
        keys: &Mutex<KeyCache>,
        now: SystemTime,
    ) -> Result<Self, ManagerError> {
        let (published, active) = jwt_view(&vetted, keys)?;
        let tainted = vetted
            .slots
            .iter()
            .filter(|s| s.slot.tainted && s.slot.not_after > now)
            .map(|s| s.slot.id.clone())
            .collect();
        Ok(Self {
            slots: vetted.slots,
            published,
            active,
            tainted,
            rejected: vetted.rejected,
        })
    }

    /// The JWT share of `view` as it is (a reload of the plugged-in files changes none of it).
    pub(super) fn of(view: &CaView) -> Self {
        Self {
            slots: view
                .slots
                .iter()
                .filter(|s| s.slot.kind == Kind::Jwt)
                .cloned()
                .collect(),
            published: view.jwt_keys.clone(),
            active: view.active_jwt.clone(),
            tainted: view.tainted.clone(),
            rejected: view.rejected.clone(),
        }
    }
}

/// The published JWT keys (prepared, active, retired; the active one first, then the others
/// newest first) and the active signer, unless it is tainted.
fn jwt_view(
    vetted: &Vetted,
    keys: &Mutex<KeyCache>,
) -> Result<(Vec<PublishedJwtKey>, Option<ActiveJwtKey>), ManagerError> {
    let mut live: Vec<&SlotInfo> = vetted
        .slots
        .iter()
        .filter(|s| s.slot.kind == Kind::Jwt && s.slot.state != State::Removed)
        .collect();
    live.sort_by_key(|s| {
        (
            s.slot.state != State::Active,
            std::cmp::Reverse(s.slot.prepared_at),
        )
    });
    let mut published = Vec::with_capacity(live.len());
    let mut active = None;
    for s in live {
        let signer = vetted.jwt_signer(&s.slot.id, keys);
        let key = match &signer {
            Some(signer) => signer.public_key().clone(),
            // A tainted key's private half was erased with the taint (see `vetting`).
            None if s.slot.tainted => public_half(s)?,
            None => {
                return Err(ManagerError::Key(format!(
                    "JWT key {} was vetted but is not open",
                    s.slot.id
                )));
            }
        };
        published.push(PublishedJwtKey {
            key,
            not_after: s.slot.not_after,
        });
        if let Some(signer) = signer
            && s.slot.state == State::Active
            && !s.slot.tainted
            && active.is_none()
        {
            active = Some(ActiveJwtKey {
                signer,
                not_after: s.slot.not_after,
            });
        }
    }
    Ok((published, active))
}

/// The public half of a JWT key slot, from its certificate, with the algorithm Signet signs
/// with for its key type (ES256 for P-256, RS256 for RSA).
fn public_half(s: &SlotInfo) -> Result<signet_pki::jwt::JwtPublicKey, ManagerError> {
    use signet_pki::jwt::{JwtAlg, JwtPublicKey};
    let bad = |e: &dyn std::fmt::Display| {
        ManagerError::Key(format!("JWT key {}: its certificate's key: {e}", s.slot.id))
    };
    let cert = validate::parse_cert(&s.cert_der).map_err(|e| bad(&e))?;
    let spki = cert.public_key().raw;
    JwtPublicKey::from_spki(s.slot.id.clone(), Some(JwtAlg::Es256), spki)
        .or_else(|_| JwtPublicKey::from_spki(s.slot.id.clone(), Some(JwtAlg::Rs256), spki))
        .map_err(|e| bad(&e))
}

/// The view of a plugged-in CA: its signing certificate is the (external) active
/// intermediate, `root-cert.pem` the roots; earlier signing certificates are retired. The JWT
/// keys are Signet's own, in the database (`jwt`); `generation` is their slots' generation.
pub(super) fn plugged_view(
    generation: u64,
    authority: Arc<Authority>,
    previous: &[Arc<Authority>],
    jwt: JwtPart,
) -> CaView {
    let external = |der: &[u8], kind: Kind, state: State, parent: Option<String>| {
        let cert = validate::parse_cert(der).ok()?;
        Some(SlotInfo {
            slot: Slot {
                id: crate::ca::authority::key_id_of(&cert),
                kind,
                state,
                parent,
                not_before: validate::to_system_time(&cert.validity().not_before),
                not_after: validate::to_system_time(&cert.validity().not_after),
                prepared_at: validate::to_system_time(&cert.validity().not_before),
                retired_at: None,
                tainted: false,
                issued_unexpired: 0,
            },
            algorithm: cert.public_key().algorithm.algorithm.to_id_string(),
            cert_der: der.to_vec(),
            activated_at: None,
            retired_at: None,
            removed_at: None,
            tainted_at: None,
            external: true,
            sealed: Sealed::default(),
        })
    };
    let chain = authority.chain();
    let active_root = chain.last().cloned().unwrap_or_default();
    let parent_of = |a: &Authority| {
        a.chain()
            .get(1)
            .and_then(|d| crate::ca::authority::key_id_of_der(d))
    };
    let mut slots: Vec<SlotInfo> = authority
        .roots()
        .iter()
        .filter_map(|r| external(r, Kind::Root, State::Active, None))
        .collect();
    slots.extend(external(
        authority.cert_der(),
        Kind::Intermediate,
        State::Active,
        parent_of(&authority),
    ));
    for p in previous {
        slots.extend(external(
            p.cert_der(),
            Kind::Intermediate,
            State::Retired,
            parent_of(p),
        ));
    }
    let mut client_anchors = vec![authority.cert_der().to_vec()];
    client_anchors.extend(previous.iter().map(|p| p.cert_der().to_vec()));
    let mut signers = vec![authority.clone()];
    signers.extend(previous.iter().cloned());
    slots.extend(jwt.slots);
    CaView {
        generation,
        slots,
        roots: authority.roots().to_vec(),
        active: authority,
        signers,
        active_root,
        client_anchors,
        tainted: jwt.tainted,
        jwt_keys: jwt.published,
        active_jwt: jwt.active,
        plugged: true,
        rejected: jwt.rejected,
    }
}

/// The CA key manager for `[ca]`: a plugged-in CA's files, or the generated keys in the
/// database, creating the first root and intermediate on a fresh database (see
/// [`CaManager::generated`]), sealed under the KEK from [`load_kek`].
pub async fn start(
    td: TrustDomain,
    ca: &CaConfig,
    data_dir: &Path,
    store: Arc<dyn Store>,
    serials: Arc<dyn SerialSource>,
    jwt: &JwtSvidConfig,
    now: SystemTime,
) -> Result<Arc<CaManager>, ManagerError> {
    let mcfg = ManagerConfig::from_config(td, ca, jwt);
    let jitter = Arc::new(rotator::KeyIdJitter);
    let plugged = ca
        .plugged()
        .map_err(|e| ManagerError::Key(format!("configuration: {e}")))?;
    if let Some(files) = plugged {
        let files = PluggedFiles {
            cert: files.cert.to_path_buf(),
            key: files.key.to_path_buf(),
            chain: files.chain.to_path_buf(),
            root: files.root.to_path_buf(),
        };
        // The JWT signing keys are Signet's own even then, sealed under the KEK.
        let kek = load_kek(ca, data_dir)?;
        return CaManager::plugged(store, files, kek, mcfg, serials, jitter, now)
            .await
            .map_err(|e| ManagerError::Key(format!("plugged-in CA: {e}")));
    }
    let (_, slots) = store
        .ca_slots()
        .await
        .map_err(|e| ManagerError::Key(format!("CA keys: {e}")))?;
    if slots.is_empty() {
        refuse_a_new_root_beside_an_old_ledger(data_dir)?;
    }
    let kek = load_kek(ca, data_dir)?;
    let manager = CaManager::generated(store, kek, mcfg, serials, jitter, now)
        .await
        .map_err(|e| ManagerError::Key(format!("CA keys: {e}")))?;
    tracing::info!(key_id = manager.view().active.key_id(), "CA keys loaded");
    Ok(manager)
}

/// A database without CA keys is a new deployment, and gets a new root: unless `data_dir`
/// holds signed checkpoints of a ledger, which says this server ran on another database before
/// (a database URL that went missing, an `EnvironmentFile` not read, a Secret not mounted).
/// Going on would make a second CA that overwrites `bundle.pem` with a root no relying party
/// trusts, so it stops, naming both ways out.
fn refuse_a_new_root_beside_an_old_ledger(data_dir: &Path) -> Result<(), ManagerError> {
    let dir = data_dir.join("checkpoints");
    let held = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                .count()
        })
        .unwrap_or(0);
    if held == 0 {
        return Ok(());
    }
    Err(ManagerError::Key(format!(
        "the database holds no CA keys, but {} holds {held} signed checkpoints of a ledger: this \
         server ran on another database before. Is its database URL missing (SIGNET_DATABASE_URL \
         unset, an EnvironmentFile or Secret not read)? Point it at that database; to start a \
         new deployment here on purpose, move {} aside first (keep it: it records the old \
         ledger's heads)",
        dir.display(),
        dir.display()
    )))
}

/// The key-encryption key: `ca.kek_file`, or `<data_dir>/kek`, generated (mode 0600) when it
/// does not exist yet. A configured file that is missing is an error, never replaced.
pub fn load_kek(ca: &CaConfig, data_dir: &Path) -> Result<Kek, ManagerError> {
    let path = ca.kek_file.clone().unwrap_or_else(|| data_dir.join("kek"));
    match std::fs::read_to_string(&path) {
        Ok(s) => Kek::from_base64(s.trim())
            .map_err(|e| ManagerError::Key(format!("key-encryption key {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && ca.kek_file.is_none() => {
            let kek = Kek::generate();
            crate::files::write_atomic(&path, format!("{}\n", kek.to_base64()).as_bytes(), 0o600)
                .map_err(|e| ManagerError::Key(format!("writing {}: {e}", path.display())))?;
            tracing::info!(path = %path.display(), "generated key-encryption key");
            Ok(kek)
        }
        Err(e) => Err(ManagerError::Key(format!(
            "reading key-encryption key {}: {e}",
            path.display()
        ))),
    }
}
