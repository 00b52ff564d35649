//! Test fixtures shared by the agent's unit tests: a CA that really signs (rcgen), so every
//! certificate a test hands the agent is a real [`signet_pki::SvidCertificate`] or
//! [`signet_pki::X509Svid`] that passed the constructors' checks, never one built by hand.
//! Compiled for tests only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use signet_pki::{SvidCertificate, X509Svid};

use crate::ca::Crl;
use crate::sinks::Delivered;

/// Why a test CA could not sign: rcgen refused the request, or the chain is not an SVID.
#[derive(Debug, thiserror::Error)]
pub enum TestCaError {
    #[error("{0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{0}")]
    Svid(#[from] signet_pki::SvidError),
}

/// A test CA (rcgen) that signs leaves, CSRs and CRLs.
pub struct TestCa {
    pub issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub der: Vec<u8>,
    pub key_id: String,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_owned());
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        p.key_identifier_method = rcgen::KeyIdMethod::Sha256;
        let now = signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock);
        p.not_before = (now - Duration::from_secs(3600)).into();
        p.not_after = (now + Duration::from_secs(86_400)).into();
        let cert = p.self_signed(&key).expect("ca");
        let der = cert.der().to_vec();
        let key_id = signet_pki::ParsedCert::from_der(&der)
            .expect("parse")
            .subject_key_id()
            .expect("ski")
            .to_owned();
        Self {
            issuer: rcgen::Issuer::new(p, key),
            der,
            key_id,
        }
    }

    /// An intermediate CA named `name` with `serial`, signed by this CA (its authority key
    /// identifier is this CA's key ID), valid for a day.
    pub fn intermediate(&self, name: &str, serial: u64) -> TestCa {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_owned());
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        p.key_identifier_method = rcgen::KeyIdMethod::Sha256;
        p.use_authority_key_identifier_extension = true;
        p.serial_number = Some(rcgen::SerialNumber::from(serial.to_be_bytes().to_vec()));
        let now = signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock);
        p.not_before = (now - Duration::from_secs(3600)).into();
        p.not_after = (now + Duration::from_secs(86_400)).into();
        let cert = p.signed_by(&key, &self.issuer).expect("intermediate");
        let der = cert.der().to_vec();
        let key_id = signet_pki::ParsedCert::from_der(&der)
            .expect("parse")
            .subject_key_id()
            .expect("ski")
            .to_owned();
        TestCa {
            issuer: rcgen::Issuer::new(p, key),
            der,
            key_id,
        }
    }

    /// A leaf with `serial` for `spiffe_id`, valid from `nb` for `ttl`, with its key.
    pub fn leaf(
        &self,
        spiffe_id: &str,
        serial: u64,
        nb: SystemTime,
        ttl: Duration,
    ) -> (Vec<u8>, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let der = sign(&self.issuer, &key, spiffe_id, Some(serial), nb, nb + ttl).expect("leaf");
        (der, key)
    }

    /// What a server answers to `csr_der` (a PEM-less DER CSR): a certificate for
    /// `spiffe_id` with the CSR's key, valid from `nb` for `ttl`, chain leaf then this CA.
    pub fn issue(
        &self,
        csr_der: &[u8],
        spiffe_id: &str,
        serial: u64,
        nb: SystemTime,
        ttl: Duration,
    ) -> Result<SvidCertificate, TestCaError> {
        let leaf = sign_csr(&self.issuer, csr_der, spiffe_id, Some(serial), nb, nb + ttl)?;
        Ok(SvidCertificate::from_chain_der(vec![
            leaf,
            self.der.clone(),
        ])?)
    }

    /// A CRL numbered `number` listing `serials`.
    pub fn crl(&self, number: u64, serials: &[u64]) -> Vec<u8> {
        let serials: Vec<Vec<u8>> = serials.iter().map(|s| s.to_be_bytes().to_vec()).collect();
        crl(
            &self.issuer,
            signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock),
            number,
            &serials,
        )
    }

    pub fn crl_msg(&self, number: u64, serials: &[u64]) -> Crl {
        Crl {
            key_id: self.key_id.clone(),
            der: self.crl(number, serials),
            number,
        }
    }
}

/// A CRL by `issuer` issued at `now` (valid for an hour), numbered `number`, listing
/// `serials` (raw DER integer bytes) as revoked for key compromise.
pub fn crl(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    now: SystemTime,
    number: u64,
    serials: &[Vec<u8>],
) -> Vec<u8> {
    rcgen::CertificateRevocationListParams {
        this_update: now.into(),
        next_update: (now + Duration::from_secs(3600)).into(),
        crl_number: rcgen::SerialNumber::from(number.to_be_bytes().to_vec()),
        issuing_distribution_point: None,
        revoked_certs: serials
            .iter()
            .map(|s| rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from(s.clone()),
                revocation_time: now.into(),
                reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(issuer)
    .expect("crl")
    .der()
    .to_vec()
}

/// A certificate for `spiffe_id` and `public_key`, signed by `issuer`, valid `nb`..`na`.
pub fn sign(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    public_key: &impl rcgen::PublicKeyData,
    spiffe_id: &str,
    serial: Option<u64>,
    nb: SystemTime,
    na: SystemTime,
) -> Result<Vec<u8>, TestCaError> {
    let mut p = rcgen::CertificateParams::default();
    p.subject_alt_names = vec![rcgen::SanType::URI(spiffe_id.try_into()?)];
    p.serial_number = serial.map(|s| rcgen::SerialNumber::from(s.to_be_bytes().to_vec()));
    p.not_before = nb.into();
    p.not_after = na.into();
    p.use_authority_key_identifier_extension = true;
    let cert = p.signed_by(public_key, issuer)?;
    Ok(cert.der().to_vec())
}

/// [`sign`] for the key of a DER CSR.
pub fn sign_csr(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    csr_der: &[u8],
    spiffe_id: &str,
    serial: Option<u64>,
    nb: SystemTime,
    na: SystemTime,
) -> Result<Vec<u8>, TestCaError> {
    let csr_pem = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", csr_der.to_vec()));
    let csr = rcgen::CertificateSigningRequestParams::from_pem(&csr_pem)?;
    sign(issuer, &csr.public_key, spiffe_id, serial, nb, na)
}

/// A self-signed X509-SVID for `spiffe_id` valid from `nb` for `ttl` (where only its shape
/// counts, not who signed it).
pub fn self_signed_svid(spiffe_id: &str, nb: SystemTime, ttl: Duration) -> X509Svid {
    let key = signet_pki::generate(signet_pki::KeyAlgorithm::EcdsaP256).expect("key");
    let kp = rcgen::KeyPair::try_from(key.pkcs8_der()).expect("key pair");
    let mut p = rcgen::CertificateParams::default();
    p.subject_alt_names = vec![rcgen::SanType::URI(spiffe_id.try_into().expect("uri"))];
    p.not_before = nb.into();
    p.not_after = (nb + ttl).into();
    let der = p.self_signed(&kp).expect("cert").der().to_vec();
    X509Svid::new(
        SvidCertificate::from_chain_der(vec![der]).expect("certificate"),
        key,
    )
    .expect("svid")
}

/// The `n`th delivery for `spiffe_id`, the same value each time it is asked for in one test
/// binary: chain (a leaf valid from a minute ago for an hour, then its CA), key, bundle
/// (another root), no CRLs.
pub fn delivered(spiffe_id: &str, n: u8) -> Delivered {
    static CACHE: OnceLock<Mutex<HashMap<(String, u8), Delivered>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    cache
        .entry((spiffe_id.to_owned(), n))
        .or_insert_with(|| {
            let ca = TestCa::new(&format!("ca {n}"));
            let root = TestCa::new(&format!("root {n}"));
            let nb = signet_runtime::clock::Clock::now(&signet_runtime::clock::SystemClock)
                - Duration::from_secs(60);
            let (leaf, key) = ca.leaf(spiffe_id, n.into(), nb, Duration::from_secs(3600));
            Delivered {
                svid: Arc::new(
                    X509Svid::from_der(vec![leaf, ca.der.clone()], &key.serialize_der())
                        .expect("svid"),
                ),
                bundle_der: vec![root.der.clone()].into(),
                crls_der: Default::default(),
                federated: Vec::new(),
            }
        })
        .clone()
}
