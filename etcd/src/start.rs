//! Starting the election of an elected `metropolisd` (`--etcd`): the
//! [`StartElection`] both runtimes' daemons are given.

use std::sync::Arc;
use std::time::Duration;

use metropolis_core::curator::{CLUSTER_PREFIX, NODES_PREFIX};
use metropolis_core::leadership::Leadership;
use metropolis_core::ports::MonotonicClock;
use metropolis_node::clock::ProcessClock;
use metropolis_node::cluster::{Elected, ElectionHandle, StartElection};
use metropolis_service::MACHINES_PREFIX;
use metropolis_service::elected::SharedLeadership;
use metropolis_transport::upstream::LeaderConnector;

use metropolis_core::quote::quoted;

use super::convert::Refusal;
use super::election::election_prefix;
use super::exec::Exec;
use super::{ConnectFailure, ElectionDriver, EtcdConfig, EtcdStore};

/// How long a starting daemon keeps trying to reach etcd.
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

/// Attempts in a row over TLS that etcd closes after the connection was
/// made before that counts as etcd refusing the client's certificate.
/// TLS 1.3 checks a client certificate after the client's side of the
/// handshake is done: etcd's alert often arrives, but may lose the race
/// with the client's first write, which then finds the connection closed.
const CLOSED_IS_REFUSED: u32 = 3;

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

/// What to check when etcd refused this daemon, by the flags to fix.
fn hint(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::Tls => {
            "the TLS handshake with etcd failed: --etcd-cacert must hold the CA of etcd's \
             server certificates (which must name the endpoint's host), and an etcd run with \
             --client-cert-auth needs --etcd-cert and --etcd-key signed by its \
             --trusted-ca-file"
        }
        Refusal::Credentials => "etcd refused --etcd-user: wrong user name or password",
        Refusal::NoUser => {
            "etcd's authentication is on and this daemon named no user: give --etcd-user \
             (or a client certificate whose common name is an etcd user)"
        }
        Refusal::Permission => {
            "the etcd user (--etcd-user, or else the common name of --etcd-cert) lacks a \
             permission: its roles need readwrite on the prefixes /nodes/, /machines/, /cluster/ \
             and --election-prefix"
        }
    }
}

/// Connects to the `--etcd` endpoints (over TLS and as the etcd user the
/// `--etcd-*` flags name), checks that it may read and write its
/// prefixes, and starts campaigning under `--election-prefix` with this
/// node's ID and advertised address. On a tokio runtime the client and
/// the election run on it; elsewhere (smol) on a dedicated tokio runtime
/// of one thread ([`EtcdStore::connect_dedicated`]). etcd refusing the
/// daemon (TLS, user, permissions) fails the start at once; etcd not
/// answering is retried for 30 s.
pub fn etcd_election() -> StartElection {
    Box::new(|config, pki, dial, metrics| {
        let access = config.cluster.etcd_access();
        let mut etcd = EtcdConfig::new(config.cluster.etcd.clone());
        etcd.request_timeout = Duration::from_secs(config.cluster.etcd_request_timeout.max(1));
        let leadership = config
            .cluster
            .leadership_config(pki.node_id(), config.listen);
        let prefix = config.cluster.election_prefix.clone();
        let on_tokio = tokio::runtime::Handle::try_current().is_ok();
        Box::pin(async move {
            let leadership = leadership?;
            let etcd = etcd.with_access(access?);
            let endpoints = etcd.endpoints.join(",");
            // What the curator reads and writes: checked when connecting,
            // so that a user without these permissions (or none at all)
            // is refused at the start rather than at the first call.
            let prefixes = vec![
                bytes::Bytes::from_static(NODES_PREFIX),
                bytes::Bytes::from_static(MACHINES_PREFIX),
                bytes::Bytes::from_static(CLUSTER_PREFIX),
                election_prefix(prefix.clone().into()),
            ];
            // etcd may still be starting (or electing its own leader):
            // keep trying for a while, saying so, before giving up.
            let started = std::time::Instant::now();
            let mut closed = 0;
            let store = loop {
                let attempt = async {
                    let exec = if on_tokio {
                        Exec::current()
                    } else {
                        Exec::dedicated()
                    }
                    .map_err(ConnectFailure::other)?;
                    let store = EtcdStore::connect_on(exec, etcd.clone()).await?;
                    store.check_access(prefixes.clone()).await?;
                    Ok::<_, ConnectFailure>(store)
                };
                match attempt.await {
                    Ok(store) => break store,
                    Err(ConnectFailure {
                        error,
                        refused: Some(refusal),
                        ..
                    }) => {
                        return Err(format!(
                            "--etcd {}: {}: {error}",
                            quoted(&endpoints),
                            hint(refusal)
                        )
                        .into());
                    }
                    Err(f) if f.closed && etcd.tls.is_some() && closed + 1 >= CLOSED_IS_REFUSED => {
                        return Err(format!(
                            "--etcd {}: {} (etcd closed every connection right after it was \
                             made, {CLOSED_IS_REFUSED} times in a row): {}",
                            quoted(&endpoints),
                            hint(Refusal::Tls),
                            f.error
                        )
                        .into());
                    }
                    Err(f) if started.elapsed() < CONNECT_PATIENCE => {
                        closed = if f.closed { closed + 1 } else { 0 };
                        tracing::warn!(error = %f.error, "etcd not reachable yet; retrying");
                        pause(on_tokio, Duration::from_secs(1)).await;
                    }
                    Err(f) => {
                        return Err(format!(
                            "--etcd {}: {} (still failing after {CONNECT_PATIENCE:?})",
                            quoted(&endpoints),
                            f.error
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
            let driver = ElectionDriver::drive(
                store.clone(),
                prefix,
                shared.clone(),
                clock,
                metrics.as_ref(),
            );
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
