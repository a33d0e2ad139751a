//! The store model's leases as the [`Leases`] port ([`ModelLeases`]), and
//! timers on a [`ManualClock`] ([`ManualTimer`]), for driving an election
//! over the model: in the test kit's executor with a hand-moved clock, or
//! in the simulator's runtime with its nodes' clocks.
//!
//! The store keeps leases on its own clock, the node reports them on its
//! own: the two need not agree. Leases expire when the caller says so
//! ([`ModelLeases::expire`]), as the store's own timer would. A route to
//! the store that can break ([`ModelLeases::with_route`]) makes grants
//! and revocations fail and renewals go unanswered while it is down.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use metropolis_core::ports::{GrantedLease, LeaseRenewal, Leases, MonotonicClock, Timer};
use metropolis_core::store::{LeaseId, StoreError};
use metropolis_core::time::Instant;

use crate::clock::ManualClock;
use crate::store::MemKv;

/// The leases of a [`MemKv`]'s model as one node uses them.
#[derive(Clone)]
pub struct ModelLeases {
    kv: MemKv,
    /// The store's clock: leases are granted, renewed and expired on it.
    store: Arc<dyn MonotonicClock>,
    /// The node's clock: grants and renewals are reported on it.
    clock: Arc<dyn MonotonicClock>,
    /// The node's timers: renewals wait on them.
    timer: Arc<dyn Timer>,
    /// Whether the node and the store reach each other now, and how long
    /// a call waits before it fails when they do not.
    route: Option<(Reachable, Duration)>,
}

/// Whether a node and its store reach each other (both ways) now.
pub type Reachable = Arc<dyn Fn() -> bool + Send + Sync>;

impl ModelLeases {
    /// `kv`'s leases, kept on `store`'s clock, for a node with `clock`
    /// and `timer`.
    pub fn new(
        kv: MemKv,
        store: Arc<dyn MonotonicClock>,
        clock: Arc<dyn MonotonicClock>,
        timer: Arc<dyn Timer>,
    ) -> ModelLeases {
        ModelLeases {
            kv,
            store,
            clock,
            timer,
            route: None,
        }
    }

    /// These leases over a route to the store that is up while
    /// `reachable` says so: while it is down, a grant or a revocation
    /// fails after `timeout` without reaching the store, and a renewal
    /// gets no answer (the next is sent a third of the TTL later, as
    /// etcd's client does), so the lease runs out on the store's clock.
    pub fn with_route(mut self, reachable: Reachable, timeout: Duration) -> ModelLeases {
        self.route = Some((reachable, timeout));
        self
    }

    /// Whether the store can be reached now.
    fn reachable(&self) -> bool {
        self.route.as_ref().is_none_or(|(up, _)| up())
    }

    /// Fails after the route's timeout if the store cannot be reached.
    async fn cross(&self) -> Result<(), StoreError> {
        match &self.route {
            Some((up, timeout)) if !up() => {
                let deadline = self.clock.now() + *timeout;
                self.timer.sleep_until(deadline).await;
                Err(StoreError::Unavailable(
                    "simulated: the store is unreachable".into(),
                ))
            }
            _ => Ok(()),
        }
    }

    /// The leases of `kv` with one hand-moved clock for store and node.
    pub fn manual(kv: MemKv, clock: ManualClock) -> ModelLeases {
        ModelLeases::new(
            kv,
            Arc::new(clock.clone()),
            Arc::new(clock.clone()),
            Arc::new(ManualTimer(clock)),
        )
    }

    /// Revokes every lease whose deadline passed on the store's clock
    /// (deleting its keys, as etcd does when a lease expires); the
    /// revoked IDs.
    pub fn expire(&self) -> Vec<LeaseId> {
        let now = self.store.now();
        self.kv.with(|m| m.handle_timeout(now))
    }
}

impl Leases for ModelLeases {
    /// Granted when first polled.
    fn grant(&self, ttl: Duration) -> BoxFuture<'static, Result<GrantedLease, StoreError>> {
        let this = self.clone();
        async move {
            let sent_at = this.clock.now();
            this.cross().await?;
            let id = this.kv.with(|m| m.lease_grant(0, ttl, this.store.now()))?;
            Ok(GrantedLease { id, ttl, sent_at })
        }
        .boxed()
    }

    /// Renews every third of the TTL (as etcd's client does) on the
    /// node's timers; ends after the first failure.
    fn keep_alive(
        &self,
        lease: &GrantedLease,
    ) -> BoxStream<'static, Result<LeaseRenewal, StoreError>> {
        let (this, id, every) = (self.clone(), lease.id, lease.ttl / 3);
        futures::stream::unfold((lease.sent_at, false), move |(last, ended)| {
            let this = this.clone();
            async move {
                if ended {
                    return None;
                }
                let mut due = last + every;
                loop {
                    this.timer.sleep_until(due).await;
                    if this.reachable() {
                        break;
                    }
                    // Unanswered: the next renewal goes out on schedule.
                    due = due + every;
                }
                let sent_at = this.clock.now();
                let renewed = this.kv.with(|m| m.lease_keep_alive(id, this.store.now()));
                let ended = renewed.is_err();
                let renewal = renewed.map(|ttl| LeaseRenewal { ttl, sent_at });
                Some((renewal, (sent_at, ended)))
            }
        })
        .boxed()
    }

    /// Revoked when first polled: a revocation dropped unpolled does
    /// nothing, as with a store over the network.
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'static, Result<(), StoreError>> {
        let this = self.clone();
        async move {
            this.cross().await?;
            this.kv.with(|m| m.lease_revoke(lease)).map(|_| ())
        }
        .boxed()
    }
}

/// Sleeps until a [`ManualClock`] reaches the deadline. It is polled, not
/// woken: it suits the test kit's executor
/// ([`Tasks`](crate::exec::Tasks)), which polls every task every round.
#[derive(Clone)]
pub struct ManualTimer(pub ManualClock);

impl Timer for ManualTimer {
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        let clock = self.0.clone();
        Box::pin(futures::future::poll_fn(move |_| {
            if clock.now() >= deadline {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        }))
    }
}
