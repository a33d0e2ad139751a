//! The store model's leases as the [`Leases`] port ([`MemLeases`]) and
//! timers on a [`ManualClock`] ([`ManualTimer`]), for driving an election
//! in memory.
//!
//! Both are polled, not woken: they suit the test kit's executor
//! ([`Tasks`](crate::exec::Tasks)), which polls every task every round.
//! Time passes only when the test advances the clock; leases expire when
//! the test calls [`MemLeases::expire`].

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::ports::{GrantedLease, LeaseRenewal, Leases, MonotonicClock, Timer};
use metropolis_core::store::{LeaseId, StoreError};
use metropolis_core::time::Instant;

use crate::clock::ManualClock;
use crate::store::MemKv;

/// The leases of a [`MemKv`]'s model, on `clock`'s time.
#[derive(Clone)]
pub struct MemLeases {
    kv: MemKv,
    clock: ManualClock,
}

impl MemLeases {
    /// The leases of `kv`, granted and renewed at `clock`'s time.
    pub fn new(kv: MemKv, clock: ManualClock) -> MemLeases {
        MemLeases { kv, clock }
    }

    /// Revokes every lease whose deadline passed (deleting its keys, as
    /// etcd does when a lease expires); the revoked IDs.
    pub fn expire(&self) -> Vec<LeaseId> {
        let now = self.clock.now();
        self.kv.with(|m| m.handle_timeout(now))
    }
}

impl Leases for MemLeases {
    /// Granted when first polled.
    fn grant(&self, ttl: Duration) -> BoxFuture<'static, Result<GrantedLease, StoreError>> {
        let (kv, clock) = (self.kv.clone(), self.clock.clone());
        Box::pin(futures::future::lazy(move |_| {
            let now = clock.now();
            kv.with(|m| m.lease_grant(0, ttl, now))
                .map(|id| GrantedLease {
                    id,
                    ttl,
                    sent_at: now,
                })
        }))
    }

    /// Renews every third of the TTL (as etcd's client does) once the
    /// clock has moved that far; ends after the first failure.
    fn keep_alive(
        &self,
        lease: &GrantedLease,
    ) -> BoxStream<'static, Result<LeaseRenewal, StoreError>> {
        let (kv, clock, id) = (self.kv.clone(), self.clock.clone(), lease.id);
        let every = lease.ttl / 3;
        let mut next = lease.sent_at + every;
        let mut ended = false;
        Box::pin(futures::stream::poll_fn(move |_| {
            if ended {
                return std::task::Poll::Ready(None);
            }
            let now = clock.now();
            if now < next {
                return std::task::Poll::Pending;
            }
            next = now + every;
            let renewed = kv.with(|m| m.lease_keep_alive(id, now));
            ended = renewed.is_err();
            std::task::Poll::Ready(Some(renewed.map(|ttl| LeaseRenewal { ttl, sent_at: now })))
        }))
    }

    /// Revoked when first polled: a revocation dropped unpolled does
    /// nothing, as with a store over the network.
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'static, Result<(), StoreError>> {
        let kv = self.kv.clone();
        Box::pin(futures::future::lazy(move |_| {
            kv.with(|m| m.lease_revoke(lease)).map(|_| ())
        }))
    }
}

/// Sleeps until a [`ManualClock`] reaches the deadline.
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
