//! The service side of an elected curator instance: one [`Leadership`]
//! machine shared by the election port (a runtime task) and every call.
//!
//! - [`SharedLeadership`] owns the machine behind a lock, reads the time
//!   from a [`MonotonicClock`], and hands each machine output to whom it
//!   concerns: routes and cancellations to the calls, role changes to the
//!   observers, actions and timers to the election port.
//! - Its [`Routing`] implementation routes every call through the machine
//!   ([`Router::with_routing`](super::Router::with_routing)).
//! - [`FencedStore`] is the [`KvStore`](metropolis_core::ports::KvStore) the services of an elected
//!   instance write through: every transaction carries the leader's fence.

pub mod driver;
pub mod election;
mod fenced;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::BoxFuture;

pub use self::fenced::FencedStore;
use super::forward::{Connector, Destination, LeaderTerm, Routed, Routing, Upstream};
use metropolis_core::leadership::{
    Action, Epoch, Event, Leadership, LeadershipError, RequestId, Role, Route,
};
use metropolis_core::ports::MonotonicClock;
use metropolis_core::time::Instant;

/// Called with every new role and its epoch.
pub type RoleObserver = Arc<dyn Fn(Epoch, &Role) + Send + Sync>;

/// A [`Leadership`] machine shared by the election port and the calls of
/// one curator instance.
///
/// # Driving contract
///
/// The election port (one task of the runtime) drives the machine's
/// election side:
/// - after [`SharedLeadership::new`] and after each wake-up, it drains
///   [`poll_action`](Self::poll_action) until `None` and carries the
///   actions out;
/// - it feeds what the store reports through [`input`](Self::input)
///   (`|machine, now| machine.handle_lease_granted(now, grant)`, ...);
/// - it sleeps until the earliest of: [`poll_timeout`](Self::poll_timeout)
///   (then `input(|m, now| m.handle_timeout(now))`), a report of its own,
///   and [`changed`](Self::changed), which resolves after any input from
///   anyone (a call that starts waiting moves the timer).
///
/// Calls enter through [`Routing::route`] and, for writes, through
/// [`FencedStore`]; both are inputs too. Every input drains the machine's
/// events at once: routes and cancellations go to their calls, role
/// changes to the [observers](Self::on_role_change) (called outside the
/// lock, in order).
#[derive(Clone)]
pub struct SharedLeadership {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    clock: Arc<dyn MonotonicClock>,
    connector: Arc<dyn Connector>,
    /// Serialises observer calls so they see role changes in order.
    observing: Mutex<()>,
}

struct State {
    machine: Leadership,
    calls: BTreeMap<RequestId, Call>,
    /// The upstream to the current leader, reused by every forwarded call.
    upstream: Option<(String, String, Arc<dyn Upstream>)>,
    observers: Vec<RoleObserver>,
    changed: bool,
    port: Option<Waker>,
}

/// What a routed call waits on.
struct Call {
    route: Option<oneshot::Sender<Result<Destination, LeadershipError>>>,
    cancel: Option<oneshot::Sender<LeadershipError>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every mutation under the lock is a machine input followed by a full
    // drain, so a panic mid-way leaves nothing half-done that matters.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl SharedLeadership {
    /// Shares `machine` (fresh from [`Leadership::new`]), reading time from
    /// `clock` and reaching leaders through `connector`.
    pub fn new(
        machine: Leadership,
        clock: Arc<dyn MonotonicClock>,
        connector: Arc<dyn Connector>,
    ) -> SharedLeadership {
        SharedLeadership {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    machine,
                    calls: BTreeMap::new(),
                    upstream: None,
                    observers: Vec::new(),
                    changed: true,
                    port: None,
                }),
                clock,
                connector,
                observing: Mutex::new(()),
            }),
        }
    }

    /// The time on the machine's timeline.
    pub fn now(&self) -> Instant {
        self.inner.clock.now()
    }

    /// Feeds the machine one input, `f(machine, now)`, then hands out its
    /// events.
    pub fn input<R>(&self, f: impl FnOnce(&mut Leadership, Instant) -> R) -> R {
        self.inner.input(f)
    }

    /// The next action for the election port.
    pub fn poll_action(&self) -> Option<Action> {
        lock(&self.inner.state).machine.poll_action()
    }

    /// When the election port must call `handle_timeout` next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        lock(&self.inner.state).machine.poll_timeout()
    }

    /// Resolves once an input happened since it last resolved.
    pub fn changed(&self) -> Changed {
        Changed {
            inner: self.inner.clone(),
        }
    }

    /// The current role.
    pub fn role(&self) -> Role {
        lock(&self.inner.state).machine.role().clone()
    }

    /// The current role's epoch.
    pub fn epoch(&self) -> Epoch {
        lock(&self.inner.state).machine.epoch()
    }

    /// How many calls the instance keeps a route or a cancellation for:
    /// those waiting for a route and those routed and not finished (nor
    /// cancelled). Back to 0 once every call is gone; a debug endpoint
    /// can report it next to the machine's `waiting` and `in_flight`.
    pub fn open_calls(&self) -> usize {
        lock(&self.inner.state).calls.len()
    }

    /// Calls `observer` with every role change from now on (not with the
    /// current role). It runs outside the machine's lock but must not
    /// block.
    pub fn on_role_change(&self, observer: impl Fn(Epoch, &Role) + Send + Sync + 'static) {
        lock(&self.inner.state).observers.push(Arc::new(observer));
    }
}

impl Inner {
    fn input<R>(&self, f: impl FnOnce(&mut Leadership, Instant) -> R) -> R {
        self.apply(|state, now| f(&mut state.machine, now))
    }

    /// Runs `f` on the state (a machine input, possibly with call
    /// bookkeeping), then hands out the machine's events.
    fn apply<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let (result, changes, observers) = {
            let mut state = lock(&self.state);
            let result = f(&mut state, self.clock.now());
            let changes = self.dispatch(&mut state);
            state.changed = true;
            if let Some(waker) = state.port.take() {
                waker.wake();
            }
            let observers = if changes.is_empty() {
                Vec::new()
            } else {
                state.observers.clone()
            };
            (result, changes, observers)
        };
        if !changes.is_empty() {
            let _order = self.observing.lock().unwrap_or_else(|e| e.into_inner());
            for (epoch, role) in &changes {
                tracing::info!("curator role changed: {role} (epoch {})", epoch.get());
                for observer in &observers {
                    observer(*epoch, role);
                }
            }
        }
        result
    }

    /// Hands every pending machine event to its call; returns the role
    /// changes.
    fn dispatch(&self, state: &mut State) -> Vec<(Epoch, Role)> {
        let mut changes = Vec::new();
        while let Some(event) = state.machine.poll_event() {
            match event {
                Event::Routed { request, route } => {
                    let outcome = match route {
                        Route::Serve => {
                            Ok(Destination::Serve(LeaderTerm(state.machine.epoch().get())))
                        }
                        Route::Forward { node_id, address } => {
                            Ok(Destination::Forward(self.upstream(state, node_id, address)))
                        }
                        Route::Wait { .. } => continue,
                        Route::Reject(e) => Err(e),
                    };
                    let rejected = outcome.is_err();
                    if let Some(call) = state.calls.get_mut(&request)
                        && let Some(route) = call.route.take()
                    {
                        let _ = route.send(outcome);
                    }
                    if rejected {
                        state.calls.remove(&request);
                    }
                }
                Event::Cancelled { request, error } => {
                    if let Some(call) = state.calls.remove(&request)
                        && let Some(cancel) = call.cancel
                    {
                        let _ = cancel.send(error);
                    }
                }
                Event::RoleChanged { epoch, role } => {
                    if !matches!(role, Role::Follower(_)) {
                        state.upstream = None;
                    }
                    changes.push((epoch, role));
                }
            }
        }
        changes
    }

    /// The upstream to the leader `node_id` at `address`, reused while the
    /// leader stays the same.
    fn upstream(&self, state: &mut State, node_id: String, address: String) -> Arc<dyn Upstream> {
        if let Some((id, addr, upstream)) = &state.upstream
            && *id == node_id
            && *addr == address
        {
            return upstream.clone();
        }
        let upstream = self.connector.connect(&node_id, &address);
        state.upstream = Some((node_id, address, upstream.clone()));
        upstream
    }
}

/// Tells the machine a call is over when dropped.
struct Finished {
    inner: Arc<Inner>,
    id: RequestId,
}

impl Drop for Finished {
    fn drop(&mut self) {
        let id = self.id;
        self.inner.apply(|state, now| {
            state.machine.handle_request_finished(now, id);
            state.calls.remove(&id);
        });
    }
}

impl Routing for SharedLeadership {
    fn route(
        &self,
        timeout: Option<Duration>,
    ) -> BoxFuture<'static, Result<Routed, LeadershipError>> {
        let (route_tx, route_rx) = oneshot::channel();
        let (cancel_tx, cancel_rx) = oneshot::channel();
        // The call is registered before the drain that hands out its
        // route (at once when a leader is known).
        let id = self.inner.apply(|state, now| {
            let id = state.machine.handle_request(now, timeout.map(|t| now + t));
            state.calls.insert(
                id,
                Call {
                    route: Some(route_tx),
                    cancel: Some(cancel_tx),
                },
            );
            id
        });
        let finished = Finished {
            inner: self.inner.clone(),
            id,
        };
        Box::pin(async move {
            // Dropping `finished` (the caller gave up waiting, or the
            // call was rejected) tells the machine.
            let destination = route_rx
                .await
                .unwrap_or(Err(LeadershipError::ShuttingDown))?;
            let inner = finished.inner.clone();
            Ok(Routed {
                destination,
                cancelled: cancelled(cancel_rx),
                finished: Box::new(finished),
                unreachable: Box::new(move || {
                    inner.apply(|state, now| state.machine.handle_forward_failed(now, id));
                }),
            })
        })
    }
}

/// Future of [`SharedLeadership::changed`].
pub struct Changed {
    inner: Arc<Inner>,
}

impl Future for Changed {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = lock(&self.inner.state);
        if state.changed {
            state.changed = false;
            Poll::Ready(())
        } else {
            state.port = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

fn cancelled(rx: oneshot::Receiver<LeadershipError>) -> BoxFuture<'static, LeadershipError> {
    // A dropped sender means the instance went away with the call still
    // open: it is shutting down.
    rx.map(|r| r.unwrap_or(LeadershipError::ShuttingDown))
        .boxed()
}
