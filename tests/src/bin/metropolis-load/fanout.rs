//! Scenario `fanout`: many idle `Watch(NodesInCluster)` streams over the
//! local socket, then a steady rate of status updates from a few nodes over
//! TLS; measures what reaches the streams, how late, and what an idle
//! stream costs the daemon in memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_proto::prelude::curator;
use metropolis_proto::prelude::curator::curator_client::CuratorClient;
use metropolis_transport::grpc::Channel;
use tokio::sync::{Semaphore, mpsc, watch};

use super::daemon::DaemonProcess;
use super::util::{
    Context, CpuMeter, HostCpuMeter, NodeCred, RPC_TIMEOUT, Result, add_nodes, bounded, cpus,
    micros_since, ms, percentile, print_table, row, status, tls_channel, unix_channel,
};

/// Arguments of `fanout`.
#[derive(clap::Args, Debug, Clone)]
pub struct FanoutArgs {
    /// Nodes to create (through NodeManagement.AddNode, as the owner)
    /// before the streams open; the daemon's own node comes on top.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Concurrent Watch(NodesInCluster) streams over the UNIX socket.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Streams multiplexed on one HTTP/2 connection (1: a connection per
    /// stream, like independent watchers; more: per-stream cost without
    /// per-connection buffers).
    #[arg(long, default_value_t = 1)]
    pub streams_per_connection: usize,
    /// UpdateNodeStatus calls per second, in total, on a fixed schedule.
    #[arg(long, default_value_t = 500)]
    pub rate: u64,
    /// How long the updates are sent.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Nodes sending the updates, each over its own TLS connection with its
    /// own credential; update j goes to writer j mod N. At most --nodes.
    #[arg(long, default_value_t = 100)]
    pub writers: usize,
    /// AddNode calls in flight while creating the nodes.
    #[arg(long, default_value_t = 32)]
    pub add_concurrency: usize,
    /// Open the streams over mutual TLS to the curator port, each
    /// connection with its own node's credential (the created nodes',
    /// so --nodes must cover the connections), instead of over the UNIX
    /// socket.
    #[arg(long)]
    pub tls: bool,
    /// Streams opening (connecting and reading their backlog) at a time.
    #[arg(long, default_value_t = 50)]
    pub open_concurrency: usize,
    /// Seconds to wait for every stream to open and receive its backlog.
    #[arg(long, default_value_t = 600)]
    pub open_timeout: u64,
    /// Seconds to wait after the last update for every stream to receive
    /// every writer's last acknowledged state.
    #[arg(long, default_value_t = 60)]
    pub drain_timeout: u64,
    /// Seconds to let the daemon settle after the streams are idle, before
    /// reading its memory.
    #[arg(long, default_value_t = 2)]
    pub settle_seconds: u64,
}

// The parts of a WatchEvent the streams need. The daemon sends ordinary
// WatchEvents; decoding only these fields (prost skips the others) keeps
// the client's CPU share, on the same cores as the daemon, small. A
// backlog carries every node of the cluster to every stream: its nodes
// are only counted (each is a slice of the received buffer, not parsed),
// and a node's status is decoded when it is asked for.

/// `curator.api.WatchEvent`: nodes (undecoded) and progress (tombstones
/// skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LiteEvent {
    #[prost(bytes = "bytes", repeated, tag = "1")]
    pub(crate) nodes: Vec<bytes::Bytes>,
    #[prost(int32, tag = "2")]
    pub(crate) progress: i32,
}

impl LiteEvent {
    /// The marker of each node of the event's status (`None` for a node
    /// without one, or one that does not decode).
    pub(crate) fn markers(&self) -> impl Iterator<Item = Option<Marker>> + '_ {
        self.nodes.iter().map(|node| {
            <LiteNode as prost::Message>::decode(node.clone())
                .ok()
                .and_then(|n| n.status)
                .and_then(|s| s.marker())
        })
    }
}

/// `curator.api.Node`: its status only.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LiteNode {
    #[prost(message, optional, tag = "3")]
    pub(crate) status: Option<LiteStatus>,
}

/// `common.NodeStatus`: its version only, where the writers put their
/// marker (`util::status`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LiteStatus {
    #[prost(message, optional, tag = "4")]
    pub(crate) version: Option<LiteVersion>,
}

impl LiteStatus {
    /// The writer's marker in the status's version release, if any.
    pub(crate) fn marker(&self) -> Option<Marker> {
        self.version.and_then(|v| v.release)
    }
}

/// `version.spec.Version`: its release only.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(crate) struct LiteVersion {
    #[prost(message, optional, tag = "1")]
    pub(crate) release: Option<Marker>,
}

/// `version.spec.Version.Release` as the writers fill it (`util::status`):
/// the writer's index as the minor and its update's sequence number as the
/// patch number (the major, always 0, is skipped).
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(crate) struct Marker {
    #[prost(int64, tag = "2")]
    pub(crate) writer: i64,
    #[prost(int64, tag = "3")]
    pub(crate) seq: i64,
}

const WATCH_PATH: &str = "/metropolis.node.core.curator.proto.api.Curator/Watch";

/// One node state a stream received: writer, sequence number, arrival.
#[derive(Clone, Copy)]
struct Arrival {
    writer: u32,
    seq: u32,
    at_us: u64,
}

/// State shared by the streams and the main task.
struct Shared {
    t0: Instant,
    writers: usize,
    /// Per stream and writer, the highest sequence number seen.
    seen: Vec<AtomicU32>,
    /// Per stream, whether it still runs.
    alive: Vec<AtomicBool>,
}

/// What one stream saw.
#[derive(Default)]
struct StreamOutcome {
    arrivals: Vec<Arrival>,
    /// States skipped between two received ones (coalesced by the daemon).
    gaps: u64,
    /// States older than or equal to one already seen (never expected).
    stale: u64,
    /// Events after the backlog.
    events: u64,
    /// Nodes in the backlog.
    backlog_nodes: u64,
    error: Option<String>,
}

/// How the streams' connections reach the daemon.
pub(crate) enum Dial {
    /// Its local UNIX socket (every caller is the daemon's own node).
    Unix(PathBuf),
    /// Mutual TLS to its curator port, connection `i` with the credential
    /// of node `i` (modulo their number), as each node of a fleet holds its
    /// own connection.
    Tls {
        /// `127.0.0.1:port`.
        addr: String,
        /// One credential per connection.
        nodes: Vec<NodeCred>,
    },
}

/// The HTTP/2 connections the streams share, opened on first use.
pub(crate) struct Connections {
    dial: Dial,
    per_connection: usize,
    cells: Vec<tokio::sync::OnceCell<Channel>>,
}

impl Connections {
    pub(crate) fn new(dial: Dial, streams: usize, per_connection: usize) -> Self {
        let per_connection = per_connection.max(1);
        Connections {
            dial,
            per_connection,
            cells: (0..Self::count(streams, per_connection))
                .map(|_| tokio::sync::OnceCell::new())
                .collect(),
        }
    }

    /// How many connections `streams` streams use, `per_connection` each.
    pub(crate) fn count(streams: usize, per_connection: usize) -> usize {
        streams.div_ceil(per_connection.max(1))
    }

    /// The connection of stream `index`.
    pub(crate) async fn get(&self, index: usize) -> Result<Channel> {
        let connection = index / self.per_connection;
        let cell = &self.cells[connection];
        cell.get_or_try_init(|| async {
            match &self.dial {
                Dial::Unix(socket) => unix_channel(socket).await,
                Dial::Tls { addr, nodes } => {
                    let node = nodes
                        .get(connection % nodes.len().max(1))
                        .ok_or("no node credential for a TLS connection")?;
                    tls_channel(addr, &node.creds).await
                }
            }
        })
        .await
        .cloned()
    }
}

/// Opens a `Watch(NodesInCluster)` stream on `channel`, decoding only
/// what [`LiteEvent`] keeps.
pub(crate) async fn open_watch(channel: Channel) -> Result<tonic::Streaming<LiteEvent>> {
    let mut grpc = tonic::client::Grpc::with_origin(channel, Channel::origin());
    grpc.ready()
        .await
        .context(|| "Watch: connection not ready".into())?;
    let request = curator::WatchRequest {
        kind: Some(curator::watch_request::Kind::NodesInCluster(
            Default::default(),
        )),
    };
    let codec = tonic_prost::ProstCodec::<curator::WatchRequest, LiteEvent>::default();
    let path = http::uri::PathAndQuery::from_static(WATCH_PATH);
    let response = grpc
        .server_streaming(tonic::Request::new(request), path, codec)
        .await
        .context(|| "Watch".into())?;
    Ok(response.into_inner())
}

/// Opens Watch stream `index` on its connection, holding an `open`
/// permit, and reads its backlog up to the `PROGRESS_LAST_BACKLOGGED`
/// marker: the stream, and how many nodes the backlog carried.
pub(crate) async fn open_past_backlog(
    index: usize,
    connections: &Connections,
    open: &Semaphore,
) -> Result<(tonic::Streaming<LiteEvent>, u64)> {
    let _permit = open
        .acquire()
        .await
        .map_err(|_| "the open semaphore closed")?;
    let mut stream = open_watch(connections.get(index).await?).await?;
    let mut nodes = 0;
    loop {
        let event = bounded(RPC_TIMEOUT, || "Watch backlog".into(), stream.message())
            .await?
            .context(|| "Watch backlog".into())?
            .ok_or("Watch ended before its backlog marker")?;
        nodes += event.nodes.len() as u64;
        if event.progress == curator::watch_event::Progress::LastBacklogged as i32 {
            return Ok((stream, nodes));
        }
    }
}

/// Opens stream `index` past its backlog ([`open_past_backlog`]) and
/// reports the outcome on `ready`; on failure marks it dead in `alive`
/// and returns the message (named after `label`).
pub(crate) async fn open_reporting(
    label: &str,
    index: usize,
    connections: &Connections,
    open: &Semaphore,
    ready: &mpsc::UnboundedSender<Result<()>>,
    alive: &AtomicBool,
) -> std::result::Result<(tonic::Streaming<LiteEvent>, u64), String> {
    match open_past_backlog(index, connections, open).await {
        Ok(opened) => {
            let _ = ready.send(Ok(()));
            Ok(opened)
        }
        Err(e) => {
            let msg = format!("{label} {index}: {e}");
            let _ = ready.send(Err(msg.clone().into()));
            alive.store(false, Ordering::Release);
            Err(msg)
        }
    }
}

/// What an open stream gave next.
pub(crate) enum Next {
    /// An event.
    Event(LiteEvent),
    /// `stop` fired.
    Stopped,
    /// The stream ended or failed; why, named after the stream.
    Ended(String),
}

/// The next event of stream `index`, unless `stop` fires first.
pub(crate) async fn next_event(
    label: &str,
    index: usize,
    stream: &mut tonic::Streaming<LiteEvent>,
    stop: &mut watch::Receiver<bool>,
) -> Next {
    let message = tokio::select! {
        biased;
        _ = stop.changed() => return Next::Stopped,
        m = stream.message() => m,
    };
    match message {
        Ok(Some(event)) => Next::Event(event),
        Ok(None) => Next::Ended(format!("{label} {index}: ended by the daemon")),
        Err(status) => Next::Ended(format!(
            "{label} {index}: {:?}: {}",
            status.code(),
            status.message()
        )),
    }
}

/// Opens stream `index` (holding an `open` permit until its backlog is
/// in), reports readiness, then records every writer state it receives
/// until `stop`.
async fn run_stream(
    index: usize,
    connections: Arc<Connections>,
    shared: Arc<Shared>,
    open: Arc<Semaphore>,
    ready: mpsc::UnboundedSender<Result<()>>,
    mut stop: watch::Receiver<bool>,
) -> StreamOutcome {
    let mut out = StreamOutcome::default();
    let alive = &shared.alive[index];
    let mut stream = match open_reporting("stream", index, &connections, &open, &ready, alive).await
    {
        Ok((s, backlog_nodes)) => {
            out.backlog_nodes = backlog_nodes;
            s
        }
        Err(msg) => {
            out.error = Some(msg);
            return out;
        }
    };
    let writers = shared.writers;
    let seen = &shared.seen[index * writers..(index + 1) * writers];
    loop {
        let event = match next_event("stream", index, &mut stream, &mut stop).await {
            Next::Event(event) => event,
            Next::Stopped => break,
            Next::Ended(why) => {
                out.error = Some(why);
                break;
            }
        };
        let at_us = micros_since(shared.t0, Instant::now());
        out.events += 1;
        for marker in event.markers() {
            let Some(marker) = marker else {
                continue;
            };
            let (Ok(writer), Ok(seq)) = (u32::try_from(marker.writer), u32::try_from(marker.seq))
            else {
                continue;
            };
            if writer as usize >= writers || seq == 0 {
                continue;
            }
            let slot = &seen[writer as usize];
            let last = slot.load(Ordering::Relaxed);
            if seq <= last {
                out.stale += 1;
                continue;
            }
            out.gaps += u64::from(seq - last - 1);
            slot.store(seq, Ordering::Release);
            out.arrivals.push(Arrival { writer, seq, at_us });
        }
    }
    shared.alive[index].store(false, Ordering::Release);
    out
}

/// What one writer did: per sequence number (index seq-1), when it was
/// sent and acknowledged (µs since t0).
struct WriterOutcome {
    sent_us: Vec<u64>,
    acked_us: Vec<Option<u64>>,
    errors: u64,
    first_error: Option<String>,
}

/// When the updates are due.
#[derive(Clone, Copy)]
struct Schedule {
    /// Updates per second, in total.
    rate: u64,
    /// Origin of every µs timestamp.
    t0: Instant,
    /// When update 0 is due.
    t_drive: Instant,
    /// No update is sent after this (a writer far behind schedule).
    give_up: Instant,
}

/// Sends updates `jobs` (global indices j, due at t_drive + j/rate) for
/// `node_id`, one at a time.
async fn run_writer(
    index: u32,
    mut client: CuratorClient<Channel>,
    node_id: String,
    jobs: Vec<u64>,
    schedule: Schedule,
) -> WriterOutcome {
    let Schedule {
        rate,
        t0,
        t_drive,
        give_up,
    } = schedule;
    let mut out = WriterOutcome {
        sent_us: Vec::with_capacity(jobs.len()),
        acked_us: Vec::with_capacity(jobs.len()),
        errors: 0,
        first_error: None,
    };
    for (k, j) in jobs.into_iter().enumerate() {
        let due = t_drive + Duration::from_nanos(j.saturating_mul(1_000_000_000) / rate);
        tokio::time::sleep_until(due.into()).await;
        if Instant::now() >= give_up {
            break;
        }
        let seq = u32::try_from(k + 1).unwrap_or(u32::MAX);
        let request = curator::UpdateNodeStatusRequest {
            node_id: node_id.clone(),
            status: Some(status(index, seq)),
        };
        let sent = Instant::now();
        let result = tokio::time::timeout(RPC_TIMEOUT, client.update_node_status(request)).await;
        let acked = Instant::now();
        out.sent_us.push(micros_since(t0, sent));
        let failure = match result {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Some(format!("no answer within {RPC_TIMEOUT:?}")),
        };
        match failure {
            None => out.acked_us.push(Some(micros_since(t0, acked))),
            Some(why) => {
                out.acked_us.push(None);
                out.errors += 1;
                out.first_error.get_or_insert(why);
            }
        }
    }
    out
}

/// Waits until `n` more streams report their backlog received, for at most
/// `limit`; the first failure is the error.
pub(crate) async fn wait_ready(
    rx: &mut mpsc::UnboundedReceiver<Result<()>>,
    n: usize,
    limit: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    for k in 0..n {
        let report = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| {
                format!("only {k} of {n} streams received their backlog within {limit:?}")
            })?
            .ok_or("stream readiness channel closed")?;
        report?;
    }
    Ok(())
}

fn kib(v: i64) -> String {
    format!("{v} KiB")
}

/// Runs the scenario.
pub async fn run(args: FanoutArgs, target: &super::daemon::Target, work: &Path) -> Result<()> {
    if args.streams == 0 || args.rate == 0 || args.seconds == 0 || args.writers == 0 {
        return Err("--streams, --rate, --seconds and --writers must be at least 1".into());
    }
    if args.writers > args.nodes {
        return Err(format!(
            "--writers {} exceeds --nodes {}: writers are created nodes",
            args.writers, args.nodes
        )
        .into());
    }
    let connection_count = Connections::count(args.streams, args.streams_per_connection);
    if args.tls && connection_count > args.nodes {
        return Err(format!(
            "--tls: {connection_count} connections need as many nodes, --nodes is {}",
            args.nodes
        )
        .into());
    }
    let data_dir = work.join("daemon");
    let mut daemon = DaemonProcess::start(target, &data_dir, "warn")?;
    let daemon_pid = daemon.pid()?;
    println!(
        "fanout: daemon pid {daemon_pid} ({} runtime) on {} and {} (data {})",
        target.runtime,
        daemon.addr,
        daemon.socket.display(),
        data_dir.display()
    );

    // 1. Nodes.
    let owner = daemon.owner()?;
    let t_add = Instant::now();
    let keep = if args.tls {
        args.writers.max(connection_count)
    } else {
        args.writers
    };
    let mut writers_creds =
        add_nodes(&daemon.addr, &owner, args.nodes, args.add_concurrency, keep).await?;
    let dial = if args.tls {
        Dial::Tls {
            addr: daemon.addr.clone(),
            nodes: writers_creds.clone(),
        }
    } else {
        Dial::Unix(daemon.socket.clone())
    };
    writers_creds.truncate(args.writers);
    let add_secs = t_add.elapsed().as_secs_f64();
    daemon.check_alive()?;

    // 2. Streams: one primer (it makes the daemon load its node cache),
    // then the others.
    let t0 = Instant::now();
    let slots = args
        .streams
        .checked_mul(args.writers)
        .ok_or("--streams x --writers is too large")?;
    let shared = Arc::new(Shared {
        t0,
        writers: args.writers,
        seen: (0..slots).map(|_| AtomicU32::new(0)).collect(),
        alive: (0..args.streams).map(|_| AtomicBool::new(true)).collect(),
    });
    let connections = Arc::new(Connections::new(
        dial,
        args.streams,
        args.streams_per_connection,
    ));
    let open = Arc::new(Semaphore::new(args.open_concurrency.max(1)));
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = watch::channel(false);
    let open_limit = Duration::from_secs(args.open_timeout);
    let spawn_stream = |i: usize| {
        tokio::spawn(run_stream(
            i,
            connections.clone(),
            shared.clone(),
            open.clone(),
            ready_tx.clone(),
            stop_rx.clone(),
        ))
    };
    let rss_before = daemon.rss_kib()?;
    let mut handles = Vec::with_capacity(args.streams);
    handles.push(spawn_stream(0));
    wait_ready(&mut ready_rx, 1, open_limit).await?;
    tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;
    let rss_primer = daemon.rss_kib()?;
    let t_open = Instant::now();
    let cpu_open = CpuMeter::start(daemon_pid)?;
    let cpu_open_client = CpuMeter::start(std::process::id())?;
    let cpu_open_host = HostCpuMeter::start()?;
    for i in 1..args.streams {
        handles.push(spawn_stream(i));
    }
    let opened = wait_ready(&mut ready_rx, args.streams - 1, open_limit).await;
    if let Err(e) = opened {
        let _ = stop_tx.send(true);
        return Err(e);
    }
    let open_secs = t_open.elapsed().as_secs_f64();
    let open_cores = cpu_open.cores()?;
    let open_client_cores = cpu_open_client.cores()?;
    let open_host_cores = cpu_open_host.cores()?;
    tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;
    daemon.check_alive()?;
    let rss_idle = daemon.rss_kib()?;
    let (per_stream_kib, per_stream_basis) = if args.streams > 1 {
        (
            (rss_idle as f64 - rss_primer as f64) / (args.streams - 1) as f64,
            "(idle - after primer) / (streams - 1)",
        )
    } else {
        (
            (rss_idle as f64 - rss_before as f64) / args.streams as f64,
            "(idle - before) / streams",
        )
    };
    println!(
        "  {} streams idle after their backlog ({open_secs:.1} s to open); daemon RSS {rss_before} KiB \
         before, {rss_primer} KiB with 1 stream, {rss_idle} KiB with all",
        args.streams
    );

    // 3. Writers.
    let channels: Vec<Channel> = futures::stream::iter(&writers_creds)
        .map(|n| tls_channel(&daemon.addr, &n.creds))
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let total = args.rate.saturating_mul(args.seconds);
    println!(
        "  driving {total} updates ({}/s for {} s) from {} writers ...",
        args.rate, args.seconds, args.writers
    );
    let t_drive = Instant::now() + Duration::from_millis(100);
    // Writers far behind schedule stop sending at twice the planned time
    // plus 30 s, so the run stays bounded whatever the daemon does.
    let give_up = t_drive + Duration::from_secs(args.seconds * 2 + 30);
    let cpu_drive = CpuMeter::start(daemon_pid)?;
    let cpu_client = CpuMeter::start(std::process::id())?;
    let cpu_host = HostCpuMeter::start()?;
    let mut writer_tasks = Vec::with_capacity(args.writers);
    for (i, (channel, node)) in channels.into_iter().zip(&writers_creds).enumerate() {
        let jobs: Vec<u64> = (i as u64..total).step_by(args.writers).collect();
        writer_tasks.push(tokio::spawn(run_writer(
            u32::try_from(i).map_err(|_| "too many writers")?,
            metropolis_tests::curator(channel),
            node.id.clone(),
            jobs,
            Schedule {
                rate: args.rate,
                t0,
                t_drive,
                give_up,
            },
        )));
    }
    let mut writer_outcomes = Vec::with_capacity(args.writers);
    for task in writer_tasks {
        let limit = give_up.saturating_duration_since(Instant::now()) + RPC_TIMEOUT * 2;
        let out = bounded(limit, || "a writer".into(), task)
            .await?
            .map_err(|e| format!("a writer failed: {e}"))?;
        writer_outcomes.push(out);
    }
    let t_written = Instant::now();
    let drive_secs = t_written.duration_since(t_drive).as_secs_f64();

    // 4. Drain: every live stream has every writer's last acknowledged state.
    let final_acked: Vec<u32> = writer_outcomes
        .iter()
        .map(|o| {
            o.acked_us
                .iter()
                .rposition(Option::is_some)
                .map_or(0, |k| u32::try_from(k + 1).unwrap_or(u32::MAX))
        })
        .collect();
    let drain_deadline = Instant::now() + Duration::from_secs(args.drain_timeout);
    let drained = loop {
        let complete = (0..args.streams).all(|s| {
            !shared.alive[s].load(Ordering::Acquire)
                || final_acked.iter().enumerate().all(|(wi, &last)| {
                    shared.seen[s * args.writers + wi].load(Ordering::Acquire) >= last
                })
        });
        if complete {
            break true;
        }
        if Instant::now() >= drain_deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let drive_cores = cpu_drive.cores()?;
    let client_cores = cpu_client.cores()?;
    let host_cores = cpu_host.cores()?;
    let rss_after = daemon.rss_kib()?;
    daemon.check_alive()?;
    let _ = stop_tx.send(true);
    let mut outcomes = Vec::with_capacity(handles.len());
    for h in handles {
        let out = bounded(RPC_TIMEOUT, || "stopping a stream".into(), h)
            .await?
            .map_err(|e| format!("a stream task failed: {e}"))?;
        outcomes.push(out);
    }

    // 5. Figures.
    let acked_total: u64 = writer_outcomes
        .iter()
        .map(|o| o.acked_us.iter().flatten().count() as u64)
        .sum();
    let write_errors: u64 = writer_outcomes.iter().map(|o| o.errors).sum();
    let sent_total: u64 = writer_outcomes.iter().map(|o| o.sent_us.len() as u64).sum();
    let mut rpc_lat: Vec<u64> = writer_outcomes
        .iter()
        .flat_map(|o| {
            o.sent_us
                .iter()
                .zip(&o.acked_us)
                .filter_map(|(s, a)| a.map(|a| a.saturating_sub(*s)))
        })
        .collect();
    rpc_lat.sort_unstable();

    let mut latencies = Vec::new();
    let mut from_send = Vec::new();
    let mut early = 0u64;
    let mut last_arrival_us = 0u64;
    let mut received = 0u64;
    let mut gaps = 0u64;
    let mut stale = 0u64;
    let mut events = 0u64;
    let mut stream_errors = Vec::new();
    let mut tail_missing = 0u64;
    for (s, out) in outcomes.iter().enumerate() {
        received += out.arrivals.len() as u64;
        gaps += out.gaps;
        stale += out.stale;
        events += out.events;
        if let Some(e) = &out.error {
            stream_errors.push(e.clone());
        }
        for (wi, &last) in final_acked.iter().enumerate() {
            let seen = shared.seen[s * args.writers + wi].load(Ordering::Acquire);
            tail_missing += u64::from(last.saturating_sub(seen));
        }
        for a in &out.arrivals {
            last_arrival_us = last_arrival_us.max(a.at_us);
            let writer = writer_outcomes.get(a.writer as usize);
            let k = a.seq as usize - 1;
            if let Some(sent) = writer.and_then(|o| o.sent_us.get(k)) {
                from_send.push(a.at_us.saturating_sub(*sent));
            }
            let acked = writer.and_then(|o| o.acked_us.get(k)).copied().flatten();
            if let Some(ack) = acked {
                if a.at_us < ack {
                    early += 1;
                }
                latencies.push(a.at_us.saturating_sub(ack));
            }
        }
    }
    latencies.sort_unstable();
    from_send.sort_unstable();
    let coalesced = gaps + tail_missing;
    let drive_start_us = micros_since(t0, t_drive);
    let delivery_secs = (last_arrival_us.saturating_sub(drive_start_us)) as f64 / 1e6;
    let delivered_per_s = if delivery_secs > 0.0 {
        received as f64 / delivery_secs
    } else {
        0.0
    };
    let expected_per_s = args.rate as f64 * args.streams as f64;
    let achieved_rate = acked_total as f64 / drive_secs.max(1e-9);
    let drain_after_writes = (last_arrival_us as f64 - micros_since(t0, t_written) as f64) / 1e6;
    let backlog_nodes = outcomes.first().map_or(0, |o| o.backlog_nodes);
    let p50 = percentile(&latencies, 50.0);
    let p99 = percentile(&latencies, 99.0);
    let max = latencies.last().copied().unwrap_or(0);

    let rows = vec![
        row(
            "nodes created (AddNode)",
            format!(
                "{} in {add_secs:.1} s ({:.0}/s)",
                args.nodes,
                args.nodes as f64 / add_secs.max(1e-9)
            ),
        ),
        row("nodes per backlog (incl. the daemon's)", backlog_nodes),
        row(
            "streams",
            format!(
                "{} ({} per connection, {})",
                args.streams,
                args.streams_per_connection.max(1),
                if args.tls {
                    "mutual TLS, a node credential per connection"
                } else {
                    "UNIX socket"
                }
            ),
        ),
        row(
            "stream open + backlog",
            format!(
                "{open_secs:.1} s ({:.0} streams/s; cores: daemon {open_cores:.2}, client \
                 {open_client_cores:.2}, machine {open_host_cores:.2} of {})",
                args.streams as f64 / open_secs.max(1e-9),
                cpus()
            ),
        ),
        row("daemon RSS before streams", kib(rss_before as i64)),
        row(
            "daemon RSS with primer stream (cache loaded)",
            kib(rss_primer as i64),
        ),
        row("daemon RSS with all streams idle", kib(rss_idle as i64)),
        row("daemon RSS after the updates", kib(rss_after as i64)),
        row("RSS per idle stream", format!("{per_stream_kib:.1} KiB")),
        row(
            "updates acknowledged / sent / scheduled",
            format!("{acked_total} / {sent_total} / {total} ({write_errors} errors)"),
        ),
        row(
            "update rate achieved",
            format!(
                "{achieved_rate:.0}/s over {drive_secs:.2} s (target {}/s)",
                args.rate
            ),
        ),
        row(
            "UpdateNodeStatus RPC p50 / p99",
            format!(
                "{} / {} ms",
                ms(percentile(&rpc_lat, 50.0)),
                ms(percentile(&rpc_lat, 99.0))
            ),
        ),
        row("node states delivered (all streams)", received),
        row(
            "WatchEvents after backlog (all streams)",
            format!(
                "{events} ({:.2} states/event)",
                received as f64 / events.max(1) as f64
            ),
        ),
        row("delivered node-events/s", format!("{delivered_per_s:.0}")),
        row(
            "expected events/s (rate x streams)",
            format!("{expected_per_s:.0}"),
        ),
        row(
            "expected at achieved rate",
            format!("{:.0}", achieved_rate * args.streams as f64),
        ),
        row(
            "states coalesced (skipped)",
            format!(
                "{coalesced} ({:.1}%)",
                100.0 * coalesced as f64 / (coalesced + received).max(1) as f64
            ),
        ),
        row("states out of order (should be 0)", stale),
        row(
            "last arrival minus end of writes",
            format!("{drain_after_writes:.2} s"),
        ),
        row(
            "all streams drained",
            if drained {
                "yes".to_string()
            } else {
                format!("NO (gave up after {} s)", args.drain_timeout)
            },
        ),
        row("latency ack -> arrival p50", format!("{} ms", ms(p50))),
        row("latency ack -> arrival p99", format!("{} ms", ms(p99))),
        row("latency ack -> arrival max", format!("{} ms", ms(max))),
        row("arrivals before the ack (clamped to 0)", early),
        row(
            "latency send -> arrival p50 / p99",
            format!(
                "{} / {} ms",
                ms(percentile(&from_send, 50.0)),
                ms(percentile(&from_send, 99.0))
            ),
        ),
        row(
            "daemon CPU while driving+draining",
            format!("{drive_cores:.2} cores"),
        ),
        row(
            "client CPU while driving+draining",
            format!("{client_cores:.2} cores"),
        ),
        row(
            "machine CPU busy, all processes",
            format!("{host_cores:.2} of {} cores", cpus()),
        ),
        row("stream errors", stream_errors.len()),
    ];
    print_table(
        &format!(
            "fanout: {} nodes, {} streams, {} updates/s for {} s from {} writers",
            args.nodes, args.streams, args.rate, args.seconds, args.writers
        ),
        &rows,
    );
    for e in stream_errors.iter().take(5) {
        println!("  stream error: {e}");
    }
    if let Some(e) = writer_outcomes.iter().find_map(|o| o.first_error.as_ref()) {
        println!("  first update error: {e}");
    }
    println!("  RSS per idle stream = {per_stream_basis}");
    println!(
        "RESULT fanout runtime={} tls={} nodes={} streams={} rate={} seconds={} writers={} events_per_s={delivered_per_s:.0} \
         expected_events_per_s={expected_per_s:.0} achieved_rate={achieved_rate:.0} p50_ms={} p99_ms={} \
         max_ms={} coalesced={coalesced} delivered={received} rss_per_idle_stream_kib={per_stream_kib:.1} \
         drained={drained} update_errors={write_errors} stream_errors={}",
        target.runtime,
        args.tls,
        args.nodes,
        args.streams,
        args.rate,
        args.seconds,
        args.writers,
        ms(p50),
        ms(p99),
        ms(max),
        stream_errors.len()
    );
    Ok(())
}
