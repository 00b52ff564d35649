//! Node attestation: how an agent proves which node it runs on and gets its node SVID. The
//! protocol lives here, over plain values; the tonic handler (`api/node.rs`) only reads the
//! request and converts the outcome into a status.
//!
//! - **Join token**: the token is the credential (no bearer, no client certificate needed). It
//!   is consumed atomically before anything is issued, so two agents racing with one token
//!   cannot both attest; the node ID comes from the token. A malformed CSR is refused before the
//!   token is spent, and a retryable failure after it ([`IssuerError::is_retryable`]) gives the
//!   token back so the agent can retry with it; any other refusal keeps it spent. A token that
//!   names a banned node is refused (PermissionDenied, [`banned_token_refusal`]) before it is
//!   spent, in the store's consuming transaction, so it attests once the node is unbanned.
//!   The token is
//!   never logged, returned or stored: only its hash (a prefix of it identifies it in the audit
//!   log).
//! - **Kubernetes** (`[nodes.kubernetes]`): the agent's projected service-account token in
//!   `authorization: Bearer`, validated offline by [`crate::authn::psat`]; the node ID is
//!   `k8s-<node name>`; re-attesting is rate limited per node.
//!
//! Either way a banned node is refused, the node identity goes through the issuer (policy, CA
//! core, ledger commit) with a node-attestation grant source, and the node is recorded.

use std::sync::Arc;

use crate::audit::AuditLog;
use crate::authn::jwt::Bearer;
use crate::authn::psat::{PsatAttestor, PsatRefusal};
use crate::authn::{AuthenticatedCaller, AuthnError};
use crate::ca::IssuedCert;
use crate::ca::csr::VerifiedCsr;
use crate::clock::unix;
use crate::issuer::{IssueInput, Issuer, IssuerError};
use crate::nodes::JoinToken;
use crate::policy::GrantSource;
use crate::store::nodes::{ATTESTATION_JOIN_TOKEN, ATTESTATION_K8S_PSAT};
use crate::store::{NodeRow, NodeStore, TokenUse};

/// One attestation request, as the API edge hands it over.
#[derive(Clone, Copy)]
pub struct AttestInput<'a> {
    /// The join token (empty: none sent).
    pub join_token: &'a str,
    /// The bearer token the API edge read from `authorization`, if that header was sent.
    pub authorization: Option<&'a Bearer>,
    /// PEM or DER CSR for the node SVID.
    pub csr: &'a [u8],
}

impl std::fmt::Debug for AttestInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttestInput")
            .field("join_token", &(!self.join_token.is_empty()).then_some("…"))
            .field("authorization", &self.authorization.map(|_| "…"))
            .field("csr", &self.csr.len())
            .finish()
    }
}

/// Which credential an attestation carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential<'a> {
    JoinToken(&'a str),
    /// The `authorization` header (a projected service-account token as a bearer token).
    ServiceAccount(&'a Bearer),
}

/// The credential to attest with: exactly one of a join token and a bearer token.
pub fn credential<'a>(input: &AttestInput<'a>) -> Result<Credential<'a>, IssuerError> {
    match (input.authorization, input.join_token.is_empty()) {
        (Some(_), false) => Err(IssuerError::Invalid(
            "send a join token or a service-account token (authorization: Bearer), not both".into(),
        )),
        (Some(bearer), true) => Ok(Credential::ServiceAccount(bearer)),
        (None, false) => Ok(Credential::JoinToken(input.join_token)),
        (None, true) => Err(IssuerError::Unauthenticated(AuthnError::BadJoinToken(
            "no join token: create one with `signetctl token create` (or, in Kubernetes, \
             send the agent's projected service-account token as authorization: Bearer)"
                .into(),
        ))),
    }
}

/// Why a join token naming a banned node was refused (PermissionDenied): the node, that the
/// token was not spent, and the command that lifts the ban. Agents show it as it is.
pub fn banned_token_refusal(node_id: &str) -> String {
    format!(
        "node {node_id} is banned: attestation refused; the join token was not used and stays \
         valid until it expires. To let the node attest, an operator runs `signetctl node \
         unban {node_id}`"
    )
}

/// The node a consumed join token attests, or why the token was refused.
pub fn token_outcome(used: TokenUse) -> Result<String, AuthnError> {
    let why = match used {
        TokenUse::Consumed { node_id } => return Ok(node_id),
        TokenUse::NodeBanned { node_id } => {
            return Err(AuthnError::BadJoinToken(banned_token_refusal(&node_id)));
        }
        TokenUse::AlreadyUsed => "it has already been used (a join token attests once)",
        TokenUse::Expired => "it has expired",
        TokenUse::Unknown => "it is not known to this CA",
    };
    Err(AuthnError::BadJoinToken(format!(
        "{why}; create a new one with `signetctl token create`"
    )))
}

/// Why `node` may get nothing, if it may not: banned, or (`unknown_refused`) not attested.
pub fn node_refusal(
    node_id: &str,
    node: Option<&NodeRow>,
    unknown_refused: bool,
) -> Option<String> {
    match node {
        Some(n) if n.banned_at.is_some() => Some(format!(
            "node {node_id} is banned; it can renew nothing and sign nothing"
        )),
        Some(_) => None,
        None if unknown_refused => Some(format!(
            "node {node_id} is not attested (unknown to this CA)"
        )),
        None => None,
    }
}

/// The attestation protocol over the issuer and the store.
pub struct Attestation {
    issuer: Arc<Issuer>,
    store: Arc<dyn NodeStore>,
    psat: Option<PsatAttestor>,
}

impl std::fmt::Debug for Attestation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attestation")
            .field("kubernetes", &self.psat.is_some())
            .finish_non_exhaustive()
    }
}

impl Attestation {
    pub fn new(issuer: Arc<Issuer>, store: Arc<dyn NodeStore>) -> Self {
        Self {
            issuer,
            store,
            psat: None,
        }
    }

    /// Accepts Kubernetes projected service-account tokens.
    pub fn with_kubernetes(mut self, psat: PsatAttestor) -> Self {
        self.psat = Some(psat);
        self
    }

    fn audit(&self) -> &AuditLog {
        self.issuer.audit()
    }

    fn record(&self, kind: &str, caller: &str, detail: String) {
        self.audit()
            .record(kind, caller, detail, unix(self.issuer.now()));
    }

    /// Attests a node: returns its node ID and its node SVID (committed to the ledger).
    pub async fn attest(
        &self,
        input: AttestInput<'_>,
        request_id: String,
    ) -> Result<(String, IssuedCert), IssuerError> {
        let credential = credential(&input).inspect_err(|e| {
            if let IssuerError::Unauthenticated(a) = e {
                self.record("authn.refused", "anonymous", a.to_string());
            }
        })?;
        match credential {
            Credential::ServiceAccount(bearer) => {
                self.attest_with_token(bearer, input.csr, request_id).await
            }
            Credential::JoinToken(token) => {
                self.attest_with_join_token(token, input.csr, request_id)
                    .await
            }
        }
    }

    async fn attest_with_join_token(
        &self,
        token: &str,
        csr: &[u8],
        request_id: String,
    ) -> Result<(String, IssuedCert), IssuerError> {
        let token = JoinToken::parse(token).map_err(|m| {
            let e = AuthnError::BadJoinToken(m.to_string());
            self.record("authn.refused", "anonymous", e.to_string());
            IssuerError::Unauthenticated(e)
        })?;
        // A malformed CSR should not burn the token.
        VerifiedCsr::parse(csr).map_err(|e| IssuerError::Invalid(format!("invalid CSR: {e}")))?;

        let hash = token.hash();
        let used_at = unix(self.issuer.now());
        let used = self.store.consume_join_token(&hash, used_at).await?;
        if let TokenUse::NodeBanned { node_id } = &used {
            // Refused before the token was spent (in the store's transaction): it still
            // attests once the operator lifts the ban.
            let msg = banned_token_refusal(node_id);
            let caller = AuthenticatedCaller::attested_node(self.issuer.trust_domain(), node_id)
                .map(|c| c.label())
                .unwrap_or_else(|_| "anonymous".to_owned());
            self.record(
                "node.denied",
                &caller,
                format!("{msg} (token hash {}…)", hash.get(..12).unwrap_or_default()),
            );
            return Err(IssuerError::Denied(msg));
        }
        let node_id = token_outcome(used).map_err(|e| {
            // The hash prefix identifies the token in the audit log without revealing it.
            self.record(
                "authn.refused",
                "anonymous",
                format!("{e} (token hash {}…)", hash.get(..12).unwrap_or_default()),
            );
            IssuerError::Unauthenticated(e)
        })?;
        match self
            .attest_node(
                &node_id,
                csr,
                request_id,
                "a join token",
                ATTESTATION_JOIN_TOKEN,
                crate::node_sets::join_token_selectors(&node_id),
            )
            .await
        {
            Ok(cert) => Ok((node_id, cert)),
            Err(e) => {
                if e.is_retryable()
                    && let Err(re) = self.store.release_join_token(&hash, used_at).await
                {
                    tracing::warn!(error = %re, node_id = %node_id, "could not release the join token after a failed attestation");
                }
                Err(e)
            }
        }
    }

    /// Attestation with a Kubernetes projected service-account token: validated offline, an
    /// allowed service account, bound to a node; the node ID comes from the node's name.
    async fn attest_with_token(
        &self,
        bearer: &Bearer,
        csr: &[u8],
        request_id: String,
    ) -> Result<(String, IssuedCert), IssuerError> {
        let refuse = |e: AuthnError| {
            self.record(
                "authn.refused",
                "anonymous",
                format!("node attestation: {e}"),
            );
            IssuerError::Unauthenticated(e)
        };
        let Some(psat) = &self.psat else {
            return Err(refuse(AuthnError::BadToken(
                "Kubernetes node attestation is not configured on this server \
                 ([nodes.kubernetes]); attest with a join token"
                    .into(),
            )));
        };
        let token = bearer.token().map_err(refuse)?;
        VerifiedCsr::parse(csr).map_err(|e| IssuerError::Invalid(format!("invalid CSR: {e}")))?;
        let node = match psat.attest(self.issuer.jwt(), token, self.issuer.now()) {
            Ok(node) => node,
            Err(PsatRefusal::Unauthenticated(e)) => return Err(refuse(e)),
            Err(PsatRefusal::Denied { caller, reason }) => {
                let message = reason.to_string();
                self.record("node.denied", &caller, message.clone());
                return Err(IssuerError::Denied(message));
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
            .attest_node(
                &node.node_id,
                csr,
                request_id,
                &how,
                ATTESTATION_K8S_PSAT,
                node.selectors,
            )
            .await?;
        Ok((node.node_id, cert))
    }

    /// After the credential was checked (a join token consumed): refuses a banned node,
    /// issues the node identity through the issuer (policy, CA, ledger) and records the node
    /// with the node `selectors` its attestation proved (replacing any earlier ones).
    async fn attest_node(
        &self,
        node_id: &str,
        csr: &[u8],
        request_id: String,
        how: &str,
        attestation: &str,
        selectors: Vec<String>,
    ) -> Result<IssuedCert, IssuerError> {
        let caller = AuthenticatedCaller::attested_node(self.issuer.trust_domain(), node_id)?;
        let existing = self.store.node(node_id).await?;
        if let Some(msg) = node_refusal(node_id, existing.as_ref(), false) {
            self.record("node.denied", &caller.label(), msg.clone());
            return Err(IssuerError::Denied(msg));
        }
        if let Some(msg) = method_refusal(node_id, existing.as_ref(), attestation, how) {
            self.record("node.denied", &caller.label(), msg.clone());
            return Err(IssuerError::Denied(msg));
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
                attested_at: unix(self.issuer.now()),
                banned_at: None,
                last_serial: cert.serial.clone(),
                not_after: unix(cert.not_after),
                attestation: attestation.to_owned(),
                selectors,
            })
            .await?;
        self.record(
            "node.attested",
            &caller.label(),
            format!("node {node_id} attested with {how}; serial {}", cert.serial),
        );
        Ok(cert)
    }
}

/// A node ID keeps the attestation method it was first attested with: another method taking
/// it over would inherit the node's row, and with it the node sets its own attestation never
/// proved (review finding F2 of issue 29).
fn method_refusal(
    node_id: &str,
    existing: Option<&NodeRow>,
    attestation: &str,
    how: &str,
) -> Option<String> {
    let prev = existing.filter(|n| n.attestation != attestation)?;
    Some(format!(
        "node {node_id} was attested by {}; it cannot attest by {how}: a node ID keeps its \
         attestation method (use another node ID)",
        prev.attestation
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_id_keeps_its_attestation_method() {
        let row = NodeRow {
            node_id: "k8s-n1".into(),
            spiffe_id: "spiffe://example.org/signet/node/k8s-n1".into(),
            attested_at: 1,
            banned_at: None,
            last_serial: "01".into(),
            not_after: 2,
            attestation: "k8s_psat".into(),
            selectors: Vec::new(),
        };
        assert_eq!(
            method_refusal("k8s-n1", Some(&row), "k8s_psat", "a token"),
            None
        );
        assert_eq!(
            method_refusal("k8s-n1", None, ATTESTATION_JOIN_TOKEN, "a join token"),
            None
        );
        let msg = method_refusal("k8s-n1", Some(&row), ATTESTATION_JOIN_TOKEN, "a join token")
            .expect("refused");
        assert!(msg.contains("was attested by k8s_psat"), "{msg}");
    }

    fn input<'a>(join_token: &'a str, authorization: Option<&'a Bearer>) -> AttestInput<'a> {
        AttestInput {
            join_token,
            authorization,
            csr: b"",
        }
    }

    #[test]
    fn exactly_one_credential() {
        let bearer = Bearer::new(Ok("x"));
        assert_eq!(
            credential(&input("tok", None)).ok(),
            Some(Credential::JoinToken("tok"))
        );
        assert_eq!(
            credential(&input("", Some(&bearer))).ok(),
            Some(Credential::ServiceAccount(&bearer))
        );
        assert!(matches!(
            credential(&input("tok", Some(&bearer))),
            Err(IssuerError::Invalid(m)) if m.contains("not both")
        ));
        assert!(matches!(
            credential(&input("", None)),
            Err(IssuerError::Unauthenticated(AuthnError::BadJoinToken(m))) if m.contains("signetctl token create")
        ));
    }

    #[test]
    fn a_banned_nodes_token_refusal_names_the_node_the_unspent_token_and_the_unban() {
        let msg = banned_token_refusal("vm-7");
        assert!(msg.starts_with("node vm-7 is banned"), "{msg}");
        assert!(msg.contains("join token was not used"), "{msg}");
        assert!(msg.contains("signetctl node unban vm-7"), "{msg}");
    }

    #[test]
    fn token_outcomes() {
        assert_eq!(
            token_outcome(TokenUse::Consumed {
                node_id: "n1".into()
            })
            .ok(),
            Some("n1".into())
        );
        for (used, why) in [
            (TokenUse::AlreadyUsed, "already been used"),
            (TokenUse::Expired, "expired"),
            (TokenUse::Unknown, "not known"),
        ] {
            let e = token_outcome(used).expect_err("refused");
            assert!(matches!(e, AuthnError::BadJoinToken(_)));
            assert!(e.to_string().contains(why), "{e}");
        }
    }

    #[test]
    fn banned_and_unknown_nodes() {
        let mut row = NodeRow {
            node_id: "n1".into(),
            spiffe_id: "spiffe://example.org/signet/node/n1".into(),
            attested_at: 1,
            banned_at: None,
            last_serial: "01".into(),
            not_after: 2,
            attestation: ATTESTATION_JOIN_TOKEN.into(),
            selectors: Vec::new(),
        };
        assert_eq!(node_refusal("n1", Some(&row), true), None);
        assert_eq!(node_refusal("n1", None, false), None);
        assert!(node_refusal("n1", None, true).is_some_and(|m| m.contains("not attested")));
        row.banned_at = Some(3);
        for unknown_refused in [true, false] {
            assert!(
                node_refusal("n1", Some(&row), unknown_refused)
                    .is_some_and(|m| m.contains("is banned"))
            );
        }
    }

    #[test]
    fn debug_hides_the_credentials() {
        let bearer = Bearer::new(Ok("secret-jwt"));
        let s = format!("{:?}", input("secret-token", Some(&bearer)));
        assert!(!s.contains("secret"), "{s}");
    }
}
