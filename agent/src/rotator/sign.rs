//! Signing: a pass's due entries in calls of at most [`SIGN_BATCH`] CSRs, each answer checked
//! ([`Rotator::to_svid`]: the entry's SPIFFE ID, the key generated here, the roots left out)
//! and installed before the next call's keys are made.
//!
//! Invariant: a certificate that does not match what was asked is never held; what a call
//! signed is published before the next call is made.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::hold::Held;
use super::publish::Outlets;
use super::{Rotator, SIGN_BATCH};
use crate::ca::{CaError, EntrySpec, WorkloadCsr};
use crate::revocation::CertRef;
use crate::rotation::renew_at;
use crate::state::Ders;
use crate::trust::Trust;
use signet_pki::{PrivateKey, SvidCertificate, X509Svid};

/// The SPIFFE IDs of a renewal round, for its trace span.
fn spiffe_ids(entries: &[EntrySpec]) -> String {
    let ids: Vec<String> = entries.iter().map(|e| e.spiffe_id.to_string()).collect();
    ids.join(",")
}

impl Rotator {
    /// Signs `want`; returns how many succeeded. One span per renewal round.
    #[tracing::instrument(
        target = "signet_trace",
        name = "agent.renew_workloads",
        skip_all,
        fields(
            entries = want.len(),
            spiffe_ids = %spiffe_ids(want),
            signed = tracing::field::Empty,
        ),
        err(Display)
    )]
    /// Signs `want` in calls of at most [`SIGN_BATCH`]: how many were signed, and the longest
    /// retry pushback the server gave (for an entry it shed, or with a call it refused: the
    /// pass's pushback, as a whole call's would be). What a call signed is published to the
    /// Workload API and handed to the sinks before the next call, so a burst's files are
    /// written while the rest is signed. A call that fails stops the pass: when it is the
    /// first, the pass fails as a whole; after others succeeded, what they signed is kept and
    /// the pass counts as partly failed.
    pub(super) async fn sign(
        &mut self,
        want: &[EntrySpec],
        trust: &mut Trust,
        out: &mut Outlets,
    ) -> Result<(usize, Option<Duration>), CaError> {
        let mut ok = 0;
        let mut pushback: Option<Duration> = None;
        let mut learnt = false;
        let batches = want.chunks(SIGN_BATCH).count();
        for (i, batch) in want.chunks(SIGN_BATCH).enumerate() {
            match self.sign_batch(batch, trust, &mut learnt).await {
                Ok((n, shed)) => {
                    ok += n;
                    pushback = pushback.max(shed);
                    if n > 0 && i + 1 < batches {
                        // Served and handed to the sinks now, while the next batch is signed
                        // (the pass publishes again at its end).
                        out.publish(&self.held, trust, self.clock.now());
                    }
                }
                Err(e) if ok == 0 => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, signed = ok, of = want.len(), "workload signing failed part-way; serving the last good certificates of the others");
                    pushback = pushback.max(e.retry_after());
                    break;
                }
            }
        }
        if learnt && trust.retry_unverified() {
            // A CRL verified now that its issuer is known: apply it on the next pass.
            tracing::debug!("a CRL verified with a newly learnt CA certificate");
        }
        tracing::Span::current().record("signed", ok);
        Ok((ok, pushback))
    }

    /// Signs `batch` in one call and installs what comes back: how many were signed, and the
    /// longest pushback the server gave an entry it shed. Sets `learnt` when a chain taught
    /// the agent a new CA certificate.
    async fn sign_batch(
        &mut self,
        batch: &[EntrySpec],
        trust: &mut Trust,
        learnt: &mut bool,
    ) -> Result<(usize, Option<Duration>), CaError> {
        let mut keys = HashMap::with_capacity(batch.len());
        let mut csrs = Vec::with_capacity(batch.len());
        for e in batch {
            let k = signet_pki::new_key_and_csr().map_err(|e| CaError::Invalid(e.to_string()))?;
            csrs.push(WorkloadCsr {
                entry_id: e.id.clone(),
                csr_der: k.csr_der.clone(),
            });
            keys.insert(e.id.clone(), k);
        }
        let results = self.ca.sign_workloads(csrs).await?;
        let mut ok = 0;
        let mut pushback: Option<Duration> = None;
        for (entry_id, result) in results {
            let (Some(spec), Some(key)) = (
                batch.iter().find(|e| e.id == entry_id),
                keys.remove(&entry_id),
            ) else {
                continue;
            };
            let svid = result.and_then(|issued| {
                Self::to_svid(spec, issued, &key.key_pkcs8_der, trust.bundle_der())
            });
            match svid {
                Ok((svid, issuers)) => {
                    // The server backdates not_before; the lifetime that counts is the one
                    // left from now, or a short-lived certificate would be due at once.
                    let now = self.clock.now();
                    let c = svid.certificate();
                    let renew = renew_at(
                        c.not_before().max(now),
                        c.not_after(),
                        self.fraction,
                        self.random.unit(),
                    );
                    let cert = CertRef::parse_chain(c.chain_der());
                    *learnt |= trust.learn_new_issuers(&issuers);
                    let mut held = Held {
                        spec: spec.clone(),
                        svid: Arc::new(svid),
                        renew_at: renew,
                        obtained: now,
                        jitter: self.random.unit(),
                        reissues: 0,
                        cert,
                        replacing: false,
                    };
                    if let Some(m) = &self.metrics
                        && self
                            .held
                            .get(&entry_id)
                            .is_some_and(|h| h.compromise(trust.revocations()).is_some())
                    {
                        m.compromised_replacements.inc();
                    }
                    if let Some(why) = held.compromise(trust.revocations()) {
                        // The server signed under the tainted key again (served), or listed
                        // this serial (never served: [`Held::revoked`]): try again after a
                        // backoff.
                        held.reissues = self
                            .held
                            .get(&entry_id)
                            .map_or(0, |h| h.reissues)
                            .saturating_add(1);
                        tracing::warn!(entry = %entry_id, reason = %why, retry_in = ?held.due_at(trust.revocations()).duration_since(now).unwrap_or_default(), "the new certificate is compromised too");
                    }
                    self.held.insert(entry_id, held);
                    ok += 1;
                }
                Err(e) => {
                    pushback = pushback.max(e.retry_after());
                    tracing::warn!(entry = %entry_id, error = %e, "entry not signed");
                }
            }
        }
        Ok((ok, pushback))
    }

    /// What the agent serves for `spec` from what the CA issued and the key it generated: the
    /// entry's SPIFFE ID (another one is refused), the key the certificate's (checked by
    /// [`X509Svid::new`]), the chain without the roots (they are the bundle). Also returns the
    /// chain's CA certificates, roots included, to learn CRL issuers from.
    fn to_svid(
        spec: &EntrySpec,
        issued: SvidCertificate,
        key_pkcs8_der: &[u8],
        roots: &Ders,
    ) -> Result<(X509Svid, Vec<Vec<u8>>), CaError> {
        if *issued.spiffe_id() != spec.spiffe_id {
            return Err(CaError::Invalid(format!(
                "a certificate for {}, not the entry's {}",
                issued.spiffe_id(),
                spec.spiffe_id
            )));
        }
        let issuers = issued.chain_der().get(1..).unwrap_or_default().to_vec();
        let key = PrivateKey::from_pkcs8_der(key_pkcs8_der)
            .map_err(|e| CaError::Invalid(e.to_string()))?;
        let svid = X509Svid::new(issued.without(roots), key)
            .map_err(|e| CaError::Invalid(e.to_string()))?;
        Ok((svid, issuers))
    }
}
