//! Provenance: where the authority for a certificate came from, recorded in its ledger row
//! (and covered by the row's hash) so that a renewal over mTLS can re-check that source.
//!
//! Every grant policy makes carries a [`Provenance`]; the issuer writes it to the ledger with
//! the certificate. A renewal over mTLS looks up the presented certificate's row and re-checks
//! its source (see [`crate::policy::renewal`]):
//!
//! | source | how it was authorized | renewal over mTLS |
//! |---|---|---|
//! | `service_account` | a Kubernetes service-account token | while the token check is younger than `policy.mtls_renewal_max_age`; names still allowed by the templates; lifetime at most the presented certificate's |
//! | `entry` | a registration entry, signed for its parent node | while the entry exists with that ID and its node is not banned, and the delivery through the node API is younger than `policy.mtls_renewal_max_age` (carried forward); names and lifetime bounded by the entry *now* |
//! | `admin` | the operator, on the admin socket | like `service_account`: bounded age, names and lifetime of the presented certificate |
//! | `bridge` | the Kubernetes bridge, for an object in a namespace | refused: the bridge renews for its objects with its own identity |
//! | `impersonated` | an impersonator asking on a workload's behalf | refused: the impersonator asks again |
//! | `node` | node attestation, or a node renewing its own SVID | refused on the CA APIs: nodes renew with `RenewNode`, where the ban is checked |
//! | `server` | the server's own TLS certificate | refused |
//!
//! A renewal carries the source forward (with `renewed_from` naming the presented serial), so a
//! chain of renewals stays bounded by the credential that started it.

use serde::{Deserialize, Serialize};

/// How the authority was established.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Source {
    /// A Kubernetes service-account token.
    ServiceAccount {
        namespace: String,
        service_account: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
    },
    /// A registration entry, issued to its parent node.
    Entry { entry_id: String, node_id: String },
    /// The Kubernetes bridge (`bridge`, its SPIFFE ID) for an object in `namespace`.
    Bridge { bridge: String, namespace: String },
    /// The operator on the admin socket.
    Admin,
    /// A configured impersonator (its SPIFFE ID) asking on behalf of the certificate's identity.
    Impersonated { impersonator: String },
    /// A node's own identity: attested with `attestation` (`join_token`, `k8s_psat`), or renewed
    /// over mTLS (`renewal`).
    Node {
        node_id: String,
        attestation: String,
    },
    /// The server's own TLS certificate.
    Server,
}

impl Source {
    /// A short name for messages and metrics.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn kind(&self) -> &'static str {
        match self {
            Source::ServiceAccount { .. } => "service_account",
            Source::Entry { .. } => "entry",
            Source::Bridge { .. } => "bridge",
            Source::Admin => "admin",
            Source::Impersonated { .. } => "impersonated",
            Source::Node { .. } => "node",
            Source::Server => "server",
        }
    }
}

/// A certificate's provenance as recorded in its ledger row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    pub source: Source,
    /// Unix seconds when the source was last checked: the token's or the operator's moment for
    /// `service_account` and `admin`, the delivery through the node API for `entry` (each
    /// carried forward through renewals over mTLS), the issuance itself for `node`.
    pub authorized_at: i64,
    /// The serial of the certificate presented over mTLS, when this one renews it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_from: Option<String>,
}

/// Why a stored provenance could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvenanceError {
    #[error("the ledger row records no provenance (issued before provenance was recorded)")]
    Missing,
    #[error("the ledger row's provenance does not decode: {0}")]
    Malformed(String),
}

impl Provenance {
    pub fn new(source: Source, authorized_at: i64) -> Self {
        Self {
            source,
            authorized_at,
            renewed_from: None,
        }
    }

    /// The canonical text stored in the ledger row (and hashed with it).
    pub fn to_ledger_text(&self) -> String {
        // Serializing a plain struct and enum of strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a ledger row's provenance column.
    pub fn from_ledger_text(text: &str) -> Result<Self, ProvenanceError> {
        if text.is_empty() {
            return Err(ProvenanceError::Missing);
        }
        serde_json::from_str(text).map_err(|e| ProvenanceError::Malformed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_ledger_text() {
        let all = [
            Source::ServiceAccount {
                namespace: "web".into(),
                service_account: "frontend".into(),
                pod: Some("frontend-x".into()),
                node: None,
            },
            Source::Entry {
                entry_id: "e1".into(),
                node_id: "vm1".into(),
            },
            Source::Bridge {
                bridge: "spiffe://example.org/ns/signet-system/sa/signet-k8s".into(),
                namespace: "demo".into(),
            },
            Source::Admin,
            Source::Impersonated {
                impersonator: "spiffe://example.org/ns/istio-system/sa/ztunnel".into(),
            },
            Source::Node {
                node_id: "vm1".into(),
                attestation: "join_token".into(),
            },
            Source::Server,
        ];
        for source in all {
            let mut p = Provenance::new(source, 1_700_000_000);
            p.renewed_from = Some("8f01".into());
            let text = p.to_ledger_text();
            assert_eq!(Provenance::from_ledger_text(&text), Ok(p.clone()), "{text}");
        }
        assert_eq!(
            Provenance::new(Source::Admin, 5).to_ledger_text(),
            r#"{"source":{"kind":"admin"},"authorized_at":5}"#
        );
    }

    #[test]
    fn missing_or_bad_text_is_an_error() {
        assert_eq!(
            Provenance::from_ledger_text(""),
            Err(ProvenanceError::Missing)
        );
        for bad in [
            "{",
            r#"{"source":{"kind":"root"},"authorized_at":1}"#,
            r#"{"source":{"kind":"admin"}}"#,
            r#"{"source":{"kind":"admin"},"authorized_at":1,"extra":true}"#,
            r#"{"source":{"kind":"entry","entry_id":"e"},"authorized_at":1}"#,
        ] {
            assert!(
                matches!(
                    Provenance::from_ledger_text(bad),
                    Err(ProvenanceError::Malformed(_))
                ),
                "{bad}"
            );
        }
    }
}
