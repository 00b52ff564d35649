//! `signetctl bench`: N concurrent clients issue through the Istio CSR API over TLS, then
//! the ledger is verified. Prints issuances per second, latency percentiles and the number of
//! ledger rows verified.
//!
//! The clients authenticate with mTLS using an identity minted on the admin socket (or with a
//! service-account token from `--token-file`). Each request carries a CSR with no names, so
//! the server fills in the caller's identity: the full authn -> policy -> sign -> commit path.
//!
//! Modes: closed loop for the maximum rate (default), `--requests N` for a fixed amount of work
//! (profiles), `--rate R` for the latency at a given rate (open loop, [`load`]); `--cfssl ADDR`
//! (and `--cfssl-tls ADDR`) then drives a `cfssl serve` the same way and prints both rates
//! ([`cfssl`]). Each phase also prints what one request cost the machine's CPU, per process
//! group (`--cpu NAME=PID`, [`cpu`]): on one shared machine the server, its database and the
//! load generator all spend the same cores.
//! `--workloads N` drives the node API's batch path instead: a node attested for the run signs
//! N workload CSRs per `SignWorkloads` call ([`workloads`]).
//! `--jwt` adds a phase to every round: the same clients, on the same connections and at the same
//! concurrency, mint JWT-SVIDs through the native API (`MintJwtSvid`, each committed to the ledger
//! before it returns), and the ratio to the certificate rate of the same round is printed.

mod cfssl;
mod cpu;
mod load;
mod workloads;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use signet_client::istio_ca::IstioCertificateRequest;
use signet_client::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The CA's gRPC address.
    #[arg(long, default_value = "https://127.0.0.1:8443")]
    addr: String,
    /// The server must present `spiffe://<trust domain>/signet/server`; default: the trust
    /// domain of the server behind the admin socket.
    #[arg(long, env = "SIGNET_TRUST_DOMAIN")]
    trust_domain: Option<String>,
    /// The name checked in the server's certificate (default: the host of --addr).
    #[arg(long)]
    server_name: Option<String>,
    /// PEM roots to trust for the server (default: the bundle from the admin socket).
    #[arg(long)]
    bundle: Option<PathBuf>,
    /// Concurrent in-flight requests.
    #[arg(long, short = 'c', default_value_t = 64)]
    concurrency: usize,
    /// TLS connections shared by the clients (0: one per 8 clients).
    #[arg(long, default_value_t = 0)]
    connections: usize,
    /// How long to run.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    duration: Duration,
    /// Warm-up before measuring.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    warmup: Duration,
    /// Send exactly this many requests (all measured, no warm-up) instead of running for
    /// `--duration`: a fixed amount of work, for profiles that count instructions.
    #[arg(long)]
    requests: Option<u64>,
    /// Requested certificate lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl: i64,
    /// Authenticate with this service-account token instead of a minted client certificate.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Skip the ledger verification at the end.
    #[arg(long)]
    no_verify: bool,
    /// Open loop: send R requests per second on a fixed schedule (whatever is in flight) and
    /// report the latency from when each was due; without it, the clients run closed loop
    /// (each sends its next request when the last answered), which gives the maximum rate.
    #[arg(long, value_name = "R")]
    rate: Option<f64>,
    /// Afterwards drive a `cfssl serve` at this address (`host:port`) with the same
    /// concurrency and duration (closed loop, plain HTTP, the same CSR) and print both rates.
    #[arg(long, value_name = "ADDR")]
    cfssl: Option<String>,
    /// Afterwards drive a `cfssl serve -tls-cert` at this address the same way, over TLS
    /// (the like-for-like with Signet's TLS listener); needs --cfssl-ca.
    #[arg(long, value_name = "ADDR", requires = "cfssl_ca")]
    cfssl_tls: Option<String>,
    /// Repeat the measurement (Signet, then each cfssl run) this many times and print the
    /// medians: on a machine whose speed drifts, the same-run ratio per round and its spread.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// PEM roots that the TLS cfssl's certificate (for the name `localhost`) chains to.
    #[arg(long, value_name = "FILE")]
    cfssl_ca: Option<PathBuf>,
    /// Count the CPU of this process and everything below it as NAME (repeatable), and
    /// print each group's CPU per answered request for every phase.
    #[arg(long, value_name = "NAME=PID", value_parser = cpu::parse_group)]
    cpu: Vec<cpu::Group>,
    /// Drive `SignWorkloads` instead: attest a node with a join token, create N entries
    /// parented to it (one batch), then send their N CSRs per call (closed loop; 1 to 256).
    #[arg(long, value_name = "N", conflicts_with_all = ["rate", "cfssl", "token_file"])]
    workloads: Option<usize>,
    /// After the certificates of every round, mint JWT-SVIDs (`MintJwtSvid`, audience
    /// `bench`) the same way and print both rates and their ratio.
    #[arg(long, conflicts_with_all = ["rate", "workloads"])]
    jwt: bool,
}

/// Runs one measured phase and prints its figures and the CPU each group spent per answered
/// request in the measured window.
async fn phase<Fut>(
    what: &str,
    groups: &[cpu::Group],
    plan: load::Plan,
    run: Fut,
) -> anyhow::Result<load::Outcome>
where
    Fut: std::future::Future<Output = anyhow::Result<load::Outcome>>,
{
    let warm = if plan.requests.is_some() {
        Duration::ZERO
    } else {
        plan.warmup
    };
    let before = {
        let groups = groups.to_vec();
        tokio::spawn(async move {
            tokio::time::sleep(warm).await;
            cpu::snapshot(&groups)
        })
    };
    let outcome = run.await?;
    let after = cpu::snapshot(groups);
    let before = before.await.map_err(|e| anyhow!("cpu snapshot: {e}"))?;
    outcome.print(what);
    let line = cpu::per_request(&before, &after, outcome.latencies.len());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match cpu::total_of(&line) {
        Some(total) => println!(
            "cpu/request:   {line} (all cores: at most {:.0}/s)",
            cpu::ceiling(total, cores)
        ),
        None => println!("cpu/request:   {line}"),
    }
    if let Some(m) = cpu::machine_line(&before, &after) {
        println!("machine:       {m}");
    }
    Ok(outcome)
}

/// Drives a `cfssl serve` (plain, or over TLS with `tls`) with `concurrency` closed-loop
/// clients, one connection each.
async fn cfssl_phase(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    concurrency: usize,
    groups: &[cpu::Group],
    plan: load::Plan,
) -> anyhow::Result<load::Outcome> {
    let csr = signet_client::new_key_and_csr()?.csr_pem;
    let mut clients = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let conn = Arc::new(tokio::sync::Mutex::new(
            cfssl::Conn::connect(addr, &csr, tls).await?,
        ));
        clients.push(move || {
            let conn = conn.clone();
            async move { conn.lock().await.sign().await }
        });
    }
    let how = if tls.is_some() {
        "HTTP/1.1 over TLS"
    } else {
        "plain HTTP/1.1"
    };
    println!(
        "cfssl: {concurrency} clients over {concurrency} {how} connections to {addr} for {}",
        plan.describe()
    );
    phase(
        "cfssl signatures",
        groups,
        plan,
        load::closed_loop(clients, plan),
    )
    .await
}

pub async fn run(socket: &Path, args: BenchArgs) -> anyhow::Result<ExitCode> {
    let bundle = crate::typed_admin(socket)
        .await?
        .bundle()
        .await
        .map_err(|e| crate::call_err("bundle", &e))?;
    let bundle_pem = bundle.roots_pem();
    let token = match &args.token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading {}", p.display()))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let identity = if token.is_none() && args.workloads.is_none() {
        let id = format!("spiffe://{}/bench/client", bundle.trust_domain);
        let m = crate::mint_identity(socket, &id, Vec::new(), Duration::from_secs(3600)).await?;
        Some(signet_client::ClientIdentity {
            cert_chain_pem: m.chain_pem.into_bytes(),
            key_pem: m.key_pem.into_bytes(),
        })
    } else {
        None
    };

    let conns = if args.connections == 0 {
        args.concurrency.div_ceil(8).max(1)
    } else {
        args.connections
    };
    let trust_domain = args
        .trust_domain
        .as_deref()
        .unwrap_or(bundle.trust_domain.as_str())
        .parse()
        .map_err(|e| anyhow!("--trust-domain: {e}"))?;
    let roots = match &args.bundle {
        Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        None => bundle_pem.clone().into_bytes(),
    };
    let target = signet_client::ServerTarget::new(args.addr.clone(), roots, trust_domain)
        .with_server_name(args.server_name.clone());
    let plan = load::Plan {
        warmup: args.warmup,
        duration: args.duration,
        requests: args.requests,
    };
    if let Some(per_call) = args.workloads {
        let outcome = workloads::run(workloads::Workloads {
            socket,
            target: &target,
            per_call,
            concurrency: args.concurrency,
            connections: conns,
            ttl: args.ttl,
            plan,
            cpu: &args.cpu,
        })
        .await?;
        return finish(socket, args.no_verify, outcome.errors).await;
    }
    let mut channels = Vec::with_capacity(conns);
    for _ in 0..conns {
        channels.push(signet_client::connect(&target, identity.as_ref()).await?);
    }
    let jwt_call = {
        let channels = channels.clone();
        let token = token.clone();
        Arc::new(move |i: usize| {
            let mut client = signet_client::proto::ca::certificate_authority_client::CertificateAuthorityClient::new(
                channels[i % conns].clone(),
            );
            let token = token.clone();
            async move {
                let msg = signet_client::proto::ca::MintJwtSvidRequest {
                    audience: vec!["bench".to_owned()],
                    ttl_seconds: 0,
                };
                let req = match token.as_deref() {
                    Some(t) => signet_client::with_bearer(msg, t).map_err(|e| e.to_string())?,
                    None => tonic::Request::new(msg),
                };
                let resp = client
                    .mint_jwt_svid(req)
                    .await
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                if resp.get_ref().token.is_empty() {
                    return Err("the answer holds no token".to_owned());
                }
                Ok(())
            }
        })
    };
    let csr = Arc::new(signet_client::new_key_and_csr()?.csr_pem);
    let token = Arc::new(token);
    let ttl = args.ttl;
    // One request; `i` picks the connection.
    let call = move |i: usize| {
        let mut client = IstioCertificateServiceClient::new(channels[i % conns].clone());
        let csr = csr.clone();
        let token = token.clone();
        async move {
            let msg = IstioCertificateRequest {
                csr: (*csr).clone(),
                validity_duration: ttl,
                metadata: None,
            };
            let req = match token.as_deref() {
                Some(t) => signet_client::with_bearer(msg, t).map_err(|e| e.to_string())?,
                None => tonic::Request::new(msg),
            };
            let resp = client
                .create_certificate(req)
                .await
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
            if resp.get_ref().cert_chain.len() < 2 {
                return Err("the answer holds no certificate chain".to_owned());
            }
            Ok(())
        }
    };

    let tls = match &args.cfssl_ca {
        Some(p) => Some(cfssl::tls_config(
            &std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        )?),
        None => None,
    };
    let runs = [
        (&args.cfssl, None, "plain"),
        (&args.cfssl_tls, tls.as_ref(), "TLS"),
    ];
    let call = Arc::new(call);
    let rounds = args.rounds.max(1);
    let mut errs = 0;
    // Per round: Signet's rate, then each cfssl run's (plain, TLS), measured one after the
    // other, so a machine whose speed drifts shows it in the ratio's spread.
    let mut signet_rates = Vec::with_capacity(rounds);
    let mut cfssl_rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut jwt_rates = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        if rounds > 1 {
            println!("== round {round} of {rounds}");
        }
        let outcome = match args.rate {
            Some(rate) => {
                println!(
                    "bench: open loop at {rate:.0} requests/s over {conns} TLS connections to {} for {}",
                    args.addr,
                    plan.describe()
                );
                let call = call.clone();
                phase(
                    "certificates",
                    &args.cpu,
                    plan,
                    load::open_loop(move |i| call(i as usize), rate, plan),
                )
                .await?
            }
            None => {
                println!(
                    "bench: {} clients over {conns} TLS connections to {} for {}",
                    args.concurrency,
                    args.addr,
                    plan.describe()
                );
                let clients = (0..args.concurrency)
                    .map(|i| {
                        let call = call.clone();
                        move || call(i)
                    })
                    .collect();
                phase(
                    "certificates",
                    &args.cpu,
                    plan,
                    load::closed_loop(clients, plan),
                )
                .await?
            }
        };
        errs += outcome.errors;
        let signet_rate = outcome.rate();
        signet_rates.push(signet_rate);
        if args.jwt {
            println!(
                "bench: {} clients minting JWT-SVIDs over {conns} TLS connections to {} for {}",
                args.concurrency,
                args.addr,
                plan.describe()
            );
            let clients = (0..args.concurrency)
                .map(|i| {
                    let call = jwt_call.clone();
                    move || call(i)
                })
                .collect();
            let jwts = phase(
                "JWT-SVIDs",
                &args.cpu,
                plan,
                load::closed_loop(clients, plan),
            )
            .await?;
            errs += jwts.errors;
            jwt_rates.push(jwts.rate());
            println!(
                "side by side:  certificates {signet_rate:.0}/s, JWT-SVIDs {:.0}/s: JWT-SVIDs at {:.2}x certificates",
                jwts.rate(),
                jwts.rate() / signet_rate.max(1e-9)
            );
        }
        for (k, (addr, tls, how)) in runs.iter().enumerate() {
            let Some(addr) = addr else { continue };
            let theirs = cfssl_phase(addr, *tls, args.concurrency, &args.cpu, plan).await?;
            errs += theirs.errors;
            cfssl_rates[k].push(theirs.rate());
            println!(
                "side by side:  signet {signet_rate:.0}/s, cfssl ({how}) {:.0}/s: signet at {:.2}x cfssl",
                theirs.rate(),
                signet_rate / theirs.rate().max(1e-9)
            );
        }
    }
    if rounds > 1 {
        let signet = median(&signet_rates);
        println!("median of {rounds} rounds: signet {signet:.0}/s");
        if !jwt_rates.is_empty() {
            let jwt = median(&jwt_rates);
            println!(
                "median of {rounds} rounds: JWT-SVIDs {jwt:.0}/s: {:.2}x certificates",
                jwt / signet.max(1e-9)
            );
        }
        for (k, (_, _, how)) in runs.iter().enumerate() {
            if cfssl_rates[k].is_empty() {
                continue;
            }
            let ratios: Vec<f64> = signet_rates
                .iter()
                .zip(&cfssl_rates[k])
                .map(|(a, b)| a / b.max(1e-9))
                .collect();
            println!(
                "median of {rounds} rounds: cfssl ({how}) {:.0}/s: signet at {:.2}x cfssl \
                 (per round {:.2}x to {:.2}x)",
                median(&cfssl_rates[k]),
                signet / median(&cfssl_rates[k]).max(1e-9),
                ratios.iter().copied().fold(f64::INFINITY, f64::min),
                ratios.iter().copied().fold(0.0, f64::max),
            );
        }
    }
    finish(socket, args.no_verify, errs).await
}

/// The median of `v` (the mean of the middle two for an even count); 0 for none.
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Verifies the ledger (unless `no_verify`); fails the run on a broken chain or any error.
async fn finish(socket: &Path, no_verify: bool, errs: u64) -> anyhow::Result<ExitCode> {
    if !no_verify {
        match crate::verify_ledger(socket).await? {
            Ok(rows) => println!("ledger:        {rows} rows verified, hash chain intact"),
            Err(msg) => {
                println!("ledger:        BROKEN: {msg}");
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(if errs == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(super::median(&[]), 0.0);
        assert_eq!(super::median(&[3.0]), 3.0);
        assert_eq!(super::median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(super::median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
