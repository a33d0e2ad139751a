//! Starting the election of an elected `metropolisd` (`--etcd`): the
//! [`StartElection`] both runtimes' daemons are given.

use std::sync::Arc;

use metropolis_core::leadership::Leadership;
use metropolis_core::ports::MonotonicClock;
use metropolis_core::service::elected::SharedLeadership;
use metropolis_host::clock::ProcessClock;
use metropolis_host::cluster::{Elected, ElectionHandle, StartElection};
use metropolis_host::upstream::LeaderConnector;

use super::{ElectionDriver, EtcdConfig, EtcdStore};

/// Connects to the `--etcd` endpoints and starts campaigning under
/// `--election-prefix` with this node's ID and advertised address. On a
/// tokio runtime the client and the election run on it; elsewhere (smol)
/// on a dedicated tokio runtime of one thread
/// ([`EtcdStore::connect_dedicated`]).
pub fn etcd_election() -> StartElection {
    Box::new(|config, pki, dial| {
        let etcd = EtcdConfig::new(config.cluster.etcd.clone());
        let leadership = config
            .cluster
            .leadership_config(pki.node_id(), config.listen);
        let prefix = config.cluster.election_prefix.clone();
        let on_tokio = tokio::runtime::Handle::try_current().is_ok();
        Box::pin(async move {
            let leadership = leadership?;
            let endpoints = etcd.endpoints.join(",");
            let store = if on_tokio {
                EtcdStore::connect(etcd).await
            } else {
                EtcdStore::connect_dedicated(etcd).await
            }
            .map_err(|e| format!("--etcd {endpoints}: {e}"))?;
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
