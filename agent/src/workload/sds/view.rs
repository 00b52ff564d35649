//! What an SDS subscription resolves to, for one caller and one agent state: pure, no I/O, the
//! time passed in.
//!
//! **Names** (SPIRE's, so Envoy and Istio configurations written for SPIRE work unchanged):
//! - `default` ([`SdsNames::svid`]): the caller's first identity (by entry ID), as a
//!   `TlsCertificate` named `default`;
//! - a SPIFFE ID the caller is entitled to: that identity, named by its ID;
//! - `ROOTCA` ([`SdsNames::bundle`]) and `spiffe://<trust domain>`: that trust domain's
//!   validation context (`ROOTCA` is the agent's own);
//! - `ALL` ([`SdsNames::all`]): one validation context with every trust domain the caller
//!   trusts;
//! - no names at all: every identity of the caller (by SPIFFE ID) and every trust domain (by
//!   `spiffe://<td>`).
//!
//! **Federation.** The trust domains a caller trusts are the own one and the foreign ones its
//! identities' entries federate with (SPIRE's rule, [`AgentState::federated_for`]): `ALL`,
//! `spiffe://<foreign td>` and the empty-names case include exactly those. A foreign name the
//! caller is not entitled to is not served, exactly like an unknown one. Foreign trust
//! domains carry no CRLs; `default` and `ROOTCA` stay the own trust domain's. In the
//! `trusted_ca` form a single `spiffe://<foreign td>` is served with that domain's roots, and
//! `ALL` with a federated domain (more than one trust domain) is refused.
//!
//! Every name must be served, or the whole request is refused, naming what was not
//! ([`SdsRefusal::NotServed`]): Envoy then retries, and never waits on a secret that will not
//! come. A caller with no identity gets nothing, not even a bundle (as `FetchX509Bundles`).
//!
//! **Validation contexts** come in two forms ([`Form`]), chosen once per stream from the first
//! request's node as SPIRE chooses: Envoy's SPIFFE certificate validator
//! (`envoy.tls.cert_validator.spiffe`, one trust bundle per trust domain, so a peer is checked
//! against its own trust domain's roots) for Envoy 1.18 and later, unless the node metadata or
//! the configuration says `disable_spiffe_cert_validation`; else `trusted_ca` (the default
//! validator), which cannot keep trust domains apart, so `ALL` with more than one trust domain
//! is refused in that form.
//!
//! **CRLs.** The agent's verified CRLs go with its own trust domain: as `X509 CRL` PEM blocks
//! inside the SPIFFE validator's trust bundle (the only place that validator reads them), or
//! as the default validator's `crl`. Either way Envoy then checks every certificate of a
//! peer's chain (CRL_CHECK_ALL) and refuses a chain one of whose CAs has no CRL, or whose CRL
//! is past its nextUpdate. So the CRLs are sent only when they are **complete** (one for every
//! root of the bundle and every intermediate of the chains the agent holds) and **fresh** (none
//! within [`CRL_MARGIN`] of its nextUpdate); otherwise the context goes without CRLs, and the
//! view says when to look again ([`View::recheck_at`]), so a stream drops CRLs that are about to
//! go stale instead of letting Envoy refuse every handshake.

use std::hash::{Hash, Hasher};
use std::time::{Duration, SystemTime};

use prost::Message;
use prost_types::Any;
use signet_pki::{ParsedCert, ParsedCrl};
use signet_proto::envoy::config::core::v3 as core;
use signet_proto::envoy::extensions::transport_sockets::tls::v3 as tls;

use crate::state::{AgentState, Identity};

/// The type of every resource SDS serves.
pub const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// Envoy's SPIFFE certificate validator.
pub const SPIFFE_VALIDATOR: &str = "envoy.tls.cert_validator.spiffe";
const SPIFFE_VALIDATOR_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig";
/// The node metadata key (bool, or a string "true"/"false") that overrides the configured
/// validator form, as in SPIRE.
pub const DISABLE_SPIFFE_KEY: &str = "disable_spiffe_cert_validation";
/// CRLs are withheld this long before the earliest nextUpdate among them, so Envoy never holds
/// a CRL that goes stale before the next push.
pub const CRL_MARGIN: Duration = Duration::from_secs(60);
/// Resource names one request may carry.
pub const MAX_NAMES: usize = 256;

/// The configured alias names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdsNames {
    pub svid: String,
    pub bundle: String,
    pub all: String,
}

/// How validation contexts are written for one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `custom_validator_config` = Envoy's SPIFFE validator.
    Spiffe,
    /// `trusted_ca` (and `crl`): Envoy's default validator.
    TrustedCa,
}

impl Form {
    /// SPIRE's rule: the SPIFFE validator for an Envoy that reports a build version of 1.18 or
    /// later, unless disabled; the node metadata's `disable_spiffe_cert_validation` (a bool or
    /// "true"/"false") overrides `disabled_by_config`. A node without a build version (not an
    /// Envoy, or one too old to say) gets `trusted_ca`.
    pub fn for_node(node: Option<&core::Node>, disabled_by_config: bool) -> Form {
        use prost_types::value::Kind;
        let override_ = node
            .and_then(|n| n.metadata.as_ref())
            .and_then(|m| m.fields.get(DISABLE_SPIFFE_KEY))
            .and_then(|v| match &v.kind {
                Some(Kind::BoolValue(b)) => Some(*b),
                // The strings Go's strconv.ParseBool takes, as SPIRE reads the key.
                Some(Kind::StringValue(s)) => match s.as_str() {
                    "true" | "True" | "TRUE" | "t" | "T" | "1" => Some(true),
                    "false" | "False" | "FALSE" | "f" | "F" | "0" => Some(false),
                    _ => None,
                },
                _ => None,
            });
        if override_.unwrap_or(disabled_by_config) {
            return Form::TrustedCa;
        }
        let supports = node
            .and_then(|n| match &n.user_agent_version_type {
                Some(core::node::UserAgentVersionType::UserAgentBuildVersion(b)) => {
                    b.version.as_ref()
                }
                _ => None,
            })
            .is_some_and(|v| v.major_number > 1 || (v.major_number == 1 && v.minor_number >= 18));
        if supports {
            Form::Spiffe
        } else {
            Form::TrustedCa
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Form::Spiffe => "spiffe",
            Form::TrustedCa => "trusted_ca",
        }
    }
}

/// One trust domain's roots, as a validation context needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustDomainRoots {
    /// `spiffe://example.org`
    pub id: String,
    /// `example.org`
    pub name: String,
    pub roots_pem: String,
    /// A foreign trust domain's (served only to callers that federate with it).
    pub federated: bool,
}

/// What every stream of one agent state shares: the trust domains' roots and the CRLs, read
/// once per state ([`Prepared::of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The agent's own trust domain first, then the federated ones (sorted by name).
    pub trust_domains: Vec<TrustDomainRoots>,
    /// The agent's CRLs as PEM `X509 CRL` blocks (empty when it holds none).
    pub crls_pem: String,
    pub crls: CrlCover,
}

/// Whether the CRLs may go to Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrlCover {
    /// The agent holds no CRL.
    None,
    /// They do not cover every CA (which one is missing), or one does not parse.
    Incomplete(String),
    /// Complete; usable until the earliest nextUpdate among them (`None`: no CRL has one).
    Complete { next_update: Option<SystemTime> },
}

impl Prepared {
    /// Reads `state`'s bundle and CRLs.
    pub fn of(state: &AgentState) -> Self {
        let mut trust_domains = Vec::new();
        if let Some(name) = state.trust_domain_id.strip_prefix("spiffe://")
            && !state.bundle_der.is_empty()
        {
            trust_domains.push(TrustDomainRoots {
                id: state.trust_domain_id.clone(),
                name: name.to_owned(),
                roots_pem: signet_types::pem::certs_to_pem(
                    state.bundle_der.iter().map(Vec::as_slice),
                ),
                federated: false,
            });
        }
        for b in state.federated.iter() {
            if b.roots_der.is_empty() || b.trust_domain.id_string() == state.trust_domain_id {
                continue;
            }
            trust_domains.push(TrustDomainRoots {
                id: b.trust_domain.id_string(),
                name: b.trust_domain.as_str().to_owned(),
                roots_pem: signet_types::pem::certs_to_pem(b.roots_der.iter().map(Vec::as_slice)),
                federated: true,
            });
        }
        Self {
            trust_domains,
            crls_pem: crate::sinks::crls_to_pem(&state.crls_der),
            crls: crl_cover(state),
        }
    }
}

/// A CA a peer's chain may pass through: its key ID, or its name when it has none.
struct Ca {
    key_id: Option<String>,
    subject: Vec<u8>,
}

fn crl_cover(state: &AgentState) -> CrlCover {
    if state.crls_der.is_empty() {
        return CrlCover::None;
    }
    let mut crls = Vec::with_capacity(state.crls_der.len());
    for der in state.crls_der.iter() {
        match ParsedCrl::from_der(der) {
            Ok(c) => crls.push(c),
            Err(e) => return CrlCover::Incomplete(format!("a CRL does not parse: {e}")),
        }
    }
    let mut cas: Vec<Ca> = Vec::new();
    let chains = state
        .identities
        .iter()
        .flat_map(|id| id.svid.certificate().chain_der().iter().skip(1));
    for der in state.bundle_der.iter().chain(chains) {
        let Ok(c) = ParsedCert::from_der(der) else {
            continue;
        };
        let ca = Ca {
            key_id: c.subject_key_id().map(str::to_owned),
            subject: c.subject_der().to_vec(),
        };
        if !cas
            .iter()
            .any(|k| k.key_id == ca.key_id && k.subject == ca.subject)
        {
            cas.push(ca);
        }
    }
    for ca in &cas {
        let covered = crls
            .iter()
            .any(|crl| match (crl.authority_key_id(), &ca.key_id) {
                (Some(aki), Some(ski)) => aki == ski,
                _ => crl.issuer_der() == ca.subject.as_slice(),
            });
        if !covered {
            return CrlCover::Incomplete(format!(
                "no CRL from the CA with key {}",
                ca.key_id.as_deref().unwrap_or("(no key identifier)")
            ));
        }
    }
    CrlCover::Complete {
        next_update: crls.iter().filter_map(ParsedCrl::next_update).min(),
    }
}

/// The answer to a subscription.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The resources, each an `Any` of a `Secret`.
    pub resources: Vec<Any>,
    /// When this view changes by itself (CRLs about to be withheld), if ever.
    pub recheck_at: Option<SystemTime>,
    /// Held CRLs were left out (incomplete or stale) of a validation context of the own
    /// trust domain.
    pub crls_withheld: bool,
}

impl View {
    /// A digest of the resources: a stream sends a view only when it differs from the last.
    pub fn digest(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for r in &self.resources {
            r.type_url.hash(&mut h);
            r.value.hash(&mut h);
        }
        h.finish()
    }
}

/// Why a subscription is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SdsRefusal {
    /// The caller is entitled to no identity.
    NoIdentity,
    /// These names are not served to this caller.
    NotServed(Vec<String>),
    /// `ALL` in the `trusted_ca` form with more than one trust domain.
    AllNeedsSpiffeValidator,
}

/// The names of a request, de-duplicated and sorted, within [`MAX_NAMES`]. An empty name stays
/// (and is not served): only an empty list means everything.
pub fn normalize_names(names: &[String]) -> Result<Vec<String>, usize> {
    if names.len() > MAX_NAMES {
        return Err(names.len());
    }
    let mut v: Vec<String> = names.to_vec();
    v.sort();
    v.dedup();
    Ok(v)
}

/// The caller's identities, one per SPIFFE ID in entry order, each the certificate that lasts
/// longest when two entries name the same ID.
fn distinct<'a>(mine: &[&'a Identity]) -> Vec<&'a Identity> {
    let mut out: Vec<&'a Identity> = Vec::new();
    for id in mine {
        match out
            .iter_mut()
            .find(|o| o.svid.spiffe_id() == id.svid.spiffe_id())
        {
            Some(o) => {
                if id.svid.certificate().not_after() > o.svid.certificate().not_after() {
                    *o = id;
                }
            }
            None => out.push(id),
        }
    }
    out
}

/// Resolves `names` (normalized) for a caller entitled to `mine`.
pub fn view(
    prepared: &Prepared,
    mine: &[&Identity],
    names: &[String],
    form: Form,
    aliases: &SdsNames,
    now: SystemTime,
) -> Result<View, SdsRefusal> {
    let ids = distinct(mine);
    if ids.is_empty() {
        return Err(SdsRefusal::NoIdentity);
    }
    let crls_usable = match &prepared.crls {
        CrlCover::Complete { next_update } => next_update.is_none_or(|n| now + CRL_MARGIN < n),
        _ => false,
    };
    let crls_held = prepared.crls != CrlCover::None;
    let mut out = View {
        resources: Vec::new(),
        recheck_at: None,
        crls_withheld: false,
    };
    let mut with_own = false;
    let mut not_served = Vec::new();
    let mut push = |secret: tls::Secret| {
        out.resources.push(Any {
            type_url: SECRET_TYPE_URL.to_owned(),
            value: secret.encode_to_vec(),
        });
    };
    let own = prepared.trust_domains.iter().find(|td| !td.federated);
    // The trust domains this caller trusts: the own one, and the federated ones its
    // identities federate with. Everything below looks only at these.
    let visible: Vec<&TrustDomainRoots> = prepared
        .trust_domains
        .iter()
        .filter(|td| {
            !td.federated
                || mine
                    .iter()
                    .any(|id| id.federates_with.iter().any(|f| f.as_str() == td.name))
        })
        .collect();
    let crls_for = |td: &TrustDomainRoots| {
        (crls_usable && own.is_some_and(|o| o.id == td.id)).then_some(prepared.crls_pem.as_str())
    };
    if names.is_empty() {
        for id in &ids {
            push(tls_certificate(id.svid.spiffe_id().to_string(), id));
        }
        for td in &visible {
            push(validation_context(&td.id, &[td], form, crls_for(td)));
        }
        with_own = own.is_some();
    }
    for name in names {
        if *name == aliases.svid {
            push(tls_certificate(name.clone(), ids[0]));
        } else if *name == aliases.bundle {
            match own {
                Some(td) => {
                    push(validation_context(name, &[td], form, crls_for(td)));
                    with_own = true;
                }
                None => not_served.push(name.clone()),
            }
        } else if *name == aliases.all {
            let all = &visible;
            if all.is_empty() {
                not_served.push(name.clone());
            } else if form == Form::TrustedCa && all.len() > 1 {
                return Err(SdsRefusal::AllNeedsSpiffeValidator);
            } else {
                // The own trust domain's CRLs ride in its own trust bundle.
                let crls = own.and_then(crls_for);
                push(validation_context(name, all, form, crls));
                with_own = own.is_some();
            }
        } else if let Some(td) = visible.iter().find(|td| td.id == *name) {
            push(validation_context(name, &[td], form, crls_for(td)));
            with_own |= own.is_some_and(|o| o.id == td.id);
        } else if let Some(id) = ids.iter().find(|i| i.svid.spiffe_id().to_string() == *name) {
            // Exactly as the ID is written (lowercase scheme and trust domain), as the trust
            // domain names are matched: one spelling per identity.
            push(tls_certificate(name.clone(), id));
        } else {
            not_served.push(name.clone());
        }
    }
    if !not_served.is_empty() {
        return Err(SdsRefusal::NotServed(not_served));
    }
    if with_own && crls_held {
        out.crls_withheld = !crls_usable;
        if let CrlCover::Complete {
            next_update: Some(n),
        } = prepared.crls
            && crls_usable
        {
            out.recheck_at = n.checked_sub(CRL_MARGIN);
        }
    }
    Ok(out)
}

fn inline(bytes: impl Into<Vec<u8>>) -> Option<core::DataSource> {
    Some(core::DataSource {
        specifier: Some(core::data_source::Specifier::InlineBytes(bytes.into())),
    })
}

fn tls_certificate(name: String, id: &Identity) -> tls::Secret {
    // PKCS#8, as the sinks write it; never logged.
    let key_pem = pem::encode(&pem::Pem::new(
        "PRIVATE KEY",
        id.svid.key().pkcs8_der().to_vec(),
    ));
    tls::Secret {
        name,
        r#type: Some(tls::secret::Type::TlsCertificate(tls::TlsCertificate {
            certificate_chain: inline(id.svid.certificate().chain_pem()),
            private_key: inline(key_pem),
        })),
    }
}

/// A validation context named `name` for `tds`, with `crls` (PEM) for the first of them.
fn validation_context(
    name: &str,
    tds: &[&TrustDomainRoots],
    form: Form,
    crls: Option<&str>,
) -> tls::Secret {
    let ctx = match form {
        Form::Spiffe => {
            let mut trust_domains: Vec<tls::spiffe_cert_validator_config::TrustDomain> = tds
                .iter()
                .map(|td| {
                    let mut bundle = td.roots_pem.clone();
                    if Some(td.id.as_str()) == tds.first().map(|t| t.id.as_str())
                        && let Some(c) = crls
                    {
                        bundle.push_str(c);
                    }
                    tls::spiffe_cert_validator_config::TrustDomain {
                        name: td.name.clone(),
                        trust_bundle: inline(bundle),
                    }
                })
                .collect();
            trust_domains.sort_by(|a, b| a.name.cmp(&b.name));
            let config = tls::SpiffeCertValidatorConfig { trust_domains };
            tls::CertificateValidationContext {
                custom_validator_config: Some(core::TypedExtensionConfig {
                    name: SPIFFE_VALIDATOR.to_owned(),
                    typed_config: Some(Any {
                        type_url: SPIFFE_VALIDATOR_TYPE_URL.to_owned(),
                        value: config.encode_to_vec(),
                    }),
                }),
                ..Default::default()
            }
        }
        Form::TrustedCa => tls::CertificateValidationContext {
            trusted_ca: inline(
                tds.iter()
                    .map(|td| td.roots_pem.as_str())
                    .collect::<String>(),
            ),
            crl: crls.and_then(inline),
            ..Default::default()
        },
    };
    tls::Secret {
        name: name.to_owned(),
        r#type: Some(tls::secret::Type::ValidationContext(ctx)),
    }
}
