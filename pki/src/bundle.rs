//! The SPIFFE bundle document: a JWK set (RFC 7517) with the SPIFFE members, as the SPIFFE
//! Trust Domain and Bundle specification (section 4) defines it and the bundle endpoint serves
//! it:
//!
//! ```json
//! {"keys":[{"use":"x509-svid","kty":"EC","crv":"P-256","x":"…","y":"…","x5c":["<base64 DER>"]},
//!          {"use":"jwt-svid","kid":"…","kty":"EC","crv":"P-256","x":"…","y":"…"}],
//!  "spiffe_sequence":1764590000,"spiffe_refresh_hint":300}
//! ```
//!
//! [`SpiffeBundle`] is the one reader ([`SpiffeBundle::parse`]) and writer
//! ([`SpiffeBundle::to_json`]) of it: for Signet's own endpoint (the server's `federation`),
//! and for the JWT keys and foreign bundles that federation and JWT-SVIDs will read.
//!
//! Reading is strict and bounded: at most [`MAX_DOCUMENT_BYTES`] and [`MAX_KEYS`] keys; `keys`
//! must be present; an `x509-svid` key carries exactly one certificate in `x5c`, which must be
//! a certificate [`ParsedCert`] reads and whose public key the JWK's own members state; a
//! `jwt-svid` key carries a non-empty `kid` (unique in the document) and a `kty`; a key with
//! another `use` is ignored, as the specification requires of unknown uses; `spiffe_sequence`
//! and `spiffe_refresh_hint` are non-negative integers when present.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Map, Value};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::cert::ParsedCert;

/// Largest document [`SpiffeBundle::parse`] reads.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// Most keys in one document.
pub const MAX_KEYS: usize = 1024;

/// Why a document is not a SPIFFE bundle, or a certificate has no JWK form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    #[error("the bundle document is larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge,
    #[error("the bundle document is not JSON: {0}")]
    Json(String),
    #[error("the bundle document is not a JWK set: {0}")]
    Shape(String),
    #[error("the bundle document has more than {MAX_KEYS} keys")]
    TooManyKeys,
    #[error("key {index}: {reason}")]
    Key { index: usize, reason: String },
    /// A certificate whose public key has no JWK form here.
    #[error("a certificate cannot be written as a JWK: {0}")]
    NoJwkForm(String),
}

/// A `jwt-svid` key: its key ID and its JWK members (public key parameters, `kty` included,
/// `use` and `kid` left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtAuthority {
    pub key_id: String,
    pub jwk: Map<String, Value>,
}

/// A SPIFFE bundle document.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpiffeBundle {
    /// The `x509-svid` keys' certificates, in document order.
    pub x509_authorities: Vec<ParsedCert>,
    /// The `jwt-svid` keys, in document order.
    pub jwt_authorities: Vec<JwtAuthority>,
    /// `spiffe_sequence`.
    pub sequence: Option<u64>,
    /// `spiffe_refresh_hint` (whole seconds).
    pub refresh_hint: Option<Duration>,
}

/// The JWK members (RFC 7518 section 6) of a certificate's public key: EC P-256/P-384/P-521,
/// RSA, or Ed25519 as `OKP`; without `use` and `x5c`.
pub fn public_jwk(cert: &ParsedCert) -> Result<Map<String, Value>, BundleError> {
    spki_jwk(cert.spki_der())
}

/// The JWK members of a public key given as exactly one DER `SubjectPublicKeyInfo` (as
/// [`ParsedCert::spki_der`] holds it, or `openssl pkey -pubout -outform DER` writes it); see
/// [`public_jwk`].
pub fn spki_jwk(spki_der: &[u8]) -> Result<Map<String, Value>, BundleError> {
    let no = |why: String| BundleError::NoJwkForm(why);
    let (rest, spki) = SubjectPublicKeyInfo::from_der(spki_der).map_err(|e| no(e.to_string()))?;
    if !rest.is_empty() {
        return Err(no("bytes follow its SubjectPublicKeyInfo".into()));
    }
    let b64u = |b: &[u8]| Value::from(URL_SAFE_NO_PAD.encode(b));
    let mut jwk = Map::new();
    match spki
        .parsed()
        .map_err(|e| no(format!("its public key does not parse: {e}")))?
    {
        PublicKey::EC(point) => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|o| o.to_id_string());
            let (crv, len) = match curve.as_deref() {
                Some("1.2.840.10045.3.1.7") => ("P-256", 32),
                Some("1.3.132.0.34") => ("P-384", 48),
                Some("1.3.132.0.35") => ("P-521", 66),
                other => return Err(no(format!("its EC curve is not supported: {other:?}"))),
            };
            let data = point.data();
            if data.len() != 1 + 2 * len || data.first() != Some(&4) {
                return Err(no("its EC point is not an uncompressed point".into()));
            }
            jwk.insert("kty".into(), "EC".into());
            jwk.insert("crv".into(), crv.into());
            jwk.insert("x".into(), b64u(&data[1..=len]));
            jwk.insert("y".into(), b64u(&data[1 + len..]));
        }
        PublicKey::RSA(rsa) => {
            let strip = |b: &[u8]| -> Vec<u8> {
                let i = b
                    .iter()
                    .position(|&x| x != 0)
                    .unwrap_or(b.len().saturating_sub(1));
                b[i..].to_vec()
            };
            jwk.insert("kty".into(), "RSA".into());
            jwk.insert("n".into(), b64u(&strip(rsa.modulus)));
            jwk.insert("e".into(), b64u(&strip(rsa.exponent)));
        }
        _ if spki.algorithm.algorithm.to_id_string() == "1.3.101.112" => {
            jwk.insert("kty".into(), "OKP".into());
            jwk.insert("crv".into(), "Ed25519".into());
            jwk.insert("x".into(), b64u(&spki.subject_public_key.data));
        }
        _ => return Err(no("its key type has no JWK form here".into())),
    }
    Ok(jwk)
}

/// A certificate as an `x509-svid` key: [`public_jwk`] with `use` and `x5c` (exactly that
/// certificate, standard base64 of its DER).
pub fn x509_svid_jwk(cert: &ParsedCert) -> Result<Value, BundleError> {
    let mut jwk = public_jwk(cert)?;
    jwk.insert("use".into(), "x509-svid".into());
    jwk.insert("x5c".into(), Value::from(vec![STANDARD.encode(cert.der())]));
    Ok(Value::Object(jwk))
}

fn key_err(index: usize, reason: impl Into<String>) -> BundleError {
    BundleError::Key {
        index,
        reason: reason.into(),
    }
}

fn x509_key(index: usize, key: &Map<String, Value>) -> Result<ParsedCert, BundleError> {
    let x5c = key
        .get("x5c")
        .and_then(Value::as_array)
        .ok_or_else(|| key_err(index, "an x509-svid key has no x5c array"))?;
    let [one] = x5c.as_slice() else {
        return Err(key_err(
            index,
            format!(
                "an x509-svid key's x5c holds {} certificates, exactly one expected",
                x5c.len()
            ),
        ));
    };
    let der = one
        .as_str()
        .and_then(|s| STANDARD.decode(s).ok())
        .ok_or_else(|| key_err(index, "x5c[0] is not standard base64"))?;
    let cert = ParsedCert::from_der(&der).map_err(|e| key_err(index, format!("x5c[0]: {e}")))?;
    let stated = public_jwk(&cert).map_err(|e| key_err(index, e.to_string()))?;
    for (member, value) in &stated {
        if key.get(member) != Some(value) {
            return Err(key_err(
                index,
                format!("its {member:?} is not that of the x5c certificate's public key"),
            ));
        }
    }
    Ok(cert)
}

fn jwt_key(index: usize, key: &Map<String, Value>) -> Result<JwtAuthority, BundleError> {
    let key_id = key
        .get("kid")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| key_err(index, "a jwt-svid key has no kid"))?
        .to_owned();
    if !key.get("kty").is_some_and(Value::is_string) {
        return Err(key_err(index, "a jwt-svid key has no kty"));
    }
    let mut jwk = key.clone();
    jwk.remove("use");
    jwk.remove("kid");
    Ok(JwtAuthority { key_id, jwk })
}

fn optional_u64(doc: &Map<String, Value>, member: &str) -> Result<Option<u64>, BundleError> {
    match doc.get(member) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| BundleError::Shape(format!("{member} is not a non-negative integer"))),
    }
}

impl SpiffeBundle {
    /// Reads a SPIFFE bundle document (see the module documentation for what is refused).
    pub fn parse(json: &[u8]) -> Result<Self, BundleError> {
        if json.len() > MAX_DOCUMENT_BYTES {
            return Err(BundleError::TooLarge);
        }
        let doc: Value =
            serde_json::from_slice(json).map_err(|e| BundleError::Json(e.to_string()))?;
        let doc = doc
            .as_object()
            .ok_or_else(|| BundleError::Shape("not a JSON object".into()))?;
        let keys = doc
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| BundleError::Shape("no keys array".into()))?;
        if keys.len() > MAX_KEYS {
            return Err(BundleError::TooManyKeys);
        }
        let mut bundle = SpiffeBundle {
            sequence: optional_u64(doc, "spiffe_sequence")?,
            refresh_hint: optional_u64(doc, "spiffe_refresh_hint")?.map(Duration::from_secs),
            ..Self::default()
        };
        for (index, key) in keys.iter().enumerate() {
            let key = key
                .as_object()
                .ok_or_else(|| key_err(index, "not a JSON object"))?;
            match key.get("use").and_then(Value::as_str) {
                Some("x509-svid") => bundle.x509_authorities.push(x509_key(index, key)?),
                Some("jwt-svid") => {
                    let jwt = jwt_key(index, key)?;
                    if bundle
                        .jwt_authorities
                        .iter()
                        .any(|j| j.key_id == jwt.key_id)
                    {
                        return Err(key_err(index, format!("kid {:?} repeated", jwt.key_id)));
                    }
                    bundle.jwt_authorities.push(jwt);
                }
                // Unknown or missing use: ignored (SPIFFE Trust Domain and Bundle, 4.2.1).
                _ => {}
            }
        }
        Ok(bundle)
    }

    /// The document: `keys` (x509-svid keys, then jwt-svid keys), and `spiffe_sequence` and
    /// `spiffe_refresh_hint` when set (a refresh hint is at least one second).
    pub fn to_json(&self) -> Result<Value, BundleError> {
        let mut keys = self
            .x509_authorities
            .iter()
            .map(x509_svid_jwk)
            .collect::<Result<Vec<_>, _>>()?;
        for j in &self.jwt_authorities {
            let mut jwk = j.jwk.clone();
            jwk.insert("use".into(), "jwt-svid".into());
            jwk.insert("kid".into(), j.key_id.clone().into());
            keys.push(Value::Object(jwk));
        }
        let mut doc = Map::new();
        doc.insert("keys".into(), keys.into());
        if let Some(s) = self.sequence {
            doc.insert("spiffe_sequence".into(), s.into());
        }
        if let Some(h) = self.refresh_hint {
            doc.insert("spiffe_refresh_hint".into(), h.as_secs().max(1).into());
        }
        Ok(Value::Object(doc))
    }
}

#[cfg(test)]
mod tests;
