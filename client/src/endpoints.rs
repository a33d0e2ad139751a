//! The curators a client knows: their addresses, one cached connection
//! each, and which one to try first (the last that answered; the next one
//! after a failure).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metropolis_transport::runtime::SharedRuntime;

use crate::connection::{Connection, dial};
use crate::error::{AttemptError, ClientError};

/// Where an endpoint is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// `host:port`, over TLS.
    Tcp(String),
    /// `unix:PATH`, a local socket (the daemon's, as its node).
    Unix(PathBuf),
}

impl Target {
    /// Parses `host:port` or `unix:PATH`.
    pub(crate) fn parse(endpoint: &str) -> Result<Target, ClientError> {
        let bad = |reason: &str| ClientError::BadEndpoint {
            endpoint: endpoint.to_string(),
            reason: reason.to_string(),
        };
        if let Some(path) = endpoint.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad("no socket path after unix:"));
            }
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        let Some((host, port)) = endpoint.rsplit_once(':') else {
            return Err(bad("no port"));
        };
        if host.is_empty() || host == "[]" {
            return Err(bad("no host"));
        }
        if host.contains(char::is_whitespace) {
            return Err(bad("the host contains white space"));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok(Target::Tcp(endpoint.to_string())),
            _ => Err(bad("the port is not a number from 1 to 65535")),
        }
    }
}

/// One endpoint and its cached connection (with the generation it was
/// cached at, so a failure forgets only the connection it happened on).
struct Slot {
    name: String,
    target: Target,
    cached: Mutex<Option<(u64, Connection)>>,
}

/// The endpoints of a client, shared by its clones.
pub(crate) struct Endpoints {
    slots: Vec<Slot>,
    current: AtomicUsize,
    generation: AtomicU64,
    runtime: SharedRuntime,
    tls: Option<Arc<rustls::ClientConfig>>,
    keepalive: Option<Duration>,
}

/// A connection and what to tell [`Endpoints::failed`] about it.
pub(crate) struct Leased {
    pub(crate) generation: u64,
    pub(crate) connection: Connection,
}

impl Endpoints {
    /// Checks and takes `endpoints`.
    pub(crate) fn new(
        endpoints: &[String],
        runtime: SharedRuntime,
        tls: Option<Arc<rustls::ClientConfig>>,
        keepalive: Option<Duration>,
    ) -> Result<Endpoints, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let mut slots = Vec::new();
        for e in endpoints {
            let e = e.trim();
            let target = Target::parse(e)?;
            if matches!(target, Target::Tcp(_)) && tls.is_none() {
                return Err(ClientError::NoTls {
                    endpoint: e.to_string(),
                });
            }
            slots.push(Slot {
                name: e.to_string(),
                target,
                cached: Mutex::new(None),
            });
        }
        Ok(Endpoints {
            slots,
            current: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            runtime,
            tls,
            keepalive,
        })
    }

    /// How many there are.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The endpoint to try next.
    pub(crate) fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.slots.len()
    }

    /// Endpoint `index` as given.
    pub(crate) fn name(&self, index: usize) -> &str {
        &self.slots[index % self.slots.len()].name
    }

    /// A connection to endpoint `index`: the cached one, or a new one.
    pub(crate) async fn connect(&self, index: usize) -> Result<Leased, AttemptError> {
        let slot = &self.slots[index % self.slots.len()];
        if let Some((generation, connection)) = lock(&slot.cached).clone() {
            return Ok(Leased {
                generation,
                connection,
            });
        }
        let connection = dial(
            &self.runtime,
            &slot.target,
            self.tls.clone(),
            self.keepalive,
        )
        .await
        .map_err(|e| match e.problem {
            Some(problem) => AttemptError::Misconfigured {
                endpoint: slot.name.clone(),
                problem,
                reason: e.reason,
            },
            None => AttemptError::Connect {
                endpoint: slot.name.clone(),
                reason: e.reason,
            },
        })?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *lock(&slot.cached) = Some((generation, connection.clone()));
        Ok(Leased {
            generation,
            connection,
        })
    }

    /// Records that an attempt on `index` (over the connection of
    /// `generation`, if one was made) failed with `failure`: a connection
    /// that failed is forgotten, and the next attempt goes to the next
    /// endpoint (unless another caller moved on already).
    pub(crate) fn failed(&self, index: usize, generation: Option<u64>, failure: &AttemptError) {
        let slot = &self.slots[index % self.slots.len()];
        let connection_failed = !matches!(failure, AttemptError::Status { .. });
        if connection_failed && let Some(generation) = generation {
            let mut cached = lock(&slot.cached);
            if cached.as_ref().is_some_and(|(g, _)| *g == generation) {
                *cached = None;
            }
        }
        let index = index % self.slots.len();
        let _ = self.current.compare_exchange(
            index,
            (index + 1) % self.slots.len(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Forgets the connection of `generation` to endpoint `index`, if it
    /// is still the cached one: it failed in a way no retry fixes.
    pub(crate) fn forget(&self, index: usize, generation: Option<u64>) {
        let slot = &self.slots[index % self.slots.len()];
        let mut cached = lock(&slot.cached);
        if let Some(generation) = generation
            && cached.as_ref().is_some_and(|(g, _)| *g == generation)
        {
            *cached = None;
        }
    }

    /// Forgets every cached connection.
    pub(crate) fn forget_all(&self) {
        for slot in &self.slots {
            *lock(&slot.cached) = None;
        }
    }

    /// Records that endpoint `index` answered: the next call starts there.
    pub(crate) fn answered(&self, index: usize) {
        self.current
            .store(index % self.slots.len(), Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Target::parse("127.0.0.1:7835"),
            Ok(Target::Tcp("127.0.0.1:7835".into()))
        );
        assert_eq!(
            Target::parse("[::1]:7835"),
            Ok(Target::Tcp("[::1]:7835".into()))
        );
        assert_eq!(
            Target::parse("unix:/run/m/curator.sock"),
            Ok(Target::Unix("/run/m/curator.sock".into()))
        );
        for bad in [
            "", "host", "host:", ":7835", "host:0", "host:x", "unix:", "a b:1",
        ] {
            let e = Target::parse(bad).expect_err(bad);
            assert!(
                e.to_string().contains("expected host:port or unix:PATH"),
                "{e}"
            );
        }
    }
}
