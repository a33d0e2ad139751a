//! The `NodeInCluster` stream machine.

use std::sync::Arc;

use bytes::Bytes;
use metropolis_proto::wire::EncodedWatchEvent;

use super::{NodeCache, NodeChange};

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Nothing to send (the node does not exist, or its latest state went
    /// out).
    Quiet,
    /// The node's latest state is still to be sent.
    Put(Bytes),
    /// The node was deleted; its tombstone is still to be sent.
    Delete,
    /// The tombstone went out: silent until the client cancels.
    Done,
}

/// One `Watch(NodeInCluster{node_id})` stream: silent while the node does
/// not exist, then its states (latest first when the client is slow), then
/// one tombstone when it is deleted, then silent for good.
///
/// Driving: [`handle_change`](Self::handle_change) for every change applied
/// to the cache (under the same lock), [`poll_event`](Self::poll_event)
/// until `None`.
#[derive(Debug)]
pub struct NodeWatch {
    id: Arc<str>,
    state: State,
}

impl NodeWatch {
    /// A stream for node `id`, starting from the cache's current content.
    pub fn new(id: Arc<str>, cache: &NodeCache) -> Self {
        let state = match cache.get(&id) {
            Some(node) => State::Put(node.encoded.clone()),
            None => State::Quiet,
        };
        NodeWatch { id, state }
    }

    /// The watched node's ID.
    pub fn node_id(&self) -> &str {
        &self.id
    }

    /// Whether the tombstone has been sent.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Takes a change that was just applied to the cache. True when it
    /// replaced a state of the node the stream had not sent yet (the two
    /// were coalesced).
    pub fn handle_change(&mut self, change: &NodeChange) -> bool {
        // A deletion is terminal for this stream: a node re-created before
        // the client read the tombstone is not sent.
        if change.id() != &self.id || matches!(self.state, State::Delete | State::Done) {
            return false;
        }
        let replaced = matches!(self.state, State::Put(_));
        self.state = match change {
            NodeChange::Put(n) => State::Put(n.encoded.clone()),
            NodeChange::Delete { .. } => State::Delete,
        };
        replaced
    }

    /// The next event to send, if any.
    pub fn poll_event(&mut self) -> Option<EncodedWatchEvent> {
        match std::mem::replace(&mut self.state, State::Quiet) {
            State::Quiet => None,
            State::Put(bytes) => Some(EncodedWatchEvent {
                nodes: vec![bytes],
                ..Default::default()
            }),
            State::Delete => {
                self.state = State::Done;
                Some(EncodedWatchEvent {
                    tombstones: vec![self.id.to_string()],
                    ..Default::default()
                })
            }
            State::Done => {
                self.state = State::Done;
                None
            }
        }
    }
}
