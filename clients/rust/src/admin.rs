//! The typed client of the operator API on the server's admin Unix socket
//! (`signet.admin.v1.Admin`): [`AdminClient`] reads the trust bundle as the server wrote it,
//! lists audit events and mints an X509-SVID for any identity of the trust domain, answering
//! in domain types. `signetctl` formats these; its other subcommands still call the generated
//! clients ([`crate::proto::admin`]) until they get typed calls here.
//!
//! The invariant is [`crate::ca`]'s: nothing the server sends reaches the caller unchecked. A
//! bundle names a valid trust domain and each root is a whole X.509 certificate; a minted
//! certificate is an X509-SVID. A malformed answer is a [`CallError::InvalidAnswer`].

use std::path::Path;
use std::time::Duration;

use signet_proto::admin as pb;
use signet_proto::admin::admin_client::AdminClient as PbAdminClient;
use signet_types::TrustDomain;
use tonic::transport::Channel;

use crate::ClientError;
use crate::ca::{Issued, split_root};
use crate::convert::request;
use crate::error::CallError;

/// The trust bundle as the server holds it, with where it wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBundle {
    pub trust_domain: TrustDomain,
    /// DER roots, each a whole X.509 certificate (possibly none for a server still starting).
    pub roots_der: Vec<Vec<u8>>,
    pub revision: u64,
    /// The file the server wrote the bundle to.
    pub path: String,
}

impl ServerBundle {
    /// The roots as PEM, LF line endings.
    pub fn roots_pem(&self) -> String {
        signet_types::pem::certs_to_pem(self.roots_der.iter().map(Vec::as_slice))
    }
}

/// One audit event (a denial, an admin action).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    pub id: u64,
    /// Unix seconds, as the server recorded it.
    pub at: i64,
    pub kind: String,
    pub caller: String,
    pub detail: String,
}

/// An X509-SVID to mint as the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MintRequest {
    /// Sent as typed: the server validates it.
    pub spiffe_id: String,
    /// PKCS#10, PEM or DER.
    pub csr: Vec<u8>,
    /// Whole seconds; zero: the server's default.
    pub ttl: Duration,
    pub dns_names: Vec<String>,
}

/// See the module documentation. Cloning is cheap (one shared channel).
#[derive(Clone, Debug)]
pub struct AdminClient {
    admin: PbAdminClient<Channel>,
}

impl AdminClient {
    /// Connects to the admin API on the server's Unix socket.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect_admin(socket).await?))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            admin: PbAdminClient::new(channel),
        }
    }

    /// `GetBundle`.
    pub async fn bundle(&self) -> Result<ServerBundle, CallError> {
        let b = self
            .admin
            .clone()
            .get_bundle(request(pb::GetBundleRequest {}, None)?)
            .await?
            .into_inner();
        server_bundle(b)
    }

    /// `ListAuditEvents`: at most `limit` events after the ID `after`.
    pub async fn audit_events(&self, after: u64, limit: u32) -> Result<Vec<AuditEvent>, CallError> {
        let msg = pb::ListAuditEventsRequest {
            after_id: after,
            limit,
        };
        let events = self
            .admin
            .clone()
            .list_audit_events(request(msg, None)?)
            .await?
            .into_inner()
            .events;
        Ok(events
            .into_iter()
            .map(|e| AuditEvent {
                id: e.id,
                at: e.at,
                kind: e.kind,
                caller: e.caller,
                detail: e.detail,
            })
            .collect())
    }

    /// `MintX509Svid`: the certificate (leaf and intermediates) and the root the server sent
    /// last, if it sent more than one certificate.
    pub async fn mint(&self, req: &MintRequest) -> Result<Issued, CallError> {
        let msg = pb::MintX509SvidRequest {
            spiffe_id: req.spiffe_id.clone(),
            csr: req.csr.clone(),
            ttl_seconds: i64::try_from(req.ttl.as_secs()).unwrap_or(i64::MAX),
            dns_names: req.dns_names.clone(),
        };
        let resp = self
            .admin
            .clone()
            .mint_x509_svid(request(msg, None)?)
            .await?
            .into_inner();
        minted(resp)
    }
}

// --- proto conversions ------------------------------------------------------------------

fn server_bundle(b: pb::BundleResponse) -> Result<ServerBundle, CallError> {
    let trust_domain = b.trust_domain.parse().map_err(|e| {
        CallError::invalid_answer(format!("bundle trust domain {:?}: {e}", b.trust_domain))
    })?;
    for (i, r) in b.roots.iter().enumerate() {
        crate::ca::whole_certificate(r)
            .map_err(|e| CallError::invalid_answer(format!("bundle root {i}: {e}")))?;
    }
    Ok(ServerBundle {
        trust_domain,
        roots_der: b.roots,
        revision: b.revision,
        path: b.path,
    })
}

fn minted(resp: pb::MintX509SvidResponse) -> Result<Issued, CallError> {
    // The answer names no SPIFFE ID beside the certificate: the leaf's own is checked.
    let leaf = resp
        .cert_chain
        .first()
        .ok_or_else(|| CallError::invalid_answer("no certificate"))?;
    let id = signet_pki::SvidCertificate::from_chain_der(vec![leaf.clone()])
        .map_err(|e| CallError::invalid_answer(format!("its certificate: {e}")))?
        .spiffe_id()
        .to_string();
    split_root(resp.cert_chain, &id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::test_certs::{leaf, root};

    #[test]
    fn the_bundle_needs_a_trust_domain_and_whole_roots() {
        let ca = root();
        let good = pb::BundleResponse {
            trust_domain: "example.org".into(),
            roots: vec![ca.der.clone()],
            revision: 3,
            path: "/data/bundle.pem".into(),
        };
        let b = server_bundle(good.clone()).unwrap();
        assert_eq!(b.trust_domain.to_string(), "example.org");
        assert_eq!((b.revision, b.path.as_str()), (3, "/data/bundle.pem"));
        assert!(b.roots_pem().starts_with("-----BEGIN CERTIFICATE-----\n"));
        for bad in [
            pb::BundleResponse {
                trust_domain: "Not A Domain!".into(),
                ..good.clone()
            },
            pb::BundleResponse {
                roots: vec![b"junk".to_vec()],
                ..good.clone()
            },
        ] {
            let e = server_bundle(bad).unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        }
    }

    #[test]
    fn a_minted_chain_is_an_svid_and_its_root_is_split_off() {
        let ca = root();
        let id = "spiffe://example.org/ops/tool";
        let l = leaf(&ca, id);
        let m = minted(pb::MintX509SvidResponse {
            cert_chain: vec![l.clone(), ca.der.clone()],
            serial: "01".into(),
        })
        .unwrap();
        assert_eq!(m.certificate.spiffe_id().to_string(), id);
        assert_eq!(m.certificate.chain_der(), std::slice::from_ref(&l));
        assert_eq!(m.root_der.as_deref(), Some(ca.der.as_slice()));
        for bad in [vec![], vec![b"junk".to_vec()], vec![ca.der.clone()]] {
            let e = minted(pb::MintX509SvidResponse {
                cert_chain: bad,
                serial: "01".into(),
            })
            .unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        }
    }
}
