//! The typed client of `signet.ca.v1.CertificateAuthority` (and of Istio's
//! `IstioCertificateService` on the same listener): [`CaClient`] signs a caller's CSR, reads
//! and watches the trust bundle, and answers in domain types, a checked
//! [`SvidCertificate`] and a [`TrustBundle`], never in protos.
//!
//! The invariant: nothing the server sends reaches a caller unchecked. A signed certificate is
//! an X509-SVID for exactly the SPIFFE ID the answer names; a bundle names a valid trust
//! domain and holds at least one root, each a whole X.509 certificate; its taints and CRLs are
//! bounded ([`MAX_BUNDLE_REVOCATION_ITEMS`], [`MAX_CRL_BYTES`]) and their key IDs normalised
//! ([`normalize_key_id`]). A malformed answer is a [`CallError::InvalidAnswer`]. (A CRL's
//! signature is the caller's to check: the agent verifies it, the bridge hands it to Istio.)
//! Its JWT-SVID keys are bounded ([`MAX_BUNDLE_JWT_KEYS`]) and each one is read by
//! `signet_pki::jwt` ([`JwtPublicKey::from_spki`]); a key that does not read is dropped with
//! the reason logged, as a malformed CRL entry is, so one bad key does not hide the others.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use signet_pki::SvidCertificate;
use signet_pki::jwt::{JwtAlg, JwtKeySet, JwtPublicKey};
use signet_proto::ca as pb;
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_proto::istio_ca as istio;
use signet_proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use signet_types::TrustDomain;
use tonic::transport::Channel;

use crate::convert::{issued_svid, request};
use crate::error::CallError;
use crate::{ClientError, ClientIdentity, ServerTarget};

/// The trust bundle as the server publishes it: the roots of one trust domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBundle {
    pub trust_domain: TrustDomain,
    /// DER root certificates; never empty, each one parses as X.509.
    pub roots_der: Vec<Vec<u8>>,
    /// Increases on every change, per server replica (replicas count separately, so it is
    /// for logs, not for ordering).
    pub revision: u64,
    /// Key IDs (lowercase hex subject key identifiers) of CA keys the operator tainted: every
    /// certificate issued under one of them is replaced now. Normalised to lowercase, sorted
    /// and deduplicated; an ID that is not hex is dropped at conversion.
    pub tainted_key_ids: Vec<String>,
    /// The issuing CAs' CRLs as the server sent them (not verified yet: the caller checks
    /// signature and number before acting on one).
    pub crls: Vec<Crl>,
    /// The JWT-SVID signing keys a validator must know now (each read and checked by
    /// `signet_pki::jwt`; at most [`MAX_BUNDLE_JWT_KEYS`], one per key ID).
    pub jwt_keys: Vec<JwtPublicKey>,
    /// The IDs in `tainted_key_ids` that name one of `jwt_keys` (as the server wrote them,
    /// not lowercased: a JWT key ID is base64url): every token one of them signed is dropped
    /// from caches now.
    pub tainted_jwt_key_ids: Vec<String>,
}

impl TrustBundle {
    /// The JWT keys as the set `signet_pki::jwt::validate` checks tokens against.
    pub fn jwt_key_set(&self) -> JwtKeySet {
        JwtKeySet::new(self.jwt_keys.iter().cloned())
    }

    /// The roots as PEM, LF line endings.
    pub fn roots_pem(&self) -> String {
        signet_types::pem::certs_to_pem(self.roots_der.iter().map(Vec::as_slice))
    }
}

/// A CRL as the server publishes it (not verified yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crl {
    /// The issuing CA key (lowercase hex subject key identifier).
    pub key_id: String,
    /// DER, RFC 5280.
    pub der: Vec<u8>,
    /// The CRL number the server claims (the signed extension decides).
    pub number: u64,
}

/// Most tainted key IDs and CRLs one bundle may carry; more is a malformed answer.
pub const MAX_BUNDLE_REVOCATION_ITEMS: usize = 256;
/// Largest CRL accepted (DER bytes).
pub const MAX_CRL_BYTES: usize = 4 << 20;
/// Most JWT keys one bundle may carry; more is a malformed answer.
pub const MAX_BUNDLE_JWT_KEYS: usize = 64;
/// Longest JWT key ID accepted (bytes); Signet's are 32.
pub const MAX_JWT_KEY_ID_BYTES: usize = 128;

/// `id` as a key ID (lowercase hex, even length, 1 to 64 bytes), or `None`.
pub fn normalize_key_id(id: &str) -> Option<String> {
    let id = id.trim().to_ascii_lowercase();
    let ok = !id.is_empty()
        && id.len().is_multiple_of(2)
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then_some(id)
}

/// The server's bundle at once, then again on every change; ends or fails when the
/// connection does.
pub type BundleStream = Pin<Box<dyn Stream<Item = Result<TrustBundle, CallError>> + Send>>;

/// A CSR to sign for the authenticated caller (`SignCsr`). The identity comes from the
/// caller's credentials, never from the CSR.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsrRequest {
    /// PKCS#10, PEM or DER.
    pub csr: Vec<u8>,
    /// `None`: the server's default; the server clamps it to its maximum. Sent in whole
    /// seconds, at least one.
    pub ttl: Option<Duration>,
    /// Only for a Kubernetes bridge: the namespace of the object the certificate is for.
    pub kubernetes_namespace: Option<String>,
}

/// A certificate the server signed: the X509-SVID (leaf, then intermediates) and, when the
/// server sent one after them, the root it chains to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// Leaf first, intermediates after; never the root the server appended.
    pub certificate: SvidCertificate,
    /// The root the server sent last in a chain of more than one certificate (DER, parses as
    /// X.509), or `None` when it sent the leaf alone.
    pub root_der: Option<Vec<u8>>,
}

/// See the module documentation. Cloning is cheap (one shared channel).
#[derive(Clone, Debug)]
pub struct CaClient {
    ca: CertificateAuthorityClient<Channel>,
    istio: IstioCertificateServiceClient<Channel>,
}

impl CaClient {
    /// Connects over TLS to `target` (its chain, host name and SPIFFE ID checked during the
    /// handshake, before anything is sent: [`crate::tls`]); with `identity`, mutual TLS.
    pub async fn connect(
        target: &ServerTarget,
        identity: Option<&ClientIdentity>,
    ) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect(target, identity).await?))
    }

    /// Over a channel [`crate::connect`] opened.
    pub fn from_channel(channel: Channel) -> Self {
        Self {
            ca: CertificateAuthorityClient::new(channel.clone()),
            istio: IstioCertificateServiceClient::new(channel),
        }
    }

    /// `SignCsr`; with `bearer`, authenticated by that service-account token (else by the
    /// connection's client certificate).
    pub async fn sign_csr(
        &self,
        csr: &CsrRequest,
        bearer: Option<&str>,
    ) -> Result<Issued, CallError> {
        let msg = pb::SignCsrRequest {
            csr: csr.csr.clone(),
            ttl_seconds: csr
                .ttl
                .map(|d| signet_runtime::clock::whole_seconds(d).max(1))
                .unwrap_or(0),
            kubernetes_namespace: csr.kubernetes_namespace.clone().unwrap_or_default(),
        };
        let resp = self
            .ca
            .clone()
            .sign_csr(request(msg, bearer)?)
            .await?
            .into_inner();
        issued_of_sign_csr(resp)
    }

    /// Istio's `CreateCertificate`: `csr_pem` signed for `ttl` (the server clamps it).
    pub async fn sign_istio(
        &self,
        csr_pem: &str,
        ttl: Duration,
        bearer: Option<&str>,
    ) -> Result<Issued, CallError> {
        let msg = istio::IstioCertificateRequest {
            csr: csr_pem.to_owned(),
            validity_duration: signet_runtime::clock::whole_seconds(ttl).max(1),
            metadata: None,
        };
        let resp = self
            .istio
            .clone()
            .create_certificate(request(msg, bearer)?)
            .await?
            .into_inner();
        issued_of_istio(resp)
    }

    /// `GetBundle`: the current trust bundle.
    pub async fn bundle(&self, bearer: Option<&str>) -> Result<TrustBundle, CallError> {
        let b = self
            .ca
            .clone()
            .get_bundle(request(pb::GetBundleRequest {}, bearer)?)
            .await?
            .into_inner();
        TrustBundle::try_from(b)
    }

    /// `WatchBundle`: the bundle at once, then on every change. A malformed bundle is an
    /// `Err` item (the caller decides whether to reconnect); nothing of it is taken.
    pub async fn watch_bundle(&self, bearer: Option<&str>) -> Result<BundleStream, CallError> {
        let stream = self
            .ca
            .clone()
            .watch_bundle(request(pb::WatchBundleRequest {}, bearer)?)
            .await?
            .into_inner();
        Ok(Box::pin(stream.map(|item| {
            item.map_err(CallError::from)
                .and_then(TrustBundle::try_from)
        })))
    }
}

// --- proto conversions ------------------------------------------------------------------

/// Splits off the root a chain of more than one certificate ends with, checks it parses,
/// and checks the rest as the X509-SVID for `claimed_id`.
pub(crate) fn split_root(mut chain: Vec<Vec<u8>>, claimed_id: &str) -> Result<Issued, CallError> {
    if chain.is_empty() {
        return Err(CallError::invalid_answer("no certificate"));
    }
    let root_der = if chain.len() > 1 { chain.pop() } else { None };
    if let Some(r) = &root_der {
        whole_certificate(r).map_err(|e| CallError::invalid_answer(format!("its root: {e}")))?;
    }
    Ok(Issued {
        certificate: issued_svid(chain, claimed_id)?,
        root_der,
    })
}

fn issued_of_sign_csr(resp: pb::SignCsrResponse) -> Result<Issued, CallError> {
    split_root(resp.cert_chain, &resp.spiffe_id)
}

fn issued_of_istio(resp: istio::IstioCertificateResponse) -> Result<Issued, CallError> {
    let mut chain = Vec::new();
    for (i, pem) in resp.cert_chain.iter().enumerate() {
        let ders = signet_types::pem::parse_certs(pem.as_bytes())
            .map_err(|e| CallError::invalid_answer(format!("certificate {i}: {e}")))?;
        chain.extend(ders);
    }
    // Istio's answer names no SPIFFE ID: the leaf's own is the one checked.
    let first = chain
        .first()
        .ok_or_else(|| CallError::invalid_answer("no certificate"))?;
    let id = SvidCertificate::from_chain_der(vec![first.clone()])
        .map_err(|e| CallError::invalid_answer(format!("its certificate: {e}")))?
        .spiffe_id()
        .to_string();
    split_root(chain, &id)
}

/// `der` is exactly one X.509 certificate that [`signet_pki::ParsedCert`] reads.
pub(crate) fn whole_certificate(der: &[u8]) -> Result<(), signet_pki::CertError> {
    signet_pki::ParsedCert::from_der(der).map(|_| ())
}

impl TryFrom<pb::Bundle> for TrustBundle {
    type Error = CallError;
    fn try_from(b: pb::Bundle) -> Result<Self, CallError> {
        let trust_domain = b.trust_domain.parse().map_err(|e| {
            CallError::invalid_answer(format!("bundle trust domain {:?}: {e}", b.trust_domain))
        })?;
        if b.roots.is_empty() {
            return Err(CallError::invalid_answer(format!(
                "bundle revision {} has no roots",
                b.revision
            )));
        }
        for (i, r) in b.roots.iter().enumerate() {
            whole_certificate(r)
                .map_err(|e| CallError::invalid_answer(format!("bundle root {i}: {e}")))?;
        }
        if b.tainted_key_ids.len() > MAX_BUNDLE_REVOCATION_ITEMS
            || b.crls.len() > MAX_BUNDLE_REVOCATION_ITEMS
        {
            return Err(CallError::invalid_answer(format!(
                "bundle revision {} carries more than {MAX_BUNDLE_REVOCATION_ITEMS} taints or CRLs",
                b.revision
            )));
        }
        if b.jwt_keys.len() > MAX_BUNDLE_JWT_KEYS {
            return Err(CallError::invalid_answer(format!(
                "bundle revision {} carries more than {MAX_BUNDLE_JWT_KEYS} JWT keys",
                b.revision
            )));
        }
        let jwt_keys = jwt_keys(b.jwt_keys);
        let mut tainted_key_ids = Vec::new();
        let mut tainted_jwt_key_ids = Vec::new();
        for id in &b.tainted_key_ids {
            if jwt_keys.iter().any(|k| k.key_id() == id) {
                if !tainted_jwt_key_ids.contains(id) {
                    tainted_jwt_key_ids.push(id.clone());
                }
                continue;
            }
            match normalize_key_id(id) {
                Some(k) if !tainted_key_ids.contains(&k) => tainted_key_ids.push(k),
                Some(_) => {}
                None => {
                    tracing::warn!(key_id = %id.escape_debug(), "ignoring a tainted key ID that is not hex")
                }
            }
        }
        tainted_key_ids.sort();
        tainted_jwt_key_ids.sort();
        let mut crls = Vec::new();
        for c in b.crls {
            match normalize_key_id(&c.key_id) {
                Some(key_id) if !c.der.is_empty() && c.der.len() <= MAX_CRL_BYTES => {
                    crls.push(Crl {
                        key_id,
                        der: c.der,
                        number: c.number,
                    })
                }
                _ => {
                    tracing::warn!(key_id = %c.key_id.escape_debug(), bytes = c.der.len(), "ignoring a malformed CRL entry")
                }
            }
        }
        Ok(TrustBundle {
            trust_domain,
            roots_der: b.roots,
            revision: b.revision,
            tainted_key_ids,
            crls,
            jwt_keys,
            tainted_jwt_key_ids,
        })
    }
}

/// The bundle's JWT keys that `signet_pki::jwt` reads; each other one is logged with its
/// reason and dropped, and a second key with an ID already seen is dropped too.
fn jwt_keys(keys: Vec<pb::JwtKey>) -> Vec<JwtPublicKey> {
    read_jwt_keys(keys, false)
}

/// The JWT keys of a foreign trust domain's bundle (`FederatedBundle.jwt_authorities`): as
/// [`jwt_keys`], except that a key may leave its `alg` unstated (its type then decides).
pub(crate) fn federated_jwt_keys(keys: Vec<pb::JwtKey>) -> Vec<JwtPublicKey> {
    read_jwt_keys(keys, true)
}

fn read_jwt_keys(keys: Vec<pb::JwtKey>, alg_optional: bool) -> Vec<JwtPublicKey> {
    let mut out: Vec<JwtPublicKey> = Vec::with_capacity(keys.len());
    for k in keys {
        let kid = signet_types::untrusted::shown(&k.key_id);
        let alg = match JwtAlg::parse(&k.alg) {
            Some(a) => Some(a),
            None if alg_optional && k.alg.is_empty() => None,
            None => {
                tracing::warn!(key_id = %kid, alg = %signet_types::untrusted::shown(&k.alg), "ignoring a JWT key with an unknown alg");
                continue;
            }
        };
        if k.key_id.len() > MAX_JWT_KEY_ID_BYTES {
            tracing::warn!(key_id = %kid, "ignoring a JWT key whose key ID is too long");
            continue;
        }
        if out.iter().any(|o| o.key_id() == k.key_id) {
            tracing::warn!(key_id = %kid, "ignoring a second JWT key with the same key ID");
            continue;
        }
        match JwtPublicKey::from_spki(k.key_id, alg, &k.public_key) {
            Ok(key) => out.push(key),
            Err(e) => {
                tracing::warn!(key_id = %kid, error = %e, "ignoring a JWT key that cannot be read")
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::test_certs::{leaf, root};

    fn invalid<T: std::fmt::Debug>(r: Result<T, CallError>) -> String {
        match r {
            Err(e @ CallError::InvalidAnswer(_)) => e.to_string(),
            other => panic!("expected an invalid answer, got {other:?}"),
        }
    }

    #[test]
    fn bundle_conversion_checks_domain_and_roots() {
        let root = root().der;
        let good = pb::Bundle {
            trust_domain: "example.org".into(),
            roots: vec![root.clone()],
            revision: 4,
            ..Default::default()
        };
        let b = TrustBundle::try_from(good.clone()).expect("valid");
        assert_eq!(b.trust_domain.to_string(), "example.org");
        assert!(b.roots_pem().starts_with("-----BEGIN CERTIFICATE-----\n"));
        assert_eq!((b.roots_der, b.revision), (vec![root.clone()], 4));
        for bad in [
            pb::Bundle {
                trust_domain: "not a domain!".into(),
                ..good.clone()
            },
            pb::Bundle {
                roots: vec![],
                ..good.clone()
            },
            pb::Bundle {
                roots: vec![root.clone(), b"garbage".to_vec()],
                ..good.clone()
            },
            pb::Bundle {
                roots: vec![[root.as_slice(), b"x"].concat()],
                ..good.clone()
            },
        ] {
            invalid(TrustBundle::try_from(bad));
        }
    }

    #[test]
    fn bundle_conversion_normalises_taints_and_drops_malformed_crl_entries() {
        let root = root().der;
        let crl = |key_id: &str, der: Vec<u8>| pb::Crl {
            key_id: key_id.into(),
            der,
            number: 3,
            ..Default::default()
        };
        let b = TrustBundle::try_from(pb::Bundle {
            trust_domain: "example.org".into(),
            roots: vec![root.clone()],
            revision: 5,
            tainted_key_ids: vec!["AB01".into(), "ab01".into(), "not hex".into(), "abc".into()],
            crls: vec![
                crl("CD02", vec![0x30, 0]),
                crl("zz", vec![0x30, 0]),
                crl("cd03", vec![]),
                crl("cd04", vec![0; MAX_CRL_BYTES + 1]),
            ],
            jwt_keys: vec![],
        })
        .expect("valid");
        assert_eq!(
            b.tainted_key_ids,
            ["ab01"],
            "lowercased, deduplicated, non-hex dropped"
        );
        assert_eq!(
            b.crls,
            [Crl {
                key_id: "cd02".into(),
                der: vec![0x30, 0],
                number: 3
            }],
            "bad key IDs, empty and oversized CRLs dropped (signatures are checked later)"
        );
        let too_many = pb::Bundle {
            trust_domain: "example.org".into(),
            roots: vec![root],
            revision: 6,
            tainted_key_ids: vec!["ab".into(); MAX_BUNDLE_REVOCATION_ITEMS + 1],
            crls: vec![],
            jwt_keys: vec![],
        };
        assert!(invalid(TrustBundle::try_from(too_many)).contains("more than 256"));
    }

    fn jwt_key(alg: &str) -> (String, pb::JwtKey) {
        let key = signet_pki::key::generate(signet_pki::key::KeyAlgorithm::EcdsaP256).expect("key");
        let spki = key.public_key_der().expect("spki");
        let kid = signet_pki::jwt::key_id_for(&spki);
        (
            kid.clone(),
            pb::JwtKey {
                key_id: kid,
                alg: alg.into(),
                public_key: spki,
                not_after: 0,
            },
        )
    }

    #[test]
    fn bundle_jwt_keys_are_read_bad_ones_dropped_and_their_taints_kept_apart() {
        let root = root().der;
        let (kid, good) = jwt_key("ES256");
        let (_, wrong_alg) = jwt_key("RS256");
        let (_, unknown_alg) = jwt_key("HS256");
        let garbage = pb::JwtKey {
            key_id: "garbage".into(),
            alg: "ES256".into(),
            public_key: b"not a key".to_vec(),
            not_after: 0,
        };
        let long_kid = pb::JwtKey {
            key_id: "k".repeat(MAX_JWT_KEY_ID_BYTES + 1),
            ..jwt_key("ES256").1
        };
        let b = TrustBundle::try_from(pb::Bundle {
            trust_domain: "example.org".into(),
            roots: vec![root.clone()],
            revision: 5,
            tainted_key_ids: vec![kid.clone(), "AB01".into()],
            crls: vec![],
            jwt_keys: vec![
                good.clone(),
                wrong_alg,
                unknown_alg,
                garbage,
                long_kid,
                good.clone(),
            ],
        })
        .expect("valid");
        let kids: Vec<&str> = b.jwt_keys.iter().map(|k| k.key_id()).collect();
        assert_eq!(
            kids,
            [kid.as_str()],
            "bad, mis-stated and repeated keys dropped"
        );
        assert!(b.jwt_key_set().get(&kid).is_some());
        assert_eq!(b.tainted_jwt_key_ids, [kid.as_str()], "kept as written");
        assert_eq!(b.tainted_key_ids, ["ab01"], "CA key taints as before");
        let too_many = pb::Bundle {
            trust_domain: "example.org".into(),
            roots: vec![root],
            revision: 6,
            jwt_keys: vec![good; MAX_BUNDLE_JWT_KEYS + 1],
            ..Default::default()
        };
        assert!(invalid(TrustBundle::try_from(too_many)).contains("JWT keys"));
    }

    #[test]
    fn key_ids_are_even_length_hex() {
        assert_eq!(normalize_key_id(" AB01 ").as_deref(), Some("ab01"));
        for bad in ["", "abc", "zz", &"ab".repeat(65)] {
            assert_eq!(normalize_key_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_signed_csr_splits_off_the_root_and_must_be_the_named_svid() {
        let ca = root();
        let id = "spiffe://example.org/ns/a/sa/web";
        let leaf = leaf(&ca, id);
        let answer = |chain: Vec<Vec<u8>>, id: &str| pb::SignCsrResponse {
            cert_chain: chain,
            spiffe_id: id.into(),
            serial: "01".into(),
            not_before: 1,
            not_after: 2,
        };
        let got = issued_of_sign_csr(answer(vec![leaf.clone(), ca.der.clone()], id)).unwrap();
        assert_eq!(got.root_der.as_deref(), Some(ca.der.as_slice()));
        assert_eq!(got.certificate.chain_der(), std::slice::from_ref(&leaf));
        assert_eq!(got.certificate.spiffe_id().to_string(), id);
        // The leaf alone: no root.
        let got = issued_of_sign_csr(answer(vec![leaf.clone()], id)).unwrap();
        assert_eq!(got.root_der, None);

        // Malformed answers are refused, each with a reason.
        assert!(invalid(issued_of_sign_csr(answer(vec![], id))).contains("no certificate"));
        assert!(
            invalid(issued_of_sign_csr(answer(
                vec![leaf.clone(), b"junk".to_vec()],
                id
            )))
            .contains("its root")
        );
        assert!(
            invalid(issued_of_sign_csr(answer(
                vec![leaf.clone()],
                "spiffe://example.org/other"
            )))
            .contains("not the SPIFFE ID")
        );
        assert!(
            invalid(issued_of_sign_csr(answer(
                vec![b"junk".to_vec(), ca.der.clone()],
                id
            )))
            .contains("does not parse")
        );
        // A CA certificate is not an SVID.
        assert!(
            invalid(issued_of_sign_csr(answer(
                vec![ca.der.clone()],
                "spiffe://example.org"
            )))
            .contains("CA certificate")
        );
    }

    #[test]
    fn an_istio_answer_is_pem_and_checked_the_same_way() {
        let ca = root();
        let id = "spiffe://example.org/ns/a/sa/web";
        let leaf = leaf(&ca, id);
        let pem = |d: &[u8]| signet_types::pem::certs_to_pem([d]);
        let got = issued_of_istio(istio::IstioCertificateResponse {
            cert_chain: vec![pem(&leaf), pem(&ca.der)],
        })
        .unwrap();
        assert_eq!(got.certificate.spiffe_id().to_string(), id);
        assert_eq!(got.root_der.as_deref(), Some(ca.der.as_slice()));
        invalid(issued_of_istio(istio::IstioCertificateResponse {
            cert_chain: vec![],
        }));
        invalid(issued_of_istio(istio::IstioCertificateResponse {
            cert_chain: vec!["not pem".into()],
        }));
        invalid(issued_of_istio(istio::IstioCertificateResponse {
            cert_chain: vec![pem(&ca.der)],
        }));
    }
}
