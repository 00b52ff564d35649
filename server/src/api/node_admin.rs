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
//! Node sets (`CreateNodeSet`, `ListNodeSets`, `DeleteNodeSet`): only the operator makes them;
//! immutable (delete and create again); an entry may name one as parent only while it exists
//! (FailedPrecondition otherwise), and one is deleted only while no entry names it (the store
//! orders both under the entry revision counter's lock, `store::node_sets`).

use std::sync::Arc;

use signet_proto::admin::{
    BanNodeRequest, BatchCreateEntriesRequest, BatchCreateEntriesResponse, CreateEntryRequest,
    CreateJoinTokenRequest, CreateJoinTokenResponse, CreateNodeSetRequest, DeleteEntryRequest,
    DeleteEntryResponse, DeleteNodeSetRequest, DeleteNodeSetResponse, EntryRecord,
    ListEntriesRequest, ListEntriesResponse, ListNodeSetsRequest, ListNodeSetsResponse,
    ListNodesRequest, ListNodesResponse, NodeRecord, NodeSetRecord, node_admin_server::NodeAdmin,
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
use crate::store::{
    BatchCreate, EntryCreate, EntryRow, NewEntry, NodeRow, NodeSetDelete, NodeSetRow, NodeStore,
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

    async fn create_entry(
        &self,
        request: Request<CreateEntryRequest>,
    ) -> Result<Response<EntryRecord>, Status> {
        let req = request.into_inner();
        let v = validate_entry(
            &self.policy,
            &req.spiffe_id,
            &req.parent,
            &req.selectors,
            req.ttl_seconds,
            &req.dns_names,
        )
        .and_then(|v| v.with_jwt_ttl(req.jwt_ttl_seconds))
        .and_then(|v| v.with_federates_with(&req.federates_with, self.issuer.trust_domain()))
        .map_err(ApiError::from)?;
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
