//! `signet.admin.v1.NodeAdmin`: join tokens, nodes and registration entries, served only on the
//! admin Unix socket (whoever can open it is the operator).
//!
//! An entry is refused (InvalidArgument, naming the name and why) for anything signing would
//! refuse it for, by the signing policy's own rules: a DNS name that is the server's own (or a
//! wildcard covering one), an identity under `/signet/` (`crate::nodes::validate_entry`).
//! Otherwise it would be stored and its workload would silently never get a certificate.
//!
//! An entry that is the same registration as a stored one (SPIFFE ID, parent, set of
//! selectors; the store decides, `store::nodes`) is refused: `CreateEntry` answers
//! AlreadyExists, `BatchCreateEntries` InvalidArgument naming its index (the batch's other
//! refusals are InvalidArgument too); both name the existing entry's id and write nothing.
//!
//! `UpdateEntry` changes an operator's entry in place: the request's set fields replace the
//! stored ones and the result goes through the very validation `CreateEntry` uses
//! ([`NodeAdminApi::validate`]), then the store writes it under one new revision (waking the
//! old and new parents' agents). An entry a registrar keeps is refused (FailedPrecondition):
//! its registrar would overwrite the change at its next sync; the operator changes the object
//! it comes from, or deletes the entry.
//!
//! Node lifecycle: `UnbanNode` lifts a ban; `DeleteNode` forgets a node (refused while entries
//! name it as parent, unless `cascade`), with its unused join tokens; its certificates are then
//! refused everything, as a banned node's are (the node API refuses an unknown node, renewal
//! refuses a workload whose parent is not attested). Join tokens are listed and revoked by id
//! (a prefix of their hash; the token itself is never kept).
//!
//! Node sets (`CreateNodeSet`, `ListNodeSets`, `DeleteNodeSet`): only the operator makes them;
//! immutable (delete and create again); an entry may name one as parent only while it exists
//! (FailedPrecondition otherwise), and one is deleted only while no entry names it (the store
//! orders both under the entry revision counter's lock, `store::node_sets`).

use std::sync::Arc;

use signet_proto::admin::{
    BanNodeRequest, BatchCreateEntriesRequest, BatchCreateEntriesResponse, CreateEntryRequest,
    CreateJoinTokenRequest, CreateJoinTokenResponse, CreateNodeSetRequest, DeleteEntryRequest,
    DeleteEntryResponse, DeleteNodeRequest, DeleteNodeResponse, DeleteNodeSetRequest,
    DeleteNodeSetResponse, EntryRecord, JoinTokenRecord, ListEntriesRequest, ListEntriesResponse,
    ListJoinTokensRequest, ListJoinTokensResponse, ListNodeSetsRequest, ListNodeSetsResponse,
    ListNodesRequest, ListNodesResponse, NodeRecord, NodeSetRecord, RevokeJoinTokenRequest,
    UnbanNodeRequest, UpdateEntryRequest, node_admin_server::NodeAdmin,
};
use signet_types::SpiffeId;
use signet_types::node_set::{MAX_NODE_SET_SELECTORS, NodeSelector, NodeSetName};
use signet_types::untrusted::quoted;
use tonic::{Request, Response, Status};

use super::ApiError;
use crate::authn::AuthenticatedCaller;
use crate::clock::unix;
use crate::issuer::Issuer;
use crate::nodes::{
    EntryInput, JoinToken, ValidEntry, parse_node, parse_parent, validate_batch, validate_entry,
    validate_node_id,
};
use crate::policy::Policy;
use crate::store::node_admin::{MIN_TOKEN_ID_PREFIX, token_id};
use crate::store::{
    BatchCreate, EntryCreate, EntryRow, EntryUpdate, JoinTokenRow, NewEntry, NodeDelete, NodeRow,
    NodeSetDelete, NodeSetRow, NodeStore, TokenRevoke,
};

/// A join token's default and longest lifetime.
const DEFAULT_TOKEN_TTL: i64 = 3600;
const MAX_TOKEN_TTL: i64 = 30 * 24 * 3600;

pub struct NodeAdminApi {
    issuer: Arc<Issuer>,
    store: Arc<dyn NodeStore>,
    /// The issuance policy the issuer signs with (the same value, built once at start-up):
    /// entries are refused at creation for what signing would refuse them for (the server's own
    /// names, reserved identities; see `crate::nodes::validate_entry`).
    policy: Arc<Policy>,
}

impl NodeAdminApi {
    pub fn new(issuer: Arc<Issuer>, store: Arc<dyn NodeStore>, policy: Arc<Policy>) -> Self {
        Self {
            issuer,
            store,
            policy,
        }
    }

    fn now(&self) -> i64 {
        unix(self.issuer.now())
    }

    /// The SPIFFE ID entries name node set `name` by.
    fn set_id(&self, name: &NodeSetName) -> Result<SpiffeId, ApiError> {
        name.spiffe_id(self.issuer.trust_domain())
            .map_err(|e| ApiError::InvalidArgument(format!("node set {name}: {e}")))
    }

    /// An entry as CreateEntry, BatchCreateEntries' items (through `validate_batch`, the same
    /// functions) and UpdateEntry's result are validated: the signing policy's rules, the JWT
    /// TTL, the federated trust domains.
    #[allow(clippy::too_many_arguments)]
    fn validate(
        &self,
        spiffe_id: &str,
        parent: &str,
        selectors: &[String],
        ttl_seconds: i64,
        dns_names: &[String],
        jwt_ttl_seconds: i64,
        federates_with: &[String],
    ) -> Result<ValidEntry, ApiError> {
        validate_entry(
            &self.policy,
            spiffe_id,
            parent,
            selectors,
            ttl_seconds,
            dns_names,
        )
        .and_then(|v| v.with_jwt_ttl(jwt_ttl_seconds))
        .and_then(|v| v.with_federates_with(federates_with, self.issuer.trust_domain()))
        .map_err(ApiError::from)
    }

    /// The bare node ID of a node ID or node SPIFFE ID.
    fn node_id(&self, given: &str) -> Result<String, ApiError> {
        let parent = parse_node(self.issuer.trust_domain(), given).map_err(ApiError::from)?;
        crate::nodes::node_id_of(&parent, self.issuer.trust_domain())
            .map(str::to_owned)
            .ok_or_else(|| ApiError::InvalidArgument("not a node ID".into()))
    }

    fn audit(&self, kind: &str, detail: String) {
        let caller = AuthenticatedCaller::admin_label(self.issuer.trust_domain());
        self.issuer
            .audit()
            .record(kind, &caller, detail, self.now());
    }
}

fn random_hex(bytes: usize) -> Result<String, ApiError> {
    let mut b = vec![0u8; bytes];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .map_err(|_| ApiError::Internal("randomness".into()))?;
    Ok(hex::encode(b))
}

/// A fresh entry id (16 random bytes, hex), for every way an entry is made.
pub(crate) fn new_entry_id() -> Result<String, ApiError> {
    random_hex(16)
}

/// A validated entry, with a fresh id, as the store takes it.
fn new_entry(v: ValidEntry, created_at: i64) -> Result<NewEntry, ApiError> {
    Ok(NewEntry {
        id: new_entry_id()?,
        spiffe_id: v.spiffe_id.to_string(),
        parent_id: v.parent_id.to_string(),
        selectors: v.selectors,
        ttl_seconds: v.ttl_seconds,
        dns_names: v.dns_names,
        created_at,
        jwt_ttl_seconds: v.jwt_ttl_seconds,
        federates_with: v.federates_with,
    })
}

/// Why an entry naming node set `name` as parent was refused: no such set.
fn no_node_set(name: &str) -> String {
    format!(
        "parent nodeset:{name} does not exist; create it first (signetctl nodeset create {name} \
         --node-selector …); nothing was created"
    )
}

/// A node set's selectors as the operator gave them: 1 to 16, each a node selector
/// (`signet_types::node_set::NodeSelector`), sorted and without repeats.
fn node_set_selectors(given: &[String]) -> Result<Vec<String>, ApiError> {
    if given.is_empty() {
        return Err(ApiError::InvalidArgument(
            "a node set needs at least one node selector (--node-selector), e.g. \
             k8s_psat:cluster:prod"
                .into(),
        ));
    }
    if given.len() > MAX_NODE_SET_SELECTORS {
        return Err(ApiError::InvalidArgument(format!(
            "{} node selectors; a node set takes at most {MAX_NODE_SET_SELECTORS}",
            given.len()
        )));
    }
    let mut out = given
        .iter()
        .map(|s| {
            NodeSelector::parse(s)
                .map(|sel| sel.as_str().to_owned())
                .map_err(|e| ApiError::InvalidArgument(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// A node set as the admin API shows it: its members now (banned nodes left out) and how many
/// entries name it.
fn node_set_record(s: NodeSetRow, id: &SpiffeId, nodes: &[NodeRow], entries: u64) -> NodeSetRecord {
    let members = nodes
        .iter()
        .filter(|n| crate::node_sets::is_member_now(n, &s))
        .map(|n| n.node_id.clone())
        .collect();
    NodeSetRecord {
        name: s.name,
        spiffe_id: id.to_string(),
        node_selectors: s.selectors,
        created_at: s.created_at,
        members,
        entries: u32::try_from(entries).unwrap_or(u32::MAX),
    }
}

fn node_to_proto(n: NodeRow) -> NodeRecord {
    NodeRecord {
        node_id: n.node_id,
        spiffe_id: n.spiffe_id,
        attested_at: n.attested_at,
        banned: n.banned_at.is_some(),
        serial: n.last_serial,
        not_after: n.not_after,
        attestation: n.attestation,
        selectors: n.selectors,
    }
}

fn entry_to_record(e: EntryRow) -> EntryRecord {
    EntryRecord {
        id: e.id,
        spiffe_id: e.spiffe_id,
        parent_id: e.parent_id,
        selectors: e.selectors,
        ttl_seconds: e.ttl_seconds,
        dns_names: e.dns_names,
        revision: e.revision,
        created_at: e.created_at,
        jwt_ttl_seconds: e.jwt_ttl_seconds,
        federates_with: e.federates_with,
        owner: e.owner,
        owner_scope: e.owner_scope,
    }
}

fn token_to_record(t: &JoinTokenRow) -> JoinTokenRecord {
    JoinTokenRecord {
        id: token_id(&t.token_hash).to_owned(),
        node_id: t.node_id.clone(),
        created_at: t.created_at,
        expires_at: t.expires_at,
        used_at: t.used_at.unwrap_or(0),
    }
}

/// A join token id as the operator gave it: lowercase hex, from [`MIN_TOKEN_ID_PREFIX`] to 64
/// characters (a prefix of the token's SHA-256).
fn token_id_prefix(given: &str) -> Result<String, ApiError> {
    let id = given.trim().to_ascii_lowercase();
    if !(MIN_TOKEN_ID_PREFIX..=64).contains(&id.len()) || !id.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(ApiError::InvalidArgument(format!(
            "join token id {} is not {MIN_TOKEN_ID_PREFIX} to 64 hex characters; \
             `signetctl token list` shows the ids",
            quoted(given)
        )));
    }
    Ok(id)
}

/// An UpdateEntry request's fields over the stored entry: each set field replaces the stored
/// one. The result is validated as a new entry would be.
struct MergedEntry {
    spiffe_id: String,
    parent: String,
    selectors: Vec<String>,
    ttl_seconds: i64,
    dns_names: Vec<String>,
    jwt_ttl_seconds: i64,
    federates_with: Vec<String>,
}

fn merge_update(req: UpdateEntryRequest, cur: &EntryRow) -> MergedEntry {
    MergedEntry {
        spiffe_id: req.spiffe_id.unwrap_or_else(|| cur.spiffe_id.clone()),
        parent: req.parent.unwrap_or_else(|| cur.parent_id.clone()),
        selectors: req
            .selectors
            .map_or_else(|| cur.selectors.clone(), |l| l.values),
        ttl_seconds: req.ttl_seconds.unwrap_or(cur.ttl_seconds),
        dns_names: req
            .dns_names
            .map_or_else(|| cur.dns_names.clone(), |l| l.values),
        jwt_ttl_seconds: req.jwt_ttl_seconds.unwrap_or(cur.jwt_ttl_seconds),
        federates_with: req
            .federates_with
            .map_or_else(|| cur.federates_with.clone(), |l| l.values),
    }
}

/// What an update changed, field by field, for the audit event ("no field changed" when the
/// update rewrote the entry as it was).
fn entry_changes(old: &EntryRow, new: &EntryRow) -> String {
    let mut out = Vec::new();
    let mut field = |name: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{name} {a} -> {b}"));
        }
    };
    field("spiffe_id", old.spiffe_id.clone(), new.spiffe_id.clone());
    field("parent", old.parent_id.clone(), new.parent_id.clone());
    field(
        "selectors",
        old.selectors.join(","),
        new.selectors.join(","),
    );
    field(
        "ttl_seconds",
        old.ttl_seconds.to_string(),
        new.ttl_seconds.to_string(),
    );
    field(
        "dns_names",
        old.dns_names.join(","),
        new.dns_names.join(","),
    );
    field(
        "jwt_ttl_seconds",
        old.jwt_ttl_seconds.to_string(),
        new.jwt_ttl_seconds.to_string(),
    );
    field(
        "federates_with",
        old.federates_with.join(","),
        new.federates_with.join(","),
    );
    if out.is_empty() {
        "no field changed".to_owned()
    } else {
        out.join("; ")
    }
}

/// Why an entry a registrar keeps is not changed from the admin API.
fn owned_refusal(id: &str, owner: &str, scope: &str) -> ApiError {
    ApiError::FailedPrecondition(format!(
        "entry {id} is kept by registrar {owner} (scope {scope}), which would overwrite an \
         operator's change at its next sync; change the object it comes from, or delete the \
         entry (signetctl entry delete {id}); nothing was changed"
    ))
}

/// A node ID an operator may give a join token: a valid one, not `k8s-…`. Node IDs of
/// Kubernetes-attested nodes are `k8s-<node name>`: a join token for one would let another
/// machine take over that node's name (review finding F2 of issue 29; attestation also keeps
/// a node ID to its first method).
fn check_join_token_node_id(id: &str) -> Result<(), ApiError> {
    validate_node_id(id).map_err(ApiError::from)?;
    if id.starts_with(crate::authn::psat::NODE_ID_PREFIX) {
        return Err(ApiError::InvalidArgument(format!(
            "node ID {} starts with {}, which is kept for nodes attested by a Kubernetes \
             service-account token; choose another node ID",
            quoted(id),
            crate::authn::psat::NODE_ID_PREFIX
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl NodeAdmin for NodeAdminApi {
    async fn create_join_token(
        &self,
        request: Request<CreateJoinTokenRequest>,
    ) -> Result<Response<CreateJoinTokenResponse>, Status> {
        let req = request.into_inner();
        let ttl = match req.ttl_seconds {
            0 => DEFAULT_TOKEN_TTL,
            t if (1..=MAX_TOKEN_TTL).contains(&t) => t,
            t => {
                return Err(ApiError::InvalidArgument(format!(
                    "token ttl {t} s is out of range (1 s to 30 days; 0 for one hour)"
                ))
                .into());
            }
        };
        let node_id = if req.node_id.is_empty() {
            format!("node-{}", random_hex(8)?)
        } else {
            check_join_token_node_id(&req.node_id)?;
            req.node_id
        };
        let token = JoinToken::generate().map_err(|e| ApiError::Internal(e.to_string()))?;
        let now = self.now();
        let expires_at = now.saturating_add(ttl);
        self.store
            .create_join_token(&token.hash(), &node_id, now, expires_at)
            .await?;
        self.audit(
            "admin.join_token",
            format!("join token created for node {node_id}, expires at {expires_at}"),
        );
        Ok(Response::new(CreateJoinTokenResponse {
            token: token.expose().to_owned(),
            node_id,
            expires_at,
        }))
    }

    async fn list_nodes(
        &self,
        _request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        let nodes = self.store.list_nodes().await.map_err(ApiError::from)?;
        Ok(Response::new(ListNodesResponse {
            nodes: nodes.into_iter().map(node_to_proto).collect(),
        }))
    }

    async fn ban_node(
        &self,
        request: Request<BanNodeRequest>,
    ) -> Result<Response<NodeRecord>, Status> {
        let req = request.into_inner();
        // Accept a node SPIFFE ID as well as a bare node ID.
        let parent =
            parse_node(self.issuer.trust_domain(), &req.node_id).map_err(ApiError::from)?;
        let node_id = crate::nodes::node_id_of(&parent, self.issuer.trust_domain())
            .ok_or_else(|| ApiError::InvalidArgument("not a node ID".into()))?;
        let node = self
            .store
            .ban_node(node_id, self.now())
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("no attested node {node_id}")))?;
        self.audit(
            "admin.node_ban",
            format!(
                "node {node_id} banned; its certificate serial {} stays valid until {} but \
                 the CA refuses it everything",
                node.last_serial, node.not_after
            ),
        );
        Ok(Response::new(node_to_proto(node)))
    }

    async fn unban_node(
        &self,
        request: Request<UnbanNodeRequest>,
    ) -> Result<Response<NodeRecord>, Status> {
        let node_id = self.node_id(&request.into_inner().node_id)?;
        let was_banned = self
            .store
            .node(&node_id)
            .await?
            .is_some_and(|n| n.banned_at.is_some());
        let node = self.store.unban_node(&node_id).await?.ok_or_else(|| {
            ApiError::NotFound(format!(
                "no attested node {node_id} (signetctl node list shows them)"
            ))
        })?;
        self.audit(
            "admin.node_unban",
            if was_banned {
                format!(
                    "node {node_id} unbanned; its certificate serial {} (valid until {}) may \
                     renew, sync and sign again",
                    node.last_serial, node.not_after
                )
            } else {
                format!("node {node_id} unban asked; it was not banned (unchanged)")
            },
        );
        Ok(Response::new(node_to_proto(node)))
    }

    async fn delete_node(
        &self,
        request: Request<DeleteNodeRequest>,
    ) -> Result<Response<DeleteNodeResponse>, Status> {
        let req = request.into_inner();
        let node_id = self.node_id(&req.node_id)?;
        let (node, entries, tokens) = match self.store.delete_node(&node_id, req.cascade).await? {
            NodeDelete::Deleted {
                node,
                entries,
                tokens,
            } => (node, entries, tokens),
            NodeDelete::NotFound => {
                return Err(ApiError::NotFound(format!(
                    "no attested node {node_id} (signetctl node list shows them)"
                ))
                .into());
            }
            NodeDelete::HasEntries { entries } => {
                return Err(ApiError::FailedPrecondition(format!(
                    "node {node_id} is the parent of {entries} entr{}; delete {} first \
                     (signetctl entry list --parent {node_id} shows them) or delete the node \
                     with them (signetctl node delete {node_id} --cascade); nothing was deleted",
                    if entries == 1 { "y" } else { "ies" },
                    if entries == 1 { "it" } else { "them" }
                ))
                .into());
            }
        };
        self.audit(
            "admin.node_delete",
            format!(
                "node {node_id} ({}) deleted{}, with {entries} entr{} and {tokens} unused join \
                 token(s); its certificate serial {} (valid until {}) is refused everything \
                 until the node attests again with a new token",
                node.spiffe_id,
                if node.banned_at.is_some() {
                    " (it was banned)"
                } else {
                    ""
                },
                if entries == 1 { "y" } else { "ies" },
                node.last_serial,
                node.not_after
            ),
        );
        Ok(Response::new(DeleteNodeResponse {
            entries_deleted: u32::try_from(entries).unwrap_or(u32::MAX),
            tokens_deleted: u32::try_from(tokens).unwrap_or(u32::MAX),
        }))
    }

    async fn list_join_tokens(
        &self,
        request: Request<ListJoinTokensRequest>,
    ) -> Result<Response<ListJoinTokensResponse>, Status> {
        let req = request.into_inner();
        let node_id = if req.node_id.is_empty() {
            None
        } else {
            Some(self.node_id(&req.node_id)?)
        };
        let rows = self.store.join_tokens(node_id.as_deref()).await?;
        Ok(Response::new(ListJoinTokensResponse {
            tokens: rows.iter().map(token_to_record).collect(),
        }))
    }

    async fn revoke_join_token(
        &self,
        request: Request<RevokeJoinTokenRequest>,
    ) -> Result<Response<JoinTokenRecord>, Status> {
        let id = token_id_prefix(&request.into_inner().id)?;
        let row = match self.store.revoke_join_token(&id).await? {
            TokenRevoke::Revoked(row) => row,
            TokenRevoke::NotFound => {
                return Err(ApiError::NotFound(format!(
                    "no join token {id} (signetctl token list shows them)"
                ))
                .into());
            }
            TokenRevoke::Ambiguous { matches } => {
                return Err(ApiError::InvalidArgument(format!(
                    "{matches} join tokens start with {id}; give more of the id"
                ))
                .into());
            }
            TokenRevoke::Used(row) => {
                return Err(ApiError::FailedPrecondition(format!(
                    "join token {} was already used: it attested node {}; ban or delete the node \
                     instead (signetctl node ban|delete {})",
                    token_id(&row.token_hash),
                    row.node_id,
                    row.node_id
                ))
                .into());
            }
        };
        self.audit(
            "admin.join_token_revoke",
            format!(
                "unused join token {} for node {} (expiring at {}) revoked",
                token_id(&row.token_hash),
                row.node_id,
                row.expires_at
            ),
        );
        Ok(Response::new(token_to_record(&row)))
    }

    async fn update_entry(
        &self,
        request: Request<UpdateEntryRequest>,
    ) -> Result<Response<EntryRecord>, Status> {
        let req = request.into_inner();
        if req.id.is_empty() {
            return Err(ApiError::InvalidArgument("id is required".into()).into());
        }
        let id = req.id.clone();
        let shown = || quoted(&id);
        let cur = self.store.entry(&id).await?.ok_or_else(|| {
            ApiError::NotFound(format!(
                "no entry {} (signetctl entry list shows them)",
                shown()
            ))
        })?;
        if !cur.owner.is_empty() {
            return Err(owned_refusal(&cur.id, &cur.owner, &cur.owner_scope).into());
        }
        if req.expected_revision != 0 && req.expected_revision != cur.revision {
            return Err(ApiError::Aborted(format!(
                "entry {id} is at revision {}, not {}: it changed since it was read; read it \
                 again (signetctl entry list) and retry; nothing was changed",
                cur.revision, req.expected_revision
            ))
            .into());
        }
        let m = merge_update(req, &cur);
        let v = self.validate(
            &m.spiffe_id,
            &m.parent,
            &m.selectors,
            m.ttl_seconds,
            &m.dns_names,
            m.jwt_ttl_seconds,
            &m.federates_with,
        )?;
        let mut entry = new_entry(v, cur.created_at)?;
        entry.id = cur.id.clone();
        let row = match self.store.update_entry(&entry, cur.revision).await? {
            EntryUpdate::Updated(row) => row,
            EntryUpdate::NotFound => {
                return Err(ApiError::NotFound(format!(
                    "entry {id} was deleted meanwhile; nothing was changed"
                ))
                .into());
            }
            EntryUpdate::Owned { owner, owner_scope } => {
                return Err(owned_refusal(&id, &owner, &owner_scope).into());
            }
            EntryUpdate::Changed { revision } => {
                return Err(ApiError::Aborted(format!(
                    "entry {id} changed meanwhile (now at revision {revision}); read it again \
                     and retry; nothing was changed"
                ))
                .into());
            }
            EntryUpdate::Duplicate { existing_id } => {
                return Err(ApiError::AlreadyExists(format!(
                    "{} under {} with these selectors is already registered (entry \
                     {existing_id}); nothing was changed",
                    entry.spiffe_id, entry.parent_id
                ))
                .into());
            }
            EntryUpdate::NoRelationship { trust_domain } => {
                return Err(ApiError::FailedPrecondition(format!(
                    "federates_with names {trust_domain}, which has no federation relationship \
                     (signetctl federation create --trust-domain {trust_domain} …); nothing was \
                     changed"
                ))
                .into());
            }
            EntryUpdate::NoNodeSet { name } => {
                return Err(ApiError::FailedPrecondition(format!(
                    "parent nodeset:{name} does not exist; create it first (signetctl nodeset \
                     create {name} --node-selector …); nothing was changed"
                ))
                .into());
            }
        };
        self.audit(
            "admin.entry_update",
            format!(
                "entry {} updated (revision {} -> {}): {}",
                row.id,
                cur.revision,
                row.revision,
                entry_changes(&cur, &row)
            ),
        );
        Ok(Response::new(entry_to_record(row)))
    }

    async fn create_entry(
        &self,
        request: Request<CreateEntryRequest>,
    ) -> Result<Response<EntryRecord>, Status> {
        let req = request.into_inner();
        let v = self.validate(
            &req.spiffe_id,
            &req.parent,
            &req.selectors,
            req.ttl_seconds,
            &req.dns_names,
            req.jwt_ttl_seconds,
            &req.federates_with,
        )?;
        let entry = new_entry(v, self.now())?;
        // The same duplicate rule as the batch (`store::nodes::registration_selectors`), but
        // AlreadyExists: one entry has nothing else wrong with it.
        let row = match self.store.create_entry(&entry).await? {
            EntryCreate::Created(row) => row,
            EntryCreate::Duplicate { existing_id } => {
                return Err(ApiError::AlreadyExists(format!(
                    "{} under {} with these selectors is already registered (entry \
                     {existing_id}); nothing was created",
                    entry.spiffe_id, entry.parent_id
                ))
                .into());
            }
            EntryCreate::NoRelationship { trust_domain } => {
                return Err(ApiError::FailedPrecondition(format!(
                    "federates_with names {trust_domain}, which has no federation relationship \
                     (signetctl federation create --trust-domain {trust_domain} …); nothing was \
                     created"
                ))
                .into());
            }
            EntryCreate::NoNodeSet { name } => {
                return Err(ApiError::FailedPrecondition(no_node_set(&name)).into());
            }
        };
        self.audit(
            "admin.entry_create",
            format!(
                "entry {} for {} under {} (revision {}){}",
                row.id,
                row.spiffe_id,
                row.parent_id,
                row.revision,
                if row.federates_with.is_empty() {
                    String::new()
                } else {
                    format!(", federates with {}", row.federates_with.join(", "))
                }
            ),
        );
        Ok(Response::new(entry_to_record(row)))
    }

    async fn batch_create_entries(
        &self,
        request: Request<BatchCreateEntriesRequest>,
    ) -> Result<Response<BatchCreateEntriesResponse>, Status> {
        let req = request.into_inner();
        let inputs: Vec<EntryInput<'_>> = req
            .entries
            .iter()
            .map(|e| EntryInput {
                spiffe_id: &e.spiffe_id,
                parent: &e.parent,
                selectors: &e.selectors,
                ttl_seconds: e.ttl_seconds,
                dns_names: &e.dns_names,
                jwt_ttl_seconds: e.jwt_ttl_seconds,
                federates_with: &e.federates_with,
            })
            .collect();
        let valid = validate_batch(&self.policy, &inputs).map_err(ApiError::from)?;
        let now = self.now();
        let batch = valid
            .into_iter()
            .map(|v| new_entry(v, now))
            .collect::<Result<Vec<_>, _>>()?;
        let (revision, rows) = match self.store.create_entries(&batch).await? {
            BatchCreate::Created { revision, entries } => (revision, entries),
            BatchCreate::Duplicate { index, existing_id } => {
                return Err(ApiError::InvalidArgument(format!(
                    "entry {index}: {} under {} with these selectors is already registered \
                     (entry {existing_id}); nothing was created",
                    batch[index].spiffe_id, batch[index].parent_id
                ))
                .into());
            }
            BatchCreate::NoRelationship {
                index,
                trust_domain,
            } => {
                return Err(ApiError::FailedPrecondition(format!(
                    "entry {index}: federates_with names {trust_domain}, which has no federation \
                     relationship (signetctl federation create --trust-domain {trust_domain} …); \
                     nothing was created"
                ))
                .into());
            }
            BatchCreate::NoNodeSet { index, name } => {
                return Err(ApiError::FailedPrecondition(format!(
                    "entry {index}: {}",
                    no_node_set(&name)
                ))
                .into());
            }
        };
        let mut parents: Vec<&str> = rows.iter().map(|r| r.parent_id.as_str()).collect();
        parents.sort_unstable();
        parents.dedup();
        // One event for the batch: the revision names its entries exactly (the batch alone
        // took it), so the event stays small and one flood of entries cannot fill the lane.
        self.audit(
            "admin.entry_batch_create",
            format!(
                "{} entries created in one batch at revision {revision} (every entry of the \
                 batch carries it) under {} parent(s): {}{}",
                rows.len(),
                parents.len(),
                parents
                    .iter()
                    .take(8)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
                if parents.len() > 8 { ", …" } else { "" }
            ),
        );
        Ok(Response::new(BatchCreateEntriesResponse {
            entries: rows.into_iter().map(entry_to_record).collect(),
            revision,
        }))
    }

    async fn list_entries(
        &self,
        request: Request<ListEntriesRequest>,
    ) -> Result<Response<ListEntriesResponse>, Status> {
        let req = request.into_inner();
        let parent = if req.parent.is_empty() {
            None
        } else {
            Some(
                parse_parent(self.issuer.trust_domain(), &req.parent)
                    .map_err(ApiError::from)?
                    .spiffe_id()
                    .to_string(),
            )
        };
        let rows = self.store.list_entries(parent.as_deref()).await?;
        Ok(Response::new(ListEntriesResponse {
            entries: rows.into_iter().map(entry_to_record).collect(),
        }))
    }

    async fn create_node_set(
        &self,
        request: Request<CreateNodeSetRequest>,
    ) -> Result<Response<NodeSetRecord>, Status> {
        let req = request.into_inner();
        let name =
            NodeSetName::new(&req.name).map_err(|e| ApiError::InvalidArgument(e.to_string()))?;
        let selectors = node_set_selectors(&req.node_selectors)?;
        let id = self.set_id(&name)?;
        let row = NodeSetRow {
            name: name.as_str().to_owned(),
            selectors,
            created_at: self.now(),
        };
        if !self.store.create_node_set(&row).await? {
            return Err(ApiError::AlreadyExists(format!(
                "node set {name} already exists; node sets are immutable: delete it \
                 (signetctl nodeset delete {name}) and create it again to change it"
            ))
            .into());
        }
        self.audit(
            "admin.nodeset_create",
            format!(
                "node set {name} ({id}) created, selecting nodes that proved {}",
                row.selectors.join(", ")
            ),
        );
        let nodes = self.store.list_nodes().await?;
        Ok(Response::new(node_set_record(row, &id, &nodes, 0)))
    }

    async fn list_node_sets(
        &self,
        _request: Request<ListNodeSetsRequest>,
    ) -> Result<Response<ListNodeSetsResponse>, Status> {
        let sets = self.store.list_node_sets().await?;
        let nodes = self.store.list_nodes().await?;
        let ids = sets
            .iter()
            .map(|s| {
                NodeSetName::new(&s.name)
                    .map_err(|e| ApiError::Internal(format!("stored node set: {e}")))
                    .and_then(|n| self.set_id(&n))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let parents: Vec<String> = ids.iter().map(ToString::to_string).collect();
        let refs: Vec<&str> = parents.iter().map(String::as_str).collect();
        let counts = self.store.entry_counts(&refs).await?;
        let node_sets = sets
            .into_iter()
            .zip(&ids)
            .map(|(s, id)| {
                let n = counts.get(&id.to_string()).copied().unwrap_or(0);
                node_set_record(s, id, &nodes, n)
            })
            .collect();
        Ok(Response::new(ListNodeSetsResponse { node_sets }))
    }

    async fn delete_node_set(
        &self,
        request: Request<DeleteNodeSetRequest>,
    ) -> Result<Response<DeleteNodeSetResponse>, Status> {
        let req = request.into_inner();
        let name =
            NodeSetName::new(&req.name).map_err(|e| ApiError::InvalidArgument(e.to_string()))?;
        let id = self.set_id(&name)?;
        match self
            .store
            .delete_node_set(name.as_str(), &id.to_string())
            .await?
        {
            NodeSetDelete::Deleted => {}
            NodeSetDelete::NotFound => {
                return Err(ApiError::NotFound(format!(
                    "no node set {name} (signetctl nodeset list shows them)"
                ))
                .into());
            }
            NodeSetDelete::InUse { entries } => {
                return Err(ApiError::FailedPrecondition(format!(
                    "node set {name} is the parent of {entries} entr{}; delete {} first \
                     (signetctl entry list --parent nodeset:{name} shows them); nothing was \
                     deleted",
                    if entries == 1 { "y" } else { "ies" },
                    if entries == 1 { "it" } else { "them" }
                ))
                .into());
            }
        }
        self.audit(
            "admin.nodeset_delete",
            format!("node set {name} ({id}) deleted"),
        );
        Ok(Response::new(DeleteNodeSetResponse {}))
    }

    async fn delete_entry(
        &self,
        request: Request<DeleteEntryRequest>,
    ) -> Result<Response<DeleteEntryResponse>, Status> {
        let req = request.into_inner();
        if req.id.is_empty() {
            return Err(ApiError::InvalidArgument("id is required".into()).into());
        }
        // The operator is above any registrar: an owned entry may be deleted too, and the
        // audit event names its owner (who will re-create it at its next sync unless the
        // object it came from is changed).
        let owned = self
            .store
            .entry(&req.id)
            .await?
            .filter(|e| !e.owner.is_empty());
        if !self.store.delete_entry(&req.id).await? {
            return Err(ApiError::NotFound(format!(
                "no entry {:?}",
                req.id.chars().take(128).collect::<String>()
            ))
            .into());
        }
        let detail = match owned {
            Some(e) => format!(
                "entry {} deleted (owned by registrar {}, scope {}; it re-creates the entry at \
                 its next sync unless its object changes)",
                req.id, e.owner, e.owner_scope
            ),
            None => format!("entry {} deleted", req.id),
        };
        self.audit("admin.entry_delete", detail);
        Ok(Response::new(DeleteEntryResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_id_is_8_to_64_hex_characters_lowercased() {
        assert_eq!(token_id_prefix(" ABCDEF01 ").unwrap(), "abcdef01");
        for bad in ["abc", "abcdefg1", "", &"a".repeat(65), "abcd%ef01"] {
            let e = token_id_prefix(bad).expect_err(bad);
            assert!(
                matches!(&e, ApiError::InvalidArgument(m) if m.contains("token list")),
                "{e:?}"
            );
        }
    }

    fn stored() -> EntryRow {
        EntryRow {
            id: "e1".into(),
            spiffe_id: "spiffe://example.org/app".into(),
            parent_id: "spiffe://example.org/signet/node/n1".into(),
            selectors: strings(&["unix:uid:1000"]),
            ttl_seconds: 600,
            dns_names: strings(&["app.example.org"]),
            revision: 7,
            created_at: 1,
            jwt_ttl_seconds: 0,
            federates_with: strings(&["partner.example"]),
            owner: String::new(),
            owner_scope: String::new(),
        }
    }

    #[test]
    fn an_update_replaces_only_the_fields_it_sets() {
        use signet_proto::admin::StringList;
        let cur = stored();
        // Nothing set: the stored entry as it is.
        let m = merge_update(
            UpdateEntryRequest {
                id: "e1".into(),
                ..UpdateEntryRequest::default()
            },
            &cur,
        );
        assert_eq!(
            (
                m.spiffe_id.as_str(),
                m.parent.as_str(),
                &m.selectors,
                m.ttl_seconds,
                &m.dns_names,
                &m.federates_with
            ),
            (
                cur.spiffe_id.as_str(),
                cur.parent_id.as_str(),
                &cur.selectors,
                600,
                &cur.dns_names,
                &cur.federates_with
            )
        );
        // Set fields replace, an empty list clears, a zero TTL is the server default.
        let m = merge_update(
            UpdateEntryRequest {
                id: "e1".into(),
                selectors: Some(StringList {
                    values: strings(&["unix:uid:2000", "unix:gid:5"]),
                }),
                ttl_seconds: Some(0),
                dns_names: Some(StringList::default()),
                jwt_ttl_seconds: Some(60),
                ..UpdateEntryRequest::default()
            },
            &cur,
        );
        assert_eq!(m.selectors, ["unix:uid:2000", "unix:gid:5"]);
        assert_eq!((m.ttl_seconds, m.jwt_ttl_seconds), (0, 60));
        assert!(m.dns_names.is_empty());
        assert_eq!(m.federates_with, ["partner.example"]);
    }

    #[test]
    fn an_updates_audit_detail_names_each_changed_field() {
        let old = stored();
        let mut new = stored();
        assert_eq!(entry_changes(&old, &new), "no field changed");
        new.ttl_seconds = 60;
        new.dns_names.clear();
        assert_eq!(
            entry_changes(&old, &new),
            "ttl_seconds 600 -> 60; dns_names app.example.org -> "
        );
    }

    #[test]
    fn join_tokens_never_name_a_kubernetes_nodes_id() {
        assert!(check_join_token_node_id("vm-7").is_ok());
        let err = check_join_token_node_id("k8s-worker-1").expect_err("refused");
        assert!(
            err.to_string()
                .contains("kept for nodes attested by a Kubernetes"),
            "{err}"
        );
        assert!(check_join_token_node_id("..").is_err());
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_node_sets_selectors_are_one_to_sixteen_node_selectors_sorted_once() {
        assert_eq!(
            node_set_selectors(&strings(&[
                "k8s_psat:cluster:prod",
                "k8s_psat:agent_ns:signet-system",
                "k8s_psat:cluster:prod",
            ]))
            .expect("valid"),
            ["k8s_psat:agent_ns:signet-system", "k8s_psat:cluster:prod"]
        );
        for (given, want) in [
            (Vec::new(), "at least one node selector"),
            (
                (0..17)
                    .map(|i| format!("join_token:node_id:n{i}"))
                    .collect(),
                "at most 16",
            ),
            (strings(&["unix:uid:0"]), "is not one of"),
        ] {
            let e = node_set_selectors(&given).expect_err("refused");
            assert!(
                matches!(&e, ApiError::InvalidArgument(m) if m.contains(want)),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_node_set_record_lists_its_members_now() {
        let node = |id: &str, sel: &[&str], banned: bool| NodeRow {
            node_id: id.into(),
            spiffe_id: format!("spiffe://example.org/signet/node/{id}"),
            attested_at: 0,
            banned_at: banned.then_some(1),
            last_serial: "01".into(),
            not_after: 1,
            attestation: "k8s_psat".into(),
            selectors: strings(sel),
        };
        let nodes = [
            node("a", &["k8s_psat:cluster:prod"], false),
            node("b", &["k8s_psat:cluster:dev"], false),
            node("c", &["k8s_psat:cluster:prod"], true),
            node(
                "d",
                &["k8s_psat:cluster:prod", "k8s_psat:node_name:d"],
                false,
            ),
        ];
        let set = NodeSetRow {
            name: "prod".into(),
            selectors: strings(&["k8s_psat:cluster:prod"]),
            created_at: 5,
        };
        let id: SpiffeId = "spiffe://example.org/signet/nodeset/prod"
            .parse()
            .expect("id");
        let r = node_set_record(set, &id, &nodes, 3);
        assert_eq!(r.members, ["a", "d"]);
        assert_eq!((r.entries, r.created_at), (3, 5));
        assert_eq!(r.spiffe_id, id.to_string());
    }
}
