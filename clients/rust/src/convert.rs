//! What the typed clients share at the proto edge: building a request (the caller's trace
//! context, an optional bearer token) and reading an issued certificate. Every check on a
//! server's answer that more than one call makes lives here, once.

use signet_pki::SvidCertificate;
use signet_types::SpiffeId;

use crate::error::CallError;

/// A request for `msg` carrying the current span's W3C trace context (so the server's spans
/// join the caller's trace) and, with `bearer`, `authorization: Bearer <token>`.
pub(crate) fn request<T>(msg: T, bearer: Option<&str>) -> Result<tonic::Request<T>, CallError> {
    let mut req = match bearer {
        Some(token) => {
            crate::with_bearer(msg, token).map_err(|e| CallError::InvalidRequest(e.to_string()))?
        }
        None => tonic::Request::new(msg),
    };
    signet_runtime::telemetry::inject_context(req.metadata_mut());
    Ok(req)
}

/// `chain_der` (leaf first) as the X509-SVID the server says it issued for `claimed_id`:
/// the chain must be one ([`SvidCertificate::from_chain_der`]), its leaf must name exactly
/// `claimed_id`, and its validity must not be empty.
pub(crate) fn issued_svid(
    chain_der: Vec<Vec<u8>>,
    claimed_id: &str,
) -> Result<SvidCertificate, CallError> {
    let claimed: SpiffeId = claimed_id.parse().map_err(|e| {
        CallError::invalid_answer(format!("the SPIFFE ID {claimed_id:?} it names: {e}"))
    })?;
    let svid = SvidCertificate::from_chain_der(chain_der)
        .map_err(|e| CallError::invalid_answer(format!("its certificate: {e}")))?;
    if svid.spiffe_id() != &claimed {
        return Err(CallError::invalid_answer(format!(
            "its certificate names {}, not the SPIFFE ID {claimed} the answer names",
            svid.spiffe_id()
        )));
    }
    if svid.not_after() <= svid.not_before() {
        return Err(CallError::invalid_answer(
            "its certificate's validity is empty (not_after is not after not_before)",
        ));
    }
    Ok(svid)
}

#[cfg(test)]
pub(crate) mod test_certs {
    //! Real certificates for conversion tests.
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

    pub struct TestCa {
        pub issuer: Issuer<'static, KeyPair>,
        pub der: Vec<u8>,
    }

    /// A root naming `spiffe://example.org`.
    pub fn root() -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![]).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.subject_alt_names = vec![SanType::URI("spiffe://example.org".try_into().unwrap())];
        let der = p.self_signed(&key).unwrap().der().to_vec();
        TestCa {
            issuer: Issuer::new(p, key),
            der,
        }
    }

    /// A leaf for `uri` signed by `ca` (DER).
    pub fn leaf(ca: &TestCa, uri: &str) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![]).unwrap();
        p.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        p.signed_by(&key, &ca.issuer).unwrap().der().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::test_certs::*;
    use super::*;

    #[test]
    fn an_issued_certificate_must_be_an_svid_for_the_id_the_answer_names() {
        let ca = root();
        let id = "spiffe://example.org/ns/a/sa/web";
        let good = leaf(&ca, id);
        let svid = issued_svid(vec![good.clone(), ca.der.clone()], id).unwrap();
        assert_eq!(svid.spiffe_id().to_string(), id);
        assert_eq!(svid.chain_der().len(), 2);

        let refused = |chain: Vec<Vec<u8>>, claimed: &str| {
            let e = issued_svid(chain, claimed).unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
            e.to_string()
        };
        assert!(refused(vec![], id).contains("chain is empty"));
        assert!(refused(vec![b"garbage".to_vec()], id).contains("does not parse"));
        assert!(refused(vec![ca.der.clone()], "spiffe://example.org").contains("CA certificate"));
        assert!(
            refused(vec![good.clone()], "spiffe://example.org/ns/b/sa/db")
                .contains("names spiffe://example.org/ns/a/sa/web, not")
        );
        assert!(refused(vec![good], "http://x").contains("SPIFFE ID"));
    }

    #[test]
    fn requests_carry_the_bearer_token_and_refuse_one_a_header_cannot_hold() {
        let req = request((), Some("tok")).unwrap();
        assert_eq!(req.metadata().get("authorization").unwrap(), "Bearer tok");
        assert!(
            request((), None)
                .unwrap()
                .metadata()
                .get("authorization")
                .is_none()
        );
        let e = request((), Some("bad\ntoken")).unwrap_err();
        assert!(matches!(e, CallError::InvalidRequest(_)), "{e:?}");
        assert!(!e.to_string().contains("bad"), "{e}");
    }
}
