//! `signet.agent.v1.Node`: what signet-agent speaks to the server, on the TLS listener.
//!
//! - `Attest`: the join token is the credential (no bearer, no client certificate needed); it is
//!   consumed atomically before anything is issued, so two agents racing with one token cannot
//!   both attest. The node ID comes from the token. Or, in Kubernetes (`[nodes.kubernetes]`),
//!   the agent's projected service-account token in `authorization: Bearer` (see
//!   [`crate::authn::psat`]): the node ID is `k8s-<node name>` from the token's node claim.
//! - `RenewNode`, `SyncEntries`, `SignWorkloads`: mTLS with the node SVID only. A banned node is
//!   refused (PermissionDenied, audit event) before anything else happens.
//!
//! Every certificate goes through [`Issuer::issue`] (policy, CA core, ledger commit) with a
//! node grant source, so policy is where "own ID only" and "only entries parented to me" live.

use std::sync::Arc;

use signet_proto::agent::{
    AttestRequest, AttestResponse, Entry as PbEntry, RenewNodeRequest, SignWorkloadsRequest,
    SignWorkloadsResponse, Svid, SyncEntriesRequest, SyncEntriesResponse, WorkloadResult,
    node_server::Node,
};
use tonic::{Request, Response, Status};

use super::{ApiError, check_size, request_id};
use crate::authn::jwt::bearer_token;
use crate::authn::psat::{PsatAttestor, PsatRefusal};
use crate::authn::{AuthenticatedCaller, AuthnError, CallerKind};
use crate::bundle::BundleHandle;
use crate::ca::IssuedCert;
use crate::ca::RequestedNames;
use crate::ca::csr::VerifiedCsr;
use crate::clock::unix;
use crate::issuer::{Credentials, IssueInput, Issuer};
use crate::nodes::JoinToken;
use crate::policy::{EntryGrant, GrantSource};
use crate::store::nodes::{ATTESTATION_JOIN_TOKEN, ATTESTATION_K8S_PSAT};
use crate::store::{EntryRow, NodeRow, Store, TokenUse};

/// Most CSRs in one `SignWorkloads` call.
pub const MAX_WORKLOADS_PER_CALL: usize = 256;

pub struct NodeApi {
    issuer: Arc<Issuer>,
    store: Arc<dyn Store>,
    bundle: BundleHandle,
    max_message_bytes: usize,
    psat: Option<PsatAttestor>,
}

impl NodeApi {
    pub fn new(
        issuer: Arc<Issuer>,
        store: Arc<dyn Store>,
        bundle: BundleHandle,
        max_message_bytes: usize,
    ) -> Self {
        Self {
            issuer,
            store,
            bundle,
            max_message_bytes,
            psat: None,
        }
    }

    /// Accepts Kubernetes projected service-account tokens for attestation.
    pub fn with_kubernetes_attestation(mut self, psat: PsatAttestor) -> Self {
        self.psat = Some(psat);
        self
    }

    fn now(&self) -> i64 {
        unix(self.issuer.now())
    }

    fn audit(&self, kind: &str, caller: &str, detail: String) {
        self.issuer.audit().record(kind, caller, detail, self.now());
    }

    /// The calling node, over mTLS with its node SVID, if it is known and not banned.
    async fn node_caller(&self, creds: &Credentials) -> Result<AuthenticatedCaller, ApiError> {
        if creds.authorization.is_some() {
            // A bearer token would take precedence in `authenticate`; the node API is mTLS only.
            let e = AuthnError::BadCertificate(
                "the node API authenticates with the node SVID over mTLS only; send no \
                 authorization header"
                    .into(),
            );
            self.audit("authn.refused", "anonymous", e.to_string());
            return Err(ApiError::Unauthenticated(e));
        }
        let caller = self.issuer.authenticate(creds)?;
        let CallerKind::Node { node_id, .. } = caller.kind() else {
            let msg = format!(
                "caller {} is not a node: the node API takes a node SVID \
                 (spiffe://{}/signet/node/<node-id>)",
                caller.spiffe_id(),
                self.issuer.trust_domain()
            );
            self.audit("node.denied", &caller.label(), msg.clone());
            return Err(ApiError::PermissionDenied(msg));
        };
        let node = self.store.node(node_id).await?;
        self.check_not_banned(&caller, node_id, node.as_ref())?;
        self.issuer.check_node_certificate(&caller).await?;
        Ok(caller)
    }

    /// Refuses a banned (or unknown) node, with an audit event.
    fn check_not_banned(
        &self,
        caller: &AuthenticatedCaller,
        node_id: &str,
        node: Option<&NodeRow>,
    ) -> Result<(), ApiError> {
        let msg = match node {
            Some(n) if n.banned_at.is_some() => {
                format!("node {node_id} is banned; it can renew nothing and sign nothing")
            }
            Some(_) => return Ok(()),
            None => format!("node {node_id} is not attested (unknown to this CA)"),
        };
        self.audit("node.denied", &caller.label(), msg.clone());
        Err(ApiError::PermissionDenied(msg))
    }
}

fn svid(cert: &IssuedCert) -> Svid {
    Svid {
        spiffe_id: cert.spiffe_id.to_string(),
        cert_chain: cert.chain.clone(),
        serial: cert.serial.clone(),
        not_before: unix(cert.not_before),
        not_after: unix(cert.not_after),
    }
}

pub(crate) fn entry_to_proto(e: EntryRow) -> PbEntry {
    PbEntry {
        id: e.id,
        spiffe_id: e.spiffe_id,
        parent_id: e.parent_id,
        selectors: e.selectors,
        ttl_seconds: e.ttl_seconds,
        dns_names: e.dns_names,
        revision: e.revision,
    }
}

#[tonic::async_trait]
impl Node for NodeApi {
    async fn attest(
        &self,
        request: Request<AttestRequest>,
    ) -> Result<Response<AttestResponse>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        if let Some(header) = &creds.authorization {
            if !req.join_token.is_empty() {
                return Err(ApiError::InvalidArgument(
                    "send a join token or a service-account token (authorization: Bearer), \
                     not both"
                        .into(),
                )
                .into());
            }
            let (node_id, cert) = self.attest_with_token(header, &req.csr, request_id).await?;
            return Ok(Response::new(AttestResponse {
                node_id,
                svid: Some(svid(&cert)),
                bundle: self.bundle.current().roots.clone(),
            }));
        }
        if req.join_token.is_empty() {
            let e = AuthnError::BadJoinToken(
                "no join token: create one with `signetctl token create` (or, in Kubernetes, \
                 send the agent's projected service-account token as authorization: Bearer)"
                    .into(),
            );
            self.audit("authn.refused", "anonymous", e.to_string());
            return Err(ApiError::Unauthenticated(e).into());
        }
        // The token is never logged, returned, or stored: only its hash.
        let token = JoinToken::parse(&req.join_token).map_err(|m| {
            let e = AuthnError::BadJoinToken(m);
            self.audit("authn.refused", "anonymous", e.to_string());
            ApiError::Unauthenticated(e)
        })?;
        // A malformed CSR should not burn the token.
        VerifiedCsr::parse(&req.csr)
            .map_err(|e| ApiError::InvalidArgument(format!("invalid CSR: {e}")))?;

        let hash = token.hash();
        let used_at = self.now();
        let node_id = match self.store.consume_join_token(&hash, used_at).await? {
            TokenUse::Consumed { node_id } => node_id,
            refused => {
                let why = match refused {
                    TokenUse::AlreadyUsed => "it has already been used (a join token attests once)",
                    TokenUse::Expired => "it has expired",
                    _ => "it is not known to this CA",
                };
                let e = AuthnError::BadJoinToken(format!(
                    "{why}; create a new one with `signetctl token create`"
                ));
                // The hash prefix identifies the token in the audit log without revealing it.
                self.audit(
                    "authn.refused",
                    "anonymous",
                    format!("{e} (token hash {}…)", hash.get(..12).unwrap_or_default()),
                );
                return Err(ApiError::Unauthenticated(e).into());
            }
        };
        match self
            .attest_node(
                &node_id,
                &req.csr,
                request_id,
                "a join token",
                ATTESTATION_JOIN_TOKEN,
            )
            .await
        {
            Ok(cert) => Ok(Response::new(AttestResponse {
                node_id,
                svid: Some(svid(&cert)),
                bundle: self.bundle.current().roots.clone(),
            })),
            Err(e) => {
                // A retryable failure (ledger or database unavailable) gives the token back,
                // so the agent can retry with it; any other refusal keeps it spent.
                if matches!(e, ApiError::Unavailable(_)) {
                    match self.store.release_join_token(&hash, used_at).await {
                        Ok(_) => {}
                        Err(re) => {
                            tracing::warn!(error = %re, node_id = %node_id, "could not release the join token after a failed attestation");
                        }
                    }
                }
                Err(e.into())
            }
        }
    }

    async fn renew_node(
        &self,
        request: Request<RenewNodeRequest>,
    ) -> Result<Response<Svid>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        let caller = self.node_caller(&creds).await?;
        let cert = self
            .issuer
            .issue(
                &caller,
                IssueInput {
                    csr: &req.csr,
                    ttl_seconds: 0,
                    impersonate: None,
                    request_id,
                    api: "node",
                    extra_names: None,
                    source: GrantSource::NodeRenewal,
                },
            )
            .await?;
        if let CallerKind::Node { node_id, .. } = caller.kind() {
            self.store
                .update_node_certificate(node_id, &cert.serial, unix(cert.not_after))
                .await?;
        }
        Ok(Response::new(svid(&cert)))
    }

    async fn sync_entries(
        &self,
        request: Request<SyncEntriesRequest>,
    ) -> Result<Response<SyncEntriesResponse>, Status> {
        let creds = super::credentials(&request)?;
        let req = request.into_inner();
        let caller = self.node_caller(&creds).await?;
        let sync = self
            .store
            .entries_for_parent_since(&caller.spiffe_id().to_string(), req.known_revision)
            .await?;
        Ok(Response::new(SyncEntriesResponse {
            revision: sync.revision,
            unchanged: sync.unchanged,
            entries: sync.entries.into_iter().map(entry_to_proto).collect(),
        }))
    }

    async fn sign_workloads(
        &self,
        request: Request<SignWorkloadsRequest>,
    ) -> Result<Response<SignWorkloadsResponse>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        if req.csrs.len() > MAX_WORKLOADS_PER_CALL {
            return Err(ApiError::InvalidArgument(format!(
                "{} CSRs in one call; send at most {MAX_WORKLOADS_PER_CALL}",
                req.csrs.len()
            ))
            .into());
        }
        let caller = self.node_caller(&creds).await?;
        // Signed concurrently, so the ledger's group commit records the whole call in one or a
        // few transactions instead of one per CSR; results keep the request's order.
        let signings = req.csrs.iter().enumerate().map(|(i, w)| {
            let caller = &caller;
            let request_id = &request_id;
            async move {
                let outcome = self
                    .sign_one(caller, &w.entry_id, &w.csr, format!("{request_id}-{i}"))
                    .await;
                match outcome {
                    Ok(cert) => WorkloadResult {
                        entry_id: w.entry_id.clone(),
                        svid: Some(svid(&cert)),
                        code: 0,
                        message: String::new(),
                    },
                    Err(e) => {
                        let status = Status::from(e);
                        WorkloadResult {
                            entry_id: w.entry_id.clone(),
                            svid: None,
                            code: status.code() as i32,
                            message: status.message().to_owned(),
                        }
                    }
                }
            }
        });
        let results = futures::future::join_all(signings).await;
        Ok(Response::new(SignWorkloadsResponse { results }))
    }
}

impl NodeApi {
    /// Attestation with a Kubernetes projected service-account token: validated offline, an
    /// allowed service account, bound to a node; the node ID comes from the node's name.
    async fn attest_with_token(
        &self,
        header: &str,
        csr: &[u8],
        request_id: String,
    ) -> Result<(String, IssuedCert), ApiError> {
        let refuse = |e: AuthnError| {
            self.audit(
                "authn.refused",
                "anonymous",
                format!("node attestation: {e}"),
            );
            ApiError::Unauthenticated(e)
        };
        let Some(psat) = &self.psat else {
            return Err(refuse(AuthnError::BadToken(
                "Kubernetes node attestation is not configured on this server \
                 ([nodes.kubernetes]); attest with a join token"
                    .into(),
            )));
        };
        let token = bearer_token(header).map_err(refuse)?;
        VerifiedCsr::parse(csr)
            .map_err(|e| ApiError::InvalidArgument(format!("invalid CSR: {e}")))?;
        let node = match psat.attest(self.issuer.jwt(), token, self.issuer.now()) {
            Ok(node) => node,
            Err(PsatRefusal::Unauthenticated(e)) => return Err(refuse(e)),
            Err(PsatRefusal::Denied { caller, message }) => {
                self.audit("node.denied", &caller, message.clone());
                return Err(ApiError::PermissionDenied(message));
            }
        };
        // One node token re-attesting in a loop: limits.attestation_per_caller.
        self.issuer.check_attestation_rate(&node.node_id)?;
        let how = format!(
            "the Kubernetes service-account token of {} (pod {}, node {})",
            node.service_account,
            node.pod.as_deref().unwrap_or("?"),
            node.node_name
        );
        let cert = self
            .attest_node(&node.node_id, csr, request_id, &how, ATTESTATION_K8S_PSAT)
            .await?;
        Ok((node.node_id, cert))
    }

    /// After the credential was checked (a join token consumed): refuses a banned node,
    /// issues the node identity through the issuer (policy, CA, ledger) and records the node.
    async fn attest_node(
        &self,
        node_id: &str,
        csr: &[u8],
        request_id: String,
        how: &str,
        attestation: &str,
    ) -> Result<IssuedCert, ApiError> {
        let caller = AuthenticatedCaller::attested_node(self.issuer.trust_domain(), node_id)
            .map_err(ApiError::Unauthenticated)?;
        let existing = self.store.node(node_id).await?;
        if existing.as_ref().is_some_and(|n| n.banned_at.is_some()) {
            self.check_not_banned(&caller, node_id, existing.as_ref())?;
        }
        let cert = self
            .issuer
            .issue(
                &caller,
                IssueInput {
                    csr,
                    ttl_seconds: 0,
                    impersonate: None,
                    request_id,
                    api: "node",
                    extra_names: None,
                    source: GrantSource::NodeAttestation {
                        method: attestation,
                    },
                },
            )
            .await?;
        self.store
            .upsert_attested_node(&NodeRow {
                node_id: node_id.to_owned(),
                spiffe_id: cert.spiffe_id.to_string(),
                attested_at: self.now(),
                banned_at: None,
                last_serial: cert.serial.clone(),
                not_after: unix(cert.not_after),
                attestation: attestation.to_owned(),
            })
            .await?;
        self.audit(
            "node.attested",
            &caller.label(),
            format!("node {node_id} attested with {how}; serial {}", cert.serial),
        );
        Ok(cert)
    }

    async fn sign_one(
        &self,
        caller: &AuthenticatedCaller,
        entry_id: &str,
        csr: &[u8],
        request_id: String,
    ) -> Result<IssuedCert, ApiError> {
        let not_yours = || {
            let msg = format!(
                "entry {:?} is not parented to node {}",
                entry_id.chars().take(128).collect::<String>(),
                caller.spiffe_id()
            );
            self.audit(
                "issue.denied",
                &caller.label(),
                format!("policy.entry: {msg}"),
            );
            ApiError::PermissionDenied(msg)
        };
        // An unknown entry answers like another node's: a node learns nothing of others.
        let Some(entry) = self.store.entry(entry_id).await? else {
            return Err(not_yours());
        };
        let (Ok(spiffe_id), Ok(parent_id)) = (entry.spiffe_id.parse(), entry.parent_id.parse())
        else {
            tracing::error!(entry = %entry.id, "stored entry has an unparsable SPIFFE ID");
            return Err(ApiError::Internal(request_id));
        };
        let grant = EntryGrant {
            entry_id: entry.id.clone(),
            spiffe_id,
            parent_id,
            dns_names: entry.dns_names.clone(),
            ttl_seconds: entry.ttl_seconds,
        };
        self.issuer
            .issue(
                caller,
                IssueInput {
                    csr,
                    ttl_seconds: entry.ttl_seconds,
                    impersonate: None,
                    request_id,
                    api: "node",
                    extra_names: Some(RequestedNames {
                        dns_names: entry.dns_names.clone(),
                        ..RequestedNames::default()
                    }),
                    source: GrantSource::Entry(&grant),
                },
            )
            .await
            .map_err(ApiError::from)
    }
}
