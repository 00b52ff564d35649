//! The Workload API's JWT profile (SPIFFE Workload API §6), the parts that need no socket:
//! the bounds on a request's audiences ([`check_audiences`]), the JWT bundles a caller sees
//! ([`jwt_bundles_view`]: the trust domain's keys as a JWKS, every key with `kid`, `alg` and
//! `use: "jwt-svid"`, and the caller's federated trust domains' the same way), and
//! `ValidateJWTSVID` ([`validate`]: `signet_pki::jwt::validate` against the key set of the
//! token's trust domain, the claims as a `google.protobuf.Struct`).
//!
//! **Which keys validate a token.** The unverified `sub` only *chooses* the key set
//! ([`claimed_trust_domain`]): the own trust domain's keys for a token claiming it (or one
//! whose subject cannot be read: it then fails validation), a federated trust domain's keys
//! for one claiming it when the caller's identities federate with it; any other trust domain
//! is refused (ForeignTrustDomain) without looking further. After validation the verified
//! subject's trust domain must be the one whose keys were used, so a foreign key never
//! vouches for the own trust domain, nor the own keys for a foreign one.
//!
//! The handlers in [`super`] attest the caller and go through the [`crate::jwt_cache`] for
//! tokens; nothing here parses or signs a JWT itself.

use std::collections::{BTreeMap, HashMap};

use prost_types::value::Kind;
use serde_json::{Map, Value};
use signet_pki::jwt::{JwtKeySet, JwtPublicKey, JwtSvidError};
use signet_proto::workload as pb;

use super::WorkloadError;
use crate::attest::{Attestor, Caller};
use crate::state::{AgentState, Identity, JwtKeys};
use signet_types::TrustDomain;

/// The `use` of every key in a SPIFFE JWT bundle.
pub const JWT_SVID_USE: &str = "jwt-svid";

/// `FetchJWTSVID`'s audiences: the server's grammar (`signet_types::audience`), checked here so
/// a bad request costs no server call.
pub fn check_audiences(audience: &[String]) -> Result<(), WorkloadError> {
    match signet_types::audience::normalize(audience) {
        Ok(_) => Ok(()),
        Err(signet_types::audience::AudienceError::None) => Err(WorkloadError::NoAudience),
        Err(e) => Err(WorkloadError::BadAudience(e.to_string())),
    }
}

/// The JWKS document (`{"keys":[…]}`) of `keys`, each a JWK with `kid`, `alg` and
/// `use: "jwt-svid"`. A key that cannot be written as a JWK is left out (it was read by
/// `signet_pki` when it came in, so this does not happen).
pub fn jwks(keys: &[JwtPublicKey]) -> Vec<u8> {
    let keys: Vec<Value> = keys
        .iter()
        .filter_map(|k| match k.jwk(JWT_SVID_USE) {
            Ok(jwk) => Some(Value::Object(jwk)),
            Err(e) => {
                tracing::warn!(key_id = %k.key_id(), error = %e, "JWT key left out of the JWKS");
                None
            }
        })
        .collect();
    serde_json::json!({ "keys": keys }).to_string().into_bytes()
}

/// The JWT bundles response for a caller, or `None` when it has no identity (the same rule as
/// `FetchX509Bundles`): the trust domain, without scheme, to the JWKS of its keys.
pub fn jwt_bundles_view(
    attestor: &Attestor,
    caller: &Caller,
    state: &AgentState,
) -> Option<pb::JwtBundlesResponse> {
    let ids = attestor.identities_for(caller, state);
    if ids.is_empty() {
        return None;
    }
    let mut bundles = HashMap::new();
    if let Some(td) = state.trust_domain_id.strip_prefix("spiffe://")
        && !td.is_empty()
    {
        bundles.insert(td.to_owned(), jwks(&state.jwt_keys));
    }
    for b in state.federated_for(&ids) {
        bundles.insert(b.trust_domain.as_str().to_owned(), jwks(&b.jwt_keys));
    }
    Some(pb::JwtBundlesResponse { bundles })
}

/// The trust domain a token's `sub` claims, read **without verifying anything**: only to
/// choose the key set it is then validated with. `None` when it cannot be read (too long, not
/// three parts, no `sub`, not a SPIFFE ID).
pub fn claimed_trust_domain(token: &str) -> Option<TrustDomain> {
    use base64::Engine;
    if token.len() > signet_pki::jwt::MAX_TOKEN_BYTES {
        return None;
    }
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let claims: Map<String, Value> = serde_json::from_slice(&bytes).ok()?;
    let sub = claims.get("sub")?.as_str()?;
    let id: signet_types::SpiffeId = sub.parse().ok()?;
    Some(id.trust_domain().clone())
}

/// The key set a token claiming `claimed` is validated with, and the trust domain it stands
/// for (`None`: the own one), for a caller entitled to `mine`; refused for a foreign trust
/// domain the caller does not federate with.
fn key_set<'a>(
    state: &'a AgentState,
    mine: &[&Identity],
    claimed: Option<&TrustDomain>,
) -> Result<(&'a JwtKeys, Option<&'a TrustDomain>), WorkloadError> {
    match claimed {
        Some(td) if td.id_string() != state.trust_domain_id => state
            .federated_for(mine)
            .into_iter()
            .find(|b| &b.trust_domain == td)
            .map(|b| (&b.jwt_keys, Some(&b.trust_domain)))
            .ok_or_else(|| WorkloadError::ForeignTrustDomain(td.as_str().to_owned())),
        _ => Ok((&state.jwt_keys, None)),
    }
}

/// `ValidateJWTSVID` of `token` for `audience`, at `now` (unix seconds), for a caller entitled
/// to `mine`: against the own trust domain's keys in `state`, or those of the federated trust
/// domain the token claims when the caller federates with it (see the module doc). Every
/// refusal is InvalidArgument with the reason.
pub fn validate(
    state: &AgentState,
    mine: &[&Identity],
    audience: &str,
    token: &str,
    now: i64,
) -> Result<pb::ValidateJwtsvidResponse, WorkloadError> {
    if audience.is_empty() {
        return Err(WorkloadError::NoAudience);
    }
    if token.is_empty() {
        return Err(WorkloadError::NoToken);
    }
    let claimed = claimed_trust_domain(token);
    let (keys, foreign) = key_set(state, mine, claimed.as_ref())?;
    let keys = JwtKeySet::new(keys.iter().cloned());
    let valid = signet_pki::jwt::validate(token, audience, &keys, now)
        .map_err(WorkloadError::InvalidToken)?;
    // The verified subject must be of the trust domain whose keys vouched for it: the own
    // keys never for a foreign trust domain, a federated domain's never for another one.
    let td = valid.spiffe_id.trust_domain();
    let expected_ok = match foreign {
        Some(f) => td == f,
        None => td.id_string() == state.trust_domain_id,
    };
    if !expected_ok {
        return Err(WorkloadError::ForeignTrustDomain(td.as_str().to_owned()));
    }
    Ok(pb::ValidateJwtsvidResponse {
        spiffe_id: valid.spiffe_id.to_string(),
        claims: Some(to_struct(valid.claims)),
    })
}

/// The metrics label of a validation's outcome.
pub fn validation_label(r: &Result<pb::ValidateJwtsvidResponse, WorkloadError>) -> &'static str {
    match r {
        Ok(_) => "valid",
        Err(WorkloadError::InvalidToken(e)) => match e {
            JwtSvidError::Expired | JwtSvidError::NotYetValid => "expired",
            JwtSvidError::WrongAudience(_) => "audience",
            JwtSvidError::UnknownKey(_) | JwtSvidError::NoKeyId => "unknown_key",
            JwtSvidError::BadSignature | JwtSvidError::HighS => "signature",
            JwtSvidError::AlgRefused(_)
            | JwtSvidError::AlgUnsupported(_)
            | JwtSvidError::AlgMismatch { .. } => "alg",
            JwtSvidError::Claims(_) => "claims",
            _ => "malformed",
        },
        Err(WorkloadError::ForeignTrustDomain(_)) => "trust_domain",
        Err(_) => "refused",
    }
}

/// A JSON object as a `google.protobuf.Struct`.
pub fn to_struct(map: Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map
            .into_iter()
            .map(|(k, v)| (k, to_value(v)))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn to_value(v: Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        // A Struct's numbers are doubles (as protobuf's JSON mapping has them).
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.into_iter().map(to_value).collect(),
        }),
        Value::Object(o) => Kind::StructValue(to_struct(o)),
    };
    prost_types::Value { kind: Some(kind) }
}
