//! The API edge: tonic services. Each handler converts its proto to a domain request, calls
//! [`crate::issuer::Issuer`], and converts back. Errors become gRPC statuses here, in
//! [`ApiError`]'s one `From` impl, and nowhere else.

pub mod admin;
pub(crate) mod bearer;
pub mod ca_admin;
pub mod istio;
pub mod ledger_admin;
pub mod native;
pub mod node;
pub mod node_admin;
pub mod revocation_admin;

use std::future::Future;
use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Code, Status};

use crate::authn::AuthnError;
use crate::store::StoreError;

/// A server stream of ledger rows (certificates or revocation events) with seq in
/// `(after_seq, up_to_seq]` (`up_to_seq` 0: to the end), read a page at a time by `fetch(after)`
/// (rows in seq order) and sent as they come; a store error ends it with that status. Bounded:
/// at most a few messages are buffered ahead of a slow reader.
pub(crate) fn paged_ledger_stream<R, T, F, Fut>(
    after_seq: u64,
    up_to_seq: u64,
    fetch: F,
    seq_of: fn(&R) -> u64,
    to_proto: fn(R) -> T,
) -> Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>
where
    R: Send + 'static,
    T: Send + 'static,
    F: Fn(u64) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Vec<R>, StoreError>> + Send,
{
    let up_to = if up_to_seq == 0 { u64::MAX } else { up_to_seq };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut after = after_seq;
        while after < up_to {
            let rows = match fetch(after).await {
                Ok(rows) => rows,
                Err(e) => {
                    let _ = tx.send(Err(Status::from(ApiError::from(e)))).await;
                    return;
                }
            };
            let chunk: Vec<R> = rows.into_iter().filter(|r| seq_of(r) <= up_to).collect();
            let Some(last) = chunk.last().map(seq_of) else {
                return;
            };
            for row in chunk {
                if tx.send(Ok(to_proto(row))).await.is_err() {
                    return;
                }
            }
            after = last;
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Everything a request can fail with, by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed or hostile input: fix the request.
    #[error("{0}")]
    InvalidArgument(String),
    /// No or bad credentials.
    #[error("{0}")]
    Unauthenticated(#[from] AuthnError),
    /// Authenticated, but not allowed.
    #[error("{0}")]
    PermissionDenied(String),
    /// Not there.
    #[error("{0}")]
    NotFound(String),
    /// The system is not in a state that allows it; the message says what to do first.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Retry later (database down, queue full, CA not valid now).
    #[error("{0}")]
    Unavailable(String),
    /// A rate limit or cap: retry after the hint (also sent as `grpc-retry-pushback-ms`).
    #[error("{message}")]
    ResourceExhausted {
        message: String,
        retry_after: std::time::Duration,
    },
    /// Our bug or an operator problem; details are logged, not returned.
    #[error("internal error (see server log, request {0})")]
    Internal(String),
}

impl ApiError {
    /// Short outcome label for metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            ApiError::InvalidArgument(_) => "invalid_argument",
            ApiError::Unauthenticated(_) => "unauthenticated",
            ApiError::PermissionDenied(_) => "permission_denied",
            ApiError::NotFound(_) => "not_found",
            ApiError::FailedPrecondition(_) => "failed_precondition",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::ResourceExhausted { .. } => "resource_exhausted",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        if let ApiError::ResourceExhausted {
            message,
            retry_after,
        } = e
        {
            return crate::limits::resource_exhausted(message, retry_after);
        }
        let code = match &e {
            ApiError::InvalidArgument(_) => Code::InvalidArgument,
            ApiError::Unauthenticated(_) => Code::Unauthenticated,
            ApiError::PermissionDenied(_) => Code::PermissionDenied,
            ApiError::NotFound(_) => Code::NotFound,
            ApiError::FailedPrecondition(_) => Code::FailedPrecondition,
            ApiError::Unavailable(_) => Code::Unavailable,
            ApiError::ResourceExhausted { .. } => Code::ResourceExhausted,
            ApiError::Internal(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

/// Store failures reach the caller through [`ApiError`] too (see `admin.rs` for the mapping).
impl From<crate::store::StoreError> for Status {
    fn from(e: crate::store::StoreError) -> Self {
        Status::from(ApiError::from(e))
    }
}

/// Refuses a decoded request larger than the configured limit (tonic's own transport limit
/// is set higher, so that the caller gets this clear InvalidArgument instead of OutOfRange).
pub fn check_size(msg: &impl prost::Message, limit: usize) -> Result<(), ApiError> {
    let len = msg.encoded_len();
    if len > limit {
        return Err(ApiError::InvalidArgument(format!(
            "request is {len} bytes; this server accepts at most {limit} bytes (max_message_bytes)"
        )));
    }
    Ok(())
}

/// The request's id: the caller's `x-request-id` if it is short and printable, else a new
/// random one.
pub fn request_id<T>(req: &tonic::Request<T>) -> String {
    if let Some(v) = req
        .metadata()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        && !v.is_empty()
        && v.len() <= 64
        && v.bytes().all(|b| b.is_ascii_graphic())
    {
        return v.to_owned();
    }
    let mut b = [0u8; 12];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        return "unknown".into();
    }
    hex::encode(b)
}
