//! Scenario `fanout-storm`: a reconnect storm. Two curator instances over
//! one etcd; every Watch stream is open on the leader (each on a
//! connection of its own) when the leader is killed (SIGKILL). Every
//! stream then reconnects to the other instance and reads its new backlog
//! up to `PROGRESS_LAST_BACKLOGGED`, as the nodes of a fleet do when
//! their leader dies. Measured: the time from the kill until each stream
//! (and the last one) has its new backlog, the retries it took, and the
//! new leader's peak resident memory over the storm.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use metropolis_proto::prelude::curator;
use tokio::sync::{Semaphore, mpsc, watch};

use super::daemon::{DaemonProcess, Target};
use super::fanout::{Connections, Dial, open_past_backlog, open_watch, wait_ready};
use super::fanout_etcd::{start_elected, wait_serving};
use super::util::{
    Context, HostCpuMeter, NodeCred, RPC_TIMEOUT, Result, add_nodes, bounded, cpus, ms, percentile,
    print_table, row, tls_channel, unix_channel,
};

/// Arguments of `fanout-storm`.
#[derive(clap::Args, Debug, Clone)]
pub struct StormArgs {
    /// Nodes to create before the streams open (each stream's backlog).
    #[arg(long, default_value_t = 10000)]
    pub nodes: usize,
    /// Watch streams open on the leader when it is killed, one per
    /// connection.
    #[arg(long, default_value_t = 10000)]
    pub streams: usize,
    /// Over mutual TLS to the curator ports, each connection with its own
    /// node's credential (--nodes must cover --streams), instead of over
    /// the UNIX sockets.
    #[arg(long)]
    pub tls: bool,
    /// The instances' --lease-ttl (seconds): how long the dead leader
    /// keeps the role.
    #[arg(long, default_value_t = 2)]
    pub lease_ttl: u64,
    /// Streams opening on the leader at a time, before the kill.
    #[arg(long, default_value_t = 50)]
    pub open_concurrency: usize,
    /// Streams reconnecting at a time after the kill (default: all).
    #[arg(long, default_value_t = 100_000)]
    pub reconnect_concurrency: usize,
    /// Milliseconds a stream waits before trying again after a failed
    /// reconnection.
    #[arg(long, default_value_t = 100)]
    pub retry_ms: u64,
    /// Seconds to wait for every stream to open (before the kill) and to
    /// reconnect (after).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

/// What one stream did after the kill.
struct Reconnected {
    /// From the kill until its new backlog was in, or why it never was.
    outcome: std::result::Result<Duration, String>,
    /// Failed attempts before that.
    retries: u64,
}

/// How the streams reconnect, shared by all of them.
struct Reconnecting {
    /// Where to.
    dial: Arc<Dial>,
    /// Limits the attempts in flight.
    permits: Semaphore,
    /// Wait between attempts.
    retry: Duration,
    /// Give up this long after the kill.
    limit: Duration,
    /// The streams held open after their backlog.
    held: Held,
}

/// The reconnected streams held open after their backlog.
#[derive(Default)]
struct Held {
    /// How many are open now.
    open: AtomicUsize,
    /// How the first one to end ended.
    first_end: std::sync::Mutex<Option<String>>,
}

/// `VmHWM` (peak resident set) of `pid`, KiB.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("no VmHWM in /proc/{pid}/status").into())
}

/// Stream `index`: waits until the leader is killed (its stream on the
/// leader ends), then reconnects to `dial` until a backlog is in.
async fn reconnect(
    index: usize,
    mut stream: tonic::Streaming<super::fanout::LiteEvent>,
    mut killed: watch::Receiver<Option<Instant>>,
    how: Arc<Reconnecting>,
) -> Reconnected {
    let Reconnecting {
        dial,
        permits,
        retry,
        limit,
        held,
    } = &*how;
    let (retry, limit) = (*retry, *limit);
    // The old stream says nothing more until it breaks.
    while let Ok(Some(_)) = stream.message().await {}
    drop(stream);
    let kill = loop {
        if let Some(at) = *killed.borrow_and_update() {
            break at;
        }
        if killed.changed().await.is_err() {
            return Reconnected {
                outcome: Err(format!("stream {index}: the scenario ended")),
                retries: 0,
            };
        }
    };
    let mut retries = 0;
    let mut last_error = String::new();
    while kill.elapsed() < limit {
        let attempt = async {
            let _permit = permits.acquire().await.map_err(|_| "semaphore closed")?;
            let channel = match &**dial {
                Dial::Unix(socket) => unix_channel(socket).await?,
                Dial::Tls { addr, nodes } => {
                    let node = nodes
                        .get(index % nodes.len().max(1))
                        .ok_or("no node credential")?;
                    tls_channel(addr, &node.creds).await?
                }
            };
            let mut stream = open_watch(channel).await?;
            loop {
                let event = bounded(RPC_TIMEOUT, || "Watch backlog".into(), stream.message())
                    .await?
                    .context(|| "Watch backlog".into())?
                    .ok_or("Watch ended before its backlog marker")?;
                if event.progress == curator::watch_event::Progress::LastBacklogged as i32 {
                    return Ok::<_, super::util::Error>(stream);
                }
            }
        };
        match attempt.await {
            Ok(stream) => {
                let took = kill.elapsed();
                // Held open (idle) until the scenario ends, as a fleet's
                // streams would be; counted while open.
                held.open.fetch_add(1, Ordering::Relaxed);
                let how = how.clone();
                tokio::spawn(async move {
                    let held = &how.held;
                    let mut stream = stream;
                    let why = loop {
                        match stream.message().await {
                            Ok(Some(_)) => {}
                            Ok(None) => break "the server ended it".to_owned(),
                            Err(s) => break format!("{:?}: {}", s.code(), s.message()),
                        }
                    };
                    held.open.fetch_sub(1, Ordering::Relaxed);
                    let mut first = held.first_end.lock().unwrap_or_else(|e| e.into_inner());
                    first.get_or_insert(why);
                });
                return Reconnected {
                    outcome: Ok(took),
                    retries,
                };
            }
            Err(e) => {
                retries += 1;
                last_error = e.to_string();
                tokio::time::sleep(retry).await;
            }
        }
    }
    Reconnected {
        outcome: Err(format!(
            "stream {index}: no backlog within {limit:?} of the kill ({retries} attempts; last: \
             {last_error})"
        )),
        retries,
    }
}

/// Runs the scenario.
pub async fn run(args: StormArgs, target: &Target, work: &Path) -> Result<()> {
    if args.streams == 0 {
        return Err("--streams must be at least 1".into());
    }
    if args.tls && args.streams > args.nodes {
        return Err(format!(
            "--tls: {} streams need as many nodes, --nodes is {}",
            args.streams, args.nodes
        )
        .into());
    }
    let limit = Duration::from_secs(args.timeout);
    let (etcd, mut leader) = start_elected(target, work, args.lease_ttl).await?;
    // The second instance shares the first one's cluster CA (what `metroctl
    // node add --curator` and `--join` hand over) and follows it.
    let second_dir = work.join("daemon-b");
    let pki = second_dir.join("pki");
    std::fs::create_dir_all(&pki).context(|| format!("creating {}", pki.display()))?;
    for file in ["ca.pem", "ca-key.pem"] {
        let from = leader.data_dir.join("pki").join(file);
        std::fs::copy(&from, pki.join(file)).context(|| format!("copying {}", from.display()))?;
    }
    let mut extra = target.extra.clone();
    extra.extend([
        "--etcd".to_string(),
        etcd.url(),
        "--lease-ttl".to_string(),
        args.lease_ttl.to_string(),
    ]);
    let mut next =
        DaemonProcess::start_with(&target.bin, &second_dir, target.runtime, "warn", &extra)?;
    wait_serving(&mut next, Duration::from_secs(60)).await?;
    let next_pid = next.pid()?;
    println!(
        "fanout-storm: etcd at {}; leader pid {} on {}; next leader pid {next_pid} on {} ({} \
         runtime)",
        etcd.url(),
        leader.pid()?,
        leader.addr,
        next.addr,
        target.runtime
    );

    let owner = leader.owner()?;
    let keep = if args.tls { args.streams } else { 0 };
    let nodes: Vec<NodeCred> = add_nodes(&leader.addr, &owner, args.nodes, 32, keep).await?;
    let (to_leader, to_next) = if args.tls {
        (
            Dial::Tls {
                addr: leader.addr.clone(),
                nodes: nodes.clone(),
            },
            Dial::Tls {
                addr: next.addr.clone(),
                nodes,
            },
        )
    } else {
        (
            Dial::Unix(leader.socket.clone()),
            Dial::Unix(next.socket.clone()),
        )
    };

    // Every stream open on the leader, past its backlog.
    let connections = Arc::new(Connections::new(to_leader, args.streams, 1));
    let open = Arc::new(Semaphore::new(args.open_concurrency.max(1)));
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    let (kill_tx, kill_rx) = watch::channel(None);
    let to_next = Arc::new(to_next);
    let how = Arc::new(Reconnecting {
        dial: to_next.clone(),
        permits: Semaphore::new(args.reconnect_concurrency.max(1)),
        retry: Duration::from_millis(args.retry_ms),
        limit,
        held: Held::default(),
    });
    let t_open = Instant::now();
    let mut tasks = Vec::with_capacity(args.streams);
    for i in 0..args.streams {
        let (connections, open, ready) = (connections.clone(), open.clone(), ready_tx.clone());
        let (killed, how) = (kill_rx.clone(), how.clone());
        tasks.push(tokio::spawn(async move {
            match open_past_backlog(i, &connections, &open).await {
                Ok((stream, _)) => {
                    let _ = ready.send(Ok(()));
                    reconnect(i, stream, killed, how).await
                }
                Err(e) => {
                    let _ = ready.send(Err(format!("stream {i}: {e}").into()));
                    Reconnected {
                        outcome: Err(format!("stream {i}: {e}")),
                        retries: 0,
                    }
                }
            }
        }));
    }
    wait_ready(&mut ready_rx, args.streams, limit).await?;
    let open_secs = t_open.elapsed().as_secs_f64();
    drop(connections);
    tokio::time::sleep(Duration::from_secs(2)).await;
    next.check_alive()?;
    let next_rss_before = next.rss_kib()?;
    let next_peak_before = peak_rss_kib(next_pid)?;
    println!(
        "  {} streams open on the leader ({open_secs:.1} s); killing it",
        args.streams
    );

    // The kill, and the storm.
    let host = HostCpuMeter::start()?;
    let killed_at = Instant::now();
    leader.stop();
    let _ = kill_tx.send(Some(killed_at));
    let mut took = Vec::with_capacity(args.streams);
    let mut retries = 0u64;
    let mut errors = Vec::new();
    for task in tasks {
        let out = bounded(limit + RPC_TIMEOUT, || "a reconnecting stream".into(), task)
            .await?
            .map_err(|e| format!("a stream task failed: {e}"))?;
        retries += out.retries;
        match out.outcome {
            Ok(d) => took.push(d.as_micros() as u64),
            Err(e) => errors.push(e),
        }
    }
    let storm_secs = killed_at.elapsed().as_secs_f64();
    let host_cores = host.cores()?;
    let next_peak = peak_rss_kib(next_pid)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    next.check_alive()?;
    let next_rss_after = next.rss_kib()?;
    let held = &how.held;
    let still_open = held.open.load(Ordering::Relaxed);
    took.sort_unstable();
    let first = took.first().copied().unwrap_or(0);
    let last = took.last().copied().unwrap_or(0);
    let per_stream = |kib: u64| (kib as f64 - next_rss_before as f64) / args.streams as f64;

    let rows = vec![
        row("nodes per backlog", args.nodes + 2),
        row(
            "streams",
            format!(
                "{} (1 per connection, {})",
                args.streams,
                if args.tls {
                    "mutual TLS, a node credential per connection"
                } else {
                    "UNIX sockets"
                }
            ),
        ),
        row("lease TTL", format!("{} s", args.lease_ttl)),
        row("streams open on the leader", format!("{open_secs:.1} s")),
        row(
            "new backlog after the kill: first",
            format!("{} ms", ms(first)),
        ),
        row(
            "new backlog after the kill: p50 / p99",
            format!(
                "{} / {} ms",
                ms(percentile(&took, 50.0)),
                ms(percentile(&took, 99.0))
            ),
        ),
        row(
            "new backlog after the kill: every stream",
            format!("{} ms", ms(last)),
        ),
        row("failed reconnection attempts", retries),
        row(
            "new leader RSS before the kill (peak so far)",
            format!("{next_rss_before} KiB ({next_peak_before} KiB)"),
        ),
        row(
            "new leader peak RSS over the storm",
            format!(
                "{next_peak} KiB ({:.1} KiB per stream over before)",
                per_stream(next_peak)
            ),
        ),
        row(
            "reconnected streams still open 2 s later",
            match held
                .first_end
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                None => format!("{still_open}"),
                Some(why) => format!("{still_open} (the first to end: {why})"),
            },
        ),
        row(
            "new leader RSS with them idle",
            format!(
                "{next_rss_after} KiB ({:.1} KiB per open stream over before)",
                (next_rss_after as f64 - next_rss_before as f64) / still_open.max(1) as f64
            ),
        ),
        row(
            "machine CPU busy over the storm",
            format!("{host_cores:.2} of {} cores ({storm_secs:.1} s)", cpus()),
        ),
        row("streams without a new backlog", errors.len()),
    ];
    print_table(
        &format!(
            "fanout-storm: {} streams on the leader, leader killed",
            args.streams
        ),
        &rows,
    );
    for e in errors.iter().take(5) {
        println!("  stream error: {e}");
    }
    println!(
        "RESULT fanout-storm runtime={} tls={} nodes={} streams={} lease_ttl_s={} first_ms={} \
         p50_ms={} p99_ms={} all_ms={} retries={retries} peak_rss_kib={next_peak} \
         idle_rss_kib={next_rss_after} still_open={still_open} errors={}",
        target.runtime,
        args.tls,
        args.nodes,
        args.streams,
        args.lease_ttl,
        ms(first),
        ms(percentile(&took, 50.0)),
        ms(percentile(&took, 99.0)),
        ms(last),
        errors.len()
    );
    Ok(())
}
