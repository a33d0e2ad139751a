//! Scenario `heartbeat`: many agents, each with its own Ed25519 key and
//! its own mutual-TLS connection (reused), send closed-loop heartbeats to
//! the AgentCallback port; then the same clients against the echo server
//! (same TLS and gRPC stack, a Heartbeat that does nothing).

use std::path::Path;
use std::time::{Duration, Instant};

use metropolis_pki::{Credentials, generate_agent_key, self_signed_agent_certificate};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::agent_callback_client::AgentCallbackClient;
use metropolis_transport::grpc::Channel;

use super::daemon::DaemonProcess;
use super::rounds::{self, ClientOutcome, Plan, Totals, Window};
use super::util::{Context, RPC_TIMEOUT, Result, micros_since, ms, print_table, row, tls_channel};

/// Arguments of `heartbeat`.
#[derive(clap::Args, Debug, Clone)]
pub struct HeartbeatArgs {
    /// Agents, each with its own key, machine and TLS connection.
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
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
}

/// An enrolled agent: its machine and its credential.
pub struct Agent {
    /// The machine's id.
    pub machine_id: String,
    /// Its self-signed agent certificate and key.
    pub creds: Credentials,
}

fn machine_id(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

async fn agent_loop(
    mut client: AgentCallbackClient<Channel>,
    machine_id: String,
    from: Instant,
    until: Instant,
) -> ClientOutcome {
    let mut out = ClientOutcome::default();
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

/// Drives one agent loop per channel for one window.
pub async fn window(
    channels: Vec<Channel>,
    agents: &[Agent],
    warmup: Duration,
    seconds: Duration,
    server_pid: u32,
) -> Result<Window> {
    rounds::measure(warmup, seconds, server_pid, |from, until| async move {
        let tasks: Vec<_> = channels
            .iter()
            .zip(agents)
            .map(|(c, a)| {
                tokio::spawn(agent_loop(
                    AgentCallbackClient::with_origin(c.clone(), Channel::origin()),
                    a.machine_id.clone(),
                    from,
                    until,
                ))
            })
            .collect();
        rounds::join(tasks, "an agent loop").await
    })
    .await
}

/// Runs the scenario.
pub async fn run(args: HeartbeatArgs, target: &super::daemon::Target, work: &Path) -> Result<()> {
    if args.agents == 0 || args.seconds == 0 || args.rounds == 0 {
        return Err("--agents, --seconds and --rounds must be at least 1".into());
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
    let agents = enroll(&daemon.addr, &owner, args.agents).await?;
    let (warmup, seconds) = (
        Duration::from_secs(args.warmup_seconds),
        Duration::from_secs(args.seconds),
    );
    let plan = Plan {
        rounds: args.rounds,
        warmup,
        seconds,
        unit: "heartbeats/s",
        levels: vec![String::new()],
    };
    let daemon_addr = daemon.agent_addr.clone();
    let rounds::LevelWindows {
        daemon: dw,
        echo: ew,
    } = rounds::against_echo(
        &mut daemon,
        &daemon_addr,
        agents.iter().map(|a| &a.creds),
        work,
        &plan,
        |channels, settle, pid, _| window(channels, &agents, settle, seconds, pid),
    )
    .await?
    .pop()
    .ok_or("no windows were measured")?;
    let (ratios, median) = rounds::round_ratios(&dw, &ew);
    let (d, e) = (Totals::of(dw), Totals::of(ew));
    let ratio = rounds::ratio(d.rps, e.rps);
    let mut rows = Vec::new();
    rounds::server_rows(&mut rows, "daemon", "heartbeats/s", &d);
    rounds::server_rows(&mut rows, "echo", "heartbeats/s", &e);
    rows.push(row("daemon/echo heartbeats/s", format!("{ratio:.3}")));
    rows.push(row("daemon/echo per round", rounds::format_ratios(&ratios)));
    rows.push(row("daemon/echo, median round", format!("{median:.3}")));
    let cpu = rounds::cpu_per_call_ratio(&d, &e);
    rows.push(row("daemon/echo CPU per heartbeat", format!("{cpu:.3}")));
    print_table(
        &format!(
            "heartbeat: {} agents, {} x {} s measured on each",
            args.agents, args.rounds, args.seconds
        ),
        &rows,
    );
    rounds::print_first_errors(&d, &e);
    println!(
        "RESULT heartbeat runtime={} agents={} rounds={} seconds={} daemon_rps={:.0} daemon_p50_ms={} daemon_p99_ms={} daemon_errors={} echo_rps={:.0} echo_p99_ms={} ratio_rps={ratio:.3} ratio_median={median:.3} daemon_cpu_cores={:.2} echo_cpu_cores={:.2} cpu_per_call_ratio={cpu:.3}",
        target.runtime,
        args.agents,
        args.rounds,
        args.seconds,
        d.rps,
        ms(d.p50_us),
        ms(d.p99_us),
        d.errors,
        e.rps,
        ms(e.p99_us),
        d.server_cores,
        e.server_cores,
    );
    if d.requests == 0 || e.requests == 0 {
        return Err("a run completed no heartbeat in its measured window".into());
    }
    Ok(())
}

/// Adds `n` machines through the curator at `addr` (as `owner`), each with
/// an agent key of its own.
pub async fn enroll(addr: &str, owner: &Credentials, n: usize) -> Result<Vec<Agent>> {
    let mut mgmt =
        MachineManagementClient::with_origin(tls_channel(addr, owner).await?, Channel::origin());
    let mut agents = Vec::with_capacity(n);
    for i in 0..n {
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
    Ok(agents)
}
