//! Scenario `heartbeat-etcd`: `Heartbeat` against its substrate. One etcd;
//! a curator elected over it; in alternating windows:
//!
//! 1. **curator**: each agent (its own key, machine and mutual-TLS
//!    connection to the AgentCallback port) sends closed-loop heartbeats,
//!    as in `heartbeat`; each is a fenced compare-and-swap of the
//!    machine's record in etcd;
//! 2. **etcd**: as many loops sending the equivalent fenced transaction
//!    for the machine's record straight to etcd
//!    ([`super::fenced_direct`]).
//!
//! Both count acknowledged heartbeats only.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metropolis_core::provisioning::MachineId;
use metropolis_service::machine_key;

use super::daemon::Target;
use super::fanout_etcd::start_elected;
use super::fenced_direct::{self, Comparison, WindowArgs};
use super::heartbeat::{enroll, window};
use super::util::{Result, tls_channel};

/// Arguments of `heartbeat-etcd`.
#[derive(clap::Args, Debug, Clone)]
pub struct HeartbeatEtcdArgs {
    /// Agents, each with its own key, machine and TLS connection; as many
    /// direct loops, one per machine record.
    #[arg(long, default_value_t = 128)]
    pub agents: usize,
    /// The windows and the direct side.
    #[command(flatten)]
    pub windows: WindowArgs,
}

/// Runs the scenario.
pub async fn run(args: HeartbeatEtcdArgs, target: &Target, work: &Path) -> Result<()> {
    if args.agents == 0 || args.windows.seconds == 0 || args.windows.rounds == 0 {
        return Err("--agents, --seconds and --rounds must be at least 1".into());
    }
    let (etcd, mut daemon) = start_elected(target, work, args.windows.lease_ttl).await?;
    let etcd_pid = etcd.pid(0).ok_or("etcd is not running")?;
    let url = etcd.url();
    let daemon_pid = daemon.pid()?;
    println!(
        "heartbeat-etcd: etcd pid {etcd_pid} at {url}; daemon pid {daemon_pid} ({} runtime, \
         elected over etcd), AgentCallback on {}; {} agents",
        target.runtime, daemon.agent_addr, args.agents
    );
    let owner = daemon.owner()?;
    let agents = enroll(&daemon.addr, &owner, args.agents).await?;
    let mut channels = Vec::with_capacity(agents.len());
    for a in &agents {
        channels.push(tls_channel(&daemon.agent_addr, &a.creds).await?);
    }
    let etcd_clients = fenced_direct::connect(&url, args.windows.etcd_clients).await?;
    let mut kv = etcd_clients[0].clone();
    let election = fenced_direct::leader_key(&mut kv).await?;
    let keys = agents
        .iter()
        .map(|a| MachineId::parse(&a.machine_id).map(|id| machine_key(&id).to_vec()))
        .collect::<std::result::Result<_, _>>()?;
    let records = Arc::new(
        fenced_direct::stored(&mut kv, keys, |i| {
            format!("machine {}", agents[i].machine_id)
        })
        .await?,
    );

    let warmup = Duration::from_secs(args.windows.warmup_seconds);
    let seconds = Duration::from_secs(args.windows.seconds);
    let (mut curator_windows, mut etcd_windows) = (Vec::new(), Vec::new());
    for round in 0..args.windows.rounds {
        daemon.check_alive()?;
        let c = window(channels.clone(), &agents, warmup, seconds, daemon_pid).await?;
        let e = fenced_direct::etcd_window(
            &etcd_clients,
            &records,
            &election,
            args.agents,
            warmup,
            seconds,
            etcd_pid,
        )
        .await?;
        fenced_direct::print_round(round + 1, "heartbeats/s", &c, &e);
        curator_windows.push(c);
        etcd_windows.push(e);
    }
    daemon.stop();
    drop(etcd);
    Comparison {
        scenario: "heartbeat-etcd",
        unit: "heartbeats/s",
        title: format!(
            "heartbeat-etcd: {} agents, {} x {} s measured on each side",
            args.agents, args.windows.rounds, args.windows.seconds
        ),
        settings: format!(
            "runtime={} agents={} rounds={} seconds={}",
            target.runtime, args.agents, args.windows.rounds, args.windows.seconds
        ),
        curator: curator_windows,
        etcd: etcd_windows,
    }
    .report()
}
