//! The three status transitions of a Certificate as pure functions of (status, what the spec
//! asks for, the Secret, now): each returns the status it wants and when to look again. The
//! reconcilers in [`super`] do the I/O around them.
//!
//! - [`trigger`] owns `Issuing=True`: a (re)issuance is due and the failure backoff is over.
//! - issuing (I/O only, in [`super::issue`]) owns `Issuing=False`/its removal, `revision`,
//!   `lastFailureTime` and `failedIssuanceAttempts`, via [`issued`] and [`failed`].
//! - [`readiness`] owns `Ready`, `notBefore`, `notAfter` and `renewalTime`.

use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::policy::{Blocked, Desired, SecretView, clamp_note, failure_backoff, renewal_time};
use super::triggers::{Trigger, issuance_reason};
use crate::certmanager::{CONDITION_ISSUING, CONDITION_READY, CertificateStatus};
use crate::conditions::{self, Condition, ConditionStatus};
use crate::revocation::Revocations;

pub fn to_system(t: &Time) -> SystemTime {
    SystemTime::from(t.0)
}

/// When the failure backoff ends, if a failure is recorded.
pub fn backoff_until(st: &CertificateStatus) -> Option<SystemTime> {
    let last = st.last_failure_time.as_ref()?;
    Some(to_system(last) + failure_backoff(st.failed_issuance_attempts.unwrap_or(1)))
}

fn until(now: SystemTime, t: SystemTime) -> Duration {
    t.duration_since(now).unwrap_or(Duration::from_secs(1))
}

/// Why the Secret's certificate must be replaced now although it is otherwise current:
/// issued under a CA key the server's bundle names as tainted (`IssuerKeyTainted`), or listed
/// in its issuer's CRL (`Revoked`).
pub fn compromised(secret: Option<&SecretView>, revocations: &Revocations) -> Option<Trigger> {
    let Some(Some(Ok(cert))) = secret.map(|s| s.cert.as_ref()) else {
        return None;
    };
    let why = revocations.check_parts(cert.issuer_key_id.as_deref(), &cert.serial)?;
    Some(Trigger {
        reason: if why.contains("tainted") {
            "IssuerKeyTainted"
        } else {
            "Revoked"
        },
        message: format!("Issuing certificate as the certificate {why}"),
    })
}

/// Sets `Issuing=True` when an issuance is due, unless blocked or backing off. A certificate
/// issued under a tainted key or revoked is due now (see [`compromised`]); one that came back
/// compromised again counts as a failed issuance, so the failure backoff holds the next one.
pub fn trigger(
    st: &CertificateStatus,
    d: Option<&Desired>,
    blocked: Option<&Blocked>,
    secret: Option<&SecretView>,
    now: SystemTime,
    generation: Option<i64>,
    revocations: &Revocations,
) -> (CertificateStatus, Option<Duration>) {
    let mut next = st.clone();
    let (Some(d), None) = (d, blocked) else {
        return (next, None);
    };
    if conditions::is_true(&st.conditions, CONDITION_ISSUING) {
        return (next, None);
    }
    let renewal = st.renewal_time.as_ref().map(to_system);
    let Some(why) =
        issuance_reason(d, secret, renewal, now).or_else(|| compromised(secret, revocations))
    else {
        return (next, renewal.map(|r| until(now, r)));
    };
    if let Some(t) = backoff_until(st)
        && now < t
    {
        return (next, Some(until(now, t)));
    }
    conditions::set(
        &mut next.conditions,
        Condition::new(
            CONDITION_ISSUING,
            ConditionStatus::True,
            why.reason,
            why.message,
        )
        .with_generation(generation),
        &conditions::time(now),
    );
    (next, None)
}

/// The status after an issuance whose new certificate is compromised too (the server still
/// signs with the tainted key): issued, and counted as a failure so that the trigger waits the
/// failure backoff before the next attempt instead of looping.
pub fn issued_compromised(
    before: &CertificateStatus,
    after: &CertificateStatus,
    now: SystemTime,
) -> (CertificateStatus, Duration) {
    let mut next = after.clone();
    let attempts = before.failed_issuance_attempts.unwrap_or(0) + 1;
    next.failed_issuance_attempts = Some(attempts);
    next.last_failure_time = Some(conditions::time(now));
    (next, failure_backoff(attempts))
}

/// The status after a successful issuance: `Issuing` removed, `revision` + 1, failures cleared.
pub fn issued(st: &CertificateStatus) -> CertificateStatus {
    let mut next = st.clone();
    next.conditions.retain(|c| c.type_ != CONDITION_ISSUING);
    next.revision = Some(st.revision.unwrap_or(0) + 1);
    next.last_failure_time = None;
    next.failed_issuance_attempts = None;
    next
}

/// The status after a failed issuance. A permanent failure ends the attempt (`Issuing=False`,
/// reason `Failed`); the trigger starts another after the backoff. A retryable one keeps
/// `Issuing=True` and says why it waits. Either way the failure is counted and timed.
pub fn failed(
    st: &CertificateStatus,
    permanent: bool,
    reason: &str,
    message: &str,
    now: SystemTime,
    generation: Option<i64>,
) -> (CertificateStatus, Duration) {
    let mut next = st.clone();
    let attempts = st.failed_issuance_attempts.unwrap_or(0) + 1;
    let wait = failure_backoff(attempts);
    next.failed_issuance_attempts = Some(attempts);
    next.last_failure_time = Some(conditions::time(now));
    let cond = if permanent {
        Condition::new(
            CONDITION_ISSUING,
            ConditionStatus::False,
            "Failed",
            format!(
                "The certificate request failed ({reason}): {message}; attempt {attempts}, retrying in {}",
                humantime::format_duration(wait)
            ),
        )
    } else {
        Condition::new(
            CONDITION_ISSUING,
            ConditionStatus::True,
            reason,
            format!(
                "Waiting to retry: {message}; attempt {attempts}, retrying in {}",
                humantime::format_duration(wait)
            ),
        )
    };
    conditions::set(
        &mut next.conditions,
        cond.with_generation(generation),
        &conditions::time(now),
    );
    (next, wait)
}

/// Ends an issuance that cannot start (blocked or invalid spec): `Issuing=False` with the
/// reason, not counted as a failure (nothing was asked of the server).
pub fn abandoned(
    st: &CertificateStatus,
    blocked: &Blocked,
    now: SystemTime,
    generation: Option<i64>,
) -> CertificateStatus {
    let mut next = st.clone();
    conditions::set(
        &mut next.conditions,
        Condition::new(
            CONDITION_ISSUING,
            ConditionStatus::False,
            blocked.reason,
            blocked.message.clone(),
        )
        .with_generation(generation),
        &conditions::time(now),
    );
    next
}

/// Derives `Ready`, `notBefore`, `notAfter` and `renewalTime` from the Secret. The renewal
/// time is drawn once per certificate (`jitter` in `[0, 1)`) and kept while `notAfter` is
/// unchanged, so certificates issued together renew apart.
pub fn readiness(
    st: &CertificateStatus,
    d: Option<&Desired>,
    blocked: Option<&Blocked>,
    secret: Option<&SecretView>,
    now: SystemTime,
    jitter: f64,
    generation: Option<i64>,
) -> (CertificateStatus, Option<Duration>) {
    let mut next = st.clone();
    let valid = secret.and_then(|s| match (&s.cert, s.usable_key()) {
        (Some(Ok(c)), Some(_)) => Some(c),
        _ => None,
    });
    let mut wake = None;
    match valid {
        Some(c) => {
            let same = st.not_after.as_ref().map(to_system) == Some(c.not_after);
            next.not_before = Some(conditions::time(c.not_before));
            next.not_after = Some(conditions::time(c.not_after));
            if !(same && st.renewal_time.is_some()) {
                let (rb, pct) = d
                    .map(|d| (d.renew_before, d.renew_before_percentage))
                    .unwrap_or((None, None));
                next.renewal_time = Some(conditions::time(renewal_time(
                    c.not_before,
                    c.not_after,
                    rb,
                    pct,
                    jitter,
                )));
            }
            let renew = next.renewal_time.as_ref().map(to_system);
            wake = renew.map(|r| until(now, r.min(c.not_after)));
        }
        None => {
            next.not_before = None;
            next.not_after = None;
            next.renewal_time = None;
        }
    }
    let issuing = conditions::get(&st.conditions, CONDITION_ISSUING);
    let (status, reason, message) = if let Some(b) = blocked {
        (
            ConditionStatus::False,
            b.reason.to_owned(),
            b.message.clone(),
        )
    } else if let Some(d) = d {
        let renewal = next.renewal_time.as_ref().map(to_system);
        match issuance_reason(d, secret, renewal, now) {
            None => ready_true(d, valid),
            Some(t) if t.reason == "Renewing" => ready_true(d, valid),
            Some(t) => match issuing {
                // A failed attempt says more than "the Secret does not exist".
                Some(i) if st.last_failure_time.is_some() => (
                    ConditionStatus::False,
                    i.reason.clone().unwrap_or_else(|| "Failed".into()),
                    i.message.clone().unwrap_or_default(),
                ),
                _ => (ConditionStatus::False, t.reason.to_owned(), t.message),
            },
        }
    } else {
        return (next, wake);
    };
    conditions::set(
        &mut next.conditions,
        Condition::new(CONDITION_READY, status, &reason, message).with_generation(generation),
        &conditions::time(now),
    );
    (next, wake)
}

fn ready_true(
    d: &Desired,
    valid: Option<&super::policy::IssuedCert>,
) -> (ConditionStatus, String, String) {
    let mut message = "Certificate is up to date and has not expired".to_owned();
    if let Some(note) = valid.and_then(|c| clamp_note(d, c)) {
        message.push_str("; ");
        message.push_str(&note);
    }
    (ConditionStatus::True, "Ready".into(), message)
}
