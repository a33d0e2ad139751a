//! Property test of three instances over the store model standing in for
//! etcd: each [`Leadership`] driven by a simulated election port (lease
//! grant and keep-alive, campaign as "the oldest key under the prefix",
//! observation of the current leader) whose reports arrive late or not at
//! all, nodes that pause (no input for a while), crash and restart (their
//! lease and key live on until the TTL), abandoned leases whose revocation
//! is lost, leader keys deleted by hand, and leader writes that reach the
//! store late, after their author lost the lease or its key. Checked:
//! - every instance keeps the contract ([`Checker`]) throughout;
//! - safety: a fenced write commits only while its author's election key
//!   is the leader key in the store, whatever its author believes by then;
//!   a refused write is reported and ends in "lost leadership" when its
//!   author still believed it led;
//! - liveness: once reports flow again, within a bounded time one instance
//!   leads, the store's leader key is its key, every other instance
//!   follows it (forwarding to its address), and no request waits.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::sample::Index;

use super::checker::Checker;
use crate::leadership::*;
use crate::store::{KeyRange, LeaseId, MemStore, Op, StoreError, Txn};
use crate::time::Instant;

const NODES: usize = 3;
const TTL: Duration = Duration::from_secs(2);
const PREFIX: &[u8] = b"election/";

/// Which node a request or write goes to.
#[derive(Clone, Copy, Debug)]
enum Target {
    Node(usize),
    /// A node that believes it leads (where the traffic ends up), if any;
    /// else node 0.
    Leader,
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![(0..NODES).prop_map(Target::Node), Just(Target::Leader)]
}

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Tick(usize),
    Campaign(usize),
    /// A keep-alive answered at once.
    KeepAlive(usize),
    /// A keep-alive sent (its answer comes with `KeepAliveDeliver`).
    KeepAliveSend(usize),
    KeepAliveDeliver(usize),
    Observe {
        node: usize,
        deletion_first: bool,
    },
    Request(Target, Option<u64>),
    /// A write is sent (it lands with a later `Commit`).
    Write(Target, Index),
    /// A write is sent and lands at once.
    WriteNow(Target, Index),
    Commit(Index),
    Finish(usize, Index),
    Restart(usize),
    /// An operator deletes the leader's key by hand: its holder still
    /// believes it leads (its lease is alive).
    DeleteLeaderKey,
}

fn step() -> impl Strategy<Value = Step> {
    let node = 0..NODES;
    prop_oneof![
        // Mostly short steps; now and then a pause past the TTL.
        4 => prop_oneof![6 => 0u64..300, 1 => 0u64..3_000].prop_map(Step::Advance),
        3 => node.clone().prop_map(Step::Tick),
        9 => node.clone().prop_map(Step::Campaign),
        4 => node.clone().prop_map(Step::KeepAlive),
        2 => node.clone().prop_map(Step::KeepAliveSend),
        2 => node.clone().prop_map(Step::KeepAliveDeliver),
        4 => (node.clone(), any::<bool>())
            .prop_map(|(node, deletion_first)| Step::Observe { node, deletion_first }),
        4 => (target(), prop::option::of(0u64..6_000)).prop_map(|(t, d)| Step::Request(t, d)),
        3 => (target(), any::<Index>()).prop_map(|(t, i)| Step::Write(t, i)),
        4 => (target(), any::<Index>()).prop_map(|(t, i)| Step::WriteNow(t, i)),
        1 => any::<Index>().prop_map(Step::Commit),
        2 => (node.clone(), any::<Index>()).prop_map(|(n, i)| Step::Finish(n, i)),
        1 => node.prop_map(Step::Restart),
        1 => Just(Step::DeleteLeaderKey),
    ]
}

/// The election port of one instance: its campaign as far as it got.
#[derive(Debug, Default)]
struct Port {
    campaign: Option<(CampaignId, Bytes)>,
    lease: Option<LeaseId>,
    key: Option<ElectionKey>,
    won_reported: bool,
    /// A keep-alive sent at this instant, with the store's answer.
    keep_alive: Option<(Instant, Result<Duration, StoreError>)>,
    /// The leader key last reported to the machine.
    observed: Option<ElectionKey>,
}

#[derive(Debug)]
struct Node {
    m: Leadership,
    c: Checker,
    port: Port,
    requests: Vec<RequestId>,
}

impl Node {
    fn start(i: usize, max_wait: Duration, now: Instant) -> Node {
        let config = LeadershipConfig {
            lease_ttl: TTL,
            max_wait,
            ..LeadershipConfig::new(format!("node-{i}"), format!("10.0.0.{i}:7835"))
        };
        let mut m = Leadership::new(config, now).unwrap();
        let c = Checker::new(&mut m, max_wait, now);
        Node {
            m,
            c,
            port: Port::default(),
            requests: Vec::new(),
        }
    }
}

/// A write sent to the store, not yet applied.
#[derive(Debug)]
struct InFlight {
    node: usize,
    /// Of the instance that sent it; a restarted node's old writes still
    /// land, but nobody hears back.
    incarnation: u32,
    request: RequestId,
    fence: Fence,
    txn: Txn,
}

struct Sim {
    store: MemStore,
    now: Instant,
    max_wait: Duration,
    revocations_work: bool,
    nodes: Vec<Node>,
    incarnations: Vec<u32>,
    in_flight: Vec<InFlight>,
    writes: u64,
    /// Writes committed and refused (for the generator canary).
    committed: u64,
    refused: u64,
    /// Refused writes whose author still believed it led.
    lost: u64,
}

/// The leader in the store: the oldest key under the election prefix.
fn store_leader(store: &MemStore) -> Option<ElectionKey> {
    store
        .range(&KeyRange::Prefix(Bytes::from_static(PREFIX)))
        .into_iter()
        .min_by_key(|kv| kv.create_revision)
        .map(|kv| ElectionKey {
            key: kv.key,
            create_revision: kv.create_revision,
        })
}

fn exists(store: &MemStore, key: &ElectionKey) -> bool {
    store
        .get(&key.key)
        .is_some_and(|kv| kv.create_revision == key.create_revision)
}

impl Sim {
    fn new(max_wait: Duration, revocations_work: bool) -> Sim {
        let now = Instant::ZERO;
        Sim {
            store: MemStore::new(),
            now,
            max_wait,
            revocations_work,
            nodes: (0..NODES).map(|i| Node::start(i, max_wait, now)).collect(),
            incarnations: vec![0; NODES],
            in_flight: Vec::new(),
            writes: 0,
            committed: 0,
            refused: 0,
            lost: 0,
        }
    }

    /// Checks node `i`'s outputs after an input and carries out its
    /// actions.
    fn settle(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        node.c.drain(&mut node.m, now);
        self.carry_out(i);
    }

    fn carry_out(&mut self, i: usize) {
        let actions = self.nodes[i].c.take_actions();
        for action in actions {
            let port = &mut self.nodes[i].port;
            match action {
                Action::Campaign {
                    campaign,
                    ttl,
                    value,
                } => {
                    assert_eq!(ttl, TTL);
                    let observed = port.observed.take();
                    *port = Port {
                        campaign: Some((campaign, value)),
                        observed,
                        ..Port::default()
                    };
                }
                Action::Abandon { campaign, lease } => {
                    if port.campaign.as_ref().map(|c| c.0) == Some(campaign) {
                        let observed = port.observed.take();
                        *port = Port {
                            observed,
                            ..Port::default()
                        };
                    }
                    if let Some(lease) = lease
                        && self.revocations_work
                    {
                        let _ = self.store.lease_revoke(lease);
                    }
                }
            }
        }
    }

    fn step(&mut self, step: &Step) {
        let now = self.now;
        match step {
            Step::Advance(ms) => {
                self.now = now + Duration::from_millis(*ms);
                self.store.handle_timeout(self.now);
            }
            Step::Tick(i) => {
                self.nodes[*i].m.handle_timeout(now);
                self.settle(*i);
            }
            Step::Campaign(i) => self.campaign(*i),
            Step::KeepAlive(i) => {
                self.step(&Step::KeepAliveSend(*i));
                self.step(&Step::KeepAliveDeliver(*i));
            }
            Step::KeepAliveSend(i) => {
                let port = &mut self.nodes[*i].port;
                if let Some(lease) = port.lease {
                    port.keep_alive = Some((now, self.store.lease_keep_alive(lease, now)));
                }
            }
            Step::KeepAliveDeliver(i) => {
                let node = &mut self.nodes[*i];
                let (Some((campaign, _)), Some(lease), Some((sent_at, answer))) = (
                    node.port.campaign.clone(),
                    node.port.lease,
                    node.port.keep_alive.take(),
                ) else {
                    return;
                };
                match answer {
                    Ok(ttl) => {
                        let grant = LeaseGrant {
                            campaign,
                            lease,
                            ttl,
                            sent_at,
                        };
                        node.c.granting(&grant);
                        node.m.handle_lease_granted(now, grant);
                    }
                    Err(_) => node.m.handle_lease_lost(now, campaign),
                }
                self.settle(*i);
            }
            Step::Observe {
                node: i,
                deletion_first,
            } => {
                let leader = store_leader(&self.store);
                let node = &mut self.nodes[*i];
                if leader == node.port.observed {
                    return;
                }
                if let Some(old) = node.port.observed.clone()
                    && !exists(&self.store, &old)
                    && (*deletion_first || leader.is_none())
                {
                    node.m.handle_leader_deleted(now, &old);
                    node.port.observed = None;
                }
                if let Some(key) = leader {
                    let value = self.store.get(&key.key).map(|kv| kv.value.clone());
                    node.m
                        .handle_leader_observed(now, key.clone(), &value.unwrap_or_default());
                    node.port.observed = Some(key);
                }
                self.settle(*i);
            }
            Step::Request(t, deadline) => {
                let i = &self.target(*t);
                let deadline = deadline.map(|ms| now + Duration::from_millis(ms));
                let node = &mut self.nodes[*i];
                let id = node.m.handle_request(now, deadline);
                node.requests.push(id);
                node.c.arrived(&mut node.m, now, id, deadline);
                self.carry_out(*i);
            }
            Step::Write(t, pick) => {
                let i = &self.target(*t);
                let node = &mut self.nodes[*i];
                let recent = &node.requests[node.requests.len().saturating_sub(4)..];
                if recent.is_empty() {
                    return;
                }
                let request = *pick.get(recent);
                let fence = node.m.write_fence(now, request);
                node.c.fenced(&mut node.m, now, request, &fence);
                if let Ok(fence) = fence {
                    self.writes += 1;
                    let txn = fence.guard(Txn {
                        success: vec![Op::Put {
                            key: Bytes::from(format!("nodes/{}", self.writes)),
                            value: Bytes::from_static(b"status"),
                            lease: 0,
                        }],
                        ..Default::default()
                    });
                    self.in_flight.push(InFlight {
                        node: *i,
                        incarnation: self.incarnations[*i],
                        request,
                        fence,
                        txn,
                    });
                }
                self.carry_out(*i);
            }
            Step::WriteNow(t, pick) => {
                let sent = self.in_flight.len();
                self.step(&Step::Write(*t, *pick));
                if self.in_flight.len() > sent {
                    let w = self.in_flight.remove(sent);
                    self.commit(w);
                }
            }
            Step::Commit(pick) => {
                if !self.in_flight.is_empty() {
                    let w = self.in_flight.remove(pick.index(self.in_flight.len()));
                    self.commit(w);
                }
            }
            Step::Finish(i, pick) => {
                let node = &mut self.nodes[*i];
                if !node.requests.is_empty() {
                    let id = *pick.get(&node.requests);
                    node.m.handle_request_finished(now, id);
                    node.c.finished(&mut node.m, now, id);
                    self.carry_out(*i);
                }
            }
            Step::DeleteLeaderKey => {
                if let Some(leader) = store_leader(&self.store) {
                    let delete = Txn {
                        success: vec![Op::Delete(KeyRange::Key(leader.key))],
                        ..Default::default()
                    };
                    self.store.txn(&delete).unwrap();
                }
            }
            Step::Restart(i) => {
                // Crash: nothing is heard of the old instance again; its
                // lease (and key) lives on in the store until the TTL.
                self.incarnations[*i] += 1;
                self.nodes[*i] = Node::start(*i, self.max_wait, now);
                self.carry_out(*i);
            }
        }
    }

    fn target(&self, t: Target) -> usize {
        match t {
            Target::Node(i) => i,
            Target::Leader => (0..NODES)
                .rev()
                .find(|i| matches!(self.nodes[*i].m.role(), Role::Leader(_)))
                .unwrap_or(0),
        }
    }

    /// The port's next move in the campaign: grant, then create the key,
    /// then report the win once the key is the oldest.
    fn campaign(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        let Some((campaign, value)) = node.port.campaign.clone() else {
            return;
        };
        match (node.port.lease, &node.port.key) {
            (None, _) => {
                let lease = self.store.lease_grant(0, TTL, now).unwrap();
                node.port.lease = Some(lease);
                let grant = LeaseGrant {
                    campaign,
                    lease,
                    ttl: TTL,
                    sent_at: now,
                };
                node.c.granting(&grant);
                node.m.handle_lease_granted(now, grant);
            }
            (Some(lease), None) => {
                let key = Bytes::from(format!("election/{lease:016x}"));
                let put = Txn {
                    success: vec![Op::Put {
                        key: key.clone(),
                        value,
                        lease,
                    }],
                    ..Default::default()
                };
                match self.store.txn(&put) {
                    Ok(response) => {
                        node.port.key = Some(ElectionKey {
                            key,
                            create_revision: response.revision,
                        });
                        return;
                    }
                    Err(_) => node.m.handle_lease_lost(now, campaign),
                }
            }
            (Some(_), Some(key)) => {
                if !exists(&self.store, key) {
                    // Deleted while the lease lives: this campaign cannot
                    // win any more.
                    node.m.handle_lease_lost(now, campaign);
                } else if node.port.won_reported || store_leader(&self.store).as_ref() != Some(key)
                {
                    return;
                } else {
                    node.port.won_reported = true;
                    node.m.handle_campaign_won(now, campaign, key.clone());
                }
            }
        }
        self.settle(i);
    }

    /// A write reaches the store: it commits only if its author's key
    /// leads there and then.
    fn commit(&mut self, w: InFlight) {
        let leader = store_leader(&self.store);
        let response = self.store.txn(&w.txn).unwrap();
        let check = w.fence.check(&response);
        assert_eq!(response.succeeded, check == FenceCheck::Held);
        if response.succeeded {
            self.committed += 1;
            assert_eq!(
                leader.as_ref(),
                w.fence.key(),
                "a write fenced by {:?} committed while {leader:?} leads",
                w.fence.key()
            );
            return;
        }
        self.refused += 1;
        if w.incarnation == self.incarnations[w.node] {
            let node = &mut self.nodes[w.node];
            if matches!(node.m.role(), Role::Leader(_)) && node.c.is_served(w.request) {
                self.lost += 1;
            }
            node.c.fence_failing(w.request);
            node.m.handle_fence_failed(self.now, w.request);
            self.settle(w.node);
        }
    }

    /// Reports flow, keep-alives run, writes land: one instance must end
    /// up leading and every other following it.
    fn heal(&mut self) {
        let rounds = 4 * (TTL.as_millis() as u64 / 250) + 8;
        for _ in 0..rounds {
            while !self.in_flight.is_empty() {
                let w = self.in_flight.remove(0);
                self.commit(w);
            }
            for i in 0..NODES {
                for step in [
                    Step::Tick(i),
                    Step::KeepAliveSend(i),
                    Step::KeepAliveDeliver(i),
                    Step::Campaign(i),
                    Step::Campaign(i),
                    Step::Campaign(i),
                    Step::Observe {
                        node: i,
                        deletion_first: false,
                    },
                ] {
                    self.step(&step);
                }
            }
            self.step(&Step::Advance(250));
        }
        let leaders: Vec<usize> = (0..NODES)
            .filter(|i| matches!(self.nodes[*i].m.role(), Role::Leader(_)))
            .collect();
        assert_eq!(leaders.len(), 1, "leaders after healing: {leaders:?}");
        let l = leaders[0];
        let Role::Leader(leader) = self.nodes[l].m.role().clone() else {
            unreachable!()
        };
        assert_eq!(store_leader(&self.store), Some(leader.key.clone()));
        for (i, node) in self.nodes.iter().enumerate() {
            assert_eq!(node.m.waiting(), 0, "node {i} has waiting requests");
            if i == l {
                continue;
            }
            match node.m.role() {
                Role::Follower(f) => {
                    assert_eq!(f.key, leader.key, "node {i} follows another key");
                    assert_eq!(f.leader.node_id, format!("node-{l}"));
                    assert_eq!(f.leader.curator_address, format!("10.0.0.{l}:7835"));
                }
                other => panic!("node {i} is {other:?} after healing"),
            }
        }
    }

    fn finish(&mut self) {
        for node in &mut self.nodes {
            let requests = node.requests.len();
            node.c.finish(&mut node.m, self.now, requests);
        }
    }
}

fn simulate(max_wait_ms: u64, revocations_work: bool, steps: &[Step]) -> Sim {
    let mut sim = Sim::new(Duration::from_millis(max_wait_ms), revocations_work);
    for i in 0..NODES {
        sim.carry_out(i);
    }
    for step in steps {
        sim.step(step);
    }
    sim.heal();
    sim.finish();
    sim
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random schedules of three instances over one store: the contract
    /// holds on every instance, no stale leader's write commits, and the
    /// cluster converges on one leader once reports flow again.
    #[test]
    fn cluster_is_safe_and_converges(
        max_wait_ms in 0u64..4_000,
        revocations_work in any::<bool>(),
        steps in prop::collection::vec(step(), 1..250),
    ) {
        simulate(max_wait_ms, revocations_work, &steps);
    }
}

/// The schedules reach committed writes, refused writes, and refusals
/// that end a leadership its holder still believed in (a canary against a
/// generator that stops exercising the fence).
#[test]
fn schedules_exercise_the_fence() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let runs = prop::collection::vec(step(), 1..250);
    let (mut committed, mut refused, mut lost) = (0, 0, 0);
    for _ in 0..64 {
        let steps = runs.new_tree(&mut runner).unwrap().current();
        let sim = simulate(2_000, false, &steps);
        committed += u32::from(sim.committed > 0);
        refused += u32::from(sim.refused > 0);
        lost += u32::from(sim.lost > 0);
    }
    assert!(
        committed >= 24 && refused >= 12 && lost >= 5,
        "of 64 schedules: {committed} committed, {refused} refused, {lost} lost leadership"
    );
}
