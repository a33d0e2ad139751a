//! A curator instance: a [`Leadership`] machine driven by an election
//! port over the store (lease grant and keep-alive, campaign as "the
//! oldest key under the prefix", observation by polling), the requests of
//! its clients routed by the machine (served as fenced read-modify-write
//! transactions, forwarded to the leader, waiting, rejected), and a
//! [`NodeCache`] following the store's `nodes/` prefix that feeds the
//! [`NodesWatch`] streams it serves (or relays from the leader).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use metropolis_core::leadership::{
    Action, CampaignId, ElectionKey, Event, Fence, FenceCheck, Leadership, LeadershipConfig,
    LeaseGrant, RequestId, Role, Route,
};
use metropolis_core::provisioning::MachineRecord;
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, EventKind, KeyRange, KeyValue, LeaseId, Op, OpResult, Txn,
    TxnResponse,
};
use metropolis_core::time::Instant;
use metropolis_core::watch::{CachedNode, NodeCache, NodeChange, NodesWatch};
use metropolis_proto::wire::EncodedWatchEvent;

use crate::canary::Canary;
use crate::ctx::Ctx;
use crate::invariants::{ELECTION, MACHINES, NODES};
use crate::msg::{Addr, Call, CallError, CallId, CallOk, Msg, OpId, StreamId, WriteTag};

/// The lease TTL of every curator.
pub const TTL: Duration = Duration::from_secs(2);
/// The longest a request waits for a leader.
pub const MAX_WAIT: Duration = Duration::from_secs(3);
/// Largest encoded watch event (small, so that backlogs are chunked).
pub const MAX_EVENT_BYTES: usize = 160;
const TICK: Duration = Duration::from_millis(100);
const OBSERVE_EVERY: Duration = Duration::from_millis(200);
const RESEND_AFTER: Duration = Duration::from_secs(1);
const MAX_ATTEMPTS: u32 = 5;
/// The deadline of a store call.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Wall-clock origin of the heartbeat times stored in machine records.
const EPOCH_MS: i64 = 1_700_000_000_000;

/// The `host:port` address of curator `i`.
pub fn curator_address(i: usize) -> String {
    format!("curator-{i}:7835")
}

fn curator_index(address: &str) -> Option<usize> {
    address
        .strip_prefix("curator-")?
        .strip_suffix(":7835")?
        .parse()
        .ok()
}

/// The election port's view of the current campaign.
#[derive(Debug, Default)]
struct Port {
    campaign: Option<(CampaignId, Bytes)>,
    lease: Option<LeaseId>,
    key: Option<ElectionKey>,
    won: bool,
    grant_sent: Option<Instant>,
    put_sent: Option<Instant>,
    keepalive_sent: Option<Instant>,
    next_keepalive: Option<Instant>,
}

/// A store call in flight.
#[derive(Debug)]
enum StoreOp {
    Grant {
        campaign: CampaignId,
        sent_at: Instant,
    },
    PutKey {
        campaign: CampaignId,
        key: Bytes,
    },
    KeepAlive {
        campaign: CampaignId,
        lease: LeaseId,
        sent_at: Instant,
    },
    Observe,
    Read {
        request: RequestId,
        attempt: u32,
    },
    Write {
        request: RequestId,
        fence: Fence,
        attempt: u32,
    },
    SyncRead,
}

#[derive(Debug)]
enum Req {
    Call {
        from: Addr,
        call: CallId,
        origin: CallId,
        body: Box<Call>,
        hops: u8,
        /// The reply to send once the write committed.
        reply: Option<CallOk>,
    },
    Watch {
        from: Addr,
        stream: StreamId,
        hops: u8,
    },
}

/// How the cache follows the store.
#[derive(Debug, PartialEq, Eq)]
enum Sync {
    /// Needs a fresh snapshot.
    Idle,
    /// Reading a snapshot.
    Reading,
    /// Watching from the snapshot on.
    Watching(StreamId),
}

#[derive(Debug)]
struct Served {
    to: Addr,
    watch: NodesWatch,
}

#[derive(Debug)]
struct Relay {
    to: Addr,
    leader: Addr,
    downstream: StreamId,
    request: RequestId,
}

/// One curator instance (one incarnation: a restart makes a new one).
#[derive(Debug)]
pub struct Curator {
    /// Index among the curators.
    pub idx: usize,
    /// Which incarnation this is.
    pub incarnation: u32,
    store: Addr,
    curators: Vec<Addr>,
    /// The leadership machine.
    pub m: Leadership,
    port: Port,
    ops: BTreeMap<OpId, (Instant, StoreOp)>,
    reqs: BTreeMap<RequestId, Req>,
    /// Forwarded calls: upstream call -> request.
    forwarded: BTreeMap<CallId, RequestId>,
    next_observe: Instant,
    observing: Option<Instant>,
    observed: Option<ElectionKey>,
    /// The store revision of the newest observation applied: older
    /// replies (reordered) are stale and ignored, as an etcd watch would
    /// never deliver them.
    observed_at: i64,
    /// The node cache.
    pub cache: NodeCache,
    synced: bool,
    sync: Sync,
    /// Streams served here: downstream stream -> stream.
    served: BTreeMap<StreamId, Served>,
    /// Streams waiting for the cache's first sync.
    held: Vec<StreamId>,
    /// Relayed streams: upstream stream -> relay.
    relays: BTreeMap<StreamId, Relay>,
    /// Downstream stream -> request (every stream opened here).
    streams: BTreeMap<StreamId, RequestId>,
    /// Whether the planted tombstone drop already happened (canary).
    dropped_tombstone: bool,
}

fn read_key(key: Bytes) -> Txn {
    Txn {
        success: vec![Op::Range(KeyRange::Key(key))],
        ..Default::default()
    }
}

fn first_kv(response: &TxnResponse) -> Option<KeyValue> {
    match response.results.first() {
        Some(OpResult::Range(kvs)) => kvs.first().cloned(),
        _ => None,
    }
}

fn call_key(body: &Call) -> Bytes {
    Bytes::from(match body {
        Call::CreateNode { id, .. } | Call::UpdateNode { id, .. } | Call::DeleteNode { id } => {
            format!("{NODES}{id}")
        }
        Call::Heartbeat { request } => format!("{MACHINES}{}", request.machine_id),
        Call::Submit { machine, .. } => format!("{MACHINES}{machine}"),
    })
}

impl Curator {
    /// A fresh incarnation of curator `idx`, started at `ctx`'s time.
    pub fn new(
        ctx: &mut Ctx<'_>,
        idx: usize,
        incarnation: u32,
        store: Addr,
        curators: Vec<Addr>,
    ) -> Curator {
        let config = LeadershipConfig {
            lease_ttl: TTL,
            max_wait: MAX_WAIT,
            ..LeadershipConfig::new(format!("node-{idx}"), curator_address(idx))
        };
        let now = ctx.local();
        let m = Leadership::new(config, now).expect("the simulator's leadership config is valid");
        let mut c = Curator {
            idx,
            incarnation,
            store,
            curators,
            m,
            port: Port::default(),
            ops: BTreeMap::new(),
            reqs: BTreeMap::new(),
            forwarded: BTreeMap::new(),
            next_observe: now,
            observing: None,
            observed: None,
            observed_at: 0,
            cache: NodeCache::new(),
            synced: false,
            sync: Sync::Idle,
            served: BTreeMap::new(),
            held: Vec::new(),
            relays: BTreeMap::new(),
            streams: BTreeMap::new(),
            dropped_tombstone: false,
        };
        c.drain(ctx);
        c.tick(ctx);
        c
    }

    /// This instance's election key, if it leads.
    pub fn leader_key(&self) -> Option<&ElectionKey> {
        match self.m.role() {
            Role::Leader(l) => Some(&l.key),
            _ => None,
        }
    }

    fn store_op(&mut self, ctx: &mut Ctx<'_>, op: StoreOp, txn: Txn, tag: Option<WriteTag>) {
        let id = ctx.fresh_id();
        self.ops.insert(id, (ctx.local(), op));
        ctx.send(self.store, Msg::Txn { op: id, txn, tag });
    }

    /// The periodic tick: timers, the election port, the cache sync.
    pub fn tick(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.local();
        self.m.handle_timeout(now);
        self.drain(ctx);
        // Store calls time out (the store client's request deadline).
        let expired: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, (sent, _))| now >= *sent + OP_TIMEOUT)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some((_, op)) = self.ops.remove(&id) {
                self.txn_failed(ctx, op);
            }
        }
        let stale = |sent: Option<Instant>| sent.is_none_or(|t| now >= t + RESEND_AFTER);
        if let Some((campaign, value)) = self.port.campaign.clone() {
            match (self.port.lease, &self.port.key) {
                (None, _) if stale(self.port.grant_sent) => {
                    self.port.grant_sent = Some(now);
                    let op = ctx.fresh_id();
                    self.ops.insert(
                        op,
                        (
                            now,
                            StoreOp::Grant {
                                campaign,
                                sent_at: now,
                            },
                        ),
                    );
                    ctx.send(self.store, Msg::LeaseGrant { op, ttl: TTL });
                }
                (Some(lease), None) if stale(self.port.put_sent) => {
                    self.port.put_sent = Some(now);
                    let key = Bytes::from(format!("{ELECTION}{lease:016x}"));
                    let txn = Txn {
                        compares: vec![Compare {
                            key: key.clone(),
                            op: CmpOp::Equal,
                            target: CompareTarget::CreateRevision(0),
                        }],
                        success: vec![Op::Put {
                            key: key.clone(),
                            value,
                            lease,
                        }],
                        // A re-sent put finds the key its lost reply made.
                        failure: vec![Op::Range(KeyRange::Key(key.clone()))],
                    };
                    self.store_op(ctx, StoreOp::PutKey { campaign, key }, txn, None);
                }
                _ => {}
            }
            if let Some(lease) = self.port.lease
                && self.port.next_keepalive.is_none_or(|t| now >= t)
                && stale(self.port.keepalive_sent)
            {
                self.port.keepalive_sent = Some(now);
                self.port.next_keepalive = Some(now + TTL / 3);
                let op = ctx.fresh_id();
                self.ops.insert(
                    op,
                    (
                        now,
                        StoreOp::KeepAlive {
                            campaign,
                            lease,
                            sent_at: now,
                        },
                    ),
                );
                ctx.send(self.store, Msg::KeepAlive { op, lease });
            }
        }
        if now >= self.next_observe && stale(self.observing) {
            self.next_observe = now + OBSERVE_EVERY;
            self.observing = Some(now);
            let txn = Txn {
                success: vec![Op::Range(KeyRange::Prefix(Bytes::from_static(
                    ELECTION.as_bytes(),
                )))],
                ..Default::default()
            };
            self.store_op(ctx, StoreOp::Observe, txn, None);
        }
        if self.sync == Sync::Idle {
            self.sync = Sync::Reading;
            let txn = Txn {
                success: vec![Op::Range(KeyRange::Prefix(Bytes::from_static(
                    NODES.as_bytes(),
                )))],
                ..Default::default()
            };
            self.store_op(ctx, StoreOp::SyncRead, txn, None);
        }
        ctx.wake_in(TICK);
    }

    /// Drains the machine's outputs and acts on them.
    fn drain(&mut self, ctx: &mut Ctx<'_>) {
        loop {
            let mut progressed = false;
            while let Some(action) = self.m.poll_action() {
                progressed = true;
                self.action(ctx, action);
            }
            while let Some(event) = self.m.poll_event() {
                progressed = true;
                self.event(ctx, event);
            }
            if !progressed {
                break;
            }
        }
        if let Some(at) = self.m.poll_timeout() {
            ctx.wake_at_local(at);
        }
    }

    fn action(&mut self, ctx: &mut Ctx<'_>, action: Action) {
        match action {
            Action::Campaign {
                campaign, value, ..
            } => {
                self.port = Port {
                    campaign: Some((campaign, value)),
                    ..Port::default()
                };
            }
            Action::Abandon { campaign, lease } => {
                if let Some(lease) = lease {
                    ctx.send(self.store, Msg::Revoke { lease });
                }
                if self.port.campaign.as_ref().map(|c| c.0) == Some(campaign) {
                    self.port = Port::default();
                }
            }
        }
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: Event) {
        match event {
            Event::RoleChanged { role, .. } => {
                if let Role::Leader(l) = role {
                    ctx.checks.leader_claim(self.idx, self.incarnation, &l.key);
                }
            }
            Event::Routed { request, route } => match route {
                Route::Serve => self.serve(ctx, request),
                Route::Forward { address, .. } => self.forward(ctx, request, &address),
                Route::Wait { .. } => {}
                Route::Reject(_) => self.end(ctx, request, Err(CallError::Unavailable)),
            },
            Event::Cancelled { request, .. } => self.end(ctx, request, Err(CallError::Unavailable)),
        }
    }

    /// Ends a request: replies to a call, ends a stream.
    fn end(&mut self, ctx: &mut Ctx<'_>, request: RequestId, result: Result<CallOk, CallError>) {
        let now = ctx.local();
        self.m.handle_request_finished(now, request);
        match self.reqs.remove(&request) {
            Some(Req::Call { from, call, .. }) => {
                self.forwarded.retain(|_, r| *r != request);
                ctx.send(from, Msg::CallReply { call, result });
            }
            Some(Req::Watch { from, stream, .. }) => {
                self.served.remove(&stream);
                self.held.retain(|s| *s != stream);
                self.streams.remove(&stream);
                let upstream: Vec<StreamId> = self
                    .relays
                    .iter()
                    .filter(|(_, r)| r.request == request)
                    .map(|(u, _)| *u)
                    .collect();
                for u in upstream {
                    if let Some(relay) = self.relays.remove(&u) {
                        ctx.send(relay.leader, Msg::WatchClose { stream: u });
                    }
                }
                ctx.send(from, Msg::WatchEnd { stream });
            }
            None => {}
        }
    }

    fn serve(&mut self, ctx: &mut Ctx<'_>, request: RequestId) {
        match self.reqs.get(&request) {
            Some(Req::Call { body, .. }) => {
                let key = call_key(body);
                self.store_op(
                    ctx,
                    StoreOp::Read {
                        request,
                        attempt: 1,
                    },
                    read_key(key),
                    None,
                );
            }
            Some(Req::Watch { from, stream, .. }) => {
                let (to, stream) = (*from, *stream);
                self.served.insert(
                    stream,
                    Served {
                        to,
                        watch: NodesWatch::new(MAX_EVENT_BYTES),
                    },
                );
                if self.synced {
                    self.flush(ctx, Some(stream));
                } else {
                    self.held.push(stream);
                }
            }
            None => {}
        }
    }

    fn forward(&mut self, ctx: &mut Ctx<'_>, request: RequestId, address: &str) {
        let Some(leader) = curator_index(address).and_then(|i| self.curators.get(i).copied())
        else {
            return self.end(ctx, request, Err(CallError::Unavailable));
        };
        match self.reqs.get(&request) {
            Some(Req::Call {
                body, hops, origin, ..
            }) => {
                if *hops >= 2 {
                    return self.end(ctx, request, Err(CallError::Unavailable));
                }
                let call = ctx.fresh_id();
                let msg = Msg::Call {
                    call,
                    origin: *origin,
                    body: Call::clone(body),
                    timeout: Duration::from_secs(2),
                    hops: hops + 1,
                };
                self.forwarded.insert(call, request);
                ctx.send(leader, msg);
            }
            Some(Req::Watch {
                from, stream, hops, ..
            }) => {
                if *hops >= 2 {
                    return self.end(ctx, request, Err(CallError::Unavailable));
                }
                let upstream = ctx.fresh_id();
                self.relays.insert(
                    upstream,
                    Relay {
                        to: *from,
                        leader,
                        downstream: *stream,
                        request,
                    },
                );
                let hops = hops + 1;
                ctx.send(
                    leader,
                    Msg::WatchStart {
                        stream: upstream,
                        hops,
                    },
                );
            }
            None => {}
        }
    }

    /// Sends every stream's pending events (only `only`, if given); the
    /// last event of each drain carries the cache revision.
    fn flush(&mut self, ctx: &mut Ctx<'_>, only: Option<StreamId>) {
        let revision = self.cache.revision();
        for (stream, served) in self.served.iter_mut() {
            if only.is_some_and(|s| s != *stream) || self.held.contains(stream) {
                continue;
            }
            let mut events: Vec<EncodedWatchEvent> = Vec::new();
            while let Some(event) = served.watch.poll_event(&self.cache) {
                events.push(event);
            }
            let n = events.len();
            for (i, event) in events.into_iter().enumerate() {
                let consistent_at = (i + 1 == n).then_some(revision);
                ctx.send(
                    served.to,
                    Msg::WatchEvent {
                        stream: *stream,
                        event,
                        consistent_at,
                    },
                );
            }
        }
    }

    /// Applies cache changes and feeds them to every served stream.
    fn apply_changes(&mut self, changes: &[NodeChange]) {
        for change in changes {
            for served in self.served.values_mut() {
                served.watch.handle_change(change);
            }
        }
    }

    /// Handles one message.
    pub fn handle(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Msg) {
        let now = ctx.local();
        match msg {
            Msg::TxnReply { op, result } => {
                let Some((_, op)) = self.ops.remove(&op) else {
                    return;
                };
                match result {
                    Ok(response) => self.txn_reply(ctx, op, response),
                    Err(_) => self.txn_failed(ctx, op),
                }
            }
            Msg::LeaseGrantReply { op, result } => {
                let Some((_, StoreOp::Grant { campaign, sent_at })) = self.ops.remove(&op) else {
                    return;
                };
                let current = self.port.campaign.as_ref().map(|c| c.0) == Some(campaign);
                match result {
                    Ok((lease, ttl)) if current && self.port.lease.is_none() => {
                        self.port.lease = Some(lease);
                        self.port.next_keepalive = Some(sent_at + TTL / 3);
                        self.m.handle_lease_granted(
                            now,
                            LeaseGrant {
                                campaign,
                                lease,
                                ttl,
                                sent_at,
                            },
                        );
                    }
                    Ok((lease, _)) => ctx.send(self.store, Msg::Revoke { lease }),
                    Err(_) => self.port.grant_sent = None,
                }
            }
            Msg::KeepAliveReply { op, result } => {
                let Some((
                    _,
                    StoreOp::KeepAlive {
                        campaign,
                        lease,
                        sent_at,
                    },
                )) = self.ops.remove(&op)
                else {
                    return;
                };
                self.port.keepalive_sent = None;
                let current = self.port.campaign.as_ref().map(|c| c.0) == Some(campaign)
                    && self.port.lease == Some(lease);
                if current {
                    match result {
                        Ok(ttl) => self.m.handle_lease_granted(
                            now,
                            LeaseGrant {
                                campaign,
                                lease,
                                ttl,
                                sent_at,
                            },
                        ),
                        Err(_) => self.m.handle_lease_lost(now, campaign),
                    }
                }
            }
            Msg::Call {
                call,
                origin,
                body,
                timeout,
                hops,
            } => {
                let id = self.m.handle_request(now, Some(now + timeout));
                self.reqs.insert(
                    id,
                    Req::Call {
                        from,
                        call,
                        origin,
                        body: Box::new(body),
                        hops,
                        reply: None,
                    },
                );
            }
            Msg::CallReply { call, result } => {
                if let Some(request) = self.forwarded.remove(&call) {
                    self.end(ctx, request, result);
                }
            }
            Msg::WatchStart { stream, hops } => {
                let id = self.m.handle_request(now, None);
                self.streams.insert(stream, id);
                self.reqs.insert(id, Req::Watch { from, stream, hops });
            }
            Msg::WatchClose { stream } | Msg::Reset { stream } => {
                if let Some(request) = self.streams.remove(&stream) {
                    self.served.remove(&stream);
                    self.m.handle_request_finished(now, request);
                    self.reqs.remove(&request);
                    let upstream: Vec<StreamId> = self
                        .relays
                        .iter()
                        .filter(|(_, r)| r.downstream == stream)
                        .map(|(u, _)| *u)
                        .collect();
                    for u in upstream {
                        if let Some(relay) = self.relays.remove(&u) {
                            ctx.send(relay.leader, Msg::WatchClose { stream: u });
                        }
                    }
                }
                if let Some(relay) = self.relays.remove(&stream) {
                    self.end(ctx, relay.request, Err(CallError::Unavailable));
                }
                if self.sync == Sync::Watching(stream) {
                    self.sync = Sync::Idle;
                }
            }
            Msg::WatchEvent {
                stream,
                event,
                consistent_at,
            } => {
                if let Some(relay) = self.relays.get(&stream) {
                    ctx.send(
                        relay.to,
                        Msg::WatchEvent {
                            stream: relay.downstream,
                            event,
                            consistent_at,
                        },
                    );
                }
            }
            Msg::WatchEnd { stream } => {
                if let Some(relay) = self.relays.remove(&stream) {
                    self.end(ctx, relay.request, Err(CallError::Unavailable));
                }
            }
            Msg::WatchBatch { stream, batch } => {
                if self.sync != Sync::Watching(stream) {
                    return;
                }
                match batch {
                    Ok(batch) => {
                        for e in &batch.events {
                            let Some(id) = std::str::from_utf8(&e.kv.key)
                                .ok()
                                .and_then(|k| k.strip_prefix(NODES))
                            else {
                                continue;
                            };
                            let id: Arc<str> = Arc::from(id);
                            let change = match e.kind {
                                EventKind::Put => NodeChange::Put(CachedNode {
                                    id,
                                    revision: e.kv.mod_revision,
                                    encoded: e.kv.value.clone(),
                                }),
                                EventKind::Delete => {
                                    if ctx.canary == Canary::DropTombstone
                                        && !self.dropped_tombstone
                                    {
                                        // Planted bug: the first deletion never
                                        // reaches the cache.
                                        self.dropped_tombstone = true;
                                        continue;
                                    }
                                    NodeChange::Delete {
                                        id,
                                        revision: e.kv.mod_revision,
                                    }
                                }
                            };
                            if self.cache.handle_change(&change) {
                                self.apply_changes(&[change]);
                            }
                        }
                        self.cache.handle_progress(batch.revision);
                        self.flush(ctx, None);
                    }
                    Err(_) => self.sync = Sync::Idle,
                }
            }
            _ => {}
        }
        self.drain(ctx);
    }

    fn txn_failed(&mut self, ctx: &mut Ctx<'_>, op: StoreOp) {
        match op {
            StoreOp::PutKey { .. } => self.port.put_sent = None,
            StoreOp::Observe => self.observing = None,
            StoreOp::SyncRead => self.sync = Sync::Idle,
            StoreOp::Read { request, .. } | StoreOp::Write { request, .. } => {
                self.end(ctx, request, Err(CallError::Unavailable))
            }
            StoreOp::Grant { .. } => self.port.grant_sent = None,
            StoreOp::KeepAlive { .. } => self.port.keepalive_sent = None,
        }
    }

    fn txn_reply(&mut self, ctx: &mut Ctx<'_>, op: StoreOp, response: TxnResponse) {
        let now = ctx.local();
        match op {
            StoreOp::PutKey { campaign, key } => {
                self.port.put_sent = None;
                if self.port.campaign.as_ref().map(|c| c.0) != Some(campaign)
                    || self.port.key.is_some()
                {
                    return;
                }
                if response.succeeded {
                    self.port.key = Some(ElectionKey {
                        key,
                        create_revision: response.revision,
                    });
                } else if let Some(kv) = first_kv(&response)
                    && Some(kv.lease) == self.port.lease
                {
                    self.port.key = Some(ElectionKey {
                        key,
                        create_revision: kv.create_revision,
                    });
                }
            }
            StoreOp::Observe => {
                self.observing = None;
                self.observe(ctx, &response);
            }
            StoreOp::SyncRead => {
                let snapshot: Vec<CachedNode> = match response.results.first() {
                    Some(OpResult::Range(kvs)) => kvs
                        .iter()
                        .filter_map(|kv| {
                            let id = std::str::from_utf8(&kv.key).ok()?.strip_prefix(NODES)?;
                            Some(CachedNode {
                                id: Arc::from(id),
                                revision: kv.mod_revision,
                                encoded: kv.value.clone(),
                            })
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                let changes = self.cache.handle_resync(response.revision, snapshot);
                self.apply_changes(&changes);
                self.synced = true;
                let stream = ctx.fresh_id();
                self.sync = Sync::Watching(stream);
                ctx.send(
                    self.store,
                    Msg::WatchOpen {
                        stream,
                        start: response.revision + 1,
                    },
                );
                self.held.clear();
                self.flush(ctx, None);
            }
            StoreOp::Read { request, attempt } => self.read_reply(ctx, request, attempt, &response),
            StoreOp::Write {
                request,
                fence,
                attempt,
            } => {
                if response.succeeded {
                    let reply = match self.reqs.get_mut(&request) {
                        Some(Req::Call { reply, .. }) => reply.take().unwrap_or(CallOk::Done),
                        _ => return,
                    };
                    self.end(ctx, request, Ok(reply));
                } else if fence.check(&response) == FenceCheck::Lost {
                    self.m.handle_fence_failed(now, request);
                    // Its cancellation (lost leadership) follows from the
                    // machine; a request already ended gets a reply here.
                    if self.reqs.contains_key(&request) {
                        self.drain(ctx);
                        if self.reqs.contains_key(&request) {
                            self.end(ctx, request, Err(CallError::Unavailable));
                        }
                    }
                } else if attempt >= MAX_ATTEMPTS {
                    self.end(ctx, request, Err(CallError::Aborted));
                } else if let Some(Req::Call { body, .. }) = self.reqs.get(&request) {
                    let key = call_key(body);
                    self.store_op(
                        ctx,
                        StoreOp::Read {
                            request,
                            attempt: attempt + 1,
                        },
                        read_key(key),
                        None,
                    );
                }
            }
            StoreOp::Grant { .. } | StoreOp::KeepAlive { .. } => {}
        }
    }

    /// The election prefix as the store showed it.
    fn observe(&mut self, ctx: &mut Ctx<'_>, response: &TxnResponse) {
        let now = ctx.local();
        if response.revision < self.observed_at {
            return;
        }
        self.observed_at = response.revision;
        let kvs: Vec<KeyValue> = match response.results.first() {
            Some(OpResult::Range(kvs)) => kvs.clone(),
            _ => return,
        };
        let exists = |k: &ElectionKey| {
            kvs.iter()
                .any(|kv| kv.key == k.key && kv.create_revision == k.create_revision)
        };
        let leader = kvs.iter().min_by_key(|kv| kv.create_revision).cloned();
        if let (Some((campaign, _)), Some(own)) =
            (self.port.campaign.clone(), self.port.key.clone())
        {
            if response.revision >= own.create_revision && !exists(&own) {
                // Deleted while the lease lives: this campaign cannot win.
                self.m.handle_lease_lost(now, campaign);
                self.drain(ctx);
                return;
            }
            if !self.port.won
                && leader
                    .as_ref()
                    .is_some_and(|l| l.key == own.key && l.create_revision == own.create_revision)
            {
                self.port.won = true;
                self.m.handle_campaign_won(now, campaign, own);
            }
        }
        let leader_key = leader.as_ref().map(|kv| ElectionKey {
            key: kv.key.clone(),
            create_revision: kv.create_revision,
        });
        if leader_key == self.observed {
            return;
        }
        if let Some(old) = self.observed.clone()
            && !exists(&old)
        {
            self.m.handle_leader_deleted(now, &old);
            self.observed = None;
        }
        if let (Some(kv), Some(key)) = (leader, leader_key) {
            self.m.handle_leader_observed(now, key.clone(), &kv.value);
            self.observed = Some(key);
        }
    }

    /// A served call read its record: decide the write.
    fn read_reply(
        &mut self,
        ctx: &mut Ctx<'_>,
        request: RequestId,
        attempt: u32,
        response: &TxnResponse,
    ) {
        let now = ctx.local();
        let Some(Req::Call { body, origin, .. }) = self.reqs.get(&request) else {
            return;
        };
        let origin = *origin;
        let current = first_kv(response);
        let key = call_key(body);
        let mod_cmp = |kv: &KeyValue| Compare {
            key: key.clone(),
            op: CmpOp::Equal,
            target: CompareTarget::ModRevision(kv.mod_revision),
        };
        let mut reply = None;
        let (compare, write) = match (&**body, &current) {
            (Call::CreateNode { .. }, Some(_)) => {
                return self.end(ctx, request, Err(CallError::AlreadyExists));
            }
            (Call::CreateNode { encoded, .. }, None) => (
                Compare {
                    key: key.clone(),
                    op: CmpOp::Equal,
                    target: CompareTarget::CreateRevision(0),
                },
                Op::Put {
                    key: key.clone(),
                    value: encoded.clone(),
                    lease: 0,
                },
            ),
            (Call::UpdateNode { encoded, .. }, Some(kv)) => (
                mod_cmp(kv),
                Op::Put {
                    key: key.clone(),
                    value: encoded.clone(),
                    lease: 0,
                },
            ),
            (Call::DeleteNode { .. }, Some(kv)) => {
                (mod_cmp(kv), Op::Delete(KeyRange::Key(key.clone())))
            }
            (Call::Heartbeat { request: hb }, Some(kv)) => {
                let Ok(mut record) = MachineRecord::decode(&kv.value) else {
                    return self.end(ctx, request, Err(CallError::NotFound));
                };
                let unix_ms = EPOCH_MS + (now.offset().as_millis() as i64);
                let outcome = record.handle_heartbeat(hb, unix_ms);
                reply = Some(CallOk::Heartbeat(outcome.response_request));
                (
                    mod_cmp(kv),
                    Op::Put {
                        key: key.clone(),
                        value: Bytes::from(record.encode()),
                        lease: 0,
                    },
                )
            }
            (Call::Submit { request: bytes, .. }, Some(kv)) => {
                let Ok(mut record) = MachineRecord::decode(&kv.value) else {
                    return self.end(ctx, request, Err(CallError::NotFound));
                };
                if record.submit_request(bytes, 0).is_err() {
                    return self.end(ctx, request, Err(CallError::Aborted));
                }
                (
                    mod_cmp(kv),
                    Op::Put {
                        key: key.clone(),
                        value: Bytes::from(record.encode()),
                        lease: 0,
                    },
                )
            }
            (_, None) => return self.end(ctx, request, Err(CallError::NotFound)),
        };
        let fence = match self.m.write_fence(now, request) {
            Ok(fence) => fence,
            // Its cancellation is in the machine's queue.
            Err(_) => return self.drain(ctx),
        };
        if let Some(Req::Call { reply: r, .. }) = self.reqs.get_mut(&request) {
            *r = reply;
        }
        let txn = Txn {
            compares: vec![compare],
            success: vec![write],
            failure: vec![],
        };
        let txn = if ctx.canary == Canary::SkipFence {
            // Planted bug: the write goes out unfenced.
            txn
        } else {
            fence.guard(txn)
        };
        let tag = fence.key().map(|k| WriteTag {
            author: self.idx,
            believed: k.clone(),
            call: origin,
        });
        self.store_op(
            ctx,
            StoreOp::Write {
                request,
                fence,
                attempt,
            },
            txn,
            tag,
        );
    }

    /// The role and election port state, for failure reports.
    pub fn describe(&self) -> String {
        format!(
            "{:?} streams {:?} held {:?} cache at {} sync {:?} serves {:?} relays {:?} port(lease {:?}, key {:?}, won {}) observed {:?} ops {}",
            self.m.role(),
            self.streams,
            self.held,
            self.cache.revision(),
            self.sync,
            self.served.keys().collect::<Vec<_>>(),
            self.relays.keys().collect::<Vec<_>>(),
            self.port.lease,
            self.port.key,
            self.port.won,
            self.observed,
            self.ops.len()
        )
    }

    /// Streams this incarnation holds open (for the world's bookkeeping).
    pub fn open_streams(&self) -> usize {
        self.streams.len() + self.relays.len()
    }
}
