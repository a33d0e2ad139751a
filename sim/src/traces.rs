//! Trace sessions through the shipped `NodeDebugService`: core's
//! `DebugService` built by `DebugService::with_ports` as the daemon builds
//! it (its start removes the instances a killed run left), behind the
//! real router, called with real framed gRPC on the deterministic
//! runtime. Two nodes: node 0 gives each session an instance of its own,
//! node 1 traces into the global buffer.
//!
//! Each node's tracefs is the test kit's in-memory one, as the kernel's:
//! it outlives the daemon. A seeded schedule fails 3 % of its operations
//! (not found, not permitted, rejected, busy, other). The daemon crashes
//! at seeded moments: its file operations stop there (a killed process
//! runs no teardown), the kernel closes its pipes, and the next run starts
//! a second or two later. A kernel task feeds every open `trace_pipe` a
//! line every 10 ms.
//!
//! One client per node starts sessions with a seeded tracer (some the
//! kernel refuses) and filters (some matching nothing), reads for a while
//! and cancels (the simulated network resets the stream, so the server's
//! teardown runs). Checked:
//!
//! - a start is refused only for a reason: the tracer or a filter refused
//!   (InvalidArgument), an injected failure during the start, or the
//!   daemon down or crashed (Unavailable); never "already in progress" for
//!   a client whose previous session was cancelled, never an instance
//!   left by a killed run;
//! - a started stream ends only by the client's cancel or a crash;
//! - after a cancel with no injected failure, the buffer is restored
//!   (tracing off, `nop`, no filters, no pipe) or the instance removed;
//! - at the end, after a restart of every daemon and one clean session
//!   each: no instance left and the global buffer restored.

// The checks panic on what breaks an invariant, and what this module
// unwraps is the simulation's own.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Outcome;
use crate::call::{Messages, server_stream};
use crate::hash::TraceHash;
use crate::rng::Rng;
use crate::runtime::{Node, NodeClock, Runtime};
use crate::upstream::Routers;
use futures::StreamExt;
use metropolis_core::identity::Identity;
use metropolis_core::logtree::LogTreeConfig;
use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_core::trace::{FailureKind, TracePipe, Tracefs, TracefsFailure, WriteMode};
use metropolis_proto::prelude::debug;
use metropolis_service::Router;
use metropolis_service::debug::{DebugPorts, DebugService, LogHub, TraceWait};
use metropolis_testkit::tracefs::{FakeBuffer, FakePort, FakeTracefs};
use prost::Message;

const NODES: usize = 2;
/// The node whose sessions get instances of their own (the other traces
/// into the global buffer).
const INSTANCES_NODE: usize = 0;
const CLIENT: usize = NODES;
const TRACE: &str = "/metropolis.proto.api.NodeDebugService/Trace";
/// The names of each node's counts in [`Outcome::fired`]: sessions
/// started, daemons killed, tracefs failures injected (node 0 gives each
/// session an instance, node 1 traces into the global buffer).
const NODE_COUNTS: [[&str; 3]; NODES] = [
    [
        "node 0 sessions started",
        "node 0 daemons killed",
        "node 0 tracefs failures injected",
    ],
    [
        "node 1 sessions started",
        "node 1 daemons killed",
        "node 1 tracefs failures injected",
    ],
];
/// Clients start sessions until then.
const CLIENTS_STOP: Duration = Duration::from_secs(25);
/// The failure kinds the schedule injects.
const INJECTED: [FailureKind; 5] = [
    FailureKind::NotFound,
    FailureKind::NotPermitted,
    FailureKind::Rejected,
    FailureKind::Busy,
    FailureKind::Other,
];

/// One daemon's view of its node's tracefs: the kernel's state (the fake)
/// outlives the process, and once the process is killed its operations
/// never happen.
#[derive(Clone)]
struct ProcessTracefs {
    port: FakePort,
    alive: Arc<AtomicBool>,
}

impl ProcessTracefs {
    fn check(&self) -> Result<(), TracefsFailure> {
        if self.alive.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(TracefsFailure::new(
                FailureKind::Other,
                "the process is gone",
            ))
        }
    }
}

impl Tracefs for ProcessTracefs {
    fn mkdir(&self, dir: &str) -> Result<(), TracefsFailure> {
        self.check()?;
        self.port.mkdir(dir)
    }

    fn rmdir(&self, dir: &str) -> Result<(), TracefsFailure> {
        self.check()?;
        self.port.rmdir(dir)
    }

    fn write(&self, file: &str, value: &str, mode: WriteMode) -> Result<(), TracefsFailure> {
        self.check()?;
        self.port.write(file, value, mode)
    }

    fn open_pipe(&self, file: &str) -> Result<Box<dyn TracePipe>, TracefsFailure> {
        self.check()?;
        self.port.open_pipe(file)
    }

    fn instances(&self) -> Result<Vec<String>, TracefsFailure> {
        self.check()?;
        self.port.instances()
    }
}

fn restored(b: &FakeBuffer) -> bool {
    !b.tracing_on && b.tracer == "nop" && b.filter.is_empty() && b.graph.is_empty() && !b.pipe_open
}

/// Whether node `i`'s tracefs holds nothing of sessions that are over:
/// no instance beyond those in `kept`, or the global buffer restored.
fn clean(i: usize, fs: &FakeTracefs, kept: &[String]) -> bool {
    if i == INSTANCES_NODE {
        fs.instances.keys().all(|k| kept.contains(k))
    } else {
        restored(&fs.global)
    }
}

/// One node: its tracefs (the kernel's), the running daemon's liveness,
/// and how often it was killed.
struct TraceNode {
    port: FakePort,
    process: Mutex<Arc<AtomicBool>>,
    crashes: AtomicU64,
}

impl TraceNode {
    fn crashes(&self) -> u64 {
        self.crashes.load(Ordering::Relaxed)
    }

    /// Whether an injected failure is among the operations from `from` on.
    fn injected_since(&self, from: usize) -> bool {
        self.port.fs().log.iter().skip(from).any(|op| op.injected)
    }

    fn log_len(&self) -> usize {
        self.port.fs().log.len()
    }
}

/// The world of one seed.
struct World {
    rt: Runtime,
    routers: Routers,
    nodes: Arc<Vec<TraceNode>>,
    violations: Arc<Mutex<Vec<String>>>,
    trace: Arc<Mutex<TraceHash>>,
    /// Sessions that started, per node.
    started: Arc<[AtomicU64; NODES]>,
}

/// A run's tasks hold its runtime, and the routers its services.
impl Drop for World {
    fn drop(&mut self) {
        self.rt.shutdown();
        for i in 0..NODES {
            self.routers.set(i, None);
        }
    }
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng::new(seed ^ 0x7ace);
        let nodes = (0..NODES)
            .map(|_| {
                let mut fs = FakeTracefs::new();
                fs.schedule = (0..4000)
                    .map(|_| {
                        rng.chance(0.03)
                            .then(|| INJECTED[rng.index(INJECTED.len())])
                    })
                    .collect();
                TraceNode {
                    port: FakePort::new(fs),
                    process: Mutex::new(Arc::new(AtomicBool::new(false))),
                    crashes: AtomicU64::new(0),
                }
            })
            .collect();
        let world = World {
            rt: Runtime::new(seed, vec![NodeClock::default(); NODES + 1]),
            routers: Routers::default(),
            nodes: Arc::new(nodes),
            violations: Arc::default(),
            trace: Arc::default(),
            started: Arc::default(),
        };
        for i in 0..NODES {
            world.start(i);
        }
        world.kernel();
        world
    }

    /// Starts node `i`'s daemon: a fresh process over the node's tracefs,
    /// its debug service built as the daemon builds it.
    fn start(&self, i: usize) {
        let node = &self.nodes[i];
        let alive = Arc::new(AtomicBool::new(true));
        *node.process.lock().unwrap() = alive.clone();
        let tracefs = ProcessTracefs {
            port: node.port.clone(),
            alive,
        };
        let debug = DebugService::with_ports(DebugPorts {
            tracefs: Some(Arc::new(tracefs)),
            trace_instances: i == INSTANCES_NODE,
            trace_wait: Some({
                let node = self.rt.node(i);
                TraceWait::new(Arc::new(node.clone()), Arc::new(node))
            }),
            ..DebugPorts::new(LogHub::new(LogTreeConfig::default()))
        });
        self.routers
            .set(i, Some(Router::new().with_service(debug.server())));
    }

    /// Kills node `i`'s daemon: its file operations stop, its tasks and
    /// calls end, and the kernel closes its `trace_pipe`s.
    fn crash(&self, i: usize) {
        let node = &self.nodes[i];
        node.process.lock().unwrap().store(false, Ordering::Relaxed);
        node.crashes.fetch_add(1, Ordering::Relaxed);
        self.routers.set(i, None);
        self.rt.crash(i);
        node.port.fs().release_pipes();
        node.port.drop_pipes();
    }

    /// The kernel: a line into every open `trace_pipe` every 10 ms.
    fn kernel(&self) {
        let nodes = self.nodes.clone();
        let clock = self.rt.node(CLIENT);
        self.rt.node(CLIENT).spawn(async move {
            let mut n = 0u64;
            loop {
                clock
                    .sleep_until(clock.now() + Duration::from_millis(10))
                    .await;
                n += 1;
                for node in nodes.iter() {
                    let mut pipes = node.port.pipes.lock().unwrap();
                    pipes.retain(|tx| !tx.is_closed());
                    for tx in pipes.iter() {
                        let _ = tx.unbounded_send(Ok(format!("  <idle>-0 [000] {n}: nop")));
                    }
                }
            }
        });
    }

    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    /// The client of node `i`: sessions until `stop` (global time).
    fn client(&self, i: usize, seed: u64, stop: Duration) {
        let (rt, routers, nodes) = (self.rt.clone(), self.routers.clone(), self.nodes.clone());
        let (violations, trace, started) = (
            self.violations.clone(),
            self.trace.clone(),
            self.started.clone(),
        );
        let clock = self.rt.node(CLIENT);
        let mut rng = Rng::new(seed ^ (0xc1 + i as u64));
        self.rt.node(CLIENT).spawn(async move {
            let node = &nodes[i];
            let violation = |what: String| violations.lock().unwrap().push(what);
            while rt.now() < stop {
                let pause = Duration::from_millis(rng.range(20, 400));
                clock.sleep_until(clock.now() + pause).await;
                let (request, refusable) = request(&mut rng);
                let (log_from, crashes) = (node.log_len(), node.crashes());
                let instances_before: Vec<String> =
                    node.port.fs().instances.keys().cloned().collect();
                let up = routers.get(i).is_some();
                let opened = server_stream(
                    &rt,
                    &routers,
                    CLIENT,
                    i,
                    TRACE,
                    Identity::Unauthenticated,
                    request.encode_to_vec(),
                )
                .await;
                let injected = node.injected_since(log_from);
                let crashed = node.crashes() != crashes || !up;
                let mut events = match opened {
                    Ok(events) => events,
                    Err(code) => {
                        trace
                            .lock()
                            .unwrap()
                            .bytes(format!("{i} {code:?}").as_bytes());
                        let explained = match code {
                            tonic::Code::Unavailable => crashed || injected,
                            tonic::Code::InvalidArgument => refusable || injected,
                            tonic::Code::FailedPrecondition => injected,
                            _ => false,
                        };
                        if !explained {
                            violation(format!(
                                "node {i}: {request:?} refused with {code:?} (no injected \
                                 failure, no crash)"
                            ));
                        }
                        continue;
                    }
                };
                started[i].fetch_add(1, Ordering::Relaxed);
                if refusable && !injected {
                    violation(format!("node {i}: {request:?} started"));
                }
                // Read for a while, then cancel (drop the stream).
                let until = clock.now() + Duration::from_millis(rng.range(0, 600));
                let (lines, ended) = read_until(&mut events, &clock, until).await;
                drop(events);
                trace
                    .lock()
                    .unwrap()
                    .bytes(format!("{i} started {lines} {ended:?}").as_bytes());
                let crashed = node.crashes() != crashes;
                if let Some(code) = ended
                    && !(crashed || code == tonic::Code::Unavailable && injected)
                {
                    violation(format!("node {i}: a running session ended {code:?}"));
                }
                // The reset reaches the server, whose teardown runs.
                clock
                    .sleep_until(clock.now() + Duration::from_millis(5))
                    .await;
                if !crashed && !node.injected_since(log_from) {
                    let fs = node.port.fs();
                    if !clean(i, &fs, &instances_before) {
                        violation(format!(
                            "node {i}: not restored after a cancel: {:?} {:?}",
                            fs.global, fs.instances
                        ));
                    }
                }
            }
        });
    }
}

/// Reads `events` until `until` on `clock`: the lines read, and how the
/// stream ended if it did (`Ok` for a clean end).
async fn read_until(
    events: &mut Messages,
    clock: &Node,
    until: metropolis_core::time::Instant,
) -> (u64, Option<tonic::Code>) {
    use futures::future::{Either, select};
    let mut lines = 0;
    loop {
        match select(events.next(), Box::pin(clock.sleep_until(until))).await {
            Either::Left((Some(Ok(_)), _)) => lines += 1,
            Either::Left((Some(Err(code)), _)) => return (lines, Some(code)),
            Either::Left((None, _)) => return (lines, Some(tonic::Code::Ok)),
            Either::Right(_) => return (lines, None),
        }
    }
}

/// A seeded request, and whether the kernel may refuse it (a tracer it
/// refuses, a filter matching nothing).
fn request(rng: &mut Rng) -> (debug::TraceRequest, bool) {
    let tracer = match rng.below(20) {
        0..=5 => "nop",
        6..=11 => "blk",
        12..=16 => "function_graph",
        17 | 18 => "function",
        _ => "bogus",
    };
    let mut refusable = matches!(tracer, "function" | "bogus");
    let mut filter = Vec::new();
    if rng.chance(0.2) {
        let pattern = if rng.chance(0.2) {
            "nomatch_*"
        } else {
            "vfs_*"
        };
        refusable |= pattern.starts_with("nomatch");
        filter.push(pattern.to_owned());
    }
    let graph = if tracer == "function_graph" && rng.chance(0.3) {
        vec!["do_sys_open".to_owned()]
    } else {
        Vec::new()
    };
    let request = debug::TraceRequest {
        tracer: tracer.to_owned(),
        function_filter: filter,
        graph_function_filter: graph,
    };
    (request, refusable)
}

/// What a run did.
/// One seeded run: clients for 25 s while the daemons are killed at
/// seeded moments (each started again after up to 2 s); then every daemon
/// restarted, the injections stopped, and one clean session per node.
/// Panics on a broken invariant, naming the seed.
pub fn run(seed: u64) -> Outcome {
    let world = World::new(seed);
    let mut rng = Rng::new(seed ^ 0xdead);
    for i in 0..NODES {
        world.client(i, seed, CLIENTS_STOP);
    }
    while world.rt.now() < CLIENTS_STOP {
        world
            .rt
            .run_for(Duration::from_millis(rng.range(500, 5000)));
        let victim = rng.index(NODES);
        world.crash(victim);
        world.rt.run_for(Duration::from_millis(rng.range(0, 2000)));
        world.start(victim);
    }
    world.rt.run_for(Duration::from_secs(2));
    // The end: each daemon killed and started again (its start removes
    // what a killed run left), the kernel's failures over, one session
    // each, cancelled.
    for i in 0..NODES {
        world.crash(i);
        world.nodes[i].port.fs().schedule.clear();
        world.start(i);
    }
    let end = world.rt.now() + Duration::from_secs(1);
    for i in 0..NODES {
        world.client(i, seed ^ 0xe4d, end);
    }
    world.rt.run_until(end + Duration::from_secs(1));
    for (i, node) in world.nodes.iter().enumerate() {
        let fs = node.port.fs();
        if !clean(i, &fs, &[]) {
            world.violation(format!(
                "seed {seed}: node {i} left {:?} {:?}",
                fs.global,
                fs.instances.keys().collect::<Vec<_>>()
            ));
        }
    }
    let violations = world.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    let mut fired = Vec::new();
    for (i, node) in world.nodes.iter().enumerate() {
        let injected = node.port.fs().log.iter().filter(|op| op.injected).count() as u64;
        let [started, killed, failures] = NODE_COUNTS[i];
        fired.push((started, world.started[i].load(Ordering::Relaxed)));
        fired.push((killed, node.crashes()));
        fired.push((failures, injected));
    }
    Outcome {
        seed,
        trace: world.trace.lock().unwrap().value(),
        polls: world.rt.polls(),
        simulated: world.rt.now(),
        fired,
    }
}
