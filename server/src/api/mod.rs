//! The API edge: tonic services. Each handler converts its proto to a domain request, calls
//! [`crate::issuer::Issuer`], and converts back. Errors become gRPC statuses here, in
//! [`ApiError`]'s one `From` impl, and nowhere else; the issuer's own [`IssuerError`] becomes an
//! [`ApiError`] here too. The request's metadata is read here ([`credentials`], [`request_id`]):
//! the layers below take plain values.

pub mod admin;
pub(crate) mod bearer;
pub mod ca_admin;
pub mod federation_admin;
pub mod istio;
pub mod ledger_admin;
pub mod native;
pub mod node;
pub mod node_admin;
pub(crate) mod node_watch;
pub(crate) mod registration;
pub mod revocation_admin;

use std::future::Future;
use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Code, Status};

use crate::authn::AuthnError;
use crate::issuer::{Credentials, IssuerError};
use crate::store::StoreError;

/// A server stream of ledger rows (certificates or revocation events) with seq in
/// `(after_seq, up_to_seq]` (`up_to_seq` 0: to the end), read a page at a time by `fetch(after)`
/// (rows in seq order) and sent as they come; a store error ends it with that status. The next
/// page is read while the current one is sent, so the database and the encoder work at the same
/// time. Pages, not rows, cross the channel: the encoder then finds a page's rows ready at once
/// and writes many to the socket per wake-up (one channel send and one wake per row cost the
/// server a fifth of its CPU on `ledger verify`). Bounded: three pages (the one being sent, one
/// queued, one being read), whatever the reader's speed.
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
    use futures::StreamExt as _;
    use futures::future::Either;

    let up_to = if up_to_seq == 0 { u64::MAX } else { up_to_seq };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<R>, Status>>(1);
    tokio::spawn(async move {
        if after_seq >= up_to {
            return;
        }
        let mut fetched = fetch(after_seq).await;
        loop {
            let rows = match fetched {
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
            if last >= up_to {
                let _ = tx.send(Ok(chunk)).await;
                return;
            }
            let (sent, next) = tokio::join!(tx.send(Ok(chunk)), fetch(last));
            if sent.is_err() {
                return;
            }
            fetched = next;
        }
    });
    Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(rx).flat_map(move |page| match page {
            Ok(rows) => Either::Left(futures::stream::iter(
                rows.into_iter().map(move |r| Ok(to_proto(r))),
            )),
            Err(status) => Either::Right(futures::stream::iter([Err(status)])),
        }),
    )
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
    /// It is there already (the message names what): change the request or use what exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// The system is not in a state that allows it; the message says what to do first.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A concurrent change got there first (e.g. an entry changed since it was read): read
    /// again and retry.
    #[error("{0}")]
    Aborted(String),
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
            ApiError::AlreadyExists(_) => "already_exists",
            ApiError::FailedPrecondition(_) => "failed_precondition",
            ApiError::Aborted(_) => "aborted",
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
            ApiError::AlreadyExists(_) => Code::AlreadyExists,
            ApiError::FailedPrecondition(_) => Code::FailedPrecondition,
            ApiError::Aborted(_) => Code::Aborted,
            ApiError::Unavailable(_) => Code::Unavailable,
            ApiError::ResourceExhausted { .. } => Code::ResourceExhausted,
            ApiError::Internal(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

/// Refusals of what the caller sent, by the layer that checks it: each is `InvalidArgument` with
/// the layer's own message.
macro_rules! invalid_argument_from {
    ($($error:ty),+ $(,)?) => {
        $(impl From<$error> for ApiError {
            fn from(e: $error) -> Self {
                ApiError::InvalidArgument(e.to_string())
            }
        })+
    };
}

invalid_argument_from!(
    signet_types::node::NodeIdError,
    crate::nodes::ParentError,
    crate::nodes::EntryError,
    crate::nodes::BatchError,
    crate::revocation::BadSelector,
);

/// The issuer's refusals keep the codes and messages callers have always seen: refusals of the
/// request map one to one; every retryable fault is `Unavailable` with the issuer's message; a
/// store failure maps as everywhere else (see `admin.rs`).
impl From<IssuerError> for ApiError {
    fn from(e: IssuerError) -> Self {
        match e {
            IssuerError::Unauthenticated(e) => ApiError::Unauthenticated(e),
            IssuerError::Invalid(m) => ApiError::InvalidArgument(m),
            IssuerError::Denied(m) => ApiError::PermissionDenied(m),
            IssuerError::RateLimited {
                message,
                retry_after,
            } => ApiError::ResourceExhausted {
                message,
                retry_after,
            },
            e @ (IssuerError::CaNotValid(_)
            | IssuerError::JwtKeyUnavailable(_)
            | IssuerError::LedgerOverloaded
            | IssuerError::NotRecorded(_)) => ApiError::Unavailable(e.to_string()),
            IssuerError::Store(e) => ApiError::from(e),
            IssuerError::Internal { request_id } => ApiError::Internal(request_id),
        }
    }
}

impl From<IssuerError> for Status {
    fn from(e: IssuerError) -> Self {
        Status::from(ApiError::from(e))
    }
}

/// The credentials a request carries: the bearer token of the `authorization` header
/// ([`bearer::from_metadata`]: refused at once unless ASCII) and
/// the client certificate the TLS layer verified.
pub(crate) fn credentials<T>(req: &tonic::Request<T>) -> Result<Credentials, ApiError> {
    let authorization = bearer::from_metadata(req.metadata())?;
    let peer_leaf = req
        .peer_certs()
        .and_then(|certs| certs.first().map(|c| c.as_ref().to_vec()));
    Ok(Credentials {
        authorization,
        peer_leaf,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::LedgerError;

    fn status(e: IssuerError) -> (Code, String) {
        let s = Status::from(e);
        (s.code(), s.message().to_owned())
    }

    #[test]
    fn issuer_errors_keep_their_codes_and_messages() {
        let cases = [
            (
                IssuerError::Unauthenticated(AuthnError::Missing),
                Code::Unauthenticated,
                AuthnError::Missing.to_string(),
            ),
            (
                IssuerError::Invalid("invalid CSR: x".into()),
                Code::InvalidArgument,
                "invalid CSR: x".into(),
            ),
            (
                IssuerError::Denied("no".into()),
                Code::PermissionDenied,
                "no".into(),
            ),
            (
                IssuerError::CaNotValid("expired".into()),
                Code::Unavailable,
                "the CA cannot issue right now: expired".into(),
            ),
            (
                IssuerError::LedgerOverloaded,
                Code::Unavailable,
                "the CA is overloaded (ledger queue full); retry with backoff".into(),
            ),
            (
                IssuerError::NotRecorded(LedgerError::Closed),
                Code::Unavailable,
                "the certificate could not be recorded, so it was not issued; retry later \
                 (ledger writer has stopped)"
                    .into(),
            ),
            (
                IssuerError::Store(StoreError::Unavailable("down".into())),
                Code::Unavailable,
                "down".into(),
            ),
            (
                IssuerError::Store(StoreError::Corrupt("row 3".into())),
                Code::Internal,
                "internal error (see server log, request store)".into(),
            ),
            (
                IssuerError::Internal {
                    request_id: "r1".into(),
                },
                Code::Internal,
                "internal error (see server log, request r1)".into(),
            ),
        ];
        for (e, code, message) in cases {
            let outcome = e.outcome();
            let retryable = e.is_retryable();
            let (c, m) = status(e);
            assert_eq!((c, m.as_str()), (code, message.as_str()));
            assert_eq!(retryable, c == Code::Unavailable, "{m}");
            assert_eq!(outcome == "unavailable", c == Code::Unavailable, "{m}");
        }
    }

    #[test]
    fn a_rate_limit_keeps_its_retry_hint() {
        let s = Status::from(IssuerError::RateLimited {
            message: "slow down".into(),
            retry_after: std::time::Duration::from_millis(1500),
        });
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(s.message(), "slow down");
        assert_eq!(
            s.metadata()
                .get("grpc-retry-pushback-ms")
                .and_then(|v| v.to_str().ok()),
            Some("1500")
        );
    }

    /// The stream reads page after page (the next while the current is sent): every row in
    /// `(after, up_to]` once, in order, and a store error after the rows before it.
    #[tokio::test]
    async fn a_paged_stream_sends_each_row_once_in_order_and_ends_on_an_error() {
        use tokio_stream::StreamExt;
        let run = |after: u64, up_to: u64, fail_after: u64| async move {
            let stream = paged_ledger_stream(
                after,
                up_to,
                move |from: u64| async move {
                    if from >= fail_after {
                        return Err(StoreError::Unavailable("down".into()));
                    }
                    Ok((from + 1..=(from + 3).min(10)).collect::<Vec<u64>>())
                },
                |r: &u64| *r,
                |r: u64| r,
            );
            stream.collect::<Vec<_>>().await
        };
        let ok =
            |v: Vec<Result<u64, Status>>| v.into_iter().map(|r| r.unwrap()).collect::<Vec<_>>();
        assert_eq!(ok(run(0, 0, u64::MAX).await), (1..=10).collect::<Vec<_>>());
        assert_eq!(ok(run(0, 7, u64::MAX).await), (1..=7).collect::<Vec<_>>());
        assert_eq!(ok(run(4, 6, u64::MAX).await), vec![5, 6]);
        assert!(run(7, 7, u64::MAX).await.is_empty());
        let failed = run(0, 0, 6).await;
        assert_eq!(failed.len(), 7, "{failed:?}");
        assert_eq!(failed[6].as_ref().unwrap_err().code(), Code::Unavailable);
        assert_eq!(
            failed[..6]
                .iter()
                .map(|r| *r.as_ref().unwrap())
                .collect::<Vec<_>>(),
            (1..=6).collect::<Vec<_>>()
        );
    }
}
