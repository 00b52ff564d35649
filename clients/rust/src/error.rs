//! [`CallError`]: why one call to a Signet server failed, as every typed client
//! ([`crate::node`], [`crate::ca`]) reports it. It carries what a caller decides on, the
//! [`ErrorClass`] (retry, give up, fix the request), the server's gRPC code and the server's
//! own message, so the agent, the bridge and `signetctl` act on the same answer the same way.
//!
//! An answer the server sent but that does not hold what it must (a certificate that is not an
//! X509-SVID for the ID the answer names, a bundle without roots) is [`CallError::InvalidAnswer`]:
//! refused with a message saying why, never a panic, and classed as retryable, as the server's
//! own `Internal` would be.

use std::time::Duration;

use tonic::Code;

use crate::status::{ErrorClass, retry_pushback};

/// See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The server (or the channel to it) answered with an error status.
    #[error("the server answered {code:?}: {message}")]
    Status {
        code: Code,
        /// The server's message (as sent; may be empty).
        message: String,
        /// The server's `grpc-retry-pushback-ms`, capped ([`retry_pushback`]).
        pushback: Option<Duration>,
    },
    /// The server's answer is malformed; nothing of it was taken.
    #[error("invalid answer from the server: {0}")]
    InvalidAnswer(String),
    /// The request could not be sent as asked (e.g. a token a header cannot carry).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl From<tonic::Status> for CallError {
    fn from(s: tonic::Status) -> Self {
        CallError::Status {
            code: s.code(),
            pushback: retry_pushback(&s),
            message: s.message().to_owned(),
        }
    }
}

impl CallError {
    /// An error status with this code and message, as a per-item result carries it.
    pub fn status(code: Code, message: impl Into<String>) -> Self {
        CallError::Status {
            code,
            message: message.into(),
            pushback: None,
        }
    }

    pub(crate) fn invalid_answer(why: impl Into<String>) -> Self {
        CallError::InvalidAnswer(why.into())
    }

    /// What the caller does about it ([`ErrorClass`]).
    pub fn class(&self) -> ErrorClass {
        match self {
            CallError::Status { code, .. } => ErrorClass::of(*code),
            CallError::InvalidAnswer(_) => ErrorClass::Retryable,
            CallError::InvalidRequest(_) => ErrorClass::Invalid,
        }
    }

    pub fn is_retryable(&self) -> bool {
        self.class().is_retryable()
    }

    /// The gRPC code: the server's, `Internal` for a malformed answer, `InvalidArgument` for a
    /// request that could not be sent.
    pub fn code(&self) -> Code {
        match self {
            CallError::Status { code, .. } => *code,
            CallError::InvalidAnswer(_) => Code::Internal,
            CallError::InvalidRequest(_) => Code::InvalidArgument,
        }
    }

    /// The server's message, or what was wrong with its answer or the request.
    pub fn message(&self) -> &str {
        match self {
            CallError::Status { message, .. } => message,
            CallError::InvalidAnswer(m) | CallError::InvalidRequest(m) => m,
        }
    }

    /// How long the server asked the caller to wait before retrying, if it did.
    pub fn pushback(&self) -> Option<Duration> {
        match self {
            CallError::Status { pushback, .. } => *pushback,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_keeps_its_code_message_class_and_pushback() {
        let mut s = tonic::Status::resource_exhausted("slow down");
        s.metadata_mut()
            .insert("grpc-retry-pushback-ms", "250".parse().unwrap());
        let e = CallError::from(s);
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert_eq!(e.message(), "slow down");
        assert_eq!(e.class(), ErrorClass::Retryable);
        assert_eq!(e.pushback(), Some(Duration::from_millis(250)));
        assert_eq!(
            e.to_string(),
            "the server answered ResourceExhausted: slow down"
        );

        let e = CallError::from(tonic::Status::permission_denied("banned node"));
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(!e.is_retryable());
        assert_eq!(e.message(), "banned node");
    }

    #[test]
    fn a_malformed_answer_is_retryable_and_a_bad_request_invalid() {
        let e = CallError::invalid_answer("no roots");
        assert_eq!(
            (e.class(), e.code()),
            (ErrorClass::Retryable, Code::Internal)
        );
        assert_eq!(e.to_string(), "invalid answer from the server: no roots");
        let e = CallError::InvalidRequest("token".into());
        assert_eq!(
            (e.class(), e.code()),
            (ErrorClass::Invalid, Code::InvalidArgument)
        );
        assert_eq!(e.pushback(), None);
    }
}
