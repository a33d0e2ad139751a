//! Scenario `update-tls`: closed-loop `UpdateNodeStatus` over mutual TLS
//! against the daemon, then against the echo server (same TLS and gRPC
//! stack, no store), with the same client setup, at one or more numbers of
//! calls in flight.
//!
//! A closed loop of N clients measures throughput only while N calls keep
//! the server busy; below that it measures latency (Little's law: calls/s =
//! N / time per call). The daemon acknowledges an update only after its WAL
//! sync, so each of its calls is in flight longer than an echo call and it
//! needs more of them to be saturated. With several levels (`--clients
//! 128,256`) the scenario reports each server's ceiling, its best level,
//! and the ratio of the two ceilings, beside the ratio at each level.

use std::path::Path;
use std::time::{Duration, Instant};

use metropolis_proto::prelude::curator;
use metropolis_proto::prelude::curator::curator_client::CuratorClient;
use metropolis_transport::grpc::Channel;

use super::daemon::DaemonProcess;
use super::rounds::{self, ClientOutcome, Plan, Totals, Window};
use super::util::{NodeCred, RPC_TIMEOUT, Result, add_nodes, ms, print_table, row, status};

/// Arguments of `update-tls`.
#[derive(clap::Args, Debug, Clone)]
pub struct UpdateTlsArgs {
    /// Concurrent request loops; each sends one UpdateNodeStatus at a time
    /// and the next as soon as the answer arrives. A comma-separated list
    /// (`64,128,256,512`) measures each level on both servers in every
    /// round and adds each server's ceiling. On a 2-core machine 128 loops
    /// saturate the echo server; the daemon, whose calls each wait for a
    /// WAL sync, leaves the machine about 9 % idle at 128 but gains only
    /// about 6 % more at 512, at four times the latency (docs/performance.md).
    #[arg(long, value_delimiter = ',', default_values_t = [128])]
    pub clients: Vec<usize>,
    /// HTTP/2 connections over mutual TLS the clients are spread over
    /// (client i uses connection i mod N). A connection presents one node
    /// certificate, and the daemon lets a node update only its own status,
    /// so the clients of a connection all update that connection's node:
    /// with N < --clients several clients share a node. N = --clients gives
    /// every client its own node and connection. Capped at the smallest
    /// --clients level.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Measured duration of each window.
    #[arg(long, default_value_t = 4)]
    pub seconds: u64,
    /// Windows per server: the daemon and the echo server are measured in
    /// alternating windows (daemon, echo, daemon, ...), so that the
    /// machine's drift in speed affects both alike.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Unmeasured warm-up before the first window of each server.
    #[arg(long, default_value_t = 1)]
    pub warmup_seconds: u64,
    /// AddNode calls in flight while creating the nodes.
    #[arg(long, default_value_t = 32)]
    pub add_concurrency: usize,
}

/// One closed loop of `UpdateNodeStatus` of `node_id`: latencies of the
/// calls inside `measure_from..until`.
async fn client_loop(
    index: usize,
    mut client: CuratorClient<Channel>,
    node_id: String,
    measure_from: Instant,
    until: Instant,
) -> ClientOutcome {
    let mut out = ClientOutcome::default();
    let writer = u32::try_from(index).unwrap_or(u32::MAX);
    let mut seq = 0u32;
    loop {
        let start = Instant::now();
        if start >= until {
            break;
        }
        seq = seq.wrapping_add(1);
        let request = curator::UpdateNodeStatusRequest {
            node_id: node_id.clone(),
            status: Some(status(writer, seq)),
        };
        let result = tokio::time::timeout(RPC_TIMEOUT, client.update_node_status(request)).await;
        let end = Instant::now();
        let failure = match result {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Some(format!("no answer within {RPC_TIMEOUT:?}")),
        };
        if out.record(start, end, measure_from, until, failure) {
            break;
        }
    }
    out
}

/// Drives `clients` loops over `channels` (client i on channel i mod N,
/// updating that channel's node) for one window (also `update-etcd`'s
/// curator side).
pub(super) async fn window(
    channels: Vec<Channel>,
    nodes: &[NodeCred],
    clients: usize,
    warmup: Duration,
    seconds: Duration,
    server_pid: u32,
) -> Result<Window> {
    rounds::measure(warmup, seconds, server_pid, |from, until| async move {
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let c = i % channels.len();
                let client = metropolis_tests::curator(channels[c].clone());
                tokio::spawn(client_loop(i, client, nodes[c].id.clone(), from, until))
            })
            .collect();
        rounds::join(tasks, "a client loop").await
    })
    .await
}

/// The figures of one server at one level.
struct Measured {
    clients: usize,
    totals: Totals,
}

/// Rows of the table of one level.
fn level_rows(
    rows: &mut Vec<(String, String)>,
    d: &Totals,
    e: &Totals,
    ratios: &[f64],
    median: f64,
) {
    rounds::server_rows(rows, "daemon", "requests/s", d);
    rounds::server_rows(rows, "echo", "requests/s", e);
    rows.push(row(
        "daemon/echo requests/s",
        format!("{:.3}", rounds::ratio(d.rps, e.rps)),
    ));
    rows.push(row("daemon/echo per round", rounds::format_ratios(ratios)));
    rows.push(row("daemon/echo, median round", format!("{median:.3}")));
    rows.push(row(
        "daemon/echo CPU per request",
        format!("{:.3}", rounds::cpu_per_call_ratio(d, e)),
    ));
    rows.push(row(
        "daemon/echo p99",
        format!("{:.2}", rounds::ratio(d.p99_us as f64, e.p99_us as f64)),
    ));
}

/// The level with the most requests per second.
fn ceiling(levels: &[Measured]) -> Option<&Measured> {
    levels
        .iter()
        .max_by(|a, b| a.totals.rps.total_cmp(&b.totals.rps))
}

/// Runs the scenario.
pub async fn run(args: UpdateTlsArgs, target: &super::daemon::Target, work: &Path) -> Result<()> {
    let Some(&fewest) = args.clients.iter().min() else {
        return Err("--clients needs at least one level".into());
    };
    if fewest == 0 || args.connections == 0 || args.seconds == 0 || args.rounds == 0 {
        return Err("--clients, --connections, --seconds and --rounds must be at least 1".into());
    }
    let connections = args.connections.min(fewest);
    let levels = args
        .clients
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let data_dir = work.join("daemon");
    let mut daemon = DaemonProcess::start(target, &data_dir, "warn")?;
    println!(
        "update-tls: daemon pid {} ({} runtime) on {} (data {}); {levels} clients over {} TLS connections",
        daemon.pid()?,
        target.runtime,
        daemon.addr,
        data_dir.display(),
        connections
    );
    if connections < args.clients.iter().copied().max().unwrap_or(fewest) {
        println!(
            "  note: a connection authenticates one node and a node may update only itself, \
             so the clients update {connections} nodes (clients i and i + {connections} share one)"
        );
    }
    let owner = daemon.owner()?;
    let nodes = add_nodes(
        &daemon.addr,
        &owner,
        connections,
        args.add_concurrency,
        connections,
    )
    .await?;
    let warmup = Duration::from_secs(args.warmup_seconds);
    let seconds = Duration::from_secs(args.seconds);

    let plan = Plan {
        rounds: args.rounds,
        warmup,
        seconds,
        unit: "req/s",
        levels: args
            .clients
            .iter()
            .map(|n| format!("{n} clients"))
            .collect(),
    };
    let daemon_addr = daemon.addr.clone();
    let clients = &args.clients;
    let windows = rounds::against_echo(
        &mut daemon,
        &daemon_addr,
        nodes.iter().map(|n| &n.creds),
        work,
        &plan,
        |channels, settle, pid, level| {
            window(channels, &nodes, clients[level], settle, seconds, pid)
        },
    )
    .await?;

    let (mut daemon_levels, mut echo_levels) = (Vec::new(), Vec::new());
    for (&n, level) in args.clients.iter().zip(windows) {
        let (ratios, median) = rounds::round_ratios(&level.daemon, &level.echo);
        let (d, e) = (Totals::of(level.daemon), Totals::of(level.echo));
        let mut rows = Vec::new();
        level_rows(&mut rows, &d, &e, &ratios, median);
        print_table(
            &format!(
                "update-tls: {n} clients, {connections} connections, {} x {} s measured on each",
                args.rounds, args.seconds
            ),
            &rows,
        );
        rounds::print_first_errors(&d, &e);
        println!(
            "RESULT update-tls runtime={} clients={n} connections={connections} rounds={} seconds={} daemon_rps={:.0} daemon_p50_ms={} \
             daemon_p99_ms={} daemon_errors={} echo_rps={:.0} echo_p50_ms={} echo_p99_ms={} \
             echo_errors={} ratio_rps={:.3} ratio_median={median:.3} daemon_cpu_cores={:.2} echo_cpu_cores={:.2} \
             cpu_per_call_ratio={:.3}",
            target.runtime,
            args.rounds,
            args.seconds,
            d.rps,
            ms(d.p50_us),
            ms(d.p99_us),
            d.errors,
            e.rps,
            ms(e.p50_us),
            ms(e.p99_us),
            e.errors,
            rounds::ratio(d.rps, e.rps),
            d.server_cores,
            e.server_cores,
            rounds::cpu_per_call_ratio(&d, &e),
        );
        if d.requests == 0 || e.requests == 0 {
            return Err(format!("{n} clients completed no request in a measured window").into());
        }
        daemon_levels.push(Measured {
            clients: n,
            totals: d,
        });
        echo_levels.push(Measured {
            clients: n,
            totals: e,
        });
    }
    if let (Some(d), Some(e)) = (ceiling(&daemon_levels), ceiling(&echo_levels))
        && args.clients.len() > 1
    {
        let r = rounds::ratio(d.totals.rps, e.totals.rps);
        print_table(
            "update-tls: ceilings (each server at its best level)",
            &[
                row(
                    "daemon: requests/s (clients, p99 ms)",
                    format!(
                        "{:.0} ({}, {})",
                        d.totals.rps,
                        d.clients,
                        ms(d.totals.p99_us)
                    ),
                ),
                row(
                    "echo: requests/s (clients, p99 ms)",
                    format!(
                        "{:.0} ({}, {})",
                        e.totals.rps,
                        e.clients,
                        ms(e.totals.p99_us)
                    ),
                ),
                row("daemon/echo ceilings", format!("{r:.3}")),
            ],
        );
        println!(
            "RESULT update-tls-ceiling runtime={} daemon_rps={:.0} daemon_clients={} daemon_p99_ms={} \
             echo_rps={:.0} echo_clients={} echo_p99_ms={} ratio_ceiling={r:.3}",
            target.runtime,
            d.totals.rps,
            d.clients,
            ms(d.totals.p99_us),
            e.totals.rps,
            e.clients,
            ms(e.totals.p99_us),
        );
    }
    Ok(())
}
