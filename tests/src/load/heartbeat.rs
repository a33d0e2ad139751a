//! Scenario `heartbeat`: many agents, each with its own Ed25519 key and
//! its own mutual-TLS connection (reused), send closed-loop heartbeats to
//! the AgentCallback port; then the same clients against the echo server
//! (same TLS and gRPC stack, a Heartbeat that does nothing).

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_host::grpc::Channel;
use metropolis_host::pki::{Credentials, generate_agent_key, self_signed_agent_certificate};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::agent_callback_client::AgentCallbackClient;

use super::daemon::{DaemonProcess, free_addr};
use super::echo::EchoProcess;
use super::util::{
    Context, CpuMeter, HostCpuMeter, RPC_TIMEOUT, Result, bounded, cpus, micros_since, ms,
    percentile, print_table, row, tls_channel,
};

/// Arguments of `heartbeat`.
#[derive(clap::Args, Debug, Clone)]
pub struct HeartbeatArgs {
    /// Agents, each with its own key, machine and TLS connection.
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
    /// Measured duration of each run (daemon, then echo server).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Unmeasured warm-up before each measured window.
    #[arg(long, default_value_t = 1)]
    pub warmup_seconds: u64,
}

struct Agent {
    machine_id: String,
    creds: Credentials,
}

fn machine_id(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

#[derive(Default)]
struct Outcome {
    latencies_us: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

async fn agent_loop(
    mut client: AgentCallbackClient<Channel>,
    machine_id: String,
    from: Instant,
    until: Instant,
) -> Outcome {
    let mut out = Outcome::default();
    loop {
        let start = Instant::now();
        if start >= until || out.errors >= 100 {
            return out;
        }
        let request = agent::HeartbeatRequest {
            machine_id: machine_id.clone(),
            ..Default::default()
        };
        match tokio::time::timeout(RPC_TIMEOUT, client.heartbeat(request)).await {
            Ok(Ok(_)) => {
                let end = Instant::now();
                if start >= from && end <= until {
                    out.latencies_us.push(micros_since(start, end));
                }
            }
            Ok(Err(s)) => {
                out.errors += 1;
                out.first_error
                    .get_or_insert_with(|| format!("{:?}: {}", s.code(), s.message()));
            }
            Err(_) => {
                out.errors += 1;
                out.first_error
                    .get_or_insert_with(|| format!("no answer within {RPC_TIMEOUT:?}"));
            }
        }
    }
}

struct Stats {
    rps: f64,
    p50_us: u64,
    p99_us: u64,
    errors: u64,
    first_error: Option<String>,
    server_cores: f64,
    host_cores: f64,
}

async fn drive(
    addr: &str,
    agents: &[Agent],
    warmup: Duration,
    seconds: Duration,
    server_pid: u32,
) -> Result<Stats> {
    let channels: Vec<Channel> = futures::stream::iter(agents)
        .map(|a| tls_channel(addr, &a.creds))
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let from = Instant::now() + warmup;
    let until = from + seconds;
    let tasks: Vec<_> = channels
        .into_iter()
        .zip(agents)
        .map(|(c, a)| {
            tokio::spawn(agent_loop(
                AgentCallbackClient::with_origin(c, Channel::origin()),
                a.machine_id.clone(),
                from,
                until,
            ))
        })
        .collect();
    tokio::time::sleep_until(from.into()).await;
    let server = CpuMeter::start(server_pid)?;
    let host = HostCpuMeter::start()?;
    tokio::time::sleep_until(until.into()).await;
    let (server_cores, host_cores) = (server.cores()?, host.cores()?);
    let mut latencies = Vec::new();
    let (mut errors, mut first_error) = (0, None);
    for t in tasks {
        let out = bounded(RPC_TIMEOUT * 2, || "an agent loop".into(), t)
            .await?
            .map_err(|e| format!("an agent loop failed: {e}"))?;
        latencies.extend(out.latencies_us);
        errors += out.errors;
        first_error = first_error.or(out.first_error);
    }
    latencies.sort_unstable();
    Ok(Stats {
        rps: latencies.len() as f64 / seconds.as_secs_f64(),
        p50_us: percentile(&latencies, 50.0),
        p99_us: percentile(&latencies, 99.0),
        errors,
        first_error,
        server_cores,
        host_cores,
    })
}

/// Runs the scenario.
pub async fn run(args: HeartbeatArgs, target: &super::daemon::Target, work: &Path) -> Result<()> {
    if args.agents == 0 || args.seconds == 0 {
        return Err("--agents and --seconds must be at least 1".into());
    }
    let mut daemon = DaemonProcess::start(target, &work.join("daemon"), "warn")?;
    println!(
        "heartbeat: daemon pid {} ({} runtime), AgentCallback on {}; {} agents",
        daemon.pid()?,
        target.runtime,
        daemon.agent_addr,
        args.agents
    );
    let owner = daemon.owner()?;
    let mut mgmt = MachineManagementClient::with_origin(
        tls_channel(&daemon.addr, &owner).await?,
        Channel::origin(),
    );
    let mut agents = Vec::with_capacity(args.agents);
    for i in 0..args.agents {
        let key = generate_agent_key().context(|| "generating an agent key".into())?;
        let (cert, public) =
            self_signed_agent_certificate(&key).context(|| "agent certificate".into())?;
        let id = machine_id(i);
        mgmt.add_machine(AddMachineRequest {
            machine_id: id.clone(),
            agent_public_key: public.to_vec().into(),
        })
        .await
        .context(|| format!("AddMachine {id}"))?;
        agents.push(Agent {
            machine_id: id,
            creds: Credentials::from_parts(cert, key, owner.ca_pem.clone()),
        });
    }
    let (warmup, seconds) = (
        Duration::from_secs(args.warmup_seconds),
        Duration::from_secs(args.seconds),
    );
    println!("  driving the daemon for {warmup:?} + {seconds:?} ...");
    let d = drive(&daemon.agent_addr, &agents, warmup, seconds, daemon.pid()?).await?;
    daemon.check_alive()?;
    let pki = daemon.pki_dir();
    daemon.stop();
    let echo_addr = free_addr()?;
    let mut echo = EchoProcess::start(&echo_addr, &pki, &work.join("echo.log"))?;
    println!("  driving the echo server on {echo_addr} for {warmup:?} + {seconds:?} ...");
    let e = drive(&echo_addr, &agents, warmup, seconds, echo.pid()?).await?;
    echo.check_alive()?;
    echo.stop();
    let ratio = if e.rps > 0.0 { d.rps / e.rps } else { 0.0 };
    let mut rows = Vec::new();
    for (name, s) in [("daemon", &d), ("echo", &e)] {
        rows.push(row(
            &format!("{name}: heartbeats/s"),
            format!("{:.0}", s.rps),
        ));
        rows.push(row(&format!("{name}: p50 ms"), ms(s.p50_us)));
        rows.push(row(&format!("{name}: p99 ms"), ms(s.p99_us)));
        rows.push(row(&format!("{name}: errors"), s.errors));
        rows.push(row(
            &format!("{name}: server CPU (cores)"),
            format!("{:.2}", s.server_cores),
        ));
        rows.push(row(
            &format!("{name}: machine CPU"),
            format!("{:.2} of {}", s.host_cores, cpus()),
        ));
    }
    rows.push(row("daemon/echo heartbeats/s", format!("{ratio:.3}")));
    print_table(
        &format!(
            "heartbeat: {} agents, {} s measured",
            args.agents, args.seconds
        ),
        &rows,
    );
    for (name, s) in [("daemon", &d), ("echo", &e)] {
        if let Some(why) = &s.first_error {
            println!("  {name}: first error: {why}");
        }
    }
    println!(
        "RESULT heartbeat runtime={} agents={} seconds={} daemon_rps={:.0} daemon_p50_ms={} daemon_p99_ms={} daemon_errors={} echo_rps={:.0} echo_p99_ms={} ratio_rps={ratio:.3}",
        target.runtime,
        args.agents,
        args.seconds,
        d.rps,
        ms(d.p50_us),
        ms(d.p99_us),
        d.errors,
        e.rps,
        ms(e.p99_us),
    );
    Ok(())
}
