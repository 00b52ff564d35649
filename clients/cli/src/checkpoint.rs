//! Ledger checkpoints in `signetctl`: `ledger checkpoint create|latest|list|key`, and the
//! comparisons `ledger verify --checkpoint FILE --checkpoint-key KEY.pem` and `--expect-head
//! SEQ:HASH` add to the plain chain verification.
//!
//! The chain alone cannot see a deleted tail (rows removed and the head moved back) or a
//! consistently rewritten history (a row changed and every hash after it recomputed). A
//! checkpoint (seq S, hash H), verified here with only the checkpoint public key, can: the
//! chain must still reach row S, and its recomputed hash at row S must still be H.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use clap::Subcommand;
use signet_client::admin::{LedgerAdminClient, LedgerCheckpoint};
use signet_types::checkpoint::{Head, Mark, PublicKey, SignedCheckpoint};
use signet_types::ledger::{GENESIS, Hash};

use crate::verdict::Broken;
use crate::{call_err, rfc3339, write_replacing};

#[derive(Debug, Subcommand)]
pub(crate) enum CheckpointCmd {
    /// Sign the ledger's head now; print the checkpoint (JSON) or write it to --out.
    Create {
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The newest checkpoint (JSON).
    Latest {
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Checkpoints kept by the server, newest first.
    List {
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// The checkpoint public key (PEM), to verify checkpoints with.
    Key {
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

async fn client(socket: &Path) -> anyhow::Result<LedgerAdminClient> {
    LedgerAdminClient::connect(socket).await.map_err(|e| {
        anyhow!("{e}\n(is signet-server running? point --socket at <data_dir>/admin.sock)")
    })
}

fn emit(text: &str, out: Option<&Path>) -> anyhow::Result<()> {
    match out {
        Some(p) => {
            write_replacing(p, format!("{}\n", text.trim_end()).as_bytes(), 0o644)?;
            eprintln!("wrote {}", p.display());
        }
        None => println!("{}", text.trim_end()),
    }
    Ok(())
}

pub(crate) async fn run(socket: &Path, cmd: CheckpointCmd) -> anyhow::Result<ExitCode> {
    let c = client(socket).await?;
    match cmd {
        CheckpointCmd::Create { out } => {
            let cp = c
                .create_checkpoint()
                .await
                .map_err(|e| call_err("create checkpoint", &e))?;
            emit(&cp.json, out.as_deref())?;
        }
        CheckpointCmd::Latest { out } => {
            let cp = c
                .latest_checkpoint()
                .await
                .map_err(|e| call_err("latest checkpoint", &e))?;
            emit(&cp.json, out.as_deref())?;
        }
        CheckpointCmd::List { limit, json } => {
            let list = c
                .checkpoints(limit)
                .await
                .map_err(|e| call_err("list checkpoints", &e))?;
            if !json {
                println!("{:>8}  {:<20}  {:<64}  FILE", "SEQ", "TIME", "HASH");
            }
            for LedgerCheckpoint {
                seq,
                hash,
                time,
                json: text,
                path,
                ..
            } in list
            {
                if json {
                    println!("{text}");
                } else {
                    println!(
                        "{seq:>8}  {:<20}  {:<64}  {path}",
                        rfc3339(time),
                        hex::encode(hash)
                    );
                }
            }
        }
        CheckpointCmd::Key { out } => {
            let k = c
                .checkpoint_key()
                .await
                .map_err(|e| call_err("checkpoint key", &e))?;
            emit(&k.public_key_pem, out.as_deref())?;
            if out.is_some() {
                eprintln!("key id {}", k.key_id);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One head the chain must still contain.
#[derive(Debug, Clone)]
struct Expected {
    /// How to name it in a report (`checkpoint FILE (…)` or `--expect-head …`).
    what: String,
    /// Not listed in the success report (a point of the chain of checkpoints, summed up there).
    quiet: bool,
    seq: u64,
    hash: Hash,
}

/// The heads a verification must find in the chain: from verified checkpoints and from
/// `--expect-head`. Empty when neither was given (the plain verification).
#[derive(Debug, Clone, Default)]
pub(crate) struct Expectations {
    items: Vec<Expected>,
}

/// Reads the checkpoint `text` (named `name` in messages) and verifies its signature with `key`
/// and its trust domain: the head it vouches for, or why it is refused.
fn verify_checkpoint(
    text: &str,
    key: &PublicKey,
    trust_domain: &str,
    name: &str,
) -> anyhow::Result<Expected> {
    let cp =
        SignedCheckpoint::from_json(text.trim()).map_err(|e| anyhow!("checkpoint {name}: {e}"))?;
    let v = key
        .verify(&cp)
        .map_err(|e| anyhow!("checkpoint {name} refused: {e}"))?;
    let h = v.head();
    if h.trust_domain != trust_domain {
        bail!(
            "checkpoint {name} is for trust domain {:?}, but this server's is {:?}",
            h.trust_domain,
            trust_domain
        );
    }
    Ok(Expected {
        quiet: false,
        what: format!(
            "checkpoint {name} (row {}, signed {} by key {})",
            h.seq,
            rfc3339(h.time),
            &v.key_id()[..16]
        ),
        seq: h.seq,
        hash: h.hash,
    })
}

/// Where `ledger verify --from-checkpoint` starts: a verified checkpoint's head.
#[derive(Debug, Clone)]
pub(crate) struct Start {
    pub(crate) what: String,
    pub(crate) seq: u64,
    pub(crate) hash: Hash,
}

/// The checkpoint `which` names (`latest`, a checkpoint's seq from `ledger checkpoint list`, or
/// a JSON file), verified with the public key at `key_path` (kept apart from the server; the
/// server's word is not taken for its own checkpoint).
pub(crate) async fn load_start(
    socket: &Path,
    which: &str,
    key_path: &Path,
    trust_domain: &str,
) -> anyhow::Result<Start> {
    let pem = std::fs::read(key_path)
        .with_context(|| format!("reading checkpoint key {}", key_path.display()))?;
    let key = PublicKey::from_pem(&pem)
        .map_err(|e| anyhow!("checkpoint key {}: {e}", key_path.display()))?;
    let (name, text) = if which == "latest" {
        let cp = client(socket)
            .await?
            .latest_checkpoint()
            .await
            .map_err(|e| call_err("latest checkpoint", &e))?;
        (format!("latest ({})", cp.path), cp.json)
    } else if let Ok(seq) = which.parse::<u64>() {
        let listed = client(socket)
            .await?
            .checkpoints(1000)
            .await
            .map_err(|e| call_err("list checkpoints", &e))?;
        let cp = listed.into_iter().find(|c| c.seq == seq).ok_or_else(|| {
            anyhow!("no checkpoint of row {seq} is kept (see `signetctl ledger checkpoint list`)")
        })?;
        (format!("of row {seq} ({})", cp.path), cp.json)
    } else {
        let text = std::fs::read_to_string(which)
            .with_context(|| format!("reading checkpoint {which}"))?;
        (which.to_owned(), text)
    };
    let e = verify_checkpoint(&text, &key, trust_domain, &name)?;
    Ok(Start {
        what: e.what,
        seq: e.seq,
        hash: e.hash,
    })
}

/// One checkpoint of the server's list, verified.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    /// How to name it in a report.
    pub(crate) what: String,
    pub(crate) head: Head,
}

/// The newest `depth` checkpoints the server keeps, each verified with `key` and for
/// `trust_domain`: a checkpoint that does not verify is refused (an error naming it).
pub(crate) async fn load_chain(
    socket: &Path,
    key_path: &Path,
    trust_domain: &str,
    depth: u32,
) -> anyhow::Result<Vec<Link>> {
    let pem = std::fs::read(key_path)
        .with_context(|| format!("reading checkpoint key {}", key_path.display()))?;
    let key = PublicKey::from_pem(&pem)
        .map_err(|e| anyhow!("checkpoint key {}: {e}", key_path.display()))?;
    let listed = client(socket)
        .await?
        .checkpoints(depth)
        .await
        .map_err(|e| call_err("list checkpoints", &e))?;
    let mut out = Vec::with_capacity(listed.len());
    for cp in listed {
        let name = format!("of row {} ({})", cp.seq, cp.path);
        let signed = SignedCheckpoint::from_json(cp.json.trim())
            .map_err(|e| anyhow!("checkpoint {name}: {e}"))?;
        let v = key
            .verify(&signed)
            .map_err(|e| anyhow!("checkpoint {name} refused: {e}"))?;
        if v.head().trust_domain != trust_domain {
            bail!(
                "checkpoint {name} is for trust domain {:?}, but this server's is {trust_domain:?}",
                v.head().trust_domain
            );
        }
        out.push(Link {
            what: format!("checkpoint {name}, signed {}", rfc3339(v.head().time)),
            head: v.head().clone(),
        });
    }
    Ok(out)
}

/// Checks a chain of verified checkpoints (any order): in signing order (time, then seq) the
/// seq never decreases and a checkpoint of the same row has the same hash; a version 2
/// checkpoint's `previous` is not below the checkpoint signed before it, and is that very
/// checkpoint when at its row (above it: a checkpoint of another replica in between). Returns
/// the points the ledger must still hold: every checkpoint's head and every `previous`, each
/// once, named; or what is wrong.
pub(crate) fn check_chain(links: &[Link]) -> Result<Vec<(String, Mark)>, Broken> {
    let mut order: Vec<&Link> = links.iter().collect();
    order.sort_by_key(|l| (l.head.time, l.head.seq));
    for pair in order.windows(2) {
        let (older, newer) = (pair[0], pair[1]);
        let (o, n) = (older.head.mark(), newer.head.mark());
        if n.seq < o.seq {
            return Err(Broken::CheckpointsWentBack {
                older: older.what.clone(),
                older_seq: o.seq,
                newer: newer.what.clone(),
                newer_seq: n.seq,
            });
        }
        if n.seq == o.seq && n.hash != o.hash {
            return Err(Broken::CheckpointsDisagree {
                older: older.what.clone(),
                newer: newer.what.clone(),
                seq: n.seq,
            });
        }
        if let Some(p) = newer.head.previous {
            if p.seq < o.seq {
                return Err(Broken::CheckpointNotExtended {
                    newer: newer.what.clone(),
                    previous_seq: p.seq,
                    older: older.what.clone(),
                    older_seq: o.seq,
                });
            }
            if p.seq == o.seq && p.hash != o.hash {
                return Err(Broken::CheckpointExtendsRewritten {
                    newer: newer.what.clone(),
                    seq: p.seq,
                    previous_hash: p.hash,
                    older: older.what.clone(),
                    older_hash: o.hash,
                });
            }
        }
    }
    let mut marks: Vec<(String, Mark)> = Vec::new();
    for l in &order {
        let mut add = |what: String, m: Mark| {
            if !marks.iter().any(|(_, x)| *x == m) {
                marks.push((what, m));
            }
        };
        add(l.what.clone(), l.head.mark());
        if let Some(p) = l.head.previous {
            add(format!("the checkpoint {} extends", l.what), p);
        }
    }
    Ok(marks)
}

/// Parses `SEQ:HASH` (HASH: 64 hex digits).
pub(crate) fn parse_expect_head(s: &str) -> anyhow::Result<(u64, Hash)> {
    let (seq, hash) = s
        .split_once(':')
        .ok_or_else(|| anyhow!("--expect-head {s:?}: expected SEQ:HASH (HASH: 64 hex digits)"))?;
    let seq: u64 = seq
        .trim()
        .parse()
        .map_err(|_| anyhow!("--expect-head {s:?}: {seq:?} is not a sequence number"))?;
    let bytes = hex::decode(hash.trim())
        .map_err(|_| anyhow!("--expect-head {s:?}: the hash is not hexadecimal"))?;
    let hash: Hash = bytes
        .try_into()
        .map_err(|_| anyhow!("--expect-head {s:?}: the hash is not 32 bytes (64 hex digits)"))?;
    Ok((seq, hash))
}

impl Expectations {
    /// Reads and verifies each checkpoint file with `key` (required when any is given) and
    /// adds the `--expect-head` values. A checkpoint that does not verify, or is for another
    /// trust domain than `trust_domain`, is refused: an error, not a verdict on the ledger.
    pub(crate) fn load(
        checkpoints: &[PathBuf],
        key: Option<&Path>,
        expect_heads: &[String],
        trust_domain: &str,
    ) -> anyhow::Result<Self> {
        let mut items = Vec::new();
        if !checkpoints.is_empty() {
            let key_path =
                key.ok_or_else(|| anyhow!("--checkpoint needs --checkpoint-key PUBKEY.pem"))?;
            let pem = std::fs::read(key_path)
                .with_context(|| format!("reading checkpoint key {}", key_path.display()))?;
            let key = PublicKey::from_pem(&pem)
                .map_err(|e| anyhow!("checkpoint key {}: {e}", key_path.display()))?;
            for path in checkpoints {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading checkpoint {}", path.display()))?;
                let name = path.display().to_string();
                items.push(verify_checkpoint(&text, &key, trust_domain, &name)?);
            }
        } else if key.is_some() {
            bail!("--checkpoint-key is used with --checkpoint FILE");
        }
        for s in expect_heads {
            let (seq, hash) = parse_expect_head(s)?;
            items.push(Expected {
                quiet: false,
                what: format!("--expect-head {seq}:{}", hex::encode(hash)),
                seq,
                hash,
            });
        }
        Ok(Self { items })
    }

    /// Adds a point the chain must contain (from the chain of checkpoints).
    pub(crate) fn push(&mut self, what: String, mark: Mark) {
        self.items.push(Expected {
            what,
            quiet: true,
            seq: mark.seq,
            hash: mark.hash,
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Called with every row's verified hash, in order: refuses a row at an expected seq whose
    /// hash is not the expected one.
    pub(crate) fn observe(&self, seq: u64, hash: &Hash) -> Result<(), Broken> {
        for e in self.items.iter().filter(|e| e.seq == seq) {
            if &e.hash != hash {
                return Err(Broken::Rewritten {
                    seq,
                    found: *hash,
                    what: e.what.clone(),
                    expected: e.hash,
                });
            }
        }
        Ok(())
    }

    /// Called once the whole chain verified up to row `last`: refuses a chain that ends before
    /// an expected row.
    pub(crate) fn finish(&self, last: u64) -> Result<(), Broken> {
        for e in &self.items {
            if e.seq == 0 && e.hash != GENESIS {
                return Err(Broken::NotGenesis {
                    what: e.what.clone(),
                });
            }
            if e.seq > last {
                return Err(Broken::Truncated {
                    last,
                    seq: e.seq,
                    what: e.what.clone(),
                });
            }
        }
        Ok(())
    }

    /// What was checked, for the success report.
    pub(crate) fn checked(&self) -> Vec<String> {
        self.items
            .iter()
            .filter(|e| !e.quiet)
            .map(|e| e.what.clone())
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn expect_head_parses_and_checks() {
        let h = [7u8; 32];
        let (seq, hash) = parse_expect_head(&format!("5:{}", hex::encode(h))).unwrap();
        assert_eq!((seq, hash), (5, h));
        assert!(parse_expect_head("5").is_err());
        assert!(parse_expect_head("x:00").is_err());
        assert!(parse_expect_head("5:abcd").is_err());
        let e = Expectations::load(&[], None, &[format!("5:{}", hex::encode(h))], "x").unwrap();
        assert!(e.observe(4, &[1; 32]).is_ok());
        assert!(e.observe(5, &h).is_ok());
        let err = e.observe(5, &[1; 32]).unwrap_err().to_string();
        assert!(err.contains("rewritten"), "{err}");
        assert!(e.finish(5).is_ok());
        let err = e.finish(3).unwrap_err().to_string();
        assert!(err.contains("rows 4..=5 were deleted"), "{err}");
        assert!(Expectations::load(&[PathBuf::from("x")], None, &[], "x").is_err());
    }

    fn link(seq: u64, hash: u8, time: i64, previous: Option<(u64, u8)>) -> Link {
        Link {
            what: format!("checkpoint {seq}@{time}"),
            head: Head {
                trust_domain: "example.org".into(),
                seq,
                hash: [hash; 32],
                time,
                previous: previous.map(|(seq, h)| Mark {
                    seq,
                    hash: if seq == 0 { GENESIS } else { [h; 32] },
                }),
            },
        }
    }

    #[test]
    fn a_chain_of_checkpoints_links_up_or_says_where_it_breaks() {
        // A v1 checkpoint, then v2 ones each extending the one before, listed newest first.
        let good = vec![
            link(9, 9, 40, Some((7, 7))),
            link(7, 7, 30, Some((5, 5))),
            link(5, 5, 20, Some((3, 3))),
            link(3, 3, 10, None),
        ];
        let marks = check_chain(&good).unwrap();
        let seqs: Vec<u64> = marks.iter().map(|(_, m)| m.seq).collect();
        assert_eq!(seqs, [3, 5, 7, 9], "each point once, oldest first");
        // The first checkpoint ever (previous: the empty ledger) and an unchanged head.
        let first = vec![link(2, 2, 5, Some((0, 0))), link(2, 2, 6, Some((2, 2)))];
        assert!(check_chain(&first).is_ok());
        // Another replica's checkpoint in between (previous above the one before): linked.
        let replicas = vec![link(3, 3, 10, None), link(9, 9, 40, Some((6, 6)))];
        let marks = check_chain(&replicas).unwrap();
        assert!(
            marks
                .iter()
                .any(|(w, m)| m.seq == 6 && w.contains("extends"))
        );

        // A checkpoint of a shorter head signed after a longer one: the head went back.
        let err = check_chain(&[link(7, 7, 30, None), link(4, 4, 40, Some((0, 0)))]).unwrap_err();
        assert!(matches!(
            err,
            Broken::CheckpointsWentBack {
                newer_seq: 4,
                older_seq: 7,
                ..
            }
        ));
        let err = err.to_string();
        assert!(err.contains("went back") && err.contains("row 4"), "{err}");
        // Same row, another hash.
        let err = check_chain(&[link(7, 7, 30, None), link(7, 8, 40, Some((7, 7)))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("different hashes"), "{err}");
        // Longer again, but not extending the one before (signed with no record of it).
        let err = check_chain(&[link(7, 7, 30, None), link(9, 9, 40, Some((0, 0)))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("without extending"), "{err}");
        // Extending the row before with another hash: rewritten.
        let err = check_chain(&[link(7, 7, 30, None), link(9, 9, 40, Some((7, 1)))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("rewritten"), "{err}");
        // Each message reads as one sentence: no run of spaces from a broken line continuation.
        for bad in [
            link(4, 4, 40, Some((0, 0))),
            link(7, 8, 40, Some((7, 7))),
            link(9, 9, 40, Some((0, 0))),
            link(9, 9, 40, Some((7, 1))),
        ] {
            let err = check_chain(&[link(7, 7, 30, None), bad])
                .unwrap_err()
                .to_string();
            assert!(!err.contains("  "), "{err}");
        }
        // Empty and single chains are fine.
        assert!(check_chain(&[]).unwrap().is_empty());
        assert_eq!(check_chain(&good[..1]).unwrap().len(), 2);
    }
}
