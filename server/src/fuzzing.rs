//! Fuzz target bodies (`fuzz/`, cargo-fuzz) for every parser of hostile input in the server.
//!
//! Each function takes arbitrary bytes, must never panic, and asserts the properties its parser
//! promises. The fuzzer (`fuzz/fuzz_targets/<name>.rs`) and the replay test below call the same
//! function, so a fixed crash stays fixed: the test feeds every file of `fuzz/corpus/<name>` and
//! `fuzz/regressions/<name>` through it. Private parsers are reached from here (`pub(crate)`),
//! not through the public API.
//!
//! Longer than most modules (about 940 lines) on purpose: one self-contained body per target,
//! each next to the fixtures it shares with the others, so a target is read in one place.

use std::str::FromStr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use prost::Message;
use signet_types::dns::DnsName;
use signet_types::{SpiffeId, TrustDomain};

use crate::authn::jwt::{self, JwtAuthenticator};
use crate::authn::psat::PsatAttestor;
use crate::authn::{AuthenticatedCaller, CallerKind};
use crate::ca::csr::{KeyAlgorithm, VerifiedCsr};
use crate::ca::serial::SequentialSerials;
use crate::ca::{Authority, IssueError, RequestedNames};
use crate::config::KeyType;
use crate::config::{
    Config, KubernetesAuthConfig, KubernetesBridgeConfig, NodesKubernetesConfig, PolicyConfig,
};
use crate::nodes::{self, JoinToken};
use crate::policy::{GrantSource, IssueRequest, Policy};
use crate::provenance::Source;

/// The fixed clock of the JWT targets (2023-11-14); the corpus tokens are valid around it.
pub const NOW_UNIX: u64 = 1_700_000_000;
/// The trust domain of every target.
pub const TRUST_DOMAIN: &str = "cluster.local";
/// The issuer of the fixed JWKS.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The impersonator the Istio target's policy trusts (ztunnel).
pub const IMPERSONATOR: &str = "spiffe://cluster.local/ns/istio-system/sa/ztunnel";
/// The Kubernetes bridge the policies trust.
pub const BRIDGE: &str = "spiffe://cluster.local/ns/signet-system/sa/signet-k8s";

/// The public keys the JWT target verifies against: an RSA-2048 (`rsa-1`, RS256) and a P-256
/// (`ec-1`, ES256) key, shaped like a cluster's `/openid/v1/jwks`. The private keys were used
/// once to sign the corpus tokens and are not kept.
pub const JWKS: &str = include_str!("fuzzing_jwks.json");

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW_UNIX)
}

fn td() -> TrustDomain {
    TrustDomain::new(TRUST_DOMAIN).expect("fixed trust domain")
}

fn id(s: &str) -> SpiffeId {
    s.parse().expect("fixed SPIFFE ID")
}

fn utf8(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// `/ns/<namespace>/sa/<name>` with a DNS-1123 label namespace and a DNS-1123 subdomain name:
/// the only identities a service-account caller, an impersonated workload or a bridge object may
/// end up with.
fn is_workload_id(id: &SpiffeId) -> bool {
    let mut seg = id.segments();
    matches!(
        (seg.next(), seg.next(), seg.next(), seg.next(), seg.next()),
        (Some("ns"), Some(ns), Some("sa"), Some(sa), None)
            if is_k8s_namespace(ns) && is_k8s_service_account(sa)
    )
}

/// A Kubernetes namespace name (DNS-1123 label).
fn is_k8s_namespace(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A Kubernetes service-account name (DNS-1123 subdomain).
fn is_k8s_service_account(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_k8s_namespace)
}

fn under_signet(id: &SpiffeId) -> bool {
    id.path() == "/signet" || id.path().starts_with("/signet/")
}

// ---- 1. CSR ----------------------------------------------------------------------------

/// `VerifiedCsr::parse`, PEM and DER. An accepted CSR carries a key Signet signs, and the DER
/// form of an accepted request parses the same when wrapped in PEM.
pub fn csr(data: &[u8]) {
    let Ok(csr) = VerifiedCsr::parse(data) else {
        return;
    };
    // Read by signet-pki, which refuses bytes after it: exactly one SubjectPublicKeyInfo, of
    // a key type a JWK set (the bundle) can carry.
    signet_pki::bundle::spki_jwk(csr.public_key_der())
        .expect("an accepted CSR's key is exactly one SubjectPublicKeyInfo");
    if let KeyAlgorithm::Rsa(bits) = csr.key_algorithm() {
        assert!((2048..=8192).contains(&bits), "RSA-{bits} accepted");
    }
    let _ = format!("{csr:?} {}", csr.key_algorithm());
    issue_for(&csr);
    if data.first() == Some(&0x30) {
        let pem = ::pem::encode(&::pem::Pem::new("CERTIFICATE REQUEST", data.to_vec()));
        if pem.len() <= crate::ca::csr::MAX_CSR_BYTES {
            let again = VerifiedCsr::parse(pem.as_bytes()).expect("the PEM form parses too");
            assert_eq!(again.public_key_der(), csr.public_key_der());
            assert_eq!(again.requested(), csr.requested());
            assert_eq!(again.key_algorithm(), csr.key_algorithm());
        }
    }
}

/// The CA every fuzzed issuance signs with: a fixed P-256 root, made once.
fn authority() -> &'static Authority {
    static CA: OnceLock<Authority> = OnceLock::new();
    CA.get_or_init(|| {
        Authority::generate_root(
            &td(),
            KeyType::EcdsaP256,
            now() - Duration::from_secs(60),
            Duration::from_secs(365 * 86400),
            &SequentialSerials::new(1),
        )
        .expect("fixed root")
        .0
    })
}

/// The policy the CSR target's grants come from: no templates, no server names.
fn operator_policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| {
        Policy::new(
            td(),
            Duration::from_secs(3600),
            Duration::from_secs(86400),
            &PolicyConfig::default(),
        )
        .expect("the default policy is valid")
    })
}

/// An accepted CSR goes through the CA core as the issuer would send it: for a grant of a
/// workload identity and the CSR's valid DNS names, as the operator's grant. The core signs it (and its self-check
/// passes), or refuses it as not granted; nothing in a CSR makes it fail otherwise.
fn issue_for(csr: &VerifiedCsr) {
    let names = RequestedNames {
        uris: vec!["spiffe://cluster.local/ns/default/sa/web".into()],
        dns_names: csr
            .requested()
            .dns_names
            .iter()
            .filter(|d| DnsName::is_valid(d))
            .take(4)
            .cloned()
            .collect(),
        ..RequestedNames::default()
    };
    let ask = IssueRequest {
        source: GrantSource::Caller,
        names: &names,
        ttl_seconds: 3600,
        impersonate: None,
        renewal: None,
    };
    let grant = operator_policy()
        .decide(
            &AuthenticatedCaller::admin(&td(), crate::authn::AdminSocket::for_fuzzing()),
            &ask,
            NOW_UNIX as i64,
        )
        .expect("the operator may have a workload ID with valid DNS names");
    match authority().issue(csr, &grant, now(), &SequentialSerials::new(1000)) {
        Ok(cert) => {
            assert_eq!(cert.spiffe_id, *grant.spiffe_id());
            assert_eq!(cert.dns_names, grant.dns_names());
            assert!(cert.ip_addresses.is_empty());
            assert_eq!(cert.chain.first(), Some(&cert.der));
            let parsed =
                signet_pki::ParsedCert::from_der(&cert.der).expect("an issued certificate parses");
            assert_eq!(parsed.spki_der(), csr.public_key_der(), "the CSR's key");
        }
        Err(IssueError::NotGranted(_)) => {}
        Err(e) => panic!("issuing for an accepted CSR failed: {e}"),
    }
}

/// `authn::mtls::authenticate_peer` over a client certificate (DER): the TLS layer has verified
/// the chain, so the bytes are CA-signed, but the names in them came from a caller's request.
/// An accepted leaf yields one SPIFFE ID of the trust domain with a path; a node SVID, and only
/// a node SVID, makes a node caller.
pub fn mtls_peer(data: &[u8]) {
    let Ok(caller) = crate::authn::mtls::authenticate_peer(data, &td()) else {
        return;
    };
    let id = caller.spiffe_id();
    assert!(id.is_member_of(&td()) && !id.path().is_empty());
    match caller.kind() {
        CallerKind::Node {
            node_id, serial, ..
        } => {
            assert_eq!(nodes::node_id_of(id, &td()), Some(node_id.as_str()));
            assert!(serial.is_some());
        }
        CallerKind::Mtls { leaf_sha256, .. } => {
            assert!(nodes::node_id_of(id, &td()).is_none());
            assert_eq!(leaf_sha256, &signet_types::ledger::sha256(data));
        }
        other => panic!("a client certificate made a {other:?} caller"),
    }
}

// ---- 3. JWT and JWKS ----------------------------------------------------------------------

fn auth_config() -> KubernetesAuthConfig {
    KubernetesAuthConfig {
        issuer: ISSUER.into(),
        jwks_file: "/dev/null".into(),
        audiences: vec!["istio-ca".into(), "signet".into()],
        leeway: Duration::from_secs(30),
        jwks_refresh: Duration::from_secs(10),
    }
}

const NODE_AUDIENCES: &[&str] = &["signet-node"];

fn authenticator() -> &'static JwtAuthenticator {
    static AUTH: OnceLock<JwtAuthenticator> = OnceLock::new();
    AUTH.get_or_init(|| JwtAuthenticator::new(&auth_config(), JWKS, td()).expect("fixed JWKS"))
}

fn psat() -> &'static PsatAttestor {
    static PSAT: OnceLock<PsatAttestor> = OnceLock::new();
    PSAT.get_or_init(|| {
        PsatAttestor::new(&NodesKubernetesConfig {
            allowed_service_accounts: vec!["signet-system:signet-agent".into()],
            audiences: NODE_AUDIENCES.iter().map(|s| (*s).to_owned()).collect(),
            cluster: None,
        })
    })
}

/// What every accepted service-account token must give: its own workload identity.
fn check_verified(token: &jwt::VerifiedToken) {
    let caller = &token.caller;
    let CallerKind::KubernetesServiceAccount {
        namespace,
        service_account,
        node,
        ..
    } = caller.kind()
    else {
        panic!(
            "a token authenticates a service account, got {:?}",
            caller.kind()
        );
    };
    assert_eq!(
        caller.spiffe_id().path(),
        format!("/ns/{namespace}/sa/{service_account}"),
        "the identity is the token's service account"
    );
    assert!(caller.spiffe_id().is_member_of(&td()));
    assert!(!under_signet(caller.spiffe_id()));
    assert_eq!(node, &token.node_name);
    if let Ok(n) = psat().node_for(token) {
        nodes::validate_node_id(&n.node_id).expect("a PSAT node ID is a valid node ID");
        let node_id = nodes::node_spiffe_id(&td(), &n.node_id).expect("node SPIFFE ID");
        assert_eq!(nodes::node_id_of(&node_id, &td()), Some(n.node_id.as_str()));
    }
}

/// The service-account token authenticator against the fixed JWKS and clock. The first byte
/// picks what the rest is:
/// - `0`: an `authorization` header value: `bearer_token`, then `authenticate` (workload and
///   node audiences). Only the corpus's genuine tokens can pass.
/// - `1`: the claims JSON of a token whose signature verified: the claim checks and the PSAT
///   node derivation; an accepted token yields its own `/ns/<ns>/sa/<sa>`.
/// - otherwise: `<header JSON>\n<payload JSON>`, sent with a bogus signature: never accepted.
pub fn jwt(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let auth = authenticator();
    let node_audiences: Vec<String> = NODE_AUDIENCES.iter().map(|s| (*s).to_owned()).collect();
    match mode {
        0 => {
            let Some(header) = utf8(rest) else {
                return;
            };
            let Ok(token) = crate::api::bearer::bearer_token(header) else {
                return;
            };
            assert!(!token.is_empty() && !token.contains(char::is_whitespace));
            if let Ok(caller) = auth.authenticate(token, now()) {
                check_verified(&jwt::VerifiedToken {
                    node_name: match caller.kind() {
                        CallerKind::KubernetesServiceAccount { node, .. } => node.clone(),
                        _ => None,
                    },
                    caller,
                });
            }
            if let Ok(t) = auth.authenticate_node_token(token, now(), &node_audiences) {
                check_verified(&t);
            }
        }
        1 => {
            if let Ok(t) = auth.verify_claims_json(rest, now(), &node_audiences) {
                check_verified(&t);
            }
            if let Ok(t) = auth.verify_claims_json(rest, now(), &auth_config().audiences) {
                check_verified(&t);
            }
        }
        _ => {
            let (header, payload) = match rest.iter().position(|b| *b == b'\n') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &b"{}"[..]),
            };
            let token = format!(
                "{}.{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(payload),
                URL_SAFE_NO_PAD.encode([0x30u8; 64])
            );
            let refused = auth.authenticate(&token, now());
            assert!(
                refused.is_err(),
                "a token with a bogus signature was accepted"
            );
            if let Err(e) = refused {
                assert!(
                    !e.to_string().contains(&token),
                    "the error repeats the token"
                );
            }
        }
    }
}

/// `JwtAuthenticator::new` over a JWKS document: refuses or builds, never panics; a built
/// authenticator refuses a garbage token.
pub fn jwks(data: &[u8]) {
    let Some(text) = utf8(data) else {
        return;
    };
    if let Ok(auth) = JwtAuthenticator::new(&auth_config(), text, td()) {
        let _ = format!("{auth:?}");
        assert!(
            auth.authenticate("eyJhbGciOiJFUzI1NiJ9.e30.AAAA", now())
                .is_err()
        );
    }
}

// ---- 5. Config -----------------------------------------------------------------------------

/// The server's TOML configuration, loaded as `Config::load` does (defaults, then the file)
/// and validated; a valid configuration must also give a valid policy, as at start-up.
pub fn config(data: &[u8]) {
    let Some(text) = utf8(data) else {
        return;
    };
    let loaded: Result<Config, _> = Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(text))
        .extract();
    let Ok(cfg) = loaded else {
        return;
    };
    if cfg.validate().is_err() {
        return;
    }
    let td = TrustDomain::new(&cfg.trust_domain).expect("validate checked the trust domain");
    if let Ok(p) = Policy::new(td, cfg.ca.default_ttl, cfg.ca.max_ttl, &cfg.policy) {
        let _ = p.with_server_names(cfg.server_names.clone(), Vec::new());
    }
    let _ = format!("{cfg:?}");
}

// ---- 6. Istio and native/node requests ------------------------------------------------

fn istio_policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| {
        Policy::new(
            td(),
            Duration::from_secs(3600),
            Duration::from_secs(86400),
            &PolicyConfig {
                kubernetes_dns_templates: vec!["{serviceaccount}.{namespace}.svc".into()],
                impersonators: vec![IMPERSONATOR.into()],
                kubernetes_bridge: KubernetesBridgeConfig {
                    callers: vec![BRIDGE.into()],
                    ..KubernetesBridgeConfig::default()
                },
                ..PolicyConfig::default()
            },
        )
        .expect("fixed policy")
        .with_server_names(vec!["signet.signet-system.svc".into()], Vec::new())
    })
}

/// Names a decoded request's CSR asks for, as the issuer would see them (empty if it does not
/// parse).
fn csr_names(csr: &[u8]) -> RequestedNames {
    VerifiedCsr::parse(csr)
        .map(|c| c.requested().clone())
        .unwrap_or_default()
}

/// `IstioCertificateRequest` decoding, the `ImpersonatedIdentity` metadata, and the policy
/// decision for the trusted impersonator (ztunnel) over it: impersonation only ever yields an
/// ordinary workload identity, never one of Signet's own, the impersonator's or the bridge's.
pub fn istio(data: &[u8]) {
    use signet_proto::istio_ca::IstioCertificateRequest;
    let Ok(req) = IstioCertificateRequest::decode(data) else {
        return;
    };
    let Ok(impersonate) = crate::api::istio::impersonated(req.metadata.as_ref()) else {
        return;
    };
    let names = csr_names(req.csr.as_bytes());
    let policy = istio_policy();
    let impersonator = AuthenticatedCaller::new(
        id(IMPERSONATOR),
        CallerKind::KubernetesServiceAccount {
            namespace: "istio-system".into(),
            service_account: "ztunnel".into(),
            pod: Some("ztunnel-x1".into()),
            node: Some("node-a".into()),
        },
    );
    let now = NOW_UNIX as i64;
    let ask = IssueRequest {
        source: GrantSource::Caller,
        names: &names,
        ttl_seconds: req.validity_duration,
        impersonate,
        renewal: None,
    };
    if let Ok(grant) = policy.decide(&impersonator, &ask, now)
        && impersonate.is_some()
    {
        let got = grant.spiffe_id();
        assert!(is_workload_id(got), "impersonation yielded {got}");
        assert!(!under_signet(got));
        assert_ne!(got, &id(IMPERSONATOR), "the impersonator's own identity");
        assert_ne!(got, &id(BRIDGE), "the bridge's identity");
        assert!(
            !grant
                .dns_names()
                .iter()
                .any(|n| n == "signet.signet-system.svc"),
            "the server's own name"
        );
    }
    // Any other caller asking on someone's behalf is refused.
    let workload = AuthenticatedCaller::new(
        id("spiffe://cluster.local/ns/default/sa/web"),
        CallerKind::KubernetesServiceAccount {
            namespace: "default".into(),
            service_account: "web".into(),
            pod: None,
            node: None,
        },
    );
    if let Ok(grant) = policy.decide(&workload, &ask, now) {
        assert_eq!(
            grant.spiffe_id(),
            workload.spiffe_id(),
            "a workload got another ID"
        );
    }
}

/// Prost decoding of the native CA API's and the node API's requests (the first byte picks
/// the message), then the checks the edge runs on their fields.
pub fn grpc_requests(data: &[u8]) {
    use signet_proto::agent as pb_agent;
    use signet_proto::ca as pb_ca;
    let Some((&which, msg)) = data.split_first() else {
        return;
    };
    match which % 7 {
        0 => {
            if let Ok(r) = pb_ca::SignCsrRequest::decode(msg) {
                let _ = VerifiedCsr::parse(&r.csr);
                if !r.kubernetes_namespace.is_empty() {
                    bridge_decision(&r.kubernetes_namespace, &csr_names(&r.csr), r.ttl_seconds);
                }
            }
        }
        1 => {
            let _ = pb_ca::GetBundleRequest::decode(msg);
        }
        2 => {
            let _ = pb_ca::WatchBundleRequest::decode(msg);
        }
        3 => {
            if let Ok(r) = pb_agent::AttestRequest::decode(msg) {
                if let Ok(t) = JoinToken::parse(&r.join_token) {
                    assert!(!format!("{t:?}").contains(t.expose()));
                }
                let _ = VerifiedCsr::parse(&r.csr);
            }
        }
        4 => {
            if let Ok(r) = pb_agent::RenewNodeRequest::decode(msg) {
                let _ = VerifiedCsr::parse(&r.csr);
            }
        }
        5 => {
            let _ = pb_agent::SyncEntriesRequest::decode(msg);
        }
        _ => {
            if let Ok(r) = pb_agent::SignWorkloadsRequest::decode(msg) {
                for c in r.csrs.iter().take(4) {
                    let _ = VerifiedCsr::parse(&c.csr);
                }
            }
        }
    }
}

/// The bridge asking for an object in `namespace`: only that namespace's workload identities
/// and names its templates give.
fn bridge_decision(namespace: &str, names: &RequestedNames, ttl: i64) {
    let bridge = AuthenticatedCaller::new(
        id(BRIDGE),
        CallerKind::KubernetesServiceAccount {
            namespace: "signet-system".into(),
            service_account: "signet-k8s".into(),
            pod: None,
            node: None,
        },
    );
    let ask = IssueRequest {
        source: GrantSource::Bridge { namespace },
        names,
        ttl_seconds: ttl,
        impersonate: None,
        renewal: None,
    };
    if let Ok(grant) = istio_policy().decide(&bridge, &ask, NOW_UNIX as i64) {
        let got = grant.spiffe_id();
        assert!(!under_signet(got), "the bridge obtained {got}");
        assert!(
            got.path().starts_with(&format!("/ns/{namespace}/")),
            "the bridge obtained {got} for namespace {namespace}"
        );
        for name in grant.dns_names() {
            assert_ne!(name, "signet.signet-system.svc", "the server's own name");
        }
    }
}

// ---- Renewal over mTLS from a ledger row -----------------------------------------------

fn take_i64(data: &mut &[u8]) -> i64 {
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    i64::from_le_bytes(b)
}

fn list(line: &str) -> Vec<String> {
    line.split(',')
        .filter(|s| !s.is_empty())
        .take(8)
        .map(str::to_owned)
        .collect()
}

/// `policy::renewal::assess`: what an mTLS caller may renew its presented certificate into,
/// from its ledger row as the database returns it (anyone with database access can write one)
/// and the entry and node as they are now. Input: `not_before`, `not_after`, `now`, the entry's
/// TTL (8 bytes each, little endian), a flag byte (revoked, entry present, node present, node
/// banned, another certificate's hash, another identity's row), then lines: the provenance
/// text, the caller's path, the row's DNS names, the entry's ID, SPIFFE ID, parent and DNS
/// names (comma-separated). A basis only ever comes from a live, renewable source, and never
/// widens the names or the lifetime that source allows.
pub fn renewal(data: &[u8]) {
    use crate::policy::renewal::{self, EntryFacts};
    use crate::store::LedgerRecord;
    use crate::store::nodes::{EntryRow, NodeRow};
    let mut rest = data;
    let not_before = take_i64(&mut rest);
    let not_after = take_i64(&mut rest);
    let now = take_i64(&mut rest);
    let entry_ttl = take_i64(&mut rest);
    let flags = rest.first().copied().unwrap_or(0);
    rest = rest.get(1..).unwrap_or_default();
    let Some(text) = utf8(rest) else {
        return;
    };
    let mut lines = text.split('\n');
    let mut next = || lines.next().unwrap_or("");
    let provenance = next().to_owned();
    let Ok(caller_id) = td().id(next()) else {
        return;
    };
    let row_dns = list(next());
    let (entry_id, entry_spiffe_id, entry_parent) =
        (next().to_owned(), next().to_owned(), next().to_owned());
    let entry_dns = list(next());

    let der = b"presented certificate";
    let sha = signet_types::ledger::sha256(der);
    let caller = AuthenticatedCaller::new(
        caller_id.clone(),
        CallerKind::Mtls {
            dns_names: row_dns.clone(),
            serial: "0a1b".into(),
            leaf_sha256: sha,
        },
    );
    let row = LedgerRecord {
        entry: signet_types::ledger::LedgerEntry {
            seq: 1,
            serial: "0a1b".into(),
            spiffe_id: if flags & 32 != 0 {
                "spiffe://cluster.local/ns/other/sa/other".into()
            } else {
                caller_id.to_string()
            },
            dns_names: row_dns.clone(),
            ip_addresses: Vec::new(),
            not_before,
            not_after,
            cert_sha256: if flags & 16 != 0 { [7; 32] } else { sha },
            ca_key_id: "k".into(),
            caller: "c".into(),
            issued_at: not_before,
            request_id: String::new(),
            provenance,
        },
        revocation: (flags & 1 != 0).then(|| signet_types::ledger::Revocation {
            at: now,
            reason: "keyCompromise".into(),
        }),
        prev_hash: [0; 32],
        hash: [0; 32],
        cert_der: der.to_vec(),
    };
    let entry = EntryRow {
        id: entry_id,
        spiffe_id: entry_spiffe_id,
        parent_id: entry_parent,
        selectors: vec!["unix:uid:1000".into()],
        ttl_seconds: entry_ttl,
        dns_names: entry_dns,
        revision: 1,
        created_at: 0,
        jwt_ttl_seconds: 0,
        federates_with: Vec::new(),
        owner: String::new(),
        owner_scope: String::new(),
    };
    let node = NodeRow {
        node_id: "n1".into(),
        spiffe_id: "spiffe://cluster.local/signet/node/n1".into(),
        attested_at: 0,
        banned_at: (flags & 8 != 0).then_some(now),
        last_serial: String::new(),
        not_after,
        attestation: "join_token".into(),
        selectors: vec!["signet:attestation:join_token".into()],
    };
    let facts = EntryFacts {
        entry: (flags & 2 != 0).then_some(&entry),
        node: (flags & 4 != 0).then_some(&node),
        node_set: None,
    };
    let policy = istio_policy();
    let _ = renewal::entry_to_check(&row);
    let Ok(basis) = renewal::assess(policy, &caller, Some(&row), facts, now) else {
        return;
    };
    assert!(
        flags & (1 | 16 | 32) == 0,
        "a revoked, other or foreign row renewed"
    );
    assert_eq!(basis.spiffe_id(), &caller_id);
    assert!(
        basis.dns_names().iter().all(|n| row_dns.contains(n)),
        "renewal added names"
    );
    let carried = basis.carried_forward();
    let presented = u64::try_from(not_after.saturating_sub(not_before)).unwrap_or(0);
    match &carried.source {
        Source::ServiceAccount {
            namespace,
            service_account,
            ..
        } => {
            assert_eq!(
                caller_id.path(),
                format!("/ns/{namespace}/sa/{service_account}")
            );
            assert!(now.saturating_sub(carried.authorized_at) <= 86400);
            assert!(basis.max_ttl().as_secs() <= presented);
            for n in basis.dns_names() {
                assert!(policy.service_account_may_have(n, namespace, service_account));
            }
        }
        Source::Admin => {
            assert!(now.saturating_sub(carried.authorized_at) <= 86400);
            assert!(basis.max_ttl().as_secs() <= presented);
        }
        Source::Entry { entry_id, node_id } => {
            let e = facts.entry.expect("an entry renewal without its entry");
            let n = facts.node.expect("an entry renewal without its node");
            assert!(n.banned_at.is_none(), "a banned node's workload renewed");
            assert_eq!(&e.id, entry_id);
            assert_eq!(e.spiffe_id, caller_id.to_string());
            let parent = nodes::node_spiffe_id(&td(), node_id).expect("node ID");
            assert_eq!(e.parent_id, parent.to_string());
            for name in basis.dns_names() {
                assert!(
                    e.dns_names.iter().any(|d| d.eq_ignore_ascii_case(name)),
                    "a name the entry no longer has"
                );
            }
            if e.ttl_seconds > 0 {
                assert_eq!(basis.max_ttl().as_secs(), e.ttl_seconds as u64);
            }
            // Carried forward and bounded, like a token's: the chain ages out.
            assert!(now.saturating_sub(carried.authorized_at) <= 86400);
        }
        other => panic!("a {} certificate renewed over mTLS", other.kind()),
    }
}

// ---- 8. DNS templates, node IDs, selectors, join tokens --------------------------------

/// `Policy::new` over fuzzed `kubernetes_dns_templates` and bridge templates, then the policy
/// decision for a fuzzed DNS name, for two service accounts and for the bridge in two
/// namespaces. Input: lines `k8s templates (';'-separated)`, `bridge templates`, `name`,
/// `ns1`, `sa1`, `ns2`, `sa2`. The property: a name never matches two different (valid)
/// namespaces, nor two service accounts when every template names the account, so templates
/// cannot give two workloads the same name unless the operator chose a namespace-wide one.
pub fn dns_templates(data: &[u8]) {
    let Some(text) = utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let mut next = || lines.next().unwrap_or("");
    let k8s: Vec<String> = split_templates(next());
    let bridge: Vec<String> = split_templates(next());
    let name = next().to_owned();
    let (ns1, sa1, ns2, sa2) = (next(), next(), next(), next());

    let _ = DnsName::is_valid(&name);
    let every_template_names_the_account = k8s.iter().all(|t| t.contains("{serviceaccount}"));
    let cfg = PolicyConfig {
        kubernetes_dns_templates: k8s,
        kubernetes_bridge: KubernetesBridgeConfig {
            callers: vec![BRIDGE.into()],
            dns_templates: bridge,
            ..KubernetesBridgeConfig::default()
        },
        ..PolicyConfig::default()
    };
    let Ok(p) = Policy::new(
        td(),
        Duration::from_secs(3600),
        Duration::from_secs(86400),
        &cfg,
    ) else {
        return;
    };
    let names = RequestedNames {
        dns_names: vec![name.clone()],
        ..RequestedNames::default()
    };
    let now = NOW_UNIX as i64;
    let sa_may = |ns: &str, sa: &str| {
        if !is_k8s_namespace(ns) || !is_k8s_service_account(sa) {
            return false;
        }
        let Ok(caller_id) = td().id(&format!("/ns/{ns}/sa/{sa}")) else {
            return false;
        };
        let caller = AuthenticatedCaller::new(
            caller_id,
            CallerKind::KubernetesServiceAccount {
                namespace: ns.into(),
                service_account: sa.into(),
                pod: None,
                node: None,
            },
        );
        let ask = IssueRequest {
            source: GrantSource::Caller,
            names: &names,
            ttl_seconds: 0,
            impersonate: None,
            renewal: None,
        };
        let decided = p.decide(&caller, &ask, now).is_ok();
        assert_eq!(
            decided,
            DnsName::is_valid(&name) && p.service_account_may_have(&name, ns, sa),
            "decide and the template match disagree for {name:?}"
        );
        decided
    };
    // Across namespaces, never; within one namespace a template without {serviceaccount}
    // deliberately gives every service account the same names (the namespace is the
    // boundary), so two accounts may share a name only if such a template is configured.
    if sa_may(ns1, sa1) && sa_may(ns2, sa2) {
        assert_eq!(
            ns1, ns2,
            "{name:?} matches both {ns1}/{sa1} and {ns2}/{sa2}"
        );
        if every_template_names_the_account {
            assert_eq!(
                sa1, sa2,
                "{name:?} matches both {ns1}/{sa1} and {ns2}/{sa2}"
            );
        }
    }
    let bridge_may = |ns: &str| {
        if !is_k8s_namespace(ns) {
            return false;
        }
        let bridge = AuthenticatedCaller::new(
            id(BRIDGE),
            CallerKind::KubernetesServiceAccount {
                namespace: "signet-system".into(),
                service_account: "signet-k8s".into(),
                pod: None,
                node: None,
            },
        );
        let ask = IssueRequest {
            source: GrantSource::Bridge { namespace: ns },
            names: &names,
            ttl_seconds: 0,
            impersonate: None,
            renewal: None,
        };
        p.decide(&bridge, &ask, now).is_ok()
    };
    if bridge_may(ns1) && bridge_may(ns2) {
        assert_eq!(
            ns1, ns2,
            "{name:?} is a bridge name in both {ns1} and {ns2}"
        );
    }
}

fn split_templates(line: &str) -> Vec<String> {
    if line.is_empty() {
        return Vec::new();
    }
    line.split(';').take(8).map(str::to_owned).collect()
}

/// The node API's validators: node IDs (and the node SPIFFE IDs they make), selectors, join
/// tokens (never shown by `Debug`), entry parents and DNS names. Input: one value per line.
pub fn nodes(data: &[u8]) {
    let Some(text) = utf8(data) else {
        return;
    };
    let td = td();
    for line in text.split('\n').take(16) {
        if nodes::validate_node_id(line).is_ok() {
            let node = nodes::node_spiffe_id(&td, line).expect("a valid node ID makes an ID");
            assert_eq!(
                nodes::node_id_of(&node, &td),
                Some(line),
                "node ID round trip"
            );
            assert_eq!(
                nodes::parse_node(&td, &node.to_string()).as_ref(),
                Ok(&node)
            );
            assert_eq!(nodes::parse_node(&td, line).as_ref(), Ok(&node));
            assert_eq!(
                nodes::parse_parent(&td, line),
                Ok(nodes::Parent::Node(node))
            );
        }
        if let Ok(p) = nodes::parse_node(&td, line) {
            assert!(nodes::node_id_of(&p, &td).is_some(), "a node is a node");
        }
        match nodes::parse_parent(&td, line) {
            Ok(nodes::Parent::Node(p)) => {
                assert!(
                    nodes::node_id_of(&p, &td).is_some(),
                    "a parent node is a node"
                );
            }
            Ok(nodes::Parent::NodeSet { name, id }) => {
                assert_eq!(
                    signet_types::node_set::node_set_of(&id, &td),
                    Some(name),
                    "a parent set is a set"
                );
            }
            Err(_) => {}
        }
        let _ = nodes::validate_selector(line);
        if let Ok(t) = JoinToken::parse(line) {
            assert!(
                !format!("{t:?}").contains(t.expose()),
                "Debug shows a token"
            );
            assert_eq!(t.hash().len(), 64);
            assert_eq!(
                JoinToken::parse(t.expose()).map(|t| t.hash()),
                Ok(t.hash()),
                "join token spellings agree"
            );
        } else {
            assert_eq!(
                JoinToken::parse(line).err(),
                JoinToken::parse("").err(),
                "the join-token error depends on the input (it must never repeat it)"
            );
        }
        if DnsName::is_valid(line) {
            assert!(line.len() <= 253 && !line.ends_with('.'));
        }
        if let Ok(id) = SpiffeId::from_str(line) {
            let _ = nodes::node_id_of(&id, &td);
        }
    }
    let lines: Vec<String> = text.split('\n').take(40).map(str::to_owned).collect();
    if let [spiffe_id, parent, rest @ ..] = lines.as_slice() {
        let (selectors, dns): (Vec<String>, Vec<String>) =
            rest.iter().cloned().partition(|l| l.contains(':'));
        if let Ok(e) = nodes::validate_entry(istio_policy(), spiffe_id, parent, &selectors, 0, &dns)
        {
            assert!(!under_signet(&e.spiffe_id), "an entry under /signet/");
            assert!(nodes::node_id_of(&e.parent_id, &td).is_some());
            for s in &e.selectors {
                nodes::validate_selector(s).expect("an entry's selectors are valid");
            }
            for d in &e.dns_names {
                assert!(DnsName::is_valid(d), "an entry's DNS name {d:?}");
                assert!(
                    istio_policy().refuse_server_dns_name(d).is_ok(),
                    "an entry with the server's name {d:?}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use signet_types::fuzzing::replay::{inputs, replay};

    /// The committed corpora and every fixed crash, through the fuzzers' own functions.
    #[test]
    fn fuzz_corpora_replay() {
        replay("csr", super::csr);
        replay("jwt", super::jwt);
        replay("jwks", super::jwks);
        replay("server_config", super::config);
        replay("istio", super::istio);
        replay("grpc_requests", super::grpc_requests);
        replay("dns_templates", super::dns_templates);
        replay("nodes", super::nodes);
        replay("mtls_peer", super::mtls_peer);
        replay("renewal", super::renewal);
    }

    /// The corpus holds genuine tokens for the fixed JWKS, so the fuzzer starts past the
    /// signature check.
    #[test]
    fn jwt_corpus_has_genuine_tokens() {
        let auth = super::authenticator();
        let genuine = inputs("jwt")
            .iter()
            .filter_map(|(_, d)| d.strip_prefix(&[0u8][..]))
            .filter_map(|d| std::str::from_utf8(d).ok())
            .filter_map(|h| crate::api::bearer::bearer_token(h).ok())
            .filter(|t| auth.authenticate(t, super::now()).is_ok())
            .count();
        assert!(genuine >= 2, "{genuine} genuine tokens in fuzz/corpus/jwt");
    }
}
