//! Two to five curators (the seed draws how many) assembled as the
//! daemon assembles them (`metropolis_service::node::assemble`: routers, fenced and grouped writes,
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
//! (`writers`: one per node, an Unavailable update sent again at
//! times, read back through the instance that acknowledged it), watchers
//! of all nodes and of each node (`watchers`), and provisioning
//! (`agents`: an operator, agents running core's `AgentLoop`
//! against the real AgentCallback service, an impostor agent).
//!
//! Checked at the end of every seed: no commit without the leader's
//! fence (at the store, `CommitCheck`); no call forwarded twice; per
//! node, the record is linearizable over every write and read of it; the
//! Watch contract on every stream; read your writes; provisioning's
//! generations; and, after the faults stop, that every client is served
//! again. A broken check panics, naming the seed ([`run`]).

// The checks panic on what breaks an invariant, and what this module
// unwraps is the simulation's own: records the shipped code or the world
// wrote, and locks no task holds across a panic.
#![allow(clippy::unwrap_used)]

/// Whether the run prints, as they happen, the curators' role changes,
/// the writers' calls and the watchers' backlogs, each with its simulated
/// time and tick (`metropolis-sim --log`).
static LOGGING: AtomicBool = AtomicBool::new(false);

/// Prints a run's events to stderr from now on (or stops).
pub fn log_events(on: bool) {
    LOGGING.store(on, Ordering::Relaxed);
}

fn logging() -> bool {
    LOGGING.load(Ordering::Relaxed)
}

/// `eprintln!` when [`logging`].
macro_rules! log {
    ($($arg:tt)*) => {
        if logging() {
            eprintln!($($arg)*);
        }
    };
}

mod agents;
mod faults;
mod run;
mod watchers;
mod writers;

pub use run::run;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use std::time::Duration;

use crate::call::{server_stream, unary};
use crate::commit_check::CommitCheck;
use crate::curator_calls::{UPDATE, WATCH, number, numbered, update, watch_all};
use crate::hash::TraceHash;
use crate::model_store;
use crate::rng::Rng;
use crate::runtime::{NodeClock, Runtime};
use crate::store_faults::{FaultyStore, StoreFaults};
use crate::upstream::{Routers, SimConnector, curator_address};
use bytes::Bytes;
use metropolis_core::curator::{NODE_RECORD_SCHEMA, NODES_PREFIX, node_key};
use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::leadership::{Leadership, LeadershipConfig};
use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_core::store::KeyRange;
use metropolis_proto::prelude::{common, curator, storage};
use metropolis_service::elected::SharedLeadership;
use metropolis_service::elected::driver::{ElectionDriver, ElectionPorts};
use metropolis_service::metrics::Metrics;
use metropolis_service::node::{NodeOptions, NodePorts, assemble};
use metropolis_testkit::linearizable::{self, Op, OpKind};
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
const WATCHERS: usize = 2;
/// The key of the node that joins and leaves behind the curators' backs.
const GUEST_KEY: [u8; 32] = [99; 32];
/// The simulated time of one run.
const RUN: Duration = Duration::from_secs(40);

fn identity(i: usize) -> (NodeId, [u8; 32]) {
    let key = [i as u8 + 1; 32];
    (NodeId::from_public_key(&key), key)
}

/// The backlog of a `Watch` of all nodes opened on `target`: node ID to
/// address; `None` if the stream ended before its backlog.
async fn backlog(
    rt: &Runtime,
    routers: &Routers,
    target: usize,
) -> Option<BTreeMap<String, String>> {
    let owner = Identity::Owner;
    let mut events = server_stream(rt, routers, CLIENTS, target, WATCH, owner, watch_all())
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

/// The writers' updates are numbered in `10.0.x.y`, the guest's
/// incarnations in `10.9.x.y`.
const SEQ_PREFIX: &str = "10.0.";
const GUEST_PREFIX: &str = "10.9.";

fn address_of(seq: u64) -> String {
    numbered(SEQ_PREFIX, seq)
}

fn seq_of(address: &str) -> Option<u64> {
    number(address, SEQ_PREFIX)
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
            backup: None,
            metrics: Some(Metrics::new(Arc::new(node.clone()))),
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
                    external_address: numbered(GUEST_PREFIX, incarnation),
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
