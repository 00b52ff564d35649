//! Why the Workload API refuses a request ([`WorkloadError`]), and the one place that becomes a
//! gRPC status (`impl From<WorkloadError> for Status`), as the server's `api` module does.
//!
//! The codes are those the SPIFFE Workload API standard gives: a request without the
//! `workload.spiffe.io: true` header is InvalidArgument; a caller that cannot be attested, or
//! that is entitled to no identity, PermissionDenied; a caller whose attestation needs a
//! service that did not answer (the kubelet) Unavailable, so clients retry. The JWT profile:
//! a request without an audience, or a token that is not valid, InvalidArgument (with the
//! reason); a SPIFFE ID the caller is not entitled to, PermissionDenied; a token the server
//! cannot mint now, Unavailable (a refusal keeps the server's code). And why a socket cannot
//! be served ([`ListenError`]).

use std::io;
use std::path::PathBuf;

use tonic::{Code, Status};

use crate::attest::AttestError;
use crate::ca::CaError;
use crate::jwt_cache::JwtCacheError;
use signet_pki::jwt::JwtSvidError;

/// Why a Workload API request (or an open stream's next update) is refused.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The request lacks the metadata `workload.spiffe.io: true`.
    #[error("security header workload.spiffe.io: true is missing")]
    MissingHeader,
    /// The connection carries no peer credentials (it did not come through the agent's
    /// listener).
    #[error("caller could not be attested")]
    NoPeer,
    /// The caller's process could not be attested: it exited, its pid was reused, it runs
    /// another executable, or it could not be read.
    #[error("caller could not be attested: {0}")]
    NotAttested(AttestError),
    /// Attesting the caller needs a service that did not answer (the kubelet); worth a retry.
    #[error("caller could not be attested: {0}; retry")]
    AttestationUnavailable(AttestError),
    /// The caller, as attested now, is entitled to no identity.
    #[error("no identity issued")]
    NoIdentity,
    /// A profile the agent does not serve (what: "JWT-SVIDs", "JWT bundles").
    #[error("{0} are not supported")]
    Unsupported(&'static str),
    /// A JWT request without an audience.
    #[error("audience must be specified")]
    NoAudience,
    /// A JWT request whose audiences break a bound (what it breaks).
    #[error("audience: {0}")]
    BadAudience(String),
    /// `FetchJWTSVID`'s `spiffe_id` is not a SPIFFE ID.
    #[error("spiffe_id {value}: {reason}")]
    BadSpiffeId { value: String, reason: String },
    /// `FetchJWTSVID` names a SPIFFE ID the caller, as attested now, is not entitled to.
    #[error("no identity issued for {0}")]
    NotEntitled(String),
    /// `ValidateJWTSVID` without a token.
    #[error("svid must be specified")]
    NoToken,
    /// `ValidateJWTSVID`: the token is not a valid JWT-SVID for the audience.
    #[error("the JWT-SVID is not valid: {0}")]
    InvalidToken(JwtSvidError),
    /// `ValidateJWTSVID`: the token names a trust domain the agent has no JWT keys for.
    #[error("the JWT-SVID is not valid: no keys for trust domain {0}")]
    ForeignTrustDomain(String),
    /// No JWT-SVID could be had from the server (nor from the cache).
    #[error("{0}")]
    Jwt(JwtCacheError),
    /// SDS: the first request of a stream carries no node.
    #[error("SDS: the first DiscoveryRequest of a stream must carry the node")]
    SdsNoNode,
    /// SDS: a request for another resource type.
    #[error(
        "SDS: type_url {0} is not served; this server serves only \
         type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    )]
    SdsTypeUrl(String),
    /// SDS: more resource names than one request may carry.
    #[error("SDS: {0} resource names in one request; at most 256")]
    SdsTooManyNames(usize),
    /// SDS: names that are not served to the caller, as attested now (quoted, at most five).
    #[error(
        "SDS: not served to this caller: {0}; the names are default, ROOTCA, ALL (or their \
         configured names), spiffe://<trust domain>, and the caller's own SPIFFE IDs"
    )]
    SdsNotServed(String),
    /// SDS: `ALL` in the `trusted_ca` form with more than one trust domain.
    #[error(
        "SDS: ALL with more than one trust domain needs Envoy's SPIFFE certificate validator \
         (Envoy 1.18 or later, without disable_spiffe_cert_validation)"
    )]
    SdsAllNeedsSpiffeValidator,
    /// SDS: a stream that sent no request in time.
    #[error("SDS: no DiscoveryRequest within {0:?} of opening the stream")]
    SdsNoFirstRequest(std::time::Duration),
    /// SDS: the stream caps are reached (which one).
    #[error(
        "SDS: {0} open streams reached (workload_api.sds.max_streams / max_streams_per_uid); \
         close a stream or raise the cap"
    )]
    SdsStreamCap(&'static str),
}

impl From<AttestError> for WorkloadError {
    fn from(e: AttestError) -> Self {
        match e {
            AttestError::Process(_) => WorkloadError::NotAttested(e),
            AttestError::Kubernetes(_) => WorkloadError::AttestationUnavailable(e),
        }
    }
}

impl WorkloadError {
    /// The gRPC code clients see.
    pub fn code(&self) -> Code {
        match self {
            WorkloadError::MissingHeader => Code::InvalidArgument,
            WorkloadError::NoPeer | WorkloadError::NotAttested(_) | WorkloadError::NoIdentity => {
                Code::PermissionDenied
            }
            WorkloadError::AttestationUnavailable(_) => Code::Unavailable,
            WorkloadError::Unsupported(_) => Code::Unimplemented,
            WorkloadError::NoAudience
            | WorkloadError::BadAudience(_)
            | WorkloadError::BadSpiffeId { .. }
            | WorkloadError::NoToken
            | WorkloadError::InvalidToken(_)
            | WorkloadError::ForeignTrustDomain(_) => Code::InvalidArgument,
            WorkloadError::NotEntitled(_) => Code::PermissionDenied,
            WorkloadError::Jwt(JwtCacheError::Mint { source, .. }) => match source {
                CaError::Unavailable(_) | CaError::Busy { .. } => Code::Unavailable,
                // The server's own refusal (the entry is gone: PermissionDenied, …), but never
                // a success code for a failure.
                CaError::Refused { code, .. } if *code != Code::Ok => *code,
                CaError::Refused { .. } | CaError::Invalid(_) => Code::Internal,
            },
            WorkloadError::Jwt(JwtCacheError::BadToken { .. }) => Code::Internal,
            WorkloadError::Jwt(JwtCacheError::Limited { .. }) => Code::ResourceExhausted,
            WorkloadError::SdsNoNode
            | WorkloadError::SdsTypeUrl(_)
            | WorkloadError::SdsTooManyNames(_) => Code::InvalidArgument,
            WorkloadError::SdsNotServed(_) => Code::PermissionDenied,
            WorkloadError::SdsAllNeedsSpiffeValidator => Code::FailedPrecondition,
            WorkloadError::SdsNoFirstRequest(_) => Code::DeadlineExceeded,
            WorkloadError::SdsStreamCap(_) => Code::ResourceExhausted,
        }
    }
}

impl From<WorkloadError> for Status {
    fn from(e: WorkloadError) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

/// Why the Workload API socket cannot be bound or served.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("workload API socket {0}: {1}")]
    Socket(PathBuf, io::Error),
    #[error("workload API socket {0}: a file that is not a socket is in the way")]
    NotASocket(PathBuf),
    #[error("socket_group {value:?}: {}: {source}", path.display())]
    GroupFile {
        value: String,
        path: PathBuf,
        source: io::Error,
    },
    #[error("socket_group {value:?}: no such group in {}", path.display())]
    NoSuchGroup { value: String, path: PathBuf },
    #[error("workload API server: {0}")]
    Serve(#[source] tonic::transport::Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::{K8sError, ProcessError};

    #[test]
    fn each_refusal_has_the_standards_code_and_todays_message() {
        let process = AttestError::Process(ProcessError::Gone(4242));
        let kubelet = AttestError::Kubernetes(K8sError("connect: refused".into()));
        let cases = [
            (
                WorkloadError::MissingHeader,
                Code::InvalidArgument,
                "security header workload.spiffe.io: true is missing".to_owned(),
            ),
            (
                WorkloadError::NoPeer,
                Code::PermissionDenied,
                "caller could not be attested".to_owned(),
            ),
            (
                WorkloadError::from(process.clone()),
                Code::PermissionDenied,
                format!("caller could not be attested: {process}"),
            ),
            (
                WorkloadError::from(kubelet.clone()),
                Code::Unavailable,
                format!("caller could not be attested: {kubelet}; retry"),
            ),
            (
                WorkloadError::NoIdentity,
                Code::PermissionDenied,
                "no identity issued".to_owned(),
            ),
            (
                WorkloadError::Unsupported("JWT-SVIDs"),
                Code::Unimplemented,
                "JWT-SVIDs are not supported".to_owned(),
            ),
            (
                WorkloadError::NoAudience,
                Code::InvalidArgument,
                "audience must be specified".to_owned(),
            ),
            (
                WorkloadError::NoToken,
                Code::InvalidArgument,
                "svid must be specified".to_owned(),
            ),
            (
                WorkloadError::NotEntitled("spiffe://example.org/db".into()),
                Code::PermissionDenied,
                "no identity issued for spiffe://example.org/db".to_owned(),
            ),
            (
                WorkloadError::InvalidToken(JwtSvidError::Expired),
                Code::InvalidArgument,
                "the JWT-SVID is not valid: the token has expired".to_owned(),
            ),
            (
                WorkloadError::Jwt(JwtCacheError::Mint {
                    spiffe_id: "spiffe://example.org/web".into(),
                    source: CaError::Unavailable("connection refused".into()),
                }),
                Code::Unavailable,
                "JWT-SVID for spiffe://example.org/web: CA unavailable: connection refused"
                    .to_owned(),
            ),
            (
                WorkloadError::Jwt(JwtCacheError::Mint {
                    spiffe_id: "spiffe://example.org/web".into(),
                    source: CaError::Refused {
                        code: Code::PermissionDenied,
                        message: "entry deleted".into(),
                    },
                }),
                Code::PermissionDenied,
                "JWT-SVID for spiffe://example.org/web: CA refused (PermissionDenied): entry \
                 deleted"
                    .to_owned(),
            ),
        ];
        for (e, code, message) in cases {
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, message.as_str()));
        }
    }
}
