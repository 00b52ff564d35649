//! What only the operator decides, from the flags of `signet-k8s run`: the Signet server that
//! namespaced `Issuer`s (and Citadel mode) use, how to recognise it, and where the bridge's
//! own credential is. No Kubernetes object can change any of it: a namespaced Issuer is
//! written by its namespace's tenant, so it never chooses where the bridge connects, which
//! roots it trusts, or which file of the bridge's pod is read and sent as a bearer token.
//!
//! Only the configuration lives here; turning it into a connection target is issuer
//! resolution's job (`issuers::operator_target`), so imports go one way: `issuers` → here.

use std::path::PathBuf;

use signet_types::TrustDomain;

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

    /// Checks the flags at start-up: an `https://` server URL.
    pub fn validate(&self) -> Result<(), BridgeConfigError> {
        if let Some(s) = &self.server
            && !s.address.starts_with("https://")
        {
            return Err(BridgeConfigError::ServerNotHttps(s.address.clone()));
        }
        Ok(())
    }
}

/// Why the bridge's flags are refused at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeConfigError {
    #[error("--server must be an https:// URL of signet-server, got {0:?}")]
    ServerNotHttps(String),
}

/// The bridge configuration the tests of this module and of issuer resolution start from.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{BridgeConfig, OperatorServer};

    /// A bridge whose server is `https://signet:8443` (TLS name `signet.internal`) with the
    /// roots of `bundle`, and `--trust-domain` `td`.
    pub(crate) fn bridge(bundle: &std::path::Path, td: Option<&str>) -> BridgeConfig {
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
}

#[cfg(test)]
mod tests {
    use super::test_support::bridge;
    use crate::testing::TempFile;

    #[test]
    fn the_server_flag_must_be_https() {
        let f = TempFile::with("b", b"x");
        let mut b = bridge(&f.0, None);
        assert!(b.validate().is_ok());
        if let Some(s) = b.server.as_mut() {
            s.address = "http://signet:8080".into();
        }
        assert!(b.validate().unwrap_err().to_string().contains("https://"));
    }
}
