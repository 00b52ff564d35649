//! Whether a Certificate needs a (new) certificate, and why: cert-manager's trigger reasons as
//! an ordered chain of small pure checks ([`TRIGGER_CHAIN`]); the first that fires is the
//! reason ([`issuance_reason`]). No I/O; `now` comes in as an argument.

use std::time::SystemTime;

use super::policy::{
    ANN_ISSUER_KIND, ANN_ISSUER_NAME, ANN_REQUESTED_DURATION, Desired, SecretView, renewal_time,
};
use crate::keys::KeyEncoding;

/// Why a (re)issuance is due, as cert-manager's trigger reasons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    pub reason: &'static str,
    pub message: String,
}

type Check = fn(&Desired, &SecretView, Option<SystemTime>, SystemTime) -> Option<Trigger>;

/// The trigger checks, in order; the first that fires is the reason.
const TRIGGER_CHAIN: &[Check] = &[
    check_missing_data,
    check_invalid_certificate,
    check_key_pair,
    check_key_spec,
    check_names,
    check_duration,
    check_issuer,
    check_expired,
    check_renewal_due,
];

/// Whether the Certificate needs a (new) certificate, and why. `secret` None: it does not exist.
pub fn issuance_reason(
    d: &Desired,
    secret: Option<&SecretView>,
    renewal_time: Option<SystemTime>,
    now: SystemTime,
) -> Option<Trigger> {
    let Some(s) = secret else {
        return Some(Trigger {
            reason: "DoesNotExist",
            message: format!(
                "Issuing certificate as Secret {:?} does not exist",
                d.secret_name
            ),
        });
    };
    TRIGGER_CHAIN
        .iter()
        .find_map(|c| c(d, s, renewal_time, now))
}

fn trig(reason: &'static str, message: impl Into<String>) -> Option<Trigger> {
    Some(Trigger {
        reason,
        message: message.into(),
    })
}

fn check_missing_data(
    _: &Desired,
    s: &SecretView,
    _: Option<SystemTime>,
    _: SystemTime,
) -> Option<Trigger> {
    if s.cert.is_none() || s.key.is_none() {
        return trig(
            "MissingData",
            "Issuing certificate as Secret does not contain a certificate and a private key",
        );
    }
    None
}

fn check_invalid_certificate(
    _: &Desired,
    s: &SecretView,
    _: Option<SystemTime>,
    _: SystemTime,
) -> Option<Trigger> {
    if let Some(Err(e)) = &s.cert {
        return trig(
            "InvalidCertificate",
            format!("Issuing certificate as Secret contains an invalid certificate: {e}"),
        );
    }
    None
}

fn check_key_pair(
    _: &Desired,
    s: &SecretView,
    _: Option<SystemTime>,
    _: SystemTime,
) -> Option<Trigger> {
    if let Some(Err(e)) = &s.key {
        return trig(
            "InvalidKeyPair",
            format!("Issuing certificate as Secret contains an invalid private key: {e}"),
        );
    }
    if s.usable_key().is_none() {
        return trig(
            "InvalidKeyPair",
            "Issuing certificate as Secret's private key does not match its certificate",
        );
    }
    None
}

fn check_key_spec(
    d: &Desired,
    s: &SecretView,
    _: Option<SystemTime>,
    _: SystemTime,
) -> Option<Trigger> {
    let key = s.usable_key()?;
    if key.algorithm() != d.key.algorithm {
        return trig(
            "SecretMismatch",
            format!(
                "Issuing certificate as Secret's private key is {} but spec.privateKey asks for {}",
                key.algorithm(),
                d.key.algorithm
            ),
        );
    }
    let want = match (d.key.encoding, key.algorithm()) {
        (_, crate::keys::KeyAlgorithm::Ed25519) | (KeyEncoding::Pkcs8, _) => "PRIVATE KEY",
        (KeyEncoding::Pkcs1, crate::keys::KeyAlgorithm::Rsa(_)) => "RSA PRIVATE KEY",
        (KeyEncoding::Pkcs1, _) => "EC PRIVATE KEY",
    };
    if s.key_label.as_deref() != Some(want) {
        return trig(
            "SecretMismatch",
            format!("Issuing certificate as Secret's private key is not encoded as {want}"),
        );
    }
    None
}

fn check_names(
    d: &Desired,
    s: &SecretView,
    _: Option<SystemTime>,
    _: SystemTime,
) -> Option<Trigger> {
    let Some(Ok(c)) = &s.cert else { return None };
    if c.uris != [d.spiffe_id.clone()] {
        return trig(
            "SecretMismatch",
            format!(
                "Issuing certificate as Secret was issued for URIs {:?}, spec.uris asks for {:?}",
                c.uris, d.spiffe_id
            ),
        );
    }
    let mut have = c.dns_names.clone();
    have.sort();
    let mut want = d.dns_names.clone();
    want.sort();
    if have != want {
        return trig(
            "SecretMismatch",
            format!(
                "Issuing certificate as Secret was issued for DNS names {have:?}, spec.dnsNames asks for {want:?}"
            ),
        );
    }
    if d.common_name.is_some() && c.common_name != d.common_name {
        return trig(
            "SecretMismatch",
            format!(
                "Issuing certificate as Secret was issued for common name {:?}, spec.commonName asks for {:?}",
                c.common_name, d.common_name
            ),
        );
    }
    None
}

fn check_duration(
    d: &Desired,
    s: &SecretView,
    _: Option<SystemTime>,
    _: SystemTime,
) -> Option<Trigger> {
    let had = s.annotations.get(ANN_REQUESTED_DURATION).cloned();
    if had != d.duration_text {
        return trig(
            "SecretMismatch",
            format!(
                "Issuing certificate as spec.duration changed from {} to {}",
                had.as_deref().unwrap_or("the default"),
                d.duration_text.as_deref().unwrap_or("the default")
            ),
        );
    }
    None
}

fn check_issuer(
    d: &Desired,
    s: &SecretView,
    _: Option<SystemTime>,
    _: SystemTime,
) -> Option<Trigger> {
    let name = s.annotations.get(ANN_ISSUER_NAME).map(String::as_str);
    let kind = s.annotations.get(ANN_ISSUER_KIND).map(String::as_str);
    let want_kind = match d.issuer.kind {
        crate::issuers::IssuerKind::Issuer => "Issuer",
        crate::issuers::IssuerKind::ClusterIssuer => "ClusterIssuer",
    };
    if name != Some(d.issuer.name.as_str()) || kind != Some(want_kind) {
        return trig(
            "IncorrectIssuer",
            format!(
                "Issuing certificate as Secret was issued by {} {}, spec.issuerRef names {want_kind} {}",
                kind.unwrap_or("an unknown kind"),
                name.unwrap_or("an unknown issuer"),
                d.issuer.name
            ),
        );
    }
    None
}

fn check_expired(
    _: &Desired,
    s: &SecretView,
    _: Option<SystemTime>,
    now: SystemTime,
) -> Option<Trigger> {
    let Some(Ok(c)) = &s.cert else { return None };
    if c.not_after <= now {
        return trig(
            "Expired",
            format!(
                "Issuing certificate as it expired at {}",
                humantime::format_rfc3339_seconds(c.not_after)
            ),
        );
    }
    None
}

fn check_renewal_due(
    d: &Desired,
    s: &SecretView,
    renewal: Option<SystemTime>,
    now: SystemTime,
) -> Option<Trigger> {
    let Some(Ok(c)) = &s.cert else { return None };
    // Without a recorded renewal time (e.g. status lost), the nominal one, without jitter.
    let at = renewal.unwrap_or_else(|| {
        renewal_time(
            c.not_before,
            c.not_after,
            d.renew_before,
            d.renew_before_percentage,
            0.0,
        )
    });
    if at <= now {
        return trig(
            "Renewing",
            format!(
                "Renewing certificate as renewal was scheduled at {}",
                humantime::format_rfc3339_seconds(at)
            ),
        );
    }
    None
}
