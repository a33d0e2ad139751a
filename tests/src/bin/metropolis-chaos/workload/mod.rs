//! The workload, through the client library ([`client`]:
//! `metropolis-client`): one writer per node
//! sending `UpdateNodeStatus` (a unique value each: the writer's sequence
//! number in `status.version.release.patch`, its index in `minor`),
//! `NodesInCluster` watchers preferring each instance (so some follow the
//! leader, some a follower), a `NodeInCluster` watcher per node, agents
//! heartbeating, and probes: fresh raw Watches whose backlogs are the
//! reads of the linearizability check ([`probe`]).

pub mod client;
pub mod probe;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use metropolis_proto::prelude::{agent, common, curator};
use metropolis_tests::campaign::enroll::Owner;
use tokio::task::JoinHandle;

use crate::cluster::{Cluster, N};
use crate::history::{BeatOp, Clock, NodeState, Recorder, Seen, WatchKind, WatcherLog, WriteOp};
use client::{Client, NodeEvent, RawWatches};
use metropolis_core::identity::NodeId;

/// How many agents heartbeat.
pub const AGENTS: usize = 2;

/// The longest one attempt of a call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// A writer's deadline for one update, retries included.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(4);

/// The status writer `writer` sends as its `seq`-th update.
pub fn status(seq: i64, writer: usize) -> common::NodeStatus {
    use metropolis_proto::version::spec::{Version, version::Release};
    common::NodeStatus {
        external_address: format!("10.1.1.{}", writer + 1),
        version: Some(Version {
            release: Some(Release {
                major: 0,
                minor: i64::try_from(writer).unwrap_or(0),
                patch: seq,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A node's state for the checks: ours by index, or another by ID.
pub fn state_of(node: &curator::Node, ids: &[String]) -> NodeState {
    match ids.iter().position(|id| *id == node.id) {
        Some(i) => {
            let release = node
                .status
                .as_ref()
                .and_then(|s| s.version.as_ref())
                .and_then(|v| v.release.as_ref());
            NodeState::Ours {
                node: i,
                seq: release.map_or(0, |r| r.patch),
                writer: release.map_or(0, |r| r.minor),
            }
        }
        None => NodeState::Other(node.id.clone()),
    }
}

/// A watcher's log and current view (node ID to state).
pub struct Watcher {
    /// Its log.
    pub log: Arc<Mutex<WatcherLog>>,
    /// Its view now.
    pub view: Arc<Mutex<BTreeMap<String, NodeState>>>,
}

/// The running workload.
pub struct Workload {
    /// The history it records.
    pub recorder: Recorder,
    /// The watchers.
    pub watchers: Vec<Watcher>,
    stop_writes: Arc<AtomicBool>,
    writers: Vec<JoinHandle<()>>,
    others: Vec<JoinHandle<()>>,
    /// The owner's raw watches (for the final reads).
    pub owner: RawWatches,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Workload {
    /// Follows `view` as `watcher` until the workload stops.
    fn watch(&mut self, view: client::NodeView, watcher: Watcher, ids: &[String], clock: Clock) {
        self.others.push(tokio::spawn(watch_loop(
            view,
            ids.to_vec(),
            clock,
            watcher.clone_parts(),
        )));
        self.watchers.push(watcher);
    }

    /// Adds `nodes` nodes and [`AGENTS`] machines as the owner (whose
    /// credential is in `owner_dir`), then starts everything.
    pub async fn start(
        owner_dir: &Path,
        nodes: usize,
        clock: Clock,
        seed: u64,
    ) -> Result<Workload, String> {
        let owner = Owner::connect(owner_dir).await?;
        let recorder = Recorder::default();
        let mut node_clients = Vec::new();
        for _ in 0..nodes {
            let node = owner.add_node().await?;
            recorder.lock().nodes.push(node.id.clone());
            node_clients.push((node.id, node.tls));
        }
        let mut agents = Vec::new();
        for a in 0..AGENTS {
            let agent = owner
                .add_agent(&format!("3b241101-e2bb-4255-8caf-4136c566a9{a:02}"))
                .await?;
            agents.push((agent.machine_id, agent.tls));
        }
        let owner_tls = owner.tls()?;
        let config = |first: usize, agent: bool, tls, salt: u64| {
            client::client(
                Cluster::endpoints(first, agent),
                tls,
                CALL_TIMEOUT,
                seed.wrapping_mul(31).wrapping_add(salt),
            )
        };
        let owner_client = RawWatches::new(owner_tls.clone());
        let mut w = Workload {
            recorder: recorder.clone(),
            watchers: Vec::new(),
            stop_writes: Arc::default(),
            writers: Vec::new(),
            others: Vec::new(),
            owner: owner_client.clone(),
        };
        let ids: Vec<String> = node_clients.iter().map(|(id, _)| id.clone()).collect();
        for (i, (id, tls)) in node_clients.iter().enumerate() {
            // Each writer starts on another instance, seeded.
            let first = usize::try_from(seed.wrapping_add(i as u64) % N as u64).unwrap_or(0);
            let client = config(first, false, tls.clone(), i as u64)?;
            w.writers.push(tokio::spawn(write_loop(
                Writer {
                    client: client.clone(),
                    reads: RawWatches::new(tls.clone()),
                    node: i,
                    id: id.clone(),
                    ids: ids.clone(),
                },
                clock,
                recorder.clone(),
                w.stop_writes.clone(),
            )));
            // This node's own watcher, through its credential.
            let watcher = Watcher::new(
                format!("node-{i}@curator-{}", (i + 1) % N),
                WatchKind::Node(i),
            );
            let node_id =
                NodeId::parse(id).map_err(|e| format!("the ID of node {i}, {id}: {e}"))?;
            let view = config((i + 1) % N, false, tls.clone(), 100 + i as u64)?.watch_node(node_id);
            w.watch(view, watcher, &ids, clock);
        }
        for j in 0..N {
            let watcher = Watcher::new(format!("nodes@curator-{j}"), WatchKind::Nodes);
            let view = config(j, false, owner_tls.clone(), 200 + j as u64)?.watch_nodes();
            w.watch(view, watcher, &ids, clock);
        }
        for (a, (machine_id, tls)) in agents.into_iter().enumerate() {
            let client = config(a, true, tls, 300 + a as u64)?;
            w.others.push(tokio::spawn(beat_loop(
                client,
                a,
                machine_id,
                clock,
                recorder.clone(),
            )));
        }
        w.others.push(tokio::spawn(probe::run(
            owner_client,
            ids,
            clock,
            recorder,
            seed,
        )));
        Ok(w)
    }

    /// Stops the writers and waits for their last calls.
    pub async fn stop_writes(&mut self) {
        self.stop_writes.store(true, Ordering::SeqCst);
        for t in self.writers.drain(..) {
            let _ = t.await;
        }
    }

    /// Stops everything.
    pub fn stop(&mut self) {
        self.stop_writes.store(true, Ordering::SeqCst);
        for t in self.writers.drain(..).chain(self.others.drain(..)) {
            t.abort();
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Watcher {
    fn new(name: String, kind: WatchKind) -> Watcher {
        Watcher {
            log: Arc::new(Mutex::new(WatcherLog {
                name,
                kind,
                events: Vec::new(),
            })),
            view: Arc::default(),
        }
    }

    fn clone_parts(&self) -> Watcher {
        Watcher {
            log: self.log.clone(),
            view: self.view.clone(),
        }
    }

    /// Its log now.
    pub fn snapshot(&self) -> WatcherLog {
        lock(&self.log).clone()
    }

    /// Its view now.
    pub fn current(&self) -> BTreeMap<String, NodeState> {
        lock(&self.view).clone()
    }
}

/// One node's writer: its client, and raw watches for its read-backs.
struct Writer {
    client: Client,
    reads: RawWatches,
    node: usize,
    id: String,
    ids: Vec<String>,
}

/// Writes the node's status again and again; after each acknowledged
/// write, reads it back through a fresh `NodeInCluster` Watch on an
/// instance in turn (the read-your-writes reads of the checks).
async fn write_loop(writer: Writer, clock: Clock, recorder: Recorder, stop: Arc<AtomicBool>) {
    let Writer {
        client,
        reads,
        node,
        id,
        ids,
    } = writer;
    let mut seq = 0i64;
    while !stop.load(Ordering::SeqCst) {
        seq += 1;
        let req = curator::UpdateNodeStatusRequest {
            node_id: id.clone(),
            status: Some(status(seq, node)),
        };
        let called = clock.now();
        let result = client.update_node_status(req, WRITE_DEADLINE).await;
        let returned = clock.now();
        let error = result.err().map(|e| e.to_string());
        let failed = error.is_some();
        recorder.lock().writes.push(WriteOp {
            node,
            seq,
            called,
            returned,
            error,
        });
        if !failed {
            let via = usize::try_from(seq).unwrap_or(0) % N;
            let kind = curator::watch_request::Kind::NodeInCluster(
                curator::watch_request::NodeInCluster {
                    node_id: id.clone(),
                },
            );
            let _ = probe::backlog(&reads, via, kind, &ids, clock, &recorder, Duration::ZERO).await;
        }
        tokio::time::sleep(Duration::from_millis(if failed { 50 } else { 20 })).await;
    }
}

async fn watch_loop(mut view: client::NodeView, ids: Vec<String>, clock: Clock, watcher: Watcher) {
    while let Some(event) = view.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                // A refusal no reconnect can change: the view has ended.
                let at = clock.now();
                lock(&watcher.log)
                    .events
                    .push((at, Seen::Reconnecting(format!("the view ended: {e}"))));
                return;
            }
        };
        let seen = match event {
            NodeEvent::Synced => Seen::Synced,
            NodeEvent::Resynced => Seen::Resynced,
            NodeEvent::Reconnecting { reason } => Seen::Reconnecting(reason),
            NodeEvent::Changed(node) => {
                let state = state_of(&node, &ids);
                lock(&watcher.view).insert(node.id.clone(), state.clone());
                Seen::Changed(state)
            }
            NodeEvent::Removed(id) => {
                lock(&watcher.view).remove(&id);
                Seen::Removed(id)
            }
            _ => continue,
        };
        let at = clock.now();
        lock(&watcher.log).events.push((at, seen));
    }
}

async fn beat_loop(
    client: Client,
    agent: usize,
    machine_id: String,
    clock: Clock,
    recorder: Recorder,
) {
    loop {
        let req = agent::HeartbeatRequest {
            machine_id: machine_id.clone(),
            ..Default::default()
        };
        let ok = client.heartbeat(req, WRITE_DEADLINE).await.is_ok();
        let returned = clock.now();
        recorder.lock().beats.push(BeatOp {
            agent,
            returned,
            ok,
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
