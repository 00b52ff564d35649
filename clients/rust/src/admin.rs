//! The typed clients of the operator API on the server's admin Unix socket:
//! [`AdminClient`] (`signet.admin.v1.Admin`) reads the trust bundle as the server wrote it,
//! lists audit events and mints an X509-SVID for any identity of the trust domain;
//! [`NodeAdminClient`] (`signet.admin.v1.NodeAdmin`) creates join tokens, lists and bans
//! nodes, creates, lists and deletes registration entries; [`CaAdminClient`]
//! (`signet.admin.v1.CaAdmin`, in `ca_keys`) reports and rotates the CA key slots;
//! [`LedgerAdminClient`] (`signet.admin.v1.LedgerAdmin`, in `checkpoint`) creates, lists and
//! reads ledger checkpoints and their public key; [`RevocationAdminClient`]
//! (`signet.admin.v1.RevocationAdmin`, in `revocation`) revokes certificates and reads the
//! CRLs. [`AdminClient`] also pages through the ledger's certificate rows and finds one by
//! serial (in `certificates`). All answer in domain types, which `signetctl` formats; the
//! ledger head, rows and events `signetctl ledger verify` streams still use the generated
//! clients ([`crate::proto::admin`]) until they get typed calls here, but its rows convert
//! through the same [`ledger_record`].
//!
//! The invariant is [`crate::ca`]'s: nothing the server sends reaches the caller unchecked. A
//! bundle names a valid trust domain and each root is a whole X.509 certificate; a minted
//! certificate is an X509-SVID. A malformed answer is a [`CallError::InvalidAnswer`].

use std::path::Path;
use std::time::Duration;

use signet_proto::admin as pb;
use signet_proto::admin::admin_client::AdminClient as PbAdminClient;
use signet_proto::admin::node_admin_client::NodeAdminClient as PbNodeAdminClient;
use signet_types::TrustDomain;
use tonic::transport::Channel;

use crate::ClientError;
use crate::ca::{Issued, split_root};
use crate::convert::request;
use crate::error::CallError;

mod ca_keys;
mod certificates;
mod checkpoint;
mod federation;
mod revocation;
pub use ca_keys::{CaAction, CaAdminClient, CaKeyKind, CaKeySlot, CaStatus};
pub use certificates::{
    CertificatePage, CertificateQuery, HashField, JwtSvidPage, RecordError, jwt_svid_record,
    ledger_record,
};
pub use checkpoint::{CheckpointKey, LedgerAdminClient, LedgerCheckpoint};
pub use federation::{
    FederationAdminClient, FederationProfile, FederationRelationship, NewRelationship,
    UnknownProfile,
};
pub use revocation::{
    PublishedCrl, RevocationAdminClient, RevokeReport, RevokeSelector, RevokedCertificate,
};
pub use signet_types::ledger::{JwtSvidRecord, LedgerRecord, Revocation};

/// The trust bundle as the server holds it, with where it wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBundle {
    pub trust_domain: TrustDomain,
    /// DER roots, each a whole X.509 certificate (possibly none for a server still starting).
    pub roots_der: Vec<Vec<u8>>,
    pub revision: u64,
    /// The file the server wrote the bundle to.
    pub path: String,
}

impl ServerBundle {
    /// The roots as PEM, LF line endings.
    pub fn roots_pem(&self) -> String {
        signet_types::pem::certs_to_pem(self.roots_der.iter().map(Vec::as_slice))
    }
}

/// One audit event (a denial, an admin action).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    pub id: u64,
    /// Unix seconds, as the server recorded it.
    pub at: i64,
    pub kind: String,
    pub caller: String,
    pub detail: String,
}

/// Which audit events [`AdminClient::audit_page`] asks for; every filter is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Newest first (the server's default is oldest first).
    pub newest_first: bool,
    /// A kind, exactly; one ending in `.` or `*` (`ca.`, `admin.node_*`) is a prefix.
    pub kind: Option<String>,
    /// Events at or after this time (unix seconds).
    pub since: Option<i64>,
    /// Events of exactly this caller.
    pub caller: Option<String>,
    /// At most this many (0: the server's default, 100; at most 1000).
    pub limit: u32,
    /// The previous page's token, unchanged.
    pub page_token: Option<String>,
}

/// One page of audit events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPage {
    pub events: Vec<AuditEvent>,
    /// Set when more events follow: the next query's `page_token`.
    pub next_page_token: Option<String>,
}

/// An X509-SVID to mint as the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MintRequest {
    /// Sent as typed: the server validates it.
    pub spiffe_id: String,
    /// PKCS#10, PEM or DER.
    pub csr: Vec<u8>,
    /// Whole seconds; zero: the server's default.
    pub ttl: Duration,
    pub dns_names: Vec<String>,
}

/// See the module documentation. Cloning is cheap (one shared channel).
#[derive(Clone, Debug)]
pub struct AdminClient {
    admin: PbAdminClient<Channel>,
}

impl AdminClient {
    /// Connects to the admin API on the server's Unix socket.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect_admin(socket).await?))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            admin: PbAdminClient::new(channel),
        }
    }

    /// `GetBundle`.
    pub async fn bundle(&self) -> Result<ServerBundle, CallError> {
        let b = self
            .admin
            .clone()
            .get_bundle(request(pb::GetBundleRequest {}, None)?)
            .await?
            .into_inner();
        server_bundle(b)
    }

    /// `ListAuditEvents`: at most `limit` events after the ID `after`, oldest first.
    pub async fn audit_events(&self, after: u64, limit: u32) -> Result<Vec<AuditEvent>, CallError> {
        let msg = pb::ListAuditEventsRequest {
            after_id: after,
            limit,
            ..Default::default()
        };
        let events = self
            .admin
            .clone()
            .list_audit_events(request(msg, None)?)
            .await?
            .into_inner()
            .events;
        Ok(events.into_iter().map(audit_event).collect())
    }

    /// `ListAuditEvents`: one page of `q`, filtered by the server.
    pub async fn audit_page(&self, q: &AuditQuery) -> Result<AuditPage, CallError> {
        let msg = pb::ListAuditEventsRequest {
            after_id: 0,
            limit: q.limit,
            newest_first: q.newest_first,
            kind: q.kind.clone().unwrap_or_default(),
            since: q.since.unwrap_or(0),
            caller: q.caller.clone().unwrap_or_default(),
            page_token: q.page_token.clone().unwrap_or_default(),
        };
        let r = self
            .admin
            .clone()
            .list_audit_events(request(msg, None)?)
            .await?
            .into_inner();
        Ok(AuditPage {
            events: r.events.into_iter().map(audit_event).collect(),
            next_page_token: (!r.next_page_token.is_empty()).then_some(r.next_page_token),
        })
    }

    /// `MintX509Svid`: the certificate (leaf and intermediates) and the root the server sent
    /// last, if it sent more than one certificate.
    pub async fn mint(&self, req: &MintRequest) -> Result<Issued, CallError> {
        let msg = pb::MintX509SvidRequest {
            spiffe_id: req.spiffe_id.clone(),
            csr: req.csr.clone(),
            ttl_seconds: i64::try_from(req.ttl.as_secs()).unwrap_or(i64::MAX),
            dns_names: req.dns_names.clone(),
        };
        let resp = self
            .admin
            .clone()
            .mint_x509_svid(request(msg, None)?)
            .await?
            .into_inner();
        minted(resp)
    }
}

fn audit_event(e: pb::AuditEvent) -> AuditEvent {
    AuditEvent {
        id: e.id,
        at: e.at,
        kind: e.kind,
        caller: e.caller,
        detail: e.detail,
    }
}

// --- node admin ----------------------------------------------------------------------------

/// A stored join token, by its id (a prefix of its hash): never the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTokenInfo {
    pub id: String,
    pub node_id: String,
    /// Unix seconds.
    pub created_at: i64,
    pub expires_at: i64,
    /// When it attested; None while unused.
    pub used_at: Option<i64>,
}

impl From<pb::JoinTokenRecord> for JoinTokenInfo {
    fn from(t: pb::JoinTokenRecord) -> Self {
        Self {
            id: t.id,
            node_id: t.node_id,
            created_at: t.created_at,
            expires_at: t.expires_at,
            used_at: (t.used_at != 0).then_some(t.used_at),
        }
    }
}

/// What [`NodeAdminClient::delete_node`] deleted besides the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeDeleted {
    pub entries: u32,
    pub tokens: u32,
}

/// The fields [`NodeAdminClient::update_entry`] changes: each `Some` replaces the stored
/// value; `None` keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryChange {
    pub spiffe_id: Option<String>,
    pub parent: Option<String>,
    pub selectors: Option<Vec<String>>,
    /// 0: the server's default.
    pub ttl_seconds: Option<i64>,
    pub dns_names: Option<Vec<String>>,
    /// 0: the server's `[jwt_svid] ttl`.
    pub jwt_ttl_seconds: Option<i64>,
    pub federates_with: Option<Vec<String>>,
    /// Refuse (Aborted) unless the entry is still at this revision.
    pub expected_revision: Option<u64>,
}

/// A one-time join token. `Debug` hides the token.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// The secret: shown once, the server keeps only its hash.
    pub token: String,
    pub node_id: String,
    /// Unix seconds.
    pub expires_at: i64,
}

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinToken")
            .field("token", &"…")
            .field("node_id", &self.node_id)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// An attested node, as the server records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub node_id: String,
    pub spiffe_id: String,
    /// Unix seconds.
    pub attested_at: i64,
    pub banned: bool,
    /// Its current SVID's serial.
    pub serial: String,
    /// Unix seconds.
    pub not_after: i64,
    /// How it attested (`join_token`, `k8s_psat`, ...).
    pub attestation: String,
    /// The node selectors its (last) attestation proved, sorted: what node sets select on.
    pub selectors: Vec<String>,
}

/// A node set: every node whose attested selectors include all of the set's. An entry whose
/// parent is `nodeset:<name>` serves a workload on any member node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSet {
    pub name: String,
    /// `spiffe://<td>/signet/nodeset/<name>`: what its entries name as parent.
    pub spiffe_id: String,
    /// Sorted.
    pub node_selectors: Vec<String>,
    /// Unix seconds.
    pub created_at: i64,
    /// Node IDs of the current members (banned nodes left out), sorted.
    pub members: Vec<String>,
    /// How many entries name it as parent.
    pub entries: u32,
}

impl From<pb::NodeSetRecord> for NodeSet {
    fn from(s: pb::NodeSetRecord) -> Self {
        NodeSet {
            name: s.name,
            spiffe_id: s.spiffe_id,
            node_selectors: s.node_selectors,
            created_at: s.created_at,
            members: s.members,
            entries: s.entries,
        }
    }
}

/// A registration entry, as the server records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredEntry {
    pub id: String,
    pub spiffe_id: String,
    pub parent_id: String,
    pub selectors: Vec<String>,
    /// Zero: the server's default.
    pub ttl_seconds: i64,
    pub dns_names: Vec<String>,
    pub revision: u64,
    /// Unix seconds.
    pub created_at: i64,
    /// The entry's JWT-SVID lifetime, seconds; zero: the server's `[jwt_svid] ttl`.
    pub jwt_ttl_seconds: i64,
    /// Foreign trust domain names whose bundles its workloads receive, sorted.
    pub federates_with: Vec<String>,
    /// Who keeps it: empty for the operator's entries, else the SPIFFE ID of the registrar
    /// (the Kubernetes bridge) that owns it.
    pub owner: String,
    /// The registrar's name for the object the entry comes from; empty for the operator's.
    pub owner_scope: String,
}

/// A registration entry to create.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewEntry {
    pub spiffe_id: String,
    pub parent: String,
    pub selectors: Vec<String>,
    /// Zero: the server's default.
    pub ttl_seconds: i64,
    pub dns_names: Vec<String>,
    /// The entry's JWT-SVID lifetime, seconds (at most 24 h; clamped to the server's
    /// maximum); zero: the server's default.
    pub jwt_ttl_seconds: i64,
    /// Foreign trust domains (each with a federation relationship) whose bundles its
    /// workloads receive.
    pub federates_with: Vec<String>,
}

impl From<&NewEntry> for pb::CreateEntryRequest {
    fn from(e: &NewEntry) -> Self {
        pb::CreateEntryRequest {
            spiffe_id: e.spiffe_id.clone(),
            parent: e.parent.clone(),
            selectors: e.selectors.clone(),
            ttl_seconds: e.ttl_seconds,
            dns_names: e.dns_names.clone(),
            jwt_ttl_seconds: e.jwt_ttl_seconds,
            federates_with: e.federates_with.clone(),
        }
    }
}

impl From<pb::NodeRecord> for Node {
    fn from(n: pb::NodeRecord) -> Self {
        Node {
            node_id: n.node_id,
            spiffe_id: n.spiffe_id,
            attested_at: n.attested_at,
            banned: n.banned,
            serial: n.serial,
            not_after: n.not_after,
            attestation: n.attestation,
            selectors: n.selectors,
        }
    }
}

impl From<pb::EntryRecord> for RegisteredEntry {
    fn from(e: pb::EntryRecord) -> Self {
        RegisteredEntry {
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
}

/// The typed client of `signet.admin.v1.NodeAdmin`: join tokens, nodes, entries.
#[derive(Clone, Debug)]
pub struct NodeAdminClient {
    nodes: PbNodeAdminClient<Channel>,
}

impl NodeAdminClient {
    /// Connects to the admin API on the server's Unix socket.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect_admin(socket).await?))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            nodes: PbNodeAdminClient::new(channel),
        }
    }

    /// `CreateJoinToken`, valid `ttl` (whole seconds), for `node_id` (`None`: a random one).
    pub async fn create_join_token(
        &self,
        ttl: Duration,
        node_id: Option<String>,
    ) -> Result<JoinToken, CallError> {
        let msg = pb::CreateJoinTokenRequest {
            ttl_seconds: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            node_id: node_id.unwrap_or_default(),
        };
        let r = self
            .nodes
            .clone()
            .create_join_token(request(msg, None)?)
            .await?
            .into_inner();
        if r.token.is_empty() {
            return Err(CallError::invalid_answer("an empty join token"));
        }
        Ok(JoinToken {
            token: r.token,
            node_id: r.node_id,
            expires_at: r.expires_at,
        })
    }

    /// `ListNodes`.
    pub async fn nodes(&self) -> Result<Vec<Node>, CallError> {
        let r = self
            .nodes
            .clone()
            .list_nodes(request(pb::ListNodesRequest {}, None)?)
            .await?
            .into_inner();
        Ok(r.nodes.into_iter().map(Node::from).collect())
    }

    /// `BanNode`: the node as banned.
    pub async fn ban(&self, node_id: &str) -> Result<Node, CallError> {
        let msg = pb::BanNodeRequest {
            node_id: node_id.to_owned(),
        };
        Ok(self
            .nodes
            .clone()
            .ban_node(request(msg, None)?)
            .await?
            .into_inner()
            .into())
    }

    /// `UnbanNode`: the node, no longer banned.
    pub async fn unban(&self, node_id: &str) -> Result<Node, CallError> {
        let msg = pb::UnbanNodeRequest {
            node_id: node_id.to_owned(),
        };
        Ok(self
            .nodes
            .clone()
            .unban_node(request(msg, None)?)
            .await?
            .into_inner()
            .into())
    }

    /// `DeleteNode` (`cascade`: with the entries it is the parent of).
    pub async fn delete_node(
        &self,
        node_id: &str,
        cascade: bool,
    ) -> Result<NodeDeleted, CallError> {
        let msg = pb::DeleteNodeRequest {
            node_id: node_id.to_owned(),
            cascade,
        };
        let r = self
            .nodes
            .clone()
            .delete_node(request(msg, None)?)
            .await?
            .into_inner();
        Ok(NodeDeleted {
            entries: r.entries_deleted,
            tokens: r.tokens_deleted,
        })
    }

    /// `ListJoinTokens`, newest first (all, or those of one node).
    pub async fn join_tokens(
        &self,
        node_id: Option<String>,
    ) -> Result<Vec<JoinTokenInfo>, CallError> {
        let msg = pb::ListJoinTokensRequest {
            node_id: node_id.unwrap_or_default(),
        };
        let r = self
            .nodes
            .clone()
            .list_join_tokens(request(msg, None)?)
            .await?
            .into_inner();
        Ok(r.tokens.into_iter().map(Into::into).collect())
    }

    /// `RevokeJoinToken`: the unused token `id` (or a unique prefix of it), deleted.
    pub async fn revoke_join_token(&self, id: &str) -> Result<JoinTokenInfo, CallError> {
        let msg = pb::RevokeJoinTokenRequest { id: id.to_owned() };
        Ok(self
            .nodes
            .clone()
            .revoke_join_token(request(msg, None)?)
            .await?
            .into_inner()
            .into())
    }

    /// `UpdateEntry`: entry `id` with `change` applied, validated as a new entry.
    pub async fn update_entry(
        &self,
        id: &str,
        change: &EntryChange,
    ) -> Result<RegisteredEntry, CallError> {
        let list = |v: &Option<Vec<String>>| {
            v.as_ref().map(|values| pb::StringList {
                values: values.clone(),
            })
        };
        let msg = pb::UpdateEntryRequest {
            id: id.to_owned(),
            spiffe_id: change.spiffe_id.clone(),
            parent: change.parent.clone(),
            selectors: list(&change.selectors),
            ttl_seconds: change.ttl_seconds,
            dns_names: list(&change.dns_names),
            jwt_ttl_seconds: change.jwt_ttl_seconds,
            federates_with: list(&change.federates_with),
            expected_revision: change.expected_revision.unwrap_or(0),
        };
        Ok(self
            .nodes
            .clone()
            .update_entry(request(msg, None)?)
            .await?
            .into_inner()
            .into())
    }

    /// `CreateEntry`.
    pub async fn create_entry(&self, e: &NewEntry) -> Result<RegisteredEntry, CallError> {
        Ok(self
            .nodes
            .clone()
            .create_entry(request(pb::CreateEntryRequest::from(e), None)?)
            .await?
            .into_inner()
            .into())
    }

    /// `BatchCreateEntries`: all of `entries` or none, in one transaction. Answers the
    /// entries in the request's order and the one revision they all took.
    pub async fn create_entries(
        &self,
        entries: &[NewEntry],
    ) -> Result<(Vec<RegisteredEntry>, u64), CallError> {
        let msg = pb::BatchCreateEntriesRequest {
            entries: entries.iter().map(pb::CreateEntryRequest::from).collect(),
        };
        let r = self
            .nodes
            .clone()
            .batch_create_entries(request(msg, None)?)
            .await?
            .into_inner();
        Ok((r.entries.into_iter().map(Into::into).collect(), r.revision))
    }

    /// `ListEntries`, under `parent` (`None`: all).
    pub async fn entries(&self, parent: Option<String>) -> Result<Vec<RegisteredEntry>, CallError> {
        let msg = pb::ListEntriesRequest {
            parent: parent.unwrap_or_default(),
        };
        let r = self
            .nodes
            .clone()
            .list_entries(request(msg, None)?)
            .await?
            .into_inner();
        Ok(r.entries.into_iter().map(RegisteredEntry::from).collect())
    }

    /// `DeleteEntry`.
    pub async fn delete_entry(&self, id: &str) -> Result<(), CallError> {
        let msg = pb::DeleteEntryRequest { id: id.to_owned() };
        self.nodes.clone().delete_entry(request(msg, None)?).await?;
        Ok(())
    }

    /// `CreateNodeSet`: AlreadyExists for a taken name (sets are immutable).
    pub async fn create_node_set(
        &self,
        name: &str,
        node_selectors: &[String],
    ) -> Result<NodeSet, CallError> {
        let msg = pb::CreateNodeSetRequest {
            name: name.to_owned(),
            node_selectors: node_selectors.to_vec(),
        };
        Ok(self
            .nodes
            .clone()
            .create_node_set(request(msg, None)?)
            .await?
            .into_inner()
            .into())
    }

    /// `ListNodeSets`, by name.
    pub async fn node_sets(&self) -> Result<Vec<NodeSet>, CallError> {
        let r = self
            .nodes
            .clone()
            .list_node_sets(request(pb::ListNodeSetsRequest {}, None)?)
            .await?
            .into_inner();
        Ok(r.node_sets.into_iter().map(NodeSet::from).collect())
    }

    /// `DeleteNodeSet`: FailedPrecondition while entries name it.
    pub async fn delete_node_set(&self, name: &str) -> Result<(), CallError> {
        let msg = pb::DeleteNodeSetRequest {
            name: name.to_owned(),
        };
        self.nodes
            .clone()
            .delete_node_set(request(msg, None)?)
            .await?;
        Ok(())
    }
}

// --- proto conversions ------------------------------------------------------------------

fn server_bundle(b: pb::BundleResponse) -> Result<ServerBundle, CallError> {
    let trust_domain = b.trust_domain.parse().map_err(|e| {
        CallError::invalid_answer(format!("bundle trust domain {:?}: {e}", b.trust_domain))
    })?;
    for (i, r) in b.roots.iter().enumerate() {
        crate::ca::whole_certificate(r)
            .map_err(|e| CallError::invalid_answer(format!("bundle root {i}: {e}")))?;
    }
    Ok(ServerBundle {
        trust_domain,
        roots_der: b.roots,
        revision: b.revision,
        path: b.path,
    })
}

fn minted(resp: pb::MintX509SvidResponse) -> Result<Issued, CallError> {
    // The answer names no SPIFFE ID beside the certificate: the leaf's own is checked.
    let leaf = resp
        .cert_chain
        .first()
        .ok_or_else(|| CallError::invalid_answer("no certificate"))?;
    let id = signet_pki::SvidCertificate::from_chain_der(vec![leaf.clone()])
        .map_err(|e| CallError::invalid_answer(format!("its certificate: {e}")))?
        .spiffe_id()
        .to_string();
    split_root(resp.cert_chain, &id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::test_certs::{leaf, root};

    #[test]
    fn the_bundle_needs_a_trust_domain_and_whole_roots() {
        let ca = root();
        let good = pb::BundleResponse {
            trust_domain: "example.org".into(),
            roots: vec![ca.der.clone()],
            revision: 3,
            path: "/data/bundle.pem".into(),
        };
        let b = server_bundle(good.clone()).unwrap();
        assert_eq!(b.trust_domain.to_string(), "example.org");
        assert_eq!((b.revision, b.path.as_str()), (3, "/data/bundle.pem"));
        assert!(b.roots_pem().starts_with("-----BEGIN CERTIFICATE-----\n"));
        for bad in [
            pb::BundleResponse {
                trust_domain: "Not A Domain!".into(),
                ..good.clone()
            },
            pb::BundleResponse {
                roots: vec![b"junk".to_vec()],
                ..good.clone()
            },
        ] {
            let e = server_bundle(bad).unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        }
    }

    #[test]
    fn node_admin_records_convert_and_a_token_is_never_shown() {
        let t = JoinToken {
            token: "s3cret-token".into(),
            node_id: "n1".into(),
            expires_at: 5,
        };
        let shown = format!("{t:?}");
        assert!(!shown.contains("s3cret") && shown.contains("n1"), "{shown}");
        let n = Node::from(pb::NodeRecord {
            node_id: "n1".into(),
            spiffe_id: "spiffe://example.org/signet/node/n1".into(),
            attested_at: 1,
            banned: true,
            serial: "ab".into(),
            not_after: 2,
            attestation: "join_token".into(),
            selectors: vec!["signet:attestation:join_token".into()],
        });
        assert_eq!((n.node_id.as_str(), n.banned, n.not_after), ("n1", true, 2));
        let e = RegisteredEntry::from(pb::EntryRecord {
            id: "e1".into(),
            spiffe_id: "spiffe://example.org/web".into(),
            parent_id: "spiffe://example.org/signet/node/n1".into(),
            selectors: vec!["unix:uid:33".into()],
            ttl_seconds: 60,
            dns_names: vec![],
            revision: 4,
            created_at: 3,
            jwt_ttl_seconds: 0,
            federates_with: vec!["partner.example".into()],
            owner: "spiffe://example.org/ns/signet-system/sa/signet-k8s".into(),
            owner_scope: "Identity/team-a/web".into(),
        });
        assert_eq!((e.id.as_str(), e.ttl_seconds, e.revision), ("e1", 60, 4));
        assert_eq!(e.owner_scope, "Identity/team-a/web");
        assert!(e.owner.ends_with("/sa/signet-k8s"));
    }

    #[test]
    fn a_minted_chain_is_an_svid_and_its_root_is_split_off() {
        let ca = root();
        let id = "spiffe://example.org/ops/tool";
        let l = leaf(&ca, id);
        let m = minted(pb::MintX509SvidResponse {
            cert_chain: vec![l.clone(), ca.der.clone()],
            serial: "01".into(),
        })
        .unwrap();
        assert_eq!(m.certificate.spiffe_id().to_string(), id);
        assert_eq!(m.certificate.chain_der(), std::slice::from_ref(&l));
        assert_eq!(m.root_der.as_deref(), Some(ca.der.as_slice()));
        for bad in [vec![], vec![b"junk".to_vec()], vec![ca.der.clone()]] {
            let e = minted(pb::MintX509SvidResponse {
                cert_chain: bad,
                serial: "01".into(),
            })
            .unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        }
    }
}
