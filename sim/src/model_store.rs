//! The store model as the shipped code's store inside the deterministic
//! [`runtime`](crate::runtime): the test kit's [`MemKv`] is the
//! [`KvStore`](metropolis_core::ports::KvStore) port (its watches wake
//! their tasks on every change), [`ModelLeases`] its leases as the
//! [`Leases`] port of one node, and [`expire_leases`] the store's own task
//! that ends leases whose time ran out, on the store node's clock (which
//! need not agree with the nodes' clocks).

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use metropolis_core::ports::{GrantedLease, LeaseRenewal, Leases, MonotonicClock, Timer};
use metropolis_core::store::{LeaseId, StoreError};
use metropolis_testkit::store::MemKv;

use crate::runtime::Node;

/// How often the store looks for expired leases.
pub const EXPIRY_CHECK: Duration = Duration::from_millis(50);

/// The store's leases as one node uses them: granted and renewed on the
/// store's clock, reported on the node's.
#[derive(Clone)]
pub struct ModelLeases {
    kv: MemKv,
    /// The store's node (its clock is the leases' clock).
    store: Node,
    /// The node using the leases.
    node: Node,
}

impl ModelLeases {
    /// `kv`'s leases, kept on `store`'s clock, for `node`.
    pub fn new(kv: MemKv, store: Node, node: Node) -> ModelLeases {
        ModelLeases { kv, store, node }
    }
}

impl Leases for ModelLeases {
    fn grant(&self, ttl: Duration) -> BoxFuture<'static, Result<GrantedLease, StoreError>> {
        let (kv, store, node) = (self.kv.clone(), self.store.clone(), self.node.clone());
        async move {
            let sent_at = node.now();
            let id = kv.with(|m| m.lease_grant(0, ttl, store.now()))?;
            Ok(GrantedLease { id, ttl, sent_at })
        }
        .boxed()
    }

    /// Renews every third of the TTL on the node's clock.
    fn keep_alive(
        &self,
        lease: &GrantedLease,
    ) -> BoxStream<'static, Result<LeaseRenewal, StoreError>> {
        let (kv, store, node) = (self.kv.clone(), self.store.clone(), self.node.clone());
        let (id, every) = (lease.id, lease.ttl / 3);
        let start = (lease.sent_at, false);
        futures::stream::unfold(start, move |(last, ended)| {
            let (kv, store, node) = (kv.clone(), store.clone(), node.clone());
            async move {
                if ended {
                    return None;
                }
                node.sleep_until(last + every).await;
                let sent_at = node.now();
                let renewed = kv.with(|m| m.lease_keep_alive(id, store.now()));
                let ended = renewed.is_err();
                Some((
                    renewed.map(|ttl| LeaseRenewal { ttl, sent_at }),
                    (sent_at, ended),
                ))
            }
        })
        .boxed()
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'static, Result<(), StoreError>> {
        let kv = self.kv.clone();
        async move { kv.with(|m| m.lease_revoke(lease)).map(|_| ()) }.boxed()
    }
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
