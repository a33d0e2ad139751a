//! Watch machines: the shared node cache and the per-stream machines that
//! turn its changes into `WatchEvent`s.
//!
//! One [`NodeCache`] holds every node of the cluster, each encoded once as
//! a `curator.api.Node` ([`CachedNode::encoded`]). Each open `Watch` stream
//! owns one small machine ([`NodesWatch`] for `NodesInCluster`,
//! [`NodeWatch`] for `NodeInCluster`) that remembers only what it still
//! has to send. Events are built by framing the cached bytes, so a change
//! is encoded once however many streams receive it.
//!
//! Driving contract, for every machine here:
//! 1. Feed each change of the cache to the cache **and** to every stream
//!    machine, atomically with respect to polling (one lock).
//! 2. Poll each stream machine with `poll_event(&cache)` until it returns
//!    `None`; poll again after the next change.

mod cache;
mod node;
mod nodes;

pub use cache::{CachedNode, NodeCache, NodeChange};
pub use node::NodeWatch;
pub use nodes::NodesWatch;

/// The largest encoded `WatchEvent` a stream sends: 2 MiB.
pub const MAX_EVENT_BYTES: usize = 2 * 1024 * 1024;

#[cfg(test)]
mod tests;
