//! Scenario `update-tls`: closed-loop `UpdateNodeStatus` over mutual TLS
//! against the daemon, then against the echo server (same TLS and gRPC
//! stack, no store), with the same client setup.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_host::grpc::Channel;
use metropolis_proto::prelude::curator;
use metropolis_proto::prelude::curator::curator_client::CuratorClient;

use super::daemon::{DaemonProcess, free_addr};
use super::echo::EchoProcess;
use super::util::{
    CpuMeter, HostCpuMeter, NodeCred, RPC_TIMEOUT, Result, add_nodes, bounded, cpus, micros_since,
    ms, percentile, print_table, row, status, tls_channel,
};

/// Arguments of `update-tls`.
#[derive(clap::Args, Debug, Clone)]
pub struct UpdateTlsArgs {
    /// Concurrent request loops; each sends one UpdateNodeStatus at a time
    /// and the next as soon as the answer arrives.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// HTTP/2 connections over mutual TLS the clients are spread over
    /// (client i uses connection i mod N). A connection presents one node
    /// certificate, and the daemon lets a node update only its own status,
    /// so the clients of a connection all update that connection's node:
    /// with N < --clients several clients share a node. N = --clients gives
    /// every client its own node and connection. Capped at --clients.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Measured duration of each run (daemon, then echo server).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Unmeasured warm-up before each measured window.
    #[arg(long, default_value_t = 1)]
    pub warmup_seconds: u64,
    /// AddNode calls in flight while creating the nodes.
    #[arg(long, default_value_t = 32)]
    pub add_concurrency: usize,
}

/// What one client loop saw.
#[derive(Default)]
struct ClientOutcome {
    latencies_us: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

/// The figures of one measured run.
struct RunStats {
    requests: u64,
    rps: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    errors: u64,
    first_error: Option<String>,
    server_cores: f64,
    client_cores: f64,
    host_cores: f64,
}

/// Gives up a client loop after this many failed calls.
const MAX_ERRORS_PER_CLIENT: u64 = 100;

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
        match failure {
            None => {
                if start >= measure_from && end <= until {
                    out.latencies_us.push(micros_since(start, end));
                }
            }
            Some(why) => {
                out.errors += 1;
                out.first_error.get_or_insert(why);
                if out.errors >= MAX_ERRORS_PER_CLIENT {
                    break;
                }
            }
        }
    }
    out
}

/// Drives `clients` loops over connections to `addr` presenting `nodes`
/// (one connection per node), measuring `seconds` after `warmup`; CPU of
/// process `server_pid` is sampled over the measured window.
async fn drive(
    addr: &str,
    nodes: &[NodeCred],
    clients: usize,
    warmup: Duration,
    seconds: Duration,
    server_pid: u32,
) -> Result<RunStats> {
    let channels: Vec<Channel> = futures::stream::iter(nodes)
        .map(|n| tls_channel(addr, &n.creds))
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let measure_from = Instant::now() + warmup;
    let until = measure_from + seconds;
    let mut tasks = Vec::with_capacity(clients);
    for i in 0..clients {
        let c = i % channels.len();
        let client = metropolis_tests::curator(channels[c].clone());
        tasks.push(tokio::spawn(client_loop(
            i,
            client,
            nodes[c].id.clone(),
            measure_from,
            until,
        )));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let server_cpu = CpuMeter::start(server_pid)?;
    let client_cpu = CpuMeter::start(std::process::id())?;
    let host_cpu = HostCpuMeter::start()?;
    tokio::time::sleep_until(until.into()).await;
    let host_cores = host_cpu.cores()?;
    let server_cores = server_cpu.cores()?;
    let client_cores = client_cpu.cores()?;

    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for task in tasks {
        let out = bounded(RPC_TIMEOUT * 2, || "a client loop".into(), task)
            .await?
            .map_err(|e| format!("a client loop failed: {e}"))?;
        latencies.extend(out.latencies_us);
        errors += out.errors;
        if first_error.is_none() {
            first_error = out.first_error;
        }
    }
    latencies.sort_unstable();
    let requests = latencies.len() as u64;
    Ok(RunStats {
        requests,
        rps: requests as f64 / seconds.as_secs_f64(),
        p50_us: percentile(&latencies, 50.0),
        p99_us: percentile(&latencies, 99.0),
        max_us: latencies.last().copied().unwrap_or(0),
        errors,
        first_error,
        server_cores,
        client_cores,
        host_cores,
    })
}

/// Runs the scenario.
pub async fn run(args: UpdateTlsArgs, target: &super::daemon::Target, work: &Path) -> Result<()> {
    if args.clients == 0 || args.connections == 0 || args.seconds == 0 {
        return Err("--clients, --connections and --seconds must be at least 1".into());
    }
    let connections = args.connections.min(args.clients);
    let data_dir = work.join("daemon");
    let mut daemon = DaemonProcess::start(target, &data_dir, "warn")?;
    println!(
        "update-tls: daemon pid {} ({} runtime) on {} (data {}); {} clients over {} TLS connections",
        daemon.pid()?,
        target.runtime,
        daemon.addr,
        data_dir.display(),
        args.clients,
        connections
    );
    if connections < args.clients {
        println!(
            "  note: a connection authenticates one node and a node may update only itself, \
             so the {} clients update {} nodes ({:.1} clients per node)",
            args.clients,
            connections,
            args.clients as f64 / connections as f64
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

    println!("  driving the daemon for {warmup:?} + {seconds:?} ...");
    let d = drive(
        &daemon.addr,
        &nodes,
        args.clients,
        warmup,
        seconds,
        daemon.pid()?,
    )
    .await?;
    daemon.check_alive()?;
    let pki = daemon.pki_dir();
    daemon.stop();

    let echo_addr = free_addr()?;
    let mut echo = EchoProcess::start(&echo_addr, &pki, &work.join("echo.log"))?;
    println!(
        "  driving the echo server (pid {}) on {echo_addr} for {warmup:?} + {seconds:?} ...",
        echo.pid()?
    );
    let e = drive(
        &echo_addr,
        &nodes,
        args.clients,
        warmup,
        seconds,
        echo.pid()?,
    )
    .await?;
    echo.check_alive()?;
    echo.stop();

    let ratio = if e.rps > 0.0 { d.rps / e.rps } else { 0.0 };
    let p99_ratio = if e.p99_us > 0 {
        d.p99_us as f64 / e.p99_us as f64
    } else {
        0.0
    };
    let mut rows = Vec::new();
    for (name, s) in [("daemon", &d), ("echo", &e)] {
        rows.push(row(&format!("{name}: requests in window"), s.requests));
        rows.push(row(&format!("{name}: requests/s"), format!("{:.0}", s.rps)));
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
    rows.push(row("daemon/echo requests/s", format!("{ratio:.3}")));
    rows.push(row("daemon/echo p99", format!("{p99_ratio:.2}")));
    print_table(
        &format!(
            "update-tls: {} clients, {} connections, {} s measured",
            args.clients, connections, args.seconds
        ),
        &rows,
    );
    for (name, s) in [("daemon", &d), ("echo", &e)] {
        if let Some(why) = &s.first_error {
            println!("  {name}: first error: {why}");
        }
    }
    println!(
        "RESULT update-tls runtime={} clients={} connections={} seconds={} daemon_rps={:.0} daemon_p50_ms={} \
         daemon_p99_ms={} daemon_errors={} echo_rps={:.0} echo_p50_ms={} echo_p99_ms={} \
         echo_errors={} ratio_rps={ratio:.3} daemon_cpu_cores={:.2} echo_cpu_cores={:.2}",
        target.runtime,
        args.clients,
        connections,
        args.seconds,
        d.rps,
        ms(d.p50_us),
        ms(d.p99_us),
        d.errors,
        e.rps,
        ms(e.p50_us),
        ms(e.p99_us),
        e.errors,
        d.server_cores,
        e.server_cores,
    );
    if d.requests == 0 || e.requests == 0 {
        return Err("a run completed no request in its measured window".into());
    }
    Ok(())
}
