//! Measuring the daemon against the echo server in alternating windows.
//!
//! On a shared virtual machine the speed of the CPU drifts by tens of
//! percent over tens of seconds (another tenant's load). Measuring the
//! daemon for ten seconds and then the echo server for ten seconds put that
//! drift into the ratio: the same daemon binary measured 0.49 to 0.68 of
//! the echo in six consecutive runs. With both servers up and the clients
//! connected to both, the scenarios measure them in alternating windows
//! (daemon, echo, daemon, echo, ...), so drift slower than a window
//! affects both alike; the per-round ratios show what remains.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_pki::Credentials;
use metropolis_transport::grpc::Channel;

use super::daemon::{DaemonProcess, free_addr};
use super::echo::EchoProcess;
use super::util::{
    CpuMeter, HostCpuMeter, RPC_TIMEOUT, Result, bounded, cpus, ms, percentile, row, tls_channel,
};

/// Pause before each window after the first of a server, for the previous
/// window's connections to settle (the first window has the warm-up).
const SETTLE: Duration = Duration::from_millis(300);

/// One TLS connection to `addr` per credential, presenting it.
pub async fn connect<'a>(
    addr: &str,
    credentials: impl Iterator<Item = &'a Credentials>,
) -> Result<Vec<Channel>> {
    futures::stream::iter(credentials)
        .map(|c| tls_channel(addr, c))
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Waits for the client loops of a window (`what` names one in errors)
/// and adds up their outcomes.
pub async fn join(
    loops: Vec<tokio::task::JoinHandle<ClientOutcome>>,
    what: &'static str,
) -> Result<ClientOutcome> {
    let mut all = ClientOutcome::default();
    for task in loops {
        let out = bounded(RPC_TIMEOUT * 2, || what.into(), task)
            .await?
            .map_err(|e| format!("{what} failed: {e}"))?;
        all.merge(out);
    }
    Ok(all)
}

/// How the daemon and the echo server are measured against each other.
pub struct Plan {
    /// Windows per server.
    pub rounds: usize,
    /// Unmeasured warm-up before the first window of each server.
    pub warmup: Duration,
    /// Length of each window.
    pub seconds: Duration,
    /// What the calls are called in the progress lines ("req/s").
    pub unit: &'static str,
    /// The load levels, named for the progress lines ("128 clients"): each
    /// round measures every level on each server. One level with an empty
    /// name for a scenario with a single load.
    pub levels: Vec<String>,
}

/// The windows of one load level: the daemon's and the echo server's, one
/// per round each.
pub struct LevelWindows {
    /// The daemon's windows.
    pub daemon: Vec<Window>,
    /// The echo server's windows.
    pub echo: Vec<Window>,
}

/// Starts the echo server beside `daemon` (with the daemon's PKI, logging
/// into `work`), connects to both (the daemon at `daemon_addr`) with one
/// TLS connection per credential, measures them in alternating windows
/// (`window(channels, warm-up, server pid, level)` measures one at the
/// level with that index in [`Plan::levels`]; each round runs every level
/// on the daemon, then on the echo server), prints each round, and stops
/// both. Returns the windows of each level.
pub async fn against_echo<'c, F, Fut>(
    daemon: &mut DaemonProcess,
    daemon_addr: &str,
    credentials: impl Iterator<Item = &'c Credentials> + Clone,
    work: &Path,
    plan: &Plan,
    mut window: F,
) -> Result<Vec<LevelWindows>>
where
    F: FnMut(Vec<Channel>, Duration, u32, usize) -> Fut,
    Fut: Future<Output = Result<Window>>,
{
    let echo_addr = free_addr()?;
    let mut echo = EchoProcess::start(&echo_addr, &daemon.pki_dir(), &work.join("echo.log"))?;
    let (daemon_pid, echo_pid) = (daemon.pid()?, echo.pid()?);
    let to_daemon = connect(daemon_addr, credentials.clone()).await?;
    let to_echo = connect(&echo_addr, credentials).await?;
    println!(
        "  echo server pid {echo_pid} on {echo_addr}; {} rounds of {:?} on each server, \
         alternating (warm-up {:?} before the first of each) ...",
        plan.rounds, plan.seconds, plan.warmup
    );
    let mut levels: Vec<LevelWindows> = plan
        .levels
        .iter()
        .map(|_| LevelWindows {
            daemon: Vec::new(),
            echo: Vec::new(),
        })
        .collect();
    for round in 0..plan.rounds {
        let settle = if round == 0 { plan.warmup } else { SETTLE };
        for (level, (name, windows)) in plan.levels.iter().zip(&mut levels).enumerate() {
            let d = window(to_daemon.clone(), settle, daemon_pid, level).await?;
            let e = window(to_echo.clone(), settle, echo_pid, level).await?;
            let name = if name.is_empty() {
                String::new()
            } else {
                format!(", {name}")
            };
            println!(
                "  round {}{name}: daemon {:.0} {unit}, echo {:.0} {unit}, ratio {:.3}",
                round + 1,
                d.rps(),
                e.rps(),
                d.rps() / e.rps().max(f64::MIN_POSITIVE),
                unit = plan.unit,
            );
            windows.daemon.push(d);
            windows.echo.push(e);
        }
    }
    daemon.check_alive()?;
    echo.check_alive()?;
    drop((to_daemon, to_echo));
    daemon.stop();
    echo.stop();
    Ok(levels)
}

/// What the clients saw in one window.
#[derive(Default)]
pub struct ClientOutcome {
    /// Latency of each call that started and ended inside the window.
    pub latencies_us: Vec<u64>,
    /// Failed calls.
    pub errors: u64,
    /// The first failure, described.
    pub first_error: Option<String>,
}

/// A closed loop gives up after this many failed calls.
const MAX_ERRORS_PER_CLIENT: u64 = 100;

impl ClientOutcome {
    /// Records one call that ran from `start` to `end`, counted when it
    /// lies inside the window `from..until`, or its failure; true when the
    /// loop should give up (too many failures).
    pub fn record(
        &mut self,
        start: Instant,
        end: Instant,
        from: Instant,
        until: Instant,
        failure: Option<String>,
    ) -> bool {
        match failure {
            None => {
                if start >= from && end <= until {
                    self.latencies_us
                        .push(super::util::micros_since(start, end));
                }
                false
            }
            Some(why) => {
                self.errors += 1;
                self.first_error.get_or_insert(why);
                self.errors >= MAX_ERRORS_PER_CLIENT
            }
        }
    }

    /// Adds another client's outcome.
    pub fn merge(&mut self, other: ClientOutcome) {
        self.latencies_us.extend(other.latencies_us);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// One measured window against one server.
pub struct Window {
    /// What the clients saw.
    pub outcome: ClientOutcome,
    /// Its length.
    pub seconds: f64,
    /// Cores busy in the server process, in this (load) process, and on
    /// the whole machine.
    pub server_cores: f64,
    /// See `server_cores`.
    pub client_cores: f64,
    /// See `server_cores`.
    pub host_cores: f64,
}

impl Window {
    /// Completed calls per second.
    pub fn rps(&self) -> f64 {
        self.outcome.latencies_us.len() as f64 / self.seconds
    }
}

/// Measures one window: starts the clients with `start(from, until)`
/// (they measure calls inside `from..until` and stop at `until`), samples
/// CPU of `server_pid` over the window, and collects the clients'
/// outcomes.
pub async fn measure<F, Fut>(
    warmup: Duration,
    seconds: Duration,
    server_pid: u32,
    start: F,
) -> Result<Window>
where
    F: FnOnce(Instant, Instant) -> Fut,
    Fut: Future<Output = Result<ClientOutcome>>,
{
    let from = Instant::now() + warmup;
    let until = from + seconds;
    let clients = start(from, until);
    let meters = async {
        tokio::time::sleep_until(from.into()).await;
        let server = CpuMeter::start(server_pid)?;
        let client = CpuMeter::start(std::process::id())?;
        let host = HostCpuMeter::start()?;
        tokio::time::sleep_until(until.into()).await;
        Ok::<_, super::util::Error>((server.cores()?, client.cores()?, host.cores()?))
    };
    let (outcome, cores) = futures::join!(clients, meters);
    let (server_cores, client_cores, host_cores) = cores?;
    Ok(Window {
        outcome: outcome?,
        seconds: seconds.as_secs_f64(),
        server_cores,
        client_cores,
        host_cores,
    })
}

/// The figures of one server over all its windows.
pub struct Totals {
    /// Calls completed in the windows.
    pub requests: u64,
    /// Calls per second over the windows.
    pub rps: f64,
    /// Latency percentiles over every call of every window.
    pub p50_us: u64,
    /// See `p50_us`.
    pub p99_us: u64,
    /// The slowest call.
    pub max_us: u64,
    /// Failed calls.
    pub errors: u64,
    /// The first failure, described.
    pub first_error: Option<String>,
    /// Average cores busy over the windows (see [`Window`]).
    pub server_cores: f64,
    /// See `server_cores`.
    pub client_cores: f64,
    /// See `server_cores`.
    pub host_cores: f64,
}

impl Totals {
    /// Sums up `windows`.
    pub fn of(windows: Vec<Window>) -> Totals {
        let n = windows.len().max(1) as f64;
        let seconds: f64 = windows.iter().map(|w| w.seconds).sum();
        let mean = |f: fn(&Window) -> f64| windows.iter().map(f).sum::<f64>() / n;
        let (server_cores, client_cores, host_cores) = (
            mean(|w| w.server_cores),
            mean(|w| w.client_cores),
            mean(|w| w.host_cores),
        );
        let mut all = ClientOutcome::default();
        for w in windows {
            all.merge(w.outcome);
        }
        all.latencies_us.sort_unstable();
        let requests = all.latencies_us.len() as u64;
        Totals {
            requests,
            rps: if seconds > 0.0 {
                requests as f64 / seconds
            } else {
                0.0
            },
            p50_us: percentile(&all.latencies_us, 50.0),
            p99_us: percentile(&all.latencies_us, 99.0),
            max_us: all.latencies_us.last().copied().unwrap_or(0),
            errors: all.errors,
            first_error: all.first_error,
            server_cores,
            client_cores,
            host_cores,
        }
    }
}

/// Table rows with the figures of one server, `name`, whose calls per
/// second are shown as `unit` ("requests/s").
pub fn server_rows(rows: &mut Vec<(String, String)>, name: &str, unit: &str, s: &Totals) {
    rows.push(row(&format!("{name}: calls in window"), s.requests));
    rows.push(row(&format!("{name}: {unit}"), format!("{:.0}", s.rps)));
    rows.push(row(&format!("{name}: p50 ms"), ms(s.p50_us)));
    rows.push(row(&format!("{name}: p99 ms"), ms(s.p99_us)));
    rows.push(row(&format!("{name}: max ms"), ms(s.max_us)));
    rows.push(row(&format!("{name}: errors"), s.errors));
    rows.push(row(
        &format!("{name}: server CPU (cores)"),
        format!("{:.2}", s.server_cores),
    ));
    rows.push(row(
        &format!("{name}: client CPU (cores)"),
        format!("{:.2}", s.client_cores),
    ));
    rows.push(row(
        &format!("{name}: machine CPU, all processes"),
        format!("{:.2} of {}", s.host_cores, cpus()),
    ));
}

/// Prints the first failure the clients saw on each server, if any.
pub fn print_first_errors(daemon: &Totals, echo: &Totals) {
    for (name, s) in [("daemon", daemon), ("echo", echo)] {
        if let Some(why) = &s.first_error {
            println!("  {name}: first error: {why}");
        }
    }
}

/// `a / b`, 0 when `b` is 0 (a server that completed nothing).
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The daemon's CPU time per call over the echo server's (from their
/// cores busy and calls per second over the measured windows): it moves
/// less than the throughput ratio when other tenants take CPU, since both
/// sides' calls get slower together. 0 when either side served nothing.
pub fn cpu_per_call_ratio(daemon: &Totals, echo: &Totals) -> f64 {
    ratio(
        ratio(daemon.server_cores, daemon.rps),
        ratio(echo.server_cores, echo.rps),
    )
}

/// The daemon/echo ratio of calls per second in each round, and their
/// median.
pub fn round_ratios(daemon: &[Window], echo: &[Window]) -> (Vec<f64>, f64) {
    let ratios: Vec<f64> = daemon
        .iter()
        .zip(echo)
        .map(|(d, e)| ratio(d.rps(), e.rps()))
        .collect();
    let median = median(&ratios);
    (ratios, median)
}

/// The median of `values` (0 for none).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The ratios, formatted for a table cell.
pub fn format_ratios(ratios: &[f64]) -> String {
    ratios
        .iter()
        .map(|r| format!("{r:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}
