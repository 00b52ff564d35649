//! The seam to "the CA the agent talks to": node attestation, node renewal, the node's
//! registration entries, workload signing and the trust bundle stream, as the trait [`Ca`]
//! over domain types. [`GrpcCa`] implements it over `signet.agent.v1.Node` and
//! `signet.ca.v1.CertificateAuthority/WatchBundle` (mTLS via `signet_client`); tests use a
//! fake. Protos are converted here, at the edge, and nowhere else.

use std::fmt;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use signet_client::ClientIdentity;
use signet_pki::SvidCertificate;
use signet_proto::agent as pb;
use signet_proto::agent::node_client::NodeClient;
use signet_proto::ca as pb_ca;
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_types::{SpiffeId, TrustDomain};
use tonic::transport::Channel;

use crate::state::Selector;

/// How the node proves itself on first contact. `Debug` hides the secret.
#[derive(Clone)]
pub enum AttestCredential {
    JoinToken(String),
    /// A projected service-account token, sent as `authorization: Bearer`.
    ServiceAccountToken(String),
}

impl fmt::Debug for AttestCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttestCredential::JoinToken(_) => f.write_str("JoinToken(…)"),
            AttestCredential::ServiceAccountToken(_) => f.write_str("ServiceAccountToken(…)"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attested {
    pub node_id: String,
    /// The node SVID, chain leaf first, root last (as the server sends it).
    pub svid: SvidCertificate,
    pub bundle_der: Vec<Vec<u8>>,
}

/// A registration entry parented to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySpec {
    pub id: String,
    pub spiffe_id: SpiffeId,
    pub parent_id: String,
    pub selectors: Vec<Selector>,
    pub ttl: Duration,
    pub dns_names: Vec<String>,
    pub revision: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntriesUpdate {
    Unchanged,
    Changed {
        revision: u64,
        entries: Vec<EntrySpec>,
    },
}

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
    /// certificate issued under one of them is replaced now. Normalised to lowercase; an ID
    /// that is not hex is dropped at conversion.
    pub tainted_key_ids: Vec<String>,
    /// The issuing CAs' CRLs as the server sent them; checked (signature, number) by
    /// [`crate::revocation`] before anything acts on them.
    pub crls: Vec<Crl>,
}

/// A CRL as the server publishes it (not verified yet: see [`crate::revocation`]).
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
pub type BundleStream = Pin<Box<dyn Stream<Item = Result<TrustBundle, CaError>> + Send>>;

/// The node's entry revision from the server's push stream (`WatchEntries`): at once, on every
/// change, and again at each keep-alive; ends or fails when the connection does. A revision
/// other than the one the agent holds means "sync now" (the entries come from `SyncEntries`).
pub type EntryRevisionStream = Pin<Box<dyn Stream<Item = Result<u64, CaError>> + Send>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadCsr {
    pub entry_id: String,
    pub csr_der: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaError {
    /// The CA could not be reached or answered with a transient error: retry with backoff.
    #[error("CA unavailable: {0}")]
    Unavailable(String),
    /// The CA refused (bad token, banned node, unknown entry…): retrying will not help.
    #[error("CA refused ({code:?}): {message}")]
    Refused { code: tonic::Code, message: String },
    /// The CA answered something malformed.
    #[error("invalid answer from the CA: {0}")]
    Invalid(String),
}

impl From<tonic::Status> for CaError {
    /// By the classification every client shares (`signet_client::ErrorClass`): a retryable
    /// answer (Unauthenticated included: the agent's credential may be renewed or re-attested)
    /// is `Unavailable`, a refusal or a malformed request `Refused`.
    fn from(s: tonic::Status) -> Self {
        match signet_client::ErrorClass::of_status(&s) {
            signet_client::ErrorClass::Retryable => CaError::Unavailable(s.message().to_owned()),
            signet_client::ErrorClass::Permanent | signet_client::ErrorClass::Invalid => {
                CaError::Refused {
                    code: s.code(),
                    message: s.message().to_owned(),
                }
            }
        }
    }
}

impl CaError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, CaError::Unavailable(_))
    }
}

/// Most CSRs the server accepts in one `SignWorkloads` call (its `MAX_WORKLOADS_PER_CALL`).
pub const MAX_CSRS_PER_CALL: usize = 256;

#[async_trait::async_trait]
pub trait Ca: Send + Sync {
    async fn attest(&self, cred: &AttestCredential, csr_der: &[u8]) -> Result<Attested, CaError>;
    async fn renew_node(&self, csr_der: &[u8]) -> Result<SvidCertificate, CaError>;
    async fn sync_entries(&self, known_revision: u64) -> Result<EntriesUpdate, CaError>;
    /// One result per CSR, in order.
    async fn sign_workloads(
        &self,
        csrs: Vec<WorkloadCsr>,
    ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError>;
    /// Opens the server's trust bundle stream. The default: a CA without one.
    async fn watch_bundle(&self) -> Result<BundleStream, CaError> {
        Err(CaError::Refused {
            code: tonic::Code::Unimplemented,
            message: "this CA has no trust bundle stream".into(),
        })
    }
    /// Opens the server's entry-change stream. The default: a CA without one (the agent then
    /// relies on its `sync_interval` poll).
    async fn watch_entries(&self) -> Result<EntryRevisionStream, CaError> {
        Err(CaError::Refused {
            code: tonic::Code::Unimplemented,
            message: "this CA has no entry stream".into(),
        })
    }
}

// --- proto conversions ------------------------------------------------------------------

fn unix_time(secs: i64) -> Result<SystemTime, CaError> {
    signet_runtime::clock::from_unix_checked(secs)
        .ok_or_else(|| CaError::Invalid(format!("time {secs} out of range")))
}

/// A certificate from the server's answer: the chain must be an X509-SVID
/// ([`SvidCertificate::from_chain_der`]: leaf first, exactly one SPIFFE ID, not a CA), the
/// answer's own fields must be sane (a SPIFFE ID, times in range, `not_after` after
/// `not_before`) and its SPIFFE ID must be the certificate's. What the agent then uses (SPIFFE
/// ID, validity) is read from the certificate; the answer's serial is not used.
pub fn svid_from_pb(s: pb::Svid) -> Result<SvidCertificate, CaError> {
    let spiffe_id: SpiffeId = s
        .spiffe_id
        .parse()
        .map_err(|e| CaError::Invalid(format!("SPIFFE ID {:?}: {e}", s.spiffe_id)))?;
    if s.cert_chain.is_empty() {
        return Err(CaError::Invalid("empty certificate chain".into()));
    }
    let not_before = unix_time(s.not_before)?;
    let not_after = unix_time(s.not_after)?;
    if not_after <= not_before {
        return Err(CaError::Invalid("not_after is not after not_before".into()));
    }
    let cert = SvidCertificate::from_chain_der(s.cert_chain)
        .map_err(|e| CaError::Invalid(e.to_string()))?;
    if *cert.spiffe_id() != spiffe_id {
        return Err(CaError::Invalid(format!(
            "the answer names {spiffe_id}, its certificate {}",
            cert.spiffe_id()
        )));
    }
    if cert.not_after() <= cert.not_before() {
        return Err(CaError::Invalid(
            "the certificate's not_after is not after its not_before".into(),
        ));
    }
    Ok(cert)
}

impl TryFrom<pb_ca::Bundle> for TrustBundle {
    type Error = CaError;
    fn try_from(b: pb_ca::Bundle) -> Result<Self, CaError> {
        let trust_domain = b.trust_domain.parse().map_err(|e| {
            CaError::Invalid(format!("bundle trust domain {:?}: {e}", b.trust_domain))
        })?;
        if b.roots.is_empty() {
            return Err(CaError::Invalid(format!(
                "bundle revision {} has no roots",
                b.revision
            )));
        }
        for (i, r) in b.roots.iter().enumerate() {
            match x509_parser::parse_x509_certificate(r) {
                Ok(([], _)) => {}
                Ok(_) => {
                    return Err(CaError::Invalid(format!(
                        "bundle root {i}: trailing data after the certificate"
                    )));
                }
                Err(e) => return Err(CaError::Invalid(format!("bundle root {i}: {e}"))),
            }
        }
        if b.tainted_key_ids.len() > MAX_BUNDLE_REVOCATION_ITEMS
            || b.crls.len() > MAX_BUNDLE_REVOCATION_ITEMS
        {
            return Err(CaError::Invalid(format!(
                "bundle revision {} carries more than {MAX_BUNDLE_REVOCATION_ITEMS} taints or CRLs",
                b.revision
            )));
        }
        let mut tainted_key_ids = Vec::new();
        for id in &b.tainted_key_ids {
            match normalize_key_id(id) {
                Some(k) if !tainted_key_ids.contains(&k) => tainted_key_ids.push(k),
                Some(_) => {}
                None => {
                    tracing::warn!(key_id = %id.escape_debug(), "ignoring a tainted key ID that is not hex")
                }
            }
        }
        tainted_key_ids.sort();
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
        })
    }
}

impl TryFrom<pb::Entry> for EntrySpec {
    type Error = CaError;
    fn try_from(e: pb::Entry) -> Result<Self, CaError> {
        let spiffe_id = e
            .spiffe_id
            .parse()
            .map_err(|err| CaError::Invalid(format!("entry {}: SPIFFE ID: {err}", e.id)))?;
        let selectors = e
            .selectors
            .iter()
            .map(|s| s.parse::<Selector>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| CaError::Invalid(format!("entry {}: {err}", e.id)))?;
        Ok(EntrySpec {
            id: e.id,
            spiffe_id,
            parent_id: e.parent_id,
            selectors,
            ttl: Duration::from_secs(u64::try_from(e.ttl_seconds).unwrap_or(0)),
            dns_names: e.dns_names,
            revision: e.revision,
        })
    }
}

/// The entries this agent can serve. One it cannot (a selector kind it does not implement)
/// is logged and skipped, so it does not keep the others from being served.
pub(crate) fn convert_entries(entries: Vec<pb::Entry>) -> Vec<EntrySpec> {
    entries
        .into_iter()
        .filter_map(|e| match EntrySpec::try_from(e) {
            Ok(spec) => Some(spec),
            Err(err) => {
                tracing::warn!(error = %err, "skipping a registration entry this agent cannot serve");
                None
            }
        })
        .collect()
}

pub(crate) fn convert_sign_results(
    resp: pb::SignWorkloadsResponse,
) -> Vec<(String, Result<SvidCertificate, CaError>)> {
    resp.results
        .into_iter()
        .map(|r| {
            let result = if r.code == 0 {
                r.svid
                    .ok_or_else(|| CaError::Invalid("success without a certificate".into()))
                    .and_then(svid_from_pb)
            } else {
                Err(CaError::from(tonic::Status::new(
                    tonic::Code::from_i32(r.code),
                    r.message,
                )))
            };
            (r.entry_id, result)
        })
        .collect()
}

// --- which server ------------------------------------------------------------------------

/// The trust domain whose Signet server (`spiffe://<td>/signet/server`) the agent talks to:
/// `trust_domain` from the configuration; else the one the roots it trusts for the server name
/// (a root Signet generates carries `spiffe://<td>`). Decided at each connection, so an agent
/// whose bootstrap bundle is not there yet keeps retrying instead of exiting.
pub fn expected_trust_domain(
    configured: Option<&TrustDomain>,
    roots_pem: &[u8],
) -> Result<TrustDomain, CaError> {
    match configured {
        Some(td) => Ok(td.clone()),
        None => signet_client::trust_domain_of_bundle(roots_pem).map_err(|e| {
            CaError::Unavailable(format!(
                "cannot tell the server's trust domain ({e}): set trust_domain in the \
                 agent's configuration"
            ))
        }),
    }
}

// --- gRPC implementation ----------------------------------------------------------------

/// [`Ca`] over the `signet.agent.v1.Node` gRPC service, and the bundle stream of
/// `signet.ca.v1.CertificateAuthority` on the same connection.
#[derive(Clone)]
pub struct GrpcCa {
    client: NodeClient<Channel>,
    authority: CertificateAuthorityClient<Channel>,
}

impl GrpcCa {
    /// Connects over TLS to the server at `addr`, which must chain to `bundle_pem` and present
    /// `spiffe://<trust_domain>/signet/server` (checked by `signet_client` during the
    /// handshake, before the join token or anything else is sent); with `identity` (the node
    /// SVID) for mTLS.
    pub async fn connect(
        addr: &str,
        trust_domain: Option<&TrustDomain>,
        bundle_pem: &[u8],
        identity: Option<&ClientIdentity>,
    ) -> Result<Self, CaError> {
        let trust_domain = expected_trust_domain(trust_domain, bundle_pem)?;
        let target = signet_client::ServerTarget::new(addr, bundle_pem.to_vec(), trust_domain);
        let channel = signet_client::connect(&target, identity)
            .await
            .map_err(|e| CaError::Unavailable(e.to_string()))?;
        Ok(Self::from_channel(channel))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            client: NodeClient::new(channel.clone()),
            authority: CertificateAuthorityClient::new(channel),
        }
    }
}

#[async_trait::async_trait]
impl Ca for GrpcCa {
    async fn attest(&self, cred: &AttestCredential, csr_der: &[u8]) -> Result<Attested, CaError> {
        let mut msg = pb::AttestRequest {
            join_token: String::new(),
            csr: csr_der.to_vec(),
        };
        let req = match cred {
            AttestCredential::JoinToken(t) => {
                msg.join_token = t.clone();
                tonic::Request::new(msg)
            }
            AttestCredential::ServiceAccountToken(t) => {
                signet_client::with_bearer(msg, t).map_err(|e| CaError::Invalid(e.to_string()))?
            }
        };
        let resp = self.client.clone().attest(req).await?.into_inner();
        Ok(Attested {
            node_id: resp.node_id,
            svid: svid_from_pb(resp.svid.ok_or_else(|| {
                CaError::Invalid("attestation answer without a certificate".into())
            })?)?,
            bundle_der: resp.bundle,
        })
    }

    async fn renew_node(&self, csr_der: &[u8]) -> Result<SvidCertificate, CaError> {
        let req = pb::RenewNodeRequest {
            csr: csr_der.to_vec(),
        };
        svid_from_pb(
            self.client
                .clone()
                .renew_node(signet_runtime::telemetry::traced_request(req))
                .await?
                .into_inner(),
        )
    }

    async fn sync_entries(&self, known_revision: u64) -> Result<EntriesUpdate, CaError> {
        let resp = self
            .client
            .clone()
            .sync_entries(pb::SyncEntriesRequest { known_revision })
            .await?
            .into_inner();
        if resp.unchanged {
            return Ok(EntriesUpdate::Unchanged);
        }
        Ok(EntriesUpdate::Changed {
            revision: resp.revision,
            entries: convert_entries(resp.entries),
        })
    }

    async fn sign_workloads(
        &self,
        csrs: Vec<WorkloadCsr>,
    ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError> {
        // The server takes at most MAX_CSRS_PER_CALL CSRs per call; a node with more entries
        // due at once (a fresh start with a thousand entries) sends several calls.
        let mut results = Vec::with_capacity(csrs.len());
        let mut csrs = csrs.into_iter().peekable();
        while csrs.peek().is_some() {
            let req = pb::SignWorkloadsRequest {
                csrs: csrs
                    .by_ref()
                    .take(MAX_CSRS_PER_CALL)
                    .map(|c| pb::WorkloadCsr {
                        entry_id: c.entry_id,
                        csr: c.csr_der,
                    })
                    .collect(),
            };
            // The server's spans join the renewal's trace.
            let req = signet_runtime::telemetry::traced_request(req);
            let resp = self.client.clone().sign_workloads(req).await?.into_inner();
            results.extend(convert_sign_results(resp));
        }
        Ok(results)
    }

    async fn watch_bundle(&self) -> Result<BundleStream, CaError> {
        let stream = self
            .authority
            .clone()
            .watch_bundle(pb_ca::WatchBundleRequest {})
            .await?
            .into_inner();
        Ok(Box::pin(stream.map(|item| {
            item.map_err(CaError::from).and_then(TrustBundle::try_from)
        })))
    }

    async fn watch_entries(&self) -> Result<EntryRevisionStream, CaError> {
        let stream = self
            .client
            .clone()
            .watch_entries(pb::WatchEntriesRequest {})
            .await?
            .into_inner();
        Ok(Box::pin(stream.map(|item| {
            item.map(|c| c.revision).map_err(CaError::from)
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use crate::testing::TestCa;

    /// A node SVID valid from 1000 s to 2000 s after the epoch, chain leaf then root, as
    /// the server answers.
    fn pb_svid_of(ca: &TestCa) -> pb::Svid {
        let (leaf, _) = ca.leaf(
            "spiffe://example.org/signet/node/n1",
            1,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
            Duration::from_secs(1000),
        );
        pb::Svid {
            spiffe_id: "spiffe://example.org/signet/node/n1".into(),
            cert_chain: vec![leaf, ca.der.clone()],
            serial: "01".into(),
            not_before: 1000,
            not_after: 2000,
        }
    }

    fn pb_svid() -> pb::Svid {
        pb_svid_of(&TestCa::new("ca"))
    }

    #[test]
    fn svid_conversion_checks_fields() {
        let ca = TestCa::new("ca");
        let pb_svid = || pb_svid_of(&ca);
        let answer = pb_svid();
        let s = svid_from_pb(answer.clone()).expect("valid");
        assert_eq!(
            s.not_after(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(2000)
        );
        assert_eq!(s.chain_der(), answer.cert_chain, "the root is kept");
        let refused = |svid: pb::Svid| match svid_from_pb(svid) {
            Err(CaError::Invalid(why)) => why,
            other => panic!("unexpected {other:?}"),
        };
        refused(pb::Svid {
            cert_chain: vec![],
            ..pb_svid()
        });
        refused(pb::Svid {
            not_before: -1,
            ..pb_svid()
        });
        refused(pb::Svid {
            not_after: 1000,
            ..pb_svid()
        });
        refused(pb::Svid {
            spiffe_id: "http://x".into(),
            ..pb_svid()
        });
        // The certificate itself: it must parse and be an X509-SVID (not the CA's)…
        refused(pb::Svid {
            cert_chain: vec![vec![1], vec![2]],
            ..pb_svid()
        });
        refused(pb::Svid {
            cert_chain: vec![ca.der.clone()],
            ..pb_svid()
        });
        // …of the SPIFFE ID the answer names.
        let why = refused(pb::Svid {
            spiffe_id: "spiffe://example.org/signet/node/n2".into(),
            ..pb_svid()
        });
        assert!(why.contains("its certificate"), "{why}");
        // A certificate valid for no time at all.
        let (empty, _) = ca.leaf(
            "spiffe://example.org/signet/node/n1",
            2,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
            Duration::ZERO,
        );
        refused(pb::Svid {
            cert_chain: vec![empty],
            ..pb_svid()
        });
    }

    #[test]
    fn bundle_conversion_checks_domain_and_roots() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let root = rcgen::CertificateParams::default()
            .self_signed(&key)
            .expect("cert")
            .der()
            .to_vec();
        let good = pb_ca::Bundle {
            trust_domain: "example.org".into(),
            roots: vec![root.clone()],
            revision: 4,
            ..Default::default()
        };
        let b = TrustBundle::try_from(good.clone()).expect("valid");
        assert_eq!(b.trust_domain.to_string(), "example.org");
        assert_eq!((b.roots_der, b.revision), (vec![root.clone()], 4));
        for bad in [
            pb_ca::Bundle {
                trust_domain: "not a domain!".into(),
                ..good.clone()
            },
            pb_ca::Bundle {
                roots: vec![],
                ..good.clone()
            },
            pb_ca::Bundle {
                roots: vec![root.clone(), b"garbage".to_vec()],
                ..good.clone()
            },
            pb_ca::Bundle {
                roots: vec![[root.as_slice(), b"x"].concat()],
                ..good.clone()
            },
        ] {
            assert!(
                matches!(TrustBundle::try_from(bad.clone()), Err(CaError::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bundle_conversion_normalises_taints_and_drops_malformed_crl_entries() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let root = rcgen::CertificateParams::default()
            .self_signed(&key)
            .expect("cert")
            .der()
            .to_vec();
        let crl = |key_id: &str, der: Vec<u8>| pb_ca::Crl {
            key_id: key_id.into(),
            der,
            number: 3,
            ..Default::default()
        };
        let b = TrustBundle::try_from(pb_ca::Bundle {
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
        let too_many = pb_ca::Bundle {
            trust_domain: "example.org".into(),
            roots: vec![root],
            revision: 6,
            tainted_key_ids: vec!["ab".into(); MAX_BUNDLE_REVOCATION_ITEMS + 1],
            crls: vec![],
        };
        assert!(matches!(
            TrustBundle::try_from(too_many),
            Err(CaError::Invalid(_))
        ));
    }

    #[test]
    fn entry_conversion_parses_selectors() {
        let e = pb::Entry {
            id: "e1".into(),
            spiffe_id: "spiffe://example.org/web".into(),
            parent_id: "spiffe://example.org/signet/node/n1".into(),
            selectors: vec!["unix:uid:33".into(), "unix:path:/usr/bin/web".into()],
            ttl_seconds: 3600,
            dns_names: vec!["web.local".into()],
            revision: 7,
        };
        let spec = EntrySpec::try_from(e.clone()).expect("valid");
        assert_eq!(spec.selectors.len(), 2);
        assert_eq!(spec.ttl, Duration::from_secs(3600));
        let bad = pb::Entry {
            selectors: vec!["docker:label:x".into()],
            ..e
        };
        let err = EntrySpec::try_from(bad.clone()).expect_err("unsupported selector");
        assert!(err.to_string().contains("e1"), "{err}");
        // In a sync, the entry the agent cannot serve is skipped, not fatal.
        let good = pb::Entry {
            id: "e2".into(),
            selectors: vec!["unix:uid:1".into()],
            ..bad.clone()
        };
        let kept = convert_entries(vec![bad, good]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].id, "e2");
    }

    #[test]
    fn sign_results_keep_order_and_errors() {
        let out = convert_sign_results(pb::SignWorkloadsResponse {
            results: vec![
                pb::WorkloadResult {
                    entry_id: "a".into(),
                    svid: Some(pb_svid()),
                    code: 0,
                    message: String::new(),
                },
                pb::WorkloadResult {
                    entry_id: "b".into(),
                    svid: None,
                    code: tonic::Code::PermissionDenied as i32,
                    message: "not your entry".into(),
                },
                pb::WorkloadResult {
                    entry_id: "c".into(),
                    svid: None,
                    code: 0,
                    message: String::new(),
                },
            ],
        });
        assert_eq!(out[0].0, "a");
        assert!(out[0].1.is_ok());
        assert!(matches!(
            &out[1].1,
            Err(CaError::Refused {
                code: tonic::Code::PermissionDenied,
                ..
            })
        ));
        assert!(matches!(&out[2].1, Err(CaError::Invalid(_))));
    }

    #[test]
    fn status_mapping_separates_transient_from_refusal() {
        assert!(CaError::from(tonic::Status::unavailable("down")).is_retryable());
        assert!(!CaError::from(tonic::Status::permission_denied("banned")).is_retryable());
        assert!(!format!("{:?}", AttestCredential::JoinToken("tok-123".into())).contains("tok"));
    }

    #[test]
    fn the_server_trust_domain_is_configured_or_named_by_the_bundle() {
        let root = |uri: Option<&str>| {
            let key = rcgen::KeyPair::generate().expect("key");
            let mut p = rcgen::CertificateParams::default();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            if let Some(u) = uri {
                p.subject_alt_names = vec![rcgen::SanType::URI(u.try_into().expect("uri"))];
            }
            p.self_signed(&key).expect("cert").pem()
        };
        let signet = root(Some("spiffe://example.org"));
        let plugged = root(None);
        let corp: TrustDomain = "corp.example".parse().expect("td");
        let td = |c: Option<&TrustDomain>, pem: &str| {
            expected_trust_domain(c, pem.as_bytes()).map(|t| t.to_string())
        };
        assert_eq!(td(Some(&corp), &signet).as_deref(), Ok("corp.example"));
        assert_eq!(td(Some(&corp), &plugged).as_deref(), Ok("corp.example"));
        assert_eq!(td(None, &signet).as_deref(), Ok("example.org"));
        let err = td(None, &plugged).expect_err("no trust domain");
        assert!(err.to_string().contains("set trust_domain"), "{err}");
        assert!(err.is_retryable());
    }

    /// The fake the agent's loops are tested against: it records calls.
    struct FakeCa {
        calls: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl Ca for FakeCa {
        async fn attest(&self, _: &AttestCredential, _: &[u8]) -> Result<Attested, CaError> {
            self.calls
                .lock()
                .map_err(|e| CaError::Invalid(e.to_string()))?
                .push("attest".into());
            Ok(Attested {
                node_id: "n1".into(),
                svid: svid_from_pb(pb_svid())?,
                bundle_der: vec![vec![9]],
            })
        }
        async fn renew_node(&self, _: &[u8]) -> Result<SvidCertificate, CaError> {
            Err(CaError::Unavailable("down".into()))
        }
        async fn sync_entries(&self, known: u64) -> Result<EntriesUpdate, CaError> {
            Ok(if known == 0 {
                EntriesUpdate::Changed {
                    revision: 1,
                    entries: vec![],
                }
            } else {
                EntriesUpdate::Unchanged
            })
        }
        async fn sign_workloads(
            &self,
            csrs: Vec<WorkloadCsr>,
        ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError> {
            Ok(csrs
                .into_iter()
                .map(|c| (c.entry_id, svid_from_pb(pb_svid())))
                .collect())
        }
    }

    #[tokio::test]
    async fn the_trait_is_object_safe_and_fakeable() {
        let ca: std::sync::Arc<dyn Ca> = std::sync::Arc::new(FakeCa {
            calls: Mutex::new(vec![]),
        });
        let a = ca
            .attest(&AttestCredential::JoinToken("t".into()), b"csr")
            .await
            .expect("attest");
        assert_eq!(a.node_id, "n1");
        assert!(
            ca.renew_node(b"csr")
                .await
                .expect_err("down")
                .is_retryable()
        );
        assert_eq!(
            ca.sync_entries(1).await.expect("sync"),
            EntriesUpdate::Unchanged
        );
        let r = ca
            .sign_workloads(vec![WorkloadCsr {
                entry_id: "e".into(),
                csr_der: vec![],
            }])
            .await
            .expect("sign");
        assert_eq!(r[0].0, "e");
    }
}
