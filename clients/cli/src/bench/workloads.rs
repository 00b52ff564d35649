//! `signetctl bench --workloads N`: the node API's batch path (`SignWorkloads`), as an agent
//! renewing all of its workloads at once drives it.
//!
//! Set-up, on the admin socket and the CA listener: a join token for a fresh node ID (so runs
//! against one server never collide), one `Attest` with it (the node's SVID, used for mTLS from
//! then on), N registration entries parented to that node in one `BatchCreateEntries`, and one
//! CSR per entry. Then the closed loop ([`super::load`]): each client sends the N CSRs in one
//! `SignWorkloads` call and waits for the answer; a call counts as a success only when every
//! one of its N results is a certificate, so certificates per second is calls per second times
//! N. A per-entry refusal is counted (and the first one shown) apart from the calls.
//!
//! The invariant: every call carries exactly N CSRs, at most the server's per-call limit
//! ([`MAX_CSRS_PER_CALL`]), so one call is one request on the wire and its latency is one
//! batch's.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use signet_client::admin::{NewEntry, NodeAdminClient};
use signet_client::node::{AttestCredential, MAX_CSRS_PER_CALL, NodeClient, WorkloadCsr};
use signet_client::{ClientIdentity, ServerTarget};
use signet_runtime::clock::{Clock, SystemClock};

use super::load::{self, Outcome, Plan};

/// What one run is asked to do.
pub(super) struct Workloads<'a> {
    pub socket: &'a Path,
    pub target: &'a ServerTarget,
    /// CSRs (and entries) per call.
    pub per_call: usize,
    pub concurrency: usize,
    /// mTLS connections shared by the clients.
    pub connections: usize,
    /// The entries' certificate lifetime, in seconds.
    pub ttl: i64,
    pub plan: Plan,
    /// Process groups whose CPU per call is printed ([`super::cpu`]).
    pub cpu: &'a [super::cpu::Group],
}

/// Refuses a batch size the server would refuse (or that makes no batch).
fn check_per_call(n: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_CSRS_PER_CALL).contains(&n),
        "--workloads {n}: a SignWorkloads call carries 1 to {MAX_CSRS_PER_CALL} CSRs (the \
         server's per-call limit)"
    );
    Ok(())
}

/// A node ID no earlier run used: `bench-` and the start time in nanoseconds, in hex.
fn fresh_node_id(now: SystemTime) -> String {
    let nanos = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("bench-{nanos:x}")
}

/// The set-up (see the module doc), then the closed loop; prints the figures.
pub(super) async fn run(w: Workloads<'_>) -> anyhow::Result<Outcome> {
    check_per_call(w.per_call)?;
    let admin = NodeAdminClient::connect(w.socket)
        .await
        .map_err(crate::unreachable)?;
    let token = admin
        .create_join_token(
            Duration::from_secs(600),
            Some(fresh_node_id(SystemClock.now())),
        )
        .await
        .map_err(|e| crate::call_err("create join token", &e))?;
    let node_key = signet_client::new_key_and_csr()?;
    let attested = NodeClient::connect(w.target, None)
        .await
        .context("connecting to the CA listener")?
        .attest(
            &AttestCredential::JoinToken(token.token.clone()),
            &node_key.csr_der,
        )
        .await
        .map_err(|e| crate::call_err("attest", &e))?;
    let identity = ClientIdentity {
        cert_chain_pem: attested.svid.chain_pem().into_bytes(),
        key_pem: node_key.key_pem.into_bytes(),
    };
    let node_id = attested.node_id;

    let entries: Vec<NewEntry> = (0..w.per_call)
        .map(|i| NewEntry {
            spiffe_id: format!("spiffe://{}/bench/{node_id}/w{i}", w.target.trust_domain),
            parent: node_id.clone(),
            selectors: vec![format!("unix:uid:{}", 100_000 + i)],
            ttl_seconds: w.ttl,
            dns_names: Vec::new(),
            ..NewEntry::default()
        })
        .collect();
    let (registered, _) = admin
        .create_entries(&entries)
        .await
        .map_err(|e| crate::call_err("batch create entries", &e))?;
    let mut csrs = Vec::with_capacity(registered.len());
    for e in &registered {
        csrs.push(WorkloadCsr {
            entry_id: e.id.clone(),
            csr_der: signet_client::new_key_and_csr()?.csr_der,
        });
    }
    let csrs = Arc::new(csrs);

    let conns = w.connections.max(1);
    let mut nodes = Vec::with_capacity(conns);
    for _ in 0..conns {
        nodes.push(
            NodeClient::connect(w.target, Some(&identity))
                .await
                .context("connecting with the node's SVID")?,
        );
    }
    println!(
        "bench: SignWorkloads, {} CSRs per call, {} clients over {conns} mTLS connections as \
         node {node_id} to {} for {}",
        w.per_call,
        w.concurrency,
        w.target.addr,
        w.plan.describe()
    );
    let refused = Arc::new(AtomicU64::new(0));
    let first_refusal = Arc::new(std::sync::Mutex::new(None::<String>));
    let clients = (0..w.concurrency)
        .map(|i| {
            let node = nodes[i % conns].clone();
            let csrs = csrs.clone();
            let refused = refused.clone();
            let first_refusal = first_refusal.clone();
            move || {
                let node = node.clone();
                let csrs = csrs.clone();
                let refused = refused.clone();
                let first_refusal = first_refusal.clone();
                async move {
                    let results = node
                        .sign_workloads((*csrs).clone())
                        .await
                        .map_err(|e| format!("{:?}: {}", e.code(), e.message()))?;
                    if results.len() != csrs.len() {
                        return Err(format!("{} results for {} CSRs", results.len(), csrs.len()));
                    }
                    let failed: Vec<String> = results
                        .into_iter()
                        .filter_map(|(id, r)| r.err().map(|e| format!("entry {id}: {e}")))
                        .collect();
                    if let Some(first) = failed.first() {
                        refused.fetch_add(failed.len() as u64, Ordering::Relaxed);
                        first_refusal
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert_with(|| first.clone());
                        return Err(format!(
                            "{} of the call's certificates refused",
                            failed.len()
                        ));
                    }
                    Ok(())
                }
            }
        })
        .collect();
    let outcome = super::phase("calls", w.cpu, w.plan, load::closed_loop(clients, w.plan)).await?;
    println!(
        "certificates:  {:.0}/s ({} per call, from calls whose every certificate was issued)",
        outcome.rate() * w.per_call as f64,
        w.per_call
    );
    println!("refused certs: {}", refused.load(Ordering::Relaxed));
    if let Some(e) = first_refusal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        println!("first refusal: {e}");
    }
    if outcome.latencies.is_empty() && outcome.errors > 0 {
        return Err(anyhow!(
            "no SignWorkloads call succeeded; first error: {}",
            outcome.first_error.as_deref().unwrap_or("none")
        ));
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_one_to_the_servers_limit() {
        assert!(check_per_call(1).is_ok());
        assert!(check_per_call(MAX_CSRS_PER_CALL).is_ok());
        for n in [0, MAX_CSRS_PER_CALL + 1] {
            let e = check_per_call(n).unwrap_err().to_string();
            assert!(e.contains("1 to 256"), "{e}");
        }
    }

    #[test]
    fn node_ids_differ_between_runs_and_are_valid() {
        let t = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let a = fresh_node_id(t);
        let b = fresh_node_id(t + Duration::from_nanos(1));
        assert_ne!(a, b);
        assert!(signet_types::node::NodeId::new(&a).is_ok(), "{a}");
    }
}
