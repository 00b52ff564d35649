//! Checks on a CertificateRequest's CSR made before any call to the server: it parses, its
//! signature holds, it does not ask for a CA, and its key usages agree with `spec.usages`
//! and `spec.isCA`. Pure functions; the message of each refusal says what to fix.

use std::collections::BTreeSet;

use signet_pki::{CsrError, ParsedCsr};

/// cert-manager's default `usages` when a request lists none.
pub const DEFAULT_USAGES: &[&str] = &["digital signature", "key encipherment"];

/// The usages a Signet SVID may carry.
pub const ALLOWED_USAGES: &[&str] = &[
    "digital signature",
    "key encipherment",
    "key agreement",
    "content commitment",
    "data encipherment",
    "server auth",
    "client auth",
];

/// A CSR that passed [`check`]: DER, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedCsr {
    pub der: Vec<u8>,
}

fn normalize(u: &str) -> String {
    match u.trim().to_ascii_lowercase().as_str() {
        "signing" => "digital signature".into(),
        other => other.to_owned(),
    }
}

/// Why a CertificateRequest's CSR is refused before any call to the server. The message is
/// the Failed condition's message: it says what to fix.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CsrRefusal {
    #[error(
        "spec.isCA is true, but Signet issues workload (leaf) certificates only: set isCA to false"
    )]
    IsCa,
    /// A PEM block with another label (the label).
    #[error("spec.request holds a PEM {0:?} block, not a CERTIFICATE REQUEST")]
    NotACsr(String),
    /// Not PEM at all.
    #[error("spec.request is not a PEM certificate request: {0}")]
    NotPem(pem::PemError),
    #[error("spec.request has trailing bytes after the CSR")]
    TrailingBytes,
    #[error("the CSR's signature does not verify with its own public key")]
    BadSignature,
    /// The DER is not a CSR Signet reads.
    #[error("spec.request {0}")]
    Malformed(CsrError),
    #[error(
        "the CSR asks for a CA certificate (basicConstraints CA:TRUE) while spec.isCA is \
         false: Signet issues leaf certificates only"
    )]
    RequestsCa,
    /// A usage outside [`ALLOWED_USAGES`] (normalized).
    #[error("spec.usages asks for {0:?}{hint}; Signet issues only {allowed}", hint = usage_hint(.0), allowed = ALLOWED_USAGES.join(", "))]
    UsageNotAllowed(String),
    /// The CSR's own key usages are not those of `spec.usages` (normalized, defaults applied).
    #[error(
        "the CSR's key usages [{}] disagree with spec.usages [{}]: encode the same usages \
         in both, or none in the CSR",
        join(.csr),
        join(.spec)
    )]
    UsagesDisagree {
        csr: BTreeSet<String>,
        spec: BTreeSet<String>,
    },
}

impl From<CsrError> for CsrRefusal {
    fn from(e: CsrError) -> Self {
        match e {
            CsrError::TrailingBytes => CsrRefusal::TrailingBytes,
            CsrError::BadSignature => CsrRefusal::BadSignature,
            other => CsrRefusal::Malformed(other),
        }
    }
}

/// Why a usage cannot be had, when it is one of a CA's.
fn usage_hint(usage: &str) -> &'static str {
    if usage == "cert sign" || usage == "crl sign" {
        " (it needs a CA certificate, which Signet does not issue)"
    } else {
        ""
    }
}

fn join(s: &BTreeSet<String>) -> String {
    s.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// Checks `request` (the PEM CSR of `spec.request`) against `is_ca` and `usages`.
pub fn check(request: &[u8], is_ca: bool, usages: &[String]) -> Result<CheckedCsr, CsrRefusal> {
    if is_ca {
        return Err(CsrRefusal::IsCa);
    }
    let der = match pem::parse(request) {
        Ok(p) if p.tag() == "CERTIFICATE REQUEST" || p.tag() == "NEW CERTIFICATE REQUEST" => {
            p.into_contents()
        }
        Ok(p) => return Err(CsrRefusal::NotACsr(p.tag().to_owned())),
        Err(e) => return Err(CsrRefusal::NotPem(e)),
    };
    let csr = ParsedCsr::from_der(&der)?;
    if csr.requests_ca() {
        return Err(CsrRefusal::RequestsCa);
    }

    let spec_usages: BTreeSet<String> = if usages.is_empty() {
        DEFAULT_USAGES.iter().map(|s| (*s).to_owned()).collect()
    } else {
        usages.iter().map(|u| normalize(u)).collect()
    };
    if let Some(bad) = spec_usages
        .iter()
        .find(|u| !ALLOWED_USAGES.contains(&u.as_str()))
    {
        return Err(CsrRefusal::UsageNotAllowed(bad.clone()));
    }
    if let Some(csr_usages) = csr.usages()
        && *csr_usages != spec_usages
    {
        return Err(CsrRefusal::UsagesDisagree {
            csr: csr_usages.clone(),
            spec: spec_usages,
        });
    }
    Ok(CheckedCsr { der })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

    fn csr(f: impl FnOnce(&mut CertificateParams)) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![]).unwrap();
        f(&mut p);
        p.serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap()
            .into_bytes()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn plain_csr_passes_with_default_usages() {
        assert!(check(&csr(|_| {}), false, &[]).is_ok());
        assert!(check(&csr(|_| {}), false, &s(&["server auth", "client auth"])).is_ok());
    }

    #[test]
    fn is_ca_refused() {
        let e = check(&csr(|_| {}), true, &[]).unwrap_err();
        assert_eq!(e, CsrRefusal::IsCa);
        assert!(e.to_string().contains("spec.isCA"), "{e}");
    }

    #[test]
    fn ca_csr_refused() {
        let e = check(
            &csr(|p| p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained)),
            false,
            &[],
        )
        .unwrap_err();
        assert_eq!(e, CsrRefusal::RequestsCa);
        assert!(e.to_string().contains("CA:TRUE"), "{e}");
    }

    #[test]
    fn garbage_refused() {
        assert!(
            check(b"hello", false, &[])
                .unwrap_err()
                .to_string()
                .contains("not a PEM")
        );
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(
            check(cert.as_bytes(), false, &[])
                .unwrap_err()
                .to_string()
                .contains("CERTIFICATE\"")
        );
        let junk = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n";
        assert!(
            check(junk.as_bytes(), false, &[])
                .unwrap_err()
                .to_string()
                .contains("PKCS#10")
        );
    }

    #[test]
    fn usages_must_agree() {
        let with = csr(|p| {
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        });
        assert!(
            check(
                &with,
                false,
                &s(&["digital signature", "key encipherment", "server auth"])
            )
            .is_ok()
        );
        assert!(
            check(
                &with,
                false,
                &s(&["signing", "key encipherment", "server auth"])
            )
            .is_ok()
        );
        let e = check(
            &with,
            false,
            &s(&["digital signature", "key encipherment", "client auth"]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("disagree with spec.usages"), "{e}");
        assert!(e.contains("server auth"), "{e}");
    }

    #[test]
    fn usages_signet_cannot_issue() {
        let e = check(&csr(|_| {}), false, &s(&["cert sign"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CA certificate"), "{e}");
        assert!(check(&csr(|_| {}), false, &s(&["code signing"])).is_err());
    }

    /// The refusals' messages are the Failed condition's text, word for word.
    #[test]
    fn refusal_messages_are_the_condition_texts() {
        let allowed = "digital signature, key encipherment, key agreement, content commitment, \
                       data encipherment, server auth, client auth";
        assert_eq!(
            CsrRefusal::UsageNotAllowed("cert sign".into()).to_string(),
            format!(
                "spec.usages asks for \"cert sign\" (it needs a CA certificate, which Signet does \
                 not issue); Signet issues only {allowed}"
            )
        );
        assert_eq!(
            CsrRefusal::UsageNotAllowed("code signing".into()).to_string(),
            format!("spec.usages asks for \"code signing\"; Signet issues only {allowed}")
        );
        assert_eq!(
            CsrRefusal::UsagesDisagree {
                csr: s(&["digital signature", "server auth"])
                    .into_iter()
                    .collect(),
                spec: s(&["client auth"]).into_iter().collect(),
            }
            .to_string(),
            "the CSR's key usages [digital signature, server auth] disagree with spec.usages \
             [client auth]: encode the same usages in both, or none in the CSR"
        );
        assert_eq!(
            CsrRefusal::RequestsCa.to_string(),
            "the CSR asks for a CA certificate (basicConstraints CA:TRUE) while spec.isCA is false: \
             Signet issues leaf certificates only"
        );
        assert_eq!(
            CsrRefusal::from(CsrError::BadSignature).to_string(),
            "the CSR's signature does not verify with its own public key"
        );
    }

    /// Hostile input never panics: random bytes, random bytes in a PEM wrapper, and a valid
    /// CSR with single bytes flipped are all answered with `Err` (or `Ok` for a harmless flip).
    #[test]
    fn hostile_input_never_panics() {
        use base64::Engine;
        use ring::rand::SecureRandom;
        let rng = ring::rand::SystemRandom::new();
        let good = pem::parse(csr(|p| {
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        }))
        .unwrap()
        .into_contents();
        for i in 0..500usize {
            let mut b = vec![0u8; 1 + i % 300];
            rng.fill(&mut b).unwrap();
            let _ = check(&b, false, &[]);
            let wrapped = format!(
                "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
                base64::engine::general_purpose::STANDARD.encode(&b)
            );
            assert!(check(wrapped.as_bytes(), false, &[]).is_err());
            let mut flipped = good.clone();
            let at = i % flipped.len();
            flipped[at] ^= b[0] | 1;
            let p = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", flipped));
            let _ = check(p.as_bytes(), false, &s(&["digital signature"]));
        }
    }
}
