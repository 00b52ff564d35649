//! Who is calling. Produces an [`AuthenticatedCaller`], which only this module can construct,
//! so a handler cannot forget to authenticate.
//!
//! - [`jwt`]: Kubernetes service-account tokens, validated offline against a JWKS.
//! - [`mtls`]: a client certificate already verified by the TLS layer against our bundle.

// Enabled as they land:
pub mod jwt;
pub mod mtls;
pub mod psat;

use signet_types::SpiffeId;

/// The server's own SPIFFE ID path: `spiffe://<td>/signet/server`.
pub const SERVER_PATH: &str = "/signet/server";

/// How the caller proved who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallerKind {
    /// A Kubernetes service-account JWT.
    KubernetesServiceAccount {
        namespace: String,
        service_account: String,
        /// The pod the token was bound to, if any.
        pod: Option<String>,
        /// The node that pod runs on (`kubernetes.io.node.name`), if the token says.
        node: Option<String>,
    },
    /// A Signet X509-SVID presented over mTLS.
    Mtls {
        /// DNS SANs of the presented certificate (renewal may keep them).
        dns_names: Vec<String>,
        /// Serial (lowercase hex) of the presented certificate.
        serial: String,
        /// SHA-256 of the presented certificate's DER: renewal finds it in the ledger by serial
        /// and checks that it is this very certificate.
        leaf_sha256: [u8; 32],
    },
    /// A node agent: over mTLS with its node SVID (`spiffe://<td>/signet/node/<id>`), or
    /// attesting with a one-time join token (then `serial` is None).
    Node {
        node_id: String,
        /// Serial (lowercase hex) of the presented node SVID; None when attesting.
        serial: Option<String>,
        /// SHA-256 of the presented node SVID's DER; None when attesting.
        leaf_sha256: Option<[u8; 32]>,
    },
    /// The operator, over the admin socket.
    Admin,
    /// The server itself, for its own TLS certificate: the only caller that may obtain
    /// `spiffe://<td>/signet/server` and the server's DNS names and addresses.
    Server,
}

/// Proof that a call came in on the admin socket. The only way to make an admin caller
/// ([`AuthenticatedCaller::admin`]), and made only from the bound admin listener
/// ([`AdminSocket::listening_on`], called where the server binds it), so no request path of the
/// network listeners can produce an operator.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdminSocket(());

impl AdminSocket {
    /// The admin listener, bound at `listener`'s path with the socket's owner-only mode.
    pub(crate) fn listening_on(_listener: &tokio::net::UnixListener) -> Self {
        Self(())
    }

    /// For the fuzz bodies only (`crate::fuzzing`), which decide as the operator to reach the
    /// policy checks no other caller reaches; never a request path.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn for_fuzzing() -> Self {
        Self(())
    }
}

/// An authenticated caller. Constructed only by this module's authenticators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedCaller {
    spiffe_id: SpiffeId,
    kind: CallerKind,
}

impl AuthenticatedCaller {
    /// Any caller but the operator, who is made only by [`Self::admin`].
    pub(crate) fn new(spiffe_id: SpiffeId, kind: CallerKind) -> Self {
        debug_assert!(
            !matches!(kind, CallerKind::Admin),
            "an admin caller is made only by AuthenticatedCaller::admin"
        );
        Self { spiffe_id, kind }
    }

    /// The operator on the admin socket (its socket's file mode is the authentication): only
    /// with the [`AdminSocket`] proof the admin listener hands to the admin APIs.
    pub(crate) fn admin(td: &signet_types::TrustDomain, _on: AdminSocket) -> Self {
        Self {
            spiffe_id: Self::admin_id(td),
            kind: CallerKind::Admin,
        }
    }

    /// The operator's label in audit events (`spiffe://<td>/signet/admin`), for what the
    /// operator does that is not an issuance. Names an actor; grants nothing.
    pub(crate) fn admin_label(td: &signet_types::TrustDomain) -> String {
        Self::admin_id(td).to_string()
    }

    fn admin_id(td: &signet_types::TrustDomain) -> SpiffeId {
        td.id("/signet/admin")
            .unwrap_or_else(|_| td.id("").expect("a trust domain ID is valid"))
    }

    /// A node that has just proved itself (join token, or Kubernetes service-account token)
    /// for `node_id`.
    pub(crate) fn attested_node(
        td: &signet_types::TrustDomain,
        node_id: &str,
    ) -> Result<Self, AuthnError> {
        let id = signet_types::node::node_spiffe_id(td, node_id)
            .map_err(|e| AuthnError::BadJoinToken(e.to_string()))?;
        Ok(Self::new(
            id,
            CallerKind::Node {
                node_id: node_id.to_owned(),
                serial: None,
                leaf_sha256: None,
            },
        ))
    }

    /// The server itself, asking for its own TLS certificate.
    pub(crate) fn server(td: &signet_types::TrustDomain) -> Self {
        let id = td
            .id(SERVER_PATH)
            .unwrap_or_else(|_| td.id("").expect("a trust domain ID is valid"));
        Self::new(id, CallerKind::Server)
    }

    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }

    pub fn kind(&self) -> &CallerKind {
        &self.kind
    }

    /// A short label for the ledger and audit log: `jwt:<id>`, `mtls:<id>`, `node:<id>`,
    /// `admin:<id>`.
    pub fn label(&self) -> String {
        let how = match self.kind {
            CallerKind::KubernetesServiceAccount { .. } => "jwt",
            CallerKind::Mtls { .. } => "mtls",
            CallerKind::Node { .. } => "node",
            CallerKind::Admin => "admin",
            CallerKind::Server => "server",
        };
        format!("{how}:{}", self.spiffe_id)
    }

    /// Any caller, the operator included, for unit tests.
    #[cfg(test)]
    pub fn for_tests(spiffe_id: SpiffeId, kind: CallerKind) -> Self {
        Self { spiffe_id, kind }
    }
}

/// Why a caller is not authenticated. Messages are safe to return: they never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthnError {
    #[error(
        "no credentials: send 'authorization: Bearer <service-account token>' or a client certificate"
    )]
    Missing,
    #[error("malformed authorization header: {0}")]
    MalformedHeader(String),
    #[error("service-account token refused: {0}")]
    BadToken(String),
    #[error("client certificate refused: {0}")]
    BadCertificate(String),
    #[error("join token refused: {0}")]
    BadJoinToken(String),
    #[error("token authentication is not configured on this server ([auth.kubernetes])")]
    JwtNotConfigured,
}
