//! What a node view holds and what it hands out: the last state of each
//! node it handed out, a new stream's backlog buffered until its
//! `PROGRESS_LAST_BACKLOGGED` marker and then applied as a difference,
//! and the stream's updates with duplicates left out. Pure: events in,
//! [`NodeEvent`]s out; the view (`crate::view`) drives it.
//!
//! # What "older" means, and the guard
//!
//! States carry no revision on the wire. A state of a node is *older* than
//! another when the store replaced it before the other was written (in
//! the store's revision order). The view never hands out a state older
//! than one it handed out before, by construction rather than by
//! comparing states:
//!
//! 1. On one stream, the server delivers each node's states in increasing
//!    revision order (docs/spec/semantics.md, Curator.Watch), and the
//!    view passes them on in the order received.
//! 2. A stream the view gave up on (broken, timed out) is dropped at once:
//!    nothing it might still deliver is applied.
//! 3. A new stream contributes nothing until its whole backlog has
//!    arrived. That backlog is a snapshot at the new stream's start
//!    revision, which is after every revision the earlier stream
//!    delivered: those were committed before the reconnect began, and a
//!    curator serves a Watch only from a cache that holds every write
//!    acknowledged before it (the leader confirms it still leads, and a
//!    new term reads a fresh snapshot; docs/design.md, "Read your writes
//!    through the watch cache"). So each node's backlog state is the one
//!    it holds or a later one, and a node the view holds but the backlog
//!    lacks was deleted while the view was away: [`NodeEvent::Removed`].
//! 4. A state equal to the one held is never handed out again (a
//!    reconnect re-sends every node; a slow reader's coalescing may too).
//!
//! What the view cannot do is catch a server that breaks (3): it does not
//! keep older states to compare with (a node's roles may legitimately
//! return to an earlier value). `tests/tests/client_failover.rs` checks
//! the whole against real curators killed and restarted under writes.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use metropolis_proto::prelude::curator;

use crate::view::NodeEvent;

/// Where the current stream is.
#[derive(Debug)]
enum Phase {
    /// No stream is open.
    Closed,
    /// A stream is open and its backlog is arriving (buffered here).
    Backlog(BTreeMap<String, curator::Node>),
    /// The backlog was applied; updates follow.
    Live,
}

/// A node view's state.
#[derive(Debug)]
pub(crate) struct ViewState {
    /// The one node watched, if only one.
    only: Option<String>,
    /// The last state handed out of each node that exists.
    held: BTreeMap<String, curator::Node>,
    phase: Phase,
    /// Whether a backlog was applied before (then the next is a resync).
    synced: bool,
}

/// What one event did to the stream's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Nothing changed phase.
    Same,
    /// This event completed the backlog: the stream is live.
    BacklogDone,
    /// No stream was open: the event was dropped.
    Dropped,
}

impl ViewState {
    /// An empty view of every node, or of node `only`.
    pub(crate) fn new(only: Option<String>) -> ViewState {
        ViewState {
            only,
            held: BTreeMap::new(),
            phase: Phase::Closed,
            synced: false,
        }
    }

    /// A new stream opened: its backlog comes next.
    pub(crate) fn opened(&mut self) {
        self.phase = Phase::Backlog(BTreeMap::new());
    }

    /// The stream is gone: a partial backlog is dropped, nothing more is
    /// taken until the next [`opened`](Self::opened).
    pub(crate) fn closed(&mut self) {
        self.phase = Phase::Closed;
    }

    /// The nodes as last handed out.
    #[cfg(test)]
    pub(crate) fn held(&self) -> &BTreeMap<String, curator::Node> {
        &self.held
    }

    fn wanted(&self, id: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == id)
    }

    /// Takes one event of the current stream; what to hand out goes to
    /// `out`.
    pub(crate) fn handle(
        &mut self,
        event: curator::WatchEvent,
        out: &mut Vec<NodeEvent>,
    ) -> Applied {
        let last_backlogged =
            event.progress == curator::watch_event::Progress::LastBacklogged as i32;
        match &mut self.phase {
            Phase::Closed => Applied::Dropped,
            Phase::Backlog(backlog) => {
                for node in event.nodes {
                    if self.only.as_deref().is_none_or(|only| only == node.id) {
                        backlog.insert(node.id.clone(), node);
                    }
                }
                // A backlog has no tombstones; one is honoured all the same.
                for tombstone in event.node_tombstones {
                    backlog.remove(&tombstone.node_id);
                }
                if !last_backlogged {
                    return Applied::Same;
                }
                let backlog = std::mem::take(backlog);
                self.phase = Phase::Live;
                self.apply_backlog(backlog, out);
                Applied::BacklogDone
            }
            Phase::Live => {
                // A second marker on one stream breaks the contract; its
                // nodes are still updates.
                if last_backlogged {
                    tracing::warn!("a watch stream sent PROGRESS_LAST_BACKLOGGED twice");
                }
                for node in event.nodes {
                    if self.wanted(&node.id) {
                        self.put(node, out);
                    }
                }
                for tombstone in event.node_tombstones {
                    if self.held.remove(&tombstone.node_id).is_some() {
                        out.push(NodeEvent::Removed(tombstone.node_id));
                    }
                }
                Applied::Same
            }
        }
    }

    /// Hands out `node` unless it is the state held.
    fn put(&mut self, node: curator::Node, out: &mut Vec<NodeEvent>) {
        if self.held.get(&node.id) == Some(&node) {
            return;
        }
        self.held.insert(node.id.clone(), node.clone());
        out.push(NodeEvent::Changed(node));
    }

    /// A complete backlog as the difference from what is held: changed
    /// and new nodes, then nodes that are gone, then Synced or Resynced.
    fn apply_backlog(
        &mut self,
        backlog: BTreeMap<String, curator::Node>,
        out: &mut Vec<NodeEvent>,
    ) {
        let gone: Vec<String> = self
            .held
            .keys()
            .filter(|id| !backlog.contains_key(*id))
            .cloned()
            .collect();
        for node in backlog.into_values() {
            self.put(node, out);
        }
        for id in gone {
            self.held.remove(&id);
            out.push(NodeEvent::Removed(id));
        }
        out.push(if self.synced {
            NodeEvent::Resynced
        } else {
            NodeEvent::Synced
        });
        self.synced = true;
    }
}
