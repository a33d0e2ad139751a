//! The curator's clients: watchers rebuilding the node registry from a
//! `Watch(NodesInCluster)` stream (and checking every event against the
//! store's history), writers registering, updating and removing nodes,
//! and the operator submitting installation requests.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use metropolis_core::store::Revision;
use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::os_installation_request::Type;
use metropolis_proto::prelude::{common, curator};
use metropolis_proto::wire::EncodedWatchEvent;
use prost::Message;

use crate::ctx::Ctx;
use crate::msg::{Addr, Call, CallError, CallId, CallOk, Msg, StreamId};
use crate::net::Time;

/// How many node IDs the writers share.
pub const NODE_POOL: u64 = 6;
/// The timeout of a client's call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The ID of node `n` of the pool.
pub fn node_id(n: u64) -> String {
    format!("metropolis-{n:032x}")
}

/// A watch client.
#[derive(Debug)]
pub struct Watcher {
    curators: Vec<Addr>,
    /// The open stream and the curator it goes to.
    pub stream: Option<(StreamId, Addr)>,
    /// The node registry as rebuilt from the stream: ID -> encoded.
    pub view: BTreeMap<String, Bytes>,
    /// Per node, the revision of the latest state received.
    last: BTreeMap<String, Revision>,
    /// Whether this stream's `PROGRESS_LAST_BACKLOGGED` arrived.
    pub live: bool,
    consistent: Revision,
    reconnect_at: Option<Time>,
    /// Events received (for the report).
    pub events: u64,
}

impl Watcher {
    /// A watcher that connects at once.
    pub fn new(curators: Vec<Addr>, now: Time) -> Watcher {
        Watcher {
            curators,
            stream: None,
            view: BTreeMap::new(),
            last: BTreeMap::new(),
            live: false,
            consistent: 0,
            reconnect_at: Some(now),
            events: 0,
        }
    }

    fn lost(&mut self, ctx: &mut Ctx<'_>) {
        self.stream = None;
        let at = ctx.now + ctx.rng.range(100_000, 1_000_000);
        self.reconnect_at = Some(at);
        ctx.wakes.push((ctx.me, at));
    }

    /// Timer: reconnects when due; now and then cancels its stream.
    pub fn tick(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(at) = self.reconnect_at
            && ctx.now >= at
        {
            self.reconnect_at = None;
            let to = self.curators[ctx.rng.index(self.curators.len())];
            let stream = ctx.fresh_id();
            self.stream = Some((stream, to));
            self.view.clear();
            self.last.clear();
            self.live = false;
            self.consistent = 0;
            ctx.send(to, Msg::WatchStart { stream, hops: 0 });
        }
        if !ctx.healing
            && let Some((stream, to)) = self.stream
            && ctx.rng.chance(0.01)
        {
            ctx.send(to, Msg::WatchClose { stream });
            self.lost(ctx);
            return;
        }
        ctx.wake_in(Duration::from_millis(500));
    }

    /// Handles one message.
    pub fn handle(&mut self, ctx: &mut Ctx<'_>, msg: Msg) {
        let Some((current, _)) = self.stream else {
            return;
        };
        match msg {
            Msg::WatchEvent {
                stream,
                event,
                consistent_at,
            } if stream == current => {
                self.events += 1;
                self.event(ctx, stream, &event, consistent_at);
            }
            Msg::WatchEnd { stream } | Msg::Reset { stream } if stream == current => self.lost(ctx),
            _ => {}
        }
    }

    fn event(
        &mut self,
        ctx: &mut Ctx<'_>,
        stream: StreamId,
        event: &EncodedWatchEvent,
        consistent_at: Option<Revision>,
    ) {
        let checks = &mut *ctx.checks;
        if self.live && event.is_last_backlogged() {
            checks.fail(format!("stream {stream}: PROGRESS_LAST_BACKLOGGED twice"));
        }
        if !self.live && !event.tombstones.is_empty() {
            checks.fail(format!("stream {stream}: tombstone in the backlog"));
        }
        for encoded in &event.nodes {
            let id = match curator::Node::decode(encoded.as_ref()) {
                Ok(node) => node.id,
                Err(e) => return checks.fail(format!("stream {stream}: undecodable node: {e}")),
            };
            if !checks.committed(encoded) {
                return checks.fail(format!(
                    "stream {stream}: node {id} in a state never committed"
                ));
            }
            let last = self.last.get(&id).copied().unwrap_or(0);
            let Some(revision) = checks.revision_of(encoded, last) else {
                return checks.fail(format!(
                    "stream {stream}: node {id} in a state committed at or before revision {last}, \
                     after a state of revision {last} (out of order or repeated)"
                ));
            };
            self.last.insert(id.clone(), revision);
            self.view.insert(id, encoded.clone());
        }
        for id in &event.tombstones {
            // A node created and deleted between two drains is coalesced
            // to its tombstone ("delete wins over earlier puts"): a
            // tombstone for a node never seen is allowed only then.
            if self.view.remove(id).is_none() && !checks.put_after(id, self.consistent) {
                return checks.fail(format!(
                    "stream {stream}: tombstone for {id}, neither in the view nor created since \
                     revision {}",
                    self.consistent
                ));
            }
        }
        if event.is_last_backlogged() {
            self.live = true;
        }
        if let Some(at) = consistent_at {
            if !self.live {
                return checks.fail(format!(
                    "stream {stream}: a drain ended without PROGRESS_LAST_BACKLOGGED"
                ));
            }
            if at < self.consistent {
                return checks.fail(format!(
                    "stream {stream}: consistency went back from revision {} to {at}",
                    self.consistent
                ));
            }
            self.consistent = at;
            let store = checks.nodes_at(at);
            if store != self.view {
                let missing: Vec<&String> = store
                    .keys()
                    .filter(|k| !self.view.contains_key(*k))
                    .collect();
                let extra: Vec<&String> = self
                    .view
                    .keys()
                    .filter(|k| !store.contains_key(*k))
                    .collect();
                checks.fail(format!(
                    "stream {stream}: view differs from the store at revision {at} (a gap or a \
                     lost tombstone): missing {missing:?}, extra {extra:?}, {} stale",
                    store
                        .iter()
                        .filter(|(k, v)| self.view.get(*k).is_some_and(|w| w != *v))
                        .count()
                ));
            }
        }
    }
}

/// A call awaiting its reply.
#[derive(Clone, Debug)]
struct Outstanding {
    deadline: Time,
    write: bool,
}

/// A client writing node records through the curators.
#[derive(Debug)]
pub struct Writer {
    curators: Vec<Addr>,
    outstanding: BTreeMap<CallId, Outstanding>,
    /// Whether it still starts calls.
    pub active: bool,
    /// Calls by outcome: ok, retryable error, other error, deadline.
    pub outcomes: [u64; 4],
}

impl Writer {
    /// A writer starting at once.
    pub fn new(curators: Vec<Addr>) -> Writer {
        Writer {
            curators,
            outstanding: BTreeMap::new(),
            active: true,
            outcomes: [0; 4],
        }
    }

    /// Calls still awaiting a reply.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Timer: expires deadlines, starts a call now and then.
    pub fn tick(&mut self, ctx: &mut Ctx<'_>) {
        let expired: Vec<CallId> = self
            .outstanding
            .iter()
            .filter(|(_, o)| o.deadline <= ctx.now)
            .map(|(c, _)| *c)
            .collect();
        for call in expired {
            self.outstanding.remove(&call);
            self.outcomes[3] += 1;
        }
        if self.active && self.outstanding.len() < 2 {
            let n = ctx.rng.below(NODE_POOL);
            let id = node_id(n);
            let seq = ctx.fresh_id();
            let encoded = Bytes::from(
                curator::Node {
                    id: id.clone(),
                    roles: None,
                    status: Some(common::NodeStatus {
                        external_address: format!("fd00::{n:x}:{seq:x}"),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
            );
            let body = match ctx.rng.below(10) {
                0..=1 => Call::CreateNode { id, encoded },
                2 => Call::DeleteNode { id },
                _ => Call::UpdateNode { id, encoded },
            };
            let call = ctx.fresh_id();
            let to = self.curators[ctx.rng.index(self.curators.len())];
            self.outstanding.insert(
                call,
                Outstanding {
                    deadline: ctx.now + CALL_TIMEOUT.as_micros() as u64,
                    write: true,
                },
            );
            ctx.send(
                to,
                Msg::Call {
                    call,
                    origin: call,
                    body,
                    timeout: CALL_TIMEOUT,
                    hops: 0,
                },
            );
        }
        let ms = ctx.rng.range(100, 600);
        ctx.wake_in(Duration::from_millis(ms));
    }

    /// Handles one message.
    pub fn handle(&mut self, ctx: &mut Ctx<'_>, msg: Msg) {
        if let Msg::CallReply { call, result } = msg
            && let Some(o) = self.outstanding.remove(&call)
        {
            match result {
                Ok(_) => {
                    self.outcomes[0] += 1;
                    if o.write && !ctx.checks.call_committed(call) {
                        ctx.checks.fail(format!(
                            "call {call} answered OK but its write never committed (lost silently)"
                        ));
                    }
                }
                Err(e) if e.retryable() => self.outcomes[1] += 1,
                Err(_) => self.outcomes[2] += 1,
            }
        }
    }
}

/// The operator: submits installation requests for the machines.
#[derive(Debug)]
pub struct Operator {
    curators: Vec<Addr>,
    machines: Vec<String>,
    /// Whether it still submits.
    pub active: bool,
    outstanding: BTreeMap<CallId, Time>,
    /// Submissions answered OK.
    pub submitted: u64,
}

impl Operator {
    /// An operator for `machines`.
    pub fn new(curators: Vec<Addr>, machines: Vec<String>) -> Operator {
        Operator {
            curators,
            machines,
            active: true,
            outstanding: BTreeMap::new(),
            submitted: 0,
        }
    }

    /// An encoded installation request (unique bytes per call).
    pub fn request(seq: u64) -> Bytes {
        Bytes::from(
            agent::OsInstallationRequest {
                generation: 0,
                r#type: Some(Type::Metropolis(agent::MetropolisInstallationRequest {
                    root_device: format!("/dev/disk{seq}"),
                    ..Default::default()
                })),
            }
            .encode_to_vec(),
        )
    }

    /// Timer: submits a request now and then.
    pub fn tick(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        self.outstanding.retain(|_, deadline| *deadline > now);
        if self.active && !self.machines.is_empty() {
            let machine = self.machines[ctx.rng.index(self.machines.len())].clone();
            let seq = ctx.fresh_id();
            let call = ctx.fresh_id();
            let to = self.curators[ctx.rng.index(self.curators.len())];
            self.outstanding
                .insert(call, now + CALL_TIMEOUT.as_micros() as u64);
            ctx.send(
                to,
                Msg::Call {
                    call,
                    origin: call,
                    body: Call::Submit {
                        machine,
                        request: Operator::request(seq),
                    },
                    timeout: CALL_TIMEOUT,
                    hops: 0,
                },
            );
        }
        let ms = ctx.rng.range(1_000, 5_000);
        ctx.wake_in(Duration::from_millis(ms));
    }

    /// Handles one message.
    pub fn handle(&mut self, ctx: &mut Ctx<'_>, msg: Msg) {
        if let Msg::CallReply { call, result } = msg
            && self.outstanding.remove(&call).is_some()
        {
            if let Ok(CallOk::Done) = result {
                self.submitted += 1;
                if !ctx.checks.call_committed(call) {
                    ctx.checks.fail(format!(
                        "submission {call} answered OK but never committed (lost silently)"
                    ));
                }
            }
            let _ = result.as_ref().err().map(|e: &CallError| e.retryable());
        }
    }
}
