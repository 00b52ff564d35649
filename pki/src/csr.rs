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

/// A fresh workload key and a CSR for it. `Debug` shows the CSR only.
pub struct KeyAndCsr {
    pub key: PrivateKey,
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
        key,
    })
}
