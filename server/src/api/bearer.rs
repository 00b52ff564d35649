//! The `authorization` header, read at the API edge: `authorization: Bearer <token>`.
//!
//! Every handler that takes a service-account token reads it here (through
//! [`crate::issuer::Credentials::from_request`]); authentication ([`crate::authn::jwt`]) gets
//! the token string only. Rules:
//! - the value must be ASCII (else Unauthenticated at once, before anything else is read);
//! - the scheme is `Bearer`, in any case, separated by a space or a tab; surrounding blanks
//!   are ignored;
//! - the token is not empty and holds no whitespace or control character;
//! - a refusal is [`AuthnError::MalformedHeader`] and never repeats the header's value.
//!
//! A malformed header does not fail the request here: it travels as a [`Bearer`] holding the
//! refusal, and whoever needs the token ([`Bearer::token`]) refuses it — so each API keeps its
//! own order of checks and its audit event, as before the header parsing moved here.
//! The token's size is capped by the verifier (`MAX_TOKEN_BYTES` in `authn::jwt::jws`), which
//! also serves callers that have no header (the fuzz targets).

use tonic::metadata::MetadataMap;

use super::ApiError;
use crate::authn::AuthnError;
use crate::authn::jwt::Bearer;

/// The metadata key (HTTP/2 header names are lowercase).
const AUTHORIZATION: &str = "authorization";

/// The bearer credential of a request's metadata: `None` without an `authorization` header;
/// a non-ASCII value is refused at once (Unauthenticated).
pub(crate) fn from_metadata(metadata: &MetadataMap) -> Result<Option<Bearer>, ApiError> {
    let Some(value) = metadata.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let header = value.to_str().map_err(|_| {
        ApiError::Unauthenticated(AuthnError::MalformedHeader(
            "authorization header is not ASCII".into(),
        ))
    })?;
    Ok(Some(Bearer::new(bearer_token(header))))
}

/// Extracts the token from an `authorization` header value: `Bearer <token>`, the scheme
/// case-insensitive. Anything else is [`AuthnError::MalformedHeader`].
pub fn bearer_token(header: &str) -> Result<&str, AuthnError> {
    let header = header.trim();
    let (scheme, rest) = header
        .split_once([' ', '\t'])
        .ok_or_else(|| malformed("expected 'Bearer <token>'"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(malformed(
            "only the Bearer scheme is accepted ('Bearer <token>')",
        ));
    }
    let token = rest.trim();
    if token.is_empty() {
        return Err(malformed("the Bearer token is empty"));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(malformed("the Bearer token contains whitespace"));
    }
    Ok(token)
}

fn malformed(reason: &str) -> AuthnError {
    AuthnError::MalformedHeader(reason.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    #[test]
    fn bearer_header_is_parsed() {
        assert_eq!(bearer_token("Bearer abc.def.ghi"), Ok("abc.def.ghi"));
        assert_eq!(bearer_token("bearer  abc"), Ok("abc"));
        assert_eq!(bearer_token("BEARER abc "), Ok("abc"));
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            "Basic dXNlcjpwYXNz",
            "abc",
            "Bearer a b",
        ] {
            let err = bearer_token(bad).expect_err("refused");
            assert!(matches!(err, AuthnError::MalformedHeader(_)), "{bad:?}");
            if bad.len() > 8 {
                assert!(!err.to_string().contains(&bad[7..]), "{err}");
            }
        }
    }

    #[test]
    fn each_refusal_has_its_message() {
        let reason = |h: &str| bearer_token(h).expect_err(h).to_string();
        assert_eq!(
            reason("abc"),
            "malformed authorization header: expected 'Bearer <token>'"
        );
        assert_eq!(
            reason("Basic dXNlcjpwYXNz"),
            "malformed authorization header: only the Bearer scheme is accepted ('Bearer <token>')"
        );
        assert_eq!(
            reason("Bearer \t "),
            "malformed authorization header: expected 'Bearer <token>'"
        );
        assert_eq!(
            reason("Bearer\t\u{1}"),
            "malformed authorization header: the Bearer token contains whitespace"
        );
        assert_eq!(
            reason("Bearer a\u{a0}b"),
            "malformed authorization header: the Bearer token contains whitespace"
        );
        assert_eq!(bearer_token("\tbEaReR\tabc\t"), Ok("abc"));
    }

    #[test]
    fn metadata_gives_the_token_or_the_refusal_for_later() {
        let mut md = MetadataMap::new();
        assert!(from_metadata(&md).expect("no header").is_none());
        md.insert(AUTHORIZATION, MetadataValue::from_static("Bearer a.b.c"));
        let b = from_metadata(&md).expect("ascii").expect("sent");
        assert_eq!(b.token(), Ok("a.b.c"));
        assert!(!format!("{b:?}").contains("a.b.c"), "{b:?}");
        md.insert(AUTHORIZATION, MetadataValue::from_static("Basic c2VjcmV0"));
        let b = from_metadata(&md).expect("ascii").expect("sent");
        assert!(
            matches!(b.token(), Err(AuthnError::MalformedHeader(_))),
            "{b:?}"
        );
        assert!(!format!("{b:?}").contains("c2VjcmV0"), "{b:?}");
        let non_ascii = MetadataValue::try_from("Bearer caf\u{e9}".as_bytes()).expect("bytes");
        md.insert(AUTHORIZATION, non_ascii);
        match from_metadata(&md) {
            Err(ApiError::Unauthenticated(AuthnError::MalformedHeader(m))) => {
                assert_eq!(m, "authorization header is not ASCII");
            }
            other => panic!("{other:?}"),
        }
    }
}
