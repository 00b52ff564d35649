//! The two ways the bench loads a server, independent of what a request is: closed loop (N
//! clients, each sending its next request when the last one answered: the maximum rate) and
//! open loop (requests sent on a fixed schedule of R per second whatever the answers: the
//! latency at a given rate). Both return an [`Outcome`] that prints the same figures.
//!
//! In the open loop a request's latency counts from when it was *due*, not from when it was
//! sent, so a server (or a load generator) that falls behind shows up in the percentiles
//! instead of silently lowering the rate (no coordinated omission).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use signet_runtime::clock::{Clock, SystemClock};

/// A benchmark measures wall time, so it reads the real clock, named here rather than through
/// `Instant::now()` (which `clippy.toml` bans outside the clock module).
const REAL_CLOCK: SystemClock = SystemClock;

/// How long or how much to run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// Not measured: the first requests (connection set-up, caches).
    pub warmup: Duration,
    /// Measured, after the warm-up.
    pub duration: Duration,
    /// Instead of a duration: exactly this many requests, all measured, no warm-up.
    pub requests: Option<u64>,
}

impl Plan {
    /// What the run covers, for the banner.
    pub(super) fn describe(&self) -> String {
        match self.requests {
            Some(n) => format!("{n} requests"),
            None => format!(
                "{} (+{} warm-up)",
                humantime::format_duration(self.duration),
                humantime::format_duration(self.warmup)
            ),
        }
    }
}

/// What a run measured.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Latencies of the measured successful requests, sorted.
    pub latencies: Vec<Duration>,
    /// The measured window.
    pub elapsed: Duration,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Open loop only: the rate asked for.
    pub offered: Option<f64>,
}

impl Outcome {
    pub(super) fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `p` quantile (0 < p <= 1) of the latencies.
    pub(super) fn quantile(&self, p: f64) -> Duration {
        let n = self.latencies.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let idx = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
        self.latencies[idx]
    }

    /// Prints the figures, each line starting with `label`'s column.
    pub(super) fn print(&self, what: &str) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "issued:        {} {what} in {:.1}s",
            self.latencies.len(),
            self.elapsed.as_secs_f64()
        );
        match self.offered {
            Some(r) => println!("throughput:    {:.0}/s (offered {r:.0}/s)", self.rate()),
            None => println!("throughput:    {:.0}/s", self.rate()),
        }
        println!(
            "latency:       p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(self.quantile(0.50)),
            ms(self.quantile(0.99)),
            ms(self.latencies.last().copied().unwrap_or_default())
        );
        println!("errors:        {}", self.errors);
        if let Some(e) = &self.first_error {
            println!("first error:   {e}");
        }
    }
}

/// Errors and the first error's message, shared by the tasks of a run.
#[derive(Default)]
struct Errors {
    count: u64,
    first: Option<String>,
}

/// Counts a failed request; the first one's message is kept for the report.
fn note_error(errors: &Mutex<Errors>, e: impl std::fmt::Display) {
    let mut g = errors.lock().unwrap_or_else(|p| p.into_inner());
    g.count += 1;
    if g.first.is_none() {
        g.first = Some(e.to_string());
    }
}

fn finish(mut latencies: Vec<Duration>, elapsed: Duration, errors: &Mutex<Errors>) -> Outcome {
    latencies.sort_unstable();
    let mut g = errors.lock().unwrap_or_else(|p| p.into_inner());
    Outcome {
        latencies,
        elapsed,
        errors: g.count,
        first_error: g.first.take(),
        offered: None,
    }
}

/// Closed loop: each client sends a request, waits for the answer, sends the next.
pub(super) async fn closed_loop<F, Fut, E>(clients: Vec<F>, plan: Plan) -> anyhow::Result<Outcome>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: std::fmt::Display,
{
    let start = REAL_CLOCK.monotonic();
    let (measure_from, stop_at) = match plan.requests {
        // A fixed count: the deadline only guards against a stuck server.
        Some(_) => (start, start + Duration::from_secs(24 * 3600)),
        None => (start + plan.warmup, start + plan.warmup + plan.duration),
    };
    let tickets = Arc::new(std::sync::atomic::AtomicU64::new(
        plan.requests.unwrap_or(u64::MAX),
    ));
    let errors = Arc::new(Mutex::new(Errors::default()));
    let mut tasks = Vec::with_capacity(clients.len());
    for mut call in clients {
        let errors = errors.clone();
        let tickets = tickets.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(4096);
            loop {
                let t0 = REAL_CLOCK.monotonic();
                if t0 >= stop_at || !take_ticket(&tickets) {
                    break;
                }
                match call().await {
                    Ok(()) if t0 >= measure_from => lat.push(t0.elapsed()),
                    Ok(()) => {}
                    Err(e) => note_error(&errors, e),
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| anyhow::anyhow!("client task: {e}"))?);
    }
    let elapsed = match plan.requests {
        Some(_) => start.elapsed(),
        None => stop_at.saturating_duration_since(measure_from),
    };
    Ok(finish(all, elapsed, &errors))
}

/// Takes one request from a `--requests` budget; false once it is spent.
fn take_ticket(tickets: &std::sync::atomic::AtomicU64) -> bool {
    use std::sync::atomic::Ordering;
    tickets
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

/// Most requests in flight in the open loop; past it a due request is counted as an error
/// (the server is not keeping up with the offered rate).
const MAX_IN_FLIGHT: usize = 8192;

/// Open loop: request `i` is due at `start + i / rate`, sent then whatever is in flight.
///
/// One task drives everything: a 1 ms tick sends every request that has come due since the
/// last tick, and the answers are awaited together (`FuturesUnordered`), so the generator costs
/// one timer wake-up per millisecond and no task per request. A request's latency counts from
/// when it was due, so the tick's granularity and any lateness of the generator itself count
/// against the latency, never hide it.
pub(super) async fn open_loop<F, Fut, E>(call: F, rate: f64, plan: Plan) -> anyhow::Result<Outcome>
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    use futures::StreamExt as _;
    use futures::stream::FuturesUnordered;

    anyhow::ensure!(
        rate.is_finite() && rate > 0.0,
        "--rate must be a positive number of requests per second"
    );
    let start = REAL_CLOCK.monotonic();
    let measure_from = start + plan.warmup;
    let stop_at = measure_from + plan.duration;
    let errors = Mutex::new(Errors::default());
    let mut latencies = Vec::new();
    let mut in_flight = FuturesUnordered::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let due_at = |i: u64| start + Duration::from_secs_f64(i as f64 / rate);
    let mut next = 0u64;
    let mut sending = true;
    while sending || !in_flight.is_empty() {
        tokio::select! {
            _ = tick.tick(), if sending => {
                let now = REAL_CLOCK.monotonic();
                loop {
                    if plan.requests.is_some_and(|n| next >= n) {
                        sending = false;
                        break;
                    }
                    let due = due_at(next);
                    if plan.requests.is_none() && due >= stop_at {
                        sending = false;
                        break;
                    }
                    if due > now {
                        break;
                    }
                    if in_flight.len() >= MAX_IN_FLIGHT {
                        note_error(
                            &errors,
                            format!("more than {MAX_IN_FLIGHT} requests in flight"),
                        );
                    } else {
                        let measured = plan.requests.is_some() || due >= measure_from;
                        let fut = call(next);
                        in_flight.push(async move { (fut.await, due, measured) });
                    }
                    next += 1;
                }
            }
            Some((r, due, measured)) = in_flight.next(), if !in_flight.is_empty() => {
                match r {
                    Ok(()) if measured => latencies.push(due.elapsed()),
                    Ok(()) => {}
                    Err(e) => note_error(&errors, e),
                }
            }
        }
    }
    let elapsed = match plan.requests {
        Some(_) => start.elapsed(),
        None => stop_at.saturating_duration_since(measure_from),
    };
    let mut out = finish(latencies, elapsed, &errors);
    out.offered = Some(rate);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_upper_rank() {
        let out = Outcome {
            latencies: (1..=100).map(Duration::from_millis).collect(),
            elapsed: Duration::from_secs(2),
            ..Outcome::default()
        };
        assert_eq!(out.quantile(0.5), Duration::from_millis(50));
        assert_eq!(out.quantile(0.99), Duration::from_millis(99));
        assert_eq!(out.quantile(1.0), Duration::from_millis(100));
        assert_eq!(out.rate(), 50.0);
        assert_eq!(Outcome::default().quantile(0.99), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_fixed_count_runs_exactly_that_many() {
        let plan = Plan {
            warmup: Duration::ZERO,
            duration: Duration::ZERO,
            requests: Some(10),
        };
        let clients = (0..3).map(|_| || async { Ok::<(), String>(()) }).collect();
        let out = closed_loop(clients, plan).await.expect("run");
        assert_eq!(out.latencies.len(), 10);
        let out = open_loop(|_| async { Err("no".to_owned()) }, 1e6, plan)
            .await
            .expect("run");
        assert_eq!((out.latencies.len(), out.errors), (0, 10));
        assert_eq!(out.first_error.as_deref(), Some("no"));
    }
}
