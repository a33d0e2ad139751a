//! The election driver: runs a [`SharedLeadership`] machine against an
//! [`Election`], over the store, lease, timer and spawner ports.
//!
//! One task drives the machine. It carries out the machine's actions
//! (`Campaign`: grant a lease, keep it alive, campaign with it; `Abandon`:
//! stop all that and revoke the lease), feeds back what the store reports
//! (grants and renewals, lost leases, wins, the observed leader) with the
//! time as the machine sees it, and wakes it at its timers. The daemon's
//! calls are routed, and its writes fenced, by the same machine.
//!
//! Written once: the daemon runs it over etcd on tokio or smol, the
//! simulator over its simulated store and time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::future::{AbortHandle, Abortable, BoxFuture};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};

use super::SharedLeadership;
use super::election::{Election, Observation};
use metropolis_core::leadership::{Action, CampaignId, ElectionKey, LeaseGrant};
use metropolis_core::ports::{KvStore, Leases, Spawner, Timer};
use metropolis_core::store::StoreError;
use metropolis_core::time::Instant;

/// How long a failed lease grant or a broken observation waits before the
/// next attempt.
pub const RETRY: Duration = Duration::from_secs(1);

/// What the driver needs from the world.
#[derive(Clone)]
pub struct ElectionPorts {
    /// The store the election's keys live in (not fenced).
    pub store: Arc<dyn KvStore>,
    /// Its leases.
    pub leases: Arc<dyn Leases>,
    /// Timers on the machine's clock.
    pub timer: Arc<dyn Timer>,
    /// Where the driver and its campaigns run.
    pub spawner: Arc<dyn Spawner>,
}

/// What a campaign's task reports to the driver.
enum Report {
    Granted(LeaseGrant),
    Lost(CampaignId),
    Won(CampaignId, ElectionKey),
}

/// A running election driver; see the [module docs](self).
pub struct ElectionDriver {
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<()>>,
    abort: AbortHandle,
}

impl ElectionDriver {
    /// Drives `leadership` (whose machine is fresh from
    /// [`Leadership::new`](metropolis_core::leadership::Leadership::new)) against
    /// the election under `prefix` of `ports.store`, as a task of
    /// `ports.spawner`.
    pub fn spawn(
        ports: ElectionPorts,
        prefix: impl Into<Bytes>,
        leadership: SharedLeadership,
    ) -> ElectionDriver {
        let (stop, stopped) = oneshot::channel();
        let (done_tx, done) = oneshot::channel();
        let (abort, registration) = AbortHandle::new_pair();
        let election = Election::new(ports.store.clone(), prefix);
        let spawner = ports.spawner.clone();
        let task = async move {
            drive(ports, election, leadership, stopped).await;
            let _ = done_tx.send(());
        };
        spawner.spawn(Box::pin(Abortable::new(task, registration).map(|_| ())));
        ElectionDriver {
            stop: Some(stop),
            done: Some(done),
            abort,
        }
    }

    /// Stops campaigning: a leader steps down and its lease is revoked, so
    /// a successor need not wait for the TTL; calls in flight end with
    /// "curator shutting down". Resolves once done.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }

    /// Stops everything at once without revoking anything, as a crash
    /// would: the lease then expires after its TTL.
    pub fn abort(self) {
        self.abort.abort();
    }
}

/// The task of one campaign, aborted when dropped.
struct Campaign(AbortHandle);

impl Drop for Campaign {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the driver waits for next.
enum Wake {
    Report(Report),
    Observed(Option<Result<Observation, StoreError>>),
    Timeout,
    Changed,
    Stop,
}

async fn drive(
    ports: ElectionPorts,
    election: Election,
    shared: SharedLeadership,
    stopped: oneshot::Receiver<()>,
) {
    let (reports_tx, mut reports) = mpsc::unbounded::<Report>();
    // Aborted with the driver (campaign tasks are aborted when dropped).
    let mut campaigns: BTreeMap<CampaignId, Campaign> = BTreeMap::new();
    let mut observe: Option<BoxStream<'static, Result<Observation, StoreError>>> =
        Some(election.observe());
    // When to observe again after the observation broke.
    let mut observe_again: Option<Instant> = None;
    let mut stopped = stopped.fuse();
    let mut stopping = false;
    loop {
        while let Some(action) = shared.poll_action() {
            match action {
                Action::Campaign {
                    campaign,
                    ttl,
                    value,
                } => {
                    let (abort, registration) = AbortHandle::new_pair();
                    let task = campaign_task(
                        ports.clone(),
                        election.clone(),
                        shared.clone(),
                        campaign,
                        ttl,
                        value,
                        reports_tx.clone(),
                    );
                    ports
                        .spawner
                        .spawn(Box::pin(Abortable::new(task, registration).map(|_| ())));
                    campaigns.insert(campaign, Campaign(abort));
                }
                Action::Abandon { campaign, lease } => {
                    campaigns.remove(&campaign);
                    if let Some(lease) = lease {
                        let revoke = ports.leases.revoke(lease);
                        if stopping {
                            let _ = revoke.await;
                        } else {
                            ports.spawner.spawn(Box::pin(revoke.map(|_| ())));
                        }
                    }
                }
            }
        }
        if stopping {
            return;
        }
        if observe.is_none() && observe_again.is_some_and(|t| t <= shared.now()) {
            observe = Some(election.observe());
            observe_again = None;
        }
        let deadline = match (shared.poll_timeout(), observe_again) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let wake = {
            let report = reports.next().map(|r| match r {
                Some(r) => Wake::Report(r),
                // The driver holds a sender: cannot end.
                None => Wake::Stop,
            });
            let observed = match &mut observe {
                Some(stream) => stream.next().map(Wake::Observed).boxed(),
                None => futures::future::pending().boxed(),
            };
            let sleep: BoxFuture<'static, ()> = match deadline {
                Some(t) => ports.timer.sleep_until(t),
                None => futures::future::pending().boxed(),
            };
            let changed = shared.changed();
            futures::select_biased! {
                _ = stopped => Wake::Stop,
                wake = report.fuse() => wake,
                wake = observed.fuse() => wake,
                () = sleep.fuse() => Wake::Timeout,
                // Any input (a call starting to wait) may move the timer.
                () = changed.fuse() => Wake::Changed,
            }
        };
        match wake {
            Wake::Report(Report::Granted(grant)) => {
                shared.input(|m, now| m.handle_lease_granted(now, grant))
            }
            Wake::Report(Report::Lost(campaign)) => {
                shared.input(|m, now| m.handle_lease_lost(now, campaign))
            }
            Wake::Report(Report::Won(campaign, key)) => {
                shared.input(|m, now| m.handle_campaign_won(now, campaign, key))
            }
            Wake::Observed(Some(Ok(Observation::Leader(leader)))) => {
                shared.input(|m, now| m.handle_leader_observed(now, leader.key, &leader.value))
            }
            Wake::Observed(Some(Ok(Observation::Gone(key)))) => {
                shared.input(|m, now| m.handle_leader_deleted(now, &key))
            }
            Wake::Observed(broken) => {
                if let Some(Err(e)) = broken {
                    tracing::warn!(error = %e, "observing the curator leader failed; retrying");
                }
                observe = None;
                observe_again = Some(shared.now() + RETRY);
            }
            Wake::Timeout => shared.input(|m, now| m.handle_timeout(now)),
            Wake::Changed => {}
            Wake::Stop => {
                shared.input(|m, now| m.handle_shutdown(now));
                stopping = true;
            }
        }
    }
}

/// One campaign: a lease (retried until granted), its keep-alive, and the
/// campaign call; everything reported to the driver.
async fn campaign_task(
    ports: ElectionPorts,
    election: Election,
    shared: SharedLeadership,
    campaign: CampaignId,
    ttl: Duration,
    value: Bytes,
    reports: mpsc::UnboundedSender<Report>,
) {
    let lease = loop {
        match ports.leases.grant(ttl).await {
            Ok(lease) => break lease,
            Err(e) => {
                tracing::warn!(error = %e, "granting the campaign lease failed; retrying");
                ports.timer.sleep_until(shared.now() + RETRY).await;
            }
        }
    };
    let grant = |ttl, sent_at| {
        Report::Granted(LeaseGrant {
            campaign,
            lease: lease.id,
            ttl,
            sent_at,
        })
    };
    let _ = reports.unbounded_send(grant(lease.ttl, lease.sent_at));
    let mut keep_alive = ports.leases.keep_alive(&lease);
    let renewals = {
        let reports = reports.clone();
        async move {
            while let Some(renewal) = keep_alive.next().await {
                match renewal {
                    Ok(r) => {
                        let _ = reports.unbounded_send(grant(r.ttl, r.sent_at));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the campaign lease ended");
                        break;
                    }
                }
            }
            let _ = reports.unbounded_send(Report::Lost(campaign));
        }
    };
    let won = async {
        match election.campaign(lease.id, value).await {
            Ok(key) => {
                let _ = reports.unbounded_send(Report::Won(campaign, key));
                // Stay: the keep-alive goes on while this task lives.
                futures::future::pending::<()>().await
            }
            Err(e) => {
                tracing::warn!(error = %e, "campaigning failed");
                let _ = reports.unbounded_send(Report::Lost(campaign));
            }
        }
    };
    futures::future::select(Box::pin(renewals), Box::pin(won)).await;
}
