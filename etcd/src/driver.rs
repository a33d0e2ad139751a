//! The election driver on etcd: core's
//! [`ElectionDriver`](metropolis_service::elected::driver::ElectionDriver)
//! over this crate's store and leases, with the store's tokio runtime for
//! its timers and tasks.
//!
//! The driving logic (campaign, keep-alive, observation, the machine's
//! timers) lives in core, written once over ports; this module only
//! supplies them ([`election_ports`]) and publishes every role change on
//! a [`tokio::sync::watch`] channel.

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::leadership::{ConfigError, Leadership, LeadershipConfig, Role};
use metropolis_core::ports::{self, MonotonicClock, Spawner, Timer};
use metropolis_core::store::{LeaseId, StoreError};
use metropolis_core::time::Instant;
use metropolis_node::clock::ProcessClock;
use metropolis_service::elected::SharedLeadership;
use metropolis_service::elected::driver::{ElectionDriver as Driver, ElectionPorts};
use metropolis_service::forward::{Connector, ForwardError, Upstream};
use metropolis_service::metrics::{MeteredLeases, Metrics};
use tokio::sync::watch;

use super::exec::Exec;
use super::{EtcdStore, GrantedLease};

/// A running election driver; see the [crate
/// documentation](crate#leases-and-the-election).
pub struct ElectionDriver {
    leadership: SharedLeadership,
    roles: watch::Receiver<Role>,
    driver: Driver,
}

/// Forwards nowhere: for drivers that only elect (tests, tools).
struct NoForwarding;

impl Connector for NoForwarding {
    fn connect(&self, _: &str, address: &str) -> Arc<dyn Upstream> {
        Arc::new(Unreachable(address.to_owned()))
    }
}

struct Unreachable(String);

impl Upstream for Unreachable {
    fn send(
        &self,
        _: http::Request<tonic::body::Body>,
    ) -> BoxFuture<'static, Result<http::Response<tonic::body::Body>, ForwardError>> {
        let why = ForwardError::NotForwarding {
            leader: self.0.clone(),
        };
        Box::pin(futures::future::ready(Err(why)))
    }
}

/// The ports core's election driver runs over: `store` and its leases,
/// timers and tasks on the store's runtime (the caller's, or the dedicated
/// one of [`EtcdStore::connect_dedicated`]), time read from `clock`; with
/// `metrics`, every lease request timed ([`MeteredLeases`]).
pub fn election_ports(
    store: &EtcdStore,
    clock: ProcessClock,
    metrics: Option<&Metrics>,
) -> ElectionPorts {
    let exec = store.exec.clone();
    let leases: Arc<dyn ports::Leases> = Arc::new(EtcdLeases {
        store: store.clone(),
        clock,
    });
    let leases: Arc<dyn ports::Leases> = match metrics {
        Some(metrics) => Arc::new(MeteredLeases::new(leases, Arc::new(clock), metrics)),
        None => leases,
    };
    ElectionPorts {
        store: Arc::new(store.clone()),
        leases,
        timer: Arc::new(ExecTimer {
            exec: exec.clone(),
            clock,
        }),
        spawner: Arc::new(ExecSpawner(exec)),
    }
}

impl ElectionDriver {
    /// Starts campaigning under `prefix` of `store` as `config` says, for
    /// an instance that only needs its role (it forwards nothing).
    pub fn spawn(
        store: EtcdStore,
        prefix: impl Into<Bytes>,
        config: LeadershipConfig,
    ) -> Result<ElectionDriver, ConfigError> {
        let clock = ProcessClock::new();
        let machine = Leadership::new(config, clock.now())?;
        let shared = SharedLeadership::new(machine, Arc::new(clock), Arc::new(NoForwarding));
        Ok(ElectionDriver::drive(store, prefix, shared, clock, None))
    }

    /// Drives `leadership` (whose machine is fresh from
    /// [`Leadership::new`] and reads time from `clock`) against the
    /// election under `prefix` of `store` (see [`election_ports`]), its
    /// lease requests recorded in `metrics` if given.
    pub fn drive(
        store: EtcdStore,
        prefix: impl Into<Bytes>,
        leadership: SharedLeadership,
        clock: ProcessClock,
        metrics: Option<&Metrics>,
    ) -> ElectionDriver {
        let (roles_tx, roles) = watch::channel(leadership.role());
        leadership.on_role_change(move |_, role| {
            roles_tx.send_replace(role.clone());
        });
        let driver = Driver::spawn(
            election_ports(&store, clock, metrics),
            prefix,
            leadership.clone(),
        );
        ElectionDriver {
            leadership,
            roles,
            driver,
        }
    }

    /// The shared machine this driver runs.
    pub fn leadership(&self) -> &SharedLeadership {
        &self.leadership
    }

    /// The current role.
    pub fn role(&self) -> Role {
        self.roles.borrow().clone()
    }

    /// Every role change, as it happens.
    pub fn roles(&self) -> watch::Receiver<Role> {
        self.roles.clone()
    }

    /// Stops campaigning: a leader steps down and its lease is revoked, so
    /// a successor need not wait for the TTL; calls in flight end with
    /// "curator shutting down". Resolves once done (on any executor).
    pub async fn stop(self) {
        self.driver.stop().await
    }

    /// Stops everything at once without revoking anything, as a crash
    /// would: the lease then expires after its TTL. For tests.
    pub fn abort(self) {
        self.driver.abort()
    }
}

/// etcd's leases as the [`ports::Leases`] port, times on `clock`.
struct EtcdLeases {
    store: EtcdStore,
    clock: ProcessClock,
}

impl ports::Leases for EtcdLeases {
    fn grant(
        &self,
        ttl: std::time::Duration,
    ) -> BoxFuture<'static, Result<ports::GrantedLease, StoreError>> {
        let clock = self.clock;
        self.store
            .lease_grant(ttl)
            .map(move |granted| {
                let lease = granted?;
                Ok(ports::GrantedLease {
                    id: lease.id,
                    ttl: lease.ttl,
                    sent_at: clock.at(lease.sent_at),
                })
            })
            .boxed()
    }

    fn keep_alive(
        &self,
        lease: &ports::GrantedLease,
    ) -> BoxStream<'static, Result<ports::LeaseRenewal, StoreError>> {
        use futures::StreamExt;
        let clock = self.clock;
        let lease = GrantedLease {
            id: lease.id,
            ttl: lease.ttl,
            sent_at: clock.instant(lease.sent_at),
        };
        self.store
            .lease_keep_alive(&lease)
            .map(move |renewal| {
                let renewal = renewal?;
                Ok(ports::LeaseRenewal {
                    ttl: renewal.ttl,
                    sent_at: clock.at(renewal.sent_at),
                })
            })
            .boxed()
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'static, Result<(), StoreError>> {
        self.store
            .lease_revoke(lease)
            .map(|r| r.map(|_| ()))
            .boxed()
    }
}

/// Sleeps on the store's tokio runtime.
struct ExecTimer {
    exec: Exec,
    clock: ProcessClock,
}

impl Timer for ExecTimer {
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        let at = self.clock.instant(deadline);
        self.exec
            .run(async move {
                tokio::time::sleep_until(at.into()).await;
                Ok(())
            })
            .map(|_| ())
            .boxed()
    }
}

/// Spawns on the store's tokio runtime.
struct ExecSpawner(Exec);

impl Spawner for ExecSpawner {
    fn spawn(&self, task: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) {
        self.0.spawn(task);
    }
}
