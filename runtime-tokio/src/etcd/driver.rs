//! The election driver: runs a [`Leadership`] machine against an etcd
//! [`Election`], on the tokio runtime.
//!
//! One task owns the machine. It carries out the machine's actions
//! (`Campaign`: grant a lease, keep it alive, campaign with it; `Abandon`:
//! stop all that and revoke the lease), feeds back what etcd reports
//! (grants and renewals, lost leases, wins, the observed leader) with the
//! time as the machine sees it, wakes it at its timers, and publishes every
//! role change on a [`tokio::sync::watch`] channel. Routing requests and
//! fencing writes through the machine is the next step (issue 6); this
//! driver already gives every instance its role and the leader's address.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use metropolis_core::leadership::{
    Action, CampaignId, ConfigError, Event, Leadership, LeadershipConfig, LeaseGrant, Role,
};
use metropolis_core::time::Instant;
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

/// The machine's clock: offsets from the driver's start.
#[derive(Clone, Copy)]
struct Clock(std::time::Instant);

impl Clock {
    fn now(self) -> Instant {
        self.at(std::time::Instant::now())
    }

    fn at(self, t: std::time::Instant) -> Instant {
        Instant::from_offset(t.saturating_duration_since(self.0))
    }

    fn instant(self, t: Instant) -> std::time::Instant {
        self.0 + t.offset()
    }
}

/// A running election driver; see the [module docs](self).
pub struct ElectionDriver {
    roles: watch::Receiver<Role>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ElectionDriver {
    /// Starts campaigning under `prefix` of `store` as `config` says, on
    /// the current tokio runtime.
    pub fn spawn(
        store: EtcdStore,
        prefix: impl Into<Bytes>,
        config: LeadershipConfig,
    ) -> Result<ElectionDriver, ConfigError> {
        let clock = Clock(std::time::Instant::now());
        let machine = Leadership::new(config, clock.now())?;
        let (roles_tx, roles) = watch::channel(machine.role().clone());
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(store, prefix.into(), machine, clock, roles_tx, stopped));
        Ok(ElectionDriver {
            roles,
            stop: Some(stop),
            task,
        })
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
    /// a successor need not wait for the TTL. Resolves once done.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
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
    mut machine: Leadership,
    clock: Clock,
    roles: watch::Sender<Role>,
    mut stopped: oneshot::Receiver<()>,
) {
    let election = store.election(prefix);
    let (reports_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    // Aborted with the driver (campaign tasks are aborted when dropped).
    let mut campaigns: BTreeMap<CampaignId, Campaign> = BTreeMap::new();
    let mut observe = election.observe();
    let mut stopping = false;
    loop {
        while let Some(action) = machine.poll_action() {
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
        while let Some(event) = machine.poll_event() {
            if let Event::RoleChanged { role, .. } = event {
                tracing::info!(?role, "curator role changed");
                roles.send_replace(role);
            }
        }
        if stopping {
            return;
        }
        let timer = machine.poll_timeout().map(|t| clock.instant(t));
        let sleep = async {
            match timer {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            report = reports.recv() => match report {
                Some(Report::Granted(grant)) => machine.handle_lease_granted(clock.now(), grant),
                Some(Report::Lost(campaign)) => machine.handle_lease_lost(clock.now(), campaign),
                Some(Report::Won(campaign, key)) => {
                    machine.handle_campaign_won(clock.now(), campaign, key)
                }
                None => unreachable!("the driver holds a sender"),
            },
            observation = observe.next() => match observation {
                Some(Ok(Observation::Leader(leader))) => {
                    machine.handle_leader_observed(clock.now(), leader.key, &leader.value)
                }
                Some(Ok(Observation::Gone(key))) => machine.handle_leader_deleted(clock.now(), &key),
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
            _ = sleep => machine.handle_timeout(clock.now()),
            _ = &mut stopped => {
                machine.handle_shutdown(clock.now());
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
    clock: Clock,
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
