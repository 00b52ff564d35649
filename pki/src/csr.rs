//! Certificate signing requests: the one CSR builder of Signet's clients. A CSR carries only
//! the names asked for; the server grants them under its own policy and takes nothing else
//! from it (ARCHITECTURE.md, "How one issuance flows").

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
        use x509_parser::prelude::FromDer as _;
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&kc.csr_der)
                .unwrap();
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
}
