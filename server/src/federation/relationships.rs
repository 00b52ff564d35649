//! Federation relationships: which foreign bundles this deployment keeps, how a fetched
//! document is judged, and the refresh loop every replica runs.
//!
//! A relationship names a foreign trust domain and how its bundle is obtained: from a SPIFFE
//! bundle endpoint (`https_spiffe`: the endpoint's X509-SVID authenticated with the bundle held
//! for that trust domain, starting with the operator's; `https_web`: Web PKI), or `static` (the
//! operator's bundle only, replaced by `federation set-bundle`). Relationships and their bundles
//! live in the database ([`crate::store::federation`]), so every replica serves the same ones.
//!
//! # Judging a document ([`decide`])
//!
//! A document is compared with the one held by its keys (x509 and JWT authorities; the refresh
//! hint and sequence left out, [`Normalized::content_sha256`]). The held bundle is kept, and
//! the reason recorded (`federation show`, the audit log, `signet_federation_fetches`), when:
//!
//! - it has no keys at all (it would cut off every workload of that trust domain);
//! - the held one has a `spiffe_sequence` and this one has none, or a smaller one;
//! - its keys differ but its `spiffe_sequence` is the held one (a document that changed
//!   without saying so).
//!
//! Otherwise a document with other keys replaces the held one; one with the same keys only moves
//! the held sequence forward. A replacement reaches agents through the entry revisions of the
//! nodes whose entries federate with the trust domain ([`FederationStore::replace_bundle`]).
//!
//! # Refreshing ([`Federation::run`])
//!
//! Each replica wakes when the earliest relationship is due (at most every
//! [`MAX_IDLE_POLL`]), claims each due one ([`FederationStore::claim_refresh`]: one replica wins
//! each fetch) and fetches it in a task of its own (at most [`MAX_CONCURRENT_FETCHES`] at
//! once): one slow endpoint delays no other relationship. The next fetch is due after the document's
//! `spiffe_refresh_hint` (or [`Settings::default_refresh`] without one), bounded by
//! [`Settings::refresh_min`] and [`Settings::refresh_max`]; after a failure, after a
//! jittered backoff from [`Settings::retry_base`] doubling up to that same interval. An
//! operator's `federation refresh` fetches at once, whatever the schedule. Failures are audited
//! when the reason changes (not on every retry) and on recovery.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use signet_pki::SpiffeBundle;
use signet_types::{SpiffeId, TrustDomain};
use tokio::sync::Notify;

use crate::audit::AuditLog;
use crate::clock::{Clock, unix};
use crate::metrics::{FederationFetchLabels, Metrics, TrustDomainLabels};
use crate::store::{BundleReplace, BundleWrite, FederationStore, RelationshipRow, StoreError};

pub const PROFILE_HTTPS_SPIFFE: &str = "https_spiffe";
pub const PROFILE_HTTPS_WEB: &str = "https_web";
pub const PROFILE_STATIC: &str = "static";

/// The longest a replica's refresh loop sleeps without looking at the database (relationships
/// created or refreshed through another replica).
pub const MAX_IDLE_POLL: Duration = Duration::from_secs(10);

/// The most fetches one replica runs at once.
pub const MAX_CONCURRENT_FETCHES: usize = 16;

/// The audit caller of what the refresh loop does.
const SYSTEM_CALLER: &str = "server";

/// How relationships are refreshed (`[federation]`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub refresh_min: Duration,
    pub refresh_max: Duration,
    /// Without a `spiffe_refresh_hint`.
    pub default_refresh: Duration,
    /// The first retry after a failure.
    pub retry_base: Duration,
    /// How long a claimed fetch is this replica's: longer than a fetch can take.
    pub lease: Duration,
}

/// Where and how to fetch one relationship's bundle.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub trust_domain: String,
    pub url: String,
    pub profile: String,
    pub endpoint_spiffe_id: String,
    /// https_spiffe: the roots of the bundle held, which authenticate the endpoint.
    pub trust_anchors: Vec<Vec<u8>>,
}

/// Why a fetch failed: a metrics label and a message for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchFailure {
    pub label: &'static str,
    pub message: String,
}

/// Fetches bundle documents (the network: `super::fetch`; a fake in tests).
#[async_trait]
pub trait BundleSource: Send + Sync + 'static {
    async fn fetch(&self, endpoint: &Endpoint) -> Result<SpiffeBundle, FetchFailure>;
}

/// A bundle as stored: the document, and what it is compared by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The document as Signet writes it ([`SpiffeBundle::to_json`]).
    pub document: String,
    /// Hex SHA-256 of the keys alone (the document without sequence and refresh hint).
    pub content_sha256: String,
    pub sequence: Option<u64>,
    pub refresh_hint: Option<Duration>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// A foreign trust domain as an operator names it (`partner.example` or
/// `spiffe://partner.example`): a valid trust domain without empty labels (no leading,
/// trailing or doubled dot: `a.test.` is not a second `a.test`), and not `own`.
pub fn federated_trust_domain(given: &str, own: &TrustDomain) -> Result<TrustDomain, String> {
    let td = TrustDomain::new(given).map_err(|e| {
        format!(
            "trust domain {}: {e}",
            signet_types::untrusted::quoted(given)
        )
    })?;
    let name = td.as_str();
    if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        return Err(format!(
            "trust domain {}: a label is empty (a leading, trailing or doubled dot)",
            signet_types::untrusted::quoted(given)
        ));
    }
    if &td == own {
        return Err(format!(
            "{td} is this server's own trust domain; federate with foreign ones only"
        ));
    }
    Ok(td)
}

/// Refuses a bundle whose X.509 authorities would break the relationship: one that is not a
/// CA certificate, or a set of which none is valid at `now` (unix seconds; a bundle of expired
/// roots would authenticate nothing, not even its own endpoint's next answer).
pub fn check_authorities(b: &SpiffeBundle, now: i64) -> Result<(), String> {
    for (i, c) in b.x509_authorities.iter().enumerate() {
        if !c.is_ca() {
            return Err(format!(
                "X.509 authority {i} is not a CA certificate (basicConstraints cA is not set)"
            ));
        }
    }
    let valid =
        |c: &signet_pki::ParsedCert| unix(c.not_before()) <= now && now < unix(c.not_after());
    if !b.x509_authorities.is_empty() && !b.x509_authorities.iter().any(valid) {
        return Err(
            "no X.509 authority of the bundle is valid now (all expired or not yet \
                    valid)"
                .into(),
        );
    }
    Ok(())
}

/// The stored form of `b`; refused when it holds no key, or a sequence too large to store.
pub fn normalize(b: &SpiffeBundle) -> Result<Normalized, String> {
    if b.x509_authorities.is_empty() && b.jwt_authorities.is_empty() {
        return Err("the bundle holds no X.509 or JWT authority".into());
    }
    if b.sequence.is_some_and(|s| i64::try_from(s).is_err()) {
        return Err("spiffe_sequence is larger than 2^63 - 1".into());
    }
    let document = b
        .to_json()
        .map_err(|e| format!("the bundle cannot be written: {e}"))?
        .to_string();
    let keys_only = SpiffeBundle {
        sequence: None,
        refresh_hint: None,
        ..b.clone()
    };
    let keys = keys_only
        .to_json()
        .map_err(|e| format!("the bundle cannot be written: {e}"))?
        .to_string();
    Ok(Normalized {
        document,
        content_sha256: sha256_hex(keys.as_bytes()),
        sequence: b.sequence,
        refresh_hint: b.refresh_hint,
    })
}

/// What to do with a document, given the held bundle's content hash ('' none) and sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Same keys, no newer sequence: nothing to write.
    Unchanged,
    /// Same keys, a newer sequence: keep it (so a later document is compared with it).
    NewSequence,
    /// Other keys: replace the held bundle.
    Replace,
    /// Keep the held bundle; why.
    Refuse(String),
}

/// Judges `new` against the held bundle (see the module doc).
pub fn decide(held_sha256: &str, held_sequence: Option<u64>, new: &Normalized) -> Verdict {
    let same_keys = held_sha256 == new.content_sha256;
    match (held_sequence, new.sequence) {
        (Some(h), None) => {
            return Verdict::Refuse(format!(
                "the document has no spiffe_sequence, and the bundle held has sequence {h}"
            ));
        }
        (Some(h), Some(n)) if n < h => {
            return Verdict::Refuse(format!(
                "spiffe_sequence went backwards, from {h} held to {n}"
            ));
        }
        (Some(h), Some(n)) if n == h && !same_keys && !held_sha256.is_empty() => {
            return Verdict::Refuse(format!(
                "the keys changed but spiffe_sequence stayed at {h}"
            ));
        }
        _ => {}
    }
    if !same_keys {
        Verdict::Replace
    } else if new.sequence > held_sequence {
        Verdict::NewSequence
    } else {
        Verdict::Unchanged
    }
}

/// Reads an operator's bundle: a SPIFFE bundle document (JSON) or PEM certificates.
pub fn read_bundle_input(bytes: &[u8]) -> Result<SpiffeBundle, String> {
    let text = bytes.trim_ascii_start();
    if text.starts_with(b"{") {
        return SpiffeBundle::parse(text).map_err(|e| format!("the SPIFFE bundle document: {e}"));
    }
    let ders = signet_types::pem::parse_certs(bytes)
        .map_err(|e| format!("the bundle is neither a SPIFFE bundle document nor PEM: {e}"))?;
    if ders.is_empty() {
        return Err("the bundle holds no certificate".into());
    }
    let x509_authorities = ders
        .iter()
        .enumerate()
        .map(|(i, d)| {
            signet_pki::ParsedCert::from_der(d).map_err(|e| format!("certificate {i}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SpiffeBundle {
        x509_authorities,
        ..SpiffeBundle::default()
    })
}

/// Longest bundle endpoint URL accepted.
const MAX_URL: usize = 2048;

/// A new relationship with foreign trust domain `td` as an operator declares it (the admin API
/// or the configuration file), checked: an `https://` URL with a host (none: static); profile
/// `https_spiffe` or `https_web` with a URL, absent or `static` without; an `https_spiffe`
/// endpoint SPIFFE ID in `td`; a starting bundle (PEM or a SPIFFE bundle document) for
/// `https_spiffe` (with an X.509 authority) and static relationships. The error says what to fix.
pub fn new_relationship(
    td: &TrustDomain,
    url_given: &str,
    profile_given: &str,
    endpoint_id_given: &str,
    bundle_given: &[u8],
    now: i64,
) -> Result<(RelationshipRow, Option<Normalized>), String> {
    let profile = if url_given.is_empty() {
        if !profile_given.is_empty() && profile_given != PROFILE_STATIC {
            return Err(format!(
                "profile {} needs a bundle endpoint URL",
                signet_types::untrusted::quoted(profile_given)
            ));
        }
        PROFILE_STATIC
    } else {
        match profile_given {
            PROFILE_HTTPS_SPIFFE => PROFILE_HTTPS_SPIFFE,
            PROFILE_HTTPS_WEB => PROFILE_HTTPS_WEB,
            other => {
                return Err(format!(
                    "profile {} is not https_spiffe or https_web",
                    signet_types::untrusted::quoted(other)
                ));
            }
        }
    };
    if !url_given.is_empty() {
        let url = url::Url::parse(url_given).map_err(|e| format!("bundle_endpoint_url: {e}"))?;
        if url.scheme() != "https" || url.host_str().is_none_or(str::is_empty) {
            return Err("bundle_endpoint_url must be an https:// URL with a host".into());
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(
                "bundle_endpoint_url carries a query or a fragment: a secret there would \
                        end up in logs and audit events; give the endpoint's path only"
                    .into(),
            );
        }
        if url_given.len() > MAX_URL || !url.username().is_empty() || url.password().is_some() {
            return Err("bundle_endpoint_url is too long or carries user info".into());
        }
    }
    let endpoint_id = if profile == PROFILE_HTTPS_SPIFFE {
        let id: SpiffeId = endpoint_id_given.parse().map_err(|e| {
            format!(
                "endpoint_spiffe_id {}: {e} (https_spiffe needs the SPIFFE ID the \
                 endpoint presents)",
                signet_types::untrusted::quoted(endpoint_id_given)
            )
        })?;
        if !id.is_member_of(td) {
            return Err(format!(
                "endpoint_spiffe_id {id} is not in trust domain {td}"
            ));
        }
        id.to_string()
    } else if !endpoint_id_given.is_empty() {
        return Err("endpoint_spiffe_id is for profile https_spiffe only".into());
    } else {
        String::new()
    };
    let bundle = if bundle_given.is_empty() {
        if profile != PROFILE_HTTPS_WEB {
            return Err(format!(
                "profile {profile} needs a starting bundle (--bundle-file): {}",
                if profile == PROFILE_STATIC {
                    "it is the only bundle a static relationship has"
                } else {
                    "it authenticates the endpoint's first answer"
                }
            ));
        }
        None
    } else {
        let b = read_bundle_input(bundle_given)?;
        check_authorities(&b, now)?;
        if profile == PROFILE_HTTPS_SPIFFE && b.x509_authorities.is_empty() {
            return Err(
                "the starting bundle of an https_spiffe relationship needs an X.509 \
                        authority to authenticate the endpoint with"
                    .into(),
            );
        }
        Some(normalize(&b)?)
    };
    let row = RelationshipRow {
        trust_domain: td.as_str().to_owned(),
        endpoint_url: url_given.to_owned(),
        profile: profile.to_owned(),
        endpoint_spiffe_id: endpoint_id,
        created_at: now,
        bundle_document: bundle
            .as_ref()
            .map_or(String::new(), |b| b.document.clone()),
        bundle_sha256: bundle
            .as_ref()
            .map_or(String::new(), |b| b.content_sha256.clone()),
        bundle_sequence: bundle
            .as_ref()
            .and_then(|b| b.sequence)
            .and_then(|s| i64::try_from(s).ok()),
        bundle_updated_at: if bundle.is_some() { now } else { 0 },
        last_success_at: 0,
        last_attempt_at: 0,
        next_refresh_at: if profile == PROFILE_STATIC { 0 } else { now },
        last_error: String::new(),
        consecutive_failures: 0,
    };
    Ok((row, bundle))
}

/// The held bundle's roots (DER), for authenticating an https_spiffe endpoint.
pub fn held_roots(row: &RelationshipRow) -> Result<Vec<Vec<u8>>, String> {
    if row.bundle_document.is_empty() {
        return Ok(Vec::new());
    }
    let b = SpiffeBundle::parse(row.bundle_document.as_bytes()).map_err(|e| {
        format!(
            "the stored bundle of {} does not read: {e}",
            row.trust_domain
        )
    })?;
    Ok(b.x509_authorities
        .iter()
        .map(|c| c.der().to_vec())
        .collect())
}

/// A stored document as the node API sends it: the X.509 authorities' DER and the JWT keys
/// Signet can verify with (others are left out: an agent could not use them).
pub fn federated_bundle_proto(
    trust_domain: &str,
    document: &str,
) -> Result<signet_proto::agent::FederatedBundle, String> {
    let b = SpiffeBundle::parse(document.as_bytes()).map_err(|e| e.to_string())?;
    let jwt_authorities = b
        .jwt_authorities
        .iter()
        .filter_map(|j| {
            match signet_pki::jwt::JwtPublicKey::from_jwk(j.key_id.clone(), &j.jwk) {
                Ok(k) => Some(signet_proto::ca::JwtKey {
                    key_id: k.key_id().to_owned(),
                    alg: k.alg().map_or(String::new(), |a| a.as_str().to_owned()),
                    public_key: k.spki_der().to_vec(),
                    not_after: 0,
                }),
                Err(e) => {
                    tracing::debug!(trust_domain, key_id = %j.key_id, error = %e, "a federated JWT key Signet cannot verify with is not sent");
                    None
                }
            }
        })
        .collect();
    Ok(signet_proto::agent::FederatedBundle {
        trust_domain: trust_domain.to_owned(),
        x509_authorities: b
            .x509_authorities
            .iter()
            .map(|c| c.der().to_vec())
            .collect(),
        jwt_authorities,
        sequence: b.sequence.unwrap_or(0),
    })
}

/// What one refresh did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    /// Another replica holds the claim (or the relationship is static or gone).
    NotClaimed,
    Changed,
    Unchanged,
    /// The held bundle is kept: why.
    Failed(String),
}

/// One replica's federation: fetches, judges and stores relationships' bundles.
pub struct Federation {
    store: Arc<dyn FederationStore>,
    source: Arc<dyn BundleSource>,
    clock: Arc<dyn Clock>,
    audit: AuditLog,
    metrics: Arc<Metrics>,
    settings: Settings,
    own: TrustDomain,
    wake: Notify,
}

impl Federation {
    pub fn new(
        store: Arc<dyn FederationStore>,
        source: Arc<dyn BundleSource>,
        clock: Arc<dyn Clock>,
        audit: AuditLog,
        metrics: Arc<Metrics>,
        settings: Settings,
        own: TrustDomain,
    ) -> Self {
        Self {
            store,
            source,
            clock,
            audit,
            metrics,
            settings,
            own,
            wake: Notify::new(),
        }
    }

    pub fn own_trust_domain(&self) -> &TrustDomain {
        &self.own
    }

    pub fn store(&self) -> &Arc<dyn FederationStore> {
        &self.store
    }

    pub fn now(&self) -> i64 {
        unix(self.clock.now())
    }

    pub fn audit(&self, kind: &str, caller: &str, detail: String) {
        self.audit.record(kind, caller, detail, self.now());
    }

    /// Creates the relationships of `[[federation.relationships]]` that the database does not
    /// have (audited `federation.config_create`; the loop fetches them at once). One the
    /// database has is left as it is, and reported when its endpoint differs from the file's:
    /// the database is what every replica serves. A declaration that does not check, or whose
    /// bundle file cannot be read, is an error (the server does not start).
    pub async fn declare(
        &self,
        declared: &[crate::config::RelationshipConfig],
    ) -> Result<(), String> {
        for d in declared {
            let td = federated_trust_domain(&d.trust_domain, &self.own)
                .map_err(|e| format!("federation.relationships: {e}"))?;
            let bundle = match &d.bundle_file {
                Some(path) => std::fs::read(path).map_err(|e| {
                    format!(
                        "federation.relationships {td}: bundle_file {}: {e}",
                        path.display()
                    )
                })?,
                None => Vec::new(),
            };
            let (row, _) = new_relationship(
                &td,
                &d.bundle_endpoint_url,
                &d.profile,
                &d.endpoint_spiffe_id,
                &bundle,
                self.now(),
            )
            .map_err(|e| format!("federation.relationships {td}: {e}"))?;
            match self
                .store
                .relationship(td.as_str())
                .await
                .map_err(|e| e.to_string())?
            {
                Some(held) => {
                    let h = held.row;
                    if (
                        h.endpoint_url.as_str(),
                        h.profile.as_str(),
                        h.endpoint_spiffe_id.as_str(),
                    ) != (
                        row.endpoint_url.as_str(),
                        row.profile.as_str(),
                        row.endpoint_spiffe_id.as_str(),
                    ) {
                        tracing::warn!(
                            trust_domain = %td,
                            database = %format!("{} {} {}", h.profile, h.endpoint_url, h.endpoint_spiffe_id),
                            configuration = %format!("{} {} {}", row.profile, row.endpoint_url, row.endpoint_spiffe_id),
                            "the database's federation relationship differs from the configuration file's; the database's is served (signetctl federation delete, then restart, to take the file's)"
                        );
                        self.audit(
                            "federation.config_differs",
                            SYSTEM_CALLER,
                            format!(
                                "{td}: the configuration declares {} {} {}, the database holds \
                                 {} {} {}; the database's is kept",
                                row.profile,
                                row.endpoint_url,
                                row.endpoint_spiffe_id,
                                h.profile,
                                h.endpoint_url,
                                h.endpoint_spiffe_id
                            ),
                        );
                    }
                }
                None => {
                    if self
                        .store
                        .create_relationship(&row)
                        .await
                        .map_err(|e| e.to_string())?
                    {
                        self.audit(
                            "federation.config_create",
                            SYSTEM_CALLER,
                            format!(
                                "federation with {td} created from the configuration file: \
                                 profile {}{}",
                                row.profile,
                                if row.endpoint_url.is_empty() {
                                    String::new()
                                } else {
                                    format!(", endpoint {}", row.endpoint_url)
                                }
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Wakes this replica's loop (a relationship was created or is due now).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The interval after an accepted document with `hint`.
    pub fn refresh_interval(&self, hint: Option<Duration>) -> Duration {
        hint.unwrap_or(self.settings.default_refresh)
            .clamp(self.settings.refresh_min, self.settings.refresh_max)
    }

    /// The wait after the `failures`-th failure in a row: doubling from `retry_base`, at most
    /// the refresh interval, with up to a quarter of jitter taken off.
    fn retry_after(&self, failures: u32, hint: Option<Duration>) -> Duration {
        let cap = self.refresh_interval(hint);
        let exp = self
            .settings
            .retry_base
            .saturating_mul(1u32 << failures.min(16));
        let wait = exp.min(cap);
        let mut b = [0u8; 1];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
        wait.saturating_sub(wait.mul_f64(f64::from(b[0]) / 1024.0))
            .max(Duration::from_secs(1))
    }

    fn count(&self, td: &str, outcome: &'static str) {
        self.metrics
            .federation_fetches
            .get_or_create(&FederationFetchLabels {
                trust_domain: td.to_owned(),
                outcome,
            })
            .inc();
    }

    /// Fetches `trust_domain`'s bundle if this replica claims it (`force`: an operator's
    /// refresh, claimed whatever the schedule), and stores the outcome.
    pub async fn refresh(&self, trust_domain: &str, force: bool) -> Result<Refreshed, StoreError> {
        let now = self.now();
        let lease = now.saturating_add(secs(self.settings.lease));
        if !self
            .store
            .claim_refresh(trust_domain, now, lease, force)
            .await?
        {
            return Ok(Refreshed::NotClaimed);
        }
        let Some(rel) = self.store.relationship(trust_domain).await? else {
            return Ok(Refreshed::NotClaimed);
        };
        let row = rel.row;
        let hint_of_held = SpiffeBundle::parse(row.bundle_document.as_bytes())
            .ok()
            .and_then(|b| b.refresh_hint);
        let outcome = self.fetch_and_judge(&row).await;
        let now = self.now();
        match outcome {
            Ok((verdict, normalized)) => {
                let hint = normalized.refresh_hint;
                let result = self.settle(row.clone(), verdict, &normalized, now).await?;
                match result {
                    Ok(changed) => {
                        let next = now.saturating_add(secs(self.refresh_interval(hint)));
                        let before = self
                            .store
                            .record_fetch(trust_domain, now, next, None)
                            .await?;
                        self.metrics
                            .federation_last_success
                            .get_or_create(&TrustDomainLabels {
                                trust_domain: trust_domain.to_owned(),
                            })
                            .set(now);
                        self.count(trust_domain, if changed { "changed" } else { "unchanged" });
                        if before.is_some_and(|e| !e.is_empty()) {
                            self.audit(
                                "federation.recovered",
                                SYSTEM_CALLER,
                                format!(
                                    "{trust_domain}: the bundle endpoint answered an accepted \
                                     document again"
                                ),
                            );
                        }
                        Ok(if changed {
                            Refreshed::Changed
                        } else {
                            Refreshed::Unchanged
                        })
                    }
                    Err((label, why)) => self.failed(&row, label, why, hint_of_held, now).await,
                }
            }
            Err(f) => {
                self.failed(&row, f.label, f.message, hint_of_held, now)
                    .await
            }
        }
    }

    /// Stores what `verdict` says about `n` against `row`. When another writer changed the
    /// bundle meanwhile (a racing replica, an operator's set-bundle), the document is judged
    /// again against what is now held, a few times: replicas that fetched the same document
    /// converge on it without reporting a failure.
    async fn settle(
        &self,
        mut row: RelationshipRow,
        mut verdict: Verdict,
        n: &Normalized,
        now: i64,
    ) -> Result<Result<bool, (&'static str, String)>, StoreError> {
        for _ in 0..3 {
            let written = match verdict {
                Verdict::Replace | Verdict::NewSequence => {
                    self.write(&row, n, verdict == Verdict::Replace, now)
                        .await?
                }
                Verdict::Unchanged => return Ok(Ok(false)),
                Verdict::Refuse(why) => return Ok(Err(("refused", why))),
            };
            match written {
                Err(("conflict", _)) => {
                    let Some(again) = self.store.relationship(&row.trust_domain).await? else {
                        return Ok(Err(("gone", "the relationship was deleted".into())));
                    };
                    row = again.row;
                    let held = row.bundle_sequence.and_then(|s| u64::try_from(s).ok());
                    verdict = decide(&row.bundle_sha256, held, n);
                }
                other => return Ok(other),
            }
        }
        Ok(Err((
            "conflict",
            "the bundle kept changing under this fetch; judged again at the next one".into(),
        )))
    }

    async fn fetch_and_judge(
        &self,
        row: &RelationshipRow,
    ) -> Result<(Verdict, Normalized), FetchFailure> {
        let trust_anchors = if row.profile == PROFILE_HTTPS_SPIFFE {
            held_roots(row).map_err(|message| FetchFailure {
                label: "stored",
                message,
            })?
        } else {
            Vec::new()
        };
        if row.profile == PROFILE_HTTPS_SPIFFE && trust_anchors.is_empty() {
            return Err(FetchFailure {
                label: "no_anchor",
                message: "no X.509 authority is held to authenticate the https_spiffe endpoint \
                          with; set one with signetctl federation set-bundle"
                    .into(),
            });
        }
        let endpoint = Endpoint {
            trust_domain: row.trust_domain.clone(),
            url: row.endpoint_url.clone(),
            profile: row.profile.clone(),
            endpoint_spiffe_id: row.endpoint_spiffe_id.clone(),
            trust_anchors,
        };
        let bundle = self.source.fetch(&endpoint).await?;
        check_authorities(&bundle, self.now()).map_err(|message| FetchFailure {
            label: "document",
            message,
        })?;
        let normalized = normalize(&bundle).map_err(|message| FetchFailure {
            label: "document",
            message,
        })?;
        let held_sequence = row.bundle_sequence.and_then(|s| u64::try_from(s).ok());
        Ok((
            decide(&row.bundle_sha256, held_sequence, &normalized),
            normalized,
        ))
    }

    /// Writes an accepted document; Ok(true) if the keys changed. A conflict (another replica
    /// wrote first) is a failure to retry soon, not an error.
    async fn write(
        &self,
        row: &RelationshipRow,
        n: &Normalized,
        keys_changed: bool,
        now: i64,
    ) -> Result<Result<bool, (&'static str, String)>, StoreError> {
        let sequence = n.sequence.and_then(|s| i64::try_from(s).ok());
        let updated_at = if keys_changed {
            now
        } else {
            row.bundle_updated_at
        };
        match self
            .store
            .replace_bundle(
                &row.trust_domain,
                &row.bundle_sha256,
                &BundleWrite {
                    document: &n.document,
                    sha256: &n.content_sha256,
                    sequence,
                },
                updated_at,
            )
            .await?
        {
            BundleReplace::Replaced { revision } => {
                if keys_changed {
                    self.metrics
                        .federation_bundle_updated
                        .get_or_create(&TrustDomainLabels {
                            trust_domain: row.trust_domain.clone(),
                        })
                        .set(now);
                    self.audit(
                        "federation.bundle_updated",
                        SYSTEM_CALLER,
                        format!(
                            "{}: new bundle from {} (sequence {}, content {}){}",
                            row.trust_domain,
                            row.endpoint_url,
                            n.sequence.map_or("none".to_owned(), |s| s.to_string()),
                            &n.content_sha256[..16.min(n.content_sha256.len())],
                            revision.map_or(String::new(), |r| format!(
                                "; federating nodes moved to entry revision {r}"
                            ))
                        ),
                    );
                }
                Ok(Ok(keys_changed))
            }
            BundleReplace::Conflict => Ok(Err((
                "conflict",
                "another replica stored a bundle meanwhile; judged again at the next fetch".into(),
            ))),
        }
    }

    async fn failed(
        &self,
        row: &RelationshipRow,
        label: &'static str,
        why: String,
        hint: Option<Duration>,
        now: i64,
    ) -> Result<Refreshed, StoreError> {
        let failures = u32::try_from(row.consecutive_failures).unwrap_or(u32::MAX);
        let next = now.saturating_add(secs(self.retry_after(failures, hint)));
        let message = format!("{label}: {why}");
        let before = self
            .store
            .record_fetch(&row.trust_domain, now, next, Some(&message))
            .await?;
        self.count(&row.trust_domain, label);
        tracing::warn!(
            trust_domain = %row.trust_domain,
            reason = %message,
            "federated bundle not updated; the bundle held is kept"
        );
        if before.as_deref() != Some(message.as_str()) {
            self.audit(
                "federation.refresh_failed",
                SYSTEM_CALLER,
                format!(
                    "{}: {message}; the bundle held is kept, next attempt at {next}",
                    row.trust_domain
                ),
            );
        }
        Ok(Refreshed::Failed(message))
    }

    /// The refresh loop of this replica, until `shutdown` resolves. Each due fetch runs as a
    /// task of its own (at most [`MAX_CONCURRENT_FETCHES`] at once), so a slow or silent
    /// endpoint holds back only its own relationship, never another's schedule.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut fetching: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
        let mut running: std::collections::HashSet<String> = std::collections::HashSet::new();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        loop {
            while let Ok(td) = done_rx.try_recv() {
                running.remove(&td);
            }
            let now = self.now();
            let wait = match self.store.due_relationships(now).await {
                Ok((due, next)) => {
                    for td in due {
                        if running.len() >= MAX_CONCURRENT_FETCHES {
                            break;
                        }
                        if !running.insert(td.clone()) {
                            continue;
                        }
                        let me = self.clone();
                        let done = done_tx.clone();
                        fetching.spawn(async move {
                            if let Err(e) = me.refresh(&td, false).await {
                                tracing::warn!(trust_domain = %td, error = %e, "federation refresh: store error");
                            }
                            let _ = done.send(td);
                        });
                    }
                    next.map_or(MAX_IDLE_POLL, |n| {
                        Duration::from_secs(u64::try_from(n.saturating_sub(now)).unwrap_or(0))
                            .min(MAX_IDLE_POLL)
                    })
                }
                Err(e) => {
                    tracing::warn!(error = %e, "federation: cannot read the relationships");
                    MAX_IDLE_POLL
                }
            };
            tokio::select! {
                () = &mut shutdown => {
                    fetching.abort_all();
                    return;
                }
                () = self.wake.notified() => {}
                Some(_) = fetching.join_next(), if !fetching.is_empty() => {}
                () = tokio::time::sleep(wait.max(Duration::from_millis(200))) => {}
            }
        }
    }
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[path = "relationships_tests.rs"]
mod tests;
