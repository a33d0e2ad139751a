//! Scenario `fanout-etcd` (issue 6): the same node updates fanned out to
//! many watchers in two ways, in one run against one etcd:
//!
//! 1. **curator**: `Watch(NodesInCluster)` streams over the daemon's UNIX
//!    socket; the daemon (elected over etcd) holds one etcd watch of
//!    `/nodes/` and fans out from its watch cache;
//! 2. **direct**: as many etcd watches of `/nodes/`, opened by this process
//!    on a number of etcd clients, as if every watcher went to etcd itself.
//!
//! In both phases the same writer nodes send `UpdateNodeStatus` through the
//! daemon (closed loop by default, or at `--rate`) for the same time.
//! Measured per phase: node states delivered to all watchers per second,
//! latency from a writer's acknowledgement to a watcher's arrival (on up
//! to [`LATENCY_SAMPLE`] watchers), the serving process's (daemon's or
//! etcd's) RSS per idle watcher, etcd's and the daemon's CPU, updates
//! acknowledged per second, and etcd's own count of watchers (its
//! `/metrics` endpoint).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use metropolis_core::curator::NODES_PREFIX;
use metropolis_core::ports::WatchBatch;
use metropolis_core::store::{EventKind, KeyRange, StoreError};
use metropolis_etcd::{EtcdConfig, EtcdStore};
use metropolis_proto::prelude::curator;
use metropolis_proto::prelude::curator::curator_client::CuratorClient;
use metropolis_tests::etcd::Etcd;
use metropolis_transport::grpc::Channel;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;

use super::daemon::{DaemonProcess, Target};
use super::fanout::{
    Connections, Dial, LiteStatus, Marker, Next, next_event, open_reporting, open_watch, wait_ready,
};
use super::util::{
    Context, CpuMeter, HostCpuMeter, RPC_TIMEOUT, Result, add_nodes, bounded, cpus, micros_since,
    ms, percentile, print_table, row, rss_kib, status, tls_channel, unix_channel,
};

/// Arguments of `fanout-etcd`.
#[derive(clap::Args, Debug, Clone)]
pub struct FanoutEtcdArgs {
    /// Nodes to create (through NodeManagement.AddNode, as the owner); the
    /// daemon's own node comes on top. Every curator stream receives them
    /// as its backlog; the direct watchers start at the current revision.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Watchers in each phase: Watch streams through the curator, then
    /// direct etcd watches.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Nodes sending the updates, each over its own TLS connection with its
    /// own credential. At most --nodes.
    #[arg(long, default_value_t = 100)]
    pub writers: usize,
    /// How long the updates are sent in each phase.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Total UpdateNodeStatus calls per second, on a fixed schedule (a
    /// writer still waits for its previous acknowledgement). 0: closed
    /// loop, each writer sends its next update when the previous one is
    /// acknowledged.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// etcd clients (one gRPC connection each) the direct watches are
    /// spread over; each watch is its own gRPC stream on its client.
    #[arg(long, default_value_t = 100)]
    pub etcd_clients: usize,
    /// Curator streams multiplexed on one HTTP/2 connection to the daemon.
    #[arg(long, default_value_t = 1)]
    pub streams_per_connection: usize,
    /// The daemon's --lease-ttl (seconds) for its leadership lease.
    #[arg(long, default_value_t = 10)]
    pub lease_ttl: u64,
    /// AddNode calls in flight while creating the nodes.
    #[arg(long, default_value_t = 32)]
    pub add_concurrency: usize,
    /// Curator streams opening (connecting and reading their backlog) at a
    /// time.
    #[arg(long, default_value_t = 50)]
    pub open_concurrency: usize,
    /// Seconds to wait for every watcher of a phase to be open.
    #[arg(long, default_value_t = 600)]
    pub open_timeout: u64,
    /// Seconds to wait after the last update of a phase for every watcher
    /// to receive every writer's last acknowledged state.
    #[arg(long, default_value_t = 30)]
    pub drain_timeout: u64,
}

/// `curator.private.NodeRecord` as stored in etcd: its status only (of
/// which [`LiteStatus`] decodes the writers' marker).
#[derive(Clone, PartialEq, prost::Message)]
struct LiteRecord {
    #[prost(message, optional, tag = "5")]
    status: Option<LiteStatus>,
}

// ---------------------------------------------------------------- etcd

/// The etcd binary the helper runs (`$ETCD_BIN`, else `etcd` on the PATH),
/// or a clear error if there is none.
fn find_etcd() -> Result<String> {
    let name = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into());
    let found = if name.contains('/') {
        Path::new(&name).is_file()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(&name).is_file()))
    };
    if found {
        Ok(name)
    } else {
        Err(format!(
            "fanout-etcd needs etcd: {name} is not on the PATH (install the Debian package \
             etcd-server, or set ETCD_BIN to its path)"
        )
        .into())
    }
}

/// Starts a one-member etcd (the test helper panics on failure: its
/// message becomes the error).
async fn start_etcd() -> Result<Etcd> {
    match tokio::task::spawn_blocking(Etcd::start).await {
        Ok(etcd) => Ok(etcd),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let why = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "no message".into());
            Err(format!("starting etcd: {why}").into())
        }
        Err(e) => Err(format!("starting etcd: {e}").into()),
    }
}

/// etcd's Prometheus metrics: each name (labels dropped) to the sum of its
/// samples.
struct Metrics(HashMap<String, f64>);

impl Metrics {
    /// The value of `name`, if etcd exports it.
    fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// The value of `name` as a whole number, or "n/a".
    fn show(&self, name: &str) -> String {
        self.get(name).map_or("n/a".into(), |v| format!("{v:.0}"))
    }
}

/// Watcher count: etcd's gauge of open watchers.
const WATCHERS: &str = "etcd_debugging_mvcc_watcher_total";
/// etcd's gauge of open gRPC watch streams.
const WATCH_STREAMS: &str = "etcd_debugging_mvcc_watch_stream_total";
/// etcd's gauge of watchers behind (unsynced, or with events pending).
const SLOW_WATCHERS: &str = "etcd_debugging_mvcc_slow_watcher_total";
/// etcd's counter of watch events sent.
const EVENTS_SENT: &str = "etcd_debugging_mvcc_events_total";
/// etcd's counter of bytes sent to gRPC clients.
const GRPC_SENT_BYTES: &str = "etcd_network_client_grpc_sent_bytes_total";

/// Reads `http://<addr>/metrics`. HTTP/1.0, so that etcd (Go's net/http)
/// answers with a plain body up to the end of the connection, without
/// chunked encoding to undo.
async fn etcd_metrics(addr: &str) -> Result<Metrics> {
    let what = || format!("GET http://{addr}/metrics");
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await?;
        conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut response = Vec::new();
        conn.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = bounded(Duration::from_secs(10), what, fetch)
        .await?
        .context(what)?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{}: no end of headers in the response", what()))?;
    let status_line = head.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) != Some("200") {
        return Err(format!("{}: {status_line}", what()).into());
    }
    let mut values = HashMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series).trim();
        *values.entry(name.to_string()).or_insert(0.0) += value;
    }
    if values.is_empty() {
        return Err(format!("{}: no metric in the response", what()).into());
    }
    Ok(Metrics(values))
}

/// Waits until etcd counts at least `n` watchers, for at most `limit`;
/// returns the last metrics read.
async fn wait_watchers(addr: &str, n: f64, limit: Duration) -> Result<Metrics> {
    let deadline = Instant::now() + limit;
    loop {
        let metrics = etcd_metrics(addr).await?;
        let have = metrics.get(WATCHERS).unwrap_or(0.0);
        if have >= n {
            return Ok(metrics);
        }
        if Instant::now() >= deadline {
            return Err(
                format!("etcd counts {have} watchers after {limit:?}, expected {n}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------- watchers

/// What the watchers of one phase share with the main task.
struct Shared {
    /// Origin of every µs timestamp (before the watchers open).
    origin: Instant,
    /// When the updates stop being sent, µs since `origin` (`u64::MAX`
    /// until they start).
    window_end_us: AtomicU64,
    writers: usize,
    /// Per watcher and writer, the highest sequence number seen.
    seen: Vec<AtomicU32>,
    /// Per watcher, whether it still runs.
    alive: Vec<AtomicBool>,
    /// Every `sample_stride`-th watcher records its arrivals for the
    /// latency figures (at most [`LATENCY_SAMPLE`] watchers do).
    sample_stride: usize,
}

/// Most watchers per phase that record every arrival for the latency
/// figures; the others only count.
const LATENCY_SAMPLE: usize = 1000;

impl Shared {
    /// Every watcher starts having seen sequence number `base[w]` of
    /// writer `w` (what the writers sent before this phase).
    fn new(streams: usize, base: &[u32]) -> Result<Arc<Shared>> {
        let writers = base.len();
        streams
            .checked_mul(writers)
            .ok_or("--streams x --writers is too large")?;
        Ok(Arc::new(Shared {
            origin: Instant::now(),
            window_end_us: AtomicU64::new(u64::MAX),
            writers,
            seen: (0..streams)
                .flat_map(|_| base.iter().map(|&b| AtomicU32::new(b)))
                .collect(),
            alive: (0..streams).map(|_| AtomicBool::new(true)).collect(),
            sample_stride: streams.div_ceil(LATENCY_SAMPLE).max(1),
        }))
    }

    /// Whether watcher `index` records its arrivals.
    fn sampled(&self, index: usize) -> bool {
        index.is_multiple_of(self.sample_stride)
    }

    /// Whether every live watcher has seen `last[w]` of every writer `w`.
    fn caught_up(&self, last: &[u32]) -> bool {
        (0..self.alive.len()).all(|s| {
            !self.alive[s].load(Ordering::Acquire)
                || last
                    .iter()
                    .enumerate()
                    .all(|(w, &l)| self.seen[s * self.writers + w].load(Ordering::Acquire) >= l)
        })
    }
}

/// What one watcher received after it was open.
#[derive(Default)]
struct Tally {
    /// Writer states newer than any seen before (each update at most once).
    delivered: u64,
    /// Of those, arrived before the updates stopped being sent.
    in_window: u64,
    /// Writer states skipped between two received ones (coalesced).
    gaps: u64,
    /// Writer states not newer than one already seen (never expected).
    stale: u64,
    /// Other node states (no writer's sequence number: e.g. the daemon's
    /// own node).
    other: u64,
    /// Messages received (WatchEvents, or etcd watch batches).
    messages: u64,
    /// Arrival of the last writer state, µs since the phase started.
    last_at_us: u64,
    /// Nodes in the backlog (curator streams).
    backlog_nodes: u64,
    /// Writer states received by a sampled watcher: writer, sequence
    /// number, arrival (µs since the origin).
    arrivals: Vec<(u32, u32, u64)>,
    /// Whether this watcher records `arrivals`.
    sampled: bool,
    error: Option<String>,
}

impl Tally {
    /// Records one node state whose status carries `marker`, arriving at
    /// `at_us` (µs since the origin) while the updates stop at
    /// `window_us`.
    fn record(&mut self, seen: &[AtomicU32], marker: Option<Marker>, at_us: u64, window_us: u64) {
        let Some(marker) = marker else {
            self.other += 1;
            return;
        };
        let (Ok(writer), Ok(seq)) = (usize::try_from(marker.writer), u32::try_from(marker.seq))
        else {
            self.other += 1;
            return;
        };
        let Some(slot) = seen.get(writer).filter(|_| seq > 0) else {
            self.other += 1;
            return;
        };
        let last = slot.load(Ordering::Relaxed);
        if seq <= last {
            self.stale += 1;
            return;
        }
        self.gaps += u64::from(seq - last - 1);
        slot.store(seq, Ordering::Release);
        self.delivered += 1;
        if self.sampled {
            // `writer` indexes `seen`, whose length came from a u32 count.
            self.arrivals.push((writer as u32, seq, at_us));
        }
        if at_us <= window_us {
            self.in_window += 1;
        }
        self.last_at_us = self.last_at_us.max(at_us);
    }
}

/// Curator stream `index`: opens (holding an `open` permit until its
/// backlog is in), reports readiness, then tallies every node state it
/// receives until `stop`.
async fn run_curator_stream(
    index: usize,
    connections: Arc<Connections>,
    shared: Arc<Shared>,
    open: Arc<Semaphore>,
    ready: mpsc::UnboundedSender<Result<()>>,
    mut stop: watch::Receiver<bool>,
) -> Tally {
    let mut out = Tally {
        sampled: shared.sampled(index),
        ..Tally::default()
    };
    let alive = &shared.alive[index];
    let label = "curator stream";
    let mut stream = match open_reporting(label, index, &connections, &open, &ready, alive).await {
        Ok((s, backlog_nodes)) => {
            out.backlog_nodes = backlog_nodes;
            s
        }
        Err(msg) => {
            out.error = Some(msg);
            return out;
        }
    };
    let seen = &shared.seen[index * shared.writers..(index + 1) * shared.writers];
    loop {
        let event = match next_event(label, index, &mut stream, &mut stop).await {
            Next::Event(event) => event,
            Next::Stopped => break,
            Next::Ended(why) => {
                out.error = Some(why);
                break;
            }
        };
        let at_us = micros_since(shared.origin, Instant::now());
        let window_us = shared.window_end_us.load(Ordering::Relaxed);
        out.messages += 1;
        for marker in event.markers() {
            out.record(seen, marker, at_us, window_us);
        }
    }
    shared.alive[index].store(false, Ordering::Release);
    out
}

/// Direct etcd watch `index`: tallies every node record put it receives
/// until `stop`.
async fn run_direct_watch(
    index: usize,
    mut stream: BoxStream<'static, std::result::Result<WatchBatch, StoreError>>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> Tally {
    let mut out = Tally {
        sampled: shared.sampled(index),
        ..Tally::default()
    };
    let seen = &shared.seen[index * shared.writers..(index + 1) * shared.writers];
    loop {
        let next = tokio::select! {
            biased;
            _ = stop.changed() => break,
            b = stream.next() => b,
        };
        let batch = match next {
            Some(Ok(batch)) => batch,
            Some(Err(e)) => {
                out.error = Some(format!("etcd watch {index}: {e}"));
                break;
            }
            None => {
                out.error = Some(format!("etcd watch {index}: ended"));
                break;
            }
        };
        let at_us = micros_since(shared.origin, Instant::now());
        let window_us = shared.window_end_us.load(Ordering::Relaxed);
        out.messages += 1;
        for event in batch.events {
            if event.kind != EventKind::Put {
                out.other += 1;
                continue;
            }
            let marker = <LiteRecord as prost::Message>::decode(event.kv.value.as_ref())
                .ok()
                .and_then(|r| r.status)
                .and_then(|s| s.marker());
            out.record(seen, marker, at_us, window_us);
        }
    }
    shared.alive[index].store(false, Ordering::Release);
    out
}

// ---------------------------------------------------------------- writers

/// A writer node and its connection; its sequence numbers continue from
/// one phase to the next.
struct Writer {
    index: u32,
    client: CuratorClient<Channel>,
    node_id: String,
    /// The last sequence number sent.
    sent: u32,
    /// The last sequence number acknowledged.
    acked: u32,
}

/// What one writer did in a phase.
#[derive(Default)]
struct WriterRun {
    acked: u64,
    errors: u64,
    first_error: Option<String>,
    rpc_us: Vec<u64>,
    /// Acknowledged sequence numbers with their acknowledgement, µs since
    /// the phase's origin.
    acked_at: Vec<(u32, u64)>,
}

/// Sends updates until `end` (closed loop, or paced at `rate` in total
/// over `count` writers).
async fn run_writer(
    mut w: Writer,
    origin: Instant,
    start: Instant,
    end: Instant,
    rate: u64,
    count: u64,
) -> (Writer, WriterRun) {
    let mut out = WriterRun::default();
    for k in 0u64.. {
        let j = k.saturating_mul(count).saturating_add(u64::from(w.index));
        if let Some(nanos) = j.saturating_mul(1_000_000_000).checked_div(rate) {
            let due = start + Duration::from_nanos(nanos);
            if due >= end {
                break;
            }
            tokio::time::sleep_until(due.into()).await;
        }
        if Instant::now() >= end {
            break;
        }
        let seq = w.sent.saturating_add(1);
        w.sent = seq;
        let request = curator::UpdateNodeStatusRequest {
            node_id: w.node_id.clone(),
            status: Some(status(w.index, seq)),
        };
        let sent = Instant::now();
        let result = tokio::time::timeout(RPC_TIMEOUT, w.client.update_node_status(request)).await;
        let failure = match result {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Some(format!("no answer within {RPC_TIMEOUT:?}")),
        };
        match failure {
            None => {
                let now = Instant::now();
                out.acked += 1;
                w.acked = seq;
                out.rpc_us.push(micros_since(sent, now));
                out.acked_at.push((seq, micros_since(origin, now)));
            }
            Some(why) => {
                out.errors += 1;
                out.first_error.get_or_insert(why);
            }
        }
    }
    (w, out)
}

// ---------------------------------------------------------------- phases

/// Everything a phase needs from the run.
struct Env<'a> {
    args: &'a FanoutEtcdArgs,
    metrics_addr: String,
    etcd_pid: u32,
    daemon: &'a mut DaemonProcess,
    daemon_pid: u32,
}

/// The figures of one phase.
struct Phase {
    open_secs: f64,
    watchers_open: Metrics,
    watchers_load: Metrics,
    live: usize,
    acked: u64,
    /// Updates applied (acknowledged, or seen by a watcher after a timeout).
    applied: u64,
    update_errors: u64,
    first_update_error: Option<String>,
    write_secs: f64,
    rpc_p50_us: u64,
    rpc_p99_us: u64,
    latency: Latency,
    /// The serving process's RSS per idle watcher (set by the phase).
    rss: Option<IdleRss>,
    delivered: u64,
    in_window: u64,
    gaps: u64,
    stale: u64,
    other: u64,
    messages: u64,
    backlog_nodes: u64,
    delivery_secs: f64,
    drained: bool,
    drain_secs: f64,
    window_secs: f64,
    etcd_cpu_s: f64,
    daemon_cpu_s: f64,
    client_cores: f64,
    host_cores: f64,
    events_sent: Option<f64>,
    sent_bytes: Option<f64>,
    stream_errors: Vec<String>,
}

impl Phase {
    fn per_s(&self) -> f64 {
        self.delivered as f64 / self.delivery_secs.max(1e-9)
    }

    fn updates_per_s(&self) -> f64 {
        self.acked as f64 / self.write_secs.max(1e-9)
    }

    fn etcd_cores(&self) -> f64 {
        self.etcd_cpu_s / self.window_secs.max(1e-9)
    }

    fn daemon_cores(&self) -> f64 {
        self.daemon_cpu_s / self.window_secs.max(1e-9)
    }

    /// etcd CPU µs per delivered state.
    fn etcd_us_per_event(&self) -> f64 {
        self.etcd_cpu_s * 1e6 / self.delivered.max(1) as f64
    }

    /// Delivered states / (updates applied x live watchers).
    fn completeness(&self) -> f64 {
        self.delivered as f64 / (self.applied as f64 * self.live as f64).max(1.0)
    }
}

/// Time from a writer's acknowledgement to a sampled watcher's arrival of
/// that state.
#[derive(Default)]
struct Latency {
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    /// Arrivals measured.
    samples: u64,
    /// Of those, arrived before the acknowledgement (counted as 0).
    early: u64,
}

impl Latency {
    /// Matches each arrival with its writer's acknowledgement in `runs`
    /// (indexed by writer); states never acknowledged are left out.
    fn of(arrivals: &[(u32, u32, u64)], runs: &[WriterRun]) -> Latency {
        let mut early = 0;
        let mut all: Vec<u64> = arrivals
            .iter()
            .filter_map(|&(writer, seq, at_us)| {
                let acked = &runs.get(writer as usize)?.acked_at;
                let k = acked.binary_search_by_key(&seq, |&(s, _)| s).ok()?;
                let ack_us = acked[k].1;
                if at_us < ack_us {
                    early += 1;
                }
                Some(at_us.saturating_sub(ack_us))
            })
            .collect();
        all.sort_unstable();
        Latency {
            p50_us: percentile(&all, 50.0),
            p99_us: percentile(&all, 99.0),
            max_us: all.last().copied().unwrap_or(0),
            samples: all.len() as u64,
            early,
        }
    }
}

/// A serving process's resident memory before its watchers opened and
/// once they were all open and idle.
struct IdleRss {
    process: &'static str,
    before_kib: u64,
    idle_kib: u64,
    watchers: usize,
}

impl IdleRss {
    /// KiB per idle watcher.
    fn per_watcher_kib(&self) -> f64 {
        (self.idle_kib as f64 - self.before_kib as f64) / self.watchers.max(1) as f64
    }

    /// `"24.6 KiB (daemon)"`.
    fn show(&self) -> String {
        format!("{:.1} KiB ({})", self.per_watcher_kib(), self.process)
    }
}

/// Runs the updates of a phase against watchers already open (`tasks`,
/// sharing `shared`), drains, stops the watchers and gathers the figures.
async fn load_phase(
    env: &mut Env<'_>,
    writers: Vec<Writer>,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<Tally>>,
    stop: watch::Sender<bool>,
    open_secs: f64,
    watchers_open: Metrics,
) -> Result<(Vec<Writer>, Phase)> {
    let args = env.args;
    let before = etcd_metrics(&env.metrics_addr).await?;
    let start = Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    let start_us = micros_since(shared.origin, start);
    shared
        .window_end_us
        .store(micros_since(shared.origin, end), Ordering::Relaxed);
    let etcd_cpu = CpuMeter::start(env.etcd_pid)?;
    let daemon_cpu = CpuMeter::start(env.daemon_pid)?;
    let client_cpu = CpuMeter::start(std::process::id())?;
    let host_cpu = HostCpuMeter::start()?;
    let count = writers.len() as u64;
    let base: Vec<u32> = writers.iter().map(|w| w.sent).collect();
    let running: Vec<_> = writers
        .into_iter()
        .map(|w| tokio::spawn(run_writer(w, shared.origin, start, end, args.rate, count)))
        .collect();
    tokio::time::sleep_until((start + Duration::from_secs(args.seconds) / 2).into()).await;
    let watchers_load = etcd_metrics(&env.metrics_addr).await?;
    let mut writers = Vec::with_capacity(running.len());
    let mut runs = Vec::with_capacity(running.len());
    for task in running {
        let limit = end.saturating_duration_since(Instant::now()) + RPC_TIMEOUT * 2;
        let (w, run) = bounded(limit, || "a writer".into(), task)
            .await?
            .map_err(|e| format!("a writer failed: {e}"))?;
        writers.push(w);
        runs.push(run);
    }
    let t_written = Instant::now();
    let last: Vec<u32> = writers.iter().map(|w| w.acked).collect();
    let drain_deadline = t_written + Duration::from_secs(args.drain_timeout);
    let drained = loop {
        if shared.caught_up(&last) {
            break true;
        }
        if Instant::now() >= drain_deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let t_drained = Instant::now();
    let window_secs = start.elapsed().as_secs_f64();
    let etcd_cpu_s = etcd_cpu.cores()? * window_secs;
    let daemon_cpu_s = daemon_cpu.cores()? * window_secs;
    let client_cores = client_cpu.cores()?;
    let host_cores = host_cpu.cores()?;
    let after = etcd_metrics(&env.metrics_addr).await?;
    env.daemon.check_alive()?;
    let live = (0..shared.alive.len())
        .filter(|&s| shared.alive[s].load(Ordering::Acquire))
        .count();
    let _ = stop.send(true);
    let mut total = Tally::default();
    let mut stream_errors = Vec::new();
    let mut arrivals = Vec::new();
    for task in tasks {
        let t = bounded(RPC_TIMEOUT, || "stopping a watcher".into(), task)
            .await?
            .map_err(|e| format!("a watcher task failed: {e}"))?;
        total.delivered += t.delivered;
        total.in_window += t.in_window;
        total.gaps += t.gaps;
        total.stale += t.stale;
        total.other += t.other;
        total.messages += t.messages;
        total.last_at_us = total.last_at_us.max(t.last_at_us);
        total.backlog_nodes = total.backlog_nodes.max(t.backlog_nodes);
        stream_errors.extend(t.error);
        arrivals.extend(t.arrivals);
    }
    let latency = Latency::of(&arrivals, &runs);
    // The newest state of each writer: its last acknowledged, or a later
    // one some watcher saw (an update that timed out may still apply).
    let seen = |s: usize, w: usize| shared.seen[s * shared.writers + w].load(Ordering::Acquire);
    let newest: Vec<u32> = (0..shared.writers)
        .map(|w| {
            (0..shared.alive.len())
                .map(|s| seen(s, w))
                .fold(last[w], u32::max)
        })
        .collect();
    let applied: u64 = newest
        .iter()
        .zip(&base)
        .map(|(&n, &b)| u64::from(n.saturating_sub(b)))
        .sum();
    // States never received by a watcher at the end count as coalesced.
    for s in 0..shared.alive.len() {
        for (w, &n) in newest.iter().enumerate() {
            total.gaps += u64::from(n.saturating_sub(seen(s, w)));
        }
    }
    let mut rpc: Vec<u64> = runs.iter().flat_map(|r| r.rpc_us.iter().copied()).collect();
    rpc.sort_unstable();
    let delta = |name: &str| Some(after.get(name)? - before.get(name)?);
    let phase = Phase {
        open_secs,
        watchers_open,
        watchers_load,
        live,
        acked: runs.iter().map(|r| r.acked).sum(),
        applied,
        update_errors: runs.iter().map(|r| r.errors).sum(),
        first_update_error: runs.iter().find_map(|r| r.first_error.clone()),
        write_secs: t_written.duration_since(start).as_secs_f64(),
        rpc_p50_us: percentile(&rpc, 50.0),
        rpc_p99_us: percentile(&rpc, 99.0),
        latency,
        rss: None,
        delivered: total.delivered,
        in_window: total.in_window,
        gaps: total.gaps,
        stale: total.stale,
        other: total.other,
        messages: total.messages,
        backlog_nodes: total.backlog_nodes,
        delivery_secs: total.last_at_us.saturating_sub(start_us) as f64 / 1e6,
        drained,
        drain_secs: t_drained.duration_since(t_written).as_secs_f64(),
        window_secs,
        etcd_cpu_s,
        daemon_cpu_s,
        client_cores,
        host_cores,
        events_sent: delta(EVENTS_SENT),
        sent_bytes: delta(GRPC_SENT_BYTES),
        stream_errors,
    };
    Ok((writers, phase))
}

/// Phase 1: `--streams` Watch streams through the curator, each with its
/// backlog read, then the updates.
async fn curator_phase(env: &mut Env<'_>, writers: Vec<Writer>) -> Result<(Vec<Writer>, Phase)> {
    let args = env.args;
    let base: Vec<u32> = writers.iter().map(|w| w.sent).collect();
    let shared = Shared::new(args.streams, &base)?;
    let connections = Arc::new(Connections::new(
        Dial::Unix(env.daemon.socket.clone()),
        args.streams,
        args.streams_per_connection,
    ));
    let open = Arc::new(Semaphore::new(args.open_concurrency.max(1)));
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = watch::channel(false);
    let rss_before = rss_kib(env.daemon_pid)?;
    let t_open = Instant::now();
    let tasks: Vec<_> = (0..args.streams)
        .map(|i| {
            tokio::spawn(run_curator_stream(
                i,
                connections.clone(),
                shared.clone(),
                open.clone(),
                ready_tx.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();
    // The streams hold the connections; they close when the streams end.
    drop(connections);
    drop(ready_tx);
    let limit = Duration::from_secs(args.open_timeout);
    if let Err(e) = wait_ready(&mut ready_rx, args.streams, limit).await {
        let _ = stop_tx.send(true);
        return Err(e);
    }
    let open_secs = t_open.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.daemon.check_alive()?;
    let rss = IdleRss {
        process: "daemon",
        before_kib: rss_before,
        idle_kib: rss_kib(env.daemon_pid)?,
        watchers: args.streams,
    };
    let watchers_open = etcd_metrics(&env.metrics_addr).await?;
    println!(
        "  curator: {} streams open in {open_secs:.1} s ({} per idle stream); etcd counts {} \
         watchers; driving updates for {} s ...",
        args.streams,
        rss.show(),
        watchers_open.show(WATCHERS),
        args.seconds
    );
    let (writers, mut phase) = load_phase(
        env,
        writers,
        shared,
        tasks,
        stop_tx,
        open_secs,
        watchers_open,
    )
    .await?;
    phase.rss = Some(rss);
    Ok((writers, phase))
}

/// Phase 2: `--streams` etcd watches of the node prefix from the current
/// revision, over `--etcd-clients` clients, then the same updates.
async fn direct_phase(env: &mut Env<'_>, writers: Vec<Writer>) -> Result<(Vec<Writer>, Phase)> {
    let args = env.args;
    let base: Vec<u32> = writers.iter().map(|w| w.sent).collect();
    let shared = Shared::new(args.streams, &base)?;
    let url = format!("http://{}", env.metrics_addr);
    let rss_before = rss_kib(env.etcd_pid)?;
    let clients: Vec<EtcdStore> = futures::stream::iter(0..args.etcd_clients)
        .map(|_| EtcdStore::connect(EtcdConfig::new([url.clone()])))
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<std::result::Result<_, StoreError>>()
        .context(|| format!("connecting to etcd at {url}"))?;
    let first = clients.first().ok_or("--etcd-clients must be at least 1")?;
    let baseline = etcd_metrics(&env.metrics_addr)
        .await?
        .get(WATCHERS)
        .unwrap_or(0.0);
    let revision = first
        .revision()
        .await
        .context(|| "reading etcd's revision".into())?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let t_open = Instant::now();
    let prefix = KeyRange::Prefix(Bytes::from_static(NODES_PREFIX));
    let tasks: Vec<_> = (0..args.streams)
        .map(|i| {
            let stream = clients[i % clients.len()].watch_range(prefix.clone(), revision + 1);
            tokio::spawn(run_direct_watch(i, stream, shared.clone(), stop_rx.clone()))
        })
        .collect();
    let limit = Duration::from_secs(args.open_timeout);
    let wanted = baseline + args.streams as f64;
    if let Err(e) = wait_watchers(&env.metrics_addr, wanted, limit).await {
        let _ = stop_tx.send(true);
        return Err(e);
    }
    let open_secs = t_open.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.daemon.check_alive()?;
    let rss = IdleRss {
        process: "etcd",
        before_kib: rss_before,
        idle_kib: rss_kib(env.etcd_pid)?,
        watchers: args.streams,
    };
    let watchers_open = etcd_metrics(&env.metrics_addr).await?;
    println!(
        "  direct: {} etcd watches from revision {} on {} clients open in {open_secs:.1} s \
         ({} per idle watch); etcd counts {} watchers; driving updates for {} s ...",
        args.streams,
        revision + 1,
        clients.len(),
        rss.show(),
        watchers_open.show(WATCHERS),
        args.seconds
    );
    let result = load_phase(
        env,
        writers,
        shared,
        tasks,
        stop_tx,
        open_secs,
        watchers_open,
    )
    .await;
    drop(clients);
    let (writers, mut phase) = result?;
    phase.rss = Some(rss);
    Ok((writers, phase))
}

/// A one-member etcd and the daemon elected over it (leading and serving),
/// its data under `work`, with `--lease-ttl lease_ttl`.
pub(super) async fn start_elected(
    target: &Target,
    work: &Path,
    lease_ttl: u64,
) -> Result<(Etcd, DaemonProcess)> {
    let etcd = start_etcd().await?;
    let mut extra = target.extra.clone();
    extra.extend([
        "--etcd".to_string(),
        etcd.url(),
        "--lease-ttl".to_string(),
        lease_ttl.to_string(),
    ]);
    let data_dir = work.join("daemon");
    let mut daemon =
        DaemonProcess::start_with(&target.bin, &data_dir, target.runtime, "warn", &extra)?;
    wait_serving(&mut daemon, Duration::from_secs(60)).await?;
    Ok((etcd, daemon))
}

/// Waits until the daemon serves: its owner credential is written and a
/// Watch over the UNIX socket gets its backlog (so it leads, over etcd).
pub(super) async fn wait_serving(daemon: &mut DaemonProcess, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let socket = daemon.socket.clone();
    loop {
        daemon.check_alive()?;
        let attempt = async {
            daemon.owner()?;
            let mut stream = open_watch(unix_channel(&socket).await?).await?;
            loop {
                let event = bounded(Duration::from_secs(5), || "Watch".into(), stream.message())
                    .await?
                    .context(|| "Watch".into())?
                    .ok_or("Watch ended before its backlog marker")?;
                if event.progress == curator::watch_event::Progress::LastBacklogged as i32 {
                    return Ok::<_, super::util::Error>(());
                }
            }
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "the daemon did not serve within {limit:?}: {e}; its log ({}):\n{}",
                    daemon.log.display(),
                    super::daemon::tail(&daemon.log, 20)
                )
                .into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A value per phase, right-aligned in two columns.
fn row2(
    name: &str,
    curator: impl std::fmt::Display,
    direct: impl std::fmt::Display,
) -> (String, String) {
    row(name, format!("{curator:>28}   {direct:>28}"))
}

/// `a / b`, or 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Runs the scenario.
pub async fn run(args: FanoutEtcdArgs, target: &Target, work: &Path) -> Result<()> {
    if args.streams == 0 || args.writers == 0 || args.seconds == 0 || args.etcd_clients == 0 {
        return Err("--streams, --writers, --seconds and --etcd-clients must be at least 1".into());
    }
    if args.writers > args.nodes {
        return Err(format!(
            "--writers {} exceeds --nodes {}: writers are created nodes",
            args.writers, args.nodes
        )
        .into());
    }
    let etcd_bin = find_etcd()?;
    let (etcd, mut daemon) = start_elected(target, work, args.lease_ttl).await?;
    let etcd_pid = etcd.pid(0).ok_or("etcd is not running")?;
    let etcd_url = etcd.url();
    let metrics_addr = etcd_url
        .strip_prefix("http://")
        .unwrap_or(&etcd_url)
        .to_string();
    let daemon_pid = daemon.pid()?;
    println!(
        "fanout-etcd: etcd ({etcd_bin}) pid {etcd_pid} at {etcd_url}; daemon pid {daemon_pid} \
         ({} runtime, elected over etcd) on {} and {}",
        target.runtime,
        daemon.addr,
        daemon.socket.display()
    );

    // Nodes and writers.
    let owner = daemon.owner()?;
    let t_add = Instant::now();
    let creds = add_nodes(
        &daemon.addr,
        &owner,
        args.nodes,
        args.add_concurrency,
        args.writers,
    )
    .await?;
    let add_secs = t_add.elapsed().as_secs_f64();
    let channels: Vec<Channel> = futures::stream::iter(&creds)
        .map(|n| tls_channel(&daemon.addr, &n.creds))
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let writers = channels
        .into_iter()
        .zip(&creds)
        .enumerate()
        .map(|(i, (channel, node))| {
            Ok(Writer {
                index: u32::try_from(i).map_err(|_| "too many writers")?,
                client: metropolis_tests::curator(channel),
                node_id: node.id.clone(),
                sent: 0,
                acked: 0,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    daemon.check_alive()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let alone = etcd_metrics(&metrics_addr).await?;
    println!(
        "  {} nodes added in {add_secs:.1} s; with no watcher open etcd counts {} watchers \
         ({} watch streams)",
        args.nodes,
        alone.show(WATCHERS),
        alone.show(WATCH_STREAMS)
    );

    let mut env = Env {
        args: &args,
        metrics_addr: metrics_addr.clone(),
        etcd_pid,
        daemon: &mut daemon,
        daemon_pid,
    };
    let (writers, cur) = curator_phase(&mut env, writers).await?;
    // Let the daemon notice the closed streams before etcd is watched
    // directly.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_writers, dir) = direct_phase(&mut env, writers).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let between = etcd_metrics(&metrics_addr).await?;
    daemon.check_alive()?;

    // Figures.
    let n = |v: u64| v.to_string();
    let cores = |c: f64| format!("{c:.2} cores");
    let per_s = |v: f64| format!("{v:.0}");
    let opt = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.0}"));
    // Rows that show the same figure of each phase.
    let each = |name: &str, f: &dyn Fn(&Phase) -> String| row2(name, f(&cur), f(&dir));
    let rows = vec![
        row2("", "curator", "direct etcd"),
        each("watchers (open / live at the end)", &|p| {
            format!("{} / {}", args.streams, p.live)
        }),
        row2(
            "how they connect",
            format!("UNIX, {} per conn.", args.streams_per_connection.max(1)),
            format!("{} clients", args.etcd_clients),
        ),
        row2(
            "open (+ backlog for the curator)",
            format!("{:.1} s ({} nodes)", cur.open_secs, cur.backlog_nodes),
            format!("{:.1} s", dir.open_secs),
        ),
        each("etcd watchers, watchers open / mid-load", &|p| {
            format!(
                "{} / {}",
                p.watchers_open.show(WATCHERS),
                p.watchers_load.show(WATCHERS)
            )
        }),
        each("etcd watch streams / slow watchers mid-load", &|p| {
            format!(
                "{} / {}",
                p.watchers_load.show(WATCH_STREAMS),
                p.watchers_load.show(SLOW_WATCHERS)
            )
        }),
        each("updates acknowledged (errors)", &|p| {
            format!("{} ({})", p.acked, p.update_errors)
        }),
        each("updates acknowledged/s", &|p| per_s(p.updates_per_s())),
        each("UpdateNodeStatus p50 / p99", &|p| {
            format!("{} / {} ms", ms(p.rpc_p50_us), ms(p.rpc_p99_us))
        }),
        each("RSS per idle watcher (its connection included)", &|p| {
            p.rss.as_ref().map_or("n/a".into(), IdleRss::show)
        }),
        each("latency ack -> arrival p50 / p99", &|p| {
            format!("{} / {} ms", ms(p.latency.p50_us), ms(p.latency.p99_us))
        }),
        each("latency max (arrivals sampled, early)", &|p| {
            format!(
                "{} ms ({}, {})",
                ms(p.latency.max_us),
                p.latency.samples,
                p.latency.early
            )
        }),
        each(
            "writer states delivered (all watchers)",
            &|p| n(p.delivered),
        ),
        each("  of which while updates were sent", &|p| n(p.in_window)),
        each("delivered events/s (to last arrival)", &|p| {
            per_s(p.per_s())
        }),
        each("delivered events/s while updates were sent", &|p| {
            per_s(p.in_window as f64 / args.seconds as f64)
        }),
        each("messages (WatchEvents / etcd batches)", &|p| {
            format!(
                "{} ({:.2} states each)",
                p.messages,
                ratio(p.delivered as f64, p.messages as f64)
            )
        }),
        each("updates applied (incl. after a timeout)", &|p| n(p.applied)),
        each("delivered / (applied x watchers)", &|p| {
            format!("{:.3}", p.completeness())
        }),
        each("states skipped or not received by the end", &|p| n(p.gaps)),
        each("stale (0 expected) / other states", &|p| {
            format!("{} / {}", p.stale, p.other)
        }),
        each("drained after the writes", &|p| {
            if p.drained {
                format!("yes, {:.2} s", p.drain_secs)
            } else {
                format!("NO ({} s)", args.drain_timeout)
            }
        }),
        each("etcd CPU (writes + drain)", &|p| {
            format!("{} ({:.1} s)", cores(p.etcd_cores()), p.etcd_cpu_s)
        }),
        each("etcd CPU per delivered event", &|p| {
            format!("{:.2} µs", p.etcd_us_per_event())
        }),
        each("etcd CPU per acknowledged update", &|p| {
            format!("{:.0} µs", p.etcd_cpu_s * 1e6 / p.acked.max(1) as f64)
        }),
        each("daemon CPU", &|p| cores(p.daemon_cores())),
        each("load client CPU", &|p| cores(p.client_cores)),
        each("machine CPU busy, all processes", &|p| {
            format!("{:.2} of {}", p.host_cores, cpus())
        }),
        each("etcd watch events sent (its counter)", &|p| {
            opt(p.events_sent)
        }),
        each("etcd gRPC bytes sent to clients", &|p| opt(p.sent_bytes)),
        each("watcher errors", &|p| p.stream_errors.len().to_string()),
    ];
    let load = if args.rate > 0 {
        format!("{} updates/s", args.rate)
    } else {
        "closed loop".to_string()
    };
    print_table(
        &format!(
            "fanout-etcd: {} nodes, {} watchers per phase, {} writers ({load}) for {} s per phase",
            args.nodes, args.streams, args.writers, args.seconds
        ),
        &rows,
    );
    let events_ratio = ratio(cur.per_s(), dir.per_s());
    let cpu_ratio = ratio(cur.etcd_us_per_event(), dir.etcd_us_per_event());
    println!(
        "  curator / direct: delivered events/s x{events_ratio:.2} (target: at least 3), \
         etcd CPU per delivered event x{cpu_ratio:.3}, updates/s x{:.2}",
        ratio(cur.updates_per_s(), dir.updates_per_s())
    );
    println!(
        "  2 s after both phases etcd counts {} watchers",
        between.show(WATCHERS)
    );
    for e in cur.stream_errors.iter().chain(&dir.stream_errors).take(5) {
        println!("  watcher error: {e}");
    }
    for e in [&cur.first_update_error, &dir.first_update_error]
        .into_iter()
        .flatten()
    {
        println!("  first update error: {e}");
    }
    let gauge = |m: &Metrics| m.show(WATCHERS);
    println!(
        "RESULT fanout-etcd runtime={} nodes={} streams={} writers={} seconds={} rate={} \
         etcd_clients={} curator_events_per_s={:.0} direct_events_per_s={:.0} \
         events_ratio={events_ratio:.2} curator_updates_per_s={:.0} direct_updates_per_s={:.0} \
         curator_etcd_cores={:.2} direct_etcd_cores={:.2} curator_etcd_us_per_event={:.3} \
         direct_etcd_us_per_event={:.3} etcd_cpu_per_event_ratio={cpu_ratio:.4} \
         curator_etcd_watchers={} direct_etcd_watchers={} curator_daemon_cores={:.2} \
         direct_daemon_cores={:.2} curator_completeness={:.3} direct_completeness={:.3} \
         curator_drained={} direct_drained={} update_errors={} watcher_errors={} \
         curator_ack_p99_ms={} direct_ack_p99_ms={} curator_rss_per_watcher_kib={:.1} \
         direct_rss_per_watcher_kib={:.1}",
        target.runtime,
        args.nodes,
        args.streams,
        args.writers,
        args.seconds,
        args.rate,
        args.etcd_clients,
        cur.per_s(),
        dir.per_s(),
        cur.updates_per_s(),
        dir.updates_per_s(),
        cur.etcd_cores(),
        dir.etcd_cores(),
        cur.etcd_us_per_event(),
        dir.etcd_us_per_event(),
        gauge(&cur.watchers_load),
        gauge(&dir.watchers_load),
        cur.daemon_cores(),
        dir.daemon_cores(),
        cur.completeness(),
        dir.completeness(),
        cur.drained,
        dir.drained,
        cur.update_errors + dir.update_errors,
        cur.stream_errors.len() + dir.stream_errors.len(),
        ms(cur.latency.p99_us),
        ms(dir.latency.p99_us),
        cur.rss.as_ref().map_or(0.0, IdleRss::per_watcher_kib),
        dir.rss.as_ref().map_or(0.0, IdleRss::per_watcher_kib),
    );
    drop(daemon);
    drop(etcd);
    Ok(())
}
