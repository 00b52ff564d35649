//! `signetctl ca status|prepare|activate|taint|revoke`: the CA key slots (the
//! `signet.admin.v1.CaAdmin` service on the admin socket).

use std::path::Path;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::Subcommand;
use signet_client::admin::{CaAction, CaAdminClient, CaKeyKind, CaKeySlot};
use signet_types::ca_slot::{SlotState, UnknownSlotState};

use crate::{call_err, rfc3339};

#[derive(Debug, Subcommand)]
pub enum CaCmd {
    /// Every CA key: kind, state, validity, parent, and the certificates still issued under it.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Prepare a new intermediate under the active root (with --root or --kind root: a new
    /// root; with --kind jwt: a new JWT-SVID signing key), published at once, signing nothing
    /// until activated.
    Prepare {
        #[arg(long, conflicts_with = "kind")]
        root: bool,
        #[arg(long, value_enum)]
        kind: Option<KindArg>,
    },
    /// Activate a prepared key; the active key of its kind is retired.
    // Key IDs are base64url: about one in 64 starts with `-` (review finding F5).
    Activate {
        #[arg(allow_hyphen_values = true)]
        key_id: String,
        /// Activate a root that has been in the trust bundle for less than
        /// ca.root_propagation (the server refuses it otherwise, naming the time left):
        /// relying parties that have not fetched the bundle since will refuse what it signs.
        #[arg(long)]
        force: bool,
    },
    /// Taint a key: holders of certificates issued under it replace them.
    Taint {
        #[arg(allow_hyphen_values = true)]
        key_id: String,
    },
    /// Remove a non-active key from the trust bundle. Refused while unexpired certificates
    /// issued under it remain, unless --force.
    Revoke {
        #[arg(allow_hyphen_values = true)]
        key_id: String,
        #[arg(long)]
        force: bool,
    },
}

/// `ca prepare --kind`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum KindArg {
    Root,
    Intermediate,
    Jwt,
}

async fn client(socket: &Path) -> anyhow::Result<CaAdminClient> {
    CaAdminClient::connect(socket).await.map_err(|e| {
        anyhow!("{e}\n(is signet-server running? point --socket at <data_dir>/admin.sock)")
    })
}

fn time_or_none(t: Option<i64>) -> serde_json::Value {
    match t {
        None => serde_json::Value::Null,
        Some(t) => rfc3339(t).into(),
    }
}

/// The slot's state as the server stored it (a rejected slot's may be no state at all).
fn state_text(s: &CaKeySlot) -> &str {
    match &s.state {
        Ok(state) => state.as_str(),
        Err(UnknownSlotState(text)) => text,
    }
}

fn slot_json(s: &CaKeySlot) -> serde_json::Value {
    serde_json::json!({
        "key_id": s.key_id,
        "kind": s.kind,
        "state": state_text(s),
        "tainted": s.tainted,
        "algorithm": s.algorithm,
        "not_before": rfc3339(s.not_before),
        "not_after": rfc3339(s.not_after),
        "parent_key_id": s.parent_key_id,
        "unexpired_certificates": s.unexpired_certificates,
        "last_expiry": time_or_none(s.last_expiry),
        "prepared_at": time_or_none(s.prepared_at),
        "activated_at": time_or_none(s.activated_at),
        "retired_at": time_or_none(s.retired_at),
        "removed_at": time_or_none(s.removed_at),
        "external": s.external,
        "rejected": s.rejected,
        "holders_not_replaced": s.holders_not_replaced,
    })
}

fn print_action(verb: &str, r: &CaAction) {
    println!("{verb} {}", r.key_id);
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
}

pub async fn ca(socket: &Path, cmd: CaCmd) -> anyhow::Result<ExitCode> {
    let c = client(socket).await?;
    match cmd {
        CaCmd::Status { json } => {
            let r = c.status().await.map_err(|e| call_err("ca status", &e))?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "plugged": r.plugged,
                        "active_key_id": r.active_key_id,
                        "active_jwt_key_id": r.active_jwt_key_id,
                        "slots": r.slots.iter().map(slot_json).collect::<Vec<_>>(),
                    })
                );
            } else {
                if r.plugged {
                    println!("plugged-in CA (rotate it by replacing its files)");
                }
                println!(
                    "{:<42} {:<12} {:<9} {:<7} {:<20} {:<20} {:>9}  LAST EXPIRY",
                    "KEY ID", "KIND", "STATE", "TAINTED", "NOT BEFORE", "NOT AFTER", "UNEXPIRED"
                );
                for s in &r.slots {
                    println!(
                        "{:<42} {:<12} {:<9} {:<7} {:<20} {:<20} {:>9}  {}",
                        s.key_id,
                        s.kind,
                        state_text(s),
                        if s.tainted { "yes" } else { "no" },
                        rfc3339(s.not_before),
                        rfc3339(s.not_after),
                        s.unexpired_certificates,
                        s.last_expiry.map_or_else(|| "-".to_owned(), rfc3339)
                    );
                }
                for s in r
                    .slots
                    .iter()
                    .filter(|s| s.tainted && s.state != Ok(SlotState::Removed))
                {
                    println!(
                        "tainted {}: {} holder(s) have not replaced their certificate yet{}",
                        s.key_id,
                        s.holders_not_replaced,
                        if s.holders_not_replaced == 0 && s.state != Ok(SlotState::Active) {
                            " (safe to remove: signetctl ca revoke KEY_ID)"
                        } else {
                            ""
                        }
                    );
                }
                for s in r.slots.iter().filter(|s| s.rejected.is_some()) {
                    println!(
                        "REJECTED {} {} ({}): trusted nowhere: {}; remove it: signetctl ca revoke {}",
                        s.kind,
                        s.key_id,
                        state_text(s),
                        s.rejected.as_deref().unwrap_or_default(),
                        s.key_id
                    );
                }
                println!("signing: {}", r.active_key_id);
                println!(
                    "jwt signing: {}",
                    r.active_jwt_key_id.as_deref().unwrap_or("none")
                );
            }
        }
        CaCmd::Prepare { root, kind } => {
            let kind = match (root, kind) {
                (true, _) | (false, Some(KindArg::Root)) => CaKeyKind::Root,
                (false, Some(KindArg::Jwt)) => CaKeyKind::Jwt,
                (false, Some(KindArg::Intermediate) | None) => CaKeyKind::Intermediate,
            };
            let r = c
                .prepare_kind(kind)
                .await
                .map_err(|e| call_err("ca prepare", &e))?;
            print_action("prepared", &r);
        }
        CaCmd::Activate { key_id, force } => {
            let r = c
                .activate(&key_id, force)
                .await
                .map_err(|e| call_err("ca activate", &e))?;
            print_action("activated", &r);
        }
        CaCmd::Taint { key_id } => {
            let r = c
                .taint(&key_id)
                .await
                .map_err(|e| call_err("ca taint", &e))?;
            print_action("tainted", &r);
        }
        CaCmd::Revoke { key_id, force } => {
            let r = c
                .revoke(&key_id, force)
                .await
                .map_err(|e| call_err("ca revoke", &e))?;
            print_action("removed", &r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::CaCmd;
    use crate::{Cli, Cmd};

    /// Review finding F5: a key ID that starts with `-` (base64url) is a key ID, not a flag.
    #[test]
    fn key_ids_may_start_with_a_hyphen() {
        let kid = "-vtrEIHgN55MGq_GQfnb5JwT30p2X-ao";
        for verb in ["activate", "taint", "revoke"] {
            let cli = Cli::try_parse_from(["signetctl", "ca", verb, kid])
                .unwrap_or_else(|e| panic!("ca {verb}: {e}"));
            let Cmd::Ca { cmd } = cli.cmd else {
                panic!("ca {verb}")
            };
            let got = match cmd {
                CaCmd::Activate { key_id, force } => {
                    assert!(!force);
                    key_id
                }
                CaCmd::Taint { key_id } => key_id,
                CaCmd::Revoke { key_id, force } => {
                    assert!(!force);
                    key_id
                }
                other => panic!("{other:?}"),
            };
            assert_eq!(got, kid);
        }
        let cli = Cli::try_parse_from(["signetctl", "ca", "activate", kid, "--force"]).unwrap();
        assert!(matches!(
            cli.cmd,
            Cmd::Ca {
                cmd: CaCmd::Activate { force: true, .. }
            }
        ));
        let cli = Cli::try_parse_from(["signetctl", "ca", "revoke", kid, "--force"]).unwrap();
        assert!(matches!(
            cli.cmd,
            Cmd::Ca {
                cmd: CaCmd::Revoke { force: true, .. }
            }
        ));
    }
}
