//! The campaign's clients: the workload runs through `metropolis-client`
//! (the library of issue 43, Deliver 1), re-exported here; the probes,
//! which are the checks' instruments rather than clients, open raw Watch
//! streams over tonic ([`RawWatches`]) so that each backlog is one stream
//! whose call and end they time themselves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use metropolis_client::{Backoff, Client, ClientConfig, NodeEvent, NodeView};
use metropolis_proto::prelude::curator::{
    WatchEvent, WatchRequest, curator_client::CuratorClient, watch_request::Kind,
};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;
use tokio::time::Instant;

/// A library client of `endpoints` with `tls`, attempts of at most
/// `call_timeout`, waits from 100 ms to 1 s seeded with `seed`.
pub fn client(
    endpoints: Vec<String>,
    tls: Arc<rustls::ClientConfig>,
    call_timeout: Duration,
    seed: u64,
) -> Result<Client, String> {
    let config = ClientConfig {
        endpoints,
        tls: Some(tls),
        call_timeout,
        backoff: Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            seed,
        },
    };
    Client::new(TokioRuntime::shared(), config).map_err(|e| format!("a client: {e}"))
}

/// Raw `Watch` streams, one HTTP/2 connection per endpoint, for probes.
#[derive(Clone)]
pub struct RawWatches {
    tls: Arc<rustls::ClientConfig>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl RawWatches {
    /// Watches made with `tls`.
    pub fn new(tls: Arc<rustls::ClientConfig>) -> RawWatches {
        RawWatches {
            tls,
            channels: Arc::default(),
        }
    }

    async fn channel(&self, endpoint: &str, deadline: Instant) -> Result<Channel, String> {
        if let Some(c) = lock(&self.channels).get(endpoint) {
            return Ok(c.clone());
        }
        let runtime = TokioRuntime::shared();
        let connecting = connect::tls(&runtime, endpoint, self.tls.clone());
        match tokio::time::timeout_at(deadline, connecting).await {
            Ok(Ok(c)) => {
                lock(&self.channels).insert(endpoint.to_string(), c.clone());
                Ok(c)
            }
            Ok(Err(e)) => Err(format!("connecting to {endpoint}: {e}")),
            Err(_) => Err(format!("connecting to {endpoint}: no answer in time")),
        }
    }

    /// Opens one `Watch` of `kind` on `endpoint` (no retry); a failure
    /// drops the connection, so the next probe dials afresh.
    pub async fn open(
        &self,
        endpoint: &str,
        kind: Kind,
        deadline: Instant,
    ) -> Result<tonic::Streaming<WatchEvent>, String> {
        let channel = self.channel(endpoint, deadline).await?;
        let mut curator = CuratorClient::with_origin(channel, Channel::origin());
        let opening = curator.watch(WatchRequest { kind: Some(kind) });
        let result = match tokio::time::timeout_at(deadline, opening).await {
            Ok(Ok(r)) => return Ok(r.into_inner()),
            Ok(Err(s)) => format!("{endpoint}: {:?}: {}", s.code(), s.message()),
            Err(_) => format!("{endpoint}: no answer in time"),
        };
        self.forget(endpoint);
        Err(result)
    }

    /// Drops the connection to `endpoint`.
    pub fn forget(&self, endpoint: &str) {
        lock(&self.channels).remove(endpoint);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
