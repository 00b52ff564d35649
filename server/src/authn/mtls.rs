//! Callers presenting a Signet X509-SVID over mTLS.
//!
//! The TLS layer has already verified the chain against Signet's bundle; this module reads the
//! identity out of the verified leaf and refuses anything that is not a proper X509-SVID leaf of
//! our trust domain.

use signet_pki::ParsedCert;
use signet_types::{SpiffeId, TrustDomain};

use super::{AuthenticatedCaller, AuthnError, CallerKind};

/// Reads the caller's identity from a client certificate (DER) that the TLS layer has ALREADY
/// verified against Signet's bundle.
///
/// Requires exactly one URI SAN, a SPIFFE ID in `td` with a non-empty path, and no cA=true.
pub fn authenticate_peer(
    leaf_der: &[u8],
    td: &TrustDomain,
) -> Result<AuthenticatedCaller, AuthnError> {
    let cert = ParsedCert::from_der(leaf_der).map_err(|e| bad(e.to_string()))?;
    if cert.is_ca() {
        return Err(bad(
            "it is a CA certificate (basicConstraints cA=true), not an X509-SVID leaf",
        ));
    }
    if cert.key_cert_sign() {
        return Err(bad(
            "it may sign certificates (keyUsage keyCertSign), so it is not an X509-SVID leaf",
        ));
    }
    let id: SpiffeId = cert.spiffe_id().map_err(|e| bad(e.to_string()))?;
    if !id.is_member_of(td) {
        return Err(bad(format!(
            "{id} is not in trust domain {td}; this server only authenticates its own trust domain"
        )));
    }
    if id.path().is_empty() {
        return Err(bad(format!(
            "{id} is a trust domain ID with no path; a workload's ID names a path"
        )));
    }

    let serial = cert.serial_hex().to_owned();
    let dns_names = cert.dns_names().to_vec();
    let leaf_sha256 = signet_types::ledger::sha256(leaf_der);
    // A node SVID makes the caller a node, whatever API it calls; policy decides what a node
    // may do (renew itself, sign its entries' workloads, nothing else).
    if let Some(node_id) = crate::nodes::node_id_of(&id, td) {
        let node_id = node_id.to_owned();
        return Ok(AuthenticatedCaller::new(
            id,
            CallerKind::Node {
                node_id,
                serial: Some(serial),
                leaf_sha256: Some(leaf_sha256),
            },
        ));
    }
    Ok(AuthenticatedCaller::new(
        id,
        CallerKind::Mtls {
            dns_names,
            serial,
            leaf_sha256,
        },
    ))
}

fn bad(reason: impl Into<String>) -> AuthnError {
    AuthnError::BadCertificate(reason.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
    };

    fn td() -> TrustDomain {
        TrustDomain::new("example.org").expect("td")
    }

    fn uri(s: &str) -> SanType {
        SanType::URI(s.try_into().expect("ia5"))
    }

    fn dns(s: &str) -> SanType {
        SanType::DnsName(s.try_into().expect("ia5"))
    }

    fn cert(sans: Vec<SanType>, ca: bool) -> Vec<u8> {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = sans;
        params.serial_number = Some(SerialNumber::from_slice(&[0x00, 0x8f, 0x01, 0x02]));
        if ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        } else {
            params.is_ca = IsCa::ExplicitNoCa;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        }
        params.self_signed(&key).expect("sign").der().to_vec()
    }

    fn refused(der: &[u8]) -> String {
        match authenticate_peer(der, &td()) {
            Err(AuthnError::BadCertificate(m)) => m,
            other => panic!("expected BadCertificate, got {other:?}"),
        }
    }

    #[test]
    fn good_leaf_is_accepted() {
        let der = cert(
            vec![
                uri("spiffe://example.org/ns/default/sa/web"),
                dns("web.default.svc"),
                dns("web.example.org"),
            ],
            false,
        );
        let caller = authenticate_peer(&der, &td()).expect("accepted");
        assert_eq!(
            caller.spiffe_id().to_string(),
            "spiffe://example.org/ns/default/sa/web"
        );
        assert_eq!(
            caller.kind(),
            &CallerKind::Mtls {
                dns_names: vec!["web.default.svc".into(), "web.example.org".into()],
                serial: "8f0102".into(),
                leaf_sha256: signet_types::ledger::sha256(&der),
            }
        );
        assert_eq!(
            caller.label(),
            "mtls:spiffe://example.org/ns/default/sa/web"
        );
    }

    #[test]
    fn node_svid_makes_a_node_caller() {
        let der = cert(vec![uri("spiffe://example.org/signet/node/n1")], false);
        let caller = authenticate_peer(&der, &td()).expect("accepted");
        assert_eq!(
            caller.kind(),
            &CallerKind::Node {
                node_id: "n1".into(),
                serial: Some("8f0102".into()),
                leaf_sha256: Some(signet_types::ledger::sha256(&der)),
            }
        );
        assert_eq!(caller.label(), "node:spiffe://example.org/signet/node/n1");
        // Not a valid node ID below /signet/node/: an ordinary mTLS caller.
        let der = cert(vec![uri("spiffe://example.org/signet/node/a/b")], false);
        let caller = authenticate_peer(&der, &td()).expect("accepted");
        assert!(matches!(caller.kind(), CallerKind::Mtls { .. }));
    }

    #[test]
    fn leaf_without_basic_constraints_is_accepted() {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![uri("spiffe://example.org/agent")];
        params.is_ca = IsCa::NoCa;
        let der = params.self_signed(&key).expect("sign").der().to_vec();
        let caller = authenticate_peer(&der, &td()).expect("accepted");
        assert_eq!(caller.spiffe_id().path(), "/agent");
    }

    #[test]
    fn two_uri_sans_are_refused() {
        let der = cert(
            vec![uri("spiffe://example.org/a"), uri("spiffe://example.org/b")],
            false,
        );
        assert!(refused(&der).contains("2 URI SANs"));
    }

    #[test]
    fn other_trust_domain_is_refused() {
        let der = cert(vec![uri("spiffe://evil.example/ns/default/sa/web")], false);
        let msg = refused(&der);
        assert!(msg.contains("not in trust domain example.org"), "{msg}");
    }

    #[test]
    fn missing_or_bad_uri_is_refused() {
        let msg = refused(&cert(vec![dns("web.example.org")], false));
        assert!(msg.contains("no URI SAN"), "{msg}");
        let msg = refused(&cert(vec![], false));
        assert!(
            msg.contains("no subjectAltName") || msg.contains("no URI"),
            "{msg}"
        );
        let msg = refused(&cert(vec![uri("https://example.org/x")], false));
        assert!(msg.contains("not a SPIFFE ID"), "{msg}");
        let msg = refused(&cert(vec![uri("spiffe://example.org")], false));
        assert!(msg.contains("no path"), "{msg}");
    }

    #[test]
    fn ca_certificate_is_refused() {
        let der = cert(vec![uri("spiffe://example.org/ns/default/sa/web")], true);
        let msg = refused(&der);
        assert!(msg.contains("cA=true"), "{msg}");
    }

    #[test]
    fn garbage_is_refused() {
        refused(b"not a certificate");
        refused(&[]);
        let mut der = cert(vec![uri("spiffe://example.org/x")], false);
        der.push(0);
        assert!(refused(&der).contains("unexpected bytes"));
    }
}
