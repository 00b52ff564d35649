//! `signet.admin.v1.FederationAdmin`: federation relationships (`crate::federation`), served
//! only on the admin Unix socket. Every change is an audit event (`admin.federation_*`).
//!
//! A relationship is refused (InvalidArgument, naming the field) for: a trust domain that is not
//! one, or is this server's own; a URL that is not `https://`; a profile other than
//! `https_spiffe`/`https_web` with a URL (or any without one: static); an `https_spiffe`
//! relationship without an endpoint SPIFFE ID in the federated trust domain or without a
//! starting bundle holding an X.509 authority (the first fetch could not be authenticated); a
//! static one without a bundle; a bundle that does not read (PEM certificates or a SPIFFE bundle
//! document), or holds no key.

use std::sync::Arc;

use signet_proto::admin::federation_admin_server::FederationAdmin;
use signet_proto::admin::{
    CreateRelationshipRequest, DeleteRelationshipRequest, DeleteRelationshipResponse,
    GetRelationshipRequest, ListRelationshipsRequest, ListRelationshipsResponse,
    RefreshRelationshipRequest, Relationship as PbRelationship, SetRelationshipBundleRequest,
};
use signet_types::TrustDomain;
use tonic::{Request, Response, Status};

use super::ApiError;
use crate::authn::AuthenticatedCaller;
use crate::federation::relationships::{
    Federation, PROFILE_HTTPS_SPIFFE, PROFILE_STATIC, Refreshed, check_authorities,
    federated_trust_domain, new_relationship, normalize, read_bundle_input,
};
use crate::store::{BundleReplace, BundleWrite, Relationship, RelationshipDelete};

pub struct FederationAdminApi {
    federation: Arc<Federation>,
}

impl FederationAdminApi {
    pub fn new(federation: Arc<Federation>) -> Self {
        Self { federation }
    }

    fn audit(&self, kind: &str, detail: String) {
        let caller = AuthenticatedCaller::admin_label(self.federation.own_trust_domain());
        self.federation.audit(kind, &caller, detail);
    }

    fn trust_domain(&self, given: &str) -> Result<TrustDomain, ApiError> {
        federated_trust_domain(given, self.federation.own_trust_domain())
            .map_err(ApiError::InvalidArgument)
    }

    async fn get(&self, td: &TrustDomain) -> Result<Relationship, ApiError> {
        self.federation
            .store()
            .relationship(td.as_str())
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("no federation relationship with {td}")))
    }
}

fn to_proto(r: Relationship) -> PbRelationship {
    let row = r.row;
    PbRelationship {
        trust_domain: row.trust_domain,
        bundle_endpoint_url: row.endpoint_url,
        profile: row.profile,
        endpoint_spiffe_id: row.endpoint_spiffe_id,
        created_at: row.created_at,
        bundle_document: row.bundle_document.into_bytes(),
        sequence: row
            .bundle_sequence
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or(0),
        bundle_updated_at: row.bundle_updated_at,
        last_success_at: row.last_success_at,
        last_attempt_at: row.last_attempt_at,
        next_refresh_at: row.next_refresh_at,
        last_error: row.last_error,
        consecutive_failures: u32::try_from(row.consecutive_failures).unwrap_or(u32::MAX),
        federating_entries: r.federating_entries,
    }
}

#[tonic::async_trait]
impl FederationAdmin for FederationAdminApi {
    async fn create_relationship(
        &self,
        request: Request<CreateRelationshipRequest>,
    ) -> Result<Response<PbRelationship>, Status> {
        let req = request.into_inner();
        let td = self.trust_domain(&req.trust_domain)?;
        let (row, bundle) = new_relationship(
            &td,
            &req.bundle_endpoint_url,
            &req.profile,
            &req.endpoint_spiffe_id,
            &req.bundle,
            self.federation.now(),
        )
        .map_err(ApiError::InvalidArgument)?;
        let profile = row.profile.clone();
        if !self.federation.store().create_relationship(&row).await? {
            return Err(ApiError::AlreadyExists(format!(
                "a federation relationship with {td} exists (federation show {td}; delete it \
                 first to change it)"
            ))
            .into());
        }
        self.audit(
            "admin.federation_create",
            format!(
                "federation with {td}: profile {profile}{}{}{}",
                if row.endpoint_url.is_empty() {
                    String::new()
                } else {
                    format!(", endpoint {}", row.endpoint_url)
                },
                if row.endpoint_spiffe_id.is_empty() {
                    String::new()
                } else {
                    format!(" as {}", row.endpoint_spiffe_id)
                },
                bundle.as_ref().map_or(String::new(), |b| format!(
                    ", starting bundle {}",
                    &b.content_sha256[..16.min(b.content_sha256.len())]
                ))
            ),
        );
        if profile != PROFILE_STATIC {
            // The first fetch now, so the answer says whether the endpoint works; then the
            // loop, which may be asleep for want of relationships, learns of its schedule.
            self.federation.refresh(td.as_str(), true).await?;
            self.federation.wake();
        }
        Ok(Response::new(to_proto(self.get(&td).await?)))
    }

    async fn list_relationships(
        &self,
        _request: Request<ListRelationshipsRequest>,
    ) -> Result<Response<ListRelationshipsResponse>, Status> {
        let rows = self
            .federation
            .store()
            .list_relationships()
            .await
            .map_err(ApiError::from)?;
        // Summaries: a few large documents would otherwise outgrow a message (show has them).
        Ok(Response::new(ListRelationshipsResponse {
            relationships: rows
                .into_iter()
                .map(|r| PbRelationship {
                    bundle_document: Vec::new(),
                    ..to_proto(r)
                })
                .collect(),
        }))
    }

    async fn get_relationship(
        &self,
        request: Request<GetRelationshipRequest>,
    ) -> Result<Response<PbRelationship>, Status> {
        let td = self.trust_domain(&request.into_inner().trust_domain)?;
        Ok(Response::new(to_proto(self.get(&td).await?)))
    }

    async fn delete_relationship(
        &self,
        request: Request<DeleteRelationshipRequest>,
    ) -> Result<Response<DeleteRelationshipResponse>, Status> {
        let td = self.trust_domain(&request.into_inner().trust_domain)?;
        match self
            .federation
            .store()
            .delete_relationship(td.as_str())
            .await
            .map_err(ApiError::from)?
        {
            RelationshipDelete::Deleted => {
                self.audit(
                    "admin.federation_delete",
                    format!("federation with {td} deleted"),
                );
                Ok(Response::new(DeleteRelationshipResponse {}))
            }
            RelationshipDelete::NotFound => {
                Err(ApiError::NotFound(format!("no federation relationship with {td}")).into())
            }
            RelationshipDelete::InUse { entry_ids, count } => {
                Err(ApiError::FailedPrecondition(format!(
                    "{count} entries federate with {td} (e.g. {}); delete them, or recreate \
                     them without --federates-with {td}, first",
                    entry_ids.join(", ")
                ))
                .into())
            }
        }
    }

    async fn refresh_relationship(
        &self,
        request: Request<RefreshRelationshipRequest>,
    ) -> Result<Response<PbRelationship>, Status> {
        let td = self.trust_domain(&request.into_inner().trust_domain)?;
        let rel = self.get(&td).await?;
        if rel.row.endpoint_url.is_empty() {
            return Err(ApiError::FailedPrecondition(format!(
                "{td} is a static relationship (no bundle endpoint); replace its bundle with \
                 federation set-bundle"
            ))
            .into());
        }
        let outcome = self
            .federation
            .refresh(td.as_str(), true)
            .await
            .map_err(ApiError::from)?;
        self.federation.wake();
        self.audit(
            "admin.federation_refresh",
            format!(
                "federation with {td} refreshed: {}",
                match &outcome {
                    Refreshed::Changed => "new bundle".to_owned(),
                    Refreshed::Unchanged => "unchanged".to_owned(),
                    Refreshed::Failed(why) => format!("failed, bundle held kept ({why})"),
                    Refreshed::NotClaimed => "gone".to_owned(),
                }
            ),
        );
        Ok(Response::new(to_proto(self.get(&td).await?)))
    }

    async fn set_relationship_bundle(
        &self,
        request: Request<SetRelationshipBundleRequest>,
    ) -> Result<Response<PbRelationship>, Status> {
        let req = request.into_inner();
        let td = self.trust_domain(&req.trust_domain)?;
        let rel = self.get(&td).await?;
        let b = read_bundle_input(&req.bundle).map_err(ApiError::InvalidArgument)?;
        check_authorities(&b, self.federation.now()).map_err(ApiError::InvalidArgument)?;
        if rel.row.profile == PROFILE_HTTPS_SPIFFE && b.x509_authorities.is_empty() {
            return Err(ApiError::InvalidArgument(
                "an https_spiffe relationship's bundle needs an X.509 authority to \
                 authenticate the endpoint with"
                    .into(),
            )
            .into());
        }
        let n = normalize(&b).map_err(ApiError::InvalidArgument)?;
        let now = self.federation.now();
        // The operator's bundle replaces whatever is held, sequence included: it is how an
        // endpoint that can no longer be authenticated (or a static domain) is re-anchored.
        match self
            .federation
            .store()
            .replace_bundle(
                td.as_str(),
                &rel.row.bundle_sha256,
                &BundleWrite {
                    document: &n.document,
                    sha256: &n.content_sha256,
                    sequence: n.sequence.and_then(|s| i64::try_from(s).ok()),
                },
                now,
            )
            .await
            .map_err(ApiError::from)?
        {
            BundleReplace::Replaced { .. } => {}
            BundleReplace::Conflict => {
                return Err(ApiError::FailedPrecondition(format!(
                    "the bundle of {td} changed meanwhile (a fetch); look at federation show \
                     {td} and try again"
                ))
                .into());
            }
        }
        self.audit(
            "admin.federation_set_bundle",
            format!(
                "federation with {td}: bundle set by the operator (content {}, {} X.509 and {} \
                 JWT authorities)",
                &n.content_sha256[..16.min(n.content_sha256.len())],
                b.x509_authorities.len(),
                b.jwt_authorities.len()
            ),
        );
        self.federation.wake();
        Ok(Response::new(to_proto(self.get(&td).await?)))
    }
}
