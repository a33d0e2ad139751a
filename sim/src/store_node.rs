//! The store process: the store model as etcd (one reliable cluster),
//! answering the curators' calls over the network, expiring leases on
//! global simulated time, streaming watches, and compacting.

use std::collections::BTreeMap;

use bytes::Bytes;
use metropolis_core::leadership::ElectionKey;
use metropolis_core::store::{KeyRange, MemStore, Op, Revision, StoreError, Txn, WatchId};
use metropolis_core::time::Instant;

use crate::ctx::{Ctx, us};
use crate::invariants::{ELECTION, NODES};
use crate::msg::{Addr, Msg, StreamId};

/// The store process.
#[derive(Debug)]
pub struct StoreNode {
    /// The store model.
    pub store: MemStore,
    /// A watch of every key, polled after every change, feeding the
    /// oracle (never compacted away: it is always current).
    oracle: WatchId,
    /// Open watch streams: stream -> (curator, watch).
    watches: BTreeMap<StreamId, (Addr, WatchId)>,
}

impl Default for StoreNode {
    fn default() -> Self {
        Self::new()
    }
}

/// The leader according to the store: the oldest election key.
pub fn store_leader(store: &MemStore) -> Option<ElectionKey> {
    store
        .range(&KeyRange::Prefix(Bytes::from_static(ELECTION.as_bytes())))
        .into_iter()
        .min_by_key(|kv| kv.create_revision)
        .map(|kv| ElectionKey {
            key: kv.key,
            create_revision: kv.create_revision,
        })
}

impl StoreNode {
    /// An empty store.
    pub fn new() -> StoreNode {
        let mut store = MemStore::new();
        let oracle = store
            .watch(KeyRange::Prefix(Bytes::new()), 0)
            .expect("a watch from the current revision cannot be compacted");
        StoreNode {
            store,
            oracle,
            watches: BTreeMap::new(),
        }
    }

    fn instant(ctx: &Ctx<'_>) -> Instant {
        Instant::from_offset(us(ctx.now))
    }

    /// Expires the leases due, then asks for a wake-up at the next expiry.
    pub fn tick(&mut self, ctx: &mut Ctx<'_>) {
        let revoked = self.store.handle_timeout(Self::instant(ctx));
        if !revoked.is_empty() {
            self.after_change(ctx);
        }
        if let Some(at) = self.store.poll_timeout() {
            ctx.wakes
                .push((ctx.me, at.offset().as_nanos().div_ceil(1_000) as u64));
        }
    }

    /// Feeds the oracle and every watch the changes since the last call.
    fn after_change(&mut self, ctx: &mut Ctx<'_>) {
        while let Some(batch) = self.store.poll_watch(self.oracle) {
            match batch {
                Ok(batch) => ctx.checks.store_committed(&batch.events),
                Err(e) => ctx.checks.fail(format!("oracle watch failed: {e}")),
            }
        }
        let streams: Vec<(StreamId, Addr, WatchId)> = self
            .watches
            .iter()
            .map(|(s, (to, w))| (*s, *to, *w))
            .collect();
        for (stream, to, watch) in streams {
            while let Some(batch) = self.store.poll_watch(watch) {
                let end = batch.is_err();
                ctx.send(to, Msg::WatchBatch { stream, batch });
                if end {
                    self.watches.remove(&stream);
                    break;
                }
            }
        }
    }

    /// Handles one message from `from`.
    pub fn handle(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Msg) {
        self.tick(ctx);
        let now = Self::instant(ctx);
        match msg {
            Msg::Txn { op, txn, tag } => {
                let leader = store_leader(&self.store);
                let result = self.store.txn(&txn);
                if let (Some(tag), Ok(response)) = (&tag, &result) {
                    ctx.checks
                        .write_applied(tag, leader.as_ref(), response.succeeded);
                }
                self.after_change(ctx);
                ctx.send(from, Msg::TxnReply { op, result });
            }
            Msg::LeaseGrant { op, ttl } => {
                let result = self.store.lease_grant(0, ttl, now).map(|id| (id, ttl));
                self.tick(ctx);
                ctx.send(from, Msg::LeaseGrantReply { op, result });
            }
            Msg::KeepAlive { op, lease } => {
                let result = self.store.lease_keep_alive(lease, now);
                self.tick(ctx);
                ctx.send(from, Msg::KeepAliveReply { op, result });
            }
            Msg::Revoke { lease } if self.store.lease_revoke(lease).is_ok() => {
                self.after_change(ctx);
            }
            Msg::WatchOpen { stream, start } => {
                match self.store.watch(
                    KeyRange::Prefix(Bytes::from_static(NODES.as_bytes())),
                    start,
                ) {
                    Ok(watch) => {
                        self.watches.insert(stream, (from, watch));
                        self.after_change(ctx);
                    }
                    Err(e) => ctx.send(
                        from,
                        Msg::WatchBatch {
                            stream,
                            batch: Err(e),
                        },
                    ),
                }
            }
            Msg::WatchCancel { stream } | Msg::Reset { stream } => {
                if let Some((_, watch)) = self.watches.remove(&stream) {
                    self.store.cancel_watch(watch);
                }
            }
            _ => {}
        }
    }

    /// Fault: compacts history up to a revision a little below the
    /// current one.
    pub fn compact(&mut self, ctx: &mut Ctx<'_>) {
        let back = ctx.rng.range(0, 8) as Revision;
        let at = (self.store.revision() - back).max(1);
        if at > self.store.compact_revision() {
            match self.store.compact(at) {
                Ok(()) | Err(StoreError::Compacted { .. }) => {}
                Err(e) => ctx.checks.fail(format!("compaction failed: {e}")),
            }
            self.after_change(ctx);
        }
    }

    /// Fault: an operator deletes the leader's election key by hand (its
    /// holder still believes it leads until it observes the deletion).
    pub fn delete_leader_key(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(leader) = store_leader(&self.store) {
            let delete = Txn {
                success: vec![Op::Delete(KeyRange::Key(leader.key))],
                ..Default::default()
            };
            if let Err(e) = self.store.txn(&delete) {
                ctx.checks
                    .fail(format!("deleting the leader key failed: {e}"));
            }
            self.after_change(ctx);
        }
    }

    /// Writes a record directly (setup only).
    pub fn put(&mut self, ctx: &mut Ctx<'_>, key: String, value: Bytes) {
        let txn = Txn {
            success: vec![Op::Put {
                key: Bytes::from(key),
                value,
                lease: 0,
            }],
            ..Default::default()
        };
        if let Err(e) = self.store.txn(&txn) {
            ctx.checks.fail(format!("setup write failed: {e}"));
        }
        self.after_change(ctx);
    }
}
