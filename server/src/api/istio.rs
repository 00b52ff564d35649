//! `istio.v1.auth.IstioCertificateService/CreateCertificate`, wire-compatible with Istio, so
//! istio-agent (`CA_ADDR`), ztunnel and other Istio clients can use Signet as their CA.

use std::sync::Arc;

use prost_types::value::Kind;
use signet_proto::istio_ca::{
    IstioCertificateRequest, IstioCertificateResponse,
    istio_certificate_service_server::IstioCertificateService,
};
use tonic::{Request, Response, Status};

use super::{ApiError, check_size, request_id};
use crate::issuer::{IssueInput, Issuer};

pub struct IstioApi {
    issuer: Arc<Issuer>,
    max_message_bytes: usize,
}

impl IstioApi {
    pub fn new(issuer: Arc<Issuer>, max_message_bytes: usize) -> Self {
        Self {
            issuer,
            max_message_bytes,
        }
    }
}

/// Istio's `ImpersonatedIdentity` metadata value, if any.
pub(crate) fn impersonated(meta: Option<&prost_types::Struct>) -> Result<Option<&str>, ApiError> {
    let Some(v) = meta.and_then(|m| m.fields.get("ImpersonatedIdentity")) else {
        return Ok(None);
    };
    match &v.kind {
        Some(Kind::StringValue(s)) if s.is_empty() => Ok(None),
        Some(Kind::StringValue(s)) => Ok(Some(s.as_str())),
        _ => Err(ApiError::InvalidArgument(
            "metadata ImpersonatedIdentity must be a string SPIFFE ID".into(),
        )),
    }
}

#[tonic::async_trait]
impl IstioCertificateService for IstioApi {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let creds = super::credentials(&request)?;
        let request_id = request_id(&request);
        let req = request.into_inner();
        check_size(&req, self.max_message_bytes)?;
        let impersonate = impersonated(req.metadata.as_ref())?;
        let cert = self
            .issuer
            .authenticate_and_issue(
                &creds,
                IssueInput {
                    source: crate::policy::GrantSource::Caller,
                    csr: req.csr.as_bytes(),
                    ttl_seconds: req.validity_duration,
                    impersonate,
                    request_id,
                    extra_names: None,
                    api: "istio",
                },
            )
            .await?;
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: istio_chain(&cert.chain, self.issuer.authority().roots()),
        }))
    }
}

/// The Istio answer: the leaf, the intermediates, and as the last element every trusted root
/// concatenated (ztunnel and istio-agent take the last element as the trust bundle and split
/// it; while a root rotation has two roots trusted, both must be there).
pub(crate) fn istio_chain(chain: &[Vec<u8>], roots: &[Vec<u8>]) -> Vec<String> {
    let mut out: Vec<String> = chain
        .iter()
        .filter(|c| !roots.contains(c))
        .map(|der| signet_types::pem::cert_to_pem(der))
        .collect();
    // The chain's own root, if the bundle somehow lacks it, still ends the answer.
    let mut last: Vec<&[u8]> = roots.iter().map(Vec::as_slice).collect();
    if let Some(anchor) = chain.last()
        && chain.len() > 1
        && !roots.contains(anchor)
    {
        last.insert(0, anchor);
    }
    if !last.is_empty() {
        out.push(signet_types::pem::certs_to_pem(last));
    }
    out
}

#[cfg(test)]
mod chain_tests {
    #[test]
    fn the_last_element_holds_every_root() {
        let (leaf, int, r1, r2) = (vec![1u8], vec![2u8], vec![3u8], vec![4u8]);
        let one = |d: &Vec<u8>| signet_types::pem::cert_to_pem(d);
        let pem = |d: &[Vec<u8>]| signet_types::pem::certs_to_pem(d.iter().map(Vec::as_slice));
        let got = super::istio_chain(
            &[leaf.clone(), int.clone(), r1.clone()],
            &[r1.clone(), r2.clone()],
        );
        assert_eq!(got, [one(&leaf), one(&int), pem(&[r1.clone(), r2.clone()])]);
        // One root: the same shape as before rotation existed.
        let got = super::istio_chain(
            &[leaf.clone(), int.clone(), r1.clone()],
            std::slice::from_ref(&r1),
        );
        assert_eq!(got[2], pem(std::slice::from_ref(&r1)));
        assert_eq!(got.len(), 3);
    }
}
