//! Tests of the issuance pipeline: the leaf profile field by field, the caps on validity, the
//! refusals, other key types, independent verification with OpenSSL, and the self-check.

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
use crate::ca::validate::{check_leaf, subject_key_id, to_system_time};
use crate::ca::{Authority, BACKDATE, KeyType};

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
    let g = grant("/ns/default/sa/web", HOUR);
    let g = g.with_dns_names(vec!["web.default.svc".into()]);
    let g = g.with_ip_addresses(vec![
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
    let g = grant("/ns/a/sa/web", HOUR);
    let g = g.with_dns_names(vec!["web.a.svc".into()]);
    let g = g.with_ip_addresses(vec!["10.0.0.1".parse::<IpAddr>().expect("ip")]);
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
    let root_grant = g.clone();
    let root_grant = root_grant.with_spiffe_id("spiffe://example.org".parse().expect("id"));
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
        let g = grant("/ns/default/sa/web", HOUR);
        let g = g.with_dns_names(vec!["web.default.svc".into()]);
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

// --- the self-check ------------------------------------------------------------------

fn signed(ca: &Authority, g: &Grant) -> (VerifiedCsr, LeafTemplate, Vec<u8>) {
    let (_, csr) = p256_csr();
    let window = CaWindow {
        key_id: ca.key_id(),
        not_before: ca.not_before(),
        not_after: ca.not_after(),
    };
    let leaf =
        template::leaf(window, &csr, g, now(), &SequentialSerials::new(7)).expect("template");
    let der = ca.sign(&leaf, &csr).expect("signs");
    (csr, leaf, der)
}

#[test]
fn the_self_check_accepts_what_the_pipeline_signed() {
    let (ca, _) = testutil::root(KeyType::EcdsaP256, 24 * HOUR);
    let g = grant("/w", HOUR);
    let (csr, leaf, der) = signed(&ca, &g);
    let info = self_check(&der, ca.issuer_facts(), &csr, &g, &leaf, now()).expect("valid");
    assert_eq!(info.spiffe_id, *g.spiffe_id());
}

#[test]
fn the_self_check_refuses_another_key_other_names_other_validity_another_ca() {
    let (ca, _) = testutil::root(KeyType::EcdsaP256, 24 * HOUR);
    let g = grant("/w", HOUR);
    let (csr, leaf, der) = signed(&ca, &g);
    let self_check_err = |r: Result<LeafInfo, IssueError>| match r {
        Err(IssueError::SelfCheck(m)) => m.to_string(),
        other => panic!("expected a self-check failure, got {other:?}"),
    };

    let (_, other_csr) = p256_csr();
    let m = self_check_err(self_check(
        &der,
        ca.issuer_facts(),
        &other_csr,
        &g,
        &leaf,
        now(),
    ));
    assert!(m.contains("public key differs"), "{m}");

    let other_grant = grant("/other", HOUR);
    let m = self_check_err(self_check(
        &der,
        ca.issuer_facts(),
        &csr,
        &other_grant,
        &leaf,
        now(),
    ));
    assert!(m.contains("differ from what was granted"), "{m}");

    let g_dns = g.clone();
    let g_dns = g_dns.with_dns_names(vec!["extra.example".into()]);
    let m = self_check_err(self_check(
        &der,
        ca.issuer_facts(),
        &csr,
        &g_dns,
        &leaf,
        now(),
    ));
    assert!(m.contains("differ from what was granted"), "{m}");

    let shifted = LeafTemplate {
        params: leaf.params.clone(),
        not_before: leaf.not_before - Duration::from_secs(1),
        not_after: leaf.not_after,
    };
    let m = self_check_err(self_check(
        &der,
        ca.issuer_facts(),
        &csr,
        &g,
        &shifted,
        now(),
    ));
    assert!(m.contains("differ from what was granted"), "{m}");

    let (other_ca, _) = testutil::root(KeyType::EcdsaP256, 24 * HOUR);
    self_check_err(self_check(
        &der,
        other_ca.issuer_facts(),
        &csr,
        &g,
        &leaf,
        now(),
    ));
}

/// The self-check's signature verification is the guard against a faulty signer: a leaf whose
/// signature does not verify under the CA key never leaves, whether a bit of the signature or
/// of the signed body changed.
#[test]
fn the_self_check_refuses_a_signature_that_does_not_verify() {
    let (ca, _) = testutil::root(KeyType::EcdsaP256, 24 * HOUR);
    let g = grant("/w", HOUR);
    let (csr, leaf, der) = signed(&ca, &g);
    let self_check_err =
        |der: &[u8]| match self_check(der, ca.issuer_facts(), &csr, &g, &leaf, now()) {
            Err(IssueError::SelfCheck(m)) => m.to_string(),
            other => panic!("expected a self-check failure, got {other:?}"),
        };
    // The last byte is the signature's (the DER ends with the signature BIT STRING).
    let mut bad_sig = der.clone();
    let last = bad_sig.len() - 1;
    bad_sig[last] ^= 0x01;
    let m = self_check_err(&bad_sig);
    assert!(m.contains("signature does not verify"), "{m}");
    // A byte of the signed body (inside the validity, a digit of the notAfter time): the
    // profile still holds, the signature does not.
    let pos = der
        .windows(2)
        .rposition(|w| w == [0x17, 0x0d])
        .expect("a UTCTime");
    let mut bad_body = der.clone();
    bad_body[pos + 2 + 11] ^= 0x01; // the seconds' last digit: '0'..'9' stays a digit
    let m = self_check_err(&bad_body);
    assert!(m.contains("signature does not verify"), "{m}");
}
