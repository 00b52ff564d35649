//! The agent's world, as pure functions: node IDs, join tokens, selectors and registration
//! entries. No I/O; the API edge (`api::node`, `api::node_admin`) calls these to validate.
//!
//! The rules themselves that other layers share live in `signet-types` (node IDs in
//! [`signet_types::node`], DNS names in [`signet_types::dns`], requested TTLs in
//! [`signet_types::ttl`]), so this module depends on no other part of the server but one: an
//! entry is checked against the issuance policy's reserved identities and names
//! ([`Policy::is_reserved_id`], [`Policy::refuse_server_dns_name`], the very functions the
//! signing policy's `reserved` check calls), so an entry that could only ever fail at signing
//! is refused when it is created, with the reason. It keeps only the operator-facing
//! validation (parents, selectors, entries) and join tokens; each refusal is an error type of
//! its own ([`ParentError`], [`EntryError`], [`BatchError`], [`BadJoinToken`]) whose message
//! the API edge returns as it is (`api::ApiError`'s `From` impls).

use signet_types::dns::DnsName;
use signet_types::node::NodeIdError;
use signet_types::node_set::{
    NODE_SET_PARENT_PREFIX, NODE_SET_PATH_PREFIX, NodeSetError, NodeSetName, node_set_of,
};
use signet_types::selector::{Selector, SelectorError};
use signet_types::untrusted::quoted;
use signet_types::{SpiffeId, SpiffeIdError, TrustDomain};

use crate::policy::Denial;
use crate::policy::Policy;

pub use signet_types::node::{NODE_PATH_PREFIX, node_id_of};

/// Most selectors and DNS names on one entry.
const MAX_SELECTORS: usize = 32;
const MAX_DNS_NAMES: usize = 32;

/// Most entries in one `BatchCreateEntries` call (about 150 kB on the wire at typical sizes,
/// well inside the admin socket's transport limit; one transaction of this size commits in
/// well under a second on either database).
pub const MAX_BATCH_ENTRIES: usize = 1000;

/// A node ID: 1–128 of `[A-Za-z0-9._-]`, not `.` or `..` ([`signet_types::node::NodeId`]).
pub fn validate_node_id(id: &str) -> Result<(), NodeIdError> {
    signet_types::node::NodeId::new(id).map(|_| ())
}

/// The node's SPIFFE ID ([`signet_types::node::node_spiffe_id`]).
pub fn node_spiffe_id(td: &TrustDomain, node_id: &str) -> Result<SpiffeId, NodeIdError> {
    signet_types::node::node_spiffe_id(td, node_id)
}

/// Why a parent (a node ID, a node SPIFFE ID, or a node set) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParentError {
    /// It starts like a SPIFFE ID but is not one (`given` is quoted for display).
    #[error("parent {given} is not a SPIFFE ID: {source}")]
    NotSpiffeId {
        given: String,
        source: SpiffeIdError,
    },
    /// A SPIFFE ID, but not a node's (or, where one may be, a node set's) in this trust domain.
    #[error(
        "parent {id} is not a node ID of this trust domain \
         (spiffe://{td}{NODE_PATH_PREFIX}<node-id>){}",
        nor_a_set(.td, .sets)
    )]
    NotANode {
        id: SpiffeId,
        td: TrustDomain,
        /// Whether a node set would have done.
        sets: bool,
    },
    /// A bare node ID that is not valid.
    #[error("parent: {0}")]
    NodeId(#[source] NodeIdError),
    /// `nodeset:<name>` with a name that is not valid.
    #[error("parent: {0}")]
    NodeSet(#[source] NodeSetError),
}

fn nor_a_set(td: &TrustDomain, sets: &bool) -> String {
    if *sets {
        format!(" nor a node set (nodeset:<name> or spiffe://{td}{NODE_SET_PATH_PREFIX}<name>)")
    } else {
        String::new()
    }
}

/// An entry's parent: a node, or a node set (whose member nodes all receive the entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
    Node(SpiffeId),
    /// The set's name and SPIFFE ID (`spiffe://<td>/signet/nodeset/<name>`).
    NodeSet {
        name: NodeSetName,
        id: SpiffeId,
    },
}

impl Parent {
    /// What the entry's `parent_id` holds.
    pub fn spiffe_id(&self) -> &SpiffeId {
        match self {
            Parent::Node(id) | Parent::NodeSet { id, .. } => id,
        }
    }
}

/// A parent as the operator names it: a node ID, a node SPIFFE ID of `td`, `nodeset:<name>`,
/// or a node set's SPIFFE ID of `td`.
pub fn parse_parent(td: &TrustDomain, parent: &str) -> Result<Parent, ParentError> {
    if let Some(name) = parent.strip_prefix(NODE_SET_PARENT_PREFIX) {
        let name = NodeSetName::new(name).map_err(ParentError::NodeSet)?;
        let id = name
            .spiffe_id(td)
            .map_err(|source| ParentError::NotSpiffeId {
                given: quoted(parent),
                source,
            })?;
        return Ok(Parent::NodeSet { name, id });
    }
    if parent.starts_with("spiffe://") {
        let id = spiffe_id(parent)?;
        if let Some(name) = node_set_of(&id, td) {
            return Ok(Parent::NodeSet { name, id });
        }
        if node_id_of(&id, td).is_none() {
            return Err(ParentError::NotANode {
                id,
                td: td.clone(),
                sets: true,
            });
        }
        Ok(Parent::Node(id))
    } else {
        node_spiffe_id(td, parent)
            .map(Parent::Node)
            .map_err(ParentError::NodeId)
    }
}

fn spiffe_id(given: &str) -> Result<SpiffeId, ParentError> {
    given.parse().map_err(|source| ParentError::NotSpiffeId {
        given: quoted(given),
        source,
    })
}

/// A node as the operator names it (banning it, selecting its certificates): a node ID, or a
/// node SPIFFE ID of `td`; never a node set.
pub fn parse_node(td: &TrustDomain, node: &str) -> Result<SpiffeId, ParentError> {
    if node.starts_with("spiffe://") {
        let id = spiffe_id(node)?;
        if node_id_of(&id, td).is_none() {
            return Err(ParentError::NotANode {
                id,
                td: td.clone(),
                sets: false,
            });
        }
        Ok(id)
    } else {
        node_spiffe_id(td, node).map_err(ParentError::NodeId)
    }
}

/// A join token as it travels: shown once to the operator, then only its hash is kept.
/// `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken(String);

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JoinToken(…)")
    }
}

/// Join tokens are 32 random bytes, hex, with this prefix (so they are recognizable in a
/// secret scanner and unmistakable for anything else).
const TOKEN_PREFIX: &str = "sjt_";

/// The system gave no randomness for a new join token (our fault, not the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no randomness for a join token")]
pub struct NoRandomness;

/// A caller's join token is not in the token format. Never carries the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a join token is {TOKEN_PREFIX} followed by 64 hex digits (as printed by \
     `signetctl token create`)"
)]
pub struct BadJoinToken;

impl JoinToken {
    /// A fresh random token.
    pub fn generate() -> Result<Self, NoRandomness> {
        let mut b = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
            .map_err(|_| NoRandomness)?;
        Ok(Self(format!("{TOKEN_PREFIX}{}", hex::encode(b))))
    }

    /// Parses what a caller sent. The error never repeats the input.
    pub fn parse(s: &str) -> Result<Self, BadJoinToken> {
        let ok = s
            .strip_prefix(TOKEN_PREFIX)
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        if ok {
            Ok(Self(s.to_ascii_lowercase()))
        } else {
            Err(BadJoinToken)
        }
    }

    /// The secret itself, for showing once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the store keeps: SHA-256 of the token, hex.
    pub fn hash(&self) -> String {
        hex::encode(signet_types::ledger::sha256(self.0.as_bytes()))
    }
}

/// Validates one selector with the one grammar the agent matches with
/// ([`signet_types::selector`]): `unix:uid:<n>`, `unix:gid:<n>`, `unix:user:<name>`,
/// `unix:path:<absolute path>`, `k8s:ns:<ns>`, `k8s:sa:<sa>`, `k8s:pod-label:<key>:<value>`.
pub fn validate_selector(s: &str) -> Result<Selector, SelectorError> {
    s.parse()
}

/// What an operator asks for when creating an entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidEntry {
    pub spiffe_id: SpiffeId,
    /// A node's or a node set's SPIFFE ID ([`parse_parent`]); whether the set exists is checked
    /// by the store, in the transaction that writes the entry.
    pub parent_id: SpiffeId,
    pub selectors: Vec<String>,
    pub ttl_seconds: i64,
    pub dns_names: Vec<String>,
    /// The lifetime of the entry's JWT-SVIDs, seconds; 0: the server's default
    /// ([`ValidEntry::with_jwt_ttl`]).
    pub jwt_ttl_seconds: i64,
    /// Foreign trust domain names whose bundles the entry's workloads receive: sorted, without
    /// duplicates ([`ValidEntry::with_federates_with`]). The store refuses one without a
    /// federation relationship.
    pub federates_with: Vec<String>,
}

/// Most trust domains one entry federates with.
pub const MAX_FEDERATES_WITH: usize = 32;

impl ValidEntry {
    /// The entry federating with `names` (each a trust domain name or `spiffe://name`): none
    /// may be the own trust domain `own`, at most [`MAX_FEDERATES_WITH`].
    pub fn with_federates_with(
        mut self,
        names: &[String],
        own: &TrustDomain,
    ) -> Result<Self, EntryError> {
        if names.len() > MAX_FEDERATES_WITH {
            return Err(EntryError::TooManyFederated);
        }
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            let td = TrustDomain::new(n).map_err(|source| EntryError::FederatesWith {
                given: quoted(n),
                source,
            })?;
            if &td == own {
                return Err(EntryError::FederatesWithOwn(td));
            }
            // No relationship can have such a name (federation::relationships::
            // federated_trust_domain); say so rather than "no relationship".
            let name = td.as_str();
            if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
                return Err(EntryError::FederatesWithEmptyLabel(quoted(n)));
            }
            out.push(name.to_owned());
        }
        out.sort_unstable();
        out.dedup();
        self.federates_with = out;
        Ok(self)
    }

    /// The entry with a JWT-SVID lifetime: 0 (the server's default), or 1 s to
    /// [`crate::jwt_svid::MAX_ENTRY_JWT_TTL`] (the server clamps it to its `max_ttl` when it
    /// mints).
    pub fn with_jwt_ttl(mut self, jwt_ttl_seconds: i64) -> Result<Self, EntryError> {
        let max = i64::try_from(crate::jwt_svid::MAX_ENTRY_JWT_TTL.as_secs()).unwrap_or(i64::MAX);
        if !(0..=max).contains(&jwt_ttl_seconds) {
            return Err(EntryError::JwtTtl(jwt_ttl_seconds));
        }
        self.jwt_ttl_seconds = jwt_ttl_seconds;
        Ok(self)
    }
}

/// Why an entry is refused at creation, each with the message the operator sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// `given` is quoted for display.
    #[error("spiffe_id {given} is not a SPIFFE ID: {source}")]
    NotSpiffeId {
        given: String,
        source: SpiffeIdError,
    },
    #[error("spiffe_id {id} is not in trust domain {td}")]
    ForeignTrustDomain { id: SpiffeId, td: TrustDomain },
    #[error("spiffe_id {0} has no path; name a workload")]
    NoPath(SpiffeId),
    #[error("spiffe_id {0} is under /signet/, which is reserved for Signet's own identities")]
    Reserved(SpiffeId),
    #[error(transparent)]
    Parent(#[from] ParentError),
    #[error("an entry needs at least one selector, e.g. unix:uid:1000")]
    NoSelectors,
    #[error("at most {MAX_SELECTORS} selectors per entry")]
    TooManySelectors,
    #[error(transparent)]
    Selector(#[from] SelectorError),
    #[error(
        "ttl {0} s is out of range (0 for the default, at most ten years; \
         the CA clamps it to its maximum)"
    )]
    Ttl(i64),
    #[error(
        "jwt_ttl {0} s is out of range (0 for the server's default, else 1 s to 24 h; the CA \
         clamps it to its [jwt_svid] max_ttl)"
    )]
    JwtTtl(i64),
    #[error("at most {MAX_DNS_NAMES} DNS names per entry")]
    TooManyDnsNames,
    #[error("federates_with {given} is not a trust domain: {source}")]
    FederatesWith {
        given: String,
        source: SpiffeIdError,
    },
    #[error("federates_with names {0}, this server's own trust domain; name foreign ones only")]
    FederatesWithOwn(TrustDomain),
    #[error("federates_with {0}: a label is empty (a leading, trailing or doubled dot)")]
    FederatesWithEmptyLabel(String),
    #[error("at most {MAX_FEDERATES_WITH} trust domains in federates_with")]
    TooManyFederated,
    /// The name, quoted for display.
    #[error("{0} is not a valid DNS name")]
    DnsName(String),
    /// One of the server's own names (or a wildcard covering one): signing would refuse it.
    #[error("{0}, so this entry's workload would never get a certificate")]
    ServerDnsName(Denial),
}

/// Validates an entry for `policy`'s trust domain: its SPIFFE ID in it with a path, not
/// reserved (under `/signet/`); a node parent; 1–32 valid selectors (deduplicated, sorted); TTL
/// 0 (the default) to ten years; valid DNS names, none of them the server's own (or a wildcard
/// covering one), which signing would refuse.
pub fn validate_entry(
    policy: &Policy,
    spiffe_id: &str,
    parent: &str,
    selectors: &[String],
    ttl_seconds: i64,
    dns_names: &[String],
) -> Result<ValidEntry, EntryError> {
    let parent_id = parse_parent(policy.trust_domain(), parent)?
        .spiffe_id()
        .clone();
    validate_entry_under(
        policy,
        spiffe_id,
        parent_id,
        selectors,
        ttl_seconds,
        dns_names,
    )
}

/// [`validate_entry`] for a parent already resolved to its SPIFFE ID (a node's, or a node
/// set's for the Registration service, `crate::registration`): the same rules for the rest.
pub fn validate_entry_under(
    policy: &Policy,
    spiffe_id: &str,
    parent_id: SpiffeId,
    selectors: &[String],
    ttl_seconds: i64,
    dns_names: &[String],
) -> Result<ValidEntry, EntryError> {
    let td = policy.trust_domain();
    let id: SpiffeId = spiffe_id
        .parse()
        .map_err(|source| EntryError::NotSpiffeId {
            given: quoted(spiffe_id),
            source,
        })?;
    if !id.is_member_of(td) {
        return Err(EntryError::ForeignTrustDomain { id, td: td.clone() });
    }
    if id.path().is_empty() {
        return Err(EntryError::NoPath(id));
    }
    if Policy::is_reserved_id(&id) {
        return Err(EntryError::Reserved(id));
    }
    if selectors.is_empty() {
        return Err(EntryError::NoSelectors);
    }
    if selectors.len() > MAX_SELECTORS {
        return Err(EntryError::TooManySelectors);
    }
    for s in selectors {
        validate_selector(s)?;
    }
    let mut sel = selectors.to_vec();
    sel.sort();
    sel.dedup();
    if !signet_types::ttl::is_requestable(ttl_seconds) {
        return Err(EntryError::Ttl(ttl_seconds));
    }
    if dns_names.len() > MAX_DNS_NAMES {
        return Err(EntryError::TooManyDnsNames);
    }
    let mut dns = Vec::new();
    for d in dns_names {
        if !DnsName::is_valid(d) {
            return Err(EntryError::DnsName(quoted(d)));
        }
        policy
            .refuse_server_dns_name(d)
            .map_err(EntryError::ServerDnsName)?;
        let d = d.to_ascii_lowercase();
        if !dns.contains(&d) {
            dns.push(d);
        }
    }
    Ok(ValidEntry {
        spiffe_id: id,
        parent_id,
        selectors: sel,
        ttl_seconds,
        dns_names: dns,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
    })
}

/// One entry of a batch as the operator sent it (the fields of `CreateEntryRequest`).
#[derive(Debug, Clone, Copy)]
pub struct EntryInput<'a> {
    pub spiffe_id: &'a str,
    pub parent: &'a str,
    pub selectors: &'a [String],
    pub ttl_seconds: i64,
    pub dns_names: &'a [String],
    /// 0: the server's default JWT-SVID lifetime.
    pub jwt_ttl_seconds: i64,
    pub federates_with: &'a [String],
}

/// Why a batch of entries is refused (all of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("the batch is empty; send at least one entry")]
    Empty,
    #[error("{0} entries in one batch; send at most {MAX_BATCH_ENTRIES}")]
    TooMany(usize),
    /// Entry `index` (from 0) is refused as [`validate_entry`] refuses one.
    #[error("entry {index}: {source}")]
    Entry { index: usize, source: EntryError },
    /// Entry `index` is the same registration as the earlier entry `first`.
    #[error(
        "entry {index}: duplicates entry {first} of this batch (same spiffe_id {spiffe_id}, \
         parent and selectors)"
    )]
    Duplicate {
        index: usize,
        first: usize,
        spiffe_id: SpiffeId,
    },
}

/// Validates a batch: 1 to [`MAX_BATCH_ENTRIES`] entries, each exactly as [`validate_entry`]
/// validates one, and no two the same registration. Two entries are the same registration when
/// their SPIFFE ID, parent and (sorted, deduplicated) selectors are equal, as SPIRE's "similar
/// entry" rule: TTL and DNS names do not count, since two such entries would hand the same
/// workload the same identity twice. (The store applies the same rule against stored entries,
/// inside the batch's transaction.) The first fault refuses the whole batch; its message names
/// the entry's index (from 0).
pub fn validate_batch(
    policy: &Policy,
    entries: &[EntryInput<'_>],
) -> Result<Vec<ValidEntry>, BatchError> {
    if entries.is_empty() {
        return Err(BatchError::Empty);
    }
    if entries.len() > MAX_BATCH_ENTRIES {
        return Err(BatchError::TooMany(entries.len()));
    }
    let mut valid: Vec<ValidEntry> = Vec::with_capacity(entries.len());
    // Registration key -> index, to find a duplicate in one pass.
    let mut seen: std::collections::HashMap<(String, String, Vec<String>), usize> =
        std::collections::HashMap::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let v = validate_entry(
            policy,
            e.spiffe_id,
            e.parent,
            e.selectors,
            e.ttl_seconds,
            e.dns_names,
        )
        .and_then(|v| v.with_jwt_ttl(e.jwt_ttl_seconds))
        .and_then(|v| v.with_federates_with(e.federates_with, policy.trust_domain()))
        .map_err(|source| BatchError::Entry { index: i, source })?;
        let key = (
            v.spiffe_id.to_string(),
            v.parent_id.to_string(),
            v.selectors.clone(),
        );
        if let Some(first) = seen.insert(key, i) {
            return Err(BatchError::Duplicate {
                index: i,
                first,
                spiffe_id: v.spiffe_id,
            });
        }
        valid.push(v);
    }
    Ok(valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn td() -> TrustDomain {
        TrustDomain::new("example.org").expect("td")
    }

    /// The policy entries are checked against: the server is `localhost` and
    /// `signet.example.org`.
    fn policy() -> Policy {
        Policy::new(
            td(),
            std::time::Duration::from_secs(3600),
            std::time::Duration::from_secs(86400),
            &crate::config::PolicyConfig::default(),
        )
        .expect("policy")
        .with_server_names(
            vec!["localhost".into(), "signet.example.org".into()],
            Vec::new(),
        )
    }

    /// What signing refuses, creation refuses, with the reason: the server's own names, and
    /// wildcards covering one; a name beside them is fine.
    #[test]
    fn entries_naming_the_servers_own_dns_names_are_refused() {
        let one = vec!["unix:uid:1".to_owned()];
        let create = |dns: &str| {
            validate_entry(
                &policy(),
                "spiffe://example.org/app",
                "n1",
                &one,
                0,
                &["app.example.org".into(), dns.into()],
            )
        };
        for (dns, named) in [
            (
                "signet.example.org",
                "DNS name signet.example.org is the CA server's own name",
            ),
            ("SIGNET.Example.org", "DNS name signet.example.org"),
            (
                "*.example.org",
                "DNS name signet.example.org (through *.example.org)",
            ),
            (
                "localhost",
                "DNS name localhost is the CA server's own name",
            ),
        ] {
            let err = create(dns).expect_err(dns).to_string();
            assert!(err.contains(named), "{dns}: {err}");
            assert!(
                err.contains("would never get a certificate"),
                "{dns}: {err}"
            );
        }
        for ok in ["web.example.org", "*.svc.example.org", "signet.example.com"] {
            create(ok).expect(ok);
        }
        // A batch: the entry's index and the same reason.
        let dns = ["signet.example.org".to_owned()];
        let ids = ["spiffe://example.org/w0", "spiffe://example.org/w1"];
        let batch: Vec<EntryInput<'_>> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| EntryInput {
                dns_names: if i == 1 { &dns } else { &[] },
                ..input(id, &one)
            })
            .collect();
        let err = validate_batch(&policy(), &batch)
            .expect_err("refused")
            .to_string();
        assert!(
            err.starts_with("entry 1: DNS name signet.example.org is the CA server's own name"),
            "{err}"
        );
        validate_batch(&policy(), &batch[..1]).expect("the other entry alone");
    }

    /// The grammar's accepted and refused lists live with it (`signet_types::selector`,
    /// `selectors_round_trip` and `bad_selectors_are_refused`); here, that entries use it.
    #[test]
    fn selectors_are_validated() {
        assert_eq!(validate_selector("unix:uid:1000"), Ok(Selector::Uid(1000)));
        let e = validate_selector("unix:path:/a\nb").expect_err("refused");
        assert_eq!(
            e.to_string(),
            "selector \"unix:path:/a\\nb\": contains control characters"
        );
        let err = validate_entry(
            &policy(),
            "spiffe://example.org/app",
            "n1",
            &["unix:uid:01000".into()],
            0,
            &[],
        )
        .expect_err("refused")
        .to_string();
        assert!(err.starts_with("selector \"unix:uid:01000\": "), "{err}");
    }

    #[test]
    fn node_ids_and_parents() {
        assert!(validate_node_id("node-1.example_A").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "é", &"x".repeat(129)] {
            assert!(validate_node_id(bad).is_err(), "{bad:?}");
        }
        let id = node_spiffe_id(&td(), "n1").expect("id");
        assert_eq!(id.to_string(), "spiffe://example.org/signet/node/n1");
        assert_eq!(node_id_of(&id, &td()), Some("n1"));
        let other = TrustDomain::new("other.org").expect("td");
        assert_eq!(node_id_of(&id, &other), None);
        let app: SpiffeId = "spiffe://example.org/app".parse().expect("id");
        assert_eq!(node_id_of(&app, &td()), None);
        assert_eq!(parse_parent(&td(), "n1"), Ok(Parent::Node(id.clone())));
        assert_eq!(
            parse_parent(&td(), &id.to_string()),
            Ok(Parent::Node(id.clone()))
        );
        assert_eq!(parse_node(&td(), "n1"), Ok(id.clone()));
        assert_eq!(parse_node(&td(), &id.to_string()), Ok(id));
        assert!(parse_parent(&td(), "spiffe://example.org/app").is_err());
        assert!(parse_parent(&td(), "spiffe://other.org/signet/node/n1").is_err());
        assert!(parse_parent(&td(), "a/b").is_err());
        // Node sets: by name or by SPIFFE ID, never where a node is meant.
        let set: SpiffeId = "spiffe://example.org/signet/nodeset/k8s"
            .parse()
            .expect("id");
        let want = Parent::NodeSet {
            name: NodeSetName::new("k8s").expect("name"),
            id: set.clone(),
        };
        assert_eq!(parse_parent(&td(), "nodeset:k8s"), Ok(want.clone()));
        assert_eq!(parse_parent(&td(), &set.to_string()), Ok(want.clone()));
        assert_eq!(want.spiffe_id(), &set);
        let e = parse_parent(&td(), "nodeset:K8s").expect_err("bad name");
        assert!(e.to_string().contains("node set name"), "{e}");
        assert!(parse_parent(&td(), "spiffe://other.org/signet/nodeset/k8s").is_err());
        let e = parse_parent(&td(), "spiffe://example.org/app").expect_err("not a parent");
        assert!(e.to_string().contains("nor a node set"), "{e}");
        let e = parse_node(&td(), &set.to_string()).expect_err("a set is not a node");
        assert!(!e.to_string().contains("node set"), "{e}");
        assert!(parse_node(&td(), "nodeset:k8s").is_err());
    }

    #[test]
    fn entries_are_validated() {
        let sel = vec!["unix:uid:1000".to_owned(), "unix:uid:1000".to_owned()];
        let e = validate_entry(
            &policy(),
            "spiffe://example.org/app",
            "n1",
            &sel,
            600,
            &["App.example.org".into()],
        )
        .expect("valid");
        assert_eq!(e.selectors, ["unix:uid:1000"]);
        assert_eq!(e.dns_names, ["app.example.org"]);
        assert_eq!(
            e.parent_id.to_string(),
            "spiffe://example.org/signet/node/n1"
        );
        let bad = |id: &str, sel: &[String], ttl: i64, dns: &[String]| {
            validate_entry(&policy(), id, "n1", sel, ttl, dns)
                .expect_err("invalid")
                .to_string()
        };
        let one = vec!["unix:uid:1".to_owned()];
        assert!(bad("spiffe://other.org/app", &one, 0, &[]).contains("trust domain"));
        assert!(bad("spiffe://example.org", &one, 0, &[]).contains("no path"));
        assert!(bad("spiffe://example.org/signet/node/x", &one, 0, &[]).contains("reserved"));
        assert!(bad("spiffe://example.org/signet", &one, 0, &[]).contains("reserved"));
        assert!(bad("not an id", &one, 0, &[]).contains("not a SPIFFE ID"));
        assert!(bad("spiffe://example.org/app", &[], 0, &[]).contains("selector"));
        assert!(bad("spiffe://example.org/app", &one, -1, &[]).contains("ttl"));
        assert!(bad("spiffe://example.org/app", &one, 0, &["bad name!".into()]).contains("DNS"));
        // /signetx is not /signet/.
        assert!(
            validate_entry(
                &policy(),
                "spiffe://example.org/signetx",
                "n1",
                &one,
                0,
                &[]
            )
            .is_ok()
        );
    }

    fn input<'a>(id: &'a str, sel: &'a [String]) -> EntryInput<'a> {
        EntryInput {
            spiffe_id: id,
            parent: "n1",
            selectors: sel,
            ttl_seconds: 0,
            dns_names: &[],
            jwt_ttl_seconds: 0,
            federates_with: &[],
        }
    }

    #[test]
    fn an_entry_jwt_ttl_is_zero_or_one_second_to_a_day() {
        let sel = vec!["unix:uid:1".to_owned()];
        let one = |jwt: i64| {
            validate_batch(
                &policy(),
                &[EntryInput {
                    jwt_ttl_seconds: jwt,
                    ..input("spiffe://example.org/w", &sel)
                }],
            )
        };
        assert_eq!(one(0).unwrap()[0].jwt_ttl_seconds, 0);
        assert_eq!(one(1).unwrap()[0].jwt_ttl_seconds, 1);
        assert_eq!(one(86_400).unwrap()[0].jwt_ttl_seconds, 86_400);
        for bad in [-1, 86_401, i64::MAX] {
            let err = one(bad).unwrap_err().to_string();
            assert!(err.starts_with("entry 0: jwt_ttl"), "{err}");
        }
    }

    #[test]
    fn batches_are_validated_whole() {
        let one = vec!["unix:uid:1".to_owned()];
        let two = vec!["unix:uid:2".to_owned()];
        let ids: Vec<String> = (0..3)
            .map(|i| format!("spiffe://example.org/w{i}"))
            .collect();
        let ok: Vec<EntryInput<'_>> = ids.iter().map(|id| input(id, &one)).collect();
        let v = validate_batch(&policy(), &ok).expect("valid");
        assert_eq!(v.len(), 3);
        assert_eq!(v[2].spiffe_id.to_string(), "spiffe://example.org/w2");

        // One bad entry: the index and CreateEntry's own reason.
        let mut bad = ok.clone();
        bad[1] = input("spiffe://example.org/signet/x", &one);
        let err = validate_batch(&policy(), &bad)
            .expect_err("refused")
            .to_string();
        assert!(err.starts_with("entry 1: "), "{err}");
        assert!(err.contains("reserved"), "{err}");

        // The same registration twice (selectors compared after sorting and dedup).
        let dup_sel = vec!["unix:uid:1".to_owned(), "unix:uid:1".to_owned()];
        let mut dup = ok.clone();
        dup.push(input("spiffe://example.org/w0", &dup_sel));
        let err = validate_batch(&policy(), &dup)
            .expect_err("refused")
            .to_string();
        assert!(err.starts_with("entry 3: duplicates entry 0"), "{err}");
        // Same SPIFFE ID under other selectors is another registration.
        let mut other = ok.clone();
        other.push(input("spiffe://example.org/w0", &two));
        assert!(validate_batch(&policy(), &other).is_ok());

        assert!(
            validate_batch(&policy(), &[])
                .expect_err("empty")
                .to_string()
                .contains("empty")
        );
        let many: Vec<EntryInput<'_>> = (0..=MAX_BATCH_ENTRIES)
            .map(|_| input("spiffe://example.org/w", &one))
            .collect();
        let err = validate_batch(&policy(), &many)
            .expect_err("too many")
            .to_string();
        assert!(err.contains("at most 1000"), "{err}");
    }

    #[test]
    fn join_tokens_hash_and_never_show() {
        let t = JoinToken::generate().expect("token");
        assert!(t.expose().starts_with("sjt_"));
        assert_eq!(format!("{t:?}"), "JoinToken(…)");
        let parsed = JoinToken::parse(t.expose()).expect("parses");
        assert_eq!(parsed.hash(), t.hash());
        assert_eq!(t.hash().len(), 64);
        assert_ne!(t.hash(), t.expose());
        let secret = "sjt_zzzz";
        let err = JoinToken::parse(secret).expect_err("bad").to_string();
        assert!(!err.contains("zzzz"));
        assert!(JoinToken::parse("").is_err());
    }
}
