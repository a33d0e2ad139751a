//! The world: every process, the network, and the event loop over a
//! queue of timed events ordered by (time, sequence). Faults are injected
//! by the loop itself during the fault phase; the healing phase turns
//! them off and checks liveness.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use metropolis_core::leadership::Role;
use metropolis_core::provisioning::MachineRecord;
use metropolis_core::store::KeyRange;

use crate::agents::{Agent, Disk, machine_id};
use crate::canary::Canary;
use crate::clients::{Operator, Watcher, Writer};
use crate::ctx::Ctx;
use crate::curator::Curator;
use crate::faults::FaultMix;
use crate::hash::TraceHash;
use crate::invariants::{Checks, MACHINES, NODES};
use crate::msg::{Addr, Msg, StreamId};
use crate::net::{Fate, Net, Time};
use crate::rng::Rng;
use crate::store_node::{StoreNode, store_leader};
use crate::trace::TraceDriver;

/// Seconds after the faults stop within which the system must have
/// converged (one leader, views equal to the store, requests answered).
pub const LIVENESS_BOUND_SECS: u64 = 40;
/// Seconds into the healing phase when writers and the operator stop.
const QUIET_AFTER_SECS: u64 = 5;
const SEC: Time = 1_000_000;
/// A run processing more events than this fails (a livelock or a storm).
const MAX_EVENTS: u64 = 2_000_000;
const FAULT_TICK: Time = 100_000;
/// How long a broken connection takes to be noticed.
const RESET_AFTER: Time = 1_000_000;

/// One process.
#[derive(Debug)]
enum Proc {
    Store(StoreNode),
    Curator(usize, Option<Box<Curator>>),
    Trace(TraceDriver),
    Watcher(Watcher),
    Writer(Writer),
    Operator(Operator),
    Agent(usize, Option<Box<Agent>>, Disk),
}

/// A process's life: up or down, paused, its clock offset.
#[derive(Debug, Default)]
struct Life {
    down: bool,
    paused_until: Time,
    offset: Time,
    incarnation: u32,
}

#[derive(Debug)]
enum Ev {
    Deliver { from: Addr, to: Addr, msg: Box<Msg> },
    Wake { to: Addr },
    Restart { to: Addr },
    Resume { to: Addr },
    FaultTick,
    HealPartition,
    Heal,
    Quiet,
    Check,
}

/// The simulated world of one run.
pub struct World {
    /// The run's fault mix.
    pub mix: FaultMix,
    canary: Canary,
    rng: Rng,
    /// Current global time.
    pub now: Time,
    seq: u64,
    queue: BTreeMap<(Time, u64), Ev>,
    procs: Vec<Proc>,
    life: Vec<Life>,
    net: Net,
    streams: BTreeMap<StreamId, (Addr, Addr)>,
    /// The checks and the oracle.
    pub checks: Checks,
    ids: u64,
    healing: bool,
    heal_at: Time,
    /// When the system converged, counted from the start of healing.
    pub converged_after: Option<Time>,
    /// The trace hash.
    pub hash: TraceHash,
    /// Events processed.
    pub events: u64,
    curators: Vec<Addr>,
    out: Vec<(Addr, Addr, Msg)>,
    wakes: Vec<(Addr, Time)>,
    /// Per process, the earliest wake-up scheduled and not yet fired
    /// (one timer per process: a woken process asks again for what it
    /// still needs, so later requests are subsumed).
    next_wake: Vec<Option<Time>>,
    /// Per process, messages held back while it is paused, in arrival
    /// order (delivered in that order when it resumes).
    held: Vec<VecDeque<(Addr, Msg)>>,
    partitions: u64,
    crashes: u64,
    pauses: u64,
}

/// The context of process `me` (clock offset `offset`) over the world's
/// shared parts. A macro rather than a method, so that the borrow covers
/// only those fields and `procs` can be borrowed beside it.
macro_rules! ctx {
    ($world:expr, $offset:expr, $me:expr) => {
        Ctx {
            now: $world.now,
            offset: $offset,
            me: $me,
            rng: &mut $world.rng,
            out: &mut $world.out,
            wakes: &mut $world.wakes,
            checks: &mut $world.checks,
            ids: &mut $world.ids,
            canary: $world.canary,
            healing: $world.healing,
        }
    };
}

impl World {
    /// Builds the world of `seed`.
    pub fn new(seed: u64, canary: Canary) -> World {
        let mut rng = Rng::new(seed);
        let mix = FaultMix::draw(&mut rng);
        let n = mix.curators;
        let curators: Vec<Addr> = (1..=n).collect();
        let mut procs = vec![Proc::Store(StoreNode::new())];
        for i in 0..n {
            procs.push(Proc::Curator(i, None));
        }
        for _ in 0..n {
            procs.push(Proc::Trace(TraceDriver::new()));
        }
        for _ in 0..mix.watchers {
            procs.push(Proc::Watcher(Watcher::new(curators.clone(), 0)));
        }
        for _ in 0..mix.writers {
            procs.push(Proc::Writer(Writer::new(curators.clone())));
        }
        let machines: Vec<String> = (0..mix.agents).map(machine_id).collect();
        procs.push(Proc::Operator(Operator::new(curators.clone(), machines)));
        for i in 0..mix.agents {
            procs.push(Proc::Agent(i, None, Disk::default()));
        }
        let life: Vec<Life> = procs.iter().map(|_| Life::default()).collect();
        let processes = life.len();
        let heal_at = mix.chaos_secs * SEC;
        let mut w = World {
            net: Net::new(mix.clone()),
            mix,
            canary,
            rng,
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            procs,
            life,
            streams: BTreeMap::new(),
            checks: Checks::default(),
            ids: 0,
            healing: false,
            heal_at,
            converged_after: None,
            hash: TraceHash::default(),
            events: 0,
            curators,
            out: Vec::new(),
            wakes: Vec::new(),
            next_wake: Vec::new(),
            held: Vec::new(),
            partitions: 0,
            crashes: 0,
            pauses: 0,
        };
        w.next_wake = vec![None; processes];
        w.held = (0..processes).map(|_| VecDeque::new()).collect();
        // Registered machines (an operator action before the run).
        for i in 0..w.mix.agents {
            let machine = machine_id(i);
            let record = MachineRecord::new(machine.clone(), [i as u8; 32]);
            let value = Bytes::from(record.encode());
            w.with_store(|store, ctx| store.put(ctx, format!("{MACHINES}{machine}"), value));
        }
        for addr in 0..w.procs.len() {
            w.schedule(0, Ev::Restart { to: addr });
        }
        w.schedule(FAULT_TICK, Ev::FaultTick);
        w.schedule(heal_at, Ev::Heal);
        w
    }

    fn schedule(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    fn with_store(&mut self, f: impl FnOnce(&mut StoreNode, &mut Ctx<'_>)) {
        let Proc::Store(store) = &mut self.procs[0] else {
            unreachable!("process 0 is the store")
        };
        let mut ctx = ctx!(self, 0, 0);
        f(store, &mut ctx);
        self.flush();
    }

    /// Runs until convergence after healing, a violation, or the bound.
    pub fn run(&mut self) {
        let end = self.heal_at + LIVENESS_BOUND_SECS * SEC;
        while let Some(((at, seq), ev)) = self.queue.pop_first() {
            if at > end {
                break;
            }
            self.now = at;
            self.checks.now = at;
            self.events += 1;
            self.hash.u64(at);
            self.hash.u64(seq);
            self.dispatch(ev);
            if self.events >= MAX_EVENTS {
                self.checks.fail(format!(
                    "event budget of {MAX_EVENTS} exhausted (a livelock?): {}",
                    self.summary()
                ));
            }
            if self.checks.failed() || self.converged_after.is_some() {
                return;
            }
        }
        if self.converged_after.is_none() && !self.checks.failed() {
            let problem = self
                .liveness_problem()
                .unwrap_or_else(|| "never checked".to_string());
            self.now = end;
            self.checks.now = end;
            self.checks.fail(format!(
                "liveness: not converged {LIVENESS_BOUND_SECS} s after the faults stopped: {problem}"
            ));
        }
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { from, to, msg } => {
                self.hash.u64(1);
                self.hash.u64(from as u64);
                self.hash.u64(to as u64);
                self.hash.u64(msg.kind());
                self.hash.u64(msg.id());
                if self.life[to].down {
                    // Connection refused: a stream to a dead process breaks.
                    if let Some(stream) = msg.stream() {
                        self.break_stream(stream);
                    }
                    return;
                }
                if self.life[to].paused_until > self.now || !self.held[to].is_empty() {
                    // Held back in arrival order until the pause ends.
                    self.held[to].push_back((from, *msg));
                    if self.held[to].len() == 1 {
                        let at = self.life[to].paused_until.max(self.now);
                        self.schedule(at, Ev::Resume { to });
                    }
                    return;
                }
                self.handle(to, Some((from, *msg)));
            }
            Ev::Wake { to } => {
                self.hash.u64(2);
                self.hash.u64(to as u64);
                if self.life[to].down || self.next_wake[to] != Some(self.now) {
                    return;
                }
                self.next_wake[to] = None;
                if self.life[to].paused_until > self.now {
                    let at = self.life[to].paused_until;
                    self.next_wake[to] = Some(at);
                    return self.schedule(at, Ev::Wake { to });
                }
                self.handle(to, None);
            }
            Ev::Restart { to } => {
                self.hash.u64(3);
                self.hash.u64(to as u64);
                // The first start, or a restart after a crash (the healing
                // phase may have restarted it already).
                if self.life[to].down || self.life[to].incarnation == 0 {
                    self.restart(to);
                }
            }
            Ev::Resume { to } => {
                self.hash.u64(9);
                self.hash.u64(to as u64);
                if self.life[to].paused_until > self.now {
                    let at = self.life[to].paused_until;
                    return self.schedule(at, Ev::Resume { to });
                }
                while let Some((from, msg)) = self.held[to].pop_front() {
                    if self.life[to].down {
                        if let Some(stream) = msg.stream() {
                            self.break_stream(stream);
                        }
                        continue;
                    }
                    self.handle(to, Some((from, msg)));
                    if self.checks.failed() {
                        return;
                    }
                }
            }
            Ev::FaultTick => {
                self.hash.u64(4);
                if !self.healing {
                    self.faults();
                    self.schedule(self.now + FAULT_TICK, Ev::FaultTick);
                }
            }
            Ev::HealPartition => {
                self.hash.u64(5);
                self.net.heal();
            }
            Ev::Heal => {
                self.hash.u64(6);
                self.heal();
            }
            Ev::Quiet => {
                self.hash.u64(7);
                for p in &mut self.procs {
                    if let Proc::Writer(w) = p {
                        w.active = false;
                    }
                }
                self.schedule(self.now + SEC, Ev::Check);
            }
            Ev::Check => {
                self.hash.u64(8);
                match self.liveness_problem() {
                    None => self.converged_after = Some(self.now - self.heal_at),
                    Some(_) => self.schedule(self.now + SEC / 4, Ev::Check),
                }
            }
        }
    }

    /// Lets process `to` handle a message (or its timer).
    fn handle(&mut self, to: Addr, msg: Option<(Addr, Msg)>) {
        let life = &self.life[to];
        let mut ctx = ctx!(self, life.offset, to);
        let install_fail = self.mix.install_fail;
        let tracefs_fail = self.mix.tracefs_fail;
        match (&mut self.procs[to], msg) {
            (Proc::Store(s), Some((from, msg))) => s.handle(&mut ctx, from, msg),
            (Proc::Store(s), None) => s.tick(&mut ctx),
            (Proc::Curator(_, Some(c)), Some((from, msg))) => c.handle(&mut ctx, from, msg),
            (Proc::Curator(_, Some(c)), None) => c.tick(&mut ctx),
            (Proc::Trace(t), None) => t.tick(&mut ctx, tracefs_fail),
            (Proc::Watcher(w), Some((_, msg))) => w.handle(&mut ctx, msg),
            (Proc::Watcher(w), None) => w.tick(&mut ctx),
            (Proc::Writer(w), Some((_, msg))) => w.handle(&mut ctx, msg),
            (Proc::Writer(w), None) => w.tick(&mut ctx),
            (Proc::Operator(o), Some((_, msg))) => o.handle(&mut ctx, msg),
            (Proc::Operator(o), None) => o.tick(&mut ctx),
            (Proc::Agent(_, Some(a), disk), Some((_, msg))) => {
                a.handle(&mut ctx, msg, disk, install_fail)
            }
            (Proc::Agent(_, Some(a), disk), None) => a.tick(&mut ctx, disk, install_fail),
            _ => {}
        }
        self.flush();
        self.check_leaders();
    }

    /// Sends the outbox through the network and schedules the wake-ups.
    fn flush(&mut self) {
        let out = std::mem::take(&mut self.out);
        for (from, to, msg) in out {
            let mut closing = false;
            if let Some(stream) = msg.stream() {
                match &msg {
                    Msg::WatchStart { .. } | Msg::WatchOpen { .. } => {
                        self.streams.insert(stream, (from, to));
                    }
                    // A connection that broke (or closed) carries nothing
                    // more: no later message may arrive after a lost one.
                    _ if !self.streams.contains_key(&stream) => continue,
                    Msg::WatchEnd { .. }
                    | Msg::WatchClose { .. }
                    | Msg::WatchCancel { .. }
                    | Msg::WatchBatch { batch: Err(_), .. } => closing = true,
                    _ => {}
                }
            }
            match self.net.send(&mut self.rng, self.now, from, to, &msg) {
                Fate::Deliver(times) => {
                    if closing && let Some(stream) = msg.stream() {
                        self.streams.remove(&stream);
                        self.net.forget_stream(stream);
                    }
                    for at in times {
                        self.schedule(
                            at,
                            Ev::Deliver {
                                from,
                                to,
                                msg: Box::new(msg.clone()),
                            },
                        );
                    }
                }
                Fate::Lost => {}
                Fate::Break(stream) => self.break_stream(stream),
            }
        }
        let wakes = std::mem::take(&mut self.wakes);
        for (to, at) in wakes {
            let at = at.max(self.now);
            if self.next_wake[to].is_none_or(|t| at < t) {
                self.next_wake[to] = Some(at);
                self.schedule(at, Ev::Wake { to });
            }
        }
    }

    /// A stream's connection broke: both ends learn it after a while.
    fn break_stream(&mut self, stream: StreamId) {
        if let Some((a, b)) = self.streams.remove(&stream) {
            self.net.forget_stream(stream);
            let at = self.now + RESET_AFTER;
            self.schedule(
                at,
                Ev::Deliver {
                    from: b,
                    to: a,
                    msg: Box::new(Msg::Reset { stream }),
                },
            );
            self.schedule(
                at,
                Ev::Deliver {
                    from: a,
                    to: b,
                    msg: Box::new(Msg::Reset { stream }),
                },
            );
        }
    }

    /// (Re)starts process `to` (also its first start).
    fn restart(&mut self, to: Addr) {
        let life = &mut self.life[to];
        life.down = false;
        life.paused_until = 0;
        life.incarnation += 1;
        self.next_wake[to] = None;
        let incarnation = life.incarnation;
        let mut ctx = ctx!(self, life.offset, to);
        match &mut self.procs[to] {
            Proc::Curator(i, c) => {
                *c = Some(Box::new(Curator::new(
                    &mut ctx,
                    *i,
                    incarnation,
                    0,
                    self.curators.clone(),
                )))
            }
            Proc::Agent(i, a, disk) => {
                let agent = Agent::new(&mut ctx, machine_id(*i), self.curators.clone(), disk);
                *a = Some(Box::new(agent));
                ctx.wakes.push((to, self.now));
            }
            _ => ctx.wakes.push((to, self.now)),
        }
        self.flush();
    }

    /// Crashes process `to`: its streams break, it restarts later.
    fn crash(&mut self, to: Addr) {
        self.crashes += 1;
        self.life[to].down = true;
        self.held[to].clear();
        match &mut self.procs[to] {
            Proc::Curator(_, c) => *c = None,
            Proc::Agent(_, a, _) => *a = None,
            _ => {}
        }
        let broken: Vec<StreamId> = self
            .streams
            .iter()
            .filter(|(_, (a, b))| *a == to || *b == to)
            .map(|(s, _)| *s)
            .collect();
        for stream in broken {
            self.break_stream(stream);
        }
        let at = self.now + self.rng.range(200_000, 4_000_000);
        self.schedule(at, Ev::Restart { to });
    }

    /// The processes that crash, pause and jump: curators and agents.
    fn victims(&self) -> Vec<Addr> {
        (0..self.procs.len())
            .filter(|a| matches!(self.procs[*a], Proc::Curator(..) | Proc::Agent(..)))
            .filter(|a| !self.life[*a].down)
            .collect()
    }

    /// One fault tick of the fault phase.
    fn faults(&mut self) {
        let dt = FAULT_TICK;
        let mix = self.mix.clone();
        if self.rng.per_second(mix.partitions, dt) {
            self.partitions += 1;
            // Cut a random side off: the store and curators, sometimes
            // clients too.
            let all: Vec<Addr> = (0..self.procs.len()).collect();
            let side: BTreeSet<Addr> = all
                .iter()
                .copied()
                .filter(|a| {
                    let server = *a == 0 || self.curators.contains(a);
                    (server || self.rng.chance(0.2)) && self.rng.chance(0.4)
                })
                .collect();
            let one_way = mix.asymmetric && self.rng.chance(0.5);
            let forward = self.rng.chance(0.5);
            for &a in &side {
                for &b in &all {
                    if side.contains(&b) {
                        continue;
                    }
                    if !one_way || forward {
                        self.net.block(a, b);
                    }
                    if !one_way || !forward {
                        self.net.block(b, a);
                    }
                }
            }
            let at = self.now + self.rng.range(300_000, 6_000_000);
            self.schedule(at, Ev::HealPartition);
        }
        let victims = self.victims();
        if !victims.is_empty() && self.rng.per_second(mix.crashes, dt) {
            let v = victims[self.rng.index(victims.len())];
            self.crash(v);
        }
        if !victims.is_empty() && self.rng.per_second(mix.pauses, dt) {
            self.pauses += 1;
            let v = victims[self.rng.index(victims.len())];
            let until = self.now + self.rng.range(200_000, 6_000_000);
            self.life[v].paused_until = self.life[v].paused_until.max(until);
        }
        if !victims.is_empty() && self.rng.per_second(mix.clock_jumps, dt) {
            let v = victims[self.rng.index(victims.len())];
            self.life[v].offset += self.rng.range(100_000, 5_000_000);
        }
        if self.rng.per_second(mix.compactions, dt) {
            self.with_store(|s, ctx| s.compact(ctx));
        }
        if self.rng.per_second(mix.key_deletes, dt) {
            self.with_store(|s, ctx| s.delete_leader_key(ctx));
        }
    }

    /// The faults stop: partitions heal, crashed processes restart; traces and the operator wind down.
    fn heal(&mut self) {
        self.healing = true;
        self.net.set_mix(self.mix.healed());
        self.net.heal();
        for a in 0..self.procs.len() {
            // Paused processes resume when their pause ends (at most 6 s):
            // cutting it short would deliver new messages before the ones
            // held back for them.
            if self.life[a].down {
                self.restart(a);
            }
            match &mut self.procs[a] {
                Proc::Trace(t) => t.active = false,
                Proc::Operator(o) => o.active = false,
                _ => {}
            }
        }
        self.schedule(self.now + QUIET_AFTER_SECS * SEC, Ev::Quiet);
    }

    /// Safety after every step: at most one effective leader (an instance
    /// that believes it leads with the key the store shows as leader).
    fn check_leaders(&mut self) {
        let Proc::Store(store) = &self.procs[0] else {
            return;
        };
        let leader = store_leader(&store.store);
        let effective: Vec<usize> = self
            .procs
            .iter()
            .filter_map(|p| match p {
                Proc::Curator(i, Some(c))
                    if c.leader_key().is_some() && c.leader_key() == leader.as_ref() =>
                {
                    Some(*i)
                }
                _ => None,
            })
            .collect();
        if effective.len() > 1 {
            self.checks.fail(format!(
                "{} effective leaders at once: {effective:?}",
                effective.len()
            ));
        }
    }

    /// What keeps the system from having converged, if anything.
    pub fn liveness_problem(&self) -> Option<String> {
        let Proc::Store(store) = &self.procs[0] else {
            return Some("no store".into());
        };
        let leader = store_leader(&store.store);
        let mut leaders = Vec::new();
        for p in &self.procs {
            if let Proc::Curator(i, Some(c)) = p
                && matches!(c.m.role(), Role::Leader(_))
            {
                leaders.push(*i);
            }
        }
        if leaders.len() != 1 {
            let roles: Vec<String> = self
                .procs
                .iter()
                .filter_map(|p| match p {
                    Proc::Curator(i, Some(c)) => Some(format!("{i}: {}", c.describe())),
                    _ => None,
                })
                .collect();
            return Some(format!(
                "leaders: {leaders:?}; store leader {leader:?}; {roles:?}"
            ));
        }
        for p in &self.procs {
            if let Proc::Curator(i, c) = p {
                let Some(c) = c else {
                    return Some(format!("curator {i} down"));
                };
                match c.m.role() {
                    Role::Leader(l) if Some(&l.key) == leader.as_ref() => {}
                    Role::Follower(f) if Some(&f.key) == leader.as_ref() => {}
                    _ => return Some(format!("curator {i} is {}", c.describe())),
                }
                if c.m.waiting() > 0 {
                    return Some(format!("curator {i} has waiting requests"));
                }
            }
        }
        let nodes: BTreeMap<String, Bytes> = store
            .store
            .range(&KeyRange::Prefix(Bytes::from_static(NODES.as_bytes())))
            .into_iter()
            .filter_map(|kv| {
                let id = std::str::from_utf8(&kv.key)
                    .ok()?
                    .strip_prefix(NODES)?
                    .to_string();
                Some((id, kv.value))
            })
            .collect();
        for (a, p) in self.procs.iter().enumerate() {
            match p {
                Proc::Watcher(w) => {
                    if w.stream.is_none() || !w.live {
                        return Some(format!("watcher {a} has no live stream"));
                    }
                    if w.view != nodes {
                        let caches: Vec<String> = self
                            .procs
                            .iter()
                            .filter_map(|p| match p {
                                Proc::Curator(i, Some(c)) => Some(format!("{i}: {}", c.describe())),
                                _ => None,
                            })
                            .collect();
                        return Some(format!(
                            "watcher {a}'s view differs from the store (stream {:?}, store at {}, {} nodes vs {} in the view); curators: {caches:?}",
                            w.stream,
                            store.store.revision(),
                            nodes.len(),
                            w.view.len()
                        ));
                    }
                }
                Proc::Writer(w) if w.outstanding() > 0 => {
                    return Some(format!("writer {a} has calls outstanding"));
                }
                Proc::Trace(t) if !t.idle() => {
                    return Some(format!("trace driver {a} has sessions running"));
                }
                Proc::Agent(i, a, _) => {
                    let machine = machine_id(*i);
                    let Some(a) = a else {
                        return Some(format!("agent {machine} down"));
                    };
                    let Some(kv) = store.store.get(format!("{MACHINES}{machine}").as_bytes())
                    else {
                        return Some(format!("machine {machine} missing"));
                    };
                    let Ok(record) = MachineRecord::decode(&kv.value) else {
                        return Some(format!("machine {machine} undecodable"));
                    };
                    if let Some(g) = record.current_generation()
                        && !record.reports.contains_key(&g)
                    {
                        return Some(format!(
                            "machine {machine}: generation {g} unanswered (agent installing {:?}, \
                             report {:?})",
                            a.agent.installing(),
                            a.agent.pending_report()
                        ));
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// A summary of what happened (for --verbose).
    pub fn summary(&self) -> String {
        let mut installs = 0;
        let mut traces = 0;
        let mut calls = [0u64; 4];
        let mut watch_events = 0;
        for p in &self.procs {
            match p {
                Proc::Agent(_, Some(a), _) => installs += a.installs,
                Proc::Trace(t) => traces += t.finished,
                Proc::Writer(w) => {
                    for (i, n) in w.outcomes.iter().enumerate() {
                        calls[i] += n;
                    }
                }
                Proc::Watcher(w) => watch_events += w.events,
                _ => {}
            }
        }
        format!(
            "messages delivered/dropped/duplicated={:?} partitions={} crashes={} pauses={} \
             fenced writes committed/refused={:?} calls ok/retryable/other/deadline={calls:?} \
             watch events={watch_events} installs(live agents)={installs} trace sessions={traces}",
            self.net.stats, self.partitions, self.crashes, self.pauses, self.checks.writes
        )
    }

    /// The duration `d` in microseconds.
    pub fn micros(d: Duration) -> Time {
        d.as_micros() as Time
    }
}
