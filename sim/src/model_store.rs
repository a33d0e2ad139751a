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

/// Whether the store's member runs (answers and keeps time for its
/// leases) now.
pub type Running = Arc<dyn Fn() -> bool + Send + Sync>;

/// [`leases`] for `node` (number `from`) across the [`Links`] to the
/// store's node (number `to`), from a member that runs while `running`
/// says so: while either way is cut or the member does not run, grants
/// and revocations fail after [`LINK_TIMEOUT`] and renewals go
/// unanswered.
pub fn leases_across(
    kv: MemKv,
    store: Node,
    node: Node,
    (links, running): (Links, Running),
    (from, to): (NodeId, NodeId),
) -> ModelLeases {
    let reachable = Arc::new(move || links.both_up(from, to) && running());
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
    expire_while_running(kv, store, Arc::new(|| true)).await;
}

/// [`expire_leases`], while the member runs (a paused or down member
/// expires nothing; what ran out meanwhile expires when it runs again).
pub async fn expire_while_running(kv: MemKv, store: Node, running: Running) {
    loop {
        store.sleep_until(store.now() + EXPIRY_CHECK).await;
        if running() {
            let now = store.now();
            kv.with(|m| m.handle_timeout(now));
        }
    }
}

/// Gives every lease of `kv` a fresh TTL from now on `store`'s clock, as
/// a restarted etcd member does.
pub fn extend_leases(kv: &MemKv, store: &Node) {
    let now = store.now();
    kv.with(|m| {
        for lease in m.leases() {
            let _ = m.lease_keep_alive(lease, now);
        }
    });
}
