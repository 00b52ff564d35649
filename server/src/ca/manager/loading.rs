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

pub(super) fn parse_slots(rows: &[CaSlotRow]) -> Result<Vec<SlotInfo>, ManagerError> {
    rows.iter()
        .map(|r| {
            let corrupt = |m: String| {
                ManagerError::Store(StoreError::Corrupt(format!("CA key {}: {m}", r.id)))
            };
            let kind = Kind::parse(&r.kind).ok_or_else(|| corrupt(format!("kind {:?}", r.kind)))?;
            let state =
                State::parse(&r.state).ok_or_else(|| corrupt(format!("state {:?}", r.state)))?;
            let der = signet_types::pem::parse_certs(r.cert_pem.as_bytes())
                .map_err(|e| corrupt(format!("certificate: {e}")))?
                .into_iter()
                .next()
                .ok_or_else(|| corrupt("no certificate".into()))?;
            let cert = validate::parse_cert(&der).map_err(corrupt)?;
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
                external: false,
                sealed: Sealed(r.encrypted_key.clone()),
            })
        })
        .collect()
}

/// The slot's key as an authority (decrypted once, then cached).
pub(super) fn load_authority(
    s: &SlotInfo,
    slots: &[SlotInfo],
    kek: &Kek,
    keys: &Mutex<HashMap<String, Arc<Authority>>>,
) -> Result<Arc<Authority>, ManagerError> {
    if let Some(a) = keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&s.slot.id)
    {
        return Ok(a.clone());
    }
    let id = &s.slot.id;
    let pkcs8 = kek.open(&s.sealed.0, id.as_bytes()).map_err(|e| {
        ManagerError::Key(format!(
            "cannot decrypt CA key {id}: {e} (is this the key-encryption key it was stored with?)"
        ))
    })?;
    let anchor = match s.slot.kind {
        Kind::Root => s.cert_der.clone(),
        Kind::Intermediate => {
            let parent = s.slot.parent.as_deref().unwrap_or_default();
            find(slots, parent)
                .map_err(|_| {
                    ManagerError::Key(format!(
                        "intermediate {id}: its root {parent} is not stored"
                    ))
                })?
                .cert_der
                .clone()
        }
    };
    let authority = Arc::new(
        Authority::from_parts(s.cert_der.clone(), &pkcs8, Vec::new(), vec![anchor])
            .map_err(|e| ManagerError::Key(format!("stored CA key {id}: {e}")))?,
    );
    keys.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(id.clone(), authority.clone());
    Ok(authority)
}

pub(super) fn build_view(
    generation: u64,
    slots: Vec<SlotInfo>,
    kek: &Kek,
    keys: &Mutex<HashMap<String, Arc<Authority>>>,
) -> Result<CaView, ManagerError> {
    let live = |s: &&SlotInfo| s.slot.state != State::Removed;
    let active_int = active_of(&slots, Kind::Intermediate)
        .ok_or_else(|| ManagerError::Key("there is no active intermediate".into()))?;
    let active = load_authority(active_int, &slots, kek, keys)?;
    let mut signers = Vec::new();
    for s in slots
        .iter()
        .filter(live)
        .filter(|s| s.slot.state != State::Prepared)
    {
        match load_authority(s, &slots, kek, keys) {
            Ok(a) => signers.push(a),
            Err(e) => tracing::error!(key_id = %s.slot.id, error = %e, "CA key not loaded"),
        }
    }
    let active_root_id = active_int.slot.parent.clone().unwrap_or_default();
    let active_root = find(&slots, &active_root_id)?.cert_der.clone();
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
    let client_anchors = slots
        .iter()
        .filter(live)
        .map(|s| s.cert_der.clone())
        .collect();
    let tainted_roots: BTreeSet<&str> = slots
        .iter()
        .filter(live)
        .filter(|s| s.slot.tainted)
        .map(|s| s.slot.id.as_str())
        .collect();
    let tainted = slots
        .iter()
        .filter(live)
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
        slots,
        active,
        signers,
        roots,
        active_root,
        client_anchors,
        tainted,
        plugged: false,
    })
}

/// The view of a plugged-in CA: its signing certificate is the (external) active
/// intermediate, `root-cert.pem` the roots; earlier signing certificates are retired.
pub(super) fn plugged_view(
    generation: u64,
    authority: Arc<Authority>,
    previous: &[Arc<Authority>],
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
    CaView {
        generation,
        slots,
        roots: authority.roots().to_vec(),
        active: authority,
        signers,
        active_root,
        client_anchors,
        tainted: BTreeSet::new(),
        plugged: true,
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
    now: SystemTime,
) -> Result<Arc<CaManager>, ManagerError> {
    let mcfg = ManagerConfig::from_config(td, ca);
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
        return CaManager::plugged(store, files, mcfg, serials);
    }
    let kek = load_kek(ca, data_dir)?;
    let jitter = Arc::new(rotator::KeyIdJitter);
    let manager = CaManager::generated(store, kek, mcfg, serials, jitter, now)
        .await
        .map_err(|e| ManagerError::Key(format!("CA keys: {e}")))?;
    tracing::info!(key_id = manager.view().active.key_id(), "CA keys loaded");
    Ok(manager)
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
