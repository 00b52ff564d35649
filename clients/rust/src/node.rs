//! The typed client of `signet.agent.v1.Node`, the API a node agent talks: [`NodeClient`]
//! attests the node (join token or service-account token), renews the node's SVID, syncs the
//! registration entries parented to the node and signs its workloads' CSRs, answering in
//! domain types ([`SvidCertificate`], [`Entry`]), never in protos.
//!
//! The invariant: every certificate handed back is an X509-SVID for exactly the SPIFFE ID the
//! server's answer names, with a non-empty validity ([`crate::convert`]); an answer that is not
//! is a [`CallError::InvalidAnswer`], for that call or, in a batch, for that one item. An entry
//! whose SPIFFE ID does not parse is logged and skipped, so it does not keep the others from
//! being served; its selectors are handed over as the server wrote them, for the agent to
//! parse into the kinds it implements.

use std::fmt;
use std::time::Duration;

use signet_pki::SvidCertificate;
use signet_proto::agent as pb;
use signet_proto::agent::node_client::NodeClient as PbNodeClient;
use signet_types::{SpiffeId, TrustDomain};
use tonic::transport::Channel;

use crate::ca::CaClient;
use crate::convert::{issued_svid, request};
use crate::error::CallError;
use crate::{ClientError, ClientIdentity, ServerTarget};

/// Most CSRs the server accepts in one `SignWorkloads` call (its `MAX_WORKLOADS_PER_CALL`);
/// [`NodeClient::sign_workloads`] sends more in several calls.
pub const MAX_CSRS_PER_CALL: usize = 256;

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

/// The answer to a successful attestation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attested {
    pub node_id: String,
    /// The node's SVID: leaf first, the chain as the server sent it.
    pub svid: SvidCertificate,
    /// DER roots the server sent with it.
    pub bundle_der: Vec<Vec<u8>>,
}

/// A registration entry parented to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub spiffe_id: SpiffeId,
    pub parent_id: String,
    /// As the server wrote them (`kind:key:value`); the agent parses the kinds it implements.
    pub selectors: Vec<String>,
    /// Zero when the server sent none (or a negative one).
    pub ttl: Duration,
    pub dns_names: Vec<String>,
    pub revision: u64,
    /// The foreign trust domains whose bundles this entry's workloads receive.
    pub federates_with: Vec<TrustDomain>,
}

/// A foreign trust domain's bundle, as the server holds it (`FederatedBundle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FederatedBundle {
    pub trust_domain: TrustDomain,
    /// DER X.509 authorities.
    pub x509_authorities: Vec<Vec<u8>>,
    /// The JWT keys `signet_pki` reads (others are logged and dropped).
    pub jwt_authorities: Vec<signet_pki::jwt::JwtPublicKey>,
    /// `spiffe_sequence`; 0: none.
    pub sequence: u64,
}

/// What `SyncEntries` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntriesUpdate {
    /// The node's entries are still at the revision it knows.
    Unchanged,
    Changed {
        revision: u64,
        entries: Vec<Entry>,
        /// One per foreign trust domain the entries federate with, when the server holds it.
        federated_bundles: Vec<FederatedBundle>,
    },
}

/// One workload CSR for a registration entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadCsr {
    pub entry_id: String,
    pub csr_der: Vec<u8>,
}

/// Per workload CSR, in order: its entry ID and its certificate or why it was not signed. A
/// refusal the server shed (ResourceExhausted) carries the entry's retry hint as
/// [`CallError::pushback`], as a shed call does.
pub type WorkloadResults = Vec<(String, Result<SvidCertificate, CallError>)>;

/// One JWT-SVID to mint (`MintWorkloadJwts`): for the registration entry `entry_id`, for
/// every audience in `audience` (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtRequest {
    pub entry_id: String,
    pub audience: Vec<String>,
}

/// A JWT-SVID the server minted, its claims as the answer names them (checked: a token, a
/// SPIFFE ID, an expiry after its issue time, a key ID). `Debug` hides the token.
#[derive(Clone, PartialEq, Eq)]
pub struct MintedJwt {
    /// The compact JWS: a bearer credential, never logged.
    pub token: String,
    pub spiffe_id: SpiffeId,
    /// `iat` and `exp`, unix seconds.
    pub issued_at: i64,
    pub expires_at: i64,
    /// The `kid` of the key that signed it.
    pub key_id: String,
    pub audience: Vec<String>,
}

impl fmt::Debug for MintedJwt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MintedJwt")
            .field("spiffe_id", &self.spiffe_id)
            .field("issued_at", &self.issued_at)
            .field("expires_at", &self.expires_at)
            .field("key_id", &self.key_id)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

/// Per JWT request, in order: its entry ID and the token or why it was not minted (a shed
/// one carries the entry's retry hint, as [`WorkloadResults`] do).
pub type JwtResults = Vec<(String, Result<MintedJwt, CallError>)>;

/// The node's entry revision from `WatchEntries`: at once, on every change and at each
/// keep-alive; it ends or fails when the connection does.
pub type EntryRevisionStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<u64, CallError>> + Send>>;

/// See the module documentation. Cloning is cheap (one shared channel).
#[derive(Clone, Debug)]
pub struct NodeClient {
    node: PbNodeClient<Channel>,
    channel: Channel,
}

impl NodeClient {
    /// Connects over TLS to `target` (its chain, host name and SPIFFE ID checked during the
    /// handshake, before the join token or anything else is sent: [`crate::tls`]); with
    /// `identity` (the node's SVID), mutual TLS.
    pub async fn connect(
        target: &ServerTarget,
        identity: Option<&ClientIdentity>,
    ) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect(target, identity).await?))
    }

    /// Over a channel [`crate::connect`] opened.
    pub fn from_channel(channel: Channel) -> Self {
        Self {
            node: PbNodeClient::new(channel.clone()),
            channel,
        }
    }

    /// The CA API (the bundle stream) on the same connection.
    pub fn ca(&self) -> CaClient {
        CaClient::from_channel(self.channel.clone())
    }

    /// `Attest`: the node's first contact, proving itself with `cred`; `csr_der` is the CSR
    /// for the node's key.
    pub async fn attest(
        &self,
        cred: &AttestCredential,
        csr_der: &[u8],
    ) -> Result<Attested, CallError> {
        let mut msg = pb::AttestRequest {
            join_token: String::new(),
            csr: csr_der.to_vec(),
        };
        let req = match cred {
            AttestCredential::JoinToken(t) => {
                msg.join_token = t.clone();
                request(msg, None)?
            }
            AttestCredential::ServiceAccountToken(t) => request(msg, Some(t))?,
        };
        attested(self.node.clone().attest(req).await?.into_inner())
    }

    /// `RenewNode`: a new node SVID for `csr_der` (authenticated by the connection's SVID).
    pub async fn renew(&self, csr_der: &[u8]) -> Result<SvidCertificate, CallError> {
        let msg = pb::RenewNodeRequest {
            csr: csr_der.to_vec(),
        };
        svid(
            self.node
                .clone()
                .renew_node(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `SyncEntries`: the node's entries, unless they are still at `known_revision`.
    pub async fn sync_entries(&self, known_revision: u64) -> Result<EntriesUpdate, CallError> {
        let msg = pb::SyncEntriesRequest { known_revision };
        let resp = self
            .node
            .clone()
            .sync_entries(request(msg, None)?)
            .await?
            .into_inner();
        Ok(entries_update(resp))
    }

    /// `WatchEntries`: the server's push stream of the node's entry revision. A revision other
    /// than the one the caller holds means "sync now" ([`Self::sync_entries`]).
    pub async fn watch_entries(&self) -> Result<EntryRevisionStream, CallError> {
        use futures::StreamExt;
        let stream = self
            .node
            .clone()
            .watch_entries(request(pb::WatchEntriesRequest {}, None)?)
            .await?
            .into_inner();
        Ok(Box::pin(stream.map(|item| {
            item.map(|c| c.revision).map_err(CallError::from)
        })))
    }

    /// `SignWorkloads`: one result per CSR, in order, in as many calls of at most
    /// [`MAX_CSRS_PER_CALL`] as needed. The whole call fails only when a call does.
    pub async fn sign_workloads(
        &self,
        csrs: Vec<WorkloadCsr>,
    ) -> Result<WorkloadResults, CallError> {
        let mut results = Vec::with_capacity(csrs.len());
        let mut csrs = csrs.into_iter().peekable();
        while csrs.peek().is_some() {
            let msg = pb::SignWorkloadsRequest {
                csrs: csrs
                    .by_ref()
                    .take(MAX_CSRS_PER_CALL)
                    .map(|c| pb::WorkloadCsr {
                        entry_id: c.entry_id,
                        csr: c.csr_der,
                    })
                    .collect(),
            };
            let resp = self
                .node
                .clone()
                .sign_workloads(request(msg, None)?)
                .await?
                .into_inner();
            results.extend(sign_results(resp));
        }
        Ok(results)
    }

    /// `MintWorkloadJwts`: one result per request, in order, in as many calls of at most
    /// [`MAX_CSRS_PER_CALL`] requests as needed. The whole call fails only when a call does.
    pub async fn mint_workload_jwts(&self, reqs: &[JwtRequest]) -> Result<JwtResults, CallError> {
        let mut results = Vec::with_capacity(reqs.len());
        for chunk in reqs.chunks(MAX_CSRS_PER_CALL) {
            let msg = pb::MintWorkloadJwtsRequest {
                requests: chunk
                    .iter()
                    .map(|r| pb::WorkloadJwtRequest {
                        entry_id: r.entry_id.clone(),
                        audience: r.audience.clone(),
                    })
                    .collect(),
            };
            let resp = self
                .node
                .clone()
                .mint_workload_jwts(request(msg, None)?)
                .await?
                .into_inner();
            results.extend(jwt_results(resp));
        }
        Ok(results)
    }
}

// --- proto conversions ------------------------------------------------------------------

fn svid(s: pb::Svid) -> Result<SvidCertificate, CallError> {
    issued_svid(s.cert_chain, &s.spiffe_id)
}

fn attested(resp: pb::AttestResponse) -> Result<Attested, CallError> {
    Ok(Attested {
        node_id: resp.node_id,
        svid: svid(resp.svid.ok_or_else(|| {
            CallError::invalid_answer("attestation answer without a certificate")
        })?)?,
        bundle_der: resp.bundle,
    })
}

impl TryFrom<pb::Entry> for Entry {
    type Error = CallError;
    fn try_from(e: pb::Entry) -> Result<Self, CallError> {
        let spiffe_id = e.spiffe_id.parse().map_err(|err| {
            CallError::invalid_answer(format!("entry {}: SPIFFE ID: {err}", e.id))
        })?;
        let federates_with = e
            .federates_with
            .iter()
            .map(|td| {
                TrustDomain::new(td).map_err(|err| {
                    CallError::invalid_answer(format!("entry {}: federates with: {err}", e.id))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Entry {
            federates_with,
            id: e.id,
            spiffe_id,
            parent_id: e.parent_id,
            selectors: e.selectors,
            ttl: Duration::from_secs(u64::try_from(e.ttl_seconds).unwrap_or(0)),
            dns_names: e.dns_names,
            revision: e.revision,
        })
    }
}

fn entries_update(resp: pb::SyncEntriesResponse) -> EntriesUpdate {
    if resp.unchanged {
        return EntriesUpdate::Unchanged;
    }
    let entries = resp
        .entries
        .into_iter()
        .filter_map(|e| match Entry::try_from(e) {
            Ok(entry) => Some(entry),
            Err(err) => {
                tracing::warn!(error = %err, "skipping a malformed registration entry");
                None
            }
        })
        .collect();
    let federated_bundles = resp
        .federated_bundles
        .into_iter()
        .filter_map(|b| match TrustDomain::new(&b.trust_domain) {
            Ok(trust_domain) => Some(FederatedBundle {
                trust_domain,
                x509_authorities: b.x509_authorities,
                jwt_authorities: crate::ca::federated_jwt_keys(b.jwt_authorities),
                sequence: b.sequence,
            }),
            Err(err) => {
                tracing::warn!(error = %err, "skipping a federated bundle of a malformed trust domain");
                None
            }
        })
        .collect();
    EntriesUpdate::Changed {
        revision: resp.revision,
        entries,
        federated_bundles,
    }
}

/// A failed per-item result: its code, message and the entry's retry hint (capped as a call's).
fn item_error(code: i32, message: String, retry_after_ms: u32) -> CallError {
    let pushback = (retry_after_ms > 0)
        .then(|| Duration::from_millis(u64::from(retry_after_ms)).min(crate::status::MAX_PUSHBACK));
    CallError::Status {
        code: tonic::Code::from_i32(code),
        message,
        pushback,
    }
}

/// A minted token as the answer names it; one that is not a token for a SPIFFE ID with an
/// expiry after its issue time, or that names no key, is an invalid answer.
fn minted_jwt(s: signet_proto::ca::JwtSvid) -> Result<MintedJwt, CallError> {
    if s.token.is_empty() {
        return Err(CallError::invalid_answer("JWT-SVID without a token"));
    }
    let spiffe_id = s.spiffe_id.parse().map_err(|e| {
        CallError::invalid_answer(format!(
            "JWT-SVID SPIFFE ID {}: {e}",
            signet_types::untrusted::shown(&s.spiffe_id)
        ))
    })?;
    if s.expires_at <= s.issued_at {
        return Err(CallError::invalid_answer(
            "JWT-SVID that expires before it is issued",
        ));
    }
    if s.key_id.is_empty() {
        return Err(CallError::invalid_answer("JWT-SVID without a key ID"));
    }
    Ok(MintedJwt {
        token: s.token,
        spiffe_id,
        issued_at: s.issued_at,
        expires_at: s.expires_at,
        key_id: s.key_id,
        audience: s.audience,
    })
}

fn jwt_results(resp: pb::MintWorkloadJwtsResponse) -> JwtResults {
    resp.results
        .into_iter()
        .map(|r| {
            let result = if r.code == 0 {
                r.svid
                    .ok_or_else(|| CallError::invalid_answer("success without a JWT-SVID"))
                    .and_then(minted_jwt)
            } else {
                Err(item_error(r.code, r.message, r.retry_after_ms))
            };
            (r.entry_id, result)
        })
        .collect()
}

fn sign_results(resp: pb::SignWorkloadsResponse) -> WorkloadResults {
    resp.results
        .into_iter()
        .map(|r| {
            let result = if r.code == 0 {
                r.svid
                    .ok_or_else(|| CallError::invalid_answer("success without a certificate"))
                    .and_then(svid)
            } else {
                // The entry's retry hint, as a whole call's `grpc-retry-pushback-ms` is read.
                Err(item_error(r.code, r.message, r.retry_after_ms))
            };
            (r.entry_id, result)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;
    use crate::convert::test_certs::{leaf, root};

    const NODE: &str = "spiffe://example.org/signet/node/n1";

    fn pb_svid() -> pb::Svid {
        let ca = root();
        pb::Svid {
            spiffe_id: NODE.into(),
            cert_chain: vec![leaf(&ca, NODE), ca.der],
            serial: "01".into(),
            not_before: 1000,
            not_after: 2000,
        }
    }

    #[test]
    fn svid_conversion_checks_the_certificate_against_the_answer() {
        let s = svid(pb_svid()).expect("valid");
        assert_eq!(s.spiffe_id().to_string(), NODE);
        assert_eq!(s.chain_der().len(), 2, "the chain as the server sent it");
        for bad in [
            pb::Svid {
                cert_chain: vec![],
                ..pb_svid()
            },
            pb::Svid {
                cert_chain: vec![b"garbage".to_vec()],
                ..pb_svid()
            },
            pb::Svid {
                spiffe_id: "http://x".into(),
                ..pb_svid()
            },
            pb::Svid {
                spiffe_id: "spiffe://example.org/signet/node/n2".into(),
                ..pb_svid()
            },
        ] {
            let e = svid(bad.clone()).expect_err("malformed");
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{bad:?}: {e:?}");
        }
    }

    #[test]
    fn an_attestation_answer_needs_a_certificate() {
        let a = attested(pb::AttestResponse {
            node_id: "n1".into(),
            svid: Some(pb_svid()),
            bundle: vec![vec![9]],
        })
        .expect("valid");
        assert_eq!((a.node_id.as_str(), a.bundle_der.len()), ("n1", 1));
        let e = attested(pb::AttestResponse {
            node_id: "n1".into(),
            svid: None,
            bundle: vec![],
        })
        .expect_err("no certificate");
        assert!(e.to_string().contains("without a certificate"), "{e}");
    }

    #[test]
    fn entries_keep_their_selectors_and_skip_a_malformed_id() {
        let e = pb::Entry {
            id: "e1".into(),
            spiffe_id: "spiffe://example.org/web".into(),
            parent_id: NODE.into(),
            selectors: vec!["unix:uid:33".into(), "docker:label:x".into()],
            ttl_seconds: 3600,
            dns_names: vec!["web.local".into()],
            revision: 7,
            jwt_ttl_seconds: 0,
            federates_with: vec!["partner.example".into()],
        };
        let entry = Entry::try_from(e.clone()).expect("valid");
        assert_eq!(entry.selectors, ["unix:uid:33", "docker:label:x"]);
        assert_eq!(entry.ttl, Duration::from_secs(3600));
        let negative = Entry::try_from(pb::Entry {
            ttl_seconds: -5,
            ..e.clone()
        })
        .expect("valid");
        assert_eq!(negative.ttl, Duration::ZERO);
        let bad = pb::Entry {
            id: "e0".into(),
            spiffe_id: "not an id".into(),
            ..e.clone()
        };
        assert!(
            Entry::try_from(bad.clone())
                .unwrap_err()
                .to_string()
                .contains("e0")
        );
        let bad_td = pb::Entry {
            id: "e2".into(),
            federates_with: vec!["Not A Domain!".into()],
            ..e.clone()
        };
        assert!(
            Entry::try_from(bad_td.clone())
                .unwrap_err()
                .to_string()
                .contains("e2: federates with")
        );
        let bundle = |td: &str| pb::FederatedBundle {
            trust_domain: td.into(),
            x509_authorities: vec![vec![0x30]],
            jwt_authorities: vec![],
            sequence: 3,
        };
        let update = entries_update(pb::SyncEntriesResponse {
            revision: 9,
            unchanged: false,
            entries: vec![bad, bad_td, e],
            federated_bundles: vec![bundle("partner.example"), bundle("bad domain")],
        });
        let EntriesUpdate::Changed {
            revision,
            entries,
            federated_bundles,
        } = update
        else {
            panic!("changed expected");
        };
        assert_eq!(revision, 9);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].id, "e1");
        assert_eq!(entries[0].federates_with[0].as_str(), "partner.example");
        assert_eq!(
            federated_bundles.len(),
            1,
            "the malformed trust domain is skipped"
        );
        assert_eq!(
            federated_bundles[0].trust_domain.as_str(),
            "partner.example"
        );
        assert_eq!(federated_bundles[0].sequence, 3);
        assert_eq!(
            entries_update(pb::SyncEntriesResponse {
                revision: 9,
                unchanged: true,
                entries: vec![],
                federated_bundles: vec![],
            }),
            EntriesUpdate::Unchanged
        );
    }

    #[test]
    fn a_shed_entry_keeps_the_servers_retry_hint() {
        let shed = |ms: u32| pb::WorkloadResult {
            entry_id: "a".into(),
            svid: None,
            code: tonic::Code::ResourceExhausted as i32,
            message: "rate limit".into(),
            retry_after_ms: ms,
        };
        let out = sign_results(pb::SignWorkloadsResponse {
            results: vec![shed(1500), shed(0), shed(u32::MAX)],
        });
        let e = out[0].1.as_ref().unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert_eq!(e.class(), ErrorClass::Retryable);
        assert_eq!(e.pushback(), Some(Duration::from_millis(1500)));
        // No hint (an older server, or none given), and a hint capped as a call's is.
        assert_eq!(out[1].1.as_ref().unwrap_err().pushback(), None);
        assert_eq!(
            out[2].1.as_ref().unwrap_err().pushback(),
            Some(crate::status::MAX_PUSHBACK)
        );
    }

    #[test]
    fn sign_results_keep_order_and_errors() {
        let out = sign_results(pb::SignWorkloadsResponse {
            results: vec![
                pb::WorkloadResult {
                    entry_id: "a".into(),
                    svid: Some(pb_svid()),
                    code: 0,
                    message: String::new(),
                    retry_after_ms: 0,
                },
                pb::WorkloadResult {
                    entry_id: "b".into(),
                    svid: None,
                    code: tonic::Code::PermissionDenied as i32,
                    message: "not your entry".into(),
                    retry_after_ms: 0,
                },
                pb::WorkloadResult {
                    entry_id: "c".into(),
                    svid: None,
                    code: 0,
                    message: String::new(),
                    retry_after_ms: 0,
                },
                pb::WorkloadResult {
                    entry_id: "d".into(),
                    svid: Some(pb::Svid {
                        cert_chain: vec![b"junk".to_vec()],
                        ..pb_svid()
                    }),
                    code: 0,
                    message: String::new(),
                    retry_after_ms: 0,
                },
            ],
        });
        let ids: Vec<&str> = out.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
        assert!(out[0].1.is_ok());
        let b = out[1].1.as_ref().unwrap_err();
        assert_eq!(
            (b.code(), b.message(), b.class()),
            (
                tonic::Code::PermissionDenied,
                "not your entry",
                ErrorClass::Permanent
            )
        );
        assert!(matches!(&out[2].1, Err(CallError::InvalidAnswer(_))));
        assert!(matches!(&out[3].1, Err(CallError::InvalidAnswer(_))));
    }

    fn pb_jwt(token: &str) -> signet_proto::ca::JwtSvid {
        signet_proto::ca::JwtSvid {
            token: token.into(),
            spiffe_id: "spiffe://example.org/web".into(),
            issued_at: 1000,
            expires_at: 1300,
            key_id: "kid1".into(),
            audience: vec!["aud".into()],
        }
    }

    #[test]
    fn jwt_results_keep_order_check_the_answer_and_hide_the_token() {
        let ok = |svid| pb::WorkloadJwtResult {
            entry_id: "e".into(),
            svid: Some(svid),
            code: 0,
            message: String::new(),
            retry_after_ms: 0,
        };
        let out = jwt_results(pb::MintWorkloadJwtsResponse {
            results: vec![
                ok(pb_jwt("eyJ.secret.sig")),
                pb::WorkloadJwtResult {
                    entry_id: "denied".into(),
                    svid: None,
                    code: tonic::Code::ResourceExhausted as i32,
                    message: "slow down".into(),
                    retry_after_ms: 700,
                },
                ok(pb_jwt("")),
                ok(signet_proto::ca::JwtSvid {
                    spiffe_id: "http://x".into(),
                    ..pb_jwt("t")
                }),
                ok(signet_proto::ca::JwtSvid {
                    expires_at: 1000,
                    ..pb_jwt("t")
                }),
                ok(signet_proto::ca::JwtSvid {
                    key_id: String::new(),
                    ..pb_jwt("t")
                }),
                pb::WorkloadJwtResult {
                    svid: None,
                    ..ok(pb_jwt("t"))
                },
            ],
        });
        assert_eq!(out.len(), 7);
        let minted = out[0].1.as_ref().expect("minted");
        assert_eq!(
            (minted.spiffe_id.to_string().as_str(), minted.expires_at),
            ("spiffe://example.org/web", 1300)
        );
        assert!(!format!("{minted:?}").contains("secret"), "{minted:?}");
        let shed = out[1].1.as_ref().unwrap_err();
        assert_eq!(shed.code(), tonic::Code::ResourceExhausted);
        assert_eq!(shed.pushback(), Some(Duration::from_millis(700)));
        for (_, r) in &out[2..] {
            assert!(matches!(r, Err(CallError::InvalidAnswer(_))), "{r:?}");
        }
    }

    #[test]
    fn the_credential_is_never_shown() {
        assert!(!format!("{:?}", AttestCredential::JoinToken("tok-123".into())).contains("tok"));
        assert!(
            !format!("{:?}", AttestCredential::ServiceAccountToken("eyJ".into())).contains("eyJ")
        );
    }
}
