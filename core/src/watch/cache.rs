//! The shared node cache.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::store::Revision;

/// One node as the cache holds it: encoded once, shared by reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedNode {
    /// The node's ID.
    pub id: Arc<str>,
    /// Store revision of this state of the node.
    pub revision: Revision,
    /// The node encoded as `curator.api.Node`.
    pub encoded: Bytes,
}

/// One change of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeChange {
    /// The node was created or changed.
    Put(CachedNode),
    /// The node was deleted.
    Delete {
        /// The node's ID.
        id: Arc<str>,
        /// Revision of the deletion.
        revision: Revision,
    },
}

impl NodeChange {
    /// The ID of the node that changed.
    pub fn id(&self) -> &Arc<str> {
        match self {
            NodeChange::Put(n) => &n.id,
            NodeChange::Delete { id, .. } => id,
        }
    }

    /// The revision of the change.
    pub fn revision(&self) -> Revision {
        match self {
            NodeChange::Put(n) => n.revision,
            NodeChange::Delete { revision, .. } => *revision,
        }
    }
}

/// Every node of the cluster as of [`NodeCache::revision`].
///
/// Inputs: [`handle_change`](Self::handle_change) for each store event in
/// revision order, [`handle_resync`](Self::handle_resync) with a fresh
/// snapshot (after the store compacted past what the cache needed). Both
/// return the changes that stream machines must be fed.
#[derive(Debug, Default)]
pub struct NodeCache {
    nodes: BTreeMap<Arc<str>, CachedNode>,
    revision: Revision,
    /// The backlog encoded for new streams at the current content, and the
    /// event size it was chunked to; dropped by every change.
    backlog: Option<(usize, Arc<[Bytes]>)>,
}

impl NodeCache {
    /// An empty cache at revision 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The revision the cache reflects.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cache holds no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node with this ID.
    pub fn get(&self, id: &str) -> Option<&CachedNode> {
        self.nodes.get(id)
    }

    /// Nodes with an ID strictly greater than `after` (all if `None`), in
    /// ID order.
    pub fn nodes_after<'a>(
        &'a self,
        after: Option<&'a Arc<str>>,
    ) -> impl Iterator<Item = &'a CachedNode> + 'a {
        use std::ops::Bound;
        let lower = match after {
            Some(id) => Bound::Excluded(id.clone()),
            None => Bound::Unbounded,
        };
        self.nodes.range((lower, Bound::Unbounded)).map(|(_, n)| n)
    }

    /// The backlog a new `NodesInCluster` stream sends, as encoded
    /// `WatchEvent`s of at most `max_event_bytes` each (the last carries
    /// `PROGRESS_LAST_BACKLOGGED`): encoded on first use after a change,
    /// then shared by every stream that opens before the next change.
    pub fn shared_backlog(&mut self, max_event_bytes: usize) -> Arc<[Bytes]> {
        match &self.backlog {
            Some((max, chunks)) if *max == max_event_bytes => chunks.clone(),
            _ => {
                let chunks: Arc<[Bytes]> =
                    super::NodesWatch::encode_backlog(self, max_event_bytes).into();
                self.backlog = Some((max_event_bytes, chunks.clone()));
                chunks
            }
        }
    }

    /// Applies one change. Changes older than the node's cached state are
    /// ignored (returns `false`); the cache revision only moves forward.
    pub fn handle_change(&mut self, change: &NodeChange) -> bool {
        let id = change.id();
        if let Some(current) = self.nodes.get(id.as_ref())
            && current.revision >= change.revision()
        {
            return false;
        }
        match change {
            NodeChange::Put(n) => {
                self.nodes.insert(n.id.clone(), n.clone());
            }
            NodeChange::Delete { id, .. } => {
                if self.nodes.remove(id.as_ref()).is_none() {
                    self.revision = self.revision.max(change.revision());
                    return false;
                }
            }
        }
        self.backlog = None;
        self.revision = self.revision.max(change.revision());
        true
    }

    /// Marks the cache as up to date with `revision` (a store batch whose
    /// events did not touch nodes).
    pub fn handle_progress(&mut self, revision: Revision) {
        self.revision = self.revision.max(revision);
    }

    /// Replaces the content with a snapshot taken at `revision`, returning
    /// the difference as changes (puts for new or changed nodes, deletes
    /// for vanished ones), in ID order. Deletes carry `revision`.
    pub fn handle_resync(
        &mut self,
        revision: Revision,
        snapshot: Vec<CachedNode>,
    ) -> Vec<NodeChange> {
        let mut fresh: BTreeMap<Arc<str>, CachedNode> =
            snapshot.into_iter().map(|n| (n.id.clone(), n)).collect();
        let mut changes = Vec::new();
        for (id, old) in &self.nodes {
            match fresh.get(id) {
                None => changes.push(NodeChange::Delete {
                    id: id.clone(),
                    revision,
                }),
                Some(new) if new.revision != old.revision || new.encoded != old.encoded => {
                    changes.push(NodeChange::Put(new.clone()))
                }
                Some(_) => {}
            }
        }
        for (id, new) in &fresh {
            if !self.nodes.contains_key(id) {
                changes.push(NodeChange::Put(new.clone()));
            }
        }
        changes.sort_by(|a, b| a.id().cmp(b.id()));
        std::mem::swap(&mut self.nodes, &mut fresh);
        self.backlog = None;
        self.revision = self.revision.max(revision);
        changes
    }
}
