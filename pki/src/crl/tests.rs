// These tests build CRLs around the real time of day; nothing here is product logic.
#![allow(clippy::disallowed_methods)]
use std::time::{Duration, SystemTime};

use super::*;

struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert: ParsedCert,
}

fn ca(name: &str) -> Ca {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, name.to_owned());
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    p.key_identifier_method = rcgen::KeyIdMethod::Sha256;
    let der = p.self_signed(&key).unwrap().der().to_vec();
    Ca {
        issuer: rcgen::Issuer::new(p, key),
        cert: ParsedCert::from_der(&der).unwrap(),
    }
}

fn crl(ca: &Ca, number: u64, serials: &[&[u8]]) -> Vec<u8> {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    rcgen::CertificateRevocationListParams {
        this_update: now.into(),
        next_update: (now + Duration::from_secs(3600)).into(),
        crl_number: rcgen::SerialNumber::from(number.to_be_bytes().to_vec()),
        issuing_distribution_point: None,
        revoked_certs: serials
            .iter()
            .enumerate()
            .map(|(i, s)| rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from(s.to_vec()),
                revocation_time: now.into(),
                reason_code: (i == 0).then_some(rcgen::RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(&ca.issuer)
    .unwrap()
    .der()
    .to_vec()
}

#[test]
fn reads_number_times_issuer_and_entries() {
    let ca = ca("ca");
    let der = crl(&ca, 7, &[&[0x00, 0x8f, 0x01], &[0x05]]);
    let c = ParsedCrl::from_der(&der).unwrap();
    assert_eq!(c.number(), Some(7));
    assert_eq!(c.authority_key_id(), ca.cert.subject_key_id());
    assert_eq!(c.issuer_der(), ca.cert.subject_der());
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    assert_eq!(c.this_update(), t);
    assert_eq!(c.next_update(), Some(t + Duration::from_secs(3600)));
    assert_eq!(c.entries().len(), 2);
    assert_eq!(
        c.entries().get(&[0x8f, 0x01][..]),
        Some(&Some(CrlReason::KeyCompromise))
    );
    assert_eq!(c.entries().get(&[0x05][..]), Some(&None));
    assert_eq!(CrlReason::KeyCompromise.code(), 1);
    assert_eq!(CrlReason::RemoveFromCrl.code(), 8);
    assert_eq!(CrlReason::Other(42).code(), 42);
    for code in 0..=12 {
        assert_eq!(
            CrlReason::from_code(code).code(),
            code,
            "round trip of {code}"
        );
    }
    assert!(c.lists(&[0x00, 0x8f, 0x01]) && c.lists(&[0x8f, 0x01]) && !c.lists(&[0x06]));
    assert_eq!(c.der(), der.as_slice());
    // PEM round trip.
    let pem = c.to_pem();
    assert!(pem.starts_with("-----BEGIN X509 CRL-----\n"));
    assert_eq!(ParsedCrl::from_pem(pem.as_bytes()).unwrap(), c);
    assert!(format!("{c:?}").contains("entries: 2"));
}

#[test]
fn verifies_against_its_issuer_only() {
    let (ca, evil, same_name) = (ca("ca"), ca("evil"), ca("ca"));
    let c = ParsedCrl::from_der(&crl(&ca, 1, &[])).unwrap();
    assert_eq!(c.verify(&ca.cert), Ok(()));
    assert_eq!(c.verify(&evil.cert), Err(CrlError::IssuerMismatch));
    assert_eq!(c.verify(&same_name.cert), Err(CrlError::BadSignature));
    let mut tampered = crl(&ca, 1, &[]);
    let n = tampered.len();
    tampered[n - 3] ^= 0x55;
    match ParsedCrl::from_der(&tampered) {
        Ok(t) => assert_eq!(t.verify(&ca.cert), Err(CrlError::BadSignature)),
        Err(e) => assert!(matches!(e, CrlError::Malformed(_)), "{e}"),
    }
}

#[test]
fn malformed_crls_are_refused() {
    let ca = ca("ca");
    assert!(matches!(
        ParsedCrl::from_der(b"junk"),
        Err(CrlError::Malformed(_))
    ));
    let mut der = crl(&ca, 1, &[]);
    der.push(0);
    assert_eq!(ParsedCrl::from_der(&der), Err(CrlError::TrailingBytes));
    let big = rcgen::CertificateRevocationListParams {
        this_update: SystemTime::now().into(),
        next_update: SystemTime::now().into(),
        crl_number: rcgen::SerialNumber::from(vec![0x01; 9]),
        issuing_distribution_point: None,
        revoked_certs: vec![],
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(&ca.issuer)
    .unwrap();
    assert_eq!(
        ParsedCrl::from_der(big.der()),
        Err(CrlError::NumberTooLarge)
    );
    assert!(matches!(ParsedCrl::from_pem(b""), Err(CrlError::Pem(_))));
    let cert_pem = signet_types::pem::certs_to_pem([ca.cert.der()]);
    assert!(matches!(
        ParsedCrl::from_pem(cert_pem.as_bytes()),
        Err(CrlError::Pem(_))
    ));
}

/// The fuzz seed (fuzz/corpus/crl, a real CRL written by `openssl ca -gencrl`) reads as
/// OpenSSL wrote it and verifies against the issuer beside it; every corpus file gets the
/// fuzz target's checks.
#[test]
fn the_fuzz_corpus_holds_a_real_crl() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/crl");
    let issuer = std::fs::read(dir.join("issuer-cert.pem")).unwrap();
    let issuer = ParsedCert::from_pem_first(&issuer).unwrap();
    let der = std::fs::read(dir.join("openssl-ec.der")).unwrap();
    let crl = ParsedCrl::from_der(&der).unwrap();
    assert_eq!(crl.number(), Some(4096));
    assert_eq!(crl.authority_key_id(), issuer.subject_key_id());
    assert_eq!(crl.verify(&issuer), Ok(()));
    assert_eq!(
        crl.entries().get(&[0x8f, 0x01][..]),
        Some(&Some(CrlReason::KeyCompromise))
    );
    assert_eq!(crl.entries().get(&[0x05][..]), Some(&None));
    let pem = std::fs::read(dir.join("openssl-ec.pem")).unwrap();
    assert_eq!(ParsedCrl::from_pem(&pem).unwrap(), crl);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        if let Ok(crl) = ParsedCrl::from_der(&data) {
            assert_eq!(ParsedCrl::from_pem(crl.to_pem().as_bytes()).unwrap(), crl);
        }
        let _ = ParsedCrl::from_pem(&data);
    }
}

/// One table: every defined reason's code and name read back, names parse in any spelling,
/// an undefined code keeps its number, and only holds are not final.
#[test]
fn reason_codes_names_and_finality_round_trip() {
    assert_eq!(CrlReason::DEFINED.len(), 10);
    for r in CrlReason::DEFINED {
        assert_eq!(CrlReason::from_code(r.code()), r);
        let name = r.name().unwrap();
        assert_eq!(name.parse(), Ok(r));
        assert_eq!(r.to_string(), name);
    }
    assert_eq!(CrlReason::PrivilegeWithdrawn.code(), 9);
    assert_eq!(CrlReason::from_code(7), CrlReason::Other(7));
    assert_eq!(CrlReason::Other(7).code(), 7);
    assert_eq!(CrlReason::Other(7).name(), None);
    assert_eq!(CrlReason::Other(7).to_string(), "reason code 7");
    assert_eq!("key-compromise".parse(), Ok(CrlReason::KeyCompromise));
    assert_eq!("CA_COMPROMISE".parse(), Ok(CrlReason::CaCompromise));
    assert_eq!("removefromcrl".parse(), Ok(CrlReason::RemoveFromCrl));
    assert_eq!(
        "hold".parse::<CrlReason>(),
        Err(UnknownCrlReason("hold".into()))
    );
    let not_final: Vec<_> = CrlReason::DEFINED
        .into_iter()
        .filter(|r| !r.is_final())
        .collect();
    assert_eq!(
        not_final,
        [CrlReason::CertificateHold, CrlReason::RemoveFromCrl]
    );
    assert!(!CrlReason::Other(7).is_final());
}
