//! Scenario `update-etcd`: the production write path against its
//! substrate. One etcd; a curator elected over it; in alternating windows:
//!
//! 1. **curator**: closed-loop `UpdateNodeStatus` over mutual TLS through
//!    the daemon (`--clients` loops over `--connections` connections, the
//!    clients of a connection updating that connection's node, as in
//!    `update-tls`);
//! 2. **etcd**: as many loops sending the equivalent fenced transaction
//!    straight to etcd with `etcd-client`: compare the node key's mod
//!    revision and the leader's election key's create revision, put the
//!    node's record; on a lost race the failure branch reads the key and
//!    the loop tries again with what it read, as the curator does, but
//!    without the curator's read before the first attempt (each loop keeps
//!    the revision its last transaction returned). That is etcd's own rate
//!    for fenced compare-and-swap updates of the same keys at the same
//!    concurrency.
//!
//! Both count acknowledged updates only. The loops of a node share its
//! key in both phases, so both see the same races.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client as ec;
use etcd_client::proto::PbTxnOpResponse;
use metropolis_core::curator::NODES_PREFIX;

use super::daemon::Target;
use super::fanout_etcd::start_elected;
use super::rounds::{self, ClientOutcome, Totals, Window};
use super::update_tls::window;
use super::util::{Context, RPC_TIMEOUT, Result, add_nodes, ms, print_table, row, tls_channel};

/// The daemon's default election prefix (`--election-prefix`).
const ELECTION_PREFIX: &str = "/metropolis/curator/leader/";

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
    /// etcd clients (gRPC connections) the direct loops are spread over.
    #[arg(long, default_value_t = 8)]
    pub etcd_clients: usize,
    /// Measured duration of each window.
    #[arg(long, default_value_t = 4)]
    pub seconds: u64,
    /// Windows per side, alternating (curator, etcd, curator, ...).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Unmeasured warm-up before each window.
    #[arg(long, default_value_t = 1)]
    pub warmup_seconds: u64,
    /// The daemon's --lease-ttl (seconds).
    #[arg(long, default_value_t = 10)]
    pub lease_ttl: u64,
}

/// What a direct loop writes: the node's key and its record as stored.
#[derive(Clone)]
struct NodeKey {
    key: Vec<u8>,
    value: Vec<u8>,
}

/// The leader's election key and the revision it was created at.
#[derive(Clone)]
struct Election {
    key: Vec<u8>,
    create_revision: i64,
}

/// One closed loop of fenced compare-and-swap updates of `node`, straight
/// to etcd.
async fn etcd_loop(
    mut kv: ec::KvClient,
    node: NodeKey,
    election: Election,
    from: Instant,
    until: Instant,
) -> ClientOutcome {
    let mut out = ClientOutcome::default();
    let mut known: Option<i64> = None;
    while Instant::now() < until {
        let start = Instant::now();
        let result = tokio::time::timeout(
            RPC_TIMEOUT,
            fenced_update(&mut kv, &node, &election, &mut known),
        )
        .await;
        let end = Instant::now();
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("no answer within {RPC_TIMEOUT:?}")),
        };
        if out.record(start, end, from, until, failure) {
            break;
        }
    }
    out
}

/// One update: fenced compare-and-swap transactions until one succeeds
/// (a lost race reads the key's revision in the failure branch). `known`
/// is the key's mod revision as last seen, read first when unknown.
async fn fenced_update(
    kv: &mut ec::KvClient,
    node: &NodeKey,
    election: &Election,
    known: &mut Option<i64>,
) -> std::result::Result<(), String> {
    if known.is_none() {
        let got = kv
            .get(node.key.clone(), None)
            .await
            .map_err(|e| e.to_string())?;
        *known = got.0.kvs.first().map(|kv| kv.mod_revision);
    }
    for _ in 0..1000 {
        let revision = known.ok_or("the node's key is gone")?;
        let txn = ec::Txn::new()
            .when([
                ec::Compare::mod_revision(node.key.clone(), ec::CompareOp::Equal, revision),
                ec::Compare::create_revision(
                    election.key.clone(),
                    ec::CompareOp::Equal,
                    election.create_revision,
                ),
            ])
            .and_then([ec::TxnOp::put(node.key.clone(), node.value.clone(), None)])
            .or_else([
                ec::TxnOp::get(node.key.clone(), None),
                ec::TxnOp::get(election.key.clone(), None),
            ]);
        let response = kv.txn(txn).await.map_err(|e| e.to_string())?.0;
        if response.succeeded {
            *known = response.header.map(|h| h.revision);
            return Ok(());
        }
        let mut ranges = response.responses.into_iter().map(|r| match r.response {
            Some(PbTxnOpResponse::ResponseRange(range)) => Ok(range.kvs),
            _ => Err("the failure branch returned no range".to_string()),
        });
        let node_kvs = ranges.next().ok_or("no result for the node's key")??;
        let election_kvs = ranges.next().ok_or("no result for the election key")??;
        if !election_kvs
            .iter()
            .any(|kv| kv.create_revision == election.create_revision)
        {
            return Err("the fence failed: the election key changed".into());
        }
        *known = node_kvs.first().map(|kv| kv.mod_revision);
    }
    Err("1000 lost races in a row".into())
}

/// The leader's election key: the oldest key under the election prefix.
async fn leader_key(kv: &mut ec::KvClient) -> Result<Election> {
    let got = kv
        .get(
            ELECTION_PREFIX,
            Some(
                ec::GetOptions::new()
                    .with_prefix()
                    .with_sort(ec::SortTarget::Create, ec::SortOrder::Ascend),
            ),
        )
        .await
        .context(|| "reading the election prefix".into())?;
    let first = got
        .0
        .kvs
        .first()
        .ok_or("no election key: the daemon does not lead")?;
    Ok(Election {
        key: first.key.clone(),
        create_revision: first.create_revision,
    })
}

/// The stored record of each node.
async fn node_keys(kv: &mut ec::KvClient, ids: &[String]) -> Result<Vec<NodeKey>> {
    let mut keys = Vec::new();
    for id in ids {
        let mut key = NODES_PREFIX.to_vec();
        key.extend_from_slice(id.as_bytes());
        let got = kv
            .get(key.clone(), None)
            .await
            .context(|| format!("reading node {id}"))?;
        let value = got
            .0
            .kvs
            .first()
            .map(|kv| kv.value.clone())
            .ok_or_else(|| format!("node {id} is not in etcd"))?;
        keys.push(NodeKey { key, value });
    }
    Ok(keys)
}

/// Runs the scenario.
pub async fn run(args: UpdateEtcdArgs, target: &Target, work: &Path) -> Result<()> {
    if args.clients == 0 || args.connections == 0 || args.seconds == 0 || args.rounds == 0 {
        return Err("--clients, --connections, --seconds and --rounds must be at least 1".into());
    }
    let connections = args.connections.min(args.clients);
    let (etcd, mut daemon) = start_elected(target, work, args.lease_ttl).await?;
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
    let etcd_clients = {
        let mut clients = Vec::new();
        for _ in 0..args.etcd_clients.max(1) {
            let client = ec::Client::connect([url.clone()], None)
                .await
                .context(|| format!("connecting to etcd at {url}"))?;
            clients.push(client.kv_client());
        }
        clients
    };
    let mut kv = etcd_clients[0].clone();
    let election = leader_key(&mut kv).await?;
    let ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
    let keys = Arc::new(node_keys(&mut kv, &ids).await?);

    let warmup = Duration::from_secs(args.warmup_seconds);
    let seconds = Duration::from_secs(args.seconds);
    let (mut curator_windows, mut etcd_windows) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
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
        let e = etcd_window(
            &etcd_clients,
            &keys,
            &election,
            args.clients,
            warmup,
            seconds,
            etcd_pid,
        )
        .await?;
        println!(
            "  round {}: curator {:.0} updates/s, etcd {:.0} updates/s, ratio {:.3}",
            round + 1,
            c.rps(),
            e.rps(),
            rounds::ratio(c.rps(), e.rps())
        );
        curator_windows.push(c);
        etcd_windows.push(e);
    }
    let (ratios, median) = rounds::round_ratios(&curator_windows, &etcd_windows);
    let (c, e) = (Totals::of(curator_windows), Totals::of(etcd_windows));
    let mut rows = Vec::new();
    rounds::server_rows(&mut rows, "curator", "updates/s", &c);
    rounds::server_rows(&mut rows, "etcd direct", "updates/s", &e);
    rows.push(row(
        "curator/etcd updates/s",
        format!("{:.3}", rounds::ratio(c.rps, e.rps)),
    ));
    rows.push(row(
        "curator/etcd per round",
        rounds::format_ratios(&ratios),
    ));
    rows.push(row("curator/etcd, median round", format!("{median:.3}")));
    rows.push(row(
        "curator p99 / etcd p99",
        format!("{:.2}", rounds::ratio(c.p99_us as f64, e.p99_us as f64)),
    ));
    print_table(
        &format!(
            "update-etcd: {} loops, {connections} nodes, {} x {} s measured on each side",
            args.clients, args.rounds, args.seconds
        ),
        &rows,
    );
    for (name, s) in [("curator", &c), ("etcd direct", &e)] {
        if let Some(why) = &s.first_error {
            println!("  {name}: first error: {why}");
        }
    }
    println!(
        "RESULT update-etcd runtime={} clients={} connections={connections} rounds={} seconds={} \
         curator_rps={:.0} curator_p50_ms={} curator_p99_ms={} curator_errors={} \
         etcd_rps={:.0} etcd_p50_ms={} etcd_p99_ms={} etcd_errors={} ratio_rps={:.3} \
         ratio_median={median:.3} daemon_cpu_cores={:.2} etcd_cpu_cores_direct={:.2}",
        target.runtime,
        args.clients,
        args.rounds,
        args.seconds,
        c.rps,
        ms(c.p50_us),
        ms(c.p99_us),
        c.errors,
        e.rps,
        ms(e.p50_us),
        ms(e.p99_us),
        e.errors,
        rounds::ratio(c.rps, e.rps),
        c.server_cores,
        e.server_cores,
    );
    daemon.stop();
    drop(etcd);
    if c.requests == 0 || e.requests == 0 {
        return Err("a side completed no update in its windows".into());
    }
    Ok(())
}

/// One direct window: loop i updates node i mod N's key on etcd client
/// i mod M. CPU is etcd's.
async fn etcd_window(
    kvs: &[ec::KvClient],
    keys: &Arc<Vec<NodeKey>>,
    election: &Election,
    clients: usize,
    warmup: Duration,
    seconds: Duration,
    etcd_pid: u32,
) -> Result<Window> {
    rounds::measure(warmup, seconds, etcd_pid, |from, until| async move {
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let kv = kvs[i % kvs.len()].clone();
                let node = keys[i % keys.len()].clone();
                tokio::spawn(etcd_loop(kv, node, election.clone(), from, until))
            })
            .collect();
        rounds::join(tasks, "an etcd loop").await
    })
    .await
}
