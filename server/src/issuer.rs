//! The issuance flow, shared by every API: authenticate -> policy -> CA core -> ledger.
//!
//! Handlers convert their protos into [`IssueInput`] and the request's metadata into
//! [`Credentials`] (plain values: this module never sees a tonic type), and call
//! [`Issuer::issue`]; only a certificate the ledger has committed is ever returned. Every
//! refusal is an [`IssuerError`], which the API edge (`crate::api`) turns into a gRPC status.
//!
//! About 640 lines, on purpose: the one issuance flow, read top to bottom with its audit events
//! and trace spans; its decisions live elsewhere (`authn`, `policy`, `ca`, `ledger`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use signet_types::TrustDomain;

use crate::audit::AuditLog;
use crate::authn::jwt::{Bearer, JwtAuthenticator};
use crate::authn::{AuthenticatedCaller, AuthnError, CallerKind, mtls};
use crate::ca::csr::VerifiedCsr;
use crate::ca::jwt_key::JwtKeySource;
use crate::ca::{Authority, IssueError, IssuedCert, RequestedNames, SerialSource};
use crate::clock::{Clock, unix};
use crate::jwt_svid::{self, JwtIssuePolicy, JwtMintError, JwtMintRequest, MintedJwtSvid};
use crate::ledger::{LedgerError, LedgerWriter};
use crate::metrics::Metrics;
use crate::policy::renewal::{self, EntryFacts, RenewalBasis};
use crate::policy::{Denial, DenialKind, GrantSource, IssueRequest, Policy};
use crate::store::{NewCertificate, NewJwtSvid, Store, StoreError};
use signet_runtime::telemetry::{TARGET as TRACE, record_outcome};
use tracing::Instrument as _;
use tracing::field::Empty;

/// The credentials a request carried. `Debug` never shows the token.
#[derive(Default, Clone)]
pub struct Credentials {
    /// The `authorization` header's bearer token (or why it is none), as the API edge read it.
    pub authorization: Option<Bearer>,
    /// The verified client certificate chain's leaf (DER), if the TLS client sent one.
    pub peer_leaf: Option<Vec<u8>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("authorization", &self.authorization.as_ref().map(|_| "…"))
            .field("peer_leaf", &self.peer_leaf.as_ref().map(Vec::len))
            .finish()
    }
}

/// Why the issuer refused or failed a request, by what the caller should do about it. Each
/// variant's `Display` is the message the caller gets; the API edge picks the gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    /// No or bad credentials (audited as `authn.refused`).
    #[error("{0}")]
    Unauthenticated(#[from] AuthnError),
    /// Malformed or hostile input, e.g. a CSR that does not parse (audited as `issue.invalid`).
    #[error("{0}")]
    Invalid(String),
    /// Authenticated, but policy or the CA core refused (audited as `issue.denied`).
    #[error("{0}")]
    Denied(String),
    /// A per-caller rate limit: retry after the hint.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after: std::time::Duration,
    },
    /// The signing CA is not valid now (retryable).
    #[error("the CA cannot issue right now: {0}")]
    CaNotValid(String),
    /// No JWT-SVID signing key can sign now (none active, or it is about to expire): retryable.
    #[error("{0}")]
    JwtKeyUnavailable(String),
    /// The ledger's queue is full (retryable, with backoff).
    #[error("the CA is overloaded (ledger queue full); retry with backoff")]
    LedgerOverloaded,
    /// The ledger did not commit the record, so the certificate was discarded (retryable).
    #[error("the certificate could not be recorded, so it was not issued; retry later ({0})")]
    NotRecorded(LedgerError),
    /// The database could not be read (the API edge decides what the caller sees).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Our bug; details are logged, not returned.
    #[error("internal error (see server log, request {request_id})")]
    Internal { request_id: String },
}

impl IssuerError {
    /// Short outcome label for metrics (the same labels as the API edge's errors).
    pub fn outcome(&self) -> &'static str {
        match self {
            IssuerError::Unauthenticated(_) => "unauthenticated",
            IssuerError::Invalid(_) => "invalid_argument",
            IssuerError::Denied(_) => "permission_denied",
            IssuerError::RateLimited { .. } => "resource_exhausted",
            IssuerError::CaNotValid(_)
            | IssuerError::JwtKeyUnavailable(_)
            | IssuerError::LedgerOverloaded
            | IssuerError::NotRecorded(_)
            | IssuerError::Store(StoreError::Unavailable(_)) => "unavailable",
            IssuerError::Store(_) | IssuerError::Internal { .. } => "internal",
        }
    }

    /// Every value of [`IssuerError::reason`].
    pub const REASONS: [&'static str; 10] = [
        "authn_failed",
        "invalid_request",
        "not_authorized",
        "rate_limited",
        "ca_unavailable",
        "ledger_overloaded",
        "ledger_not_recorded",
        "store_unavailable",
        "store_error",
        "internal",
    ];

    /// The bounded reason label of `signet_issuance_refusals_total` (finer than
    /// [`Self::outcome`] for the faults an operator acts on differently).
    pub fn reason(&self) -> &'static str {
        match self {
            IssuerError::Unauthenticated(_) => "authn_failed",
            IssuerError::Invalid(_) => "invalid_request",
            IssuerError::Denied(_) => "not_authorized",
            IssuerError::RateLimited { .. } => "rate_limited",
            IssuerError::CaNotValid(_) | IssuerError::JwtKeyUnavailable(_) => "ca_unavailable",
            IssuerError::LedgerOverloaded => "ledger_overloaded",
            IssuerError::NotRecorded(_) => "ledger_not_recorded",
            IssuerError::Store(StoreError::Unavailable(_)) => "store_unavailable",
            IssuerError::Store(_) => "store_error",
            IssuerError::Internal { .. } => "internal",
        }
    }

    /// A fault that may go away on retry (database or ledger unavailable, CA not valid now),
    /// as opposed to a refusal of this request.
    pub fn is_retryable(&self) -> bool {
        self.outcome() == "unavailable"
    }
}

/// One issuance request, as the API edge hands it over.
#[derive(Debug, Clone)]
pub struct IssueInput<'a> {
    /// PEM or DER CSR.
    pub csr: &'a [u8],
    /// Requested lifetime in seconds (0: default).
    pub ttl_seconds: i64,
    /// Istio's `ImpersonatedIdentity` metadata, if sent.
    pub impersonate: Option<&'a str>,
    /// For logs and the ledger.
    pub request_id: String,
    /// For metrics: `native`, `istio`, `admin`, `self`.
    pub api: &'static str,
    /// Names asked for outside the CSR (the admin API's mint, the server's own certificate);
    /// merged with the CSR's own before policy decides.
    pub extra_names: Option<RequestedNames>,
    /// Why the certificate is asked for (policy checks who may use which source).
    pub source: GrantSource<'a>,
}

pub struct Issuer {
    td: TrustDomain,
    clock: Arc<dyn Clock>,
    serials: Arc<dyn SerialSource>,
    authority: ArcSwap<Authority>,
    /// Tainted CA key IDs (mTLS renewal of their certificates needs an untainted signer).
    tainted: ArcSwap<BTreeSet<String>>,
    policy: Policy,
    jwt: Option<JwtAuthenticator>,
    ledger: LedgerWriter,
    store: Arc<dyn Store>,
    audit: AuditLog,
    metrics: Arc<Metrics>,
    /// Per-caller issuance rate limit (`[limits]`); none: unlimited.
    caller_limits: Option<Arc<crate::limits::CallerLimits>>,
    /// Ledger rows of certificates presented over mTLS, reused for a second.
    presented_rows: crate::policy::row_cache::RowCache,
    /// Where JWT-SVID issuance gets the active JWT signing key; `None`: not configured (every
    /// JWT-SVID is refused as Unavailable).
    jwt_keys: Option<Arc<dyn JwtKeySource>>,
    jwt_policy: JwtIssuePolicy,
}

/// One JWT-SVID request, as the API edge hands it over.
#[derive(Debug, Clone)]
pub struct JwtInput<'a> {
    /// Why: the caller's own identity (native API) or a registration entry (node API).
    pub source: GrantSource<'a>,
    /// The `aud` claim, as asked (checked and de-duplicated here).
    pub audience: &'a [String],
    /// Requested lifetime in seconds (0: the entry's, else the server's default).
    pub ttl_seconds: i64,
    /// The entry's `jwt_ttl_seconds` (0: none, or not an entry).
    pub entry_ttl_seconds: i64,
    pub request_id: String,
    /// For metrics: `native_jwt`, `node_jwt`.
    pub api: &'static str,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("trust_domain", &self.td)
            .finish_non_exhaustive()
    }
}

/// What [`Issuer::new`] needs.
pub struct IssuerParts {
    pub td: TrustDomain,
    pub clock: Arc<dyn Clock>,
    pub serials: Arc<dyn SerialSource>,
    pub authority: Arc<Authority>,
    pub policy: Policy,
    pub jwt: Option<JwtAuthenticator>,
    pub ledger: LedgerWriter,
    /// Read at mTLS renewal: the presented certificate's ledger row, and its entry and node.
    pub store: Arc<dyn Store>,
    pub audit: AuditLog,
    pub metrics: Arc<Metrics>,
}

impl Issuer {
    pub fn new(p: IssuerParts) -> Self {
        Self {
            td: p.td,
            clock: p.clock,
            serials: p.serials,
            authority: ArcSwap::new(p.authority),
            tainted: ArcSwap::default(),
            policy: p.policy,
            jwt: p.jwt,
            ledger: p.ledger,
            store: p.store,
            audit: p.audit,
            metrics: p.metrics,
            caller_limits: None,
            presented_rows: Default::default(),
            jwt_keys: None,
            jwt_policy: JwtIssuePolicy::default(),
        }
    }

    /// Mints JWT-SVIDs with the active key of `keys`, under `policy`.
    pub fn with_jwt_svids(mut self, keys: Arc<dyn JwtKeySource>, policy: JwtIssuePolicy) -> Self {
        self.jwt_keys = Some(keys);
        self.jwt_policy = policy;
        self
    }

    /// Limits how fast each authenticated caller may ask for certificates.
    pub fn with_caller_limits(mut self, limits: Arc<crate::limits::CallerLimits>) -> Self {
        self.caller_limits = Some(limits);
        self
    }

    /// Takes one attestation from node `node_id`'s rate limit (a node token re-attesting).
    pub fn check_attestation_rate(&self, node_id: &str) -> Result<(), IssuerError> {
        let Some(limits) = &self.caller_limits else {
            return Ok(());
        };
        limits
            .check_attestation(node_id, self.clock.monotonic().into_std())
            .map_err(|l| {
                self.metrics.limited("per_caller");
                IssuerError::RateLimited {
                    message: l.message,
                    retry_after: l.retry_after,
                }
            })
    }

    /// Takes one issuance from `caller`'s rate limit (per pod, per impersonated workload: see
    /// [`crate::limits::caller_key`]).
    fn check_caller_rate(
        &self,
        caller: &AuthenticatedCaller,
        impersonate: Option<&str>,
    ) -> Result<(), IssuerError> {
        let Some(limits) = &self.caller_limits else {
            return Ok(());
        };
        let label = caller.label();
        let key = crate::limits::caller_key(caller, impersonate);
        limits
            .check_issuance(&key, self.clock.monotonic().into_std())
            .map_err(|l| {
                self.metrics.limited("per_caller");
                self.audit.record(
                    "limits.refused",
                    &label,
                    l.message.clone(),
                    unix(self.clock.now()),
                );
                IssuerError::RateLimited {
                    message: l.message,
                    retry_after: l.retry_after,
                }
            })
    }

    pub fn trust_domain(&self) -> &TrustDomain {
        &self.td
    }

    pub fn authority(&self) -> Arc<Authority> {
        self.authority.load_full()
    }

    /// Signs with `authority` from now on (the CA manager's new active key); `tainted`: the
    /// tainted CA key IDs.
    pub fn set_ca(&self, authority: Arc<Authority>, tainted: BTreeSet<String>) {
        self.authority.store(authority);
        self.tainted.store(Arc::new(tainted));
    }

    pub fn now(&self) -> std::time::SystemTime {
        self.clock.now()
    }

    /// The clock's monotonic reading (for deadlines and durations).
    pub fn monotonic(&self) -> tokio::time::Instant {
        self.clock.monotonic()
    }

    /// The Kubernetes token validator, when `[auth.kubernetes]` is configured.
    pub fn jwt(&self) -> Option<&JwtAuthenticator> {
        self.jwt.as_ref()
    }

    /// Forgets the cached ledger row of the certificate with this SHA-256 (it was revoked), so
    /// the next renewal over mTLS reads the revocation.
    pub fn forget_presented(&self, leaf_sha256: &[u8; 32]) {
        self.presented_rows.forget(leaf_sha256);
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Who is calling. A bearer token, when sent, is what counts (a bad one is refused even
    /// if a client certificate was also sent); otherwise the client certificate.
    pub fn authenticate(&self, creds: &Credentials) -> Result<AuthenticatedCaller, IssuerError> {
        let span = tracing::info_span!(target: TRACE, "authn", caller = Empty, outcome = Empty);
        let _entered = span.enter();
        let result = if let Some(bearer) = &creds.authorization {
            bearer.token().and_then(|token| match &self.jwt {
                Some(jwt) => jwt.authenticate(token, self.clock.now()),
                None => Err(AuthnError::JwtNotConfigured),
            })
        } else if let Some(leaf) = &creds.peer_leaf {
            mtls::authenticate_peer(leaf, &self.td)
        } else {
            Err(AuthnError::Missing)
        };
        if let Ok(c) = &result
            && !span.is_disabled()
        {
            span.record("caller", c.label());
        }
        record_outcome(&span, &result, |_| "unauthenticated");
        result.map_err(|e| {
            self.audit.record(
                "authn.refused",
                "anonymous",
                e.to_string(),
                unix(self.clock.now()),
            );
            IssuerError::Unauthenticated(e)
        })
    }

    /// Who is calling, for an API that acts for the caller without issuing to it (the
    /// Registration service): authenticated as `SignCsr` authenticates; an mTLS caller's
    /// presented certificate is re-checked as for a renewal (in the ledger, this very
    /// certificate, not revoked, its source still valid), and a refusal is audited.
    pub async fn authenticate_acting(
        &self,
        creds: &Credentials,
    ) -> Result<AuthenticatedCaller, IssuerError> {
        let caller = self.authenticate(creds)?;
        if matches!(caller.kind(), CallerKind::Mtls { .. }) {
            self.renewal_basis(&caller, unix(self.clock.now()))
                .await
                .map_err(|e| self.denial(&caller, e))?;
        }
        Ok(caller)
    }

    /// Authenticates and issues, recording metrics for the outcome.
    pub async fn authenticate_and_issue(
        &self,
        creds: &Credentials,
        input: IssueInput<'_>,
    ) -> Result<IssuedCert, IssuerError> {
        self.observed(input.api, async {
            let caller = self.admit(creds, input.impersonate)?;
            self.issue_inner(&caller, input).await
        })
        .await
    }

    /// Issues for an already authenticated caller (the admin socket, the server's own TLS
    /// certificate), recording metrics.
    pub async fn issue(
        &self,
        caller: &AuthenticatedCaller,
        input: IssueInput<'_>,
    ) -> Result<IssuedCert, IssuerError> {
        self.observed(input.api, self.issue_inner(caller, input))
            .await
    }

    /// Authenticates and mints a JWT-SVID for the caller's own identity (the native API),
    /// under the same authentication, rate limit and policy as `SignCsr`; recording metrics.
    pub async fn authenticate_and_mint_jwt(
        &self,
        creds: &Credentials,
        input: JwtInput<'_>,
    ) -> Result<MintedJwtSvid, IssuerError> {
        self.observed(input.api, async {
            let caller = self.admit(creds, None)?;
            self.mint_jwt_inner(&caller, input).await
        })
        .await
    }

    /// Mints a JWT-SVID for an already authenticated caller (the node API, for an entry),
    /// recording metrics. A node's mints for one workload identity take from that identity's
    /// own rate limit (`limits.issuance_per_caller`, keyed by node and SPIFFE ID): a workload
    /// asking for token after token, each for a new audience (every one a cache miss at the
    /// agent and a ledger row), is refused before it uses up its node's share of
    /// `issuance_per_source`, which its neighbours' certificates and tokens need.
    pub async fn mint_jwt(
        &self,
        caller: &AuthenticatedCaller,
        input: JwtInput<'_>,
    ) -> Result<MintedJwtSvid, IssuerError> {
        self.observed(input.api, async {
            if let GrantSource::Entry(grant) = &input.source {
                self.check_caller_rate(caller, Some(&grant.spiffe_id.to_string()))?;
            }
            self.mint_jwt_inner(caller, input).await
        })
        .await
    }

    /// The caller of `creds`, authenticated and within its rate limit.
    fn admit(
        &self,
        creds: &Credentials,
        impersonate: Option<&str>,
    ) -> Result<AuthenticatedCaller, IssuerError> {
        let caller = self.authenticate(creds)?;
        self.check_caller_rate(&caller, impersonate)?;
        Ok(caller)
    }

    /// Counts a node attestation's outcome (`signet_node_attestations_total`).
    pub fn observe_attestation<T>(&self, result: &Result<T, IssuerError>) {
        self.metrics.attestation(
            result
                .as_ref()
                .map_or_else(IssuerError::reason, |_| "attested"),
        );
    }

    /// Runs `work`, recording its outcome and duration for `api`.
    async fn observed<T>(
        &self,
        api: &'static str,
        work: impl Future<Output = Result<T, IssuerError>>,
    ) -> Result<T, IssuerError> {
        let started = self.clock.monotonic().into_std();
        let result = work.await;
        self.observe(api, &result, started);
        result
    }

    fn observe<T>(&self, api: &'static str, result: &Result<T, IssuerError>, started: Instant) {
        let outcome = match result {
            Ok(_) => "issued",
            Err(e) => {
                self.metrics.refusal(api, e.reason());
                e.outcome()
            }
        };
        // Measured on the injected clock `started` was read from (not `Instant::elapsed`).
        let took = self
            .clock
            .monotonic()
            .into_std()
            .saturating_duration_since(started);
        self.metrics.observe_issuance(api, outcome, took);
    }

    /// The JWT-SVID flow: the same authorization as a certificate (policy decides the identity
    /// from the grant source, with no names asked; an mTLS caller's presented certificate is
    /// re-checked as for a renewal), then the minting core with the active JWT key, then the
    /// ledger commit; the token is returned only once its row committed.
    async fn mint_jwt_inner(
        &self,
        caller: &AuthenticatedCaller,
        input: JwtInput<'_>,
    ) -> Result<MintedJwtSvid, IssuerError> {
        let audience = jwt_svid::normalize_audience(input.audience)
            .map_err(|e| self.deny(caller, "jwt.audience", e.to_string(), true))?;
        let now = self.clock.now();
        let basis = match caller.kind() {
            CallerKind::Mtls { .. } => Some(
                self.renewal_basis(caller, unix(now))
                    .instrument(tracing::info_span!(target: TRACE, "policy.renewal_basis"))
                    .await
                    .map_err(|e| self.denial(caller, e))?,
            ),
            _ => None,
        };
        let names = RequestedNames::default();
        let request = IssueRequest {
            source: input.source,
            names: &names,
            ttl_seconds: 0,
            impersonate: None,
            renewal: basis.as_ref(),
        };
        let span = tracing::info_span!(target: TRACE, "policy", outcome = Empty);
        let grant = span.in_scope(|| self.policy.decide(caller, &request, unix(now)));
        record_outcome(&span, &grant, |d| d.reason);
        let grant = grant.map_err(|d| self.denial(caller, Refusal::Policy(d)))?;

        let key = self.jwt_keys.as_ref().and_then(|k| k.active_jwt_key());
        let span = tracing::info_span!(target: TRACE, "sign_jwt", outcome = Empty);
        let minted = span.in_scope(|| {
            jwt_svid::mint(
                &self.jwt_policy,
                &JwtMintRequest {
                    subject: grant.spiffe_id(),
                    audience: &audience,
                    ttl_seconds: input.ttl_seconds,
                    entry_ttl_seconds: input.entry_ttl_seconds,
                },
                now,
                key.as_ref(),
            )
        });
        record_outcome(&span, &minted, |_| "refused");
        let minted = minted.map_err(|e| match e {
            JwtMintError::Invalid(m) => self.deny(caller, "jwt.request", m, true),
            JwtMintError::Unavailable(m) => {
                tracing::warn!(error = %m, "JWT-SVID refused: no usable signing key");
                IssuerError::JwtKeyUnavailable(m)
            }
            JwtMintError::SelfCheck(m) => {
                tracing::error!(error = %m, request_id = %input.request_id, "JWT-SVID minting failed");
                IssuerError::Internal {
                    request_id: input.request_id.clone(),
                }
            }
        })?;

        let record = NewJwtSvid {
            spiffe_id: minted.claims.subject.to_string(),
            audience: minted.claims.audience.clone(),
            issued_at: minted.claims.issued_at,
            expires_at: minted.claims.expires_at,
            key_id: minted.key_id.clone(),
            token_sha256: minted.token_sha256,
            caller: caller.label(),
            request_id: input.request_id.clone(),
            provenance: grant.provenance().to_ledger_text(),
        };
        let span = tracing::info_span!(
            target: TRACE,
            "ledger.commit",
            seq = Empty,
            batch_size = Empty,
            batch_first_seq = Empty,
            outcome = Empty
        );
        let seq = self
            .ledger
            .commit_jwt(record)
            .instrument(span.clone())
            .await;
        record_outcome(&span, &seq, |_| "not_recorded");
        let seq = seq.map_err(|e| {
            tracing::warn!(error = %e, request_id = %input.request_id, "ledger commit failed; JWT-SVID discarded");
            match e {
                LedgerError::Overloaded => IssuerError::LedgerOverloaded,
                e @ LedgerError::RevokedParent(_) => IssuerError::Denied(e.to_string()),
                other => IssuerError::NotRecorded(other),
            }
        })?;
        tracing::debug!(
            seq,
            spiffe_id = %minted.claims.subject,
            caller = %caller.label(),
            request_id = %input.request_id,
            api = input.api,
            "JWT-SVID issued"
        );
        Ok(minted)
    }

    async fn issue_inner(
        &self,
        caller: &AuthenticatedCaller,
        input: IssueInput<'_>,
    ) -> Result<IssuedCert, IssuerError> {
        let csr = VerifiedCsr::parse(input.csr)
            .map_err(|e| self.deny(caller, "issue.invalid", format!("invalid CSR: {e}"), true))?;
        let merged;
        let names = match &input.extra_names {
            None => csr.requested(),
            Some(extra) => {
                merged = merge_names(csr.requested(), extra);
                &merged
            }
        };
        let now = self.clock.now();
        let basis = match caller.kind() {
            CallerKind::Mtls { .. } => Some(
                self.renewal_basis(caller, unix(now))
                    .instrument(tracing::info_span!(target: TRACE, "policy.renewal_basis"))
                    .await
                    .map_err(|e| self.denial(caller, e))?,
            ),
            _ => None,
        };
        let request = IssueRequest {
            source: input.source,
            names,
            ttl_seconds: input.ttl_seconds,
            impersonate: input.impersonate,
            renewal: basis.as_ref(),
        };
        let span = tracing::info_span!(target: TRACE, "policy", outcome = Empty);
        let grant = span.in_scope(|| self.policy.decide(caller, &request, unix(now)));
        record_outcome(&span, &grant, |d| d.reason);
        let grant = grant.map_err(|d| self.denial(caller, Refusal::Policy(d)))?;

        let authority = self.authority.load();
        let span = tracing::info_span!(
            target: TRACE,
            "sign",
            spiffe_id = Empty,
            serial = Empty,
            outcome = Empty
        );
        let cert = span.in_scope(|| authority.issue(&csr, &grant, now, self.serials.as_ref()));
        if let Ok(c) = &cert {
            span.record("spiffe_id", tracing::field::display(&c.spiffe_id));
            span.record("serial", c.serial.as_str());
        }
        record_outcome(&span, &cert, |_| "refused");
        let cert = cert.map_err(|e| match e {
            IssueError::NotGranted(m) => self.deny(caller, "issue.not_granted", m, false),
            IssueError::CaNotValid(m) => {
                tracing::error!(error = %m, "issuing CA is not valid now");
                IssuerError::CaNotValid(m)
            }
            other => {
                tracing::error!(error = %other, request_id = %input.request_id, "issuance failed");
                IssuerError::Internal {
                    request_id: input.request_id.clone(),
                }
            }
        })?;

        let record = NewCertificate {
            serial: cert.serial.clone(),
            spiffe_id: cert.spiffe_id.to_string(),
            dns_names: cert.dns_names.clone(),
            ip_addresses: cert.ip_addresses.iter().map(ToString::to_string).collect(),
            not_before: unix(cert.not_before),
            not_after: unix(cert.not_after),
            cert_sha256: cert.sha256,
            ca_key_id: cert.ca_key_id.clone(),
            caller: caller.label(),
            issued_at: unix(now),
            request_id: input.request_id.clone(),
            cert_der: cert.der.clone(),
            provenance: grant.provenance().to_ledger_text(),
        };
        let span = tracing::info_span!(
            target: TRACE,
            "ledger.commit",
            serial = %cert.serial,
            seq = Empty,
            batch_size = Empty,
            batch_first_seq = Empty,
            outcome = Empty
        );
        let seq = self.ledger.commit(record).instrument(span.clone()).await;
        record_outcome(&span, &seq, |_| "not_recorded");
        let seq = seq.map_err(|e| {
            tracing::warn!(error = %e, request_id = %input.request_id, "ledger commit failed; certificate discarded");
            match e {
                LedgerError::Overloaded => IssuerError::LedgerOverloaded,
                e @ LedgerError::RevokedParent(_) => IssuerError::Denied(e.to_string()),
                other => IssuerError::NotRecorded(other),
            }
        })?;
        // The ledger row is the record of every issuance; this line is for following a
        // server's work as it happens (`RUST_LOG=info,signet_server::issuer=debug`). At info it
        // cost one unbuffered write to stderr per certificate, about 2% of the server's CPU at
        // full rate.
        tracing::debug!(
            seq,
            serial = %cert.serial,
            spiffe_id = %cert.spiffe_id,
            caller = %caller.label(),
            request_id = %input.request_id,
            api = input.api,
            "issued"
        );
        Ok(cert)
    }

    /// Re-checks the certificate an mTLS caller presents: its ledger row and the source of its
    /// authority (see [`renewal`]).
    async fn renewal_basis(
        &self,
        caller: &AuthenticatedCaller,
        now: i64,
    ) -> Result<RenewalBasis, Refusal> {
        let CallerKind::Mtls { serial, .. } = caller.kind() else {
            return Err(Refusal::Policy(Denial {
                kind: DenialKind::InvalidArgument,
                reason: "policy.renewal",
                message: "only an mTLS caller renews the certificate it presents".into(),
            }));
        };
        let row = self.presented_row(caller, serial).await?;
        let row = row.as_deref();
        // A certificate from a tainted key is renewed only by an untainted one: while the
        // active key is itself tainted, renewing would hand out another tainted certificate.
        if let Some(r) = row {
            let tainted = self.tainted.load();
            let active = self.authority.load();
            if tainted.contains(&r.entry.ca_key_id) && tainted.contains(active.key_id()) {
                return Err(Refusal::Policy(Denial {
                    kind: DenialKind::PermissionDenied,
                    reason: "renewal.tainted",
                    message: format!(
                        "the presented certificate was issued under the tainted CA key {} and the \
                         active signing key {} is tainted too; renewal resumes once an operator \
                         activates an untainted key",
                        r.entry.ca_key_id,
                        active.key_id()
                    ),
                }));
            }
        }
        let (entry, node) = match row.and_then(renewal::entry_to_check) {
            Some((entry_id, node_id)) => (
                self.store.entry(&entry_id).await?,
                self.store.node(&node_id).await?,
            ),
            None => (None, None),
        };
        // A node set's entry: the set too, for the membership re-check.
        let node_set = match entry
            .as_ref()
            .and_then(|e| crate::store::node_sets::node_set_name_of_parent(&e.parent_id))
        {
            Some(name) => self.store.node_set(name).await?,
            None => None,
        };
        let facts = EntryFacts {
            entry: entry.as_ref(),
            node: node.as_ref(),
            node_set: node_set.as_ref(),
        };
        renewal::assess(&self.policy, caller, row, facts, now).map_err(Refusal::Policy)
    }

    /// The presented certificate's ledger row: from the short-lived cache, or the store.
    async fn presented_row(
        &self,
        caller: &AuthenticatedCaller,
        serial: &str,
    ) -> Result<Option<Arc<crate::store::LedgerRecord>>, StoreError> {
        let (CallerKind::Mtls { leaf_sha256, .. }
        | CallerKind::Node {
            leaf_sha256: Some(leaf_sha256),
            ..
        }) = caller.kind()
        else {
            return Ok(self
                .store
                .certificate_by_serial(serial)
                .await?
                .map(Arc::new));
        };
        let now = self.clock.now();
        if let Some(row) = self.presented_rows.get(leaf_sha256, now) {
            return Ok(row);
        }
        let row = self
            .store
            .certificate_by_serial(serial)
            .await?
            .map(Arc::new);
        self.presented_rows.put(*leaf_sha256, row.clone(), now);
        Ok(row)
    }

    /// For the node API: the node SVID a node presents must be this CA's record of that node's
    /// identity (in the ledger, this very certificate, not revoked).
    pub async fn check_node_certificate(
        &self,
        caller: &AuthenticatedCaller,
    ) -> Result<(), IssuerError> {
        let CallerKind::Node {
            serial: Some(serial),
            ..
        } = caller.kind()
        else {
            return Err(self.denial(
                caller,
                Refusal::Policy(Denial {
                    kind: DenialKind::InvalidArgument,
                    reason: "policy.renewal",
                    message: "the node API takes the node SVID over mTLS".into(),
                }),
            ));
        };
        let row = self
            .store
            .certificate_by_serial(serial)
            .await
            .map_err(|e| self.denial(caller, Refusal::Store(e)))?;
        renewal::assess_node(caller, row.as_ref())
            .map_err(|d| self.denial(caller, Refusal::Policy(d)))
    }

    /// A refusal, audited (a policy denial) or logged (a store failure, retryable).
    fn denial(&self, caller: &AuthenticatedCaller, refusal: Refusal) -> IssuerError {
        match refusal {
            Refusal::Policy(d) => {
                let invalid = matches!(d.kind, DenialKind::InvalidArgument);
                self.deny(caller, d.reason, d.message, invalid)
            }
            Refusal::Store(e) => IssuerError::Store(e),
        }
    }

    /// Records a refusal in the audit log and turns it into the error the caller gets.
    fn deny(
        &self,
        caller: &AuthenticatedCaller,
        reason: &str,
        message: String,
        invalid_argument: bool,
    ) -> IssuerError {
        self.audit.record(
            if invalid_argument {
                "issue.invalid"
            } else {
                "issue.denied"
            },
            &caller.label(),
            format!("{reason}: {message}"),
            unix(self.clock.now()),
        );
        if invalid_argument {
            IssuerError::Invalid(message)
        } else {
            IssuerError::Denied(message)
        }
    }
}

/// Why a request was refused before signing.
enum Refusal {
    Policy(Denial),
    /// The database could not be read (retryable).
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        Refusal::Store(e)
    }
}

fn merge_names(a: &RequestedNames, b: &RequestedNames) -> RequestedNames {
    fn union<T: Clone + PartialEq>(x: &[T], y: &[T]) -> Vec<T> {
        let mut out = x.to_vec();
        for v in y {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
        out
    }
    RequestedNames {
        uris: union(&a.uris, &b.uris),
        dns_names: union(&a.dns_names, &b.dns_names),
        ip_addresses: union(&a.ip_addresses, &b.ip_addresses),
        emails: union(&a.emails, &b.emails),
        other: union(&a.other, &b.other),
    }
}

#[cfg(test)]
#[path = "issuer_jwt_tests.rs"]
mod jwt_tests;
