//! `signetctl bench`: N concurrent clients issue through the Istio CSR API over TLS, then
//! the ledger is verified. Prints issuances per second, latency percentiles and the number of
//! ledger rows verified.
//!
//! The clients authenticate with mTLS using an identity minted on the admin socket (or with a
//! service-account token from `--token-file`). Each request carries a CSR with no names, so
//! the server fills in the caller's identity: the full authn -> policy -> sign -> commit path.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args;
use signet_client::istio_ca::IstioCertificateRequest;
use signet_client::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use tonic::transport::Channel;

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
    /// Requested certificate lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl: i64,
    /// Authenticate with this service-account token instead of a minted client certificate.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Skip the ledger verification at the end.
    #[arg(long)]
    no_verify: bool,
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
    let identity = if token.is_none() {
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
    let mut channels = Vec::with_capacity(conns);
    for _ in 0..conns {
        channels.push(signet_client::connect(&target, identity.as_ref()).await?);
    }
    let csr = Arc::new(signet_client::new_key_and_csr()?.csr_pem);
    let token = Arc::new(token);

    println!(
        "bench: {} clients over {} TLS connections to {} for {} (+{} warm-up)",
        args.concurrency,
        conns,
        args.addr,
        humantime::format_duration(args.duration),
        humantime::format_duration(args.warmup)
    );

    let start = Instant::now();
    let measure_from = start + args.warmup;
    let stop_at = measure_from + args.duration;
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let mut tasks = Vec::with_capacity(args.concurrency);
    for i in 0..args.concurrency {
        let ch: Channel = channels[i % conns].clone();
        let csr = csr.clone();
        let token = token.clone();
        let errors = errors.clone();
        let first_error = first_error.clone();
        let ttl = args.ttl;
        tasks.push(tokio::spawn(async move {
            let mut client = IstioCertificateServiceClient::new(ch);
            let mut lat = Vec::with_capacity(4096);
            loop {
                let t0 = Instant::now();
                if t0 >= stop_at {
                    break;
                }
                let msg = IstioCertificateRequest {
                    csr: (*csr).clone(),
                    validity_duration: ttl,
                    metadata: None,
                };
                let req = match token.as_deref() {
                    Some(t) => match signet_client::with_bearer(msg, t) {
                        Ok(r) => r,
                        Err(_) => break,
                    },
                    None => tonic::Request::new(msg),
                };
                match client.create_certificate(req).await {
                    Ok(resp) => {
                        if t0 >= measure_from && resp.get_ref().cert_chain.len() >= 2 {
                            lat.push(t0.elapsed());
                        }
                    }
                    Err(s) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let mut fe = first_error.lock().unwrap_or_else(|e| e.into_inner());
                        if fe.is_none() {
                            *fe = Some(format!("{:?}: {}", s.code(), s.message()));
                        }
                    }
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| anyhow!("client task: {e}"))?);
    }
    let measured = stop_at.saturating_duration_since(measure_from);
    all.sort_unstable();
    let n = all.len();
    let pct = |p: f64| -> Duration {
        if n == 0 {
            return Duration::ZERO;
        }
        let idx = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
        all[idx]
    };
    let rate = n as f64 / measured.as_secs_f64();
    println!(
        "issued:        {n} certificates in {:.1}s",
        measured.as_secs_f64()
    );
    println!("throughput:    {rate:.0} issuances/s");
    println!(
        "latency:       p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        all.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    let errs = errors.load(Ordering::Relaxed);
    println!("errors:        {errs}");
    if let Some(e) = first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        println!("first error:   {e}");
    }
    if !args.no_verify {
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
