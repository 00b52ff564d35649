//! What a caller does about a failed call: the one classification of gRPC statuses that the
//! agent, the bridge and `signetctl` share, so the same answer from the server means the same
//! thing to every client.
//!
//! - [`ErrorClass::Retryable`]: the server or the path to it is busy or down, or the
//!   credential may be fresh next time (a projected token is rotated by the kubelet, the
//!   server refreshes its JWKS, an agent re-attests): retry with backoff, honouring
//!   [`retry_pushback`].
//! - [`ErrorClass::Permanent`]: the server decided (not allowed, no such entry, banned node,
//!   not implemented): the same request will get the same answer.
//! - [`ErrorClass::Invalid`]: the request itself is malformed: fix the request.

use std::time::Duration;

use tonic::Code;

/// See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    Retryable,
    Permanent,
    Invalid,
}

impl ErrorClass {
    /// The class of an answer with this code.
    pub fn of(code: Code) -> Self {
        match code {
            Code::InvalidArgument | Code::OutOfRange => Self::Invalid,
            Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::NotFound
            | Code::AlreadyExists
            | Code::Unimplemented => Self::Permanent,
            Code::Unauthenticated
            | Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Cancelled
            | Code::Internal
            | Code::Unknown
            | Code::DataLoss
            | Code::Ok => Self::Retryable,
        }
    }

    /// The class of `status`.
    pub fn of_status(status: &tonic::Status) -> Self {
        Self::of(status.code())
    }

    pub fn is_retryable(self) -> bool {
        self == Self::Retryable
    }
}

/// Longest wait a server's pushback is taken for (a hostile or broken value is capped).
pub const MAX_PUSHBACK: Duration = Duration::from_secs(300);

/// The server's `grpc-retry-pushback-ms` (gRFC A6), which Signet sends with
/// `ResourceExhausted` when a rate limit sheds a call: wait at least this long before
/// retrying. `None` when absent or not a number; capped at [`MAX_PUSHBACK`].
pub fn retry_pushback(status: &tonic::Status) -> Option<Duration> {
    let ms: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms).min(MAX_PUSHBACK))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_the_class_its_meaning_gives() {
        use ErrorClass::*;
        let cases = [
            (Code::Ok, Retryable),
            (Code::Cancelled, Retryable),
            (Code::Unknown, Retryable),
            (Code::InvalidArgument, Invalid),
            (Code::DeadlineExceeded, Retryable),
            (Code::NotFound, Permanent),
            (Code::AlreadyExists, Permanent),
            (Code::PermissionDenied, Permanent),
            (Code::ResourceExhausted, Retryable),
            (Code::FailedPrecondition, Permanent),
            (Code::Aborted, Retryable),
            (Code::OutOfRange, Invalid),
            (Code::Unimplemented, Permanent),
            (Code::Internal, Retryable),
            (Code::Unavailable, Retryable),
            (Code::DataLoss, Retryable),
            (Code::Unauthenticated, Retryable),
        ];
        for (code, class) in cases {
            assert_eq!(ErrorClass::of(code), class, "{code:?}");
        }
    }

    #[test]
    fn pushback_is_read_capped_and_ignored_when_malformed() {
        let mut s = tonic::Status::resource_exhausted("slow down");
        assert_eq!(retry_pushback(&s), None);
        s.metadata_mut()
            .insert("grpc-retry-pushback-ms", "250".parse().unwrap());
        assert_eq!(retry_pushback(&s), Some(Duration::from_millis(250)));
        s.metadata_mut()
            .insert("grpc-retry-pushback-ms", "99999999999".parse().unwrap());
        assert_eq!(retry_pushback(&s), Some(MAX_PUSHBACK));
        s.metadata_mut()
            .insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
        assert_eq!(retry_pushback(&s), None);
    }
}
