//! What only the operator decides, from the flags of `signet-k8s run`: the Signet server that
//! namespaced `Issuer`s (and Citadel mode) use, how to recognise it, and where the bridge's
//! own credential is. No Kubernetes object can change any of it: a namespaced Issuer is
//! written by its namespace's tenant, so it never chooses where the bridge connects, which
//! roots it trusts, or which file of the bridge's pod is read and sent as a bearer token.

use std::path::PathBuf;

use signet_client::ServerTarget;
use signet_types::TrustDomain;

use crate::issuers::validate::{ResolveError, check_pem_roots};

/// The bridge's own configuration (flags / environment of `signet-k8s run`).
#[derive(Clone, Debug)]
pub struct BridgeConfig {
    /// The server for namespaced Issuers and Citadel mode; None: namespaced Issuers cannot
    /// be used (they are reported `BridgeNotConfigured`).
    pub server: Option<OperatorServer>,
    /// The bridge's projected service-account token (`--token`), re-read at every call.
    pub token_path: PathBuf,
    /// The trust domain of the operator's server, and the default of ClusterIssuers that name
    /// none (`--trust-domain`); None: the trust domain the server's bundle roots name.
    pub trust_domain: Option<TrustDomain>,
}

/// Where the operator's Signet server is (`--server`, `--server-name`, `--bundle`).
#[derive(Clone, Debug)]
pub struct OperatorServer {
    /// `https://host:port`.
    pub address: String,
    /// The name checked in the server's certificate, when it is not the host of `address`.
    pub server_name: Option<String>,
    /// PEM roots that sign the server's certificate; read again at every check, so a
    /// rotated bundle (a ConfigMap volume) is picked up.
    pub bundle_file: PathBuf,
}

impl BridgeConfig {
    /// A bridge with no server of its own (ClusterIssuers only) and the default token path.
    pub fn cluster_issuers_only() -> Self {
        Self {
            server: None,
            token_path: PathBuf::from(crate::crd::DEFAULT_TOKEN_PATH),
            trust_domain: None,
        }
    }

    /// Checks the flags at start-up: an `https://` server URL, a valid server name.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(s) = &self.server
            && !s.address.starts_with("https://")
        {
            return Err(format!(
                "--server must be an https:// URL of signet-server, got {:?}",
                s.address
            ));
        }
        Ok(())
    }

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
    use super::*;
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

    fn bridge(bundle: &std::path::Path, td: Option<&str>) -> BridgeConfig {
        BridgeConfig {
            server: Some(OperatorServer {
                address: "https://signet:8443".into(),
                server_name: Some("signet.internal".into()),
                bundle_file: bundle.to_owned(),
            }),
            token_path: "/t".into(),
            trust_domain: td.map(|t| t.parse().unwrap()),
        }
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

    #[test]
    fn the_server_flag_must_be_https() {
        let f = TempFile::with("b", b"x");
        let mut b = bridge(&f.0, None);
        assert!(b.validate().is_ok());
        if let Some(s) = b.server.as_mut() {
            s.address = "http://signet:8080".into();
        }
        assert!(b.validate().unwrap_err().contains("https://"));
    }
}
