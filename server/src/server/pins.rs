//! The values every server sharing one database must agree on, pinned in that database by the
//! first server to start and checked by every server at start-up, after the migrations and
//! before the CA keys are loaded or created: a server whose configuration disagrees exits
//! naming the value, its own setting and the database's, having signed, recorded and served
//! nothing.
//!
//! Pinned, because two replicas that differed would silently corrupt the trust or the ledger:
//! - `trust_domain`. Every certificate, the bundle, the server's own SPIFFE ID
//!   (`spiffe://<td>/signet/server`, which is why that is not pinned separately) and the CA
//!   certificates' URI SANs name it. A replica with another one signs `spiffe://corp.example/…`
//!   under the intermediate an `example.org` bundle trusts, records it in the same ledger, and
//!   publishes a bundle for another trust domain: relying parties of the first would accept
//!   identities of a trust domain they never federated with.
//! - `ca_mode` (`generated` or `plugged`). A replica with a plugged-in CA (`ca.cert_file`…) beside
//!   replicas with generated keys signs under another root, publishes another bundle (clients of
//!   one replica reject certificates of the other), ignores the slots the others rotate, and
//!   mixes two CAs' certificates in one ledger. Moving between the modes is a root change, not
//!   a rolling restart: it needs a database of its own (or a deliberate edit of
//!   `deployment_pins` while every server is stopped).
//!
//! Not pinned, and why:
//! - `ca.key_type`: it chooses the algorithm of keys generated from now on; each key's
//!   algorithm is stored in its slot, any mix chains correctly, and a rolling restart is how an
//!   operator moves to P-384 (replicas differ while it rolls; pinning would forbid it).
//! - The ledger's hash format: each row says its own (`signet-ledger-v1` rows have no provenance,
//!   v2 rows do; `signet_types::ledger`), and which binaries may write at all is already pinned
//!   by the migrations: sqlx refuses to start a binary that does not know a migration the
//!   database has applied (`VersionMissing`; `an_older_binary_cannot_start_on_a_newer_database`
//!   in `store::conformance::pins`), so a downgraded replica cannot write an older format.
//! - The key-encryption key: a replica with another one cannot open any stored CA key and
//!   refuses to start already ("cannot decrypt CA key …"). Keeping a check value of it in the
//!   database would add nothing to that.
//! - The checkpoint key: replicas should share it, but a checkpoint names its key and an
//!   auditor verifying with another key is refused loudly; its rotation is a rolling change.
//! - Lifetimes, rotation thresholds, policy, limits and `server_names`: per replica, or changed
//!   by a rolling restart; replicas that differ for a while decide differently but each decision
//!   is valid (CA transitions happen once across replicas whatever each one's thresholds).
//!
//! How the values are pinned ([`proposal`]): on an empty database (no CA key, no certificate)
//! from this server's configuration. On a database created before pins existed, from what it
//! holds, not from whichever configuration happens to start first: the trust domain of the
//! oldest root's SPIFFE ID (else of the ledger's first certificate), and the mode of the
//! ledger's last certificate (`generated` when its issuer is a stored CA key, `plugged` when
//! not; with no certificate, `generated` when CA keys are stored). The first writer wins
//! (`store::pins`), so replicas starting together pin once; then every server compares its
//! configuration with what is stored ([`check`]), the winner included.
//!
//! What this is not: a defence against someone who can write the database. They can rewrite a
//! pin as they can rewrite any row; this guards against an operator's mistake (SECURITY.md, "the
//! deployment's configuration").

use std::sync::Arc;
use std::time::SystemTime;

use signet_types::TrustDomain;

use crate::clock::{from_unix, unix};
use crate::config::Config;
use crate::store::pins::{PIN_DERIVED, PIN_FROM_CONFIGURATION};
use crate::store::{AuditEvent, Pin, PinEvidence, Store};

/// The pin of the trust domain.
pub(crate) const TRUST_DOMAIN: &str = "trust_domain";
/// The pin of the CA mode.
pub(crate) const CA_MODE: &str = "ca_mode";
/// Every value pinned.
const PINNED: [&str; 2] = [TRUST_DOMAIN, CA_MODE];

/// Where the CA's signing keys come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CaMode {
    /// Signet generates the root and intermediates and keeps them, sealed, in the database.
    Generated,
    /// The operator's CA files (`ca.cert_file`, `ca.key_file`, `ca.chain_file`, `ca.root_file`).
    Plugged,
}

impl CaMode {
    fn as_str(self) -> &'static str {
        match self {
            CaMode::Generated => "generated",
            CaMode::Plugged => "plugged",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "generated" => Some(CaMode::Generated),
            "plugged" => Some(CaMode::Plugged),
            _ => None,
        }
    }

    /// How a server in this mode is configured, for messages.
    fn configured(self) -> &'static str {
        match self {
            CaMode::Generated => {
                "to generate its CA keys (no ca.cert_file, ca.key_file, ca.chain_file, ca.root_file)"
            }
            CaMode::Plugged => {
                "with a plugged-in CA (ca.cert_file, ca.key_file, ca.chain_file, ca.root_file)"
            }
        }
    }

    /// A deployment in this mode, for messages.
    fn deployment(self) -> &'static str {
        match self {
            CaMode::Generated => "a deployment whose CA keys Signet generates (ca_mode generated)",
            CaMode::Plugged => "a deployment with a plugged-in CA (ca_mode plugged)",
        }
    }
}

/// What this server's configuration says for each pinned value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deployment {
    pub trust_domain: TrustDomain,
    pub ca_mode: CaMode,
}

impl Deployment {
    /// The values of `cfg` (validated: its trust domain parses, its CA files are all or none).
    pub(crate) fn of(cfg: &Config) -> anyhow::Result<Self> {
        let plugged = cfg.ca.plugged().map_err(|e| anyhow::anyhow!("{e}"))?;
        // Not `Config::trust_domain`, whose fallback is for code that runs after validation:
        // what is pinned must be exactly what was configured.
        let trust_domain = TrustDomain::new(&cfg.trust_domain)
            .map_err(|e| anyhow::anyhow!("trust_domain {:?}: {e}", cfg.trust_domain))?;
        Ok(Self {
            trust_domain,
            ca_mode: if plugged.is_some() {
                CaMode::Plugged
            } else {
                CaMode::Generated
            },
        })
    }
}

/// A value derived from an older database's rows, and from which.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Derived<T> {
    value: T,
    from: String,
}

/// The trust domain an older database belongs to: its oldest root's SPIFFE ID, else its
/// ledger's first certificate's. `None` when it holds neither (or nothing readable).
fn derive_trust_domain(e: &PinEvidence) -> Option<Derived<TrustDomain>> {
    for (id, pem) in &e.roots {
        let der = signet_types::pem::parse_certs(pem.as_bytes())
            .ok()
            .and_then(|c| c.into_iter().next());
        let tds = der.and_then(|d| crate::ca::validate::ca_trust_domains(&d).ok());
        if let Some(td) = tds.and_then(|t| t.into_iter().next()) {
            return Some(Derived {
                value: td,
                from: format!("the SPIFFE ID of its CA root {id}"),
            });
        }
    }
    let first = e.first_certificate.as_ref()?;
    let id: signet_types::SpiffeId = first.spiffe_id.parse().ok()?;
    Some(Derived {
        value: id.trust_domain().clone(),
        from: format!(
            "the SPIFFE ID of its ledger's first certificate (seq {})",
            first.seq
        ),
    })
}

/// The CA mode of an older database: that of the key that signed its last certificate, else
/// `generated` if it holds CA keys. `None` when it holds neither.
fn derive_ca_mode(e: &PinEvidence) -> Option<Derived<CaMode>> {
    if let Some(last) = &e.last_certificate {
        let stored = e.ca_key_ids.contains(&last.ca_key_id);
        return Some(Derived {
            value: if stored {
                CaMode::Generated
            } else {
                CaMode::Plugged
            },
            from: format!(
                "the issuer of its ledger's last certificate (seq {}), CA key {}, {}",
                last.seq,
                last.ca_key_id,
                if stored {
                    "a key stored in the database"
                } else {
                    "not a key stored in the database"
                }
            ),
        });
    }
    (!e.ca_key_ids.is_empty()).then(|| Derived {
        value: CaMode::Generated,
        from: "its stored CA keys".into(),
    })
}

/// What this server proposes to pin at `now` (unix seconds): on an empty database its own
/// configuration; on an older one each value derived from the rows, where they say it.
pub(crate) fn proposal(want: &Deployment, evidence: &PinEvidence, now: i64) -> Vec<Pin> {
    let pin = |name: &str, value: String, source: &str| Pin {
        name: name.into(),
        value,
        pinned_at: now,
        source: source.into(),
    };
    let (td, mode) = if evidence.is_empty() {
        (None, None)
    } else {
        (derive_trust_domain(evidence), derive_ca_mode(evidence))
    };
    let mut out = Vec::new();
    match td {
        Some(d) => {
            tracing::info!(trust_domain = %d.value, from = %d.from, "derived the database's trust domain");
            out.push(pin(TRUST_DOMAIN, d.value.to_string(), PIN_DERIVED));
        }
        None => out.push(pin(
            TRUST_DOMAIN,
            want.trust_domain.to_string(),
            PIN_FROM_CONFIGURATION,
        )),
    }
    match mode {
        Some(d) => {
            tracing::info!(ca_mode = d.value.as_str(), from = %d.from, "derived the database's CA mode");
            out.push(pin(CA_MODE, d.value.as_str().into(), PIN_DERIVED));
        }
        None => out.push(pin(
            CA_MODE,
            want.ca_mode.as_str().into(),
            PIN_FROM_CONFIGURATION,
        )),
    }
    out
}

/// Why this server may not use the database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum PinError {
    /// The configuration says one thing, the database another.
    #[error(
        "{name}: this server is configured {configured}, but the database at {database} \
         belongs to {pinned} (pinned at {at}). Every server sharing a database must agree \
         on it: {advice}"
    )]
    Mismatch {
        name: &'static str,
        configured: String,
        pinned: String,
        database: String,
        /// When, and how if derived.
        at: String,
        advice: String,
    },
    /// The database pins a value this server cannot read (tampering, or a newer version's).
    #[error(
        "{name}: the database at {database} pins {value:?}, which this server does not \
         understand (pinned at {at}); is it a newer Signet's database?"
    )]
    Unreadable {
        name: &'static str,
        value: String,
        database: String,
        at: String,
    },
    /// Nothing is pinned under a name this server just pinned (the row was removed).
    #[error(
        "{name}: the database at {database} has no pinned value even after pinning one; \
         someone removed it (see the audit log)"
    )]
    Missing {
        name: &'static str,
        database: String,
    },
}

/// RFC 3339 (seconds, UTC) of a pin's time.
fn when(at: i64) -> String {
    humantime::format_rfc3339_seconds(from_unix(at)).to_string()
}

/// Compares this server's configuration with what the database pins. `database` is the
/// redacted URL, for the message.
pub(crate) fn check(want: &Deployment, pins: &[Pin], database: &str) -> Result<(), Box<PinError>> {
    let find = |name: &'static str| {
        pins.iter().find(|p| p.name == name).ok_or_else(|| {
            Box::new(PinError::Missing {
                name,
                database: database.to_owned(),
            })
        })
    };
    let how = |p: &Pin| {
        if p.source == PIN_DERIVED {
            ", derived from the database's own rows"
        } else {
            ""
        }
    };
    let td_pin = find(TRUST_DOMAIN)?;
    let pinned_td = TrustDomain::new(&td_pin.value).map_err(|_| {
        Box::new(PinError::Unreadable {
            name: TRUST_DOMAIN,
            value: td_pin.value.clone(),
            database: database.to_owned(),
            at: when(td_pin.pinned_at),
        })
    })?;
    if pinned_td != want.trust_domain {
        return Err(Box::new(PinError::Mismatch {
            name: TRUST_DOMAIN,
            configured: format!("for {}", want.trust_domain),
            pinned: pinned_td.to_string(),
            database: database.to_owned(),
            at: format!("{}{}", when(td_pin.pinned_at), how(td_pin)),
            advice: format!(
                "set trust_domain = \"{pinned_td}\" on this server, or give it a database of \
                 its own"
            ),
        }));
    }
    let mode_pin = find(CA_MODE)?;
    let pinned_mode = CaMode::parse(&mode_pin.value).ok_or_else(|| {
        Box::new(PinError::Unreadable {
            name: CA_MODE,
            value: mode_pin.value.clone(),
            database: database.to_owned(),
            at: when(mode_pin.pinned_at),
        })
    })?;
    if pinned_mode != want.ca_mode {
        return Err(Box::new(PinError::Mismatch {
            name: CA_MODE,
            configured: want.ca_mode.configured().into(),
            pinned: pinned_mode.deployment().into(),
            database: database.to_owned(),
            at: format!("{}{}", when(mode_pin.pinned_at), how(mode_pin)),
            advice: format!(
                "configure this server {} as the others are, or give it a database of its own \
                 (moving a deployment between the modes is a change of root)",
                pinned_mode.configured()
            ),
        }));
    }
    Ok(())
}

/// Pins the database's values if they are not yet (deriving them from an older database's
/// rows), then checks this server's configuration against them: the start-up step. Records an
/// audit event when it pins, and when it refuses (so the deployment's operator sees that a
/// misconfigured server tried to join). `database` is the redacted URL.
pub(crate) async fn pin_and_check(
    store: &Arc<dyn Store>,
    cfg: &Config,
    database: &str,
    now: SystemTime,
) -> anyhow::Result<()> {
    let want = Deployment::of(cfg)?;
    let now = unix(now);
    // Every start after the first: the pins are there, read without a write transaction.
    let stored = store
        .deployment_pins()
        .await
        .map_err(|e| anyhow::anyhow!("database {database}: reading its pinned values: {e}"))?;
    if PINNED.iter().all(|n| stored.iter().any(|p| p.name == *n)) {
        return refuse_unless_agreed(store, &want, &stored, database, now, Vec::new()).await;
    }
    let evidence = store
        .pin_evidence()
        .await
        .map_err(|e| anyhow::anyhow!("database {database}: reading what it holds: {e}"))?;
    let proposed = proposal(&want, &evidence, now);
    let outcome = store
        .pin_deployment(&proposed)
        .await
        .map_err(|e| anyhow::anyhow!("database {database}: pinning the deployment: {e}"))?;
    let mut events = Vec::new();
    for p in outcome
        .pins
        .iter()
        .filter(|p| outcome.inserted.contains(&p.name))
    {
        tracing::info!(name = %p.name, value = %p.value, source = %p.source, "pinned in the database");
        events.push(AuditEvent {
            id: 0,
            at: now,
            kind: "deployment.pinned".into(),
            caller: "server".into(),
            detail: format!("{} = {} ({})", p.name, p.value, p.source),
        });
    }
    refuse_unless_agreed(store, &want, &outcome.pins, database, now, events).await
}

/// [`check`], recording `events` and, on a refusal, the refusal's audit event.
async fn refuse_unless_agreed(
    store: &Arc<dyn Store>,
    want: &Deployment,
    pins: &[Pin],
    database: &str,
    now: i64,
    mut events: Vec<AuditEvent>,
) -> anyhow::Result<()> {
    let result = check(want, pins, database);
    if let Err(e) = &result {
        events.push(AuditEvent {
            id: 0,
            at: now,
            kind: "deployment.pin_refused".into(),
            caller: "server".into(),
            detail: format!(
                "a server configured with trust_domain {} and ca_mode {} was refused: {e}",
                want.trust_domain,
                want.ca_mode.as_str()
            ),
        });
    }
    if events.is_empty() {
        return result.map_err(anyhow::Error::from);
    }
    if let Err(e) = store.record_audit_events(&events).await {
        tracing::warn!(error = %e, "could not record the deployment pin's audit events");
    }
    result.map_err(anyhow::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pins::LedgerMark;

    fn td(s: &str) -> TrustDomain {
        TrustDomain::new(s).expect("td")
    }

    fn want(t: &str, mode: CaMode) -> Deployment {
        Deployment {
            trust_domain: td(t),
            ca_mode: mode,
        }
    }

    fn pin(name: &str, value: &str, source: &str) -> Pin {
        Pin {
            name: name.into(),
            value: value.into(),
            pinned_at: 1_700_000_000,
            source: source.into(),
        }
    }

    fn mark(seq: i64, id: &str, key: &str) -> LedgerMark {
        LedgerMark {
            seq,
            spiffe_id: id.into(),
            ca_key_id: key.into(),
        }
    }

    fn root_pem(td: &str) -> String {
        let mut p = rcgen::CertificateParams::default();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.subject_alt_names = vec![rcgen::SanType::URI(
            format!("spiffe://{td}").try_into().expect("uri"),
        )];
        let key = rcgen::KeyPair::generate().expect("key");
        p.self_signed(&key).expect("root").pem()
    }

    #[test]
    fn an_empty_database_pins_the_configuration() {
        let got = proposal(
            &want("example.org", CaMode::Generated),
            &PinEvidence::default(),
            7,
        );
        assert_eq!(
            got,
            vec![
                Pin {
                    pinned_at: 7,
                    ..pin(TRUST_DOMAIN, "example.org", PIN_FROM_CONFIGURATION)
                },
                Pin {
                    pinned_at: 7,
                    ..pin(CA_MODE, "generated", PIN_FROM_CONFIGURATION)
                },
            ]
        );
    }

    #[test]
    fn an_older_database_pins_what_its_rows_say_not_the_configuration() {
        // Generated: the root's SPIFFE ID names the trust domain; the last certificate's
        // issuer is a stored key.
        let e = PinEvidence {
            roots: vec![("r1".into(), root_pem("example.org"))],
            ca_key_ids: vec!["r1".into(), "i1".into()],
            first_certificate: Some(mark(1, "spiffe://other.example/x", "i1")),
            last_certificate: Some(mark(9, "spiffe://example.org/y", "i1")),
        };
        let got = proposal(&want("corp.example", CaMode::Plugged), &e, 7);
        assert_eq!(got[0].value, "example.org", "the root wins over the ledger");
        assert_eq!(got[0].source, PIN_DERIVED);
        assert_eq!(got[1].value, "generated");
        assert_eq!(got[1].source, PIN_DERIVED);
        // Plugged (no stored keys): the ledger's first certificate, the last one's issuer.
        let e = PinEvidence {
            roots: vec![],
            ca_key_ids: vec![],
            first_certificate: Some(mark(1, "spiffe://example.org/signet/server", "ext")),
            last_certificate: Some(mark(5, "spiffe://example.org/w", "ext")),
        };
        let got = proposal(&want("corp.example", CaMode::Generated), &e, 7);
        assert_eq!(
            (got[0].value.as_str(), got[1].value.as_str()),
            ("example.org", "plugged")
        );
        // Generated keys once, plugged since: the last certificate says what runs now.
        let e = PinEvidence {
            ca_key_ids: vec!["r1".into(), "i1".into()],
            last_certificate: Some(mark(5, "spiffe://example.org/w", "ext")),
            first_certificate: Some(mark(1, "spiffe://example.org/w", "i1")),
            roots: vec![],
        };
        assert_eq!(
            proposal(&want("example.org", CaMode::Plugged), &e, 7)[1].value,
            "plugged"
        );
        // Keys but no certificate yet (a first start that stopped early): generated.
        let e = PinEvidence {
            ca_key_ids: vec!["r1".into()],
            roots: vec![("r1".into(), root_pem("example.org"))],
            ..PinEvidence::default()
        };
        let got = proposal(&want("example.org", CaMode::Plugged), &e, 7);
        assert_eq!(got[1].value, "generated");
        // A root without a SPIFFE ID and no ledger: the configuration is all there is.
        let e = PinEvidence {
            ca_key_ids: vec!["r1".into()],
            roots: vec![("r1".into(), "not a certificate".into())],
            ..PinEvidence::default()
        };
        let got = proposal(&want("example.org", CaMode::Generated), &e, 7);
        assert_eq!(got[0].source, PIN_FROM_CONFIGURATION);
    }

    #[test]
    fn the_same_configuration_is_accepted() {
        let pins = [
            pin(CA_MODE, "generated", PIN_FROM_CONFIGURATION),
            pin(TRUST_DOMAIN, "example.org", PIN_DERIVED),
        ];
        check(&want("example.org", CaMode::Generated), &pins, "db").expect("same");
        // Trust domains compare as trust domains (stored lowercase).
        check(&want("EXAMPLE.org", CaMode::Generated), &pins, "db").expect("same");
    }

    #[test]
    fn another_trust_domain_is_refused_naming_both_values() {
        let pins = [
            pin(TRUST_DOMAIN, "example.org", PIN_FROM_CONFIGURATION),
            pin(CA_MODE, "generated", PIN_FROM_CONFIGURATION),
        ];
        let e = check(
            &want("corp.example", CaMode::Generated),
            &pins,
            "postgres://signet:…@db/signet",
        )
        .expect_err("refused");
        assert_eq!(
            e.to_string(),
            "trust_domain: this server is configured for corp.example, but the database at \
             postgres://signet:…@db/signet belongs to example.org (pinned at \
             2023-11-14T22:13:20Z). Every server sharing a database must agree on it: set \
             trust_domain = \"example.org\" on this server, or give it a database of its own"
        );
        // A derived pin says so.
        let derived = [
            pin(TRUST_DOMAIN, "example.org", PIN_DERIVED),
            pin(CA_MODE, "generated", PIN_DERIVED),
        ];
        let m = check(&want("corp.example", CaMode::Generated), &derived, "db")
            .expect_err("refused")
            .to_string();
        assert!(m.contains("derived from the database's own rows"), "{m}");
    }

    #[test]
    fn another_ca_mode_is_refused_naming_both() {
        let pins = [
            pin(TRUST_DOMAIN, "example.org", PIN_FROM_CONFIGURATION),
            pin(CA_MODE, "generated", PIN_FROM_CONFIGURATION),
        ];
        let m = check(&want("example.org", CaMode::Plugged), &pins, "db")
            .expect_err("refused")
            .to_string();
        assert!(m.starts_with("ca_mode: "), "{m}");
        assert!(m.contains("with a plugged-in CA"), "{m}");
        assert!(m.contains("ca_mode generated"), "{m}");
        let pins = [
            pin(TRUST_DOMAIN, "example.org", PIN_FROM_CONFIGURATION),
            pin(CA_MODE, "plugged", PIN_FROM_CONFIGURATION),
        ];
        let m = check(&want("example.org", CaMode::Generated), &pins, "db")
            .expect_err("refused")
            .to_string();
        assert!(m.contains("to generate its CA keys"), "{m}");
        assert!(m.contains("ca_mode plugged"), "{m}");
    }

    #[test]
    fn unreadable_or_missing_pins_are_refused() {
        let bad = [
            pin(TRUST_DOMAIN, "not a td!", PIN_FROM_CONFIGURATION),
            pin(CA_MODE, "generated", PIN_FROM_CONFIGURATION),
        ];
        let e = check(&want("example.org", CaMode::Generated), &bad, "db").expect_err("bad");
        assert!(matches!(*e, PinError::Unreadable { .. }), "{e}");
        let bad = [
            pin(TRUST_DOMAIN, "example.org", PIN_FROM_CONFIGURATION),
            pin(CA_MODE, "hsm", PIN_FROM_CONFIGURATION),
        ];
        let e = check(&want("example.org", CaMode::Generated), &bad, "db").expect_err("bad");
        assert!(
            matches!(*e, PinError::Unreadable { name: CA_MODE, .. }),
            "{e}"
        );
        let e =
            check(&want("example.org", CaMode::Generated), &bad[..1], "db").expect_err("missing");
        assert!(matches!(*e, PinError::Missing { name: CA_MODE, .. }), "{e}");
    }
}
