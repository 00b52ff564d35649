//! The X509-SVID leaf profile and signing.
//!
//! Names come from the [`Grant`] only; the CSR contributes its public key. A CSR asking for a
//! name outside the grant is refused (Istio's contract), never silently narrowed.

use std::time::SystemTime;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose,
    SanType, SerialNumber,
};
use signet_types::SpiffeId;

use super::authority::{Authority, floor_secs, to_offset};
use super::csr::VerifiedCsr;
use super::serial::SerialSource;
use super::validate::check_leaf;
use super::{BACKDATE, Grant, IssueError, IssuedCert};

/// Refuses a CSR that asks for anything the grant does not contain.
fn check_request(csr: &VerifiedCsr, grant: &Grant) -> Result<(), IssueError> {
    let req = csr.requested();
    match req.uris.as_slice() {
        [] => {}
        [one] if one.parse::<SpiffeId>().ok().as_ref() == Some(grant.spiffe_id()) => {}
        uris => {
            return Err(IssueError::NotGranted(format!(
                "the CSR asks for URI SAN(s) {uris:?}, but the caller may only have {}",
                grant.spiffe_id()
            )));
        }
    }
    for dns in &req.dns_names {
        if !grant
            .dns_names()
            .iter()
            .any(|g| g.eq_ignore_ascii_case(dns))
        {
            return Err(IssueError::NotGranted(format!(
                "the CSR asks for DNS name {dns:?}, which {} may not have",
                grant.spiffe_id()
            )));
        }
    }
    for ip in &req.ip_addresses {
        if !grant.ip_addresses().contains(ip) {
            return Err(IssueError::NotGranted(format!(
                "the CSR asks for IP address {ip}, which {} may not have",
                grant.spiffe_id()
            )));
        }
    }
    if !req.emails.is_empty() {
        return Err(IssueError::NotGranted(format!(
            "the CSR asks for e-mail SAN(s) {:?}; Signet never issues e-mail names",
            req.emails
        )));
    }
    if !req.other.is_empty() {
        return Err(IssueError::NotGranted(format!(
            "the CSR asks for SAN types Signet never issues: {}",
            req.other.join(", ")
        )));
    }
    if grant.spiffe_id().path().is_empty() {
        return Err(IssueError::NotGranted(format!(
            "{} has no path; an X509-SVID leaf needs a workload path",
            grant.spiffe_id()
        )));
    }
    Ok(())
}

/// Signs an X509-SVID leaf for `grant` with `csr`'s public key, then re-validates it.
pub fn issue(
    authority: &Authority,
    csr: &VerifiedCsr,
    grant: &Grant,
    now: SystemTime,
    serials: &dyn SerialSource,
) -> Result<IssuedCert, IssueError> {
    check_request(csr, grant)?;

    let ca_nb = authority.not_before();
    let ca_na = authority.not_after();
    if now < ca_nb || now >= ca_na {
        return Err(IssueError::CaNotValid(format!(
            "CA {} is valid from {} to {} (unix seconds), now is {}",
            authority.key_id(),
            unix(ca_nb),
            unix(ca_na),
            unix(now)
        )));
    }
    let out_of_range = || IssueError::Signing("the validity period is out of range".into());
    let not_before = now.checked_sub(BACKDATE).map_or(ca_nb, |t| t.max(ca_nb));
    let not_after = now.checked_add(grant.ttl()).map_or(ca_na, |t| t.min(ca_na));
    let not_before = floor_secs(not_before).ok_or_else(out_of_range)?;
    let not_after = floor_secs(not_after).ok_or_else(out_of_range)?;
    if not_after <= now {
        return Err(
            if not_after >= floor_secs(ca_na).ok_or_else(out_of_range)? {
                IssueError::CaNotValid(format!(
                    "CA {} expires within the second",
                    authority.key_id()
                ))
            } else {
                IssueError::Signing(format!(
                    "the granted lifetime {:?} is shorter than one second",
                    grant.ttl()
                ))
            },
        );
    }

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Signet");
    params.distinguished_name = dn;
    let ia5 = |s: &str, what: &str| {
        s.try_into()
            .map_err(|e| IssueError::Signing(format!("{what} {s:?} cannot be encoded: {e}")))
    };
    let mut sans = vec![SanType::URI(ia5(
        &grant.spiffe_id().to_string(),
        "SPIFFE ID",
    )?)];
    for dns in grant.dns_names() {
        sans.push(SanType::DnsName(ia5(dns, "DNS name")?));
    }
    sans.extend(grant.ip_addresses().iter().copied().map(SanType::IpAddress));
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    if csr.key_algorithm().is_rsa() {
        params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
    }
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(SerialNumber::from_slice(&serials.next_serial()));
    params.not_before = to_offset(not_before).ok_or_else(out_of_range)?;
    params.not_after = to_offset(not_after).ok_or_else(out_of_range)?;

    let cert = params
        .signed_by(csr.rcgen_public_key(), authority.issuer())
        .map_err(|e| IssueError::Signing(e.to_string()))?;
    let der = cert.der().to_vec();

    let info = check_leaf(&der, authority.cert_der(), now).map_err(IssueError::SelfCheck)?;
    let leaf = super::validate::parse_cert(&der).map_err(IssueError::SelfCheck)?;
    if leaf.public_key().raw != csr.public_key_der() {
        return Err(IssueError::SelfCheck(
            "the certified public key differs from the CSR's".into(),
        ));
    }
    if info.spiffe_id != *grant.spiffe_id()
        || info.dns_names != grant.dns_names()
        || info.ip_addresses != grant.ip_addresses()
        || info.not_before != not_before
        || info.not_after != not_after
    {
        return Err(IssueError::SelfCheck(
            "the certificate's names or validity differ from what was granted".into(),
        ));
    }

    let mut chain = Vec::with_capacity(1 + authority.chain().len());
    chain.push(der.clone());
    chain.extend(authority.chain());
    Ok(IssuedCert {
        sha256: signet_types::ledger::sha256(&der),
        der,
        chain,
        serial: info.serial,
        spiffe_id: info.spiffe_id,
        dns_names: info.dns_names,
        ip_addresses: info.ip_addresses,
        not_before,
        not_after,
        ca_key_id: authority.key_id().to_owned(),
    })
}

fn unix(t: SystemTime) -> String {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs().to_string(),
        Err(e) => format!("-{}", e.duration().as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use rcgen::{KeyPair, PublicKeyData, SanType};
    use x509_parser::extensions::GeneralName;
    use x509_parser::oid_registry::{
        OID_SIG_ECDSA_WITH_SHA256, OID_SIG_ECDSA_WITH_SHA384, OID_X509_EXT_SUBJECT_ALT_NAME,
    };

    use super::*;
    use crate::ca::authority::tests::{ca_cert, rsa_root};
    use crate::ca::serial::{RandomSerials, SequentialSerials};
    use crate::ca::testutil::{self, grant, id, now, openssl, openssl_verify, p256_csr};
    use crate::ca::validate::{parse_cert, subject_key_id, to_system_time};
    use crate::config::KeyType;

    const HOUR: Duration = Duration::from_secs(3600);

    fn uri(s: &str) -> SanType {
        SanType::URI(s.try_into().expect("ia5"))
    }

    fn dns(s: &str) -> SanType {
        SanType::DnsName(s.try_into().expect("ia5"))
    }

    #[test]
    fn leaf_profile_field_by_field() {
        let (ca, _) = testutil::root(KeyType::EcdsaP256, 24 * HOUR);
        let (_, csr) = p256_csr();
        let g = grant("/ns/default/sa/web", HOUR)
            .with_dns_names(vec!["web.default.svc".into()])
            .with_ip_addresses(vec![
                "10.1.2.3".parse().expect("ip"),
                "::1".parse().expect("ip"),
            ]);
        let issued = ca
            .issue(
                &csr,
                &g,
                now(),
                &SequentialSerials::with_high(0x8000_0000_0000_0000, 5),
            )
            .expect("issues");

        let leaf = parse_cert(&issued.der).expect("parses");
        let root = parse_cert(ca.cert_der()).expect("root");
        assert_eq!(leaf.version().0, 2, "v3");
        // Serial: 0x80.. is encoded with a leading zero so the INTEGER is positive.
        assert_eq!(leaf.raw_serial().len(), 17);
        assert_eq!(leaf.raw_serial()[0], 0x00);
        assert_eq!(issued.serial, "80000000000000000000000000000005");
        assert_eq!(
            leaf.signature_algorithm.algorithm,
            OID_SIG_ECDSA_WITH_SHA256
        );
        assert_eq!(leaf.subject().to_string(), "O=Signet");
        assert_eq!(leaf.issuer().as_raw(), root.subject().as_raw());
        assert_eq!(leaf.public_key().raw, csr.public_key_der());
        // Validity: backdated by BACKDATE, TTL from the grant.
        assert_eq!(
            to_system_time(&leaf.validity().not_before),
            now() - BACKDATE
        );
        assert_eq!(to_system_time(&leaf.validity().not_after), now() + HOUR);
        // SANs: exactly one URI, then the granted DNS and IP names; not critical (subject set).
        let san = leaf.subject_alternative_name().expect("ok").expect("SAN");
        assert!(!san.critical);
        assert_eq!(
            san.value.general_names,
            vec![
                GeneralName::URI("spiffe://example.org/ns/default/sa/web"),
                GeneralName::DNSName("web.default.svc"),
                GeneralName::IPAddress(&[10, 1, 2, 3]),
                GeneralName::IPAddress(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            ]
        );
        let bc = leaf.basic_constraints().expect("ok").expect("BC");
        assert!(bc.critical && !bc.value.ca);
        let ku = leaf.key_usage().expect("ok").expect("KU");
        assert!(ku.critical);
        assert!(ku.value.digital_signature());
        assert!(
            !ku.value.key_encipherment(),
            "EC keys get no keyEncipherment"
        );
        assert!(!ku.value.key_cert_sign() && !ku.value.crl_sign());
        let eku = leaf.extended_key_usage().expect("ok").expect("EKU");
        assert!(eku.value.server_auth && eku.value.client_auth);
        assert!(!eku.value.any && eku.value.other.is_empty());
        assert!(subject_key_id(&leaf).is_some());
        let aki = leaf
            .iter_extensions()
            .find_map(|e| match e.parsed_extension() {
                x509_parser::extensions::ParsedExtension::AuthorityKeyIdentifier(a) => {
                    a.key_identifier.as_ref().map(|k| k.0)
                }
                _ => None,
            })
            .expect("AKI");
        assert_eq!(Some(aki), subject_key_id(&root));
        assert_eq!(hex::encode(aki), ca.key_id());
        assert!(
            leaf.extensions()
                .iter()
                .all(|e| !e.critical || e.oid != OID_X509_EXT_SUBJECT_ALT_NAME)
        );
        leaf.verify_signature(Some(root.public_key()))
            .expect("signed by root");

        // Every IssuedCert field.
        assert_eq!(
            issued.chain,
            vec![issued.der.clone(), ca.cert_der().to_vec()]
        );
        assert_eq!(issued.spiffe_id, id("/ns/default/sa/web"));
        assert_eq!(issued.dns_names, g.dns_names());
        assert_eq!(issued.ip_addresses, g.ip_addresses());
        assert_eq!(issued.not_before, now() - BACKDATE);
        assert_eq!(issued.not_after, now() + HOUR);
        assert_eq!(issued.sha256, signet_types::ledger::sha256(&issued.der));
        assert_eq!(issued.ca_key_id, ca.key_id());
        let info = check_leaf(&issued.der, ca.cert_der(), now()).expect("valid");
        assert_eq!(info.serial, issued.serial);
    }

    #[test]
    fn ttl_capped_at_ca_not_after_and_backdate_floored_at_ca_not_before() {
        let (ca, _) = testutil::root(KeyType::EcdsaP256, 2 * HOUR);
        let (_, csr) = p256_csr();
        let serials = SequentialSerials::new(1);
        // Right after the CA was made (its notBefore is now - BACKDATE): the leaf's notBefore
        // would precede the CA's, so it is raised to it.
        let at = now() - Duration::from_secs(5);
        let issued = ca
            .issue(&csr, &grant("/w", HOUR), at, &serials)
            .expect("issues");
        assert_eq!(issued.not_before, ca.not_before());
        assert_eq!(issued.not_after, at + HOUR);
        // Later: plain backdating.
        let at = now() + HOUR;
        let issued = ca
            .issue(&csr, &grant("/w", 24 * HOUR), at, &serials)
            .expect("issues");
        assert_eq!(issued.not_before, at - BACKDATE);
        // And a long TTL is capped at the CA's notAfter.
        assert_eq!(issued.not_after, ca.not_after());
        // Sub-second `now` is floored like the certificate's times.
        let at = now() + HOUR + Duration::from_millis(1500);
        let issued = ca
            .issue(&csr, &grant("/w", HOUR / 2), at, &serials)
            .expect("issues");
        assert_eq!(
            issued.not_before,
            now() + HOUR + Duration::from_secs(1) - BACKDATE
        );
    }

    #[test]
    fn refuses_when_ca_not_valid() {
        let (ca, _) = testutil::root(KeyType::EcdsaP256, HOUR);
        let (_, csr) = p256_csr();
        let serials = SequentialSerials::new(1);
        for at in [
            ca.not_before() - Duration::from_secs(1),
            ca.not_after(),
            ca.not_after() + HOUR,
        ] {
            let err = ca
                .issue(&csr, &grant("/w", HOUR), at, &serials)
                .expect_err("invalid");
            assert!(matches!(err, IssueError::CaNotValid(_)), "{err}");
        }
    }

    #[test]
    fn refuses_names_outside_the_grant() {
        let (ca, _) = testutil::root(KeyType::EcdsaP256, HOUR);
        let key = KeyPair::generate().expect("key");
        let serials = SequentialSerials::new(1);
        let g = grant("/ns/a/sa/web", HOUR)
            .with_dns_names(vec!["web.a.svc".into()])
            .with_ip_addresses(vec!["10.0.0.1".parse::<IpAddr>().expect("ip")]);
        let refused = |sans: Vec<SanType>| {
            let csr = testutil::csr(&key, sans);
            match ca.issue(&csr, &g, now(), &serials) {
                Err(IssueError::NotGranted(msg)) => msg,
                other => panic!("expected NotGranted, got {other:?}"),
            }
        };
        let msg = refused(vec![uri("spiffe://example.org/ns/b/sa/db")]);
        assert!(msg.contains("spiffe://example.org/ns/b/sa/db"), "{msg}");
        refused(vec![
            uri("spiffe://example.org/ns/a/sa/web"),
            uri("spiffe://example.org/x"),
        ]);
        refused(vec![uri("spiffe://other.org/ns/a/sa/web")]);
        let msg = refused(vec![dns("evil.example.com")]);
        assert!(msg.contains("evil.example.com"), "{msg}");
        refused(vec![SanType::IpAddress("10.0.0.2".parse().expect("ip"))]);
        refused(vec![SanType::Rfc822Name(
            "a@example.org".try_into().expect("ia5"),
        )]);

        // Asking for exactly what was granted (or a subset, or nothing) is fine.
        for sans in [
            vec![],
            vec![uri("spiffe://example.org/ns/a/sa/web")],
            vec![uri("spiffe://example.org/ns/a/sa/web"), dns("WEB.a.svc")],
            vec![SanType::IpAddress("10.0.0.1".parse().expect("ip"))],
        ] {
            let csr = testutil::csr(&key, sans);
            let issued = ca.issue(&csr, &g, now(), &serials).expect("granted");
            // The certificate carries the grant's names, not the CSR's.
            assert_eq!(issued.dns_names, g.dns_names());
            assert_eq!(issued.ip_addresses, g.ip_addresses());
        }
        // A grant for the trust domain itself is not a leaf identity.
        let csr = testutil::csr(&key, vec![]);
        let root_grant = g
            .clone()
            .with_spiffe_id("spiffe://example.org".parse().expect("id"));
        assert!(matches!(
            ca.issue(&csr, &root_grant, now(), &serials),
            Err(IssueError::NotGranted(_))
        ));
    }

    #[test]
    fn rsa_and_ed25519_leaf_keys() {
        let (ca, _) = testutil::root(KeyType::EcdsaP384, HOUR);
        let serials = SequentialSerials::new(1);
        let rsa_csr = openssl(&[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "/dev/null",
            "-subj",
            "/CN=x",
        ]);
        let csr = VerifiedCsr::parse(&rsa_csr).expect("RSA CSR");
        let issued = ca
            .issue(&csr, &grant("/rsa", HOUR), now(), &serials)
            .expect("issues");
        let leaf = parse_cert(&issued.der).expect("parses");
        assert_eq!(
            leaf.signature_algorithm.algorithm,
            OID_SIG_ECDSA_WITH_SHA384
        );
        let ku = leaf.key_usage().expect("ok").expect("KU");
        assert!(ku.value.digital_signature() && ku.value.key_encipherment());
        assert_eq!(leaf.public_key().raw, csr.public_key_der());

        let ed = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        let csr = testutil::csr(&ed, vec![]);
        let issued = ca
            .issue(&csr, &grant("/ed", HOUR), now(), &serials)
            .expect("issues");
        let leaf = parse_cert(&issued.der).expect("parses");
        assert_eq!(leaf.public_key().raw, ed.subject_public_key_info());
    }

    #[test]
    fn openssl_verify_strict_generated_roots() {
        let dir = tempfile::tempdir().expect("tempdir");
        for key_type in [KeyType::EcdsaP256, KeyType::EcdsaP384] {
            let (ca, _) = testutil::root(key_type, 24 * HOUR);
            let (_, csr) = p256_csr();
            let g =
                grant("/ns/default/sa/web", HOUR).with_dns_names(vec!["web.default.svc".into()]);
            let issued = ca
                .issue(&csr, &g, now(), &RandomSerials::new())
                .expect("issues");
            openssl_verify(dir.path(), ca.roots(), &[], &issued.der)
                .unwrap_or_else(|e| panic!("{key_type:?}: {e}"));
            // The chain helper agrees: leaf + root.
            assert_eq!(issued.chain.len(), 2);
        }
    }

    #[test]
    fn openssl_verify_strict_plugged_in_intermediate_with_rsa_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = rsa_root();
        let key = KeyPair::generate().expect("key");
        let (_, ca_c) = ca_cert("Operator issuing CA", &key, &pki.root_issuer);
        let chain_pem = format!("{}{}", ca_c.pem(), pki.root_pem);
        let ca = Authority::from_cacerts_pem(
            ca_c.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            chain_pem.as_bytes(),
            pki.root_pem.as_bytes(),
        )
        .expect("loads");
        for csr in [
            p256_csr().1,
            VerifiedCsr::parse(&openssl(&[
                "req",
                "-new",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "/dev/null",
                "-subj",
                "/CN=x",
            ]))
            .expect("RSA CSR"),
        ] {
            let issued = ca
                .issue(&csr, &grant("/plugged", HOUR), now(), &RandomSerials::new())
                .expect("issues");
            assert_eq!(issued.chain.len(), 3);
            assert_eq!(issued.chain[1], ca_c.der().to_vec());
            assert_eq!(issued.chain[2], pki.root_der);
            // Untrusted: the intermediate only (what a client gets between leaf and root).
            openssl_verify(dir.path(), ca.roots(), &issued.chain[1..2], &issued.der)
                .expect("openssl verify");
            // Without the intermediate it must fail (sanity check of the harness).
            assert!(openssl_verify(dir.path(), ca.roots(), &[], &issued.der).is_err());
        }
    }
}
