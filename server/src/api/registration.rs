//! `signet.ca.v1.Registration`: the entries a registrar (the Kubernetes bridge) keeps, served
//! on the TLS port beside `CertificateAuthority`.
//!
//! The handler converts the proto at the edge, authenticates the caller as `SignCsr` does
//! (`Issuer::authenticate_acting`), asks [`crate::registration::authorize`] (pure, with the
//! listed node sets that exist, read first), and hands the authorized sync to the store
//! (`store::registration`, one transaction). Every refusal after authentication is audited
//! (`registration.denied`, `registration.invalid`); every sync that changed something is one
//! `registration.sync` event with its owner, scope and counts. Off (FailedPrecondition) while
//! `[policy.kubernetes_bridge] node_sets` is empty.

use std::collections::BTreeSet;
use std::sync::Arc;

use signet_proto::ca::{
    ListOwnedEntriesRequest, ListOwnedEntriesResponse, OwnedEntry, OwnedEntryRecord,
    SyncOwnedEntriesRequest, SyncOwnedEntriesResponse, registration_server::Registration,
};
use signet_types::TrustDomain;
use signet_types::node_set::node_set_of;
use tonic::{Request, Response, Status};

use super::{ApiError, check_size};
use crate::authn::AuthenticatedCaller;
use crate::clock::unix;
use crate::issuer::Issuer;
use crate::metrics::Metrics;
use crate::policy::{Denial, DenialKind, Policy};
use crate::registration::{EntryRequest, Registrar, authorize, authorize_caller, check_scope};
use crate::store::{EntryRow, NewEntry, Store, SyncResult};

/// What the service answers while no node set is listed.
/// ListOwnedEntries pages: entries when the caller names no size, the most it may name, and
/// about how many bytes one page holds (review finding F4 of issue 29: one unpaged answer
/// outgrew what the bridge decodes, and its garbage collection stopped).
const DEFAULT_PAGE_SIZE: u32 = 200;
const MAX_PAGE_SIZE: u32 = 1000;
const MAX_PAGE_BYTES: usize = 1 << 20;

/// A page token: `<scope>|<id>` of the last entry of the previous page ('|' is in no scope).
fn parse_page_token(token: &str) -> Result<Option<(&str, &str)>, ApiError> {
    if token.is_empty() {
        return Ok(None);
    }
    match token.rsplit_once('|') {
        Some((scope, id)) if check_scope(scope).is_ok() && !id.is_empty() && id.len() <= 128 => {
            Ok(Some((scope, id)))
        }
        _ => Err(ApiError::InvalidArgument(
            "page_token is not one this server gave (send the previous answer's \
             next_page_token, or none for the first page)"
                .into(),
        )),
    }
}

const OFF: &str = "registration is off: list node sets in [policy.kubernetes_bridge] node_sets";

pub struct RegistrationApi {
    issuer: Arc<Issuer>,
    store: Arc<dyn Store>,
    /// The signing policy (with the server's own names), as `NodeAdmin` checks entries.
    policy: Arc<Policy>,
    registrar: Registrar,
    metrics: Arc<Metrics>,
    max_message_bytes: usize,
}

impl RegistrationApi {
    pub fn new(
        issuer: Arc<Issuer>,
        store: Arc<dyn Store>,
        policy: Arc<Policy>,
        registrar: Registrar,
        metrics: Arc<Metrics>,
        max_message_bytes: usize,
    ) -> Self {
        Self {
            issuer,
            store,
            policy,
            registrar,
            metrics,
            max_message_bytes,
        }
    }

    fn now(&self) -> i64 {
        unix(self.issuer.now())
    }

    /// The caller, authenticated as for `SignCsr`, if the service is on.
    async fn caller<T>(&self, request: &Request<T>) -> Result<AuthenticatedCaller, ApiError> {
        let creds = super::credentials(request)?;
        let caller = self.issuer.authenticate_acting(&creds).await?;
        Ok(caller)
    }

    /// Audits a refusal and turns it into the caller's error.
    fn refuse(&self, caller: &AuthenticatedCaller, d: Denial) -> ApiError {
        let (kind, err) = match d.kind {
            DenialKind::InvalidArgument => (
                "registration.invalid",
                ApiError::InvalidArgument(d.message.clone()),
            ),
            DenialKind::PermissionDenied => (
                "registration.denied",
                ApiError::PermissionDenied(d.message.clone()),
            ),
        };
        self.issuer.audit().record(
            kind,
            &caller.label(),
            format!("{}: {}", d.reason, d.message),
            self.now(),
        );
        err
    }

    async fn sync(
        &self,
        request: Request<SyncOwnedEntriesRequest>,
    ) -> Result<SyncOwnedEntriesResponse, ApiError> {
        let caller = self.caller(&request).await?;
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        // A stranger is refused before it learns whether the service is on.
        authorize_caller(&self.policy, &caller).map_err(|d| self.refuse(&caller, d))?;
        if !self.registrar.is_on() {
            return Err(ApiError::FailedPrecondition(OFF.into()));
        }
        let listed: Vec<&str> = self.registrar.node_sets().collect();
        let existing: BTreeSet<String> = self
            .store
            .existing_node_sets(&listed)
            .await?
            .into_iter()
            .collect();
        let inputs: Vec<EntryRequest<'_>> = req.entries.iter().map(entry_request).collect();
        let sync = authorize(
            &self.policy,
            &self.registrar,
            &caller,
            &req.scope,
            &inputs,
            &existing,
        )
        .map_err(|d| self.refuse(&caller, d))?;
        let now = self.now();
        let desired = sync
            .entries()
            .iter()
            .map(|v| {
                Ok(NewEntry {
                    id: super::node_admin::new_entry_id()?,
                    spiffe_id: v.spiffe_id.to_string(),
                    parent_id: v.parent_id.to_string(),
                    selectors: v.selectors.clone(),
                    ttl_seconds: v.ttl_seconds,
                    dns_names: v.dns_names.clone(),
                    created_at: now,
                    jwt_ttl_seconds: v.jwt_ttl_seconds,
                    federates_with: v.federates_with.clone(),
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let max = self.registrar.max_owned_entries();
        let outcome = match self
            .store
            .sync_owned_entries(sync.owner(), sync.scope(), &desired, max)
            .await?
        {
            SyncResult::Synced(o) => o,
            SyncResult::TooMany { would_own, max } => {
                let message = format!(
                    "after this sync {} would keep {would_own} entries, more than \
                     policy.kubernetes_bridge.max_owned_entries ({max}); nothing was written",
                    sync.owner()
                );
                self.audit_refusal(&caller, "registration.max_owned_entries", &message);
                return Err(ApiError::FailedPrecondition(message));
            }
            SyncResult::NoRelationship {
                index,
                trust_domain,
            } => {
                let message = format!(
                    "entry {index}: federates_with names {trust_domain}, which has no \
                     federation relationship (the operator creates it: signetctl federation \
                     create --trust-domain {trust_domain} …); nothing was written"
                );
                self.audit_refusal(&caller, "registration.federates_with", &message);
                return Err(ApiError::FailedPrecondition(message));
            }
            SyncResult::NoNodeSet { index, name } => {
                let message = format!(
                    "entry {index}: node set {name} does not exist (it was deleted; the \
                     operator creates it: signetctl nodeset create {name} --node-selector …); \
                     nothing was written"
                );
                self.audit_refusal(&caller, "registration.node_set", &message);
                return Err(ApiError::FailedPrecondition(message));
            }
        };
        if outcome.changed() {
            self.issuer.audit().record(
                "registration.sync",
                &caller.label(),
                format!(
                    "owner {} scope {}: {} created, {} updated, {} deleted, {} unchanged \
                     (revision {})",
                    sync.owner(),
                    sync.scope(),
                    outcome.created,
                    outcome.updated,
                    outcome.deleted,
                    outcome.unchanged,
                    outcome.revision
                ),
                now,
            );
        }
        Ok(SyncOwnedEntriesResponse {
            entry_ids: outcome.entry_ids,
            created: outcome.created,
            updated: outcome.updated,
            deleted: outcome.deleted,
            unchanged: outcome.unchanged,
            revision: outcome.revision,
        })
    }

    fn audit_refusal(&self, caller: &AuthenticatedCaller, reason: &str, message: &str) {
        self.issuer.audit().record(
            "registration.denied",
            &caller.label(),
            format!("{reason}: {message}"),
            self.now(),
        );
    }

    async fn list(
        &self,
        request: Request<ListOwnedEntriesRequest>,
    ) -> Result<ListOwnedEntriesResponse, ApiError> {
        let caller = self.caller(&request).await?;
        let req = request.into_inner();
        authorize_caller(&self.policy, &caller).map_err(|d| self.refuse(&caller, d))?;
        if !self.registrar.is_on() {
            return Err(ApiError::FailedPrecondition(OFF.into()));
        }
        let scope = if req.scope.is_empty() {
            None
        } else {
            check_scope(&req.scope).map_err(|d| self.refuse(&caller, d))?;
            Some(req.scope.as_str())
        };
        let after = parse_page_token(&req.page_token)?;
        let limit = match req.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let owner = caller.spiffe_id().to_string();
        let rows = self
            .store
            .list_owned_entries_page(&owner, scope, after, i64::from(limit))
            .await?;
        let full = rows.len() >= limit as usize;
        let td = self.issuer.trust_domain();
        let mut entries = Vec::with_capacity(rows.len());
        let mut bytes = 0usize;
        let mut cut = false;
        for r in rows {
            let record = owned_record(r, td);
            let len = prost::Message::encoded_len(&record);
            // At least one per page, so a page always moves forward.
            if !entries.is_empty() && bytes + len > MAX_PAGE_BYTES {
                cut = true;
                break;
            }
            bytes += len;
            entries.push(record);
        }
        let next_page_token = match entries.last() {
            Some(last) if full || cut => format!("{}|{}", last.scope, last.id),
            _ => String::new(),
        };
        Ok(ListOwnedEntriesResponse {
            entries,
            next_page_token,
        })
    }
}

fn entry_request(e: &OwnedEntry) -> EntryRequest<'_> {
    EntryRequest {
        spiffe_id: &e.spiffe_id,
        node_set: &e.node_set,
        selectors: &e.selectors,
        ttl_seconds: e.ttl_seconds,
        dns_names: &e.dns_names,
        jwt_ttl_seconds: e.jwt_ttl_seconds,
        federates_with: &e.federates_with,
    }
}

/// A stored owned entry as the registrar sees it: its parent as the node set's name.
fn owned_record(r: EntryRow, td: &TrustDomain) -> OwnedEntryRecord {
    let node_set = r
        .parent_id
        .parse()
        .ok()
        .and_then(|id| node_set_of(&id, td))
        .map_or_else(|| r.parent_id.clone(), |n| n.as_str().to_owned());
    OwnedEntryRecord {
        id: r.id,
        scope: r.owner_scope,
        revision: r.revision,
        created_at: r.created_at,
        entry: Some(OwnedEntry {
            spiffe_id: r.spiffe_id,
            node_set,
            selectors: r.selectors,
            ttl_seconds: r.ttl_seconds,
            dns_names: r.dns_names,
            jwt_ttl_seconds: r.jwt_ttl_seconds,
            federates_with: r.federates_with,
        }),
    }
}

#[tonic::async_trait]
impl Registration for RegistrationApi {
    async fn sync_owned_entries(
        &self,
        request: Request<SyncOwnedEntriesRequest>,
    ) -> Result<Response<SyncOwnedEntriesResponse>, Status> {
        let result = self.sync(request).await;
        self.metrics.registration_sync(match &result {
            Ok(r) if r.revision != 0 => "changed",
            Ok(_) => "unchanged",
            Err(e) => e.outcome(),
        });
        Ok(Response::new(result?))
    }

    async fn list_owned_entries(
        &self,
        request: Request<ListOwnedEntriesRequest>,
    ) -> Result<Response<ListOwnedEntriesResponse>, Status> {
        Ok(Response::new(self.list(request).await?))
    }
}
