//! `signetctl mint`: an X509-SVID minted by the operator, written as files with exact modes
//! (created beside the target and renamed over it, never through a planted link).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow};
use signet_client::admin::MintRequest;

use crate::{call_err, typed_admin};

pub(crate) struct Minted {
    pub serial: String,
    pub chain_pem: String,
    pub key_pem: String,
}

pub(crate) async fn mint_identity(
    socket: &Path,
    spiffe_id: &str,
    dns_names: Vec<String>,
    ttl: Duration,
) -> anyhow::Result<Minted> {
    let kc = signet_client::new_key_and_csr()?;
    let issued = typed_admin(socket)
        .await?
        .mint(&MintRequest {
            spiffe_id: spiffe_id.to_owned(),
            csr: kc.csr_der.clone(),
            ttl,
            dns_names,
        })
        .await
        .map_err(|e| call_err("mint", &e))?;
    // Without the root (split off by signet_client): a presented chain ends below the trust
    // anchor.
    Ok(Minted {
        serial: issued.certificate.serial_hex().to_owned(),
        chain_pem: issued.certificate.chain_pem(),
        key_pem: kc.key_pem,
    })
}

/// Writes `data` to `path` with exactly `mode`: a new file beside it (created exclusively, so
/// never through a planted link), fsync, then renamed over `path`, which it replaces whatever
/// it was (a file with a wider mode, a symlink). A failure leaves `path` as it was.
pub(crate) fn write_replacing(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Only to make the temporary name unlikely to collide; create_new refuses one that does.
    use signet_runtime::clock::Clock as _;
    let nanos = signet_runtime::clock::SystemClock
        .now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have narrowed it; never widen beyond `mode`, never leave it narrower.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow!("writing {}: {e}", path.display())
    })
}

pub(crate) async fn mint(
    socket: &Path,
    spiffe_id: &str,
    dns_names: Vec<String>,
    ttl: Duration,
    out: &Path,
) -> anyhow::Result<Minted> {
    let minted = mint_identity(socket, spiffe_id, dns_names, ttl).await?;
    let bundle = typed_admin(socket)
        .await?
        .bundle()
        .await
        .map_err(|e| call_err("bundle", &e))?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    write_replacing(&out.join("svid.pem"), minted.chain_pem.as_bytes(), 0o644)?;
    // The key is 0600 whatever was there before (a 0644 file, a symlink): a new file is
    // written and renamed over the old name, never opened through it.
    write_replacing(&out.join("svid_key.pem"), minted.key_pem.as_bytes(), 0o600)?;
    write_replacing(
        &out.join("bundle.pem"),
        bundle.roots_pem().as_bytes(),
        0o644,
    )?;
    Ok(minted)
}
