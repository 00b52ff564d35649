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
use crate::issuer::{Credentials, IssueInput, Issuer};

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
        let creds = Credentials::from_request(&request)?;
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
        let cert_chain = cert
            .chain
            .iter()
            .map(|der| signet_types::pem::cert_to_pem(der))
            .collect();
        Ok(Response::new(IstioCertificateResponse { cert_chain }))
    }
}
