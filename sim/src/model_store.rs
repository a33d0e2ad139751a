//! The store model as the shipped code's store inside the deterministic
//! [`runtime`](crate::runtime): the test kit's [`MemKv`] is the
//! [`KvStore`](metropolis_core::ports::KvStore) port (its watches wake
//! their tasks on every change), [`leases`] its leases as one node's
//! [`Leases`](metropolis_core::ports::Leases) port (the test kit's
//! [`ModelLeases`] on the runtime's clocks), and [`expire_leases`] the
//! store's own task that ends leases whose time ran out, on the store
//! node's clock (which need not agree with the nodes' clocks).

use std::time::Duration;

use std::sync::Arc;

use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_testkit::leases::ModelLeases;
use metropolis_testkit::store::MemKv;

use crate::links::{LINK_TIMEOUT, Links};
use crate::runtime::{Node, NodeId};

/// How often the store looks for expired leases.
pub const EXPIRY_CHECK: Duration = Duration::from_millis(50);

/// `kv`'s leases, kept on `store`'s clock, for `node`.
pub fn leases(kv: MemKv, store: Node, node: Node) -> ModelLeases {
    ModelLeases::new(kv, Arc::new(store), Arc::new(node.clone()), Arc::new(node))
}

/// [`leases`] for `node` (number `from`) across the [`Links`] to the
/// store's node (number `to`): while either way is cut, grants and
/// revocations fail after [`LINK_TIMEOUT`] and renewals go unanswered.
pub fn leases_across(
    kv: MemKv,
    store: Node,
    node: Node,
    links: Links,
    (from, to): (NodeId, NodeId),
) -> ModelLeases {
    let reachable = Arc::new(move || links.both_up(from, to));
    leases(kv, store, node).with_route(reachable, LINK_TIMEOUT)
}

/// A new store model served by node `store` of `runtime`: its lease
/// expiry runs there ([`expire_leases`]).
pub fn start(runtime: &crate::runtime::Runtime, store: crate::runtime::NodeId) -> MemKv {
    let kv = MemKv::new();
    runtime
        .node(store)
        .spawn(expire_leases(kv.clone(), runtime.node(store)));
    kv
}

/// The store's task: every [`EXPIRY_CHECK`] of `store`'s clock, revokes
/// the leases whose time ran out (deleting their keys).
pub async fn expire_leases(kv: MemKv, store: Node) {
    loop {
        store.sleep_until(store.now() + EXPIRY_CHECK).await;
        let now = store.now();
        kv.with(|m| m.handle_timeout(now));
    }
}
