//! A deterministic async runtime for running the shipped service code in
//! simulation: one thread, simulated time, a seeded choice of which ready
//! task runs next, and nodes that can crash.
//!
//! # The run loop
//!
//! [`Runtime::step`] does one thing: if tasks are ready it polls one of
//! them, picked by the seed among the ready ones; otherwise it moves time
//! to the earliest timer and wakes every timer due then. Nothing else
//! moves time, so a run is a pure function of its seed and of what the
//! test does between steps.
//!
//! # Nodes
//!
//! Every task belongs to a node ([`NodeId`], an index). A node reaches
//! the runtime through its [`Node`] handle, which is the service layer's
//! [`Spawner`], [`Timer`], [`MonotonicClock`] and [`WallClock`] ports on
//! that node's own clocks ([`NodeClock`]: offset, drift, wall-clock
//! jumps). [`Runtime::crash`] drops every task of a node at once, as a
//! killed process loses its tasks; what it held (leases, keys) lives on in
//! the simulated store until it expires.

pub mod clock;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures::future::BoxFuture;
use metropolis_core::ports::{MonotonicClock, Spawner, Timer, WallClock};
use metropolis_core::time::Instant;

pub use clock::NodeClock;
use clock::micros;

use crate::rng::Rng;

/// A node of the simulation: an index into the runtime's nodes.
pub type NodeId = usize;

/// Steps at one instant of simulated time after which a run counts as
/// livelocked (tasks waking each other forever without time passing):
/// [`Runtime::run_until`] panics, naming the instant.
pub const LIVELOCK_STEPS: u64 = 1_000_000;

/// The wall-clock time of global time zero, ms since the Unix epoch.
pub const EPOCH_MS: i64 = 1_700_000_000_000;

type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

struct Slot {
    node: NodeId,
    /// `None` while it is being polled.
    future: Option<Task>,
    /// Its waker, made once.
    waker: Waker,
}

struct State {
    /// Global time, µs since the run began.
    now_us: u64,
    rng: Rng,
    /// The network's draws ([`Runtime::network_delay`]), apart from the
    /// scheduler's.
    network: Rng,
    tasks: BTreeMap<u64, Slot>,
    next_task: u64,
    /// Timers by (global due time, registration order).
    timers: BTreeMap<(u64, u64), Waker>,
    next_timer: u64,
    clocks: Vec<NodeClock>,
    /// Bumped by every crash of the node: tasks spawned for an earlier
    /// incarnation are not started.
    incarnation: Vec<u64>,
    polls: u64,
}

/// Tasks woken since they were last polled; shared with the wakers.
#[derive(Default)]
struct Ready(Mutex<ReadySet>);

/// A set of task ids in the order they became ready (a task woken again
/// before it was polled keeps its place), so that picking the `n`th and
/// removing it is O(1) and the same sequence of wakes gives the same order.
#[derive(Default)]
struct ReadySet {
    order: Vec<u64>,
    members: HashSet<u64>,
}

impl ReadySet {
    fn insert(&mut self, id: u64) {
        if self.members.insert(id) {
            self.order.push(id);
        }
    }

    /// Removes and returns the `pick`th (below [`len`](Self::len)).
    fn take(&mut self, pick: usize) -> u64 {
        let id = self.order.swap_remove(pick);
        self.members.remove(&id);
        id
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn clear(&mut self) {
        self.order.clear();
        self.members.clear();
    }
}

struct TaskWaker {
    id: u64,
    ready: Arc<Ready>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        lock(&self.ready.0).insert(self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // One thread: a poisoned lock only means a task panicked, and that
    // panic is the test's failure already.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The deterministic runtime; clones share it. See the [module docs](self).
#[derive(Clone)]
pub struct Runtime {
    state: Arc<Mutex<State>>,
    ready: Arc<Ready>,
}

impl Runtime {
    /// A runtime at global time zero whose choices follow `seed`, with one
    /// node per entry of `clocks`.
    pub fn new(seed: u64, clocks: Vec<NodeClock>) -> Runtime {
        let nodes = clocks.len();
        Runtime {
            state: Arc::new(Mutex::new(State {
                now_us: 0,
                rng: Rng::new(seed),
                network: Rng::new(seed ^ 0x6e74_776b),
                tasks: BTreeMap::new(),
                next_task: 0,
                timers: BTreeMap::new(),
                next_timer: 0,
                clocks,
                incarnation: vec![0; nodes],
                polls: 0,
            })),
            ready: Arc::new(Ready::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The handle of `node`: its ports.
    pub fn node(&self, node: NodeId) -> Node {
        let incarnation = self.state().incarnation[node];
        Node {
            runtime: self.clone(),
            node,
            incarnation,
        }
    }

    /// Global time since the run began.
    pub fn now(&self) -> Duration {
        Duration::from_micros(self.state().now_us)
    }

    /// A seeded delay below `max` for one message crossing the network:
    /// calls on different connections sent at once arrive in either order.
    pub fn network_delay(&self, max: Duration) -> Duration {
        let max = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
        Duration::from_micros(self.state().network.below(max))
    }

    /// How many task polls ran so far.
    pub fn polls(&self) -> u64 {
        self.state().polls
    }

    /// Tasks not finished, on every node.
    pub fn tasks(&self) -> usize {
        self.state().tasks.len()
    }

    /// Tasks not finished on `node`.
    pub fn tasks_of(&self, node: NodeId) -> usize {
        self.state()
            .tasks
            .values()
            .filter(|t| t.node == node)
            .count()
    }

    /// Drops every task of `node` (their futures' destructors run now):
    /// the node crashed. Handles made before keep spawning nothing; take
    /// a new [`node`](Self::node) handle for the restarted node.
    pub fn crash(&self, node: NodeId) {
        let dropped: Vec<Slot> = {
            let mut state = self.state();
            state.incarnation[node] += 1;
            let ids: Vec<u64> = state
                .tasks
                .iter()
                .filter(|(_, t)| t.node == node)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| state.tasks.remove(id)).collect()
        };
        // Outside the lock: destructors may spawn or wake.
        drop(dropped);
    }

    /// Ends the run: every task of every node is dropped and every timer
    /// cleared, as if every node crashed. Tasks hold the runtime (their
    /// node's handle), so a runtime whose tasks are left is never freed:
    /// call it when a run is over (a campaign of thousands of runs in one
    /// process needs it).
    pub fn shutdown(&self) {
        let dropped: Vec<Slot> = {
            let mut state = self.state();
            for incarnation in &mut state.incarnation {
                *incarnation += 1;
            }
            state.timers.clear();
            std::mem::take(&mut state.tasks).into_values().collect()
        };
        // Outside the lock: destructors may spawn (refused: their node's
        // incarnation is over) or wake.
        drop(dropped);
        lock(&self.ready.0).clear();
    }

    /// Moves `node`'s wall clock by `ms` (negative: backwards).
    pub fn jump_wall_clock(&self, node: NodeId, ms: i64) {
        let mut state = self.state();
        let clock = &mut state.clocks[node];
        clock.wall_minus_monotonic_ms = clock.wall_minus_monotonic_ms.saturating_add(ms);
    }

    fn spawn_on(&self, node: NodeId, incarnation: u64, task: Task) {
        let id = {
            let mut state = self.state();
            if state.incarnation[node] != incarnation {
                return;
            }
            let id = state.next_task;
            state.next_task += 1;
            state.tasks.insert(
                id,
                Slot {
                    node,
                    future: Some(task),
                    waker: Waker::from(Arc::new(TaskWaker {
                        id,
                        ready: self.ready.clone(),
                    })),
                },
            );
            id
        };
        lock(&self.ready.0).insert(id);
    }

    /// One step (see the [module docs](self)); false once nothing is
    /// ready and no timer is set.
    pub fn step(&self) -> bool {
        self.step_until(u64::MAX)
    }

    /// A step that moves time no further than global `limit_us`.
    fn step_until(&self, limit_us: u64) -> bool {
        let next = {
            let mut ready = lock(&self.ready.0);
            if ready.len() == 0 {
                None
            } else {
                let pick = self.state().rng.index(ready.len());
                Some(ready.take(pick))
            }
        };
        match next {
            Some(id) => {
                self.poll(id);
                true
            }
            None => self.fire_timers(limit_us),
        }
    }

    /// Moves time to the earliest timer (if due by `limit_us`) and wakes
    /// every timer due then; whether there was one.
    fn fire_timers(&self, limit_us: u64) -> bool {
        let due: Vec<Waker> = {
            let mut state = self.state();
            let Some((&(at, _), _)) = state.timers.first_key_value() else {
                return false;
            };
            if at > limit_us {
                return false;
            }
            state.now_us = state.now_us.max(at);
            let now = state.now_us;
            let later = state.timers.split_off(&(now + 1, 0));
            std::mem::replace(&mut state.timers, later)
                .into_values()
                .collect()
        };
        for waker in due {
            waker.wake();
        }
        true
    }

    fn poll(&self, id: u64) {
        let polled = {
            let mut state = self.state();
            state.polls += 1;
            state
                .tasks
                .get_mut(&id)
                .and_then(|t| Some((t.future.take()?, t.waker.clone())))
        };
        // Finished, crashed, or woken twice: nothing to poll.
        let Some((mut future, waker)) = polled else {
            return;
        };
        let done = future
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready();
        let mut state = self.state();
        if done {
            state.tasks.remove(&id);
        } else if let Some(slot) = state.tasks.get_mut(&id) {
            slot.future = Some(future);
        }
        // A task whose node crashed while it was polled is gone from the
        // map: its future drops here, after the lock.
        drop(state);
    }

    /// Runs until global time `until` (the runtime's time is then
    /// exactly `until`) or until nothing is left to do; the steps taken.
    /// Panics after [`LIVELOCK_STEPS`] steps without time passing.
    pub fn run_until(&self, until: Duration) -> u64 {
        let limit = micros(until);
        let (mut steps, mut at, mut here) = (0, self.state().now_us, 0);
        while self.step_until(limit) {
            steps += 1;
            let now = self.state().now_us;
            if now == at {
                here += 1;
                assert!(
                    here < LIVELOCK_STEPS,
                    "livelock: {LIVELOCK_STEPS} steps at {:?} of simulated time without it \
                     passing",
                    Duration::from_micros(now)
                );
            } else {
                (at, here) = (now, 0);
            }
        }
        let mut state = self.state();
        state.now_us = state.now_us.max(limit);
        steps
    }

    /// Runs for `d` of simulated time from now.
    pub fn run_for(&self, d: Duration) -> u64 {
        self.run_until(self.now() + d)
    }

    fn register_timer(&self, global_us: u64, waker: Waker) {
        let mut state = self.state();
        let seq = state.next_timer;
        state.next_timer += 1;
        state.timers.insert((global_us, seq), waker);
    }

    fn local_now(&self, node: NodeId) -> Instant {
        let state = self.state();
        let us = state.clocks[node].local_us(state.now_us);
        Instant::from_offset(Duration::from_micros(us))
    }
}

/// One node's view of the runtime: its [`Spawner`], [`Timer`],
/// [`MonotonicClock`] and [`WallClock`] ports.
#[derive(Clone)]
pub struct Node {
    runtime: Runtime,
    node: NodeId,
    incarnation: u64,
}

impl Node {
    /// Which node this is.
    pub fn id(&self) -> NodeId {
        self.node
    }

    /// Spawns `task` on this node.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.runtime
            .spawn_on(self.node, self.incarnation, Box::pin(task));
    }
}

impl Spawner for Node {
    fn spawn(&self, task: Task) {
        self.runtime.spawn_on(self.node, self.incarnation, task);
    }
}

impl MonotonicClock for Node {
    fn now(&self) -> Instant {
        self.runtime.local_now(self.node)
    }
}

impl WallClock for Node {
    fn now_unix_ms(&self) -> i64 {
        let state = self.runtime.state();
        state.clocks[self.node].wall_ms(EPOCH_MS, state.now_us)
    }
}

/// `d` in microseconds, rounded up.
fn micros_up(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX)
}

impl Timer for Node {
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        let runtime = self.runtime.clone();
        let node = self.node;
        // The global instant the timer is set for. Local time is whole
        // microseconds of a drifting clock: a deadline between two of
        // them, or rounding through the drift, can leave the node short
        // of the deadline when the timer fires, so it is set again.
        let mut armed: Option<u64> = None;
        Box::pin(futures::future::poll_fn(move |cx| {
            if runtime.local_now(node) >= deadline {
                return Poll::Ready(());
            }
            let now_us = runtime.state().now_us;
            if armed.is_none_or(|at| at <= now_us) {
                let local_us = micros_up(deadline.offset());
                let due = runtime.state().clocks[node]
                    .global_us(local_us)
                    .max(now_us.saturating_add(1));
                runtime.register_timer(due, cx.waker().clone());
                armed = Some(due);
            }
            Poll::Pending
        }))
    }
}

#[cfg(test)]
mod tests;
