//! The seam to "the CA the agent talks to": node attestation, node renewal, the node's
//! registration entries, workload signing and the trust bundle stream, as the trait [`Ca`]
//! over domain types. [`GrpcCa`] implements it as a thin adapter over `signet_client`'s typed
//! calls ([`signet_client::node::NodeClient`], its bundle stream from
//! [`signet_client::ca::CaClient`]), which convert and check the protos, once, for every
//! client; tests use fakes. What is the agent's own here: the [`Ca`] trait, its error
//! [`CaError`] (what the loops retry) and [`EntrySpec`], an entry with its selectors parsed into
//! the kinds this agent implements (one it cannot serve is skipped, not fatal).

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use signet_client::CallError;
use signet_client::ClientIdentity;
use signet_client::node::{Entry, NodeClient};
use signet_pki::SvidCertificate;
use signet_types::{SpiffeId, TrustDomain};
use tonic::transport::Channel;

use crate::state::Selector;

pub use signet_client::ca::{
    Crl, MAX_BUNDLE_REVOCATION_ITEMS, MAX_CRL_BYTES, TrustBundle, normalize_key_id,
};
pub use signet_client::node::{
    AttestCredential, Attested, FederatedBundle, JwtRequest, MAX_CSRS_PER_CALL, MintedJwt,
    WorkloadCsr,
};

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
    /// The foreign trust domains whose bundles this entry's workloads receive.
    pub federates_with: Vec<TrustDomain>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntriesUpdate {
    Unchanged,
    Changed {
        revision: u64,
        entries: Vec<EntrySpec>,
        /// One per foreign trust domain the entries federate with, when the server holds it
        /// (the complete current set: a bundle change moves the entry revision).
        federated_bundles: Vec<FederatedBundle>,
    },
}

/// The server's bundle at once, then again on every change; ends or fails when the
/// connection does.
pub type BundleStream = Pin<Box<dyn Stream<Item = Result<TrustBundle, CaError>> + Send>>;

/// The node's entry revision from the server's push stream (`WatchEntries`): at once, on every
/// change, and again at each keep-alive; ends or fails when the connection does. A revision
/// other than the one the agent holds means "sync now" (the entries come from `SyncEntries`).
pub type EntryRevisionStream = Pin<Box<dyn Stream<Item = Result<u64, CaError>> + Send>>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaError {
    /// The CA could not be reached or answered with a transient error: retry with backoff.
    #[error("CA unavailable: {0}")]
    Unavailable(String),
    /// The CA shed the call and said when to come back (`grpc-retry-pushback-ms`, read by
    /// [`signet_client::retry_pushback`]): retry, but not before `retry_after`.
    #[error("CA busy: {message} (retry in {retry_after:?})")]
    Busy {
        message: String,
        retry_after: std::time::Duration,
    },
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
            signet_client::ErrorClass::Retryable => match signet_client::retry_pushback(&s) {
                Some(retry_after) => CaError::Busy {
                    message: s.message().to_owned(),
                    retry_after,
                },
                None => CaError::Unavailable(s.message().to_owned()),
            },
            signet_client::ErrorClass::Permanent | signet_client::ErrorClass::Invalid => {
                CaError::Refused {
                    code: s.code(),
                    message: s.message().to_owned(),
                }
            }
        }
    }
}

impl From<CallError> for CaError {
    /// An error status as [`From<tonic::Status>`], keeping the server's retry pushback
    /// (signet_client has already read `grpc-retry-pushback-ms`, and capped it): a retryable
    /// status with one is `Busy`. An answer `signet_client` refused, or a request it could not
    /// send (a token a header cannot carry), is `Invalid`.
    fn from(e: CallError) -> Self {
        match e {
            CallError::Status {
                code,
                message,
                pushback,
            } => match (signet_client::ErrorClass::of(code), pushback) {
                (signet_client::ErrorClass::Retryable, Some(retry_after)) => CaError::Busy {
                    message,
                    retry_after,
                },
                _ => tonic::Status::new(code, message).into(),
            },
            CallError::InvalidAnswer(m) | CallError::InvalidRequest(m) => CaError::Invalid(m),
        }
    }
}

/// How long the agent waits between two attempts while the server refuses its node as
/// banned (attestation, node renewal, entry sync, signing, the streams): an operator's
/// `signetctl node unban` is picked up within this, and a banned node's agents do not hammer
/// the server.
pub const BANNED_RETRY: Duration = Duration::from_secs(300);

impl CaError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, CaError::Unavailable(_) | CaError::Busy { .. })
    }

    /// The bounded reason label of `signet_agent_server_errors_total` (`banned` for a refusal
    /// of a banned node).
    pub fn reason(&self) -> &'static str {
        match self {
            _ if self.is_banned() => "banned",
            CaError::Unavailable(_) => "unavailable",
            CaError::Busy { .. } => "busy",
            CaError::Refused { .. } => "refused",
            CaError::Invalid(_) => "invalid_answer",
        }
    }

    /// The wait the server asked for before the next attempt, if it said; a refusal of a
    /// banned node waits [`BANNED_RETRY`].
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            CaError::Busy { retry_after, .. } => Some(*retry_after),
            _ if self.is_banned() => Some(BANNED_RETRY),
            _ => None,
        }
    }

    /// Whether the server refused the node as banned: PermissionDenied saying so (the server
    /// answers "node N is banned; …" on every node call, and refuses a banned node's
    /// attestation alike).
    pub fn is_banned(&self) -> bool {
        matches!(self, CaError::Refused { code: tonic::Code::PermissionDenied, message } if message.contains("banned"))
    }

    /// The node ID a ban refusal names ("node N is banned…"), if it names one.
    pub fn banned_node_id(&self) -> Option<&str> {
        let CaError::Refused { message, .. } = self else {
            return None;
        };
        if !self.is_banned() {
            return None;
        }
        let at = message.find("node ")? + "node ".len();
        let id = message[at..].split_whitespace().next()?;
        let id = id.trim_matches(|c: char| matches!(c, '"' | '\'' | '`' | ',' | ';' | ':'));
        (!id.is_empty() && id != "is").then_some(id)
    }

    /// Whether the server could not be reached (or did not answer): not a refusal, not a
    /// pushback.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, CaError::Unavailable(_))
    }
}

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
    /// Mints JWT-SVIDs for entries parented to the node: one result per request, in order.
    /// The default: a CA that mints none.
    async fn mint_workload_jwts(
        &self,
        _reqs: Vec<JwtRequest>,
    ) -> Result<Vec<(String, Result<MintedJwt, CaError>)>, CaError> {
        Err(CaError::Refused {
            code: tonic::Code::Unimplemented,
            message: "this CA does not mint JWT-SVIDs".into(),
        })
    }
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

// --- entries ------------------------------------------------------------------------------

impl TryFrom<Entry> for EntrySpec {
    type Error = CaError;
    fn try_from(e: Entry) -> Result<Self, CaError> {
        let selectors = e
            .selectors
            .iter()
            .map(|s| s.parse::<Selector>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| CaError::Invalid(format!("entry {}: {err}", e.id)))?;
        Ok(EntrySpec {
            id: e.id,
            spiffe_id: e.spiffe_id,
            parent_id: e.parent_id,
            selectors,
            ttl: e.ttl,
            dns_names: e.dns_names,
            revision: e.revision,
            federates_with: e.federates_with,
        })
    }
}

/// The entries this agent can serve. One it cannot (a selector kind it does not implement)
/// is logged and skipped, so it does not keep the others from being served.
pub(crate) fn convert_entries(entries: Vec<Entry>) -> Vec<EntrySpec> {
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

// --- which server ------------------------------------------------------------------------

/// The trust domain whose Signet server (`spiffe://<td>/signet/server`) the agent talks to:
/// `trust_domain` from the configuration; else the one the roots it trusts for the server name
/// (a root Signet generates carries `spiffe://<td>`). Decided at each connection, so an agent
/// whose bootstrap bundle is not there yet keeps retrying instead of exiting.
pub fn expected_trust_domain(
    configured: Option<&TrustDomain>,
    roots_pem: &[u8],
) -> Result<TrustDomain, CaError> {
    signet_client::expected_trust_domain(configured, roots_pem).map_err(|e| {
        CaError::Unavailable(format!(
            "cannot tell the server's trust domain ({e}): set trust_domain in the \
             agent's configuration"
        ))
    })
}

// --- gRPC implementation ----------------------------------------------------------------

/// [`Ca`] over `signet_client`'s typed node calls, and the bundle stream of the CA API on the
/// same connection. Nothing but error and entry mapping happens here.
#[derive(Clone)]
pub struct GrpcCa {
    node: NodeClient,
}

impl GrpcCa {
    /// Connects over TLS to the server at `addr`, which must chain to `bundle_pem` and present
    /// `spiffe://<trust_domain>/signet/server` (checked by `signet_client` during the
    /// handshake, before the join token or anything else is sent); with `identity` (the node
    /// SVID) for mTLS. With `roots`, every handshake of the channel (its reconnections too)
    /// verifies against the roots they hold then, not `bundle_pem`.
    pub async fn connect(
        addr: &str,
        trust_domain: Option<&TrustDomain>,
        bundle_pem: &[u8],
        roots: Option<std::sync::Arc<signet_client::ServerRoots>>,
        identity: Option<&ClientIdentity>,
    ) -> Result<Self, CaError> {
        let trust_domain = expected_trust_domain(trust_domain, bundle_pem)?;
        let mut target = signet_client::ServerTarget::new(addr, bundle_pem.to_vec(), trust_domain);
        if let Some(r) = roots {
            target = target.with_shared_roots(r);
        }
        let node = NodeClient::connect(&target, identity)
            .await
            .map_err(|e| CaError::Unavailable(e.to_string()))?;
        Ok(Self { node })
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            node: NodeClient::from_channel(channel),
        }
    }
}

#[async_trait::async_trait]
impl Ca for GrpcCa {
    async fn attest(&self, cred: &AttestCredential, csr_der: &[u8]) -> Result<Attested, CaError> {
        Ok(self.node.attest(cred, csr_der).await?)
    }

    async fn renew_node(&self, csr_der: &[u8]) -> Result<SvidCertificate, CaError> {
        Ok(self.node.renew(csr_der).await?)
    }

    async fn sync_entries(&self, known_revision: u64) -> Result<EntriesUpdate, CaError> {
        Ok(match self.node.sync_entries(known_revision).await? {
            signet_client::node::EntriesUpdate::Unchanged => EntriesUpdate::Unchanged,
            signet_client::node::EntriesUpdate::Changed {
                revision,
                entries,
                federated_bundles,
            } => EntriesUpdate::Changed {
                revision,
                entries: convert_entries(entries),
                federated_bundles,
            },
        })
    }

    async fn sign_workloads(
        &self,
        csrs: Vec<WorkloadCsr>,
    ) -> Result<Vec<(String, Result<SvidCertificate, CaError>)>, CaError> {
        // signet_client sends at most MAX_CSRS_PER_CALL CSRs per call, in several calls.
        let results = self.node.sign_workloads(csrs).await?;
        Ok(results
            .into_iter()
            .map(|(entry_id, r)| (entry_id, r.map_err(CaError::from)))
            .collect())
    }

    async fn mint_workload_jwts(
        &self,
        reqs: Vec<JwtRequest>,
    ) -> Result<Vec<(String, Result<MintedJwt, CaError>)>, CaError> {
        let results = self.node.mint_workload_jwts(&reqs).await?;
        Ok(results
            .into_iter()
            .map(|(entry_id, r)| (entry_id, r.map_err(CaError::from)))
            .collect())
    }

    async fn watch_bundle(&self) -> Result<BundleStream, CaError> {
        let stream = self.node.ca().watch_bundle(None).await?;
        Ok(Box::pin(stream.map(|item| item.map_err(CaError::from))))
    }

    async fn watch_entries(&self) -> Result<EntryRevisionStream, CaError> {
        let stream = self.node.watch_entries().await?;
        Ok(Box::pin(stream.map(|item| item.map_err(CaError::from))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use crate::testing::TestCa;
    use std::time::SystemTime;

    // The proto conversions (certificates, bundles, per-CSR results) are signet-client's and
    // tested there (`signet_client::node` and `::ca` tests); here: what the adapter adds.

    #[test]
    fn a_ban_refusal_is_recognised_and_waits_long() {
        let refused = |code, message: &str| CaError::Refused {
            code,
            message: message.into(),
        };
        let sync = refused(
            tonic::Code::PermissionDenied,
            "node n1 is banned; it can renew nothing and sign nothing",
        );
        assert!(sync.is_banned());
        assert_eq!(sync.banned_node_id(), Some("n1"));
        assert_eq!(sync.retry_after(), Some(BANNED_RETRY));
        let attest = refused(
            tonic::Code::PermissionDenied,
            "attestation refused: node \"web-1\" is banned",
        );
        assert_eq!(attest.banned_node_id(), Some("web-1"));
        assert_eq!(
            refused(tonic::Code::PermissionDenied, "this node is banned").banned_node_id(),
            None,
            "the caller falls back to its own ID only when none is named"
        );
        // Other refusals and errors are not bans.
        for e in [
            refused(
                tonic::Code::PermissionDenied,
                "not a member of node set k8s",
            ),
            refused(tonic::Code::InvalidArgument, "banned word in a selector"),
            CaError::Unavailable("node n1 is banned".into()),
        ] {
            assert!(!e.is_banned(), "{e}");
            assert_eq!(e.banned_node_id(), None);
        }
        assert!(CaError::Unavailable("down".into()).is_unreachable());
        assert!(!sync.is_unreachable());
    }

    /// A node SVID valid from 1000 s to 2000 s after the epoch, chain leaf then root.
    fn node_svid() -> SvidCertificate {
        let ca = TestCa::new("ca");
        let (leaf, _) = ca.leaf(
            "spiffe://example.org/signet/node/n1",
            1,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
            Duration::from_secs(1000),
        );
        SvidCertificate::from_chain_der(vec![leaf, ca.der]).expect("svid")
    }

    fn entry(id: &str, selectors: &[&str]) -> Entry {
        Entry {
            id: id.into(),
            spiffe_id: "spiffe://example.org/web".parse().expect("id"),
            parent_id: "spiffe://example.org/signet/node/n1".into(),
            selectors: selectors.iter().map(|s| (*s).to_owned()).collect(),
            ttl: Duration::from_secs(3600),
            dns_names: vec!["web.local".into()],
            revision: 7,
            federates_with: vec![],
        }
    }

    #[test]
    fn a_shed_call_error_from_signet_client_keeps_its_pushback() {
        let status = |code, pushback| CallError::Status {
            code,
            message: "busy".into(),
            pushback,
        };
        let wait = Duration::from_millis(1500);
        let e = CaError::from(status(tonic::Code::ResourceExhausted, Some(wait)));
        assert!(matches!(e, CaError::Busy { .. }), "{e:?}");
        assert_eq!(e.retry_after(), Some(wait));
        assert!(e.is_retryable());
        // Retryable without a hint: Unavailable, the agent's own backoff decides.
        let e = CaError::from(status(tonic::Code::Unavailable, None));
        assert!(matches!(e, CaError::Unavailable(_)), "{e:?}");
        assert_eq!(e.retry_after(), None);
        // A refusal stays a refusal whatever metadata it carried.
        let e = CaError::from(status(tonic::Code::PermissionDenied, Some(wait)));
        assert!(matches!(e, CaError::Refused { .. }), "{e:?}");
        assert!(!e.is_retryable());
    }

    #[test]
    fn entry_conversion_parses_selectors() {
        let e = entry("e1", &["unix:uid:33", "unix:path:/usr/bin/web"]);
        let spec = EntrySpec::try_from(e.clone()).expect("valid");
        assert_eq!(spec.selectors.len(), 2);
        assert_eq!(spec.ttl, Duration::from_secs(3600));
        assert_eq!((spec.spiffe_id, spec.revision), (e.spiffe_id, 7));
        let bad = entry("e1", &["docker:label:x"]);
        let err = EntrySpec::try_from(bad.clone()).expect_err("unsupported selector");
        assert!(err.to_string().contains("e1"), "{err}");
        // In a sync, the entry the agent cannot serve is skipped, not fatal.
        let good = entry("e2", &["unix:uid:1"]);
        let kept = convert_entries(vec![bad, good]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].id, "e2");
    }

    #[test]
    fn client_errors_keep_their_meaning_for_the_loops() {
        let retry = CaError::from(CallError::status(tonic::Code::Unavailable, "down"));
        assert_eq!(retry, CaError::Unavailable("down".into()));
        assert!(CaError::from(CallError::status(tonic::Code::Unauthenticated, "")).is_retryable());
        let refused = CaError::from(CallError::status(tonic::Code::PermissionDenied, "banned"));
        assert_eq!(
            refused,
            CaError::Refused {
                code: tonic::Code::PermissionDenied,
                message: "banned".into()
            }
        );
        // What signet-client refused to take from an answer is an invalid answer, not retried
        // as if the server were down.
        let invalid = CaError::from(CallError::InvalidAnswer("not an X509-SVID".into()));
        assert_eq!(invalid, CaError::Invalid("not an X509-SVID".into()));
        assert!(!invalid.is_retryable());
        assert!(matches!(
            CaError::from(CallError::InvalidRequest("token".into())),
            CaError::Invalid(_)
        ));
    }

    #[test]
    fn status_mapping_separates_transient_from_refusal() {
        assert!(CaError::from(tonic::Status::unavailable("down")).is_retryable());
        assert!(!CaError::from(tonic::Status::permission_denied("banned")).is_retryable());
        assert!(!format!("{:?}", AttestCredential::JoinToken("tok-123".into())).contains("tok"));
    }

    #[test]
    fn a_shed_call_keeps_the_servers_pushback() {
        let mut shed = tonic::Status::resource_exhausted("too many certificate requests");
        shed.metadata_mut()
            .insert("grpc-retry-pushback-ms", "1500".parse().expect("ascii"));
        let e = CaError::from(shed);
        assert!(e.is_retryable());
        assert_eq!(
            e.retry_after(),
            Some(std::time::Duration::from_millis(1500))
        );
        assert!(
            e.to_string().contains("too many certificate requests"),
            "{e}"
        );
        // Without the hint: transient, no wait imposed.
        let e = CaError::from(tonic::Status::resource_exhausted("busy"));
        assert!(matches!(e, CaError::Unavailable(_)));
        assert_eq!(e.retry_after(), None);
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
                svid: node_svid(),
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
                    federated_bundles: vec![],
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
                .map(|c| (c.entry_id, Ok(node_svid())))
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
