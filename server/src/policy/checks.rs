//! The chain: the ordered checks [`super::Policy::decide`] runs, and those of them that are
//! the same whatever the grant source (the source-specific parts ask the resolver, see
//! [`super::source`]).
//!
//! Invariant: every check is a pure function of the decision's [`Ctx`] (and, after the
//! `identity` step, of the one identity it resolved); the first failing check is the answer,
//! so the order of [`CHAIN`] is part of the API (a request with several faults is told about
//! the first) and is tested as a whole.

use std::time::Duration;

use signet_types::SpiffeId;
use signet_types::dns::DnsName;
use signet_types::ttl::ABSURD_TTL_SECONDS;
use signet_types::untrusted::{quoted, shown};

use super::source::{Ctx, requested_uri};
use super::{Denial, Policy, is_reserved};
use crate::authn::CallerKind;

/// A check of the request itself, before the identity is known.
pub(super) type RequestCheck = fn(&Ctx<'_>) -> Result<(), Denial>;
/// A check that also sees the resolved identity.
pub(super) type GrantedCheck = fn(&Ctx<'_>, &SpiffeId) -> Result<(), Denial>;

/// One step of the chain.
pub(super) enum Step {
    Request(RequestCheck),
    /// Resolves the identity (once): the source's resolver, then the rules for every identity.
    Identity,
    Granted(GrantedCheck),
}

/// The checks, in the order they run. The first failure is reported.
pub(super) const CHAIN: &[(&str, Step)] = &[
    ("source", Step::Request(check_source)),
    ("renewal", Step::Request(check_renewal)),
    ("ttl", Step::Request(check_ttl)),
    ("single_uri", Step::Request(check_single_uri)),
    ("san_types", Step::Request(check_san_types)),
    ("identity", Step::Identity),
    ("dns_names", Step::Granted(check_dns_names)),
    ("ip_addresses", Step::Granted(check_ip_addresses)),
    ("reserved", Step::Granted(check_reserved)),
];

/// A check after `identity` ran before it: a mistake in [`CHAIN`], never a request's fault.
pub(super) fn unordered() -> Denial {
    Denial::invalid(
        "policy.chain",
        "the policy chain resolves the identity after checking it",
    )
}

/// The lifetime to grant for a requested number of seconds.
pub(super) fn granted_ttl(p: &Policy, seconds: i64) -> Result<Duration, Denial> {
    if seconds < 0 {
        return Err(Denial::invalid(
            "policy.ttl",
            format!("requested validity {seconds} s is negative; send 0 for the default"),
        ));
    }
    if seconds > ABSURD_TTL_SECONDS {
        return Err(Denial::invalid(
            "policy.ttl",
            format!(
                "requested validity {seconds} s is more than ten years, which is absurd; the \
                 longest this CA issues is {}",
                humantime::format_duration(p.max_ttl)
            ),
        ));
    }
    let Ok(seconds) = u64::try_from(seconds) else {
        return Err(Denial::invalid(
            "policy.ttl",
            "requested validity is negative",
        ));
    };
    if seconds == 0 {
        return Ok(p.default_ttl);
    }
    Ok(Duration::from_secs(seconds).min(p.max_ttl))
}

/// Who may use which grant source: the resolver's answer.
fn check_source(cx: &Ctx<'_>) -> Result<(), Denial> {
    cx.resolver.admit(cx)
}

/// An mTLS caller is renewing the certificate it presents: only with a basis that re-checked
/// that certificate's ledger row and source ([`super::renewal::assess`]), for the same
/// identity. A basis is meaningless for any other caller.
fn check_renewal(cx: &Ctx<'_>) -> Result<(), Denial> {
    let caller = cx.caller;
    match (caller.kind(), cx.req.renewal) {
        (CallerKind::Mtls { serial, .. }, Some(basis)) => {
            if basis.serial() != serial || basis.spiffe_id() != caller.spiffe_id() {
                return Err(Denial::denied(
                    "policy.renewal",
                    format!(
                        "the renewal check was made for another certificate than the one {} \
                         presented",
                        caller.spiffe_id()
                    ),
                ));
            }
            Ok(())
        }
        (CallerKind::Mtls { .. }, None) => Err(Denial::denied(
            "policy.renewal",
            format!(
                "caller {} presents a certificate whose source was not re-checked, so it may not \
                 renew it",
                caller.spiffe_id()
            ),
        )),
        (_, Some(_)) => Err(Denial::invalid(
            "policy.renewal",
            "a renewal basis applies only to a caller presenting a certificate over mTLS",
        )),
        (_, None) => Ok(()),
    }
}

/// The requested lifetime (an entry's own TTL when issuing for an entry) is one we grant.
fn check_ttl(cx: &Ctx<'_>) -> Result<(), Denial> {
    granted_ttl(cx.policy, cx.resolver.requested_ttl(cx)).map(|_| ())
}

fn check_single_uri(cx: &Ctx<'_>) -> Result<(), Denial> {
    requested_uri(cx.req).map(|_| ())
}

fn check_san_types(cx: &Ctx<'_>) -> Result<(), Denial> {
    let names = cx.req.names;
    if let Some(email) = names.emails.first() {
        return Err(Denial::denied(
            "policy.san_type",
            format!(
                "e-mail SAN {} is never issued: an X509-SVID carries a SPIFFE ID and DNS names",
                quoted(email)
            ),
        ));
    }
    if let Some(other) = names.other.first() {
        return Err(Denial::denied(
            "policy.san_type",
            format!(
                "SAN type {} is never issued: an X509-SVID carries a SPIFFE ID and DNS names",
                shown(other)
            ),
        ));
    }
    Ok(())
}

/// Each DNS name is valid, then one the source allows.
fn check_dns_names(cx: &Ctx<'_>, _: &SpiffeId) -> Result<(), Denial> {
    for name in &cx.req.names.dns_names {
        if !DnsName::is_valid(name) {
            return Err(Denial::invalid(
                "policy.dns_name",
                format!("{} is not a valid DNS name", quoted(name)),
            ));
        }
        cx.resolver.check_dns_name(cx, name)?;
    }
    Ok(())
}

fn check_ip_addresses(cx: &Ctx<'_>, _: &SpiffeId) -> Result<(), Denial> {
    let Some(ip) = cx.req.names.ip_addresses.first() else {
        return Ok(());
    };
    if cx.resolver.allows_ip_addresses() {
        return Ok(());
    }
    Err(Denial::denied(
        "policy.ip_address",
        format!(
            "caller {} may not obtain IP address {ip}: only the operator issues certificates \
             with IP addresses",
            cx.caller.spiffe_id()
        ),
    ))
}

/// Signet's own identities and names: `/signet/…` IDs only for the server itself and a node's
/// own ID; the server's DNS names and addresses only in the server's certificate, and no
/// wildcard may cover one of them. This runs for every grant, whoever the caller.
fn check_reserved(cx: &Ctx<'_>, id: &SpiffeId) -> Result<(), Denial> {
    let p = cx.policy;
    if is_reserved(id) && !cx.resolver.owns_reserved(cx, id) {
        return Err(Denial::denied(
            "policy.reserved",
            format!(
                "{id} is reserved: identities under spiffe://{}/signet/ are only ever \
                 Signet's own (the server's, a node's own node ID)",
                p.td
            ),
        ));
    }
    if cx.resolver.is_server_own() {
        return Ok(());
    }
    for name in &cx.req.names.dns_names {
        p.refuse_server_dns_name(name)?;
    }
    if let Some(ip) = cx
        .req
        .names
        .ip_addresses
        .iter()
        .find(|ip| p.server_ip_addresses.contains(ip))
    {
        return Err(Denial::denied(
            "policy.reserved",
            format!(
                "IP address {ip} is the CA server's own address; no other certificate may carry it"
            ),
        ));
    }
    Ok(())
}

/// The `reserved` check's rules, for whoever must apply them before a request exists: entry
/// creation (`crate::nodes::validate_entry`) refuses what signing would refuse, by these same
/// functions, so an entry is never stored that could only fail at signing.
impl Policy {
    /// Whether `id` is one of Signet's own identities (`/signet` and everything under it),
    /// which only the server itself and a node (for its own node ID) are ever granted.
    pub(crate) fn is_reserved_id(id: &SpiffeId) -> bool {
        is_reserved(id)
    }

    /// Refuses `name` if it is one of the CA server's own DNS names, or a wildcard covering
    /// one: only the server's own certificate may carry those, whoever asks.
    pub(crate) fn refuse_server_dns_name(&self, name: &str) -> Result<(), Denial> {
        let Some(reserved) = self
            .server_dns_names
            .iter()
            .find(|r| dns_name_covers(name, r))
        else {
            return Ok(());
        };
        let how = if name.eq_ignore_ascii_case(reserved) {
            String::new()
        } else {
            format!(" (through {name})")
        };
        Err(Denial::denied(
            "policy.reserved",
            format!(
                "DNS name {reserved}{how} is the CA server's own name; no other certificate may \
                 carry it"
            ),
        ))
    }
}

/// Whether a certificate for `granted` would be accepted for `name`: equal, or `granted` is a
/// wildcard (`*.rest`) matching `name`'s first label (how TLS clients match).
fn dns_name_covers(granted: &str, name: &str) -> bool {
    if granted.eq_ignore_ascii_case(name) {
        return true;
    }
    match (granted.strip_prefix("*."), name.split_once('.')) {
        (Some(rest), Some((_, name_rest))) => rest.eq_ignore_ascii_case(name_rest),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_resolved_once_before_the_checks_that_see_it() {
        let identity = CHAIN
            .iter()
            .position(|(_, s)| matches!(s, Step::Identity))
            .expect("an identity step");
        assert_eq!(
            CHAIN
                .iter()
                .filter(|(_, s)| matches!(s, Step::Identity))
                .count(),
            1
        );
        for (i, (name, step)) in CHAIN.iter().enumerate() {
            match step {
                Step::Request(_) => assert!(i < identity, "{name} runs before the identity"),
                Step::Granted(_) => assert!(i > identity, "{name} needs the identity"),
                Step::Identity => {}
            }
        }
    }

    #[test]
    fn a_wildcard_covers_one_label() {
        assert!(dns_name_covers("*.example.com", "signet.example.com"));
        assert!(dns_name_covers("Signet.Example.com", "signet.example.com"));
        assert!(!dns_name_covers("*.example.com", "a.signet.example.com"));
        assert!(!dns_name_covers("*.example.com", "example.com"));
    }
}
