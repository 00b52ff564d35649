//! `signet.ca.v1.CertificateAuthority`: Signet's own API.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use signet_proto::ca::{
    Bundle as PbBundle, GetBundleRequest, SignCsrRequest, SignCsrResponse, WatchBundleRequest,
    certificate_authority_server::CertificateAuthority,
};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use super::{check_size, request_id};
use crate::bundle::{Bundle, BundleHandle};
use crate::clock::unix;
use crate::issuer::{IssueInput, Issuer, JwtInput};
use crate::jwt_svid::MintedJwtSvid;
use crate::policy::GrantSource;

pub struct NativeApi {
    issuer: Arc<Issuer>,
    bundle: BundleHandle,
    max_message_bytes: usize,
    /// Turns true when the server shuts down: `WatchBundle` streams end then, so that open
    /// streams (every agent holds one) do not hold up the graceful shutdown.
    stop: Option<tokio::sync::watch::Receiver<bool>>,
}

impl NativeApi {
    pub fn new(issuer: Arc<Issuer>, bundle: BundleHandle, max_message_bytes: usize) -> Self {
        Self {
            issuer,
            bundle,
            max_message_bytes,
            stop: None,
        }
    }

    /// Ends the `WatchBundle` streams when `stop` turns true.
    pub fn with_shutdown(mut self, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }
}

pub(crate) fn bundle_to_proto(b: &Bundle) -> PbBundle {
    PbBundle {
        trust_domain: b.trust_domain.to_string(),
        roots: b.roots.clone(),
        revision: b.revision,
        tainted_key_ids: b.tainted_key_ids.clone(),
        crls: b
            .crls
            .iter()
            .map(|c| signet_proto::ca::Crl {
                key_id: c.key_id.clone(),
                der: c.der.clone(),
                number: c.number,
                this_update: c.this_update,
                next_update: c.next_update,
            })
            .collect(),
        jwt_keys: b
            .jwt_keys
            .iter()
            .map(|k| signet_proto::ca::JwtKey {
                key_id: k.key.key_id().to_owned(),
                alg: k
                    .key
                    .alg()
                    .map(|a| a.as_str().to_owned())
                    .unwrap_or_default(),
                public_key: k.key.spki_der().to_vec(),
                not_after: crate::clock::unix(k.not_after),
            })
            .collect(),
    }
}

/// A minted (and committed) JWT-SVID as the APIs return it.
pub(crate) fn jwt_svid_to_proto(t: &MintedJwtSvid) -> signet_proto::ca::JwtSvid {
    signet_proto::ca::JwtSvid {
        token: t.token().to_owned(),
        spiffe_id: t.claims.subject.to_string(),
        issued_at: t.claims.issued_at,
        expires_at: t.claims.expires_at,
        key_id: t.key_id.clone(),
        audience: t.claims.audience.clone(),
    }
}

#[tonic::async_trait]
impl CertificateAuthority for NativeApi {
    /// Authenticated and authorized exactly as `SignCsr` for the caller's own identity
    /// (service-account token or mTLS SVID, the same per-caller rate limit, the same policy);
    /// the Kubernetes bridge's namespace form is not offered for JWT-SVIDs.
    async fn mint_jwt_svid(
        &self,
        request: Request<signet_proto::ca::MintJwtSvidRequest>,
    ) -> Result<Response<signet_proto::ca::JwtSvid>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        let minted = self
            .issuer
            .authenticate_and_mint_jwt(
                &creds,
                JwtInput {
                    source: GrantSource::Caller,
                    audience: &req.audience,
                    ttl_seconds: req.ttl_seconds,
                    entry_ttl_seconds: 0,
                    request_id,
                    api: "native_jwt",
                },
            )
            .await?;
        Ok(Response::new(jwt_svid_to_proto(&minted)))
    }

    async fn sign_csr(
        &self,
        request: Request<SignCsrRequest>,
    ) -> Result<Response<SignCsrResponse>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        let cert = self
            .issuer
            .authenticate_and_issue(
                &creds,
                IssueInput {
                    // Only SignCsr carries a namespace: the Kubernetes bridge's request for an
                    // object in that namespace. Empty: the caller's own identity.
                    source: if req.kubernetes_namespace.is_empty() {
                        GrantSource::Caller
                    } else {
                        GrantSource::Bridge {
                            namespace: &req.kubernetes_namespace,
                        }
                    },
                    csr: &req.csr,
                    ttl_seconds: req.ttl_seconds,
                    impersonate: None,
                    request_id,
                    extra_names: None,
                    api: "native",
                },
            )
            .await?;
        Ok(Response::new(SignCsrResponse {
            spiffe_id: cert.spiffe_id.to_string(),
            serial: cert.serial.clone(),
            not_before: unix(cert.not_before),
            not_after: unix(cert.not_after),
            cert_chain: cert.chain,
        }))
    }

    async fn get_bundle(
        &self,
        _request: Request<GetBundleRequest>,
    ) -> Result<Response<PbBundle>, Status> {
        Ok(Response::new(bundle_to_proto(&self.bundle.current())))
    }

    type WatchBundleStream = Pin<Box<dyn Stream<Item = Result<PbBundle, Status>> + Send>>;

    async fn watch_bundle(
        &self,
        _request: Request<WatchBundleRequest>,
    ) -> Result<Response<Self::WatchBundleStream>, Status> {
        // WatchStream yields the current value at once, then every change.
        let stream = WatchStream::new(self.bundle.subscribe()).map(|b| Ok(bundle_to_proto(&b)));
        match self.stop.clone() {
            Some(mut stop) => {
                let stopped = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                Ok(Response::new(Box::pin(futures::StreamExt::take_until(
                    stream, stopped,
                ))))
            }
            None => Ok(Response::new(Box::pin(stream))),
        }
    }
}
