//! One curator over the embedded store, as `metropolisd` runs without
//! `--etcd` (`metropolis_service::node::assemble` with no leadership over
//! `metropolis_store::EmbeddedStore`), on the test kit's simulated disk,
//! the store's writer a task of the curator's node on that node's clock
//! (`EmbeddedStore::open_stepped` and `metropolis_store::drive`).
//!
//! Node writers send `UpdateNodeStatus` and watchers stream `Watch` of
//! every node while the curator lives. Each life ends in one seeded way:
//! power lost in the middle of a disk op (the write in flight torn at
//! sectors, what was not synced lost), a write or sync failing with EIO
//! or ENOSPC (the store fails, as documented: it acknowledges nothing
//! more and its health says why; the supervisor restarts the daemon), the
//! process killed, or power cut between ops. The curator then starts
//! again over what the disk kept; now and then the disk's fault atlas
//! first damages a byte the store acknowledged, and the store must refuse
//! to open naming it ([`atlas`]) before the byte is put back.
//!
//! Checked at every open, per node: the store opens; the record it
//! recovered is the last acknowledged update or a later one that was sent
//! (acknowledged ⊆ recovered ⊆ issued), never older than a record an
//! earlier open recovered, never older than what a watcher was sent (a
//! Watch delivers only durable state); every failed call ended
//! Unavailable; and each watcher saw every node's updates in order.

// The checks panic on what breaks an invariant, and what this module
// unwraps is the simulation's own.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use metropolis_core::curator::{NODE_RECORD_SCHEMA, NODES_PREFIX, node_key};
use metropolis_core::identity::{Identity, NodeId as CuratorNodeId};
use metropolis_core::ports::{KvStore, MonotonicClock, Timer};
use metropolis_core::store::{Op, Txn};
use metropolis_proto::prelude::{curator, storage};
use metropolis_service::metrics::Metrics;
use metropolis_service::node::{NodeOptions, NodePorts, assemble};
use metropolis_store::{EmbeddedStore, StoreHealth, StoreOptions, StoreWriter, WriterStep};
use metropolis_testkit::disk::{DiskFault, SimDisk};
use prost::Message;

use crate::Outcome;
use crate::atlas;
use crate::call::{server_stream, unary};
use crate::curator_calls::{UPDATE, WATCH, number, numbered, update, watch_all};
use crate::hash::TraceHash;
use crate::rng::Rng;
use crate::runtime::{NodeClock, NodeId, Runtime};
use crate::stepped_store;
use crate::upstream::Routers;

const CURATOR: NodeId = 0;
const CLIENTS: NodeId = 1;
const DIR: &str = "/data/store";
/// Nodes whose status the writers update.
const NODES: usize = 4;
/// Lives of the curator per seed.
const LIVES: usize = 5;
/// The writers' updates are numbered in `10.1.x.y`.
const SEQ_PREFIX: &str = "10.1.";

fn identity(j: usize) -> (CuratorNodeId, [u8; 32]) {
    let key = [0x40 + j as u8; 32];
    (CuratorNodeId::from_public_key(&key), key)
}

/// The curator's own identity (it registers itself at its first start).
fn curator_identity() -> (CuratorNodeId, [u8; 32]) {
    let key = [0x7f; 32];
    (CuratorNodeId::from_public_key(&key), key)
}

fn seq_of(address: &str) -> Option<u64> {
    number(address, SEQ_PREFIX)
}

/// How a life ends ([`ENDS`], drawn per life).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// A disk fault armed at a seeded op.
    Disk(DiskFault),
    /// The process is killed: the disk and its caches live on.
    Kill,
    /// Power is cut between ops: what was not synced is lost.
    PowerCut,
}

/// Every way a life ends, in the order of the counts of [`run`].
const ENDS: [End; 5] = [
    End::Disk(DiskFault::PowerLoss),
    End::Disk(DiskFault::Eio),
    End::Disk(DiskFault::NoSpace),
    End::Kill,
    End::PowerCut,
];

/// What one node's writer knows, and what was recovered of it.
#[derive(Debug, Default)]
struct Node {
    /// The last update sent (updates are numbered from 1, one at a time).
    sent: u64,
    /// The last update acknowledged.
    acked: u64,
    /// The update an open last recovered.
    recovered: u64,
    /// The latest update a watcher was sent.
    watched: u64,
    /// Calls that failed, and how (only Unavailable is expected).
    failed: u64,
    other_codes: Vec<tonic::Code>,
}

/// The world of one seed.
struct World {
    rt: Runtime,
    routers: Routers,
    disk: SimDisk,
    options: StoreOptions,
    nodes: Arc<Mutex<Vec<Node>>>,
    seed: u64,
    rng: Rng,
    trace: TraceHash,
    /// Watch events delivered.
    watch_events: Arc<Mutex<u64>>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.routers.set(CURATOR, None);
        self.rt.shutdown();
    }
}

impl World {
    /// Opens the store on the curator's node (it must open), checks what
    /// it recovered, and starts the curator over it; returns the store's
    /// health.
    fn start(&mut self, life: usize) -> StoreHealth {
        let node = self.rt.node(CURATOR);
        let options = self
            .options
            .clone()
            .with_clock(Arc::new(node.clone()) as Arc<dyn MonotonicClock>);
        let (store, mut writer) = EmbeddedStore::open_stepped(Path::new(DIR), options)
            .unwrap_or_else(|e| {
                panic!(
                    "seed {}, life {life}: the store did not open: {e}",
                    self.seed
                )
            });
        if life == 0 {
            self.register_nodes(&store, &mut writer);
        }
        self.check_recovered(life, &store);
        let store = Arc::new(store);
        let health = store.health();
        let latency = Rng::new(self.rng.next_u64());
        node.spawn(drive_slowly(writer, node.clone(), latency));
        let (id, key) = curator_identity();
        let ports = NodePorts {
            store: store.clone() as Arc<dyn KvStore>,
            leadership: None,
            spawner: Arc::new(node.clone()),
            issuer: None,
            wall_clock: Arc::new(node.clone()),
            readiness: Arc::new(store.health()),
            backup: Some(store.clone()),
            // Recorded on virtual time, as a daemon records them: the
            // metrics code runs in every seed (never read by a checker).
            metrics: Some(Metrics::new(Arc::new(node.clone()))),
        };
        drop(store);
        let routers = self.routers.clone();
        node.spawn(async move {
            // Fails only if the store does: the supervisor restarts it.
            if let Ok(services) = assemble(ports, NodeOptions::default(), &id, &key).await {
                routers.set(CURATOR, Some(services.router.clone()));
                futures::future::pending::<()>().await;
                drop(services);
            }
        });
        health
    }

    /// The nodes the writers update, registered as an operator's tool
    /// would (straight into the store, one transaction: the first batch,
    /// which the commit policy never holds), before the curator first
    /// starts.
    fn register_nodes(&self, store: &EmbeddedStore, writer: &mut StoreWriter) {
        let puts = (0..NODES)
            .map(|j| {
                let (id, key) = identity(j);
                let record = storage::NodeRecord {
                    schema_version: NODE_RECORD_SCHEMA,
                    id: id.to_string(),
                    public_key: Bytes::copy_from_slice(&key),
                    ..Default::default()
                };
                Op::Put {
                    key: node_key(&id),
                    value: Bytes::from(record.encode_to_vec()),
                    lease: 0,
                }
            })
            .collect();
        let txn = Txn {
            compares: Vec::new(),
            success: puts,
            failure: Vec::new(),
        };
        stepped_store::commit(store, writer, txn).unwrap();
    }

    /// The per-node checks of what an open recovered (module docs).
    fn check_recovered(&mut self, life: usize, store: &EmbeddedStore) {
        let stored = stepped_store::range(store, NODES_PREFIX);
        let seed = self.seed;
        let mut nodes = self.nodes.lock().unwrap();
        for (j, node) in nodes.iter_mut().enumerate() {
            let (id, _) = identity(j);
            let value = stored
                .get(&node_key(&id))
                .unwrap_or_else(|| panic!("seed {seed}, life {life}: node {j} lost"));
            let record = storage::NodeRecord::decode(value.clone()).unwrap();
            let got = record
                .status
                .and_then(|s| seq_of(&s.external_address))
                .unwrap_or(0);
            let at = format!("seed {seed}, life {life}, node {j}: recovered update {got}");
            assert!(
                got >= node.acked,
                "{at}, update {} was acknowledged",
                node.acked
            );
            assert!(got <= node.sent, "{at}, only {} were sent", node.sent);
            assert!(
                got >= node.recovered,
                "{at}, an earlier open recovered {}",
                node.recovered
            );
            assert!(
                got >= node.watched,
                "{at}, a watcher was sent {}",
                node.watched
            );
            assert!(
                node.other_codes.is_empty(),
                "seed {seed}, node {j}: calls failed with {:?}",
                node.other_codes
            );
            node.recovered = got;
            self.trace.bytes(format!("{life} {j} {got}").as_bytes());
        }
    }

    /// One writer per node on the clients' node, for as long as the run.
    fn writers(&self) {
        for j in 0..NODES {
            let (rt, routers, nodes) = (self.rt.clone(), self.routers.clone(), self.nodes.clone());
            let client = self.rt.node(CLIENTS);
            let mut rng = Rng::new(self.seed ^ (0xe3b0 + j as u64));
            self.rt.node(CLIENTS).spawn(async move {
                let (id, _) = identity(j);
                loop {
                    let pause = Duration::from_millis(rng.range(2, 40));
                    client.sleep_until(client.now() + pause).await;
                    let seq = {
                        let mut nodes = nodes.lock().unwrap();
                        nodes[j].sent += 1;
                        nodes[j].sent
                    };
                    let request = update(&id, numbered(SEQ_PREFIX, seq));
                    let caller = Identity::Node(id.clone());
                    let result = unary(&rt, &routers, CLIENTS, CURATOR, UPDATE, caller, request);
                    let result = result.await;
                    let mut nodes = nodes.lock().unwrap();
                    match result {
                        Ok(_) => nodes[j].acked = seq,
                        Err(tonic::Code::Unavailable) => nodes[j].failed += 1,
                        Err(code) => nodes[j].other_codes.push(code),
                    }
                }
            });
        }
    }

    /// A watcher of every node on the clients' node, reopening its stream
    /// whenever it ends: within a stream, each node's updates in order.
    fn watcher(&self) {
        let (rt, routers, nodes) = (self.rt.clone(), self.routers.clone(), self.nodes.clone());
        let (client, events_seen, seed) =
            (self.rt.node(CLIENTS), self.watch_events.clone(), self.seed);
        self.rt.node(CLIENTS).spawn(async move {
            let request = watch_all();
            let ids: Vec<String> = (0..NODES).map(|j| identity(j).0.to_string()).collect();
            loop {
                client
                    .sleep_until(client.now() + Duration::from_millis(50))
                    .await;
                let owner = Identity::Owner;
                let opened = server_stream(
                    &rt,
                    &routers,
                    CLIENTS,
                    CURATOR,
                    WATCH,
                    owner,
                    request.clone(),
                );
                let Ok(mut events) = opened.await else {
                    continue;
                };
                let mut last = [0u64; NODES];
                while let Some(Ok(bytes)) = events.next().await {
                    let event = curator::WatchEvent::decode(bytes).unwrap();
                    *events_seen.lock().unwrap() += 1;
                    let mut nodes = nodes.lock().unwrap();
                    for update in event.nodes {
                        let Some(j) = ids.iter().position(|id| *id == update.id) else {
                            continue;
                        };
                        let seq = update
                            .status
                            .and_then(|s| seq_of(&s.external_address))
                            .unwrap_or(0);
                        assert!(
                            seq >= last[j],
                            "seed {seed}: node {j} went back from {} to {seq} in a stream",
                            last[j]
                        );
                        last[j] = seq;
                        nodes[j].watched = nodes[j].watched.max(seq);
                    }
                }
            }
        });
    }
}

/// The most a batch waits for the device before its write.
const MAX_DEVICE_LATENCY_US: u64 = 10_000;

/// Drives `writer` by the contract of `StoreWriter::step` on `node`'s
/// clock (as `metropolis_store::drive::drive` does), except that each
/// time the writer is woken it first waits a seeded device latency of up
/// to [`MAX_DEVICE_LATENCY_US`]: what is queued meanwhile is applied and
/// readable but not durable, and a crash in that window loses it.
async fn drive_slowly(mut writer: StoreWriter, node: crate::runtime::Node, mut rng: Rng) {
    loop {
        let step = futures::future::poll_fn(|cx| Poll::Ready(writer.step(cx.waker()))).await;
        let until = match step {
            WriterStep::Wrote => continue,
            WriterStep::Wait { until } => until,
            _ => return,
        };
        // The step kept this task's waker: pending until it (or the
        // deadline's timer) wakes the task.
        let mut woken = false;
        let wake = futures::future::poll_fn(move |_| {
            if std::mem::replace(&mut woken, true) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        match until {
            Some(until) => {
                futures::future::select(wake, node.sleep_until(until)).await;
            }
            None => wake.await,
        }
        let latency = Duration::from_micros(rng.below(MAX_DEVICE_LATENCY_US));
        node.sleep_until(node.now() + latency).await;
    }
}

/// One seeded run; panics on a broken invariant, naming the seed.
pub fn run(seed: u64) -> Outcome {
    let mut rng = Rng::new(seed ^ 0xe3bd);
    let rt = Runtime::new(
        seed,
        vec![NodeClock::seeded(&mut rng, 1000), NodeClock::default()],
    );
    let disk = SimDisk::new(seed);
    let options = StoreOptions::default()
        .with_snapshot_threshold(16 << 10)
        // Compacted every 4 revisions: watches are woken (and read) while
        // changes wait for the device, not only once a batch is durable.
        .with_history_revisions(64)
        .with_disk(Arc::new(disk.clone()));
    let mut world = World {
        rt,
        routers: Routers::default(),
        disk,
        options,
        nodes: Arc::new(Mutex::new((0..NODES).map(|_| Node::default()).collect())),
        seed,
        rng,
        trace: TraceHash::default(),
        watch_events: Arc::default(),
    };
    let mut ends = [0u64; ENDS.len()];
    let mut store_failures = 0;
    let mut refused_as_corrupt = 0;
    let mut health = world.start(0);
    world.writers();
    world.watcher();
    for life in 1..=LIVES {
        let drawn = world.rng.index(ENDS.len());
        let end = ENDS[drawn];
        ends[drawn] += 1;
        let lifetime = Duration::from_millis(world.rng.range(300, 3000));
        if let End::Disk(fault) = end {
            world.disk.arm(world.rng.range(0, 200), fault);
        }
        let until = world.rt.now() + lifetime;
        // The supervisor restarts a daemon whose store failed.
        while world.rt.now() < until && health.failure().is_none() {
            world.rt.run_for(Duration::from_millis(20));
        }
        if health.failure().is_some() {
            store_failures += 1;
        }
        world.routers.set(CURATOR, None);
        world.rt.crash(CURATOR);
        if world.disk.is_dead() || end == End::PowerCut {
            world.disk.power_cycle();
        } else {
            world.disk.restart();
        }
        // Down a while: the clients' calls fail meanwhile.
        let down = Duration::from_millis(world.rng.range(0, 500));
        world.rt.run_for(down);
        if world.rng.chance(0.3) {
            let refused =
                atlas::damage_is_refused(seed, life, &world.disk, Path::new(DIR), &mut world.rng);
            refused_as_corrupt += u64::from(refused);
        }
        health = world.start(life);
        if life < LIVES {
            continue;
        }
        // The last life runs without faults and serves again.
        let acked_before: u64 = world.nodes.lock().unwrap().iter().map(|n| n.acked).sum();
        world.rt.run_for(Duration::from_secs(2));
        let acked_after: u64 = world.nodes.lock().unwrap().iter().map(|n| n.acked).sum();
        assert!(
            acked_after > acked_before,
            "seed {seed}: the restarted curator serves no update"
        );
    }
    let counts = world.disk.counts();
    let nodes = world.nodes.lock().unwrap();
    let acked = nodes.iter().map(|n| n.acked).sum();
    let failed = nodes.iter().map(|n| n.failed).sum();
    drop(nodes);
    let watch_events = *world.watch_events.lock().unwrap();
    Outcome {
        seed,
        trace: world.trace.value(),
        polls: world.rt.polls(),
        simulated: world.rt.now(),
        fired: vec![
            ("lives ended by a power loss mid-op", ends[0]),
            ("lives ended by EIO", ends[1]),
            ("lives ended by ENOSPC", ends[2]),
            ("lives ended by a kill", ends[3]),
            ("lives ended by a power cut", ends[4]),
            ("store failures", store_failures),
            ("sector corruptions refused", refused_as_corrupt),
            (
                "of those, in the WAL's last write",
                counts.last_write_corruptions,
            ),
            ("torn writes", counts.torn_writes),
            ("names undone by a power loss", counts.undone_names),
            ("updates acknowledged", acked),
            ("updates failed", failed),
            ("watch events", watch_events),
        ],
    }
}
