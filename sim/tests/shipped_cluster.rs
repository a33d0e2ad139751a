//! Two to five curators (the seed draws how many) assembled as the daemon assembles them
//! (`core::service::node::assemble`: routers, fenced and grouped writes,
//! the watch cache, registration) with the daemon's election driver, run
//! by the deterministic runtime over the store model. Clients' calls and
//! followers' forwarded calls are real encoded gRPC into the real
//! routers, across links that are cut one way or both and healed.
//!
//! The store's network fails transactions, loses replies of committed
//! ones, carries some out after the caller gave up, and delays replies;
//! its member pauses and restarts, its watches break and it compacts at
//! seeded moments; curators crash and restart. A guest node joins and
//! leaves behind the curators' backs.
//!
//! The clients, each in its own module: node writers
//! ([`shipped_writers`]: one per node, an Unavailable update sent again at
//! times, read back through the instance that acknowledged it), watchers
//! of all nodes and of each node ([`shipped_watchers`]), and provisioning
//! ([`shipped_agents`]: an operator, agents running core's `AgentLoop`
//! against the real AgentCallback service, an impostor agent).
//!
//! Checked at the end of every seed: no commit without the leader's
//! fence (at the store, `CommitCheck`); no call forwarded twice; per
//! node, the record is linearizable over every write and read of it; the
//! Watch contract on every stream; read your writes; provisioning's
//! generations; and, after the faults stop, that every client is served
//! again.

#![allow(clippy::unwrap_used)]

/// A campaign allocates and frees for every call, frame and task: mimalloc
/// rather than glibc's malloc (which took 11 % of a campaign's time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Whether `SHIPPED_LOG` is set: a replayed seed then prints, as they
/// happen, the curators' role changes, the writers' calls and the
/// watchers' backlogs, each with its simulated time and tick.
fn logging() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SHIPPED_LOG").is_some())
}

/// `eprintln!` when [`logging`].
macro_rules! log {
    ($($arg:tt)*) => {
        if logging() {
            eprintln!($($arg)*);
        }
    };
}

mod shipped_agents;
mod shipped_watchers;
mod shipped_writers;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use std::time::Duration;

use bytes::Bytes;
use metropolis_core::curator::{NODE_RECORD_SCHEMA, NODES_PREFIX, node_key};
use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::leadership::{Leadership, LeadershipConfig};
use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_core::service::elected::SharedLeadership;
use metropolis_core::service::elected::driver::{ElectionDriver, ElectionPorts};
use metropolis_core::service::node::{NodeOptions, NodePorts, assemble};
use metropolis_core::store::KeyRange;
use metropolis_proto::prelude::{common, curator, storage};
use metropolis_sim::call::{server_stream, unary};
use metropolis_sim::commit_check::CommitCheck;
use metropolis_sim::hash::TraceHash;
use metropolis_sim::linearizable::{self, Op, OpKind};
use metropolis_sim::model_store;
use metropolis_sim::rng::Rng;
use metropolis_sim::runtime::{NodeClock, Runtime};
use metropolis_sim::store_faults::{FaultyStore, StoreFaults};
use metropolis_sim::upstream::{Routers, SimConnector, curator_address};
use metropolis_testkit::store::MemKv;
use prost::Message;

/// The most curators a run has (each run draws 2 to 5); the nodes after
/// them are the store's member and the clients'.
const MAX_CURATORS: usize = 5;
const STORE: usize = MAX_CURATORS;
const CLIENTS: usize = MAX_CURATORS + 1;
/// The provisioning agents' node (crashed and restarted as a fault).
const AGENTS: usize = MAX_CURATORS + 2;
const TTL: Duration = Duration::from_secs(3);
const PREFIX: &str = "/metropolis/curator/leader/";
const UPDATE: &str = "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus";
const WATCH: &str = "/metropolis.node.core.curator.proto.api.Curator/Watch";
const WATCHERS: usize = 2;
/// The key of the node that joins and leaves behind the curators' backs.
const GUEST_KEY: [u8; 32] = [99; 32];
/// The simulated time of one run.
const RUN: Duration = Duration::from_secs(40);

fn identity(i: usize) -> (NodeId, [u8; 32]) {
    let key = [i as u8 + 1; 32];
    (NodeId::from_public_key(&key), key)
}

/// An encoded `WatchRequest` for all nodes.
fn all_nodes() -> Vec<u8> {
    curator::WatchRequest {
        kind: Some(curator::watch_request::Kind::NodesInCluster(
            curator::watch_request::NodesInCluster {},
        )),
    }
    .encode_to_vec()
}

/// The backlog of a `Watch` of all nodes opened on `target`: node ID to
/// address; `None` if the stream ended before its backlog.
async fn backlog(
    rt: &Runtime,
    routers: &Routers,
    target: usize,
) -> Option<BTreeMap<String, String>> {
    let owner = Identity::Owner;
    let mut events = server_stream(rt, routers, CLIENTS, target, WATCH, owner, all_nodes())
        .await
        .ok()?;
    let mut view = BTreeMap::new();
    while let Some(Ok(bytes)) = events.next().await {
        let event = curator::WatchEvent::decode(bytes).ok()?;
        for node in event.nodes {
            let address = node.status.map(|s| s.external_address).unwrap_or_default();
            view.insert(node.id, address);
        }
        if event.progress == curator::watch_event::Progress::LastBacklogged as i32 {
            return Some(view);
        }
    }
    None
}

/// The order of the calls and answers the checkers see: many happen at
/// the same simulated instant, in an order the runtime fixed, so each
/// takes the next number.
#[derive(Clone, Default)]
struct Ticks(Arc<AtomicU64>);

impl Ticks {
    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

fn address_of(seq: u64) -> String {
    format!("10.0.{}.{}", seq / 256, seq % 256)
}

fn seq_of(address: &str) -> Option<u64> {
    number_after(address, "10.0.")
}

/// The number `high * 256 + low` of an address `<prefix>high.low`.
fn number_after(address: &str, prefix: &str) -> Option<u64> {
    let mut parts = address.strip_prefix(prefix)?.split('.');
    let high: u64 = parts.next()?.parse().ok()?;
    let low: u64 = parts.next()?.parse().ok()?;
    Some(high * 256 + low)
}

struct Cluster {
    rt: Runtime,
    kv: MemKv,
    check: CommitCheck,
    /// What the curators reach the store through.
    network: FaultyStore,
    routers: Routers,
    /// How many curators this run has: nodes `0..curators`.
    curators: usize,
    drivers: Vec<Option<ElectionDriver>>,
    ticks: Ticks,
    /// Addresses a writer sent more than once (a retried update).
    retried: Arc<Mutex<BTreeSet<String>>>,
    seed: u64,
}

/// A run's tasks hold its runtime, and the routers hold services whose
/// forwarding holds the routers: ending the cluster ends both, or a
/// campaign of runs in one process never frees one.
impl Drop for Cluster {
    fn drop(&mut self) {
        self.rt.shutdown();
        for i in 0..self.curators {
            self.routers.set(i, None);
        }
    }
}

impl Cluster {
    fn new(seed: u64) -> Cluster {
        let mut rng = Rng::new(seed);
        let mut clocks: Vec<NodeClock> = (0..MAX_CURATORS)
            .map(|_| NodeClock::seeded(&mut rng, 1000))
            .collect();
        clocks.push(NodeClock::default());
        clocks.push(NodeClock::default());
        clocks.push(NodeClock::default());
        let rt = Runtime::new(seed, clocks);
        let kv = MemKv::new();
        let check = CommitCheck::new(kv.clone(), PREFIX);
        let network = FaultyStore::new(
            Arc::new(check.clone()),
            rt.node(STORE),
            seed ^ 0x570e,
            StoreFaults::default(),
        );
        let expiry =
            model_store::expire_while_running(kv.clone(), rt.node(STORE), network.running_fn());
        rt.node(STORE).spawn(expiry);
        let mut cluster = Cluster {
            check,
            network,
            rt,
            kv,
            routers: Routers::default(),
            // Drawn apart from the other choices of the seed.
            curators: 2 + Rng::new(seed ^ 0xc0_0a70).index(MAX_CURATORS - 1),
            drivers: Vec::new(),
            ticks: Ticks::default(),
            retried: Arc::default(),
            seed,
        };
        for i in 0..cluster.curators {
            let driver = cluster.start(i);
            cluster.drivers.push(Some(driver));
        }
        cluster
    }

    /// Starts curator `i` on a fresh incarnation of its node; it serves
    /// once its services are assembled.
    fn start(&self, i: usize) -> ElectionDriver {
        let node = self.rt.node(i);
        let (id, key) = identity(i);
        let config = LeadershipConfig {
            lease_ttl: TTL,
            ..LeadershipConfig::new(id.to_string(), curator_address(i))
        };
        let machine = Leadership::new(config, node.now()).unwrap();
        let links = self.routers.links().clone();
        let connector = SimConnector::new(
            self.rt.clone(),
            self.routers.clone(),
            i,
            id.clone(),
            self.seed ^ i as u64,
            Duration::from_millis(5),
        );
        let shared = SharedLeadership::new(machine, Arc::new(node.clone()), Arc::new(connector));
        let store = Arc::new(self.network.reached_from(i, STORE, links.clone()));
        let ports = ElectionPorts {
            store: store.clone(),
            leases: Arc::new(model_store::leases_across(
                self.kv.clone(),
                self.rt.node(STORE),
                node.clone(),
                (links, self.network.running_fn()),
                (i, STORE),
            )),
            timer: Arc::new(node.clone()),
            spawner: Arc::new(node.clone()),
        };
        if logging() {
            let (rt, ticks) = (self.rt.clone(), self.ticks.clone());
            shared.on_role_change(move |epoch, role| {
                let tick = ticks.0.load(Ordering::Relaxed);
                log!("{:?} tick {tick}: curator {i} {epoch:?} {role:?}", rt.now());
            });
        }
        let driver = ElectionDriver::spawn(ports, PREFIX, shared.clone());
        let node_ports = NodePorts {
            store,
            leadership: Some(shared.clone()),
            spawner: Arc::new(node.clone()),
            issuer: None,
            wall_clock: Arc::new(node.clone()),
            readiness: Arc::new(shared),
        };
        let routers = self.routers.clone();
        let serving = node.clone();
        node.spawn(async move {
            // The registration can fail with the store's network: the
            // daemon then exits and its supervisor starts it again.
            let services = loop {
                match assemble(node_ports.clone(), NodeOptions::default(), &id, &key).await {
                    Ok(services) => break services,
                    Err(_) => {
                        serving
                            .sleep_until(serving.now() + Duration::from_secs(1))
                            .await
                    }
                }
            };
            routers.set(i, Some(services.router.clone()));
            // Alive as long as the node: the watch cache and health.
            futures::future::pending::<()>().await;
            drop(services);
        });
        driver
    }

    fn crash(&mut self, i: usize) {
        self.routers.set(i, None);
        self.rt.crash(i);
        self.drivers[i] = None;
    }

    /// Every node's external address ("" without a status), as stored.
    fn stored_view(&self) -> BTreeMap<String, String> {
        let nodes = KeyRange::Prefix(Bytes::from_static(NODES_PREFIX));
        self.kv
            .with(|m| m.range(&nodes))
            .into_iter()
            .filter_map(|kv| {
                let record = storage::NodeRecord::decode(kv.value).ok()?;
                let address = record
                    .status
                    .map(|s| s.external_address)
                    .unwrap_or_default();
                Some((record.id, address))
            })
            .collect()
    }

    /// A node that joins and leaves behind the curators' backs (as an
    /// operator's tool over the store would), every 100-900 ms until
    /// `stop`: what makes tombstones.
    /// Each incarnation has an address of its own: a stream may send a
    /// deletion and re-creation coalesced, as the node alone.
    fn guest(&self, stop: Duration) {
        let key = GUEST_KEY;
        let id = NodeId::from_public_key(&key);
        let name = id.to_string();
        let record = move |incarnation: u64| {
            storage::NodeRecord {
                schema_version: NODE_RECORD_SCHEMA,
                id: name.clone(),
                public_key: Bytes::copy_from_slice(&key),
                status: Some(common::NodeStatus {
                    external_address: format!("10.9.{}.{}", incarnation / 256, incarnation % 256),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let (kv, rt, store) = (self.kv.clone(), self.rt.clone(), self.rt.node(STORE));
        let mut rng = Rng::new(self.seed ^ 0x6e57);
        self.rt.node(STORE).spawn(async move {
            let mut present = false;
            let mut incarnation = 0;
            while rt.now() < stop {
                let pause = Duration::from_millis(rng.range(100, 900));
                store.sleep_until(store.now() + pause).await;
                if present {
                    kv.delete(node_key(&id));
                } else {
                    incarnation += 1;
                    kv.put(node_key(&id), record(incarnation));
                }
                present = !present;
            }
            if present {
                kv.delete(node_key(&id));
            }
        });
    }

    /// Deletes the oldest key under the election prefix (the leader's);
    /// false if there is none.
    fn delete_leader_key(&self) -> bool {
        let range = KeyRange::Prefix(Bytes::from_static(PREFIX.as_bytes()));
        let oldest = self
            .kv
            .with(|m| m.range(&range))
            .into_iter()
            .min_by_key(|kv| kv.create_revision);
        match oldest {
            Some(kv) => {
                log!("{:?}: the leader's key {:?} deleted", self.rt.now(), kv.key);
                self.kv.delete(&kv.key);
                true
            }
            None => false,
        }
    }

    fn stored_seq(&self, j: usize) -> Option<u64> {
        let (id, _) = identity(j);
        let value = self.kv.get(node_key(&id))?;
        let record = storage::NodeRecord::decode(value).unwrap();
        seq_of(&record.status?.external_address)
    }
}

/// Cuts a seeded link for up to 4 s: all of a curator's, both ways (it is
/// partitioned from the others, the store and the clients), or one way
/// between a curator and another node; then heals every link.
fn partition(cluster: &Cluster, rng: &mut Rng) {
    let links = cluster.routers.links();
    let curator = rng.index(cluster.curators);
    // The nodes of the run: its curators, the store's member, the clients.
    let nodes: Vec<usize> = (0..cluster.curators).chain([STORE, CLIENTS]).collect();
    if rng.chance(0.5) {
        links.isolate(curator, nodes.iter().copied().filter(|&n| n != curator));
    } else {
        let others: Vec<usize> = nodes.into_iter().filter(|&n| n != curator).collect();
        let other = others[rng.index(others.len())];
        if rng.chance(0.5) {
            links.cut(curator, other);
        } else {
            links.cut(other, curator);
        }
    }
    cluster
        .rt
        .run_for(Duration::from_millis(rng.range(0, 4000)));
    links.heal();
}

/// What a run did: the faults that fired, and its trace.
struct Outcome {
    fired: Fired,
    /// Every recorded call, answer and backlog, folded.
    trace: u64,
    /// Tasks polled by the runtime.
    polls: u64,
}

/// How often each kind of fault fired in a run (or a campaign).
#[derive(Clone, Copy, Debug, Default)]
struct Fired {
    crashes: u64,
    partitions: u64,
    links_cut: u64,
    store_failures: u64,
    lost_replies: u64,
    late_commits: u64,
    store_pauses: u64,
    store_restarts: u64,
    lagged_batches: u64,
    broken_watches: u64,
    compactions: u64,
    retried_updates: u64,
    leader_keys_deleted: u64,
    wall_clock_jumps: u64,
    agent_restarts: u64,
    /// Rounds of the fault loop whose kind the seed's swarm left out.
    left_out: u64,
    installs: u64,
    installs_killed: u64,
    /// Runs with 2, 3, 4 and 5 curators.
    clusters_of: [u64; MAX_CURATORS - 1],
}

impl Fired {
    fn add(&mut self, other: Fired) {
        self.crashes += other.crashes;
        self.partitions += other.partitions;
        self.links_cut += other.links_cut;
        self.store_failures += other.store_failures;
        self.lost_replies += other.lost_replies;
        self.late_commits += other.late_commits;
        self.store_pauses += other.store_pauses;
        self.store_restarts += other.store_restarts;
        self.lagged_batches += other.lagged_batches;
        self.broken_watches += other.broken_watches;
        self.compactions += other.compactions;
        self.retried_updates += other.retried_updates;
        self.leader_keys_deleted += other.leader_keys_deleted;
        self.wall_clock_jumps += other.wall_clock_jumps;
        self.agent_restarts += other.agent_restarts;
        self.left_out += other.left_out;
        self.installs += other.installs;
        self.installs_killed += other.installs_killed;
        for (mine, theirs) in self.clusters_of.iter_mut().zip(other.clusters_of) {
            *mine += theirs;
        }
    }

    /// The kinds that never fired.
    fn missing(&self) -> Vec<&'static str> {
        [
            ("crashes", self.crashes),
            ("partitions", self.partitions),
            ("links_cut", self.links_cut),
            ("store_failures", self.store_failures),
            ("lost_replies", self.lost_replies),
            ("late_commits", self.late_commits),
            ("store_pauses", self.store_pauses),
            ("store_restarts", self.store_restarts),
            ("lagged_batches", self.lagged_batches),
            ("broken_watches", self.broken_watches),
            ("compactions", self.compactions),
            ("retried_updates", self.retried_updates),
            ("leader_keys_deleted", self.leader_keys_deleted),
            ("wall_clock_jumps", self.wall_clock_jumps),
            ("agent_restarts", self.agent_restarts),
            ("left_out", self.left_out),
            ("installs", self.installs),
            ("installs_killed", self.installs_killed),
            ("clusters of 2 curators", self.clusters_of[0]),
            ("clusters of 3 curators", self.clusters_of[1]),
            ("clusters of 4 curators", self.clusters_of[2]),
            ("clusters of 5 curators", self.clusters_of[3]),
        ]
        .into_iter()
        .filter(|(_, n)| *n == 0)
        .map(|(name, _)| name)
        .collect()
    }
}

/// A kind of fault the loop of [`run`] fires.
#[derive(Clone, Copy)]
enum Fault {
    BrokenWatches,
    Compaction,
    Partition,
    MemberPause,
    MemberRestart,
    LeaderKeyDeleted,
    WallClockJump,
    AgentRestart,
    CuratorCrash,
}

/// How many kinds of [`Fault`] there are.
const FAULT_KINDS: usize = 9;

/// What each value of the loop's draw fires: partitions and curator
/// crashes twice as often as the rest.
const DRAWS: [Fault; 11] = [
    Fault::BrokenWatches,
    Fault::Compaction,
    Fault::Partition,
    Fault::Partition,
    Fault::MemberPause,
    Fault::MemberRestart,
    Fault::LeaderKeyDeleted,
    Fault::WallClockJump,
    Fault::AgentRestart,
    Fault::CuratorCrash,
    Fault::CuratorCrash,
];

/// Swarm testing (Groce et al., "Swarm testing", ISSTA 2012): each seed
/// leaves out some kinds of fault (each kept with probability 3/4), so the
/// kinds left in meet each other more often and no kind always masks
/// another. The loop's kinds come first (by [`Fault`]), then the store
/// network's four
/// (failed transactions, lost replies, late commits, lagged batches).
struct Swarm([bool; FAULT_KINDS + 4]);

impl Swarm {
    fn draw(seed: u64) -> Swarm {
        let mut rng = Rng::new(seed ^ 0x5a4a);
        let mut kinds = [false; FAULT_KINDS + 4];
        for kind in &mut kinds {
            *kind = rng.below(4) != 0;
        }
        Swarm(kinds)
    }
}

/// One seeded run: writers for 34 s; the first 20 s with faults at seeded
/// moments (crashes, each restarted after a seeded pause; partitions, each
/// healed after one; the store's watches broken, compaction, its member
/// paused or restarted; the leader's key deleted; wall-clock jumps; the agents killed and restarted).
/// Panics on a broken invariant.
fn run(seed: u64) -> Outcome {
    let mut cluster = Cluster::new(seed);
    let mut rng = Rng::new(seed ^ 0xfa17);
    let swarm = Swarm::draw(seed);
    cluster.rt.run_for(Duration::from_secs(2));
    let on = |kind: usize, p: f64| if swarm.0[kind] { p } else { 0.0 };
    cluster.network.set_faults(StoreFaults {
        fail: on(FAULT_KINDS, 0.02),
        lose_reply: on(FAULT_KINDS + 1, 0.02),
        late: on(FAULT_KINDS + 2, 0.01),
        max_delay: Duration::from_millis(20),
        lag: on(FAULT_KINDS + 3, 0.03),
        max_lag: Duration::from_millis(1500),
    });
    let writers = cluster.writers(Duration::from_secs(36));
    let watchers = cluster.watchers();
    let node_watchers = cluster.node_watchers();
    let mut provisioning = shipped_agents::Provisioning::start(
        shipped_agents::World {
            rt: cluster.rt.clone(),
            routers: cluster.routers.clone(),
            node: CLIENTS,
            agents: AGENTS,
            curators: cluster.curators,
        },
        seed,
        Duration::from_secs(30),
    );
    cluster.guest(Duration::from_secs(25));
    let mut fired = Fired::default();
    fired.clusters_of[cluster.curators - 2] += 1;
    // Every seed cuts links at least once, early.
    cluster
        .rt
        .run_for(Duration::from_millis(rng.range(500, 5000)));
    partition(&cluster, &mut rng);
    fired.partitions += 1;
    while cluster.rt.now() < Duration::from_secs(20) {
        cluster
            .rt
            .run_for(Duration::from_millis(rng.range(500, 5000)));
        let fault = DRAWS[rng.index(DRAWS.len())];
        // Swarm: a kind this seed leaves out fires nothing this round.
        if !swarm.0[fault as usize] {
            fired.left_out += 1;
            continue;
        }
        match fault {
            Fault::BrokenWatches => {
                cluster.kv.break_watches();
                fired.broken_watches += 1;
            }
            Fault::Compaction => {
                cluster.kv.compact();
                fired.compactions += 1;
            }
            Fault::Partition => {
                partition(&cluster, &mut rng);
                fired.partitions += 1;
            }
            // The store's member pauses (longer than the TTL at times).
            Fault::MemberPause => cluster
                .network
                .pause(Duration::from_millis(rng.range(200, 4000))),
            // The member crashes and restarts: its watches end, it
            // refuses calls meanwhile, and it gives every lease a fresh
            // TTL when it is back.
            Fault::MemberRestart => {
                cluster.kv.break_watches();
                cluster.network.go_down(true);
                cluster
                    .rt
                    .run_for(Duration::from_millis(rng.range(200, 3000)));
                cluster.network.go_down(false);
                model_store::extend_leases(&cluster.kv, &cluster.rt.node(STORE));
            }
            // An operator deletes the leader's election key (as with
            // `etcdctl del`): its fenced writes fail from then on, and it
            // must step down; the next candidate leads.
            Fault::LeaderKeyDeleted => {
                if cluster.delete_leader_key() {
                    fired.leader_keys_deleted += 1;
                }
            }
            // A curator's wall clock jumps by up to 10 minutes either way
            // (NTP stepping it): heartbeats' ages and timestamps come from it.
            Fault::WallClockJump => {
                let victim = rng.index(cluster.curators);
                let ms = i64::try_from(rng.range(0, 1_200_000)).unwrap_or(0) - 600_000;
                cluster.rt.jump_wall_clock(victim, ms);
                fired.wall_clock_jumps += 1;
            }
            // Every agent dies mid-whatever and starts again from the
            // generation it persisted.
            Fault::AgentRestart => {
                provisioning.restart_agents();
                fired.agent_restarts += 1;
            }
            Fault::CuratorCrash => {
                let victim = rng.index(cluster.curators);
                cluster.crash(victim);
                fired.crashes += 1;
                cluster
                    .rt
                    .run_for(Duration::from_millis(rng.range(0, 4000)));
                cluster.drivers[victim] = Some(cluster.start(victim));
            }
        }
    }
    // Every seed breaks the store's watches at least once.
    if fired.broken_watches == 0 {
        cluster.kv.break_watches();
        fired.broken_watches += 1;
    }
    cluster.network.set_faults(StoreFaults::default());
    let counts = cluster.network.counts();
    fired.store_failures = counts.failed;
    fired.lost_replies = counts.lost_replies;
    fired.late_commits = counts.late;
    fired.store_pauses = counts.pauses;
    fired.store_restarts = counts.downs;
    fired.lagged_batches = counts.lagged;
    fired.links_cut = cluster.routers.links().cuts_made();
    fired.retried_updates = cluster.retried.lock().unwrap().len() as u64;
    cluster.rt.run_until(RUN);
    provisioning.read_back();
    cluster.rt.run_for(Duration::from_secs(5));
    provisioning.check(seed, 33_000_000);
    (fired.installs, fired.installs_killed) = provisioning.installs();
    let violations = cluster.check.violations();
    assert!(violations.is_empty(), "seed {seed}: {violations:?}");
    let second_hops = cluster.routers.second_hops();
    assert_eq!(second_hops, 0, "seed {seed}: calls forwarded twice");
    let stored = cluster.stored_view();
    shipped_watchers::check(seed, &cluster, &watchers, &node_watchers, &stored);
    shipped_writers::check(seed, &cluster, &writers, &watchers, &node_watchers);
    let mut trace = TraceHash::default();
    for writes in &writers {
        for op in &writes.lock().unwrap().history {
            trace.bytes(format!("{op:?}").as_bytes());
        }
    }
    for watched in &watchers {
        for backlog in &watched.lock().unwrap().backlogs {
            trace.bytes(format!("{backlog:?}").as_bytes());
        }
    }
    Outcome {
        fired,
        trace: trace.value(),
        polls: cluster.rt.polls(),
    }
}

/// Runs the seeds of `range`, each once; on a failure, prints the command
/// that replays its seed. Prints the campaign's figures; every kind of
/// fault must have fired.
fn campaign(range: std::ops::Range<u64>) {
    let mut fired = Fired::default();
    let (started, mut polls) = (std::time::Instant::now(), 0);
    for seed in range.clone() {
        let outcome = std::panic::catch_unwind(|| run(seed)).unwrap_or_else(|panic| {
            eprintln!(
                "seed {seed} failed; replay (with SHIPPED_LOG=1 to see its calls): \
                 SHIPPED_FIRST={seed} SHIPPED_SEEDS=1 cargo test -p metropolis-sim \
                 --test shipped_cluster -- --ignored campaign"
            );
            std::panic::resume_unwind(panic)
        });
        fired.add(outcome.fired);
        polls += outcome.polls;
    }
    let wall = started.elapsed().as_secs_f64();
    let n = range.end - range.start;
    println!(
        "seeds {range:?} in {wall:.1} s: {:.0}x simulated time, {:.0} task polls/s; faults \
         fired: {fired:?}",
        n as f64 * RUN.as_secs_f64() / wall,
        polls as f64 / wall
    );
    assert!(
        fired.missing().is_empty(),
        "never fired: {:?}",
        fired.missing()
    );
}

/// A variable of the environment as a number.
fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

// 1,000 seeds in every test run, in four tests that run side by side.
#[test]
fn seeds_0_to_249() {
    campaign(0..250);
}

#[test]
fn seeds_250_to_499() {
    campaign(250..500);
}

#[test]
fn seeds_500_to_749() {
    campaign(500..750);
}

#[test]
fn seeds_750_to_999() {
    campaign(750..1000);
}

/// A campaign of `SHIPPED_SEEDS` seeds from `SHIPPED_FIRST` (1,000 by
/// default: after the ones every run takes).
#[test]
#[ignore = "long: SHIPPED_SEEDS=100000 cargo test --release -p metropolis-sim --test shipped_cluster -- --ignored campaign"]
fn campaign_of_shipped_seeds() {
    let first = env_u64("SHIPPED_FIRST").unwrap_or(1000);
    let n = env_u64("SHIPPED_SEEDS").unwrap_or(1000);
    campaign(first..first.saturating_add(n));
}

/// The seed alone decides the run: the same seed twice gives the same
/// trace, another seed another.
#[test]
fn the_same_seed_gives_the_same_trace() {
    let (a, b, c) = (run(5), run(5), run(6));
    assert_eq!((a.trace, a.polls), (b.trace, b.polls));
    assert_ne!(a.trace, c.trace);
}

/// Each bug planted in the production code (`metropolis_core::canary`) is
/// caught within 1,000 seeds; the seed that catches it is printed.
#[test]
fn every_planted_bug_is_caught() {
    use metropolis_core::canary::{self, Canary};
    for planted in Canary::ALL {
        canary::plant(planted);
        let caught = (0..1000).find(|&seed| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed))).is_err()
        });
        canary::plant(Canary::None);
        let seed = caught.unwrap_or_else(|| panic!("{planted:?} was not caught in 1,000 seeds"));
        println!("{planted:?} caught at seed {seed}");
    }
}
