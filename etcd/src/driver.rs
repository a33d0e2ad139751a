//! The election driver: runs a [`Leadership`] machine against an etcd
//! [`Election`], on the tokio runtime.
//!
//! One task drives the machine. It carries out the machine's actions
//! (`Campaign`: grant a lease, keep it alive, campaign with it; `Abandon`:
//! stop all that and revoke the lease), feeds back what etcd reports
//! (grants and renewals, lost leases, wins, the observed leader) with the
//! time as the machine sees it, wakes it at its timers, and publishes every
//! role change on a [`tokio::sync::watch`] channel. The machine is a
//! [`SharedLeadership`]: the daemon's calls are routed, and its writes
//! fenced, by the same machine the driver feeds.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;

use metropolis_core::leadership::{
    Action, CampaignId, ConfigError, Leadership, LeadershipConfig, LeaseGrant, Role,
};
use metropolis_core::ports::MonotonicClock;
use metropolis_core::service::elected::SharedLeadership;
use metropolis_core::service::forward::{Connector, Upstream};
use metropolis_node::clock::ProcessClock;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::{EtcdStore, Observation};

/// How long a failed lease grant or a broken observation waits before the
/// next attempt.
const RETRY: Duration = Duration::from_secs(1);

/// What a campaign's tasks report to the driver.
enum Report {
    Granted(LeaseGrant),
    Lost(CampaignId),
    Won(CampaignId, metropolis_core::leadership::ElectionKey),
}

/// A running election driver; see the [module docs](self).
pub struct ElectionDriver {
    leadership: SharedLeadership,
    roles: watch::Receiver<Role>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<()>>,
    task: tokio::task::AbortHandle,
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
    ) -> futures::future::BoxFuture<'static, Result<http::Response<tonic::body::Body>, String>>
    {
        let why = format!("{}: this instance does not forward calls", self.0);
        Box::pin(futures::future::ready(Err(why)))
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
        Ok(ElectionDriver::drive(store, prefix, shared, clock))
    }

    /// Drives `leadership` (whose machine is fresh from
    /// [`Leadership::new`] and reads time from `clock`) against the
    /// election under `prefix` of `store`, on the store's runtime (the
    /// caller's, or the dedicated one of
    /// [`EtcdStore::connect_dedicated`]).
    pub fn drive(
        store: EtcdStore,
        prefix: impl Into<Bytes>,
        leadership: SharedLeadership,
        clock: ProcessClock,
    ) -> ElectionDriver {
        let (roles_tx, roles) = watch::channel(leadership.role());
        leadership.on_role_change(move |_, role| {
            roles_tx.send_replace(role.clone());
        });
        let (stop, stopped) = oneshot::channel();
        let (done_tx, done) = oneshot::channel();
        let exec = store.exec.clone();
        let task = exec.spawn(run(
            store,
            prefix.into(),
            leadership.clone(),
            clock,
            stopped,
            done_tx,
        ));
        ElectionDriver {
            leadership,
            roles,
            stop: Some(stop),
            done: Some(done),
            task,
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
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }

    /// Stops everything at once without revoking anything, as a crash
    /// would: the lease then expires after its TTL. For tests.
    pub fn abort(self) {
        self.task.abort();
    }
}

/// The tasks of one campaign.
struct Campaign {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Campaign {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn run(
    store: EtcdStore,
    prefix: Bytes,
    shared: SharedLeadership,
    clock: ProcessClock,
    mut stopped: oneshot::Receiver<()>,
    done: oneshot::Sender<()>,
) {
    drive_machine(store, prefix, &shared, clock, &mut stopped).await;
    let _ = done.send(());
}

async fn drive_machine(
    store: EtcdStore,
    prefix: Bytes,
    shared: &SharedLeadership,
    clock: ProcessClock,
    stopped: &mut oneshot::Receiver<()>,
) {
    let election = store.election(prefix);
    let (reports_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    // Aborted with the driver (campaign tasks are aborted when dropped).
    let mut campaigns: BTreeMap<CampaignId, Campaign> = BTreeMap::new();
    let mut observe = election.observe();
    let mut stopping = false;
    loop {
        while let Some(action) = shared.poll_action() {
            match action {
                Action::Campaign {
                    campaign,
                    ttl,
                    value,
                } => {
                    let task = tokio::spawn(campaign_task(
                        store.clone(),
                        election.clone(),
                        clock,
                        campaign,
                        ttl,
                        value,
                        reports_tx.clone(),
                    ));
                    campaigns.insert(campaign, Campaign { tasks: vec![task] });
                }
                Action::Abandon { campaign, lease } => {
                    campaigns.remove(&campaign);
                    if let Some(lease) = lease {
                        let revoke = store.lease_revoke(lease);
                        if stopping {
                            let _ = revoke.await;
                        } else {
                            tokio::spawn(async move {
                                let _ = revoke.await;
                            });
                        }
                    }
                }
            }
        }
        if stopping {
            return;
        }
        let timer = shared.poll_timeout().map(|t| clock.instant(t));
        let sleep = async {
            match timer {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            report = reports.recv() => match report {
                Some(Report::Granted(grant)) => {
                    shared.input(|m, now| m.handle_lease_granted(now, grant))
                }
                Some(Report::Lost(campaign)) => {
                    shared.input(|m, now| m.handle_lease_lost(now, campaign))
                }
                Some(Report::Won(campaign, key)) => {
                    shared.input(|m, now| m.handle_campaign_won(now, campaign, key))
                }
                None => unreachable!("the driver holds a sender"),
            },
            observation = observe.next() => match observation {
                Some(Ok(Observation::Leader(leader))) => {
                    shared.input(|m, now| m.handle_leader_observed(now, leader.key, &leader.value))
                }
                Some(Ok(Observation::Gone(key))) => {
                    shared.input(|m, now| m.handle_leader_deleted(now, &key))
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "observing the curator leader failed; retrying");
                    tokio::time::sleep(RETRY).await;
                    observe = election.observe();
                }
                None => {
                    tokio::time::sleep(RETRY).await;
                    observe = election.observe();
                }
            },
            _ = sleep => shared.input(|m, now| m.handle_timeout(now)),
            // Any input (a call starting to wait) may move the timer.
            _ = shared.changed() => {}
            _ = &mut *stopped => {
                shared.input(|m, now| m.handle_shutdown(now));
                stopping = true;
            }
        }
    }
}

/// One campaign: a lease (retried until granted), its keep-alive, and the
/// campaign call; everything reported to the driver.
async fn campaign_task(
    store: EtcdStore,
    election: super::Election,
    clock: ProcessClock,
    campaign: CampaignId,
    ttl: Duration,
    value: Bytes,
    reports: mpsc::UnboundedSender<Report>,
) {
    let lease = loop {
        match store.lease_grant(ttl).await {
            Ok(lease) => break lease,
            Err(e) => {
                tracing::warn!(error = %e, "granting the campaign lease failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    let grant = |ttl, sent_at| {
        Report::Granted(LeaseGrant {
            campaign,
            lease: lease.id,
            ttl,
            sent_at: clock.at(sent_at),
        })
    };
    let _ = reports.send(grant(lease.ttl, lease.sent_at));
    let mut keep_alive = store.lease_keep_alive(&lease);
    let renewals = {
        let reports = reports.clone();
        async move {
            while let Some(renewal) = keep_alive.next().await {
                match renewal {
                    Ok(r) => {
                        let _ = reports.send(grant(r.ttl, r.sent_at));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the campaign lease ended");
                        break;
                    }
                }
            }
            let _ = reports.send(Report::Lost(campaign));
        }
    };
    let won = async {
        match election.campaign(lease.id, value).await {
            Ok(key) => {
                let _ = reports.send(Report::Won(campaign, key));
                // Stay: the keep-alive goes on while this task lives.
                std::future::pending::<()>().await
            }
            Err(e) => {
                tracing::warn!(error = %e, "campaigning failed");
                let _ = reports.send(Report::Lost(campaign));
            }
        }
    };
    tokio::select! {
        _ = renewals => {}
        _ = won => {}
    }
}
