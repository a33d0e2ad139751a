//! The [`LogTree`] machine.

use std::collections::{BTreeMap, VecDeque};

use metropolis_proto::prelude::common;

use super::query::Backlog;
use super::{Dn, Entry, Query, Sequenced, Stream};

/// Limits of a [`LogTree`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogTreeConfig {
    /// Cap on the summed [`Entry::cost`] of all retained entries; the
    /// oldest entries (globally) are evicted to stay under it. An entry
    /// costlier than the cap is evicted right after insertion (it still
    /// reaches subscribers).
    pub max_bytes: usize,
    /// Cap on the entries retained per DN; the DN's oldest is evicted.
    /// 0 retains nothing.
    pub max_entries_per_dn: usize,
    /// Cap on the entries queued per subscription; beyond it the oldest
    /// queued entry is dropped and counted (see [`Drained::dropped`]).
    pub max_queued_per_subscription: usize,
}

impl Default for LogTreeConfig {
    /// 16 MiB in total, 1024 entries per DN, 1024 queued per subscription.
    fn default() -> Self {
        LogTreeConfig {
            max_bytes: 16 * 1024 * 1024,
            max_entries_per_dn: 1024,
            max_queued_per_subscription: 1024,
        }
    }
}

/// Identifies a subscription of a [`LogTree`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubscriptionId(u64);

/// What [`LogTree::poll_subscription`] drains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Queued matching entries, in sequence order.
    pub entries: Vec<Sequenced>,
    /// How many matching entries were dropped since the previous poll
    /// because the queue was full (they were older than `entries`).
    pub dropped: u64,
}

#[derive(Debug)]
struct Subscription {
    query: Query,
    queue: VecDeque<Sequenced>,
    dropped: u64,
}

/// The log tree of a node: per-DN ring buffers under a global memory cap,
/// plus streaming subscriptions. A pure machine: no clock (timestamps come
/// with each entry), no I/O.
///
/// Every DN ever logged to is remembered, together with its ancestors
/// (`root.curator` makes `root` known too), even once all its entries are
/// evicted. Remembered DNs are not bounded by the memory cap; they are
/// bounded by the set of components. A query for a DN never logged to is
/// valid: its backlog is empty and its subscription waits.
///
/// Driving contract:
/// 1. Feed every log entry to [`LogTree::handle_entry`], in the order they
///    were logged; it returns the entry's global sequence number.
/// 2. For a `GetLogs` call: validate with [`Query::from_request`] (errors
///    end the call, as a [`QueryError`](super::QueryError)), then call
///    [`LogTree::open`] (or [`LogTree::backlog`] and, for
///    [`Stream::Unbuffered`], [`LogTree::subscribe`] with no
///    `handle_entry` in between, i.e. under one lock). The backlog then
///    holds exactly the matching entries inserted before, the subscription
///    exactly those inserted after: none missed, none duplicated. Send the
///    backlog as `backlog_entries` before any `stream_entries`.
/// 3. After entries were handled, [`LogTree::poll_subscription`] each open
///    subscription and send what it drains; report a non-zero
///    [`Drained::dropped`] to the client (the consumer was too slow).
/// 4. [`LogTree::unsubscribe`] when the stream ends for any reason.
#[derive(Debug)]
pub struct LogTree {
    config: LogTreeConfig,
    next_seq: u64,
    /// Retained entries per DN, oldest first; every DN ever seen has a key.
    dns: BTreeMap<Dn, VecDeque<Sequenced>>,
    /// Global insertion order of retained entries: seq -> DN.
    order: BTreeMap<u64, Dn>,
    total_bytes: usize,
    subscriptions: BTreeMap<SubscriptionId, Subscription>,
    next_subscription: u64,
}

impl LogTree {
    /// An empty tree with these limits.
    pub fn new(config: LogTreeConfig) -> LogTree {
        LogTree {
            config,
            next_seq: 1,
            dns: BTreeMap::new(),
            order: BTreeMap::new(),
            total_bytes: 0,
            subscriptions: BTreeMap::new(),
            next_subscription: 1,
        }
    }

    /// The limits of this tree.
    pub fn config(&self) -> &LogTreeConfig {
        &self.config
    }

    /// Summed [`Entry::cost`] of the retained entries; never above
    /// [`LogTreeConfig::max_bytes`] after `handle_entry` returns.
    pub fn total_bytes(&self) -> usize {
        self.total_bytes
    }

    /// Whether `dn` (or one of its descendants) was ever logged to.
    pub fn has_seen(&self, dn: &Dn) -> bool {
        self.dns.contains_key(dn)
    }

    /// The retained entries of exactly `dn` (no children), oldest first.
    pub fn entries(&self, dn: &Dn) -> impl Iterator<Item = &Sequenced> {
        self.dns.get(dn).into_iter().flatten()
    }

    /// Inserts an entry: gives it the next sequence number, queues it to
    /// every matching subscription, retains it, then evicts per the
    /// limits. Returns its sequence number.
    pub fn handle_entry(&mut self, entry: Entry) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.remember(&entry.dn);

        let cap = self.config.max_queued_per_subscription;
        for sub in self.subscriptions.values_mut() {
            if sub.query.matches(&entry) {
                sub.queue.push_back(Sequenced {
                    seq,
                    entry: entry.clone(),
                });
                while sub.queue.len() > cap {
                    sub.queue.pop_front();
                    sub.dropped += 1;
                }
            }
        }

        let dn = entry.dn.clone();
        self.total_bytes += entry.cost();
        self.order.insert(seq, dn.clone());
        let ring = self
            .dns
            .get_mut(&dn)
            .expect("remember() registered the entry's DN");
        ring.push_back(Sequenced { seq, entry });
        while ring.len() > self.config.max_entries_per_dn {
            let old = ring
                .pop_front()
                .expect("a ring longer than its cap is non-empty");
            self.total_bytes -= old.entry.cost();
            self.order.remove(&old.seq);
        }

        while self.total_bytes > self.config.max_bytes {
            let (old_seq, old_dn) = self
                .order
                .pop_first()
                .expect("retained bytes imply a retained entry");
            let old = self
                .dns
                .get_mut(&old_dn)
                .and_then(VecDeque::pop_front)
                .expect("the globally oldest entry is the front of its DN's ring");
            debug_assert_eq!(old.seq, old_seq, "order index out of sync");
            self.total_bytes -= old.entry.cost();
        }
        seq
    }

    fn remember(&mut self, dn: &Dn) {
        let mut cur = Some(dn.clone());
        while let Some(d) = cur {
            if self.dns.contains_key(&d) {
                break;
            }
            cur = d.parent();
            self.dns.insert(d, VecDeque::new());
        }
    }

    /// The backlog of `query`: every retained matching entry in sequence
    /// order ([`Backlog::All`]), the newest `n` of them
    /// ([`Backlog::Count`]), or none ([`Backlog::Disable`]).
    pub fn backlog(&self, query: &Query) -> Vec<Sequenced> {
        let keep = match query.backlog {
            Backlog::Disable => return Vec::new(),
            Backlog::All => usize::MAX,
            Backlog::Count(n) => usize::try_from(n.get()).unwrap_or(usize::MAX),
        };
        let mut out: Vec<Sequenced> = if query.with_children {
            self.dns
                .range(query.dn.clone()..)
                .take_while(|(dn, _)| dn.as_str().starts_with(query.dn.as_str()))
                .filter(|(dn, _)| query.selects_dn(dn))
                .flat_map(|(_, ring)| ring.iter())
                .filter(|s| query.matches(&s.entry))
                .cloned()
                .collect()
        } else {
            self.entries(&query.dn)
                .filter(|s| query.matches(&s.entry))
                .cloned()
                .collect()
        };
        out.sort_unstable_by_key(|s| s.seq);
        let skip = out.len().saturating_sub(keep);
        out.drain(..skip);
        out
    }

    /// [`LogTree::backlog`] converted to wire entries.
    pub fn backlog_proto(&self, query: &Query) -> Vec<common::LogEntry> {
        self.backlog(query)
            .iter()
            .map(|s| s.entry.to_proto())
            .collect()
    }

    /// Opens a `GetLogs` call atomically: its backlog, and a subscription
    /// if the query streams ([`Stream::Unbuffered`]).
    pub fn open(&mut self, query: Query) -> (Vec<Sequenced>, Option<SubscriptionId>) {
        let backlog = self.backlog(&query);
        let sub = match query.stream {
            Stream::Disable => None,
            Stream::Unbuffered => Some(self.subscribe(query)),
        };
        (backlog, sub)
    }

    /// Subscribes to the entries matching `query` inserted from now on
    /// (its backlog and stream modes are ignored here).
    pub fn subscribe(&mut self, query: Query) -> SubscriptionId {
        let id = SubscriptionId(self.next_subscription);
        self.next_subscription += 1;
        self.subscriptions.insert(
            id,
            Subscription {
                query,
                queue: VecDeque::new(),
                dropped: 0,
            },
        );
        id
    }

    /// Drains a subscription's queue and drop count; `None` if `id` is not
    /// subscribed.
    pub fn poll_subscription(&mut self, id: SubscriptionId) -> Option<Drained> {
        let sub = self.subscriptions.get_mut(&id)?;
        Some(Drained {
            entries: sub.queue.drain(..).collect(),
            dropped: std::mem::take(&mut sub.dropped),
        })
    }

    /// Ends a subscription; returns whether it existed.
    pub fn unsubscribe(&mut self, id: SubscriptionId) -> bool {
        self.subscriptions.remove(&id).is_some()
    }

    /// How many subscriptions are open.
    pub fn subscription_count(&self) -> usize {
        self.subscriptions.len()
    }
}
