//! Scenario `update-etcd`: the production write path against its
//! substrate. One etcd; a curator elected over it; in alternating windows:
//!
//! 1. **curator**: closed-loop `UpdateNodeStatus` over mutual TLS through
//!    the daemon (`--clients` loops over `--connections` connections, the
//!    clients of a connection updating that connection's node, as in
//!    `update-tls`);
//! 2. **etcd**: as many loops sending the equivalent fenced transaction
//!    for the node's record straight to etcd ([`super::fenced_direct`]).
//!
//! Both count acknowledged updates only. The loops of a node share its
//! key in both phases, so both see the same races.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metropolis_core::curator::NODES_PREFIX;

use super::daemon::Target;
use super::fanout_etcd::start_elected;
use super::fenced_direct::{self, Comparison, WindowArgs};
use super::update_tls::window;
use super::util::{Result, add_nodes, tls_channel};

/// Arguments of `update-etcd`.
#[derive(clap::Args, Debug, Clone)]
pub struct UpdateEtcdArgs {
    /// Concurrent update loops in each phase.
    #[arg(long, default_value_t = 128)]
    pub clients: usize,
    /// Nodes (and TLS connections to the daemon): loop i updates node
    /// i mod N in both phases, so N < --clients makes loops share a key.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// The windows and the direct side.
    #[command(flatten)]
    pub windows: WindowArgs,
}

/// Runs the scenario.
pub async fn run(args: UpdateEtcdArgs, target: &Target, work: &Path) -> Result<()> {
    if args.clients == 0
        || args.connections == 0
        || args.windows.seconds == 0
        || args.windows.rounds == 0
    {
        return Err("--clients, --connections, --seconds and --rounds must be at least 1".into());
    }
    let connections = args.connections.min(args.clients);
    let (etcd, mut daemon) = start_elected(target, work, args.windows.lease_ttl).await?;
    let etcd_pid = etcd.pid(0).ok_or("etcd is not running")?;
    let url = etcd.url();
    let daemon_pid = daemon.pid()?;
    println!(
        "update-etcd: etcd pid {etcd_pid} at {url}; daemon pid {daemon_pid} ({} runtime, elected \
         over etcd) on {}; {} loops over {connections} nodes",
        target.runtime, daemon.addr, args.clients
    );
    let owner = daemon.owner()?;
    let nodes = add_nodes(&daemon.addr, &owner, connections, 32, connections).await?;
    let mut channels = Vec::new();
    for n in &nodes {
        channels.push(tls_channel(&daemon.addr, &n.creds).await?);
    }
    let etcd_clients = fenced_direct::connect(&url, args.windows.etcd_clients).await?;
    let mut kv = etcd_clients[0].clone();
    let election = fenced_direct::leader_key(&mut kv).await?;
    let keys = nodes
        .iter()
        .map(|n| [NODES_PREFIX, n.id.as_bytes()].concat())
        .collect();
    let records =
        Arc::new(fenced_direct::stored(&mut kv, keys, |i| format!("node {}", nodes[i].id)).await?);

    let warmup = Duration::from_secs(args.windows.warmup_seconds);
    let seconds = Duration::from_secs(args.windows.seconds);
    let (mut curator_windows, mut etcd_windows) = (Vec::new(), Vec::new());
    for round in 0..args.windows.rounds {
        daemon.check_alive()?;
        let c = window(
            channels.clone(),
            &nodes,
            args.clients,
            warmup,
            seconds,
            daemon_pid,
        )
        .await?;
        let e = fenced_direct::etcd_window(
            &etcd_clients,
            &records,
            &election,
            args.clients,
            warmup,
            seconds,
            etcd_pid,
        )
        .await?;
        fenced_direct::print_round(round + 1, "updates/s", &c, &e);
        curator_windows.push(c);
        etcd_windows.push(e);
    }
    daemon.stop();
    drop(etcd);
    Comparison {
        scenario: "update-etcd",
        unit: "updates/s",
        title: format!(
            "update-etcd: {} loops, {connections} nodes, {} x {} s measured on each side",
            args.clients, args.windows.rounds, args.windows.seconds
        ),
        settings: format!(
            "runtime={} clients={} connections={connections} rounds={} seconds={}",
            target.runtime, args.clients, args.windows.rounds, args.windows.seconds
        ),
        curator: curator_windows,
        etcd: etcd_windows,
    }
    .report()
}
