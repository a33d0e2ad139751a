//! Starting the election of an elected `metropolisd` (`--etcd`): the
//! [`StartElection`] both runtimes' daemons are given.

use std::sync::Arc;
use std::time::Duration;

use metropolis_core::leadership::Leadership;
use metropolis_core::ports::MonotonicClock;
use metropolis_core::service::elected::SharedLeadership;
use metropolis_host::clock::ProcessClock;
use metropolis_host::cluster::{Elected, ElectionHandle, StartElection};
use metropolis_host::upstream::LeaderConnector;

use super::{ElectionDriver, EtcdConfig, EtcdStore};

/// How long a starting daemon keeps trying to reach etcd.
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

/// Sleeps on whichever runtime runs the caller.
async fn pause(on_tokio: bool, duration: Duration) {
    if on_tokio {
        tokio::time::sleep(duration).await;
    } else {
        // Not on tokio (smol): a thread does the waiting.
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        std::thread::spawn(move || {
            std::thread::sleep(duration);
            let _ = tx.send(());
        });
        let _ = rx.await;
    }
}

/// Connects to the `--etcd` endpoints and starts campaigning under
/// `--election-prefix` with this node's ID and advertised address. On a
/// tokio runtime the client and the election run on it; elsewhere (smol)
/// on a dedicated tokio runtime of one thread
/// ([`EtcdStore::connect_dedicated`]).
pub fn etcd_election() -> StartElection {
    Box::new(|config, pki, dial| {
        let mut etcd = EtcdConfig::new(config.cluster.etcd.clone());
        etcd.request_timeout = Duration::from_secs(config.cluster.etcd_request_timeout.max(1));
        let leadership = config
            .cluster
            .leadership_config(pki.node_id(), config.listen);
        let prefix = config.cluster.election_prefix.clone();
        let on_tokio = tokio::runtime::Handle::try_current().is_ok();
        Box::pin(async move {
            let leadership = leadership?;
            let endpoints = etcd.endpoints.join(",");
            // etcd may still be starting (or electing its own leader):
            // keep trying for a while, saying so, before giving up.
            let started = std::time::Instant::now();
            let store = loop {
                let attempt = if on_tokio {
                    EtcdStore::connect(etcd.clone()).await
                } else {
                    EtcdStore::connect_dedicated(etcd.clone()).await
                };
                match attempt {
                    Ok(store) => break store,
                    Err(e) if started.elapsed() < CONNECT_PATIENCE => {
                        tracing::warn!(error = %e, "etcd not reachable yet; retrying");
                        pause(on_tokio, Duration::from_secs(1)).await;
                    }
                    Err(e) => {
                        return Err(format!(
                            "--etcd {endpoints}: {e} (still failing after {CONNECT_PATIENCE:?})"
                        )
                        .into());
                    }
                }
            };
            tracing::info!(
                etcd = %endpoints,
                advertise = %leadership.curator_address,
                lease_ttl_s = leadership.lease_ttl.as_secs(),
                "campaigning for curator leadership"
            );
            let clock = ProcessClock::new();
            let machine = Leadership::new(leadership, clock.now())?;
            let shared = SharedLeadership::new(
                machine,
                Arc::new(clock),
                Arc::new(LeaderConnector::new(dial)),
            );
            let driver = ElectionDriver::drive(store.clone(), prefix, shared.clone(), clock);
            Ok(ElectionHandle {
                elected: Elected {
                    store: Arc::new(store),
                    leadership: shared,
                },
                stop: Box::pin(driver.stop()),
            })
        })
    })
}
