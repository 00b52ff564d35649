//! The operator's own server ([`BridgeConfig`], from the flags) as issuer resolution uses it:
//! the trust domain to expect and the connection target of namespaced Issuers. Here rather
//! than in [`crate::operator`] because it reads bundles and reports [`ResolveError`]s, so the
//! operator's configuration needs nothing from issuer resolution.

use signet_client::ServerTarget;
use signet_types::TrustDomain;

use super::validate::{ResolveError, check_pem_roots};
use crate::operator::BridgeConfig;

impl BridgeConfig {
    /// The trust domain to expect from a server whose roots are `bundle_pem`: `configured`,
    /// else `--trust-domain`, else the one the roots name.
    pub fn trust_domain_for(
        &self,
        configured: Option<&TrustDomain>,
        bundle_pem: &[u8],
        from: &str,
    ) -> Result<TrustDomain, ResolveError> {
        if let Some(td) = configured.or(self.trust_domain.as_ref()) {
            return Ok(td.clone());
        }
        signet_client::trust_domain_of_bundle(bundle_pem).map_err(|e| {
            ResolveError::NotConfigured(format!(
                "cannot tell the server's trust domain from {from} ({e}); set the bridge's \
                 --trust-domain (or a ClusterIssuer's spec.trustDomain)"
            ))
        })
    }

    /// The operator's server as a connection target: its bundle read now.
    pub fn operator_target(&self) -> Result<ServerTarget, ResolveError> {
        let Some(s) = &self.server else {
            return Err(ResolveError::NotConfigured(
                "this bridge has no Signet server for namespaced Issuers (signet-k8s run \
                 --server and --bundle are not set): ask the operator, or use a ClusterIssuer"
                    .into(),
            ));
        };
        let from = format!("the bridge's --bundle file {}", s.bundle_file.display());
        let pem = std::fs::read(&s.bundle_file)
            .map_err(|e| ResolveError::BundleNotFound(format!("{from}: {e}")))?;
        let pem = check_pem_roots(&pem, &from)?;
        let td = self.trust_domain_for(None, &pem, &from)?;
        Ok(ServerTarget::new(s.address.clone(), pem, td).with_server_name(s.server_name.clone()))
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::BridgeConfig;
    use crate::operator::test_support::bridge;
    use crate::testing::TempFile;

    fn root(uri: Option<&str>) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        if let Some(u) = uri {
            p.subject_alt_names = vec![rcgen::SanType::URI(u.try_into().unwrap())];
        }
        p.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn operator_target_reads_the_bundle_now_and_names_the_trust_domain() {
        let signet = TempFile::with("b", root(Some("spiffe://example.org")).as_bytes());
        let t = bridge(&signet.0, None).operator_target().unwrap();
        assert_eq!(t.addr, "https://signet:8443");
        assert_eq!(t.server_name.as_deref(), Some("signet.internal"));
        assert_eq!(
            t.server_id().to_string(),
            "spiffe://example.org/signet/server"
        );
        // The flag wins over the bundle.
        let t = bridge(&signet.0, Some("corp.example"))
            .operator_target()
            .unwrap();
        assert_eq!(t.trust_domain.as_str(), "corp.example");

        // A plugged-in root names no trust domain: the flag is needed.
        let plugged = TempFile::with("b", root(None).as_bytes());
        let e = bridge(&plugged.0, None).operator_target().unwrap_err();
        assert_eq!(e.reason(), "BridgeNotConfigured");
        assert!(e.to_string().contains("--trust-domain"), "{e}");
        assert!(
            bridge(&plugged.0, Some("example.org"))
                .operator_target()
                .is_ok()
        );

        // A missing or empty bundle file.
        let e = bridge(std::path::Path::new("/nonexistent/ca.crt"), None)
            .operator_target()
            .unwrap_err();
        assert_eq!(e.reason(), "BundleNotFound");
        assert!(
            e.to_string().contains("--bundle file /nonexistent/ca.crt"),
            "{e}"
        );
        let empty = TempFile::with("b", b"");
        assert_eq!(
            bridge(&empty.0, None)
                .operator_target()
                .unwrap_err()
                .reason(),
            "BundleNotFound"
        );

        // No server at all.
        let e = BridgeConfig::cluster_issuers_only()
            .operator_target()
            .unwrap_err();
        assert_eq!(e.reason(), "BridgeNotConfigured");
    }
}
