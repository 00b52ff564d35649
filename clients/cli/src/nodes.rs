//! `signetctl token|node|nodeset|entry`: join tokens, attested nodes, node sets and
//! registration entries (the `signet.admin.v1.NodeAdmin` service on the admin socket, through
//! the typed `signet_client::admin::NodeAdminClient`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use clap::Subcommand;
use signet_client::admin::{
    EntryChange, JoinTokenInfo, NewEntry, Node, NodeAdminClient, NodeSet, RegisteredEntry,
};

use crate::{call_err, rfc3339};

#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Create a one-time join token; it is printed once, the server keeps only its hash.
    Create {
        /// How long the token may be used.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
        ttl: Duration,
        /// The node ID the token attests (default: a random one).
        #[arg(long)]
        node_id: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List join tokens, newest first: id (a prefix of the token's hash; the token itself is
    /// never kept), node, created, expires, used.
    List {
        /// Only the tokens of this node.
        #[arg(long)]
        node_id: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke an unused join token by its id (from `token list`; a unique prefix of at least 8
    /// characters will do).
    Revoke {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// List attested nodes.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Ban a node: it can renew nothing and sign nothing from now on.
    Ban {
        /// Node ID (or node SPIFFE ID).
        node: String,
        /// Also revoke what the node holds: its node SVIDs and the certificates issued for its
        /// entries (as their ledger provenance records).
        #[arg(long)]
        revoke: bool,
        /// The RFC 5280 reason for `--revoke`.
        #[arg(long, default_value = "keyCompromise", requires = "revoke")]
        reason: String,
    },
    /// Lift a node's ban: it may renew, sync and sign again with its current certificate.
    Unban {
        /// Node ID (or node SPIFFE ID).
        node: String,
        #[arg(long)]
        json: bool,
    },
    /// Forget a node: its record and its unused join tokens are deleted, and its certificates
    /// are refused everything (as a banned node's) until it attests again with a new token.
    /// Refused while entries name it as parent, unless --cascade.
    Delete {
        /// Node ID (or node SPIFFE ID).
        node: String,
        /// Also delete the entries whose parent is this node.
        #[arg(long)]
        cascade: bool,
        /// First revoke what the node holds (its node SVIDs and the certificates issued for
        /// its entries), as `node ban --revoke` does.
        #[arg(long)]
        revoke: bool,
        /// The RFC 5280 reason for `--revoke`.
        #[arg(long, default_value = "cessationOfOperation", requires = "revoke")]
        reason: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeSetCmd {
    /// Create a node set: every node whose attestation proved all of its selectors. An entry
    /// with `--parent nodeset:NAME` serves its workload on every member node. Immutable.
    Create {
        /// 1-64 of a-z, 0-9 and '-'.
        name: String,
        /// A node selector every member proved (repeatable, at least one):
        /// signet:attestation:<join_token|k8s_psat>, k8s_psat:cluster:<name>,
        /// k8s_psat:agent_ns:<ns>, k8s_psat:agent_sa:<ns>:<sa>, k8s_psat:node_name:<node>,
        /// join_token:node_id:<id>.
        #[arg(long = "node-selector", required = true)]
        node_selectors: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// List node sets with their current members and how many entries name each.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete a node set; refused while entries name it as parent.
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
pub enum EntryCmd {
    /// Register a workload identity under a node, or (--file) many in one all-or-nothing call.
    Create {
        #[arg(long, required_unless_present = "file")]
        spiffe_id: Option<String>,
        /// The parent: a node's ID (or SPIFFE ID), or a node set, nodeset:NAME (every member
        /// node serves the entry).
        #[arg(long, required_unless_present = "file")]
        parent: Option<String>,
        /// e.g. unix:uid:1000, unix:path:/usr/bin/app (repeatable; all must match).
        #[arg(long = "selector", required_unless_present = "file")]
        selectors: Vec<String>,
        /// Certificate lifetime (clamped to the server's maximum); default: the server's.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        #[arg(long = "dns")]
        dns_names: Vec<String>,
        /// JWT-SVID lifetime of this entry's tokens (e.g. 10m; at most 24h, clamped to the
        /// server's [jwt_svid] max_ttl); default: the server's [jwt_svid] ttl.
        #[arg(long, value_parser = humantime::parse_duration)]
        jwt_ttl: Option<Duration>,
        /// A foreign trust domain (name or spiffe://name) whose bundle the entry's workloads
        /// receive (repeatable); it needs a federation relationship (`federation create`).
        #[arg(long = "federates-with")]
        federates_with: Vec<String>,
        /// A JSON (.json) or YAML file (`-`: standard input) listing entries with the fields
        /// spiffe_id, parent, selectors, ttl, dns_names, jwt_ttl, federates_with; created all
        /// together or not at all (at most 1,000). Prints the new IDs in the file's order.
        #[arg(long, conflicts_with_all = ["spiffe_id", "parent", "selectors", "ttl", "dns_names", "jwt_ttl", "federates_with"])]
        file: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// List entries.
    List {
        /// Only the entries of this node (ID or SPIFFE ID) or node set (nodeset:NAME).
        #[arg(long)]
        parent: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Change an entry in place: each option given replaces that field (a repeatable option
    /// replaces the whole list); the result is validated as a new entry. Entries kept by a
    /// registrar (OWNER set) are refused: change the object they come from.
    Update {
        id: String,
        #[arg(long)]
        spiffe_id: Option<String>,
        /// A node's ID (or SPIFFE ID), or nodeset:NAME.
        #[arg(long)]
        parent: Option<String>,
        /// Replaces every selector (repeatable).
        #[arg(long = "selector")]
        selectors: Vec<String>,
        /// Certificate lifetime; 0s: the server's default.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// Replaces every DNS name (repeatable).
        #[arg(long = "dns", conflicts_with = "no_dns")]
        dns_names: Vec<String>,
        /// Remove every DNS name.
        #[arg(long)]
        no_dns: bool,
        /// JWT-SVID lifetime; 0s: the server's [jwt_svid] ttl.
        #[arg(long, value_parser = humantime::parse_duration)]
        jwt_ttl: Option<Duration>,
        /// Replaces every federated trust domain (repeatable).
        #[arg(long = "federates-with", conflicts_with = "no_federates_with")]
        federates_with: Vec<String>,
        /// Federate with no trust domain.
        #[arg(long)]
        no_federates_with: bool,
        /// Refuse unless the entry is still at this revision (from `entry list`).
        #[arg(long)]
        revision: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Delete an entry by ID.
    Delete { id: String },
}

async fn client(socket: &Path) -> anyhow::Result<NodeAdminClient> {
    NodeAdminClient::connect(socket)
        .await
        .map_err(crate::unreachable)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

fn token_json(t: &JoinTokenInfo) -> serde_json::Value {
    serde_json::json!({
        "id": t.id,
        "node_id": t.node_id,
        "created_at": rfc3339(t.created_at),
        "expires_at": rfc3339(t.expires_at),
        "used": t.used_at.is_some(),
        "used_at": t.used_at.map(rfc3339),
    })
}

pub async fn token(socket: &Path, cmd: TokenCmd) -> anyhow::Result<ExitCode> {
    let (ttl, node_id, json) = match cmd {
        TokenCmd::Create { ttl, node_id, json } => (ttl, node_id, json),
        TokenCmd::List { node_id, json } => {
            let tokens = client(socket)
                .await?
                .join_tokens(node_id)
                .await
                .map_err(|e| call_err("token list", &e))?;
            if json {
                for t in &tokens {
                    println!("{}", token_json(t));
                }
            } else {
                println!(
                    "{:<16}  {:<24}  {:<20}  {:<20}  USED",
                    "ID", "NODE", "CREATED", "EXPIRES"
                );
                for t in &tokens {
                    println!(
                        "{:<16}  {:<24}  {:<20}  {:<20}  {}",
                        t.id,
                        t.node_id,
                        rfc3339(t.created_at),
                        rfc3339(t.expires_at),
                        t.used_at.map_or_else(|| "no".to_owned(), rfc3339)
                    );
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        TokenCmd::Revoke { id, json } => {
            let t = client(socket)
                .await?
                .revoke_join_token(&id)
                .await
                .map_err(|e| call_err("token revoke", &e))?;
            if json {
                println!("{}", token_json(&t));
            } else {
                println!("revoked join token {} for node {}", t.id, t.node_id);
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    if ttl.as_secs() == 0 {
        return Err(anyhow!("--ttl must be at least one second"));
    }
    let r = client(socket)
        .await?
        .create_join_token(ttl, node_id)
        .await
        .map_err(|e| call_err("token create", &e))?;
    if json {
        println!(
            "{}",
            serde_json::json!({"token": r.token, "node_id": r.node_id, "expires_at": rfc3339(r.expires_at)})
        );
    } else {
        // The token alone on stdout, so `TOKEN=$(signetctl token create)` works.
        println!("{}", r.token);
        eprintln!(
            "join token for node {} (one use, expires {})",
            r.node_id,
            rfc3339(r.expires_at)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn node_json(n: &Node) -> serde_json::Value {
    serde_json::json!({
        "node_id": n.node_id,
        "spiffe_id": n.spiffe_id,
        "attested_at": rfc3339(n.attested_at),
        "banned": n.banned,
        "serial": n.serial,
        "not_after": rfc3339(n.not_after),
        "attestation": n.attestation,
        "selectors": n.selectors,
    })
}

fn node_set_json(s: &NodeSet) -> serde_json::Value {
    serde_json::json!({
        "name": s.name,
        "spiffe_id": s.spiffe_id,
        "node_selectors": s.node_selectors,
        "created_at": rfc3339(s.created_at),
        "members": s.members,
        "entries": s.entries,
    })
}

fn print_node_sets(sets: &[NodeSet], json: bool) {
    if json {
        for s in sets {
            println!("{}", node_set_json(s));
        }
        return;
    }
    println!(
        "{:<24}  {:>7}  {:>7}  {:<48}  MEMBERS",
        "NAME", "MEMBERS", "ENTRIES", "NODE SELECTORS"
    );
    for s in sets {
        println!(
            "{:<24}  {:>7}  {:>7}  {:<48}  {}",
            s.name,
            s.members.len(),
            s.entries,
            s.node_selectors.join(","),
            if s.members.is_empty() {
                "-".to_owned()
            } else {
                s.members.join(",")
            }
        );
    }
}

pub async fn node_set(socket: &Path, cmd: NodeSetCmd) -> anyhow::Result<ExitCode> {
    let c = client(socket).await?;
    match cmd {
        NodeSetCmd::Create {
            name,
            node_selectors,
            json,
        } => {
            let s = c
                .create_node_set(&name, &node_selectors)
                .await
                .map_err(|e| call_err("nodeset create", &e))?;
            if json {
                println!("{}", node_set_json(&s));
            } else {
                println!(
                    "created node set {} ({}), {} member(s) now; name it as an entry's parent \
                     with --parent nodeset:{}",
                    s.name,
                    s.spiffe_id,
                    s.members.len(),
                    s.name
                );
            }
        }
        NodeSetCmd::List { json } => {
            let sets = c
                .node_sets()
                .await
                .map_err(|e| call_err("nodeset list", &e))?;
            print_node_sets(&sets, json);
        }
        NodeSetCmd::Delete { name } => {
            c.delete_node_set(&name)
                .await
                .map_err(|e| call_err("nodeset delete", &e))?;
            println!("deleted node set {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn node(socket: &Path, cmd: NodeCmd) -> anyhow::Result<ExitCode> {
    let c = client(socket).await?;
    match cmd {
        NodeCmd::List { json } => {
            let nodes = c.nodes().await.map_err(|e| call_err("node list", &e))?;
            if json {
                for n in &nodes {
                    println!("{}", node_json(n));
                }
            } else {
                println!(
                    "{:<24}  {:<10}  {:<7}  {:<20}  {:<34}  {:<48}  SELECTORS",
                    "NODE", "ATTESTED", "BANNED", "NOT AFTER", "SERIAL", "SPIFFE ID"
                );
                for n in &nodes {
                    println!(
                        "{:<24}  {:<10}  {:<7}  {:<20}  {:<34}  {:<48}  {}",
                        n.node_id,
                        n.attestation,
                        if n.banned { "yes" } else { "no" },
                        rfc3339(n.not_after),
                        n.serial,
                        n.spiffe_id,
                        n.selectors.join(",")
                    );
                }
            }
        }
        NodeCmd::Ban {
            node,
            revoke,
            reason,
        } => {
            if revoke {
                // Checks the reason and the node before anything changes.
                crate::revoke::revoke_request(
                    socket,
                    signet_client::admin::RevokeSelector::Node(node.clone()),
                    &reason,
                    true,
                )
                .await?;
            }
            let n = c.ban(&node).await.map_err(|e| call_err("node ban", &e))?;
            println!("banned node {} ({})", n.node_id, n.spiffe_id);
            if revoke {
                let r = crate::revoke::revoke_request(
                    socket,
                    signet_client::admin::RevokeSelector::Node(n.node_id.clone()),
                    &reason,
                    false,
                )
                .await?;
                crate::revoke::print_report(&r, false);
            }
        }
        NodeCmd::Unban { node, json } => {
            let n = c
                .unban(&node)
                .await
                .map_err(|e| call_err("node unban", &e))?;
            if json {
                println!("{}", node_json(&n));
            } else {
                println!("unbanned node {} ({})", n.node_id, n.spiffe_id);
            }
        }
        NodeCmd::Delete {
            node,
            cascade,
            revoke,
            reason,
            json,
        } => {
            let report = if revoke {
                Some(
                    crate::revoke::revoke_request(
                        socket,
                        signet_client::admin::RevokeSelector::Node(node.clone()),
                        &reason,
                        false,
                    )
                    .await?,
                )
            } else {
                None
            };
            let d = c
                .delete_node(&node, cascade)
                .await
                .map_err(|e| call_err("node delete", &e))?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "node": node,
                        "entries_deleted": d.entries,
                        "tokens_deleted": d.tokens,
                        "revoked_count": report.as_ref().map(|r| r.revoked_count),
                    })
                );
            } else {
                if let Some(r) = &report {
                    crate::revoke::print_report(r, false);
                }
                println!(
                    "deleted node {node} with {} entr{} and {} unused join token(s)",
                    d.entries,
                    if d.entries == 1 { "y" } else { "ies" },
                    d.tokens
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn entry_json(e: &RegisteredEntry) -> serde_json::Value {
    serde_json::json!({
        "id": e.id,
        "spiffe_id": e.spiffe_id,
        "parent_id": e.parent_id,
        "selectors": e.selectors,
        "ttl_seconds": e.ttl_seconds,
        "jwt_ttl_seconds": e.jwt_ttl_seconds,
        "dns_names": e.dns_names,
        "federates_with": e.federates_with,
        "revision": e.revision,
        "created_at": rfc3339(e.created_at),
        "owner": e.owner,
        "owner_scope": e.owner_scope,
    })
}

/// The OWNER column: `-` for the operator's entries, else the registrar and its scope.
fn owner_column(e: &RegisteredEntry) -> String {
    if e.owner.is_empty() {
        "-".to_owned()
    } else {
        format!("{} ({})", e.owner, e.owner_scope)
    }
}

pub async fn entry(socket: &Path, cmd: EntryCmd) -> anyhow::Result<ExitCode> {
    let c = client(socket).await?;
    match cmd {
        EntryCmd::Create {
            file: Some(file),
            json,
            ..
        } => {
            let entries = crate::entry_file::read(&file)?;
            let (created, revision) = c
                .create_entries(&entries)
                .await
                .map_err(|e| call_err("entry create", &e))?;
            for e in &created {
                if json {
                    println!("{}", entry_json(e));
                } else {
                    println!("{}", e.id);
                }
            }
            if !json {
                eprintln!("{} entries created (revision {})", created.len(), revision);
            }
        }
        EntryCmd::Create {
            spiffe_id,
            parent,
            selectors,
            ttl,
            dns_names,
            jwt_ttl,
            federates_with,
            file: None,
            json,
        } => {
            if jwt_ttl.is_some_and(|d| d.as_secs() == 0) {
                return Err(anyhow!(
                    "--jwt-ttl must be at least one second (leave it out for the default)"
                ));
            }
            let e = c
                .create_entry(&NewEntry {
                    spiffe_id: spiffe_id.unwrap_or_default(),
                    parent: parent.unwrap_or_default(),
                    selectors,
                    ttl_seconds: ttl.map_or(0, secs),
                    dns_names,
                    jwt_ttl_seconds: jwt_ttl.map_or(0, secs),
                    federates_with,
                })
                .await
                .map_err(|e| call_err("entry create", &e))?;
            if json {
                println!("{}", entry_json(&e));
            } else {
                println!("{}", e.id);
                eprintln!(
                    "entry {} for {} under {} (revision {})",
                    e.id, e.spiffe_id, e.parent_id, e.revision
                );
            }
        }
        EntryCmd::List { parent, json } => {
            let entries = c
                .entries(parent)
                .await
                .map_err(|e| call_err("entry list", &e))?;
            if json {
                for e in &entries {
                    println!("{}", entry_json(e));
                }
            } else {
                println!(
                    "{:<32}  {:<40}  {:<40}  {:>8}  {:>8}  SELECTORS  FEDERATES WITH  OWNER",
                    "ID", "SPIFFE ID", "PARENT", "TTL", "JWT TTL"
                );
                for e in &entries {
                    println!(
                        "{:<32}  {:<40}  {:<40}  {:>8}  {:>8}  {}  {}  {}",
                        e.id,
                        e.spiffe_id,
                        e.parent_id,
                        e.ttl_seconds,
                        e.jwt_ttl_seconds,
                        e.selectors.join(","),
                        if e.federates_with.is_empty() {
                            "-".to_owned()
                        } else {
                            e.federates_with.join(",")
                        },
                        owner_column(e)
                    );
                }
            }
        }
        EntryCmd::Update {
            id,
            spiffe_id,
            parent,
            selectors,
            ttl,
            dns_names,
            no_dns,
            jwt_ttl,
            federates_with,
            no_federates_with,
            revision,
            json,
        } => {
            let list =
                |given: Vec<String>, clear: bool| (clear || !given.is_empty()).then_some(given);
            let change = EntryChange {
                spiffe_id,
                parent,
                selectors: list(selectors, false),
                ttl_seconds: ttl.map(secs),
                dns_names: list(dns_names, no_dns),
                jwt_ttl_seconds: jwt_ttl.map(secs),
                federates_with: list(federates_with, no_federates_with),
                expected_revision: revision,
            };
            if change
                == (EntryChange {
                    expected_revision: revision,
                    ..EntryChange::default()
                })
            {
                return Err(anyhow!(
                    "nothing to change: give at least one of --spiffe-id, --parent, --selector, \
                     --ttl, --dns/--no-dns, --jwt-ttl, --federates-with/--no-federates-with"
                ));
            }
            let e = c
                .update_entry(&id, &change)
                .await
                .map_err(|e| call_err("entry update", &e))?;
            if json {
                println!("{}", entry_json(&e));
            } else {
                println!(
                    "updated entry {} for {} under {} (revision {})",
                    e.id, e.spiffe_id, e.parent_id, e.revision
                );
            }
        }
        EntryCmd::Delete { id } => {
            c.delete_entry(&id)
                .await
                .map_err(|e| call_err("entry delete", &e))?;
            println!("deleted entry {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
