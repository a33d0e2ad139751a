//! The `NodesInCluster` stream machine.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use metropolis_proto::prelude::curator::watch_event::Progress;
use metropolis_proto::wire::EncodedWatchEvent;
use prost::Message;

use super::{NodeCache, NodeChange};

/// What a stream still owes its client for one node: its latest state or
/// its deletion. Holding only the latest makes memory per stream bounded
/// by the number of nodes, however slowly the client reads.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pending {
    Put(Bytes),
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Sending the backlog; every node with an ID greater than `sent_up_to`
    /// is still to be read from the cache.
    Backlog { sent_up_to: Option<Arc<str>> },
    /// Sending the cache's shared encoding of the whole backlog
    /// ([`NodeCache::shared_backlog`]): `chunks[next..]` are still to go.
    /// Every change since the cache's revision is queued.
    Shared { chunks: Arc<[Bytes]>, next: usize },
    /// The backlog and its `PROGRESS_LAST_BACKLOGGED` marker went out.
    Live,
}

/// One `Watch(NodesInCluster)` stream.
///
/// First the backlog: every node of the cache in ID order, split into
/// events of at most `max_event_bytes` encoded; the last backlog event
/// (possibly empty) carries `PROGRESS_LAST_BACKLOGGED`, exactly once. Then
/// the changes, coalesced per node while the client is not reading (latest
/// state wins, a delete wins over earlier puts, a re-create after a delete
/// is sent as the node).
///
/// The backlog is read lazily from the live cache behind a cursor: a change
/// to a node the stream has not sent yet needs no queueing, as the cursor
/// will read its newest state; a change to a node already sent is queued.
/// So no change is skipped and none is sent twice, and an idle stream holds
/// nothing.
///
/// A stream that has sent nothing yet may instead take the whole backlog
/// at once as bytes the cache encoded once for every stream at its
/// revision ([`poll_encoded`](Self::poll_encoded)): the same events, byte
/// for byte, and every change after that revision queued, so thousands of
/// streams opening together cost one encoding of the backlog, not one
/// each.
///
/// Driving: [`handle_change`](Self::handle_change) for every change applied
/// to the cache (under the same lock), [`poll_event`](Self::poll_event)
/// (or [`poll_encoded`](Self::poll_encoded)) until `None`.
#[derive(Debug)]
pub struct NodesWatch {
    phase: Phase,
    pending: BTreeMap<Arc<str>, Pending>,
    max_event_bytes: usize,
}

impl NodesWatch {
    /// A stream that has sent nothing yet. `max_event_bytes` bounds each
    /// event's encoded size (a single node larger than that is sent alone).
    pub fn new(max_event_bytes: usize) -> Self {
        NodesWatch {
            phase: Phase::Backlog { sent_up_to: None },
            pending: BTreeMap::new(),
            max_event_bytes,
        }
    }

    /// Whether the backlog marker has been sent.
    pub fn is_live(&self) -> bool {
        self.phase == Phase::Live
    }

    /// Number of nodes with an undelivered change.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Takes a change that was just applied to the cache. True when it
    /// replaced a change of the same node the stream had not sent yet
    /// (the two were coalesced).
    pub fn handle_change(&mut self, change: &NodeChange) -> bool {
        let id = change.id();
        if let Phase::Backlog { sent_up_to } = &self.phase {
            let already_sent = sent_up_to.as_ref().is_some_and(|s| id <= s);
            if !already_sent {
                return false;
            }
        }
        let next = match change {
            NodeChange::Put(n) => Pending::Put(n.encoded.clone()),
            NodeChange::Delete { .. } => Pending::Delete,
        };
        self.pending.insert(id.clone(), next).is_some()
    }

    /// The next event to send, if any.
    pub fn poll_event(&mut self, cache: &NodeCache) -> Option<EncodedWatchEvent> {
        match &self.phase {
            Phase::Backlog { sent_up_to } => Some(self.backlog_event(cache, sent_up_to.clone())),
            Phase::Shared { .. } => self
                .next_shared()
                .map(|chunk| EncodedWatchEvent::decode(chunk).unwrap_or_default()),
            Phase::Live => self.pending_event(),
        }
    }

    /// The next event to send, if any, as the encoded `WatchEvent`: the
    /// events of [`poll_event`](Self::poll_event), except that a stream
    /// that has sent nothing yet takes the cache's shared encoding of the
    /// whole backlog ([`NodeCache::shared_backlog`]) and sends it chunk by
    /// chunk, sharing those bytes with every other stream that opened at
    /// the same revision.
    pub fn poll_encoded(&mut self, cache: &mut NodeCache) -> Option<Bytes> {
        if self.phase == (Phase::Backlog { sent_up_to: None }) {
            let chunks = cache.shared_backlog(self.max_event_bytes);
            self.phase = Phase::Shared { chunks, next: 0 };
        }
        if let Phase::Shared { .. } = self.phase {
            return self.next_shared();
        }
        self.poll_event(cache)
            .map(|event| Bytes::from(event.encode_to_vec()))
    }

    /// The next chunk of the shared backlog; live after the last one.
    fn next_shared(&mut self) -> Option<Bytes> {
        let Phase::Shared { chunks, next } = &mut self.phase else {
            return None;
        };
        let chunk = chunks.get(*next).cloned();
        *next += 1;
        if *next >= chunks.len() {
            self.phase = Phase::Live;
        }
        chunk
    }

    /// The whole backlog of `cache` as [`poll_event`](Self::poll_event)
    /// would send it to a new stream, each event encoded.
    pub(super) fn encode_backlog(cache: &NodeCache, max_event_bytes: usize) -> Vec<Bytes> {
        let mut fresh = NodesWatch::new(max_event_bytes);
        let mut chunks = Vec::new();
        while let Phase::Backlog { sent_up_to } = &fresh.phase {
            let event = fresh.backlog_event(cache, sent_up_to.clone());
            chunks.push(Bytes::from(event.encode_to_vec()));
        }
        chunks
    }

    fn backlog_event(&mut self, cache: &NodeCache, after: Option<Arc<str>>) -> EncodedWatchEvent {
        let marker = Progress::LastBacklogged as i32;
        let budget = self
            .max_event_bytes
            .saturating_sub(EncodedWatchEvent::progress_len(marker));
        let mut event = EncodedWatchEvent::default();
        let mut size = 0;
        let mut last = after.clone();
        let mut remaining = cache.nodes_after(after.as_ref()).peekable();
        while let Some(node) = remaining.peek() {
            let len = EncodedWatchEvent::node_entry_len(node.encoded.len());
            if !event.nodes.is_empty() && size + len > budget {
                break;
            }
            size += len;
            event.nodes.push(node.encoded.clone());
            last = Some(node.id.clone());
            remaining.next();
        }
        if remaining.peek().is_none() {
            event.progress = marker;
            self.phase = Phase::Live;
        } else {
            self.phase = Phase::Backlog { sent_up_to: last };
        }
        event
    }

    fn pending_event(&mut self) -> Option<EncodedWatchEvent> {
        if self.pending.is_empty() {
            return None;
        }
        let mut event = EncodedWatchEvent::default();
        let mut size = 0;
        while let Some(entry) = self.pending.first_entry() {
            let len = match entry.get() {
                Pending::Put(bytes) => EncodedWatchEvent::node_entry_len(bytes.len()),
                Pending::Delete => EncodedWatchEvent::tombstone_entry_len(entry.key().len()),
            };
            let empty = event.nodes.is_empty() && event.tombstones.is_empty();
            if !empty && size + len > self.max_event_bytes {
                break;
            }
            size += len;
            let (id, pending) = entry.remove_entry();
            match pending {
                Pending::Put(bytes) => event.nodes.push(bytes),
                Pending::Delete => event.tombstones.push(id.to_string()),
            }
        }
        Some(event)
    }
}
