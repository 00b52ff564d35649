//! Certificate signing requests: the one CSR builder of Signet's clients. A CSR carries only
//! the names asked for; the server grants them under its own policy and takes nothing else
//! from it (ARCHITECTURE.md, "How one issuance flows").

use std::collections::BTreeSet;

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::FromDer;

use crate::key::{KeyError, PrivateKey};

/// The names a CSR carries. The server grants them only under its own policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsrNames {
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub common_name: Option<String>,
}

/// A PEM CSR for `key` naming `names`.
pub fn build_csr(key: &PrivateKey, names: &CsrNames) -> Result<String, KeyError> {
    let kp = key.key_pair()?;
    let mut params = rcgen::CertificateParams::default();
    let mut sans = vec![rcgen::SanType::URI(
        names
            .spiffe_id
            .as_str()
            .try_into()
            .map_err(|e: rcgen::Error| KeyError::Csr(format!("URI {}: {e}", names.spiffe_id)))?,
    )];
    for d in &names.dns_names {
        sans.push(rcgen::SanType::DnsName(d.as_str().try_into().map_err(
            |e: rcgen::Error| KeyError::Csr(format!("DNS name {d:?}: {e}")),
        )?));
    }
    params.subject_alt_names = sans;
    let mut dn = rcgen::DistinguishedName::new();
    if let Some(cn) = &names.common_name {
        dn.push(rcgen::DnType::CommonName, cn.as_str());
    }
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(&kp)
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    csr.pem().map_err(|e| KeyError::Csr(e.to_string()))
}

/// A fresh private key and a CSR for it: the one such type of every Signet client
/// (`signet_client` re-exports it). The key stays with the caller. `Debug` shows the CSR only,
/// never the key.
pub struct KeyAndCsr {
    /// The private key, PKCS#8 DER.
    pub key_pkcs8_der: Vec<u8>,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
    pub csr_der: Vec<u8>,
    pub csr_pem: String,
}

impl std::fmt::Debug for KeyAndCsr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyAndCsr")
            .field("csr_pem", &self.csr_pem)
            .finish_non_exhaustive()
    }
}

/// An ECDSA P-256 key and a CSR carrying no names: the server fills in the caller's own
/// identity (an agent, a sidecar). The key never leaves this process.
pub fn new_key_and_csr() -> Result<KeyAndCsr, KeyError> {
    let key = crate::key::generate(crate::key::KeyAlgorithm::EcdsaP256)?;
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key.key_pair()?)
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    Ok(KeyAndCsr {
        csr_der: csr.der().to_vec(),
        csr_pem: csr.pem().map_err(|e| KeyError::Csr(e.to_string()))?,
        key_pem: key.to_pem(crate::key::KeyEncoding::Pkcs8)?,
        key_pkcs8_der: key.pkcs8_der().to_vec(),
    })
}

/// Why bytes are not a CSR Signet reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CsrError {
    /// Not a DER PKCS#10 request.
    #[error("does not parse as a PKCS#10 CSR: {0}")]
    Malformed(String),
    /// A request followed by more bytes.
    #[error("trailing bytes after the CSR")]
    TrailingBytes,
    /// The self-signature does not verify with the request's own public key.
    #[error("the CSR's signature does not verify with its own public key")]
    BadSignature,
}

/// A PKCS#10 request read once, its self-signature checked: what a client (the Kubernetes
/// bridge, before it forwards a CertificateRequest) may ask of a CSR it did not build. The
/// server's own CSR checks are the CA core's (`server/src/ca/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCsr {
    der: Vec<u8>,
    requests_ca: bool,
    usages: Option<BTreeSet<String>>,
}

impl ParsedCsr {
    /// Reads one DER request (nothing may follow it) and verifies its self-signature.
    pub fn from_der(der: &[u8]) -> Result<Self, CsrError> {
        let csr = match X509CertificationRequest::from_der(der) {
            Ok(([], csr)) => csr,
            Ok(_) => return Err(CsrError::TrailingBytes),
            Err(e) => return Err(CsrError::Malformed(e.to_string())),
        };
        csr.verify_signature().map_err(|_| CsrError::BadSignature)?;
        let mut requests_ca = false;
        let mut usages: Option<BTreeSet<String>> = None;
        for ext in csr.requested_extensions().into_iter().flatten() {
            match ext {
                ParsedExtension::BasicConstraints(bc) if bc.ca => requests_ca = true,
                ParsedExtension::KeyUsage(ku) => {
                    let set = usages.get_or_insert_with(BTreeSet::new);
                    for (on, name) in [
                        (ku.digital_signature(), "digital signature"),
                        (ku.non_repudiation(), "content commitment"),
                        (ku.key_encipherment(), "key encipherment"),
                        (ku.data_encipherment(), "data encipherment"),
                        (ku.key_agreement(), "key agreement"),
                        (ku.key_cert_sign(), "cert sign"),
                        (ku.crl_sign(), "crl sign"),
                        (ku.encipher_only(), "encipher only"),
                        (ku.decipher_only(), "decipher only"),
                    ] {
                        if on {
                            set.insert(name.into());
                        }
                    }
                }
                ParsedExtension::ExtendedKeyUsage(eku) => {
                    let set = usages.get_or_insert_with(BTreeSet::new);
                    for (on, name) in [
                        (eku.any, "any"),
                        (eku.server_auth, "server auth"),
                        (eku.client_auth, "client auth"),
                        (eku.code_signing, "code signing"),
                        (eku.email_protection, "email protection"),
                        (eku.time_stamping, "timestamping"),
                        (eku.ocsp_signing, "ocsp signing"),
                    ] {
                        if on {
                            set.insert(name.into());
                        }
                    }
                    for oid in &eku.other {
                        set.insert(format!("oid {oid}"));
                    }
                }
                _ => {}
            }
        }
        Ok(Self {
            der: der.to_vec(),
            requests_ca,
            usages,
        })
    }

    /// The request asks for basicConstraints CA:TRUE.
    pub fn requests_ca(&self) -> bool {
        self.requests_ca
    }

    /// The key usages and extended key usages it requests, spelled as cert-manager's
    /// `spec.usages` (`digital signature`, `server auth`, … ; an unnamed extended usage as
    /// `oid <dotted>`); `None` when it carries neither extension.
    pub fn usages(&self) -> Option<&BTreeSet<String>> {
        self.usages.as_ref()
    }

    /// The request, DER.
    pub fn der(&self) -> &[u8] {
        &self.der
    }
    pub fn into_der(self) -> Vec<u8> {
        self.der
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_and_csr_match_and_debug_hides_the_key() {
        let kc = new_key_and_csr().unwrap();
        let key = PrivateKey::from_pkcs8_der(&kc.key_pkcs8_der).unwrap();
        assert_eq!(
            key.to_pem(crate::key::KeyEncoding::Pkcs8).unwrap(),
            kc.key_pem
        );
        let (_, csr) = X509CertificationRequest::from_der(&kc.csr_der).unwrap();
        assert_eq!(
            csr.certification_request_info.subject_pki.raw,
            key.public_key_der().unwrap().as_slice()
        );
        let shown = format!("{kc:?}");
        assert!(shown.contains("BEGIN CERTIFICATE REQUEST"), "{shown}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        assert!(
            !shown.contains(&format!("{:?}", kc.key_pkcs8_der)),
            "{shown}"
        );
    }

    #[test]
    fn a_parsed_csr_names_its_usages_and_whether_it_asks_for_a_ca() {
        let key = rcgen::KeyPair::generate().unwrap();
        let der = |f: &dyn Fn(&mut rcgen::CertificateParams)| {
            let mut p = rcgen::CertificateParams::default();
            f(&mut p);
            p.serialize_request(&key).unwrap().der().to_vec()
        };
        let plain = ParsedCsr::from_der(&der(&|_| {})).unwrap();
        assert!(!plain.requests_ca());
        assert_eq!(plain.usages(), None);
        let with = ParsedCsr::from_der(&der(&|p| {
            p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
            p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        }))
        .unwrap();
        let names: Vec<&str> = with.usages().unwrap().iter().map(String::as_str).collect();
        assert_eq!(names, ["digital signature", "server auth"]);
        let ca = ParsedCsr::from_der(&der(&|p| {
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }))
        .unwrap();
        assert!(ca.requests_ca());
        assert!(matches!(
            ParsedCsr::from_der(b"junk"),
            Err(CsrError::Malformed(_))
        ));
        let mut trailing = der(&|_| {});
        trailing.push(0);
        assert_eq!(ParsedCsr::from_der(&trailing), Err(CsrError::TrailingBytes));
        let mut flipped = der(&|_| {});
        let n = flipped.len();
        flipped[n - 2] ^= 0x01;
        assert!(ParsedCsr::from_der(&flipped).is_err());
    }
}
