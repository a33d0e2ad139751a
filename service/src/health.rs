//! `grpc.health.v1.Health` (Check and Watch), told from the truth: whether
//! this instance can serve the calls of its listener now.
//!
//! A [`HealthMonitor`] holds the conditions serving needs ([`Readiness`]:
//! a store that has not failed, a known leader) and wakes the Watch
//! streams when one may have changed: each condition wakes a waker it was
//! given once ([`Readiness::subscribe`]), so nothing polls and core needs
//! no clock. A [`HealthService`] answers for one listener: the overall
//! service `""` and each service routed there follow the monitor; the
//! listener's own local services (health, reflection) are SERVING while
//! the instance runs; any other name is unknown (Check: NOT_FOUND; Watch:
//! SERVICE_UNKNOWN, the stream kept open, as the health protocol says).

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use futures::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::debug::{Closable, Closer};
use super::elected::SharedLeadership;
use metropolis_core::leadership::Role;
use metropolis_core::quote::quoted;

/// A condition this instance needs to serve: the port the store and the
/// leadership report through (core's, so that the store implements it
/// without the service layer).
pub use metropolis_core::ports::Readiness;

/// An elected instance can serve while it leads or follows a known
/// leader (calls are forwarded to it); not while no leader is known
/// (calls are held, then fail Unavailable) nor once it stopped.
impl Readiness for SharedLeadership {
    fn unready(&self) -> Option<String> {
        match self.role() {
            Role::Leader(_) | Role::Sole | Role::Follower(_) => None,
            Role::Campaigning => Some("no curator leader is known".to_owned()),
            Role::Stopped => Some("curator shutting down".to_owned()),
        }
    }

    fn subscribe(&self, waker: Waker) {
        self.on_role_change(move |_, _| waker.wake_by_ref());
    }
}

/// Counts changes and wakes the Watch streams waiting for one.
#[derive(Default)]
struct Signal {
    state: Mutex<SignalState>,
}

#[derive(Default)]
struct SignalState {
    version: u64,
    next_id: u64,
    waiting: BTreeMap<u64, Waker>,
    shutting_down: bool,
}

impl Signal {
    fn lock(&self) -> MutexGuard<'_, SignalState> {
        // Only counters and a map change under the lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a change and wakes everyone waiting.
    fn changed(&self, shut_down: bool) {
        let waiting = {
            let mut state = self.lock();
            state.version += 1;
            state.shutting_down |= shut_down;
            std::mem::take(&mut state.waiting)
        };
        for waker in waiting.into_values() {
            waker.wake();
        }
    }

    /// Parks `waker` under `id` unless a change came after `version`;
    /// whether it was parked.
    fn park(&self, id: u64, version: u64, waker: &Waker) -> bool {
        let mut state = self.lock();
        if state.version != version {
            return false;
        }
        state.waiting.insert(id, waker.clone());
        true
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.changed(false);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.changed(false);
    }
}

/// The conditions this instance needs to serve, and the changes of their
/// state. Cheap to clone; clones (and monitors made from them with
/// [`with_condition`](Self::with_condition)) shut down together.
#[derive(Clone, Default)]
pub struct HealthMonitor {
    signal: Arc<Signal>,
    closer: Closer,
    conditions: Arc<Vec<Arc<dyn Readiness>>>,
}

impl HealthMonitor {
    /// A monitor without conditions: serving until shut down.
    pub fn new() -> HealthMonitor {
        HealthMonitor::default()
    }

    /// This monitor, also needing `condition`.
    pub fn with_condition(mut self, condition: Arc<dyn Readiness>) -> HealthMonitor {
        condition.subscribe(Waker::from(self.signal.clone()));
        Arc::make_mut(&mut self.conditions).push(condition);
        self
    }

    /// `Ok` while every condition holds and the instance runs; otherwise
    /// why it cannot serve.
    pub fn status(&self) -> Result<(), String> {
        if self.shutting_down() {
            return Err("this instance is shutting down".to_owned());
        }
        match self.conditions.iter().find_map(|c| c.unready()) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// From now on every service is NOT_SERVING, and every open Watch and
    /// reflection stream ends with Unavailable (so that a graceful
    /// shutdown need not wait for them). Call on shutdown.
    pub fn shut_down(&self) {
        self.signal.changed(true);
        self.closer.close_all();
    }

    fn shutting_down(&self) -> bool {
        self.signal.lock().shutting_down
    }

    /// Ends the open-ended streams of the services this monitor serves.
    pub(crate) fn closer(&self) -> &Closer {
        &self.closer
    }
}

/// The `grpc.health.v1.Health` service of one listener. Cheap to clone.
#[derive(Clone)]
pub struct HealthService {
    inner: Arc<Inner>,
}

struct Inner {
    monitor: HealthMonitor,
    /// The listener's routed services: they follow the monitor.
    served: BTreeSet<String>,
    /// Services the instance answers itself: serving while it runs.
    local: BTreeSet<String>,
}

impl HealthService {
    /// Answers for `""` and `served` (the listener's routed services) from
    /// `monitor`, and for `local` (services every instance answers itself)
    /// with SERVING while it runs.
    pub fn new<S: Into<String>, L: Into<String>>(
        monitor: HealthMonitor,
        served: impl IntoIterator<Item = S>,
        local: impl IntoIterator<Item = L>,
    ) -> HealthService {
        let mut served: BTreeSet<String> = served.into_iter().map(Into::into).collect();
        served.insert(String::new());
        HealthService {
            inner: Arc::new(Inner {
                monitor,
                served,
                local: local.into_iter().map(Into::into).collect(),
            }),
        }
    }

    /// The tonic server.
    pub fn server(&self) -> HealthServer<HealthService> {
        HealthServer::new(self.clone())
    }

    /// The status of `service`; `None`: unknown here.
    fn status_of(&self, service: &str) -> Option<ServingStatus> {
        let serving = if self.inner.served.contains(service) {
            self.inner.monitor.status().is_ok()
        } else if self.inner.local.contains(service) {
            !self.inner.monitor.shutting_down()
        } else {
            return None;
        };
        Some(match serving {
            true => ServingStatus::Serving,
            false => ServingStatus::NotServing,
        })
    }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &request.get_ref().service;
        match self.status_of(service) {
            Some(status) => Ok(Response::new(HealthCheckResponse {
                status: status.into(),
            })),
            None => Err(Status::not_found(format!(
                "unknown service {}",
                quoted(service)
            ))),
        }
    }

    type WatchStream = Closable<HealthWatch>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let id = {
            let mut state = self.inner.monitor.signal.lock();
            state.next_id += 1;
            state.next_id
        };
        let watch = HealthWatch {
            service: self.clone(),
            name: request.into_inner().service,
            sent: None,
            id,
        };
        Ok(Response::new(self.inner.monitor.closer.wrap(watch)))
    }
}

/// The response stream of Watch: the current status at once, then every
/// change of it. It ends only when the caller goes away or the monitor
/// shuts down.
pub struct HealthWatch {
    service: HealthService,
    name: String,
    sent: Option<ServingStatus>,
    id: u64,
}

impl Stream for HealthWatch {
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let signal = this.service.inner.monitor.signal.clone();
        loop {
            // The version is read before the status: a change after the
            // read bumps it, so parking below fails and we look again.
            let version = signal.lock().version;
            let status = this
                .service
                .status_of(&this.name)
                .unwrap_or(ServingStatus::ServiceUnknown);
            if this.sent != Some(status) {
                this.sent = Some(status);
                return Poll::Ready(Some(Ok(HealthCheckResponse {
                    status: status.into(),
                })));
            }
            if signal.park(this.id, version, cx.waker()) {
                return Poll::Pending;
            }
        }
    }
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        let signal = &self.service.inner.monitor.signal;
        signal.lock().waiting.remove(&self.id);
    }
}
