//! The pure decisions of the Certificate reconcilers: what the spec asks for ([`validate`]),
//! whether the Secret is ours to write ([`secret_owner_problem`], [`conflicts`]), whether a
//! (re)issuance is due (in [`super::triggers`]: an ordered chain of small checks in the manner
//! of cert-manager's `policies`), when to renew ([`renewal_time`]) and how long to back off after
//! a failure ([`failure_backoff`]). No I/O; `now` and randomness come in as arguments.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use crate::certmanager::{Certificate, parse_go_duration};
use crate::issuers::{IssuerKey, RefMatch};
use crate::keys::{KeyError, KeySpec, PrivateKey, RotationPolicy};
use signet_pki::CertError;

pub const ANN_CERTIFICATE_NAME: &str = "cert-manager.io/certificate-name";
pub const ANN_ISSUER_NAME: &str = "cert-manager.io/issuer-name";
pub const ANN_ISSUER_KIND: &str = "cert-manager.io/issuer-kind";
pub const ANN_ISSUER_GROUP: &str = "cert-manager.io/issuer-group";
pub const ANN_URI_SANS: &str = "cert-manager.io/uri-sans";
pub const ANN_ALT_NAMES: &str = "cert-manager.io/alt-names";
pub const ANN_COMMON_NAME: &str = "cert-manager.io/common-name";
/// The `spec.duration` the Secret's certificate was requested with (the server may clamp the
/// certificate's lifetime, so the certificate alone cannot tell whether the spec changed).
pub const ANN_REQUESTED_DURATION: &str = "signet.dev/requested-duration";
pub const LABEL_MANAGED_BY: &str = "signet.dev/managed-by";
pub const MANAGER: &str = "signet-k8s";

/// cert-manager's default `spec.duration`.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(90 * 24 * 3600);
/// Renewal jitter: up to this fraction of the lifetime earlier than the nominal renewal time.
pub const JITTER_FRACTION: f64 = 0.1;

/// Why the reconcilers will not issue: the reason is a condition reason, the message tells a
/// person what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub reason: &'static str,
    pub message: String,
}

impl Blocked {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// A Certificate spec that Signet can issue, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub namespace: String,
    pub name: String,
    pub secret_name: String,
    pub issuer: IssuerKey,
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub common_name: Option<String>,
    /// `spec.duration` as written (for the Secret's annotation), and parsed.
    pub duration_text: Option<String>,
    pub duration: Duration,
    pub renew_before: Option<Duration>,
    pub renew_before_percentage: Option<i32>,
    pub key: KeySpec,
}

/// Validates what a Certificate asks for, in order; the first problem is the answer.
/// `Ok(None)`: not ours (another issuer's group) — leave it alone.
pub fn validate(cert: &Certificate) -> Result<Option<Desired>, Blocked> {
    let namespace = cert.namespace().unwrap_or_default();
    let spec = &cert.spec;
    let issuer = match IssuerKey::from_ref(&spec.issuer_ref, &namespace) {
        RefMatch::NotOurs => return Ok(None),
        RefMatch::UnknownKind(k) => {
            return Err(Blocked::new(
                "InvalidIssuerRef",
                format!(
                    "issuerRef.kind {k:?} is not served by signet-k8s; use Issuer or ClusterIssuer"
                ),
            ));
        }
        RefMatch::Ours(k) => k,
    };
    if spec.secret_name.trim().is_empty() {
        return Err(Blocked::new(
            "MissingSecretName",
            "spec.secretName is empty: name the Secret the certificate and key are written to",
        ));
    }
    let spiffe_id = match spec.uris.as_slice() {
        [] => {
            return Err(Blocked::new(
                "MissingSPIFFEID",
                "spec.uris has no SPIFFE ID: Signet issues X509-SVIDs only; add exactly one URI of \
                 the form spiffe://<trust-domain>/ns/<namespace>/...",
            ));
        }
        [one] => match one.parse::<signet_types::SpiffeId>() {
            Ok(id) if !id.path().is_empty() => one.clone(),
            Ok(_) => {
                return Err(Blocked::new(
                    "InvalidSPIFFEID",
                    format!(
                        "spec.uris: {one:?} is a trust domain ID; name a workload (add a path)"
                    ),
                ));
            }
            Err(e) => {
                return Err(Blocked::new(
                    "InvalidSPIFFEID",
                    format!("spec.uris: {one:?} is not a SPIFFE ID: {e}"),
                ));
            }
        },
        more => {
            return Err(Blocked::new(
                "MultipleURIs",
                format!(
                    "spec.uris has {} URIs: an X509-SVID carries exactly one SPIFFE ID",
                    more.len()
                ),
            ));
        }
    };
    let mut unsupported = Vec::new();
    if !spec.ip_addresses.is_empty() {
        unsupported.push("ipAddresses");
    }
    if !spec.email_addresses.is_empty() {
        unsupported.push("emailAddresses");
    }
    if !unsupported.is_empty() {
        return Err(Blocked::new(
            "UnsupportedSANs",
            format!(
                "spec.{} cannot be issued by Signet (X509-SVIDs carry a SPIFFE ID and DNS names only); remove {}",
                unsupported.join(" and spec."),
                if unsupported.len() == 1 { "it" } else { "them" }
            ),
        ));
    }
    if spec.is_ca == Some(true) {
        return Err(Blocked::new(
            "CANotSupported",
            "spec.isCA is true: Signet issues workload certificates only, never CA certificates",
        ));
    }
    let pk = spec.private_key.clone().unwrap_or_default();
    let key = KeySpec::parse(
        pk.algorithm.as_deref(),
        pk.size.map(i64::from),
        pk.encoding.as_deref(),
        pk.rotation_policy.as_deref(),
    )
    .map_err(|e| Blocked::new("UnsupportedPrivateKey", e.0))?;
    let duration = match spec.duration.as_deref() {
        None | Some("") => DEFAULT_DURATION,
        Some(d) => match parse_go_duration(d) {
            Ok(v) if v >= Duration::from_secs(60) => v,
            Ok(_) => {
                return Err(Blocked::new(
                    "InvalidDuration",
                    format!("spec.duration {d:?} is shorter than one minute"),
                ));
            }
            Err(e) => {
                return Err(Blocked::new(
                    "InvalidDuration",
                    format!("spec.duration: {e}"),
                ));
            }
        },
    };
    let renew_before = match spec.renew_before.as_deref() {
        None | Some("") => None,
        Some(d) => Some(
            parse_go_duration(d)
                .map_err(|e| Blocked::new("InvalidDuration", format!("spec.renewBefore: {e}")))?,
        ),
    };
    Ok(Some(Desired {
        namespace,
        name: cert.name_any(),
        secret_name: spec.secret_name.clone(),
        issuer,
        spiffe_id,
        dns_names: spec.dns_names.clone(),
        common_name: spec.common_name.clone().filter(|s| !s.is_empty()),
        duration_text: spec.duration.clone().filter(|s| !s.is_empty()),
        duration,
        renew_before,
        renew_before_percentage: spec.renew_before_percentage,
        key,
    }))
}

/// Other Certificates in the same namespace naming the same Secret, sorted by name. Both sides
/// of a conflict compute the same set, so both stop: never a fight over the Secret.
pub fn conflicts(cert: &Certificate, peers: &[Arc<Certificate>]) -> Vec<String> {
    let ns = cert.namespace();
    let name = cert.name_any();
    let secret = cert.spec.secret_name.as_str();
    if secret.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<String> = peers
        .iter()
        .filter(|p| p.namespace() == ns && p.name_any() != name && p.spec.secret_name == secret)
        .map(|p| p.name_any())
        .collect();
    out.sort();
    out.dedup();
    out
}

pub fn conflict_blocked(secret_name: &str, others: &[String]) -> Blocked {
    Blocked::new(
        "SecretConflict",
        format!(
            "Secret {secret_name:?} is also named by Certificate{} {}: neither is issued until only one names it",
            if others.len() == 1 { "" } else { "s" },
            others.join(", ")
        ),
    )
}

/// A Secret that exists but is not this Certificate's (no `cert-manager.io/certificate-name`
/// naming it) is never written.
pub fn secret_owner_problem(secret: &Secret, cert_name: &str) -> Option<Blocked> {
    let owner = secret.annotations().get(ANN_CERTIFICATE_NAME);
    match owner {
        Some(o) if o == cert_name => None,
        Some(o) => Some(Blocked::new(
            "SecretOwnedByOther",
            format!(
                "Secret {:?} belongs to Certificate {o:?} ({ANN_CERTIFICATE_NAME}); it is left untouched: choose another spec.secretName",
                secret.name_any()
            ),
        )),
        None => Some(Blocked::new(
            "SecretOwnedByOther",
            format!(
                "Secret {:?} exists and is not managed by a Certificate (no {ANN_CERTIFICATE_NAME} annotation); it is left untouched: delete it or choose another spec.secretName",
                secret.name_any()
            ),
        )),
    }
}

/// The certificate found in a Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCert {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub uris: Vec<String>,
    pub dns_names: Vec<String>,
    pub common_name: Option<String>,
    pub spki: Vec<u8>,
    /// The issuing CA key (authority key identifier, lowercase hex), if the leaf names it.
    pub issuer_key_id: Option<String>,
    /// The serial number (big-endian, without the DER integer's leading zero bytes).
    pub serial: Vec<u8>,
}

impl IssuedCert {
    /// The first certificate of a PEM chain ([`signet_pki::ParsedCert`]).
    pub fn parse(chain_pem: &[u8]) -> Result<Self, CertError> {
        let cert = signet_pki::ParsedCert::from_pem_first(chain_pem)?;
        Ok(Self {
            not_before: cert.not_before(),
            not_after: cert.not_after(),
            uris: cert.uris().to_vec(),
            dns_names: cert.dns_names().to_vec(),
            common_name: cert.common_name().map(str::to_owned),
            spki: cert.spki_der().to_vec(),
            issuer_key_id: cert.authority_key_id().map(str::to_owned),
            serial: cert.serial().to_vec(),
        })
    }

    pub fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }
}

/// The parts of a Secret the decisions read. `cert` and `key` are None when the Secret lacks
/// them, and hold why they cannot be read when they are there but broken (the triggers write
/// the reason into the Certificate's conditions).
#[derive(Debug)]
pub struct SecretView {
    pub annotations: BTreeMap<String, String>,
    pub cert: Option<Result<IssuedCert, CertError>>,
    pub key: Option<Result<PrivateKey, KeyError>>,
    /// `RSA PRIVATE KEY`, `EC PRIVATE KEY` or `PRIVATE KEY`.
    pub key_label: Option<String>,
}

impl SecretView {
    pub fn of(secret: &Secret) -> Self {
        let get = |k: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|b| b.0.clone())
                .filter(|b| !b.is_empty())
        };
        let cert = get("tls.crt").map(|c| IssuedCert::parse(&c));
        let key_bytes = get("tls.key");
        let key_label = key_bytes
            .as_ref()
            .and_then(|k| pem::parse(k).ok())
            .map(|p| p.tag().to_owned());
        let key = key_bytes.map(|k| PrivateKey::from_pem(&k));
        Self {
            annotations: secret.annotations().clone(),
            cert,
            key,
            key_label,
        }
    }

    /// The key, if it is valid and matches the certificate.
    pub fn usable_key(&self) -> Option<&PrivateKey> {
        match (&self.key, &self.cert) {
            (Some(Ok(k)), Some(Ok(c))) if k.public_key_der().ok().as_deref() == Some(&c.spki) => {
                Some(k)
            }
            _ => None,
        }
    }
}

/// When to renew a certificate valid from `not_before` to `not_after`: `renewBefore` (or
/// `renewBeforePercentage` of the lifetime, else a third of it) before `not_after`, then
/// earlier by `jitter` (in `[0, 1)`) times [`JITTER_FRACTION`] of the lifetime, never before
/// `not_before`. A `renewBefore` not shorter than the lifetime falls back to the third, as
/// cert-manager does.
pub fn renewal_time(
    not_before: SystemTime,
    not_after: SystemTime,
    renew_before: Option<Duration>,
    renew_before_percentage: Option<i32>,
    jitter: f64,
) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    let third = lifetime / 3;
    let before = match (renew_before, renew_before_percentage) {
        (Some(rb), _) if rb < lifetime && !rb.is_zero() => rb,
        (None, Some(p)) if (1..100).contains(&p) => lifetime.mul_f64(f64::from(p) / 100.0),
        _ => third,
    };
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let nominal = not_after - before;
    let room = nominal.duration_since(not_before).unwrap_or_default();
    let early = lifetime.mul_f64(JITTER_FRACTION * jitter).min(room);
    // Whole seconds: status times are stored to the second.
    signet_runtime::clock::truncate_to_seconds(nominal - early)
}

/// How long to wait after the `attempts`-th consecutive failure before trying again: one
/// minute, doubling, at most an hour (cert-manager waits an hour; a shorter first retry helps
/// a server that was briefly down, the cap keeps a broken request from hot-looping).
pub fn failure_backoff(attempts: i32) -> Duration {
    let n = attempts.clamp(1, 16) as u32 - 1;
    signet_runtime::backoff::ceiling(n, Duration::from_secs(60), Duration::from_secs(3600))
}

/// Whether the key in the Secret may be reused for the next issuance.
pub fn reusable_key<'a>(d: &Desired, secret: Option<&'a SecretView>) -> Option<&'a PrivateKey> {
    if d.key.rotation != RotationPolicy::Never {
        return None;
    }
    let s = secret?;
    match &s.key {
        Some(Ok(k)) if k.algorithm() == d.key.algorithm => Some(k),
        _ => None,
    }
}

/// A note for the Ready message when the server issued a shorter lifetime than requested.
pub fn clamp_note(d: &Desired, issued: &IssuedCert) -> Option<String> {
    let got = issued.lifetime();
    // A few seconds of backdating are not a clamp.
    if got + Duration::from_secs(120) < d.duration {
        Some(format!(
            "the server limited its lifetime to {} (spec.duration asks for {})",
            humantime::format_duration(got),
            humantime::format_duration(d.duration)
        ))
    } else {
        None
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
