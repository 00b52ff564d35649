//! The ledger fill benchmark tool (`signet-ledger-fill`): writes N real ledger rows quickly, to
//! measure Signet at millions of rows (issue 11's large-ledger target).
//!
//! Each row is a real X509-SVID: a service-account caller `ns/<namespace>/sa/fill-<k>` (k cycles
//! through `identities` names) goes through [`Policy::decide`] and the active CA key signs and
//! re-validates the leaf ([`crate::ca::Authority::issue`]) exactly as a request would, then the
//! rows are chained and appended by [`LedgerStore::append_certificates`] in batches of
//! `batch` (one `UNNEST` insert per batch on PostgreSQL): the server's own chaining, so
//! `signetctl ledger verify` passes afterwards. Signing runs on every core; the appends run
//! one batch at a time behind them.
//!
//! Invariant: this tool never runs inside the server and answers no request. It opens the
//! server's database and key-encryption key (the whole CA's power already, which is why the
//! caller it names needs no credential) from the server's own configuration. On PostgreSQL it
//! may run beside a live server: appends take the same chain-head lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, anyhow};
use signet_types::TrustDomain;

use crate::authn::{AuthenticatedCaller, CallerKind};
use crate::ca::csr::VerifiedCsr;
use crate::ca::{RandomSerials, RequestedNames, SerialSource};
use crate::clock::unix;
use crate::config::Config;
use crate::policy::{GrantSource, IssueRequest, Policy};
use crate::store::{LedgerStore, NewCertificate};

/// What to write.
#[derive(Debug, Clone)]
pub struct FillOptions {
    /// Rows to append.
    pub rows: u64,
    /// Rows per append transaction.
    pub batch: usize,
    /// Distinct SPIFFE IDs the rows cycle through.
    pub identities: u32,
    /// Requested lifetime.
    pub ttl: Duration,
    /// The Kubernetes namespace of the made-up callers.
    pub namespace: String,
}

/// What was written.
#[derive(Debug, Clone, Copy)]
pub struct FillReport {
    pub rows: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub elapsed: Duration,
}

impl FillReport {
    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Signs one batch of leaves for rows `first..first + n`.
struct Signer {
    td: TrustDomain,
    policy: Policy,
    authority: Arc<crate::ca::Authority>,
    csr: VerifiedCsr,
    serials: RandomSerials,
    opts: FillOptions,
}

impl Signer {
    fn batch(&self, first: u64, n: u64) -> anyhow::Result<Vec<NewCertificate>> {
        let now = SystemTime::now();
        let names = RequestedNames::default();
        let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for i in first..first + n {
            let sa = format!("fill-{}", i % u64::from(self.opts.identities.max(1)));
            let id = self
                .td
                .id(&format!("/ns/{}/sa/{sa}", self.opts.namespace))
                .map_err(|e| anyhow!("identity: {e}"))?;
            let caller = AuthenticatedCaller::new(
                id,
                CallerKind::KubernetesServiceAccount {
                    namespace: self.opts.namespace.clone(),
                    service_account: sa,
                    pod: None,
                    node: None,
                },
            );
            let request = IssueRequest {
                source: GrantSource::Caller,
                names: &names,
                ttl_seconds: i64::try_from(self.opts.ttl.as_secs()).unwrap_or(3600),
                impersonate: None,
                renewal: None,
            };
            let grant = self
                .policy
                .decide(&caller, &request, unix(now))
                .map_err(|d| anyhow!("policy refused the fill caller: {}", d.message))?;
            let serials: &dyn SerialSource = &self.serials;
            let cert = self
                .authority
                .issue(&self.csr, &grant, now, serials)
                .map_err(|e| anyhow!("signing: {e}"))?;
            out.push(NewCertificate {
                serial: cert.serial,
                spiffe_id: cert.spiffe_id.to_string(),
                dns_names: cert.dns_names,
                ip_addresses: cert.ip_addresses.iter().map(ToString::to_string).collect(),
                not_before: unix(cert.not_before),
                not_after: unix(cert.not_after),
                cert_sha256: cert.sha256,
                ca_key_id: cert.ca_key_id,
                caller: caller.label(),
                issued_at: unix(now),
                request_id: format!("fill-{i}"),
                cert_der: cert.der,
                provenance: grant.provenance().to_ledger_text(),
            });
        }
        Ok(out)
    }
}

/// One CSR (a fresh P-256 key, no names) that every filled row certifies.
fn fill_csr() -> anyhow::Result<VerifiedCsr> {
    let key = rcgen::KeyPair::generate().context("generating the fill key")?;
    let der = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .context("making the fill CSR")?;
    VerifiedCsr::parse(der.der()).map_err(|e| anyhow!("the fill CSR: {e}"))
}

/// Writes `opts.rows` rows into the database of `cfg` with its active CA key; `progress` is
/// called after each batch with the rows written so far.
pub async fn fill(
    cfg: &Config,
    opts: FillOptions,
    progress: impl Fn(u64, Duration),
) -> anyhow::Result<FillReport> {
    let td = TrustDomain::new(&cfg.trust_domain).map_err(|e| anyhow!("trust_domain: {e}"))?;
    let url = cfg.database_url();
    let store = crate::store::connect_with(&url, &cfg.database)
        .await
        .map_err(|e| anyhow!("database {}: {e}", crate::server::redact_url(&url)))?;
    // The same gate as the server's start-up: never fill another deployment's ledger.
    crate::server::pins::pin_and_check(
        &store,
        cfg,
        &crate::server::redact_url(&url),
        SystemTime::now(),
    )
    .await?;
    let serials: Arc<dyn SerialSource> = Arc::new(RandomSerials::default());
    let manager = crate::ca::manager::start(
        td.clone(),
        &cfg.ca,
        &cfg.data_dir,
        store.clone(),
        serials,
        &cfg.jwt_svid,
        SystemTime::now(),
    )
    .await
    .map_err(|e| anyhow!("CA keys: {e}"))?;
    let policy = Policy::new(td.clone(), cfg.ca.default_ttl, cfg.ca.max_ttl, &cfg.policy)
        .map_err(|e| anyhow!("policy: {e}"))?;
    let signer = Arc::new(Signer {
        td,
        policy,
        authority: manager.view().active.clone(),
        csr: fill_csr()?,
        serials: RandomSerials::default(),
        opts: opts.clone(),
    });
    let ledger: Arc<dyn LedgerStore> = store;
    run(signer, ledger, &opts, progress).await
}

async fn run(
    signer: Arc<Signer>,
    ledger: Arc<dyn LedgerStore>,
    opts: &FillOptions,
    progress: impl Fn(u64, Duration),
) -> anyhow::Result<FillReport> {
    let batch = u64::try_from(opts.batch.max(1)).unwrap_or(1000);
    let total = opts.rows;
    let next = Arc::new(AtomicU64::new(0));
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    // A few signed batches ahead of the writer, never more: memory stays bounded.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<anyhow::Result<Vec<NewCertificate>>>(workers);
    let mut handles = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (signer, next, tx) = (signer.clone(), next.clone(), tx.clone());
        handles.push(tokio::task::spawn_blocking(move || {
            loop {
                let first = next.fetch_add(batch, Ordering::Relaxed);
                if first >= total {
                    return;
                }
                let made = signer.batch(first, batch.min(total - first));
                let failed = made.is_err();
                if tx.blocking_send(made).is_err() || failed {
                    return;
                }
            }
        }));
    }
    drop(tx);
    let started = Instant::now();
    let (mut written, mut first_seq, mut last_seq) = (0u64, 0u64, 0u64);
    while let Some(made) = rx.recv().await {
        let rows = made?;
        let seqs = ledger
            .append_certificates(&rows)
            .await
            .map_err(|e| anyhow!("appending a batch: {e}"))?;
        if first_seq == 0 {
            first_seq = seqs.first().copied().unwrap_or(0);
        }
        last_seq = seqs.last().copied().unwrap_or(last_seq);
        written += rows.len() as u64;
        progress(written, started.elapsed());
    }
    for h in handles {
        h.await.context("a signing thread")?;
    }
    Ok(FillReport {
        rows: written,
        first_seq,
        last_seq,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use signet_types::ledger::{Verifier, sha256};

    use super::*;
    use crate::ca::validate::parse_cert;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn filled_rows_are_real_certificates_in_one_valid_chain() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            database_url: signet_testutil::sqlite_url(dir.path()),
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        let opts = FillOptions {
            rows: 25,
            batch: 4,
            identities: 3,
            ttl: Duration::from_secs(600),
            namespace: "bench".into(),
        };
        let report = fill(&cfg, opts.clone(), |_, _| {}).await.unwrap();
        assert_eq!(
            (report.rows, report.first_seq, report.last_seq),
            (25, 1, 25)
        );
        // A second fill continues the same chain.
        let again = fill(&cfg, FillOptions { rows: 5, ..opts }, |_, _| {})
            .await
            .unwrap();
        assert_eq!((again.first_seq, again.last_seq), (26, 30));

        let store = crate::store::connect(&cfg.database_url(), Duration::from_secs(5))
            .await
            .unwrap();
        let rows = store.list_certificates(0, 100, None).await.unwrap();
        assert_eq!(rows.len(), 30);
        let mut v = Verifier::default();
        let mut ids = std::collections::BTreeSet::new();
        for r in &rows {
            v.push(&r.entry, &r.prev_hash, &r.hash).unwrap();
            assert_eq!(sha256(&r.cert_der), r.entry.cert_sha256);
            // The stored DER is a leaf certifying the row's identity.
            let cert = parse_cert(&r.cert_der).unwrap();
            let san = cert.subject_alternative_name().unwrap().unwrap();
            assert_eq!(
                format!("{:?}", san.value.general_names),
                format!("[URI({:?})]", r.entry.spiffe_id)
            );
            assert!(
                r.entry
                    .spiffe_id
                    .starts_with("spiffe://example.org/ns/bench/sa/fill-")
            );
            assert!(r.entry.not_after - r.entry.not_before <= 610);
            ids.insert(r.entry.spiffe_id.clone());
        }
        assert_eq!(ids.len(), 3);
        let head = store.ledger_head().await.unwrap();
        assert_eq!(v.finish(head.seq, &head.hash), Ok(30));
    }
}
