//! Registration entries stored before selectors had one spelling.
//!
//! Until the selector grammar moved to `signet_types::selector`, the server accepted spellings
//! the shared grammar now refuses (`unix:uid:+1000`, `unix:uid:01000`, `unix:path:/usr//bin/app`,
//! a trailing `/`, `.` and `..` components). An agent skips an entry whose selector does not
//! parse, so such an entry would stop being served after an upgrade, seen only in the agent's
//! log. At start-up the server therefore reads every entry once:
//! - a selector with a spelling that means the same thing is rewritten to it (`+1000` and
//!   `01000` → `1000`; `//` → `/`, a trailing `/` and `.` components dropped), the entry's
//!   parent gets a new revision so agents fetch it, and the rewrite is audited
//!   (`entry.selectors_upgraded`, old and new spellings);
//! - anything else (a `..` component, which a symlink could make mean another file; an empty
//!   path; control or invisible characters; an unknown kind) is left as stored and reported
//!   loudly: a warning naming the entry, the selector and what to do, and an audit event
//!   (`entry.unservable`). The operator recreates the entry with a selector that parses.
//!
//! A rewrite that would make the entry the same registration as another stored one is not
//! made (reported instead), so registrations stay unique.

use std::collections::HashMap;

use signet_types::selector::Selector;
use signet_types::untrusted::{quoted, shown};

use crate::audit::AuditLog;
use crate::store::nodes::{EntryRow, registration_selectors};
use crate::store::{Store, StoreError};

/// What the start-up pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct UpgradeReport {
    /// Entries whose selectors were rewritten to their canonical spelling.
    pub rewritten: Vec<String>,
    /// Entries left as stored because a selector has no canonical spelling; agents skip them.
    pub unservable: Vec<String>,
}

/// The canonical spelling of a selector the server accepted before the shared grammar, when
/// it means the same thing; `None` when it has none (or already parses).
pub(crate) fn legacy_spelling(s: &str) -> Option<Selector> {
    if s.parse::<Selector>().is_ok() {
        return None;
    }
    let (kind, value) = s
        .strip_prefix("unix:uid:")
        .map(|v| ("uid", v))
        .or_else(|| s.strip_prefix("unix:gid:").map(|v| ("gid", v)))
        .or_else(|| s.strip_prefix("unix:path:").map(|v| ("path", v)))?;
    let rewritten = match kind {
        "path" => {
            let rest = value.strip_prefix('/')?;
            let mut parts = Vec::new();
            for c in rest.split('/') {
                match c {
                    "" | "." => {}
                    // `a/../b` is `b` only when `a` is no symlink: not the same thing.
                    ".." => return None,
                    c => parts.push(c),
                }
            }
            if parts.is_empty() {
                return None;
            }
            format!("unix:path:/{}", parts.join("/"))
        }
        id => {
            let digits = value.strip_prefix('+').unwrap_or(value);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let significant = digits.trim_start_matches('0');
            let n: u32 = if significant.is_empty() {
                0
            } else {
                significant.parse().ok()?
            };
            format!("unix:{id}:{n}")
        }
    };
    rewritten.parse().ok()
}

/// The start-up pass over every stored entry (see the module documentation).
pub(crate) async fn upgrade_selectors(
    store: &dyn Store,
    audit: &AuditLog,
    now_unix: i64,
) -> Result<UpgradeReport, StoreError> {
    let entries = store.list_entries(None).await?;
    let mut taken: HashMap<(String, String, Vec<String>), String> = entries
        .iter()
        .map(|e| (registration_key(e, &e.selectors), e.id.clone()))
        .collect();
    let mut report = UpgradeReport::default();
    for entry in &entries {
        if entry
            .selectors
            .iter()
            .all(|s| s.parse::<Selector>().is_ok())
        {
            continue;
        }
        match canonical_selectors(&entry.selectors) {
            Err(bad) => {
                let reason = match bad.parse::<Selector>() {
                    Err(e) => format!("{e}; it has no canonical spelling"),
                    Ok(_) => format!("selector {} has no canonical spelling", quoted(&bad)),
                };
                unservable(audit, entry, &reason, now_unix);
                report.unservable.push(entry.id.clone());
            }
            Ok(new) => {
                let key = registration_key(entry, &new);
                if let Some(other) = taken.get(&key) {
                    let reason = format!(
                        "its selectors in their canonical spelling ({}) make it the same \
                         registration as entry {}",
                        quoted(&new.join(" ")),
                        quoted(other)
                    );
                    unservable(audit, entry, &reason, now_unix);
                    report.unservable.push(entry.id.clone());
                    continue;
                }
                if store
                    .replace_entry_selectors(&entry.id, &entry.selectors, &new)
                    .await?
                {
                    taken.insert(key, entry.id.clone());
                    tracing::info!(
                        entry = %shown(&entry.id),
                        old = ?entry.selectors,
                        new = ?new,
                        "rewrote a registration entry's selectors to their canonical spelling"
                    );
                    audit.record(
                        "entry.selectors_upgraded",
                        "server",
                        format!(
                            "entry {}: selectors {} → {}",
                            quoted(&entry.id),
                            quoted(&entry.selectors.join(" ")),
                            quoted(&new.join(" "))
                        ),
                        now_unix,
                    );
                    report.rewritten.push(entry.id.clone());
                }
            }
        }
    }
    Ok(report)
}

/// Every selector of an entry in its canonical spelling, or the first that has none.
fn canonical_selectors(selectors: &[String]) -> Result<Vec<String>, String> {
    selectors
        .iter()
        .map(|s| match s.parse::<Selector>() {
            Ok(_) => Ok(s.clone()),
            Err(_) => legacy_spelling(s)
                .map(|c| c.to_string())
                .ok_or_else(|| s.clone()),
        })
        .collect()
}

fn registration_key(e: &EntryRow, selectors: &[String]) -> (String, String, Vec<String>) {
    (
        e.spiffe_id.clone(),
        e.parent_id.clone(),
        registration_selectors(selectors),
    )
}

fn unservable(audit: &AuditLog, entry: &EntryRow, reason: &str, now_unix: i64) {
    let id = shown(&entry.id);
    tracing::warn!(
        "registration entry {id} ({}) cannot be served: {reason}. Agents skip it. Delete \
         it (`signetctl entry delete {id}`) and create it again with selectors that parse",
        shown(&entry.spiffe_id),
    );
    audit.record(
        "entry.unservable",
        "server",
        format!("entry {}: {reason}", quoted(&entry.id)),
        now_unix,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_spellings_that_mean_the_same_are_rewritten() {
        for (old, new) in [
            ("unix:uid:+1000", "unix:uid:1000"),
            ("unix:uid:01000", "unix:uid:1000"),
            ("unix:gid:00", "unix:gid:0"),
            ("unix:gid:+0", "unix:gid:0"),
            ("unix:uid:0004294967295", "unix:uid:4294967295"),
            ("unix:path:/usr//bin/app", "unix:path:/usr/bin/app"),
            ("unix:path:/usr/bin/app/", "unix:path:/usr/bin/app"),
            ("unix:path:/./usr/./bin/app", "unix:path:/usr/bin/app"),
        ] {
            assert_eq!(
                legacy_spelling(old).map(|s| s.to_string()).as_deref(),
                Some(new),
                "{old}"
            );
        }
    }

    #[test]
    fn spellings_without_a_same_meaning_are_not_rewritten() {
        for s in [
            // already canonical: nothing to do
            "unix:uid:1000",
            "unix:path:/usr/bin/app",
            // a symlink could make `..` mean another file
            "unix:path:/usr/../bin/sh",
            "unix:path:/",
            "unix:path://",
            "unix:path:relative",
            "unix:uid:4294967296",
            "unix:uid:+",
            "unix:uid:-1",
            "unix:uid:1e3",
            "unix:path:/a\nb",
            "unix:path:/usr/bin/\u{202e}hsab/",
            "unix:user:a b",
            "k8s:ns:Default",
        ] {
            assert_eq!(legacy_spelling(s), None, "{s:?}");
        }
    }
}
